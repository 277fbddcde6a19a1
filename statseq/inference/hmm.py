"""Hidden Markov model inference: filtering, smoothing, Viterbi, sampling, prediction.

Pure array maths for a chain of discrete states ``z_t`` in ``{0, ..., K-1}`` (time is
0-based, ``t = 0, ..., T-1``),

    p(y_{0:T-1}, z_{0:T-1}) = pi[z_0] * prod_{t<T-1} A_t[z_t, z_{t+1}] * prod_t p(y_t | z_t),

given as three arrays, so that any emission model (Poisson, Gaussian, categorical, a neural
network) reaches this layer as a table of log-likelihoods:

- ``initial_probs`` ``(K,)``: ``pi[k] = p(z_0 = k)``.
- ``transition_matrix``: ``A[i, j] = p(z_{t+1} = j | z_t = i)`` (rows sum to one), either
  fixed, ``(K, K)``, or time-varying, ``(T-1, K, K)`` with ``A[t]`` the step from ``t``
  to ``t+1``. The number of axes (2 or 3) says which; any other shape is an error.
  `broadcast_transitions` turns a fixed matrix into the time-varying layout.
- ``log_likelihoods`` ``(T, K)``: ``ll[t, k] = log p(y_t | z_t = k)``. **A missing
  observation is a row of zeros** (likelihood one for every state): the step conditions on
  nothing and adds 0 to the log-likelihood. Masks reach this layer that way.

An HMM is a recurrent network whose hidden state is the normalized forward message,
``predicted_probs[t] = p(z_t | y_{<t})``, with the one-step predictive a mixture,

    p(y_t | y_{<t}) = sum_k p(z_t = k | y_{<t}) p(y_t | z_t = k).

Numerics: the forward messages are normalized at every step, with the shift
``c_t = max_k ll[t, k]`` so that ``exp(ll[t] - c_t) <= 1`` never overflows; the backward
messages are rescaled to a maximum of one; Viterbi and sampling work with logarithms.
Totals over time are balanced binary-tree sums (`pairwise_sum`), so float32 stays
accurate at 10^6 steps. Probabilities below the smallest normal float flush to zero; with
exact zeros in ``A`` a state whose filtered probability flushed to zero cannot be revived
by later data (the log-space twins in `statseq.inference.hmm_parallel` can).

Speed on CPU: with 8 to 32 states the forward and backward scans write their
matrix-vector products as sums of rows and run 4 steps per loop iteration (about 5 times
faster at 16 states; fewer states run fastest one step at a time), and the backward pass
exponentiates the likelihoods before its loop. The gradient path (`hmm_smoother_by_gradient`)
differentiates a filter whose normalizers are held constant (an exact rewrite), so that its
reverse pass is the scaled backward recursion. On CPU from `SWEEP_MIN_STEPS` (2^13) steps
`hmm_filter` runs by sweeps over blocks (`statseq.inference.sweeps`: about 0.8 T^0.42
blocks at once, equal to the sequential scan to rounding, sequential fallback for a chain that
never forgets; 0.12 to 0.84 of the sequential filter's time), and so does
`hmm_smoother_by_gradient` (both passes); `hmm_smoother`'s backward pass runs by sweeps at
6 or 7 states from 256 steps (`SWEEP_BACKWARD_STATES`, `SWEEP_BACKWARD_MIN_STEPS`; float32
up to 4 states), where both passes are 3 to 5 times faster, and at any number of states
from 2^16 steps (`SWEEP_BACKWARD_ANY_STATES_MIN_STEPS`; 0.82-0.94 of the sequential pass's
smoother time). On CPU, `statseq._compat.keep_large_buffers_in_heap` (applied on import)
keeps the per-call buffers of these long passes out of fresh ``mmap`` calls, which halved
the filter's time at 10^6 steps. Derivatives of every pass by
sweeps are the sequential scan's, and under `jax.vmap` up to `SWEEP_MAX_BATCH` sequences
sweep together (`statseq.inference.sweeps.with_sweep_rules`). The blocked two-level
recursions of `statseq.inference.hmm_blocked` (chunks of about ``sqrt(T)`` steps,
vectorized across chunks) remain the float32 gradient path's at 6 or 7 states from 2048
steps (`hmm_blocked.gradient_blocked`) and `blocked=True`'s elsewhere; in float64 the
gradient path follows the smoother's backward pass to the sweeps (0.82-1.13 of
forward-backward's time at 2 to 16 states, 300 to 10^5 steps, session 21). The GPU/TPU
path is unchanged.

Shapes are checked when traced (they are static); values (non-negative, rows summing to
one) are the caller's responsibility. The functions are not jitted themselves: wrap them,
or the code that calls them, in `jax.jit`.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.recurrence import pairwise_sum
from statseq.inference._backend import backend_kind


class HMMFilterResult(NamedTuple):
    """Output of `hmm_filter`.

    Attributes:
        marginal_log_lik: scalar ``log p(y_{0:T-1}) = sum_t log_normalizers[t]``.
        log_normalizers: ``(T,)`` one-step predictive log-densities
            ``log p(y_t | y_{<t})`` (0 at masked steps).
        predicted_probs: ``(T, K)`` ``p(z_t | y_{<t})``, the normalized forward message
            before step ``t`` (row 0 is ``initial_probs``).
        filtered_probs: ``(T, K)`` ``p(z_t | y_{<=t})``.
    """

    marginal_log_lik: Any
    log_normalizers: Any
    predicted_probs: Any
    filtered_probs: Any


class HMMPosterior(NamedTuple):
    """Output of `hmm_smoother` (and its gradient and parallel twins).

    Attributes:
        marginal_log_lik: scalar ``log p(y_{0:T-1})``.
        filtered_probs: ``(T, K)`` ``p(z_t | y_{<=t})``.
        smoothed_probs: ``(T, K)`` ``p(z_t | y_{0:T-1})``.
        expected_transitions: ``(K, K)`` expected transition counts
            ``sum_t p(z_t = i, z_{t+1} = j | y_{0:T-1})``, or ``(T-1, K, K)`` per step
            when asked with ``sum_transitions=False``.
        initial_probs: ``(K,)`` posterior of the first state, ``smoothed_probs[0]`` (the
            E-step statistic for the initial distribution).
    """

    marginal_log_lik: Any
    filtered_probs: Any
    smoothed_probs: Any
    expected_transitions: Any
    initial_probs: Any


# ------------------------------------------------------------------------------------------
# inputs


def _float_dtype(*arrays):
    dtype = jnp.result_type(*arrays)
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.result_type(float)


def _check_transitions(transition_matrix, num_steps: int, num_states: int, name: str):
    """Return ``(fixed, per_step)``: exactly one is an array, the other ``None``."""
    shape = transition_matrix.shape
    if transition_matrix.ndim == 2:
        if shape != (num_states, num_states):
            raise ValueError(
                f"a fixed {name} must have shape (num_states, num_states) = "
                f"({num_states}, {num_states}); got {shape}"
            )
        return transition_matrix, None
    if transition_matrix.ndim == 3:
        if shape != (num_steps, num_states, num_states):
            raise ValueError(
                f"a time-varying {name} must have shape ({num_steps}, {num_states}, "
                f"{num_states}) (one matrix per transition); got {shape}"
            )
        return None, transition_matrix
    raise ValueError(
        f"{name} must have 2 axes (fixed) or 3 axes (time-varying); got shape {shape}"
    )


def _prepare_inputs(initial_probs, transition_matrix, log_likelihoods):
    """Check shapes and cast to one float dtype.

    Returns:
        ``(initial_probs, fixed, per_step, log_likelihoods)`` where exactly one of
        ``fixed`` ``(K, K)`` and ``per_step`` ``(T-1, K, K)`` is not ``None``.
    """
    arrays = [jnp.asarray(a) for a in (initial_probs, transition_matrix, log_likelihoods)]
    dtype = _float_dtype(*arrays)
    pi, trans, ll = (a.astype(dtype) for a in arrays)
    if ll.ndim != 2:
        raise ValueError(
            f"log_likelihoods must have shape (num_timesteps, num_states); got {ll.shape}"
        )
    num_timesteps, num_states = ll.shape
    if num_timesteps < 1 or num_states < 1:
        raise ValueError(f"log_likelihoods must not be empty; got shape {ll.shape}")
    if pi.shape != (num_states,):
        raise ValueError(
            f"initial_probs must have shape (num_states,) = ({num_states},); got {pi.shape}"
        )
    fixed, per_step = _check_transitions(
        trans, num_timesteps - 1, num_states, "transition_matrix"
    )
    return pi, fixed, per_step, ll


def broadcast_transitions(transition_matrix, num_timesteps: int):
    """The time-varying layout ``(T-1, K, K)`` of a fixed or time-varying matrix.

    Args:
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying, with
            ``A[t][i, j] = p(z_{t+1} = j | z_t = i)``.
        num_timesteps: ``T``.

    Returns:
        ``(T-1, K, K)``: a fixed matrix repeated ``T-1`` times, a time-varying one as given.
    """
    a = jnp.asarray(transition_matrix)
    if a.ndim not in (2, 3):
        raise ValueError(
            "transition_matrix must have 2 axes (fixed) or 3 axes (time-varying); "
            f"got shape {a.shape}"
        )
    num_states = a.shape[-1]
    fixed, per_step = _check_transitions(a, num_timesteps - 1, num_states, "transition_matrix")
    if per_step is not None:
        return per_step
    return jnp.broadcast_to(fixed, (num_timesteps - 1, num_states, num_states))


def _pick(fixed, a_t):
    return fixed if a_t is None else a_t


# ------------------------------------------------------------------------------------------
# filtering


def _condition(probs, ll):
    """Bayes' rule with the max-shift: ``(probs * exp(ll) / norm, log norm)``."""
    shift = jax.lax.stop_gradient(jnp.max(ll))  # the value does not depend on the shift
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)  # every state impossible: ll = -inf
    unnormalized = probs * jnp.exp(ll - shift)
    norm = jnp.sum(unnormalized)
    # an observation impossible under every state scores log 0 = -inf; the message is then
    # kept (not 0/0 = NaN), so later steps stay finite and the total is -inf, not NaN
    possible = norm > 0
    filtered = jnp.where(possible, unnormalized / jnp.where(possible, norm, 1.0), probs)
    return filtered, jnp.log(norm) + shift


