"""Parallel-in-time Kalman filtering and smoothing by associative scans.

Same model, names, arguments and results as `statseq.inference.kalman` (see there for the
model, the time conventions, masks, inputs and the exact diffuse initialization), so that
callers switch with a flag; ``O(log T)`` sequential depth (up to a block of 16 steps, see
below) and ``O(T n^3)`` work, following Särkkä and García-Fernández (2021), *Temporal
parallelization of Bayesian smoothers*, IEEE Trans. Automatic Control 66(1).

Write ``c_t = B_t u_{t+1} + b_t`` for the dynamics offset, ``e_t = D_t u_t + d_t`` for the
emission offset, ``H~`` for ``H`` with the rows of missing entries zeroed and ``S~`` for an
innovation covariance made the identity on missing entries and zero across, with the
residual zeroed there: a masked entry then contributes nothing, exactly as in the
sequential filter.

**Filter: covariances.** Element ``t >= 1`` is Särkkä and García-Fernández's element of
step ``t`` as a function of ``x_{t-1}``, ``p(x_t | y_t, x_{t-1}) = N(A_t x_{t-1} + b_t,
C_t)`` and ``p(y_t | x_{t-1}) ~ exp(-1/2 x^T J_t x + eta_t^T x)``; with the dynamics at
``t - 1``, the emission at ``t``, ``S~ = H~ Q H~^T + R`` (masked) and ``K = Q H~^T S~^{-1}``,

    A_t = (I - K H~) F,   C_t = Q - K H~ Q,   J_t = F^T H~^T S~^{-1} H~ F;

element 0 is ``A_0 = 0``, ``C_0 = P_{0|0}``, ``J_0 = 0``. Blocks combine (``i`` earlier,
``j`` later, ``M = I + C_i J_j``, whose eigenvalues are ``>= 1``, factored by LU) as

    A = A_j M^{-1} A_i,   C = A_j M^{-1} C_i A_j^T + C_j,   J = A_i^T M^{-T} J_j A_i + J_i,

and the prefix ``0:t`` holds ``C = P_{t|t}``. No state covariance is ever inverted, so
singular ``Q`` (structural models) and singular ``P`` (the ``kappa = 0`` part of diffuse
states) need no care.

**Filter: means.** The paper's mean parts (``b``, ``eta``) are not scanned: in the
information form ``eta_j - J_j b_i`` cancels large terms when an observation nearly
determines a direction the dynamics do not perturb (a near-singular ``R`` with a singular
``Q``), which costs up to ``cond(S~) eps`` relative accuracy (``1e-9`` in our hostile tests).
Given the covariances, the gains are known and the filtered means obey the affine
recursion

    m_t = Phi_t m_{t-1} + beta_t,   Phi_t = (I - K_t H~_t) F_{t-1},
    beta_t = c_{t-1} + K_t (y_t - H_t c_{t-1} - e_t)           (K_t from P_t = P_{t|t-1}),

a second scan over the maps ``(Phi, beta)`` (composed by ``(Phi_j Phi_i, Phi_j beta_i +
beta_j)``), as accurate as the sequential filter. The one-step predictive densities are
then evaluated for every ``t`` at once with `~statseq.inference.kalman.innovation` and
summed as a balanced binary tree.

**Smoother.** The backward pass is the Durbin-Koopman recursion of the sequential
smoother, whose steps are affine maps that compose associatively: ``r_{t-1} = L_t^T r_t +
a_t`` and ``N_{t-1} = L_t^T N_t L_t + M_t`` (``L_t = F_t (I - K_t H~_t)``, ``a_t = H~^T
S~^{-1} v_t``, ``M_t = H~^T S~^{-1} H~``) compose into ``(L_j L_i, L_i^T a_j + a_i, L_i^T M_j
L_i + M_i)``, a suffix scan from ``r_{T-1} = 0, N_{T-1} = 0``. This replaces the paper's
backward elements ``E_t = P_{t|t} F^T P_{t+1|t}^{-1}``, which need the inverse of the
predicted covariance: singular whenever ``Q`` is (a local linear trend with a fixed level,
the ``kappa = 0`` part of a diffuse state), and when it is merely near-singular the
pseudo-inverse loses accuracy (``1e-9`` against a 40-digit reference, where this form
keeps ``1e-13``). Nothing but innovation covariances is inverted.

**Exact diffuse initialization** (`statseq.inference.kalman_parallel_diffuse`). With
diffuse directions the exact initial filter of the sequential module runs over the head of
the sequence, until the data identify every diffuse direction (usually ``q`` steps), and the
scans here over the rest, a proper-prior problem; the exact initial smoother then runs back
over the head. Everything equals the sequential filter and smoother, down to zero
observation variance (de Jong's augmented recursion, run by these scans before, cancels
terms of order ``1 / R``). The scans below still carry ``1 + q`` columns for the means
(the data and regression columns ``X_t = H~ A_t``), with ``q = 0`` in every call.

**Scan schedule.** `jax.lax.associative_scan` traces the operator twice per level of its
recursion: with the matrix solves above, a filter took 8 s to compile at ``T = 50`` and
23 s at ``T = 10^4`` on a 2-core CPU. `_scan` runs the same associative scan as sequential
scans inside blocks of 16 consecutive elements (all blocks at once), recursive doubling
over the block totals, and one combination of each block with the total before it: the
operator is compiled three times whatever ``T`` (2 s and 3 s), the work stays ``O(T)`` and
the depth is ``16 + log2(T / 16)``.

The functions are not jitted themselves: wrap them, or the code that calls them, in
``jax.jit``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.recurrence import pairwise_sum
from statseq.inference.gaussian import symmetrize
from statseq.inference.kalman import (
    GaussianSSMArrays,
    KalmanFilterResult,
    KalmanSmootherResult,
    _check,
    _masked_innovation_cov,
    _masked_rows,
    arrays_at,
    dynamics_weights,
    smoothed_from_filtered,
)

_LOG_2PI = math.log(2.0 * math.pi)


def _mT(x):
    """Transpose of the last two axes."""
    return jnp.swapaxes(x, -1, -2)


# ---- small dense linear algebra -------------------------------------------------------------
# Everything below is batched over time. jaxlib 0.10's CPU LAPACK kernels split a large
# batch into tasks on XLA's intra-op thread pool and block waiting for them; when as many
# such calls run concurrently as the pool has threads (two independent triangular solves on
# a 2-core machine suffice), every pool thread waits and the program deadlocks (the hang of
# dynamax's parallel filter at T = 10^4). So the per-step factorizations are written with
# plain array operations: loops over the (small) matrix dimension whose index enters through
# one-hot vectors, so that each kernel compiles to one small loop body whatever its size.


def _unit(i, k, dtype):
    return (jnp.arange(k) == i).astype(dtype)


def _cholesky(a):
    """Lower Cholesky factors of ``(..., k, k)`` positive definite matrices."""
    k = a.shape[-1]
    idx = jnp.arange(k)

    def column(j, chol):
        e = _unit(j, k, a.dtype)
        # a[:, j] - sum_{p < j} L[:, p] L[j, p]   (columns p >= j of L are still zero)
        col = a @ e - jnp.einsum("...ip,...p->...i", chol, e @ chol)
        diag = jnp.sqrt(col @ e)[..., None]
        col = jnp.where(idx == j, diag, jnp.where(idx > j, col / diag, 0.0))
        return chol + col[..., :, None] * e

    return jax.lax.fori_loop(0, k, column, jnp.zeros_like(a))


def _solve_lower(chol, b):
    """``L^{-1} B`` for lower-triangular ``(..., k, k)`` ``L`` and ``(..., k, m)`` ``B``."""
    k = chol.shape[-1]

    def row(i, x):
        e = _unit(i, k, chol.dtype)
        l_row = e @ chol  # (..., k); rows >= i of x are still zero
        r = e @ b - jnp.einsum("...p,...pm->...m", l_row, x)
        return x + e[:, None] * (r / (l_row @ e)[..., None])[..., None, :]

    return jax.lax.fori_loop(0, k, row, jnp.zeros_like(b))


def _solve(a, b):
    """``A^{-1} B`` for ``(..., k, k)`` ``A`` and ``(..., k, m)`` ``B`` by Gaussian elimination
    with partial pivoting (LAPACK's ``gesv``, unblocked)."""
    k = a.shape[-1]
    idx = jnp.arange(k)

    def eliminate(i, aug):
        e = _unit(i, k, a.dtype)
        col = aug[..., :k] @ e
        p = jnp.argmax(jnp.where(idx >= i, jnp.abs(col), -1.0), axis=-1)[..., None]
        perm = jnp.where(idx == i, p, jnp.where(idx == p, i, idx))  # swap rows i and p
        aug = jnp.take_along_axis(aug, perm[..., :, None], axis=-2)
        pivot_row = e @ aug  # (..., k + m)
        factors = jnp.where(idx > i, (aug[..., :k] @ e) / (pivot_row[..., :k] @ e)[..., None],
                            0.0)
        return aug - factors[..., :, None] * pivot_row[..., None, :]

    aug = jax.lax.fori_loop(0, k, eliminate, jnp.concatenate([a, b], axis=-1))
    upper, rhs = aug[..., :k], aug[..., k:]

    def back(j, x):
        e = _unit(k - 1 - j, k, a.dtype)
        u_row = e @ upper  # rows > i of x are done, rows <= i still zero
        r = e @ rhs - jnp.einsum("...p,...pm->...m", u_row, x)
        return x + e[:, None] * (r / (u_row @ e)[..., None])[..., None, :]

    return jax.lax.fori_loop(0, k, back, jnp.zeros_like(b))


class _Factor(NamedTuple):
    """Cholesky factor of a step's masked innovation covariance, with what is whitened by it."""

    chol: Any  # (D, D) L, L L^T = S~ = H~ P H~^T + R (masked)
    h: Any  # (D, n) H~
    z: Any  # (D,) L^{-1} v
    extra: Any  # (D, k) L^{-1} [H~ P, further columns]
    log_prob: Any  # log N(v_o; 0, S_oo)


def _residual(arrays_t: GaussianSSMArrays, mean, y_t, mask_t, u_t):
    y_mean = (arrays_t.emission_weights @ mean + arrays_t.emission_input_weights @ u_t
              + arrays_t.emission_bias)
    return jnp.where(mask_t, y_t - y_mean, 0.0)


def _log_density(z, chol, mask_t):
    log_det = jnp.sum(jnp.where(mask_t, jnp.log(jnp.diagonal(chol)), 0.0))
    return -0.5 * jnp.sum(z**2) - log_det - 0.5 * jnp.sum(mask_t) * _LOG_2PI


def _factor(arrays_t: GaussianSSMArrays, mean, cov, y_t, mask_t, u_t, columns) -> _Factor:
    """`statseq.inference.kalman.innovation` (same formulas) with the kernels above, and one
    triangular solve for the residual, ``H~ P`` and the further ``columns`` ``(D, k)``."""
    h = _masked_rows(arrays_t.emission_weights, mask_t)
    hp = h @ cov
    s = symmetrize(hp @ h.T + arrays_t.emission_cov)
    chol = _cholesky(_masked_innovation_cov(s, mask_t))
    v = _residual(arrays_t, mean, y_t, mask_t, u_t)
    solved = _solve_lower(chol, jnp.concatenate([v[:, None], hp, columns], axis=1))
    return _Factor(chol, h, solved[:, 0], solved[:, 1:], _log_density(solved[:, 0], chol,
                                                                         mask_t))


# ---- the scan -------------------------------------------------------------------------------
_BLOCK = 16


def _scan(fn, elems, reverse: bool = False):
    """``jax.lax.associative_scan(fn, elems, reverse=reverse)``, scheduled in blocks.

    With ``k`` blocks of ``B = 16`` consecutive elements: ``B - 1`` rounds scan every block
    (all blocks at once), ``ceil(log2 k)`` rounds of recursive doubling scan the block
    totals, and ``B - 1`` rounds combine every element with the total of the blocks before
    it. Every round combines ``k`` pairs, so the work is ``O(T)`` and the depth
    ``2 B + log2(T / B)``; all rounds run in one loop, so that ``fn`` is compiled once
    (the recursion of `jax.lax.associative_scan` traces it ``2 log2 T`` times, and with
    the matrix solves of the combinations here compilation took tens of seconds).
    """
    if reverse:
        elems = jax.tree.map(lambda x: jnp.flip(x, 0), elems)
    n = jax.tree.leaves(elems)[0].shape[0]
    k = -(-n // _BLOCK)
    # pad the end with copies of the last element (their prefixes are dropped)
    x = jax.tree.map(lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], k * _BLOCK - n, 0)]),
                     elems)
    blocks = jnp.arange(k)
    totals = blocks * _BLOCK + _BLOCK - 1  # positions holding block totals
    doubling = max(k - 1, 0).bit_length()

    def round_(i, x):
        local = i < _BLOCK - 1  # phase 1: x[b, i+1] <- x[b, i] o x[b, i+1]
        phase3 = i >= _BLOCK - 1 + doubling  # phase 3: x[b, j] <- total[b-1] o x[b, j]
        shift = jnp.left_shift(1, jnp.clip(i - (_BLOCK - 1), 0, 30))  # phase 2 distance
        j = i - (_BLOCK - 1 + doubling)
        dst = jnp.where(local, blocks * _BLOCK + i + 1,
                        jnp.where(phase3, blocks * _BLOCK + j, totals))
        src = jnp.where(local, dst - 1,
                        jnp.where(phase3, totals[jnp.maximum(blocks - 1, 0)],
                                  totals[jnp.maximum(blocks - shift, 0)]))
        active = local | jnp.where(phase3, blocks >= 1, blocks >= shift)
        old = jax.tree.map(lambda a: a[dst], x)
        new = fn(jax.tree.map(lambda a: a[src], x), old)
        return jax.tree.map(
            lambda a, nw, od: a.at[dst].set(
                jnp.where(active.reshape((k,) + (1,) * (nw.ndim - 1)), nw, od)),
            x, new, old)

    x = jax.lax.fori_loop(0, 2 * (_BLOCK - 1) + doubling, round_, x)
    out = jax.tree.map(lambda a: a[:n], x)
    if reverse:
        out = jax.tree.map(lambda a: jnp.flip(a, 0), out)
    return out


