"""Result types (NamedTuples, so they pass through ``jit`` and ``vmap``)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class FilterResult(NamedTuple):
    """Output of `statseq.filter`.

    Attributes:
        log_prob: ``batch_shape`` total log-likelihood ``sum_t log p(y_t | y_<t)``.
        log_probs: ``batch_shape + (num_timesteps,)`` one-step predictive log-densities
            (0 at masked steps and at steps that are conditioned on, not scored).
        carries: the state after conditioning on ``y_{<=t}``, stacked over time
            (``None`` unless requested); its layout is the model's carry.
        final_carry: the state after the last observation (the start of a forecast).

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.AR(order=1)
        >>> res = ss.filter(model, model.default_params(), jnp.array([0.1, -0.3, 0.2]))
        >>> res.log_probs.shape
        (3,)
        >>> bool(jnp.isclose(res.log_prob, res.log_probs.sum()))
        True
    """

    log_prob: Any
    log_probs: Any
    carries: Any
    final_carry: Any


class FitResult(NamedTuple):
    """Output of every fitting function (``fit_sgd``, ``fit_em``, ...).

    Attributes:
        params: fitted parameters (the best validation point when early stopping is used).
        log_joint: ``(num_iterations,)`` trace of ``log p(y | params) + log p(params)`` (the
            un-normalized log joint; fitting maximizes it). With minibatches each entry is
            the unbiased minibatch estimate ``N / B * sum_batch log p + log prior``.
            Entries after an early stop are NaN.
        num_iterations: iterations actually run.
        converged: ``True`` only when the fit stopped on its own criterion (tolerance or
            early stopping) with valid parameters; ``False`` when it ran out of
            iterations, when the objective became non-finite or (EM) decreased beyond
            rounding, or when the last iterate left the constraint set and an earlier
            valid one was returned (each of these also warns).
        validation_log_prob: held-out ``log p(y_val | y_train)`` at each evaluation (empty
            without a validation split).
        validation_steps: iterations at which the validation score was evaluated.
        wall_time: seconds for the whole fit, compilation included.
        method: ``"sgd"``, ``"em"``, ...
        on_boundary: dotted names of the parameter leaves (as `statseq.core.params.param_names`
            spells them, e.g. ``"level_var"``, ``"emissions.probs"``) whose fitted value sits
            at the boundary of its constraint set: a variance (or a covariance's smallest
            eigenvalue, a Poisson rate) below ``1e-6`` times the data's variance, a
            probability within ``1e-6`` of 0 or 1. There the usual asymptotics (standard
            errors, likelihood-ratio tests) do not hold; fits warn when this is not empty.
        spurious_states: indices of the states of an HMM or Markov-switching AR fitted by
            `statseq.fit_em` that `statseq.spurious_states` judges degenerate at the fitted
            parameters (expected occupancy below ``max(D + 1, 5)`` or a covariance below
            ``1e-3`` of the data's): EM converged to a spurious maximizer of an unbounded
            likelihood, and `fit_em` warns. Empty for regular fits and for models and
            fitting functions that do not judge it (`statseq.fit_restarts` compares starts
            by it).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> fit = ss.fit_lbfgs(model, model.default_params(), y, progress=False)
        >>> fit.method, fit.log_joint.shape          # the trace, NaN after the last iteration
        ('lbfgs', (200,))
        >>> bool(abs(fit.final_log_joint - ss.log_prob(model, fit.params, y)) < 1e-2)   # no prior
        True
    """

    params: Any
    log_joint: np.ndarray
    num_iterations: int
    converged: bool
    validation_log_prob: np.ndarray
    validation_steps: np.ndarray
    wall_time: float
    method: str
    on_boundary: tuple[str, ...] = ()
    spurious_states: tuple[int, ...] = ()

    @property
    def final_log_joint(self) -> float:
        """The last finite entry of the trace."""
        trace = np.asarray(self.log_joint)
        trace = trace[np.isfinite(trace)]
        return float(trace[-1]) if trace.size else float("nan")
