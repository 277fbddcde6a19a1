"""standard_errors and summary: the exact AR likelihood against statsmodels' ARIMA standard
errors (complex-step Hessian and Harvey's observed information), the conditional AR
against the exact OLS formulas, a conjugate MAP against its closed-form posterior,
the summary table, and errors."""

from __future__ import annotations

import math

import numpy as np
import numpyro.distributions as dist
import pytest

import statseq as ss

AR2 = ss.AR(order=2)
AR2_EXACT = ss.AR(order=2, initial="stationary")


@pytest.fixture(scope="module")
def arima(log_lynx):
    """statsmodels' exact Gaussian MLE of an AR(2) with a constant (its mean)."""
    from statsmodels.tsa.arima.model import ARIMA

    return ARIMA(log_lynx, order=(2, 0, 0), trend="c").fit()


def _from_arima(res):
    """statsmodels' estimates as ARParams: const is the mean mu, c = mu (1 - phi1 - phi2)."""
    mean, phi1, phi2, sigma2 = res.params
    return ss.ARParams(
        coeffs=np.array([[[phi1]], [[phi2]]]),
        intercept=np.array([mean * (1.0 - phi1 - phi2)]),
        input_weights=np.zeros((1, 0)),
        cov=np.array([[sigma2]]),
    )


@pytest.fixture(scope="module")
def exact_se(arima, log_lynx):
    """Our standard errors at statsmodels' own estimates (the same point as its bse),
    with the mean's by the delta method: mu = c / (1 - phi1 - phi2)."""
    params = _from_arima(arima)
    se, cov = ss.standard_errors(AR2_EXACT, params, log_lynx, return_cov=True)
    c, phi1, phi2 = float(params.intercept[0]), *np.asarray(params.coeffs).ravel()
    d = 1.0 - phi1 - phi2
    grad = np.array([c / d**2, c / d**2, 1.0 / d, 0.0])  # ravel order: coeffs, c, cov
    se_mean = math.sqrt(grad @ cov @ grad)
    return params, np.array([se_mean, se.coeffs[0, 0, 0], se.coeffs[1, 0, 0], se.cov[0, 0]])


def test_exact_likelihood_se_match_statsmodels_complex_step_hessian(arima, exact_se):
    """cov_type="approx" inverts statsmodels' complex-step Hessian of the same exact
    log-likelihood at the same point: the same quantity as ours up to its numerical
    differentiation (observed agreement ~2e-5), hence rtol 1e-4. The AR coefficients' and
    sigma2's standard errors do not depend on whether the constant is the mean or the
    intercept (their block of the covariance is invariant); the mean's goes through the
    delta method."""
    _, ours = exact_se
    np.testing.assert_allclose(ours, np.sqrt(np.diag(arima.cov_params_approx)), rtol=1e-4)


def test_exact_likelihood_se_match_statsmodels_oim(arima, exact_se):
    """cov_type="oim" is Harvey's (1989) information matrix: it keeps the products of
    first derivatives of the innovations and their variances but drops the terms with the
    innovations' second derivatives (zero in expectation), so it differs from the exact
    Hessian by O(T^-1/2) in relative terms; here by at most 0.6% (T = 114). rtol 2%.
    (ARIMA's default ``bse`` is the outer product of gradients, a third estimator, 14% off
    here.)"""
    _, ours = exact_se
    oim = np.sqrt(np.diag(arima.cov_params_oim))
    np.testing.assert_allclose(ours, oim, rtol=2e-2)


def test_conditional_ar_se_equal_the_ols_formulas(log_lynx):
    """The conditional AR(2) likelihood is a Gaussian linear regression of y_t on
    x_t = (1, y_{t-1}, y_{t-2}). At the MLE (beta_hat, s2 = RSS / n) the observed
    information is block diagonal, with Cov(beta_hat) = s2 (X'X)^{-1} and
    Var(s2_hat) = 2 s2^2 / n, exactly."""
    y = log_lynx
    params = AR2.fit_least_squares(y)
    se, cov = ss.standard_errors(AR2, params, y, return_cov=True)
    x = np.column_stack([np.ones(y.size - 2), y[1:-1], y[:-2]])
    n, s2 = x.shape[0], float(params.cov[0, 0])
    cov_beta = s2 * np.linalg.inv(x.T @ x)
    ours = np.array([se.intercept[0], se.coeffs[0, 0, 0], se.coeffs[1, 0, 0]])
    np.testing.assert_allclose(ours, np.sqrt(np.diag(cov_beta)), rtol=1e-8)
    np.testing.assert_allclose(se.cov[0, 0], s2 * math.sqrt(2.0 / n), rtol=1e-8)
    # ravel order (coeffs[0], coeffs[1], intercept, cov): the covariance itself, too
    perm = [1, 2, 0]
    np.testing.assert_allclose(cov[:3, :3], cov_beta[np.ix_(perm, perm)], rtol=1e-8)
    np.testing.assert_allclose(cov[3, :3], 0.0, atol=1e-10 * s2)
    assert se.input_weights.shape == (1, 0)