# ---- forward pass --------------------------------------------------------------------------
def _cov_element(arrays: GaussianSSMArrays, t, y_t, mask_t, u_t):
    """``(A_t, C_t, J_t)``: step ``t`` as a function of ``x_{t-1}`` (``t = 0``: the filtered
    law of ``x_0``, ``A_0 = 0``, ``J_0 = 0``)."""
    prev = arrays_at(arrays, t - 1)
    f = prev.dynamics_weights
    first = t == 0
    cov = jnp.where(first, arrays.initial_cov, prev.dynamics_cov)
    fac = _factor(arrays_at(arrays, t), arrays.initial_mean, cov, y_t, mask_t, u_t,
                  _masked_rows(arrays_at(arrays, t).emission_weights, mask_t) @ f)
    n = f.shape[0]
    w, lhf = fac.extra[:, :n], fac.extra[:, n:]  # L^{-1} H~ P, L^{-1} H~ F
    zero = jnp.zeros_like(f)
    return (jnp.where(first, zero, f - w.T @ lhf), symmetrize(cov - w.T @ w),
            jnp.where(first, zero, symmetrize(lhf.T @ lhf)))


def _cov_combine(earlier, later):
    """``(A, C, J)`` of two consecutive blocks (batched over a leading axis)."""
    a1, c1, j1 = earlier
    a2, c2, j2 = later
    n = a1.shape[-1]
    m = jnp.eye(n, dtype=a1.dtype) + c1 @ j2  # eigenvalues >= 1
    sol = _solve(m, jnp.concatenate([a1, c1], axis=-1))  # M^{-1} [A_i, C_i]
    m_a, m_c = sol[..., :n], sol[..., n:]
    return (a2 @ m_a, symmetrize(a2 @ m_c @ _mT(a2) + c2),
            symmetrize(_mT(m_a) @ j2 @ a1 + j1))


