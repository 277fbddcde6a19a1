"""Structural time series models against statsmodels' ``UnobservedComponents`` with exact
diffuse initialization: log-likelihoods, filtered and smoothed states, h-step forecasts and
the maximum likelihood fit of the local level model on the Nile (also against Durbin and
Koopman's published estimates), per-component output, configuration errors.

Every model is compiled once (module-scoped fixtures hold its statseq and statsmodels
results). statsmodels' filter stops updating the covariance once it judges it converged
(``ssm.tolerance``, 1e-19 in absolute terms), which with the small variances of log series
shifts its log-likelihood by ~1e-4 (local linear trend on log air passengers; a dense
computation of the diffuse likelihood agrees with statseq to 1e-9 there); the references
below therefore run with ``tolerance = 0``.
"""

from __future__ import annotations

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss

pytest.importorskip("statsmodels")
from statsmodels.tsa.statespace.structural import UnobservedComponents  # noqa: E402

H = 12  # forecast horizon
LEVEL = 0.95
# Exact diffuse log-likelihoods agree with statsmodels to ~1e-11 where the diffuse phase is
# one step (local level, AR); with many diffuse states statseq's pseudo-determinant carries
# a tiny deterministic perturbation (statseq.inference.kalman._pdet_terms) worth ~1e-9 per
# diffuse step, so those comparisons use an absolute tolerance of 2e-7 (|llf| ~ 100-600).
LLF_TOL_DIFFUSE = 2e-7


def uc(y, **kwargs):
    """statsmodels' model with exact diffuse initialization and no steady-state shortcut."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = UnobservedComponents(y, use_exact_diffuse=True, **kwargs)
    mod.ssm.tolerance = 0.0
    return mod


def nile():
    return ss.datasets.load_nile().to_numpy().astype(float)


def log_air():
    return np.log(ss.datasets.load_air_passengers().to_numpy().astype(float))


def log_uk():
    return np.log(ss.datasets.load_uk_driver_deaths().to_numpy().astype(float))


class Case:
    """One model at fixed parameters: statseq's results (each program compiled once) and
    statsmodels' at the same parameters."""

    def __init__(self, model, params, y, sm_model, sm_params, *, mask=None):
        self.model, self.params, self.y, self.mask = model, params, y, mask
        self.sm_params = np.asarray(sm_params, float)
        self.y_arg = y if mask is None else np.where(mask, y, 0.0)
        self.sm = sm_model
        self.sm_res = sm_model.smooth(self.sm_params)
        self.sm_llf = sm_model.loglike(self.sm_params)

    def smoother(self):
        return self.model.smoother(self.params, self.y_arg, mask=self.mask)


# ---- local level on the Nile ------------------------------------------------------------
DK_NILE = (15099.0, 1469.1)  # Durbin and Koopman (2012), sec. 2.10: sigma2_eps, sigma2_eta


@pytest.fixture(scope="module")
def nile_case():
    y = nile()
    model = ss.LocalLevel()
    params = ss.LocalLevelParams(obs_var=DK_NILE[0], level_var=DK_NILE[1])
    return Case(model, params, y, uc(y, level="llevel"), DK_NILE)


@pytest.fixture(scope="module")
def nile_missing_case():
    """D&K's Figure 2.5: the Nile with 1891-1910 and 1931-1950 missing."""
    y = nile()
    mask = np.ones(y.shape, bool)
    mask[20:40] = mask[60:80] = False
    y_nan = np.where(mask, y, np.nan)
    model = ss.LocalLevel()
    params = ss.LocalLevelParams(obs_var=DK_NILE[0], level_var=DK_NILE[1])
    return Case(model, params, y_nan, uc(y_nan, level="llevel"), DK_NILE, mask=mask)


@pytest.mark.parametrize("case", ["nile_case", "nile_missing_case"])
def test_local_level_log_likelihood(case, request):
    c = request.getfixturevalue(case)
    assert c.sm.param_names == ["sigma2.irregular", "sigma2.level"]
    res = ss.filter(c.model, c.params, c.y_arg, mask=c.mask)
    assert abs(float(res.log_prob) - c.sm_llf) < 1e-8
    assert float(ss.log_prob(c.model, c.params, c.y_arg, mask=c.mask)) == float(res.log_prob)
    # per-step terms too (0 at missing steps in both)
    np.testing.assert_allclose(res.log_probs, c.sm_res.llf_obs, atol=1e-9)


