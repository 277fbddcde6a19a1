"""Marginal PIT of vector non-Gaussian predictives (multivariate Poisson, Bernoulli and
Gaussian-mixture HMMs): `statseq.core.distributions.marginal_cdf` against brute-force
enumeration of the mixture, `ss.pit` against a brute-force forward pass over all state
paths, and uniformity of each coordinate under data simulated from the model."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy import stats

import statseq as ss
from statseq.core.distributions import FiniteMixture, marginal_cdf
from statseq.models.hmm.gaussian_params import GaussianEmissions
from statseq.models.hmm.poisson import PoissonEmissions


def test_marginal_cdf_of_a_bernoulli_mixture_equals_enumerating_every_outcome():
    w = np.array([0.3, 0.7])
    p = np.array([[0.2, 0.9, 0.5], [0.6, 0.1, 0.8]])  # (K, D)
    d = FiniteMixture(dist.Categorical(probs=jnp.asarray(w)),
                      dist.Independent(dist.Bernoulli(probs=jnp.asarray(p)), 1))
    for x in itertools.product([-1.0, 0.0, 1.0], repeat=3):
        # enumerate all 2^3 outcomes y of the mixture: P(Y_j <= x_j) = sum of the joint pmf
        ref = np.zeros(3)
        for y in itertools.product([0, 1], repeat=3):
            joint = sum(w[k] * np.prod(np.where(np.array(y) == 1, p[k], 1 - p[k]))
                        for k in range(2))
            ref += joint * (np.array(y) <= np.array(x))
        np.testing.assert_allclose(marginal_cdf(d, jnp.asarray(x)), ref, atol=1e-14)


def test_marginal_cdf_of_a_poisson_mixture_equals_enumerating_the_joint_pmf():
    w = np.array([0.25, 0.75])
    rates = np.array([[1.5, 6.0], [4.0, 0.5]])
    d = FiniteMixture(dist.Categorical(probs=jnp.asarray(w)),
                      dist.Independent(dist.Poisson(jnp.asarray(rates)), 1))
    grid = np.arange(60)  # the joint pmf beyond 60 is below 1e-40
    joint = sum(w[k] * stats.poisson.pmf(grid[:, None], rates[k, 0])
                * stats.poisson.pmf(grid[None, :], rates[k, 1]) for k in range(2))
    for x in ([0, 0], [2, 7], [5, 1], [-1, 3]):
        ref = [joint[grid <= x[0]].sum(), joint[:, grid <= x[1]].sum()]
        np.testing.assert_allclose(marginal_cdf(d, jnp.asarray(x, float)), ref, rtol=1e-12,
                                   atol=1e-15)


def test_marginal_cdf_refuses_predictives_without_marginals():
    with pytest.raises(ValueError, match="no marginal cdf"):
        marginal_cdf(dist.Multinomial(5, probs=jnp.array([0.2, 0.3, 0.5])),
                     jnp.array([1.0, 2.0, 2.0]))
    with pytest.raises(ValueError, match="event shape"):
        marginal_cdf(dist.Independent(dist.Poisson(jnp.ones((2, 2))), 2), jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="event shape"):
        marginal_cdf(dist.Poisson(2.0), jnp.array(1.0))



def test_marginal_cdf_uses_a_distributions_own_marginal_cdf_method():
    class Product(dist.Independent):  # e.g. a product emission with its own marginals
        def marginal_cdf(self, value):
            return jnp.full(jnp.shape(value), 0.25)

    d = Product(dist.Poisson(jnp.ones(2)), 1)
    np.testing.assert_array_equal(marginal_cdf(d, jnp.array([3.0, 0.0])), [0.25, 0.25])

def _brute_force_predicted(pi, a, lik):
    """``p(z_t = k | y_{<t})`` by summing ``p(z_{1:t}, y_{<t})`` over every state path."""
    k, num_steps = len(pi), lik.shape[0]
    out = []
    for t in range(num_steps):
        w = np.zeros(k)
        for path in itertools.product(range(k), repeat=t + 1):
            prob = pi[path[0]]
            for s in range(1, t + 1):
                prob *= a[path[s - 1], path[s]]
            for s in range(t):
                prob *= lik[s, path[s]]
            w[path[t]] += prob
        out.append(w / w.sum())
    return np.array(out)


def test_poisson_vector_hmm_randomized_marginal_pit_equals_brute_force():
    model = ss.PoissonHMM(num_states=2, emission_dim=2)
    rates = np.array([[1.5, 6.0], [4.0, 0.5]])
    a = np.array([[0.8, 0.2], [0.3, 0.7]])
    params = model.assemble_params(PoissonEmissions(jnp.asarray(rates)),
                                   transitions=jnp.asarray(a))
    y = np.array([[1, 7], [4, 0], [3, 2], [0, 5]])
    mask = np.ones((4, 2), bool)
    mask[2, 1] = False  # one missing coordinate
    pmf = stats.poisson.pmf(y[:, None, :], rates[None])  # (T, K, D)
    lik = np.prod(np.where(mask[:, None, :], pmf, 1.0), axis=-1)
    pred = _brute_force_predicted(np.asarray(model.initial_probs(params)), a, lik)
    hi = np.einsum("tk,tkd->td", pred, stats.poisson.cdf(y[:, None, :], rates[None]))
    lo = np.einsum("tk,tkd->td", pred, stats.poisson.cdf(y[:, None, :] - 1, rates[None]))
    key = jax.random.key(7)
    u = np.asarray(ss.pit(model, params, y, mask=mask, key=key))
    assert u.shape == (4, 2)
    assert np.isnan(u[2, 1]) and np.isfinite(np.delete(u.ravel(), 5)).all()
    v = np.asarray(jax.random.uniform(key, u.shape, u.dtype))  # the documented draws
    np.testing.assert_allclose(u[mask], (lo + v * (hi - lo))[mask], rtol=1e-12)
    r = ss.quantile_residuals(model, params, y, mask=mask, key=key)
    np.testing.assert_allclose(r[mask], stats.norm.ppf(u[mask]), rtol=1e-10)


def test_gaussian_mixture_vector_hmm_marginal_pit_equals_brute_force():
    model = ss.GaussianHMM(num_states=2, emission_dim=2)
    means = np.array([[0.0, 1.0], [2.0, -1.0]])
    covs = np.array([[[1.0, 0.5], [0.5, 2.0]], [[0.5, -0.2], [-0.2, 0.3]]])
    a = np.array([[0.6, 0.4], [0.1, 0.9]])
    params = model.assemble_params(GaussianEmissions(jnp.asarray(means), jnp.asarray(covs)),
                                   transitions=jnp.asarray(a))
    y = np.array([[0.3, 0.2], [1.8, -0.7], [2.5, -1.4], [-0.5, 1.9]])
    lik = np.stack([stats.multivariate_normal(means[k], covs[k]).pdf(y) for k in range(2)], 1)
    pred = _brute_force_predicted(np.asarray(model.initial_probs(params)), a, lik)
    sds = np.sqrt(np.diagonal(covs, axis1=1, axis2=2))  # (K, D) marginal sds
    ref = np.einsum("tk,tkd->td", pred, stats.norm.cdf(y[:, None, :], means[None], sds[None]))
    np.testing.assert_allclose(ss.pit(model, params, y), ref, rtol=1e-10)


def _simulate_hmm(rng, pi, a, num_steps):
    z = [rng.choice(len(pi), p=pi)]
    for _ in range(num_steps - 1):
        z.append(rng.choice(len(pi), p=a[z[-1]]))
    return np.array(z)


def test_each_coordinate_of_the_marginal_pit_is_uniform_under_the_model():
    """KS test per coordinate on 1500 steps simulated in NumPy from the model (fixed seed).

    Within one coordinate the PIT values are i.i.d. U(0, 1) under the model (each is
    U(0, 1) given the whole past, which determines the earlier ones), so the KS test
    applies; across coordinates they are dependent, so the three tests are combined by
    Bonferroni: level 0.01 each, family-wise at most 0.03. A wrong model (rates swapped
    between coordinates) fails the same check by a wide margin (p < 1e-6).
    """
    model = ss.PoissonHMM(num_states=2, emission_dim=3)
    rates = np.array([[1.0, 8.0, 3.0], [6.0, 2.0, 3.5]])
    a = np.array([[0.9, 0.1], [0.2, 0.8]])
    params = model.assemble_params(PoissonEmissions(jnp.asarray(rates)),
                                   transitions=jnp.asarray(a))
    rng = np.random.default_rng(11)
    z = _simulate_hmm(rng, np.asarray(model.initial_probs(params)), a, 1500)
    y = rng.poisson(rates[z])
    u = np.asarray(ss.pit(model, params, y, key=jax.random.key(4)))
    pvalues = [stats.kstest(u[:, j], "uniform").pvalue for j in range(3)]
    assert min(pvalues) > 0.01, pvalues
    # the coordinates of one step are dependent (they share the state): the PIT of the
    # two coordinates whose rates move in opposite directions are negatively correlated
    assert np.corrcoef(u[:, 0], u[:, 1])[0, 1] < -0.2
    wrong = model.assemble_params(PoissonEmissions(jnp.asarray(rates[:, ::-1])),
                                  transitions=jnp.asarray(a))
    u_wrong = np.asarray(ss.pit(model, wrong, y, key=jax.random.key(4)))
    assert min(stats.kstest(u_wrong[:, j], "uniform").pvalue for j in (0, 2)) < 1e-6


def test_gaussian_mixture_marginal_pit_is_uniform_under_the_model():
    """The continuous case (no randomization); KS per coordinate at level 0.01 each."""
    model = ss.GaussianHMM(num_states=2, emission_dim=2)
    means = np.array([[0.0, 1.0], [2.0, -1.0]])
    covs = np.array([[[1.0, 0.5], [0.5, 2.0]], [[0.5, -0.2], [-0.2, 0.3]]])
    a = np.array([[0.7, 0.3], [0.2, 0.8]])
    params = model.assemble_params(GaussianEmissions(jnp.asarray(means), jnp.asarray(covs)),
                                   transitions=jnp.asarray(a))
    rng = np.random.default_rng(3)
    z = _simulate_hmm(rng, np.asarray(model.initial_probs(params)), a, 1500)
    chol = np.linalg.cholesky(covs)
    y = means[z] + np.einsum("tij,tj->ti", chol[z], rng.normal(size=(1500, 2)))
    u = np.asarray(ss.pit(model, params, y))
    assert min(stats.kstest(u[:, j], "uniform").pvalue for j in range(2)) > 0.01
