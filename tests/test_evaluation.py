"""Information criteria against statsmodels, and held-out log scores."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.tsa.ar_model import AutoReg

import statseq as ss


@pytest.mark.parametrize("order", [1, 2, 3])
def test_information_criteria_match_autoreg(log_lynx, order):
    """statsmodels' AutoReg uses AIC = -2 llf + 2 (df_model + 1) and BIC = -2 llf +
    log(nobs) (df_model + 1), with df_model = 1 + p mean parameters, + 1 for sigma2, and
    nobs = T - p: the same k and n as statseq's free-parameter count and scored steps."""
    model = ss.AR(order=order)
    params = model.fit_least_squares(log_lynx)
    res = AutoReg(log_lynx, lags=order, trend="c").fit()
    ic = ss.information_criteria(model, params, log_lynx)
    assert ic["num_params"] == res.df_model + 1 == order + 2
    assert ic["num_obs"] == res.nobs == log_lynx.size - order
    np.testing.assert_allclose(ic["log_lik"], res.llf, rtol=1e-10)
    np.testing.assert_allclose(ic["aic"], res.aic, rtol=1e-10)
    np.testing.assert_allclose(ic["bic"], res.bic, rtol=1e-10)


def test_information_criteria_formula_with_mask_and_vectors(log_lynx):
    model = ss.AR(order=1, emission_dim=2)
    y = np.stack([log_lynx, np.roll(log_lynx, 3)], axis=-1)
    mask = np.ones_like(y, bool)
    mask[10, 1] = mask[20] = False
    params = model.fit_least_squares(y, mask=mask)
    ic = ss.information_criteria(model, params, y, mask=mask)
    k = 4 + 2 + 3  # A (2x2), c (2), Sigma (3 free entries)
    n = 2 * (log_lynx.size - 1) - 3  # the first step is conditioned on; 3 entries masked
    log_lik = float(ss.log_prob(model, params, y, mask=mask))
    assert ic["num_params"] == k and ic["num_obs"] == n
    np.testing.assert_allclose(ic["log_lik"], log_lik, rtol=1e-12)
    np.testing.assert_allclose(ic["aic"], -2 * log_lik + 2 * k, rtol=1e-12)
    np.testing.assert_allclose(ic["bic"], -2 * log_lik + k * np.log(n), rtol=1e-12)
    frozen = ss.ARParams(coeffs=True, intercept=False, input_weights=False, cov=False)
    assert ss.information_criteria(model, params, y, mask=mask, trainable=frozen)[
        "num_params"] == 4


@pytest.mark.parametrize("initial", ["conditional", "stationary"])
def test_log_score_is_difference_of_log_probs(log_lynx, initial):
    model = ss.AR(order=2, initial=initial)
    params = ss.AR(order=2).fit_least_squares(log_lynx)
    train, test = log_lynx[:16], log_lynx[16:]  # lengths other tests compile too
    score = ss.log_score(model, params, train, test)
    expected = float(ss.log_prob(model, params, log_lynx) - ss.log_prob(model, params, train))
    np.testing.assert_allclose(score, expected, rtol=1e-10)


def test_log_score_with_inputs(log_lynx):
    model = ss.AR(order=2, input_dim=1)
    u = np.cos(np.arange(log_lynx.size) / 2.0)[:, None]
    params = model.fit_least_squares(log_lynx, inputs=u)
    score = ss.log_score(model, params, log_lynx[:16], log_lynx[16:], inputs_train=u[:16],
                         inputs_test=u[16:])
    expected = float(ss.log_prob(model, params, log_lynx, inputs=u)
                     - ss.log_prob(model, params, log_lynx[:16], inputs=u[:16]))
    np.testing.assert_allclose(score, expected, rtol=1e-10)


# ---- forecast scores ------------------------------------------------------------------
def _brute_crps(samples, y, fair):
    """O(S^2) CRPS: mean |X - y| - sum_{i,j} |X_i - X_j| / (2 S (S-1) or 2 S^2)."""
    s = samples.shape[0]
    pairs = np.abs(samples[:, None] - samples[None, :]).sum(axis=(0, 1))
    return np.abs(samples - y).mean(axis=0) - pairs / (2 * s * (s - 1) if fair else 2 * s * s)


