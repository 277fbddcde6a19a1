"""AFT: the simple, local and full variants against the dense T x T weights in NumPy
(including sequences longer than max_len), the recurrent and parallel modes against each
other (log-probabilities and gradients, float64), the running-maximum stabilization at
T = 10^5 with huge logits in float32, missing values, forecasting past max_len, save/load."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import softmax

import statseq as ss
from statseq.inference import aft
from statseq.models.neural.aft import AFT, AFTBackbone, default_mode
from statseq.models.neural.residual import RMS_EPS
from tests.models.neural import _modes

MODES = ("recurrent", "parallel")


def _rms(x, w):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def dense_weights(bb, bias, t_len):
    """The ``T x T`` position biases ``w_{t,t'}`` (``-inf`` above the diagonal): the
    learned ``bias[min(t, T_max - 1), t - t']`` for lags below the window, 0 beyond."""
    w = np.full((t_len, t_len), -np.inf)
    s = bb.window_size
    for t in range(t_len):
        for tp in range(t + 1):
            lag = t - tp
            w[t, tp] = bias[min(t, bias.shape[0] - 1), lag] if lag < s else 0.0
    return w


def numpy_layer(bb, p, vs):
    """One AFT layer from the start: ``sigmoid(Q_t) * softmax_{t'}(K_{t'} + w_{t,t'}) V``
    per channel, with the dense weights, in NumPy."""
    p = jax.tree.map(np.asarray, p)
    q, k, v = vs @ p.w_q, vs @ p.w_k, vs @ p.w_v
    w = dense_weights(bb, p.bias, vs.shape[0])
    weights = softmax(w[:, :, None] + k[None, :, :], axis=1)  # (T, T', d)
    a = np.einsum("tsc,sc->tc", weights, v)
    return (a / (1.0 + np.exp(-q))) @ p.w_o


def numpy_backbone(bb, params, xs):
    params = jax.tree.map(np.asarray, params)
    zs = xs @ params.embed_weight + params.embed_bias
    for ell in range(bb.num_layers):
        layer = jax.tree.map(lambda a, ell=ell: a[ell], params.layers)
        zs = zs + numpy_layer(bb, layer, _rms(zs, params.norm[ell]))
    return _rms(zs, params.final_norm)


def perturbed(params, seed, scale=0.5):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(x + scale * rng.normal(size=x.shape)), params)


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(tree)])


def assert_gradients_close(g, g_ref, rtol):
    """``max |g - g_ref| <= rtol * max |g_ref|`` over the whole gradient."""
    a, b = _flat(g), _flat(g_ref)
    assert np.max(np.abs(b)) > 0
    assert np.max(np.abs(a - b)) <= rtol * np.max(np.abs(b)), np.max(np.abs(a - b))


@pytest.mark.parametrize("variant, window, max_len", [
    ("simple", None, None), ("local", 3, 8), ("full", None, 8)])
