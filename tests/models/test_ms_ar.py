"""Markov-switching AR (Hamilton 1989) against published numbers, statsmodels and brute force.

References: Hamilton's (1989) MS(2)-AR(4) GNP model as reproduced in statsmodels' tests
(``TestHamiltonAR4``: E-views estimates, llf = -181.26339, smoothed and filtered regime
probabilities to 6 decimals); statsmodels' ``MarkovAutoregression`` (switching mean) and
``MarkovRegression`` on lagged regressors (switching intercept) evaluated at the same
parameters; exact enumeration of every regime path for tiny problems.
"""

from __future__ import annotations

import itertools
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp
from statsmodels.tsa.regime_switching.markov_autoregression import MarkovAutoregression
from statsmodels.tsa.regime_switching.markov_regression import MarkovRegression

import statseq as ss
from statseq.datasets import load_us_gnp_growth
from statseq.models.hmm import stationary_distribution
from statseq.models.switching import MarkovSwitchingAR, MSARParams

with warnings.catch_warnings():  # its `pytest.mark.smoke` is unregistered here
    warnings.simplefilter("ignore")
    from statsmodels.tsa.regime_switching.tests import (
        test_markov_autoregression as sm_tests,
    )

# Hamilton (1989) / E-views, as in statsmodels' TestHamiltonAR4: p[0->0], p[1->0],
# mu_0, mu_1, sigma^2, phi_1..phi_4; regime 0 is the recession regime
HAMILTON = np.r_[0.754673, 0.095915, -0.358811, 1.163516, np.exp(-0.262658) ** 2,
                 0.013486, -0.057521, -0.246983, -0.212923]
HAMILTON_LLF = -181.26339
HAM_MODEL = MarkovSwitchingAR(num_regimes=2, order=4)


def hamilton_params(v=HAMILTON):
    trans = np.array([[v[0], 1 - v[0]], [v[1], 1 - v[1]]])
    return MSARParams(None, jnp.asarray(trans), jnp.asarray(v[2:4]), jnp.asarray(v[5:]),
                      jnp.asarray(v[4]))


def gnp():
    return load_us_gnp_growth().to_numpy()


def sm_param_vector(names, params):
    """statsmodels' parameter vector (by name) from our params."""
    trans = np.asarray(params.transitions)
    means, phi = np.asarray(params.means), np.asarray(params.ar_coeffs)
    var = np.asarray(params.variances)
    out = []
    for name in names:
        m = re.fullmatch(r"p\[(\d)->(\d)\]", name)
        if m:
            out.append(trans[int(m[1]), int(m[2])])
            continue
        m = re.fullmatch(r"(const|sigma2|ar\.L|x)(\d*)(?:\[(\d)\])?", name)
        kind, lag, k = m[1], m[2], m[3]
        arr = {"const": means, "sigma2": var}.get(kind, phi)
        if kind in ("ar.L", "x"):
            arr = arr[..., int(lag) - 1]
        out.append(float(arr[int(k)]) if k is not None and arr.ndim else float(arr))
    return np.array(out)


def random_params(model, rng):
    k, p = model.num_regimes, model.order
    trans = rng.dirichlet(np.ones(k), size=k) + 2 * np.eye(k)
    trans /= trans.sum(1, keepdims=True)
    shapes = model.param_shapes()
    return MSARParams(
        jnp.asarray(rng.dirichlet(np.ones(k))) if model.initial == "free" else None,
        jnp.asarray(trans),
        jnp.asarray(2.0 * rng.normal(size=shapes.means)),
        jnp.asarray(rng.uniform(-0.5, 0.5, size=shapes.ar_coeffs) / p),
        jnp.asarray(rng.uniform(0.3, 1.5, size=shapes.variances)),
    )


def ecm_step(model, params, y, num_iters):
    """One ECM step (E-step, then every closed-form M-step block) at ``params`` and the
    log-likelihood there: the first iteration of `fit_em`, stopped by a tolerance that the
    first change always meets (``params`` enter iteration 0, its M-step's output enters
    iteration 1, where the fit converges and returns them; ``log_joint[0]`` is ``log p(y |
    params)``, no priors). With the ``num_iters`` of the test's own `fit_em` call this
    reuses that compiled loop: a jitted E-step + M-step of its own was one more program
    (~1 s of compile per test) for the same numbers."""
    fit = ss.fit_em(model, params, y, num_iters=num_iters, tol=1e10, progress=False)
    assert fit.num_iterations == 2
    return fit.params, fit.log_joint[0]


