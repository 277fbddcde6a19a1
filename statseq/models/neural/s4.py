"""S4D: stacked diagonal state space layers (one complex SSM per channel) with HiPPO init.

One S4D layer (Gu, Gupta, Goel and Ré 2022, *On the parameterization and initialization of
diagonal state space models*, NeurIPS; the diagonal S4 of Gu, Goel and Ré 2022) maps a
normalized input ``v_t`` (``H`` channels) through ``H`` independent single-input
single-output systems, each with ``N/2`` complex states (one of each conjugate pair of a
real state of size ``N``):

    a_{hn} = -exp(α_{hn}) + i ω_{hn}            (Re a < 0 for every real α: stable)
    Δ_h = exp(log Δ_h)                            (learnable time scale per channel)
    ā, b̄ = ZOH or bilinear discretization of (a, b) at step Δ   (eq. 3 / 4 of the paper)
    x_{t,hn} = ā_{hn} x_{t-1,hn} + b̄_{hn} v_{t,h}
    y_{t,h} = 2 Re sum_n c_{hn} x_{t,hn} + D_h v_{t,h}
    f(v)_t = (W_1 g_t + b_1) * sigmoid(W_2 g_t + b_2),   g_t = GELU(y_t)   (``output="glu"``)
           or W g_t + b                                                  (``output="gelu"``)

Layers are stacked with pre-norm residual connections (`statseq.models.neural.residual`).
Initialization: ``a`` by S4D-Inv (default), S4D-Lin or S4D-LegS
(`statseq.inference.hippo.s4d_init`), ``b = 1``, ``c`` complex standard normal, ``D``
standard normal, ``log Δ`` uniform on ``[log dt_min, log dt_max]`` (``1e-3``, ``1e-1``),
as in the paper's code. Differences from the paper: ``b`` is learned (the paper fixes
``b = 1`` and lets ``c`` absorb it in the minimal version), the residual block is
pre-norm RMSNorm (the paper post-norm LayerNorm), and no dropout.

**Three evaluation modes, one model** (``mode=``): ``"recurrent"`` (the recurrence by
``lax.scan``, as generation runs it), ``"scan"`` (the same recurrence by an associative
scan, `statseq.inference.linear_recurrence`) and ``"convolution"`` (the kernel
``K_j = 2 Re sum_n c_n b̄_n ā_n^j`` in closed form, `statseq.inference.diagonal_ssm.ssm_kernel`,
applied by FFT, `statseq.inference.diagonal_ssm.causal_convolution`, plus the free response
``2 Re sum_n c_n ā_n^{t+1} x_{-1,n}`` of a carried state). ``mode=None`` chooses by
backend (`default_mode` for S4D: the recurrence on CPU, the convolution on GPU/TPU;
`s5_default_mode` for S5: the recurrence on CPU, the scan on GPU/TPU; measured), and for
S4D on CPU by the estimated memory of the program (`program_bytes`: the convolution where
the recurrence would exceed 2 GiB). Generation
(`statseq.sample`, `statseq.forecast`,
the filter with missing values) runs one step at a time; each layer's complex state is
carried as a real array ``[Re x, Im x]`` (``(2, H, N/2)``). Tests show the modes give the
same log-probabilities and gradients to 1e-10 in float64.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int
from statseq.inference._backend import backend_kind
from statseq.inference.diagonal_ssm import (
    causal_convolution,
    discretize_bilinear,
    discretize_zoh,
    ssm_kernel,
)
from statseq.inference.hippo import S4D_INITS, s4d_init
from statseq.inference.linear_recurrence import linear_recurrence
from statseq.models.neural.residual import (
    ResidualStack,
    ResidualStackModel,
    check_mode,
    dense_init,
    resolve_mode,
)

#: Whole-sequence evaluation modes of the S4D and S5 layers.
MODES = ("recurrent", "scan", "convolution")
#: Discretizations of the continuous-time systems.
DISCRETIZATIONS = ("zoh", "bilinear")
#: Output mixings after the SSM.
OUTPUTS = ("glu", "gelu")
#: The convolution mode's final state sums the inputs in chunks of this many steps.
FINAL_STATE_CHUNK = 2048


#: ``mode=None`` leaves a mode whose program estimate (`program_bytes`) exceeds this many
#: bytes for the convolution when the convolution's estimate is smaller (S4D).
MAX_PROGRAM_BYTES = 2 * 2**30


def program_bytes(mode: str, *, batch: int, num_steps: int, width: int, state_dim: int,
                  num_layers: int = 1, itemsize: int = 4) -> int:
    """An estimate of the memory (bytes) of S4D's log-likelihood-and-gradient program over
    a batch in ``mode``: what the gradient keeps per step, linear in every size,

        recurrent:    5 B T L H N s,
        scan:        15 B T L H N s          (the associative scan's levels),
        convolution: (12 + 1.5 N) B T L H s  (the FFTs' length-2T signals, per channel),

    with ``B`` the batch, ``T`` the steps, ``L`` the layers, ``H`` the width, ``N`` the
    state size (``N/2`` complex states per channel) and ``s`` the bytes of a float. The
    constants are fitted to XLA's estimate (``compiled.memory_analysis()``, temporaries +
    arguments + outputs, as `benchmarks/bench_backbones.py` reports it) of
    ``jax.value_and_grad`` of the batch log-likelihood, float32, CPU: at ``(B, T, H, N, L)
    = (4..8, 1000..2000, 16..32, 16..32, 1..2)`` the recurrence measured 4.3-4.6, the scan
    9.9-14.8 (per ``B T L H N s``), the convolution 25-54 (per ``B T L H s``); at
    ``(32, 10^4, 64, 16, 2)`` (`benchmarks/RESULTS.md`, "Modern backbones") the recurrence
    13.1 GiB (formula: 12.2 GiB) and the convolution 3.2 GiB (formula: 5.5 GiB). Good to a
    factor 2: enough to choose a mode, not a memory budget.

    Args:
        mode: one of `MODES`.
        batch: sequences ``B``.
        num_steps: steps ``T``.
        width: the model width ``H``.
        state_dim: the state size ``N``.
        num_layers: layers ``L``.
        itemsize: bytes per float ``s`` (4 for float32, 8 for float64).

    Returns:
        The estimate in bytes.

    Examples:
        >>> round(program_bytes("recurrent", batch=32, num_steps=10**4, width=64,
        ...                     state_dim=16, num_layers=2) / 2**30, 1)
        12.2
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    cells = batch * num_steps * num_layers * width * itemsize
    per_cell = {"recurrent": 5.0 * state_dim, "scan": 15.0 * state_dim,
                "convolution": 12.0 + 1.5 * state_dim}[mode]
    return int(per_cell * cells)


def default_mode(num_steps: int, backend: str | None = None, *, batch: int = 1,
                 width: int | None = None, state_dim: int | None = None,
                 num_layers: int = 1, itemsize: int = 4,
                 max_bytes: int | None = None) -> str:
    """The whole-sequence mode that ``mode=None`` picks for S4D over ``num_steps`` steps.

    ``"recurrent"`` on CPU (the associative scan and the FFT do more arithmetic for no
    gain on a few cores: on the project's 2-core CPU, batch 1, the recurrence was the
    fastest at ``T = 10^2`` and ``10^3``, the convolution 1.4-1.6x and the scan 2.1-2.3x
    slower); ``"convolution"`` on GPU/TPU at every length (H100, training step, batch 32,
    width 64, ``N = 16``, 2 layers, float32: the convolution 0.95x, 0.44x, 0.38x the
    scan's time and 0.26x, 0.045x, 0.033x the recurrence's at ``T = 10^2, 10^3, 10^4``,
    and the least memory: 3.1 GiB at ``10^4`` against 12.0 GiB for the scan; TPU assumed
    like GPU, not measured). **Memory-aware** when the sizes are given (``width`` and
    ``state_dim``): if the recurrence's program is estimated (`program_bytes`) above
    ``max_bytes`` and the convolution's estimate is smaller, the convolution instead (on
    CPU at batch 32, ``T = 10^4``, width 64, ``N = 16``, two layers: recurrence 12.2 GiB,
    convolution 5.5 GiB).

    Args:
        num_steps: sequence length ``T``.
        backend: ``"cpu"``, ``"gpu"``, ``"tpu"`` (default: `jax.default_backend`).
        batch: sequences evaluated together ``B``.
        width: the model width ``H`` (``None``: no memory rule).
        state_dim: the state size ``N`` (``None``: no memory rule).
        num_layers: layers ``L``.
        itemsize: bytes per float.
        max_bytes: the threshold (``None``: `MAX_PROGRAM_BYTES`, 2 GiB).

    Returns:
        One of `MODES`.

    Examples:
        >>> default_mode(100, "cpu"), default_mode(100, "gpu"), default_mode(10_000, "gpu")
        ('recurrent', 'convolution', 'convolution')
        >>> default_mode(10_000, "cpu", batch=32, width=64, state_dim=16, num_layers=2)
        'convolution'
    """
    pick = "recurrent" if backend_kind(backend) == "cpu" else "convolution"
    if pick == "convolution" or width is None or state_dim is None:
        return pick
    max_bytes = MAX_PROGRAM_BYTES if max_bytes is None else max_bytes
    sizes = dict(batch=batch, num_steps=num_steps, width=width, state_dim=state_dim,
                 num_layers=num_layers, itemsize=itemsize)
    if (program_bytes(pick, **sizes) > max_bytes
            and program_bytes("convolution", **sizes) < program_bytes(pick, **sizes)):
        return "convolution"
    return pick


def s5_default_mode(num_steps: int, backend: str | None = None) -> str:
    """The whole-sequence mode that ``mode=None`` picks for S5 over ``num_steps`` steps.

    ``"recurrent"`` on CPU (on the project's 2-core CPU the three modes ran within noise
    of each other, 1.0-1.26x, at ``T = 10^2 .. 10^4``); ``"scan"`` on GPU/TPU at every
    length (H100, training step, batch 32, width 64, 2 layers, float32: the scan was the
    fastest at ``T = 10^2, 10^3, 10^4, 10^5``, the convolution 1.56x and 1.07x its time
    at ``10^2, 10^3``, the recurrence 6.3x, 28x, 73x at ``10^2 .. 10^4``; TPU assumed like
    GPU, not measured).

    Args:
        num_steps: sequence length ``T`` (the rule does not depend on it).
        backend: ``"cpu"``, ``"gpu"``, ``"tpu"`` (default: `jax.default_backend`).

    Returns:
        ``"recurrent"`` or ``"scan"``.

    Examples:
        >>> s5_default_mode(100, "cpu"), s5_default_mode(10**5, "gpu")
        ('recurrent', 'scan')
    """
    del num_steps
    return "recurrent" if backend_kind(backend) == "cpu" else "scan"


def _power_weighted_sum(log_a, vs):
    """``sum_j ā^{T-1-j} v_j`` ``(H, M)`` for ``vs`` ``(T, H)``, ``log ā`` ``(H, M)``, in
    chunks of ``c = min(T, FINAL_STATE_CHUNK)`` steps (front-padded with zeros): one
    ``(c, H, M)`` block of powers, per-chunk sums, then the chunks weighted by
    ``ā^{c (n-1-k)}``; memory ``O((c + T/c) H M)`` instead of ``O(T H M)``."""
    t_len = vs.shape[0]
    c = min(t_len, FINAL_STATE_CHUNK)
    n = -(-t_len // c)
    v = jnp.concatenate([jnp.zeros((n * c - t_len,) + vs.shape[1:], vs.dtype), vs])
    v = v.reshape((n, c) + vs.shape[1:])
    within = jnp.exp(jnp.arange(c - 1, -1, -1, dtype=vs.dtype)[:, None, None] * log_a)
    sums = jnp.einsum("ihm,kih->khm", within, v)  # (n, H, M)
    across = jnp.exp(c * jnp.arange(n - 1, -1, -1, dtype=vs.dtype)[:, None, None] * log_a)
    return jnp.sum(across * sums, axis=0)


def _real_state(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)])


