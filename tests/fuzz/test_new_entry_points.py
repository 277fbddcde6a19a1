"""Fuzz: bad and edge inputs for the newest entry points (issue 11, point 5).

`spurious_states`, `psis`, `lfo_cv`, `sample_prior`, `predictive_check`, `naive_params`,
`naive_forecast`, `naive_model` and `backtest` get wrong shapes and dtypes, NaN/inf,
out-of-range values, 1e300 and 1e-300, all-missing data, K = 1, T = 0 and 1, and
(backtest) horizons and origins off the series. Each must raise a ``ValueError`` or
``TypeError`` naming the argument, or return a finite result checked against a reference
written out here: ArviZ's ``psislw`` (or, where it returns NaN, the exact uniform
weights), brute-force enumeration of the HMM's state paths, the naive and seasonal naive
formulas of Hyndman and Athanasopoulos (2021, *Forecasting: Principles and Practice*, 3rd
ed., sec. 5.2 and 5.5) and the AR(1) h-step predictive density in closed form.

Inputs that were broken before this file (and are fixed in the library): `psis` returned
NaN weights for log weights a few ulps apart (``linspace(0, 1e-300)``; ArviZ too), read a
complex array as its real part and a 2-D array as one flattened set; `spurious_states`
raised NumPy's "ufunc 'isfinite' not supported" for a non-numeric threshold and judged
all-missing data from the prior; `naive_params` took ``inf`` as missing, gave an ``inf``
variance for 1e300 data, a zero one for a constant (or 1e-300) series (later "params.cov
violates its constraint"), dropped imaginary parts and read a mask of 0.5 as True;
`naive_forecast` refused a gap inside the history it allows; `predictive_check` accepted
negative or fractional counts and 1e300, gave p = 0 for a statistic undefined at the data
(variance / mean of an all-zero series), and failed with "only 0-dimensional arrays can be
converted" for a statistic of the wrong shape; `lfo_cv` said "could not convert string to
float" for a string threshold and, with one posterior draw, ran NUTS before failing inside
`psis`; `backtest` scored duplicate origins twice, said "no origins" for float origins and
"could not convert string to float" for string levels, and warned instead of refusing an
all-missing series. Nothing here samples: every `lfo_cv` case is refused before NUTS.
"""

from __future__ import annotations

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import norm

import statseq as ss
from statseq.bayes import lfo_cv, predictive_check, sample_prior
from statseq.bayes.lfo import psis
from statseq.models.hmm.gaussian_params import GaussianEmissions

KEY = jax.random.key(0)


# ---- psis -----------------------------------------------------------------------------------
@pytest.mark.parametrize("log_weights, err, pattern", [
    (np.array([1 + 1j, 2.0, 3.0]), TypeError, "log_weights must be real"),
    (np.array(["a", "b", "c"]), TypeError, "log_weights must be real"),
    (np.zeros((10, 10)), ValueError, r"log_weights must be one set of weights \(S,\)"),
    (np.zeros(()), ValueError, "log_weights must be one set"),
    ([0.0], ValueError, "at least 2 finite"),
    ([], ValueError, "at least 2 finite"),
    (None, ValueError, "at least 2 finite"),
    ([0.0, np.nan, 1.0], ValueError, "at least 2 finite"),
    ([0.0, np.inf, 1.0], ValueError, "at least 2 finite"),
    ([0.0, -np.inf, 1.0], ValueError, "at least 2 finite"),
], ids=["complex", "strings", "2d", "0d", "one", "empty", "none", "nan", "inf", "-inf"])
def test_psis_refuses(log_weights, err, pattern):
    with pytest.raises(err, match=pattern):
        psis(log_weights)


def _psis_cases():
    rng = np.random.default_rng(7)
    return {
        "all-equal": np.zeros(100),
        "1e300-spread": np.linspace(-1e300, 1e300, 100),
        "one-dominant-1e300": np.r_[np.zeros(99), 1e300],
        "one-dominant-50": np.r_[np.zeros(99), 50.0],
        "half-at--1e300": np.r_[np.full(50, -1e300), rng.normal(size=50)],
        "eps-tail": np.r_[np.zeros(90), np.full(10, 1e-14)],
        "offset-1e300": rng.normal(size=200) - 1e300,
        "two": np.array([0.0, 1.0]),
        "five": np.arange(5.0),
        "cauchy": 5.0 * rng.standard_t(1.0, size=500),
    }


