"""EM with per-entry masks and ties in every HMM family (fixed transition entries, fixed
emission probabilities, tied rates): the EM fixed point against the restricted L-BFGS
optimum on the same problem (float64), the closed-form stationarity conditions of the
constrained M-step, fixed entries bit-equal to their values, tied entries equal, a
non-decreasing trace, and clear errors for restrictions that cannot be represented."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.core.restrict import restrict
from statseq.models.hmm.gaussian import GaussianEmissions
from statseq.models.hmm.poisson import PoissonEmissions


def _all(params, value):
    return jax.tree.map(lambda _: value, params)


def _compare(model, em, lb, y, *, ll_tol=1e-7, par_tol=2e-5):
    trace = em.log_joint[:em.num_iterations]
    assert em.converged
    assert np.diff(trace).min() >= -1e-9 * abs(trace[-1])  # EM monotonicity
    ll_em = float(ss.log_prob(model, em.params, y))
    ll_lb = float(ss.log_prob(model, lb.params, y))
    assert abs(ll_em - ll_lb) < ll_tol
    for a, b in zip(jax.tree.leaves(em.params), jax.tree.leaves(lb.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=par_tol)


def test_gaussian_hmm_with_a_structural_zero_transition_matches_restricted_lbfgs():
    model = ss.GaussianHMM(num_states=3, emission_dim=1)
    a = np.array([[0.9, 0.0, 0.1], [0.05, 0.9, 0.05], [0.1, 0.1, 0.8]])
    truth = model.assemble_params(
        GaussianEmissions(jnp.array([[-2.0], [0.0], [2.0]]),
                          jnp.array([[[1.0]], [[0.5]], [[1.0]]])), jnp.asarray(a))
    y = np.asarray(ss.sample(model, truth, num_timesteps=200, key=jax.random.key(1)))
    start = truth._replace(transitions=jnp.asarray(
        [[0.8, 0.0, 0.2], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]))
    trainable = _all(start, True)._replace(transitions=a > 0)
    em = ss.fit_em(model, start, y, trainable=trainable, num_iters=300, tol=1e-13,
                   progress=False)
    lb = ss.fit_lbfgs(model, start, y, trainable=trainable, num_iters=500, tol=1e-12,
                      progress=False)
    _compare(model, em, lb, y)
    assert float(em.params.transitions[0, 1]) == 0.0  # fixed: bit-equal
    assert em.on_boundary == ("initial_probs",)  # the fixed zero is not reported
    # the constrained M-step's fixed point: the free entries of a row are proportional to
    # their expected transition counts (row 0's free entries share all of its mass)
    post = model.smoother(em.params, y)
    counts = np.asarray(post.expected_transitions)
    np.testing.assert_allclose(np.asarray(em.params.transitions)[0, [0, 2]],
                               counts[0, [0, 2]] / counts[0, [0, 2]].sum(), atol=1e-7)


def test_poisson_hmm_with_tied_rates_matches_restricted_lbfgs_and_the_pooled_mean():
    """Two counts per step whose rates are equal in state 0 (one tie group) and free in
    state 1: EM's tied step is gradient steps on the expected log joint."""
    model = ss.PoissonHMM(num_states=2, emission_dim=2)
    truth = model.assemble_params(PoissonEmissions(jnp.array([[2.0, 2.0], [6.0, 9.0]])),
                                  jnp.array([[0.85, 0.15], [0.2, 0.8]]))
    y = np.asarray(ss.sample(model, truth, num_timesteps=200, key=jax.random.key(2)))
    start = truth._replace(emissions=PoissonEmissions(jnp.array([[1.5, 3.0], [5.0, 7.0]])))
    ties = _all(start, None)._replace(
        emissions=PoissonEmissions(np.array([[0, 0], [-1, -1]])))
    em = ss.fit_em(model, start, y, ties=ties, num_iters=500, tol=1e-13, progress=False)
    lb = ss.fit_lbfgs(model, start, y, ties=ties, num_iters=500, tol=1e-12,
                      progress=False)
    _compare(model, em, lb, y)
    rates = np.asarray(em.params.emissions.rates)
    assert rates[0, 0] == rates[0, 1]  # tied: exactly equal
    # stationarity of the tied rate: the posterior-weighted mean of both counts in state 0,
    # to the precision EM stops at: a change of the log joint below tol = 1e-13 leaves the
    # parameters about sqrt(1e-13) = 3e-7 (relative) from the fixed point (1.2e-7 and
    # 5e-8 measured, one iteration apart, as the smoother's rounding changed)
    w = np.asarray(model.smoother(em.params, y).smoothed_probs)
    np.testing.assert_allclose(rates[0, 0], (w[:, 0] @ y.sum(1)) / (2 * w[:, 0].sum()),
                               rtol=5e-7)
    np.testing.assert_allclose(rates[1], (w[:, 1] @ y) / w[:, 1].sum(), rtol=5e-7)


