"""The NumPyro model shared by `fit_nuts` and `fit_svi`: priors on the trainable
leaves, frozen leaves fixed, and the sequence likelihood as one observed site."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

from statseq.bayes._pieces import TiedSimplexRows
from statseq.bayes.distribution import SequenceDistribution
from statseq.bayes.priors import leaf_priors
from statseq.core.params import (
    is_shape,
    param_names,
    params_treedef,
    trainable_mask,
    validate_params,
)
from statseq.core.validation import prepare_data


class JointSpec(NamedTuple):
    """Everything the NumPyro model needs, prepared eagerly (hashable parts aside)."""

    model: Any
    names: list
    shapes: list
    priors: list          # one prior per leaf, None where frozen
    fixed: list           # leaf values (used where frozen, and to start the sampler)
    ordered: int | None   # index of the leaf sampled under an ordering constraint
    data: Any             # statseq.core.validation.Prepared
    entry_masks: Any = None  # per leaf: None, or the boolean free mask of a partial leaf
    ties: Any = ()        # tie groups: ((label, ((leaf, index), ...)), ...), label order
    supports: Any = None  # per leaf: None, or the support of a partial simplex/cov leaf


def prepare_joint(model, y, *, priors, mask, inputs, init_params, trainable, ordered, key,
                  ties=None):
    """Validate everything eagerly and collect the pieces of the NumPyro model."""
    data = prepare_data(model, y, mask, inputs)
    if init_params is None:
        if hasattr(model, "initialize"):
            try:
                init_params = model.initialize(y, key=key, mask=mask, inputs=inputs)
            except NotImplementedError:
                init_params = None
        if init_params is None and hasattr(model, "default_params"):
            init_params = model.default_params()
        if init_params is None:
            raise ValueError(f"{type(model).__name__} has no initializer: pass init_params")
    validate_params(model, init_params)
    names = param_names(model)
    leaves = params_treedef(model).flatten_up_to(init_params)
    entry_masks = _entry_masks(model, init_params, trainable, names)
    flags = tuple(m is not False for m in entry_masks)
    entry_masks, groups, simplex_labels = _tie_groups(model, init_params, entry_masks, ties,
                                                      names)
    entry_masks = [m if isinstance(m, np.ndarray) else None for m in entry_masks]
    entry_masks, site_sups = _simplex_sites(model, leaves, entry_masks, names,
                                            simplex_labels)
    leaves = list(leaves)
    for i, sup in enumerate(site_sups):
        if isinstance(sup, TiedSimplexRows):  # tied entries start at their common value
            leaves[i] = sup.full(sup.feasible_like(jnp.zeros(int(entry_masks[i].sum()))))
    shapes = [tuple(s) for s in jax.tree.leaves(model.param_shapes(), is_leaf=is_shape)]
    leaf_p = leaf_priors(model, priors, y, mask, flags)
    index = None
    if ordered is not None:
        if ordered not in names:
            raise ValueError(f"ordered must name a parameter leaf ({', '.join(names)}); "
                             f"got {ordered!r}")
        index = names.index(ordered)
        con = jax.tree.leaves(model.param_constraints(),
                              is_leaf=lambda c: isinstance(c, constraints.Constraint))[index]
        if len(shapes[index]) != 1 or con not in (constraints.real, constraints.positive):
            raise ValueError(
                f"ordered={ordered!r} needs a vector leaf (one value per state) with a real "
                f"or positive constraint; params.{ordered} has shape {shapes[index]} ({con})"
            )
        if leaf_p[index] is None:
            raise ValueError(f"ordered={ordered!r} names a frozen leaf")
        if entry_masks[index] is not None:
            raise ValueError(f"ordered={ordered!r} names a leaf with fixed entries")
        leaves = list(leaves)
        leaves[index] = jnp.sort(jnp.asarray(leaves[index]))
    for i, m in enumerate(entry_masks):
        if m is not None and con_of(model, i) is constraints.positive_definite:
            continue  # the prior is a density of the whole matrix (event (n, n))
        if site_sups[i] is not None or (m is not None and con_of(model, i)
                                       is constraints.simplex):
            if dirichlet_concentration(leaf_p[i]) is None:
                raise ValueError(
                    f"params.{names[i]} has fixed entries in simplex rows, so its prior must "
                    f"be a Dirichlet (the free entries get the scaled Dirichlet of the rest "
                    f"of their row), got {leaf_p[i]}")
            continue
        if m is not None and leaf_p[i].event_shape != ():
            raise ValueError(f"params.{names[i]} has fixed or tied entries, so its prior must "
                             f"be elementwise (event_shape ()), got {leaf_p[i]}")
    leaves = [jnp.asarray(v) for v in leaves]
    for label, members in groups:
        supports = {repr(leaf_p[i].support) for i, _ in members}
        if len(supports) > 1:
            raise ValueError(f"ties: label {label} joins entries whose priors have different "
                             f"supports ({', '.join(sorted(supports))})")
        # tied entries start at the mean of their starting values (unconstrained)
        bij = biject_to(_tie_support(model, leaf_p, members))
        u = jnp.mean(jnp.stack([bij.inv(leaves[i][pos]) for i, pos in members]))
        for i, pos in members:
            leaves[i] = leaves[i].at[pos].set(bij(u).astype(leaves[i].dtype))
    return JointSpec(model, names, shapes, leaf_p, leaves, index, data, entry_masks,
                     tuple(groups), site_sups)


def _tie_support(model, priors, members):
    """The support of a tie group's site: its first member's prior's, or ``positive`` for
    tied variances (their prior is the density of the whole covariance)."""
    first = members[0][0]
    if con_of(model, first) is constraints.positive_definite:
        return constraints.positive
    return priors[first].support


def tie_support(spec, members):
    return _tie_support(spec.model, spec.priors, members)


def dirichlet_concentration(prior):
    """The concentration of a (possibly expanded) Dirichlet prior, else ``None``."""
    base = prior
    while isinstance(base, dist.ExpandedDistribution):
        base = base.base_dist
    if not isinstance(base, dist.Dirichlet):
        return None
    return jnp.broadcast_to(base.concentration,
                            tuple(prior.batch_shape) + tuple(prior.event_shape))


def con_of(model, i):
    """The constraint of leaf ``i``."""
    return jax.tree.leaves(model.param_constraints(),
                           is_leaf=lambda c: isinstance(c, constraints.Constraint))[i]


def _simplex_sites(model, leaves, entry_masks, names, simplex_labels=None):
    """Partial simplex and covariance leaves: the sampled entries (rows with two or more
    free entries; the free lower triangle; every free entry of a simplex leaf with ties)
    and their `statseq.bayes._pieces` support (`RowSimplices`, `BlockCovariance`,
    `TiedSimplexRows`), checked eagerly."""
    from statseq.bayes._pieces import covariance_site, simplex_rows_site
    from statseq.core.restrict import simplex_rest

    masks, supports = list(entry_masks), [None] * len(entry_masks)
    for i, m in enumerate(entry_masks):
        if m is None:
            continue
        if simplex_labels and simplex_labels.get(i) is not None:
            sup = TiedSimplexRows(names[i], leaves[i], m, simplex_labels[i])
            sup.block()  # validates (rows whose free entries are all tied, ...)
            masks[i], supports[i] = m, sup
        elif con_of(model, i) is constraints.simplex:
            rest = simplex_rest(names[i], leaves[i], m)
            masks[i], supports[i] = simplex_rows_site(m, rest)
        elif con_of(model, i) is constraints.positive_definite and m.any():
            masks[i], supports[i] = covariance_site(names[i], leaves[i], m)
    return masks, supports


def _tie_groups(model, params, entry_masks, ties, names):
    """Split tied entries out of the sampled entries: per leaf the mask of the untied free
    entries (``None`` for a whole leaf), the tie groups ``(label, ((leaf, index), ...))``
    of elementwise leaves (members in parameter order, row-major; the first member's prior
    is the group's) and ``{leaf: labels}`` of simplex leaves with ties (their free entries,
    tied ones included, form one `TiedSimplexRows` site)."""
    from statseq.core.restrict import _leaf_labels

    if ties is None:
        return entry_masks, [], {}
    leaves, tree = jax.tree.flatten(params)
    labels = _leaf_labels(tree, leaves, ties, names)
    cons = jax.tree.leaves(model.param_constraints(),
                           is_leaf=lambda c: isinstance(c, constraints.Constraint))
    out, groups, simplex = [], {}, {}
    owner = {}
    for i, (name, m, lab, con) in enumerate(zip(names, entry_masks, labels, cons,
                                                strict=True)):
        if lab is None:
            out.append(m)
            continue
        cov = con is constraints.positive_definite and lab.ndim == 2
        if con.event_dim != 0 and con is not constraints.simplex and not cov:
            raise ValueError(
                f"ties.{name}: fit_nuts and fit_svi tie entries only of elementwise leaves "
                f"(real, positive, ...), simplex rows and (n, n) covariances; params.{name} "
                f"has constraint {con}")
        free = (np.full(lab.shape, bool(m)) if isinstance(m, bool | np.bool_)
                else np.asarray(m))
        if cov:
            from statseq.core.restrict import _Builder, _covariance

            _covariance(_Builder(), name, np.asarray(leaves[i]), free, lab)  # the patterns
        if (~free & (lab >= 0)).any():
            raise ValueError(f"ties.{name} ties entries that trainable fixes; tie only free "
                             "entries")
        for label in {int(v) for v in lab[lab >= 0]}:
            kind = ("simplex" if con is constraints.simplex else "variance" if cov
                    else "entry")
            prev = owner.setdefault(label, (i, kind))
            if prev != (i, kind) and "simplex" in (kind, prev[1]):
                raise ValueError(
                    f"ties.{name}: label {label} joins entries of a simplex leaf and of "
                    "another leaf; simplex ties stay within one leaf")
            if prev[1] != kind:
                raise ValueError(
                    f"ties: label {label} joins entries of different kinds ({name} and an "
                    "earlier leaf); tied entries must have the same constraint (and, for "
                    "covariances, be variances)")
        if con is constraints.simplex:
            simplex[i] = lab
            out.append(free)
            continue
        for pos in zip(*np.nonzero(lab >= 0), strict=True):
            groups.setdefault(int(lab[pos]), []).append((i, tuple(int(p) for p in pos)))
        out.append(free & (lab < 0))
    return out, [(label, tuple(groups[label])) for label in sorted(groups)], simplex


def _entry_masks(model, params, trainable, names):
    """Per leaf ``True``, ``False`` or a boolean array of the free entries (of an
    elementwise, simplex or covariance leaf)."""
    from statseq.core.restrict import _leaf_masks

    leaves, tree = jax.tree.flatten(params)
    if trainable is None or all(isinstance(t, bool | np.bool_)
                                for t in jax.tree.leaves(trainable)):
        return list(jax.tree.leaves(trainable_mask(params, trainable)))
    masks = _leaf_masks(tree, leaves, trainable, names)
    cons = jax.tree.leaves(model.param_constraints(),
                           is_leaf=lambda c: isinstance(c, constraints.Constraint))
    out = []
    for name, m, con in zip(names, masks, cons, strict=True):
        if m.all() or not m.any():
            out.append(bool(m.all()))
        elif con.event_dim != 0 and con is not constraints.simplex and not (
                con is constraints.positive_definite and m.ndim == 2):
            raise ValueError(
                f"params.{name} has constraint {con}: fit_nuts and fit_svi fix single entries "
                "only of elementwise leaves (real, positive, ...), simplex rows and (n, n) "
                "covariance matrices; make trainable for this field True or False (or fit "
                "it with fit_lbfgs / fit_em)")
        else:
            out.append(m)
    return out


def free_entries(spec, i, value):
    """The free entries (last axis) of leaf ``i``'s ``value`` (leaf shape trailing)."""
    mask = spec.entry_masks[i]
    return value[(Ellipsis, *np.nonzero(mask))]


