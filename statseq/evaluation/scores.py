"""Proper scores of probabilistic forecasts: CRPS, interval coverage and score, log density.

Every score takes a forecast in one of three forms:

* a `statseq.Forecast` (sample paths; scores are Monte Carlo estimates),
* a `statseq.GaussianForecast` (exact predictive moments; scores are exact, marginal per
  step and per dimension),
* a raw array of samples ``(num_samples,) + shape`` of the target.

and the realized values ``y_true`` (NumPy or pandas; ``NaN`` marks a missing value, whose
score is ``NaN`` and which averages leave out).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from statseq.core.params import validate_params
from statseq.core.validation import (
    _merge_nan_mask,
    canonical_values,
    check_positive_int,
    is_pandas,
    pandas_values,
    prepare_data,
)
from statseq.evaluation._origins import (
    PILOT_PATHS,
    mc_settings,
    origin_forecasts,
    paths_for_target,
)
from statseq.evaluation.criteria import log_score


def _is_gaussian(fc) -> bool:
    return hasattr(fc, "cov") and hasattr(fc, "mean") and not hasattr(fc, "samples")


def _samples(fc) -> np.ndarray:
    return np.asarray(fc.samples if hasattr(fc, "samples") else fc, float)


def _target_shape(fc) -> tuple[int, ...]:
    if _is_gaussian(fc):
        return tuple(np.shape(fc.mean))
    return tuple(_samples(fc).shape[1:])


def _truth(fc, y_true, name: str = "y_true") -> np.ndarray:
    """``y_true`` as a float array of the forecast's target shape (NaN = missing)."""
    if is_pandas(y_true):
        y_true = pandas_values(y_true, None, name)[0]
    y = np.asarray(y_true, float)
    shape = _target_shape(fc)
    if y.shape != shape:
        raise ValueError(f"{name} must have the forecast's shape {shape}; got {y.shape}")
    return y


