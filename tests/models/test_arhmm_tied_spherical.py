"""Tied and spherical noise covariances of the linear autoregressive HMM.

References: enumeration of all state paths with scipy Gaussian densities (likelihood,
smoother, trailing gaps), and one EM step computed independently in NumPy from the exact
posterior weights of that enumeration (weighted least squares per state, then the pooled /
spherical residual covariance).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

import statseq as ss
from statseq.core.validation import prepare_data
from statseq.models.hmm import HMMParams, LinearAutoregressiveHMM
from statseq.models.hmm.autoregressive import SphericalARHMMEmissions, TiedARHMMEmissions
from statseq.models.hmm.base import _e_step

K, D, L, T = 2, 2, 1, 6
MODELS = {cov: LinearAutoregressiveHMM(K, D, num_lags=L, covariance=cov, min_variance=0.0)
          for cov in ("tied", "spherical")}


def random_params(cov, rng):
    pi = rng.dirichlet(2 * np.ones(K))
    trans = rng.dirichlet(np.ones(K), size=K) + 2 * np.eye(K)
    trans /= trans.sum(1, keepdims=True)
    weights = 0.4 * rng.normal(size=(K, D, D * L))
    biases = 2.0 * rng.normal(size=(K, D))
    if cov == "tied":
        a = rng.normal(size=(D, D))
        noise = a @ a.T / D + 0.5 * np.eye(D)
        em = TiedARHMMEmissions(jnp.asarray(weights), jnp.asarray(biases), jnp.asarray(noise))
    else:
        em = SphericalARHMMEmissions(jnp.asarray(weights), jnp.asarray(biases),
                                     jnp.asarray(rng.uniform(0.5, 2.0, K)))
    return HMMParams(jnp.asarray(pi), jnp.asarray(trans), em)


def noise_cov(cov, em, k):
    return np.asarray(em.cov) if cov == "tied" else float(em.variances[k]) * np.eye(D)


def enumerate_posterior(cov, params, y, mask):
    """log p(y_{L:} | y_{:L}) and p(z_t | y) by enumeration with scipy densities."""
    em = params.emissions
    ll = np.zeros((len(y), K))
    for t, k in itertools.product(range(L, len(y)), range(K)):
        m = mask[t]
        if m.any():
            mean = np.asarray(em.weights)[k] @ y[t - 1] + np.asarray(em.biases)[k]
            c = noise_cov(cov, em, k)
            ll[t, k] = stats.multivariate_normal(mean[m], c[np.ix_(m, m)]).logpdf(y[t][m])
    pi, trans = np.asarray(params.initial_probs), np.asarray(params.transitions)
    paths = np.array(list(itertools.product(range(K), repeat=len(y))))
    lp = (np.log(pi[paths[:, 0]]) + ll[np.arange(len(y)), paths].sum(1)
          + np.log(trans[paths[:, :-1], paths[:, 1:]]).sum(1))
    total = logsumexp(lp)
    w = np.exp(lp - total)
    return total, np.stack([np.bincount(paths[:, t], w, minlength=K) for t in range(len(y))])


@pytest.mark.parametrize("cov", ["tied", "spherical"])
def test_likelihood_and_smoother_match_enumeration(cov):
    """log_prob and smoothed probabilities equal enumeration (1e-10), with a partly
    observed last step (nobody's lag)."""
    model = MODELS[cov]
    rng = np.random.default_rng(0)
    params = random_params(cov, rng)
    y = rng.normal(size=(T, D))
    mask = np.ones(y.shape, bool)
    mask[-1, 0] = False
    total, marg = enumerate_posterior(cov, params, y, mask)
    np.testing.assert_allclose(float(ss.log_prob(model, params, y, mask=mask)), total,
                               rtol=1e-10)
    post = model.smoother(params, y, mask=mask)
    np.testing.assert_allclose(np.asarray(post.smoothed_probs), marg, atol=1e-10)


@pytest.mark.parametrize("cov", ["tied", "spherical"])
def test_em_step_matches_weighted_least_squares(cov):
    """One EM step equals the closed form computed in NumPy from the enumerated posterior:
    per state WLS of y_t on [y_{t-1}, 1] with weights p(z_t = k | y), then
    Sigma = sum_k sum_t w_tk r r^T / sum w (tied) or tr(S_k) / (D w_k) (spherical)."""
    model = MODELS[cov]
    rng = np.random.default_rng(1)
    params = random_params(cov, rng)
    y = rng.normal(size=(T, D))
    mask = np.ones(y.shape, bool)
    _, marg = enumerate_posterior(cov, params, y, mask)
    phi = np.concatenate([y[:-1], np.ones((T - 1, 1))], axis=1)  # regressors of t = 1..T-1
    target, w = y[1:], marg[1:]
    thetas, scatters = [], []
    for k in range(K):
        wk = w[:, k]
        theta = np.linalg.solve(phi.T @ (wk[:, None] * phi), phi.T @ (wk[:, None] * target)).T
        r = target - phi @ theta.T
        thetas.append(theta)
        scatters.append((wk[:, None] * r).T @ r)
    data = prepare_data(model, y, mask)
    st, _ = _e_step(model, params, data.y, data.mask, data.inputs)
    new = model.m_step(params, st, None, data.inputs).emissions
    thetas = np.array(thetas)
    np.testing.assert_allclose(np.asarray(new.weights), thetas[..., :-1], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(np.asarray(new.biases), thetas[..., -1], rtol=1e-9, atol=1e-10)
    if cov == "tied":
        np.testing.assert_allclose(np.asarray(new.cov), sum(scatters) / w.sum(), rtol=1e-9)
    else:
        want = [np.trace(s) / (D * w[:, k].sum()) for k, s in enumerate(scatters)]
        np.testing.assert_allclose(np.asarray(new.variances), want, rtol=1e-9)


@pytest.mark.parametrize("cov", ["tied", "spherical"])
def test_fit_em_is_monotone_and_saves(cov, tmp_path):
    model = LinearAutoregressiveHMM(K, D, num_lags=2, covariance=cov)
    rng = np.random.default_rng(2)
    y = np.cumsum(rng.normal(size=(2, 50, D)), axis=1) * 0.3
    start = model.initialize(y, key=jax.random.key(0))
    assert start.emissions[2].shape == ((D, D) if cov == "tied" else (K,))
    res = ss.fit_em(model, start, y, num_iters=15, progress=False)
    trace = res.log_joint[: res.num_iterations]
    assert np.all(np.diff(trace) > -1e-9 * np.abs(trace[1:]))
    m2, p2 = ss.load(ss.save(tmp_path / cov, model, res.params))
    assert m2 == model
    np.testing.assert_array_equal(np.asarray(p2.emissions[2]), np.asarray(res.params.emissions[2]))
    draws = ss.sample(model, res.params, num_timesteps=8, key=jax.random.key(1))
    assert draws.shape == (8, D) and np.all(np.isfinite(np.asarray(draws)))
    with pytest.raises(ValueError, match="covariance must be"):
        LinearAutoregressiveHMM(K, D, covariance="diagonal")
