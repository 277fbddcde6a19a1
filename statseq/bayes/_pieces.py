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


class BlockCovariance(constraints.Constraint):
    """The free lower-triangular entries (positions ``rows``, ``cols`` of a ``(dim, dim)``
    covariance, row-major) of a covariance whose free rows form diagonal blocks (up to a
    permutation; the fixed rows and the entries between blocks are fixed, see
    `statseq.core.restrict`): each block is positive definite."""

    event_dim = 1

    def __init__(self, dim, rows, cols, blocks):
        self.dim = int(dim)
        self.rows = tuple(int(r) for r in rows)
        self.cols = tuple(int(c) for c in cols)
        self.blocks = tuple(tuple(int(i) for i in b) for b in blocks)

    def tree_flatten(self):
        return (), ((), {"dim": self.dim, "rows": self.rows, "cols": self.cols,
                         "blocks": self.blocks})

    def __call__(self, x):
        diag = np.array([r == c for r, c in zip(self.rows, self.cols, strict=True)])
        return jnp.all(x[..., diag] > 0, axis=-1)

    def feasible_like(self, prototype):
        diag = np.array([r == c for r, c in zip(self.rows, self.cols, strict=True)], float)
        return jnp.broadcast_to(jnp.asarray(diag, prototype.dtype), prototype.shape)

    def eq(self, other, static=False):
        return isinstance(other, BlockCovariance) and other.tree_flatten() == self.tree_flatten()

    def __repr__(self):
        return f"BlockCovariance(dim={self.dim}, blocks={self.blocks})"


class BlockCovarianceTransform(Transform):
    """Unconstrained Cholesky entries (log on the diagonal) at the same positions ->
    the free entries of ``L L^T``. Per block of size ``m`` (local index ``i = 1..m``):
    ``log |det| = m log 2 + sum_i (m - i + 2) log L_ii`` (``vech(L) -> vech(L L^T)``
    contributes ``2^m prod_i L_ii^(m - i + 1)``, the exponential of the diagonal one more
    ``L_ii``)."""

    domain = constraints.real_vector

    def __init__(self, codomain: BlockCovariance):
        self._codomain = codomain
        c = codomain
        self._diag = np.array([r == k for r, k in zip(c.rows, c.cols, strict=True)])
        coef = np.zeros(len(c.rows))
        for block in c.blocks:
            m = len(block)
            for i, row in enumerate(block):
                coef[_position(c, row, row)] = m - i + 1  # i is 0-based
        self._coef = coef
        self._const = float(sum(len(b) for b in c.blocks) * np.log(2.0))

    @property
    def codomain(self):
        return self._codomain

    def tree_flatten(self):
        return (), ((), {"_codomain": self._codomain, "_diag": self._diag,
                         "_coef": self._coef, "_const": self._const})

    def _chol(self, x):
        c = self._codomain
        vals = jnp.where(self._diag, jnp.exp(x), x)
        lead = x.shape[:-1]
        chol = jnp.zeros(lead + (c.dim, c.dim), x.dtype)
        return chol.at[..., np.array(c.rows), np.array(c.cols)].set(vals)

    def __call__(self, x):
        c = self._codomain
        chol = self._chol(x)
        cov = chol @ jnp.swapaxes(chol, -1, -2)
        return cov[..., np.array(c.rows), np.array(c.cols)]

    def _inverse(self, y):
        c = self._codomain
        lead = y.shape[:-1]
        rows, cols = np.array(c.rows), np.array(c.cols)
        free = np.zeros(c.dim, bool)
        free[rows] = True
        cov = jnp.broadcast_to(jnp.diag(jnp.asarray(~free, y.dtype)), lead + (c.dim, c.dim))
        cov = cov.at[..., rows, cols].set(y).at[..., cols, rows].set(y)
        chol = jnp.linalg.cholesky(cov)[..., rows, cols]
        return jnp.where(self._diag, jnp.log(jnp.where(self._diag, chol, 1.0)), chol)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        return self._const + jnp.sum(jnp.where(self._diag, self._coef * x, 0.0), axis=-1)

    def forward_shape(self, shape):
        return shape

    def inverse_shape(self, shape):
        return shape

    def eq(self, other, static=False):
        return (isinstance(other, BlockCovarianceTransform)
                and self._codomain.eq(other._codomain))


def _position(c, row, col):
    return next(k for k, (r, q) in enumerate(zip(c.rows, c.cols, strict=True))
                if r == row and q == col)


@biject_to.register(BlockCovariance)
def _transform_to_block_covariance(constraint):
    return BlockCovarianceTransform(constraint)


def covariance_site(name, value, mask):
    """``(site_mask, support)`` of a covariance leaf with free entries ``mask``: the free
    lower-triangular entries and their `BlockCovariance` (patterns checked as in
    `statseq.core.restrict`; the fixed variances must be positive, since the prior is a
    density of the whole matrix, 0 at a singular one)."""
    from statseq.core.restrict import _Builder, _components, _covariance

    _covariance(_Builder(), name, value, mask, None)  # raises on unreachable patterns
    arr = np.asarray(value, np.float64)
    free_rows = np.diag(mask)
    if (np.diag(arr)[~free_rows] <= 0).any():
        raise ValueError(
            f"params.{name}: fit_nuts and fit_svi need the fixed variances positive (the "
            "prior is a density of the whole covariance, zero at a singular one); a zero "
            "variance can be fixed in fit_lbfgs / fit_em")
    site = np.tril(mask)
    rows, cols = np.nonzero(site)
    idx = np.nonzero(free_rows)[0]
    off = mask & ~np.eye(mask.shape[0], dtype=bool)
    blocks = [tuple(int(idx[i]) for i in comp) for comp in _components(off[np.ix_(idx, idx)])]
    return site, BlockCovariance(mask.shape[0], rows, cols, blocks)


