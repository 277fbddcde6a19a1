"""Parameters, constraints, trainable masks and priors.

Parameters are plain pytrees (a ``NamedTuple`` per model family). Each model declares a
pytree of the same structure holding ``numpyro.distributions.constraints``; the bijections
of ``numpyro.distributions.transforms.biject_to`` map between constrained and
unconstrained space, where gradient fitting and NUTS work.

Priors are a pytree of the same structure whose leaves are numpyro distributions or
``None`` (flat). The MAP objective is ``log_prob(y | params) + log_prior(params)``, with the
prior density taken in the constrained (natural) parameterization.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

from statseq.core.memo import IdentityMemo
from statseq.core.validation import X64_REMEDY, float_dtype, warn_float64_downcast


def _is_constraint(x) -> bool:
    return isinstance(x, constraints.Constraint)


def is_shape(x) -> bool:
    """Whether ``x`` is a shape tuple (a leaf of ``model.param_shapes()``)."""
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def params_treedef(model):
    """The pytree structure of ``model``'s parameters."""
    return jax.tree.structure(model.param_shapes(), is_leaf=is_shape)


def _is_prior_leaf(x) -> bool:
    return x is None or isinstance(x, dist.Distribution)


def to_unconstrained(model, params):
    """Map constrained ``params`` to unconstrained space (a pytree of the same structure).

    Examples:
        >>> import statseq as ss
        >>> model = ss.LocalLevel()
        >>> params = ss.LocalLevelParams(obs_var=4.0, level_var=1.0)
        >>> u = ss.to_unconstrained(model, params)           # log of a positive variance
        >>> round(float(u.obs_var), 4)
        1.3863
    """
    return jax.tree.map(
        lambda c, p: biject_to(c).inv(p), model.param_constraints(), params,
        is_leaf=_is_constraint,
    )


def from_unconstrained(model, uparams):
    """Map unconstrained parameters back to the constrained ``params`` pytree.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.LocalLevel()
        >>> params = ss.LocalLevelParams(obs_var=jnp.array(4.0), level_var=jnp.array(1.0))
        >>> back = ss.from_unconstrained(model, ss.to_unconstrained(model, params))
        >>> round(float(back.obs_var), 4), round(float(back.level_var), 4)
        (4.0, 1.0)
    """
    return jax.tree.map(
        lambda c, u: biject_to(c)(u), model.param_constraints(), uparams,
        is_leaf=_is_constraint,
    )


def trainable_mask(params, trainable=None):
    """A pytree of booleans (one scalar per leaf) marking which leaves are fitted.

    ``trainable`` is ``None`` (everything is fitted) or a pytree with the structure of
    ``params`` whose leaves are ``True``/``False`` (a whole leaf is fitted or frozen).
    """
    if trainable is None:
        return jax.tree.map(lambda _: True, params)
    leaves_p, tree_p = jax.tree.flatten(params)
    try:
        leaves_t = tree_p.flatten_up_to(trainable)
    except (ValueError, TypeError) as err:
        raise ValueError(
            "trainable must have the structure of params (one True/False per field)"
        ) from err
    for leaf in leaves_t:
        if not isinstance(leaf, bool | np.bool_):
            raise TypeError(f"trainable leaves must be True or False, got {leaf!r}")
    return jax.tree.unflatten(tree_p, [bool(t) for t in leaves_t])


def _prior_pairs(priors, params):
    """``(prior, value)`` pairs: each prior with the params subtree at its position.

    A prior may sit on a leaf (e.g. a Dirichlet on a transition matrix) or on a whole
    node (e.g. a normal-inverse-Wishart on ``emissions``, whose ``log_prob`` takes that
    node's NamedTuple).
    """
    prior_leaves, prior_tree = jax.tree.flatten(priors, is_leaf=_is_prior_leaf)
    values = prior_tree.flatten_up_to(params)
    return [(p, v) for p, v in zip(prior_leaves, values, strict=True) if p is not None]


