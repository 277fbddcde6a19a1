"""Structural time series models (unobserved components): sums of trend, seasonal and
autoregressive components observed with noise (Harvey 1989; Durbin and Koopman 2012, ch. 3).

A scalar series is the sum of independent components plus an irregular term,

    y_t = sum_c Z_c x_{c,t} + eps_t,              eps_t ~ N(0, obs_var),
    x_{c,t+1} = T_c x_{c,t} + eta_{c,t},          eta_{c,t} ~ N(0, Q_c),

so the state ``x_t = (x_{1,t}, ..., x_{C,t})`` has block-diagonal dynamics. Each component
is a small frozen dataclass (`Trend`, `Seasonal`, `TrigSeasonal`, `ARComponent`) that
says how its parameters map to its block ``(T_c, Q_c, Z_c)`` and its initial law;
`StructuralModel` stacks any tuple of them, and `LocalLevel` and `LocalLinearTrend` are the
same code with flat parameters. Non-stationary components start **exact diffuse** (their
initial state has infinite variance; the likelihood is the diffuse likelihood of Durbin and
Koopman, which statsmodels' ``UnobservedComponents(..., use_exact_diffuse=True)`` and KFAS
report); an `ARComponent` starts from its stationary law.

Variances are parameters with constraint ``positive``; a component declared
non-stochastic (``stochastic=False``) has no variance leaf at all, and any variance can be
held fixed while fitting with a ``trainable`` mask.

Per-component output: `StructuralModel.decompose` gives the filtered and smoothed
contribution ``Z_c x_{c,t}`` of each component with its standard deviation;
`StructuralModel.forecast_components` the mean and standard deviation of each component's
contribution over a forecast horizon.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from functools import partial
from typing import Any, ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints

from statseq.core.model import register_model
from statseq.core.params import param_names
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.inference import kalman
from statseq.inference.gaussian import solve_discrete_lyapunov
from statseq.models.ssm.base import GaussianSSMBase

__all__ = [
    "ARComponent",
    "ARComponentParams",
    "Component",
    "ComponentEstimate",
    "ComponentForecast",
    "LocalLevel",
    "LocalLevelParams",
    "LocalLinearTrend",
    "LocalLinearTrendParams",
    "Seasonal",
    "SeasonalParams",
    "StructuralModel",
    "StructuralParams",
    "Trend",
    "TrendParams",
    "TrigSeasonal",
]


# ---- parameters -------------------------------------------------------------------------
class TrendParams(NamedTuple):
    """Parameters of a `Trend` component (``None`` for a variance the component lacks).

    Attributes:
        level_var: scalar ``sigma^2_eta``, the variance of the level's disturbance.
        slope_var: scalar ``sigma^2_zeta``, the variance of the slope's disturbance.

    Examples:
        >>> import statseq as ss
        >>> ss.TrendParams(level_var=1.0)                   # a local level: no slope variance
        TrendParams(level_var=1.0, slope_var=None)
        >>> model = ss.StructuralModel((ss.Trend(slope=True),))
        >>> model.default_params().components[0].slope_var.shape
        ()
    """

    level_var: Any
    slope_var: Any = None


class SeasonalParams(NamedTuple):
    """Parameters of a `Seasonal` or `TrigSeasonal` component.

    Attributes:
        var: scalar ``sigma^2_omega`` (``None`` for a fixed seasonal pattern).

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.StructuralModel((ss.Trend(), ss.Seasonal(period=4)))
        >>> params = ss.StructuralParams(obs_var=jnp.array(0.5), components=(
        ...     ss.TrendParams(level_var=jnp.array(0.1)), ss.SeasonalParams(var=jnp.array(0.01))))
        >>> y = jnp.tile(jnp.array([1.0, -1.0, 2.0, -2.0]), 6)
        >>> model.forecast_moments(params, y, num_steps=4).mean.shape
        (4,)
    """

    var: Any


class ARComponentParams(NamedTuple):
    """Parameters of an `ARComponent`.

    Attributes:
        coeffs: ``(order,)`` autoregressive coefficients ``phi_1, ..., phi_p``.
        var: scalar innovation variance ``sigma^2_ar``.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.StructuralModel((ss.ARComponent(order=2),))
        >>> params = ss.StructuralParams(obs_var=jnp.array(1.0), components=(
        ...     ss.ARComponentParams(coeffs=jnp.array([0.5, 0.2]), var=jnp.array(2.0)),))
        >>> y = ss.datasets.load_nile().to_numpy()[:30] / 100
        >>> bool(jnp.isfinite(ss.log_prob(model, params, y)))
        True
    """

    coeffs: Any
    var: Any


class StructuralParams(NamedTuple):
    """Parameters of a `StructuralModel`.

    Attributes:
        obs_var: scalar variance of the irregular term ``eps_t``.
        components: tuple with one parameter NamedTuple per component, in the order of
            ``model.components``.
        regression: ``(input_dim,)`` regression coefficients ``beta`` of the inputs in the
            observation equation (``None`` for a model without inputs).

    Examples:
        >>> import statseq as ss
        >>> model = ss.StructuralModel((ss.Trend(slope=True),
        ...                             ss.TrigSeasonal(period=12, harmonics=2)))
        >>> params = model.default_params()
        >>> type(params).__name__, len(params.components)
        ('StructuralParams', 2)
        >>> params.components[0]._fields
        ('level_var', 'slope_var')
    """

    obs_var: Any
    components: tuple
    regression: Any = None


class LocalLevelParams(NamedTuple):
    """Parameters of `LocalLevel`.

    Attributes:
        obs_var: scalar ``sigma^2_eps``.
        level_var: scalar ``sigma^2_eta``.

    Examples:
        >>> import statseq as ss
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> round(float(ss.log_prob(ss.LocalLevel(), params, y)), 1)
        -633.5
    """

    obs_var: Any
    level_var: Any


class LocalLinearTrendParams(NamedTuple):
    """Parameters of `LocalLinearTrend`.

    Attributes:
        obs_var: scalar ``sigma^2_eps``.
        level_var: scalar ``sigma^2_eta``.
        slope_var: scalar ``sigma^2_zeta``.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = np.log(ss.datasets.load_air_passengers().to_numpy().astype(float))
        >>> params = ss.LocalLinearTrendParams(obs_var=1e-3, level_var=1e-3, slope_var=1e-5)
        >>> fc = ss.LocalLinearTrend().forecast_moments(params, y, num_steps=12)
        >>> fc.mean.shape
        (12,)
    """

    obs_var: Any
    level_var: Any
    slope_var: Any


class _Block(NamedTuple):
    """A component's matrices ``T_c``, ``Q_c`` and its initial law."""

    transition: Any  # (n_c, n_c)
    cov: Any  # (n_c, n_c)
    initial_cov: Any  # (n_c, n_c) proper part
    diffuse: Any  # (n_c, q_c) diffuse directions


