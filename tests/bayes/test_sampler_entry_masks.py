"""fit_nuts / fit_svi with fixed entries in simplex rows (a structural zero and a fixed
probability in a transition row) and in covariance matrices. The free entries of a row are
a scaled Dirichlet over the mass the fixed entries leave; fixed entries are bit-equal in
every draw, and the posterior of the one free coordinate matches numerical quadrature of
the exact posterior (likelihood by the forward filter, the conditional Dirichlet prior by
hand). A covariance's free block is ``L L^T``: its Jacobian against autodiff, the
point-mass (delta) guide against the L-BFGS MAP under the same prior."""

import functools

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.distributions.transforms import StickBreakingTransform
from scipy.special import roots_legendre

import statseq as ss
from statseq.models.hmm.categorical import CategoricalEmissions

# row 0 of A: (p, 0.1 fixed, 0.9 - p); every other parameter fixed
_CONC = np.array([[3.0, 1.0, 2.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
_REST = 0.9
# the exact posterior of q = A[0, 0] is evaluated on Gauss-Legendre nodes (quadrature, NUTS
# check) and on a grid of step 1e-4 (its mode, delta-guide check)
_NODES, _WEIGHTS = roots_legendre(200)
_Q_NODES = 0.5 * _REST * (_NODES + 1.0)
_Q_GRID = np.linspace(1e-4, _REST - 1e-4, 8999)


@functools.cache
def _problem():
    model = ss.CategoricalHMM(num_states=3, num_classes=2)
    a = jnp.array([[0.5, 0.1, 0.4], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    p = model.assemble_params(CategoricalEmissions(
        jnp.array([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9]])), a)
    y = np.asarray(ss.sample(model, p, num_timesteps=60, key=jax.random.key(0)))
    tr = jax.tree.map(lambda _: False, p)._replace(
        transitions=np.array([[True, False, True], [False] * 3, [False] * 3]))
    priors = jax.tree.map(lambda _: None, p)._replace(
        transitions=dist.Dirichlet(jnp.asarray(_CONC)))
    return model, p, y, tr, priors


def _log_post(model, p, y, q):
    """Exact log posterior density of ``q = A[0, 0]`` (up to a constant) on a grid."""
    def one(v):
        a = p.transitions.at[0, 0].set(v).at[0, 2].set(_REST - v)
        return ss.log_prob(model, p._replace(transitions=a), y)

    ll = np.asarray(jax.vmap(one)(jnp.asarray(q)))
    # Dirichlet(3, 1, 2) given A[0, 1] = 0.1: density of q proportional to q^2 (0.9 - q)^1
    return ll + (_CONC[0, 0] - 1) * np.log(q) + (_CONC[0, 2] - 1) * np.log(_REST - q)


@functools.cache
def _log_post_tables():
    """`_log_post` on `_Q_NODES` and on `_Q_GRID`, in one vmapped evaluation (one
    compiled program for both tests instead of one per grid size)."""
    model, p, y, *_ = _problem()
    lp = _log_post(model, p, y, np.concatenate([_Q_NODES, _Q_GRID]))
    return lp[: len(_Q_NODES)], lp[len(_Q_NODES):]


def _quadrature():
    q, lp = _Q_NODES, _log_post_tables()[0]
    dens = _WEIGHTS * np.exp(lp - lp.max())
    mean = float(dens @ q / dens.sum())
    sd = float(np.sqrt(dens @ (q - mean) ** 2 / dens.sum()))
    return mean, sd


def test_nuts_with_a_fixed_transition_entry_matches_quadrature():
    model, p, y, tr, priors = _problem()
    idata = ss.fit_nuts(model, y, key=jax.random.key(1), init_params=p, trainable=tr,
                        priors=priors, num_warmup=300, num_samples=500, num_chains=2,
                        progress=False, log_likelihood=False)  # (that group is not read)
    draws = ss.posterior_params(model, idata).transitions  # (chain, draw, 3, 3)
    assert np.all(np.asarray(draws[..., 0, 1]) == 0.1)  # fixed: bit-equal in every draw
    assert np.all(np.asarray(draws[..., 1:, :]) == np.asarray(p.transitions[1:]))
    np.testing.assert_allclose(np.asarray(draws.sum(-1)), 1.0, atol=1e-14)
    q = np.asarray(draws[..., 0, 0])
    mean, sd = _quadrature()
    ess = float(az.ess(idata, var_names=["transitions"])["transitions"].values[0])
    assert ess > 200
    # Monte Carlo error of the mean: sd / sqrt(ESS); 4 of them
    assert abs(q.mean() - mean) < 4 * sd / np.sqrt(ess)
    assert abs(q.std() - sd) < 0.15 * sd


def test_svi_delta_with_a_fixed_transition_entry_finds_the_map():
    """``guide="delta"`` is a point mass at the posterior mode of the constrained free
    entry (the density of the sites has no Jacobian under a point mass): the L-BFGS MAP
    under the same Dirichlet prior (whose full-row density at ``(q, 0.1, 0.9 - q)`` is
    the conditional one up to a constant) and the argmax of the exact log posterior on a
    grid of step 1e-4."""
    model, p, y, tr, priors = _problem()
    res = ss.fit_svi(model, y, key=jax.random.key(2), init_params=p, trainable=tr,
                     priors=priors, guide="delta", num_steps=1500, num_samples=5)
    a = np.asarray(res.draws.transitions)
    assert np.all(a[:, 0, 1] == 0.1) and np.all(a[:, 1:] == np.asarray(p.transitions[1:]))
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-14)
    lb = ss.fit_lbfgs(model, p, y, trainable=tr, priors=priors, progress=False)
    np.testing.assert_allclose(a[:, 0], np.broadcast_to(lb.params.transitions[0], (5, 3)),
                               atol=1e-5)
    mode = _Q_GRID[np.argmax(_log_post_tables()[1])]
    np.testing.assert_allclose(a[:, 0, 0], np.full(5, mode), atol=2e-4)


def test_sampler_simplex_entries_bad_input():
    model, p, y, tr, priors = _problem()
    logistic_normal = dist.TransformedDistribution(
        dist.Normal(jnp.zeros(2), 1.0).to_event(1), StickBreakingTransform()).expand((3,))
    with pytest.raises(ValueError, match="must be a Dirichlet"):
        ss.fit_svi(model, y, key=jax.random.key(0), init_params=p, trainable=tr,
                   priors=priors._replace(transitions=logistic_normal), num_steps=2)
    bad = tr._replace(transitions=np.array([[False, True, True], [False] * 3, [False] * 3]))
    full = p._replace(transitions=p.transitions.at[0].set(jnp.array([1.0, 0.0, 0.0])))
    with pytest.raises(ValueError, match="leaving no probability"):
        ss.fit_nuts(model, y, key=jax.random.key(0), init_params=full, trainable=bad,
                    num_warmup=2, num_samples=2)
    # a covariance pattern L L^T cannot reach, and a fixed zero variance
    g = ss.LinearGaussianSSM(state_dim=1, emission_dim=3)
    pg = g.default_params()
    yg = np.random.default_rng(0).normal(size=(20, 3))
    # tied variances need their covariances fixed (as in restrict)
    ties = jax.tree.map(lambda _: None, pg)._replace(
        emission_cov=np.where(np.eye(3, dtype=bool), 0, -1))
    with pytest.raises(ValueError, match="covariances fixed"):
        ss.fit_nuts(g, yg, key=jax.random.key(0), init_params=pg, ties=ties,
                    num_warmup=2, num_samples=2)
    chain = np.array([[True, True, False], [True, True, True], [False, True, True]])
    with pytest.raises(ValueError, match="block-diagonal"):
        ss.fit_nuts(g, yg, key=jax.random.key(0), init_params=pg,
                    trainable=jax.tree.map(lambda _: False, pg)._replace(emission_cov=chain),
                    num_warmup=2, num_samples=2)
    g2 = ss.LinearGaussianSSM(state_dim=2, emission_dim=3)
    zero = g2.default_params()._replace(dynamics_cov=jnp.diag(jnp.array([1.0, 0.0])))
    with pytest.raises(ValueError, match="fixed variances positive"):
        ss.fit_nuts(g2, yg, key=jax.random.key(0), init_params=zero,
                    trainable=jax.tree.map(lambda _: False, zero)._replace(
                        dynamics_cov=np.diag([True, False])),
                    num_warmup=2, num_samples=2)


def _cov_problem():
    """A 3-dimensional emission covariance with a free 2x2 block, zero covariances with
    the third coordinate and its variance fixed at 0.5; every other parameter fixed."""
    model = ss.LinearGaussianSSM(state_dim=1, emission_dim=3)
    cov = jnp.array([[1.0, 0.4, 0.0], [0.4, 0.8, 0.0], [0.0, 0.0, 0.5]])
    p = model.default_params()._replace(dynamics_weights=jnp.array([[0.7]]),
                                        emission_weights=jnp.ones((3, 1)), emission_cov=cov)
    y = np.asarray(ss.sample(model, p, num_timesteps=40, key=jax.random.key(3)))
    mask = np.array([[True, True, False], [True, True, False], [False, False, False]])
    tr = jax.tree.map(lambda _: False, p)._replace(emission_cov=mask)
    return model, p, y, tr


def test_block_covariance_transform_jacobian_and_inverse():
    from numpyro.distributions.transforms import biject_to

    from statseq.bayes._pieces import covariance_site

    cov = np.array([[2.0, 0.3, 0, 0], [0.3, 1.0, 0, 0], [0, 0, 1.5, 0], [0, 0, 0, 0.7]])
    mask = np.zeros((4, 4), bool)
    mask[:2, :2] = True
    mask[2, 2] = True
    site, support = covariance_site("cov", cov, mask)
    assert site.sum() == 4  # (0,0), (1,0), (1,1), (2,2)
    t = biject_to(support)
    x = t.inv(jnp.asarray(cov[site])) + jnp.array([0.1, -0.2, 0.3, 0.05])
    np.testing.assert_allclose(np.asarray(t(t.inv(jnp.asarray(cov[site])))), cov[site],
                               atol=1e-14)
    # log |det| of the square map x -> free entries, against autodiff
    jac = np.asarray(jax.jacfwd(t)(x))
    np.testing.assert_allclose(float(t.log_abs_det_jacobian(x, t(x))),
                               np.log(abs(np.linalg.det(jac))), rtol=1e-12)


def test_covariance_with_fixed_entries_svi_map_and_nuts_draws():
    model, p, y, tr = _cov_problem()
    # 700 Adam steps already reach the L-BFGS MAP to 4e-10 (as 1500 did), well inside 1e-4
    res = ss.fit_svi(model, y, key=jax.random.key(2), init_params=p, trainable=tr,
                     guide="delta", num_steps=700, num_samples=3)
    lb = ss.fit_lbfgs(model, p, y, trainable=tr, priors=ss.bayes.default_priors(model, y),
                      progress=False)
    cov = np.asarray(res.draws.emission_cov)
    np.testing.assert_allclose(cov[0], np.asarray(lb.params.emission_cov), atol=1e-4)
    assert np.all(cov[:, 2, :2] == 0.0) and np.all(cov[:, :2, 2] == 0.0)
    assert np.all(cov[:, 2, 2] == 0.5)
    # the draws' checks below are structural (fixed entries bit-equal, symmetric, positive
    # definite, the free entry moves): they hold for any number of draws, so a short chain
    idata = ss.fit_nuts(model, y, key=jax.random.key(4), init_params=p, trainable=tr,
                        num_warmup=50, num_samples=50, num_chains=1, progress=False,
                        log_likelihood=False)
    draws = np.asarray(ss.posterior_params(model, idata).emission_cov)  # (1, 50, 3, 3)
    assert np.all(draws[..., 2, :2] == 0.0) and np.all(draws[..., 2, 2] == 0.5)
    assert np.all(draws == np.swapaxes(draws, -1, -2))
    assert np.all(np.linalg.eigvalsh(draws) > 0)
    assert np.std(draws[..., 0, 1]) > 0  # the free covariance moves
