"""`StructuralModel(input_dim=k)`: regression on inputs (interventions, covariates) in the
observation equation, against statsmodels' ``UnobservedComponents(..., exog=X)`` (exact
diffuse, ``mle_regression=True``) and against the published seat-belt law effect.

The data are the bundled UK drivers killed or seriously injured (R ``Seatbelts``), on the
log scale, with log petrol price and the seat-belt law dummy (from February 1983), the
example of Harvey and Durbin (1986) and Durbin and Koopman (2012, sec. 8.2), who report
the intervention coefficient -0.2378 (a fall of 21%) for the local level model with a
fixed seasonal, log petrol price and the intervention.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss

pytest.importorskip("statsmodels")
from statsmodels.tsa.statespace.structural import UnobservedComponents  # noqa: E402

DK_INTERVENTION = -0.2378  # Durbin and Koopman (2012, sec. 8.2); Harvey and Durbin (1986)


def seatbelt():
    df = ss.datasets.load_uk_driver_deaths(as_frame=True)
    y = np.log(df["drivers"].to_numpy(float))
    x = np.column_stack([np.log(df["petrol_price"].to_numpy(float)),
                         df["law"].to_numpy(float)])
    return y, x


def month_dummies(num_timesteps):
    """Indicators of February..December (January is the baseline)."""
    month = np.arange(num_timesteps) % 12
    return (month[:, None] == np.arange(1, 12)[None, :]).astype(float)


def uc(y, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = UnobservedComponents(y, use_exact_diffuse=True, **kwargs)
    mod.ssm.tolerance = 0.0
    return mod


def test_loglike_at_fixed_params_matches_statsmodels_level_and_dummies():
    """One diffuse state (the level): the exact diffuse likelihood to 1e-8."""
    y, x = seatbelt()
    xx = np.column_stack([x, month_dummies(y.size)])
    model = ss.StructuralModel((ss.Trend(),), input_dim=xx.shape[1])
    beta = np.linspace(-0.3, 0.2, xx.shape[1])
    params = model.default_params()._replace(
        obs_var=jnp.asarray(0.004), components=(ss.TrendParams(jnp.asarray(3e-4)),),
        regression=jnp.asarray(beta))
    ours = float(ss.log_prob(model, params, y, inputs=xx))
    ref = uc(y, level="llevel", exog=xx).loglike(np.r_[0.004, 3e-4, beta])
    assert abs(ours - ref) < 1e-8


def test_loglike_at_fixed_params_matches_statsmodels_with_seasonal():
    """Level + fixed (diffuse) seasonal + regressors: twelve diffuse states, where the
    pseudo-determinant carries ~1e-9 per diffuse step (see tests/models/test_structural.py)."""
    y, x = seatbelt()
    for stochastic, sm_params in [(False, [0.004, 3e-4]), (True, [0.004, 3e-4, 1e-5])]:
        model = ss.StructuralModel((ss.Trend(), ss.Seasonal(12, stochastic=stochastic)),
                                   input_dim=2)
        params = model.default_params()._replace(
            obs_var=jnp.asarray(0.004),
            components=(ss.TrendParams(jnp.asarray(3e-4)),
                        ss.SeasonalParams(jnp.asarray(1e-5) if stochastic else None)),
            regression=jnp.asarray([-0.28, -0.24]))
        ours = float(ss.log_prob(model, params, y, inputs=x))
        ref = uc(y, level="llevel", seasonal=12, stochastic_seasonal=stochastic,
                 exog=x).loglike(np.r_[sm_params, -0.28, -0.24])
        assert abs(ours - ref) < 2e-7


@pytest.fixture(scope="module")
def seatbelt_fit():
    y, x = seatbelt()
    xx = np.column_stack([x, month_dummies(y.size)])
    model = ss.StructuralModel((ss.Trend(),), input_dim=xx.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ss.fit_lbfgs(model, model.initialize(y, inputs=xx), y, inputs=xx,
                           progress=False)
        mod = uc(y, level="llevel", exog=xx)
        ref = mod.fit(disp=False, maxiter=1000)
    return model, fit, mod, ref, y, xx


def test_mle_matches_statsmodels_and_published_intervention(seatbelt_fit):
    model, fit, mod, ref, y, xx = seatbelt_fit
    # statsmodels' optimizer stops a little short: ours is at least as high
    assert fit.final_log_joint >= ref.llf - 1e-6
    assert fit.final_log_joint - ref.llf < 1e-4
    beta = np.asarray(fit.params.regression)
    np.testing.assert_allclose(beta, ref.params[2:], atol=2e-3)
    # statsmodels' log-likelihood at our estimates is ours
    theta = np.r_[float(fit.params.obs_var), float(fit.params.components[0].level_var), beta]
    assert abs(mod.loglike(theta) - fit.final_log_joint) < 1e-8
    # the published seat-belt law effect (Durbin and Koopman 2012, sec. 8.2): -0.2378
    assert abs(beta[1] - DK_INTERVENTION) < 2e-3
    assert round(100 * (1 - np.exp(beta[1]))) == 21


def test_standard_errors_match_statsmodels_observed_information(seatbelt_fit):
    """summary's standard errors of the regression coefficients against statsmodels'
    numerical observed information (``cov_type="oim"``) at statsmodels' optimum."""
    model, fit, mod, ref, y, xx = seatbelt_fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oim = mod.smooth(ref.params, cov_type="oim")
    table = ss.summary(model, fit.params, y, inputs=xx)
    np.testing.assert_allclose(table.std_errors[2:4], oim.bse[2:4], rtol=2e-2)


