"""Prior draws, predictive checks, PSIS and leave-future-out cross-validation.

References: prior draws against the moments of the documented default priors; replicated
statistics of an iid Poisson model against their exact moments; `psis` against ArviZ's
``psislw`` (Vehtari et al. 2024); `lfo_cv` on a conjugate Poisson-Gamma model against the
exact one-step predictive densities (negative binomial, scipy) of Bürkner, Gabry and
Vehtari (2020)'s elpd_LFO.
"""

from __future__ import annotations

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy.stats import nbinom

import statseq as ss
from statseq.bayes import lfo_cv, predictive_check, sample_prior
from statseq.bayes.lfo import psis
from statseq.models.hmm.poisson import PoissonEmissions


def test_sample_prior_draws_the_documented_defaults_and_given_priors():
    model = ss.PoissonHMM(num_states=2)
    n = 4000
    draws = sample_prior(model, num_samples=n, key=jax.random.key(0), scale=20.0)
    log_rates = np.log(np.asarray(draws.emissions.rates))
    assert log_rates.shape == (n, 2)
    # LogNormal(log 20, 2): log draws have mean log 20 (se 2 / sqrt(n) = 0.03) and sd 2
    np.testing.assert_allclose(log_rates.mean(0), np.log(20.0), atol=0.13)
    np.testing.assert_allclose(log_rates.std(0), 2.0, rtol=0.05)
    trans = np.asarray(draws.transitions)
    np.testing.assert_allclose(trans.sum(-1), 1.0, rtol=1e-12)
    # Dirichlet(1, 1) rows: uniform on [0, 1] (mean 1/2, variance 1/12)
    np.testing.assert_allclose(trans[..., 0].mean(0), 0.5, atol=0.03)
    np.testing.assert_allclose(trans[..., 0].var(0), 1 / 12, rtol=0.08)
    priors = ss.HMMParams(None, None, PoissonEmissions(dist.Gamma(3.0, 0.5)))
    given = np.asarray(sample_prior(model, priors, num_samples=n,
                                    key=jax.random.key(1)).emissions.rates)
    np.testing.assert_allclose(given.mean(0), 6.0, rtol=0.06)  # Gamma(3, rate 0.5): mean 6
    with pytest.raises(ValueError, match="num_samples"):
        sample_prior(model, num_samples=0, key=jax.random.key(0))
    with pytest.raises(TypeError, match="distributions"):
        sample_prior(model, ss.HMMParams(None, None, PoissonEmissions(3.0)), num_samples=2,
                     key=jax.random.key(0))


def test_predictive_check_statistics_of_an_iid_poisson_model():
    """One-state Poisson HMM at a fixed rate: y_rep iid Poisson(5), so the replicated
    mean has mean 5 and variance 5 / T, the variance/mean ratio has mean (T-1)/T, and the
    lag-1 sample autocorrelation has mean about -1/T (Bartlett)."""
    model = ss.PoissonHMM(num_states=1)
    n, t, lam = 3000, 50, 5.0
    draws = ss.HMMParams(jnp.ones((n, 1)), jnp.ones((n, 1, 1)),
                         PoissonEmissions(jnp.full((n, 1), lam)))
    y = np.random.default_rng(0).poisson(lam, size=t)
    check = predictive_check(model, draws, y, key=jax.random.key(2))
    assert check.replicas.shape == (n, t)
    means = check.replicated["mean"]
    assert abs(means.mean() - lam) < 4 * np.sqrt(lam / t / n)
    np.testing.assert_allclose(means.var(), lam / t, rtol=0.1)
    disp = check.replicated["variance / mean"]
    assert abs(disp.mean() - (t - 1) / t) < 4 * disp.std() / np.sqrt(n)
    acf = check.replicated["lag-1 autocorrelation"]
    assert abs(acf.mean() + 1 / t) < 4 * acf.std() / np.sqrt(n)
    # the observed statistics and the p-values from the returned replicas, by hand
    reps = check.replicas
    obs_acf = np.corrcoef(y[:-1], y[1:])[0, 1]  # close to (not equal to) the acf estimate
    assert abs(check.observed["lag-1 autocorrelation"] - obs_acf) < 0.05
    np.testing.assert_allclose(check.observed["variance / mean"], y.var() / y.mean())
    np.testing.assert_allclose(check.p_values["max"], np.mean(reps.max(1) >= y.max()))
    np.testing.assert_allclose(check.p_values["mean"], np.mean(reps.mean(1) >= y.mean()))
    p = check.p_values["mean"]
    assert check.two_sided("mean") == pytest.approx(
        min(1.0, 2 * min(p, np.mean(reps.mean(1) <= y.mean()))))
    assert "variance / mean" in check.summary()
    with pytest.raises(ValueError, match="one series"):
        predictive_check(model, draws, y[:, None, None] * np.ones((1, 2, 2)),
                         key=jax.random.key(0))
    with pytest.raises(ValueError, match="fully observed"):
        predictive_check(model, draws, np.where(np.arange(t) == 3, np.nan, y),
                         key=jax.random.key(0))
    with pytest.raises(TypeError, match="statistics"):
        predictive_check(model, draws, y, key=jax.random.key(0), statistics=[np.mean])


