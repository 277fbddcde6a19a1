"""S4D and S5: every layer against a NumPy implementation with the discretization by a dense
matrix exponential (scipy's expm) or a dense solve, the three whole-sequence modes
(recurrent, scan, convolution) and step-by-step generation against each other in float64
(log-probabilities and gradients, 1e-10 relative, issue 15 point 5), a long float32 run,
fitting, save/load and the configuration checks."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.linalg import expm
from scipy.special import erf

import statseq as ss
from statseq.models.neural import s4
from statseq.models.neural.residual import RMS_EPS
from statseq.models.neural.s4 import MODES, S4DBackbone, default_mode
from statseq.models.neural.s5 import S5Backbone


def _rms(x, w):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def _mix(p, y, output):
    g = 0.5 * y * (1.0 + erf(y / np.sqrt(2.0)))
    z = g @ p.out_weight + p.out_bias
    if output == "gelu":
        return z
    h = y.shape[-1]
    return z[..., :h] / (1.0 + np.exp(-z[..., h:]))


def _discretize_dense(a, b, dt, method):
    """Dense discretization of x' = diag(a) x + b u (b: (M, I)): scipy's expm of the
    augmented matrix (zero-order hold) or dense solves (bilinear)."""
    m, i = b.shape
    if method == "zoh":
        aug = np.zeros((m + i, m + i), complex)
        aug[:m, :m], aug[:m, m:] = np.diag(a), b
        e = expm(dt * aug)
        return e[:m, :m], e[:m, m:]
    eye = np.eye(m)
    left = eye - dt / 2 * np.diag(a)
    return np.linalg.solve(left, eye + dt / 2 * np.diag(a)), np.linalg.solve(left, dt * b)


def numpy_s4d_layer(bb, p, vs):
    """H single-input systems, each with its dense (M, M) Ā and (M, 1) B̄, step by step."""
    p = jax.tree.map(np.asarray, p)
    out = np.zeros_like(vs)
    for h in range(bb.hidden_dim):
        a = -np.exp(p.a_log_re[h]) + 1j * p.a_im[h]
        b = (p.b_re[h] + 1j * p.b_im[h])[:, None]
        a_bar, b_bar = _discretize_dense(a, b, np.exp(p.log_dt[h]), bb.discretization)
        c = p.c_re[h] + 1j * p.c_im[h]
        x = np.zeros(bb.num_modes, complex)
        for t, v in enumerate(vs[:, h]):
            x = a_bar @ x + b_bar[:, 0] * v
            out[t, h] = 2.0 * np.real(c @ x) + p.d_skip[h] * v
    return _mix(p, out, bb.output)


def numpy_s5_layer(bb, p, vs):
    """One shared state: per state m its own step Δ_m, so Ā, B̄ from one (1 + H) expm per
    state; then the dense recurrence x_t = Ā x_{t-1} + B̄ v_t and y_t = 2 Re C̃ x_t + D v_t."""
    p = jax.tree.map(np.asarray, p)
    m, h = bb.num_modes, bb.hidden_dim
    lam = -np.exp(p.a_log_re) + 1j * p.a_im
    b = p.b_re + 1j * p.b_im
    a_bar, b_bar = np.zeros((m, m), complex), np.zeros((m, h), complex)
    for i in range(m):
        ai, bi = _discretize_dense(lam[i:i + 1], b[i:i + 1], np.exp(p.log_dt[i]),
                                   bb.discretization)
        a_bar[i, i], b_bar[i] = ai[0, 0], bi[0]
    c = p.c_re + 1j * p.c_im
    x = np.zeros(m, complex)
    out = np.zeros_like(vs)
    for t, v in enumerate(vs):
        x = a_bar @ x + b_bar @ v
        out[t] = 2.0 * np.real(c @ x) + p.d_skip * v
    return _mix(p, out, bb.output)


def numpy_backbone(bb, params, xs, layer_fn):
    params = jax.tree.map(np.asarray, params)
    zs = xs @ params.embed_weight + params.embed_bias
    for ell in range(bb.num_layers):
        layer = jax.tree.map(lambda a, ell=ell: a[ell], params.layers)
        zs = zs + layer_fn(bb, layer, _rms(zs, params.norm[ell]))
    return _rms(zs, params.final_norm)


def perturbed(params, seed=97, log_dt_shift=2.0):
    """Random weights plus Gaussian noise, with larger steps Δ so that the states and
    every parameter matter (NumPy noise: no compilation)."""
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: jnp.asarray(x + 0.3 * rng.normal(size=x.shape)), params)
    return params._replace(layers=params.layers._replace(
        log_dt=params.layers.log_dt + log_dt_shift))


CASES = {
    "S4D": (S4DBackbone, numpy_s4d_layer),
    "S5": (S5Backbone, numpy_s5_layer),
}


@pytest.mark.parametrize("name, discretization, output", [
    ("S4D", "zoh", "glu"), ("S4D", "bilinear", "gelu"),
    ("S5", "zoh", "glu"), ("S5", "bilinear", "gelu"),
])
def test_layers_match_numpy_with_dense_discretization(name, discretization, output):
    cls, layer_fn = CASES[name]
    bb = cls(input_dim=3, hidden_dim=4, num_layers=2, state_dim=4, mode="recurrent",
             discretization=discretization, output=output)
    params = perturbed(bb.init_params(jax.random.key(0)))
    xs = np.random.default_rng(0).normal(size=(11, 3))
    ref = numpy_backbone(bb, params, xs, layer_fn)
    assert np.std(ref) > 0.1
    got = jax.jit(bb.sequence)(params, jnp.asarray(xs))
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("name", ["S4D", "S5"])
def test_layer_kernel_is_the_impulse_response(name):
    """`kernel` (closed-form Vandermonde) against C Ā^j B̄ by explicit dense powers; the
    convolution mode's layer output is the direct sum with that kernel (plus the skip)."""
    cls, _ = CASES[name]
    bb = cls(input_dim=1, hidden_dim=3, state_dim=6, mode="convolution")
    p = jax.tree.map(lambda a: a[0], perturbed(bb.init_params(jax.random.key(1))).layers)
    length = 9
    vs = np.random.default_rng(2).normal(size=(length, 3))

    @jax.jit
    def kernel_and_system(p):
        disc, c = bb.discretized(p)
        out = bb.layer_scan(p, bb.layer_initial_state(p), jnp.asarray(vs))[1]
        return bb.kernel(p, length), disc.a_bar, disc.b_bar, c, out

    got, a_bar, b_bar, c, out = (np.asarray(v) for v in kernel_and_system(p))
    for j in range(length):
        if name == "S4D":  # per channel: (H,) taps
            ref = [2 * np.real(c[h] @ np.diag(a_bar[h] ** j) @ b_bar[h]) for h in range(3)]
        else:  # MIMO: (H, H) matrix per lag
            ref = 2 * np.real(c @ np.linalg.matrix_power(np.diag(a_bar), j) @ b_bar)
        np.testing.assert_allclose(got[j], ref, rtol=1e-12, atol=1e-14)
    if name == "S4D":
        conv = [sum(got[j] * vs[t - j] for j in range(t + 1)) for t in range(length)]
    else:
        conv = [sum(got[j] @ vs[t - j] for j in range(t + 1)) for t in range(length)]
    ref_out = _mix(jax.tree.map(np.asarray, p), np.asarray(conv) + np.asarray(p.d_skip) * vs,
                   bb.output)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13)


