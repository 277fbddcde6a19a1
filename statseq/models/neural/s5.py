"""S5: stacked multi-input multi-output diagonal state space layers (HiPPO-N init).

One S5 layer (Smith, Warrington and Linderman 2023, *Simplified state space layers for
sequence modeling*, ICLR) drives ONE shared diagonal state of ``P`` real dimensions (kept
as ``M = P/2`` complex states, one of each conjugate pair) with all ``H`` channels of the
normalized input ``v_t``:

    λ_m = -exp(α_m) + i ω_m,  Δ_m = exp(log Δ_m)          (per-state time scales)
    λ̄, B̄ = ZOH or bilinear discretization of (Λ, B̃) at steps Δ   (B̃: M x H complex)
    x_t = λ̄ * x_{t-1} + B̄ v_t                               (M, complex)
    y_t = 2 Re(C̃ x_t) + D * v_t                              (H; C̃: H x M complex)
    f(v)_t = (W_1 g_t + b_1) * sigmoid(W_2 g_t + b_2),  g_t = GELU(y_t)   (``output="glu"``)
           or W g_t + b                                                 (``output="gelu"``)

Initialization as the paper (Section 4.3 and its code): ``Λ`` and ``V`` the eigenvalues
and eigenvectors of HiPPO-N of size ``P`` (`statseq.inference.hippo.hippo_n_eig`), keeping
the ``P/2`` with positive imaginary part; ``B̃ = V^H B`` with ``B`` ``(P, H)`` LeCun
normal; ``C̃ = C V`` with ``C`` ``(H, P)`` complex normal of variance ``1/P`` per part;
``D`` standard normal; ``log Δ`` uniform on ``[log dt_min, log dt_max]``. Differences:
one block (the paper may repeat HiPPO-N in ``J`` blocks), ``Re λ = -exp(α)`` (the paper
clips ``Re λ`` to be negative), pre-norm RMSNorm residual blocks, no dropout.

**Three modes** (``mode=``, as `statseq.models.neural.s4`): ``"recurrent"`` (``lax.scan``),
``"scan"`` (associative scan, the paper's method) and ``"convolution"``: each diagonal
state is the causal convolution of ``B̄ v`` with its own kernel ``λ̄_m^j`` (the Vandermonde
columns, `statseq.inference.diagonal_ssm.ssm_kernel` per state) by FFT, then read out with
``C̃``; that is the convolution with the MIMO kernel ``K_j = 2 Re C̃ diag(λ̄^j) B̄``
(``(H, H)`` per lag, `ssm_kernel` with broadcast axes; a test checks the two), at ``P/2``
instead of ``H^2`` FFTs. Generation carries ``[Re x, Im x]`` ``(2, P/2)`` per layer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.model import register_model
from statseq.inference.diagonal_ssm import causal_convolution, ssm_kernel
from statseq.inference.hippo import hippo_n_eig
from statseq.inference.linear_recurrence import linear_recurrence
from statseq.models.neural.residual import ResidualStackModel
from statseq.models.neural.s4 import (
    DiagonalSSMStack,
    _complex_state,
    _real_state,
    s5_default_mode,
)


class S5LayerParams(NamedTuple):
    """Parameters of one S5 layer (``H`` channels, ``M = P/2`` complex states); in a stack
    every leaf has a leading layer axis.

    Attributes:
        log_dt: ``(M,)`` log time scales ``log Δ``, one per state.
        a_log_re: ``(M,)``: ``Re λ = -exp(a_log_re)``.
        a_im: ``(M,)``: ``Im λ``.
        b_re: ``(M, H)`` real part of ``B̃``.
        b_im: ``(M, H)`` imaginary part of ``B̃``.
        c_re: ``(H, M)`` real part of ``C̃``.
        c_im: ``(H, M)`` imaginary part of ``C̃``.
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
class S5Backbone(DiagonalSSMStack):
    """Stacked S5 layers as a `statseq.models.neural.base.Backbone`.

        x_t = λ̄ * x_{t-1} + B̄ v_t,   y_t = 2 Re(C̃ x_t) + D * v_t

    (per layer, then GELU and a GLU; module docstring).

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``H``.
        num_layers: number of layers.
        parallel: ``True`` is ``mode="scan"``, ``False`` is ``mode="recurrent"``.
        evaluation: ``None`` or ``"sequential"`` (``mode="recurrent"``).
        evaluation_max_iter: unused.
        state_dim: the shared real state size ``P`` (even).
        mode: ``"recurrent"``, ``"scan"``, ``"convolution"`` or ``None``
            (`statseq.models.neural.s4.s5_default_mode`: the recurrence on CPU, the scan
            on GPU/TPU).
        discretization: ``"zoh"`` or ``"bilinear"``.
        output: ``"glu"`` or ``"gelu"``.
        dt_min: smallest initial ``Δ``.
        dt_max: largest initial ``Δ``.

    Examples:
        >>> import jax
        >>> bb = S5Backbone(input_dim=3, hidden_dim=4, state_dim=6)
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 3))).shape
        (5, 4)
    """

    @staticmethod
    def default_mode_rule(num_steps: int, **sizes) -> str:
        """The backend rule of ``mode=None``: `statseq.models.neural.s4.s5_default_mode`."""
        del sizes  # S5's default is not memory-aware
        return s5_default_mode(num_steps)

    def layer_param_shapes(self) -> S5LayerParams:
        h, m = self.hidden_dim, self.num_modes
        w, b = self._out_shapes()
        return S5LayerParams((m,), (m,), (m,), (m, h), (m, h), (h, m), (h, m), (h,), w, b)

    def layer_init(self, key, dtype) -> S5LayerParams:
        h, p, m = self.hidden_dim, self.state_dim, self.num_modes
        keys = jax.random.split(key, 6)
        lam, v = hippo_n_eig(p)
        lam, v = lam[m:], v[:, m:]  # the eigenvalues with positive imaginary part
        normal = jax.random.normal
        b = normal(keys[1], (p, h), dtype) / math.sqrt(h)
        c = jax.lax.complex(normal(keys[2], (h, p), dtype), normal(keys[3], (h, p), dtype))
        v = jnp.asarray(v, c.dtype)
        b_t, c_t = v.conj().T @ b, (c / math.sqrt(p)) @ v
        out_w, out_b = self._out_init(keys[5], dtype)
        return S5LayerParams(
            log_dt=self._log_dt_init(keys[0], (m,), dtype),
            a_log_re=jnp.asarray(np.log(-lam.real), dtype), a_im=jnp.asarray(lam.imag, dtype),
            b_re=jnp.real(b_t), b_im=jnp.imag(b_t), c_re=jnp.real(c_t), c_im=jnp.imag(c_t),
            d_skip=normal(keys[4], (h,), dtype),
            out_weight=out_w, out_bias=out_b,
        )

    def layer_initial_state(self, layer_params):
        """``[Re x, Im x]`` ``(2, P/2)`` zeros (a real carry)."""
        return jnp.zeros((2, self.num_modes), layer_params.log_dt.dtype)

    def discretized(self, p):
        """`statseq.inference.diagonal_ssm.Discretized` ``(λ̄ (M,), B̄ (M, H), log λ̄)`` of
        one layer, and ``C̃`` ``(H, M)``."""
        lam = jax.lax.complex(-jnp.exp(p.a_log_re), p.a_im)
        disc = self._discretize(lam, jax.lax.complex(p.b_re, p.b_im), jnp.exp(p.log_dt))
        return disc, jax.lax.complex(p.c_re, p.c_im)

    def kernel(self, layer_params, length: int):
        """The layer's MIMO convolution kernel ``K_j = 2 Re C̃ diag(λ̄^j) B̄``,
        ``(length, H, H)`` (`statseq.inference.diagonal_ssm.ssm_kernel`): ``K_j[o, i]`` is
        output ``o``'s response (before the skip ``D``) ``j`` steps after a unit impulse
        on input ``i``.

        Args:
            layer_params: one layer's `S5LayerParams` (index the stack's leading axis).
            length: number of taps.

        Returns:
            ``(length, H, H)`` real kernel.

        Examples:
            >>> import jax, statseq as ss
            >>> model = ss.S5(hidden_dim=3, state_dim=8)
            >>> params = model.backbone.init_params(jax.random.key(0))
            >>> first = jax.tree.map(lambda a: a[0], params.layers)  # layer 0
            >>> model.backbone.kernel(first, 50).shape
            (50, 3, 3)
        """
        disc, c = self.discretized(layer_params)
        return ssm_kernel(disc.log_a_bar, disc.b_bar.T[None], c[:, None, :], length)

    def _readout(self, p, c, x, vs):
        y = 2.0 * (jnp.real(x) @ jnp.real(c).T - jnp.imag(x) @ jnp.imag(c).T)
        return self._mix(p, y + p.d_skip * vs)

    def _drive(self, disc, vs):
        """``B̄ v`` for ``vs`` ``(..., H)``: complex ``(..., M)``."""
        b = disc.b_bar
        return jax.lax.complex(vs @ jnp.real(b).T, vs @ jnp.imag(b).T)

    def layer_step(self, p, state, v_t):
        disc, c = self.discretized(p)
        x = disc.a_bar * _complex_state(state) + self._drive(disc, v_t)
        return _real_state(x), self._readout(p, c, x, v_t)

    def layer_scan(self, p, state, vs):
        t_len = vs.shape[0]
        mode = self.whole_sequence_mode(t_len)
        disc, c = self.discretized(p)
        x0 = _complex_state(state)
        if t_len == 0:
            return state, jnp.zeros_like(vs)
        drive = self._drive(disc, vs)  # (T, M)
        if mode != "convolution":
            xs = linear_recurrence(disc.a_bar, drive, x0, parallel=mode == "scan")
        else:
            j = jnp.arange(t_len, dtype=vs.dtype)[:, None]
            powers = jnp.exp(j * disc.log_a_bar)  # λ̄^j, (T, M): each state's kernel
            xs = causal_convolution(powers, drive) + powers * (disc.a_bar * x0)
        return _real_state(xs[-1]), self._readout(p, c, xs, vs)


