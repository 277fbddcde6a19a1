"""Emission heads: the one-step predictive distribution read from a feature vector.

A head maps the network's feature vector ``h_t`` (size ``F``) to a numpyro distribution
through a linear readout,

    eta_t = W h_t + b,        y_t ~ p(. | link(eta_t)),

with one head per observation type:

| ``emission`` | predictive per dimension (independent across dimensions) | data |
|---|---|---|
| ``"gaussian"`` | ``N(eta_loc, softplus(eta_scale) + 1e-4)`` | real |
| ``"student_t"`` | ``StudentT(df, eta_loc, softplus(eta_scale) + 1e-4)`` | real |
| ``"poisson"`` | ``Poisson(exp(eta))`` | count |
| ``"negative_binomial"`` | ``NegativeBinomial2(mean=exp(eta), concentration)`` | count |
| ``"bernoulli"`` | ``BernoulliLogits(eta)`` | 0/1 |
| ``"categorical"`` | ``CategoricalLogits(eta)`` over ``num_classes`` | category |

``df > 2`` (Student-t) and ``concentration > 0`` (negative binomial) are learned
parameters per dimension, not read from the features. Vector observations
(``emission_dim=D``) are ``Independent`` distributions, so a mask on a subset of the
dimensions is marginalized exactly by `statseq.core.distributions.masked_log_prob`.
Every head also *encodes* an observation as network input (`Head.encode`): real values
as they are, counts as ``log1p(y)``, 0/1 values as floats, categories one-hot.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.validation import check_positive_int, float_dtype

#: Floor added to the softplus scale of the Gaussian and Student-t heads.
MIN_SCALE = 1e-4
#: Lower bound of the Student-t degrees of freedom (finite variance).
MIN_DF = 2.0

EMISSIONS = (
    "gaussian", "student_t", "poisson", "negative_binomial", "bernoulli", "categorical",
)


class HeadParams(NamedTuple):
    """Parameters of a head: the readout ``eta = weight @ h + bias``.

    Attributes:
        weight: ``(num_outputs, feature_dim)``.
        bias: ``(num_outputs,)``.
    """

    weight: jax.Array
    bias: jax.Array


class StudentTHeadParams(NamedTuple):
    """Readout plus the degrees of freedom ``df`` (``(D,)``, each ``> 2``)."""

    weight: jax.Array
    bias: jax.Array
    df: jax.Array


class NegativeBinomialHeadParams(NamedTuple):
    """Readout plus the concentration (``(D,)``, positive; variance ``mu + mu^2 / c``)."""

    weight: jax.Array
    bias: jax.Array
    concentration: jax.Array


def _softplus_inv(x):
    x = np.asarray(x, float)
    return np.where(x > 30.0, x, np.log(np.expm1(np.minimum(x, 30.0))))


@dataclasses.dataclass(frozen=True)
class Head:
    """Base of the emission heads (a frozen dataclass of static configuration).

    Args:
        feature_dim: size ``F`` of the feature vector ``h_t`` the head reads.
        emission_dim: ``None`` for a scalar series, else the number of dimensions ``D``.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> head = ss.GRU(hidden_dim=4, emission="poisson").head
        >>> type(head).__name__, head.feature_dim, head.observation_dtype
        ('PoissonHead', 4, 'count')
    """

    feature_dim: int
    emission_dim: int | None = None

    #: ``"real"``, ``"count"`` or ``"category"`` (what `prepare_data` casts ``y`` to).
    observation_dtype: ClassVar[str] = "real"
    #: Readout outputs per dimension.
    outputs_per_dim: ClassVar[int] = 1

    def __post_init__(self):
        check_positive_int(self.feature_dim, "feature_dim")
        if self.emission_dim is not None:
            check_positive_int(self.emission_dim, "emission_dim")

    @property
    def dim(self) -> int:
        """Number of dimensions ``D`` (1 for a scalar series)."""
        return 1 if self.emission_dim is None else self.emission_dim

    @property
    def event_shape(self) -> tuple[int, ...]:
        """Shape of one observation."""
        return () if self.emission_dim is None else (self.emission_dim,)

    @property
    def num_outputs(self) -> int:
        """Size of the readout ``eta``."""
        return self.outputs_per_dim * self.dim

    @property
    def encoded_dim(self) -> int:
        """Size of an encoded observation (`encode`), indicators excluded."""
        return self.dim

    @property
    def indicator_dim(self) -> int:
        """Number of observed-indicators fed to the network with an observation."""
        return self.dim

    def param_shapes(self):
        """Shapes of the head's parameters."""
        return HeadParams((self.num_outputs, self.feature_dim), (self.num_outputs,))

    def param_constraints(self):
        """Constraints of the head's parameters."""
        return HeadParams(constraints.real, constraints.real)

    # ---- the distribution -----------------------------------------------------------
    def readout(self, params, h):
        """``eta = h @ W^T + b`` for features ``h`` of shape ``(..., F)``."""
        return h @ params.weight.T + params.bias

    def _split(self, eta):
        """``eta (..., P)`` -> ``outputs_per_dim`` arrays of shape ``(..., D)``."""
        return [eta[..., k * self.dim:(k + 1) * self.dim] for k in range(self.outputs_per_dim)]

    def _finish(self, d):
        """Scalar series: drop the unit dimension; vectors: an ``Independent`` event."""
        return d.to_event(1) if self.emission_dim is not None else d

    def _base(self, params, parts):  # pragma: no cover - abstract
        raise NotImplementedError

    def distribution(self, params, h):
        """The predictive for features ``h`` of shape ``(..., F)`` (batch shape ``...``)."""
        parts = self._split(self.readout(params, h))
        if self.emission_dim is None:
            parts = [p[..., 0] for p in parts]
        return self._finish(self._base(params, parts))

    # ---- observations as network input -----------------------------------------------
    def encode(self, y_t, mask_t):
        """One observation as network input: ``(encoded * observed, observed)``.

        Masked entries are fed as 0 with an observed-indicator of 0.

        Args:
            y_t: one observation of shape ``event_shape``.
            mask_t: booleans of shape ``event_shape`` (``True`` = observed).

        Returns:
            A vector of size ``encoded_dim + indicator_dim``.
        """
        dtype = float_dtype()
        m = jnp.reshape(jnp.broadcast_to(mask_t, self.event_shape), (self.dim,)).astype(dtype)
        v = jnp.reshape(self._encode_values(jnp.asarray(y_t)), (self.dim,)).astype(dtype)
        return jnp.concatenate([v * m, m])

    def _encode_values(self, y):
        return y.astype(float_dtype())

    # ---- data -------------------------------------------------------------------------
    def validate(self, y, mask) -> None:
        """Eager checks of the observed values (``ValueError`` naming ``y``)."""
        del y, mask

    def init_params(self, key, y, mask):
        """Small random readout weights; the bias matches the data's marginal law.

        Args:
            key: a ``jax.random`` key.
            y: observations ``(..., *event_shape)`` as a NumPy array (masked entries 0).
            mask: booleans of the same shape.
        """
        dtype = float_dtype()
        scale = 0.1 / np.sqrt(self.feature_dim)
        weight = scale * jax.random.normal(key, (self.num_outputs, self.feature_dim), dtype)
        y = np.asarray(y, float).reshape(-1, self.dim)
        mask = np.broadcast_to(np.asarray(mask, bool).reshape(-1, self.dim), y.shape)
        bias = np.asarray(self._data_bias(y, mask), float).reshape(self.num_outputs)
        return HeadParams(weight, jnp.asarray(bias, dtype))

    def _data_bias(self, y, mask):
        return np.zeros(self.num_outputs)

    @staticmethod
    def _observed_moments(y, mask):
        n = np.maximum(mask.sum(0), 1)
        mean = np.where(mask, y, 0).sum(0) / n
        var = np.where(mask, (y - mean) ** 2, 0).sum(0) / n
        return mean, var


