"""Steady-state Kalman filtering and smoothing for time-invariant models with complete data.

Once the filtered covariance of a time-invariant model has converged, the gain, the
innovation covariance and the smoother's ``N_t`` are constant, so the mean recursions are
affine maps with constant matrices, ``h_t = A h_{t-1} + g_t``: one small matrix product per
step instead of a Cholesky factorization and triangular solves. The filter and the
log-likelihood run the exact recursion of `statseq.inference.kalman` in chunks of 16 steps
until the steady state holds, checked from the covariances alone (they do not depend on
``y`` when nothing is missing); the smoother uses a fixed exact head at each end. Where the
steady state is not reached, the exact recursion continues. Tests show the fast and exact
paths agree to float64 precision.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from statseq.core.recurrence import pairwise_sum
from statseq.inference.gaussian import symmetrize
from statseq.inference.kalman import (
    _LOG_2PI,
    GaussianSSMArrays,
    KalmanCarry,
    KalmanFilterResult,
    KalmanSmootherResult,
    _backward_pass,
    _check,
    _scan_filter,
    _smoothed,
    dynamics_weights,
    initial_carry,
    is_time_varying,
    kalman_filter,
    kalman_smoother,
    kalman_step,
)


def _affine_scan(a_mat, g, h0):
    """``h_k = A h_{k-1} + g_k`` for ``k = 0..K-1`` from ``h_{-1} = h0`` (vectors ``(K, n)``
    or matrices ``(K, n, c)``).

    A plain `jax.lax.scan`: with a constant matrix the step is one small product, which
    XLA:CPU runs in about 10 ns per step for small ``n``, faster than an associative scan
    (which also multiplies the matrices) at every length and state size measured
    (``benchmarks/RESULTS.md``)."""

    def body(h, g_k):
        h = a_mat @ h + g_k
        return h, h

    return jax.lax.scan(body, h0, g)[1]


#: exact steps run between two checks of the steady state
_CHUNK = 16


def _default_tol(dtype, tol):
    """The relative tolerance of the convergence checks: ``tol``, else 1e-13 in float64
    and 1e-6 in float32."""
    return (1e-13 if dtype == jnp.float64 else 1e-6) if tol is None else tol


def _exact_until_steady(arrays: GaussianSSMArrays, y, inputs, head: int, tol, outputs,
                        num_valid=None):
    """Exact filter steps in chunks of ``chunk = min(16, head)``, until the steady state
    holds or ``head`` steps (rounded down to a multiple of ``chunk``; ``1 <= head <= T``)
    are done, whichever is first.

    ``outputs(step_result) -> pytree`` picks what to keep of each step's
    `kalman_step` result ``(log_prob, new_carry, (mean, cov, diffuse, innovation))``; it is
    stored in buffers of ``head`` rows (rows past the stopping point stay zero).

    Returns:
        ``(head, k, carry, steady, buffers, gain)``: the rounded ``head``, the number of
        exact steps (a multiple of ``chunk``; ``head`` when the steady state was not
        reached), the carry after them,
        whether the steady state holds from there, the stored outputs, and the constant
        gain pieces `_steady_gain` gives at the carry's covariance. With ``num_valid``
        (traced) the steps from ``num_valid`` on leave the carry unchanged.
    """
    chunk = min(_CHUNK, head)
    head = head // chunk * chunk
    mask = jnp.ones((chunk, y.shape[1]), bool)

    def run_chunk(carry, start):
        def step(c, xs):
            t, xs = xs[0], xs[1:]
            res = kalman_step(arrays, c, *xs)
            if num_valid is not None:
                live = t < num_valid
                res = (res[0], jax.tree.map(lambda n, o: jnp.where(live, n, o), res[1], c),
                       res[2])
            return res[1], outputs(res)

        xs = (start + jnp.arange(chunk), jax.lax.dynamic_slice_in_dim(y, start, chunk),
              mask, jax.lax.dynamic_slice_in_dim(inputs, start, chunk))
        return jax.lax.scan(step, carry, xs)

    carry0 = initial_carry(arrays)
    out_shape = jax.eval_shape(lambda c: run_chunk(c, 0)[1], carry0)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape)
    gain0 = _steady_gain(arrays, carry0.cov, tol)

    def body(state, i):
        def run(_):
            _, carry, _, _ = state
            start = i * chunk
            carry, outs = run_chunk(carry, start)
            gain = _steady_gain(arrays, carry.cov, tol)
            return (start + chunk, carry, carry.collapsed & gain[4], gain), outs

        # a scan over the chunks with the rest skipped once steady (not a while_loop, which
        # reverse-mode differentiation cannot go through). Each chunk's outputs leave as the
        # scan's stacked outputs, never through the carry: a (head, ...) buffer in the carry
        # made reverse mode store it at every chunk (O(head^2) work; 6x slower gradients at
        # T = 400 for a local level).
        return jax.lax.cond(state[2], lambda _: (state, zeros), run, None)

    init = (jnp.zeros((), jnp.int32), carry0, jnp.asarray(False), gain0)
    steps = jnp.arange(head // chunk, dtype=jnp.int32)
    (k, carry, steady, gain), outs = jax.lax.scan(body, init, steps)
    bufs = jax.tree.map(lambda o: o.reshape((head,) + o.shape[2:]), outs)
    return head, k, carry, steady, bufs, gain


def steady_state_log_probs(arrays: GaussianSSMArrays, y, inputs, *, head: int, tol=None,
                           num_valid: Any = None):
    """Per-step log-densities of fully observed ``y`` using the steady-state gain.

    The exact filter runs (including any diffuse phase) in chunks of 16 steps until the
    data have identified every diffuse direction and the covariance recursion has
    converged (one more Riccati step changes the filtered covariance by less than ``tol``
    relative), for at most ``head`` steps. From there on the gain is constant and the
    filtered mean follows the time-invariant affine recursion
    ``m_t = (I - K H) F m_{t-1} + g_t``, one small matrix product per step. If the
    steady state is not reached within ``head`` steps, the exact filter continues. Same
    numbers as `kalman_filter` up to the convergence tolerance (float64: ``1e-13``).

    Args:
        arrays: time-invariant matrices (no time axes).
        y: ``(T, D)`` fully observed.
        inputs: ``(T, m)``.
        head: the most exact steps before giving up on the steady state (static; the
            check runs every ``min(16, head)`` steps, and ``head`` is rounded down to a
            multiple of that and to at most ``T``).
        tol: relative tolerance of the covariance convergence check.
        num_valid: ``None``, or the real length (may be traced) of ``y`` padded at the end
            (to a bucket length, `statseq.core.buckets`): the final carry is then the one
            after step ``num_valid - 1`` (the log-densities of the padded steps are
            returned as computed, for the caller to drop), and the steady-state path is
            kept.

    Returns:
        ``(log_probs (T,), final KalmanCarry)``.
    """
    if is_time_varying(arrays):
        raise ValueError("the steady-state filter needs time-invariant matrices")
    num_t, dim = y.shape
    dtype = arrays.initial_cov.dtype
    tol = _default_tol(dtype, tol)
    if min(head, num_t) < 1:
        return _exact(arrays, initial_carry(arrays), y, inputs, num_valid)
    head, k, carry, steady, lp_head, (_, chol, w, filt_cov, _) = _exact_until_steady(
        arrays, y, inputs, min(head, num_t), tol, lambda res: res[0], num_valid)
    t = jnp.arange(num_t)
    end = jnp.int32(num_t) if num_valid is None else jnp.asarray(num_valid, jnp.int32)

    def steady_tail(_):
        lps, means, *_ = _steady_means(arrays, carry.mean, chol, w, y, inputs, start=k)
        lps = jnp.where(t < k, jnp.pad(lp_head, (0, num_t - head)), lps)
        if num_valid is None:
            return lps, carry._replace(mean=means[-1], cov=filt_cov, t=end)
        # padded: the state after the last real step (the exact carry if that came first)
        late = end > k
        final = carry._replace(
            mean=jnp.where(late, means[jnp.clip(end - 1, 0, num_t - 1)], carry.mean),
            cov=jnp.where(late, filt_cov, carry.cov), t=jnp.where(late, end, carry.t))
        return lps, final

    def exact_tail(_):
        lps, final = _exact(arrays, carry, y[head:], inputs[head:], num_valid, offset=head)
        return jnp.concatenate([lp_head, lps]), final

    return jax.lax.cond(steady, steady_tail, exact_tail, None)


def _exact(arrays, carry, y, inputs, num_valid=None, offset=0):
    """``(log_probs, final carry)`` of the exact filter over fully observed ``y`` (steps
    ``offset + i``; with ``num_valid`` those from ``num_valid`` on leave the carry as is)."""

    def step(c, xs):
        t, xs = xs[0], xs[1:]
        lp, new, _ = kalman_step(arrays, c, *xs)
        if num_valid is not None:
            new = jax.tree.map(lambda n, o: jnp.where(t < num_valid, n, o), new, c)
        return new, lp

    steps = offset + jnp.arange(y.shape[0])
    final, lps = jax.lax.scan(step, carry, (steps, y, jnp.ones(y.shape, bool), inputs))
    return lps, final


def _steady_means(arrays: GaussianSSMArrays, mean0, chol, w, y, u, start=0):
    """Log-densities, filtered and predicted means, whitened innovations ``z`` and the
    recursion matrix ``(I - K H) F`` of fully observed ``y[start:]`` under the constant
    gain (innovation factor ``chol``, whitened gain ``w``), from the filtered mean ``mean0``
    after step ``start - 1``. ``start`` may be traced: rows before it are computed from
    zeros and are to be discarded (they keep every shape static)."""
    f, h = arrays.dynamics_weights, arrays.emission_weights
    dim, n = h.shape
    dtype = chol.dtype
    linv = jsl.solve_triangular(chol, jnp.eye(dim, dtype=dtype), lower=True)  # L^{-1}
    k_mat = w.T @ linv  # K = P H^T S^{-1}
    ikh = jnp.eye(n, dtype=dtype) - k_mat @ h
    a_mat = ikh @ f
    drive = u @ arrays.dynamics_input_weights.T + arrays.dynamics_bias
    obs_off = u @ arrays.emission_input_weights.T + arrays.emission_bias
    g = (drive @ ikh.T) + (y - obs_off) @ k_mat.T
    t = jnp.arange(y.shape[0])
    g = jnp.where((t >= start)[:, None], g, 0.0)
    g = g + jnp.where((t == start)[:, None], (a_mat @ mean0)[None], 0.0)
    means = _affine_scan(a_mat, g, jnp.zeros_like(mean0))  # filtered m_t (t >= start)
    prev = jnp.concatenate([jnp.zeros_like(mean0)[None], means[:-1]], axis=0)
    prev = jnp.where((t == start)[:, None], mean0[None], prev)
    pred = prev @ f.T + drive
    z = (y - pred @ h.T - obs_off) @ linv.T
    lps = (-0.5 * jnp.sum(z**2, axis=1) - jnp.sum(jnp.log(jnp.diagonal(chol)))
           - 0.5 * dim * _LOG_2PI)
    return lps, means, pred, z, a_mat


def _filter_outputs(res):
    """What `steady_state_filter` keeps of a `kalman_step` result: the log-density, the
    predicted and the filtered moments."""
    lp, new, (mean, cov, _, _) = res
    return lp, mean, cov, new.mean, new.cov


def steady_state_filter(arrays: GaussianSSMArrays, y, inputs, *, head: int, tol=None
                        ) -> KalmanFilterResult:
    """`kalman_filter` of fully observed ``y`` using the steady-state gain where it holds.

    As `steady_state_log_probs` (exact steps until the data identified every diffuse
    direction and the filtered covariance has converged, at most ``head`` of them; then
    constant covariances and the filtered means by the constant-gain recursion), returning
    every moment. The same numbers up to the convergence tolerance; a test checks this.

    Args:
        arrays: time-invariant matrices (no time axes).
        y: ``(T, D)`` fully observed.
        inputs: ``(T, m)``.
        head: the most exact steps before giving up on the steady state (static; for
            ``T <= 2 head`` this is `kalman_filter`).
        tol: relative tolerance of the convergence check.

    Returns:
        A `KalmanFilterResult`.
    """
    if is_time_varying(arrays):
        raise ValueError("the steady-state filter needs time-invariant matrices")
    num_t, dim = y.shape
    dtype = arrays.initial_cov.dtype
    tol = _default_tol(dtype, tol)
    if head < 1 or num_t <= 2 * head:  # too short to pay for compiling the steady path
        return kalman_filter(arrays, y, jnp.ones((num_t, dim), bool), inputs)
    head, k, carry, steady, bufs, (pred_cov, chol, w, filt_cov, _) = _exact_until_steady(
        arrays, y, inputs, head, tol, _filter_outputs)
    early = jnp.arange(num_t) < k

    def pick(buf, late):
        buf = jnp.pad(buf, [(0, num_t - head)] + [(0, 0)] * (buf.ndim - 1))
        late = jnp.broadcast_to(late, buf.shape)
        return jnp.where(early.reshape((-1,) + (1,) * (buf.ndim - 1)), buf, late)

    def steady_tail(_):
        lps, means, pred, *_ = _steady_means(arrays, carry.mean, chol, w, y, inputs, start=k)
        return tuple(map(pick, bufs, (lps, pred, pred_cov, means, filt_cov)))

    def exact_tail(_):
        def step(c, xs):
            res = kalman_step(arrays, c, *xs)
            return res[1], _filter_outputs(res)

        xs = (y[head:], jnp.ones((num_t - head, dim), bool), inputs[head:])
        tail = jax.lax.scan(step, carry, xs)[1]
        return tuple(jnp.concatenate([b, t_], axis=0) for b, t_ in zip(bufs, tail, strict=True))

    lp, mean, cov, f_mean, f_cov = jax.lax.cond(steady, steady_tail, exact_tail, None)
    return KalmanFilterResult(pairwise_sum(lp), lp, mean, cov, f_mean, f_cov)


def _steady_gain(arrays: GaussianSSMArrays, filt_cov, tol):
    """Constant-gain pieces after the filtered covariance ``filt_cov``: the predicted
    covariance, the innovation factor, the whitened gain, the next filtered covariance and
    whether one more Riccati step left the filtered covariance unchanged (``tol`` relative).
    """
    f, h = arrays.dynamics_weights, arrays.emission_weights
    pred_cov = symmetrize(f @ filt_cov @ f.T + arrays.dynamics_cov)
    chol = jnp.linalg.cholesky(symmetrize(h @ pred_cov @ h.T + arrays.emission_cov))
    w = jsl.solve_triangular(chol, h @ pred_cov, lower=True)
    new_cov = symmetrize(pred_cov - w.T @ w)
    return pred_cov, chol, w, new_cov, _unchanged(new_cov, filt_cov, tol)


def _unchanged(new, old, tol):
    scale = jnp.maximum(jnp.max(jnp.abs(old)), jnp.finfo(old.dtype).tiny)
    return jnp.max(jnp.abs(new - old)) <= tol * scale


def _steady_smoother_parts(arrays: GaussianSSMArrays, head: int, tol, p_head=None):
    """The constant matrices of `steady_state_smoother` and whether they apply.

    Covariances only (no ``y``: with complete data they do not depend on it, so the check
    is the same for every sequence of a batch). Returns the predicted and filtered
    covariances for ``t >= head``, the innovation factor, the whitened gain, ``L^{-1} H``,
    ``L = F (I - K H)``, ``H^T S^{-1} H``, ``N`` far from the end, the ``N`` of the last
    ``head`` backward steps (from the end) and the convergence flag. ``p_head``: the
    filtered covariance after step ``head - 1`` if known (the exact initial filter's, with
    diffuse directions), else the Riccati recursion from ``initial_cov`` gives it.
    """
    f, h = arrays.dynamics_weights, arrays.emission_weights
    eye = jnp.eye(f.shape[0], dtype=arrays.initial_cov.dtype)

    def riccati(p_filt, _):
        return _steady_gain(arrays, p_filt, tol)[3], None

    if p_head is None:
        p0 = arrays.initial_cov
        w0 = jsl.solve_triangular(jnp.linalg.cholesky(
            symmetrize(h @ p0 @ h.T + arrays.emission_cov)), h @ p0, lower=True)
        p_head, _ = jax.lax.scan(riccati, symmetrize(p0 - w0.T @ w0), None, length=head - 1)
    pred_cov, chol, w, filt_cov, conv_p = _steady_gain(arrays, p_head, tol)
    lh = jsl.solve_triangular(chol, h, lower=True)  # L^{-1} H  (D, n)
    l_bar = f @ (eye - w.T @ lh)
    info_mat = lh.T @ lh

    def n_step(nmat, _):
        new = symmetrize(info_mat + l_bar.T @ nmat @ l_bar)
        return new, new

    n_far, n_rev = jax.lax.scan(n_step, info_mat, None, length=head)
    conv_n = _unchanged(n_step(n_far, None)[0], n_far, tol)
    return (pred_cov, filt_cov, chol, w, lh, l_bar, info_mat, n_far, n_rev,
            conv_p & conv_n)


def steady_state_smoother(arrays: GaussianSSMArrays, y, inputs, *, head: int, tol=None
                          ) -> KalmanSmootherResult:
    """`kalman_smoother` of fully observed ``y`` using the steady state where it holds.

    With every entry observed and time-invariant matrices the covariances do not depend on
    ``y``. If the filtered covariance has converged after ``head`` exact steps, and the
    backward ``N_t`` recursion (with the constant ``L = F (I - K H)``) has converged
    ``head`` steps before the end (one more step changes either by at most ``tol``
    relative; float64: ``1e-13``), then for ``t >= head`` the predicted covariance, gain
    and ``L`` are constant, ``N_t`` is constant up to the last ``head`` steps, and the
    filtered means and the backward ``r_t`` (and the diffuse columns and ``r_X``) follow
    affine recursions with constant matrices, evaluated by associative scans:

        m_t = (I - K H) F m_{t-1} + g_t,     r_{t-1} = L^T r_t + H^T S^{-1} v_t.

    The first ``head`` steps (forward and backward) run exactly; with diffuse directions
    they run the exact initial filter and smoother
    (`statseq.inference.kalman_diffuse_smoother`), the steady state is checked from the
    filtered covariance they end with, and every diffuse direction must be identified
    within them. Otherwise, and for
    ``T <= 2 head + 1``, this is `kalman_smoother`. The same numbers up to the
    convergence tolerance; tests check this.

    Args:
        arrays: time-invariant matrices (no time axes).
        y: ``(T, D)`` fully observed.
        inputs: ``(T, m)``.
        head: number of exact steps at each end (static).
        tol: relative tolerance of the convergence checks.

    Returns:
        A `KalmanSmootherResult`.

    Examples:
        >>> import jax.numpy as jnp
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)), jnp.zeros(1),
        ...     jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.linspace(0.0, 1.0, 40)[:, None]
        >>> res = steady_state_smoother(arr, y, jnp.zeros((40, 0)), head=8)
        >>> res.smoothed_means.shape
        (40, 1)
    """
    if is_time_varying(arrays):
        raise ValueError("the steady-state smoother needs time-invariant matrices")
    num_t, dim = y.shape
    n, q = arrays.initial_diffuse.shape
    dtype = arrays.initial_cov.dtype
    tol = _default_tol(dtype, tol)
    mask = jnp.ones((num_t, dim), bool)
    _check(arrays, y, mask, inputs)
    if num_t <= 2 * head + 1:
        return kalman_smoother(arrays, y, mask, inputs)
    if q:
        return _steady_diffuse(arrays, y, inputs, head, tol)
    (pred_cov, filt_cov, chol, w, lh, l_bar, info_mat, n_far, n_rev,
     converged) = _steady_smoother_parts(arrays, head, tol)
    eye = jnp.eye(n, dtype=dtype)
    num_k = num_t - head
    cat = jnp.concatenate

    def steady(_):
        carry, (lp_h, mean_h, cov_h, dif_h, filt_h, inn_h) = _scan_filter(
            arrays, y[:head], mask[:head], inputs[:head], collapse=False)
        inn_lp, f_means, p_means, z, a_mat = _steady_means(
            arrays, carry.mean, chol, w, y[head:], inputs[head:])
        offs = (z @ lh)[:, :, None]  # H^T S^{-1} v_t
        filt = KalmanCarry(cat([filt_h.mean, f_means]),
                           cat([filt_h.cov, jnp.broadcast_to(filt_cov, (num_k, n, n))]),
                           None, None, None, None, None, None)
        total = pairwise_sum(cat([lp_h, inn_lp]))
        back = _affine_scan(l_bar.T, offs[::-1], jnp.zeros_like(offs[0]))[::-1]  # r_{t-1}, r_X
        n_tail = cat([jnp.broadcast_to(n_far, (num_k - head - 1, n, n)), n_rev[::-1],
                      info_mat[None]])
        l_tail = cat([jnp.broadcast_to(l_bar, (num_k - 1, n, n)), eye[None]])
        init = (back[0, :, 0], n_tail[0], back[0, :, 1:])
        xs = (jnp.arange(head), cov_h, inn_h.w, inn_h.z, inn_h.chol, inn_h.h, dif_h)
        r_h, n_h, l_h, _ = _backward_pass(arrays, num_t, init, xs)
        return _smoothed(
            total, cat([mean_h, p_means]), cat([cov_h, jnp.broadcast_to(pred_cov, (num_k, n, n))]),
            filt, cat([r_h, back[:, :, 0]]), cat([n_h, n_tail]), cat([l_h, l_tail]),
            dynamics_weights(arrays, num_t))

    def exact(_):
        return kalman_smoother(arrays, y, mask, inputs)

    return jax.lax.cond(converged, steady, exact, None)


def _steady_diffuse(arrays: GaussianSSMArrays, y, inputs, head: int, tol):
    """`steady_state_smoother` with diffuse directions: the exact initial filter and
    smoother (`statseq.inference.kalman_diffuse_smoother`) over the first ``head`` steps,
    the constant-gain recursions after them. Taken where the data identified every diffuse
    direction within ``head`` steps, one more Riccati step leaves the filtered covariance
    after them unchanged and the backward ``N_t`` has converged (``tol`` relative);
    otherwise `kalman_smoother`."""
    from statseq.inference.kalman_diffuse_smoother import (
        diffuse_backward,
        diffuse_forward,
        diffuse_smoothed,
    )

    num_t, dim = y.shape
    n = arrays.initial_mean.shape[-1]
    num_k = num_t - head
    cat = jnp.concatenate
    carry, (lp_h, mean_h, cov_h, fac_h, filt_h, inn_h, dif_h, ent_h) = diffuse_forward(
        arrays, y[:head], jnp.ones((head, dim), bool), inputs[:head])
    # while diffuse, carry.cov is only P_star: a stand-in keeps the Cholesky finite there
    p_head = jnp.where(carry.collapsed, carry.cov, jnp.eye(n, dtype=carry.cov.dtype))
    (pred_cov, filt_cov, chol, w, lh, l_bar, _, n_far, n_rev,
     converged) = _steady_smoother_parts(arrays, head, tol, p_head)
    ok = converged & carry.collapsed & _unchanged(filt_cov, p_head, tol)

    def exact(_):
        return kalman_smoother(arrays, y, jnp.ones((num_t, dim), bool), inputs)

    def steady(_):
        inn_lp, f_means, p_means, z, _ = _steady_means(
            arrays, carry.mean, chol, w, y[head:], inputs[head:])
        r_tail = _affine_scan(l_bar.T, (z @ lh)[::-1], jnp.zeros((n,), z.dtype))[::-1]
        n_tail = cat([jnp.broadcast_to(n_far, (num_k - head - 1, n, n)), n_rev[::-1],
                      (lh.T @ lh)[None]])
        zeros_v, zeros_m = jnp.zeros((num_k, n), z.dtype), jnp.zeros((num_k, n, n), z.dtype)
        init = (r_tail[0], zeros_v[0], n_tail[0], zeros_m[0], zeros_m[0])
        xs = (jnp.arange(head), dif_h, inn_h.w, inn_h.z, inn_h.chol, inn_h.h, ent_h)
        back_h = diffuse_backward(arrays, init, xs)
        back = tuple(cat([b, t_]) for b, t_ in
                     zip(back_h, (r_tail, zeros_v, n_tail, zeros_m, zeros_m), strict=True))
        filt = KalmanCarry(cat([filt_h.mean, f_means]),
                           cat([filt_h.cov, jnp.broadcast_to(filt_cov, (num_k, n, n))]),
                           cat([filt_h.diffuse, jnp.zeros((num_k,) + fac_h.shape[1:], z.dtype)]),
                           None, None, None, None, None)
        return diffuse_smoothed(
            arrays, pairwise_sum(cat([lp_h, inn_lp])), cat([mean_h, p_means]),
            cat([cov_h, jnp.broadcast_to(pred_cov, (num_k, n, n))]),
            cat([fac_h, jnp.zeros((num_k,) + fac_h.shape[1:], z.dtype)]), filt, back)

    return jax.lax.cond(ok, steady, exact, None)