@pytest.mark.skipif(not hasattr(pytest.importorskip("arviz"), "psislw"),
                    reason="arviz without psislw (1.x)")
@pytest.mark.parametrize("name", list(_psis_cases()))
def test_psis_extreme_weights_match_arviz(name):
    import arviz as az

    lw = _psis_cases()[name]
    ours, k = psis(lw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref, k_ref = az.psislw(lw.copy())
    assert np.all(np.isfinite(ours)) and abs(logsumexp(ours)) < 1e-12
    assert (k == float(k_ref)) if not np.isfinite(k_ref) else abs(k - float(k_ref)) < 1e-10
    np.testing.assert_allclose(np.exp(ours), np.exp(np.asarray(ref)), rtol=1e-9, atol=1e-15)


def test_psis_log_weights_ulps_apart_are_equal_weights():
    # exp(lw) is exactly 1.0 for every lw in [-1e-300, 0]: equal weights, no tail to fit
    # (ArviZ 0.23's psislw returns NaN here; before the fix so did psis).
    lw = np.linspace(0.0, 1e-300, 100)
    ours, k = psis(lw)
    np.testing.assert_array_equal(ours, np.full(100, -np.log(100.0)))
    assert k == np.inf  # as for exactly equal weights (and ArviZ on np.zeros(100))


# ---- spurious_states ------------------------------------------------------------------------
def _gauss_hmm(k, means, variances):
    pi = np.full(k, 1.0 / k)
    a = np.full((k, k), 0.2 / max(k - 1, 1)) + np.eye(k) * (0.8 - 0.2 / max(k - 1, 1))
    params = ss.HMMParams(jnp.asarray(pi), jnp.asarray(a / a.sum(1, keepdims=True)),
                          GaussianEmissions(jnp.asarray(means, float)[:, None],
                                            jnp.asarray(variances, float)[:, None, None]))
    return ss.GaussianHMM(num_states=k, emission_dim=1), params


def _brute_force_occupancy(params, y, mask):
    """``sum_t p(z_t = k | y)`` by enumerating every state path (NumPy)."""
    pi, a = np.asarray(params.initial_probs), np.asarray(params.transitions)
    mu, var = np.asarray(params.emissions.means)[:, 0], np.asarray(params.emissions.covs)[:, 0, 0]
    k, t = pi.size, y.shape[0]
    occ, total = np.zeros(k), 0.0
    for path in itertools.product(range(k), repeat=t):
        w = pi[path[0]] * np.prod([a[i, j] for i, j in zip(path[:-1], path[1:], strict=True)])
        for s, z in enumerate(path):
            if mask[s]:
                w *= norm.pdf(y[s, 0], mu[z], np.sqrt(var[z]))
        total += w
        for z in path:
            occ[z] += w
    return occ / total


def _scale(y, mask):
    """``min(var(y), var(diff y))`` over observed values, 1 when undefined (as documented)."""
    obs = np.where(mask, y[:, 0], np.nan)
    cands = [np.nanvar(c) for c in (obs, np.diff(obs)) if np.isfinite(c).sum() > 1]
    cands = [c for c in cands if c > 0]
    return min(cands) if cands else 1.0


@pytest.mark.parametrize("case", ["two-states", "one-state", "T=1", "gap"])
def test_spurious_states_hand_built(case):
    y = np.array([[-0.4], [0.3], [5.0], [-0.1], [0.6], [5.0]])
    mask = np.ones(6, bool)
    model, params = _gauss_hmm(2, [0.0, 5.0], [0.5, 1e-6])
    if case == "one-state":
        model, params = _gauss_hmm(1, [0.5], [4.0])
    elif case == "T=1":
        y, mask = y[:1], mask[:1]
    elif case == "gap":
        mask[3] = False
    check = ss.spurious_states(model, params, y, mask=None if case != "gap" else mask)
    occ = _brute_force_occupancy(params, y, mask)
    np.testing.assert_allclose(check.occupancy, occ, rtol=1e-9)
    ratio = np.asarray(params.emissions.covs)[:, 0, 0] / _scale(y, mask)
    np.testing.assert_allclose(check.variance_ratio, ratio, rtol=1e-12)
    assert check.min_occupancy == 5.0 and check.min_variance_ratio == 1e-3
    np.testing.assert_array_equal(check.spurious, (occ < 5.0) | (ratio < 1e-3))
    if case == "two-states":  # the state on the two 5.0s with variance 1e-6 is spurious
        assert check.spurious.tolist() == [True, True]  # (and state 0 has only ~4 steps)
        np.testing.assert_allclose(occ, [4.0, 2.0], atol=1e-6)


@pytest.mark.parametrize("kwargs, err, pattern", [
    ({"min_variance_ratio": "a"}, TypeError, "min_variance_ratio must be a real number"),
    ({"min_variance_ratio": np.ones(2)}, TypeError, "min_variance_ratio must be a real"),
    ({"min_variance_ratio": 1e-3 + 1j}, TypeError, "min_variance_ratio must be a real"),
    ({"min_variance_ratio": np.nan}, ValueError, "min_variance_ratio must be a finite"),
    ({"min_variance_ratio": -1.0}, ValueError, "min_variance_ratio must be a finite"),
    ({"min_occupancy": "x"}, TypeError, "min_occupancy must be a real number"),
    ({"min_occupancy": True}, TypeError, "min_occupancy must be a real number"),
    ({"min_occupancy": np.inf}, ValueError, "min_occupancy must be a finite"),
    ({"min_occupancy": -1}, ValueError, "min_occupancy must be a finite"),
    ({"mask": np.zeros(6, bool)}, ValueError, "spurious_states: y has no observed values"),
    ({"mask": np.ones(5, bool)}, ValueError, "mask must have shape"),
    ({"y": np.full((6, 1), 1e300)}, ValueError, "squares overflow"),
    ({"y": np.r_[np.zeros(5), np.nan][:, None]}, ValueError, "non-finite"),
    ({"y": np.zeros((0, 1))}, ValueError, "no time steps"),
    # a 1-D array is one series for a (1,)-event model (the input convention); a trailing
    # axis of the wrong length is refused, naming the accepted shapes
    ({"y": np.zeros((6, 2))}, ValueError, r"expects \(1,\).*Accepted"),
], ids=["ratio-str", "ratio-array", "ratio-complex", "ratio-nan", "ratio-neg", "occ-str",
        "occ-bool", "occ-inf", "occ-neg", "all-missing", "mask-shape", "1e300", "nan",
        "T=0", "wrong-event-axis"])
def test_spurious_states_refuses(kwargs, err, pattern):
    model, params = _gauss_hmm(2, [0.0, 5.0], [0.5, 1e-6])
    y = kwargs.pop("y", np.linspace(-1.0, 1.0, 6)[:, None])
    with pytest.raises(err, match=pattern):
        ss.spurious_states(model, params, y, **kwargs)


def test_spurious_states_none_without_state_covariances():
    y = np.array([1, 0, 3, 2, 5, 4])
    model = ss.PoissonHMM(num_states=2)
    assert ss.spurious_states(model, model.initialize(y, key=KEY), y) is None
    tied = ss.GaussianHMM(num_states=2, emission_dim=1, covariance="tied")
    yr = y[:, None].astype(float)
    assert ss.spurious_states(tied, tied.initialize(yr, key=KEY), yr) is None


# ---- naive forecasts ------------------------------------------------------------------------
def _fpp3(y, h, m):
    """Hyndman and Athanasopoulos (2021) sec. 5.2 / 5.5, written out: ``yhat_{T+h|T} =
    y_{T+h-m(k+1)}`` and ``sigma_h = sigma sqrt(k + 1)`` (``= sigma sqrt(h)`` for ``m =
    1``), ``k = floor((h-1)/m)``, ``sigma^2`` the mean of the observed ``(y_t - y_{t-m})^2``."""
    t = y.size
    resid = y[m:] - y[:-m]
    sigma2 = np.nanmean(resid**2)
    steps = np.arange(1, h + 1)
    k = (steps - 1) // m
    return y[t + steps - m * (k + 1) - 1], np.sqrt(sigma2 * (k + 1))


@pytest.mark.parametrize("period, scale, gaps", [
    (1, 1.0, False), (4, 1.0, False), (1, 1.0, True), (4, 1.0, True), (3, 1e70, False),
    (1, 1e-150, True)], ids=["naive", "seasonal", "naive-gaps", "seasonal-gaps", "1e70",
                              "1e-150"])
def test_naive_forecast_matches_fpp3(period, scale, gaps):
    rng = np.random.default_rng(period)
    y = scale * (np.cumsum(rng.normal(size=14)) + np.tile(np.arange(period), 14)[:14])
    if gaps:
        y[[1, 2, 7]] = np.nan  # (two gaps among the first `period` values)
    fc = ss.naive_forecast(y, 9, period=period)
    mean, std = _fpp3(y, 9, period)
    np.testing.assert_allclose(np.asarray(fc.mean), mean, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(fc.std), std, rtol=1e-10)
    params = ss.naive_params(y, period=period)
    np.testing.assert_allclose(float(params.cov[0, 0]), std[0] ** 2, rtol=1e-10)


def test_naive_params_shortest_series_and_mask():
    # T = period + 1: one residual; a mask drops the residuals that touch a masked value
    p = ss.naive_params(np.array([2.0, 5.0]))
    assert float(p.cov[0, 0]) == 9.0 and np.asarray(p.coeffs).ravel().tolist() == [1.0]
    p = ss.naive_params(np.array([1.0, 3.0, 2.0, 4.0]), mask=np.array([1, 1, 0, 1]))
    assert float(p.cov[0, 0]) == 4.0  # only (3 - 1)^2 survives
    p = ss.naive_params(np.array([1.0, 2.0, 4.0, 7.0, 11.0]), period=3)
    assert float(p.cov[0, 0]) == 58.5 and np.asarray(p.coeffs).ravel().tolist() == [0, 0, 1]


@pytest.mark.parametrize("y, kwargs, err, pattern", [
    (np.r_[1.0, 3.0, np.inf, 2.0], {}, ValueError, "y has infinite values"),
    (np.array([1.0, 3.0, 2.0]) * 1e300, {}, ValueError, "squares overflow"),
    (np.array([1.0, 3.0, 2.0]) * 1e150, {}, ValueError, "sigma\\^2 would exceed sqrt"),
    (np.array([1.0, 3.0, 2.0]) * 1e-300, {}, ValueError, "sigma is 0"),
    (np.full(5, 2.5), {}, ValueError, "sigma is 0"),
    (np.array([1.0, 2.0, 1.0, 2.0]), {"period": 2}, ValueError, "sigma is 0"),
    (np.full(5, np.nan), {}, ValueError, "no pair of observed values"),
    (np.array([1.0, np.nan, 2.0, np.nan]), {}, ValueError, "no pair of observed values"),
    (np.zeros(0), {}, ValueError, "more than period = 1 values, got 0"),
    (np.zeros(1), {}, ValueError, "more than period = 1 values, got 1"),
    (np.arange(4.0), {"period": 4}, ValueError, "more than period = 4"),
    (np.arange(4.0)[:, None], {}, ValueError, r"one scalar series \(T,\)"),
    (np.arange(4.0) + 1j, {}, TypeError, "y must hold real numbers"),
    (np.array(["a", "b", "c"]), {}, TypeError, "y must hold real numbers"),
    (np.arange(4.0), {"mask": np.ones(3, bool)}, ValueError, "mask must have the shape"),
    (np.arange(4.0), {"mask": np.array([0.5, 1, 1, 1])}, ValueError, "mask must be boolean"),
    (np.arange(4.0), {"period": 0}, ValueError, "period must be >= 1"),
    (np.arange(4.0), {"period": 1.0}, TypeError, "period must be an integer"),
    (np.arange(4.0), {"period": True}, TypeError, "period must be an integer"),
], ids=["inf", "1e300", "1e150", "1e-300", "constant", "seasonal-constant", "all-missing",
        "no-pair", "T=0", "T=1", "period=T", "2d", "complex", "strings", "mask-shape",
        "mask-0.5", "period=0", "period-float", "period-bool"])
def test_naive_params_refuses(y, kwargs, err, pattern):
    with pytest.raises(err, match=pattern):
        ss.naive_params(y, **kwargs)


@pytest.mark.parametrize("y, kwargs, err, pattern", [
    (np.r_[1.0, 3.0, 2.0, np.nan], {"num_steps": 2}, ValueError, "last period = 1 values"),
    (np.r_[1.0, 3.0, 2.0, np.nan, 4.0], {"num_steps": 2, "period": 2}, ValueError,
     "last period = 2 values"),
    (np.arange(4.0), {"num_steps": 0}, ValueError, "num_steps must be >= 1"),
    (np.arange(4.0), {"num_steps": 1.5}, TypeError, "num_steps must be an integer"),
    (np.arange(4.0) ** 2, {"num_steps": 2, "period": -1}, ValueError, "period must be >= 1"),
], ids=["last-missing", "last-season-missing", "h=0", "h-float", "period-neg"])
def test_naive_forecast_refuses(y, kwargs, err, pattern):
    with pytest.raises(err, match=pattern):
        ss.naive_forecast(y, **kwargs)


@pytest.mark.parametrize("period, err", [(0, ValueError), (-2, ValueError), ("3", TypeError),
                                         (2.0, TypeError), (None, TypeError)])
def test_naive_model_refuses(period, err):
    with pytest.raises(err, match="period must be"):
        ss.naive_model(period)


# ---- sample_prior ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, err, pattern", [
    ({"num_samples": 0}, ValueError, "num_samples must be >= 1"),
    ({"num_samples": -3}, ValueError, "num_samples must be >= 1"),
    ({"num_samples": 1.5}, TypeError, "num_samples must be an integer"),
    ({"num_samples": True}, TypeError, "num_samples must be an integer"),
    ({"scale": 0.0}, ValueError, "scale must be a positive finite number"),
    ({"scale": -1.0}, ValueError, "scale must be a positive finite number"),
    ({"scale": np.nan}, ValueError, "scale must be a positive finite number"),
    ({"scale": np.inf}, ValueError, "scale must be a positive finite number"),
    ({"scale": "a"}, TypeError, "scale must be a positive number"),
    ({"scale": np.ones(2)}, TypeError, "scale must be a positive number"),
    ({"priors": {"a": 1}}, TypeError, "prior leaves must be numpyro distributions"),
    ({"priors": {"a": None}}, ValueError, "priors must have the structure of params"),
], ids=["n=0", "n<0", "n-float", "n-bool", "scale=0", "scale<0", "scale-nan", "scale-inf",
        "scale-str", "scale-array", "bad-leaf", "bad-structure"])
