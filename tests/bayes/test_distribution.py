"""SequenceDistribution, default priors, LKJCovariance, relabelling and posterior
predictive forecasts: each against an independent computation."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.util import log_density

import statseq as ss
from statseq.bayes import (
    LKJCovariance,
    SequenceDistribution,
    default_priors,
    permute_states,
    posterior_predictive_forecast,
    relabel_states,
)
from statseq.models.hmm.poisson import PoissonEmissions


def _hmm_params(rates, stick=0.8):
    model = ss.PoissonHMM(num_states=len(rates))
    p = model.assemble_params(PoissonEmissions(jnp.asarray(rates, float)))
    return model, p._replace(transitions=model.default_transitions(stick))


def test_log_prob_is_the_models_log_likelihood_with_masks_and_inputs():
    model = ss.AR(order=1, input_dim=1)
    params = model.default_params()
    rng = np.random.default_rng(0)
    y, u = rng.normal(size=(3, 12)), rng.normal(size=(3, 12, 1))
    mask = rng.random((3, 12)) > 0.3
    mask[:, 0] = True  # a conditional AR(1) conditions on the first value
    d = SequenceDistribution(model, params, mask=mask, inputs=u)
    assert d.batch_shape == (3,) and d.event_shape == (12,)
    expected = ss.log_prob(model, params, y, mask=mask, inputs=u)
    np.testing.assert_allclose(d.log_prob(np.where(mask, y, np.nan)), expected, rtol=1e-12)


def test_batched_params_score_each_sequence_with_its_own_parameters():
    model = ss.LocalLevel()
    draws = ss.LocalLevelParams(jnp.array([1.0, 2.0, 0.5]), jnp.array([0.1, 0.3, 1.0]))
    y = np.random.default_rng(1).normal(size=(3, 20)).cumsum(axis=1)
    d = SequenceDistribution(model, draws, num_timesteps=20)
    assert d.batch_shape == (3,)
    loop = [ss.log_prob(model, ss.LocalLevelParams(draws.obs_var[i], draws.level_var[i]), y[i])
            for i in range(3)]
    np.testing.assert_allclose(d.log_prob(y), loop, rtol=1e-12)
    # one sequence under every draw (value broadcast against the batch)
    loop0 = [ss.log_prob(model, ss.LocalLevelParams(draws.obs_var[i], draws.level_var[i]), y[0])
             for i in range(3)]
    np.testing.assert_allclose(d.log_prob(y[0]), loop0, rtol=1e-12)
    # and jit/grad go through
    g = jax.grad(lambda v: SequenceDistribution(
        model, ss.LocalLevelParams(v, 0.2), num_timesteps=20).log_prob(y[0]))(1.0)
    assert np.isfinite(g)


def test_inside_a_numpyro_model_with_a_hierarchical_prior():
    """log_density of a user-written hierarchical model = priors + statseq log-likelihoods."""
    model, _ = _hmm_params([1.0, 5.0])
    y = np.array([[0, 1, 7, 6, 5, 0], [2, 1, 0, 9, 8, 4]])

    def hierarchical(y):
        mu = numpyro.sample("mu", dist.Normal(1.0, 1.0))
        with numpyro.plate("group", 2):
            low = numpyro.sample("low", dist.LogNormal(mu, 0.5))
        rates = jnp.stack([low, low + 4.0], -1)
        params = ss.HMMParams(jnp.array([0.5, 0.5]), model.default_transitions(0.8),
                              PoissonEmissions(rates))
        numpyro.sample("y", SequenceDistribution(model, params, num_timesteps=6), obs=y)

    values = {"mu": 0.7, "low": jnp.array([1.2, 0.8])}
    lp, _ = log_density(hierarchical, (y,), {}, values)
    expected = dist.Normal(1.0, 1.0).log_prob(0.7) + dist.LogNormal(0.7, 0.5).log_prob(
        values["low"]).sum()
    for i in range(2):
        p = ss.HMMParams(jnp.array([0.5, 0.5]), model.default_transitions(0.8),
                         PoissonEmissions(jnp.array([values["low"][i], values["low"][i] + 4])))
        expected += ss.log_prob(model, p, y[i])
    np.testing.assert_allclose(lp, expected, rtol=1e-12)


def test_sample_has_the_models_marginal_law():
    """Poisson HMM started from its initial law: E[y_t] = (pi A^{t-1}) . rates."""
    model, params = _hmm_params([1.0, 6.0], stick=0.7)
    params = params._replace(initial_probs=jnp.array([0.9, 0.1]))
    d = SequenceDistribution(model, params, num_timesteps=4)
    ys = np.asarray(d.sample(jax.random.key(0), (20000,)), float)
    assert ys.shape == (20000, 4)
    probs = np.array([0.9, 0.1])
    for t in range(4):
        mean = probs @ np.array([1.0, 6.0])
        var = probs @ (np.array([1.0, 6.0]) + np.array([1.0, 6.0]) ** 2) - mean ** 2
        assert abs(ys[:, t].mean() - mean) < 4.5 * math.sqrt(var / 20000)
        probs = probs @ np.asarray(params.transitions)


def test_distribution_validates_its_arguments():
    with pytest.raises(ValueError, match="num_timesteps"):
        SequenceDistribution(ss.LocalLevel(), ss.LocalLevel().default_params())
    with pytest.raises(ValueError, match="inputs"):
        SequenceDistribution(ss.AR(order=1, input_dim=1), ss.AR(order=1, input_dim=1)
                             .default_params(), num_timesteps=5)
    with pytest.raises(ValueError, match="broadcast"):
        SequenceDistribution(ss.LocalLevel(), ss.LocalLevelParams(jnp.ones(2), jnp.ones(3)),
                             num_timesteps=5)
    d = SequenceDistribution(ss.LocalLevel(), ss.LocalLevel().default_params(), num_timesteps=5)
    with pytest.raises(ValueError, match="event shape"):
        d.log_prob(np.zeros(4))


@pytest.mark.parametrize("dim", [2, 3])
def test_lkj_covariance_density_is_the_change_of_variables(dim):
    """log p(Sigma) = log LKJ(C) + log HalfNormal(s) - log|d Sigma / d(s, C)|, with the
    Jacobian of (s, lower C) -> lower Sigma computed by autodiff."""
    scale = jnp.arange(1.0, dim + 1.0)
    prior = LKJCovariance(dim, scale, concentration=1.5)
    cov = jax.jit(prior.sample)(jax.random.key(3))
    rows, cols = np.tril_indices(dim, -1)

    def to_cov(z):
        s, c = z[:dim], z[dim:]
        C = jnp.eye(dim).at[rows, cols].set(c).at[cols, rows].set(c)
        S = s[:, None] * C * s[None, :]
        return jnp.concatenate([jnp.diag(S), S[rows, cols]])

    @jax.jit
    def both(cov):
        sd = jnp.sqrt(jnp.diag(cov))
        corr = cov / jnp.outer(sd, sd)
        z = jnp.concatenate([sd, corr[rows, cols]])
        log_jac = jnp.linalg.slogdet(jax.jacfwd(to_cov)(z))[1]
        expected = (dist.LKJ(dim, 1.5).log_prob(corr)
                    + dist.HalfNormal(scale).log_prob(sd).sum() - log_jac)
        return prior.log_prob(cov), expected

    got, expected = both(cov)
    assert np.isfinite(got)
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def _prior_params(priors):
    """The numbers that define each prior leaf (for comparing two priors pytrees)."""
    out = []
    for leaf in jax.tree.leaves(priors, is_leaf=lambda x: isinstance(x, dist.Distribution)):
        out.append((type(leaf).__name__, leaf.batch_shape, leaf.event_shape,
                    [np.asarray(getattr(leaf, k)) for k in sorted(leaf.arg_constraints)
                     if k in vars(leaf)]))
    return out


def _assert_same_priors(a, b):
    pa, pb = _prior_params(a), _prior_params(b)
    assert len(pa) == len(pb) > 0
    for (na, ba, ea, va), (nb, bb, eb, vb) in zip(pa, pb, strict=True):
        assert (na, ba, ea) == (nb, bb, eb)
        for x, z in zip(va, vb, strict=True):
            np.testing.assert_array_equal(x, z)


@pytest.mark.parametrize("model", [
    ss.PoissonHMM(num_states=2), ss.GaussianHMM(num_states=2, emission_dim=2),
    ss.GaussianHMM(num_states=2, emission_dim=2, covariance="diagonal"), ss.LocalLevel(),
    ss.AR(order=2), ss.GRU(hidden_dim=3), ss.ElmanRNN(hidden_dim=2, emission="poisson")],
    ids=lambda m: type(m).__name__)
def test_default_priors_do_not_look_at_the_data(model):
    """The issue: data-scaled priors (centred at the sample variance). The defaults must be
    the same for ``y`` and ``1000 y`` (and without ``y``): only ``scale`` sets them."""
    rng = np.random.default_rng(0)
    shape = (40,) + tuple(model.event_shape)
    y = rng.poisson(7.0, size=shape) if model.observation_dtype == "count" else (
        rng.normal(3.0, 2.0, size=shape))
    base = default_priors(model, y)
    _assert_same_priors(base, default_priors(model, 1000 * y))
    _assert_same_priors(base, default_priors(model))
    _assert_same_priors(base, default_priors(model, y, mask=np.arange(40) < 5))
    _assert_same_priors(default_priors(model, scale=3.0), default_priors(model, y, scale=3.0))


def test_default_priors_are_the_documented_table():
    """The table in `statseq.bayes.priors` at scale c: Dirichlet(1) rows,
    LogNormal(log c, 2) rates of counts, LogNormal(2 log c, 2) variances of real data,
    Normal(0, 2 max(1, c)) real leaves, LKJ(2) with half-normal(2 c) scales."""
    for c in (1.0, 0.3, 20.0):
        p = default_priors(ss.PoissonHMM(num_states=2), scale=c)
        assert isinstance(p.initial_probs, dist.Dirichlet)
        assert isinstance(p.transitions, dist.Dirichlet) and p.transitions.batch_shape == (2,)
        np.testing.assert_array_equal(p.transitions.concentration, np.ones((2, 2)))
        assert isinstance(p.emissions.rates, dist.LogNormal)
        np.testing.assert_allclose(p.emissions.rates.loc, np.full(2, np.log(c)), rtol=1e-15)
        np.testing.assert_allclose(p.emissions.rates.scale, 2.0)
        ll = default_priors(ss.LocalLevel(), scale=c)
        for v in ll:
            np.testing.assert_allclose(v.loc, 2 * np.log(c), rtol=1e-15)
            np.testing.assert_allclose(v.scale, 2.0)
        ar = default_priors(ss.AR(order=2), scale=c)
        reals = [leaf for leaf in jax.tree.leaves(
            ar, is_leaf=lambda x: isinstance(x, dist.Distribution))
            if isinstance(leaf, dist.Normal)]
        assert reals
        for leaf in reals:
            np.testing.assert_allclose(leaf.loc, 0.0)
            np.testing.assert_allclose(leaf.scale, 2 * max(1.0, c))
        g = default_priors(ss.GaussianHMM(num_states=2, emission_dim=2), scale=c)
        assert isinstance(g.emissions.covs, LKJCovariance)
        assert g.emissions.covs.batch_shape == (2,)
        np.testing.assert_allclose(g.emissions.covs.scale, np.full((2, 2), 2 * c))
        np.testing.assert_allclose(g.emissions.covs.concentration, 2.0)
        np.testing.assert_allclose(g.emissions.means.loc, 0.0)
        np.testing.assert_allclose(g.emissions.means.scale, 2 * c)
        gd = default_priors(ss.GaussianHMM(num_states=2, emission_dim=2,
                                           covariance="diagonal"), scale=c)
        np.testing.assert_allclose(gd.emissions.variances.loc, np.full((2, 2), 2 * np.log(c)))
        b = default_priors(ss.BernoulliHMM(num_states=2, emission_dim=1), scale=c)
        assert isinstance(b.emissions.probs, dist.Beta)
        np.testing.assert_array_equal(b.emissions.probs.concentration1, 1.0)
        np.testing.assert_array_equal(b.emissions.probs.concentration0, 1.0)
    # the documented 95% span of LogNormal(log c, 2): a factor e^(1.96 * 2) ~ 50 each way
    rates = default_priors(ss.PoissonHMM(num_states=1), scale=20.0).emissions.rates
    np.testing.assert_allclose(float(rates.icdf(0.975)[0]) / 20.0, np.exp(1.959964 * 2),
                               rtol=1e-6)
    # input-driven transitions: logit-scale priors whatever the scale
    gi = default_priors(ss.PoissonHMM(num_states=2, input_dim=1), scale=50.0)
    assert gi.transitions.weights.scale == 1.0 and gi.transitions.bias.scale == 2.0
    assert isinstance(gi.initial_probs, dist.Dirichlet)
    for bad in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="scale"):
            default_priors(ss.LocalLevel(), scale=bad)
    with pytest.raises(TypeError, match="scale"):
        default_priors(ss.LocalLevel(), scale="big")


def _poisson_draws(rates):
    model = ss.PoissonHMM(num_states=3)
    n = rates.shape[0]
    rng = np.random.default_rng(0)
    init = rng.dirichlet(np.ones(3), size=n)
    trans = rng.dirichlet(np.ones(3), size=(n, 3))
    return model, ss.HMMParams(jnp.asarray(init), jnp.asarray(trans),
                               PoissonEmissions(jnp.asarray(rates)))


def test_relabelling_restores_permuted_draws_and_keeps_the_likelihood():
    rates = np.array([[1.0, 4.0, 9.0], [0.5, 2.0, 3.0]])
    model, draws = _poisson_draws(rates)
    y = np.array([0, 3, 9, 8, 2, 1, 4])
    for perm in itertools.permutations(range(3)):
        perm = jnp.array(perm)
        shuffled = jax.vmap(lambda p: permute_states(model, p, perm))(draws)  # noqa: B023
        back = relabel_states(model, shuffled, by="emissions.rates")
        for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(draws), strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=0)
        one = jax.tree.map(lambda a: a[0], shuffled)
        np.testing.assert_allclose(ss.log_prob(model, one, y),
                                   ss.log_prob(model, jax.tree.map(lambda a: a[0], draws), y),
                                   rtol=1e-12)


def test_posterior_predictive_forecast_mixes_the_draws():
    """With two draws and many paths each, the forecast is the equal mixture of the two
    analytic (Kalman) predictive laws: check its mean and variance."""
    model = ss.LocalLevel()
    y = ss.datasets.load_nile().to_numpy().astype(float)
    draws = ss.LocalLevelParams(jnp.array([15000.0, 9000.0]), jnp.array([1500.0, 400.0]))
    n = 4000
    fc = posterior_predictive_forecast(model, draws, y, num_steps=3, key=jax.random.key(0),
                                       samples_per_draw=n)
    assert fc.samples.shape == (2 * n, 3)
    exact = [model.forecast_moments(jax.tree.map(lambda a: a[i], draws), y,  # noqa: B023
                                    num_steps=3) for i in range(2)]
    means = np.stack([np.asarray(e.mean) for e in exact])
    variances = np.stack([np.asarray(e.std) ** 2 for e in exact])
    mix_mean = means.mean(0)
    mix_var = variances.mean(0) + (means ** 2).mean(0) - mix_mean ** 2
    samples = np.asarray(fc.samples)
    np.testing.assert_array_less(np.abs(samples.mean(0) - mix_mean),
                                 4 * np.sqrt(mix_var / (2 * n)))
    # the sample variance of 8000 near-normal draws has relative sd about sqrt(2 / 8000)
    np.testing.assert_allclose(samples.var(0), mix_var, rtol=5 * math.sqrt(2 / (2 * n)))
    with pytest.raises(ValueError, match="non-finite"):
        posterior_predictive_forecast(model, draws._replace(obs_var=jnp.array([1.0, np.nan])),
                                      y, num_steps=2, key=jax.random.key(0))


def test_numpyro_mask_method_and_predictive_work_on_a_sequence_site():
    """``Distribution.mask`` is numpyro's method (the observation mask is ``obs_mask``), so
    NumPyro's handlers that call it, such as ``Predictive``, work on a model that observes
    a `SequenceDistribution`; a masked-out site scores 0."""
    from numpyro.infer import Predictive

    model = ss.AR(order=1)
    y = np.random.default_rng(2).normal(size=(4, 10))
    params = model.default_params()
    d = SequenceDistribution(model, params, num_timesteps=10)
    assert d.obs_mask is None
    masked = d.mask(False)
    assert isinstance(masked, dist.MaskedDistribution)
    np.testing.assert_array_equal(masked.log_prob(y), np.zeros(4))
    m = np.ones((4, 10), bool)
    m[:, 5] = False
    assert SequenceDistribution(model, params, mask=m).obs_mask.shape == (4, 10)

    def hier(y):
        phi = numpyro.sample("phi", dist.Normal(0.0, 1.0))
        numpyro.deterministic("double", 2 * phi)
        with numpyro.plate("series", y.shape[0]):
            numpyro.sample("y", SequenceDistribution(
                model, params._replace(coeffs=jnp.reshape(phi, (1, 1, 1))),
                num_timesteps=y.shape[1]), obs=y)

    draws = {"phi": jnp.array([0.1, 0.5, -0.3])}
    out = Predictive(hier, posterior_samples=draws, return_sites=["double"])(
        jax.random.key(0), y)
    np.testing.assert_allclose(out["double"], 2 * draws["phi"])
