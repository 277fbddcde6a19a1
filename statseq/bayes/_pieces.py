"""Free entries of simplex rows with fixed entries, as one NumPyro site.

A row ``p`` of a simplex leaf (a transition row, an emission probability vector) with some
entries fixed leaves the mass ``r = 1 - sum(fixed)`` to its ``n`` free entries. When
``n >= 2`` they live on the scaled simplex ``{q >= 0 : sum q = r}``, parameterized by
``n - 1`` unconstrained logits (the row's last free entry has logit 0):

    q = r softmax(u_1, ..., u_{n-1}, 0),
    log |det dq_{1:n-1} / du| = (n - 1) log r + sum_j log(q_j / r).

A site concatenates such segments (one per row with at least two free entries, rows in
row-major order); a row with one free entry has it determined (``r``) and is not sampled.
Under a ``Dirichlet(alpha)`` prior on the full row, the conditional law of the free
entries given the fixed ones is ``q / r ~ Dirichlet(alpha_free)`` (a scaled Dirichlet),
whose density on the free coordinates is proportional to ``prod_j q_j^(alpha_j - 1)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints
from numpyro.distributions.transforms import Transform, biject_to


class RowSimplices(constraints.Constraint):
    """Consecutive segments of lengths ``segments`` (each ``>= 2``), segment ``s``
    non-negative and summing to ``rest[s]``."""

    event_dim = 1

    def __init__(self, segments, rest):
        self.segments = tuple(int(n) for n in segments)
        self.rest = tuple(float(r) for r in rest)

    def tree_flatten(self):
        return (), ((), {"segments": self.segments, "rest": self.rest})

    def __call__(self, x):
        ok = jnp.all(x >= 0, axis=-1)
        start = 0
        for n, r in zip(self.segments, self.rest, strict=True):
            total = jnp.sum(x[..., start:start + n], axis=-1)
            ok = ok & (jnp.abs(total - r) < 1e-6)
            start += n
        return ok

    def feasible_like(self, prototype):
        row = np.concatenate([np.full(n, r / n) for n, r in zip(self.segments, self.rest,
                                                               strict=True)])
        return jnp.broadcast_to(jnp.asarray(row, prototype.dtype), prototype.shape)

    def eq(self, other, static=False):
        return (isinstance(other, RowSimplices) and other.segments == self.segments
                and other.rest == self.rest)

    def __repr__(self):
        return f"RowSimplices(segments={self.segments}, rest={self.rest})"


class RowSimplicesTransform(Transform):
    """``R^{sum(n_s - 1)} -> RowSimplices``: ``r_s softmax(u_s, 0)`` per segment."""

    domain = constraints.real_vector

    def __init__(self, codomain: RowSimplices):
        self._codomain = codomain

    @property
    def codomain(self):
        return self._codomain

    def tree_flatten(self):
        return (), ((), {"_codomain": self._codomain})

    def __call__(self, x):
        out, start = [], 0
        for n, r in zip(self._codomain.segments, self._codomain.rest, strict=True):
            u = x[..., start:start + n - 1]
            logits = jnp.concatenate([u, jnp.zeros(u.shape[:-1] + (1,), u.dtype)], -1)
            out.append(r * jax.nn.softmax(logits, axis=-1))
            start += n - 1
        return jnp.concatenate(out, axis=-1)

    def _inverse(self, y):
        out, start = [], 0
        for n in self._codomain.segments:
            seg = jnp.log(y[..., start:start + n])
            out.append(seg[..., :-1] - seg[..., -1:])
            start += n
        return jnp.concatenate(out, axis=-1)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        total, start = 0.0, 0
        for n, r in zip(self._codomain.segments, self._codomain.rest, strict=True):
            u = x[..., start:start + n - 1]
            logits = jnp.concatenate([u, jnp.zeros(u.shape[:-1] + (1,), u.dtype)], -1)
            total = total + jnp.sum(jax.nn.log_softmax(logits, axis=-1), -1) + (
                (n - 1) * np.log(r))
            start += n - 1
        return total

    def forward_shape(self, shape):
        return shape[:-1] + (shape[-1] + len(self._codomain.segments),)

    def inverse_shape(self, shape):
        return shape[:-1] + (shape[-1] - len(self._codomain.segments),)

    def eq(self, other, static=False):
        return (isinstance(other, RowSimplicesTransform)
                and self._codomain.eq(other._codomain))


@biject_to.register(RowSimplices)
def _transform_to_row_simplices(constraint):
    return RowSimplicesTransform(constraint)


def simplex_rows_site(mask, rest):
    """``(site_mask, support)`` of a simplex leaf with free entries ``mask`` and per-row
    free mass ``rest`` (leaf shape without the last axis): the sampled entries (rows with
    at least two free entries) and their `RowSimplices`, or ``support=None`` when no row
    has two free entries."""
    rows = mask.reshape(-1, mask.shape[-1])
    counts = rows.sum(-1)
    site = (rows & (counts >= 2)[:, None]).reshape(mask.shape)
    keep = counts >= 2
    if not keep.any():
        return site, None
    return site, RowSimplices(counts[keep], np.asarray(rest).reshape(-1)[keep])
