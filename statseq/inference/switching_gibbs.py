"""Blocked Gibbs sampling of the regimes and states of a switching linear dynamical system.

For the model of `statseq.inference.switching_kalman` with known parameters, the joint
posterior ``p(z_{0:T-1}, x_{0:T-1} | y)`` is sampled by alternating two exact blocks:

- ``x | z, y``: given the regime path the model is a time-varying linear Gaussian state
  space model, sampled by the simulation smoother `statseq.inference.kalman.sample_posterior`
  (forward filtering, backward sampling of the whole path);
- ``z | x, y``: given the states the regimes form an HMM with emission log-likelihoods

      l_t(k) = log N(x_t; A_k x_{t-1} + B_k u_t + b_k, Q_k) + log N(y_t; C_k x_t + D_k u_t
               + d_k, R_k)     (t > 0; at t = 0 the first term is log N(x_0; m_k, V_k)),

  sampled by `statseq.inference.hmm.hmm_posterior_sample`.

With input-driven transitions ``z | x, y`` is an HMM with the time-varying transition
matrices of the known inputs (still exact); recurrent transitions are refused.

The chain's draws converge to the exact posterior (unlike Kim's collapsed smoother), at the
cost of Monte Carlo error and autocorrelation. The state densities need positive definite
``Q_k`` and ``V_k``. The functions are not jitted themselves.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from statseq.inference import hmm, kalman
from statseq.inference.gaussian import masked_mvn_log_prob
from statseq.inference.switching_kalman import SwitchingArrays, transition_matrix_at


class GibbsSamples(NamedTuple):
    """Output of `switching_gibbs`.

    Attributes:
        regimes: ``(S, T)`` int32 draws of ``z_{0:T-1}``.
        states: ``(S, T, n)`` draws of ``x_{0:T-1}``.
    """

    regimes: Any
    states: Any


def path_arrays(arrays: SwitchingArrays, path: jax.Array) -> kalman.GaussianSSMArrays:
    """The time-varying linear Gaussian model of one regime path ``z_{0:T-1}`` (``T >= 2``):
    the initial law of ``z_0``, the dynamics of step ``t -> t + 1`` from ``z_{t+1}``, the
    emission of step ``t`` from ``z_t``."""
    reg = arrays.regimes
    nxt = path[1:]
    return kalman.GaussianSSMArrays(
        reg.initial_mean[path[0]], reg.initial_cov[path[0]], reg.dynamics_weights[nxt],
        reg.dynamics_input_weights[nxt], reg.dynamics_bias[nxt], reg.dynamics_cov[nxt],
        reg.emission_weights[path], reg.emission_input_weights[path],
        reg.emission_bias[path], reg.emission_cov[path], reg.initial_diffuse[0])


def check_no_recurrence(arrays: SwitchingArrays) -> None:
    """Refuse recurrent transitions: given the regimes, the states' law then carries the
    non-Gaussian factors ``p(z_t | z_{t-1}, x_{t-1})`` and the simulation smoother is not
    an exact draw of ``x | z, y``."""
    if arrays.recurrent_weights is not None:
        raise ValueError("Gibbs sampling does not support recurrent transitions (x | z "
                         "is not Gaussian with them); use the Kim smoother or the "
                         "particle filter")


def path_transitions(arrays: SwitchingArrays, inputs: jax.Array) -> jax.Array:
    """The transition matrix ``(K, K)``, or with input-driven transitions the ``(T-1, K,
    K)`` matrices of the steps into ``t = 1, ..., T-1`` (exact: known inputs)."""
    check_no_recurrence(arrays)
    if arrays.transition_input_weights is None:
        return arrays.transition_matrix
    n = arrays.regimes.initial_mean.shape[-1]
    zeros = jnp.zeros((arrays.transition_matrix.shape[0], n), arrays.regimes.initial_cov.dtype)
    return jax.vmap(lambda u: transition_matrix_at(arrays, u, zeros))(inputs[1:])


def regime_log_likelihoods(arrays: SwitchingArrays, states: jax.Array, y: jax.Array,
                           mask: jax.Array, inputs: jax.Array) -> jax.Array:
    """``(T, K)`` table ``l_t(k)`` of the module docstring (the HMM of ``z`` given ``x``)."""
    reg = arrays.regimes
    first = jnp.arange(states.shape[0]) == 0

    def one(k):
        dyn_mean = (states[:-1] @ reg.dynamics_weights[k].T + inputs[1:]
                    @ reg.dynamics_input_weights[k].T + reg.dynamics_bias[k])
        dyn_mean = jnp.concatenate([reg.initial_mean[k][None], dyn_mean])
        ones = jnp.ones(states.shape[1], bool)

        def trans(x, m, f):
            cov = jnp.where(f, reg.initial_cov[k], reg.dynamics_cov[k])
            return masked_mvn_log_prob(x, m, cov, ones)

        lx = jax.vmap(trans)(states, dyn_mean, first)
        y_mean = (states @ reg.emission_weights[k].T + inputs @ reg.emission_input_weights[k].T
                  + reg.emission_bias[k])
        ly = jax.vmap(lambda yy, m, o: masked_mvn_log_prob(yy, m, reg.emission_cov[k], o))(
            y, y_mean, mask)
        return lx + ly

    return jax.vmap(one, out_axes=1)(jnp.arange(arrays.initial_probs.shape[0]))


def gibbs_sweep(arrays: SwitchingArrays, y: jax.Array, mask: jax.Array, inputs: jax.Array,
                regimes: jax.Array, key: jax.Array) -> tuple:
    """One sweep: ``x ~ p(x | z, y)``, then ``z ~ p(z | x, y)``.

    Returns:
        ``(new regimes (T,), states (T, n))``.
    """
    k_x, k_z = jax.random.split(key)
    states = kalman.sample_posterior(path_arrays(arrays, regimes), y, mask, inputs, k_x, 1)[0]
    ll = regime_log_likelihoods(arrays, states, y, mask, inputs)
    new = hmm.hmm_posterior_sample(arrays.initial_probs, path_transitions(arrays, inputs),
                                   ll, key=k_z)
    return new.astype(jnp.int32), states


def switching_gibbs(arrays: SwitchingArrays, y: jax.Array, mask: jax.Array,
                    inputs: jax.Array, initial_regimes: jax.Array, *, key: jax.Array,
                    num_samples: int, num_burnin: int = 0) -> GibbsSamples:
    """Draws from ``p(z, x | y)`` by blocked Gibbs sampling (module docstring).

    Args:
        arrays: the model (`statseq.inference.switching_kalman.SwitchingArrays`).
        y: ``(T, D)`` observations, ``T >= 2``.
        mask: ``(T, D)`` booleans (``True`` = observed).
        inputs: ``(T, m)`` inputs.
        initial_regimes: ``(T,)`` the chain's starting regime path.
        key: a ``jax.random`` key.
        num_samples: draws kept (static).
        num_burnin: sweeps discarded first (static).

    Returns:
        `GibbsSamples` (each kept draw is the state after one sweep).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference import kalman
        >>> from statseq.inference.switching_kalman import SwitchingArrays, transition_matrix_at
        >>> from statseq.inference.switching_gibbs import switching_gibbs
        >>> one = lambda v: jnp.full((2, 1, 1), v)
        >>> regimes = kalman.GaussianSSMArrays(
        ...     jnp.zeros((2, 1)), one(1.0), jnp.array([[[0.9]], [[-0.5]]]),
        ...     jnp.zeros((2, 1, 0)), jnp.zeros((2, 1)), one(0.5), one(1.0),
        ...     jnp.zeros((2, 1, 0)), jnp.zeros((2, 1)), one(0.1), jnp.zeros((2, 1, 0)))
        >>> arrays = SwitchingArrays(jnp.array([0.5, 0.5]),
        ...                          jnp.array([[0.9, 0.1], [0.1, 0.9]]), regimes)
        >>> y = jnp.array([[0.3], [0.5], [-0.2]])
        >>> out = switching_gibbs(arrays, y, jnp.ones_like(y, bool), jnp.zeros((3, 0)),
        ...                       jnp.zeros(3, jnp.int32), key=jax.random.key(0),
        ...                       num_samples=5, num_burnin=5)
        >>> out.regimes.shape, out.states.shape
        ((5, 3), (5, 3, 1))
    """
    if y.shape[0] < 2:
        raise ValueError(f"switching_gibbs needs at least 2 time steps, got {y.shape[0]}")
    for name, val, low in (("num_samples", num_samples, 1), ("num_burnin", num_burnin, 0)):
        if isinstance(val, bool) or not isinstance(val, int) or val < low:
            raise ValueError(f"{name} must be an int >= {low}, got {val!r}")
    n = arrays.regimes.initial_mean.shape[-1]
    dtype = arrays.regimes.initial_cov.dtype

    def sweep(z, k):
        z, x = gibbs_sweep(arrays, y, mask, inputs, z, k)
        return z, (z, x)

    # one scan over every sweep (a second one for the burn-in would compile the sweep twice)
    keys = jax.random.split(key, num_burnin + num_samples)
    z = jnp.asarray(initial_regimes, jnp.int32)
    _, (zs, xs) = jax.lax.scan(sweep, z, keys)
    return GibbsSamples(zs[num_burnin:],
                        xs[num_burnin:].astype(dtype).reshape(num_samples, y.shape[0], n))


# ---- conjugate parameter updates ---------------------------------------------------------
def inverse_wishart_shapes(df: jax.Array, dim: int) -> jax.Array:
    """``(dim,)`` Gamma shapes ``(df - i) / 2`` whose doubled draws are the chi-square
    diagonal of Bartlett's decomposition (`sample_inverse_wishart`'s ``gammas``)."""
    return 0.5 * (df - jnp.arange(dim, dtype=jnp.result_type(df, float)))


def sample_inverse_wishart(key: jax.Array, df: jax.Array, scale: jax.Array,
                           gammas: jax.Array | None = None) -> jax.Array:
    """A draw of ``Sigma ~ InvWishart(df, scale)`` (mean ``scale / (df - d - 1)``), as the
    inverse of a Wishart(``df``, ``scale^{-1}``) draw by Bartlett's decomposition.

    ``gammas`` (optional, ``(d,)``): Gamma draws with the shapes of
    `inverse_wishart_shapes`, made by the caller (one ``jax.random.gamma`` call for many
    draws compiles one rejection sampler instead of many).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.switching_gibbs import sample_inverse_wishart
        >>> s = sample_inverse_wishart(jax.random.key(0), jnp.asarray(5.0), jnp.eye(2))
        >>> s.shape, bool(jnp.all(jnp.linalg.eigvalsh(s) > 0))
        ((2, 2), True)
    """
    d = scale.shape[-1]
    k_c, k_n = jax.random.split(key)
    if gammas is None:
        gammas = jax.random.gamma(k_c, inverse_wishart_shapes(df, d).astype(scale.dtype))
    diag = jnp.sqrt(2.0 * gammas)  # chi2(df - i) on the diagonal
    lower = jnp.tril(jax.random.normal(k_n, (d, d), scale.dtype), -1)
    bart = lower + jnp.diag(diag)
    chol = jnp.linalg.cholesky(jnp.linalg.inv(scale))  # Wishart scale scale^{-1}
    factor = chol @ bart  # W = F F^T
    inv_f = jax.scipy.linalg.solve_triangular(factor, jnp.eye(d, dtype=scale.dtype),
                                              lower=True)
    return 0.5 * ((inv_f.T @ inv_f) + (inv_f.T @ inv_f).T)


def sample_regression(key: jax.Array, regressors: jax.Array, targets: jax.Array,
                      weights: jax.Array, precision: jax.Array, df: jax.Array,
                      scale: jax.Array, gammas: jax.Array | None = None) -> tuple:
    """A draw of ``(W, Sigma)`` from the matrix-normal-inverse-Wishart posterior of the
    regression ``targets_t = W regressors_t + N(0, Sigma)`` over the rows with
    ``weights_t = 1``, under the prior ``Sigma ~ InvWishart(df, scale)``,
    ``W | Sigma ~ MN(0, Sigma, (precision I)^{-1})``:

        Lambda = precision I + X^T G X,   M = Y^T G X Lambda^{-1},
        Sigma ~ InvWishart(df + sum(G), scale + Y^T G Y - M Lambda M^T),
        W | Sigma ~ MN(M, Sigma, Lambda^{-1})        (G = diag(weights)).

    Args:
        key: a ``jax.random`` key.
        regressors: ``(N, p)``.
        targets: ``(N, d)``.
        weights: ``(N,)`` 0/1 row selection.
        precision: prior precision ``> 0`` of the coefficients.
        df: prior degrees of freedom ``> d - 1``.
        scale: ``(d, d)`` prior scale.
        gammas: optional Gamma draws for the inverse Wishart (`sample_inverse_wishart`),
            with shapes ``inverse_wishart_shapes(df + sum(weights), d)``.

    Returns:
        ``(W (d, p), Sigma (d, d))``.
    """
    k_s, k_w = jax.random.split(key)
    x, y, g = regressors, targets, weights[:, None]
    p = x.shape[1]
    lam = precision * jnp.eye(p, dtype=x.dtype) + (x * g).T @ x
    lam_chol = jnp.linalg.cholesky(lam)
    m = jax.scipy.linalg.cho_solve((lam_chol, True), ((x * g).T @ y)).T  # (d, p)
    psi = scale + (y * g).T @ y - m @ lam @ m.T
    sigma = sample_inverse_wishart(k_s, df + jnp.sum(weights), 0.5 * (psi + psi.T), gammas)
    z = jax.random.normal(k_w, m.shape, x.dtype)
    # W = M + chol(Sigma) Z chol(Lambda^{-1})^T, chol(Lambda^{-1})^T = Lambda_chol^{-1}...
    right = jax.scipy.linalg.solve_triangular(lam_chol.T, z.T, lower=False).T
    return m + jnp.linalg.cholesky(sigma) @ right, sigma