def test_categorical_hmm_with_fixed_emission_entries_matches_restricted_lbfgs():
    model = ss.CategoricalHMM(num_states=2, num_classes=3)
    b = np.array([[0.7, 0.3, 0.0], [0.1, 0.3, 0.6]])
    truth = model.assemble_params(ss.models.hmm.categorical.CategoricalEmissions(
        jnp.asarray(b)), jnp.array([[0.85, 0.15], [0.2, 0.8]]))
    y = np.asarray(ss.sample(model, truth, num_timesteps=300, key=jax.random.key(3)))
    start = truth._replace(emissions=ss.models.hmm.categorical.CategoricalEmissions(
        jnp.array([[0.5, 0.5, 0.0], [0.1, 0.45, 0.45]])))
    fixed = np.array([[False, False, True], [True, False, False]])  # B[0,2]=0, B[1,0]=0.1
    trainable = _all(start, True)._replace(
        emissions=ss.models.hmm.categorical.CategoricalEmissions(~fixed))
    em = ss.fit_em(model, start, y, trainable=trainable, num_iters=500, tol=1e-13,
                   progress=False)
    lb = ss.fit_lbfgs(model, start, y, trainable=trainable, num_iters=500, tol=1e-12,
                      progress=False)
    _compare(model, em, lb, y)
    probs = np.asarray(em.params.emissions.probs)
    assert probs[0, 2] == 0.0 and probs[1, 0] == 0.1  # bit-equal
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-14)
    # row 1's free entries share 0.9 in proportion to their expected counts
    w = np.asarray(model.smoother(em.params, y).smoothed_probs)
    n = np.stack([w[y == c].sum(0) for c in range(3)], 1)  # (K, C) expected counts
    np.testing.assert_allclose(probs[1, 1:], 0.9 * n[1, 1:] / n[1, 1:].sum(), atol=1e-6)


def test_gaussian_hmm_with_a_fixed_mean_entry_takes_generalized_steps_monotonically():
    """A fixed entry of a diagonal Gaussian's means: the closed form is not the constrained
    maximizer (the variance depends on the mean), so EM adds accepted gradient steps on
    the expected log joint; it still reaches the restricted L-BFGS optimum."""
    model = ss.GaussianHMM(num_states=2, emission_dim=2, covariance="diagonal")
    truth = model.initialize(np.zeros((4, 2)), key=jax.random.key(0))
    truth = truth._replace(transitions=jnp.array([[0.9, 0.1], [0.15, 0.85]]),
                           emissions=truth.emissions._replace(
                               means=jnp.array([[-1.0, 0.5], [1.5, -0.5]]),
                               variances=jnp.array([[1.0, 0.6], [0.8, 1.2]])))
    y = np.asarray(ss.sample(model, truth, num_timesteps=150, key=jax.random.key(4)))
    start = truth._replace(emissions=truth.emissions._replace(
        means=jnp.array([[-0.5, 0.0], [1.0, 0.0]])))
    tr = _all(start, True)._replace(
        initial_probs=False, emissions=_all(start.emissions, True)._replace(
            means=np.array([[True, False], [True, True]])))
    em = ss.fit_em(model, start, y, trainable=tr, num_iters=400, tol=1e-13, progress=False)
    lb = ss.fit_lbfgs(model, start, y, trainable=tr, num_iters=500, tol=1e-12,
                      progress=False)
    _compare(model, em, lb, y, par_tol=1e-4)
    assert float(em.params.emissions.means[0, 1]) == 0.0


