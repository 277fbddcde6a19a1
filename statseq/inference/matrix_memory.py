"""The mLSTM matrix memory (xLSTM) in its stabilized recurrent form and a parallel form.

Beck et al. (2024), *xLSTM: extended long short-term memory* (NeurIPS), eqs. (19)-(27): one
head with queries, keys and values ``q_t, k_t, v_t`` (``P`` each), an exponential input gate
``i_t = exp(ĩ_t)`` and a forget gate ``f_t`` (sigmoid or exponential, given here by
``log f_t``),

    C_t = f_t C_{t-1} + i_t v_t k_t^T,   n_t = f_t n_{t-1} + i_t k_t,
    h̃_t = C_t q_t / max(|n_t^T q_t|, 1).

(The output gate ``o_t`` and the scaling ``k_t / sqrt(P)`` are applied by the caller.)

**Stabilized recurrence** (the paper's eqs. (15)-(17) and Appendix A.2): a stabilizer state
``m_t`` keeps every exponential ``<= 1``; the stored ``C'_t = e^{-m_t} C_t`` and
``n'_t = e^{-m_t} n_t``:

    m_t = max(log f_t + m_{t-1}, ĩ_t),
    f'_t = exp(log f_t + m_{t-1} - m_t),   i'_t = exp(ĩ_t - m_t),
    C'_t = f'_t C'_{t-1} + i'_t v_t k_t^T,   n'_t = f'_t n'_{t-1} + i'_t k_t,
    h̃_t = C'_t q_t / max(|n'_t^T q_t|, e^{-m_t}),

which is the unstabilized formula exactly (divide its numerator and denominator by
``e^{m_t}``). The state before the first token is ``(0, 0, 0)`` as in the reference code.

**Parallel form** (Appendix A.3): with ``F_t = sum_{j<=t} log f_j``, the ``T x T`` log gate
matrix ``D[t, i] = F_t - F_i + ĩ_i`` (``i <= t``, else ``-inf``), plus one column for the
carried state (``F_t + m_0``), the row maximum is the same ``m_t`` as the recurrence's and

    S = (q k^T) ⊙ exp(D - m),   ρ = e^{F + m_0 - m},
    h̃ = (S v + ρ C'_0 q) / max(|S 1 + ρ n'_0^T q|, e^{-m}).

**Chunked form.** The parallel form starts from and returns the carried state, so chunks of
``L`` steps are run by it in turn (`statseq.inference.wkv.scan_chunks`): ``O(T L)`` memory.

**Where we differ.** The lower bound ``e^{-m_t}`` of the normalizer is capped at
``e^{L/2}`` with ``L`` the log of the largest float (``m_t < -354`` in float64, ``< -44`` in
float32: an input gate that small would overflow it, and the output is below ``e^{-L/2}``
either way); this never binds for gates of ordinary size.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.inference.wkv import scan_chunks


class MatrixMemoryState(NamedTuple):
    """Stabilized state of one mLSTM head.

    Attributes:
        cov: ``C'`` ``(P, P)``: the memory is ``e^m C'``.
        norm: ``n'`` ``(P,)``: the normalizer state is ``e^m n'``.
        max: ``m`` ``()``: the stabilizer.
    """

    cov: jax.Array
    norm: jax.Array
    max: jax.Array


def matrix_memory_initial_state(head_dim: int, dtype) -> MatrixMemoryState:
    """The empty state ``(0, 0, 0)`` of one head."""
    return MatrixMemoryState(jnp.zeros((head_dim, head_dim), dtype),
                             jnp.zeros((head_dim,), dtype), jnp.zeros((), dtype))


def _floor(m):
    """``e^{-m}``, capped at ``e^{L/2}`` (module docstring)."""
    cap = 0.5 * float(np.log(np.finfo(m.dtype).max))
    return jnp.exp(jnp.minimum(-m, cap))


def matrix_memory_step(state: MatrixMemoryState, q_t, k_t, v_t, i_t, log_f_t):
    """One token of the stabilized recurrence (module docstring).

    Args:
        state: `MatrixMemoryState` before the token.
        q_t: query ``(P,)``.
        k_t: key ``(P,)`` (already scaled).
        v_t: value ``(P,)``.
        i_t: input gate pre-activation ``ĩ_t`` (scalar): ``i_t = exp(ĩ_t)``.
        log_f_t: ``log f_t`` (scalar).

    Returns:
        ``(new_state, h̃_t (P,))``.

    Examples:
        >>> import jax.numpy as jnp
        >>> s = matrix_memory_initial_state(2, jnp.float32)
        >>> q = k = jnp.array([1.0, 0.0])
        >>> s, h = matrix_memory_step(s, q, k, jnp.array([3.0, 4.0]), 0.0, -0.1)
        >>> h.tolist()                      # C q / max(|n q|, 1) = v (k.q) / 1
        [3.0, 4.0]
    """
    cov, norm, m = state
    m_new = jnp.maximum(log_f_t + m, i_t)
    f = jnp.exp(log_f_t + m - m_new)
    i = jnp.exp(i_t - m_new)
    cov = f * cov + i * jnp.outer(v_t, k_t)
    norm = f * norm + i * k_t
    den = jnp.maximum(jnp.abs(norm @ q_t), _floor(m_new))
    return MatrixMemoryState(cov, norm, m_new), (cov @ q_t) / den


def matrix_memory_recurrent(q, k, v, i_pre, log_f, state: MatrixMemoryState):
    """One head over a sequence by `jax.lax.scan` of `matrix_memory_step`.

    Args:
        q: queries ``(T, P)``.
        k: keys ``(T, P)``.
        v: values ``(T, P)``.
        i_pre: input gate pre-activations ``(T,)``.
        log_f: log forget gates ``(T,)``.
        state: `MatrixMemoryState` before the first token.

    Returns:
        ``(final_state, h̃ (T, P))``.
    """
    def step(s, xs):
        return matrix_memory_step(s, *xs)

    return jax.lax.scan(step, state, (q, k, v, i_pre, log_f))


def matrix_memory_parallel(q, k, v, i_pre, log_f, state: MatrixMemoryState):
    """One head over a sequence from the ``T x T`` log gate matrix (module docstring): the
    same numbers as `matrix_memory_recurrent`, ``O(T^2)`` memory.

    Args:
        q: queries ``(T, P)``.
        k: keys ``(T, P)``.
        v: values ``(T, P)``.
        i_pre: input gate pre-activations ``(T,)``.
        log_f: log forget gates ``(T,)``.
        state: `MatrixMemoryState` before the first token.

    Returns:
        ``(final_state, h̃ (T, P))``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 5, 2))
        >>> i_pre, log_f = jnp.linspace(-1, 1, 5), -jnp.linspace(0.1, 1, 5)
        >>> s0 = matrix_memory_initial_state(2, q.dtype)
        >>> par = matrix_memory_parallel(q, k, v, i_pre, log_f, s0)[1]
        >>> rec = matrix_memory_recurrent(q, k, v, i_pre, log_f, s0)[1]
        >>> bool(jnp.allclose(par, rec, rtol=1e-5, atol=1e-6))
        True
    """
    t_len = q.shape[0]
    cov0, norm0, m0 = state
    cum = jnp.cumsum(log_f)  # F_t
    causal = jnp.tril(jnp.ones((t_len, t_len), bool))
    gates = jnp.where(causal, cum[:, None] - cum[None, :] + i_pre[None, :], -jnp.inf)
    prior = cum + m0  # the carried state's log weight
    m = jnp.maximum(jnp.max(gates, axis=1), prior)
    weights = jnp.exp(gates - m[:, None])
    prior_weight = jnp.exp(prior - m)
    scores = (q @ k.T) * weights
    num = scores @ v + prior_weight[:, None] * (q @ cov0.T)
    dot = jnp.sum(scores, axis=1) + prior_weight * (q @ norm0)
    h = num / jnp.maximum(jnp.abs(dot), _floor(m))[:, None]
    last, last_prior = weights[-1], prior_weight[-1]
    final = MatrixMemoryState((v * last[:, None]).T @ k + last_prior * cov0,
                              last @ k + last_prior * norm0, m[-1])
    return final, h


def matrix_memory_chunked(q, k, v, i_pre, log_f, state: MatrixMemoryState,
                          chunk_size: int):
    """One head by `matrix_memory_parallel` within chunks of ``chunk_size`` steps and a
    scan over the chunks: the same numbers, ``O(T L)`` memory.

    Args:
        q: queries ``(T, P)``.
        k: keys ``(T, P)``.
        v: values ``(T, P)``.
        i_pre: input gate pre-activations ``(T,)``.
        log_f: log forget gates ``(T,)``.
        state: `MatrixMemoryState` before the first token.
        chunk_size: ``L``.

    Returns:
        ``(final_state, h̃ (T, P))``.
    """
    return scan_chunks(lambda s, *xs: matrix_memory_parallel(*xs, s), state,
                       (q, k, v, i_pre, log_f), chunk_size)