def _filtered_covs(arrays, y, mask, inputs, scan=None):
    """``(T, n, n)`` filtered covariances by a prefix scan over ``(A_t, C_t, J_t)``."""
    elements = jax.vmap(_cov_element, in_axes=(None, 0, 0, 0, 0))(
        arrays, jnp.arange(y.shape[0]), y, mask, inputs
    )
    return (scan or _scan)(_cov_combine, elements)[1]


def _affine_combine(earlier, later):
    """``x -> Phi x + beta`` maps of two consecutive blocks, composed."""
    phi1, beta1 = earlier
    phi2, beta2 = later
    return phi2 @ phi1, phi2 @ beta1 + beta2


class _Forward(NamedTuple):
    """The filter scans and what follows from them for every ``t`` (``kappa = 0`` part)."""

    filt_b: Any  # (T, n, 1 + q) filtered means: data column, then regression columns
    filt_c: Any  # (T, n, n) filtered covariances
    pred_b: Any  # (T, n, 1 + q) predicted means
    pred_c: Any  # (T, n, n) predicted covariances
    log_prob: Any  # (T,) log N(v_t; 0, F_t) of the observed entries
    z: Any  # (T, D) whitened residuals L^{-1} v
    xw: Any  # (T, D, q) whitened regression columns L^{-1} H~ A_t
    w: Any  # (T, D, n) whitened gains L^{-1} H~ P_t
    lh: Any  # (T, D, n) L^{-1} H~