def test_sample_prior_refuses(kwargs, err, pattern):
    kwargs = {"num_samples": 2, **kwargs}
    with pytest.raises(err, match=pattern):
        sample_prior(ss.PoissonHMM(num_states=2), key=KEY, **kwargs)


@pytest.mark.parametrize("scale", [1e-300, 1.0, 1e300])
def test_sample_prior_one_state_and_extreme_scales(scale):
    draws = sample_prior(ss.PoissonHMM(num_states=1), num_samples=3, key=KEY, scale=scale)
    # K = 1: the simplex leaves are 1 (to rounding) whatever the prior
    np.testing.assert_allclose(np.asarray(draws.initial_probs), np.ones((3, 1)), rtol=1e-15)
    np.testing.assert_allclose(np.asarray(draws.transitions), np.ones((3, 1, 1)), rtol=1e-15)
    rates = np.asarray(draws.emissions.rates)
    assert rates.shape == (3, 1) and np.all(np.isfinite(rates)) and np.all(rates > 0)


# ---- predictive_check -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def poisson_draws():
    model = ss.PoissonHMM(num_states=2)
    return model, sample_prior(model, num_samples=30, key=KEY, scale=3.0)


@pytest.mark.parametrize("y, kwargs, err, pattern", [
    (np.zeros(0), {}, ValueError, "at least 3 steps"),
    (np.ones(1), {}, ValueError, "at least 3 steps"),
    (np.ones(2), {}, ValueError, "at least 3 steps"),
    (np.ones((5, 2)), {}, ValueError, "one series"),
    (np.r_[1.0, np.nan, 2.0, 3.0], {}, ValueError, "fully observed"),
    (np.r_[1.0, np.inf, 2.0, 3.0], {}, ValueError, "fully observed"),
    (-np.ones(5), {}, ValueError, "non-negative integer counts"),
    (np.full(5, 0.5), {}, ValueError, "non-negative integer counts"),
    (np.array(["a"] * 5), {}, ValueError, "could not convert string"),
    (np.ones(5), {"statistics": [np.mean]}, TypeError, "statistics must be a non-empty dict"),
    (np.ones(5), {"statistics": {}}, TypeError, "statistics must be a non-empty dict"),
    (np.ones(5), {"statistics": {"f": 3}}, TypeError, r"statistics\['f'\] must be a function"),
    (np.ones(5), {"statistics": {"f": lambda x: x}}, ValueError,
     r"statistics\['f'\] must map .* gave shape \(5,\)"),
], ids=["T=0", "T=1", "T=2", "2 columns", "nan", "inf", "negative", "fractional", "strings",
        "stats-list", "stats-empty", "stat-not-callable", "stat-wrong-shape"])
