"""Exact AR/VAR forecast moments against statsmodels with the same parameters (1e-10).

``AutoReg.get_prediction`` (conditional AR, with and without exogenous inputs),
``ARIMA.get_forecast`` (``predicted_mean``, ``var_pred_mean``; also with a missing value
at the end of the history, which the exact stationary likelihood keeps uncertain) and
``VAR.forecast``/``VAR.mse``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import statsmodels.api as sm
from statsmodels.tsa.api import VAR
from statsmodels.tsa.arima.model import ARIMA

import statseq as ss


@pytest.mark.parametrize("order", [1, 3])
def test_ar_forecast_moments_equal_autoreg_and_arima(log_lynx, order):
    y = log_lynx
    model = ss.AR(order=order)
    params = model.fit_least_squares(y)
    fc = model.forecast_moments(params, y, num_steps=9)
    ar = sm.tsa.AutoReg(y, lags=order, trend="c").fit()
    np.testing.assert_allclose(ar.params, np.r_[params.intercept, params.coeffs[:, 0, 0]],
                               rtol=1e-10)  # same least-squares fit
    pred = ar.get_prediction(start=len(y), end=len(y) + 8)
    np.testing.assert_allclose(fc.mean, pred.predicted_mean, rtol=1e-10)
    np.testing.assert_allclose(fc.cov[:, 0, 0], pred.var_pred_mean, rtol=1e-10)
    phi = np.asarray(params.coeffs[:, 0, 0])
    mu = float(params.intercept[0]) / (1.0 - phi.sum())
    res = ARIMA(y, order=(order, 0, 0), trend="c").smooth(np.r_[mu, phi, params.cov[0, 0]])
    f = res.get_forecast(9)
    np.testing.assert_allclose(fc.mean, f.predicted_mean, rtol=1e-10)
    np.testing.assert_allclose(fc.std, f.se_mean, rtol=1e-10)
    np.testing.assert_allclose(fc.state_mean[:, 0], fc.mean, rtol=1e-12)


def test_missing_history_values_stay_uncertain_as_in_arima(log_lynx):
    y = log_lynx.copy()
    y[-1] = np.nan
    y[-4] = np.nan
    model = ss.AR(order=2, initial="stationary")
    params = ss.ARParams(jnp.array([[[1.3]], [[-0.7]]]), jnp.array([1.1]), jnp.zeros((1, 0)),
                         jnp.array([[0.05]]))
    mask = np.isfinite(y)
    fc = model.forecast_moments(params, np.nan_to_num(y), mask=mask, num_steps=5)
    mu = 1.1 / (1 - 1.3 + 0.7)
    f = ARIMA(y, order=(2, 0, 0), trend="c").smooth([mu, 1.3, -0.7, 0.05]).get_forecast(5)
    np.testing.assert_allclose(fc.mean, f.predicted_mean, rtol=1e-10)
    np.testing.assert_allclose(fc.cov[:, 0, 0], f.var_pred_mean, rtol=1e-10)


def test_arx_forecast_moments_equal_autoreg_with_exog(rng):
    num_t = 150
    u = rng.normal(size=(num_t + 6, 2))
    y = np.zeros(num_t)
    for t in range(2, num_t):
        y[t] = 0.3 + 0.5 * y[t - 1] - 0.2 * y[t - 2] + u[t] @ [1.0, -0.5] + rng.normal()
    model = ss.AR(order=2, input_dim=2)
    params = model.fit_least_squares(y, inputs=u[:num_t])
    fc = model.forecast_moments(params, y, inputs=u[:num_t], future_inputs=u[num_t:],
                                num_steps=6)
    ar = sm.tsa.AutoReg(y, lags=2, trend="c", exog=u[:num_t]).fit()
    pred = ar.get_prediction(start=num_t, end=num_t + 5, exog_oos=u[num_t:])
    np.testing.assert_allclose(fc.mean, pred.predicted_mean, rtol=1e-10)
    np.testing.assert_allclose(fc.cov[:, 0, 0], pred.var_pred_mean, rtol=1e-10)
    with pytest.raises(ValueError, match="future inputs"):
        model.forecast_moments(params, y, inputs=u[:num_t], num_steps=6)


def test_var_forecast_moments_equal_statsmodels_var(rng):
    e = rng.normal(size=(120, 2))
    y = np.zeros((120, 2))
    for t in range(2, 120):
        y[t] = [0.1, -0.2] + np.array([[0.5, 0.1], [-0.2, 0.4]]) @ y[t - 1] \
            + np.array([[0.2, 0.0], [0.1, -0.3]]) @ y[t - 2] + e[t]
    res = VAR(y).fit(2, trend="c")
    model = ss.AR(order=2, emission_dim=2)
    params = ss.ARParams(jnp.asarray(res.coefs), jnp.asarray(res.intercept),
                         jnp.zeros((2, 0)), jnp.asarray(res.sigma_u))
    fc = model.forecast_moments(params, y, num_steps=7)
    np.testing.assert_allclose(fc.mean, res.forecast(y[-2:], 7), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fc.cov, res.mse(7), rtol=1e-10, atol=1e-12)
    batch = model.forecast_moments(params, np.stack([y, y[::-1]]), num_steps=7)
    assert batch.mean.shape == (2, 7, 2) and batch.cov.shape == (2, 7, 2, 2)
    np.testing.assert_allclose(batch.mean[0], fc.mean, rtol=1e-12)
    lo, hi = fc.interval(0.9)
    np.testing.assert_allclose((hi - lo) / 2, 1.6448536269514722 * fc.std, rtol=1e-12)


def test_forecast_needs_the_conditioned_values():
    model = ss.AR(order=3)
    with pytest.raises(ValueError, match="at least"):
        model.forecast_moments(model.default_params(), np.array([0.1, 0.2]), num_steps=2)
    with pytest.raises(ValueError, match="num_steps"):
        model.forecast_moments(model.default_params(), np.arange(5.0), num_steps=0)
