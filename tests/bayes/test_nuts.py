"""fit_nuts and fit_svi: an exact conjugate posterior, posterior concentration on
simulated data, the ArviZ output, and eager validation."""

from __future__ import annotations

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

import statseq as ss
from statseq.bayes import SequenceDistribution, fit_nuts, fit_svi, posterior_params
from statseq.models.hmm.poisson import PoissonEmissions


def test_conjugate_poisson_posterior_is_exact():
    """One-state Poisson HMM with frozen (trivial) transitions: y_t iid Poisson(lambda), so
    lambda | y ~ Gamma(a + sum y, b + T) exactly."""
    model = ss.PoissonHMM(num_states=1)
    y = np.asarray(jax.random.poisson(jax.random.key(0), 3.0, (60,)))
    a, b = 2.0, 0.5
    init = ss.HMMParams(jnp.ones(1), jnp.ones((1, 1)), PoissonEmissions(jnp.array([2.0])))
    frozen = ss.HMMParams(False, False, PoissonEmissions(True))
    priors = ss.HMMParams(None, None, PoissonEmissions(dist.Gamma(a, b)))
    idata = fit_nuts(model, y, key=jax.random.key(1), num_warmup=300, num_samples=500,
                     num_chains=2, priors=priors, init_params=init, trainable=frozen)
    summary = az.summary(idata, var_names=["emissions.rates"])
    exact = dist.Gamma(a + y.sum(), b + y.size)
    mean, sd = float(exact.mean[0] if exact.mean.ndim else exact.mean), float(
        jnp.sqrt(exact.variance))
    row = summary.iloc[0]
    assert abs(row["mean"] - mean) < 4 * row["mcse_mean"] + 1e-3
    assert abs(row["sd"] - sd) < 0.15 * sd
    assert row["r_hat"] < 1.05
    # frozen leaves are constants, not posterior variables, and come back in the draws
    assert "transitions" not in idata.posterior.data_vars
    np.testing.assert_array_equal(idata.constant_data["transitions"].values, [[1.0]])
    draws = posterior_params(model, idata)
    assert draws.transitions.shape == (2, 500, 1, 1)
    # pointwise log-likelihood sums to the model's log-likelihood at each draw
    ll = idata.log_likelihood["y"].values
    assert ll.shape == (2, 500, 60)
    one = jax.tree.map(lambda a_: a_[1, 7], draws)
    np.testing.assert_allclose(ll[1, 7].sum(), ss.log_prob(model, one, y), rtol=1e-10)
    assert idata.sample_stats["diverging"].shape == (2, 500)


def test_poisson_hmm_posterior_concentrates_near_the_truth():
    model = ss.PoissonHMM(num_states=2)
    truth = ss.HMMParams(jnp.array([0.5, 0.5]), jnp.array([[0.9, 0.1], [0.15, 0.85]]),
                         PoissonEmissions(jnp.array([2.0, 9.0])))
    y = ss.sample(model, truth, num_timesteps=300, key=jax.random.key(2))
    # (no pointwise log-likelihood group: nothing here reads it, and it is one more
    # compiled program; test_conjugate_poisson_posterior_is_exact checks that group)
    idata = fit_nuts(model, y, key=jax.random.key(3), num_warmup=300, num_samples=300,
                     num_chains=2, ordered="emissions.rates", log_likelihood=False)
    post = idata.posterior
    assert post["transitions"].dims == ("chain", "draw", "state", "state_to")
    assert post["emissions.rates"].dims == ("chain", "draw", "state")
    rates = post["emissions.rates"].values
    assert np.all(np.diff(rates, axis=-1) > 0)  # the ordering constraint holds
    for value, true in [(rates[..., 0], 2.0), (rates[..., 1], 9.0),
                        (post["transitions"].values[..., 0, 0], 0.9),
                        (post["transitions"].values[..., 1, 1], 0.85)]:
        assert abs(value.mean() - true) < 4 * value.std(), (value.mean(), value.std(), true)
    assert rates[..., 0].std() < 0.15 * 2.0 and rates[..., 1].std() < 0.1 * 9.0
    summary = az.summary(idata)
    assert summary["r_hat"].max() < 1.05 and summary["ess_bulk"].min() > 50


