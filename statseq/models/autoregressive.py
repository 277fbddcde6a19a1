"""Gaussian vector autoregression AR(p) with optional inputs (ARX), as a filter.

    y_t = c + sum_{k=1}^p A_k y_{t-k} + W u_t + e_t,        e_t ~ N(0, Sigma).

The carry is the Gaussian belief ``N(m, P)`` over the lag window
``s_t = (y_{t-1}, ..., y_{t-p})``. When every value is observed ``P`` is zero and the
predictive is ``N(c + A s_t + W u_t, Sigma)``; when values are missing they stay in the
window as Gaussian unknowns, so the likelihood marginalizes them exactly (the window is
the state of the companion-form state space model, conditioned with a masked Kalman step).

Two likelihoods, chosen explicitly with ``initial``:

* ``"conditional"`` (default): the first ``p`` observations are conditioned on, not
  modelled, as in least squares and ``statsmodels.tsa.ar_model.AutoReg``;
* ``"stationary"``: the pre-sample window is drawn from the stationary distribution, which
  gives the exact Gaussian likelihood (as ``statsmodels.tsa.arima.model.ARIMA``).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.model import SequenceModel, register_model
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.inference.gaussian import (
    condition_on_leading,
    solve_discrete_lyapunov,
    symmetrize,
)


class ARParams(NamedTuple):
    """Parameters of `AR`.

    Attributes:
        coeffs: ``(order, emission_dim, emission_dim)``; ``coeffs[k-1]`` is ``A_k``.
        intercept: ``(emission_dim,)`` the constant ``c``.
        input_weights: ``(emission_dim, input_dim)`` the regression weights ``W``.
        cov: ``(emission_dim, emission_dim)`` noise covariance ``Sigma``.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.AR(order=2)                 # y_t = c + a_1 y_{t-1} + a_2 y_{t-2} + e_t
        >>> params = ss.ARParams(coeffs=jnp.array([[[1.4]], [[-0.8]]]), intercept=jnp.array([1.1]),
        ...                      input_weights=jnp.zeros((1, 0)), cov=jnp.array([[0.05]]))
        >>> jax_shapes = [p.shape for p in params]
        >>> jax_shapes == [p.shape for p in model.default_params()]
        True
        >>> ss.filter(model, params, jnp.array([2.0, 3.0, 3.5, 3.0])).log_probs.shape
        (4,)
    """

    coeffs: jax.Array
    intercept: jax.Array
    input_weights: jax.Array
    cov: jax.Array


class ARCarry(NamedTuple):
    """Belief over the lag window ``(y_{t-1}, ..., y_{t-p})``, stacked newest first."""

    mean: jax.Array  # (order * dim,)
    cov: jax.Array  # (order * dim, order * dim)
    step: jax.Array  # number of time steps seen (for diagnostics)


@register_model
@dataclasses.dataclass(frozen=True)
class AR(SequenceModel):
    """Gaussian autoregressive model of order ``p``, optionally with inputs (ARX).

        y_t = c + sum_{k=1}^p A_k y_{t-k} + W u_t + e_t,    e_t ~ N(0, Sigma).

    Args:
        order: the number of lags ``p`` (>= 1).
        emission_dim: ``None`` for a scalar series (``y`` of shape ``(num_timesteps,)``),
            or ``D`` for a vector series (``y`` of shape ``(num_timesteps, D)``, a VAR).
        input_dim: number of covariates ``u_t`` (0 for none).
        initial: ``"conditional"`` (condition on the first ``p`` values) or
            ``"stationary"`` (exact likelihood; pre-sample values from the stationary law;
            requires ``input_dim == 0``).

    With ``initial="conditional"`` the model says nothing about the first ``p`` values:
    `statseq.sample` then starts from pre-sample values of zero, while
    ``"stationary"`` draws them from the stationary law.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> float(params.coeffs[0, 0, 0]) > 1.0
        True
    """

    order: int = 1
    emission_dim: int | None = None
    input_dim: int = 0
    initial: Literal["conditional", "stationary"] = "conditional"

    supports_partial_mask = True

    def __post_init__(self):
        check_positive_int(self.order, "order")
        if self.emission_dim is not None:
            check_positive_int(self.emission_dim, "emission_dim")
        check_positive_int(self.input_dim, "input_dim", minimum=0)
        if self.initial not in ("conditional", "stationary"):
            raise ValueError(
                f"initial must be 'conditional' or 'stationary', got {self.initial!r}"
            )
        if self.initial == "stationary" and self.input_dim:
            raise ValueError(
                "initial='stationary' is not defined for an AR model with inputs; "
                "use initial='conditional'"
            )

    # ---- static description ---------------------------------------------------------
    @property
    def dim(self) -> int:
        """Number of series ``D`` (1 for a scalar series)."""
        return 1 if self.emission_dim is None else self.emission_dim

    @property
    def event_shape(self) -> tuple[int, ...]:
        return () if self.emission_dim is None else (self.emission_dim,)

    def param_shapes(self) -> ARParams:
        d = self.dim
        return ARParams((self.order, d, d), (d,), (d, self.input_dim), (d, d))

    def param_constraints(self) -> ARParams:
        return ARParams(
            constraints.real, constraints.real, constraints.real, constraints.positive_definite
        )

    def default_params(self) -> ARParams:
        """A stable, weakly persistent starting point: ``A_1 = 0.5 I``, ``Sigma = I``."""
        d, dtype = self.dim, float_dtype()
        coeffs = jnp.zeros((self.order, d, d), dtype).at[0].set(0.5 * jnp.eye(d, dtype=dtype))
        return ARParams(
            coeffs=coeffs,
            intercept=jnp.zeros((d,), dtype),
            input_weights=jnp.zeros((d, self.input_dim), dtype),
            cov=jnp.eye(d, dtype=dtype),
        )

    # ---- helpers ----------------------------------------------------------------------
    def _stacked(self, params):
        """``[A_1 ... A_p]`` as a ``(D, p D)`` matrix."""
        d = self.dim
        return jnp.transpose(params.coeffs, (1, 0, 2)).reshape(d, self.order * d)

    def companion(self, params):
        """The ``(p D, p D)`` companion matrix of the lag window recursion."""
        d, p = self.dim, self.order
        top = self._stacked(params)
        shift = jnp.eye((p - 1) * d, p * d, dtype=top.dtype)
        return jnp.concatenate([top, shift], axis=0)

    def is_stationary(self, params) -> jax.Array:
        """Whether every eigenvalue of the companion matrix lies inside the unit circle."""
        eig = jnp.linalg.eigvals(self.companion(params))
        return jnp.all(jnp.abs(eig) < 1.0)

    def stationary_moments(self, params):
        """Mean ``(D,)`` and window covariance ``(p D, p D)`` of the stationary law."""
        d, p = self.dim, self.order
        a_sum = jnp.sum(params.coeffs, axis=0)
        mu = jnp.linalg.solve(jnp.eye(d, dtype=a_sum.dtype) - a_sum, params.intercept)
        q = jnp.zeros((p * d, p * d), mu.dtype).at[:d, :d].set(params.cov)
        return mu, solve_discrete_lyapunov(self.companion(params), q)

    def check_params(self, params) -> None:
        """Eager model-level check: a stationary likelihood needs stationary coefficients."""
        if self.initial != "stationary":
            return
        eig = np.linalg.eigvals(np.asarray(self.companion(params), float))
        radius = float(np.max(np.abs(eig)))
        if radius >= 1.0:
            raise ValueError(
                f"params.coeffs are not stationary (companion spectral radius {radius:.4g} "
                ">= 1), so initial='stationary' is undefined; use initial='conditional'"
            )

    # ---- the filter -------------------------------------------------------------------
    def initial_carry(self, params) -> ARCarry:
        n = self.order * self.dim
        dtype = params.cov.dtype
        if self.initial == "stationary":
            mu, cov = self.stationary_moments(params)
            mean = jnp.tile(mu, self.order)
        else:
            mean, cov = jnp.zeros((n,), dtype), jnp.zeros((n, n), dtype)
        return ARCarry(mean=mean, cov=cov, step=jnp.zeros((), jnp.int32))

    def _predictive_moments(self, params, carry, inputs_t):
        a = self._stacked(params)
        mean = params.intercept + a @ carry.mean + params.input_weights @ inputs_t
        cov = symmetrize(a @ carry.cov @ a.T + params.cov)
        return mean, cov

    def predict(self, params, carry, inputs_t):
        mean, cov = self._predictive_moments(params, carry, inputs_t)
        if self.emission_dim is None:
            return dist.Normal(mean[0], jnp.sqrt(cov[0, 0]))
        return dist.MultivariateNormal(mean, cov)

    def update(self, params, carry, y_t, mask_t, inputs_t) -> ARCarry:
        d, n = self.dim, self.order * self.dim
        a = self._stacked(params)
        y_mean, y_cov = self._predictive_moments(params, carry, inputs_t)
        cross = carry.cov @ a.T  # Cov(window, y_t): (n, d)
        joint_mean = jnp.concatenate([y_mean, carry.mean])
        joint_cov = jnp.block([[y_cov, cross.T], [cross, carry.cov]])
        y_vec = jnp.reshape(y_t, (d,)).astype(joint_mean.dtype)
        m_vec = jnp.reshape(mask_t, (d,))
        post_mean, post_cov = condition_on_leading(joint_mean, joint_cov, y_vec, m_vec)
        # the new window drops the oldest lag
        return ARCarry(mean=post_mean[:n], cov=post_cov[:n, :n], step=carry.step + 1)

    @property
    def num_conditioned_steps(self) -> int:
        return self.order if self.initial == "conditional" else 0

    # ---- fast path for complete data ---------------------------------------------------
    @property
    def fast_path_min_timesteps(self) -> int:
        """The fast path's final state assumes every lag was observed: ``T >= order``."""
        return self.order

    def complete_data_log_probs(self, params, y, inputs):
        """Per-step log-densities without a scan, for fully observed ``y`` (one sequence).

        For ``t > p`` the predictive is ``N(c + sum_k A_k y_{t-k} + W u_t, Sigma)``, so all
        residuals are computed at once; for ``t <= p`` the stationary likelihood uses the
        chain rule on the stationary joint of ``(y_1, ..., y_p)`` through its Cholesky
        factor. Gives the same numbers as the generic filter (a test checks this).

        Returns:
            ``(log_probs (T,), final_carry)``.
        """
        p, d = self.order, self.dim
        y = jnp.reshape(y, (y.shape[0], d)).astype(params.cov.dtype)
        t_len = y.shape[0]
        lags = jnp.concatenate(
            [jnp.zeros((p, d), y.dtype), y], axis=0
        )  # lags[p + t - k] = y_{t-k}
        window = jnp.stack([lags[p - k : p - k + t_len] for k in range(1, p + 1)], axis=1)
        mean = params.intercept + inputs @ params.input_weights.T
        for k in range(p):  # per-lag matmuls (faster on CPU than one einsum)
            mean = mean + window[:, k] @ params.coeffs[k].T
        chol_inv, half_logdet = _noise_factor(params.cov)
        z = (y - mean) @ chol_inv.T
        log_probs = (
            -0.5 * jnp.sum(z**2, axis=1)
            - half_logdet
            - 0.5 * d * jnp.log(2.0 * jnp.pi)
        )
        head = min(p, t_len)
        if self.initial == "stationary":
            mu, window_cov = self.stationary_moments(params)
            # the stationary window is newest first; reverse the blocks to time order
            order = jnp.arange(p * d).reshape(p, d)[::-1].reshape(-1)[: head * d]
            joint = window_cov[order][:, order]
            chol0 = jnp.linalg.cholesky(joint)
            z0 = jax.scipy.linalg.solve_triangular(
                chol0, (y[:head] - mu).reshape(-1), lower=True
            )
            per = -0.5 * z0**2 - jnp.log(jnp.diagonal(chol0)) - 0.5 * jnp.log(2.0 * jnp.pi)
            head_lp = per.reshape(head, d).sum(axis=1)
        else:
            head_lp = jnp.zeros((head,), log_probs.dtype)
        log_probs = log_probs.at[:head].set(head_lp)
        n = p * d
        final = ARCarry(
            mean=jnp.reshape(lags[t_len:][::-1], (n,)),
            cov=jnp.zeros((n, n), y.dtype),
            step=jnp.asarray(t_len, jnp.int32),
        )
        return log_probs, final

    # ---- data checks and estimators ----------------------------------------------------
    def validate_data(self, y, mask) -> None:
        if self.initial != "conditional":
            return
        step_mask = mask if self.emission_dim is None else np.all(mask, axis=-1)
        head = step_mask[..., : self.order]
        if not np.all(head):
            raise ValueError(
                f"with initial='conditional' the first order={self.order} observations are "
                "conditioned on and must be observed; use initial='stationary' for missing "
                "values at the start"
            )

    def initialize(self, y, *, key, inputs=None, mask=None, method="data") -> ARParams:
        """Least-squares estimates (``"data"``), or those with coefficients shrunk by a random
        factor in (0, 1) (``"random"``, for restarts of an exact-likelihood fit)."""
        check_key(key)
        if method == "random":
            est = self.fit_least_squares(y, inputs=inputs, mask=mask)
            factor = jax.random.uniform(key, (), minval=0.0, maxval=1.0)
            return est._replace(coeffs=est.coeffs * factor.astype(est.coeffs.dtype))
        if method != "data":
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        return self.fit_least_squares(y, inputs=inputs, mask=mask)

    def forecast_moments(self, params, y, *, num_steps, mask=None, inputs=None,
                         future_inputs=None):
        """Exact h-step predictive means and covariances through the companion form.

        With the lag window ``s_t = (y_{t-1}, ..., y_{t-p})`` filtered to
        ``s_{T+1} | y ~ N(m, P)`` (``P = 0`` when the last ``p`` values are observed),

            s_{T+h+1} = C s_{T+h} + e_1 (c + W u_{T+h} + eps),    y_{T+h} = e_1^T s_{T+h+1},
            E[y_{T+h}] = c + A m_h + W u_{T+h},   Var[y_{T+h}] = A P_h A^T + Sigma,

        with ``C`` the companion matrix and ``A = [A_1 ... A_p]``: the moments behind
        ``statsmodels`` ``AutoReg``/``ARIMA``/``VAR`` forecasts, without Monte Carlo.

        Args:
            params: the model's parameters.
            y: history ``batch_shape + (T,) + event_shape`` (at least ``order`` values).
            num_steps: horizon ``h``.
            mask: as for `statseq.filter` (missing values stay uncertain in the window).
            inputs: history covariates, when the model takes inputs.
            future_inputs: ``(num_steps, input_dim)`` covariates over the horizon.

        Returns:
            A `statseq.GaussianForecast`; ``state_mean``/``state_cov`` are the moments of
            the window ``s_{T+h+1}``.

        Examples:
            >>> import numpy as np, statseq as ss
            >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
            >>> model = ss.AR(order=2)
            >>> fc = model.forecast_moments(model.fit_least_squares(y), y, num_steps=5)
            >>> fc.mean.shape, fc.cov.shape
            ((5,), (5, 1, 1))
        """
        from statseq.core.params import validate_params
        from statseq.core.recurrence import _future_inputs, run_filter
        from statseq.core.validation import pandas_values
        from statseq.forecast import future_index
        from statseq.models.ssm.base import GaussianForecast

        validate_params(self, params)
        num_steps = check_positive_int(num_steps, "num_steps")
        values, history_index, columns = pandas_values(y, len(self.event_shape))
        data = prepare_data(self, y, mask, inputs)
        if data.num_timesteps < self.num_conditioned_steps:
            raise ValueError(f"AR(order={self.order}) conditions on its first {self.order} "
                             f"values, so a forecast needs at least that many; y has "
                             f"{data.num_timesteps}")
        _, _, _, final = run_filter(self, params, data.y, data.mask, data.inputs,
                                    complete=data.complete)
        u = _future_inputs(self, future_inputs, data.batch_shape, num_steps)
        s_mean, s_cov, y_mean, y_cov = _ar_ahead(self, params, final, u)
        bs, d = data.batch_shape, self.dim
        return GaussianForecast(
            mean=jnp.reshape(y_mean, bs + (num_steps,) + self.event_shape),
            cov=jnp.reshape(y_cov, bs + (num_steps, d, d)),
            state_mean=jnp.reshape(s_mean, bs + s_mean.shape[1:]),
            state_cov=jnp.reshape(s_cov, bs + s_cov.shape[1:]),
            history=np.asarray(values),
            index=None if history_index is None else future_index(history_index, num_steps),
            history_index=history_index, columns=columns,
        )

    def fit_least_squares(self, y, *, inputs=None, mask=None) -> ARParams:
        """Closed-form conditional maximum likelihood (ordinary least squares).

        Regresses ``y_t`` on ``(1, y_{t-1}, ..., y_{t-p}, u_t)`` over every ``t`` whose
        value and lags are all observed (pooling a batch of sequences), and sets ``Sigma``
        to the residual covariance ``sum r r^T / n`` (the maximum likelihood estimate, as
        ``AutoReg``'s ``sigma2``).

        Args:
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            inputs: ``[batch_shape +] (num_timesteps, input_dim)``.
            mask: optional booleans (rows touching a missing value are dropped).

        Returns:
            `ARParams`.
        """
        data = prepare_data(self, y, mask, inputs)
        p, d, t_len = self.order, self.dim, data.num_timesteps
        yv = np.asarray(data.y, float).reshape(-1, t_len, d)
        mv = np.asarray(data.mask).reshape(-1, t_len, d).all(axis=-1)
        u = np.asarray(data.inputs, float)
        if t_len <= p:
            raise ValueError(f"y needs more than order={p} time steps, got {t_len}")
        rows, targets = [], []
        for s in range(yv.shape[0]):
            lags = [yv[s, p - k : t_len - k] for k in range(1, p + 1)]
            ok = mv[s, p:].copy()
            for k in range(1, p + 1):
                ok &= mv[s, p - k : t_len - k]
            design = np.concatenate(
                [np.ones((t_len - p, 1))] + lags + [u[s, p:]], axis=1
            )
            rows.append(design[ok])
            targets.append(yv[s, p:][ok])
        x, target = np.concatenate(rows), np.concatenate(targets)
        num_coef = 1 + p * d + self.input_dim
        if x.shape[0] < num_coef:
            raise ValueError(
                f"least squares needs at least {num_coef} complete rows, got {x.shape[0]}"
            )
        beta, *_ = np.linalg.lstsq(x, target, rcond=None)
        resid = target - x @ beta
        cov = resid.T @ resid / x.shape[0]
        lag_block = beta[1 : 1 + p * d].T.reshape(d, p, d).transpose(1, 0, 2)
        dtype = float_dtype()
        # cast and symmetrize with NumPy in the target dtype: the same values as jnp's,
        # without six small programs to trace and load in a new process
        # (and transfer them with device_put: jnp.asarray compiles a program per shape)
        cov = np.asarray(cov, dtype)
        return ARParams(
            coeffs=jax.device_put(np.asarray(lag_block, dtype)),
            intercept=jax.device_put(np.asarray(beta[0], dtype)),
            input_weights=jax.device_put(
                np.asarray(beta[1 + p * d :].T.reshape(d, self.input_dim), dtype)),
            cov=jax.device_put(0.5 * (cov + np.swapaxes(cov, -1, -2))),
        )


