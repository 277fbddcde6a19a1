"""Where DEER would beat the sequential scan, from a `bench_deer.py` run's measured work.

Reads the JSON that ``bench_deer.py --out`` writes and, for every (cell, H, mode) measured
at more than one length, fits the two costs as straight lines in ``T``:

* the sequential scan: ``t_seq(T) = a_s + b_s T`` (one step after another);
* one Newton iteration of DEER (or quasi-DEER): ``t_it(T) = a_i + b_i T`` (the run's time
  divided by its iterations: a dense associative scan over ``T`` Jacobians of ``H' x H'``,
  ``H' = H`` for the GRU and ``2H`` for the LSTM's ``(h, c)``);

and the iterations ``k`` as measured at the longest length (a contractive cell needs a
few, growing at most like ``log T``). DEER wins where ``k t_it(T) < t_seq(T)``. Both costs
are linear in ``T`` on a machine whose cores are already busy (an associative scan saves
depth, not work: it does about twice the work of a sequential pass), so the ratio tends
to the slope ratio ``k b_i / b_s``, and there is a crossover at a finite ``T`` (reported,
from the fitted lines) only if that is below 1. The table also reports the per-step costs
at the longest length and ``W = k t_it / t_seq`` there: the number of idle lanes (cores,
SIMD units, GPU threads) one Newton iteration's work must be spread over, at perfect
efficiency, for DEER to break even. A sequential step does ``O(H'^2)`` work (one
matrix-vector product) and a dense DEER step ``O(H'^3)`` (Jacobian products in the scan),
so ``W`` grows like ``H'``.

Usage:
    python benchmarks/deer_crossover.py deer_cpu.json [--record]

``--record`` writes the same-run ratios (DEER's time over the sequential scan's, lower is
better) with `_harness.record_ratios("deer", ...)`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def fit_line(points):
    """Least-squares ``(a, b)`` of ``y = a + b x`` through ``points`` (at least two)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def crossover(rows):
    """One dict per (cell, H, mode, method) measured at two lengths or more."""
    ok = [r for r in rows if r.get("status") == "ok" and not r.get("extrapolated")]
    groups = {}
    for r in ok:
        groups.setdefault((r["cell"], r["H"], r["B"], r["mode"]), []).append(r)
    out = []
    for (cell, hid, batch, mode), rs in sorted(groups.items()):
        seq = {r["T"]: r["run_s"] for r in rs if r["method"] == "sequential"}
        for method in sorted({r["method"] for r in rs} - {"sequential"}):
            its = {r["T"]: (r["run_s"] / max(r["iterations"], 1), r["iterations"],
                            r["run_s"]) for r in rs if r["method"] == method
                   and r.get("iterations")}
            lengths = sorted(set(seq) & set(its))
            if len(lengths) < 2:
                continue
            top = lengths[-1]
            k = its[top][1]
            a_s, b_s = fit_line([(t, seq[t]) for t in lengths])
            a_i, b_i = fit_line([(t, its[t][0]) for t in lengths])
            # k (a_i + b_i T) < a_s + b_s T: a crossover at finite T only if b_s > k b_i
            if b_s > k * b_i:
                cross = max((k * a_i - a_s) / (b_s - k * b_i), 0.0)
            else:
                cross = None
            out.append(dict(
                cell=cell, H=hid, B=batch, mode=mode, method=method,
                state=2 * hid if cell == "lstm" else hid, lengths=lengths,
                ratio={t: its[t][2] / seq[t] for t in lengths},
                iterations={t: its[t][1] for t in lengths},
                seq_per_step=seq[top] / top, iter_per_step=its[top][0] / top,
                lanes_to_break_even=k * its[top][0] / seq[top],
                slope_ratio=k * b_i / b_s if b_s > 0 else float("inf"),
                crossover_t=cross))
    return out


def fmt_s(x):
    return f"{x * 1e9:.0f} ns" if x < 1e-6 else f"{x * 1e6:.2f} µs"


def table(res):
    head = ["cell", "H", "H'", "mode", "method", "iters (by T)", "DEER / seq (by T)",
            "seq per step", "1 iter per step", "W = iters × iter / seq",
            "slope ratio (fit)", "crossover T here"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in res:
        lines.append("| " + " | ".join(str(v) for v in [
            c["cell"], c["H"], c["state"], c["mode"], c["method"],
            ", ".join(f"{c['iterations'][t]}" for t in c["lengths"]),
            ", ".join(f"{c['ratio'][t]:.3g}" for t in c["lengths"]),
            fmt_s(c["seq_per_step"]), fmt_s(c["iter_per_step"]),
            f"{c['lanes_to_break_even']:.3g}", f"{c['slope_ratio']:.3g}",
            "none" if c["crossover_t"] is None else f"{c['crossover_t']:.3g}"]) + " |")
    return "\n".join(lines)


def ratios(rows):
    """``{"<cell> H=<H> T=<T> <mode> | <method> / sequential": time ratio}``."""
    out = {}
    seq = {(r["cell"], r["H"], r["T"], r["B"], r["mode"]): r["run_s"] for r in rows
           if r["method"] == "sequential" and r.get("status") == "ok"
           and not r.get("extrapolated")}
    for r in rows:
        key = (r["cell"], r["H"], r["T"], r["B"], r["mode"])
        if r["method"] != "sequential" and r.get("status") == "ok" and key in seq:
            name = (f"{r['cell']} H={r['H']} T={r['T']:.0e} B={r['B']} {r['mode']}"
                    f" | {r['method']} / sequential").replace("e+0", "e")
            out[name] = r["run_s"] / seq[key]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("--record", action="store_true",
                    help="write the ratios to benchmarks/ratios/deer.json")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    print(table(crossover(data["rows"])))
    if args.record:
        import _harness

        rat = ratios(data["rows"])
        _harness.record_ratios("deer", rat, command=data["info"]["command"])
        print(f"\nrecorded {len(rat)} ratios", file=sys.stderr)


if __name__ == "__main__":
    main()
