"""One-step residuals and PIT against statsmodels and exact references.

* Nile local level at Durbin and Koopman's (2012, sec. 2.10) estimates: standardized
  prediction errors and the residual tests equal statsmodels'
  ``UnobservedComponents("llevel")`` on the same parameters (auxiliary residuals:
  ``test_auxiliary.py``);
* a two-series LGSSM with missing entries: Cholesky-standardized errors from dense
  Gaussian conditioning of the stacked ``y_{1:T}``;
* HMM PIT bounds from a NumPy forward filter and SciPy cdfs; uniformity of PIT values
  on data simulated from the model (and rejection of a wrong model).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats

import statseq as ss

NILE_PARAMS = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)


@pytest.fixture(scope="module")
def nile():
    y = ss.datasets.load_nile()
    mod = sm.tsa.UnobservedComponents(y.to_numpy(float), "llevel", use_exact_diffuse=True)
    return y, mod.smooth([15099.0, 1469.1])


def test_nile_standardized_residuals_equal_statsmodels(nile):
    y, res = nile
    e = np.asarray(ss.standardized_residuals(ss.LocalLevel(), NILE_PARAMS, y.to_numpy()))
    ref = res.filter_results.standardized_forecasts_error[0]
    assert res.nobs_diffuse == 1 and np.isnan(e[0])  # diffuse first step: undefined
    np.testing.assert_allclose(e[1:], ref[1:], rtol=1e-10, atol=1e-12)
    # Gaussian predictive: quantile residuals are the standardized errors, PIT = Phi(e)
    q = np.asarray(ss.quantile_residuals(ss.LocalLevel(), NILE_PARAMS, y.to_numpy()))
    np.testing.assert_array_equal(q, e)
    u = np.asarray(ss.pit(ss.LocalLevel(), NILE_PARAMS, y.to_numpy()))
    np.testing.assert_allclose(u[1:], stats.norm.cdf(ref[1:]), rtol=1e-10)


def test_nile_diagnose_table_equals_statsmodels_tests(nile):
    y, res = nile
    d = ss.diagnose(ss.LocalLevel(), NILE_PARAMS, y)
    lb = res.test_serial_correlation("ljungbox", lags=10)[0][:, -1]
    het = res.test_heteroskedasticity("breakvar")[0]
    jb = res.test_normality("jarquebera")[0]
    t = d.tests
    np.testing.assert_allclose(t.loc["ljung_box"], lb, rtol=1e-10)
    np.testing.assert_allclose(t.loc["heteroskedasticity"], het, rtol=1e-10)
    np.testing.assert_allclose(t.loc["jarque_bera"], jb[:2], rtol=1e-10)
    assert d.kind == "standardized" and d.acf.shape == (11,)
    from statsmodels.tsa.stattools import acf

    np.testing.assert_allclose(d.acf, acf(d.residuals[1:], nlags=10, fft=False), atol=1e-12)



def _dense_standardized(h, f, q, r, m0, p0, y, mask):
    """Cholesky-standardized one-step errors by conditioning the stacked joint of y."""
    num_t, dim = y.shape
    n = m0.size
    means, covs = [m0], [p0]
    for _ in range(num_t - 1):
        means.append(f @ means[-1])
        covs.append(f @ covs[-1] @ f.T + q)
    # Cov(x_s, x_t) = F^{s-t} P_t for s >= t
    big = np.zeros((num_t * dim, num_t * dim))
    for s in range(num_t):
        for t in range(num_t):
            if s >= t:
                c = np.linalg.matrix_power(f, s - t) @ covs[t]
            else:
                c = covs[s] @ np.linalg.matrix_power(f, t - s).T
            big[s * dim:(s + 1) * dim, t * dim:(t + 1) * dim] = h @ c @ h.T + (r if s == t else 0)
    mu = np.concatenate([h @ m for m in means])
    flat_y, flat_m = y.reshape(-1), mask.reshape(-1)
    out = np.full((num_t, dim), np.nan)
    for t in range(num_t):
        past = np.flatnonzero(flat_m[: t * dim])
        now = np.arange(t * dim, (t + 1) * dim)[mask[t]]
        if now.size == 0:
            continue
        s_pp = big[np.ix_(past, past)]
        s_np = big[np.ix_(now, past)]
        gain = np.linalg.solve(s_pp, s_np.T).T if past.size else np.zeros((now.size, 0))
        cond_mean = mu[now] + gain @ (flat_y[past] - mu[past])
        cond_cov = big[np.ix_(now, now)] - gain @ s_np.T
        z = np.linalg.solve(np.linalg.cholesky(cond_cov), flat_y[now] - cond_mean)
        out[t, mask[t]] = z
    del n
    return out


def test_vector_standardized_residuals_equal_dense_gaussian_conditioning(rng):
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    f = np.array([[0.8, 0.1], [-0.2, 0.6]])
    h = np.array([[1.0, 0.5], [0.3, -1.0]])
    q = np.array([[0.5, 0.1], [0.1, 0.3]])
    r = np.array([[0.4, -0.15], [-0.15, 0.6]])
    m0, p0 = np.array([0.5, -0.3]), np.array([[1.0, 0.2], [0.2, 0.8]])
    params = ss.LGSSMParams(jnp.asarray(m0), jnp.asarray(p0), jnp.asarray(f),
                            jnp.zeros((2, 0)), jnp.zeros(2), jnp.asarray(q), jnp.asarray(h),
                            jnp.zeros((2, 0)), jnp.zeros(2), jnp.asarray(r))
    y = rng.normal(size=(12, 2))
    mask = np.ones_like(y, bool)
    mask[4, 1] = False
    mask[7] = False
    ours = np.asarray(ss.standardized_residuals(model, params, y, mask=mask))
    ref = _dense_standardized(h, f, q, r, m0, p0, y, mask)
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-10)
    assert np.isnan(ours[7]).all() and np.isnan(ours[4, 1]) and np.isfinite(ours[4, 0])
    d = ss.diagnose(model, params, y, mask=mask, lags=2)
    assert d.tests.index.names == ["test", "series"] and d.acf.shape == (2, 3)
    assert len(d.plot(series=1).axes) == 4
    matplotlib.pyplot.close("all")


def _forward_predicted(pi, a, lik):
    """NumPy forward filter: predicted state probabilities p(z_t | y_{<t}) (T, K)."""
    out, prob = [], pi
    for t in range(lik.shape[0]):
        pred = prob if t == 0 else prob @ a
        out.append(pred)
        post = pred * lik[t]
        prob = post / post.sum()
    return np.array(out)


def test_poisson_hmm_randomized_pit_lies_between_the_scipy_mixture_cdfs():
    y = ss.datasets.load_earthquakes().to_numpy()
    model = ss.PoissonHMM(num_states=2)
    params = model.assemble_params(  # near Zucchini et al.'s (2016) two-state fit
        ss.models.hmm.poisson.PoissonEmissions(jnp.array([15.4, 26.0])),
        transitions=jnp.array([[0.93, 0.07], [0.12, 0.88]]))
    rates = np.asarray(params.emissions.rates)
    pi, a = np.asarray(model.initial_probs(params)), np.asarray(params.transitions)
    pred = _forward_predicted(pi, a, stats.poisson.pmf(y[:, None], rates[None]))
    upper = np.sum(pred * stats.poisson.cdf(y[:, None], rates[None]), axis=1)
    lower = np.sum(pred * stats.poisson.cdf(y[:, None] - 1, rates[None]), axis=1)
    u = np.asarray(ss.pit(model, params, y, key=jax.random.key(3)))
    assert np.all(u >= lower - 1e-12) and np.all(u <= upper + 1e-12)
    assert np.all(upper - lower > 1e-3)  # the draws are genuinely randomized
    np.testing.assert_array_equal(u, ss.pit(model, params, y, key=jax.random.key(3)))
    r = ss.quantile_residuals(model, params, y, key=jax.random.key(3))
    np.testing.assert_allclose(r, stats.norm.ppf(u), rtol=1e-10)
    with pytest.raises(ValueError, match="key"):
        ss.pit(model, params, y)
    with pytest.raises(ValueError, match="non-Gaussian"):
        ss.standardized_residuals(model, params, y)
    d = ss.diagnose(model, params, y, key=jax.random.key(3))
    assert d.kind == "quantile"
    np.testing.assert_allclose(d.residuals, r, rtol=1e-12)


def test_categorical_hmm_pit_bounds_and_missing_steps():
    model = ss.CategoricalHMM(num_states=2, num_classes=3)
    probs = jnp.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
    params = model.assemble_params(ss.models.hmm.categorical.CategoricalEmissions(probs))
    y = np.array([0, 2, 2, 1, 0, 2, 1, 1])
    mask = np.ones(8, bool)
    mask[3] = False
    u = np.asarray(ss.pit(model, params, y, mask=mask, key=jax.random.key(0)))
    b = np.asarray(probs)
    lik = b[:, y].T.copy()
    lik[3] = 1.0
    pred = _forward_predicted(np.asarray(model.initial_probs(params)),
                              np.asarray(params.transitions), lik)
    mix = pred @ b
    cum = np.cumsum(mix, axis=1)
    hi = cum[np.arange(8), y]
    lo = hi - mix[np.arange(8), y]
    keep = mask
    assert np.isnan(u[3])
    assert np.all((u[keep] >= lo[keep] - 1e-12) & (u[keep] <= hi[keep] + 1e-12))


def test_pit_is_uniform_on_data_simulated_from_the_model():
    model = ss.PoissonHMM(num_states=2)
    params = model.assemble_params(ss.models.hmm.poisson.PoissonEmissions(jnp.array([2.0, 9.0])))
    sim = np.random.default_rng(5)  # simulated in NumPy from the same chain
    a = np.asarray(params.transitions)
    z = [sim.choice(2, p=np.asarray(model.initial_probs(params)))]
    for _ in range(1999):
        z.append(sim.choice(2, p=a[z[-1]]))
    y = sim.poisson(np.array([2.0, 9.0])[np.array(z)])
    u = np.asarray(ss.pit(model, params, y, key=jax.random.key(2)))
    assert stats.kstest(u, "uniform").pvalue > 0.01
    # a wrong model is rejected by the same check
    wrong = model.assemble_params(ss.models.hmm.poisson.PoissonEmissions(jnp.array([3.0, 6.0])))
    u_wrong = np.asarray(ss.pit(model, wrong, y, key=jax.random.key(2)))
    assert stats.kstest(u_wrong, "uniform").pvalue < 1e-6


def test_ar_residuals_skip_the_conditioned_steps_and_equal_least_squares_residuals(log_lynx):
    model = ss.AR(order=2)
    params = model.fit_least_squares(log_lynx)
    e = np.asarray(ss.standardized_residuals(model, params, log_lynx))
    assert np.isnan(e[:2]).all()
    y = log_lynx
    fitted = (params.intercept[0] + params.coeffs[0, 0, 0] * y[1:-1]
              + params.coeffs[1, 0, 0] * y[:-2])
    np.testing.assert_allclose(e[2:], (y[2:] - fitted) / np.sqrt(params.cov[0, 0]),
                               rtol=1e-10)


def test_gaussian_hmm_pit_is_the_scipy_normal_mixture_cdf():
    model = ss.GaussianHMM(num_states=2, emission_dim=1)
    y = np.array([[0.1], [2.5], [2.0], [-0.4], [3.1]])
    params = model.initialize(y, key=jax.random.key(0))
    means = np.asarray(params.emissions.means)[:, 0]
    sds = np.sqrt(np.asarray(params.emissions.covs)[:, 0, 0])
    lik = stats.norm.pdf(y, means[None], sds[None])
    pred = _forward_predicted(np.asarray(model.initial_probs(params)),
                              np.asarray(params.transitions), lik)
    ref = np.sum(pred * stats.norm.cdf(y, means[None], sds[None]), axis=1)
    np.testing.assert_allclose(ss.pit(model, params, y), ref[:, None], rtol=1e-10)


def test_plot_diagnostics_draws_four_panels(nile):
    y, _ = nile
    d = ss.diagnose(ss.LocalLevel(), NILE_PARAMS, y)
    fig = d.plot()
    assert isinstance(fig, matplotlib.figure.Figure) and len(fig.axes) == 4
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["Standardized residual", "Histogram plus estimated density",
                      "Normal Q-Q", "Correlogram"]
    # every panel has labelled axes
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in fig.axes)
    with pytest.raises(ValueError, match="1-D"):
        ss.plot_diagnostics(np.ones((3, 2)))
    matplotlib.pyplot.close("all")


def test_plot_diagnostics_residual_name_sets_axis_labels(nile):
    y, _ = nile
    d = ss.diagnose(ss.LocalLevel(), NILE_PARAMS, y)
    labels = lambda fig: [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes]  # noqa: E731
    # the default keeps the generic labels
    assert labels(d.plot()) == [("time step", "residual"), ("residual", "density"),
                                ("theoretical quantile", "sample quantile"),
                                ("lag", "autocorrelation")]
    named = [("time step", "pseudo-residual"), ("pseudo-residual", "density"),
             ("N(0, 1) quantile", "pseudo-residual quantile"), ("lag", "autocorrelation")]
    fig = d.plot(residual_name="pseudo-residual")
    assert labels(fig) == named
    assert [ax.get_title() for ax in fig.axes][0] == "Pseudo-residual"
    fig = ss.plot_diagnostics(d.residuals, residual_name="pseudo-residual")
    assert labels(fig) == named
    # the data drawn do not depend on the labels
    np.testing.assert_array_equal(fig.axes[0].lines[0].get_ydata(),
                                  d.plot().axes[0].lines[0].get_ydata())
    with pytest.raises(TypeError, match="residual_name"):
        ss.plot_diagnostics(d.residuals, residual_name=1)
    with pytest.raises(ValueError, match="residual_name"):
        d.plot(residual_name=" ")
    matplotlib.pyplot.close("all")


def test_bad_input_is_rejected(nile):
    y, _ = nile
    with pytest.raises(ValueError, match="one series"):
        ss.diagnose(ss.LocalLevel(), NILE_PARAMS, np.stack([y.to_numpy()] * 2))
    with pytest.raises(TypeError, match="to_arrays"):
        ss.auxiliary_residuals(ss.AR(order=1), ss.AR(order=1).default_params(), y.to_numpy())

