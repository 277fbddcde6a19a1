"""mLSTM: the matrix memory against the unstabilized recurrence of Beck et al. (2024),
eqs. (19)-(27), in a float64 NumPy loop; the layer against a NumPy implementation; the
recurrent, parallel and step-by-step (generation) modes against each other
(log-probabilities and gradients, 1e-10 relative, T in {1, 2, 17, 1000}); no overflow at
T = 10^5 in float32 with large gates and keys; fitting, masks, save/load."""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statseq as ss
from statseq.inference.matrix_memory import (
    matrix_memory_chunked,
    matrix_memory_initial_state,
    matrix_memory_parallel,
    matrix_memory_recurrent,
)
from statseq.models.neural.mlstm import MLSTM, MLSTMBackbone, default_mode
from statseq.models.neural.residual import RMS_EPS
from tests.models.neural import _modes


def naive_memory(q, k, v, i_pre, log_f, cov=None, norm=None):
    """The cell without stabilizer: ``C = f C + i v k^T``, ``n = f n + i k``,
    ``h = C q / max(|n^T q|, 1)`` (moderate gates only)."""
    p = q.shape[1]
    cov = np.zeros((p, p)) if cov is None else cov
    norm = np.zeros(p) if norm is None else norm
    out, dots = [], []
    for t in range(q.shape[0]):
        f, i = np.exp(log_f[t]), np.exp(i_pre[t])
        cov = f * cov + i * np.outer(v[t], k[t])
        norm = f * norm + i * k[t]
        dots.append(abs(norm @ q[t]))
        out.append(cov @ q[t] / max(dots[-1], 1.0))
    return np.stack(out), cov, norm, np.array(dots)


def _memory_case(rng, t_len, p, forget):
    q, k, v = rng.normal(size=(3, t_len, p))
    i_pre = rng.normal(size=t_len) * 2.0
    f_pre = rng.normal(size=t_len) + 1.0
    log_f = -np.logaddexp(0.0, -f_pre) if forget == "sigmoid" else 0.3 * f_pre - 0.3
    return q, k, v, i_pre, log_f


@pytest.mark.parametrize("fn", [matrix_memory_recurrent, matrix_memory_parallel,
                                partial(matrix_memory_chunked, chunk_size=5)])
def test_memory_against_unstabilized_loop_and_from_a_carried_state(fn):
    rng = np.random.default_rng(0)
    run = jax.jit(fn)
    all_dots = []
    for forget in ("sigmoid", "exp"):
        q, k, v, i_pre, log_f = _memory_case(rng, 21, 3, forget)
        ref, cov, norm, dots = naive_memory(q, k, v, i_pre, log_f)
        all_dots.append(dots)
        s0 = matrix_memory_initial_state(3, jnp.float64)
        final, got = run(q, k, v, i_pre, log_f, s0)
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-11, atol=1e-13)
        # the state is the unnormalized memory divided by e^m
        scale = np.exp(float(final.max))
        np.testing.assert_allclose(scale * np.asarray(final.cov), cov, rtol=1e-11)
        np.testing.assert_allclose(scale * np.asarray(final.norm), norm, rtol=1e-11)
        if fn in (matrix_memory_recurrent, matrix_memory_parallel):
            # two parts, the second from the first's carried state (C', n', m)
            mid, first = run(q[:8], k[:8], v[:8], i_pre[:8], log_f[:8], s0)
            end, second = run(q[8:], k[8:], v[8:], i_pre[8:], log_f[8:], mid)
            np.testing.assert_allclose(np.concatenate([first, second]), ref, rtol=1e-11,
                                       atol=1e-13)
            for a, b in zip(end, final, strict=True):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-11,
                                           atol=1e-13)
        # (the chunked form hands the state over between its chunks in the same way; the
        # gradient of `scan_chunks` against the recurrence's is checked in test_rwkv.py)
    # the normalizer max(|n^T q|, 1) takes both branches in these cases
    all_dots = np.concatenate(all_dots)
    assert np.mean(all_dots < 1.0) > 0.1 and np.mean(all_dots > 1.0) > 0.1


def _rms(x, wgt):
    return wgt * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_backbone(bb, params, xs):
    """The mLSTM stack from the paper's equations, with `naive_memory` per head."""
    params = jax.tree.map(np.asarray, params)
    e, nh, hd = bb.inner_dim, bb.num_heads, bb.head_dim
    zs = xs @ params.embed_weight + params.embed_bias
    for ell in range(bb.num_layers):
        p = jax.tree.map(lambda a, ell=ell: a[ell], params.layers)
        xg = _rms(zs, params.norm[ell]) @ p.up_proj
        x, g = xg[:, :e], xg[:, e:]
        q, k, v = x @ p.query, x @ p.key / np.sqrt(hd), x @ p.value
        i_pre = x @ p.igate_weight + p.igate_bias
        log_f = np.log(_sigmoid(x @ p.fgate_weight + p.fgate_bias))
        h = np.concatenate([
            naive_memory(q[:, j * hd:(j + 1) * hd], k[:, j * hd:(j + 1) * hd],
                         v[:, j * hd:(j + 1) * hd], i_pre[:, j], log_f[:, j])[0]
            for j in range(nh)], axis=1)
        o = _sigmoid(x @ p.ogate_weight + p.ogate_bias)
        zs = zs + (o * h * g * _sigmoid(g)) @ p.down_proj
    return _rms(zs, params.final_norm)


