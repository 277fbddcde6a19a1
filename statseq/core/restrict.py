"""Restricted parameters: fixed entries and tied entries of a parameter pytree.

Textbook state space models are written with some matrix entries fixed (at 0, 1 or any
known value) and others free or equal to each other. Two pytrees like ``params`` say which:

* ``trainable``: each leaf ``True`` (every entry is free), ``False`` (the leaf is fixed at
  its value in ``params``) or a boolean array of the leaf's shape (``True`` entries are
  free, ``False`` entries keep their value in ``params``);
* ``ties``: each leaf ``None`` or an integer array of the leaf's shape; free entries with
  the same label ``>= 0`` share one value (labels are global, so entries of different leaves
  may be tied); ``-1`` means untied.

The free values form one flat vector ``z`` (one coordinate per free entry or tie group)
and `Restriction.expand` maps ``z`` to a full ``params`` pytree. What a restriction may
say depends on the leaf's constraint:

* elementwise constraints (``real``, ``positive``, ``unit_interval``, ...): any entries may
  be fixed or tied (a fixed ``positive`` entry may be 0, e.g. a zero variance);
* ``positive_definite`` (covariance) leaves: a symmetric mask whose fixed entries are
  (a) whole rows and columns (a fixed diagonal entry fixes its row and column; the entries
  between fixed and free rows must be 0, so the fixed block may be singular, e.g. a state
  without noise), and (b) off-diagonal zeros among the free rows that make the free block
  block-diagonal after a permutation (e.g. a diagonal covariance). The free block is
  ``L L^T`` with ``L`` its Cholesky factor, whose zero pattern is then that of the block
  structure, so every such matrix is reached. Ties on a covariance join free *diagonal*
  entries of rows whose off-diagonal entries are all fixed (equal variances);
* ``simplex`` leaves (rows of probabilities, e.g. transition matrices): any entries of a
  row may be fixed (e.g. a structural zero); the free entries share the remaining mass
  ``R = 1 - sum(fixed)`` of their row, as ``R softmax`` of one coordinate per free entry but
  the row's last (whose logit is 0). A row with one free entry has it determined; a row
  with every entry fixed must sum to 1; free entries need a positive remaining mass.
  Entries of one simplex leaf may be tied (a symmetric chain, one switching probability,
  equal stay probabilities), see `simplex_block`: the tie values ``t_1, ..., t_m`` (one
  per label, in label order) are mapped one after the other, ``t_k = b_k sigmoid(z_k)``
  with ``b_k = min_r (R_r - sum_{c<k} n_rc t_c) / n_rk`` over the rows ``r`` holding label
  ``k`` (``n_rc`` entries of label ``c`` in row ``r``), and each row's free untied entries
  share ``R_r - sum_c n_rc t_c`` by softmax as above. This is a bijection from the free
  coordinates onto the interior of the restricted set (a row holding tied entries needs a
  free untied entry; a simplex tie label may not join another leaf). For one label the map
  is smooth; with several, ``b_k`` is a minimum over rows (continuous, piecewise smooth);
* any other constraint (correlation matrices, ...): the whole leaf only.

Tied entries start at the mean of their unconstrained starting values (simplex entries:
of their probabilities, halved when that leaves no mass to the row's untied entries).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

from statseq.core.params import _is_constraint, param_names
from statseq.core.validation import float_dtype


def _is_spd(a) -> bool:
    try:
        np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        return False
    evals = np.linalg.eigvalsh(a)
    return bool(evals.min() > 10 * a.shape[-1] * np.finfo(np.float64).eps * evals.max())


@jax.tree_util.register_pytree_node_class
class Restriction:
    """Which entries of a parameter pytree are free, fixed or tied (see the module).

    Build one with `restrict`. The free values live in a flat vector ``z``: the
    unconstrained values of every whole leaf (``biject_to`` of its constraint), then one
    coordinate per free entry or tie group of the leaves restricted entry by entry.
    ``keep`` marks the coordinates that move (those of whole fixed leaves are held at 0 and
    the leaf's value is used instead, so a fixed leaf may be singular), ``z0`` is the start.
    ``expand(model, z)`` is the full ``params`` (differentiable, traceable). A pytree whose
    static part depends only on which leaves are restricted entry by entry, so fixing or
    freeing whole leaves reuses a compiled program.
    """

    def __init__(self, treedef, kinds, arrays, keep, z0):
        self.treedef = treedef
        self.kinds = kinds
        self.arrays = arrays
        self.keep = keep
        self.z0 = z0

    def tree_flatten(self):
        return (self.arrays, self.keep, self.z0), (self.treedef, self.kinds)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*aux, *children)

    @property
    def num_free(self) -> int:
        """The number of free scalars (moving coordinates of ``z``)."""
        return int(np.sum(np.asarray(self.keep)))

    def expand(self, model, z):
        """The constrained ``params`` pytree at ``z`` (its fixed coordinates are read from
        ``z0``, so they get no gradient)."""
        z = jnp.where(self.keep, z, self.z0)
        cons = jax.tree.leaves(model.param_constraints(), is_leaf=_is_constraint)
        out = []
        for kind, arrs, con in zip(self.kinds, self.arrays, cons, strict=True):
            if kind[0] == "leaf":
                _, start, size, ushape = kind
                value, fixed = arrs
                new = biject_to(con)(jnp.reshape(z[start:start + size], ushape))
                out.append(jnp.where(fixed, value, new.astype(value.dtype)))
            elif kind[0] == "entry":
                value, idx = arrs
                u = z[jnp.maximum(idx, 0)]
                out.append(jnp.where(idx >= 0, biject_to(con)(u), value).astype(value.dtype))
            elif kind[0] == "simplex":
                out.append(simplex_expand(z, arrs))
            else:  # "cov"
                value, idx, free_diag = arrs
                raw = jnp.where(idx >= 0, z[jnp.maximum(idx, 0)], 0.0)
                diag = jnp.diagonal(raw)
                chol = jnp.tril(raw, -1) + jnp.diag(jnp.where(free_diag, jnp.exp(diag), 0.0))
                both = free_diag[:, None] & free_diag[None, :]
                out.append(jnp.where(both, chol @ chol.T, value).astype(value.dtype))
        return jax.tree.unflatten(self.treedef, out)

    def contract(self, model, params):
        """The free vector ``z`` of ``params`` (traceable; the inverse of `expand` for
        params that satisfy the restriction: fixed entries as given, tied entries equal).
        Fixed coordinates are read from ``z0``."""
        z = self.z0
        size = z.shape[0]
        cons = jax.tree.leaves(model.param_constraints(), is_leaf=_is_constraint)
        leaves = self.treedef.flatten_up_to(params)
        for kind, arrs, con, value in zip(self.kinds, self.arrays, cons, leaves, strict=True):
            value = jnp.asarray(value)
            if kind[0] == "leaf":
                _, start, width, _ = kind
                if width:
                    u = jnp.ravel(biject_to(con).inv(value)).astype(z.dtype)
                    z = z.at[start:start + width].set(u)
            elif kind[0] == "entry":
                idx = arrs[1]
                u = biject_to(con).inv(value).astype(z.dtype)
                z = z.at[jnp.where(idx >= 0, idx, size)].set(u, mode="drop")
            elif kind[0] == "simplex":
                idx, tcoord = arrs[1], arrs[5]
                logits, zt = simplex_contract(value, arrs)
                z = z.at[jnp.where(idx >= 0, idx, size)].set(logits.astype(z.dtype),
                                                             mode="drop")
                z = z.at[tcoord].set(zt.astype(z.dtype))
            else:  # "cov": the Cholesky factor of the free block (the fixed rows set to I)
                idx, free_diag = arrs[1], arrs[2]
                both = free_diag[:, None] & free_diag[None, :]
                chol = jnp.linalg.cholesky(jnp.where(both, value, jnp.eye(value.shape[0])))
                raw = jnp.where(jnp.eye(value.shape[0], dtype=bool), jnp.log(chol), chol)
                z = z.at[jnp.where(idx >= 0, idx, size)].set(raw.astype(z.dtype),
                                                             mode="drop")
        return jnp.where(self.keep, z, self.z0)

    def free_mask(self):
        """Per leaf: a boolean array of the leaf's shape, ``True`` where the entry moves."""
        masks = []
        for kind, arrs in zip(self.kinds, self.arrays, strict=True):
            if kind[0] == "leaf":
                masks.append(np.full(np.shape(arrs[0]), not bool(arrs[1])))
            elif kind[0] == "entry":
                masks.append(np.asarray(arrs[1]) >= 0)
            elif kind[0] == "simplex":
                masks.append(np.asarray(arrs[2]) | (np.asarray(arrs[4]) >= 0))
            else:
                idx = np.asarray(arrs[1]) >= 0
                masks.append(idx | idx.T)
        return masks


def _leaf_masks(treedef, leaves, trainable, names):
    if trainable is None:
        return [np.ones(np.shape(v), bool) for v in leaves]
    try:
        flags = treedef.flatten_up_to(trainable)
    except (ValueError, TypeError) as err:
        raise ValueError(
            "trainable must have the structure of params (True/False or a boolean array of "
            "the leaf's shape for each field)") from err
    out = []
    for name, flag, value in zip(names, flags, leaves, strict=True):
        if isinstance(flag, bool | np.bool_):
            out.append(np.full(np.shape(value), bool(flag)))
            continue
        arr = np.asarray(flag)
        if arr.dtype != bool:
            raise TypeError(f"trainable.{name} must be True, False or a boolean array, got "
                            f"{flag!r}")
        if arr.shape != np.shape(value):
            raise ValueError(f"trainable.{name} must have the shape of params.{name}, "
                             f"{np.shape(value)}, got {arr.shape}")
        out.append(arr)
    return out


def _leaf_labels(treedef, leaves, ties, names):
    if ties is None:
        return [None] * len(leaves)
    try:
        labels = treedef.flatten_up_to(ties)
    except (ValueError, TypeError) as err:
        raise ValueError("ties must have the structure of params (None or an integer array "
                         "of the leaf's shape for each field)") from err
    out = []
    for name, lab, value in zip(names, labels, leaves, strict=True):
        if lab is None:
            out.append(None)
            continue
        arr = np.asarray(lab)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"ties.{name} must be an integer array (labels, -1 for untied), "
                            f"got dtype {arr.dtype}")
        if arr.shape != np.shape(value):
            raise ValueError(f"ties.{name} must have the shape of params.{name}, "
                             f"{np.shape(value)}, got {arr.shape}")
        out.append(arr.astype(np.int64) if (arr >= 0).any() else None)
    return out