def log_prior(priors, params):
    """``sum log p(theta)`` over the parameters that have a prior (``None`` is flat).

    Examples:
        >>> import numpyro.distributions as dist, statseq as ss
        >>> priors = ss.LocalLevelParams(obs_var=dist.Exponential(1.0), level_var=None)
        >>> params = ss.LocalLevelParams(obs_var=2.0, level_var=1.0)
        >>> round(float(ss.log_prior(priors, params)), 4)    # log(1 * exp(-2)); None is flat
        -2.0
    """
    total = jnp.zeros((), float_dtype())
    if priors is None:
        return total
    for prior, value in _prior_pairs(priors, params):
        total = total + jnp.sum(_log_density(prior, value))
    return total


def _log_density(prior, value):
    """``prior.log_prob(value)``, with the Dirichlet written with ``xlogy`` so that a
    probability of exactly 0 under concentration 1 gives a finite density (numpyro's
    ``log_prob`` computes ``0 * log 0 = nan`` there)."""
    if isinstance(prior, dist.Dirichlet):
        conc = prior.concentration
        norm = jax.scipy.special.gammaln(conc.sum(-1)) - jax.scipy.special.gammaln(conc).sum(-1)
        return jax.scipy.special.xlogy(conc - 1.0, value).sum(-1) + norm
    return prior.log_prob(value)


def validate_priors(model, priors) -> None:
    """Check that ``priors`` is a prefix of the params structure with dists or None."""
    if priors is None:
        return
    leaves, tree = jax.tree.flatten(priors, is_leaf=_is_prior_leaf)
    for leaf in leaves:
        if not _is_prior_leaf(leaf):
            raise TypeError(f"prior leaves must be numpyro distributions or None, got {leaf!r}")
    try:
        tree.flatten_up_to(model.param_shapes())
    except (ValueError, TypeError) as err:
        raise ValueError(
            "priors must have the structure of params, with a distribution or None on each "
            "field (or on a whole group of fields)"
        ) from err


#: parameter sets (by the identity of their JAX arrays) that passed `validate_params`
_PARAMS_OK = IdentityMemo(maxsize=64)


def _is_weak(leaf) -> bool:
    """Whether JAX would trace ``leaf`` as weakly typed (a Python number, or a JAX array
    such as ``jnp.full(shape, 0.5)`` made from one)."""
    if isinstance(leaf, jax.core.Tracer):
        return False
    if isinstance(leaf, (bool, int, float)):
        return True
    return bool(getattr(leaf, "weak_type", False))


def strong_params(params):
    """``params`` with every weakly typed leaf made strongly typed, values unchanged.

    ``jax.jit`` caches a program per argument type, and a weakly typed leaf (a Python
    float, or ``jnp.full(shape, 0.5)``) has a different type from a float array of the same
    dtype: the same fit or ``log_prob`` would compile a second program for it. The
    statseq entry points pass their parameters through here, so such a leaf reuses the
    program of the strong one. Dtypes keep their meaning: a weak leaf takes the dtype a
    computation with the other leaves would give it (float32 beside float32 leaves,
    otherwise its own dtype, or the default float dtype for a Python number), and a
    float32 array stays float32. Returns ``params`` itself when no leaf is weak.

    Examples:
        >>> import jax, jax.numpy as jnp, statseq as ss
        >>> weak = ss.LocalLevelParams(obs_var=jnp.full((), 4.0), level_var=1.0)
        >>> weak.obs_var.weak_type
        True
        >>> strong = strong_params(weak)
        >>> [getattr(leaf, "weak_type", False) for leaf in jax.tree.leaves(strong)]
        [False, False]
        >>> float(strong.obs_var), float(strong.level_var)
        (4.0, 1.0)
    """
    leaves, treedef = jax.tree.flatten(params)
    weak = [_is_weak(leaf) for leaf in leaves]
    if not any(weak):
        return params
    strong_floats = [np.dtype(leaf.dtype) for leaf, w in zip(leaves, weak, strict=True)
                     if not w and hasattr(leaf, "dtype")
                     and np.issubdtype(leaf.dtype, np.floating)]
    beside = np.result_type(*strong_floats) if strong_floats else None

    def strong(leaf, is_weak):
        if not is_weak or isinstance(leaf, bool):
            return leaf
        own = np.dtype(float_dtype()) if isinstance(leaf, (int, float)) else leaf.dtype
        dtype = beside if beside is not None and np.issubdtype(own, np.floating) else own
        # on the host (no device program is compiled for the conversion)
        return np.asarray(leaf, dtype=dtype)

    return jax.tree.unflatten(
        treedef, [strong(leaf, w) for leaf, w in zip(leaves, weak, strict=True)])


