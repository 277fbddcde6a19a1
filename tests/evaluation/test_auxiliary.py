"""Auxiliary residuals (smoothed disturbances) against statsmodels on the same parameters.

Nile local level at Durbin and Koopman's (2012, sec. 2.10) estimates and a local linear
trend (two exact diffuse steps): ``smoothed_measurement_disturbance(_cov)`` and
``smoothed_state_disturbance(_cov)`` of ``UnobservedComponents``; the largest standardized
state disturbance is the 1898 -> 1899 level break and the largest observation disturbance
the 1913 outlier (D&K 2012, sec. 2.12.2, Fig. 2.7).
"""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm

import statseq as ss

NILE_PARAMS = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)


@pytest.fixture(scope="module")
def nile():
    y = ss.datasets.load_nile()
    mod = sm.tsa.UnobservedComponents(y.to_numpy(float), "llevel", use_exact_diffuse=True)
    return y, mod.smooth([15099.0, 1469.1])


def test_nile_auxiliary_residuals_equal_statsmodels_and_find_the_break(nile):
    y, res = nile
    aux = ss.auxiliary_residuals(ss.LocalLevel(), NILE_PARAMS, y.to_numpy())
    eps, eps_cov = res.smoothed_measurement_disturbance[0], \
        res.smoothed_measurement_disturbance_cov[0, 0]
    eta, eta_cov = res.smoothed_state_disturbance[0], res.smoothed_state_disturbance_cov[0, 0]
    np.testing.assert_allclose(aux.observation[:, 0], eps, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(aux.observation_cond_var[:, 0, 0], eps_cov, rtol=1e-10)
    np.testing.assert_allclose(aux.state[:, 0], eta, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(aux.state_cond_var[:, 0, 0], eta_cov, rtol=1e-10)
    # D&K's standardization: by the estimator's variance, sigma^2 - Var(. | y)
    np.testing.assert_allclose(aux.observation_std[:, 0], eps / np.sqrt(15099.0 - eps_cov),
                               rtol=1e-9)
    np.testing.assert_allclose(aux.state_std[:-1, 0], eta[:-1] / np.sqrt(1469.1 - eta_cov[:-1]),
                               rtol=1e-9)
    assert np.isnan(aux.state_std[-1, 0])  # past the data: no information
    years = y.index.to_numpy()
    assert years[np.nanargmax(np.abs(aux.state_std[:, 0]))] == 1898  # level shift in 1899
    assert years[np.nanargmax(np.abs(aux.observation_std[:, 0]))] == 1913  # the outlier

def test_local_linear_trend_residuals_equal_statsmodels_with_two_diffuse_steps():
    y = ss.datasets.load_nile().to_numpy(float)
    params = ss.LocalLinearTrendParams(obs_var=14000.0, level_var=1200.0, slope_var=30.0)
    res = sm.tsa.UnobservedComponents(y, "lltrend", use_exact_diffuse=True).smooth(
        [14000.0, 1200.0, 30.0])
    e = np.asarray(ss.standardized_residuals(ss.LocalLinearTrend(), params, y))
    assert res.nobs_diffuse == 2 and np.isnan(e[:2]).all()
    np.testing.assert_allclose(e[2:], res.filter_results.standardized_forecasts_error[0, 2:],
                               rtol=1e-10, atol=1e-12)
    aux = ss.auxiliary_residuals(ss.LocalLinearTrend(), params, y)
    np.testing.assert_allclose(np.asarray(aux.state).T, res.smoothed_state_disturbance,
                               rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.asarray(aux.state_cond_var).transpose(1, 2, 0),
                               res.smoothed_state_disturbance_cov, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(aux.observation[:, 0], res.smoothed_measurement_disturbance[0],
                               rtol=1e-9, atol=1e-9)