def test_every_mode_matches_the_dense_weights(variant, window, max_len):
    """T = 11 > max_len = 8: the rows past max_len reuse the last one (module docstring);
    features in both modes and by generation steps, the final states, the gradients of
    both modes (simple, local) and local continued from its state at step 5."""
    bb = AFTBackbone(input_dim=3, hidden_dim=4, num_layers=2, variant=variant,
                     window=window, max_len=max_len)
    params = perturbed(bb.init_params(jax.random.key(0)), 1)
    xs = np.random.default_rng(2).normal(size=(11, 3))
    ref = numpy_backbone(bb, params, xs)
    assert np.std(ref) > 0.1
    readout = jnp.asarray(np.random.default_rng(3).normal(size=ref.shape))

    @jax.jit
    def run(params, xs):
        init = bb.initial_state(params)
        outs, grads, finals = [], [], []
        for mode in MODES:
            scan = dataclasses.replace(bb, mode=mode).scan
            final, whole = scan(params, init, xs)
            outs.append(whole)
            finals.append(final)
            if variant == "local":  # continued from the state at step 5
                mid, first = scan(params, init, xs[:5])
                end, second = scan(params, mid, xs[5:])
                outs.append(jnp.concatenate([first, second]))
                finals.append(end)
            if variant != "full":  # (the same code as local, with s = max_len)
                grads.append(jax.grad(lambda p, scan=scan: jnp.sum(
                    scan(p, bb.initial_state(p), xs)[1] * readout))(params))
        final, steps = jax.lax.scan(lambda s, x: bb.step(params, s, x), init, xs)
        return jnp.stack(outs + [steps]), grads, finals + [final]

    outs, grads, finals = run(params, jnp.asarray(xs))
    for got in np.asarray(outs):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    for final in finals[:-1]:  # running sums, key/value queue, step count
        for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(finals[-1]), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13)
    if grads:
        assert_gradients_close(grads[1], grads[0], 1e-10)
    if variant == "local":  # bias[r, j] has a gradient exactly when j <= r (used), and
        # r > 0 (at t = 0 the only weight is 1 whatever its bias)
        g_bias = np.asarray(grads[0].layers.bias)  # (layers, T_max, s)
        rows, lags = np.indices(g_bias.shape[1:])
        np.testing.assert_array_equal(g_bias != 0, np.broadcast_to(
            (lags <= rows) & (rows > 0), g_bias.shape))


