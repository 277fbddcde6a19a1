"""DeepStateSpace: an RNN on covariates sets a structural model's variances; the likelihood
is the exact Kalman filter of the resulting time-varying model.

References: the structural models themselves (a constant network), dense Gaussian
conditioning of the joint law of ``y_{1:T}`` built explicitly (arbitrary per-step
parameters), finite differences, and a fit on data simulated with a covariate effect on
the observation noise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import statseq as ss

T = 16
KEY = jax.random.key(0)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    u = rng.normal(size=(T, 2))
    y = np.cumsum(rng.normal(size=T)) + np.tile([1.0, -1.0, 0.5, -0.5], T // 4)
    return y, u


CASES = {
    "local_level": (ss.LocalLevel(), ss.LocalLevelParams(0.7, 0.2), (ss.Trend(),)),
    "local_linear_trend": (ss.LocalLinearTrend(), ss.LocalLinearTrendParams(0.5, 0.3, 0.05),
                           (ss.Trend(slope=True),)),
    "trend_seasonal": (
        ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(period=4))),
        ss.StructuralParams(0.4, (ss.TrendParams(0.3, 0.02), ss.SeasonalParams(0.1))),
        (ss.Trend(slope=True), ss.Seasonal(period=4))),
}


@pytest.mark.parametrize("case", ["local_level", "local_linear_trend"])
def test_constant_network_log_prob_equals_structural_model(case, data):
    y, u = data
    structural, sparams, comps = CASES[case]
    model = ss.DeepStateSpace(comps, input_dim=2, hidden_dim=3)
    params = model.from_structural_params(sparams, key=KEY)
    np.testing.assert_allclose(float(ss.log_prob(model, params, y, inputs=u)),
                               float(ss.log_prob(structural, sparams, y)), rtol=1e-10)


def test_constant_network_equals_structural_model(data):
    """Likelihood, filtered moments and forecasts of trend + seasonal, exact diffuse."""
    y, u = data
    structural, sparams, comps = CASES["trend_seasonal"]
    model = ss.DeepStateSpace(comps, input_dim=2, hidden_dim=3)
    params = model.from_structural_params(sparams, key=KEY)
    np.testing.assert_allclose(np.asarray(params.weight), 0.0)
    ref_filt = structural.filter_states(sparams, y, parallel=False)
    ref = float(ref_filt.marginal_log_lik)
    # the step-by-step filter protocol and the whole-sequence time-varying filter
    np.testing.assert_allclose(float(ss.log_prob(model, params, y, inputs=u)), ref,
                               rtol=1e-10, atol=1e-10)
    filt = model.filter_states(params, y, inputs=u)
    np.testing.assert_allclose(float(filt.marginal_log_lik), ref, rtol=1e-10)
    np.testing.assert_allclose(filt.filtered_means, ref_filt.filtered_means, atol=1e-10)
    np.testing.assert_allclose(filt.filtered_covs, ref_filt.filtered_covs, atol=1e-10)
    fc = model.forecast_moments(params, y, inputs=u, num_steps=5,
                                future_inputs=np.ones((5, 2)))
    ref_fc = structural.forecast_moments(sparams, y, num_steps=5)
    np.testing.assert_allclose(fc.mean, ref_fc.mean, atol=1e-10, rtol=1e-10)
    np.testing.assert_allclose(fc.cov, ref_fc.cov, atol=1e-10, rtol=1e-10)


@pytest.fixture(scope="module")
def proper():
    """A local level with a proper initial law and a network that varies the variances."""
    model = ss.DeepStateSpace((ss.Trend(),), input_dim=2, hidden_dim=3, initial_scale=3.0)
    return model, model.init_params(KEY, weight_scale=1.0)


def _dense_log_prob_and_filter(arrays, y, observed):
    """Joint Gaussian of ``(x_{0:T-1}, y_{0:T-1})`` of a time-varying model built densely;
    log-density of the observed ``y`` and filtered means by Schur complements."""
    a = jax.tree.map(np.asarray, arrays)
    num_t, n = len(y), a.initial_mean.shape[0]
    f, h = a.dynamics_weights, a.emission_weights
    means, covs = [a.initial_mean], [a.initial_cov]
    for t in range(1, num_t):
        means.append(f @ means[-1])
        covs.append(f @ covs[-1] @ f.T + a.dynamics_cov[t - 1])
    cxx = np.zeros((num_t * n, num_t * n))
    for t in range(num_t):
        block = covs[t]
        cxx[t * n:(t + 1) * n, t * n:(t + 1) * n] = block
        for s in range(t + 1, num_t):
            block = f @ block
            cxx[s * n:(s + 1) * n, t * n:(t + 1) * n] = block
            cxx[t * n:(t + 1) * n, s * n:(s + 1) * n] = block.T
    big_h = np.kron(np.eye(num_t), h)
    mx = np.concatenate(means)
    my = big_h @ mx + a.emission_bias.reshape(num_t)
    cyy = big_h @ cxx @ big_h.T + np.diag(a.emission_cov.reshape(num_t))
    cxy = cxx @ big_h.T
    obs = np.flatnonzero(observed)
    lp = scipy.stats.multivariate_normal(my[obs], cyy[np.ix_(obs, obs)]).logpdf(y[obs])
    filtered = []
    for t in range(num_t):
        k = obs[obs <= t]
        gain = cxy[t * n:(t + 1) * n, k] @ np.linalg.inv(cyy[np.ix_(k, k)])
        filtered.append(mx[t * n:(t + 1) * n] + gain @ (y[k] - my[k]))
    return lp, np.array(filtered)


def test_time_varying_kalman_equals_dense_conditioning(data):
    y, u = data
    y, u = y[:7], u[:7]
    model = ss.DeepStateSpace((ss.Trend(slope=True), ss.Seasonal(period=3)), input_dim=2,
                              hidden_dim=3, emission_bias=True, initial_scale=1.5)
    params = model.init_params(KEY, weight_scale=2.0)
    arrays = model.time_varying_arrays(params, u)
    # the network really makes every parameter vary over time
    assert np.ptp(np.asarray(arrays.emission_cov)) > 0.1
    assert np.ptp(np.asarray(arrays.dynamics_cov)[:, 0, 0]) > 0.1
    assert np.ptp(np.asarray(arrays.emission_bias)) > 0.1
    for observed in (np.ones(7, bool), np.array([1, 1, 0, 1, 0, 1, 1], bool)):
        ref_lp, ref_filt = _dense_log_prob_and_filter(arrays, y, observed)
        lp = ss.log_prob(model, params, y, inputs=u, mask=observed)
        np.testing.assert_allclose(float(lp), ref_lp, rtol=1e-10)
        filt = model.filter_states(params, y, inputs=u, mask=observed)
        np.testing.assert_allclose(float(filt.marginal_log_lik), ref_lp, rtol=1e-10)
        np.testing.assert_allclose(filt.filtered_means, ref_filt, atol=1e-9)


def test_gradients_match_finite_differences(data, proper):
    y, u = data
    model, params = proper

    def loss(p):
        return ss.log_prob(model, p, y, inputs=u)

    grad = jax.jit(jax.grad(loss))(params)
    eps = 1e-6
    readout = params.weight
    layer = params.backbone[0]
    checks = [
        (lambda v: params._replace(weight=readout.at[0, 1].set(v)), readout[0, 1],
         grad.weight[0, 1]),
        (lambda v: params._replace(backbone=(layer._replace(w_in=layer.w_in.at[2, 0].set(v)),)),
         layer.w_in[2, 0], grad.backbone[0].w_in[2, 0]),
    ]
    for make, value, g in checks:
        fd = (loss(make(value + eps)) - loss(make(value - eps))) / (2 * eps)
        assert abs(float(g)) > 1e-4  # a gradient really flows to this weight
        np.testing.assert_allclose(float(g), float(fd), rtol=1e-5)


def test_fit_sgd_recovers_covariate_effect_on_noise():
    # a local level whose observation noise sd is 0.3 when u = 0 and 1.5 when u = 1
    rng = np.random.default_rng(1)
    num_series, num_t = 8, 32
    u = (rng.uniform(size=(num_series, num_t, 1)) < 0.5).astype(float)
    level = np.cumsum(0.2 * rng.normal(size=(num_series, num_t)), axis=1)
    y = level + np.where(u[..., 0] > 0, 1.5, 0.3) * rng.normal(size=(num_series, num_t))
    model = ss.DeepStateSpace((ss.Trend(),), input_dim=1, hidden_dim=3, initial_scale=5.0)
    params = model.initialize(y, inputs=u, key=KEY)
    fit = ss.fit_sgd(model, params, y, inputs=u, learning_rate=0.05, num_steps=150,
                     key=jax.random.key(1), progress=False)
    assert float(fit.log_joint[-1]) > float(fit.log_joint[0]) + 50
    probe = np.array([[0.0], [1.0]] * 5)
    obs_sd = np.asarray(model.scales(fit.params, probe))[:, 0]
    low, high = obs_sd[probe[:, 0] == 0].mean(), obs_sd[probe[:, 0] == 1].mean()
    # true: 0.3 and 1.5 (a ratio of 5), from 8 series of 32 steps
    assert 0.08 < low < 0.6 and 0.9 < high < 2.2 and high / low > 3, (low, high)


def test_ragged_batch_equals_separate_series(data, proper):
    y, u = data
    model, params = proper
    lengths = (T, 9)
    yb = np.stack([y, np.concatenate([y[:9] * 0.5, np.zeros(T - 9)])])
    ub = np.stack([u, u[::-1]])
    mask = np.arange(T)[None, :] < np.array(lengths)[:, None]
    batch = ss.log_prob(model, params, yb, inputs=ub, mask=mask)
    one = [ss.log_prob(model, params, yb[i, :n], inputs=ub[i, :n])
           for i, n in enumerate(lengths)]
    np.testing.assert_allclose(np.asarray(batch), np.asarray(one), rtol=1e-10)
    filt = model.filter_states(params, yb, inputs=ub, mask=mask)
    np.testing.assert_allclose(np.asarray(filt.marginal_log_lik), np.asarray(one), rtol=1e-10)


def test_sample_and_sampled_forecast(data, proper):
    _, u = data
    model, params = proper
    draws = ss.sample(model, params, num_timesteps=T, inputs=u, key=KEY, num_samples=3)
    assert draws.shape == (3, T) and np.all(np.isfinite(draws))
    fc = ss.forecast(model, params, draws[0], inputs=u, num_steps=2, num_samples=4000,
                     future_inputs=u[:2], key=KEY)
    exact = model.forecast_moments(params, draws[0], inputs=u, num_steps=2,
                                   future_inputs=u[:2])
    # Monte Carlo paths through the generic forecast agree with the exact moments
    np.testing.assert_allclose(np.asarray(fc.samples).mean(0), exact.mean,
                               atol=4 * float(exact.std.max()) / np.sqrt(4000))
    np.testing.assert_allclose(np.asarray(fc.samples).std(0), exact.std, rtol=0.06)


def test_bad_input_gives_clear_errors(data):
    y, u = data
    model = ss.DeepStateSpace((ss.Trend(),), input_dim=2, hidden_dim=3)
    params = model.init_params(KEY)
    with pytest.raises(ValueError, match="input_dim=2"):
        ss.log_prob(model, params, y)
    with pytest.raises(ValueError, match="inputs must have shape"):
        ss.log_prob(model, params, y, inputs=u[:-1])
    with pytest.raises(ValueError, match="inputs must have shape"):
        ss.log_prob(model, params, y, inputs=u[:, :1])
    bad = u.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        ss.log_prob(model, params, y, inputs=bad)
    with pytest.raises(ValueError, match="future_inputs"):
        model.forecast_moments(params, y, inputs=u, num_steps=2, future_inputs=None)
    with pytest.raises(ValueError, match="future_inputs"):
        model.forecast_moments(params, y, inputs=u, num_steps=2, future_inputs=np.ones((3, 2)))
    with pytest.raises(ValueError, match="future_inputs"):
        model.forecast_moments(params, y, inputs=u, num_steps=1,
                               future_inputs=np.array([[np.nan, 0.0]]))
    with pytest.raises(ValueError, match="input_dim"):
        ss.DeepStateSpace(input_dim=0)
    with pytest.raises(ValueError, match=r"backbone.input_dim"):
        ss.DeepStateSpace(input_dim=2, backbone=ss.GRU(hidden_dim=2, input_dim=3).backbone)
    with pytest.raises(TypeError, match="variances only"):
        ss.DeepStateSpace((ss.Trend(), ss.ARComponent(order=1)), input_dim=2)
    with pytest.raises(TypeError, match="Backbone"):
        ss.DeepStateSpace(input_dim=2, backbone="gru")
    with pytest.raises(ValueError, match="positive variances"):
        model.from_structural_params(ss.LocalLevelParams(1.0, -1.0), key=KEY)
    with pytest.raises(ValueError, match="shape"):
        ss.log_prob(model, params._replace(weight=jnp.zeros((3, 3))), y, inputs=u)


def test_save_load_round_trip(data, tmp_path):
    """`ss.save`/`ss.load`: the default GRU, components with options, and a custom backbone
    (saved by its class name and fields) come back equal, with the same likelihood."""
    from statseq.models.neural.cells import RNNBackbone

    y, u = data
    custom = RNNBackbone("elman", input_dim=2, hidden_dim=2, evaluation="sequential")
    models = [
        ss.DeepStateSpace(input_dim=2, hidden_dim=3),
        ss.DeepStateSpace((ss.Trend(slope=True), ss.Seasonal(period=4)), input_dim=2,
                          backbone=custom, emission_bias=True, initial_scale=2.0),
    ]
    assert models[0].config()["backbone"] is None  # the default network: rebuilt on load
    assert models[1].config()["backbone"]["type"] == "RNNBackbone"
    loaded = []
    for i, model in enumerate(models):
        params = model.init_params(jax.random.key(i), weight_scale=1.0)
        model2, params2 = ss.load(ss.save(tmp_path / f"m{i}", model, params))
        assert model2 == model and type(model2.backbone) is type(model.backbone)
        for a, b in zip(jax.tree.leaves(params2), jax.tree.leaves(params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        loaded.append((model, params, model2, params2))
    # equal models share the compiled filter: one compile for both likelihoods
    model, params, model2, params2 = loaded[0]
    assert float(ss.log_prob(model2, params2, y, inputs=u)) == \
        float(ss.log_prob(model, params, y, inputs=u))
    with pytest.raises(ValueError, match="unknown backbone type"):
        ss.DeepStateSpace(input_dim=2, backbone={"type": "NoSuchBackbone"})
