"""The marginal likelihood of data with gaps, for models that do not marginalize masked steps.

A neural network reads a missing value as 0 plus an observed-indicator: its ``log_prob``
with a mask is the likelihood of a *model of data with gaps* (the network conditions on
which values were seen), not the marginal likelihood of the observed values under the
model's own distribution of complete sequences,

    p(y_obs) = int prod_t p(y_t | y_{<t}) dy_miss.

`estimate_log_prob` estimates the latter by sequential importance sampling with the
model's own one-step predictive as the proposal for the missing values (a bootstrap
particle filter, resampling when the effective sample size drops below half), which is
unbiased for ``p(y_obs)``; models whose masked steps are exact marginalization
(``model.marginalizes_masked_steps``) get their exact ``log_prob``.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.distributions import masked_log_prob
from statseq.core.params import validate_params
from statseq.core.recurrence import log_prob as _exact_log_prob
from statseq.core.recurrence import vmap_or_one
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.evaluation._origins import DEFAULT_MC_SEED, _log_mean

#: Default particles per filter and independent filters of `estimate_log_prob`.
DEFAULT_NUM_PARTICLES = 1024
DEFAULT_NUM_REPLICATES = 16


def _systematic(key, log_w):
    n = log_w.shape[0]
    w = jnp.exp(log_w - jax.scipy.special.logsumexp(log_w))
    u = (jax.random.uniform(key) + jnp.arange(n)) / n
    return jnp.clip(jnp.searchsorted(jnp.cumsum(w), u), 0, n - 1)


@partial(jax.jit, static_argnames=("model", "num_particles"))
def _particle_log_z(model, params, y, mask, inputs, key, *, num_particles):
    """One bootstrap particle filter over one series: the log of its estimate of p(y_obs)."""
    n = num_particles
    full = jnp.ones(tuple(model.event_shape), bool)
    skip = int(model.num_conditioned_steps)
    carry0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape),
                          model.initial_carry(params))

    def step(state, xs):
        carry, log_w, log_z = state
        t, y_t, m_t, u_t, k = xs
        k_draw, k_res = jax.random.split(k)

        def one(c, kk):
            d = model.predict(params, c, u_t)
            lp = jnp.where(t < skip, 0.0, masked_log_prob(d, y_t, m_t))
            fill = jnp.where(m_t, y_t, d.sample(kk).astype(y_t.dtype))  # missing: a draw
            return lp, model.update(params, c, fill, full, u_t)

        lp, carry = jax.vmap(one)(carry, jax.random.split(k_draw, n))
        log_w = log_w + lp.astype(log_w.dtype)
        total = jax.scipy.special.logsumexp(log_w)
        ess = jnp.exp(2 * total - jax.scipy.special.logsumexp(2 * log_w))
        resample = ess < n / 2
        idx = jnp.where(resample, _systematic(k_res, log_w), jnp.arange(n))
        carry = jax.tree.map(lambda a: a[idx], carry)
        log_z = jnp.where(resample, log_z + total - jnp.log(n), log_z)
        log_w = jnp.where(resample, jnp.zeros_like(log_w), log_w)
        return (carry, log_w, log_z), None

    num_t = y.shape[0]
    xs = (jnp.arange(num_t), y, mask, inputs, jax.random.split(key, num_t))
    dtype = float_dtype()
    zero = jnp.zeros((), dtype)
    (_, log_w, log_z), _ = jax.lax.scan(step, (carry0, jnp.zeros(n, dtype), zero), xs)
    return log_z + jax.scipy.special.logsumexp(log_w) - jnp.log(n)


@partial(jax.jit, static_argnames=("model", "num_particles", "num_replicates"))
def _estimate(model, params, y, mask, inputs, key, *, num_particles, num_replicates):
    """``(log p_hat (B,), se (B,))`` for series ``(B, T, ...)``, replicates vmapped."""

    def series(y_b, m_b, u_b, k_b):
        keys = jax.random.split(k_b, num_replicates)
        log_z = jax.vmap(lambda kk: _particle_log_z(model, params, y_b, m_b, u_b, kk,
                                                    num_particles=num_particles))(keys)
        return _log_mean(log_z)

    keys = jax.random.split(key, y.shape[0])
    return vmap_or_one(series)(y, mask, inputs, keys)


def estimate_log_prob(model, params, y, mask=None, *, inputs=None, key=None,
                      num_particles: int | None = None, num_replicates: int | None = None):
    """Marginal log-likelihood of the observed values of ``y``, with its standard error.

        log p(y_obs) = log int prod_t p(y_t | y_{<t}, u_{<=t}) dy_miss,

    the missing values integrated out under the model's own distribution of complete
    sequences. For a model that marginalizes masked steps exactly
    (``model.marginalizes_masked_steps``: HMMs, AR, linear Gaussian state space models) this
    is `statseq.log_prob` with standard error 0. A neural network instead reads a missing
    value as 0 plus an observed-indicator, so ``ss.log_prob(..., mask=mask)`` is the
    likelihood of a *model of data with gaps*; here the marginal is estimated by a
    bootstrap particle filter: ``num_particles`` particles carry the network state; at a
    missing entry each particle draws it from its own one-step predictive (the proposal),
    at an observed entry it is weighted by its predictive density (per entry for partially
    observed vectors: every neural head is independent across dimensions), and the
    particles are resampled (systematically) when the effective sample size drops below
    half. Each filter's product of mean weights is an unbiased estimate ``Z_r`` of
    ``p(y_obs)``; ``num_replicates`` independent filters give ``Z_bar = mean_r Z_r``
    (unbiased too), reported as ``log Z_bar``, with the standard error on the log scale by
    the delta method, ``sd_r(Z_r) / (sqrt(R) Z_bar)``. Fully observed data give the exact
    ``log_prob`` with SE 0.

    Args:
        model: a statseq model.
        params: its parameters.
        y: ``batch_shape + (num_timesteps,) + event_shape`` (array or pandas; ``NaN`` in
            pandas marks a gap).
        mask: optional booleans, per time step or per entry (``True`` = observed).
        inputs: covariates, when the model takes them.
        key: ``jax.random`` key of the estimate (default: the fixed key
            ``jax.random.key(0)``, so repeated calls agree).
        num_particles: particles per filter (default 1024).
        num_replicates: independent filters (default 16, at least 2).

    Returns:
        ``(log_prob, se)``: floats for one series, arrays of ``batch_shape`` otherwise.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.sin(np.arange(12.0))
        >>> mask = np.ones(12, bool); mask[5:7] = False        # a gap of two steps
        >>> model = ss.GRU(hidden_dim=3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> lp, se = ss.estimate_log_prob(model, params, y, mask, num_particles=200,
        ...                               num_replicates=4)
        >>> bool(np.isfinite(lp)), bool(0 < se < 0.05)
        (True, True)
    """
    validate_params(model, params)
    if key is not None:
        check_key(key)
    num_particles = check_positive_int(
        DEFAULT_NUM_PARTICLES if num_particles is None else num_particles, "num_particles")
    num_replicates = check_positive_int(
        DEFAULT_NUM_REPLICATES if num_replicates is None else num_replicates,
        "num_replicates", 2)
    data = prepare_data(model, y, mask, inputs)
    if model.marginalizes_masked_steps:
        lp = np.asarray(_exact_log_prob(model, params, y, mask=mask, inputs=inputs), float)
        se = np.zeros_like(lp)
    else:
        key = jax.random.key(DEFAULT_MC_SEED) if key is None else key
        lp, se = _estimate(model, params, data.y, data.mask, data.inputs, key,
                           num_particles=num_particles, num_replicates=num_replicates)
        lp = np.asarray(lp, float).reshape(data.batch_shape)
        se = np.asarray(se, float).reshape(data.batch_shape)
    if data.batch_shape == ():
        return float(lp), float(se)
    return lp, se
