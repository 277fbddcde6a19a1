"""Deep state space model (Rangapuram et al. 2018): a recurrent network reading covariates
sets the time-varying parameters of a structural (linear Gaussian) state space model.

    h_t = backbone(h_{t-1}, u_t)                         (covariates only, never y)
    z_t = W h_t + b
    sigma_{k,t} = softplus(z_{k,t})                       (every variance of the model)
    x_t = T x_{t-1} + eta_t,   eta_t ~ N(0, Q(sigma_t))   (level, slope, seasonal noise)
    y_t = Z x_t [+ z_{bias,t}] + eps_t,   eps_t ~ N(0, sigma_{obs,t}^2)

``T`` and ``Z`` are the fixed matrices of the structural components (`statseq.Trend`,
`statseq.Seasonal`, ... from `statseq.models.ssm.structural`, whose code builds them: the
model evaluates ``StructuralModel(components).to_arrays`` on each step's variances).
Because the network reads covariates only, the model is, given ``u_{1:T}``, a
time-varying linear Gaussian state space model and its likelihood is the **exact**
Kalman filter (`statseq.inference.kalman.kalman_step`), with the exact diffuse start of
the structural models (or a proper ``N(0, initial_scale^2 I)`` start).

The filter's carry is the network state plus the Kalman carry, so ``log_prob``,
``filter``, ``sample``, ``forecast`` and ``fit_sgd`` (over a batch of related series,
ragged lengths as masks) work through the generic functions; `DeepStateSpace.
forecast_moments` gives the exact Gaussian h-step predictive given future covariates.
"""

from __future__ import annotations

import dataclasses
import functools
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.model import SequenceModel, register_model
from statseq.core.params import validate_params
from statseq.core.validation import (
    check_key,
    check_positive_int,
    float_dtype,
    pandas_values,
    prepare_data,
)
from statseq.forecast import future_index
from statseq.inference import kalman
from statseq.inference.gaussian import symmetrize
from statseq.models.neural.base import Backbone, backbone_config, backbone_from_config
from statseq.models.neural.cells import RNNBackbone
from statseq.models.ssm.base import GaussianForecast
from statseq.models.ssm.structural import (
    Component,
    Seasonal,
    StructuralModel,
    Trend,
    TrigSeasonal,
    _as_component,
)

__all__ = ["DeepStateCarry", "DeepStateParams", "DeepStateSpace"]


class DeepStateParams(NamedTuple):
    """Parameters of a `DeepStateSpace`.

    Attributes:
        backbone: the recurrent network's parameter pytree.
        weight: ``(P, F)`` readout of the ``F`` features to the ``P`` outputs (the
            standard deviations' pre-activations, then the emission bias if any).
        bias: ``(P,)`` readout bias.

    Examples:
        >>> import jax, statseq as ss
        >>> model = ss.DeepStateSpace(input_dim=2, hidden_dim=3)
        >>> params = model.init_params(jax.random.key(0))
        >>> params.weight.shape, model.output_names
        ((2, 3), ('obs_var', 'components.0.level_var'))
    """

    backbone: Any
    weight: Any
    bias: Any


class DeepStateCarry(NamedTuple):
    """Filter state: the network state after ``u_{1:t-1}`` and the Kalman carry.

    Examples:
        >>> import jax, statseq as ss
        >>> model = ss.DeepStateSpace(input_dim=1, hidden_dim=2)
        >>> carry = model.initial_carry(model.init_params(jax.random.key(0)))
        >>> carry._fields
        ('state', 'kalman')
    """

    state: Any
    kalman: kalman.KalmanCarry


def _inv_softplus(x):
    x = np.asarray(x, float)
    return np.where(x > 30.0, x, np.log(np.expm1(np.minimum(x, 30.0))))


