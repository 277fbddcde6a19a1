"""Rao-Blackwellized particle filter for switching linear dynamical systems.

For the model of `statseq.inference.switching_kalman` (a Markov chain ``z_t`` choosing the
matrices of a linear Gaussian state space model), the state ``x_t`` given a regime path
``z_{0:t}`` is Gaussian and its Kalman filter is exact. A Rao-Blackwellized particle
filter (Doucet, de Freitas, Murphy and Russell 2000; Chen and Liu 2000) samples regime
paths only: particle ``i`` carries ``z_{t-1}^i`` and the Kalman belief
``N(m^i, V^i)`` of ``x_{t-1}`` given its path. Each step runs, per particle, the ``K``
Kalman updates of `statseq.inference.kalman` (one per next regime ``j``), giving
``f_ij = p(y_t | z_t = j, path_i, y_{<t})``, and

- ``proposal="optimal"`` (the default): draws ``z_t^i`` with probability proportional to
  ``P[z_{t-1}^i, j] f_ij`` and weights the particle by ``sum_j P[z_{t-1}^i, j] f_ij``;
- ``proposal="prior"`` (the bootstrap filter on regimes): draws ``z_t^i ~ P[z_{t-1}^i]``
  and weights by ``f_{i z_t^i}``.

Input-driven transitions (`statseq.inference.switching_kalman.transition_log_row`) are
exact here; recurrent ones are evaluated at each particle's filtered mean of ``x_{t-1}``
(the particle holds a Gaussian belief of the state, not a draw of it), an approximation:
the estimate is then unbiased for the likelihood of that plug-in model, which equals the
exact one when ``R = 0``.

The likelihood estimate is the product over steps of the weighted mean incremental weight,

    p^(y_{0:T-1}) = prod_t sum_i W_{t-1}^i w_t^i,

which is **unbiased** for ``p(y_{0:T-1})`` (Del Moral 2004) under multinomial, stratified
or systematic resampling, applied whenever the effective sample size falls below
``ess_threshold * N`` (``1.0``: every step). Its logarithm is biased downwards (by Jensen).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.recurrence import pairwise_sum
from statseq.inference import kalman
from statseq.inference.switching_kalman import SwitchingArrays, regime, transition_log_row

RESAMPLING = ("systematic", "stratified", "multinomial")
PROPOSALS = ("optimal", "prior")


class RBPFResult(NamedTuple):
    """Output of `rao_blackwellized_particle_filter`.

    Attributes:
        marginal_log_lik: scalar ``log p^(y_{0:T-1})``, the log of an unbiased estimate.
        log_probs: ``(T,)`` logs of the per-step factors ``sum_i W_{t-1}^i w_t^i``.
        filtered_probs: ``(T, K)`` particle estimates of ``p(z_t | y_{<=t})``.
        state_means: ``(T, n)`` estimates of ``E[x_t | y_{<=t}]``.
        ess: ``(T,)`` effective sample sizes after weighting (before resampling).
        resampled: ``(T,)`` booleans, whether the particles were resampled after step ``t``.
    """

    marginal_log_lik: Any
    log_probs: Any
    filtered_probs: Any
    state_means: Any
    ess: Any
    resampled: Any


def resample(key, weights, method: str = "systematic"):
    """Ancestor indices ``(N,)`` drawn from normalized ``weights`` ``(N,)``.

    ``"multinomial"``: ``N`` independent draws; ``"stratified"``: one uniform in each of
    the ``N`` strata of ``[0, 1)``; ``"systematic"``: one uniform shifted over the strata.
    Each index ``i`` is chosen ``N w_i`` times in expectation.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.particle import resample
        >>> idx = resample(jax.random.key(0), jnp.array([0.0, 1.0, 0.0, 0.0]))
        >>> [int(i) for i in idx]
        [1, 1, 1, 1]
    """
    if method not in RESAMPLING:
        raise ValueError(f"resampling must be one of {RESAMPLING}, got {method!r}")
    n = weights.shape[0]
    cum = jnp.cumsum(weights)
    cum = cum / cum[-1]
    if method == "multinomial":
        u = jax.random.uniform(key, (n,), weights.dtype)
    elif method == "stratified":
        u = (jnp.arange(n, dtype=weights.dtype) + jax.random.uniform(key, (n,), weights.dtype)) / n
    else:
        u = (jnp.arange(n, dtype=weights.dtype) + jax.random.uniform(key, (), weights.dtype)) / n
    return jnp.clip(jnp.searchsorted(cum, u, side="right"), 0, n - 1)


class _Particles(NamedTuple):
    regimes: Any  # (N,) int32, z_{t-1}
    means: Any  # (N, n)
    covs: Any  # (N, n, n)
    log_weights: Any  # (N,) normalized


def rao_blackwellized_particle_filter(
        arrays: SwitchingArrays, y: jax.Array, mask: jax.Array, inputs: jax.Array, *,
        key: jax.Array, num_particles: int,
        resampling: str = "systematic", ess_threshold: float = 1.0,
        proposal: str = "optimal") -> RBPFResult:
    """Filter one sequence with ``num_particles`` regime paths and exact Kalman beliefs.

    Args:
        arrays: the model (`statseq.inference.switching_kalman.SwitchingArrays`).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans (``True`` = observed).
        inputs: ``(T, m)`` inputs (``m`` may be 0).
        key: a ``jax.random`` key (keyword-only, required).
        num_particles: ``N >= 1`` (static).
        resampling: ``"systematic"``, ``"stratified"`` or ``"multinomial"``.
        ess_threshold: resample after a step when ``ESS < ess_threshold * N`` (``1.0``:
            always; ``0.0``: never, sequential importance sampling).
        proposal: ``"optimal"`` or ``"prior"`` (see the module docstring).

    Returns:
        An `RBPFResult`; ``exp(marginal_log_lik)`` is an unbiased estimate of
        ``p(y_{0:T-1})``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference import kalman
        >>> from statseq.inference.switching_kalman import SwitchingArrays
        >>> from statseq.inference.particle import rao_blackwellized_particle_filter
        >>> one = lambda v: jnp.full((2, 1, 1), v)
        >>> regimes = kalman.GaussianSSMArrays(
        ...     jnp.zeros((2, 1)), one(1.0), jnp.array([[[0.9]], [[-0.5]]]),
        ...     jnp.zeros((2, 1, 0)), jnp.zeros((2, 1)), one(0.5), one(1.0),
        ...     jnp.zeros((2, 1, 0)), jnp.zeros((2, 1)), one(0.1), jnp.zeros((2, 1, 0)))
        >>> arrays = SwitchingArrays(jnp.array([0.5, 0.5]),
        ...                          jnp.array([[0.9, 0.1], [0.1, 0.9]]), regimes)
        >>> y = jnp.array([[0.3], [0.5], [-0.2]])
        >>> res = rao_blackwellized_particle_filter(
        ...     arrays, y, jnp.ones_like(y, bool), jnp.zeros((3, 0)),
        ...     key=jax.random.key(0), num_particles=100)
        >>> res.filtered_probs.shape, bool(jnp.isfinite(res.marginal_log_lik))
        ((3, 2), True)
    """
    if isinstance(num_particles, bool) or not isinstance(num_particles, int | np.integer) \
            or num_particles < 1:
        raise ValueError(f"num_particles must be a positive int, got {num_particles!r}")
    if resampling not in RESAMPLING:
        raise ValueError(f"resampling must be one of {RESAMPLING}, got {resampling!r}")
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
    if not 0.0 <= float(ess_threshold) <= 1.0:
        raise ValueError(f"ess_threshold must be in [0, 1], got {ess_threshold!r}")
    n_part = int(num_particles)
    reg = arrays.regimes
    num = arrays.initial_probs.shape[0]
    dtype = reg.initial_cov.dtype
    log_init = jnp.log(arrays.initial_probs.astype(dtype))
    idx = jnp.arange(num)

    def updates(mean, cov, prev, first, y_t, m_t, u_t):
        """Per particle: log prior of each next regime, its log-likelihood and moments."""

        def one(j):
            arr = regime(arrays, j)
            pm, pv = kalman.predict_state(arr, mean, cov, u_t)
            pm = jnp.where(first, reg.initial_mean[j], pm)
            pv = jnp.where(first, reg.initial_cov[j], pv)
            inn = kalman.innovation(arr, pm, pv, y_t, m_t, u_t)
            return (inn.log_prob, pm + kalman._mm(inn.w.T, inn.z),
                    kalman.joseph_update(pv, inn, arr.emission_cov))

        ll, fm, fv = jax.vmap(one)(idx)
        log_prior = jnp.where(first, log_init,
                              transition_log_row(arrays, prev, u_t, mean).astype(dtype))
        return log_prior, ll, fm, fv

    def step(state, xs):
        parts, t = state
        y_t, m_t, u_t, k = xs
        k_draw, k_res = jax.random.split(k)
        first = t == 0
        log_prior, ll, fm, fv = jax.vmap(
            lambda m, v, z: updates(m, v, z, first, y_t, m_t, u_t))(
            parts.means, parts.covs, parts.regimes)
        keys = jax.random.split(k_draw, n_part)
        if proposal == "optimal":
            logits = log_prior + ll  # (N, K)
            z = jax.vmap(jax.random.categorical)(keys, logits)
            incr = jax.scipy.special.logsumexp(logits, axis=1)
        else:
            z = jax.vmap(jax.random.categorical)(keys, log_prior)
            incr = jnp.take_along_axis(ll, z[:, None], axis=1)[:, 0]
        pick = jnp.arange(n_part)
        means, covs = fm[pick, z], fv[pick, z]
        joint = parts.log_weights + incr
        log_prob = jax.scipy.special.logsumexp(joint)
        log_w = joint - log_prob
        w = jnp.exp(log_w)
        ess = 1.0 / jnp.sum(w**2)
        probs = jnp.sum(w[:, None] * (z[:, None] == idx[None, :]), axis=0)
        state_mean = jnp.sum(w[:, None] * means, axis=0)
        do = ess < ess_threshold * n_part
        anc = jnp.where(do, resample(k_res, w, resampling), pick)
        log_w = jnp.where(do, jnp.full_like(log_w, -math.log(n_part)), log_w)
        new = _Particles(z[anc].astype(jnp.int32), means[anc], covs[anc], log_w)
        return (new, t + 1), (log_prob, probs, state_mean, ess, do)

    n_dim = reg.initial_mean.shape[-1]
    start = _Particles(jnp.zeros((n_part,), jnp.int32), jnp.zeros((n_part, n_dim), dtype),
                       jnp.zeros((n_part, n_dim, n_dim), dtype),
                       jnp.full((n_part,), -math.log(n_part), dtype))
    keys = jax.random.split(key, y.shape[0])
    _, (lp, probs, means, ess, did) = jax.lax.scan(
        step, (start, jnp.zeros((), jnp.int32)), (y, mask, inputs, keys))
    return RBPFResult(pairwise_sum(lp), lp, probs, means, ess, did)