# From about 8 states on, XLA's CPU loop runs the step at about 1.5 us whatever its form
# (against some 50 ns for up to 6 states); written as K scalar-times-row products and
# unrolled 4 steps per iteration, it runs 2 to 4 times faster (benchmarks/RESULTS.md,
# "HMM filter and smoother at the compiled floor"). Below 8 states unrolling slows the
# loop down, and beyond 32 states the product is left to `@`.
UNROLLED_STATES = (8, 32)
UNROLL = 4


def _unrolled(num_states: int) -> bool:
    return UNROLLED_STATES[0] <= num_states <= UNROLLED_STATES[1]


def _vecmat(probs, a, unrolled: bool):
    """``probs @ a`` (a row vector times a matrix), as a sum of rows when ``unrolled``."""
    if not unrolled:
        return probs @ a
    return sum(probs[i] * a[i] for i in range(a.shape[0]))


def _matvec(a_transposed, v, unrolled: bool):
    """``a @ v`` (a matrix times a column vector) given ``a.T``, as a sum of ``a``'s
    columns (contiguous rows of ``a.T``) when ``unrolled``."""
    if not unrolled:
        return v @ a_transposed
    return sum(a_transposed[j] * v[j] for j in range(a_transposed.shape[0]))


def _use_blocked(blocked, ll) -> bool:
    if blocked is not None:
        return bool(blocked)
    from statseq.inference.hmm_blocked import use_blocked

    return use_blocked(*ll.shape)


def _sweep_step(fixed, num_states: int):
    """One filter step for `statseq.inference.sweeps` on likelihoods ``exp(ll - shift)``
    scaled outside the loop (an ``exp`` in XLA:CPU's loop body costs more than the rest
    of the step): carry the predicted message, emit ``(filtered, norm)`` (two outputs: a
    third, the predicted message, made the loop 1.4x slower; it is one product after
    it). Below 8 states the normalizer is a sum of ``K`` scalar slices and the product a
    sum of rows (no reduction or ``dot`` in the loop body); from 8 on, ``sum`` and ``@``
    (over all blocks, a matrix product; the sums of 16 slices compiled 3.5 s)."""
    small = num_states < UNROLLED_STATES[0]

    def step(predicted, xs):
        lik_t, a_t = xs
        joint = predicted * lik_t
        norm = sum(joint[k] for k in range(num_states)) if small else jnp.sum(joint)
        possible = norm > 0
        filtered = jnp.where(possible, joint * (1.0 / jnp.where(possible, norm, 1.0)),
                             predicted)
        return _vecmat(filtered, _pick(fixed, a_t), small), (filtered, norm)

    return step


def _smoother_sweep_step(fixed_t, num_states: int):
    """One step of `_smoother`'s backward recursion for `statseq.inference.sweeps`
    (``reverse=True``) on likelihoods exponentiated outside the loop: carry the rescaled
    ``beta_{t+1}``, emit ``v_t = l_{t+1} beta_{t+1} / max`` (one output; ``beta_t = A_t v_t /
    max`` is the carry). Below 8 states the maxima are chains of ``maximum`` over ``K``
    scalar slices and the product a sum of columns (no reduction or ``dot`` in the loop
    body); from 8 on ``max`` and ``@``, as in `_sweep_step`."""
    small = num_states < UNROLLED_STATES[0]

    def top(x):
        if not small:
            return jnp.max(x)
        out = x[0]
        for k in range(1, num_states):
            out = jnp.maximum(out, x[k])
        return out

    def step(beta_next, xs):
        lik_next, a_t = xs
        v = lik_next * beta_next
        v = v / top(v)
        beta = _matvec(_pick(fixed_t, a_t), v, small)
        return beta / top(beta), v

    return step


#: `_filter` runs by sweeps (`statseq.inference.sweeps`) on CPU from this many steps.
#: Measured (float64, min of 5, load ~2.5; `benchmarks/RESULTS.md`, "The HMM filter by
#: sweeps"): sweeps / sequential 0.7-1.4 at 2,000-8,000 steps (K = 2 to 64), 0.7-1.0 at
#: 16,000, and 0.16-0.8 at 10^5 (K = 6: 0.16).
SWEEP_MIN_STEPS = 2**13


