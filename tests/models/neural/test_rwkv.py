"""RWKV: the WKV operator against the direct sum of Peng et al. (2023), eq. (14), in NumPy
(float64, and in log space where the exponentials overflow); the block against a NumPy
implementation; the recurrent, parallel and step-by-step (generation) modes against each
other (log-probabilities and gradients, 1e-10 relative, T in {1, 2, 17, 1000}); no
overflow at T = 10^5 in float32 with large decays and keys; fitting, masks, save/load."""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import logsumexp

import statseq as ss
from statseq.inference.wkv import (
    wkv_chunked,
    wkv_initial_state,
    wkv_parallel,
    wkv_recurrent,
)
from statseq.models.neural.residual import RMS_EPS
from statseq.models.neural.rwkv import RWKV, RWKVBackbone, default_mode
from tests.models.neural import _modes


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


@pytest.mark.parametrize("fn", [wkv_recurrent, wkv_parallel,
                                partial(wkv_chunked, chunk_size=5)])
def test_wkv_against_direct_sum_and_from_a_carried_state(fn):
    rng = np.random.default_rng(0)
    w, u, k, v = _wkv_case(rng, 23, 3, 1.5)
    ref = direct_wkv(w, u, k, v)
    s0 = wkv_initial_state((3,), jnp.float64)
    run = jax.jit(fn)
    final, got = run(w, u, k, v, s0)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-14)
    if fn in (wkv_recurrent, wkv_parallel):
        # two halves, the second from the first's carried state (a, b, p)
        mid, first = run(w, u, k[:9], v[:9], s0)
        end, second = run(w, u, k[9:], v[9:], mid)
        np.testing.assert_allclose(np.concatenate([first, second]), ref, rtol=1e-12,
                                   atol=1e-14)
        for a, b in zip(end, final, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
    else:
        # (the chunks hand the state over in the same way) the gradient equals the
        # recurrence's, as the model-level test checks for the parallel mode
        def grads(op):
            loss = lambda *a: jnp.sum(jnp.sin(op(*a, s0)[1]))  # noqa: E731
            return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(w, u, k, v)

        for a, b in zip(grads(fn), grads(wkv_recurrent), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
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


def _mix(m, x):
    """Token shift ``m x_t + (1 - m) x_{t-1}`` with ``x_0 = 0``."""
    prev = np.concatenate([np.zeros((1, x.shape[1])), x[:-1]])
    return m * x + (1 - m) * prev


def numpy_backbone(bb, params, xs):
    """The RWKV stack written from the paper's equations, with `direct_wkv`."""
    params = jax.tree.map(np.asarray, params)
    zs = xs @ params.embed_weight + params.embed_bias
    for ell in range(bb.num_layers):
        p = jax.tree.map(lambda a, ell=ell: a[ell], params.layers)
        x = _rms(zs, params.norm[ell])
        k, v, r = _mix(p.att_mix[0], x) @ p.att_key, _mix(p.att_mix[1], x) @ p.att_value, \
            _mix(p.att_mix[2], x) @ p.att_receptance
        wkv = direct_wkv(np.exp(p.time_decay), p.time_first, k, v)
        zs = zs + (_sigmoid(r) * wkv) @ p.att_output
        x = _rms(zs, p.ffn_norm)
        kk = np.maximum(_mix(p.ffn_mix[0], x) @ p.ffn_key, 0.0) ** 2
        zs = zs + _sigmoid(_mix(p.ffn_mix[1], x) @ p.ffn_receptance) * (kk @ p.ffn_value)
    return _rms(zs, params.final_norm)


MODEL = RWKV(hidden_dim=4, num_layers=2, ffn_dim=6, emission="gaussian", mode="recurrent",
             chunk_size=7)
MODES = {mode: dataclasses.replace(MODEL, mode=mode)
         for mode in ("recurrent", "parallel", "chunked")}
LAYER_LEAVES = set(MODEL.backbone.layer_param_shapes()._fields)  # with a layer axis


def _is_shape(x):
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def _random_params(seed, scale=0.3):
    """Random parameters in NumPy (no compilation): matrices ``N(0, 1 / fan_in)``, norm
    scales ``1 + N(0, 0.04)``, other vectors ``N(0, scale^2)``, a random head."""
    rng = np.random.default_rng(seed)
    # token-shift coefficients in [0, 1], decays w = exp(time_decay) from e^{-e^{-3}} to e^{-e}
    special = {"att_mix": lambda s: rng.uniform(0.0, 1.0, s),
               "ffn_mix": lambda s: rng.uniform(0.0, 1.0, s),
               "time_decay": lambda s: rng.uniform(-3.0, 1.0, s)}

    def leaf(name, shape):
        if name in special:
            out = special[name](shape)
        elif "norm" in name:
            out = 1.0 + 0.2 * rng.normal(size=shape)
        elif len(shape) >= 2 + (name in LAYER_LEAVES):
            out = rng.normal(size=shape) / np.sqrt(shape[-2])
        else:
            out = scale * rng.normal(size=shape)
        return jnp.asarray(out)

    def fill(shapes):
        return type(shapes)(*(leaf(f, sh) for f, sh in zip(shapes._fields, shapes,
                                                             strict=True)))

    shapes = MODEL.param_shapes()
    backbone = fill(shapes.backbone._replace(layers=()))._replace(
        layers=fill(shapes.backbone.layers))
    return ss.NeuralParams(backbone, fill(shapes.head))


def _model_params(t_len, seed=2):
    y = np.sin(np.arange(t_len) / 5.0) + 0.3 * np.random.default_rng(seed).normal(size=t_len)
    return _random_params(seed), y


LENGTHS = (1, 2, 17, 1000)


@pytest.fixture(scope="module")
def mode_runs():
    """Per length: both modes' log-likelihoods and gradients (`tests/models/neural/_modes.py`:
    two compiles serve the four lengths). (The chunked mode's values are checked in
    `test_modes_match_numpy_and_generation_step_by_step`, its gradient on the operator: its
    compile here would cost 3-5 s of CPU.)"""
    params, y = _model_params(1000)
    models = {mode: MODES[mode] for mode in ("recurrent", "parallel")}
    return _modes.mode_runs(models, params, y, LENGTHS)


@pytest.mark.parametrize("t_len", LENGTHS)
def test_recurrent_and_parallel_modes_agree_with_gradients(t_len, mode_runs):
    """Log-likelihood of ``y_{1:T}`` and its gradient agree to 1e-10 relative."""
    _modes.assert_modes_agree(mode_runs[t_len], reference="recurrent", rtol=1e-10)


def test_no_overflow_at_1e5_steps_float32():
    """Float32, decays from 1e-4 to e^6 per step, keys of size ~ 10^3 (e^k overflows
    float32 beyond 88): the stack's outputs are finite over T = 10^5 steps, and the WKV
    outputs (over 2 10^4) are convex combinations of the values seen so far."""
    rng = np.random.default_rng(3)
    bb = RWKVBackbone(input_dim=2, hidden_dim=4, num_layers=1, ffn_dim=4, mode="recurrent")
    params = jax.jit(bb.init_params, static_argnums=1)(jax.random.key(3), jnp.float32)
    decay = jnp.asarray([-9.0, 0.0, 3.0, 6.0], jnp.float32)
    layers = params.layers._replace(time_decay=decay[None],
                                    att_key=params.layers.att_key * 1000.0)
    xs = jnp.asarray(rng.normal(size=(100_000, 2)), jnp.float32)
    hs = jax.jit(bb.sequence)(params._replace(layers=layers), xs)
    assert hs.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(hs)))
    k = jnp.asarray(1000.0 * rng.normal(size=(20_000, 4)), jnp.float32)
    v = rng.normal(size=(20_000, 4)).astype(np.float32)
    _, out = jax.jit(wkv_recurrent)(jnp.exp(decay), jnp.zeros(4, jnp.float32), k,
                                    jnp.asarray(v), wkv_initial_state((4,), jnp.float32))
    out = np.asarray(out)
    assert out.dtype == np.float32 and np.all(np.isfinite(out))
    lo, hi = np.minimum.accumulate(v, axis=0), np.maximum.accumulate(v, axis=0)
    assert np.all((out >= lo - 1e-5) & (out <= hi + 1e-5))


