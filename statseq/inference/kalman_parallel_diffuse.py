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
   (`statseq.inference.kalman_diffuse_smoother.diffuse_step`), sequentially, in a
   ``while_loop`` that stops as soon as the carry collapses, so that its cost does not
   grow with ``T``.
2. **Tail** (steps ``t_0 .. T-1``): a proper-prior problem, ``x_{t_0} | y_{<t_0} ~ N(a,
   P)`` from the collapsed carry, solved by the parallel (associative-scan) filter and
   smoother. To keep shapes static the tail is the whole sequence shifted left by
   ``t_0`` (time-varying matrices shifted with it) with the ``t_0`` wrapped steps at the
   end fully masked: missing steps after the last observation change no earlier moment.
3. **Head smoother**: the exact initial smoother's backward recursion
   (`statseq.inference.kalman_diffuse_smoother.diffuse_backward_step`) from the tail's
   ``r_{t_0 - 1}``, ``N_{t_0 - 1}``, again in a loop of ``t_0`` steps.

Every result is then the sequential one: log-densities, predicted and filtered moments
(the exact initial filter's ``a_t``, ``P_star`` in the head), smoothed means, covariances
and cross-covariances.
"""

from __future__ import annotations

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
    predicted_moments,
)
from statseq.inference.kalman_diffuse_smoother import (
    diffuse_backward_step,
    diffuse_smoothed,
    diffuse_step,
)


def _head(arrays: GaussianSSMArrays, y, mask, inputs):
    """The exact initial filter until the carry collapses: ``(t_0, final carry, buffers)``,
    the buffers ``(T, ...)`` holding `diffuse_step`'s outputs at steps ``< t_0`` (0 after).
    """
    num_t = y.shape[0]
    carry = initial_carry(arrays)
    xs0 = (y[0], mask[0], inputs[0])
    shapes = jax.eval_shape(lambda c: diffuse_step(arrays, c, xs0)[1], carry)
    bufs = jax.tree.map(lambda s: jnp.zeros((num_t,) + s.shape, s.dtype), shapes)

    def cond(state):
        c, _ = state
        return (c.t < num_t) & ~c.collapsed

    def body(state):
        c, bufs = state
        t = c.t
        new, out = diffuse_step(arrays, c, (y[t], mask[t], inputs[t]))
        bufs = jax.tree.map(lambda b, o: b.at[t].set(o), bufs, out)
        return new, bufs

    carry, bufs = jax.lax.while_loop(cond, body, (carry, bufs))
    return carry.t, carry, bufs


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
    (module docstring); the same result as the sequential `kalman_filter`."""
    from statseq.inference.kalman_parallel import parallel_kalman_filter

    _check(arrays, y, mask, inputs)
    t0, carry, bufs = _head(arrays, y, mask, inputs)
    lp, mean, cov, _, filt, _, _, _ = bufs
    tail = parallel_kalman_filter(*_shifted(arrays, carry, t0, y, mask, inputs))
    log_probs = _unshift(t0, lp, tail.log_probs)
    return KalmanFilterResult(
        pairwise_sum(log_probs), log_probs, _unshift(t0, mean, tail.predicted_means),
        _unshift(t0, cov, tail.predicted_covs), _unshift(t0, filt.mean, tail.filtered_means),
        _unshift(t0, filt.cov, tail.filtered_covs))


def diffuse_parallel_smoother(arrays: GaussianSSMArrays, y, mask, inputs
                              ) -> KalmanSmootherResult:
    """`statseq.inference.kalman_parallel.parallel_kalman_smoother` with diffuse directions
    (module docstring); the same result as the sequential `kalman_smoother`."""
    from statseq.inference.kalman_parallel import _parallel_smoother

    _check(arrays, y, mask, inputs)
    num_t = y.shape[0]
    n = arrays.initial_mean.shape[-1]
    dtype = arrays.initial_cov.dtype
    t0, carry, bufs = _head(arrays, y, mask, inputs)
    lp, mean, cov, factor, filt, inn, diffuse, ents = bufs
    shifted = _shifted(arrays, carry, t0, y, mask, inputs)
    tail, r_tail, n_tail, tail_lp = _parallel_smoother(*shifted)
    # the head's backward recursion from the tail's r_{t0-1}, N_{t0-1}
    zero_v, zero_m = jnp.zeros((n,), dtype), jnp.zeros((n, n), dtype)
    init = (r_tail[:, 0], zero_v, n_tail, zero_m, zero_m)
    back = tuple(jnp.zeros((num_t,) + a.shape, dtype) for a in init)
    at_t0 = jnp.minimum(t0, num_t - 1)
    in_range = t0 < num_t
    back = tuple(jnp.where(in_range, b.at[at_t0].set(a), b)
                 for b, a in zip(back, init, strict=True))

    def step(i, state):
        c, back = state
        t = t0 - 1 - i
        x = jax.tree.map(lambda b: b[t], (inn.w, inn.z, inn.chol, inn.h, ents))
        c = diffuse_backward_step(arrays, c, (t, diffuse[t]) + x)
        return c, tuple(b.at[t].set(v) for b, v in zip(back, c, strict=True))

    _, back = jax.lax.fori_loop(0, t0, step, (init, back))
    # the moments at t0 (the first tail step) enter the head's cross-covariance
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

