"""Naive and seasonal naive baselines against the formulas of Hyndman and Athanasopoulos,
*Forecasting: Principles and Practice* (3rd ed., 2021): point forecasts (sec. 5.2),
residual standard deviation (eq. 5.1 with K = 0) and the h-step standard deviations of
sec. 5.5 (Table 5.2): naive sigma_h = sigma sqrt(h), seasonal naive
sigma_h = sigma sqrt(floor((h - 1) / m) + 1); Gaussian quantiles from those."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy import stats

import statseq as ss


def log_air():
    return np.log(ss.datasets.load_air_passengers().to_numpy(float))


@pytest.mark.parametrize("period", [1, 4, 12])
def test_forecast_quantiles_equal_the_textbook_formulas(period):
    y = log_air()
    h = 30
    fc = ss.naive_forecast(y, h, period=period)
    resid = y[period:] - y[:-period]
    sigma = np.sqrt(np.sum(resid**2) / (y.size - period))  # eq. 5.1, K = 0, M = m
    steps = np.arange(1, h + 1)
    k = (steps - 1) // period
    point = y[y.size - period + (steps - 1) % period]  # y_{T+h-m(k+1)}
    sigma_h = sigma * np.sqrt(steps) if period == 1 else sigma * np.sqrt(k + 1)
    np.testing.assert_allclose(np.asarray(fc.mean), point, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(fc.std), sigma_h, rtol=1e-12)
    for level in (0.8, 0.95):
        lo, hi = fc.interval(level)
        z = stats.norm.ppf(0.5 + level / 2)
        np.testing.assert_allclose(np.asarray(lo), point - z * sigma_h, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(hi), point + z * sigma_h, rtol=1e-12)


def test_params_and_log_likelihood_of_the_random_walk():
    y = log_air()
    p = ss.naive_params(y, period=12)
    model = ss.naive_model(12)
    coeffs = np.asarray(p.coeffs)[:, 0, 0]
    assert coeffs.tolist() == [0.0] * 11 + [1.0]
    e = y[12:] - y[:-12]
    sigma2 = np.mean(e**2)
    assert float(p.cov[0, 0]) == pytest.approx(sigma2, rel=1e-12)
    # conditional on the first season, the log-likelihood of a Gaussian seasonal walk
    expected = stats.norm.logpdf(e, scale=np.sqrt(sigma2)).sum()
    assert float(ss.log_prob(model, p, y)) == pytest.approx(expected, rel=1e-12)


def test_missing_values_drop_their_residuals():
    y = np.array([1.0, 2.0, np.nan, 5.0, 4.0])
    mask = np.isfinite(y)
    p = ss.naive_params(np.where(mask, y, 0.0), mask=mask)
    assert float(p.cov[0, 0]) == pytest.approx(np.mean([1.0, 1.0]))  # (2-1), (4-5)


def test_backtest_with_refitting_matches_the_formulas():
    y = log_air()
    model = ss.naive_model(12)
    res = ss.backtest(model, lambda m, past: ss.naive_params(past, period=12), y,
                      horizon=3, origins=[120, 130], num_samples=400, key=jax.random.key(0))
    for o in (120, 130):
        fc = ss.naive_forecast(y[:o], 3, period=12)
        rows = res.table[res.table.origin == o]
        lps = stats.norm.logpdf(y[o:o + 3], np.asarray(fc.mean), np.asarray(fc.std))
        np.testing.assert_allclose(rows.log_score.to_numpy(), lps, rtol=1e-10)


def test_errors():
    with pytest.raises(ValueError, match="period"):
        ss.naive_params(np.arange(5.0), period=0)
    with pytest.raises(ValueError, match="more than period"):
        ss.naive_params(np.arange(3.0), period=3)
    with pytest.raises(ValueError, match="scalar series"):
        ss.naive_params(np.zeros((5, 2)))
    with pytest.raises(ValueError, match="mask"):
        ss.naive_params(np.arange(5.0), mask=np.ones(4, bool))
    with pytest.raises(ValueError, match="no pair"):
        ss.naive_params(np.array([1.0, np.nan, 3.0, np.nan]), period=1)
    with pytest.raises(ValueError, match="must be observed"):
        ss.naive_forecast(np.array([1.0, 2.0, 3.0, 4.0, np.nan]), 2)
