"""`StructuralModel(input_dim=k)`: regression on inputs (interventions, covariates) in the
observation equation, against statsmodels' ``UnobservedComponents(..., exog=X)`` (exact
diffuse, ``mle_regression=True``) and against the published seat-belt law effect.

The data are the bundled UK drivers killed or seriously injured (R ``Seatbelts``), on the
log scale, with log petrol price and the seat-belt law dummy (from February 1983), the
example of Harvey and Durbin (1986) and Durbin and Koopman (2012, sec. 8.2; 2001,
sec. 14.3). Durbin and Koopman fit a local level with a trigonometric seasonal of period
12 and print the variances of that basic structural model (irregular 0.00341598, level
0.000935852, seasonal 5.01096e-7) and then, with the log petrol price and the law as
regressors carried in the state vector (diffuse constants), the coefficients -0.29140
(standard error 0.09832) and -0.23773 (0.04632), a fall of 21%.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize

import statseq as ss

pytest.importorskip("statsmodels")
from statsmodels.tsa.statespace.structural import UnobservedComponents  # noqa: E402

# Durbin and Koopman (2012, sec. 8.2): (estimate, standard error) of the two regressors, and
# the variances (irregular, level, seasonal) of the model without them
DK_PETROL = (-0.29140, 0.09832)
DK_LAW = (-0.23773, 0.04632)
DK_BSM_VARIANCES = (0.00341598, 0.000935852, 5.01096e-7)


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


@pytest.mark.parametrize("seasonal", ["dummies", "fixed", "stochastic"])
def test_loglike_at_fixed_params_matches_statsmodels(seasonal):
    """The exact diffuse likelihood with regressors at given parameters: one diffuse state
    (the level, the seasonal as eleven month dummies among the regressors) to 1e-8; level
    + fixed or stochastic dummy seasonal (twelve diffuse states, where the pseudo-determinant
    carries ~1e-9 per diffuse step, see tests/models/test_structural.py) to 2e-7."""
    y, x = seatbelt()
    if seasonal == "dummies":
        x = np.column_stack([x, month_dummies(y.size)])
        components, seas_params, sm_kwargs, tol = (ss.Trend(),), (), {}, 1e-8
    else:
        stochastic = seasonal == "stochastic"
        components = (ss.Trend(), ss.Seasonal(12, stochastic=stochastic))
        seas_params = (ss.SeasonalParams(jnp.asarray(1e-5) if stochastic else None),)
        sm_kwargs, tol = {"seasonal": 12, "stochastic_seasonal": stochastic}, 2e-7
    model = ss.StructuralModel(components, input_dim=x.shape[1])
    beta = np.linspace(-0.3, 0.2, x.shape[1])
    params = model.default_params()._replace(
        obs_var=jnp.asarray(0.004),
        components=(ss.TrendParams(jnp.asarray(3e-4)), *seas_params),
        regression=jnp.asarray(beta))
    ours = float(ss.log_prob(model, params, y, inputs=x))
    variances = [0.004, 3e-4] + ([1e-5] if seasonal == "stochastic" else [])
    ref = uc(y, level="llevel", exog=x, **sm_kwargs).loglike(np.r_[variances, beta])
    assert abs(ours - ref) < tol


def fixed_seasonal_model(input_dim=2):
    """Durbin and Koopman's model with a fixed seasonal: level + fixed dummy seasonal."""
    return ss.StructuralModel((ss.Trend(), ss.Seasonal(12, stochastic=False)),
                              input_dim=input_dim)


@pytest.fixture(scope="module")
def seatbelt_fit():
    """statseq's maximum likelihood fit and statsmodels' of the same model."""
    y, x = seatbelt()
    model = fixed_seasonal_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ss.fit_lbfgs(model, model.initialize(y, inputs=x), y, inputs=x, progress=False)
        mod = uc(y, level="llevel", seasonal=12, stochastic_seasonal=False, exog=x)
        ref = mod.fit(disp=False, maxiter=1000)
    return model, fit, mod, ref, y, x