# ---------------------------------------------------------------------------------------
# Hamilton (1989)


def test_hamilton_likelihood_and_regimes_at_published_params():
    """At Hamilton's estimates: the log-likelihood equals statsmodels' to 1e-8 and the
    published -181.26339 to its 5 printed decimals; smoothed and filtered probabilities of
    regime 1 (expansion) equal statsmodels' to 1e-10 and the published (E-views) values to
    their 6 printed decimals (atol 1e-5, as statsmodels' own test)."""
    y = gnp()
    params = hamilton_params()
    res = MarkovAutoregression(y, k_regimes=2, order=4, switching_ar=False).smooth(HAMILTON)
    ours = float(ss.log_prob(HAM_MODEL, params, jnp.asarray(y)))
    np.testing.assert_allclose(ours, res.llf, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ours, HAMILTON_LLF, rtol=0, atol=1e-5)
    post = HAM_MODEL.smoother(params, y)
    filt = HAM_MODEL.filter_states(params, y)
    np.testing.assert_allclose(float(post.marginal_log_lik), res.llf, atol=1e-8)
    np.testing.assert_allclose(float(filt.marginal_log_lik), res.llf, atol=1e-8)
    sm = np.asarray(post.smoothed_probs)
    assert sm.shape == (135, 2)
    np.testing.assert_allclose(sm[4:], res.smoothed_marginal_probabilities, atol=1e-10)
    np.testing.assert_allclose(np.asarray(filt.filtered_probs)[4:],
                               res.filtered_marginal_probabilities, atol=1e-10)
    np.testing.assert_allclose(np.asarray(post.filtered_probs), np.asarray(filt.filtered_probs),
                               atol=1e-12)
    np.testing.assert_allclose(sm[4:, 1], sm_tests.hamilton_ar4_smoothed, atol=1e-5)
    np.testing.assert_allclose(np.asarray(filt.filtered_probs)[4:, 1],
                               sm_tests.hamilton_ar4_filtered, atol=1e-5)
    # the conditioned first 4 steps: smoothed marginals exist (s_0..s_3 are in x_4)
    np.testing.assert_allclose(sm.sum(1), 1.0, atol=1e-12)
    assert 0 < sm[0, 1] < 1
    # Viterbi regimes mostly agree with the smoothed argmax
    path = np.asarray(HAM_MODEL.most_likely_regimes(params, y))
    assert path.shape == (135,) and np.mean(path == sm.argmax(1)) > 0.95