def validate_params(model, params):
    """Eagerly check the structure, shapes, finiteness and constraints of ``params``.

    A check passed by the same JAX array objects (immutable) for an equal model is
    remembered and not repeated (`statseq.core.memo`).

    Returns:
        ``params`` with weakly typed leaves made strong (`strong_params`): the value to
        pass on to compiled code, so that a weak leaf reuses the strong leaf's program.
    """
    check_params_once(model, params)
    return strong_params(params)


def check_params_once(model, params) -> None:
    """`validate_params` without making weak leaves strong (for a caller that does so
    itself, or needs only the check): the check, remembered for the same leaf objects
    (`statseq.core.memo`), so parameters passed again are not checked again.

    Args:
        model: a statseq model.
        params: its parameters.

    Raises:
        ValueError: bad shapes, non-finite or unrepresentable values, violated constraints.
        TypeError: a wrong structure or a non-real dtype.
    """
    leaves, treedef = jax.tree.flatten(params)
    flat = tuple(leaves)
    key = (model, treedef)
    if not _PARAMS_OK.get(key, flat):
        _validate_params(model, params)
        _PARAMS_OK.put(key, flat, True)


def _param_spec(model):
    """``(shapes, expected leaf shapes, treedef, constraints, names)`` of ``model``'s
    parameters; computed once per (hashable) model."""
    try:
        return _param_spec_cached(model)
    except TypeError:  # an unhashable model
        return _param_spec_cached.__wrapped__(model)


@functools.lru_cache(maxsize=64)
def _param_spec_cached(model):
    shapes = model.param_shapes()
    expected_leaves, tree = jax.tree.flatten(shapes, is_leaf=is_shape)
    cons = jax.tree.leaves(model.param_constraints(), is_leaf=_is_constraint)
    return shapes, expected_leaves, tree, cons, _leaf_names(shapes, is_shape)


#: dtype kinds of a real array (``np.number`` or bool, not complex: bool, signed and
#: unsigned integers, floats and timedelta64, a subclass of ``np.signedinteger``)
_REAL_KINDS = frozenset("biufm")


def _validate_params(model, params) -> None:
    shapes, expected_leaves, tree, cons, names = _param_spec(model)
    try:
        leaves = tree.flatten_up_to(params)
    except (ValueError, TypeError) as err:
        raise TypeError(
            f"params must be a {type(shapes).__name__} for {type(model).__name__}; "
            f"got {type(params).__name__}"
        ) from err
    checked = []
    semidefinite = set(getattr(model, "semidefinite_params", ()))
    downcast = float_dtype() == jnp.float32
    # the smallest square-root limit of the float leaves' dtypes (`_check_representable`)
    limit = math.inf
    for name, shape, value, con in zip(names, expected_leaves, leaves, cons, strict=True):
        if isinstance(value, jax.core.Tracer):
            continue
        arr = np.asarray(value)
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"params.{name} must have shape {tuple(shape)}, got {arr.shape}")
        if arr.dtype.kind not in _REAL_KINDS:  # (was np.issubdtype: the same dtypes)
            raise TypeError(f"params.{name} must be a real array, got dtype {arr.dtype}")
        given = arr
        if downcast and arr.dtype == np.float64:
            # the computation runs in float32: check the values it will actually use
            warn_float64_downcast(f"params.{name}")
            with np.errstate(over="ignore", under="ignore"):
                arr = arr.astype(np.float32)
        # a positive leaf whose smallest entry is a normal number (so neither NaN, nor 0,
        # nor subnormal) passes `_check_underflow` and its positivity constraint: one
        # reduction instead of three (anything else takes the full checks)
        positive = _positive_ok(arr, con)
        if not positive:
            _check_underflow(name, given, arr, con)
        if arr.dtype.kind == "f" and arr.size:
            limit = min(limit, _SQRT_MAX[arr.dtype] if arr.dtype in _SQRT_MAX
                        else float(np.sqrt(np.finfo(arr.dtype).max)))
        checked.append((name, arr, con, positive))
    # one pass over every leaf: finite, and no magnitude beyond the smallest limit (a NaN
    # or inf fails the comparison); otherwise the leaf-by-leaf checks name the culprit
    fast = False
    if checked:
        values = np.concatenate([arr.ravel().astype(np.float64, copy=False)
                                 for _, arr, _, _ in checked])
        if values.size:
            big = float(np.abs(values).max())
            fast = big <= limit and big < math.inf  # (limit is inf without float leaves)
        else:
            fast = True
        if not fast and not np.isfinite(values).all():
            name = next(n for n, arr, _, _ in checked if not np.all(np.isfinite(arr)))
            raise ValueError(f"params.{name} contains non-finite values")
    for name, arr, con, positive in checked:
        if not arr.size:
            continue
        if not fast:
            _check_representable(name, arr, con)
        if positive:
            continue  # every entry a positive normal number: the constraint holds
        if name in semidefinite and con in (constraints.positive_definite,
                                            constraints.positive):
            if not _is_semidefinite(arr, con):
                kind = ("positive semi-definite" if con is constraints.positive_definite
                        else "non-negative")
                raise ValueError(f"params.{name} violates its constraint: it must be {kind} "
                                 "(a singular covariance or a zero variance is allowed here)")
        elif not _satisfies(con, arr):
            raise ValueError(f"params.{name} violates its constraint ({con})")
    if hasattr(model, "check_params") and not any(
        isinstance(leaf, jax.core.Tracer) for leaf in leaves
    ):
        model.check_params(params)


