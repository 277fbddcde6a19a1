"""Gaussian emission parameters (full, diagonal, tied, spherical) and their conjugate priors.

The conjugate priors sit on the whole ``emissions`` node of the priors pytree (their
``log_prob`` takes the emissions NamedTuple):

* `NormalInverseWishart` for full covariances (and for a tied one),
* `NormalInverseGamma` for diagonal ones (independent per entry; and for spherical ones).

`statseq.models.hmm.gaussian` re-exports everything here.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import gammaln, multigammaln
from numpyro.distributions import constraints

_LOG_2PI = math.log(2.0 * math.pi)

class GaussianEmissions(NamedTuple):
    """Full-covariance Gaussian emissions.

    Attributes:
        means: ``(num_states, emission_dim)``.
        covs: ``(num_states, emission_dim, emission_dim)`` positive definite.

    Examples:
        >>> import jax.numpy as jnp, numpy as np, statseq as ss
        >>> from statseq.models.hmm import GaussianEmissions
        >>> model = ss.GaussianHMM(num_states=2, emission_dim=2)     # covariance="full"
        >>> emissions = GaussianEmissions(means=jnp.array([[0.0, 0.0], [3.0, 3.0]]),
        ...                               covs=jnp.stack([jnp.eye(2), 0.5 * jnp.eye(2)]))
        >>> params = model.assemble_params(emissions)
        >>> y = np.array([[0.1, -0.2], [2.9, 3.2], [3.1, 2.8]])
        >>> model.most_likely_states(params, y).tolist()
        [0, 1, 1]
    """

    means: jax.Array
    covs: jax.Array


class DiagonalGaussianEmissions(NamedTuple):
    """Diagonal-covariance Gaussian emissions (entries independent given the state).

    Attributes:
        means: ``(num_states, emission_dim)``.
        variances: ``(num_states, emission_dim)`` positive.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> from statseq.models.hmm import DiagonalGaussianEmissions
        >>> y = np.random.default_rng(0).normal(size=(30, 2))
        >>> model = ss.GaussianHMM(num_states=2, emission_dim=2, covariance="diagonal")
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> type(params.emissions) is DiagonalGaussianEmissions, params.emissions.variances.shape
        (True, (2, 2))
    """

    means: jax.Array
    variances: jax.Array


class TiedGaussianEmissions(NamedTuple):
    """Gaussian emissions sharing one full covariance across states (hmmlearn's
    ``covariance_type="tied"``, dynamax's ``SharedCovarianceGaussianHMM``).

    Attributes:
        means: ``(num_states, emission_dim)``.
        cov: ``(emission_dim, emission_dim)`` positive definite, the same for every state.

    Examples:
        >>> import jax.numpy as jnp, numpy as np, statseq as ss
        >>> from statseq.models.hmm import TiedGaussianEmissions
        >>> model = ss.GaussianHMM(num_states=3, emission_dim=2, covariance="tied")
        >>> emissions = TiedGaussianEmissions(jnp.zeros((3, 2)), jnp.array([[2.0, 0.5],
        ...                                                                [0.5, 1.0]]))
        >>> covs = np.asarray(model.state_covariances(emissions))  # every state's: the one
        >>> covs.shape, bool(np.all(covs == np.asarray(emissions.cov)))
        ((3, 2, 2), True)
    """

    means: jax.Array
    cov: jax.Array


class SphericalGaussianEmissions(NamedTuple):
    """Gaussian emissions with covariance ``sigma_k^2 I`` (hmmlearn's
    ``covariance_type="spherical"``; dynamax's ``SphericalGaussianHMM`` stores ``sigma_k``).

    Attributes:
        means: ``(num_states, emission_dim)``.
        variances: ``(num_states,)`` positive, ``sigma_k^2``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> from statseq.models.hmm import SphericalGaussianEmissions
        >>> y = np.random.default_rng(0).normal(size=(30, 2))
        >>> model = ss.GaussianHMM(num_states=3, emission_dim=2, covariance="spherical")
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> type(params.emissions) is SphericalGaussianEmissions, params.emissions.variances.shape
        (True, (3,))
    """

    means: jax.Array
    variances: jax.Array


# ------------------------------------------------------------------------------------------
# conjugate priors


def covariances_by_state(kind: str, emissions, num_states: int, dim: int):
    """``(K, D, D)`` noise covariance of every state, whatever the parameterization.

    ``kind`` is ``"full"`` (``emissions.covs``), ``"tied"`` (one ``emissions.cov``),
    ``"diagonal"`` (``(K, D)`` ``emissions.variances``) or ``"spherical"`` (``(K,)``
    ``emissions.variances``, ``sigma_k^2 I``); shared by the Gaussian and AR HMMs.
    """
    if kind == "full":
        return emissions.covs
    if kind == "tied":
        return jnp.broadcast_to(emissions.cov, (num_states, dim, dim))
    var = (emissions.variances if kind == "diagonal"
           else jnp.broadcast_to(emissions.variances[:, None], (num_states, dim)))
    return var[:, :, None] * jnp.eye(dim, dtype=var.dtype)


def _is_concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


class NormalInverseWishart(dist.Distribution):
    """Normal-inverse-Wishart prior on full-covariance Gaussian emissions.

        Sigma_k ~ InvWishart(df, scale),    mu_k | Sigma_k ~ N(loc, Sigma_k / mean_precision)

    independently for every state ``k``. It is placed on the whole ``emissions`` node of
    the priors pytree, and ``log_prob`` takes a `GaussianEmissions`; with it,
    `statseq.fit_em` computes the MAP estimate (the joint mode of the NIW posterior,
    ``mu = m_n``, ``Sigma = Psi_n / (nu_n + D + 2)``).

    On `TiedGaussianEmissions` (one ``Sigma`` for all states; ``loc`` ``(D,)`` or
    ``(K, D)``, the other arguments scalars) it is ``Sigma ~ InvWishart(df, scale)`` once and
    ``mu_k | Sigma ~ N(loc, Sigma / mean_precision)`` for every state; ``log_prob`` is then
    the joint log density (a scalar) and the EM MAP is
    ``Sigma = Psi_n / (nu + N + K + D + 1)`` with ``Psi_n`` summing the per-state terms.

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
        """``log NIW(means, covs)`` per state: ``value`` is a `GaussianEmissions`; for
        `TiedGaussianEmissions` the joint log density of the shared ``cov`` and all means."""
        if isinstance(value, TiedGaussianEmissions):
            return self._tied_log_prob(value)
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

    def _tied_log_prob(self, value):
        mu, sigma = value.means, value.cov  # (K, D), (D, D)
        k, dim = mu.shape
        chol = jnp.linalg.cholesky(sigma)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
        z = jsl.solve_triangular(chol, (mu - self.loc).T, lower=True)  # (D, K)
        kappa = jnp.broadcast_to(self.mean_precision, (k,))
        log_normal = jnp.sum(0.5 * dim * (jnp.log(kappa) - _LOG_2PI) - 0.5 * logdet
                             - 0.5 * kappa * jnp.sum(z**2, axis=0))
        nu = jnp.reshape(self.df, (-1,))[0]
        psi = jnp.reshape(self.scale, (-1, dim, dim))[0]
        trace = jnp.trace(jsl.cho_solve((chol, True), psi))
        log_iw = (0.5 * nu * jnp.linalg.slogdet(psi)[1] - 0.5 * nu * dim * math.log(2.0)
                  - multigammaln(0.5 * nu, dim) - 0.5 * (nu + dim + 1.0) * logdet - 0.5 * trace)
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

    On `SphericalGaussianEmissions` (one variance per state; ``concentration`` and ``rate``
    then the same for every entry) it is ``sigma2_k ~ InvGamma(concentration, rate)`` and
    ``mu_kd | sigma2_k ~ N(loc_d, sigma2_k / mean_precision)``; ``log_prob`` gives one value
    per state and the EM MAP is ``sigma2_k = beta_n / (alpha + 1 + D/2 + sum_d w_kd / 2)``.

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
        """``log NIG(means, variances)`` summed over entries: ``value`` is diagonal emissions
        (or spherical ones: one inverse-gamma term per state)."""
        mu, var = value.means, value.variances
        kappa, alpha, beta = self.mean_precision, self.concentration, self.rate
        if isinstance(value, SphericalGaussianEmissions):
            alpha, beta = alpha[..., 0], beta[..., 0]
            log_normal = jnp.sum(0.5 * (jnp.log(kappa) - _LOG_2PI - jnp.log(var[..., None]))
                                 - 0.5 * kappa * (mu - self.loc) ** 2 / var[..., None],
                                 axis=-1)
            return log_normal + (alpha * jnp.log(beta) - gammaln(alpha)
                                 - (alpha + 1.0) * jnp.log(var) - beta / var)
        log_normal = (0.5 * (jnp.log(kappa) - _LOG_2PI - jnp.log(var))
                      - 0.5 * kappa * (mu - self.loc) ** 2 / var)
        log_ig = (alpha * jnp.log(beta) - gammaln(alpha) - (alpha + 1.0) * jnp.log(var)
                  - beta / var)
        return jnp.sum(log_normal + log_ig, axis=-1)

    def mode(self):
        """The joint mode ``(loc, rate / (concentration + 3/2))``."""
        return DiagonalGaussianEmissions(self.loc, self.rate / (self.concentration + 1.5))