def _model(name, **kw):
    cls = ss.S4D if name == "S4D" else ss.S5
    return cls(**({"hidden_dim": 4, "state_dim": 4, "num_layers": 1} | kw))


def _case(name, t_len):
    rng = np.random.default_rng(t_len)
    y = np.sin(np.arange(t_len) / 5.0) + 0.5 * rng.normal(size=t_len)
    model = _model(name)
    params = model.initialize(np.sin(np.arange(20.0)), key=jax.random.key(2))
    return model, params._replace(backbone=perturbed(params.backbone, seed=5)), y


@pytest.mark.parametrize("t_len", [1, 2, 17, 1000])
@pytest.mark.parametrize("name", ["S4D", "S5"])
def test_modes_agree_in_log_prob_and_gradient(name, t_len):
    """Per-step log-probabilities (the complete-data path of ``ss.log_prob``) and the
    gradient of their sum."""
    model, params, y = _case(name, t_len)
    y, u = jnp.asarray(y), jnp.zeros((t_len, 0))

    @jax.jit
    def all_modes(params):
        def total(p, m):
            lps = dataclasses.replace(model, mode=m).complete_data_log_probs(p, y, u)[0]
            return jnp.sum(lps), lps
        return [jax.value_and_grad(total, has_aux=True)(params, m) for m in MODES]

    ((_, lp_ref), g_ref), *others = all_modes(params)
    lp_ref = np.asarray(lp_ref)
    assert np.all(np.isfinite(lp_ref))
    g_ref = np.concatenate([np.ravel(g) for g in jax.tree.leaves(g_ref)])
    assert np.all(np.isfinite(g_ref))
    for (_, lp), g in others:
        np.testing.assert_allclose(np.asarray(lp), lp_ref, rtol=1e-10,
                                   atol=1e-10 * np.max(np.abs(lp_ref)))
        g = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
        np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-10 * np.max(np.abs(g_ref)))


