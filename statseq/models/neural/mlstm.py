"""mLSTM (xLSTM): stacked multi-head matrix-memory LSTM layers, as a neural sequence model.

One mLSTM layer (Beck et al. 2024, *xLSTM: extended long short-term memory*, NeurIPS,
eqs. (19)-(27) for the cell, Fig. 10 for the block) maps a normalized input ``v_t``
(``d``) through an inner width ``E = expand * d`` split into ``H`` heads of ``P = E / H``:

    [x_t, g_t] = W_up v_t                                       (E each)
    q_t = W_q x_t,  k_t = W_k x_t / sqrt(P),  v_t = W_v x_t      (per head: P)
    ĩ_t = w_i x_t + b_i,  f̃_t = w_f x_t + b_f                    (per head: scalars)
    i_t = exp(ĩ_t),  f_t = σ(f̃_t)  (or exp(f̃_t): forget_gate="exp")
    C_t = f_t C_{t-1} + i_t v_t k_t^T,   n_t = f_t n_{t-1} + i_t k_t      (P x P, P)
    h̃_t = C_t q_t / max(|n_t^T q_t|, 1)
    o_t = σ(W_o x_t + b_o),   f(v)_t = W_down (o_t ⊙ h̃_t ⊙ SiLU(g_t))     (d)

The exponential gates are computed stably with the stabilizer state ``m_t``
(`statseq.inference.matrix_memory`). Layers are stacked with pre-norm residual connections
(`statseq.models.neural.residual`).

**Modes.** ``mode="recurrent"``: the stabilized recurrence by ``lax.scan`` of the very step
used for generation (projections hoisted out of the scan); ``mode="parallel"``: the
``T x T`` log-space gate matrix with the row-maximum stabilizer (``O(H T^2)`` memory per
layer); ``mode="chunked"``: the parallel form within chunks of ``chunk_size`` steps and a
scan over the chunks (``O(H T L)`` memory); ``mode=None`` picks by backend, length and
estimated memory (`default_mode`; measured on CPU and an H100). Generation carries per
layer and head the state ``(C', n', m)``. Tests check the modes give the same
log-probabilities and gradients (float64, relative 1e-10) and the cell against the
unstabilized recurrence.

**Where we differ from the paper.** The block is simplified: no causal convolution before
the query/key projections, no learnable skip and no per-head group norm of ``h̃``; the
query, key and value projections are dense ``E x E`` (the paper: block-diagonal); the
output gate ``o_t`` of the cell equations is kept besides the block's ``SiLU(g_t)`` gate.
Gate initialization follows the reference code (forget-gate biases ``linspace(3, 6)``
across heads, input-gate biases ``N(0, 0.1^2)``); the weights are uniform
``±1/sqrt(fan_in)``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int
from statseq.inference._backend import backend_kind, quadratic_fits
from statseq.inference.matrix_memory import (
    MatrixMemoryState,
    matrix_memory_chunked,
    matrix_memory_initial_state,
    matrix_memory_parallel,
    matrix_memory_recurrent,
    matrix_memory_step,
)
from statseq.models.neural.base import NeuralSequenceModel
from statseq.models.neural.residual import (
    ResidualStack,
    StackedBackboneModel,
    check_mode,
    dense_init,
    resolve_mode,
)

#: Whole-sequence evaluation modes of `MLSTMBackbone`.
MODES = ("recurrent", "parallel", "chunked")

#: Forget gates: ``log f = log σ(f̃)`` or ``log f = f̃``.
FORGET_GATES = ("sigmoid", "exp")

#: Longest sequence evaluated by the parallel form under ``mode=None`` on CPU.
PARALLEL_MAX_TIMESTEPS = 1024
#: Longest sequence evaluated by the parallel form under ``mode=None`` on GPU/TPU (the
#: H100's measured crossover with the chunked form is at ``T ≈ 340``).
PARALLEL_MAX_TIMESTEPS_ACCELERATOR = 256
#: XLA's estimate of the parallel form's training step per ``(t, s)`` pair, head, layer
#: and byte of a float (H100, batch 32, width 64, 2 heads, 2 layers, float32: 3.56 GiB at
#: ``T = 10^3``, 304 GiB at ``10^4``, i.e. 7.5 and 6.4 per unit).
PARALLEL_BYTES_PER_PAIR = 7.5


def default_mode(num_timesteps: int, backend: str | None = None, *, num_heads: int = 2,
                 num_layers: int = 2, itemsize: int = 4, max_bytes: int | None = None) -> str:
    """The mode ``mode=None`` picks: ``"parallel"`` up to a length (its memory grows as
    ``T^2``), ``"chunked"`` beyond; the length is `PARALLEL_MAX_TIMESTEPS` (1024) on CPU
    and `PARALLEL_MAX_TIMESTEPS_ACCELERATOR` (256) on GPU/TPU, where the parallel form
    must also fit ``max_bytes`` per sequence (estimate ``PARALLEL_BYTES_PER_PAIR * H * L *
    itemsize * T^2``, `statseq.inference._backend.quadratic_fits`, 128 MiB).

    **CPU** (this project's 2 cores; training step, width 64, 2 layers, float32;
    `benchmarks/RESULTS.md`): the parallel form 3-12 times faster than the recurrence up
    to ``T = 10^3``; at ``T = 10^4`` (batch 1, nothing else running) the chunked form 5.6
    times faster than the recurrence with an estimated 0.37 GiB against 3.3 GiB, and at
    batch 32 the recurrence's program was estimated at 97 GiB against 11.6 GiB.
    **GPU** (H100, same step, batch 32; "Modern backbones on a GPU"): the parallel form
    fastest at ``T = 100`` (chunked 1.12x its time), the chunked form at ``T = 1000``
    (parallel 1.10x, with 3.6 GiB against 1.1 GiB): paired crossover ``T ≈ 340``; at
    ``T = 10^4`` the parallel program was estimated at 304 GiB (not run), the chunked form
    took 76 ms per step. TPU assumed like GPU, not measured.

    Args:
        num_timesteps: the sequence length ``T``.
        backend: ``"cpu"``, ``"gpu"``, ``"tpu"`` (``None``: `jax.default_backend`).
        num_heads: ``H`` (for the memory estimate).
        num_layers: ``L`` (for the memory estimate).
        itemsize: bytes per float (for the memory estimate).
        max_bytes: the memory bound per sequence on GPU/TPU (``None``: 128 MiB).

    Returns:
        ``"parallel"`` or ``"chunked"``.

    Examples:
        >>> default_mode(100, "cpu"), default_mode(1000, "cpu"), default_mode(1000, "gpu")
        ('parallel', 'parallel', 'chunked')
    """
    if backend_kind(backend) == "cpu":
        return "parallel" if num_timesteps <= PARALLEL_MAX_TIMESTEPS else "chunked"
    if num_timesteps > PARALLEL_MAX_TIMESTEPS_ACCELERATOR:
        return "chunked"
    per_pair = PARALLEL_BYTES_PER_PAIR * num_heads * num_layers * itemsize
    return "parallel" if quadratic_fits(num_timesteps, per_pair, max_bytes) else "chunked"


class MLSTMLayerParams(NamedTuple):
    """Parameters of one mLSTM layer (``d`` width, ``E`` inner width, ``H`` heads); in a
    stack every leaf has a leading layer axis.

    Attributes:
        up_proj: ``(d, 2E)``: ``[x, g] = v @ up_proj``.
        query: ``(E, E)`` ``W_q`` (``x @ W``; heads are consecutive blocks of ``P``).
        key: ``(E, E)`` ``W_k``.
        value: ``(E, E)`` ``W_v``.
        igate_weight: ``(E, H)``.
        igate_bias: ``(H,)``.
        fgate_weight: ``(E, H)``.
        fgate_bias: ``(H,)``.
        ogate_weight: ``(E, E)``.
        ogate_bias: ``(E,)``.
        down_proj: ``(E, d)``.
    """

    up_proj: jax.Array
    query: jax.Array
    key: jax.Array
    value: jax.Array
    igate_weight: jax.Array
    igate_bias: jax.Array
    fgate_weight: jax.Array
    fgate_bias: jax.Array
    ogate_weight: jax.Array
    ogate_bias: jax.Array
    down_proj: jax.Array


@dataclasses.dataclass(frozen=True)
class MLSTMBackbone(ResidualStack):
    """Stacked multi-head mLSTM layers as a `statseq.models.neural.base.Backbone`.

        C_t = f_t C_{t-1} + i_t v_t k_t^T,  n_t = f_t n_{t-1} + i_t k_t,
        h̃_t = C_t q_t / max(|n_t^T q_t|, 1)                    (per layer and head)

    See the module docstring for the full layer.

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``d``.
        num_layers: number of layers.
        parallel: ``True`` is ``mode="parallel"``, ``False`` is ``mode="recurrent"``.
        evaluation: ``None`` or ``"sequential"`` (``mode="recurrent"``).
        evaluation_max_iter: unused (no Newton solver).
        num_heads: ``H``.
        expand: ``E = expand * d`` (a multiple of ``H``).
        forget_gate: ``"sigmoid"`` or ``"exp"``.
        mode: ``"recurrent"``, ``"parallel"``, ``"chunked"`` or ``None`` (`default_mode`).
        chunk_size: steps per chunk of ``mode="chunked"``.

    Raises:
        ValueError: for an unknown ``mode``, ``forget_gate``, a ``mode`` that contradicts
            ``parallel`` / ``evaluation``, or ``E`` not a multiple of ``H``.

    Examples:
        >>> import jax
        >>> bb = MLSTMBackbone(input_dim=3, hidden_dim=4, num_heads=2, mode="parallel")
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 3))).shape
        (5, 4)
    """

    num_heads: int = 2
    expand: int = 2
    forget_gate: str = "sigmoid"
    mode: str | None = None
    chunk_size: int = 64

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.num_heads, "num_heads")
        check_positive_int(self.chunk_size, "chunk_size")
        check_positive_int(self.expand, "expand")
        if self.forget_gate not in FORGET_GATES:
            raise ValueError(f"forget_gate must be one of {FORGET_GATES}, "
                             f"got {self.forget_gate!r}")
        if self.inner_dim % self.num_heads:
            raise ValueError(f"expand * hidden_dim = {self.inner_dim} must be a multiple of "
                             f"num_heads = {self.num_heads}")
        check_mode(self.mode, self.parallel, self.evaluation, modes=MODES, name="MLSTM",
                   parallel_modes=("parallel", "chunked"))

    @property
    def inner_dim(self) -> int:
        """``E = expand * hidden_dim``."""
        return self.expand * self.hidden_dim

    @property
    def head_dim(self) -> int:
        """``P = E / H``."""
        return self.inner_dim // self.num_heads

    def mode_for(self, num_timesteps: int) -> str:
        """The mode that evaluates a sequence of ``num_timesteps`` steps."""
        return resolve_mode(self.mode, self.parallel, self.evaluation, when_parallel="parallel",
                            default=lambda: default_mode(
                                num_timesteps, num_heads=self.num_heads,
                                num_layers=self.num_layers))

    def layer_param_shapes(self) -> MLSTMLayerParams:
        d, e, h = self.hidden_dim, self.inner_dim, self.num_heads
        return MLSTMLayerParams((d, 2 * e), (e, e), (e, e), (e, e), (e, h), (h,), (e, h),
                                (h,), (e, e), (e,), (e, d))

    def layer_init(self, key, dtype) -> MLSTMLayerParams:
        d, e, h = self.hidden_dim, self.inner_dim, self.num_heads
        keys = jax.random.split(key, 9)
        return MLSTMLayerParams(
            up_proj=dense_init(keys[0], (d, 2 * e), d, dtype),
            query=dense_init(keys[1], (e, e), e, dtype),
            key=dense_init(keys[2], (e, e), e, dtype),
            value=dense_init(keys[3], (e, e), e, dtype),
            igate_weight=dense_init(keys[4], (e, h), e, dtype),
            igate_bias=0.1 * jax.random.normal(keys[5], (h,), dtype),
            fgate_weight=dense_init(keys[6], (e, h), e, dtype),
            fgate_bias=jnp.linspace(3.0, 6.0, h, dtype=dtype),
            ogate_weight=dense_init(keys[7], (e, e), e, dtype),
            ogate_bias=jnp.zeros((e,), dtype),
            down_proj=dense_init(keys[8], (e, d), e, dtype) / math.sqrt(self.num_layers),
        )

    def layer_initial_state(self, layer_params) -> MatrixMemoryState:
        dtype = layer_params.igate_bias.dtype
        one = matrix_memory_initial_state(self.head_dim, dtype)
        return jax.tree.map(lambda a: jnp.broadcast_to(a, (self.num_heads,) + a.shape), one)

    def _inputs(self, p, vs):
        """Per-head ``q, k, v`` ``(T, H, P)``, gates ``ĩ, log f`` ``(T, H)``, the output
        gate ``o`` and the block gate ``g`` ``(T, E)``."""
        e, h, hd = self.inner_dim, self.num_heads, self.head_dim
        xg = vs @ p.up_proj
        x, g = xg[..., :e], xg[..., e:]
        heads = lambda a: a.reshape(a.shape[:-1] + (h, hd))  # noqa: E731
        q, k, v = heads(x @ p.query), heads(x @ p.key) / math.sqrt(hd), heads(x @ p.value)
        i_pre = x @ p.igate_weight + p.igate_bias
        f_pre = x @ p.fgate_weight + p.fgate_bias
        log_f = jax.nn.log_sigmoid(f_pre) if self.forget_gate == "sigmoid" else f_pre
        o = jax.nn.sigmoid(x @ p.ogate_weight + p.ogate_bias)
        return q, k, v, i_pre, log_f, o, g

    def _output(self, p, h_tilde, o, g):
        h = h_tilde.reshape(h_tilde.shape[:-2] + (self.inner_dim,))
        return (o * h * jax.nn.silu(g)) @ p.down_proj

    def layer_step(self, p, state, v_t):
        q, k, v, i_pre, log_f, o, g = self._inputs(p, v_t)
        state, h_tilde = jax.vmap(matrix_memory_step)(state, q, k, v, i_pre, log_f)
        return state, self._output(p, h_tilde, o, g)

    def layer_scan(self, p, state, vs):
        """A whole sequence ``vs`` ``(T, d)`` in the mode `mode_for` picks."""
        q, k, v, i_pre, log_f, o, g = self._inputs(p, vs)
        mode = self.mode_for(vs.shape[0])
        if mode == "chunked":
            def memory(*args):
                return matrix_memory_chunked(*args, chunk_size=self.chunk_size)
        else:
            memory = matrix_memory_parallel if mode == "parallel" else matrix_memory_recurrent
        state, h_tilde = jax.vmap(memory, in_axes=(1, 1, 1, 1, 1, 0), out_axes=(0, 1))(
            q, k, v, i_pre, log_f, state)
        return state, self._output(p, h_tilde, o, g)


@register_model
@dataclasses.dataclass(frozen=True)
class MLSTM(StackedBackboneModel, NeuralSequenceModel):
    """Stacked multi-head mLSTM (matrix-memory xLSTM) layers with an emission head.

        C_t = f_t C_{t-1} + i_t v_t k_t^T,  n_t = f_t n_{t-1} + i_t k_t,
        h_t = o_t ⊙ C_t q_t / max(|n_t^T q_t|, 1),
        y_t | y_{<t}, u_{<=t} ~ head(features_t)

    (per layer and head, with the exponential input gate ``i_t = exp(ĩ_t)`` and a sigmoid or
    exponential forget gate, computed stably; module docstring). The network reads
    ``x_t = [enc(y_{t-1}), m_{t-1}, u_t]`` (`statseq.models.neural.base`).

    Args:
        emission: the head (``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"``, ``"categorical"``).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a categorical head.
        input_dim: number of covariates ``u_t``.
        hidden_dim: model width ``d``.
        num_layers: number of layers.
        num_heads: heads ``H`` per layer.
        expand: inner width ``E = expand * d`` (a multiple of ``H``).
        forget_gate: ``"sigmoid"`` (default) or ``"exp"``.
        mode: whole-sequence evaluation: ``"recurrent"`` (the stabilized recurrence by
            ``lax.scan``), ``"parallel"`` (the ``T x T`` log-space gate matrix),
            ``"chunked"`` (the parallel form within chunks of ``chunk_size`` steps, a scan
            over the chunks: ``O(T L)`` memory) or ``None``
            (`statseq.models.neural.mlstm.default_mode`: parallel up to 1024 steps on
            CPU and 256 on GPU/TPU, chunked beyond).
        chunk_size: steps per chunk of ``mode="chunked"``.

    Raises:
        ValueError: for a bad width, depth, head count or gate, or an unknown ``mode``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.MLSTM(hidden_dim=4, num_heads=2, num_layers=1, mode="parallel")
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    hidden_dim: int = 16
    num_layers: int = 2
    num_heads: int = 2
    expand: int = 2
    forget_gate: str = "sigmoid"
    mode: str | None = None
    chunk_size: int = 64

    @property
    def backbone(self) -> MLSTMBackbone:
        return MLSTMBackbone(input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
                             num_layers=self.num_layers, num_heads=self.num_heads,
                             expand=self.expand, forget_gate=self.forget_gate,
                             mode=self.mode, chunk_size=self.chunk_size)
