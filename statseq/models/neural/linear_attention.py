"""Causal linear attention (Katharopoulos et al. 2020) as a neural sequence model.

One layer (Katharopoulos, Vyas, Pappas and Fleuret 2020, *Transformers are RNNs: fast
autoregressive transformers with linear attention*, ICML) maps a normalized input
``v_t`` (``d``) through ``H`` heads of width ``D`` (per head ``h``):

    q_t = phi(W_Q^h v_t),  k_t = phi(W_K^h v_t),  u_t = W_V^h v_t       (D each)
    S_t = γ_h S_{t-1} + k_t u_t^T,   z_t = γ_h z_{t-1} + k_t                (D x D, D)
    o^h_t = S_t^T q_t / (z_t^T q_t + eps)                                 (the paper's eq. 18-20)
    f(v)_t = W_O [o^1_t, ..., o^H_t]                                      (d)

with ``phi(x) = elu(x) + 1`` (eq. 7; ``"relu"`` and ``"softplus"`` are offered too) and
the decay ``γ_h``: 1 (``decay=None``, the paper), a fixed number in ``(0, 1]``, or learned
per head (``decay="learned"``, ``γ_h = sigmoid(θ_h)``, initialized at RetNet's
``γ_h = 1 - 2^{-5-h}``, Sun et al. 2023). Layers are stacked with pre-norm residual
connections (`statseq.models.neural.residual`). ``eps`` is added once to the
denominator, in every mode (`statseq.inference.linear_attention`).

**Where this differs from the paper.** The paper's transformer layer has a second,
feed-forward sub-block after attention, and no decay; here one residual layer is the
attention sub-block only (as one Mamba or LRU layer is one mixer), and the decay is an
option. The bias-free projections are the paper's.

**Modes** (``mode=``, all equal to rounding: a test checks 1e-10 in float64):
``"recurrent"`` (`jax.lax.scan` of the generation step, state ``(S, z)`` per layer),
``"parallel"`` (the masked ``T x T`` attention matrix, ``O(T^2)`` memory) and
``"chunked"`` (blocks of ``chunk_size`` steps, ``O(T)`` memory); ``None`` picks one by
backend, length and estimated memory (`default_mode`; measured on CPU and an H100).
Generation (`statseq.sample`, `statseq.forecast`,
the filter with missing data) always takes one recurrent step at a time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int
from statseq.inference import linear_attention as la
from statseq.inference._backend import backend_kind, quadratic_fits
from statseq.models.neural.base import NeuralSequenceModel
from statseq.models.neural.residual import (
    ResidualStack,
    StackedBackboneModel,
    check_mode,
    dense_init,
    resolve_mode,
)

#: Whole-sequence evaluation modes of `LinearAttentionBackbone`.
MODES = ("recurrent", "parallel", "chunked")


#: ``mode=None`` on GPU/TPU: the parallel form up to this many steps (memory permitting).
PARALLEL_MAX_T = 1024
#: XLA's estimate of the parallel form's training step per ``(t, s)`` pair, head, layer and
#: byte of a float (H100, batch 32, width 64, 2 heads, 2 layers, float32: 1.26 GiB at
#: ``T = 10^3``, 122 GiB at ``10^4``, i.e. 2.64 and 2.56 per unit).
PARALLEL_BYTES_PER_PAIR = 2.7


def default_mode(num_timesteps: int, chunk_size: int, backend: str | None = None, *,
                 num_heads: int = 2, num_layers: int = 2, itemsize: int = 4,
                 max_bytes: int | None = None) -> str:
    """The mode ``mode=None`` picks.

    **CPU**: the parallel form for sequences of at most one chunk (one matrix product),
    the chunked form beyond (``O(T)`` memory). Measured on this project's 2-core CPU with
    nothing else running (training step, batch 32, float32, 2 layers; `benchmarks/
    RESULTS.md`, "Modern backbones"): at width 64 (2 heads of 32) the parallel form was
    fastest at ``T = 100`` (2.4x the recurrence) and the chunked form at ``T = 1000``
    (1.9x), and at ``T = 10^4`` the recurrence's program needed an estimated 10.6 GiB
    against the chunked form's 3.8 GiB; at the default width 16 (heads of 8) the chunked
    form and the recurrence ran within 11% of each other.

    **GPU/TPU**: the parallel form up to `PARALLEL_MAX_T` steps while its estimated memory
    per sequence, ``PARALLEL_BYTES_PER_PAIR * H * L * itemsize * T^2``, stays within
    ``max_bytes`` (`statseq.inference._backend.quadratic_fits`, 128 MiB), the chunked form
    beyond. Measured on an H100 (same step, width 64, batch 32; `benchmarks/RESULTS.md`,
    "Modern backbones on a GPU"): the parallel form fastest at ``T = 100`` (chunked 1.82x
    its time, recurrence 7.6x) and ``T = 1000`` (chunked 1.06x, recurrence 12.8x); at
    ``T = 10^4`` its program was estimated at 122 GiB (not run) and the chunked form took
    40 ms per step (3.6 GiB). TPU assumed like GPU, not measured.

    Args:
        num_timesteps: ``T``.
        chunk_size: the model's ``chunk_size``.
        backend: ``jax.default_backend()`` when ``None``.
        num_heads: ``H`` (for the memory estimate).
        num_layers: ``L`` (for the memory estimate).
        itemsize: bytes per float (for the memory estimate).
        max_bytes: the memory bound per sequence (``None``: 128 MiB).

    Returns:
        ``"parallel"`` or ``"chunked"``.

    Examples:
        >>> [default_mode(t, 64, backend) for t, backend in
        ...  ((1000, "cpu"), (16, "gpu"), (1000, "gpu"), (10**4, "gpu"))]
        ['chunked', 'parallel', 'parallel', 'chunked']
    """
    if num_timesteps <= chunk_size:
        return "parallel"
    if backend_kind(backend) == "cpu" or num_timesteps > PARALLEL_MAX_T:
        return "chunked"
    per_pair = PARALLEL_BYTES_PER_PAIR * num_heads * num_layers * itemsize
    return "parallel" if quadratic_fits(num_timesteps, per_pair, max_bytes) else "chunked"


class LinearAttentionLayerParams(NamedTuple):
    """Parameters of one linear-attention layer (``d`` width, ``H`` heads of width
    ``D``); in a stack every leaf has a leading layer axis.

    Attributes:
        w_q: ``(d, H D)`` query projection (``v @ w_q``).
        w_k: ``(d, H D)`` key projection.
        w_v: ``(d, H D)`` value projection.
        w_o: ``(H D, d)`` output projection.
        decay: ``(H,)`` logits ``θ``, ``γ = sigmoid(θ)``, for ``decay="learned"``; else
            ``(0,)`` (no parameter).
    """

    w_q: jax.Array
    w_k: jax.Array
    w_v: jax.Array
    w_o: jax.Array
    decay: jax.Array


@dataclasses.dataclass(frozen=True)
class LinearAttentionBackbone(ResidualStack):
    """Stacked causal linear-attention layers as a `statseq.models.neural.base.Backbone`.

        S_t = γ S_{t-1} + phi(k_t) v_t^T,  z_t = γ z_{t-1} + phi(k_t),
        o_t = S_t^T phi(q_t) / (z_t^T phi(q_t) + eps)        (per head; module docstring)

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``d``.
        num_layers: number of layers.
        parallel: ``None``; ``False`` asks for the recurrent mode and ``True`` for a
            non-recurrent one (``mode`` says which, else `default_mode`'s GPU rule; a
            contradiction is refused).
        evaluation: ``None`` or ``"sequential"`` (the recurrent mode); the Newton
            solvers are refused (the recurrence is linear: use ``mode``).
        evaluation_max_iter: must stay ``None``.
        num_heads: ``H``.
        head_dim: ``D`` (default ``hidden_dim // num_heads``).
        feature_map: ``"elu+1"``, ``"relu"`` or ``"softplus"``.
        decay: ``None`` (γ = 1), a number in ``(0, 1]`` or ``"learned"``.
        eps: added to the denominator.
        mode: ``"recurrent"``, ``"parallel"``, ``"chunked"`` or ``None`` (`default_mode`).
        chunk_size: block size of the chunked mode.

    Raises:
        ValueError: for a bad field or a contradictory ``mode`` / ``parallel`` /
            ``evaluation``.

    Examples:
        >>> import jax
        >>> bb = LinearAttentionBackbone(input_dim=3, hidden_dim=4, num_heads=2)
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 3))).shape
        (5, 4)
    """

    num_heads: int = 2
    head_dim: int | None = None
    feature_map: str = "elu+1"
    decay: float | str | None = None
    eps: float = 1e-6
    mode: str | None = None
    chunk_size: int = 64

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.num_heads, "num_heads")
        if self.head_dim is not None:
            check_positive_int(self.head_dim, "head_dim")
        elif self.hidden_dim < self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be at most hidden_dim "
                             f"({self.hidden_dim}) unless head_dim is given")
        check_positive_int(self.chunk_size, "chunk_size")
        if self.feature_map not in la.FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {la.FEATURE_MAPS}, "
                             f"got {self.feature_map!r}")
        if self.decay is not None and self.decay != "learned":
            if isinstance(self.decay, bool) or not isinstance(self.decay, (int, float)) \
                    or not 0.0 < float(self.decay) <= 1.0:
                raise ValueError("decay must be None, 'learned' or a number in (0, 1], "
                                 f"got {self.decay!r}")
        if not isinstance(self.eps, (int, float)) or isinstance(self.eps, bool) \
                or not 0.0 <= float(self.eps) < math.inf:
            raise ValueError(f"eps must be a non-negative number, got {self.eps!r}")
        check_mode(self.mode, self.parallel, self.evaluation, modes=MODES,
                   name="LinearAttention", parallel_modes=("parallel", "chunked"),
                   evaluation_max_iter=self.evaluation_max_iter)

    @property
    def dim_head(self) -> int:
        """``D``: ``head_dim`` or ``hidden_dim // num_heads``."""
        return self.head_dim if self.head_dim is not None else self.hidden_dim // self.num_heads

    def resolved_mode(self, num_timesteps: int) -> str:
        """The mode used for a whole sequence of ``num_timesteps`` steps."""
        return resolve_mode(  # parallel=True: a non-recurrent form, as on a GPU
            self.mode, self.parallel, self.evaluation,
            when_parallel=lambda: default_mode(num_timesteps, self.chunk_size, backend="gpu",
                                               **self._memory_sizes),
            default=lambda: default_mode(num_timesteps, self.chunk_size,
                                         **self._memory_sizes))

    @property
    def _memory_sizes(self) -> dict:
        return dict(num_heads=self.num_heads, num_layers=self.num_layers)

    def layer_param_shapes(self) -> LinearAttentionLayerParams:
        d, hd = self.hidden_dim, self.num_heads * self.dim_head
        return LinearAttentionLayerParams(
            (d, hd), (d, hd), (d, hd), (hd, d),
            (self.num_heads,) if self.decay == "learned" else (0,))

    def layer_init(self, key, dtype) -> LinearAttentionLayerParams:
        d, hd = self.hidden_dim, self.num_heads * self.dim_head
        keys = jax.random.split(key, 4)
        if self.decay == "learned":  # RetNet: γ_h = 1 - 2^{-5-h}, θ = logit(γ)
            decay = jnp.log(2.0 ** (5.0 + jnp.arange(self.num_heads, dtype=dtype)) - 1.0)
        else:
            decay = jnp.zeros((0,), dtype)
        return LinearAttentionLayerParams(
            w_q=dense_init(keys[0], (d, hd), d, dtype),
            w_k=dense_init(keys[1], (d, hd), d, dtype),
            w_v=dense_init(keys[2], (d, hd), d, dtype),
            w_o=dense_init(keys[3], (hd, d), hd, dtype) / math.sqrt(self.num_layers),
            decay=decay,
        )

    def layer_initial_state(self, layer_params) -> la.LinearAttentionState:
        h, dh, dtype = self.num_heads, self.dim_head, layer_params.w_q.dtype
        return la.LinearAttentionState(jnp.zeros((h, dh, dh), dtype),
                                       jnp.zeros((h, dh), dtype))

    def log_gamma(self, p):
        """``log γ`` per head ``(H,)``."""
        dtype = p.w_q.dtype
        if self.decay == "learned":
            return jax.nn.log_sigmoid(p.decay)
        value = 0.0 if self.decay is None else math.log(float(self.decay))
        return jnp.full((self.num_heads,), value, dtype)

    def _qkv(self, p, vs):
        """Features ``phi(q)``, ``phi(k)`` and values, ``(..., H, D)`` each."""
        shape = vs.shape[:-1] + (self.num_heads, self.dim_head)
        q = la.feature_map(vs @ p.w_q, self.feature_map).reshape(shape)
        k = la.feature_map(vs @ p.w_k, self.feature_map).reshape(shape)
        return q, k, (vs @ p.w_v).reshape(shape)

    def _out(self, p, o):
        return o.reshape(o.shape[:-2] + (-1,)) @ p.w_o

    def layer_step(self, p, state, v_t):
        state, o = la.linear_attention_step(state, *self._qkv(p, v_t), self.log_gamma(p),
                                            self.eps)
        return state, self._out(p, o)

    def layer_scan(self, p, state, vs):
        mode = self.resolved_mode(vs.shape[0])
        state, o = la.linear_attention(state, *self._qkv(p, vs), self.log_gamma(p),
                                       self.eps, mode=mode, chunk_size=self.chunk_size)
        return state, self._out(p, o)


