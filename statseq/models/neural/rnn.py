"""Recurrent neural sequence models: `ElmanRNN` (and echo state networks), `GRU`, `LSTM`.

Each is a `statseq.models.neural.base.NeuralSequenceModel` whose backbone is a stack of
cells (`statseq.models.neural.cells.RNNBackbone`):

    x_t = [enc(y_{t-1}) * m_{t-1}, m_{t-1}, u_t],    h_t = cell(h_{t-1}, x_t),
    y_t ~ head(h_t).

An echo state network is ``ElmanRNN(echo_state=True, spectral_radius=rho)``: its input and
recurrent weights are drawn once by `ElmanRNN.initialize` (recurrent weights rescaled to
spectral radius ``rho``, input weights uniform in ``(-input_scale, input_scale)``) and are
not trained; pass ``trainable=model.trainable(params)`` to `statseq.fit_sgd` so that only
the emission head (the readout) is fitted.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.model import register_model
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.models.neural.base import NeuralParams, NeuralSequenceModel
from statseq.models.neural.cells import RNNBackbone
from statseq.models.neural.evaluation import check_evaluation


def readout_only(params: NeuralParams) -> NeuralParams:
    """The ``trainable`` mask for `statseq.fit_sgd` that freezes the backbone and fits
    the emission head only (the echo state network's training).

    Args:
        params: `NeuralParams` of any neural model.

    Returns:
        A pytree like ``params`` with ``False`` on the backbone, ``True`` on the head.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.ElmanRNN(hidden_dim=3, echo_state=True)
        >>> params = model.initialize(np.zeros(10), key=jax.random.key(0))
        >>> readout_only(params).backbone[0].w_rec
        False
    """
    return NeuralParams(
        backbone=jax.tree.map(lambda _: False, params.backbone),
        head=jax.tree.map(lambda _: True, params.head),
    )


@dataclasses.dataclass(frozen=True)
class _RNNModel(NeuralSequenceModel):
    """Fields shared by the recurrent models (documented on each class)."""

    hidden_dim: int = 16
    num_layers: int = 1
    evaluation: str | None = None
    evaluation_max_iter: int | None = None

    _cell = "elman"

    def __post_init__(self):
        check_positive_int(self.hidden_dim, "hidden_dim")
        check_positive_int(self.num_layers, "num_layers")
        check_evaluation(self.evaluation, self.evaluation_max_iter)
        super().__post_init__()

    @property
    def feature_dim(self) -> int:
        return self.hidden_dim

    @property
    def backbone(self) -> RNNBackbone:
        return RNNBackbone(self._cell, self.backbone_input_dim, self.hidden_dim,
                           self.num_layers, evaluation=self.evaluation,
                           evaluation_max_iter=self.evaluation_max_iter)

    def trainable(self, params) -> NeuralParams:
        """The ``trainable`` mask for `statseq.fit_sgd`: everything (all ``True``)."""
        return jax.tree.map(lambda _: True, params)

    def initialize(self, y, *, key, inputs=None, mask=None) -> NeuralParams:
        """Random weights (`statseq.models.neural.cells.RNNBackbone.init_params`), a
        data-driven head bias, and, for real-valued data, a first layer that sees the
        previous observation standardized: its input weights on ``y_{t-1}`` are divided by
        the data's standard deviation and the mean is absorbed into the bias.

        Args:
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            key: a ``jax.random`` key.
            inputs: covariates (checked, unused).
            mask: optional observation mask.

        Returns:
            `NeuralParams`.
        """
        check_key(key)
        params = super().initialize(y, key=key, inputs=inputs, mask=mask)
        params = self._draw_weights(params, key)
        return self._standardize_inputs(params, y, mask, inputs)

    def _draw_weights(self, params: NeuralParams, key) -> NeuralParams:
        """A subclass's own draw of the backbone weights (the echo state reservoir), made
        before `_standardize_inputs` absorbs the data's scale into them; default: none."""
        del key
        return params

    def _standardize_inputs(self, params: NeuralParams, y, mask, inputs) -> NeuralParams:
        """For real-valued data, the first layer's weights on ``y_{t-1}`` divided by the
        data's standard deviation ``s`` and ``-w_y m / s`` added to those on the observed
        indicator (which is 1 exactly when ``y_{t-1}`` is observed), so the layer's
        pre-activation is ``w_y (y_{t-1} - m) / s``: the network reads the standardized
        series while ``params`` and ``log_prob`` stay on the data's scale."""
        if self.head.observation_dtype != "real":
            return params
        data = prepare_data(self, y, mask, inputs)
        d = self.head.dim
        yv = np.asarray(data.y, float).reshape(-1, d)
        mv = np.asarray(data.mask, bool).reshape(-1, d)
        n = np.maximum(mv.sum(0), 1)
        mean = np.where(mv, yv, 0).sum(0) / n
        std = np.sqrt(np.where(mv, (yv - mean) ** 2, 0).sum(0) / n)
        std = np.where(std > 0, std, 1.0)
        first = params.backbone[0]
        w_y = first.w_in[:, :d] / jnp.asarray(std, first.w_in.dtype)
        # x = [y, m, u]: shift by the mean through the indicator columns, which are 1
        # exactly when the value is observed (a missing value stays at "no information")
        w_m = first.w_in[:, d:2 * d] - w_y * jnp.asarray(mean, first.w_in.dtype)
        w_in = first.w_in.at[:, :d].set(w_y).at[:, d:2 * d].set(w_m)
        return params._replace(backbone=(first._replace(w_in=w_in),) + params.backbone[1:])


@register_model
@dataclasses.dataclass(frozen=True)
class ElmanRNN(_RNNModel):
    """Elman (vanilla) RNN: ``h_t = tanh(W_x x_t + W_h h_{t-1} + b)``, ``y_t ~ head(h_t)``,
    with ``x_t = [enc(y_{t-1}) * m_{t-1}, m_{t-1}, u_t]``; or an echo state network.

    Args:
        emission: ``"gaussian"``, ``"student_t"``, ``"poisson"``, ``"negative_binomial"``,
            ``"bernoulli"`` or ``"categorical"`` (see `statseq.models.neural.heads`).
        emission_dim: ``None`` for a scalar series, else the number of dimensions ``D``.
        num_classes: number of classes for ``emission="categorical"``.
        input_dim: number of covariates ``u_t`` (0 for none).
        hidden_dim: size ``H`` of each layer's hidden state.
        num_layers: number of stacked layers (the head reads the last one).
        evaluation: how whole, fully observed sequences (``log_prob``, ``fit_sgd``) are
            evaluated, layer after layer: ``"sequential"`` (`jax.lax.scan`), or as the
            root of the trajectory's residual ``h_t - cell(h_{t-1}, x_t) = 0`` by parallel
            Newton iterations (``"deer"``, ``"quasi-deer"``; Lim et al. 2023) or their
            damped Kalman-smoother form (``"elk"``, ``"quasi-elk"``; Gonzalez et al.
            2024), each an associative scan (`statseq.inference.deer.deer`); the same
            answer and (implicit) gradient, with a sequential fallback and a warning if
            the solver does not converge. ``None``: DEER on GPU/TPU for ``T >= 1000``,
            else sequential (`statseq.models.neural.evaluation`).
        evaluation_max_iter: the solver's maximum number of iterations (default ``T``).
        echo_state: draw ``W_x`` and ``W_h`` once at `initialize` and keep them fixed
            (fit with ``trainable=model.trainable(params)``).
        spectral_radius: spectral radius of ``W_h`` for an echo state network.
        input_scale: ``W_x`` uniform in ``(-input_scale, input_scale)`` for an echo state
            network.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.ElmanRNN(hidden_dim=4)
        >>> params = model.initialize(np.zeros(20), key=jax.random.key(0))
        >>> ss.log_prob(model, params, np.zeros(20)).shape
        ()
    """

    echo_state: bool = False
    spectral_radius: float = 0.9
    input_scale: float = 1.0

    _cell = "elman"

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.echo_state, bool):
            raise TypeError(f"echo_state must be True or False, got {self.echo_state!r}")
        if not float(self.spectral_radius) > 0:
            raise ValueError(f"spectral_radius must be positive, got {self.spectral_radius}")
        if not float(self.input_scale) > 0:
            raise ValueError(f"input_scale must be positive, got {self.input_scale}")

    def trainable(self, params) -> NeuralParams:
        """The ``trainable`` mask for `statseq.fit_sgd`: the readout only for an echo
        state network (see `readout_only`), else everything."""
        return readout_only(params) if self.echo_state else super().trainable(params)

    def initialize(self, y, *, key, inputs=None, mask=None) -> NeuralParams:
        """Random weights with a data-driven head bias; an echo state network's reservoir
        has recurrent weights rescaled to ``spectral_radius`` and zero biases.

        For real-valued data the first layer reads the previous observation standardized,
        as in every recurrent model (`GRU.initialize`): the reservoir's input weights on
        ``y_{t-1}`` are divided by the data's standard deviation and the mean is absorbed
        through the observed-indicator column, so ``input_scale`` is relative to a series
        of unit scale and the reservoir does not saturate on data of large scale (raw
        yearly sunspot numbers, 20 units: 0.6 % of the unit-steps at ``|tanh| > 0.99``,
        against 88 % when the raw values were fed). The fixed reservoir keeps these
        weights.

        Args:
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            key: a ``jax.random`` key.
            inputs: covariates (checked, unused).
            mask: optional observation mask.

        Returns:
            `NeuralParams`.
        """
        return super().initialize(y, key=key, inputs=inputs, mask=mask)

    def _draw_weights(self, params: NeuralParams, key) -> NeuralParams:
        """The echo state reservoir: ``W_x`` uniform in ``(-input_scale, input_scale)``,
        ``W_h`` rescaled to ``spectral_radius``, zero biases (plain Elman: unchanged)."""
        if not self.echo_state:
            return params
        dtype, layers = float_dtype(), []
        for i, p in enumerate(params.backbone):
            k_in, k_rec = jax.random.split(jax.random.fold_in(key, 1000 + i))
            w_in = jax.random.uniform(k_in, p.w_in.shape, dtype, -1.0, 1.0) * self.input_scale
            w_rec = np.asarray(jax.random.uniform(k_rec, p.w_rec.shape, dtype, -1.0, 1.0))
            radius = float(np.max(np.abs(np.linalg.eigvals(w_rec))))
            w_rec = w_rec * (self.spectral_radius / max(radius, 1e-12))
            layers.append(p._replace(w_in=w_in, w_rec=jnp.asarray(w_rec, dtype),
                                     bias=jnp.zeros_like(p.bias)))
        return params._replace(backbone=tuple(layers))


