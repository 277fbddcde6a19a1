"""Variational EM (structured mean field) for `SwitchingLDS`: the ELBO never decreases, lies
below the exact log-likelihood (enumerated over regime paths), and with one regime the
iteration is the linear Gaussian model's EM."""

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.inference import kalman
from statseq.inference import switching_gibbs as gibbs

T_SHORT = 8
NUM_ITERS = 12


@pytest.fixture(scope="module")
def k2():
    """K = 2, n = 2, D = 2 with switching emissions, a batch of 3 sequences with gaps
    (whole steps and single entries)."""
    model = ss.SwitchingLDS(num_regimes=2, state_dim=2, emission_dim=2)
    p = model.default_params()
    p = p._replace(dynamics_weights=jnp.array([[[0.9, 0.2], [0.0, 0.7]],
                                               [[-0.5, 0.0], [0.3, 0.4]]]),
                   emission_bias=jnp.array([[0.0, 0.0], [1.0, -1.0]]),
                   dynamics_cov=jnp.stack([0.2 * jnp.eye(2), 0.5 * jnp.eye(2)]))
    y = jnp.asarray(_simulate(np.random.default_rng(1), p, T_SHORT, 3))
    mask = np.ones(y.shape, bool)
    mask[0, 3] = False          # a whole step missing
    mask[1, 5, 0] = False       # one entry missing
    mask[2, 0, 1] = False
    return model, p, y, jnp.asarray(mask)


def _simulate(rng, p, num_t, num_seq):
    """``(num_seq, num_t, D)`` draws of a `SwitchingLDS` in NumPy (no compile)."""
    p = jax.tree.map(np.asarray, p)
    k, n = p.initial_means.shape
    out = []
    for _ in range(num_seq):
        z = rng.choice(k, p=p.initial_probs)
        x = rng.multivariate_normal(p.initial_means[z], p.initial_covs[z])
        ys = []
        for t in range(num_t):
            if t:
                z = rng.choice(k, p=p.transitions[z])
                x = rng.multivariate_normal(p.dynamics_weights[z] @ x + p.dynamics_bias[z],
                                            p.dynamics_cov[z])
            ys.append(rng.multivariate_normal(p.emission_weights[z] @ x + p.emission_bias[z],
                                              p.emission_cov[z]))
        out.append(ys)
    return np.asarray(out)


def _starts(model, p, seeds):
    out = []
    for s in seeds:
        k1, k2_, k3 = jax.random.split(jax.random.key(s), 3)
        out.append(p._replace(
            dynamics_weights=p.dynamics_weights + 0.3 * jax.random.normal(k1, (2, 2, 2)),
            emission_weights=p.emission_weights + 0.3 * jax.random.normal(k2_, (2, 2, 2)),
            transitions=jax.nn.softmax(jnp.log(p.transitions)
                                       + jax.random.normal(k3, (2, 2)), -1)))
    return out


def _exact_log_lik(model, params, y, mask):
    """log p(y) summed over the batch, by enumerating all K^T regime paths."""
    return float(_enumerated(model, params, y, mask))


@partial(jax.jit, static_argnums=0)
def _enumerated(model, params, y, mask):
    arrays = model.to_arrays(params)
    k = model.num_regimes
    paths = jnp.asarray(list(itertools.product(range(k), repeat=y.shape[1])))
    log_pi, log_p = jnp.log(arrays.initial_probs), jnp.log(arrays.transition_matrix)

    def seq(y_s, m_s):
        def one(path):
            prior = log_pi[path[0]] + jnp.sum(log_p[path[:-1], path[1:]])
            ll = kalman.kalman_log_prob(gibbs.path_arrays(arrays, path), y_s, m_s,
                                        jnp.zeros((y_s.shape[0], 0)))
            return prior + ll
        return jax.scipy.special.logsumexp(jax.vmap(one)(paths))

    return jnp.sum(jax.vmap(seq)(y, mask))


@pytest.fixture(scope="module")
def k2_fits(k2):
    model, p, y, mask = k2
    starts = _starts(model, p, (0, 1, 2))
    return [(s, model.fit_vem(s, y, mask=mask, num_iters=NUM_ITERS, tol=None))
            for s in starts]


def test_elbo_never_decreases(k2_fits):
    for _, fit in k2_fits:
        assert fit.stopped == "max_iters" and fit.num_iterations == NUM_ITERS
        e = fit.elbo
        assert np.all(np.isfinite(e))
        assert np.all(np.diff(e) >= -1e-8 * np.abs(e[1:])), np.diff(e)
        assert e[-1] > e[0] + 1e-3  # it does move


def test_elbo_below_exact_log_likelihood(k2, k2_fits):
    model, _, y, mask = k2
    for start, fit in k2_fits:
        exact0 = _exact_log_lik(model, start, y, mask)
        assert fit.elbo[0] <= exact0 + 1e-9
        # the bound is not trivially loose either
        assert fit.elbo[0] > exact0 - 10.0
    # the fitted parameters raised the exact likelihood
    start, fit = k2_fits[0]
    assert _exact_log_lik(model, fit.params, y, mask) > _exact_log_lik(model, start, y, mask)