@register_model
@dataclasses.dataclass(frozen=True)
class LinearAttention(StackedBackboneModel, NeuralSequenceModel):
    """Stacked causal linear attention (Katharopoulos et al. 2020) with an emission head.

        S_t = γ S_{t-1} + phi(k_t) v_t^T,   z_t = γ z_{t-1} + phi(k_t),
        o_t = S_t^T phi(q_t) / (z_t^T phi(q_t) + eps),
        y_t | y_{<t}, u_{<=t} ~ head(features_t)

    (per head and layer, then the output projection, residual and RMSNorm; module
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
        num_heads: attention heads ``H``.
        head_dim: width of a head (default ``hidden_dim // num_heads``).
        feature_map: ``"elu+1"`` (the paper), ``"relu"`` or ``"softplus"``.
        decay: ``None`` (no decay, the paper), a fixed ``γ`` in ``(0, 1]``, or
            ``"learned"`` (one ``γ_h = sigmoid(θ_h)`` per head).
        eps: added to the normalizer ``z_t^T phi(q_t)``.
        mode: whole-sequence evaluation: ``"recurrent"``, ``"parallel"``, ``"chunked"``
            or ``None`` (`default_mode`: on CPU parallel up to one chunk, chunked beyond;
            on GPU/TPU parallel up to 1024 steps within 128 MiB per sequence, chunked
            beyond).
        chunk_size: block size of the chunked mode.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.LinearAttention(hidden_dim=4, num_heads=2, decay="learned")
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    hidden_dim: int = 16
    num_layers: int = 2
    num_heads: int = 2
    head_dim: int | None = None
    feature_map: str = "elu+1"
    decay: float | str | None = None
    eps: float = 1e-6
    mode: str | None = None
    chunk_size: int = 64

    @property
    def backbone(self) -> LinearAttentionBackbone:
        return LinearAttentionBackbone(
            input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, num_heads=self.num_heads, head_dim=self.head_dim,
            feature_map=self.feature_map, decay=self.decay, eps=self.eps, mode=self.mode,
            chunk_size=self.chunk_size)


