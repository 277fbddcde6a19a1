"""Several starts, keep the best: the usual defence against local optima of EM and SGD."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

from statseq.core.params import degenerate_fit_warning
from statseq.core.results import FitResult
from statseq.core.validation import check_key, check_positive_int
from statseq.fit.degeneracy import MIN_VARIANCE_RATIO, spurious_states


class RestartsResult(NamedTuple):
    """Output of `fit_restarts`.

    Attributes:
        best: the `~statseq.FitResult` with the highest final log joint (among the
            non-spurious starts, with ``exclude_spurious=True``).
        final_log_joints: ``(num_restarts,)`` final log joint of every start (so the spread
            of local optima is visible); NaN for a start whose fit ended outside the
            parameter constraints (a degenerate fit, e.g. a variance that reached exactly 0,
            whose log joint is not that of a valid model) or whose objective trace
            decreased beyond rounding (the objective was numerically unreliable along the
            path, e.g. an observation variance collapsing towards 0 relative to the state
            noise, where the diffuse likelihood loses its precision); such a start is never
            chosen.
        best_index: which start won (0 is the data-driven start).
        spurious: ``(num_restarts,)`` bool, which starts ended at a spurious (near-singular)
            maximizer by `statseq.spurious_states` (all False for models it does not judge,
            and for starts whose log joint is NaN). With ``exclude_spurious=True`` they are
            set aside unless every valid start is spurious; their log joints stay in
            ``final_log_joints``.

    Examples:
        >>> import jax, statseq as ss
        >>> y = ss.datasets.load_earthquakes().to_numpy()
        >>> res = ss.fit_restarts(ss.PoissonHMM(num_states=2), y, key=jax.random.key(0),
        ...                       num_restarts=2, num_iters=50)
        >>> res.final_log_joints.shape, res.best_index in (0, 1)
        ((2,), True)
        >>> bool(res.best.final_log_joint == res.final_log_joints[res.best_index])
        True
    """

    best: FitResult
    final_log_joints: np.ndarray
    best_index: int
    spurious: np.ndarray | None = None


def fit_restarts(model: Any, y: Any, *, key: jax.Array, num_restarts: int | None = None,
                 method: str = "em", mask: Any = None, inputs: Any = None,
                 exclude_spurious: bool = True, min_occupancy: float | None = None,
                 min_variance_ratio: float = MIN_VARIANCE_RATIO,
                 **fit_kwargs: Any) -> RestartsResult:
    """Fit from several starting points and keep the best (highest final log joint).

    Spurious maximizers are set aside by default: for models with per-state Gaussian
    covariances (Gaussian and autoregressive HMMs, `MarkovSwitchingAR` with
    ``switching_variance``) the likelihood is unbounded as a state's variance shrinks onto
    a few points, and such near-singular optima often beat the fit of interest (McLachlan
    and Peel 2000, sec. 3.10). A start is spurious when some state has an expected
    occupancy below ``max(D + 1, min_occupancy)`` (default 5) or a variance below
    ``min_variance_ratio`` (default ``1e-3``) times the data's (`spurious_states`). The best
    non-spurious start is returned; the spurious ones are flagged in
    ``RestartsResult.spurious``; if every valid start is spurious, the best of them is
    returned with a `RuntimeWarning`.

    Start 0 is ``model.initialize(..., method="data")`` (quantiles, k-means, least squares,
    data-scaled variances); starts 1, 2, ... are ``method="random"`` with independent keys,
    and every block of parameters is drawn:

    * HMMs: start ``i >= 1`` draws its transition matrix from the family
      ``model.transition_starts[(i - 1) % 4]``, cycling ``"uniform"``,
      ``"anti_persistent"`` (mean diagonal below ``1/K``), ``"dirichlet"`` (rows uniform on
      the simplex) and ``"sticky"`` (mean diagonal 0.9), so any three random starts cover
      switching and persistent regimes by construction; the initial law is random and the
      emissions start at k-means++ seeds (random data points spread over the data; a
      Gaussian HMM gives each state its own variance, the data's times ``10^u``,
      ``u ~ U(-2, 0)``). The data start keeps a sticky matrix. The default 20 starts give
      each transition family five emission draws.
    * Linear Gaussian and structural models: variances multiplied by ``10^u``, ``u`` uniform
      over several decades (see their ``initialize``), so the starts span variance ratios
      over orders of magnitude, near the boundary optima of structural models too.

    For those models EM runs up to ``num_iters=500`` iterations by default (`fit_em`: 100;
    fits of anti-persistent regimes converge slowly, often in 200 to 450 iterations); it
    stops earlier at its tolerance. Other models keep the fitting function's defaults.

    Every start runs the same compiled fit (same model, shapes and static settings), so
    extra starts cost run time, not compilation. Structural models (no EM) restart with
    ``method="lbfgs"``. Warnings of the fits (e.g. a state that lost its mass) are
    re-issued for the chosen start only.

    Args:
        model: a statseq model with ``initialize``.
        y: data, as for the fitting function.
        key: a ``jax.random`` key.
        num_restarts: number of starts (the data start included); default
            ``5 * len(model.transition_starts)`` (20) for models with transition families
            (HMMs, `MarkovSwitchingAR`), 10 otherwise.
        method: ``"em"`` (`statseq.fit_em`), ``"lbfgs"`` (`statseq.fit_lbfgs`) or
            ``"sgd"`` (`statseq.fit_sgd`; pass ``optimizer`` and ``num_steps``).
        mask: optional observation mask.
        inputs: optional covariates.
        exclude_spurious: set spurious starts aside (``False``: the highest log joint
            wins, whatever the fit).
        min_occupancy: occupancy threshold of `spurious_states` (``None``: 5).
        min_variance_ratio: variance-ratio threshold of `spurious_states`.
        **fit_kwargs: passed to the fitting function (``progress`` defaults to False).

    Returns:
        A `RestartsResult`.

    Examples:
        >>> import jax, statseq as ss
        >>> y = ss.datasets.load_earthquakes().to_numpy()
        >>> res = ss.fit_restarts(ss.PoissonHMM(num_states=2), y, key=jax.random.key(0),
        ...                       num_restarts=2, num_iters=50)
        >>> res.final_log_joints.shape
        (2,)

        A structural model (the local level) restarts by L-BFGS:

        >>> y = ss.datasets.load_nile().to_numpy()
        >>> res = ss.fit_restarts(ss.LocalLevel(), y, key=jax.random.key(0), num_restarts=2,
        ...                       method="lbfgs", num_iters=30)
        >>> res.best.method
        'lbfgs'
    """
    check_key(key)
    from statseq.fit.em import fit_em
    from statseq.fit.lbfgs import fit_lbfgs
    from statseq.fit.sgd import fit_sgd

    if method not in ("em", "lbfgs", "sgd"):
        raise ValueError(f"method must be 'em', 'lbfgs' or 'sgd', got {method!r}")
    families = tuple(getattr(model, "transition_starts", ()) or ())
    if num_restarts is None:
        num_restarts = 5 * len(families) if families else 10
    num_restarts = check_positive_int(num_restarts, "num_restarts")
    fit_kwargs.setdefault("progress", False)
    if method == "em" and families:
        fit_kwargs.setdefault("num_iters", 500)
    init_keys = jax.random.split(key, num_restarts + 1)
    fits, caught, degenerate = [], [], []
    for i in range(num_restarts):
        extra = {}
        if i > 0 and families:
            extra["transitions"] = families[(i - 1) % len(families)]
        params = model.initialize(y, key=init_keys[i], mask=mask, inputs=inputs,
                                  method="data" if i == 0 else "random", **extra)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            if method == "em":
                fit = fit_em(model, params, y, mask=mask, inputs=inputs, **fit_kwargs)
            elif method == "lbfgs":
                fit = fit_lbfgs(model, params, y, mask=mask, inputs=inputs, **fit_kwargs)
            else:
                fit = fit_sgd(model, params, y, mask=mask, inputs=inputs,
                              key=init_keys[-1], **fit_kwargs)
        fits.append(fit)
        caught.append(record)
        degenerate.append(degenerate_fit_warning(model, fit.params, method) is not None
                          or _trace_decreased(fit))
    finals = np.array([np.nan if bad else f.final_log_joint
                       for f, bad in zip(fits, degenerate, strict=True)])
    spurious = np.zeros(num_restarts, bool)
    for i, fit in enumerate(fits):
        if np.isfinite(finals[i]):
            check = spurious_states(model, fit.params, y, mask=mask, inputs=inputs,
                                    min_occupancy=min_occupancy,
                                    min_variance_ratio=min_variance_ratio)
            spurious[i] = check is not None and check.any
    valid = np.isfinite(finals)
    keep = valid & ~spurious if exclude_spurious else valid
    if exclude_spurious and valid.any() and not keep.any():
        warnings.warn(f"fit_restarts: all {int(valid.sum())} valid starts ended at a spurious "
                      "(near-singular) maximizer: some state has a tiny variance or too few "
                      "observations (see statseq.spurious_states); returning the best of them. "
                      "Consider fewer states, a larger min_variance, or priors.",
                      RuntimeWarning, stacklevel=2)
        keep = valid
    best = int(np.argmax(np.where(keep, finals, -np.inf)))
    # only the chosen fit's warnings concern the caller
    for w in caught[best]:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return RestartsResult(best=fits[best], final_log_joints=finals, best_index=best,
                          spurious=spurious)


def _trace_decreased(fit: FitResult) -> bool:
    """Whether a fit's finite log-joint trace ever decreased beyond rounding (``1e-10``
    relative in float64, ``1e-5`` in float32): EM and L-BFGS never decrease it in exact
    arithmetic, so such a fit's final value is not trustworthy. Stochastic fits (SGD),
    whose minibatch trace is noisy by design, are not judged by it."""
    if fit.method not in ("em", "lbfgs"):
        return False
    trace = np.asarray(fit.log_joint, np.float64)
    trace = trace[np.isfinite(trace)]
    if trace.size < 2:
        return False
    noise = 1e-5 if np.asarray(fit.log_joint).dtype == np.float32 else 1e-10
    return bool(np.any(np.diff(trace) < -noise * np.maximum(1.0, np.abs(trace[1:]))))
