"""Timing and reporting helpers shared by the benchmark scripts in this folder."""

from __future__ import annotations

import gc
import random
import statistics
import time
from pathlib import Path

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class CompileClock:
    """Sums JAX's trace/lower/compile duration events while active."""

    def __init__(self):
        import jax.monitoring

        self.active = False
        self.total = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **_):
        if self.active and event in _COMPILE_EVENTS:
            self.total += duration

    def __enter__(self):
        self.total, self.active = 0.0, True
        return self

    def __exit__(self, *exc):
        self.active = False


class Timer:
    """First-call and steady-state timing; steady state is measured in interleaved rounds.

    The machine this runs on may be shared, so steady-state repeats are interleaved: each
    round times every implementation once (in an order shuffled per round, seeded), and
    rounds continue until ``min_rounds`` are done and ``budget_s`` has passed (or
    ``max_rounds``). A burst of outside load then hits all implementations alike, and
    ratios can be taken per round.
    Compilation during the rounds is recorded (``recompiled``, ``recompile_s``), so a timed
    function that retraces is flagged rather than silently timed with its compile time.
    """

    def __init__(self, min_rounds: int, max_rounds: int = 200, budget_s: float = 1.0):
        self.min_rounds, self.max_rounds, self.budget_s = min_rounds, max_rounds, budget_s
        self.clock = CompileClock()

    @staticmethod
    def _block(x):
        import jax

        return jax.block_until_ready(x)

    def first(self, fn):
        """(value, wall seconds, compile seconds) of one call."""
        gc.collect()
        with self.clock:
            t0 = time.perf_counter()
            value = self._block(fn())
            wall = time.perf_counter() - t0
        return value, wall, self.clock.total

    def rounds(self, fns: dict, min_rounds=None, budget_s=None, max_rounds=None):
        """Interleaved repeats of ``fns`` (name -> zero-argument callable).

        Returns name -> dict(times=[...] (one per round), median, min, n, recompiled
        (whether any round compiled), recompile_s (compile seconds per round)).
        """
        min_rounds = self.min_rounds if min_rounds is None else min_rounds
        budget_s = self.budget_s if budget_s is None else budget_s
        max_rounds = self.max_rounds if max_rounds is None else max_rounds
        names = list(fns)
        times = {n: [] for n in names}
        recompiled = dict.fromkeys(names, 0.0)
        gc.collect()
        gc.disable()
        try:
            with self.clock:
                start, r = time.perf_counter(), 0
                while r < min_rounds or (
                    r < max_rounds and time.perf_counter() - start < budget_s
                ):
                    # a fresh order each round (seeded): with a fixed rotation the same
                    # row always ran right after the slowest one (e.g. pykalman's
                    # 0.2 s numpy call), and paid its cache and thread wake-up cost
                    order = list(names)
                    random.Random(r).shuffle(order)
                    for name in order:
                        before = self.clock.total
                        t0 = time.perf_counter()
                        self._block(fns[name]())
                        times[name].append(time.perf_counter() - t0)
                        recompiled[name] += self.clock.total - before
                    r += 1
        finally:
            gc.enable()
        return {
            n: dict(times=times[n], median=statistics.median(times[n]), min=min(times[n]),
                    n=len(times[n]), recompiled=recompiled[n] > 0,
                    recompile_s=recompiled[n] / len(times[n]))
            for n in names
        }


def paired_ratio(num, den):
    """Median over rounds of num_time / den_time (same round: same outside load)."""
    return statistics.median(a / b for a, b in zip(num["times"], den["times"], strict=True))


def fmt_s(x):
    if x is None:
        return "–"
    if x >= 1.0:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.0f} µs"


def fmt_rel(r):
    """statseq relative to a peer from r = peer time / statseq time: "3.1× faster"."""
    return f"{r:.3g}× faster" if r >= 1 else f"{1 / r:.3g}× slower"


def md_table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def load_average():
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def render(info, command, started, elapsed, sections):
    lines = [
        f"Command: `{command}`  ",
        f"Date: {started:%Y-%m-%d %H:%M %Z} (total run time {elapsed:.0f} s)",
        "",
        md_table(["machine", ""], [[k, v] for k, v in info.items()]),
        "",
    ]
    for title, intro, table in sections:
        lines += [f"### {title}", "", intro, "", table, ""]
    return "\n".join(lines)


RATIOS_DIR = Path(__file__).resolve().parent / "ratios"


def record_ratios(family, ratios, *, command, out_dir=None):
    """Write this run's ratios to ``benchmarks/ratios/<family>.json`` for the regression check.

    Args:
        family: a file stem such as ``"hmm"``, ``"kalman"``, ``"rnn"``, ``"scan"``.
        ratios: ``{"workload | statseq path / reference": ratio}`` where every ratio is
            **statseq's time divided by the reference's time** (lower is better), e.g.
            ``{"filter K=2 T=1e6 f64 | jitted core / numba": 1.31}``. Keys must be stable
            from run to run: `benchmarks/check_regression.py` matches them by name.
        command: the command line that produced them (recorded with the numbers).
        out_dir: where to write (default ``benchmarks/ratios``).

    The file also records the machine, the load average and the date, so a regression can
    be told from a noisy run.
    """
    import json
    import os
    import platform
    from datetime import UTC, datetime

    import jax

    out = Path(out_dir) if out_dir is not None else RATIOS_DIR
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "family": family,
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "backend": jax.default_backend(),
            "jax": jax.__version__,
            "python": platform.python_version(),
            "load_average": load_average(),
        },
        "ratios": {k: float(v) for k, v in sorted(ratios.items())},
    }
    path = out / f"{family}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def load_module_at(commit, relpath, name):
    """The file ``relpath`` of this repository at ``commit`` (``git show``), imported as a
    separate module called ``name``, for a "before" row timed in the same rounds as the
    current code; ``None`` outside a git checkout or if the commit is unknown."""
    import importlib.util
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    try:
        src = subprocess.run(["git", "show", f"{commit}:{relpath}"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
