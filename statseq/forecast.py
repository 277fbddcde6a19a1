"""Forecasts with uncertainty for every model: filter the history, then simulate forward."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.params import validate_params
from statseq.core.recurrence import _future_inputs, _sample_from, final_carries
from statseq.core.validation import (
    check_key,
    check_positive_int,
    check_time_index,
    pandas_values,
    prepare_sized,
)


def future_index(index, num_steps: int):
    """The ``num_steps`` time labels after a pandas ``index``, extended by its frequency.

    A ``DatetimeIndex`` continues with its ``freq`` (or the one `pandas.infer_freq`
    finds), a ``PeriodIndex`` with its period, and a numeric index with its spacing when
    that spacing is regular (``+1`` for a single value). Returns ``None`` (with a
    warning) when no regular spacing can be found. An index that is not strictly
    increasing (unsorted or with repeated labels) is a ``ValueError``.

    Args:
        index: the history's pandas index.
        num_steps: how many future labels.

    Returns:
        A pandas ``Index`` of length ``num_steps``, or ``None``.

    Examples:
        >>> import pandas as pd
        >>> idx = pd.date_range("2024-01-01", periods=3, freq="D")
        >>> [str(t.date()) for t in future_index(idx, 2)]
        ['2024-01-04', '2024-01-05']
    """
    import warnings

    import pandas as pd

    num_steps = check_positive_int(num_steps, "num_steps")
    check_time_index(index, "index")
    if isinstance(index, pd.PeriodIndex):
        return pd.period_range(start=index[-1] + 1, periods=num_steps, freq=index.freq)
    if isinstance(index, pd.DatetimeIndex):
        freq = index.freq
        if freq is None and len(index) >= 3:
            with warnings.catch_warnings():  # pandas 3 changes infer_freq's return type
                warnings.simplefilter("ignore")
                inferred = pd.infer_freq(index)
            freq = None if inferred is None else pd.tseries.frequencies.to_offset(inferred)
        if freq is not None:
            return pd.date_range(start=index[-1], periods=num_steps + 1, freq=freq)[1:]
    elif pd.api.types.is_numeric_dtype(index.dtype) and len(index):
        values = np.asarray(index)
        steps = np.diff(values)
        spacing = steps[-1] if values.size > 1 else 1
        if steps.size == 0 or np.allclose(steps, spacing, rtol=1e-9, atol=0):
            return pd.Index(values[-1] + spacing * np.arange(1, num_steps + 1),
                            name=index.name)
    warnings.warn(f"cannot extend a {type(index).__name__} without a regular frequency; the "
                  "forecast has no time index (set the index's freq)", stacklevel=3)
    return None


def _forecast_frame(stats, interval, levels, *, index, columns, event_ndim: int):
    """The table of one series' forecast: shared by `Forecast` and `GaussianForecast`.

    Args:
        stats: ``{name: (num_steps,) + event_shape}`` point statistics (mean, median).
        interval: ``level -> (lower, upper)``, the forecast's central intervals.
        levels: a coverage or a sequence of them; each adds ``lower_<p>`` and
            ``upper_<p>`` columns (``p`` = 100 level).
        index: ``num_steps`` row labels, or ``None`` for ``horizon`` ``1, ..., h``.
        columns: labels of the emission dimensions, or ``None`` for ``0, ..., D - 1``.
        event_ndim: 0 for a scalar series (one column per statistic), 1 for a vector
            series (column pairs ``(statistic, series)``).

    Returns:
        A pandas DataFrame.
    """
    import pandas as pd

    stats = dict(stats)
    for level in (levels,) if np.ndim(levels) == 0 else levels:
        lower, upper = (np.asarray(a) for a in interval(float(level)))
        stats[f"lower_{100 * level:g}"], stats[f"upper_{100 * level:g}"] = lower, upper
    num_steps = len(next(iter(stats.values())))
    if index is None:
        index = pd.RangeIndex(1, num_steps + 1, name="horizon")
    elif len(index) != num_steps:
        raise ValueError(f"index must have one label per forecast step ({num_steps}), got "
                         f"{len(index)}")
    if event_ndim == 0:
        return pd.DataFrame(stats, index=index)
    first = next(iter(stats.values()))
    names = columns if columns is not None else range(first.shape[-1])
    frames = {k: pd.DataFrame(v, index=index, columns=names) for k, v in stats.items()}
    return pd.concat(frames, axis=1)


class Forecast(NamedTuple):
    """Sample-based predictive distribution of the next ``num_steps`` observations.

    Attributes:
        samples: ``(num_samples,) + batch_shape + (num_steps,) + event_shape`` draws from
            ``p(y_{T+1:T+h} | y_{1:T})`` (joint over the horizon, so paths are coherent).
        history: the observed series the forecast conditions on (for plotting).
        event_ndim: number of trailing event axes (0 for a scalar series).
        index: time labels of the forecast steps (a pandas ``Index``) when the history
            was a time-indexed pandas object, else ``None``.
        history_index: the history's pandas index, or ``None``.
        columns: a DataFrame history's column labels (the emission dimensions), or ``None``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> fc = ss.forecast(model, params, y, num_steps=10, num_samples=500,
        ...                  key=jax.random.key(0))
        >>> fc.samples.shape, fc.mean().shape
        ((500, 10), (10,))
        >>> lower, upper = fc.interval(0.9)
        >>> bool((lower <= upper).all())
        True
    """

    samples: Any
    history: Any
    event_ndim: int = 0
    index: Any = None
    history_index: Any = None
    columns: Any = None

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

    def to_frame(self, levels=(0.5, 0.9), index=None):
        """Mean, median and central intervals per future step, as a pandas DataFrame.

        Columns ``mean``, ``median``, ``lower_<p>``, ``upper_<p>`` (``p`` = 100 level); for
        a vector series, column pairs ``(statistic, series)``. Indexed by future time when
        the history had a time index, else by ``horizon`` ``1, ..., h``.

        Args:
            levels: central interval coverages.
            index: ``num_steps`` labels for the rows (default: the forecast's ``index``).

        Returns:
            A pandas DataFrame (one series only: select a batch element first).
        """
        samples = np.asarray(self.samples, float)
        if samples.ndim != 2 + self.event_ndim:
            raise ValueError("to_frame describes one series; this forecast has batch axes "
                             f"(samples of shape {samples.shape})")
        stats = {"mean": samples.mean(axis=0), "median": np.median(samples, axis=0)}
        return _forecast_frame(stats, self.interval, levels,
                               index=self.index if index is None else index,
                               columns=self.columns, event_ndim=self.event_ndim)

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
        A `Forecast`; ``fc.interval(0.9)`` gives 90% prediction intervals. Given a pandas
        Series or DataFrame with a time index, it knows the future time labels
        (``fc.index``, see `future_index`) and ``fc.to_frame()`` is indexed by them.

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
    check_key(key)
    params = validate_params(model, params)  # weak leaves made strong: one program
    num_steps = check_positive_int(num_steps, "num_steps")
    values, history_index, columns = pandas_values(y, len(model.event_shape))
    num_samples = check_positive_int(num_samples, "num_samples")
    # statseq.core.buckets; a model sized from the mask gets the gaps at the end exact too
    model, data = prepare_sized(model, y, mask, inputs, bucket=True, trailing=True)
    if data.num_timesteps < model.num_conditioned_steps:
        raise ValueError(
            f"{type(model).__name__} conditions on its first {model.num_conditioned_steps} "
            f"values, so a forecast needs at least that many; y has {data.num_timesteps}"
        )
    final = final_carries(model, params, data)  # log_prob's and filter's program
    u = _future_inputs(model, future_inputs, data.batch_shape, num_steps)
    num_seq = data.y.shape[0]
    keys = jax.random.split(key, (num_samples, num_seq))
    samples = _sample_from(model, params, final, keys, u)
    samples = jnp.reshape(
        samples, (num_samples,) + data.batch_shape + (num_steps,) + tuple(model.event_shape)
    )
    return Forecast(
        samples=samples, history=np.asarray(values), event_ndim=len(model.event_shape),
        index=None if history_index is None else future_index(history_index, num_steps),
        history_index=history_index, columns=columns,
    )
