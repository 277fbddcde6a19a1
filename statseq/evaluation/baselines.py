"""Naive and seasonal naive forecasters with residual-based predictive distributions.

The benchmarks of Hyndman and Athanasopoulos, *Forecasting: Principles and Practice*
(3rd ed., 2021, sec. 5.2 and 5.5): the **naive** forecast repeats the last value, the
**seasonal naive** forecast the value one season ago,

    yhat_{T+h|T} = y_{T+h-m(k+1)},      k = floor((h - 1) / m),

with ``m = 1`` for the naive method. Both are random walks (seasonal with period ``m``),
``y_t = y_{t-m} + e_t``, ``e_t ~ N(0, sigma^2)``, so their Gaussian predictive standard
deviations are (sec. 5.5, Table 5.2)

    naive:           sigma_h = sigma sqrt(h),
    seasonal naive:  sigma_h = sigma sqrt(k + 1),

with ``sigma^2`` estimated from the residuals ``e_t = y_t - y_{t-m}`` as
``sum e_t^2 / (T - M)`` (their eq. 5.1 with ``K = 0`` parameters and ``M`` missing
residuals: the mean of the available squared residuals).

Here a (seasonal) random walk is the statseq model ``AR(order=m)`` with coefficients
``(0, ..., 0, 1)`` and no intercept (`naive_model`, `naive_params`), so it works everywhere a
model does: `statseq.backtest` (refit at each origin with ``naive_params``), `log_prob`,
`forecast_moments` (`naive_forecast`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from statseq.core.validation import (
    check_magnitude,
    check_positive_int,
    float_dtype,
    is_pandas,
    pandas_values,
)


def naive_model(period: int = 1):
    """The (seasonal) random walk ``y_t = y_{t-m} + e_t`` as an ``AR(order=period)``.

    Args:
        period: the season length ``m`` (1 for the naive forecast).

    Returns:
        ``statseq.AR(order=period)``; its parameters come from `naive_params`.

    Examples:
        >>> import statseq as ss
        >>> ss.naive_model(12).order
        12
    """
    from statseq.models.autoregressive import AR

    return AR(order=check_positive_int(period, "period"))


def naive_params(y, *, period: int = 1, mask=None):
    """Parameters of `naive_model` for a series: coefficient 1 at lag ``period`` and the
    residual variance of Hyndman and Athanasopoulos (2021, eq. 5.1).

        e_t = y_t - y_{t-m},     sigma^2 = mean of the observed e_t^2.

    Args:
        y: one scalar series ``(T,)`` (array or pandas Series; ``NaN`` in a Series are
            missing), with at least ``period + 1`` values.
        period: the season length ``m``.
        mask: optional ``(T,)`` observation mask; a residual needs both of its values.

    Returns:
        An `ARParams` with ``coeffs[m-1] = 1`` (the others 0), zero intercept and
        ``cov = [[sigma^2]]``.

    Raises:
        ValueError: ``y`` is not one series, has ``inf`` or values whose squares overflow,
            too few values, no pair one period apart, or ``sigma^2 = 0`` (a series constant
            one period apart, whose random walk forecast is degenerate).
        TypeError: ``y`` is not real-valued.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> p = ss.naive_params(np.array([1.0, 3.0, 2.0, 4.0]))
        >>> float(p.cov[0, 0])  # mean of (2^2, 1^2, 2^2)
        3.0
    """
    period = check_positive_int(period, "period")
    values = _series(y)
    observed = ~np.isnan(values)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.shape != values.shape:
            raise ValueError(f"mask must have the shape of y {values.shape}, got {mask.shape}")
        if mask.dtype != bool and not np.all(np.isin(mask, (0, 1))):
            raise ValueError("mask must be boolean (or 0/1): True where y is observed")
        observed &= mask.astype(bool)
    if np.any(np.isinf(values[observed])):
        raise ValueError("y has infinite values at observed positions; mark missing values "
                         "with NaN (or mask=False)")
    check_magnitude(values[observed], np.float64, "y")
    if values.size <= period:
        raise ValueError(f"y needs more than period = {period} values, got {values.size}")
    ok = observed[period:] & observed[:-period]
    if not ok.any():
        raise ValueError("no pair of observed values one period apart: sigma is undefined")
    resid = (values[period:] - values[:-period])[ok]
    limit = float(np.sqrt(np.sqrt(np.finfo(np.float64).max)))  # (sigma^2)^2 must not overflow
    if np.max(np.abs(resid)) > limit:
        raise ValueError(
            f"y changes by as much as {np.max(np.abs(resid)):.3g} in one period: sigma^2 "
            f"would exceed sqrt of the largest float64 (a parameter's square must not "
            f"overflow); rescale y (differences below {limit:.3g})")
    if not np.mean(resid**2) > 0:
        raise ValueError(
            "the residuals y_t - y_{t-period} are all 0 (or their squares underflow): sigma "
            "is 0 and the random walk's predictive distribution is degenerate")
    dtype = float_dtype()
    coeffs = np.zeros((period, 1, 1))
    coeffs[-1] = 1.0
    model = naive_model(period)
    params = model.default_params()
    return params._replace(coeffs=jnp.asarray(coeffs, dtype),
                           intercept=jnp.zeros_like(params.intercept, dtype=dtype),
                           cov=jnp.asarray([[np.mean(resid**2)]], dtype))


def naive_forecast(y, num_steps: int, *, period: int = 1):
    """The naive (``period=1``) or seasonal naive forecast with Gaussian intervals.

    The mean is the last value (naive) or the value one season before (seasonal naive),
    and the standard deviation ``sigma sqrt(h)`` or ``sigma sqrt(floor((h-1)/m) + 1)``
    (Hyndman and Athanasopoulos 2021, sec. 5.5), from `naive_params`.

    Args:
        y: one scalar series ``(T,)`` (``NaN`` = missing; the last ``period`` values must
            be observed).
        num_steps: the horizon ``h``.
        period: the season length ``m``.

    Returns:
        A `GaussianForecast` (``.mean``, ``.std``, ``.interval(level)``, ``.plot()``).

    Examples:
        >>> import numpy as np, statseq as ss
        >>> fc = ss.naive_forecast(np.array([1.0, 3.0, 2.0, 4.0]), 4)
        >>> np.asarray(fc.mean).tolist(), np.round(np.asarray(fc.std) ** 2, 6).tolist()
        ([4.0, 4.0, 4.0, 4.0], [3.0, 6.0, 9.0, 12.0])
    """
    params = naive_params(y, period=period)
    values = _series(y)
    if not np.all(np.isfinite(values[-period:])):
        raise ValueError(f"the last period = {period} values of y must be observed")
    # The predictive moments of a (seasonal) random walk depend on its last `period`
    # values only (observed, so the lag window is known exactly): gaps are masked, and gaps
    # among the first `period` values, which the AR would refuse to condition on, are
    # filled and marked observed without changing the forecast.
    observed = ~np.isnan(values)
    observed[:period] = True
    filled = np.where(np.isnan(values), 0.0, values)
    if is_pandas(y):
        import pandas as pd

        filled = pd.Series(filled, index=y.index)
    fc = naive_model(period).forecast_moments(params, filled, num_steps=num_steps,
                                              mask=observed)
    return fc._replace(history=values)


def _series(y) -> np.ndarray:
    """``y`` as one real ``(T,)`` float series (``NaN`` = missing), or a clear error."""
    raw = np.asarray(pandas_values(y)[0])
    if np.iscomplexobj(raw) or not (np.issubdtype(raw.dtype, np.number) or raw.dtype == bool):
        raise TypeError(f"y must hold real numbers, got dtype {raw.dtype}")
    if raw.ndim != 1:
        raise ValueError(f"y must be one scalar series (T,), got shape {raw.shape}")
    return raw.astype(float)