class ComponentEstimate(NamedTuple):
    """Filtered and smoothed contribution ``Z_c x_{c,t}`` of one component.

    Every field has shape ``batch_shape + (num_timesteps,)``. Filtered values at steps
    where the data seen so far do not yet identify the component (its diffuse part still
    has infinite variance) are NaN.

    Attributes:
        filtered_mean: ``E[Z_c x_{c,t} | y_{0:t}]``.
        filtered_std: its standard deviation.
        smoothed_mean: ``E[Z_c x_{c,t} | y_{0:T-1}]``.
        smoothed_std: its standard deviation.

    Examples:
        >>> import statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> model = ss.StructuralModel((ss.Trend(),))
        >>> params = ss.StructuralParams(15099.0, (ss.TrendParams(level_var=1469.1),))
        >>> level = model.decompose(params, y)["level"]
        >>> level._fields
        ('filtered_mean', 'filtered_std', 'smoothed_mean', 'smoothed_std')
        >>> bool((level.smoothed_std <= level.filtered_std + 1e-9)[1:].all())
        True
    """

    filtered_mean: Any
    filtered_std: Any
    smoothed_mean: Any
    smoothed_std: Any


class ComponentForecast(NamedTuple):
    """Predictive moments of one component's contribution ``Z_c x_{c,T+h}``.

    Attributes:
        mean: ``batch_shape + (num_steps,)``.
        std: ``batch_shape + (num_steps,)``.

    Examples:
        >>> import statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> model = ss.StructuralModel((ss.Trend(),))
        >>> params = ss.StructuralParams(15099.0, (ss.TrendParams(level_var=1469.1),))
        >>> fc = model.forecast_components(params, y, num_steps=5)["level"]
        >>> fc.mean.shape, bool((fc.std[1:] > fc.std[:-1]).all())
        ((5,), True)
    """

    mean: Any
    std: Any


# ---- components -------------------------------------------------------------------------
_COMPONENT_TYPES: dict[str, type[Component]] = {}


def _check_bool(value, name):
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _positive(stochastic: bool):
    return constraints.positive if stochastic else None


def _scalar(stochastic: bool):
    return () if stochastic else None


def _fill(stochastic: bool, value, dtype):
    if not stochastic:
        return None
    if isinstance(value, jax.Array):  # traced, or on the device already
        return jnp.asarray(value, dtype)
    # host values: a transfer (device_put), not a small compiled cast program
    return jax.device_put(np.asarray(value, jnp.dtype(dtype or float_dtype())))


class Component(abc.ABC):
    """One component of a `StructuralModel` (a frozen dataclass of static options).

    A component says how its parameter NamedTuple maps to its block of the state space
    model (`block`) and names its contribution (`name`). Subclasses are registered by
    class name so that a saved `StructuralModel` can be rebuilt.
    """

    name: ClassVar[str] = "component"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _COMPONENT_TYPES[cls.__name__] = cls

    @property
    @abc.abstractmethod
    def state_dim(self) -> int:
        """Number of states ``n_c`` of the component."""

    @abc.abstractmethod
    def param_shapes(self):
        """The component's params NamedTuple with shape tuples (or ``None``) as leaves."""

    @abc.abstractmethod
    def param_constraints(self):
        """The component's params NamedTuple with numpyro constraints as leaves."""

    @abc.abstractmethod
    def default_params(self, scale: float = 1.0, dtype=None):
        """Parameters with every variance equal to ``scale``."""

    @abc.abstractmethod
    def design(self) -> np.ndarray:
        """``Z_c``: ``(n_c,)`` weights of the states in the component's contribution."""

    @abc.abstractmethod
    def block(self, params, dtype) -> _Block:
        """The component's matrices ``T_c``, ``Q_c`` and initial law."""

    def check_params(self, params) -> None:  # noqa: B027 - optional hook
        """Eager checks beyond the constraints (e.g. stationarity)."""

    @property
    def detail(self) -> str:
        """What distinguishes this component from another of the same kind (for names)."""
        return ""

    def config(self) -> dict[str, Any]:
        """JSON-friendly options, with the component's type."""
        return {"type": type(self).__name__, **dataclasses.asdict(self)}  # type: ignore[call-overload]


def _diffuse_block(transition, cov, dtype) -> _Block:
    n = transition.shape[0]
    return _Block(jnp.asarray(transition, dtype), jnp.asarray(cov, dtype),
                  jnp.zeros((n, n), dtype), jnp.eye(n, dtype=dtype))


def _first_unit(n: int) -> np.ndarray:
    e = np.zeros(n)
    e[0] = 1.0
    return e