def test_map_se_is_the_conjugate_posterior_sd_and_frozen_leaves_are_nan(log_lynx):
    """phi and sigma2 frozen, Normal(m0, s0^2) prior on c: the log joint is quadratic in c
    with curvature n / sigma2 + 1 / s0^2, so the Laplace standard deviation is exact."""
    y = log_lynx
    ls = AR2.fit_least_squares(y)
    m0, s0 = 0.0, 0.05
    priors = ss.ARParams(coeffs=None, intercept=dist.Normal(m0, s0), input_weights=None,
                         cov=None)
    trainable = ss.ARParams(coeffs=False, intercept=True, input_weights=False, cov=False)
    phi = np.asarray(ls.coeffs).ravel()
    s2 = float(ls.cov[0, 0])
    resid = y[2:] - phi[0] * y[1:-1] - phi[1] * y[:-2]
    precision = resid.size / s2 + 1.0 / s0**2
    c_star = (resid.sum() / s2 + m0 / s0**2) / precision
    params = ls._replace(intercept=np.array([c_star]))
    se, cov = ss.standard_errors(AR2, params, y, trainable=trainable, priors=priors,
                                 return_cov=True)
    np.testing.assert_allclose(se.intercept[0], precision**-0.5, rtol=1e-10)
    assert np.all(np.isnan(se.coeffs)) and np.all(np.isnan(se.cov))
    assert cov.shape == (4, 4) and np.isnan(cov[0, 2]) and np.isfinite(cov[2, 2])
    table = ss.summary(AR2, params, y, trainable=trainable, priors=priors)
    assert table.num_params == 1 and list(table.trainable) == [False, False, True, False]
    text = str(table)
    assert "(fixed)" in text and "Log prior:" in text and "Laplace" in text
    assert f"{precision**-0.5:.5g}" in text


def test_not_at_a_maximum(log_lynx):
    """Far from the maximum the information is indefinite: a clear error. Near it (but
    not at it) the standard errors come with a warning."""
    ls = AR2.fit_least_squares(log_lynx)
    with pytest.raises(ValueError, match="not positive definite.*not at a strict local max"):
        ss.standard_errors(AR2, ls._replace(intercept=ls.intercept + 2.0), log_lynx)
    with pytest.warns(RuntimeWarning, match="not at a maximum"):
        ss.standard_errors(AR2, ls._replace(intercept=ls.intercept + 0.05), log_lynx)