@register_model
@dataclasses.dataclass(frozen=True)
class GRU(_RNNModel):
    """Gated recurrent unit network: ``h_t = GRU(h_{t-1}, x_t)``, ``y_t ~ head(h_t)``
    (cell equations in `statseq.models.neural.cells`).

    Args:
        emission: ``"gaussian"``, ``"student_t"``, ``"poisson"``, ``"negative_binomial"``,
            ``"bernoulli"`` or ``"categorical"`` (see `statseq.models.neural.heads`).
        emission_dim: ``None`` for a scalar series, else the number of dimensions ``D``.
        num_classes: number of classes for ``emission="categorical"``.
        input_dim: number of covariates ``u_t`` (0 for none).
        hidden_dim: size ``H`` of each layer's hidden state.
        num_layers: number of stacked layers (the head reads the last one).
        evaluation: how whole, fully observed sequences (``log_prob``, ``fit_sgd``) are
            evaluated, layer after layer: ``"sequential"`` (`jax.lax.scan`), or as the
            root of the trajectory's residual ``h_t - cell(h_{t-1}, x_t) = 0`` by parallel
            Newton iterations (``"deer"``, ``"quasi-deer"``; Lim et al. 2023) or their
            damped Kalman-smoother form (``"elk"``, ``"quasi-elk"``; Gonzalez et al.
            2024), each an associative scan (`statseq.inference.deer.deer`); the same
            answer and (implicit) gradient, with a sequential fallback and a warning if
            the solver does not converge. ``None``: DEER on GPU/TPU for ``T >= 1000``,
            else sequential (`statseq.models.neural.evaluation`).
        evaluation_max_iter: the solver's maximum number of iterations (default ``T``).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.GRU(hidden_dim=4, emission="poisson")
        >>> params = model.initialize(np.arange(10) % 3, key=jax.random.key(0))
        >>> ss.filter(model, params, np.arange(10) % 3).log_probs.shape
        (10,)
    """

    _cell = "gru"


