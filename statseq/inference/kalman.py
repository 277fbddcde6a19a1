"""Linear Gaussian state space models: Kalman filter, smoother and posterior sampling.

Pure array maths for the model (time is 0-based, ``t = 0, ..., T-1``)

    x_0 ~ N(m, P + kappa * A A^T),  kappa -> infinity      (A: diffuse directions, may be empty)
    x_{t+1} = F_t x_t + B_t u_{t+1} + b_t + w_t,           w_t ~ N(0, Q_t)
    y_t     = H_t x_t + D_t u_t     + d_t + v_t,           v_t ~ N(0, R_t)

given as a `GaussianSSMArrays` of matrices. Each dynamics leaf is either fixed or
time-varying with a leading axis of length ``T - 1`` (entry ``t`` is the step from ``x_t``
to ``x_{t+1}``); each emission leaf is fixed or has a leading axis of length ``T``. The
number of axes says which. ``mask`` ``(T, D)`` marks observed entries with ``True``;
missing entries are marginalized exactly (never imputed).

Numerics: every innovation covariance is factored once by Cholesky, the update is written
with the whitened gain ``W = L^{-1} H P``, and the filtered covariance is formed in Joseph
form (`joseph_update`), which keeps its relative accuracy where ``P - W^T W`` cancels
(observations much more precise than the state's spread); the smoother is the backward
recursion of Durbin and Koopman (``r_t``, ``N_t``), which inverts only innovation
covariances, never (possibly singular) state covariances, but computes ``P - P N P``,
which cancels in the same regime. Square-root variants (filter and smoother, accurate
there) are in `statseq.inference.kalman_sqrt`, the associative-scan (parallel) variants
in `statseq.inference.kalman_parallel` and `statseq.inference.kalman_sqrt_parallel`.

Speed: up to ``SMALL_DIM`` (8) states and series, a step's matrix products are written as
broadcast-multiply-sums and its Cholesky factor and triangular solves are unrolled into
element-wise jnp ops (the same arithmetic as LAPACK's unblocked algorithms), so that XLA:CPU
fuses a step into a few loops instead of calling a kernel per small product and a LAPACK
routine per factorization; results agree with the generic path to rounding (tested, with
gradients). `kalman_log_prob` stacks no moments, `kalman_smoother` only what its backward
pass uses. For one series (``D = 1``, proper initial law, up to ``SMALL_DIM`` states) on
CPU, `kalman_log_prob` and `kalman_filter` run `_scan_univariate`: a scalar update (a
division instead of a Cholesky factor, the same Joseph form) and one flat carry
``(mean, vec(cov))``, which XLA:CPU runs several times faster than a ``(mean, cov)`` pair.

**Exact diffuse initialization** (de Jong's augmented filter). Directions ``A`` of the
initial state with infinite variance are carried as regression columns: the filter runs
with ``kappa = 0`` and propagates ``A_t`` (how the predicted state depends on the unknown
``delta``) through the same gains, accumulating ``S = sum_t X_t^T F_t^{-1} X_t`` and
``s = sum_t X_t^T F_t^{-1} v_t`` with ``X_t = H_t A_t``. Then

    log L_diffuse = log L(kappa = 0) - 1/2 log|S| + 1/2 s^T S^{-1} s,

the diffuse log-likelihood of Durbin and Koopman (2012, sec. 5.7 and 7.2), which is what
statsmodels and KFAS report; smoothed moments follow by integrating ``delta`` over its
posterior ``N(S^{-1} s, S^{-1})`` (`kalman_smoother` and `sample_posterior` run the exact
initial smoother instead, which stays accurate as ``R -> 0``). The per-step log-densities
are the increments of the running diffuse log-likelihood, computed with
pseudo-determinants while ``S`` is singular; once ``S`` has full rank the filter
*collapses* ``delta`` into the state and continues as a plain Kalman filter.

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
from statseq.inference._backend import backend_kind
from statseq.inference.gaussian import symmetrize
from statseq.inference.kalman_diffuse import diffuse_update

_LOG_2PI = math.log(2.0 * math.pi)


class GaussianSSMArrays(NamedTuple):
    """The matrices of a linear Gaussian state space model (see the module docstring).

    Attributes:
        initial_mean: ``(n,)`` ``m``.
        initial_cov: ``(n, n)`` ``P`` (the proper part of the initial covariance).
        dynamics_weights: ``(n, n)`` or ``(T-1, n, n)`` ``F``.
        dynamics_input_weights: ``(n, m)`` or ``(T-1, n, m)`` ``B``.
        dynamics_bias: ``(n,)`` or ``(T-1, n)`` ``b``.
        dynamics_cov: ``(n, n)`` or ``(T-1, n, n)`` ``Q``.
        emission_weights: ``(D, n)`` or ``(T, D, n)`` ``H``.
        emission_input_weights: ``(D, m)`` or ``(T, D, m)`` ``D``.
        emission_bias: ``(D,)`` or ``(T, D)`` ``d``.
        emission_cov: ``(D, D)`` or ``(T, D, D)`` ``R``.
        initial_diffuse: ``(n, q)`` ``A``, the directions with infinite initial variance
            (``q = 0`` for a proper initial distribution).
    """

    initial_mean: Any
    initial_cov: Any
    dynamics_weights: Any
    dynamics_input_weights: Any
    dynamics_bias: Any
    dynamics_cov: Any
    emission_weights: Any
    emission_input_weights: Any
    emission_bias: Any
    emission_cov: Any
    initial_diffuse: Any


_BASE_NDIM = GaussianSSMArrays(1, 2, 2, 2, 1, 2, 2, 2, 1, 2, 2)
_PER_STEP = frozenset(GaussianSSMArrays._fields[2:10])


def arrays_at(arrays: GaussianSSMArrays, t) -> GaussianSSMArrays:
    """The matrices in force at step ``t`` (time-varying leaves indexed, fixed ones kept).

    Dynamics leaves are indexed with ``t`` (the step from ``x_t`` to ``x_{t+1}``), emission
    leaves with ``t``; indices are clipped, so the last dynamics entry serves beyond ``T-1``.
    """
    out = []
    for name, leaf, nd in zip(GaussianSSMArrays._fields, arrays, _BASE_NDIM, strict=True):
        if name in _PER_STEP and jnp.ndim(leaf) == nd + 1:
            leaf = leaf[jnp.clip(t, 0, leaf.shape[0] - 1)]
        out.append(leaf)
    return GaussianSSMArrays(*out)


def is_time_varying(arrays: GaussianSSMArrays) -> bool:
    """Whether any dynamics or emission leaf has a time axis."""
    return any(
        jnp.ndim(leaf) == nd + 1
        for name, leaf, nd in zip(GaussianSSMArrays._fields, arrays, _BASE_NDIM, strict=True)
        if name in _PER_STEP
    )


class KalmanCarry(NamedTuple):
    """Filtered belief after step ``t - 1`` (before any step: the initial law of ``x_0``).

    Attributes:
        mean: ``(n,)`` filtered mean (with ``delta = 0`` while diffuse).
        cov: ``(n, n)`` filtered covariance (proper part).
        diffuse: ``(n, q)`` regression of the state on the diffuse ``delta``.
        info: ``(q, q)`` ``S``, the information about ``delta`` gathered so far.
        score: ``(q,)`` ``s``.
        diffuse_log_lik: scalar ``-1/2 log pdet S + 1/2 s^T S^+ s`` so far.
        collapsed: whether ``delta`` has been folded into the state (always true for q = 0).
        t: number of steps taken.
        identified: int, the number of diffuse directions the data have identified (the
            exact initial filter of `kalman_step` with ``collapse=True``).

    In `kalman_step`'s default mode (``collapse=True``) the diffuse phase runs the exact
    initial filter of `statseq.inference.kalman_diffuse` instead: ``mean`` and ``cov`` are
    then its ``a_t`` and ``P_star`` (the limits as the diffuse variance grows), ``diffuse``
    is a factor ``B`` of ``P_inf = B B^T``, and ``info``, ``score`` and
    ``diffuse_log_lik`` stay 0.
    """

    mean: Any
    cov: Any
    diffuse: Any
    info: Any
    score: Any
    diffuse_log_lik: Any
    collapsed: Any
    t: Any
    identified: Any = None


class KalmanFilterResult(NamedTuple):
    """Output of `kalman_filter`.

    Attributes:
        marginal_log_lik: scalar ``log p(y_{0:T-1})`` (the diffuse log-likelihood when the
            initial law has diffuse directions).
        log_probs: ``(T,)`` one-step predictive log-densities (0 at fully masked steps).
        predicted_means, predicted_covs: ``(T, n)``, ``(T, n, n)`` of ``x_t | y_{<t}``.
        filtered_means, filtered_covs: ``(T, n)``, ``(T, n, n)`` of ``x_t | y_{<=t}``.
    """

    marginal_log_lik: Any
    log_probs: Any
    predicted_means: Any
    predicted_covs: Any
    filtered_means: Any
    filtered_covs: Any


class KalmanSmootherResult(NamedTuple):
    """Output of `kalman_smoother`.

    Attributes:
        marginal_log_lik: scalar ``log p(y_{0:T-1})``.
        filtered_means, filtered_covs: as in `KalmanFilterResult`.
        smoothed_means: ``(T, n)`` ``E[x_t | y_{0:T-1}]``.
        smoothed_covs: ``(T, n, n)`` ``Cov[x_t | y_{0:T-1}]``.
        smoothed_cross_covs: ``(T-1, n, n)`` ``Cov[x_{t+1}, x_t | y_{0:T-1}]``.
    """

    marginal_log_lik: Any
    filtered_means: Any
    filtered_covs: Any
    smoothed_means: Any
    smoothed_covs: Any
    smoothed_cross_covs: Any


# ---- small-dimension kernels -------------------------------------------------------------
#: state and observation dimensions up to which one step is written as element-wise jnp ops
#: (matrix products as broadcast-multiply-sum, Cholesky and triangular solves unrolled), so
#: that XLA:CPU fuses a step into a few loops instead of one kernel (dot, LAPACK call) per op
SMALL_DIM = 8


def _is_small(*arrays) -> bool:
    return all(max(a.shape[-2:], default=0) <= SMALL_DIM for a in arrays)


def _mm(a, b):
    """``a @ b`` (``a`` a matrix or a stack of them, ``b`` a vector, a matrix or a stack of
    matrices, as for ``@``), as broadcast-multiply-sum when the matrices are small.

    The same sum of products as ``@`` (rounding may differ in the last bit: the summation
    order is XLA's), but XLA:CPU fuses it with its neighbours instead of calling a
    matrix-product kernel per step (or per matrix of a stack).
    """
    if a.ndim < 2 or b.ndim < 1 or not _is_small(a, b):
        return a @ b
    if b.ndim == 1:
        return jnp.sum(a * b[None, :], axis=-1)
    if (a.ndim > 2 or b.ndim > 2) and a.shape[-1]:
        # stacks (time axis leading): a sum of outer products, which XLA vectorizes over
        # the stack (measured faster than a reduction over a middle axis or a batched dot)
        out = a[..., :, :1] * b[..., :1, :]
        for k in range(1, a.shape[-1]):
            out = out + a[..., :, k : k + 1] * b[..., k : k + 1, :]
        return out
    return jnp.sum(a[..., :, :, None] * b[..., None, :, :], axis=-2)


def _cholesky(s):
    """Lower Cholesky factor of a symmetric positive definite ``s`` (unrolled when small).

    Column by column (``l_j = (s_j - sum_{k<j} l_k l_k[j]) / sqrt(.)``), the algorithm of
    LAPACK's unblocked ``potrf``; NaN where ``s`` is not positive definite, as there.
    """
    dim = s.shape[-1]
    if s.ndim != 2 or dim > SMALL_DIM:
        return jnp.linalg.cholesky(s)
    rows = jnp.arange(dim)
    cols = []
    for j in range(dim):
        c = s[:, j]
        for k in range(j):
            c = c - cols[k] * cols[k][j]
        c = jnp.where(rows >= j, c, 0.0) / jnp.sqrt(c[j])
        cols.append(c)
    return jnp.stack(cols, axis=1)


def _solve_lower(chol, rhs):
    """``chol^{-1} rhs`` for a lower triangular ``chol`` (forward substitution when small)."""
    dim = chol.shape[-1]
    if chol.ndim != 2 or rhs.ndim != 2 or dim > SMALL_DIM:
        return jsl.solve_triangular(chol, rhs, lower=True)
    out = []
    for i in range(dim):
        r = rhs[i]
        for k in range(i):
            r = r - chol[i, k] * out[k]
        out.append(r / chol[i, i])
    return jnp.stack(out, axis=0)


# ---- one step ---------------------------------------------------------------------------
def _masked_rows(h, mask):
    return h * mask.astype(h.dtype)[:, None]


def _masked_innovation_cov(s, mask):
    m = mask.astype(s.dtype)
    return s * (m[:, None] * m[None, :]) + jnp.diag(1.0 - m)


def predict_state(arrays_t: GaussianSSMArrays, mean, cov, u_next):
    """``x_{t+1} | y_{<=t}`` from ``x_t | y_{<=t}`` (``arrays_t`` from `arrays_at`)."""
    f = arrays_t.dynamics_weights
    mean = _mm(f, mean) + _mm(arrays_t.dynamics_input_weights, u_next) + arrays_t.dynamics_bias
    cov = symmetrize(_mm(_mm(f, cov), f.T) + arrays_t.dynamics_cov)
    return mean, cov


class Innovation(NamedTuple):
    """The innovation of one step: whitened residual, factor and whitened gain."""

    log_prob: Any  # scalar log N(v_o; 0, F_oo) of the observed entries (kappa = 0 part)
    z: Any  # (D,) L^{-1} v   (0 at missing entries)
    chol: Any  # (D, D) Cholesky factor of the masked innovation covariance
    w: Any  # (D, n) L^{-1} H~ P   (the whitened gain, H~ with missing rows zeroed)
    h: Any  # (D, n) H~
    chol_inv: Any = None  # (D, D) L^{-1}


def innovation(arrays_t: GaussianSSMArrays, mean, cov, y_t, mask_t, u_t) -> Innovation:
    """Whitened innovation of ``y_t`` against the predicted ``N(mean, cov)`` of ``x_t``."""
    h = _masked_rows(arrays_t.emission_weights, mask_t)
    y_mean = (
        _mm(arrays_t.emission_weights, mean)
        + _mm(arrays_t.emission_input_weights, u_t)
        + arrays_t.emission_bias
    )
    v = jnp.where(mask_t, y_t - y_mean, 0.0)
    hp = _mm(h, cov)
    s = symmetrize(_mm(hp, h.T) + arrays_t.emission_cov)
    chol = _cholesky(_masked_innovation_cov(s, mask_t))
    n = hp.shape[1]
    # one triangular solve for the residual, H~ P and L^{-1} itself (for the gain)
    rhs = jnp.concatenate([v[:, None], hp, jnp.eye(v.shape[0], dtype=hp.dtype)], axis=1)
    solved = _solve_lower(chol, rhs)
    z, w, chol_inv = solved[:, 0], solved[:, 1 : n + 1], solved[:, n + 1 :]
    log_det = jnp.sum(jnp.where(mask_t, jnp.log(jnp.diagonal(chol)), 0.0))
    num_obs = jnp.sum(mask_t)
    log_prob = -0.5 * jnp.sum(z**2) - log_det - 0.5 * num_obs * _LOG_2PI
    return Innovation(log_prob, z, chol, w, h, chol_inv)


def joseph_update(cov, inn: Innovation, emission_cov):
    """Filtered covariance in Joseph form, ``(I - K H~) P (I - K H~)^T + K R K^T``.

    ``K = P H~^T S~^{-1} = W^T L^{-T}`` (``W`` the whitened gain of `innovation`, zero
    columns at missing entries, so the missing rows and columns of ``R`` drop out). The
    textbook ``P - K S K^T = P - W^T W`` cancels to rounding noise when an observation nearly
    determines the state (``P >> R``): its relative error grows as ``eps * P / R``. Here the
    rounding error of ``I - K H~`` enters only multiplied by itself and ``P``, and ``K R K^T``
    is a sum of non-negative terms, so the result keeps its relative accuracy up to
    ``P / R`` of order ``1 / eps`` (tested against exact rational arithmetic at
    ``Q / R = 10^16``), at the price of a few more ``n x n`` products.
    """
    gain = _mm(inn.w.T, inn.chol_inv)  # (n, D)
    closed = jnp.eye(cov.shape[-1], dtype=cov.dtype) - _mm(gain, inn.h)
    return symmetrize(_mm(_mm(closed, cov), closed.T) + _mm(_mm(gain, emission_cov), gain.T))


def _pdet_parts(info, score):
    """Eigen-decomposition pieces of ``S``: kept (non-null) eigenvalues and ``S^+``."""
    dtype = info.dtype
    eps = 1e-9 if dtype == jnp.float64 else 1e-4
    evals, evecs = jnp.linalg.eigh(symmetrize(info))
    keep = evals > eps * jnp.maximum(jnp.trace(info), jnp.finfo(dtype).tiny)
    safe = jnp.where(keep, evals, 1.0)
    inv = jnp.where(keep, 1.0 / safe, 0.0)
    proj = evecs.T @ score
    value = jnp.sum(jnp.where(keep, -0.5 * jnp.log(safe) + 0.5 * proj**2 / safe, 0.0))
    pinv = (evecs * inv) @ evecs.T
    return value, jnp.sum(keep), pinv


@jax.custom_jvp
def _diffuse_value(info, score):
    """``-1/2 log pdet S + 1/2 s^T S^+ s`` (``s`` lies in the range of ``S``)."""
    return _pdet_parts(info, score)[0]


@_diffuse_value.defjvp
def _diffuse_value_jvp(primals, tangents):
    # With the rank locally constant, d log pdet S = tr(S^+ dS) and, since s is in the range
    # of S, d(s^T S^+ s) = 2 (S^+ s)^T ds - (S^+ s)^T dS (S^+ s). Differentiating through
    # eigh instead gives 0 * inf wherever null eigenvalues tie.
    info, score = primals
    d_info, d_score = tangents
    value, _, pinv = _pdet_parts(info, score)
    alpha = pinv @ score
    d_info = symmetrize(d_info)
    tangent = (-0.5 * jnp.sum(pinv * d_info) + alpha @ d_score - 0.5 * alpha @ d_info @ alpha)
    return value, tangent


def _pdet_terms(info, score, dtype):
    """``-1/2 log pdet S + 1/2 s^T S^+ s`` and the rank of ``S`` (eigenvalues above tol)."""
    del dtype
    rank = _pdet_parts(jax.lax.stop_gradient(info), jax.lax.stop_gradient(score))[1]
    return _diffuse_value(info, score), rank


def initial_carry(arrays: GaussianSSMArrays) -> KalmanCarry:
    """The carry before step 0 (``t = 0`` marks that the initial law is used as is)."""
    n, q = arrays.initial_diffuse.shape
    dtype = arrays.initial_cov.dtype
    return KalmanCarry(
        mean=arrays.initial_mean,
        cov=arrays.initial_cov,
        diffuse=arrays.initial_diffuse.astype(dtype),
        info=jnp.zeros((q, q), dtype),
        score=jnp.zeros((q,), dtype),
        diffuse_log_lik=jnp.zeros((), dtype),
        collapsed=jnp.asarray(q == 0),
        t=jnp.zeros((), jnp.int32),
        identified=jnp.zeros((), jnp.int32),
    )


def predicted_moments(arrays: GaussianSSMArrays, carry: KalmanCarry, u_t):
    """Predicted ``(mean, cov, diffuse)`` of ``x_t`` given the carry after step ``t - 1``."""
    t = carry.t
    prev = arrays_at(arrays, t - 1)
    mean_p, cov_p = predict_state(prev, carry.mean, carry.cov, u_t)
    diffuse_p = _mm(prev.dynamics_weights, carry.diffuse)
    first = t == 0
    return (
        jnp.where(first, carry.mean, mean_p),
        jnp.where(first, carry.cov, cov_p),
        jnp.where(first, carry.diffuse, diffuse_p),
    )


def kalman_step(arrays: GaussianSSMArrays, carry: KalmanCarry, y_t, mask_t, u_t, *,
                collapse: bool = True):
    """One step: ``(log p(y_t | y_{<t}), new carry, (predicted moments, innovation))``.

    With diffuse directions the log-density is the increment of the diffuse
    log-likelihood. With ``collapse=True`` (the default) the diffuse phase runs the exact
    initial filter of Koopman and Durbin (`statseq.inference.kalman_diffuse.diffuse_update`,
    one scalar observation at a time), which keeps its accuracy as the observation variance
    goes to 0 (exactly 0 included), until the data have identified every diffuse
    direction; from then on this is the plain filter. While diffuse, the returned
    innovation is a placeholder. With ``collapse=False`` the filter is de Jong's augmented
    one (the regression columns, ``S`` and ``s`` that `kalman_smoother` needs), whose
    increments cancel terms of order ``1 / R``.
    """
    arrays_t = arrays_at(arrays, carry.t)
    mean, cov, diffuse = predicted_moments(arrays, carry, u_t)
    q = diffuse.shape[1]
    ident = jnp.zeros((), jnp.int32) if carry.identified is None else carry.identified
    if q and collapse:
        # a positive definite stand-in for R while diffuse (R may be singular, P_star 0)
        eye = jnp.eye(arrays_t.emission_cov.shape[-1], dtype=cov.dtype)
        safe = jnp.where(carry.collapsed, arrays_t.emission_cov, arrays_t.emission_cov + eye)
        inn = innovation(arrays_t._replace(emission_cov=safe), mean, cov, y_t, mask_t, u_t)
    else:
        inn = innovation(arrays_t, mean, cov, y_t, mask_t, u_t)
    mean_f = mean + _mm(inn.w.T, inn.z)
    cov_f = joseph_update(cov, inn, arrays_t.emission_cov)
    log_prob = inn.log_prob
    info, score, dll, collapsed = carry.info, carry.score, carry.diffuse_log_lik, carry.collapsed
    if q and collapse:
        y_off = y_t - arrays_t.emission_input_weights @ u_t - arrays_t.emission_bias

        def exact_initial(_):
            return diffuse_update(mean, cov, diffuse, ident, arrays_t.emission_weights,
                                  arrays_t.emission_cov, y_off, mask_t)

        def plain(_):
            return log_prob, mean_f, cov_f, jnp.zeros_like(diffuse), ident

        log_prob, mean_f, cov_f, diffuse_f, ident = jax.lax.cond(
            collapsed, plain, exact_initial, None)
        collapsed = collapsed | (ident >= q)
    elif q:
        # regression columns: innovation X = H~ A, whitened and pushed through the gain
        xw = jsl.solve_triangular(inn.chol, inn.h @ diffuse, lower=True)
        diffuse_f = diffuse - inn.w.T @ xw
        info = info + xw.T @ xw
        score = score + xw.T @ inn.z
        new_dll, _ = _pdet_terms(info, score, mean.dtype)
        log_prob = log_prob + new_dll - dll
        dll = new_dll
    else:
        diffuse_f = diffuse
    new = KalmanCarry(mean_f, cov_f, diffuse_f, info, score, dll, collapsed, carry.t + 1, ident)
    return log_prob, new, (mean, cov, diffuse, inn)


# ---- whole sequences --------------------------------------------------------------------
def _check(arrays, y, mask, inputs):
    n = arrays.initial_mean.shape[-1]
    if arrays.initial_diffuse.ndim != 2 or arrays.initial_diffuse.shape[0] != n:
        raise ValueError(
            f"initial_diffuse must have shape ({n}, q), got {arrays.initial_diffuse.shape}"
        )
    if y.ndim != 2 or mask.shape != y.shape:
        raise ValueError(f"y and mask must both be (T, D); got {y.shape} and {mask.shape}")
    if inputs.ndim != 2 or inputs.shape[0] != y.shape[0]:
        raise ValueError(f"inputs must be (T, m) with T = {y.shape[0]}, got {inputs.shape}")


def _scan_filter(arrays, y, mask, inputs, collapse, keep=None):
    """Scan `kalman_step`; ``keep(lp, mean, cov, diffuse, new, inn)`` picks what is stacked
    per step (default: everything; stacking what is not needed costs time)."""
    _check(arrays, y, mask, inputs)
    keep = (lambda *out: out) if keep is None else keep

    def step(carry, xs):
        y_t, m_t, u_t = xs
        lp, new, (mean, cov, diffuse, inn) = kalman_step(
            arrays, carry, y_t, m_t, u_t, collapse=collapse
        )
        return new, keep(lp, mean, cov, diffuse, new, inn)

    return jax.lax.scan(step, initial_carry(arrays), (y, mask, inputs))


def _univariate_fast(arrays: GaussianSSMArrays, num_series: int) -> bool:
    """Whether `kalman_filter` / `kalman_log_prob` take the scalar-observation scan
    (`_scan_univariate`): one series (``D = 1``), a proper initial law, at most
    ``SMALL_DIM`` states, on CPU (the GPU keeps the general step, unmeasured there)."""
    n = arrays.initial_mean.shape[-1]
    return (num_series == 1 and arrays.initial_diffuse.shape[-1] == 0 and 0 < n <= SMALL_DIM
            and backend_kind() == "cpu")


def _vm(a, x):
    """``a @ x`` for a small ``(k, j)`` matrix and a ``(j,)`` vector, as a sum of scaled
    columns (element-wise ops that XLA fuses; no reduction)."""
    if a.shape[-1] == 0:
        return jnp.zeros(a.shape[:-1], a.dtype)
    out = a[:, 0] * x[0]
    for k in range(1, a.shape[-1]):
        out = out + a[:, k] * x[k]
    return out


def _outer_mm(a, b):
    """``a @ b`` for small matrices as a sum of outer products (element-wise ops only)."""
    out = a[:, :1] * b[:1, :]
    for k in range(1, a.shape[-1]):
        out = out + a[:, k : k + 1] * b[k : k + 1, :]
    return out


def _no_empty_dynamics(arrays: GaussianSSMArrays) -> GaussianSSMArrays:
    """Zeros for time-varying dynamics leaves with an empty time axis (``T = 1``): no
    step uses them (the prediction after the last step is discarded), but indexing an
    empty axis fails."""
    return arrays._replace(**{
        name: jnp.zeros(leaf.shape[1:], leaf.dtype)
        for name, leaf, nd in zip(GaussianSSMArrays._fields, arrays, _BASE_NDIM, strict=True)
        if name.startswith("dynamics_") and leaf.ndim == nd + 1 and leaf.shape[0] == 0})


def _univariate_update(arr: GaussianSSMArrays, mean, cov, y_t, mask_t, u_t, symmetric=True):
    """``(log p(y_t | y_{<t}), filtered mean, filtered cov)`` for one series (``D = 1``).

    The update of `kalman_step` for a scalar observation: ``s = h P h^T + r``, gain
    ``k = P h^T / s`` (a division: no Cholesky factor, no triangular solve), log-density
    ``-(v^2 / s + log s + log 2 pi) / 2``, and the Joseph-form covariance
    ``(I - k h) P (I - k h)^T + r k k^T`` (`joseph_update`) evaluated as ``A = P - k (h P)``,
    ``A - (A h^T) k^T + r k k^T`` (symmetrized unless ``symmetric=False``), products as sums
    of outer products (element-wise ops). The same function of ``P`` and the same stability
    (``A``'s rounding is multiplied by ``I - k h``: a variance far below ``P`` stays
    accurate as ``r -> 0``, where ``P - P h^T k^T`` loses digits; `test_kalman_extreme`),
    without the matrix ``I - k h``, whose own fused loop put a fully time-varying model's
    scan body past XLA:CPU's sequential-execution threshold (see `_scan_univariate`). A
    missing ``y_t`` gives ``k = 0``: the filtered moments are the predicted ones exactly,
    and the log-density is 0.
    """
    h, r, obs = arr.emission_weights[0], arr.emission_cov[0, 0], mask_t[0]
    # (h P)^T as a sum of scaled rows of P (the ops of _vm(P.T, h), without a transposed
    # copy of P, which under vmap was a loop of its own)
    hp = sum((h[j] * cov[j] for j in range(1, h.shape[0])), h[0] * cov[0])
    s = jnp.where(obs, _vm(hp[None, :], h)[0] + r, 1.0)
    y_mean = _vm(h[None, :], mean)[0] + _vm(arr.emission_input_weights, u_t)[0]
    v = jnp.where(obs, y_t[0] - (y_mean + arr.emission_bias[0]), 0.0)
    lp = jnp.where(obs, -0.5 * (v * v / s + jnp.log(s) + _LOG_2PI), 0.0)
    k = jnp.where(obs, hp / s, 0.0)
    a = cov - k[:, None] * hp[None, :]  # (I - k h) P
    cov_f = a - _vm(a, h)[:, None] * k[None, :] + r * (k[:, None] * k[None, :])
    return lp, mean + k * v, symmetrize(cov_f) if symmetric else cov_f


def _scan_univariate(arrays: GaussianSSMArrays, y, mask, inputs, moments: bool,
                     steps: int | None = None):
    """The Kalman filter for one series (``D = 1``), proper initial law, as one fused scan:
    ``(carry, out)`` with ``out`` the log-densities ``(T,)``, or with ``moments``
    ``(T, 1 + n + n^2)``: each step's log-density and predicted moments
    ``(mean, vec(cov))``; ``carry`` is the flat prediction after the last step. With
    ``steps``, only the first ``steps`` steps run.

    The recursion of `kalman_step` with the scalar update `_univariate_update`. Each step
    updates with ``y_t`` and then predicts ``x_{t+1}`` (so no step selects between the
    initial law and a prediction), every product is a sum of outer products, and the carry
    is one flat vector ``(mean, vec(cov))``: XLA:CPU then runs a step as a few fused loops
    and writes the new moments in one, which is what a step of a small model costs
    (with a ``(mean, cov)`` pair as the carry the same step ran several times slower;
    `benchmarks/bench_kalman_exact.py`). The stacked output is the carry (the predicted
    moments) of each step, one flat row (two stacked outputs ran several times slower
    than one); the filtered moments follow without a recursion (`kalman_filter`). Equal
    to the general step to rounding (tested, with gradients).
    """
    _check(arrays, y, mask, inputs)
    num_t = y.shape[0]
    n = arrays.initial_mean.shape[-1]
    arrays = _no_empty_dynamics(arrays)
    u_next = jnp.concatenate([inputs[1:], jnp.zeros_like(inputs[:1])], axis=0)

    # the per-step leaves ride in the carry: step t reads its matrices from the carry and
    # appends step t+1's rows (one packed scan input, clipped at the end: the prediction
    # after the last step is discarded) to the new carry. XLA:CPU runs a loop body of at
    # most 8 thunks (fused loops and copies) inline, a longer one through its concurrent
    # thunk executor, which cost about 0.3-0.4 us a step more here. Reading the matrices
    # from a packed (T, k) scan input put a fully time-varying model at 10 thunks (the
    # row and a slice of it materialized; 5.8 ms against 2.3 ms at T = 10^4, n = 3); from
    # the carry it is 8 (7 when only H_t varies). Under `jax.vmap` (the public call, a
    # batch of one) it is 9: the slice of P is materialized too.
    varying = [name for name, leaf, nd in zip(GaussianSSMArrays._fields, arrays, _BASE_NDIM,
                                              strict=True)
               if name in _PER_STEP and leaf.ndim == nd + 1]
    dtype = arrays.initial_cov.dtype
    flat = [getattr(arrays, name).reshape(getattr(arrays, name).shape[0], -1).astype(dtype)
            for name in varying]
    sizes = [a.shape[1] for a in flat]
    m0 = n + n * n
    num = num_t if steps is None else steps
    ahead = jnp.arange(1, num + 1)

    def step(carry, xs):
        rows_next, y_t, m_t, u_t, u_n = xs
        arr, start = arrays, m0
        for name, size in zip(varying, sizes, strict=True):
            shape = getattr(arrays, name).shape[1:]
            arr = arr._replace(**{name: carry[start : start + size].reshape(shape)})
            start += size
        # the prediction below symmetrizes; symmetrizing here too cost a fused loop
        lp, mean_f, cov_f = _univariate_update(arr, carry[:n], carry[n:m0].reshape(n, n),
                                               y_t, m_t, u_t, symmetric=False)
        dyn = arr.dynamics_weights
        mean_n = _vm(dyn, mean_f) + _vm(arr.dynamics_input_weights, u_n) + arr.dynamics_bias
        cov_n = symmetrize(_outer_mm(_outer_mm(dyn, cov_f), dyn.T) + arr.dynamics_cov)
        out = jnp.concatenate([lp[None], carry[:m0]]) if moments else lp
        return jnp.concatenate([mean_n, cov_n.reshape(-1), rows_next]), out

    init = jnp.concatenate([arrays.initial_mean, arrays.initial_cov.reshape(-1)]
                           + [a[0] for a in flat])
    # step t+1's rows of every leaf, packed into one (num, k) input (clipped at the end)
    nxt = jnp.concatenate([a[jnp.minimum(ahead, a.shape[0] - 1)] for a in flat]
                          + [jnp.zeros((num, 0), dtype)], axis=1)
    final, out = jax.lax.scan(step, init, (nxt, y[:num], mask[:num], inputs[:num], u_next[:num]))
    return final[:m0], out


def univariate_log_probs(arrays: GaussianSSMArrays, y, mask, inputs):
    """Per-step log-densities and the final `KalmanCarry` of one series, by the
    scalar-observation scan (what `kalman_step` gives, to rounding, several times faster).

    For ``D = 1``, a proper initial law and up to ``SMALL_DIM`` states (see
    `_univariate_fast`); the public ``log_prob`` of a linear Gaussian model with one series
    runs it (`statseq.models.ssm.GaussianSSMBase.masked_data_filter`).

    Args:
        arrays: the model's matrices.
        y: ``(T, 1)`` observations (masked entries may hold any finite value).
        mask: ``(T, 1)`` booleans.
        inputs: ``(T, m)`` inputs.

    Returns:
        ``(log_probs (T,), carry)``, the carry after the last step as `kalman_step` leaves it.
    """
    n, num_t = arrays.initial_mean.shape[-1], y.shape[0]
    pred, lp = _scan_univariate(arrays, y, mask, inputs, moments=False, steps=num_t - 1)
    arr = arrays_at(_no_empty_dynamics(arrays), num_t - 1)
    lp_last, mean_f, cov_f = _univariate_update(arr, pred[:n], pred[n:].reshape(n, n),
                                                y[-1], mask[-1], inputs[-1])
    carry = initial_carry(arrays)._replace(mean=mean_f, cov=cov_f,
                                           t=jnp.asarray(num_t, jnp.int32))
    return jnp.concatenate([lp, lp_last[None]]), carry


def _sweeps(sweeps, arrays: GaussianSSMArrays, y, mask, inputs) -> bool:
    """Whether to run by sweeps: ``sweeps`` if given (proper initial laws only), else
    `statseq.inference.kalman_sweeps.use_sweeps`."""
    if sweeps is False or arrays.initial_diffuse.shape[-1]:
        return False
    _check(arrays, y, mask, inputs)
    from statseq.inference.kalman_sweeps import use_sweeps

    return True if sweeps else use_sweeps(arrays, y.shape[0])


def kalman_filter(arrays: GaussianSSMArrays, y, mask, inputs, *,
                  sweeps: bool | None = None) -> KalmanFilterResult:
    """Kalman filter over one sequence (prediction error decomposition of the likelihood).

        log p(y_{0:T-1}) = sum_t log N(y_t; H_t a_t + D_t u_t + d_t, H_t P_t H_t^T + R_t),

    with ``a_t, P_t`` the predicted moments of ``x_t | y_{<t}``; masked entries drop out.

    Args:
        arrays: the model's matrices.
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans.
        inputs: ``(T, m)`` inputs (``m`` may be 0).
        sweeps: ``None`` (default): on CPU, for a proper initial law and at least
            `statseq.inference.kalman_sweeps.SWEEP_MIN_STEPS` steps, the general path
            (``D > 1``) runs by sweeps over blocks (`statseq.inference.kalman_sweeps`, the
            same results to rounding); ``True`` / ``False`` force or forbid it.

    Returns:
        A `KalmanFilterResult`. With diffuse directions the moments before the data
        identify ``delta`` are the exact initial filter's ``a_t`` and ``P_star`` (the
        limits as the diffuse variance grows, as statsmodels and KFAS report them; the
        infinite part ``P_inf`` is left out), and the log-likelihood is the diffuse one,
        accurate down to zero observation variance.

    Examples:
        >>> import jax.numpy as jnp
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)), jnp.zeros(1),
        ...     jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0]])
        >>> res = kalman_filter(arr, y, jnp.ones_like(y, bool), jnp.zeros((2, 0)))
        >>> res.filtered_means.shape
        (2, 1)
    """
    if _univariate_fast(arrays, y.shape[-1]):
        n = arrays.initial_mean.shape[-1]
        out = _scan_univariate(arrays, y, mask, inputs, moments=True)[1]
        lp, mean, cov = out[:, 0], out[:, 1 : n + 1], out[:, n + 1 :].reshape(-1, n, n)
        # the filtered moments from the predicted ones: the same update, vectorized over
        # time (stacking them in the scan cost more than the scan itself)
        _, filt_mean, filt_cov = jax.vmap(
            lambda t, *a: _univariate_update(arrays_at(_no_empty_dynamics(arrays), t), *a)
        )(jnp.arange(y.shape[0]), mean, cov, y, mask, inputs)
        return KalmanFilterResult(pairwise_sum(lp), lp, mean, cov, filt_mean, filt_cov)
    if _sweeps(sweeps, arrays, y, mask, inputs):
        from statseq.inference.kalman_sweeps import filter_by_sweeps

        lp, mean, cov, filt_mean, filt_cov = filter_by_sweeps(arrays, y, mask, inputs)
        return KalmanFilterResult(pairwise_sum(lp), lp, mean, cov, filt_mean, filt_cov)
    _, (lp, mean, cov, filt_mean, filt_cov) = _scan_filter(
        arrays, y, mask, inputs, collapse=True,
        keep=lambda lp, mean, cov, _d, new, _i: (lp, mean, cov, new.mean, new.cov))
    return KalmanFilterResult(pairwise_sum(lp), lp, mean, cov, filt_mean, filt_cov)


def kalman_log_prob(arrays: GaussianSSMArrays, y, mask, inputs, *,
                    sweeps: bool | None = None):
    """Total log-likelihood only (see `kalman_filter`, also for ``sweeps``; no moments
    are stored)."""
    if _univariate_fast(arrays, y.shape[-1]):
        return pairwise_sum(_scan_univariate(arrays, y, mask, inputs, moments=False)[1])
    if _sweeps(sweeps, arrays, y, mask, inputs):
        from statseq.inference.kalman_sweeps import filter_by_sweeps

        return pairwise_sum(filter_by_sweeps(arrays, y, mask, inputs, moments=False))
    _, lp = _scan_filter(arrays, y, mask, inputs, collapse=True, keep=lambda lp, *_: lp)
    return pairwise_sum(lp)


def kalman_smoother(arrays: GaussianSSMArrays, y, mask, inputs) -> KalmanSmootherResult:
    """Smoothed moments of every ``x_t`` given all of ``y`` (Durbin-Koopman backward pass).

    Backward from ``r_{T-1} = 0``, ``N_{T-1} = 0``, with ``L_t = F_t (I - K_t H~_t)``:

        r_{t-1} = H~_t^T F_t^{-1} v_t + L_t^T r_t,   N_{t-1} = H~_t^T F_t^{-1} H~_t + L_t^T N_t L_t,
        E[x_t | y] = a_t + P_t r_{t-1},   Cov[x_t | y] = P_t - P_t N_{t-1} P_t,
        Cov[x_{t+1}, x_t | y] = (I - P_{t+1} N_t) L_t P_t.

    With diffuse directions this is the exact initial smoother of Durbin and Koopman
    (2012, sec. 5.3) on the exact initial filter
    (`statseq.inference.kalman_diffuse_smoother`): ``r`` and ``N`` expanded in
    ``1 / kappa`` over the diffuse head, no large-variance approximation, accurate down to
    zero observation variance; the filtered moments are then `kalman_filter`'s.

    Args and shapes as in `kalman_filter`.

    Returns:
        A `KalmanSmootherResult`.
    """
    n = arrays.initial_mean.shape[-1]
    q = arrays.initial_diffuse.shape[1]
    if q:
        from statseq.inference.kalman_diffuse_smoother import diffuse_kalman_smoother

        return diffuse_kalman_smoother(arrays, y, mask, inputs)
    def keep(lp, mean, cov, diffuse, new, inn):
        # stack only what the backward pass and the result need
        inn = Innovation(None, inn.z, inn.chol, inn.w, inn.h)
        return lp, mean, cov, diffuse, KalmanCarry(new.mean, new.cov, *(None,) * 7), inn

    _, (lp, mean, cov, diffuse, filt, inn) = _scan_filter(
        arrays, y, mask, inputs, collapse=False, keep=keep
    )
    num_t = y.shape[0]
    init = (jnp.zeros((n,), mean.dtype), jnp.zeros((n, n), mean.dtype),
            jnp.zeros((n, q), mean.dtype))
    xs = (jnp.arange(num_t), cov, inn.w, inn.z, inn.chol, inn.h, diffuse)
    r_prev, n_prev, l_mat, _ = _backward_pass(arrays, num_t, init, xs)
    return _smoothed(pairwise_sum(lp), mean, cov, filt, r_prev, n_prev, l_mat,
                     dynamics_weights(arrays, num_t))


def _backward_pass(arrays, num_t, init, xs):
    """The Durbin-Koopman recursion for ``(r, N, r_X)`` over the steps in ``xs``."""
    n = arrays.initial_mean.shape[-1]
    eye = jnp.eye(n, dtype=init[0].dtype)

    def back(carry, xs):
        r, nmat, rx = carry
        t, p_t, w, z, chol, h, a_t = xs
        dyn = arrays_at(arrays, t).dynamics_weights
        last = t == num_t - 1
        # K~ = P H~^T F^{-1} = w^T L^{-1}; (I - K~ H~) = I - w^T L^{-1} H~
        lh = _solve_lower(chol, h)  # L^{-1} H~  (D, n)
        l_mat = jnp.where(last, eye, _mm(dyn, eye - _mm(w.T, lh)))
        r_prev = _mm(lh.T, z) + _mm(l_mat.T, r)
        n_prev = symmetrize(_mm(lh.T, lh) + _mm(_mm(l_mat.T, nmat), l_mat))
        xw = _mm(lh, a_t)  # whitened X_t
        rx_prev = _mm(lh.T, xw) + _mm(l_mat.T, rx)
        return (r_prev, n_prev, rx_prev), (r_prev, n_prev, l_mat, rx_prev)

    return jax.lax.scan(back, init, xs, reverse=True)[1]


def _smoothed(total, mean, cov, filt, r_prev, n_prev, l_mat, dyn):
    """Smoothed moments from the predicted moments and the backward pass's outputs (proper
    initial distributions; diffuse ones go through `kalman_diffuse_smoother`)."""
    eye = jnp.eye(mean.shape[-1], dtype=mean.dtype)
    sm_mean = mean + _mm(cov, r_prev[..., None])[..., 0]
    sm_cov = smoothed_from_filtered(dyn, filt.cov, n_prev)
    # Cov[x_{t+1}, x_t] = (I - P_{t+1} N_t) L_t P_t, with N_t = n_prev[t + 1]
    cross = _mm(_mm(eye - _mm(cov[1:], n_prev[1:]), l_mat[:-1]), cov[:-1])
    return KalmanSmootherResult(total, filt.mean, filt.cov, sm_mean, sm_cov, cross)


def smoothed_from_filtered(dyn, filt_cov, n_prev):
    """``Cov[x_t | y] = P_{t|t} - (F_t P_{t|t})^T N_t (F_t P_{t|t})`` for every ``t``.

    The Durbin-Koopman ``P_t - P_t N_{t-1} P_t`` with ``N_{t-1} = H~^T S~^{-1} H~ + L_t^T
    N_t L_t``, ``L_t = F_t (I - K_t H~_t)`` and ``(I - K_t H~_t) P_t = P_{t|t}``, regrouped
    so that the subtraction starts from the (Joseph-form) filtered covariance instead of the
    predicted one. Where an observation nearly pins the state (``R << Q``), ``P_t - P_t
    N_{t-1} P_t`` cancels to rounding noise of ``P_t ~ Q`` while the result is ``~ R``;
    here the subtracted term is ``~ R^2 / Q``, so the relative error stays at rounding level
    down to ``R / Q = 10^{-16}`` and ``R = 0`` (tested against exact rational arithmetic),
    at the same cost.

    Args:
        dyn: ``(T-1, n, n)`` ``F_t`` of the steps ``t -> t + 1``.
        filt_cov: ``(T, n, n)`` ``P_{t|t}``.
        n_prev: ``(T, n, n)`` ``N_{t-1}`` (entry ``t + 1`` is ``N_t``; ``N_{T-1} = 0``).

    Returns:
        ``(T, n, n)`` smoothed covariances.
    """
    fp = _mm(dyn, filt_cov[:-1])
    inner = _mm(_mm(jnp.swapaxes(fp, 1, 2), n_prev[1:]), fp)
    return symmetrize(filt_cov - jnp.concatenate([inner, jnp.zeros_like(filt_cov[:1])]))


def dynamics_weights(arrays: GaussianSSMArrays, num_t: int):
    """``(T-1, n, n)`` ``F_t`` of every step ``t -> t + 1``."""
    return jax.vmap(lambda t: arrays_at(arrays, t).dynamics_weights)(jnp.arange(num_t - 1))


def sample_posterior(arrays: GaussianSSMArrays, y, mask, inputs, key, num_samples: int = 1):
    """Draw state paths ``x_{0:T-1} ~ p(x | y)`` (the simulation smoother of Durbin and
    Koopman 2002, mean corrections).

    Each draw simulates ``(x+, y+)`` from the model (diffuse directions at ``delta = 0``,
    ``y+`` masked as ``y``) and returns

        x~ = E[x | y] + x+ - E[x+ | y+],

    with both smoothed means from `kalman_smoother`. ``x+ - E[x+ | y+]`` is independent of
    ``y+`` with covariance ``Cov[x | y]`` (and does not depend on ``delta``, since the exact
    initial smoother reproduces the diffuse directions), so ``x~`` has the posterior law and
    inherits the smoother's exactness: down to zero observation variance, with the exact
    diffuse initialization, and where ``R = 0`` pins ``H x_t`` the draws reproduce the
    observed ``y_t`` to rounding. Nothing is inverted but innovation covariances (singular
    ``Q`` and predicted covariances need no jitter).

    Args:
        arrays: the model's matrices.
        y: ``(T, D)`` observations.
        mask: ``(T, D)`` booleans.
        inputs: ``(T, m)`` inputs.
        key: a JAX PRNG key.
        num_samples: the number of paths.

    Returns:
        ``(num_samples, T, n)`` paths.
    """
    inputs = jnp.asarray(inputs)
    num_t = y.shape[0]
    x_hat = kalman_smoother(arrays, y, mask, inputs).smoothed_means

    def simulate(k):
        k0, kw, kv = jax.random.split(k, 3)
        x0 = _mvn_draw(k0, arrays.initial_mean, arrays.initial_cov)

        def forward(x, xs):
            t, kk = xs
            arr_t = arrays_at(arrays, t)
            mean = (arr_t.dynamics_weights @ x + arr_t.dynamics_input_weights @ inputs[t + 1]
                    + arr_t.dynamics_bias)
            x_next = _mvn_draw(kk, mean, arr_t.dynamics_cov)
            return x_next, x_next

        _, rest = jax.lax.scan(forward, x0, (jnp.arange(num_t - 1),
                                            jax.random.split(kw, num_t - 1)))
        xs = jnp.concatenate([x0[None], rest], axis=0)

        def emit(t, x, kk):
            arr_t = arrays_at(arrays, t)
            mean = (arr_t.emission_weights @ x + arr_t.emission_input_weights @ inputs[t]
                    + arr_t.emission_bias)
            return _mvn_draw(kk, mean, arr_t.emission_cov)

        ys = jax.vmap(emit)(jnp.arange(num_t), xs, jax.random.split(kv, num_t))
        return xs, jnp.where(mask, ys, 0.0)

    def one(k):
        x_plus, y_plus = simulate(k)
        return x_hat + (x_plus - kalman_smoother(arrays, y_plus, mask, inputs).smoothed_means)

    return jax.vmap(one)(jax.random.split(key, num_samples))


def _mvn_draw(key, mean, cov):
    """A draw from ``N(mean, cov)`` for a PSD (possibly singular) ``cov`` via ``eigh``."""
    evals, evecs = jnp.linalg.eigh(symmetrize(cov))
    root = evecs * jnp.sqrt(jnp.clip(evals, 0.0, None))
    eps = jax.random.normal(key, mean.shape, mean.dtype)
    return mean + root @ eps
