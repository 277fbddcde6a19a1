"""RWKV: the WKV operator against the direct sum of Peng et al. (2023), eq. (14), in NumPy
(float64, and in log space where the exponentials overflow); the block against a NumPy
implementation; the recurrent, parallel and step-by-step (generation) modes against each
other (log-probabilities and gradients, 1e-10 relative, T in {1, 2, 17, 1000}); no
overflow at T = 10^5 in float32 with large decays and keys; fitting, masks, save/load."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import logsumexp

import statseq as ss
from statseq.inference.wkv import wkv_initial_state, wkv_parallel, wkv_recurrent
from statseq.models.neural.residual import RMS_EPS
from statseq.models.neural.rwkv import RWKV, RWKVBackbone, default_mode


def direct_wkv(w, u, k, v):
    """Eq. (14) of the paper, term by term (float64; overflows for large keys)."""
    t_len, c = k.shape
    out = np.zeros((t_len, c))
    for t in range(t_len):
        num = np.exp(u + k[t]) * v[t]
        den = np.exp(u + k[t])
        for i in range(t):
            e = np.exp(-(t - 1 - i) * w + k[i])
            num, den = num + e * v[i], den + e
        out[t] = num / den
    return out


def log_space_wkv(w, u, k, v):
    """Eq. (14) as a ratio of log-sum-exps (any key size): signed numerator, positive
    denominator."""
    t_len = k.shape[0]
    out = np.zeros(k.shape)
    for t in range(t_len):
        expo = np.concatenate([k[:t] - (t - 1 - np.arange(t))[:, None] * w, (u + k[t])[None]])
        vals = np.concatenate([v[:t], v[t][None]])
        lnum, sign = logsumexp(expo, b=vals, axis=0, return_sign=True)
        out[t] = sign * np.exp(lnum - logsumexp(expo, axis=0))
    return out


def _wkv_case(rng, t_len, c, k_scale):
    w = np.exp(rng.normal(size=c) - 0.5)
    u = rng.normal(size=c)
    return w, u, k_scale * rng.normal(size=(t_len, c)), rng.normal(size=(t_len, c))


@pytest.mark.parametrize("fn", [wkv_recurrent, wkv_parallel])
def test_wkv_against_direct_sum_and_from_a_carried_state(fn):
    rng = np.random.default_rng(0)
    w, u, k, v = _wkv_case(rng, 23, 3, 1.5)
    ref = direct_wkv(w, u, k, v)
    s0 = wkv_initial_state((3,), jnp.float64)
    run = jax.jit(fn)
    final, got = run(w, u, k, v, s0)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-14)
    # two halves, the second from the first's carried state (a, b, p)
    mid, first = run(w, u, k[:9], v[:9], s0)
    end, second = run(w, u, k[9:], v[9:], mid)
    np.testing.assert_allclose(np.concatenate([first, second]), ref, rtol=1e-12, atol=1e-14)
    for a, b in zip(end, final, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
    # the state holds the unnormalized sums: e^p a = sum_i e^{-(T-1-i) w + k_i} v_i
    expo = k - (22 - np.arange(23))[:, None] * w
    np.testing.assert_allclose(np.exp(np.asarray(final.max)) * np.asarray(final.num),
                               np.sum(np.exp(expo) * v, axis=0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(final.max), expo.max(axis=0), rtol=1e-14)


def test_wkv_large_keys_against_log_space_sum():
    """Keys of size ~ 800: e^{k} overflows float64, the stable forms do not."""
    rng = np.random.default_rng(1)
    w, u, k, v = _wkv_case(rng, 30, 4, 400.0)
    w[0] = 300.0  # a decay that forgets everything
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.all(np.isfinite(direct_wkv(w, u, k, v)))
    ref = log_space_wkv(w, u, k, v)
    s0 = wkv_initial_state((4,), jnp.float64)
    for fn in (wkv_recurrent, wkv_parallel):
        got = np.asarray(jax.jit(fn)(w, u, k, v, s0)[1])
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)


def _rms(x, wgt):
    return wgt * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_backbone(bb, params, xs):
    """The RWKV stack written from the paper's equations, with `direct_wkv`."""
    params = jax.tree.map(np.asarray, params)
    zs = xs @ params.embed_weight + params.embed_bias
    for ell in range(bb.num_layers):
        p = jax.tree.map(lambda a, ell=ell: a[ell], params.layers)
        x = _rms(zs, params.norm[ell])
        prev = np.concatenate([np.zeros((1, x.shape[1])), x[:-1]])
        mix = lambda m: m * x + (1 - m) * prev  # noqa: E731
        k, v, r = mix(p.att_mix[0]) @ p.att_key, mix(p.att_mix[1]) @ p.att_value, \
            mix(p.att_mix[2]) @ p.att_receptance
        wkv = direct_wkv(np.exp(p.time_decay), p.time_first, k, v)
        zs = zs + (_sigmoid(r) * wkv) @ p.att_output
        x = _rms(zs, p.ffn_norm)
        prev = np.concatenate([np.zeros((1, x.shape[1])), x[:-1]])
        kk = np.maximum(mix(p.ffn_mix[0]) @ p.ffn_key, 0.0) ** 2
        zs = zs + _sigmoid(mix(p.ffn_mix[1]) @ p.ffn_receptance) * (kk @ p.ffn_value)
    return _rms(zs, params.final_norm)


