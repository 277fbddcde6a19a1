"""The numbers vignettes/04_neural_sequence_models.py prints, against peers and exact values.

The vignette runs once here, in smoke mode (one origin, one seed, one network, few Adam
steps); its helpers and baselines are the same as in full mode. References:

* statsmodels' ``AutoReg`` (conditional least squares = conditional Gaussian MLE) for the
  AR(p) log-likelihoods behind the AIC tables, ``ar_select_order`` for the order AIC picks
  on the first full-mode training window (1700-1958) and on the monthly training months
  (AR(27)), and ``AutoReg`` one-step predictions for the AR(9) predictive means the
  scores use;
* ``ss.log_score`` (the library's held-out log score) for the vignette's one-step log
  score, and a Monte Carlo CRPS of many draws for its closed-form CRPS;
* the naive method's definition: the predictive mean of each year is the year before.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from statsmodels.tsa.ar_model import AutoReg, ar_select_order

import statseq as ss


@pytest.fixture(scope="module")
def ns(run_vignette_smoke):
    return run_vignette_smoke("04_neural_sequence_models")


def _windows(ns):
    o = ns["ORIGINS"][-1]
    return ns["z"][o - ns["WINDOW"]:o], ns["z"][o:o + ns["BLOCK"]]


def test_tables_have_no_missing_scores(ns):
    """The old table's ``log_score`` column was NaN for every model (sample forecasts
    carry no density); every score the vignette prints is now computed exactly."""
    for name in ("sunspot_table", "sim_table"):
        table = ns[name]
        cols = ["log score mean", "CRPS mean"]
        assert np.all(np.isfinite(table[cols].to_numpy())), name
        # a standard deviation only where there are several seeds
        assert np.isfinite(table["log score std"]).to_numpy().tolist() == (
            table["seeds"] > 1).to_numpy().tolist()


def test_aic_order_matches_statsmodels_on_the_full_mode_window(ns):
    """AIC picks AR(9) on 1700-1958 (the full-mode first window), as statsmodels'
    ``ar_select_order`` (same common sample: the first 12 years held back); and the
    log-likelihoods behind the vignette's AIC are statsmodels' ``AutoReg.llf``."""
    root = ns["root"]
    first = root[:259]
    assert ar_select_order(first, maxlag=12, ic="aic", trend="c").ar_lags == list(range(1, 10))
    window = ns["first"]  # the smoke-mode window the vignette's AIC table uses
    for p in ns["aic"].index:
        ours = ss.information_criteria(ss.AR(order=p), ss.AR(order=p).fit_least_squares(
            window[12 - p:]), window[12 - p:])
        peer = AutoReg(window[12 - p:], lags=p, trend="c").fit()
        np.testing.assert_allclose(ours["log_lik"], peer.llf, rtol=1e-9)
        # the vignette's closed-form AIC (ar_aic) is the filtered likelihood's
        np.testing.assert_allclose(ns["aic"][p], ours["aic"], rtol=1e-10)
    assert ns["AR_ORDER"] == 9


def test_monthly_aic_order_matches_statsmodels(ns):
    """On the monthly sunspots (Tong's transform, the 2,542 training months) AIC picks
    AR(27) among orders 1-30, as statsmodels' ``ar_select_order`` does on the same common
    sample; the closed-form AICs equal ``-2 AutoReg.llf + 2 (p + 2)``."""
    y = ss.datasets.load_sunspots_monthly().to_numpy()
    tong = 2 * (np.sqrt(1 + y) - 1)
    train = tong[:2542]
    np.testing.assert_allclose(ns["xm"][:2542] * train.std() + train.mean(), train,
                               rtol=1e-12)
    assert ar_select_order(ns["xm"][:2542], maxlag=30, ic="aic",
                           trend="c").ar_lags == list(range(1, 28))
    assert ns["M_ORDER"] == 27
    x = ns["xm"][:2542]
    for p in (1, 26, 27, 30):
        peer = AutoReg(x[30 - p:], lags=p, trend="c").fit()
        np.testing.assert_allclose(ns["m_aic"][p], -2 * peer.llf + 2 * (p + 2), rtol=1e-10)


def test_one_step_moments_and_scores_are_exact(ns):
    history, future = _windows(ns)
    ar = ns["ar"]
    params = ar.fit_least_squares(history)
    mean, sd = ns["one_step"](ar, params, history, future)
    # statsmodels: the same least-squares AR(9), predicting each future year one step ahead
    peer = AutoReg(history, lags=9, trend="c").fit()
    full = np.concatenate([history, future])
    sm_mean = AutoReg(full, lags=9, trend="c").predict(peer.params, start=history.size,
                                                        end=full.size - 1)
    np.testing.assert_allclose(mean, sm_mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(sd, np.sqrt(peer.sigma2), rtol=1e-9)
    # the log score is the library's held-out log score; the CRPS a Monte Carlo CRPS
    for model, p in [(ar, params), (ns["networks"]["GRU"], ns["fits"]["GRU", ns["last"],
                                                                       0].params)]:
        lp, cr = ns["scores"](model, p, history, future)
        np.testing.assert_allclose(lp * future.size,
                                   ss.log_score(model, p, history, future), rtol=1e-10)
        m, s = ns["one_step"](model, p, history, future)
        draws = m + s * np.random.default_rng(0).standard_normal((200_000, future.size))
        mc = ss.evaluation.crps_from_samples(draws, future).mean()
        np.testing.assert_allclose(cr, mc, rtol=5e-3)


def test_naive_baseline_predicts_the_year_before(ns):
    history, future = _windows(ns)
    mean, sd = ns["one_step"](ns["walk"], ns["naive_params"](history), history, future)
    np.testing.assert_allclose(mean, np.concatenate([history[-1:], future[:-1]]), atol=1e-12)
    np.testing.assert_allclose(sd, np.sqrt(np.mean(np.diff(history) ** 2)), rtol=1e-12)


def test_patience_counts_after_the_warmup(ns):
    """Every network fit ran at least warm-up + patience * eval_every steps."""
    for (name, _, _), fit in ns["fits"].items():
        if name in ns["networks"]:
            assert fit.num_iterations >= min(ns["NUM_STEPS"],
                                             ns["WARMUP"] + ns["PATIENCE"] * ns["EVAL_EVERY"])


def test_simulated_series_true_scores(ns):
    """The 'true model' row is the exact Gaussian one-step score of the simulated EXPAR."""
    x, n = ns["x"], ns["num_sim_test"]
    mean = 0.5 + (0.5 - 1.8 * np.exp(-x[-n - 1:-1] ** 2)) * x[-n - 1:-1]
    expected = np.mean(-0.5 * ((x[-n:] - mean) / 0.4) ** 2 - np.log(0.4)
                       - 0.5 * np.log(2 * np.pi))
    np.testing.assert_allclose(ns["sim_table"].loc["true model", "log score mean"], expected,
                               rtol=1e-12)
    assert jax.config.jax_enable_x64