@pytest.mark.parametrize("case", ["nile_case", "nile_missing_case"])
def test_local_level_states(case, request):
    c = request.getfixturevalue(case)
    level = c.model.decompose(c.params, c.y_arg, mask=c.mask)["level"]
    r = c.sm_res
    np.testing.assert_allclose(level.smoothed_mean, r.smoothed_state[0], rtol=1e-10)
    np.testing.assert_allclose(level.smoothed_std**2, r.smoothed_state_cov[0, 0], rtol=1e-9)
    np.testing.assert_allclose(level.filtered_mean, r.filtered_state[0], rtol=1e-10)
    np.testing.assert_allclose(level.filtered_std**2, r.filtered_state_cov[0, 0], rtol=1e-9)
    # the smoother's own output is the state (one state: the level)
    sm = c.smoother()
    np.testing.assert_allclose(sm.smoothed_means[:, 0], r.smoothed_state[0], rtol=1e-10)
    if c.mask is not None:  # the gaps: the smoothed level interpolates with wider bands
        gap = ~c.mask
        assert np.all(level.smoothed_std[gap].min() > level.smoothed_std[~gap].max() * 0.9)


def test_local_level_forecast(nile_case):
    check_forecast(nile_case)


def test_local_level_mle_matches_statsmodels_and_durbin_koopman():
    """`statseq.fit_lbfgs` from the data-driven start; statsmodels' fit (tight tolerance)
    and Durbin and Koopman's published values as references, and standard errors from the
    observed information as statsmodels' numerical-Hessian ones (``cov_type="approx"``)."""
    y = nile()
    model = ss.LocalLevel()
    fit = ss.fit_lbfgs(model, model.initialize(y), y, progress=False)
    assert fit.converged
    est = np.array([float(fit.params.obs_var), float(fit.params.level_var)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # statsmodels' default stopping rule halts ~1% short on this flat likelihood
        ref = uc(y, level="llevel").fit(disp=False, method="bfgs", gtol=1e-10, maxiter=1000,
                                        cov_type="approx")
    assert abs(fit.final_log_joint - ref.llf) < 1e-7  # (1e-4 asked; ~4e-12 seen)
    np.testing.assert_allclose(est, ref.params, rtol=1e-5)  # (1e-3 asked; ~3e-9 seen)
    np.testing.assert_allclose(est, DK_NILE, rtol=5e-4)  # published to 5 digits
    se = ss.standard_errors(model, fit.params, y)
    np.testing.assert_allclose([float(se.obs_var), float(se.level_var)], ref.bse, rtol=1e-5)


# ---- local linear trend, seasonal, trigonometric seasonal, autoregressive ----------------
@pytest.fixture(scope="module")
def llt_case():
    y = log_air()
    params = ss.LocalLinearTrendParams(obs_var=1e-3, level_var=2e-4, slope_var=1e-5)
    sm = uc(y, level="lltrend")
    assert sm.param_names == ["sigma2.irregular", "sigma2.level", "sigma2.trend"]
    return Case(ss.LocalLinearTrend(), params, y, sm, [1e-3, 2e-4, 1e-5])


@pytest.fixture(scope="module")
def trend_seasonal_case():
    """Local linear trend plus dummy seasonal on log air passengers (13 states)."""
    y = log_air()
    model = ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(period=12)))
    params = ss.StructuralParams(
        obs_var=1e-3, components=(ss.TrendParams(2e-3, 1e-5), ss.SeasonalParams(1e-4))
    )
    sm = uc(y, level="lltrend", seasonal=12)
    assert sm.param_names == ["sigma2.irregular", "sigma2.level", "sigma2.trend",
                              "sigma2.seasonal"]
    return Case(model, params, y, sm, [1e-3, 2e-3, 1e-5, 1e-4])


