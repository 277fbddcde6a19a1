"""Residual tests of model adequacy in NumPy/SciPy: ACF, Ljung-Box, H(h), Jarque-Bera.

The three tests Durbin and Koopman (2012, sec. 2.12) apply to standardized one-step
prediction errors ``e_t`` of a fitted model (independence, homoscedasticity, normality),
written so that they give statsmodels' numbers on the same residuals
(``acf``, ``acorr_ljungbox``, ``breakvar_heteroskedasticity_test``, ``jarque_bera``);
statsmodels is used only by the tests. Inputs must be finite: drop missing steps first.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats


class StatTestResult(NamedTuple):
    """A test statistic and its p-value (arrays when several lags are tested)."""

    statistic: np.ndarray
    pvalue: np.ndarray


class JarqueBeraResult(NamedTuple):
    """Jarque-Bera statistic, its chi-square(2) p-value, sample skewness and kurtosis."""

    statistic: float
    pvalue: float
    skewness: float
    kurtosis: float


def _finite_1d(x, name: str, min_size: int = 2) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (drop missing steps first)")
    if arr.size < min_size:
        raise ValueError(f"{name} needs at least {min_size} values, got {arr.size}")
    return arr


def _check_lag(lag, name: str, upper: int) -> int:
    if isinstance(lag, bool) or not isinstance(lag, (int, np.integer)) or lag < 1:
        raise ValueError(f"{name} must be a positive integer, got {lag!r}")
    if lag >= upper:
        raise ValueError(f"{name} must be below the number of values ({upper}), got {lag}")
    return int(lag)


def acf(x, nlags: int) -> np.ndarray:
    """Sample autocorrelations ``r_0, ..., r_nlags`` (``r_0 = 1``).

        r_k = sum_{t=k+1}^n (x_t - xbar)(x_{t-k} - xbar) / sum_{t=1}^n (x_t - xbar)^2,

    the biased estimator (``statsmodels.tsa.stattools.acf`` with ``adjusted=False``).

    Args:
        x: ``(n,)`` finite values.
        nlags: the largest lag (``1 <= nlags < n``).

    Returns:
        ``(nlags + 1,)`` autocorrelations.

    Examples:
        >>> acf([1.0, 2.0, 3.0, 4.0], nlags=1).round(3).tolist()
        [1.0, 0.25]
    """
    arr = _finite_1d(x, "x")
    nlags = _check_lag(nlags, "nlags", arr.size)
    d = arr - arr.mean()
    denom = float(d @ d)
    if denom == 0.0:
        raise ValueError("x is constant: its autocorrelations are undefined")
    return np.array([1.0] + [float(d[k:] @ d[:-k]) / denom for k in range(1, nlags + 1)])


def ljung_box(x, lags: int, *, model_df: int = 0) -> StatTestResult:
    """Ljung-Box portmanteau test of no autocorrelation up to each lag ``1, ..., lags``.

        Q(k) = n (n + 2) sum_{j=1}^k r_j^2 / (n - j),   Q(k) ~ chi^2(k - model_df) under H0,

    with ``r_j`` from `acf` (Ljung and Box 1978; Durbin and Koopman 2012, eq. 2.66).

    Args:
        x: ``(n,)`` finite residuals.
        lags: the largest lag.
        model_df: degrees of freedom used by the model (subtracted from ``k``); p-values
            with ``k <= model_df`` are NaN.

    Returns:
        `StatTestResult` with ``(lags,)`` statistics and p-values (entry ``k - 1`` for lag ``k``).

    Examples:
        >>> import numpy as np
        >>> res = ljung_box(np.random.default_rng(0).normal(size=200), lags=5)
        >>> bool(res.pvalue[-1] > 0.01)
        True
    """
    arr = _finite_1d(x, "x")
    lags = _check_lag(lags, "lags", arr.size)
    if isinstance(model_df, bool) or not isinstance(model_df, (int, np.integer)) or model_df < 0:
        raise ValueError(f"model_df must be a non-negative integer, got {model_df!r}")
    n = arr.size
    r = acf(arr, lags)[1:]
    k = np.arange(1, lags + 1)
    q = n * (n + 2) * np.cumsum(r**2 / (n - k))
    dof = k - model_df
    pvalue = np.full(lags, np.nan)
    pvalue[dof > 0] = stats.chi2.sf(q[dof > 0], dof[dof > 0])
    return StatTestResult(q, pvalue)


def heteroskedasticity(x, subset_length: int | None = None,
                       alternative: str = "two-sided") -> StatTestResult:
    """Durbin and Koopman's test of constant variance, ``H(h)`` (2012, eq. 2.65).

        H(h) = sum_{t=n-h+1}^n e_t^2 / sum_{t=1}^h e_t^2,

    referred to ``F(h, h)`` (with unequal numbers of non-missing residuals in the two
    blocks, ``H`` is rescaled by their ratio first). Missing residuals (NaN) are left out
    of the sums, as in statsmodels' ``breakvar_heteroskedasticity_test``.

    Args:
        x: ``(n,)`` residuals (NaN where missing).
        subset_length: ``h``; the default is ``round(n / 3)``.
        alternative: ``"two-sided"``, ``"increasing"`` (variance grows) or
            ``"decreasing"``.

    Returns:
        A `StatTestResult` (scalars).

    Examples:
        >>> import numpy as np
        >>> e = np.random.default_rng(1).normal(size=90) * np.linspace(1, 3, 90)
        >>> bool(heteroskedasticity(e, alternative="increasing").pvalue < 0.05)
        True
    """
    arr = np.asarray(x, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"x must be one-dimensional, got shape {arr.shape}")
    if np.any(np.isinf(arr)):
        raise ValueError("x must not hold infinite values")
    n = arr.size
    h = int(np.round(n / 3)) if subset_length is None else subset_length
    if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not 1 <= h <= n:
        raise ValueError(f"subset_length must be an integer in [1, {n}], got {subset_length!r}")
    if alternative not in ("two-sided", "increasing", "decreasing"):
        raise ValueError("alternative must be 'two-sided', 'increasing' or 'decreasing', "
                         f"got {alternative!r}")
    sq = arr**2
    late, early = sq[n - h:], sq[:h]
    dfn, dfd = int(np.sum(~np.isnan(late))), int(np.sum(~np.isnan(early)))
    if dfn < 2 or dfd < 2:
        raise ValueError("each block needs at least 2 non-missing residuals")
    stat = float(np.nansum(late) / np.nansum(early))
    if alternative == "decreasing":
        stat, dfn, dfd = 1.0 / stat, dfd, dfn
    scaled = stat * dfd / dfn
    lower, upper = stats.f.cdf(scaled, dfn, dfd), stats.f.sf(scaled, dfn, dfd)
    pvalue = 2.0 * min(lower, upper) if alternative == "two-sided" else upper
    return StatTestResult(np.float64(stat), np.float64(pvalue))


def jarque_bera(x) -> JarqueBeraResult:
    """Jarque-Bera (Bowman-Shenton) test of normality.

        N = n (S^2 / 6 + (K - 3)^2 / 24),   N ~ chi^2(2) under H0,

    with ``S``, ``K`` the sample skewness and kurtosis (moments with divisor ``n``); this
    is the normality statistic of Durbin and Koopman (2012, eq. 2.64), after Bowman and
    Shenton (1975).

    Args:
        x: ``(n,)`` finite residuals.

    Returns:
        A `JarqueBeraResult`.

    Examples:
        >>> import numpy as np
        >>> bool(jarque_bera(np.random.default_rng(2).exponential(size=300)).pvalue < 1e-3)
        True
    """
    arr = _finite_1d(x, "x", min_size=3)
    d = arr - arr.mean()
    m2 = np.mean(d**2)
    if m2 == 0.0:
        raise ValueError("x is constant: its skewness and kurtosis are undefined")
    skew = float(np.mean(d**3) / m2**1.5)
    kurt = float(np.mean(d**4) / m2**2)
    stat = arr.size / 6.0 * (skew**2 + (kurt - 3.0) ** 2 / 4.0)
    return JarqueBeraResult(float(stat), float(stats.chi2.sf(stat, 2)), skew, kurt)
