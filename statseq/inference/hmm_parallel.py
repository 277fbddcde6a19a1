"""Parallel-in-time HMM filtering and smoothing with `jax.lax.associative_scan`.

Same names, arguments and results as `statseq.inference.hmm` (see there for the
model, the shapes and the convention that a masked step is a row of zeros in
``log_likelihoods``); ``O(log T)`` sequential depth and ``O(T K^3)`` work, following
Hassan, Särkkä and García-Fernández (2021), *Temporal parallelization of inference in
hidden Markov models*, IEEE Trans. Signal Processing 69.

Everything is in log space. With the elements

    E_0[i, j] = log pi[j] + ll[0, j]                  (every row i alike),
    E_t[i, j] = log A_{t-1}[i, j] + ll[t, j],         t = 1, ..., T-1,

and the associative log-matrix product ``(X o Y)[i, k] = logsumexp_j (X[i, j] + Y[j, k])``,
a product of consecutive elements is a log-likelihood over a block of time,

    (E_s o ... o E_t)[i, j] = log p(y_{s:t}, z_t = j | z_{s-1} = i),

so the forward prefixes ``E_0 o ... o E_t`` hold ``log p(y_{0:t}, z_t = j)`` (in every row)
and the backward suffixes ``E_{t+1} o ... o E_{T-1} o 0`` hold
``log p(y_{t+1:T-1} | z_t = i)`` (in every column; ``0`` is the all-zeros matrix). Every
combined element is shifted by its own maximum, so magnitudes stay of order one however
long the sequence; the shifts are constants per time step that cancel when normalizing
over states, so only normalized quantities are read from the scans. The one-step
log normalizers are then computed from the filtered distributions for every ``t`` at once
and summed as a balanced binary tree, exactly as in the sequential filter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from statseq.core.recurrence import pairwise_sum
from statseq.inference.hmm import (
    HMMFilterResult,
    HMMPosterior,
    _prepare_inputs,
)


def _finite_or_zero(x):
    return jax.lax.stop_gradient(jnp.where(jnp.isfinite(x), x, 0.0))


def _log_matmul(a, b):
    """``logsumexp_j (a[..., i, j] + b[..., j, k])`` over batched ``(..., K, K)``.

    Shifted by the maximum over ``j`` of each entry, so exact for any magnitudes; an entry
    whose terms are all ``-inf`` is ``-inf``.
    """
    terms = a[..., :, :, None] + b[..., None, :, :]
    shift = _finite_or_zero(jnp.max(terms, axis=-2))
    return jnp.log(jnp.sum(jnp.exp(terms - shift[..., None, :]), axis=-2)) + shift


def _combine(earlier, later):
    """``earlier o later``, shifted so that the element's largest entry is zero."""
    product = _log_matmul(earlier, later)
    return product - _finite_or_zero(jnp.max(product, axis=(-2, -1), keepdims=True))


def _combine_backward(later, earlier):
    # associative_scan(reverse=True) calls fn(accumulated later block, earlier element)
    return _combine(earlier, later)


def _elements(pi, log_trans, ll):
    """``(T, K, K)`` log-space elements ``E_t`` (module docstring); ``log_trans`` is
    ``(T-1, K, K)`` or one ``(K, K)`` matrix for every step."""
    num_t, num_states = ll.shape
    first = (jnp.arange(num_t) == 0)[:, None, None]
    # no slices ll[1:] or concatenations along time: with time split over devices they would
    # be arrays of T - 1 steps, which XLA keeps whole on every device
    return jnp.where(first, jnp.log(pi), _steps(log_trans, num_t)) + ll[:, None, :]


def _steps(log_trans, num_t):
    """``log A_{t-1}`` at every step ``t`` (``(T, K, K)``, a placeholder at ``t = 0``) or the
    fixed ``(K, K)``."""
    if log_trans.ndim == 2:
        return log_trans
    return jnp.concatenate([jnp.zeros_like(log_trans[:1]), log_trans])


def _forward(pi, fixed, per_step, ll, scan=jax.lax.associative_scan):
    """Log transitions (``(T-1, K, K)``, or ``(K, K)`` if fixed), elements, normalized log
    filtered ``(T, K)``.

    ``scan`` is `jax.lax.associative_scan` or a drop-in with its signature (the time-sharded
    scan of `statseq.distributed.time`)."""
    # a fixed matrix stays (K, K) and broadcasts against the steps: a (T-1, K, K) copy would
    # double the memory of the elements (and be whole on every device when time is sharded)
    log_trans = jnp.log(fixed if per_step is None else per_step)
    elements = _elements(pi, log_trans, ll)
    prefixes = scan(_combine, elements)
    log_filtered = jax.nn.log_softmax(prefixes[:, 0, :], axis=-1)
    return log_trans, elements, log_filtered


def _skip_impossible(ll):
    """Rows of ``ll`` that are ``-inf`` in every state (an observation impossible under the
    model) replaced by zeros, and which they were. As in the sequential filter, the message
    passes such a step unchanged and the step's normalizer is ``-inf`` (set afterwards), so
    the total is ``-inf`` rather than NaN."""
    impossible = jnp.all(ll == -jnp.inf, axis=-1)
    return jnp.where(impossible[:, None], 0.0, ll), impossible