def test_posterior_outputs(k2, k2_fits):
    _, _, y, _ = k2
    fit = k2_fits[0][1]
    assert fit.regime_probs.shape == (3, T_SHORT, 2)
    np.testing.assert_allclose(fit.regime_probs.sum(-1), 1.0, atol=1e-12)
    assert fit.state_means.shape == (3, T_SHORT, 2)
    assert fit.state_covs.shape == (3, T_SHORT, 2, 2)
    p = fit.params
    np.testing.assert_allclose(p.transitions.sum(-1), 1.0, atol=1e-12)
    assert np.all(np.linalg.eigvalsh(np.asarray(p.dynamics_cov)) > 0)


def test_one_regime_equals_lgssm_em():
    """With K = 1, q(x) is the exact posterior: the ELBO trace is the LGSSM's EM
    log-likelihood trace and the parameters follow the same path (missing entries too)."""
    n, d, t_len, iters = 2, 2, 20, 6
    lg = ss.LinearGaussianSSM(state_dim=n, emission_dim=d)
    lp = lg.default_params()
    lp = lp._replace(dynamics_weights=jnp.array([[0.8, 0.1], [-0.2, 0.6]]),
                     dynamics_cov=jnp.array([[0.3, 0.05], [0.05, 0.2]]),
                     emission_cov=jnp.array([[0.2, 0.0], [0.0, 0.4]]),
                     emission_bias=jnp.array([0.5, -0.3]))
    model = ss.SwitchingLDS(num_regimes=1, state_dim=n, emission_dim=d)
    sp = model.default_params()._replace(
        initial_means=lp.initial_mean[None], initial_covs=lp.initial_cov[None],
        dynamics_weights=lp.dynamics_weights[None],
        dynamics_bias=lp.dynamics_bias[None], dynamics_cov=lp.dynamics_cov[None],
        emission_weights=lp.emission_weights[None], emission_bias=lp.emission_bias[None],
        emission_cov=lp.emission_cov[None])
    y = jnp.asarray(_simulate(np.random.default_rng(3), sp, t_len, 2))
    mask = np.ones(y.shape, bool)
    mask[0, 4] = False
    mask[1, 7, 1] = False
    mask = jnp.asarray(mask)
    em = ss.fit_em(lg, lp, y, mask=mask, num_iters=iters, tol=None, progress=False)
    fit = model.fit_vem(sp, y, mask=mask, num_iters=iters, tol=None)
    np.testing.assert_allclose(fit.elbo, em.log_joint[:iters], rtol=1e-9)
    # (em.log_joint[0] is the exact log-likelihood at the start: so is the ELBO)
    for a, b in [(fit.params.dynamics_weights[0], em.params.dynamics_weights),
                 (fit.params.dynamics_cov[0], em.params.dynamics_cov),
                 (fit.params.emission_weights[0], em.params.emission_weights),
                 (fit.params.emission_bias[0], em.params.emission_bias),
                 (fit.params.emission_cov[0], em.params.emission_cov),
                 (fit.params.initial_means[0], em.params.initial_mean),
                 (fit.params.initial_covs[0], em.params.initial_cov)]:
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)


def test_bad_input():
    model = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None)
    p = model.default_params()
    y = jnp.zeros(5)
    with pytest.raises(ValueError, match="positive definite"):
        model.fit_vem(p._replace(dynamics_cov=jnp.zeros((2, 1, 1))), y, num_iters=2)
    with pytest.raises(ValueError, match="at least 2 time steps"):
        model.fit_vem(p, jnp.zeros(1), num_iters=2)
    with pytest.raises(ValueError, match="num_iters"):
        model.fit_vem(p, y, num_iters=0)
    with pytest.raises(ValueError, match="observed"):
        model.fit_vem(p, y, mask=jnp.zeros(5, bool), num_iters=2)


# ---- input-driven transitions: softmax_j(log P[i, j] + W_j u_t) -----------------------------
W_TRUE = np.array([[2.0], [-2.0]])


def _simulate_driven(rng, p, num_t, num_seq):
    """``(y (num_seq, num_t, 1), u (num_seq, num_t, 1))`` of a scalar `SwitchingLDS` whose
    transitions are driven by standard normal inputs (``W = W_TRUE``), in NumPy."""
    p = jax.tree.map(np.asarray, p)
    ys, us = [], []
    for _ in range(num_seq):
        u = rng.normal(size=(num_t, 1))
        z = rng.choice(2, p=p.initial_probs)
        x = rng.normal(p.initial_means[z], 1.0)
        out = []
        for t in range(num_t):
            if t:
                logits = np.log(p.transitions[z]) + W_TRUE @ u[t]
                prob = np.exp(logits - logits.max())
                z = rng.choice(2, p=prob / prob.sum())
                x = p.dynamics_weights[z] @ x + rng.normal(0.0, np.sqrt(p.dynamics_cov[z, 0, 0]))
            out.append(p.emission_weights[z] @ x + p.emission_bias[z]
                       + rng.normal(0.0, np.sqrt(p.emission_cov[z, 0, 0])))
        ys.append(out)
        us.append(u)
    return jnp.asarray(np.asarray(ys)), jnp.asarray(np.asarray(us))


