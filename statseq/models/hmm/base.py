"""Hidden Markov models as RNNs: the carry is the normalized forward message.

    z_1 ~ pi,    z_t | z_{t-1} ~ A_t[z_{t-1}, :],    y_t | z_t = k ~ p(y_t | theta_k).

The carry after step ``t`` is the filtered state distribution ``p(z_t | y_{<=t})``; the
one-step predictive is the mixture ``sum_k alpha_t(k) p(y_t | theta_k)`` with
``alpha_t = p(z_t | y_{<t})`` (the normalized forward message, the hidden state of the
HMM read as a recurrent network). Transitions are either a fixed matrix or a softmax
regression on inputs ``u_t`` (``A_t[i, :] = softmax(b_i + W_i u_t)``, the GLM-HMM), and the
initial distribution is either free or the stationary distribution of ``A`` (chosen
explicitly with ``initial``).

Concrete families (Poisson, categorical, Gaussian, ...) subclass `HMMBase` and
implement only the emission methods; inference (filter, smoother, Viterbi, sampling) comes
from `statseq.inference.hmm`, EM from `statseq.fit_em`.
"""

from __future__ import annotations

import abc
from functools import partial
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.distributions import FiniteMixture
from statseq.core.model import SequenceModel
from statseq.core.recurrence import pairwise_sum, vmap_or_one
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.inference import hmm as hmm_seq
from statseq.inference import hmm_parallel
from statseq.inference._backend import (
    backend_kind,
    use_parallel,  # noqa: F401 - re-exported
)


class TransitionRegression(NamedTuple):
    """Input-driven transitions ``A_t[i, :] = softmax(bias[i] + weights[i] @ u_t)``.

    Attributes:
        weights: ``(num_states, num_states, input_dim)``.
        bias: ``(num_states, num_states)``.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np, statseq as ss
        >>> from statseq.models.hmm import PoissonEmissions
        >>> model = ss.PoissonHMM(num_states=2, input_dim=1)
        >>> params = model.assemble_params(PoissonEmissions(rates=jnp.array([1.0, 5.0])))
        >>> type(params.transitions).__name__, params.transitions.weights.shape
        ('TransitionRegression', (2, 2, 1))
        >>> u = np.linspace(-1.0, 1.0, 5)[:, None]           # one covariate per step
        >>> model.transition_matrices(params, u).shape          # A_t for t = 2, ..., T
        (4, 2, 2)
    """

    weights: jax.Array
    bias: jax.Array


class HMMParams(NamedTuple):
    """Parameters of an HMM.

    Attributes:
        initial_probs: ``(num_states,)`` simplex, or ``None`` when ``initial="stationary"``.
        transitions: ``(num_states, num_states)`` row-stochastic matrix, or a
            `TransitionRegression` when the model has inputs.
        emissions: the emission family's parameters.

    Examples:
        >>> import jax.numpy as jnp, numpy as np, statseq as ss
        >>> from statseq.models.hmm import PoissonEmissions
        >>> params = ss.HMMParams(initial_probs=jnp.array([0.5, 0.5]),
        ...                       transitions=jnp.array([[0.9, 0.1], [0.2, 0.8]]),
        ...                       emissions=PoissonEmissions(rates=jnp.array([1.0, 8.0])))
        >>> y = np.array([0, 1, 0, 9, 7, 8, 1])
        >>> bool(ss.log_prob(ss.PoissonHMM(num_states=2), params, y) < 0)
        True
    """

    initial_probs: Any
    transitions: Any
    emissions: Any


class HMMCarry(NamedTuple):
    """``probs``: filtered ``p(z_{t-1} | y_{<t})``, or the initial law before any step.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> from statseq.models.hmm import PoissonEmissions
        >>> model = ss.PoissonHMM(num_states=2)
        >>> params = model.assemble_params(PoissonEmissions(rates=np.array([1.0, 5.0])))
        >>> carry = model.initial_carry(params)
        >>> carry.probs.shape, bool(carry.started)
        ((2,), False)
        >>> res = ss.filter(model, params, np.array([0, 3, 1]))
        >>> res.final_carry.probs.shape
        (2,)
    """

    probs: jax.Array
    started: jax.Array


def stationary_distribution(transition_matrix):
    """The stationary law ``pi = pi A`` of an irreducible row-stochastic matrix ``(K, K)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from statseq.models.hmm import stationary_distribution
        >>> pi = stationary_distribution(jnp.array([[0.9, 0.1], [0.2, 0.8]]))
        >>> [round(float(p), 4) for p in pi]                  # (2/3, 1/3)
        [0.6667, 0.3333]
    """
    k = transition_matrix.shape[-1]
    m = transition_matrix.T - jnp.eye(k, dtype=transition_matrix.dtype)
    m = m.at[-1].set(1.0)
    pi = jnp.linalg.solve(m, jnp.zeros((k,), m.dtype).at[-1].set(1.0))
    pi = jnp.clip(pi, 0.0, None)
    return pi / jnp.sum(pi)


def table_filter(initial_probs, transitions, log_likelihoods, mask, num_conditioned: int):
    """The step scan's per-step log-densities and last filtered probabilities of one
    sequence, by `statseq.inference.hmm.hmm_filter` on its emission table.

    ``log p(y_t | y_{<t}) = log sum_j p(z_t = j | y_{<t}) p(y_t | z_t = j)``, with the
    conditioned first ``num_conditioned`` steps and the fully masked steps scoring exactly 0
    (their table rows are 0, so they do not condition the state either).

    Args:
        initial_probs: ``(K,)``.
        transitions: ``(K, K)`` or ``(T - 1, K, K)``.
        log_likelihoods: ``(T, K)``, 0 rows where masked or conditioned.
        mask: ``(T,)`` or ``(T, ...)`` booleans (a step counts as observed when any entry is).
        num_conditioned: leading steps conditioned on rather than scored.

    Returns:
        ``(log_probs (T,), filtered probabilities after the last step (K,))``.

    Examples:
        >>> import jax.numpy as jnp
        >>> lp, last = table_filter(jnp.array([0.5, 0.5]), jnp.eye(2),
        ...                         jnp.log(jnp.array([[0.2, 0.6], [0.1, 0.3]])),
        ...                         jnp.array([True, True]), 0)
        >>> [round(float(v), 4) for v in jnp.exp(lp)], [round(float(v), 4) for v in last]
        ([0.4, 0.25], [0.1, 0.9])
    """
    num_timesteps = log_likelihoods.shape[0]
    filt = hmm_seq.hmm_filter(initial_probs, transitions, log_likelihoods)
    observed = jnp.any(jnp.reshape(mask, (num_timesteps, -1)), axis=1)
    scored = observed & (jnp.arange(num_timesteps) >= num_conditioned)
    return jnp.where(scored, filt.log_normalizers, 0.0), filt.filtered_probs[-1]


