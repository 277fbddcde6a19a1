"""Steady-state Kalman filtering and smoothing for time-invariant models with complete data.

Once the filtered covariance of a time-invariant model has converged, the gain, the
innovation covariance and the smoother's ``N_t`` are constant, so the mean recursions are
affine maps with constant matrices and run as associative scans instead of a per-step scan
with matrix work. Each function runs an exact head of ``head`` steps, checks convergence
from the covariances alone (they do not depend on ``y`` when nothing is missing), and falls
back to the exact recursion of `statseq.inference.kalman` when it has not converged. Tests
show the fast and exact paths agree to float64 precision.
"""

from __future__ import annotations

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
    _pdet_terms,
    _scan_filter,
    _smoothed,
    initial_carry,
    is_time_varying,
    kalman_filter,
    kalman_smoother,
    kalman_step,
)


def _affine_prefix(a_mat, g):
    """``m_k = A m_{k-1} + g_k`` for ``k = 0..K-1`` from ``m_{-1} = 0``, by associative scan."""

    def compose(left, right):
        a1, g1 = left
        a2, g2 = right
        return a2 @ a1, jnp.einsum("...ij,...j->...i", a2, g1) + g2

    num = g.shape[0]
    mats = jnp.broadcast_to(a_mat, (num,) + a_mat.shape)
    powers, offsets = jax.lax.associative_scan(compose, (mats, g))
    return powers, offsets


def steady_state_log_probs(arrays: GaussianSSMArrays, y, inputs, *, head: int, tol=None):
    """Per-step log-densities of fully observed ``y`` using the steady-state gain.

    The first ``head`` steps run the exact filter (including any diffuse phase). If by then
    the data identified every diffuse direction and the covariance recursion has converged
    (one more Riccati step changes the filtered covariance by less than ``tol`` relative),
    the remaining steps use the constant gain: the filtered mean then follows the
    time-invariant affine recursion ``m_t = (I - K H) F m_{t-1} + g_t``, evaluated by an
    associative scan instead of a step-by-step loop. Otherwise the exact filter continues.
    Same numbers as `kalman_filter` up to the convergence tolerance (float64: ``1e-13``).

    Args:
        arrays: time-invariant matrices (no time axes).
        y: ``(T, D)`` fully observed.
        inputs: ``(T, m)``.
        head: number of exact steps before switching (static).
        tol: relative tolerance of the covariance convergence check.

    Returns:
        ``(log_probs (T,), final KalmanCarry)``.
    """
    if is_time_varying(arrays):
        raise ValueError("the steady-state filter needs time-invariant matrices")
    num_t, dim = y.shape
    dtype = arrays.initial_cov.dtype
    tol = (1e-13 if dtype == jnp.float64 else 1e-6) if tol is None else tol
    mask = jnp.ones((num_t, dim), bool)
    head = min(head, num_t)

    def exact(carry, ys, ms, us):
        def step(c, xs):
            lp, new, _ = kalman_step(arrays, c, *xs)
            return new, lp

        final, lps = jax.lax.scan(step, carry, (ys, ms, us))
        return lps, final

    lp_head, carry = exact(initial_carry(arrays), y[:head], mask[:head], inputs[:head])
    if head == num_t:
        return lp_head, carry
    tail_y, tail_m, tail_u = y[head:], mask[head:], inputs[head:]

    _, chol, w, filt_cov, converged = _steady_gain(arrays, carry.cov, tol)
    converged = carry.collapsed & converged

    def steady(_):
        lps, means, _ = _steady_means(arrays, carry.mean, chol, w, tail_y, tail_u)
        final = carry._replace(mean=means[-1], cov=filt_cov, t=carry.t + tail_y.shape[0])
        return lps, final

    def continue_exact(_):
        return exact(carry, tail_y, tail_m, tail_u)

    lp_tail, final = jax.lax.cond(converged, steady, continue_exact, None)
    return jnp.concatenate([lp_head, lp_tail]), final