#: sqrt of the largest value of the common float dtypes (`_check_representable`'s limit)
_SQRT_MAX = {np.dtype(t): float(np.sqrt(np.finfo(t).max))
             for t in (np.float16, np.float32, np.float64)}
#: their smallest normal numbers (`_check_underflow`'s floor), as NumPy scalars
_TINY = {np.dtype(t): np.finfo(t).tiny for t in (np.float16, np.float32, np.float64)}


def _is_positive(arr, con) -> bool:
    """Whether ``con`` asks every entry of ``arr`` to be positive (``positive``, or a
    ``positive_definite`` 1 x 1 matrix: a variance), as `_check_underflow` reads it."""
    return con is constraints.positive or (
        con is constraints.positive_definite and arr.shape[-2:] == (1, 1))


def _positive_ok(arr, con) -> bool:
    """Whether a positive float leaf (`_is_positive`) is non-empty with every entry at
    least the smallest normal number of its dtype: then `_check_underflow` passes and so
    does the constraint (``positive``, a 1 x 1 ``positive_definite``, and their
    semi-definite forms). ``False`` means only "check in full"."""
    if arr.dtype.kind != "f" or not arr.size or not _is_positive(arr, con):
        return False
    tiny = _TINY.get(arr.dtype)
    return bool(arr.min() >= (np.finfo(arr.dtype).tiny if tiny is None else tiny))  # NaN: no


def _check_underflow(name, given, arr, con) -> None:
    """``ValueError`` when a positive parameter (a variance, a rate) was given a positive
    value below the smallest normal number of the working dtype: it is 0 or subnormal
    there (a 1e-300 variance in float32), and its reciprocal overflows."""
    if not _is_positive(arr, con) or not arr.size or arr.dtype.kind != "f":
        return
    info = np.finfo(arr.dtype)
    with np.errstate(invalid="ignore"):
        low = (np.asarray(given, np.float64) > 0) & (arr < info.tiny)
    if np.any(low):
        remedy = f" or call {X64_REMEDY}" if arr.dtype == np.float32 else ""
        raise ValueError(f"params.{name} has a value below the smallest normal "
                         f"{arr.dtype.name} ({info.tiny:.3g}): it is 0 for the computation "
                         f"(0 variance or rate); rescale the data{remedy}")


