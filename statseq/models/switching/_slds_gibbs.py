"""Blocked Gibbs sampling of a `SwitchingLDS`'s parameters, regimes and states.

One sweep (every block an exact conditional draw):

1. ``x | z, y`` and ``z | x, y`` per sequence (`statseq.inference.switching_gibbs`);
2. ``pi ~ Dirichlet(alpha + counts of z_0)``, each row ``P[i] ~ Dirichlet(alpha + n_i)``;
3. per regime (pooled over regimes when shared) the dynamics ``([A B b], Q)`` and the
   emission ``([C D d], R)`` from their matrix-normal-inverse-Wishart posteriors
   (`statseq.inference.switching_gibbs.sample_regression`), the regressions
   ``x_t ~ (x_{t-1}, u_t, 1)`` over ``t >= 1`` with ``z_t = k`` and
   ``y_t ~ (x_t, u_t, 1)`` over ``t`` with ``z_t = k``.

The initial laws ``m_k, V_k`` stay at their starting values.

Missing observations: ``x | z`` and ``z | x`` marginalize them exactly (the Kalman code
and the masked densities); for the parameter block a step with nothing observed drops out
of the emission regression, and the missing entries of a partly observed step are drawn
from ``p(y_mis | y_obs, x_t, z_t)`` first (data augmentation, `impute_missing`), so every
block stays an exact conditional draw.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.recurrence import vmap_or_one
from statseq.inference import switching_gibbs as gibbs
from statseq.inference import switching_kalman as kim


class SLDSGibbsPrior(NamedTuple):
    """Conjugate priors of `SwitchingLDS.fit_gibbs` (``None``: the default).

    Attributes:
        concentration: ``alpha`` of the Dirichlet priors on ``pi`` and each row of ``P``
            (default 1).
        dynamics_precision: precision of the zero-mean matrix-normal prior on ``[A B b]``
            (default 0.01).
        dynamics_df: inverse-Wishart degrees of freedom of ``Q`` (default ``n + 2``).
        dynamics_scale: ``(n, n)`` inverse-Wishart scale of ``Q`` (default ``0.1 I``).
        emission_precision: the same for ``[C D d]`` (default 0.01).
        emission_df: for ``R`` (default ``D + 2``).
        emission_scale: ``(D, D)`` for ``R`` (default ``0.1 I``).

    Examples:
        >>> from statseq.models.switching.slds import SLDSGibbsPrior
        >>> SLDSGibbsPrior(concentration=2.0).dynamics_df is None
        True
    """

    concentration: Any = None
    dynamics_precision: Any = None
    dynamics_df: Any = None
    dynamics_scale: Any = None
    emission_precision: Any = None
    emission_df: Any = None
    emission_scale: Any = None


def resolved_prior(model, prior: SLDSGibbsPrior | None, dtype) -> SLDSGibbsPrior:
    """Defaults filled in, as arrays of ``dtype``."""
    prior = prior or SLDSGibbsPrior()
    n, d = model.state_dim, model.dim
    defaults = SLDSGibbsPrior(1.0, 0.01, n + 2.0, 0.1 * jnp.eye(n), 0.01, d + 2.0,
                              0.1 * jnp.eye(d))
    return SLDSGibbsPrior(*(jnp.asarray(default if value is None else value, dtype)
                            for value, default in zip(prior, defaults, strict=True)))


def _sweep(model, params, prior, y, mask, inputs, regimes, key):
    """One sweep over a flat batch ``y (N, T, D)``: ``(params, regimes, states)``."""
    arrays = model.to_arrays(params)
    num = model.num_regimes
    k_lat, k_gam, k_dyn, k_emi = jax.random.split(key, 4)
    keys = jax.random.split(k_lat, y.shape[0])
    regimes, states = vmap_or_one(
        lambda y_s, m_s, u_s, z_s, k: gibbs.gibbs_sweep(arrays, y_s, m_s, u_s, z_s, k))(
        y, mask, inputs, regimes, keys)
    onehot = jax.nn.one_hot(regimes, num, dtype=states.dtype)  # (N, T, K)
    alpha = prior.concentration
    counts = jnp.einsum("ntj,ntk->jk", onehot[:, :-1], onehot[:, 1:])
    ones = jnp.ones(states.shape[:2] + (1,), states.dtype)
    x_dyn = jnp.concatenate([states[:, :-1], inputs[:, 1:], ones[:, 1:]], -1)
    x_dyn = x_dyn.reshape(-1, x_dyn.shape[-1])
    t_dyn = states[:, 1:].reshape(-1, states.shape[-1])
    w_dyn = onehot[:, 1:].reshape(-1, num)
    x_emi = jnp.concatenate([states, inputs, ones], -1).reshape(-1, x_dyn.shape[-1])
    k_imp, k_emi = jax.random.split(k_emi)
    t_emi = impute_missing(arrays, y, mask, inputs, regimes, states, k_imp)
    t_emi = t_emi.reshape(-1, y.shape[-1])
    # steps with nothing observed drop out of the emission regression (their y_t is
    # latent with the emission law itself: integrating it out removes the row exactly)
    observed = jnp.any(mask, axis=-1).astype(onehot.dtype)
    w_emi = (onehot * observed[..., None]).reshape(-1, num)
    n, m, d = model.state_dim, model.input_dim, model.dim

    def rows(w, switching):
        return w.T if switching else jnp.ones((1, w.shape[0]), w.dtype)

    r_dyn, r_emi = rows(w_dyn, model.switching_dynamics), rows(w_emi, model.switching_emission)
    # every Gamma draw of the sweep in one call (one rejection sampler to compile): the
    # Dirichlet draws of pi and the rows of P, the Bartlett diagonals of Q and R
    shapes = [alpha + jnp.sum(onehot[:, 0], axis=0), (alpha + counts).ravel(),
              jax.vmap(lambda c: gibbs.inverse_wishart_shapes(prior.dynamics_df + c, n))(
                  r_dyn.sum(1)).ravel(),
              jax.vmap(lambda c: gibbs.inverse_wishart_shapes(prior.emission_df + c, d))(
                  r_emi.sum(1)).ravel()]
    sizes = [a.shape[0] for a in shapes]
    draws = jax.random.gamma(k_gam, jnp.concatenate(shapes))
    g_pi, g_p, g_q, g_r = jnp.split(draws, np.cumsum(sizes)[:-1])
    pi = g_pi / jnp.sum(g_pi)
    g_p = g_p.reshape(num, num)
    trans = g_p / jnp.sum(g_p, axis=1, keepdims=True)

    def block(key, x, t, w_rows, gam, precision, df, scale, switching):
        keys = jax.random.split(key, w_rows.shape[0])
        out = jax.vmap(lambda k, wk, g: gibbs.sample_regression(
            k, x, t, wk, precision, df, scale, g))(keys, w_rows,
                                                    gam.reshape(w_rows.shape[0], -1))
        return out if switching else jax.tree.map(lambda a: a[0], out)

    w_d, q = block(k_dyn, x_dyn, t_dyn, r_dyn, g_q, prior.dynamics_precision,
                   prior.dynamics_df, prior.dynamics_scale, model.switching_dynamics)
    w_e, r = block(k_emi, x_emi, t_emi, r_emi, g_r, prior.emission_precision,
                   prior.emission_df, prior.emission_scale, model.switching_emission)
    new = params._replace(
        initial_probs=pi, transitions=trans,
        dynamics_weights=w_d[..., :n], dynamics_input_weights=w_d[..., n:n + m],
        dynamics_bias=w_d[..., n + m], dynamics_cov=q,
        emission_weights=w_e[..., :n], emission_input_weights=w_e[..., n:n + m],
        emission_bias=w_e[..., n + m], emission_cov=r)
    return new, regimes, states


def impute_missing(arrays, y, mask, inputs, regimes, states, key):
    """``y (N, T, D)`` with its missing entries drawn from ``p(y_mis | y_obs, x_t, z_t)``
    (exact data augmentation: the conjugate emission update then sees complete rows).
    Observed entries are returned unchanged; steps with nothing observed get a draw too
    (the sweep leaves those rows out)."""
    reg = arrays.regimes
    dtype = states.dtype
    eps = jax.random.normal(key, y.shape, dtype)

    def one(y_t, m_t, u_t, z_t, x_t, e_t):
        mf = m_t.astype(dtype)
        miss = 1.0 - mf
        rcov = reg.emission_cov[z_t]
        mean = (reg.emission_weights[z_t] @ x_t + reg.emission_input_weights[z_t] @ u_t
                + reg.emission_bias[z_t])
        r_oo = rcov * (mf[:, None] * mf[None, :]) + jnp.diag(miss)
        r_mo = rcov * (miss[:, None] * mf[None, :])
        k_r = jnp.linalg.solve(r_oo, r_mo.T).T  # R_mo R_oo^{-1} (zero outside m x o)
        cond_mean = mean + k_r @ (mf * (y_t - mean))
        cond_cov = (miss[:, None] * miss[None, :]) * (rcov - k_r @ rcov)
        chol = jnp.linalg.cholesky(0.5 * (cond_cov + cond_cov.T) + jnp.diag(mf))
        draw = cond_mean + (chol @ e_t) * miss
        return jnp.where(m_t, y_t, draw)

    flat = vmap_or_one(jax.vmap(one))  # sequences, then steps
    return flat(jnp.where(mask, y, 0.0), mask, inputs, regimes, states, eps)


@partial(jax.jit, static_argnames=("model", "num_samples", "num_burnin"))
def run_gibbs(model, params, prior, y, mask, inputs, key, *, num_samples, num_burnin):
    """``num_burnin`` discarded sweeps, then ``num_samples`` kept ones, from the most
    probable regimes of Kim's smoother at ``params`` (one program)."""
    arrays = model.to_arrays(params)
    regimes = vmap_or_one(lambda y_s, m_s, u_s: jnp.argmax(
        kim.kim_smoother(arrays, y_s, m_s, u_s).smoothed_probs, axis=-1))(y, mask, inputs)
    regimes = regimes.astype(jnp.int32)

    def sweep(carry, k):
        p, z = carry
        p, z, x = _sweep(model, p, prior, y, mask, inputs, z, k)
        return (p, z), (p, z, x)

    # one scan over every sweep (a second scan for the burn-in would compile the sweep
    # twice: its compile time dominates), the burn-in cut off afterwards
    keys = jax.random.split(key, num_burnin + num_samples)
    _, out = jax.lax.scan(sweep, (params, regimes), keys)
    return jax.tree.map(lambda a: a[num_burnin:], out)
