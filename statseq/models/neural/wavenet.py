"""WaveNet / TCN: stacked gated dilated causal convolutions, as a neural sequence model.

One WaveNet layer (van den Oord et al. 2016, *WaveNet: a generative model for raw audio*,
eq. 2 and fig. 4; the TCN of Bai et al. 2018 is the same causal dilated stack) maps a
normalized input ``v_t`` (``d`` residual channels) through ``G`` gate ("dilation")
channels with dilation ``δ`` and kernel size ``K``:

    [a_t, b_t] = c + sum_{k=0}^{K-1} W_k v_{t-(K-1-k)δ}        (causal dilated conv, 2G)
    o_t = tanh(a_t) ⊙ σ(b_t)                                  (gated activation, G)
    r_t = W_res o_t + b_res,   s_t = W_skip o_t + b_skip      (residual and skip, d each)

with ``v_s = 0`` before the first step (zero padding). Layer ``l`` has dilation
``δ_l = 2^(l mod C)`` for a cycle length ``C`` (``dilation_cycle``; WaveNet's
``1, 2, ..., 512`` repeated), so the receptive field of the stack is

    R = 1 + (K - 1) sum_l δ_l

inputs ``x_{t-R+1}, ..., x_t``: the predictive of ``y_t`` depends on the ``R`` previous
observations ``y_{t-R}, ..., y_{t-1}`` (and the covariates ``u_{t-R+1..t}``) and on
nothing older (`WaveNet.receptive_field`; a test checks it by perturbation).

The layers are stacked on `statseq.models.neural.residual.ResidualStack` (input
projection, per-layer RMSNorm before the convolution), with WaveNet's residual and skip
connections,

    z^0_t = W_in x_t + b_in,   z^l = z^{l-1} + r^l,   h_t = RMSNorm_out(sum_l s^l_t),

and the emission head reads ``h_t``. **Differences from the paper:** (i) the pre-norm
RMSNorm before each layer and on the summed skips (the paper's stack has none; it keeps
deep stacks trainable like the other backbones here), (ii) the output is
``RMSNorm(sum skips)`` read by the head in place of the paper's
``ReLU -> 1x1 -> ReLU -> 1x1 -> softmax`` (the head is the last ``1x1``; a categorical
head gives the softmax), (iii) the skip width equals the residual width ``d``, (iv)
covariates enter through ``x_t`` (local conditioning by the input projection). As in
the paper, the last layer's residual output ``r^L`` feeds nothing (its weights get zero
gradient; they are kept so that every layer has one parameter layout).

**Two evaluation modes, one model** (``mode=``). ``"convolution"``: a whole sequence,
every layer at once as ``K`` shifted matrix products (the dilated convolution; the layers
are unrolled so that every shift is static). ``"recurrent"``: a `jax.lax.scan` over
time of the generation step, which is Fast WaveNet (Paine et al. 2016): each layer keeps
a queue of its last ``P = (K - 1) max_l δ_l`` inputs, reads its taps from it and pushes
the new input, so one step costs ``O(L)`` layer evaluations instead of recomputing the
receptive field.
This is not a recurrence: the state *is* the queues. They are one fixed-size pytree
(`WaveNetQueue`, a circular buffer ``(L, P, d)`` per stack with a write position), so
the filter protocol (missing data, `statseq.forecast`, `statseq.sample`) runs the queue
step, and the whole-sequence mode continues from any queue state (its final state is the
same queue). Every layer's queue has the length of the largest dilation (a fixed shape
across layers), ``L P d`` numbers instead of Fast WaveNet's ``(K - 1) d sum_l δ_l``. The
two modes give the same log-probabilities (tests: 1e-10 relative in float64).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int
from statseq.models.neural.base import NeuralSequenceModel
from statseq.models.neural.residual import (
    ResidualStack,
    check_mode,
    dense_init,
    resolve_mode,
    rms_norm,
)

#: Whole-sequence evaluation modes of `WaveNetBackbone`.
WAVENET_MODES = ("convolution", "recurrent")


def default_wavenet_mode(backend: str | None = None, num_timesteps: int | None = None) -> str:
    """The whole-sequence mode ``mode=None`` picks: ``"convolution"`` on every backend
    and at every length.

    The convolution does the same arithmetic as the queue step run ``T`` times, but as
    ``K`` large matrix products per layer instead of ``T`` sequential tiny ones, so it
    is never slower (the queue mode is kept for generation and for checking). Measured
    (training step, width 64, 2 layers, float32; `benchmarks/RESULTS.md`, "Modern
    backbones"): on the project's 2-core CPU the convolution 9.3-9.5x faster than the
    queue recurrence at ``T = 10^2, 10^3`` (batch 1) and 2.5x at ``T = 10^4`` (batch 32;
    one loaded batch-32 run at ``T = 10^3`` had it 1.36x slower, a single timing); on an
    H100 (batch 32) 38x faster at ``T = 10^2`` and 288x at ``10^3``, and 5.2 ms per step
    at ``10^4``.

    Args:
        backend: ``"cpu"``, ``"gpu"``, ``"tpu"`` (``None``: JAX's default backend).
        num_timesteps: the sequence length (unused by the current rule).

    Returns:
        ``"convolution"``.

    Examples:
        >>> default_wavenet_mode("cpu", 10)
        'convolution'
    """
    del backend, num_timesteps
    return "convolution"


class WaveNetLayerParams(NamedTuple):
    """Parameters of one WaveNet layer (``d`` residual channels, ``G`` gate channels,
    ``K`` taps); in a stack every leaf has a leading layer axis.

    Attributes:
        conv_weight: ``(K, d, 2G)`` dilated-convolution taps, oldest first:
            ``[a_t, b_t] = conv_bias + sum_k v_{t-(K-1-k)δ} @ conv_weight[k]``.
        conv_bias: ``(2G,)``.
        res_weight: ``(G, d)``: ``r_t = o_t @ res_weight + res_bias``.
        res_bias: ``(d,)``.
        skip_weight: ``(G, d)``: ``s_t = o_t @ skip_weight + skip_bias``.
        skip_bias: ``(d,)``.
    """

    conv_weight: jax.Array
    conv_bias: jax.Array
    res_weight: jax.Array
    res_bias: jax.Array
    skip_weight: jax.Array
    skip_bias: jax.Array


class WaveNetQueue(NamedTuple):
    """One layer's queue (Fast WaveNet), a circular buffer of its last ``P`` inputs.

    Attributes:
        buffer: ``(P, d)``: ``buffer[(position - j) mod P] = v_{t-j}``, ``j = 1..P``
            (zeros before the first step).
        position: ``()`` int32, the slot the next input is written to.
    """

    buffer: jax.Array
    position: jax.Array


def dilated_causal_conv(vs, weight, bias, dilation, history=None):
    """``out_t = bias + sum_{k=0}^{K-1} vs_{t-(K-1-k)δ} @ weight[k]`` with zero (or
    ``history``) padding before the first step.

    Args:
        vs: ``(T, C_in)`` inputs.
        weight: ``(K, C_in, C_out)`` taps, oldest first.
        bias: ``(C_out,)``.
        dilation: ``δ``, a positive int (may be traced).
        history: ``(P, C_in)`` the inputs before ``vs`` (oldest first), ``P >=
            (K - 1) δ``; ``None`` for zeros.

    Returns:
        ``(T, C_out)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> w = jnp.ones((2, 1, 1))                     # y_t = x_{t-2} + x_t
        >>> dilated_causal_conv(jnp.arange(1.0, 6.0)[:, None], w, jnp.zeros(1), 2)[:, 0].tolist()
        [1.0, 2.0, 4.0, 6.0, 8.0]
    """
    k_taps = weight.shape[0]
    t_len = vs.shape[0]
    if history is None:
        if isinstance(dilation, int | np.integer):
            pad = (k_taps - 1) * int(dilation)
        else:
            raise ValueError("a traced dilation needs an explicit history of length "
                             ">= (K - 1) * dilation")
        history = jnp.zeros((pad, vs.shape[1]), vs.dtype)
    pad = history.shape[0]
    full = jnp.concatenate([history.astype(vs.dtype), vs], axis=0)
    out = bias
    for k in range(k_taps):
        lag = (k_taps - 1 - k) * dilation
        shifted = jax.lax.dynamic_slice_in_dim(full, pad - lag, t_len, axis=0)
        out = out + shifted @ weight[k]
    return out


@dataclasses.dataclass(frozen=True)
class WaveNetBackbone(ResidualStack):
    """Stacked gated dilated causal convolutions with residual and skip connections.

        [a, b]_t = sum_k W_k v_{t-(K-1-k)δ_l} + c,   o_t = tanh(a_t) ⊙ σ(b_t),
        z^l = z^{l-1} + W_res o + b_res,   h_t = RMSNorm(sum_l (W_skip o^l_t + b_skip))

    (module docstring). ``output_dim == hidden_dim``.

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: residual (and skip) channels ``d``.
        num_layers: number of layers ``L``.
        parallel: ``True`` is ``mode="convolution"``, ``False`` ``mode="recurrent"``
            (kept from `ResidualStack`; leave ``None`` and use ``mode``).
        evaluation: ``None`` or ``"sequential"`` (``mode="recurrent"``); the parallel
            Newton solvers are refused (WaveNet is not a recurrence).
        evaluation_max_iter: must stay ``None``.
        kernel_size: taps per convolution ``K`` (>= 2; WaveNet uses 2).
        dilation_cycle: dilations double for ``dilation_cycle`` layers and then restart
            at 1 (``None``: never restart, ``δ_l = 2^l``).
        gate_dim: gate channels ``G`` (``None``: ``hidden_dim``).
        mode: ``"convolution"``, ``"recurrent"`` or ``None`` (`default_wavenet_mode`).

    Raises:
        ValueError: for an unknown ``mode``, a Newton ``evaluation``, or a ``mode`` that
            contradicts ``parallel``/``evaluation``.

    Examples:
        >>> import jax
        >>> bb = WaveNetBackbone(input_dim=2, hidden_dim=4, num_layers=3)
        >>> bb.dilations, bb.receptive_field
        ((1, 2, 4), 8)
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 2))).shape
        (5, 4)
    """

    kernel_size: int = 2
    dilation_cycle: int | None = None
    gate_dim: int | None = None
    mode: str | None = None

    def __post_init__(self):
        check_positive_int(self.kernel_size, "kernel_size", minimum=2)
        if self.dilation_cycle is not None:
            check_positive_int(self.dilation_cycle, "dilation_cycle")
        if self.gate_dim is not None:
            check_positive_int(self.gate_dim, "gate_dim")
        # a convolution, not a recurrence: no Newton solver applies
        check_mode(self.mode, self.parallel, self.evaluation, modes=WAVENET_MODES,
                   name="WaveNet", parallel_modes=("convolution",))
        super().__post_init__()

    # ---- static description ----------------------------------------------------------
    @property
    def gates(self) -> int:
        """Gate channels ``G``."""
        return self.hidden_dim if self.gate_dim is None else self.gate_dim

    @property
    def dilations(self) -> tuple[int, ...]:
        """``δ_l = 2^(l mod dilation_cycle)``, ``l = 0, ..., L - 1``."""
        cycle = self.num_layers if self.dilation_cycle is None else self.dilation_cycle
        return tuple(2 ** (ell % cycle) for ell in range(self.num_layers))

    @property
    def receptive_field(self) -> int:
        """``R = 1 + (K - 1) sum_l δ_l``: ``h_t`` depends on ``x_{t-R+1}, ..., x_t``."""
        return 1 + (self.kernel_size - 1) * sum(self.dilations)

    @property
    def queue_size(self) -> int:
        """``P = (K - 1) max_l δ_l``, the length of every layer's queue."""
        return (self.kernel_size - 1) * max(self.dilations)

    @property
    def resolved_mode(self) -> str:
        """The whole-sequence mode in use (``mode``, else ``parallel``/``evaluation``,
        else `default_wavenet_mode`)."""
        return resolve_mode(self.mode, self.parallel, self.evaluation,
                            when_parallel="convolution",
                            default=lambda: default_wavenet_mode(jax.default_backend()))

    # ---- one layer -------------------------------------------------------------------
    def layer_param_shapes(self) -> WaveNetLayerParams:
        d, g, k = self.hidden_dim, self.gates, self.kernel_size
        return WaveNetLayerParams((k, d, 2 * g), (2 * g,), (g, d), (d,), (g, d), (d,))

    def layer_init(self, key, dtype) -> WaveNetLayerParams:
        d, g, k = self.hidden_dim, self.gates, self.kernel_size
        keys = jax.random.split(key, 3)
        return WaveNetLayerParams(
            conv_weight=dense_init(keys[0], (k, d, 2 * g), k * d, dtype),
            conv_bias=jnp.zeros((2 * g,), dtype),
            res_weight=dense_init(keys[1], (g, d), g, dtype),
            res_bias=jnp.zeros((d,), dtype),
            skip_weight=dense_init(keys[2], (g, d), g, dtype),
            skip_bias=jnp.zeros((d,), dtype),
        )

    def layer_initial_state(self, layer_params) -> WaveNetQueue:
        dtype = layer_params.conv_bias.dtype
        return WaveNetQueue(jnp.zeros((self.queue_size, self.hidden_dim), dtype),
                            jnp.zeros((), jnp.int32))

    def _gate(self, p, pre):
        g = self.gates
        o = jnp.tanh(pre[..., :g]) * jax.nn.sigmoid(pre[..., g:])
        return o @ p.res_weight + p.res_bias, o @ p.skip_weight + p.skip_bias

    def layer_step(self, p, state, v_t, dilation=1):
        """One step from the queue: ``(new_queue, (r_t, s_t))``."""
        size, k_taps = self.queue_size, self.kernel_size
        pre = p.conv_bias + v_t @ p.conv_weight[k_taps - 1]
        for k in range(k_taps - 1):
            lag = (k_taps - 1 - k) * dilation
            pre = pre + state.buffer[(state.position - lag) % size] @ p.conv_weight[k]
        queue = WaveNetQueue(state.buffer.at[state.position].set(v_t),
                             (state.position + 1) % size)
        return queue, self._gate(p, pre)

    def layer_scan(self, p, state, vs, dilation=1):
        """A whole sequence ``(T, d)`` by the dilated convolution, continuing from the
        queue: ``(final_queue, (r (T, d), s (T, d)))``."""
        size, t_len = self.queue_size, vs.shape[0]
        history = jnp.roll(state.buffer, -state.position, axis=0)  # oldest first
        pre = dilated_causal_conv(vs, p.conv_weight, p.conv_bias, dilation, history)
        window = jnp.concatenate([history, vs], axis=0)[t_len:]  # the last P inputs
        position = (state.position + t_len) % size
        queue = WaveNetQueue(jnp.roll(window, position, axis=0), position.astype(jnp.int32))
        return queue, self._gate(p, pre)

    # ---- the stack -------------------------------------------------------------------
    def _run(self, layer_fn, params, state, x):
        """Embed, the layers with residual and skip connections (scanned over depth, the
        dilation a traced per-layer input: the queue step), RMSNorm of the summed skips."""
        z = x @ params.embed_weight + params.embed_bias

        def layer(carry, xs):
            z, skip = carry
            norm, layer_params, s, dilation = xs
            s, (res, sk) = layer_fn(layer_params, s, rms_norm(z, norm), dilation)
            return (z + res, skip + sk), s

        dilations = jnp.asarray(self.dilations, jnp.int32)
        (_, skip), state = jax.lax.scan(layer, (z, jnp.zeros_like(z)),
                                        (params.norm, params.layers, state, dilations))
        return state, rms_norm(skip, params.final_norm)

    def _run_unrolled(self, params, state, x):
        """`_run` for the convolution, the layers unrolled in Python so that each
        dilation is a static shift (a CPU microbenchmark on a loaded machine, six layers,
        ``T = 10^4``: about 4x faster forward and 7x faster gradients than traced shifts
        in the depth scan; not re-measured on a quiet machine)."""
        z = x @ params.embed_weight + params.embed_bias
        skip = jnp.zeros_like(z)
        states = []
        for ell, dilation in enumerate(self.dilations):
            layer_params, s = jax.tree.map(lambda a, ell=ell: a[ell], (params.layers, state))
            s, (res, sk) = self.layer_scan(layer_params, s, rms_norm(z, params.norm[ell]),
                                           dilation)
            z, skip = z + res, skip + sk
            states.append(s)
        return jax.tree.map(lambda *a: jnp.stack(a), *states), rms_norm(skip,
                                                                       params.final_norm)

    def scan(self, params, state, xs):
        """A whole sequence ``xs`` ``(T, input_dim)`` in `resolved_mode`: the dilated
        convolution (layers unrolled, static shifts), or the queue step under
        `jax.lax.scan` over time."""
        if self.resolved_mode == "recurrent":
            return jax.lax.scan(lambda s, x: self.step(params, s, x), state, xs)
        return self._run_unrolled(params, state, xs)

    def scan_time_major(self, params, state, xs):
        """A time-major batch: `scan` vmapped over the sequences."""
        return jax.vmap(self.scan, in_axes=(None, 0, 1), out_axes=(0, 1))(params, state, xs)


