"""Poisson HMM for counts: ``y_t | z_t = k ~ Poisson(lambda_k)`` (independent per entry)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int, float_dtype, observed_entries
from statseq.models.hmm.base import HMMBase, check_counts

_MIN_RATE = 1e-10


class PoissonEmissions(NamedTuple):
    """``rates``: ``(num_states,) + event_shape`` positive Poisson means.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> from statseq.models.hmm import PoissonEmissions
        >>> model = ss.PoissonHMM(num_states=2)
        >>> params = model.assemble_params(PoissonEmissions(rates=jnp.array([15.0, 25.0])))
        >>> y = ss.datasets.load_earthquakes().to_numpy()
        >>> bool(jnp.isfinite(ss.log_prob(model, params, y)))
        True
    """

    rates: jax.Array


@register_model
@dataclasses.dataclass(frozen=True)
class PoissonHMM(HMMBase):
    """Hidden Markov model with Poisson emissions.

        z_t | z_{t-1} ~ Categorical(A[z_{t-1}]),    y_t | z_t = k ~ Poisson(lambda_k)

    (a vector ``y_t`` has independent Poisson entries given the state).

    Args:
        num_states: number of hidden states ``K``.
        emission_dim: ``None`` for a scalar count series, ``D`` for ``D`` counts per step.
        initial: ``"free"`` (estimated initial law) or ``"stationary"`` (the stationary law
            of ``A``).
        input_dim: covariates driving the transitions (0 for a fixed matrix).

    Examples:
        >>> import jax, statseq as ss
        >>> y = ss.datasets.load_discoveries().to_numpy()
        >>> model = ss.PoissonHMM(num_states=2)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> params.emissions.rates.shape
        (2,)
    """

    num_states: int = 2
    emission_dim: int | None = None
    initial: str = "free"
    input_dim: int = 0

    def __post_init__(self):
        self._check_hmm_config()
        if self.emission_dim is not None:
            check_positive_int(self.emission_dim, "emission_dim")

    @property
    def event_shape(self):
        return () if self.emission_dim is None else (self.emission_dim,)

    @property
    def observation_dtype(self) -> str:
        return "count"

    def emission_shapes(self):
        return PoissonEmissions((self.num_states,) + self.event_shape)

    def emission_constraints(self):
        return PoissonEmissions(constraints.positive)

    def log_likelihoods(self, params, y, mask):
        """``(T, K)`` emission log-likelihoods ``sum_d [y log(lambda_kd) - lambda_kd -
        log(y!)]`` of one sequence (0 where masked): ``log(y!)`` once per entry, not once per
        state (the per-step path's values, to the last bit: tested)."""
        rates = params.emissions.rates                          # (K,) or (K, D)
        ftype = jnp.result_type(float)
        rates = jnp.astype(rates, ftype)
        counts = jnp.astype(jnp.reshape(y, (y.shape[0], 1) + rates.shape[1:]), ftype)
        log_factorial = jax.scipy.special.gammaln(counts + 1.0)  # (T, 1[, D])
        lp = jax.scipy.special.xlogy(counts, rates) - log_factorial - rates
        observed = jnp.reshape(observed_entries(mask, y), counts.shape)
        lp = jnp.where(observed, lp, 0.0)
        return jnp.reshape(lp, lp.shape[:2] + (-1,)).sum(axis=-1)

    def emission_log_likelihoods(self, emissions, y_t, mask_t):
        lp = dist.Poisson(emissions.rates).log_prob(jnp.broadcast_to(y_t, emissions.rates.shape))
        lp = jnp.where(mask_t, lp, 0.0)
        return jnp.reshape(lp, (self.num_states, -1)).sum(axis=-1)

    def emissions_surely_finite(self, emissions) -> bool:
        """Poisson log-probabilities ``y log(lambda) - lambda - log(y!)`` are finite for
        every count when the rates are positive and at most the square root of the dtype's
        largest number (no overflow, even summed over a vector ``y_t``)."""
        rates = np.asarray(emissions.rates)
        bound = np.sqrt(np.finfo(rates.dtype).max)
        return bool(np.all((rates > 0) & (rates <= bound)))

    def emission_distribution(self, emissions):
        base = dist.Poisson(emissions.rates)
        return base if self.emission_dim is None else dist.Independent(base, 1)

    def emission_suff_stats(self, y, mask, weights):
        w = weights.reshape(weights.shape + (1,) * len(self.event_shape))  # (N,T,K,...)
        m = mask[:, :, None].astype(w.dtype)
        return {"sum_w": jnp.sum(w * m, axis=(0, 1)),
                "sum_wy": jnp.sum(w * m * y[:, :, None].astype(w.dtype), axis=(0, 1))}

    #: each entry's closed-form update uses its own statistics only (exact per entry)
    exact_masked_emission_fields: ClassVar[tuple[str, ...]] = ("rates",)

    def emission_m_step(self, emissions, stats, prior):
        num, den = stats["sum_wy"], stats["sum_w"]
        if prior is not None and prior.rates is not None:
            num = num + prior.rates.concentration - 1.0
            den = den + prior.rates.rate
        empty = den <= 1e-12
        rates = jnp.where(empty, emissions.rates, num / jnp.where(empty, 1.0, den))
        return PoissonEmissions(jnp.maximum(rates, _MIN_RATE))

    def validate_em_priors(self, priors):
        """EM's closed form needs Gamma priors on rates and Dirichlet priors on simplexes."""
        _check_conjugate(priors, {"rates": dist.Gamma})

    def validate_data(self, y, mask):
        check_counts(y, mask)

    def initialize_emissions(self, y, mask, *, key, method):
        k = self.num_states
        flat = y.reshape(-1, *self.event_shape).astype(float)
        obs = mask.reshape(flat.shape).astype(bool)
        if method == "data":
            qs = (np.arange(k) + 0.5) / k
            cols = [np.quantile(flat[..., d][obs[..., d]], qs) if self.event_shape else
                    np.quantile(flat[obs], qs) for d in range(max(1, len(self.event_shape)
                                                                    and self.event_shape[0]))]
            rates = np.stack(cols, axis=-1) if self.event_shape else cols[0]
            rates = rates + 0.1 * np.arange(1, k + 1).reshape((k,) + (1,) * len(
                self.event_shape))
        elif method == "random":
            # k-means++ seeds: k observed rows, each drawn with probability proportional to
            # its squared distance from the rows already drawn (spread over the data), plus
            # a small random offset so that equal counts still give distinct states
            from statseq.models.hmm.gaussian import kmeans, seed_from_key

            d = self.event_shape[0] if self.event_shape else 1
            rows, obs_rows = flat.reshape(-1, d), obs.reshape(-1, d)
            col_mean = np.array([rows[obs_rows[:, j], j].mean() if obs_rows[:, j].any()
                                 else 1.0 for j in range(d)])
            filled = np.where(obs_rows, rows, col_mean)[obs_rows.any(axis=1)]
            if filled.shape[0] == 0:
                raise ValueError("y has no observed values")
            seed = seed_from_key(key)
            seeds, _ = kmeans(filled, k, seed=seed, num_iters=0)
            jitter = np.random.default_rng(seed + 1).uniform(0.05, 0.5, seeds.shape)
            rates = (seeds + jitter).reshape((k,) + self.event_shape)
        else:
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        # a transfer (device_put), not a small compiled program as jnp.asarray would be
        return PoissonEmissions(jax.device_put(np.asarray(np.maximum(rates, 1e-3),
                                                          float_dtype())))


def _check_conjugate(priors, emission_types: dict) -> None:
    """Raise unless every given prior has the conjugate type EM's M-step uses."""
    if priors is None:
        return
    pairs = [("initial_probs", priors.initial_probs, dist.Dirichlet)]
    if not hasattr(priors.transitions, "weights"):
        pairs.append(("transitions", priors.transitions, dist.Dirichlet))
    if isinstance(priors.emissions, dist.Distribution):
        raise ValueError(
            "fit_em needs priors on the individual emission fields "
            f"({', '.join(emission_types)}), not one prior on the whole emissions node"
        )
    if priors.emissions is not None:
        for field, kind in emission_types.items():
            pairs.append((f"emissions.{field}", getattr(priors.emissions, field), kind))
    for name, prior, kind in pairs:
        if prior is not None and not isinstance(prior, kind):
            raise ValueError(
                f"fit_em needs a conjugate {kind.__name__} prior on {name} for its "
                f"closed-form M-step, got {type(prior).__name__}; use fit_sgd for others"
            )
        if isinstance(prior, dist.Gamma) and bool(jnp.any(prior.concentration < 1)):
            raise ValueError(f"the Gamma prior on {name} needs concentration >= 1 for a "
                             "MAP estimate (below 1 its density is unbounded at 0)")
        if isinstance(prior, dist.Dirichlet) and bool(jnp.any(prior.concentration < 1)):
            raise ValueError(f"the Dirichlet prior on {name} needs concentrations >= 1 "
                             "for a MAP estimate inside the simplex")
