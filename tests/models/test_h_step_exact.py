"""Exact h-step marginal predictives of the AR-HMM and the Markov-switching AR (issue 20).

``p(y_{T+k} | y_{1:T})`` is a Gaussian mixture over regime paths
(`statseq.inference.regime_paths`); every number here is compared with a computation that
does not use it: `tests._claims.check_marginal_predictive` (fine grid at k = 2,
Rao-Blackwellised ancestral Monte Carlo within 4 standard errors at every k up to 8; its
Gauss-Hermite reference runs eagerly, about 0.1 s per update here, so once, at k = 2),
dense Gaussian conditioning of a VAR (K = 1), `statseq.AR`'s exact masked-lag marginals,
`MarkovSwitchingAR.forecast_means` (exact means by another recursion), statsmodels'
``MarkovAutoregression`` (one-step predicted means and log-likelihood) and Monte Carlo of
`statseq.forecast` samples.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import statseq as ss
from statseq.core.distributions import marginal_cdf
from statseq.evaluation._origins import origin_forecasts
from statseq.models.hmm.autoregressive import ARHMMEmissions, LinearAutoregressiveHMM
from statseq.models.switching import MarkovSwitchingAR, MSARParams
from tests._claims import (
    check_marginal_predictive,
    filtered_carry,
    gauss_hermite,
    grid_two_step,
    rb_monte_carlo,
)


def switching_ar(num_steps, seed):
    """A simulated 2-regime switching AR(1): y_t = c_z + phi_z y_{t-1} + sd_z e_t."""
    rng = np.random.default_rng(seed)
    trans = np.array([[0.9, 0.1], [0.15, 0.85]])
    c, phi, sd = np.array([1.0, -1.0]), np.array([0.7, -0.3]), np.array([0.3, 0.8])
    z, y = 0, np.zeros(num_steps)
    for t in range(1, num_steps):
        z = rng.choice(2, p=trans[z])
        y[t] = c[z] + phi[z] * y[t - 1] + sd[z] * rng.normal()
    return y[:, None]


@pytest.fixture(scope="module")
def series():
    return switching_ar(160, 3)


@pytest.fixture(scope="module")
def fitted(series):
    """An AR-HMM (2 states, 1 lag) fitted by EM to the first 152 values."""
    return fit_arhmm(series[:152], 1)


def fit_arhmm(y, num_lags, **kw):
    model = LinearAutoregressiveHMM(num_states=2, emission_dim=y.shape[-1],
                                    num_lags=num_lags, **kw)
    params = model.initialize(y, key=jax.random.key(0))
    return model, ss.fit_em(model, params, y, num_iters=25, progress=False).params


@pytest.mark.parametrize("num_lags", [1, 2])
def test_arhmm_claims_horizons_2_to_8(series, fitted, num_lags):
    """EM-fitted AR-HMMs (1 and 2 lags) on a simulated switching AR: k = 1 to 1e-10, k = 2
    against the fine grid to 1e-6, k = 1..8 within 4 Monte Carlo standard errors of the
    ancestral average (Gauss-Hermite, eager and slow, runs once below)."""
    model, params = fitted if num_lags == 1 else fit_arhmm(series[:152], num_lags)
    check_marginal_predictive(model, params, series[:152], series[152:160],
                              quadrature=False)


def test_issue_example_old_number_was_wrong_new_equals_grid():
    """The claims audit's example (issue 20; 2 states, 1 lag, EM on a random walk, T = 54):
    masked-step propagation (the old route, written out in `_old_route`) gave -14.90 at
    k = 2 where the grid says -0.1787; the new route equals the grid and Gauss-Hermite to
    1e-6 (k = 1 was and is the one-step predictive)."""
    rng = np.random.default_rng(0)
    y = rng.normal(size=(60, 1)).cumsum(0) * 0.3
    model = LinearAutoregressiveHMM(num_states=2, emission_dim=1, num_lags=1)
    params = model.initialize(y, key=jax.random.key(0))
    params = ss.fit_em(model, params, y, num_iters=30, progress=False).params
    new = ss.log_predictive_density(model, params, y[:54], y[54:56], marginal=True)
    carry = filtered_carry(model, params, y[:54])
    grid = grid_two_step(model, params, carry, y[54:56])
    gh = gauss_hermite(model, params, carry, y[54:56], 2, order=30)
    np.testing.assert_allclose([new[1], gh], grid, rtol=0, atol=1e-6)
    assert round(grid, 4) == -0.1787
    old = _old_route(model, params, jnp.asarray(y[:56]), 54, 2)
    np.testing.assert_allclose(old[0], new[0], rtol=0, atol=1e-10)
    assert round(old[1], 2) == -14.90, old


def _old_route(model, params, y, origin, horizon):
    """The masked-step propagation origin_forecasts used before (predict, then update with
    an all-false mask), written out here."""
    carry = filtered_carry(model, params, y[:origin])
    return np.asarray(_old_steps(model, params, carry, y[origin:origin + horizon]))


@partial(jax.jit, static_argnums=0)  # one program (eager, each op compiles on its own)
def _old_steps(model, params, carry, y_future):
    out = []
    u = jnp.zeros((0,))
    for k in range(y_future.shape[0]):
        d = model.predict(params, carry, u)
        out.append(d.log_prob(y_future[k]))
        carry = model.update(params, carry, y_future[k], jnp.zeros(y_future.shape[1:], bool),
                             u)
    return jnp.stack(out)


def test_arhmm_input_driven_transitions(series):
    """Transitions read an input (softmax regression): the claims at k = 1..6."""
    rng = np.random.default_rng(5)
    u = rng.normal(size=(158, 1))
    model = LinearAutoregressiveHMM(num_states=2, emission_dim=1, num_lags=1, input_dim=1)
    base = model.initialize(series[:152], key=jax.random.key(1), inputs=u[:152])
    trans = ss.TransitionRegression(jnp.array([[[0.0], [1.5]], [[-2.0], [0.0]]]),
                                    jnp.log(jnp.array([[0.85, 0.15], [0.2, 0.8]])))
    params = base._replace(transitions=trans)
    check_marginal_predictive(model, params, series[:152], series[152:158],
                              inputs_hist=u[:152], inputs_future=u[152:158], quadrature=False)


def test_arhmm_two_dims_against_monte_carlo_and_dense_var():
    """D = 2: every horizon within 4 standard errors of the ancestral average (K = 2,
    data-driven initial parameters); with
    K = 1 the model is a VAR(2), whose h-step marginals by dense Gaussian conditioning
    (the joint of y_{T+1:T+h} as a linear map of the noise) and by `statseq.AR` (masked
    lags marginalized exactly by its filter) equal ours to 1e-10, per dimension too, and
    so do the mixture's means, variances and per-coordinate marginal cdfs."""
    rng = np.random.default_rng(7)
    y = np.cumsum(rng.normal(size=(60, 2)), axis=0) * 0.2
    model = LinearAutoregressiveHMM(num_states=2, emission_dim=2, num_lags=1)
    params = model.initialize(y[:54], key=jax.random.key(0))
    check_marginal_predictive(model, params, y[:54], y[54:60], num_paths=20000)

    var = LinearAutoregressiveHMM(num_states=1, emission_dim=2, num_lags=2)
    a = np.array([[[0.5, 0.1, 0.2, 0.0], [-0.2, 0.4, 0.1, -0.1]]])
    b = np.array([[0.3, -0.2]])
    cov = np.array([[[0.5, 0.2], [0.2, 0.4]]])
    vp = var.assemble_params(ARHMMEmissions(jnp.asarray(a), jnp.asarray(b),
                                               jnp.asarray(cov)))
    h = 5
    got = ss.log_predictive_density(var, vp, y[:54], y[54:54 + h], marginal=True)
    # dense: y_{T+k} = mean_k + sum_j G_{k,j} e_{T+j}, built step by step from the VAR
    lag1, lag2 = y[53], y[52]
    coef = {1: a[0][:, :2], 2: a[0][:, 2:]}
    means, maps = [], []  # maps[k]: (2, 2 h) linear map of the stacked noise
    prev = [(lag1, np.zeros((2, 2 * h))), (lag2, np.zeros((2, 2 * h)))]
    for k in range(h):
        m = b[0] + coef[1] @ prev[0][0] + coef[2] @ prev[1][0]
        g = coef[1] @ prev[0][1] + coef[2] @ prev[1][1]
        g[:, 2 * k:2 * k + 2] += np.eye(2)
        means.append(m)
        maps.append(g)
        prev = [(m, g), prev[0]]
    noise = np.kron(np.eye(h), cov[0])
    dense = np.array([scipy.stats.multivariate_normal(means[k], maps[k] @ noise @ maps[k].T)
                      .logpdf(y[54 + k]) for k in range(h)])
    np.testing.assert_allclose(got, dense, rtol=0, atol=1e-10)
    ar = ss.AR(order=2, emission_dim=2)
    arp = ss.ARParams(jnp.asarray(np.stack([a[0][:, :2], a[0][:, 2:]])), jnp.asarray(b[0]),
                      jnp.zeros((2, 0)), jnp.asarray(cov[0]))
    np.testing.assert_allclose(
        got, ss.log_predictive_density(ar, arp, y[:54], y[54:54 + h], marginal=True),
        rtol=0, atol=1e-10)
    # per dimension: the marginal of one coordinate (backtest's per-dim route)
    mask = np.ones((54 + h, 2), bool)
    lps, lps_d, _, _ = origin_forecasts(var, vp, jnp.asarray(y[:54 + h]), jnp.asarray(mask),
                                     jnp.zeros((54 + h, 0)), jnp.array([54]), None,
                                     horizon=h, stacked=False, per_dim=True, sample=False)
    sd = np.sqrt(np.array([np.diag(g @ noise @ g.T) for g in maps]))
    dense_d = scipy.stats.norm(np.array(means), sd).logpdf(y[54:54 + h])
    np.testing.assert_allclose(np.asarray(lps_d[0]), dense_d, rtol=0, atol=1e-10)

    @jax.jit  # one program (eager, the mixture's ops compile one by one)
    def moments_and_cdf(carry, y_future):
        d = var.h_step_marginals(vp, carry, jnp.zeros((h, 0)))
        return d.mean, d.variance, marginal_cdf(d, y_future)

    d_mean, d_var, d_cdf = moments_and_cdf(filtered_carry(var, vp, y[:54]),
                                           jnp.asarray(y[54:54 + h]))
    np.testing.assert_allclose(np.asarray(d_mean), np.array(means), rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(d_var), sd**2, rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(d_cdf),
                               scipy.stats.norm(np.array(means), sd).cdf(y[54:54 + h]),
                               rtol=0, atol=1e-10)


