"""Linear recurrent unit (LRU): stacked diagonal complex linear recurrences with GLUs.

One LRU layer (Orvieto et al. 2023, *Resurrecting recurrent neural networks for long
sequences*, ICML) maps a normalized input ``v_t`` (``d``) through a complex diagonal state
``h_t`` (``N``):

    λ = exp(-exp(ν) + i exp(θ)),           |λ| = exp(-exp(ν)) < 1 for every real ν, θ
    γ = sqrt(1 - |λ|^2)                    (normalization: unit-variance states for
                                            white-noise input)
    h_t = λ * h_{t-1} + γ * (B v_t)        (N, complex; B = B_re + i B_im)
    y_t = Re(C h_t) + D * v_t              (d; C = C_re + i C_im, D real)
    f(v)_t = (W_1 g_t + b_1) * sigmoid(W_2 g_t + b_2),   g_t = GELU(y_t)   (a GLU)

The eigenvalues stay inside the unit disk for any unconstrained parameters, so the layer
is stable by construction (no projection or clipping). Layers are stacked with pre-norm
residual connections (`statseq.models.neural.residual`). Initialization as in the paper:
``|λ|`` uniform on the ring ``r_min <= |λ| <= r_max`` (in area), phases uniform in
``[0, max_phase]``, ``B`` and ``C`` complex Gaussian scaled by ``1/sqrt(2d)`` and
``1/sqrt(N)``.

Whole sequences use the same linear recurrence as Mamba
(`statseq.inference.linear_recurrence`, a constant multiplier ``λ``), parallel or
sequential; generation carries each layer's complex state ``h`` one step at a time.
``evaluation="deer"`` (``"quasi-deer"``, ``"elk"``, ``"quasi-elk"``) solves each layer's
recurrence by parallel Newton iterations instead
(`statseq.models.neural.evaluation.evaluate_layer`), in real coordinates ``[Re h, Im h]``
(the solvers take real states), where ``h ↦ λ * h`` is the block-diagonal map with the
2 x 2 blocks ``[[Re λ, -Im λ], [Im λ, Re λ]]``. That map is the Jacobian at every guess,
so DEER's first Newton step is the associative scan and it converges after one
iteration. quasi-DEER keeps only the diagonal ``Re λ`` and so converges linearly, in up
to ``T`` iterations (measured: ``T``), and ELK's damped steps take several (8 measured).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int
from statseq.inference.linear_recurrence import linear_recurrence
from statseq.models.neural.residual import ResidualStack, ResidualStackModel, dense_init


class LRULayerParams(NamedTuple):
    """Parameters of one LRU layer (``d`` width, ``N`` complex state); in a stack every
    leaf has a leading layer axis.

    Attributes:
        nu_log: ``(N,)`` ``ν``: ``|λ| = exp(-exp(ν))``.
        theta_log: ``(N,)`` ``θ``: ``arg λ = exp(θ)``.
        b_re: ``(N, d)`` real part of ``B``.
        b_im: ``(N, d)`` imaginary part of ``B``.
        c_re: ``(d, N)`` real part of ``C``.
        c_im: ``(d, N)`` imaginary part of ``C``.
        d_skip: ``(d,)`` the real skip ``D``.
        glu_weight: ``(d, 2d)``: ``[W_1 g, W_2 g] = g @ glu_weight``.
        glu_bias: ``(2d,)``.
    """

    nu_log: jax.Array
    theta_log: jax.Array
    b_re: jax.Array
    b_im: jax.Array
    c_re: jax.Array
    c_im: jax.Array
    d_skip: jax.Array
    glu_weight: jax.Array
    glu_bias: jax.Array


def lru_eigenvalues(nu_log, theta_log):
    """``λ = exp(-exp(ν) + i exp(θ))``: inside the unit disk for any real ``ν``, ``θ``.

    Args:
        nu_log: ``ν``, any real array.
        theta_log: ``θ``, same shape.

    Returns:
        Complex ``λ`` with ``|λ| = exp(-exp(ν)) < 1``. (In floating point ``|λ|`` rounds
        to 1 once ``exp(ν)`` is below the machine epsilon, ``ν < -36`` in float64; ``γ``
        stays accurate there, see `lru_normalization`.)

    Examples:
        >>> import jax.numpy as jnp
        >>> lam = lru_eigenvalues(jnp.array([-5.0, 0.0, 5.0]), jnp.zeros(3))
        >>> bool(jnp.all(jnp.abs(lam) < 1))
        True
    """
    return jnp.exp(jax.lax.complex(-jnp.exp(nu_log), jnp.exp(theta_log)))


def lru_normalization(nu_log):
    """``γ = sqrt(1 - |λ|^2) = sqrt(-expm1(-2 exp(ν)))``, accurate when ``|λ|`` is near 1."""
    return jnp.sqrt(-jnp.expm1(-2.0 * jnp.exp(nu_log)))


@dataclasses.dataclass(frozen=True)
class LRUBackbone(ResidualStack):
    """Stacked LRU layers as a `statseq.models.neural.base.Backbone`.

        h_t = λ * h_{t-1} + γ * (B v_t),   y_t = Re(C h_t) + D * v_t,   then a GLU

    (per layer; module docstring).

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
        state_dim: ``N``, complex state dimensions per layer.
        r_min: smallest initial ``|λ|``.
        r_max: largest initial ``|λ|`` (< 1).
        max_phase: largest initial ``arg λ``.

    Examples:
        >>> import jax
        >>> bb = LRUBackbone(input_dim=3, hidden_dim=4, state_dim=2)
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jax.numpy.ones((5, 3))).shape
        (5, 4)
    """

    state_dim: int = 16
    r_min: float = 0.5
    r_max: float = 0.99
    max_phase: float = math.pi

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.state_dim, "state_dim")
        if not 0.0 <= self.r_min < self.r_max < 1.0:
            raise ValueError(
                f"need 0 <= r_min < r_max < 1, got r_min={self.r_min}, r_max={self.r_max}"
            )
        if not 0.0 < self.max_phase <= 2 * math.pi:
            raise ValueError(f"max_phase must be in (0, 2 pi], got {self.max_phase}")

    def layer_param_shapes(self) -> LRULayerParams:
        d, n = self.hidden_dim, self.state_dim
        return LRULayerParams((n,), (n,), (n, d), (n, d), (d, n), (d, n), (d,), (d, 2 * d),
                              (2 * d,))

    def layer_init(self, key, dtype) -> LRULayerParams:
        d, n = self.hidden_dim, self.state_dim
        keys = jax.random.split(key, 8)
        u1 = jax.random.uniform(keys[0], (n,), dtype)
        u2 = jax.random.uniform(keys[1], (n,), dtype, minval=1e-3)
        radius_sq = u1 * (self.r_max**2 - self.r_min**2) + self.r_min**2
        normal = jax.random.normal
        return LRULayerParams(
            nu_log=jnp.log(-0.5 * jnp.log(radius_sq)),
            theta_log=jnp.log(self.max_phase * u2),
            b_re=normal(keys[2], (n, d), dtype) / math.sqrt(2 * d),
            b_im=normal(keys[3], (n, d), dtype) / math.sqrt(2 * d),
            c_re=normal(keys[4], (d, n), dtype) / math.sqrt(n),
            c_im=normal(keys[5], (d, n), dtype) / math.sqrt(n),
            d_skip=normal(keys[6], (d,), dtype),
            glu_weight=dense_init(keys[7], (d, 2 * d), d, dtype),
            glu_bias=jnp.zeros((2 * d,), dtype),
        )

    def layer_initial_state(self, layer_params):
        zeros = jnp.zeros((self.state_dim,), layer_params.nu_log.dtype)
        return jax.lax.complex(zeros, zeros)

    @staticmethod
    def _input(p, vs):
        """``γ * (B v)`` for ``vs`` ``(..., d)``: complex ``(..., N)``."""
        gamma = lru_normalization(p.nu_log)
        return jax.lax.complex(vs @ p.b_re.T, vs @ p.b_im.T) * gamma

    def _output(self, p, h, vs):
        d = self.hidden_dim
        y = jnp.real(h) @ p.c_re.T - jnp.imag(h) @ p.c_im.T + p.d_skip * vs
        g = jax.nn.gelu(y, approximate=False)
        gates = g @ p.glu_weight + p.glu_bias
        return gates[..., :d] * jax.nn.sigmoid(gates[..., d:])

    def layer_step(self, p, state, v_t):
        h = lru_eigenvalues(p.nu_log, p.theta_log) * state + self._input(p, v_t)
        return h, self._output(p, h, v_t)

    def layer_scan(self, p, state, vs):
        lam = lru_eigenvalues(p.nu_log, p.theta_log)
        hs = linear_recurrence(lam, self._input(p, vs), state,
                               parallel=self.recurrence_parallel)
        return hs[-1], self._output(p, hs, vs)

    def layer_recurrence_inputs(self, p, state, vs):
        """``(h0, u, ())`` for the Newton solvers, in real coordinates (the solvers take
        real states): ``h0 = [Re h, Im h]`` ``(2, N)``, ``u_t = [Re, Im](γ B v_t)``
        ``(T, 2N)``."""
        u = self._input(p, vs)
        return (jnp.stack([jnp.real(state), jnp.imag(state)]),
                jnp.concatenate([jnp.real(u), jnp.imag(u)], axis=-1), ())

    def layer_recurrence_step(self, p, h, u_t):
        """``h_t = λ * h_{t-1} + u_t`` in real coordinates: per state a 2 x 2 block
        ``[[Re λ, -Im λ], [Im λ, Re λ]]`` (the Jacobian; not diagonal, so quasi-DEER, which
        keeps only ``Re λ``, converges linearly where DEER takes one step)."""
        lam = lru_eigenvalues(p.nu_log, p.theta_log)
        lr, li, n = jnp.real(lam), jnp.imag(lam), self.state_dim
        re, im = h[0], h[1]
        return jnp.stack([lr * re - li * im + u_t[:n], li * re + lr * im + u_t[n:]])

    def layer_recurrence_outputs(self, p, state, vs, hs, aux):
        h = jax.lax.complex(hs[:, 0], hs[:, 1])
        return (h[-1] if h.shape[0] else state), self._output(p, h, vs)


@register_model
@dataclasses.dataclass(frozen=True)
class LRU(ResidualStackModel):
    """Stacked linear recurrent units (LRU) with an emission head.

        h_t = λ * h_{t-1} + γ * (B v_t),   |λ| < 1,   y_t = Re(C h_t) + D * v_t,
        y_t | y_{<t}, u_{<=t} ~ head(features_t)

    (per layer, followed by a GLU, residual and RMSNorm; module docstring). The network
    reads ``x_t = [enc(y_{t-1}), m_{t-1}, u_t]`` (`statseq.models.neural.base`).

    Args:
        emission: the head (``"gaussian"``, ``"student_t"``, ``"poisson"``,
            ``"negative_binomial"``, ``"bernoulli"``, ``"categorical"``).
        emission_dim: ``None`` for a scalar series, else ``D``.
        num_classes: classes of a categorical head.
        input_dim: number of covariates ``u_t``.
        hidden_dim: model width ``d``.
        state_dim: complex state size ``N`` per layer.
        num_layers: number of stacked layers.
        r_min: smallest initial eigenvalue modulus.
        r_max: largest initial eigenvalue modulus (< 1).
        max_phase: largest initial eigenvalue phase.
        parallel: recurrence as an associative scan (``True``), ``lax.scan`` (``False``) or
            by backend (``None``: sequential on CPU, parallel on GPU).
        evaluation: how whole, fully observed sequences (``log_prob``, ``fit_sgd``, the
            Bayesian entry points) are evaluated: ``None`` (the linear recurrence, as
            ``parallel`` says), ``"sequential"`` (``lax.scan``, as ``parallel=False``), or
            by parallel Newton iterations on each layer's recurrence, ``"deer"``
            (exact after one step), ``"quasi-deer"`` (linear convergence: the diagonal
            drops the rotation), ``"elk"``, ``"quasi-elk"`` (module docstring), with the
            sequential fallback and warning of `statseq.models.neural.evaluation` when
            a solver does not converge. A Newton method needs ``parallel=None``;
            ``"sequential"`` refuses ``parallel=True``.
        evaluation_max_iter: the solver's maximum number of iterations (default ``T``).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.LRU(hidden_dim=4, state_dim=2)
        >>> y = np.sin(np.arange(20.0) / 3)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    r_min: float = 0.5
    r_max: float = 0.99
    max_phase: float = math.pi
    parallel: bool | None = None
    evaluation: str | None = None
    evaluation_max_iter: int | None = None

    @property
    def backbone(self) -> LRUBackbone:
        return LRUBackbone(
            input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, parallel=self.parallel, state_dim=self.state_dim,
            r_min=float(self.r_min), r_max=float(self.r_max),
            max_phase=float(self.max_phase), evaluation=self.evaluation,
            evaluation_max_iter=self.evaluation_max_iter,
        )