def use_sweeps(num_timesteps: int, backend: str | None = None) -> bool:
    """Whether `hmm_filter` (and the filters built on it) runs by sweeps over blocks
    (`statseq.inference.sweeps`) by default: on CPU from `SWEEP_MIN_STEPS` steps.

    Args:
        num_timesteps: ``T``.
        backend: a platform name, or ``None`` for JAX's default backend.

    Returns:
        ``True`` for the sweeps.

    Examples:
        >>> use_sweeps(10**5, "cpu"), use_sweeps(100, "cpu"), use_sweeps(10**5, "gpu")
        (True, False, False)
    """
    return backend_kind(backend) == "cpu" and num_timesteps >= SWEEP_MIN_STEPS


#: float64: numbers of states (smallest, largest) whose smoother runs by sweeps on CPU (both
#: passes), from `SWEEP_BACKWARD_MIN_STEPS` steps: there XLA:CPU's sequential scans cost some
#: 400 ns a step; elsewhere the sequential backward pass ties with the sweeps (2 to 5
#: states) or beats them (8 states and more: the sweeps do twice its ``K^2`` work).
SWEEP_BACKWARD_STATES = (6, 7)
SWEEP_BACKWARD_MIN_STEPS = 256
#: float32: the backward pass by sweeps up to this many states from `SWEEP_MIN_STEPS` steps
#: (0.6-0.9 of the sequential pass's time at 2 to 4 states; a tie at 5 to 7, where the
#: float32 sequential scan is not slow)
SWEEP_BACKWARD_FLOAT32_STATES = 4
#: from this many steps the backward pass runs by sweeps on CPU whatever the number of states
#: and dtype: with blocks of `sweeps.default_block_length` (session 21) the sweeps took 0.82
#: to 0.94 of the sequential pass's smoother time at 2 to 16 states and 10^5 to 10^6 steps
#: (float64; float32 0.89-0.98), a tie at 3 x 10^4 (`benchmarks/RESULTS.md`, "Session 21")
SWEEP_BACKWARD_ANY_STATES_MIN_STEPS = 2**16


def _use_backward_sweeps(sweeps, ll) -> bool:
    """Whether `_smoother` runs its backward pass by sweeps (``sweeps=None``: the default)."""
    if sweeps is not None:
        return bool(sweeps) and ll.shape[0] > 1
    num_timesteps, num_states = ll.shape
    if backend_kind() != "cpu":
        return False
    if num_timesteps >= SWEEP_BACKWARD_ANY_STATES_MIN_STEPS and num_states > 1:
        return True
    if jnp.dtype(ll.dtype).itemsize < 8:
        return (num_states <= SWEEP_BACKWARD_FLOAT32_STATES
                and num_timesteps >= SWEEP_MIN_STEPS)
    return (SWEEP_BACKWARD_STATES[0] <= num_states <= SWEEP_BACKWARD_STATES[1]
            and num_timesteps >= SWEEP_BACKWARD_MIN_STEPS)


def _use_sweeps(sweeps, ll) -> bool:
    return use_sweeps(ll.shape[0]) if sweeps is None else bool(sweeps)


def _swept(pi, fixed, per_step, ll, batched=False) -> HMMFilterResult:
    """`_filter` by `statseq.inference.sweeps.sweep_scan`; ``batched``: ``pi``, ``per_step``
    and ``ll`` have a leading axis of sequences (``fixed`` is shared)."""
    from statseq.inference.sweeps import sweep_scan

    num_states = ll.shape[-1]
    shift = jnp.max(ll, axis=-1)
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)  # every state impossible
    # the transition out of the last step is never used: pad the per-step ones by one
    a = None if per_step is None else jnp.concatenate(
        [per_step, jnp.zeros(per_step.shape[:-3] + (1, num_states, num_states),
                             per_step.dtype)], axis=-3)
    (filtered, norms), _ = sweep_scan(_sweep_step(fixed, num_states), pi,
                                      (jnp.exp(ll - shift[..., None]), a), batched=batched)

    def finish(pi, per_step, filtered, norms, shift):
        log_normalizers = jnp.log(norms) + shift
        moved = (_rows_times(filtered[:-1], fixed) if per_step is None
                 else jnp.einsum("ti,tij->tj", filtered[:-1], per_step))
        return HMMFilterResult(pairwise_sum(log_normalizers), log_normalizers,
                               jnp.concatenate([pi[None], moved]), filtered)

    if not batched:
        return finish(pi, per_step, filtered, norms, shift)
    return jax.vmap(finish, in_axes=(0, None if per_step is None else 0, 0, 0, 0))(
        pi, per_step, filtered, norms, shift)


def _sequential(pi, fixed, per_step, ll) -> HMMFilterResult:
    return _filter(pi, fixed, per_step, ll, blocked=False, sweeps=False)


#: under `jax.vmap`, up to this many sequences sweep together (`_swept_with_rules`); more
#: run the vmapped sequential scan, which is already vectorized across them (100 sequences
#: of 1000 steps at 6 states: the batched sweeps 1.4-1.9x its time, vmapped sweeps 3.8-4.6x)
SWEEP_MAX_BATCH = 8


def _swept_with_rules(swept, sequential, shared: int = 1):
    """`statseq.inference.sweeps.with_sweep_rules` with the argument at ``shared`` (a
    transition matrix fixed in time) shared by a batch and at most `SWEEP_MAX_BATCH`
    sequences swept together."""
    from statseq.inference.sweeps import with_sweep_rules

    return with_sweep_rules(swept, sequential, shared=(shared,), max_batch=SWEEP_MAX_BATCH)


#: `_filter` by `statseq.inference.sweeps.sweep_scan` (equal to rounding)
_filter_by_sweeps = _swept_with_rules(_swept, _sequential)


def _filter(pi, fixed, per_step, ll, unrolled=None, rows=True,
            blocked=False, sweeps=None) -> HMMFilterResult:
    """``blocked``: ``True`` for `statseq.inference.hmm_blocked`, ``None`` for its default
    (`hmm_blocked.use_blocked`), ``False`` for the sequential scan. Otherwise ``sweeps``:
    ``True`` for `_filter_by_sweeps`, ``None`` for its default (`_use_sweeps`)."""
    if _use_blocked(blocked, ll):
        from statseq.inference.hmm_blocked import filter_blocked

        return filter_blocked(pi, fixed, per_step, ll)
    if _use_sweeps(sweeps, ll):
        return _filter_by_sweeps(pi, fixed, per_step, ll)
    unrolled = _unrolled(ll.shape[1]) if unrolled is None else unrolled
    filtered0, log_norm0 = _condition(pi, ll[0])

    def step(filtered_prev, xs):
        ll_t, a_prev = xs
        predicted = _vecmat(filtered_prev, _pick(fixed, a_prev), unrolled and rows)
        filtered, log_norm = _condition(predicted, ll_t)
        return filtered, (log_norm, predicted, filtered)

    _, (log_norms, predicted, filtered) = jax.lax.scan(
        step, filtered0, (ll[1:], per_step), unroll=UNROLL if unrolled else 1
    )
    log_normalizers = jnp.concatenate([log_norm0[None], log_norms])
    return HMMFilterResult(
        marginal_log_lik=pairwise_sum(log_normalizers),
        log_normalizers=log_normalizers,
        predicted_probs=jnp.concatenate([pi[None], predicted]),
        filtered_probs=jnp.concatenate([filtered0[None], filtered]),
    )


