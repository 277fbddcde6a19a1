"""Causal softmax attention with a sliding window, its KV-cache step and positional encodings.

Multi-head scaled dot-product attention (Vaswani et al. 2017, *Attention is all you need*,
eq. 1), causal and restricted to a window of the ``W`` most recent positions: per head,
with queries ``q_t``, keys ``k_s`` and values ``v_s`` (``D`` each),

    out_t = sum_{s in S(t)} softmax_s(q_t . k_s / sqrt(D)) v_s,
    S(t) = {s : max(0, t - W + 1) <= s <= t}.

For ``t < W`` this is ordinary causal attention over the whole prefix; beyond, the oldest
positions leave the window (**sliding-window rule**: a query attends to itself and the
``W - 1`` positions before it). Both forms below apply this same rule, so they agree at
every length.

**Step form (KV cache)**: the `KVCache` holds the keys and values of the last ``W``
positions, oldest first, ``(W, H, D)`` each, and the position counter ``n`` (a float, so
the state is one dtype; exact up to ``2^24`` steps in float32); a slot whose position
``n - W + i`` is negative (before the start) is masked. One step appends the new key and
value, drops the oldest and attends over the ``W`` slots: a fixed-size state, as every
statseq filter state.

**Parallel form**: the cache's ``W`` keys followed by the ``T`` new ones, the masked
``T x (W + T)`` score matrix (``O(T (T + W))`` memory), and the last ``W`` keys and
values as the new cache. It starts from any cache (a sequence split in two gives the same
numbers as one pass). Scores of masked entries are ``-inf`` before the softmax (every row
keeps its own position, so no row is empty).

**Parallel form from the start** (`attention_parallel_from_start`): when the sequence
starts from the empty cache (position 0: ``log_prob``, ``fit_sgd``), the cache's ``W``
zero keys are all masked, so the ``T x T`` scores of the new keys alone give the same
output with the memory of an ordinary causal attention (``T x (W + T)`` is twice that at
``W = T``); the final cache is the same.

**Positional encodings.** `sinusoidal_encoding` (Vaswani et al. 2017, section 3.5:
``PE(t, 2i) = sin(t / 10000^{2i/d})``, ``PE(t, 2i + 1) = cos(t / 10000^{2i/d})``) is added
to the input embedding; `apply_rope` (Su et al. 2021, *RoFormer*, eq. 34) rotates each
pair ``(x_i, x_{i + D/2})`` of a query or key at position ``t`` by the angle
``t θ_i``, ``θ_i = base^{-2i/D}`` (the "rotate half" pairing of GPT-NeoX and LLaMA), so
that ``apply_rope(q, t) . apply_rope(k, s)`` depends on ``t - s`` only. Keys are cached
after rotation.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "KVCache",
    "apply_rope",
    "attention_parallel",
    "attention_parallel_from_start",
    "attention_recurrent",
    "attention_step",
    "dot_product_attention",
    "kv_cache_init",
    "sinusoidal_encoding",
    "window_mask",
]


class KVCache(NamedTuple):
    """The key-value cache of one attention layer (window ``W``, ``H`` heads of width ``D``).

    Attributes:
        keys: ``(W, H, D)`` keys of positions ``n - W, ..., n - 1``, oldest first (zeros
            for positions before the start).
        values: ``(W, H, D)`` their values.
        position: ``()`` the number of steps taken, ``n`` (a float: the state is one dtype).
    """

    keys: jax.Array
    values: jax.Array
    position: jax.Array


def kv_cache_init(max_len: int, num_heads: int, head_dim: int, dtype) -> KVCache:
    """The empty cache: zero keys and values, ``n = 0``.

    Args:
        max_len: the window ``W``.
        num_heads: ``H``.
        head_dim: ``D``.
        dtype: a float dtype.

    Returns:
        `KVCache`.

    Examples:
        >>> import jax.numpy as jnp
        >>> kv_cache_init(8, 2, 4, jnp.float32).keys.shape
        (8, 2, 4)
    """
    zeros = jnp.zeros((max_len, num_heads, head_dim), dtype)
    return KVCache(zeros, zeros, jnp.zeros((), dtype))


def window_mask(query_pos, key_pos, window: int):
    """``True`` where a query at ``query_pos`` may attend to a key at ``key_pos``:
    ``0 <= key_pos`` and ``query_pos - window < key_pos <= query_pos``.

    Args:
        query_pos: ``(T,)`` query positions.
        key_pos: ``(S,)`` key positions (negative: before the start).
        window: ``W``.

    Returns:
        ``(T, S)`` booleans.

    Examples:
        >>> import jax.numpy as jnp
        >>> window_mask(jnp.arange(3), jnp.arange(3), 2).astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    lag = query_pos[:, None] - key_pos[None, :]
    return (key_pos[None, :] >= 0) & (lag >= 0) & (lag < window)


