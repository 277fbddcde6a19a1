"""Singular state and observation covariances and zero variances: scored exactly (dense
Gaussian conditioning, statsmodels' Kalman filter and smoother, its UnobservedComponents
with exact diffuse initialization), and refused where the filter cannot handle them."""

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import statsmodels.api as sm

import statseq as ss

sys.path.insert(0, str(Path(__file__).parent))
import _dense_ssm  # noqa: E402
from _dense_ssm import ar2_params, statsmodels_kalman  # noqa: E402


# ---- 1. singular Q and R = 0 are scored exactly ----------------------------------------
@pytest.mark.parametrize("r", [0.0, 0.4])
def test_singular_state_cov_and_zero_obs_var_match_dense_conditioning_and_statsmodels(r):
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None)
    p = ar2_params(model, r=r)
    y = np.random.default_rng(0).normal(size=20)
    lp = float(ss.log_prob(model, p, y))
    np.testing.assert_allclose(lp, _dense_ssm.log_prob(p, y), rtol=1e-10)
    filt = model.filter_states(p, y)
    smooth = model.smoother(p, y)
    fm, fc = _dense_ssm.conditional_states(p, y, "filter")
    sm_m, sm_c = _dense_ssm.conditional_states(p, y)
    np.testing.assert_allclose(filt.filtered_means, fm, atol=1e-9)
    np.testing.assert_allclose(filt.filtered_covs, fc, atol=1e-9)
    np.testing.assert_allclose(smooth.smoothed_means, sm_m, atol=1e-9)
    np.testing.assert_allclose(smooth.smoothed_covs, sm_c, atol=1e-9)
    # statsmodels' Kalman filter and smoother, on a series long enough for the
    # steady-state paths (T = 400)
    y = np.random.default_rng(0).normal(size=400)
    ref = statsmodels_kalman(p, y)
    np.testing.assert_allclose(float(ss.log_prob(model, p, y)), ref.llf_obs.sum(), rtol=1e-10)
    smooth = model.smoother(p, y)
    np.testing.assert_allclose(model.filter_states(p, y).filtered_means,
                               ref.filtered_state.T, atol=1e-9)
    np.testing.assert_allclose(smooth.smoothed_means, ref.smoothed_state.T, atol=1e-9)
    np.testing.assert_allclose(smooth.smoothed_covs, ref.smoothed_state_cov.transpose(2, 0, 1),
                               atol=1e-9)


def test_singular_initial_cov_and_time_varying_model_match_dense_conditioning():
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None)
    p = ar2_params(model, r=0.3)._replace(initial_cov=jnp.asarray([[1.0, 1.0], [1.0, 1.0]]))
    y = np.random.default_rng(4).normal(size=15)
    np.testing.assert_allclose(float(ss.log_prob(model, p, y)), _dense_ssm.log_prob(p, y),
                               rtol=1e-10)
    tv = ss.TimeVaryingLinearGaussianSSM(state_dim=2, emission_dim=None, num_timesteps=15)
    lead = lambda a, k: jnp.broadcast_to(a, (k,) + a.shape)  # noqa: E731
    ptv = tv.default_params()._replace(
        initial_mean=p.initial_mean, initial_cov=p.initial_cov,
        dynamics_weights=lead(p.dynamics_weights, 14), dynamics_cov=lead(p.dynamics_cov, 14),
        emission_weights=lead(p.emission_weights, 15), emission_cov=lead(jnp.zeros((1, 1)), 15))
    p0 = p._replace(emission_cov=jnp.zeros((1, 1)))
    np.testing.assert_allclose(float(ss.log_prob(tv, ptv, y)), _dense_ssm.log_prob(p0, y),
                               rtol=1e-10)