def hmm_filter(initial_probs, transition_matrix, log_likelihoods) -> HMMFilterResult:
    """Forward filter: the HMM as an RNN over the normalized forward message.

    With ``alpha_t = p(z_t | y_{<t})`` (``alpha_0 = pi``) and ``l_t = exp(ll[t])``,

        p(y_t | y_{<t}) = alpha_t . l_t,
        p(z_t | y_{<=t}) = alpha_t * l_t / (alpha_t . l_t),
        alpha_{t+1} = A_t^T p(z_t | y_{<=t}),

    computed with ``l_t`` scaled by ``exp(-max_k ll[t, k])`` (the scale is added back to the
    log normalizer), and the total summed as a balanced binary tree.

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying
            ``p(z_{t+1} = j | z_t = i)``.
        log_likelihoods: ``(T, K)`` ``log p(y_t | z_t = k)``; rows of zeros at masked steps.

    Returns:
        An `HMMFilterResult`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from statseq.inference.hmm import hmm_filter
        >>> pi = jnp.array([0.5, 0.5])
        >>> A = jnp.array([[0.9, 0.1], [0.2, 0.8]])
        >>> ll = jnp.log(jnp.array([[0.7, 0.1], [1.0, 1.0], [0.2, 0.6]]))  # step 1 masked
        >>> result = hmm_filter(pi, A, ll)
        >>> result.filtered_probs.shape, round(float(result.log_normalizers[1]), 6)
        ((3, 2), 0.0)
    """
    return _filter(*_prepare_inputs(initial_probs, transition_matrix, log_likelihoods))


# ------------------------------------------------------------------------------------------
# smoothing


_CHUNK = 256  # time steps per partial sum of the transition counts
# Up to this many states, the smoother's vectorized (T, K) x (K, K) products are written as
# broadcast multiply-adds: XLA:CPU runs them as elementwise loops, 4 to 6 times faster than
# its `dot` on a (T, 2) x (2, 2) product.
_SMALL_STATES = 6


def _rows_times(x, a):
    """``x @ a`` for ``x`` ``(N, K)`` and ``a`` ``(K, K)``, as a sum of ``K`` broadcast
    products when ``K <= _SMALL_STATES``."""
    if a.shape[0] > _SMALL_STATES:
        return x @ a
    return sum(x[:, i:i + 1] * a[i] for i in range(a.shape[0]))


def _sum_outer_products(left, right):
    """``sum_t left[t][:, None] * right[t][None, :]`` in chunks, then as a balanced tree.

    Each chunk is one small matrix product; the chunk totals are added pairwise, so the
    float32 error grows with log T rather than T.
    """
    num, k = left.shape
    pad = (-num) % _CHUNK
    left = jnp.concatenate([left, jnp.zeros((pad, k), left.dtype)]).reshape(-1, _CHUNK, k)
    right = jnp.concatenate([right, jnp.zeros((pad, k), right.dtype)]).reshape(-1, _CHUNK, k)
    if k <= _SMALL_STATES:  # a batched dot of tiny matrices is one library call per chunk
        partial_sums = jnp.sum(left[..., :, None] * right[..., None, :], axis=1)
    else:
        partial_sums = jnp.einsum("cti,ctj->cij", left, right)
    return pairwise_sum(jnp.moveaxis(partial_sums, 0, -1))


