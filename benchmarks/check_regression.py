"""Benchmark regression check: compare the latest ratios with the committed baseline.

Every benchmark writes its ratios (statseq's time / a reference's time, lower is better)
to ``benchmarks/ratios/<family>.json`` through `_harness.record_ratios`. This script
compares each ratio with the same key in ``benchmarks/ratios/baseline/<family>.json``:

* a ratio **worse by more than 25 %** (``now > 1.25 * baseline``; ``--threshold``) fails,
  as does a ratio that is not a finite positive number;
* a key in the baseline but not in this run is listed as *missing* (not a failure: a
  ``--quick`` run measures fewer cases);
* a key in this run but not in the baseline is listed as *new*;
* a family without a baseline file is listed, not checked.

It prints a table of every compared ratio and, when anything failed, a loud banner and the
failing rows again, and exits with status 1 (0 otherwise). It runs outside the test suite
(timings are never asserted in tests); ``tests/test_benchmark_check.py`` tests its logic.

Usage (from the repository root)::

    .venv/bin/python benchmarks/check_regression.py                    # check every family
    .venv/bin/python benchmarks/check_regression.py --family hmm       # one family
    .venv/bin/python benchmarks/check_regression.py --update-baseline  # accept current ratios

``--update-baseline`` copies the current files (all, or those of ``--family``) into the
baseline folder; commit them together with the change that moved the numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

RATIOS_DIR = Path(__file__).resolve().parent / "ratios"
THRESHOLD = 0.25


@dataclass(frozen=True)
class Row:
    """One ratio's comparison. ``status``: ok, better, REGRESSION, INVALID, new, missing."""

    family: str
    key: str
    baseline: float | None
    current: float | None
    status: str

    @property
    def change(self) -> float | None:
        """current / baseline - 1 (positive: slower than the baseline)."""
        if self.baseline is None or self.current is None or not self.baseline > 0:
            return None
        return self.current / self.baseline - 1.0

    @property
    def failed(self) -> bool:
        return self.status in ("REGRESSION", "INVALID")


