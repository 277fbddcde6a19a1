"""fit_nuts / fit_svi with tied simplex entries and tied covariance variances.

A symmetric 2-state chain whose one switching probability ``p = A[0, 1] = A[1, 0]`` is
sampled (everything else fixed). The prior is the Dirichlet kernel of the rows restricted
to the tied set, a density in ``p`` proportional to ``p^(a01 + a10 - 2) (1 - p)^(a00 + a11
- 2)``; the NUTS posterior of ``p`` is compared with numerical quadrature of the exact
posterior (likelihood by the forward filter), the delta guide with the MAP on a grid and
with restricted L-BFGS. Tied variances ``emission_cov = v I`` get the whole covariance
prior at ``v I`` as their density."""

import functools

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy.special import roots_legendre

import statseq as ss
from statseq.models.hmm.categorical import CategoricalEmissions

_CONC = np.array([[2.0, 3.0], [1.5, 2.5]])
# the exact posterior of p is evaluated on Gauss-Legendre nodes (quadrature, NUTS check)
# and on a grid of step 1e-4 (its mode, delta-guide check)
_NODES, _WEIGHTS = roots_legendre(200)
_Q_NODES = 0.5 * (_NODES + 1.0)
_Q_GRID = np.linspace(1e-4, 1 - 1e-4, 9999)


@functools.cache
def _problem():
    model = ss.CategoricalHMM(num_states=2, num_classes=2)
    a = jnp.array([[0.7, 0.3], [0.2, 0.8]])  # the tie starts at (0.3 + 0.2) / 2
    p = model.assemble_params(CategoricalEmissions(jnp.array([[0.85, 0.15], [0.2, 0.8]])), a)
    truth = p._replace(transitions=jnp.array([[0.85, 0.15], [0.15, 0.85]]))
    y = np.asarray(ss.sample(model, truth, num_timesteps=80, key=jax.random.key(0)))
    tr = jax.tree.map(lambda _: False, p)._replace(transitions=True)
    ties = jax.tree.map(lambda _: None, p)._replace(transitions=np.array([[-1, 0], [0, -1]]))
    priors = jax.tree.map(lambda _: None, p)._replace(
        transitions=dist.Dirichlet(jnp.asarray(_CONC)))
    return model, p, y, tr, ties, priors


def _log_post(model, p, y, q):
    def one(v):
        return ss.log_prob(model, p._replace(transitions=jnp.array([[1 - v, v], [v, 1 - v]])),
                           y)

    ll = np.asarray(jax.vmap(one)(jnp.asarray(q)))
    return (ll + (_CONC[0, 1] + _CONC[1, 0] - 2) * np.log(q)
            + (_CONC[0, 0] + _CONC[1, 1] - 2) * np.log1p(-q))


@functools.cache
def _log_post_tables():
    """`_log_post` on `_Q_NODES` and on `_Q_GRID`, in one vmapped evaluation (one
    compiled program for both tests instead of one per grid size)."""
    model, p, y, *_ = _problem()
    lp = _log_post(model, p, y, np.concatenate([_Q_NODES, _Q_GRID]))
    return lp[: len(_Q_NODES)], lp[len(_Q_NODES):]


def test_nuts_with_a_tied_switching_probability_matches_quadrature():
    model, p, y, tr, ties, priors = _problem()
    # (log_likelihood=False: the pointwise group is not read here, and it would be one
    # more compiled program)
    idata = ss.fit_nuts(model, y, key=jax.random.key(1), init_params=p, trainable=tr,
                        ties=ties, priors=priors, num_warmup=150, num_samples=300,
                        num_chains=2, progress=False, log_likelihood=False)
    draws = np.asarray(ss.posterior_params(model, idata).transitions)  # (2, 300, 2, 2)
    assert np.all(draws[..., 0, 1] == draws[..., 1, 0])  # tied: equal in every draw
    np.testing.assert_allclose(draws.sum(-1), 1.0, atol=1e-14)
    q, lp = _Q_NODES, _log_post_tables()[0]
    dens = _WEIGHTS * np.exp(lp - lp.max())
    mean = float(dens @ q / dens.sum())
    sd = float(np.sqrt(dens @ (q - mean) ** 2 / dens.sum()))
    ess = float(np.min(az.ess(idata, var_names=["transitions"])["transitions"].values))
    assert ess > 150
    d = draws[..., 0, 1]
    assert abs(d.mean() - mean) < 4 * sd / np.sqrt(ess)
    assert abs(d.std() - sd) < 0.2 * sd