def _chunked_total(x):
    """``sum(x)`` of a ``(N,)`` vector as `_sum_outer_products` sums: chunks of `_CHUNK`
    steps (the last one shorter, no padding copy), then a balanced tree."""
    main = (x.shape[0] // _CHUNK) * _CHUNK
    parts = jnp.concatenate([x[:main].reshape(-1, _CHUNK).sum(axis=1), x[main:].sum()[None]])
    return pairwise_sum(parts)


def _small_posterior(filtered, v, fixed, transition_weights):
    """`_smoother`'s smoothed marginals and summed transition counts for a fixed matrix of
    at most `_SMALL_STATES` states, written over the ``K`` columns (``(T,)`` vectors) of the
    messages: on XLA:CPU a ``(T, K)`` array with ``K`` this small has reductions and
    broadcasts over its minor axis that do not vectorize (the same formulas on the columns
    took 0.3 of the time at ``K = 2``, ``T = 10^6``). Equal to the ``(T, K)`` form to
    rounding."""
    num_states = fixed.shape[0]
    f, cols, beta, norm = _column_messages(filtered, v, fixed)
    smoothed = jnp.concatenate([jnp.stack([f[i] * beta[i] / norm for i in range(num_states)],
                                          axis=1), filtered[-1:]])
    weighted = [f[i] / norm for i in range(num_states)]
    if transition_weights is not None:  # per-step weights of the pair counts
        w = jnp.asarray(transition_weights, filtered.dtype)
        weighted = [x * w for x in weighted]
    return smoothed, _summed_counts(fixed, weighted, cols)


def _column_messages(filtered, v, fixed):
    """The columns (``(T-1,)`` vectors) of the filtered messages ``f_t`` and of ``v``,
    ``beta_t = A v_t`` and the normalizers ``f_t . beta_t``, for the small-K paths."""
    k = fixed.shape[0]
    f = [filtered[:-1, i] for i in range(k)]
    cols = [v[:, j] for j in range(k)]
    beta = [sum(fixed[i, j] * cols[j] for j in range(k)) for i in range(k)]
    return f, cols, beta, sum(f[i] * beta[i] for i in range(k))


def _summed_counts(fixed, left, right):
    """``A * sum_t left_t right_t^T`` from ``K`` columns each, summed as `_chunked_total`."""
    k = fixed.shape[0]
    return fixed * jnp.stack([jnp.stack([_chunked_total(left[i] * right[j])
                                         for j in range(k)]) for i in range(k)])


def _backward(fixed_t, per_step_t, lik, unrolled: bool):
    """The sequential backward pass of `_smoother`: ``v`` ``(T-1, K)`` from the max-shifted
    likelihoods ``lik`` of steps ``1 .. T-1`` and the transposed transitions."""

    def step(beta_next, xs):
        lik_next, a_t = xs
        # v_j proportional to p(y_{t+1:T-1} | z_{t+1} = j) p(y_{t+1} | z_{t+1} = j)
        v = lik_next * beta_next
        v = v / jnp.max(v)
        # proportional to p(y_{t+1:T-1} | z_t = i)
        beta = _matvec(_pick(fixed_t, a_t), v, unrolled)
        return beta / jnp.max(beta), v

    _, v = jax.lax.scan(
        step, jnp.ones(lik.shape[1], lik.dtype), (lik, per_step_t), reverse=True,
        unroll=UNROLL if unrolled else 1,
    )
    return v


def _sequential_backward(fixed_t, per_step_t, lik):
    return _backward(fixed_t, per_step_t, lik, _unrolled(lik.shape[-1]))


def _backward_swept(fixed_t, per_step_t, lik, batched=False):
    """`_backward` by `statseq.inference.sweeps.sweep_scan` (``reverse=True``; equal to
    rounding); ``batched``: ``per_step_t`` and ``lik`` have a leading axis of sequences."""
    from statseq.inference.sweeps import sweep_scan

    start = jnp.ones(lik.shape[:-2] + lik.shape[-1:], lik.dtype)
    v, _ = sweep_scan(_smoother_sweep_step(fixed_t, lik.shape[-1]), start, (lik, per_step_t),
                      reverse=True, batched=batched)
    return v


#: `_backward` by sweeps; derivatives and large batches by the sequential pass
_backward_by_sweeps = _swept_with_rules(_backward_swept, _sequential_backward, shared=0)


def _smoother(pi, fixed, per_step, ll, sum_transitions: bool, unrolled=None,
              transition_weights=None, blocked=False, sweeps=None) -> HMMPosterior:
    """``sweeps``: ``True`` for both passes by sweeps (`_backward_by_sweeps`,
    `_filter_by_sweeps`), ``False`` for neither, ``None`` for the default: the backward pass
    by `_use_backward_sweeps`, and the filter then by sweeps too, otherwise the filter's
    own default. ``blocked`` as for `_filter` (both passes); its default (``None``,
    `hmm_blocked.use_blocked`) yields to the sweeps, which are faster at 6 and 7 states."""
    unrolled = _unrolled(ll.shape[1]) if unrolled is None else unrolled
    backward_sweeps = _use_backward_sweeps(sweeps, ll)
    if blocked is None and backward_sweeps:
        blocked = False
    blocked = _use_blocked(blocked, ll) and ll.shape[0] > 1
    if sweeps is None and backward_sweeps and not use_sweeps(ll.shape[0]):
        filt = _filter_by_sweeps(pi, fixed, per_step, ll)
    else:
        filt = _filter(pi, fixed, per_step, ll, unrolled, blocked=blocked, sweeps=sweeps)
    filtered = filt.filtered_probs
    fixed_t = None if fixed is None else fixed.T
    per_step_t = None if per_step is None else jnp.swapaxes(per_step, 1, 2)

    # The scan carries only the rescaled backward message; everything else is vectorized,
    # the max-shifted likelihoods included (exponentials inside the loop cost 5x at K=16).
    lik = jnp.exp(ll[1:] - jnp.max(ll[1:], axis=1, keepdims=True))

    if blocked:
        from statseq.inference.hmm_blocked import backward_blocked

        v = backward_blocked(fixed, per_step, lik)
    elif backward_sweeps:
        v = _backward_by_sweeps(fixed_t, per_step_t, lik)
    else:
        v = _backward(fixed_t, per_step_t, lik, unrolled)
    if fixed is not None and sum_transitions and fixed.shape[0] <= _SMALL_STATES:
        smoothed, transitions = _small_posterior(filtered, v, fixed, transition_weights)
    else:
        smoothed, transitions = _posterior_from_messages(filtered, v, fixed, per_step,
                                                         transition_weights, sum_transitions)
    return HMMPosterior(
        marginal_log_lik=filt.marginal_log_lik,
        filtered_probs=filtered,
        smoothed_probs=smoothed,
        expected_transitions=transitions,
        initial_probs=smoothed[0],
    )


def _posterior_from_messages(filtered, v, fixed, per_step, transition_weights,
                             sum_transitions):
    """`_smoother`'s smoothed marginals and transition counts from the filtered and
    backward messages, on ``(T, K)`` arrays (`_small_posterior` for few states)."""
    if fixed is not None:
        beta = _rows_times(v, fixed.T)  # (T-1, K), unnormalized beta_t for t < T-1
    else:
        beta = jnp.einsum("tij,tj->ti", per_step, v)
    f = filtered[:-1]
    norm = jnp.sum(f * beta, axis=1, keepdims=True)
    smoothed = jnp.concatenate([f * beta / norm, filtered[-1:]])
    weighted = f / norm  # p(z_t = i, z_{t+1} = j | y) = weighted_t(i) A_t[i, j] v_t(j)
    if transition_weights is not None:  # per-step weights of the pair counts (not marginals)
        weighted = weighted * jnp.asarray(transition_weights, filtered.dtype)[:, None]
    if sum_transitions:
        if fixed is not None:
            transitions = fixed * _sum_outer_products(weighted, v)
        else:
            per = weighted[:, :, None] * per_step * v[:, None, :]
            transitions = pairwise_sum(jnp.moveaxis(per, 0, -1))
    else:
        transitions = weighted[:, :, None] * _pick(fixed, per_step) * v[:, None, :]
    return smoothed, transitions


def hmm_smoother(
    initial_probs, transition_matrix, log_likelihoods, *, sum_transitions: bool = True,
    transition_weights=None,
) -> HMMPosterior:
    """Forward-backward smoother with normalized backward messages.

    With ``beta_t(i)`` proportional to ``p(y_{t+1:T-1} | z_t = i)`` (``beta_{T-1} = 1``),

        beta_t = A_t (l_{t+1} * beta_{t+1}),
        p(z_t = i | y) = f_t(i) beta_t(i) / (f_t . beta_t),
        p(z_t = i, z_{t+1} = j | y) = f_t(i) A_t[i, j] l_{t+1}(j) beta_{t+1}(j) / (f_t . beta_t),

    where ``f_t = p(z_t | y_{<=t})`` comes from `hmm_filter` and every ``beta_t`` is
    rescaled to a maximum of one (the scale cancels). Only the beta recursion runs in the
    scan; smoothed marginals and transition counts are computed for all steps at once, the
    summed counts in chunks of small matrix products added as a balanced tree.

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying.
        log_likelihoods: ``(T, K)``; rows of zeros at masked steps.
        sum_transitions: return expected transitions summed over time ``(K, K)``
            (default) or per step ``(T-1, K, K)``.
        transition_weights: optional ``(T-1,)`` weights ``w_t`` multiplying the pair
            counts ``p(z_t, z_{t+1} | y)`` before they are returned or summed (EM gives
            weight zero to the transitions after a sequence's last observation:
            `trailing_transition_weights`); the marginals are unchanged.

    Returns:
        An `HMMPosterior`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from statseq.inference.hmm import hmm_smoother
        >>> A = jnp.array([[0.9, 0.1], [0.2, 0.8]])
        >>> ll = jnp.log(jnp.array([[0.7, 0.1], [0.6, 0.3], [0.2, 0.6]]))
        >>> post = hmm_smoother(jnp.array([0.5, 0.5]), A, ll)
        >>> post.smoothed_probs.shape, round(float(post.expected_transitions.sum()), 6)
        ((3, 2), 2.0)
    """
    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    return _smoother(pi, fixed, per_step, ll, sum_transitions,
                     transition_weights=transition_weights, blocked=None)


def trailing_transition_weights(mask):
    """``(T-1,)`` weights: 1 for a transition ``t -> t+1`` with an observation at or after
    ``t+1``, 0 for the transitions into the unobserved tail of a sequence (its padding).

    Marginalizing the tail leaves the likelihood unchanged, so EM may drop its latent steps;
    counting them (their expected counts are the current transition probabilities) only
    slows EM down and makes padded ragged batches take a different path from fitting each
    sequence at its own length (as hmmlearn does).

    Args:
        mask: ``(T,)`` or ``(T, ...)`` booleans, true where (an entry of) ``y_t`` is observed.

    Examples:
        >>> import numpy as np
        >>> trailing_transition_weights(np.array([True, False, True, False, False])).tolist()
        [1.0, 1.0, 0.0, 0.0]
    """
    observed = jnp.asarray(mask).reshape(jnp.shape(mask)[0], -1).any(axis=1)
    later = jnp.flip(jnp.cumsum(jnp.flip(observed[1:].astype(jnp.int32))) > 0)
    return later.astype(jnp.result_type(float))


#: steps per loop iteration of the gradient path's filter for `UNROLLED_STATES` (it and
#: its reverse pass, whose steps are a matrix-vector product and two vector products)
GRADIENT_UNROLL = 8


def _linearized_log_marginal(pi, fixed, per_step, ll, perturbation):
    """``log p(y)`` through the filter with its normalizers held constant, for
    `hmm_smoother_by_gradient`: ``(log p(y), filtered_probs)``.

    With any constants ``s_t > 0`` and ``a_0 = pi * l_0 / s_0``,
    ``a_{t+1} = ((a_t A_t) + e_t) * l_{t+1} / s_{t+1}`` (``l_t = exp(ll[t] - c_t)``,
    ``e_t = 0`` a perturbation of the predicted message), the identity

        log p(y) = sum_t (c_t + log s_t) + log sum_k a_{T-1}(k)

    holds, so its right side does not depend on the ``s_t``, to any order: taking the
    normalizers ``s_t = sum_k (...)`` of the normalized filter under ``stop_gradient``
    changes no derivative, and makes the recursion linear in the message. Its reverse pass
    is then the scaled backward recursion ``g_t = A_t (g_{t+1} * l_{t+1} / s_{t+1})``, with
    none of the normalization's derivative terms. ``d log p / d e_t = g_{t+1} * l_{t+1} /
    s_{t+1}`` gives the transition counts outside the loop (``f_t (x) d/de_t``), so the
    matrix's gradient is not summed step by step inside it. The value returned is the
    filter's (the ``log sum a_{T-1}`` term, zero up to rounding, only carries the
    derivative).
    """
    num_states = ll.shape[1]
    shift = jax.lax.stop_gradient(jnp.max(ll, axis=1, keepdims=True))
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)  # every state impossible: ll = -inf
    lik = jnp.exp(ll - shift)

    def condition(probs, lik_t):
        unnormalized = probs * lik_t
        norm = jax.lax.stop_gradient(jnp.sum(unnormalized))
        possible = norm > 0  # impossible under every state: keep the message (as _filter)
        scale = 1.0 / jnp.where(possible, norm, 1.0)
        return jnp.where(possible, unnormalized, probs) * scale, norm

    # sums of rows (a broadcast product reduced over the leading axis) for small K: its
    # transpose is as cheap; `@` beyond the unrolled sizes
    rows = num_states <= UNROLLED_STATES[1]

    def step(filtered_prev, xs):
        lik_t, a_prev, e_t = xs
        a = _pick(fixed, a_prev)
        if rows:
            predicted = jnp.sum(filtered_prev[:, None] * a, axis=0) + e_t
        else:
            predicted = filtered_prev @ a + e_t
        filtered, norm = condition(predicted, lik_t)
        return filtered, (norm, filtered)

    filtered0, norm0 = condition(pi, lik[0])
    last, (norms, filtered) = jax.lax.scan(
        step, filtered0, (lik[1:], per_step, perturbation),
        unroll=GRADIENT_UNROLL if _unrolled(num_states) else 1,
    )
    log_normalizers = jnp.log(jnp.concatenate([norm0[None], norms])) + shift[:, 0]
    tail = jnp.log(jnp.sum(last))
    value = pairwise_sum(log_normalizers) + (tail - jax.lax.stop_gradient(tail))
    return value, jnp.concatenate([filtered0[None], filtered])


