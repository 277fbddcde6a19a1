"""Causal linear attention (Katharopoulos et al. 2020) in three equivalent forms.

Katharopoulos, Vyas, Pappas and Fleuret (2020), *Transformers are RNNs: fast
autoregressive transformers with linear attention* (ICML), replace the softmax kernel
``exp(q^T k)`` of causal attention by a feature-map inner product ``phi(q)^T phi(k)``
(their eq. 4-5, with ``phi(x) = elu(x) + 1``, eq. 7). Written per head, with the features
``q_t = phi(Q_t)``, ``k_t = phi(K_t)`` (``D_k``) and values ``v_t`` (``D_v``), and with an
optional decay ``0 < γ <= 1`` per head (``γ = 1`` is the paper; ``γ < 1`` is the
retention decay of Sun et al. 2023, *Retentive network*), the output is

    out_t = sum_{s<=t} γ^{t-s} (q_t . k_s) v_s / (sum_{s<=t} γ^{t-s} (q_t . k_s) + eps).

**Recurrent form** (the paper's eq. 18-20: an RNN with a matrix state),

    S_t = γ S_{t-1} + k_t v_t^T        (D_k, D_v)
    z_t = γ z_{t-1} + k_t              (D_k)
    out_t = S_t^T q_t / (z_t^T q_t + eps),

**parallel form** (the masked ``T x T`` matrix ``A_{ts} = γ^{t-s} q_t . k_s``, ``s <= t``;
``out = A V / (A 1 + eps)``, ``O(T^2)`` memory) and **chunked form** (blocks of ``C``
steps: the parallel form inside a block, the recurrent state between blocks, as in
Yang et al. 2024, *Gated linear attention transformers with hardware-efficient
training*; ``O(T C)`` work and memory). All three start from any state ``(S, z)``:
the state contributes ``γ^{t+1} q_t^T S`` to the numerator and ``γ^{t+1} q_t^T z`` to the
denominator at step ``t`` of the block.

**Where eps goes.** ``eps`` is added once to the denominator ``z_t^T q_t`` (a sum of
non-negative terms), after all the terms are summed, in every form: the three forms
compute the same number ``num / (den + eps)`` and differ only in the order of summation.
(The paper adds its ``eps`` the same way.) With ``elu + 1`` features the denominator is
positive and ``eps`` only guards the ``relu`` map, whose features can all be 0.

The decay enters as ``exp(n log γ)`` with the integer lag ``n`` in every form (never a
product of ``n`` factors), so that the three forms differ only by rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "FEATURE_MAPS",
    "LinearAttentionState",
    "feature_map",
    "linear_attention",
    "linear_attention_chunked",
    "linear_attention_parallel",
    "linear_attention_recurrent",
    "linear_attention_step",
]

#: Positive feature maps ``phi``: ``elu(x) + 1`` (the paper's), ``relu(x)``, ``softplus(x)``.
FEATURE_MAPS = ("elu+1", "relu", "softplus")


class LinearAttentionState(NamedTuple):
    """The recurrent state of causal linear attention (per head).

    Attributes:
        s: ``(H, D_k, D_v)`` ``S_t = sum_s γ^{t-s} k_s v_s^T``.
        z: ``(H, D_k)`` ``z_t = sum_s γ^{t-s} k_s``.
    """

    s: jax.Array
    z: jax.Array


def feature_map(x, name: str = "elu+1"):
    """The positive feature map ``phi`` (elementwise).

    Args:
        x: any array.
        name: one of `FEATURE_MAPS`.

    Returns:
        ``phi(x)``, same shape.

    Raises:
        ValueError: for an unknown name.

    Examples:
        >>> import jax.numpy as jnp
        >>> [round(float(v), 4) for v in feature_map(jnp.array([-1.0, 0.0, 2.0]))]  # elu + 1
        [0.3679, 1.0, 3.0]
    """
    if name == "elu+1":  # = exp(x) for x <= 0 exactly (elu(x) + 1 would cancel)
        return jnp.where(x > 0, x + 1.0, jnp.exp(jnp.minimum(x, 0.0)))
    if name == "relu":
        return jax.nn.relu(x)
    if name == "softplus":
        return jax.nn.softplus(x)
    raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {name!r}")


def linear_attention_step(state, q, k, v, log_gamma, eps):
    """One step of the recurrent form.

    Args:
        state: `LinearAttentionState` ``(S_{t-1}, z_{t-1})``.
        q: ``(H, D_k)`` query features ``phi(Q_t)``.
        k: ``(H, D_k)`` key features ``phi(K_t)``.
        v: ``(H, D_v)`` values.
        log_gamma: ``(H,)`` ``log γ <= 0``.
        eps: added to the denominator.

    Returns:
        ``(new_state, out_t (H, D_v))``.
    """
    g = jnp.exp(log_gamma)
    s = g[:, None, None] * state.s + k[:, :, None] * v[:, None, :]
    z = g[:, None] * state.z + k
    num = jnp.einsum("hk,hkv->hv", q, s)
    den = jnp.einsum("hk,hk->h", q, z)
    return LinearAttentionState(s, z), num / (den[:, None] + eps)


def linear_attention_recurrent(state, q, k, v, log_gamma, eps):
    """The recurrent form over a sequence: `jax.lax.scan` of `linear_attention_step`.

    Args:
        state: `LinearAttentionState` before the first step.
        q: ``(T, H, D_k)`` query features.
        k: ``(T, H, D_k)`` key features.
        v: ``(T, H, D_v)`` values.
        log_gamma: ``(H,)``.
        eps: added to the denominator.

    Returns:
        ``(final_state, out (T, H, D_v))``.
    """
    return jax.lax.scan(
        lambda st, qkv: linear_attention_step(st, *qkv, log_gamma, eps), state, (q, k, v))


def _decay(lags, log_gamma):
    """``γ^lag`` for integer ``lags`` ``(...)`` and ``log_gamma`` ``(H,)``: ``(H, ...)``;
    0 where the lag is negative (the causal mask, applied before ``exp`` so that no
    ``γ^{-n}`` overflows, not even in a gradient)."""
    causal = lags >= 0
    safe = jnp.where(causal, lags, 0).astype(log_gamma.dtype)
    expo = log_gamma.reshape((-1,) + (1,) * lags.ndim) * safe
    return jnp.where(causal, jnp.exp(expo), 0.0)


def _block(state, q, k, v, log_gamma, eps, length):
    """The parallel form on one block of ``n`` steps, of which the first ``length`` are
    real (the rest padding, whose keys must be 0): ``(state after length steps, out)``."""
    n = q.shape[0]
    t = jnp.arange(n)
    decay = _decay(t[:, None] - t[None, :], log_gamma)  # (H, n, n)
    scores = jnp.einsum("thk,shk->hts", q, k) * decay
    from_state = _decay(t + 1, log_gamma).T  # (n, H): γ^{t+1}
    num = jnp.einsum("hts,shv->thv", scores, v) + \
        from_state[:, :, None] * jnp.einsum("thk,hkv->thv", q, state.s)
    den = jnp.sum(scores, axis=-1).T + from_state * jnp.einsum("thk,hk->th", q, state.z)
    out = num / (den[:, :, None] + eps)
    to_end = _decay(length - 1 - t, log_gamma).T  # (n, H): γ^{length-1-s}, 0 past the end
    whole = jnp.exp(log_gamma * jnp.asarray(length, log_gamma.dtype))  # γ^length
    s = whole[:, None, None] * state.s + jnp.einsum("th,thk,thv->hkv", to_end, k, v)
    z = whole[:, None] * state.z + jnp.einsum("th,thk->hk", to_end, k)
    return LinearAttentionState(s, z), out


def linear_attention_parallel(state, q, k, v, log_gamma, eps):
    """The quadratic parallel form: the masked ``T x T`` matrix ``A_{ts} = γ^{t-s} q_t . k_s``.

    Args:
        state: `LinearAttentionState` before the first step.
        q: ``(T, H, D_k)`` query features.
        k: ``(T, H, D_k)`` key features.
        v: ``(T, H, D_v)`` values.
        log_gamma: ``(H,)``.
        eps: added to the denominator.

    Returns:
        ``(final_state, out (T, H, D_v))``; ``O(T^2 H)`` memory.
    """
    return _block(state, q, k, v, log_gamma, eps, q.shape[0])


def linear_attention_chunked(state, q, k, v, log_gamma, eps, chunk_size: int = 64):
    """The chunked form: the parallel form inside blocks of ``C`` steps, the state between.

    The sequence is padded with zero keys and values to a multiple of ``C`` (a zero key
    adds nothing to the state, and the last block's state update stops at its last real
    step), then `jax.lax.scan` runs over the blocks: ``O(T C H)`` work and memory.

    Args:
        state: `LinearAttentionState` before the first step.
        q: ``(T, H, D_k)`` query features.
        k: ``(T, H, D_k)`` key features.
        v: ``(T, H, D_v)`` values.
        log_gamma: ``(H,)``.
        eps: added to the denominator.
        chunk_size: ``C`` (a block shorter than ``C`` when ``T < C``).

    Returns:
        ``(final_state, out (T, H, D_v))``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> q, k, v = (jax.nn.elu(jax.random.normal(jax.random.key(i), (10, 2, 3))) + 1
        ...            for i in range(3))
        >>> st = LinearAttentionState(jnp.zeros((2, 3, 3)), jnp.zeros((2, 3)))
        >>> lg = jnp.log(jnp.array([1.0, 0.9]))
        >>> a = linear_attention_chunked(st, q, k, v, lg, 1e-6, chunk_size=4)[1]
        >>> b = linear_attention_recurrent(st, q, k, v, lg, 1e-6)[1]
        >>> bool(jnp.allclose(a, b, rtol=1e-5))
        True
    """
    t_len = q.shape[0]
    c = max(1, min(int(chunk_size), t_len))
    n = -(-t_len // c)
    pad = n * c - t_len
    blocks = [jnp.concatenate([a, jnp.zeros((pad,) + a.shape[1:], a.dtype)]).reshape(
        (n, c) + a.shape[1:]) for a in (q, k, v)]
    lengths = jnp.full((n,), c).at[-1].set(c - pad)
    final, out = jax.lax.scan(
        lambda st, blk: _block(st, *blk[:3], log_gamma, eps, blk[3]), state,
        (*blocks, lengths))
    return final, out.reshape((n * c,) + out.shape[2:])[:t_len]


#: The whole-sequence forms by mode name.
MODES = {"recurrent": linear_attention_recurrent, "parallel": linear_attention_parallel,
         "chunked": linear_attention_chunked}


def linear_attention(state, q, k, v, log_gamma, eps, *, mode: str = "chunked",
                     chunk_size: int = 64):
    """Causal linear attention over a sequence in the form ``mode`` (equal up to rounding).

        out_t = sum_{s<=t} γ^{t-s} (q_t . k_s) v_s / (sum_{s<=t} γ^{t-s} (q_t . k_s) + eps)

    Args:
        state: `LinearAttentionState` before the first step.
        q: ``(T, H, D_k)`` query features ``phi(Q)`` (non-negative).
        k: ``(T, H, D_k)`` key features ``phi(K)`` (non-negative).
        v: ``(T, H, D_v)`` values.
        log_gamma: ``(H,)`` ``log γ <= 0`` (zeros: no decay).
        eps: added to the denominator (module docstring).
        mode: ``"recurrent"``, ``"parallel"`` or ``"chunked"``.
        chunk_size: block size of the chunked form.

    Returns:
        ``(final_state, out (T, H, D_v))``.

    Raises:
        ValueError: for an unknown mode.

    Examples:
        >>> import jax.numpy as jnp
        >>> st = LinearAttentionState(jnp.zeros((1, 1, 1)), jnp.zeros((1, 1)))
        >>> q = k = jnp.ones((3, 1, 1))
        >>> v = jnp.array([1.0, 2.0, 6.0]).reshape(3, 1, 1)
        >>> out = linear_attention(st, q, k, v, jnp.zeros(1), 0.0, mode="parallel")[1]
        >>> [float(o) for o in out.ravel()]      # running means: no decay, equal scores
        [1.0, 1.5, 3.0]
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {tuple(MODES)}, got {mode!r}")
    if mode == "chunked":
        return linear_attention_chunked(state, q, k, v, log_gamma, eps, chunk_size)
    return MODES[mode](state, q, k, v, log_gamma, eps)
