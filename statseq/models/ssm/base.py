"""Linear Gaussian state space models as filters: the carry is the Kalman belief.

    x_0 ~ N(m, P) (plus diffuse directions),
    x_{t+1} = F x_t + B u_{t+1} + b + w_t,   w_t ~ N(0, Q),
    y_t     = H x_t + D u_t + d + v_t,       v_t ~ N(0, R).

The carry after step ``t`` is the filtered Gaussian belief about ``x_t``; the one-step
predictive is ``N(H a_t + D u_t + d, H P_t H^T + R)`` with ``a_t, P_t`` the predicted moments,
so summing predictive log-densities is the prediction error decomposition of the
likelihood. Families (the general `LinearGaussianSSM`, its time-varying variant, the
structural time series models) only say how their parameters map to the matrices
(`GaussianSSMBase.to_arrays`); filtering, smoothing, sampling, forecasting and gradient
fitting come from here and from `statseq.inference.kalman`.
"""

from __future__ import annotations

import abc
from functools import partial
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import ndtri

from statseq.core.buckets import cut_steps
from statseq.core.model import SequenceModel
from statseq.core.params import validate_params
from statseq.core.recurrence import (
    checked_data,
    device_args,
    remembered,
    reshaped_runner,
    vmap_or_one,
)
from statseq.core.validation import (
    check_key,
    check_positive_int,
    float_dtype,
    pandas_values,
    prepare_data,
)
from statseq.forecast import _forecast_frame, future_index
from statseq.inference import kalman, kalman_steady
from statseq.inference._backend import use_parallel
from statseq.inference.gaussian import symmetrize


class GaussianForecast(NamedTuple):
    """Exact (analytic) h-step predictive moments of a linear Gaussian model.

    Attributes:
        mean: ``batch_shape + (num_steps,) + event_shape`` predictive means of ``y_{T+h}``.
        cov: ``batch_shape + (num_steps, D, D)`` predictive covariances (``D = 1`` for a
            scalar series).
        state_mean: ``batch_shape + (num_steps, n)`` predictive means of ``x_{T+h}``.
        state_cov: ``batch_shape + (num_steps, n, n)``.
        history: the conditioning series (for plotting).
        index: time labels of the forecast steps (a pandas ``Index``) when the history
            was a time-indexed pandas object, else ``None``.
        history_index: the history's pandas index, or ``None``.
        columns: a DataFrame history's column labels (the emission dimensions), or ``None``.

    Examples:
        >>> import statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> fc = ss.LocalLevel().forecast_moments(params, y, num_steps=5)
        >>> fc.mean.shape, fc.cov.shape
        ((5,), (5, 1, 1))
        >>> lower, upper = fc.interval(0.9)                 # exact Gaussian intervals
        >>> bool((lower < fc.mean).all() and (fc.mean < upper).all())
        True
    """

    mean: Any
    cov: Any
    state_mean: Any
    state_cov: Any
    history: Any = None
    index: Any = None
    history_index: Any = None
    columns: Any = None

    @property
    def std(self):
        """Predictive standard deviations (the shape of ``mean``)."""
        sd = jnp.sqrt(jnp.diagonal(self.cov, axis1=-2, axis2=-1))
        return jnp.reshape(sd, jnp.shape(self.mean))

    def interval(self, level: float = 0.9):
        """Central prediction interval ``(lower, upper)`` with coverage ``level``."""
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        z = float(ndtri(0.5 + level / 2.0))
        return self.mean - z * self.std, self.mean + z * self.std

    def quantile(self, q):
        """Predictive quantile(s) ``q`` of each entry (leading axis for ``q``)."""
        q = jnp.asarray(q, float_dtype())
        z = ndtri(q).reshape(q.shape + (1,) * jnp.ndim(self.mean))
        return self.mean + z * self.std

    def to_frame(self, levels=(0.5, 0.9), index=None):
        """Mean, median and exact central intervals per future step, as a pandas DataFrame.

        The columns of `statseq.Forecast.to_frame`: ``mean``, ``median`` (equal to the
        mean, the predictive being Gaussian), ``lower_<p>``, ``upper_<p>`` (``p`` = 100
        level, from `interval`); for a vector series, column pairs ``(statistic, series)``.
        Indexed by future time when the history was a time-indexed pandas object, else by
        ``horizon`` ``1, ..., h``.

        Args:
            levels: central interval coverages.
            index: ``num_steps`` labels for the rows (default: the forecast's ``index``).

        Returns:
            A pandas DataFrame (one series only: select a batch element first).

        Examples:
            >>> import jax, statseq as ss
            >>> model = ss.LocalLevel()
            >>> y = ss.sample(model, model.default_params(), num_timesteps=30,
            ...               key=jax.random.key(0))
            >>> fc = model.forecast_moments(model.default_params(), y, num_steps=3)
            >>> list(fc.to_frame(levels=0.9).columns)
            ['mean', 'median', 'lower_90', 'upper_90']
        """
        mean = np.asarray(self.mean, float)
        event_ndim = mean.ndim - (np.ndim(self.cov) - 2)
        if mean.ndim != 1 + event_ndim:
            raise ValueError("to_frame describes one series; this forecast has batch axes "
                             f"(mean of shape {mean.shape})")
        return _forecast_frame({"mean": mean, "median": mean}, self.interval, levels,
                               index=self.index if index is None else index,
                               columns=self.columns, event_ndim=event_ndim)

    def plot(self, ax=None, *, levels=(0.5, 0.9), time=None, future_time=None, **kwargs):
        """Fan chart of a scalar series: history, predictive mean and central intervals."""
        from statseq.plotting import plot_forecast

        return plot_forecast(self, ax=ax, levels=levels, time=time, future_time=future_time,
                             **kwargs)


