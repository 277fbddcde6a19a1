"""Square-root parallel-in-time Kalman filter and smoother (associative scans on factors).

Same model, arguments and results as `statseq.inference.kalman_sqrt` (``initial_diffuse``
must have ``q = 0`` columns), with ``O(log T)`` sequential depth as in
`statseq.inference.kalman_parallel`, whose scan schedule (`_scan`) and batched kernels
(loops over the small matrix dimension, so that no batched LAPACK call can deadlock
XLA:CPU's thread pool) are reused. Every covariance is carried as a lower-triangular
factor and every factor is produced by ``Tria(M)``, the lower-triangular ``L`` with
``L L^T = M M^T``, computed here by Householder reflections on the rows of ``M``
(`_tria`), following Yaghoobi, Corenflos, Hassan and Särkkä (2022), *Parallel
square-root statistical linear regression for inference in nonlinear state space
models* (arXiv:2207.00426), specialized to the linear model.

**Filter elements.** Element ``t >= 1`` describes ``p(x_t | y_t, x_{t-1})`` and
``p(y_t | x_{t-1})`` through ``(A_t, U_t, Z_t)`` with ``C_t = U_t U_t^T`` and
``J_t = Z_t Z_t^T`` of `statseq.inference.kalman_parallel`: with the dynamics at ``t - 1``,
``L_Q = Q^{1/2}``, ``N`` the masked noise factor, ``L_S = Tria([N, H~ L_Q])``,
``X = L_S^{-1} H~ L_Q`` and ``K~ = L_Q X^T`` (the gain is ``K~ L_S^{-1}``),

    A_t = F - K~ L_S^{-1} H~ F,   U_t = Tria([L_Q - K~ X, K~ L_S^{-1} N]),
    Z_t = Tria(F^T H~^T L_S^{-T}),

the Joseph form of the update in square roots, as in `kalman_sqrt.sqrt_update` (element 0:
``A_0 = 0``, ``U_0`` the filtered factor of ``x_0``, ``Z_0 = 0``). Two blocks combine (``i``
earlier, ``j`` later) as

    Tria([[U_i^T Z_j, I], [Z_j, 0]]) = [[X11, 0], [X21, X22]],   G = U_i X11^{-T},
    A = A_j (A_i - G X21^T A_i),   U = Tria([A_j G, U_j]),   Z = Tria([A_i^T X22, Z_i]),

which is the covariance combination ``C = A_j M^{-1} C_i A_j^T + C_j`` (``M = I + C_i
J_j``) with ``M^{-1} C_i = U_i (X11 X11^T)^{-1} U_i^T`` by the push-through identity; ``X11
X11^T = I + U_i^T J_j U_i`` has eigenvalues ``>= 1``, so nothing singular is inverted.

**Means and log-likelihood.** As in `kalman_parallel`, the means are not scanned in
information form: given the filtered factors, the predicted factors ``Tria([F U_{t-1},
L_Q])`` give every gain, and the filtered means follow the affine recursion ``m_t = Phi_t
m_{t-1} + beta_t`` by a second scan; the predictive log-densities are then evaluated for
every ``t`` at once.

**Smoother.** Each step of the square-root Rauch-Tung-Striebel smoother is an affine map
with Gaussian noise, ``x_t = E_t x_{t+1} + g_t + D_t e``, with ``E_t = J_t`` the smoother gain,
``g_t = m_{t|t} - J_t m_{t+1|t}`` and ``D_t = Tria([(I - J_t F_t) U_t, J_t L_Q])`` (Joseph
form, as in `kalman_sqrt.sqrt_smoother_step`); the last element is ``(0, m_{T-1|T-1},
U_{T-1})``. The maps compose as ``(E_i E_j, E_i g_j + g_i, Tria([E_i D_j, D_i]))`` by a
suffix scan, whose results are the smoothed means and factors. The gain inverts the
predicted factor, or where it is singular a generalized inverse that keeps the
recursion exact (see `statseq.inference.kalman_sqrt.smoother_gain`).

The functions are not jitted themselves: wrap them, or the code that calls them, in
``jax.jit``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.recurrence import pairwise_sum
from statseq.inference.kalman import (
    GaussianSSMArrays,
    KalmanFilterResult,
    KalmanSmootherResult,
    _check,
    arrays_at,
)
from statseq.inference.kalman_parallel import (
    _affine_combine,
    _log_density,
    _mT,
    _residual,
    _scan,
    _solve_lower,
    _unit,
)
from statseq.inference.kalman_sqrt import (
    SqrtKalmanFilterResult,
    SqrtKalmanSmootherResult,
    psd_cholesky,
    smoother_gain,
    square_root_arrays,
)


def _tria(m):
    """Lower-triangular ``(..., n, n)`` ``L`` (non-negative diagonal) with ``L L^T = M M^T``
    for ``(..., n, k)`` ``M``: Householder reflections zero row ``i`` beyond column ``i``."""
    n, k = m.shape[-2:]
    if k < n:
        m = jnp.concatenate([m, jnp.zeros(m.shape[:-1] + (n - k,), m.dtype)], axis=-1)
        k = n
    cols = jnp.arange(k)
    dtype = m.dtype

    def reflect(i, a):
        row = _unit(i, n, dtype) @ a  # (..., k)
        x = jnp.where(cols >= i, row, 0.0)
        alpha = jnp.sqrt(jnp.sum(x**2, axis=-1))
        lead = x @ _unit(i, k, dtype)
        v = x + (jnp.where(lead >= 0, 1.0, -1.0) * alpha)[..., None] * _unit(i, k, dtype)
        vv = jnp.sum(v**2, axis=-1)
        coef = jnp.where(vv > 0, 2.0 / jnp.where(vv > 0, vv, 1.0), 0.0)
        av = jnp.einsum("...nk,...k->...n", a, v)
        return a - (av * coef[..., None])[..., :, None] * v[..., None, :]

    # what each reflection leaves beyond the diagonal is rounding: drop it, as QR does
    chol = jnp.tril(jax.lax.fori_loop(0, n, reflect, m)[..., :, :n])
    sign = jnp.where(jnp.diagonal(chol, axis1=-2, axis2=-1) < 0, -1.0, 1.0).astype(dtype)
    return chol * sign[..., None, :]


class _Update(NamedTuple):
    """The square-root update of ``N(mean, L L^T)`` by one step's observation."""

    chol_s: Any  # (D, D) L_S
    z: Any  # (D,) L_S^{-1} v
    gain_l: Any  # (n, D) K~ = L X^T (the gain is K~ L_S^{-1})
    chol_f: Any  # (n, n) filtered factor (Joseph form)
    extra: Any  # (D, k) L_S^{-1} columns