def test_predictive_check_refuses(poisson_draws, y, kwargs, err, pattern):
    model, draws = poisson_draws
    with pytest.raises(err, match=pattern):
        predictive_check(model, draws, y, key=KEY, **kwargs)


def test_predictive_check_refuses_overflow_and_vector_models():
    model = ss.AR(order=1)
    draws = sample_prior(model, num_samples=3, key=KEY)
    with pytest.raises(ValueError, match="squares overflow"):
        predictive_check(model, draws, np.r_[1e300, 0.0, 1.0], key=KEY)
    with pytest.raises(ValueError, match="scalar observations"):
        predictive_check(ss.GaussianHMM(num_states=2, emission_dim=2), None, np.ones(5),
                         key=KEY)


def test_predictive_check_all_zero_counts(poisson_draws):
    # T(y) = 0 for mean, sd and max: every replica has T >= 0, so p = 1 exactly; the
    # lag-1 autocorrelation of a constant series is 0 (documented), so p is the share of
    # replicas with a non-negative one; variance / mean is undefined at the data: NaN.
    model, draws = poisson_draws
    check = predictive_check(model, draws, np.zeros(6, int), key=KEY)
    assert [check.p_values[n] for n in ("mean", "sd", "max")] == [1.0, 1.0, 1.0]
    reps = check.replicas.astype(float)
    xc = reps - reps.mean(1, keepdims=True)
    den = (xc**2).sum(1)
    ac = np.where(den > 0, (xc[:, 1:] * xc[:, :-1]).sum(1) / np.where(den > 0, den, 1), 0.0)
    assert check.p_values["lag-1 autocorrelation"] == np.mean(ac >= 0.0)
    assert np.isnan(check.observed["variance / mean"])
    assert np.isnan(check.p_values["variance / mean"])
    assert np.isnan(check.two_sided("variance / mean"))
    assert check.two_sided("mean") == min(1.0, 2 * np.mean(reps.mean(1) <= 0.0))


