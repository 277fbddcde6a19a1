"""WaveNet: the dilated convolution against `jax.lax.conv_general_dilated` and a NumPy
direct sum, the stack against NumPy, the queue (Fast WaveNet) generation against the
whole-sequence convolution (log-probabilities and gradients, float64, 1e-10 relative,
T in {1, 2, 17, 1000}), the receptive field by perturbation, and the model's entry points."""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statseq as ss
from statseq.models.neural.residual import RMS_EPS
from statseq.models.neural.wavenet import (
    WaveNet,
    WaveNetBackbone,
    default_wavenet_mode,
    dilated_causal_conv,
)


def _rms(x, w):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def numpy_conv(vs, weight, bias, dilation):
    """``out_t = bias + sum_k vs_{t-(K-1-k)δ} @ weight[k]``, zeros before the start."""
    k_taps, t_len = weight.shape[0], vs.shape[0]
    out = np.tile(bias, (t_len, 1))
    for t in range(t_len):
        for k in range(k_taps):
            s = t - (k_taps - 1 - k) * dilation
            if s >= 0:
                out[t] += vs[s] @ weight[k]
    return out


def numpy_backbone(bb, params, xs):
    """The stack written out layer by layer with the NumPy convolution."""
    p = jax.tree.map(np.asarray, params)
    g = bb.gates
    z = xs @ p.embed_weight + p.embed_bias
    skip = np.zeros_like(z)
    for ell, dil in enumerate(bb.dilations):
        lp = jax.tree.map(lambda a, ell=ell: a[ell], p.layers)
        pre = numpy_conv(_rms(z, p.norm[ell]), lp.conv_weight, lp.conv_bias, dil)
        o = np.tanh(pre[:, :g]) / (1.0 + np.exp(-pre[:, g:]))
        z = z + o @ lp.res_weight + lp.res_bias
        skip = skip + o @ lp.skip_weight + lp.skip_bias
    return _rms(skip, p.final_norm)


def perturbed_params(bb, key, scale=0.3):
    """Random weights plus Gaussian noise (NumPy: no compilation), so that every weight
    and bias matters."""
    rng = np.random.default_rng(97)
    return jax.tree.map(lambda x: jnp.asarray(x + scale * rng.normal(size=x.shape)),
                        bb.init_params(key))


@pytest.mark.parametrize("dilation, k_taps", [(1, 2), (2, 3), (4, 2)])
def test_dilated_conv_matches_lax_conv_and_numpy(dilation, k_taps):
    rng = np.random.default_rng(dilation)
    vs = rng.normal(size=(13, 3))
    w = rng.normal(size=(k_taps, 3, 5))
    b = rng.normal(size=5)
    got = np.asarray(dilated_causal_conv(jnp.asarray(vs), jnp.asarray(w), jnp.asarray(b),
                                         dilation))
    # lax: cross-correlation over (N, C, T) with the kernel dilated and causal left padding
    lax_out = jax.lax.conv_general_dilated(
        jnp.asarray(vs.T[None]), jnp.asarray(np.transpose(w, (2, 1, 0))), window_strides=(1,),
        padding=[((k_taps - 1) * dilation, 0)], rhs_dilation=(dilation,))[0].T + b
    np.testing.assert_allclose(got, np.asarray(lax_out), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, numpy_conv(vs, w, b, dilation), rtol=1e-12, atol=1e-12)


BACKBONE = WaveNetBackbone(input_dim=3, hidden_dim=4, num_layers=3, kernel_size=3,
                           dilation_cycle=2, gate_dim=5)


def test_backbone_matches_numpy_in_both_modes():
    params = perturbed_params(BACKBONE, jax.random.key(0))
    xs = np.random.default_rng(0).normal(size=(23, 3))
    ref = numpy_backbone(BACKBONE, params, xs)
    assert np.std(ref) > 0.1
    for mode in ("convolution", "recurrent"):
        bb = dataclasses.replace(BACKBONE, mode=mode)
        got = jax.jit(bb.sequence)(params, jnp.asarray(xs))
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-12)


