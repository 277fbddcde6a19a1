"""Categorical HMM: ``y_t | z_t = k ~ Categorical(B[k])`` over ``num_classes`` symbols."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.distributions import CategoricalWithCdf
from statseq.core.model import register_model
from statseq.core.validation import check_positive_int, float_dtype
from statseq.fit.em import constrained_dirichlet_map, dirichlet_map
from statseq.models.hmm.base import HMMBase
from statseq.models.hmm.poisson import _check_conjugate


class CategoricalEmissions(NamedTuple):
    """``probs``: ``(num_states, num_classes)``, each row a probability vector.

    Examples:
        >>> import jax.numpy as jnp, numpy as np, statseq as ss
        >>> from statseq.models.hmm import CategoricalEmissions
        >>> model = ss.CategoricalHMM(num_states=2, num_classes=3)
        >>> probs = jnp.array([[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]])
        >>> params = model.assemble_params(CategoricalEmissions(probs))
        >>> ss.filter(model, params, np.array([0, 0, 2, 2, 1])).log_probs.shape
        (5,)
    """

    probs: jax.Array


@register_model
@dataclasses.dataclass(frozen=True)
class CategoricalHMM(HMMBase):
    """Hidden Markov model with categorical emissions (an RNN over one-hot symbols).

        z_t | z_{t-1} ~ Categorical(A[z_{t-1}]),    y_t | z_t = k ~ Categorical(B[k])

    With the forward message ``alpha_t`` as hidden state, the predictive is
    ``p(y_t = c | y_{<t}) = sum_k alpha_t(k) B[k, c]`` and the update is
    ``alpha_{t+1} = normalize(alpha_t * B[:, y_t]) A``: a recurrent network whose
    nonlinearity is the normalization.

    Args:
        num_states: number of hidden states ``K``.
        num_classes: number of symbols ``C``; ``y_t`` in ``{0, ..., C - 1}``.
        initial: ``"free"`` or ``"stationary"``.
        input_dim: covariates driving the transitions (0 for a fixed matrix).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.CategoricalHMM(num_states=2, num_classes=3)
        >>> params = model.initialize(np.array([0, 1, 2, 2, 1]), key=jax.random.key(0))
        >>> params.emissions.probs.shape
        (2, 3)
    """

    num_states: int = 2
    num_classes: int = 2
    initial: str = "free"
    input_dim: int = 0

    def __post_init__(self):
        self._check_hmm_config()
        check_positive_int(self.num_classes, "num_classes")

    @property
    def event_shape(self):
        return ()

    @property
    def observation_dtype(self) -> str:
        return "category"

    def emission_shapes(self):
        return CategoricalEmissions((self.num_states, self.num_classes))

    def emission_constraints(self):
        return CategoricalEmissions(constraints.simplex)

    def emission_log_likelihoods(self, emissions, y_t, mask_t):
        ll = jnp.log(emissions.probs[:, y_t])
        return jnp.where(mask_t, ll, 0.0)

    def emissions_surely_finite(self, emissions) -> bool:
        """``log p_k(y)`` is finite for every category when every probability is
        positive."""
        probs = np.asarray(emissions.probs)
        return bool(np.all(probs > 0))

    def emission_distribution(self, emissions):
        return dist.Categorical(probs=emissions.probs)

    def mixture(self, state_probs, emissions):
        """A mixture of categoricals is categorical: ``p(y = c) = sum_k alpha_k B[k, c]``."""
        return CategoricalWithCdf(probs=state_probs @ emissions.probs)

    def emission_suff_stats(self, y, mask, weights):
        onehot = jax.nn.one_hot(y, self.num_classes, dtype=weights.dtype)  # (N, T, C)
        onehot = onehot * mask[..., None].astype(weights.dtype)
        return {"counts": jnp.einsum("ntk,ntc->kc", weights, onehot)}

    def emission_m_step(self, emissions, stats, prior):
        p = None if prior is None else prior.probs
        return CategoricalEmissions(dirichlet_map(stats["counts"], p, emissions.probs))

    #: fixed entries of a row of ``probs``: the free ones share the rest of its mass
    exact_masked_emission_fields: ClassVar[tuple[str, ...]] = ("probs",)

    def emission_m_step_masked(self, emissions, stats, prior, trainable):
        p = None if prior is None else prior.probs
        return CategoricalEmissions(constrained_dirichlet_map(
            stats["counts"], p, emissions.probs, trainable.probs))

    def validate_em_priors(self, priors):
        """EM's closed form needs Dirichlet priors."""
        _check_conjugate(priors, {"probs": dist.Dirichlet})

    def validate_data(self, y, mask):
        observed = np.asarray(y)[np.asarray(mask, bool)]
        bad = (observed < 0) | (observed >= self.num_classes) | (observed != np.round(observed))
        if np.any(bad):
            raise ValueError(
                f"y must hold categories in 0..{self.num_classes - 1} (num_classes="
                f"{self.num_classes}); found {observed[bad][0]}"
            )

    def initialize_emissions(self, y, mask, *, key, method):
        k, c = self.num_states, self.num_classes
        if method == "data":
            freq = np.bincount(y[mask.astype(bool)].astype(int), minlength=c) + 1.0
            noise = np.asarray(jax.random.dirichlet(key, 10.0 * np.ones(c), (k,)))
            probs = 0.5 * freq / freq.sum() + 0.5 * noise
        elif method == "random":
            probs = np.asarray(jax.random.dirichlet(key, np.ones(c), (k,)))
        else:
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        probs = probs / probs.sum(axis=-1, keepdims=True)
        return CategoricalEmissions(jnp.asarray(probs, float_dtype()))