@pytest.fixture(scope="module")
def case():
    return _model_params(40, seed=7)


@jax.jit
def _whole_sequence(params, xs):
    """Every mode's backbone over a whole sequence from the initial state."""
    return {mode: MODES[mode].backbone.scan(params, MODEL.backbone.initial_state(params), xs)
            for mode in MODES}


def _inputs(y, mask):
    """The network's inputs ``x_t = [y_{t-1} m_{t-1}, m_{t-1}]``, ``x_1 = 0``."""
    enc = np.stack([np.where(mask, y, 0.0), mask.astype(float)], -1)
    return np.concatenate([np.zeros((1, 2)), enc[:-1]])


def test_modes_match_numpy_and_generation_step_by_step(case):
    """The step-by-step filter (generation) on data with missing values equals every
    whole-sequence mode fed the same inputs, which equal the NumPy stack written from the
    paper; on complete data the whole-sequence fast path of each mode gives them too."""
    params, y = case
    head = MODEL.head
    mask = np.ones(40, bool)
    mask[[5, 6, 30]] = False
    for m in (mask, np.ones(40, bool)):
        xs = _inputs(y, m)
        ref_h = numpy_backbone(MODEL.backbone, params.backbone, xs)
        assert np.std(ref_h) > 0.1
        ref = np.where(m, np.asarray(head.distribution(params.head, jnp.asarray(ref_h))
                                     .log_prob(jnp.asarray(y))), 0.0)
        assert np.ptp(ref) > 0.1
        runs = _whole_sequence(params.backbone, jnp.asarray(xs))
        for _, hs in runs.values():
            np.testing.assert_allclose(np.asarray(hs), ref_h, rtol=1e-11, atol=1e-12)
        if not m.all():  # the step-by-step filter
            res = ss.filter(MODEL, params, y, mask=m)
            assert float(res.log_probs[30]) == 0.0
        else:  # the whole-sequence fast path (recurrent); the parallel one through the
            # Bayesian entry points' likelihood site (`fit_nuts`, `fit_svi`)
            res = ss.filter(MODEL, params, y)
            site = ss.SequenceDistribution(MODES["parallel"], params, num_timesteps=40)
            np.testing.assert_allclose(float(site.log_prob(jnp.asarray(y))), ref.sum(),
                                       rtol=1e-12)
        np.testing.assert_allclose(np.asarray(res.log_probs), ref, rtol=1e-10, atol=1e-12)
        for final, _ in runs.values():  # the final state of every mode
            for a, b in zip(jax.tree.leaves(res.final_carry.state), jax.tree.leaves(final),
                            strict=True):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10,
                                           atol=1e-12)