def test_convolution_continues_from_any_queue():
    """Chunks of the convolution handed over through the queue equal one run, and its
    final queue equals the step mode's (chunk lengths below and above the queue size)."""
    params = perturbed_params(BACKBONE, jax.random.key(0))
    xs = jnp.asarray(np.random.default_rng(1).normal(size=(19, 3)))
    conv = jax.jit(dataclasses.replace(BACKBONE, mode="convolution").scan)
    rec = jax.jit(dataclasses.replace(BACKBONE, mode="recurrent").scan)
    s0 = BACKBONE.initial_state(params)
    full_state, full = conv(params, s0, xs)
    rec_state, _ = rec(params, s0, xs)
    pieces, s = [], s0
    for lo, hi in ((0, 3), (3, 11), (11, 19)):  # shorter and longer than the queue (P = 4)
        s, out = conv(params, s, xs[lo:hi])
        pieces.append(out)
    np.testing.assert_allclose(np.concatenate(pieces), full, rtol=1e-12, atol=1e-13)
    for a, b, c in zip(jax.tree.leaves(s), jax.tree.leaves(full_state),
                       jax.tree.leaves(rec_state), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-12, atol=1e-13)


def test_receptive_field_is_the_set_of_inputs_that_change_the_output():
    """``∂h_t/∂x_s`` is nonzero exactly for ``0 <= t - s < R`` (kernel 3, dilations
    1, 2, 1: ``R = 1 + 2 * 4 = 9``)."""
    bb = BACKBONE
    assert bb.dilations == (1, 2, 1) and bb.receptive_field == 9
    params = perturbed_params(bb, jax.random.key(0))
    t_len = 14
    xs = jnp.asarray(np.random.default_rng(2).normal(size=(t_len, 3)))
    jac = np.asarray(jax.jit(jax.jacfwd(lambda x: bb.sequence(params, x)))(xs))  # (T,F,T,I)
    depends = np.abs(jac).max(axis=(1, 3)) > 0
    lag = np.arange(t_len)[:, None] - np.arange(t_len)[None, :]
    np.testing.assert_array_equal(depends, (lag >= 0) & (lag < bb.receptive_field))


MODEL = WaveNet(hidden_dim=4, num_layers=2, kernel_size=2, gate_dim=3, input_dim=1,
                emission_dim=2)  # dilations 1, 2: R = 4, queues of P = 2


def _model_params(t_len=40):
    rng = np.random.default_rng(1)
    u = np.sin(np.arange(t_len) / 4.0)[:, None]
    y = np.stack([np.cos(np.arange(t_len) / 5.0), u[:, 0] ** 2], -1) + 0.3 * rng.normal(
        size=(t_len, 2))
    params = MODEL.initialize(y, key=jax.random.key(2), inputs=u)
    return params._replace(backbone=perturbed_params(MODEL.backbone, jax.random.key(3)))


PARAMS = _model_params()


def _whole_sequence(models):
    """For each model: per-step log-probabilities, final carry and the gradient of their
    sum by its whole-sequence path (one compiled program per length for all modes)."""

    def total(model, params, y, u):
        log_probs, final = model.complete_data_log_probs(params, y, u)
        return jnp.sum(log_probs), (log_probs, final)

    @jax.jit
    def run(params, y, u):
        return [jax.value_and_grad(partial(total, m), has_aux=True)(params, y, u)
                for m in models]

    return run


MODES = ("convolution", "recurrent")
WHOLE = _whole_sequence([dataclasses.replace(MODEL, mode=m) for m in MODES])