def test_hamilton_mle_by_lbfgs_matches_published_estimates():
    """fit_lbfgs from the data-driven start reaches the published maximum: llf within
    1e-5 of -181.26339 (printed to 5 decimals) and every estimate within 2e-5 of the
    published 6-decimal E-views values (their last digit, plus the optimizers' stopping
    tolerance; the likelihood is flat to 1e-10 over that range)."""
    y = gnp()
    start = HAM_MODEL.initialize(y)
    fit = ss.fit_lbfgs(HAM_MODEL, start, y, progress=False)
    assert fit.converged
    llf = float(ss.log_prob(HAM_MODEL, fit.params, jnp.asarray(y)))
    np.testing.assert_allclose(llf, HAMILTON_LLF, atol=1e-5)
    p = fit.params
    got = np.r_[p.transitions[0, 0], p.transitions[1, 0], p.means, p.variances, p.ar_coeffs]
    np.testing.assert_allclose(got, HAMILTON, atol=2e-5)
    # the MLE is a fixed point of the ECM step: each closed-form block (transitions, means,
    # phi, variance) maximizes given the others, so none moves at a stationary point
    again, lp = ecm_step(HAM_MODEL, fit.params, y, num_iters=300)  # (test_hamilton_mle_by_em's)
    np.testing.assert_allclose(float(lp), llf, rtol=1e-12)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(fit.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_hamilton_mle_by_em():
    """fit_em (ECM) from the same start climbs monotonically to the published maximum
    (llf within 1e-5 of -181.26339, estimates within 2e-4 of E-views': EM's last steps
    are slow, so its stopping point is looser than L-BFGS's)."""
    y = gnp()
    fit = ss.fit_em(HAM_MODEL, HAM_MODEL.initialize(y), y, num_iters=300, tol=1e-10,
                    progress=False)
    trace = fit.log_joint[: fit.num_iterations]
    assert np.all(np.diff(trace) > -1e-10 * np.abs(trace[1:]))
    np.testing.assert_allclose(float(ss.log_prob(HAM_MODEL, fit.params, jnp.asarray(y))),
                               HAMILTON_LLF, atol=1e-5)
    p = fit.params
    got = np.r_[p.transitions[0, 0], p.transitions[1, 0], p.means, p.variances, p.ar_coeffs]
    np.testing.assert_allclose(got, HAMILTON, atol=2e-4)


@pytest.mark.parametrize("model", [
    MarkovSwitchingAR(2, 2, form="intercept", switching_ar=True, switching_variance=True),
    # (an interior maximum: with 3 regimes a transition probability goes to 0 on this
    # series, where the unconstrained L-BFGS cannot converge)
    MarkovSwitchingAR(2, 1, switching_ar=True, switching_variance=True),
])
def test_em_is_monotone_and_reaches_a_stationary_point(model):
    """ECM on the GNP data never decreases the log-likelihood; at the maximum L-BFGS finds
    from EM's end point, one ECM step leaves every parameter in place (1e-4): each
    closed-form block is the exact conditional maximum, so a stationary point is fixed."""
    y = gnp()
    fit = ss.fit_em(model, model.initialize(y), y, num_iters=200, tol=1e-12, progress=False)
    trace = fit.log_joint[: fit.num_iterations]
    assert np.all(np.diff(trace) > -1e-10 * np.abs(trace[1:]))
    polish = ss.fit_lbfgs(model, fit.params, y, progress=False)
    assert polish.converged
    again, _ = ecm_step(model, polish.params, y, num_iters=200)  # (the fit_em above)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(polish.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


# ---------------------------------------------------------------------------------------
# variants against statsmodels


VARIANTS = [
    # (model, statsmodels constructor)
    # switching variance with order 1 only: see test_statsmodels_switching_variance_lag
    (MarkovSwitchingAR(2, 1, switching_variance=True),
     lambda y: MarkovAutoregression(y, k_regimes=2, order=1, switching_ar=False,
                                    switching_variance=True)),
    (MarkovSwitchingAR(2, 2, switching_ar=True),
     lambda y: MarkovAutoregression(y, k_regimes=2, order=2, switching_ar=True)),
    (MarkovSwitchingAR(3, 1, switching_ar=True, switching_variance=True),
     lambda y: MarkovAutoregression(y, k_regimes=3, order=1, switching_ar=True,
                                    switching_variance=True)),
    (MarkovSwitchingAR(2, 2, form="intercept", switching_ar=True, switching_variance=True),
     lambda y: MarkovRegression(y[2:], k_regimes=2, exog=np.column_stack([y[1:-1], y[:-2]]),
                                switching_exog=True, switching_variance=True)),
    (MarkovSwitchingAR(2, 1, form="intercept"),
     lambda y: MarkovRegression(y[1:], k_regimes=2, exog=y[:-1, None], switching_exog=False)),
]


@pytest.mark.parametrize("case", range(len(VARIANTS)))
def test_variants_match_statsmodels(case):
    """Switching variance / switching AR (Hamilton's mean form) against
    MarkovAutoregression, switching intercept against MarkovRegression on the lags, at
    random parameters on the GNP data: log-likelihood to 1e-8, smoothed and filtered
    regime probabilities to 1e-8."""
    model, make = VARIANTS[case]
    y = gnp()
    params = random_params(model, np.random.default_rng(case))
    sm_model = make(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sm_model.smooth(sm_param_vector(sm_model.param_names, params))
    p = model.order
    np.testing.assert_allclose(float(ss.log_prob(model, params, jnp.asarray(y))), res.llf,
                               rtol=0, atol=1e-8)
    post = model.smoother(params, y)
    np.testing.assert_allclose(np.asarray(post.smoothed_probs)[p:],
                               res.smoothed_marginal_probabilities, atol=1e-8)
    np.testing.assert_allclose(np.asarray(post.filtered_probs)[p:],
                               res.filtered_marginal_probabilities, atol=1e-8)


# ---------------------------------------------------------------------------------------
# brute force


def paths_log_joint(model, params, y, paths, variance_lag=0, observed=None):
    """log p(s_{0:T-1}, y_{p:T-1} | y_{0:p-1}) for each regime path (rows of ``paths``), by
    the model equation (with ``variance_lag > 0`` the variance of ``y_t`` is that of
    ``s_{t-variance_lag}``; steps with ``observed[t] = False`` contribute no emission
    term)."""
    k, p = model.num_regimes, model.order
    trans = np.asarray(params.transitions)
    pi = (np.asarray(params.initial_probs) if model.initial == "free"
          else np.asarray(stationary_distribution(params.transitions)))
    mu = np.broadcast_to(np.asarray(params.means), (k,))
    phi = np.asarray(params.ar_coeffs)
    var = np.broadcast_to(np.asarray(params.variances), (k,))
    out = np.log(pi[paths[:, 0]]) + np.sum(np.log(trans[paths[:, :-1], paths[:, 1:]]), axis=1)
    for t in range(p, len(y)):
        if observed is not None and not observed[t]:
            continue
        s = paths[:, t]
        ph = phi[s] if model.switching_ar else np.broadcast_to(phi, (len(s), p))
        if model.form == "mean":
            mean = mu[s] + sum(ph[:, i - 1] * (y[t - i] - mu[paths[:, t - i]])
                               for i in range(1, p + 1))
        else:
            mean = mu[s] + sum(ph[:, i - 1] * y[t - i] for i in range(1, p + 1))
        out = out + stats.norm(mean, np.sqrt(var[paths[:, t - variance_lag]])).logpdf(y[t])
    return out


def enumerate_paths(model, params, y, variance_lag=0):
    paths = np.array(list(itertools.product(range(model.num_regimes), repeat=len(y))))
    return paths, paths_log_joint(model, params, y, paths, variance_lag)


def test_statsmodels_switching_variance_lag():
    """Why the switching-variance comparison with statsmodels uses order 1: for order
    ``p >= 2`` statsmodels' MarkovAutoregression (0.14) reshapes the variances to
    ``(K, 1, 1)`` against residuals of shape ``(K,) * (p + 1) + (T,)``, so the variance of
    ``y_t`` is that of ``s_{t-p+1}`` instead of ``s_t``. Enumeration shows both: ours equals
    the model equation with ``sigma_{s_t}``, statsmodels equals it with ``sigma_{s_{t-1}}``
    (``p = 2``)."""
    model = MarkovSwitchingAR(2, 2, switching_variance=True)
    params = random_params(model, np.random.default_rng(0))
    y = np.random.default_rng(1).normal(size=6)
    sm_model = MarkovAutoregression(y, k_regimes=2, order=2, switching_ar=False,
                                    switching_variance=True)
    sm_llf = sm_model.loglike(sm_param_vector(sm_model.param_names, params))
    ours = float(ss.log_prob(model, params, jnp.asarray(y)))
    np.testing.assert_allclose(ours, logsumexp(enumerate_paths(model, params, y)[1]),
                               rtol=1e-12)
    np.testing.assert_allclose(sm_llf, logsumexp(enumerate_paths(model, params, y, 1)[1]),
                               rtol=1e-10)
    assert abs(ours - sm_llf) > 1e-3


BRUTE = [
    MarkovSwitchingAR(2, 2, switching_ar=True, switching_variance=True, initial="free"),
    MarkovSwitchingAR(3, 1, form="intercept", switching_ar=True, switching_variance=True),
]


@pytest.mark.parametrize("case", range(len(BRUTE)))
def test_brute_force_enumeration(case):
    """log_prob, filtered / smoothed regime probabilities (all steps, the conditioned ones
    included) and the Viterbi path equal exact sums / the max over all K^T regime paths."""
    model = BRUTE[case]
    rng = np.random.default_rng(10 + case)
    params = random_params(model, rng)
    y = rng.normal(size=7) * 1.5
    k, num_steps = model.num_regimes, len(y)
    paths, lj = enumerate_paths(model, params, y)
    total = logsumexp(lj)
    np.testing.assert_allclose(float(ss.log_prob(model, params, jnp.asarray(y))), total,
                               rtol=1e-12)
    post = model.smoother(params, y)
    w = np.exp(lj - total)
    smoothed = np.stack([np.bincount(paths[:, t], w, minlength=k) for t in range(num_steps)])
    np.testing.assert_allclose(np.asarray(post.smoothed_probs), smoothed, atol=1e-12)
    filt = np.asarray(model.filter_states(params, y).filtered_probs)
    for t in range(num_steps):
        # p(s_t | y_{<=t}) from the paths of the truncated series
        _, lj_t = enumerate_paths(model, params, y[: t + 1]) if t < num_steps - 1 else (0, lj)
        sub = np.array(list(itertools.product(range(k), repeat=t + 1)))
        wt = np.exp(lj_t - logsumexp(lj_t))
        np.testing.assert_allclose(filt[t], np.bincount(sub[:, t], wt, minlength=k),
                                   atol=1e-12)
    best = paths[np.argmax(lj)]
    np.testing.assert_array_equal(np.asarray(model.most_likely_regimes(params, y)), best)


@pytest.mark.parametrize("model", [MarkovSwitchingAR(2, 2),
                                   MarkovSwitchingAR(2, 2, form="intercept",
                                                     switching_variance=True),
                                   MarkovSwitchingAR(2, 1, switching_mean=False,
                                                     switching_variance=True)])
def test_forecast_means_exact_by_enumeration(model):
    """forecast_means equals the posterior-weighted mean over every path of past and
    future regimes (future noise has mean zero); for Hamilton's form also the sample mean
    of statseq.forecast within 5 Monte Carlo standard errors."""
    rng = np.random.default_rng(3)
    params = random_params(model, rng)
    y = rng.normal(size=6)
    h, k, p = 3, model.num_regimes, model.order
    paths, lj = enumerate_paths(model, params, y)
    w = np.exp(lj - logsumexp(lj))
    trans = np.asarray(params.transitions)
    mu = np.broadcast_to(np.asarray(params.means), (k,))
    phi = np.asarray(params.ar_coeffs)
    expect = np.zeros(h)
    for path, wp in zip(paths, w, strict=True):
        for fut in itertools.product(range(k), repeat=h):
            full = np.r_[path, fut]
            pf = wp * np.prod(trans[full[len(y) - 1:-1], full[len(y):]])
            vals = list(y)
            for t in range(len(y), len(y) + h):
                s = full[t]
                if model.form == "mean":
                    v = mu[s] + sum(phi[i - 1] * (vals[t - i] - mu[full[t - i]])
                                    for i in range(1, p + 1))
                else:
                    v = mu[s] + sum(phi[i - 1] * vals[t - i] for i in range(1, p + 1))
                vals.append(v)
            expect += pf * np.array(vals[len(y):])
    got = np.asarray(model.forecast_means(params, y, num_steps=h))
    np.testing.assert_allclose(got, expect, rtol=1e-10, atol=1e-12)
    if model.form != "mean" or not model.switching_mean:
        return  # one simulation check is enough (each compiles a sampler)
    fc = ss.forecast(model, params, jnp.asarray(y), num_steps=h, num_samples=4000,
                     key=jax.random.key(0))
    draws = np.asarray(fc.samples)
    se = draws.std(0) / np.sqrt(draws.shape[0])
    assert np.all(np.abs(draws.mean(0) - got) < 5 * se)


# ---------------------------------------------------------------------------------------
# API


def test_batches_masks_save_load_and_errors(tmp_path):
    model = MarkovSwitchingAR(2, 2, switching_variance=True)
    rng = np.random.default_rng(0)
    params = random_params(model, rng)
    y = rng.normal(size=(3, 12))
    one = [float(ss.log_prob(model, params, jnp.asarray(r))) for r in y]
    post = model.smoother(params, y)
    assert post.smoothed_probs.shape == (3, 12, 2)
    np.testing.assert_allclose(np.asarray(post.marginal_log_lik), one, rtol=1e-12)
    # trailing missing steps: the same as the shorter series
    mask = np.ones(12, bool)
    mask[-2:] = False
    np.testing.assert_allclose(float(ss.log_prob(model, params, y[0], mask=mask)),
                               float(ss.log_prob(model, params, y[0, :-2])), rtol=1e-12)
    bad = mask.copy()
    bad[5] = False
    with pytest.raises(ValueError, match="lag"):
        model.smoother(params, y[0], mask=bad)
    path = ss.save(tmp_path / "msar", model, params)
    m2, p2 = ss.load(path)
    assert m2 == model
    np.testing.assert_array_equal(np.asarray(p2.means), np.asarray(params.means))
    with pytest.raises(ValueError, match="form"):
        MarkovSwitchingAR(2, 1, form="level")
    with pytest.raises(ValueError, match="initial"):
        MarkovSwitchingAR(2, 1, initial="fixed")
    with pytest.raises(TypeError, match="switching_ar"):
        MarkovSwitchingAR(2, 1, switching_ar=1)
    with pytest.raises(NotImplementedError, match="switching"):
        MarkovSwitchingAR(2, 1, switching_ar=True).forecast_means(
            random_params(MarkovSwitchingAR(2, 1, switching_ar=True), rng), y[0], num_steps=2)
    assert MarkovSwitchingAR(2, 4).num_expanded_states == 32
    assert MarkovSwitchingAR(2, 4, form="intercept").num_expanded_states == 2


def test_random_starts_and_fit_restarts_reach_hamiltons_optimum():
    """`fit_restarts` covers the Markov-switching AR: random starts draw the transition
    family and the regime means; EM from them reaches Hamilton's (1989) maximum
    log-likelihood -181.26339 (published; statsmodels' TestHamiltonAR4) within 1e-3."""
    y = ss.datasets.load_us_gnp_growth().to_numpy()
    model = ss.MarkovSwitchingAR(num_regimes=2, order=4)
    anti = model.initialize(y, key=jax.random.key(1), method="random",
                            transitions="anti_persistent")
    sticky = model.initialize(y, key=jax.random.key(1), method="random", transitions="sticky")
    assert float(np.mean(np.diag(anti.transitions))) < 0.5
    assert float(np.mean(np.diag(sticky.transitions))) > 0.6
    with pytest.raises(ValueError, match="method"):
        model.initialize(y, key=jax.random.key(1), method="kmeans")
    res = ss.fit_restarts(model, y, key=jax.random.key(0), num_restarts=3, num_iters=300,
                          tol=1e-10)
    assert abs(res.best.final_log_joint - (-181.26339)) < 1e-3


@pytest.mark.parametrize(("kw", "num_timesteps"), [
    (dict(num_regimes=2, order=2), 2), (dict(num_regimes=2, order=1, form="mean"), 23)])
def test_table_filter_equals_the_step_scan(kw, num_timesteps, monkeypatch):
    """`MarkovSwitchingAR.masked_data_filter` (the finite-state filter on the expanded
    chain's emission table, which ``log_prob`` runs on CPU from `TABLE_FILTER_MIN_STEPS`
    steps) gives the `step` scan's per-step log-densities (the first ``p`` and masked steps
    exactly 0), final carry (probabilities, lag window, count) and gradient, also for
    series shorter than the lag window and with masked steps at the end."""
    from statseq.core.recurrence import _scan_one
    from statseq.models.switching import ms_ar

    monkeypatch.setattr(ms_ar, "TABLE_FILTER_MIN_STEPS", 1)
    model = MarkovSwitchingAR(**kw)
    if jax.default_backend() == "cpu":
        assert ms_ar.TABLE_FILTER_MIN_STEPS == 1 and model.masked_data_filter(
            model.default_params(), num_timesteps) is not None
    rng = np.random.default_rng(2)
    params = model.initialize(rng.normal(size=60), key=jax.random.key(4))
    y = rng.normal(size=(2, num_timesteps))
    mask = np.ones(y.shape, bool)
    if num_timesteps > 10:
        mask[1, -3:] = False  # trailing: lags of no observed step
    run = model.masked_data_filter.__func__  # (built for any backend here)
    monkeypatch.setattr(ms_ar, "backend_kind", lambda *a: "cpu")
    table = jax.vmap(lambda p, y_i, m_i: run(model, p, num_timesteps)(y_i, m_i, None),
                     in_axes=(None, 0, 0))

    def reference(p, y_i, m_i):  # the engine's per-step scan
        lps, _, final = _scan_one(model, p, y_i, m_i, jnp.zeros((num_timesteps, 0)),
                                  carry0=model.initial_carry(p), return_carries=False)
        lps = jnp.where(jnp.arange(num_timesteps) >= model.order, lps, 0.0)
        return lps, final

    want = jax.vmap(reference, in_axes=(None, 0, 0))(params, y, mask)
    got = jax.jit(table)(params, y, mask)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-13)
    assert float(jnp.max(jnp.abs(got[0][:, :model.order]))) == 0.0
    for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)
    grad_got = jax.grad(lambda p: table(p, y, mask)[0].sum())(params)
    grad_want = jax.grad(lambda p: jax.vmap(reference, in_axes=(None, 0, 0))(
        p, y, mask)[0].sum())(params)
    for g, w in zip(jax.tree.leaves(grad_got), jax.tree.leaves(grad_want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    assert MarkovSwitchingAR(**kw, gap_capacity=4).masked_data_filter(params, 30) is None
