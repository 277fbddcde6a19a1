"""The attention free transformer (AFT; Zhai et al. 2021) as a neural sequence model.

One causal AFT layer (Zhai, Talbott, Srivastava, Huang, Goh, Zhang and Susskind 2021, *An
attention free transformer*, arXiv:2105.14103, eq. 2 and section 3.2) maps a normalized
input ``v_t`` (``d``) to

    Q_t, K_t, V_t = W_Q v_t, W_K v_t, W_V v_t                               (d each)
    a_t = sum_{t'<=t} exp(K_{t'} + w_{t,t'}) * V_{t'} / sum_{t'<=t} exp(K_{t'} + w_{t,t'})
    f(v)_t = W_O (sigmoid(Q_t) * a_t)                                       (elementwise)

with the position biases ``w`` of the three variants (``variant=``):

* ``"simple"`` (AFT-simple): ``w = 0``;
* ``"local"`` (AFT-local, window ``s``): ``w_{t,t'}`` learned for ``t - t' < s`` and 0
  beyond (the keys outside the window still count, with bias 0, as in the paper);
* ``"full"`` (AFT-full): one learned ``w_{t,t'}`` for every pair ``t' <= t < T_max``.

Local and full biases are stored by lag, ``bias[t, j] = w_{t,t-j}`` (``T_max x s``, with
``s = T_max`` for full; the entries ``j > t`` are unused), initialized at 0 (the layer
starts as AFT-simple). **Beyond ``max_len``** the biases of the last row are reused:
``w_{t,t-j} = bias[T_max - 1, j]`` for ``t >= T_max`` and bias 0 for lags ``>= s``, so
log-probabilities, forecasts and samples of any length are defined, and on sequences no
longer than ``max_len`` the model is exactly the paper's (a test checks both against
the dense ``T x T`` weights).

All sums are stabilized by a running maximum of the exponents
(`statseq.inference.aft`): no ``exp`` sees a positive argument, at any length, in float32.

**Where this differs from the paper.** The paper's AFT block adds a feed-forward
sub-block and uses a factorized ``w`` for long sequences; here one residual layer is the
AFT operation with its output projection (pre-norm residual stack,
`statseq.models.neural.residual`), ``w`` is a free ``T_max x s`` table, and the model is
causal (the paper's autoregressive setting).

**Modes** (``mode=``): ``"recurrent"`` (`jax.lax.scan` of the generation step; the state
per layer is the stabilized sums of the positions past the window, the last ``s - 1`` keys
and values, and the step count) and ``"parallel"`` (the ``T x T x d`` exponent array,
``O(T^2 d)`` memory); ``None`` picks by backend, length and estimated memory
(`default_mode`; measured on CPU and an H100). A test checks
they agree to 1e-10 in float64.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int
from statseq.inference import aft
from statseq.inference._backend import backend_kind, quadratic_fits
from statseq.models.neural.base import NeuralSequenceModel
from statseq.models.neural.residual import (
    ResidualStack,
    StackedBackboneModel,
    check_mode,
    dense_init,
    resolve_mode,
)

#: Whole-sequence evaluation modes of `AFTBackbone`.
MODES = ("recurrent", "parallel")
#: AFT variants.
VARIANTS = ("simple", "local", "full")
#: Longest sequence the default mode evaluates in parallel on a GPU/TPU (memory permitting).
PARALLEL_MAX_T = 1024
#: XLA's estimate of the parallel form's training step per ``(t, s)`` pair, channel, layer
#: and byte of a float (H100, batch 32, width 64, 2 layers, float32: 27.0 GiB at
#: ``T = 10^3``, i.e. 1.77 per unit).
PARALLEL_BYTES_PER_PAIR = 1.8


def default_mode(num_timesteps: int, backend: str | None = None, *, hidden_dim: int = 16,
                 num_layers: int = 2, itemsize: int = 4, max_bytes: int | None = None) -> str:
    """The mode ``mode=None`` picks: recurrent on CPU; on GPU/TPU parallel up to
    `PARALLEL_MAX_T` steps while its ``T^2 d`` exponents fit, recurrent beyond.

    **CPU**: on this project's 2-core CPU (float32, XLA optimized, width 32, window 16, 2
    layers, forward and backward of ``log_prob``), the recurrent form took 8 ms at
    ``T = 256`` and 110 ms at ``T = 2048``, the parallel form 0.68 s and 41 s (and in the
    backbone benchmark, batch 1, width 64: parallel 14.5x slower at ``T = 100``).

    **GPU/TPU**: parallel while ``T <= PARALLEL_MAX_T`` and its estimated memory per
    sequence, ``PARALLEL_BYTES_PER_PAIR * d * L * itemsize * T^2``, stays within
    ``max_bytes`` (`statseq.inference._backend.quadratic_fits`, 128 MiB: ``T <= 381`` at
    width 64 and 2 layers, ``T <= 763`` at the default width 16). Measured on an H100
    (training step, batch 32, width 64, 2 layers, float32; `benchmarks/RESULTS.md`,
    "Modern backbones on a GPU"): the parallel form 5.7x faster than the recurrence at
    ``T = 100`` (298 MiB), only 1.38x at ``T = 1000`` for 27 GiB against 0.3 GiB, and at
    ``T = 10^4`` it could not be compiled (XLA's autotuner asked for 763 GiB). TPU assumed
    like GPU, not measured.

    Args:
        num_timesteps: ``T``.
        backend: ``jax.default_backend()`` when ``None``.
        hidden_dim: ``d`` (for the memory estimate).
        num_layers: ``L`` (for the memory estimate).
        itemsize: bytes per float (for the memory estimate).
        max_bytes: the memory bound per sequence (``None``: 128 MiB).

    Returns:
        ``"recurrent"`` or ``"parallel"``.

    Examples:
        >>> default_mode(100, "cpu"), default_mode(100, "gpu"), default_mode(10**5, "gpu")
        ('recurrent', 'parallel', 'recurrent')
        >>> default_mode(1000, "gpu", hidden_dim=64), default_mode(300, "gpu", hidden_dim=64)
        ('recurrent', 'parallel')
    """
    if backend_kind(backend) == "cpu" or num_timesteps > PARALLEL_MAX_T:
        return "recurrent"
    per_pair = PARALLEL_BYTES_PER_PAIR * hidden_dim * num_layers * itemsize
    return "parallel" if quadratic_fits(num_timesteps, per_pair, max_bytes) else "recurrent"


class AFTLayerParams(NamedTuple):
    """Parameters of one AFT layer (``d`` width); in a stack every leaf has a leading
    layer axis.

    Attributes:
        w_q: ``(d, d)`` query projection (``v @ w_q``).
        w_k: ``(d, d)`` key projection.
        w_v: ``(d, d)`` value projection.
        w_o: ``(d, d)`` output projection.
        bias: ``(T_max, s)`` position biases by lag, ``bias[t, j] = w_{t,t-j}``
            (``(0, 0)`` for AFT-simple).
    """

    w_q: jax.Array
    w_k: jax.Array
    w_v: jax.Array
    w_o: jax.Array
    bias: jax.Array


def _check_variant(variant, window, max_len):
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if variant == "simple":
        if window is not None or max_len is not None:
            raise ValueError("variant='simple' has no position biases: leave window and "
                             "max_len as None")
        return
    if max_len is None:
        raise ValueError(f"variant={variant!r} needs max_len (the rows of its position "
                         "biases)")
    check_positive_int(max_len, "max_len")
    if variant == "full":
        if window is not None:
            raise ValueError("variant='full' has window = max_len: leave window as None")
        return
    if window is None:
        raise ValueError("variant='local' needs window (the lags with learned biases)")
    check_positive_int(window, "window")
    if window > max_len:
        raise ValueError(f"window ({window}) must be at most max_len ({max_len})")


@dataclasses.dataclass(frozen=True)
class AFTBackbone(ResidualStack):
    """Stacked causal AFT layers as a `statseq.models.neural.base.Backbone`.

        a_t = sum_{t'<=t} exp(K_{t'} + w_{t,t'}) V_{t'} / sum_{t'<=t} exp(K_{t'} + w_{t,t'}),
        f(v)_t = W_O (sigmoid(Q_t) * a_t)          (per layer; module docstring)

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``d``.
        num_layers: number of layers.
        parallel: ``None``; ``False`` asks for the recurrent mode and ``True`` for the
            parallel one (a contradiction with ``mode`` is refused).
        evaluation: ``None`` or ``"sequential"`` (the recurrent mode).
        evaluation_max_iter: must stay ``None``.
        variant: ``"simple"``, ``"local"`` or ``"full"``.
        window: ``s`` for ``"local"``.
        max_len: ``T_max`` for ``"local"`` and ``"full"``.
        mode: ``"recurrent"``, ``"parallel"`` or ``None`` (`default_mode`).

    Raises:
        ValueError: for a bad field or a contradictory ``mode`` / ``parallel`` /
            ``evaluation``.

    Examples:
        >>> import jax
        >>> bb = AFTBackbone(input_dim=3, hidden_dim=4, variant="local", window=2,
        ...                  max_len=8)
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 3))).shape
        (5, 4)
    """

    variant: str = "simple"
    window: int | None = None
    max_len: int | None = None
    mode: str | None = None

    def __post_init__(self):
        super().__post_init__()
        _check_variant(self.variant, self.window, self.max_len)
        check_mode(self.mode, self.parallel, self.evaluation, modes=MODES, name="AFT",
                   parallel_modes=("parallel",), evaluation_max_iter=self.evaluation_max_iter)

    @property
    def window_size(self) -> int:
        """``s``: 0 for simple, ``window`` for local, ``max_len`` for full."""
        return {"simple": 0, "local": self.window, "full": self.max_len}[self.variant]

    def resolved_mode(self, num_timesteps: int) -> str:
        """The mode used for a whole sequence of ``num_timesteps`` steps."""
        return resolve_mode(self.mode, self.parallel, self.evaluation, when_parallel="parallel",
                            default=lambda: default_mode(
                                num_timesteps, hidden_dim=self.hidden_dim,
                                num_layers=self.num_layers))

    def layer_param_shapes(self) -> AFTLayerParams:
        d, s = self.hidden_dim, self.window_size
        rows = self.max_len if s else 0
        return AFTLayerParams((d, d), (d, d), (d, d), (d, d), (rows, s))

    def layer_init(self, key, dtype) -> AFTLayerParams:
        d = self.hidden_dim
        keys = jax.random.split(key, 4)
        return AFTLayerParams(
            w_q=dense_init(keys[0], (d, d), d, dtype),
            w_k=dense_init(keys[1], (d, d), d, dtype),
            w_v=dense_init(keys[2], (d, d), d, dtype),
            w_o=dense_init(keys[3], (d, d), d, dtype) / math.sqrt(self.num_layers),
            bias=jnp.zeros(self.layer_param_shapes().bias, dtype),
        )

    def layer_initial_state(self, layer_params) -> aft.AFTState:
        return aft.aft_initial_state(self.hidden_dim, self.window_size,
                                     layer_params.w_q.dtype)

    def _out(self, p, q, a):
        return (jax.nn.sigmoid(q) * a) @ p.w_o

    def layer_step(self, p, state, v_t):
        state, a = aft.aft_step(state, v_t @ p.w_k, v_t @ p.w_v, p.bias, self.window_size)
        return state, self._out(p, v_t @ p.w_q, a)

    def layer_scan(self, p, state, vs):
        form = aft.MODES[self.resolved_mode(vs.shape[0])]
        state, a = form(state, vs @ p.w_k, vs @ p.w_v, p.bias, self.window_size)
        return state, self._out(p, vs @ p.w_q, a)


@register_model
@dataclasses.dataclass(frozen=True)
class AFT(StackedBackboneModel, NeuralSequenceModel):
    """Stacked causal attention-free transformer layers (Zhai et al. 2021) with a head.

        a_t = sum_{t'<=t} exp(K_{t'} + w_{t,t'}) V_{t'} / sum_{t'<=t} exp(K_{t'} + w_{t,t'}),
        y_t | y_{<t}, u_{<=t} ~ head(features_t)

    (per layer ``f(v)_t = W_O (sigmoid(Q_t) * a_t)``, residual and RMSNorm; module
    docstring). The network reads ``x_t = [enc(y_{t-1}), m_{t-1}, u_t]``
    (`statseq.models.neural.base`).

    Args:
        emission: the head (``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"``, ``"categorical"``).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a categorical head.
        input_dim: number of covariates ``u_t``.
        hidden_dim: model width ``d``.
        num_layers: number of stacked layers.
        variant: ``"simple"`` (no position biases), ``"local"`` (learned biases for lags
            below ``window``) or ``"full"`` (one bias per pair of steps up to
            ``max_len``).
        window: the window ``s`` of ``"local"``.
        max_len: ``T_max``, the rows of the bias table (``"local"``, ``"full"``); longer
            sequences reuse the last row (module docstring).
        mode: whole-sequence evaluation, ``"recurrent"``, ``"parallel"`` or ``None``
            (`default_mode`: recurrent on CPU; on GPU/TPU parallel up to 1024 steps
            within 128 MiB per sequence, recurrent beyond).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.AFT(hidden_dim=4, variant="local", window=3, max_len=32)
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    hidden_dim: int = 16
    num_layers: int = 2
    variant: str = "simple"
    window: int | None = None
    max_len: int | None = None
    mode: str | None = None

    @property
    def backbone(self) -> AFTBackbone:
        return AFTBackbone(
            input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, variant=self.variant, window=self.window,
            max_len=self.max_len, mode=self.mode)