def test_mle_matches_statsmodels_and_published_intervention(seatbelt_fit):
    model, fit, mod, ref, y, x = seatbelt_fit
    # statsmodels' optimizer stops a little short: ours is at least as high
    assert fit.final_log_joint >= ref.llf - 1e-6
    assert fit.final_log_joint - ref.llf < 1e-4
    beta = np.asarray(fit.params.regression)
    np.testing.assert_allclose(beta, ref.params[2:], atol=1e-3)
    # statsmodels' log-likelihood at our estimates is ours (twelve diffuse states)
    theta = np.r_[float(fit.params.obs_var), float(fit.params.components[0].level_var), beta]
    assert abs(mod.loglike(theta) - fit.final_log_joint) < 1e-6
    # maximum likelihood with the seasonal and level diffuse, the regression coefficients
    # maximized over: within 2.5e-3 of the published law effect (D&K integrate the
    # coefficients out instead; see the restricted likelihood test below), same 21% fall
    assert abs(beta[1] - DK_LAW[0]) < 2.5e-3 and abs(beta[0] - DK_PETROL[0]) < 1.5e-2
    assert round(100 * (1 - np.exp(beta[1]))) == round(100 * (1 - np.exp(DK_LAW[0]))) == 21


def test_standard_errors_match_statsmodels_and_published(seatbelt_fit):
    """summary's standard errors of the regression coefficients against statsmodels'
    numerical observed information (``cov_type="oim"``) at statsmodels' optimum, and within
    5% of Durbin and Koopman's (which condition on the variances)."""
    model, fit, mod, ref, y, x = seatbelt_fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oim = mod.smooth(ref.params, cov_type="oim")
    table = ss.summary(model, fit.params, y, inputs=x)
    se = np.asarray(table.std_errors)[2:4]
    np.testing.assert_allclose(se, oim.bse[2:4], rtol=2e-2)
    np.testing.assert_allclose(se, [DK_PETROL[1], DK_LAW[1]], rtol=5e-2)


def _restricted(model, y, x, variances):
    """Durbin and Koopman's likelihood with the regression coefficients as diffuse states.

    The exact diffuse log-likelihood is quadratic in the coefficients ``b``, so central
    differences of statseq's ``log_prob`` in ``b`` (step 0.1) give its gradient ``g`` and
    Hessian ``H`` exactly up to rounding; integrating ``b`` out under a diffuse prior gives
    ``max_b log L - log det(-H) / 2`` (the ``(2 pi)^(k/2)`` of the Gaussian integral cancels
    against the diffuse prior's). Returns the generalized least squares ``b``, its
    covariance ``(-H)^-1`` and that log-likelihood.
    """
    obs_var, level_var, seas_var = variances
    base = model.default_params()._replace(
        obs_var=jnp.asarray(obs_var),
        components=(ss.TrendParams(jnp.asarray(level_var)),
                    ss.SeasonalParams(jnp.asarray(seas_var))))

    def loglik(b):
        return float(ss.log_prob(model, base._replace(regression=jnp.asarray(b)), y,
                                 inputs=x))

    step = 0.1 * np.eye(2)
    f0 = loglik(np.zeros(2))
    fp = np.array([loglik(e) for e in step])
    fm = np.array([loglik(-e) for e in step])
    grad = (fp - fm) / 0.2
    hess = np.diag((fp - 2 * f0 + fm) / 0.01)
    hess[0, 1] = hess[1, 0] = (loglik(step[0] + step[1]) - fp[0] - fp[1] + f0) / 0.01
    beta = -np.linalg.solve(hess, grad)
    return beta, np.linalg.inv(-hess), f0 + 0.5 * grad @ beta - 0.5 * np.linalg.slogdet(-hess)[1]


def test_durbin_koopman_basic_structural_model_variances():
    """Without regressors, statseq's log-likelihood at D&K's printed variances equals
    statsmodels' (1e-7), and those variances are a local maximum of it: moving any one by
    1% (the seasonal variance, 1e-4 of the irregular's and weakly identified, by 20%)
    lowers it."""
    y, _ = seatbelt()
    model = ss.StructuralModel((ss.Trend(), ss.TrigSeasonal(12)))

    def loglik(v):
        params = model.default_params()._replace(
            obs_var=jnp.asarray(v[0]),
            components=(ss.TrendParams(jnp.asarray(v[1])), ss.SeasonalParams(jnp.asarray(v[2]))))
        return float(ss.log_prob(model, params, y))

    dk = np.array(DK_BSM_VARIANCES)
    at_dk = loglik(dk)
    ref = uc(y, level="llevel", freq_seasonal=[{"period": 12}]).loglike(dk)
    assert abs(at_dk - ref) < 1e-7
    for i, rel in enumerate([0.01, 0.01, 0.2]):
        for sign in (-1, 1):
            moved = dk.copy()
            moved[i] *= 1 + sign * rel
            assert loglik(moved) < at_dk