MSAR_FORMS = [
    MarkovSwitchingAR(2, 1),  # Hamilton's switching mean: expanded state (s_t, s_{t-1})
    MarkovSwitchingAR(2, 2, switching_ar=True, switching_variance=True),
    MarkovSwitchingAR(2, 1, form="intercept", switching_variance=True),
    MarkovSwitchingAR(2, 2, form="intercept", switching_mean=False, switching_ar=True),
]


def msar_params(model, seed):
    rng = np.random.default_rng(seed)
    k, p = model.num_regimes, model.order
    shapes = model.param_shapes()
    return MSARParams(None, jnp.array([[0.85, 0.15], [0.25, 0.75]]),
                      jnp.asarray(np.broadcast_to([-1.0, 1.2], (k,)).reshape(shapes.means)
                                  if shapes.means else 0.4),
                      jnp.asarray(rng.uniform(-0.6, 0.6, size=shapes.ar_coeffs) / p),
                      jnp.asarray(rng.uniform(0.2, 0.9, size=shapes.variances)))


@pytest.mark.parametrize("case", range(len(MSAR_FORMS)))
def test_msar_forms_claims(case):
    """Each MS-AR form (switching mean / intercept / AR / variance, 1 and 2 lags) at
    simulated data: the claims at k = 1..8."""
    model = MSAR_FORMS[case]
    params = msar_params(model, case)
    y = np.asarray(ss.sample(model, params, key=jax.random.key(case), num_timesteps=68),
                   float)
    check_marginal_predictive(model, params, y[:60], y[60:68], quadrature=False)


