"""Tied and spherical covariances of the Gaussian HMM against hmmlearn, scipy and brute force.

hmmlearn's ``GaussianHMM(covariance_type="tied" / "spherical")`` is the reference for the
score and for EM (MLE, and MAP with our conjugate priors mapped onto hmmlearn's prior
arguments); enumeration of all state paths with scipy densities for the likelihood and the
smoother with per-entry missing values; scipy's inverse-Wishart / inverse-gamma / normal
densities for the priors' ``log_prob``.
"""

from __future__ import annotations

import itertools
import warnings

import hmmlearn.hmm
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy import stats
from scipy.special import logsumexp

import statseq as ss
from statseq.core.validation import prepare_data
from statseq.models.hmm import (
    GaussianHMM,
    HMMParams,
    NormalInverseGamma,
    NormalInverseWishart,
    SphericalGaussianEmissions,
    TiedGaussianEmissions,
)
from statseq.models.hmm.base import _e_step

K, D = 3, 2
MODELS = {cov: GaussianHMM(K, D, covariance=cov, min_variance=0.0)
          for cov in ("tied", "spherical")}


def random_params(cov, rng):
    pi = rng.dirichlet(2 * np.ones(K))
    trans = rng.dirichlet(np.ones(K), size=K) + 2 * np.eye(K)
    trans /= trans.sum(1, keepdims=True)
    means = 3.0 * rng.normal(size=(K, D))
    if cov == "tied":
        a = rng.normal(size=(D, D))
        em = TiedGaussianEmissions(jnp.asarray(means), jnp.asarray(a @ a.T / D + 0.5 * np.eye(D)))
    else:
        em = SphericalGaussianEmissions(jnp.asarray(means), jnp.asarray(rng.uniform(0.5, 2, K)))
    return HMMParams(jnp.asarray(pi), jnp.asarray(trans), em)


def state_cov(cov, em, k):
    if cov == "tied":
        return np.asarray(em.cov)
    return float(em.variances[k]) * np.eye(D)


def simulate(params, rng, num_seq, num_steps):
    cov = "tied" if isinstance(params.emissions, TiedGaussianEmissions) else "spherical"
    y = np.zeros((num_seq, num_steps, D))
    for n in range(num_seq):
        z = rng.choice(K, p=np.asarray(params.initial_probs))
        for t in range(num_steps):
            if t:
                z = rng.choice(K, p=np.asarray(params.transitions)[z])
            y[n, t] = rng.multivariate_normal(np.asarray(params.emissions.means)[z],
                                              state_cov(cov, params.emissions, z))
    return y


def hmmlearn_model(cov, params, **prior_kw):
    kw = dict(means_prior=0.0, means_weight=0.0, covars_prior=0.0, covars_weight=1.0)
    kw.update(prior_kw)
    h = hmmlearn.hmm.GaussianHMM(K, covariance_type=cov, n_iter=1, tol=-np.inf,
                                 init_params="", params="stmc", implementation="log", **kw)
    h.startprob_ = np.asarray(params.initial_probs)
    h.transmat_ = np.asarray(params.transitions)
    h.means_ = np.asarray(params.emissions.means)
    h.covars_ = np.asarray(params.emissions[1])
    return h


