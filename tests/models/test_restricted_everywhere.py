"""Ties (and per-entry masks) in fit_nuts / fit_svi: the sampled free coordinates, the log
density the samplers use against the restricted L-BFGS objective, and tied/fixed entries in
every draw."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.infer.util import log_density
from scipy.stats import norm

import statseq as ss
from statseq.bayes import _joint
from statseq.core.restrict import restrict
from statseq.core.validation import prepare_data
from statseq.fit._objective import restricted_negative_log_joint


def _setup():
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    p = model.default_params()._replace(dynamics_weights=jnp.diag(jnp.array([0.6, 0.6])),
                                        dynamics_bias=jnp.array([0.2, -0.1]),
                                        emission_bias=jnp.array([0.2, 0.2]))
    y = np.asarray(ss.sample(model, p, num_timesteps=40, key=jax.random.key(3)))
    diag = np.eye(2, dtype=bool)
    trainable = jax.tree.map(lambda _: False, p)._replace(
        dynamics_weights=diag, dynamics_bias=True, emission_bias=True)
    none = jax.tree.map(lambda _: None, p)
    # phi_11 = phi_22 (label 0); b_1 = c_1 = c_2 across two leaves (label 1); b_2 untied
    ties = none._replace(dynamics_weights=np.where(diag, 0, -1),
                         dynamics_bias=np.array([1, -1]), emission_bias=np.array([1, 1]))
    priors = none._replace(dynamics_weights=dist.Normal(0.5, 0.3),
                           dynamics_bias=dist.Normal(0.0, 2.0),
                           emission_bias=dist.Normal(1.0, 3.0))
    return model, p, y, trainable, ties, priors


def test_sampler_log_density_equals_the_restricted_lbfgs_objective():
    model, p, y, trainable, ties, priors = _setup()
    spec = _joint.prepare_joint(model, y, priors=priors, mask=None, inputs=None,
                                init_params=p, trainable=trainable, ordered=None,
                                key=jax.random.key(0), ties=ties)
    res, z0 = restrict(model, p, trainable, ties)
    # one sampled coordinate per tie group or untied free entry, as in L-BFGS
    sites = _joint.site_values(spec)
    assert sorted(sites) == ["dynamics_bias", "tied.0", "tied.1"]
    assert sum(np.size(v) for v in sites.values()) == res.num_free == 3
    data = prepare_data(model, y, None, None)
    objective = restricted_negative_log_joint(model, res, None, data.y, data.mask,
                                              data.inputs, data.complete)
    rng = np.random.default_rng(0)
    for _ in range(3):
        z = jnp.asarray(z0 + np.where(res.keep, rng.normal(0, 0.3, z0.shape), 0.0))
        q = res.expand(model, z)
        point = {"tied.0": q.dynamics_weights[0, 0], "tied.1": q.dynamics_bias[0],
                 "dynamics_bias": q.dynamics_bias[1:]}
        lp, trace = log_density(_joint.numpyro_model, (spec,), {}, point)
        # the tie group takes the prior of its first member (parameter order): N(0, 2)
        prior = (norm.logpdf(float(point["tied.0"]), 0.5, 0.3)
                 + norm.logpdf(float(q.dynamics_bias[0]), 0.0, 2.0)
                 + norm.logpdf(float(q.dynamics_bias[1]), 0.0, 2.0))
        np.testing.assert_allclose(float(lp), -float(objective(z)) + prior, rtol=0,
                                   atol=1e-10)
        np.testing.assert_array_equal(trace["y"]["fn"].params.emission_bias,
                                      q.emission_bias)


def test_nuts_and_svi_keep_ties_and_fixed_entries_in_every_draw():
    model, p, y, trainable, ties, priors = _setup()
    idata = ss.fit_nuts(model, y, key=jax.random.key(1), num_warmup=30, num_samples=15,
                        num_chains=1, priors=priors, init_params=p, trainable=trainable,
                        ties=ties)
    post = idata.posterior
    assert sorted(post.data_vars) == ["dynamics_bias", "tied.0", "tied.1"]
    assert post["dynamics_bias"].shape == (1, 15, 1)
    np.testing.assert_array_equal(idata.constant_data["emission_bias.ties"].values, [1, 1])
    draws = ss.posterior_params(model, idata)
    w, b, c = draws.dynamics_weights, draws.dynamics_bias, draws.emission_bias
    np.testing.assert_array_equal(w[..., 0, 0], w[..., 1, 1])
    np.testing.assert_array_equal(w[..., 0, 1], 0.0)
    np.testing.assert_array_equal(b[..., 0], c[..., 0])
    np.testing.assert_array_equal(c[..., 0], c[..., 1])
    np.testing.assert_array_equal(w[..., 0, 0], post["tied.0"].values)
    assert np.unique(np.asarray(b[..., 1])).size > 1  # the untied entry moves
    assert np.unique(np.asarray(w[..., 0, 0])).size > 1
    np.testing.assert_array_equal(draws.dynamics_cov, np.broadcast_to(p.dynamics_cov,
                                                                      (1, 15, 2, 2)))
    fit = ss.fit_svi(model, y, key=jax.random.key(2), num_steps=30, num_samples=5,
                     priors=priors, init_params=p, trainable=trainable, ties=ties)
    d = fit.draws
    np.testing.assert_array_equal(d.dynamics_weights[:, 0, 0], d.dynamics_weights[:, 1, 1])
    np.testing.assert_array_equal(d.dynamics_bias[:, 0], d.emission_bias[:, 1])
    np.testing.assert_array_equal(d.emission_weights, np.broadcast_to(p.emission_weights,
                                                                      (5, 2, 2)))


def test_sampler_ties_bad_input():
    model, p, y, trainable, ties, priors = _setup()
    kw = dict(key=jax.random.key(0), num_warmup=2, num_samples=2, num_chains=1,
              init_params=p, priors=priors)
    with pytest.raises(ValueError, match="ties entries that trainable fixes"):
        ss.fit_nuts(model, y, trainable=trainable._replace(emission_bias=False), ties=ties,
                    **kw)
    # tied variances need their covariances fixed (the samplers tie variances as restrict)
    with pytest.raises(ValueError, match="covariances fixed"):
        ss.fit_nuts(model, y, trainable=trainable._replace(dynamics_cov=True),
                    ties=ties._replace(dynamics_cov=np.array([[0, -1], [-1, 0]])), **kw)
    with pytest.raises(TypeError, match="integer array"):
        ss.fit_svi(model, y, key=jax.random.key(0), num_steps=2, trainable=trainable,
                   ties=ties._replace(emission_bias=np.array([1.0, 1.0])), init_params=p)


# ---- standard errors and summary under per-entry restrictions ------------------------------
def _fd_hessian(f, x, h=1e-4):
    """Central second differences of ``f`` at ``x`` (dense NumPy)."""
    n = len(x)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            ei, ej = np.eye(n)[i] * h, np.eye(n)[j] * h
            out[i, j] = (f(x + ei + ej) - f(x + ei - ej) - f(x - ei + ej)
                         + f(x - ei - ej)) / (4 * h * h)
    return out


def test_restricted_standard_errors_match_statsmodels_sarimax_finite_differences():
    """AR(2) + measurement error with the companion row fixed and a singular Q = diag(q, 0):
    the standard errors are the inverse of the observed information in the four natural
    parameters, here a finite-difference Hessian of statsmodels' SARIMAX log-likelihood."""
    import statsmodels.api as sm

    rng = np.random.default_rng(5)
    x = np.zeros(202)
    for t in range(2, 202):
        x[t] = 0.6 * x[t - 1] + 0.25 * x[t - 2] + rng.normal()
    y = x[2:] + rng.normal(size=200) * np.sqrt(0.5)
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None, initial="stationary")
    start = model.default_params()._replace(
        dynamics_weights=jnp.array([[0.3, 0.1], [1.0, 0.0]]),
        dynamics_cov=jnp.diag(jnp.array([0.5, 0.0])),
        emission_weights=jnp.array([[1.0, 0.0]]), emission_cov=jnp.array([[0.3]]))
    tr = jax.tree.map(lambda _: False, start)._replace(
        dynamics_weights=np.array([[True, True], [False, False]]),
        dynamics_cov=np.array([[True, False], [False, False]]), emission_cov=True)
    est = ss.fit_lbfgs(model, start, y, trainable=tr, progress=False).params
    se = ss.standard_errors(model, est, y, trainable=tr)
    ours = np.array([se.dynamics_weights[0, 0], se.dynamics_weights[0, 1],
                     se.emission_cov[0, 0], se.dynamics_cov[0, 0]])
    mod = sm.tsa.SARIMAX(y, order=(2, 0, 0), trend="n", measurement_error=True)
    theta = np.array([est.dynamics_weights[0, 0], est.dynamics_weights[0, 1],
                      est.emission_cov[0, 0], est.dynamics_cov[0, 0]], float)
    ref = np.sqrt(np.diag(np.linalg.inv(-_fd_hessian(mod.loglike, theta))))
    np.testing.assert_allclose(ours, ref, rtol=1e-4)
    # fixed entries (including the zero variance) are NaN, not a transform of 0
    assert np.isnan(se.dynamics_weights[1]).all() and np.isnan(se.dynamics_cov[1, 1])
    assert np.isnan(se.emission_weights).all()
    table = ss.summary(model, est, y, trainable=tr)
    assert table.num_params == 4
    assert table.names.index("dynamics_weights[1,0]") >= 0
    free = dict(zip(table.names, table.trainable, strict=True))
    assert free["dynamics_weights[0,1]"] and not free["dynamics_weights[1,0]"]
    assert not free["dynamics_cov[1,1]"] and free["dynamics_cov[0,0]"]
    # q fixed as a whole singular leaf: still finite standard errors for the rest
    tr_q = tr._replace(dynamics_cov=False)
    se_q = ss.standard_errors(model, est, y, trainable=tr_q)
    assert np.isfinite(se_q.dynamics_weights[0]).all() and np.isnan(se_q.dynamics_cov).all()