@pytest.fixture(scope="module")
def trig_ar_case():
    """Local level plus two trigonometric harmonics plus AR(2) on log UK driver deaths."""
    y = log_uk()
    model = ss.StructuralModel(
        (ss.Trend(), ss.TrigSeasonal(period=12, harmonics=2), ss.ARComponent(order=2))
    )
    params = ss.StructuralParams(1.5e-3, (
        ss.TrendParams(5e-4), ss.SeasonalParams(2e-5),
        ss.ARComponentParams(coeffs=np.array([0.5, -0.3]), var=2e-3),
    ))
    sm = uc(y, level="llevel", freq_seasonal=[{"period": 12, "harmonics": 2}],
            autoregressive=2)
    assert sm.param_names == ["sigma2.irregular", "sigma2.level",
                              "sigma2.freq_seasonal_12(2)", "sigma2.ar", "ar.L1", "ar.L2"]
    return Case(model, params, y, sm, [1.5e-3, 5e-4, 2e-5, 2e-3, 0.5, -0.3])


CASES = ["llt_case", "trend_seasonal_case", "trig_ar_case"]
FORECAST_CASES = ["trend_seasonal_case", "trig_ar_case"]  # llt: its trend is in the first


def check_forecast(c):
    fc = c.model.forecast_moments(c.params, c.y_arg, num_steps=H, mask=c.mask)
    frame = c.sm_res.get_forecast(H).summary_frame(alpha=1 - LEVEL)
    lo, hi = fc.interval(LEVEL)
    np.testing.assert_allclose(fc.mean, frame["mean"], rtol=1e-10)
    np.testing.assert_allclose(fc.std, frame["mean_se"], rtol=1e-8)
    np.testing.assert_allclose(lo, frame["mean_ci_lower"], rtol=1e-8)
    np.testing.assert_allclose(hi, frame["mean_ci_upper"], rtol=1e-8)
    return fc


@pytest.mark.parametrize("case", CASES)
def test_log_likelihood_and_smoothed_states(case, request):
    """The smoother's exact diffuse log-likelihood (the filter's, see
    `test_fixed_components_nyquist_harmonic_and_ar` for `statseq.log_prob` on such models)
    and its smoothed state means and covariances, state by state."""
    c = request.getfixturevalue(case)
    sm = c.smoother()
    assert abs(float(sm.marginal_log_lik) - c.sm_llf) < LLF_TOL_DIFFUSE
    ref = c.sm_res.smoothed_state.T
    ref_cov = np.moveaxis(c.sm_res.smoothed_state_cov, -1, 0)
    np.testing.assert_allclose(sm.smoothed_means, ref, atol=1e-9 * np.abs(ref).max())
    np.testing.assert_allclose(sm.smoothed_covs, ref_cov,
                               atol=1e-9 * np.abs(ref_cov).max())


@pytest.mark.parametrize("case", FORECAST_CASES)
def test_forecasts(case, request):
    check_forecast(request.getfixturevalue(case))


def test_fixed_components_nyquist_harmonic_and_ar():
    """`statseq.log_prob` on a model with fixed (non-stochastic) slope and seasonal, the full
    trigonometric seasonal (statsmodels keeps the unobservable second state of the
    ``j = s / 2`` harmonic, statseq drops it) and a stationary AR(1)."""
    y = log_uk()
    model = ss.StructuralModel((ss.Trend(slope=True, stochastic_slope=False),
                                ss.TrigSeasonal(period=12, stochastic=False),
                                ss.ARComponent(1)))
    assert model.state_dim == 2 + 11 + 1
    assert model.param_shapes() == ss.StructuralParams((), (
        ss.TrendParams((), None), ss.SeasonalParams(None), ss.ARComponentParams((1,), ())))
    params = ss.StructuralParams(1e-3, (ss.TrendParams(level_var=1e-3), ss.SeasonalParams(None),
                                        ss.ARComponentParams(jnp.array([0.6]), 1e-3)))
    sm = uc(y, level=True, trend=True, irregular=True, stochastic_level=True,
            stochastic_trend=False, freq_seasonal=[{"period": 12, "harmonics": 6}],
            stochastic_freq_seasonal=[False], autoregressive=1)
    assert sm.param_names == ["sigma2.irregular", "sigma2.level", "sigma2.ar", "ar.L1"]
    llf = float(ss.log_prob(model, params, y))
    assert abs(llf - sm.loglike([1e-3, 1e-3, 1e-3, 0.6])) < LLF_TOL_DIFFUSE


# ---- single-component models are the structural model ------------------------------------
@partial(jax.jit, static_argnums=0)  # one compile per model instead of many eager ops
def arrays(model, params):
    return model.to_arrays(params)