def _update(arrays_t: GaussianSSMArrays, mean, chol, y_t, mask_t, u_t, columns) -> _Update:
    """`kalman_sqrt.sqrt_update` with the batched kernels, whitening further ``columns``."""
    dtype = chol.dtype
    n = chol.shape[-1]
    obs = mask_t.astype(dtype)
    h = arrays_t.emission_weights * obs[:, None]
    v = _residual(arrays_t, mean, y_t, mask_t, u_t)
    noise = jnp.concatenate([arrays_t.emission_cov * obs[:, None], jnp.diag(1.0 - obs)], axis=1)
    hl = h @ chol
    chol_s = _tria(jnp.concatenate([noise, hl], axis=1))
    k = columns.shape[1]
    solved = _solve_lower(chol_s, jnp.concatenate([v[:, None], hl, noise, columns], axis=1))
    z, x = solved[:, 0], solved[:, 1 : n + 1]
    noise_w = solved[:, n + 1 : solved.shape[1] - k]
    gain_l = chol @ x.T
    chol_f = _tria(jnp.concatenate([chol - gain_l @ x, gain_l @ noise_w], axis=1))
    return _Update(chol_s, z, gain_l, chol_f, solved[:, solved.shape[1] - k :])


def _element(roots: GaussianSSMArrays, chol0, t, y_t, mask_t, u_t):
    """``(A_t, U_t, Z_t)`` of step ``t`` (``t = 0``: ``(0, U_{0|0}, 0)``)."""
    prev = arrays_at(roots, t - 1)
    f = prev.dynamics_weights
    first = t == 0
    arr = arrays_at(roots, t)
    h = arr.emission_weights * mask_t.astype(f.dtype)[:, None]
    prior = jnp.where(first, chol0, prev.dynamics_cov)
    upd = _update(arr, roots.initial_mean, prior, y_t, mask_t, u_t, h @ f)
    zero = jnp.zeros_like(f)
    a = jnp.where(first, zero, f - upd.gain_l @ upd.extra)
    z = jnp.where(first, zero, _tria(_mT(upd.extra)))
    return a, upd.chol_f, z


