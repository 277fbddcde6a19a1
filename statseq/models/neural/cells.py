"""Recurrent cells (Elman, GRU, LSTM) and stacked layers of them, as backbones.

With input ``x_t`` (size ``I``), hidden state ``h_t`` (size ``H``) and ``sigma`` the
logistic function, the cells are (gate layouts as in PyTorch and equinox):

* Elman: ``h_t = tanh(W_x x_t + W_h h_{t-1} + b)``;
* GRU: ``r = sigma(W_xr x + b_r + W_hr h)``, ``z = sigma(W_xz x + b_z + W_hz h)``,
  ``n = tanh(W_xn x + b_n + r * (W_hn h + b_hn))``, ``h_t = n + z * (h_{t-1} - n)``;
* LSTM: ``[i, f, g, o] = W_x x + W_h h + b``,
  ``c_t = sigma(f) c_{t-1} + sigma(i) tanh(g)``, ``h_t = sigma(o) tanh(c_t)``.

Weights of all gates are fused into one matrix per layer (``w_in`` is ``(G H, I)``,
``w_rec`` ``(G H, H)`` for ``G`` gates). `RNNBackbone` stacks ``num_layers`` cells (layer
``l`` reads layer ``l-1``'s ``h_t``; the features are the last layer's ``h_t``). For a whole
sequence, Elman and GRU layers compute the input projection ``W_x x_t + b`` for every ``t``
in one matrix product before the scan, which then carries only the recurrent product; the
LSTM layer runs `lstm_layer`, whose backward pass is written by hand (weight gradients as
one matrix product over all steps after a reverse scan).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints

from statseq.core.validation import check_positive_int, float_dtype
from statseq.models.neural.base import Backbone

CELLS = ("elman", "gru", "lstm")
_GATES = {"elman": 1, "gru": 3, "lstm": 4}


class RNNLayerParams(NamedTuple):
    """One layer's weights (``G`` gates: 1 Elman, 3 GRU ``[r, z, n]``, 4 LSTM
    ``[i, f, g, o]``).

    Attributes:
        w_in: ``(G H, I)`` input weights.
        w_rec: ``(G H, H)`` recurrent weights.
        bias: ``(G H,)`` bias of the input projection.
        bias_rec: ``(H,)`` for the GRU (``b_hn``, inside the reset gate), ``(0,)`` else.
    """

    w_in: jax.Array
    w_rec: jax.Array
    bias: jax.Array
    bias_rec: jax.Array


def _recur(cell, p, state, gi):
    """One cell step from the precomputed input projection ``gi = W_x x + b``."""
    if cell == "elman":
        h = jnp.tanh(gi + p.w_rec @ state)
        return h, h
    if cell == "gru":
        hid = state.shape[-1]
        gh = p.w_rec @ state
        r = jax.nn.sigmoid(gi[:hid] + gh[:hid])
        z = jax.nn.sigmoid(gi[hid:2 * hid] + gh[hid:2 * hid])
        n = jnp.tanh(gi[2 * hid:] + r * (gh[2 * hid:] + p.bias_rec))
        h = n + z * (state - n)
        return h, h
    h_prev, c_prev = state
    hid = h_prev.shape[-1]
    g = gi + p.w_rec @ h_prev
    i = jax.nn.sigmoid(g[:hid])
    f = jax.nn.sigmoid(g[hid:2 * hid])
    c = f * c_prev + i * jnp.tanh(g[2 * hid:3 * hid])
    h = jax.nn.sigmoid(g[3 * hid:]) * jnp.tanh(c)
    return (h, c), h


def _lstm_forward(w_in, bias, w_rec, xs, h0, c0):
    """LSTM recurrence over inputs ``xs`` ``(T, I)``; returns ``(hs, cs, gates)`` with the
    activated gates ``[i, f, g, o]`` of every step."""
    hid = h0.shape[-1]

    def body(carry, x):
        h, c = carry
        a = w_in @ x + bias + w_rec @ h
        ifo = jax.nn.sigmoid(jnp.concatenate([a[:2 * hid], a[3 * hid:]]))
        i, f, o = ifo[:hid], ifo[hid:2 * hid], ifo[2 * hid:]
        g = jnp.tanh(a[2 * hid:3 * hid])
        c = f * c + i * g
        h = o * jnp.tanh(c)
        return (h, c), (h, c, jnp.concatenate([i, f, g, o]))

    _, (hs, cs, gates) = jax.lax.scan(body, (h0, c0), xs)
    return hs, cs, gates


@jax.custom_vjp
def lstm_layer(w_in, bias, w_rec, xs, h0, c0):
    """Hidden and cell states ``(hs, cs)`` ``(T, H)`` of an LSTM layer over inputs ``xs``
    ``(T, I)`` from the initial ``(h0, c0)``.

    Differentiated by a hand-written backward pass (backpropagation through time): a
    reverse scan carries ``(dh, dc)`` and emits the gate pre-activation gradients ``da_t``;
    the weight gradients are then single matrix products over all steps
    (``sum_t da_t h_{t-1}^T``, ``sum_t da_t x_t^T``), where automatic differentiation of
    the scan would accumulate an outer product at every step.
    """
    hs, cs, _ = _lstm_forward(w_in, bias, w_rec, xs, h0, c0)
    return hs, cs


def _lstm_fwd(w_in, bias, w_rec, xs, h0, c0):
    hs, cs, gates = _lstm_forward(w_in, bias, w_rec, xs, h0, c0)
    return (hs, cs), (w_in, w_rec, xs, h0, c0, hs, cs, gates)


def _lstm_bwd(res, cotangents):
    w_in, w_rec, xs, h0, c0, hs, cs, gates = res
    dhs, dcs = cotangents
    hid = h0.shape[-1]
    c_prev = jnp.concatenate([c0[None], cs[:-1]], axis=0)
    tanh_c = jnp.tanh(cs)

    def body(carry, step):
        dh, dc = carry
        dh_out, dc_out, gate, tc, cp = step
        i, f, g, o = gate[:hid], gate[hid:2 * hid], gate[2 * hid:3 * hid], gate[3 * hid:]
        dh = dh + dh_out
        dc = dc + dc_out + dh * o * (1.0 - tc**2)
        da = jnp.concatenate([
            dc * g * i * (1.0 - i),
            dc * cp * f * (1.0 - f),
            dc * i * (1.0 - g**2),
            dh * tc * o * (1.0 - o),
        ])
        return (da @ w_rec, dc * f), da

    zero = jnp.zeros_like(h0)
    (dh0, dc0), das = jax.lax.scan(
        body, (zero, zero), (dhs, dcs, gates, tanh_c, c_prev), reverse=True
    )
    h_prev = jnp.concatenate([h0[None], hs[:-1]], axis=0)
    return das.T @ xs, das.sum(0), das.T @ h_prev, das @ w_in, dh0, dc0


lstm_layer.defvjp(_lstm_fwd, _lstm_bwd)


@dataclasses.dataclass(frozen=True)
class RNNBackbone(Backbone):
    """A stack of ``num_layers`` recurrent cells of one kind.

    The state is a tuple with one entry per layer: ``h`` ``(H,)`` for Elman and GRU,
    ``(h, c)`` for the LSTM. Parameters are a tuple of `RNNLayerParams`.

    Args:
        cell: ``"elman"``, ``"gru"`` or ``"lstm"``.
        input_dim: size ``I`` of ``x_t``.
        hidden_dim: size ``H`` of each layer's ``h_t`` (and of the features).
        num_layers: number of stacked layers.

    Examples:
        >>> import jax
        >>> rnn = RNNBackbone("gru", input_dim=2, hidden_dim=4)
        >>> params = rnn.init_params(jax.random.key(0))
        >>> rnn.sequence(params, jax.numpy.ones((5, 2))).shape
        (5, 4)
    """

    cell: str
    input_dim: int
    hidden_dim: int
    num_layers: int = 1

    def __post_init__(self):
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {self.cell!r}")
        check_positive_int(self.input_dim, "input_dim")
        check_positive_int(self.hidden_dim, "hidden_dim")
        check_positive_int(self.num_layers, "num_layers")

    @property
    def output_dim(self) -> int:
        return self.hidden_dim

    def _layer_inputs(self, layer: int) -> int:
        return self.input_dim if layer == 0 else self.hidden_dim

    def param_shapes(self):
        g, h = _GATES[self.cell], self.hidden_dim
        rec_bias = (h,) if self.cell == "gru" else (0,)
        return tuple(
            RNNLayerParams((g * h, self._layer_inputs(layer)), (g * h, h), (g * h,), rec_bias)
            for layer in range(self.num_layers)
        )

    def param_constraints(self):
        real = constraints.real
        return tuple(RNNLayerParams(real, real, real, real) for _ in range(self.num_layers))

    def init_params(self, key):
        """Uniform ``(-1/sqrt(H), 1/sqrt(H))`` weights and biases (as PyTorch); the LSTM's
        forget-gate bias starts at 1 (remember by default)."""
        dtype, h = float_dtype(), self.hidden_dim
        bound = 1.0 / np.sqrt(h)
        layers = []
        for layer, shapes in enumerate(self.param_shapes()):
            keys = jax.random.split(jax.random.fold_in(key, layer), 4)
            leaves = [
                jax.random.uniform(k, s, dtype, -bound, bound)
                for k, s in zip(keys, shapes, strict=True)
            ]
            p = RNNLayerParams(*leaves)
            if self.cell == "lstm":
                p = p._replace(bias=p.bias.at[h:2 * h].add(1.0))
            layers.append(p)
        return tuple(layers)

    def initial_state(self, params):
        dtype = params[0].w_rec.dtype
        zero = jnp.zeros((self.hidden_dim,), dtype)
        one = (zero, zero) if self.cell == "lstm" else zero
        return tuple(one for _ in range(self.num_layers))

    def step(self, params, state, x_t):
        new_state, h = [], x_t
        for p, s in zip(params, state, strict=True):
            s, h = _recur(self.cell, p, s, p.w_in @ h + p.bias)
            new_state.append(s)
        return tuple(new_state), h

    def scan(self, params, state, xs):
        """Layer by layer: one matrix product for the input projection of every step,
        then a scan of the recurrent part."""
        finals, hs = [], xs
        for p, s in zip(params, state, strict=True):
            if self.cell == "lstm":
                hs, cs = lstm_layer(p.w_in, p.bias, p.w_rec, hs, *s)
                s = (hs[-1], cs[-1])
            else:
                gis = hs @ p.w_in.T + p.bias
                s, hs = jax.lax.scan(
                    lambda carry, gi, p=p: _recur(self.cell, p, carry, gi), s, gis
                )
            finals.append(s)
        return tuple(finals), hs
