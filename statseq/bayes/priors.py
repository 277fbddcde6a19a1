"""Default priors for Bayesian inference, derived from each parameter's constraint.

Priors use the format of `statseq.core.params` (a pytree like ``params`` whose leaves are
numpyro distributions on the natural, constrained parameters). For NUTS and SVI every
trainable leaf needs a proper prior; `default_priors` gives one per constraint. The
defaults **do not look at the data**: they are weakly informative on a fixed, stated
scale ``c`` (the ``scale`` argument, default 1), the typical size of an observation's
deviations (real data) or of a count (count data), which you set from what you know
about the measurements, not from the sample. With the default ``c = 1`` they suit
standardized real-valued data; for raw data either standardize it or pass ``scale``:

| constraint | default prior | used for |
|---|---|---|
| simplex | ``Dirichlet(1, ..., 1)`` per row | initial, transition, categorical probs |
| positive, real data | ``LogNormal(2 log c, 2)`` (median ``c^2``) | variances |
| positive, other data | ``LogNormal(log c, 2)`` (median ``c``) | rates (counts) |
| unit interval | ``Beta(1, 1)`` | Bernoulli probabilities |
| real | ``Normal(0, 2 max(1, c))`` | means, biases, weights, AR coefficients |
| positive definite | `LKJCovariance` (LKJ(2) correlations, half-normal(2 c) scales) | covariances |

A log-normal with log-scale standard deviation 2 puts 95% of its mass within a factor
``e^(1.96 * 2) ≈ 50`` of its median: a variance prior with median ``c^2``, a rate prior with median
``c``. Means are centred at 0, so centre real data (or pass a prior on the means).

A model may override these with a ``default_priors(y, mask, *, scale)`` method returning
a priors pytree (leaves it leaves ``None`` fall back to the table): HMMs put logit-scale
priors on input-driven transitions, the Gaussian HMM puts ``Normal(0, 2 c)`` on its means
and the table's priors on its covariances, and the neural models put fan-in-scaled
``Normal(0, 1 / sqrt(fan_in))`` priors on recurrent weights and ``Normal(0, 2 max(1, c) /
sqrt(F))`` on the readout (`statseq.models.neural.base.NeuralSequenceModel.default_priors`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.params import _is_constraint, _is_prior_leaf, is_shape, param_names
from statseq.core.validation import float_dtype


class LKJCovariance(dist.Distribution):
    """Covariance ``Sigma = diag(s) C diag(s)`` with ``C ~ LKJ(concentration)`` and
    independent ``s_i ~ HalfNormal(scale_i)``, as a density on ``Sigma`` itself.

        log p(Sigma) = log LKJ(C) + sum_i log HalfNormal(s_i) - D log 2 - D sum_i log s_i

    (the last terms are the Jacobian of ``(s, C) -> Sigma``). ``event_shape = (D, D)``;
    ``batch_shape`` from ``scale`` (``batch + (D,)``).

    Args:
        dim: matrix size ``D``.
        scale: half-normal scales of the standard deviations, ``batch + (D,)`` or scalar.
        concentration: LKJ concentration (1 is uniform over correlation matrices).
        validate_args: numpyro's flag.

    Examples:
        >>> import jax
        >>> d = LKJCovariance(2, scale=1.0)
        >>> d.sample(jax.random.key(0), (3,)).shape
        (3, 2, 2)
    """

    arg_constraints = {"scale": constraints.positive, "concentration": constraints.positive}
    support = constraints.positive_definite
    pytree_data_fields = ("scale", "concentration")
    pytree_aux_fields = ("dim",)

    def __init__(self, dim, scale=1.0, concentration=2.0, *, validate_args=None):
        self.dim = int(dim)
        scale = jnp.asarray(scale, float_dtype())
        if scale.ndim == 0:
            scale = jnp.broadcast_to(scale, (self.dim,))
        if scale.shape[-1] != self.dim:
            raise ValueError(f"scale must end in dim={self.dim}, got shape {scale.shape}")
        self.scale = scale
        self.concentration = jnp.asarray(concentration, float_dtype())
        super().__init__(batch_shape=tuple(scale.shape[:-1]), event_shape=(self.dim, self.dim),
                         validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        k1, k2 = jax.random.split(key)
        shape = tuple(sample_shape) + tuple(self.batch_shape)
        sd = jnp.abs(jax.random.normal(k1, shape + (self.dim,), self.scale.dtype)) * self.scale
        if self.dim == 1:
            corr = jnp.ones(shape + (1, 1), self.scale.dtype)
        else:
            chol = dist.LKJCholesky(self.dim, self.concentration).sample(k2, shape)
            corr = chol @ jnp.swapaxes(chol, -1, -2)
        return sd[..., :, None] * corr * sd[..., None, :]

    def log_prob(self, value):
        sd = jnp.sqrt(jnp.diagonal(value, axis1=-2, axis2=-1))
        lp = jnp.sum(dist.HalfNormal(self.scale).log_prob(sd), -1)
        lp = lp - self.dim * math.log(2.0) - self.dim * jnp.sum(jnp.log(sd), -1)
        if self.dim > 1:
            corr = value / (sd[..., :, None] * sd[..., None, :])
            lp = lp + dist.LKJ(self.dim, self.concentration).log_prob(corr)
        return lp


def check_prior_scale(scale) -> float:
    """``scale`` as a positive finite float (ValueError naming ``scale`` otherwise)."""
    try:
        c = float(scale)
    except (TypeError, ValueError) as err:
        raise TypeError(f"scale must be a positive number, got {scale!r}") from err
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return c


def _generic_prior(model, con, shape, c):
    """The constraint table's prior for one leaf at observation scale ``c``."""
    dtype = float_dtype()
    shape = tuple(shape)
    if con is constraints.simplex:
        return dist.Dirichlet(jnp.ones(shape, dtype))
    if con is constraints.positive:
        loc = 2.0 * math.log(c) if model.observation_dtype == "real" else math.log(c)
        return dist.LogNormal(jnp.full(shape, loc, dtype), 2.0)
    if con is constraints.unit_interval:
        return dist.Beta(jnp.ones(shape, dtype), 1.0)
    if con is constraints.real:
        return dist.Normal(jnp.zeros(shape, dtype), 2.0 * max(1.0, c))
    if con is constraints.positive_definite:
        return LKJCovariance(shape[-1], jnp.full(shape[:-1], 2.0 * c, dtype))
    return None