@pytest.mark.parametrize("t_len", [1, 2, 17, 1000])
def test_queue_generation_equals_the_convolution(t_len):
    """The step-by-step filter (the queue step), the recurrent mode (``lax.scan`` of the
    same step) and the convolution: per-step log-probabilities, final queue and
    gradients to 1e-10 relative, float64."""
    rng = np.random.default_rng(t_len)
    y = rng.normal(size=(t_len, 2))
    u = rng.normal(size=(t_len, 1))
    step = ss.filter(MODEL, PARAMS, y, inputs=u, return_carries=True)  # one step at a time
    ref = np.asarray(step.log_probs)
    assert np.all(np.isfinite(ref))
    last = jax.tree.map(lambda c: c[-1], step.carries)
    grads = {}
    outs = WHOLE(PARAMS, jnp.asarray(y), jnp.asarray(u))
    for mode, out in zip(MODES, outs, strict=True):
        (total, (log_probs, final)), grads[mode] = out
        np.testing.assert_allclose(np.asarray(log_probs), ref, rtol=1e-10, atol=1e-12)
        assert abs(float(total) - float(step.log_prob)) <= 1e-10 * abs(float(step.log_prob))
        for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(last), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
    g_conv, g_rec = grads["convolution"], grads["recurrent"]
    for a, b in zip(jax.tree.leaves(g_conv), jax.tree.leaves(g_rec), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 1e-10 * max(np.max(np.abs(b)), 1e-300)
    if t_len == 1000:  # every weight matters, except the last layer's residual output
        layers = g_conv.backbone.layers
        for name, g in layers._asdict().items():
            g = np.asarray(g)
            live = g[:-1] if name.startswith("res_") else g
            assert np.all(np.any(live != 0, axis=tuple(range(1, g.ndim)))), name
        assert np.all(np.asarray(layers.res_weight[-1]) == 0)


def test_model_receptive_field_over_observations():
    """The predictive of ``y_t`` depends on ``y_{t-R}, ..., y_{t-1}`` and nothing older."""
    model = WaveNet(hidden_dim=3, num_layers=2, kernel_size=2)  # R = 1 + 1 + 2 = 4
    assert model.receptive_field == 4 and "receptive field 4" in repr(model)
    rng = np.random.default_rng(3)
    y = jnp.asarray(rng.normal(size=12))
    params = model.initialize(y, key=jax.random.key(4))
    params = params._replace(backbone=perturbed_params(model.backbone, jax.random.key(5)))
    no_inputs = jnp.zeros((12, 0))
    jac = np.asarray(jax.jit(jax.jacfwd(
        lambda v: model.complete_data_log_probs(params, v, no_inputs)[0]))(y))
    lag = np.arange(12)[:, None] - np.arange(12)[None, :]
    np.testing.assert_array_equal(jac != 0, (lag >= 0) & (lag <= model.receptive_field))


def test_masked_steps_run_the_queue():
    """Masked data run the queue step; the unmasked prefix equals the filter's fast path
    (the convolution), and a gap matters only inside the receptive field."""
    rng = np.random.default_rng(6)
    y = rng.normal(size=(30, 2))
    u = rng.normal(size=(30, 1))
    mask = np.ones(y.shape, bool)
    mask[7, 0] = mask[20] = False
    res = ss.filter(MODEL, PARAMS, y, mask=mask, inputs=u)
    full = ss.filter(MODEL, PARAMS, y, inputs=u)
    np.testing.assert_allclose(np.asarray(res.log_probs)[:7], np.asarray(full.log_probs)[:7],
                               rtol=1e-10)
    assert float(res.log_probs[20]) == 0.0 and np.all(np.isfinite(np.asarray(res.log_probs)))
    # the gap at step 20 stops mattering once it leaves the receptive field (R = 4)
    assert MODEL.receptive_field == 4
    mask2 = np.ones(y.shape, bool)
    mask2[20] = False
    res2 = ss.filter(MODEL, PARAMS, y, mask=mask2, inputs=u)
    np.testing.assert_allclose(np.asarray(res2.log_probs)[25:],
                               np.asarray(full.log_probs)[25:], rtol=1e-10)
    assert np.all(np.asarray(res2.log_probs)[21:25] != np.asarray(full.log_probs)[21:25])


def test_forecast():
    """Sample paths from the filtered queues (vmap against a loop: the contract test)."""
    rng = np.random.default_rng(7)
    y = rng.normal(size=(25, 2))
    u = rng.normal(size=(25, 1))
    fc = ss.forecast(MODEL, PARAMS, y, num_steps=4, num_samples=50,
                     key=jax.random.key(7), inputs=u, future_inputs=np.zeros((4, 1)))
    samples = np.asarray(fc.samples)
    assert samples.shape == (50, 4, 2) and np.all(np.isfinite(samples))
    lo, hi = fc.interval(0.9)
    assert np.all(np.asarray(lo) < np.asarray(hi))


def test_fit_sgd_decreases_the_loss():
    model = WaveNet(hidden_dim=4, num_layers=2)
    y = np.sin(np.arange(60) / 3.0) + 0.1 * np.random.default_rng(8).normal(size=60)
    params = model.initialize(y, key=jax.random.key(9))
    fit = ss.fit_sgd(model, params, y, optimizer=optax.adam(3e-2), num_steps=20,
                     key=jax.random.key(10), progress=False)
    trace = np.asarray(fit.log_joint)  # the log-likelihood (no priors) at each step
    assert trace.shape == (20,) and np.all(np.isfinite(trace))
    assert trace[-1] > trace[0] + 5.0 and np.mean(np.diff(trace) > 0) > 0.8


def test_save_load_round_trip_and_the_bayesian_likelihood(tmp_path):
    """`ss.save`/`ss.load`, and the Bayesian entry points' likelihood site
    (`SequenceDistribution`, used by `fit_nuts` and `fit_svi`) equals `log_prob`."""
    y = np.random.default_rng(11).normal(size=(20, 2))
    u = np.zeros((20, 1))
    path = ss.save(tmp_path / "wavenet", MODEL, PARAMS)
    model2, params2 = ss.load(path)
    assert model2 == MODEL
    ref = float(ss.log_prob(MODEL, PARAMS, y, inputs=u))
    assert float(ss.log_prob(model2, params2, y, inputs=u)) == ref
    seq = ss.SequenceDistribution(MODEL, PARAMS, num_timesteps=20, inputs=u)
    np.testing.assert_allclose(float(seq.log_prob(jnp.asarray(y))), ref, rtol=1e-12)


def test_no_overflow_on_long_float32_sequences():
    """T = 10^5, float32, large weights and inputs: the gates saturate, nothing overflows."""
    bb = WaveNetBackbone(input_dim=2, hidden_dim=4, num_layers=1)
    params = jax.tree.map(lambda a: (50.0 * a).astype(jnp.float32),
                          bb.init_params(jax.random.key(13), dtype=jnp.float32))
    xs = (1e4 * jax.random.normal(jax.random.key(14), (100_000, 2))).astype(jnp.float32)
    hs = jax.jit(bb.sequence)(params, xs)
    assert hs.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(hs)))


