"""Posterior predictive forecasts: forecasts averaged over posterior draws."""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from statseq.bayes.distribution import flatten_draws
from statseq.core.params import validate_params
from statseq.core.recurrence import _future_inputs, _sample_from, run_filter
from statseq.core.validation import check_key, check_positive_int, prepare_data
from statseq.forecast import Forecast


@partial(jax.jit, static_argnames=("model", "complete"))
def _forecast_draws(model, draws, y, mask, inputs, future, keys, complete):
    """keys ``(D, S, N)`` -> samples ``(D, S, N, h, *event)``: per draw, filter the
    history with that draw's parameters and simulate ``S`` paths forward."""

    def one(p, k):
        final = run_filter(model, p, y, mask, inputs, complete=complete)[3]
        return _sample_from(model, p, final, k, future)

    return jax.vmap(one)(draws, keys)


def posterior_predictive_forecast(model, draws, y, *, num_steps, key, samples_per_draw=1,
                                  mask=None, inputs=None, future_inputs=None) -> Forecast:
    """Forecast paths drawn from the posterior predictive distribution.

        p(y_{T+1:T+h} | y_{1:T}) = ∫ p(y_{T+1:T+h} | y_{1:T}, theta) p(theta | y_{1:T}) dtheta

    For each posterior draw ``theta_d`` the history is filtered with ``theta_d`` and
    ``samples_per_draw`` paths are simulated forward, each with its own key, so intervals
    carry parameter uncertainty as well as the model's noise (unlike a plug-in forecast at
    one estimate).

    Args:
        model: a statseq model.
        draws: params pytree with leading draw axes (e.g. ``(chain, draw)`` from
            `posterior_params`, or ``(num_samples,)`` from `fit_svi`).
        y: history, ``batch_shape + (num_timesteps,) + event_shape``.
        num_steps: forecast horizon ``h``.
        key: a ``jax.random`` key (keyword-only, required).
        samples_per_draw: paths simulated per posterior draw.
        mask: optional mask for the history.
        inputs: history covariates, when the model takes inputs.
        future_inputs: ``(num_steps, input_dim)`` covariates over the horizon.

    Returns:
        A `~statseq.Forecast` with ``num_draws * samples_per_draw`` sample paths (its
        ``interval``, ``quantile`` and ``plot`` work as for `statseq.forecast`).

    Examples:
        >>> import jax, jax.numpy as jnp, statseq as ss
        >>> from statseq.bayes import posterior_predictive_forecast
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> draws = ss.LocalLevelParams(jnp.array([15e3, 14e3]), jnp.array([1.4e3, 1.6e3]))
        >>> fc = posterior_predictive_forecast(ss.LocalLevel(), draws, y, num_steps=5,
        ...                                    key=jax.random.key(0), samples_per_draw=10)
        >>> fc.samples.shape
        (20, 5)
    """
    check_key(key)
    num_steps = check_positive_int(num_steps, "num_steps")
    per_draw = check_positive_int(samples_per_draw, "samples_per_draw")
    flat, lead = flatten_draws(model, draws)
    num_draws = math.prod(lead)
    for leaf in jax.tree.leaves(flat):
        if not bool(np.all(np.isfinite(np.asarray(leaf)))):
            raise ValueError("draws contain non-finite values")
    validate_params(model, jax.tree.map(lambda a: a[0], flat))
    data = prepare_data(model, y, mask, inputs)
    if data.num_timesteps < model.num_conditioned_steps:
        raise ValueError(f"y needs at least {model.num_conditioned_steps} time steps")
    future = _future_inputs(model, future_inputs, data.batch_shape, num_steps)
    keys = jax.random.split(key, (num_draws, per_draw, data.y.shape[0]))
    samples = _forecast_draws(model, flat, data.y, data.mask, data.inputs, future, keys,
                              complete=data.complete)
    samples = jnp.reshape(samples, (num_draws * per_draw,) + data.batch_shape + (num_steps,)
                          + tuple(model.event_shape))
    return Forecast(samples=samples, history=np.asarray(y), event_ndim=len(model.event_shape))