def test_summary_table(arima, exact_se, log_lynx):
    """The table shows each parameter's estimate, standard error, z and interval; the
    log-likelihood, AIC and BIC are information_criteria's (and, at statsmodels' own
    estimates, statsmodels': both count k = 4 and n = 114)."""
    params, se = exact_se
    fit = ss.FitResult(params=params, log_joint=np.array([arima.llf]), num_iterations=7,
                       converged=True, validation_log_prob=np.zeros(0),
                       validation_steps=np.zeros(0, int), wall_time=0.1, method="lbfgs")
    table = ss.summary(AR2_EXACT, None, log_lynx, fit=fit)
    crit = ss.information_criteria(AR2_EXACT, params, log_lynx)
    assert table.names == ("coeffs[0,0,0]", "coeffs[1,0,0]", "intercept[0]", "cov[0,0]")
    assert (table.log_lik, table.aic, table.bic) == (crit["log_lik"], crit["aic"], crit["bic"])
    assert (table.num_obs, table.num_params) == (114, 4)
    np.testing.assert_allclose(table.log_lik, arima.llf, atol=1e-9)
    np.testing.assert_allclose([table.aic, table.bic], [arima.aic, arima.bic], atol=1e-8)
    np.testing.assert_allclose(table.std_errors[[0, 1, 3]], se[1:], rtol=1e-12)
    np.testing.assert_allclose(table.z[:3], table.estimates[:3] / table.std_errors[:3],
                               rtol=1e-12)
    np.testing.assert_allclose(table.ci_upper[:3] - table.estimates[:3],
                               1.959964 * table.std_errors[:3], rtol=1e-6)
    np.testing.assert_allclose(table.p_values[2], math.erfc(abs(table.z[2]) / math.sqrt(2)))
    # the innovation variance: log-scale interval, no z-test of the boundary null
    assert table.ci_scale == ("wald", "wald", "wald", "log")
    assert table.null == ("interior", "interior", "interior", "boundary")
    assert np.isnan(table.z[3]) and np.isnan(table.p_values[3])
    s2, se2 = table.estimates[3], table.std_errors[3]
    np.testing.assert_allclose([table.ci_lower[3], table.ci_upper[3]],
                               s2 * np.exp(np.array([-1, 1]) * 1.959964 * se2 / s2), rtol=1e-6)
    text = str(table)
    assert repr(table) == text
    for value in (table.log_lik, table.aic, table.bic):
        assert f"{value:.4f}" in text
    assert "lbfgs (converged, 7 iterations)" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()
            if line.startswith(("coeffs", "intercept", "cov"))}
    assert len(rows) == 4
    for i, name in enumerate(table.names[:3]):
        est, std, z, _, lo, hi, scale = rows[name]
        np.testing.assert_allclose(
            [float(v) for v in (est, std, z, lo, hi)],
            [table.estimates[i], table.std_errors[i], table.z[i], table.ci_lower[i],
             table.ci_upper[i]], rtol=1e-4,
        )
        assert scale == "wald"
    est, std, flag, lo, hi, scale = rows["cov[0,0]"]
    assert (flag, scale) == ("(b)", "log") and "boundary of the parameter space" in text
    np.testing.assert_allclose([float(v) for v in (est, std, lo, hi)],
                               [table.estimates[3], table.std_errors[3], table.ci_lower[3],
                                table.ci_upper[3]], rtol=1e-4)


def test_summary_reports_the_lower_triangle_of_a_covariance(log_lynx):
    """A VAR(1)'s 2x2 noise covariance has 3 free entries: cov[0,0], cov[1,0], cov[1,1]."""
    y = np.stack([log_lynx, np.roll(log_lynx, 3)], axis=-1)
    model = ss.AR(order=1, emission_dim=2)
    params = model.fit_least_squares(y)
    table = ss.summary(model, params, y)
    assert [n for n in table.names if n.startswith("cov")] == ["cov[0,0]", "cov[1,0]", "cov[1,1]"]
    assert len(table.names) == 4 + 2 + 3 == table.num_params
    se = ss.standard_errors(model, params, y)
    assert se.cov[0, 1] == se.cov[1, 0] and table.std_errors[-2] == se.cov[1, 0]
    # Var(s_ii) = 2 s_ii^2 / n for a Gaussian covariance MLE
    np.testing.assert_allclose(se.cov[0, 0], params.cov[0, 0] * math.sqrt(2 / 113), rtol=1e-8)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(mask=np.ones(3, bool)), ValueError, "mask"),
        (dict(trainable=ss.ARParams(False, False, False, False)), ValueError, "no standard"),
        (dict(trainable=[True]), ValueError, "trainable"),
        (dict(priors=ss.ARParams(1.0, None, None, None)), TypeError, "prior"),
    ],
)
def test_standard_errors_bad_arguments(log_lynx, kwargs, error, match):
    with pytest.raises(error, match=match):
        ss.standard_errors(AR2, AR2.fit_least_squares(log_lynx), log_lynx, **kwargs)


def test_bad_inputs_raise_clear_errors(log_lynx):
    params = AR2.fit_least_squares(log_lynx)
    with pytest.raises(ValueError, match="params.cov"):
        ss.standard_errors(AR2, params._replace(cov=np.zeros((1, 1))), log_lynx)
    with pytest.raises(ValueError, match="non-finite"):
        ss.standard_errors(AR2, params, np.r_[log_lynx, np.inf])
    with pytest.raises(TypeError, match="FitResult"):
        ss.summary(AR2, params, log_lynx, fit={"params": params})
    with pytest.raises(ValueError, match="pass params"):
        ss.summary(AR2, None, log_lynx)