def _steady_means(arrays: GaussianSSMArrays, mean0, chol, w, y, u, powers_out=False):
    """Log-densities, filtered and predicted means of fully observed ``y`` under the
    constant gain (innovation factor ``chol``, whitened gain ``w``), from the filtered mean
    ``mean0`` before the first of them, by an associative scan (with the powers of
    ``(I - K H) F`` when ``powers_out``)."""
    f, h = arrays.dynamics_weights, arrays.emission_weights
    dim, n = h.shape
    dtype = chol.dtype
    linv = jsl.solve_triangular(chol, jnp.eye(dim, dtype=dtype), lower=True)  # L^{-1}
    k_mat = w.T @ linv  # K = P H^T S^{-1}
    ikh = jnp.eye(n, dtype=dtype) - k_mat @ h
    drive = u @ arrays.dynamics_input_weights.T + arrays.dynamics_bias
    obs_off = u @ arrays.emission_input_weights.T + arrays.emission_bias
    g = (drive @ ikh.T) + (y - obs_off) @ k_mat.T
    powers, offsets = _affine_prefix(ikh @ f, g)
    means = jnp.einsum("kij,j->ki", powers, mean0) + offsets  # filtered m_t
    pred = jnp.concatenate([mean0[None], means[:-1]], axis=0) @ f.T + drive
    z = (y - pred @ h.T - obs_off) @ linv.T
    lps = (-0.5 * jnp.sum(z**2, axis=1) - jnp.sum(jnp.log(jnp.diagonal(chol)))
           - 0.5 * dim * _LOG_2PI)
    if powers_out:
        return lps, means, pred, z, powers
    return lps, means, pred


def steady_state_filter(arrays: GaussianSSMArrays, y, inputs, *, head: int, tol=None
                        ) -> KalmanFilterResult:
    """`kalman_filter` of fully observed ``y`` using the steady-state gain where it holds.

    As `steady_state_log_probs` (``head`` exact steps, then, if the data identified every
    diffuse direction and the filtered covariance has converged, constant covariances and
    the filtered means as an associative scan), returning every moment. The same numbers
    up to the convergence tolerance; a test checks this.

    Args:
        arrays: time-invariant matrices (no time axes).
        y: ``(T, D)`` fully observed.
        inputs: ``(T, m)``.
        head: number of exact steps before switching (static).
        tol: relative tolerance of the convergence check.

    Returns:
        A `KalmanFilterResult`.
    """
    if is_time_varying(arrays):
        raise ValueError("the steady-state filter needs time-invariant matrices")
    num_t, dim = y.shape
    n = arrays.initial_mean.shape[-1]
    dtype = arrays.initial_cov.dtype
    tol = (1e-13 if dtype == jnp.float64 else 1e-6) if tol is None else tol
    mask = jnp.ones((num_t, dim), bool)
    if num_t <= 2 * head:
        return kalman_filter(arrays, y, mask, inputs)
    carry, (lp_h, mean_h, cov_h, _, filt_h, _) = _scan_filter(
        arrays, y[:head], mask[:head], inputs[:head], collapse=True)
    pred_cov, chol, w, filt_cov, conv = _steady_gain(arrays, carry.cov, tol)
    num_k = num_t - head

    def steady(_):
        lps, means, pred = _steady_means(arrays, carry.mean, chol, w, y[head:], inputs[head:])
        lp = jnp.concatenate([lp_h, lps])
        return KalmanFilterResult(
            pairwise_sum(lp), lp, jnp.concatenate([mean_h, pred]),
            jnp.concatenate([cov_h, jnp.broadcast_to(pred_cov, (num_k, n, n))]),
            jnp.concatenate([filt_h.mean, means]),
            jnp.concatenate([filt_h.cov, jnp.broadcast_to(filt_cov, (num_k, n, n))]))

    def exact(_):
        return kalman_filter(arrays, y, mask, inputs)

    return jax.lax.cond(carry.collapsed & conv, steady, exact, None)


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


def _affine_prefix_cols(a_mat, g):
    """``M_k = A M_{k-1} + G_k`` for matrices ``G_k`` ``(K, n, c)`` from ``M_{-1} = 0``."""

    def compose(left, right):
        a1, g1 = left
        a2, g2 = right
        return a2 @ a1, a2 @ g1 + g2

    mats = jnp.broadcast_to(a_mat, (g.shape[0],) + a_mat.shape)
    return jax.lax.associative_scan(compose, (mats, g))[1]