class TiedSimplexRows(constraints.Constraint):
    """The free entries (row-major) of a simplex leaf with fixed and tied entries (see
    `statseq.core.restrict.simplex_block`): non-negative, tied entries equal, each row
    summing to 1 with its fixed entries. Hashable: the leaf, its free mask and labels are
    kept as tuples."""

    event_dim = 1

    def __init__(self, name, value, mask, labels):
        self.name = str(name)
        self.shape = tuple(int(s) for s in np.shape(value))
        self.value = tuple(float(v) for v in np.ravel(value))
        self.mask = tuple(bool(v) for v in np.ravel(mask))
        self.labels = tuple(int(v) for v in np.ravel(labels))

    def block(self):
        """``(arrays, z0)`` of `simplex_block` (float64 arrays)."""
        from statseq.core.restrict import simplex_block

        return simplex_block(self.name, np.reshape(self.value, self.shape),
                             np.reshape(self.mask, self.shape),
                             np.reshape(self.labels, self.shape))

    def full(self, x):
        """The leaf with its free entries ``x`` (``(..., k)``) set."""
        mask = np.reshape(self.mask, self.shape)
        base = jnp.broadcast_to(jnp.reshape(jnp.asarray(self.value, x.dtype), self.shape),
                                x.shape[:-1] + self.shape)
        return base.at[(Ellipsis, *np.nonzero(mask))].set(x)

    def tree_flatten(self):
        return (), ((), {"name": self.name, "shape": self.shape, "value": self.value,
                         "mask": self.mask, "labels": self.labels})

    def __call__(self, x):
        full = self.full(x)
        lab = np.reshape(self.labels, self.shape)
        ok = jnp.all(x >= 0, axis=-1) & jnp.all(
            jnp.abs(jnp.sum(full, -1) - 1.0) < 1e-6, axis=tuple(range(-len(self.shape) + 1, 0)))
        for label in set(self.labels) - {-1}:
            vals = full[(Ellipsis, *np.nonzero(lab == label))]
            ok = ok & jnp.all(jnp.abs(vals - vals[..., :1]) < 1e-9, axis=-1)
        return ok

    def feasible_like(self, prototype):
        arrays, z0 = self.block()
        from statseq.core.restrict import simplex_expand

        full = simplex_expand(jnp.asarray(z0), arrays)
        x = full[np.nonzero(np.reshape(self.mask, self.shape))]
        return jnp.broadcast_to(x.astype(prototype.dtype), prototype.shape)

    def eq(self, other, static=False):
        return isinstance(other, TiedSimplexRows) and other.tree_flatten() == self.tree_flatten()

    def __repr__(self):
        return f"TiedSimplexRows({self.name}, shape={self.shape})"


class TiedSimplexTransform(Transform):
    """The free coordinates ``z`` of `simplex_block` -> the free entries of the leaf
    (`simplex_expand`), with ``log |det|`` = `simplex_log_jacobian` (the density is put on
    the tie values and every free untied entry but each row's last)."""

    domain = constraints.real_vector

    def __init__(self, codomain: TiedSimplexRows):
        self._codomain = codomain
        arrays, z0 = codomain.block()
        self._arrays = arrays
        self._size = len(z0)
        self._where = np.nonzero(np.reshape(codomain.mask, codomain.shape))

    @property
    def codomain(self):
        return self._codomain

    def tree_flatten(self):
        return (), ((), {"_codomain": self._codomain})

    @classmethod
    def tree_unflatten(cls, aux_data, params):
        return cls(aux_data[1]["_codomain"])

    def _batched(self, fn, x):
        flat = jnp.reshape(x, (-1, x.shape[-1]))
        out = jax.vmap(fn)(flat)
        return jnp.reshape(out, x.shape[:-1] + out.shape[1:])

    def _arrays_as(self, dtype):
        return tuple(a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
                     for a in self._arrays)

    def __call__(self, x):
        from statseq.core.restrict import simplex_expand

        arrays = self._arrays_as(x.dtype)
        return self._batched(lambda z: simplex_expand(z, arrays)[self._where], x)

    def _inverse(self, y):
        from statseq.core.restrict import simplex_contract

        arrays = self._arrays_as(y.dtype)
        idx, tcoord = np.asarray(arrays[1]), np.asarray(arrays[5])

        def one(v):
            logits, zt = simplex_contract(self._codomain.full(v), arrays)
            z = jnp.zeros(self._size, v.dtype).at[idx[idx >= 0]].set(logits[idx >= 0])
            return z.at[tcoord].set(zt)

        return self._batched(one, y)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        from statseq.core.restrict import simplex_log_jacobian

        arrays = self._arrays_as(x.dtype)
        flat = jnp.reshape(x, (-1, x.shape[-1]))
        return jnp.reshape(jax.vmap(lambda z: simplex_log_jacobian(z, arrays))(flat),
                           x.shape[:-1])

    def forward_shape(self, shape):
        return shape[:-1] + (len(self._where[0]),)

    def inverse_shape(self, shape):
        return shape[:-1] + (self._size,)

    def eq(self, other, static=False):
        return (isinstance(other, TiedSimplexTransform)
                and self._codomain.eq(other._codomain))


@biject_to.register(TiedSimplexRows)
def _transform_to_tied_simplex(constraint):
    return TiedSimplexTransform(constraint)