def _filter_result(pi, log_trans, ll, log_filtered, impossible=None) -> HMMFilterResult:
    # log p(z_t = j | y_{<t}) = logsumexp_i (log f_{t-1}(i) + log A_{t-1}[i, j])
    num_t = ll.shape[0]
    previous = jnp.roll(log_filtered, 1, axis=0)  # row 0 (the last step) is replaced below
    log_predicted = jnp.where(
        (jnp.arange(num_t) == 0)[:, None], jnp.log(pi),
        _log_matmul(previous[:, None, :], _steps(log_trans, num_t))[:, 0, :])
    log_normalizers = jax.nn.logsumexp(log_predicted + ll, axis=-1)
    if impossible is not None:
        log_normalizers = jnp.where(impossible, -jnp.inf, log_normalizers)
    return HMMFilterResult(
        marginal_log_lik=pairwise_sum(log_normalizers),
        log_normalizers=log_normalizers,
        predicted_probs=jnp.exp(log_predicted),
        filtered_probs=jnp.exp(log_filtered),
    )


def hmm_filter(initial_probs, transition_matrix, log_likelihoods) -> HMMFilterResult:
    """Forward filter by a parallel prefix scan (twin of `hmm.hmm_filter`).

    ``p(z_t | y_{0:t})`` is the normalized row of the prefix ``E_0 o ... o E_t``; then, for
    every ``t`` at once,

        log p(z_t = j | y_{<t}) = logsumexp_i (log p(z_{t-1} = i | y_{<t}) + log A_{t-1}[i, j]),
        log p(y_t | y_{<t}) = logsumexp_j (log p(z_t = j | y_{<t}) + ll[t, j]).

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying.
        log_likelihoods: ``(T, K)``; rows of zeros at masked steps.

    Returns:
        An `~statseq.inference.hmm.HMMFilterResult`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from statseq.inference import hmm, hmm_parallel
        >>> pi, A = jnp.array([0.5, 0.5]), jnp.array([[0.9, 0.1], [0.2, 0.8]])
        >>> ll = jnp.log(jnp.array([[0.7, 0.1], [0.6, 0.3], [0.2, 0.6]]))
        >>> a = hmm_parallel.hmm_filter(pi, A, ll).marginal_log_lik
        >>> b = hmm.hmm_filter(pi, A, ll).marginal_log_lik
        >>> bool(jnp.allclose(a, b))
        True
    """
    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    ll, impossible = _skip_impossible(ll)
    log_trans, _, log_filtered = _forward(pi, fixed, per_step, ll)
    return _filter_result(pi, log_trans, ll, log_filtered, impossible)


def hmm_smoother(
    initial_probs, transition_matrix, log_likelihoods, *, sum_transitions: bool = True
) -> HMMPosterior:
    """Forward-backward smoother by two parallel scans (twin of `hmm.hmm_smoother`).

    With ``log a_t(i)`` the normalized forward prefix and ``log b_t(i)`` the shifted
    backward suffix (module docstring),

        p(z_t = i | y) proportional to exp(log a_t(i) + log b_t(i)),
        p(z_t = i, z_{t+1} = j | y) proportional to
            exp(log a_t(i) + E_{t+1}[i, j] + log b_{t+1}(j)),

    normalized over ``i`` (and ``j``) for each ``t``.

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying.
        log_likelihoods: ``(T, K)``; rows of zeros at masked steps.
        sum_transitions: expected transitions summed over time ``(K, K)`` (default) or
            per step ``(T-1, K, K)``.

    Returns:
        An `~statseq.inference.hmm.HMMPosterior`.
    """
    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    return _smoother(pi, fixed, per_step, ll, sum_transitions)


def _smoother(pi, fixed, per_step, ll, sum_transitions, scan=jax.lax.associative_scan):
    """`hmm_smoother` on checked inputs, with the associative scan ``scan`` (`_forward`)."""
    ll, impossible = _skip_impossible(ll)
    log_trans, elements, log_filtered = _forward(pi, fixed, per_step, ll, scan)
    filt = _filter_result(pi, log_trans, ll, log_filtered, impossible)

    num_states = ll.shape[1]
    last = jnp.zeros((1, num_states, num_states), ll.dtype)
    suffixes = scan(_combine_backward, jnp.concatenate([elements[1:], last]), reverse=True)
    log_beta = suffixes[:, :, 0]
    smoothed = jax.nn.softmax(log_filtered + log_beta, axis=-1)

    log_pairs = log_filtered[:-1, :, None] + elements[1:] + log_beta[1:, None, :]
    log_norm = jax.nn.logsumexp(log_pairs, axis=(-2, -1), keepdims=True)
    transitions = jnp.exp(log_pairs - log_norm)
    if sum_transitions:
        transitions = pairwise_sum(transitions, axis=0)
    return HMMPosterior(
        marginal_log_lik=filt.marginal_log_lik,
        filtered_probs=filt.filtered_probs,
        smoothed_probs=smoothed,
        expected_transitions=transitions,
        initial_probs=smoothed[0],
    )
