"""MarkovSwitchingAR with fixed and tied entries in fit_em (issue 11, point 2).

References: the expected complete-data log-likelihood ``Q`` against exact enumeration of
every regime path; Fisher's identity (the gradient of ``Q`` at the E-step's parameters is
that of the log-likelihood); each masked ECM block against the first-order conditions of
its constrained maximum; and the restricted EM fixed point on Hamilton's (1989) GNP data
against restricted L-BFGS and against an equivalent model written without ties.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

import statseq as ss
from statseq.core.restrict import restrict
from statseq.core.validation import prepare_data
from statseq.models.switching import MarkovSwitchingAR, MSARParams
from tests.models.test_ms_ar import paths_log_joint, random_params


def gnp():
    return ss.datasets.load_us_gnp_growth().to_numpy()


@pytest.mark.parametrize("model", [
    MarkovSwitchingAR(2, 2, switching_ar=True, switching_variance=True),
    MarkovSwitchingAR(3, 1, form="intercept", switching_ar=True, switching_variance=True,
                      initial="free"),
])
def test_expected_log_joint_equals_enumeration(model):
    """``Q(theta'; stats(theta))`` equals ``sum_paths p(path | y, theta) log p(path, y |
    theta')`` over all ``K^T`` regime paths (1e-10), at ``theta' = theta`` and at other
    parameters, with every step observed and with the last step missing; the E-step's
    log-likelihood is the log-sum of the path joints."""
    rng = np.random.default_rng(3)
    params, other = random_params(model, rng), random_params(model, rng)
    y = rng.normal(size=7) * 1.5
    paths = np.array(list(itertools.product(range(model.num_regimes), repeat=len(y))))
    e_step, q = jax.jit(model.e_step), jax.jit(model.expected_log_joint)
    for observed in (np.ones(len(y), bool), np.arange(len(y)) < len(y) - 1):
        lj = paths_log_joint(model, params, y, paths, observed=observed)
        post = np.exp(lj - logsumexp(lj))
        stats_, lp = e_step(params, jnp.asarray(y)[None], jnp.asarray(observed)[None], None)
        np.testing.assert_allclose(float(lp), logsumexp(lj), rtol=1e-12)
        for theta in (params, other):
            ref = np.sum(post * paths_log_joint(model, theta, y, paths, observed=observed))
            np.testing.assert_allclose(float(q(theta, stats_)), ref, rtol=1e-10)


def test_fisher_identity_on_gnp():
    """Fisher's identity on Hamilton's MS(2)-AR(4) (32 expanded states, stationary start):
    at the E-step's parameters the gradient of ``Q`` over the unconstrained parameters
    equals that of ``log p(y)`` (`statseq.log_prob`, the generic filter) to 1e-6 in
    float64 (measured ~1e-13 against gradients of size ~10). (The other variants' ``Q`` is
    exact at every parameter by enumeration, so its gradient is too.)"""
    model = MarkovSwitchingAR(2, 4)
    y = gnp()
    params = model.initialize(y, key=jax.random.key(1), method="random")
    data = prepare_data(model, y)
    stats_, lp = jax.jit(model.e_step)(params, data.y, data.mask, data.inputs)
    res, z0 = restrict(model, params)
    z0 = jnp.asarray(z0)
    g_ll = jax.jit(jax.grad(
        lambda z: ss.log_prob(model, res.expand(model, z), data.y[0])))(z0)
    g_q = jax.jit(jax.grad(
        lambda z: model.expected_log_joint(res.expand(model, z), stats_)))(z0)
    assert np.abs(np.asarray(g_ll)).max() > 1.0  # not at a stationary point
    np.testing.assert_allclose(np.asarray(g_q), np.asarray(g_ll), atol=1e-6)
    np.testing.assert_allclose(float(lp), float(ss.log_prob(model, params, data.y[0])),
                               rtol=1e-12)


def test_each_masked_block_is_its_constrained_maximum():
    """With one field partly free and the rest fixed, `m_step` is the exact maximizer of
    ``Q`` over the free entries: fixed entries keep their bits, the gradient of ``Q`` over
    free real entries is 0 (1e-8 relative) and over a simplex row's free entries equal
    (the Lagrange condition); all-True masks give the unrestricted step (1e-12)."""
    model = MarkovSwitchingAR(3, 1, switching_ar=True, switching_variance=True,
                              initial="free")
    y = gnp()
    params = model.initialize(y, key=jax.random.key(2), method="random")._replace(
        initial_probs=jnp.array([0.2, 0.5, 0.3]))
    data = prepare_data(model, y)
    stats_, _ = jax.jit(model.e_step)(params, data.y, data.mask, data.inputs)
    everything = jax.tree.map(lambda a: jnp.ones(jnp.shape(a), bool), params)
    step = jax.jit(lambda tr: model.m_step(params, stats_, None, None, trainable=tr))
    for a, b in zip(jax.tree.leaves(step(everything)),
                    jax.tree.leaves(jax.jit(lambda s: model.m_step(params, s, None, None))(
                        stats_)), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12)
    q_grad = jax.jit(jax.grad(lambda p: model.expected_log_joint(p, stats_)))
    q = jax.jit(lambda p: model.expected_log_joint(p, stats_))
    q0 = float(q(params))
    partial_masks = {
        "initial_probs": np.array([True, False, True]),
        "transitions": np.array([[True, False, True], [True, True, True],
                                 [False, True, True]]),
        "means": np.array([True, False, True]),
        "ar_coeffs": np.array([[True], [False], [True]]),
        "variances": np.array([True, True, False]),
    }
    for name, free in partial_masks.items():
        tr = jax.tree.map(lambda a: jnp.zeros(jnp.shape(a), bool), params)._replace(
            **{name: jnp.asarray(free)})
        new = step(tr)
        old_leaf, new_leaf = np.asarray(getattr(params, name)), np.asarray(getattr(new, name))
        np.testing.assert_array_equal(new_leaf[~free], old_leaf[~free])
        assert np.all(new_leaf[free] != old_leaf[free])  # the free entries moved
        for other in set(MSARParams._fields) - {name}:  # frozen fields are untouched
            np.testing.assert_array_equal(np.asarray(getattr(new, other)),
                                          np.asarray(getattr(params, other)))
        assert float(q(new)) > q0
        g = np.asarray(getattr(q_grad(new), name))
        scale = np.abs(np.asarray(getattr(q_grad(params), name))).max()
        if name in ("initial_probs", "transitions"):
            for g_row, f_row in zip(np.atleast_2d(g), np.atleast_2d(free), strict=True):
                if f_row.sum() > 1:
                    np.testing.assert_allclose(g_row[f_row], g_row[f_row][0], rtol=1e-8)
        else:
            assert np.abs(g[free]).max() < 1e-8 * scale


def test_restricted_em_equals_restricted_lbfgs_on_gnp():
    """Hamilton's GNP data, MS(2)-AR(4) with a switching mean and variance and switching
    AR coefficients tied across the regimes, ``p[0 -> 1]`` fixed at 0.25 and the second
    regime's variance fixed at 0.8. ECM (closed-form blocks with the tied entries held, then
    accepted gradient steps on ``Q``) never decreases the log-likelihood; its fixed point
    equals the restricted L-BFGS optimum to 1e-6 in the log-likelihood (measured ~5e-10)
    and 1e-4 in the parameters; fixed entries keep their bits and tied ones are equal. The
    same restriction without ties (``switching_ar=False``, the same likelihood) fitted by
    EM with per-entry masks only (exact closed-form blocks, no gradient steps) reaches the
    same maximum."""
    y = gnp()
    model = MarkovSwitchingAR(2, 4, switching_ar=True, switching_variance=True)
    start = model.initialize(y)._replace(transitions=jnp.array([[0.75, 0.25], [0.1, 0.9]]),
                                         variances=jnp.array([0.6, 0.8]))
    trainable = jax.tree.map(lambda _: True, start)._replace(
        transitions=np.array([[True, False], [True, True]]),
        variances=np.array([True, False]))
    ties = jax.tree.map(lambda _: None, start)._replace(
        ar_coeffs=np.array([[0, 1, 2, 3], [0, 1, 2, 3]]))
    em = ss.fit_em(model, start, y, trainable=trainable, ties=ties, num_iters=400,
                   tol=1e-12, progress=False)
    lb = ss.fit_lbfgs(model, start, y, trainable=trainable, ties=ties, progress=False)
    assert em.converged and lb.converged
    trace = em.log_joint[: em.num_iterations]
    assert np.all(np.diff(trace) >= -1e-10 * np.abs(trace[1:]))
    assert trace[-1] - trace[0] > 1.0
    ll_em = float(ss.log_prob(model, em.params, y))
    ll_lb = float(ss.log_prob(model, lb.params, y))
    np.testing.assert_allclose(ll_em, ll_lb, rtol=0, atol=1e-6)
    for a, b in zip(jax.tree.leaves(em.params), jax.tree.leaves(lb.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)
    p = em.params
    assert float(p.transitions[0, 1]) == 0.25 and float(p.variances[1]) == 0.8
    np.testing.assert_array_equal(np.asarray(p.ar_coeffs[0]), np.asarray(p.ar_coeffs[1]))

    shared = MarkovSwitchingAR(2, 4, switching_variance=True)
    start2 = start._replace(ar_coeffs=start.ar_coeffs[0])
    em2 = ss.fit_em(shared, start2, y, num_iters=400, tol=1e-12, progress=False,
                    trainable=trainable._replace(ar_coeffs=True))
    trace2 = em2.log_joint[: em2.num_iterations]
    assert em2.converged
    assert np.all(np.diff(trace2) >= -1e-10 * np.abs(trace2[1:]))
    np.testing.assert_allclose(float(ss.log_prob(shared, em2.params, y)), ll_lb, rtol=0,
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(em2.params.ar_coeffs),
                               np.asarray(lb.params.ar_coeffs[0]), atol=1e-4)
    assert float(em2.params.transitions[0, 1]) == 0.25
    assert float(em2.params.variances[1]) == 0.8


def test_a_frozen_field_is_held_inside_the_ecm_sweep():
    """Hamilton's model with the regime means frozen (whole field) away from their MLE:
    `m_step` must hold them while it solves ``phi`` and the variance (before issue 11 it
    updated them inside the sweep and `fit_em` reset them afterwards, so ``phi`` and the
    variance were fitted to other means: the log joint fell at iteration 2, llf -194.70).
    Now the trace never decreases and EM converges to the restricted L-BFGS optimum
    (llf -190.76071, 1e-6)."""
    y = gnp()
    model = MarkovSwitchingAR(2, 4)
    start = model.initialize(y)._replace(means=jnp.array([-0.8, 1.5]))
    trainable = jax.tree.map(lambda _: True, start)._replace(means=False)
    em = ss.fit_em(model, start, y, trainable=trainable, num_iters=200, tol=1e-12,
                   progress=False)
    lb = ss.fit_lbfgs(model, start, y, trainable=trainable, progress=False)
    assert em.converged and lb.converged
    trace = em.log_joint[: em.num_iterations]
    assert np.all(np.diff(trace) >= -1e-10 * np.abs(trace[1:]))
    np.testing.assert_array_equal(np.asarray(em.params.means), np.array([-0.8, 1.5]))
    np.testing.assert_allclose(float(ss.log_prob(model, em.params, y)),
                               float(ss.log_prob(model, lb.params, y)), rtol=0, atol=1e-6)
