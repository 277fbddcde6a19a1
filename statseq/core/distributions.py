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
from jax.typing import ArrayLike

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


# ---- cumulative distribution functions of scalar predictives --------------------------
def scalar_cdf(d, x):
    """``P(Y <= x)`` for a predictive ``d`` of a scalar (or length-1 vector) observation.

    Handles the predictives statseq models return: numpyro distributions with a ``cdf``,
    categoricals and Bernoullis (``cdf`` by summing the probabilities up to ``x``), a
    one-dimensional ``MultivariateNormal`` or ``Independent`` (reduced to the scalar
    case), and finite mixtures (the weighted sum of the components' cdfs). ``x`` is
    broadcast against ``d.batch_shape`` (without the length-1 event axis).
    """
    if isinstance(d, dist.MixtureSameFamily):
        comp = scalar_cdf(d.component_distribution, jnp.expand_dims(x, -1))
        return jnp.sum(d.mixing_distribution.probs * comp, axis=-1)
    if isinstance(d, dist.ExpandedDistribution):
        out = scalar_cdf(d.base_dist, x)
        return jnp.broadcast_to(out, jnp.broadcast_shapes(jnp.shape(out), d.batch_shape))
    if d.event_shape == (1,):
        if isinstance(d, dist.MultivariateNormal):
            sd = jnp.sqrt(d.covariance_matrix[..., 0, 0])
            return jax.scipy.special.ndtr((x - d.loc[..., 0]) / sd)
        if isinstance(d, dist.Independent):
            return scalar_cdf(d.base_dist, jnp.expand_dims(x, -1))[..., 0]
    elif d.event_shape == ():
        if isinstance(d, (dist.CategoricalProbs, dist.CategoricalLogits)):
            probs = d.probs
            k = jnp.arange(probs.shape[-1], dtype=probs.dtype)
            below = k <= jnp.floor(jnp.expand_dims(x, -1))
            return jnp.clip(jnp.sum(jnp.where(below, probs, 0.0), axis=-1), 0.0, 1.0)
        if isinstance(d, (dist.BernoulliProbs, dist.BernoulliLogits)):
            p = d.probs
            return jnp.where(x < 0, 0.0, jnp.where(x < 1, 1.0 - p, 1.0))
        low = getattr(d.support, "lower_bound", None)
        if low is not None:  # numpyro's cdfs are not defined below the support
            return jnp.where(x < low, 0.0, d.cdf(jnp.maximum(x, low)))
        return d.cdf(x)
    raise ValueError(f"a cdf needs a scalar observation; this {type(d).__name__} has event "
                     f"shape {d.event_shape}")


def marginal_cdf(d: dist.Distribution, x: ArrayLike) -> jax.Array:
    """Per-coordinate marginal cdfs ``P(Y_j <= x_j)``, ``j = 1..D``, of a vector predictive.

    ``d`` has event shape ``(D,)``; the result has ``d``'s batch shape plus ``(D,)``. Each
    entry is the cdf of one coordinate's marginal law (the other coordinates integrated
    out):

    * ``Independent`` of a scalar family (Poisson, Bernoulli, Normal, ...): the scalar
      cdf of each coordinate (`scalar_cdf`);
    * ``MultivariateNormal``: ``Phi((x_j - mu_j) / sqrt(Sigma_jj))``;
    * a finite mixture ``sum_k w_k p_k(y)`` (an HMM's one-step predictive): the mixture of
      the components' marginals, ``F_j(x_j) = sum_k w_k F_kj(x_j)``;
    * a distribution with a ``marginal_cdf(value)`` method: that method.

    Args:
        d: a numpyro distribution with event shape ``(D,)``.
        x: values, shape broadcastable to ``d.batch_shape + (D,)``.

    Returns:
        ``batch_shape + (D,)`` probabilities.

    Raises:
        ValueError: when ``d`` has no per-coordinate marginal cdf (an event shape other
            than ``(D,)``, or a family none of the cases above covers, e.g. a multinomial).

    Examples:
        >>> import jax.numpy as jnp, numpyro.distributions as dist
        >>> d = dist.Independent(dist.Poisson(jnp.array([1.0, 4.0])), 1)
        >>> [round(float(v), 4) for v in marginal_cdf(d, jnp.array([0.0, 4.0]))]
        [0.3679, 0.6288]
    """
    if hasattr(d, "marginal_cdf"):
        return d.marginal_cdf(x)
    if len(d.event_shape) != 1:
        raise ValueError(f"a marginal cdf needs a vector observation (event shape (D,)); "
                         f"this {type(d).__name__} has event shape {d.event_shape}")
    if isinstance(d, dist.MixtureSameFamily):
        comp = marginal_cdf(d.component_distribution, jnp.expand_dims(x, -2))
        return jnp.sum(d.mixing_distribution.probs[..., None] * comp, axis=-2)
    if isinstance(d, dist.ExpandedDistribution):
        out = marginal_cdf(d.base_dist, x)
        return jnp.broadcast_to(out, jnp.broadcast_shapes(jnp.shape(out),
                                                          d.batch_shape + d.event_shape))
    if isinstance(d, dist.MultivariateNormal):
        sd = jnp.sqrt(jnp.diagonal(d.covariance_matrix, axis1=-2, axis2=-1))
        return jax.scipy.special.ndtr((x - d.loc) / sd)
    if isinstance(d, dist.Independent) and d.reinterpreted_batch_ndims == 1:
        base = d.base_dist
        try:
            return scalar_cdf(base, jnp.broadcast_to(x, jnp.broadcast_shapes(
                jnp.shape(x), base.batch_shape)))
        except (NotImplementedError, ValueError) as err:
            raise ValueError(f"no marginal cdf: the coordinates' {type(base).__name__} "
                             "has no cdf") from err
    raise ValueError(f"no marginal cdf for a {type(d).__name__} predictive (supported: "
                     "Independent scalar families, MultivariateNormal, finite mixtures of "
                     "these, or a distribution with a marginal_cdf method)")