def _components(free):
    """Connected components of the graph on ``range(len(free))`` with edges ``free``."""
    n = len(free)
    seen, comps = set(), []
    for s in range(n):
        if s in seen:
            continue
        comp, stack = [], [s]
        seen.add(s)
        while stack:
            i = stack.pop()
            comp.append(i)
            for j in range(n):
                if free[i, j] and j not in seen:
                    seen.add(j)
                    stack.append(j)
        comps.append(sorted(comp))
    return comps


class _Builder:
    def __init__(self):
        self.z = []  # unconstrained starting values, one list per coordinate
        self.tie_index = {}
        self.tie_kind = {}

    def coordinate(self, value, label, tie_kind, name):
        if label is not None and label >= 0:
            if label in self.tie_index:
                if self.tie_kind[label] != tie_kind:
                    raise ValueError(
                        f"ties: label {label} joins entries of different kinds ({name} and an "
                        "earlier leaf); tied entries must have the same constraint (and, for "
                        "covariances, be variances)")
                k = self.tie_index[label]
                self.z[k].append(value)
                return k
            self.tie_index[label] = len(self.z)
            self.tie_kind[label] = tie_kind
        self.z.append([value])
        return len(self.z) - 1


@partial(jax.jit, static_argnums=0)
def expand_compiled(model, restriction, z):
    """``restriction.expand(model, z)`` as one compiled program, for callers outside a
    trace (the end of a fit): eagerly each of its operations is a small program of its own
    (17 for an AR(2)), each traced, lowered and loaded from the persistent cache in a new
    process. The same values up to rounding (a covariance's ``L @ L.T`` may round its last
    bit differently inside one program: an AR(2) fit's variance moved by 1 ulp, its
    log-likelihood by 3e-15 relative); ``model`` must be hashable (a static argument)."""
    return restriction.expand(model, z)


