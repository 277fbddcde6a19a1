"""Posterior sampling of any statseq model with NumPyro's NUTS, returned as ArviZ data.

The target is the posterior ``p(theta | y) ∝ p(y | theta) p(theta)``, with the
likelihood from the model's filter (`SequenceDistribution`) and a proper prior on every
trainable leaf (`statseq.bayes.default_priors` where none is given). NUTS runs in
unconstrained space (each leaf's support gives the bijection and its Jacobian).
"""

from __future__ import annotations

import inspect
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints

from statseq.bayes import _joint
from statseq.core.params import param_names, params_treedef
from statseq.core.recurrence import run_filter
from statseq.core.validation import check_key, check_positive_int


@partial(jax.jit, static_argnames=("model", "complete"))
def _pointwise_log_lik(model, draws, y, mask, inputs, complete):
    """``(num_draws, N, T)`` one-step predictive log-densities for flat ``draws``."""
    return jax.vmap(lambda p: run_filter(model, p, y, mask, inputs, complete=complete)[1])(draws)


def _from_dict(groups, dims, coords):
    """``arviz.from_dict`` for arviz 0.x (groups as keywords) and 1.x (one dict)."""
    import arviz as az

    if "posterior" in inspect.signature(az.from_dict).parameters:
        return az.from_dict(**groups, dims=dims, coords=coords)
    return az.from_dict(groups, dims=dims, coords=coords)  # pragma: no cover - arviz 1.x


def check_nuts_settings(num_warmup, num_samples, num_chains, chain_method,
                        target_accept_prob) -> tuple[int, int, int]:
    """Check NUTS's run settings; return ``(num_warmup, num_samples, num_chains)`` as ints.

    Raises:
        ValueError: a count that is not a positive integer, an unknown ``chain_method`` or a
            ``target_accept_prob`` outside ``(0, 1)``.
    """
    num_warmup = check_positive_int(num_warmup, "num_warmup")
    num_samples = check_positive_int(num_samples, "num_samples")
    num_chains = check_positive_int(num_chains, "num_chains")
    if chain_method not in ("sequential", "vectorized", "parallel"):
        raise ValueError("chain_method must be 'sequential', 'vectorized' or 'parallel', "
                         f"got {chain_method!r}")
    if not 0.0 < float(target_accept_prob) < 1.0:
        raise ValueError(f"target_accept_prob must be in (0, 1), got {target_accept_prob}")
    return num_warmup, num_samples, num_chains


