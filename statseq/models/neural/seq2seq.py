"""Encoder-decoder (sequence-to-sequence) models on the filter protocol.

An `EncoderDecoder` models a future ``y_{1:T'}`` given a past ``x_{1:T}`` (the source)
through the encoder's summary of the past,

    (s^E_t, c_t) = encoder(s^E_{t-1}, [enc(x_t) * m_t, m_t, u_t]),    t = 1, ..., T,
    s^D_0 = s^E_T (when the two state pytrees match, else the decoder's initial state),
    (s^D_k, h_k) = decoder(s^D_{k-1}, [enc(y_{k-1}) * m_{k-1}, m_{k-1}, u_{T+k}, c_T]),
    y_k | y_{<k}, x_{1:T} ~ head(h_k),                                   k = 1, ..., T',

with ``y_0 = x_T``, ``c_T`` the encoder's last output features (the *context*, fed to every
decoder step, so any pair of backbones works) and ``u`` covariates, which the decoder
reads over the horizon (known future covariates). The likelihood is

    p(y_{1:T'} | x_{1:T}) = prod_k p(y_k | y_{<k}, c_T, s^E_T).

**On the filter protocol** a carry holds both states and a ``decoding`` flag. ``update``
in *encoding* mode advances the encoder (the one-step predictive of the next value is the
decoder's first step from the encoder's state, so `statseq.log_prob` of a series is the
sum of its 1-step seq2seq predictives); ``sample_step`` (and, once ``context_length``
steps were read, ``update``) advances the decoder with the encoder frozen. So
`statseq.forecast` (encoder over the history, then ancestral sampling from the decoder),
`statseq.backtest` and its scores take an `EncoderDecoder` as any other model. With
``context_length=C`` a window of ``C + T'`` steps is scored (``scored`` = its last ``T'``
steps) as the teacher-forced seq2seq likelihood: train it with `statseq.fit_sgd` on such
windows (`EncoderDecoder.windows` cuts them), and forecast with the same parameters.

Decoding: `EncoderDecoder.teacher_forced_log_probs` (the decoder over a whole target with
one `Backbone.scan`), `EncoderDecoder.greedy_decode` (the mode at each step),
`EncoderDecoder.beam_search` (categorical heads) and ancestral sampling through
`statseq.forecast`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from statseq.core.model import SequenceModel
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.models.neural.base import Backbone, NeuralSequenceModel
from statseq.models.neural.heads import EMISSIONS, Head, make_head


@dataclasses.dataclass(frozen=True)
class IdentityBackbone(Backbone):
    """The stateless identity backbone ``h_t = x_t`` (no parameters).

    As an `EncoderDecoder` decoder it makes the head a linear readout of
    ``[enc(y_{k-1}), m_{k-1}, u_{T+k}, c_T]``: a linear (Gaussian: AR(1)-like) decoder
    whose forecast mean has a closed form.

    Args:
        input_dim: size of ``x_t`` (also ``output_dim``).

    Examples:
        >>> import jax.numpy as jnp
        >>> b = IdentityBackbone(input_dim=3)
        >>> b.step(None, b.initial_state(None), jnp.arange(3.0))[1].tolist()
        [0.0, 1.0, 2.0]
    """

    input_dim: int = 1

    @property
    def output_dim(self) -> int:
        return self.input_dim

    def param_shapes(self):
        return None

    def param_constraints(self):
        return None

    def init_params(self, key):
        del key
        return None

    def initial_state(self, params):
        del params
        return ()

    def step(self, params, state, x_t):
        del params
        return state, x_t


class EncoderDecoderParams(NamedTuple):
    """Parameters of an `EncoderDecoder`.

    Attributes:
        encoder: the encoder backbone's parameter pytree.
        decoder: the decoder backbone's parameter pytree.
        head: the emission head's parameters (read by the decoder's features).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.EncoderDecoder(encoder=ss.ElmanRNN(hidden_dim=3))
        >>> params = model.initialize(np.zeros(10), key=jax.random.key(0))
        >>> params._fields
        ('encoder', 'decoder', 'head')
    """

    encoder: Any
    decoder: Any
    head: Any


class EncoderDecoderCarry(NamedTuple):
    """Filter state of an `EncoderDecoder`.

    Attributes:
        encoder: encoder state after the source values read so far.
        context: the encoder's last output features ``c`` (``(F_enc,)``).
        decoder: decoder state (from the encoder's state while encoding).
        prev: ``[enc(y) * m, m]`` of the last value read.
        decoding: whether updates advance the decoder (encoder frozen).
        t: number of values read.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.EncoderDecoder(encoder=ss.ElmanRNN(hidden_dim=3))
        >>> params = model.initialize(np.zeros(10), key=jax.random.key(0))
        >>> carry = model.encode_source(params, np.zeros(4))   # ready to decode
        >>> bool(carry.decoding), int(carry.t), carry.context.shape
        (True, 4, (3,))
    """

    encoder: Any
    context: jax.Array
    decoder: Any
    prev: jax.Array
    decoding: jax.Array
    t: jax.Array


def _same_structure(a, b) -> bool:
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    return ta == tb and all(np.shape(x) == np.shape(y) for x, y in zip(la, lb, strict=True))


def _mode(d):
    """The mode of a head's predictive (greedy decoding), per element of the event."""
    base = d.base_dist if isinstance(d, dist.Independent) else d
    if isinstance(base, dist.CategoricalLogits):
        return jnp.argmax(base.logits, axis=-1)
    if isinstance(base, dist.BernoulliLogits):
        return (base.logits > 0).astype(jnp.int32)
    if isinstance(base, (dist.Normal, dist.StudentT)):
        return base.loc
    if isinstance(base, dist.Poisson):
        return jnp.floor(base.rate)
    if isinstance(base, dist.GammaPoisson):  # NegativeBinomial2(mean, concentration)
        r, mean = base.concentration, base.concentration / base.rate
        return jnp.where(r > 1, jnp.floor(mean * (r - 1) / r), 0.0)
    raise TypeError(f"no mode for a {type(base).__name__} predictive")  # pragma: no cover


@dataclasses.dataclass(frozen=True)
class EncoderDecoder(SequenceModel):
    """Encoder-decoder: ``p(y_{1:T'} | x_{1:T}) = prod_k p(y_k | y_{<k}, h^E_T)``.

    The encoder reads the source ``x_{1:T}`` (with its covariates); its final state
    initializes the decoder (when the state pytrees match, e.g. the same architecture
    and size; always, its last features ``c_T`` are fed to every decoder step), which
    reads its own previous value and the future covariates (module docstring)::

        (s^D_k, h_k) = decoder(s^D_{k-1}, [enc(y_{k-1}), m_{k-1}, u_{T+k}, c_T]),
        y_k ~ head(h_k).

    Args:
        encoder: a neural model (``ss.GRU(hidden_dim=8)``, ``ss.Transformer(...)``, any
            `NeuralSequenceModel`) whose backbone is used (its emission and
            ``input_dim`` are replaced by this model's), or a `Backbone` (its
            ``input_dim`` is replaced). Default ``GRU(hidden_dim=16)``.
        decoder: the same for the decoder (default: the encoder's kind).
        emission: the head, as for every neural model (`statseq.models.neural.heads`).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a ``"categorical"`` head.
        input_dim: covariates ``u_t`` read by the encoder (history) and the decoder
            (horizon: `statseq.forecast` needs ``future_inputs``).
        context_length: ``None`` (the decoder runs only when sampling), or ``C``: the
            filter switches to decoding after ``C`` values, so a window of ``C + T'``
            values scored on its last ``T'`` is the teacher-forced likelihood (training).

    Shapes: source ``(T,) + event_shape``, target ``(T',) + event_shape``, covariates
    ``(T, input_dim)`` / ``(T', input_dim)``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.EncoderDecoder(encoder=ss.GRU(hidden_dim=4))
        >>> y = np.sin(np.arange(30.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> model.teacher_forced_log_probs(params, y[:20], y[20:]).shape
        (10,)
        >>> ss.forecast(model, params, y, num_steps=5, num_samples=8,
        ...             key=jax.random.key(1)).samples.shape
        (8, 5)
    """

    encoder: Any = None
    decoder: Any = None
    emission: str = "gaussian"
    emission_dim: int | None = None
    num_classes: int | None = None
    input_dim: int = 0
    context_length: int | None = None

    supports_partial_mask = True
    marginalizes_masked_steps = False  # a gap is read as 0 plus an indicator

    def __post_init__(self):
        if self.emission not in EMISSIONS:
            raise ValueError(f"emission must be one of {EMISSIONS}, got {self.emission!r}")
        if self.emission_dim is not None:
            check_positive_int(self.emission_dim, "emission_dim")
        check_positive_int(self.input_dim, "input_dim", minimum=0)
        if self.context_length is not None:
            check_positive_int(self.context_length, "context_length")
        for name in ("encoder", "decoder"):
            part = getattr(self, name)
            if part is not None and not isinstance(part, (NeuralSequenceModel, Backbone)):
                raise TypeError(f"{name} must be a neural model (e.g. ss.GRU(hidden_dim=8)) "
                                f"or a Backbone, got {type(part).__name__}")
        self.head  # noqa: B018 - validates emission_dim / num_classes eagerly

    # ---- architecture -------------------------------------------------------------------
    def _build(self, part, input_dim: int) -> Backbone:
        if part is None:
            from statseq.models.neural.rnn import GRU

            part = GRU(hidden_dim=16)
        if isinstance(part, Backbone):
            return dataclasses.replace(part, input_dim=input_dim)
        # the template's backbone reads [enc(y), m, u]: give it our head and input_dim - E
        template = dataclasses.replace(part, emission=self.emission,
                                       emission_dim=self.emission_dim,
                                       num_classes=self.num_classes,
                                       input_dim=input_dim - self.encoded_dim)
        return template.backbone

    @functools.cached_property
    def encoded_dim(self) -> int:
        """Size of an encoded value with its observed-indicators."""
        head = make_head(self.emission, feature_dim=1, emission_dim=self.emission_dim,
                         num_classes=self.num_classes)
        return head.encoded_dim + head.indicator_dim

    @functools.cached_property
    def encoder_backbone(self) -> Backbone:
        """The encoder: reads ``[enc(x_t), m_t, u_t]``."""
        return self._build(self.encoder, self.encoded_dim + self.input_dim)

    @functools.cached_property
    def decoder_backbone(self) -> Backbone:
        """The decoder: reads ``[enc(y_{k-1}), m_{k-1}, u_{T+k}, c_T]``."""
        part = self.decoder if self.decoder is not None else self.encoder
        return self._build(part, self.encoded_dim + self.input_dim
                           + self.encoder_backbone.output_dim)

    @functools.cached_property
    def head(self) -> Head:
        """The emission head (reads the decoder's features)."""
        return make_head(self.emission, feature_dim=self.decoder_backbone.output_dim,
                         emission_dim=self.emission_dim, num_classes=self.num_classes)

    @functools.cached_property
    def shares_state(self) -> bool:
        """Whether the decoder starts from the encoder's final state (same pytree)."""
        enc, dec = self.encoder_backbone, self.decoder_backbone
        return _same_structure(
            jax.eval_shape(lambda: enc.initial_state(enc.init_params(jax.random.key(0)))),
            jax.eval_shape(lambda: dec.initial_state(dec.init_params(jax.random.key(0)))))

    # ---- static description -----------------------------------------------------------
    @property
    def event_shape(self) -> tuple[int, ...]:
        return self.head.event_shape

    @property
    def observation_dtype(self) -> str:
        return self.head.observation_dtype

    def config(self) -> dict[str, Any]:
        """Not available yet: the encoder and decoder are models, not JSON values, and the
        model is not registered, so `statseq.save` cannot write it (a clear error)."""
        raise TypeError("EncoderDecoder cannot be saved with statseq.save yet (its encoder "
                        "and decoder are models); save its parameter leaves with numpy")

    def param_shapes(self) -> EncoderDecoderParams:
        return EncoderDecoderParams(self.encoder_backbone.param_shapes(),
                                    self.decoder_backbone.param_shapes(),
                                    self.head.param_shapes())

    def param_constraints(self) -> EncoderDecoderParams:
        return EncoderDecoderParams(self.encoder_backbone.param_constraints(),
                                    self.decoder_backbone.param_constraints(),
                                    self.head.param_constraints())

    def validate_data(self, y, mask) -> None:
        self.head.validate(y, mask)

    def initialize(self, y, *, key, inputs=None, mask=None) -> EncoderDecoderParams:
        """Random backbone weights and a head bias matching the data's marginal law.

        Args:
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            key: a ``jax.random`` key.
            inputs: covariates (checked, unused).
            mask: optional observation mask.

        Returns:
            `EncoderDecoderParams`.
        """
        check_key(key)
        data = prepare_data(self, y, mask, inputs)
        k_enc, k_dec, k_head = jax.random.split(key, 3)
        return EncoderDecoderParams(
            self.encoder_backbone.init_params(k_enc),
            self.decoder_backbone.init_params(k_dec),
            self.head.init_params(k_head, np.asarray(data.y), np.asarray(data.mask)),
        )

    # ---- the filter ---------------------------------------------------------------------
    def _decoder_start(self, params, enc_state):
        if self.shares_state:
            return enc_state
        return self.decoder_backbone.initial_state(params.decoder)

    def initial_carry(self, params) -> EncoderDecoderCarry:
        dtype = jax.tree.leaves(params.head)[0].dtype
        enc = self.encoder_backbone.initial_state(params.encoder)
        return EncoderDecoderCarry(
            enc, jnp.zeros((self.encoder_backbone.output_dim,), dtype),
            self._decoder_start(params, enc), jnp.zeros((self.encoded_dim,), dtype),
            jnp.zeros((), bool), jnp.zeros((), jnp.int32))

    def _decoder_input(self, carry, inputs_t):
        dtype = carry.prev.dtype
        return jnp.concatenate([carry.prev, jnp.asarray(inputs_t, dtype), carry.context])

    def predict(self, params, carry, inputs_t):
        _, h = self.decoder_backbone.step(params.decoder, carry.decoder,
                                          self._decoder_input(carry, inputs_t))
        return self.head.distribution(params.head, h)

    def _encode_step(self, params, carry, y_t, mask_t, inputs_t) -> EncoderDecoderCarry:
        enc = self.head.encode(y_t, mask_t)
        x = jnp.concatenate([enc, jnp.asarray(inputs_t, enc.dtype)])
        state, h = self.encoder_backbone.step(params.encoder, carry.encoder, x)
        return EncoderDecoderCarry(state, h.astype(carry.context.dtype),
                                   self._decoder_start(params, state), enc, carry.decoding,
                                   carry.t + 1)

    def _decode_step(self, params, carry, y_t, mask_t, inputs_t) -> EncoderDecoderCarry:
        state, _ = self.decoder_backbone.step(params.decoder, carry.decoder,
                                              self._decoder_input(carry, inputs_t))
        return carry._replace(decoder=state, prev=self.head.encode(y_t, mask_t),
                              decoding=jnp.ones((), bool), t=carry.t + 1)

    def update(self, params, carry, y_t, mask_t, inputs_t) -> EncoderDecoderCarry:
        encoded = self._encode_step(params, carry, y_t, mask_t, inputs_t)
        decoded = self._decode_step(params, carry, y_t, mask_t, inputs_t)
        new = jax.tree.map(lambda d, e: jnp.where(carry.decoding, d, e), decoded, encoded)
        if self.context_length is None:
            return new._replace(decoding=carry.decoding)
        return new._replace(decoding=carry.decoding | (new.t >= self.context_length))

    def sample_step(self, params, carry, key, inputs_t):
        """Ancestral sampling beyond the source: draw ``y`` and advance the decoder.

        Returns:
            ``(y_t, carry)`` with the carry in decoding mode (the encoder frozen).
        """
        y_t = self.predict(params, carry, inputs_t).sample(key)
        full = jnp.ones(self.event_shape, bool)
        return y_t, self._decode_step(params, carry, y_t, full, inputs_t)

    # ---- seq2seq ------------------------------------------------------------------------
    def _series(self, values, name, *, allow_missing):
        arr = np.asarray(values)
        ndim = 1 + len(self.event_shape)
        if arr.ndim != ndim or arr.shape[1:] != self.event_shape or arr.shape[0] == 0:
            raise ValueError(f"{name} must have shape (num_steps,) + {self.event_shape} with "
                             f"num_steps >= 1, got {arr.shape}")
        arr = arr.astype(float)
        mask = np.isfinite(arr)
        if not allow_missing and not mask.all():
            raise ValueError(f"{name} contains NaN or infinite values")
        arr = np.where(mask, arr, 0.0)
        self.head.validate(arr, mask)
        dtype = jnp.int32 if self.emission == "categorical" else float_dtype()
        return jnp.asarray(arr, dtype), jnp.asarray(mask)

    def _covariates(self, inputs, num_steps, name):
        n = self.input_dim
        if n == 0:
            if inputs is not None:
                raise ValueError(f"{type(self).__name__} has input_dim=0, but {name} was given")
            return jnp.zeros((num_steps, 0), float_dtype())
        if inputs is None:
            raise ValueError(f"input_dim={n}: pass {name} of shape ({num_steps}, {n})")
        arr = np.asarray(inputs, float)
        if arr.shape != (num_steps, n):
            raise ValueError(f"{name} must have shape ({num_steps}, {n}) (one row per step), "
                             f"got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains non-finite values")
        return jnp.asarray(arr, float_dtype())

    def encode_source(self, params, source, *, source_inputs=None) -> EncoderDecoderCarry:
        """The carry after the encoder read ``source`` (NaN = missing), ready to decode.

        Args:
            params: `EncoderDecoderParams`.
            source: ``(T,) + event_shape``.
            source_inputs: ``(T, input_dim)`` covariates when ``input_dim > 0``.

        Returns:
            An `EncoderDecoderCarry` in decoding mode.
        """
        x, m = self._series(source, "source", allow_missing=True)
        u = self._covariates(source_inputs, x.shape[0], "source_inputs")
        return _encode_jit(self, params, x, m, u)

    def teacher_forced_log_probs(self, params, source, target, *, source_inputs=None,
                                 target_inputs=None):
        """``log p(y_k | y_{<k}, x_{1:T})`` for every target step, teacher-forced.

        The decoder runs over the whole shifted target ``[x_T, y_1, ..., y_{T'-1}]`` in
        one `Backbone.scan` (a parallel scan for the backbones that have one) and the head
        scores all steps at once; equal to the step-by-step filter (a test checks this).

        Args:
            params: `EncoderDecoderParams`.
            source: ``(T,) + event_shape`` (NaN = missing).
            target: ``(T',) + event_shape`` (fully observed).
            source_inputs: ``(T, input_dim)`` covariates.
            target_inputs: ``(T', input_dim)`` future covariates.

        Returns:
            ``(T',)`` log-densities; their sum is ``log p(y_{1:T'} | x_{1:T})``.
        """
        carry = self.encode_source(params, source, source_inputs=source_inputs)
        y, _ = self._series(target, "target", allow_missing=False)
        u = self._covariates(target_inputs, y.shape[0], "target_inputs")
        return _teacher_forced_jit(self, params, carry, y, u)

    def greedy_decode(self, params, source, *, num_steps, source_inputs=None,
                      future_inputs=None):
        """Greedy decoding: ``y_k = mode p(y_k | y_{<k}, x)`` fed back, ``k = 1..T'``.

        Args:
            params: `EncoderDecoderParams`.
            source: ``(T,) + event_shape``.
            num_steps: ``T'``.
            source_inputs: ``(T, input_dim)`` covariates.
            future_inputs: ``(T', input_dim)`` covariates over the horizon.

        Returns:
            ``(y (T',) + event_shape, log_prob)``: the path and its log-probability.
        """
        num_steps = check_positive_int(num_steps, "num_steps")
        carry = self.encode_source(params, source, source_inputs=source_inputs)
        u = self._covariates(future_inputs, num_steps, "future_inputs")
        return _greedy_jit(self, params, carry, u)

    def beam_search(self, params, source, *, num_steps, beam_width, source_inputs=None,
                    future_inputs=None):
        """Beam search for ``argmax_y p(y_{1:T'} | x)`` (scalar categorical heads).

        Keeps the ``beam_width`` most probable prefixes at each step. Width 1 is greedy
        decoding; width ``num_classes ** num_steps`` is exhaustive (exact argmax).

        Args:
            params: `EncoderDecoderParams`.
            source: ``(T,)`` categories.
            num_steps: ``T'``.
            beam_width: number of prefixes kept.
            source_inputs: ``(T, input_dim)`` covariates.
            future_inputs: ``(T', input_dim)`` covariates over the horizon.

        Returns:
            ``(sequences (beam_width, T'), log_probs (beam_width,))``, best first
            (``-inf`` for slots beyond the number of distinct prefixes).
        """
        if self.emission != "categorical":
            raise ValueError(f"beam_search needs a categorical head, not {self.emission!r}")
        num_steps = check_positive_int(num_steps, "num_steps")
        beam_width = check_positive_int(beam_width, "beam_width")
        carry = self.encode_source(params, source, source_inputs=source_inputs)
        u = self._covariates(future_inputs, num_steps, "future_inputs")
        return _beam_jit(self, params, carry, u, beam_width)

    def windows(self, y, *, horizon, stride=1, inputs=None):
        """Training windows for `statseq.fit_sgd` with ``context_length`` set.

        Window ``i`` is ``y[i*stride : i*stride + C + horizon]``; ``scored`` marks its last
        ``horizon`` steps, so ``fit_sgd(model, params, windows, scored=scored, ...)``
        maximizes the teacher-forced seq2seq likelihood of every (past, future) pair.

        Args:
            y: one series ``(T,) + event_shape``.
            horizon: ``T'``, the decoded steps per window.
            stride: steps between windows.
            inputs: ``(T, input_dim)`` covariates.

        Returns:
            ``(windows, scored, window_inputs)`` (``window_inputs`` None without covariates).
        """
        if self.context_length is None:
            raise ValueError("windows needs context_length (the source length C)")
        horizon = check_positive_int(horizon, "horizon")
        stride = check_positive_int(stride, "stride")
        y = np.asarray(y)
        length = self.context_length + horizon
        if y.ndim < 1 or y.shape[0] < length:
            raise ValueError(f"y must have at least context_length + horizon = {length} "
                             f"steps, got shape {y.shape}")
        starts = np.arange(0, y.shape[0] - length + 1, stride)
        idx = starts[:, None] + np.arange(length)
        scored = np.broadcast_to(np.arange(length) >= self.context_length, idx.shape)
        u = None
        if inputs is not None:
            u = np.asarray(inputs)
            if u.shape[0] != y.shape[0]:
                raise ValueError(f"inputs must have one row per step of y ({y.shape[0]}), "
                                 f"got {u.shape[0]}")
            u = u[idx]
        return y[idx], np.array(scored), u


def _encode_impl(model, params, x, m, u):
    def body(c, xs):
        return model._encode_step(params, c, *xs), None

    carry, _ = jax.lax.scan(body, model.initial_carry(params), (x, m, u))
    return carry._replace(decoding=jnp.ones((), bool))


_encode_jit = jax.jit(_encode_impl, static_argnums=0)


def _teacher_forced_impl(model, params, carry, y, u):
    head = model.head
    full = jnp.ones(y.shape, bool)
    enc = jax.vmap(head.encode)(y, full)
    prev = jnp.concatenate([carry.prev[None], enc[:-1]], axis=0)
    ctx = jnp.broadcast_to(carry.context, (y.shape[0],) + carry.context.shape)
    xs = jnp.concatenate([prev, u.astype(prev.dtype), ctx], axis=-1)
    _, hs = model.decoder_backbone.scan(params.decoder, carry.decoder, xs)
    return head.distribution(params.head, hs).log_prob(y)


_teacher_forced_jit = jax.jit(_teacher_forced_impl, static_argnums=0)


def _greedy_impl(model, params, carry, u):
    full = jnp.ones(model.event_shape, bool)

    def body(c, u_t):
        d = model.predict(params, c, u_t)
        y_t = _mode(d)
        if model.emission in ("categorical", "bernoulli"):
            y_t = y_t.astype(jnp.int32)
        return model._decode_step(params, c, y_t, full, u_t), (y_t, d.log_prob(y_t))

    _, (ys, lps) = jax.lax.scan(body, carry, u)
    return ys, jnp.sum(lps)


_greedy_jit = jax.jit(_greedy_impl, static_argnums=0)


def _beam_impl(model, params, carry, u, beam_width):
    num_classes = model.num_classes
    classes = jnp.arange(num_classes)
    width, steps = beam_width, u.shape[0]
    carries = jax.tree.map(lambda a: jnp.broadcast_to(a, (width,) + a.shape), carry)
    dtype = carry.prev.dtype
    scores = jnp.full((width,), -jnp.inf, dtype).at[0].set(0.0)
    seqs = jnp.zeros((width, steps), jnp.int32)

    def body(state, xs):
        cs, sc, sq = state
        k, u_t = xs
        lp = jax.vmap(lambda c: model.predict(params, c, u_t).log_prob(classes))(cs)
        total = (sc[:, None] + lp).reshape(-1)  # (width * C,)
        top, idx = jax.lax.top_k(total, width)
        parent, token = idx // num_classes, (idx % num_classes).astype(jnp.int32)
        cs = jax.tree.map(lambda a: a[parent], cs)
        cs = jax.vmap(lambda c, y: model._decode_step(params, c, y, True, u_t))(cs, token)
        sq = sq[parent].at[:, k].set(token)
        return (cs, top, sq), None

    (_, scores, seqs), _ = jax.lax.scan(body, (carries, scores, seqs),
                                        (jnp.arange(steps), u))
    return seqs, scores


_beam_jit = jax.jit(_beam_impl, static_argnums=(0, 4))