@pytest.mark.parametrize("name", ["S4D", "S5"])
def test_generation_and_missing_values_match_the_whole_sequence(name, monkeypatch):
    """The step-by-step filter (generation's path) equals the convolution mode, including
    the final carry (S4D's summed in 4 chunks of 8 steps, 2 of them padding); a masked
    step is not scored and the steps before it are unchanged."""
    monkeypatch.setattr(s4, "FINAL_STATE_CHUNK", 8)
    model, params, y = _case(name, 30)
    model = dataclasses.replace(model, mode="convolution")
    step = ss.filter(model, params, y, return_carries=True)  # one step at a time
    fast = jax.jit(model.complete_data_log_probs)(params, jnp.asarray(y), jnp.zeros((30, 0)))
    np.testing.assert_allclose(np.asarray(fast[0]), np.asarray(step.log_probs), rtol=1e-10,
                               atol=1e-12)
    last = jax.tree.map(lambda c: c[-1], step.carries)
    for a, b in zip(jax.tree.leaves(fast[1]), jax.tree.leaves(last), strict=True):
        assert a.dtype == b.dtype and not jnp.iscomplexobj(a)  # a real carry
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
    mask = np.ones(30, bool)
    mask[12] = False
    gap = ss.filter(model, params, y, mask=mask)
    assert float(gap.log_probs[12]) == 0.0
    np.testing.assert_allclose(np.asarray(gap.log_probs)[:12],
                               np.asarray(step.log_probs)[:12], rtol=1e-12)
    assert np.all(np.isfinite(np.asarray(gap.log_probs)))
    assert not np.allclose(np.asarray(gap.log_probs)[13:], np.asarray(step.log_probs)[13:])


