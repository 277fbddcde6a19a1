"""RWKV (RWKV-4): stacked time-mixing and channel-mixing blocks, as a neural sequence model.

One RWKV block (Peng et al. 2023, *RWKV: reinventing RNNs for the transformer era*,
Findings of EMNLP, eqs. (11)-(19)) has two pre-norm residual sublayers on the residual
stream ``z_t`` (``d``). **Time mixing**, on ``x_t = RMSNorm_1(z_t)``, with *token shift*
(a learned per-channel interpolation with the previous token, ``x_0 = 0``):

    r_t = W_r (μ_r ⊙ x_t + (1 - μ_r) ⊙ x_{t-1}),  likewise k_t (μ_k, W_k) and v_t (μ_v, W_v)
    wkv_t = (Σ_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t)
            / (Σ_{i<t} e^{-(t-1-i) w + k_i} + e^{u + k_t})             (eq. 14, per channel)
    z_t <- z_t + W_o (σ(r_t) ⊙ wkv_t)

with the decay ``w = exp(time_decay) > 0`` and the bonus ``u = time_first`` per channel
(`statseq.inference.wkv`). **Channel mixing**, on ``x'_t = RMSNorm_2(z_t)``, token shift
again (``μ'_k``, ``μ'_r``):

    k'_t = W'_k (μ'_k ⊙ x'_t + (1 - μ'_k) ⊙ x'_{t-1}),  r'_t = W'_r (μ'_r ⊙ ... )
    z_t <- z_t + σ(r'_t) ⊙ (W'_v max(k'_t, 0)^2)                          (eqs. 17-19)

(hidden width ``F = ffn_dim``, ``4 d`` by default as in the paper). The blocks are stacked
(`statseq.models.neural.residual`: an input projection, ``num_layers`` blocks, a final
RMSNorm read by the head).

**Modes.** ``mode="recurrent"``: the WKV operator's numerically stable recurrence (state
``(a, b, p)``, ``p`` the running maximum of the exponents) by ``lax.scan`` of the very step
used for generation, the projections hoisted out of the scan; ``mode="parallel"``: the
``T x T`` log-space form (a causal softmax-like average, ``O(T^2 d)`` memory per layer);
``mode="chunked"``: the parallel form within chunks of ``chunk_size`` steps and a scan over
the chunks (``O(T L d)`` memory); ``mode=None`` picks by backend
(`default_mode`: recurrent on CPU, chunked on GPU/TPU; measured). Generation (`statseq.sample`,
`statseq.forecast`, the filter with missing data) carries per block the two token-shift
inputs and the WKV state. Tests check the modes give the same log-probabilities and
gradients (float64, relative 1e-10) and the operator against the direct sum.

**Where we differ from the paper.** RMSNorm (with scale, no bias) instead of LayerNorm,
and no extra LayerNorm after the input projection; the decay is parameterized as in the
reference code (``w = exp(time_decay)``), which the paper leaves implicit (``w >= 0``). The
token-shift coefficients ``μ`` are not constrained to ``[0, 1]`` (nor are they in the
reference code); initialization follows the reference code's RWKV-4 formulas with its
depth ratio fixed at 1/2 (one initializer for every block), and the weight matrices are
uniform ``±1/sqrt(fan_in)`` (`statseq.models.neural.residual.dense_init`). No
parallel-Newton ``evaluation=`` (the stack's ``evaluation`` may only be ``None`` or
``"sequential"``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int
from statseq.inference._backend import backend_kind
from statseq.inference.wkv import (
    WKVState,
    wkv_chunked,
    wkv_initial_state,
    wkv_parallel,
    wkv_recurrent,
    wkv_step,
)
from statseq.models.neural.base import NeuralSequenceModel
from statseq.models.neural.residual import (
    ResidualStack,
    StackedBackboneModel,
    check_mode,
    dense_init,
    resolve_mode,
    rms_norm,
)

#: Whole-sequence evaluation modes of `RWKVBackbone`.
MODES = ("recurrent", "parallel", "chunked")

def default_mode(num_timesteps: int, backend: str | None = None) -> str:
    """The mode ``mode=None`` picks: ``"recurrent"`` on CPU, ``"chunked"`` on GPU/TPU at
    every length.

    **CPU** (the project's 2 cores; `benchmarks/RESULTS.md`, "Modern backbones"): the
    recurrence was the fastest measured form (the parallel one 3.4x slower at
    ``T = 100``, batch 1, and about 100x at ``T = 1000``; the chunked form was not timed
    on CPU: its program at batch 32, ``T = 10^4`` was estimated at 38 GiB). **GPU**
    (H100, training step, batch 32, width 64, 2 layers, float32; "Modern backbones on a
    GPU"): the chunked form was the fastest at every length it ran, ``T = 100``
    (parallel 1.16x its time, recurrence 3.75x) and ``T = 1000`` (recurrence 4.3x; the
    parallel program was estimated at 52 GiB), and it ran at ``T = 10^4`` (174 ms per
    step) where the parallel form could not be compiled (XLA's autotuner ran out of
    memory). TPU assumed like GPU, not measured.

    Args:
        num_timesteps: the sequence length ``T`` (the rule does not depend on it).
        backend: ``"cpu"``, ``"gpu"``, ``"tpu"`` (``None``: `jax.default_backend`).

    Returns:
        ``"recurrent"`` or ``"chunked"``.

    Examples:
        >>> default_mode(100, "cpu"), default_mode(100, "gpu"), default_mode(10**5, "gpu")
        ('recurrent', 'chunked', 'chunked')
    """
    del num_timesteps
    return "recurrent" if backend_kind(backend) == "cpu" else "chunked"


def _shift(prev, x, mix):
    """Token shift ``μ ⊙ x_t + (1 - μ) ⊙ x_{t-1}``."""
    return prev + mix * (x - prev)


class RWKVLayerParams(NamedTuple):
    """Parameters of one RWKV block (``d`` width, ``F`` channel-mixing width); in a stack
    every leaf has a leading layer axis.

    Attributes:
        att_mix: ``(3, d)`` token-shift coefficients ``μ_k, μ_v, μ_r`` of time mixing.
        time_decay: ``(d,)``: ``w = exp(time_decay)``.
        time_first: ``(d,)`` the bonus ``u``.
        att_key: ``(d, d)`` ``W_k`` (``x @ W``).
        att_value: ``(d, d)`` ``W_v``.
        att_receptance: ``(d, d)`` ``W_r``.
        att_output: ``(d, d)`` ``W_o``.
        ffn_norm: ``(d,)`` scale of the channel-mixing RMSNorm.
        ffn_mix: ``(2, d)`` token-shift coefficients ``μ'_k, μ'_r``.
        ffn_key: ``(d, F)`` ``W'_k``.
        ffn_receptance: ``(d, d)`` ``W'_r``.
        ffn_value: ``(F, d)`` ``W'_v``.
    """

    att_mix: jax.Array
    time_decay: jax.Array
    time_first: jax.Array
    att_key: jax.Array
    att_value: jax.Array
    att_receptance: jax.Array
    att_output: jax.Array
    ffn_norm: jax.Array
    ffn_mix: jax.Array
    ffn_key: jax.Array
    ffn_receptance: jax.Array
    ffn_value: jax.Array


class RWKVLayerState(NamedTuple):
    """State of one RWKV block.

    Attributes:
        att_shift: ``(d,)`` the previous time-mixing input ``x_{t-1}``.
        ffn_shift: ``(d,)`` the previous channel-mixing input ``x'_{t-1}``.
        wkv: `statseq.inference.wkv.WKVState` with ``(d,)`` leaves.
    """

    att_shift: jax.Array
    ffn_shift: jax.Array
    wkv: WKVState


@dataclasses.dataclass(frozen=True)
class RWKVBackbone(ResidualStack):
    """Stacked RWKV-4 blocks as a `statseq.models.neural.base.Backbone` (module docstring).

    Each block has two pre-norm residual sublayers (time mixing, channel mixing), so this
    stack overrides `ResidualStack._run`: its layer hooks take the residual stream ``z``
    and the block's first norm scale and return the updated stream.

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``d``.
        num_layers: number of blocks.
        parallel: ``True`` is ``mode="parallel"``, ``False`` is ``mode="recurrent"``.
        evaluation: ``None`` or ``"sequential"`` (``mode="recurrent"``).
        evaluation_max_iter: unused (no Newton solver).
        ffn_dim: channel-mixing width ``F`` (``None``: ``4 d``).
        mode: ``"recurrent"``, ``"parallel"``, ``"chunked"`` or ``None`` (`default_mode`).
        chunk_size: steps per chunk of ``mode="chunked"``.

    Raises:
        ValueError: for an unknown ``mode`` or one that contradicts ``parallel`` /
            ``evaluation``, or a Newton ``evaluation``.

    Examples:
        >>> import jax
        >>> bb = RWKVBackbone(input_dim=3, hidden_dim=4, mode="parallel")
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 3))).shape
        (5, 4)
    """

    ffn_dim: int | None = None
    mode: str | None = None
    chunk_size: int = 64

    def __post_init__(self):
        super().__post_init__()
        if self.ffn_dim is not None:
            check_positive_int(self.ffn_dim, "ffn_dim")
        check_positive_int(self.chunk_size, "chunk_size")
        check_mode(self.mode, self.parallel, self.evaluation, modes=MODES, name="RWKV",
                   parallel_modes=("parallel", "chunked"))

    @property
    def channel_dim(self) -> int:
        """``F``: ``ffn_dim`` or ``4 * hidden_dim``."""
        return self.ffn_dim if self.ffn_dim is not None else 4 * self.hidden_dim

    def mode_for(self, num_timesteps: int) -> str:
        """The mode that evaluates a sequence of ``num_timesteps`` steps."""
        return resolve_mode(self.mode, self.parallel, self.evaluation, when_parallel="parallel",
                            default=lambda: default_mode(num_timesteps))

    def layer_param_shapes(self) -> RWKVLayerParams:
        d, f = self.hidden_dim, self.channel_dim
        return RWKVLayerParams((3, d), (d,), (d,), (d, d), (d, d), (d, d), (d, d), (d,),
                               (2, d), (d, f), (d, d), (f, d))

    def layer_init(self, key, dtype) -> RWKVLayerParams:
        d, f = self.hidden_dim, self.channel_dim
        r0, r1 = 0.5, 0.5  # the reference code's depth ratios, fixed at the middle block
        h = np.arange(d)
        frac = h / max(d - 1, 1)
        ramp = h / d
        decay = -5.0 + 8.0 * frac ** (0.7 + 1.3 * r0)
        zigzag = ((h + 1) % 3 - 1) * 0.5
        keys = jax.random.split(key, 7)
        scale = 1.0 / math.sqrt(self.num_layers)
        return RWKVLayerParams(
            att_mix=jnp.asarray(np.stack([ramp ** r1, ramp ** r1 + 0.3 * r0,
                                          ramp ** (0.5 * r1)]), dtype),
            time_decay=jnp.asarray(decay, dtype),
            time_first=jnp.asarray(np.log(0.3) + zigzag, dtype),
            att_key=dense_init(keys[0], (d, d), d, dtype),
            att_value=dense_init(keys[1], (d, d), d, dtype),
            att_receptance=dense_init(keys[2], (d, d), d, dtype),
            att_output=dense_init(keys[3], (d, d), d, dtype) * scale,
            ffn_norm=jnp.ones((d,), dtype),
            ffn_mix=jnp.asarray(np.stack([ramp ** r1, ramp ** r1]), dtype),
            ffn_key=dense_init(keys[4], (d, f), d, dtype),
            ffn_receptance=dense_init(keys[5], (d, d), d, dtype),
            ffn_value=dense_init(keys[6], (f, d), f, dtype) * scale,
        )

    def layer_initial_state(self, layer_params) -> RWKVLayerState:
        dtype, d = layer_params.time_decay.dtype, self.hidden_dim
        zeros = jnp.zeros((d,), dtype)
        return RWKVLayerState(zeros, zeros, wkv_initial_state((d,), dtype))

    # ---- the two sublayers on a whole sequence (T, d); a step is T = 1 ---------------
    @staticmethod
    def _time_inputs(p, xs, prev):
        """``(k, v, r)`` ``(T, d)`` from the normalized inputs ``xs`` and ``x_0 = prev``."""
        shifted = jnp.concatenate([prev[None], xs[:-1]], axis=0)
        k = _shift(shifted, xs, p.att_mix[0]) @ p.att_key
        v = _shift(shifted, xs, p.att_mix[1]) @ p.att_value
        r = _shift(shifted, xs, p.att_mix[2]) @ p.att_receptance
        return k, v, r

    @staticmethod
    def _channel_mix(p, xs, prev):
        shifted = jnp.concatenate([prev[None], xs[:-1]], axis=0)
        k = jnp.square(jax.nn.relu(_shift(shifted, xs, p.ffn_mix[0]) @ p.ffn_key))
        r = _shift(shifted, xs, p.ffn_mix[1]) @ p.ffn_receptance
        return jax.nn.sigmoid(r) * (k @ p.ffn_value)

    def _block(self, p, state, zs, norm, wkv_fn):
        """One block on ``zs`` ``(T, d)``: ``(final_state, updated zs)``."""
        xs = rms_norm(zs, norm)
        k, v, r = self._time_inputs(p, xs, state.att_shift)
        wkv_state, wkv = wkv_fn(jnp.exp(p.time_decay), p.time_first, k, v, state.wkv)
        zs = zs + (jax.nn.sigmoid(r) * wkv) @ p.att_output
        xs2 = rms_norm(zs, p.ffn_norm)
        zs = zs + self._channel_mix(p, xs2, state.ffn_shift)
        return RWKVLayerState(xs[-1], xs2[-1], wkv_state), zs

    def layer_step(self, p, state, z_t, norm):
        """One token: the residual stream ``z_t`` ``(d,)`` -> ``(new_state, z_t updated)``."""
        def one(w, u, k, v, s):
            s, out = wkv_step(w, u, s, k[0], v[0])
            return s, out[None]

        state, zs = self._block(p, state, z_t[None], norm, one)
        return state, zs[0]

    def layer_scan(self, p, state, zs, norm):
        """A whole sequence ``zs`` ``(T, d)`` in the mode `mode_for` picks."""
        mode = self.mode_for(zs.shape[0])
        if mode == "chunked":
            def wkv_fn(w, u, k, v, s):
                return wkv_chunked(w, u, k, v, s, self.chunk_size)
        else:
            wkv_fn = wkv_parallel if mode == "parallel" else wkv_recurrent
        return self._block(p, state, zs, norm, wkv_fn)

    def _run(self, layer_fn, params, state, x):
        """Embed ``x``, run the blocks on the residual stream (scanned over depth), normalize."""
        z = x @ params.embed_weight + params.embed_bias

        def layer(z, xs):
            norm, layer_params, s = xs
            s, z = layer_fn(layer_params, s, z, norm)
            return z, s

        z, state = jax.lax.scan(layer, z, (params.norm, params.layers, state))
        return state, rms_norm(z, params.final_norm)


@register_model
@dataclasses.dataclass(frozen=True)
class RWKV(StackedBackboneModel, NeuralSequenceModel):
    """Stacked RWKV-4 blocks (time mixing with the WKV operator, channel mixing) with an
    emission head.

        wkv_t = (Σ_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t)
                / (Σ_{i<t} e^{-(t-1-i) w + k_i} + e^{u + k_t}),
        y_t | y_{<t}, u_{<=t} ~ head(features_t)

    (per block and channel, with token shift, a receptance gate ``σ(r_t)`` and a squared-ReLU
    channel mixing; module docstring). The network reads ``x_t = [enc(y_{t-1}), m_{t-1},
    u_t]`` (`statseq.models.neural.base`). Complete sequences are scored in the whole-sequence
    mode (``mode``), generation and masked data by the recurrent step; all give the same
    numbers.

    Args:
        emission: the head (``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"``, ``"categorical"``).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a categorical head.
        input_dim: number of covariates ``u_t``.
        hidden_dim: model width ``d``.
        num_layers: number of blocks.
        ffn_dim: channel-mixing width ``F`` (``None``: ``4 d``).
        mode: whole-sequence evaluation: ``"recurrent"`` (the stable WKV recurrence by
            ``lax.scan``), ``"parallel"`` (the ``T x T`` log-space form), ``"chunked"``
            (the parallel form within chunks of ``chunk_size`` steps, a scan over the
            chunks: ``O(T L)`` memory) or ``None``
            (`statseq.models.neural.rwkv.default_mode`: recurrent on CPU, chunked on
            GPU/TPU).
        chunk_size: steps per chunk of ``mode="chunked"``.

    Raises:
        ValueError: for a bad width or depth or an unknown ``mode``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.RWKV(hidden_dim=4, num_layers=1, mode="parallel")
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    hidden_dim: int = 16
    num_layers: int = 2
    ffn_dim: int | None = None
    mode: str | None = None
    chunk_size: int = 64

    @property
    def backbone(self) -> RWKVBackbone:
        return RWKVBackbone(input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
                            num_layers=self.num_layers, ffn_dim=self.ffn_dim, mode=self.mode,
                            chunk_size=self.chunk_size)