def fixed_seasonal_case():
    """The fixed-seasonal model at given parameters, and statsmodels' at the same values."""
    y, x = seatbelt()
    model = fixed_seasonal_model()
    params = model.default_params()._replace(
        obs_var=jnp.asarray(0.004), components=(ss.TrendParams(jnp.asarray(3e-4)),
                                                ss.SeasonalParams(None)),
        regression=jnp.asarray([-0.28, -0.24]))
    return model, params, y, x, np.r_[0.004, 3e-4, -0.28, -0.24]


def test_forecast_with_future_inputs_matches_statsmodels():
    model, params, y, x, theta = fixed_seasonal_case()
    h = 12
    hist, fut = x[:-h], x[-h:]
    fc = model.forecast_moments(params, y[:-h], inputs=hist, num_steps=h, future_inputs=fut)
    res = uc(y[:-h], level="llevel", seasonal=12, stochastic_seasonal=False,
             exog=hist).smooth(theta)
    ref = res.get_forecast(h, exog=fut)
    np.testing.assert_allclose(np.asarray(fc.mean), ref.predicted_mean, rtol=0, atol=1e-8)
    np.testing.assert_allclose(np.asarray(fc.cov)[:, 0, 0], ref.var_pred_mean, rtol=1e-7)
    parts = model.forecast_components(params, y[:-h], inputs=hist, num_steps=h,
                                      future_inputs=fut)
    np.testing.assert_allclose(np.asarray(parts["regression"].mean), fut @ theta[2:])
    total = sum(np.asarray(p.mean) for p in parts.values())
    np.testing.assert_allclose(total, np.asarray(fc.mean), atol=1e-10)


def test_decompose_adds_up_with_the_regression_effect():
    model, params, y, x, theta = fixed_seasonal_case()
    parts = model.decompose(params, y, inputs=x)
    assert list(parts) == ["level", "seasonal", "regression"]
    np.testing.assert_allclose(np.asarray(parts["regression"].smoothed_mean), x @ theta[2:])
    assert np.all(np.asarray(parts["regression"].smoothed_std) == 0)
    # smoothed level and seasonal against statsmodels' smoothed states
    res = uc(y, level="llevel", seasonal=12, stochastic_seasonal=False, exog=x).smooth(theta)
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


# Runtime-bound (Nelder-Mead: ~150 evaluations of six log-likelihoods of a 14-state model):
# compiled with full XLA optimization, which runs them ~3x faster than the suite's -O0 (CPU
# time: ~10 s -> ~4 s). The fixture is module-scoped, so this test comes last: nothing after
# it compiles optimized programs.
@pytest.mark.usefixtures("xla_optimized")
def test_durbin_koopman_estimates_with_the_regression_in_the_state():
    """D&K's printed coefficients and standard errors, reproduced from statseq's likelihood.

    Their model: level + trigonometric seasonal with its own variance, the regression
    coefficients diffuse states (statsmodels' ``mle_regression=False``). The likelihood
    built from statseq's ``log_prob`` equals statsmodels' at two parameter values; its
    maximum (Nelder-Mead over the log variances) gives -0.29140 (0.09832) and -0.23773
    (0.04632) to 2e-5 (measured: within 1e-5).
    """
    y, x = seatbelt()
    model = ss.StructuralModel((ss.Trend(), ss.TrigSeasonal(12)), input_dim=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = UnobservedComponents(y, "llevel", freq_seasonal=[{"period": 12}], exog=x,
                                   mle_regression=False, use_exact_diffuse=True)
    for v in ([0.0038, 2.7e-4, 1.2e-6], [0.003, 5e-4, 1e-5]):
        assert abs(_restricted(model, y, x, v)[2] - ref.loglike(v)) < 1e-7
    best = optimize.minimize(lambda lv: -_restricted(model, y, x, np.exp(lv))[2],
                             np.log([0.0038, 2.7e-4, 1.2e-6]), method="Nelder-Mead",
                             options={"xatol": 1e-6, "fatol": 1e-9, "maxiter": 2000})
    beta, cov, _ = _restricted(model, y, x, np.exp(best.x))
    np.testing.assert_allclose(beta, [DK_PETROL[0], DK_LAW[0]], atol=2e-5)
    np.testing.assert_allclose(np.sqrt(np.diag(cov)), [DK_PETROL[1], DK_LAW[1]], atol=2e-5)
