"""Tied entries of simplex leaves (transition rows): the restricted maximum likelihood
estimate of fit_em and fit_lbfgs against a brute-force scipy maximization of an
independent NumPy forward algorithm, the EM solver against closed forms on complete-data
counts, and the map of `statseq.core.restrict` (bijection, Jacobian)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import optimize, special, stats

import statseq as ss
from statseq.core.restrict import (
    _last_free,
    restrict,
    simplex_block,
    simplex_expand,
    simplex_log_jacobian,
)
from statseq.fit._tied_simplex import tied_simplex_mle


def _none(p):
    return jax.tree.map(lambda _: None, p)


def _symmetric_hmm(num_t=300):
    """A 2-state Gaussian HMM with one switching probability (A[0,1] = A[1,0] = 0.1)."""
    model = ss.GaussianHMM(num_states=2, emission_dim=1)
    truth = model.initialize(np.zeros((5, 1)), key=jax.random.key(0))._replace(
        initial_probs=jnp.array([0.5, 0.5]),
        transitions=jnp.array([[0.9, 0.1], [0.1, 0.9]]))
    truth = truth._replace(emissions=truth.emissions._replace(
        means=jnp.array([[-1.0], [1.5]]), covs=jnp.array([[[1.0]], [[0.5]]])))
    y = np.asarray(ss.sample(model, truth, num_timesteps=num_t, key=jax.random.key(3)))
    start = truth._replace(transitions=jnp.array([[0.8, 0.2], [0.35, 0.65]]))
    start = start._replace(emissions=start.emissions._replace(
        means=jnp.array([[-0.5], [1.0]]), covs=jnp.array([[[1.5]], [[1.5]]])))
    trainable = jax.tree.map(lambda _: True, truth)._replace(initial_probs=False)
    ties = _none(truth)._replace(transitions=np.array([[-1, 0], [0, -1]]))
    return model, start, y, trainable, ties


def _forward_loglik(x, y):
    """Exact log-likelihood by the scaled forward algorithm in NumPy (initial law (1/2,
    1/2); Rabiner 1989, eqs. 91-93)."""
    p = special.expit(x[0])
    a = np.array([[1 - p, p], [p, 1 - p]])
    logb = stats.norm.logpdf(y[:, :1], loc=x[1:3], scale=np.exp(0.5 * x[3:5]))
    shift = logb.max(axis=1, keepdims=True)
    b = np.exp(logb - shift)
    alpha, total = 0.5 * b[0], float(shift.sum())
    for t in range(1, len(y)):
        c = alpha.sum()
        total += np.log(c)
        alpha = (alpha / c) @ a * b[t]
    return total + np.log(alpha.sum())


@pytest.fixture(scope="module")
def problem():
    """The problem and its restricted L-BFGS fit, shared by the tests that need them (the
    fit's program is cached, but its run is not)."""
    model, start, y, trainable, ties = _symmetric_hmm()
    lb = ss.fit_lbfgs(model, start, y, trainable=trainable, ties=ties, progress=False)
    return model, start, y, trainable, ties, lb


@pytest.fixture(scope="module")
def brute_force(problem):
    model, start, y, _, _, _ = problem
    x0 = np.array([special.logit(0.2), -0.5, 1.0, 0.0, 0.0])
    res = optimize.minimize(lambda x: -_forward_loglik(x, y), x0, method="BFGS",
                            options={"gtol": 1e-7})
    assert np.max(np.abs(res.jac)) < 1e-4
    return res


def test_em_and_lbfgs_reach_the_brute_force_restricted_mle(problem, brute_force):
    model, start, y, trainable, ties, lb = problem
    ref_ll = -brute_force.fun
    ref_p = special.expit(brute_force.x[0])
    em = ss.fit_em(model, start, y, trainable=trainable, ties=ties, num_iters=500,
                   tol=1e-13, progress=False)
    for fit in (em, lb):
        a = np.asarray(fit.params.transitions)
        assert a[0, 1] == a[1, 0]  # tied: exactly equal
        np.testing.assert_allclose(a.sum(1), 1.0, atol=1e-14)
        ll = float(ss.log_prob(model, fit.params, y))
        # measured: |d log lik| ~ 2e-12, |d p| <= 2e-8, |d means| <= 1.3e-7
        assert abs(ll - ref_ll) < 1e-8, (fit.method, ll, ref_ll)
        np.testing.assert_allclose(a[0, 1], ref_p, atol=1e-6)
        np.testing.assert_allclose(np.ravel(fit.params.emissions.means),
                                   brute_force.x[1:3], atol=1e-6)
    trace = em.log_joint[:em.num_iterations]
    assert np.diff(trace).min() > -1e-9  # monotone on every iteration
    assert np.array_equal(em.params.initial_probs, start.initial_probs)


def test_standard_errors_of_a_tied_switching_probability_match_finite_differences(problem):
    """The observed-information standard error of ``p`` (restricted to the tie) against a
    central finite-difference Hessian of the NumPy forward algorithm in the natural
    parameters ``(p, mu_0, mu_1, var_0, var_1)``."""
    model, start, y, trainable, ties, lb = problem
    se = ss.standard_errors(model, lb.params, y, trainable=trainable, ties=ties)
    a, em = np.asarray(lb.params.transitions), lb.params.emissions
    theta = np.array([a[0, 1], *np.ravel(em.means), *np.ravel(em.covs)])

    def loglik(th):
        return _forward_loglik(np.array([special.logit(th[0]), th[1], th[2],
                                         np.log(th[3]), np.log(th[4])]), y)

    h = 1e-4 * np.maximum(np.abs(theta), 0.1)
    hess = np.zeros((5, 5))
    for i in range(5):
        for j in range(5):
            ei, ej = np.eye(5)[i] * h[i], np.eye(5)[j] * h[j]
            hess[i, j] = (loglik(theta + ei + ej) - loglik(theta + ei - ej)
                          - loglik(theta - ei + ej) + loglik(theta - ei - ej)) / (4 * h[i] * h[j])
    ref = np.sqrt(np.diag(np.linalg.inv(-hess)))
    s = np.asarray(se.transitions)
    assert s[0, 1] == s[1, 0] == s[0, 0] == s[1, 1]  # one free scalar sets the whole matrix
    np.testing.assert_allclose(s[0, 1], ref[0], rtol=1e-3)
    np.testing.assert_allclose(np.ravel(se.emissions.means), ref[1:3], rtol=1e-3)


def test_sgd_keeps_tied_simplex_entries_equal(problem):
    model, start, y, trainable, ties, _ = problem
    fit = ss.fit_sgd(model, start, y, trainable=trainable, ties=ties, num_steps=30,
                     optimizer=optax.adam(0.05), key=jax.random.key(0), progress=False)
    a = np.asarray(fit.params.transitions)
    assert a[0, 1] == a[1, 0]
    np.testing.assert_allclose(a.sum(1), 1.0, atol=1e-14)
    assert fit.log_joint[fit.num_iterations - 1] > fit.log_joint[0]


def test_tied_simplex_mle_closed_forms_on_complete_data_counts():
    rng = np.random.default_rng(0)
    # symmetric 2-state chain: p = (N01 + N10) / sum(N)
    counts = rng.integers(1, 50, (2, 2)).astype(float)
    lab = np.array([[-1, 0], [0, -1]])
    a0 = np.array([[0.6, 0.4], [0.3, 0.7]])
    arrs, _ = simplex_block("transitions", a0, np.ones((2, 2), bool), lab)
    out = np.asarray(tied_simplex_mle(jnp.asarray(counts), jnp.asarray(a0), arrs))
    p = (counts[0, 1] + counts[1, 0]) / counts.sum()
    np.testing.assert_allclose(out, [[1 - p, p], [p, 1 - p]], rtol=1e-12)
    # 3 states, every off-diagonal entry equal: t = N_off / (2 sum(N))
    counts = rng.integers(1, 50, (3, 3)).astype(float)
    lab = np.where(np.eye(3, dtype=bool), -1, 0)
    a0 = np.full((3, 3), 0.2) + 0.4 * np.eye(3)
    arrs, _ = simplex_block("transitions", a0, np.ones((3, 3), bool), lab)
    out = np.asarray(tied_simplex_mle(jnp.asarray(counts), jnp.asarray(a0), arrs))
    t = counts[~np.eye(3, dtype=bool)].sum() / (2 * counts.sum())
    np.testing.assert_allclose(out, np.where(np.eye(3, dtype=bool), 1 - 2 * t, t),
                               rtol=1e-12)
    # an initial law (one row) with two equal entries: t = N_t / (2 (N_t + N_rest))
    counts = np.array([7.0, 3.0, 11.0])
    a0 = np.array([0.2, 0.2, 0.6])
    arrs, _ = simplex_block("initial_probs", a0, np.ones(3, bool), np.array([0, 0, -1]))
    out = np.asarray(tied_simplex_mle(jnp.asarray(counts), jnp.asarray(a0), arrs))
    t = 10.0 / (2 * 21.0)
    np.testing.assert_allclose(out, [t, t, 1 - 2 * t], rtol=1e-12)
    # equal stay probabilities, a structural zero and a free untied pair: against scipy
    # (SLSQP on the probabilities with the constraints written out)
    counts = rng.integers(1, 50, (3, 3)).astype(float)
    mask = np.array([[True, True, True], [False, True, True], [True, True, True]])
    a0 = np.array([[0.5, 0.25, 0.25], [0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    lab = np.array([[0, -1, -1], [-1, 0, -1], [-1, -1, 0]])
    arrs, _ = simplex_block("transitions", a0, mask, lab)
    out = np.asarray(tied_simplex_mle(jnp.asarray(counts), jnp.asarray(a0), arrs))

    def full(x):  # x = (s, a01, a20)
        s, a01, a20 = x
        return np.array([[s, a01, 1 - s - a01], [0.0, s, 1 - s], [a20, 1 - s - a20, s]])

    def neg(x):
        a = full(x)
        return -np.sum(np.where(a > 0, counts * np.log(np.where(a > 0, a, 1.0)), 0.0))

    cons = [{"type": "ineq", "fun": lambda x: full(x)[mask] - 1e-9}]
    ref = optimize.minimize(neg, [0.4, 0.3, 0.3], constraints=cons, method="SLSQP",
                            options={"ftol": 1e-14, "maxiter": 500})
    np.testing.assert_allclose(out, full(ref.x), atol=1e-6)
    assert -neg(ref.x) <= np.sum(counts[mask] * np.log(out[mask])) + 1e-9


def _free_values(arrs, z):
    """The tie values and the free untied entries but each row's last, at ``z``."""
    free, slot = np.asarray(arrs[2]), np.asarray(arrs[4])
    last = np.asarray(_last_free(jnp.asarray(free)))
    full = simplex_expand(z, arrs)
    firsts = [full[tuple(np.argwhere(slot == k)[0])] for k in range(int(slot.max()) + 1)]
    return jnp.concatenate([full[free & ~last], jnp.stack(firsts)])


def test_simplex_tie_map_is_a_bijection_with_the_stated_jacobian():
    a = np.array([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5]])
    lab = np.array([[-1, 0, 1], [1, -1, 0], [0, 2, -1]])
    mask = np.ones((3, 3), bool)
    arrs, z0 = simplex_block("transitions", a, mask, lab)
    model = ss.CategoricalHMM(num_states=3, num_classes=2)
    p = model.initialize(np.array([0, 1, 1, 0]), key=jax.random.key(0))
    for seed in range(2):
        z = jax.random.normal(jax.random.key(seed), z0.shape, jnp.float64) * 2
        out = np.asarray(simplex_expand(z, arrs))
        np.testing.assert_allclose(out.sum(1), 1.0, atol=1e-14)
        assert (out > 0).all()
        assert out[0, 1] == out[1, 2] == out[2, 0] and out[0, 2] == out[1, 0]
        jac = np.asarray(jax.jacfwd(partial(_free_values, arrs))(z))
        np.testing.assert_allclose(float(simplex_log_jacobian(z, arrs)),
                                   np.linalg.slogdet(jac)[1], atol=1e-10)
        # the restriction's contract inverts expand
        p = p._replace(transitions=jnp.asarray(out))
        res, _ = restrict(model, p, None, _none(p)._replace(transitions=lab))
        np.testing.assert_allclose(res.expand(model, res.contract(model, p)).transitions,
                                   out, atol=1e-14)


def test_simplex_tie_errors():
    model = ss.CategoricalHMM(num_states=2, num_classes=2)
    p = model.initialize(np.array([0, 1, 1, 0]), key=jax.random.key(0))
    # a row whose free entries are all tied is determined by the others
    with pytest.raises(ValueError, match="every free entry of this simplex row is tied"):
        restrict(model, p, None, _none(p)._replace(transitions=np.array([[0, 1], [-1, -1]])))
    # a simplex tie label may not join another leaf
    with pytest.raises(ValueError, match="simplex ties stay within one leaf"):
        restrict(model, p, None, _none(p)._replace(initial_probs=np.array([0, -1]),
                                                  transitions=np.array([[0, -1], [-1, -1]])))