MODEL = AFT(hidden_dim=4, num_layers=1, variant="local", window=3, max_len=12)


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
    compiles serve the four lengths), and the modes whose forms really ran."""
    rng = np.random.default_rng(1000)
    y = np.sin(np.arange(1000) / 4.0) + 0.5 * rng.normal(size=1000)
    models = {"step": _modes.Steps(MODEL)} | {
        mode: dataclasses.replace(MODEL, mode=mode) for mode in MODES}
    used = []
    with pytest.MonkeyPatch.context() as mp:
        for mode in MODES:
            mp.setitem(aft.MODES, mode, lambda *a, f=aft.MODES[mode], m=mode:
                       used.append(m) or f(*a))
        runs = _modes.mode_runs(models, params, y, LENGTHS)
    return runs, used


@pytest.mark.parametrize("t_len", LENGTHS)
def test_modes_agree_in_log_prob_and_gradient(t_len, mode_runs):
    """float64, random parameters (AFT-local, past max_len for T = 17 and 1000): 1e-10
    relative between the generation step and both modes (measured: equal values,
    gradients within 2e-15 of their largest entry; the `SequenceDistribution` of the
    Bayesian entry points is checked on linear attention, test_linear_attention.py)."""
    runs, used = mode_runs
    assert sorted(set(used)) == sorted(MODES)  # each mode's form really ran
    _modes.assert_modes_agree(runs[t_len], reference="step", rtol=1e-10)


def test_the_shared_mode_check_can_fail(mode_runs):
    """`_modes.assert_modes_agree` fails for a mode giving another value (the run of
    another length), another gradient, or no mode besides the reference."""
    runs, _ = mode_runs
    at17 = runs[17]
    for wrong in ((at17["parallel"][0] * (1 + 1e-8), at17["parallel"][1]),
                  (at17["parallel"][0], runs[2]["parallel"][1]),
                  runs[2]["parallel"]):
        with pytest.raises(AssertionError):
            _modes.assert_modes_agree(at17 | {"wrong": wrong}, reference="step")
    with pytest.raises(AssertionError, match="no mode"):
        _modes.assert_modes_agree({"step": at17["step"]}, reference="step")


def test_running_max_stabilization_at_t_1e5_in_float32():
    """T = 10^5, keys of scale 1000 (exp overflows float32 beyond 88): AFT-simple in
    float32 against the exact float64 running weighted average from
    ``np.logaddexp.accumulate`` (positive values, so the numerator is a log-sum-exp too);
    AFT-local with biases of scale 1000 stays finite."""
    t_len, d = 100_000, 4
    rng = np.random.default_rng(11)
    k = 1000.0 * rng.normal(size=(t_len, d))
    v = rng.uniform(0.5, 2.0, size=(t_len, d))
    ref = np.exp(np.logaddexp.accumulate(k + np.log(v), axis=0)
                 - np.logaddexp.accumulate(k, axis=0))
    k32, v32 = jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32)
    bias = jnp.asarray(1000.0 * rng.normal(size=(16, 4)), jnp.float32)

    @jax.jit
    def run(k, v, bias):
        simple = aft.aft_recurrent(aft.aft_initial_state(d, 0, jnp.float32), k, v, bias, 0)
        local = aft.aft_recurrent(aft.aft_initial_state(d, 4, jnp.float32), k, v, bias, 4)
        return simple[1], local[1]

    simple, local = run(k32, v32, bias)
    assert simple.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(simple), ref, rtol=1e-5)
    local = np.asarray(local)
    assert np.all(np.isfinite(local))
    assert np.all((local >= 0.5 * (1 - 1e-6)) & (local <= 2.0 * (1 + 1e-6)))  # averages


def test_missing_value_step_path_equals_whole_sequence(params):
    """The filter with a missing value runs the generation step one step at a time (past
    max_len = 12 here); both whole-sequence modes on the same network inputs (0 and
    indicator 0 at the gap) give the same log-probabilities."""
    y = np.cos(np.arange(20) / 3.0)
    mask = np.ones(20, bool)
    mask[7] = False
    _modes.assert_missing_steps_match_whole_sequence(MODEL, params, y, mask, MODES)


def test_forecast_past_max_len_and_save_load(tmp_path, params):
    """(fit_sgd runs on AFT in the contract test and on linear attention in
    test_linear_attention.py: the same generic program.)"""
    y = np.sin(np.arange(20) / 4.0)
    # generation past max_len = 12 (the last row of biases is reused)
    fc = ss.forecast(MODEL, params, y, num_steps=3, num_samples=20, key=jax.random.key(11))
    assert np.asarray(fc.samples).shape[-1] == 3
    assert np.all(np.isfinite(np.asarray(fc.samples)))
    path = ss.save(tmp_path / "aft", MODEL, params)
    model2, params2 = ss.load(path)
    assert model2 == MODEL
    assert float(ss.log_prob(model2, params2, y)) == float(ss.log_prob(MODEL, params, y))


def test_default_mode():
    assert default_mode(100, "cpu") == "recurrent"
    assert default_mode(100, "gpu") == "parallel" and default_mode(10**5, "gpu") == "recurrent"
    bb = MODEL.backbone
    assert dataclasses.replace(bb, parallel=True).resolved_mode(10) == "parallel"
    assert dataclasses.replace(bb, evaluation="sequential").resolved_mode(10) == "recurrent"


@pytest.mark.parametrize("kwargs, match", [
    ({"hidden_dim": 0}, "hidden_dim"),
    ({"variant": "conv"}, "variant"),
    ({"variant": "simple", "window": 3}, "window"),
    ({"variant": "local", "max_len": 8}, "window"),
    ({"variant": "local", "window": 3}, "max_len"),
    ({"variant": "local", "window": 9, "max_len": 8}, "window"),
    ({"variant": "local", "window": 0, "max_len": 8}, "window"),
    ({"variant": "full"}, "max_len"),
    ({"variant": "full", "max_len": 8, "window": 2}, "window"),
    ({"variant": "full", "max_len": 0}, "max_len"),
    ({"mode": "chunked"}, "mode"),
])
def test_invalid_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AFT(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"mode": "parallel", "evaluation": "sequential"},
    {"mode": "recurrent", "parallel": True},
    {"mode": "parallel", "parallel": False},
    {"evaluation": "deer"},
])
def test_contradictory_evaluation_is_refused(kwargs):
    with pytest.raises(ValueError, match="contradicts|mode="):
        AFTBackbone(input_dim=2, hidden_dim=4, **kwargs)