@register_model
@dataclasses.dataclass(frozen=True)
class DeepStateSpace(SequenceModel):
    """Deep state space model: an RNN on covariates emits a structural model's variances.

        h_t = backbone(h_{t-1}, u_t),   (sigma_t, d_t) = (softplus, id)(W h_t + b),
        x_t = T x_{t-1} + eta_t,        eta_t ~ N(0, Q(sigma_t^2)),
        y_t = Z x_t + d_t + eps_t,      eps_t ~ N(0, sigma_{obs,t}^2),

    with ``T, Z, Q(.)`` those of ``StructuralModel(components)`` (Rangapuram et al. 2018,
    GluonTS' DeepState). The network reads the covariates ``u_t`` only, so the likelihood
    of ``y`` given ``u`` is the exact (diffuse) Kalman filter of this time-varying model.
    With ``W = 0`` the model is the structural model with variances ``softplus(b)^2``
    (`from_structural_params` builds such parameters; a test checks the equality of
    likelihood, filtered states and forecasts to 1e-10).

    Shapes: ``y`` ``batch_shape + (T,)`` (a scalar series per sequence), ``inputs``
    ``batch_shape + (T, input_dim)``; forecasts need ``future_inputs`` over the horizon.
    Per-series embeddings: pass series indicators (one-hot columns) among the inputs.

    Args:
        components: structural components (default ``(Trend(),)``, a local level).
        input_dim: number of covariates ``u_t`` (at least 1).
        hidden_dim: size of the default GRU backbone.
        cell: ``"gru"``, ``"lstm"`` or ``"elman"`` for the default backbone.
        num_layers: layers of the default backbone.
        backbone: any statseq `statseq.models.neural.Backbone` with ``input_dim`` equal
            to ``input_dim`` (e.g. ``ss.Mamba(...).backbone`` rebuilt for it); overrides
            ``cell``, ``hidden_dim`` and ``num_layers``.
        emission_bias: also emit an observation bias ``d_t`` (a covariate effect on the
            mean).
        initial_scale: ``None`` for the exact diffuse start of the structural models, or
            a positive number ``s`` for the proper start ``x_0 ~ N(0, s^2 I)``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.DeepStateSpace(input_dim=1, hidden_dim=4)
        >>> u = np.linspace(0, 1, 20)[:, None]
        >>> y = np.cumsum(np.ones(20))
        >>> params = model.initialize(y, inputs=u, key=jax.random.key(0))
        >>> float(ss.log_prob(model, params, y, inputs=u)) < 0
        True
        >>> fc = model.forecast_moments(params, y, inputs=u, num_steps=3,
        ...                             future_inputs=np.ones((3, 1)))
        >>> fc.mean.shape
        (3,)
    """

    components: tuple = (Trend(),)
    input_dim: int = 1
    hidden_dim: int = 8
    cell: str = "gru"
    num_layers: int = 1
    backbone: Backbone | None = None
    emission_bias: bool = False
    initial_scale: float | None = None

    supports_partial_mask = True
    marginalizes_masked_steps = True

    def __post_init__(self):
        check_positive_int(self.input_dim, "input_dim")
        comps = self.components
        if isinstance(comps, Component | dict):
            comps = (comps,)
        # dicts are saved components (`config`): ``{"type": "Trend", ...}``
        object.__setattr__(self, "components", tuple(_as_component(c) for c in comps))
        for c in self.components:
            if not isinstance(c, Trend | Seasonal | TrigSeasonal):
                raise TypeError("components must be Trend, Seasonal or TrigSeasonal objects "
                                f"(whose parameters are variances only), got {c!r}")
        self.structural  # noqa: B018 - validates the components eagerly
        if self.backbone is None:
            object.__setattr__(self, "backbone", RNNBackbone(
                self.cell, self.input_dim, check_positive_int(self.hidden_dim, "hidden_dim"),
                check_positive_int(self.num_layers, "num_layers")))
        elif isinstance(self.backbone, dict):  # a saved backbone (`config`)
            object.__setattr__(self, "backbone", backbone_from_config(self.backbone))
        if not isinstance(self.backbone, Backbone):
            raise TypeError(f"backbone must be a statseq Backbone, got {self.backbone!r}")
        elif self.backbone.input_dim != self.input_dim:
            raise ValueError(f"backbone.input_dim ({self.backbone.input_dim}) must equal "
                             f"input_dim ({self.input_dim}): the network reads the covariates")
        if not isinstance(self.emission_bias, bool | np.bool_):
            raise TypeError(f"emission_bias must be True or False, got {self.emission_bias!r}")
        if self.initial_scale is not None and not (
                np.isfinite(self.initial_scale) and self.initial_scale > 0):
            raise ValueError(f"initial_scale must be None or positive, got {self.initial_scale}")

    def config(self) -> dict[str, Any]:
        """JSON-friendly configuration (`statseq.save`): the components' configs and, when
        it is not the default one built from ``cell``, ``hidden_dim`` and ``num_layers``,
        the backbone's (its class name and dataclass fields)."""
        out = dataclasses.asdict(self)
        out["components"] = [c.config() for c in self.components]
        default = RNNBackbone(self.cell, self.input_dim, self.hidden_dim, self.num_layers)
        if self.backbone == default:
            out["backbone"] = None
        else:
            out["backbone"] = backbone_config(self.backbone)
        return out

    # ---- static description -------------------------------------------------------------
    @property
    def structural(self) -> StructuralModel:
        """The structural model whose variances the network sets."""
        return StructuralModel(self.components)

    @property
    def state_dim(self) -> int:
        """Dimension of the state ``x_t``."""
        return self.structural.state_dim

    @property
    def event_shape(self) -> tuple[int, ...]:
        return ()

    @property
    def output_names(self) -> tuple[str, ...]:
        """What each readout row sets: the structural model's variances (through their
        standard deviations), then ``"emission_bias"`` if emitted."""
        from statseq.core.params import param_names

        names = tuple(param_names(self.structural))
        return names + (("emission_bias",) if self.emission_bias else ())

    @property
    def _num_variances(self) -> int:
        return len(jax.tree.leaves(self.structural.default_params()))

    @property
    def num_outputs(self) -> int:
        """Number ``P`` of readout rows."""
        return self._num_variances + int(self.emission_bias)

    def param_shapes(self) -> DeepStateParams:
        p, f = self.num_outputs, self.backbone.output_dim
        return DeepStateParams(self.backbone.param_shapes(), (p, f), (p,))

    def param_constraints(self) -> DeepStateParams:
        return DeepStateParams(self.backbone.param_constraints(), constraints.real,
                               constraints.real)

    # ---- parameters -----------------------------------------------------------------
    def init_params(self, key, *, weight_scale: float = 0.1) -> DeepStateParams:
        """Random network, readout weights ``N(0, weight_scale^2 / F)``, zero bias
        (standard deviations ``softplus(0) = log 2``)."""
        check_key(key)
        k_b, k_w = jax.random.split(key)
        p, f = self.num_outputs, self.backbone.output_dim
        dtype = float_dtype()
        w = weight_scale / np.sqrt(f) * jax.random.normal(k_w, (p, f), dtype)
        return DeepStateParams(self.backbone.init_params(k_b), w, jnp.zeros((p,), dtype))

    def from_structural_params(self, structural_params, *, key, weight_scale: float = 0.0,
                               bias: float = 0.0) -> DeepStateParams:
        """Parameters whose readout bias gives ``structural_params``' variances.

        With ``weight_scale = 0`` (zero readout weights) the model *is* the structural
        model ``self.structural`` with these parameters, whatever the network.

        Args:
            structural_params: `statseq.StructuralParams` of ``self.structural``.
            key: a ``jax.random`` key (the network's weights).
            weight_scale: scale of random readout weights (0: exactly constant).
            bias: the emission bias output's constant (with ``emission_bias``).
        """
        params = self.init_params(key, weight_scale=max(weight_scale, 0.0))
        if weight_scale == 0.0:
            params = params._replace(weight=jnp.zeros_like(params.weight))
        variances = np.asarray([np.asarray(v, float) for v in
                                jax.tree.leaves(structural_params)])
        if variances.shape != (self._num_variances,) or np.any(variances <= 0):
            raise ValueError(f"structural_params must hold {self._num_variances} positive "
                             f"variances ({', '.join(self.output_names)})")
        b = _inv_softplus(np.sqrt(variances))
        if self.emission_bias:
            b = np.append(b, bias)
        return params._replace(bias=jnp.asarray(b, float_dtype()))

    def initialize(self, y, *, key, inputs=None, mask=None) -> DeepStateParams:
        """The structural model's data-scale start (`statseq.StructuralModel.initialize`)
        as the readout bias, small random readout weights, a random network."""
        check_key(key)
        data = prepare_data(self, y, mask, inputs)
        start = self.structural.initialize(np.asarray(data.y), mask=np.asarray(data.mask))
        return self.from_structural_params(start, key=key, weight_scale=0.1)

    # ---- per-step matrices --------------------------------------------------------------
    @functools.cached_property
    def _fixed_cache(self) -> dict:
        return {}

    @property
    def _fixed(self):
        """The structural model's matrices (NumPy, in the default float dtype) and ``Q``'s
        basis: ``Q`` is linear in the component variances, ``Q = sum_k var_k E_k`` (the obs
        variance first among the variances, then the components')."""
        dtype = float_dtype()
        if dtype not in self._fixed_cache:
            self._fixed_cache[dtype] = self._fixed_arrays(dtype)
        return self._fixed_cache[dtype]

    def _fixed_arrays(self, dtype):
        structural, nv = self.structural, self._num_variances
        treedef = jax.tree.structure(structural.default_params())

        def arrays_for(var):
            with jax.ensure_compile_time_eval():  # constants, even when first met in a trace
                out = structural.to_arrays(jax.tree.unflatten(
                    treedef, [np.asarray(v, dtype) for v in var]))
                return jax.tree.map(np.asarray, out)

        base = arrays_for(np.zeros(nv))
        basis = np.stack([arrays_for(np.eye(nv)[k]).dynamics_cov for k in range(1, nv)])
        if self.initial_scale is not None:
            n = self.state_dim
            base = base._replace(initial_cov=self.initial_scale**2 * np.eye(n),
                                 initial_diffuse=np.zeros((n, 0)))
        return base, basis

    def step_arrays(self, params, h) -> kalman.GaussianSSMArrays:
        """The structural matrices set by the features ``h`` ``(F,)`` of one step."""
        z = params.weight @ h + params.bias
        dtype = z.dtype
        nv = self._num_variances
        var = jax.nn.softplus(z[:nv]) ** 2
        base, basis = self._fixed
        arrays = jax.tree.map(lambda a: jnp.asarray(a, dtype), base)
        q = jnp.tensordot(var[1:], jnp.asarray(basis, dtype), axes=1)
        arrays = arrays._replace(dynamics_cov=q, emission_cov=jnp.reshape(var[0], (1, 1)))
        if self.emission_bias:
            arrays = arrays._replace(emission_bias=z[nv:nv + 1])
        return arrays

    def time_varying_arrays(self, params, inputs) -> kalman.GaussianSSMArrays:
        """The whole time-varying model given covariates ``inputs`` ``(T, input_dim)``:
        ``Q`` of the step ``x_t -> x_{t+1}`` is set by ``h_{t+1}`` (leading axis
        ``T - 1``), ``R`` (and ``d``) by ``h_t`` (axis ``T``), as
        `statseq.inference.kalman` expects."""
        inputs = jnp.asarray(inputs, params.bias.dtype)
        hs = self.backbone.sequence(params.backbone, inputs)
        per = jax.vmap(lambda h: self.step_arrays(params, h))(hs)
        first = jax.tree.map(lambda a: a[0], per)
        return first._replace(
            dynamics_cov=per.dynamics_cov[1:], emission_cov=per.emission_cov,
            emission_bias=per.emission_bias if self.emission_bias else first.emission_bias)

    # ---- the filter protocol -----------------------------------------------------------
    def initial_carry(self, params) -> DeepStateCarry:
        arrays = self.step_arrays(params, jnp.zeros((self.backbone.output_dim,),
                                                    params.bias.dtype))
        return DeepStateCarry(self.backbone.initial_state(params.backbone),
                              kalman.initial_carry(arrays))

    def sampling_carry(self, params) -> DeepStateCarry:
        """Start of `statseq.sample`: diffuse states at their initial mean (0)."""
        carry = self.initial_carry(params)
        k = carry.kalman
        return carry._replace(kalman=k._replace(
            diffuse=jnp.zeros_like(k.diffuse), info=jnp.zeros_like(k.info),
            score=jnp.zeros_like(k.score), collapsed=jnp.asarray(True)))

    def _advance(self, params, carry, inputs_t):
        u = jnp.asarray(inputs_t, params.bias.dtype)
        state, h = self.backbone.step(params.backbone, carry.state, u)
        return state, self.step_arrays(params, h)

    def predict(self, params, carry, inputs_t):
        """``N(Z a_t + d_t, Z P_t Z^T + sigma_{obs,t}^2)``; NaN while diffuse states are
        unidentified."""
        _, arrays = self._advance(params, carry, inputs_t)
        none = jnp.zeros((0,), params.bias.dtype)
        mean, cov, _ = kalman.predicted_moments(arrays, carry.kalman, none)
        z = arrays.emission_weights
        y_mean = (z @ mean + arrays.emission_bias)[0]
        y_var = (z @ cov @ z.T + arrays.emission_cov)[0, 0]
        y_var = jnp.where(carry.kalman.collapsed, y_var, jnp.nan)
        return dist.Normal(y_mean, jnp.sqrt(y_var))

    def step(self, params, carry, y_t, mask_t, inputs_t):
        state, arrays = self._advance(params, carry, inputs_t)
        dtype = params.bias.dtype
        y = jnp.reshape(y_t, (1,)).astype(dtype)
        m = jnp.reshape(mask_t, (1,))
        lp, new, _ = kalman.kalman_step(arrays, carry.kalman, y, m, jnp.zeros((0,), dtype))
        return lp, DeepStateCarry(state, new)

    def update(self, params, carry, y_t, mask_t, inputs_t) -> DeepStateCarry:
        return self.step(params, carry, y_t, mask_t, inputs_t)[1]

    # ---- whole-sequence inference --------------------------------------------------------
    def filter_states(self, params, y, *, inputs, mask=None) -> kalman.KalmanFilterResult:
        """Predicted and filtered moments of ``x_t`` (`statseq.inference.kalman.
        kalman_filter` of `time_varying_arrays`), batch shape leading."""
        params = validate_params(self, params)
        data = prepare_data(self, y, mask, inputs)
        out = _filter(self, params, data.y, data.mask, data.inputs)
        return jax.tree.map(lambda a: jnp.reshape(a, data.batch_shape + a.shape[1:]), out)

    def forecast_moments(self, params, y, *, num_steps, inputs, future_inputs,
                         mask=None) -> GaussianForecast:
        """Exact h-step Gaussian predictive given the history and future covariates.

            x_{T+h} | y ~ N(a_{T+h}, P_{T+h}),   P_{T+h} = T P_{T+h-1} T^T + Q(h_{T+h}),
            y_{T+h} | y ~ N(Z a_{T+h} + d_{T+h}, Z P_{T+h} Z^T + sigma_{obs,T+h}^2),

        with the network run over ``[inputs; future_inputs]``.

        Args:
            params: `DeepStateParams`.
            y: history ``batch_shape + (T,)``.
            num_steps: horizon ``h``.
            inputs: ``batch_shape + (T, input_dim)`` covariates of the history.
            future_inputs: ``[batch_shape +] (num_steps, input_dim)`` covariates ahead.
            mask: optional observation mask.

        Returns:
            A `statseq.models.ssm.GaussianForecast`.
        """
        params = validate_params(self, params)
        num_steps = check_positive_int(num_steps, "num_steps")
        values, history_index, _ = pandas_values(y, 0)
        data = prepare_data(self, y, mask, inputs)
        if future_inputs is None:
            raise ValueError("DeepStateSpace reads covariates: pass future_inputs of shape "
                             f"({num_steps}, {self.input_dim})")
        fu = np.asarray(future_inputs, float)
        if fu.shape[-2:] != (num_steps, self.input_dim):
            raise ValueError(f"future_inputs must end in shape ({num_steps}, "
                             f"{self.input_dim}), got {fu.shape}")
        if not np.all(np.isfinite(fu)):
            raise ValueError("future_inputs must be finite")
        bs = data.batch_shape
        fu = np.reshape(np.broadcast_to(fu, bs + fu.shape[-2:]), (-1,) + fu.shape[-2:])
        sm, sc, ym, yc = _forecast(self, params, data.y, data.mask, data.inputs,
                                   jnp.asarray(fu, float_dtype()))
        if not bool(np.all(np.isfinite(np.asarray(yc)))):
            raise ValueError("the history does not identify every diffuse state (too few "
                             "observations), so the forecast is improper")
        return GaussianForecast(
            mean=jnp.reshape(ym, bs + (num_steps,)),
            cov=jnp.reshape(yc, bs + (num_steps, 1, 1)),
            state_mean=jnp.reshape(sm, bs + sm.shape[1:]),
            state_cov=jnp.reshape(sc, bs + sc.shape[1:]),
            history=np.asarray(values),
            index=None if history_index is None else future_index(history_index, num_steps),
            history_index=history_index)

    def scales(self, params, inputs):
        """The standard deviations (and emission bias) the network emits per step:
        ``(T, P)`` for ``inputs`` ``(T, input_dim)``, columns named by `output_names`."""
        inputs = jnp.asarray(inputs, params.bias.dtype)
        hs = self.backbone.sequence(params.backbone, inputs)
        z = hs @ params.weight.T + params.bias
        nv = self._num_variances
        return jnp.concatenate([jax.nn.softplus(z[:, :nv]), z[:, nv:]], axis=1)