def _nile_local_level():
    y = ss.datasets.load_nile().to_numpy().astype(float)
    model = ss.LocalLevel()
    fit = ss.fit_lbfgs(model, model.initialize(y), y, progress=False)
    return model, fit, y


def test_nile_variance_intervals_stay_positive_and_match_a_numpy_log_scale_hessian():
    """Durbin and Koopman's Nile local level model. The Wald interval of the level variance
    sigma2_eta (estimate ~1469, se ~1280) would go below zero; the table's interval is the
    Wald interval of log sigma2, computed here independently: the Hessian of statsmodels'
    exact diffuse log-likelihood in (log sigma2_eps, log sigma2_eta) by central finite
    differences in NumPy, inverted, mapped back by exp. Agreement to 1e-4 (the finite
    differences' error). Neither variance gets a z-test (theta = 0 is a boundary)."""
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    model, fit, y = _nile_local_level()
    table = ss.summary(model, None, y, fit=fit)
    est = table.estimates
    assert est[1] - 1.959964 * table.std_errors[1] < 0  # the naive interval goes negative
    assert np.all(table.ci_lower > 0) and np.all(table.ci_lower < est)
    assert np.all(table.ci_upper > est)
    uc = UnobservedComponents(y, "llevel", use_exact_diffuse=True)

    def loglike(x):
        return uc.loglike(np.exp(x))

    x0, h = np.log(est), 1e-4
    hess = np.empty((2, 2))
    for i in range(2):
        for j in range(2):
            ei, ej = h * np.eye(2)[i], h * np.eye(2)[j]
            hess[i, j] = (loglike(x0 + ei + ej) - loglike(x0 + ei - ej)
                          - loglike(x0 - ei + ej) + loglike(x0 - ei - ej)) / (4 * h * h)
    se_log = np.sqrt(np.diag(np.linalg.inv(-hess)))
    np.testing.assert_allclose(table.ci_lower, est * np.exp(-1.959964 * se_log), rtol=1e-4)
    np.testing.assert_allclose(table.ci_upper, est * np.exp(1.959964 * se_log), rtol=1e-4)
    assert table.null == ("boundary", "boundary") and np.all(np.isnan(table.p_values))
    text = str(table)
    assert "(b)" in text and "Self and Liang" in text and "nan" not in text


def test_interval_helper_log_logit_and_support():
    """The private helpers, against the formulas written out: a lower bound lo (log scale
    of theta - lo), an interval (logit scale), an upper bound only, and the supports read
    off numpyro constraints (variances on a covariance diagonal, correlations)."""
    from numpyro.distributions import constraints

    from statseq.fit.inference_stats import _interval, _support

    z = 1.959963984540054
    lo, hi, scale = _interval(5.0, 1.5, 2.0, math.inf)
    assert scale == "log"
    np.testing.assert_allclose([lo, hi], 2.0 + 3.0 * np.exp([-z * 0.5, z * 0.5]), rtol=1e-14)
    lo, hi, scale = _interval(0.9, 0.2, 0.0, 1.0)
    g, se_g = math.log(0.9 / 0.1), 0.2 / (0.9 * 0.1)
    expit = 1.0 / (1.0 + np.exp(-np.array([g - z * se_g, g + z * se_g])))
    assert scale == "logit" and 0.0 < lo < 0.9 < hi < 1.0
    np.testing.assert_allclose([lo, hi], expit, rtol=1e-14)
    lo, hi, scale = _interval(-1.0, 2.0, -math.inf, 0.0)
    assert scale == "log" and hi < 0.0
    np.testing.assert_allclose([lo, hi], -np.exp([z * 2.0, -z * 2.0]), rtol=1e-14)
    assert _interval(1.0, 2.0, -math.inf, math.inf) == (1.0 - z * 2.0, 1.0 + z * 2.0, "wald")
    assert np.isnan(_interval(0.0, 1.0, 0.0, math.inf)[0])  # estimate on the boundary
    assert _support(constraints.positive, False) == (0.0, math.inf)
    assert _support(constraints.greater_than(2.0), False) == (2.0, math.inf)
    assert _support(constraints.simplex, False) == (0.0, 1.0)
    assert _support(constraints.unit_interval, False) == (0.0, 1.0)
    assert _support(constraints.positive_definite, True) == (0.0, math.inf)
    assert _support(constraints.positive_definite, False) == (-math.inf, math.inf)
    assert _support(constraints.corr_matrix, False) == (-1.0, 1.0)
    assert _support(constraints.real, False) == (-math.inf, math.inf)


