"""A causal softmax-attention Transformer (decoder-only) as a neural sequence model.

Each of the ``L`` blocks is a pre-norm Transformer block (Vaswani et al. 2017 with the
pre-norm placement of Xiong et al. 2020, RMSNorm as in the other residual stacks,
`statseq.models.neural.residual`): with ``z^0_t = W_in x_t + b_in`` (``+ PE(t)`` for
sinusoidal encodings),

    a^l = MHA_l(RMSNorm(z^{l-1}))                 (causal, window max_len; H heads of D)
    z'^l = z^{l-1} + a^l
    z^l = z'^l + W_2 gelu(W_1 RMSNorm(z'^l) + b_1) + b_2         (MLP, width m d)
    h_t = RMSNorm(z^L_t),

with ``MHA(v)_t = W_O [out^1_t, ..., out^H_t]``, ``out^h_t = sum_s softmax_s(q_t . k_s /
sqrt(D)) u_s`` over ``s`` in the window, and ``q = W_Q^h v``, ``k = W_K^h v``, ``u = W_V^h v``
(bias-free; flax's ``MultiHeadDotProductAttention`` with ``use_bias=False``: a test checks
equality). Positions enter by ``positional=``: ``"rope"`` (rotary, applied to ``q`` and
``k`` in every layer, default), ``"sinusoidal"`` (added to ``z^0``) or ``None``
(`statseq.inference.attention`).

**Context window** ``max_len`` (``W``): step ``t`` attends to steps
``max(0, t - W + 1), ..., t`` (itself and the ``W - 1`` before). Up to ``W`` steps this is
full causal attention; beyond, the window slides: the oldest step leaves as a new one
enters. The whole-sequence form uses the same rule, so both agree at every length. The
filter state of a layer is its `statseq.inference.attention.KVCache`: keys and values
``(W, H, D)`` and the position counter, a fixed size whatever the length.

**Modes** (``mode=``): ``"parallel"`` (masked scores: ``T x T`` from the initial, empty
caches, the path of ``log_prob`` and ``fit_sgd`` (`TransformerBackbone.scan_from_start`),
``T x (W + T)`` when continuing from another cache, ``O(T (T + W))`` memory) and
``"recurrent"`` (`jax.lax.scan` of the KV-cache step,
``O(T W)`` work); ``None`` picks parallel up to `PARALLEL_MAX_T` steps, recurrent beyond
(a memory bound, not a measured crossover: the parallel form was the faster at every
length that fitted, on CPU and on an H100), and on GPU/TPU also recurrent where the
parallel form's estimated memory exceeds 128 MiB per sequence (`default_mode`).
Generation (`statseq.sample`,
`statseq.forecast`) and the filter with missing data always take KV-cache steps. A test
checks the modes and the step agree to 1e-10 (float64) within and beyond the window.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int
from statseq.inference import attention as att
from statseq.inference._backend import backend_kind, quadratic_fits
from statseq.models.neural.base import NeuralSequenceModel
from statseq.models.neural.residual import (
    ResidualStack,
    StackedBackboneModel,
    check_mode,
    dense_init,
    resolve_mode,
    rms_norm,
)

#: Whole-sequence evaluation modes of `TransformerBackbone`.
MODES = ("recurrent", "parallel")
#: Positional encodings.
POSITIONAL = ("rope", "sinusoidal", None)
#: Longest sequence ``mode=None`` evaluates in parallel (its ``T x (W + T)`` scores).
PARALLEL_MAX_T = 1024
#: XLA's estimate of the parallel form's training step per score ``(t, s)`` of the
#: ``T x (W + T)`` matrix, head, layer and byte of a float (H100, batch 32, width 64, 2
#: heads, 2 layers, ``W = 256``, float32: 2.25 GiB at ``T = 10^3``, 177 GiB at ``10^4``,
#: i.e. 3.76 and 3.62 per unit).
PARALLEL_BYTES_PER_SCORE = 3.8


def default_mode(num_timesteps: int, backend: str | None = None, *, num_heads: int = 2,
                 num_layers: int = 2, max_len: int = 0, itemsize: int = 4,
                 max_bytes: int | None = None) -> str:
    """The mode ``mode=None`` picks: parallel up to `PARALLEL_MAX_T` steps, recurrent
    beyond; on GPU/TPU the parallel form must also fit ``max_bytes`` per sequence
    (estimate ``PARALLEL_BYTES_PER_SCORE * H * L * itemsize * T (W + T)``,
    `statseq.inference._backend.quadratic_fits`, 128 MiB).

    **CPU** (`benchmarks/RESULTS.md`, "Transformer"; 2 cores, batch 4, width 32): the
    parallel form 2.6x faster than the KV-cache scan at ``T = 100`` and 6.8x at
    ``T = 1000``; at ``T = 10^4`` (batch 1) it ran out of the machine's memory. **GPU**
    (H100, training step, batch 32, width 64, 2 layers, ``W = 256``, float32; "Modern
    backbones on a GPU"): the parallel form 9.8x faster than the recurrence at
    ``T = 100`` and 20x at ``T = 1000`` (2.25 GiB); at ``T = 10^4`` its program was
    estimated at 177 GiB (not run). TPU assumed like GPU, not measured.

    Args:
        num_timesteps: ``T``.
        backend: ``"cpu"``, ``"gpu"``, ``"tpu"`` (``None``: `jax.default_backend`).
        num_heads: ``H`` (for the memory estimate).
        num_layers: ``L`` (for the memory estimate).
        max_len: the window ``W`` (for the memory estimate).
        itemsize: bytes per float (for the memory estimate).
        max_bytes: the memory bound per sequence on GPU/TPU (``None``: 128 MiB).

    Returns:
        ``"parallel"`` or ``"recurrent"``.

    Examples:
        >>> default_mode(100), default_mode(10**5)
        ('parallel', 'recurrent')
        >>> default_mode(1000, "gpu", num_heads=8, num_layers=6, max_len=256)
        'recurrent'
    """
    if num_timesteps > PARALLEL_MAX_T:
        return "recurrent"
    if backend_kind(backend) == "cpu":
        return "parallel"
    t = max(int(num_timesteps), 1)
    per_pair = PARALLEL_BYTES_PER_SCORE * num_heads * num_layers * itemsize * (t + max_len) / t
    return "parallel" if quadratic_fits(num_timesteps, per_pair, max_bytes) else "recurrent"


class TransformerLayerParams(NamedTuple):
    """Parameters of one Transformer block (``d`` width, ``H`` heads of ``D = d / H``, MLP
    width ``m d``); in a stack every leaf has a leading layer axis. The attention
    pre-norm is the stack's ``norm`` (`statseq.models.neural.residual.StackParams`).

    Attributes:
        w_q: ``(d, H D)`` query projection (``v @ w_q``).
        w_k: ``(d, H D)`` key projection.
        w_v: ``(d, H D)`` value projection.
        w_o: ``(H D, d)`` output projection.
        mlp_norm: ``(d,)`` scale of the MLP's pre-norm.
        w_1: ``(d, m d)`` first MLP layer.
        b_1: ``(m d,)``.
        w_2: ``(m d, d)`` second MLP layer.
        b_2: ``(d,)``.
    """

    w_q: jax.Array
    w_k: jax.Array
    w_v: jax.Array
    w_o: jax.Array
    mlp_norm: jax.Array
    w_1: jax.Array
    b_1: jax.Array
    w_2: jax.Array
    b_2: jax.Array


@dataclasses.dataclass(frozen=True)
class TransformerBackbone(ResidualStack):
    """Stacked causal pre-norm Transformer blocks as a `statseq.models.neural.base.Backbone`.

        z' = z + MHA(RMSNorm(z)),  z <- z' + MLP(RMSNorm(z'))    (module docstring)

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``d`` (a multiple of ``num_heads``).
        num_layers: number of blocks.
        parallel: ``None``; ``False`` asks for the recurrent mode and ``True`` for the
            parallel one (a contradiction with ``mode`` is refused).
        evaluation: ``None`` or ``"sequential"`` (the recurrent mode).
        evaluation_max_iter: must stay ``None``.
        num_heads: ``H``.
        max_len: the context window ``W`` (module docstring).
        positional: ``"rope"``, ``"sinusoidal"`` or ``None``.
        mlp_ratio: ``m``, the MLP's width over ``d``.
        rope_base: the base of the rotary or sinusoidal frequencies.
        mode: ``"recurrent"``, ``"parallel"`` or ``None`` (`default_mode`).

    Raises:
        ValueError: for a bad field (``num_heads`` not dividing ``hidden_dim``, an odd head
            width with RoPE, ``max_len < 1``) or a contradictory ``mode`` / ``parallel`` /
            ``evaluation``.

    Examples:
        >>> import jax
        >>> bb = TransformerBackbone(input_dim=3, hidden_dim=4, num_heads=2, max_len=8)
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 3))).shape
        (5, 4)
    """

    num_heads: int = 2
    max_len: int = 256
    positional: str | None = "rope"
    mlp_ratio: int = 4
    rope_base: float = 10000.0
    mode: str | None = None

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.num_heads, "num_heads")
        check_positive_int(self.max_len, "max_len")
        check_positive_int(self.mlp_ratio, "mlp_ratio")
        if self.hidden_dim % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide hidden_dim "
                             f"({self.hidden_dim})")
        if self.positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {POSITIONAL}, "
                             f"got {self.positional!r}")
        if self.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"positional='rope' rotates pairs: the head width "
                             f"hidden_dim / num_heads = {self.head_dim} must be even")
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, (int, float)) \
                or not 1.0 < float(self.rope_base) < math.inf:
            raise ValueError(f"rope_base must be a number > 1, got {self.rope_base!r}")
        check_mode(self.mode, self.parallel, self.evaluation, modes=MODES,
                   name="Transformer", parallel_modes=("parallel",),
                   evaluation_max_iter=self.evaluation_max_iter)

    @property
    def head_dim(self) -> int:
        """``D = hidden_dim / num_heads``."""
        return self.hidden_dim // self.num_heads

    def resolved_mode(self, num_timesteps: int) -> str:
        """The mode used for a whole sequence of ``num_timesteps`` steps."""
        return resolve_mode(self.mode, self.parallel, self.evaluation,
                            when_parallel="parallel",
                            default=lambda: default_mode(
                                num_timesteps, num_heads=self.num_heads,
                                num_layers=self.num_layers, max_len=self.max_len))

    def layer_param_shapes(self) -> TransformerLayerParams:
        d, m = self.hidden_dim, self.mlp_ratio * self.hidden_dim
        return TransformerLayerParams((d, d), (d, d), (d, d), (d, d), (d,), (d, m), (m,),
                                      (m, d), (d,))

    def layer_init(self, key, dtype) -> TransformerLayerParams:
        d, m = self.hidden_dim, self.mlp_ratio * self.hidden_dim
        keys = jax.random.split(key, 6)
        depth = math.sqrt(self.num_layers)
        return TransformerLayerParams(
            w_q=dense_init(keys[0], (d, d), d, dtype),
            w_k=dense_init(keys[1], (d, d), d, dtype),
            w_v=dense_init(keys[2], (d, d), d, dtype),
            w_o=dense_init(keys[3], (d, d), d, dtype) / depth,
            mlp_norm=jnp.ones((d,), dtype),
            w_1=dense_init(keys[4], (d, m), d, dtype),
            b_1=jnp.zeros((m,), dtype),
            w_2=dense_init(keys[5], (m, d), m, dtype) / depth,
            b_2=jnp.zeros((d,), dtype),
        )

    def layer_initial_state(self, layer_params) -> att.KVCache:
        return att.kv_cache_init(self.max_len, self.num_heads, self.head_dim,
                                 layer_params.w_q.dtype)

    def _qkv(self, p, vs, positions):
        """Queries, keys (rotated for RoPE) and values, ``(..., H, D)`` each."""
        shape = vs.shape[:-1] + (self.num_heads, self.head_dim)
        q, k = (vs @ p.w_q).reshape(shape), (vs @ p.w_k).reshape(shape)
        if self.positional == "rope":
            q = att.apply_rope(q, positions, self.rope_base)
            k = att.apply_rope(k, positions, self.rope_base)
        return q, k, (vs @ p.w_v).reshape(shape)

    def _out(self, p, o):
        return o.reshape(o.shape[:-2] + (-1,)) @ p.w_o

    def layer_step(self, p, state, v_t):
        """Attention sub-block, one KV-cache step."""
        state, o = att.attention_step(state, *self._qkv(p, v_t, state.position))
        return state, self._out(p, o)

    def layer_scan(self, p, state, vs):
        """Attention sub-block over a sequence, in the resolved mode."""
        t_len = vs.shape[0]
        positions = state.position + jnp.arange(t_len, dtype=vs.dtype)
        form = att.MODES[self.resolved_mode(t_len)]
        state, o = form(state, *self._qkv(p, vs, positions))
        return state, self._out(p, o)

    def layer_scan_from_start(self, p, state, vs):
        """`layer_scan` from the initial (empty) cache: in the parallel mode the ``T x T``
        form (`statseq.inference.attention.attention_parallel_from_start`)."""
        t_len = vs.shape[0]
        if self.resolved_mode(t_len) != "parallel":
            return self.layer_scan(p, state, vs)
        positions = jnp.arange(t_len, dtype=vs.dtype)
        state, o = att.attention_parallel_from_start(state, *self._qkv(p, vs, positions))
        return state, self._out(p, o)

    def scan_from_start(self, params, xs):
        """The whole sequence from the initial caches: in the parallel mode ``T x T``
        attention scores (``T x (max_len + T)`` from another cache)."""
        return self._run(self.layer_scan_from_start, params, self.initial_state(params), xs)

    def scan_time_major_from_start(self, params, xs):
        return jax.vmap(self.scan_from_start, in_axes=(None, 1), out_axes=(0, 1))(params, xs)

    def mlp(self, p, z):
        """``W_2 gelu(W_1 RMSNorm(z) + b_1) + b_2`` (exact gelu)."""
        hidden = jax.nn.gelu(rms_norm(z, p.mlp_norm) @ p.w_1 + p.b_1, approximate=False)
        return hidden @ p.w_2 + p.b_2

    def _run(self, layer_fn, params, state, x):
        """Embed ``x`` (plus the sinusoidal encoding), run the blocks (attention and MLP,
        each a pre-norm residual; scanned over depth), normalize."""
        z = x @ params.embed_weight + params.embed_bias
        if self.positional == "sinusoidal":
            start = state.position[0]  # every layer's cache counts the same steps
            positions = start if x.ndim == 1 else start + jnp.arange(x.shape[0], dtype=z.dtype)
            z = z + att.sinusoidal_encoding(positions, self.hidden_dim, self.rope_base)

        def block(z, xs):
            norm, p, s = xs
            s, a = layer_fn(p, s, rms_norm(z, norm))
            z = z + a
            return z + self.mlp(p, z), s

        z, state = jax.lax.scan(block, z, (params.norm, params.layers, state))
        return state, rms_norm(z, params.final_norm)


@register_model
@dataclasses.dataclass(frozen=True)
class Transformer(StackedBackboneModel, NeuralSequenceModel):
    """A causal softmax-attention Transformer (decoder-only, pre-norm) with an emission head.

        a_t = sum_{s = max(0, t - W + 1)}^{t} softmax_s(q_t . k_s / sqrt(D)) v_s   (per head),
        y_t | y_{<t}, u_{<=t} ~ head(features_t)

    (per block: multi-head attention and an MLP, each a pre-norm residual; RoPE or
    sinusoidal positions; module docstring). The network reads
    ``x_t = [enc(y_{t-1}), m_{t-1}, u_t]`` (`statseq.models.neural.base`); the filter state
    is one KV cache per block, ``(max_len, num_heads, hidden_dim / num_heads)`` keys and
    values and a position counter.

    Args:
        emission: the head (``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"``, ``"categorical"``).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a categorical head.
        input_dim: number of covariates ``u_t``.
        hidden_dim: model width ``d`` (a multiple of ``num_heads``).
        num_layers: number of blocks.
        num_heads: attention heads ``H``.
        max_len: the context window ``W``: each step attends to itself and the
            ``W - 1`` steps before it (a sliding window beyond ``W`` steps, in every mode).
        positional: ``"rope"`` (rotary, default), ``"sinusoidal"`` or ``None``.
        mlp_ratio: MLP width over ``hidden_dim``.
        rope_base: base of the rotary / sinusoidal frequencies.
        mode: whole-sequence evaluation, ``"parallel"``, ``"recurrent"`` (the KV-cache
            step in a scan) or ``None`` (`default_mode`: parallel up to 1024 steps,
            on GPU/TPU within 128 MiB per sequence; recurrent beyond).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.Transformer(hidden_dim=4, num_heads=2, max_len=16)
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    hidden_dim: int = 16
    num_layers: int = 2
    num_heads: int = 2
    max_len: int = 256
    positional: str | None = "rope"
    mlp_ratio: int = 4
    rope_base: float = 10000.0
    mode: str | None = None

    @property
    def backbone(self) -> TransformerBackbone:
        return TransformerBackbone(
            input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, num_heads=self.num_heads, max_len=self.max_len,
            positional=self.positional, mlp_ratio=self.mlp_ratio, rope_base=self.rope_base,
            mode=self.mode)