def _joseph(pred_c, closed, w, chol, emission_cov):
    """``(I - K H~) P (I - K H~)^T + K R K^T`` with ``K = W^T L^{-1}`` (zero columns at
    missing entries, so their rows and columns of ``R`` drop out)."""
    gain = _mT(w) @ _solve_lower(chol, jnp.eye(chol.shape[-1], dtype=chol.dtype))
    return symmetrize(closed @ pred_c @ _mT(closed) + gain @ emission_cov @ _mT(gain))


def _congruence_combine(earlier, later):
    """``E -> Phi E Phi^T + r`` maps of two consecutive blocks, composed."""
    phi1, r1 = earlier
    phi2, r2 = later
    return phi2 @ phi1, symmetrize(phi2 @ r1 @ _mT(phi2) + r2)


def _forward(arrays, y, mask, inputs, scan=None) -> _Forward:
    """The forward pass; ``scan`` replaces `_scan` (the time-sharded scan of
    `statseq.distributed.time`), default `_scan`."""
    _check(arrays, y, mask, inputs)
    scan = scan or _scan
    num_t = y.shape[0]
    filt_c = _filtered_covs(arrays, y, mask, inputs, scan)
    dtype = filt_c.dtype
    n = filt_c.shape[-1]
    steps = jnp.arange(num_t)

    def prior(t, c, u_next):
        """``F_t``, the offset ``c_t`` and ``P_{t+1} = F_t P_{t|t} F_t^T + Q_t``."""
        arr = arrays_at(arrays, t)
        f = arr.dynamics_weights
        offset = arr.dynamics_input_weights @ u_next + arr.dynamics_bias
        return f, offset, symmetrize(f @ c @ f.T + arr.dynamics_cov)

    def gains(t, mean, cov, y_t, m_t, u_t):
        fac = _factor(arrays_at(arrays, t), mean, cov, y_t, m_t, u_t, _masked_rows(
            arrays_at(arrays, t).emission_weights, m_t))
        w, lh = fac.extra[:, :n], fac.extra[:, n:]
        return fac.chol, w, lh, w.T @ fac.z

    def predicted_and_gains(filt_c):
        f, offset, pred_c = jax.vmap(prior)(steps[:-1], filt_c[:-1], inputs[1:])
        pred_c = jnp.concatenate([arrays.initial_cov[None], pred_c])
        base = jnp.concatenate([arrays.initial_mean[None], offset])
        return (f, offset, pred_c, base) + jax.vmap(gains)(steps, base, pred_c, y, mask, inputs)

    # One Newton step on the Riccati recursion P_t = R_t(P_{t-1}): the errors E_t of the
    # scanned covariances obey E_t = Phi_t E_{t-1} Phi_t^T + (R_t(P_{t-1}) - P_t) to first
    # order (Phi_t the closed-loop matrix), a linear recursion solved by a second scan. The
    # combination of blocks above loses up to cond(I + C J) eps, which reaches 1e-10 when an
    # observation is nearly exact; the step restores the sequential filter's accuracy.
    f, _, pred_c, _, _, w, lh, _ = predicted_and_gains(filt_c)
    eye = jnp.eye(n, dtype=dtype)
    phi = jnp.concatenate([jnp.zeros((1, n, n), dtype), (eye - _mT(w[1:]) @ lh[1:]) @ f])
    defect = symmetrize(pred_c - _mT(w) @ w) - filt_c
    filt_c = symmetrize(filt_c + scan(_congruence_combine, (phi, defect))[1])

    # the means are linear given the gains: m_t = Phi_t m_{t-1} + beta_t with
    # Phi_t = (I - K_t H~_t) F_{t-1}, beta_t = c_{t-1} + K_t (y_t - H_t c_{t-1} - e_t)
    f, offset, pred_c, base, chol, w, lh, step_gain = predicted_and_gains(filt_c)
    closed = eye - _mT(w) @ lh  # I - K~ H~
    # the filtered covariances from the predicted ones in Joseph form (the sequential
    # filter's update): the scanned ones lose up to eps * P / R relative accuracy where an
    # observation nearly determines a state, the predicted ones do not
    filt_c = jax.vmap(_joseph)(pred_c, closed, w, chol, jax.vmap(
        lambda t: arrays_at(arrays, t).emission_cov)(steps))
    diffuse = arrays.initial_diffuse.astype(dtype)
    first = jnp.concatenate([(base[0] + step_gain[0])[:, None], closed[0] @ diffuse], axis=1)
    rest = jnp.concatenate(
        [(offset + step_gain[1:])[:, :, None], jnp.zeros((num_t - 1,) + diffuse.shape, dtype)],
        axis=2,
    )
    phi = jnp.concatenate([jnp.zeros((1, n, n), dtype), closed[1:] @ f])
    filt_b = scan(_affine_combine, (phi, jnp.concatenate([first[None], rest])))[1]

    pred_b = (f @ filt_b[:-1]).at[:, :, 0].add(offset)
    pred_b = jnp.concatenate(
        [jnp.concatenate([arrays.initial_mean[:, None], diffuse], axis=1)[None], pred_b]
    )

    def innovate(t, b, chol_t, y_t, m_t, u_t):
        arr = arrays_at(arrays, t)
        v = _residual(arr, b[:, 0], y_t, m_t, u_t)
        h = _masked_rows(arr.emission_weights, m_t)
        solved = _solve_lower(chol_t, jnp.concatenate([v[:, None], h @ b[:, 1:]], axis=1))
        return _log_density(solved[:, 0], chol_t, m_t), solved[:, 0], solved[:, 1:]

    log_prob, z, xw = jax.vmap(innovate)(steps, pred_b, chol, y, mask, inputs)
    return _Forward(filt_b, filt_c, pred_b, pred_c, log_prob, z, xw, w, lh)