def _complex_state(s):
    return jax.lax.complex(s[0], s[1])


@dataclasses.dataclass(frozen=True)
class DiagonalSSMStack(ResidualStack):
    """Fields and checks shared by the S4D and S5 backbones: a residual stack of
    diagonal complex linear time-invariant SSM layers with three evaluation modes.

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``H``.
        num_layers: number of layers.
        parallel: ``True`` is ``mode="scan"``, ``False`` is ``mode="recurrent"``.
        evaluation: ``None`` or ``"sequential"`` (``mode="recurrent"``).
        evaluation_max_iter: unused (no Newton evaluation: the layers are linear).
        state_dim: the real state size ``N`` (even: ``N/2`` conjugate pairs).
        mode: ``"recurrent"``, ``"scan"``, ``"convolution"`` or ``None`` (`default_mode`).
        discretization: ``"zoh"`` or ``"bilinear"``.
        output: ``"glu"`` or ``"gelu"`` output mixing.
        dt_min: smallest initial step ``Δ``.
        dt_max: largest initial step ``Δ``.
    """

    state_dim: int = 16
    mode: str | None = None
    discretization: str = "zoh"
    output: str = "glu"
    dt_min: float = 1e-3
    dt_max: float = 1e-1

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.state_dim, "state_dim")
        if self.state_dim % 2:
            raise ValueError(f"state_dim must be even (N/2 conjugate pairs), got "
                             f"{self.state_dim}")
        # linear recurrences, evaluated exactly in every mode: no Newton solver applies
        check_mode(self.mode, self.parallel, self.evaluation, modes=MODES,
                   name=type(self).__name__.removesuffix("Backbone"), parallel_modes=("scan",))
        if self.discretization not in DISCRETIZATIONS:
            raise ValueError(f"discretization must be one of {DISCRETIZATIONS}, got "
                             f"{self.discretization!r}")
        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {self.output!r}")
        if not 0.0 < self.dt_min <= self.dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={self.dt_min}, "
                             f"dt_max={self.dt_max}")

    @property
    def num_modes(self) -> int:
        """``N/2``: complex states kept (one per conjugate pair)."""
        return self.state_dim // 2

    #: Whether ``mode=None`` uses `default_mode`'s memory rule (`program_bytes` is fitted
    #: to S4D's programs; S5 keeps the backend/length rule).
    memory_aware_default = False

    def whole_sequence_mode(self, num_steps: int, batch: int = 1, itemsize: int = 4) -> str:
        """The mode that evaluates ``batch`` whole sequences of ``num_steps`` steps."""
        sizes = (dict(batch=batch, width=self.hidden_dim, state_dim=self.state_dim,
                      num_layers=self.num_layers, itemsize=itemsize)
                 if self.memory_aware_default else {})
        return resolve_mode(self.mode, self.parallel, self.evaluation, when_parallel="scan",
                            default=lambda: self.default_mode_rule(num_steps, **sizes))

    @staticmethod
    def default_mode_rule(num_steps: int, **sizes) -> str:
        """The backend/length rule of ``mode=None``: `default_mode` (S4D)."""
        return default_mode(num_steps, **sizes)

    def scan_time_major(self, params, state, xs):
        """A batch ``xs`` ``(T, B, input_dim)``: under ``mode=None`` the mode is chosen once
        for the whole batch (`whole_sequence_mode` with ``B``), then `scan` vmapped."""
        if self.mode is None and self.memory_aware_default:
            mode = self.whole_sequence_mode(xs.shape[0], batch=xs.shape[1],
                                            itemsize=jnp.dtype(xs.dtype).itemsize)
            return super(DiagonalSSMStack, dataclasses.replace(self, mode=mode)
                         ).scan_time_major(params, state, xs)
        return super().scan_time_major(params, state, xs)

    def _discretize(self, a, b, dt):
        fn = discretize_zoh if self.discretization == "zoh" else discretize_bilinear
        return fn(a, b, dt)

    def _out_shapes(self):
        h = self.hidden_dim
        k = 2 * h if self.output == "glu" else h
        return (h, k), (k,)

    def _out_init(self, key, dtype):
        (h, k), _ = self._out_shapes()
        return dense_init(key, (h, k), h, dtype), jnp.zeros((k,), dtype)

    def _mix(self, p, y):
        g = jax.nn.gelu(y, approximate=False)
        z = g @ p.out_weight + p.out_bias
        if self.output == "gelu":
            return z
        h = self.hidden_dim
        return z[..., :h] * jax.nn.sigmoid(z[..., h:])

    def _log_dt_init(self, key, shape, dtype):
        return jax.random.uniform(key, shape, dtype, math.log(self.dt_min),
                                  math.log(self.dt_max))


