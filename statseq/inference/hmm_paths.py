"""Kernels behind `hmm_viterbi` and `hmm_posterior_sample`: max-product and FFBS.

Viterbi reduces to two pieces:

1. a **pointer table** ``P[t, j]``, ``t = 0, ..., T-2``: the state at ``t`` chosen when
   the state at ``t+1`` is ``j``, ``P[t, j] = argmax_i (delta_t[i] + log A_t[i, j])``
   (ties to the lowest ``i``), where ``delta`` is the max-product message;
2. **backtracking** ``z_{T-1} = last``, ``z_t = P[t, z_{t+1}]``.

Posterior sampling (forward filtering, backward sampling) filters once, then draws
``z_t | z_{t+1}`` backwards by the inverse CDF of ``w_i = f_t(i) A_t[i, z_{t+1}]`` with
one uniform per step, drawn for all steps at once: the backward scan carries one integer
and reads one row of ``A^T`` per step. (An earlier version drew the whole ``(T-1, K)``
pointer table by an exponential race (``T K`` exponentials, a ``(T, K, K)`` table) and
backtracked it in blocks; this takes 0.45-0.65 of its time in same-round runs:
benchmarks/RESULTS.md, "HMM paths".) If every product ``f_t(i) A_t[i, j]``
of the realized ``j`` underflowed to zero the draw would fall to state ``K-1``.

For Viterbi, sequential work can be cut by **blocking** the time axis into ``C`` chunks
of ``L`` steps (``C L >= T - 1``, ``L`` about ``sqrt(T)``, padded in front with steps that
change nothing):

* backtracking: every chunk follows its pointers for all ``K`` possible states after its
  end at once (one ``(C, K)`` gather per step, ``L`` steps), then a scan over the ``C``
  chunks, from the last, picks which of the ``K`` chunk paths is taken;
* Viterbi's forward pass (``blocked=True``; not the default, see
  `BLOCKED_VITERBI_BY_DEFAULT`): every chunk but the first starts
  from a flat message and all chunks run their ``L`` steps at once; then each chunk
  restarts from its predecessor's end message, again all at once, until no chunk start
  changes bit for bit. A max-product chain forgets its start after a few steps (the
  max-plus products become rank one), so this usually takes two sweeps; at the fixed
  point every message is the one the sequential scan computes, bit for bit (the same
  operations on the same values), so the path is identical, ties included. Without a
  fixed point after `MAX_PASSES` sweeps (a chain that never forgets, such as ``A = I``)
  the chunk starts are corrected one chunk after the other (sequential cost). A last
  sweep records the pointers.

By default Viterbi runs one step at a time: on CPU, for ``K <= PACKED_MAX_STATES`` on a
tuple of ``K`` scalars with the ``K`` pointers of a step packed into one int32 and
backtracking by shift and mask (`_viterbi_packed`), for `ROWS_STATES` as an unrolled pass
over the rows (`_viterbi_step`; other backends keep the previous step); both compute the
same numbers as ``jnp.max``/``jnp.argmax``, so the path is the same bit for bit.
``sweeps=True`` (`viterbi`, `posterior_sample`) runs the forward pass, the backtracking
and the backward draws by sweeps over blocks (`statseq.inference.sweeps.sweep_scan`: the
max-product message forgets its start, and back-pointer chains, or sampling chains
sharing their uniforms, merge), again the identical path; on CPU it measured slower than
the sequential scans at every ``K`` and ``T`` tried, so it is not a default
(`VITERBI_SWEEP_MIN_STEPS`).

All messages are shifted to a maximum of zero at every step, so float32 keeps its
resolution. The functions take already checked arrays (`statseq.inference.hmm` checks
shapes and dtypes); they are traced inside the caller's ``jax.jit``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from statseq.inference._backend import backend_kind

#: sequences shorter than this run unblocked (the scans are short anyway)
MIN_BLOCKED_STEPS = 256
#: the largest number of states whose Viterbi forward pass is blocked by default (at
#: K = 16 the sequential scan measured faster on CPU)
BLOCKED_VITERBI_MAX_STATES = 4
#: whether `viterbi` blocks by default. Off: in same-round timings on a 2-core CPU
#: (benchmarks/RESULTS.md, "HMM paths") the blocked forward pass and backtracking were
#: 2.5x (K=2, T=10^6) slower than the plain step-by-step scan, which is therefore the default
BLOCKED_VITERBI_BY_DEFAULT = False
#: sweeps over all chunks before the blocked Viterbi falls back to one sequential scan
MAX_PASSES = 6


def chunk_length(num_steps: int) -> int:
    """The chunk length ``L`` for ``num_steps`` transitions: about ``sqrt(num_steps)``,
    which balances the ``L``-step passes over all chunks against the ``C``-step scans
    over chunk boundaries.

    Args:
        num_steps: the number of transitions ``T - 1``.

    Returns:
        ``L >= 8``.

    Examples:
        >>> chunk_length(10**6 - 1)
        1000
    """
    return max(8, math.isqrt(max(num_steps - 1, 0)) + 1)


def _argmax_rows(scores):
    """``(max, argmax)`` over axis -2 of ``scores`` ``(..., K, K)``, ties to the lowest
    index, as one unrolled pass of elementwise maxima (no ``(K, K)`` reduction tree)."""
    num = scores.shape[-2]
    best = scores[..., 0, :]
    arg = jnp.zeros(best.shape, jnp.int32)
    for i in range(1, num):
        s = scores[..., i, :]
        better = s > best
        best = jnp.where(better, s, best)
        arg = jnp.where(better, jnp.int32(i), arg)
    return best, arg


def _take(table, index):
    """``out[c, m] = table[c, index[c, m]]`` for ``table`` ``(C, K)`` and ``index``
    ``(C, M)``: a chain of selects for small ``K`` (cheaper than a gather on CPU),
    ``take_along_axis`` otherwise."""
    num = table.shape[-1]
    if num > 8:
        return jnp.take_along_axis(table, index, axis=-1)
    out = jnp.broadcast_to(table[:, :1], index.shape)
    for k in range(1, num):
        out = jnp.where(index == k, table[:, k:k + 1], out)
    return out


def _shift(x):
    """``x - max(x)`` over the last axis (max-product messages are defined up to a
    constant)."""
    return x - jnp.max(x, axis=-1, keepdims=True)


# ------------------------------------------------------------------------------------------
# backtracking


def _pad_front(x, pad, value):
    if pad == 0:
        return x
    fill = jnp.broadcast_to(value, (pad,) + x.shape[1:]).astype(x.dtype)
    return jnp.concatenate([fill, x])


def backtrack(pointers, last, *, blocked: bool = True):
    """Follow ``z_t = pointers[t, z_{t+1}]`` back from ``z_{T-1} = last``.

    Args:
        pointers: ``(T-1, K)`` int32.
        last: scalar int32, the state at ``T-1``.
        blocked: blocked (chunks at once) when ``T - 1 >= MIN_BLOCKED_STEPS``, else one
            step at a time.

    Returns:
        ``(T,)`` int32 path.
    """
    num_steps, num_states = pointers.shape
    if num_steps == 0:
        return last[None]
    if not blocked or num_steps < MIN_BLOCKED_STEPS:
        def step(state_next, pointers_t):
            state = pointers_t[state_next]
            return state, state

        _, states = jax.lax.scan(step, last, pointers, reverse=True)
        return jnp.concatenate([states, last[None]])
    length = chunk_length(num_steps)
    num_chunks = -(-num_steps // length)
    pad = num_chunks * length - num_steps
    ident = jnp.arange(num_states, dtype=jnp.int32)
    table = _pad_front(pointers, pad, ident).reshape(num_chunks, length, num_states)
    table = jnp.swapaxes(table, 0, 1)  # (L, C, K): step l of every chunk

    # every chunk, for every state k after its end, follows its own pointers back
    def inside(cur, pointers_l):  # cur (C, K): the state at step l+1 per hypothesis
        state = _take(pointers_l, cur)
        return state, state

    start = jnp.broadcast_to(ident, (num_chunks, num_states))
    firsts, paths = jax.lax.scan(inside, start, table, reverse=True)  # paths (L, C, K)

    # which hypothesis each chunk takes: the state after chunk c is the first of chunk c+1
    def pick(after, firsts_c):
        return firsts_c[after], after

    _, chosen = jax.lax.scan(pick, last, firsts, reverse=True)  # (C,)
    num_chunks_l = paths.shape[0] * paths.shape[1]
    states = _take(paths.reshape(num_chunks_l, num_states),
                   jnp.broadcast_to(chosen, paths.shape[:2]).reshape(num_chunks_l, 1))
    states = states.reshape(paths.shape[:2])  # (L, C)
    states = jnp.swapaxes(states, 0, 1).reshape(-1)[pad:]
    return jnp.concatenate([states, last[None]])


# ------------------------------------------------------------------------------------------
# Viterbi


def _viterbi_sequential(delta0, log_fixed, log_per_step, ll_rest):
    """The max-product scan, one step at a time (`_viterbi_step`): ``(delta_last,
    pointers)``."""
    return jax.lax.scan(_viterbi_step(log_fixed, ll_rest.shape[1]), delta0,
                        (ll_rest, log_per_step))


def _viterbi_blocked(delta0, log_fixed, log_per_step, ll_rest):
    num_steps, num_states = ll_rest.shape
    length = chunk_length(num_steps)
    num_chunks = -(-num_steps // length)
    pad = num_chunks * length - num_steps
    dtype = ll_rest.dtype
    # padded steps in front leave the message unchanged (and point to the same state)
    real = _pad_front(jnp.ones((num_steps,), bool), pad, False)
    real = jnp.swapaxes(real.reshape(num_chunks, length), 0, 1)  # (L, C)
    ll = _pad_front(ll_rest, pad, jnp.zeros((), dtype))
    ll = jnp.swapaxes(ll.reshape(num_chunks, length, num_states), 0, 1)  # (L, C, K)
    if log_per_step is None:
        log_a = None
    else:
        log_a = _pad_front(log_per_step, pad, jnp.zeros((), dtype))
        log_a = jnp.swapaxes(
            log_a.reshape(num_chunks, length, num_states, num_states), 0, 1)

    def pick(log_a_l):
        return log_fixed if log_a_l is None else log_a_l

    states = jnp.arange(num_states, dtype=jnp.int32)

    def inside(delta, xs):
        real_l, ll_l, log_a_l = xs
        a = pick(log_a_l)
        best, arg = _argmax_rows(delta[:, :, None] + a)
        new = jnp.where(real_l[:, None], _shift(best + ll_l), delta)
        return new, jnp.where(real_l[:, None], arg, states)

    def sweep(starts):  # the messages at the chunk ends, from the given chunk starts
        ends, _ = jax.lax.scan(lambda d, xs: (inside(d, xs)[0], None), starts,
                               (real, ll, log_a))
        return ends

    # speculate: every chunk but the first starts from a flat message; then each chunk
    # restarts from its predecessor's end until no start changes (bit for bit)
    def cond(carry):
        _, done, passes = carry
        return ~done & (passes < MAX_PASSES)

    def body(carry):
        starts, _, passes = carry
        ends = sweep(starts)
        new = jnp.concatenate([delta0[None], ends[:-1]])
        return new, jnp.all(new == starts), passes + 1

    first = jnp.concatenate([delta0[None], jnp.zeros((num_chunks - 1, num_states), dtype)])
    starts, done, _ = jax.lax.while_loop(cond, body, (first, jnp.asarray(False), 0))

    # no fixed point within MAX_PASSES (a chain that never forgets, e.g. A = I): correct
    # the starts chunk by chunk, in order (as slow as one sequential scan; skipped when done)
    def fix(carry):
        c, starts = carry
        xs = jax.tree.map(lambda x: x[:, c - 1], (real, ll, log_a))
        end, _ = jax.lax.scan(lambda d, x: (inside(d[None], jax.tree.map(
            lambda v: v[None], x))[0][0], None), starts[c - 1], xs)
        return c + 1, starts.at[c].set(end)

    _, starts = jax.lax.while_loop(lambda cs: ~done & (cs[0] < num_chunks), fix, (1, starts))
    ends, pointers = jax.lax.scan(inside, starts, (real, ll, log_a))  # (L, C, K)
    return ends[-1], jnp.swapaxes(pointers, 0, 1).reshape(-1, num_states)[pad:]


# ------------------------------------------------------------------------------------------
# by sweeps over blocks (`statseq.inference.sweeps`, CPU)

#: on CPU, Viterbi's forward pass and backtracking run by sweeps from ``min T`` steps
#: for up to ``max K`` states: ``((max K, min T), ...)``. Empty: in paired runs on the
#: 2-core CPU the sweeps were slower than the sequential scans at every measured ``K``
#: and ``T`` (benchmarks/RESULTS.md, "HMM paths", fourth round): after the scalar /
#: unrolled steps below a Viterbi step costs ~11 ns (K=2) to ~220 ns (K=16), about what
#: one step vectorized over the blocks costs, so two sweeps cannot win
VITERBI_SWEEP_MIN_STEPS: tuple[tuple[int, int], ...] = ()
#: on CPU, FFBS's backward draws run by sweeps from this many steps (as above; empty for
#: the same reason: 1.3-1.7x the sequential draws at K = 2 and 16, T = 10^3 - 10^6)
SAMPLE_SWEEP_MIN_STEPS: tuple[tuple[int, int], ...] = ()


def _use_sweeps(sweeps, num_timesteps: int, num_states: int, thresholds) -> bool:
    if sweeps is not None:
        return bool(sweeps)
    if backend_kind() != "cpu":
        return False
    for max_states, min_steps in thresholds:
        if num_states <= max_states:
            return num_timesteps >= min_steps
    return False


#: Viterbi's step is an unrolled pass over the rows (`_argmax_rows`) for this range of
#: state counts on CPU, ``jnp.max``/``jnp.argmax`` outside it and on other backends.
#: Paired runs against hmmlearn, same rounds (2-core CPU, load 6-7): K = 16, T = 10^3 /
#: 10^5: rows 1.19 / 1.06, reductions 1.57 / 1.26; K = 32, T = 10^4: 1.05 against 7.2;
#: K = 12: mixed (medians 2.37 against 3.24, minima 1.89 against 1.48); K = 5 and 8:
#: rows slower (3.9 against 2.2 at K = 5)
ROWS_STATES = (12, 32)


def _viterbi_step(log_fixed, num_states: int):
    """One max-product step: carry the shifted message ``delta_t - max(delta_t)``, emit
    the pointers ``argmax_i (delta_{t-1}[i] + log A[i, j])``. For `ROWS_STATES` an
    unrolled pass over the rows (`_argmax_rows`, no reduction in the loop body) with the
    same values as ``jnp.max``/``jnp.argmax`` bit for bit (maxima, sums and differences
    of the same numbers; ties to the lowest index; an all-NaN column after an impossible
    step gives pointer 0, as ``jnp.argmax``)."""
    rows = backend_kind() == "cpu" and ROWS_STATES[0] <= num_states <= ROWS_STATES[1]

    def step(delta, xs):
        ll_t, log_a_t = xs
        scores = delta[:, None] + (log_fixed if log_a_t is None else log_a_t)
        if not rows:
            new = jnp.max(scores, axis=0) + ll_t
            return new - jnp.max(new), jnp.argmax(scores, axis=0).astype(jnp.int32)
        best, arg = _argmax_rows(scores)
        new = best + ll_t
        top = new[0]
        for k in range(1, num_states):
            top = jnp.maximum(top, new[k])
        return new - top, arg

    return step


def _viterbi_sweeps(delta0, log_fixed, log_per_step, ll_rest):
    """`_viterbi_sequential` by sweeps: ``(delta_last, pointers)``, identical."""
    from statseq.inference.sweeps import sweep_scan

    pointers, _, delta_last = sweep_scan(_viterbi_step(log_fixed, ll_rest.shape[1]), delta0,
                                         (ll_rest, log_per_step), return_carry=True)
    return delta_last, pointers


#: up to this many states Viterbi runs on scalars with packed pointers (`_viterbi_packed`),
#: on CPU (measured there only; other backends keep the vector step): at K = 4 the scalar
#: loop body is no longer fused by XLA:CPU and costs 30x
PACKED_MAX_STATES = 3


def _bits(num_states: int) -> int:
    return max(1, (num_states - 1).bit_length())


def _packed_step(log_fixed, num_states: int):
    """`_viterbi_sequential`'s step on ``K`` scalars (the message as a tuple: every
    operation of the loop body is a scalar one, which XLA:CPU runs with no vector
    bookkeeping), its ``K`` pointers packed into one int32 (``_bits(K)`` bits each).
    Bit for bit the same maxima, sums and differences, ties to the lowest index."""
    bits = _bits(num_states)

    def step(delta, xs):
        ll_t, log_a_t = xs
        log_a = log_fixed if log_a_t is None else log_a_t
        new, code = [], jnp.int32(0)
        for j in range(num_states):
            best, arg = delta[0] + log_a[0, j], jnp.int32(0)
            for i in range(1, num_states):
                score = delta[i] + log_a[i, j]
                better = score > best
                best = jnp.where(better, score, best)
                arg = jnp.where(better, jnp.int32(i), arg)
            new.append(best + ll_t[j])
            code = code | (arg << (bits * j)) if j else arg
        top = new[0]
        for j in range(1, num_states):
            top = jnp.maximum(top, new[j])
        return tuple(n - top for n in new), code

    return step


def _unpack(code, state, num_states: int):
    """The pointer of ``state`` in a packed ``code`` (`_packed_step`)."""
    bits = _bits(num_states)
    return (code >> (bits * state)) & ((1 << bits) - 1)


#: steps of `_packed_step` per loop iteration of the forward pass (``K -> S``; their codes
#: packed into one int32, ``S K _bits(K) <= 32``) and packed codes per iteration of the
#: backtracking. One step per iteration leaves XLA:CPU's while loop (~11 ns an iteration)
#: as the cost at ``K = 2``; a larger body falls off a cliff (unfused: 2-20x). Same-process
#: runs, K = 2, T = 10^6 against hmmlearn (2-core CPU, quiet): one step 1.22-1.33; 2, 4, 8
#: steps 1.01-1.08, 0.95-0.99, 0.88-1.07 (8 is best on jax 0.10 and worse than 4 on jax
#: 0.12); 10-15 steps 2.0-2.5. K = 3: 2 steps 0.86-0.98 against 0.89-1.16, 3 steps 1.04,
#: 5 steps 15.6. The forward pass is ~3/4 of the time; backtracking gains from 8 steps an
#: iteration on both versions.
PACKED_GROUP = {1: 4, 2: 4, 3: 2}
PACKED_BACK_GROUP = 2


def _grouped_step(step, group: int, width: int):
    """``group`` calls of a packed ``step`` per call, their codes ``width`` bits apart in
    one int32 (the first step in the lowest bits); ``xs`` leaves carry a leading
    ``group`` axis."""

    def run(delta, xs):
        code = None
        for s in range(group):
            delta, c = step(delta, jax.tree.map(lambda v, s=s: v[s], xs))
            code = c if s == 0 else code | (c << (width * s))
        return delta, code

    return run


def _viterbi_packed(delta0, log_fixed, log_per_step, ll_rest, sweeps: bool):
    """Viterbi for ``K <= PACKED_MAX_STATES``: the forward pass on scalars with packed
    pointers (`_packed_step`), `PACKED_GROUP` steps per loop iteration, then backtracking
    by shifts and masks of the packed codes (no gather), ``PACKED_BACK_GROUP`` codes per
    iteration; the first ``(T - 1) mod (S G)`` steps one at a time. Both passes by sweeps
    (`statseq.inference.sweeps`) when ``sweeps``. The path is `_viterbi_sequential`'s,
    identical."""
    from statseq.inference.sweeps import sweep_scan

    num_steps, num_states = ll_rest.shape
    step = _packed_step(log_fixed, num_states)
    group, back_group = PACKED_GROUP[num_states], PACKED_BACK_GROUP
    width = _bits(num_states) * num_states
    xs = (ll_rest, log_per_step)
    head = (num_steps % (group * back_group)) if num_steps >= group * back_group else num_steps
    xs_head = jax.tree.map(lambda v: v[:head], xs)
    xs_body = jax.tree.map(lambda v: v[head:].reshape(-1, group, *v.shape[1:]), xs)
    init = tuple(delta0[k] for k in range(num_states))
    delta, codes_head = jax.lax.scan(step, init, xs_head)
    grouped = _grouped_step(step, group, width)
    sweeps = sweeps and num_steps > head
    if sweeps:
        codes, _, delta_last = sweep_scan(grouped, delta, xs_body, return_carry=True)
    else:
        delta_last, codes = jax.lax.scan(grouped, delta, xs_body)
    last = jnp.argmax(jnp.stack(delta_last)).astype(jnp.int32)

    def back(state_next, code):
        state = _unpack(code, state_next, num_states)
        return state, state

    def back_grouped(state, codes_g):  # codes_g (back_group,): back_group * group steps
        out = [None] * (back_group * group)
        for g in reversed(range(back_group)):
            for s in reversed(range(group)):
                state = _unpack(codes_g[g] >> (width * s), state, num_states)
                out[g * group + s] = state
        return state, jnp.stack(out)

    codes = codes.reshape(-1, back_group)
    if sweeps:
        states, _, first = sweep_scan(back_grouped, last, codes, reverse=True,
                                      return_carry=True)
    else:
        first, states = jax.lax.scan(back_grouped, last, codes, reverse=True)
    _, states_head = jax.lax.scan(back, first, codes_head, reverse=True)
    return jnp.concatenate([states_head, states.reshape(-1), last[None]])


def _gather(row, index):
    """``row[index]`` for a ``(K,)`` row and a scalar index: a chain of selects for small
    ``K`` (cheaper than a gather once vmapped over blocks on CPU)."""
    num = row.shape[0]
    if num > 8:
        return row[index]
    out = row[0]
    for k in range(1, num):
        out = jnp.where(index == k, row[k], out)
    return out


def _backtrack_sweeps(pointers, last):
    """`backtrack` by sweeps backward in time: the integer chains from different guessed
    ends merge with the survivor paths."""
    from statseq.inference.sweeps import sweep_scan

    def step(state_next, pointers_t):
        state = _gather(pointers_t, state_next)
        return state, state

    states, _ = sweep_scan(step, last, pointers, reverse=True)
    return jnp.concatenate([states, last[None]])


def viterbi(pi, fixed, per_step, ll, *, blocked=None, sweeps=None):
    """The Viterbi path of checked inputs (see `statseq.inference.hmm.hmm_viterbi`).

    Args:
        pi: ``(K,)``.
        fixed: ``(K, K)`` or ``None``.
        per_step: ``(T-1, K, K)`` or ``None`` (exactly one of the two is given).
        ll: ``(T, K)``.
        blocked: force (``True``) or forbid (``False``) the blocked forward pass;
            ``None`` chooses by ``K`` and ``T``.
        sweeps: force (``True``) or forbid (``False``) the forward pass and
            backtracking by sweeps (`statseq.inference.sweeps`; identical path);
            ``None``: on CPU from `VITERBI_SWEEP_MIN_STEPS` (and not when ``blocked``).

    Returns:
        ``(T,)`` int32 states.
    """
    num_timesteps, num_states = ll.shape
    if blocked is None:
        blocked = (BLOCKED_VITERBI_BY_DEFAULT and num_states <= BLOCKED_VITERBI_MAX_STATES
                   and num_timesteps - 1 >= MIN_BLOCKED_STEPS)
    log_fixed = None if fixed is None else jnp.log(fixed)
    log_per_step = None if per_step is None else jnp.log(per_step)
    delta0 = _shift(jnp.log(pi) + ll[0])
    if num_timesteps == 1:
        return jnp.argmax(delta0).astype(jnp.int32)[None]
    use_sweeps = not blocked and _use_sweeps(sweeps, num_timesteps, num_states,
                                             VITERBI_SWEEP_MIN_STEPS)
    if not blocked and num_states <= PACKED_MAX_STATES and backend_kind() == "cpu":
        return _viterbi_packed(delta0, log_fixed, log_per_step, ll[1:], use_sweeps)
    if use_sweeps:
        delta_last, pointers = _viterbi_sweeps(delta0, log_fixed, log_per_step, ll[1:])
        return _backtrack_sweeps(pointers, jnp.argmax(delta_last).astype(jnp.int32))
    run = _viterbi_blocked if blocked else _viterbi_sequential
    delta_last, pointers = run(delta0, log_fixed, log_per_step, ll[1:])
    last = jnp.argmax(delta_last).astype(jnp.int32)
    return backtrack(pointers, last, blocked=blocked)


# ------------------------------------------------------------------------------------------
# forward filtering, backward sampling


def _inverse_cdf(weights, u):
    """``#{i < K-1 : w_0 + ... + w_i <= u (w_0 + ... + w_{K-1})}`` for ``weights``
    ``(..., K)``: the inverse-CDF draw from ``w / sum(w)`` with the uniform ``u``, the
    partial sums taken left to right (a state of weight zero is never drawn, a uniform of
    0 gives the first state of positive weight)."""
    num = weights.shape[-1]
    sums = [weights[..., 0]]
    for i in range(1, num):
        sums.append(sums[-1] + weights[..., i])
    target = u * sums[-1]
    state = jnp.zeros(jnp.shape(target), jnp.int32)
    for i in range(num - 1):
        state = state + (sums[i] <= target).astype(jnp.int32)
    return state


def _sample_packed(filtered, fixed, per_step, uniforms, last):
    """`posterior_sample`'s backward draws for ``K <= PACKED_MAX_STATES``: the draw for
    every possible ``z_{t+1} = j`` at every step at once (`_inverse_cdf` of
    ``f_t * A_t[:, j]`` at ``u_t``: the same products, partial sums and comparisons as
    the step-by-step draw, so the same draws), packed into one int32 per step like
    Viterbi's pointers, then a backward chain of shifts and masks (no gather, no float
    work in the loop)."""
    num_states = filtered.shape[1]
    bits = _bits(num_states)
    code = None
    for j in range(num_states):
        column = fixed[:, j] if per_step is None else per_step[:, :, j]
        draw = _inverse_cdf(filtered[:-1] * column, uniforms)
        code = draw if code is None else code | (draw << (bits * j))

    def back(state_next, code_t):
        state = _unpack(code_t, state_next, num_states)
        return state, state

    _, states = jax.lax.scan(back, last, code, reverse=True)
    return jnp.concatenate([states, last[None]])


def posterior_sample(filtered, fixed, per_step, key, *, sweeps=None):
    """One path from ``p(z | y)`` given the filtered probabilities (FFBS with inverse-CDF
    backward draws).

    ``z_{T-1}`` is a categorical draw from ``filtered[-1]`` (``key``'s first split);
    then, from ``t = T-2`` down, ``z_t`` is the inverse-CDF draw (`_inverse_cdf`) from
    ``w_i = f_t(i) A_t[i, z_{t+1}]`` with one uniform ``u_t`` per step, all ``T-1``
    uniforms drawn at once from ``key``'s second split. The backward scan carries one
    integer and reads one row of ``A^T`` per step.

    Args:
        filtered: ``(T, K)`` ``p(z_t | y_{<=t})``.
        fixed: ``(K, K)`` or ``None``.
        per_step: ``(T-1, K, K)`` or ``None``.
        key: a ``jax.random`` key; the same key gives the same path.
        sweeps: force (``True``) or forbid (``False``) the backward draws by sweeps
            (`statseq.inference.sweeps`: chains from different guessed ``z_{t+1}``
            merge, as they share the uniforms; the identical path); ``None``: on CPU
            from `SAMPLE_SWEEP_MIN_STEPS`.

    Returns:
        ``(T,)`` int32 states.
    """
    num_timesteps, num_states = filtered.shape
    key_last, key_noise = jax.random.split(key)
    last = jax.random.categorical(key_last, jnp.log(filtered[-1])).astype(jnp.int32)
    if num_timesteps == 1:
        return last[None]
    uniforms = jax.random.uniform(key_noise, (num_timesteps - 1,), filtered.dtype)
    fixed_t = None if fixed is None else fixed.T

    def step(state_next, xs):
        filtered_t, u_t, a_t = xs
        column = fixed_t[state_next] if a_t is None else a_t[:, state_next]
        state = _inverse_cdf(filtered_t * column, u_t)
        return state, state

    xs = (filtered[:-1], uniforms, per_step)
    use_sweeps = _use_sweeps(sweeps, num_timesteps, num_states, SAMPLE_SWEEP_MIN_STEPS)
    if not use_sweeps and num_states <= PACKED_MAX_STATES and backend_kind() == "cpu":
        return _sample_packed(filtered, fixed, per_step, uniforms, last)
    if use_sweeps:
        from statseq.inference.sweeps import sweep_scan

        states, _ = sweep_scan(step, last, xs, reverse=True)
    else:
        _, states = jax.lax.scan(step, last, xs, reverse=True)
    return jnp.concatenate([states, last[None]])
