"""Brute-force references for linear Gaussian state space models: the joint Gaussian of
``(x_{0:T-1}, y_{0:T-1})`` built densely, and conditioning by the Schur complement
(pseudo-inverses, so singular state and observation covariances are exact)."""

import jax.numpy as jnp
import numpy as np
import scipy.stats
import statsmodels.api as sm


def joint_moments(p, num_t):
    """Mean and covariance of the stacked states ``x`` and observations ``y`` of a
    time-invariant `LinearGaussianSSM` without inputs (free initial law)."""
    f, q = np.asarray(p.dynamics_weights), np.asarray(p.dynamics_cov)
    h, r = np.asarray(p.emission_weights), np.asarray(p.emission_cov)
    b, d = np.asarray(p.dynamics_bias), np.asarray(p.emission_bias)
    n, dim = f.shape[0], h.shape[0]
    means = [np.asarray(p.initial_mean, float)]
    for _ in range(num_t - 1):
        means.append(f @ means[-1] + b)
    cov = np.zeros((num_t * n, num_t * n))
    covs = [np.asarray(p.initial_cov, float)]
    for _ in range(num_t - 1):
        covs.append(f @ covs[-1] @ f.T + q)
    for t in range(num_t):
        cov[t * n:(t + 1) * n, t * n:(t + 1) * n] = covs[t]
        block = covs[t]
        for s in range(t + 1, num_t):
            block = f @ block  # Cov(x_s, x_t) = F^{s-t} Cov(x_t)
            cov[s * n:(s + 1) * n, t * n:(t + 1) * n] = block
            cov[t * n:(t + 1) * n, s * n:(s + 1) * n] = block.T
    big_h = np.kron(np.eye(num_t), h)
    mx = np.concatenate(means)
    my = big_h @ mx + np.tile(d, num_t)
    cyy = big_h @ cov @ big_h.T + np.kron(np.eye(num_t), r)
    cxy = cov @ big_h.T
    return mx, cov, my, cyy, cxy, n, dim


def log_prob(p, y):
    y = np.asarray(y, float).reshape(len(y), -1)
    _, _, my, cyy, _, _, _ = joint_moments(p, len(y))
    return scipy.stats.multivariate_normal(my, cyy).logpdf(y.ravel())


def conditional_states(p, y, upto=None):
    """Means and covariances of ``x_t | y_{0:upto(t)}``: ``upto=None`` the smoother,
    ``upto="filter"`` the filter (``y_{0:t}``)."""
    y = np.asarray(y, float).reshape(len(y), -1)
    num_t = len(y)
    mx, cxx, my, cyy, cxy, n, dim = joint_moments(p, num_t)
    means, covs = [], []
    for t in range(num_t):
        k = (t + 1) * dim if upto == "filter" else num_t * dim
        gain = cxy[t * n:(t + 1) * n, :k] @ np.linalg.pinv(cyy[:k, :k], hermitian=True)
        means.append(mx[t * n:(t + 1) * n] + gain @ (y.ravel()[:k] - my[:k]))
        covs.append(cxx[t * n:(t + 1) * n, t * n:(t + 1) * n]
                    - gain @ cxy[t * n:(t + 1) * n, :k].T)
    return np.array(means), np.array(covs)


F_AR2 = np.array([[0.5, 0.3], [1.0, 0.0]])
H_AR2 = np.array([[1.0, 0.0]])


def ar2_params(model, r=0.0, q=0.7):
    """AR(2) in companion form: the second state is the lagged first, without own noise."""
    return model.default_params()._replace(
        dynamics_weights=jnp.asarray(F_AR2), dynamics_cov=jnp.asarray(np.diag([q, 0.0])),
        emission_weights=jnp.asarray(H_AR2), emission_cov=jnp.asarray([[r]]),
        initial_mean=jnp.array([0.2, -0.1]),
        initial_cov=jnp.asarray([[1.0, 0.3], [0.3, 0.5]]))


def statsmodels_kalman(p, y):
    """statsmodels' Kalman smoother of the 2-state model ``p`` (known initial law)."""
    mod = sm.tsa.statespace.MLEModel(
        np.asarray(y, float), k_states=2, initialization="known",
        initial_state=np.asarray(p.initial_mean), initial_state_cov=np.asarray(p.initial_cov))
    mod["design"], mod["transition"] = np.asarray(p.emission_weights), np.asarray(
        p.dynamics_weights)
    mod["selection"], mod["state_cov"] = np.eye(2), np.asarray(p.dynamics_cov)
    mod["obs_cov"] = np.asarray(p.emission_cov)
    return mod.ssm.smooth()