@register_model
@dataclasses.dataclass(frozen=True)
class WaveNet(NeuralSequenceModel):
    """WaveNet / TCN: gated dilated causal convolutions with an emission head.

        [a, b]_t = sum_k W_k v_{t-(K-1-k)δ_l} + c,   o_t = tanh(a_t) ⊙ σ(b_t),
        residual z^l = z^{l-1} + W_res o,   h_t = RMSNorm(sum_l W_skip o^l_t + b_skip),
        y_t | y_{<t}, u_{<=t} ~ head(h_t)

    with dilations ``δ_l`` doubling per layer (module docstring). The network reads
    ``x_t = [enc(y_{t-1}), m_{t-1}, u_t]`` (`statseq.models.neural.base`), so the
    predictive of ``y_t`` depends on exactly the last `receptive_field` observations.
    Complete sequences are scored by the convolution (``mode="convolution"``, the
    default) or the queue step (``"recurrent"``); generation, forecasts and masked data
    always run the queue step (Fast WaveNet). The modes give the same numbers.

    Args:
        emission: the head (``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"``, ``"categorical"``).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a categorical head.
        input_dim: number of covariates ``u_t``.
        hidden_dim: residual and skip channels ``d``.
        num_layers: number of layers ``L``.
        kernel_size: taps per convolution ``K`` (>= 2).
        dilation_cycle: layers per doubling cycle (``None``: dilations ``1, 2, ...,
            2^(L-1)``; e.g. ``L = 20``, ``dilation_cycle=10`` is WaveNet's ``1..512``
            twice).
        gate_dim: gate channels ``G`` (``None``: ``hidden_dim``).
        mode: ``"convolution"``, ``"recurrent"`` or ``None`` (`default_wavenet_mode`).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.WaveNet(hidden_dim=4, num_layers=3)
        >>> model.receptive_field                  # 1 + (2 - 1) * (1 + 2 + 4)
        8
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    hidden_dim: int = 16
    num_layers: int = 4
    kernel_size: int = 2
    dilation_cycle: int | None = None
    gate_dim: int | None = None
    mode: str | None = None

    def __post_init__(self):
        check_positive_int(self.hidden_dim, "hidden_dim")
        check_positive_int(self.num_layers, "num_layers")
        super().__post_init__()
        self.backbone  # noqa: B018 - validates the architecture fields eagerly

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                           for f in dataclasses.fields(self))
        return f"WaveNet({fields})  # receptive field {self.receptive_field}"

    @property
    def feature_dim(self) -> int:
        return self.hidden_dim

    @property
    def receptive_field(self) -> int:
        """``R = 1 + (K - 1) sum_l δ_l``: the predictive of ``y_t`` depends on
        ``y_{t-R}, ..., y_{t-1}`` (and ``u_{t-R+1}, ..., u_t``) and on nothing older."""
        return self.backbone.receptive_field

    @property
    def backbone(self) -> WaveNetBackbone:
        return WaveNetBackbone(
            input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, kernel_size=self.kernel_size,
            dilation_cycle=self.dilation_cycle, gate_dim=self.gate_dim, mode=self.mode)