def _check_representable(name, arr, con) -> None:
    """``ValueError`` for a magnitude whose square overflows ``arr``'s dtype."""
    del con
    if not arr.size or arr.dtype.kind != "f":
        return
    info = np.finfo(arr.dtype)
    big = float(np.max(np.abs(arr)))
    remedy = f" or call {X64_REMEDY}" if arr.dtype == np.float32 else ""
    if big > np.sqrt(info.max):
        raise ValueError(f"params.{name} has a value of magnitude {big:.3g}, beyond sqrt of "
                         f"the largest {arr.dtype.name} ({np.sqrt(info.max):.3g}): rescale "
                         f"the data and parameters{remedy}")


def _satisfies(con, arr) -> bool:
    """Whether ``arr`` satisfies ``con``, checked in NumPy for the common constraints
    (so eager validation compiles no JAX programs), else with numpyro's own check."""
    if con is constraints.real:
        return True
    if con is constraints.positive:
        return bool((arr > 0).all())
    if con is constraints.unit_interval:
        return bool(((arr >= 0) & (arr <= 1)).all())
    if con is constraints.simplex:
        tol = 1e-4 if arr.dtype == np.float32 else 1e-8
        # np.allclose(sums, 1.0, atol) spelled out (its own overhead was most of this
        # check): |sums - 1| <= atol + rtol * |1| with its default rtol, NaN failing
        atol = tol * arr.shape[-1]
        return bool((arr >= 0).all() and (np.abs(arr.sum(-1) - 1.0) <= atol + 1e-5).all())
    if con is constraints.positive_definite:
        if arr.shape[-2:] == (1, 1):  # a variance: its one eigenvalue
            return bool((arr > 0).all())
        a64 = np.asarray(arr, np.float64)
        a_t = np.swapaxes(a64, -1, -2)
        atol = 1e-6 * (1.0 + np.abs(a64).max())
        if not (np.abs(a64 - a_t) <= atol + 1e-5 * np.abs(a_t)).all():  # np.allclose
            return False
        # the smallest eigenvalue above a floor: positive definite, and not numerically
        # singular (such matrices pass Cholesky but break every density downstream)
        evals = np.linalg.eigvalsh(0.5 * (a64 + a_t))
        eps = np.finfo(arr.dtype if arr.dtype.kind == "f" else np.float64).eps
        floor = 10 * arr.shape[-1] * eps * np.abs(evals).max(axis=-1)
        return bool((evals.min(axis=-1) > floor).all())
    return bool(np.all(con.check(jnp.asarray(arr))))


def _is_semidefinite(arr, con) -> bool:
    """Whether ``arr`` is a non-negative variance (``con`` positive) or a symmetric
    positive semi-definite matrix: smallest eigenvalue ``>= -tol * scale`` with
    ``tol = 10 n eps`` and ``scale`` the largest absolute eigenvalue (or 1)."""
    if con is constraints.positive:
        return bool(np.all(arr >= 0))
    a64 = np.asarray(arr, np.float64)
    a_t = np.swapaxes(a64, -1, -2)
    atol = 1e-6 * (1.0 + np.abs(a64).max())
    if not (np.abs(a64 - a_t) <= atol + 1e-5 * np.abs(a_t)).all():
        return False
    evals = np.linalg.eigvalsh(0.5 * (a64 + a_t))
    eps = np.finfo(arr.dtype if arr.dtype.kind == "f" else np.float64).eps
    scale = np.abs(evals).max(axis=-1)
    return bool((evals.min(axis=-1) >= -10 * arr.shape[-1] * eps * scale).all())


def _leaf_names(tree, is_leaf) -> list[str]:
    paths, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return [jax.tree_util.keystr(path, simple=True, separator=".") for path, _ in paths]


def param_names(model) -> list[str]:
    """Dotted names of the parameter leaves, in pytree order."""
    return _leaf_names(model.param_shapes(), is_shape)


def all_free(flag) -> bool:
    """Whether a ``trainable`` leaf (a bool or a boolean array of free entries) is all free."""
    return bool(np.all(np.asarray(flag, bool)))