def _steady_smoother_parts(arrays: GaussianSSMArrays, head: int, tol):
    """The constant matrices of `steady_state_smoother` and whether they apply.

    Covariances only (no ``y``: with complete data they do not depend on it, so the check
    is the same for every sequence of a batch). Returns the predicted and filtered
    covariances for ``t >= head``, the innovation factor, the whitened gain, ``L^{-1} H``,
    ``L = F (I - K H)``, ``H^T S^{-1} H``, ``N`` far from the end, the ``N`` of the last
    ``head`` backward steps (from the end) and the convergence flag.
    """
    f, h = arrays.dynamics_weights, arrays.emission_weights
    eye = jnp.eye(f.shape[0], dtype=arrays.initial_cov.dtype)

    def riccati(p_filt, _):
        return _steady_gain(arrays, p_filt, tol)[3], None

    p0 = arrays.initial_cov
    w0 = jsl.solve_triangular(
        jnp.linalg.cholesky(symmetrize(h @ p0 @ h.T + arrays.emission_cov)), h @ p0, lower=True)
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

    The first ``head`` steps (forward and backward) run exactly. Otherwise, and for
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
    tol = (1e-13 if dtype == jnp.float64 else 1e-6) if tol is None else tol
    mask = jnp.ones((num_t, dim), bool)
    _check(arrays, y, mask, inputs)
    if num_t <= 2 * head + 1:
        return kalman_smoother(arrays, y, mask, inputs)
    (pred_cov, filt_cov, chol, w, lh, l_bar, info_mat, n_far, n_rev,
     converged) = _steady_smoother_parts(arrays, head, tol)
    f = arrays.dynamics_weights
    eye = jnp.eye(n, dtype=dtype)
    num_k = num_t - head
    cat = jnp.concatenate

    def steady(_):
        carry, (lp_h, mean_h, cov_h, dif_h, filt_h, inn_h) = _scan_filter(
            arrays, y[:head], mask[:head], inputs[:head], collapse=False)
        inn_lp, f_means, p_means, z, powers = _steady_means(
            arrays, carry.mean, chol, w, y[head:], inputs[head:], powers_out=True)
        offs = (z @ lh)[:, :, None]  # H^T S^{-1} v_t
        filt = KalmanCarry(cat([filt_h.mean, f_means]),
                           cat([filt_h.cov, jnp.broadcast_to(filt_cov, (num_k, n, n))]),
                           None, None, None, None, None, None)
        total = pairwise_sum(cat([lp_h, inn_lp]))
        p_dif = jnp.zeros((num_k, n, q), dtype)
        if q:
            f_dif = jnp.einsum("kij,jq->kiq", powers, carry.diffuse)
            p_dif = jnp.einsum("ij,kjq->kiq", f, cat([carry.diffuse[None], f_dif[:-1]]))
            xw = jnp.einsum("di,kiq->kdq", lh, p_dif)
            info = carry.info + jnp.cumsum(jnp.einsum("kdq,kdp->kqp", xw, xw), axis=0)
            score = carry.score + jnp.cumsum(jnp.einsum("kdq,kd->kq", xw, z), axis=0)
            filt = filt._replace(diffuse=cat([filt_h.diffuse, f_dif]),
                                 info=cat([filt_h.info, info]),
                                 score=cat([filt_h.score, score]))
            total = total + _pdet_terms(info[-1], score[-1], dtype)[0] - carry.diffuse_log_lik
            offs = cat([offs, jnp.einsum("ij,kjq->kiq", info_mat, p_dif)], axis=2)
        back = _affine_prefix_cols(l_bar.T, offs[::-1])[::-1]  # r_{t-1} (and r_X) at t
        n_tail = cat([jnp.broadcast_to(n_far, (num_k - head - 1, n, n)), n_rev[::-1],
                      info_mat[None]])
        l_tail = cat([jnp.broadcast_to(l_bar, (num_k - 1, n, n)), eye[None]])
        init = (back[0, :, 0], n_tail[0], back[0, :, 1:])
        xs = (jnp.arange(head), cov_h, inn_h.w, inn_h.z, inn_h.chol, inn_h.h, dif_h)
        r_h, n_h, l_h, rx_h = _backward_pass(arrays, num_t, init, xs)
        return _smoothed(
            total, cat([mean_h, p_means]), cat([cov_h, jnp.broadcast_to(pred_cov, (num_k, n, n))]),
            cat([dif_h, p_dif]), filt, q, cat([r_h, back[:, :, 0]]), cat([n_h, n_tail]),
            cat([l_h, l_tail]), cat([rx_h, back[:, :, 1:]]))

    def exact(_):
        return kalman_smoother(arrays, y, mask, inputs)

    return jax.lax.cond(converged, steady, exact, None)
