"""Switching linear dynamical system: a Markov chain choosing linear Gaussian dynamics.

    z_0 ~ Categorical(pi),   z_t | z_{t-1} ~ Categorical(P[z_{t-1}]),
    x_0 | z_0 ~ N(m_{z_0}, V_{z_0}),
    x_t = A_{z_t} x_{t-1} + B_{z_t} u_t + b_{z_t} + N(0, Q_{z_t}),
    y_t = C_{z_t} x_t + D_{z_t} u_t + d_{z_t} + N(0, R_{z_t}).

Inference is `statseq.inference.switching_kalman` (Kim's collapsing filter and smoother,
built on the Kalman steps of `statseq.inference.kalman`) and
`statseq.inference.particle` (a Rao-Blackwellized particle filter); regime forecasts use
`statseq.inference.hmm`.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.distributions import constraints

from statseq.core.model import SequenceModel, register_model
from statseq.core.params import validate_params
from statseq.core.recurrence import reshaped_call, vmap_or_one
from statseq.core.validation import (
    check_key,
    check_positive_int,
    float_dtype,
    prepare_data,
    require_observed,
)
from statseq.inference import hmm as hmm_seq
from statseq.inference import kalman, particle
from statseq.inference import switching_gibbs as gibbs
from statseq.inference import switching_kalman as kim
from statseq.inference.gaussian import symmetrize
from statseq.models.switching._slds_gibbs import SLDSGibbsPrior, resolved_prior, run_gibbs


class SLDSParams(NamedTuple):
    """Parameters of `SwitchingLDS` (``K`` regimes, ``n`` states, ``D`` series, ``m`` inputs).

    Dynamics leaves (``dynamics_*``) have a leading axis ``K`` when
    ``switching_dynamics`` (one set per regime), else none (shared); emission leaves
    (``emission_*``) likewise with ``switching_emission``.

    Attributes:
        initial_probs: ``(K,)`` ``pi``, the law of ``z_0``.
        transitions: ``(K, K)`` row-stochastic ``P[i, j] = p(z_t = j | z_{t-1} = i)``.
        initial_means: ``(K, n)`` ``m_k``, the mean of ``x_0`` given ``z_0 = k``.
        initial_covs: ``(K, n, n)`` ``V_k``.
        dynamics_weights: ``([K,] n, n)`` ``A``.
        dynamics_input_weights: ``([K,] n, m)`` ``B``.
        dynamics_bias: ``([K,] n)`` ``b``.
        dynamics_cov: ``([K,] n, n)`` ``Q`` (positive semi-definite).
        emission_weights: ``([K,] D, n)`` ``C``.
        emission_input_weights: ``([K,] D, m)`` ``D``.
        emission_bias: ``([K,] D)`` ``d``.
        emission_cov: ``([K,] D, D)`` ``R`` (positive semi-definite).
        transition_input_weights: ``(K, m)`` ``W`` of input-driven transitions
            (``transition_inputs=True``), else ``None``.
        recurrent_weights: ``(K, n)`` ``W_x`` of recurrent transitions
            (``recurrent=True``), else ``None``.

    Examples:
        >>> import statseq as ss
        >>> model = ss.SwitchingLDS(num_regimes=2, state_dim=2, emission_dim=1,
        ...                         switching_emission=False)
        >>> p = model.default_params()
        >>> p.dynamics_weights.shape, p.emission_weights.shape     # per regime, shared
        ((2, 2, 2), (1, 2))
    """

    initial_probs: Any
    transitions: Any
    initial_means: Any
    initial_covs: Any
    dynamics_weights: Any
    dynamics_input_weights: Any
    dynamics_bias: Any
    dynamics_cov: Any
    emission_weights: Any
    emission_input_weights: Any
    emission_bias: Any
    emission_cov: Any
    transition_input_weights: Any = None
    recurrent_weights: Any = None


_DYNAMICS = ("dynamics_weights", "dynamics_input_weights", "dynamics_bias", "dynamics_cov")
_EMISSION = ("emission_weights", "emission_input_weights", "emission_bias", "emission_cov")


@register_model
@dataclasses.dataclass(frozen=True)
class SwitchingLDS(SequenceModel):
    """Switching linear dynamical system (switching state space model; Kim 1994).

        z_t | z_{t-1} ~ Categorical(P[z_{t-1}]),            z_0 ~ Categorical(pi),
        x_t = A_{z_t} x_{t-1} + B_{z_t} u_t + b_{z_t} + w_t,  w_t ~ N(0, Q_{z_t}),
        y_t = C_{z_t} x_t + D_{z_t} u_t + d_{z_t} + v_t,      v_t ~ N(0, R_{z_t}),

    with ``x_0 | z_0 = k ~ N(m_k, V_k)``. ``y`` has shape ``batch_shape + (T,) +
    event_shape``; missing entries are masked (``mask=statseq.missing_mask(y)`` for NaN).

    The exact likelihood sums over ``K^T`` regime paths. `statseq.log_prob`,
    `statseq.filter`, `filter_states` and `smoother` use **Kim's collapsing filter**
    (`statseq.inference.switching_kalman`: ``K x K`` Kalman updates per step, one Gaussian
    per regime kept by moment matching), an *approximation* of the likelihood; it is exact
    with one regime (the Kalman filter of `statseq.LinearGaussianSSM`) and when ``x_t``
    given ``z_t`` and ``y_{0:t}`` does not depend on earlier regimes (an observed state:
    Markov-switching autoregressions in intercept form, or in Hamilton's mean form of
    order 1; a Gaussian HMM). `particle_filter` gives an unbiased estimate of the exact
    likelihood (a Rao-Blackwellized particle filter, `statseq.inference.particle`).

    `statseq.sample` draws exactly from the model (the carry holds a drawn ``(z_t, x_t)``
    while sampling, `sample_step`); `statseq.forecast` draws ``(z_T, x_T)`` from Kim's
    filtered law and then simulates the model forward, so its paths mix the regimes;
    `forecast_regime_probs` gives ``p(z_{T-1+h} | y)``.

    **Input-driven and recurrent transitions** (Linderman et al. 2017): with
    ``transition_inputs`` and/or ``recurrent`` the chain reads

        p(z_t = j | z_{t-1} = i, u_t, x_{t-1}) = softmax_j(log P[i, j] + W_j u_t
                                                          + W_x[j] x_{t-1})

    (`SLDSParams.transition_input_weights` ``W``, `SLDSParams.recurrent_weights` ``W_x``;
    zeros give the plain model; a per-regime bias would be absorbed into ``P``). Input-
    driven transitions are exact in Kim's recursion (time-varying matrices), the particle
    filter and Gibbs sampling. Recurrent ones depend on the unobserved state: Kim's filter
    and smoother evaluate them at the collapsed filtered mean of ``x_{t-1}`` under each
    previous regime and the particle filter at each particle's filtered mean (both
    approximations); Gibbs sampling refuses them. Sampling and forecast paths use the
    drawn ``(u_t, x_{t-1})``, exactly. `fit_gibbs` refuses both (no conjugate update of
    ``W``); fit them by `statseq.fit_lbfgs` / `statseq.fit_sgd` on Kim's likelihood.

    Args:
        num_regimes: ``K >= 1``.
        state_dim: ``n >= 1``.
        emission_dim: ``D`` (``y`` of shape ``(T, D)``), or ``None`` for a scalar series.
        input_dim: ``m`` (0 for none).
        switching_dynamics: whether ``A, B, b, Q`` depend on the regime.
        switching_emission: whether ``C, D, d, R`` depend on the regime.
        transition_inputs: whether the inputs drive the transitions (``W``; needs
            ``input_dim >= 1``).
        recurrent: whether ``x_{t-1}`` drives the transitions (``W_x``).

    Examples:
        >>> import jax, statseq as ss
        >>> model = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None)
        >>> params = model.default_params()
        >>> y = ss.sample(model, params, num_timesteps=30, key=jax.random.key(0))
        >>> y.shape
        (30,)
        >>> post = model.smoother(params, y)                # Kim's smoother
        >>> post.smoothed_probs.shape
        (30, 2)
    """

    num_regimes: int = 2
    state_dim: int = 1
    emission_dim: int | None = 1
    input_dim: int = 0
    switching_dynamics: bool = True
    switching_emission: bool = True
    transition_inputs: bool = False
    recurrent: bool = False

    supports_partial_mask: ClassVar[bool] = True
    #: covariances that may be singular (each innovation covariance must not be)
    semidefinite_params: ClassVar[tuple[str, ...]] = ("initial_covs", "dynamics_cov",
                                                      "emission_cov")

    def __post_init__(self):
        check_positive_int(self.num_regimes, "num_regimes")
        check_positive_int(self.state_dim, "state_dim")
        if self.emission_dim is not None:
            check_positive_int(self.emission_dim, "emission_dim")
        check_positive_int(self.input_dim, "input_dim", minimum=0)
        for name in ("switching_dynamics", "switching_emission", "transition_inputs",
                     "recurrent"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if self.transition_inputs and self.input_dim == 0:
            raise ValueError("transition_inputs=True needs input_dim >= 1 (the inputs that "
                             "drive the transitions)")

    # ---- static description ---------------------------------------------------------
    @property
    def dim(self) -> int:
        """``D`` (1 for a scalar series)."""
        return 1 if self.emission_dim is None else self.emission_dim

    @property
    def event_shape(self) -> tuple[int, ...]:
        return () if self.emission_dim is None else (self.emission_dim,)

    # ---- parameters -------------------------------------------------------------------
    def param_shapes(self) -> SLDSParams:
        k, n, d, m = self.num_regimes, self.state_dim, self.dim, self.input_dim
        lf = (k,) if self.switching_dynamics else ()
        le = (k,) if self.switching_emission else ()
        return SLDSParams((k,), (k, k), (k, n), (k, n, n),
                          lf + (n, n), lf + (n, m), lf + (n,), lf + (n, n),
                          le + (d, n), le + (d, m), le + (d,), le + (d, d),
                          (k, m) if self.transition_inputs else None,
                          (k, n) if self.recurrent else None)

    def num_redundant_params(self, free) -> int:
        """Exact invariances (counted where every leaf they move is free): the state's
        basis ``x_t -> S x_t`` (``n^2``: it moves ``m_k, V_k, A, B, b, Q, C`` and the
        recurrent weights ``W_x -> W_x S^{-1}``), its origin ``x_t -> x_t + c`` (``n``:
        ``m_k, b, d``, and with recurrent transitions ``P``, whose rows absorb
        ``exp(-W_x[j] c)``), and the softmax's shift of ``W`` (``m``) and of ``W_x``
        (``n``) by one vector added to every regime's row."""
        from statseq.core.params import all_free

        n, m, f = self.state_dim, self.input_dim, free
        scale = (f.initial_means, f.initial_covs, f.dynamics_weights, f.dynamics_bias,
                 f.dynamics_cov, f.emission_weights) + (
            (f.dynamics_input_weights,) if m else ()) + (
            (f.recurrent_weights,) if self.recurrent else ())
        shift = (f.initial_means, f.dynamics_bias, f.emission_bias) + (
            (f.transitions,) if self.recurrent else ())
        total = n * n if all(map(all_free, scale)) else 0
        total += n if all(map(all_free, shift)) else 0
        if self.transition_inputs and all_free(f.transition_input_weights):
            total += m
        if self.recurrent and all_free(f.recurrent_weights):
            total += n
        return total

    def param_constraints(self) -> SLDSParams:
        real, pd, simplex = constraints.real, constraints.positive_definite, constraints.simplex
        return SLDSParams(simplex, simplex, real, pd, real, real, real, pd,
                          real, real, real, pd,
                          real if self.transition_inputs else None,
                          real if self.recurrent else None)

    def default_params(self, dtype=None) -> SLDSParams:
        """Sticky transitions (0.9 on the diagonal), uniform ``pi``, ``m_k = 0``,
        ``V_k = I``; regime ``k`` has ``A = a_k I`` with ``a_k`` spread over
        ``[0.9, -0.5]``, ``b = 0``, ``Q = 0.1 I``; ``C`` with ones on its diagonal,
        ``d = 0``, ``R = 0.1 I``; zero input weights (and zero transition weights
        ``W``, ``W_x``: the plain chain)."""
        dtype = dtype or float_dtype()
        k, n, d, m = self.num_regimes, self.state_dim, self.dim, self.input_dim
        off = 0.1 / max(k - 1, 1)
        trans = (np.full((k, k), off) + (0.9 - off) * np.eye(k)) if k > 1 else np.ones((1, 1))
        coef = np.linspace(0.9, -0.5, k) if k > 1 else np.array([0.9])
        lf = (k,) if self.switching_dynamics else ()
        le = (k,) if self.switching_emission else ()

        def tile(a, lead):
            return jnp.asarray(np.broadcast_to(a, lead + np.shape(a)), dtype)

        dyn = coef[:, None, None] * np.eye(n) if self.switching_dynamics else 0.9 * np.eye(n)
        return SLDSParams(
            jnp.full((k,), 1.0 / k, dtype), jnp.asarray(trans, dtype),
            jnp.zeros((k, n), dtype), tile(np.eye(n), (k,)),
            jnp.asarray(dyn, dtype), tile(np.zeros((n, m)), lf), tile(np.zeros(n), lf),
            tile(0.1 * np.eye(n), lf),
            tile(np.eye(d, n), le), tile(np.zeros((d, m)), le), tile(np.zeros(d), le),
            tile(0.1 * np.eye(d), le),
            jnp.zeros((k, m), dtype) if self.transition_inputs else None,
            jnp.zeros((k, n), dtype) if self.recurrent else None)

    def check_params(self, params) -> None:
        """Eager checks beyond the constraints: none needed (shapes and PSD covariances
        are checked by `statseq.core.params.validate_params`)."""

    def to_arrays(self, params) -> kim.SwitchingArrays:
        """The model as `statseq.inference.switching_kalman.SwitchingArrays` (every
        regime's matrices, shared ones broadcast over ``K``)."""
        k, n = self.num_regimes, self.state_dim
        dtype = jnp.result_type(params.dynamics_cov, params.emission_cov, params.initial_covs)

        def per_regime(a, base_ndim):
            a = jnp.asarray(a, dtype)
            return a if a.ndim > base_ndim else jnp.broadcast_to(a, (k,) + a.shape)

        regimes = kalman.GaussianSSMArrays(
            jnp.asarray(params.initial_means, dtype), jnp.asarray(params.initial_covs, dtype),
            per_regime(params.dynamics_weights, 2), per_regime(params.dynamics_input_weights, 2),
            per_regime(params.dynamics_bias, 1), per_regime(params.dynamics_cov, 2),
            per_regime(params.emission_weights, 2), per_regime(params.emission_input_weights, 2),
            per_regime(params.emission_bias, 1), per_regime(params.emission_cov, 2),
            jnp.zeros((k, n, 0), dtype))
        def optional(a, on):
            return jnp.asarray(a, dtype) if on and a is not None else None

        return kim.SwitchingArrays(
            jnp.asarray(params.initial_probs, dtype), jnp.asarray(params.transitions, dtype),
            regimes, optional(params.transition_input_weights, self.transition_inputs),
            optional(params.recurrent_weights, self.recurrent))

    # ---- the filter protocol (Kim's filter) -------------------------------------------
    def initial_carry(self, params) -> kim.KimCarry:
        return kim.initial_carry(self.to_arrays(params))

    def _flat(self, y_t, mask_t, dtype):
        y = jnp.reshape(jnp.asarray(y_t), (self.dim,)).astype(dtype)
        m = jnp.reshape(jnp.asarray(mask_t, bool), (-1,)) & jnp.ones((self.dim,), bool)
        return y, m

    def predict(self, params, carry, inputs_t):
        """Kim's one-step predictive: a mixture over the ``K x K`` pairs
        ``(z_{t-1}, z_t)`` of ``N(C_j a_ij + D_j u_t + d_j, C_j P_ij C_j^T + R_j)``."""
        arrays = self.to_arrays(params)
        w, means, covs = kim.pair_priors(arrays, carry, inputs_t)
        reg = arrays.regimes
        c, dw, d, r = (reg.emission_weights, reg.emission_input_weights, reg.emission_bias,
                       reg.emission_cov)
        y_mean = jnp.einsum("jdn,ijn->ijd", c, means) + (dw @ inputs_t + d)[None]
        y_cov = symmetrize(jnp.einsum("jdn,ijnm,jem->ijde", c, covs, c) + r[None])
        k2 = self.num_regimes ** 2
        mix = dist.Categorical(probs=w.reshape(k2))
        if self.emission_dim is None:
            comp = dist.Normal(y_mean.reshape(k2), jnp.sqrt(y_cov.reshape(k2)))
        else:
            comp = dist.MultivariateNormal(y_mean.reshape(k2, self.dim),
                                           y_cov.reshape(k2, self.dim, self.dim))
        return dist.MixtureSameFamily(mix, comp)

    def step(self, params, carry, y_t, mask_t, inputs_t):
        arrays = self.to_arrays(params)
        y, m = self._flat(y_t, mask_t, arrays.regimes.initial_cov.dtype)
        lp, new, _ = kim.kim_step(arrays, carry, y, m, inputs_t)
        return lp, new

    def update(self, params, carry, y_t, mask_t, inputs_t) -> kim.KimCarry:
        return self.step(params, carry, y_t, mask_t, inputs_t)[1]

    def sample_step(self, params: Any, carry: kim.KimCarry, key: jax.Array,
                    inputs_t: jax.Array) -> tuple:
        """One exact ancestral step: draw ``(z_{t-1}, x_{t-1})`` from the carry's belief
        (a point mass once sampling is under way), then ``z_t``, ``x_t`` and ``y_t`` from
        the model; the new carry is the point mass at the drawn ``(z_t, x_t)``.

        Returns:
            ``(y_t, new carry)``.
        """
        arrays = self.to_arrays(params)
        reg = arrays.regimes
        k_i, k_x, k_j, k_w, k_v = jax.random.split(key, 5)
        i = jax.random.categorical(k_i, jnp.log(carry.probs))
        x_prev = kalman._mvn_draw(k_x, carry.means[i], carry.covs[i])
        first = carry.t == 0
        row = kim.transition_log_row(arrays, i, inputs_t.astype(x_prev.dtype), x_prev)
        j = jnp.where(first, i, jax.random.categorical(k_j, row))
        arr = kim.regime(arrays, j)
        mean = (arr.dynamics_weights @ x_prev + arr.dynamics_input_weights @ inputs_t
                + arr.dynamics_bias)
        x = jnp.where(first, x_prev, kalman._mvn_draw(k_w, mean, arr.dynamics_cov))
        y = kalman._mvn_draw(k_v, arr.emission_weights @ x + arr.emission_input_weights
                             @ inputs_t + arr.emission_bias, arr.emission_cov)
        k, n = self.num_regimes, self.state_dim
        new = kim.KimCarry(jax.nn.one_hot(j, k, dtype=carry.probs.dtype),
                           jnp.broadcast_to(x, (k, n)), jnp.zeros_like(reg.initial_cov),
                           carry.t + 1)
        return jnp.reshape(y, self.event_shape), new

    # ---- special cases ------------------------------------------------------------------
    @classmethod
    def from_ms_ar(cls, model: Any, params: Any,
                   y_start: ArrayLike) -> tuple[SwitchingLDS, SLDSParams]:
        """A `statseq.MarkovSwitchingAR` in intercept form as an SLDS on its observed
        companion state (Kim's filter and smoother are then exact):

            y_t = c_{z_t} + sum_{i=1}^p phi_{z_t, i} y_{t-i} + sigma_{z_t} eps_t
            x_t = (y_t, ..., y_{t-p+1}) = A_z x_{t-1} + c_z e_1 + N(0, sigma^2_z e_1 e_1^T),
            y_t = e_1^T x_t  (no observation noise),

        with ``A_z`` the companion matrix of ``phi_z``. The SLDS scores ``y_{p:}`` given
        ``y_start = y_{0:p-1}`` (as the MS-AR conditions on its first ``p`` values):
        ``x`` at the first scored step given ``z`` is ``N(A_z x_{p-1} + c_z e_1, Q_z)``
        and ``z`` there has the law ``p(s_0) P^p``. ``form="mean"`` is accepted only
        without a switching mean (then ``c_k = mu (1 - sum_i phi_{k, i})``); with a
        switching mean the density depends on ``p + 1`` regimes (see
        tests/models/test_slds.py for Hamilton's order-1 case as an SLDS).

        Args:
            model: a `statseq.MarkovSwitchingAR` with ``order >= 1``.
            params: its `statseq.MSARParams`.
            y_start: ``(p,)`` the first ``p`` observations ``y_0, ..., y_{p-1}``.

        Returns:
            ``(SwitchingLDS, SLDSParams)``; ``statseq.log_prob(slds, slds_params, y[p:])``
            equals ``statseq.log_prob(model, params, y)``.

        Examples:
            >>> import jax.numpy as jnp, numpy as np, statseq as ss
            >>> msar = ss.MarkovSwitchingAR(num_regimes=2, order=2, form="intercept",
            ...                             initial="free")
            >>> mp = ss.MSARParams(jnp.array([0.2, 0.8]), jnp.array([[0.9, 0.1], [0.2, 0.8]]),
            ...                    jnp.array([-1.0, 1.0]), jnp.array([0.5, -0.2]),
            ...                    jnp.array(0.3))
            >>> y = jnp.array([0.1, -0.9, -1.2, 0.8, 1.1, 1.3])
            >>> slds, sp = ss.SwitchingLDS.from_ms_ar(msar, mp, y[:2])
            >>> lp, ref = ss.log_prob(slds, sp, y[2:]), ss.log_prob(msar, mp, y)
            >>> bool(abs(lp - ref) < 1e-4)     # equal (here in float32)
            True
        """
        from statseq.models.switching.ms_ar import MarkovSwitchingAR

        if not isinstance(model, MarkovSwitchingAR):
            raise TypeError(f"model must be a MarkovSwitchingAR, got {type(model).__name__}")
        if model.form != "intercept" and model.switching_mean:
            raise ValueError("from_ms_ar needs form='intercept' (or a mean that does not "
                             "switch): a switching mean in Hamilton's form makes y_t depend "
                             "on p + 1 regimes")
        k, p = model.num_regimes, model.order
        check_positive_int(p, "order")
        start = np.asarray(y_start, float)
        if start.shape != (p,) or not np.all(np.isfinite(start)):
            raise ValueError(f"y_start must hold the first {p} observations (finite, shape "
                             f"({p},)), got shape {start.shape}")
        trans = np.asarray(params.transitions, float)
        phi = np.broadcast_to(np.asarray(params.ar_coeffs, float), (k, p))
        var = np.broadcast_to(np.asarray(params.variances, float), (k,))
        const = np.broadcast_to(np.asarray(params.means, float), (k,))
        if model.form != "intercept":
            const = const * (1.0 - phi.sum(-1))
        comp = np.zeros((k, p, p))
        comp[:, 0] = phi
        comp[:, 1:, :-1] = np.eye(p - 1)
        bias = np.zeros((k, p))
        bias[:, 0] = const
        q = np.zeros((k, p, p))
        q[:, 0, 0] = var
        pi = np.asarray(model.initial_probs(params), float) @ np.linalg.matrix_power(trans, p)
        slds = cls(num_regimes=k, state_dim=p, emission_dim=None)
        dtype = float_dtype()
        return slds, SLDSParams(*(jnp.asarray(a, dtype) for a in (
            pi, trans, comp @ start[::-1] + bias, q, comp, np.zeros((k, p, 0)), bias, q,
            np.tile(np.eye(1, p), (k, 1, 1)), np.zeros((k, 1, 0)), np.zeros((k, 1)),
            np.zeros((k, 1, 1)))))

    # ---- posterior inference ------------------------------------------------------------
    def _prepared(self, params, y, mask, inputs):
        validate_params(self, params)
        return prepare_data(self, y, mask, inputs)

    def filter_states(self, params: Any, y: ArrayLike, *, mask: ArrayLike | None = None,
                      inputs: ArrayLike | None = None) -> kim.KimFilterResult:
        """Kim's filter (approximate): regime probabilities and per-regime state moments.

        Args:
            params: the model's parameters.
            y: ``batch_shape + (T,) + event_shape``.
            mask: optional observation mask (per step or per entry).
            inputs: covariates, when the model takes them.

        Returns:
            A `statseq.inference.switching_kalman.KimFilterResult` (batch shape leading).
        """
        data = self._prepared(params, y, mask, inputs)
        return reshaped_call(_slds_posterior, data.batch_shape,
                             dict(params=params, y=data.y, mask=data.mask,
                                  inputs=data.inputs), model=self, what="filter")

    def smoother(self, params: Any, y: ArrayLike, *, mask: ArrayLike | None = None,
                 inputs: ArrayLike | None = None) -> kim.KimSmootherResult:
        """Kim's smoother (approximate): smoothed regime probabilities and states.

        Args:
            params: the model's parameters.
            y: ``batch_shape + (T,) + event_shape``.
            mask: optional observation mask (per step or per entry).
            inputs: covariates, when the model takes them.

        Returns:
            A `statseq.inference.switching_kalman.KimSmootherResult` (batch shape leading).
        """
        data = self._prepared(params, y, mask, inputs)
        return reshaped_call(_slds_posterior, data.batch_shape,
                             dict(params=params, y=data.y, mask=data.mask,
                                  inputs=data.inputs), model=self, what="smoother")

    def particle_filter(self, params: Any, y: ArrayLike, *, key: jax.Array,
                        num_particles: int, mask: ArrayLike | None = None,
                        inputs: ArrayLike | None = None, resampling: str = "systematic",
                        ess_threshold: float = 1.0,
                        proposal: str = "optimal") -> particle.RBPFResult:
        """The Rao-Blackwellized particle filter
        (`statseq.inference.particle.rao_blackwellized_particle_filter`) on every sequence;
        ``exp(result.marginal_log_lik)`` is an unbiased estimate of the exact likelihood.

        Args:
            params: the model's parameters.
            y: ``batch_shape + (T,) + event_shape``.
            key: a ``jax.random`` key.
            num_particles: ``N``.
            mask: optional observation mask.
            inputs: covariates, when the model takes them.
            resampling: ``"systematic"``, ``"stratified"`` or ``"multinomial"``.
            ess_threshold: resample when ``ESS < ess_threshold * N``.
            proposal: ``"optimal"`` or ``"prior"``.

        Returns:
            A `statseq.inference.particle.RBPFResult` (batch shape leading).
        """
        check_key(key)
        num_particles = check_positive_int(num_particles, "num_particles")
        if resampling not in particle.RESAMPLING:
            raise ValueError(f"resampling must be one of {particle.RESAMPLING}, "
                             f"got {resampling!r}")
        if proposal not in particle.PROPOSALS:
            raise ValueError(f"proposal must be one of {particle.PROPOSALS}, got {proposal!r}")
        if not 0.0 <= float(ess_threshold) <= 1.0:
            raise ValueError(f"ess_threshold must be in [0, 1], got {ess_threshold!r}")
        data = self._prepared(params, y, mask, inputs)
        keys = jax.random.split(key, data.y.shape[0])
        return reshaped_call(_slds_particles, data.batch_shape,
                             dict(params=params, y=data.y, mask=data.mask,
                                  inputs=data.inputs, keys=keys),
                             model=self, num_particles=num_particles, resampling=resampling,
                             proposal=proposal, threshold=float(ess_threshold))

    def sample_posterior(self, params: Any, y: ArrayLike, *, key: jax.Array,
                         num_samples: int, num_burnin: int = 100,
                         mask: ArrayLike | None = None,
                         inputs: ArrayLike | None = None) -> gibbs.GibbsSamples:
        """Draws of regime and state paths from the exact posterior ``p(z, x | y)`` by
        blocked Gibbs sampling (`statseq.inference.switching_gibbs`: the simulation smoother
        for ``x`` given ``z``, HMM forward filtering backward sampling for ``z`` given
        ``x``), started from the most probable regimes of Kim's smoother. Unlike `smoother`
        it is exact in the limit of many draws (needs positive definite ``Q`` and ``V``).

        Args:
            params: the model's parameters.
            y: ``batch_shape + (T,) + event_shape``, ``T >= 2``.
            key: a ``jax.random`` key.
            num_samples: draws kept per sequence.
            num_burnin: sweeps discarded first.
            mask: optional observation mask.
            inputs: covariates, when the model takes them.

        Returns:
            `statseq.inference.switching_gibbs.GibbsSamples` with ``regimes``
            ``(num_samples,) + batch_shape + (T,)`` and ``states``
            ``(num_samples,) + batch_shape + (T, n)``.
        """
        check_key(key)
        if self.recurrent:
            raise ValueError("sample_posterior does not support recurrent transitions (the "
                             "states given the regimes are not Gaussian); use smoother or "
                             "particle_filter")
        num_samples = check_positive_int(num_samples, "num_samples")
        num_burnin = check_positive_int(num_burnin, "num_burnin", minimum=0)
        data = self._prepared(params, y, mask, inputs)
        if data.num_timesteps < 2:
            raise ValueError(f"sample_posterior needs at least 2 time steps, got "
                             f"{data.num_timesteps}")
        keys = jax.random.split(key, data.y.shape[0])
        out = _slds_gibbs(self, params, data.y, data.mask, data.inputs, keys,
                          num_samples=num_samples, num_burnin=num_burnin)
        bs = data.batch_shape
        return gibbs.GibbsSamples(
            jnp.reshape(jnp.swapaxes(out.regimes, 0, 1), (num_samples,) + bs
                        + out.regimes.shape[2:]),
            jnp.reshape(jnp.swapaxes(out.states, 0, 1), (num_samples,) + bs
                        + out.states.shape[2:]))

    def fit_gibbs(self, params: Any, y: ArrayLike, *, key: jax.Array, num_samples: int,
                  num_burnin: int = 100, inputs: ArrayLike | None = None,
                  prior: SLDSGibbsPrior | None = None,
                  mask: ArrayLike | None = None) -> Any:
        """Bayesian inference of the parameters, regimes and states by blocked Gibbs
        sampling (`statseq.models.switching._slds_gibbs`): exact conditional draws of
        ``x | z``, ``z | x`` (as in `sample_posterior`), ``pi`` and the rows of ``P``
        (Dirichlet), and per regime the dynamics ``([A B b], Q)`` and emission
        ``([C D d], R)`` (matrix-normal-inverse-Wishart, `SLDSGibbsPrior`). The initial
        laws ``m_k, V_k`` are held at ``params``. Missing observations (``mask``) are
        handled exactly: marginalized in the ``x``, ``z`` blocks, left out of (whole
        steps) or drawn given the observed entries before (partly observed steps) the
        emission update. Needs ``T >= 2``; one chain, started at ``params`` with Kim's
        most probable regimes.

        Args:
            params: the chain's start (also fixes ``initial_means`` and ``initial_covs``).
            y: ``batch_shape + (T,) + event_shape`` (the sequences share the parameters).
            key: a ``jax.random`` key.
            num_samples: sweeps kept.
            num_burnin: sweeps discarded first.
            inputs: covariates, when the model takes them.
            prior: an `SLDSGibbsPrior` (``None``: the defaults).
            mask: optional observation mask (per step or per entry).

        Returns:
            ArviZ ``InferenceData`` whose ``posterior`` holds every `SLDSParams` leaf and
            ``regimes`` (``(chain, draw) + batch_shape + (T,)``); ``states`` too
            (``... + (T, n)``).
        """
        from statseq.bayes.nuts import _from_dict

        check_key(key)
        if self.transition_inputs or self.recurrent:
            raise ValueError("fit_gibbs does not support input-driven or recurrent "
                             "transitions (no conjugate update of their weights); fit "
                             "them with statseq.fit_lbfgs or statseq.fit_sgd")
        num_samples = check_positive_int(num_samples, "num_samples")
        num_burnin = check_positive_int(num_burnin, "num_burnin", minimum=0)
        data = self._prepared(params, y, mask, inputs)
        if data.num_timesteps < 2:
            raise ValueError(f"fit_gibbs needs at least 2 time steps, got {data.num_timesteps}")
        dtype = self.to_arrays(params).regimes.initial_cov.dtype
        prior = resolved_prior(self, prior, dtype)
        y_flat = jnp.reshape(data.y, data.y.shape[:2] + (self.dim,)).astype(dtype)
        mask = jnp.reshape(data.mask, data.mask.shape[:2] + (-1,)) & jnp.ones(
            (1, 1, self.dim), bool)
        y_flat = jnp.where(mask, y_flat, 0.0)
        u = data.inputs.astype(dtype)
        full = jax.tree.map(lambda a: jnp.asarray(a, dtype), params)
        draws, regimes, states = run_gibbs(self, full, prior, y_flat, mask, u, key,
                                           num_samples=num_samples, num_burnin=num_burnin)
        bs = data.batch_shape
        post = {name: np.asarray(getattr(draws, name))[None]
                for name in SLDSParams._fields if getattr(draws, name) is not None}
        post["regimes"] = np.asarray(regimes).reshape((1, num_samples) + bs
                                                      + regimes.shape[2:])
        post["states"] = np.asarray(states).reshape((1, num_samples) + bs + states.shape[2:])
        return _from_dict({"posterior": post}, dims=None, coords=None)

    def fit_vem(self, params: Any, y: ArrayLike, *, num_iters: int = 100,
                mask: ArrayLike | None = None, inputs: ArrayLike | None = None,
                tol: float | None = 1e-8, num_inner: int = 1) -> Any:
        """Variational EM with a structured mean-field posterior ``q(z) q(x)``
        (Ghahramani and Hinton 2000; `statseq.models.switching._slds_vem`), maximizing

            ELBO = E_q[log p(y, x, z | theta)] + H[q(z)] + H[q(x)] <= log p(y | theta).

        Each iteration updates q(x) (the Kalman smoother of the time-varying linear Gaussian
        model with the regimes' parameters precision-averaged under q(z)), then q(z) (the
        HMM smoother with local evidence ``E_{q(x)}[log p(x_t, y_t | x_{t-1}, z_t = k)]``),
        records the ELBO, then maximizes over every `SLDSParams` leaf in closed form
        (weighted regressions; ``pi``, ``P`` from expected counts). The ELBO never decreases
        (tested); with one regime the iteration is `statseq.LinearGaussianSSM`'s EM
        (tested against `statseq.fit_em`). q(z) starts from Kim's smoothed probabilities
        at ``params``. Missing observations (``mask``) are marginalized; the sequences of a
        batch share the parameters. Needs positive definite ``Q``, ``R`` and ``V``.

        With input-driven transitions (``transition_inputs=True``) q(z) is the HMM with the
        time-varying matrices ``softmax_j(log P[i, j] + W_j u_t)`` and ``(P, W)`` have no
        closed-form update: a few guarded Newton steps raise the expected transition
        log-likelihood ``sum_t sum_ij xi_t(i, j) log p(z_t = j | z_{t-1} = i, u_t)`` and are
        kept only if it does not fall (a generalized EM step: the ELBO still never
        decreases, tested). ``W`` is identified up to a shift common to its rows. Recurrent
        transitions (``recurrent=True``) are refused with a ``ValueError``: the expectation
        of ``log softmax(... + W_x x_{t-1})`` under q(x) has no closed form; fit Kim's
        approximate likelihood with `statseq.fit_lbfgs` instead.

        Args:
            params: the starting parameters.
            y: ``batch_shape + (T,) + event_shape``, ``T >= 2``.
            num_iters: maximum number of iterations.
            mask: optional observation mask (per step or per entry).
            inputs: covariates, when the model takes them.
            tol: stop when the ELBO changes by less than ``tol * max(1, |ELBO|)``
                (``None``: run ``num_iters`` iterations unless the ELBO decreases beyond
                rounding or becomes non-finite, which stops any fit).
            num_inner: q(x), q(z) updates per iteration (before the M-step).

        Returns:
            A `statseq.models.switching._slds_vem.SLDSVEMResult`: ``elbo[i]`` is the bound
            at the parameters entering iteration ``i`` (after its E-step); ``params`` are
            those after the last M-step, or those of the last recorded entry when the fit
            converged or stopped on a decrease (``stopped`` says which); ``regime_probs``,
            ``state_means`` and ``state_covs`` are q of the last recorded E-step.

        Examples:
            >>> import jax, statseq as ss
            >>> model = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None)
            >>> y = ss.sample(model, model.default_params(), num_timesteps=30,
            ...               key=jax.random.key(0))
            >>> fit = model.fit_vem(model.default_params(), y, num_iters=5, tol=None)
            >>> fit.elbo.shape, fit.stopped, fit.regime_probs.shape
            ((5,), 'max_iters', (30, 2))
        """
        from statseq.models.switching import _slds_vem

        num_iters = check_positive_int(num_iters, "num_iters")
        num_inner = check_positive_int(num_inner, "num_inner")
        if tol is not None and not float(tol) >= 0:
            raise ValueError(f"tol must be non-negative or None, got {tol!r}")
        if self.recurrent:
            raise ValueError(
                "fit_vem does not support recurrent transitions (recurrent=True): "
                "E_q(x)[log softmax(log P[i] + W u_t + W_x x_{t-1})] has no closed form, so "
                "the bound would need a further approximation; fit Kim's approximate "
                "likelihood with statseq.fit_lbfgs(model, params, y, ...) instead")
        data = self._prepared(params, y, mask, inputs)
        if data.num_timesteps < 2:
            raise ValueError(f"fit_vem needs at least 2 time steps, got {data.num_timesteps}")
        require_observed(data, "fit_vem")
        _slds_vem.check_definite(params)
        return _slds_vem.fit_vem(self, params, data, num_iters=num_iters, tol=tol,
                                 num_inner=num_inner)

    def forecast_regime_probs(self, params: Any, y: ArrayLike, *, num_steps: int,
                              mask: ArrayLike | None = None,
                              inputs: ArrayLike | None = None,
                              future_inputs: ArrayLike | None = None) -> jax.Array:
        """Regime probabilities ``h = 1..num_steps`` steps after the history,

            p(z_{T-1+h} | y_{0:T-1}) = p(z_{T-1} | y_{0:T-1}) P_T P_{T+1} ... P_{T+h-1},

        from Kim's filtered law (`statseq.inference.hmm.hmm_predict_states`); ``P_t = P``
        unless the inputs drive the transitions. Not available with recurrent transitions
        (the future regimes depend on the future states: use `statseq.forecast` paths).

        Args:
            params: the model's parameters.
            y: ``batch_shape + (T,) + event_shape``.
            num_steps: the horizon.
            mask: optional observation mask.
            inputs: covariates of the history, when the model takes them.
            future_inputs: ``(num_steps, m)`` covariates over the horizon (needed with
                ``transition_inputs``; shared by the sequences).

        Returns:
            ``batch_shape + (num_steps, K)``.
        """
        num_steps = check_positive_int(num_steps, "num_steps")
        if self.recurrent:
            raise ValueError("forecast_regime_probs is not available with recurrent "
                             "transitions (future regimes depend on future states); use "
                             "statseq.forecast sample paths")
        if self.transition_inputs:
            if future_inputs is None:
                raise ValueError("forecast_regime_probs needs future_inputs (num_steps, "
                                 "input_dim) when the inputs drive the transitions")
            fu = np.asarray(future_inputs, float)
            if fu.shape != (num_steps, self.input_dim) or not np.all(np.isfinite(fu)):
                raise ValueError(f"future_inputs must be finite with shape "
                                 f"{(num_steps, self.input_dim)}, got {fu.shape}")
        filt = self.filter_states(params, y, mask=mask, inputs=inputs)
        last = filt.filtered_probs[..., -1, :]
        flat = jnp.reshape(last, (-1, self.num_regimes))
        if self.transition_inputs:
            fu = jnp.asarray(fu, flat.dtype)
            arrays = self.to_arrays(params)
            zeros = jnp.zeros((self.num_regimes, self.state_dim), flat.dtype)
            trans = jax.vmap(lambda u: kim.transition_matrix_at(arrays, u, zeros))(fu)
        else:
            trans = jnp.asarray(params.transitions, flat.dtype)
        out = jax.vmap(lambda p: hmm_seq.hmm_predict_states(p, trans, num_steps))(flat)
        return jnp.reshape(out, last.shape[:-1] + (num_steps, self.num_regimes))


