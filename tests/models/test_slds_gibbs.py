"""Blocked Gibbs sampling of a `SwitchingLDS` with missing observations, and its
simulation-based calibration (Talts et al. 2018)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import statseq as ss
from statseq.inference import kalman
from statseq.inference import switching_gibbs as gibbs
from statseq.models.switching._slds_gibbs import SLDSGibbsPrior, resolved_prior, run_gibbs

T_LEN = 30
NUM_BURNIN, NUM_KEPT, THIN = 20, 100, 10  # one compiled chain length for every test here
MODEL = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None)
# a proper prior whose draws give stable dynamics (the default is vague)
PRIOR = SLDSGibbsPrior(concentration=2.0, dynamics_precision=2.0, dynamics_df=5.0,
                       dynamics_scale=0.5 * jnp.eye(1), emission_precision=0.5,
                       emission_df=5.0, emission_scale=0.5 * jnp.eye(1))
# checks over the CI time budget (each compiles one more program): the slow tier
# (`python -m pytest -m slow`, see tests/conftest.py) runs them
slow = pytest.mark.slow


def _draw_prior(rng):
    """theta ~ SLDSGibbsPrior (the sampler's own parameterization), initial laws fixed."""
    k = 2
    pi = rng.dirichlet([2.0] * k)
    trans = np.stack([rng.dirichlet([2.0] * k) for _ in range(k)])

    def mniw(precision, df, scale):
        sig = scale / rng.chisquare(df, size=k)  # 1-d inverse Wishart
        w = rng.normal(size=(k, 2)) * np.sqrt(sig / precision)[:, None]  # [weight, bias]
        return w, sig

    wd, q = mniw(2.0, 5.0, 0.5)
    we, r = mniw(0.5, 5.0, 0.5)
    p = MODEL.default_params()
    return p._replace(initial_probs=jnp.asarray(pi), transitions=jnp.asarray(trans),
                      dynamics_weights=jnp.asarray(wd[:, :1, None]),
                      dynamics_bias=jnp.asarray(wd[:, 1:]),
                      dynamics_cov=jnp.asarray(q[:, None, None]),
                      emission_weights=jnp.asarray(we[:, :1, None]),
                      emission_bias=jnp.asarray(we[:, 1:]),
                      emission_cov=jnp.asarray(r[:, None, None]))


def _simulate(rng, p, num_t):
    p = jax.tree.map(np.asarray, p)
    z = np.zeros(num_t, int)
    x = np.zeros(num_t)
    z[0] = rng.choice(2, p=p.initial_probs)
    x[0] = rng.normal(p.initial_means[z[0], 0], np.sqrt(p.initial_covs[z[0], 0, 0]))
    for t in range(1, num_t):
        z[t] = rng.choice(2, p=p.transitions[z[t - 1]])
        k = z[t]
        x[t] = (p.dynamics_weights[k, 0, 0] * x[t - 1] + p.dynamics_bias[k, 0]
                + rng.normal(0.0, np.sqrt(p.dynamics_cov[k, 0, 0])))
    y = (p.emission_weights[z, 0, 0] * x + p.emission_bias[z, 0]
         + rng.normal(size=num_t) * np.sqrt(p.emission_cov[z, 0, 0]))
    return y


def _chain(p, y, mask, key):
    """One chain of `run_gibbs` (the sampler of `fit_gibbs`): (params draws, regimes)."""
    dtype = jnp.float64
    yf = jnp.asarray(y, dtype).reshape(1, -1, 1)
    m = jnp.asarray(mask).reshape(1, -1, 1)
    yf = jnp.where(m, yf, 0.0)
    u = jnp.zeros((1, yf.shape[1], 0), dtype)
    draws, _, _ = run_gibbs(MODEL, p, resolved_prior(MODEL, PRIOR, dtype), yf, m, u, key,
                            num_samples=NUM_KEPT, num_burnin=NUM_BURNIN)
    return draws


SCALARS = {
    "P[0,0]": lambda d: d.transitions[..., 0, 0],
    "A_0": lambda d: d.dynamics_weights[..., 0, 0, 0],
    "b_1": lambda d: d.dynamics_bias[..., 1, 0],
    "Q_0": lambda d: d.dynamics_cov[..., 0, 0, 0],
    "d_0": lambda d: d.emission_bias[..., 0, 0],
    "R_1": lambda d: d.emission_cov[..., 1, 0, 0],
}


def test_sbc_gibbs_with_gaps():
    """Ranks of the true parameter among thinned posterior draws are uniform (chi-square,
    level 0.001) over 60 replicates; every other replicate has a 5-step gap (masked), so
    the masked sampler is calibrated too. Each chain starts at the true parameters (a
    posterior draw given y, so the chain is stationary from the start)."""
    rng = np.random.default_rng(17)
    num_rep = 60
    ranks = {name: [] for name in SCALARS}
    for rep in range(num_rep):
        p = _draw_prior(rng)
        y = _simulate(rng, p, T_LEN)
        mask = np.ones(T_LEN, bool)
        if rep % 2:
            mask[12:17] = False
        draws = _chain(p, y, mask, jax.random.key(rep))
        for name, f in SCALARS.items():
            kept = np.asarray(f(draws))[THIN - 1::THIN]
            ranks[name].append(int(np.sum(kept < float(f(p)))))
    num_bins = NUM_KEPT // THIN + 1
    for name, r in ranks.items():
        counts = np.bincount(np.asarray(r), minlength=num_bins)
        pval = stats.chisquare(counts).pvalue
        assert pval > 1e-3, (name, counts, pval)


def test_sbc_detects_a_wrong_sampler():
    """The rank test has power: with the data scaled by 3 (a sampler fitting the wrong
    data), the ranks of the emission bias are far from uniform."""
    rng = np.random.default_rng(18)
    r = []
    for rep in range(30):
        p = _draw_prior(rng)
        y = 3.0 * _simulate(rng, p, T_LEN) + 2.0
        draws = _chain(p, y, np.ones(T_LEN, bool), jax.random.key(100 + rep))
        kept = np.asarray(SCALARS["d_0"](draws))[THIN - 1::THIN]
        r.append(int(np.sum(kept < float(SCALARS["d_0"](p)))))
    counts = np.bincount(np.asarray(r), minlength=NUM_KEPT // THIN + 1)
    assert stats.chisquare(counts).pvalue < 1e-3


@slow  # ~8.6 s of CPU (compiles sample_posterior for one more model): over the CI budget
def test_one_regime_gaps_match_exact_smoother():
    """K = 1: every sweep draws x from the exact posterior given the gappy y (entries
    masked): the draws' means and variances match the Kalman smoother."""
    model = ss.SwitchingLDS(num_regimes=1, state_dim=2, emission_dim=2)
    p = model.default_params()._replace(
        dynamics_weights=jnp.array([[[0.8, 0.3], [-0.2, 0.7]]]),
        emission_cov=jnp.array([[[0.3, 0.1], [0.1, 0.2]]]))
    y = ss.sample(model, p, num_timesteps=12, key=jax.random.key(5))
    mask = np.ones(y.shape, bool)
    mask[3:6] = False
    mask[8, 1] = False
    out = model.sample_posterior(p, y, key=jax.random.key(6), num_samples=2000,
                                 num_burnin=0, mask=jnp.asarray(mask))
    arrays = model.to_arrays(p)
    post = jax.jit(kalman.kalman_smoother)(
        gibbs.path_arrays(arrays, jnp.zeros(12, jnp.int32)), y, jnp.asarray(mask),
        jnp.zeros((12, 0)))
    x = np.asarray(out.states)
    sd = np.sqrt(np.diagonal(np.asarray(post.smoothed_covs), axis1=1, axis2=2))
    se = sd / np.sqrt(x.shape[0])
    assert np.all(np.abs(x.mean(0) - post.smoothed_means) < 4.5 * se)
    np.testing.assert_allclose(x.var(0), sd ** 2, rtol=0.15)


@slow
def test_gaps_masked_equals_absent():
    """Masking the last 6 steps leaves the posterior of the parameters unchanged (they
    integrate out): posterior means of the masked and the truncated sampler agree within
    Monte Carlo error (20 chains each, fixed keys)."""
    rng = np.random.default_rng(3)
    p = MODEL.default_params()._replace(
        dynamics_weights=jnp.array([[[0.9]], [[-0.6]]]),
        emission_bias=jnp.array([[0.0], [2.0]]))
    y = _simulate(rng, p, T_LEN)
    cut = T_LEN - 6
    mask = np.arange(T_LEN) < cut
    names = ("A_0", "A_1", "d_0", "P[0,0]")
    get = dict(SCALARS, A_1=lambda d: d.dynamics_weights[..., 1, 0, 0])
    masked, absent = [], []
    for c in range(20):
        dm = _chain(p, y, mask, jax.random.key(c))
        da = _chain(p, y[:cut], np.ones(cut, bool), jax.random.key(1000 + c))
        masked.append([np.mean(get[n](dm)) for n in names])
        absent.append([np.mean(get[n](da)) for n in names])
    masked, absent = np.asarray(masked), np.asarray(absent)
    se = np.sqrt(masked.var(0, ddof=1) / 20 + absent.var(0, ddof=1) / 20)
    assert np.all(np.abs(masked.mean(0) - absent.mean(0)) < 4.0 * se), (
        masked.mean(0), absent.mean(0), se)


def test_fit_gibbs_accepts_mask():
    """The public entry point takes the mask (one short chain, the compiled sampler
    above); the missing steps' values do not matter."""
    p = _draw_prior(np.random.default_rng(0))
    y = _simulate(np.random.default_rng(1), p, T_LEN)
    mask = np.ones(T_LEN, bool)
    mask[4:9] = False
    y2 = y.copy()
    y2[4:9] = 1e6
    kw = dict(key=jax.random.key(0), num_samples=NUM_KEPT, num_burnin=NUM_BURNIN,
              prior=PRIOR, mask=jnp.asarray(mask))
    a = MODEL.fit_gibbs(p, y, **kw)
    b = MODEL.fit_gibbs(p, y2, **kw)
    np.testing.assert_array_equal(a.posterior.dynamics_weights.values,
                                  b.posterior.dynamics_weights.values)
    assert np.all(np.isfinite(a.posterior.emission_cov.values))
