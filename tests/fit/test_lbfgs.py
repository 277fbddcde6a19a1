"""fit_lbfgs: the exact AR likelihood against statsmodels' ARIMA, the conditional one against
least squares, frozen leaves and priors (an analytic MAP), stopping, non-finite
objectives, one compiled loop, input errors."""

from __future__ import annotations

import warnings

import numpy as np
import numpyro.distributions as dist
import pytest

import statseq as ss
from statseq.fit.lbfgs import _fit_lbfgs_compiled

AR2 = ss.AR(order=2)
AR2_EXACT = ss.AR(order=2, initial="stationary")
AR1 = ss.AR(order=1)


@pytest.fixture(scope="module")
def arima(log_lynx):
    """statsmodels' exact Gaussian MLE of an AR(2) with a constant (its mean) on log lynx."""
    from statsmodels.tsa.arima.model import ARIMA

    return ARIMA(log_lynx, order=(2, 0, 0), trend="c").fit()


@pytest.fixture(scope="module")
def exact_fit(log_lynx):
    return ss.fit_lbfgs(AR2_EXACT, AR2.fit_least_squares(log_lynx), log_lynx, progress=False)


def test_exact_likelihood_mle_matches_statsmodels_arima(exact_fit, arima, log_lynx):
    """The stationary AR(2) MLE is statsmodels' ARIMA(2, 0, 0) MLE.

    ARIMA reports the mean ``mu`` as ``const``; our intercept is ``c = mu (1 - phi1 - phi2)``.
    statsmodels stops its L-BFGS-B when its finite-difference gradient of the average
    log-likelihood is ~4e-5 (``mle_retvals['gopt']``); with standard errors ~0.06 that
    leaves its estimates within about ``n * se^2 * 4e-5 ~ 2e-5`` of the maximizer, and its
    log-likelihood within ~1e-7 (a second-order error). Hence atol 1e-4 on the estimates
    (0.2% of a standard error, so a wrong optimum or an intercept/mean mix-up fails), and
    1e-5 on the log-likelihood, where ours must also be at least as high.
    """
    fit = exact_fit
    assert fit.method == "lbfgs" and fit.converged and 0 < fit.num_iterations < 200
    llf = float(ss.log_prob(AR2_EXACT, fit.params, log_lynx))
    assert fit.final_log_joint == pytest.approx(llf, rel=1e-12)
    assert abs(llf - arima.llf) < 1e-5
    assert llf >= arima.llf - 1e-9
    mean, phi1, phi2, sigma2 = arima.params
    p = fit.params
    ours_phi = np.asarray(p.coeffs).ravel()
    ours_mean = float(p.intercept[0]) / (1.0 - ours_phi.sum())
    np.testing.assert_allclose(ours_phi, [phi1, phi2], atol=1e-4)
    np.testing.assert_allclose(ours_mean, mean, atol=1e-4)
    np.testing.assert_allclose(float(p.cov[0, 0]), sigma2, rtol=1e-3)


def test_trace_is_the_log_joint_and_nan_after_the_stop(exact_fit, log_lynx):
    """One entry per iteration, after the update; the zoom line search only accepts
    (approximate, within 1e-6 relative) increases; NaN after the stop."""
    fit = exact_fit
    n = fit.num_iterations
    trace = fit.log_joint
    assert trace.shape == (200,)
    assert np.all(np.isfinite(trace[:n])) and np.all(np.isnan(trace[n:]))
    assert np.all(np.diff(trace[:n]) >= -1e-6 * np.abs(trace[1:n]))
    start = float(ss.log_prob(AR2_EXACT, AR2.fit_least_squares(log_lynx), log_lynx))
    assert trace[0] > start  # the first entry is after one update
    assert fit.wall_time > 0 and fit.validation_log_prob.shape == (0,)


def test_conditional_mle_is_least_squares(log_lynx):
    """With initial="conditional" the likelihood is that of a linear regression, whose
    maximizer is the closed-form least-squares fit (sigma2 = RSS / n). From the default
    start (phi1 = 0.5) L-BFGS must find it to the precision its tolerance implies."""
    fit = ss.fit_lbfgs(AR2, AR2.default_params(), log_lynx, progress=False)
    ls = AR2.fit_least_squares(log_lynx)
    assert fit.converged
    for name in ("coeffs", "intercept", "cov"):
        np.testing.assert_allclose(
            np.asarray(getattr(fit.params, name)), np.asarray(getattr(ls, name)),
            rtol=1e-7, atol=1e-8, err_msg=name,
        )
    np.testing.assert_allclose(
        fit.final_log_joint, float(ss.log_prob(AR2, ls, log_lynx)), rtol=1e-12
    )