def num_free_params(model, trainable=None) -> int:
    """Number of identified free parameters among the trainable leaves.

    A ``(D, D)`` covariance counts ``D (D + 1) / 2``, a simplex of ``K`` entries ``K - 1``.
    A boolean-array leaf of ``trainable`` counts its free entries (for a covariance, those
    on and below the diagonal); ties are not seen here (see `statseq.core.restrict`).
    Exact invariances of the likelihood are then subtracted
    (`statseq.SequenceModel.num_redundant_params`): a softmax regression (input-driven
    HMM transitions, a neural categorical head) counts ``K - 1`` rows of its ``K`` logit
    rows, as a simplex counts ``K - 1`` entries; a linear Gaussian state space model does
    not count the ``n^2 + n`` parameters of a change of basis and origin of its latent
    state. The count is then the rank of the Jacobian of the per-step log-likelihoods
    with respect to the unconstrained parameters, for generic parameters and data, for
    every model but the neural networks, whose further weight symmetries are not
    subtracted (the count is an upper bound on that rank; see docs/design.md).

    Examples:
        >>> import jax, statseq as ss
        >>> model = ss.AR(order=2)
        >>> ss.num_free_params(model)          # two coefficients, an intercept, a variance
        4
        >>> frozen = jax.tree.map(lambda _: True, model.default_params())._replace(cov=False)
        >>> ss.num_free_params(model, trainable=frozen)
        3
        >>> hmm = ss.PoissonHMM(num_states=2, input_dim=1)  # 1 + (8 - 4) + 2 rates
        >>> ss.num_free_params(hmm)
        7
    """
    shapes, tree = jax.tree.flatten(model.param_shapes(), is_leaf=is_shape)
    cons = jax.tree.leaves(model.param_constraints(), is_leaf=_is_constraint)
    if trainable is None:
        flags = [True] * len(shapes)
    else:
        flags = list(tree.flatten_up_to(trainable))
    total = -model.num_redundant_params(jax.tree.unflatten(tree, flags))
    for shape, con, flag in zip(shapes, cons, flags, strict=True):
        if not isinstance(flag, bool | np.bool_):  # a per-entry mask (statseq.core.restrict)
            mask = np.asarray(flag, bool)
            if con is constraints.positive_definite and mask.ndim == 2:
                total += int(np.tril(mask).sum())  # free variances and covariances
            else:
                total += int(mask.sum())
        elif flag:
            total += math.prod(biject_to(con).inverse_shape(tuple(shape)))
    return int(total)


def degenerate_fit_warning(model, params, method: str, restriction=None) -> str | None:
    """A message when fitted ``params`` left their constraints numerically (e.g. a
    covariance became singular: the likelihood may be unbounded there), else ``None``.

    Covariances a model allows to be singular (``model.semidefinite_params``) are held to
    the strict constraint where they were fitted: on whole trainable leaves, and on the free
    entries of a `statseq.core.restrict.Restriction` (its fixed entries may be singular)."""
    try:
        validate_params(model, params)
        semidefinite = set(getattr(model, "semidefinite_params", ()))
        if semidefinite:
            _check_fitted_semidefinite(model, params, semidefinite, restriction)
    except ValueError as err:
        return (f"{method}: the fitted parameters are degenerate ({err}); the likelihood is "
                "probably unbounded along this path (e.g. a noise variance collapsing to "
                "zero). Fix or bound that parameter, or start elsewhere.")
    return None


def _check_fitted_semidefinite(model, params, semidefinite, restriction) -> None:
    names = param_names(model)
    leaves = jax.tree.leaves(params)
    cons = jax.tree.leaves(model.param_constraints(), is_leaf=_is_constraint)
    masks = (restriction.free_mask() if restriction is not None
             else [None] * len(leaves))
    for name, value, con, mask in zip(names, leaves, cons, masks, strict=True):
        if name not in semidefinite or isinstance(value, jax.core.Tracer):
            continue
        arr = np.asarray(value)
        if mask is not None:
            if not mask.any():
                continue
            if con is constraints.positive_definite:
                # the free block of each matrix (time-varying leaves are stacks of them)
                n = arr.shape[-1]
                mats = arr.reshape(-1, n, n)
                frees = np.broadcast_to(mask, arr.shape).reshape(-1, n, n)
                for a, m in zip(mats, frees, strict=True):
                    free = np.diagonal(m)
                    sub = a[np.ix_(free, free)]
                    if sub.size and not _satisfies(con, sub):
                        raise ValueError(f"params.{name} violates its constraint ({con})")
                continue
            arr = arr[mask]
        if arr.size and not _satisfies(con, arr):
            raise ValueError(f"params.{name} violates its constraint ({con})")


