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
with the whitened gain ``W = L^{-1} H P`` so that ``P - W^T W`` is symmetric by
construction; the smoother is the backward recursion of Durbin and Koopman (``r_t``,
``N_t``), which inverts only innovation covariances, never (possibly singular) state
covariances. A square-root variant is in `statseq.inference.kalman_sqrt`, the
associative-scan (parallel) variant in `statseq.inference.kalman_parallel`.

**Exact diffuse initialization** (de Jong's augmented filter). Directions ``A`` of the
initial state with infinite variance are carried as regression columns: the filter runs
with ``kappa = 0`` and propagates ``A_t`` (how the predicted state depends on the unknown
``delta``) through the same gains, accumulating ``S = sum_t X_t^T F_t^{-1} X_t`` and
``s = sum_t X_t^T F_t^{-1} v_t`` with ``X_t = H_t A_t``. Then

    log L_diffuse = log L(kappa = 0) - 1/2 log|S| + 1/2 s^T S^{-1} s,

the diffuse log-likelihood of Durbin and Koopman (2012, sec. 5.7 and 7.2), which is what
statsmodels and KFAS report; smoothed moments follow by integrating ``delta`` over its
posterior ``N(S^{-1} s, S^{-1})``. The per-step log-densities are the increments of the
running diffuse log-likelihood, computed with pseudo-determinants while ``S`` is
singular; once ``S`` has full rank the filter *collapses* ``delta`` into the state and
continues as a plain Kalman filter.

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
    """

    mean: Any
    cov: Any
    diffuse: Any
    info: Any
    score: Any
    diffuse_log_lik: Any
    collapsed: Any
    t: Any


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


# ---- one step ---------------------------------------------------------------------------
def _masked_rows(h, mask):
    return h * mask.astype(h.dtype)[:, None]


def _masked_innovation_cov(s, mask):
    m = mask.astype(s.dtype)
    return s * (m[:, None] * m[None, :]) + jnp.diag(1.0 - m)


def predict_state(arrays_t: GaussianSSMArrays, mean, cov, u_next):
    """``x_{t+1} | y_{<=t}`` from ``x_t | y_{<=t}`` (``arrays_t`` from `arrays_at`)."""
    f = arrays_t.dynamics_weights
    mean = f @ mean + arrays_t.dynamics_input_weights @ u_next + arrays_t.dynamics_bias
    cov = symmetrize(f @ cov @ f.T + arrays_t.dynamics_cov)
    return mean, cov


class Innovation(NamedTuple):
    """The innovation of one step: whitened residual, factor and whitened gain."""

    log_prob: Any  # scalar log N(v_o; 0, F_oo) of the observed entries (kappa = 0 part)
    z: Any  # (D,) L^{-1} v   (0 at missing entries)
    chol: Any  # (D, D) Cholesky factor of the masked innovation covariance
    w: Any  # (D, n) L^{-1} H~ P   (the whitened gain, H~ with missing rows zeroed)
    h: Any  # (D, n) H~


def innovation(arrays_t: GaussianSSMArrays, mean, cov, y_t, mask_t, u_t) -> Innovation:
    """Whitened innovation of ``y_t`` against the predicted ``N(mean, cov)`` of ``x_t``."""
    h = _masked_rows(arrays_t.emission_weights, mask_t)
    y_mean = (
        arrays_t.emission_weights @ mean
        + arrays_t.emission_input_weights @ u_t
        + arrays_t.emission_bias
    )
    v = jnp.where(mask_t, y_t - y_mean, 0.0)
    hp = h @ cov
    s = symmetrize(hp @ h.T + arrays_t.emission_cov)
    chol = jnp.linalg.cholesky(_masked_innovation_cov(s, mask_t))
    z = jsl.solve_triangular(chol, v, lower=True)
    w = jsl.solve_triangular(chol, hp, lower=True)
    log_det = jnp.sum(jnp.where(mask_t, jnp.log(jnp.diagonal(chol)), 0.0))
    num_obs = jnp.sum(mask_t)
    log_prob = -0.5 * jnp.sum(z**2) - log_det - 0.5 * num_obs * _LOG_2PI
    return Innovation(log_prob, z, chol, w, h)


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
    )


def predicted_moments(arrays: GaussianSSMArrays, carry: KalmanCarry, u_t):
    """Predicted ``(mean, cov, diffuse)`` of ``x_t`` given the carry after step ``t - 1``."""
    t = carry.t
    prev = arrays_at(arrays, t - 1)
    mean_p, cov_p = predict_state(prev, carry.mean, carry.cov, u_t)
    diffuse_p = prev.dynamics_weights @ carry.diffuse
    first = t == 0
    return (
        jnp.where(first, carry.mean, mean_p),
        jnp.where(first, carry.cov, cov_p),
        jnp.where(first, carry.diffuse, diffuse_p),
    )


def kalman_step(arrays: GaussianSSMArrays, carry: KalmanCarry, y_t, mask_t, u_t, *,
                collapse: bool = True):
    """One step: ``(log p(y_t | y_{<t}), new carry, (predicted moments, innovation))``.

    With diffuse directions the log-density is the increment of the running diffuse
    log-likelihood; with ``collapse=True`` (the default) ``delta`` is folded into the
    state as soon as the data identify it.
    """
    arrays_t = arrays_at(arrays, carry.t)
    mean, cov, diffuse = predicted_moments(arrays, carry, u_t)
    inn = innovation(arrays_t, mean, cov, y_t, mask_t, u_t)
    mean_f = mean + inn.w.T @ inn.z
    cov_f = symmetrize(cov - inn.w.T @ inn.w)
    q = diffuse.shape[1]
    log_prob = inn.log_prob
    info, score, dll, collapsed = carry.info, carry.score, carry.diffuse_log_lik, carry.collapsed
    if q:
        # regression columns: innovation X = H~ A, whitened and pushed through the gain
        xw = jsl.solve_triangular(inn.chol, inn.h @ diffuse, lower=True)
        diffuse_f = diffuse - inn.w.T @ xw
        info = info + xw.T @ xw
        score = score + xw.T @ inn.z
        new_dll, rank = _pdet_terms(info, score, mean.dtype)
        log_prob = log_prob + new_dll - dll
        dll = new_dll
        if collapse:
            full = (rank == q) & ~collapsed
            chol_s = jnp.linalg.cholesky(jnp.where(full, symmetrize(info), jnp.eye(q)))
            delta = jsl.cho_solve((chol_s, True), score)
            g = jsl.solve_triangular(chol_s, diffuse_f.T, lower=True)
            mean_f = jnp.where(full, mean_f + diffuse_f @ delta, mean_f)
            cov_f = jnp.where(full, symmetrize(cov_f + g.T @ g), cov_f)
            zero = jnp.zeros_like
            diffuse_f = jnp.where(full | collapsed, zero(diffuse_f), diffuse_f)
            info = jnp.where(full | collapsed, zero(info), info)
            score = jnp.where(full | collapsed, zero(score), score)
            dll = jnp.where(full | collapsed, zero(dll), dll)
            # once collapsed the data's information about delta is in the state; the
            # increments above are then those of a plain filter
            log_prob = jnp.where(collapsed, inn.log_prob, log_prob)
            collapsed = collapsed | full
    else:
        diffuse_f = diffuse
    new = KalmanCarry(mean_f, cov_f, diffuse_f, info, score, dll, collapsed, carry.t + 1)
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


def _scan_filter(arrays, y, mask, inputs, collapse):
    _check(arrays, y, mask, inputs)

    def step(carry, xs):
        y_t, m_t, u_t = xs
        lp, new, (mean, cov, diffuse, inn) = kalman_step(
            arrays, carry, y_t, m_t, u_t, collapse=collapse
        )
        return new, (lp, mean, cov, diffuse, new, inn)

    return jax.lax.scan(step, initial_carry(arrays), (y, mask, inputs))


def kalman_filter(arrays: GaussianSSMArrays, y, mask, inputs) -> KalmanFilterResult:
    """Kalman filter over one sequence (prediction error decomposition of the likelihood).

        log p(y_{0:T-1}) = sum_t log N(y_t; H_t a_t + D_t u_t + d_t, H_t P_t H_t^T + R_t),

    with ``a_t, P_t`` the predicted moments of ``x_t | y_{<t}``; masked entries drop out.

    Args:
        arrays: the model's matrices.
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `KalmanFilterResult`. With diffuse directions the filtered moments before the
        data identify ``delta`` are those given ``delta = 0`` (their diffuse part is
        infinite).

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
    _, (lp, mean, cov, _, filt, _) = _scan_filter(arrays, y, mask, inputs, collapse=True)
    return KalmanFilterResult(pairwise_sum(lp), lp, mean, cov, filt.mean, filt.cov)


def kalman_log_prob(arrays: GaussianSSMArrays, y, mask, inputs):
    """Total log-likelihood only (see `kalman_filter`)."""
    return kalman_filter(arrays, y, mask, inputs).marginal_log_lik


def kalman_smoother(arrays: GaussianSSMArrays, y, mask, inputs) -> KalmanSmootherResult:
    """Smoothed moments of every ``x_t`` given all of ``y`` (Durbin-Koopman backward pass).

    Backward from ``r_{T-1} = 0``, ``N_{T-1} = 0``, with ``L_t = F_t (I - K_t H~_t)``:

        r_{t-1} = H~_t^T F_t^{-1} v_t + L_t^T r_t,   N_{t-1} = H~_t^T F_t^{-1} H~_t + L_t^T N_t L_t,
        E[x_t | y] = a_t + P_t r_{t-1},   Cov[x_t | y] = P_t - P_t N_{t-1} P_t,
        Cov[x_{t+1}, x_t | y] = (I - P_{t+1} N_t) L_t P_t.

    With diffuse directions the same pass runs on the regression columns and ``delta`` is
    integrated over its posterior, exactly (no large-variance approximation).

    Args and shapes as in `kalman_filter`.

    Returns:
        A `KalmanSmootherResult`.
    """
    n = arrays.initial_mean.shape[-1]
    q = arrays.initial_diffuse.shape[1]
    _, (lp, mean, cov, diffuse, filt, inn) = _scan_filter(
        arrays, y, mask, inputs, collapse=False
    )
    num_t = y.shape[0]
    init = (jnp.zeros((n,), mean.dtype), jnp.zeros((n, n), mean.dtype),
            jnp.zeros((n, q), mean.dtype))
    xs = (jnp.arange(num_t), cov, inn.w, inn.z, inn.chol, inn.h, diffuse)
    r_prev, n_prev, l_mat, rx_prev = _backward_pass(arrays, num_t, init, xs)
    return _smoothed(pairwise_sum(lp), mean, cov, diffuse, filt, q,
                     r_prev, n_prev, l_mat, rx_prev)


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
        lh = jsl.solve_triangular(chol, h, lower=True)  # L^{-1} H~  (D, n)
        l_mat = jnp.where(last, eye, dyn @ (eye - w.T @ lh))
        r_prev = lh.T @ z + l_mat.T @ r
        n_prev = symmetrize(lh.T @ lh + l_mat.T @ nmat @ l_mat)
        xw = lh @ a_t  # whitened X_t
        rx_prev = lh.T @ xw + l_mat.T @ rx
        return (r_prev, n_prev, rx_prev), (r_prev, n_prev, l_mat, rx_prev)

    return jax.lax.scan(back, init, xs, reverse=True)[1]


def _smoothed(total, mean, cov, diffuse, filt, q, r_prev, n_prev, l_mat, rx_prev):
    """Smoothed moments from the predicted moments and the backward pass's outputs."""
    eye = jnp.eye(mean.shape[-1], dtype=mean.dtype)
    sm_mean = mean + jnp.einsum("tij,tj->ti", cov, r_prev)
    sm_cov = symmetrize(cov - cov @ n_prev @ cov)
    # Cov[x_{t+1}, x_t] = (I - P_{t+1} N_t) L_t P_t, with N_t = n_prev[t + 1]
    cross = jnp.einsum(
        "tij,tjk,tkl->til", eye - cov[1:] @ n_prev[1:], l_mat[:-1], cov[:-1]
    )
    if q:
        info = filt.info[-1]
        score = filt.score[-1]
        chol_s = jnp.linalg.cholesky(symmetrize(info))
        delta = jsl.cho_solve((chol_s, True), score)
        g = diffuse - cov @ rx_prev  # (T, n, q): smoothed state's regression on delta
        gw = jnp.swapaxes(jsl.solve_triangular(chol_s, jnp.swapaxes(g, 1, 2), lower=True),
                          1, 2)  # G L_S^{-T}
        sm_mean = sm_mean + g @ delta
        sm_cov = symmetrize(sm_cov + gw @ jnp.swapaxes(gw, 1, 2))
        cross = cross + gw[1:] @ jnp.swapaxes(gw[:-1], 1, 2)
    filt_mean, filt_cov = _filtered_from_uncollapsed(filt, q)
    return KalmanSmootherResult(total, filt_mean, filt_cov, sm_mean, sm_cov, cross)


def _filtered_from_uncollapsed(filt: KalmanCarry, q: int):
    """Filtered moments given ``y_{<=t}`` from an uncollapsed run (``delta`` integrated
    where the data identify it; pseudo-inverse while they do not)."""
    if not q:
        return filt.mean, filt.cov

    def one(mean, cov, a, info, score):
        pinv = jnp.linalg.pinv(symmetrize(info), hermitian=True)
        return mean + a @ (pinv @ score), symmetrize(cov + a @ pinv @ a.T)

    return jax.vmap(one)(filt.mean, filt.cov, filt.diffuse, filt.info, filt.score)


def sample_posterior(arrays: GaussianSSMArrays, y, mask, inputs, key, num_samples: int = 1):
    """Draw state paths ``x_{0:T-1} ~ p(x | y)`` (forward filtering, backward sampling).

    Backward from ``x_{T-1} ~ N(m_{T-1|T-1}, P_{T-1|T-1})``, each ``x_t | x_{t+1}, y_{<=t}``
    is Gaussian with mean ``m_{t|t} + J_t (x_{t+1} - a_{t+1})`` and covariance
    ``P_{t|t} - J_t F_t P_{t|t}``, ``J_t = P_{t|t} F_t^T P_{t+1|t}^{-1}`` (a Cholesky solve,
    with a rounding-level jitter for the singular predicted covariances of structural
    models). With diffuse directions, ``delta`` is first drawn from its posterior
    ``N(S^{-1} s, S^{-1})`` and the path from the model started at ``m + A delta``.

    Returns:
        ``(num_samples, T, n)`` paths.
    """
    q = arrays.initial_diffuse.shape[1]
    n = arrays.initial_mean.shape[-1]
    num_t = y.shape[0]
    inputs = jnp.asarray(inputs)
    if q:
        _, (_, _, _, _, filt, _) = _scan_filter(arrays, y, mask, inputs, collapse=False)
        chol_s = jnp.linalg.cholesky(symmetrize(filt.info[-1]))
        delta_hat = jsl.cho_solve((chol_s, True), filt.score[-1])

    def one(k):
        k_delta, k_last, k_rest = jax.random.split(k, 3)
        arr = arrays
        if q:
            eps = jax.random.normal(k_delta, (q,), delta_hat.dtype)
            delta = delta_hat + jsl.solve_triangular(chol_s.T, eps, lower=False)
            arr = arrays._replace(
                initial_mean=arrays.initial_mean + arrays.initial_diffuse @ delta,
                initial_diffuse=jnp.zeros((n, 0), delta.dtype),
            )
        filt = kalman_filter(arr, y, mask, inputs)
        f_mean, f_cov = filt.filtered_means, filt.filtered_covs
        x_last = _mvn_draw(k_last, f_mean[-1], f_cov[-1])

        def back(x_next, xs):
            t, m, p, kk = xs
            arr_t = arrays_at(arr, t)
            f = arr_t.dynamics_weights
            pred_m = f @ m + arr_t.dynamics_input_weights @ inputs[t + 1] + arr_t.dynamics_bias
            pred_p = symmetrize(f @ p @ f.T + arr_t.dynamics_cov)
            gain = jsl.cho_solve((_robust_cholesky(pred_p), True), f @ p).T
            x = _mvn_draw(kk, m + gain @ (x_next - pred_m), symmetrize(p - gain @ f @ p))
            return x, x

        keys = jax.random.split(k_rest, num_t - 1)
        ts = jnp.arange(num_t - 1)
        _, xs = jax.lax.scan(back, x_last, (ts, f_mean[:-1], f_cov[:-1], keys), reverse=True)
        return jnp.concatenate([xs, x_last[None]], axis=0)

    return jax.vmap(one)(jax.random.split(key, num_samples))


def _robust_cholesky(p):
    scale = jnp.maximum(jnp.max(jnp.abs(jnp.diagonal(p))), jnp.finfo(p.dtype).tiny)
    eps = 1e-12 if p.dtype == jnp.float64 else 1e-6
    return jnp.linalg.cholesky(p + eps * scale * jnp.eye(p.shape[0], dtype=p.dtype))


def _mvn_draw(key, mean, cov):
    """A draw from ``N(mean, cov)`` for a PSD (possibly singular) ``cov`` via ``eigh``."""
    evals, evecs = jnp.linalg.eigh(symmetrize(cov))
    root = evecs * jnp.sqrt(jnp.clip(evals, 0.0, None))
    eps = jax.random.normal(key, mean.shape, mean.dtype)
    return mean + root @ eps


# ---- steady state (time-invariant models, complete data) -------------------------------
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