@dataclasses.dataclass(frozen=True)
class GaussianHead(Head):
    """Diagonal Gaussian: ``y_t ~ N(mu_t, diag(sigma_t^2))`` with
    ``(mu_t, s_t) = W h_t + b`` and ``sigma_t = softplus(s_t) + 1e-4``.

    Examples:
        >>> import jax.numpy as jnp
        >>> head = GaussianHead(feature_dim=3)
        >>> params = HeadParams(jnp.zeros((2, 3)), jnp.array([0.5, 1.0]))
        >>> float(head.distribution(params, jnp.ones(3)).mean)
        0.5
    """

    outputs_per_dim: ClassVar[int] = 2

    def _base(self, params, parts):
        loc, raw = parts
        return dist.Normal(loc, jax.nn.softplus(raw) + MIN_SCALE)

    def _data_bias(self, y, mask):
        mean, var = self._observed_moments(y, mask)
        std = np.maximum(np.sqrt(var), 1e-3)
        return np.concatenate([mean, _softplus_inv(std - MIN_SCALE)])


@dataclasses.dataclass(frozen=True)
class StudentTHead(GaussianHead):
    """Student-t with learned degrees of freedom: ``y_t ~ StudentT(nu, mu_t, sigma_t)``,
    ``(mu_t, s_t) = W h_t + b``, ``sigma_t = softplus(s_t) + 1e-4``, ``nu > 2`` per
    dimension (a parameter)."""

    def param_shapes(self):
        p, f = self.num_outputs, self.feature_dim
        return StudentTHeadParams((p, f), (p,), (self.dim,))

    def param_constraints(self):
        return StudentTHeadParams(
            constraints.real, constraints.real, constraints.greater_than(MIN_DF)
        )

    def _base(self, params, parts):
        loc, raw = parts
        df = params.df if self.emission_dim is not None else params.df[0]
        return dist.StudentT(df, loc, jax.nn.softplus(raw) + MIN_SCALE)

    def init_params(self, key, y, mask):
        base = super().init_params(key, y, mask)
        return StudentTHeadParams(*base, jnp.full((self.dim,), 5.0, float_dtype()))


