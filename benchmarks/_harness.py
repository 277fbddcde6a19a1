"""Timing and reporting helpers shared by the benchmark scripts in this folder."""

from __future__ import annotations

import statistics
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
