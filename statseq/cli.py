"""The ``statseq`` command line: ``statseq demo`` fits the models on bundled data."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class DemoEntry:
    """One row of the demo: a label, a model, and how to fit it to training data.

    Any statseq model works as it is: the row's held-out scores come from
    `statseq.forecast` (sample paths), or from ``forecast`` when given (e.g. an exact
    `GaussianForecast`). A new model family adds rows with a few lines, e.g.
    ``DemoEntry("LSTM(8)", "fit_sgd", ss.LSTM(hidden_dim=8), fit_lstm)`` in
    `demo_sections` (as `_neural_entries` does).
    """

    label: str
    method: str
    model: object
    fit: Callable  # (model, y_train) -> params
    #: ``(model, params, y_train, num_steps, num_samples, key) -> forecast``; ``None``:
    #: sample paths from `statseq.forecast`
    forecast: Callable | None = None


def _exact_gaussian_forecast(model, params, y_train, num_steps, num_samples, key):
    """The Kalman forecast's exact moments (no sampling), for state space models."""
    del num_samples, key
    return model.forecast_moments(params, y_train, num_steps=num_steps)


@dataclass
class DemoSection:
    """One dataset of the demo and the models compared on it."""

    title: str
    series: np.ndarray
    time: np.ndarray
    ylabel: str
    horizon: int
    entries: list[DemoEntry] = field(default_factory=list)


def _ar_entries(max_order: int, num_sgd_steps: int) -> list[DemoEntry]:
    import jax
    import optax

    import statseq as ss

    def exact_mle(model, y):
        # least squares (conditional MLE) is the starting point for the exact MLE
        start = ss.AR(order=model.order).fit_least_squares(y)
        fit = ss.fit_sgd(model, start, y, optimizer=optax.adam(5e-3), num_steps=num_sgd_steps,
                         key=jax.random.key(0), progress=False)
        return fit.params

    return [
        DemoEntry(f"AR({p})", "exact MLE (fit_sgd from least squares)",
                  ss.AR(order=p, initial="stationary"), exact_mle)
        for p in range(1, max_order + 1)
    ]


def _poisson_hmm_entries(max_states: int, num_restarts: int) -> list[DemoEntry]:
    import jax

    import statseq as ss

    def em(model, y):
        res = ss.fit_restarts(model, y, key=jax.random.key(0), num_restarts=num_restarts,
                              num_iters=500, tol=1e-9)
        return res.best.params

    return [
        DemoEntry(f"Poisson HMM, K={k}", f"EM, best of {num_restarts} starts",
                  ss.PoissonHMM(num_states=k, initial="stationary"), em)
        for k in range(1, max_states + 1)
    ]


def _structural_entries(num_iters: int) -> list[DemoEntry]:
    import jax

    import statseq as ss

    def exact_mle(model, y):
        start = model.initialize(y, key=jax.random.key(0))
        return ss.fit_lbfgs(model, start, y, num_iters=num_iters, progress=False).params

    return [
        DemoEntry(label, "exact diffuse MLE (fit_lbfgs)", model, exact_mle,
                  forecast=_exact_gaussian_forecast)
        for label, model in (("local level", ss.LocalLevel()),
                             ("local linear trend", ss.LocalLinearTrend()))
    ]


def _neural_entries(specs, num_steps: int) -> list[DemoEntry]:
    """Neural models fitted by Adam with gradient clipping and early stopping on the last
    15% of the training values (the parameters with the best validation score are kept)."""
    import jax
    import optax

    import statseq as ss

    optimizer = optax.adam(1e-2)  # one object, so fits of equal shapes share a compile

    def sgd(model, y):
        start = model.initialize(y, key=jax.random.key(0))
        fit = ss.fit_sgd(model, start, y, optimizer=optimizer, num_steps=num_steps,
                         key=jax.random.key(1), clip_norm=1.0, validation=0.15,
                         eval_every=10, patience=20, progress=False)
        return fit.params

    return [DemoEntry(label, "fit_sgd (Adam, early stopping)", model, sgd)
            for label, model in specs]