def test_entry_restrictions_bad_input():
    model = ss.CategoricalHMM(num_states=2, num_classes=3)
    p = model.assemble_params(ss.models.hmm.categorical.CategoricalEmissions(
        jnp.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])))
    y = np.array([0, 1, 2, 2, 1, 0, 0, 2])
    # the fixed entries of a row leave no mass for its free entries
    bad = p._replace(transitions=jnp.array([[1.0, 0.0], [0.3, 0.7]]))
    tr = _all(p, True)._replace(transitions=np.array([[True, False], [True, True]]))
    tr = tr._replace(transitions=np.array([[False, True], [True, True]]))
    with pytest.raises(ValueError, match="leaving no probability"):
        restrict(model, bad, tr)
    # a row fixed entirely to values that do not sum to 1
    off = jax.tree.map(np.asarray, p)._replace(
        transitions=np.array([[0.8, 0.1], [0.3, 0.7]]))
    with pytest.raises(ValueError, match="not 1"):
        restrict(model, off, _all(p, True)._replace(
            transitions=np.array([[False, False], [True, True]])))
    with pytest.raises(ValueError, match="transitions"):
        ss.fit_em(model, off, y, trainable=_all(p, True)._replace(
            transitions=np.array([[False, False], [True, True]])), progress=False)
    # a simplex row whose free entries are all tied
    ties = _all(p, None)._replace(transitions=np.array([[0, 1], [-1, -1]]))
    with pytest.raises(ValueError, match="every free entry of this simplex row is tied"):
        ss.fit_em(model, p, y, ties=ties, progress=False)
    # ties across different constraints (a mean and a variance)
    g = ss.GaussianHMM(num_states=2, emission_dim=1, covariance="diagonal")
    pg = g.initialize(np.array([[0.0], [1.0], [2.0], [0.5]]), key=jax.random.key(0))
    ties = _all(pg, None)._replace(emissions=pg.emissions._replace(
        means=np.array([[0], [-1]]), variances=np.array([[0], [-1]])))
    with pytest.raises(ValueError, match="different kinds"):
        ss.fit_em(g, pg, np.array([[0.0], [1.0], [2.0], [0.5]]), ties=ties, progress=False)
    # a free entry starting at 0 (EM could never move it)
    zero = p._replace(transitions=jnp.array([[1.0, 0.0], [0.3, 0.7]]))
    with pytest.raises(ValueError, match="boundary"):
        restrict(model, zero, _all(p, True)._replace(
            transitions=np.array([[True, True], [False, True]])))


def test_glm_hmm_with_reference_logits_fixed_at_zero_matches_restricted_lbfgs():
    """Input-driven transitions ``A_t[i] = softmax(b_i + W_i u_t)`` are not identified
    (a constant added to a row's logits cancels); fixing each row's own-state logit at 0
    (a reference category) identifies them. EM's transition step takes gradient steps on
    the free entries only."""
    model = ss.PoissonHMM(num_states=2, input_dim=1)
    eye = np.eye(2, dtype=bool)
    truth = ss.HMMParams(jnp.array([0.6, 0.4]), ss.TransitionRegression(
        jnp.asarray(np.where(eye, 0.0, [[0.0, 1.5], [-1.0, 0.0]])[..., None]),
        jnp.asarray(np.where(eye, 0.0, -2.0))), PoissonEmissions(jnp.array([1.0, 6.0])))
    u = np.random.default_rng(5).normal(size=(150, 1))
    y = np.asarray(ss.sample(model, truth, num_timesteps=150, inputs=u,
                             key=jax.random.key(6)))
    start = truth._replace(transitions=ss.TransitionRegression(
        jnp.zeros((2, 2, 1)), jnp.asarray(np.where(eye, 0.0, -1.0))))
    tr = _all(start, True)._replace(initial_probs=False, transitions=ss.TransitionRegression(
        ~eye[..., None], ~eye))
    em = ss.fit_em(model, start, y, inputs=u, trainable=tr, num_iters=400, tol=1e-13,
                   progress=False)
    lb = ss.fit_lbfgs(model, start, y, inputs=u, trainable=tr, num_iters=500, tol=1e-12,
                      progress=False)
    trace = em.log_joint[:em.num_iterations]
    assert np.diff(trace).min() >= -1e-9 * abs(trace[-1])
    ll_em = float(ss.log_prob(model, em.params, y, inputs=u))
    ll_lb = float(ss.log_prob(model, lb.params, y, inputs=u))
    assert abs(ll_em - ll_lb) < 1e-6
    for a, b in zip(jax.tree.leaves(em.params), jax.tree.leaves(lb.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)
    assert np.all(np.asarray(em.params.transitions.bias)[eye] == 0.0)
    assert np.all(np.asarray(em.params.transitions.weights)[eye] == 0.0)