@dataclasses.dataclass(frozen=True)
class _CountHead(Head):
    observation_dtype: ClassVar[str] = "count"

    def _encode_values(self, y):
        return jnp.log1p(y.astype(float_dtype()))

    def validate(self, y, mask) -> None:
        observed = np.asarray(y)[np.broadcast_to(np.asarray(mask, bool), np.shape(y))]
        bad = (observed < 0) | (observed != np.round(observed))
        if np.any(bad):
            raise ValueError(
                f"y must hold non-negative integer counts for the {type(self).__name__}; "
                f"found {observed[bad][0]}"
            )

    def _data_bias(self, y, mask):
        mean, _ = self._observed_moments(y, mask)
        return np.log(np.maximum(mean, 1e-2))


@dataclasses.dataclass(frozen=True)
class PoissonHead(_CountHead):
    """Poisson with log link: ``y_t ~ Poisson(exp(W h_t + b))`` per dimension."""

    def _base(self, params, parts):
        (eta,) = parts
        return dist.Poisson(jnp.exp(eta))


@dataclasses.dataclass(frozen=True)
class NegativeBinomialHead(_CountHead):
    """Negative binomial with log link: ``y_t ~ NB2(mean=exp(W h_t + b), concentration=c)``
    (variance ``mu + mu^2 / c``; ``c > 0`` a parameter per dimension)."""

    def param_shapes(self):
        p, f = self.num_outputs, self.feature_dim
        return NegativeBinomialHeadParams((p, f), (p,), (self.dim,))

    def param_constraints(self):
        return NegativeBinomialHeadParams(
            constraints.real, constraints.real, constraints.positive
        )

    def _base(self, params, parts):
        (eta,) = parts
        conc = params.concentration if self.emission_dim is not None else params.concentration[0]
        return dist.NegativeBinomial2(jnp.exp(eta), conc)

    def init_params(self, key, y, mask):
        base = super().init_params(key, y, mask)
        y = np.asarray(y, float).reshape(-1, self.dim)
        mask = np.broadcast_to(np.asarray(mask, bool).reshape(-1, self.dim), y.shape)
        mean, var = self._observed_moments(y, mask)
        excess = var - mean
        conc = np.where(excess > 1e-3 * np.maximum(mean, 1e-3),
                        mean**2 / np.maximum(excess, 1e-12), 100.0)
        conc = np.clip(conc, 1e-2, 1e3)
        return NegativeBinomialHeadParams(*base, jnp.asarray(conc, float_dtype()))