def _sequential_gradient_parts(pi, fixed, per_step, ll):
    """``(log p(y), filtered, d log p / d e, d log p / d ll)`` through the sequential
    linearized filter (``e`` a zero perturbation of the predicted messages)."""
    num_timesteps, num_states = ll.shape
    perturbation = jnp.zeros((num_timesteps - 1, num_states), ll.dtype)
    (value, filtered), (grad_predicted, grad_ll) = jax.value_and_grad(
        lambda e, ll: _linearized_log_marginal(pi, fixed, per_step, ll, e),
        argnums=(0, 1), has_aux=True,
    )(perturbation, ll)
    return value, filtered, grad_predicted, grad_ll


@jax.custom_batching.custom_vmap
def _blocked_gradient_parts_unbatched(pi, fixed, per_step, ll):
    from statseq.inference.hmm_blocked import gradient_blocked

    return gradient_blocked(pi, fixed, per_step, ll)


@_blocked_gradient_parts_unbatched.def_vmap
def _blocked_gradient_parts_vmap(axis_size, in_batched, pi, fixed, per_step, ll):
    # Under `jax.vmap` the sequential scan runs across the batch at once (its K = 6 step
    # cost is per iteration, not per sequence), and the fallback's `cond` would run both
    # branches: 8 sequences of 4096 steps at K = 6 took 8.4 ms sequential, 19.4 ms blocked.
    in_axes = jax.tree.map(lambda b: 0 if b else None, tuple(in_batched))
    out = jax.vmap(_sequential_gradient_parts, in_axes=in_axes, axis_size=axis_size)(
        pi, fixed, per_step, ll)
    return out, jax.tree.map(lambda _: True, out)


@jax.custom_jvp
def _blocked_gradient_parts(pi, fixed, per_step, ll):
    """`_sequential_gradient_parts` through `hmm_blocked.gradient_blocked` (the same values
    to rounding); its derivatives are the sequential path's, which holds the normalizers
    constant to every order (the blocked one holds boundary messages constant too), and
    so is its batching rule (under `jax.vmap` the sequential scan is faster)."""
    return _blocked_gradient_parts_unbatched(pi, fixed, per_step, ll)


@_blocked_gradient_parts.defjvp
def _blocked_gradient_parts_jvp(primals, tangents):
    _, tangent_out = jax.jvp(_sequential_gradient_parts, primals, tangents)
    return _blocked_gradient_parts(*primals), tangent_out


def _small_gradient_finish(filtered, log_normalizers, v, lik, shift, fixed):
    """`_swept_gradient_parts`'s last step for a fixed matrix of at most `_SMALL_STATES`
    states, over the ``K`` columns of the messages (as `_small_posterior`): ``(d log p /
    d ll, d log p / d e)``."""
    num_states = fixed.shape[0]
    _, _, beta, norm = _column_messages(filtered, v, fixed)
    one = jnp.ones((1,), v.dtype)
    g = [jnp.concatenate([beta[i] / norm, one]) for i in range(num_states)]
    scale = jnp.exp(log_normalizers[1:] - shift[1:])
    scale = jnp.where(scale > 0, scale, 1.0)
    impossible = jnp.isneginf(log_normalizers)
    grad_ll = jnp.stack([jnp.where(impossible, 0.0, filtered[:, i] * g[i])
                         for i in range(num_states)], axis=1)
    grad_predicted = jnp.stack([g[j][1:] * lik[:, j] / scale for j in range(num_states)],
                               axis=1)
    return grad_ll, grad_predicted