@pytest.mark.parametrize("estimator", ["fair", "energy"])
def test_crps_sorted_equals_brute_force(rng, estimator):
    samples = rng.gamma(2.0, size=(57, 3, 2))  # skewed, with an odd sample count
    y = rng.normal(size=(3, 2))
    np.testing.assert_allclose(
        ss.evaluation.crps_from_samples(samples, y, estimator=estimator),
        _brute_crps(samples, y, estimator == "fair"), rtol=1e-12)


def test_crps_gaussian_closed_form_against_integral_and_samples(rng):
    from scipy.integrate import quad
    from scipy.stats import norm

    mean, std = np.array([0.3, -1.0, 2.0]), np.array([1.5, 0.4, 2.0])
    y = np.array([1.0, -1.2, -3.0])
    exact = ss.evaluation.crps_gaussian(mean, std, y)
    for m, s, v, c in zip(mean, std, y, exact, strict=True):
        below = quad(lambda z, m=m, s=s: norm.cdf(z, m, s) ** 2, -np.inf, v)[0]
        above = quad(lambda z, m=m, s=s: norm.sf(z, m, s) ** 2, v, np.inf)[0]
        np.testing.assert_allclose(c, below + above, rtol=1e-8)
    # the fair sample estimator is unbiased: within 4 Monte Carlo standard errors (the
    # spread of 20 independent batch estimates / sqrt(20))
    batches = np.stack([ss.crps(mean + std * rng.standard_normal((2000, 3)), y)
                        for _ in range(20)])
    se = batches.std(axis=0, ddof=1) / np.sqrt(20)
    assert np.all(np.abs(batches.mean(axis=0) - exact) < 4 * se)
    assert np.all(se < 0.01 * exact)  # the check has power


def test_interval_coverage_and_score(rng):
    samples = rng.normal(size=(4000, 6))
    y = np.array([0.0, 0.5, -1.0, 1.2, 2.0, np.nan])  # NaN = missing, left out
    cov = ss.interval_coverage(samples, y, levels=(0.5, 0.9))
    for level, value in cov.items():
        lo, hi = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2], axis=0)
        inside = [(a <= b <= c) for a, b, c in zip(lo[:5], y[:5], hi[:5], strict=True)]
        assert value == np.mean(inside)
    lo, hi = np.quantile(samples, [0.05, 0.95], axis=0)
    expected = (hi - lo) + 20 * np.maximum(lo - y, 0) + 20 * np.maximum(y - hi, 0)
    np.testing.assert_allclose(ss.interval_score(samples, y, 0.9), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="levels must lie in"):
        ss.interval_coverage(samples, y, levels=(1.5,))
    with pytest.raises(ValueError, match="forecast's shape"):
        ss.crps(samples, y[:3])


def _ar1_marginals(params, last, h):
    """Exact h-step marginals of a scalar AR(1): y_{T+k} | y_T ~ N(mu_k, v_k)."""
    a, c, s2 = float(params.coeffs[0, 0, 0]), float(params.intercept[0]), float(params.cov[0, 0])
    means, variances, m, v = [], [], last, 0.0
    for _ in range(h):
        m, v = c + a * m, a * a * v + s2
        means.append(m)
        variances.append(v)
    return np.array(means), np.array(variances)


def test_log_predictive_density_marginal_and_joint(log_lynx):
    from scipy.stats import norm

    model = ss.AR(order=1)
    params = model.fit_least_squares(log_lynx)
    train, test = log_lynx[:100], log_lynx[100:106]
    marg = ss.log_predictive_density(model, params, train, test, marginal=True)
    means, variances = _ar1_marginals(params, train[-1], test.size)
    np.testing.assert_allclose(marg, norm.logpdf(test, means, np.sqrt(variances)), rtol=1e-10)
    joint = ss.log_predictive_density(model, params, train, test)
    assert joint == ss.log_score(model, params, train, test)
    np.testing.assert_allclose(marg[0], float(
        ss.log_score(model, params, train, test[:1])), rtol=1e-10)


