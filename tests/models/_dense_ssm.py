"""Brute-force references for linear Gaussian state space models: the joint Gaussian of
``(x_{0:T-1}, y_{0:T-1})`` built densely, and conditioning by the Schur complement
(pseudo-inverses, so singular state and observation covariances are exact)."""

import numpy as np
import scipy.stats


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
