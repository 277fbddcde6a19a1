"""Gaussian HMM: ``y_t | z_t = k ~ N(mu_k, Sigma_k)`` with full or diagonal covariances.

Also home of the conjugate priors of the Gaussian emission families, placed on the whole
``emissions`` node of the priors pytree (their ``log_prob`` takes the emissions NamedTuple):

* `NormalInverseWishart` for full covariances,
* `NormalInverseGamma` for diagonal ones (independent per entry),

and of `kmeans`, the k-means++ / Lloyd clustering used by the ``"data"`` initializers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import gammaln, multigammaln
from numpyro.distributions import constraints

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int, float_dtype
from statseq.inference.gaussian import condition_on_leading, masked_mvn_log_prob, symmetrize
from statseq.models.hmm.base import HMMBase
from statseq.models.hmm.poisson import _check_conjugate

_LOG_2PI = math.log(2.0 * math.pi)


class GaussianEmissions(NamedTuple):
    """Full-covariance Gaussian emissions.

    Attributes:
        means: ``(num_states, emission_dim)``.
        covs: ``(num_states, emission_dim, emission_dim)`` positive definite.
    """

    means: jax.Array
    covs: jax.Array


class DiagonalGaussianEmissions(NamedTuple):
    """Diagonal-covariance Gaussian emissions (entries independent given the state).

    Attributes:
        means: ``(num_states, emission_dim)``.
        variances: ``(num_states, emission_dim)`` positive.
    """

    means: jax.Array
    variances: jax.Array


# ------------------------------------------------------------------------------------------
# conjugate priors


def _is_concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


class NormalInverseWishart(dist.Distribution):
    """Normal-inverse-Wishart prior on full-covariance Gaussian emissions.

        Sigma_k ~ InvWishart(df, scale),    mu_k | Sigma_k ~ N(loc, Sigma_k / mean_precision)

    independently for every state ``k``. It is placed on the whole ``emissions`` node of
    the priors pytree, and ``log_prob`` takes a `GaussianEmissions`; with it,
    `statseq.fit_em` computes the MAP estimate (the joint mode of the NIW posterior,
    ``mu = m_n``, ``Sigma = Psi_n / (nu_n + D + 2)``).

    Args:
        loc: ``(D,)`` prior mean, or ``(K, D)`` one per state.
        mean_precision: ``kappa > 0``, the prior's worth in observations for the means.
        df: ``nu > D - 1`` degrees of freedom of the inverse Wishart.
        scale: ``(D, D)`` (or ``(K, D, D)``) positive definite scale ``Psi``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from statseq.models.hmm.gaussian import GaussianEmissions, NormalInverseWishart
        >>> prior = NormalInverseWishart(jnp.zeros(2), 1.0, 4.0, jnp.eye(2))
        >>> value = GaussianEmissions(jnp.zeros((3, 2)), jnp.tile(jnp.eye(2), (3, 1, 1)))
        >>> prior.log_prob(value).shape
        (3,)
    """

    arg_constraints = {
        "loc": constraints.real_vector,
        "mean_precision": constraints.positive,
        "df": constraints.positive,
        "scale": constraints.positive_definite,
    }
    pytree_data_fields = ("loc", "mean_precision", "df", "scale")
    support = constraints.dependent(is_discrete=False, event_dim=1)

    def __init__(self, loc, mean_precision, df, scale, *, validate_args=None):
        loc = jnp.asarray(loc)
        scale = jnp.asarray(scale)
        if loc.ndim < 1 or scale.ndim < 2 or scale.shape[-2:] != (loc.shape[-1],) * 2:
            raise ValueError(
                f"NormalInverseWishart needs loc (..., D) and scale (..., D, D); got shapes "
                f"{loc.shape} and {scale.shape}"
            )
        dim = loc.shape[-1]
        mean_precision, df = jnp.asarray(mean_precision), jnp.asarray(df)
        if _is_concrete(loc, scale, mean_precision, df):
            if not np.all(np.asarray(mean_precision) > 0):
                raise ValueError(f"mean_precision must be positive, got {mean_precision}")
            if not np.all(np.asarray(df) > dim - 1):
                raise ValueError(f"df must exceed emission_dim - 1 = {dim - 1}, got {df}")
            if not np.all(np.isfinite(np.asarray(np.linalg.cholesky(np.asarray(scale))))):
                raise ValueError("scale must be symmetric positive definite")
        batch_shape = jnp.broadcast_shapes(loc.shape[:-1], mean_precision.shape, df.shape,
                                           scale.shape[:-2])
        xp = np if _is_concrete(loc, scale, mean_precision, df) else jnp
        self.loc = jnp.asarray(xp.broadcast_to(loc, batch_shape + (dim,)))
        self.mean_precision = jnp.asarray(xp.broadcast_to(mean_precision, batch_shape))
        self.df = jnp.asarray(xp.broadcast_to(df, batch_shape))
        self.scale = jnp.asarray(xp.broadcast_to(scale, batch_shape + (dim, dim)))
        super().__init__(batch_shape=batch_shape, event_shape=(dim,),
                         validate_args=validate_args)

    def log_prob(self, value):
        """``log NIW(means, covs)`` per state: ``value`` is a `GaussianEmissions`."""
        mu, sigma = value.means, value.covs
        dim = mu.shape[-1]
        chol = jnp.linalg.cholesky(sigma)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
        diff = mu - self.loc
        z = jsl.solve_triangular(chol, diff[..., None], lower=True)[..., 0]
        kappa, nu, psi = self.mean_precision, self.df, self.scale
        log_normal = (0.5 * dim * (jnp.log(kappa) - _LOG_2PI) - 0.5 * logdet
                      - 0.5 * kappa * jnp.sum(z**2, axis=-1))
        psi_logdet = jnp.linalg.slogdet(psi)[1]
        trace = jnp.trace(jsl.cho_solve((chol, True), jnp.broadcast_to(psi, sigma.shape)),
                          axis1=-2, axis2=-1)
        log_iw = (0.5 * nu * psi_logdet - 0.5 * nu * dim * math.log(2.0)
                  - multigammaln(0.5 * nu, dim) - 0.5 * (nu + dim + 1.0) * logdet
                  - 0.5 * trace)
        return log_normal + log_iw

    def mode(self):
        """The joint mode ``(loc, scale / (df + D + 2))`` as a `GaussianEmissions`."""
        dim = self.event_shape[0]
        return GaussianEmissions(self.loc, self.scale / (self.df + dim + 2.0)[..., None, None])


class NormalInverseGamma(dist.Distribution):
    """Normal-inverse-gamma prior on diagonal Gaussian emissions, independent per entry.

        sigma2_kd ~ InvGamma(concentration, rate),
        mu_kd | sigma2_kd ~ N(loc_d, sigma2_kd / mean_precision)

    Placed on the whole ``emissions`` node; ``log_prob`` takes a
    `DiagonalGaussianEmissions` and sums over entries. The EM MAP is the joint mode,
    ``mu = m_n``, ``sigma2 = beta_n / (alpha_n + 3/2)``.

    Args:
        loc: prior mean, broadcastable to ``(D,)`` (or ``(K, D)``).
        mean_precision: ``kappa > 0``.
        concentration: ``alpha > 0``.
        rate: ``beta > 0``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from statseq.models.hmm.gaussian import (DiagonalGaussianEmissions,
        ...                                          NormalInverseGamma)
        >>> prior = NormalInverseGamma(jnp.zeros(2), 1.0, 2.0, 1.0)
        >>> prior.log_prob(DiagonalGaussianEmissions(jnp.zeros((3, 2)), jnp.ones((3, 2)))).shape
        (3,)
    """

    arg_constraints = {
        "loc": constraints.real_vector,
        "mean_precision": constraints.positive,
        "concentration": constraints.positive,
        "rate": constraints.positive,
    }
    pytree_data_fields = ("loc", "mean_precision", "concentration", "rate")
    support = constraints.dependent(is_discrete=False, event_dim=1)

    def __init__(self, loc, mean_precision, concentration, rate, *, validate_args=None):
        loc = jnp.atleast_1d(jnp.asarray(loc))
        arrays = [jnp.asarray(a) for a in (mean_precision, concentration, rate)]
        if _is_concrete(*arrays):
            for name, a in zip(("mean_precision", "concentration", "rate"), arrays, strict=True):
                if not np.all(np.asarray(a) > 0):
                    raise ValueError(f"{name} must be positive, got {a}")
        shape = jnp.broadcast_shapes(loc.shape, *(a.shape for a in arrays))
        xp = np if _is_concrete(loc, *arrays) else jnp
        self.loc = jnp.asarray(xp.broadcast_to(loc, shape))
        self.mean_precision, self.concentration, self.rate = (
            jnp.asarray(xp.broadcast_to(a, shape)) for a in arrays)
        super().__init__(batch_shape=shape[:-1], event_shape=shape[-1:],
                         validate_args=validate_args)

    def log_prob(self, value):
        """``log NIG(means, variances)`` summed over entries: ``value`` is diagonal emissions."""
        mu, var = value.means, value.variances
        kappa, alpha, beta = self.mean_precision, self.concentration, self.rate
        log_normal = (0.5 * (jnp.log(kappa) - _LOG_2PI - jnp.log(var))
                      - 0.5 * kappa * (mu - self.loc) ** 2 / var)
        log_ig = (alpha * jnp.log(beta) - gammaln(alpha) - (alpha + 1.0) * jnp.log(var)
                  - beta / var)
        return jnp.sum(log_normal + log_ig, axis=-1)

    def mode(self):
        """The joint mode ``(loc, rate / (concentration + 3/2))``."""
        return DiagonalGaussianEmissions(self.loc, self.rate / (self.concentration + 1.5))


# ------------------------------------------------------------------------------------------
# initialization helpers


def seed_from_key(key) -> int:
    """A NumPy seed from a ``jax.random`` key (typed or raw)."""
    return int(jax.random.randint(key, (), 0, 2**31 - 1))


def kmeans(x, num_clusters: int, *, seed: int, num_iters: int = 20):
    """k-means++ seeding then Lloyd iterations, in NumPy.

    Args:
        x: ``(n, d)`` rows (``n >= 1``).
        num_clusters: ``k``.
        seed: NumPy seed.
        num_iters: Lloyd iterations.

    Returns:
        ``(centers (k, d), labels (n,))``; with fewer distinct rows than ``k`` some centers
        repeat.
    """
    x = np.asarray(x, float)
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    centers = [x[rng.integers(n)]]
    for _ in range(1, num_clusters):
        d2 = np.min(((x[:, None, :] - np.asarray(centers)[None]) ** 2).sum(-1), axis=1)
        total = d2.sum()
        idx = rng.choice(n, p=d2 / total) if total > 0 else rng.integers(n)
        centers.append(x[idx])
    centers = np.asarray(centers)
    labels = np.zeros(n, int)
    for _ in range(num_iters):
        labels = np.argmin(((x[:, None, :] - centers[None]) ** 2).sum(-1), axis=1)
        new = centers.copy()
        for j in range(num_clusters):
            if np.any(labels == j):
                new[j] = x[labels == j].mean(axis=0)
        if np.allclose(new, centers):
            break
        centers = new
    return centers, labels


def _observed_moments(rows, obs):
    """Per-entry mean and variance over observed entries, and the covariance of complete
    rows (diagonal of the variances when there are too few)."""
    dim = rows.shape[1]
    count = obs.sum(axis=0)
    if np.any(count == 0):
        raise ValueError(f"emission dimension(s) {np.flatnonzero(count == 0).tolist()} have "
                         "no observed values")
    mean = np.where(obs, rows, 0.0).sum(0) / count
    var = np.where(obs, (rows - mean) ** 2, 0.0).sum(0) / count
    var = np.where(var > 0, var, 1.0)
    complete = rows[obs.all(axis=1)]
    if complete.shape[0] > dim + 1:
        cov = np.cov(complete.T, bias=True).reshape(dim, dim)
        cov = cov + 1e-3 * np.diag(var)
    else:
        cov = np.diag(var)
    return mean, var, cov


def _cluster_covs(filled, labels, centers, global_cov):
    """Per-cluster covariances shrunk toward ``global_cov`` (always positive definite)."""
    dim = filled.shape[1]
    covs = []
    for j in range(centers.shape[0]):
        pts = filled[labels == j]
        n = pts.shape[0]
        scatter = (pts - centers[j]).T @ (pts - centers[j]) if n else np.zeros((dim, dim))
        covs.append((scatter + (dim + 2) * global_cov) / (n + dim + 2))
    return np.asarray(covs)


# ------------------------------------------------------------------------------------------
# the model


@register_model
@dataclasses.dataclass(frozen=True)
class GaussianHMM(HMMBase):
    """Hidden Markov model with multivariate Gaussian emissions.

        z_t | z_{t-1} ~ Categorical(A[z_{t-1}]),    y_t | z_t = k ~ N(mu_k, Sigma_k),

    with ``y_t`` in ``R^D`` (event shape ``(D,)``) and ``Sigma_k`` full or diagonal.

    Missing entries (per-entry masks) are marginalized exactly: the likelihood uses the
    Gaussian marginal of the observed entries. EM (`statseq.fit_em`) is exact with
    partially observed vectors too: for full covariances the M-step uses
    ``E[y_miss | y_obs, z = k]`` and adds the conditional covariance to the scatter; for
    diagonal ones each entry has its own weights. Steps with nothing observed contribute
    nothing.

    Conjugate priors for MAP estimates sit on the whole ``emissions`` node:
    ``HMMParams(initial_probs=None, transitions=None, emissions=NormalInverseWishart(...))``
    (full) or ``NormalInverseGamma(...)`` (diagonal).

    Collapse guard: every M-step adds ``min_variance`` to the covariance diagonal (after the
    closed-form update), so a state that sits on one point keeps a finite likelihood. Set
    ``min_variance=0`` for the exact (MAP) update.

    Args:
        num_states: number of hidden states ``K``.
        emission_dim: ``D``.
        covariance: ``"full"`` (`GaussianEmissions`) or ``"diagonal"``
            (`DiagonalGaussianEmissions`); explicit, never inferred.
        initial: ``"free"`` or ``"stationary"``.
        input_dim: covariates driving the transitions (0 for a fixed matrix).
        min_variance: added to covariance diagonals in each M-step (default ``1e-6``).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> from statseq.models.hmm.gaussian import GaussianHMM
        >>> y = np.concatenate([np.zeros((20, 2)), 5 + np.ones((20, 2))])
        >>> y = y + np.random.default_rng(0).normal(size=y.shape)
        >>> model = GaussianHMM(num_states=2, emission_dim=2)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> fit = ss.fit_em(model, params, y, num_iters=20, progress=False)
        >>> fit.params.emissions.covs.shape
        (2, 2, 2)
    """

    num_states: int = 2
    emission_dim: int = 1
    covariance: str = "full"
    initial: str = "free"
    input_dim: int = 0
    min_variance: float = 1e-6

    def __post_init__(self):
        self._check_hmm_config()
        check_positive_int(self.emission_dim, "emission_dim")
        if self.covariance not in ("full", "diagonal"):
            raise ValueError(
                f"covariance must be 'full' or 'diagonal', got {self.covariance!r}")
        _check_min_variance(self)

    @property
    def event_shape(self):
        return (self.emission_dim,)

    @property
    def _full(self) -> bool:
        return self.covariance == "full"

    def emission_shapes(self):
        k, d = self.num_states, self.emission_dim
        if self._full:
            return GaussianEmissions((k, d), (k, d, d))
        return DiagonalGaussianEmissions((k, d), (k, d))

    def default_priors(self, y, mask=None):
        """Bayesian defaults with per-dimension scales (``m_d``, ``s_d``: mean and standard
        deviation of the observed values of dimension ``d``): means ``N(m_d, (2 s_d)^2)``;
        full covariances `statseq.bayes.LKJCovariance` (LKJ(2) correlations, half-normal
        ``2 s_d`` scales), diagonal variances ``LogNormal(log s_d^2, 2)``; the initial law
        and transitions as in `HMMBase.default_priors`."""
        from statseq.bayes.priors import LKJCovariance  # the Bayesian layer sits above models

        d, k, dtype = self.emission_dim, self.num_states, float_dtype()
        arr = np.asarray(y, float)
        obs = np.isfinite(arr)
        if mask is not None:
            m = np.asarray(mask, bool)
            obs &= np.broadcast_to(m.reshape(m.shape + (1,) * (arr.ndim - m.ndim)), arr.shape)
        arr, obs = arr.reshape(-1, d), obs.reshape(-1, d)
        mean = np.array([arr[obs[:, j], j].mean() if obs[:, j].any() else 0.0 for j in range(d)])
        sd = np.array([arr[obs[:, j], j].std() if obs[:, j].sum() > 1 else 1.0
                       for j in range(d)])
        sd = np.where(sd > 0, sd, 1.0)
        means = dist.Normal(jnp.asarray(np.broadcast_to(mean, (k, d)), dtype),
                            jnp.asarray(2.0 * sd, dtype))
        if self._full:
            emissions = GaussianEmissions(
                means, LKJCovariance(d, jnp.asarray(np.broadcast_to(2.0 * sd, (k, d)), dtype)))
        else:
            emissions = DiagonalGaussianEmissions(
                means, dist.LogNormal(jnp.asarray(np.broadcast_to(np.log(sd ** 2), (k, d)),
                                                  dtype), 2.0))
        return HMMBase.default_priors(self, y, mask)._replace(emissions=emissions)

    def emission_constraints(self):
        if self._full:
            return GaussianEmissions(constraints.real, constraints.positive_definite)
        return DiagonalGaussianEmissions(constraints.real, constraints.positive)

    def emission_log_likelihoods(self, emissions, y_t, mask_t):
        mask_t = jnp.broadcast_to(jnp.asarray(mask_t, bool), y_t.shape)
        if self._full:
            return jax.vmap(lambda mu, cov: masked_mvn_log_prob(y_t, mu, cov, mask_t))(
                emissions.means, emissions.covs)
        lp = dist.Normal(emissions.means, jnp.sqrt(emissions.variances)).log_prob(y_t)
        return jnp.sum(jnp.where(mask_t, lp, 0.0), axis=-1)

    def emission_distribution(self, emissions):
        if self._full:
            return dist.MultivariateNormal(emissions.means, covariance_matrix=emissions.covs)
        return dist.Independent(dist.Normal(emissions.means, jnp.sqrt(emissions.variances)), 1)

    # ---- EM ---------------------------------------------------------------------------
    def e_step(self, params, y, mask, inputs):
        """The base E-step, with emission statistics that use the current emissions
        (conditional expectations of missing entries; centering for accuracy)."""
        stats, log_prob = super().e_step(params, y, mask, inputs)
        stats["emissions"] = self.emission_suff_stats(y, mask, stats["weights"],
                                                      emissions=params.emissions)
        return stats, log_prob

    def emission_suff_stats(self, y, mask, weights, emissions=None):
        """Weighted statistics centered at the current means.

        Full covariance: ``sum_w (K,)``, ``sum_wy (K, D)`` and ``sum_wyy (K, D, D)`` of
        ``y - center`` with missing entries replaced by ``E[y_miss | y_obs, z = k]`` and the
        conditional covariance added to ``sum_wyy`` (exact EM). Without ``emissions`` the
        statistics are uncentered and partially observed steps are dropped (exact only for
        whole-step masks); `e_step` always passes them.

        Diagonal: the same per entry, ``(K, D)`` each, with per-entry weights.
        """
        dtype = weights.dtype
        k, d = self.num_states, self.emission_dim
        y = y.astype(dtype)
        m = mask.astype(dtype)
        center = (jnp.zeros((k, d), dtype) if emissions is None
                  else jax.lax.stop_gradient(emissions.means).astype(dtype))
        if not self._full:
            r = y[:, :, None, :] - center  # (N, T, K, D)
            wm = weights[..., None] * m[:, :, None, :]  # (N, T, K, D)
            return {"sum_w": jnp.sum(wm, axis=(0, 1)),
                    "sum_wy": jnp.sum(wm * r, axis=(0, 1)),
                    "sum_wyy": jnp.sum(wm * r**2, axis=(0, 1)),
                    "center": center}
        if emissions is None:
            w = weights * jnp.all(mask, axis=-1)[..., None].astype(dtype)
            return {"sum_w": jnp.sum(w, axis=(0, 1)),
                    "sum_wy": jnp.einsum("ntk,ntd->kd", w, y),
                    "sum_wyy": jnp.einsum("ntk,ntd,nte->kde", w, y, y),
                    "center": center}
        w = weights * jnp.any(mask, axis=-1)[..., None].astype(dtype)
        covs = jax.lax.stop_gradient(emissions.covs).astype(dtype)

        def conditional(y_t, m_t):
            # E[y_t - mu_k | y_obs, z = k] and Cov[y_t | y_obs, z = k] for every k; exact
            # (not just up to rounding) on the observed entries
            def one(mu, cov):
                r, c = condition_on_leading(jnp.zeros_like(mu), cov, y_t - mu, m_t)
                miss = ~m_t
                return (jnp.where(m_t, y_t - mu, r),
                        jnp.where(miss[:, None] & miss[None, :], c, 0.0))

            return jax.vmap(one)(center, covs)

        ey, cond_cov = jax.vmap(jax.vmap(conditional))(y, mask)  # (N,T,K,D), (N,T,K,D,D)
        return {"sum_w": jnp.sum(w, axis=(0, 1)),
                "sum_wy": jnp.einsum("ntk,ntkd->kd", w, ey),
                "sum_wyy": (jnp.einsum("ntk,ntkd,ntke->kde", w, ey, ey)
                            + jnp.einsum("ntk,ntkde->kde", w, cond_cov)),
                "center": center}

    def emission_m_step(self, emissions, stats, prior):
        """Closed-form MLE, or the MAP under a NIW (full) / NIG (diagonal) prior; states
        (entries) without mass keep their values; ``min_variance`` is added last."""
        w, s1, s2, c = stats["sum_w"], stats["sum_wy"], stats["sum_wyy"], stats["center"]
        # with xbar = s1 / w (centered), d = xbar - (m0 - c) and S the scatter about xbar:
        #   mean = m0 + w d / (kappa0 + w),  Psi_n = Psi0 + S + kappa0 w / (kappa0 + w) d d^T
        # (written so that a state without data gets exactly the prior's mode)
        empty = w <= 1e-12 * jnp.maximum(1.0, jnp.max(w))
        safe = jnp.where(empty, 1.0, w)
        if self._full:
            d = self.emission_dim
            xbar = s1 / safe[:, None]
            scatter = jnp.where(empty[:, None, None], 0.0,
                                s2 - safe[:, None, None] * xbar[:, :, None] * xbar[:, None, :])
            if prior is None:
                means = c + xbar
                cov = scatter / safe[:, None, None]
            else:
                kappa0 = jnp.broadcast_to(prior.mean_precision, w.shape)
                m0 = jnp.broadcast_to(prior.loc, s1.shape)
                e = s1 - w[:, None] * (m0 - c)  # = w d
                means = m0 + e / (kappa0 + w)[:, None]
                coef = kappa0 / ((kappa0 + w) * safe)
                psi = (jnp.broadcast_to(prior.scale, s2.shape) + scatter
                       + coef[:, None, None] * e[:, :, None] * e[:, None, :])
                cov = psi / (jnp.broadcast_to(prior.df, w.shape) + w + d + 2.0)[:, None, None]
                empty = jnp.zeros_like(empty)  # the MAP exists without data: the prior mode
            means = jnp.where(empty[:, None], emissions.means, means)
            covs = symmetrize(cov) + self.min_variance * jnp.eye(d, dtype=s1.dtype)
            covs = jnp.where(empty[:, None, None], emissions.covs, covs)
            return GaussianEmissions(means, covs)
        xbar = s1 / safe
        scatter = jnp.where(empty, 0.0, s2 - safe * xbar**2)
        if prior is None:
            means = c + xbar
            var = scatter / safe
        else:
            kappa0 = jnp.broadcast_to(prior.mean_precision, w.shape)
            m0 = jnp.broadcast_to(prior.loc, w.shape)
            e = s1 - w * (m0 - c)
            means = m0 + e / (kappa0 + w)
            beta = (jnp.broadcast_to(prior.rate, w.shape)
                    + 0.5 * (scatter + kappa0 / ((kappa0 + w) * safe) * e**2))
            alpha = jnp.broadcast_to(prior.concentration, w.shape) + 0.5 * w
            var = beta / (alpha + 1.5)
            empty = jnp.zeros_like(empty)
        means = jnp.where(empty, emissions.means, means)
        var = jnp.where(empty, emissions.variances, jnp.maximum(var, 0.0) + self.min_variance)
        return DiagonalGaussianEmissions(means, var)

    def validate_em_priors(self, priors):
        """EM's closed form needs a NormalInverseWishart (full) or NormalInverseGamma
        (diagonal) prior on the whole emissions node, and Dirichlet priors on simplexes."""
        _check_emission_node_prior(
            priors, NormalInverseWishart if self._full else NormalInverseGamma)

    # ---- initialization -----------------------------------------------------------------
    def initialize_emissions(self, y, mask, *, key, method):
        """``"data"``: k-means (k-means++ seeding from ``key``) on the steps with observed
        entries (missing entries filled with the entry's mean), cluster covariances shrunk
        toward the overall covariance. ``"random"``: means are ``K`` k-means++ seeds (data rows
        drawn with probability proportional to their squared distance from the rows drawn
        before), covariances the overall covariance times a random factor in [1/4, 1]."""
        k, d = self.num_states, self.emission_dim
        rows = np.asarray(y, float).reshape(-1, d)
        obs = np.asarray(mask, bool).reshape(-1, d)
        mean, var, global_cov = _observed_moments(rows, obs)
        keep = obs.any(axis=1)
        filled = np.where(obs, rows, mean)[keep]
        seed = seed_from_key(key)
        rng = np.random.default_rng(seed)
        if method == "data":
            centers, labels = kmeans(filled, k, seed=seed)
            covs = _cluster_covs(filled, labels, centers, global_cov)
            order = np.argsort(centers[:, 0], kind="stable")
            means, covs = centers[order], covs[order]
        elif method == "random":
            # k-means++ seeds (data rows spread over the data), the overall covariance
            # shrunk by a random factor in [1/4, 1] (clusters are narrower than the data)
            means, _ = kmeans(filled, k, seed=seed, num_iters=0)
            covs = np.broadcast_to(global_cov, (k, d, d)) * rng.uniform(0.25, 1.0)
        else:
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        covs = 0.5 * (covs + np.swapaxes(covs, -1, -2)) + self.min_variance * np.eye(d)
        dtype = float_dtype()
        if self._full:
            return GaussianEmissions(jnp.asarray(means, dtype), jnp.asarray(covs, dtype))
        return DiagonalGaussianEmissions(
            jnp.asarray(means, dtype), jnp.asarray(np.diagonal(covs, axis1=1, axis2=2), dtype))


def _check_min_variance(model) -> None:
    value = model.min_variance
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise TypeError(f"min_variance must be a number, got {type(value).__name__}")
    if not (math.isfinite(float(value)) and float(value) >= 0):
        raise ValueError(f"min_variance must be finite and >= 0, got {value}")
    object.__setattr__(model, "min_variance", float(value))


def _check_emission_node_prior(priors, kind) -> None:
    """Dirichlet priors on simplexes; on emissions, ``kind`` on the whole node or nothing."""
    if priors is None:
        return
    _check_conjugate(priors._replace(emissions=None), {})
    em = priors.emissions
    if em is None or isinstance(em, kind):
        return
    if isinstance(em, tuple) and all(leaf is None for leaf in em):
        return
    raise ValueError(
        f"fit_em needs a conjugate {kind.__name__} prior on the whole emissions node "
        f"(priors.emissions={kind.__name__}(...)) for its closed-form M-step, got "
        f"{type(em).__name__}; use fit_sgd for other priors"
    )
