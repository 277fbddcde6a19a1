"""Auxiliary residuals of linear Gaussian state space models (smoothed disturbances).

Durbin and Koopman (2012, sec. 2.12 and 7.5): the smoothed disturbances

    eps_hat_t = E[eps_t | y] = y_t - H_t E[x_t | y] - D_t u_t - d_t,
    w_hat_t   = E[w_t | y]   = E[x_{t+1} | y] - F_t E[x_t | y] - B_t u_{t+1} - b_t,

standardized by the standard deviations of the estimators,
``Var(eps_hat_t) = R_t - Var(eps_t | y)`` and ``Var(w_hat_t) = Q_t - Var(w_t | y)``, with
``Var(eps_t | y) = H_t V_t H_t^T`` and
``Var(w_t | y) = V_{t+1} + F_t V_t F_t^T - C_t F_t^T - F_t C_t^T`` from the smoothed
covariances ``V_t`` and cross-covariances ``C_t = Cov(x_{t+1}, x_t | y)`` of the
(exact diffuse) smoother. Large standardized observation residuals flag outliers, large
state residuals structural breaks (the Nile's 1899 level shift, D&K Fig. 2.7).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from statseq.core.params import validate_params
from statseq.core.recurrence import vmap_or_one
from statseq.core.validation import prepare_data
from statseq.inference.kalman import arrays_at, kalman_smoother


class AuxiliaryResiduals(NamedTuple):
    """Smoothed disturbances and their standardized versions (one series or a batch).

    Attributes:
        observation: ``batch_shape + (T, D)`` ``E[eps_t | y]`` (NaN where missing).
        observation_var: ``batch_shape + (T, D, D)`` ``Var(eps_hat_t)``.
        observation_std: ``batch_shape + (T, D)`` ``eps_hat / sqrt(diag Var(eps_hat))``.
        state: ``batch_shape + (T, n)`` ``E[w_t | y]`` (``w_t`` moves ``x_t`` to
            ``x_{t+1}``; the last entry, past the data, is 0).
        state_var: ``batch_shape + (T, n, n)`` ``Var(w_hat_t)``.
        state_std: ``batch_shape + (T, n)`` standardized (NaN where the variance is 0,
            e.g. the last step or a component without noise).
        observation_cond_var: ``batch_shape + (T, D, D)`` ``Var(eps_t | y)`` (statsmodels'
            ``smoothed_measurement_disturbance_cov``).
        state_cond_var: ``batch_shape + (T, n, n)`` ``Var(w_t | y)``
            (``smoothed_state_disturbance_cov`` for ``Q`` of full rank).

    Examples:
        >>> import statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> aux = ss.auxiliary_residuals(ss.LocalLevel(), params, y)
        >>> aux.observation_std.shape, aux.state_std.shape
        ((100, 1), (100, 1))
    """

    observation: Any
    observation_var: Any
    observation_std: Any
    state: Any
    state_var: Any
    state_std: Any
    observation_cond_var: Any
    state_cond_var: Any


def _standardize(x, var):
    sd2 = jnp.diagonal(var, axis1=-2, axis2=-1)
    scale = jnp.maximum(jnp.max(jnp.abs(sd2)), jnp.finfo(sd2.dtype).tiny)
    ok = sd2 > 1e-10 * scale
    return jnp.where(ok, x / jnp.sqrt(jnp.where(ok, sd2, 1.0)), jnp.nan)


def _aux_one(arrays, y, mask, inputs):
    sm = kalman_smoother(arrays, y, mask, inputs)
    num_t = y.shape[0]
    mean, cov, cross = sm.smoothed_means, sm.smoothed_covs, sm.smoothed_cross_covs

    def obs(t, m_t, v_t, y_t, mk, u_t):
        a = arrays_at(arrays, t)
        h = a.emission_weights
        eps = y_t - h @ m_t - a.emission_input_weights @ u_t - a.emission_bias
        cond = h @ v_t @ h.T
        nan = jnp.outer(mk, mk)
        return (jnp.where(mk, eps, jnp.nan), jnp.where(nan, a.emission_cov - cond, jnp.nan),
                jnp.where(nan, cond, jnp.nan))

    eps, eps_var, eps_cond = jax.vmap(obs)(jnp.arange(num_t), mean, cov, y, mask, inputs)

    def state(t, m_t, m_next, v_t, v_next, c_t, u_next):
        a = arrays_at(arrays, t)
        f = a.dynamics_weights
        w = m_next - f @ m_t - a.dynamics_input_weights @ u_next - a.dynamics_bias
        cond = v_next + f @ v_t @ f.T - c_t @ f.T - f @ c_t.T
        cond = 0.5 * (cond + cond.T)
        return w, a.dynamics_cov - cond, cond

    w, w_var, w_cond = jax.vmap(state)(jnp.arange(num_t - 1), mean[:-1], mean[1:], cov[:-1],
                                       cov[1:], cross, inputs[1:])
    n = mean.shape[-1]
    zero = jnp.zeros((1, n), mean.dtype)
    zero2 = jnp.zeros((1, n, n), mean.dtype)
    w = jnp.concatenate([w, zero])
    w_var = jnp.concatenate([w_var, zero2])
    # the last disturbance moves past the data: E[w | y] = 0, Var(w | y) = Q
    last_q = arrays_at(arrays, num_t - 1).dynamics_cov
    w_cond = jnp.concatenate([w_cond, last_q[None]])
    return AuxiliaryResiduals(eps, eps_var, _standardize(eps, eps_var), w, w_var,
                              _standardize(w, w_var), eps_cond, w_cond)


@partial(jax.jit, static_argnames=("model",))
def _aux(model, params, y, mask, inputs):
    arrays = model.to_arrays(params)
    dtype = arrays.initial_cov.dtype

    def one(y_s, m_s, u_s):
        y_s = jnp.reshape(y_s, (y_s.shape[0], model.dim)).astype(dtype)
        m_s = jnp.reshape(m_s, (m_s.shape[0], -1)) & jnp.ones((1, model.dim), bool)
        return _aux_one(arrays, y_s, m_s, u_s)

    return vmap_or_one(one)(y, mask, inputs)


def auxiliary_residuals(model, params, y, *, mask=None, inputs=None) -> AuxiliaryResiduals:
    """Smoothed observation and state disturbances, raw and standardized.

    See the module docstring for the formulas (Durbin and Koopman 2012, sec. 2.12, 7.5).
    The standardized observation residuals ``eps_hat_t / sd(eps_hat_t)`` test for
    outliers, the standardized state residuals for structural breaks; both are
    approximately ``N(0, 1)`` under the model (but serially correlated).

    Args:
        model: a linear Gaussian state space model (`statseq.LinearGaussianSSM`, a
            structural model, ...): anything with ``to_arrays``.
        params: its parameters.
        y: ``batch_shape + (num_timesteps,) + event_shape``.
        mask: optional mask (missing observation residuals are NaN).
        inputs: covariates, when the model takes them.

    Returns:
        `AuxiliaryResiduals` (batch shape leading).

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = ss.datasets.load_nile()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> aux = ss.auxiliary_residuals(ss.LocalLevel(), params, y.to_numpy())
        >>> int(y.index[np.nanargmax(np.abs(aux.state_std[:, 0]))])
        1898
    """
    if not hasattr(model, "to_arrays"):
        raise TypeError(f"auxiliary residuals need a linear Gaussian state space model; "
                        f"{type(model).__name__} has no to_arrays")
    validate_params(model, params)
    data = prepare_data(model, y, mask, inputs)
    check = getattr(model, "_check_num_timesteps", None)
    if check is not None:
        check(data.num_timesteps)
    if data.num_timesteps < 2:
        raise ValueError("auxiliary residuals need at least 2 time steps")
    out = _aux(model, params, data.y, data.mask, data.inputs)
    return jax.tree.map(lambda a: jnp.reshape(a, data.batch_shape + a.shape[1:]), out)