def test_what_the_filter_cannot_handle_is_refused():
    # y = (x, x) with R = 0: the innovation covariance P [[1, 1], [1, 1]] is singular
    model = ss.LinearGaussianSSM(state_dim=1, emission_dim=2)
    p = model.default_params()._replace(emission_weights=jnp.ones((2, 1)),
                                        emission_cov=jnp.zeros((2, 2)))
    y = np.zeros((5, 2))
    with pytest.raises(ValueError, match="innovation covariance H P_t H\\^T \\+ R at step t = 0"):
        ss.log_prob(model, p, y)
    # with noise in one of the two series it is fine (and exact)
    ok = p._replace(emission_cov=jnp.diag(jnp.array([0.0, 0.5])))
    np.testing.assert_allclose(float(ss.log_prob(model, ok, y + 0.1)),
                               _dense_ssm.log_prob(ok, y + 0.1), rtol=1e-10)
    # indefinite or non-symmetric covariances stay refused
    with pytest.raises(ValueError, match="dynamics_cov violates .* positive semi-definite"):
        ss.log_prob(model, p._replace(dynamics_cov=jnp.array([[-0.1]])), y)
    bad = ok._replace(emission_cov=jnp.array([[0.5, 0.1], [0.0, 0.5]]))
    with pytest.raises(ValueError, match="emission_cov violates .* positive semi-definite"):
        ss.log_prob(model, bad, y)


def test_zero_obs_var_with_a_diffuse_initial_state_is_refused():
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None, initial="diffuse")
    p = ar2_params(ss.LinearGaussianSSM(state_dim=2, emission_dim=None))
    p = model.default_params()._replace(
        dynamics_weights=p.dynamics_weights, dynamics_cov=p.dynamics_cov,
        emission_weights=p.emission_weights, emission_cov=jnp.zeros((1, 1)))
    with pytest.raises(ValueError, match="exact diffuse filter"):
        ss.log_prob(model, p, np.zeros(10))
    level = ss.LocalLevel()
    with pytest.raises(ValueError, match="obs_var violates its constraint"):
        ss.log_prob(level, level.default_params()._replace(obs_var=jnp.asarray(0.0)),
                    np.zeros(10))


def test_structural_zero_variances_match_statsmodels_unobserved_components():
    """A deterministic level (local level with sigma^2_eta = 0) and a deterministic slope
    (statsmodels' 'lldtrend') on the Nile flow, exact diffuse initialization in both."""
    y = ss.datasets.load_nile().to_numpy().astype(float)
    level = ss.LocalLevel()
    p = level.default_params()._replace(obs_var=jnp.asarray(2e4), level_var=jnp.asarray(0.0))
    uc = sm.tsa.UnobservedComponents(y, level="llevel", use_exact_diffuse=True)
    np.testing.assert_allclose(float(ss.log_prob(level, p, y)), uc.loglike([2e4, 0.0]),
                               rtol=1e-10)
    trend = ss.LocalLinearTrend()
    start = trend.default_params()._replace(obs_var=jnp.asarray(1e4),
                                            level_var=jnp.asarray(1e3),
                                            slope_var=jnp.asarray(0.0))
    fit = ss.fit_lbfgs(trend, start, y, progress=False,
                       trainable=start._replace(obs_var=True, level_var=True, slope_var=False))
    assert float(fit.params.slope_var) == 0.0
    uc = sm.tsa.UnobservedComponents(y, level="lldtrend", use_exact_diffuse=True)
    res = uc.fit(disp=False, maxiter=2000)
    assert uc.param_names == ["sigma2.irregular", "sigma2.level"]
    ours = [float(fit.params.obs_var), float(fit.params.level_var)]
    np.testing.assert_allclose(uc.loglike(np.asarray(ours)),
                               float(ss.log_prob(trend, fit.params, y)), rtol=1e-10)
    assert float(ss.log_prob(trend, fit.params, y)) > res.llf - 1e-6
    # the likelihood is flat near the optimum: statsmodels' optimizer stops a little short
    # (its llf is below ours), so the estimates agree to a few parts in a thousand
    np.testing.assert_allclose(ours, res.params, rtol=5e-3)