def test_flat_models_are_structural_models():
    flat = ss.LocalLinearTrend()
    general = ss.StructuralModel((ss.Trend(slope=True),))
    p_flat = ss.LocalLinearTrendParams(1.0, 0.5, 0.25)
    p_general = ss.StructuralParams(1.0, (ss.TrendParams(0.5, 0.25),))
    for a, b in zip(arrays(flat, p_flat), arrays(general, p_general), strict=True):
        np.testing.assert_array_equal(a, b)
    ll = arrays(ss.LocalLevel(), ss.LocalLevelParams(2.0, 3.0))
    np.testing.assert_array_equal(ll.dynamics_cov, [[3.0]])
    np.testing.assert_array_equal(ll.emission_cov, [[2.0]])
    np.testing.assert_array_equal(ll.initial_diffuse, [[1.0]])


def test_matrices():
    seas = arrays(ss.StructuralModel((ss.Seasonal(4),)),
                  ss.StructuralParams(1.0, (ss.SeasonalParams(0.5),)))
    np.testing.assert_array_equal(seas.dynamics_weights,
                                  [[-1, -1, -1], [1, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(seas.dynamics_cov, np.diag([0.5, 0, 0]))
    np.testing.assert_array_equal(seas.emission_weights, [[1, 0, 0]])
    trig = ss.TrigSeasonal(period=4)
    assert trig.harmonics == 2 and trig.state_dim == 3
    a = arrays(ss.StructuralModel((trig,)), ss.StructuralParams(1.0, (ss.SeasonalParams(0.5),)))
    np.testing.assert_allclose(a.dynamics_weights, [[0, 1, 0], [-1, 0, 0], [0, 0, -1]],
                               atol=1e-15)
    np.testing.assert_array_equal(a.emission_weights, [[1, 0, 1]])
    np.testing.assert_array_equal(a.dynamics_cov, 0.5 * np.eye(3))
    ar = arrays(ss.StructuralModel((ss.ARComponent(2),)),
                ss.StructuralParams(1.0, (ss.ARComponentParams(jnp.array([0.5, 0.2]), 1.0),)))
    assert ar.initial_diffuse.shape == (2, 0)
    f = np.array([[0.5, 0.2], [1.0, 0.0]])
    p0 = np.asarray(ar.initial_cov)
    np.testing.assert_allclose(p0, f @ p0 @ f.T + np.diag([1.0, 0.0]), atol=1e-12)


# ---- per-component output -----------------------------------------------------------------
def test_decompose_and_component_forecasts(trend_seasonal_case):
    c = trend_seasonal_case
    model, params, y = c.model, c.params, c.y
    parts = model.decompose(params, y)
    assert list(parts) == ["level", "seasonal"]
    r = c.sm_res
    for name, idx in (("level", 0), ("seasonal", 2)):
        est = parts[name]
        np.testing.assert_allclose(est.smoothed_mean, r.smoothed_state[idx], atol=1e-11)
        np.testing.assert_allclose(est.smoothed_std**2, r.smoothed_state_cov[idx, idx],
                                   rtol=1e-8)
        # 13 diffuse states: the filtered contributions are identified from the 13th value
        assert np.all(np.isnan(est.filtered_mean[:12])) and not np.any(
            np.isnan(est.filtered_mean[12:]))
        np.testing.assert_allclose(est.filtered_mean[12:], r.filtered_state[idx, 12:],
                                   atol=1e-11)
        np.testing.assert_allclose(est.filtered_std[12:] ** 2,
                                   r.filtered_state_cov[idx, idx, 12:], rtol=1e-8)
    # smoothed components plus the smoothed irregular give back y
    irregular = c.sm_res.smoothed_measurement_disturbance
    np.testing.assert_allclose(parts["level"].smoothed_mean + parts["seasonal"].smoothed_mean
                               + irregular[0], y, atol=1e-10)

    comps = model.forecast_components(params, y, num_steps=H)
    total = model.forecast_moments(params, y, num_steps=H)
    np.testing.assert_allclose(comps["level"].mean + comps["seasonal"].mean, total.mean,
                               atol=1e-12)
    # statsmodels' forecast of the states gives the component forecasts
    pred = c.sm_res.get_forecast(H).prediction_results
    np.testing.assert_allclose(comps["level"].mean, pred.predicted_state[0], atol=1e-11)
    np.testing.assert_allclose(comps["level"].std**2, pred.predicted_state_cov[0, 0],
                               rtol=1e-8)
    np.testing.assert_allclose(comps["seasonal"].mean, pred.predicted_state[2], atol=1e-11)
    np.testing.assert_allclose(comps["seasonal"].std**2, pred.predicted_state_cov[2, 2],
                               rtol=1e-8)


def test_local_linear_trend_level_identified_after_one_value(llt_case):
    """With level and slope diffuse, one value identifies the level (not the slope)."""
    c = llt_case
    level = c.model.decompose(c.params, c.y)["level"]
    assert not np.any(np.isnan(level.filtered_mean))
    np.testing.assert_allclose(level.filtered_mean, c.sm_res.filtered_state[0], atol=1e-11)
    np.testing.assert_allclose(level.filtered_std[0] ** 2, 1e-3, rtol=1e-12)


def test_component_names():
    model = ss.StructuralModel((ss.Trend(), ss.Seasonal(4), ss.TrigSeasonal(12, harmonics=1),
                                ss.ARComponent(1), ss.ARComponent(1)))
    assert model.component_names == ("level", "seasonal_4", "seasonal_12", "ar_1_3", "ar_1_4")
    assert model.state_dim == 1 + 3 + 2 + 1 + 1


# ---- configuration, parameters, saving ---------------------------------------------------
@pytest.mark.parametrize("make, match", [
    (lambda: ss.Seasonal(period=1), "at least 2"),
    (lambda: ss.Seasonal(period=4.5), "integer"),
    (lambda: ss.TrigSeasonal(period=1.5), "at least 2"),
    (lambda: ss.TrigSeasonal(period=12, harmonics=7), "harmonics"),
    (lambda: ss.TrigSeasonal(period=12, harmonics=0), "harmonics"),
    (lambda: ss.ARComponent(order=0), "order"),
    (lambda: ss.ARComponent(order=1, initial="free"), "initial"),
    (lambda: ss.StructuralModel(()), "non-empty"),
])
def test_bad_configuration(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_types():
    with pytest.raises(TypeError, match="components"):
        ss.StructuralModel((ss.Trend(), "seasonal"))
    with pytest.raises(TypeError, match="slope"):
        ss.Trend(slope="yes")
    with pytest.raises(TypeError, match="period"):
        ss.Seasonal(period="12")


def test_bad_parameters():
    y = nile()
    model = ss.LocalLevel()
    with pytest.raises(ValueError, match="level_var violates its constraint"):
        model.decompose(ss.LocalLevelParams(1.0, -1.0), y)
    with pytest.raises(ValueError, match="obs_var violates"):
        ss.log_prob(model, ss.LocalLevelParams(0.0, 1.0), y)
    ar = ss.StructuralModel((ss.Trend(), ss.ARComponent(1)))
    bad = ss.StructuralParams(1.0, (ss.TrendParams(1.0), ss.ARComponentParams(jnp.array([1.2]),
                                                                              1.0)))
    with pytest.raises(ValueError, match="not stationary"):
        ss.log_prob(ar, bad, y)
    with pytest.raises(TypeError, match="StructuralParams"):
        ss.log_prob(ar, ss.LocalLevelParams(1.0, 1.0), y)


def test_initialize_trainable_and_save_load(tmp_path):
    y = log_air()
    model = ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(12), ss.ARComponent(1)))
    p = model.initialize(y)
    leaves = jax.tree.leaves(p)
    assert len(leaves) == 6 and all(np.all(np.isfinite(leaf)) for leaf in leaves)
    assert float(p.obs_var) > 0 and np.all(np.asarray(p.components[2].coeffs) == 0)
    p_rand = model.initialize(y, key=jax.random.key(0), method="random")
    assert float(p_rand.obs_var) != float(p.obs_var)
    assert ss.num_free_params(model) == 6
    trainable = ss.StructuralParams(False, (ss.TrendParams(True, False), ss.SeasonalParams(True),
                                            ss.ARComponentParams(True, True)))
    assert ss.num_free_params(model, trainable) == 4
    path = ss.save(tmp_path / "uc", model, p)
    model2, p2 = ss.load(path)
    assert model2 == model and hash(model2) == hash(model)
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(p2), strict=True):
        np.testing.assert_array_equal(a, b)
    assert ss.load(ss.save(tmp_path / "ll", ss.LocalLevel(),
                           ss.LocalLevelParams(1.0, 2.0)))[0] == ss.LocalLevel()
