"""Linear attention: every form against the explicit T x T attention matrix in NumPy, the
recurrent, parallel and chunked modes against each other (log-probabilities and
gradients, float64), long float32 sequences, missing values, fitting and save/load."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statseq as ss
from statseq.inference import linear_attention as la
from statseq.models.neural.linear_attention import (
    LinearAttention,
    LinearAttentionBackbone,
    default_mode,
)
from statseq.models.neural.residual import RMS_EPS
from tests.models.neural import _modes

MODES = ("recurrent", "parallel", "chunked")


def _rms(x, w):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def _phi(x, name):
    if name == "elu+1":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    if name == "relu":
        return np.maximum(x, 0.0)
    return np.logaddexp(0.0, x)


def _gamma(bb, p):
    if bb.decay == "learned":
        return 1.0 / (1.0 + np.exp(-p.decay))
    return np.full(bb.num_heads, 1.0 if bb.decay is None else bb.decay)


def numpy_layer(bb, p, vs):
    """One layer from the zero state through the explicit masked T x T attention matrix
    ``A_{ts} = γ^{t-s} phi(q_t) . phi(k_s)`` (s <= t) of each head, in NumPy."""
    p = jax.tree.map(np.asarray, p)
    t_len, h, d = vs.shape[0], bb.num_heads, bb.dim_head
    q = _phi(vs @ p.w_q, bb.feature_map).reshape(t_len, h, d)
    k = _phi(vs @ p.w_k, bb.feature_map).reshape(t_len, h, d)
    v = (vs @ p.w_v).reshape(t_len, h, d)
    lag = np.arange(t_len)[:, None] - np.arange(t_len)[None, :]
    out = np.zeros((t_len, h, d))
    for i, g in enumerate(_gamma(bb, p)):
        a = np.where(lag >= 0, g ** np.maximum(lag, 0), 0.0) * (q[:, i] @ k[:, i].T)
        out[:, i] = a @ v[:, i] / (a.sum(axis=1)[:, None] + bb.eps)
    return out.reshape(t_len, h * d) @ p.w_o


def numpy_backbone(bb, params, xs):
    params = jax.tree.map(np.asarray, params)
    zs = xs @ params.embed_weight + params.embed_bias
    for ell in range(bb.num_layers):
        layer = jax.tree.map(lambda a, ell=ell: a[ell], params.layers)
        zs = zs + numpy_layer(bb, layer, _rms(zs, params.norm[ell]))
    return _rms(zs, params.final_norm)


def perturbed(params, seed, scale=0.3):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(x + scale * rng.normal(size=x.shape)), params)


def test_feature_maps():
    x = np.linspace(-30.0, 30.0, 601)
    for name in la.FEATURE_MAPS:
        got = np.asarray(la.feature_map(jnp.asarray(x), name))
        np.testing.assert_allclose(got, _phi(x, name), rtol=1e-14, atol=1e-300)
        assert np.all(got >= 0)
    assert np.all(np.asarray(la.feature_map(jnp.asarray(x))) > 0)  # elu + 1: positive
    with pytest.raises(ValueError, match="feature_map"):
        la.feature_map(jnp.zeros(2), "exp")


def _all_modes(bb, split):
    """One compiled function: the whole-sequence features in every mode, if ``split``
    the same split at step 5 (the second part from the first part's final state
    ``(S, z)``), and the generation steps; and the final states of them all."""

    @jax.jit
    def run(params, xs):
        init = bb.initial_state(params)
        outs, finals = [], []
        for mode in MODES:
            scan = dataclasses.replace(bb, mode=mode).scan
            final, whole = scan(params, init, xs)
            outs.append(whole)
            finals.append(final)
            if split:
                mid, first = scan(params, init, xs[:5])
                end, second = scan(params, mid, xs[5:])
                outs.append(jnp.concatenate([first, second]))
                finals.append(end)
        final, steps = jax.lax.scan(lambda s, x: bb.step(params, s, x), init, xs)
        return jnp.stack(outs + [steps]), finals + [final]

    return run


@pytest.mark.parametrize("feature_map, decay", [("relu", 0.8), ("elu+1", "learned")])
def test_every_mode_matches_the_dense_attention_matrix(feature_map, decay):
    """Every mode (from the start, and for one case continued from a state) and the
    generation step."""
    bb = LinearAttentionBackbone(input_dim=3, hidden_dim=4, num_layers=2, num_heads=2,
                                 feature_map=feature_map, decay=decay, chunk_size=4,
                                 eps=1e-3 if feature_map == "relu" else 1e-6)
    params = perturbed(bb.init_params(jax.random.key(0)), 1)
    xs = np.random.default_rng(2).normal(size=(11, 3))
    ref = numpy_backbone(bb, params, xs)
    assert np.std(ref) > 0.1
    # 11 steps = 2 full chunks of 4 and a partial one (5 + 6 when split)
    outs, finals = _all_modes(bb, split=decay == "learned")(params, jnp.asarray(xs))
    for got in np.asarray(outs):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    for final in finals[:-1]:
        for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(finals[-1]), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13)


MODEL = LinearAttention(hidden_dim=4, num_heads=2, num_layers=1, decay="learned",
                        chunk_size=8)  # one layer: the stacking is checked against NumPy above


@pytest.fixture(scope="module")
def params():
    y = np.sin(np.arange(40) / 3.0)
    p = MODEL.initialize(y, key=jax.random.key(6))
    return p._replace(backbone=perturbed(p.backbone, 7))


LENGTHS = (1, 2, 17, 1000)


@pytest.fixture(scope="module")
def mode_runs(params):
    """Per length: the log-likelihood and its gradient by the generation step (a
    `jax.lax.scan` of ``MODEL.step``, what the filter runs) and by the whole-sequence path
    of ``ss.log_prob`` on complete data in every mode (`tests/models/neural/_modes.py`: two
    compiles serve the four lengths); the series; the modes whose forms really ran."""
    rng = np.random.default_rng(1000)
    y = np.sin(np.arange(1000) / 4.0) + 0.5 * rng.normal(size=1000)
    models = {"step": _modes.Steps(MODEL)} | {
        mode: dataclasses.replace(MODEL, mode=mode) for mode in MODES}
    used = []
    original = la.linear_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(la, "linear_attention",
                   lambda *a, **k: used.append(k["mode"]) or original(*a, **k))
        runs = _modes.mode_runs(models, params, y, LENGTHS)
    return runs, y, used


@pytest.mark.parametrize("t_len", LENGTHS)
def test_modes_agree_in_log_prob_and_gradient(t_len, mode_runs):
    """float64, random parameters: 1e-10 relative between the generation step and the
    three modes (measured: equal values, gradients within 1e-15 of their largest entry)."""
    runs, _, used = mode_runs
    assert sorted(set(used)) == sorted(MODES)  # each mode's form really ran
    _modes.assert_modes_agree(runs[t_len], reference="step", rtol=1e-10)


def test_sequence_distribution_equals_the_modes(params, mode_runs):
    """The Bayesian entry points' likelihood (`ss.SequenceDistribution`, default mode) and
    its gradient equal the generation step's at T = 17 (1e-10 relative)."""
    runs, y, _ = mode_runs
    y17 = jnp.asarray(y[:17])
    v, g = jax.jit(jax.value_and_grad(lambda p: ss.SequenceDistribution(
        MODEL, p, num_timesteps=17).log_prob(y17)))(params)
    _modes.assert_modes_agree({"step": runs[17]["step"], "distribution": (v, g)},
                              reference="step", rtol=1e-10)


