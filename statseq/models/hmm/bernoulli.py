"""Bernoulli HMM: ``y_t | z_t = k ~ prod_d Bernoulli(p_kd)`` for binary vectors."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int, float_dtype
from statseq.models.hmm.base import HMMBase
from statseq.models.hmm.gaussian import kmeans, seed_from_key
from statseq.models.hmm.poisson import _check_conjugate


class BernoulliEmissions(NamedTuple):
    """``probs``: ``(num_states, emission_dim)``, ``p(y_td = 1 | z_t = k)`` in ``[0, 1]``.

    Examples:
        >>> import jax.numpy as jnp, numpy as np, statseq as ss
        >>> from statseq.models.hmm import BernoulliEmissions
        >>> model = ss.BernoulliHMM(num_states=2, emission_dim=3)
        >>> probs = jnp.array([[0.1, 0.1, 0.2], [0.9, 0.8, 0.7]])
        >>> params = model.assemble_params(BernoulliEmissions(probs))
        >>> y = np.array([[0, 0, 1], [1, 1, 1], [1, 0, 1]])
        >>> ss.filter(model, params, y).log_probs.shape
        (3,)
    """

    probs: jax.Array


@register_model
@dataclasses.dataclass(frozen=True)
class BernoulliHMM(HMMBase):
    """Hidden Markov model with independent Bernoulli emissions.

        z_t | z_{t-1} ~ Categorical(A[z_{t-1}]),    y_td | z_t = k ~ Bernoulli(p_kd),

    with ``y_t`` in ``{0, 1}^D`` (event shape ``(D,)``; a scalar binary series is
    ``(T, 1)``). Entries are independent given the state, so a per-entry mask drops the
    missing entries' factors exactly. The conjugate prior is a ``Beta`` on the ``probs``
    leaf: ``HMMParams(None, None, BernoulliEmissions(numpyro.distributions.Beta(a, b)))``
    (``a, b >= 1`` for EM's MAP, ``p = (n_1 + a - 1) / (n + a + b - 2)``).

    Args:
        num_states: number of hidden states ``K``.
        emission_dim: ``D``, binary entries per step.
        initial: ``"free"`` or ``"stationary"``.
        input_dim: covariates driving the transitions (0 for a fixed matrix).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> from statseq.models.hmm.bernoulli import BernoulliHMM
        >>> y = (np.random.default_rng(0).random((50, 3)) < 0.3).astype(int)
        >>> model = BernoulliHMM(num_states=2, emission_dim=3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> params.emissions.probs.shape
        (2, 3)
    """

    num_states: int = 2
    emission_dim: int = 1
    initial: str = "free"
    input_dim: int = 0

    def __post_init__(self):
        self._check_hmm_config()
        check_positive_int(self.emission_dim, "emission_dim")

    @property
    def event_shape(self):
        return (self.emission_dim,)

    @property
    def observation_dtype(self) -> str:
        return "category"  # cast to integers by prepare_data; validate_data checks 0/1

    def emission_shapes(self):
        return BernoulliEmissions((self.num_states, self.emission_dim))

    def emission_constraints(self):
        return BernoulliEmissions(constraints.unit_interval)

    def emission_log_likelihoods(self, emissions, y_t, mask_t):
        p = emissions.probs
        lp = jnp.where(y_t == 1, jnp.log(p), jnp.log1p(-p))  # (K, D); safe at p = 0, 1
        return jnp.sum(jnp.where(mask_t, lp, 0.0), axis=-1)

    def emissions_surely_finite(self, emissions) -> bool:
        """``y log p + (1 - y) log(1 - p)`` is finite for both outcomes when every
        probability is strictly between 0 and 1."""
        probs = np.asarray(emissions.probs)
        return bool(np.all((probs > 0) & (probs < 1)))

    def emission_distribution(self, emissions):
        return dist.Independent(dist.Bernoulli(probs=emissions.probs), 1)

    def emission_suff_stats(self, y, mask, weights):
        m = mask.astype(weights.dtype)
        return {"sum_w": jnp.einsum("ntk,ntd->kd", weights, m),
                "sum_wy": jnp.einsum("ntk,ntd->kd", weights, m * y.astype(weights.dtype))}

    #: each entry's closed-form update uses its own statistics only (exact per entry)
    exact_masked_emission_fields: ClassVar[tuple[str, ...]] = ("probs",)

    def emission_m_step(self, emissions, stats, prior):
        """``p = (n_1 + a - 1) / (n + a + b - 2)`` (``a = b = 1`` without a prior); entries
        without any weight keep their value."""
        num, den = stats["sum_wy"], stats["sum_w"]
        if prior is not None and prior.probs is not None:
            a, b = prior.probs.concentration1, prior.probs.concentration0
            num = num + a - 1.0
            den = den + a + b - 2.0
        empty = den <= 1e-12 * jnp.maximum(1.0, jnp.max(den))
        probs = jnp.where(empty, emissions.probs, num / jnp.where(empty, 1.0, den))
        return BernoulliEmissions(jnp.clip(probs, 0.0, 1.0))

    def validate_em_priors(self, priors):
        """EM's closed form needs Beta priors (concentrations >= 1) on ``probs``."""
        _check_conjugate(priors, {"probs": dist.Beta})
        if priors is not None and priors.emissions is not None:
            beta = priors.emissions.probs
            if beta is not None and bool(jnp.any(jnp.minimum(beta.concentration1,
                                                             beta.concentration0) < 1)):
                raise ValueError("the Beta prior on emissions.probs needs concentrations "
                                 ">= 1 for a MAP estimate in [0, 1]")

    def validate_data(self, y, mask):
        observed = np.asarray(y)[np.asarray(mask, bool)]
        bad = (observed != 0) & (observed != 1)
        if np.any(bad):
            raise ValueError(f"y must hold binary values 0 or 1 (BernoulliHMM); found "
                             f"{observed[bad][0]}")

    def initialize_emissions(self, y, mask, *, key, method):
        """``"data"``: k-means (k-means++ seeding from ``key``) on the steps with observed
        entries (missing ones filled with the entry's frequency), then smoothed cluster
        frequencies ``(n_1 + 1) / (n + 2)``. ``"random"``: uniform draws in
        ``[0.05, 0.95]``."""
        k, d = self.num_states, self.emission_dim
        rows = np.asarray(y, float).reshape(-1, d)
        obs = np.asarray(mask, bool).reshape(-1, d)
        seed = seed_from_key(key)
        if method == "data":
            count = obs.sum(0)
            freq = np.where(obs, rows, 0.0).sum(0) / np.maximum(count, 1)
            freq = np.where(count > 0, freq, 0.5)
            keep = obs.any(axis=1)
            if not np.any(keep):
                raise ValueError("y has no observed values")
            filled = np.where(obs, rows, freq)[keep]
            centers, labels = kmeans(filled, k, seed=seed)
            ones = np.stack([np.where(obs[keep], rows[keep], 0)[labels == j].sum(0)
                             for j in range(k)])
            counts = np.stack([obs[keep][labels == j].sum(0) for j in range(k)])
            probs = (ones + 1.0) / (counts + 2.0)
            probs = probs[np.argsort(centers.sum(axis=1), kind="stable")]
        elif method == "random":
            probs = np.asarray(jax.random.uniform(key, (k, d), minval=0.05, maxval=0.95))
        else:
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        return BernoulliEmissions(jnp.asarray(probs, float_dtype()))
