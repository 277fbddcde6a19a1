"""Mamba: stacked selective state space (S6) blocks, as a neural sequence model.

One Mamba layer (Gu and Dao 2023, *Mamba: linear-time sequence modeling with selective
state spaces*) maps a normalized input ``v_t`` (``d``) to ``f(v)_t`` (``d``) through an
inner width ``E = expand * d`` and ``N`` state dimensions per channel:

    [x_t, z_t] = W_in v_t                                  (E each)
    c_t = SiLU(b_conv + sum_{k=0}^{K-1} w_k * x_{t-K+1+k})  causal depthwise conv (width K)
    Δ_t = softplus(W_Δ (W_r c_t) + b_Δ)                     (E; low rank R through W_r)
    B_t = W_B c_t,   C_t = W_C c_t                          (N each: input-dependent)
    A = -exp(A_log)                                          (E, N), diagonal per channel
    h_t = exp(Δ_t A) * h_{t-1} + (Δ_t c_t) B_t              (E, N), elementwise
    y_t = h_t C_t + D * c_t                                  (E)
    f(v)_t = W_out (y_t * SiLU(z_t))                         (d)

with the simplified zero-order hold of the paper (``Ā = exp(Δ A)``, ``B̄ = Δ B``). Layers
are stacked with pre-norm residual connections (`statseq.models.neural.residual`):
``z^l = z^{l-1} + f_l(RMSNorm(z^{l-1}))``, and the features read by the emission head are
``RMSNorm(z^L)``. Initialization follows the paper: S4D-real ``A_log[e, n] = log(n + 1)``,
``Δ`` initialized log-uniformly in ``[1e-3, 1e-1]`` through ``b_Δ``, ``D = 1``.

**Two modes, one model.** Whole sequences (training, `statseq.log_prob` on complete data)
evaluate the selective recurrence with `statseq.inference.linear_recurrence.selective_scan`
for all ``T`` steps at once, as an associative scan (``parallel=True``, GPU default) or one
fused ``lax.scan`` (CPU default, or ``evaluation="sequential"``). ``evaluation="deer"``,
``"quasi-deer"``, ``"elk"`` or ``"quasi-elk"`` hand the recurrence ``h_t = exp(Δ_t A) *
h_{t-1} + (Δ_t c_t) B_t`` of each layer to the parallel Newton solver instead
(`statseq.models.neural.evaluation.evaluate_layer`, as for the RNN cells), for
comparison: the recurrence is linear in ``h`` given the layer's inputs, its Jacobian is
the diagonal ``exp(Δ_t A)`` whatever the guess, so DEER's (and quasi-DEER's) first Newton
step from zeros is exactly the associative scan and the solver reports convergence after
one iteration; ELK's damped steps take several (8 to 9 measured). Generation
(`statseq.sample`, `statseq.forecast`, the filter with missing data) runs one step at a
time, carrying each layer's SSM state ``h`` ``(E, N)`` and its convolution buffer (the
last ``K - 1`` conv inputs, ``(K - 1, E)``). Tests show the modes give the same
log-probabilities to float64 precision.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int
from statseq.inference.linear_recurrence import selective_scan
from statseq.models.neural.residual import ResidualStack, ResidualStackModel, dense_init

#: Range of the initial step sizes Δ (log-uniform), as in the Mamba paper.
DT_MIN, DT_MAX = 1e-3, 1e-1


class MambaLayerParams(NamedTuple):
    """Parameters of one Mamba layer (``d`` width, ``E`` inner width, ``N`` state, ``R``
    rank of Δ, ``K`` conv width); in a stack every leaf has a leading layer axis.

    Attributes:
        in_proj: ``(d, 2E)``: ``[x, z] = v @ in_proj``.
        conv_weight: ``(K, E)`` depthwise causal convolution taps (oldest first).
        conv_bias: ``(E,)``.
        x_proj: ``(E, R + 2N)``: ``[Δ_low, B, C] = c @ x_proj``.
        dt_weight: ``(R, E)``: ``Δ = softplus(Δ_low @ dt_weight + dt_bias)``.
        dt_bias: ``(E,)``.
        a_log: ``(E, N)``: ``A = -exp(a_log)``.
        d_skip: ``(E,)`` the skip ``D``.
        out_proj: ``(E, d)``.
    """

    in_proj: jax.Array
    conv_weight: jax.Array
    conv_bias: jax.Array
    x_proj: jax.Array
    dt_weight: jax.Array
    dt_bias: jax.Array
    a_log: jax.Array
    d_skip: jax.Array
    out_proj: jax.Array


class MambaLayerState(NamedTuple):
    """State of one Mamba layer.

    Attributes:
        ssm: ``(E, N)`` the selective SSM state ``h_{t-1}``.
        conv: ``(K - 1, E)`` the last ``K - 1`` convolution inputs, oldest first.
    """

    ssm: jax.Array
    conv: jax.Array


@dataclasses.dataclass(frozen=True)
class MambaBackbone(ResidualStack):
    """Stacked Mamba (S6) layers as a `statseq.models.neural.base.Backbone`.

        h_t = exp(Δ_t A) * h_{t-1} + (Δ_t c_t) B_t,   y_t = h_t C_t + D c_t   (per layer)

    See the module docstring for the full layer.

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``d``.
        num_layers: number of layers.
        parallel: whole sequences by associative scan (``True``), ``lax.scan`` (``False``)
            or by backend (``None``).
        evaluation: ``None`` (as ``parallel``), ``"sequential"`` or a Newton solver
            (``"deer"``, ``"quasi-deer"``, ``"elk"``, ``"quasi-elk"``) on each layer's
            recurrence (`statseq.models.neural.residual`).
        evaluation_max_iter: the solver's maximum number of iterations (default ``T``).
        state_dim: ``N``, state dimensions per channel.
        expand: ``E = expand * d``.
        conv_width: ``K``, taps of the causal depthwise convolution.
        dt_rank: ``R``, rank of the Δ projection (``None``: ``ceil(d / 16)``).

    Examples:
        >>> import jax
        >>> bb = MambaBackbone(input_dim=3, hidden_dim=4, state_dim=2)
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 3))).shape
        (5, 4)
    """

    state_dim: int = 16
    expand: int = 2
    conv_width: int = 4
    dt_rank: int | None = None

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.state_dim, "state_dim")
        check_positive_int(self.expand, "expand")
        check_positive_int(self.conv_width, "conv_width")
        if self.dt_rank is not None:
            check_positive_int(self.dt_rank, "dt_rank")

    @property
    def inner_dim(self) -> int:
        """``E = expand * hidden_dim``."""
        return self.expand * self.hidden_dim

    @property
    def rank(self) -> int:
        """``R``: ``dt_rank`` or ``ceil(hidden_dim / 16)``."""
        return self.dt_rank if self.dt_rank is not None else math.ceil(self.hidden_dim / 16)

    def layer_param_shapes(self) -> MambaLayerParams:
        d, e, n, r, k = self.hidden_dim, self.inner_dim, self.state_dim, self.rank, \
            self.conv_width
        return MambaLayerParams((d, 2 * e), (k, e), (e,), (e, r + 2 * n), (r, e), (e,),
                                (e, n), (e,), (e, d))

    def layer_init(self, key, dtype) -> MambaLayerParams:
        d, e, n, r, k = self.hidden_dim, self.inner_dim, self.state_dim, self.rank, \
            self.conv_width
        keys = jax.random.split(key, 6)
        log_dt = jax.random.uniform(keys[4], (e,), dtype, math.log(DT_MIN), math.log(DT_MAX))
        dt = jnp.exp(log_dt)
        return MambaLayerParams(
            in_proj=dense_init(keys[0], (d, 2 * e), d, dtype),
            conv_weight=dense_init(keys[1], (k, e), k, dtype),
            conv_bias=jnp.zeros((e,), dtype),
            x_proj=dense_init(keys[2], (e, r + 2 * n), e, dtype),
            dt_weight=dense_init(keys[3], (r, e), r, dtype),
            dt_bias=dt + jnp.log(-jnp.expm1(-dt)),  # softplus^{-1}(dt)
            a_log=jnp.broadcast_to(jnp.log(jnp.arange(1, n + 1, dtype=dtype)), (e, n)),
            d_skip=jnp.ones((e,), dtype),
            out_proj=dense_init(keys[5], (e, d), e, dtype) / math.sqrt(self.num_layers),
        )

    def layer_initial_state(self, layer_params) -> MambaLayerState:
        dtype = layer_params.a_log.dtype
        e, n, k = self.inner_dim, self.state_dim, self.conv_width
        return MambaLayerState(jnp.zeros((e, n), dtype), jnp.zeros((k - 1, e), dtype))

    def _selective(self, p, c):
        """Δ, B, C from the conv output ``c`` (``(..., E)``)."""
        r, n = self.rank, self.state_dim
        proj = c @ p.x_proj
        delta = jax.nn.softplus(proj[..., :r] @ p.dt_weight + p.dt_bias)
        return delta, proj[..., r:r + n], proj[..., r + n:]

    def _output(self, p, y, z):
        return (y * jax.nn.silu(z)) @ p.out_proj

    def layer_step(self, p, state, v_t):
        e = self.inner_dim
        xz = v_t @ p.in_proj
        x, z = xz[:e], xz[e:]
        window = jnp.concatenate([state.conv, x[None]], axis=0)  # (K, E), oldest first
        c = jax.nn.silu(jnp.sum(window * p.conv_weight, axis=0) + p.conv_bias)
        delta, b, cc = self._selective(p, c)
        a_bar = jnp.exp(delta[:, None] * -jnp.exp(p.a_log))
        h = a_bar * state.ssm + (delta * c)[:, None] * b[None, :]
        y = h @ cc + p.d_skip * c
        return MambaLayerState(h, window[1:]), self._output(p, y, z)

    def _prepare(self, p, state, vs):
        """The non-recurrent part of the layer over a whole sequence ``vs`` ``(T, d)``:
        ``(z, c, Δ, B, C, conv_tail)``."""
        e, k, t_len = self.inner_dim, self.conv_width, vs.shape[0]
        xz = vs @ p.in_proj
        x, z = xz[:, :e], xz[:, e:]
        padded = jnp.concatenate([state.conv, x], axis=0)  # (K - 1 + T, E)
        conv = sum(padded[j:j + t_len] * p.conv_weight[j] for j in range(k))
        c = jax.nn.silu(conv + p.conv_bias)
        delta, b, cc = self._selective(p, c)
        return z, c, delta, b, cc, padded[t_len:]

    def layer_scan(self, p, state, vs):
        z, c, delta, b, cc, conv_tail = self._prepare(p, state, vs)
        y, h_last = selective_scan(delta, c, -jnp.exp(p.a_log), b, cc, state.ssm,
                                   parallel=self.recurrence_parallel)
        y = y + p.d_skip * c
        return MambaLayerState(h_last, conv_tail), self._output(p, y, z)

    def layer_recurrence_inputs(self, p, state, vs):
        """``(h0, u, aux)`` for the Newton solvers: ``h0`` the SSM state ``(E, N)``,
        ``u_t = [Δ_t, Δ_t c_t, B_t]`` ``(T, 2E + N)``."""
        z, c, delta, b, cc, conv_tail = self._prepare(p, state, vs)
        return state.ssm, jnp.concatenate([delta, delta * c, b], axis=-1), (z, c, cc,
                                                                            conv_tail)

    def layer_recurrence_step(self, p, h, u_t):
        """``h_t = exp(Δ_t A) * h_{t-1} + (Δ_t c_t) B_t``: linear in ``h``, with the
        diagonal Jacobian ``exp(Δ_t A)`` (so DEER and quasi-DEER are exact in one step)."""
        e = self.inner_dim
        delta, dc, b = u_t[:e], u_t[e:2 * e], u_t[2 * e:]
        return jnp.exp(delta[:, None] * -jnp.exp(p.a_log)) * h + dc[:, None] * b[None, :]

    def layer_recurrence_outputs(self, p, state, vs, hs, aux):
        z, c, cc, conv_tail = aux
        y = jnp.einsum("ten,tn->te", hs, cc) + p.d_skip * c
        h_last = hs[-1] if hs.shape[0] else state.ssm
        return MambaLayerState(h_last, conv_tail), self._output(p, y, z)


@register_model
@dataclasses.dataclass(frozen=True)
class Mamba(ResidualStackModel):
    """Stacked Mamba (selective state space) layers with an emission head.

        h_t = exp(Δ_t A) * h_{t-1} + (Δ_t c_t) B_t,   y_t = h_t C_t + D c_t,
        y_t | y_{<t}, u_{<=t} ~ head(features_t)

    (per layer, with input-dependent ``Δ_t``, ``B_t``, ``C_t``; module docstring). The
    network reads ``x_t = [enc(y_{t-1}), m_{t-1}, u_t]`` (`statseq.models.neural.base`).
    Complete sequences are scored by the whole-sequence (scan) mode, generation and
    masked data by the step mode; both give the same numbers.

    Args:
        emission: the head (``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"``, ``"categorical"``).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a categorical head.
        input_dim: number of covariates ``u_t``.
        hidden_dim: model width ``d``.
        state_dim: SSM state size ``N`` per channel.
        num_layers: number of stacked layers.
        expand: inner width ``E = expand * d``.
        conv_width: taps ``K`` of the causal convolution.
        dt_rank: rank ``R`` of the Δ projection (``None``: ``ceil(d / 16)``).
        parallel: selective scan as an associative scan (``True``), ``lax.scan``
            (``False``) or by backend (``None``: sequential on CPU, parallel on GPU).
        evaluation: how whole, fully observed sequences (``log_prob``, ``fit_sgd``, the
            Bayesian entry points) are evaluated: ``None`` (the selective scan, as
            ``parallel`` says), ``"sequential"`` (``lax.scan``, as ``parallel=False``), or
            by parallel Newton iterations on each layer's recurrence, ``"deer"``,
            ``"quasi-deer"``, ``"elk"``, ``"quasi-elk"`` (module docstring; exact after
            one DEER step here, with the sequential fallback and warning of
            `statseq.models.neural.evaluation` when a solver does not converge). A Newton
            method needs ``parallel=None``; ``"sequential"`` refuses ``parallel=True``.
            DEER forms dense ``(E N, E N)`` Jacobians per step: use quasi-DEER (exact
            here too, ``O(T E N)`` memory) beyond toy sizes.
        evaluation_max_iter: the solver's maximum number of iterations (default ``T``).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.Mamba(hidden_dim=4, state_dim=2)
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    expand: int = 2
    conv_width: int = 4
    dt_rank: int | None = None
    parallel: bool | None = None
    evaluation: str | None = None
    evaluation_max_iter: int | None = None

    @property
    def backbone(self) -> MambaBackbone:
        return MambaBackbone(
            input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, parallel=self.parallel, state_dim=self.state_dim,
            expand=self.expand, conv_width=self.conv_width, dt_rank=self.dt_rank,
            evaluation=self.evaluation, evaluation_max_iter=self.evaluation_max_iter,
        )
