"""Gaussian HMM: ``y_t | z_t = k ~ N(mu_k, Sigma_k)`` with full, diagonal, tied or spherical
covariances.

The emission NamedTuples and their conjugate priors (`NormalInverseWishart`,
`NormalInverseGamma`) live in `statseq.models.hmm.gaussian_params` and are re-exported
here. Also home of `kmeans`, the k-means++ / Lloyd clustering used by the ``"data"``
initializers.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.model import register_model
from statseq.core.validation import check_positive_int, float_dtype
from statseq.inference.gaussian import (
    condition_on_leading,
    masked_mvn_log_prob,
    masked_mvn_log_prob_table,
    mvn_log_prob_surely_finite,
    symmetrize,
)
from statseq.models.hmm.base import HMMBase
from statseq.models.hmm.gaussian_params import (
    DiagonalGaussianEmissions,
    GaussianEmissions,
    NormalInverseGamma,
    NormalInverseWishart,
    SphericalGaussianEmissions,
    TiedGaussianEmissions,
    covariances_by_state,
)
from statseq.models.hmm.poisson import _check_conjugate

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


#: Random starts scale the overall covariance by ``10^u`` per state, ``u ~ U(-2, 0)``: states
#: narrower than the data by up to two decades (see ``GaussianHMM.initialize_emissions``).
_RANDOM_VARIANCE_DECADES = 2.0


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


def _gaussian_surely_finite(covs, y, mean_bound) -> bool:
    """`mvn_log_prob_surely_finite` for data ``y`` (concrete; read back) and means bounded
    by ``mean_bound(max |y|)``, in the lower precision of the covariances and data."""
    y = np.asarray(y)
    covs = np.asarray(covs)
    if not np.all(np.isfinite(y)):
        return False
    y_max = float(np.max(np.abs(y), initial=0.0))
    dtypes = [covs.dtype] + ([y.dtype] if np.issubdtype(y.dtype, np.floating) else [])
    dtype = max(dtypes, key=lambda d: np.finfo(d).eps)
    with np.errstate(over="ignore", invalid="ignore"):
        residual = np.float64(y_max) + np.float64(mean_bound(y_max))
    return mvn_log_prob_surely_finite(covs, residual, dtype)


# ------------------------------------------------------------------------------------------
# the model


@register_model
@dataclasses.dataclass(frozen=True)
class GaussianHMM(HMMBase):
    """Hidden Markov model with multivariate Gaussian emissions.

        z_t | z_{t-1} ~ Categorical(A[z_{t-1}]),    y_t | z_t = k ~ N(mu_k, Sigma_k),

    with ``y_t`` in ``R^D`` (event shape ``(D,)``) and ``Sigma_k`` full, diagonal, tied
    (``Sigma_k = Sigma`` for every state: hmmlearn's ``"tied"``, Stata's ``mswitch``
    default, dynamax's ``SharedCovarianceGaussianHMM``) or spherical
    (``Sigma_k = sigma_k^2 I``: hmmlearn's ``"spherical"``).

    Missing entries (per-entry masks) are marginalized exactly: the likelihood uses the
    Gaussian marginal of the observed entries. EM (`statseq.fit_em`) is exact with
    partially observed vectors too: for full covariances the M-step uses
    ``E[y_miss | y_obs, z = k]`` and adds the conditional covariance to the scatter; for
    diagonal ones each entry has its own weights. Steps with nothing observed contribute
    nothing.

    Conjugate priors for MAP estimates sit on the whole ``emissions`` node:
    ``HMMParams(initial_probs=None, transitions=None, emissions=NormalInverseWishart(...))``
    (full, tied) or ``NormalInverseGamma(...)`` (diagonal, spherical).

    Collapse guard: every M-step adds ``min_variance`` to the covariance diagonal (after the
    closed-form update), so a state that sits on one point keeps a finite likelihood. Set
    ``min_variance=0`` for the exact (MAP) update.

    Args:
        num_states: number of hidden states ``K``.
        emission_dim: ``D``.
        covariance: ``"full"`` (`GaussianEmissions`), ``"diagonal"``
            (`DiagonalGaussianEmissions`), ``"tied"`` (`TiedGaussianEmissions`) or
            ``"spherical"`` (`SphericalGaussianEmissions`); explicit, never inferred.
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
        if self.covariance not in ("full", "diagonal", "tied", "spherical"):
            raise ValueError("covariance must be 'full', 'diagonal', 'tied' or 'spherical', "
                             f"got {self.covariance!r}")
        _check_min_variance(self)

    @property
    def event_shape(self):
        return (self.emission_dim,)

    @property
    def _full(self) -> bool:
        return self.covariance == "full"

    @property
    def _per_entry(self) -> bool:
        """Whether the covariance is diagonal (EM statistics are kept per entry)."""
        return self.covariance in ("diagonal", "spherical")

    def state_covariances(self, emissions):
        """``(K, D, D)`` covariance of every state, whatever the parameterization."""
        return covariances_by_state(self.covariance, emissions, self.num_states,
                                    self.emission_dim)

    def emission_shapes(self):
        k, d = self.num_states, self.emission_dim
        if self._full:
            return GaussianEmissions((k, d), (k, d, d))
        if self.covariance == "tied":
            return TiedGaussianEmissions((k, d), (d, d))
        if self.covariance == "spherical":
            return SphericalGaussianEmissions((k, d), (k,))
        return DiagonalGaussianEmissions((k, d), (k, d))

    def default_priors(self, y=None, mask=None, *, scale=1.0):
        """Bayesian defaults at observation scale ``c = scale`` (the data's values are not
        used; standardize each dimension or pass your own priors): means
        ``Normal(0, 2 c)``; full and tied covariances `statseq.bayes.LKJCovariance`
        (LKJ(2) correlations, half-normal ``2 c`` scales), diagonal and spherical variances
        ``LogNormal(2 log c, 2)``; the initial law and transitions as in
        `HMMBase.default_priors`."""
        from statseq.bayes.priors import LKJCovariance, check_prior_scale

        d, k, dtype = self.emission_dim, self.num_states, float_dtype()
        c = check_prior_scale(scale)
        means = dist.Normal(jnp.zeros((k, d), dtype), 2.0 * c)
        if self._full:
            emissions = GaussianEmissions(means, LKJCovariance(d, jnp.full((k, d), 2.0 * c,
                                                                           dtype)))
        elif self.covariance == "tied":
            emissions = TiedGaussianEmissions(means, LKJCovariance(d, jnp.full((d,), 2.0 * c,
                                                                               dtype)))
        elif self.covariance == "spherical":
            emissions = SphericalGaussianEmissions(
                means, dist.LogNormal(jnp.full((k,), 2.0 * np.log(c), dtype), 2.0))
        else:
            emissions = DiagonalGaussianEmissions(
                means, dist.LogNormal(jnp.full((k, d), 2.0 * np.log(c), dtype), 2.0))
        return HMMBase.default_priors(self, y, mask, scale=c)._replace(emissions=emissions)

    def data_surely_finite(self, emissions, y, mask) -> bool:
        """Gaussian log-densities are finite while the standardized residuals cannot
        overflow: proven from the largest ``|y|`` and ``|mu|`` and the smallest covariance
        eigenvalue (`statseq.inference.gaussian.mvn_log_prob_surely_finite`)."""
        return _gaussian_surely_finite(self.state_covariances(emissions), y,
                                       lambda y_max: np.max(np.abs(np.asarray(emissions.means)),
                                                            initial=0.0))

    def emission_constraints(self):
        if self._full:
            return GaussianEmissions(constraints.real, constraints.positive_definite)
        if self.covariance == "tied":
            return TiedGaussianEmissions(constraints.real, constraints.positive_definite)
        if self.covariance == "spherical":
            return SphericalGaussianEmissions(constraints.real, constraints.positive)
        return DiagonalGaussianEmissions(constraints.real, constraints.positive)

    def _scales(self, emissions):
        """``(K, D)`` standard deviations of the per-entry (diagonal, spherical) families."""
        var = emissions.variances
        if self.covariance == "spherical":
            var = jnp.broadcast_to(var[:, None], emissions.means.shape)
        return jnp.sqrt(var)

    def filters_on_the_table(self, num_timesteps: int) -> bool:
        """Full and tied covariances: always (`masked_mvn_log_prob_table` factors each
        covariance once; the per-step path factors one per step and state: public
        ``log_prob`` at ``T = 10^3``, ``K = 3``, ``D = 2`` 0.21 ms against 1.7 ms)."""
        return not self._per_entry or super().filters_on_the_table(num_timesteps)

    def log_likelihoods(self, params, y, mask):
        """``(T, K)`` emission log-likelihoods of one sequence (0 rows where masked); full
        and tied covariances by `statseq.inference.gaussian.masked_mvn_log_prob_table`
        (each covariance factored once when every entry is observed)."""
        if self._per_entry:
            return super().log_likelihoods(params, y, mask)
        return masked_mvn_log_prob_table(y, params.emissions.means,
                                         self.state_covariances(params.emissions), mask)

    def emission_log_likelihoods(self, emissions, y_t, mask_t):
        mask_t = jnp.broadcast_to(jnp.asarray(mask_t, bool), y_t.shape)
        if self._full:
            return jax.vmap(lambda mu, cov: masked_mvn_log_prob(y_t, mu, cov, mask_t))(
                emissions.means, emissions.covs)
        if self.covariance == "tied":
            return jax.vmap(lambda mu: masked_mvn_log_prob(y_t, mu, emissions.cov, mask_t))(
                emissions.means)
        lp = dist.Normal(emissions.means, self._scales(emissions)).log_prob(y_t)
        return jnp.sum(jnp.where(mask_t, lp, 0.0), axis=-1)

    def emission_distribution(self, emissions):
        if not self._per_entry:
            return dist.MultivariateNormal(emissions.means,
                                           covariance_matrix=self.state_covariances(emissions))
        return dist.Independent(dist.Normal(emissions.means, self._scales(emissions)), 1)

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

        Diagonal and spherical: the same per entry, ``(K, D)`` each, with per-entry
        weights. Tied: as full.
        """
        dtype = weights.dtype
        k, d = self.num_states, self.emission_dim
        y = y.astype(dtype)
        m = mask.astype(dtype)
        center = (jnp.zeros((k, d), dtype) if emissions is None
                  else jax.lax.stop_gradient(emissions.means).astype(dtype))
        if self._per_entry:
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
        covs = jax.lax.stop_gradient(self.state_covariances(emissions)).astype(dtype)

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
        """Closed-form MLE, or the MAP under a NIW (full, tied) / NIG (diagonal, spherical)
        prior; states (entries) without mass keep their values; ``min_variance`` is added
        last."""
        if self.covariance == "tied":
            return self._tied_m_step(emissions, stats, prior)
        if self.covariance == "spherical":
            return self._spherical_m_step(emissions, stats, prior)
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

    def _tied_m_step(self, emissions, stats, prior):
        """One covariance: the per-state scatter (plus the NIW terms) summed over states,
        ``Sigma = sum_k S_k / N`` (MLE) or ``(Psi + sum_k [S_k + kappa w_k / (kappa + w_k)
        d_k d_k^T]) / (nu + N + K + D + 1)`` (MAP)."""
        w, s1, s2, c = stats["sum_w"], stats["sum_wy"], stats["sum_wyy"], stats["center"]
        k, d = self.num_states, self.emission_dim
        empty = w <= 1e-12 * jnp.maximum(1.0, jnp.max(w))
        safe = jnp.where(empty, 1.0, w)
        xbar = s1 / safe[:, None]
        scatter = jnp.where(empty[:, None, None], 0.0,
                            s2 - safe[:, None, None] * xbar[:, :, None] * xbar[:, None, :])
        if prior is None:
            means = jnp.where(empty[:, None], emissions.means, c + xbar)
            cov = jnp.sum(scatter, axis=0) / jnp.maximum(jnp.sum(w), 1e-300)
        else:
            kappa0 = jnp.broadcast_to(prior.mean_precision, w.shape)
            m0 = jnp.broadcast_to(prior.loc, s1.shape)
            e = s1 - w[:, None] * (m0 - c)
            means = m0 + e / (kappa0 + w)[:, None]
            coef = kappa0 / ((kappa0 + w) * safe)
            psi = (jnp.reshape(prior.scale, (-1, d, d))[0]
                   + jnp.sum(scatter + coef[:, None, None] * e[:, :, None] * e[:, None, :], 0))
            nu = jnp.reshape(prior.df, (-1,))[0]
            cov = psi / (nu + jnp.sum(w) + k + d + 1.0)
        cov = symmetrize(cov) + self.min_variance * jnp.eye(d, dtype=s1.dtype)
        return TiedGaussianEmissions(means, cov)

    def _spherical_m_step(self, emissions, stats, prior):
        """One variance per state from the per-entry statistics:
        ``sigma2_k = sum_d S_kd / sum_d w_kd`` (MLE) or ``(beta + sum_d [S_kd + kappa w_kd /
        (kappa + w_kd) e_kd^2] / 2) / (alpha + 1 + D/2 + sum_d w_kd / 2)`` (MAP)."""
        w, s1, s2, c = stats["sum_w"], stats["sum_wy"], stats["sum_wyy"], stats["center"]
        k, d = self.num_states, self.emission_dim
        empty = w <= 1e-12 * jnp.maximum(1.0, jnp.max(w))
        safe = jnp.where(empty, 1.0, w)
        xbar = s1 / safe
        scatter = jnp.where(empty, 0.0, s2 - safe * xbar**2)
        w_state = jnp.sum(w, axis=1)
        empty_state = w_state <= 1e-12 * jnp.maximum(1.0, jnp.max(w_state))
        if prior is None:
            means = jnp.where(empty, emissions.means, c + xbar)
            var = jnp.sum(scatter, axis=1) / jnp.where(empty_state, 1.0, w_state)
        else:
            kappa0 = jnp.broadcast_to(prior.mean_precision, w.shape)
            m0 = jnp.broadcast_to(prior.loc, w.shape)
            e = s1 - w * (m0 - c)
            means = m0 + e / (kappa0 + w)
            alpha = jnp.broadcast_to(jnp.asarray(prior.concentration)[..., 0], (k,))
            beta = (jnp.broadcast_to(jnp.asarray(prior.rate)[..., 0], (k,))
                    + 0.5 * jnp.sum(scatter + kappa0 / ((kappa0 + w) * safe) * e**2, axis=1))
            var = beta / (alpha + 1.0 + 0.5 * d + 0.5 * w_state)
            empty_state = jnp.zeros_like(empty_state)
        var = jnp.where(empty_state, emissions.variances,
                        jnp.maximum(var, 0.0) + self.min_variance)
        return SphericalGaussianEmissions(means, var)

    def validate_em_priors(self, priors):
        """EM's closed form needs a NormalInverseWishart (full, tied) or NormalInverseGamma
        (diagonal, spherical) prior on the whole emissions node, and Dirichlet priors on
        simplexes. Tied: ``df`` and ``scale`` the same for every state; spherical:
        ``concentration`` and ``rate`` the same for every entry."""
        kind = NormalInverseGamma if self._per_entry else NormalInverseWishart
        _check_emission_node_prior(priors, kind)
        prior = None if priors is None else priors.emissions
        if not isinstance(prior, kind):
            return
        if self.covariance == "tied":
            df = np.asarray(prior.df).reshape(-1)
            scale = np.asarray(prior.scale).reshape((-1,) + prior.scale.shape[-2:])
            if not (np.all(df == df[0]) and np.all(scale == scale[0])):
                raise ValueError("covariance='tied' has one covariance: its "
                                 "NormalInverseWishart prior needs one df and one scale")
        if self.covariance == "spherical":
            for name in ("concentration", "rate"):
                a = np.asarray(getattr(prior, name))
                if not np.all(a == a[..., :1]):
                    raise ValueError(f"covariance='spherical' has one variance per state: the "
                                     f"NormalInverseGamma {name} must be the same for every "
                                     "entry")

    # ---- initialization -----------------------------------------------------------------
    def initialize_emissions(self, y, mask, *, key, method):
        """``"data"``: k-means (k-means++ seeding from ``key``) on the steps with observed
        entries (missing entries filled with the entry's mean), cluster covariances shrunk
        toward the overall covariance. ``"random"``: means are ``K`` k-means++ seeds (data rows
        drawn with probability proportional to their squared distance from the rows drawn
        before), covariances the overall covariance times ``10^u``, ``u ~ U(-2, 0)`` drawn
        per state (states one to a hundred times narrower than the data)."""
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
            means, _ = kmeans(filled, k, seed=seed, num_iters=0)
            # k-means++ seeds (data rows spread over the data); each state's covariance
            # is the overall one times its own 10^u, u ~ U(-2, 0): a narrow state (a
            # rarely visited or tightly clustered regime) is then a start, not a basin that
            # EM must shrink a common variance into
            covs = global_cov[None] * 10.0 ** rng.uniform(-_RANDOM_VARIANCE_DECADES, 0.0,
                                                           (k, 1, 1))
        else:
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        covs = 0.5 * (covs + np.swapaxes(covs, -1, -2)) + self.min_variance * np.eye(d)
        return self._pack_emissions(means, covs)

    def _pack_emissions(self, means, covs):
        """Emissions of this covariance type from ``(K, D)`` means and ``(K, D, D)``
        covariances (tied: their average; spherical: the mean of each diagonal)."""
        dtype = float_dtype()
        means = jnp.asarray(means, dtype)
        diag = np.diagonal(covs, axis1=1, axis2=2)
        if self._full:
            return GaussianEmissions(means, jnp.asarray(covs, dtype))
        if self.covariance == "tied":
            return TiedGaussianEmissions(means, jnp.asarray(np.mean(covs, axis=0), dtype))
        if self.covariance == "spherical":
            return SphericalGaussianEmissions(means, jnp.asarray(diag.mean(axis=1), dtype))
        return DiagonalGaussianEmissions(means, jnp.asarray(diag, dtype))


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
