"""The exact M-step of a simplex leaf with tied entries (transition or initial probabilities
with equal entries), used by `statseq.fit_em`.

For a simplex leaf ``A`` that enters the expected log joint as ``sum_ij N_ij log A_ij``
(transition rows, initial probabilities and categorical emissions, with a Dirichlet prior
adding ``alpha - 1`` to ``N``), the M-step maximizes that sum subject to the restriction:
fixed entries, tie values ``t_c`` shared by the entries of label ``c``, and rows summing
to 1. Given ``t``, each row's free untied entries share the mass
``s_r = R_r - sum_c n_rc t_c`` in proportion to their counts (Lagrange), so the problem
reduces to the tie values alone,

    max_t  sum_c N_c log t_c + sum_r M_r log(R_r - sum_c n_rc t_c),

with ``N_c`` the total count of label ``c``, ``M_r`` that of row ``r``'s untied free entries,
``R_r = 1 - sum(fixed)``. With nonnegative counts this is concave (logs of affine maps), and
damped Newton steps that stay inside the polytope ``t > 0, s > 0`` solve it. One label
in rows that all hold it once with ``R_r = 1`` has the closed form
``t = N_c / (N_c + sum_r M_r)``. The counts are read off the expected log joint as
``N = A * dQ/dA`` (exact for the ``N log A`` form above).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NEWTON_STEPS = 30
_HALVINGS = 30


def _profile(t, nc, mr, n, r):
    """The reduced objective at tie values ``t`` (``-inf`` outside the polytope)."""
    s = r - jnp.tensordot(n, t, axes=1)
    inside = jnp.all(t > 0) & jnp.all(jnp.where(mr != 0, s > 0, True))
    val = jnp.sum(jnp.where(nc != 0, nc * jnp.log(jnp.where(t > 0, t, 1.0)), 0.0)) + \
        jnp.sum(jnp.where(mr != 0, mr * jnp.log(jnp.where(s > 0, s, 1.0)), 0.0))
    return jnp.where(inside, val, -jnp.inf)


def tied_simplex_mle(counts, value, arrays) -> jax.Array:
    """The maximizer of ``sum N log A`` over a tied simplex leaf (see the module).

    Args:
        counts: expected counts ``N`` of the leaf's shape (prior ``alpha - 1`` included).
        value: the current leaf (its fixed entries are kept, and rows whose free untied
            entries have no count keep their proportions); Newton starts at its ties.
        arrays: the leaf's `statseq.core.restrict.simplex_block` arrays.

    Returns:
        The new leaf (tied entries exactly equal, rows summing to 1).
    """
    _, _, free, rest, slot, tcoord, n = arrays
    m = tcoord.shape[0]
    onehot = (slot[..., None] == jnp.arange(m)).astype(value.dtype)
    axes = tuple(range(value.ndim))
    nc = jnp.sum(counts[..., None] * onehot, axis=axes)
    mr = jnp.sum(jnp.where(free, counts, 0.0), axis=-1)
    r = rest[..., 0]
    t0 = jnp.sum(value[..., None] * onehot, axis=axes) / jnp.sum(onehot, axis=axes)
    lead = tuple(range(r.ndim))

    def newton(_, t):
        s = r - jnp.tensordot(n, t, axes=1)
        w = jnp.where(mr != 0, mr / jnp.where(s > 0, s, 1.0), 0.0)
        g = nc / t - jnp.tensordot(w, n, axes=(lead, lead))
        hess = -jnp.diag(nc / t**2) - jnp.tensordot(
            (w / jnp.where(s > 0, s, 1.0))[..., None] * n, n, axes=(lead, lead))
        d = jnp.linalg.solve(hess, -g)
        ok = jnp.all(jnp.isfinite(d)) & (jnp.dot(g, d) > 0)
        d = jnp.where(ok, d, g * t**2)  # not concave here (negative counts): scaled ascent
        nd = jnp.tensordot(n, d, axes=1)
        lim = jnp.minimum(
            jnp.min(jnp.where(d < 0, t / jnp.where(d < 0, -d, 1.0), jnp.inf)),
            jnp.min(jnp.where(nd > 0, s / jnp.where(nd > 0, nd, 1.0), jnp.inf)))
        alphas = jnp.minimum(1.0, 0.99 * lim) * 0.5 ** jnp.arange(_HALVINGS)
        vals = jax.vmap(lambda a: _profile(t + a * d, nc, mr, n, r))(alphas)
        up = vals >= _profile(t, nc, mr, n, r)  # near the optimum f is flat to rounding
        a = jnp.where(jnp.any(up), alphas[jnp.argmax(up)], 0.0)
        return t + a * d

    t = jax.lax.fori_loop(0, _NEWTON_STEPS, newton, t0)
    s = (r - jnp.tensordot(n, t, axes=1))[..., None]
    share = jnp.where(mr[..., None] > 0, counts, jnp.where(free, value, 0.0))
    share = jnp.where(free, share, 0.0)
    total = jnp.sum(share, axis=-1, keepdims=True)
    untied = s * share / jnp.where(total > 0, total, 1.0)
    out = jnp.where(free, untied, jnp.where(slot >= 0, t[jnp.maximum(slot, 0)], value))
    return out.astype(value.dtype)


def tied_simplex_m_step(restriction, q_of, params):
    """Replace every simplex leaf with tied entries by `tied_simplex_mle` of its counts
    ``A * dQ/dA``, keeping each replacement only if it does not decrease ``q_of``."""
    leaves, tree = jax.tree.flatten(params)
    for i, (kind, arrs) in enumerate(zip(restriction.kinds, restriction.arrays,
                                         strict=True)):
        if kind[0] != "simplex" or arrs[5].shape[0] == 0:
            continue

        def q_leaf(a, i=i):
            return q_of(jax.tree.unflatten(tree, [*leaves[:i], a, *leaves[i + 1:]]))

        old = leaves[i]
        counts = old * jax.grad(q_leaf)(old)
        new = tied_simplex_mle(counts, old, arrs)
        better = jnp.all(jnp.isfinite(new)) & (q_leaf(new) >= q_leaf(old))
        leaves[i] = jnp.where(better, new, old)
    return jax.tree.unflatten(tree, leaves)
