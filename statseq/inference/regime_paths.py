"""Exact h-step marginal predictives of switching linear autoregressions, by regime paths.

A model whose regime ``x_t`` (a finite Markov chain, possibly on an expanded state) selects
a linear-Gaussian regression on its own lag vector,

    s_t = F_{x_t} s_{t-1} + c_{x_t} + w_t,    w_t ~ N(0, Q_{x_t}),    y_t = s_t[:D],

(``s_t = [y_t; y_{t-1}; ...; y_{t-L+1}]`` in companion form: the AR-HMM, the
Markov-switching AR) has, given the filtered regime law at ``T`` and the observed lag
vector ``s_T``, a jointly Gaussian future along every regime path ``x_{T+1:T+k}``: the
unobserved intermediate ``y``'s enter the later lags as Gaussian states. Hence

    p(y_{T+k} | y_{1:T}) = sum_{paths} p(x_{T+1:T+k} | y_{1:T}) N(y_{T+k}; H m_path, H P_path H'),
    m' = F_x m + c_x,    P' = F_x P F_x' + Q_x,    m_T = s_T, P_T = 0,

exactly: a finite Gaussian mixture. `regime_path_marginals` enumerates the paths, branching
every live path into its ``K`` successors per step and multiplying its weight by the
transition probability of that step (time-varying when transitions read inputs).

Cost: ``M K^(k-1)`` components at step ``k`` (``M`` the number of states the predicted law
at ``T + 1`` lives on), each with an ``(n, n)`` covariance, ``n = L D`` the lag-vector size:
time ``O(M K^(h-1) n^3)`` and memory ``O(h M K^(h-1) n^2)`` for the padded output. There is
no exact collapse in general: the law of ``y_{T+k}`` given a path depends on the ordered
product of the path's ``F`` matrices and on every offset along it, so distinct paths give
distinct components.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

#: default bound on the number of mixture components (regime paths) per horizon
MAX_COMPONENTS = 2**16


class RegimePathMarginals(NamedTuple):
    """Gaussian-mixture marginals of ``y_{T+1}, ..., y_{T+h}``, padded to one count ``C``.

    Attributes:
        weights: ``(h, C)``; row ``k - 1`` holds the path probabilities of step ``k`` (zeros
            in its padding slots), each row sums to one.
        means: ``(h, C, D)`` component means (zeros in padding slots).
        covs: ``(h, C, D, D)`` component covariances (identity in padding slots).
    """

    weights: jax.Array
    means: jax.Array
    covs: jax.Array


def num_path_components(num_start_states: int, num_regimes: int, horizon: int) -> int:
    """``M K^(h-1)``: the components of the step-``h`` marginal."""
    return int(num_start_states) * int(num_regimes) ** (int(horizon) - 1)


def regime_path_marginals(predicted_probs: jax.Array, branch_probs: jax.Array,
                          successors: np.ndarray, dynamics: jax.Array, offsets: jax.Array,
                          noise_covs: jax.Array, lags: jax.Array, *, obs_dim: int,
                          max_components: int = MAX_COMPONENTS) -> RegimePathMarginals:
    """Exact marginal predictives ``p(y_{T+k} | y_{1:T})``, ``k = 1..h``, as Gaussian mixtures.

    With ``M`` regime states (those of the filter's chain: ``K`` regimes, or an expanded
    state such as ``(s_t, ..., s_{t-p})``), each of which has ``K`` possible successors:

        weight(path) = predicted_probs[x_{T+1}] prod_{j=2}^k branch_probs[j-2, x_{T+j-1}, b_j],
        x_{T+j} = successors[x_{T+j-1}, b_j],
        m_1 = F_{x_{T+1}} lags + c_{x_{T+1}},         P_1 = Q_{x_{T+1}},
        m_j = F_{x_{T+j}} m_{j-1} + c_{x_{T+j}},    P_j = F P_{j-1} F' + Q_{x_{T+j}},

    and step ``k``'s marginal is ``sum_paths weight N(m_k[:D], P_k[:D, :D])``. Jittable;
    the horizon and every array shape are static. Components: ``M K^(k-1)`` at step ``k``,
    each an ``(n, n)`` covariance (time ``O(M K^(h-1) n^3)``, memory
    ``O(h M K^(h-1) n^2)``).

    Args:
        predicted_probs: ``(M,)`` ``p(x_{T+1} | y_{1:T})``.
        branch_probs: ``(h - 1, M, K)``; ``[j, i, b]`` is the probability that the state
            after ``x = i`` at step ``T + j + 1`` is ``successors[i, b]``.
        successors: ``(M, K)`` integers (a NumPy array: static), the successor states.
        dynamics: ``(M, n, n)`` ``F_x``.
        offsets: ``(M, n)`` ``c_x``.
        noise_covs: ``(M, n, n)`` ``Q_x`` (positive definite on the leading ``D`` block).
        lags: ``(n,)`` the observed lag vector ``s_T``.
        obs_dim: ``D``: ``y_t`` is the leading ``D`` entries of ``s_t``.
        max_components: refuse (``ValueError``) when ``M K^(h-1)`` exceeds it.

    Returns:
        A `RegimePathMarginals` with ``C = M K^(h-1)``.

    Raises:
        ValueError: when the step-``h`` mixture would have more than ``max_components``
            components.

    Examples:
        >>> import jax.numpy as jnp, numpy as np
        >>> from statseq.inference.regime_paths import regime_path_marginals
        >>> # two regimes of a scalar AR(1): y_t = phi_x y_{t-1} + N(0, 1)
        >>> trans = jnp.array([[0.9, 0.1], [0.2, 0.8]])
        >>> out = regime_path_marginals(
        ...     jnp.array([0.5, 0.5]), jnp.stack([trans, trans]), np.array([[0, 1], [0, 1]]),
        ...     jnp.array([[[0.5]], [[-0.5]]]), jnp.zeros((2, 1)), jnp.ones((2, 1, 1)),
        ...     jnp.array([2.0]), obs_dim=1)
        >>> out.weights.shape, out.means.shape, out.covs.shape   # h = 3, C = 2 * 2^2
        ((3, 8), (3, 8, 1), (3, 8, 1, 1))
        >>> [round(float(v), 6) for v in out.weights.sum(-1)]
        [1.0, 1.0, 1.0]
    """
    successors = np.asarray(successors)
    num_states, num_branches = successors.shape
    horizon = int(branch_probs.shape[0]) + 1
    total = num_path_components(num_states, num_branches, horizon)
    if total > max_components:
        raise ValueError(
            f"the exact {horizon}-step marginal is a mixture over {num_states} x "
            f"{num_branches}^{horizon - 1} = {total} regime paths, more than max_components "
            f"= {max_components} (memory grows as components x (lag size)^2); shorten the "
            "horizon, raise max_components, or estimate by simulation (statseq.forecast)")
    dtype = offsets.dtype
    state = np.arange(num_states)
    weights = predicted_probs.astype(dtype)
    means = dynamics @ lags.astype(dtype) + offsets
    covs = noise_covs
    out_w, out_m, out_c = [], [], []

    def record(w, m, c):
        pad = total - w.shape[0]
        eye = jnp.eye(obs_dim, dtype=dtype)
        out_w.append(jnp.concatenate([w / jnp.sum(w), jnp.zeros((pad,), dtype)]))
        out_m.append(jnp.concatenate([m[:, :obs_dim], jnp.zeros((pad, obs_dim), dtype)]))
        out_c.append(jnp.concatenate([c[:, :obs_dim, :obs_dim],
                                      jnp.broadcast_to(eye, (pad, obs_dim, obs_dim))]))

    record(weights, means, covs)
    for j in range(horizon - 1):
        nxt = successors[state]  # (C, K) static
        weights = (weights[:, None] * branch_probs[j][state]).reshape(-1)
        f = dynamics[nxt]  # (C, K, n, n)
        means = (jnp.einsum("ckab,cb->cka", f, means) + offsets[nxt]).reshape(-1, means.shape[-1])
        covs = jnp.einsum("ckab,cbd,cked->ckae", f, covs, f) + noise_covs[nxt]
        covs = 0.5 * (covs + jnp.swapaxes(covs, -1, -2))
        covs = covs.reshape((-1,) + covs.shape[-2:])
        state = nxt.reshape(-1)
        record(weights, means, covs)
    return RegimePathMarginals(jnp.stack(out_w), jnp.stack(out_m), jnp.stack(out_c))


def companion(weights: jax.Array, biases: jax.Array,
              noise_covs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Companion form of per-regime VAR(L) regressions ``y_t = W_x [y_{t-1}; ...] + b_x + e``.

    Args:
        weights: ``(M, D, L D)``, ``[A_{x,1}, ..., A_{x,L}]``.
        biases: ``(M, D)``.
        noise_covs: ``(M, D, D)``.

    Returns:
        ``(dynamics (M, n, n), offsets (M, n), noise (M, n, n))`` with ``n = L D``: the
        first block row is the regression, the others shift the window down by ``D``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from statseq.inference.regime_paths import companion
        >>> f, c, q = companion(jnp.array([[[0.5, 0.25]]]), jnp.array([[1.0]]),
        ...                     jnp.array([[[2.0]]]))
        >>> f[0].tolist(), c[0].tolist(), q[0].tolist()
        ([[0.5, 0.25], [1.0, 0.0]], [1.0, 0.0], [[2.0, 0.0], [0.0, 0.0]])
    """
    m, d, n = weights.shape
    shift = jnp.broadcast_to(jnp.eye(n - d, n, dtype=weights.dtype), (m, n - d, n))
    dynamics = jnp.concatenate([weights, shift], axis=1)
    offsets = jnp.concatenate([biases, jnp.zeros((m, n - d), biases.dtype)], axis=1)
    noise = jnp.zeros((m, n, n), noise_covs.dtype).at[:, :d, :d].set(noise_covs)
    return dynamics, offsets, noise