#: relative distance to a constraint's boundary below which a fitted value is "on" it
BOUNDARY_RTOL = 1e-6


def data_scale(y: Any, mask: Any = None) -> float:
    """The variance of the observed entries of ``y`` (their mean square when that is 0,
    1 when both are): the scale against which a fitted variance counts as 0.

    Args:
        y: the data.
        mask: optional mask (``True`` where observed), broadcastable to ``y``.

    Returns:
        A positive float.
    """
    if isinstance(y, jax.Array) and not isinstance(y, jax.core.Tracer) and (
            not y.is_fully_addressable):  # spread over processes (statseq.distributed)
        from statseq.distributed.data import global_observed_moments

        moments = global_observed_moments(y, mask)
        for scale in (moments[1] - moments[0] ** 2, moments[1]):
            if np.isfinite(scale) and scale > 0:
                return scale
        return 1.0
    arr = np.asarray(y, np.float64)
    if mask is not None:
        arr = arr[np.broadcast_to(np.asarray(mask, bool), arr.shape)]
    for scale in ((float(np.var(arr)), float(np.mean(arr**2))) if arr.size else ()):
        if np.isfinite(scale) and scale > 0:
            return scale
    return 1.0


def on_boundary(model: Any, params: Any, scale: float = 1.0,
                rtol: float = BOUNDARY_RTOL, restriction: Any = None) -> tuple[str, ...]:
    """Dotted names of the leaves of ``params`` that sit at their constraint's boundary.

    A leaf is on the boundary when, for its constraint,

    - ``positive``: some entry is ``<= rtol * scale`` (a variance or rate at 0),
    - ``positive_definite``: the smallest eigenvalue is ``<= rtol * scale``,
    - ``unit_interval``: some entry is within ``rtol`` of 0 or 1,
    - ``simplex``: some entry is ``<= rtol`` (a probability at 0),
    - ``greater_than(c)``: some entry is within ``rtol * max(1, |c|)`` of ``c``.

    Args:
        model: the model.
        params: its (fitted) parameters.
        scale: the data's scale for variances (e.g. `data_scale` of the series).
        rtol: relative tolerance.
        restriction: optional `statseq.core.restrict.Restriction` (anything with a
            ``free_mask()`` list of per-leaf boolean masks): only the fitted (free) entries
            are checked, so a value the user fixed on the boundary (a singular covariance, a
            zero variance) is not reported.

    Returns:
        A tuple of names in pytree order (as `param_names` spells them).

    Examples:
        >>> import statseq as ss
        >>> on_boundary(ss.LocalLevel(), ss.LocalLevelParams(2.0, 1e-9), scale=2.0)
        ('level_var',)
    """
    _, _, tree, cons, names = _param_spec(model)
    leaves = tree.flatten_up_to(params)
    masks = restriction.free_mask() if restriction is not None else [None] * len(leaves)
    found = []
    for name, con, value, free in zip(names, cons, leaves, masks, strict=True):
        if value is None or isinstance(value, jax.core.Tracer):
            continue
        arr = np.asarray(value, np.float64)
        if free is not None:
            free = np.broadcast_to(np.asarray(free, bool), arr.shape)
            if not free.any():
                continue
            if not free.all():
                if con is constraints.positive_definite:
                    keep = np.diagonal(free, axis1=-2, axis2=-1)
                    while keep.ndim > 1:
                        keep = keep.any(axis=0)
                    arr = arr[..., keep, :][..., :, keep]
                elif con is constraints.simplex:  # fixed probabilities are not checked
                    arr = np.where(free, arr, 1.0)
                else:
                    arr = arr[free]
        if not arr.size or not np.all(np.isfinite(arr)):
            continue
        if con is constraints.positive:
            hit = np.any(arr <= rtol * scale)
        elif con is constraints.positive_definite:
            sym = 0.5 * (arr + np.swapaxes(arr, -1, -2))
            hit = np.any(np.linalg.eigvalsh(sym).min(axis=-1) <= rtol * scale)
        elif con is constraints.unit_interval:
            hit = np.any((arr <= rtol) | (arr >= 1.0 - rtol))
        elif con is constraints.simplex:
            hit = arr.shape[-1] > 1 and np.any(arr <= rtol)
        elif isinstance(con, constraints.greater_than):
            low = float(con.lower_bound)
            hit = np.any(arr - low <= rtol * max(1.0, abs(low)))
        else:
            hit = False
        if hit:
            found.append(name)
    return tuple(found)