def dot_product_attention(q, k, v, mask):
    """``softmax(q k^T / sqrt(D), masked) v`` per head.

    Args:
        q: ``(T, H, D)`` queries.
        k: ``(S, H, D)`` keys.
        v: ``(S, H, D)`` values.
        mask: ``(T, S)`` booleans (``True``: attend); every row needs one ``True``.

    Returns:
        ``(T, H, D)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> q = k = jnp.zeros((2, 1, 2)); v = jnp.array([[[1.0, 0.0]], [[3.0, 2.0]]])
        >>> dot_product_attention(q, k, v, jnp.tril(jnp.ones((2, 2), bool)))[:, 0].tolist()
        [[1.0, 0.0], [2.0, 1.0]]
    """
    scores = jnp.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1])
    scores = jnp.where(mask[None], scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("hts,shd->thd", weights, v)


def attention_step(cache: KVCache, q, k, v):
    """One step of the KV-cache form at position ``n = cache.position``.

    Args:
        cache: `KVCache` before the step.
        q: ``(H, D)`` query (rotated, for RoPE).
        k: ``(H, D)`` key (rotated, for RoPE).
        v: ``(H, D)`` value.

    Returns:
        ``(new_cache, out (H, D))``.
    """
    window = cache.keys.shape[0]
    keys = jnp.concatenate([cache.keys[1:], k[None]])
    values = jnp.concatenate([cache.values[1:], v[None]])
    key_pos = cache.position - (window - 1) + jnp.arange(window, dtype=cache.position.dtype)
    out = dot_product_attention(q[None], keys, values, (key_pos >= 0)[None])[0]
    return KVCache(keys, values, cache.position + 1), out


def attention_recurrent(cache: KVCache, q, k, v):
    """`jax.lax.scan` of `attention_step` over a sequence.

    Args:
        cache: `KVCache` before the first step.
        q: ``(T, H, D)`` queries.
        k: ``(T, H, D)`` keys.
        v: ``(T, H, D)`` values.

    Returns:
        ``(final_cache, out (T, H, D))``.
    """
    return jax.lax.scan(lambda c, qkv: attention_step(c, *qkv), cache, (q, k, v))


def attention_parallel(cache: KVCache, q, k, v):
    """The parallel form: the masked ``T x (W + T)`` scores at once, from any cache.

    Args:
        cache: `KVCache` before the first step (position ``n``).
        q: ``(T, H, D)`` queries of positions ``n, ..., n + T - 1``.
        k: ``(T, H, D)`` keys.
        v: ``(T, H, D)`` values.

    Returns:
        ``(final_cache, out (T, H, D))``, equal to `attention_recurrent` up to rounding.

    Examples:
        >>> import jax
        >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 6, 2, 4))
        >>> c = kv_cache_init(4, 2, 4, q.dtype)
        >>> a, b = attention_parallel(c, q, k, v)[1], attention_recurrent(c, q, k, v)[1]
        >>> bool(jax.numpy.allclose(a, b, atol=1e-5))
        True
    """
    window, t_len = cache.keys.shape[0], q.shape[0]
    n, dtype = cache.position, cache.position.dtype
    keys = jnp.concatenate([cache.keys, k])  # positions n - W + i
    values = jnp.concatenate([cache.values, v])
    key_pos = n - window + jnp.arange(window + t_len, dtype=dtype)
    query_pos = n + jnp.arange(t_len, dtype=dtype)
    out = dot_product_attention(q, keys, values, window_mask(query_pos, key_pos, window))
    return KVCache(keys[t_len:], values[t_len:], n + t_len), out


def attention_parallel_from_start(cache: KVCache, q, k, v):
    """The parallel form from the **empty** cache: the masked ``T x T`` scores only.

    The cache must be the initial one (`kv_cache_init`: position 0, zero keys and values);
    its slots would all be masked, so they are left out of the scores. Equal to
    `attention_parallel` from that cache (outputs and final cache; a test checks values
    and gradients to 1e-10 in float64) with ``T x T`` instead of ``T x (W + T)`` scores.

    Args:
        cache: the initial `KVCache` (its shapes and dtype; its contents are not read
            beyond the new cache's zero slots when ``T < W``).
        q: ``(T, H, D)`` queries of positions ``0, ..., T - 1``.
        k: ``(T, H, D)`` keys.
        v: ``(T, H, D)`` values.

    Returns:
        ``(final_cache, out (T, H, D))``.

    Examples:
        >>> import jax
        >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 6, 2, 4))
        >>> c = kv_cache_init(4, 2, 4, q.dtype)
        >>> a = attention_parallel_from_start(c, q, k, v)[1]
        >>> bool(jax.numpy.allclose(a, attention_parallel(c, q, k, v)[1], atol=1e-6))
        True
    """
    window, t_len = cache.keys.shape[0], q.shape[0]
    pos = jnp.arange(t_len, dtype=cache.position.dtype)
    out = dot_product_attention(q, k, v, window_mask(pos, pos, window))
    keys = jnp.concatenate([cache.keys, k])[t_len:]  # the last W positions (zeros before 0)
    values = jnp.concatenate([cache.values, v])[t_len:]
    return KVCache(keys, values, cache.position + t_len), out


#: The whole-sequence forms by mode name.
MODES = {"recurrent": attention_recurrent, "parallel": attention_parallel}


def sinusoidal_encoding(positions, dim: int, base: float = 10000.0):
    """The sinusoidal position encoding of Vaswani et al. (2017), section 3.5.

    ``PE(t, 2i) = sin(t / base^{2i/d})``, ``PE(t, 2i + 1) = cos(t / base^{2i/d})``.

    Args:
        positions: ``(...)`` positions ``t`` (floats).
        dim: ``d`` (odd ``d``: the last cosine column is dropped).
        base: the wavelength scale (10000 in the paper).

    Returns:
        ``(..., d)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> sinusoidal_encoding(jnp.array([0.0]), 4).tolist()
        [[0.0, 1.0, 0.0, 1.0]]
    """
    positions = jnp.asarray(positions)
    half = (dim + 1) // 2
    freq = base ** (-2.0 * jnp.arange(half, dtype=positions.dtype) / dim)
    angle = positions[..., None] * freq
    pe = jnp.stack([jnp.sin(angle), jnp.cos(angle)], axis=-1)
    return pe.reshape(positions.shape + (2 * half,))[..., :dim]


def apply_rope(x, positions, base: float = 10000.0):
    """Rotary position embedding (Su et al. 2021): rotate ``(x_i, x_{i + D/2})`` by
    ``t θ_i``, ``θ_i = base^{-2i/D}``.

    Args:
        x: ``(..., H, D)`` queries or keys, ``D`` even.
        positions: ``(...)`` their positions ``t`` (floats).
        base: ``base`` of the frequencies (10000 in the paper).

    Returns:
        ``(..., H, D)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> (apply_rope(jnp.array([[1.0, 0.0]]), jnp.array(jnp.pi / 2)).round(6) + 0.0).tolist()
        [[0.0, 1.0]]
    """
    dim = x.shape[-1]
    half = dim // 2
    positions = jnp.asarray(positions, x.dtype)
    freq = base ** (-2.0 * jnp.arange(half, dtype=x.dtype) / dim)
    angle = positions[..., None, None] * freq  # (..., 1, D/2)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
