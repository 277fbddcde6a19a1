"""The GRU layer's hand-written backward pass (`gru_layer`) and the cell against flax's
``GRUCell`` with identical weights (float64)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from statseq.models.neural.cells import RNNBackbone, RNNLayerParams, _recur, gru_layer

I, H, T, N = 3, 4, 11, 2


def _stepwise(w_in, bias, w_rec, bias_rec, xs, h0):
    """Automatic differentiation's reference: the cell under ``lax.scan``."""
    p = RNNLayerParams(w_in, w_rec, bias, bias_rec)
    return jax.lax.scan(lambda h, x: _recur("gru", p, h, x @ w_in.T + bias), h0, xs)[1]


# 70 steps: a partial chunk of the backward pass and two full ones
@pytest.mark.parametrize(("batch", "t_len"), [((), T), ((N,), 70)])
def test_gru_layer_values_and_gradients_equal_autodiff(batch, t_len):
    """Values and the gradients with respect to ``W_x``, ``b``, ``W_h``, ``b_hn``, the
    inputs and ``h0`` (of a nonlinear loss of all ``h_t``) equal automatic
    differentiation of the step-by-step cell to 1e-12, for one sequence and a time-major
    batch, with fewer steps than one chunk of the backward pass and with several."""
    rng = np.random.default_rng(1)
    args = (jnp.asarray(rng.normal(size=(3 * H, I))), jnp.asarray(rng.normal(size=3 * H)),
            jnp.asarray(rng.normal(size=(3 * H, H)) * 0.7), jnp.asarray(rng.normal(size=H)),
            jnp.asarray(rng.normal(size=(t_len, *batch, I))),
            jnp.asarray(rng.normal(size=(*batch, H))))
    weights = jnp.asarray(rng.normal(size=(t_len, *batch, H)))
    np.testing.assert_allclose(np.asarray(gru_layer(*args)), np.asarray(_stepwise(*args)),
                               rtol=1e-13, atol=1e-13)

    def loss(fn):
        def f(*a):
            hs = fn(*a)
            return jnp.sum(jnp.sin(hs) * weights) + jnp.sum(hs[-1] ** 2)
        return f

    g = jax.jit(jax.grad(loss(gru_layer), argnums=tuple(range(6))))(*args)
    g_ref = jax.jit(jax.grad(loss(_stepwise), argnums=tuple(range(6))))(*args)
    for a, r in zip(g, g_ref, strict=True):
        assert a.shape == r.shape
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-12, atol=1e-12)


def test_gru_backbone_gradients_equal_stepwise_autodiff():
    """Two stacked GRU layers: gradients of the whole-sequence path (input projections
    hoisted, `gru_layer`) with respect to all weights and the inputs equal automatic
    differentiation of the step-by-step recurrence (`RNNBackbone.step`)."""
    backbone = RNNBackbone("gru", I, H, num_layers=2)
    params = backbone.init_params(jax.random.key(5))
    xs = jnp.asarray(np.random.default_rng(2).normal(size=(T, I)))
    weights = jnp.asarray(np.random.default_rng(3).normal(size=(T, H)))

    def objective(run):
        def f(p, xs):
            final, hs = run(p, xs)
            return jnp.sum(jnp.tanh(hs) * weights) + jnp.sum(final[0] ** 2)
        return f

    def stepwise(p, xs):
        return jax.lax.scan(lambda s, x: backbone.step(p, s, x), backbone.initial_state(p), xs)

    whole = lambda p, xs: backbone.scan(p, backbone.initial_state(p), xs)  # noqa: E731
    g = jax.grad(objective(whole), argnums=(0, 1))(params, xs)
    g_ref = jax.grad(objective(stepwise), argnums=(0, 1))(params, xs)
    for a, r in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-12, atol=1e-12)


def test_gru_equals_flax_gru_cell():
    """flax's ``GRUCell`` (``r = σ(ir(x) + hr(h))``, ``z = σ(iz(x) + hz(h))``, ``n =
    tanh(in(x) + r * hn(h))``, ``h' = (1 - z) n + z h``, biases on ``ir, iz, in, hn``) is
    statseq's cell: with its random weights copied into statseq's fused layout, the hidden
    states of a sequence (whole-sequence path) agree to 1e-12 in float64. flax is a
    benchmark peer (the ``bench`` extra): skipped when it is not installed."""
    nn = pytest.importorskip("flax.linen")
    cell = nn.RNN(nn.GRUCell(H, param_dtype=jnp.float64, dtype=jnp.float64))
    xs = jnp.asarray(np.random.default_rng(4).normal(size=(N, T, I)))
    variables = cell.init(jax.random.key(7), xs)
    ref = cell.apply(variables, xs)  # (N, T, H), zero initial state
    p = variables["params"]["cell"]
    params = (RNNLayerParams(
        w_in=jnp.concatenate([p[f"i{g}"]["kernel"].T for g in "rzn"]),
        w_rec=jnp.concatenate([p[f"h{g}"]["kernel"].T for g in "rzn"]),
        bias=jnp.concatenate([p[f"i{g}"]["bias"] for g in "rzn"]),
        bias_rec=p["hn"]["bias"]),)
    backbone = RNNBackbone("gru", I, H)
    state = (jnp.zeros((N, H)),)
    _, hs = backbone.scan_time_major(params, state, jnp.swapaxes(xs, 0, 1))
    np.testing.assert_allclose(np.asarray(jnp.swapaxes(hs, 0, 1)), np.asarray(ref),
                               rtol=1e-12, atol=1e-12)
