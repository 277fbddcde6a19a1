"""Blocked forward and backward HMM recursions for few states and long sequences (CPU).

The sequential scans of `statseq.inference.hmm` take one loop iteration per time step; at
6 and 7 states, stacking the ``(T, K)`` messages, XLA's CPU loop costs some 500 to 700 ns
per iteration (against 50 to 90 ns at 2 to 5 states). Here the ``T`` steps are cut into
``C`` chunks of ``L`` steps
(``L ~ sqrt(T)``) and every pass is a loop of about ``sqrt(T)`` iterations whose body is
vectorized across the chunks:

1. *chunk transfer matrices*: for each chunk ``c`` of steps ``t_c .. t_c + L - 1``,
   ``P_c = diag(l_{t_c}) A_{t_c} diag(l_{t_c + 1}) ... A_{t_c + L - 2} diag(l_{t_c + L - 1})``
   with ``l_t = exp(ll[t] - max_k ll[t, k])``, rescaled to sum one after every step (the
   scale cancels);
2. *chunk boundaries*: ``alpha_{t_{c+1}} = (alpha_{t_c} P_c / sum(alpha_{t_c} P_c))
   A_{t_c + L - 1}``, a short scan over the ``C`` chunks;
3. *per-step messages*: the sequential recursion of `hmm_filter` (the same normalization,
   log normalizers and impossible-observation rule), run for all chunks at once from their
   boundary messages.

The backward messages of `hmm_smoother` are blocked the same way with
``G_c = prod_{s in c} A_s diag(l_{s+1})`` and ``beta_{t_c} ~ G_c beta_{t_{c+1}}``.

Every ``K x K`` product is written as broadcast multiply-adds of ``(C,)`` vectors, with
chunks on the last (contiguous) axis: XLA:CPU runs a batched ``dot_general`` on tiny
matrices as one library call per matrix, which made an earlier ``einsum`` version of this
scheme 3 to 4.5 times slower than the sequential scan.

Pass 3 is exact given the boundary messages, and these equal the sequential ones up to
rounding (about 1e-15 relative in float64), unless a chunk's product is zero or not
finite (an observation impossible under every reachable state, or underflow): then the
boundary messages are taken from the sequential scan instead (`jax.lax.cond` on the
``(C, K)`` boundary messages only; under `jax.vmap` with a batched predicate both branches
run). Gradients flow through every pass.

These are private kernels; `hmm_smoother_by_gradient` picks them on CPU for 6 or 7 states
and ``num_timesteps >= BLOCKED_MIN_STEPS`` (`use_blocked`), where they run about 3 times
faster than the sequential scans; at 2 to 5 states they only tie with the sequential scan.
`hmm_smoother` runs by sweeps there instead (faster still; `use_blocked`)
and takes these only when asked (``blocked=True``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from statseq.inference._backend import backend_kind

#: Numbers of states (smallest, largest) that take the blocked path by default on CPU.
BLOCKED_STATES = (6, 7)
#: Shortest sequence that takes the blocked path by default.
BLOCKED_MIN_STEPS = 2048


def use_blocked(num_timesteps: int, num_states: int, backend: str | None = None) -> bool:
    """Whether the blocked path is the default: on CPU only, for
    ``BLOCKED_STATES[0] <= num_states <= BLOCKED_STATES[1]`` and
    ``num_timesteps >= BLOCKED_MIN_STEPS``. `hmm_smoother_by_gradient` follows it;
    `hmm_smoother` no longer does by default: on one sequence it runs both passes by
    sweeps over blocks there instead (`statseq.inference.sweeps`, `hmm._use_backward_sweeps`:
    6 and 7 states from 256 steps), measured faster than the blocked passes (paired,
    float64, load about 7: ``K = 6, T = 10^5`` 0.19 against 0.23 of the sequential
    smoother's time, ``K = 7`` 0.30 against 0.48, ``K = 6, T = 4096`` 0.17-0.23 against
    0.38-0.40), and under `jax.vmap` it runs the vmapped sequential passes.

    Measured (`benchmarks/RESULTS.md`, "HMM filter and smoother at the compiled floor"):
    at 6 and 7 states XLA:CPU's sequential scan is slow when it stacks the ``(T, K)``
    messages (about 500 ns per step at ``K = 6``, against 80 ns when only the
    log-likelihood is kept), and the blocked smoother runs about 3 times faster; at 2 to
    5 states the blocked passes only tie with the sequential scan (``K = 2``: 0.9 to 1.1
    times its time at ``T = 10^4 .. 10^6``), and from 8 states the unrolled sequential
    scan is faster. `hmm_filter` stays sequential: the blocked filter is 3 times faster
    when its messages are used, but 1.5 times slower when only the log-likelihood is.

    Args:
        num_timesteps: ``T``.
        num_states: ``K``.
        backend: a platform name, or ``None`` for JAX's default backend.

    Returns:
        ``True`` for the blocked path.
    """
    return (
        backend_kind(backend) == "cpu"
        and BLOCKED_STATES[0] <= num_states <= BLOCKED_STATES[1]
        and num_timesteps >= BLOCKED_MIN_STEPS
    )


def block_length(num_steps: int) -> int:
    """Steps per chunk: ``ceil(sqrt(num_steps))`` (at least 1)."""
    return max(1, math.isqrt(max(num_steps - 1, 0)) + 1)


def _to_blocks(x, length: int, chunks: int, fill):
    """``(N, *rest)`` to ``(L, *rest, C)`` (chunk ``c`` holds steps ``c L .. c L + L - 1``),
    padded at the end with ``fill`` (broadcast to ``rest``)."""
    num = x.shape[0]
    rest = x.shape[1:]
    pad = chunks * length - num
    if pad:
        filler = jnp.broadcast_to(jnp.asarray(fill, x.dtype), (pad, *rest))
        x = jnp.concatenate([x, filler])
    return jnp.moveaxis(x.reshape(chunks, length, *rest), 0, -1)


def _from_blocks(x, num: int):
    """Inverse of `_to_blocks`: ``(L, *rest, C)`` to ``(num, *rest)``."""
    x = jnp.moveaxis(x, -1, 0)
    return x.reshape(-1, *x.shape[2:])[:num]


def _entries(fixed, a_t, num_states: int):
    """``A[i][j]`` as nested lists: scalars of ``fixed`` or ``(C,)`` rows of a ``(K, K, C)``
    slice."""
    a = fixed if a_t is None else a_t
    return [[a[i, j] for j in range(num_states)] for i in range(num_states)]


def _blocked_transitions(fixed, per_step, length: int, chunks: int, num: int):
    """``(L, K, K, C)`` blocks of the per-step matrices (identity padding), or ``None``."""
    if per_step is None:
        return None
    k = per_step.shape[-1]
    return _to_blocks(per_step[:num], length, chunks, jnp.eye(k, dtype=per_step.dtype))


def _chunk_products(lik, trans, fixed, p0):
    """Pass 1: every chunk's product ``P <- P A_s diag(l_s)`` from ``p0``, rescaled to sum
    one after every step; ``p0`` and the result are nested lists ``P[i][j]`` of ``(C,)``."""
    k = len(p0)

    def step(p, xs):
        l_s, a_s = xs
        a = _entries(fixed, a_s, k)
        new = [[sum(p[i][m] * a[m][j] for m in range(k)) * l_s[j] for j in range(k)]
               for i in range(k)]
        total = sum(new[i][j] for i in range(k) for j in range(k))
        scale = 1.0 / total
        return tuple(tuple(new[i][j] * scale for j in range(k)) for i in range(k)), None

    products, _ = jax.lax.scan(step, p0, (lik, trans))
    return products


def _identity(k: int, chunks: int, dtype):
    one, zero = jnp.ones((chunks,), dtype), jnp.zeros((chunks,), dtype)
    return tuple(tuple(one if i == j else zero for j in range(k)) for i in range(k))


def _stack(nested):
    """Nested lists ``P[i][j]`` of ``(C,)`` to ``(C, K, K)``."""
    return jnp.moveaxis(jnp.stack([jnp.stack(row) for row in nested]), -1, 0)


def _forward_boundaries(pi, fixed, lik, trans):
    """Passes 1 and 2 of `filter_blocked`: every chunk's first predicted message ``(C, K)``,
    the chunk products ``(C, K, K)`` and whether every boundary normalizer is positive and
    finite (the blocked boundaries are then exact up to rounding)."""
    k = lik.shape[1]
    # pass 1: P_c = diag(l_{t_c}) A_{t_c} diag(l_{t_c + 1}) ... diag(l_{t_c + L - 1}), so
    # that the last filtered message of chunk c is alpha_{t_c} P_c normalized
    first = tuple(tuple(lik[0, i] if i == j else jnp.zeros_like(lik[0, i]) for j in range(k))
                  for i in range(k))
    products = _chunk_products(lik[1:], None if trans is None else trans[:-1], fixed, first)
    last_trans = None if trans is None else jnp.moveaxis(trans[-1], -1, 0)  # (C, K, K)

    # pass 2: every chunk's first message, alpha_{t_{c+1}} = (alpha_{t_c} P_c / norm) A;
    # the predicted message is not renormalized (as in the sequential scan, whose
    # log-likelihood, and its gradient, are then the same functions of A off the simplex)
    def boundary(alpha, xs):
        m, a_last = xs
        end = _vec_mat(alpha, m)
        norm = jnp.sum(end)
        return _vec_mat(end / norm, _pick(fixed, a_last)), (alpha, norm)

    # the last chunk's product only checks its normalizer
    products = _stack(products)
    _, (starts, norms) = jax.lax.scan(boundary, pi, (products, last_trans))
    return starts, products, jnp.all(jnp.isfinite(norms) & (norms > 0))


def filter_blocked(pi, fixed, per_step, ll, length: int | None = None):
    """The blocked forward filter; the same `HMMFilterResult` as ``hmm._filter``.

    Args:
        pi: ``(K,)``.
        fixed: ``(K, K)`` or ``None``.
        per_step: ``(T-1, K, K)`` or ``None`` (exactly one of ``fixed`` and ``per_step``).
        ll: ``(T, K)``.
        length: steps per chunk (default `block_length`).

    Returns:
        An `HMMFilterResult`.
    """
    from statseq.core.recurrence import pairwise_sum
    from statseq.inference.hmm import HMMFilterResult, _rows_times

    num_timesteps, k = ll.shape
    length = block_length(num_timesteps) if length is None else int(length)
    chunks = -(-num_timesteps // length)
    dtype = ll.dtype

    llb = _to_blocks(ll, length, chunks, 0.0)  # (L, K, C)
    shift = jax.lax.stop_gradient(jnp.max(llb, axis=1))  # (L, C)
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    lik = jnp.exp(llb - shift[:, None])
    trans = _blocked_transitions(fixed, per_step, length, chunks, num_timesteps - 1)

    starts, _, ok = _forward_boundaries(pi, fixed, lik, trans)
    # A zero or non-finite normalizer (an observation impossible under every reachable
    # state, or underflow) takes the first messages from the sequential scan (exact).
    starts = jax.lax.cond(
        ok, lambda _: starts,
        lambda _: _sequential_starts(pi, fixed, per_step, ll, length, chunks), None,
    )

    # pass 3: the recursion of `hmm_filter` from every chunk's first message at once, with
    # its rule for a zero normalizer (keep the message); the logarithms and the predicted
    # messages are vectorized afterwards (a log inside the loop body doubles its time)
    step = _filter_step(fixed, k)

    alpha0 = tuple(starts[:, i] for i in range(k))
    _, out = jax.lax.scan(step, alpha0, (lik, trans))  # (L, K + 1, C)
    out = _from_blocks(out, num_timesteps)  # (T, K + 1)
    filtered, norm = out[:, :k], out[:, k]
    log_normalizers = jnp.log(norm) + _from_blocks(shift, num_timesteps)
    if fixed is not None:
        predicted = _rows_times(filtered[:-1], fixed)
    else:
        predicted = sum(filtered[:-1, i:i + 1] * per_step[:, i] for i in range(k))
    return HMMFilterResult(
        marginal_log_lik=pairwise_sum(log_normalizers),
        log_normalizers=log_normalizers,
        predicted_probs=jnp.concatenate([pi[None], predicted]).astype(dtype),
        filtered_probs=filtered,
    )


def _pick(fixed, a_t):
    return fixed if a_t is None else a_t


def _vec_mat(x, m):
    """``x @ m`` for ``(K,)`` and ``(K, K)`` as a sum of rows (no library call)."""
    return sum(x[i] * m[i] for i in range(m.shape[0]))


def backward_blocked(fixed, per_step, lik, length: int | None = None):
    """The blocked backward pass of ``hmm._smoother``: ``v`` ``(T-1, K)`` with
    ``v_s = l_{s+1} beta_{s+1} / max`` and ``beta_s = A_s v_s / max``, ``beta_{T-1} = 1``.

    Args:
        fixed: ``(K, K)`` or ``None``.
        per_step: ``(T-1, K, K)`` or ``None``.
        lik: ``(T-1, K)`` max-shifted likelihoods of steps ``1 .. T-1``.
        length: steps per chunk (default `block_length`).

    Returns:
        ``v`` ``(T-1, K)``.
    """
    num, k = lik.shape
    length = block_length(num) if length is None else int(length)
    chunks = -(-num // length)
    likb = _to_blocks(lik, length, chunks, 1.0)  # identity steps at the end
    trans = _blocked_transitions(fixed, per_step, length, chunks, num)

    products = _stack(_chunk_products(likb, trans, fixed, _identity(k, chunks, lik.dtype)))

    def boundary(beta, g):
        prev = _mat_vec(g, beta)
        top = jnp.max(prev)
        return prev / top, (beta, top)

    _, (ends, tops) = jax.lax.scan(boundary, jnp.ones((k,), lik.dtype), products,
                                   reverse=True)
    # ends[c]: the message after chunk c; the first chunk's product only checks its scale.
    # A zero or non-finite one takes the messages from the sequential scan (exact).
    ok = jnp.all(jnp.isfinite(tops) & (tops > 0))
    ends = jax.lax.cond(
        ok, lambda _: ends,
        lambda _: _sequential_ends(fixed, per_step, lik, length, chunks), None,
    )

    def step(beta, xs):
        l_s, a_s = xs
        v = [l_s[j] * beta[j] for j in range(k)]
        scale = 1.0 / _max(v)
        v = [x * scale for x in v]
        a = _entries(fixed, a_s, k)
        nb = [sum(a[i][j] * v[j] for j in range(k)) for i in range(k)]
        scale = 1.0 / _max(nb)
        return tuple(x * scale for x in nb), jnp.stack(v)

    beta0 = tuple(ends[:, j] for j in range(k))
    _, v = jax.lax.scan(step, beta0, (likb, trans), reverse=True)
    return _from_blocks(v, num)


def _filter_step(fixed, k: int):
    """One step of `hmm_filter`'s recursion on a tuple of K per-chunk message entries, with
    its rule for a zero normalizer (keep the message); returns the next predicted entries and
    the stacked filtered entries and normalizer."""

    def step(alpha, xs):
        l_t, a_t = xs
        u = [alpha[i] * l_t[i] for i in range(k)]
        norm = sum(u)
        possible = norm > 0
        scale = 1.0 / jnp.where(possible, norm, 1.0)
        filt = [jnp.where(possible, x * scale, a) for x, a in zip(u, alpha, strict=True)]
        a = _entries(fixed, a_t, k)
        nxt = tuple(sum(filt[i] * a[i][j] for i in range(k)) for j in range(k))
        return nxt, jnp.stack([*filt, norm])

    return step


def _padded_chunks(x, length: int, chunks: int, fill):
    """``(N, *rest)`` to ``(C, L, *rest)``, padded at the end with ``fill``."""
    pad = chunks * length - x.shape[0]
    if pad:
        filler = jnp.broadcast_to(jnp.asarray(fill, x.dtype), (pad, *x.shape[1:]))
        x = jnp.concatenate([x, filler])
    return x.reshape(chunks, length, *x.shape[1:])


def _chunked_steps(values, per_step, length: int, chunks: int, fill):
    """Per-step values ``(T, K)`` and per-step transitions ``(T, K, K)`` or None in chunks,
    the values padded with ``fill`` and the transitions with identity steps."""
    k = values.shape[1]
    trc = None
    if per_step is not None:
        trc = _padded_chunks(per_step, length, chunks, jnp.eye(k, dtype=per_step.dtype))
    return _padded_chunks(values, length, chunks, fill), trc


def _sequential_starts(pi, fixed, per_step, ll, length: int, chunks: int):
    """The forward message at every chunk's first step, from the sequential recursion of
    `hmm_filter` (the same operations), keeping nothing per step: under `jax.vmap` both
    branches of the fallback's `cond` run, and a scan that stacks ``(T, K)`` messages
    costs several times more than one that does not."""
    from statseq.inference.hmm import _condition

    llc, trc = _chunked_steps(ll, per_step, length, chunks, 0.0)

    def chunk(alpha, xs):
        def step(alpha, xs):
            ll_t, a_t = xs
            filtered, _ = _condition(alpha, ll_t)
            return filtered @ _pick(fixed, a_t), None

        end, _ = jax.lax.scan(step, alpha, xs)
        return end, alpha

    _, starts = jax.lax.scan(chunk, pi, (llc, trc))
    return starts


def _sequential_ends(fixed, per_step, lik, length: int, chunks: int):
    """The backward message after every chunk, from the sequential recursion of
    `hmm_smoother` (identity steps pad the last chunk), keeping nothing per step."""
    k = lik.shape[1]
    likc, trc = _chunked_steps(lik, per_step, length, chunks, 1.0)

    def chunk(beta, xs):
        def step(beta_next, xs):
            lik_next, a_t = xs
            v = lik_next * beta_next
            v = v / jnp.max(v)
            beta = v @ _pick(fixed, a_t).T
            return beta / jnp.max(beta), None

        start, _ = jax.lax.scan(step, beta, xs, reverse=True)
        return start, beta

    _, ends = jax.lax.scan(chunk, jnp.ones((k,), lik.dtype), (likc, trc), reverse=True)
    return ends


def _mat_vec(m, x):
    """``m @ x`` for ``(K, K)`` and ``(K,)`` as a sum of columns (no library call)."""
    return sum(m[:, j] * x[j] for j in range(m.shape[1]))


def _max(xs):
    out = xs[0]
    for x in xs[1:]:
        out = jnp.maximum(out, x)
    return out


def gradient_blocked(pi, fixed, per_step, ll, length: int | None = None):
    """The gradient path of ``hmm_smoother_by_gradient`` through the blocked filter:
    ``(log p(y), filtered (T, K), d log p / d e (T-1, K), d log p / d ll (T, K))`` with
    ``e_t`` a zero perturbation of the predicted message ``alpha_{t+1}``.

    The filter's normalizers are held constant (as in ``hmm._linearized_log_marginal``), so
    every pass is linear in the messages, and ``log p(y)`` depends on chunk ``c``'s
    inputs only through its last predicted message ``n_c`` (pass 3's carry, the next
    chunk's first message): by the chain rule across chunks,
    ``d log p / d n_c = w_{c+1} / <w_{c+1}, n_c>`` with ``w_c`` proportional to
    ``d sum f_{T-1} / d alpha_{t_c}``, which comes from the chunk products of pass 1,
    ``w_c ~ P_c A_{t_{c+1} - 1} w_{c+1}`` (a scan over the chunks). From these, the reverse
    pass of pass 3 runs for all chunks at once; it is written out (the transpose of
    pass 3's linear step: ``g_t = scale_t l_t (A_t g_{t+1})``, ``d/d ll[t] = f_t (A_t
    g_{t+1})``) rather than left to `jax.grad`, whose saved residuals made it 2 times
    slower. It equals reverse-mode differentiation of the sequential linearized filter to
    rounding (tested to 1e-12). A zero or non-finite boundary normalizer takes the
    sequential path (``jax.lax.cond``). Only first derivatives come out:
    ``hmm_smoother_by_gradient`` gives its outputs the derivatives of the sequential path
    (``jax.custom_jvp``).

    Args:
        pi: ``(K,)``.
        fixed: ``(K, K)`` or ``None``.
        per_step: ``(T-1, K, K)`` or ``None``.
        ll: ``(T, K)``, ``T >= 2``.
        length: steps per chunk (default `block_length`).

    Returns:
        ``(value, filtered, grad_predicted, grad_ll)``.
    """
    from statseq.core.recurrence import pairwise_sum
    from statseq.inference.hmm import _sequential_gradient_parts

    num_timesteps, k = ll.shape
    length = block_length(num_timesteps) if length is None else int(length)
    chunks = -(-num_timesteps // length)
    dtype = ll.dtype

    llb = _to_blocks(ll, length, chunks, 0.0)  # (L, K, C)
    shift = jnp.max(llb, axis=1)  # (L, C)
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    lik = jnp.exp(llb - shift[:, None])
    trans = _blocked_transitions(fixed, per_step, length, chunks, num_timesteps - 1)
    starts, products, ok = _forward_boundaries(pi, fixed, lik, trans)

    def fast(_):
        # w_{C-1}: d sum f_{T-1} / d alpha_{t_{C-1}} from the last chunk's steps (its
        # product carries padding steps), then w_c ~ P_c A_last w_{c+1}
        first = (chunks - 1) * length
        last_lik = lik[: num_timesteps - first, :, chunks - 1]

        def back(u, xs):
            l_s, a_s = xs
            u = l_s * (_pick(fixed, a_s) @ u)
            return u / jnp.max(u), None

        tail_trans = None if per_step is None else per_step[first:]
        w_last, _ = jax.lax.scan(back, last_lik[-1], (last_lik[:-1], tail_trans),
                                 reverse=True)

        def across(w, xs):
            p_c, a_last = xs
            u = _mat_vec(p_c, _mat_vec(_pick(fixed, a_last), w))
            return u / jnp.max(u), w

        last_trans = None
        if trans is not None:
            last_trans = jnp.moveaxis(trans[-1], -1, 0)[:chunks - 1]
        _, ws = jax.lax.scan(across, w_last, (products[:chunks - 1], last_trans),
                             reverse=True)  # ws[c] = w_{c+1}, c < C-1

        step = _filter_step(fixed, k)

        alpha0 = tuple(starts[:, i] for i in range(k))
        ends, out = jax.lax.scan(step, alpha0, (lik, trans))  # (L, K + 1, C)

        # the reverse pass of pass 3 (normalizers constant): g, the cotangent of the
        # predicted message after step t, starts at d log p / d n_c = w_{c+1} / <w_{c+1},
        # n_c> at each chunk's end, and the last step's filtered message gets 1 / sum f
        g_end = jnp.zeros((chunks, k), dtype)
        if chunks > 1:
            n = jnp.stack(ends, axis=1)[:-1]  # (C - 1, K)
            g_end = g_end.at[:-1].set(ws / jnp.sum(n * ws, axis=1, keepdims=True))
        last = num_timesteps - 1 - first
        f_last = out[last, :k, chunks - 1]
        seed = jnp.zeros((length, k, chunks), dtype).at[last, :, chunks - 1].set(
            1.0 / jnp.sum(f_last))

        def reverse(g, xs):
            l_t, a_t, norm, seed_t = xs
            a = _entries(fixed, a_t, k)
            gf = [sum(a[i][j] * g[j] for j in range(k)) + seed_t[i] for i in range(k)]
            possible = norm > 0
            scale = 1.0 / jnp.where(possible, norm, 1.0)
            back = tuple(x * scale * jnp.where(possible, l_t[i], 1.0)
                         for i, x in enumerate(gf))
            return back, jnp.stack([*g, *gf])

        g0 = tuple(g_end[:, i] for i in range(k))
        _, cot = jax.lax.scan(reverse, g0, (lik, trans, out[:, k], seed), reverse=True)
        out = _from_blocks(out, num_timesteps)
        cot = _from_blocks(cot, num_timesteps)  # (T, 2K)
        filtered, norm = out[:, :k], out[:, k]
        grad_ll = jnp.where(norm[:, None] > 0, cot[:, k:] * filtered, 0.0)
        log_normalizers = jnp.log(norm) + _from_blocks(shift, num_timesteps)
        return pairwise_sum(log_normalizers), filtered, cot[:-1, :k], grad_ll

    return jax.lax.cond(
        ok, fast, lambda _: _sequential_gradient_parts(pi, fixed, per_step, ll), None)