def scatter_entries(spec, i, free, lead=()):
    """Leaf ``i`` with the ``free`` entries (``lead + (k,)``) set, the others fixed."""
    full = jnp.broadcast_to(spec.fixed[i], lead + spec.shapes[i])
    full = full.at[(Ellipsis, *np.nonzero(spec.entry_masks[i]))].set(free)
    return mirror_lower(full, spec.entry_masks[i]) if is_covariance_site(spec, i) else full


def is_covariance_site(spec, i) -> bool:
    from statseq.bayes._pieces import BlockCovariance

    return spec.supports is not None and isinstance(spec.supports[i], BlockCovariance)


def mirror_lower(full, site):
    """A covariance whose free lower-triangular entries ``site`` were set: mirror them."""
    upper = np.asarray(site).T & ~np.asarray(site)
    return jnp.where(upper, jnp.swapaxes(full, -1, -2), full)


def is_partial(spec, i) -> bool:
    return spec.entry_masks is not None and spec.entry_masks[i] is not None


def ordered_support(spec):
    con = jax.tree.leaves(spec.model.param_constraints(),
                          is_leaf=lambda c: isinstance(c, constraints.Constraint))[spec.ordered]
    return (constraints.positive_ordered_vector if con is constraints.positive
            else constraints.ordered_vector)