@dataclasses.dataclass(frozen=True)
class Trend(Component):
    """Local level, or local linear trend with ``slope=True`` (exact diffuse start).

        level_{t+1} = level_t + slope_t + eta_t,   eta_t ~ N(0, level_var),
        slope_{t+1} = slope_t + zeta_t,             zeta_t ~ N(0, slope_var),

    contributing ``level_t`` to ``y_t``. Without a slope, ``level_{t+1} = level_t + eta_t``
    (a random walk). State ``(level, slope)`` or ``(level,)``.

    Args:
        slope: include the slope (local linear trend).
        stochastic_level: whether the level has a disturbance (``level_var``); without
            one and with a stochastic slope this is Harvey's smooth trend.
        stochastic_slope: whether the slope has a disturbance (``slope_var``).

    Its parameters are a `TrendParams` ``(level_var, slope_var)``, ``None`` where absent.

    Examples:
        >>> import statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> model = ss.StructuralModel((ss.Trend(),))    # the local level model
        >>> params = ss.StructuralParams(15099.0, (ss.TrendParams(level_var=1469.1),))
        >>> round(float(ss.log_prob(model, params, y)), 1)
        -633.5
    """

    slope: bool = False
    stochastic_level: bool = True
    stochastic_slope: bool = True

    name: ClassVar[str] = "level"

    def __post_init__(self):
        for field in ("slope", "stochastic_level", "stochastic_slope"):
            _check_bool(getattr(self, field), field)

    @property
    def _has_slope_var(self) -> bool:
        return self.slope and self.stochastic_slope

    @property
    def state_dim(self) -> int:
        return 2 if self.slope else 1

    @property
    def detail(self) -> str:
        return "trend" if self.slope else ""

    def param_shapes(self) -> TrendParams:
        return TrendParams(_scalar(self.stochastic_level), _scalar(self._has_slope_var))

    def param_constraints(self) -> TrendParams:
        return TrendParams(_positive(self.stochastic_level), _positive(self._has_slope_var))

    def default_params(self, scale=1.0, dtype=None) -> TrendParams:
        dtype = dtype or float_dtype()
        return TrendParams(_fill(self.stochastic_level, scale, dtype),
                           _fill(self._has_slope_var, scale, dtype))

    def design(self) -> np.ndarray:
        return _first_unit(self.state_dim)

    def block(self, params, dtype) -> _Block:
        zero = jnp.zeros((), dtype)
        level_var = params.level_var if self.stochastic_level else zero
        if not self.slope:
            return _diffuse_block(np.ones((1, 1)), jnp.reshape(level_var, (1, 1)), dtype)
        slope_var = params.slope_var if self._has_slope_var else zero
        cov = jnp.diag(jnp.stack([level_var, slope_var]).astype(dtype))
        return _diffuse_block(np.array([[1.0, 1.0], [0.0, 1.0]]), cov, dtype)


