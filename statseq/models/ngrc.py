"""Next-generation reservoir computing (NG-RC): a nonlinear vector autoregression with
fixed polynomial features and a ridge readout fitted in closed form.

Gauthier, Bollt, Griffith and Barbosa (2021), *Next generation reservoir computing*,
Nature Communications 12, 5564. The feature vector of step ``t`` is (their eqs. 5-7)

    O_lin,t = [y_{t-1}, y_{t-1-s}, ..., y_{t-1-(k-1)s}]               (k D values)
    O_nonlin,t = the unique monomials of degree p of O_lin,t         (C(kD + p - 1, p))
    O_total,t = [1, O_lin,t, O_nonlin,t]                              (F values)

(``k`` lags with skip ``s``, polynomial degree ``p``; ``p = 2`` is the paper's quadratic
``O_lin ⌈⊗⌉ O_lin``, ``kD (kD + 1) / 2`` products ``x_i x_j``, ``i <= j``), and the
readout ``W`` predicts, by default as in the paper, the *increment* (their eq. 9)

    y_t = y_{t-1} + W O_total,t + e_t,        e_t ~ N(0, Σ)               (target="increment")
    y_t = W O_total,t + e_t                                                (target="level")

so NG-RC is an autoregressive likelihood of order ``P = (k - 1) s + 1`` with fixed
nonlinear features: conditional on its first ``P`` values (as ``statseq.AR`` with
``initial="conditional"``), Gaussian one-step predictives, and h-step forecasts by
simulating sample paths (`statseq.forecast`). `NGRC.fit_ridge` is the paper's training,

    W = Y O^T (O O^T + α I)^{-1}                                          (their eq. 3)

one linear solve (the normal equations, every coefficient penalized, the constant too, as
in the paper's code), and ``Σ`` is the maximum-likelihood residual covariance ``R R^T / n``
(as `statseq.AR.fit_least_squares`). The paper fits ``W`` only; the noise covariance is
what makes the readout a likelihood. ``degree=1`` (no nonlinear part) with ``α = 0`` is
the least-squares AR(``P``) on the ``k`` lags.

**Missing values.** A masked value is not scored and enters the lag window as the model's
own one-step predictive mean (a plug-in, not a marginalization: with nonlinear features
the exact marginal has no closed form), so ``marginalizes_masked_steps`` is False and the
h-step marginal densities of `statseq.log_predictive_density` are Monte Carlo estimates,
as for the neural networks.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.model import SequenceModel, register_model
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.inference.gaussian import symmetrize

#: The ridge parameter α of the paper's Lorenz-63 forecasts, `NGRC.fit_ridge`'s default.
PAPER_RIDGE = 2.5e-6


def ngrc_num_features(dim: int, num_lags: int, degree: int) -> int:
    """``F = 1 + k D + C(k D + p - 1, p)`` (``p >= 2``; ``1 + k D`` for ``p = 1``): the
    constant, the linear part and the unique monomials of degree ``p``.

    Args:
        dim: observation dimension ``D``.
        num_lags: ``k``.
        degree: ``p``.

    Returns:
        ``F``.

    Examples:
        >>> ngrc_num_features(3, 2, 2)        # the paper's Lorenz-63 NG-RC: 1 + 6 + 21
        28
    """
    n = dim * num_lags
    return 1 + n + (math.comb(n + degree - 1, degree) if degree >= 2 else 0)


class NGRCParams(NamedTuple):
    """Parameters of `NGRC`.

    Attributes:
        weights: ``(D, F)`` the readout ``W`` (columns: constant, linear, monomials).
        cov: ``(D, D)`` the noise covariance ``Σ``.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> model = ss.NGRC(num_lags=2, degree=2)  # features [1, y1, y2, y1^2, y1 y2, y2^2]
        >>> y = np.sin(np.arange(40.0) / 3) + 0.1 * np.cos(np.arange(40.0))
        >>> params = model.fit_ridge(y, ridge=1e-6)
        >>> type(params).__name__, params.weights.shape, params.cov.shape
        ('NGRCParams', (1, 6), (1, 1))
    """

    weights: jax.Array
    cov: jax.Array


class NGRCCarry(NamedTuple):
    """The lag window ``(y_{t-1}, ..., y_{t-P})``, newest first, ``(P, D)``."""

    window: jax.Array


@register_model
@dataclasses.dataclass(frozen=True)
class NGRC(SequenceModel):
    """Next-generation reservoir computer: ``y_t = [y_{t-1} +] W O_total,t + e_t``.

    ``O_total,t = [1, y_{t-1}, y_{t-1-s}, ..., y_{t-1-(k-1)s}, their degree-p monomials]``,
    ``e_t ~ N(0, Σ)`` (module docstring: Gauthier et al. 2021).

    Args:
        num_lags: ``k``, the number of lagged observations (>= 1).
        skip: ``s``, the spacing of the lags (>= 1).
        degree: ``p``, the degree of the monomials (>= 1; 1: no nonlinear part).
        emission_dim: ``None`` for a scalar series, else ``D``.
        target: ``"increment"`` (the readout predicts ``y_t - y_{t-1}``, as in the paper)
            or ``"level"`` (it predicts ``y_t``).

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.NGRC(num_lags=2, degree=2)
        >>> model.num_features, model.order       # 1 + 2 + 3 features; conditions on 2
        (6, 2)
        >>> params = model.fit_ridge(y, ridge=1e-3)
        >>> bool(np.isfinite(ss.log_prob(model, params, y)))
        True
    """

    num_lags: int = 2
    skip: int = 1
    degree: int = 2
    emission_dim: int | None = None
    target: Literal["increment", "level"] = "increment"

    supports_partial_mask = True
    marginalizes_masked_steps = False  # a gap is filled with the predictive mean

    def __post_init__(self):
        check_positive_int(self.num_lags, "num_lags")
        check_positive_int(self.skip, "skip")
        check_positive_int(self.degree, "degree")
        if self.emission_dim is not None:
            check_positive_int(self.emission_dim, "emission_dim")
        if self.target not in ("increment", "level"):
            raise ValueError(f"target must be 'increment' or 'level', got {self.target!r}")

    # ---- static description ---------------------------------------------------------
    @property
    def dim(self) -> int:
        """Number of series ``D``."""
        return 1 if self.emission_dim is None else self.emission_dim

    @property
    def event_shape(self) -> tuple[int, ...]:
        return () if self.emission_dim is None else (self.emission_dim,)

    @property
    def order(self) -> int:
        """``P = (k - 1) s + 1``: the oldest lag the features read."""
        return (self.num_lags - 1) * self.skip + 1

    @property
    def num_features(self) -> int:
        """``F`` (`ngrc_num_features`)."""
        return ngrc_num_features(self.dim, self.num_lags, self.degree)

    @property
    def num_conditioned_steps(self) -> int:
        return self.order

    def param_shapes(self) -> NGRCParams:
        return NGRCParams((self.dim, self.num_features), (self.dim, self.dim))

    def param_constraints(self) -> NGRCParams:
        return NGRCParams(constraints.real, constraints.positive_definite)

    # ---- features ----------------------------------------------------------------------
    def monomial_indices(self) -> np.ndarray:
        """``(M, p)`` indices into ``O_lin`` of each monomial, ``i_1 <= ... <= i_p`` in
        lexicographic order (the paper's ``row <= column`` loop for ``p = 2``)."""
        if self.degree < 2:
            return np.zeros((0, self.degree), int)
        combos = itertools.combinations_with_replacement(range(self.dim * self.num_lags),
                                                         self.degree)
        return np.array(list(combos), int).reshape(-1, self.degree)

    def features(self, window, xp=jnp):
        """``O_total`` from lag windows ``(..., P, D)`` (newest first): ``(..., F)``.

        ``xp`` is the array module (``jax.numpy``, or ``numpy`` for the float64 fit)."""
        taps = window[..., :: self.skip, :][..., : self.num_lags, :]
        lin = xp.reshape(taps, taps.shape[:-2] + (self.num_lags * self.dim,))
        idx = self.monomial_indices()
        parts = [xp.ones(lin.shape[:-1] + (1,), lin.dtype), lin]
        if idx.size:
            parts.append(xp.prod(lin[..., idx], axis=-1))
        return xp.concatenate(parts, axis=-1)

    def _mean(self, params, window):
        mean = self.features(window) @ params.weights.T
        return mean + window[..., 0, :] if self.target == "increment" else mean

    # ---- the filter -------------------------------------------------------------------
    def initial_carry(self, params) -> NGRCCarry:
        return NGRCCarry(jnp.zeros((self.order, self.dim), params.cov.dtype))

    def predict(self, params, carry, inputs_t):
        mean = self._mean(params, carry.window)
        if self.emission_dim is None:
            return dist.Normal(mean[0], jnp.sqrt(params.cov[0, 0]))
        return dist.MultivariateNormal(mean, params.cov)

    def update(self, params, carry, y_t, mask_t, inputs_t) -> NGRCCarry:
        d = self.dim
        y_vec = jnp.reshape(y_t, (d,)).astype(carry.window.dtype)
        m_vec = jnp.reshape(mask_t, (d,))
        filled = jnp.where(m_vec, y_vec, self._mean(params, carry.window))
        return NGRCCarry(jnp.concatenate([filled[None], carry.window[:-1]], axis=0))

    def complete_data_log_probs(self, params, y, inputs):
        """Per-step log-densities of one fully observed sequence, every step at once
        (the same numbers as the filter; a test checks this).

        Returns:
            ``(log_probs (T,), final_carry)``.
        """
        del inputs
        p, d = self.order, self.dim
        y = jnp.reshape(y, (y.shape[0], d)).astype(params.cov.dtype)
        t_len = y.shape[0]
        lags = jnp.concatenate([jnp.zeros((p, d), y.dtype), y], axis=0)
        windows = jnp.stack([lags[p - j: p - j + t_len] for j in range(1, p + 1)], axis=1)
        resid = y - self._mean(params, windows)
        chol = jnp.linalg.cholesky(params.cov)
        z = jax.scipy.linalg.solve_triangular(chol, resid.T, lower=True).T
        log_probs = (-0.5 * jnp.sum(z**2, axis=1) - jnp.sum(jnp.log(jnp.diagonal(chol)))
                     - 0.5 * d * jnp.log(2.0 * jnp.pi))
        log_probs = jnp.where(jnp.arange(t_len) >= p, log_probs, 0.0)
        return log_probs, NGRCCarry(lags[t_len:][::-1])

    # ---- data checks and the closed-form fit ------------------------------------------
    def validate_data(self, y, mask) -> None:
        step_mask = mask if self.emission_dim is None else np.all(mask, axis=-1)
        if not np.all(step_mask[..., : self.order]):
            raise ValueError(
                f"NGRC conditions on its first order={self.order} observations, so they "
                "must be observed")

    def initialize(self, y, *, key, inputs=None, mask=None) -> NGRCParams:
        """`fit_ridge` with the default ridge (the key is not used)."""
        check_key(key)
        return self.fit_ridge(y, inputs=inputs, mask=mask)

    def design(self, y, *, mask=None):
        """The regression ``(O, targets)``: one row per predicted step whose value and
        lags are all observed (pooling a batch), ``O`` ``(n, F)``, targets ``(n, D)``
        (increments for ``target="increment"``).

        Args:
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            mask: optional observation mask.

        Returns:
            ``(features (n, F), targets (n, D))`` as NumPy float64 arrays.
        """
        data = prepare_data(self, y, mask, None)
        p, d, t_len = self.order, self.dim, data.num_timesteps
        if t_len <= p:
            raise ValueError(f"y needs more than order={p} time steps, got {t_len}")
        yv = np.asarray(data.y, float).reshape(-1, t_len, d)
        mv = np.asarray(data.mask).reshape(-1, t_len, d).all(axis=-1)
        windows = np.stack([yv[:, p - j: t_len - j] for j in range(1, p + 1)], axis=2)
        ok = mv[:, p:].copy()
        for j in range(1, p + 1):
            ok &= mv[:, p - j: t_len - j]
        feats = self.features(windows, xp=np)
        targets = yv[:, p:] - (windows[:, :, 0] if self.target == "increment" else 0.0)
        return feats[ok], targets[ok]

    def fit_ridge(self, y, *, ridge: float = PAPER_RIDGE, inputs=None, mask=None) -> NGRCParams:
        """The paper's closed-form ridge readout and the residual noise covariance.

            W = Y O^T (O O^T + α I)^{-1},    Σ = R R^T / n,   R = Y - W O

        over every step whose value and lags are observed (`design`; a batch is pooled),
        one solve of the ``F x F`` normal equations in float64 (every coefficient
        penalized, the constant too, as in the paper's code). With ``ridge=0`` this is
        ordinary least squares.

        Args:
            y: ``batch_shape + (num_timesteps,) + event_shape``.
            ridge: ``α >= 0`` (default: the paper's 2.5e-6 for Lorenz-63; it is on the
                scale of ``O O^T``, so rescale it with the data).
            inputs: must be ``None`` (NGRC takes no covariates).
            mask: optional observation mask.

        Returns:
            `NGRCParams`.

        Raises:
            ValueError: for a negative ``ridge``, too few complete rows, or a singular
                system.
        """
        if inputs is not None and np.size(inputs):
            raise ValueError("NGRC takes no inputs")
        ridge = float(ridge)
        if not (np.isfinite(ridge) and ridge >= 0.0):
            raise ValueError(f"ridge must be a finite number >= 0, got {ridge}")
        feats, targets = self.design(y, mask=mask)
        n, f = feats.shape
        if n < f and ridge == 0.0:
            raise ValueError(f"least squares (ridge=0) needs at least F={f} complete rows, "
                             f"got {n}")
        if n < 2:
            raise ValueError(f"need at least 2 complete rows, got {n}")
        gram = feats.T @ feats + ridge * np.eye(f)
        try:
            weights = np.linalg.solve(gram, feats.T @ targets).T  # (D, F)
        except np.linalg.LinAlgError as err:
            raise ValueError("the ridge system is singular: increase ridge") from err
        resid = targets - feats @ weights.T
        cov = resid.T @ resid / n
        dtype = float_dtype()
        return NGRCParams(jnp.asarray(weights, dtype), jnp.asarray(symmetrize(cov), dtype))