def test_default_mode_and_mode_choices():
    assert default_wavenet_mode("cpu", 10) == default_wavenet_mode("gpu", 10**5) == \
        "convolution"
    assert WaveNetBackbone(input_dim=1, hidden_dim=2).resolved_mode == "convolution"
    assert WaveNetBackbone(input_dim=1, hidden_dim=2, parallel=False).resolved_mode == \
        "recurrent"
    assert WaveNetBackbone(input_dim=1, hidden_dim=2,
                           evaluation="sequential").resolved_mode == "recurrent"
    assert WaveNet(num_layers=20, dilation_cycle=10).backbone.dilations == \
        tuple(2**i for i in range(10)) * 2


@pytest.mark.parametrize("kwargs, error, match", [
    ({"hidden_dim": 0}, ValueError, "hidden_dim"),
    ({"num_layers": 0}, ValueError, "num_layers"),
    ({"kernel_size": 1}, ValueError, "kernel_size"),
    ({"dilation_cycle": 0}, ValueError, "dilation_cycle"),
    ({"gate_dim": 0}, ValueError, "gate_dim"),
    ({"mode": "fft"}, ValueError, "mode"),
])
def test_invalid_configuration(kwargs, error, match):
    with pytest.raises(error, match=match):
        WaveNet(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"evaluation": "deer"}, "WaveNet has no parallel Newton"),
    ({"mode": "convolution", "parallel": False}, "contradicts"),
    ({"mode": "recurrent", "parallel": True}, "contradicts"),
    ({"mode": "convolution", "evaluation": "sequential"}, "contradicts"),
])
def test_backbone_refuses_contradictions(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WaveNetBackbone(input_dim=1, hidden_dim=2, **kwargs)