def test_long_float32_sequence_is_finite():
    """T = 10^5 in float32 with fast decays (ā underflows to 0), near-unit ones and large
    inputs: no overflow or NaN in the scan (products of ā; the same `linear_recurrence`
    for S5) and convolution (powers exp(j log ā), FFT) modes."""
    t_len = 100_000
    xs = (100.0 * np.random.default_rng(6).normal(size=(t_len, 2))).astype(np.float32)
    outs = []
    for cls, modes in ((S4DBackbone, ("scan", "convolution")), (S5Backbone, ("convolution",))):
        bb = cls(input_dim=2, hidden_dim=4, num_layers=1, state_dim=4)
        params = jax.tree.map(lambda a: a.astype(jnp.float32),
                              bb.init_params(jax.random.key(7), jnp.float32))
        layers = params.layers
        log_dt = np.where(np.arange(layers.log_dt.size) % 2, 5.0, -12.0).reshape(
            layers.log_dt.shape).astype(np.float32)
        params = params._replace(layers=layers._replace(
            log_dt=jnp.asarray(log_dt), a_log_re=layers.a_log_re + 3.0))

        @jax.jit
        def run(params, xs, bb=bb, modes=modes):  # (recurrent: the step, |ā| < 1)
            return [dataclasses.replace(bb, mode=m).sequence(params, xs) for m in modes]

        outs += run(params, jnp.asarray(xs))
    for out in outs:
        assert out.dtype == jnp.float32 and out.shape == (t_len, 4)
        assert np.all(np.isfinite(np.asarray(out)))


def test_fit_sgd_decreases_the_loss():
    model = _model("S4D", emission="poisson", mode="scan")
    y = np.random.default_rng(8).poisson(np.exp(1.0 + np.sin(np.arange(60) / 4.0)))
    params = model.initialize(y, key=jax.random.key(9))
    fit = ss.fit_sgd(model, params, y, optimizer=optax.adam(0.03), num_steps=20,
                     key=jax.random.key(1), progress=False)
    before = float(ss.log_prob(model, params, y))
    after = float(ss.log_prob(model, fit.params, y))
    assert after > before + 1.0