def test_log_predictive_density_marginal_poisson_hmm():
    """HMM h-step marginals: sum_z p(z_{T+k} | y_{1:T}) Poisson(y; rate_z), by predict_states."""
    from scipy.stats import poisson

    quakes = ss.datasets.load_earthquakes().to_numpy()
    model = ss.PoissonHMM(num_states=2)
    params = model.default_params() if hasattr(model, "default_params") else None
    if params is None:
        import jax

        params = model.initialize(quakes, key=jax.random.key(0))
    train, test = quakes[:90], quakes[90:95]
    marg = ss.log_predictive_density(model, params, train, test, marginal=True)
    probs = np.asarray(model.predict_states(params, train, num_steps=test.size))
    rates = np.asarray(params.emissions.rate if hasattr(params.emissions, "rate")
                       else params.emissions).reshape(-1)
    expected = np.log((probs * poisson.pmf(test[:, None], rates[None, :])).sum(axis=1))
    np.testing.assert_allclose(marg, expected, rtol=1e-10)


def test_gaussian_forecast_scores_are_exact():
    """A GaussianForecast is scored in closed form, equal to the filter's h-step marginals."""
    nile = ss.datasets.load_nile().to_numpy().astype(float)
    model = ss.LocalLevel()
    params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
    fc = model.forecast_moments(params, nile[:90], num_steps=10)
    table = ss.evaluate_forecast(fc, nile[90:])
    exact = ss.log_predictive_density(model, params, nile[:90], nile[90:], marginal=True)
    np.testing.assert_allclose(table["log_score"], exact, rtol=1e-10)
    np.testing.assert_allclose(
        table["crps"], ss.evaluation.crps_gaussian(fc.mean, fc.std, nile[90:]), rtol=1e-12)
    lo, hi = fc.interval(0.9)
    np.testing.assert_allclose(table["lower_90"], lo, rtol=1e-12)
    assert table["covered_90"].tolist() == [float(a <= b <= c) for a, b, c in
                                            zip(lo, nile[90:], hi, strict=True)]


# ---- rolling-origin backtests ---------------------------------------------------------
def _lynx_series(log_lynx, gap=True):
    import pandas as pd

    y = pd.Series(log_lynx, index=pd.Index(np.arange(1821, 1935), name="year"))
    if gap:
        y.iloc[[40, 95]] = np.nan  # missing values: masked, neither conditioned on nor scored
    return y


@pytest.mark.parametrize("case", ["ar_stationary", "local_level", "poisson_hmm"])
def test_backtest_equals_direct_forecasts_on_truncated_series(log_lynx, case):
    """Trailing-origin masking reproduces a forecast from the truncated series exactly,
    also for a diffuse (local level) and a stationary (AR) initial law."""
    import jax

    key = jax.random.key(3)
    if case == "ar_stationary":
        model = ss.AR(order=2, initial="stationary")
        y = _lynx_series(log_lynx)
        params = ss.AR(order=2).fit_least_squares(log_lynx)
    elif case == "local_level":
        model = ss.LocalLevel()
        y = _lynx_series(log_lynx)
        params = ss.LocalLevelParams(obs_var=0.05, level_var=0.02)
    else:
        model = ss.PoissonHMM(num_states=2)
        y = ss.datasets.load_earthquakes()
        params = model.initialize(y.to_numpy(), key=jax.random.key(0))
    res = ss.backtest(model, params, y, initial=93, horizon=3, step=4, num_samples=50, key=key)
    assert res.origins.tolist() == list(range(93, len(y) - 3 + 1, 4))  # o + h <= T
    for i, o in list(enumerate(res.origins))[2:3]:  # one inner origin (each length compiles)
        fc = ss.forecast(model, params, y.iloc[:o], num_steps=3, num_samples=50,
                         key=jax.random.fold_in(key, i))
        np.testing.assert_allclose(res.samples[i], fc.samples, rtol=1e-9, atol=1e-9)
        rows = res.table[res.table["origin"] == o]
        assert rows["time"].tolist() == y.index[o:o + 3].tolist() == fc.index.tolist()
        truth = y.iloc[o:o + 3].to_numpy().astype(float)
        np.testing.assert_allclose(rows["crps"], ss.crps(fc, truth), rtol=1e-10)
        np.testing.assert_allclose(rows["log_score"], ss.log_predictive_density(
            model, params, y.iloc[:o], y.iloc[o:o + 3], marginal=True), rtol=1e-10)
        if case == "local_level":  # an independent exact path: the Kalman forecast
            gfc = model.forecast_moments(params, y.iloc[:o], num_steps=3)
            np.testing.assert_allclose(rows["log_score"],
                                       ss.evaluation.gaussian_log_density(gfc, truth))
    assert res.summary.index.tolist() == [1, 2, 3]
    np.testing.assert_allclose(res.summary["crps"],
                               res.table.groupby("horizon")["crps"].mean())