def default_priors(model, y=None, *, mask=None, scale=1.0):
    """Weakly informative priors for every parameter of ``model``, on a fixed scale.

    Uses the model's own ``default_priors`` hook where it has one, and the constraint
    table of `statseq.bayes.priors` for the leaves it leaves ``None``. The priors depend
    on the model and on ``scale`` only, never on the values of ``y``: the same ``y``
    multiplied by 1000 gets the same priors.

    Args:
        model: a statseq model.
        y: accepted for backward compatibility; its values are not used.
        mask: accepted for backward compatibility; not used.
        scale: the observation scale ``c`` of the table (default 1: standardized real
            data, counts of order 1), chosen from knowledge of the measurements.

    Returns:
        A priors pytree (the structure of ``params``) of numpyro distributions; a leaf is
        ``None`` only for constraints without a default (pass your own prior there).

    Examples:
        >>> import statseq as ss
        >>> from statseq.bayes import default_priors
        >>> priors = default_priors(ss.PoissonHMM(num_states=2), scale=20.0)
        >>> type(priors.transitions).__name__, type(priors.emissions.rates).__name__
        ('Dirichlet', 'LogNormal')
        >>> round(float(priors.emissions.rates.icdf(0.5)[0]), 6)  # median rate c = 20
        20.0
    """
    del y, mask  # the values of the data never set the prior
    c = check_prior_scale(scale)
    generic = jax.tree.map(
        lambda con, shape: _generic_prior(model, con, shape, c),
        model.param_constraints(), model.param_shapes(), is_leaf=_is_constraint,
    )
    hook = getattr(model, "default_priors", None)
    if hook is None:
        return generic
    own = hook(None, None, scale=c)
    own_leaves, tree = jax.tree.flatten(own, is_leaf=_is_prior_leaf)
    gen_leaves = tree.flatten_up_to(generic)
    return jax.tree.unflatten(
        tree, [o if o is not None else g for o, g in zip(own_leaves, gen_leaves, strict=True)]
    )


def leaf_priors(model, priors, y, mask, trainable_flags):
    """One prior per parameter leaf (pytree order): the user's where given, else the
    default; frozen leaves and empty leaves (size 0, e.g. the Elman/LSTM ``bias_rec``,
    which NumPyro cannot sample) get ``None``. Checks shapes and supports eagerly."""
    names = param_names(model)
    shapes = jax.tree.leaves(model.param_shapes(), is_leaf=is_shape)
    cons = jax.tree.leaves(model.param_constraints(), is_leaf=_is_constraint)
    tree = jax.tree.structure(model.param_shapes(), is_leaf=is_shape)
    defaults = tree.flatten_up_to(default_priors(model, y, mask=mask))
    if priors is None:
        given = [None] * len(names)
    else:
        p_leaves, p_tree = jax.tree.flatten(priors, is_leaf=_is_prior_leaf)
        for leaf in p_leaves:
            if not _is_prior_leaf(leaf):
                raise TypeError(f"prior leaves must be numpyro distributions or None, got {leaf!r}")
        try:
            given = tree.flatten_up_to(priors)
        except (ValueError, TypeError) as err:
            raise ValueError(
                "priors for NUTS/SVI must have the structure of params with a numpyro "
                "distribution (or None for the default) on each field; a joint prior on a "
                "group of fields is not supported here"
            ) from err
    out = []
    for name, shape, con, g, d, flag in zip(names, shapes, cons, given, defaults,
                                            trainable_flags, strict=True):
        if not flag or math.prod(shape) == 0:
            out.append(None)
            continue
        prior = g if g is not None else d
        if prior is None:
            raise ValueError(
                f"params.{name} (constraint {con}) has no default prior: pass one in priors"
            )
        out.append(_fit_shape(prior, tuple(shape), name, con))
    return out


def _fit_shape(prior, shape, name, con):
    """Expand a prior's batch to the leaf shape and check its support fits the leaf."""
    full = tuple(prior.batch_shape) + tuple(prior.event_shape)
    if full != shape:
        ev = tuple(prior.event_shape)
        if shape[len(shape) - len(ev):] != ev:
            raise ValueError(
                f"the prior on params.{name} has event shape {ev}, which does not fit the "
                f"leaf shape {shape}"
            )
        try:
            prior = prior.expand(shape[: len(shape) - len(ev)])
        except ValueError as err:
            raise ValueError(
                f"the prior on params.{name} has shape {full}, which does not broadcast to "
                f"{shape}"
            ) from err
    if con is not constraints.real and prior.support is constraints.real:
        raise ValueError(
            f"the prior on params.{name} has real support, but the parameter is constrained "
            f"({con}); use a prior with that support (e.g. LogNormal for positive values)"
        )
    draw = np.asarray(prior.sample(jax.random.key(0)))
    if not bool(np.all(np.asarray(con.check(jnp.asarray(draw))))):
        raise ValueError(
            f"draws from the prior on params.{name} violate its constraint ({con})"
        )
    return prior