def _combine(earlier, later):
    """``(A, U, Z)`` of two consecutive blocks (batched over a leading axis)."""
    a1, u1, z1 = earlier
    a2, u2, z2 = later
    n = a1.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=a1.dtype), a1.shape)
    xi = _tria(jnp.concatenate([
        jnp.concatenate([_mT(u1) @ z2, eye], axis=-1),
        jnp.concatenate([z2, jnp.zeros_like(z2)], axis=-1),
    ], axis=-2))
    x11, x21, x22 = xi[..., :n, :n], xi[..., n:, :n], xi[..., n:, n:]
    g = _mT(_solve_lower(x11, _mT(u1)))  # U_i X11^{-T}
    a = a2 @ (a1 - g @ (_mT(x21) @ a1))
    u = _tria(jnp.concatenate([a2 @ g, u2], axis=-1))
    z = _tria(jnp.concatenate([_mT(a1) @ x22, z1], axis=-1))
    return a, u, z


def _prepare(arrays, y, mask, inputs, name):
    y = jnp.asarray(y)
    mask = jnp.asarray(mask, bool)
    inputs = jnp.asarray(inputs)
    _check(arrays, y, mask, inputs)
    if arrays.initial_diffuse.shape[1]:
        raise NotImplementedError(
            f"{name} does not implement exact diffuse initialization (initial_diffuse has "
            f"{arrays.initial_diffuse.shape[1]} columns); use "
            "statseq.inference.kalman_parallel"
        )
    roots = jax.tree.map(jnp.asarray, square_root_arrays(arrays))
    return roots, psd_cholesky(arrays.initial_cov), y, mask, inputs


def parallel_sqrt_kalman_filter_factors(
    arrays: GaussianSSMArrays, y, mask, inputs
) -> SqrtKalmanFilterResult:
    """Square-root Kalman filter by parallel prefix scans, returning the factors (twin of
    `statseq.inference.kalman_sqrt.sqrt_kalman_filter_factors`).

    Args:
        arrays: the model's matrices (``initial_diffuse`` with ``q = 0`` columns).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `~statseq.inference.kalman_sqrt.SqrtKalmanFilterResult`.

    Raises:
        NotImplementedError: if the initial law has diffuse directions.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.kalman import GaussianSSMArrays
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)), jnp.zeros(1),
        ...     jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0]])
        >>> res = jax.jit(parallel_sqrt_kalman_filter_factors)(arr, y, jnp.ones_like(y, bool),
        ...                                                    jnp.zeros((2, 0)))
        >>> round(float(res.filtered_chols[1, 0, 0] ** 2), 6)  # 1.5 / 2.5
        0.6
    """
    roots, chol0, y, mask, inputs = _prepare(arrays, y, mask, inputs,
                                             "parallel_sqrt_kalman_filter")
    num_t = y.shape[0]
    steps = jnp.arange(num_t)
    elements = jax.vmap(_element, in_axes=(None, None, 0, 0, 0, 0))(roots, chol0, steps, y,
                                                                    mask, inputs)
    filt_chol = _scan(_combine, elements)[1]

    def prior(t, chol, u_next):
        """``F_t``, the offset ``c_t`` and the predicted factor of ``x_{t+1}``."""
        arr = arrays_at(roots, t)
        f = arr.dynamics_weights
        offset = arr.dynamics_input_weights @ u_next + arr.dynamics_bias
        return f, offset, _tria(jnp.concatenate([f @ chol, arr.dynamics_cov], axis=1))

    f, offset, pred_chol = jax.vmap(prior)(steps[:-1], filt_chol[:-1], inputs[1:])
    pred_chol = jnp.concatenate([chol0[None].astype(filt_chol.dtype), pred_chol])
    base = jnp.concatenate([roots.initial_mean[None], offset])

    def gains(t, mean, chol, y_t, m_t, u_t):
        arr = arrays_at(roots, t)
        h = arr.emission_weights * m_t.astype(chol.dtype)[:, None]
        upd = _update(arr, mean, chol, y_t, m_t, u_t, h)
        return upd.chol_s, upd.gain_l, upd.extra, upd.gain_l @ upd.z, upd.chol_f

    # the filtered factors are recomputed from the predicted ones (the step of the
    # sequential filter): the combinations lose up to eps * sqrt(P / R) on off-diagonal
    # entries (1e-8 of sqrt(P_ii P_jj) at P / R = 10^16), one update restores 1e-14
    chol_s, gain_l, lh, step_gain, filt_chol = jax.vmap(gains)(steps, base, pred_chol, y, mask,
                                                               inputs)
    # m_t = Phi_t m_{t-1} + beta_t, Phi_t = (I - K_t H~_t) F_{t-1}, beta_t = c_{t-1} + K_t v_t(c)
    n = filt_chol.shape[-1]
    eye = jnp.eye(n, dtype=filt_chol.dtype)
    phi = jnp.concatenate([jnp.zeros((1, n, n), filt_chol.dtype),
                           (eye - gain_l[1:] @ lh[1:]) @ f])
    beta = jnp.concatenate([(base[0] + step_gain[0])[None], offset + step_gain[1:]])
    filt_mean = _scan(_affine_combine, (phi, beta[:, :, None]))[1][:, :, 0]
    pred_mean = jnp.concatenate([base[:1], jnp.einsum("tij,tj->ti", f, filt_mean[:-1])
                                 + offset])

    def density(t, mean, chol_s_t, y_t, m_t, u_t):
        v = _residual(arrays_at(roots, t), mean, y_t, m_t, u_t)
        return _log_density(_solve_lower(chol_s_t, v[:, None])[:, 0], chol_s_t, m_t)

    log_prob = jax.vmap(density)(steps, pred_mean, chol_s, y, mask, inputs)
    return SqrtKalmanFilterResult(pairwise_sum(log_prob), log_prob, pred_mean, pred_chol,
                                  filt_mean, filt_chol)