def _swept_gradient_parts(pi, fixed, per_step, ll, batched=False):
    """`_sequential_gradient_parts` with both passes by sweeps (`statseq.inference.sweeps`):
    the filter, then the reverse pass of the linearized filter, ``g_t = A_t (g_{t+1} *
    l_{t+1} / s_{t+1})``, written out as its transpose. The reverse pass is linear and
    its scale is fixed by an invariant: scaling ``a_t`` scales every later message, so
    ``<a_t, g_t> = 1`` (``a_t`` the normalized filtered message); the sweeps run it
    normalized (so that it forgets its start) and ``g_t = v_t / <a_t, v_t>`` restores
    the scale. Then ``d log p / d ll[t] = a_t * g_t`` and ``d log p / d e_t = g_{t+1} *
    l_{t+1} / s_{t+1}``, as the sequential reverse pass gives them (to rounding).
    ``batched``: as `_swept`."""
    num_states = ll.shape[-1]
    filt = _swept(pi, fixed, per_step, ll, batched=batched)
    shift = jnp.max(ll, axis=-1)
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    lik = jnp.exp(ll[..., 1:, :] - shift[..., 1:, None])
    # an impossible step (normalizer 0, log p = -inf) keeps its message: its linear map,
    # and so its transpose, is the identity
    lik = jnp.where(jnp.isneginf(filt.log_normalizers[..., 1:, None]), 1.0, lik)
    fixed_t = None if fixed is None else fixed.T
    per_step_t = None if per_step is None else jnp.swapaxes(per_step, -1, -2)
    # the smoother's backward pass: v_t ~ l_{t+1} beta_{t+1}, so beta_t ~ A_t v_t
    v = _backward_swept(fixed_t, per_step_t, lik, batched=batched)

    def finish(filtered, log_normalizers, v, lik, shift, per_step):
        if per_step is None and num_states <= _SMALL_STATES:
            return _small_gradient_finish(filtered, log_normalizers, v, lik, shift, fixed)
        beta = _rows_times(v, fixed.T) if per_step is None else jnp.einsum(
            "tij,tj->ti", per_step, v)
        g = jnp.concatenate([beta / jnp.sum(filtered[:-1] * beta, axis=1, keepdims=True),
                             jnp.ones((1, num_states), v.dtype)])
        # s_{t+1} in the scale of `lik`: the normalizer exp(log_norm - shift) (1 at an
        # impossible step, where `lik` is 1)
        scale = jnp.exp(log_normalizers[1:] - shift[1:])
        # d log p / d ll[t] is 0 at an impossible step (its likelihoods are not used)
        grad_ll = jnp.where(jnp.isneginf(log_normalizers)[:, None], 0.0, filtered * g)
        return grad_ll, g[1:] * lik / jnp.where(scale > 0, scale, 1.0)[:, None]

    parts = (filt.filtered_probs, filt.log_normalizers, v, lik, shift, per_step)
    axes = (0, 0, 0, 0, 0, None if per_step is None else 0)
    grad_ll, grad_predicted = (jax.vmap(finish, in_axes=axes)(*parts) if batched
                               else finish(*parts))
    return filt.marginal_log_lik, filt.filtered_probs, grad_predicted, grad_ll


#: `_sequential_gradient_parts` by sweeps over blocks (equal to rounding)
_gradient_parts_by_sweeps = _swept_with_rules(_swept_gradient_parts,
                                              _sequential_gradient_parts)


def hmm_smoother_by_gradient(
    initial_probs, transition_matrix, log_likelihoods, *, sum_transitions: bool = True
) -> HMMPosterior:
    """Posterior marginals as the gradient of the log marginal likelihood.

    The posterior over paths is an exponential family whose log normalizer is
    ``log p(y)``, so its gradients are expected sufficient statistics:

        d log p(y) / d ll[t, k]        = p(z_t = k | y),
        d log p(y) / d log A_t[i, j]   = p(z_t = i, z_{t+1} = j | y),

    (for a fixed matrix, the second sums over ``t``). This differentiates the forward
    filter in reverse mode, which shows that backpropagation through the forward
    recursion *is* the backward pass. Two exact rewrites make that reverse pass as lean as
    forward-backward's: the filter's normalizers are held constant (``log p(y)`` does not
    depend on them, to any order, so no derivative changes and the recursion is linear in
    the message), and the transition counts come from the gradient with respect to a zero
    perturbation of each predicted message, ``d/d log A_t[i, j] = f_t(i) A_t[i, j]
    d/d pred_{t+1}(j)``, computed for all steps after the loop (for a fixed matrix summed
    in chunks and then as a balanced tree, as in `hmm_smoother`). It agrees with
    `hmm_smoother` to rounding error, and derivatives of its outputs (second derivatives
    of ``log p(y)``) agree with those of `hmm_smoother`'s. Where `hmm_smoother` runs
    blocked (CPU, 6 or 7 states, ``T >= 2048``), so does this path
    (`statseq.inference.hmm_blocked.gradient_blocked`: the same reverse pass, vectorized
    across chunks of about ``sqrt(T)`` steps, equal to rounding); derivatives of its outputs
    are then taken through the sequential path (``jax.custom_jvp``). Where `hmm_filter`
    runs by sweeps over blocks (CPU, ``T >= SWEEP_MIN_STEPS``, `use_sweeps`), so do both
    passes here (`_swept_gradient_parts`: the same reverse pass written out as its
    transpose, run normalized (the smoother's backward pass) and rescaled by the
    invariant ``<a_t, g_t> = 1``; equal to rounding, derivatives again through the
    sequential path).

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying.
        log_likelihoods: ``(T, K)``; rows of zeros at masked steps.
        sum_transitions: expected transitions summed over time ``(K, K)`` (default) or
            per step ``(T-1, K, K)``.

    Returns:
        An `HMMPosterior`.

    Examples:
        >>> import jax.numpy as jnp
        >>> A = jnp.array([[0.9, 0.1], [0.2, 0.8]])
        >>> ll = jnp.log(jnp.array([[0.7, 0.1], [0.6, 0.3], [0.2, 0.6]]))
        >>> post = hmm_smoother_by_gradient(jnp.array([0.5, 0.5]), A, ll)
        >>> ref = hmm_smoother(jnp.array([0.5, 0.5]), A, ll)
        >>> bool(jnp.allclose(post.smoothed_probs, ref.smoothed_probs, atol=1e-6))
        True
    """
    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    # as `_smoother`: by sweeps wherever its backward pass is (6-7 states from 256 steps:
    # there the sequential gradient took 3x forward-backward's time at 4096 steps), the
    # blocked path yielding to them
    backward_sweeps = _use_backward_sweeps(None, ll)
    if not backward_sweeps and _use_blocked(None, ll) and ll.shape[0] > 1:
        value, filtered, grad_predicted, grad_ll = _blocked_gradient_parts(
            pi, fixed, per_step, ll)
    elif (backward_sweeps or _use_sweeps(None, ll)) and ll.shape[0] > 1:
        value, filtered, grad_predicted, grad_ll = _gradient_parts_by_sweeps(
            pi, fixed, per_step, ll)
    else:
        value, filtered, grad_predicted, grad_ll = _sequential_gradient_parts(
            pi, fixed, per_step, ll)
    f = filtered[:-1]
    if fixed is not None and sum_transitions and fixed.shape[0] <= _SMALL_STATES:
        k = fixed.shape[0]
        transitions = _summed_counts(fixed, [f[:, i] for i in range(k)],
                                     [grad_predicted[:, j] for j in range(k)])
    elif fixed is not None and sum_transitions:
        transitions = fixed * _sum_outer_products(f, grad_predicted)
    else:
        transitions = _pick(fixed, per_step) * f[:, :, None] * grad_predicted[:, None, :]
        if sum_transitions:
            transitions = pairwise_sum(transitions, axis=0)
    return HMMPosterior(
        marginal_log_lik=value,
        filtered_probs=filtered,
        smoothed_probs=grad_ll,
        expected_transitions=transitions,
        initial_probs=grad_ll[0],
    )


