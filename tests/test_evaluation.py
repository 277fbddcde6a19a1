"""Information criteria against statsmodels, and held-out log scores."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.tsa.ar_model import AutoReg

import statseq as ss


@pytest.mark.parametrize("order", [1, 2, 3])
def test_information_criteria_match_autoreg(log_lynx, order):
    """statsmodels' AutoReg uses AIC = -2 llf + 2 (df_model + 1) and BIC = -2 llf +
    log(nobs) (df_model + 1), with df_model = 1 + p mean parameters, + 1 for sigma2, and
    nobs = T - p: the same k and n as statseq's free-parameter count and scored steps."""
    model = ss.AR(order=order)
    params = model.fit_least_squares(log_lynx)
    res = AutoReg(log_lynx, lags=order, trend="c").fit()
    ic = ss.information_criteria(model, params, log_lynx)
    assert ic["num_params"] == res.df_model + 1 == order + 2
    assert ic["num_obs"] == res.nobs == log_lynx.size - order
    np.testing.assert_allclose(ic["log_lik"], res.llf, rtol=1e-10)
    np.testing.assert_allclose(ic["aic"], res.aic, rtol=1e-10)
    np.testing.assert_allclose(ic["bic"], res.bic, rtol=1e-10)


def test_information_criteria_formula_with_mask_and_vectors(log_lynx):
    model = ss.AR(order=1, emission_dim=2)
    y = np.stack([log_lynx, np.roll(log_lynx, 3)], axis=-1)
    mask = np.ones_like(y, bool)
    mask[10, 1] = mask[20] = False
    params = model.fit_least_squares(y, mask=mask)
    ic = ss.information_criteria(model, params, y, mask=mask)
    k = 4 + 2 + 3  # A (2x2), c (2), Sigma (3 free entries)
    n = 2 * (log_lynx.size - 1) - 3  # the first step is conditioned on; 3 entries masked
    log_lik = float(ss.log_prob(model, params, y, mask=mask))
    assert ic["num_params"] == k and ic["num_obs"] == n
    np.testing.assert_allclose(ic["log_lik"], log_lik, rtol=1e-12)
    np.testing.assert_allclose(ic["aic"], -2 * log_lik + 2 * k, rtol=1e-12)
    np.testing.assert_allclose(ic["bic"], -2 * log_lik + k * np.log(n), rtol=1e-12)
    frozen = ss.ARParams(coeffs=True, intercept=False, input_weights=False, cov=False)
    assert ss.information_criteria(model, params, y, mask=mask, trainable=frozen)[
        "num_params"] == 4


@pytest.mark.parametrize("initial", ["conditional", "stationary"])
def test_log_score_is_difference_of_log_probs(log_lynx, initial):
    model = ss.AR(order=2, initial=initial)
    params = ss.AR(order=2).fit_least_squares(log_lynx)
    train, test = log_lynx[:16], log_lynx[16:]  # lengths other tests compile too
    score = ss.log_score(model, params, train, test)
    expected = float(ss.log_prob(model, params, log_lynx) - ss.log_prob(model, params, train))
    np.testing.assert_allclose(score, expected, rtol=1e-10)


def test_log_score_with_inputs(log_lynx):
    model = ss.AR(order=2, input_dim=1)
    u = np.cos(np.arange(log_lynx.size) / 2.0)[:, None]
    params = model.fit_least_squares(log_lynx, inputs=u)
    score = ss.log_score(model, params, log_lynx[:16], log_lynx[16:], inputs_train=u[:16],
                         inputs_test=u[16:])
    expected = float(ss.log_prob(model, params, log_lynx, inputs=u)
                     - ss.log_prob(model, params, log_lynx[:16], inputs=u[:16]))
    np.testing.assert_allclose(score, expected, rtol=1e-10)
