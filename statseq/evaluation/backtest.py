"""Tidy forecast evaluation tables and rolling-origin backtests (pandas DataFrames)."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.params import validate_params
from statseq.core.validation import (
    check_key,
    check_positive_int,
    pandas_values,
    prepare_data,
    require_observed,
)
from statseq.evaluation._origins import PILOT_PATHS, mc_settings, origin_forecasts
from statseq.evaluation.scores import (
    _check_levels,
    _is_gaussian,
    _more_paths,
    _samples,
    _truth,
    crps,
    crps_from_samples,
    gaussian_log_density,
    prediction_interval,
)


def _pct(level: float) -> str:
    return f"{100 * level:g}"


def _long_frame(lead: dict, columns: dict, shape: tuple[int, ...]):
    """A long DataFrame: ``lead`` columns are index labels per axis, ``columns`` arrays."""
    import pandas as pd

    grids = np.indices(shape).reshape(len(shape), -1)
    data = {}
    for axis, (name, labels) in enumerate(lead.items()):
        data[name] = np.asarray(labels)[grids[axis]] if labels is not None else grids[axis]
    for name, values in columns.items():
        data[name] = np.broadcast_to(np.asarray(values), shape).reshape(-1)
    return pd.DataFrame(data)


def _stats_columns(y, mean, median, bounds, crps_values, log_scores) -> dict:
    cols = {"y": y, "mean": mean, "median": median}
    for level, (lo, hi) in bounds.items():
        cols[f"lower_{_pct(level)}"] = lo
        cols[f"upper_{_pct(level)}"] = hi
    for level, (lo, hi) in bounds.items():
        covered = ((y >= lo) & (y <= hi)).astype(float)
        cols[f"covered_{_pct(level)}"] = np.where(np.isfinite(y), covered, np.nan)
    cols["crps"] = crps_values
    cols["log_score"] = log_scores
    return cols


def evaluate_forecast(forecast, y_true, *, levels=(0.5, 0.8, 0.9), log_scores=None,
                      estimator: str = "fair", index=None):
    """One forecast scored against the realized values, as a tidy table.

    One row per future step (and per dimension of a vector series, column ``series``):
    ``horizon`` (1-based), ``time`` (when known), ``y``, ``mean``, ``median``,
    ``lower_<p>``/``upper_<p>`` (central ``p``% interval), ``covered_<p>`` (1.0/0.0),
    ``crps`` and ``log_score``. A `GaussianForecast` is scored exactly (closed-form CRPS,
    exact marginal log-densities); a sample `Forecast` by Monte Carlo, and its
    ``log_score`` is ``NaN`` unless log densities are passed (`log_predictive_density`
    with ``marginal=True`` gives them: exact, or for a neural network a Monte Carlo
    estimate with its standard error; densities are never estimated from the samples).

    Args:
        forecast: a `Forecast` or `GaussianForecast` of one series (no batch axes).
        y_true: realized values ``(num_steps,) + event_shape`` (``NaN`` = missing).
        levels: interval coverages.
        log_scores: optional log-densities per step (or per step and dimension).
        estimator: sample CRPS estimator, ``"fair"`` or ``"energy"``.
        index: future time labels (default: ``y_true``'s pandas index, else the
            forecast's own ``index``).

    Returns:
        A pandas DataFrame.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> model = ss.AR(order=1)
        >>> fc = ss.forecast(model, model.default_params(), np.zeros(5), num_steps=3,
        ...                  num_samples=200, key=jax.random.key(0))
        >>> table = ss.evaluate_forecast(fc, np.zeros(3), levels=(0.9,))
        >>> table.shape, list(table.columns[-4:])
        ((3, 9), ['upper_90', 'covered_90', 'crps', 'log_score'])
    """
    levels = _check_levels(levels)
    y = _truth(forecast, y_true)
    if y.ndim not in (1, 2):
        raise ValueError("evaluate_forecast scores one series: forecast a single sequence")
    if index is None:
        index = pandas_values(y_true)[1]
    if index is None and not _is_gaussian(forecast):
        index = getattr(forecast, "index", None)  # (a NamedTuple's .index is a method)
    if _is_gaussian(forecast):
        mean = median = np.asarray(forecast.mean, float)
        lps = gaussian_log_density(forecast, y)
    else:
        samples = _samples(forecast)
        mean, median = samples.mean(axis=0), np.median(samples, axis=0)
        lps = np.full(y.shape, np.nan)
    if log_scores is not None:
        lps = np.asarray(log_scores, float)
        lps = lps.reshape(lps.shape + (1,) * (y.ndim - lps.ndim))
    bounds = {level: prediction_interval(forecast, level) for level in levels}
    cols = _stats_columns(y, mean, median, bounds, crps(forecast, y, estimator=estimator), lps)
    h = y.shape[0]
    lead = {"horizon": np.arange(1, h + 1)}
    if y.ndim == 2:
        names = getattr(forecast, "columns", None)
        lead["series"] = np.arange(y.shape[1]) if names is None else np.asarray(names)
    frame = _long_frame(lead, cols, y.shape)
    if index is not None:
        frame.insert(1, "time", np.repeat(np.asarray(index), y.size // h))
    return frame


def compare_forecasts(forecasts: dict, y_true, *, levels=(0.5, 0.8, 0.9), log_scores=None,
                      estimator: str = "fair"):
    """Several forecasts of the same values side by side: one row per forecast.

    Columns: ``crps`` (mean over steps and dimensions), ``log_score`` (mean exact
    log-density; ``NaN`` where none is available), ``coverage_<p>`` (fraction of values in
    the central ``p``% interval) and ``width_<p>`` (mean interval width).

    Args:
        forecasts: ``{label: Forecast or GaussianForecast}``.
        y_true: the realized values they forecast.
        levels: interval coverages.
        log_scores: optional ``{label: exact per-step log-densities}``.
        estimator: sample CRPS estimator.

    Returns:
        A pandas DataFrame indexed by label.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> def ar_forecast(p):
        ...     m = ss.AR(order=p)
        ...     return ss.forecast(m, m.fit_least_squares(y[:100]), y[:100], num_steps=14,
        ...                        num_samples=300, key=jax.random.key(p))
        >>> fcs = {"AR(1)": ar_forecast(1), "AR(2)": ar_forecast(2)}
        >>> table = ss.compare_forecasts(fcs, y[100:], levels=(0.9,))
        >>> list(table.index), "crps" in table.columns
        (['AR(1)', 'AR(2)'], True)
    """
    import pandas as pd

    if not forecasts:
        raise ValueError("forecasts is empty")
    levels = _check_levels(levels)
    rows = {}
    for label, fc in forecasts.items():
        lps = None if log_scores is None else log_scores.get(label)
        frame = evaluate_forecast(fc, y_true, levels=levels, log_scores=lps,
                                  estimator=estimator)
        row = {"crps": frame["crps"].mean(), "log_score": frame["log_score"].mean()}
        for level in levels:
            p = _pct(level)
            row[f"coverage_{p}"] = frame[f"covered_{p}"].mean()
            row[f"width_{p}"] = (frame[f"upper_{p}"] - frame[f"lower_{p}"]).mean()
        rows[label] = row
    return pd.DataFrame.from_dict(rows, orient="index")


class BacktestResult(NamedTuple):
    """What `backtest` returns.

    Attributes:
        table: one row per origin, horizon step (and series): forecast, realized value and
            scores (see `backtest`).
        summary: mean scores and empirical coverage per horizon step (and series).
        origins: the origins (number of values each forecast conditions on).
        samples: ``(num_origins, num_samples, horizon) + event_shape`` sample paths.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> res = ss.backtest(model, params, y, initial=100, horizon=2, step=7, num_samples=100,
        ...                   key=jax.random.key(0))
        >>> res.origins.tolist(), res.samples.shape
        ([100, 107], (2, 100, 2))
        >>> list(res.summary.index)                        # one row per horizon
        [1, 2]
    """

    table: Any
    summary: Any
    origins: np.ndarray
    samples: np.ndarray


def _origins(num_timesteps, initial, horizon, step, origins, min_origin):
    if origins is None:
        initial = check_positive_int(initial, "initial", min_origin)
        step = check_positive_int(step, "step")
        if initial + horizon > num_timesteps:
            raise ValueError(f"no origins: need initial + horizon <= len(y); got initial = "
                             f"{initial}, horizon = {horizon}, len(y) = {num_timesteps}")
        origins = np.arange(initial, num_timesteps - horizon + 1, step)
    origins = np.asarray(origins)
    if origins.dtype == bool or not np.issubdtype(origins.dtype, np.integer):
        raise TypeError(f"origins must be integers, got dtype {origins.dtype}")
    if origins.ndim != 1 or origins.size == 0:
        raise ValueError(f"origins must be a non-empty 1-D list of integers, got shape "
                         f"{origins.shape}")
    if np.unique(origins).size != origins.size:
        values, counts = np.unique(origins, return_counts=True)
        raise ValueError(f"origins has repeated values {values[counts > 1].tolist()}: each "
                         "forecast would be scored twice")
    if origins.min() < min_origin or origins.max() + horizon > num_timesteps:
        raise ValueError(
            f"origins must lie in [{min_origin}, len(y) - horizon = "
            f"{num_timesteps - horizon}]; got {origins.min()}..{origins.max()}"
        )
    return origins.astype(int)


def backtest(model, params_or_fit_fn, y, *, horizon, key, initial=None, step=1, origins=None,
             num_samples=1000, levels=(0.5, 0.8, 0.9), mask=None, inputs=None,
             estimator: str = "fair", num_paths: int | None = None) -> BacktestResult:
    """Rolling-origin evaluation: forecast ``horizon`` steps from many origins and score.

    For each origin ``o`` (``initial, initial + step, ...``, while ``o + horizon <=
    len(y)``) the model conditions on ``y_{0:o-1}`` only and forecasts ``y_{o:o+h-1}``:

        samples ~ p(y_{o:o+h-1} | y_{0:o-1}),   log_score_k = log p(y_{o+k-1} | y_{0:o-1}).

    Every origin is filtered from the true start of the series with the values from ``o``
    on unseen (trailing-origin masking), so all origins run in one compiled program, and
    each equals `statseq.forecast` on the truncated series ``y[:o]`` with key
    ``jax.random.fold_in(key, i)`` for the ``i``-th origin (a test checks this).
    ``log_score`` is the h-step marginal log-density (exact where the filter marginalizes
    the intermediate steps: ``model.marginalizes_masked_steps``), per dimension for vector
    series of models with partial masks (else ``NaN``); ``crps`` and the intervals come
    from the samples.

    For a neural network (``model.marginalizes_masked_steps`` False: it reads a masked
    step as 0 plus an indicator) ``log_score`` at horizons ``k >= 2`` is a
    Rao-Blackwellised Monte Carlo estimate over ``num_paths`` ancestral paths (see
    `statseq.log_predictive_density`; keys ``jax.random.fold_in(jax.random.fold_in(key,
    i), 1)``, independent of the sample paths); ``log_score_se`` is its standard error
    (0 where the score is exact) and ``log_score_is_estimate`` says which scores are
    estimates. The summary's ``log_score_se`` is the standard error of the mean over
    origins (independent paths per origin).

    Args:
        model: a statseq model.
        params_or_fit_fn: parameters (kept fixed), or ``fit_fn(model, y[:o]) -> params``
            called at every origin (refitting; pandas input is sliced with ``iloc``).
        y: one series ``(T,) + event_shape``: array, pandas Series or DataFrame.
        horizon: forecast steps ``h``.
        key: a ``jax.random`` key.
        initial: first origin (length of the first history).
        step: distance between origins.
        origins: explicit origins (distinct integers) instead of ``initial``/``step``.
        num_samples: sample paths per origin.
        levels: central interval coverages to report.
        mask: optional mask of ``y`` (missing values are neither conditioned on nor scored).
        inputs: ``(T, input_dim)`` covariates, when the model takes inputs.
        estimator: sample CRPS estimator, ``"fair"`` or ``"energy"``.
        num_paths: Monte Carlo paths per origin for estimated log scores (default: a
            4096-path pilot extended until every standard error is at most 0.01 nats, as
            in `statseq.log_predictive_density`; neural models only).

    Returns:
        A `BacktestResult`: ``table`` with columns ``origin``, ``horizon``, ``time``,
        [``series``,] ``y``, ``mean``, ``median``, ``lower_<p>``, ``upper_<p>``,
        ``covered_<p>``, ``crps``, ``log_score``, ``log_score_se``,
        ``log_score_is_estimate``; ``summary`` with their means by horizon (and the
        standard error of the mean log score).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> res = ss.backtest(model, model.fit_least_squares(y), y, initial=100,
        ...                   horizon=3, step=5, num_samples=200, key=jax.random.key(0))
        >>> res.table.shape[0], list(res.summary.index)
        (9, [1, 2, 3])
    """
    check_key(key)
    mc_key, num_paths = mc_settings(model, key, num_paths)
    horizon = check_positive_int(horizon, "horizon")
    num_samples = check_positive_int(num_samples, "num_samples", 2)
    levels = _check_levels(levels)
    if estimator not in ("fair", "energy"):  # (checked before any forecast is computed)
        raise ValueError(f"estimator must be 'fair' or 'energy', got {estimator!r}")
    event_ndim = len(model.event_shape)
    _, index, columns = pandas_values(y, event_ndim)
    data = prepare_data(model, y, mask, inputs)
    if data.batch_shape != ():
        raise ValueError(f"backtest takes one series; y has batch shape {data.batch_shape}")
    require_observed(data, "backtest")
    t_len = data.num_timesteps
    origins = _origins(t_len, initial, horizon, step, origins,
                       max(1, model.num_conditioned_steps))
    if callable(params_or_fit_fn):
        fits = []
        for o in origins:
            past = y.iloc[:o] if index is not None else np.asarray(y)[:o]
            fits.append(params_or_fit_fn(model, past) if mask is None
                        else params_or_fit_fn(model, past, mask=np.asarray(mask)[:o]))
            validate_params(model, fits[-1])
        params = jax.tree.map(lambda *a: jnp.stack([jnp.asarray(x) for x in a]), *fits)
        stacked = True
    else:
        params, stacked = params_or_fit_fn, False
        validate_params(model, params)
    per_dim = event_ndim > 0 and model.supports_partial_mask
    keys = jax.vmap(lambda i: jax.random.split(jax.random.fold_in(key, i), (num_samples, 1))[
        :, 0])(jnp.arange(origins.size))
    mc_keys = None
    estimated = mc_key is not None
    if estimated:
        mc_keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.fold_in(key, i), 1))(
            jnp.arange(origins.size))

    def run(paths):
        return origin_forecasts(
            model, params, data.y[0], data.mask[0], data.inputs[0], jnp.asarray(origins),
            keys, mc_keys, horizon=horizon, stacked=stacked, per_dim=per_dim, sample=True,
            num_paths=paths,
        )

    auto = estimated and num_paths is None
    out = run(PILOT_PATHS if auto else num_paths)
    if auto:
        out = _more_paths(run, out[3][0] if out[3][1] is None else out[3][1],
                          PILOT_PATHS) or out
    lps, lps_d, samples, (se, se_d) = out
    samples = np.asarray(samples, float)  # (m, S, h, *event)
    bad = ~np.all(np.isfinite(samples.reshape(origins.size, -1)), axis=1)
    if bad.any():
        warnings.warn(
            f"the forecasts from origins {origins[bad].tolist()} are not finite (too little "
            "history to identify the state, e.g. diffuse components): their rows score NaN",
            stacklevel=2,
        )
    truth = np.where(np.asarray(data.mask[0]), np.asarray(data.y[0], float), np.nan)
    targets = origins[:, None] + np.arange(horizon)  # (m, h)
    y_future = truth[targets]
    if event_ndim == 0:
        log_scores, log_se = np.asarray(lps, float), np.asarray(se, float)
    elif per_dim:
        log_scores, log_se = np.asarray(lps_d, float), np.asarray(se_d, float)
    else:
        log_scores = log_se = np.full(y_future.shape, np.nan)
    est_k = estimated & (np.arange(horizon) > 0)  # k = 1 is exact
    estimated = np.broadcast_to(est_k.reshape((1, horizon) + (1,) * event_ndim),
                                y_future.shape) & np.isfinite(log_scores)
    draws = np.moveaxis(samples, 1, 0)  # (S, m, h, *event)
    bounds = {level: prediction_interval(draws, level) for level in levels}
    cols = _stats_columns(y_future, draws.mean(axis=0), np.median(draws, axis=0), bounds,
                          crps_from_samples(draws, y_future, estimator=estimator), log_scores)
    lead = {"origin": origins, "horizon": np.arange(1, horizon + 1)}
    if event_ndim:
        lead["series"] = np.arange(y_future.shape[-1]) if columns is None else np.asarray(
            columns)
    cols["log_score_se"] = log_se
    cols["log_score_is_estimate"] = estimated
    table = _long_frame(lead, cols, y_future.shape)
    labels = np.asarray(index) if index is not None else np.arange(t_len)
    times = np.broadcast_to(labels[targets].reshape(targets.shape + (1,) * event_ndim),
                            y_future.shape).reshape(-1)
    table.insert(2, "time", times)
    group = ["horizon", "series"] if event_ndim else ["horizon"]
    scores = [c for c in table.columns if c.startswith("covered_")] + ["crps", "log_score"]
    summary = table.groupby(group)[scores].mean()
    summary = summary.rename(columns={c: "coverage_" + c[len("covered_"):]
                                      for c in scores if c.startswith("covered_")})
    scored = table["log_score"].notna()
    summary["log_score_se"] = (table["log_score_se"].where(scored) ** 2).groupby(
        [table[g] for g in group]).sum(min_count=1) ** 0.5 / scored.groupby(
        [table[g] for g in group]).sum()
    summary["num_origins"] = table.groupby(group)["y"].count()
    return BacktestResult(table=table, summary=summary, origins=origins, samples=samples)
