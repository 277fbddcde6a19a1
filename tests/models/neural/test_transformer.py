"""Transformer: the backbone against an explicit NumPy softmax attention (within and beyond
the window, both encodings), KV-cache generation against the full causal forward pass,
RoPE's relative-position property, flax's attention layer with the same weights, bad
configurations, float32 at long T, missing values, fitting and save/load."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statseq as ss
from statseq.inference import attention as att
from statseq.models.neural.residual import RMS_EPS
from statseq.models.neural.transformer import Transformer, TransformerBackbone, default_mode


def _rms(x, w):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def _gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _rope(x, t, base):
    """Rotate pairs ``(x_i, x_{i + D/2})`` of ``x`` ``(H, D)`` by ``t θ_i``, in a loop."""
    h, d = x.shape
    out = x.copy()
    for i in range(d // 2):
        a = t * base ** (-2.0 * i / d)
        out[:, i] = x[:, i] * math.cos(a) - x[:, i + d // 2] * math.sin(a)
        out[:, i + d // 2] = x[:, i] * math.sin(a) + x[:, i + d // 2] * math.cos(a)
    return out


def numpy_attention(q, k, v, window):
    """Explicit causal sliding-window softmax attention, one query at a time (NumPy)."""
    t_len, h, d = q.shape
    out = np.zeros_like(q)
    for t in range(t_len):
        lo = max(0, t - window + 1)
        for j in range(h):
            s = k[lo:t + 1, j] @ q[t, j] / math.sqrt(d)
            w = np.exp(s - s.max())
            out[t, j] = (w / w.sum()) @ v[lo:t + 1, j]
    return out


def numpy_backbone(bb, params, xs):
    """The whole backbone from the empty cache, in NumPy (module docstring of the model)."""
    params = jax.tree.map(np.asarray, params)
    t_len, h, d = xs.shape[0], bb.num_heads, bb.head_dim
    z = xs @ params.embed_weight + params.embed_bias
    if bb.positional == "sinusoidal":
        pe = np.zeros((t_len, bb.hidden_dim))
        for t in range(t_len):
            for i in range(bb.hidden_dim):
                a = t / bb.rope_base ** (2 * (i // 2) / bb.hidden_dim)
                pe[t, i] = math.sin(a) if i % 2 == 0 else math.cos(a)
        z = z + pe
    for ell in range(bb.num_layers):
        p = jax.tree.map(lambda a, ell=ell: a[ell], params.layers)
        v = _rms(z, params.norm[ell])
        q, k, u = ((v @ w).reshape(t_len, h, d) for w in (p.w_q, p.w_k, p.w_v))
        if bb.positional == "rope":
            q = np.stack([_rope(q[t], t, bb.rope_base) for t in range(t_len)])
            k = np.stack([_rope(k[t], t, bb.rope_base) for t in range(t_len)])
        z = z + numpy_attention(q, k, u, bb.max_len).reshape(t_len, h * d) @ p.w_o
        hid = _gelu(_rms(z, p.mlp_norm) @ p.w_1 + p.b_1)
        z = z + hid @ p.w_2 + p.b_2
    return _rms(z, params.final_norm)


def perturbed(params, seed, scale=0.3):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(x + scale * rng.normal(size=x.shape)), params)


@pytest.mark.parametrize("positional, max_len", [("rope", 4), ("sinusoidal", 16)])
def test_every_form_matches_numpy_attention(positional, max_len):
    """Parallel mode (whole, and split at step 5: the second part from the first part's
    caches, full for the window 4, part-filled for 16), recurrent mode and the generation
    step against NumPy, 1e-12; T = 11 is beyond the window 4 (RoPE) and within the
    window 16 (sinusoidal)."""
    bb = TransformerBackbone(input_dim=3, hidden_dim=4, num_layers=2, num_heads=2,
                             max_len=max_len, positional=positional, mlp_ratio=2)
    params = perturbed(bb.init_params(jax.random.key(0)), 1)
    xs = np.random.default_rng(2).normal(size=(11, 3))
    ref = numpy_backbone(bb, params, xs)
    assert np.std(ref) > 0.1

    @jax.jit
    def run(params, xs):
        init = bb.initial_state(params)
        outs, finals = [], []
        for mode in ("parallel", "recurrent"):
            final, whole = dataclasses.replace(bb, mode=mode).scan(params, init, xs)
            outs.append(whole)
            finals.append(final)
        scan = dataclasses.replace(bb, mode="parallel").scan  # continued from a cache
        mid, first = scan(params, init, xs[:5])
        end, second = scan(params, mid, xs[5:])
        outs.append(jnp.concatenate([first, second]))
        finals.append(end)
        final, steps = jax.lax.scan(lambda s, x: bb.step(params, s, x), init, xs)
        return jnp.stack(outs + [steps]), finals + [final]

    outs, finals = run(params, jnp.asarray(xs))
    for got in np.asarray(outs):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    for final in finals[:-1]:  # the same caches (keys, values, position) in every form
        for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(finals[-1]), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13)
    assert float(finals[-1].position[0]) == 11.0


MODELS = {  # 100 > both windows; 17 > 8 (rope), 17 < 32 (sinusoidal)
    "rope": Transformer(hidden_dim=4, num_heads=2, num_layers=2, max_len=8, mlp_ratio=1),
    "sinusoidal": Transformer(hidden_dim=4, num_heads=2, num_layers=2, max_len=32,
                              mlp_ratio=1, positional="sinusoidal"),
}


@pytest.fixture(scope="module")
def model_params():
    y = np.sin(np.arange(40) / 3.0)
    out = {}
    for name, model in MODELS.items():
        p = model.initialize(y, key=jax.random.key(6))
        out[name] = p._replace(backbone=perturbed(p.backbone, 7))
    return out


def _series(t_len):
    rng = np.random.default_rng(t_len)
    return jnp.asarray(np.sin(np.arange(t_len) / 4.0) + 0.5 * rng.normal(size=t_len))


@pytest.mark.parametrize("name", list(MODELS))
def test_kv_cache_generation_equals_full_causal_forward(model_params, name):
    """Per-step log-densities of the step-by-step filter (KV-cache steps, ``ss.filter``)
    at T = 100 against the full causal forward pass (parallel mode) at T in
    {1, 2, 17, 100} (causal: the filter's first T terms) and the recurrent mode at
    T = 100, 1e-10 relative; T = 100 is past both windows, T = 17 past the RoPE one."""
    model, params = MODELS[name], model_params[name]
    y = _series(100)
    step = np.asarray(ss.filter(model, params, y).log_probs)
    assert np.all(np.isfinite(step))
    none = jnp.zeros((100, 0))

    @jax.jit
    def whole(params, y):
        return [dataclasses.replace(model, mode="parallel").complete_data_log_probs(
            params, y[:t_len], none[:t_len])[0] for t_len in (1, 2, 17, 100)] + [
            dataclasses.replace(model, mode="recurrent").complete_data_log_probs(
                params, y, none)[0]]

    for got in whole(params, y):
        got = np.asarray(got)
        np.testing.assert_allclose(got, step[:got.shape[0]], rtol=1e-10, atol=1e-12)


def test_modes_agree_in_gradient(model_params):
    """The log-likelihood's gradient, parallel vs recurrent mode, T = 30 (past the
    window 8), 1e-10 of its largest entry."""
    from tests.models.neural._modes import assert_modes_agree, mode_runs

    models = {m: dataclasses.replace(MODELS["rope"], mode=m) for m in ("parallel", "recurrent")}
    runs = mode_runs(models, model_params["rope"], np.asarray(_series(30)), [30])
    assert_modes_agree(runs[30], rtol=1e-10)


def test_rope_scores_depend_only_on_the_lag():
    """``rope(q, i) . rope(k, j)`` is unchanged when both positions shift (1e-12), and
    changes with the lag; the norm is preserved."""
    rng = np.random.default_rng(4)
    q, k = (jnp.asarray(rng.normal(size=(3, 8))) for _ in range(2))
    i, j = jnp.arange(6.0)[:, None], jnp.arange(6.0)[None, :]

    def scores(shift):
        rq = att.apply_rope(jnp.broadcast_to(q, (6, 1, 3, 8)), i + shift)
        rk = att.apply_rope(jnp.broadcast_to(k, (1, 6, 3, 8)), j + shift)
        return np.asarray(jnp.sum(rq * rk, axis=-1))  # (6, 6, 3)

    base = scores(0.0)
    for shift in (1.0, 37.0, 1000.0):
        np.testing.assert_allclose(scores(shift), base, rtol=1e-12, atol=1e-12)
    for lag in range(-5, 6):  # constant along each diagonal, different across diagonals
        diag = np.stack([base[a, a - lag] for a in range(6) if 0 <= a - lag < 6])
        np.testing.assert_allclose(diag, np.broadcast_to(diag[0], diag.shape), rtol=1e-12,
                                   atol=1e-12)
    assert np.min(np.abs(base[1, 0] - base[0, 0])) > 1e-3
    rq = att.apply_rope(q, jnp.asarray(5.0))
    np.testing.assert_allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(q, axis=-1),
                               rtol=1e-13)


def test_sinusoidal_encoding_formula():
    got = np.asarray(att.sinusoidal_encoding(jnp.arange(5.0), 6))
    t, i = np.arange(5.0)[:, None], np.arange(3)[None, :]
    angle = t / 10000.0 ** (2 * i / 6)
    np.testing.assert_allclose(got[:, 0::2], np.sin(angle), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(got[:, 1::2], np.cos(angle), rtol=1e-14, atol=1e-15)
    assert att.sinusoidal_encoding(jnp.arange(2.0), 5).shape == (2, 5)


@pytest.mark.parametrize("window", [None, 3])
def test_equals_flax_multi_head_attention(window):
    """One attention sub-block (no positional encoding) against flax.linen's
    ``MultiHeadDotProductAttention`` (``use_bias=False``) with the same weights, under
    the causal mask (``window=None``: the window covers the sequence) and a sliding
    window of 3 (flax given the same mask); 1e-12."""
    flax = pytest.importorskip("flax")
    nn = flax.linen
    t_len, d, h = 7, 6, 2
    max_len = t_len if window is None else window
    bb = TransformerBackbone(input_dim=1, hidden_dim=d, num_heads=h, max_len=max_len,
                             positional=None, mode="parallel")
    p = jax.tree.map(lambda a: a[0], perturbed(bb.init_params(jax.random.key(8)), 9).layers)
    vs = jnp.asarray(np.random.default_rng(10).normal(size=(t_len, d)))
    ours = bb.layer_scan(p, bb.layer_initial_state(p), vs)[1]

    mha = nn.MultiHeadDotProductAttention(num_heads=h, qkv_features=d, out_features=d,
                                          use_bias=False, dtype=jnp.float64,
                                          param_dtype=jnp.float64)
    hd = d // h
    weights = {"params": {
        "query": {"kernel": p.w_q.reshape(d, h, hd)},
        "key": {"kernel": p.w_k.reshape(d, h, hd)},
        "value": {"kernel": p.w_v.reshape(d, h, hd)},
        "out": {"kernel": p.w_o.reshape(h, hd, d)},
    }}
    shapes = jax.tree.map(jnp.shape, mha.init(jax.random.key(0), vs[None]))
    assert shapes == jax.tree.map(jnp.shape, weights)
    if window is None:
        mask = nn.make_causal_mask(jnp.ones((1, t_len)))
    else:
        pos = jnp.arange(float(t_len))
        mask = att.window_mask(pos, pos, window)[None, None]
    theirs = mha.apply(weights, vs[None], mask=mask)[0]
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-12, atol=1e-12)


def test_float32_long_sequence_is_finite():
    """T = 10^4 in float32, window 256, scores of scale ~100 (keys and queries of scale
    10): finite, outputs convex combinations of the values, the parallel form equal to the
    KV-cache steps to float32 accuracy."""
    t_len, h, d = 10_000, 1, 4
    keys = jax.random.split(jax.random.key(11), 3)
    q, k = (10.0 * jax.random.normal(kk, (t_len, h, d), jnp.float32) for kk in keys[:2])
    q, k = (att.apply_rope(a, jnp.arange(t_len, dtype=jnp.float32)) for a in (q, k))
    v = jax.random.normal(keys[2], (t_len, h, d), jnp.float32)
    cache = att.kv_cache_init(256, h, d, jnp.float32)
    run = jax.jit(lambda q, k, v: (att.attention_recurrent(cache, q, k, v),
                                   att.attention_parallel(cache, q[-300:], k[-300:],
                                                          v[-300:])[1]))
    (final, rec), par = run(q, k, v)
    rec = np.asarray(rec)
    assert rec.dtype == np.float32 and np.all(np.isfinite(rec))
    assert float(final.position) == t_len
    assert np.all(np.abs(rec) <= np.max(np.abs(np.asarray(v))) * (1 + 1e-5))
    # the last 300 steps from the empty cache match the recurrence once the window
    # holds only those steps (from step 256 of the 300 on)
    np.testing.assert_allclose(np.asarray(par)[256:], rec[-44:], rtol=2e-4, atol=2e-4)


def test_missing_value_step_path_equals_whole_sequence(model_params):
    """The filter with a missing value (KV-cache steps) against the whole-sequence
    parallel form fed the same network inputs (0 and indicator 0 at the gap)."""
    from tests.models.neural._modes import assert_missing_steps_match_whole_sequence

    y = np.cos(np.arange(100) / 3.0)  # T = 100: the filter program of the test above
    mask = np.ones(100, bool)
    mask[[7, 60]] = False
    assert_missing_steps_match_whole_sequence(MODELS["rope"], model_params["rope"], y, mask,
                                              ("parallel",))


def test_fit_sgd_decreases_the_loss_and_save_load_round_trip(tmp_path, model_params):
    model = MODELS["rope"]
    y = np.sin(np.arange(40) / 4.0) + 0.1 * np.random.default_rng(12).normal(size=40)
    fit = ss.fit_sgd(model, model_params["rope"], y, optimizer=optax.adam(0.02),
                     num_steps=10, key=jax.random.key(13), progress=False)
    trace = np.asarray(fit.log_joint)
    assert trace[-1] > trace[0] + 1.0
    path = ss.save(tmp_path / "transformer", model, fit.params)
    model2, params2 = ss.load(path)
    assert model2 == model
    assert float(ss.log_prob(model2, params2, y)) == float(ss.log_prob(model, fit.params, y))


def test_default_mode():
    assert default_mode(1024) == "parallel" and default_mode(1025) == "recurrent"
    bb = MODELS["rope"].backbone
    assert bb.resolved_mode(10) == "parallel"
    assert dataclasses.replace(bb, parallel=True).resolved_mode(10**5) == "parallel"
    assert dataclasses.replace(bb, parallel=False).resolved_mode(10) == "recurrent"
    assert dataclasses.replace(bb, evaluation="sequential").resolved_mode(10) == "recurrent"


@pytest.mark.parametrize("kwargs, match", [
    ({"hidden_dim": 6, "num_heads": 4}, "must divide hidden_dim"),
    ({"hidden_dim": 6, "num_heads": 2}, "even"),  # RoPE on heads of width 3
    ({"max_len": 0}, "max_len"),
    ({"max_len": -3}, "max_len"),
    ({"num_heads": 0}, "num_heads"),
    ({"mlp_ratio": 0}, "mlp_ratio"),
    ({"positional": "learned"}, "positional"),
    ({"rope_base": 1.0}, "rope_base"),
    ({"mode": "chunked"}, "mode"),
    ({"mode": "recurrent", "parallel": True}, "contradicts"),
])
def test_invalid_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerBackbone(input_dim=2, **{"hidden_dim": 4, **kwargs})
    if "parallel" not in kwargs:
        with pytest.raises(ValueError, match=match):
            Transformer(**{"hidden_dim": 4, **kwargs})


def test_from_start_form_equals_cache_form_in_value_and_gradient(model_params):
    """From the initial (empty) caches, the ``T x T`` parallel form (`scan_from_start`, the
    path of ``log_prob`` and ``fit_sgd``) equals the ``T x (W + T)`` cache form
    (`scan` from `initial_state`): features, final caches and the gradient of a scalar
    of the features, 1e-10 (float64), beyond the window 8 (T = 12; values alone within it,
    T = 5, where the final cache keeps zero slots);
    and ``log_prob``'s program holds no ``T x (W + T)`` score matrix."""
    model, params = MODELS["rope"], model_params["rope"]
    bb = dataclasses.replace(model.backbone, mode="parallel")
    xs = jnp.asarray(np.random.default_rng(14).normal(size=(12, bb.input_dim)))
    w = jnp.asarray(np.random.default_rng(15).normal(size=(12, bb.output_dim)))

    def objective(form, p, t_len):
        final, hs = form(p, xs[:t_len])
        return jnp.sum(jnp.tanh(hs) * w[:t_len]), (final, hs)

    def cache_form(p, x):
        return bb.scan(p, bb.initial_state(p), x)

    @jax.jit
    def both(p):  # gradients beyond the window; values alone within it (fewer programs)
        grad = jax.grad(objective, argnums=1, has_aux=True)
        within = [(jax.tree.map(jnp.zeros_like, p), objective(form, p, 5)[1])
                  for form in (bb.scan_from_start, cache_form)]
        return [(grad(bb.scan_from_start, p, 12), grad(cache_form, p, 12)), within]

    for (g_new, (f_new, h_new)), (g_old, (f_old, h_old)) in both(params.backbone):
        np.testing.assert_allclose(np.asarray(h_new), np.asarray(h_old), rtol=1e-10,
                                   atol=1e-12)
        for a, b in zip(jax.tree.leaves((f_new, g_new)), jax.tree.leaves((f_old, g_old)),
                        strict=True):
            scale = max(float(np.abs(np.asarray(b)).max()), 1e-300)
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                                       atol=1e-10 * scale)
    # the model's complete-data path takes the T x T form: scores (5, 5), never (5, 13)
    y = _series(5)[None]
    jaxpr = str(jax.make_jaxpr(dataclasses.replace(model, mode="parallel")
                               .complete_data_log_probs_batch)(params, y, jnp.zeros((1, 5, 0))))
    assert ",5,5]" in jaxpr and ",5,13]" not in jaxpr