def test_forecast_with_future_inputs_matches_statsmodels():
    y, x = seatbelt()
    model = ss.StructuralModel((ss.Trend(), ss.Seasonal(12, stochastic=False)), input_dim=2)
    params = model.default_params()._replace(
        obs_var=jnp.asarray(0.004), components=(ss.TrendParams(jnp.asarray(3e-4)),
                                                ss.SeasonalParams(None)),
        regression=jnp.asarray([-0.28, -0.24]))
    h = 12
    hist, fut = x[:-h], x[-h:]
    fc = model.forecast_moments(params, y[:-h], inputs=hist, num_steps=h, future_inputs=fut)
    res = uc(y[:-h], level="llevel", seasonal=12, stochastic_seasonal=False,
             exog=hist).smooth(np.r_[0.004, 3e-4, -0.28, -0.24])
    ref = res.get_forecast(h, exog=fut)
    np.testing.assert_allclose(np.asarray(fc.mean), ref.predicted_mean, rtol=0, atol=1e-8)
    np.testing.assert_allclose(np.asarray(fc.cov)[:, 0, 0], ref.var_pred_mean, rtol=1e-7)
    parts = model.forecast_components(params, y[:-h], inputs=hist, num_steps=h,
                                      future_inputs=fut)
    np.testing.assert_allclose(np.asarray(parts["regression"].mean), fut @ [-0.28, -0.24])
    total = sum(np.asarray(p.mean) for p in parts.values())
    np.testing.assert_allclose(total, np.asarray(fc.mean), atol=1e-10)


def test_decompose_adds_up_with_the_regression_effect():
    y, x = seatbelt()
    model = ss.StructuralModel((ss.Trend(), ss.Seasonal(12, stochastic=False)), input_dim=2)
    params = model.default_params()._replace(
        obs_var=jnp.asarray(0.004), components=(ss.TrendParams(jnp.asarray(3e-4)),
                                                ss.SeasonalParams(None)),
        regression=jnp.asarray([-0.28, -0.24]))
    parts = model.decompose(params, y, inputs=x)
    assert list(parts) == ["level", "seasonal", "regression"]
    np.testing.assert_allclose(np.asarray(parts["regression"].smoothed_mean),
                               x @ [-0.28, -0.24])
    assert np.all(np.asarray(parts["regression"].smoothed_std) == 0)
    # smoothed level and seasonal against statsmodels' smoothed states
    res = uc(y, level="llevel", seasonal=12, stochastic_seasonal=False,
             exog=x).smooth(np.r_[0.004, 3e-4, -0.28, -0.24])
    np.testing.assert_allclose(np.asarray(parts["level"].smoothed_mean),
                               res.smoothed_state[0], atol=1e-7)
    np.testing.assert_allclose(np.asarray(parts["seasonal"].smoothed_mean),
                               res.smoothed_state[1], atol=1e-7)


def test_initialize_regression_start_is_differenced_least_squares():
    y, x = seatbelt()
    model = ss.StructuralModel((ss.Trend(),), input_dim=2)
    start = model.initialize(y, inputs=x)
    expected = np.linalg.lstsq(np.diff(x, axis=0), np.diff(y), rcond=None)[0]
    np.testing.assert_allclose(np.asarray(start.regression), expected, rtol=1e-10)


def test_configuration_and_errors():
    model = ss.StructuralModel((ss.Trend(),), input_dim=2)
    assert model.config()["input_dim"] == 2
    assert ss.StructuralModel(**model.config()) == model
    assert "input_dim" not in ss.StructuralModel((ss.Trend(),)).config()
    assert model.param_shapes().regression == (2,)
    assert ss.StructuralModel((ss.Trend(),)).default_params().regression is None
    y, x = seatbelt()
    params = model.default_params()
    with pytest.raises(ValueError, match="input"):
        ss.log_prob(model, params, y)
    with pytest.raises(ValueError, match="input_dim"):
        ss.StructuralModel((ss.Trend(),), input_dim=-1)
    with pytest.raises(TypeError, match="input_dim"):
        ss.StructuralModel((ss.Trend(),), input_dim=1.5)
    with pytest.raises(ValueError, match="future_inputs"):
        model.forecast_moments(params, y, inputs=x, num_steps=3)
