"""Forecasts with uncertainty for every model: filter the history, then simulate forward."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.params import validate_params
from statseq.core.recurrence import _future_inputs, _sample_from, run_filter
from statseq.core.validation import check_positive_int, prepare_data


class Forecast(NamedTuple):
    """Sample-based predictive distribution of the next ``num_steps`` observations.

    Attributes:
        samples: ``(num_samples,) + batch_shape + (num_steps,) + event_shape`` draws from
            ``p(y_{T+1:T+h} | y_{1:T})`` (joint over the horizon, so paths are coherent).
        history: the observed series the forecast conditions on (for plotting).
        event_ndim: number of trailing event axes (0 for a scalar series).
    """

    samples: Any
    history: Any
    event_ndim: int = 0

    @property
    def num_steps(self) -> int:
        """The forecast horizon ``h``."""
        return int(self.samples.shape[self.samples.ndim - 1 - self.event_ndim])

    def mean(self):
        """Predictive mean at each future step (Monte Carlo estimate)."""
        return jnp.mean(self.samples, axis=0)

    def quantile(self, q):
        """Predictive quantile(s) ``q`` at each future step (leading axis for ``q``)."""
        return jnp.quantile(jnp.asarray(self.samples, float), jnp.asarray(q), axis=0)

    def interval(self, level: float = 0.9):
        """Central prediction interval ``(lower, upper)`` with coverage ``level``."""
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        alpha = (1.0 - level) / 2.0
        lower, upper = self.quantile(jnp.array([alpha, 1.0 - alpha]))
        return lower, upper

    def plot(self, ax=None, *, levels=(0.5, 0.9), time=None, future_time=None, **kwargs):
        """Fan chart: history, predictive median and central intervals (scalar series).

        Returns the matplotlib ``Axes``.
        """
        from statseq.plotting import plot_forecast

        return plot_forecast(
            self, ax=ax, levels=levels, time=time, future_time=future_time, **kwargs
        )


def forecast(model, params, y, *, num_steps, num_samples, key, mask=None, inputs=None,
             future_inputs=None) -> Forecast:
    """Predictive distribution of the next ``num_steps`` values given the history ``y``.

    Filters ``y`` (honouring ``mask``) to the state ``p(state | y_{1:T})``, then draws
    ``num_samples`` paths by ancestral sampling,

        y_{T+k} ~ p(y_{T+k} | y_{1:T}, y_{T+1:T+k-1}),    k = 1, ..., num_steps,

    so the samples carry the model's full predictive uncertainty.

    Args:
        model: a statseq model.
        params: its parameters.
        y: history, ``batch_shape + (num_timesteps,) + event_shape``.
        num_steps: forecast horizon ``h``.
        num_samples: number of sample paths.
        key: a ``jax.random`` key.
        mask: optional mask for the history.
        inputs: history covariates, when the model takes inputs.
        future_inputs: ``(num_steps, input_dim)`` covariates over the horizon.

    Returns:
        A `Forecast`; ``fc.interval(0.9)`` gives 90% prediction intervals.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> fc = ss.forecast(model, params, y, num_steps=10, num_samples=500,
        ...                  key=jax.random.key(0))
        >>> fc.samples.shape
        (500, 10)
    """
    validate_params(model, params)
    num_steps = check_positive_int(num_steps, "num_steps")
    num_samples = check_positive_int(num_samples, "num_samples")
    data = prepare_data(model, y, mask, inputs)
    if data.num_timesteps < model.num_conditioned_steps:
        raise ValueError(
            f"{type(model).__name__} conditions on its first {model.num_conditioned_steps} "
            f"values, so a forecast needs at least that many; y has {data.num_timesteps}"
        )
    _, _, _, final = run_filter(
        model, params, data.y, data.mask, data.inputs, complete=data.complete
    )
    u = _future_inputs(model, future_inputs, data.batch_shape, num_steps)
    num_seq = data.y.shape[0]
    keys = jax.random.split(key, (num_samples, num_seq))
    samples = _sample_from(model, params, final, keys, u)
    samples = jnp.reshape(
        samples, (num_samples,) + data.batch_shape + (num_steps,) + tuple(model.event_shape)
    )
    return Forecast(samples=samples, history=np.asarray(y), event_ndim=len(model.event_shape))