def _gram(chol):
    return chol @ _mT(chol)


def parallel_sqrt_kalman_filter(arrays: GaussianSSMArrays, y, mask, inputs
                                ) -> KalmanFilterResult:
    """Square-root Kalman filter by parallel prefix scans with the outputs of
    `statseq.inference.kalman.kalman_filter`.

    The log-likelihood is the prediction error decomposition

        log p(y_{0:T-1}) = sum_t log N(y_t; H_t a_t + D_t u_t + d_t, H_t P_t H_t^T + R_t)

    (observed entries only), with the covariances returned as ``L L^T`` of the factors of
    `parallel_sqrt_kalman_filter_factors`.

    Args:
        arrays: the model's matrices (``initial_diffuse`` with ``q = 0`` columns).
        y: ``(T, D)`` observations.
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `~statseq.inference.kalman.KalmanFilterResult`.

    Raises:
        NotImplementedError: if the initial law has diffuse directions.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.kalman import GaussianSSMArrays, kalman_filter
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.9 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0], [-0.3]])
        >>> args = (arr, y, jnp.ones_like(y, bool), jnp.zeros((3, 0)))
        >>> res = jax.jit(parallel_sqrt_kalman_filter)(*args)  # not jitted itself
        >>> seq = jax.jit(kalman_filter)(*args)
        >>> bool(jnp.allclose(res.marginal_log_lik, seq.marginal_log_lik))
        True
    """
    res = parallel_sqrt_kalman_filter_factors(arrays, y, mask, inputs)
    return KalmanFilterResult(res.marginal_log_lik, res.log_probs, res.predicted_means,
                              _gram(res.predicted_chols), res.filtered_means,
                              _gram(res.filtered_chols))


# ---- smoother -------------------------------------------------------------------------------
def _smoother_elements(roots, filt: SqrtKalmanFilterResult):
    """``(E_t, g_t, D_t)`` of ``x_t | x_{t+1}, y_{<=t}`` for every ``t`` (the last one:
    ``(0, m_{T-1|T-1}, U_{T-1})``)."""
    num_t, n = filt.filtered_means.shape

    def one(t, m_f, l_f, m_p, l_p):
        arr = arrays_at(roots, t)
        fl = arr.dynamics_weights @ l_f
        gain = smoother_gain(l_f, fl, l_p, _inverse_gain)  # P_{t|t} F^T P_{t+1|t}^+
        chol = _tria(jnp.concatenate([l_f - gain @ fl, gain @ arr.dynamics_cov], axis=1))
        return gain, m_f - gain @ m_p, chol

    gain, offset, chol = jax.vmap(one)(jnp.arange(num_t - 1), filt.filtered_means[:-1],
                                       filt.filtered_chols[:-1], filt.predicted_means[1:],
                                       filt.predicted_chols[1:])
    last = (jnp.zeros((1, n, n), gain.dtype), filt.filtered_means[-1:],
            filt.filtered_chols[-1:])
    return tuple(jnp.concatenate([a, b]) for a, b in zip((gain, offset, chol), last,
                                                          strict=True))