# ---- lfo_cv (every case refused before any sampling) ----------------------------------------
@pytest.mark.parametrize("y, kwargs, err, pattern", [
    (None, {"first_origin": 0}, ValueError, "first_origin must be >= 1"),
    (None, {"first_origin": 7}, ValueError, "first_origin must be below the series length 7"),
    (None, {"first_origin": 9}, ValueError, "first_origin must be below"),
    (None, {"first_origin": 1.0}, TypeError, "first_origin must be an integer"),
    (None, {"first_origin": True}, TypeError, "first_origin must be an integer"),
    (np.zeros(0), {}, ValueError, "below the series length 0"),
    (np.ones(1), {"first_origin": 1}, ValueError, "below the series length 1"),
    (None, {"pareto_k_threshold": -1.0}, ValueError, "pareto_k_threshold must be positive"),
    (None, {"pareto_k_threshold": 0.0}, ValueError, "pareto_k_threshold must be positive"),
    (None, {"pareto_k_threshold": np.nan}, ValueError, "pareto_k_threshold must be positive"),
    (None, {"pareto_k_threshold": "a"}, TypeError, "pareto_k_threshold must be a real"),
    (None, {"pareto_k_threshold": [0.7]}, TypeError, "pareto_k_threshold must be a real"),
    (None, {"num_samples": 1, "num_chains": 1}, ValueError,
     r"at least 2 posterior draws .* num_samples \* num_chains = 1"),
    (None, {"num_samples": 0}, ValueError, "num_samples must be >= 1"),
    (None, {"num_chains": 0}, ValueError, "num_chains must be >= 1"),
    (np.r_[3.0, 5, 4, np.nan, 2, 4, 3], {}, ValueError, "fully observed"),
    (np.r_[3.0, 5, 4, np.inf, 2, 4, 3], {}, ValueError, "fully observed"),
    (np.array([3, 5, 4, 6, 2, 4, 3])[:, None], {}, ValueError, "one series of shape"),
    (-np.array([3, 5, 4, 6, 2, 4, 3]), {}, ValueError, "non-negative integer counts"),
    (np.array(list("abcdefg")), {}, TypeError, "y must be numeric"),
    (None, {"mask": np.ones(7, bool)}, TypeError, "lfo_cv sets the mask itself"),
], ids=["L=0", "L=T", "L>T", "L-float", "L-bool", "T=0", "T=1", "k<0", "k=0", "k-nan",
        "k-str", "k-list", "one-draw", "samples=0", "chains=0", "nan", "inf", "2d",
        "negative", "strings", "mask"])