def last_lags(y, observed, num_lags: int, dtype):
    """The lag window a step scan holds after the last step of ``y``: ``(lags, count)``
    with ``lags[i] = y_{T-1-i}`` (masked entries 0, zeros before the data) for ``i <
    num_lags`` and ``count = min(T, num_lags)``.

    Args:
        y: ``(T,) + event_shape``.
        observed: booleans of ``y``'s shape.
        num_lags: the window length.
        dtype: the window's dtype.

    Returns:
        ``(lags (num_lags,) + event_shape, count int32)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> lags, count = last_lags(jnp.array([1.0, 2.0, 3.0]),
        ...                         jnp.array([True, False, True]), 4, jnp.float32)
        >>> lags.tolist(), int(count)
        ([3.0, 0.0, 1.0, 0.0], 3)
    """
    y_in = jnp.where(observed, y, 0).astype(dtype)
    window = jnp.concatenate([jnp.zeros((num_lags,) + y.shape[1:], dtype), y_in])
    return window[::-1][:num_lags], jnp.minimum(y.shape[0], num_lags).astype(jnp.int32)


#: on CPU, the public filter (``log_prob``; `HMMBase.masked_data_filter`) runs on the
#: emission table from this many steps, indexed by "two states or fewer and no inputs":
#: `benchmarks/diag_hmm_table_threshold.py` (2-core CPU, float64, quiet, 17:19 UTC Nov 27;
#: both forms of the public PoissonHMM ``log_prob`` in one process, interleaved rounds),
#: table / step scan, paired median (ratio of minima): with inputs K = 2, 4, 8, 16 at
#: T = 128 0.75 (0.62), 0.59 (0.59), 0.81 (0.89), 1.14 (0.94), at T = 10^3 0.21, 0.26, 0.59,
#: 0.73 (the step scan's loop computes a softmax and a dot a step: ~0.9 us); without inputs
#: K = 4, 8, 16 at T = 128 0.55, 0.94, 0.57, at 10^3 0.22, 0.62, 0.39; K = 2 at 512 1.49
#: (1.27), at 10^3 0.77 (0.68); at T = 64 the step scan wins but for K = 16
TABLE_FILTER_MIN_STEPS = {False: 128, True: 1000}


