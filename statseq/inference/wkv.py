"""The RWKV-4 time-mixing operator (WKV) in its stable recurrent form and a parallel form.

Peng et al. (2023), *RWKV: reinventing RNNs for the transformer era* (Findings of EMNLP),
eq. (14): for every channel, with a decay rate ``w >= 0``, a bonus ``u`` for the current
token, keys ``k_t`` and values ``v_t``,

    wkv_t = (sum_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t)
            / (sum_{i<t} e^{-(t-1-i) w + k_i}       + e^{u + k_t}).

**Recurrent form** (the paper's appendix and its reference CUDA kernel). The sums over the
past are carried as a state ``(a, b, p)``: ``e^p a`` and ``e^p b`` are the numerator and
denominator sums over ``i <= t`` with the decays of time ``t``, and ``p`` is the running
maximum of their exponents, so that every exponential evaluated is ``<= 1``:

    q = max(p, u + k_t),   wkv_t = (e^{p-q} a + e^{u+k_t-q} v_t) / (e^{p-q} b + e^{u+k_t-q}),
    p' = max(p - w, k_t),  a' = e^{p-w-p'} a + e^{k_t-p'} v_t,  b' = e^{p-w-p'} b + e^{k_t-p'}.

The state before the first token is ``(0, 0, -inf)`` (an empty sum); unrolled,
``p_t = max(p_0 - t w, max_{i<=t} k_i - (t-i) w)``.

**Parallel form.** All ``T`` outputs at once from the ``T x T`` matrix of exponents
``E[t, i] = k_i - (t-1-i) w`` (``i < t``), ``u + k_t`` (``i = t``), ``-inf`` (``i > t``),
plus one column for the carried state (exponent ``p_0 - (t-1) w``, "value" ``a_0``,
"weight" ``b_0``): each row is normalized by its maximum (a log-sum-exp), which makes it
a causal softmax-weighted average of the values (``O(T^2)`` memory per channel). Its final
state is the same ``(a, b, p)`` as the recurrence's, with ``p`` the same maximum.

**Chunked form.** Because the parallel form starts from and returns the carried state, a
sequence cut into chunks of ``L`` steps is the parallel form within each chunk and a
`jax.lax.scan` over the chunks (`scan_chunks`): ``O(T L)`` memory, ``T / L`` sequential
steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


class WKVState(NamedTuple):
    """Stabilized sums of the WKV operator, one entry per channel.

    Attributes:
        num: ``a``: the numerator sum is ``e^p a``.
        den: ``b``: the denominator sum is ``e^p b``.
        max: ``p``: the largest exponent so far (``-inf`` before the first token).
    """

    num: jax.Array
    den: jax.Array
    max: jax.Array


def wkv_initial_state(shape, dtype) -> WKVState:
    """The empty state ``(0, 0, -inf)`` with leaves of ``shape``."""
    zeros = jnp.zeros(shape, dtype)
    return WKVState(zeros, zeros, jnp.full(shape, -jnp.inf, dtype))


def wkv_step(w, u, state: WKVState, k_t, v_t):
    """One token of the stable recurrence (module docstring).

    Args:
        w: decay rates ``(C,)`` (``>= 0``).
        u: bonus ``(C,)`` of the current token.
        state: `WKVState` before the token.
        k_t: keys ``(C,)``.
        v_t: values ``(C,)``.

    Returns:
        ``(new_state, wkv_t)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> s = wkv_initial_state((2,), jnp.float32)
        >>> s, out = wkv_step(jnp.ones(2), jnp.zeros(2), s, jnp.zeros(2), jnp.array([1., 2.]))
        >>> out.tolist()                       # the first token: its own value
        [1.0, 2.0]
    """
    a, b, p = state
    ww = u + k_t
    q = jnp.maximum(p, ww)
    e1, e2 = jnp.exp(p - q), jnp.exp(ww - q)
    out = (e1 * a + e2 * v_t) / (e1 * b + e2)
    decayed = p - w
    p_new = jnp.maximum(decayed, k_t)
    e1, e2 = jnp.exp(decayed - p_new), jnp.exp(k_t - p_new)
    return WKVState(e1 * a + e2 * v_t, e1 * b + e2, p_new), out


def wkv_recurrent(w, u, k, v, state: WKVState):
    """The WKV operator over a sequence by `jax.lax.scan` of `wkv_step`.

    Args:
        w: decay rates ``(C,)``.
        u: bonus ``(C,)``.
        k: keys ``(T, C)``.
        v: values ``(T, C)``.
        state: `WKVState` before the first token.

    Returns:
        ``(final_state, wkv (T, C))``.
    """
    return jax.lax.scan(lambda s, kv: wkv_step(w, u, s, kv[0], kv[1]), state, (k, v))


def wkv_parallel(w, u, k, v, state: WKVState):
    """The WKV operator over a sequence from the ``T x T`` exponent matrix (module
    docstring): the same numbers as `wkv_recurrent`, ``O(T^2 C)`` memory.

    Args:
        w: decay rates ``(C,)``.
        u: bonus ``(C,)``.
        k: keys ``(T, C)``.
        v: values ``(T, C)``.
        state: `WKVState` before the first token.

    Returns:
        ``(final_state, wkv (T, C))``.

    Examples:
        >>> import jax.numpy as jnp
        >>> w, u = jnp.array([0.5]), jnp.array([0.3])
        >>> k, v = jnp.array([[0.1], [2.0], [-1.0]]), jnp.array([[1.0], [-2.0], [0.5]])
        >>> s0 = wkv_initial_state((1,), k.dtype)
        >>> par = wkv_parallel(w, u, k, v, s0)[1]
        >>> rec = wkv_recurrent(w, u, k, v, s0)[1]
        >>> bool(jnp.allclose(par, rec, rtol=1e-6))
        True
    """
    t_len = k.shape[0]
    steps = jnp.arange(t_len)
    lag = (steps[:, None] - 1 - steps[None, :]).astype(k.dtype)  # t - 1 - i
    past = k[None, :, :] - lag[:, :, None] * w  # (T, T, C)
    diag = (steps[:, None] == steps[None, :])[:, :, None]
    causal = (steps[:, None] >= steps[None, :])[:, :, None]
    expo = jnp.where(diag, (u + k)[None, :, :], past)
    expo = jnp.where(causal, expo, -jnp.inf)
    a0, b0, p0 = state
    prior = p0 - steps[:, None].astype(k.dtype) * w  # (T, C): exponent p_0 - (t-1) w
    top = jnp.maximum(jnp.max(expo, axis=1), prior)
    weights = jnp.exp(expo - top[:, None, :])
    prior_weight = jnp.exp(prior - top)
    num = jnp.einsum("tic,ic->tc", weights, v) + prior_weight * a0
    den = jnp.sum(weights, axis=1) + prior_weight * b0
    # the final state: exponents k_i - (T-1-i) w and p_0 - T w
    last = k - (t_len - 1 - steps)[:, None].astype(k.dtype) * w
    last_prior = p0 - t_len * w
    p_new = jnp.maximum(jnp.max(last, axis=0), last_prior)
    wl, wp = jnp.exp(last - p_new), jnp.exp(last_prior - p_new)
    final = WKVState(jnp.sum(wl * v, axis=0) + wp * a0, jnp.sum(wl, axis=0) + wp * b0, p_new)
    return final, num / den


def scan_chunks(fn: Callable, state, xs, chunk_size: int):
    """Run a whole-sequence form chunk by chunk: ``fn(state, *chunk) -> (state, out)`` on
    consecutive chunks of ``chunk_size`` steps of every array in ``xs`` (leading time
    axis), by `jax.lax.scan` over the full chunks and one call on the remainder.

    Args:
        fn: a whole-sequence form that starts from ``state`` and returns the final state.
        state: the state before the first step.
        xs: a tuple of arrays with the same leading length ``T``.
        chunk_size: ``L``, steps per chunk (a positive int).

    Returns:
        ``(final_state, outputs)`` with the outputs of the chunks concatenated in time.

    Examples:
        >>> import jax.numpy as jnp
        >>> w, u = jnp.array([0.5]), jnp.array([0.3])
        >>> k, v = jnp.linspace(-1, 1, 7)[:, None], jnp.linspace(2, 0, 7)[:, None]
        >>> s0 = wkv_initial_state((1,), k.dtype)
        >>> par = lambda s, k, v: wkv_parallel(w, u, k, v, s)
        >>> chunked = scan_chunks(par, s0, (k, v), 3)[1]
        >>> bool(jnp.allclose(chunked, wkv_recurrent(w, u, k, v, s0)[1], rtol=1e-6))
        True
    """
    t_len = xs[0].shape[0]
    num, rest = divmod(t_len, chunk_size)
    outs = []
    if num:
        full = tuple(x[:num * chunk_size].reshape((num, chunk_size) + x.shape[1:])
                     for x in xs)
        state, out = jax.lax.scan(lambda s, c: fn(s, *c), state, full)
        outs.append(jax.tree.map(lambda o: o.reshape((num * chunk_size,) + o.shape[2:]), out))
    if rest or not num:
        state, out = fn(state, *(x[num * chunk_size:] for x in xs))
        outs.append(out)
    return state, jax.tree.map(lambda *o: jnp.concatenate(o), *outs)


def wkv_chunked(w, u, k, v, state: WKVState, chunk_size: int):
    """The WKV operator by `wkv_parallel` within chunks of ``chunk_size`` steps and a scan
    over the chunks (`scan_chunks`): the same numbers, ``O(T L C)`` memory.

    Args:
        w: decay rates ``(C,)``.
        u: bonus ``(C,)``.
        k: keys ``(T, C)``.
        v: values ``(T, C)``.
        state: `WKVState` before the first token.
        chunk_size: ``L``.

    Returns:
        ``(final_state, wkv (T, C))``.
    """
    return scan_chunks(lambda s, kc, vc: wkv_parallel(w, u, kc, vc, s), state, (k, v),
                       chunk_size)