def _check_period(period, name="period", *, integer=True):
    if isinstance(period, bool) or not isinstance(period, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {period!r}")
    if integer and int(period) != period:
        raise ValueError(f"{name} must be an integer, got {period!r}")
    if not (math.isfinite(period) and period >= 2):
        raise ValueError(f"{name} must be at least 2 (the number of seasons), got {period!r}")


@dataclasses.dataclass(frozen=True)
class Seasonal(Component):
    """Dummy seasonal component with ``period`` seasons (exact diffuse start).

        gamma_{t+1} = -(gamma_t + gamma_{t-1} + ... + gamma_{t-s+2}) + omega_t,
        omega_t ~ N(0, var),

    so the ``s = period`` seasonal effects sum to zero in expectation; it contributes
    ``gamma_t``. State ``(gamma_t, ..., gamma_{t-s+2})`` (``s - 1`` states), as statsmodels'
    ``UnobservedComponents(seasonal=s)``.

    Args:
        period: number of seasons ``s >= 2``.
        stochastic: whether the pattern evolves (``var``) or is fixed.

    Its parameters are a `SeasonalParams` ``(var,)``.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = np.log(ss.datasets.load_air_passengers().to_numpy().astype(float))
        >>> model = ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(period=12)))
        >>> params = model.default_params()._replace(obs_var=1e-3)
        >>> season = model.decompose(params, y[:48])["seasonal"].smoothed_mean
        >>> season.shape
        (48,)
    """

    period: int = 2
    stochastic: bool = True

    name: ClassVar[str] = "seasonal"

    def __post_init__(self):
        _check_period(self.period)
        object.__setattr__(self, "period", int(self.period))
        _check_bool(self.stochastic, "stochastic")

    @property
    def state_dim(self) -> int:
        return self.period - 1

    @property
    def detail(self) -> str:
        return str(self.period)

    def param_shapes(self) -> SeasonalParams:
        return SeasonalParams(_scalar(self.stochastic))

    def param_constraints(self) -> SeasonalParams:
        return SeasonalParams(_positive(self.stochastic))

    def default_params(self, scale=1.0, dtype=None) -> SeasonalParams:
        return SeasonalParams(_fill(self.stochastic, scale, dtype or float_dtype()))

    def design(self) -> np.ndarray:
        return _first_unit(self.state_dim)

    def block(self, params, dtype) -> _Block:
        n = self.state_dim
        transition = np.eye(n, k=-1)
        transition[0] = -1.0
        var = params.var if self.stochastic else jnp.zeros((), dtype)
        e1 = _first_unit(n)
        return _diffuse_block(transition, var * np.outer(e1, e1), dtype)


@dataclasses.dataclass(frozen=True)
class TrigSeasonal(Component):
    """Trigonometric (frequency-domain) seasonal component (exact diffuse start).

    The sum of ``harmonics`` stochastic cycles at the seasonal frequencies
    ``lambda_j = 2 pi j / period``, ``j = 1, ..., harmonics``:

        [gamma_{j,t+1}, gamma*_{j,t+1}] = [[cos l_j, sin l_j], [-sin l_j, cos l_j]]
                                          [gamma_{j,t}, gamma*_{j,t}] + (omega_j, omega*_j),

    all disturbances with variance ``var``, contributing ``sum_j gamma_{j,t}``, as
    statsmodels' ``UnobservedComponents(freq_seasonal=[{"period": s, "harmonics": h}])``
    and Durbin and Koopman (2012, eq. 3.7-3.8). The period may be non-integer (e.g.
    ``365.25``). One difference from statsmodels: at the Nyquist harmonic ``j = s / 2`` (even
    ``s`` with ``harmonics = s / 2``) ``sin l_j = 0``, so ``gamma*_j`` never reaches ``y``;
    it is dropped here (one state for that harmonic, ``s - 1`` states in all), which leaves
    the likelihood unchanged and lets the exact diffuse filter identify every state.

    Args:
        period: the seasonal period ``s >= 2``.
        harmonics: number of harmonics ``h`` (``1 <= h <= floor(s / 2)``; default
            ``floor(s / 2)``, the full seasonal pattern).
        stochastic: whether the pattern evolves (``var``) or is fixed.

    Its parameters are a `SeasonalParams` ``(var,)``.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = np.log(ss.datasets.load_air_passengers().to_numpy().astype(float))
        >>> model = ss.StructuralModel((ss.Trend(slope=True),
        ...                             ss.TrigSeasonal(period=12, harmonics=3)))
        >>> model.state_dim                                 # 2 trend states + 2 per harmonic
        8
        >>> params = model.default_params()._replace(obs_var=1e-3)
        >>> model.decompose(params, y[:48])["seasonal"].smoothed_mean.shape
        (48,)
    """

    period: float = 2
    harmonics: int | None = None
    stochastic: bool = True

    name: ClassVar[str] = "seasonal"

    def __post_init__(self):
        _check_period(self.period, integer=False)
        _check_bool(self.stochastic, "stochastic")
        top = math.floor(self.period / 2)
        if self.harmonics is None:
            object.__setattr__(self, "harmonics", top)
        elif (isinstance(self.harmonics, bool) or not isinstance(self.harmonics, int | np.integer)
              or not 1 <= self.harmonics <= top):
            raise ValueError(
                f"harmonics must be an integer between 1 and floor(period / 2) = {top}, "
                f"got {self.harmonics!r}"
            )
        object.__setattr__(self, "harmonics", int(self.harmonics))

    def _sizes(self) -> list[int]:
        """States per harmonic: 2, or 1 at the Nyquist frequency ``2 j == period``."""
        return [1 if 2 * j == self.period else 2 for j in range(1, self.harmonics + 1)]

    @property
    def state_dim(self) -> int:
        return sum(self._sizes())

    @property
    def detail(self) -> str:
        return f"{self.period:g}"

    def param_shapes(self) -> SeasonalParams:
        return SeasonalParams(_scalar(self.stochastic))

    def param_constraints(self) -> SeasonalParams:
        return SeasonalParams(_positive(self.stochastic))

    def default_params(self, scale=1.0, dtype=None) -> SeasonalParams:
        return SeasonalParams(_fill(self.stochastic, scale, dtype or float_dtype()))

    def design(self) -> np.ndarray:
        starts = np.cumsum([0] + self._sizes()[:-1])
        out = np.zeros(self.state_dim)
        out[starts] = 1.0
        return out

    def block(self, params, dtype) -> _Block:
        n = self.state_dim
        transition, i = np.zeros((n, n)), 0
        for j, size in enumerate(self._sizes(), start=1):
            lam = 2.0 * np.pi * j / self.period
            c, s = np.cos(lam), np.sin(lam)
            transition[i:i + size, i:i + size] = [[c, s], [-s, c]] if size == 2 else [[-1.0]]
            i += size
        var = params.var if self.stochastic else jnp.zeros((), dtype)
        return _diffuse_block(transition, var * np.eye(n), dtype)


@dataclasses.dataclass(frozen=True)
class ARComponent(Component):
    """Autoregressive component AR(p) in companion form (stationary start by default).

        a_{t+1} = phi_1 a_t + ... + phi_p a_{t-p+1} + xi_t,   xi_t ~ N(0, var),

    contributing ``a_t``; state ``(a_t, a_{t-1}, ..., a_{t-p+1})``. With
    ``initial="stationary"`` the initial state follows the stationary law ``N(0, P)``,
    ``P = T P T^T + Q`` (discrete Lyapunov equation), as statsmodels'
    ``UnobservedComponents(autoregressive=p)``; the coefficients must then be stationary
    (checked eagerly). ``initial="diffuse"`` starts exact diffuse instead.

    Args:
        order: ``p >= 1``.
        initial: ``"stationary"`` or ``"diffuse"``.

    Its parameters are an `ARComponentParams` ``(coeffs, var)``.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> model = ss.StructuralModel((ss.Trend(), ss.ARComponent(order=1)))
        >>> model.component_names, model.state_dim
        (('level', 'ar'), 2)
        >>> params = model.default_params()
        >>> params.components[1].coeffs.shape
        (1,)
    """

    order: int = 1
    initial: Literal["stationary", "diffuse"] = "stationary"

    name: ClassVar[str] = "ar"

    def __post_init__(self):
        check_positive_int(self.order, "order")
        if self.initial not in ("stationary", "diffuse"):
            raise ValueError(
                f"initial must be 'stationary' or 'diffuse', got {self.initial!r}"
            )

    @property
    def state_dim(self) -> int:
        return self.order

    @property
    def detail(self) -> str:
        return str(self.order)

    def param_shapes(self) -> ARComponentParams:
        return ARComponentParams((self.order,), ())

    def param_constraints(self) -> ARComponentParams:
        return ARComponentParams(constraints.real, constraints.positive)

    def default_params(self, scale=1.0, dtype=None) -> ARComponentParams:
        dtype = dtype or float_dtype()
        return ARComponentParams(jnp.zeros((self.order,), dtype), jnp.asarray(scale, dtype))

    def companion(self, coeffs):
        """The ``(p, p)`` companion matrix with ``coeffs`` in its first row."""
        p = self.order
        return jnp.concatenate([jnp.reshape(coeffs, (1, p)), jnp.eye(p - 1, p, dtype=coeffs.dtype)])

    def design(self) -> np.ndarray:
        return _first_unit(self.order)

    def block(self, params, dtype) -> _Block:
        p = self.order
        transition = self.companion(jnp.asarray(params.coeffs, dtype))
        e1 = _first_unit(p)
        cov = jnp.asarray(params.var, dtype) * np.outer(e1, e1)
        if self.initial == "diffuse":
            return _diffuse_block(transition, cov, dtype)
        return _Block(transition, cov, solve_discrete_lyapunov(transition, cov),
                      jnp.zeros((p, 0), dtype))

    def check_params(self, params) -> None:
        if self.initial != "stationary":
            return
        coeffs = np.asarray(params.coeffs, float)
        radius = float(np.max(np.abs(np.linalg.eigvals(np.asarray(self.companion(
            jnp.asarray(coeffs)))))))
        if radius >= 1.0:
            raise ValueError(
                f"the ARComponent coefficients {coeffs.tolist()} are not stationary "
                f"(companion spectral radius {radius:.4g} >= 1), so its stationary initial "
                "law is undefined; use ARComponent(initial='diffuse') or other coefficients"
            )


# ---- models -----------------------------------------------------------------------------
class _StructuralBase(GaussianSSMBase):
    """What every structural model shares: ``self.components`` (a tuple of `Component`)
    and a map between the model's params and ``(obs_var, per-component params)``."""

    emission_dim: ClassVar[None] = None
    input_dim: ClassVar[int] = 0

    # subclasses: a ``components`` attribute and these two maps
    def _split(self, params) -> tuple[Any, tuple]:
        """``(obs_var, component params tuple)`` from the model's params."""
        return params.obs_var, tuple(params.components)

    def _join(self, obs_var, component_params: tuple, regression=None):
        """The model's params from ``obs_var``, a component params tuple and the
        regression coefficients (``None`` without inputs)."""
        return StructuralParams(obs_var, tuple(component_params), regression)

    # ---- parameters -------------------------------------------------------------------
    def param_shapes(self):
        return self._join((), tuple(c.param_shapes() for c in self.components),
                          (self.input_dim,) if self.input_dim else None)

    def param_constraints(self):
        return self._join(constraints.positive,
                          tuple(c.param_constraints() for c in self.components),
                          constraints.real if self.input_dim else None)

    def default_params(self, dtype=None):
        """Every variance 1, autoregressive and regression coefficients 0."""
        dtype = dtype or float_dtype()
        return self._join(jax.device_put(np.asarray(1.0, dtype)),  # no cast program
                          tuple(c.default_params(1.0, dtype) for c in self.components),
                          jnp.zeros((self.input_dim,), dtype) if self.input_dim else None)

    def initialize(self, y: Any, *, key: jax.Array | None = None, inputs: Any = None,
                   mask: Any = None, method: str = "data") -> Any:
        """Starting values from the scale of the data.

        Every variance is ``v / k``, with ``v`` the variance of the observed first
        differences of ``y`` and ``k`` the number of variances; autoregressive coefficients
        start at 0. ``method="random"`` (for `statseq.fit_restarts`; needs ``key``)
        multiplies each variance by an independent factor ``10^u``, ``u ~ Uniform(-4, 1)``,
        so random starts spread the variance ratios over five orders of magnitude (the
        maximum likelihood estimate often sets some variance near 0, a boundary optimum
        that a start near equal variances may miss), and draws autoregressive coefficients
        uniformly in ``(-0.9 / p, 0.9 / p)`` (stationary for any order ``p``).

        Args:
            y: ``batch_shape + (num_timesteps,)``.
            key: a ``jax.random`` key (needed for ``method="random"``).
            inputs: ``batch_shape + (num_timesteps, input_dim)`` regressors (a
                `StructuralModel` with ``input_dim > 0``): the regression coefficients start
                at the least squares fit of the first differences of ``y`` on those of the
                inputs (differencing removes a level; a random start keeps them).
            mask: optional observation mask.
            method: ``"data"`` or ``"random"``.

        Returns:
            The model's params.
        """
        if key is not None:
            check_key(key)
        data = prepare_data(self, y, mask, inputs)
        yy = np.where(np.asarray(data.mask), np.asarray(data.y, float), np.nan)
        diffs = np.diff(yy, axis=1)
        diffs = diffs[np.isfinite(diffs)]
        level = yy[np.isfinite(yy)]
        v = float(np.var(diffs)) if diffs.size > 1 else (
            float(np.var(level)) if level.size > 1 else 1.0)
        v = v if v > 0 else 1.0
        dtype = float_dtype()
        params = self.default_params(dtype)
        cons = self.param_constraints()
        is_con = lambda x: isinstance(x, constraints.Constraint)  # noqa: E731
        num_vars = sum(c is constraints.positive
                       for c in jax.tree.leaves(cons, is_leaf=is_con))
        scale = v / max(num_vars, 1)
        if method == "data":
            factors = None
        elif method == "random":
            if key is None:
                raise ValueError("method='random' needs a key")
            k_var, k_coef = jax.random.split(key)
            factors = iter(10.0 ** np.asarray(
                jax.random.uniform(k_var, (num_vars,), minval=-4.0, maxval=1.0)))
            coef_keys = iter(jax.random.split(k_coef, max(len(jax.tree.leaves(
                cons, is_leaf=is_con)), 1)))
        else:
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")

        def leaf(con, value):
            if con is not constraints.positive:
                if factors is None or value is None or np.size(value) == 0:
                    return value
                # sum |phi_j| < 0.9: a stationary autoregression of any order
                bound = 0.9 / max(np.size(value), 1)
                draw = jax.random.uniform(next(coef_keys), np.shape(value), minval=-bound,
                                          maxval=bound)
                return jnp.asarray(draw, dtype)
            f = 1.0 if factors is None else float(next(factors))
            return jax.device_put(np.asarray(scale * f, dtype))  # a transfer, no program

        params = jax.tree.map(leaf, cons, params, is_leaf=is_con)
        if self.input_dim:
            params = params._replace(regression=jnp.asarray(
                _differenced_ols(np.asarray(data.y, float), np.asarray(data.mask),
                                 np.asarray(data.inputs, float)), dtype))
        return params

    @property
    def semidefinite_params(self) -> tuple[str, ...]:
        """Every component variance may be 0 (a deterministic level, slope, seasonal or
        autoregressive disturbance): the exact diffuse filter stays exact. The irregular
        variance ``obs_var`` must stay positive: with ``obs_var = 0`` the diffuse steps
        have a zero non-diffuse prediction variance, which the exact diffuse filter does not
        handle (it would return NaN)."""
        names = param_names(self)
        cons = jax.tree.leaves(self.param_constraints(),
                               is_leaf=lambda x: isinstance(x, constraints.Constraint))
        return tuple(n for n, c in zip(names, cons, strict=True)
                     if c is constraints.positive and n != "obs_var")

    def check_params(self, params) -> None:
        """Eager checks of each component (e.g. a stationary `ARComponent`)."""
        _, comps = self._split(params)
        for component, p in zip(self.components, comps, strict=True):
            component.check_params(p)

    # ---- state space form -------------------------------------------------------------
    @property
    def state_dim(self) -> int:
        return sum(c.state_dim for c in self.components)

    @property
    def component_names(self) -> tuple[str, ...]:
        """Unique names of the components' contributions (keys of `decompose`).

        ``"level"`` (`Trend`), ``"seasonal"``, ``"ar"``; a name shared by several
        components gets the component's period or order (``"seasonal_12"``), then its
        position if still ambiguous.
        """
        base = [c.name for c in self.components]
        names = [
            f"{n}_{c.detail}" if base.count(n) > 1 and c.detail else n
            for n, c in zip(base, self.components, strict=True)
        ]
        return tuple(f"{n}_{i}" if names.count(n) > 1 else n for i, n in enumerate(names))

    def _slices(self) -> list[slice]:
        out, start = [], 0
        for c in self.components:
            out.append(slice(start, start + c.state_dim))
            start += c.state_dim
        return out

    def component_designs(self, dtype=None):
        """``(C, n)``: row ``c`` is ``Z_c`` placed on component ``c``'s states."""
        rows = np.zeros((len(self.components), self.state_dim))
        for i, (c, sl) in enumerate(zip(self.components, self._slices(), strict=True)):
            rows[i, sl] = c.design()
        return jnp.asarray(rows, dtype or float_dtype())

    def _input_weights(self, params, dtype):
        """``(1, input_dim)``: the regression coefficients as emission input weights."""
        if not self.input_dim:
            return jnp.zeros((1, 0), dtype)
        return jnp.reshape(jnp.asarray(params.regression, dtype), (1, self.input_dim))

    def to_arrays(self, params) -> kalman.GaussianSSMArrays:
        obs_var, comps = self._split(params)
        dtype = jnp.asarray(obs_var).dtype
        blocks = [c.block(p, dtype) for c, p in zip(self.components, comps, strict=True)]
        n = self.state_dim
        q = sum(b.diffuse.shape[1] for b in blocks)

        def stack(field, cols):
            out = jnp.zeros((n, cols), dtype)
            i = j = 0
            for b in blocks:
                a = getattr(b, field)
                out = out.at[i:i + a.shape[0], j:j + a.shape[1]].set(a)
                i, j = i + a.shape[0], j + a.shape[1]
            return out

        return kalman.GaussianSSMArrays(
            initial_mean=jnp.zeros((n,), dtype),
            initial_cov=stack("initial_cov", n),
            dynamics_weights=stack("transition", n),
            dynamics_input_weights=jnp.zeros((n, self.input_dim), dtype),
            dynamics_bias=jnp.zeros((n,), dtype),
            dynamics_cov=stack("cov", n),
            emission_weights=jnp.asarray(
                np.concatenate([c.design() for c in self.components])[None, :], dtype),
            emission_input_weights=self._input_weights(params, dtype),
            emission_bias=jnp.zeros((1,), dtype),
            emission_cov=jnp.reshape(obs_var, (1, 1)).astype(dtype),
            initial_diffuse=stack("diffuse", q),
        )

    # ---- per-component output ---------------------------------------------------------
    def decompose(self, params, y, *, mask=None, inputs=None) -> dict[str, ComponentEstimate]:
        """Filtered and smoothed contribution ``Z_c x_{c,t}`` of every component.

        Both come from one run of `smoother` (so `decompose` compiles nothing of its
        own): the smoothed moments, and the filtered moments given ``y_{0:t}`` with the
        diffuse initial states integrated out. A filtered contribution is reported only
        once the observations so far identify it (``Z_c T^t A`` lies in the span of
        ``Z T^s A`` over the observed ``s <= t``, ``A`` the diffuse directions); before that
        its variance is infinite and the entries are NaN.

        Args:
            params: the model's parameters.
            y: ``batch_shape + (num_timesteps,)``.
            mask: optional observation mask (``True`` = observed).
            inputs: the regressors, for a model with ``input_dim > 0``.

        Returns:
            ``{name: ComponentEstimate}`` in the order of ``components`` (names from
            `component_names`), then, for a model with inputs, ``"regression"``: the
            regression effect ``beta' u_t`` (a function of the parameters, standard
            deviation 0); each field has shape ``batch_shape + (num_timesteps,)``.
            The smoothed contributions plus the smoothed irregular add up to ``y``.
        """
        post = self.smoother(params, y, mask=mask, inputs=inputs)
        data = prepare_data(self, y, mask, inputs)
        dtype = post.smoothed_means.dtype
        z = self.component_designs(dtype)
        f_mean, f_std = _project(z, post.filtered_means, post.filtered_covs)
        s_mean, s_std = _project(z, post.smoothed_means, post.smoothed_covs)
        known = self._identified(params, np.asarray(data.mask).reshape(data.mask.shape[:2]))
        known = jnp.asarray(known.reshape(data.batch_shape + known.shape[1:]))
        f_mean, f_std = jnp.where(known, f_mean, jnp.nan), jnp.where(known, f_std, jnp.nan)
        out = {
            name: ComponentEstimate(f_mean[..., i], f_std[..., i], s_mean[..., i],
                                    s_std[..., i])
            for i, name in enumerate(self.component_names)
        }
        if self.input_dim:
            effect = self._regression_effect(params, data.inputs, dtype)
            effect = jnp.reshape(effect, data.batch_shape + effect.shape[-1:])
            zero = jnp.zeros_like(effect)
            out["regression"] = ComponentEstimate(effect, zero, effect, zero)
        return out

    def _regression_effect(self, params, inputs, dtype):
        """``beta' u_t``: ``inputs`` ``(..., T, input_dim)`` to ``(..., T)``."""
        weights = self._input_weights(params, dtype)[0]
        return jnp.asarray(inputs, dtype) @ weights

    def _identified(self, params, mask) -> np.ndarray:
        """``(N, T, C)``: whether ``y_{0:t}`` identifies each filtered contribution.

        With ``X_s = Z A_s`` the regression of the innovations on the diffuse ``delta``,
        ``span{X_s : s <= t observed} = span{Z T^s A : s <= t observed}`` and the filtered
        contribution's regression is ``Z_c T^t A`` modulo that span, so identification
        depends only on ``T``, ``Z``, ``A`` and the mask (a few rank tests, in NumPy).
        """
        arrays = _to_arrays(self, params)
        a = np.asarray(arrays.initial_diffuse, float)
        num_seq, num_t = mask.shape
        out = np.ones((num_seq, num_t, len(self.components)), bool)
        if a.shape[1] == 0:
            return out
        f = np.asarray(arrays.dynamics_weights, float)
        z = np.asarray(arrays.emission_weights, float)[0]
        zc = np.asarray(self.component_designs(jnp.float32), float)
        for i in range(num_seq):
            basis = np.zeros((0, a.shape[1]))
            power = a  # T^t A
            for t in range(num_t):
                if basis.shape[0] == a.shape[1]:
                    break  # every diffuse direction is identified from here on
                if mask[i, t]:
                    basis = _extend_basis(basis, z @ power)
                out[i, t] = [_in_span(basis, g) for g in zc @ power]
                power = f @ power
        return out

    def forecast_components(self, params, y, *, num_steps, mask=None, inputs=None,
                            future_inputs=None) -> dict[str, ComponentForecast]:
        """h-step predictive mean and standard deviation of each component's contribution.

        From `forecast_moments`' ``state_mean`` and ``state_cov``:
        ``E[Z_c x_{c,T+h} | y] = Z_c a_{c,T+h}``, ``Var = Z_c P_{cc,T+h} Z_c^T``. The means add
        up to the forecast mean of ``y``; the variances do not add up (the components are
        correlated given ``y``, and the irregular adds ``obs_var``).

        Args:
            params: the model's parameters.
            y: history ``batch_shape + (num_timesteps,)``.
            num_steps: horizon ``h``.
            mask: optional observation mask of the history.
            inputs: the history's regressors (a model with ``input_dim > 0``).
            future_inputs: ``(num_steps, input_dim)`` regressors over the horizon.

        Returns:
            ``{name: ComponentForecast}``, fields of shape ``batch_shape + (num_steps,)``;
            with inputs, also ``"regression"`` (``beta' u_{T+h}``, standard deviation 0).
        """
        fc = self.forecast_moments(params, y, num_steps=num_steps, mask=mask, inputs=inputs,
                                   future_inputs=future_inputs)
        dtype = fc.state_mean.dtype
        z = self.component_designs(dtype)
        means, std = _project(z, fc.state_mean, fc.state_cov)
        out = {name: ComponentForecast(means[..., i], std[..., i])
               for i, name in enumerate(self.component_names)}
        if self.input_dim:
            effect = jnp.broadcast_to(
                self._regression_effect(params, self._future_inputs(future_inputs, num_steps),
                                        dtype), means.shape[:-1])
            out["regression"] = ComponentForecast(effect, jnp.zeros_like(effect))
        return out


_SPAN_TOL = 1e-8


def _differenced_ols(y, mask, inputs) -> np.ndarray:
    """Least squares coefficients of ``diff(y)`` on ``diff(inputs)`` over all sequences
    (pairs of consecutive observed steps only): a start for the regression coefficients
    that a random-walk level does not bias. Zeros where the inputs do not vary."""
    k = inputs.shape[-1]
    y = y.reshape(-1, y.shape[-1])  # (N, T): prepared scalar series
    u = inputs.reshape(y.shape + (k,))
    m = mask.reshape(y.shape).astype(bool)
    dy, du = np.diff(np.where(m, y, 0.0), axis=1), np.diff(u, axis=1)
    ok = m[:, 1:] & m[:, :-1] & np.all(np.isfinite(du), axis=-1)
    dy, du = dy[ok], du[ok]
    if dy.size == 0:
        return np.zeros(k)
    coef = np.linalg.lstsq(du, dy, rcond=None)[0]
    return np.where(np.isfinite(coef), coef, 0.0)


def _extend_basis(basis, row):
    """Add ``row``'s component orthogonal to the orthonormal rows of ``basis``."""
    scale = np.linalg.norm(row)
    resid = row - (basis @ row) @ basis
    resid = resid - (basis @ resid) @ basis  # re-orthogonalize
    norm = np.linalg.norm(resid)
    if norm <= _SPAN_TOL * scale or scale == 0.0:
        return basis
    return np.vstack([basis, resid / norm])


def _in_span(basis, row) -> bool:
    resid = row - (basis @ row) @ basis
    return bool(np.linalg.norm(resid) <= _SPAN_TOL * max(np.linalg.norm(row), 1e-300))


@partial(jax.jit, static_argnums=0)
def _to_arrays(model, params):
    return model.to_arrays(params)


@jax.jit
def _project(z, means, covs):
    """Mean and standard deviation of ``z_c x`` for each row ``z_c`` of ``z``."""
    mean = jnp.einsum("...i,ci->...c", means, z)
    var = jnp.einsum("ci,...ij,cj->...c", z, covs, z)
    return mean, jnp.sqrt(jnp.clip(var, 0.0, None))


def _as_component(c):
    if isinstance(c, Component):
        return c
    if isinstance(c, dict) and c.get("type") in _COMPONENT_TYPES:
        options = {k: v for k, v in c.items() if k != "type"}
        return _COMPONENT_TYPES[c["type"]](**options)
    raise TypeError(
        "components must be Trend, Seasonal, TrigSeasonal or ARComponent objects, got "
        f"{c!r}"
    )


@register_model
@dataclasses.dataclass(frozen=True)
class StructuralModel(_StructuralBase):
    """A structural time series model: a sum of components plus an irregular term.

        y_t = sum_c Z_c x_{c,t} + eps_t,          eps_t ~ N(0, obs_var),
        x_{c,t+1} = T_c x_{c,t} + eta_{c,t},      eta_{c,t} ~ N(0, Q_c),

    with the components' blocks stacked block-diagonally in the order given. The
    log-likelihood is the exact diffuse likelihood (non-stationary components have
    infinite initial variance; an `ARComponent` starts stationary), which is what
    statsmodels' ``UnobservedComponents(..., use_exact_diffuse=True)`` computes: the states
    of ``UnobservedComponents(y, "lltrend", seasonal=12, autoregressive=1)`` are those of
    ``StructuralModel((Trend(slope=True), Seasonal(12), ARComponent(1)))``, with parameters
    ``sigma2.irregular, sigma2.level, sigma2.trend, sigma2.seasonal, sigma2.ar, ar.L1`` equal
    to ``obs_var, (level_var, slope_var), (var,), (coeffs, var)`` here.

    With ``input_dim = k > 0`` the observation equation has a regression on ``k`` inputs
    (covariates, or intervention dummies such as a step at a known date),

        y_t = sum_c Z_c x_{c,t} + beta' u_t + eps_t,

    with ``beta`` (``params.regression``, shape ``(k,)``) a parameter estimated with the
    variances by maximum likelihood: statsmodels' ``UnobservedComponents(..., exog=u)``
    with its default ``mle_regression=True`` (parameters ``beta.x1, ...`` last). Pass
    ``inputs`` of shape ``(num_timesteps, k)`` wherever ``y`` goes, and ``future_inputs``
    to forecasts.

    Args:
        components: a tuple of `Trend`, `Seasonal`, `TrigSeasonal` and `ARComponent`
            objects (at least one).
        input_dim: number of regressors ``k`` in the observation equation (default 0).

    Its parameters are a `StructuralParams` ``(obs_var, components, regression)``, with one
    params NamedTuple per component (``regression`` is ``None`` without inputs). Beyond
    the filter protocol: `decompose` (filtered and smoothed contributions of each
    component) and `forecast_components`.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = np.log(ss.datasets.load_air_passengers().to_numpy().astype(float))
        >>> model = ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(period=12)))
        >>> params = model.default_params()._replace(obs_var=1e-3)
        >>> model.state_dim, model.component_names
        (13, ('level', 'seasonal'))
        >>> parts = model.decompose(params, y)
        >>> parts["seasonal"].smoothed_mean.shape
        (144,)

        A step intervention (a level shift of the Nile from 1899, as in Durbin and
        Koopman 2012, sec. 2.12):

        >>> nile = ss.datasets.load_nile()
        >>> step = (nile.index.to_numpy() >= 1899).astype(float)[:, None]
        >>> shifted = ss.StructuralModel((ss.Trend(),), input_dim=1)
        >>> p = shifted.default_params()._replace(obs_var=15000.0, regression=np.array([-250.0]))
        >>> p.components[0].level_var.shape, p.regression.shape
        ((), (1,))
        >>> bool(ss.log_prob(shifted, p, nile.to_numpy(float), inputs=step) < 0)
        True
    """

    components: tuple
    input_dim: int = 0

    def __post_init__(self):
        check_positive_int(self.input_dim, "input_dim", minimum=0)
        comps = self.components
        if isinstance(comps, Component | dict):
            comps = (comps,)
        if not isinstance(comps, tuple | list) or not comps:
            raise ValueError("components must be a non-empty tuple of components")
        object.__setattr__(self, "components", tuple(_as_component(c) for c in comps))

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"components": [c.config() for c in self.components]}
        if self.input_dim:
            out["input_dim"] = self.input_dim
        return out


