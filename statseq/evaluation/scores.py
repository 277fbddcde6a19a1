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
from statseq.evaluation._origins import origin_forecasts
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


def log_predictive_density(model, params, y_train, y_test, *, marginal: bool = False,
                           mask_train=None, mask_test=None, inputs_train=None,
                           inputs_test=None):
    """Exact held-out log predictive density of ``y_test`` given ``y_train``.

    ``marginal=False``: the joint density of the whole held-out block (one number),

        log p(y_{T+1:T+h} | y_{1:T}) = sum_k log p(y_{T+k} | y_{1:T+k-1})   (`log_score`).

    ``marginal=True``: the h-step-ahead marginal density of each held-out step, as a
    forecast made at ``T`` sees it (one number per step),

        log p(y_{T+k} | y_{1:T}),   k = 1, ..., h,

    computed exactly by conditioning on the steps in between with an all-false mask
    (every statseq model marginalizes masked steps exactly). No density estimate from
    samples is involved in either.

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

    Returns:
        A float (joint), or a NumPy array ``(h,)`` (marginal).

    Examples:
        >>> import numpy as np, statseq as ss
        >>> model = ss.AR(order=1)
        >>> params = model.default_params()
        >>> y = np.array([0.3, -0.1, 0.4, 0.2, 0.0])
        >>> ss.log_predictive_density(model, params, y[:3], y[3:], marginal=True).shape
        (2,)
    """
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
    lps, _, _ = origin_forecasts(
        model, params, data.y[0], data.mask[0], data.inputs[0], jnp.array([origin]), None,
        horizon=int(y_te.shape[0]), stacked=False, per_dim=False, sample=False,
    )
    return np.asarray(lps[0], float)