def demo_sections(quick: bool = False) -> list[DemoSection]:
    """The datasets and models of ``statseq demo``: classical models beside neural ones."""
    import statseq as ss

    lynx = ss.datasets.load_lynx()
    quakes = ss.datasets.load_earthquakes()
    nile = ss.datasets.load_nile()
    return [
        DemoSection(
            title="log10 Canadian lynx trappings",
            series=np.log10(lynx.to_numpy().astype(float)),
            time=lynx.index.to_numpy(),
            ylabel="log10 trappings",
            horizon=14,
            entries=_ar_entries(max_order=2 if quick else 4, num_sgd_steps=300 if quick else 1500)
            + _neural_entries(
                [("GRU(8), Gaussian head", ss.GRU(hidden_dim=8)),
                 ("Mamba(8), Gaussian head", ss.Mamba(hidden_dim=8, state_dim=4, num_layers=1))],
                num_steps=100 if quick else 1500),
        ),
        DemoSection(
            title="annual counts of major earthquakes",
            series=quakes.to_numpy(),
            time=quakes.index.to_numpy(),
            ylabel="earthquakes (magnitude 7+)",
            horizon=10,
            entries=_poisson_hmm_entries(max_states=3 if quick else 4,
                                         num_restarts=2 if quick else 5)
            + _neural_entries([("LSTM(8), Poisson head", ss.LSTM(hidden_dim=8,
                                                                  emission="poisson"))],
                              num_steps=100 if quick else 1500),
        ),
        DemoSection(
            title="annual flow of the Nile at Aswan",
            series=nile.to_numpy().astype(float),
            time=nile.index.to_numpy(),
            ylabel="flow (10^8 m^3)",
            horizon=10,
            entries=_structural_entries(num_iters=100 if quick else 300),
        ),
    ]


#: sample paths per held-out forecast (Monte Carlo CRPS and interval coverage)
NUM_FORECAST_SAMPLES = 2000


def _format_table(rows: list[dict]) -> str:
    cols = [("model", "{}"), ("method", "{}"), ("k", "{}"), ("n", "{}"),
            ("log_lik", "{:.2f}"), ("aic", "{:.2f}"), ("bic", "{:.2f}"),
            ("heldout_log_score", "{:.2f}"), ("heldout_crps", "{:#.4g}"),
            ("heldout_coverage_90", "{:.0%}"), ("fit_seconds", "{:.2f}")]
    header = ["model", "method", "k", "n", "log-lik", "AIC", "BIC", "held-out log score",
              "CRPS", "90% cover", "fit s"]
    cells = [[fmt.format(r[c]) for c, fmt in cols] for r in rows]
    for row, r in zip(cells, rows, strict=True):
        if r["crps_exact"]:
            row[8] += "*"
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    if any(r["crps_exact"] for r in rows):
        out.append("* exact: closed-form CRPS and intervals of the Kalman (Gaussian) forecast; "
                   "other rows: Monte Carlo from "
                   f"{NUM_FORECAST_SAMPLES} sample paths")
    return "\n".join(out)


def _heldout_forecast(entry, params, y_train, horizon, seed):
    import jax

    import statseq as ss

    key = jax.random.key(seed)
    if entry.forecast is not None:
        return entry.forecast(entry.model, params, y_train, horizon, NUM_FORECAST_SAMPLES, key)
    return ss.forecast(entry.model, params, y_train, num_steps=horizon,
                       num_samples=NUM_FORECAST_SAMPLES, key=key)


def _run_section(section: DemoSection, stream, seed: int = 0) -> tuple[list[dict], list]:
    import statseq as ss

    y_train, y_test = section.series[:-section.horizon], section.series[-section.horizon:]
    print(f"\n== {section.title}, {section.time[0]}-{section.time[-1]} "
          f"({section.series.size} values): fitted to the first {y_train.size}, "
          f"last {section.horizon} held out ==", file=stream)
    rows, fitted = [], []
    for entry in section.entries:
        t0 = time.perf_counter()
        params = entry.fit(entry.model, y_train)
        seconds = time.perf_counter() - t0
        ic = ss.information_criteria(entry.model, params, y_train)
        score = ss.log_score(entry.model, params, y_train, y_test)
        fc = _heldout_forecast(entry, params, y_train, section.horizon, seed)
        rows.append({"section": section.title, "model": entry.label, "method": entry.method,
                     "k": ic["num_params"], "n": ic["num_obs"], "log_lik": ic["log_lik"],
                     "aic": ic["aic"], "bic": ic["bic"], "heldout_log_score": score,
                     "heldout_crps": float(ss.crps(fc, y_test).mean()),
                     "heldout_coverage_90": ss.interval_coverage(fc, y_test, (0.9,))[0.9],
                     "crps_exact": not hasattr(fc, "samples"),
                     "fit_seconds": seconds})
        fitted.append((entry, params, fc))
    print(_format_table(rows), file=stream)
    return rows, fitted