def test_msar_means_and_statsmodels_one_step():
    """Means of the mixture equal `forecast_means` (an exact recursion on the regime law,
    not over paths) to 1e-10 for h = 1..6; the one-step marginals at every origin of the
    GNP series equal statsmodels' MarkovAutoregression (which has no multi-step
    forecast): the predicted means (``predict(probabilities="predicted")``, in-sample
    one-step) and the log-likelihood (the sum of the one-step log scores) to 1e-8."""
    from statsmodels.tsa.regime_switching.markov_autoregression import MarkovAutoregression

    from tests.models.test_ms_ar import gnp, sm_param_vector

    model = MarkovSwitchingAR(2, 2)
    y = gnp()
    params = msar_params(model, 11)
    d = model.predict_observations(params, y, num_steps=6)
    np.testing.assert_allclose(np.asarray(d.mean), np.asarray(
        model.forecast_means(params, y, num_steps=6)), rtol=0, atol=1e-10)
    sm = MarkovAutoregression(y, k_regimes=2, order=2, switching_ar=False)
    res = sm.smooth(sm_param_vector(sm.param_names, params))
    carries = ss.filter(model, params, y, return_carries=True).carries  # after y_0..y_t

    def one_step(c, y_next):
        d1 = model.h_step_marginals(params, c, jnp.zeros((1, 0)))
        return d1.mean[0], d1.log_prob(y_next)[0]

    # origins 2..T-1, one compiled program (eager, the vmapped mixture's ops compile singly)
    got, lps = jax.jit(jax.vmap(one_step))(jax.tree.map(lambda a: a[1:-1], carries),
                                           jnp.asarray(y[2:]))
    np.testing.assert_allclose(float(np.sum(lps)), res.llf, rtol=0, atol=1e-8)
    np.testing.assert_allclose(np.asarray(got), np.asarray(res.predict(
        probabilities="predicted")), rtol=0, atol=1e-8)