def restrict(model, params, trainable=None, ties=None) -> tuple[Restriction, np.ndarray]:
    """A `Restriction` of ``params`` and the starting free vector ``z0``.

    Args:
        model: a statseq model.
        params: its parameters (fixed entries keep these values).
        trainable: ``None`` (all free) or a pytree like ``params`` with ``True``/``False``
            or a boolean array of the leaf's shape on each field.
        ties: ``None`` or a pytree like ``params`` with ``None`` or an integer label array of
            the leaf's shape on each field (equal labels ``>= 0`` share one value).

    Returns:
        ``(restriction, z0)`` with ``restriction.expand(model, z0)`` equal to ``params``
        (up to rounding, and with tied entries at their common starting value); ``z0`` is
        ``restriction.z0`` in float64.

    Raises:
        ValueError: a restriction the leaf's constraint cannot represent (e.g. a simplex row
            whose free entries are all tied, or a simplex tie label shared with another
            leaf), a tied entry that is fixed, or a free covariance block that does not
            start positive definite.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np, statseq as ss
        >>> from statseq.core.restrict import restrict
        >>> model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None)
        >>> p = model.default_params()._replace(dynamics_cov=jnp.diag(jnp.array([0.5, 0.0])))
        >>> trainable = jax.tree.map(lambda _: False, p)._replace(
        ...     dynamics_weights=np.array([[True, True], [False, False]]),
        ...     dynamics_cov=np.array([[True, False], [False, False]]))
        >>> res, z0 = restrict(model, p, trainable)
        >>> res.num_free  # phi_1, phi_2 and the one free variance
        3
        >>> np.round(res.expand(model, jnp.asarray(z0)).dynamics_cov, 12).tolist()
        [[0.5, 0.0], [0.0, 0.0]]
    """
    leaves, treedef = jax.tree.flatten(params)
    cons = jax.tree.leaves(model.param_constraints(), is_leaf=_is_constraint)
    names = param_names(model)
    masks = _leaf_masks(treedef, leaves, trainable, names)
    labels = _leaf_labels(treedef, leaves, ties, names)
    build = _Builder()
    kinds, arrays, fixed_coords = [], [], []
    partial = []
    inverses = _inverses(leaves, cons, masks, labels)
    for name, value, con, mask, lab, u in zip(names, leaves, cons, masks, labels, inverses,
                                              strict=True):
        value = jnp.asarray(value)
        if lab is not None and (~mask & (lab >= 0)).any():
            raise ValueError(f"ties.{name} ties entries that trainable fixes; tie only free "
                             "entries")
        if lab is None and (mask.all() or not mask.any()):
            start = len(build.z)
            kinds.append(_whole(build, name, value, con, bool(mask.any()), u))
            if not mask.any():
                fixed_coords.extend(range(start, len(build.z)))
            arrays.append((value, jax.device_put(np.asarray(not mask.any()))))
            partial.append(None)
        else:
            if con.event_dim != 0 and con is not constraints.simplex and not (
                    con is constraints.positive_definite and value.ndim == 2):
                raise ValueError(
                    f"params.{name} has constraint {con}: per-entry trainable masks and ties "
                    "are supported for elementwise constraints (real, positive, ...), simplex "
                    "rows and (n, n) covariance matrices; make trainable for this field True "
                    "or False")
            kinds.append(None)
            arrays.append(None)
            partial.append((name, value, con, mask, lab, u))
    # the entry-wise coordinates come after every whole leaf's: freezing whole leaves then
    # changes only ``keep``, not the layout
    for i, item in enumerate(partial):
        if item is None:
            continue
        name, value, con, mask, lab, u = item
        if con.event_dim == 0:
            kinds[i] = ("entry",)
            arrays[i] = _entries(build, name, value, con, mask, lab, u)
        elif con is constraints.simplex:
            kinds[i] = ("simplex",)
            arrays[i] = _simplex(build, name, value, mask, lab)
        else:
            kinds[i] = ("cov",)
            arrays[i] = _covariance(build, name, value, mask, lab)
    z0 = np.array([np.mean(v) for v in build.z], np.float64)
    keep = np.ones(len(z0), bool)
    keep[fixed_coords] = False
    z0[fixed_coords] = 0.0
    # transfers (device_put), not the small compiled programs of jnp.asarray
    restriction = Restriction(treedef, tuple(kinds), tuple(arrays), jax.device_put(keep),
                              jax.device_put(np.asarray(z0, float_dtype())))
    return restriction, z0