@register_model
@dataclasses.dataclass(frozen=True)
class LSTM(_RNNModel):
    """Long short-term memory network: ``(h_t, c_t) = LSTM((h_{t-1}, c_{t-1}), x_t)``,
    ``y_t ~ head(h_t)`` (cell equations in `statseq.models.neural.cells`).

    Args:
        emission: ``"gaussian"``, ``"student_t"``, ``"poisson"``, ``"negative_binomial"``,
            ``"bernoulli"`` or ``"categorical"`` (see `statseq.models.neural.heads`).
        emission_dim: ``None`` for a scalar series, else the number of dimensions ``D``.
        num_classes: number of classes for ``emission="categorical"``.
        input_dim: number of covariates ``u_t`` (0 for none).
        hidden_dim: size ``H`` of each layer's hidden state.
        num_layers: number of stacked layers (the head reads the last one).
        evaluation: how whole, fully observed sequences (``log_prob``, ``fit_sgd``) are
            evaluated, layer after layer: ``"sequential"`` (`jax.lax.scan`), or as the
            root of the trajectory's residual ``h_t - cell(h_{t-1}, x_t) = 0`` by parallel
            Newton iterations (``"deer"``, ``"quasi-deer"``; Lim et al. 2023) or their
            damped Kalman-smoother form (``"elk"``, ``"quasi-elk"``; Gonzalez et al.
            2024), each an associative scan (`statseq.inference.deer.deer`); the same
            answer and (implicit) gradient, with a sequential fallback and a warning if
            the solver does not converge. ``None``: DEER on GPU/TPU for ``T >= 1000``,
            else sequential (`statseq.models.neural.evaluation`).
        evaluation_max_iter: the solver's maximum number of iterations (default ``T``).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.LSTM(hidden_dim=4, num_layers=2)
        >>> params = model.initialize(np.zeros(10), key=jax.random.key(0))
        >>> ss.forecast(model, params, np.zeros(10), num_steps=3, num_samples=5,
        ...             key=jax.random.key(1)).samples.shape
        (5, 3)
    """

    _cell = "lstm"