def test_poisson_hmm_probabilities_get_logit_intervals_and_rates_log_intervals():
    """Two-state Poisson HMM of the earthquake counts with a stationary start, fitted by
    L-BFGS: the published MLE (Zucchini, MacDonald and Langrock 2016, sec. 3.4:
    lambda = (15.472, 26.125), Gamma = [[0.9340, 0.0660], [0.1285, 0.8715]]) to 1e-3.
    The transition probabilities (simplex rows) get logit-scale intervals inside (0, 1),
    as the hand formula; the rates log-scale intervals inside (0, inf); none of them a
    z-test (0 is a boundary of both)."""
    import jax.numpy as jnp

    y = ss.datasets.load_earthquakes().to_numpy()
    model = ss.PoissonHMM(num_states=2, initial="stationary")
    start = model.assemble_params(
        ss.models.hmm.poisson.PoissonEmissions(jnp.array([15.0, 25.0])),
        transitions=jnp.array([[0.9, 0.1], [0.1, 0.9]]))
    fit = ss.fit_lbfgs(model, start, y, progress=False)
    np.testing.assert_allclose(np.asarray(fit.params.emissions.rates), [15.472, 26.125],
                               rtol=1e-3)
    np.testing.assert_allclose(np.asarray(fit.params.transitions),
                               [[0.9340, 0.0660], [0.1285, 0.8715]], atol=1e-3)
    table = ss.summary(model, None, y, fit=fit)
    scales = dict(zip(table.names, table.ci_scale, strict=True))
    assert all(scales[n] == "logit" for n in table.names if n.startswith("transitions"))
    assert all(scales[n] == "log" for n in table.names if "rates" in n)
    assert set(table.null) == {"boundary"} and np.all(np.isnan(table.p_values))
    est, se = table.estimates, table.std_errors
    assert np.all(table.ci_lower < est) and np.all(est < table.ci_upper)
    probs = np.array([n.startswith("transitions") for n in table.names])
    assert np.all(table.ci_lower[probs] > 0) and np.all(table.ci_upper[probs] < 1)
    g = np.log(est[probs] / (1 - est[probs]))
    se_g = se[probs] / (est[probs] * (1 - est[probs]))
    np.testing.assert_allclose(table.ci_lower[probs], 1 / (1 + np.exp(-(g - 1.959964 * se_g))),
                               rtol=1e-6)
    np.testing.assert_allclose(table.ci_upper[probs], 1 / (1 + np.exp(-(g + 1.959964 * se_g))),
                               rtol=1e-6)
    assert "logit" in str(table)


def test_intervals_with_huge_standard_errors_reach_the_bounds_without_overflow():
    """A probability near 0 with a huge standard error (an HMM transition near the
    boundary) has a logit-scale interval spanning (0, 1); a positive parameter's log-scale
    interval reaches infinity. Neither may raise OverflowError (seen in vignette 02)."""
    from statseq.fit.inference_stats import _interval

    lo, hi, scale = _interval(1e-4, 50.0, 0.0, 1.0)
    assert scale == "logit" and lo == pytest.approx(0.0, abs=1e-300) and hi == pytest.approx(1.0)
    lo, hi, scale = _interval(2.0, 1e6, 0.0, float("inf"))
    assert scale == "log" and hi == float("inf") and 0.0 <= lo < 1e-100
    # a moderate case still equals the logit-scale delta method computed by hand
    g, se_g = np.log(0.3 / 0.7), 0.05 / (0.3 * 0.7)
    expect = 1 / (1 + np.exp(-(g - 1.959963984540054 * se_g))), 1 / (
        1 + np.exp(-(g + 1.959963984540054 * se_g)))
    np.testing.assert_allclose(_interval(0.3, 0.05, 0.0, 1.0)[:2], expect, rtol=1e-12)