def fit_nuts(model, y, *, key, num_warmup=500, num_samples=500, num_chains=4, priors=None,
             mask=None, inputs=None, init_params=None, trainable=None, ordered=None,
             ties=None, chain_method="sequential", target_accept_prob=0.8, max_tree_depth=10,
             jitter=0.5, log_likelihood=True, progress=False):
    """Sample the posterior of ``model``'s parameters with NUTS (NumPyro).

        p(theta | y_{1:T}) ∝ p(theta) prod_t p(y_t | y_{<t}, u_{<=t}, theta)

    Args:
        model: a statseq model.
        y: data, ``batch_shape + (num_timesteps,) + event_shape`` (sequences share theta).
        key: a ``jax.random`` key (keyword-only, required).
        num_warmup: adaptation steps per chain (step size and diagonal mass matrix).
        num_samples: kept draws per chain.
        num_chains: number of chains (several, so that R-hat is meaningful).
        priors: a pytree like ``params`` of numpyro distributions on the natural
            parameters; ``None`` leaves (or ``priors=None``) take `default_priors`.
        mask: optional observation mask (per step or per entry).
        inputs: covariates, when the model takes them.
        init_params: where chains start (jittered); default ``model.initialize(y)`` or
            ``model.default_params()``. Frozen leaves keep these values.
        trainable: pytree like ``params`` of ``True``/``False`` (``False`` freezes a leaf)
            or, for leaves with an elementwise or simplex constraint, boolean arrays of the
            leaf's shape: only the ``True`` entries are sampled (the posterior variable
            holds them, in row-major order; ``constant_data`` holds the leaf and its
            mask). In a simplex row (a transition row, an emission probability vector) the
            free entries share the mass ``1 - sum(fixed)``: with a ``Dirichlet(alpha)``
            prior on the row (required) they are ``(1 - sum(fixed)) Dirichlet(alpha_free)``
            a priori, sampled through ``n - 1`` logits; a row with one free entry has it
            determined and not sampled. Fixed entries keep their value bit for bit in
            every draw. An ``(n, n)`` covariance may have the patterns of
            `statseq.core.restrict` (fixed rows with zero cross entries, a block-diagonal
            free part) with positive fixed variances: its free lower triangle is sampled,
            each free block ``L L^T``, under the whole matrix's prior density.
        ties: ``None`` or a pytree like ``params`` with ``None`` or an integer label array
            of the leaf's shape on elementwise leaves (as in `fit_lbfgs`): free entries
            with the same label ``L >= 0`` share one value, sampled once as the posterior
            variable ``"tied.L"`` (a scalar) with the prior of the group's first entry
            (parameter order, row-major); the tied leaf's other free entries are its own
            variable and ``constant_data`` holds its labels as ``"<name>.ties"``. Tied
            variances of an ``(n, n)`` covariance (rows whose covariances are fixed, as in
            `statseq.core.restrict`) are such a group too, a positive scalar whose density
            is the whole covariance prior at the matrix with the variances tied. Entries of
            a simplex leaf may be tied within the leaf (e.g. a symmetric transition matrix;
            a row holding tied entries needs a free untied entry): the leaf's free entries
            are then one variable, sampled through the chart of `statseq.core.restrict`,
            with density the Dirichlet kernel ``prod A_ij^(alpha_ij - 1)`` of its rows in
            the tie values and the free untied entries but each row's last.
        ordered: dotted name of a per-state vector leaf (e.g. ``"emissions.rates"``) to
            sample under an ordering constraint ``x_1 < ... < x_K``: identifies HMM
            states (no label switching). See also `relabel_states`.
        chain_method: ``"sequential"`` (fine on CPU), ``"vectorized"`` or ``"parallel"``.
        target_accept_prob: NUTS target acceptance probability.
        max_tree_depth: NUTS maximum tree depth.
        jitter: chains start at the unconstrained initial values plus
            ``Uniform(-jitter, jitter)`` noise, so that they start apart.
        log_likelihood: add the one-step predictive log-densities per draw (group
            ``log_likelihood``, variable ``y``, dims ``(..., "time")``).
        progress: show NumPyro's progress bar.

    Returns:
        An ArviZ ``InferenceData`` (a ``DataTree`` with arviz 1.x) with groups
        ``posterior`` (one variable per trainable leaf, named by its dotted field name,
        dims such as ``("state", "state_to")``), ``sample_stats`` (``diverging``, ``lp``,
        ``acceptance_rate``, ``n_steps``, ``energy``), ``observed_data``,
        ``constant_data`` (the frozen leaves) and ``log_likelihood``.
        `posterior_params` turns it back into a params pytree with leading
        ``(chain, draw)`` axes.

    Examples:
        >>> import jax, arviz as az, numpy as np, statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> idata = ss.fit_nuts(ss.LocalLevel(), y[:50], key=jax.random.key(0), num_warmup=10,
        ...                     num_samples=5, num_chains=1)
        >>> idata.posterior["obs_var"].shape
        (1, 5)
    """
    check_key(key)
    from numpyro.infer import MCMC, NUTS

    num_warmup, num_samples, num_chains = check_nuts_settings(
        num_warmup, num_samples, num_chains, chain_method, target_accept_prob)
    if not float(jitter) >= 0.0:
        raise ValueError(f"jitter must be >= 0, got {jitter}")
    init_key, run_key = jax.random.split(key)
    spec = _joint.prepare_joint(model, y, priors=priors, mask=mask, inputs=inputs,
                                init_params=init_params, trainable=trainable,
                                ordered=ordered, key=init_key, ties=ties)
    if not _joint.sampled_indices(spec) and not spec.ties:
        raise ValueError("every parameter is frozen (trainable): nothing to sample")
    kernel = NUTS(_joint.numpyro_model, target_accept_prob=float(target_accept_prob),
                  max_tree_depth=check_positive_int(max_tree_depth, "max_tree_depth"))
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples,
                num_chains=num_chains, chain_method=chain_method, progress_bar=progress)
    init = _joint.unconstrained_init(spec, init_key, num_chains, float(jitter))
    if num_chains == 1:
        init = {k: v[0] for k, v in init.items()}
    mcmc.run(run_key, spec, init_params=init,
             extra_fields=("diverging", "potential_energy", "accept_prob", "num_steps",
                           "energy"))
    samples = mcmc.get_samples(group_by_chain=True)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    return _to_inference_data(spec, y, samples, extra, num_chains, num_samples,
                              log_likelihood)


