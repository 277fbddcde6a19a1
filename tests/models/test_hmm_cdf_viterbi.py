"""HMM predictive cdf/icdf and the Viterbi path's log joint against exact references.

* cdf of one-step and h-step predictive mixtures: the weighted sum of SciPy component
  cdfs with state probabilities from a NumPy forward filter and matrix powers;
* icdf: the smallest integer with ``F(k) >= q`` found by scanning SciPy's cdf (discrete),
  ``F(F^{-1}(q)) = q`` and SciPy's root finder on the mixture cdf (continuous);
* Viterbi: brute-force enumeration of all ``K^T`` state paths.
"""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, stats

import statseq as ss
from statseq.core.distributions import CategoricalWithCdf, FiniteMixture
from statseq.inference.hmm import hmm_path_log_prob, hmm_viterbi
from statseq.models.hmm.bernoulli import BernoulliEmissions
from statseq.models.hmm.categorical import CategoricalEmissions
from statseq.models.hmm.gaussian import GaussianEmissions
from statseq.models.hmm.poisson import PoissonEmissions

A = np.array([[0.8, 0.15, 0.05], [0.1, 0.7, 0.2], [0.25, 0.25, 0.5]])
RATES = np.array([1.5, 6.0, 14.0])
Y = np.array([0, 3, 7, 15, 12, 2, 1, 9])


def _poisson():
    model = ss.PoissonHMM(num_states=3)
    return model, model.assemble_params(PoissonEmissions(jnp.asarray(RATES)),
                                        transitions=jnp.asarray(A))


def _filtered(pi, lik):
    prob = pi
    for t in range(lik.shape[0]):
        pred = prob if t == 0 else prob @ A
        prob = pred * lik[t] / np.sum(pred * lik[t])
    return prob


def test_poisson_h_step_predictive_cdf_is_the_weighted_scipy_cdf():
    model, params = _poisson()
    pi = np.asarray(model.initial_probs(params))
    last = _filtered(pi, stats.poisson.pmf(Y[:, None], RATES[None]))
    d = model.predict_observations(params, Y, num_steps=4)
    assert isinstance(d, FiniteMixture)
    grid = np.arange(0, 30)
    ours = np.asarray(d.cdf(jnp.asarray(grid, float)[:, None]))  # (30, 4)
    for h in range(1, 5):
        w = last @ np.linalg.matrix_power(A, h)
        ref = stats.poisson.cdf(grid[:, None], RATES[None]) @ w
        np.testing.assert_allclose(ours[:, h - 1], ref, rtol=1e-12, atol=1e-14)
    # the quantile is the smallest k with F(k) >= q (exact on the integers)
    q = np.array([0.01, 0.3, 0.5, 0.9, 0.999])
    w1 = last @ A
    expected = [int(np.argmax(stats.poisson.cdf(grid[:, None], RATES[None]) @ w1 >= qi))
                for qi in q]
    np.testing.assert_array_equal(d.icdf(jnp.asarray(q)[:, None])[:, 0], expected)


def test_one_step_predictive_cdf_of_the_filter_carry():
    model, params = _poisson()
    carry = model.initial_carry(params)
    d = model.predict(params, carry, jnp.zeros(0))
    pi = np.asarray(model.initial_probs(params))
    np.testing.assert_allclose(d.cdf(4.0), pi @ stats.poisson.cdf(4, RATES), rtol=1e-12)


def test_gaussian_mixture_icdf_inverts_the_cdf():
    model = ss.GaussianHMM(num_states=2, emission_dim=1)
    em = GaussianEmissions(jnp.array([[-2.0], [3.0]]), jnp.array([[[0.5]], [[2.0]]]))
    params = model.assemble_params(em, transitions=jnp.array([[0.9, 0.1], [0.2, 0.8]]))
    d = model.mixture(jnp.array([0.3, 0.7]), params.emissions)
    x = jnp.linspace(-5.0, 8.0, 7)
    ref = 0.3 * stats.norm.cdf(x, -2.0, np.sqrt(0.5)) + 0.7 * stats.norm.cdf(x, 3.0, np.sqrt(2))
    np.testing.assert_allclose(d.cdf(x), ref, rtol=1e-12)
    q = jnp.array([1e-6, 0.05, 0.3, 0.5, 0.95, 1 - 1e-6])
    quant = np.asarray(d.icdf(q))
    np.testing.assert_allclose(d.cdf(jnp.asarray(quant)), q, rtol=1e-10)

    def f(x, qi):
        return 0.3 * stats.norm.cdf(x, -2.0, np.sqrt(0.5)) + 0.7 * stats.norm.cdf(
            x, 3.0, np.sqrt(2)) - qi

    roots = [optimize.brentq(f, -50, 50, args=(qi,), xtol=1e-14) for qi in np.asarray(q)]
    np.testing.assert_allclose(quant, roots, rtol=1e-9, atol=1e-9)


