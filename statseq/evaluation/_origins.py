"""One compiled program for forecasts from many origins of one series (backtests).

For origin ``o`` the filter runs over ``y_{0:o-1}`` (positions ``t >= o`` are never seen:
trailing-origin masking, so every origin shares the series' true start and its initial
law), and from the carry at ``o`` it

* scores each future value ``y_{o+k}`` (``k = 0, ..., h-1``) under the exact marginal
  predictive ``p(y_{o+k} | y_{0:o-1})``: the steps ``o, ..., o+k-1`` in between are
  conditioned on with an all-false mask, which the filter protocol requires to be exact
  marginalization (predict without update); models whose emissions read past
  observations instead give the closed-form mixture of their ``h_step_marginals`` (the
  AR-HMM and the Markov-switching AR: a Gaussian mixture over regime paths);
* draws sample paths by ancestral sampling, as `statseq.forecast` does.

Origins are a traced argument, so every set of origins of one count (and one set of array
shapes) reuses one compiled program; parameters may be one set for all origins or stacked
along a leading origin axis (refitting at each origin).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from statseq.core.distributions import masked_log_prob
from statseq.core.recurrence import _simulate
from statseq.inference.gaussian import masked_mvn_log_prob


@partial(jax.jit, static_argnames=("model", "horizon", "stacked", "per_dim", "sample"))
def origin_forecasts(model, params, y, mask, inputs, origins, keys, *, horizon, stacked,
                     per_dim, sample):
    """Marginal log-densities and sample paths from each origin.

    Args:
        model: the model (static).
        params: its parameters; with ``stacked`` a leading axis of ``len(origins)``.
        y: ``(T,) + event_shape`` cleaned values of one series (zeros where masked).
        mask: booleans of the shape of ``y``.
        inputs: ``(T, input_dim)``.
        origins: ``(m,)`` integers ``o`` with ``o + horizon <= T``.
        keys: ``(m, num_samples)`` keys (ignored unless ``sample``).
        horizon: forecast steps ``h``.
        stacked: whether ``params`` has a leading origin axis.
        per_dim: also score each emission dimension alone (its marginal density).
        sample: draw sample paths.

    Returns:
        ``(log_probs (m, h), per-dim log_probs (m, h, D) or None, samples (m, S, h, *event)
        or None)``; masked targets score ``NaN``.
    """
    event_shape = tuple(model.event_shape)
    dims = jnp.eye(int(y.shape[-1]), dtype=bool) if per_dim else None

    def one(p, o, k):
        def body(t, c):
            return model.update(p, c, y[t], mask[t], inputs[t])

        carry = jax.lax.fori_loop(0, o, body, model.initial_carry(p))
        ys = jax.lax.dynamic_slice_in_dim(y, o, horizon)
        ms = jax.lax.dynamic_slice_in_dim(mask, o, horizon)
        us = jax.lax.dynamic_slice_in_dim(inputs, o, horizon)

        def ahead(c, xs):
            y_t, m_t, u_t = xs
            # the predictive itself (not model.step, whose score may be a diffuse
            # likelihood term): an improper predictive scores NaN
            d = model.predict(p, c, u_t)
            lp = jnp.where(jnp.any(m_t), masked_log_prob(d, y_t, m_t), jnp.nan)
            lp_d = None
            if per_dim:
                lp_d = jax.vmap(lambda e: masked_log_prob(d, y_t, e))(dims)
                lp_d = jnp.where(m_t, lp_d, jnp.nan)
            unseen = jnp.zeros(event_shape, bool)
            return model.update(p, c, y_t, unseen, u_t), (lp, lp_d)

        if hasattr(model, "h_step_marginals"):  # closed-form marginals (batch (h,))
            lps, lps_d = _mixture_scores(model.h_step_marginals(p, carry, us), ys, ms,
                                         per_dim)
        else:
            _, (lps, lps_d) = jax.lax.scan(ahead, carry, (ys, ms, us))
        paths = None
        if sample:
            paths = jax.vmap(lambda kk: _simulate(model, p, carry, kk, us)[0])(k)
        return lps, lps_d, paths

    return jax.vmap(one, in_axes=(0 if stacked else None, 0, 0 if sample else None))(
        params, origins, keys
    )


def _mixture_scores(d, ys, ms, per_dim):
    """Log-densities of the observed entries of ``y_{T+k}`` under the ``k``-th marginal of
    a Gaussian mixture ``d`` with batch shape ``(h,)`` (``Normal`` or ``MultivariateNormal``
    components: the marginal of an observed block is the mixture of the components'
    marginals), NaN where nothing is observed; per dimension too when ``per_dim``. Other
    distributions score fully observed targets only (``d.log_prob``)."""
    comp = getattr(d, "component_distribution", None)
    if not isinstance(comp, (dist.Normal, dist.MultivariateNormal)):
        # another family: the density of fully observed targets only (NaN otherwise)
        full = jnp.reshape(ms, ms.shape[:1] + (-1,)).all(axis=-1)
        lps = jnp.where(full, d.log_prob(ys), jnp.nan)
        lps_d = jnp.full(ms.shape, jnp.nan, lps.dtype) if per_dim else None
        return lps, lps_d
    logw = jnp.log(d.mixing_distribution.probs)  # (h, C); -inf in padding slots
    if isinstance(comp, dist.Normal):
        loc, cov = comp.loc[..., None], (comp.scale**2)[..., None, None]
    else:
        loc, cov = comp.loc, comp.covariance_matrix
    ys = jnp.reshape(ys, loc.shape[:1] + loc.shape[-1:])
    ms = jnp.broadcast_to(jnp.reshape(ms, ms.shape[:1] + (-1,)), ys.shape)

    def score(y_k, m_k, lw, mu, c):
        lp = jax.vmap(lambda a, b: masked_mvn_log_prob(y_k, a, b, m_k))(mu, c)
        lp = jax.scipy.special.logsumexp(jnp.where(lw > -jnp.inf, lw + lp, -jnp.inf))
        return jnp.where(jnp.any(m_k), lp, jnp.nan)

    lps = jax.vmap(score)(ys, ms, logw, loc, cov)
    lps_d = None
    if per_dim:
        dims = jnp.eye(ys.shape[-1], dtype=bool)
        lps_d = jax.vmap(lambda e: jax.vmap(score)(ys, ms & e, logw, loc, cov),
                         out_axes=1)(dims)
    return lps, lps_d
