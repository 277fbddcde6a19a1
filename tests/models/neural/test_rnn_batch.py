"""The batch-level fast path of the recurrent models (`complete_data_log_probs_batch`, one
time-major scan over the whole batch) and the LSTM's chunked hand-written backward pass:
log-densities equal the step-by-step filter and gradients equal automatic
differentiation of the plain step-by-step recurrence, in float64.

Lengths are chosen around the backward pass's chunk size (32 steps): one step, a
partial first chunk plus a full chunk (37), and an exact multiple (64).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.core.recurrence import _filter_flat, run_filter
from statseq.models.neural import cells

MODELS = {
    "lstm": lambda: ss.LSTM(hidden_dim=3, num_layers=2, emission_dim=2, input_dim=1),
    "gru": lambda: ss.GRU(hidden_dim=3, emission_dim=2, input_dim=1),
    "elman": lambda: ss.ElmanRNN(hidden_dim=3, emission_dim=2, input_dim=1),
}


def _data(num_t, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(3, num_t, 2))
    u = rng.normal(size=(3, num_t, 1))
    return jnp.asarray(y), jnp.asarray(u), jnp.ones(y.shape, bool)


@pytest.mark.parametrize("cell", sorted(MODELS))
def test_batch_path_equals_step_by_step_filter_and_autodiff(cell, num_t=37):
    """``complete=True`` takes the batch path, ``complete=False`` the per-step scan of
    ``model.step`` (differentiated by JAX): same log-densities, final carries and
    gradients."""
    model = MODELS[cell]()
    y, u, mask = _data(num_t)
    params = model.initialize(y, inputs=u, key=jax.random.key(1))
    _, lp_fast, _, final_fast = run_filter(model, params, y, mask, u, complete=True)
    _, lp_slow, _, final_slow = run_filter(model, params, y, mask, u, complete=False)
    np.testing.assert_allclose(np.asarray(lp_fast), np.asarray(lp_slow), rtol=1e-12,
                               atol=1e-13)
    for a, b in zip(jax.tree.leaves(final_fast), jax.tree.leaves(final_slow), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13)

    weights = jnp.linspace(0.5, 1.5, y.shape[0])[:, None] * jnp.linspace(1.0, 2.0, num_t)

    def loss(p, complete):
        lps = run_filter(model, p, y, mask, u, complete=complete)[1]
        return jnp.sum(weights * lps)

    g_fast = jax.grad(loss)(params, True)
    g_slow = jax.grad(loss)(params, False)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_slow), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_filter_uses_the_batch_path(monkeypatch):
    """With complete data and no carries requested, the engine calls the model's
    ``complete_data_log_probs_batch`` once on the whole batch (not a vmapped
    per-sequence version)."""
    model = ss.LSTM(hidden_dim=5)  # a configuration no other test compiles
    y = jnp.asarray(np.random.default_rng(2).normal(size=(4, 6)))
    params = model.initialize(y, key=jax.random.key(0))
    shapes = []
    original = type(model).complete_data_log_probs_batch

    def spy(self, params, y, inputs):
        shapes.append(y.shape)
        return original(self, params, y, inputs)

    monkeypatch.setattr(type(model), "complete_data_log_probs_batch", spy)
    _filter_flat.clear_cache()
    ss.log_prob(model, params, y)
    assert shapes == [(4, 6)]


def _lstm_reference(w_in, bias, w_rec, xs, h0, c0):
    """The LSTM recurrence as a plain ``lax.scan`` of the cell (differentiated by JAX)."""

    def body(carry, x):
        h, c, _ = cells._lstm_cell(x @ w_in.T + bias + carry[0] @ w_rec.T, carry[1])
        return (h, c), h

    (_, c_last), hs = jax.lax.scan(body, (h0, c0), xs)
    return hs, c_last


@pytest.mark.parametrize("num_t,batch", [(1, None), (37, 2), (64, None)])
def test_lstm_layer_vjp_equals_autodiff(num_t, batch):
    """`lstm_layer` (one sequence or a time-major batch) against autodiff of the plain
    scan: outputs, and cotangents of every input for random cotangents of ``hs`` and
    ``c_T``."""
    hid, num_in = 4, 3
    k = jax.random.split(jax.random.key(num_t), 8)
    bs = () if batch is None else (batch,)
    args = (
        jax.random.normal(k[0], (4 * hid, num_in)),
        jax.random.normal(k[1], (4 * hid,)),
        0.5 * jax.random.normal(k[2], (4 * hid, hid)),
        jax.random.normal(k[3], (num_t,) + bs + (num_in,)),
        jax.random.normal(k[4], bs + (hid,)),
        jax.random.normal(k[5], bs + (hid,)),
    )
    cotangent = (jax.random.normal(k[6], (num_t,) + bs + (hid,)),
                 jax.random.normal(k[7], bs + (hid,)))
    out, vjp = jax.vjp(cells.lstm_layer, *args)
    ref_out, ref_vjp = jax.vjp(_lstm_reference, *args)
    for a, b in zip(out, ref_out, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13)
    for a, b in zip(vjp(cotangent), ref_vjp(cotangent), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
