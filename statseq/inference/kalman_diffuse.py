"""The exact initial (diffuse) Kalman update, one scalar observation at a time.

Koopman and Durbin (2000), *Fast filtering and smoothing for multivariate state space
models*, J. Time Series Analysis 21(3); Durbin and Koopman (2012), sections 5.2-5.3, 6.4.
The predicted state's covariance is ``kappa P_inf + P_star`` with ``kappa -> infinity``;
``P_inf = B B^T`` is carried as a factor ``B`` ``(n, q)``. The observation ``y_t`` is
first decorrelated, ``R = L diag(d) L^T`` (``L`` unit lower triangular, an ``LDL^T`` that
accepts a singular ``R``), ``y* = L^{-1} y``, ``Z = L^{-1} H``, and its entries are then
processed one by one. With ``z`` a row of ``Z``, ``u = B^T z``, ``F_inf = u^T u``,
``M_star = P_star z``, ``F_star = z^T M_star + d_i`` and ``v = y*_i - z^T a``:

* ``F_inf > 0`` (a new diffuse direction is observed), with ``K = B u / F_inf``:

      a += K v,   P_star = (I - K z^T) P_star (I - K z^T)^T + K K^T d_i,
      B = B (I - u u^T / F_inf),   log L += -1/2 (log 2 pi + log F_inf);

* ``F_inf = 0``: the ordinary update with ``K = M_star / F_star`` (same Joseph form) and
  ``log L += -1/2 (log 2 pi + log F_star + v^2 / F_star)``; an entry with ``F_star = 0``
  as well (zero observation variance in a direction the state already pins down) carries
  no information and is skipped.

The ``P_star`` update is the limit ``kappa -> infinity`` of the Joseph form (expanding
``P - M M^T / F`` in ``1 / kappa`` gives ``P_star - K M_star^T - M_star K^T + K K^T
F_star``, which is this), so it stays positive semidefinite and keeps its relative
accuracy when the observation variance goes to 0. Nothing of order ``1 / R`` is formed:
the augmented (de Jong) diffuse likelihood ``log L(delta = 0) - 1/2 log|S| + 1/2 s^T
S^{-1} s`` instead cancels such terms, and lost all precision below ``R / Q ~ 1e-10``.
``F_inf = 0`` is judged relative to the scale of ``B`` and ``z``
(``|u| <= sqrt(eps) |B|_F |z|``), and at most ``q`` directions are ever counted as
identified: each identification lowers the rank of ``P_inf`` by exactly one, and at
rank 0 the diffuse phase is over.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from statseq.inference.gaussian import symmetrize

_LOG_2PI = math.log(2.0 * math.pi)


class DiffuseEntries(NamedTuple):
    """What the exact initial smoother needs of each scalar entry of `diffuse_update`.

    Attributes:
        z: ``(n,)`` the decorrelated row of ``H``.
        v: scalar innovation ``y*_i - z^T a``.
        f_inf, f_star: scalars ``F_inf = z^T P_inf z`` and ``F_star``.
        m_inf, m_star: ``(n,)`` ``P_inf z`` and ``P_star z``.
        is_inf, is_star: which update the entry took (neither: it was skipped).
    """

    z: Any
    v: Any
    f_inf: Any
    f_star: Any
    m_inf: Any
    m_star: Any
    is_inf: Any
    is_star: Any


def ldl(r: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``R = L diag(d) L^T`` for a symmetric positive semidefinite ``R`` ``(D, D)``.

    ``L`` is unit lower triangular; where a pivot is zero (up to ``4 D eps`` relative to
    its diagonal entry: ``R`` singular) its column below the diagonal is zero and
    ``d = 0`` there.

    Args:
        r: ``(D, D)`` symmetric positive semidefinite matrix.

    Returns:
        ``(L, d)``: ``(D, D)`` and ``(D,)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> lmat, d = ldl(jnp.array([[1.0, 2.0], [2.0, 4.0]]))  # rank 1
        >>> lmat.tolist(), d.tolist()
        ([[1.0, 0.0], [2.0, 1.0]], [1.0, 0.0])
    """
    dim = r.shape[0]
    tiny = 4.0 * dim * jnp.finfo(r.dtype).eps
    idx = jnp.arange(dim)

    def column(j, state):
        lmat, d = state
        row = lmat[j]  # L[j, k] for k < j (zero beyond)
        dj = r[j, j] - jnp.sum(row**2 * d)
        ok = dj > tiny * jnp.abs(r[j, j])
        col = (r[:, j] - lmat @ (d * row)) / jnp.where(ok, dj, 1.0)
        col = jnp.where(ok & (idx > j), col, 0.0) + (idx == j)
        return lmat.at[:, j].set(col), d.at[j].set(jnp.where(ok, dj, 0.0))

    init = (jnp.zeros_like(r), jnp.zeros((dim,), r.dtype))
    return jax.lax.fori_loop(0, dim, column, init)