def _valid(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def compare(family: str, current: dict, baseline: dict, threshold: float = THRESHOLD) -> list[Row]:
    """Compare one family's ratios (``{key: ratio}``) with its baseline's.

    Args:
        family: the family's name (for the rows).
        current: this run's ratios.
        baseline: the baseline's ratios.
        threshold: the allowed relative worsening (0.25: a ratio may grow by 25 %).

    Returns:
        One `Row` per key of either mapping, current keys first (in sorted order).
    """
    if not (isinstance(threshold, int | float) and threshold >= 0):
        raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
    rows = []
    for key in sorted(current):
        now = current[key]
        if key not in baseline:
            rows.append(Row(family, key, None, now, "new" if _valid(now) else "INVALID"))
            continue
        base = baseline[key]
        if not _valid(now):
            status = "INVALID"
        elif not _valid(base):
            status = "new"  # nothing to compare with: report, do not fail
            base = None
        elif now > (1.0 + threshold) * base:
            status = "REGRESSION"
        elif now < base / (1.0 + threshold):
            status = "better"
        else:
            status = "ok"
        rows.append(Row(family, key, base, now, status))
    for key in sorted(set(baseline) - set(current)):
        rows.append(Row(family, key, baseline[key], None, "missing"))
    return rows


def _read_ratios(path: Path) -> dict:
    payload = json.loads(path.read_text())
    ratios = payload.get("ratios") if isinstance(payload, dict) else None
    if not isinstance(ratios, dict):
        raise ValueError(f"{path}: no 'ratios' mapping (write it with _harness.record_ratios)")
    return ratios


def check(ratios_dir: Path = RATIOS_DIR, baseline_dir: Path | None = None,
          threshold: float = THRESHOLD, families: list[str] | None = None):
    """Compare every ``<ratios_dir>/<family>.json`` with ``<baseline_dir>/<family>.json``.

    Returns:
        ``(rows, notes)``: the `Row` list of all families, and notes (families without a
        baseline, baselines without a current run).
    """
    ratios_dir = Path(ratios_dir)
    baseline_dir = Path(baseline_dir) if baseline_dir is not None else ratios_dir / "baseline"
    current = {p.stem: p for p in sorted(ratios_dir.glob("*.json"))}
    base = {p.stem: p for p in sorted(baseline_dir.glob("*.json"))} if baseline_dir.is_dir() \
        else {}
    if families:
        current = {f: p for f, p in current.items() if f in families}
        base = {f: p for f, p in base.items() if f in families}
    rows, notes = [], []
    for family, path in current.items():
        if family not in base:
            notes.append(f"{family}: no baseline ({baseline_dir / path.name}); not checked")
            continue
        rows += compare(family, _read_ratios(path), _read_ratios(base[family]), threshold)
    for family in sorted(set(base) - set(current)):
        notes.append(f"{family}: baseline present but no current ratios ({ratios_dir}/"
                     f"{family}.json); run its benchmark")
    return rows, notes


def update_baseline(ratios_dir: Path = RATIOS_DIR, baseline_dir: Path | None = None,
                    families: list[str] | None = None) -> list[Path]:
    """Copy the current ratio files into the baseline folder; returns the files written."""
    ratios_dir = Path(ratios_dir)
    baseline_dir = Path(baseline_dir) if baseline_dir is not None else ratios_dir / "baseline"
    baseline_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(ratios_dir.glob("*.json")):
        if families and path.stem not in families:
            continue
        _read_ratios(path)  # refuse to copy a malformed file
        written.append(Path(shutil.copy2(path, baseline_dir / path.name)))
    return written


def _fmt(x):
    return "–" if x is None else f"{x:.3g}"


def render(rows: list[Row], notes: list[str], threshold: float) -> str:
    lines = ["| family | ratio | baseline | now | change | status |", "|---|---|---|---|---|---|"]
    for r in rows:
        change = "–" if r.change is None else f"{r.change:+.0%}"
        status = f"**{r.status}**" if r.failed else r.status
        lines.append(f"| {r.family} | {r.key} | {_fmt(r.baseline)} | {_fmt(r.current)} | "
                     f"{change} | {status} |")
    lines += [""] + [f"note: {n}" for n in notes]
    failed = [r for r in rows if r.failed]
    counts = {s: sum(r.status == s for r in rows)
              for s in ("ok", "better", "new", "missing", "REGRESSION", "INVALID")}
    lines.append("summary: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if failed:
        bar = "!" * 78
        lines += ["", bar,
                  f"!!! BENCHMARK REGRESSION: {len(failed)} ratio(s) worse than the baseline by "
                  f"more than {threshold:.0%} (or invalid)", bar]
        for r in failed:
            change = "not a finite positive number" if r.change is None else f"{r.change:+.0%}"
            lines.append(f"!!! {r.family} | {r.key}: {_fmt(r.baseline)} -> {_fmt(r.current)} "
                         f"({change})")
        lines.append(bar)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratios-dir", type=Path, default=RATIOS_DIR)
    ap.add_argument("--baseline-dir", type=Path, default=None,
                    help="default: <ratios-dir>/baseline")
    ap.add_argument("--threshold", type=float, default=THRESHOLD,
                    help="allowed relative worsening (default 0.25)")
    ap.add_argument("--family", action="append", default=None,
                    help="only this family (repeatable)")
    ap.add_argument("--update-baseline", action="store_true",
                    help="copy the current ratios into the baseline and exit")
    args = ap.parse_args(argv)
    if args.update_baseline:
        written = update_baseline(args.ratios_dir, args.baseline_dir, args.family)
        for path in written:
            print(f"baseline updated: {path}")
        if not written:
            print("no current ratio files to copy", file=sys.stderr)
            return 1
        return 0
    rows, notes = check(args.ratios_dir, args.baseline_dir, args.threshold, args.family)
    print(render(rows, notes, args.threshold))
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
