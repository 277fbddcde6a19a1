"""The exact initial (diffuse) state smoother on the univariate exact initial filter.

Durbin and Koopman (2012), sections 5.3 and 6.4; Koopman and Durbin (2000). The filter of
`statseq.inference.kalman_diffuse` leaves, at each step ``t`` of the diffuse phase, the
predicted ``a_t``, ``P_star,t`` and ``P_inf,t = B_t B_t^T``, and for each scalar entry
``i`` its ``z``, ``v``, ``F_inf``, ``F_star``, ``M_inf = P_inf z``, ``M_star = P_star z``.
Expanding the smoother's ``r`` and ``N`` in ``1 / kappa`` (``r = r0 + r1 / kappa``,
``N = N0 + N1 / kappa + N2 / kappa^2``) gives, backward over the entries, for
``F_inf > 0`` with ``F1 = 1 / F_inf``, ``F2 = -F_star / F_inf^2``, ``K0 = M_inf F1``,
``K1 = M_star F1 + M_inf F2``, ``L0 = I - K0 z^T``, ``L1 = -K1 z^T``:

    r0 <- L0^T r0,   r1 <- z F1 v + L0^T r1 + L1^T r0,
    N0 <- L0^T N0 L0,   N1 <- z z^T F1 + L0^T N1 L0 + L1^T N0 L0 + L0^T N0 L1,
    N2 <- z z^T F2 + L0^T N2 L0 + L0^T N1 L1 + L1^T N1 L0 + L1^T N0 L1,

and for ``F_inf = 0`` (exactly, ``K = M_star / F_star``, ``L0 = I - K z^T``)
``r0 <- z v / F_star + L0^T r0``, ``r1 <- L0^T r1``, ``N_j <- L0^T N_j L0`` (plus
``z z^T / F_star`` for ``N0``); between steps ``r <- F_t^T r``, ``N <- F_t^T N F_t``.
Then

    E[x_t | y] = a_t + P_star r0 + P_inf r1,
    Cov[x_t | y] = P_star - P_star N0 P_star - P_inf N1 P_star - P_star N1 P_inf
                   - P_inf N2 P_inf,
    Cov[x_{t+1}, x_t | y] = F Ps - Ps' N0 F Ps - Pi' N1 F Ps - Ps' N1 F Pi - Pi' N2 F Pi,

with ``Ps, Pi`` the filtered (after step ``t``) and ``Ps', Pi'`` the predicted (step
``t + 1``) star and infinite parts, and the ``r``, ``N`` at the start of step ``t + 1``
(from ``Cov = (I - P_{t+1} N_t) L_t P_t`` and ``L_t P_t = F_t P_{t|t}``). Nothing of
order ``1 / R`` is formed, so the moments keep their accuracy down to ``R = 0``. After the
data identify every diffuse direction ``P_inf = 0`` and ``r1 = N1 = N2 = 0``: this is the
ordinary Durbin-Koopman backward pass, run there in its multivariate form.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from statseq.core.recurrence import pairwise_sum
from statseq.inference.gaussian import symmetrize
from statseq.inference.kalman import (
    GaussianSSMArrays,
    KalmanCarry,
    KalmanSmootherResult,
    _check,
    arrays_at,
    dynamics_weights,
    initial_carry,
    kalman_step,
    smoothed_from_filtered,
)
from statseq.inference.kalman_diffuse import diffuse_update


def _entries(arrays, c, mean, cov, diffuse, y_t, m_t, u_t):
    arr_t = arrays_at(arrays, c.t)
    y_off = y_t - arr_t.emission_input_weights @ u_t - arr_t.emission_bias
    return diffuse_update(mean, cov, diffuse, c.identified, arr_t.emission_weights,
                          arr_t.emission_cov, y_off, m_t, entries=True)[5]


def diffuse_step(arrays: GaussianSSMArrays, c: KalmanCarry, xs):
    """One step of `diffuse_forward`: ``(new carry, (log_prob, predicted mean, P_star, B,
    filtered carry, innovation, diffuse-before-step flag, `DiffuseEntries`))`` for
    ``xs = (y_t, mask_t, u_t)``."""
    y_t, m_t, u_t = xs
    lp, new, (mean, cov, diffuse, inn) = kalman_step(arrays, c, y_t, m_t, u_t)
    args = (arrays, c, mean, cov, diffuse, y_t, m_t, u_t)
    shape = jax.eval_shape(_entries, *args)
    ent = jax.lax.cond(
        c.collapsed, lambda _: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape),
        lambda _: _entries(*args), None)
    return new, (lp, mean, cov, diffuse, new, inn, ~c.collapsed, ent)


def diffuse_forward(arrays: GaussianSSMArrays, y, mask, inputs, carry: KalmanCarry | None = None):
    """The exact initial filter (`kalman_step`, ``collapse=True``) keeping what the smoother
    needs: ``(final carry, (log_probs, predicted mean, P_star, B, filtered carries,
    innovations, diffuse-before-step flags, per-entry `DiffuseEntries`))``; entries are 0
    at steps that start identified. ``carry`` defaults to the initial one."""
    carry = initial_carry(arrays) if carry is None else carry
    return jax.lax.scan(lambda c, xs: diffuse_step(arrays, c, xs), carry, (y, mask, inputs))


def diffuse_backward_step(arrays: GaussianSSMArrays, c, x):
    """One step of `diffuse_backward`: ``(r0, r1, N0, N1, N2)`` at the start of step ``t``
    from those at the start of step ``t + 1`` and ``x = (t, diffuse flag, w, z, Cholesky
    factor, H~, entries)``."""
    n = c[0].shape[0]
    eye = jnp.eye(n, dtype=c[0].dtype)

    def entry(c, e):
        r0, r1, n0, n1, n2 = c
        zz = jnp.outer(e.z, e.z)
        f1 = 1.0 / jnp.where(e.is_inf, e.f_inf, 1.0)
        f2 = -e.f_star * f1**2
        l0 = eye - jnp.outer(e.m_inf * f1, e.z)
        l1 = -jnp.outer(e.m_star * f1 + e.m_inf * f2, e.z)
        inf = (l0.T @ r0, e.z * (f1 * e.v) + l0.T @ r1 + l1.T @ r0,
               l0.T @ n0 @ l0,
               zz * f1 + l0.T @ n1 @ l0 + l1.T @ n0 @ l0 + l0.T @ n0 @ l1,
               zz * f2 + l0.T @ n2 @ l0 + l0.T @ n1 @ l1 + l1.T @ n1 @ l0 + l1.T @ n0 @ l1)
        fs = 1.0 / jnp.where(e.is_star, e.f_star, 1.0)
        ls = eye - jnp.outer(e.m_star * fs, e.z)
        star = (e.z * (fs * e.v) + ls.T @ r0, ls.T @ r1, zz * fs + ls.T @ n0 @ ls,
                ls.T @ n1 @ ls, ls.T @ n2 @ ls)
        new = tuple(jnp.where(e.is_inf, a, jnp.where(e.is_star, b, c_))
                    for a, b, c_ in zip(inf, star, c, strict=True))
        new = new[:2] + tuple(map(symmetrize, new[2:]))
        return new, None

    t, diffuse, w, z, chol, h, ents = x
    f = arrays_at(arrays, t).dynamics_weights
    r0, r1, n0, n1, n2 = c
    c = (f.T @ r0, f.T @ r1, f.T @ n0 @ f, f.T @ n1 @ f, f.T @ n2 @ f)

    def plain(c):
        r0, r1, n0, n1, n2 = c
        lh = jsl.solve_triangular(chol, h, lower=True)  # L^{-1} H~
        ikh = eye - w.T @ lh
        return (lh.T @ z + ikh.T @ r0, ikh.T @ r1, symmetrize(lh.T @ lh + ikh.T @ n0 @ ikh),
                symmetrize(ikh.T @ n1 @ ikh), symmetrize(ikh.T @ n2 @ ikh))

    def exact(c):
        return jax.lax.scan(entry, c, ents, reverse=True)[0]

    return jax.lax.cond(diffuse, exact, plain, c)


def diffuse_backward(arrays: GaussianSSMArrays, init, xs):
    """Backward over steps ``xs = (t, diffuse flag, whitened gain w, z, Cholesky factor,
    H~, entries)`` from ``init = (r0, r1, N0, N1, N2)`` at the start of the step after the
    last; returns the stacked ``(r0, r1, N0, N1, N2)`` at the start of each step."""

    def back(c, x):
        new = diffuse_backward_step(arrays, c, x)
        return new, new

    return jax.lax.scan(back, init, xs, reverse=True)[1]


def diffuse_smoothed(arrays: GaussianSSMArrays, total, mean, cov, factor, filt: KalmanCarry,
                     back) -> KalmanSmootherResult:
    """Smoothed moments from the predicted ``a_t``, ``P_star,t``, ``B_t`` ``(T, ...)``, the
    filtered carries and `diffuse_backward`'s ``(r0, r1, N0, N1, N2)``."""
    r0, r1, n0, n1, n2 = back
    pinf = factor @ jnp.swapaxes(factor, 1, 2)
    sm_mean = (mean + jnp.einsum("tij,tj->ti", cov, r0) + jnp.einsum("tij,tj->ti", pinf, r1))
    pn1p = pinf @ n1 @ cov
    sm_cov = symmetrize(cov - cov @ n0 @ cov - pn1p - jnp.swapaxes(pn1p, 1, 2)
                        - pinf @ n2 @ pinf)
    num_t = mean.shape[0]
    f = dynamics_weights(arrays, num_t)
    # steps after which every diffuse direction is identified (filtered P_inf = 0, the
    # factor is zeroed then): the cancellation-free form from the (proper) filtered
    # covariance, `statseq.inference.kalman.smoothed_from_filtered`
    plain = jnp.all(filt.diffuse == 0.0, axis=(1, 2))[:, None, None]
    sm_cov = jnp.where(plain, smoothed_from_filtered(f, filt.cov, n0), sm_cov)
    fps = f @ filt.cov[:-1]
    fpi = f @ (filt.diffuse[:-1] @ jnp.swapaxes(filt.diffuse[:-1], 1, 2))
    ps1, pi1 = cov[1:], pinf[1:]
    cross = (fps - ps1 @ n0[1:] @ fps - pi1 @ n1[1:] @ fps - ps1 @ n1[1:] @ fpi
             - pi1 @ n2[1:] @ fpi)
    return KalmanSmootherResult(total, filt.mean, filt.cov, sm_mean, sm_cov, cross)