def _plot_section(ax, section, rows, fitted):
    best = min(range(len(rows)), key=lambda i: rows[i]["aic"])
    entry, _, fc = fitted[best]
    h = section.horizon
    y_test = section.series[-h:]
    fc.plot(ax=ax, time=section.time[:-h], future_time=section.time[-h:])
    ax.plot(section.time[-h:], y_test, "o", color="k", ms=3, label="held out")
    ax.set_title(f"{section.title}: {entry.label} (best AIC); 90% interval covers "
                 f"{rows[best]['heldout_coverage_90']:.0%} of held-out values", fontsize=9)
    ax.set_ylabel(section.ylabel)
    ax.legend(loc="upper left", fontsize=7)
    return entry.label


def run_demo(output: str | os.PathLike = "statseq-demo", plot: bool = True, seed: int = 0,
             quick: bool = False, stream=sys.stdout) -> list[dict]:
    """Fit every available model to bundled real series and compare them.

    For each series the last values are held out. Every model is fitted to the training
    part, scored on it (exact log-likelihood, AIC, BIC: every row of a section scores the
    same observations) and on the held-out part: ``log p(y_test | y_train)`` (exact, a sum
    of one-step-ahead log-densities), and the forecast of all held-out steps from the end of
    the training data scored by its mean CRPS and its 90% interval coverage (exact for the
    state space models' Gaussian forecasts, else from sample paths). A fan chart of each
    section's best model by AIC, with the held-out values, is written to
    ``output/forecast.png``. The fits assume float64 (``statseq demo`` turns it on).

    Args:
        output: folder for the plot.
        plot: whether to draw it.
        seed: seed of the forecast sample paths.
        quick: fewer models (AR orders, HMM states), iterations and restarts (for tests).
        stream: where the tables are printed.

    Returns:
        The table rows as dicts (keys as in the table, e.g. ``heldout_crps``).
    """
    sections = demo_sections(quick=quick)
    print("statseq demo: every model is an autoregressive likelihood "
          "log p(y) = sum_t log p(y_t | y_<t), fitted and compared on one scale.", file=stream)
    results = [(s, *_run_section(s, stream, seed)) for s in sections]
    print("\nk: free parameters; n: observations scored (all rows of a section score the "
          "same ones, so AIC and BIC compare); held-out log score: log p(y_test | y_train), "
          "the exact joint density of the held-out values (a sum of one-step-ahead "
          "predictive log-densities), higher is better; CRPS: mean continuous ranked "
          "probability score of the forecast of all held-out steps made at the end of the "
          "training data (in the data's units, lower is better); 90% cover: share of "
          "held-out values inside that forecast's central 90% intervals.", file=stream)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(results), 1, figsize=(9, 3.6 * len(results)))
        for ax, (section, rows, fitted) in zip(np.atleast_1d(axes), results, strict=True):
            _plot_section(ax, section, rows, fitted)
        axes[-1].set_xlabel("year")
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        path = out / "forecast.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        print(f"forecast plots of each section's best model by AIC written to {path}",
              file=stream)
    return [row for _, rows, _ in results for row in rows]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``statseq`` command."""
    from statseq import __version__

    parser = argparse.ArgumentParser(prog="statseq", description=__doc__)
    parser.add_argument("--version", action="version", version=f"statseq {__version__}")
    sub = parser.add_subparsers(dest="command")
    demo = sub.add_parser("demo", help="fit the models to bundled real data and compare them")
    demo.add_argument("--output", default="statseq-demo", help="folder for the forecast plot")
    demo.add_argument("--no-plot", action="store_true", help="skip the forecast plot")
    demo.add_argument("--quick", action="store_true", help="fewer iterations (for tests)")
    args = parser.parse_args(argv)
    if args.command != "demo":
        parser.print_help()
        return 0 if args.command is None else 2
    import jax

    # the demo's fits (the Nile's exact diffuse likelihood above all) need float64
    jax.config.update("jax_enable_x64", True)
    t0 = time.perf_counter()
    run_demo(output=args.output, plot=not args.no_plot, quick=args.quick)
    print(f"done in {time.perf_counter() - t0:.1f} s", file=sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
