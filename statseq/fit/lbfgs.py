"""Quasi-Newton (L-BFGS) maximum likelihood or MAP for any statseq model, as one loop.

The objective is the un-normalized negative log joint of the whole data set,

    L(theta) = -[ log p(y | theta) + log p(theta) ],

minimized over the unconstrained parameters of the trainable leaves with
``optax.lbfgs`` and its zoom line search (strong Wolfe conditions). It is the objective of
`statseq.fit_sgd` and `statseq.fit_em`, so the traces of all three share one axis. For the
small models statisticians fit with ``statsmodels``' ``fit()``, it converges in tens of
iterations to the maximum likelihood estimate, where `statseq.fit.inference_stats`
gives standard errors.
"""

from __future__ import annotations

import time
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from statseq.core.buckets import bound_cache
from statseq.core.params import (
    finish_fit,
    validate_params,
    validate_priors,
)
from statseq.core.restrict import expand_compiled, restrict
from statseq.core.results import FitResult
from statseq.core.validation import (
    check_positive_int,
    float_dtype,
    prepare_sized,
    require_observed,
)
from statseq.fit import _progress
from statseq.fit._objective import restricted_negative_log_joint

_RUNNING, _CONVERGED, _STALLED, _NONFINITE = 0, 1, 2, 3

# One solver object for every call: it is part of the compiled program (a fresh
# ``optax.lbfgs()`` per call would be a new constant and force a retrace).
_SOLVER = optax.lbfgs()


@partial(jax.jit, static_argnames=("model", "capacity", "progress", "complete"))
def _fit_lbfgs_compiled(model, restriction, x0, priors, y, mask, inputs, tol, num_iters,
                        progress_every, *, capacity, progress, complete):
    """Run L-BFGS on the free values ``x`` of ``restriction`` (`statseq.core.restrict`).

    Returns ``(num_updates, x, trace, stop)``; ``trace[i]`` is the log joint after
    update ``i`` (NaN after the stop); the trace has ``capacity >= num_iters`` entries.
    """
    objective = restricted_negative_log_joint(model, restriction, priors, y, mask, inputs,
                                              complete)
    value_and_grad = optax.value_and_grad_from_state(objective)
    dtype = float_dtype()

    def body(state):
        i, x, opt_state, trace, stop = state
        value, grad = value_and_grad(x, state=opt_state)
        updates, new_opt = _SOLVER.update(
            grad, opt_state, x, value=value, grad=grad, value_fn=objective
        )
        new_x = optax.apply_updates(x, updates)
        # the line search stores the objective and gradient at the accepted point
        new_value = optax.tree.get(new_opt, "value")
        new_grad = optax.tree.get(new_opt, "grad")
        finite = (
            jnp.isfinite(value) & jnp.isfinite(new_value) & jnp.all(jnp.isfinite(new_grad))
        )
        scale = jnp.maximum(1.0, jnp.abs(new_value))
        small_change = jnp.abs(new_value - value) <= tol * scale
        small_grad = jnp.sqrt(jnp.sum(new_grad**2)) <= tol * scale
        moved = jnp.any(new_x != x)
        stop = jnp.where(
            ~finite, _NONFINITE,
            jnp.where(small_change & small_grad, _CONVERGED,
                      jnp.where(moved, _RUNNING, _STALLED)),
        )
        # a non-finite step is not taken: the last finite iterate is what comes back
        new_x = jnp.where(finite, new_x, x)
        trace = trace.at[i].set(jnp.where(finite, -new_value, jnp.nan))
        if progress:
            jax.lax.cond(
                (i % progress_every == 0) | (i == num_iters - 1) | (stop != _RUNNING),
                lambda: jax.debug.callback(_progress.report, i, -new_value),
                lambda: None,
            )
        return i + jnp.where(finite, 1, 0), new_x, new_opt, trace, stop.astype(jnp.int32)

    def cond(state):
        i, *_, stop = state
        return (i < num_iters) & (stop == _RUNNING)

    init = (
        jnp.zeros((), jnp.int32), x0, _SOLVER.init(x0), jnp.full((capacity,), jnp.nan, dtype),
        jnp.asarray(_RUNNING, jnp.int32),
    )
    i, x, _, trace, stop = jax.lax.while_loop(cond, body, init)
    return i, x, trace, stop


