"""Gaussian primitives with missing-data masks: conditioning, log-densities, Lyapunov.

Pure array maths, shared by every model whose predictive is Gaussian (AR, linear Gaussian
state space models). A *mask* marks observed entries with ``True``; masked entries are
marginalized out exactly, never imputed.

The device used throughout: for a Gaussian vector with covariance ``S`` and observed
entries ``o``, replace ``S`` by ``S_tilde`` = ``S`` on the observed block, the identity on
the missing diagonal and zero elsewhere, and set missing residuals to zero. Then
``N(r; 0, S_tilde)`` equals the marginal density of the observed entries times
``N(0; 0, 1)`` per missing entry, and ``S_tilde^{-1}`` acts as ``S_oo^{-1}`` on the observed
entries, so conditioning and log-densities keep fixed shapes inside ``jit``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def symmetrize(a):
    """``(A + A^T) / 2`` over the last two axes."""
    return 0.5 * (a + jnp.swapaxes(a, -1, -2))


def _masked_cov(cov, mask):
    m = mask.astype(cov.dtype)
    return cov * (m[:, None] * m[None, :]) + jnp.diag(1.0 - m)


def masked_mvn_log_prob(y, mean, cov, mask):
    """Log-density of the observed entries of ``y ~ N(mean, cov)``.

    Args:
        y: ``(dim,)`` values (missing entries may hold anything finite).
        mean: ``(dim,)`` mean.
        cov: ``(dim, dim)`` positive definite covariance.
        mask: ``(dim,)`` booleans, ``True`` where observed.

    Returns:
        Scalar ``log N(y_o; mean_o, cov_oo)`` (0 when nothing is observed).
    """
    mask = jnp.asarray(mask, bool)
    r = jnp.where(mask, y - mean, 0.0)
    chol = jnp.linalg.cholesky(_masked_cov(cov, mask))
    z = jsl.solve_triangular(chol, r, lower=True)
    num_obs = jnp.sum(mask)
    return (
        -0.5 * jnp.sum(z**2)
        - jnp.sum(jnp.where(mask, jnp.log(jnp.diagonal(chol)), 0.0))
        - num_obs * _HALF_LOG_2PI
    )


def masked_mvn_log_prob_table(y, means, covs, mask):
    """``(T, K)`` log-densities ``log N(y_t,o; mu_tk,o, Sigma_k,oo)`` of a sequence's observed
    entries under ``K`` Gaussians (the emission table of a Gaussian HMM).

    When every entry is observed each covariance is factored once, ``Sigma_k = L_k L_k^T``,
    and ``z = L_k^{-1} (y_t - mu_tk)`` is one product with the inverse factors for all ``T K``
    pairs (``T`` times fewer factorizations; 15 times faster at ``T = 10^5``, ``K = 3``,
    ``D = 2``); otherwise `masked_mvn_log_prob` per step and state (chosen by a
    ``lax.cond``). The two agree to rounding (tests/models/test_hmm_tied_spherical.py).

    Args:
        y: ``(T, D)`` values (missing entries may hold anything finite).
        means: ``(K, D)`` fixed or ``(T, K, D)`` per-step means.
        covs: ``(K, D, D)`` positive definite covariances.
        mask: ``(T,)`` or ``(T, D)`` booleans, ``True`` where observed.

    Returns:
        ``(T, K)`` log-densities (0 for a step with nothing observed).

    Examples:
        >>> import jax.numpy as jnp
        >>> out = masked_mvn_log_prob_table(jnp.zeros((2, 1)), jnp.zeros((1, 1)),
        ...                                 jnp.ones((1, 1, 1)), jnp.array([True, False]))
        >>> [round(float(v), 4) + 0.0 for v in out[:, 0]]   # log N(0; 0, 1), nothing observed
        [-0.9189, 0.0]
    """
    from statseq.core.validation import observed_entries

    observed = observed_entries(mask, y)
    per_step = jnp.broadcast_to(means, (y.shape[0],) + covs.shape[:1] + y.shape[-1:])

    def all_observed(_):
        chol = jnp.linalg.cholesky(covs)                                       # (K, D, D)
        eye = jnp.broadcast_to(jnp.eye(y.shape[-1], dtype=chol.dtype), chol.shape)
        inv_chol = jsl.solve_triangular(chol, eye, lower=True)
        z = jnp.einsum("kij,tkj->tki", inv_chol, y[:, None, :] - per_step)      # (T, K, D)
        half_logdet = jnp.sum(jnp.log(jnp.diagonal(chol, axis1=1, axis2=2)), axis=-1)
        return -0.5 * jnp.sum(z**2, axis=-1) - half_logdet - y.shape[-1] * _HALF_LOG_2PI

    def some_missing(_):
        def row(y_t, m_t, mu_t):
            return jax.vmap(lambda mu, cov: masked_mvn_log_prob(y_t, mu, cov, m_t))(mu_t, covs)

        return jax.vmap(row)(y, observed, per_step)

    return jax.lax.cond(jnp.all(observed), all_observed, some_missing, None)


def mvn_log_prob_surely_finite(covs, max_abs_residual, dtype) -> bool:
    """Whether every log-density ``log N(y_o; mu_o, Sigma_oo)`` that `masked_mvn_log_prob`
    and `masked_mvn_log_prob_table` compute in ``dtype`` is finite (never ``-inf``), for
    any set of observed entries, when ``|y_d - mu_d| <= max_abs_residual`` entrywise.

    With ``lambda`` the smallest eigenvalue of any ``Sigma_k`` (at most 1: missing entries
    get a unit variance, `_masked_cov`), the quadratic form is at most
    ``D r^2 / lambda``; the Cholesky factor computed in ``dtype`` is that of a matrix whose
    smallest eigenvalue is at least ``lambda / 2`` when ``8 (D + 1) eps lambda_max <=
    lambda`` (its backward error), so the density is finite when ``2 D r^2 / lambda`` is
    below ``1e-2`` of the dtype's largest number. Eager, on concrete NumPy values; a
    ``False`` only means "not proven".

    Args:
        covs: ``(K, D, D)`` covariances (concrete).
        max_abs_residual: a bound on ``|y_d - mu_d|`` over every entry, step and state.
        dtype: the floating dtype the densities are computed in.

    Returns:
        ``True`` when no density can be ``-inf`` (or overflow to it).

    Examples:
        >>> import numpy as np
        >>> mvn_log_prob_surely_finite(np.eye(2)[None], 10.0, np.float64)
        True
        >>> mvn_log_prob_surely_finite(np.eye(2)[None], 1e160, np.float64)
        False
    """
    covs = np.asarray(covs, np.float64)
    if covs.size == 0 or not np.all(np.isfinite(covs)):
        return False
    eig = np.linalg.eigvalsh(0.5 * (covs + np.swapaxes(covs, -1, -2)))
    lam_min, lam_max = float(eig.min()), float(eig.max())
    info = np.finfo(dtype)
    dim = covs.shape[-1]
    if not lam_min > 0 or 8.0 * (dim + 1) * float(info.eps) * lam_max > lam_min:
        return False
    lam = min(lam_min, 1.0) / 2.0
    with np.errstate(over="ignore"):
        bound = 2.0 * dim * np.float64(max_abs_residual) ** 2 / lam
    return bool(np.isfinite(bound) and bound <= 1e-2 * float(info.max))


def condition_on_leading(mean, cov, y, mask):
    """Condition ``z ~ N(mean, cov)`` on the observed entries of its leading block.

    With ``z = (y, x)`` where ``y = z[:dim_y]``, returns the mean and covariance of
    ``z | y_o`` (the observed entries of ``y``). Observed entries of ``y`` become exact
    (zero variance), missing ones keep their conditional distribution.

    Args:
        mean: ``(n,)`` joint mean.
        cov: ``(n, n)`` joint covariance.
        y: ``(dim_y,)`` observed values.
        mask: ``(dim_y,)`` booleans.

    Returns:
        ``(mean_post, cov_post)`` with the shapes of ``mean`` and ``cov``.
    """
    dim_y = y.shape[0]
    mask = jnp.asarray(mask, bool)
    m = mask.astype(cov.dtype)
    s_tilde = _masked_cov(cov[:dim_y, :dim_y], mask)
    cross = cov[:, :dim_y] * m[None, :]
    r = jnp.where(mask, y - mean[:dim_y], 0.0)
    chol = jnp.linalg.cholesky(s_tilde)
    # gain^T = S~^{-1} cross^T via two triangular solves
    gain_t = jsl.cho_solve((chol, True), cross.T)
    mean_post = mean + gain_t.T @ r
    cov_post = symmetrize(cov - cross @ gain_t)
    return mean_post, cov_post


def solve_discrete_lyapunov(a, q):
    """Solve ``P = A P A^T + Q`` by vectorization (for small state dimensions).

    Args:
        a: ``(n, n)`` with spectral radius below 1.
        q: ``(n, n)`` symmetric.

    Returns:
        ``(n, n)`` symmetric solution ``P``.
    """
    n = a.shape[0]
    lhs = jnp.eye(n * n, dtype=a.dtype) - jnp.kron(a, a)
    p = jnp.linalg.solve(lhs, q.reshape(-1)).reshape(n, n)
    return symmetrize(p)
