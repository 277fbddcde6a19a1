"""Singular covariances and restricted (fixed / tied entry) fits of linear Gaussian state
space models: against dense Gaussian conditioning (`_dense_ssm`), statsmodels' Kalman
filter and its SARIMAX maximum likelihood, and between fitting methods."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import statsmodels.api as sm

import statseq as ss
from statseq.core.restrict import restrict

sys.path.insert(0, str(Path(__file__).parent))
from _dense_ssm import H_AR2, ar2_params, statsmodels_kalman  # noqa: E402


def ar2_series(num_t, seed=1, phi=(0.6, 0.25), q=1.0, r=0.5):
    rng = np.random.default_rng(seed)
    x = np.zeros(num_t + 2)
    for t in range(2, num_t + 2):
        x[t] = phi[0] * x[t - 1] + phi[1] * x[t - 2] + rng.normal() * np.sqrt(q)
    return x[2:] + rng.normal(size=num_t) * np.sqrt(r)


# ---- 2. restricted maximum likelihood -----------------------------------------------------
def _ar2_restriction(p, *, initial):
    """F = [[phi1, phi2], [1, 0]] with the second row fixed, H = [1, 0], Q = diag(q, 0)."""
    tr = jax.tree.map(lambda _: False, p)
    tr = tr._replace(dynamics_weights=np.array([[True, True], [False, False]]),
                     dynamics_cov=np.array([[True, False], [False, False]]),
                     emission_cov=True)
    return tr


def test_restricted_ar2_plus_noise_mle_matches_statsmodels_sarimax():
    """The textbook AR(2) plus measurement error (Hamilton 1994, ch. 13): SARIMAX order
    (2, 0, 0) with ``measurement_error=True`` and a stationary initial state."""
    y = ar2_series(300)
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None, initial="stationary")
    start = model.default_params()._replace(
        dynamics_weights=jnp.array([[0.3, 0.1], [1.0, 0.0]]),
        dynamics_cov=jnp.diag(jnp.array([0.5, 0.0])), emission_weights=jnp.asarray(H_AR2),
        emission_cov=jnp.array([[0.3]]))
    tr = _ar2_restriction(start, initial="stationary")
    fit = ss.fit_lbfgs(model, start, y, trainable=tr, progress=False)
    assert fit.converged
    est = fit.params
    mod = sm.tsa.SARIMAX(y, order=(2, 0, 0), trend="n", measurement_error=True)
    res = mod.fit(disp=False, maxiter=2000)
    ours = [est.dynamics_weights[0, 0], est.dynamics_weights[0, 1],
            est.emission_cov[0, 0], est.dynamics_cov[0, 0]]
    assert mod.param_names == ["ar.L1", "ar.L2", "var.measurement_error", "sigma2"]
    # the same likelihood at our estimate, and at least statsmodels' optimum
    np.testing.assert_allclose(mod.loglike(np.asarray(ours, float)),
                               float(ss.log_prob(model, est, y)), rtol=1e-10)
    llf = float(ss.log_prob(model, est, y))
    assert abs(llf - res.llf) < 1e-6 or llf > res.llf
    np.testing.assert_allclose(ours, res.params, atol=2e-3)
    # the fixed entries are exactly as given
    assert np.array_equal(est.dynamics_weights[1], start.dynamics_weights[1])
    assert float(est.dynamics_cov[1, 1]) == 0.0 and float(est.dynamics_cov[0, 1]) == 0.0
    assert np.array_equal(est.emission_weights, start.emission_weights)


def test_restricted_em_is_monotone_and_reaches_the_quasi_newton_optimum():
    y = ar2_series(200, seed=3)
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None)
    start = model.default_params()._replace(
        dynamics_weights=jnp.array([[0.3, 0.1], [1.0, 0.0]]),
        dynamics_cov=jnp.diag(jnp.array([0.5, 0.0])), emission_weights=jnp.asarray(H_AR2),
        emission_cov=jnp.array([[0.3]]), initial_cov=2.0 * jnp.eye(2))
    tr = _ar2_restriction(start, initial="free")
    em = ss.fit_em(model, start, y, trainable=tr, num_iters=1500, tol=1e-11, progress=False)
    trace = em.log_joint[:em.num_iterations]
    assert np.diff(trace).min() > -1e-9
    lb = ss.fit_lbfgs(model, start, y, trainable=tr, progress=False)
    np.testing.assert_allclose(float(ss.log_prob(model, em.params, y)),
                               float(ss.log_prob(model, lb.params, y)), atol=1e-6)
    np.testing.assert_allclose(em.params.dynamics_weights, lb.params.dynamics_weights,
                               atol=2e-3)
    for fit in (em, lb):
        assert np.array_equal(fit.params.dynamics_weights[1], [1.0, 0.0])
        assert np.array_equal(fit.params.dynamics_cov[1], [0.0, 0.0])
        assert np.array_equal(fit.params.initial_cov, start.initial_cov)
    # statsmodels' likelihood at EM's estimate (known initial law) is ours
    ref = statsmodels_kalman(em.params, y)
    np.testing.assert_allclose(ref.llf_obs.sum(), float(ss.log_prob(model, em.params, y)),
                               rtol=1e-10)


def test_em_with_rows_restricted_differently_and_a_full_q_is_monotone():
    """Per-row masks with a non-diagonal Q: each row is a conditional maximization (ECM)."""
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    truth = model.default_params()._replace(
        dynamics_weights=jnp.array([[0.8, 0.0], [0.3, 0.5]]),
        dynamics_cov=jnp.array([[0.3, 0.15], [0.15, 0.4]]))
    y = np.asarray(ss.sample(model, truth, num_timesteps=150, key=jax.random.key(5)))
    start = truth._replace(dynamics_weights=jnp.array([[0.5, 0.0], [0.0, 0.3]]))
    tr = jax.tree.map(lambda _: True, start)._replace(
        dynamics_weights=np.array([[True, False], [True, True]]),
        emission_weights=np.array([[True, False], [False, True]]), initial_mean=False,
        initial_cov=False)
    fit = ss.fit_em(model, start, y, trainable=tr, num_iters=60, tol=0, progress=False)
    trace = fit.log_joint[:fit.num_iterations]
    assert np.diff(trace).min() > -1e-9 * np.abs(trace).max()
    assert float(fit.params.dynamics_weights[0, 1]) == 0.0
    assert float(fit.params.emission_weights[0, 1]) == 0.0
    assert float(fit.params.emission_weights[1, 0]) == 0.0
    # one row update solves its normal equations given the other: the gradient of the
    # expected complete log-likelihood in the free entries of the last row vanishes
    # after one M-step; checked through the likelihood: EM ends above its start by a lot
    assert trace[-1] > trace[0] + 1.0


def test_ties_equal_a_batch_of_independent_copies():
    """Two independent AR(1) + noise series with tied coefficients and variances are one
    univariate model fitted to a batch of two series."""
    rng = np.random.default_rng(7)
    uni = ss.LinearGaussianSSM(state_dim=1, emission_dim=None)
    pu = uni.default_params()._replace(dynamics_weights=jnp.array([[0.7]]))
    y = np.stack([np.asarray(ss.sample(uni, pu, num_timesteps=120,
                                       key=jax.random.key(int(s))))
                  for s in rng.integers(0, 1000, 2)])
    tr_u = jax.tree.map(lambda _: False, pu)._replace(
        dynamics_weights=True, dynamics_cov=True, emission_cov=True)
    ref = ss.fit_lbfgs(uni, pu, y, trainable=tr_u, progress=False)

    biv = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    pb = biv.default_params()._replace(dynamics_weights=jnp.diag(jnp.array([0.7, 0.7])),
                                       emission_weights=jnp.eye(2))
    diag = np.eye(2, dtype=bool)
    tr_b = jax.tree.map(lambda _: False, pb)._replace(
        dynamics_weights=diag, dynamics_cov=diag, emission_cov=diag)
    labels = np.where(diag, 0, -1)
    ties = jax.tree.map(lambda _: None, pb)._replace(
        dynamics_weights=labels, dynamics_cov=labels + 2 * diag, emission_cov=labels + 4 * diag)
    fit = ss.fit_lbfgs(biv, pb, y.T, trainable=tr_b, ties=ties, progress=False)
    est = fit.params
    for leaf in (est.dynamics_weights, est.dynamics_cov, est.emission_cov):
        assert float(leaf[0, 0]) == float(leaf[1, 1]) and float(leaf[0, 1]) == 0.0
    np.testing.assert_allclose(float(est.dynamics_weights[0, 0]),
                               float(ref.params.dynamics_weights[0, 0]), atol=1e-6)
    np.testing.assert_allclose(float(est.dynamics_cov[0, 0]),
                               float(ref.params.dynamics_cov[0, 0]), atol=1e-6)
    np.testing.assert_allclose(float(ss.log_prob(biv, est, y.T)),
                               float(jnp.sum(ss.log_prob(uni, ref.params, y))), atol=1e-8)
    # SGD keeps the ties and the fixed entries too
    sgd = ss.fit_sgd(biv, pb, y.T, optimizer=optax.adam(0.01), num_steps=30,
                     key=jax.random.key(0), trainable=tr_b, ties=ties, progress=False)
    w = sgd.params.dynamics_weights
    assert float(w[0, 0]) == float(w[1, 1]) != 0.7 and float(w[0, 1]) == 0.0
    assert np.array_equal(sgd.params.emission_weights, pb.emission_weights)


def test_frozen_singular_leaves_pass_through_every_fitting_method():
    y = ar2_series(60, seed=2)
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None)
    p = ar2_params(model, r=0.3)
    tr = jax.tree.map(lambda _: True, p)._replace(
        dynamics_cov=False, dynamics_input_weights=False, emission_input_weights=False,
        initial_cov=False)
    fits = [ss.fit_lbfgs(model, p, y, trainable=tr, num_iters=5, progress=False),
            ss.fit_sgd(model, p, y, optimizer=optax.adam(1e-2), num_steps=5,
                       key=jax.random.key(0), trainable=tr, progress=False),
            ss.fit_em(model, p, y, trainable=tr, num_iters=5, progress=False)]
    for fit in fits:
        assert np.array_equal(fit.params.dynamics_cov, p.dynamics_cov)
        assert not np.array_equal(fit.params.dynamics_weights, p.dynamics_weights)


# ---- the restriction itself ------------------------------------------------------------
def test_restriction_round_trip_counts_and_errors():
    model = ss.LinearGaussianSSM(state_dim=3, emission_dim=2)
    p = model.default_params()._replace(
        dynamics_cov=jnp.asarray([[0.5, 0.1, 0.0], [0.1, 0.4, 0.0], [0.0, 0.0, 0.0]]))
    everything = jax.tree.map(lambda _: True, p)
    block = np.zeros((3, 3), bool)
    block[:2, :2] = True
    tr = everything._replace(dynamics_cov=block,
                             dynamics_weights=np.triu(np.ones((3, 3), bool)))
    res, z0 = restrict(model, p, tr)
    back = res.expand(model, jnp.asarray(z0))
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(p), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-14)
    # 3 m + 6 P + 6 F + 3 b + 3 Q-block + 6 H + 2 d + 3 R (no inputs)
    assert res.num_free == 3 + 6 + 6 + 3 + 3 + 6 + 2 + 3
    # identified: the state's origin x -> x + c (m, b, d all free) is not counted; the
    # change of basis is not subtracted, F and Q being partly frozen
    assert ss.num_params(model, tr) == res.num_free - 3
    with pytest.raises(ValueError, match="singular .* cannot be fitted as a whole"):
        restrict(model, p, everything)
    with pytest.raises(ValueError, match="must be symmetric"):
        restrict(model, p, tr._replace(dynamics_cov=np.tril(np.ones((3, 3), bool))))
    chain = np.eye(3, dtype=bool) | np.eye(3, k=1, dtype=bool) | np.eye(3, k=-1, dtype=bool)
    pc = p._replace(dynamics_cov=jnp.asarray([[1.0, 0.2, 0.0], [0.2, 1.0, 0.2],
                                              [0.0, 0.2, 1.0]]))
    with pytest.raises(ValueError, match="block-diagonal"):
        restrict(model, pc, tr._replace(dynamics_cov=chain))
    with pytest.raises(ValueError, match="between the free and the fixed rows must be 0"):
        restrict(model, pc, tr._replace(dynamics_cov=np.diag([True, True, False])))
    ties = jax.tree.map(lambda _: None, p)._replace(
        dynamics_weights=np.array([[0, -1, -1], [-1, -1, -1], [0, -1, -1]]))
    with pytest.raises(ValueError, match="ties entries that trainable fixes"):
        restrict(model, p, tr, ties)
    with pytest.raises(TypeError, match="boolean array"):
        restrict(model, p, tr._replace(emission_bias=np.array([1, 0])))
    with pytest.raises(ValueError, match="shape"):
        restrict(model, p, tr._replace(emission_bias=np.array([True])))
    y = np.zeros((10, 2))
    with pytest.raises(ValueError, match="ties entries that trainable fixes"):
        ss.fit_em(model, p, y, trainable=tr, ties=ties, progress=False)
    # a simplex leaf (transition rows) restricted entry by entry: one logit per free entry
    # but the last of its row; fit_em refuses per-entry masks where the model's M-step
    # does not handle them (a model declaring m_step_entry_masks = False)
    hmm = ss.PoissonHMM(num_states=2)
    counts = np.array([1, 2, 0, 3, 1, 5, 2, 1.0])
    hp = hmm.initialize(counts, key=jax.random.key(0))
    mask = jax.tree.map(lambda _: True, hp)
    fixed = mask._replace(transitions=np.array([[True, False], [True, True]]))
    assert restrict(hmm, hp, fixed)[0].num_free == 1 + 0 + 1 + 2
    rates = mask._replace(emissions=mask.emissions._replace(rates=np.array([True, False])))
    assert restrict(hmm, hp, rates)[0].num_free == 1 + 2 + 1
    class WholeFieldMasksOnly(ss.PoissonHMM):
        m_step_entry_masks = False

    with pytest.raises(ValueError, match="does not support per-entry trainable masks"):
        ss.fit_em(WholeFieldMasksOnly(num_states=2), hp, counts, trainable=fixed,
                  progress=False)


def test_nuts_and_svi_sample_only_the_free_entries():
    y = ar2_series(40, seed=5)
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None)
    p = ar2_params(model, r=0.5, q=1.0)._replace(
        dynamics_weights=jnp.array([[0.5, 0.2], [1.0, 0.0]]))
    tr = jax.tree.map(lambda _: False, p)._replace(
        dynamics_weights=np.array([[True, True], [False, False]]))
    idata = ss.fit_nuts(model, y, key=jax.random.key(0), num_warmup=40, num_samples=30,
                        num_chains=1, init_params=p, trainable=tr, progress=False)
    draws = np.asarray(idata.posterior["dynamics_weights"].values)
    assert draws.shape == (1, 30, 2)  # phi1 and phi2 only
    assert list(idata.posterior.data_vars) == ["dynamics_weights"]
    assert np.unique(draws[0, :, 0]).size > 5
    full = ss.posterior_params(model, idata)
    assert np.array_equal(full.dynamics_weights[..., 1, :],
                          np.broadcast_to([1.0, 0.0], (1, 30, 2)))
    np.testing.assert_array_equal(full.dynamics_weights[..., 0, :], draws)
    assert np.array_equal(full.dynamics_cov[0, 0], p.dynamics_cov)  # singular, frozen
    svi = ss.fit_svi(model, y, key=jax.random.key(1), optimizer=optax.adam(0.02),
                     num_steps=30, num_samples=5, init_params=p, trainable=tr)
    assert np.array_equal(svi.draws.dynamics_weights[:, 1], np.broadcast_to([1.0, 0.0], (5, 2)))
    assert np.unique(np.asarray(svi.draws.dynamics_weights[:, 0, 0])).size == 5
