"""Plots where a picture beats a table: fit traces and forecast fan charts."""

from __future__ import annotations

import numpy as np


def _axes(ax):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    return ax


def _plottable(index):
    """A pandas index as matplotlib x values (periods become timestamps)."""
    if index is None:
        return None
    if hasattr(index, "to_timestamp"):
        index = index.to_timestamp()
    return np.asarray(index)


def plot_traces(fits: dict, ax=None, *, by: str = "iteration", relative: bool = False):
    """Plot the log joint trace of several fits on one axis.

    Args:
        fits: ``{label: FitResult}``; every statseq fitting method records the same
            objective (log p(y | theta) + log p(theta)), so curves are comparable.
        ax: matplotlib axes (a new figure when ``None``).
        by: ``"iteration"`` or ``"time"`` (wall-clock seconds, assuming equal cost per
            iteration within a fit, compilation included).
        relative: plot ``best - trace`` on a log scale instead of the trace itself.

    Returns:
        The matplotlib ``Axes``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> import matplotlib.pyplot as plt
        >>> fits = {"L-BFGS": ss.fit_lbfgs(model, model.default_params(), y, progress=False)}
        >>> ax = ss.plot_traces(fits)
        >>> ax.get_ylabel() != "", len(ax.get_lines()) >= 1
        (True, True)
        >>> plt.close("all")
    """
    if by not in ("iteration", "time"):
        raise ValueError(f"by must be 'iteration' or 'time', got {by!r}")
    ax = _axes(ax)
    best = max(np.nanmax(np.asarray(f.log_joint)) for f in fits.values())
    for label, fit in fits.items():
        trace = np.asarray(fit.log_joint, float)
        trace = trace[np.isfinite(trace)]
        x = np.arange(1, trace.size + 1, dtype=float)
        if by == "time":
            x = x * fit.wall_time / max(trace.size, 1)
        ax.plot(x, best - trace + 1e-12 if relative else trace, label=label)
    if relative:
        ax.set_yscale("log")
    ax.set_xlabel("iteration" if by == "iteration" else "wall-clock seconds")
    ax.set_ylabel("log joint (best − trace)" if relative else "log joint")
    ax.legend()
    return ax


def plot_forecast(fc, ax=None, *, levels=(0.5, 0.9), time=None, future_time=None,
                  history_label="observed", color="C0"):
    """Fan chart of a scalar forecast: history, median and central intervals.

    Args:
        fc: a `~statseq.forecast.Forecast` (sample paths) or a
            `~statseq.models.ssm.base.GaussianForecast` (exact moments) of one scalar series.
        ax: matplotlib axes.
        levels: interval coverages to shade (wider is lighter).
        time: x values of the history (default: the history's time index when the
            forecast was made from a pandas object, else ``0, ..., T-1``).
        future_time: x values of the forecast steps (default: the forecast's future time
            index, else continuing ``time`` with its last spacing).
        history_label: legend label of the history.
        color: colour of the median line and the interval bands.

    Returns:
        The matplotlib ``Axes``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> import matplotlib.pyplot as plt
        >>> fc = ss.forecast(model, params, y, num_steps=10, num_samples=300, key=jax.random.key(0))
        >>> ax = ss.plot_forecast(fc)
        >>> ax.get_legend() is not None
        True
        >>> plt.close("all")
    """
    history = np.asarray(fc.history, float)
    if hasattr(fc, "samples"):  # sample-based: empirical quantiles
        samples = np.asarray(fc.samples, float)
        centre = np.median(samples, axis=0) if samples.ndim == 2 else None

        def bounds(level):
            return np.quantile(samples, [(1 - level) / 2, (1 + level) / 2], axis=0)
    else:  # analytic Gaussian (GaussianForecast): mean = median, exact intervals
        centre = np.asarray(fc.mean, float)
        samples = centre[None]

        def bounds(level):
            lo, hi = fc.interval(level)
            return np.asarray(lo, float), np.asarray(hi, float)
    if history.ndim != 1 or samples.ndim != 2:
        raise ValueError("plot_forecast draws one scalar series; select a series first")
    if time is None:
        time = _plottable(getattr(fc, "history_index", None))
    if future_time is None:
        future_time = _plottable(getattr(fc, "index", None))
    ax = _axes(ax)
    t_hist = np.arange(history.size) if time is None else np.asarray(time)
    if future_time is None:
        step = t_hist[-1] - t_hist[-2] if t_hist.size > 1 else 1
        future_time = t_hist[-1] + step * np.arange(1, samples.shape[1] + 1)
    future_time = np.asarray(future_time)
    ax.plot(t_hist, history, color="k", lw=1, label=history_label)
    for i, level in enumerate(sorted(levels, reverse=True)):
        lo, hi = bounds(level)
        ax.fill_between(future_time, lo, hi, color=color, alpha=0.2 + 0.2 * i,
                        lw=0, label=f"{int(round(level * 100))}% interval")
    ax.plot(future_time, centre, color=color, lw=1.5, label="median")
    ax.legend(loc="best")
    return ax