def diffuse_update(mean: jax.Array, cov: jax.Array, factor: jax.Array, identified: Any,
                   h: jax.Array, emission_cov: jax.Array, y_off: jax.Array, mask: jax.Array,
                   entries: bool = False) -> tuple:
    """Exact initial update of the predicted ``(a, P_star, B)`` with one observation.

    Args:
        mean: ``(n,)`` ``a``.
        cov: ``(n, n)`` ``P_star``.
        factor: ``(n, q)`` ``B`` with ``P_inf = B B^T``.
        identified: int, how many diffuse directions earlier entries identified.
        h: ``(D, n)`` ``H``.
        emission_cov: ``(D, D)`` ``R``.
        y_off: ``(D,)`` the observation less its known offsets (``y - D u - d``).
        mask: ``(D,)`` observed entries.
        entries: also return the per-entry quantities the exact initial smoother needs.

    Returns:
        ``(log_prob, mean, cov, factor, identified)`` after the update, and with
        ``entries=True`` a sixth item, `DiffuseEntries` with a leading axis ``D``.
    """
    dtype = cov.dtype
    q = factor.shape[1]
    m = mask.astype(dtype)
    r = emission_cov * (m[:, None] * m[None, :]) + jnp.diag(1.0 - m)
    lmat, dvec = ldl(symmetrize(r))
    rhs = jnp.concatenate([jnp.where(mask, y_off, 0.0)[:, None], h * m[:, None]], axis=1)
    solved = jsl.solve_triangular(lmat, rhs, lower=True, unit_diagonal=True)
    ystar, zmat = solved[:, 0], solved[:, 1:]
    rel = math.sqrt(jnp.finfo(dtype).eps)  # 1.5e-8 in float64
    eps = jnp.finfo(dtype).eps
    eye = jnp.eye(cov.shape[0], dtype=dtype)

    def entry(state, xs):
        lp, a, p, b, ident = state
        z, yi, di, obs = xs
        v = yi - z @ a
        u = b.T @ z
        f_inf = u @ u
        z2 = z @ z
        scale_b = jnp.sum(b**2) * z2
        is_inf = obs & (ident < q) & (f_inf > rel**2 * scale_b) & (f_inf > 0)
        m_star = p @ z
        f_star = z @ m_star + di
        ref = z2 * jnp.max(jnp.abs(jnp.diagonal(p))) + di
        is_star = obs & ~is_inf & (f_star > 64.0 * eps * ref) & (f_star > 0)
        f_inf_s = jnp.where(is_inf, f_inf, 1.0)
        f_star_s = jnp.where(is_star, f_star, 1.0)
        gain = jnp.where(is_inf, (b @ u) / f_inf_s, jnp.where(is_star, m_star / f_star_s, 0.0))
        closed = eye - jnp.outer(gain, z)
        p_new = symmetrize(closed @ p @ closed.T + jnp.outer(gain, gain) * di)
        b_new = jnp.where(is_inf, b - jnp.outer(b @ u, u) / f_inf_s, b)
        lp_inf = -0.5 * (_LOG_2PI + jnp.log(f_inf_s))
        lp_star = -0.5 * (_LOG_2PI + jnp.log(f_star_s) + v**2 / f_star_s)
        lp = lp + jnp.where(is_inf, lp_inf, jnp.where(is_star, lp_star, 0.0))
        out = DiffuseEntries(z, v, f_inf, f_star, b @ u, m_star, is_inf, is_star)
        a = a + gain * v
        return (lp, a, p_new, b_new, ident + is_inf.astype(ident.dtype)), out

    init = (jnp.zeros((), dtype), mean, cov, factor, jnp.asarray(identified, jnp.int32))
    (lp, a, p, b, ident), ents = jax.lax.scan(entry, init, (zmat, ystar, dvec, mask))
    b = jnp.where(ident >= q, jnp.zeros_like(b), b)
    if entries:
        return lp, a, p, b, ident, ents
    return lp, a, p, b, ident