class HMMBase(SequenceModel):
    """Shared machinery of every HMM family; subclasses implement the emission methods.

    Subclass fields must include ``num_states``, ``initial`` (``"free"`` or
    ``"stationary"``) and ``input_dim`` (0 for fixed transitions).

    Examples:
        >>> import jax, statseq as ss
        >>> from statseq.models.hmm import HMMBase
        >>> y = ss.datasets.load_earthquakes().to_numpy()
        >>> model = ss.PoissonHMM(num_states=2)
        >>> isinstance(model, HMMBase)
        True
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> post = model.smoother(params, y)                 # shared by every HMM family
        >>> model.most_likely_states(params, y).shape == y.shape
        True
    """

    supports_partial_mask: ClassVar[bool] = True
    #: reported by fits in ``FitResult.on_boundary`` without a warning: from one sequence the
    #: maximum-likelihood initial distribution is always a vertex of the simplex
    expected_boundary_params: ClassVar[tuple[str, ...]] = ("initial_probs",)
    num_states: int
    initial: str
    input_dim: int

    def _check_hmm_config(self):
        check_positive_int(self.num_states, "num_states")
        check_positive_int(self.input_dim, "input_dim", minimum=0)
        if self.initial not in ("free", "stationary"):
            raise ValueError(f"initial must be 'free' or 'stationary', got {self.initial!r}")
        if self.initial == "stationary" and self.input_dim:
            raise ValueError(
                "initial='stationary' needs fixed transitions; with input-driven transitions "
                "use initial='free'"
            )

    # ---- emission interface (per family) ---------------------------------------------
    @abc.abstractmethod
    def emission_shapes(self) -> Any:
        """Shapes of the emission parameters (a NamedTuple of tuples)."""

    @abc.abstractmethod
    def emission_constraints(self) -> Any:
        """numpyro constraints of the emission parameters."""

    @abc.abstractmethod
    def emission_log_likelihoods(self, emissions, y_t, mask_t):
        """``(num_states,)`` ``log p(observed y_t | z_t = k)``; 0 where nothing is observed."""

    def emissions_surely_finite(self, emissions) -> bool:
        """Whether ``log p(y_t | z_t = k)`` is finite for every state and every valid
        observation under these (concrete, validated) emission parameters.

        When it is, and the initial and transition probabilities are all positive, no
        sequence can have probability zero, and the posteriors skip their eager check of
        the log-likelihood (`_surely_possible`). ``False`` (always check) unless a family
        states otherwise.

        Args:
            emissions: the emission parameters.

        Returns:
            ``True`` only when no observation can score ``-inf`` in any state.
        """
        return False

    def data_surely_finite(self, emissions, y, mask) -> bool:
        """Whether ``log p(y_t | z_t = k)`` is finite for every state and step of these
        (concrete, prepared) data: `emissions_surely_finite` unless a family's densities
        are finite only for bounded data (Gaussian emissions: `GaussianHMM`,
        `LinearAutoregressiveHMM`).

        Args:
            emissions: the emission parameters.
            y: the prepared data ``(N, T, ...)`` (a device array; read back once).
            mask: their mask.

        Returns:
            ``True`` only when no entry of the emission table can be ``-inf``.
        """
        return self.emissions_surely_finite(emissions)

    @abc.abstractmethod
    def emission_distribution(self, emissions):
        """numpyro distribution with ``batch_shape == (num_states,)`` (for sampling)."""

    def emission_suff_stats(self, y, mask, weights):  # pragma: no cover - per family
        """Weighted sufficient statistics for the M-step (``weights``: ``(N, T, K)``)."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form emission M-step")

    def emission_m_step(self, emissions, stats, prior):  # pragma: no cover - per family
        """Closed-form (MAP) emission update from the summed statistics."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form emission M-step")

    # ---- parameters -------------------------------------------------------------------
    def param_shapes(self) -> HMMParams:
        k = self.num_states
        if self.input_dim:
            transitions = TransitionRegression((k, k, self.input_dim), (k, k))
        else:
            transitions = (k, k)
        initial = (k,) if self.initial == "free" else None
        return HMMParams(initial, transitions, self.emission_shapes())

    def param_constraints(self) -> HMMParams:
        if self.input_dim:
            transitions = TransitionRegression(constraints.real, constraints.real)
        else:
            transitions = constraints.simplex
        initial = constraints.simplex if self.initial == "free" else None
        return HMMParams(initial, transitions, self.emission_constraints())

    def num_redundant_params(self, free) -> int:
        """Input-driven transitions are a softmax regression per row ``i``: adding a
        constant to ``bias[i, :]`` (or to ``weights[i, :, m]``) leaves ``A_t[i, :]``
        unchanged, so each fully free group counts ``K - 1`` entries, not ``K``: ``K (1 +
        input_dim)`` redundant parameters (``K = 2``, one input: 8 logits, 4 identified).
        """
        if not self.input_dim:
            return 0
        from statseq.core.params import all_free

        k, flags = self.num_states, free.transitions
        bias = np.broadcast_to(np.asarray(flags.bias, bool), (k, k))
        weights = np.broadcast_to(np.asarray(flags.weights, bool), (k, k, self.input_dim))
        return sum(all_free(bias[i]) for i in range(k)) + sum(
            all_free(weights[i, :, j]) for i in range(k) for j in range(self.input_dim))

    def initial_probs(self, params):
        """``p(z_1)``: the free initial law, or the stationary law of the transitions."""
        if self.initial == "stationary":
            return stationary_distribution(params.transitions)
        return params.initial_probs

    def transition_matrix(self, params, inputs_t):
        """``(K, K)`` transition matrix into the step whose inputs are ``inputs_t``."""
        if self.input_dim:
            reg = params.transitions
            return jax.nn.softmax(reg.bias + reg.weights @ inputs_t, axis=-1)
        return params.transitions

    def transition_matrices(self, params, inputs):
        """Transitions for one sequence: ``(K, K)`` if fixed, else ``(T - 1, K, K)``."""
        if self.input_dim:
            return jax.vmap(lambda u: self.transition_matrix(params, u))(inputs[1:])
        return params.transitions

    def default_transitions(self, stickiness: float = 0.9):
        """A sticky matrix: ``stickiness`` on the diagonal, the rest spread evenly."""
        k, dtype = self.num_states, float_dtype()
        if k == 1:
            return jnp.ones((1, 1), dtype)
        off = (1.0 - stickiness) / (k - 1)
        # NumPy in the same dtype gives the same values without five small programs
        eye = np.eye(k, dtype=dtype)  # and a transfer (device_put), not a cast program
        return jax.device_put(np.full((k, k), off, dtype)
                              + np.asarray(stickiness - off, dtype) * eye)

    def assemble_params(self, emissions, transitions=None, initial_probs=None) -> HMMParams:
        """Params from emission parameters, with sticky transitions and a uniform start."""
        k, dtype = self.num_states, float_dtype()
        if transitions is None:
            if self.input_dim:
                transitions = TransitionRegression(
                    jnp.zeros((k, k, self.input_dim), dtype),
                    jnp.log(self.default_transitions()),
                )
            else:
                transitions = self.default_transitions()
        if self.initial == "free" and initial_probs is None:
            initial_probs = jnp.full((k,), 1.0 / k, dtype)
        if self.initial == "stationary":
            initial_probs = None
        return HMMParams(initial_probs, transitions, emissions)

    def default_priors(self, y=None, mask=None, *, scale=1.0) -> HMMParams:
        """Model-specific Bayesian defaults (`statseq.bayes.default_priors` fills ``None``).

        The initial law and fixed transition rows keep the generic uniform Dirichlet priors;
        input-driven transitions get ``Normal(0, 1)`` weights and ``Normal(0, 2)`` biases on
        the logit scale (the generic prior for real leaves follows the observation
        ``scale``, not logits). Emission families may add their own. ``y`` and ``mask``
        are accepted for backward compatibility and not used.
        """
        del y, mask, scale
        transitions = None
        if self.input_dim:
            k, dtype = self.num_states, float_dtype()
            transitions = TransitionRegression(
                dist.Normal(jnp.zeros((k, k, self.input_dim), dtype), 1.0),
                dist.Normal(jnp.zeros((k, k), dtype), 2.0),
            )
        return HMMParams(None, transitions, None)

    # ---- the filter -------------------------------------------------------------------
    def initial_carry(self, params) -> HMMCarry:
        return HMMCarry(self.initial_probs(params), jnp.zeros((), bool))

    def _predicted(self, params, carry, inputs_t):
        moved = carry.probs @ self.transition_matrix(params, inputs_t)
        return jnp.where(carry.started, moved, carry.probs)

    def mixture(self, state_probs, emissions):
        """The predictive ``sum_k state_probs[..., k] p(y | theta_k)`` as a distribution.

        ``state_probs`` may carry batch axes. Families whose mixture has a closed form
        of the same family (categorical) override this. For a scalar (or length-1)
        observation the mixture has a ``cdf`` (``sum_k w_k F_k(y)``) and an ``icdf``
        (bisection on the cdf): a `statseq.core.distributions.FiniteMixture`.
        """
        comp = self.emission_distribution(emissions)
        comp = comp.expand(state_probs.shape[:-1] + comp.batch_shape)
        return FiniteMixture(dist.Categorical(probs=state_probs), comp)

    def predict(self, params, carry, inputs_t):
        return self.mixture(self._predicted(params, carry, inputs_t), params.emissions)

    def step(self, params, carry, y_t, mask_t, inputs_t):
        predicted = self._predicted(params, carry, inputs_t)
        ll = self.emission_log_likelihoods(params.emissions, y_t, mask_t)
        shift = jax.lax.stop_gradient(jnp.max(ll))
        shift = jnp.where(jnp.isfinite(shift), shift, 0.0)  # all states impossible
        joint = predicted * jnp.exp(ll - shift)
        norm = jnp.sum(joint)
        # data impossible under the model: log p = -inf at this step (not NaN), and the
        # predicted message carries on so that later steps stay finite
        possible = norm > 0
        new = HMMCarry(jnp.where(possible, joint / jnp.where(possible, norm, 1.0), predicted),
                       jnp.ones((), bool))
        # a fully masked step scores exactly 0 (not log of a sum that rounds near 1)
        return jnp.where(jnp.any(mask_t), jnp.log(norm) + shift, 0.0), new

    def update(self, params, carry, y_t, mask_t, inputs_t) -> HMMCarry:
        return self.step(params, carry, y_t, mask_t, inputs_t)[1]

    def filters_on_the_table(self, num_timesteps: int) -> bool:
        """Whether `masked_data_filter` filters the ``(T, K)`` emission table (`log_likelihoods`)
        rather than scoring step by step: on CPU from `TABLE_FILTER_MIN_STEPS` steps (the
        emission table and, with inputs, the ``(T - 1, K, K)`` transition matrices made
        in one vectorized pass before the loop; the step scan's loop computes each step's
        softmax and emission density), elsewhere where the filter runs by sweeps
        (`statseq.inference.hmm.use_sweeps`). Families whose per-step emission density is
        costly (`GaussianHMM` with full or tied covariances) filter the table always."""
        if backend_kind() == "cpu":
            small = not self.input_dim and self.num_states <= 2
            return num_timesteps >= TABLE_FILTER_MIN_STEPS[small]
        return hmm_seq.use_sweeps(num_timesteps)

    def masked_data_filter(self, params, num_timesteps: int):
        """``(y, mask, inputs) -> (log_probs (T,), final carry)`` for one sequence by
        `statseq.inference.hmm.hmm_filter` on the emission table where
        `filters_on_the_table` (by default where the filter runs by sweeps: CPU, long
        sequences), else ``None`` (the per-step `step` scan runs). The same log-densities
        (masked steps exactly 0) and
        final carry as the `step` scan to rounding (tested); derivatives are the
        sequential filter's. Families with their own `step` (autoregressive emissions)
        keep theirs. `filters_on_the_table` says where it applies."""
        if self._own_step() or not self.filters_on_the_table(num_timesteps):
            return None

        def run(y, mask, inputs):
            log_probs, last = table_filter(self.initial_probs(params),
                                           self.transition_matrices(params, inputs),
                                           self.log_likelihoods(params, y, mask), mask,
                                           self.num_conditioned_steps)
            return log_probs, self._carry_after(last, y, mask)

        return run

    def _own_step(self) -> bool:
        """Whether this family's `step` or `initial_carry` is its own, which
        `masked_data_filter` then leaves to the step scan (unless the family says how)."""
        return type(self).step is not HMMBase.step or (
            type(self).initial_carry is not HMMBase.initial_carry)

    def _carry_after(self, filtered_last, y, mask):
        """The `step` scan's final carry, given the last filtered probabilities."""
        return HMMCarry(filtered_last, jnp.ones((), bool))

    # ---- posterior inference (adapters over statseq.inference.hmm) ---------------------
    def log_likelihoods(self, params, y, mask):
        """``(T, K)`` emission log-likelihoods of one sequence (0 rows where masked)."""
        return jax.vmap(lambda y_t, m_t: self.emission_log_likelihoods(params.emissions, y_t,
                                                                       m_t))(y, mask)

    def _posterior_inputs(self, params, y, mask, inputs):
        data = prepare_data(self, y, mask, inputs)
        return data, self.initial_probs(params)

    def filter_states(self, params, y, *, mask=None, inputs=None, parallel=None):
        """Filtered (causal) state probabilities ``p(z_t | y_{<=t})`` and predicted ones.

        Returns:
            `statseq.inference.hmm.HMMFilterResult` with a leading batch shape
            when ``y`` is a batch.
        """
        return _remembered_posterior(self, params, y, mask, inputs, "filter",
                                     use_parallel(parallel))

    def smoother(self, params, y, *, mask=None, inputs=None, parallel=None):
        """Smoothed state probabilities ``p(z_t | y_{1:T})`` and expected transitions.

        Returns:
            `statseq.inference.hmm.HMMPosterior` (batch shape leading).
        """
        return _remembered_posterior(self, params, y, mask, inputs, "smoother",
                                     use_parallel(parallel))

    def most_likely_states(self, params, y, *, mask=None, inputs=None,
                           return_log_prob: bool = False):
        """The Viterbi path ``z* = argmax_z p(z_{1:T} | y_{1:T})``.

        Args:
            params: the model's parameters.
            y: ``batch_shape + (T,) + event_shape``.
            mask: optional observation mask.
            inputs: covariates, when the model takes them.
            return_log_prob: also return the path's log joint
                ``log p(y_{1:T}, z*_{1:T}) = max_z log p(y, z)`` (masked steps contribute
                only their transitions; subtract `statseq.log_prob` for ``log p(z* | y)``).

        Returns:
            ``batch_shape + (T,)`` ints, or ``(states, log_joint)`` with ``log_joint`` of
            shape ``batch_shape`` when ``return_log_prob``.
        """
        return _remembered_posterior(self, params, y, mask, inputs, "viterbi", False,
                                     with_log_prob=bool(return_log_prob))

    def sample_states_posterior(self, params, y, *, key, num_samples=1, mask=None,
                                inputs=None):
        """Draws of whole state paths from ``p(z_{1:T} | y_{1:T})`` (forward filter,
        backward sample): ``(num_samples,) + batch_shape + (T,)`` ints."""
        check_key(key)
        from statseq.core.params import validate_params

        validate_params(self, params)
        num_samples = check_positive_int(num_samples, "num_samples")
        data = prepare_data(self, y, mask, inputs)
        _check_possible(_hmm_posterior(self, params, data.y, data.mask, data.inputs,
                                       kind="filter", parallel=False).marginal_log_lik,
                        "sample_states_posterior")
        keys = jax.random.split(key, num_samples)
        paths = jax.vmap(
            lambda k: _hmm_sample_paths(self, params, data.y, data.mask, data.inputs, k)
        )(keys)
        return jnp.reshape(paths, (num_samples,) + data.batch_shape + (data.num_timesteps,))

    def predict_states(self, params, y, *, num_steps, mask=None, inputs=None,
                       future_inputs=None):
        """Exact h-step-ahead state distributions ``p(z_{T+h} | y_{1:T})``.

        Returns:
            ``batch_shape + (num_steps, num_states)``.
        """
        num_steps = check_positive_int(num_steps, "num_steps")
        filt = self.filter_states(params, y, mask=mask, inputs=inputs)
        last = filt.filtered_probs[..., -1, :]
        if self.input_dim:
            if future_inputs is None:
                raise ValueError("this HMM has input-driven transitions: pass future_inputs")
            u = jnp.asarray(future_inputs, float_dtype())
            mats = jax.vmap(lambda u_t: self.transition_matrix(params, u_t))(u)

            def run(p):
                return jax.lax.scan(lambda c, a: (c @ a, c @ a), p, mats)[1]

            flat = last.reshape(-1, self.num_states)
            return jax.vmap(run)(flat).reshape(last.shape[:-1] + (num_steps, self.num_states))
        flat = last.reshape(-1, self.num_states)
        probs = jax.vmap(
            lambda p: hmm_seq.hmm_predict_states(p, params.transitions, num_steps)
        )(flat)
        return probs.reshape(last.shape[:-1] + (num_steps, self.num_states))

    def predict_observations(self, params, y, *, num_steps, mask=None, inputs=None,
                             future_inputs=None):
        """Exact marginal predictive of each future ``y_{T+h}``: a finite mixture.

        Returns:
            A numpyro distribution (a finite mixture) with batch shape
            ``batch_shape + (num_steps,)``.
        """
        probs = self.predict_states(params, y, num_steps=num_steps, mask=mask, inputs=inputs,
                                    future_inputs=future_inputs)
        return self.mixture(probs, params.emissions)

    # ---- EM -----------------------------------------------------------------------------
    def e_step(self, params, y, mask, inputs):
        """Expected sufficient statistics over a flat batch ``(N, T, ...)``.

        Returns:
            ``(stats, log_prob)`` where ``log_prob`` is the total marginal log-likelihood
            of the batch at ``params``.
        """
        def one(y_s, m_s, u_s):
            ll = self.log_likelihoods(params, y_s, m_s)
            # the latent steps after a sequence's last observation (its padding) are
            # marginalized out: they add no transition counts (and a sequence with no
            # observation adds no initial-state count), so a padded ragged batch takes the
            # EM path of its sequences fitted at their own lengths
            post = hmm_seq.hmm_smoother(
                self.initial_probs(params), self.transition_matrices(params, u_s), ll,
                sum_transitions=not self.input_dim,
                transition_weights=hmm_seq.trailing_transition_weights(m_s))
            return post

        post = vmap_or_one(one)(y, mask, inputs)
        seen = jnp.reshape(mask, mask.shape[:2] + (-1,)).any(axis=(1, 2))
        stats = {
            "initial": jnp.sum(post.smoothed_probs[:, 0] * seen[:, None], axis=0),
            "transitions": post.expected_transitions,  # (N, K, K) or (N, T-1, K, K)
            "weights": post.smoothed_probs,
            "emissions": self.emission_suff_stats(y, mask, post.smoothed_probs),
            # the data, for `expected_log_joint` (and the inputs of GLM transitions)
            "y": y, "mask": mask, "inputs": inputs,
        }
        return stats, jnp.sum(post.marginal_log_lik)

    #: `fit_em` may pass boolean arrays (per-entry trainable masks) to `m_step`
    m_step_entry_masks: ClassVar[bool] = True
    #: emission fields whose closed-form M-step is exact under per-entry masks (the update
    #: of each entry depends on its own statistics only, or the family's
    #: `emission_m_step_masked` solves the constrained problem); a partial mask on any other
    #: field makes `fit_em` add accepted gradient steps on `expected_log_joint`
    exact_masked_emission_fields: ClassVar[tuple[str, ...]] = ()

    def expected_log_joint(self, params, stats):
        """The expected complete-data log-likelihood ``Q`` under the posterior that produced
        ``stats`` (`e_step`):

            Q = sum_k g_1(k) log pi_k + sum_t sum_ij xi_t(i, j) log A_t[i, j]
                + sum_t sum_k g_t(k) log p(y_t | z_t = k)

        with the smoothed marginals ``g_t`` and pair marginals ``xi_t`` of `e_step`
        (``pi`` the stationary law of ``A`` for ``initial="stationary"``). The emission term
        is `emission_expected_log_lik`. `fit_em` maximizes it over tied entries and
        entries whose masked closed-form M-step is not exact (a generalized M-step); the
        closed-form `m_step` is its maximizer. Missing observations are marginalized in
        the emission term (not treated as latent), which makes ``Q`` a valid EM minorant
        of the log-likelihood as well.
        """
        out = _xlogp(stats["initial"], self.initial_probs(params))
        if self.input_dim:
            reg = params.transitions
            logs = jax.vmap(jax.vmap(
                lambda u: jax.nn.log_softmax(reg.bias + reg.weights @ u, axis=-1)
            ))(stats["inputs"][:, 1:])
            out = out + jnp.sum(stats["transitions"] * logs)
        else:
            out = out + _xlogp(jnp.sum(stats["transitions"], axis=0), params.transitions)
        return out + self.emission_expected_log_lik(params, stats)

    def emission_expected_log_lik(self, params, stats):
        """``sum_n sum_t sum_k g_nt(k) log p(y_nt | z = k)`` from the smoothed weights and
        the data (families may override it with their sufficient statistics)."""
        ll = jax.vmap(lambda y_s, m_s: self.log_likelihoods(params, y_s, m_s))(
            stats["y"], stats["mask"])
        w = stats["weights"]
        return jnp.sum(jnp.where(w > 0, w * ll, 0.0))

    def emission_m_step_masked(self, emissions, stats, prior, trainable):
        """The emission M-step given per-entry masks ``trainable`` (a pytree like
        ``emissions`` of boolean arrays, possibly traced): fields in
        ``exact_masked_emission_fields`` keep their fixed entries, any other field with a
        fixed entry keeps its old value (`fit_em` then takes gradient steps on it)."""
        new = self.emission_m_step(emissions, stats, prior)
        names = getattr(type(emissions), "_fields", ())
        out = []
        for i, (n, o, t) in enumerate(zip(new, emissions, trainable, strict=True)):
            t = jnp.asarray(t, bool)
            if names and names[i] not in self.exact_masked_emission_fields:
                t = jnp.all(t)
            out.append(jnp.where(t, n, o))
        return type(emissions)(*out)

    def m_step_exact(self, trainable) -> bool:
        """Whether `m_step` with the (NumPy) masks ``trainable`` is exact (no gradient steps
        needed in `fit_em`): per-entry masks only on the initial law, fixed transitions and
        the ``exact_masked_emission_fields``."""
        em = trainable.emissions
        names = getattr(type(em), "_fields", ())
        for name, t in zip(names, em, strict=True):
            arr = np.asarray(t)
            if arr.ndim and not (arr.all() or not arr.any()) and (
                    name not in self.exact_masked_emission_fields):
                return False
        return True

    def m_step(self, params, stats, priors, inputs, trainable=None):
        """Closed-form (MAP) updates; generalized (gradient) steps where none exists.

        ``trainable`` (a pytree like ``params`` of booleans or boolean arrays, as `fit_em`
        passes it) fixes entries: a simplex row's free entries share the mass its fixed
        entries leave, in proportion to their expected counts (plus prior pseudo-counts),
        the constrained maximizer; input-driven transitions take gradient steps on their
        free entries only; emissions follow `emission_m_step_masked`.
        """
        from statseq.core.params import log_prior
        from statseq.fit.em import constrained_dirichlet_map, generalized_m_step

        prior = priors if priors is not None else HMMParams(None, None, None)
        tr = trainable if trainable is not None else jax.tree.map(
            lambda _: True, params, is_leaf=lambda x: x is None)
        if trainable is None:
            emissions = self.emission_m_step(params.emissions, stats["emissions"],
                                             prior.emissions)
        else:
            emissions = self.emission_m_step_masked(params.emissions, stats["emissions"],
                                                    prior.emissions, tr.emissions)
        initial_probs = None
        if self.initial == "free":
            initial_probs = constrained_dirichlet_map(
                stats["initial"], prior.initial_probs, params.initial_probs,
                tr.initial_probs)
        if self.input_dim:
            counts = stats["transitions"]  # (N, T-1, K, K)
            free = jax.tree.map(lambda t, p: jnp.broadcast_to(jnp.asarray(t, bool), p.shape),
                                tr.transitions, params.transitions)

            def held(reg):
                return jax.tree.map(jnp.where, free, reg, params.transitions)

            def q(reg):
                reg = held(reg)
                mats = jax.vmap(jax.vmap(
                    lambda u: jax.nn.log_softmax(reg.bias + reg.weights @ u, axis=-1)
                ))(inputs[:, 1:])
                return jnp.sum(counts * mats) + log_prior(prior.transitions, reg)

            transitions = held(generalized_m_step(q, params.transitions))
        else:
            counts = jnp.sum(stats["transitions"], axis=0)
            free = jnp.broadcast_to(jnp.asarray(tr.transitions, bool),
                                    params.transitions.shape)
            transitions = constrained_dirichlet_map(counts, prior.transitions,
                                                    params.transitions, free)
            if self.initial == "stationary":
                gamma0 = stats["initial"]
                rest = 1.0 - jnp.sum(jnp.where(free, 0.0, params.transitions), axis=-1,
                                     keepdims=True)

                def rows(logits):  # the free entries share the mass the fixed ones leave
                    logits = logits - jax.lax.stop_gradient(jnp.max(
                        jnp.where(free, logits, -jnp.inf), axis=-1, keepdims=True,
                        initial=-jnp.inf))
                    e = jnp.where(free, jnp.exp(jnp.where(free, logits, 0.0)), 0.0)
                    total = jnp.sum(e, axis=-1, keepdims=True)
                    return jnp.where(free, rest * (e / jnp.where(total > 0, total, 1.0)),
                                     params.transitions)

                def q(logits):
                    a = rows(logits)
                    pi = stationary_distribution(a)
                    return (_xlogp(counts, a) + _xlogp(gamma0, pi)
                            + _log_dirichlet(prior.transitions, a))

                def logits_of(a):
                    return jnp.where(free, jnp.log(jnp.where(free, jnp.clip(a, 1e-300, None),
                                                             1.0)), 0.0)

                old = logits_of(params.transitions)
                cand = logits_of(transitions)
                start = jnp.where(q(cand) >= q(old), cand, old)
                transitions = rows(generalized_m_step(q, start))
        return HMMParams(initial_probs, transitions, emissions)

    #: Transition-matrix families for ``initialize(..., transitions=...)``; `fit_restarts`
    #: cycles through them so random starts cover persistent and switching regimes.
    transition_starts: ClassVar[tuple[str, ...]] = (
        "uniform", "anti_persistent", "dirichlet", "sticky")

    def initialize(self, y: Any, *, key: jax.Array, inputs: Any = None, mask: Any = None,
                   method: str = "data", transitions: str | None = None) -> HMMParams:
        """Starting parameters: every block (transitions, initial law, emissions).

        ``method="data"``: emissions fitted to the data (quantiles, k-means with k-means++
        seeding, least squares; see the family's ``initialize_emissions``), a sticky
        transition matrix (0.9 on the diagonal) and a uniform initial law.
        ``method="random"``: emissions from random data points (k-means++ seeds, random
        subsets), a random transition matrix and an initial law
        ``pi = (1/K + Dirichlet(1)) / 2``. The rows of the transition matrix are drawn
        from the family ``transitions`` (when ``None``, a family drawn from ``key`` for
        ``"random"``, ``"sticky"`` for ``"data"``):

        * ``"sticky"``: rows ``Dirichlet(alpha)`` with ``alpha_ii = 9 (K - 1)``,
          ``alpha_ij = 1`` (mean diagonal 0.9): persistent regimes;
        * ``"uniform"``: every entry ``1 / K`` (the start that does not presume anything
          about persistence);
        * ``"dirichlet"``: rows ``Dirichlet(1)`` (uniform on the simplex);
        * ``"anti_persistent"``: ``alpha_ii = 0.5``, ``alpha_ij = 2`` (mean diagonal
          ``0.5 / (0.5 + 2 (K - 1))``, below ``1 / K``): regimes that switch more often
          than they stay.

        Drawn entries are kept at least ``1e-3`` (then renormalized): EM never moves a
        probability away from exactly 0. Input-driven transitions start with zero weights
        and biases ``log A``. `statseq.fit_restarts` cycles its random starts through
        ``transition_starts``.

        Args:
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            key: a ``jax.random`` key.
            inputs: covariates, when the model has input-driven transitions.
            mask: optional observation mask.
            method: ``"data"`` or ``"random"``.
            transitions: ``None`` or one of ``"sticky"``, ``"uniform"``, ``"dirichlet"``,
                ``"anti_persistent"``.

        Returns:
            `HMMParams`.

        Examples:
            >>> import jax, statseq as ss
            >>> y = ss.datasets.load_earthquakes().to_numpy()
            >>> model = ss.PoissonHMM(num_states=3)
            >>> p = model.initialize(y, key=jax.random.key(1), method="random",
            ...                      transitions="anti_persistent")
            >>> bool(jax.numpy.all(jax.numpy.diag(p.transitions) < 1 / 3))
            True
        """
        check_key(key)
        if method not in ("data", "random"):
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        if transitions is not None and transitions not in _TRANSITION_FAMILIES:
            raise ValueError(f"transitions must be None or one of {_TRANSITION_FAMILIES}, "
                             f"got {transitions!r}")
        data = prepare_data(self, y, mask, inputs)
        if method == "data" and transitions is None:
            # the default: no split keys are used (splitting would cost two small programs)
            return self.assemble_params(self.initialize_emissions(
                np.asarray(data.y), np.asarray(data.mask), key=key, method=method))
        k_emit, k_trans, k_family, k_init = jax.random.split(key, 4)
        emissions = self.initialize_emissions(
            np.asarray(data.y), np.asarray(data.mask), key=key if method == "data" else k_emit,
            method=method,
        )
        if transitions is None:
            transitions = _TRANSITION_FAMILIES[
                int(jax.random.randint(k_family, (), 0, len(_TRANSITION_FAMILIES)))]
        k, dtype = self.num_states, float_dtype()
        matrix = random_transition_matrix(k, transitions, np.random.default_rng(
            np.asarray(jax.random.randint(k_trans, (2,), 0, 2**31 - 1))))
        initial_probs = None
        if method == "random":
            draw = np.asarray(jax.random.dirichlet(k_init, np.ones(k)), float)
            initial_probs = jnp.asarray(0.5 / k + 0.5 * draw, dtype)
        if self.input_dim:
            trans = TransitionRegression(jnp.zeros((k, k, self.input_dim), dtype),
                                         jnp.asarray(np.log(matrix), dtype))
        else:
            trans = jnp.asarray(matrix, dtype)
        return self.assemble_params(emissions, trans, initial_probs)

    @abc.abstractmethod
    def initialize_emissions(self, y, mask, *, key, method):
        """Emission parameters from a flat batch of data (numpy arrays)."""

    def em_state_masses(self, stats, mask):
        """``(K,)`` posterior mass of each state on the observed, scored steps, from the
        statistics of `e_step` (traced: `fit_em` keeps the last E-step's masses in its
        loop, so the warnings need no second E-step)."""
        observed = jnp.reshape(mask, mask.shape[:2] + (-1,)).any(axis=-1)
        observed = observed.at[:, : self.num_conditioned_steps].set(False)
        return jnp.sum(jnp.where(observed[..., None], stats["weights"], 0.0), axis=(0, 1))

    def em_warnings(self, params, y, mask, inputs, masses=None) -> list[str]:
        """Warnings about the fitted parameters (states that lost their mass); ``masses``
        from `em_state_masses` when the caller has them (else one E-step at ``params``)."""
        if masses is not None:
            return mass_messages(np.asarray(masses), "observed steps")
        return mass_warnings(self, params, y, mask, inputs)