@pytest.mark.parametrize("name", ["S4D", "S5"])
def test_save_load_round_trip(name, tmp_path):
    model = _model(name, init="lin") if name == "S4D" else _model(name, output="gelu")
    model = dataclasses.replace(model, discretization="bilinear", mode="convolution",
                                dt_min=0.01)
    params = model.initialize(np.zeros(5), key=jax.random.key(3))
    path = ss.save(tmp_path / name, model, params)
    model2, params2 = ss.load(path)
    assert model2 == model
    for a, b in zip(jax.tree.leaves(params2), jax.tree.leaves(params), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sequence_distribution_uses_the_mode():
    """The Bayesian entry points' likelihood (`ss.SequenceDistribution`) in convolution
    mode equals ss.log_prob in recurrent mode."""
    model, params, y = _case("S4D", 17)
    conv = dataclasses.replace(model, mode="convolution")
    v = ss.SequenceDistribution(conv, params, num_timesteps=17).log_prob(jnp.asarray(y))
    ref = ss.log_prob(dataclasses.replace(model, mode="recurrent"), params, y)
    assert abs(float(v) - float(ref)) <= 1e-10 * abs(float(ref))


def test_default_mode_rule():
    assert default_mode(10, "cpu") == default_mode(10**6, "cpu") == "recurrent"
    assert default_mode(10, "gpu") == default_mode(10**5, "gpu") == "convolution"
    bb = S4DBackbone(input_dim=1, hidden_dim=2, state_dim=2)
    assert bb.whole_sequence_mode(50) == default_mode(50)
    assert dataclasses.replace(bb, parallel=True).whole_sequence_mode(50) == "scan"
    assert dataclasses.replace(bb, evaluation="sequential").whole_sequence_mode(50) == \
        "recurrent"


def test_memory_aware_default_rule():
    """`program_bytes` is the documented formula; `default_mode` leaves a pick whose
    estimate exceeds the threshold for the (smaller) convolution, and only then."""
    shape = dict(batch=32, width=64, state_dim=16, num_layers=2)
    sizes = dict(shape, num_steps=10**4)
    cells = 32 * 10**4 * 64 * 2 * 4
    assert s4.program_bytes("recurrent", **sizes) == 5 * 16 * cells
    assert s4.program_bytes("scan", **sizes) == 15 * 16 * cells
    assert s4.program_bytes("convolution", **sizes) == (12 + 1.5 * 16) * cells
    assert s4.program_bytes("recurrent", **sizes, itemsize=8) == 2 * 5 * 16 * cells
    # the benchmark's case (RESULTS.md: recurrence 13.1 GiB, convolution 3.2 GiB)
    assert default_mode(10**4, "cpu", **shape) == "convolution"
    assert default_mode(10**4, "cpu", **dict(shape, batch=1)) == "recurrent"  # 0.4 GiB
    # the threshold itself: just above / at it
    rec = s4.program_bytes("recurrent", **sizes)
    assert default_mode(10**4, "cpu", **shape, max_bytes=rec - 1) == "convolution"
    assert default_mode(10**4, "cpu", **shape, max_bytes=rec) == "recurrent"
    # on a GPU the convolution at every length and batch (measured fastest on an H100)
    assert default_mode(1000, "gpu", **shape) == "convolution"
    assert default_mode(1000, "gpu", **dict(shape, batch=4)) == "convolution"
    # N = 2: the convolution's estimate is not smaller, so the recurrence stays
    assert default_mode(10**4, "cpu", **dict(shape, state_dim=2), max_bytes=1) == "recurrent"
    # without the sizes, the backend/length rule (and S5 does not pass them)
    assert default_mode(10**4, "cpu", max_bytes=1) == "recurrent"
    assert S5Backbone(input_dim=1, hidden_dim=2, state_dim=2).whole_sequence_mode(
        10**4, batch=10**6) == s4.s5_default_mode(10**4)
    bb = S4DBackbone(input_dim=1, hidden_dim=64, state_dim=16, num_layers=2)
    assert bb.whole_sequence_mode(10**4, batch=32) == default_mode(10**4, **shape)
    with pytest.raises(ValueError, match="mode must be one of"):
        s4.program_bytes("fft", **sizes)


def test_memory_aware_default_runs_the_convolution_on_a_batch(monkeypatch):
    """Threshold 1 byte: ``mode=None`` evaluates a batch by the convolution (it really
    runs) and the log-probabilities equal the recurrent mode's (1e-10 relative)."""
    model, params, y = _case("S4D", 17)
    ys = jnp.asarray(np.stack([y, y[::-1]]))
    inputs = jnp.zeros(ys.shape + (0,))
    used = []
    original = s4.causal_convolution
    monkeypatch.setattr(s4, "causal_convolution",
                        lambda *a: used.append(1) or original(*a))
    monkeypatch.setattr(s4, "MAX_PROGRAM_BYTES", 1)
    got = jax.jit(model.complete_data_log_probs_batch)(params, ys, inputs)[0]
    assert used  # the convolution ran
    ref = jax.jit(dataclasses.replace(model, mode="recurrent").complete_data_log_probs_batch)(
        params, ys, inputs)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"mode": "fft"}, ValueError, "mode must"),
    ({"mode": "scan", "parallel": False}, ValueError, "contradicts"),
    ({"mode": "convolution", "parallel": True}, ValueError, "contradicts"),
    ({"mode": "scan", "evaluation": "sequential"}, ValueError, "contradicts"),
    ({"evaluation": "deer"}, ValueError, "evaluation"),
    ({"state_dim": 3}, ValueError, "even"),
    ({"state_dim": 0}, ValueError, "state_dim"),
    ({"discretization": "euler"}, ValueError, "discretization"),
    ({"output": "relu"}, ValueError, "output"),
    ({"dt_min": 0.2, "dt_max": 0.1}, ValueError, "dt_min"),
    ({"hidden_dim": 0}, ValueError, "hidden_dim"),
    ({"parallel": "yes"}, TypeError, "parallel"),
])
@pytest.mark.parametrize("name", ["S4D", "S5"])
def test_invalid_configuration(name, kwargs, error, match):
    with pytest.raises(error, match=match):
        _model(name, **kwargs)


def test_invalid_s4d_init():
    with pytest.raises(ValueError, match="init"):
        ss.S4D(init="random")
