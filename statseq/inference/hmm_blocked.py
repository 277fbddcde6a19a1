"""Blocked (two-level) forward filter and backward pass of an HMM, for few states.

The same recursions as `statseq.inference.hmm` (same normalizations, same outputs), laid
out so that a CPU spends its time on arithmetic rather than on the per-step overhead of a
``lax.scan``. Time is cut into ``M`` chunks of ``L`` steps (``M * L >= T``; the tail is
padded with rows of zeros, likelihood one, and identity transitions, which change
nothing before ``T``). With ``l_t = exp(ll[t] - max_k ll[t, k])`` and the chunk transfer
matrix

    G_c = prod_{t in chunk c} diag(l_t) A_t,

the predicted message at the start of chunk ``c + 1`` is ``alpha_c G_c`` (normalized)
and the backward message ``v_s = l_s * beta_s`` at the start of chunk ``c`` is
``G_c v_e`` (rescaled). Three scans, two of them over ``L`` steps working on all chunks
at once:

1. ``G_c`` for every chunk: ``K`` forward filters started from the unit vectors, each row
   normalized at every step (its log scale ``S_c[i]`` kept), so ``G_c = diag(exp S_c) X_c``;
2. the boundary messages by a scan over the ``M`` chunks, combining the rows in log space
   (``log alpha[i] + S_c[i]``, shifted by its maximum) so that no chunk underflows;
3. the per-step messages from the correct boundary messages, exactly the sequential
   recursion of `statseq.inference.hmm` (``_condition``'s max-shift, masked rows of zeros,
   an impossible observation scoring -inf with the message kept), on all chunks at once.

The backward pass reuses ``X_c`` and ``S_c`` (``G_c v = exp(S_c) * (X_c v)``). Pass 1 costs
``K^3`` per step against the sequential ``K^2``, so the layout pays for small ``K`` only;
`statseq.inference.hmm` chooses it (see ``use_blocked``).

Reverse-mode differentiable (the logs of zero are guarded so that dead rows carry zero
gradient) and ``vmap``-able like the sequential code.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

MAX_BLOCKED_STATES = 4  # pass 1 is K^3 per step: beyond this the sequential scan wins
MIN_BLOCKED_STEPS = 64  # shorter sequences: a few scan steps either way


def use_blocked(num_timesteps: int, num_states: int) -> bool:
    """Whether the blocked layout is the faster one on CPU for this ``(T, K)``."""
    return num_states <= MAX_BLOCKED_STATES and num_timesteps >= MIN_BLOCKED_STEPS


def chunk_length(num_timesteps: int) -> int:
    """``L`` about ``sqrt(T / 2)``: two L-step scans and one T/L-step scan balance."""
    return max(1, int(round(math.sqrt(num_timesteps / 2))))


def _rowvec_mat(x, a):
    """``x @ a`` over the last axis of ``x`` (a row vector times a matrix), fused for small K.

    ``a`` is ``(K, K)`` or has the leading axes of ``x``.
    """
    return jnp.sum(x[..., :, None] * a, axis=-2)


def _mat_colvec(a, v):
    """``a @ v`` for column vectors ``v`` over the last axis."""
    return jnp.sum(a * v[..., None, :], axis=-1)


def _safe_log(x):
    """``log x`` with ``log 0 = -inf`` and a zero (not NaN) gradient there."""
    positive = x > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), -jnp.inf)


def _shifted_exp(w):
    """``exp(w - max w)`` over the last axis; all ``-inf`` gives zeros (no NaN)."""
    top = jnp.max(w, axis=-1, keepdims=True)
    top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
    return jnp.exp(w - top)


class _Layout:
    """The padded, chunked (L, M, ...) views of the inputs shared by both passes."""

    def __init__(self, fixed, per_step, ll, block: int):
        num_t, k = ll.shape
        self.num_t, self.k, self.block = num_t, k, block
        self.num_chunks = m = -(-num_t // block)
        pad = m * block - num_t
        dtype = ll.dtype
        shift = jax.lax.stop_gradient(jnp.max(ll, axis=1))
        shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
        lik = jnp.exp(ll - shift[:, None])
        lik = jnp.concatenate([lik, jnp.ones((pad, k), dtype)])
        shift = jnp.concatenate([shift, jnp.zeros((pad,), dtype)])
        # (L, M, ...): scan over the position in the chunk, all chunks at once
        self.lik = jnp.swapaxes(lik.reshape(m, block, k), 0, 1)
        self.shift = jnp.swapaxes(shift.reshape(m, block), 0, 1)
        t_index = jnp.arange(m * block).reshape(m, block).T  # (L, M)
        self.has_next = t_index < num_t - 1  # a transition leaves step t
        if per_step is not None:
            eye = jnp.broadcast_to(jnp.eye(k, dtype=dtype), (pad + 1, k, k))
            trans = jnp.concatenate([per_step, eye]).reshape(m, block, k, k)
            self.trans = jnp.swapaxes(trans, 0, 1)  # (L, M, K, K)
        else:
            self.trans = None
        self.fixed = fixed

    def xs(self):
        return (self.lik, self.shift, self.has_next, self.trans)

    def unchunk(self, x):
        """(L, M, ...) -> (T, ...)."""
        x = jnp.swapaxes(x, 0, 1)
        return x.reshape((-1,) + x.shape[2:])[: self.num_t]


def _transfer(lay: _Layout):
    """Pass 1: ``X`` ``(M, K, K)`` (rows normalized) and ``S`` ``(M, K)`` with
    ``G_c = diag(exp S_c) X_c``."""
    k, m, dtype = lay.k, lay.num_chunks, lay.lik.dtype
    # An observation impossible under every state is skipped by the sequential filter
    # (message kept): the transfer matrix skips it too.
    dead_row = jnp.all(lay.lik == 0, axis=-1, keepdims=True)

    def step(carry, xs):
        x, s = carry
        lik_t, dead_t, has_next, a_t = xs
        lik_t = jnp.where(dead_t, 1.0, lik_t)
        u = x * lik_t[:, None, :]
        norm = jnp.sum(u, axis=-1)
        alive = norm > 0
        u = u / jnp.where(alive, norm, 1.0)[..., None]
        s = s + _safe_log(norm)
        moved = _rowvec_mat(u, lay.fixed if a_t is None else a_t[:, None])
        x = jnp.where(has_next[:, None, None], moved, u)
        return (x, s), None

    x0 = jnp.broadcast_to(jnp.eye(k, dtype=dtype), (m, k, k))
    s0 = jnp.zeros((m, k), dtype)
    (x, s), _ = jax.lax.scan(step, (x0, s0), (lay.lik, dead_row, lay.has_next, lay.trans))
    return x, s


def _chunk_starts(pi, x, s):
    """Pass 2: the predicted message at the start of every chunk, ``(M, K)``."""

    def step(alpha, xs):
        x_c, s_c = xs
        w = _shifted_exp(_safe_log(alpha) + s_c)
        nxt = _rowvec_mat(w, x_c)
        total = jnp.sum(nxt)
        ok = total > 0
        nxt = jnp.where(ok, nxt / jnp.where(ok, total, 1.0), alpha)
        return nxt, alpha

    _, starts = jax.lax.scan(step, pi, (x, s))
    return starts


def blocked_forward(pi, fixed, per_step, ll, block: int):
    """Forward messages of `statseq.inference.hmm`'s filter, chunked.

    Returns:
        ``(log_normalizers (T,), predicted (T, K), filtered (T, K), (lay, x, s))``, the
        last item for `blocked_backward`.
    """
    lay = _Layout(fixed, per_step, ll, block)
    x, s = _transfer(lay)
    starts = _chunk_starts(pi, x, s)

    def step(pred, xs):
        lik_t, shift_t, has_next, a_t = xs
        u = pred * lik_t
        norm = jnp.sum(u, axis=-1)
        possible = norm > 0
        filt = jnp.where(possible[:, None], u / jnp.where(possible, norm, 1.0)[:, None], pred)
        log_norm = _safe_log(norm) + shift_t
        moved = _rowvec_mat(filt, lay.fixed if a_t is None else a_t)
        nxt = jnp.where(has_next[:, None], moved, filt)
        return nxt, (log_norm, pred, filt)

    _, (log_norms, predicted, filtered) = jax.lax.scan(step, starts, lay.xs())
    return (
        lay.unchunk(log_norms),
        lay.unchunk(predicted),
        lay.unchunk(filtered),
        (lay, x, s),
    )


def blocked_backward(state):
    """Backward messages ``v_t`` of `statseq.inference.hmm`'s smoother, chunked.

    ``v_t`` is proportional to ``l_t * beta_t`` (``beta_{T-1} = 1``), rescaled to a maximum
    of one, for ``t = 0, ..., T-1``.
    """
    lay, x, s = state
    k, dtype = lay.k, lay.lik.dtype

    # Pass 2 backwards: v at the start of chunk c is G_c v_(start of c + 1).
    def chunk_step(v_next, xs):
        x_c, s_c = xs
        w = _safe_log(_mat_colvec(x_c, v_next)) + s_c
        v = _shifted_exp(w)
        v = jnp.where(jnp.any(v > 0), v, jnp.ones_like(v))
        return v, v_next

    _, ends = jax.lax.scan(chunk_step, jnp.ones(k, dtype), (x, s), reverse=True)

    def step(v_next, xs):
        lik_t, _, has_next, a_t = xs
        a = lay.fixed if a_t is None else a_t
        beta = jnp.where(has_next[:, None], _mat_colvec(a, v_next), v_next)
        beta = beta / jnp.max(beta, axis=-1, keepdims=True)
        v = lik_t * beta
        v = v / jnp.max(v, axis=-1, keepdims=True)
        return v, v

    _, v = jax.lax.scan(step, ends, lay.xs(), reverse=True)
    return lay.unchunk(v)