def test_categorical_and_bernoulli_predictive_cdfs():
    cat = ss.CategoricalHMM(num_states=2, num_classes=4)
    b = jnp.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.25, 0.15, 0.1]])
    d = cat.mixture(jnp.array([0.25, 0.75]), CategoricalEmissions(b))
    assert isinstance(d, CategoricalWithCdf)
    probs = np.array([0.25, 0.75]) @ np.asarray(b)
    np.testing.assert_allclose(d.cdf(jnp.arange(-1.0, 5.0)),
                               np.concatenate([[0.0], np.cumsum(probs), [1.0]]), rtol=1e-12)
    q = jnp.array([0.1, 0.4, 0.5, 0.8, 0.99])
    expected = [int(np.argmax(np.cumsum(probs) >= qi)) for qi in np.asarray(q)]
    np.testing.assert_array_equal(d.icdf(q), expected)
    ber = ss.BernoulliHMM(num_states=2, emission_dim=1)
    db = ber.mixture(jnp.array([0.4, 0.6]), BernoulliEmissions(jnp.array([[0.2], [0.9]])))
    p1 = 0.4 * 0.2 + 0.6 * 0.9
    np.testing.assert_allclose(db.cdf(jnp.array([-0.5, 0.0, 0.5, 1.0])),
                               [0.0, 1 - p1, 1 - p1, 1.0], rtol=1e-12)


def _brute_force(pi, a, ll):
    num_t, k = ll.shape
    best, best_path = -np.inf, None
    for path in itertools.product(range(k), repeat=num_t):
        lp = np.log(pi[path[0]]) + sum(ll[t, s] for t, s in enumerate(path))
        lp += sum(np.log(a[path[t - 1], path[t]]) for t in range(1, num_t))
        if lp > best:
            best, best_path = lp, path
    return best, np.array(best_path)


@pytest.mark.parametrize("masked", [False, True])
def test_viterbi_log_joint_equals_the_best_of_all_paths(masked):
    model, params = _poisson()
    y = Y[:6]
    mask = np.ones(6, bool)
    if masked:
        mask[2] = False
    states, log_joint = model.most_likely_states(params, y, mask=mask, return_log_prob=True)
    ll = stats.poisson.logpmf(y[:, None], RATES[None]) * mask[:, None]
    best, path = _brute_force(np.asarray(model.initial_probs(params)), A, ll)
    np.testing.assert_array_equal(states, path)
    np.testing.assert_allclose(log_joint, best, rtol=1e-12)
    np.testing.assert_array_equal(model.most_likely_states(params, y, mask=mask), states)
    # log p(z* | y) = log p(y, z*) - log p(y) <= 0
    assert float(log_joint - ss.log_prob(model, params, y, mask=mask)) < 0.0


def test_viterbi_log_joint_for_a_batch_and_time_varying_transitions(rng):
    k, num_t = 2, 5
    pi = np.array([0.6, 0.4])
    a_t = rng.dirichlet(np.ones(k), size=(num_t - 1, k))
    ll = rng.normal(size=(num_t, k))
    states = hmm_viterbi(jnp.asarray(pi), jnp.asarray(a_t), jnp.asarray(ll))
    best = -np.inf
    for path in itertools.product(range(k), repeat=num_t):
        lp = np.log(pi[path[0]]) + sum(ll[t, s] for t, s in enumerate(path))
        lp += sum(np.log(a_t[t - 1, path[t - 1], path[t]]) for t in range(1, num_t))
        best = max(best, lp)
    np.testing.assert_allclose(hmm_path_log_prob(pi, a_t, ll, states), best, rtol=1e-12)
    model, params = _poisson()
    batch = np.stack([Y[:5], Y[3:8]])
    states_b, lj_b = model.most_likely_states(params, batch, return_log_prob=True)
    assert states_b.shape == (2, 5) and lj_b.shape == (2,)
    _, lj1 = model.most_likely_states(params, Y[3:8], return_log_prob=True)
    np.testing.assert_allclose(lj_b[1], lj1, rtol=1e-12)
    with pytest.raises(ValueError, match="states must have shape"):
        hmm_path_log_prob(pi, a_t, ll, jnp.zeros(3, int))