@partial(jax.jit, static_argnames=("model",))
def _ar_ahead(model, params, final, future_inputs):
    """Window and observation moments over the horizon for a flat batch of carries."""
    n, d = model.order * model.dim, model.dim
    a = model._stacked(params)

    def one(carry, u):
        def step(c, u_t):
            m, p = c
            y_mean = params.intercept + a @ m + params.input_weights @ u_t
            cross = p @ a.T  # Cov(window, y): (n, d)
            y_cov = symmetrize(a @ cross + params.cov)
            m_new = jnp.concatenate([y_mean, m[: n - d]])
            p_new = jnp.block([[y_cov, cross[: n - d].T], [cross[: n - d], p[: n - d, : n - d]]])
            return (m_new, symmetrize(p_new)), (m_new, p_new, y_mean, y_cov)

        return jax.lax.scan(step, (carry.mean, carry.cov), u)[1]

    return jax.vmap(one)(final, future_inputs)


def _noise_factor(cov):
    """``(L^{-1}, sum(log(diag(L))))`` with ``cov = L L^T`` (lower triangular), as
    `jnp.linalg.cholesky` and a triangular solve give them (NaN where the factorization
    fails). A ``1 x 1`` ``cov`` (a scalar series) takes ``sqrt``, a reciprocal and a log,
    bitwise LAPACK's ``potrf`` / ``trsm`` and the log of its factor, computed as one
    two-element array (one kernel): the two LAPACK calls and their copies were 5 of the 13
    kernels of AR's public ``log_prob`` at ``T = 10^3``, past the 8 that XLA:CPU runs
    inline (`benchmarks/RESULTS.md`, "Session 22: public calls")."""
    if cov.shape[-1] == 1:
        var = cov[..., 0, 0]
        scale = jnp.where(var > 0, jnp.sqrt(var), jnp.nan)
        # one kernel, not three (the barrier keeps XLA from slicing the pair apart again)
        both = jax.lax.optimization_barrier(jnp.stack([1.0 / scale, jnp.log(scale)], axis=-1))
        return both[..., 0, None, None], both[..., 1]
    chol = jnp.linalg.cholesky(cov)
    # one small triangular inverse, then a matmul (a solve with T right-hand sides runs as
    # T tiny solves on CPU)
    eye = jnp.broadcast_to(jnp.eye(cov.shape[-1], dtype=chol.dtype), chol.shape)
    return (jax.scipy.linalg.solve_triangular(chol, eye, lower=True),
            jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1))