def site_support(spec, i):
    """The support NumPyro transforms site ``i`` with."""
    if spec.supports is not None and spec.supports[i] is not None:
        return spec.supports[i]
    return ordered_support(spec) if i == spec.ordered else spec.priors[i].support


def sample_params(spec):
    """Inside a NumPyro model: draw the trainable leaves from their priors.

    A leaf under an ordering constraint is sampled on the ordered cone with density
    ``K! prod_k p(x_k)``: the law of the sorted draws when the prior is the same for
    every state.
    """
    values = []
    for i, (name, prior, fixed) in enumerate(zip(spec.names, spec.priors, spec.fixed,
                                                 strict=True)):
        if prior is None:
            values.append(fixed)
        elif is_partial(spec, i):
            k = int(spec.entry_masks[i].sum())
            if k:
                x = numpyro.sample(name, dist.ImproperUniform(site_support(spec, i), (),
                                                              (k,)))
                full = scatter_entries(spec, i, x)
                conc = dirichlet_concentration(prior)
                if conc is not None:  # the scaled Dirichlet of the row's free rest
                    conc = jnp.broadcast_to(conc, full.shape)
                    lp = jnp.where(spec.entry_masks[i], (conc - 1.0) * jnp.log(
                        jnp.where(spec.entry_masks[i], full, 1.0)), 0.0)
                elif prior.event_shape != ():  # a covariance: its density is added below,
                    lp = 0.0                   # once the tied variances are set
                else:
                    lp = jnp.where(spec.entry_masks[i], prior.log_prob(full), 0.0)
                if prior.event_shape == () or conc is not None:
                    numpyro.factor(f"{name}.prior", jnp.sum(lp))
            else:
                full = spec.fixed[i]
            values.append(full)
        elif i == spec.ordered:
            k = spec.shapes[i][0]
            x = numpyro.sample(name, dist.ImproperUniform(ordered_support(spec), (), (k,)))
            numpyro.factor(f"{name}.prior", jnp.sum(prior.log_prob(x)) + math.lgamma(k + 1))
            values.append(x)
        else:
            values.append(numpyro.sample(name, prior))
    for label, members in spec.ties:
        first, pos = members[0]
        prior = spec.priors[first]
        v = numpyro.sample(tie_site(label), dist.ImproperUniform(tie_support(spec, members),
                                                                 (), ()))
        values = _set_tied(values, members, v)
        if prior.event_shape == ():
            numpyro.factor(f"{tie_site(label)}.prior", prior.log_prob(values[first])[pos])
    for i, name in enumerate(spec.names):
        # a partly fixed (or tied) covariance: the whole matrix's density (its conditional
        # on the fixed entries, in the free entries and the tie values), tied variances set
        if (is_partial(spec, i) and spec.priors[i] is not None
                and spec.priors[i].event_shape != ()
                and dirichlet_concentration(spec.priors[i]) is None):
            numpyro.factor(f"{name}.prior", jnp.sum(spec.priors[i].log_prob(values[i])))
    return jax.tree.unflatten(params_treedef(spec.model), values)