@jax.jit
def _inverse_leaves(cons, values):
    return [biject_to(con).inv(v) for con, v in zip(cons, values, strict=True)]


def _inverses(leaves, cons, masks, labels) -> list:
    """``biject_to(con).inv(value)`` (float64 numpy) of each leaf that `_whole` or
    `_entries` inverts, ``None`` for the others, from one compiled program: eagerly a
    covariance leaf's inverse alone is about 15 small programs, each traced, lowered and
    compiled (or loaded from the persistent cache) in a new process. numpyro's constraints
    are pytrees, so their parameters are arguments of that program, not constants. Any
    failure leaves every entry ``None``: the leaves are then inverted one by one, eagerly,
    where the checks of `restrict` come first."""
    which = []
    for i, (con, mask, lab) in enumerate(zip(cons, masks, labels, strict=True)):
        whole = lab is None and (mask.all() or not mask.any())
        if (whole and mask.any()) or (not whole and con.event_dim == 0):
            which.append(i)
    out = [None] * len(leaves)
    if which:
        try:
            got = _inverse_leaves([cons[i] for i in which],
                                  [jnp.asarray(leaves[i]) for i in which])
        except Exception:  # noqa: BLE001 - the eager path raises the precise error
            return out
        for i, u in zip(which, got, strict=True):
            out[i] = np.asarray(u, np.float64)
    return out


