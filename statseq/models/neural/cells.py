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
sequence, Elman layers compute the input projection ``W_x x_t + b`` for every ``t`` in one
matrix product before the scan, which then carries only the recurrent product; the GRU
and LSTM layers run `gru_layer` and `lstm_layer`, whose backward passes are written by
hand (weight gradients as large matrix products over chunks of steps). Every layer also
runs a time-major batch ``(T, N, I)`` with states ``(N, H)`` in one scan
(`RNNBackbone.scan_time_major`, the models' batch-level fast path).
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
from statseq.models.neural.evaluation import (
    check_evaluation,
    evaluate_layer,
    resolve_evaluation,
)

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
    """One cell step from the precomputed input projection ``gi = W_x x + b``.

    States may carry leading batch dimensions (``(H,)`` or ``(N, H)``): the recurrent
    product is ``state @ W_h^T`` and gates are sliced on the last axis.
    """
    if cell == "elman":
        h = jnp.tanh(gi + state @ p.w_rec.T)
        return h, h
    if cell == "gru":
        hid = state.shape[-1]
        gh = state @ p.w_rec.T
        r = jax.nn.sigmoid(gi[..., :hid] + gh[..., :hid])
        z = jax.nn.sigmoid(gi[..., hid:2 * hid] + gh[..., hid:2 * hid])
        n = jnp.tanh(gi[..., 2 * hid:] + r * (gh[..., 2 * hid:] + p.bias_rec))
        h = n + z * (state - n)
        return h, h
    h_prev, c_prev = state
    h, c, _ = _lstm_cell(gi + h_prev @ p.w_rec.T, c_prev)
    return (h, c), h


def _lstm_cell(a, c_prev):
    """LSTM update from the gate pre-activations ``a`` ``(..., 4H)`` ``[i, f, g, o]``:
    ``(h, c, (i, f, g, o, tanh(c)))``."""
    hid = c_prev.shape[-1]
    ifo = jax.nn.sigmoid(jnp.concatenate([a[..., :2 * hid], a[..., 3 * hid:]], axis=-1))
    i, f, o = ifo[..., :hid], ifo[..., hid:2 * hid], ifo[..., 2 * hid:]
    g = jnp.tanh(a[..., 2 * hid:3 * hid])
    c = f * c_prev + i * g
    tc = jnp.tanh(c)
    return o * tc, c, (i, f, g, o, tc)


def _lstm_forward(w_in, bias, w_rec, xs, h0, c0, residuals: bool):
    """LSTM recurrence over ``xs`` ``(T, N, I)`` from ``h0``, ``c0`` ``(N, H)``: ``(hs,
    c_T, rs)``, with (if ``residuals``) per step ``r_t = [D_t, f_t, e_t]`` ``(N, 6H)``:
    ``D = [g i(1-i), c_{t-1} f(1-f), i(1-g^2), tanh(c_t) o(1-o)]`` (the derivatives of
    the gate pre-activations, up to the factors ``dc_t`` and ``dh_t``), the forget gate,
    and ``e = o (1 - tanh(c_t)^2)`` (``d c_t / d h_t``)."""

    def body(carry, x):
        h, c_prev = carry
        h, c, (i, f, g, o, tc) = _lstm_cell(x @ w_in.T + bias + h @ w_rec.T, c_prev)
        if not residuals:
            return (h, c), (h, None)
        r = jnp.concatenate([g * i * (1.0 - i), c_prev * f * (1.0 - f), i * (1.0 - g * g),
                             tc * o * (1.0 - o), f, o * (1.0 - tc * tc)], axis=-1)
        return (h, c), (h, r)

    (_, c_last), (hs, rs) = jax.lax.scan(body, (h0, c0), xs)
    return hs, c_last, rs


def lstm_layer(w_in, bias, w_rec, xs, h0, c0):
    """Hidden states ``hs`` ``(T, ..., H)`` and the last cell state ``c_T`` of an LSTM
    layer over inputs ``xs`` ``(T, ..., I)`` from ``(h0, c0)`` ``(..., H)``: one sequence
    (``xs`` ``(T, I)``) or a time-major batch (``(T, N, I)``, states ``(N, H)``).

    Differentiated by a hand-written backward pass (backpropagation through time,
    `_lstm_bwd`): the forward pass stores per step the gate derivatives, the reverse pass
    needs one elementwise product and one ``(N, 4H) @ (4H, H)`` product per step, and the
    weight gradients are large matrix products over chunks of steps, where automatic
    differentiation of the scan would form an outer product at every step.

    Returns:
        ``(hs, c_T)``.
    """
    if xs.ndim == 2:  # one sequence: a batch of one
        hs, c_last = _lstm_layer(w_in, bias, w_rec, xs[:, None], h0[None], c0[None])
        return hs[:, 0], c_last[0]
    return _lstm_layer(w_in, bias, w_rec, xs, h0, c0)


@jax.custom_vjp
def _lstm_layer(w_in, bias, w_rec, xs, h0, c0):
    hs, c_last, _ = _lstm_forward(w_in, bias, w_rec, xs, h0, c0, residuals=False)
    return hs, c_last


def _lstm_fwd(w_in, bias, w_rec, xs, h0, c0):
    hs, c_last, rs = _lstm_forward(w_in, bias, w_rec, xs, h0, c0, residuals=True)
    return (hs, c_last), (w_in, w_rec, xs, h0, hs, rs)


_CHUNK = 32


def _lstm_bwd(res, cotangents):
    """Backpropagation through time, last chunk of ``_CHUNK`` steps first.

    Per step (reverse): ``dh_t += dL/dh_t``, ``dc_t += dh_t e_t``,
    ``da_t = [dc_t, dc_t, dc_t, dh_t] * D_t``, then ``dh_{t-1} = da_t W_h``,
    ``dc_{t-1} = dc_t f_t``. The ``da_t`` of a chunk are written feature-major into a
    ``(4H, K, N)`` buffer, so that the chunk's weight gradient is one plain matrix product
    ``(4H, K N) @ (K N, H + I)`` with the rows ``[h_{t-1}, x_t]``. Chunks keep temporaries
    small (no full-length gradient arrays, whose fresh memory costs page faults on every
    call) while the weight products stay large.
    """
    w_in, w_rec, xs, h0, hs, rs = res
    dhs, dc_last = cotangents
    num_t, num_b, num_in = xs.shape
    hid = h0.shape[-1]
    gates = 4 * hid

    def chunk(state, start, length):
        """Steps ``start .. start + length - 1`` (``length`` static)."""
        dh, dc, dw, db, buf = state

        def body(j, carry):
            dh, dc, buf = carry
            k = length - 1 - j
            r, dh = rs[start + k], dh + dhs[start + k]
            dc = dc + dh * r[:, 5 * hid:]
            da = jnp.concatenate([dc, dc, dc, dh], axis=-1) * r[:, :gates]
            buf = jax.lax.dynamic_update_slice(buf, da.T[:, None, :], (0, k, 0))
            return da @ w_rec, dc * r[:, gates:5 * hid], buf

        dh, dc, buf = jax.lax.fori_loop(0, length, body, (dh, dc, buf))
        if isinstance(start, int) and start == 0:
            h_prev = jnp.concatenate([h0[None], hs[:length - 1]], axis=0)
        else:
            h_prev = jax.lax.dynamic_slice_in_dim(hs, start - 1, length)
        x = jax.lax.dynamic_slice_in_dim(xs, start, length)
        rows = jnp.concatenate([h_prev, x], axis=-1).reshape(length * num_b, hid + num_in)
        dw = dw + buf.reshape(gates, length * num_b) @ rows
        dx = jnp.einsum("gkn,gi->kni", buf, w_in)
        return (dh, dc, dw, db + buf.sum((1, 2)), buf), dx

    first = num_t % _CHUNK or min(num_t, _CHUNK)  # steps 0 .. first - 1, a static chunk
    num_chunks = (num_t - first) // _CHUNK
    dtype = w_rec.dtype
    state = (jnp.zeros_like(h0), dc_last, jnp.zeros((gates, hid + num_in), dtype),
             jnp.zeros((gates,), dtype), jnp.zeros((gates, _CHUNK, num_b), dtype))
    dxs = []
    if num_chunks:
        state, dx = jax.lax.scan(lambda s, c: chunk(s, first + c * _CHUNK, _CHUNK), state,
                                 jnp.arange(num_chunks), reverse=True)
        dxs.append(dx.reshape((num_chunks * _CHUNK,) + dx.shape[2:]))
    state = state[:4] + (jnp.zeros((gates, first, num_b), dtype),)
    (dh0, dc0, dw, db, _), dx = chunk(state, 0, first)
    dxs = jnp.concatenate([dx] + dxs, axis=0) if dxs else dx
    return dw[:, hid:], db, dw[:, :hid], dxs, dh0, dc0


_lstm_layer.defvjp(_lstm_fwd, _lstm_bwd)


def _gru_forward(w_in, bias, w_rec, bias_rec, xs, h0, residuals: bool):
    """GRU recurrence over ``xs`` ``(T, N, I)`` from ``h0`` ``(N, H)``: ``(hs, rs)``,
    with (if ``residuals``) per step ``r_t = [P, Q, S, r, z]`` ``(N, 5H)``: ``P = (1 -
    z)(1 - n^2)``, ``Q = (h_{t-1} - n) z (1 - z)``, ``S = (W_hn h_{t-1} + b_hn) r (1 -
    r)`` (the derivatives of the pre-activations of ``n``, ``z`` and ``r``, up to the
    factors ``dh_t`` and ``dh_t P``) and the gates ``r``, ``z``."""
    hid = h0.shape[-1]

    def body(h, x):
        gi = x @ w_in.T + bias
        gh = h @ w_rec.T
        rz = jax.nn.sigmoid(gi[..., :2 * hid] + gh[..., :2 * hid])
        r, z = rz[..., :hid], rz[..., hid:]
        hn = gh[..., 2 * hid:] + bias_rec
        n = jnp.tanh(gi[..., 2 * hid:] + r * hn)
        h_new = n + z * (h - n)
        if not residuals:
            return h_new, (h_new, None)
        res = jnp.concatenate([(1.0 - z) * (1.0 - n * n), (h - n) * z * (1.0 - z),
                               hn * r * (1.0 - r), r, z], axis=-1)
        return h_new, (h_new, res)

    _, (hs, rs) = jax.lax.scan(body, h0, xs)
    return hs, rs


def gru_layer(w_in, bias, w_rec, bias_rec, xs, h0):
    """Hidden states ``hs`` ``(T, ..., H)`` of a GRU layer over inputs ``xs`` ``(T, ...,
    I)`` from ``h0`` ``(..., H)``: one sequence (``xs`` ``(T, I)``) or a time-major batch
    (``(T, N, I)``, ``h0`` ``(N, H)``).

    Differentiated by a hand-written backward pass (backpropagation through time,
    `_gru_bwd`), as `lstm_layer`: the forward pass stores per step the five ``(N, H)``
    factors the reverse pass needs, the reverse pass is elementwise products and one
    ``(N, 3H) @ (3H, H)`` product per step, and the weight gradients are large matrix
    products over chunks of steps, where automatic differentiation of the scan would form
    an outer product at every step (about 1.5 times faster for a batch of 32, ``H = 128``).

    Returns:
        ``hs`` ``(T, ..., H)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> w_in, bias = jnp.ones((6, 1)), jnp.zeros(6)  # I = 1, H = 2
        >>> w_rec, bias_rec = jnp.zeros((6, 2)), jnp.zeros(2)
        >>> gru_layer(w_in, bias, w_rec, bias_rec, jnp.ones((5, 1)), jnp.zeros(2)).shape
        (5, 2)
    """
    if xs.ndim == 2:  # one sequence: a batch of one
        return _gru_layer(w_in, bias, w_rec, bias_rec, xs[:, None], h0[None])[:, 0]
    return _gru_layer(w_in, bias, w_rec, bias_rec, xs, h0)


@jax.custom_vjp
def _gru_layer(w_in, bias, w_rec, bias_rec, xs, h0):
    return _gru_forward(w_in, bias, w_rec, bias_rec, xs, h0, residuals=False)[0]


def _gru_fwd(w_in, bias, w_rec, bias_rec, xs, h0):
    hs, rs = _gru_forward(w_in, bias, w_rec, bias_rec, xs, h0, residuals=True)
    return hs, (w_in, w_rec, xs, h0, hs, rs)


def _gru_bwd(res, dhs):
    """Backpropagation through time, last chunk of ``_CHUNK`` steps first. Per step
    (reverse): ``dh_t += dL/dh_t``, ``da_n = dh_t P``, ``da_z = dh_t Q``, ``da_r = da_n
    S``, ``dgh = [da_r, da_z, da_n r]`` (the cotangent of ``W_h h_{t-1}``), ``dh_{t-1} =
    dh_t z + dgh W_h``; the cotangent of ``W_x x_t + b`` is ``dgi = [da_r, da_z, da_n]``.
    ``[dgh, da_n]`` of a chunk are written feature-major into a ``(4H, K, N)`` buffer, so
    that the chunk's weight gradients are plain matrix products ``(3H, K N) @ (K N, H)``
    (with the rows ``h_{t-1}``) and ``(3H, K N) @ (K N, I)`` (rows ``x_t``)."""
    w_in, w_rec, xs, h0, hs, rs = res
    num_t, num_b, num_in = xs.shape
    hid = h0.shape[-1]

    def chunk(state, start, length):
        dh, dw_in, dw_rec, db, dbr, buf = state

        def body(j, carry):
            dh, buf = carry
            k = length - 1 - j
            r, dh = rs[start + k], dh + dhs[start + k]
            da_n = dh * r[:, :hid]
            da_z = dh * r[:, hid:2 * hid]
            da_r = da_n * r[:, 2 * hid:3 * hid]
            dgh = jnp.concatenate([da_r, da_z, da_n * r[:, 3 * hid:4 * hid]], axis=-1)
            da = jnp.concatenate([dgh, da_n], axis=-1)  # [r, z, n r | n]
            buf = jax.lax.dynamic_update_slice(buf, da.T[:, None, :], (0, k, 0))
            return dh * r[:, 4 * hid:] + dgh @ w_rec, buf

        dh, buf = jax.lax.fori_loop(0, length, body, (dh, buf))
        if isinstance(start, int) and start == 0:
            h_prev = jnp.concatenate([h0[None], hs[:length - 1]], axis=0)
        else:
            h_prev = jax.lax.dynamic_slice_in_dim(hs, start - 1, length)
        x = jax.lax.dynamic_slice_in_dim(xs, start, length)
        flat = buf.reshape(4 * hid, length * num_b)
        dgi = jnp.concatenate([flat[:2 * hid], flat[3 * hid:]], axis=0)  # (3H, K N)
        dw_rec = dw_rec + flat[:3 * hid] @ h_prev.reshape(length * num_b, hid)
        dw_in = dw_in + dgi @ x.reshape(length * num_b, num_in)
        dx = jnp.einsum("gm,gi->mi", dgi, w_in).reshape(length, num_b, num_in)
        return (dh, dw_in, dw_rec, db + dgi.sum(1), dbr + flat[2 * hid:3 * hid].sum(1),
                buf), dx

    first = num_t % _CHUNK or min(num_t, _CHUNK)
    num_chunks = (num_t - first) // _CHUNK
    dtype = w_rec.dtype
    state = (jnp.zeros_like(h0), jnp.zeros((3 * hid, num_in), dtype),
             jnp.zeros((3 * hid, hid), dtype), jnp.zeros((3 * hid,), dtype),
             jnp.zeros((hid,), dtype), jnp.zeros((4 * hid, _CHUNK, num_b), dtype))
    dxs = []
    if num_chunks:
        state, dx = jax.lax.scan(lambda s, c: chunk(s, first + c * _CHUNK, _CHUNK), state,
                                 jnp.arange(num_chunks), reverse=True)
        dxs.append(dx.reshape((num_chunks * _CHUNK,) + dx.shape[2:]))
    state = state[:5] + (jnp.zeros((4 * hid, first, num_b), dtype),)
    (dh0, dw_in, dw_rec, db, dbr, _), dx = chunk(state, 0, first)
    dxs = jnp.concatenate([dx] + dxs, axis=0) if dxs else dx
    return dw_in, db, dw_rec, dbr, dxs, dh0


_gru_layer.defvjp(_gru_fwd, _gru_bwd)


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
        evaluation: how `scan` evaluates whole sequences, layer after layer:
            ``"sequential"`` (`jax.lax.scan`), or by parallel Newton iterations on the
            trajectory's residual ``h_t - cell(h_{t-1}, x_t) = 0`` (`statseq.inference.deer`;
            Lim et al. 2023, Gonzalez et al. 2024): ``"deer"``, ``"quasi-deer"``,
            ``"elk"``, ``"quasi-elk"``, with a sequential fallback (and a warning) when the
            solver does not converge; ``None``: DEER on GPU/TPU for ``T >= 1000``, else
            sequential (`statseq.models.neural.evaluation`).
        evaluation_max_iter: the solver's maximum number of iterations (default ``T``).

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
    evaluation: str | None = None
    evaluation_max_iter: int | None = None

    def __post_init__(self):
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {self.cell!r}")
        check_evaluation(self.evaluation, self.evaluation_max_iter)
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
        then a scan of the recurrent part (the LSTM's with `lstm_layer`).

        ``xs`` is ``(T, I)`` with the state's leaves ``(H,)``, or a time-major batch
        ``(T, N, I)`` with leaves ``(N, H)`` (then the recurrent products are
        matrix-matrix products over the batch).
        """
        method = resolve_evaluation(self.evaluation, xs.shape[0])
        if method != "sequential":
            return self._scan_parallel(params, state, xs, method)
        finals, hs = [], xs
        for p, s in zip(params, state, strict=True):
            if self.cell == "lstm":
                hs, c_last = lstm_layer(p.w_in, p.bias, p.w_rec, hs, *s)
                s = (hs[-1], c_last)
            elif self.cell == "gru" and hs.shape[0]:
                hs = gru_layer(p.w_in, p.bias, p.w_rec, p.bias_rec, hs, s)
                s = hs[-1]
            else:
                gis = hs @ p.w_in.T + p.bias
                s, hs = jax.lax.scan(
                    lambda carry, gi, p=p: _recur(self.cell, p, carry, gi), s, gis
                )
            finals.append(s)
        return tuple(finals), hs

    def _scan_parallel(self, params, state, xs, method):
        """`scan` by a parallel solver, layer after layer (`evaluate_layer`: the
        sequential scan is the fallback when the solver does not converge)."""
        cell = self.cell

        def step(p, s, gi):
            return _recur(cell, p, s, gi)[0]

        finals, hs = [], xs
        for p, s in zip(params, state, strict=True):
            gis = hs @ p.w_in.T + p.bias
            states = evaluate_layer(step, p, s, gis, method=method,
                                    max_iter=self.evaluation_max_iter)
            finals.append(jax.tree.map(lambda v: v[-1], states))
            hs = states[0] if cell == "lstm" else states
        return tuple(finals), hs

    def scan_time_major(self, params, state, xs):
        """A time-major batch ``xs`` ``(T, N, I)`` from ``state`` (leaves ``(N, H)``): one
        scan over the whole batch (`scan` handles leading batch dimensions)."""
        return self.scan(params, state, xs)
