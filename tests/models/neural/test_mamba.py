"""Mamba: the block against a NumPy implementation, and its parallel, sequential and
step-by-step (generation) modes against each other, in float64."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.models.neural.mamba import Mamba, MambaBackbone
from statseq.models.neural.residual import RMS_EPS


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(0.0, x)


def _rms(x, w):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def numpy_layer(bb, p, vs):
    """One Mamba layer from zero state, written out per time step, channel and state."""
    e, n, r, k = bb.inner_dim, bb.state_dim, bb.rank, bb.conv_width
    p = jax.tree.map(np.asarray, p)
    t_len = vs.shape[0]
    xz = vs @ p.in_proj
    x, z = xz[:, :e], xz[:, e:]
    h = np.zeros((e, n))
    out = np.zeros((t_len, bb.hidden_dim))
    for t in range(t_len):
        conv = p.conv_bias.copy()
        for j in range(k):  # tap j sees x_{t-K+1+j}; zeros before the start
            s = t - k + 1 + j
            if s >= 0:
                conv += p.conv_weight[j] * x[s]
        c = _silu(conv)
        proj = c @ p.x_proj
        delta = _softplus(proj[:r] @ p.dt_weight + p.dt_bias)
        b, cc = proj[r:r + n], proj[r + n:]
        y = np.zeros(e)
        for i in range(e):
            for m in range(n):
                a_im = -np.exp(p.a_log[i, m])
                h[i, m] = np.exp(delta[i] * a_im) * h[i, m] + delta[i] * b[m] * c[i]
                y[i] += h[i, m] * cc[m]
            y[i] += p.d_skip[i] * c[i]
        out[t] = (y * _silu(z[t])) @ p.out_proj
    return out


def numpy_backbone(bb, params, xs):
    params = jax.tree.map(np.asarray, params)
    zs = xs @ params.embed_weight + params.embed_bias
    for ell in range(bb.num_layers):
        layer = jax.tree.map(lambda a, ell=ell: a[ell], params.layers)
        zs = zs + numpy_layer(bb, layer, _rms(zs, params.norm[ell]))
    return _rms(zs, params.final_norm)


def perturbed_params(bb, key):
    """Random weights plus Gaussian noise (NumPy: no compilation), with larger step sizes,
    so that the recurrence, the convolution and every parameter matter."""
    rng = np.random.default_rng(99)
    params = jax.tree.map(lambda x: jnp.asarray(x + 0.3 * rng.normal(size=x.shape)),
                          bb.init_params(key))
    return params._replace(layers=params.layers._replace(dt_bias=params.layers.dt_bias + 1.5))


BACKBONE = MambaBackbone(input_dim=3, hidden_dim=4, num_layers=2, state_dim=3, expand=2,
                         conv_width=4, dt_rank=2)


@pytest.fixture(scope="module")
def bb_case():
    params = perturbed_params(BACKBONE, jax.random.key(0))
    xs = np.random.default_rng(0).normal(size=(11, 3))
    return params, xs


def test_backbone_matches_numpy_in_every_mode(bb_case):
    params, xs = bb_case
    ref = numpy_backbone(BACKBONE, params, xs)
    assert np.std(ref) > 0.1
    for parallel in (False, True):
        bb = dataclasses.replace(BACKBONE, parallel=parallel)
        got = jax.jit(bb.sequence)(params, jnp.asarray(xs))
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-12)

    @jax.jit
    def stepwise(params, xs):
        return jax.lax.scan(lambda s, x: BACKBONE.step(params, s, x),
                            BACKBONE.initial_state(params), xs)

    final, hs = stepwise(params, jnp.asarray(xs))
    np.testing.assert_allclose(np.asarray(hs), ref, rtol=1e-12, atol=1e-12)
    # the step mode's conv buffer holds the last K-1 conv inputs of each layer
    assert final.conv.shape == (2, 3, BACKBONE.inner_dim)


def test_scan_continues_from_any_state(bb_case):
    """Whole-sequence mode from a carried state (SSM state and conv buffer) equals one run:
    the buffer hand-over between chunks is exact."""
    params, xs = bb_case
    xs = jnp.asarray(xs)
    for parallel in (False, True):
        bb = dataclasses.replace(BACKBONE, parallel=parallel)
        s0 = bb.initial_state(params)
        scan = jax.jit(bb.scan)
        full_state, full = scan(params, s0, xs)
        mid, first = scan(params, s0, xs[:5])
        end, second = scan(params, mid, xs[5:])
        np.testing.assert_allclose(np.concatenate([first, second]), full, rtol=1e-12,
                                   atol=1e-13)
        for a, b in zip(jax.tree.leaves(end), jax.tree.leaves(full_state), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13)


MODEL = Mamba(hidden_dim=4, state_dim=3, num_layers=2, expand=2, conv_width=3, input_dim=1,
              emission_dim=2)


@pytest.fixture(scope="module")
def model_case():
    rng = np.random.default_rng(1)
    t_len = 40
    u = np.sin(np.arange(t_len) / 4.0)[:, None]
    y = np.stack([np.cos(np.arange(t_len) / 5.0), u[:, 0] ** 2], -1) + 0.3 * rng.normal(
        size=(t_len, 2))
    params = MODEL.initialize(y, key=jax.random.key(2), inputs=u)
    params = params._replace(backbone=perturbed_params(MODEL.backbone, jax.random.key(3)))
    return params, y, u


def test_parallel_sequential_and_generation_modes_agree(model_case):
    params, y, u = model_case
    runs = {}
    for parallel in (False, True):
        model = dataclasses.replace(MODEL, parallel=parallel)
        runs[parallel] = ss.filter(model, params, y, inputs=u)  # whole-sequence fast path
    step = ss.filter(MODEL, params, y, inputs=u, return_carries=True)  # one step at a time
    ref = np.asarray(step.log_probs)
    assert np.all(np.isfinite(ref)) and np.ptp(ref) > 0.1
    for res in runs.values():
        np.testing.assert_allclose(np.asarray(res.log_probs), ref, rtol=1e-10, atol=1e-12)
    # the fast path's final carry equals the step path's last carry
    fast = jax.jit(MODEL.complete_data_log_probs)(params, jnp.asarray(y), jnp.asarray(u))[1]
    last = jax.tree.map(lambda c: c[-1], step.carries)
    for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(last), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_masked_steps_use_the_step_mode(model_case):
    params, y, u = model_case
    mask = np.ones(y.shape, bool)
    mask[7, 0] = mask[20] = False
    res = ss.filter(MODEL, params, y, mask=mask, inputs=u)
    full = ss.filter(MODEL, params, y, inputs=u)
    np.testing.assert_allclose(np.asarray(res.log_probs)[:7], np.asarray(full.log_probs)[:7],
                               rtol=1e-10)
    assert float(res.log_probs[20]) == 0.0
    assert np.all(np.isfinite(np.asarray(res.log_probs)))


@pytest.mark.parametrize("parallel", [False, True])
def test_gradients_finite_on_long_sequences(parallel):
    model = Mamba(hidden_dim=4, state_dim=2, num_layers=1, expand=1, parallel=parallel)
    y = np.sin(np.arange(2000) / 7.0) + 0.1 * np.random.default_rng(4).normal(size=2000)
    params = model.initialize(y, key=jax.random.key(5))
    grads = jax.jit(jax.grad(lambda p: ss.log_prob(model, p, y)))(params)
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
    assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(grads.backbone.layers))


def test_forecast(model_case):
    """Ancestral sample paths from the filtered state (ss.sample itself is covered by the
    contract test)."""
    params, y, u = model_case
    fc = ss.forecast(MODEL, params, y, num_steps=4, num_samples=50, key=jax.random.key(7),
                     inputs=u, future_inputs=np.zeros((4, 1)))
    samples = np.asarray(fc.samples)
    assert samples.shape[-2:] == (4, 2) and np.all(np.isfinite(samples))
    lo, hi = fc.interval(0.9)
    assert np.all(np.asarray(lo) < np.asarray(hi))


def test_save_load_round_trip(tmp_path, model_case):
    params, y, u = model_case
    path = ss.save(tmp_path / "mamba", MODEL, params)
    model2, params2 = ss.load(path)
    assert model2 == MODEL
    np.testing.assert_array_equal(np.asarray(ss.log_prob(model2, params2, y, inputs=u)),
                                  np.asarray(ss.log_prob(MODEL, params, y, inputs=u)))


@pytest.mark.parametrize("field, value, error", [
    ("hidden_dim", 0, ValueError), ("state_dim", -1, ValueError), ("expand", 0, ValueError),
    ("conv_width", 0, ValueError), ("dt_rank", 0, ValueError), ("parallel", "yes", TypeError),
])
def test_invalid_configuration(field, value, error):
    with pytest.raises(error, match=field):
        Mamba(**{field: value})