MODEL = MLSTM(hidden_dim=4, num_layers=2, num_heads=2, expand=1, emission="poisson",
              mode="recurrent", chunk_size=7)
MODES = {mode: dataclasses.replace(MODEL, mode=mode)
         for mode in ("recurrent", "parallel", "chunked")}
LAYER_LEAVES = set(MODEL.backbone.layer_param_shapes()._fields)  # with a layer axis


def _is_shape(x):
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def _random_params(seed, scale=0.5):
    """Random parameters in NumPy (no compilation): matrices ``N(0, 1 / fan_in)``, norm
    scales ``1 + N(0, 0.04)``, other vectors ``N(0, scale^2)``, a random head."""
    rng = np.random.default_rng(seed)
    # forget gates sigma(f) mostly near 1, as the reference initialization makes them
    special = {"fgate_bias": lambda s: rng.uniform(1.0, 4.0, s)}

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
    y = np.random.default_rng(seed).poisson(np.exp(1.0 + np.sin(np.arange(t_len) / 4.0)))
    return _random_params(seed, scale=0.5), y


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
    """Float32, exponential forget gates with log f up to +-30 per step, input gates up to
    e^{300} and keys of size ~ 100 (all overflow float32 unstabilized): the memory's
    outputs and states are finite (over 2 10^4 steps), and so are the stack's over
    T = 10^5 steps with forget gates e^{20} and input gates ~ e^{100}."""
    rng = np.random.default_rng(3)
    t_len = 20_000
    q, k, v = (jnp.asarray(a, jnp.float32) for a in rng.normal(size=(3, t_len, 2)))
    i_pre = jnp.asarray(rng.uniform(-300.0, 300.0, t_len), jnp.float32)
    log_f = jnp.asarray(rng.uniform(-30.0, 30.0, t_len), jnp.float32)
    final, h = jax.jit(matrix_memory_recurrent)(q, 100.0 * k, v, i_pre, log_f,
                                                matrix_memory_initial_state(2, jnp.float32))
    assert h.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(h)))
    assert all(bool(jnp.all(jnp.isfinite(a))) for a in final)
    bb = MLSTMBackbone(input_dim=2, hidden_dim=4, num_layers=1, num_heads=2, expand=1,
                       forget_gate="exp", mode="recurrent")
    params = jax.jit(bb.init_params, static_argnums=1)(jax.random.key(4), jnp.float32)
    layers = params.layers._replace(fgate_bias=params.layers.fgate_bias + 20.0,
                                    igate_weight=params.layers.igate_weight * 100.0,
                                    key=params.layers.key * 100.0)
    hs = jax.jit(bb.sequence)(params._replace(layers=layers),
                              jnp.asarray(rng.normal(size=(100_000, 2)), jnp.float32))
    assert hs.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(hs)))


@pytest.fixture(scope="module")
def case():
    return _model_params(40, seed=7)


@jax.jit
def _whole_sequence(params, xs):
    """Every mode's backbone over a whole sequence from the initial state."""
    return {mode: MODES[mode].backbone.scan(params, MODEL.backbone.initial_state(params), xs)
            for mode in MODES}


def test_modes_match_numpy_and_generation_step_by_step(case):
    """The step-by-step filter (generation) on data with missing values equals every
    whole-sequence mode fed the same inputs (the head's encoding of ``y_{t-1}`` times
    ``m_{t-1}``, and ``m_{t-1}``), which equal the NumPy stack written from the paper; on
    complete data the whole-sequence fast path of each mode gives them too."""
    params, y = case
    head = MODEL.head
    mask = np.ones(40, bool)
    mask[[5, 6, 30]] = False
    for m in (mask, np.ones(40, bool)):
        enc = np.asarray(jax.vmap(head.encode)(jnp.asarray(y), jnp.asarray(m)))
        xs = np.concatenate([np.zeros((1, enc.shape[1])), enc[:-1]])
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
    path = ss.save(tmp_path / "mlstm", model, params)
    model2, params2 = ss.load(path)
    assert model2 == model
    np.testing.assert_array_equal(np.asarray(ss.log_prob(model2, params2, y)),
                                  np.asarray(ss.log_prob(model, params, y)))


def test_default_mode_rule():
    assert default_mode(50, "cpu") == "parallel"
    assert default_mode(1024, "cpu") == "parallel"
    assert default_mode(1025, "cpu") == "chunked"
    assert default_mode(50, "gpu") == "parallel"
    assert default_mode(10**5, "tpu") == "chunked"


@pytest.mark.parametrize("kwargs, match", [
    ({"hidden_dim": 0}, "hidden_dim"),
    ({"num_layers": 0}, "num_layers"),
    ({"num_heads": 0}, "num_heads"),
    ({"hidden_dim": 3, "num_heads": 2, "expand": 1}, "multiple"),
    ({"forget_gate": "tanh"}, "forget_gate"),
    ({"mode": "scan"}, "mode"),
    ({"chunk_size": 0}, "chunk_size"),
])
def test_invalid_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MLSTM(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "recurrent", "parallel": True}, "contradicts"),
    ({"mode": "parallel", "parallel": False}, "contradicts"),
])
def test_contradictory_backbone_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MLSTMBackbone(input_dim=1, hidden_dim=2, **kwargs)