def test_fit_sgd_decreases_the_loss(case):
    params, y = case
    before = float(ss.log_prob(MODEL, params, y))
    fit = ss.fit_sgd(MODEL, params, y, optimizer=optax.adam(1e-2), num_steps=15,
                     key=jax.random.key(8), progress=False)
    assert float(ss.log_prob(MODEL, fit.params, y)) > before + 1.0


def test_save_load_round_trip(tmp_path, case):
    params, y = case
    model = MODEL  # (mode="recurrent": a field that round-trips)
    path = ss.save(tmp_path / "rwkv", model, params)
    model2, params2 = ss.load(path)
    assert model2 == model
    np.testing.assert_array_equal(np.asarray(ss.log_prob(model2, params2, y)),
                                  np.asarray(ss.log_prob(model, params, y)))


def test_default_mode_rule():
    assert default_mode(50, "cpu") == "recurrent"
    assert default_mode(50, "gpu") == "chunked"
    assert default_mode(10**5, "gpu") == "chunked"
    assert RWKVBackbone(input_dim=1, hidden_dim=2, parallel=True).mode_for(10) == "parallel"
    assert RWKVBackbone(input_dim=1, hidden_dim=2, evaluation="sequential").mode_for(
        10) == "recurrent"


@pytest.mark.parametrize("kwargs, match", [
    ({"hidden_dim": 0}, "hidden_dim"),
    ({"num_layers": 0}, "num_layers"),
    ({"ffn_dim": 0}, "ffn_dim"),
    ({"mode": "scan"}, "mode"),
    ({"chunk_size": 0}, "chunk_size"),
])
def test_invalid_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RWKV(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "recurrent", "parallel": True}, "contradicts"),
    ({"mode": "parallel", "evaluation": "sequential"}, "contradicts"),
    ({"mode": "chunked", "parallel": False}, "contradicts"),
    ({"evaluation": "deer"}, "Newton"),
])
def test_contradictory_backbone_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RWKVBackbone(input_dim=1, hidden_dim=2, **kwargs)