_TRANSITION_FAMILIES = ("sticky", "uniform", "dirichlet", "anti_persistent")


def random_transition_matrix(num_states: int, family: str,
                             rng: np.random.Generator) -> np.ndarray:
    """A ``(K, K)`` row-stochastic start from ``family`` (see `HMMBase.initialize`).

    Args:
        num_states: ``K``.
        family: ``"sticky"``, ``"uniform"``, ``"dirichlet"`` or ``"anti_persistent"``.
        rng: a ``numpy.random.Generator``.

    Returns:
        NumPy ``(K, K)`` float64 array, rows summing to 1, entries ``>= 1e-3 / (1 + K 1e-3)``.
    """
    k = num_states
    if k == 1:
        return np.ones((1, 1))
    if family == "uniform":
        return np.full((k, k), 1.0 / k)
    eye = np.eye(k)
    if family == "sticky":
        alpha = 1.0 + (9.0 * (k - 1) - 1.0) * eye
    elif family == "dirichlet":
        alpha = np.ones((k, k))
    elif family == "anti_persistent":
        alpha = 2.0 - 1.5 * eye
    else:
        raise ValueError(f"family must be one of {_TRANSITION_FAMILIES}, got {family!r}")
    rows = np.stack([rng.dirichlet(a) for a in alpha])
    rows = np.maximum(rows, 1e-3)
    return rows / rows.sum(axis=1, keepdims=True)


