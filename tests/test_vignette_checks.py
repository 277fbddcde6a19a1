"""Claims of the AR and HMM vignettes (01, 02) and of docs/getting-started.md, checked
against exact references and peers.

* getting-started: giving AR(p) the series from index ``p_max - p`` on scores exactly
  ``y[p_max:]`` for every order, so the criteria compare likelihoods of the same
  observations; statsmodels' ``AutoReg(..., hold_back=p_max)`` is the peer.
* vignette 01: the naive and seasonal naive baselines' predictive standard deviations
  (Hyndman and Athanasopoulos, *Forecasting: Principles and Practice*, 3rd ed., sec. 5.5,
  ``sigma sqrt(h)`` and ``sigma sqrt(k + 1)``) are the exact h-step moments of the random
  walk and seasonal random walk written as AR models (``AR.forecast_moments``).
* vignette 02: Zucchini, MacDonald and Langrock (2016, ch. 6): the forecast
  pseudo-residuals of the 1-state (Poisson) model of the earthquake counts show strong
  serial dependence, those of the 3-state model do not.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss


@pytest.fixture(scope="module")
def log_lynx():
    return np.log10(ss.datasets.load_lynx().to_numpy().astype(float))


def test_conditioning_every_order_on_p_max_scores_the_same_observations(log_lynx):
    from statsmodels.tsa.ar_model import AutoReg

    p_max = 4
    y = log_lynx[:100]
    for p in range(1, p_max + 1):
        model, sub = ss.AR(order=p), y[p_max - p:]
        params = model.fit_least_squares(sub)
        ic = ss.information_criteria(model, params, sub)
        assert ic["num_obs"] == y.size - p_max
        # the same number as the per-step log densities of y[p_max:] on the full series
        steps = np.asarray(ss.filter(model, params, y).log_probs)
        assert ic["log_lik"] == pytest.approx(steps[p_max:].sum(), abs=1e-9)
        peer = AutoReg(y, lags=p, trend="c", hold_back=p_max).fit()
        assert ic["log_lik"] == pytest.approx(peer.llf, abs=1e-8)
        np.testing.assert_allclose(np.asarray(params.coeffs[:, 0, 0]), peer.params[1:],
                                   atol=1e-10)


def test_naive_and_seasonal_naive_intervals_are_exact_random_walk_moments(log_lynx):
    y, sigma, horizon, period = log_lynx[:100], 0.3, 14, 10
    steps = np.arange(1, horizon + 1)

    naive = ss.AR(order=1)
    walk = naive.default_params()._replace(coeffs=jnp.ones((1, 1, 1)),
                                           intercept=jnp.zeros(1),
                                           cov=jnp.full((1, 1), sigma ** 2))
    fc = naive.forecast_moments(walk, y, num_steps=horizon)
    np.testing.assert_allclose(np.asarray(fc.mean), np.full(horizon, y[-1]), atol=1e-12)
    np.testing.assert_allclose(np.asarray(fc.std), sigma * np.sqrt(steps), rtol=1e-12)

    seasonal = ss.AR(order=period)
    coeffs = np.zeros((period, 1, 1))
    coeffs[-1] = 1.0
    seasonal_walk = seasonal.default_params()._replace(
        coeffs=jnp.asarray(coeffs), intercept=jnp.zeros(1), cov=jnp.full((1, 1), sigma ** 2))
    fc = seasonal.forecast_moments(seasonal_walk, y, num_steps=horizon)
    k = (steps - 1) // period
    # the vignette's formulas: mean y_{T+h-m(k+1)}, sd sigma sqrt(k+1)
    np.testing.assert_allclose(np.asarray(fc.mean), y[y.size - period * (k + 1) + steps - 1],
                               atol=1e-12)
    np.testing.assert_allclose(np.asarray(fc.std), sigma * np.sqrt(k + 1), rtol=1e-12)


def test_earthquake_pseudo_residuals_reject_one_state_not_three():
    y = ss.datasets.load_earthquakes().to_numpy()
    one = ss.PoissonHMM(num_states=1, initial="stationary")
    one_params = one.assemble_params(
        ss.models.hmm.poisson.PoissonEmissions(jnp.array([y.mean()])))  # the Poisson MLE
    three = ss.PoissonHMM(num_states=3, initial="stationary")
    fit = ss.fit_restarts(three, y, key=jax.random.key(0), num_restarts=4, num_iters=500,
                          tol=1e-11).best
    # at the published maximum (-log L = 329.4603, Zucchini and MacDonald 2009, sec. 3.4)
    assert -fit.final_log_joint == pytest.approx(329.4603, abs=5e-3)
    lb_one, lb_three, jb_three = [], [], []
    for seed in range(5):  # the randomized residuals depend on the key: use several
        key = jax.random.key(seed)
        d1 = ss.diagnose(one, one_params, y, key=key)
        d3 = ss.diagnose(three, fit.params, y, key=key)
        lb_one.append(d1.tests.loc["ljung_box", "pvalue"])
        lb_three.append(d3.tests.loc["ljung_box", "pvalue"])
        jb_three.append(d3.tests.loc["jarque_bera", "pvalue"])
        assert d1.acf[1] > 0.4  # the 1-state residuals' lag-1 autocorrelation (~0.57)
        assert abs(d3.acf[1]) < 2 / np.sqrt(y.size)
    assert max(lb_one) < 1e-6
    assert min(lb_three) > 0.05 and min(jb_three) > 0.05