def boundary_warning(names: tuple[str, ...], method: str) -> str | None:
    """The warning for a fit whose optimum has ``names`` on their constraint boundary.

    Args:
        names: leaf names from `on_boundary`.
        method: the fitting function's name, for the message.

    Returns:
        The message, or ``None`` when ``names`` is empty.
    """
    if not names:
        return None
    return (f"{method}: the optimum is on the boundary of the parameter space for "
            f"{', '.join(names)} (a variance or rate at 0 relative to the data scale, or a "
            "probability at 0 or 1; see FitResult.on_boundary). The likelihood's maximum "
            "may lie at or beyond the boundary; standard errors there are not valid")


def valid_iterate(model: Any, candidates: list, method: str) -> tuple[Any, bool]:
    """The first of ``candidates`` (the fit's last iterate, then earlier ones, ending with
    the validated start) that satisfies its constraints, and whether it is not the first.

    A fit never returns parameters outside their constraints: when the last iterate left
    them (e.g. a covariance that became numerically singular), an earlier valid iterate
    comes back, with a warning naming the violation.

    Args:
        model: the model.
        candidates: parameter pytrees, most preferred first.
        method: the fitting function's name, for the warning.

    Returns:
        ``(params, replaced)``.
    """
    import warnings

    first_error = None
    for j, candidate in enumerate(candidates):
        try:
            validate_params(model, candidate)
        except ValueError as err:
            first_error = first_error or err
            continue
        if j:
            which = "the starting parameters" if j == len(candidates) - 1 else (
                "the previous iterate")
            warnings.warn(
                f"{method}: the last iterate left the parameter space ({first_error}); the "
                f"likelihood is probably unbounded along this path (e.g. a noise variance "
                f"collapsing to zero). Returning {which}, which are valid; converged=False. "
                "Fix or bound that parameter, or start elsewhere.", RuntimeWarning,
                stacklevel=3)
        return candidate, bool(j)
    return candidates[0], True


def finish_fit(model: Any, candidates: list, method: str, y: Any, mask: Any = None,
               restriction: Any = None) -> tuple[Any, bool, tuple[str, ...]]:
    """The checks every fitting function runs on its result, with their warnings.

    1. `valid_iterate`: the first of ``candidates`` inside the parameter space;
    2. `degenerate_fit_warning`: a fitted (free) covariance the model allows to be singular
       is held to the strict constraint;
    3. `on_boundary` of the free entries against the data's scale (`data_scale`).
       Leaves a model lists in ``expected_boundary_params`` (an HMM's initial distribution,
       whose maximum-likelihood estimate from one sequence is always a vertex of the simplex)
       are reported but do not warn.

    Args:
        model: the model.
        candidates: parameter pytrees, most preferred first (the last one the validated
            start).
        method: the fitting function's name, for the warnings.
        y: the (prepared) data.
        mask: its mask.
        restriction: the fit's `statseq.core.restrict.Restriction` (or ``None``).

    Returns:
        ``(params, replaced, boundary)``: the returned parameters, whether they are not
        the first candidate, and the names `on_boundary` reports.
    """
    import warnings

    fitted, replaced = valid_iterate(model, candidates, method)
    degenerate = degenerate_fit_warning(model, fitted, method, restriction)
    boundary = on_boundary(model, fitted, data_scale(y, mask), restriction=restriction)
    expected = set(getattr(model, "expected_boundary_params", ()))
    if degenerate:
        warnings.warn(degenerate, RuntimeWarning, stacklevel=3)
    elif any(name not in expected for name in boundary):
        warnings.warn(boundary_warning(boundary, method), RuntimeWarning, stacklevel=3)
    return fitted, replaced, boundary