class GaussianSSMBase(SequenceModel):
    """Shared machinery of every linear Gaussian state space model.

    Subclasses set ``emission_dim`` (``None`` for a scalar series) and ``input_dim``, and
    implement `state_dim` and `to_arrays`.

    Examples:
        >>> import statseq as ss
        >>> from statseq.models.ssm import GaussianSSMBase
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> model = ss.LocalLevel()
        >>> isinstance(model, GaussianSSMBase), model.state_dim
        (True, 1)
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> post = model.smoother(params, y)                # shared Kalman smoother
        >>> model.to_arrays(params).dynamics_weights.shape    # the matrices a family supplies
        (1, 1)
    """

    supports_partial_mask: ClassVar[bool] = True
    emission_dim: int | None
    input_dim: int

    # ---- what a family provides ----------------------------------------------------------
    @property
    @abc.abstractmethod
    def state_dim(self) -> int:
        """Dimension ``n`` of the state ``x_t``."""

    @abc.abstractmethod
    def to_arrays(self, params) -> kalman.GaussianSSMArrays:
        """The model's matrices (see `statseq.inference.kalman.GaussianSSMArrays`)."""

    # ---- static description -------------------------------------------------------------
    @property
    def dim(self) -> int:
        """Number of observed series ``D`` (1 for a scalar series)."""
        return 1 if self.emission_dim is None else self.emission_dim

    @property
    def event_shape(self) -> tuple[int, ...]:
        return () if self.emission_dim is None else (self.emission_dim,)

    # ---- the filter protocol -------------------------------------------------------------
    def initial_carry(self, params) -> kalman.KalmanCarry:
        return kalman.initial_carry(self.to_arrays(params))

    def sampling_carry(self, params) -> kalman.KalmanCarry:
        """Start of `statseq.sample`: the diffuse states (which have no proper prior) are
        set to their initial mean, the proper part of the initial law is kept."""
        carry = self.initial_carry(params)
        return carry._replace(diffuse=jnp.zeros_like(carry.diffuse),
                              info=jnp.zeros_like(carry.info), score=jnp.zeros_like(carry.score),
                              collapsed=jnp.asarray(True))

    def step(self, params, carry, y_t, mask_t, inputs_t):
        arrays = self.to_arrays(params)
        y = jnp.reshape(y_t, (self.dim,)).astype(arrays.initial_cov.dtype)
        m = jnp.reshape(mask_t, (self.dim,))
        lp, new, _ = kalman.kalman_step(arrays, carry, y, m, inputs_t)
        return lp, new

    #: exact steps before a time-invariant filter may switch to its steady-state gain
    steady_state_head: ClassVar[int] = 128

    #: the shortest complete series whose log-likelihood takes the steady-state path. Below
    #: it the exact scan's program is about a third the size: for a local level's value and
    #: gradient at T = 400 it compiled in 3.6 s against 10 s (XLA:CPU, -O3) and ran in 11 ms
    #: against 5 ms, so a fit of a few hundred evaluations never won the compile back.
    steady_state_min_timesteps: ClassVar[int] = 1024

    @property
    def fast_path_min_timesteps(self) -> int:
        """The steady-state path pays off only beyond its exact head, and, for the compile
        time, beyond `steady_state_min_timesteps` steps."""
        return max(2 * self.steady_state_head, self.steady_state_min_timesteps)

    #: `complete_data_log_probs` takes ``num_valid`` (the real length of a padded time axis)
    complete_data_num_valid: ClassVar[bool] = True

    def complete_data_log_probs(self, params, y, inputs, num_valid=None):
        """Per-step log-densities of fully observed ``y`` (one sequence), using the
        steady-state gain once the covariance recursion has converged (time-invariant
        models; see `statseq.inference.kalman_steady.steady_state_log_probs`). Equal to the
        step-by-step filter up to the convergence tolerance; a test checks this. With
        ``num_valid`` (``y`` padded at the end to a bucket length) the final carry is the
        one after the last real step."""
        arrays = self.to_arrays(params)
        y = jnp.reshape(y, (y.shape[0], self.dim)).astype(arrays.initial_cov.dtype)
        if kalman.is_time_varying(arrays):
            carry, out = kalman.initial_carry(arrays), []

            def step(c, xs):
                t, xs = xs[0], xs[1:]
                lp, new, _ = kalman.kalman_step(arrays, c, *xs)
                if num_valid is not None:
                    new = jax.tree.map(lambda n, o: jnp.where(t < num_valid, n, o), new, c)
                return new, lp

            mask = jnp.ones(y.shape, bool)
            carry, out = jax.lax.scan(step, carry, (jnp.arange(y.shape[0]), y, mask, inputs))
            return out, carry
        return kalman_steady.steady_state_log_probs(arrays, y, inputs, head=self.steady_state_head,
                                                    num_valid=num_valid)

    def masked_data_filter(self, params, num_timesteps: int):
        """``(y, mask, inputs) -> (log_probs (T,), final carry)`` for one sequence by the
        scalar-observation scan (`statseq.inference.kalman.univariate_log_probs`), where it
        applies: one series, a proper initial law, at most ``kalman.SMALL_DIM`` states, on
        CPU; for several series on CPU from `kalman_sweeps.SWEEP_MIN_STEPS` steps (proper
        initial law, at most ``SMALL_DIM`` states and series) by sweeps over blocks
        (`statseq.inference.kalman_sweeps.log_probs_and_carry`); otherwise ``None`` (the
        per-step `step` scan runs). The same log-densities and
        final carry as the `step` scan to rounding (tested), with or without missing data;
        `statseq.core.recurrence` uses it wherever no per-step carries are wanted, vmapped
        over the batch (`statseq.core.recurrence.vmap_or_one`: a batch of one sequence
        runs unbatched)."""
        arrays = self.to_arrays(params)
        if self.dim > 1 and not self.num_conditioned_steps:
            # several series, long sequences on CPU: by sweeps over blocks
            from statseq.inference import kalman_sweeps

            if not kalman_sweeps.use_sweeps(arrays, num_timesteps):
                return None

            def swept(y, mask, inputs):
                y = jnp.reshape(y, (y.shape[0], self.dim)).astype(arrays.initial_cov.dtype)
                mask = jnp.reshape(mask, (mask.shape[0], -1)) & jnp.ones((1, self.dim), bool)
                return kalman_sweeps.log_probs_and_carry(arrays, y, mask, inputs)

            return swept
        if self.dim != 1 or self.num_conditioned_steps or not kalman._univariate_fast(arrays, 1):
            return None

        def run(y, mask, inputs):
            y = jnp.reshape(y, (-1, 1)).astype(arrays.initial_cov.dtype)
            return kalman.univariate_log_probs(arrays, y, jnp.reshape(mask, (-1, 1)), inputs)

        return run

    def update(self, params, carry, y_t, mask_t, inputs_t) -> kalman.KalmanCarry:
        return self.step(params, carry, y_t, mask_t, inputs_t)[1]

    def predict(self, params, carry, inputs_t):
        """``N(H a_t + D u_t + d, H P_t H^T + R)``; NaN while diffuse states are unidentified."""
        arrays = self.to_arrays(params)
        mean, cov, _ = kalman.predicted_moments(arrays, carry, inputs_t)
        arr_t = kalman.arrays_at(arrays, carry.t)
        h = arr_t.emission_weights
        y_mean = h @ mean + arr_t.emission_input_weights @ inputs_t + arr_t.emission_bias
        y_cov = symmetrize(h @ cov @ h.T + arr_t.emission_cov)
        # before the data identify the diffuse states the predictive is improper
        y_cov = jnp.where(carry.collapsed, y_cov, jnp.nan)
        if self.emission_dim is None:
            return dist.Normal(y_mean[0], jnp.sqrt(y_cov[0, 0]))
        return dist.MultivariateNormal(y_mean, y_cov)

    # ---- posterior inference --------------------------------------------------------------
    def filter_states(self, params, y, *, mask=None, inputs=None, parallel=None,
                      square_root=False) -> kalman.KalmanFilterResult:
        """Predicted and filtered moments of ``x_t`` and the per-step log-likelihood.

        Args:
            params: the model's parameters.
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            mask: optional observation mask (per step or per entry).
            inputs: covariates, when the model takes them.
            parallel: ``True`` for the associative-scan filter (``O(log T)`` depth, for
                accelerators), ``False`` for ``lax.scan``; ``None`` picks by backend.
            square_root: propagate Cholesky factors
                (`statseq.inference.kalman_sqrt`, or with ``parallel``
                `statseq.inference.kalman_sqrt_parallel`): more robust in float32, and
                the variances keep their relative accuracy when observations are far more
                precise than the dynamics noise (``Q / R`` up to ``1e16`` in float64).
                Needs a proper initial law (no diffuse states).

        Returns:
            `statseq.inference.kalman.KalmanFilterResult` (batch shape leading).
        """
        return self._posterior(params, y, mask, inputs, "filter",
                               _kind(parallel, square_root))

    def smoother(self, params, y, *, mask=None, inputs=None, parallel=None,
                 square_root=False) -> kalman.KalmanSmootherResult:
        """Smoothed moments of ``x_t`` given the whole series, and lag-one covariances.

        Args:
            params: the model's parameters.
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            mask: optional observation mask (per step or per entry).
            inputs: covariates, when the model takes them.
            parallel: ``True`` for associative scans (``O(log T)`` depth, for
                accelerators), ``False`` for ``lax.scan``; ``None`` picks by backend.
            square_root: the square-root Rauch-Tung-Striebel smoother on Cholesky
                factors (`statseq.inference.kalman_sqrt.sqrt_kalman_smoother`, or with
                ``parallel`` its associative-scan twin), accurate where the covariance
                form cancels (``Q / R`` up to ``1e16`` in float64); needs a proper initial
                law and nonsingular predicted covariances (a nonsingular ``Q``).

        Returns:
            `statseq.inference.kalman.KalmanSmootherResult` (batch shape leading).
        """
        return self._posterior(params, y, mask, inputs, "smoother",
                               _kind(parallel, square_root))

    def _posterior(self, params, y, mask, inputs, what, kind):
        # a repeat on the same arguments is one lookup and one dispatch (remembered)
        return remembered(("ssm", what, kind), self, params, y, mask, inputs,
                          lambda: self._posterior_runner(params, y, mask, inputs, what, kind))

    def _posterior_runner(self, params, y, mask, inputs, what, kind):
        # a time axis padded to a bucket length has masked steps at its end, which leave
        # the moments of the real steps unchanged (statseq.core.buckets); cut off below.
        # validate_params and prepare_data, remembered for arrays passed again
        data = checked_data(self, params, y, mask, inputs, sized=False)[1]
        self._check_num_timesteps(data.num_timesteps)
        # complete data (known eagerly) may use the steady-state smoother; one compiled
        # call, batch shape restored inside (no eager reshape per leaf)
        dynamic, fill = device_args(data, self.num_inputs)
        dynamic.update(params=params)
        call = reshaped_runner(_ssm_posterior, data.batch_shape, dynamic, fill, model=self,
                               what=what, kind=kind, complete=data.complete)
        if data.num_valid is None:
            return call

        def run():
            out = call()
            steps = [f for f in out._fields
                     if f not in ("marginal_log_lik", "smoothed_cross_covs")]
            lags = ["smoothed_cross_covs"] if "smoothed_cross_covs" in out._fields else []
            return cut_steps(out, data.num_valid, len(data.batch_shape), steps=steps,
                             lags=lags)

        return run

    def _check_num_timesteps(self, num_timesteps: int) -> None:  # noqa: B027 - optional hook
        """Time-varying models check that ``y`` has as many steps as their matrices."""

    def sample_states_posterior(self, params, y, *, key, num_samples=1, mask=None,
                                inputs=None):
        """Draws of whole state paths from ``p(x_{0:T-1} | y)`` (forward filtering,
        backward sampling): ``(num_samples,) + batch_shape + (T, n)``."""
        check_key(key)
        validate_params(self, params)
        num_samples = check_positive_int(num_samples, "num_samples")
        data = prepare_data(self, y, mask, inputs)
        self._check_num_timesteps(data.num_timesteps)
        keys = jax.random.split(key, data.y.shape[0])
        paths = _ssm_sample(self, params, data.y, data.mask, data.inputs, keys,
                            num_samples=num_samples)  # (N, S, T, n)
        paths = jnp.swapaxes(paths, 0, 1)
        return jnp.reshape(paths, (num_samples,) + data.batch_shape + paths.shape[2:])

    def forecast_moments(self, params, y, *, num_steps, mask=None, inputs=None,
                         future_inputs=None) -> GaussianForecast:
        """Exact h-step predictive moments of ``x_{T+h}`` and ``y_{T+h}`` given ``y``.

            x_{T+h} | y ~ N(a_{T+h}, P_{T+h}),   a_{T+h} = F a_{T+h-1} + B u_{T+h} + b,
            P_{T+h} = F P_{T+h-1} F^T + Q,       y_{T+h} | y ~ N(H a + D u + d, H P H^T + R).

        Args:
            params: the model's parameters.
            y: history ``batch_shape + (T,) + event_shape``.
            num_steps: horizon ``h``.
            mask: as for `statseq.filter`.
            inputs: as for `statseq.filter`.
            future_inputs: ``(num_steps, input_dim)`` covariates over the horizon.

        Returns:
            A `GaussianForecast` (``.interval(0.9)`` gives 90% prediction intervals).
        """
        validate_params(self, params)
        num_steps = check_positive_int(num_steps, "num_steps")
        values, history_index, columns = pandas_values(y, len(self.event_shape))
        data = prepare_data(self, y, mask, inputs)
        self._check_num_timesteps(data.num_timesteps)
        u = self._future_inputs(future_inputs, num_steps)
        state_mean, state_cov, y_mean, y_cov = _ssm_forecast(
            self, params, data.y, data.mask, data.inputs, u, num_steps=num_steps
        )
        bs = data.batch_shape
        if not bool(np.all(np.isfinite(np.asarray(y_cov)))):
            raise ValueError(
                "the history does not identify every diffuse state (too few observations "
                "for the model's non-stationary components), so the forecast is improper"
            )
        return GaussianForecast(
            mean=jnp.reshape(y_mean, bs + (num_steps,) + self.event_shape),
            cov=jnp.reshape(y_cov, bs + (num_steps, self.dim, self.dim)),
            state_mean=jnp.reshape(state_mean, bs + state_mean.shape[1:]),
            state_cov=jnp.reshape(state_cov, bs + state_cov.shape[1:]),
            history=np.asarray(values),
            index=None if history_index is None else future_index(history_index, num_steps),
            history_index=history_index, columns=columns,
        )

    def _future_inputs(self, future_inputs, num_steps):
        dtype = float_dtype()
        if not self.input_dim:
            if future_inputs is not None:
                raise ValueError(f"{type(self).__name__} takes no inputs")
            return jnp.zeros((num_steps, 0), dtype)
        if future_inputs is None:
            raise ValueError("this model takes inputs: pass future_inputs over the horizon")
        u = np.asarray(future_inputs, float)
        if u.shape != (num_steps, self.input_dim):
            raise ValueError(
                f"future_inputs must have shape ({num_steps}, {self.input_dim}), got {u.shape}"
            )
        if not np.all(np.isfinite(u)):
            raise ValueError("future_inputs must be finite")
        return jnp.asarray(u, dtype)