class S4DLayerParams(NamedTuple):
    """Parameters of one S4D layer (``H`` channels, ``M = N/2`` complex states each); in a
    stack every leaf has a leading layer axis.

    Attributes:
        log_dt: ``(H,)`` log time scales ``log Δ``.
        a_log_re: ``(H, M)``: ``Re a = -exp(a_log_re)``.
        a_im: ``(H, M)``: ``Im a``.
        b_re: ``(H, M)`` real part of ``b``.
        b_im: ``(H, M)`` imaginary part of ``b``.
        c_re: ``(H, M)`` real part of ``c``.
        c_im: ``(H, M)`` imaginary part of ``c``.
        d_skip: ``(H,)`` the skip ``D``.
        out_weight: ``(H, 2H)`` (GLU) or ``(H, H)`` (GELU) output mixing.
        out_bias: ``(2H,)`` or ``(H,)``.
    """

    log_dt: jax.Array
    a_log_re: jax.Array
    a_im: jax.Array
    b_re: jax.Array
    b_im: jax.Array
    c_re: jax.Array
    c_im: jax.Array
    d_skip: jax.Array
    out_weight: jax.Array
    out_bias: jax.Array


@dataclasses.dataclass(frozen=True)
class S4DBackbone(DiagonalSSMStack):
    """Stacked S4D layers as a `statseq.models.neural.base.Backbone`.

        x_{t,hn} = ā_{hn} x_{t-1,hn} + b̄_{hn} v_{t,h},
        y_{t,h} = 2 Re sum_n c_{hn} x_{t,hn} + D_h v_{t,h}

    (per layer, then GELU and a GLU; module docstring).

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``H`` (number of SSM channels).
        num_layers: number of layers.
        parallel: ``True`` is ``mode="scan"``, ``False`` is ``mode="recurrent"``.
        evaluation: ``None`` or ``"sequential"`` (``mode="recurrent"``).
        evaluation_max_iter: unused.
        state_dim: real state size ``N`` per channel (even).
        mode: ``"recurrent"``, ``"scan"``, ``"convolution"`` or ``None`` (`default_mode`).
        discretization: ``"zoh"`` or ``"bilinear"``.
        output: ``"glu"`` or ``"gelu"``.
        dt_min: smallest initial ``Δ``.
        dt_max: largest initial ``Δ``.
        init: ``"inv"`` (S4D-Inv), ``"lin"`` (S4D-Lin) or ``"legs"`` (S4D-LegS).

    Examples:
        >>> import jax
        >>> bb = S4DBackbone(input_dim=3, hidden_dim=4, state_dim=4)
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 3))).shape
        (5, 4)
    """

    init: str = "inv"
    memory_aware_default = True  # class attribute, not a field

    def __post_init__(self):
        super().__post_init__()
        if self.init not in S4D_INITS:
            raise ValueError(f"init must be one of {S4D_INITS}, got {self.init!r}")

    def layer_param_shapes(self) -> S4DLayerParams:
        h, m = self.hidden_dim, self.num_modes
        w, b = self._out_shapes()
        return S4DLayerParams((h,), (h, m), (h, m), (h, m), (h, m), (h, m), (h, m), (h,),
                              w, b)

    def layer_init(self, key, dtype) -> S4DLayerParams:
        h, m = self.hidden_dim, self.num_modes
        keys = jax.random.split(key, 5)
        a = s4d_init(self.state_dim, self.init)
        out_w, out_b = self._out_init(keys[4], dtype)
        normal = jax.random.normal
        return S4DLayerParams(
            log_dt=self._log_dt_init(keys[0], (h,), dtype),
            a_log_re=jnp.broadcast_to(jnp.log(jnp.asarray(-a.real, dtype)), (h, m)),
            a_im=jnp.broadcast_to(jnp.asarray(a.imag, dtype), (h, m)),
            b_re=jnp.ones((h, m), dtype),
            b_im=jnp.zeros((h, m), dtype),
            c_re=normal(keys[1], (h, m), dtype) * math.sqrt(0.5),
            c_im=normal(keys[2], (h, m), dtype) * math.sqrt(0.5),
            d_skip=normal(keys[3], (h,), dtype),
            out_weight=out_w,
            out_bias=out_b,
        )

    def layer_initial_state(self, layer_params):
        """``[Re x, Im x]`` ``(2, H, N/2)`` zeros (a real carry)."""
        return jnp.zeros((2, self.hidden_dim, self.num_modes), layer_params.log_dt.dtype)

    def discretized(self, p):
        """`statseq.inference.diagonal_ssm.Discretized` ``(ā, b̄, log ā)`` of one layer,
        each ``(H, N/2)``, and ``c`` ``(H, N/2)``."""
        a = jax.lax.complex(-jnp.exp(p.a_log_re), p.a_im)
        disc = self._discretize(a, jax.lax.complex(p.b_re, p.b_im),
                                jnp.exp(p.log_dt)[:, None])
        return disc, jax.lax.complex(p.c_re, p.c_im)

    def kernel(self, layer_params, length: int):
        """The layer's convolution kernel ``K_j = 2 Re sum_n c_n b̄_n ā_n^j``, ``(length, H)``
        (`statseq.inference.diagonal_ssm.ssm_kernel`): the response of each channel's SSM
        (before the skip ``D``) to a unit impulse.

        Args:
            layer_params: one layer's `S4DLayerParams` (index the stack's leading axis).
            length: number of taps.

        Returns:
            ``(length, H)`` real kernel.

        Examples:
            >>> import jax, statseq as ss
            >>> model = ss.S4D(hidden_dim=4, state_dim=8)
            >>> params = model.backbone.init_params(jax.random.key(0))
            >>> first = jax.tree.map(lambda a: a[0], params.layers)  # layer 0
            >>> model.backbone.kernel(first, 100).shape               # e.g. to plot
            (100, 4)
        """
        disc, c = self.discretized(layer_params)
        return ssm_kernel(disc.log_a_bar, disc.b_bar, c, length)

    def _readout(self, p, c, x, vs):
        y = 2.0 * jnp.sum(jnp.real(c) * jnp.real(x) - jnp.imag(c) * jnp.imag(x), axis=-1)
        return self._mix(p, y + p.d_skip * vs)

    def layer_step(self, p, state, v_t):
        disc, c = self.discretized(p)
        x = disc.a_bar * _complex_state(state) + disc.b_bar * v_t[:, None]
        return _real_state(x), self._readout(p, c, x, v_t)

    def layer_scan(self, p, state, vs):
        t_len = vs.shape[0]
        mode = self.whole_sequence_mode(t_len, itemsize=jnp.dtype(vs.dtype).itemsize)
        disc, c = self.discretized(p)
        x0 = _complex_state(state)
        if t_len == 0:
            return state, jnp.zeros_like(vs)
        if mode != "convolution":
            xs = linear_recurrence(disc.a_bar, disc.b_bar * vs[:, :, None], x0,
                                   parallel=mode == "scan")
            return _real_state(xs[-1]), self._readout(p, c, xs, vs)
        kernel = ssm_kernel(disc.log_a_bar, disc.b_bar, c, t_len)  # (T, H)
        free = ssm_kernel(disc.log_a_bar, disc.a_bar * x0, c, t_len)  # 2 Re c ā^{t+1} x0
        y = causal_convolution(kernel, vs) + free + p.d_skip * vs
        # final state x_{T-1} = ā^T x0 + sum_j ā^{T-1-j} b̄ v_j (the reversed Vandermonde)
        x_last = (jnp.exp(t_len * disc.log_a_bar) * x0
                  + disc.b_bar * _power_weighted_sum(disc.log_a_bar, vs))
        return _real_state(x_last), self._mix(p, y)