def _log_probs(fwd: _Forward):
    """``(log_probs, predicted means, predicted covs, filtered means, filtered covs)``."""
    return (fwd.log_prob, fwd.pred_b[:, :, 0], fwd.pred_c, fwd.filt_b[:, :, 0], fwd.filt_c)


def parallel_kalman_filter(arrays: GaussianSSMArrays, y, mask, inputs) -> KalmanFilterResult:
    """Kalman filter over one sequence by a parallel prefix scan (twin of
    `statseq.inference.kalman.kalman_filter`).

    The filtered moments are the prefixes of the elements in the module docstring; then,
    for every ``t`` at once, the predicted moments ``a_t, P_t`` and

        log p(y_t | y_{<t}) = log N(y_t; H_t a_t + D_t u_t + d_t, H_t P_t H_t^T + R_t)

    (observed entries only). With diffuse directions the exact initial filter runs over the
    head (`statseq.inference.kalman_parallel_diffuse`): every output equals the sequential
    filter's, the exact initial filter's ``a_t`` and ``P_star`` included.

    Args:
        arrays: the model's matrices (a `~statseq.inference.kalman.GaussianSSMArrays`).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `~statseq.inference.kalman.KalmanFilterResult`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.kalman import GaussianSSMArrays, kalman_filter
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.9 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0], [-0.3]])
        >>> args = (arr, y, jnp.ones_like(y, bool), jnp.zeros((3, 0)))
        >>> res = jax.jit(parallel_kalman_filter)(*args)  # not jitted itself
        >>> res.filtered_means.shape
        (3, 1)
        >>> seq = jax.jit(kalman_filter)(*args)
        >>> bool(jnp.allclose(res.marginal_log_lik, seq.marginal_log_lik))
        True
    """
    if arrays.initial_diffuse.shape[-1]:
        from statseq.inference.kalman_parallel_diffuse import diffuse_parallel_filter

        return diffuse_parallel_filter(arrays, y, mask, inputs)
    fwd = _forward(arrays, y, mask, inputs)
    log_probs, pred_mean, pred_c, filt_mean, filt_c = _log_probs(fwd)
    return KalmanFilterResult(pairwise_sum(log_probs), log_probs, pred_mean, pred_c, filt_mean,
                              filt_c)