def diffuse_kalman_smoother(arrays: GaussianSSMArrays, y: jax.Array, mask: jax.Array,
                            inputs: jax.Array) -> KalmanSmootherResult:
    """`statseq.inference.kalman.kalman_smoother` with diffuse directions: the exact
    initial smoother (module docstring) on the exact initial filter.

    Args:
        arrays: the model's matrices (``initial_diffuse`` ``(n, q)``, any ``q``).
        y: ``(T, D)`` observations.
        mask: ``(T, D)`` booleans.
        inputs: ``(T, m)``.

    Returns:
        A `KalmanSmootherResult`; the filtered moments are the exact initial filter's
        (``a_t`` and ``P_star`` before identification, as `kalman_filter` reports them).

    Examples:
        A local level observed without noise (``R = 0``, diffuse start): the data pin the
        state, so the smoothed means are the data and the smoothed variances 0.

        >>> import jax.numpy as jnp
        >>> z1, e1 = jnp.zeros((1, 1)), jnp.eye(1)
        >>> arr = GaussianSSMArrays(jnp.zeros(1), z1, e1, jnp.zeros((1, 0)), jnp.zeros(1),
        ...     e1, e1, jnp.zeros((1, 0)), jnp.zeros(1), z1, e1)
        >>> y = jnp.array([[1.0], [3.0], [2.0]])
        >>> res = diffuse_kalman_smoother(arr, y, jnp.ones_like(y, bool), jnp.zeros((3, 0)))
        >>> res.smoothed_means[:, 0].tolist(), float(jnp.abs(res.smoothed_covs).max())
        ([1.0, 3.0, 2.0], 0.0)
    """
    _check(arrays, y, mask, inputs)
    n = arrays.initial_mean.shape[-1]
    dtype = arrays.initial_cov.dtype
    _, (lp, mean, cov, factor, filt, inn, diffuse, ents) = diffuse_forward(
        arrays, y, mask, inputs)
    zero = jnp.zeros((n,), dtype)
    zeros = jnp.zeros((n, n), dtype)
    num_t = y.shape[0]
    xs = (jnp.arange(num_t), diffuse, inn.w, inn.z, inn.chol, inn.h, ents)
    back = diffuse_backward(arrays, (zero, zero, zeros, zeros, zeros), xs)
    return diffuse_smoothed(arrays, pairwise_sum(lp), mean, cov, factor, filt, back)
