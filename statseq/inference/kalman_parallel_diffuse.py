"""Exact diffuse initialization for the parallel Kalman filter and smoother.

`statseq.inference.kalman_parallel` with diffuse directions (``initial_diffuse`` ``(n, q)``,
``q > 0``) runs here, so that it agrees with the sequential `kalman_filter` and
`kalman_smoother` down to zero observation variance (issue 11). De Jong's augmented
recursion, which the parallel scans used before, accumulates ``S = sum_t X_t^T F_t^{-1}
X_t`` and ``s``, whose terms grow as ``1 / R``; their cancellation cost 2e-2 in the
smoothed means of a local linear trend at ``R / Q = 10^{-12}`` and gave NaN at ``R = 0``.

Split of the sequence at the step ``t_0`` after which the data have identified every
diffuse direction (the sequential filter *collapses* there):

1. **Head** (steps ``0 .. t_0 - 1``, usually ``q`` steps or a few more with missing
   values): the exact initial filter of Koopman and Durbin
   (`statseq.inference.kalman_diffuse_smoother.diffuse_step`), sequentially, in a scan
   over a static ``min(T, 2 q + 16)`` steps that passes the steps after the collapse
   through (a scan, unlike a while loop, has reverse-mode derivatives), so that its cost
   does not grow with ``T``. Where the data have not identified every direction by then
   (long runs of missing values at the start) and the sequence goes on, the sequential
   filter or smoother runs instead (`jax.lax.cond`; under `jax.vmap` a batched predicate
   turns the `cond` into a select, so both branches run and the cost is that of the
   sequential filter as well: batch the parallel diffuse filter by a loop, not `vmap`,
   where depth matters).
2. **Tail** (steps ``t_0 .. T-1``): a proper-prior problem, ``x_{t_0} | y_{<t_0} ~ N(a,
   P)`` from the collapsed carry, solved by the parallel (associative-scan) filter and
   smoother. To keep shapes static the tail is the whole sequence shifted left by
   ``t_0`` (time-varying matrices shifted with it) with the ``t_0`` wrapped steps at the
   end fully masked: missing steps after the last observation change no earlier moment.
3. **Head smoother**: the exact initial smoother's backward recursion
   (`statseq.inference.kalman_diffuse_smoother.diffuse_backward_step`) from the tail's
   ``r_{t_0 - 1}``, ``N_{t_0 - 1}``, in a reverse scan over the same static length.

Every result is then the sequential one: log-densities, predicted and filtered moments
(the exact initial filter's ``a_t``, ``P_star`` in the head), smoothed means, covariances
and cross-covariances.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from statseq.core.recurrence import pairwise_sum
from statseq.inference.kalman import (
    _BASE_NDIM,
    _PER_STEP,
    GaussianSSMArrays,
    KalmanCarry,
    KalmanFilterResult,
    KalmanSmootherResult,
    _check,
    initial_carry,
    kalman_filter,
    kalman_smoother,
    predicted_moments,
)
from statseq.inference.kalman_diffuse_smoother import (
    diffuse_backward_step,
    diffuse_smoothed,
    diffuse_step,
)


def head_length(num_t: int, q: int) -> int:
    """The static number of steps the head may take: ``min(T, 2 q + 16)``."""
    return min(num_t, 2 * q + 16)


def _pad(x, num_t):
    return jnp.concatenate([x, jnp.zeros((num_t - x.shape[0],) + x.shape[1:], x.dtype)])


def _head(arrays: GaussianSSMArrays, y, mask, inputs):
    """The exact initial filter until the carry collapses: ``(t_0, final carry, buffers)``,
    the buffers ``(T, ...)`` holding `diffuse_step`'s outputs at steps ``< t_0`` (0 after).
    A scan over `head_length` steps that skips the steps after the collapse (a scan, not a
    while loop, so that reverse-mode derivatives exist)."""
    num_t = y.shape[0]
    steps = head_length(num_t, arrays.initial_diffuse.shape[1])
    carry = initial_carry(arrays)
    shapes = jax.eval_shape(lambda c: diffuse_step(arrays, c, (y[0], mask[0], inputs[0]))[1],
                            carry)

    def skip(c, xs):
        return c, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def step(c, xs):
        return jax.lax.cond(c.collapsed, skip, partial(diffuse_step, arrays), c, xs)

    carry, bufs = jax.lax.scan(step, carry, (y[:steps], mask[:steps], inputs[:steps]))
    return carry.t, carry, jax.tree.map(lambda b: _pad(b, num_t), bufs)


def _shifted(arrays: GaussianSSMArrays, carry: KalmanCarry, t0, y, mask, inputs):
    """The tail as a proper-prior problem of length ``T``: step ``s`` is step ``t_0 + s``,
    the initial law ``x_{t_0} | y_{<t_0}``; steps past ``T - 1`` are masked."""
    num_t = y.shape[0]
    idx = jnp.arange(num_t) + t0
    valid = idx < num_t
    mean, cov, _ = predicted_moments(arrays, carry, inputs[jnp.minimum(t0, num_t - 1)])
    leaves = []
    for name, leaf, nd in zip(GaussianSSMArrays._fields, arrays, _BASE_NDIM, strict=True):
        if name in _PER_STEP and jnp.ndim(leaf) == nd + 1:
            pos = jnp.clip(idx[: leaf.shape[0]], 0, leaf.shape[0] - 1)
            leaf = leaf[pos]
        leaves.append(leaf)
    n = mean.shape[0]
    shifted = GaussianSSMArrays(*leaves)._replace(
        initial_mean=mean, initial_cov=cov, initial_diffuse=jnp.zeros((n, 0), cov.dtype))
    take = jnp.minimum(idx, num_t - 1)
    return shifted, y[take], mask[take] & valid[:, None], inputs[take]


def _unshift(t0, head, tail):
    """Entry ``t`` of ``head`` where ``t < t_0``, else entry ``t - t_0`` of ``tail``."""
    num_t = head.shape[0]
    t = jnp.arange(num_t)
    moved = tail[jnp.clip(t - t0, 0, num_t - 1)]
    return jnp.where((t < t0).reshape((num_t,) + (1,) * (head.ndim - 1)), head, moved)


def diffuse_parallel_filter(arrays: GaussianSSMArrays, y, mask, inputs) -> KalmanFilterResult:
    """`statseq.inference.kalman_parallel.parallel_kalman_filter` with diffuse directions
    (module docstring); the same result as the sequential `kalman_filter`.

    Args:
        arrays: the model's matrices (``initial_diffuse`` ``(n, q)``, ``q > 0``).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `~statseq.inference.kalman.KalmanFilterResult`.
    """
    from statseq.inference.kalman_parallel import parallel_kalman_filter

    _check(arrays, y, mask, inputs)
    t0, carry, bufs = _head(arrays, y, mask, inputs)

    def split(_):
        lp, mean, cov, _, filt, _, _, _ = bufs
        tail = parallel_kalman_filter(*_shifted(arrays, carry, t0, y, mask, inputs))
        log_probs = _unshift(t0, lp, tail.log_probs)
        return KalmanFilterResult(
            pairwise_sum(log_probs), log_probs, _unshift(t0, mean, tail.predicted_means),
            _unshift(t0, cov, tail.predicted_covs),
            _unshift(t0, filt.mean, tail.filtered_means),
            _unshift(t0, filt.cov, tail.filtered_covs))

    def sequential(_):
        return kalman_filter(arrays, y, mask, inputs)

    return jax.lax.cond(_identified(carry, y.shape[0]), split, sequential, None)


def _identified(carry: KalmanCarry, num_t: int):
    """Whether the head identified every diffuse direction (or covered the sequence); where
    not (long runs of missing values at the start), the sequential filter runs instead."""
    return carry.collapsed | (carry.t >= num_t)


def diffuse_parallel_smoother(arrays: GaussianSSMArrays, y, mask, inputs
                              ) -> KalmanSmootherResult:
    """`statseq.inference.kalman_parallel.parallel_kalman_smoother` with diffuse directions
    (module docstring); the same result as the sequential `kalman_smoother`.

    Args:
        arrays: the model's matrices (``initial_diffuse`` ``(n, q)``, ``q > 0``).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `~statseq.inference.kalman.KalmanSmootherResult`.
    """

    _check(arrays, y, mask, inputs)
    t0, carry, bufs = _head(arrays, y, mask, inputs)

    def sequential(_):
        return kalman_smoother(arrays, y, mask, inputs)

    return jax.lax.cond(_identified(carry, y.shape[0]), partial(_split_smoother, arrays, y,
                                                                mask, inputs, t0, carry, bufs),
                        sequential, None)


def _split_smoother(arrays, y, mask, inputs, t0, carry, bufs, _):
    from statseq.inference.kalman_parallel import _parallel_smoother

    num_t = y.shape[0]
    n, q = arrays.initial_diffuse.shape
    dtype = arrays.initial_cov.dtype
    lp, mean, cov, factor, filt, inn, diffuse, ents = bufs
    shifted = _shifted(arrays, carry, t0, y, mask, inputs)
    tail, r_tail, n_tail, tail_lp = _parallel_smoother(*shifted)
    # the head's backward recursion from the tail's r_{t0-1}, N_{t0-1} (a reverse scan over
    # the head's static length that passes the steps >= t0 through: their entries, and the
    # entries after the head, hold the initial values, which step t0 - 1 reads at t0)
    zero_v, zero_m = jnp.zeros((n,), dtype), jnp.zeros((n, n), dtype)
    init = (r_tail[:, 0], zero_v, n_tail, zero_m, zero_m)

    def back_step(c, t):
        def run(c):
            x = jax.tree.map(lambda b: b[t], (inn.w, inn.z, inn.chol, inn.h, ents))
            return diffuse_backward_step(arrays, c, (t, diffuse[t]) + x)

        c = jax.lax.cond(t < t0, run, lambda c: c, c)
        return c, c

    steps = head_length(num_t, q)
    _, back = jax.lax.scan(back_step, init, jnp.arange(steps), reverse=True)
    back = tuple(jnp.concatenate([b, jnp.broadcast_to(a, (num_t - steps,) + a.shape)])
                 for b, a in zip(back, init, strict=True))
    # the moments at t0 (the first tail step) enter the head's cross-covariance
    at_t0 = jnp.minimum(t0, num_t - 1)
    in_range = t0 < num_t
    shifted_arr = shifted[0]
    mean = jnp.where(in_range, mean.at[at_t0].set(shifted_arr.initial_mean), mean)
    cov = jnp.where(in_range, cov.at[at_t0].set(shifted_arr.initial_cov), cov)
    head = diffuse_smoothed(arrays, 0.0, mean, cov, factor, filt, back)
    log_probs = _unshift(t0, lp, tail_lp)
    cross_t = jnp.arange(num_t - 1)
    cross_tail = tail.smoothed_cross_covs[jnp.clip(cross_t - t0, 0, num_t - 2)]
    cross = jnp.where((cross_t < t0)[:, None, None], head.smoothed_cross_covs, cross_tail)
    return KalmanSmootherResult(
        pairwise_sum(log_probs), _unshift(t0, filt.mean, tail.filtered_means),
        _unshift(t0, filt.cov, tail.filtered_covs),
        _unshift(t0, head.smoothed_means, tail.smoothed_means),
        _unshift(t0, head.smoothed_covs, tail.smoothed_covs), cross)