@register_model
@dataclasses.dataclass(frozen=True)
class S4D(ResidualStackModel):
    """Stacked S4D (diagonal state space) layers with an emission head.

        x_{t,hn} = ā_{hn} x_{t-1,hn} + b̄_{hn} v_{t,h},
        y_{t,h} = 2 Re sum_n c_{hn} x_{t,hn} + D_h v_{t,h},
        y_t | y_{<t}, u_{<=t} ~ head(features_t)

    (per layer and channel ``h``, ``N/2`` complex states, then GELU, a GLU, residual and
    RMSNorm; module docstring). The network reads ``x_t = [enc(y_{t-1}), m_{t-1}, u_t]``
    (`statseq.models.neural.base`). Whole, fully observed sequences are evaluated in
    ``mode`` (``"recurrent"``, ``"scan"`` or ``"convolution"``, all equal to rounding);
    generation and masked data run the one-step recurrence.

    Args:
        emission: the head (``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"``, ``"categorical"``).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a categorical head.
        input_dim: number of covariates ``u_t``.
        hidden_dim: model width ``H`` (SSM channels).
        state_dim: real state size ``N`` per channel (even; ``N/2`` complex states).
        num_layers: number of stacked layers.
        init: ``"inv"`` (S4D-Inv), ``"lin"`` (S4D-Lin) or ``"legs"`` (S4D-LegS).
        discretization: ``"zoh"`` (zero-order hold) or ``"bilinear"``.
        output: ``"glu"`` (GELU then a GLU) or ``"gelu"`` (GELU then a linear map).
        dt_min: smallest initial time step ``Δ``.
        dt_max: largest initial time step ``Δ``.
        mode: ``"recurrent"`` (``lax.scan``), ``"scan"`` (associative scan),
            ``"convolution"`` (Vandermonde kernel and FFT) or ``None`` (by backend and
            estimated memory, `default_mode`: the recurrence on CPU, the convolution there
            when the recurrence's program exceeds 2 GiB, the convolution on GPU/TPU).
        parallel: the older switch of the other backbones: ``True`` means
            ``mode="scan"``, ``False`` ``mode="recurrent"``; a contradiction with
            ``mode`` is a ValueError.
        evaluation: ``None`` or ``"sequential"`` (``mode="recurrent"``); the parallel
            Newton solvers are refused (the layers are linear: every mode is exact).
        evaluation_max_iter: unused (kept for a uniform signature).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.S4D(hidden_dim=4, state_dim=4, mode="convolution")
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    init: str = "inv"
    discretization: str = "zoh"
    output: str = "glu"
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    mode: str | None = None
    parallel: bool | None = None
    evaluation: str | None = None
    evaluation_max_iter: int | None = None

    @property
    def backbone(self) -> S4DBackbone:
        return S4DBackbone(
            input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, parallel=self.parallel, evaluation=self.evaluation,
            evaluation_max_iter=self.evaluation_max_iter, state_dim=self.state_dim,
            mode=self.mode, discretization=self.discretization, output=self.output,
            dt_min=float(self.dt_min), dt_max=float(self.dt_max), init=self.init,
        )