def _xlogp(counts, probs):
    """``sum counts * log probs`` with ``0 log 0 = 0`` (and no NaN gradient there)."""
    pos = counts > 0
    return jnp.sum(jnp.where(pos, counts * jnp.log(jnp.where(pos, probs, 1.0)), 0.0))


def _log_dirichlet(prior, probs):
    if prior is None:
        return jnp.zeros((), probs.dtype)
    return jnp.sum(prior.log_prob(probs))


def _check_possible(marginal_log_lik, method: str) -> None:
    """``ValueError`` when some sequence has probability zero under the model (a posterior
    over states given impossible data is undefined; the filter scores it ``-inf``)."""
    if isinstance(marginal_log_lik, jax.core.Tracer):  # under a user's jit: nothing to check
        return
    # waiting first is cheaper than NumPy's own wait for a result still being computed
    lp = np.asarray(marginal_log_lik.block_until_ready()).reshape(-1)  # flat, as a batch
    if (lp == -np.inf).any():  # the method: no dispatch through np.any
        which = int(np.argwhere(lp == -np.inf)[0][0])
        raise ValueError(
            f"{method}: the data have probability zero under these parameters (sequence "
            f"{which} contains an observation impossible in every state, e.g. a category "
            "with emission probability 0); log_prob is -inf there and no state posterior "
            "exists")


