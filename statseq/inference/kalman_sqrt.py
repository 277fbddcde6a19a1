"""Square-root (Cholesky-factor) Kalman filter for linear Gaussian state space models.

Same model, time conventions and containers as `statseq.inference.kalman` (time is
0-based, ``t = 0, ..., T-1``):

    x_0 ~ N(m, P)
    x_{t+1} = F_t x_t + B_t u_{t+1} + b_t + w_t,           w_t ~ N(0, Q_t)
    y_t     = H_t x_t + D_t u_t     + d_t + v_t,           v_t ~ N(0, R_t)

but the filter carries lower-triangular factors ``L`` of the state covariances
(``P = L L^T``) instead of the covariances themselves, so every covariance it implies is
positive semi-definite by construction and the factors have the condition number of the
square root of the covariance: where the plain filter's ``P - K S K^T`` cancels to
rounding noise (very precise observations of states with a large prior spread, in
float32), the factors stay accurate.

Both steps use ``Tria(M)``, the lower triangular ``L`` (non-negative diagonal) with
``L L^T = M M^T``, from the QR factorization ``M^T = Q R`` (``L = R^T``):

* update (`sqrt_update`): ``L_S = Tria([N_t, H~_t L_{t|t-1}])``, where ``N_t N_t^T`` is the
  masked observation noise and ``L_S L_S^T`` the innovation covariance ``S_t``; with
  ``X = L_S^{-1} H~_t L_{t|t-1}`` the gain is ``K = L_{t|t-1} X^T L_S^{-1}`` and the
  filtered factor is the Joseph form in square roots,
  ``L_{t|t} = Tria([(I - K H~_t) L_{t|t-1}, K N_t])``; then
  ``m_{t|t} = m_{t|t-1} + K v_t`` and
  ``log p(y_t | y_{<t}) = -1/2 |L_S^{-1} v_t|^2 - sum_i log (L_S)_ii - (n_obs / 2) log 2 pi``
  (the sum over observed entries only). The array form of Morf and Kailath (Kailath, Sayed
  and Hassibi 2000, ch. 12), ``Tria([[N_t, H~_t L], [0, L]])``, gives the same factor in
  exact arithmetic but loses ``eps sqrt(P / R)`` relative accuracy (``1e-8`` at
  ``P / R = 10^16``); the Joseph form keeps ``1e-14`` there (tested against exact
  rational arithmetic);
* predict (`sqrt_predict`): ``L_{t+1|t} = Tria([F_t L_{t|t}, Q_t^{1/2}])``,
  ``m_{t+1|t} = F_t m_{t|t} + B_t u_{t+1} + b_t``.

**Missing data** (``mask`` ``(T, D)``, ``True`` = observed) is marginalized exactly: the
rows of ``H`` of missing entries are zeroed, their residuals set to 0, and the noise
factor is ``N_t = [diag(o) R_t^{1/2}, diag(1 - o)]`` (``o`` the 0/1 mask; ``D x 2D``), so
``N_t N_t^T`` is ``R_t`` on the observed block and the identity on the missing one; the
innovation factor then has identity rows and columns at missing entries and the gain has
zero columns there (the same masked innovation covariance as `kalman.py`). The second
block keeps the observed rows of ``R^{1/2}`` intact even for a non-diagonal ``R``.

**Square roots of the model's covariances** (``P``, ``Q_t``, ``R_t``) are taken by
`psd_cholesky`, a Cholesky factorization that tolerates positive *semi*-definite input:
a pivot at the level of rounding (relative to its own diagonal entry) gives a zero
column instead of a NaN. For a positive definite matrix it is the ordinary Cholesky
factor; for the singular noise covariances of structural time series models (zero
variance on some states) it is an exact factor. It is used instead of an
eigendecomposition because it keeps the relative accuracy of Cholesky on badly scaled
(graded) matrices, and it stays differentiable where ``eigh`` is not (repeated, e.g.
zero, eigenvalues). Fixed matrices are factored once; time-varying ones once per step,
vectorized before the scan.

Exact diffuse initialization (``initial_diffuse`` with ``q > 0``) is not implemented
here; use `statseq.inference.kalman.kalman_filter`.

Gradients flow through the QR factorizations; they require the pre-arrays to have full
column rank, i.e. nonsingular predicted covariances (the plain filter has no such
restriction).

The functions are not jitted themselves: wrap them, or the code that calls them, in
``jax.jit``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from statseq.core.recurrence import pairwise_sum
from statseq.inference.gaussian import symmetrize
from statseq.inference.kalman import (
    GaussianSSMArrays,
    KalmanFilterResult,
    KalmanSmootherResult,
    _check,
    arrays_at,
)

_LOG_2PI = math.log(2.0 * math.pi)


class SqrtKalmanFilterResult(NamedTuple):
    """Output of `sqrt_kalman_filter_factors`.

    Attributes:
        marginal_log_lik: scalar ``log p(y_{0:T-1})``.
        log_probs: ``(T,)`` one-step predictive log-densities (0 at fully masked steps).
        predicted_means: ``(T, n)`` means of ``x_t | y_{<t}``.
        predicted_chols: ``(T, n, n)`` lower-triangular factors (non-negative diagonal) of
            the covariances of ``x_t | y_{<t}``.
        filtered_means: ``(T, n)`` means of ``x_t | y_{<=t}``.
        filtered_chols: ``(T, n, n)`` lower-triangular factors of the covariances of
            ``x_t | y_{<=t}``.
    """

    marginal_log_lik: Any
    log_probs: Any
    predicted_means: Any
    predicted_chols: Any
    filtered_means: Any
    filtered_chols: Any


def psd_cholesky(a):
    """Lower-triangular ``L`` with ``L L^T = a`` for a symmetric positive semi-definite ``a``.

    Column-by-column Cholesky in which a pivot ``d_j <= 10 n eps a_jj`` (rounding level,
    relative to the column's own diagonal entry; in particular ``d_j = 0``) gives a zero
    column. For a positive definite ``a`` this is the Cholesky factor; a zero row and
    column of ``a`` give a zero row and column of ``L``.

    Args:
        a: ``(n, n)`` symmetric positive semi-definite matrix (symmetrized first, so
            gradients are symmetric too).

    Returns:
        ``(n, n)`` lower-triangular factor with a non-negative diagonal.

    Examples:
        >>> import jax.numpy as jnp
        >>> psd_cholesky(jnp.diag(jnp.array([4.0, 0.0, 9.0]))).diagonal().tolist()
        [2.0, 0.0, 3.0]
    """
    a = symmetrize(jnp.asarray(a))
    n = a.shape[-1]
    if n == 0:
        return a
    tol = 10.0 * n * jnp.finfo(a.dtype).eps
    rows = jnp.arange(n)

    def column(j, chol):
        # column j of the Schur complement: a[:, j] - L[:, :j] L[j, :j]^T (columns >= j of
        # L are still zero)
        col = a[:, j] - chol @ chol[j]
        pivot = col[j]
        ok = pivot > tol * jnp.abs(a[j, j])
        root = jnp.sqrt(jnp.where(ok, pivot, 1.0))
        return chol.at[:, j].set(jnp.where(ok & (rows >= j), col / root, 0.0))

    return jax.lax.fori_loop(0, n, column, jnp.zeros_like(a))


def _tria(m_t):
    """Lower-triangular ``L`` (non-negative diagonal) with ``L L^T = M M^T`` given ``M^T``."""
    r = jnp.linalg.qr(m_t, mode="r")
    return _positive_diagonal(r.T)


def _positive_diagonal(chol):
    sign = jnp.where(jnp.diagonal(chol) < 0, -1.0, 1.0).astype(chol.dtype)
    return chol * sign[None, :]


def sqrt_update(arrays_t: GaussianSSMArrays, mean, chol, y_t, mask_t, u_t):
    """Condition ``N(mean, chol chol^T)`` on ``y_t``: ``(log-density, mean, factor)``.

    ``arrays_t`` holds the matrices at step ``t`` with ``emission_cov`` replaced by a square
    root ``R^{1/2}`` (see `sqrt_kalman_filter_factors`). The innovation factor ``L_S`` is the
    triangular factor of ``[N, H~ L]`` (``N`` the masked noise factor), ``X = L_S^{-1} H~ L``,
    and the filtered factor is the Joseph form in square roots,

        L_{t|t} = Tria([L - L X^T X,  L X^T L_S^{-1} N]),

    i.e. ``(I - K H~) P (I - K H~)^T + K R K^T`` with ``K = L X^T L_S^{-1}``. The array form
    ``Tria([[N, H~ L], [0, L]])`` gives the same factor in exact arithmetic, but its
    backward error perturbs ``N`` by ``eps |H~ L|``: a relative error ``eps sqrt(P / R)``
    (``1e-8`` at ``P / R = 10^16``). Here rounding in ``I - X^T X`` only enters squared.
    """
    dtype = chol.dtype
    n = chol.shape[-1]
    obs = mask_t.astype(dtype)
    h = arrays_t.emission_weights * obs[:, None]
    y_mean = (arrays_t.emission_weights @ mean + arrays_t.emission_input_weights @ u_t
              + arrays_t.emission_bias)
    v = jnp.where(mask_t, y_t - y_mean, 0.0)
    noise = jnp.concatenate([arrays_t.emission_cov * obs[:, None], jnp.diag(1.0 - obs)], axis=1)
    hl = h @ chol
    chol_s = _tria(jnp.concatenate([noise.T, hl.T]))  # L_S L_S^T = H~ P H~^T + N N^T
    solved = jsl.solve_triangular(chol_s, jnp.concatenate([v[:, None], hl, noise], axis=1),
                                  lower=True)
    z, x, noise_w = solved[:, 0], solved[:, 1 : n + 1], solved[:, n + 1 :]
    gain_l = chol @ x.T  # K~ = P H~^T L_S^{-T} = L X^T   (n, D)
    mean_f = mean + gain_l @ z
    chol_f = _tria(jnp.concatenate([(chol - gain_l @ x).T, (gain_l @ noise_w).T]))
    log_det = jnp.sum(jnp.where(mask_t, jnp.log(jnp.diagonal(chol_s)), 0.0))
    log_prob = -0.5 * jnp.sum(z**2) - log_det - 0.5 * jnp.sum(obs) * _LOG_2PI
    return log_prob, mean_f, chol_f


def sqrt_predict(arrays_t: GaussianSSMArrays, mean, chol, u_next):
    """``x_{t+1} | y_{<=t}`` in factors: ``F m + B u_{t+1} + b`` and ``Tria([F L, Q^{1/2}])``
    (``arrays_t.dynamics_cov`` holds ``Q^{1/2}``)."""
    f = arrays_t.dynamics_weights
    mean = f @ mean + arrays_t.dynamics_input_weights @ u_next + arrays_t.dynamics_bias
    return mean, _tria(jnp.concatenate([chol.T @ f.T, arrays_t.dynamics_cov.T]))


def square_root_arrays(arrays: GaussianSSMArrays) -> GaussianSSMArrays:
    """The same container with ``Q`` and ``R`` replaced by their `psd_cholesky` factors
    (``arrays_at`` then indexes them as it does the covariances)."""
    return arrays._replace(
        dynamics_cov=_factor_leaf(arrays.dynamics_cov, 2),
        emission_cov=_factor_leaf(arrays.emission_cov, 2),
    )


def _factor_leaf(leaf, base_ndim):
    return jax.vmap(psd_cholesky)(leaf) if jnp.ndim(leaf) == base_ndim + 1 else psd_cholesky(leaf)


def sqrt_kalman_filter_factors(
    arrays: GaussianSSMArrays, y, mask, inputs
) -> SqrtKalmanFilterResult:
    """Square-root Kalman filter over one sequence, returning the covariance factors.

    Args:
        arrays: the model's matrices (fixed or time-varying, as in `kalman.py`);
            ``initial_diffuse`` must have ``q = 0`` columns.
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `SqrtKalmanFilterResult`; the covariances are ``L L^T`` of its factors.

    Raises:
        NotImplementedError: if the initial law has diffuse directions.

    Examples:
        >>> import jax.numpy as jnp
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)), jnp.zeros(1),
        ...     jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0]])
        >>> res = sqrt_kalman_filter_factors(arr, y, jnp.ones_like(y, bool), jnp.zeros((2, 0)))
        >>> res.filtered_chols.shape
        (2, 1, 1)
        >>> round(float(res.filtered_chols[0, 0, 0] ** 2), 6)  # 1 / (1 + 1)
        0.5
    """
    y = jnp.asarray(y)
    mask = jnp.asarray(mask, bool)
    inputs = jnp.asarray(inputs)
    _check(arrays, y, mask, inputs)
    if arrays.initial_diffuse.shape[1]:
        raise NotImplementedError(
            "sqrt_kalman_filter does not implement exact diffuse initialization "
            f"(initial_diffuse has {arrays.initial_diffuse.shape[1]} columns); use "
            "statseq.inference.kalman.kalman_filter"
        )
    dtype = jnp.result_type(arrays.initial_mean, arrays.initial_cov, y)
    num_t = y.shape[0]
    # the same container, with Q and R replaced by their factors (arrays_at indexes them)
    roots = square_root_arrays(arrays)
    chol0 = psd_cholesky(arrays.initial_cov)
    # the input entering the prediction of x_{t+1}; the last one is never used
    u_next = jnp.concatenate([inputs[1:], jnp.zeros_like(inputs[:1])], axis=0)

    def step(carry, xs):
        mean, chol = carry
        t, y_t, m_t, u_t, u_n = xs
        arr = arrays_at(roots, t)
        log_prob, mean_f, chol_f = sqrt_update(arr, mean, chol, y_t, m_t, u_t)
        mean_p, chol_p = sqrt_predict(arr, mean_f, chol_f, u_n)
        return (mean_p, chol_p), (log_prob, mean, chol, mean_f, chol_f)

    init = (arrays.initial_mean.astype(dtype), chol0.astype(dtype))
    xs = (jnp.arange(num_t), y, mask, inputs, u_next)
    _, (lp, mean_p, chol_p, mean_f, chol_f) = jax.lax.scan(step, init, xs)
    return SqrtKalmanFilterResult(pairwise_sum(lp), lp, mean_p, chol_p, mean_f, chol_f)


def sqrt_kalman_filter(arrays: GaussianSSMArrays, y, mask, inputs) -> KalmanFilterResult:
    """Square-root Kalman filter with the outputs of `kalman.kalman_filter`.

    The log-likelihood is the prediction error decomposition

        log p(y_{0:T-1}) = sum_t log N(y_t; H_t a_t + D_t u_t + d_t, H_t P_t H_t^T + R_t),

    (masked entries drop out), computed from the innovation factors; the covariances are
    returned as ``L L^T`` of the carried factors (see `sqrt_kalman_filter_factors` for the
    factors themselves).

    Args:
        arrays: the model's matrices (``initial_diffuse`` with ``q = 0`` columns).
        y: ``(T, D)`` observations.
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `KalmanFilterResult`.

    Raises:
        NotImplementedError: if the initial law has diffuse directions.

    Examples:
        >>> import jax.numpy as jnp
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)), jnp.zeros(1),
        ...     jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0]])
        >>> res = sqrt_kalman_filter(arr, y, jnp.ones_like(y, bool), jnp.zeros((2, 0)))
        >>> [round(float(p), 6) for p in res.predicted_covs[:, 0, 0]]  # 1, then 1/2 + 1
        [1.0, 1.5]
    """
    res = sqrt_kalman_filter_factors(arrays, y, mask, inputs)

    def gram(chol):
        return chol @ jnp.swapaxes(chol, -1, -2)

    return KalmanFilterResult(
        res.marginal_log_lik,
        res.log_probs,
        res.predicted_means,
        gram(res.predicted_chols),
        res.filtered_means,
        gram(res.filtered_chols),
    )


# ---- smoother ---------------------------------------------------------------------------
class SqrtKalmanSmootherResult(NamedTuple):
    """Output of `sqrt_kalman_smoother_factors`.

    Attributes:
        marginal_log_lik: scalar ``log p(y_{0:T-1})``.
        filtered_means, filtered_chols: as in `SqrtKalmanFilterResult`.
        smoothed_means: ``(T, n)`` ``E[x_t | y_{0:T-1}]``.
        smoothed_chols: ``(T, n, n)`` lower-triangular factors of ``Cov[x_t | y_{0:T-1}]``.
        smoothed_cross_covs: ``(T-1, n, n)`` ``Cov[x_{t+1}, x_t | y_{0:T-1}]``.
    """

    marginal_log_lik: Any
    filtered_means: Any
    filtered_chols: Any
    smoothed_means: Any
    smoothed_chols: Any
    smoothed_cross_covs: Any


def smoother_gain(filt_chol, fl, pred_chol, regular=None):
    """The smoother gain ``J = P_{t|t} F^T P_{t+1|t}^+`` from factors.

    With ``L_f = filt_chol``, ``fl = F L_f`` and ``L_p = pred_chol`` (``L_p L_p^T =
    F L_f L_f^T F^T + Q``), ``J = L_f W^T L_p^{-1}`` with ``W = L_p^{-1} F L_f`` (two
    triangular solves) when ``L_p`` is nonsingular. When it is singular (a diagonal entry
    ``<= 10 n eps max|L_p|``: e.g. an AR(2) in companion form, ``Q = diag(q, 0)``,
    observed without noise) ``P_{t+1|t}`` is refactored by `psd_cholesky` (rows below
    ``(10 n eps)^2`` of the largest variance zeroed), which gives zero columns ``Z`` of
    ``C``, and ``G`` inverts ``C`` on the other columns (zero rows and columns at ``Z``):
    ``J = L_f (G F L_f)^T G``. The columns of ``F P_{t|t}`` lie in the range of
    ``P_{t+1|t}``, so this ``J`` solves ``J P_{t+1|t} = P_{t|t} F^T`` exactly and the RTS
    recursion keeps its exact (dense Gaussian conditioning) answer; the inverse of a
    singular factor gave NaN. Only array operations (no LAPACK call) on that branch, so it
    may be batched (`kalman_sqrt_parallel`).

    Args:
        filt_chol: ``(n, n)`` factor ``L_{t|t}``.
        fl: ``(n, n)`` product ``F_t L_{t|t}``.
        pred_chol: ``(n, n)`` lower-triangular factor ``L_{t+1|t}``.
        regular: optional ``(L_f, F L_f, L_p) -> J`` for a nonsingular ``L_p`` (default:
            two triangular solves).

    Returns:
        ``(n, n)`` gain ``J_t``.
    """
    n = pred_chol.shape[-1]
    rtol = 10.0 * n * jnp.finfo(pred_chol.dtype).eps
    scale = jnp.max(jnp.abs(pred_chol))
    singular = jnp.min(jnp.abs(jnp.diagonal(pred_chol))) <= rtol * scale
    if regular is None:
        regular = _regular_gain

    def nonsingular(operands):
        l_f, f_l, l_p = operands
        # an identity stands in for a singular factor so that neither branch makes NaN
        # (under vmap both branches run)
        return regular(l_f, f_l, jnp.where(singular, jnp.eye(n, dtype=l_p.dtype), l_p))

    def pseudo(operands):
        l_f, f_l, l_p = operands
        cov = l_p @ l_p.T
        var = jnp.diagonal(cov)
        keep = var > rtol**2 * jnp.max(var)
        chol = psd_cholesky(jnp.where(keep[:, None] & keep[None, :], cov, 0.0))
        inv = _skip_inverse_lower(chol)
        return l_f @ (inv @ f_l).T @ inv

    return jax.lax.cond(singular, pseudo, nonsingular, (filt_chol, fl, pred_chol))


def _regular_gain(l_f, f_l, l_p):
    w = jsl.solve_triangular(l_p, f_l, lower=True)
    return jsl.solve_triangular(l_p, w @ l_f.T, lower=True, trans=1).T


def _skip_inverse_lower(chol):
    """``G`` with ``G_SS = C_SS^{-1}`` and zero rows and columns at the zero pivots of the
    lower-triangular ``C`` (forward substitution that sets the unknown of a zero pivot to 0;
    array operations only)."""
    n = chol.shape[-1]
    eye = jnp.eye(n, dtype=chol.dtype)

    def row(i, x):
        e = eye[i]
        l_row = e @ chol
        r = e - l_row @ x  # rows >= i of x are still zero
        piv = l_row @ e
        ok = piv > 0
        return x + e[:, None] * jnp.where(ok, r / jnp.where(ok, piv, 1.0), 0.0)[None, :]

    return jax.lax.fori_loop(0, n, row, jnp.zeros_like(chol))


def sqrt_smoother_step(arrays_t: GaussianSSMArrays, filt_mean, filt_chol, pred_mean_next,
                       pred_chol_next, sm_mean_next, sm_chol_next):
    """One backward step of the square-root Rauch-Tung-Striebel smoother.

    ``arrays_t`` holds ``Q_t^{1/2}`` in ``dynamics_cov``. With the gain
    ``J_t = P_{t|t} F_t^T P_{t+1|t}^{-1} = L_{t|t} W^T L_{t+1|t}^{-1}``,
    ``W = L_{t+1|t}^{-1} F_t L_{t|t}``,

        m_{t|T} = m_{t|t} + J_t (m_{t+1|T} - m_{t+1|t}),
        L_{t|T} = Tria([(I - J_t F_t) L_{t|t},  J_t Q_t^{1/2},  J_t L_{t+1|T}]),
        Cov[x_{t+1}, x_t | y] = P_{t+1|T} J_t^T,

    the factor of ``P_{t|t} + J_t (P_{t+1|T} - P_{t+1|t}) J_t^T`` written in Joseph form
    (``x_{t+1}`` plays the observation of ``x_t``, ``Q_t`` its noise): like the filter's
    update, it keeps its relative accuracy when ``F P_{t|t} F^T`` and ``Q`` differ by up to
    ``1 / eps``, where the factor of the array form ``Tria([[F L, Q^{1/2}], [L, 0]])``
    loses ``eps`` times the square root of their ratio.

    Returns:
        ``(smoothed mean, smoothed factor, cross-covariance)`` of step ``t``.
    """
    f = arrays_t.dynamics_weights
    fl = f @ filt_chol
    gain = smoother_gain(filt_chol, fl, pred_chol_next)
    mean = filt_mean + gain @ (sm_mean_next - pred_mean_next)
    chol = _tria(jnp.concatenate([(filt_chol - gain @ fl).T, (gain @ arrays_t.dynamics_cov).T,
                                  (gain @ sm_chol_next).T]))
    cross = sm_chol_next @ (sm_chol_next.T @ gain.T)
    return mean, chol, cross


def sqrt_kalman_smoother_factors(
    arrays: GaussianSSMArrays, y, mask, inputs
) -> SqrtKalmanSmootherResult:
    """Square-root Rauch-Tung-Striebel smoother over one sequence, returning the factors.

    `sqrt_kalman_filter_factors` forward, then `sqrt_smoother_step` backward from
    ``m_{T-1|T-1}, L_{T-1|T-1}``: only QR factorizations and triangular solves, so every
    covariance is positive semi-definite by construction and keeps its relative accuracy
    where the covariance-form smoothers cancel (``P - P N P`` when observations are far
    more precise than the dynamics noise: at ``Q / R = 10^16`` the Durbin-Koopman
    smoother's variances are wrong by a factor of 10; these keep ``1e-14``, tested against
    exact rational arithmetic).

    The gain ``J_t`` inverts the predicted factor ``L_{t+1|t}``; where that is singular
    (e.g. a singular ``Q_t`` with exactly observed states) it uses a generalized inverse
    instead, which keeps the recursion exact (see `smoother_gain`).

    Args:
        arrays: the model's matrices (``initial_diffuse`` with ``q = 0`` columns).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `SqrtKalmanSmootherResult`.

    Raises:
        NotImplementedError: if the initial law has diffuse directions.

    Examples:
        >>> import jax.numpy as jnp
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)), jnp.zeros(1),
        ...     jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0]])
        >>> res = sqrt_kalman_smoother_factors(arr, y, jnp.ones_like(y, bool),
        ...                                    jnp.zeros((2, 0)))
        >>> round(float(res.smoothed_chols[0, 0, 0] ** 2), 6)  # 1/2 - (1/3)^2 * 3/2 ... = 0.4
        0.4
    """
    filt = sqrt_kalman_filter_factors(arrays, y, mask, inputs)
    roots = square_root_arrays(arrays)

    def back(carry, xs):
        m_next, l_next = carry
        t, m_f, l_f, m_p_next, l_p_next = xs
        mean, chol, cross = sqrt_smoother_step(arrays_at(roots, t), m_f, l_f, m_p_next,
                                               l_p_next, m_next, l_next)
        return (mean, chol), (mean, chol, cross)

    num_t = filt.filtered_means.shape[0]
    init = (filt.filtered_means[-1], filt.filtered_chols[-1])
    xs = (jnp.arange(num_t - 1), filt.filtered_means[:-1], filt.filtered_chols[:-1],
          filt.predicted_means[1:], filt.predicted_chols[1:])
    _, (mean_s, chol_s, cross) = jax.lax.scan(back, init, xs, reverse=True)
    return SqrtKalmanSmootherResult(
        filt.marginal_log_lik,
        filt.filtered_means,
        filt.filtered_chols,
        jnp.concatenate([mean_s, init[0][None]]),
        jnp.concatenate([chol_s, init[1][None]]),
        cross,
    )


def sqrt_kalman_smoother(arrays: GaussianSSMArrays, y, mask, inputs) -> KalmanSmootherResult:
    """Square-root smoother with the outputs of `kalman.kalman_smoother`.

    The smoothed moments of every ``x_t`` given all of ``y`` by the square-root
    Rauch-Tung-Striebel recursion (see `sqrt_kalman_smoother_factors`; same model, same
    restrictions), with the covariances returned as ``L L^T`` of the factors:

        E[x_t | y] = m_{t|t} + J_t (E[x_{t+1} | y] - m_{t+1|t}),
        Cov[x_t | y] = P_{t|t} + J_t (Cov[x_{t+1} | y] - P_{t+1|t}) J_t^T,
        Cov[x_{t+1}, x_t | y] = Cov[x_{t+1} | y] J_t^T,   J_t = P_{t|t} F_t^T P_{t+1|t}^{-1}.

    Args:
        arrays: the model's matrices (``initial_diffuse`` with ``q = 0`` columns).
        y: ``(T, D)`` observations.
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `~statseq.inference.kalman.KalmanSmootherResult`.

    Raises:
        NotImplementedError: if the initial law has diffuse directions.

    Examples:
        >>> import jax.numpy as jnp
        >>> from statseq.inference.kalman import kalman_smoother
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.9 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0], [-0.3]])
        >>> args = (arr, y, jnp.ones_like(y, bool), jnp.zeros((3, 0)))
        >>> res = sqrt_kalman_smoother(*args)
        >>> bool(jnp.allclose(res.smoothed_covs, kalman_smoother(*args).smoothed_covs))
        True
    """
    res = sqrt_kalman_smoother_factors(arrays, y, mask, inputs)
    return KalmanSmootherResult(
        res.marginal_log_lik,
        res.filtered_means,
        _gram(res.filtered_chols),
        res.smoothed_means,
        _gram(res.smoothed_chols),
        res.smoothed_cross_covs,
    )


def _gram(chol):
    return chol @ jnp.swapaxes(chol, -1, -2)