def test_no_overflow_at_t_1e5_in_float32():
    """T = 10^5 steps, no decay (the state grows linearly), keys and queries with
    pre-activations of scale 30, in float32: finite, and the chunked form agrees with the
    recurrent one to float32 accuracy."""
    t_len, h, d = 100_000, 1, 4
    keys = jax.random.split(jax.random.key(8), 3)
    q, k = (la.feature_map(30.0 * jax.random.normal(kk, (t_len, h, d), jnp.float32))
            for kk in keys[:2])
    v = jax.random.normal(keys[2], (t_len, h, d), jnp.float32)
    state = la.LinearAttentionState(jnp.zeros((h, d, d), jnp.float32),
                                    jnp.zeros((h, d), jnp.float32))
    lg = jnp.zeros((h,), jnp.float32)

    @jax.jit
    def run(q, k, v):
        return (la.linear_attention(state, q, k, v, lg, 1e-6, mode="recurrent"),
                la.linear_attention(state, q, k, v, lg, 1e-6, mode="chunked",
                                    chunk_size=256)[1])

    (final, rec), chk = run(q, k, v)
    assert rec.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(rec)))
    assert np.all(np.isfinite(np.asarray(final.s)))
    np.testing.assert_allclose(np.asarray(chk), np.asarray(rec), rtol=2e-3, atol=2e-3)
    # the outputs are convex combinations of the values
    assert np.all(np.abs(np.asarray(rec)) <= np.max(np.abs(np.asarray(v))) * (1 + 1e-4))