def test_backtest_log_scores_equal_independent_computation(series, fitted):
    """`ss.backtest` per-horizon log scores of an AR-HMM, origin by origin: k = 1 the
    one-step predictive and k = 2 the fine grid (to 1e-6), k = 3 within 4 standard errors
    of the ancestral Monte Carlo average."""
    model, params = fitted
    y = series[:160]
    res = ss.backtest(model, params, y, key=jax.random.key(0), horizon=3, initial=151,
                      step=3, num_samples=50)
    table = res.table
    # the one-step predictive's density, one program for every origin (eager, its ops
    # would compile one by one)
    one_step = jax.jit(lambda c, y_o: model.predict(params, c, jnp.zeros((0,))).log_prob(y_o))
    for o in res.origins:
        carry = filtered_carry(model, params, y[:o])
        ref = [float(one_step(carry, y[o])), grid_two_step(model, params, carry, y[o:o + 2])]
        got = table[table.origin == o].sort_values("horizon").log_score.to_numpy()
        np.testing.assert_allclose(got[:2], ref, rtol=0, atol=1e-6)
        mc, se = rb_monte_carlo(model, params, carry, y[o:o + 3], key=jax.random.key(o))
        assert abs(got[2] - mc[2]) < 4 * se[2], (got, mc, se)


def test_distribution_methods_against_forecast_samples(series, fitted):
    """cdf / icdf / mean / variance of the h-step marginals of an AR-HMM against 40000
    `ss.forecast` paths: KS test p > 1e-3 per horizon, means and variances within 4
    standard errors, empirical frequency below each quantile within 4 standard errors of
    its level, and cdf(icdf(q)) = q to 1e-9 (D = 2 marginal cdfs, means and variances:
    against dense conditioning in the VAR test)."""
    model, params = fitted
    h, n = 4, 40000
    d = model.predict_observations(params, series[:150], num_steps=h)
    draws = np.asarray(ss.forecast(model, params, series[:150], key=jax.random.key(3),
                                   num_steps=h, num_samples=n).samples, float)
    draws = draws.reshape(n, h)
    mean, var = np.asarray(d.mean)[:, 0], np.asarray(d.variance)[:, 0]
    assert np.all(np.abs(draws.mean(0) - mean) < 4 * np.sqrt(var / n))
    m4 = np.mean((draws - mean) ** 4, axis=0)
    assert np.all(np.abs(draws.var(0) - var) < 4 * np.sqrt((m4 - var**2) / n))
    qs = np.array([0.05, 0.5, 0.95])

    @jax.jit  # the quantiles, their cdf and the cdf of the draws in one program (eager,
    def methods(levels, x):  # the bisection's and the mixture's ops compiled one by one)
        quant = jax.vmap(d.icdf)(levels)
        return quant, jax.vmap(d.cdf)(quant), d.cdf(x)

    quant, back, u = (np.asarray(a) for a in methods(jnp.broadcast_to(qs[:, None], (3, h)),
                                                     jnp.asarray(draws)))  # (3, h) x 2, (n, h)
    np.testing.assert_allclose(back, np.broadcast_to(qs[:, None], (3, h)), atol=1e-9)
    freq = (draws[None] <= quant[:, None, :]).mean(1)
    assert np.all(np.abs(freq - qs[:, None]) < 4 * np.sqrt(qs * (1 - qs) / n)[:, None])
    # u = F(draws), (n, h): uniform if the cdf is right
    for k in range(h):
        assert scipy.stats.kstest(u[:, k], "uniform").pvalue > 1e-3