# ---- smoother -----------------------------------------------------------------------------
def _smoother_elements(arrays, fwd: _Forward):
    """``(L_t, a_t, M_t)`` of the backward recursion for every ``t``.

    ``L_t = F_t (I - K_t H~_t)`` (the identity at the last step, where it multiplies
    ``r_{T-1} = 0``), ``a_t = H~^T S~^{-1} [v_t, -X_t]`` (data and regression columns) and
    ``M_t = H~^T S~^{-1} H~``.
    """
    num_t, n = fwd.filt_c.shape[:2]
    eye = jnp.eye(n, dtype=fwd.filt_c.dtype)

    def one(t, w, lh):
        dyn = arrays_at(arrays, t).dynamics_weights
        return jnp.where(t == num_t - 1, eye, dyn @ (eye - w.T @ lh))

    l_mat = jax.vmap(one)(jnp.arange(num_t), fwd.w, fwd.lh)
    resid = jnp.concatenate([fwd.z[:, :, None], -fwd.xw], axis=2)  # whitened [v, -X]
    return l_mat, _mT(fwd.lh) @ resid, symmetrize(_mT(fwd.lh) @ fwd.lh)


def _smoother_combine(later, earlier):
    """The maps ``r -> L^T r + a``, ``N -> L^T N L + M`` of a later block, then of an earlier
    one (`_scan` with ``reverse=True`` calls ``fn(later block, earlier element)``)."""
    l2, a2, m2 = later
    l1, a1, m1 = earlier
    return l2 @ l1, _mT(l1) @ a2 + a1, symmetrize(_mT(l1) @ m2 @ l1 + m1)