def test_svi_delta_with_a_tied_switching_probability_finds_the_map():
    model, p, y, tr, ties, priors = _problem()
    res = ss.fit_svi(model, y, key=jax.random.key(2), init_params=p, trainable=tr,
                     ties=ties, priors=priors, guide="delta", num_steps=1500, num_samples=3)
    a = np.asarray(res.draws.transitions)
    assert np.all(a[:, 0, 1] == a[:, 1, 0])
    mode = _Q_GRID[np.argmax(_log_post_tables()[1])]
    np.testing.assert_allclose(a[:, 0, 1], np.full(3, mode), atol=2e-4)
    lb = ss.fit_lbfgs(model, p, y, trainable=tr, ties=ties, priors=priors, progress=False)
    np.testing.assert_allclose(a[:, 0, 1], float(lb.params.transitions[0, 1]), atol=1e-5)


def test_sampler_simplex_ties_bad_input():
    model, p, y, tr, ties, priors = _problem()
    with pytest.raises(ValueError, match="every free entry of this simplex row is tied"):
        ss.fit_nuts(model, y, key=jax.random.key(0), init_params=p, trainable=tr,
                    ties=ties._replace(transitions=np.array([[0, 1], [-1, -1]])),
                    num_warmup=2, num_samples=2)
    with pytest.raises(ValueError, match="simplex ties stay within one leaf"):
        ss.fit_nuts(model, y, key=jax.random.key(0), init_params=p,
                    ties=ties._replace(initial_probs=np.array([0, -1])),
                    num_warmup=2, num_samples=2)


def _cov_problem():
    """A 2-d local level observed with equal noise variances: ``emission_cov = v I`` with the
    two variances tied (off-diagonal fixed at 0), everything else fixed."""
    model = ss.LinearGaussianSSM(state_dim=1, emission_dim=2)
    p = model.default_params()._replace(emission_weights=jnp.ones((2, 1)),
                                        emission_cov=jnp.diag(jnp.array([0.6, 0.9])))
    truth = p._replace(emission_cov=0.5 * jnp.eye(2))
    y = np.asarray(ss.sample(model, truth, num_timesteps=40, key=jax.random.key(5)))
    tr = jax.tree.map(lambda _: False, p)._replace(emission_cov=np.eye(2, dtype=bool))
    ties = jax.tree.map(lambda _: None, p)._replace(
        emission_cov=np.where(np.eye(2, dtype=bool), 0, -1))
    return model, p, y, tr, ties


def test_tied_covariance_variances_nuts_matches_quadrature():
    """The density put on the tied variance ``v`` is the whole covariance prior at ``v I``:
    NUTS against quadrature of ``log p(y | v) + log prior(v I)``."""
    model, p, y, tr, ties = _cov_problem()
    priors = ss.bayes.default_priors(model, y)
    idata = ss.fit_nuts(model, y, key=jax.random.key(3), init_params=p, trainable=tr,
                        ties=ties, priors=priors, num_warmup=100, num_samples=400,
                        num_chains=1, progress=False, log_likelihood=False)
    cov = np.asarray(ss.posterior_params(model, idata).emission_cov)
    assert np.all(cov[..., 0, 0] == cov[..., 1, 1]) and np.all(cov[..., 0, 1] == 0.0)
    prior = priors.emission_cov

    def log_post(v):
        c = v * jnp.eye(2)
        return ss.log_prob(model, p._replace(emission_cov=c), y) + prior.log_prob(c)

    x, w = roots_legendre(200)
    v = 0.05 + 1.95 * 0.5 * (x + 1.0)  # the posterior mass lies well inside (0.05, 2)
    lp = np.asarray(jax.vmap(log_post)(jnp.asarray(v)))
    dens = w * np.exp(lp - lp.max())
    assert dens[0] < 1e-12 * dens.max() and dens[-1] < 1e-12 * dens.max()
    mean = float(dens @ v / dens.sum())
    sd = float(np.sqrt(dens @ (v - mean) ** 2 / dens.sum()))
    d = cov[..., 0, 0]
    ess = float(az.ess(idata, var_names=["tied.0"])["tied.0"].values)
    assert ess > 100
    assert abs(d.mean() - mean) < 4 * sd / np.sqrt(ess)
    assert abs(d.std() - sd) < 0.2 * sd


def test_tied_covariance_variances_delta_guide_finds_the_restricted_map():
    model, p, y, tr, ties = _cov_problem()
    priors = ss.bayes.default_priors(model, y)
    res = ss.fit_svi(model, y, key=jax.random.key(2), init_params=p, trainable=tr,
                     ties=ties, priors=priors, guide="delta", num_steps=700, num_samples=2)
    lb = ss.fit_lbfgs(model, p, y, trainable=tr, ties=ties, priors=priors, progress=False)
    np.testing.assert_allclose(np.asarray(res.draws.emission_cov)[0],
                               np.asarray(lb.params.emission_cov), atol=1e-4)