def _check_levels(levels) -> tuple[float, ...]:
    levels = (levels,) if np.ndim(levels) == 0 else tuple(levels)
    out = []
    for level in levels:
        arr = np.asarray(level)
        if arr.ndim != 0 or arr.dtype == bool or not (
                np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
            raise TypeError(f"levels must be numbers in (0, 1); got {level!r}")
        if not 0.0 < float(level) < 1.0:
            raise ValueError(f"levels must lie in (0, 1); got {level}")
        out.append(float(level))
    if not out:
        raise ValueError("levels is empty")
    return tuple(out)


def crps_gaussian(mean, std, y):
    """Closed-form CRPS of a normal predictive ``N(mean, std^2)`` at ``y``.

        CRPS(N(mu, s^2), y) = s [z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi)],  z = (y - mu)/s.

    Args:
        mean: predictive means.
        std: predictive standard deviations (> 0).
        y: realized values (broadcast with ``mean`` and ``std``).

    Returns:
        A NumPy array of the broadcast shape.

    Examples:
        >>> round(float(crps_gaussian(0.0, 1.0, 0.0)), 6)  # sqrt(2) - 1, over sqrt(pi)
        0.233695
    """
    from scipy.stats import norm

    mean, std, y = (np.asarray(a, float) for a in (mean, std, y))
    z = (y - mean) / std
    return std * (z * (2.0 * norm.cdf(z) - 1.0) + 2.0 * norm.pdf(z) - 1.0 / math.sqrt(math.pi))


def crps_from_samples(samples, y, *, estimator: str = "fair"):
    """Sample CRPS ``E|X - y| - 1/2 E|X - X'|`` in ``O(S log S)`` by sorting.

    With sorted draws ``x_(1) <= ... <= x_(S)``, ``sum_{i,j} |x_i - x_j| =
    2 sum_k (2k - S - 1) x_(k)``. ``estimator="fair"`` divides that sum by ``2 S (S-1)``
    (unbiased for the CRPS of the distribution the draws come from); ``"energy"`` by
    ``2 S^2`` (the CRPS of the empirical distribution of the draws).

    Args:
        samples: ``(num_samples,) + shape`` draws.
        y: realized values of shape ``shape``.
        estimator: ``"fair"`` (default) or ``"energy"``.

    Returns:
        A NumPy array of shape ``shape``.

    Examples:
        >>> import numpy as np
        >>> float(crps_from_samples(np.array([0.0, 1.0]), 0.0, estimator="energy"))
        0.25
    """
    if estimator not in ("fair", "energy"):
        raise ValueError(f"estimator must be 'fair' or 'energy', got {estimator!r}")
    x = np.sort(np.asarray(samples, float), axis=0)
    s = x.shape[0]
    if estimator == "fair" and s < 2:
        raise ValueError("the fair CRPS estimator needs at least 2 samples")
    y = np.asarray(y, float)
    spread_weights = (2.0 * np.arange(1, s + 1) - s - 1).reshape((s,) + (1,) * (x.ndim - 1))
    pair_sum = 2.0 * np.sum(spread_weights * x, axis=0)  # sum_{i,j} |x_i - x_j|
    denom = 2.0 * s * (s - 1) if estimator == "fair" else 2.0 * s * s
    return np.mean(np.abs(x - y), axis=0) - pair_sum / denom


def crps(forecast, y_true, *, estimator: str = "fair"):
    """Continuous ranked probability score of each forecast entry (lower is better).

        CRPS(F, y) = int (F(z) - 1{y <= z})^2 dz = E|X - y| - 1/2 E|X - X'|,  X, X' ~ F.

    A `GaussianForecast` is scored exactly (`crps_gaussian` of each marginal); samples
    with `crps_from_samples` (``estimator``: ``"fair"``, unbiased, or ``"energy"``).
    Vector series are scored per dimension; average the result for one number per step.

    Args:
        forecast: a `Forecast`, a `GaussianForecast`, or samples ``(S,) + shape``.
        y_true: realized values of the target's shape (``NaN`` = missing: scores ``NaN``).
        estimator: the sample estimator (``"fair"`` or ``"energy"``).

    Returns:
        A NumPy array of the target's shape (e.g. ``(num_steps,)``).

    Examples:
        >>> import numpy as np
        >>> samples = np.random.default_rng(0).normal(size=(4000, 3))
        >>> crps(samples, np.zeros(3)).shape
        (3,)
    """
    y = _truth(forecast, y_true)
    if _is_gaussian(forecast):
        return crps_gaussian(forecast.mean, forecast.std, y)
    return crps_from_samples(_samples(forecast), y, estimator=estimator)


def prediction_interval(forecast, level: float):
    """Central ``level`` interval ``(lower, upper)`` as NumPy arrays of the target's shape.

    Exact for a `GaussianForecast`; empirical quantiles ``(1 -/+ level)/2`` of samples.

    Args:
        forecast: a `Forecast`, a `GaussianForecast`, or samples ``(S,) + shape``.
        level: coverage in ``(0, 1)``.

    Returns:
        ``(lower, upper)``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> from statseq.evaluation import prediction_interval
        >>> fc = ss.forecast(model, params, y, num_steps=5, num_samples=400, key=jax.random.key(0))
        >>> lower, upper = prediction_interval(fc, 0.8)
        >>> lower.shape, bool((lower < upper).all())
        ((5,), True)
    """
    (level,) = _check_levels(level)
    if _is_gaussian(forecast):
        lo, hi = forecast.interval(level)
        return np.asarray(lo, float), np.asarray(hi, float)
    lo, hi = np.quantile(_samples(forecast), [(1 - level) / 2, (1 + level) / 2], axis=0)
    return lo, hi


def interval_coverage(forecast, y_true, levels=(0.5, 0.8, 0.9)) -> dict:
    """Fraction of the (non-missing) realized values inside each central interval.

    A calibrated forecast covers about ``level`` of them; intervals of sample forecasts
    are empirical quantiles, exact ones for a `GaussianForecast`.

    Args:
        forecast: a `Forecast`, a `GaussianForecast`, or samples ``(S,) + shape``.
        y_true: realized values of the target's shape (``NaN`` = missing, left out).
        levels: nominal coverages in ``(0, 1)``.

    Returns:
        ``{level: coverage}``.

    Examples:
        >>> import numpy as np
        >>> samples = np.random.default_rng(0).normal(size=(2000, 4))
        >>> interval_coverage(samples, np.array([0.0, 0.5, 1.0, 3.0]), levels=(0.9,))
        {0.9: 0.75}
    """
    y = _truth(forecast, y_true)
    seen = np.isfinite(y)
    if not seen.any():
        raise ValueError("y_true has no finite value to score")
    out = {}
    for level in _check_levels(levels):
        lo, hi = prediction_interval(forecast, level)
        out[level] = float(np.mean(((y >= lo) & (y <= hi))[seen]))
    return out


def interval_score(forecast, y_true, level: float = 0.9):
    """Interval score of the central ``level`` interval ``[l, u]`` (lower is better).

        IS(l, u; y) = (u - l) + (2 / alpha) (l - y) 1{y < l} + (2 / alpha) (y - u) 1{y > u},

    with ``alpha = 1 - level`` (Gneiting and Raftery, 2007): width plus a penalty for misses.

    Args:
        forecast: a `Forecast`, a `GaussianForecast`, or samples ``(S,) + shape``.
        y_true: realized values of the target's shape.
        level: nominal coverage in ``(0, 1)``.

    Returns:
        A NumPy array of the target's shape.

    Examples:
        >>> import numpy as np
        >>> samples = np.linspace(-1.0, 1.0, 1001)[:, None]
        >>> interval_score(samples, np.array([2.0]), level=0.5).round(6).tolist()
        [7.0]
    """
    y = _truth(forecast, y_true)
    lo, hi = prediction_interval(forecast, level)
    alpha = 1.0 - level
    return (hi - lo) + (2 / alpha) * np.maximum(lo - y, 0) + (2 / alpha) * np.maximum(y - hi, 0)


def gaussian_log_density(forecast, y_true):
    """Exact marginal log-density of each entry under a `GaussianForecast`.

        log N(y_{T+k,i}; mean_{k,i}, cov_{k,ii})   (per step ``k`` and dimension ``i``).

    Args:
        forecast: a `GaussianForecast`.
        y_true: realized values of ``forecast.mean``'s shape (``NaN`` = missing).

    Returns:
        A NumPy array of that shape.

    Examples:
        >>> import numpy as np, scipy.stats as st, statseq as ss
        >>> from statseq.evaluation import gaussian_log_density
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> fc = ss.LocalLevel().forecast_moments(params, y[:90], num_steps=10)
        >>> ld = gaussian_log_density(fc, y[90:])
        >>> ref = st.norm(np.asarray(fc.mean), np.asarray(fc.std)).logpdf(y[90:])
        >>> ld.shape, bool(np.allclose(ld, ref, atol=1e-4))
        ((10,), True)
    """
    if not _is_gaussian(forecast):
        raise TypeError("gaussian_log_density needs a GaussianForecast (exact moments)")
    y = _truth(forecast, y_true)
    mean, std = np.asarray(forecast.mean, float), np.asarray(forecast.std, float)
    z = (y - mean) / std
    return -0.5 * z * z - np.log(std) - 0.5 * math.log(2 * math.pi)


def _more_paths(run, se, pilot):
    """The output of ``run(paths)`` with enough paths for the target standard error given
    the pilot's ``se`` (the pilot's paths are the first ones), or None if it meets it."""
    import warnings

    from statseq.evaluation._origins import MAX_PATHS, TARGET_SE

    paths = paths_for_target(se, pilot)
    if paths == pilot:
        return None
    out = run(paths)
    se = out[3][0] if out[3][1] is None else out[3][1]
    worst = float(np.nanmax(np.asarray(se, float), initial=0.0))
    if worst > TARGET_SE:
        warnings.warn(f"the Monte Carlo standard error of the h-step log densities is "
                      f"{worst:.3g} nats with {paths} paths (at most {MAX_PATHS} by "
                      f"default; target {TARGET_SE}): pass num_paths for more",
                      stacklevel=3)
    return out


def log_predictive_density(model, params, y_train, y_test, *, marginal: bool = False,
                           mask_train=None, mask_test=None, inputs_train=None,
                           inputs_test=None, key=None, num_paths: int | None = None,
                           return_se: bool = False):
    """Held-out log predictive density of ``y_test`` given ``y_train`` (exact, or a Monte
    Carlo estimate with its standard error for neural h-step marginals).

    ``marginal=False``: the joint density of the whole held-out block (one number),

        log p(y_{T+1:T+h} | y_{1:T}) = sum_k log p(y_{T+k} | y_{1:T+k-1})   (`log_score`).

    ``marginal=True``: the h-step-ahead marginal density of each held-out step, as a
    forecast made at ``T`` sees it (one number per step),

        log p(y_{T+k} | y_{1:T}),   k = 1, ..., h,

    computed by one of three routes, by model:

    * masked steps (models with ``marginalizes_masked_steps``: HMMs with emissions that do
      not read past values, `AR`, linear Gaussian state space models): the steps in
      between are conditioned on with an all-false mask, which is exact marginalization;
    * a closed-form mixture (models with ``h_step_marginals``: `LinearAutoregressiveHMM`,
      `MarkovSwitchingAR`): the exact Gaussian mixture over regime paths;
    * a Monte Carlo estimate (the neural models, whose emissions read their own past
      nonlinearly): the conditional density averaged over ancestral paths of the steps in
      between, an estimate with a standard error, not an exact value.

    The joint density (``marginal=False``) is exact for every model.

    **Estimates.** A neural network reads a masked step as 0 plus an indicator (a model
    of data with gaps), so its h-step marginal has no closed form; for ``k >= 2`` it is
    estimated by Rao-Blackwellised ancestral Monte Carlo,

        p(y_{T+k} | y_{1:T}) ~= (1/S) sum_s p(y_{T+k} | y_{1:T}, Y^s_{T+1:T+k-1}),

    with ``S = num_paths`` paths drawn from the model's own one-step predictives, and
    standard error ``sd(w) / (sqrt(S) mean(w))`` on the log scale (delta method; ``w``
    the path densities). ``k = 1`` is exact (SE 0). By default (``num_paths=None``) a
    pilot of 4096 paths is extended (its paths are the first ones) to as many as bring
    every standard error to 0.01 nats (``S ~ 1.1 * 4096 * (se / 0.01)^2``, at most
    ``2^20``; a warning says when that is not enough). Measured on the tutorials' data
    (the yearly sunspot GRU of vignette 04, hidden size 8, fitted with the vignette's
    recipe; 22 origins 1959-1980, horizons 2-8): the pilot's largest SE is 0.083 (median
    0.02), the default then uses about 313,000 paths and the largest SE is 0.0093 (about
    100 s for the 22 origins on two shared CPU cores); an unfitted GRU from
    ``initialize`` needs only the pilot (largest SE 0.0004). Without ``key`` the fixed key
    ``jax.random.key(0)`` is used, so repeated calls give identical numbers; pass your own
    key for independent estimates. ``key`` and ``num_paths`` are ignored for exact models.
    The history ``y_train`` is filtered as the model reads it (a neural network reads a
    masked value there as 0 plus an indicator; see `statseq.estimate_log_prob` for the
    marginal likelihood of data with gaps).

    Args:
        model: a statseq model.
        params: its parameters.
        y_train: one history ``(T,) + event_shape`` (array or pandas).
        y_test: its continuation ``(h,) + event_shape``.
        marginal: per-step h-step-ahead marginals instead of the joint density.
        mask_train: optional mask of the history.
        mask_test: optional mask of the held-out part (masked steps score ``NaN`` when
            ``marginal``).
        inputs_train: covariates of the history, if the model takes them.
        inputs_test: covariates of the held-out part.
        key: ``jax.random`` key of the Monte Carlo marginals (neural models; default the
            fixed key ``jax.random.key(0)``).
        num_paths: number of Monte Carlo paths (default: enough for a standard error of
            0.01 nats, see above; neural models only).
        return_se: with ``marginal``, also return the standard errors (zeros where exact).

    Returns:
        A float (joint), or a NumPy array ``(h,)`` (marginal); with ``return_se`` the pair
        ``(values (h,), standard errors (h,))``.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> model = ss.AR(order=1)
        >>> params = model.default_params()
        >>> y = np.array([0.3, -0.1, 0.4, 0.2, 0.0])
        >>> ss.log_predictive_density(model, params, y[:3], y[3:], marginal=True).shape
        (2,)

        A GRU's 2-step marginal is an estimate, with its standard error:

        >>> import jax
        >>> gru = ss.GRU(hidden_dim=3)
        >>> p = gru.initialize(y, key=jax.random.key(0))
        >>> lp, se = ss.log_predictive_density(gru, p, y[:3], y[3:], marginal=True,
        ...                                    num_paths=500, return_se=True)
        >>> float(se[0]), bool(0 < se[1] < 0.05)
        (0.0, True)
    """
    if return_se and not marginal:
        raise ValueError("return_se needs marginal=True (the joint density is exact)")
    key, num_paths = mc_settings(model, key, num_paths)
    if not marginal:
        return log_score(model, params, y_train, y_test, mask_train=mask_train,
                         mask_test=mask_test, inputs_train=inputs_train,
                         inputs_test=inputs_test)
    validate_params(model, params)
    event_ndim = len(model.event_shape)
    parts = []
    for name, y, m in (("y_train", y_train, mask_train), ("y_test", y_test, mask_test)):
        if is_pandas(y):
            y = pandas_values(y, event_ndim, name)[0]
            m = _merge_nan_mask(y, m, event_ndim)
        y = canonical_values(model, y, None, name)[0]  # one input convention
        if y.ndim != 1 + event_ndim:
            raise ValueError(f"{name} must be one series of shape (num_timesteps,) + "
                             f"{tuple(model.event_shape)}; got {y.shape}")
        full = np.ones(y.shape, bool)
        if m is not None:
            m = np.asarray(m, bool)
            full = np.broadcast_to(m.reshape(m.shape + (1,) * (y.ndim - m.ndim)), y.shape)
        parts.append((y, full))
    (y_tr, m_tr), (y_te, m_te) = parts
    inputs = None
    if model.num_inputs:
        if inputs_train is None or inputs_test is None:
            raise ValueError("this model takes inputs: pass inputs_train and inputs_test")
        inputs = np.concatenate([np.asarray(inputs_train), np.asarray(inputs_test)], axis=0)
    data = prepare_data(model, np.concatenate([y_tr, y_te]), np.concatenate([m_tr, m_te]),
                        inputs)
    origin = check_positive_int(y_tr.shape[0], "len(y_train)",
                                max(1, model.num_conditioned_steps))

    def run(paths):
        return origin_forecasts(
            model, params, data.y[0], data.mask[0], data.inputs[0], jnp.array([origin]),
            None, None if key is None else key[None], horizon=int(y_te.shape[0]),
            stacked=False, per_dim=False, sample=False, num_paths=paths,
        )

    auto = key is not None and num_paths is None
    out = run(PILOT_PATHS if auto else num_paths)
    if auto:
        out = _more_paths(run, out[3][0], PILOT_PATHS) or out
    lps, _, _, (se, _) = out
    values = np.asarray(lps[0], float)
    return (values, np.asarray(se[0], float)) if return_se else values

