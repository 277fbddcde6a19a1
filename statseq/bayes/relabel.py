"""Post-hoc relabelling of HMM posterior draws (label switching).

An HMM's likelihood and an exchangeable prior are invariant to permuting the state
labels, so the posterior has ``K!`` symmetric modes and chains (or one chain, over time)
may visit different labellings: per-state summaries then mix states. Two remedies:

* an ordering constraint while sampling (``fit_nuts(..., ordered="emissions.rates")``):
  states are identified by the order of one per-state parameter; the prior becomes
  ``K! prod_k p(x_k)`` on the ordered cone (the law of sorted draws);
* relabelling after sampling (`relabel_states`): each draw's states are sorted by a chosen
  per-state quantity, permuting every state-indexed leaf consistently.

Ordering is simpler and exact when the chosen parameter separates the states; relabelling
works with any sampler output and any statistic, but when two states' values overlap in the
posterior, sorting can split a mode unevenly.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from statseq.bayes.distribution import params_batch_shape
from statseq.core.params import param_names, params_treedef


def permute_states(model, params, perm):
    """``params`` with state ``perm[j]`` renamed ``j`` (one parameter set, no batch axes).

    Permutes the initial law, the rows and the columns of the transition matrix (or of
    a `TransitionRegression`'s weights and bias) and the leading axis of every emission
    leaf.

    Args:
        model: an HMM (a model with ``num_states``).
        params: its parameters.
        perm: ``(num_states,)`` integer permutation.

    Returns:
        The relabelled params (the same distribution over observations).

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.PoissonHMM(num_states=2)
        >>> p = model.assemble_params(ss.models.hmm.poisson.PoissonEmissions(
        ...     jnp.array([5.0, 1.0])))
        >>> permute_states(model, p, jnp.array([1, 0])).emissions.rates.tolist()
        [1.0, 5.0]
    """
    k = model.num_states
    initial = None if params.initial_probs is None else params.initial_probs[perm]
    trans = params.transitions
    if hasattr(trans, "weights"):
        trans = type(trans)(trans.weights[perm][:, perm], trans.bias[perm][:, perm])
    else:
        trans = trans[perm][:, perm]

    def emit(leaf):
        if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != k:
            raise ValueError(
                f"an emission leaf of shape {jnp.shape(leaf)} has no leading state axis "
                f"of size {k}"
            )
        return leaf[perm]

    return type(params)(initial, trans, jax.tree.map(emit, params.emissions))


def relabel_states(model, draws, *, by="emissions.rates", key_fn=None):
    """Sort the hidden states of every posterior draw by a per-state quantity.

    For each draw, ``perm = argsort(v)`` where ``v`` is the ``(num_states,)`` vector given
    by ``key_fn(params)``, or by the leaf named ``by`` (its first entry per state when the
    leaf has trailing axes); then `permute_states` applies ``perm``.

    Args:
        model: an HMM (``PoissonHMM``, ``GaussianHMM``, ...).
        draws: params pytree with leading axes (e.g. ``(chain, draw)`` from
            `posterior_params`).
        by: dotted name of the leaf to sort by, e.g. ``"emissions.rates"`` or
            ``"emissions.means"``.
        key_fn: optional ``params -> (num_states,)`` values to sort by (overrides ``by``).

    Returns:
        ``draws`` relabelled, same shapes.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.PoissonHMM(num_states=2)
        >>> p = model.assemble_params(ss.models.hmm.poisson.PoissonEmissions(
        ...     jnp.array([[5.0, 1.0], [2.0, 3.0]])))  # two draws
        >>> p = p._replace(initial_probs=jnp.array([[0.9, 0.1], [0.9, 0.1]]),
        ...                transitions=jnp.stack([model.default_transitions()] * 2))
        >>> relabel_states(model, p).emissions.rates.tolist()
        [[1.0, 5.0], [2.0, 3.0]]
    """
    if not hasattr(model, "num_states"):
        raise TypeError(f"relabel_states needs an HMM; got {type(model).__name__}")
    lead = params_batch_shape(model, draws)
    n = math.prod(lead)
    if key_fn is None:
        names = param_names(model)
        if by not in names:
            raise ValueError(f"by must name a parameter leaf ({', '.join(names)}); got {by!r}")
        index = names.index(by)

        def key_fn(p):
            leaf = params_treedef(model).flatten_up_to(p)[index]
            if leaf.ndim == 0 or leaf.shape[0] != model.num_states:
                raise ValueError(f"params.{by} has no leading state axis")
            return jnp.reshape(leaf, (model.num_states, -1))[:, 0]
    elif not callable(key_fn):
        raise TypeError("key_fn must be a callable params -> (num_states,) values")
    flat = jax.tree.map(lambda a: jnp.reshape(a, (n,) + jnp.shape(a)[len(lead):]), draws)

    def one(p):
        return permute_states(model, p, jnp.argsort(key_fn(p)))

    out = jax.vmap(one)(flat)
    return jax.tree.map(lambda a: jnp.reshape(a, lead + a.shape[1:]), out)