def test_lfo_cv_refuses_before_sampling(y, kwargs, err, pattern):
    y = np.array([3, 5, 4, 6, 2, 4, 3]) if y is None else y
    kwargs = {"first_origin": 5, "num_warmup": 5, "num_samples": 5, "num_chains": 1,
              **kwargs}
    with pytest.raises(err, match=pattern):
        lfo_cv(ss.PoissonHMM(num_states=1), y, key=KEY, **kwargs)


# ---- backtest -------------------------------------------------------------------------------
T_BT = 12
AR_C, AR_A, AR_S2 = 0.3, 0.6, 0.5


def _ar1():
    model = ss.AR(order=1)
    params = model.default_params()._replace(
        coeffs=jnp.full((1, 1, 1), AR_A), intercept=jnp.full((1,), AR_C),
        cov=jnp.full((1, 1), AR_S2))
    y = np.sin(np.arange(T_BT, dtype=float)) + 0.1 * np.arange(T_BT)
    return model, params, y


def _ar1_log_score(y, origin, h):
    """``log p(y_{o+h-1} | y_{0:o-1})`` of the AR(1) ``y_t = c + a y_{t-1} + e_t``."""
    mean = AR_A**h * y[origin - 1] + AR_C * sum(AR_A**j for j in range(h))
    var = AR_S2 * sum(AR_A ** (2 * j) for j in range(h))
    return norm.logpdf(y[origin + h - 1], mean, np.sqrt(var))