@pytest.mark.parametrize("cov", ["tied", "spherical"])
def test_score_matches_hmmlearn_and_brute_force(cov):
    """Same params: log_prob equals hmmlearn's score to 1e-10 (relative); with per-entry
    missing values log_prob and the smoothed marginals equal enumeration of all K^T paths
    with scipy Gaussian marginals of the observed entries (1e-10)."""
    model = MODELS[cov]
    rng = np.random.default_rng(1)
    params = random_params(cov, rng)
    y = simulate(params, rng, 1, 60)[0]
    h = hmmlearn_model(cov, params)
    np.testing.assert_allclose(float(ss.log_prob(model, params, y)), h.score(y), rtol=1e-10)
    # brute force with gaps
    yb = simulate(params, rng, 1, 5)[0]
    mask = np.ones(yb.shape, bool)
    mask[1, 0] = mask[3] = False
    ll = np.zeros((5, K))
    for t, k in itertools.product(range(5), range(K)):
        m = mask[t]
        if m.any():
            c = state_cov(cov, params.emissions, k)
            ll[t, k] = stats.multivariate_normal(
                np.asarray(params.emissions.means)[k][m], c[np.ix_(m, m)]).logpdf(yb[t][m])
    pi, trans = np.asarray(params.initial_probs), np.asarray(params.transitions)
    paths = np.array(list(itertools.product(range(K), repeat=5)))
    lp = (np.log(pi[paths[:, 0]]) + ll[np.arange(5), paths].sum(1)
          + np.log(trans[paths[:, :-1], paths[:, 1:]]).sum(1))
    total = logsumexp(lp)
    np.testing.assert_allclose(float(ss.log_prob(model, params, yb, mask=mask)), total,
                               rtol=1e-10)
    w = np.exp(lp - total)
    marg = np.stack([np.bincount(paths[:, t], w, minlength=K) for t in range(5)])
    post = model.smoother(params, yb, mask=mask)
    np.testing.assert_allclose(np.asarray(post.smoothed_probs), marg, atol=1e-10)


def run_em(model, params, y, mask, priors, num_iters):
    """EM by hand with the E-step and M-step fit_em uses: (trace, params)."""
    data = prepare_data(model, y, mask)
    trace = []
    for _ in range(num_iters):
        st, lp = _e_step(model, params, data.y, data.mask, data.inputs)
        trace.append(float(lp))
        params = model.m_step(params, st, priors, data.inputs)
    return np.array(trace), params


def hmmlearn_em(h, y, num_iters):
    x, lengths = y.reshape(-1, D), [y.shape[1]] * y.shape[0]
    trace = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(num_iters):
            h.fit(x, lengths)
            trace.append(h.monitor_.history[-1])
    return np.array(trace)


def conjugate_priors(cov, rng):
    loc = rng.normal(size=D)
    dirichlet = (dist.Dirichlet(jnp.asarray(1.0 + rng.uniform(size=K))),
                 dist.Dirichlet(jnp.asarray(1.0 + rng.uniform(size=(K, K)))))
    if cov == "tied":
        em = NormalInverseWishart(jnp.asarray(loc), 0.7, 5.0, jnp.asarray(2.0 * np.eye(D)))
    else:
        em = NormalInverseGamma(jnp.asarray(loc), 0.7, 3.0, 2.0)
    return HMMParams(dirichlet[0], dirichlet[1], em)


def hmmlearn_prior_kw(cov, priors):
    """Our conjugate priors as hmmlearn's prior arguments: the M-step formulas coincide
    with covars_weight making the denominators equal (tied: nu + N + K + D + 1 against
    (covars_weight - D) + N; spherical: (beta + sum_d c_d / 2) / (alpha + 1 + D/2 +
    D N_k / 2) against (covars_prior + mean_d c_d) / (covars_weight - 1 + N_k))."""
    p = priors.emissions
    kw = dict(startprob_prior=np.asarray(priors.initial_probs.concentration),
              transmat_prior=np.asarray(priors.transitions.concentration),
              means_prior=np.asarray(p.loc), means_weight=float(np.mean(p.mean_precision)))
    if cov == "tied":
        kw.update(covars_prior=np.asarray(p.scale), covars_weight=float(p.df) + K + 2 * D + 1)
    else:
        alpha, beta = float(p.concentration[0]), float(p.rate[0])
        kw.update(covars_prior=2 * beta / D, covars_weight=(2 * alpha + 2) / D + 2)
    return kw


