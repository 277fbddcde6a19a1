"""The log joint as a function of one flat vector of unconstrained parameters.

Shared by `statseq.fit.lbfgs` (which minimizes it) and `statseq.fit.inference_stats`
(which differentiates it twice). The vector holds every leaf (``ravel_pytree`` of the
unconstrained params); a boolean vector ``keep`` marks the trainable coordinates, and the
frozen ones are read from ``x0`` instead, so their gradient is exactly zero. ``keep`` is
an array, not a static argument: freezing other leaves reuses the compiled program.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.params import from_unconstrained, log_prior, trainable_mask
from statseq.core.recurrence import run_filter


def trainable_flags(params, trainable) -> tuple[bool, ...]:
    """One Python bool per leaf of ``params`` (pytree order)."""
    return tuple(jax.tree.leaves(trainable_mask(params, trainable)))


def coordinate_mask(uparams, flags) -> np.ndarray:
    """``True`` for the entries of ``ravel_pytree(uparams)`` that belong to trainable leaves."""
    return np.concatenate([
        np.full(math.prod(np.shape(leaf)), t, bool)
        for leaf, t in zip(jax.tree.leaves(uparams), flags, strict=True)
    ] + [np.zeros(0, bool)])


def negative_log_joint(model, unravel, x0, keep, priors, y, mask, inputs, complete):
    """``x -> -[log p(y | theta) + log p(theta)]`` summed over the batch, where ``theta``
    is ``x`` on the trainable coordinates and ``x0`` elsewhere (unconstrained)."""

    def objective(x):
        params = from_unconstrained(model, unravel(jnp.where(keep, x, x0)))
        log_probs, *_ = run_filter(model, params, y, mask, inputs, complete=complete)
        return -(jnp.sum(log_probs) + log_prior(priors, params))

    return objective


def restricted_negative_log_joint(model, restriction, priors, y, mask, inputs, complete):
    """``z -> -[log p(y | theta) + log p(theta)]`` summed over the batch, where ``theta =
    restriction.expand(model, z)`` (free entries from ``z``, fixed ones as given; see
    `statseq.core.restrict`)."""

    def objective(z):
        params = restriction.expand(model, z)
        log_probs, *_ = run_filter(model, params, y, mask, inputs, complete=complete)
        return -(jnp.sum(log_probs) + log_prior(priors, params))

    return objective
