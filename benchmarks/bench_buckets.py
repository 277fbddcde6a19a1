"""Cost of length buckets: padded against unpadded calls at the worst padding (~25%).

Each length ``T = 2^k + 1`` is padded to ``1.25 * 2^k`` (the largest ratio on the ladder).
For a local level model and a 2-state Poisson HMM it times ``log_prob`` and ``filter``
with ``set_length_buckets("never")`` (exact program) and ``"always"`` (padded program),
after a warm-up call (compilation excluded), and prints the ratio padded / unpadded.

    python benchmarks/bench_buckets.py [--repeats 30] [--lengths 8193] [--cases "local level"]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("STATSEQ_NO_COMPILATION_CACHE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

import statseq as ss  # noqa: E402


def _time(fn, repeats, stat=np.median):
    jax.block_until_ready(fn())  # compile
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - start)
    return float(stat(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--lengths", type=int, nargs="*", default=[17, 129, 1025, 8193])
    parser.add_argument("--cases", default="", help="run only cases whose name contains this")
    parser.add_argument("--kernel", action="store_true",
                        help="time only the compiled filter program (`run_prepared` on data "
                             "prepared once), without the Python-side validation")
    parser.add_argument("--stat", choices=("median", "min"), default="median",
                        help="min is the steadier statistic on a loaded machine")
    args = parser.parse_args()
    stat = getattr(np, args.stat)
    rng = np.random.default_rng(0)
    level, hmm = ss.LocalLevel(), ss.PoissonHMM(num_states=2)
    hp = hmm.initialize(rng.poisson(3.0, 100), key=jax.random.key(0))
    cases = {
        "local level log_prob": lambda y, c: ss.log_prob(level, level.default_params(), y),
        "local level filter": lambda y, c: ss.filter(level, level.default_params(), y),
        "local level forecast": lambda y, c: ss.forecast(
            level, level.default_params(), y, num_steps=4, num_samples=1,
            key=jax.random.key(0)).samples,
        "poisson hmm log_prob": lambda y, c: ss.log_prob(hmm, hp, c),
        "poisson hmm filter": lambda y, c: ss.filter(hmm, hp, c),
        "poisson hmm smoother": lambda y, c: hmm.smoother(hp, c),
    }
    if args.kernel:
        from statseq.core.recurrence import run_prepared
        from statseq.core.validation import prepare_data

        def kernel(model, params, need_final):
            def fn(y, c):
                data = prepared.setdefault((ss.core.buckets._state["mode"], len(y)),
                                           prepare_data(model, y, bucket=True))
                return run_prepared(model, params, data, need_final=need_final)[:2]
            return fn

        prepared = {}
        cases = {"local level log_prob (kernel)": kernel(level, level.default_params(), False),
                 "local level filter (kernel)": kernel(level, level.default_params(), True)}
    print(f"{'case':24s} {'T':>6s} {'bucket':>6s} {'exact ms':>9s} {'padded ms':>9s} {'ratio':>6s}")
    for t in args.lengths:
        y, c = rng.normal(size=t).cumsum(), rng.poisson(3.0, size=t)
        for name, fn in cases.items():
            if args.cases not in name:
                continue
            ss.set_length_buckets("never")
            exact = _time(lambda: fn(y, c), args.repeats, stat)  # noqa: B023
            ss.set_length_buckets("always")
            padded = _time(lambda: fn(y, c), args.repeats, stat)  # noqa: B023
            print(f"{name:24s} {t:6d} {ss.bucket_length(t):6d} {exact * 1e3:9.3f} "
                  f"{padded * 1e3:9.3f} {padded / exact:6.2f}")
    ss.set_length_buckets("auto")


if __name__ == "__main__":
    main()