@pytest.mark.parametrize("kwargs, err, pattern", [
    ({"horizon": 0}, ValueError, "horizon must be >= 1"),
    ({"horizon": -1}, ValueError, "horizon must be >= 1"),
    ({"horizon": 1.5}, TypeError, "horizon must be an integer"),
    ({"horizon": T_BT}, ValueError, "no origins: need initial \\+ horizon <= len"),
    ({"horizon": T_BT + 5}, ValueError, r"got initial = 6, horizon = 17, len\(y\) = 12"),
    ({"initial": T_BT}, ValueError, "no origins"),
    ({"initial": 0}, ValueError, "initial must be >= 1"),
    ({"initial": None}, TypeError, "initial must be an integer"),
    ({"step": 0}, ValueError, "step must be >= 1"),
    ({"origins": [0, 5]}, ValueError, r"origins must lie in \[1, len\(y\) - horizon = 10\]"),
    ({"origins": [-3, 5]}, ValueError, "origins must lie in"),
    ({"origins": [5, 11]}, ValueError, "origins must lie in"),
    ({"origins": [T_BT]}, ValueError, "origins must lie in"),
    ({"origins": [5, 5, 7]}, ValueError, r"origins has repeated values \[5\]"),
    ({"origins": [5.0, 7.0]}, TypeError, "origins must be integers, got dtype float64"),
    ({"origins": [True, False]}, TypeError, "origins must be integers, got dtype bool"),
    ({"origins": []}, TypeError, "origins must be integers"),
    ({"origins": np.array([], int)}, ValueError, "non-empty 1-D"),
    ({"origins": [[5, 6]]}, ValueError, r"non-empty 1-D .* shape \(1, 2\)"),
    ({"origins": 5}, ValueError, r"non-empty 1-D .* shape \(\)"),
    ({"num_samples": 1}, ValueError, "num_samples must be >= 2"),
    ({"levels": 1.0}, ValueError, r"levels must lie in \(0, 1\)"),
    ({"levels": 0.0}, ValueError, r"levels must lie in \(0, 1\)"),
    ({"levels": np.nan}, ValueError, r"levels must lie in \(0, 1\)"),
    ({"levels": ()}, ValueError, "levels is empty"),
    ({"levels": "a"}, TypeError, r"levels must be numbers in \(0, 1\)"),
    ({"levels": (0.5, None)}, TypeError, "levels must be numbers"),
    ({"estimator": "x"}, ValueError, "estimator must be 'fair' or 'energy'"),
    ({"y": np.r_[np.zeros(8), np.nan, np.zeros(3)]}, ValueError,
     "non-finite value.*mask=False"),
    ({"y": np.r_[np.ones(8), np.full(4, np.nan)]}, ValueError, "non-finite value"),
    ({"y": np.r_[np.ones(8), np.inf, np.ones(3)]}, ValueError, "non-finite value"),
    ({"y": np.full(T_BT, 1e300)}, ValueError, "squares overflow"),
    ({"y": np.zeros(0)}, ValueError, "no time steps"),
    ({"y": np.ones(1), "initial": 1, "horizon": 1}, ValueError, "no origins"),
    ({"y": np.ones((T_BT, 1))}, ValueError, "describes a scalar series"),
    ({"y": np.ones((2, T_BT))}, ValueError, r"one series; y has batch shape \(2,\)"),
    ({"y": np.ones(T_BT) + 1j}, TypeError, "complex"),
    ({"mask": np.ones(5, bool)}, ValueError, "mask must have shape"),
    ({"params": lambda model, y: 3}, TypeError, "params must be a ARParams"),
], ids=["h=0", "h<0", "h-float", "h=T", "h>T", "initial=T", "initial=0", "initial-None",
        "step=0", "origin=0", "origin<0", "origin+h>T", "origin=T", "duplicate-origins",
        "float-origins", "bool-origins", "empty-list", "empty-int", "2d-origins",
        "scalar-origin", "samples=1", "level=1", "level=0", "level-nan", "no-levels",
        "level-str", "level-None", "estimator", "nan-no-mask", "missing-tail-no-mask",
        "inf", "1e300", "T=0", "T=1", "trailing-axis", "batch", "complex", "mask-shape",
        "fit-fn-bad"])
