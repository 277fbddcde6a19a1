"""Neural sequence models on the filter protocol: a recurrent backbone and an emission head.

A neural model is autoregressive: the network reads the previous observation (and the
covariates) and its emission head gives the predictive of the next one,

    x_t = [enc(y_{t-1}) * m_{t-1}, m_{t-1}, u_t],
    (s_t, h_t) = backbone(s_{t-1}, x_t),
    y_t | y_{<t}, u_{<=t} ~ head(h_t),

where ``m_{t-1}`` is the observed-indicator of ``y_{t-1}`` (per dimension; 0 before the
first step) and ``enc`` the head's encoding (`statseq.models.neural.heads.Head.encode`).
The filter's carry is ``(s_{t-1}, enc(y_{t-1}) * m_{t-1}, m_{t-1})``.

**Missing values.** A masked observation is not scored (its predictive log-density is
left out, or, for a vector, only its observed entries are scored) and the network is fed
the value 0 with observed-indicator 0 in its place: the model conditions on *which* values
were seen, not on imputed values. This is a modelling choice (the network learns what a
gap means), not exact marginalization as in an HMM or a Kalman filter: ``log_prob`` with
a mask is the likelihood of a *model of data with gaps*, not the marginal likelihood of the
observed values (``marginalizes_masked_steps`` is False). `statseq.estimate_log_prob`
estimates that marginal (a particle filter drawing the missing values from the network's
own predictive), and h-step-ahead marginal densities (`statseq.log_predictive_density`
with ``marginal=True``, `statseq.backtest`) are Monte Carlo estimates with standard errors.

A `Backbone` is a recurrent feature extractor (frozen dataclass of static configuration,
parameters kept outside); concrete models (`statseq.models.neural.rnn`) pair one with a
head chosen by the ``emission`` string.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from statseq.core.distributions import masked_log_prob
from statseq.core.model import SequenceModel
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.models.neural.heads import EMISSIONS, Head, make_head


class Backbone(abc.ABC):
    """A recurrent feature extractor ``(s_t, h_t) = f(s_{t-1}, x_t)``.

    Concrete backbones are frozen dataclasses of static configuration with an
    ``input_dim`` (size of ``x_t``) and an ``output_dim`` (size of ``h_t``). Parameters are
    a pytree kept outside, described by `param_shapes` / `param_constraints`.

    Whole sequences go through `scan` (default: ``lax.scan`` of `step`); a backbone with
    a faster whole-sequence algorithm (hoisted input projections, an associative scan)
    overrides `scan`, which must also return the final state. `sequence` drops it.

    Examples:
        >>> import jax, jax.numpy as jnp, statseq as ss
        >>> backbone = ss.GRU(hidden_dim=4).backbone        # a GRU cell stack
        >>> params = backbone.init_params(jax.random.key(0))
        >>> hs = backbone.sequence(params, jnp.zeros((6, backbone.input_dim)))
        >>> hs.shape == (6, backbone.output_dim)
        True
    """

    input_dim: int

    @property
    @abc.abstractmethod
    def output_dim(self) -> int:
        """Size of the feature vector ``h_t``."""

    @abc.abstractmethod
    def param_shapes(self) -> Any:
        """A pytree of shape tuples."""

    @abc.abstractmethod
    def param_constraints(self) -> Any:
        """A pytree of numpyro constraints (``constraints.real`` for weights)."""

    @abc.abstractmethod
    def init_params(self, key) -> Any:
        """Random initial parameters."""

    @abc.abstractmethod
    def initial_state(self, params) -> Any:
        """The state before the first input."""

    @abc.abstractmethod
    def step(self, params, state, x_t):
        """One step: ``x_t`` of shape ``(input_dim,)`` -> ``(new_state, h_t)``."""

    def scan(self, params, state, xs):
        """Run from ``state`` over ``xs`` ``(T, input_dim)``: ``(final_state, hs (T, F))``."""
        return jax.lax.scan(lambda s, x: self.step(params, s, x), state, xs)

    def scan_time_major(self, params, state, xs):
        """Run a batch: ``state`` with leaves ``(N, ...)``, ``xs`` ``(T, N, input_dim)`` ->
        ``(final_state (N, ...), hs (T, N, F))``.

        Default: `scan` vmapped over the batch. A backbone whose `scan` handles a batch
        directly (one scan with ``(N, H)`` states, batched weight gradients) overrides it.
        """
        return jax.vmap(self.scan, in_axes=(None, 0, 1), out_axes=(0, 1))(params, state, xs)

    def scan_from_start(self, params, xs):
        """`scan` from `initial_state`: ``(final_state, hs (T, F))``. A backbone with a
        cheaper form when it knows the state is the initial one (the Transformer's ``T x T``
        attention) overrides it."""
        return self.scan(params, self.initial_state(params), xs)

    def scan_time_major_from_start(self, params, xs):
        """`scan_time_major` of a batch ``xs`` ``(T, N, input_dim)`` from `initial_state`
        (the path of ``log_prob`` and ``fit_sgd`` on complete data)."""
        num = xs.shape[1]
        state0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (num,) + a.shape),
                              self.initial_state(params))
        return self.scan_time_major(params, state0, xs)

    def sequence(self, params, xs):
        """Features ``hs`` of shape ``(T, output_dim)`` for inputs ``xs`` ``(T, input_dim)``
        from the initial state."""
        return self.scan_from_start(params, xs)[1]


def backbone_config(backbone: Backbone) -> dict[str, Any]:
    """A backbone as a JSON-friendly dict: ``{"type": class name, **dataclass fields}``
    (how a model's `config` saves a backbone it holds; `backbone_from_config` inverts it).

    Args:
        backbone: a statseq `Backbone` (a frozen dataclass).

    Examples:
        >>> import statseq as ss
        >>> from statseq.models.neural.base import backbone_config
        >>> backbone = ss.GRU(hidden_dim=4, input_dim=1).backbone
        >>> config = backbone_config(backbone)
        >>> config["type"], config["hidden_dim"]
        ('RNNBackbone', 4)
        >>> ss.DeepStateSpace(input_dim=3, backbone=config).backbone == backbone  # rebuilt
        True
    """
    return {"type": type(backbone).__name__, **dataclasses.asdict(backbone)}


def backbone_from_config(config: dict) -> Backbone:
    """The statseq backbone saved as ``{"type": class name, **fields}`` by `backbone_config`.

    Args:
        config: the dict `backbone_config` wrote (its ``type`` names the class).

    Raises:
        ValueError: ``type`` names no statseq backbone class.
    """
    import statseq.models.neural  # noqa: F401 - defines every backbone class

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    kinds = {c.__name__: c for c in subclasses(Backbone) if dataclasses.is_dataclass(c)}
    kind = config.get("type")
    if kind not in kinds:
        raise ValueError(f"unknown backbone type {kind!r} (known: {sorted(kinds)})")
    return kinds[kind](**{k: v for k, v in config.items() if k != "type"})


class NeuralParams(NamedTuple):
    """Parameters of a neural sequence model.

    Attributes:
        backbone: the backbone's parameter pytree.
        head: the emission head's parameters (`statseq.models.neural.heads.HeadParams`
            or a variant with ``df`` / ``concentration``).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.GRU(hidden_dim=4)
        >>> params = model.initialize(np.sin(np.arange(20.0)), key=jax.random.key(0))
        >>> type(params).__name__, params._fields
        ('NeuralParams', ('backbone', 'head'))
    """

    backbone: Any
    head: Any


class NeuralCarry(NamedTuple):
    """Filter state: the backbone state and the encoded previous observation.

    Attributes:
        state: backbone state after ``x_{1:t-1}``.
        prev: ``[enc(y_{t-1}) * m_{t-1}, m_{t-1}]``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.ElmanRNN(hidden_dim=3)
        >>> params = model.initialize(np.zeros(10), key=jax.random.key(0))
        >>> carry = model.initial_carry(params)
        >>> carry._fields, carry.prev.shape             # prev: y_{t-1} and its observed flag
        (('state', 'prev'), (2,))
    """

    state: Any
    prev: jax.Array


@dataclasses.dataclass(frozen=True)
class NeuralSequenceModel(SequenceModel):
    """Base of the neural models: ``y_t ~ head(h_t)``, ``h_t = backbone(x_{1:t})``.

    Subclasses add their architecture's fields and a `backbone` property built from them
    (with ``input_dim=self.backbone_input_dim``).

    A missing value is read as 0 plus an observed-indicator of 0 (a model of data with
    gaps), so ``marginalizes_masked_steps`` is False: the marginal likelihood of data with
    gaps is estimated by `statseq.estimate_log_prob` and h-step marginal densities by
    Monte Carlo, each with its standard error.

    Args:
        emission: the head: ``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"`` or ``"categorical"``.
        emission_dim: ``None`` for a scalar series, else the number of dimensions ``D``.
        num_classes: number of classes for ``emission="categorical"`` (else ``None``).
        input_dim: number of covariates ``u_t`` (0 for none).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> from statseq.models.neural import NeuralSequenceModel
        >>> model = ss.LSTM(hidden_dim=4, emission="student_t")
        >>> isinstance(model, NeuralSequenceModel), type(model.head).__name__
        (True, 'StudentTHead')
        >>> y = np.sin(np.arange(20.0))
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> ss.filter(model, params, y).log_probs.shape
        (20,)
        >>> model.marginalizes_masked_steps          # a gap is an indicator, not integrated
        False
    """

    emission: str = "gaussian"
    emission_dim: int | None = None
    num_classes: int | None = None
    input_dim: int = 0

    supports_partial_mask = True
    # a masked step is read as 0 plus an indicator (a model of data with gaps), not
    # marginalized: h-step marginals and gap likelihoods are Monte Carlo estimates
    marginalizes_masked_steps = False

    def __post_init__(self):
        if self.emission not in EMISSIONS:
            raise ValueError(f"emission must be one of {EMISSIONS}, got {self.emission!r}")
        if self.emission_dim is not None:
            check_positive_int(self.emission_dim, "emission_dim")
        check_positive_int(self.input_dim, "input_dim", minimum=0)
        self.head  # noqa: B018 - validates emission_dim / num_classes eagerly

    # ---- architecture -------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def backbone(self) -> Backbone:
        """The recurrent feature extractor (built from the model's fields)."""

    @property
    @abc.abstractmethod
    def feature_dim(self) -> int:
        """Size of the backbone's output ``h_t`` (what the head reads)."""

    @property
    def head(self) -> Head:
        """The emission head."""
        return make_head(self.emission, feature_dim=self.feature_dim,
                         emission_dim=self.emission_dim, num_classes=self.num_classes)

    @property
    def encoded_dim(self) -> int:
        """Size of the encoded previous observation with its indicators."""
        head = self.head
        return head.encoded_dim + head.indicator_dim

    @property
    def backbone_input_dim(self) -> int:
        """Size of ``x_t``: the encoded previous observation, indicators, covariates."""
        return self.encoded_dim + self.input_dim

    # ---- static description -----------------------------------------------------------
    @property
    def event_shape(self) -> tuple[int, ...]:
        return self.head.event_shape

    @property
    def observation_dtype(self) -> str:
        return self.head.observation_dtype

    def param_shapes(self) -> NeuralParams:
        return NeuralParams(self.backbone.param_shapes(), self.head.param_shapes())

    def param_constraints(self) -> NeuralParams:
        return NeuralParams(self.backbone.param_constraints(), self.head.param_constraints())

    def validate_data(self, y, mask) -> None:
        self.head.validate(y, mask)

    def num_redundant_params(self, free) -> int:
        """A categorical head is a softmax regression ``softmax(W h + b)`` on the features:
        adding a constant to ``b`` (or to one column of ``W``) changes no probability, so a
        fully free bias and each fully free column count ``C - 1`` entries: ``F + 1``
        redundant parameters. The networks' other weight symmetries are not subtracted
        (see `statseq.num_free_params`)."""
        from statseq.core.params import all_free

        if self.head.observation_dtype != "category" or self.emission != "categorical":
            return 0
        flags = free.head
        weight = np.broadcast_to(np.asarray(flags.weight, bool),
                                 (self.head.num_outputs, self.feature_dim))
        return int(all_free(flags.bias)) + sum(
            all_free(weight[:, j]) for j in range(self.feature_dim))

    def initialize(self, y, *, key, inputs=None, mask=None) -> NeuralParams:
        """Random backbone weights; head bias from the data (mean and log-scale, log mean
        count, logits of frequencies), small random readout weights.

        Args:
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            key: a ``jax.random`` key.
            inputs: covariates (checked, unused).
            mask: optional observation mask.

        Returns:
            `NeuralParams`.
        """
        check_key(key)
        data = prepare_data(self, y, mask, inputs)
        k_backbone, k_head = jax.random.split(key)
        return NeuralParams(
            self.backbone.init_params(k_backbone),
            self.head.init_params(k_head, np.asarray(data.y), np.asarray(data.mask)),
        )

    def default_priors(self, y=None, mask=None, *, scale=1.0) -> NeuralParams:
        """Bayesian defaults for the weights (`statseq.bayes.default_priors` fills ``None``).

        The priors are on a fixed observation scale ``c = scale`` (default 1: standardized
        real data) and never look at the values of ``y``. The generic prior for real
        leaves, ``Normal(0, 2 max(1, c))``, is on the data scale, not that of tanh/sigmoid
        units, so instead:

        * recurrent layers (``ElmanRNN``, ``GRU``, ``LSTM``): every gate weight
          ``Normal(0, 1 / sqrt(I + H))`` with ``I + H`` the gate's fan-in (input and
          recurrent), so a pre-activation of inputs of unit scale has variance about 1;
          for real-valued data the first layer reads ``y_{t-1}`` unstandardized, so its
          weights on ``y_{t-1, d}`` get scale ``1 / (c sqrt(I + H))`` (those on the
          indicator ``m_{t-1, d}`` keep ``1 / sqrt(I + H)``); biases ``Normal(0, 1)``;
        * the head's readout weights ``Normal(0, 2 a / sqrt(F))`` (``F`` features in
          ``(-1, 1)``; ``a = max(1, c)`` for real data, ``a = 1`` on the log/logit scale
          of counts and categories).

        The head's biases keep the generic prior (centred at 0: centre real data), as do
        the negative binomial ``concentration`` and the Mamba and LRU backbones (whose
        log-parametrized decay rates are not centred at 0: pass your own priors there);
        the Student-t ``df`` has no default (pass a prior on it).

        Args:
            y: accepted for backward compatibility; its values are not used.
            mask: accepted for backward compatibility; not used.
            scale: the observation scale ``c`` (a positive number).

        Returns:
            `NeuralParams` of numpyro distributions (``None`` where the generic table
            applies).

        Examples:
            >>> import statseq as ss
            >>> priors = ss.GRU(hidden_dim=3).default_priors()
            >>> round(float(priors.backbone[0].w_rec.scale[0, 0]), 4)  # 1 / sqrt(2 + 3)
            0.4472
        """
        from statseq.bayes.priors import check_prior_scale
        from statseq.models.neural.cells import RNNBackbone

        del y, mask  # the values of the data never set the prior
        c = check_prior_scale(scale)
        dtype, head = float_dtype(), self.head
        real = head.observation_dtype == "real"
        a = max(1.0, c) if real else 1.0
        shapes = head.param_shapes()
        head_priors = type(shapes)(*([None] * len(shapes)))._replace(
            weight=dist.Normal(jnp.zeros(tuple(shapes.weight), dtype),
                               2.0 * a / np.sqrt(self.feature_dim)))
        backbone = self.backbone
        if not isinstance(backbone, RNNBackbone):
            return NeuralParams(None, head_priors)
        layers = []
        for layer, shape in enumerate(backbone.param_shapes()):
            fan_in = shape.w_in[1] + backbone.hidden_dim
            g = 1.0 / np.sqrt(fan_in)
            scale_in = np.full(shape.w_in[1], g)
            if layer == 0 and real:
                scale_in[:head.dim] = g / c
            layers.append(type(shape)(
                dist.Normal(jnp.zeros(shape.w_in, dtype),
                            jnp.broadcast_to(jnp.asarray(scale_in, dtype), shape.w_in)),
                dist.Normal(jnp.zeros(shape.w_rec, dtype), g),
                dist.Normal(jnp.zeros(shape.bias, dtype), 1.0),
                dist.Normal(jnp.zeros(shape.bias_rec, dtype), 1.0),
            ))
        return NeuralParams(tuple(layers), head_priors)

    # ---- the filter ---------------------------------------------------------------------
    def initial_carry(self, params) -> NeuralCarry:
        dtype = jax.tree.leaves(params.head)[0].dtype
        return NeuralCarry(self.backbone.initial_state(params.backbone),
                           jnp.zeros((self.encoded_dim,), dtype))

    def _advance(self, params, carry, inputs_t):
        x_t = jnp.concatenate([carry.prev, jnp.asarray(inputs_t, carry.prev.dtype)])
        return self.backbone.step(params.backbone, carry.state, x_t)

    def predict(self, params, carry, inputs_t):
        _, h = self._advance(params, carry, inputs_t)
        return self.head.distribution(params.head, h)

    def update(self, params, carry, y_t, mask_t, inputs_t) -> NeuralCarry:
        state, _ = self._advance(params, carry, inputs_t)
        return NeuralCarry(state, self.head.encode(y_t, mask_t))

    def step(self, params, carry, y_t, mask_t, inputs_t):
        """Predict, score and update with one backbone step."""
        state, h = self._advance(params, carry, inputs_t)
        lp = masked_log_prob(self.head.distribution(params.head, h), y_t, mask_t)
        return lp, NeuralCarry(state, self.head.encode(y_t, mask_t))

    def complete_data_log_probs(self, params, y, inputs):
        """Per-step log-densities of one fully observed sequence (`complete_data_log_probs_batch`
        on a batch of one).

        Returns:
            ``(log_probs (T,), final_carry)``.
        """
        log_probs, final = self.complete_data_log_probs_batch(params, y[None], inputs[None])
        return log_probs[0], jax.tree.map(lambda a: a[0], final)

    def complete_data_log_probs_batch(self, params, y, inputs):
        """Per-step log-densities of a batch of fully observed sequences, time-major inside.

        The inputs ``x_{1:T}`` (shifted encoded observations and covariates) of every
        sequence are built at once as a ``(T, N, input_dim)`` array, the backbone runs over
        the whole batch (`Backbone.scan_time_major`: for the recurrent cells one scan whose
        recurrent products are ``(N, H)`` matrix products), and the head scores every step
        in one call. Equal to the step-by-step filter (a test checks this in float64).

        Args:
            params: `NeuralParams`.
            y: ``(N, T) + event_shape`` observations (nothing masked).
            inputs: ``(N, T, input_dim)`` covariates.

        Returns:
            ``(log_probs (N, T), final_carry)`` with carry leaves ``(N, ...)``.
        """
        head, backbone = self.head, self.backbone
        y_tm = jnp.swapaxes(y, 0, 1)  # (T, N, *event)
        enc = jax.vmap(jax.vmap(head.encode))(y_tm, jnp.ones(y_tm.shape, bool))  # (T, N, E)
        prev = jnp.concatenate([jnp.zeros_like(enc[:1]), enc[:-1]], axis=0)
        xs = jnp.concatenate([prev, jnp.swapaxes(inputs, 0, 1).astype(enc.dtype)], axis=-1)
        final, hs = backbone.scan_time_major_from_start(params.backbone, xs)
        log_probs = head.distribution(params.head, hs).log_prob(y_tm)  # (T, N)
        return log_probs.T, NeuralCarry(final, enc[-1])