@pytest.mark.parametrize("cov", ["tied", "spherical"])
def test_em_matches_hmmlearn(cov):
    """EM from the same start (k-means start of our initializer), full data: the MLE
    log-likelihood trace over 12 iterations and the final params equal hmmlearn's
    (rtol 1e-8: the implementations round differently and EM propagates it); the same for
    MAP EM with our NIW / NIG priors mapped onto hmmlearn's prior arguments."""
    model = MODELS[cov]
    rng = np.random.default_rng(2)
    truth = random_params(cov, rng)
    y = simulate(truth, rng, 2, 40)
    start = model.initialize(y, key=jax.random.key(0))
    for priors in (None, conjugate_priors(cov, rng)):
        kw = {} if priors is None else hmmlearn_prior_kw(cov, priors)
        h = hmmlearn_model(cov, start, **kw)
        theirs = hmmlearn_em(h, y, 12)
        ours, got = run_em(model, start, y, np.ones(y.shape, bool), priors, 12)
        if priors is None:
            np.testing.assert_allclose(ours, theirs, rtol=1e-8)
        np.testing.assert_allclose(np.asarray(got.transitions), h.transmat_, rtol=1e-6,
                                   atol=1e-9)
        np.testing.assert_allclose(np.asarray(got.emissions.means), h.means_, rtol=1e-6,
                                   atol=1e-8)
        theirs_cov = h._covars_[:, 0] if cov == "spherical" else h._covars_
        np.testing.assert_allclose(np.asarray(got.emissions[1]), theirs_cov, rtol=1e-6,
                                   atol=1e-8)


@pytest.mark.parametrize("cov", ["tied", "spherical"])
def test_em_with_missing_entries_is_monotone_and_fit_em_runs(cov):
    """Exact EM with per-entry gaps (conditional expectations of the missing entries):
    the log-likelihood never decreases; fit_em (MAP) returns finite params."""
    model = MODELS[cov]
    rng = np.random.default_rng(3)
    truth = random_params(cov, rng)
    y = simulate(truth, rng, 2, 40)
    mask = rng.random(y.shape) > 0.2
    start = model.initialize(y, mask=mask, key=jax.random.key(1), method="random")
    trace, _ = run_em(model, start, y, mask, None, 15)
    assert np.all(np.diff(trace) > -1e-9 * np.abs(trace[1:]))
    res = ss.fit_em(model, start, y, mask=mask, priors=conjugate_priors(cov, rng),
                    num_iters=10, progress=False)
    trace = res.log_joint[: res.num_iterations]
    assert np.all(np.diff(trace) > -1e-9 * np.abs(trace[1:]))
    assert all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree.leaves(res.params))


def test_prior_log_densities_match_scipy():
    """NIW on tied emissions: invwishart(Sigma) + sum_k N(mu_k; loc, Sigma / kappa); NIG on
    spherical emissions: per state invgamma(sigma2_k) + sum_d N(mu_kd; loc_d, sigma2_k /
    kappa) (scipy, 1e-10)."""
    rng = np.random.default_rng(4)
    tied = random_params("tied", rng).emissions
    sph = random_params("spherical", rng).emissions
    loc = rng.normal(size=D)
    psi = np.array([[2.0, 0.3], [0.3, 1.0]])
    niw = NormalInverseWishart(jnp.asarray(loc), 0.7, 5.0, jnp.asarray(psi))
    sigma = np.asarray(tied.cov)
    ref = stats.invwishart(5.0, psi).logpdf(sigma) + sum(
        stats.multivariate_normal(loc, sigma / 0.7).logpdf(m) for m in np.asarray(tied.means))
    np.testing.assert_allclose(float(niw.log_prob(tied)), ref, rtol=1e-10)
    nig = NormalInverseGamma(jnp.asarray(loc), 0.7, 3.0, 2.0)
    var = np.asarray(sph.variances)
    ref = stats.invgamma(3.0, scale=2.0).logpdf(var) + stats.norm(
        loc, np.sqrt(var[:, None] / 0.7)).logpdf(np.asarray(sph.means)).sum(1)
    np.testing.assert_allclose(np.asarray(nig.log_prob(sph)), ref, rtol=1e-10)