@pytest.fixture(scope="module")
def driven():
    model = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=1, input_dim=1,
                            transition_inputs=True)
    p = model.default_params()._replace(emission_bias=jnp.array([[1.5], [-1.5]]))
    y, u = _simulate_driven(np.random.default_rng(0), p, 80, 2)
    start = p._replace(emission_bias=jnp.array([[1.0], [-1.0]]))  # W = 0
    fit = model.fit_vem(start, y, inputs=u, num_iters=15, tol=None)
    return model, start, y, u, fit


def test_input_driven_elbo_never_decreases_and_recovers_w(driven):
    *_, fit = driven
    e = fit.elbo
    assert fit.stopped == "max_iters" and np.all(np.isfinite(e))
    assert np.all(np.diff(e) >= -1e-8 * np.abs(e[1:])), np.diff(e)
    assert e[-1] > e[0] + 1.0
    # W is identified up to a shift common to the rows: its contrast W_0 - W_1 (true 4)
    w = np.asarray(fit.params.transition_input_weights)[:, 0]
    assert 2.5 < w[0] - w[1] < 6.0, w
    np.testing.assert_allclose(fit.params.transitions.sum(-1), 1.0, atol=1e-12)


def test_input_driven_e_step_with_zero_w_is_unchanged(driven):
    """With ``W = 0`` the time-varying q(z) HMM is the fixed-``P`` one of
    ``transition_inputs=False``: same ELBO, q(z), q(x) and summed counts."""
    from statseq.models.switching import _slds_vem

    model, start, y, u, _ = driven
    plain = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=1, input_dim=1)
    mask = jnp.ones(y.shape, bool)
    gamma = jnp.full(y.shape[:2] + (2,), 0.5)
    a, b = jax.jit(lambda p0, p1: (  # one program for both
        _slds_vem.e_step(model, p0, gamma, y, mask, u, 1),
        _slds_vem.e_step(plain, p1, gamma, y, mask, u, 1)))(
            start, start._replace(transition_input_weights=None))
    assert a[2].shape == (2, 79, 2, 2) and b[2].shape == (2, 2, 2)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12)
    np.testing.assert_allclose(jnp.sum(a[2], 1), b[2], rtol=1e-12, atol=1e-12)
    for x, z in zip(a[1:2] + a[3:], b[1:2] + b[3:], strict=True):
        np.testing.assert_allclose(x, z, rtol=1e-12, atol=1e-12)


def test_transition_m_step():
    """Without input effect the Newton M-step lands on the closed form ``xi / rows`` (1e-12);
    with inputs it raises the expected transition log-likelihood to its maximum (the
    gradient vanishes) and never lowers it."""
    from statseq.models.switching import _slds_vem

    rng = np.random.default_rng(0)
    xi = jnp.asarray(rng.dirichlet(np.ones(9), size=40).reshape(40, 3, 3))
    p0 = jnp.asarray(rng.dirichlet(np.ones(3), size=3))
    w0 = jnp.zeros((3, 2))
    step = jax.jit(_slds_vem.transition_m_step)
    p1, w1 = step(p0, w0, xi, jnp.zeros((40, 2)))
    counts = np.asarray(jnp.sum(xi, 0))
    np.testing.assert_allclose(p1, counts / counts.sum(-1, keepdims=True), rtol=1e-12)
    np.testing.assert_array_equal(w1, 0.0)
    u = jnp.asarray(rng.normal(size=(40, 2)))
    p2, w2 = step(p0, w0, xi, u)
    obj = _slds_vem.transition_objective
    assert obj(jnp.log(p2), w2, xi, u) > obj(jnp.log(p0), w0, xi, u) + 1.0
    g = jax.grad(obj, argnums=(0, 1))(jnp.log(p2), w2, xi, u)
    assert max(float(jnp.max(jnp.abs(x))) for x in g) < 1e-8
    # at the optimum already: kept as it is (up to row renormalization)
    p3, w3 = step(p2, w2, xi, u)
    assert obj(jnp.log(p3), w3, xi, u) >= obj(jnp.log(p2), w2, xi, u)


def test_recurrent_refused():
    model = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None, recurrent=True)
    with pytest.raises(ValueError, match="recurrent.*fit_lbfgs"):
        model.fit_vem(model.default_params(), jnp.zeros(5), num_iters=2)