# ------------------------------------------------------------------------------------------
# most likely path, posterior samples, predictions


def hmm_viterbi(initial_probs, transition_matrix, log_likelihoods):
    """Most likely state path ``argmax_z p(z_{0:T-1} | y_{0:T-1})`` (Viterbi).

    Max-product in log space,

        delta_0 = log pi + ll[0],
        delta_t[j] = max_i (delta_{t-1}[i] + log A_{t-1}[i, j]) + ll[t, j],

    keeping the maximizing ``i`` for every ``(t, j)`` and backtracking from
    ``argmax delta_{T-1}``. Each ``delta_t`` is shifted to a maximum of zero, so float32
    keeps its resolution on long sequences. Ties go to the lowest state index.

    The kernel is `statseq.inference.hmm_paths.viterbi`, which also has a blocked variant
    (chunks of about ``sqrt(T)`` steps swept all at once until their boundary messages
    reach a bit-for-bit fixed point) giving the identical path.

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying.
        log_likelihoods: ``(T, K)``; rows of zeros at masked steps.

    Returns:
        ``(T,)`` int32 state indices.

    Examples:
        >>> import jax.numpy as jnp
        >>> A = jnp.array([[0.9, 0.1], [0.2, 0.8]])
        >>> ll = jnp.log(jnp.array([[0.7, 0.1], [0.6, 0.3], [0.2, 0.6]]))
        >>> hmm_viterbi(jnp.array([0.5, 0.5]), A, ll).tolist()
        [0, 0, 0]
    """
    from statseq.inference import hmm_paths

    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    return hmm_paths.viterbi(pi, fixed, per_step, ll)


def hmm_path_log_prob(initial_probs, transition_matrix, log_likelihoods, states):
    """Log joint ``log p(y_{0:T-1}, z_{0:T-1})`` of one state path (e.g. the Viterbi path).

        log p(y, z) = log pi[z_0] + sum_{t>=1} log A_{t-1}[z_{t-1}, z_t] + sum_t ll[t, z_t].

    Evaluated directly on the path (no max-product shifts), so for the Viterbi path it is
    ``max_z log p(y, z)``; subtract ``log p(y)`` for ``log p(z* | y)``.

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying.
        log_likelihoods: ``(T, K)``; rows of zeros at masked steps.
        states: ``(T,)`` integer states.

    Returns:
        A scalar.

    Examples:
        >>> import jax.numpy as jnp
        >>> ll = jnp.log(jnp.array([[0.9, 0.2], [0.1, 0.7]]))
        >>> a = jnp.array([[0.8, 0.2], [0.3, 0.7]])
        >>> z = hmm_viterbi(jnp.array([0.5, 0.5]), a, ll)
        >>> # the best of the four paths is (0, 1): 0.5 * 0.9 * 0.2 * 0.7
        >>> round(float(jnp.exp(hmm_path_log_prob(jnp.array([0.5, 0.5]), a, ll, z))), 4)
        0.063
    """
    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    states = jnp.asarray(states)
    if states.shape != ll.shape[:1]:
        raise ValueError(f"states must have shape ({ll.shape[0]},); got {states.shape}")
    emit = jnp.sum(jnp.take_along_axis(ll, states[:, None], axis=1))
    prev, nxt = states[:-1], states[1:]
    if fixed is not None:
        moves = fixed[prev, nxt]
    else:
        moves = per_step[jnp.arange(prev.shape[0]), prev, nxt]
    return jnp.log(pi[states[0]]) + jnp.sum(jnp.log(moves)) + emit


def hmm_posterior_sample(initial_probs, transition_matrix, log_likelihoods, *, key):
    """One path from ``p(z_{0:T-1} | y_{0:T-1})`` by forward filtering, backward sampling.

        z_{T-1} ~ p(z_{T-1} | y_{0:T-1}),
        z_t | z_{t+1} ~ p(z_t | y_{<=t}, z_{t+1}) proportional to f_t(i) A_t[i, z_{t+1}],

    where each backward draw is the inverse CDF of ``f_t(i) A_t[i, z_{t+1}]`` at a
    uniform ``u_t``, the ``T-1`` uniforms drawn at once, so that the backward scan carries
    one integer (`statseq.inference.hmm_paths.posterior_sample`). The same key gives the
    same path. ``vmap`` over keys for many paths.

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying.
        log_likelihoods: ``(T, K)``; rows of zeros at masked steps.
        key: a ``jax.random`` key (keyword-only, required).

    Returns:
        ``(T,)`` int32 state indices.
    """
    from statseq.inference import hmm_paths

    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    filtered = _filter(pi, fixed, per_step, ll).filtered_probs
    return hmm_paths.posterior_sample(filtered, fixed, per_step, key)


def hmm_predict_states(filtered_last_probs, transition_matrix, num_steps: int):
    """State distributions ``h = 1, ..., num_steps`` steps after the last observation.

        p(z_{T-1+h} | y_{0:T-1}) = p(z_{T-1} | y_{0:T-1}) A_{T-1} A_T ... A_{T+h-2}.

    Args:
        filtered_last_probs: ``(K,)`` ``p(z_{T-1} | y_{0:T-1})`` (the last row of
            ``filtered_probs``).
        transition_matrix: ``(K, K)`` fixed or ``(num_steps, K, K)`` time-varying (the
            future transitions, in order).
        num_steps: a positive Python int (the output length is static).

    Returns:
        ``(num_steps, K)``; row ``h - 1`` is the distribution ``h`` steps ahead.
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral):
        raise ValueError(f"num_steps must be a positive int; got {num_steps!r}")
    num_steps = int(num_steps)
    if num_steps < 1:
        raise ValueError(f"num_steps must be a positive int; got {num_steps}")
    probs, trans = jnp.asarray(filtered_last_probs), jnp.asarray(transition_matrix)
    dtype = _float_dtype(probs, trans)
    probs, trans = probs.astype(dtype), trans.astype(dtype)
    if probs.ndim != 1:
        raise ValueError(f"filtered_last_probs must have shape (num_states,); got {probs.shape}")
    fixed, per_step = _check_transitions(trans, num_steps, probs.shape[0], "transition_matrix")

    def step(p, a_t):
        p = p @ _pick(fixed, a_t)
        return p, p

    _, out = jax.lax.scan(step, probs, per_step, length=num_steps)
    return out