def test_backtest_refits_at_each_origin(log_lynx):
    import jax

    calls = []

    def fit(model, y_past):
        calls.append(len(y_past))
        return model.fit_least_squares(y_past)

    model = ss.AR(order=1)
    res = ss.backtest(model, fit, log_lynx, origins=[60, 90], horizon=4, num_samples=20,
                      key=jax.random.key(0), levels=(0.8,))
    assert calls == [60, 90]
    for o in (60, 90):
        params = model.fit_least_squares(log_lynx[:o])
        rows = res.table[res.table["origin"] == o]
        means, variances = _ar1_marginals(params, log_lynx[o - 1], 4)
        from scipy.stats import norm

        np.testing.assert_allclose(rows["log_score"], norm.logpdf(
            log_lynx[o:o + 4], means, np.sqrt(variances)), rtol=1e-9)
    assert {"lower_80", "upper_80", "covered_80"} <= set(res.table.columns)


def test_backtest_vector_series_per_dimension(log_lynx):
    """VAR(1) h-step marginals per dimension: N(m_k, V_k), m_k = c + A m_{k-1},
    V_k = A V_{k-1} A^T + Sigma, checked against the backtest's per-series log scores."""
    import jax
    import pandas as pd
    from scipy.stats import norm

    y = pd.DataFrame({"a": log_lynx, "b": np.roll(log_lynx, 3)})
    model = ss.AR(order=1, emission_dim=2)
    params = model.fit_least_squares(y.to_numpy())
    res = ss.backtest(model, params, y, origins=[100], horizon=2, num_samples=30,
                      key=jax.random.key(1))
    assert res.table["series"].tolist() == ["a", "b", "a", "b"]
    a, c, sigma = (np.asarray(params.coeffs[0]), np.asarray(params.intercept),
                   np.asarray(params.cov))
    m, v = y.to_numpy()[99], np.zeros((2, 2))
    for k in range(2):
        m, v = c + a @ m, a @ v @ a.T + sigma
        got = res.table[res.table["horizon"] == k + 1]["log_score"].to_numpy()
        np.testing.assert_allclose(got, norm.logpdf(y.to_numpy()[100 + k], m,
                                                    np.sqrt(np.diag(v))), rtol=1e-9)


def test_backtest_validates_origins(log_lynx):
    import jax

    model = ss.AR(order=2)
    params = model.fit_least_squares(log_lynx)
    with pytest.raises(ValueError, match="origins must lie in"):
        ss.backtest(model, params, log_lynx, origins=[1], horizon=2, key=jax.random.key(0))
    with pytest.raises(ValueError, match="no origins"):
        ss.backtest(model, params, log_lynx, initial=113, horizon=5, key=jax.random.key(0))


# ---- pandas in, time-indexed forecasts out ---------------------------------------------
def test_forecast_from_pandas_knows_future_time(log_lynx):
    import jax
    import pandas as pd

    y = pd.Series(log_lynx, index=pd.date_range("1821-01-01", periods=114, freq="YS"))
    y.iloc[10] = np.nan
    model = ss.AR(order=2)
    params = model.fit_least_squares(log_lynx)
    fc = ss.forecast(model, params, y, num_steps=3, num_samples=400, key=jax.random.key(0))
    assert [t.year for t in fc.index] == [1935, 1936, 1937]
    mask = ss.missing_mask(y.to_numpy())
    same = ss.forecast(model, params, np.nan_to_num(y.to_numpy()), mask=mask, num_steps=3,
                       num_samples=400, key=jax.random.key(0))
    np.testing.assert_array_equal(fc.samples, same.samples)  # NaN = masked
    frame = fc.to_frame(levels=(0.9,))
    assert list(frame.columns) == ["mean", "median", "lower_90", "upper_90"]
    assert frame.index.equals(fc.index)
    lo, hi = fc.interval(0.9)
    np.testing.assert_allclose(frame["lower_90"], lo)
    np.testing.assert_allclose(frame["mean"], fc.mean())
    table = ss.evaluate_forecast(fc, pd.Series(log_lynx[-3:], index=fc.index))
    assert table["time"].tolist() == fc.index.tolist()
    ax = fc.plot()
    assert ax.lines[0].get_xdata()[0] == y.index[0]  # drawn against real dates