def test_save_load_sampling_and_errors(tmp_path):
    rng = np.random.default_rng(5)
    for cov, model in MODELS.items():
        params = random_params(cov, rng)
        m2, p2 = ss.load(ss.save(tmp_path / cov, model, params))
        assert m2 == model and type(p2.emissions) is type(params.emissions)
        np.testing.assert_array_equal(np.asarray(p2.emissions[1]), np.asarray(params.emissions[1]))
        # sampling draws every state's emissions with its covariance: the pooled residual
        # covariance of a long sample (states known from far-apart means) is the model's
        params = params._replace(emissions=params.emissions._replace(
            means=jnp.asarray(20.0 * np.eye(K, D))))
        y = np.asarray(ss.sample(model, params, num_timesteps=3000, key=jax.random.key(0)))
        y = y.reshape(-1, D)
        z = np.argmin(((y[:, None] - np.asarray(params.emissions.means)) ** 2).sum(-1), 1)
        resid = y - np.asarray(params.emissions.means)[z]
        for k in range(K):
            emp, want = np.cov(resid[z == k].T), state_cov(cov, params.emissions, k)
            # standard error of a sample covariance: sqrt((s_ii s_jj + s_ij^2) / n)
            se = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want**2) / np.sum(z == k))
            assert np.all(np.abs(emp - want) < 4 * se), (cov, k, emp, want)
    with pytest.raises(ValueError, match="covariance must be"):
        GaussianHMM(2, 2, covariance="shared")
    bad = NormalInverseWishart(jnp.zeros((K, D)), 1.0, jnp.array([4.0, 5.0, 6.0]), jnp.eye(D))
    with pytest.raises(ValueError, match="one df"):
        MODELS["tied"].validate_em_priors(HMMParams(None, None, bad))
    bad = NormalInverseGamma(jnp.zeros(D), 1.0, jnp.array([2.0, 3.0]), 1.0)
    with pytest.raises(ValueError, match="same for every"):
        MODELS["spherical"].validate_em_priors(HMMParams(None, None, bad))


def test_default_priors_have_the_parameter_shapes():
    """Bayesian defaults: draws have the emission shapes and satisfy the constraints."""
    rng = np.random.default_rng(6)
    y = rng.normal(size=(30, D))
    for model in MODELS.values():
        priors = model.default_priors(y).emissions
        shapes, cons = model.emission_shapes(), model.emission_constraints()
        for prior, shape, con in zip(priors, shapes, cons, strict=True):
            draw = prior.sample(jax.random.key(0))
            assert draw.shape == tuple(shape)
            assert bool(jnp.all(con.check(draw)))


@pytest.mark.parametrize("cov", ["full", "tied"])
def test_log_likelihood_table_factors_once_equal_to_the_per_step_path(cov):
    """`GaussianHMM.log_likelihoods` (each covariance factored once when every entry is
    observed) equals the per-step masked densities of `HMMBase.log_likelihoods`, and with
    a missing entry it is that path."""
    from statseq.models.hmm.base import HMMBase

    model = GaussianHMM(3, 3, covariance=cov)
    rng = np.random.default_rng(4)
    y = jnp.asarray(rng.normal(size=(40, 3)) * 3.0)
    params = model.initialize(y, key=jax.random.key(2))
    table = jax.jit(model.log_likelihoods)
    per_step = jax.jit(lambda p, v, m: HMMBase.log_likelihoods(model, p, v, m))
    for mask in (jnp.ones(40, bool), jnp.ones((40, 3), bool).at[7, 1].set(False)):
        got, want = table(params, y, mask), per_step(params, y, mask)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)
    # the factored path against scipy directly
    covs = np.asarray(model.state_covariances(params.emissions))
    means = np.asarray(params.emissions.means)
    ref = np.stack([stats.multivariate_normal(means[k], covs[k]).logpdf(np.asarray(y))
                    for k in range(3)], axis=1)
    np.testing.assert_allclose(np.asarray(table(params, y, jnp.ones(40, bool))), ref,
                               rtol=1e-12)