def _inverse(con, value, u):
    return np.asarray(biject_to(con).inv(value), np.float64) if u is None else u


def _whole(build, name, value, con, trainable, u):
    size = math.prod(biject_to(con).inverse_shape(tuple(np.shape(value))))
    ushape = tuple(biject_to(con).inverse_shape(tuple(np.shape(value))))
    start = len(build.z)
    if not trainable:
        build.z.extend([0.0] for _ in range(size))
        return ("leaf", start, size, ushape)
    arr = np.asarray(value, np.float64)
    if con is constraints.positive_definite and not all(
            _is_spd(a) for a in arr.reshape((-1,) + arr.shape[-2:])):
        raise ValueError(
            f"params.{name} is a singular (or numerically singular) covariance and cannot be "
            "fitted as a whole: fix it (trainable False), or fix its zero rows and columns "
            "with a boolean trainable mask")
    if con is constraints.positive and not (arr > 0).all():
        raise ValueError(f"params.{name} has zero entries and cannot be fitted as a whole: "
                         "fix them with a boolean trainable mask")
    u = _inverse(con, value, u)
    if not np.isfinite(u).all():
        raise ValueError(f"params.{name} lies on the boundary of its constraint ({con}): fix "
                         "it, or start inside")
    for x in u.ravel():
        build.z.append([float(x)])
    return ("leaf", start, size, ushape)


def _entries(build, name, value, con, mask, lab, u):
    u = _inverse(con, value, u)
    if not np.isfinite(u[mask]).all():
        raise ValueError(f"params.{name}: a free entry lies on the boundary of its constraint "
                         f"({con}); fix it or start inside")
    idx = np.full(mask.shape, -1, np.int32)
    for pos in zip(*np.nonzero(mask), strict=True):
        label = None if lab is None else int(lab[pos])
        idx[pos] = build.coordinate(float(u[pos]), label, ("entry", repr(con)), name)
    return (value, jnp.asarray(idx))


def _last_free(free):
    """``True`` at the last free entry of each row (the reference of the log-ratios)."""
    after = jnp.flip(jnp.cumsum(jnp.flip(free, -1), -1), -1)  # free entries at or after
    return free & (after == 1)