def _kind(parallel, square_root) -> str:
    """Which filter/smoother: ``seq``, ``parallel``, ``sqrt`` or ``sqrt_parallel``."""
    if not isinstance(square_root, bool | np.bool_):
        raise TypeError(f"square_root must be True or False, got {square_root!r}")
    par = use_parallel(parallel)
    if square_root:
        return "sqrt_parallel" if par else "sqrt"
    return "parallel" if par else "seq"


# ---- compiled workers (module level: one compilation per model and shapes) --------------
def _posterior_one(model, params, y, mask, inputs, what, kind, complete):
    arrays = model.to_arrays(params)
    y = jnp.reshape(y, (y.shape[0], model.dim)).astype(arrays.initial_cov.dtype)
    mask = jnp.reshape(mask, (mask.shape[0], -1)) & jnp.ones((1, model.dim), bool)
    if kind == "seq" and complete and not kalman.is_time_varying(arrays):
        fn = (kalman_steady.steady_state_filter if what == "filter"
              else kalman_steady.steady_state_smoother)
        return fn(arrays, y, inputs, head=model.steady_state_head)
    if kind == "parallel":
        from statseq.inference import kalman_parallel as lib

        fn = lib.parallel_kalman_filter if what == "filter" else lib.parallel_kalman_smoother
    elif kind == "sqrt":
        from statseq.inference import kalman_sqrt as lib

        fn = lib.sqrt_kalman_filter if what == "filter" else lib.sqrt_kalman_smoother
    elif kind == "sqrt_parallel":
        from statseq.inference import kalman_sqrt_parallel as lib

        fn = (lib.parallel_sqrt_kalman_filter if what == "filter"
              else lib.parallel_sqrt_kalman_smoother)
    else:
        fn = kalman.kalman_filter if what == "filter" else kalman.kalman_smoother
    return fn(arrays, y, mask, inputs)


