"""fit_nuts / fit_svi with fixed entries in simplex rows (a structural zero and a fixed
probability in a transition row): the free entries of the row are a scaled Dirichlet over
the mass the fixed entries leave. Fixed entries are bit-equal in every draw, and the
posterior of the one free coordinate matches numerical quadrature of the exact posterior
(likelihood by the forward filter, the conditional Dirichlet prior by hand)."""

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


def _quadrature(model, p, y):
    x, w = roots_legendre(200)
    q = 0.5 * _REST * (x + 1.0)
    lp = _log_post(model, p, y, q)
    dens = w * np.exp(lp - lp.max())
    mean = float(dens @ q / dens.sum())
    sd = float(np.sqrt(dens @ (q - mean) ** 2 / dens.sum()))
    return mean, sd


def test_nuts_with_a_fixed_transition_entry_matches_quadrature():
    model, p, y, tr, priors = _problem()
    idata = ss.fit_nuts(model, y, key=jax.random.key(1), init_params=p, trainable=tr,
                        priors=priors, num_warmup=300, num_samples=500, num_chains=2,
                        progress=False)
    draws = ss.posterior_params(model, idata).transitions  # (chain, draw, 3, 3)
    assert np.all(np.asarray(draws[..., 0, 1]) == 0.1)  # fixed: bit-equal in every draw
    assert np.all(np.asarray(draws[..., 1:, :]) == np.asarray(p.transitions[1:]))
    np.testing.assert_allclose(np.asarray(draws.sum(-1)), 1.0, atol=1e-14)
    q = np.asarray(draws[..., 0, 0])
    mean, sd = _quadrature(model, p, y)
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
    q = np.linspace(1e-4, _REST - 1e-4, 8999)
    mode = q[np.argmax(_log_post(model, p, y, q))]
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
    ties = jax.tree.map(lambda _: None, p)._replace(
        transitions=np.array([[0, -1, 0], [-1] * 3, [-1] * 3]))
    with pytest.raises(ValueError, match="elementwise"):
        ss.fit_nuts(model, y, key=jax.random.key(0), init_params=p, ties=ties,
                    num_warmup=2, num_samples=2)
    # covariance entries are not sampled entry by entry
    g = ss.GaussianHMM(num_states=2, emission_dim=2, covariance="tied")
    yg = np.random.default_rng(0).normal(size=(30, 2))
    pg = g.initialize(yg, key=jax.random.key(0))
    trg = jax.tree.map(lambda _: True, pg)._replace(emissions=pg.emissions._replace(
        means=True, cov=np.array([[True, False], [False, True]])))
    with pytest.raises(ValueError, match="only of elementwise leaves"):
        ss.fit_nuts(g, yg, key=jax.random.key(0), init_params=pg, trainable=trg,
                    num_warmup=2, num_samples=2)