@dataclasses.dataclass(frozen=True)
class BernoulliHead(Head):
    """Bernoulli with logit link: ``y_t ~ Bernoulli(sigmoid(W h_t + b))`` per dimension."""

    observation_dtype: ClassVar[str] = "category"

    def _base(self, params, parts):
        (eta,) = parts
        return dist.BernoulliLogits(eta)

    def validate(self, y, mask) -> None:
        observed = np.asarray(y)[np.broadcast_to(np.asarray(mask, bool), np.shape(y))]
        bad = (observed != 0) & (observed != 1)
        if np.any(bad):
            raise ValueError(f"y must hold binary values 0 or 1 for the BernoulliHead; "
                             f"found {observed[bad][0]}")

    def _data_bias(self, y, mask):
        mean, _ = self._observed_moments(y, mask)
        p = np.clip(mean, 1e-3, 1 - 1e-3)
        return np.log(p) - np.log1p(-p)


@dataclasses.dataclass(frozen=True)
class CategoricalHead(Head):
    """Categorical with softmax link: ``y_t ~ Categorical(softmax(W h_t + b))`` over
    ``num_classes`` classes (a scalar series of integers ``0 .. K-1``)."""

    num_classes: int = 2
    observation_dtype: ClassVar[str] = "category"

    def __post_init__(self):
        super().__post_init__()
        if self.emission_dim is not None:
            raise ValueError("the categorical head models a scalar series: emission_dim=None")
        check_positive_int(self.num_classes, "num_classes", minimum=2)

    @property
    def num_outputs(self) -> int:
        return self.num_classes

    @property
    def encoded_dim(self) -> int:
        return self.num_classes

    @property
    def indicator_dim(self) -> int:
        return 1

    def distribution(self, params, h):
        return dist.CategoricalLogits(self.readout(params, h))

    def encode(self, y_t, mask_t):
        dtype = float_dtype()
        m = jnp.reshape(jnp.asarray(mask_t), (-1,))[:1].astype(dtype)
        onehot = jax.nn.one_hot(jnp.asarray(y_t, jnp.int32), self.num_classes, dtype=dtype)
        return jnp.concatenate([onehot * m, m])

    def validate(self, y, mask) -> None:
        observed = np.asarray(y)[np.broadcast_to(np.asarray(mask, bool), np.shape(y))]
        bad = (observed < 0) | (observed >= self.num_classes) | (observed != np.round(observed))
        if np.any(bad):
            raise ValueError(
                f"y must hold integer categories in 0..{self.num_classes - 1} "
                f"(num_classes={self.num_classes}); found {observed[bad][0]}"
            )

    def init_params(self, key, y, mask):
        dtype = float_dtype()
        scale = 0.1 / np.sqrt(self.feature_dim)
        weight = scale * jax.random.normal(key, (self.num_outputs, self.feature_dim), dtype)
        y = np.asarray(y).reshape(-1)
        observed = y[np.asarray(mask, bool).reshape(-1)].astype(int)
        counts = np.bincount(observed, minlength=self.num_classes) + 1.0
        return HeadParams(weight, jnp.asarray(np.log(counts / counts.sum()), dtype))


_HEADS = {
    "gaussian": GaussianHead,
    "student_t": StudentTHead,
    "poisson": PoissonHead,
    "negative_binomial": NegativeBinomialHead,
    "bernoulli": BernoulliHead,
    "categorical": CategoricalHead,
}


def make_head(emission: str, *, feature_dim: int, emission_dim=None, num_classes=None) -> Head:
    """The head named ``emission`` (one of `EMISSIONS`) reading ``feature_dim`` features.

    Args:
        emission: ``"gaussian"``, ``"student_t"``, ``"poisson"``, ``"negative_binomial"``,
            ``"bernoulli"`` or ``"categorical"``.
        feature_dim: size of the feature vector.
        emission_dim: ``None`` (scalar series) or the number of dimensions.
        num_classes: number of classes (``"categorical"`` only; required there).

    Returns:
        A `Head`.

    Examples:
        >>> make_head("poisson", feature_dim=4, emission_dim=2).event_shape
        (2,)
    """
    if emission not in _HEADS:
        raise ValueError(f"emission must be one of {EMISSIONS}, got {emission!r}")
    if emission == "categorical":
        if num_classes is None:
            raise ValueError("emission='categorical' needs num_classes (>= 2)")
        return CategoricalHead(feature_dim, emission_dim, num_classes=num_classes)
    if num_classes is not None:
        raise ValueError(f"num_classes is only for emission='categorical', not {emission!r}")
    return _HEADS[emission](feature_dim, emission_dim)