@partial(jax.jit, static_argnames=("model", "what", "kind", "complete"))
def _ssm_posterior(model, params, y, mask, inputs, *, what, kind, complete=False):
    def one(y_s, m_s, u_s):
        return _posterior_one(model, params, y_s, m_s, u_s, what, kind, complete)

    if kind == "parallel":
        # a loop over the sequences: under vmap the parallel diffuse filter's lax.cond (its
        # sequential fallback) would become a select that runs both branches
        return jax.lax.map(lambda args: one(*args), (y, mask, inputs))
    return vmap_or_one(one)(y, mask, inputs)


def _flat_one(model, y, mask):
    y = jnp.reshape(y, (y.shape[0], model.dim))
    mask = jnp.reshape(mask, (mask.shape[0], -1)) & jnp.ones((1, model.dim), bool)
    return y, mask


@partial(jax.jit, static_argnames=("model", "num_samples"))
def _ssm_sample(model, params, y, mask, inputs, keys, *, num_samples):
    arrays = model.to_arrays(params)

    def one(y_s, m_s, u_s, k):
        y_s, m_s = _flat_one(model, y_s.astype(arrays.initial_cov.dtype), m_s)
        return kalman.sample_posterior(arrays, y_s, m_s, u_s, k, num_samples)

    return vmap_or_one(one)(y, mask, inputs, keys)