def _to_inference_data(spec, y, samples, extra, num_chains, num_samples, log_likelihood):
    model = spec.model
    posterior, constant, dims = {}, {}, {}
    for i, name in enumerate(spec.names):
        dims[name] = _joint.state_dims(model, name, spec.shapes[i])
        if spec.priors[i] is None:
            constant[name] = np.asarray(spec.fixed[i])
        elif _joint.is_partial(spec, i):  # only the free untied entries are sampled
            if _joint.has_site(spec, i):
                posterior[name] = np.asarray(samples[name])
                dims[name] = [f"{name}_free"]
            constant[name] = np.asarray(spec.fixed[i])
            constant[f"{name}.free"] = np.asarray(spec.entry_masks[i])
            dims[f"{name}.free"] = _joint.state_dims(model, name, spec.shapes[i])
        else:
            posterior[name] = np.asarray(samples[name])
    labels = {}
    for label, members in spec.ties:
        posterior[_joint.tie_site(label)] = np.asarray(samples[_joint.tie_site(label)])
        for i, pos in members:
            labels.setdefault(i, np.full(spec.shapes[i], -1, np.int64))[pos] = label
    for i, lab in labels.items():
        constant[f"{spec.names[i]}.ties"] = lab
        dims[f"{spec.names[i]}.ties"] = _joint.state_dims(model, spec.names[i],
                                                          spec.shapes[i])
    stats = {
        "diverging": np.asarray(extra["diverging"]),
        "lp": -np.asarray(extra["potential_energy"]),
        "acceptance_rate": np.asarray(extra["accept_prob"]),
        "n_steps": np.asarray(extra["num_steps"]),
        "energy": np.asarray(extra["energy"]),
    }
    data = spec.data
    batch, t = data.batch_shape, data.num_timesteps
    seq_dims = [f"sequence_dim_{j}" for j in range(len(batch))]
    event_dims = [f"event_dim_{j}" for j in range(len(model.event_shape))]
    dims["y"] = seq_dims + ["time"] + event_dims
    groups = {"posterior": posterior, "sample_stats": stats,
              "observed_data": {"y": np.asarray(y)}}
    if constant:
        groups["constant_data"] = constant
    if log_likelihood:
        draws = _joint.params_from_samples(spec, samples, (num_chains * num_samples,))
        ll = _pointwise_log_lik(model, draws, data.y, data.mask, data.inputs,
                                complete=data.complete)
        groups["log_likelihood"] = {
            "y": np.asarray(ll).reshape((num_chains, num_samples) + batch + (t,))
        }
    return _from_dict(groups, dims, coords=None)


def posterior_params(model, idata):
    """The posterior draws of `fit_nuts` as a params pytree with leading ``(chain, draw)``.

    Frozen leaves (stored in ``constant_data``) are broadcast to every draw.

    Args:
        model: the model given to `fit_nuts`.
        idata: its result.

    Returns:
        A params pytree whose leaves have shape ``(num_chains, num_draws) + leaf_shape``
        (ready for `SequenceDistribution` or `posterior_predictive_forecast`); tied
        entries take their group's ``"tied.L"`` draws.

    Examples:
        >>> import arviz as az, numpy as np, statseq as ss
        >>> model = ss.LocalLevel()
        >>> # idata = ss.fit_nuts(model, y, key=...) stores one variable per leaf, (chain, draw):
        >>> rng = np.random.default_rng(0)
        >>> idata = az.from_dict(posterior={"obs_var": rng.gamma(50.0, 300.0, (2, 10)),
        ...                                 "level_var": rng.gamma(5.0, 300.0, (2, 10))})
        >>> draws = ss.posterior_params(model, idata)
        >>> type(draws).__name__, draws.obs_var.shape
        ('LocalLevelParams', (2, 10))
    """
    post = idata.posterior
    first = np.asarray(post[next(iter(post.data_vars))].values)
    lead = tuple(first.shape[:2])
    shapes = params_treedef(model).flatten_up_to(model.param_shapes())
    const = getattr(idata, "constant_data", {})
    cons = jax.tree.leaves(model.param_constraints(),
                           is_leaf=lambda c: isinstance(c, constraints.Constraint))
    values = []
    for name, shape in zip(param_names(model), shapes, strict=True):
        if f"{name}.free" in const:  # free entries of a partly fixed (or tied) leaf
            free = np.asarray(const[f"{name}.free"].values)
            full = jnp.broadcast_to(jnp.asarray(const[name].values), lead + tuple(shape))
            if name in post.data_vars:
                full = full.at[(Ellipsis, *np.nonzero(free))].set(
                    jnp.asarray(post[name].values))
                if cons[len(values)] is constraints.positive_definite:
                    full = _joint.mirror_lower(full, free)  # the free lower triangle
            if f"{name}.ties" in const:
                lab = np.asarray(const[f"{name}.ties"].values)
                for pos in zip(*np.nonzero(lab >= 0), strict=True):
                    draws = jnp.asarray(post[f"tied.{int(lab[pos])}"].values)
                    full = full.at[(Ellipsis, *pos)].set(draws.astype(full.dtype))
            values.append(full)
        elif name in post.data_vars:
            values.append(jnp.asarray(post[name].values))
        elif hasattr(idata, "constant_data") and name in idata.constant_data.data_vars:
            values.append(jnp.broadcast_to(jnp.asarray(idata.constant_data[name].values),
                                           lead + tuple(shape)))
        else:
            raise ValueError(f"idata has no variable {name!r} for {type(model).__name__}")
    return jax.tree.unflatten(params_treedef(model), values)