def test_tied_standard_errors_equal_a_batch_of_independent_copies():
    """Two independent AR(1) + noise series with tied coefficients and variances have the
    log-likelihood of one univariate model on a batch of two series, as a function of the
    same three free values: the same Hessian, so the same standard errors."""
    uni = ss.LinearGaussianSSM(state_dim=1, emission_dim=None)
    pu = uni.default_params()._replace(dynamics_weights=jnp.array([[0.7]]))
    y = np.stack([np.asarray(ss.sample(uni, pu, num_timesteps=80, key=jax.random.key(s)))
                  for s in (11, 12)])
    tr_u = jax.tree.map(lambda _: False, pu)._replace(
        dynamics_weights=True, dynamics_cov=True, emission_cov=True)
    est = ss.fit_lbfgs(uni, pu, y, trainable=tr_u, progress=False).params
    se_u = ss.standard_errors(uni, est, y, trainable=tr_u)

    biv = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    eye = jnp.eye(2)
    pb = biv.default_params()._replace(
        dynamics_weights=est.dynamics_weights[0, 0] * eye, emission_weights=eye,
        dynamics_cov=est.dynamics_cov[0, 0] * eye, emission_cov=est.emission_cov[0, 0] * eye,
        initial_cov=est.initial_cov[0, 0] * eye)
    diag = np.eye(2, dtype=bool)
    tr_b = jax.tree.map(lambda _: False, pb)._replace(
        dynamics_weights=diag, dynamics_cov=diag, emission_cov=diag)
    labels = np.where(diag, 0, -1)
    ties = jax.tree.map(lambda _: None, pb)._replace(
        dynamics_weights=labels, dynamics_cov=labels + 2 * diag, emission_cov=labels + 4 * diag)
    se_b = ss.standard_errors(biv, pb, y.T, trainable=tr_b, ties=ties)
    for leaf_b, leaf_u in ((se_b.dynamics_weights, se_u.dynamics_weights),
                           (se_b.dynamics_cov, se_u.dynamics_cov),
                           (se_b.emission_cov, se_u.emission_cov)):
        np.testing.assert_allclose(np.diag(leaf_b), float(leaf_u[0, 0]), rtol=1e-7)
        assert np.isnan(leaf_b[0, 1])
    table = ss.summary(biv, pb, y.T, trainable=tr_b, ties=ties)
    assert table.num_params == 3
