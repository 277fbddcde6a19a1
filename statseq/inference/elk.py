"""ELK and quasi-ELK: DEER's Newton step damped into a Kalman smoother (Levenberg-Marquardt).

Undamped Newton (DEER, `statseq.inference.deer`) can leave the region where its
linearization is any good: on a chaotic or expansive cell the Jacobian products along the
trajectory grow like ``exp(λ_max t)`` and the iterates overflow. ELK (Gonzalez et al.
2024, "Towards scalable and stable parallelization of nonlinear RNNs") takes a
Levenberg-Marquardt step instead: with ``r_t(h) = h_t - f(θ, h_{t-1}, x_t)`` linearized at
the current guess ``h^{(i)}`` (``J_t``, ``b_t = f(h^{(i)}_{t-1}, x_t) - J_t h^{(i)}_{t-1}``),

    h^{(i+1)} = argmin_h  Σ_t |h_t - J_t h_{t-1} - b_t|^2 + λ Σ_t |h_t - h^{(i)}_t|^2,

which is exactly the posterior mean of a linear Gaussian state space model: dynamics
``h_t = J_t h_{t-1} + b_t + w_t``, ``w_t ~ N(0, I)`` (``h_0 ~ N(f(h0, x_0), I)``), and
pseudo-observations ``y_t = h^{(i)}_t + v_t``, ``v_t ~ N(0, I / λ)``. It is computed by the
library's parallel Kalman smoother (`statseq.inference.kalman_parallel`, ``O(log T)``
depth): with dense ``J_t`` for ``"elk"``, and for ``"quasi-elk"`` with their diagonals,
``H`` independent scalar smoothers (vmapped). ``λ -> 0`` is DEER's step, ``λ -> ∞`` stays
put.

The damping adapts (Levenberg-Marquardt): a step is accepted only if it lowers the merit
``Σ_t |r_t|^2``, after which ``λ`` is divided by 10; a rejected step multiplies ``λ`` by 10 and
keeps the guess. The merit therefore never increases, so ELK never blows up, and since the
Jacobian of ``r`` is unit lower block-triangular (always invertible), its only stationary
point is the solution.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from statseq.inference.kalman import GaussianSSMArrays
from statseq.inference.kalman_parallel import parallel_kalman_smoother

__all__ = ["elk_step"]

_LAMBDA_MIN, _LAMBDA_MAX, _FACTOR = 1e-9, 1e12, 10.0


def _smooth(m0, jac, b, y, lam):
    """Posterior means of the dense linear Gaussian model above (``n`` = state size)."""
    num_t, n = y.shape
    dtype = y.dtype
    eye = jnp.eye(n, dtype=dtype)
    arrays = GaussianSSMArrays(
        m0, eye, jac[1:], jnp.zeros((n, 0), dtype), b[1:], eye,
        eye, jnp.zeros((n, 0), dtype), jnp.zeros((n,), dtype), eye / lam,
        jnp.zeros((n, 0), dtype))
    res = parallel_kalman_smoother(arrays, y, jnp.ones(y.shape, bool),
                                   jnp.zeros((num_t, 0), dtype))
    return res.smoothed_means


def elk_step(jac, fs, prev, h_guess, lam, *, diagonal: bool):
    """One Levenberg-Marquardt (ELK) step from the guess ``h_guess`` ``(T, H)``.

        argmin_h Σ_t |h_t - J_t h_{t-1} - b_t|^2 + λ Σ_t |h_t - h^{(i)}_t|^2,
        b_t = f(h^{(i)}_{t-1}, x_t) - J_t h^{(i)}_{t-1},   h_{-1} = h0 fixed,

    by a parallel Kalman smoother (see the module docstring).

    Args:
        jac: ``(T, H, H)`` Jacobians ``J_t`` (``diagonal=False``) or ``(T, H)`` their
            diagonals (``diagonal=True``: ``H`` independent scalar smoothers).
        fs: ``(T, H)`` ``f(h^{(i)}_{t-1}, x_t)``.
        prev: ``(T, H)`` ``h^{(i)}_{t-1}`` (row 0 is ``h0``).
        h_guess: ``(T, H)`` the current guess ``h^{(i)}``.
        lam: damping ``λ > 0`` (scalar).
        diagonal: whether ``jac`` holds diagonals.

    Returns:
        ``(T, H)`` the damped Newton iterate.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> jac, fs = jnp.full((3, 1, 1), 0.5), jnp.ones((3, 1))
        >>> prev, guess = jnp.zeros((3, 1)), jnp.zeros((3, 1))
        >>> step = jax.jit(elk_step, static_argnames="diagonal")
        >>> undamped = step(jac, fs, prev, guess, 1e-12, diagonal=False)
        >>> [round(float(v), 6) for v in undamped[:, 0]]  # DEER's step: h_t = 0.5 h_{t-1} + 1
        [1.0, 1.5, 1.75]
    """
    if diagonal:
        b = fs - jac * prev
        m0 = fs[0]  # the mean of h_0: J_0 h0 + b_0 = f(h0, x_0)

        def one(m0_k, d_k, b_k, y_k):
            return _smooth(m0_k[None], d_k[:, None, None], b_k[:, None], y_k[:, None],
                           lam)[:, 0]

        return jax.vmap(one, in_axes=(0, 1, 1, 1), out_axes=1)(m0, jac, b, h_guess)
    b = fs - jnp.einsum("tij,tj->ti", jac, prev)
    return _smooth(fs[0], jac, b, h_guess, lam)


def lm_update(lam, accept):
    """Levenberg-Marquardt damping update: ``λ / 10`` after an accepted step, ``10 λ``
    after a rejected one, kept in ``[1e-9, 1e12]``."""
    lam = jnp.where(accept, lam / _FACTOR, lam * _FACTOR)
    return jnp.clip(lam, _LAMBDA_MIN, _LAMBDA_MAX)
