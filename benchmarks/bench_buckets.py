"""Cost of length buckets: padded against unpadded calls at the worst padding (~25%).

Each length ``T = 2^k + 1`` is padded to ``1.25 * 2^k`` (the largest ratio on the ladder).
For a local level model and a 2-state Poisson HMM it times ``log_prob`` and ``filter``
with ``set_length_buckets("never")`` (exact program) and ``"always"`` (padded program),
after a warm-up call (compilation excluded), and prints the ratio padded / unpadded.

    python benchmarks/bench_buckets.py [--repeats 30]
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


def _time(fn, repeats):
    jax.block_until_ready(fn())  # compile
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - start)
    return float(np.median(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--lengths", type=int, nargs="*", default=[17, 129, 1025, 8193])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    level, hmm = ss.LocalLevel(), ss.PoissonHMM(num_states=2)
    hp = hmm.initialize(rng.poisson(3.0, 100), key=jax.random.key(0))
    cases = {
        "local level log_prob": lambda y, c: ss.log_prob(level, level.default_params(), y),
        "local level filter": lambda y, c: ss.filter(level, level.default_params(), y),
        "poisson hmm log_prob": lambda y, c: ss.log_prob(hmm, hp, c),
        "poisson hmm filter": lambda y, c: ss.filter(hmm, hp, c),
        "poisson hmm smoother": lambda y, c: hmm.smoother(hp, c),
    }
    print(f"{'case':24s} {'T':>6s} {'bucket':>6s} {'exact ms':>9s} {'padded ms':>9s} {'ratio':>6s}")
    for t in args.lengths:
        y, c = rng.normal(size=t).cumsum(), rng.poisson(3.0, size=t)
        for name, fn in cases.items():
            ss.set_length_buckets("never")
            exact = _time(lambda: fn(y, c), args.repeats)  # noqa: B023
            ss.set_length_buckets("always")
            padded = _time(lambda: fn(y, c), args.repeats)  # noqa: B023
            print(f"{name:24s} {t:6d} {ss.bucket_length(t):6d} {exact * 1e3:9.3f} "
                  f"{padded * 1e3:9.3f} {padded / exact:6.2f}")
    ss.set_length_buckets("auto")


if __name__ == "__main__":
    main()