def _surely_possible(model, params, data=None) -> bool:
    """Whether no sequence can have probability zero, so that `_check_possible` would never
    raise: every emission log-likelihood finite (`HMMBase.emissions_surely_finite`, or with
    prepared ``data`` `HMMBase.data_surely_finite`: also Gaussian emissions), every
    initial and transition probability at least ``1e6`` times the dtype's smallest normal
    number; input-driven transitions only where the data's inputs bound their softmax
    above that too (`_softmax_surely_above`: a softmax of large inputs can underflow to
    0). Then the predicted state probabilities stay positive, so the scaled normalizer
    ``sum_k alpha_k exp(ll_k - max_j ll_j)``, which has the term ``alpha_k* >= A_min / K``
    of the most likely state, is positive and the log-likelihood finite. Eager, on concrete
    parameters (a tracer gives ``False``)."""
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(params)):
        return False
    if model.num_inputs and (data is None or data.inputs is None
                             or isinstance(data.inputs, jax.core.Tracer)):
        return False
    pi = np.asarray(model.initial_probs(params))
    floor = np.finfo(np.asarray(jax.tree.leaves(params.transitions)[0]).dtype).tiny * 1e6
    if not np.all(pi >= floor):
        return False
    if model.num_inputs:
        if not _softmax_surely_above(params.transitions, data.inputs, floor):
            return False
    elif not np.all(np.asarray(params.transitions) >= floor):
        return False
    if data is None:
        return bool(model.emissions_surely_finite(params.emissions))
    if any(isinstance(a, jax.core.Tracer) for a in (data.y, data.mask)):
        return False
    return bool(model.data_surely_finite(params.emissions, data.y, data.mask))