def perturbed(params, seed, scale=0.3):
    """Random weights plus Gaussian noise (NumPy: no compilation)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(x + scale * rng.normal(size=x.shape)), params)


BACKBONE = RWKVBackbone(input_dim=3, hidden_dim=4, num_layers=2, ffn_dim=6)


def test_backbone_matches_numpy_in_every_mode():
    params = perturbed(BACKBONE.init_params(jax.random.key(0)), 1)
    xs = np.random.default_rng(0).normal(size=(13, 3))
    ref = numpy_backbone(BACKBONE, params, xs)
    assert np.std(ref) > 0.1
    for mode in ("recurrent", "parallel"):
        bb = dataclasses.replace(BACKBONE, mode=mode)
        got = jax.jit(bb.sequence)(params, jnp.asarray(xs))
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-11, atol=1e-12)
    step = jax.jit(lambda p, s, x: BACKBONE.step(p, s, x))
    state, hs = BACKBONE.initial_state(params), []
    for x in xs:
        state, h = step(params, state, jnp.asarray(x))
        hs.append(h)
    np.testing.assert_allclose(np.stack(hs), ref, rtol=1e-11, atol=1e-12)


MODEL = RWKV(hidden_dim=4, num_layers=2, ffn_dim=6, emission="gaussian")
MODES = {mode: dataclasses.replace(MODEL, mode=mode) for mode in ("recurrent", "parallel")}


def _model_params(t_len, seed=2):
    y = np.sin(np.arange(t_len) / 5.0) + 0.3 * np.random.default_rng(seed).normal(size=t_len)
    params = MODEL.initialize(y, key=jax.random.key(seed))
    return perturbed(params, seed + 10), y


@jax.jit
def _both_modes(params, y):
    """Log-likelihood and gradient of both modes: one compiled program per length."""
    inputs = jnp.zeros((1, y.shape[0], 0))

    def loglik(model):
        return lambda p: jnp.sum(model.complete_data_log_probs_batch(p, y[None], inputs)[0])

    return {mode: jax.value_and_grad(loglik(m))(params) for mode, m in MODES.items()}


@pytest.mark.parametrize("t_len", [1, 2, 17, 1000])
def test_recurrent_and_parallel_modes_agree_with_gradients(t_len):
    params, y = _model_params(t_len)
    out = _both_modes(params, jnp.asarray(y))
    (lp_r, g_r), (lp_p, g_p) = out["recurrent"], out["parallel"]
    assert np.isfinite(float(lp_r))
    np.testing.assert_allclose(float(lp_p), float(lp_r), rtol=1e-10)
    flat_r = np.concatenate([np.ravel(a) for a in jax.tree.leaves(g_r)])
    flat_p = np.concatenate([np.ravel(a) for a in jax.tree.leaves(g_p)])
    scale = np.max(np.abs(flat_r))
    assert scale > 0 and np.all(np.isfinite(flat_r))
    np.testing.assert_allclose(flat_p, flat_r, rtol=1e-10, atol=1e-10 * scale)


def test_no_overflow_at_1e5_steps_float32():
    """Float32, T = 10^5, decays from 1e-4 to e^6 per step, keys of size ~ 10^3 (e^k
    overflows float32 beyond 88): every output is finite, and the WKV outputs are convex
    combinations of the values seen so far."""
    bb = RWKVBackbone(input_dim=2, hidden_dim=4, num_layers=1, ffn_dim=4, mode="recurrent")
    params = bb.init_params(jax.random.key(3), dtype=jnp.float32)
    layers = params.layers._replace(
        time_decay=jnp.asarray([[-9.0, 0.0, 3.0, 6.0]], jnp.float32),
        att_key=params.layers.att_key * 1000.0)
    params = params._replace(layers=layers)
    xs = jax.random.normal(jax.random.key(4), (100_000, 2), jnp.float32)
    hs = jax.jit(bb.sequence)(params, xs)
    assert hs.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(hs)))
    w = jnp.exp(jnp.asarray([-9.0, 0.0, 3.0, 6.0], jnp.float32))
    k = 1000.0 * jax.random.normal(jax.random.key(5), (100_000, 4), jnp.float32)
    v = jax.random.normal(jax.random.key(6), (100_000, 4), jnp.float32)
    _, out = jax.jit(wkv_recurrent)(w, jnp.zeros(4, jnp.float32), k, v,
                                    wkv_initial_state((4,), jnp.float32))
    assert bool(jnp.all(jnp.isfinite(out)))
    lo, hi = jax.lax.cummin(v, axis=0), jax.lax.cummax(v, axis=0)
    assert bool(jnp.all((out >= lo - 1e-5) & (out <= hi + 1e-5)))


@pytest.fixture(scope="module")
def case():
    return _model_params(40, seed=7)


def test_generation_step_by_step_equals_whole_sequence(case):
    params, y = case
    step = ss.filter(MODEL, params, y, return_carries=True)  # one step at a time
    ref = np.asarray(step.log_probs)
    assert np.all(np.isfinite(ref)) and np.ptp(ref) > 0.1
    last = jax.tree.map(lambda c: c[-1], step.carries)
    for model in MODES.values():
        got = ss.filter(model, params, y)  # whole-sequence fast path
        np.testing.assert_allclose(np.asarray(got.log_probs), ref, rtol=1e-10, atol=1e-12)
        fast = jax.jit(model.complete_data_log_probs)(params, jnp.asarray(y),
                                                      jnp.zeros((40, 0)))[1]
        for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(last), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_missing_value_filter_equals_whole_sequence_with_indicator(case):
    """The step-by-step filter with a missing value equals the whole-sequence backbone
    (parallel mode) fed ``[y_{t-1} m_{t-1}, m_{t-1}]`` and scored where observed."""
    params, y = case
    mask = np.ones(40, bool)
    mask[[5, 6, 30]] = False
    res = ss.filter(MODEL, params, y, mask=mask)
    enc = np.stack([np.where(mask, y, 0.0), mask.astype(float)], -1)
    xs = np.concatenate([np.zeros((1, 2)), enc[:-1]])
    hs = MODES["parallel"].backbone.sequence(params.backbone, jnp.asarray(xs))
    lp = MODEL.head.distribution(params.head, hs).log_prob(jnp.asarray(y))
    ref = np.where(mask, np.asarray(lp), 0.0)
    np.testing.assert_allclose(np.asarray(res.log_probs), ref, rtol=1e-10, atol=1e-12)
    assert float(res.log_probs[30]) == 0.0


def test_fit_sgd_decreases_the_loss_and_forecast(case):
    params, y = case
    before = float(ss.log_prob(MODEL, params, y))
    fit = ss.fit_sgd(MODEL, params, y, optimizer=optax.adam(1e-2), num_steps=15,
                     key=jax.random.key(8), progress=False)
    assert float(ss.log_prob(MODEL, fit.params, y)) > before + 1.0
    fc = ss.forecast(MODEL, fit.params, y, num_steps=3, num_samples=20,
                     key=jax.random.key(9))
    assert np.asarray(fc.samples).shape[-1] == 3 and np.all(np.isfinite(fc.samples))


def test_save_load_round_trip(tmp_path, case):
    params, y = case
    model = MODES["parallel"]
    path = ss.save(tmp_path / "rwkv", model, params)
    model2, params2 = ss.load(path)
    assert model2 == model
    np.testing.assert_array_equal(np.asarray(ss.log_prob(model2, params2, y)),
                                  np.asarray(ss.log_prob(model, params, y)))


def test_default_mode_rule():
    assert default_mode(50, "cpu") == "recurrent"
    assert default_mode(50, "gpu") == "parallel"
    assert default_mode(10**5, "gpu") == "recurrent"
    assert RWKVBackbone(input_dim=1, hidden_dim=2, parallel=True).mode_for(10) == "parallel"
    assert RWKVBackbone(input_dim=1, hidden_dim=2, evaluation="sequential").mode_for(
        10) == "recurrent"


@pytest.mark.parametrize("kwargs, match", [
    ({"hidden_dim": 0}, "hidden_dim"),
    ({"num_layers": 0}, "num_layers"),
    ({"ffn_dim": 0}, "ffn_dim"),
    ({"mode": "chunked"}, "mode"),
])
def test_invalid_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RWKV(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "recurrent", "parallel": True}, "contradicts"),
    ({"mode": "parallel", "evaluation": "sequential"}, "contradicts"),
    ({"evaluation": "deer"}, "Newton"),
])
def test_contradictory_backbone_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RWKVBackbone(input_dim=1, hidden_dim=2, **kwargs)