def test_map_with_frozen_leaves_matches_the_analytic_mode(log_lynx):
    """Known phi and sigma2 (frozen), Normal(m0, s0^2) prior on c: the mode is closed form,

        c* = (sum_t (y_t - phi y_{t-1}) / sigma2 + m0 / s0^2) / ((T-1) / sigma2 + 1 / s0^2),

    and the frozen leaves come back bit for bit."""
    mle = AR1.fit_least_squares(log_lynx)
    m0, s0 = 0.0, 0.05
    priors = ss.ARParams(coeffs=None, intercept=dist.Normal(m0, s0), input_weights=None,
                         cov=None)
    trainable = ss.ARParams(coeffs=False, intercept=True, input_weights=False, cov=False)
    fit = ss.fit_lbfgs(AR1, mle, log_lynx, priors=priors, trainable=trainable,
                       progress=False)
    phi, s2 = float(mle.coeffs[0, 0, 0]), float(mle.cov[0, 0])
    resid = log_lynx[1:] - phi * log_lynx[:-1]
    c_star = (resid.sum() / s2 + m0 / s0**2) / (resid.size / s2 + 1 / s0**2)
    assert abs(float(mle.intercept[0]) - c_star) > 0.1  # the prior matters here
    np.testing.assert_allclose(float(fit.params.intercept[0]), c_star, rtol=1e-9)
    np.testing.assert_array_equal(np.asarray(fit.params.coeffs), np.asarray(mle.coeffs))
    np.testing.assert_array_equal(np.asarray(fit.params.cov), np.asarray(mle.cov))
    log_joint = float(ss.log_prob(AR1, fit.params, log_lynx) + ss.log_prior(priors, fit.params))
    np.testing.assert_allclose(fit.final_log_joint, log_joint, rtol=1e-12)
    assert fit.converged


def test_non_finite_objective_warns_and_returns_the_start(log_lynx):
    """Data of 1e200 are refused (their squares overflow float64); data of 1e153 pass
    the check one by one, but the sum of their 114 squares overflows: the log-likelihood
    is -inf from the start."""
    start = AR2.default_params()
    with pytest.raises(ValueError, match="squares overflow"):
        ss.fit_lbfgs(AR2, start, log_lynx * 1e200, progress=False)
    with pytest.warns(RuntimeWarning, match="not finite"):
        fit = ss.fit_lbfgs(AR2, start, log_lynx * 1e153, progress=False)
    assert fit.num_iterations == 0 and not fit.converged
    assert np.all(np.isnan(fit.log_joint))
    np.testing.assert_array_equal(np.asarray(fit.params.coeffs), np.asarray(start.coeffs))
    np.testing.assert_allclose(np.asarray(fit.params.cov), np.asarray(start.cov), rtol=1e-15)


def test_iteration_limit_and_repeated_fits_reuse_the_compiled_loop(log_lynx):
    """Stopping at num_iters reports converged=False. New data of the same shape, another
    tolerance, other frozen leaves, another num_iters: one program (the trainable mask and
    num_iters are array arguments, the trace buffer a power of two >= 256)."""
    params = AR2.default_params()
    first = ss.fit_lbfgs(AR2, params, log_lynx, num_iters=3, progress=False)
    assert first.num_iterations == 3 and not first.converged  # the iteration limit
    assert np.all(np.isfinite(first.log_joint))
    size = _fit_lbfgs_compiled._cache_size()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = ss.fit_lbfgs(
            AR2, params, log_lynx[::-1].copy(), num_iters=200, tol=1e-6, progress=False,
            trainable=ss.ARParams(coeffs=True, intercept=True, input_weights=True, cov=False),
        )
    assert _fit_lbfgs_compiled._cache_size() == size
    assert fit.log_joint.shape == (200,)
    np.testing.assert_array_equal(np.asarray(fit.params.cov), np.asarray(params.cov))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(num_iters=0), ValueError, "num_iters"),
        (dict(num_iters=2.5), TypeError, "num_iters"),
        (dict(tol=-1.0), ValueError, "tol"),
        (dict(tol=float("nan")), ValueError, "tol"),
        (dict(tol="small"), TypeError, "tol"),
        (dict(mask=np.ones(5, bool)), ValueError, "mask"),
        (dict(inputs=np.ones((114, 1))), ValueError, "inputs"),
        (dict(trainable=ss.ARParams(False, False, False, False)), ValueError, "nothing to fit"),
        (dict(trainable=(True, False)), ValueError, "trainable"),
        (dict(priors=ss.ARParams("flat", None, None, None)), TypeError, "prior"),
    ],
)
def test_bad_arguments_raise_clear_errors(log_lynx, kwargs, error, match):
    with pytest.raises(error, match=match):
        ss.fit_lbfgs(AR2, AR2.default_params(), log_lynx, progress=False, **kwargs)


def test_bad_params_and_data_raise_clear_errors(log_lynx):
    with pytest.raises(ValueError, match="params.cov"):
        ss.fit_lbfgs(AR2, AR2.default_params()._replace(cov=-np.eye(1)), log_lynx)
    y = log_lynx.copy()
    y[10] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        ss.fit_lbfgs(AR2, AR2.default_params(), y)