def _softmax_surely_above(regression, inputs, floor) -> bool:
    """Whether every input-driven transition probability ``softmax(b_i + W_i u_t)_j`` of
    these (concrete) inputs is at least ``floor``: the logits of row ``i`` spread over at
    most ``max_j b_ij - min_j b_ij + 2 max_j ||W_ij||_1 max_t ||u_t||_inf``, and a softmax
    entry is at least ``exp(-spread) / K``; one more unit of the exponent covers the
    rounding of the logits and of the softmax."""
    weights = np.asarray(regression.weights, np.float64)
    bias = np.asarray(regression.bias, np.float64)
    u = np.asarray(inputs, np.float64)
    if not (np.all(np.isfinite(weights)) and np.all(np.isfinite(bias))
            and np.all(np.isfinite(u))):
        return False
    u_max = float(np.max(np.abs(u), initial=0.0))
    spread = (np.max(bias, axis=-1) - np.min(bias, axis=-1)
              + 2.0 * np.max(np.sum(np.abs(weights), axis=-1), axis=-1) * u_max)
    return bool(np.all(spread + 1.0 + np.log(bias.shape[-1]) <= -np.log(floor)))


def _checked(model, params, y, mask, inputs, *, bucket):
    """`validate_params` and `prepare_data`, remembered for arrays passed again
    (`statseq.core.recurrence.checked_data`): the prepared data."""
    from statseq.core.recurrence import checked_data

    return checked_data(model, params, y, mask, inputs, bucket=bucket, sized=False)[1]