def test_local_level_posterior_concentrates_and_svi_agrees():
    model = ss.LocalLevel()
    truth = ss.LocalLevelParams(jnp.asarray(1.0), jnp.asarray(0.4))
    y = SequenceDistribution(model, truth, num_timesteps=400).sample(jax.random.key(4))
    # One chain of 200 + 400 (was two of 200 + 300: 1000 iterations, now 600). NUTS takes
    # ~5 leapfrog steps here and one chain of 400 draws gives a bulk ESS of ~140-190 (two
    # chains of 300 gave ~160-230), so the posterior mean and sd below carry Monte Carlo
    # errors of under 0.1 sd and ~6%: far inside the 4 sd, 0.4 * true and SVI margins.
    idata = fit_nuts(model, y, key=jax.random.key(5), num_warmup=200, num_samples=400,
                     num_chains=1, log_likelihood=False)  # (the group is not read here)
    post = idata.posterior
    for name, true in [("obs_var", 1.0), ("level_var", 0.4)]:
        v = post[name].values
        assert abs(v.mean() - true) < 4 * v.std() and v.std() < 0.4 * true, (name, v.mean())
    # the ELBO has converged by 1000 steps (mean loss over steps 400-700 and 700-1000 agree
    # to 0.1 nats, and with the value reached after 1500 steps)
    svi = fit_svi(model, y, key=jax.random.key(6), num_steps=1000, num_samples=2000)
    assert svi.losses.shape == (1000,)
    for name in ("obs_var", "level_var"):
        nuts_draws = post[name].values.ravel()
        svi_draws = np.asarray(getattr(svi.draws, name))
        # mean-field normal in log space: close to NUTS for a well-identified posterior
        assert abs(svi_draws.mean() - nuts_draws.mean()) < 0.5 * nuts_draws.std()
        assert 0.6 < svi_draws.std() / nuts_draws.std() < 1.6


def test_fit_nuts_validates_eagerly():
    model = ss.PoissonHMM(num_states=2)
    y = np.array([1, 2, 8, 9, 1, 0])
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="chain_method"):
        fit_nuts(model, y, key=key, chain_method="threads")
    with pytest.raises(ValueError, match="ordered must name"):
        fit_nuts(model, y, key=key, ordered="rates")
    with pytest.raises(ValueError, match="vector leaf"):
        fit_nuts(model, y, key=key, ordered="transitions")
    bad = ss.HMMParams(None, None, PoissonEmissions(dist.Normal(0.0, 1.0)))
    with pytest.raises(ValueError, match="real support"):
        fit_nuts(model, y, key=key, priors=bad)
    wrong_shape = ss.HMMParams(None, None, PoissonEmissions(dist.Gamma(jnp.ones(3), 1.0)))
    with pytest.raises(ValueError, match="broadcast"):
        fit_nuts(model, y, key=key, priors=wrong_shape)
    init = model.initialize(y, key=key)
    frozen = ss.HMMParams(False, False, PoissonEmissions(False))
    with pytest.raises(ValueError, match="frozen"):
        fit_nuts(model, y, key=key, init_params=init, trainable=frozen)
    with pytest.raises(ValueError, match="guide"):
        fit_svi(model, y, key=key, guide="flow")
    with pytest.raises(ValueError, match="count"):
        fit_nuts(model, np.array([1.5, 2.0]), key=key)


def test_importing_arviz_first_leaves_numpyro_whole():
    """arviz 1.x loads numpyro lazily when imported first; statseq must still find every
    numpyro submodule (numpyro.factor, used by fit_nuts, reads one as an attribute)."""
    import subprocess
    import sys

    code = ("import arviz, numpyro.distributions as d, statseq; "
            "assert hasattr(d, 'distribution'), 'numpyro.distributions.distribution missing'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)

