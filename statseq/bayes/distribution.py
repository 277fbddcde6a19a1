"""statseq models as NumPyro distributions over whole sequences.

`SequenceDistribution` wraps a model and its parameters as a
``numpyro.distributions.Distribution`` whose ``log_prob`` is the model's marginal
likelihood (the prediction error decomposition, computed by the model's compiled filter):

    log p(y_{1:T} | theta) = sum_t log p(y_t | y_{<t}, u_{<=t}, theta),

so HMM states are summed out by the forward recursion and state space states by the
Kalman filter. It can be observed inside any user-written NumPyro model
(``numpyro.sample("y", SequenceDistribution(model, params), obs=y)``).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.distributions import constraints

from statseq.core.params import is_shape, params_treedef
from statseq.core.recurrence import _simulate, run_filter, vmap_or_one
from statseq.core.validation import float_dtype, prepare_data


def params_batch_shape(model, params) -> tuple[int, ...]:
    """The leading (batch) axes of ``params`` beyond the model's parameter shapes.

    Leaves may carry different leading axes as long as they broadcast (e.g. per-group
    emission rates with a shared transition matrix in a hierarchical model); the result
    is their broadcast, e.g. ``(num_chains, num_draws)`` for posterior draws.
    """
    shapes = jax.tree.leaves(model.param_shapes(), is_leaf=is_shape)
    try:
        leaves = params_treedef(model).flatten_up_to(params)
    except (ValueError, TypeError) as err:
        raise TypeError(
            f"params must have the structure of {type(model.param_shapes()).__name__} for "
            f"{type(model).__name__}"
        ) from err
    batch = ()
    for shape, leaf in zip(shapes, leaves, strict=True):
        lshape = tuple(jnp.shape(leaf))
        nb = len(lshape) - len(shape)
        if nb < 0 or lshape[nb:] != tuple(shape):
            raise ValueError(
                f"a params leaf has shape {lshape}; expected (batch...) + {tuple(shape)}"
            )
        try:
            batch = jnp.broadcast_shapes(batch, lshape[:nb])
        except ValueError as err:
            raise ValueError(
                f"params leaves have leading (batch) axes that do not broadcast: {batch} and "
                f"{lshape[:nb]}"
            ) from err
    return tuple(batch)


def _flatten_params(model, params, batch_shape):
    """Broadcast ``params`` to ``batch_shape`` and flatten the batch to one axis."""
    n = math.prod(batch_shape)
    shapes = jax.tree.leaves(model.param_shapes(), is_leaf=is_shape)
    leaves = params_treedef(model).flatten_up_to(params)
    flat = [jnp.reshape(jnp.broadcast_to(leaf, batch_shape + tuple(s)), (n,) + tuple(s))
            for leaf, s in zip(leaves, shapes, strict=True)]
    return jax.tree.unflatten(params_treedef(model), flat)


def flatten_draws(model, draws):
    """``(flat, lead)``: posterior or prior ``draws`` with their leading axes ``lead``
    (e.g. ``(num_chains, num_draws)``) broadcast and flattened into one axis."""
    lead = params_batch_shape(model, draws)
    if math.prod(lead) == 0:
        raise ValueError("draws is empty")
    return _flatten_params(model, draws, lead), lead


def _support(model):
    kind = model.observation_dtype
    base = constraints.real if kind == "real" else constraints.nonnegative_integer
    return constraints.independent(base, 1 + len(model.event_shape))


class SequenceDistribution(dist.Distribution):
    """A statseq model with fixed parameters as a distribution over whole sequences.

        log p(y_{1:T} | theta) = sum_t log p(y_t | y_{<t}, u_{<=t}, theta)

    ``event_shape = (num_timesteps,) + model.event_shape``; ``batch_shape`` is the
    broadcast of the leading axes of ``params`` (one parameter set per batch element)
    with those of ``mask`` and ``inputs``. ``log_prob`` runs the model's compiled filter
    (traceable, so it works inside NumPyro models, ``jit``, ``grad`` and ``vmap``), with
    masked entries marginalized out; ``sample`` draws by ancestral sampling (masks do not
    apply to sampling).

    Args:
        model: a statseq model.
        params: its parameters, optionally with leading batch axes on every leaf.
        num_timesteps: sequence length ``T`` (needed only when neither ``mask`` nor
            ``inputs`` gives it).
        mask: optional booleans ``batch + (T,)`` (per step) or ``batch + (T,) + event``
            (per entry); ``True`` = observed. Kept as the attribute ``obs_mask`` (``mask``
            is numpyro's ``Distribution.mask`` method, which still works).
        inputs: ``[batch +] (T, input_dim)`` covariates when the model takes inputs.
        validate_args: numpyro's argument validation flag.

    Examples:
        >>> import jax, numpy as np, numpyro, numpyro.distributions as dist, statseq as ss
        >>> from statseq.bayes import SequenceDistribution
        >>> model = ss.LocalLevel()
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> d = SequenceDistribution(model, ss.LocalLevelParams(15099.0, 1469.1),
        ...                          num_timesteps=y.size)
        >>> d.event_shape, round(float(d.log_prob(y)), 1)
        ((100,), -633.5)
        >>> def bayes(y):  # priors on both variances, likelihood by the Kalman filter
        ...     obs = numpyro.sample("obs_var", dist.LogNormal(9.0, 2.0))
        ...     lev = numpyro.sample("level_var", dist.LogNormal(9.0, 2.0))
        ...     numpyro.sample("y", SequenceDistribution(
        ...         model, ss.LocalLevelParams(obs, lev), num_timesteps=y.size), obs=y)
    """

    # the observation mask is stored as ``obs_mask``: the name ``mask`` belongs to numpyro's
    # ``Distribution.mask(mask)`` method, which NumPyro's handlers (``Predictive``, the
    # ``mask`` handler) call on every sample site
    pytree_data_fields = ("params", "obs_mask", "inputs")
    pytree_aux_fields = ("model", "num_timesteps", "_params_batch")

    def __init__(self, model, params, *, num_timesteps=None, mask=None, inputs=None,
                 validate_args=None):
        self.model = model
        self.params = params
        self._params_batch = params_batch_shape(model, params)
        event = tuple(model.event_shape)
        batch = self._params_batch
        if mask is not None:
            mask = jnp.asarray(mask, bool)
            if event and tuple(mask.shape[mask.ndim - len(event):]) == event and (
                    num_timesteps is None or mask.ndim >= 1 + len(event)
                    and mask.shape[mask.ndim - 1 - len(event)] == num_timesteps):
                per_entry = mask
            else:
                per_entry = jnp.broadcast_to(
                    jnp.reshape(mask, mask.shape + (1,) * len(event)), mask.shape + event)
            if per_entry.ndim < 1 + len(event):
                raise ValueError("mask must have shape batch + (num_timesteps,) [+ event]")
            t = int(per_entry.shape[per_entry.ndim - 1 - len(event)])
            mask = per_entry
            batch = jnp.broadcast_shapes(batch, tuple(mask.shape[: mask.ndim - 1 - len(event)]))
            num_timesteps = _check_t(num_timesteps, t, "mask")
        if model.num_inputs:
            if inputs is None:
                raise ValueError(
                    f"{type(model).__name__} has input_dim={model.num_inputs}: pass inputs "
                    f"of shape [batch +] (num_timesteps, {model.num_inputs})"
                )
            inputs = jnp.asarray(inputs, float_dtype())
            if inputs.ndim < 2 or inputs.shape[-1] != model.num_inputs:
                raise ValueError(
                    f"inputs must have shape [batch +] (num_timesteps, {model.num_inputs}); "
                    f"got {tuple(inputs.shape)}"
                )
            num_timesteps = _check_t(num_timesteps, int(inputs.shape[-2]), "inputs")
            batch = jnp.broadcast_shapes(batch, tuple(inputs.shape[:-2]))
        elif inputs is not None:
            raise ValueError(f"{type(model).__name__} takes no inputs, but inputs were given")
        if num_timesteps is None:
            raise ValueError("num_timesteps is required when neither mask nor inputs gives it")
        if isinstance(num_timesteps, bool) or int(num_timesteps) < 1:
            raise ValueError(f"num_timesteps must be a positive integer, got {num_timesteps}")
        self.num_timesteps = int(num_timesteps)
        self.obs_mask = mask
        self.inputs = inputs
        super().__init__(batch_shape=tuple(batch), event_shape=(self.num_timesteps,) + event,
                         validate_args=validate_args)

    @property
    def support(self):
        return _support(self.model)

    def _broadcast_parts(self, lead):
        """Mask and inputs broadcast to the leading axes ``lead``, flattened."""
        event, t = tuple(self.model.event_shape), self.num_timesteps
        n = math.prod(lead)
        mask = None if self.obs_mask is None else jnp.reshape(
            jnp.broadcast_to(self.obs_mask, lead + (t,) + event), (n, t) + event)
        u = self.inputs if self.inputs is not None else jnp.zeros((t, 0), float_dtype())
        u = jnp.reshape(jnp.broadcast_to(u, lead + u.shape[-2:]), (n,) + u.shape[-2:])
        return mask, u

    def log_prob(self, value):
        model, event, t = self.model, tuple(self.model.event_shape), self.num_timesteps
        value_shape = tuple(jnp.shape(value))
        nd = len(self.event_shape)
        if value_shape[len(value_shape) - nd:] != tuple(self.event_shape):
            raise ValueError(
                f"value must end in the event shape {tuple(self.event_shape)}, got "
                f"{value_shape}"
            )
        lead = jnp.broadcast_shapes(value_shape[: len(value_shape) - nd], self.batch_shape)
        n = math.prod(lead)
        mask, u = self._broadcast_parts(lead)
        value = jnp.broadcast_to(value, lead + (t,) + event)
        full_mask = jnp.ones((n, t) + event, bool) if mask is None else mask
        data = prepare_data(model, jnp.reshape(value, (n, t) + event), full_mask,
                            u if model.num_inputs else None)
        y = data.y
        complete = mask is None
        if not self._params_batch:
            log_probs = run_filter(model, self.params, y, data.mask, data.inputs,
                                   complete=complete)[1]
        else:
            params = _flatten_params(model, self.params, lead)

            def one(p, y_i, m_i, u_i):
                return run_filter(model, p, y_i[None], m_i[None], u_i[None],
                                  complete=complete)[1][0]

            log_probs = vmap_or_one(one)(params, y, data.mask, data.inputs)
        return jnp.reshape(jnp.sum(log_probs, axis=-1), lead)

    def sample(self, key, sample_shape=()):
        model, t = self.model, self.num_timesteps
        batch = tuple(self.batch_shape)
        n_batch = math.prod(batch)
        n_draws = math.prod(sample_shape)
        _, u = self._broadcast_parts(batch)
        params = _flatten_params(model, self.params, batch)
        keys = jax.random.split(key, (n_draws, n_batch))
        ys = _sample_flat(model, params, u, keys)
        return jnp.reshape(ys, tuple(sample_shape) + batch + (t,) + tuple(model.event_shape))


@partial(jax.jit, static_argnames=("model",))
def _sample_flat(model, params, inputs, keys):
    """params ``(B, ...)``, inputs ``(B, T, U)``, keys ``(S, B)`` -> ``(S, B, T, *event)``."""
    start = getattr(model, "sampling_carry", model.initial_carry)

    def one(p, u_i, k):
        return _simulate(model, p, start(p), k, u_i)[0]

    # over the draws (outer) of the flat batch of sequences (inner)
    return jax.vmap(vmap_or_one(one), in_axes=(None, None, 0))(params, inputs, keys)


def _check_t(current, t, name):
    if current is not None and int(current) != t:
        raise ValueError(f"{name} has {t} time steps but num_timesteps={current}")
    return t
