"""The numbers vignettes/06_markov_switching.py prints, against published and peer values.

The vignette runs once in smoke mode (its fits are the same as in full mode; only the
number of random EM starts and forecast samples shrink). References:

* Hamilton (1989) MS(2)-AR(4) of US GNP growth as reproduced in statsmodels'
  ``TestHamiltonAR4`` (E-views): estimates to 6 decimals, log-likelihood -181.26339 and
  standard errors from the observed information (``bse_oim``);
* the expected durations statsmodels' fit reports (``expected_durations``,
  4.07604793 and 10.42589261 quarters, as printed in the statsmodels regime-switching
  notebook "Hamilton (1989) switching model of GNP");
* statsmodels' ``MarkovAutoregression`` smoother and ``AutoReg`` (the AR(4) baseline)
  evaluated on the same data;
* the closed form of a two-state chain's h-step law, ``pi + (p_0 - pi) lambda^h`` with
  ``lambda = p_00 + p_11 - 1``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from statsmodels.tsa.ar_model import AutoReg
from statsmodels.tsa.regime_switching.markov_autoregression import MarkovAutoregression

with warnings.catch_warnings():  # its `pytest.mark.smoke` is unregistered here
    warnings.simplefilter("ignore")
    from statsmodels.tsa.regime_switching.tests import (
        test_markov_autoregression as sm_tests,
    )

# statsmodels' TestHamiltonAR4 (E-views), typed here from its source
E_VIEWS = np.r_[0.754673, 0.095915, -0.358811, 1.163516, np.exp(-0.262658) ** 2,
                0.013486, -0.057521, -0.246983, -0.212923]
E_VIEWS_LLF = -181.26339
E_VIEWS_SE = np.r_[0.0965189, 0.0377362, 0.2645396, 0.0745187, np.nan, 0.1199942,
                   0.137663, 0.1069103, 0.1105311]
SM_EXPECTED_DURATIONS = np.r_[4.07604793, 10.42589261]


@pytest.fixture(scope="module")
def ns(run_vignette_smoke):
    return run_vignette_smoke("06_markov_switching")


def test_published_constants_are_statsmodels_test_values(ns):
    """The constants the vignette prints as "published" are statsmodels' test values."""
    sm_model = sm_tests.TestHamiltonAR4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sm_model.setup_class()
    np.testing.assert_array_equal(ns["PUBLISHED"], sm_model.true["params"])
    assert ns["PUBLISHED_LLF"] == sm_model.true["llf"]
    np.testing.assert_array_equal(ns["PUBLISHED_SE"], sm_model.true["bse_oim"])
    np.testing.assert_array_equal(ns["PUBLISHED"], E_VIEWS)


def test_fitted_maximum_matches_published(ns):
    """EM and L-BFGS: log-likelihood within 1e-4 of -181.26339 (measured ~1e-8);
    L-BFGS estimates within 2e-5 of E-views' 6-decimal values, EM's within 2e-4; the
    standard errors within 1e-5 of E-views' observed-information ones (not sigma^2,
    which E-views reports on the log sigma scale)."""
    assert abs(ns["llf"] - E_VIEWS_LLF) < 1e-4
    assert abs(ns["em"].final_log_joint - E_VIEWS_LLF) < 1e-4
    np.testing.assert_allclose(ns["as_vector"](ns["params"]), E_VIEWS, atol=2e-5)
    np.testing.assert_allclose(ns["as_vector"](ns["em"].params), E_VIEWS, atol=2e-4)
    keep = np.isfinite(E_VIEWS_SE)
    np.testing.assert_allclose(ns["se_vec"][keep], E_VIEWS_SE[keep], atol=1e-5)
    if ns["sm_llf"] is not None:
        np.testing.assert_allclose(ns["sm_llf"], ns["llf"], atol=1e-8)


def test_durations_and_their_uncertainty(ns):
    """Expected durations equal statsmodels' printed ``expected_durations`` to 1e-3;
    the delta-method s.e. equals se(p_kk) / (1 - p_kk)^2 with E-views' se(p_kk) to 1e-3."""
    d = ns["durations"]
    np.testing.assert_allclose(d["duration (quarters)"].to_numpy(), SM_EXPECTED_DURATIONS,
                               atol=1e-3)
    p00, p10 = E_VIEWS[0], E_VIEWS[1]
    ref_se = np.r_[E_VIEWS_SE[0] / (1 - p00) ** 2, E_VIEWS_SE[1] / p10**2]
    np.testing.assert_allclose(d["delta s.e."].to_numpy(), ref_se, rtol=1e-3)
    assert np.all(d["95% lower"] < d["duration (quarters)"])
    assert np.all(d["duration (quarters)"] < d["95% upper"])


def test_smoothed_probabilities_match_statsmodels(ns):
    """The plotted recession probabilities equal statsmodels' smoother at the same
    parameters (1e-8) and the published E-views smoothed probabilities (1e-4)."""
    y = ns["y"]
    res = MarkovAutoregression(y, k_regimes=2, order=4, switching_ar=False).smooth(
        ns["as_vector"](ns["params"]))
    np.testing.assert_allclose(ns["p_rec"][4:], res.smoothed_marginal_probabilities[:, 0],
                               atol=1e-8)
    np.testing.assert_allclose(1 - ns["p_rec"][4:], sm_tests.hamilton_ar4_smoothed,
                               atol=1e-4)
    # NBER table: 7 recessions of 4, 3, 3, 4, 5, 2, 5 quarters (peak excluded)
    assert int(ns["nber"].sum()) == 26


def test_baseline_ar4_matches_statsmodels(ns):
    """The AR(4) baseline's log-likelihood equals statsmodels' AutoReg (conditional MLE)
    to 1e-8; AIC and BIC follow from -2 log L + 2k and + k log n."""
    crit = ns["criteria"]
    sm = AutoReg(ns["y"], lags=4, trend="c").fit()
    np.testing.assert_allclose(crit.loc["AR(4)", "log_lik"], sm.llf, atol=1e-8)
    for name, k in [("AR(4)", 6), ("MS(2)-AR(4)", 9)]:
        ll, n = crit.loc[name, "log_lik"], crit.loc[name, "num_obs"]
        assert crit.loc[name, "num_params"] == k and n == 131
        np.testing.assert_allclose(crit.loc[name, "aic"], -2 * ll + 2 * k)
        np.testing.assert_allclose(crit.loc[name, "bic"], -2 * ll + k * np.log(n))


def test_regime_forecast_closed_form(ns):
    """p(s_{T+h}) by matrix powers equals pi + (p_T - pi) lambda^h (two states) to 1e-12."""
    trans, p_t = ns["trans"], ns["filtered_last"]
    lam = trans[0, 0] + trans[1, 1] - 1
    pi0 = trans[1, 0] / (trans[0, 1] + trans[1, 0])
    h = np.arange(1, ns["HORIZON"] + 1)
    np.testing.assert_allclose(ns["regime_fc"][:, 0], pi0 + (p_t[0] - pi0) * lam**h,
                               atol=1e-12)
    np.testing.assert_allclose(ns["ergodic"][0], pi0, atol=1e-12)
