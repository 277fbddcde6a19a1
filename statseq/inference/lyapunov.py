"""The largest Lyapunov exponent of a recurrence along a trajectory: the predictability
diagnostic for parallel (DEER / ELK) evaluation.

For ``h_t = f(θ, h_{t-1}, x_t)`` with Jacobians ``J_t = ∂f/∂h (θ, h_{t-1}, x_t)`` along a
trajectory, the largest Lyapunov exponent is the growth rate of a perturbation,

    λ_max = lim_T (1/T) log |J_{T-1} ... J_1 J_0 v|,

estimated by the power iteration ``u_t = J_t v_{t-1}``, ``v_t = u_t / |u_t|``,
``λ ≈ (1/T) Σ_t log |u_t|`` (Benettin et al. 1980), with Jacobian-vector products only
(``O(T H)`` memory). ``λ_max < 0``: the cell forgets perturbations, Newton's linear
recurrences are well conditioned and DEER converges in a few iterations (growing like
``log T``); ``λ_max > 0``: the cell is chaotic, the merit of the Newton system is
ill-conditioned like ``exp(λ_max T)``, and no parallel method beats the sequential scan
(DEER needs about ``T`` iterations; Gonzalez et al. 2025, "Predictability enables
parallelization of nonlinear state space models").
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

__all__ = ["lyapunov_exponent"]


def lyapunov_exponent(step: Callable, params, h0, xs, *, states=None, v0=None):
    """Estimate of the largest Lyapunov exponent of ``h_t = step(params, h_{t-1}, x_t)``.

        λ ≈ (1/T) Σ_t log |J_t v_{t-1}|,   v_t = J_t v_{t-1} / |J_t v_{t-1}|,

    along the trajectory from ``h0`` (computed by `jax.lax.scan`, or ``states`` if given,
    e.g. a converged `statseq.inference.deer.deer` result).

    Args:
        step: ``step(params, h, x_t) -> h`` (``h`` any pytree of float arrays).
        params: parameters, passed unchanged to every step.
        h0: initial state ``h_{-1}``.
        xs: inputs, leaves with a leading time axis ``T >= 1``.
        states: optional trajectory ``h_0, ..., h_{T-1}`` (``h0``'s pytree with a leading
            axis ``T``).
        v0: optional initial direction (flat, size ``H``); default all ones.

    Returns:
        Scalar estimate of ``λ_max`` (per step, natural log). Its bias is ``O(1/T)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> lam = lyapunov_exponent(lambda a, h, x: a * h + x, jnp.array([0.5, 0.9]),
        ...                         jnp.zeros(2), jnp.ones((200, 2)))
        >>> round(float(lam), 3), round(float(jnp.log(0.9)), 3)  # log max |a| + O(1/T)
        (-0.107, -0.105)
    """
    h0_flat, unravel = ravel_pytree(h0)

    def f(h, x):
        return ravel_pytree(step(params, unravel(h), x))[0].astype(h0_flat.dtype)

    if states is None:
        def body(h, x):
            h = f(h, x)
            return h, h

        hs = jax.lax.scan(body, h0_flat, xs)[1]
    else:
        hs = jax.vmap(lambda s: ravel_pytree(s)[0])(states).astype(h0_flat.dtype)
    prev = jnp.concatenate([h0_flat[None], hs[:-1]], axis=0)
    v = jnp.ones_like(h0_flat) if v0 is None else jnp.asarray(v0, h0_flat.dtype)
    v = v / jnp.linalg.norm(v)

    def grow(v, inp):
        h_prev, x = inp
        u = jax.jvp(lambda h: f(h, x), (h_prev,), (v,))[1]
        norm = jnp.linalg.norm(u)
        return u / norm, jnp.log(norm)

    _, logs = jax.lax.scan(grow, v, (prev, xs))
    return jnp.mean(logs)