def test_future_index_kinds():
    import pandas as pd

    months = pd.date_range("2020-01-01", periods=4, freq="MS")
    assert ss.future_index(months, 2).tolist() == list(pd.date_range("2020-05-01", periods=2,
                                                                     freq="MS"))
    no_freq = pd.DatetimeIndex(list(months))  # freq inferred
    assert ss.future_index(no_freq, 1)[0] == pd.Timestamp("2020-05-01")
    quarters = pd.period_range("2020Q1", periods=3, freq="Q")
    assert [str(p) for p in ss.future_index(quarters, 2)] == ["2020Q4", "2021Q1"]
    assert ss.future_index(pd.Index([1990, 1995, 2000]), 2).tolist() == [2005, 2010]
    assert ss.future_index(pd.RangeIndex(5), 1).tolist() == [5]
    irregular = pd.DatetimeIndex(["2020-01-01", "2020-01-03", "2020-02-01"])
    with pytest.warns(UserWarning, match="regular frequency"):
        assert ss.future_index(irregular, 2) is None


def test_vector_forecast_frame_and_compare(log_lynx):
    import jax
    import pandas as pd

    y = pd.DataFrame({"a": log_lynx, "b": np.roll(log_lynx, 3)})
    model = ss.AR(order=1, emission_dim=2)
    params = model.fit_least_squares(y.to_numpy())
    fc = ss.forecast(model, params, y.iloc[:110], num_steps=4, num_samples=300,
                     key=jax.random.key(2))
    frame = fc.to_frame(levels=(0.5,))
    assert frame.index.tolist() == [110, 111, 112, 113]
    np.testing.assert_allclose(frame[("mean", "b")], np.asarray(fc.mean())[:, 1], rtol=1e-12)
    table = ss.evaluate_forecast(fc, y.iloc[110:])
    assert table.shape[0] == 8 and table["series"].tolist()[:2] == ["a", "b"]
    np.testing.assert_allclose(table["crps"].to_numpy().reshape(4, 2),
                               ss.crps(fc, y.iloc[110:].to_numpy()))
    wide = ss.forecast(model, params._replace(cov=params.cov * 4), y.iloc[:110], num_steps=4,
                       num_samples=300, key=jax.random.key(2))
    comp = ss.compare_forecasts({"fitted": fc, "too wide": wide}, y.iloc[110:],
                                levels=(0.5, 0.9))
    assert list(comp.index) == ["fitted", "too wide"]
    assert comp.loc["too wide", "width_90"] > comp.loc["fitted", "width_90"]
    np.testing.assert_allclose(comp.loc["fitted", "crps"], table["crps"].mean())
    assert np.isnan(comp.loc["fitted", "log_score"])  # no density from samples


def test_backtest_too_early_origin_scores_nan(log_lynx):
    """A local linear trend needs two values to identify its diffuse level and slope: from
    one value its forecast is improper, so those rows are NaN (with a warning), never the
    diffuse likelihood term in disguise."""
    import jax

    model = ss.LocalLinearTrend()
    params = model.default_params()
    with pytest.warns(UserWarning, match=r"origins \[1\] are not finite"):
        res = ss.backtest(model, params, log_lynx, origins=[1, 50], horizon=2, num_samples=10,
                          key=jax.random.key(0))
    early, late = res.table[res.table["origin"] == 1], res.table[res.table["origin"] == 50]
    assert early[["crps", "log_score"]].isna().all().all()
    gfc = model.forecast_moments(params, log_lynx[:50], num_steps=2)
    np.testing.assert_allclose(late["log_score"], ss.evaluation.gaussian_log_density(
        gfc, log_lynx[50:52]), rtol=1e-10)