def _inverse_gain(l_f, fl, l_p):
    """``P_{t|t} F^T P_{t+1|t}^{-1}`` by `_solve_lower` (no batched LAPACK call)."""
    inv_p = _solve_lower(l_p, jnp.eye(l_p.shape[-1], dtype=l_p.dtype))
    return l_f @ _mT(inv_p @ fl) @ inv_p


def _smoother_combine(later, earlier):
    """``x_t = E x_{t+1} + g + D e`` maps of a later block, then an earlier one, composed
    (`_scan` with ``reverse=True`` calls ``fn(later block, earlier element)``)."""
    e2, g2, d2 = later
    e1, g1, d1 = earlier
    return (e1 @ e2, jnp.einsum("...ij,...j->...i", e1, g2) + g1,
            _tria(jnp.concatenate([e1 @ d2, d1], axis=-1)))


def parallel_sqrt_kalman_smoother_factors(
    arrays: GaussianSSMArrays, y, mask, inputs
) -> SqrtKalmanSmootherResult:
    """Square-root Rauch-Tung-Striebel smoother by parallel scans, returning the factors
    (twin of `statseq.inference.kalman_sqrt.sqrt_kalman_smoother_factors`).

    `parallel_sqrt_kalman_filter_factors`, then a suffix scan over the smoother elements
    of the module docstring; the lag-one covariances are ``Cov[x_{t+1}, x_t | y] =
    P_{t+1|T} J_t^T``. Singular predicted covariances are handled as in
    `statseq.inference.kalman_sqrt.smoother_gain`.

    Args:
        arrays: the model's matrices (``initial_diffuse`` with ``q = 0`` columns).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).

    Returns:
        A `~statseq.inference.kalman_sqrt.SqrtKalmanSmootherResult`.

    Raises:
        NotImplementedError: if the initial law has diffuse directions.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.kalman import GaussianSSMArrays
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)), jnp.zeros(1),
        ...     jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0]])
        >>> smoother = jax.jit(parallel_sqrt_kalman_smoother_factors)  # not jitted itself
        >>> res = smoother(arr, y, jnp.ones_like(y, bool), jnp.zeros((2, 0)))
        >>> round(float(res.smoothed_chols[0, 0, 0] ** 2), 6)  # 1/2 - (1/3)^2 (3/2 - 3/5)
        0.4
    """
    filt = parallel_sqrt_kalman_filter_factors(arrays, y, mask, inputs)
    roots = square_root_arrays(arrays)
    elements = _smoother_elements(roots, filt)
    _, sm_mean, sm_chol = _scan(_smoother_combine, elements, reverse=True)
    gain = elements[0][:-1]
    cross = sm_chol[1:] @ (_mT(sm_chol[1:]) @ _mT(gain))
    return SqrtKalmanSmootherResult(filt.marginal_log_lik, filt.filtered_means,
                                    filt.filtered_chols, sm_mean, sm_chol, cross)


def parallel_sqrt_kalman_smoother(arrays: GaussianSSMArrays, y, mask, inputs
                                  ) -> KalmanSmootherResult:
    """Square-root smoother by parallel scans with the outputs of
    `statseq.inference.kalman.kalman_smoother`.

    The smoothed moments of the Rauch-Tung-Striebel recursion
    (``J_t = P_{t|t} F_t^T P_{t+1|t}^{-1}``),

        E[x_t | y] = m_{t|t} + J_t (E[x_{t+1} | y] - m_{t+1|t}),
        Cov[x_t | y] = P_{t|t} + J_t (Cov[x_{t+1} | y] - P_{t+1|t}) J_t^T,
        Cov[x_{t+1}, x_t | y] = Cov[x_{t+1} | y] J_t^T,

    computed on factors by the scans of `parallel_sqrt_kalman_smoother_factors`, with the
    covariances returned as ``L L^T``.

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
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.kalman import GaussianSSMArrays, kalman_smoother
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.9 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0], [-0.3]])
        >>> args = (arr, y, jnp.ones_like(y, bool), jnp.zeros((3, 0)))
        >>> res = jax.jit(parallel_sqrt_kalman_smoother)(*args)  # not jitted itself
        >>> seq = jax.jit(kalman_smoother)(*args)
        >>> bool(jnp.allclose(res.smoothed_means, seq.smoothed_means))
        True
    """
    res = parallel_sqrt_kalman_smoother_factors(arrays, y, mask, inputs)
    return KalmanSmootherResult(res.marginal_log_lik, res.filtered_means,
                                _gram(res.filtered_chols), res.smoothed_means,
                                _gram(res.smoothed_chols), res.smoothed_cross_covs)