def parallel_kalman_smoother(arrays: GaussianSSMArrays, y, mask, inputs) -> KalmanSmootherResult:
    """Smoothed moments of every ``x_t`` given all of ``y`` by parallel scans (twin of
    `statseq.inference.kalman.kalman_smoother`).

    The forward scans of `parallel_kalman_filter` give the predicted moments ``a_t, P_t``
    and the gains; a backward suffix scan over the affine maps of the Durbin-Koopman
    recursion (``S~_t`` the masked innovation covariance, ``v_t`` the innovation),

        r_{t-1} = L_t^T r_t + H~_t^T S~_t^{-1} v_t,
        N_{t-1} = L_t^T N_t L_t + H~_t^T S~_t^{-1} H~_t,

    from ``r_{T-1} = 0, N_{T-1} = 0`` (``L_t = F_t (I - K_t H~_t)``), then gives

        E[x_t | y] = a_t + P_t r_{t-1},
        Cov[x_t | y] = P_{t|t} - (F_t P_{t|t})^T N_t (F_t P_{t|t}),
        Cov[x_{t+1}, x_t | y] = (I - P_{t+1} N_t) L_t P_t,

    the formulas of the sequential smoother (the covariance is ``P_t - P_t N_{t-1} P_t``
    regrouped so that it does not cancel where ``R << Q``), so no state covariance is
    inverted. With diffuse directions, `statseq.inference.kalman_parallel_diffuse`.

    Args:
        arrays: the model's matrices (a `~statseq.inference.kalman.GaussianSSMArrays`).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `~statseq.inference.kalman.KalmanSmootherResult` (filtered moments as the
        sequential smoother reports them).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.kalman import GaussianSSMArrays, kalman_smoother
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.9 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0], [-0.3]])
        >>> args = (arr, y, jnp.ones_like(y, bool), jnp.zeros((3, 0)))
        >>> res = jax.jit(parallel_kalman_smoother)(*args)  # not jitted itself
        >>> res.smoothed_cross_covs.shape
        (2, 1, 1)
        >>> seq = jax.jit(kalman_smoother)(*args)
        >>> bool(jnp.allclose(res.smoothed_means, seq.smoothed_means))
        True
    """
    if arrays.initial_diffuse.shape[-1]:
        from statseq.inference.kalman_parallel_diffuse import diffuse_parallel_smoother

        return diffuse_parallel_smoother(arrays, y, mask, inputs)
    return _parallel_smoother(arrays, y, mask, inputs)[0]