def _is_discrete(d) -> bool:
    support = d.support
    while isinstance(support, dist.constraints._IndependentConstraint):
        support = support.base_constraint
    return bool(support.is_discrete)


def _moments_bracket(d):
    """A starting bracket ``mean -/+ 10 sd`` (over the components of a mixture)."""
    base = d.component_distribution if isinstance(d, dist.MixtureSameFamily) else d
    mean, var = base.mean, base.variance
    if base.event_shape == (1,):
        mean, var = mean[..., 0], var[..., 0]
    lo, hi = mean - 10.0 * jnp.sqrt(var), mean + 10.0 * jnp.sqrt(var)
    if isinstance(d, dist.MixtureSameFamily):
        lo, hi = jnp.min(lo, axis=-1), jnp.max(hi, axis=-1)
    return lo, hi


def scalar_icdf(d, q, *, num_bisections: int = 200):
    """Quantile ``inf{x : P(Y <= x) >= q}`` of a scalar predictive by bisection on `scalar_cdf`.

    A bracket starts at the (component) means plus or minus ten standard deviations and
    doubles its width until it holds ``q``; then ``num_bisections`` halvings (to the
    resolution of the dtype for continuous laws; on the integers for discrete ones, where
    the answer is exact).

    Args:
        d: a predictive that `scalar_cdf` handles.
        q: probabilities in ``(0, 1)``, broadcast against ``d.batch_shape``.
        num_bisections: the number of halvings.

    Returns:
        The quantiles, shape ``broadcast(q, batch_shape)``.
    """
    q = jnp.asarray(q)
    discrete = _is_discrete(d)
    lo, hi = _moments_bracket(d)
    shape = jnp.broadcast_shapes(jnp.shape(q), jnp.shape(lo))
    lo, hi = jnp.broadcast_to(lo, shape), jnp.broadcast_to(hi, shape)
    if discrete:
        lo, hi = jnp.floor(lo) - 1.0, jnp.ceil(hi)

    def widen(state):
        lo, hi, i = state
        width = hi - lo + 1.0
        lo = jnp.where(scalar_cdf(d, lo) >= q, lo - width, lo)
        hi = jnp.where(scalar_cdf(d, hi) < q, hi + width, hi)
        return lo, hi, i + 1

    def unbracketed(state):
        lo, hi, i = state
        bad = (scalar_cdf(d, lo) >= q) | (scalar_cdf(d, hi) < q)
        return jnp.any(bad) & (i < 64)

    lo, hi, _ = jax.lax.while_loop(unbracketed, widen, (lo, hi, 0))

    def halve(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        if discrete:
            mid = jnp.floor(mid)
        below = scalar_cdf(d, mid) < q
        return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

    lo, hi = jax.lax.fori_loop(0, num_bisections, halve, (lo, hi))
    return hi


class FiniteMixture(dist.MixtureSameFamily):
    """``sum_k w_k p_k(y)``: numpyro's ``MixtureSameFamily`` with a ``cdf`` and ``icdf`` for
    every scalar component family (Poisson, Gaussian, Bernoulli, categorical, ...).

        F(y) = sum_k w_k F_k(y),    F^{-1}(q) by bisection on F (see `scalar_icdf`).
    """

    def cdf(self, value):
        """``P(Y <= value) = sum_k w_k F_k(value)`` (``value`` without a length-1 event axis)."""
        return scalar_cdf(self, value)

    def icdf(self, q):
        """The ``q`` quantile, by bisection on `cdf`."""
        return scalar_icdf(self, q)


class CategoricalWithCdf(dist.CategoricalProbs):
    """A categorical law on ``0, ..., C - 1`` with ``cdf`` and (exact) ``icdf``."""

    def cdf(self, value):
        """``P(Y <= value) = sum_{c <= value} p_c``."""
        return scalar_cdf(dist.CategoricalProbs(self.probs), value)

    def icdf(self, q):
        """The smallest class ``c`` with ``P(Y <= c) >= q``."""
        cum = jnp.cumsum(self.probs, axis=-1)
        q = jnp.expand_dims(jnp.asarray(q), -1)
        return jnp.minimum(jnp.sum(cum < q, axis=-1), self.probs.shape[-1] - 1)