def tie_site(label) -> str:
    """The NumPyro site (and posterior variable) of tie group ``label``."""
    return f"tied.{label}"


def _set_tied(values, members, v):
    """Set every member ``(leaf, index)`` of a tie group to ``v`` (``lead`` axes first)."""
    values = list(values)
    for i, pos in members:
        values[i] = values[i].at[(Ellipsis, *pos)].set(v.astype(values[i].dtype))
    return values


def has_site(spec, i) -> bool:
    """Whether leaf ``i`` has its own sample site (not frozen, not wholly tied)."""
    return spec.priors[i] is not None and not (
        is_partial(spec, i) and not spec.entry_masks[i].any())


def numpyro_model(spec):
    """The joint ``p(theta) p(y | theta)`` as a NumPyro model (no arguments)."""
    params = sample_params(spec)
    data = spec.data
    mask = None if data.complete else data.mask
    inputs = data.inputs if spec.model.num_inputs else None
    numpyro.sample("y", SequenceDistribution(spec.model, params, mask=mask, inputs=inputs,
                                             num_timesteps=data.num_timesteps), obs=data.y)


def sampled_indices(spec):
    return [i for i in range(len(spec.priors)) if has_site(spec, i)]


def unconstrained_init(spec, key, num_chains, jitter):
    """Per-chain unconstrained starting values: the initial params plus uniform jitter."""
    out = {}
    for i in sampled_indices(spec):
        key, sub = jax.random.split(key)
        value = free_entries(spec, i, spec.fixed[i]) if is_partial(spec, i) else spec.fixed[i]
        u = biject_to(site_support(spec, i)).inv(value)
        noise = jax.random.uniform(sub, (num_chains,) + u.shape, u.dtype, -jitter, jitter)
        out[spec.names[i]] = u[None] + noise
    for label, members in spec.ties:
        key, sub = jax.random.split(key)
        first, pos = members[0]
        u = biject_to(tie_support(spec, members)).inv(spec.fixed[first][pos])
        noise = jax.random.uniform(sub, (num_chains,), u.dtype, -jitter, jitter)
        out[tie_site(label)] = u[None] + noise
    return out