def test_backtest_refuses(kwargs, err, pattern):
    model, params, y = _ar1()
    kwargs = {"horizon": 2, "initial": 6, "num_samples": 10, **kwargs}
    y = kwargs.pop("y", y)
    params = kwargs.pop("params", params)
    with pytest.raises(err, match=pattern):
        ss.backtest(model, params, y, key=KEY, **kwargs)


def test_backtest_refuses_all_missing():
    model, params, y = _ar1()
    with pytest.raises(ValueError, match="first order=1 observations .* must be observed"):
        ss.backtest(model, params, y, horizon=2, initial=6, num_samples=10, key=KEY,
                    mask=np.zeros(T_BT, bool))
    level = ss.LocalLevel()  # (no conditioned steps: before, it warned and scored NaN)
    with pytest.raises(ValueError, match="backtest: y has no observed values"):
        ss.backtest(level, level.default_params(), y, horizon=2, initial=3, num_samples=10,
                    key=KEY, mask=np.zeros(T_BT, bool))


def test_backtest_edge_origins_and_missing_tail():
    """Longest horizon from the first admissible origin, the last origin, unsorted origins
    and an all-missing tail: exact AR(1) log scores where the target is observed, NaN (and
    not counted) where it is missing."""
    model, params, y = _ar1()
    mask = np.r_[np.ones(9, bool), np.zeros(3, bool)]
    # origin 1 is the first the AR(1) admits; T - horizon the last; given out of order
    horizon = T_BT - 1
    res = ss.backtest(model, params, y, horizon=horizon, origins=[1], num_samples=20,
                      key=KEY, mask=mask)
    got = res.table["log_score"].to_numpy()
    ref = np.array([_ar1_log_score(y, 1, h) for h in range(1, horizon + 1)])
    np.testing.assert_allclose(got[:8], ref[:8], rtol=1e-10)
    assert np.all(np.isnan(got[8:])) and np.all(np.isnan(res.table["y"].to_numpy()[8:]))
    assert np.all(np.isnan(res.table["crps"].to_numpy()[8:]))
    assert np.all(np.isfinite(res.table[["mean", "median", "lower_90"]].to_numpy()))
    assert res.summary["num_origins"].tolist() == [1] * 8 + [0] * 3

    res = ss.backtest(model, params, y, horizon=2, origins=[10, 3, 7], num_samples=20,
                      key=KEY, mask=mask)
    assert res.origins.tolist() == [10, 3, 7]
    for o in (10, 3, 7):
        rows = res.table[res.table["origin"] == o]
        assert rows["time"].tolist() == [o, o + 1]
        for h in (1, 2):
            got = rows[rows["horizon"] == h]["log_score"].item()
            if o + h - 1 >= 9:
                assert np.isnan(got)
            else:
                np.testing.assert_allclose(got, _ar1_log_score(y, o, h), rtol=1e-10)
