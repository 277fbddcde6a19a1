"""Markov-switching autoregression MS(K)-AR(p) (Hamilton 1989), as an HMM on expanded states.

Switching mean (Hamilton's form, ``form="mean"``):

    y_t - mu_{s_t} = sum_{i=1}^p phi_i (y_{t-i} - mu_{s_{t-i}}) + sigma_{s_t} eps_t,

switching intercept (``form="intercept"``):

    y_t = c_{s_t} + sum_{i=1}^p phi_i y_{t-i} + sigma_{s_t} eps_t,

with ``eps_t ~ N(0, 1)`` and ``s_t`` a Markov chain on ``K`` regimes. The coefficients
``phi`` may switch with ``s_t`` (``switching_ar``), the variance too
(``switching_variance``), and the mean/intercept may be shared (``switching_mean=False``).

With a switching mean the density of ``y_t`` depends on ``(s_t, ..., s_{t-p})``, so the
model is an HMM on the expanded state ``x_t = (s_t, ..., s_{t-p})`` with ``K^(p+1)``
states and transitions ``(a_0, ..., a_p) -> (b, a_0, ..., a_{p-1})`` of probability
``P[a_0, b]``; otherwise the expanded state is ``s_t`` itself. Inference on the expanded
chain is `statseq.inference.hmm`; the user sees ``K`` regimes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from functools import partial
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.distributions import constraints

from statseq.core.distributions import FiniteMixture
from statseq.core.model import SequenceModel, register_model
from statseq.core.recurrence import filter as filter_sequences
from statseq.core.recurrence import vmap_or_one
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.inference import gaussian_sum as gsum
from statseq.inference import hmm as hmm_seq
from statseq.inference._backend import backend_kind
from statseq.inference.regime_paths import MAX_COMPONENTS, companion, regime_path_marginals
from statseq.models.hmm.base import last_lags, stationary_distribution, table_filter
from statseq.models.switching import _ms_ar_em

_LOG_2PI = math.log(2.0 * math.pi)


class MSARParams(NamedTuple):
    """Parameters of `MarkovSwitchingAR`.

    Attributes:
        initial_probs: ``(K,)`` law of the first regime ``s_0``, or ``None`` when
            ``initial="stationary"`` (the ergodic law of ``transitions``).
        transitions: ``(K, K)`` row-stochastic, ``P[i, j] = p(s_t = j | s_{t-1} = i)``.
        means: ``mu_k`` (``form="mean"``) or ``c_k`` (``form="intercept"``): ``(K,)``
            when switching, else ``()``.
        ar_coeffs: ``phi``: ``(K, p)`` when ``switching_ar``, else ``(p,)``; ``[..., i-1]``
            multiplies lag ``i``.
        variances: ``sigma^2``: ``(K,)`` when ``switching_variance``, else ``()``.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.MarkovSwitchingAR(num_regimes=2, order=1)
        >>> params = ss.MSARParams(None, jnp.array([[0.9, 0.1], [0.2, 0.8]]),
        ...                        jnp.array([-1.0, 1.0]), jnp.array([0.5]), jnp.array(0.3))
        >>> y = jnp.array([0.1, -0.9, -1.2, 0.8, 1.1, 1.3])
        >>> params.initial_probs is None                    # None: the stationary law
        True
        >>> float(ss.log_prob(model, params, y)) < 0
        True
    """

    initial_probs: Any
    transitions: jax.Array
    means: jax.Array
    ar_coeffs: jax.Array
    variances: jax.Array


#: on CPU, ``log_prob`` / ``filter`` (no per-step carries) run `MarkovSwitchingAR`'s finite-
#: state filter on the expanded chain's emission table (`masked_data_filter`) from this many
#: steps (`benchmarks/RESULTS.md`, "Session 23: HMM log_prob on the table")
TABLE_FILTER_MIN_STEPS = 64


class MSARCarry(NamedTuple):
    """Filter state: the expanded-state forward message plus the lag window.

    Attributes:
        probs: ``(M,)`` ``p(x_{t-1} | y_{<t})`` over expanded states (the initial law
            before any step).
        started: whether ``probs`` is past the first step (then it is moved by ``A``).
        lags: ``(p,)``, ``lags[i - 1] = y_{t-i}`` (zeros before the data).
        count: steps seen so far, capped at ``p`` (scoring starts when it is reached).

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.MarkovSwitchingAR(num_regimes=2, order=1)
        >>> params = ss.MSARParams(None, jnp.array([[0.9, 0.1], [0.2, 0.8]]),
        ...                        jnp.array([-1.0, 1.0]), jnp.array([0.5]), jnp.array(0.3))
        >>> y = jnp.array([0.1, -0.9, -1.2, 0.8, 1.1, 1.3])
        >>> carry = model.initial_carry(params)
        >>> carry.probs.shape, carry.lags.shape               # expanded states (s_t, s_{t-1})
        ((4,), (1,))
    """

    probs: jax.Array
    started: jax.Array
    lags: jax.Array
    count: jax.Array


class RegimeFilterResult(NamedTuple):
    """Output of `MarkovSwitchingAR.filter_states` (leading batch shape when batched).

    Attributes:
        marginal_log_lik: ``log p(y_{p:T-1} | y_{0:p-1})``.
        predicted_probs: ``(T, K)`` ``p(s_t | y_{<t})``.
        filtered_probs: ``(T, K)`` ``p(s_t | y_{<=t})``; for ``t < p`` (conditioned
            steps) the prior marginal ``p(s_t)``.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.MarkovSwitchingAR(num_regimes=2, order=1)
        >>> params = ss.MSARParams(None, jnp.array([[0.9, 0.1], [0.2, 0.8]]),
        ...                        jnp.array([-1.0, 1.0]), jnp.array([0.5]), jnp.array(0.3))
        >>> y = jnp.array([0.1, -0.9, -1.2, 0.8, 1.1, 1.3])
        >>> res = model.filter_states(params, y)
        >>> res.filtered_probs.shape, res.predicted_probs.shape
        ((6, 2), (6, 2))
        >>> bool(jnp.allclose(res.filtered_probs.sum(-1), 1.0, atol=1e-5))
        True
    """

    marginal_log_lik: Any
    predicted_probs: Any
    filtered_probs: Any


class RegimePosterior(NamedTuple):
    """Output of `MarkovSwitchingAR.smoother` (leading batch shape when batched).

    Attributes:
        marginal_log_lik: ``log p(y_{p:T-1} | y_{0:p-1})``.
        filtered_probs: ``(T, K)`` ``p(s_t | y_{<=t})``.
        smoothed_probs: ``(T, K)`` ``p(s_t | y_{0:T-1})`` (for every ``t``, including the
            conditioned first ``p`` steps).
        expanded: the `statseq.inference.hmm.HMMPosterior` of the expanded chain.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.MarkovSwitchingAR(num_regimes=2, order=1)
        >>> params = ss.MSARParams(None, jnp.array([[0.9, 0.1], [0.2, 0.8]]),
        ...                        jnp.array([-1.0, 1.0]), jnp.array([0.5]), jnp.array(0.3))
        >>> y = jnp.array([0.1, -0.9, -1.2, 0.8, 1.1, 1.3])
        >>> post = model.smoother(params, y)
        >>> post.smoothed_probs.shape
        (6, 2)
        >>> [int(k) for k in post.smoothed_probs.argmax(-1)]
        [0, 0, 0, 1, 1, 1]
    """

    marginal_log_lik: Any
    filtered_probs: Any
    smoothed_probs: Any
    expanded: Any


@register_model
@dataclasses.dataclass(frozen=True)
class MarkovSwitchingAR(SequenceModel):
    """Markov-switching autoregression MS(K)-AR(p) of a scalar series (Hamilton 1989).

        s_t | s_{t-1} ~ Categorical(P[s_{t-1}]),
        y_t - mu_{s_t} = sum_{i=1}^p phi_i (y_{t-i} - mu_{s_{t-i}}) + sigma_{s_t} eps_t
            (form="mean"),
        y_t = c_{s_t} + sum_{i=1}^p phi_i y_{t-i} + sigma_{s_t} eps_t    (form="intercept"),

    ``eps_t ~ N(0, 1)``; ``phi`` switches with ``s_t`` when ``switching_ar`` and
    ``sigma^2`` when ``switching_variance``. ``y`` has shape ``batch_shape + (T,)``.

    The likelihood conditions on the first ``p`` observations
    (``num_conditioned_steps = p``), as statsmodels' ``MarkovAutoregression`` and
    `statseq.AR` with ``initial="conditional"``; the regime chain starts at ``t = 0`` with
    ``s_0 ~ initial_probs`` (``"free"``) or the ergodic law of ``P`` (``"stationary"``, the
    statsmodels default). With a switching mean in Hamilton's form the density of ``y_t``
    depends on ``(s_t, ..., s_{t-p})``; the model is an HMM on that expanded state
    (``num_expanded_states = K^(p+1)``), otherwise on ``s_t`` (``K`` states). Filtering and
    smoothing use `statseq.inference.hmm` on the expanded chain; `filter_states` and
    `smoother` return ``K``-regime probabilities. `statseq.fit_em` runs an ECM algorithm
    (closed-form weighted least-squares blocks on the expanded posterior); it takes
    per-entry ``trainable`` masks (each block solved over its free entries) and ``ties``
    (accepted gradient steps on `expected_log_joint`).
    `statseq.log_prob`, `statseq.fit_lbfgs`,
    `statseq.fit_sgd` and `statseq.forecast` work through the generic filter
    (``predict``/``update``); `forecast_means` gives exact h-step means when ``phi`` does
    not switch, and `predict_observations` / `h_step_marginals` the exact h-step marginal
    predictives (Gaussian mixtures over regime paths; `statseq.log_predictive_density`
    with ``marginal=True`` and `statseq.backtest` use them, since a masked step is not
    marginalization here: ``marginalizes_masked_steps = False``).

    Missing values: steps may be masked (their regime still moves). When a masked step is
    a lag of a later observed step, its value is, given the regime path since the gap
    began, Gaussian: `statseq.log_prob`, `statseq.filter`, `statseq.forecast`,
    `statseq.fit_lbfgs` and `statseq.fit_sgd` then run an exact Gaussian-sum filter
    (`statseq.inference.gaussian_sum`) on the (expanded) chain, whose components merge
    exactly once ``p`` observed steps follow the gap: a gap of ``g`` steps needs at most
    ``M K^(g + p - 1)`` components (``M = num_expanded_states``). The capacity is sized
    eagerly from the mask (`for_mask`); data needing more than ``max_gap_components``
    are refused, as are masked steps among the first ``p`` (conditioned) steps that an
    observed step depends on. `statseq.fit_em`, `filter_states`, `smoother` and
    `most_likely_regimes` need observed lags (use `statseq.fit_lbfgs` with such gaps).

    Args:
        num_regimes: ``K >= 1``.
        order: ``p >= 1``.
        form: ``"mean"`` (Hamilton's switching mean) or ``"intercept"``.
        switching_mean: whether ``mu`` (or ``c``) depends on the regime.
        switching_ar: whether ``phi`` depends on the regime.
        switching_variance: whether ``sigma^2`` depends on the regime.
        initial: ``"stationary"`` (default) or ``"free"``.
        max_gap_components: the most Gaussian components the exact filter over masked
            lags may use (data needing more are refused; raise it for longer gaps).
        gap_capacity: the filter's static number of components (0: the finite-state
            filter, no masked lags). Set by `for_mask`; not meant to be set by hand.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> from statseq.models.switching import MarkovSwitchingAR, MSARParams
        >>> model = MarkovSwitchingAR(num_regimes=2, order=1)
        >>> params = MSARParams(None, jnp.array([[0.9, 0.1], [0.2, 0.8]]),
        ...                     jnp.array([-1.0, 1.0]), jnp.array([0.5]), jnp.array(0.3))
        >>> y = jnp.array([0.1, -0.9, -1.2, 0.8, 1.1, 1.3])
        >>> post = model.smoother(params, y)
        >>> post.smoothed_probs.shape, model.num_expanded_states
        ((6, 2), 4)
        >>> float(ss.log_prob(model, params, y)) < 0
        True
    """

    num_regimes: int = 2
    order: int = 1
    form: str = "mean"
    switching_mean: bool = True
    switching_ar: bool = False
    switching_variance: bool = False
    initial: str = "stationary"
    max_gap_components: int = 1024
    gap_capacity: int = dataclasses.field(default=0, repr=False)

    #: a masked step is not simply skipped: later steps read it as a lag
    marginalizes_masked_steps: ClassVar[bool] = False

    #: a masked step is not a marginalization (later steps read it as a lag): h-step
    #: marginals come from `h_step_marginals`
    marginalizes_masked_steps: ClassVar[bool] = False

    def __post_init__(self):
        check_positive_int(self.num_regimes, "num_regimes")
        check_positive_int(self.order, "order")
        check_positive_int(self.max_gap_components, "max_gap_components")
        check_positive_int(self.gap_capacity, "gap_capacity", minimum=-1)
        if self.form not in ("mean", "intercept"):
            raise ValueError(f"form must be 'mean' or 'intercept', got {self.form!r}")
        if self.initial not in ("free", "stationary"):
            raise ValueError(f"initial must be 'free' or 'stationary', got {self.initial!r}")
        for name in ("switching_mean", "switching_ar", "switching_variance"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))

    # ---- static description ----------------------------------------------------------
    @property
    def event_shape(self):
        return ()

    @property
    def num_conditioned_steps(self) -> int:
        return self.order

    @property
    def expanded(self) -> bool:
        """Whether the HMM runs on ``(s_t, ..., s_{t-p})`` (switching mean in mean form)."""
        return self.form == "mean" and self.switching_mean and self.num_regimes > 1

    @property
    def num_expanded_states(self) -> int:
        """``M``: ``K^(p+1)`` for the expanded chain, else ``K``."""
        return self.num_regimes ** (self.order + 1) if self.expanded else self.num_regimes

    def expanded_regimes(self) -> np.ndarray:
        """``(M, p+1)`` (or ``(K, 1)``) ints: column ``i`` of row ``j`` is ``s_{t-i}``."""
        k = self.num_regimes
        if not self.expanded:
            return np.arange(k)[:, None]
        return np.array(list(itertools.product(range(k), repeat=self.order + 1)))

    # ---- parameters -------------------------------------------------------------------
    def param_shapes(self) -> MSARParams:
        k, p = self.num_regimes, self.order
        return MSARParams(
            (k,) if self.initial == "free" else None,
            (k, k),
            (k,) if self.switching_mean else (),
            (k, p) if self.switching_ar else (p,),
            (k,) if self.switching_variance else (),
        )

    def param_constraints(self) -> MSARParams:
        return MSARParams(constraints.simplex if self.initial == "free" else None,
                          constraints.simplex, constraints.real, constraints.real,
                          constraints.positive)

    def initial_probs(self, params):
        """``p(s_0)``: the free initial law or the ergodic law of ``P``."""
        if self.initial == "stationary":
            return stationary_distribution(params.transitions)
        return params.initial_probs

    def expanded_chain(self, params):
        """``(pi_M, A_M, a, phi, var)`` of the expanded HMM: ``pi_M (M,)`` the law of
        ``x_0`` (``s_0 ~ p(s_0)``, pre-sample regimes uniform: they never reach a scored
        step), ``A_M (M, M)``, and per expanded state the regression
        ``y_t | x_t = j ~ N(a_j + phi_j . (y_{t-1}, ..., y_{t-p}), var_j)``."""
        k, p = self.num_regimes, self.order
        cols = self.expanded_regimes()
        m = cols.shape[0]
        dtype = params.transitions.dtype
        trans = params.transitions
        now = cols[:, 0]
        compat = np.all(cols[None, :, 1:] == cols[:, None, :-1], axis=-1)  # (from, to)
        a_m = trans[now[:, None], now[None, :]] * jnp.asarray(compat, dtype)
        pre = 1.0 / k ** (cols.shape[1] - 1)
        pi_m = self.initial_probs(params)[now] * pre
        mu = jnp.broadcast_to(params.means, (k,))
        phi = params.ar_coeffs[now] if self.switching_ar else jnp.broadcast_to(
            params.ar_coeffs, (m, p))
        var = jnp.broadcast_to(params.variances, (k,))[now]
        if self.expanded:
            mvals = mu[cols]  # (M, p+1)
            a = mvals[:, 0] - jnp.sum(phi * mvals[:, 1:], axis=-1)
        elif self.form == "mean":
            a = mu[now] * (1.0 - jnp.sum(phi, axis=-1))
        else:
            a = mu[now]
        return pi_m, a_m, a, phi, var

    def regime_map(self, dtype=None) -> jax.Array:
        """``(M, K)`` 0/1 matrix mapping expanded states to the current regime ``s_t``."""
        cols = self.expanded_regimes()
        return jnp.asarray(np.eye(self.num_regimes)[cols[:, 0]], dtype or float_dtype())

    def default_params(self) -> MSARParams:
        """Sticky transitions (0.9), means spread over ``[-1, 1]``, ``phi = 0``, unit
        variances."""
        k, p, dtype = self.num_regimes, self.order, float_dtype()
        off = 0.1 / max(k - 1, 1)
        trans = (jnp.full((k, k), off, dtype) + (0.9 - off) * jnp.eye(k, dtype=dtype)
                 if k > 1 else jnp.ones((1, 1), dtype))
        spread = jnp.linspace(-1.0, 1.0, k, dtype=dtype) if k > 1 else jnp.zeros(1, dtype)
        return MSARParams(
            jnp.full((k,), 1.0 / k, dtype) if self.initial == "free" else None,
            trans,
            spread if self.switching_mean else jnp.zeros((), dtype),
            jnp.zeros((k, p) if self.switching_ar else (p,), dtype),
            jnp.ones((k,) if self.switching_variance else (), dtype),
        )

    #: transition-matrix families `statseq.fit_restarts` cycles through (as for HMMs)
    transition_starts = ("uniform", "anti_persistent", "dirichlet", "sticky")

    def initialize(self, y, *, key=None, inputs=None, mask=None, method="data",
                   transitions=None) -> MSARParams:
        """A start for `statseq.fit_em` / `statseq.fit_lbfgs` / `statseq.fit_restarts`.

        ``method="data"`` (deterministic, ``key`` unused): the least-squares AR(p) fit
        (``phi``, ``sigma^2``), regime means (intercepts) at the mean ``+- 0.5`` standard
        deviations of ``y`` in ascending order, sticky transitions (0.9).
        ``method="random"`` (needs ``key``): the same AR fit, regime means drawn uniformly
        in ``mean +- 1`` standard deviation (sorted), variances times ``10^U(-1/2, 1/2)``,
        and a transition matrix from the family ``transitions`` (``"sticky"``,
        ``"uniform"``, ``"dirichlet"`` or ``"anti_persistent"``, as for
        `statseq.models.hmm.base.random_transition_matrix`; default ``"dirichlet"``).

        Examples:
            >>> import jax, statseq as ss
            >>> y = ss.datasets.load_us_gnp_growth().to_numpy()
            >>> model = ss.MarkovSwitchingAR(num_regimes=2, order=4)
            >>> p = model.initialize(y, key=jax.random.key(0), method="random",
            ...                      transitions="anti_persistent")
            >>> bool(p.transitions[0, 0] < 0.5 or p.transitions[1, 1] < 0.5)
            True
        """
        if key is not None:
            check_key(key)
        if method not in ("data", "random"):
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        if method == "random" and key is None:
            raise ValueError("initialize(method='random') needs a key")
        # (runs validate_data; masked lags are fine here: only rows with observed lags count)
        data = prepare_data(self.for_mask(None), y, mask, inputs)
        p, k, dtype = self.order, self.num_regimes, float_dtype()
        rows, targets = [], []
        for y_s, m_s in zip(np.asarray(data.y, float), np.asarray(data.mask, bool),
                            strict=True):
            for t in range(p, y_s.shape[0]):
                if m_s[t] and m_s[t - p: t].all():
                    rows.append(y_s[t - p: t][::-1])
                    targets.append(y_s[t])
        if len(targets) < p + 2:
            raise ValueError(f"MarkovSwitchingAR.initialize needs at least {p + 2} observed "
                             f"steps with observed lags, got {len(targets)}")
        x, t = np.asarray(rows), np.asarray(targets)
        design = np.concatenate([np.ones((len(t), 1)), x], axis=1)
        coef = np.linalg.lstsq(design, t, rcond=None)[0]
        resid = t - design @ coef
        phi, sd = coef[1:], float(np.std(t))
        center = float(np.mean(t))
        offsets = (np.linspace(-0.5, 0.5, k) if k > 1 else np.zeros(1)) * sd
        mean_vals = center + offsets
        if self.form == "intercept":
            mean_vals = mean_vals * (1.0 - phi.sum())
        base = self.default_params()
        var = max(float(np.mean(resid**2)), 1e-8)
        if method == "random":
            from statseq.models.hmm.base import random_transition_matrix
            from statseq.models.hmm.gaussian import seed_from_key

            rng = np.random.default_rng(seed_from_key(key))
            mean_vals = np.sort(center + sd * rng.uniform(-1.0, 1.0, k))
            if self.form == "intercept":
                mean_vals = mean_vals * (1.0 - phi.sum())
            var = var * 10.0 ** rng.uniform(-0.5, 0.5)
            base = base._replace(transitions=jnp.asarray(
                random_transition_matrix(k, transitions or "dirichlet", rng), dtype))
        return base._replace(
            means=jnp.asarray(mean_vals if self.switching_mean else mean_vals.mean(), dtype),
            ar_coeffs=jnp.asarray(np.broadcast_to(phi, (k, p)) if self.switching_ar else phi,
                                  dtype),
            variances=jnp.broadcast_to(jnp.asarray(var, dtype), base.variances.shape),
        )

    # ---- the filter (the SequenceModel protocol) ------------------------------------------
    def initial_carry(self, params) -> MSARCarry:
        pi_m = self.expanded_chain(params)[0]
        if self.gap_capacity:
            return gsum.initial_gaussian_sum(pi_m, self._capacity(), self.order)
        return MSARCarry(pi_m, jnp.zeros((), bool), jnp.zeros((self.order,), pi_m.dtype),
                         jnp.zeros((), jnp.int32))

    def _predicted(self, a_m, carry):
        return jnp.where(carry.started, carry.probs @ a_m, carry.probs)

    def predict(self, params, carry, inputs_t):
        """The mixture ``sum_j p(x_t = j | y_{<t}) N(a_j + phi_j . lags, var_j)`` (during
        the first ``p`` steps the lags are zeros: only meaningful for sampling)."""
        _, a_m, a, phi, var = self.expanded_chain(params)
        if self.gap_capacity:
            lw, means, covs, _ = gsum.predictive_components(carry, a_m, phi[:, None, :],
                                                            a[:, None], var[:, None, None])
            return dist.MixtureSameFamily(
                dist.Categorical(logits=lw.reshape(-1)),
                dist.Normal(means.reshape(-1), jnp.sqrt(covs.reshape(-1))))
        probs = self._predicted(a_m, carry)
        comp = dist.Normal(a + phi @ carry.lags, jnp.sqrt(var))
        return dist.MixtureSameFamily(dist.Categorical(probs=probs), comp)

    def step(self, params, carry, y_t, mask_t, inputs_t):
        _, a_m, a, phi, var = self.expanded_chain(params)
        if self.gap_capacity:
            y_t = jnp.reshape(jnp.asarray(y_t, a.dtype), (1,))
            mask_t = jnp.reshape(jnp.asarray(mask_t, bool), (1,))
            return gsum.gaussian_sum_step(carry, a_m, phi[:, None, :], a[:, None],
                                          var[:, None, None], y_t, mask_t, self.order)
        predicted = self._predicted(a_m, carry)
        mean = a + phi @ carry.lags
        ll = -0.5 * (_LOG_2PI + jnp.log(var) + (y_t - mean) ** 2 / var)
        observed = jnp.asarray(mask_t, bool)
        # the score of y_t under `predict` (the engine drops it during the first p steps,
        # whose lags are pre-sample zeros); the update conditions only on scored steps
        shift = jax.lax.stop_gradient(jnp.max(ll))
        log_prob = jnp.where(observed,
                             jnp.log(jnp.sum(predicted * jnp.exp(ll - shift))) + shift, 0.0)
        active = (carry.count >= self.order) & observed
        ll = jnp.where(active, ll, 0.0)
        joint = predicted * jnp.exp(ll - jax.lax.stop_gradient(jnp.max(ll)))
        norm = jnp.sum(joint)
        y_in = jnp.where(observed, y_t, 0.0).astype(carry.lags.dtype)
        lags = jnp.concatenate([y_in[None], carry.lags[:-1]])
        count = jnp.minimum(carry.count + 1, self.order).astype(jnp.int32)
        return log_prob, MSARCarry(joint / norm, jnp.ones((), bool), lags, count)

    def update(self, params, carry, y_t, mask_t, inputs_t) -> MSARCarry:
        return self.step(params, carry, y_t, mask_t, inputs_t)[1]

    def masked_data_filter(self, params, num_timesteps: int):
        """``(y, mask, inputs) -> (log_probs (T,), final carry)`` of one sequence by
        `statseq.inference.hmm.hmm_filter` on the expanded chain and its emission table
        (`log_likelihoods`, made in one vectorized pass), which the engine runs instead of
        the `step` scan where no per-step carries are wanted: on CPU from
        `TABLE_FILTER_MIN_STEPS` steps, for the finite-state filter (no masked lags).
        Same per-step log-densities (the first ``p`` and masked steps exactly 0) and final
        carry as the `step` scan to rounding, and its gradient (tested); ``None`` elsewhere.
        """
        if self.gap_capacity or backend_kind() != "cpu" or (
                num_timesteps < TABLE_FILTER_MIN_STEPS):
            return None
        p = self.order

        def run(y, mask, inputs):
            del inputs
            pi_m, a_m, *_ = self.expanded_chain(params)
            log_probs, last = table_filter(pi_m, a_m, self.log_likelihoods(params, y, mask),
                                           mask, p)
            lags, count = last_lags(y, jnp.asarray(mask, bool), p, pi_m.dtype)
            return log_probs, MSARCarry(last, jnp.ones((), bool), lags, count)

        return run

    # ---- masked lags: the exact Gaussian-sum filter ----------------------------------------
    def _capacity(self):
        if self.gap_capacity < 0:
            raise ValueError("gap_capacity=-1 only validates data; size the model with "
                             "for_mask(mask)")
        return max(self.gap_capacity, self.num_expanded_states)

    def gap_size(self, mask, *, trailing=False) -> gsum.GapSize:
        """Components the exact filter needs on ``mask`` (``(N, T)`` bools); see
        `statseq.inference.gaussian_sum.required_components`."""
        mask = np.asarray(mask, bool)
        mask = mask.reshape((-1, mask.shape[-1], 1))
        return gsum.required_components(mask, self.order, self.num_expanded_states,
                                        self.num_regimes, trailing=trailing,
                                        limit=self.max_gap_components)

    def for_mask(self, mask, *, trailing=False):
        """This model with its filter sized for the data's mask (``(N, T)`` bools).

        Without masked lags (or ``mask=None``: a model that only validates) it is the
        finite-state filter; otherwise ``gap_capacity`` is the number of components the
        longest gap needs. ``trailing=True`` also sizes for masked steps at the end (a
        forecast starts from that state). Called by `statseq.log_prob`, `statseq.filter`,
        `statseq.forecast`, `statseq.fit_lbfgs` and `statseq.fit_sgd`.
        """
        if mask is None:
            return dataclasses.replace(self, gap_capacity=-1)
        size = self.gap_size(mask, trailing=trailing)
        self._check_gap_size(size)
        need = size.components if size.gap else 0
        return self if need == self.gap_capacity else dataclasses.replace(
            self, gap_capacity=need)

    def _check_gap_size(self, size):
        p = self.order
        if size.conditioned is not None:
            n, step = size.conditioned
            raise ValueError(
                f"MarkovSwitchingAR: observed step {step} (sequence {n}) depends on a "
                f"masked value among the first order = {p} steps, which the likelihood "
                "conditions on (they have no law in the model): drop the leading steps so "
                "that the series starts with order observed values")
        if size.components > self.max_gap_components:
            raise ValueError(
                f"MarkovSwitchingAR: a gap of {size.gap} step(s) (sequence {size.sequence}) "
                "before observed steps needs more than max_gap_components = "
                f"{self.max_gap_components} Gaussian components (M K^(g + p - 1) = "
                f"{self.num_expanded_states} * {self.num_regimes}^({size.gap} + {p} - 1) for "
                "the exact filter over masked lags): raise max_gap_components, or split the "
                "series at the gap")

    def validate_data(self, y, mask):
        """Masked lags within ``max_gap_components`` are accepted when the filter is sized
        for them (`for_mask`, which the entry points that support them call); otherwise
        refused with the reason."""
        obs = np.broadcast_to(np.asarray(mask, bool), np.shape(y))
        size = self.gap_size(obs)
        self._check_gap_size(size)
        if size.gap and self.gap_capacity >= 0 and size.components > self.gap_capacity:
            raise ValueError(
                f"MarkovSwitchingAR: sequence {size.sequence} has a gap of {size.gap} "
                "masked step(s) that are lags of later observed steps; the exact "
                f"Gaussian-sum filter ({size.components} components) runs in "
                "statseq.log_prob, filter, forecast, fit_lbfgs and fit_sgd, but not here: "
                "fit_em and the regime posteriors need observed lags (use fit_lbfgs to fit "
                "such data)")

    # ---- posterior inference on the expanded chain ---------------------------------------
    def log_likelihoods(self, params, y, mask):
        """``(T, M)`` ``log p(y_t | x_t = j, y_{<t})`` of one sequence; zero rows for the
        first ``p`` steps and masked steps."""
        _, _, a, phi, var = self.expanded_chain(params)
        y = y.astype(a.dtype)
        p = self.order
        padded = jnp.concatenate([jnp.zeros((p,), y.dtype), y])
        lags = jnp.stack([padded[p - i: p - i + y.shape[0]] for i in range(1, p + 1)], -1)
        mean = a[None, :] + lags @ phi.T
        ll = -0.5 * (_LOG_2PI + jnp.log(var) + (y[:, None] - mean) ** 2 / var)
        scored = (jnp.arange(y.shape[0]) >= p) & jnp.asarray(mask, bool)
        return jnp.where(scored[:, None], ll, 0.0)

    def _prepare(self, params, y, mask):
        from statseq.core.params import validate_params
        from statseq.core.recurrence import checked_data

        validate_params(self, params)  # remembered for arrays passed again (memo)
        if self.gap_capacity:
            raise ValueError("the regime posteriors need observed lags; this model is sized "
                             "for masked lags (for_mask): use the model it came from")
        # (runs validate_data); remembered for arrays passed again
        return checked_data(self, params, y, mask, None, bucket=False, sized=False)[1]

    def _remembered(self, params, y, mask, kind):
        """`_prepare` and one compiled call; a repeat on the same arguments is one lookup
        and one dispatch (`statseq.core.recurrence.remembered`)."""
        from statseq.core.recurrence import remembered

        return remembered(("regimes", kind), self, params, y, mask, None,
                          lambda: _regime_runner(self, params, self._prepare(params, y, mask),
                                                 kind), bucket=False)

    def filter_states(self, params, y, *, mask=None) -> RegimeFilterResult:
        """Filtered and predicted regime probabilities ``p(s_t | y_{<=t})``,
        ``p(s_t | y_{<t})`` (``K`` regimes) and the conditional log-likelihood."""
        return self._remembered(params, y, mask, "filter")

    def smoother(self, params, y, *, mask=None) -> RegimePosterior:
        """Smoothed regime probabilities ``p(s_t | y_{0:T-1})`` (``K`` regimes), filtered
        ones, and the expanded-chain posterior."""
        return self._remembered(params, y, mask, "smoother")

    def most_likely_regimes(self, params, y, *, mask=None):
        """The Viterbi path of regimes ``argmax p(s_{0:T-1} | y)``: ``batch_shape + (T,)``
        ints (the expanded path's current regimes)."""
        return self._remembered(params, y, mask, "viterbi")

    # ---- EM (ECM) -------------------------------------------------------------------------
    def e_step(self, params, y, mask, inputs):
        """Weighted moments per expanded state and regime transition counts over a flat
        batch ``(N, T)`` (see `statseq.models.switching._ms_ar_em`)."""
        if self.gap_capacity:
            raise ValueError("fit_em has no exact E-step for masked lags (the lag window mixes "
                             "over regime paths): use fit_lbfgs")
        return _ms_ar_em.e_step(self, params, y, mask, inputs)

    def m_step(self, params, stats, priors, inputs, trainable=None):
        """ECM: closed-form transitions (Dirichlet MAP), then means / intercepts, ``phi``
        and variances, each the exact weighted least-squares maximum given the others
        (so `statseq.fit_em` never decreases the likelihood).

        ``trainable`` (a pytree like ``params`` of booleans or boolean arrays, as
        `statseq.fit_em` passes it) fixes entries: a transition row's free entries share
        the mass ``1 - sum(fixed)`` in proportion to their expected counts; the means,
        ``phi`` and variance blocks solve their weighted least-squares problems over the
        free entries only (``A_ff x_f = b_f - A_fx x_x``); fixed entries keep their value.
        """
        return _ms_ar_em.m_step(self, params, stats, priors, inputs, trainable)

    #: `fit_em` may pass boolean arrays (per-entry trainable masks) to `m_step`
    m_step_entry_masks: ClassVar[bool] = True

    def m_step_exact(self, trainable) -> bool:
        """Always ``True``: every block of `m_step` maximizes exactly over its free entries
        (ties still get accepted gradient steps on `expected_log_joint` in `fit_em`)."""
        del trainable
        return True

    def expected_log_joint(self, params, stats):
        """The expected complete-data log-likelihood under the posterior that produced
        ``stats`` (`e_step`), exact from its moments:

            Q = E[log p(s_{0:T-1}, y_{p:T-1} | y_{0:p-1})]
              = sum_k g_0(k) log pi_k + sum_ij n_ij log P[i, j]
                - sum_j [ w_j log(2 pi v_j) + RSS_j / v_j ] / 2,
            RSS_j = sum_t w_tj (y_t - m0_j - phi_j . (x_t - mlag_j))^2,

        with ``g_0`` the smoothed law of ``s_0``, ``n_ij`` the expected regime transition
        counts, ``w_tj = p(x_t = j | y)`` over the scored steps ``t >= p`` of expanded state
        ``j`` (``v_j``, ``phi_j``, ``m0_j``, ``mlag_j`` its variance, AR coefficients,
        current and lagged means; see `statseq.models.switching._ms_ar_em`), ``x_t`` the
        lags and ``pi`` the ergodic law of ``P`` for ``initial="stationary"``. By Fisher's
        identity its gradient at the E-step's parameters is that of the log-likelihood;
        `statseq.fit_em` takes accepted gradient steps on it for ``ties``.

        Examples:
            >>> import jax, jax.numpy as jnp, statseq as ss
            >>> model = ss.MarkovSwitchingAR(num_regimes=2, order=1)
            >>> params = ss.MSARParams(None, jnp.array([[0.9, 0.1], [0.2, 0.8]]),
            ...                        jnp.array([-1.0, 1.0]), jnp.array([0.5]),
            ...                        jnp.array(0.3))
            >>> y = jnp.array([[0.1, -0.9, -1.2, 0.8, 1.1, 1.3]])
            >>> @jax.jit  # one compiled program (as in fit_em), not one per operation
            ... def q_and_log_lik(params, y):
            ...     stats, log_lik = model.e_step(params, y, jnp.ones_like(y, bool), None)
            ...     return model.expected_log_joint(params, stats), log_lik
            >>> q, log_lik = q_and_log_lik(params, y)
            >>> bool(q < log_lik)  # Q = ll - entropy
            True
        """
        return _ms_ar_em.expected_log_joint(self, params, stats)

    def validate_em_priors(self, priors):
        """EM admits Dirichlet priors on ``initial_probs`` and ``transitions`` only."""
        if priors is None:
            return
        for name in ("initial_probs", "transitions"):
            prior = getattr(priors, name)
            if prior is not None and not isinstance(prior, dist.Dirichlet):
                raise ValueError(f"fit_em needs a Dirichlet prior on {name} (its closed-form "
                                 f"M-step), got {type(prior).__name__}")
        for name in ("means", "ar_coeffs", "variances"):
            if getattr(priors, name) is not None:
                raise ValueError(
                    f"fit_em for MarkovSwitchingAR has no conjugate prior for {name}: leave "
                    "it None, or use fit_lbfgs / fit_sgd for MAP estimates with that prior")

    def forecast_means(self, params, y, *, num_steps, mask=None):
        """Exact ``E[y_{T-1+h} | y_{0:T-1}]`` for ``h = 1..num_steps`` (``phi`` not
        switching): with ``x_{T-1}`` the filtered expanded state,

            form="mean":      E[y_{T-1+h}] = E[mu_{s_{T-1+h}}] + E[z_{T-1+h}],
                              z_t = y_t - mu_{s_t} following the AR(p) recursion from
                              z_{T-1-i} = y_{T-1-i} - mu_{s_{T-1-i}},
            form="intercept": E[y_{T-1+h}] = E[c_{s_{T-1+h}}] + sum_i phi_i E[y_{T-1+h-i}].

        Returns:
            ``batch_shape + (num_steps,)``.
        """
        num_steps = check_positive_int(num_steps, "num_steps")
        if self.switching_ar:
            raise NotImplementedError(
                "forecast_means needs non-switching AR coefficients (with switching phi the "
                "mean is a sum over regime paths); use statseq.forecast")
        data = self._prepare(params, y, mask)
        if data.num_timesteps < self.order:
            raise ValueError(f"forecast_means needs at least order = {self.order} steps")
        out = _forecast_means(self, params, data.y, data.mask, num_steps)
        return jnp.reshape(out, data.batch_shape + (num_steps,))


    # ---- exact h-step predictives ------------------------------------------------------
    def h_step_marginals(self, params: Any, carry: Any, inputs_future: ArrayLike, *,
                         max_components: int = MAX_COMPONENTS) -> FiniteMixture:
        """Exact marginal predictives ``p(y_{T+k} | y_{1:T})``, ``k = 1..h``, from a carry.

        Every expanded state ``x_t`` (``(s_t, ..., s_{t-p})`` with a switching mean in
        Hamilton's form, else ``s_t``) makes ``y_t`` a Gaussian regression
        ``a_x + phi_x . (y_{t-1}, ..., y_{t-p}) + sigma_x eps_t`` (`expanded_chain`), so along
        a regime path the future is Gaussian with the unobserved ``y_{T+1:T+k-1}`` as
        states of the companion form (``z = (y_t, ..., y_{t-p+1})``, ``z_T`` known):

            p(y_{T+k} | y_{1:T}) = sum_{paths} p(path | y_{1:T}) N(y_{T+k}; m_k[0], P_k[0, 0]),
            m_j = F_x m_{j-1} + a_x e_1,   P_j = F_x P_{j-1} F_x' + sigma_x^2 e_1 e_1',

        the path law being the predicted expanded state at ``T + 1`` then ``P`` (each
        path branches into the ``K`` regimes of the next step;
        `statseq.inference.regime_paths`). ``M K^(k-1)`` components at step ``k``
        (``M = num_expanded_states``: the paths of ``s`` over ``T-p+1..T+k``, or of
        ``s_{T+1:T+k}`` without the expanded state), each with a ``(p, p)`` covariance.

        Args:
            params: the model's parameters.
            carry: the filter state after ``y_{1:T}`` (an `MSARCarry`).
            inputs_future: ``(h, 0)`` (the model takes no inputs); ``h`` is its length.
            max_components: refuse (``ValueError``) when ``M K^(h-1)`` exceeds it.

        Returns:
            A `statseq.core.distributions.FiniteMixture` of ``Normal`` components with
                batch shape ``(h,)``, padded with zero weight to ``M K^(h-1)`` components:
                ``log_prob``, ``cdf``, ``icdf``, ``mean`` and ``variance`` are exact.

        Examples:
            >>> import jax.numpy as jnp, statseq as ss
            >>> model = ss.MarkovSwitchingAR(num_regimes=2, order=1)
            >>> params = ss.MSARParams(None, jnp.array([[0.9, 0.1], [0.2, 0.8]]),
            ...                        jnp.array([-1.0, 1.0]), jnp.array([0.5]),
            ...                        jnp.array(0.3))
            >>> y = jnp.array([0.1, -0.9, -1.2, 0.8, 1.1, 1.3])
            >>> carry = ss.filter(model, params, y).final_carry
            >>> d = model.h_step_marginals(params, carry, jnp.zeros((3, 0)))
            >>> d.batch_shape, d.mixing_distribution.probs.shape    # 4 x 2^2 paths
            ((3,), (3, 16))
        """
        w, m, c = self._h_step_arrays(params, carry, inputs_future, max_components)
        return FiniteMixture(dist.Categorical(probs=w), dist.Normal(m[..., 0],
                                                                      jnp.sqrt(c[..., 0, 0])))

    def _h_step_arrays(self, params, carry, inputs_future, max_components):
        _, a_m, a, phi, var = self.expanded_chain(params)
        k = self.num_regimes
        horizon = int(np.shape(inputs_future)[0])
        cols = self.expanded_regimes()
        now = cols[:, 0]
        if self.expanded:  # (a_0, ..., a_p) --b--> (b, a_0, ..., a_{p-1})
            index = {tuple(r): i for i, r in enumerate(cols.tolist())}
            succ = np.array([[index[(b,) + tuple(r[:-1])] for b in range(k)]
                             for r in cols.tolist()])
        else:
            succ = np.tile(np.arange(k), (cols.shape[0], 1))
        branch = jnp.broadcast_to(params.transitions[now], (horizon - 1, cols.shape[0], k))
        f, c, q = companion(phi[:, None, :], a[:, None], var[:, None, None])
        return regime_path_marginals(self._predicted(a_m, carry), branch, succ, f, c, q,
                                     carry.lags.astype(a.dtype), obs_dim=1,
                                     max_components=max_components)

    def predict_observations(self, params: Any, y: ArrayLike, *, num_steps: int,
                             mask: ArrayLike | None = None, inputs: ArrayLike | None = None,
                             future_inputs: ArrayLike | None = None,
                             max_components: int = MAX_COMPONENTS) -> FiniteMixture:
        """Exact marginal predictive of each future ``y_{T+h}``: a Gaussian mixture over
        regime paths (`h_step_marginals` from the filter's final carry).

        Args:
            params: the model's parameters.
            y: ``batch_shape + (T,)`` histories whose last ``p`` values are observed.
            num_steps: the horizon ``h``.
            mask: optional observation mask.
            inputs: must be None (the model takes no inputs).
            future_inputs: must be None.
            max_components: refuse when ``M K^(h-1)`` exceeds it.

        Returns:
            A `statseq.core.distributions.FiniteMixture` with batch shape
                ``batch_shape + (num_steps,)``.

        Examples:
            >>> import jax.numpy as jnp, statseq as ss
            >>> model = ss.MarkovSwitchingAR(num_regimes=2, order=1)
            >>> params = ss.MSARParams(None, jnp.array([[0.9, 0.1], [0.2, 0.8]]),
            ...                        jnp.array([-1.0, 1.0]), jnp.array([0.5]),
            ...                        jnp.array(0.3))
            >>> y = jnp.array([0.1, -0.9, -1.2, 0.8, 1.1, 1.3])
            >>> d = model.predict_observations(params, y, num_steps=3)
            >>> d.batch_shape, round(float(d.icdf(0.5)[0]), 3)      # the median of y_{T+1}
            ((3,), 0.975)
            >>> bool(jnp.allclose(d.mean, model.forecast_means(params, y, num_steps=3)))
            True
        """
        num_steps = check_positive_int(num_steps, "num_steps")
        if inputs is not None or future_inputs is not None:
            raise ValueError("MarkovSwitchingAR takes no inputs: leave inputs and "
                             "future_inputs None")
        data = self._prepare(params, y, mask)
        if data.num_timesteps < self.order or not np.asarray(data.mask)[
                :, -self.order:].all():
            raise ValueError(
                f"predict_observations needs the last order = {self.order} values of y "
                "observed (they are the lag window the forecast starts from)")
        final = filter_sequences(self, params, y, mask=mask).final_carry
        flat = jax.tree.map(lambda a: jnp.reshape(a, (-1,) + a.shape[len(data.batch_shape):]),
                            final)
        u = np.zeros((num_steps, 0))
        w, m, c = jax.vmap(lambda cr: self._h_step_arrays(params, cr, u, max_components))(flat)
        shape = data.batch_shape + (num_steps,)
        return FiniteMixture(dist.Categorical(probs=w.reshape(shape + w.shape[-1:])),
                             dist.Normal(m[..., 0].reshape(shape + w.shape[-1:]),
                                         jnp.sqrt(c[..., 0, 0]).reshape(shape + w.shape[-1:])))


def _regime_runner(model, params, data, kind):
    """`_regime_posterior` with the batch shape restored, as one compiled call: a callable
    of no arguments (`statseq.core.recurrence.reshaped_runner`)."""
    from statseq.core.recurrence import reshaped_runner

    # complete data: the all-True mask is built inside the program (known to the compiler)
    mask = None if data.complete else data.mask
    return reshaped_runner(_regime_posterior, data.batch_shape,
                           dict(params=params, y=data.y, mask=mask), data.complete,
                           model=model, kind=kind)


@partial(jax.jit, static_argnames=("model", "kind"))
def _regime_posterior(model, params, y, mask, *, kind):
    pi_m, a_m, *_ = model.expanded_chain(params)
    to_k = model.regime_map(pi_m.dtype)

    def one(y_s, m_s):
        ll = model.log_likelihoods(params, y_s, m_s)
        if kind == "viterbi":
            path = hmm_seq.hmm_viterbi(pi_m, a_m, ll)
            return jnp.asarray(model.expanded_regimes()[:, 0])[path]
        if kind == "filter":
            f = hmm_seq.hmm_filter(pi_m, a_m, ll)
            return RegimeFilterResult(f.marginal_log_lik, f.predicted_probs @ to_k,
                                      f.filtered_probs @ to_k)
        post = hmm_seq.hmm_smoother(pi_m, a_m, ll)
        return RegimePosterior(post.marginal_log_lik, post.filtered_probs @ to_k,
                               post.smoothed_probs @ to_k, post)

    return vmap_or_one(one)(y, mask)


@partial(jax.jit, static_argnames=("model", "num_steps"))
def _forecast_means(model, params, y, mask, num_steps):
    pi_m, a_m, *_ = model.expanded_chain(params)
    k, p = model.num_regimes, model.order
    cols = jnp.asarray(model.expanded_regimes())
    to_k = model.regime_map(pi_m.dtype)
    mu = jnp.broadcast_to(params.means, (k,))
    phi = params.ar_coeffs

    def one(y_s, m_s):
        ll = model.log_likelihoods(params, y_s, m_s)
        last = hmm_seq.hmm_filter(pi_m, a_m, ll).filtered_probs[-1]  # (M,)
        probs = jax.lax.scan(lambda c, _: (c @ a_m, c @ a_m), last, None, length=num_steps)[1]
        mean_future = (probs @ to_k) @ mu  # (h,) E[mu_{s_{T-1+h}}]
        recent = y_s[::-1][:p].astype(pi_m.dtype)  # y_{T-1}, ..., y_{T-p}
        if model.expanded or model.form == "mean":
            # window per expanded state: z_{T-1-i} = y_{T-1-i} - mu_{s_{T-1-i}}
            if model.expanded:
                window = recent[None, :] - mu[cols[:, :p]]  # (M, p)
            else:  # one mean (not switching, or K = 1)
                window = jnp.broadcast_to(recent - mu[0], (cols.shape[0], p))

            def ar_step(w, _):
                z = w @ phi
                return jnp.concatenate([z[:, None], w[:, :-1]], axis=1), z

            z = jax.lax.scan(ar_step, window, None, length=num_steps)[1]  # (h, M)
            return mean_future + z @ last

        def int_step(w, c):
            v = c + w @ phi
            return jnp.concatenate([v[None], w[:-1]]), v

        return jax.lax.scan(int_step, recent, mean_future)[1]

    return vmap_or_one(one)(y, mask)