def _posterior_call(model, params, data, *, kind, parallel):
    """`_hmm_posterior` on prepared data, batch shape restored, as one compiled call."""
    return _posterior_runner(model, params, data, kind=kind, parallel=parallel)()


def _posterior_runner(model, params, data, *, kind, parallel, pick=None):
    """`_posterior_call` as a callable of no arguments (`recurrence.reshaped_runner`);
    ``pick=0`` keeps the Viterbi states alone (their log joint is then not computed)."""
    from statseq.core.recurrence import device_args, reshaped_runner

    dynamic, fill = device_args(data, model.num_inputs)
    dynamic.update(params=params, num_valid=_num_valid(data))
    return reshaped_runner(_hmm_posterior, data.batch_shape, dynamic, fill, pick=pick,
                           model=model, kind=kind, parallel=parallel)


#: what each posterior cuts back to the real length after padding to a bucket length
_STEPS = {"filter": ("log_normalizers", "predicted_probs", "filtered_probs"),
          "smoother": ("filtered_probs", "smoothed_probs")}


def _remembered_posterior(model, params, y, mask, inputs, kind, parallel,
                          with_log_prob=True):
    """``filter_states``, ``smoother`` or ``most_likely_states`` (``kind="viterbi"``, never
    padded; ``with_log_prob``: the states and their log joint, else the states): checks,
    one compiled call, the probability-zero check; a repeat on the same arguments is one
    lookup and one dispatch (`statseq.core.recurrence.remembered`)."""
    from statseq.core.recurrence import remembered

    bucket = kind != "viterbi"  # statseq.core.buckets

    def build():
        data = _checked(model, params, y, mask, inputs, bucket=bucket)
        if kind == "filter" or _surely_possible(model, params, data):
            # nothing to check: no read-back of the result, which would wait for it (the
            # Viterbi path's log joint, a sum of finite logs, is then finite too)
            call = _posterior_runner(model, params, data, kind=kind, parallel=parallel,
                                     pick=0 if kind == "viterbi" and not with_log_prob
                                     else None)
            return call if data.num_valid is None else (
                lambda: _cut_padding(call(), data, _STEPS[kind]))
        call = _posterior_runner(model, params, data, kind=kind, parallel=parallel)

        def run():
            out = call()
            if kind == "viterbi":
                # the best path has probability zero exactly when the data have (every
                # path has)
                _check_possible(out[1], "most_likely_states")
                return out if with_log_prob else out[0]
            if kind == "smoother":
                _check_possible(out.marginal_log_lik, "smoother")
            return _cut_padding(out, data, _STEPS[kind])

        return run

    return remembered(("hmm", kind, parallel, with_log_prob), model, params, y, mask,
                      inputs, build, bucket=bucket)


def _num_valid(data):
    """The real length of a time axis padded to a bucket length (`statseq.core.buckets`)."""
    return None if data.num_valid is None else np.int32(data.num_valid)


def _cut_padding(result, data, steps, lags=()):
    if data.num_valid is None:
        return result
    from statseq.core.buckets import cut_steps

    return cut_steps(result, data.num_valid, len(data.batch_shape), steps=steps, lags=lags)


def _posterior_one(model, params, y, mask, inputs, kind, parallel, num_valid=None):
    ll = model.log_likelihoods(params, y, mask)
    pi = model.initial_probs(params)
    trans = model.transition_matrices(params, inputs)
    lib = hmm_parallel if parallel else hmm_seq
    if kind == "filter":
        return lib.hmm_filter(pi, trans, ll)
    if kind == "smoother":
        if num_valid is None:
            return lib.hmm_smoother(pi, trans, ll)
        # padded to a bucket length: the padded (masked) steps' transitions are not part
        # of the real sequence's expected transitions, so sum only the real ones
        post = lib.hmm_smoother(pi, trans, ll, sum_transitions=False)
        live = (jnp.arange(ll.shape[0] - 1) < num_valid - 1)[:, None, None]
        per = jnp.where(live, post.expected_transitions, 0.0)
        return post._replace(expected_transitions=pairwise_sum(jnp.moveaxis(per, 0, -1)))
    states = hmm_seq.hmm_viterbi(pi, trans, ll)
    return states, hmm_seq.hmm_path_log_prob(pi, trans, ll, states)


@partial(jax.jit, static_argnames=("model", "kind", "parallel"))
def _hmm_posterior(model, params, y, mask, inputs, num_valid=None, *, kind, parallel):
    return vmap_or_one(
        lambda y_s, m_s, u_s: _posterior_one(model, params, y_s, m_s, u_s, kind, parallel,
                                             num_valid)
    )(y, mask, inputs)


@partial(jax.jit, static_argnames=("model",))
def _hmm_sample_paths(model, params, y, mask, inputs, key):
    keys = jax.random.split(key, y.shape[0])

    def one(y_s, m_s, u_s, k):
        ll = model.log_likelihoods(params, y_s, m_s)
        return hmm_seq.hmm_posterior_sample(model.initial_probs(params),
                                            model.transition_matrices(params, u_s), ll, key=k)

    return vmap_or_one(one)(y, mask, inputs, keys)


def check_counts(y, mask, name: str = "y") -> None:
    """Eager check that the observed entries of ``y`` are non-negative integers."""
    observed = np.asarray(y)[np.asarray(mask, bool)]
    if observed.size and (np.any(observed < 0) or np.any(observed != np.round(observed))):
        bad = observed[(observed < 0) | (observed != np.round(observed))][0]
        raise ValueError(f"{name} must hold non-negative integer counts; found {bad}")


@partial(jax.jit, static_argnames=("model",))
def _e_step(model, params, y, mask, inputs):
    return model.e_step(params, y, mask, inputs)


def mass_warnings(model, params, y, mask, inputs) -> list[str]:
    """Messages for states that ended EM with (almost) no posterior mass."""
    from statseq.core.buckets import bound_cache

    bound_cache(_e_step)  # one program per length (fit_em): keep only the latest ones
    stats, _ = _e_step(model, params, y, mask, inputs)
    return mass_messages(np.asarray(model.em_state_masses(stats, jnp.asarray(mask))),
                         "observed steps")


def mass_messages(mass, steps: str) -> list[str]:
    """One message per state whose posterior ``mass`` is below ``1e-6`` of the total."""
    total = float(np.sum(mass))
    return [
        f"state {k} has almost no posterior mass on {steps} ({m:.3g} of "
        f"{total:.0f}): its emission parameters were kept at their previous values (or set "
        "to the prior mode when a prior is given); consider fewer states"
        for k, m in enumerate(mass) if m < 1e-6 * max(total, 1.0)
    ]
