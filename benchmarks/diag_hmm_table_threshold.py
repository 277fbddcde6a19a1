#!/usr/bin/env python
"""Where the public HMM ``log_prob`` should filter the emission table rather than scan step by step.

    python benchmarks/diag_hmm_table_threshold.py            # K = 2, 4, 8, 16; T = 64 ... 1000
    python benchmarks/diag_hmm_table_threshold.py --quick

For each PoissonHMM (with and without one input driving the transitions), number of states
K and length T, the public ``ss.log_prob`` program is built twice in one process: once with
`HMMBase.filters_on_the_table` forced off (the step scan: `model.step` in the loop, which
for an input-driven model computes ``softmax(b + W u_t)`` each step) and once forced on
(`HMMBase.masked_data_filter`: the ``(T, K)`` emission table and the ``(T - 1, K, K)``
transition matrices made before the loop, then `statseq.inference.hmm.hmm_filter`). Both
programs (compiled ahead of time from the program a repeated public call dispatches, on
its arguments) are then timed in interleaved rounds (`_harness.Timer`); the values are compared first (1e-10 relative).
The ratio table / scan (median of per-round ratios; ratio of minima) is what
`statseq.models.hmm.base.TABLE_FILTER_MIN_STEPS` is chosen from. CPU only, float64; the
default bucket policy (lengths may be padded, so this also covers the padded path).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Timer, load_average, md_table, paired_ratio  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import statseq as ss
    from statseq.core import recurrence
    from statseq.models.hmm import base

    states = (2, 8) if args.quick else (2, 4, 8, 16)
    lengths = (64, 256, 1000) if args.quick else (64, 128, 256, 512, 1000)
    timer = Timer(min_rounds=20, budget_s=0.4)
    rows = []
    rule = base.HMMBase.filters_on_the_table
    try:
        for with_inputs in (True, False):
            for k in states:
                for t in lengths:
                    rng = np.random.default_rng(0)
                    y = rng.poisson(np.where(np.arange(t) % 200 < 100, 2.0, 8.0))
                    u = rng.normal(size=(t, 1)) if with_inputs else None
                    model = ss.PoissonHMM(num_states=k, input_dim=1 if with_inputs else 0)
                    params = model.initialize(y, key=jax.random.key(0), inputs=u)
                    runs, values = {}, {}
                    for name, on in (("scan", False), ("table", True)):
                        base.HMMBase.filters_on_the_table = lambda self, n, on=on: on
                        jax.clear_caches()
                        recurrence._bound.cache_clear()
                        recurrence._REPEATS.clear()
                        values[name] = float(ss.log_prob(model, params, y, inputs=u))
                        run = next(e.run for key, e in recurrence._REPEATS.items()
                                   if key[0] == "log_prob")
                        # compiled ahead of time: the next `clear_caches` cannot retrace it
                        compiled = run.program.jitted.lower(*run.arrays).compile()
                        runs[name] = (lambda c=compiled, a=run.arrays: c(*a))
                    np.testing.assert_allclose(values["table"], values["scan"], rtol=1e-10)
                    res = timer.rounds(runs)
                    assert not any(r["recompiled"] for r in res.values())
                    rows.append(["inputs" if with_inputs else "none", k, t,
                                 f"{res['scan']['min'] * 1e6:.0f}",
                                 f"{res['table']['min'] * 1e6:.0f}",
                                 f"{paired_ratio(res['table'], res['scan']):.2f}",
                                 f"{res['table']['min'] / res['scan']['min']:.2f}"])
                    print(" | ".join(map(str, rows[-1])), flush=True)
    finally:
        base.HMMBase.filters_on_the_table = rule
    print()
    print(md_table(["inputs", "K", "T", "scan min (us)", "table min (us)",
                    "table / scan (paired median)", "ratio of minima"], rows))
    print(f"\nload average {load_average()}; default now: "
          f"TABLE_FILTER_MIN_STEPS = {base.TABLE_FILTER_MIN_STEPS}")


if __name__ == "__main__":
    main()