def test_missing_value_step_path_equals_whole_sequence(params):
    """The filter with a missing value runs the generation step one step at a time; the
    whole-sequence chunked mode on the same network inputs (0 and indicator 0
    at the gap) gives the same log-probabilities."""
    y = np.cos(np.arange(20) / 3.0)
    mask = np.ones(20, bool)
    mask[7] = False
    _modes.assert_missing_steps_match_whole_sequence(MODEL, params, y, mask, ("chunked",))


def test_fit_sgd_decreases_the_loss_and_save_load_round_trip(tmp_path, params):
    y = np.sin(np.arange(60) / 4.0) + 0.1 * np.random.default_rng(9).normal(size=60)
    fit = ss.fit_sgd(MODEL, params, y, optimizer=optax.adam(0.02), num_steps=10,
                     key=jax.random.key(10), progress=False)
    trace = np.asarray(fit.log_joint)
    assert trace[-1] > trace[0] + 1.0
    path = ss.save(tmp_path / "linattn", MODEL, fit.params)
    model2, params2 = ss.load(path)
    assert model2 == MODEL
    assert float(ss.log_prob(model2, params2, y)) == float(ss.log_prob(MODEL, fit.params, y))


def test_default_mode():
    for backend in ("cpu", "gpu"):
        assert default_mode(8, 8, backend) == "parallel"
    assert default_mode(9, 8, "cpu") == "chunked"
    assert default_mode(9, 8, "gpu") == "parallel" and default_mode(1025, 8, "gpu") == "chunked"
    bb = MODEL.backbone
    assert bb.resolved_mode(1000) == default_mode(1000, 8)
    assert dataclasses.replace(bb, parallel=True).resolved_mode(1000) == "parallel"  # GPU rule
    assert dataclasses.replace(bb, parallel=True).resolved_mode(2000) == "chunked"
    assert dataclasses.replace(bb, parallel=True).resolved_mode(8) == "parallel"
    assert dataclasses.replace(bb, parallel=False).resolved_mode(1000) == "recurrent"
    assert dataclasses.replace(bb, evaluation="sequential").resolved_mode(10) == "recurrent"


@pytest.mark.parametrize("kwargs, match", [
    ({"hidden_dim": 0}, "hidden_dim"),
    ({"num_heads": 0}, "num_heads"),
    ({"hidden_dim": 2, "num_heads": 3}, "num_heads"),
    ({"head_dim": 0}, "head_dim"),
    ({"feature_map": "exp"}, "feature_map"),
    ({"decay": 1.5}, "decay"),
    ({"decay": 0.0}, "decay"),
    ({"decay": "fixed"}, "decay"),
    ({"eps": -1.0}, "eps"),
    ({"mode": "scan"}, "mode"),
    ({"chunk_size": 0}, "chunk_size"),
])
def test_invalid_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinearAttention(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "parallel", "evaluation": "sequential"}, "contradicts"),
    ({"mode": "recurrent", "parallel": True}, "contradicts"),
    ({"mode": "chunked", "parallel": False}, "contradicts"),
    ({"evaluation": "deer"}, "mode="),
])
def test_contradictory_evaluation_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinearAttentionBackbone(input_dim=2, hidden_dim=4, **kwargs)