def site_values(spec):
    """The constrained starting value of every site (for ``init_to_value``)."""
    out = {spec.names[i]: (free_entries(spec, i, spec.fixed[i]) if is_partial(spec, i)
                           else spec.fixed[i]) for i in sampled_indices(spec)}
    for label, members in spec.ties:
        first, pos = members[0]
        out[tie_site(label)] = spec.fixed[first][pos]
    return out


def params_from_samples(spec, samples, lead):
    """A params pytree with leading axes ``lead`` from NumPyro's samples dict."""
    values = []
    for i, name in enumerate(spec.names):
        if not has_site(spec, i):
            values.append(jnp.broadcast_to(spec.fixed[i], lead + spec.shapes[i]))
        elif is_partial(spec, i):
            free = jnp.reshape(samples[name], lead + (int(spec.entry_masks[i].sum()),))
            values.append(scatter_entries(spec, i, free, lead))
        else:
            values.append(jnp.reshape(samples[name], lead + spec.shapes[i]))
    for label, members in spec.ties:
        values = _set_tied(values, members, jnp.reshape(samples[tie_site(label)], lead))
    return jax.tree.unflatten(params_treedef(spec.model), values)


def state_dims(model, name, shape):
    """xarray dimension names of one parameter leaf."""
    k = getattr(model, "num_states", None)
    dims = [f"{name}_dim_{j}" for j in range(len(shape))]
    if k is not None and shape:
        field = name.split(".")[-1]
        if name in ("initial_probs", "transitions") or name.startswith("transitions."):
            dims[0] = "state"
            if len(shape) > 1 and shape[1] == k:
                dims[1] = "state_to"
            if field == "weights":
                dims[2] = "input"
        elif name.startswith("emissions.") and shape[0] == k:
            dims[0] = "state"
    return dims


def to_numpy_tree(tree):
    return jax.tree.map(np.asarray, tree)