def simplex_rest(name, value, mask) -> np.ndarray:
    """Check a per-entry mask of the simplex leaf ``params.<name>`` and return the mass
    ``1 - sum(fixed)`` left to each row's free entries (shape ``value.shape[:-1] + (1,)``).

    Raises:
        ValueError: a row fixed entirely to values that do not sum to 1, fixed entries
            that leave no mass to a row's free entries, or a free entry at 0.
    """
    arr = np.asarray(value, np.float64)
    mask = np.broadcast_to(np.asarray(mask, bool), arr.shape)
    rows, masks = arr.reshape(-1, arr.shape[-1]), mask.reshape(-1, arr.shape[-1])
    rest = np.ones(rows.shape[0])
    for r, (row, m) in enumerate(zip(rows, masks, strict=True)):
        where = [int(i) for i in np.unravel_index(r, arr.shape[:-1])] if arr.ndim > 1 else []
        fixed_sum = float(row[~m].sum())
        if not m.any():
            if abs(fixed_sum - 1.0) > 1e-6:
                raise ValueError(
                    f"trainable.{name}{where}: every entry of this simplex row is fixed "
                    f"but the fixed values sum to {fixed_sum:.8g}, not 1")
            continue
        rest[r] = 1.0 - fixed_sum
        if rest[r] <= 1e-12:
            raise ValueError(
                f"trainable.{name}{where}: the fixed entries of this simplex row sum to "
                f"{fixed_sum:.8g}, leaving no probability for its free entries; fix the whole "
                "row or lower the fixed values")
        if not (row[m] > 0).all():
            raise ValueError(
                f"params.{name}{where}: a free entry of this simplex row is 0 (on the "
                "boundary); fix it at 0, or start inside")
    return rest.reshape(arr.shape[:-1] + (1,))


def _simplex(build, name, value, mask, lab):
    labels = [] if lab is None else sorted({int(v) for v in np.asarray(lab)[lab >= 0]})
    for label in labels:
        if label in build.tie_index:
            raise ValueError(
                f"ties.{name}: label {label} joins entries of the simplex leaf params.{name} "
                "and of another leaf; simplex ties stay within one leaf")
    arrs, z = simplex_block(name, value, mask, lab)
    offset = len(build.z)
    build.z.extend([float(v)] for v in z)
    idx, tcoord = np.asarray(arrs[1]), np.asarray(arrs[5])
    for k, label in enumerate(labels):
        build.tie_index[label] = offset + int(tcoord[k])
        build.tie_kind[label] = ("simplex", name)
    return (arrs[0], jnp.asarray(np.where(idx >= 0, idx + offset, -1).astype(np.int32)),
            *arrs[2:5], jnp.asarray((tcoord + offset).astype(np.int32)), arrs[6])


def simplex_block(name, value, mask, lab=None) -> tuple:
    """The free coordinates of one simplex leaf with fixed and tied entries.

    Returns ``(arrays, z0)``: ``arrays`` for `simplex_expand` (coordinates numbered from 0)
    and the starting coordinates ``z0`` (float64). The coordinates are one logit per free
    untied entry but each row's last (in row-major order), then one per tie label (label
    order); see the module for the map.

    Raises:
        ValueError: what `simplex_rest` raises, or a row with tied entries but no free
            untied entry (its tie values would be determined by the others: tie fewer
            entries, e.g. only the off-diagonal ones of a symmetric chain).
    """
    arr = np.asarray(value, np.float64)
    mask = np.asarray(mask, bool)
    lab = np.full(arr.shape, -1, np.int64) if lab is None else np.asarray(lab, np.int64)
    tied = mask & (lab >= 0)
    free = mask & ~tied
    rest = simplex_rest(name, value, mask)
    labels = sorted({int(v) for v in lab[tied]})
    m = len(labels)
    slot = np.full(arr.shape, -1, np.int32)
    for k, label in enumerate(labels):
        slot[tied & (lab == label)] = k
    counts = np.stack([(slot == k).sum(-1) for k in range(m)], -1) if m else np.zeros(
        arr.shape[:-1] + (0,))
    rows_t, rows_f = tied.reshape(-1, arr.shape[-1]), free.reshape(-1, arr.shape[-1])
    for r in range(rows_t.shape[0]):
        if rows_t[r].any() and not rows_f[r].any():
            where = [int(i) for i in np.unravel_index(r, arr.shape[:-1])] if arr.ndim > 1 else []
            raise ValueError(
                f"ties.{name}{where}: every free entry of this simplex row is tied, so its "
                "tie values are determined by the others (the row must sum to 1); leave at "
                "least one free entry of each row untied (e.g. tie only the off-diagonal "
                "entries of a symmetric chain)")
    # starting tie values: the mean probability of their entries, taken in label order and
    # halved into the remaining range when the mean does not fit
    used = np.zeros(arr.shape[:-1])
    zt = np.zeros(m)
    for k in range(m):
        t = float(arr[slot == k].mean())
        bound = _bound(rest[..., 0] - used, counts[..., k], np)
        frac = t / bound if t < 0.99 * bound else 0.5
        zt[k] = math.log(frac) - math.log1p(-frac)
        used = used + counts[..., k] * bound * frac
    after = np.flip(np.cumsum(np.flip(free, -1), -1), -1)  # `_last_free` in NumPy
    last = free & (after == 1)
    idx = np.full(arr.shape, -1, np.int32)
    zf = []
    for pos in zip(*np.nonzero(free & ~last), strict=True):
        ref = float(np.log(arr[pos[:-1]][last[pos[:-1]]][0]))
        idx[pos] = len(zf)
        zf.append(float(np.log(arr[pos])) - ref)
    tcoord = np.arange(len(zf), len(zf) + m, dtype=np.int32)
    dtype = jnp.asarray(value).dtype
    arrays = (jnp.asarray(value), jnp.asarray(idx), jnp.asarray(free),
              jnp.asarray(rest, dtype), jnp.asarray(slot), jnp.asarray(tcoord),
              jnp.asarray(counts, dtype))
    return arrays, np.concatenate([np.asarray(zf, np.float64), zt])


