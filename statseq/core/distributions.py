"""Log-densities of one-step predictives with missing-data masks.

``masked_log_prob(dist, y, mask)`` is the log-density of the *observed* entries of ``y``
under a numpyro distribution, with the unobserved entries marginalized out:

* scalar events: the log-density where observed, 0 where masked;
* ``Independent`` events (diagonal vectors): the sum over observed entries;
* ``MultivariateNormal``: the marginal Gaussian of the observed block (exact);
* any other vector event: all-or-nothing (models whose predictive is such a distribution
  declare ``supports_partial_mask = False`` and partial masks are rejected eagerly).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from statseq.inference.gaussian import masked_mvn_log_prob


def _placeholder(d, y):
    """A value inside the support to stand in for masked entries (keeps gradients finite)."""
    try:
        mean = jax.lax.stop_gradient(d.mean)
        mean = jnp.broadcast_to(mean, y.shape).astype(y.dtype)
    except (NotImplementedError, TypeError, ValueError):
        return jnp.zeros_like(y)
    if jnp.issubdtype(y.dtype, jnp.integer):
        return jnp.zeros_like(y)
    return jnp.where(jnp.isfinite(mean), mean, 0.0)


def masked_log_prob(d, y, mask):
    """Log-density of the observed entries of one observation ``y`` under ``d``.

    Args:
        d: numpyro distribution with ``batch_shape == ()``.
        y: one observation, shape ``d.event_shape``.
        mask: booleans of shape ``d.event_shape`` (``True`` = observed).

    Returns:
        A scalar.
    """
    mask = jnp.broadcast_to(jnp.asarray(mask, bool), jnp.shape(y))
    if isinstance(d, dist.MultivariateNormal):
        return masked_mvn_log_prob(y, d.loc, d.covariance_matrix, mask)
    y_safe = jnp.where(mask, y, _placeholder(d, y))
    if d.event_shape == ():
        return jnp.where(mask, d.log_prob(y_safe), 0.0)
    if isinstance(d, dist.Independent):
        base_lp = jnp.broadcast_to(d.base_dist.log_prob(y_safe), mask.shape)
        return jnp.sum(jnp.where(mask, base_lp, 0.0))
    observed = jnp.all(mask)
    return jnp.where(observed, d.log_prob(y_safe), 0.0)