@partial(jax.jit, static_argnames=("model",))
def _filter(model, params, y, mask, inputs):
    def one(y_s, m_s, u_s):
        arrays = model.time_varying_arrays(params, u_s)
        return kalman.kalman_filter(arrays, y_s.reshape(-1, 1).astype(u_s.dtype),
                                    m_s.reshape(-1, 1), jnp.zeros((y_s.shape[0], 0), u_s.dtype))

    return jax.vmap(one)(y, mask, inputs)


@partial(jax.jit, static_argnames=("model",))
def _forecast(model, params, y, mask, inputs, future_inputs):
    num_t = y.shape[1]

    def one(y_s, m_s, u_s, fu_s):
        arrays = model.time_varying_arrays(params, jnp.concatenate([u_s, fu_s], axis=0))
        dtype = arrays.initial_cov.dtype
        none = jnp.zeros((0,), dtype)

        def step(carry, xs):
            y_t, m_t = xs
            return kalman.kalman_step(arrays, carry, y_t, m_t, none)[1], None

        final, _ = jax.lax.scan(step, kalman.initial_carry(arrays),
                                (y_s.reshape(-1, 1).astype(dtype), m_s.reshape(-1, 1)))
        mean = jnp.where(final.collapsed, final.mean, jnp.nan)
        cov = jnp.where(final.collapsed, final.cov, jnp.nan)

        def ahead(c, h):
            m, p = c
            m, p = kalman.predict_state(kalman.arrays_at(arrays, num_t - 1 + h), m, p, none)
            arr_y = kalman.arrays_at(arrays, num_t + h)
            z = arr_y.emission_weights
            ym = (z @ m + arr_y.emission_bias)[0]
            yc = symmetrize(z @ p @ z.T + arr_y.emission_cov)
            return (m, p), (m, p, ym, yc)

        _, out = jax.lax.scan(ahead, (mean, cov), jnp.arange(fu_s.shape[0]))
        return out

    return jax.vmap(one)(y, mask, inputs, future_inputs)