def fit_lbfgs(model, params, y, *, mask=None, inputs=None, trainable=None, priors=None,
              num_iters=200, tol=1e-9, progress=True, ties=None) -> FitResult:
    """Maximum likelihood (or MAP) by L-BFGS with a zoom line search, as ``statsmodels``' ``fit()``.

    Maximizes the log joint ``log p(y | theta) + log p(theta)`` (the log-likelihood alone
    without ``priors``) over the unconstrained parameters ``x`` of the trainable leaves,
    ``theta = biject_to(constraint)(x)`` leaf by leaf, with ``optax.lbfgs``. Iterate
    ``k`` moves ``x_{k+1} = x_k - a_k H_k g_k``, where ``H_k`` is the limited-memory inverse
    Hessian estimate and ``a_k`` satisfies the strong Wolfe conditions. The fit stops when

        |L_{k+1} - L_k| <= tol * max(1, |L_{k+1}|)   and
        ||grad L(x_{k+1})||_2 <= tol * max(1, |L_{k+1}|)

    (``L`` the negative log joint), when the line search cannot move, or after
    ``num_iters`` iterations. All iterations run in one compiled ``lax.while_loop``.

    Args:
        model: a statseq model.
        params: starting parameters (e.g. ``model.fit_least_squares(y)`` or
            ``model.initialize(y, key=...)``).
        y: ``batch_shape + (num_timesteps,) + event_shape``; the objective sums over the
            batch.
        mask: optional observation mask (per step or per entry); missing entries are
            marginalized.
        inputs: covariates, when the model takes them.
        trainable: pytree like ``params`` of ``True``/``False`` (``False`` freezes a leaf,
            which comes back exactly as given) or boolean arrays of the leaf's shape
            (``False`` entries are fixed at their value in ``params``; see
            `statseq.core.restrict` for what a covariance leaf accepts).
        priors: pytree like ``params`` with numpyro distributions or ``None`` leaves; with
            priors the result is a MAP estimate in the natural parameterization.
        num_iters: maximum number of L-BFGS iterations (line searches).
        tol: tolerance of the stopping rule above, suited to float64 (``jax_enable_x64``),
            which maximum likelihood work and standard errors should use. In float32 the
            gradient is accurate only to about 1e-3 of the objective's scale, so the fit
            usually ends when the line search can no longer improve the objective: the
            estimates are then at float32 precision but ``converged`` is ``False``.
        progress: show a progress bar (set ``False`` in scripts and tests).
        ties: pytree like ``params`` of ``None`` or integer label arrays of the leaf's
            shape: free entries with the same label ``>= 0`` share one value.

    Returns:
        A `~statseq.FitResult` with ``method="lbfgs"``; ``log_joint[k]`` is the objective
            after iteration ``k`` (so the last finite entry is that of the returned
            ``params``), NaN after the stop. ``converged`` is ``True`` only when the
            tolerance was met, the trace never decreased beyond rounding and the result
            satisfies its constraints (otherwise the starting parameters come back, with
            a warning). ``on_boundary`` names parameters whose optimum sits at a boundary
            of the parameter space (a variance at 0 relative to the data's variance, a
            probability at 0 or 1), with a warning.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2, initial="stationary")  # the exact likelihood
        >>> start = ss.AR(order=2).fit_least_squares(y)
        >>> fit = ss.fit_lbfgs(model, start, y, tol=1e-5, progress=False)
        >>> fit.method, fit.num_iterations < 200
        ('lbfgs', True)
        >>> round(float(fit.params.coeffs[0, 0, 0]), 2)
        1.38
    """
    start = time.perf_counter()
    params = validate_params(model, params)  # weak leaves made strong: one program
    validate_priors(model, priors)
    num_iters = check_positive_int(num_iters, "num_iters")
    try:
        tol = float(tol)
    except (TypeError, ValueError) as err:
        raise TypeError(f"tol must be a number, got {type(tol).__name__}") from err
    if not tol >= 0:
        raise ValueError(f"tol must be non-negative, got {tol}")
    model, data = prepare_sized(model, y, mask, inputs)  # sized for missing lags, if any
    require_observed(data, "fit_lbfgs")
    restriction, z0 = restrict(model, params, trainable, ties)
    if restriction.num_free == 0:
        raise ValueError("trainable freezes every parameter: there is nothing to fit")
    bound_cache(_fit_lbfgs_compiled)  # one program per data shape: keep only the latest
    with _progress.progress_bar(num_iters, f"fit_lbfgs {type(model).__name__}", progress):
        out = _fit_lbfgs_compiled(
            model, restriction, np.asarray(z0, float_dtype()), priors, data.y,
            data.mask, data.inputs, np.asarray(tol, float_dtype()),  # NumPy: no cast program
            np.asarray(num_iters, np.int32),
            np.asarray(_progress.update_every(num_iters), np.int32),
            capacity=_progress.trace_capacity(num_iters), progress=bool(progress),
            complete=data.complete,
        )
        i, z, trace, stop = jax.block_until_ready(out)
    num_updates, stop = int(i), int(stop)
    if stop == _NONFINITE:
        warnings.warn(
            f"fit_lbfgs stopped after {num_updates} iterations: the objective or its "
            "gradient was not finite; returning the last parameters with a finite "
            "objective. Check the starting parameters and the data scale.",
            RuntimeWarning, stacklevel=2,
        )
    # fixed entries come back exactly as given (expand reads them from z0)
    fitted = expand_compiled(model, restriction, z)
    fitted, replaced, boundary = finish_fit(model, [fitted, params], "fit_lbfgs", data.y,
                                            data.mask, restriction)
    trace = np.asarray(trace)[:num_iters]
    finite = trace[np.isfinite(trace)]
    noise = 1e-5 if np.dtype(float_dtype()) == np.float32 else 1e-10
    decreased = finite.size > 1 and bool(np.any(
        np.diff(finite) < -np.maximum(tol, noise) * np.maximum(1.0, np.abs(finite[1:]))))
    if decreased:
        warnings.warn("fit_lbfgs: the log joint decreased during the fit (the line search "
                      "accepted a worse point: the objective is probably too rough at this "
                      "precision); converged=False", RuntimeWarning, stacklevel=2)
    return FitResult(
        params=fitted,
        log_joint=trace,
        num_iterations=num_updates,
        converged=stop == _CONVERGED and not replaced and not decreased,
        validation_log_prob=np.zeros((0,)),
        validation_steps=np.zeros((0,), int),
        wall_time=time.perf_counter() - start,
        method="lbfgs",
        on_boundary=boundary,
    )