@register_model
@dataclasses.dataclass(frozen=True)
class LocalLevel(_StructuralBase):
    """Local level model (random walk plus noise), exact diffuse start.

        y_t = mu_t + eps_t,             eps_t ~ N(0, obs_var),
        mu_{t+1} = mu_t + eta_t,         eta_t ~ N(0, level_var),

    the `StructuralModel` with one `Trend` component and flat parameters. statsmodels:
    ``UnobservedComponents(y, "llevel", use_exact_diffuse=True)`` with parameters
    ``(sigma2.irregular, sigma2.level)``.

    Its parameters are a `LocalLevelParams` ``(obs_var, level_var)``.

    Examples:
        >>> import statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> model = ss.LocalLevel()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> round(float(ss.log_prob(model, params, y)), 1)
        -633.5
    """

    @property
    def components(self) -> tuple[Component, ...]:
        return (Trend(),)

    def _split(self, params):
        return params.obs_var, (TrendParams(params.level_var),)

    def _join(self, obs_var, component_params, regression=None):
        (trend,) = component_params
        return LocalLevelParams(obs_var, trend.level_var)


@register_model
@dataclasses.dataclass(frozen=True)
class LocalLinearTrend(_StructuralBase):
    """Local linear trend model, exact diffuse start.

        y_t = mu_t + eps_t,                    eps_t ~ N(0, obs_var),
        mu_{t+1} = mu_t + nu_t + eta_t,         eta_t ~ N(0, level_var),
        nu_{t+1} = nu_t + zeta_t,               zeta_t ~ N(0, slope_var),

    the `StructuralModel` with one ``Trend(slope=True)`` and flat parameters. statsmodels:
    ``UnobservedComponents(y, "lltrend", use_exact_diffuse=True)`` with parameters
    ``(sigma2.irregular, sigma2.level, sigma2.trend)``.

    Its parameters are a `LocalLinearTrendParams` ``(obs_var, level_var, slope_var)``.

    Examples:
        >>> import statseq as ss
        >>> model = ss.LocalLinearTrend()
        >>> model.state_dim, model.default_params().slope_var.shape
        (2, ())
    """

    @property
    def components(self) -> tuple[Component, ...]:
        return (Trend(slope=True),)

    def _split(self, params):
        return params.obs_var, (TrendParams(params.level_var, params.slope_var),)

    def _join(self, obs_var, component_params, regression=None):
        (trend,) = component_params
        return LocalLinearTrendParams(obs_var, trend.level_var, trend.slope_var)
