"""The ``statseq`` command line: ``statseq demo`` fits the models on bundled data."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class DemoEntry:
    """One row of the demo: a label, a model, and how to fit it to training data."""

    label: str
    method: str
    model: object
    fit: Callable  # (model, y_train) -> params


def _demo_entries(max_order: int, num_sgd_steps: int) -> list[DemoEntry]:
    """The models in the demo. Later model families append their entries here."""
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


def _format_table(rows: list[dict]) -> str:
    cols = [("model", "{}"), ("method", "{}"), ("k", "{}"), ("n", "{}"),
            ("log_lik", "{:.2f}"), ("aic", "{:.2f}"), ("bic", "{:.2f}"),
            ("heldout_log_score", "{:.2f}"), ("fit_seconds", "{:.2f}")]
    header = ["model", "method", "k", "n", "log-lik", "AIC", "BIC", "held-out log score",
              "fit s"]
    cells = [[fmt.format(r[c]) for c, fmt in cols] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(out)


def run_demo(output: str | os.PathLike = "statseq-demo", horizon: int = 14,
             max_order: int = 4, num_sgd_steps: int = 1500, plot: bool = True,
             seed: int = 0, stream=sys.stdout) -> list[dict]:
    """Fit every available model to log10 Canadian lynx trappings and compare them.

    The last ``horizon`` years are held out. Each model is fitted to the training years,
    scored on the same training observations (log-likelihood, AIC, BIC) and on the held-out
    years (``log p(y_test | y_train)``, a one-step-ahead log score). A forecast fan chart of
    the best model by AIC is written to ``output/forecast.png``.

    Returns:
        The table rows as dicts.
    """
    import jax

    import statseq as ss

    y_all = np.log10(ss.datasets.load_lynx().to_numpy().astype(float))
    years = ss.datasets.load_lynx().index.to_numpy()
    if not 1 <= horizon < y_all.size - 20:
        raise ValueError(f"horizon must be between 1 and {y_all.size - 21}, got {horizon}")
    y_train, y_test = y_all[:-horizon], y_all[-horizon:]
    print(f"statseq demo: log10 Canadian lynx trappings {years[0]}-{years[-1]} "
          f"({y_all.size} years); training on {y_train.size}, holding out the last "
          f"{horizon}.", file=stream)
    rows, fitted = [], []
    for entry in _demo_entries(max_order, num_sgd_steps):
        t0 = time.perf_counter()
        params = entry.fit(entry.model, y_train)
        seconds = time.perf_counter() - t0
        ic = ss.information_criteria(entry.model, params, y_train)
        score = ss.log_score(entry.model, params, y_train, y_test)
        rows.append({"model": entry.label, "method": entry.method, "k": ic["num_params"],
                     "n": ic["num_obs"], "log_lik": ic["log_lik"], "aic": ic["aic"],
                     "bic": ic["bic"], "heldout_log_score": score, "fit_seconds": seconds})
        fitted.append((entry, params))
    print(_format_table(rows), file=stream)
    print("k: free parameters; n: observations scored (every row uses the exact likelihood "
          "of all training years, so AIC and BIC are comparable); held-out log score: "
          "log p(y_test | y_train), higher is better.", file=stream)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        best = min(range(len(rows)), key=lambda i: rows[i]["aic"])
        entry, params = fitted[best]
        fc = ss.forecast(entry.model, params, y_train, num_steps=horizon, num_samples=4000,
                         key=jax.random.key(seed))
        fig, ax = plt.subplots(figsize=(9, 4))
        fc.plot(ax=ax, time=years[:-horizon], future_time=years[-horizon:])
        ax.plot(years[-horizon:], y_test, "o", color="k", ms=3, label="held out")
        lo, hi = fc.interval(0.9)
        covered = np.mean((y_test >= np.asarray(lo)) & (y_test <= np.asarray(hi)))
        ax.set_title(f"{entry.label} forecast of log10 lynx trappings "
                     f"(90% interval covers {covered:.0%} of held-out years)")
        ax.set_xlabel("year")
        ax.set_ylabel("log10 trappings")
        ax.legend(loc="upper left", fontsize=8)
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        path = out / "forecast.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        print(f"forecast plot of the best model by AIC ({entry.label}) written to {path}",
              file=stream)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``statseq`` command."""
    from statseq import __version__

    parser = argparse.ArgumentParser(prog="statseq", description=__doc__)
    parser.add_argument("--version", action="version", version=f"statseq {__version__}")
    sub = parser.add_subparsers(dest="command")
    demo = sub.add_parser("demo", help="fit the models to bundled real data and compare them")
    demo.add_argument("--output", default="statseq-demo", help="folder for the forecast plot")
    demo.add_argument("--horizon", type=int, default=14, help="years held out and forecast")
    demo.add_argument("--no-plot", action="store_true", help="skip the forecast plot")
    args = parser.parse_args(argv)
    if args.command != "demo":
        parser.print_help()
        return 0 if args.command is None else 2
    t0 = time.perf_counter()
    run_demo(output=args.output, horizon=args.horizon, plot=not args.no_plot)
    print(f"done in {time.perf_counter() - t0:.1f} s", file=sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