def _bound(avail, count, xp):
    """``min_r avail_r / count_r`` over the rows with ``count_r > 0``."""
    pos = count > 0
    return xp.min(xp.where(pos, avail / xp.where(pos, count, 1), xp.inf))


def _tie_values(z, arrays):
    """The tie values ``t`` (one per label) and each row's mass ``R - sum_c n_c t_c`` left to
    its untied entries, with the log of the bounds ``b_k`` (for the Jacobian)."""
    _, _, _, rest, _, tcoord, counts = arrays
    used = jnp.zeros(rest.shape[:-1], z.dtype)
    t, log_b = [], []
    for k in range(tcoord.shape[0]):
        bound = _bound(rest[..., 0] - used, counts[..., k], jnp)
        t.append(bound * jax.nn.sigmoid(z[tcoord[k]]))
        log_b.append(jnp.log(bound))
        used = used + counts[..., k] * t[-1]
    t = jnp.stack(t) if t else jnp.zeros((0,), z.dtype)
    return t, rest - used[..., None], log_b


def simplex_expand(z, arrays) -> jax.Array:
    """The simplex leaf at coordinates ``z`` (fixed entries as in ``value``, bit for bit)."""
    value, idx, free, _, slot, tcoord, _ = arrays
    t, rest, _ = _tie_values(z, arrays)
    logits = jnp.where(idx >= 0, z[jnp.maximum(idx, 0)], 0.0)
    logits = logits - jax.lax.stop_gradient(
        jnp.max(jnp.where(free, logits, -jnp.inf), axis=-1, keepdims=True, initial=0.0))
    e = jnp.where(free, jnp.exp(jnp.where(free, logits, 0.0)), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    probs = rest * e / jnp.where(total > 0, total, 1.0)
    tied = t[jnp.maximum(slot, 0)] if tcoord.shape[0] else jnp.zeros_like(probs)
    out = jnp.where(free, probs, jnp.where(slot >= 0, tied, value))
    return out.astype(value.dtype)


def simplex_log_jacobian(z, arrays) -> jax.Array:
    """``log |det d(free values) / dz|``: the free values are the tie values and every free
    untied entry but each row's last. The map is block triangular (the ties do not depend
    on the logits), so this is ``sum_k [log b_k + log sigmoid'(z_k)] + sum_rows [sum_j
    log p_j - log R'_r]`` over the rows' untied entries ``p_j`` and their mass ``R'_r``."""
    _, _, free, _, _, tcoord, _ = arrays
    _, rest, log_b = _tie_values(z, arrays)
    out = jnp.zeros((), z.dtype)
    for k in range(tcoord.shape[0]):
        out = out + log_b[k] + jax.nn.log_sigmoid(z[tcoord[k]]) + jax.nn.log_sigmoid(
            -z[tcoord[k]])
    full = simplex_expand(z, arrays)
    has = jnp.any(free, axis=-1)
    per_row = jnp.sum(jnp.where(free, jnp.log(jnp.where(free, full, 1.0)), 0.0), -1) - \
        jnp.where(has, jnp.log(jnp.where(has, rest[..., 0], 1.0)), 0.0)
    return out + jnp.sum(per_row)


def simplex_contract(value, arrays) -> tuple:
    """``(logits, tie_coordinates)`` of a simplex leaf ``value`` that satisfies the
    restriction (the inverse of `simplex_expand`; logits where ``idx >= 0``)."""
    _, _, free, rest, slot, tcoord, counts = arrays
    last = _last_free(free)
    logv = jnp.log(jnp.where(free, value, 1.0))
    ref = jnp.sum(jnp.where(last, logv, 0.0), axis=-1, keepdims=True)
    used = jnp.zeros(rest.shape[:-1], value.dtype)
    zt = []
    for k in range(tcoord.shape[0]):
        members = slot == k
        t = jnp.sum(jnp.where(members, value, 0.0)) / jnp.sum(members)
        bound = _bound(rest[..., 0] - used, counts[..., k], jnp)
        frac = t / bound
        zt.append(jnp.log(frac) - jnp.log1p(-frac))
        used = used + counts[..., k] * t
    zt = jnp.stack(zt) if zt else jnp.zeros((0,), value.dtype)
    return logv - ref, zt


def _covariance(build, name, value, mask, lab):
    n = mask.shape[0]
    arr = np.asarray(value, np.float64)
    if not (mask == mask.T).all():
        raise ValueError(f"trainable.{name} must be symmetric (a covariance entry and its "
                         "mirror are one parameter)")
    free = np.diag(mask).copy()
    off = mask & ~np.eye(n, dtype=bool)
    if (off & ~(free[:, None] & free[None, :])).any():
        raise ValueError(
            f"trainable.{name}: a free off-diagonal entry needs both its variances free (a "
            "fixed variance fixes its whole row and column)")
    cross = free[:, None] & ~free[None, :]
    if (arr[cross] != 0).any():
        raise ValueError(
            f"params.{name}: the entries between the free and the fixed rows must be 0 (the "
            "fixed rows form a separate block)")
    sub = np.ix_(free, free)
    free_off = off[sub]
    if (arr[sub][~free_off & ~np.eye(free.sum(), dtype=bool)] != 0).any():
        raise ValueError(f"params.{name}: fixed off-diagonal entries among the free rows "
                         "must be 0")
    for comp in _components(free_off):
        block = free_off[np.ix_(comp, comp)] | np.eye(len(comp), dtype=bool)
        if not block.all():
            raise ValueError(
                f"trainable.{name}: the free entries must form a block-diagonal pattern (up "
                "to a permutation); this zero pattern is not reachable by L L^T")
    if lab is not None:
        for i in np.nonzero(np.diag(lab) >= 0)[0]:
            if off[i].any():
                raise ValueError(
                    f"ties.{name}: a tied variance must have its covariances fixed (ties join "
                    "variances of diagonal blocks)")
        if (lab[off] >= 0).any():
            raise ValueError(f"ties.{name}: only variances (diagonal entries) can be tied")
    rows = np.nonzero(free)[0]
    if not _is_spd(arr[sub]):
        raise ValueError(f"params.{name}: the free block must start positive definite")
    chol = np.zeros((n, n))
    chol[sub] = np.linalg.cholesky(arr[sub])
    idx = np.full((n, n), -1, np.int32)
    for i in rows:
        label = None if lab is None else int(lab[i, i])
        idx[i, i] = build.coordinate(float(np.log(chol[i, i])), label, ("variance",), name)
        for j in rows[rows < i]:
            if off[i, j]:
                idx[i, j] = build.coordinate(float(chol[i, j]), None, None, name)
    return (value, jnp.asarray(idx), jnp.asarray(free))


def num_restricted_params(model, params, trainable=None, ties=None) -> int:
    """Number of free scalars under ``trainable`` and ``ties`` (the length of ``z``)."""
    return restrict(model, params, trainable, ties)[0].num_free