@pytest.mark.skipif(not hasattr(az, "psislw"), reason="arviz without psislw (1.x)")
def test_psis_matches_arviz():
    rng = np.random.default_rng(3)
    for log_w in (rng.standard_t(2.0, size=800), 3.0 * rng.normal(size=2000),
                  rng.normal(size=400)):
        ours, k = psis(log_w)
        ref, k_ref = az.psislw(log_w.copy())
        np.testing.assert_allclose(k, float(k_ref), rtol=1e-10)
        np.testing.assert_allclose(ours, np.asarray(ref), rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="finite"):
        psis([0.0, np.nan, 1.0])


def _conjugate_poisson():
    model = ss.PoissonHMM(num_states=1)
    a, b = 2.0, 0.5
    init = ss.HMMParams(jnp.ones(1), jnp.ones((1, 1)), PoissonEmissions(jnp.array([2.0])))
    frozen = ss.HMMParams(False, False, PoissonEmissions(True))
    priors = ss.HMMParams(None, None, PoissonEmissions(dist.Gamma(a, b)))
    return model, a, b, dict(init_params=init, trainable=frozen, priors=priors)


def test_lfo_cv_equals_the_exact_conjugate_one_step_densities():
    """y_t iid Poisson(lambda), lambda ~ Gamma(a, b): p(y_{i+1} | y_{1:i}) is negative
    binomial with r = a + sum y_{1:i}, p = (b + i) / (b + i + 1). Exact LFO (a NUTS refit
    per origin) and PSIS-LFO both recover elpd_LFO within Monte Carlo error."""
    model, a, b, kw = _conjugate_poisson()
    y = np.random.default_rng(4).poisson(3.0, size=30)
    first = 25
    origins = np.arange(first, y.size)
    cums = np.concatenate([[0], np.cumsum(y)])
    exact = nbinom.logpmf(y[origins], a + cums[origins], (b + origins) / (b + origins + 1))
    res = lfo_cv(model, y, first_origin=first, key=jax.random.key(5), pareto_k_threshold=None,
                 num_warmup=200, num_samples=400, num_chains=1, **kw)
    assert res.refits == tuple(range(first, y.size))
    np.testing.assert_array_equal(res.origins, origins)
    # Monte Carlo error of log mean_s p(y | lambda_s): about (y / lambda - 1) sd(lambda) /
    # sqrt(ESS) ~ 0.04 for the most surprising year (400 draws of one chain); measured
    # errors -0.006..0.036 (sum 0.04) here, and -0.015..0.010 for PSIS-LFO
    np.testing.assert_allclose(res.pointwise, exact, atol=0.1)
    assert abs(res.elpd - exact.sum()) < 0.15
    np.testing.assert_allclose(res.se, np.sqrt(exact.size * np.var(exact)), rtol=0.1)
    approx = lfo_cv(model, y, first_origin=first, key=jax.random.key(6), num_warmup=200,
                    num_samples=400, num_chains=1, **kw)
    assert approx.refits[0] == first and len(approx.refits) < len(res.refits)
    assert np.all(approx.pareto_k < 0.7)  # a slowly changing posterior: no refit needed
    np.testing.assert_allclose(approx.pointwise, exact, atol=0.1)
    assert abs(approx.elpd - exact.sum()) < 0.15


def test_lfo_cv_validates_eagerly():
    model, _, _, kw = _conjugate_poisson()
    y = np.arange(10) % 3
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="first_origin"):
        lfo_cv(model, y, first_origin=10, key=key, **kw)
    with pytest.raises(ValueError, match="first_origin"):
        lfo_cv(model, y, first_origin=0, key=key, **kw)
    with pytest.raises(ValueError, match="pareto_k_threshold"):
        lfo_cv(model, y, first_origin=5, key=key, pareto_k_threshold=-1.0, **kw)
    with pytest.raises(TypeError, match="mask"):
        lfo_cv(model, y, first_origin=5, key=key, mask=np.ones(10, bool), **kw)
    with pytest.raises(ValueError, match="one series"):
        lfo_cv(model, np.ones((2, 10)), first_origin=5, key=key, **kw)
