"""Linear autoregressive HMM (switching VAR): the emission regresses on the last lags.

    y_t | z_t = k, y_{<t} ~ N(sum_l A_{k,l} y_{t-l} + b_k, Sigma_k)

with ``Sigma_k`` full, tied (one ``Sigma`` for all states) or spherical (``sigma_k^2 I``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.distributions import constraints

from statseq.core.distributions import FiniteMixture
from statseq.core.model import register_model
from statseq.core.recurrence import filter as filter_sequences
from statseq.core.validation import check_positive_int, float_dtype, observed_entries, prepare_data
from statseq.inference import gaussian_sum as gsum
from statseq.inference.gaussian import (
    condition_on_leading,
    masked_mvn_log_prob,
    masked_mvn_log_prob_table,
    symmetrize,
)
from statseq.inference.regime_paths import MAX_COMPONENTS, companion, regime_path_marginals
from statseq.models.hmm.base import HMMBase, HMMCarry, HMMParams, _e_step, last_lags
from statseq.models.hmm.gaussian import (
    _check_min_variance,
    _cluster_covs,
    _gaussian_surely_finite,
    kmeans,
    seed_from_key,
)
from statseq.models.hmm.gaussian_params import covariances_by_state
from statseq.models.hmm.poisson import _check_conjugate


class ARHMMEmissions(NamedTuple):
    """Emissions of a linear autoregressive HMM.

    Attributes:
        weights: ``(num_states, emission_dim, num_lags * emission_dim)``, the blocks
            ``[A_{k,1}, ..., A_{k,L}]``; ``A_{k,l}`` multiplies ``y_{t-l}`` (dynamax's layout).
        biases: ``(num_states, emission_dim)``.
        covs: ``(num_states, emission_dim, emission_dim)`` positive definite.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> from statseq.models.hmm import ARHMMEmissions
        >>> y = np.cumsum(np.random.default_rng(0).normal(size=(40, 2)), axis=0)
        >>> model = ss.LinearAutoregressiveHMM(num_states=2, emission_dim=2, num_lags=1)
        >>> em = model.initialize(y, key=jax.random.key(0)).emissions
        >>> type(em) is ARHMMEmissions, em.weights.shape, em.biases.shape, em.covs.shape
        (True, (2, 2, 2), (2, 2), (2, 2, 2))
    """

    weights: jax.Array
    biases: jax.Array
    covs: jax.Array


class TiedARHMMEmissions(NamedTuple):
    """Emissions of a linear autoregressive HMM sharing one noise covariance.

    Attributes:
        weights: ``(num_states, emission_dim, num_lags * emission_dim)`` as in
            `ARHMMEmissions`.
        biases: ``(num_states, emission_dim)``.
        cov: ``(emission_dim, emission_dim)`` positive definite, the same for every state.
    """

    weights: jax.Array
    biases: jax.Array
    cov: jax.Array


class SphericalARHMMEmissions(NamedTuple):
    """Emissions of a linear autoregressive HMM with noise covariance ``sigma_k^2 I``.

    Attributes:
        weights: ``(num_states, emission_dim, num_lags * emission_dim)`` as in
            `ARHMMEmissions`.
        biases: ``(num_states, emission_dim)``.
        variances: ``(num_states,)`` positive, ``sigma_k^2``.
    """

    weights: jax.Array
    biases: jax.Array
    variances: jax.Array


_AR_EMISSIONS = {"full": ARHMMEmissions, "tied": TiedARHMMEmissions,
                 "spherical": SphericalARHMMEmissions}


class ARHMMCarry(NamedTuple):
    """The HMM forward message plus the lag window.

    Attributes:
        probs: as `~statseq.models.hmm.base.HMMCarry`.
        started: as `~statseq.models.hmm.base.HMMCarry`.
        lags: ``(num_lags, emission_dim)``, ``lags[l - 1] = y_{t-l}`` (zeros before the data).
        count: steps seen so far, capped at ``num_lags`` (scoring starts when it is reached).
    """

    probs: jax.Array
    started: jax.Array
    lags: jax.Array
    count: jax.Array


@register_model
@dataclasses.dataclass(frozen=True)
class LinearAutoregressiveHMM(HMMBase):
    """Hidden Markov model whose Gaussian emission is a state-dependent VAR(L) regression.

        z_t | z_{t-1} ~ Categorical(A[z_{t-1}]),
        y_t | z_t = k, y_{<t} ~ N(sum_{l=1}^L A_{k,l} y_{t-l} + b_k, Sigma_k),

    with ``Sigma_k`` full (`ARHMMEmissions`), tied (``Sigma_k = Sigma``,
    `TiedARHMMEmissions`) or spherical (``Sigma_k = sigma_k^2 I``,
    `SphericalARHMMEmissions`). The EM M-step is weighted least squares per state for
    the coefficients in every case (all outputs share the regressors, so the covariance
    structure does not change them), then the residual covariance: per state, pooled over
    states (tied: ``sum_k S_k / sum_k w_k``) or ``tr(S_k) / (D w_k)`` (spherical).

    The likelihood is conditional on the first ``num_lags`` observations
    (``num_conditioned_steps = num_lags``): they enter only as lags, their log-likelihood
    rows are zero, and the state chain still starts at ``t = 0`` (so ``p(z_L) = pi A^L``).
    Pre-sample lags are zeros; they matter only when *sampling* the first ``L`` values.
    dynamax's ``LinearAutoregressiveHMM`` instead scores every step with zero pre-sample
    lags (``compute_inputs`` default); the two agree when dynamax is given ``y[L:]``,
    ``prev_emissions=y[:L]`` and initial law ``pi A^L``.

    Missing data: entries of ``y_t`` may be missing (per-entry masks are marginalized
    exactly). When a missing ``y_t`` is a lag of a later step with observed entries, the
    emission depends on an unobserved Gaussian whose law mixes over the state path since
    the gap began: `statseq.log_prob`, `statseq.filter`, `statseq.forecast`,
    `statseq.fit_lbfgs` and `statseq.fit_sgd` then run an exact Gaussian-sum filter
    (`statseq.inference.gaussian_sum`) whose components are (state, weight, mean and
    covariance of the lag window); they merge exactly once ``num_lags`` observed steps
    follow the gap, so a gap of ``g`` steps needs at most ``K^(g + L)`` components. The
    capacity is sized eagerly from the mask (`for_mask`); data needing more than
    ``max_gap_components`` are refused, as are missing values among the first
    ``num_lags`` (conditioned) steps that an observed step depends on. Fully observed data
    (and trailing padding of ragged batches) keep the finite-state filter. `statseq.fit_em`
    and the posterior methods (`filter_states`, `smoother`, ...) need observed lags (use
    `statseq.fit_lbfgs` with such gaps); EM uses the conditional expectations of missing
    entries that are not lags of observed steps.

    Forecast densities: a masked step is not marginalization here (later emissions read it
    as a lag; ``marginalizes_masked_steps = False``), so the h-step marginals
    ``p(y_{T+k} | y_{1:T})`` come from `h_step_marginals` / `predict_observations`: the
    exact Gaussian mixture over the ``K^k`` state paths, which
    `statseq.log_predictive_density` (``marginal=True``) and `statseq.backtest` use.

    Args:
        num_states: number of hidden states ``K``.
        emission_dim: ``D`` (event shape ``(D,)``).
        num_lags: ``L >= 1``.
        initial: ``"free"`` or ``"stationary"``.
        input_dim: covariates driving the transitions (0 for a fixed matrix).
        min_variance: added to covariance diagonals in each M-step (collapse guard).
        covariance: ``"full"`` (default), ``"tied"`` or ``"spherical"``.
        max_gap_components: the most Gaussian components the exact filter over missing
            lags may use (data needing more are refused; raise it for longer gaps).
        gap_capacity: the filter's static number of components (0: the finite-state
            filter, no missing lags). Set by `for_mask`; not meant to be set by hand.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> from statseq.models.hmm.autoregressive import LinearAutoregressiveHMM
        >>> y = np.cumsum(np.random.default_rng(0).normal(size=(60, 2)), axis=0)
        >>> model = LinearAutoregressiveHMM(num_states=2, emission_dim=2, num_lags=1)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> fit = ss.fit_em(model, params, y, num_iters=10, progress=False)
        >>> fit.params.emissions.weights.shape
        (2, 2, 2)
    """

    num_states: int = 2
    emission_dim: int = 1
    num_lags: int = 1
    initial: str = "free"
    input_dim: int = 0
    min_variance: float = 1e-6
    covariance: str = "full"
    max_gap_components: int = 1024
    gap_capacity: int = dataclasses.field(default=0, repr=False)

    #: a masked step is not a marginalization (later emissions read it as a lag): h-step
    #: marginals come from `h_step_marginals`
    marginalizes_masked_steps: ClassVar[bool] = False

    def __post_init__(self):
        self._check_hmm_config()
        check_positive_int(self.emission_dim, "emission_dim")
        check_positive_int(self.num_lags, "num_lags")
        check_positive_int(self.max_gap_components, "max_gap_components")
        check_positive_int(self.gap_capacity, "gap_capacity", minimum=-1)
        _check_min_variance(self)
        if self.covariance not in _AR_EMISSIONS:
            raise ValueError("covariance must be 'full', 'tied' or 'spherical', got "
                             f"{self.covariance!r}")

    @property
    def event_shape(self):
        return (self.emission_dim,)

    @property
    def num_conditioned_steps(self) -> int:
        return self.num_lags

    def emission_shapes(self):
        k, d, lag = self.num_states, self.emission_dim, self.num_lags
        noise = {"full": (k, d, d), "tied": (d, d), "spherical": (k,)}[self.covariance]
        return _AR_EMISSIONS[self.covariance]((k, d, d * lag), (k, d), noise)

    def data_surely_finite(self, emissions, y, mask) -> bool:
        """As `GaussianHMM.data_surely_finite`, with the means ``W_k x_t + b_k`` bounded by
        ``max_k (max row sum of |W_k|) max |y| + max |b|`` (the lags are entries of ``y``
        or zeros). The gap-capacity filter (a Gaussian sum) is not covered."""
        if self.gap_capacity:
            return False
        weights = np.abs(np.asarray(emissions.weights, np.float64))
        gain = float(np.max(np.sum(weights, axis=-1), initial=0.0))
        bias = float(np.max(np.abs(np.asarray(emissions.biases, np.float64)), initial=0.0))
        return _gaussian_surely_finite(self.state_covariances(emissions), y,
                                       lambda y_max: gain * y_max + bias)

    def emission_constraints(self):
        noise = (constraints.positive if self.covariance == "spherical"
                 else constraints.positive_definite)
        return _AR_EMISSIONS[self.covariance](constraints.real, constraints.real, noise)

    def state_covariances(self, emissions):
        """``(K, D, D)`` noise covariance of every state, whatever the parameterization."""
        return covariances_by_state(self.covariance, emissions, self.num_states,
                                    self.emission_dim)

    # ---- emissions given the lag window ------------------------------------------------
    def _regressors(self, regressors, dtype):
        if regressors is None:
            return jnp.zeros((self.num_lags * self.emission_dim,), dtype)
        return regressors

    def emission_means(self, emissions, regressors=None):
        """``(K, D)`` conditional means given ``regressors = [y_{t-1}; ...; y_{t-L}]``."""
        x = self._regressors(regressors, emissions.biases.dtype)
        return emissions.weights @ x + emissions.biases

    def emission_log_likelihoods(self, emissions, y_t, mask_t, regressors=None):
        """``(K,)`` ``log p(observed y_t | z_t = k, lags)`` (zero lags when not given)."""
        mask_t = jnp.broadcast_to(jnp.asarray(mask_t, bool), y_t.shape)
        means = self.emission_means(emissions, regressors)
        return jax.vmap(lambda mu, cov: masked_mvn_log_prob(y_t, mu, cov, mask_t))(
            means, self.state_covariances(emissions))

    def emission_distribution(self, emissions, regressors=None):
        """Per-state ``MultivariateNormal`` (batch ``(K,)``) given the lags (zeros if None)."""
        return dist.MultivariateNormal(self.emission_means(emissions, regressors),
                                       covariance_matrix=self.state_covariances(emissions))

    def lagged(self, y):
        """``(T, L * D)`` regressors ``[y_{t-1}; ...; y_{t-L}]`` of one sequence ``(T, D)``
        (zeros before the data)."""
        num_steps, lag = y.shape[0], self.num_lags
        padded = jnp.concatenate([jnp.zeros((lag,) + y.shape[1:], y.dtype), y])
        return jnp.concatenate([padded[lag - i: lag - i + num_steps] for i in range(1, lag + 1)],
                               axis=-1)

    # ---- the filter -----------------------------------------------------------------------
    def initial_carry(self, params) -> ARHMMCarry:
        if self.gap_capacity:
            return gsum.initial_gaussian_sum(self.initial_probs(params), self._capacity(),
                                             self.num_lags * self.emission_dim)
        base = super().initial_carry(params)
        dtype = params.emissions.biases.dtype
        return ARHMMCarry(base.probs, base.started,
                          jnp.zeros((self.num_lags, self.emission_dim), dtype),
                          jnp.zeros((), jnp.int32))

    def _own_step(self) -> bool:
        """The finite-state filter runs on the emission table (`masked_data_filter`); the
        gap-capacity filter (a Gaussian sum over missing lags) keeps its own step."""
        return bool(self.gap_capacity)

    def filters_on_the_table(self, num_timesteps: int) -> bool:
        """Always: the table (`log_likelihoods`, each covariance factored once when every
        entry is observed) and the filter, with the state unconditioned during the first
        ``num_lags`` steps as in `step` (public ``log_prob`` at ``T = 10^4``: 16.8 ms by
        the step scan)."""
        return True

    def _carry_after(self, filtered_last, y, mask):
        """`step`'s final carry: the probabilities, the last ``num_lags`` observations
        (most recent first, missing entries 0, zeros before the data) and the count."""
        lags, count = last_lags(y, observed_entries(mask, y), self.num_lags,
                                filtered_last.dtype)
        return ARHMMCarry(filtered_last, jnp.ones((), bool), lags, count)

    def _state(self, carry) -> HMMCarry:
        return HMMCarry(carry.probs, carry.started)

    def predict(self, params, carry, inputs_t):
        if self.gap_capacity:
            return self._gap_predict(params, carry, inputs_t)
        probs = self._predicted(params, self._state(carry), inputs_t)
        comp = self.emission_distribution(params.emissions, carry.lags.reshape(-1))
        return FiniteMixture(dist.Categorical(probs=probs), comp)

    def step(self, params, carry, y_t, mask_t, inputs_t):
        """Score ``y_t`` under the predictive and update; during the first ``num_lags``
        steps the state is not conditioned (the engine also drops their scores)."""
        if self.gap_capacity:
            return self._gap_step(params, carry, y_t, mask_t, inputs_t)
        predicted = self._predicted(params, self._state(carry), inputs_t)
        ll = self.emission_log_likelihoods(params.emissions, y_t, mask_t,
                                           carry.lags.reshape(-1))
        shift = jax.lax.stop_gradient(jnp.max(ll))
        log_prob = jnp.log(jnp.sum(predicted * jnp.exp(ll - shift))) + shift
        active = carry.count >= self.num_lags
        ll_c = jnp.where(active, ll, 0.0)
        joint = predicted * jnp.exp(ll_c - jax.lax.stop_gradient(jnp.max(ll_c)))
        probs = joint / jnp.sum(joint)
        mask_t = jnp.broadcast_to(jnp.asarray(mask_t, bool), y_t.shape)
        y_in = jnp.where(mask_t, y_t, 0).astype(carry.lags.dtype)
        lags = jnp.concatenate([y_in[None], carry.lags[:-1]], axis=0)
        count = jnp.minimum(carry.count + 1, self.num_lags).astype(jnp.int32)
        return log_prob, ARHMMCarry(probs, jnp.ones((), bool), lags, count)

    def update(self, params, carry, y_t, mask_t, inputs_t) -> ARHMMCarry:
        return self.step(params, carry, y_t, mask_t, inputs_t)[1]

    def log_likelihoods(self, params, y, mask):
        """``(T, K)`` emission log-likelihoods of one sequence given its own lags; zero
        rows for the first ``num_lags`` (conditioned) steps and fully masked steps."""
        em = params.emissions
        means = jnp.einsum("kdj,tj->tkd", em.weights, self.lagged(y.astype(em.biases.dtype)))
        means = means + em.biases
        ll = masked_mvn_log_prob_table(y, means, self.state_covariances(em),
                                       jnp.broadcast_to(mask, y.shape))
        scored = jnp.arange(y.shape[0]) >= self.num_lags
        return jnp.where(scored[:, None], ll, 0.0)

    # ---- exact h-step predictives ------------------------------------------------------
    def h_step_marginals(self, params: Any, carry: Any, inputs_future: ArrayLike, *,
                         max_components: int = MAX_COMPONENTS) -> FiniteMixture:
        """Exact marginal predictives ``p(y_{T+k} | y_{1:T})``, ``k = 1..h``, from a carry.

        Along each state path ``z_{T+1:T+k}`` the future is a VAR(L) driven by Gaussian
        noise, so with the lag vector ``s_t = [y_t; ...; y_{t-L+1}]`` in companion form
        (``s_T`` known from the carry)

            p(y_{T+k} | y_{1:T}) = sum_{z_{T+1:T+k}} p(z_{T+1:T+k} | y_{1:T})
                                   N(y_{T+k}; m_k[:D], P_k[:D, :D]),
            m_j = F_{z_{T+j}} m_{j-1} + c_{z_{T+j}},  P_j = F P_{j-1} F' + Q_{z_{T+j}},

        the unobserved ``y_{T+1:T+k-1}`` entering the lags as Gaussian states
        (`statseq.inference.regime_paths`); the path law is the filtered state law times
        the transitions (``A(u_{T+j})`` when transitions read inputs). A mixture over
        ``K^k`` paths at step ``k``, each with an ``(L D, L D)`` covariance: time
        ``O(K^h (L D)^3)``, memory ``O(h K^h (L D)^2)``.

        Args:
            params: the model's parameters.
            carry: the filter state after ``y_{1:T}`` (an `ARHMMCarry`, e.g.
                ``ss.filter(...).final_carry``).
            inputs_future: ``(h, input_dim)`` inputs of the steps ``T+1..T+h`` (``(h, 0)``
                without inputs); ``h`` is read from its length.
            max_components: refuse (``ValueError``) when ``K^h`` exceeds it.

        Returns:
            A `statseq.core.distributions.FiniteMixture` of ``MultivariateNormal``
                components with batch shape ``(h,)`` and event shape ``(D,)``, padded to
                ``K^h`` components with zero weight: ``log_prob``, ``mean``, ``variance``,
                ``cdf``/``icdf`` (``D = 1``) and `statseq.core.distributions.marginal_cdf` are
                exact.

        Examples:
            >>> import jax, jax.numpy as jnp, numpy as np, statseq as ss
            >>> model = ss.LinearAutoregressiveHMM(num_states=2, emission_dim=1)
            >>> y = np.cumsum(np.random.default_rng(0).normal(size=(30, 1)), axis=0)
            >>> params = model.initialize(y, key=jax.random.key(0))
            >>> carry = ss.filter(model, params, y).final_carry
            >>> d = model.h_step_marginals(params, carry, jnp.zeros((3, 0)))
            >>> d.batch_shape, d.event_shape, d.mixing_distribution.probs.shape
            ((3,), (1,), (3, 8))
        """
        w, m, c = self._h_step_arrays(params, carry, inputs_future, max_components)
        return FiniteMixture(dist.Categorical(probs=w),
                             dist.MultivariateNormal(m, covariance_matrix=c))

    def _h_step_arrays(self, params, carry, inputs_future, max_components):
        em = params.emissions
        k = self.num_states
        u = jnp.asarray(inputs_future, em.biases.dtype)
        probs = self._predicted(params, self._state(carry), u[0])
        branch = jax.vmap(lambda u_t: self.transition_matrix(params, u_t))(u[1:])
        f, c, q = companion(em.weights, em.biases, self.state_covariances(em))
        return regime_path_marginals(
            probs, branch, np.tile(np.arange(k), (k, 1)), f, c, q,
            carry.lags.reshape(-1).astype(em.biases.dtype), obs_dim=self.emission_dim,
            max_components=max_components)

    def predict_observations(self, params: Any, y: ArrayLike, *, num_steps: int,
                             mask: ArrayLike | None = None, inputs: ArrayLike | None = None,
                             future_inputs: ArrayLike | None = None,
                             max_components: int = MAX_COMPONENTS) -> FiniteMixture:
        """Exact marginal predictive of each future ``y_{T+h}``: a Gaussian mixture over
        state paths (`h_step_marginals` from the filter's final carry).

        Args:
            params: the model's parameters.
            y: ``batch_shape + (T, D)`` histories; their last ``num_lags`` steps must be
                fully observed (the lag window the forecast starts from).
            num_steps: the horizon ``h``.
            mask: optional observation mask.
            inputs: ``batch_shape + (T, input_dim)`` when transitions read inputs.
            future_inputs: ``(h, input_dim)`` inputs of the forecast steps (required when
                ``input_dim > 0``; shared by every series of a batch).
            max_components: refuse when ``K^h`` exceeds it.

        Returns:
            A `statseq.core.distributions.FiniteMixture` with batch shape
                ``batch_shape + (num_steps,)`` and event shape ``(D,)``.

        Examples:
            >>> import jax, numpy as np, statseq as ss
            >>> model = ss.LinearAutoregressiveHMM(num_states=2, emission_dim=1)
            >>> y = np.cumsum(np.random.default_rng(0).normal(size=(30, 1)), axis=0)
            >>> params = model.initialize(y, key=jax.random.key(0))
            >>> d = model.predict_observations(params, y, num_steps=4)
            >>> d.batch_shape, d.mean.shape
            ((4,), (4, 1))
        """
        num_steps = check_positive_int(num_steps, "num_steps")
        data = prepare_data(self, y, mask, inputs)
        tail = np.asarray(data.mask)[:, -self.num_lags:]
        if data.num_timesteps < self.num_lags or not tail.all():
            raise ValueError(
                f"predict_observations needs the last num_lags = {self.num_lags} steps of y "
                "fully observed (they are the lag window the forecast starts from)")
        if self.input_dim:
            if future_inputs is None:
                raise ValueError("this HMM has input-driven transitions: pass future_inputs")
            u = np.asarray(future_inputs, float)
            if u.shape != (num_steps, self.input_dim):
                raise ValueError(f"future_inputs must have shape ({num_steps}, "
                                 f"{self.input_dim}), got {u.shape}")
        else:
            u = np.zeros((num_steps, 0))
        final = filter_sequences(self, params, y, mask=mask, inputs=inputs).final_carry
        flat = jax.tree.map(lambda a: jnp.reshape(a, (-1,) + a.shape[len(data.batch_shape):]),
                            final)
        w, m, c = jax.vmap(lambda cr: self._h_step_arrays(params, cr, u, max_components))(flat)
        shape = data.batch_shape + (num_steps,)
        w = w.reshape(shape + w.shape[-1:])
        m = m.reshape(shape + m.shape[-2:])
        c = c.reshape(shape + c.shape[-3:])
        return FiniteMixture(dist.Categorical(probs=w),
                             dist.MultivariateNormal(m, covariance_matrix=c))

    # ---- missing lags: the exact Gaussian-sum filter ----------------------------------------
    def _capacity(self):
        if self.gap_capacity < 0:
            raise ValueError("gap_capacity=-1 only validates data; size the model with "
                             "for_mask(mask)")
        return max(self.gap_capacity, self.num_states)

    def _gap_predict(self, params, carry, inputs_t):
        em = params.emissions
        lw, means, covs, _ = gsum.predictive_components(
            carry, self.transition_matrix(params, inputs_t), em.weights, em.biases,
            self.state_covariances(em))
        d = self.emission_dim
        return FiniteMixture(dist.Categorical(logits=lw.reshape(-1)),
                             dist.MultivariateNormal(means.reshape(-1, d),
                                                     covariance_matrix=covs.reshape(-1, d, d)))

    def _gap_step(self, params, carry, y_t, mask_t, inputs_t):
        em = params.emissions
        mask_t = jnp.broadcast_to(jnp.asarray(mask_t, bool), y_t.shape)
        return gsum.gaussian_sum_step(
            carry, self.transition_matrix(params, inputs_t), em.weights, em.biases,
            self.state_covariances(em), y_t.astype(em.biases.dtype), mask_t, self.num_lags)

    def gap_size(self, mask, *, trailing=False) -> gsum.GapSize:
        """Components the exact filter needs on ``mask`` (``(N, T, D)`` bools); see
        `statseq.inference.gaussian_sum.required_components`."""
        mask = np.asarray(mask, bool)
        mask = mask.reshape((-1,) + mask.shape[-2:])
        return gsum.required_components(mask, self.num_lags, self.num_states, self.num_states,
                                        trailing=trailing, limit=self.max_gap_components)

    def for_mask(self, mask, *, trailing=False):
        """This model with its filter sized for the data's mask (``(N, T, D)`` bools).

        Without missing lags (or ``mask=None``: a model that only validates) it is the
        finite-state filter; otherwise ``gap_capacity`` is the number of components the
        longest gap needs. ``trailing=True`` also sizes for gaps at the end of the data
        (a forecast starts from that state). Called by `statseq.log_prob`,
        `statseq.filter`, `statseq.forecast`, `statseq.fit_lbfgs` and `statseq.fit_sgd`.
        """
        if mask is None:
            return dataclasses.replace(self, gap_capacity=-1)
        size = self.gap_size(mask, trailing=trailing)
        self._check_gap_size(size)
        need = size.components if size.gap else 0
        return self if need == self.gap_capacity else dataclasses.replace(
            self, gap_capacity=need)

    def _check_gap_size(self, size):
        name, k, lag = type(self).__name__, self.num_states, self.num_lags
        if size.conditioned is not None:
            n, step = size.conditioned
            raise ValueError(
                f"{name}: observed step {step} (sequence {n}) depends on a missing value "
                f"among the first num_lags = {lag} steps, which the likelihood conditions "
                "on (they have no law in the model): drop the leading steps so that the "
                "series starts with num_lags observed values")
        if size.components > self.max_gap_components:
            raise ValueError(
                f"{name}: a gap of {size.gap} step(s) (sequence {size.sequence}) before "
                f"observed steps needs more than max_gap_components = "
                f"{self.max_gap_components} Gaussian components (K^(g + L) = {k}^"
                f"({size.gap} + {lag}) for the exact filter over missing lags): raise "
                "max_gap_components, or split the series at the gap")

    # ---- data checks ------------------------------------------------------------------------
    def validate_data(self, y, mask):
        """Missing lags within ``max_gap_components`` are accepted when the filter is sized
        for them (`for_mask`, which the entry points that support them call); otherwise
        refused with the reason."""
        mask = np.broadcast_to(np.asarray(mask, bool), np.shape(y))
        size = self.gap_size(mask)
        self._check_gap_size(size)
        if size.gap and self.gap_capacity >= 0 and size.components > self.gap_capacity:
            raise ValueError(
                f"{type(self).__name__}: sequence {size.sequence} has a gap of {size.gap} "
                "step(s) whose values are lags of later observed steps; the exact "
                f"Gaussian-sum filter ({size.components} components) runs in "
                "statseq.log_prob, filter, forecast, fit_lbfgs and fit_sgd, but not here: "
                "fit_em and the state posteriors need observed lags (use fit_lbfgs to fit "
                "such data)")

    def _posterior_inputs(self, params, y, mask, inputs):
        if self.gap_capacity:
            raise ValueError("the state posteriors need observed lags; this model is sized for "
                             "missing lags (for_mask): use the model it came from")
        return super()._posterior_inputs(params, y, mask, inputs)

    # ---- EM -------------------------------------------------------------------------------
    def e_step(self, params, y, mask, inputs):
        """The base E-step with regression statistics that use the current emissions."""
        if self.gap_capacity:
            raise ValueError("fit_em has no exact E-step for missing lags (the lag window mixes "
                             "over state paths): use fit_lbfgs")
        stats, log_prob = super().e_step(params, y, mask, inputs)
        stats["emissions"] = self.emission_suff_stats(y, mask, stats["weights"],
                                                      emissions=params.emissions)
        return stats, log_prob

    def emission_suff_stats(self, y, mask, weights, emissions=None):
        """Weighted least-squares statistics of the residuals of the current regression.

        With ``phi_t = [y_{t-1}; ...; y_{t-L}; 1]`` and ``r_tk = E[y_t | y_obs, z_t = k] -
        center_k phi_t`` (``center`` = current ``[weights, biases]``, zeros without
        ``emissions``): ``sum_w (K,)``, ``phi_phi (K, P, P)``, ``r_phi (K, D, P)``,
        ``r_r (K, D, D)`` (plus the conditional covariance of missing entries). Steps before
        ``num_lags`` and steps with nothing observed get no weight; without ``emissions``
        partially observed steps are dropped as well.
        """
        dtype = weights.dtype
        k, d = self.num_states, self.emission_dim
        y = y.astype(dtype)
        num_steps = y.shape[1]
        phi = jax.vmap(self.lagged)(y)
        phi = jnp.concatenate([phi, jnp.ones(phi.shape[:-1] + (1,), dtype)], axis=-1)
        scored = (jnp.arange(num_steps) >= self.num_lags)[None, :]
        if emissions is None:
            center = jnp.zeros((k, d, phi.shape[-1]), dtype)
            w = weights * (scored & jnp.all(mask, axis=-1))[..., None].astype(dtype)
            r = jnp.broadcast_to(y[:, :, None, :], y.shape[:2] + (k, d))
            cond_cov = None
        else:
            em = jax.tree.map(lambda a: jax.lax.stop_gradient(a).astype(dtype), emissions)
            center = jnp.concatenate([em.weights, em.biases[..., None]], axis=-1)
            w = weights * (scored & jnp.any(mask, axis=-1))[..., None].astype(dtype)
            means = jnp.einsum("kdp,ntp->ntkd", center, phi)

            def one(y_t, m_t, mu, cov):
                r, c = condition_on_leading(jnp.zeros_like(mu), cov, y_t - mu, m_t)
                miss = ~m_t
                return (jnp.where(m_t, y_t - mu, r),
                        jnp.where(miss[:, None] & miss[None, :], c, 0.0))

            per_state = jax.vmap(one, in_axes=(None, None, 0, 0))
            r, cond_cov = jax.vmap(jax.vmap(per_state, in_axes=(0, 0, 0, None)),
                                   in_axes=(0, 0, 0, None))(y, mask, means,
                                                            self.state_covariances(em))
        r_r = jnp.einsum("ntk,ntkd,ntke->kde", w, r, r)
        if cond_cov is not None:
            r_r = r_r + jnp.einsum("ntk,ntkde->kde", w, cond_cov)
        return {"sum_w": jnp.sum(w, axis=(0, 1)),
                "phi_phi": jnp.einsum("ntk,ntp,ntq->kpq", w, phi, phi),
                "r_phi": jnp.einsum("ntk,ntkd,ntp->kdp", w, r, phi),
                "r_r": r_r,
                "center": center}

    def emission_m_step(self, emissions, stats, prior):
        """Weighted least squares per state (minimum-norm solution when the regressors are
        collinear), covariance from the weighted residuals (per state, pooled for
        ``"tied"``, their mean variance for ``"spherical"``) plus ``min_variance``; states
        without mass keep their values."""
        del prior  # validate_em_priors admits none
        w, center = stats["sum_w"], stats["center"]
        d = self.emission_dim
        empty = w <= 1e-12 * jnp.maximum(1.0, jnp.max(w))
        pinv = jnp.linalg.pinv(symmetrize(stats["phi_phi"]), hermitian=True)
        delta = jnp.einsum("kdp,kpq->kdq", stats["r_phi"], pinv)  # (K, D, P)
        theta = center + delta
        safe = jnp.where(empty, 1.0, w)
        scatter = (stats["r_r"] - jnp.einsum("kdp,kep->kde", delta, stats["r_phi"]))
        eye = self.min_variance * jnp.eye(d, dtype=w.dtype)
        keep = empty[:, None, None]
        weights = jnp.where(keep, emissions.weights, theta[..., :-1])
        biases = jnp.where(empty[:, None], emissions.biases, theta[..., -1])
        if self.covariance == "tied":
            scatter = jnp.where(keep, 0.0, scatter)
            cov = symmetrize(jnp.sum(scatter, 0) / jnp.maximum(jnp.sum(w), 1e-300)) + eye
            return TiedARHMMEmissions(weights, biases, cov)
        if self.covariance == "spherical":
            var = jnp.trace(scatter, axis1=1, axis2=2) / (d * safe)
            var = jnp.maximum(var, 0.0) + self.min_variance
            return SphericalARHMMEmissions(weights, biases,
                                           jnp.where(empty, emissions.variances, var))
        cov = symmetrize(scatter / safe[:, None, None]) + eye
        return ARHMMEmissions(weights, biases, jnp.where(keep, emissions.covs, cov))

    def em_state_masses(self, stats, mask):
        """``(K,)`` posterior weight of each state on the *scored* steps (the first
        ``num_lags`` steps carry state probabilities but no emission information)."""
        return stats["emissions"]["sum_w"]

    def em_warnings(self, params, y, mask, inputs, masses=None) -> list[str]:
        """States that ended EM with (almost) no weight on the scored steps."""
        if masses is None:
            stats, _ = _e_step(self, params, y, mask, inputs)
            masses = self.em_state_masses(stats, mask)
        mass = np.asarray(masses)
        total = float(np.sum(mass))
        return [
            f"state {k} has almost no posterior mass ({m:.3g} of {total:.0f} scored steps): "
            "its emission parameters were kept at their previous values; consider fewer states"
            for k, m in enumerate(mass) if m < 1e-6 * max(total, 1.0)
        ]

    def validate_em_priors(self, priors):
        """Only Dirichlet priors on simplexes; no conjugate emission prior is implemented
        (a matrix-normal-inverse-Wishart would be): the emissions prior must be ``None``."""
        if priors is None:
            return
        _check_conjugate(priors._replace(emissions=None), {})
        em = priors.emissions
        if em is not None and not (isinstance(em, tuple) and all(e is None for e in em)):
            raise ValueError(
                "fit_em has no conjugate emission prior for LinearAutoregressiveHMM (a "
                "matrix-normal-inverse-Wishart is not implemented): leave priors.emissions "
                f"None (got {type(em).__name__}), or use fit_sgd for MAP with other priors"
            )

    # ---- initialization -----------------------------------------------------------------
    def initialize(self, y: Any, *, key: jax.Array, inputs: Any = None, mask: Any = None,
                   method: str = "data", transitions: str | None = None) -> HMMParams:
        """`statseq.models.hmm.base.HMMBase.initialize`; data with missing lags are
        accepted (the least-squares start uses the rows whose lags are observed).

        Args:
            y: ``batch_shape + (num_timesteps, emission_dim)``.
            key: a ``jax.random`` key.
            inputs: covariates, when the model has input-driven transitions.
            mask: optional observation mask.
            method: ``"data"`` or ``"random"``.
            transitions: ``None`` or one of ``"sticky"``, ``"uniform"``, ``"dirichlet"``,
                ``"anti_persistent"``.

        Returns:
            `HMMParams`.
        """
        return HMMBase.initialize(self.for_mask(None), y, key=key, inputs=inputs, mask=mask,
                                  method=method, transitions=transitions)

    def initialize_emissions(self, y, mask, *, key, method):
        """Least squares on the fully observed (target, lags) rows. ``"data"``: k-means
        (k-means++ seeding from ``key``) on the rows ``[y_t, y_{t-1}, ...]``, then a ridge
        regression per cluster shrunk toward the pooled fit. ``"random"``: k-means++ seeds on
        those rows, each row assigned to its nearest seed, a ridge regression per group
        shrunk toward the pooled fit."""
        k, d, lag = self.num_states, self.emission_dim, self.num_lags
        y = np.asarray(y, float).reshape((-1,) + np.shape(y)[-2:])
        mask = np.broadcast_to(np.asarray(mask, bool), y.shape)
        xs, ts = [], []
        for y_s, m_s in zip(y, mask, strict=True):
            full = m_s.all(axis=-1)
            x_s = np.asarray(self.lagged(jnp.asarray(y_s)))
            ok = full.copy()
            ok[:lag] = False
            for i in range(1, lag + 1):
                ok[lag:] &= full[lag - i: len(full) - i]
            xs.append(x_s[ok])
            ts.append(y_s[ok])
        x, t = np.concatenate(xs), np.concatenate(ts)
        n, p = x.shape[0], d * lag + 1
        if n < 2:
            raise ValueError("LinearAutoregressiveHMM.initialize needs at least two fully "
                             "observed steps with fully observed lags")
        phi = np.concatenate([x, np.ones((n, 1))], axis=1)
        scale = max(float(np.mean(np.var(t, axis=0))), 1e-8)

        def ridge(ph, tt, prior_theta, strength):
            a = ph.T @ ph + strength * np.eye(p)
            return np.linalg.solve(a, ph.T @ tt + strength * prior_theta.T).T

        pooled = ridge(phi, t, np.zeros((d, p)), 1e-6 * max(n, 1))
        resid = t - phi @ pooled.T
        pooled_cov = resid.T @ resid / n + 1e-3 * scale * np.eye(d)
        seed = seed_from_key(key)
        if method == "data":
            centers, labels = kmeans(np.concatenate([t, x], axis=1), k, seed=seed)
            thetas, covs = [], []
            for j in range(k):
                sel = labels == j
                theta = ridge(phi[sel], t[sel], pooled, float(p + 1))
                thetas.append(theta)
                res = t[sel] - phi[sel] @ theta.T
                covs.append(_cluster_covs(res, np.zeros(res.shape[0], int),
                                          np.zeros((1, d)), pooled_cov)[0])
            thetas, covs = np.asarray(thetas), np.asarray(covs)
            order = np.argsort(centers[:, 0], kind="stable")
            thetas, covs = thetas[order], covs[order]
        elif method == "random":
            # k-means++ seeds on the rows [y_t, lags], every row assigned to its nearest
            # seed (no Lloyd iterations), a ridge regression per group shrunk to the pool
            rows = np.concatenate([t, x], axis=1)
            seeds, _ = kmeans(rows, k, seed=seed, num_iters=0)
            labels = np.argmin(((rows[:, None, :] - seeds[None]) ** 2).sum(-1), axis=1)
            thetas = np.stack([ridge(phi[labels == j], t[labels == j], pooled, float(p + 1))
                               for j in range(k)])
            covs = np.repeat(pooled_cov[None], k, axis=0)
        else:
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        covs = 0.5 * (covs + np.swapaxes(covs, -1, -2)) + self.min_variance * np.eye(d)
        return self._pack_emissions(thetas, covs)

    def _pack_emissions(self, thetas, covs):
        """Emissions from ``(K, D, P)`` ``[weights, biases]`` and ``(K, D, D)`` covariances
        (tied: their average; spherical: the mean of each diagonal)."""
        dtype = float_dtype()
        if self.covariance == "tied":
            noise = np.mean(covs, axis=0)
        elif self.covariance == "spherical":
            noise = np.diagonal(covs, axis1=1, axis2=2).mean(axis=1)
        else:
            noise = covs
        return _AR_EMISSIONS[self.covariance](jnp.asarray(thetas[..., :-1], dtype),
                                              jnp.asarray(thetas[..., -1], dtype),
                                              jnp.asarray(noise, dtype))
