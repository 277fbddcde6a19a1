#!/usr/bin/env python
"""Plot the scaling benchmarks: one figure, three panels, for docs/scaling.md.

Reads the ``--json`` rows of ``bench_scaling.py`` (data parallel) and
``bench_time_sharding.py`` (time sharding) and draws

1. strong scaling: speed-up ``t(1) / t(D)`` against the device count ``D`` for each job,
   with the ideal line ``D`` and the ceiling of the machine's cores (``--cores``);
2. weak scaling: seconds against ``D`` (a fixed number of sequences per device; ideal is flat);
3. time sharding: XLA's memory per device (``Compiled.memory_analysis``) against ``D`` for each
   workload, with the ideal ``T / D`` line drawn from the one-device value.

    python benchmarks/bench_scaling.py --strong-n 16 --weak-n 4 --length 200 \\
        --json benchmarks/scaling_runs/scaling.json
    python benchmarks/bench_time_sharding.py --quick \\
        --json benchmarks/scaling_runs/time_sharding.json
    python benchmarks/plot_scaling.py --out docs/img/scaling.png

The title names the machine ("2-core CPU, virtual devices" by default, ``--machine``) and the
date of the runs (``--date``; default: the newer JSON file's modification date, UTC).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = HERE / "scaling_runs"


def load(path: Path) -> list[dict]:
    rows = json.loads(Path(path).read_text())
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a non-empty JSON list of rows")
    return rows


def series(rows, group_key, x_key, y_key, where=lambda r: True):
    """``{group: (xs, ys)}`` sorted by x, from the rows that pass ``where``."""
    out = defaultdict(list)
    for r in rows:
        if where(r):
            out[r[group_key]].append((r[x_key], r[y_key]))
    return {g: tuple(zip(*sorted(v), strict=True)) for g, v in sorted(out.items())}


def plot(scaling: list[dict], sharding: list[dict], out: Path, machine: str, date: str,
         dpi: int = 100, cores: int = 2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 3, figsize=(13, 4.0), constrained_layout=True)
    counts = sorted({r["devices"] for r in scaling} | {r["D"] for r in sharding})

    ax = axes[0]
    strong = series(scaling, "job", "devices", "seconds", lambda r: r["mode"] == "strong")
    for job, (d, t) in strong.items():
        n = next(r["sequences"] for r in scaling if r["mode"] == "strong" and r["job"] == job)
        ax.plot(d, [t[0] / v for v in t], "o-", label=f"{job} ({n} seqs)")
    ax.plot(counts, [c / counts[0] for c in counts], "k--", lw=1, label="ideal")
    if cores:
        ax.axhline(cores, color="grey", ls=":", lw=1.2,
                   label=f"{cores} cores: at most {cores}x")
    lo = min(min(t[0] / v for v in t) for _, t in strong.values())
    ticks = [2.0**k for k in range(-6, 4) if lo / 2 <= 2.0**k <= counts[-1]]
    ax.set(xscale="log", yscale="log", xlabel="devices", ylabel="speed-up t(1) / t(D)",
           title="Data parallel, strong scaling")
    ax.set_yticks(ticks, [f"{v:g}" for v in ticks])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())

    ax = axes[1]
    weak = series(scaling, "job", "devices", "seconds", lambda r: r["mode"] == "weak")
    per_dev = {r["sequences"] // r["devices"] for r in scaling if r["mode"] == "weak"}
    for job, (d, t) in weak.items():
        ax.plot(d, t, "o-", label=job)
    ax.set(xscale="log", yscale="log", xlabel="devices", ylabel="seconds (median)",
           title=f"Data parallel, weak scaling ({'/'.join(map(str, sorted(per_dev)))} "
                 "seqs / device; ideal: flat)")

    ax = axes[2]
    sharding = [r for r in sharding if r.get("mb") is not None]
    # one line per (workload, T): several lengths of a workload would otherwise mix
    by = defaultdict(list)
    for r in sharding:
        by[(r["workload"], r["T"])].append((r["D"], r["mb"]))
    for (name, t_len), pts in sorted(by.items()):
        d, mb = zip(*sorted(pts), strict=True)
        (line,) = ax.plot(d, mb, "o-", label=f"{name}, T = {t_len:.0e}")
        if d[0] == 1:
            ax.plot(d, [mb[0] / x for x in d], ":", color=line.get_color(), lw=1.2)
    ax.plot([], [], "k:", lw=1.2, label="ideal T / D (from 1 device)")
    ax.set(xscale="log", yscale="log", xlabel="devices", ylabel="MB per device (XLA)",
           title="Time sharding, memory per device")

    for ax in axes:
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"statseq scaling benchmarks, {machine}, {date}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scaling", default=str(RUNS / "scaling.json"))
    ap.add_argument("--sharding", default=str(RUNS / "time_sharding.json"))
    ap.add_argument("--out", default=str(HERE.parent / "docs" / "img" / "scaling.png"))
    ap.add_argument("--machine", default="2-core CPU, virtual devices")
    ap.add_argument("--date", default="", help="default: the JSON files' date (UTC)")
    ap.add_argument("--dpi", type=int, default=100)
    ap.add_argument("--cores", type=int, default=2,
                    help="physical cores behind the virtual devices (0: no ceiling line)")
    args = ap.parse_args()
    paths = [Path(args.scaling), Path(args.sharding)]
    date = args.date or dt.datetime.fromtimestamp(
        max(p.stat().st_mtime for p in paths), dt.UTC).strftime("%Y-%m-%d")
    out = plot(load(paths[0]), load(paths[1]), Path(args.out), args.machine, date, args.dpi,
               args.cores)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