@register_model
@dataclasses.dataclass(frozen=True)
class S5(ResidualStackModel):
    """Stacked S5 (MIMO diagonal state space) layers with an emission head.

        x_t = λ̄ * x_{t-1} + B̄ v_t,   y_t = 2 Re(C̃ x_t) + D * v_t,
        y_t | y_{<t}, u_{<=t} ~ head(features_t)

    (per layer one state of ``P/2`` complex dimensions shared by all ``H`` channels, then
    GELU, a GLU, residual and RMSNorm; `statseq.models.neural.s5`). The network reads
    ``x_t = [enc(y_{t-1}), m_{t-1}, u_t]``. Whole, fully observed sequences are evaluated
    in ``mode`` (``"recurrent"``, ``"scan"``, ``"convolution"``: equal to rounding);
    generation and masked data run the one-step recurrence.

    Args:
        emission: the head (``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"``, ``"categorical"``).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a categorical head.
        input_dim: number of covariates ``u_t``.
        hidden_dim: model width ``H``.
        state_dim: shared real state size ``P`` per layer (even; ``P/2`` complex states).
        num_layers: number of stacked layers.
        discretization: ``"zoh"`` (zero-order hold) or ``"bilinear"``.
        output: ``"glu"`` (GELU then a GLU) or ``"gelu"`` (GELU then a linear map).
        dt_min: smallest initial time step ``Δ``.
        dt_max: largest initial time step ``Δ``.
        mode: ``"recurrent"`` (``lax.scan``), ``"scan"`` (associative scan),
            ``"convolution"`` (per-state Vandermonde kernels and FFT) or ``None`` (by
            backend, `statseq.models.neural.s4.s5_default_mode`: the recurrence on CPU,
            the scan on GPU/TPU).
        parallel: ``True`` means ``mode="scan"``, ``False`` ``mode="recurrent"``; a
            contradiction with ``mode`` is a ValueError.
        evaluation: ``None`` or ``"sequential"`` (``mode="recurrent"``); the parallel
            Newton solvers are refused (the layers are linear).
        evaluation_max_iter: unused (kept for a uniform signature).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.S5(hidden_dim=4, state_dim=4, mode="scan")
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    discretization: str = "zoh"
    output: str = "glu"
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    mode: str | None = None
    parallel: bool | None = None
    evaluation: str | None = None
    evaluation_max_iter: int | None = None

    @property
    def backbone(self) -> S5Backbone:
        return S5Backbone(
            input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, parallel=self.parallel, evaluation=self.evaluation,
            evaluation_max_iter=self.evaluation_max_iter, state_dim=self.state_dim,
            mode=self.mode, discretization=self.discretization, output=self.output,
            dt_min=float(self.dt_min), dt_max=float(self.dt_max),
        )