def _parallel_smoother(arrays: GaussianSSMArrays, y, mask, inputs, scan=None):
    """`parallel_kalman_smoother`'s result, with ``r_{-1}`` ``(n, 1 + q)`` and ``N_{-1}``
    ``(n, n)`` (the backward recursion's values at the start of step 0) and the per-step
    log-densities. ``scan`` replaces `_scan` (see `_forward`)."""
    scan = scan or _scan
    fwd = _forward(arrays, y, mask, inputs, scan)
    log_probs, _, _, filt_mean, filt_cov = _log_probs(fwd)
    elements = _smoother_elements(arrays, fwd)
    _, r_prev, n_prev = scan(_smoother_combine, elements, reverse=True)
    l_mat = elements[0]
    cov = fwd.pred_c
    sm_b = fwd.pred_b + cov @ r_prev  # (T, n, 1 + q): smoothed mean and regression on delta
    sm_mean = sm_b[:, :, 0]
    # P_{t|t} - (F P_{t|t})^T N_t (F P_{t|t}): no cancellation where R << Q (the sequential
    # smoother's form, `statseq.inference.kalman.smoothed_from_filtered`)
    sm_cov = smoothed_from_filtered(dynamics_weights(arrays, y.shape[0]), fwd.filt_c, n_prev)
    eye = jnp.eye(cov.shape[-1], dtype=cov.dtype)
    cross = (eye - cov[1:] @ n_prev[1:]) @ l_mat[:-1] @ cov[:-1]
    return (KalmanSmootherResult(pairwise_sum(log_probs), filt_mean, filt_cov, sm_mean, sm_cov,
                                 cross), r_prev[0], n_prev[0], log_probs)