def _one_seq(model, y, mask, dtype):
    y = jnp.reshape(y, (y.shape[0], model.dim)).astype(dtype)
    mask = jnp.reshape(mask, (mask.shape[0], -1)) & jnp.ones((1, model.dim), bool)
    return y, mask


@partial(jax.jit, static_argnames=("model", "what"))
def _slds_posterior(model, params, y, mask, inputs, *, what):
    arrays = model.to_arrays(params)
    dtype = arrays.regimes.initial_cov.dtype
    fn = kim.kim_filter if what == "filter" else kim.kim_smoother

    def one(y_s, m_s, u_s):
        y_s, m_s = _one_seq(model, y_s, m_s, dtype)
        return fn(arrays, y_s, m_s, u_s.astype(dtype))

    return vmap_or_one(one)(y, mask, inputs)


@partial(jax.jit, static_argnames=("model", "num_particles", "resampling", "proposal",
                                   "threshold"))
def _slds_particles(model, params, y, mask, inputs, keys, *, num_particles, resampling,
                    proposal, threshold):
    arrays = model.to_arrays(params)
    dtype = arrays.regimes.initial_cov.dtype

    def one(y_s, m_s, u_s, k):
        y_s, m_s = _one_seq(model, y_s, m_s, dtype)
        return particle.rao_blackwellized_particle_filter(
            arrays, y_s, m_s, u_s.astype(dtype), key=k, num_particles=num_particles,
            resampling=resampling, ess_threshold=threshold, proposal=proposal)

    return vmap_or_one(one)(y, mask, inputs, keys)


@partial(jax.jit, static_argnames=("model", "num_samples", "num_burnin"))
def _slds_gibbs(model, params, y, mask, inputs, keys, *, num_samples, num_burnin):
    arrays = model.to_arrays(params)
    dtype = arrays.regimes.initial_cov.dtype

    def one(y_s, m_s, u_s, k):
        y_s, m_s = _one_seq(model, y_s, m_s, dtype)
        u_s = u_s.astype(dtype)
        start = jnp.argmax(kim.kim_smoother(arrays, y_s, m_s, u_s).smoothed_probs, axis=-1)
        return gibbs.switching_gibbs(arrays, y_s, m_s, u_s, start, key=k,
                                     num_samples=num_samples, num_burnin=num_burnin)

    return vmap_or_one(one)(y, mask, inputs, keys)
