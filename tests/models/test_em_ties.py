"""EM with tied entries (an ECM: closed-form M-step with the tied entries held, then accepted
gradient steps on the expected complete-data log-likelihood over the restricted free
vector): against restricted L-BFGS on the same model and against the univariate model on a
batch of two series (two independent copies with tied parameters are that model)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.core.restrict import restrict


def _two_series(num_t=80):
    rng = np.random.default_rng(7)
    uni = ss.LinearGaussianSSM(state_dim=1, emission_dim=None)
    pu = uni.default_params()._replace(dynamics_weights=jnp.array([[0.7]]))
    y = np.stack([np.asarray(ss.sample(uni, pu, num_timesteps=num_t,
                                       key=jax.random.key(int(s))))
                  for s in rng.integers(0, 1000, 2)])
    return uni, pu, y


def _tied_bivariate():
    biv = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    pb = biv.default_params()._replace(dynamics_weights=jnp.diag(jnp.array([0.5, 0.6])),
                                       dynamics_cov=jnp.diag(jnp.array([0.3, 0.5])),
                                       emission_weights=jnp.eye(2))
    diag = np.eye(2, dtype=bool)
    tr = jax.tree.map(lambda _: False, pb)._replace(
        dynamics_weights=diag, dynamics_cov=diag, emission_cov=diag)
    labels = np.where(diag, 0, -1)
    ties = jax.tree.map(lambda _: None, pb)._replace(
        dynamics_weights=labels, dynamics_cov=labels + 2 * diag, emission_cov=labels + 4 * diag)
    return biv, pb, tr, ties


def test_em_with_ties_reaches_the_restricted_lbfgs_optimum_monotonically():
    uni, pu, y = _two_series()
    biv, pb, tr, ties = _tied_bivariate()
    em = ss.fit_em(biv, pb, y.T, trainable=tr, ties=ties, num_iters=400, tol=1e-12,
                   progress=False)
    trace = em.log_joint[:em.num_iterations]
    assert np.diff(trace).min() > -1e-9
    lb = ss.fit_lbfgs(biv, pb, y.T, trainable=tr, ties=ties, progress=False)
    ll_em = float(ss.log_prob(biv, em.params, y.T))
    ll_lb = float(ss.log_prob(biv, lb.params, y.T))
    assert abs(ll_em - ll_lb) < 1e-6
    # the univariate model on the batch of two series: the same optimum
    tr_u = jax.tree.map(lambda _: False, pu)._replace(
        dynamics_weights=True, dynamics_cov=True, emission_cov=True)
    ref = ss.fit_lbfgs(uni, pu, y, trainable=tr_u, progress=False)
    np.testing.assert_allclose(ll_em, float(jnp.sum(ss.log_prob(uni, ref.params, y))),
                               atol=1e-6)
    est = em.params
    for leaf, r in ((est.dynamics_weights, ref.params.dynamics_weights),
                    (est.dynamics_cov, ref.params.dynamics_cov),
                    (est.emission_cov, ref.params.emission_cov)):
        assert float(leaf[0, 0]) == float(leaf[1, 1])  # tied: exactly equal
        assert float(leaf[0, 1]) == float(leaf[1, 0]) == 0.0  # fixed
        np.testing.assert_allclose(float(leaf[0, 0]), float(r[0, 0]), atol=1e-3)
    for name in ("emission_weights", "emission_bias", "dynamics_bias", "initial_mean",
                 "initial_cov"):
        assert np.array_equal(getattr(est, name), getattr(pb, name))
    # tied entries start at their common value; the first step already moves them
    assert float(est.dynamics_weights[0, 0]) != 0.55


def test_em_with_ties_and_free_entries_beside_them():
    """Tied dynamics coefficients with untied (closed-form) variances and biases."""
    # the series of the test above (same length): its sampler and log_prob programs are
    # reused rather than compiled again for a second length
    _, _, y = _two_series()
    biv, pb, tr, ties = _tied_bivariate()
    tr = tr._replace(emission_bias=True, dynamics_cov=np.eye(2, dtype=bool))
    ties = ties._replace(dynamics_cov=None)
    em = ss.fit_em(biv, pb, y.T + np.array([0.3, -0.2]), trainable=tr, ties=ties,
                   num_iters=400, tol=1e-12, progress=False)
    trace = em.log_joint[:em.num_iterations]
    assert np.diff(trace).min() > -1e-9
    yy = y.T + np.array([0.3, -0.2])
    lb = ss.fit_lbfgs(biv, pb, yy, trainable=tr, ties=ties, progress=False)
    np.testing.assert_allclose(float(ss.log_prob(biv, em.params, yy)),
                               float(ss.log_prob(biv, lb.params, yy)), atol=1e-6)
    w = em.params.dynamics_weights
    assert float(w[0, 0]) == float(w[1, 1]) and float(w[0, 1]) == 0.0
    assert float(em.params.dynamics_cov[0, 0]) != float(em.params.dynamics_cov[1, 1])


def test_expected_log_joint_is_maximized_by_the_closed_form_m_step():
    """The closed-form M-step (all entries free) is a stationary point of the expected
    complete-data log-likelihood, and any perturbation lowers it."""
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    truth = model.default_params()._replace(
        dynamics_weights=jnp.array([[0.8, 0.1], [0.2, 0.5]]),
        dynamics_cov=jnp.array([[0.3, 0.1], [0.1, 0.4]]))
    y = np.asarray(ss.sample(model, truth, num_timesteps=50, key=jax.random.key(3)))
    mask = np.ones(y.shape, bool)
    mask[5, 1] = mask[17, 0] = False  # missing entries enter the statistics too
    stats, _ = jax.jit(model.e_step)(truth, y[None], mask[None], jnp.zeros((1, 50, 0)))
    best = jax.jit(lambda s: model.m_step(truth, s, None, None))(stats)
    res, z0 = restrict(model, best)
    z0 = jnp.asarray(z0)
    f = jax.jit(lambda z: model.expected_log_joint(res.expand(model, z), stats))
    grad = jax.jit(jax.grad(f))(z0)
    assert np.abs(np.asarray(grad)).max() < 1e-8 * abs(float(f(z0)))
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert float(f(z0 + 0.05 * rng.normal(size=z0.shape))) < float(f(z0))


class _NoEntryMaskHMM(ss.PoissonHMM):
    """A model whose M-step takes whole-field masks only (no model in the library is
    like that any more: MarkovSwitchingAR took per-entry masks and ties in issue 11)."""

    m_step_entry_masks = False


def test_ties_are_refused_where_the_model_has_no_expected_log_joint():
    model = _NoEntryMaskHMM(num_states=2)
    counts = np.array([1, 2, 0, 3, 1, 5, 2, 1.0])
    mp = model.initialize(counts, key=jax.random.key(0))
    ties = jax.tree.map(lambda _: None, mp)
    ties = ties._replace(emissions=ties.emissions._replace(rates=np.array([0, 0])))
    with pytest.raises(ValueError, match="fit_em supports ties only for models with"):
        ss.fit_em(model, mp, counts, ties=ties, progress=False)


def test_contract_inverts_expand_under_a_restriction_with_ties():
    """`Restriction.contract` (used inside EM's loop) is the inverse of `expand`: whole
    leaves, entry-wise leaves with ties and a covariance with a free block and a fixed,
    singular row."""
    model = ss.LinearGaussianSSM(state_dim=3, emission_dim=2)
    p = model.default_params()._replace(
        dynamics_cov=jnp.asarray([[0.5, 0.1, 0.0], [0.1, 0.4, 0.0], [0.0, 0.0, 0.0]]))
    block = np.zeros((3, 3), bool)
    block[:2, :2] = True
    tr = jax.tree.map(lambda _: True, p)._replace(
        dynamics_cov=block, dynamics_weights=np.triu(np.ones((3, 3), bool)),
        emission_cov=np.eye(2, dtype=bool))
    ties = jax.tree.map(lambda _: None, p)._replace(
        emission_cov=np.array([[0, -1], [-1, 0]]), emission_bias=np.array([1, 1]))
    res, z0 = restrict(model, p, tr, ties)
    z = jnp.where(res.keep, jnp.asarray(z0) + 0.1 * jnp.sin(jnp.arange(len(z0))), res.z0)
    back = jax.jit(lambda r, q: r.contract(model, q))(res, res.expand(model, z))
    np.testing.assert_allclose(back, z, atol=1e-12)