@partial(jax.jit, static_argnames=("model", "num_steps"))
def _ssm_forecast(model, params, y, mask, inputs, future_inputs, *, num_steps):
    arrays = model.to_arrays(params)
    num_t = y.shape[1]

    def one(y_s, m_s, u_s):
        y_s, m_s = _flat_one(model, y_s.astype(arrays.initial_cov.dtype), m_s)

        def step(carry, xs):
            y_t, m_t, u_t = xs
            return kalman.kalman_step(arrays, carry, y_t, m_t, u_t)[1], None

        final, _ = jax.lax.scan(step, kalman.initial_carry(arrays), (y_s, m_s, u_s))
        mean = jnp.where(final.collapsed, final.mean, jnp.nan)
        cov = jnp.where(final.collapsed, final.cov, jnp.nan)

        def ahead(c, xs):
            h, u_t = xs
            m, p = c
            arr = kalman.arrays_at(arrays, num_t - 1 + h)
            m, p = kalman.predict_state(arr, m, p, u_t)
            arr_y = kalman.arrays_at(arrays, num_t + h)
            hm = arr_y.emission_weights
            ym = hm @ m + arr_y.emission_input_weights @ u_t + arr_y.emission_bias
            yc = symmetrize(hm @ p @ hm.T + arr_y.emission_cov)
            return (m, p), (m, p, ym, yc)

        _, out = jax.lax.scan(ahead, (mean, cov),
                              (jnp.arange(num_steps), future_inputs))
        return out

    return vmap_or_one(one)(y, mask, inputs)