def test_rb_monte_carlo_every_horizon_two_lags_two_dims():
    """D = 2, 2 lags, K = 2: statseq's marginals within 4 standard errors of the
    Rao-Blackwellised ancestral average at k = 1..5 (the claims helper's MC)."""
    rng = np.random.default_rng(2)
    y = np.cumsum(rng.normal(size=(45, 2)), axis=0) * 0.3
    model = LinearAutoregressiveHMM(num_states=2, emission_dim=2, num_lags=2,
                                    covariance="spherical")
    params = model.initialize(y[:40], key=jax.random.key(2))
    got = ss.log_predictive_density(model, params, y[:40], y[40:45], marginal=True)
    carry = filtered_carry(model, params, y[:40])
    mc, se = rb_monte_carlo(model, params, carry, y[40:45], key=jax.random.key(9))
    assert np.all(np.abs(got - mc) < 4 * se + 1e-9), (got, mc, se)


def test_refuses_beyond_max_components(series, fitted):
    """K^h above max_components is refused with a clear message (not a memory blow-up)."""
    model, params = fitted
    carry = filtered_carry(model, params, series[:152])
    with pytest.raises(ValueError, match=r"2 x 2\^9 = 1024 regime paths.*max_components"):
        model.h_step_marginals(params, carry, jnp.zeros((10, 0)), max_components=1000)
    with pytest.raises(ValueError, match="last num_lags = 1 steps"):
        model.predict_observations(params, series[:60], num_steps=2,
                                   mask=np.arange(60) < 59)


def test_predict_observations_batches_and_flags(series, fitted):
    """A batch of histories gives, per series, the mixture of that series' own filter
    (log densities equal `log_predictive_density` of each series to 1e-10); both models
    declare that a masked step is not marginalization, every other model keeps the
    default."""
    model, params = fitted
    ys = np.stack([series[:100], series[40:140]])
    d = model.predict_observations(params, ys, num_steps=3)
    assert d.batch_shape == (2, 3) and d.event_shape == (1,)
    futures = np.stack([series[100:103], series[140:143]])
    got = np.asarray(d.log_prob(jnp.asarray(futures)))
    for i in range(2):
        ref = ss.log_predictive_density(model, params, ys[i], futures[i], marginal=True)
        np.testing.assert_allclose(got[i], ref, rtol=0, atol=1e-10)
    assert not LinearAutoregressiveHMM.marginalizes_masked_steps
    assert not MarkovSwitchingAR.marginalizes_masked_steps
    assert ss.GaussianHMM.marginalizes_masked_steps and ss.AR.marginalizes_masked_steps
    with pytest.raises(ValueError, match="takes no inputs"):
        MarkovSwitchingAR(2, 1).predict_observations(MarkovSwitchingAR(2, 1).default_params(),
                                                     series[:20, 0], num_steps=2,
                                                     future_inputs=np.zeros((2, 1)))


class _PoissonWithMarginals(ss.PoissonHMM):
    """A Poisson HMM that also returns its (exact) h-step marginals as a mixture of
    Poissons: exercises origin_forecasts' branch for non-Gaussian closed forms."""

    def h_step_marginals(self, params, carry, inputs_future):
        probs = [self._predicted(params, carry, inputs_future[0])]
        for _ in range(inputs_future.shape[0] - 1):
            probs.append(probs[-1] @ params.transitions)
        return self.mixture(jnp.stack(probs), params.emissions)


def test_origins_branch_for_other_closed_forms():
    """A model's ``h_step_marginals`` of another family (Poisson mixture) is scored by its
    density: equal to the masked-step route, exact for a Poisson HMM, to 1e-10."""
    from statseq.models.hmm import PoissonEmissions

    base = ss.PoissonHMM(num_states=2)
    params = base.assemble_params(PoissonEmissions(rates=jnp.array([1.0, 6.0])))
    y = np.array([0, 1, 0, 5, 7, 6, 1, 0, 2, 8, 5, 1])
    ref = ss.log_predictive_density(base, params, y[:8], y[8:], marginal=True)
    got = ss.log_predictive_density(_PoissonWithMarginals(num_states=2), params, y[:8], y[8:],
                                    marginal=True)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-10)
