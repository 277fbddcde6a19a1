"""`ss.EncoderDecoder` training step: the whole-sequence path against the per-step filter.

On complete data, ``log_prob`` and ``fit_sgd`` use
`EncoderDecoder.complete_data_log_probs_batch` (one encoder scan over the context, one
batched decoder step for the encoding-mode predictives, one decoder scan over the target)
instead of the per-step filter (`update` computes an encoder and a decoder step and keeps
one, `predict` a further decoder step). This script times ``jax.value_and_grad`` of the
summed log-likelihood of a batch of training windows (`EncoderDecoder.windows`) both ways
(``run_filter(complete=True)`` vs ``complete=False``), compiled, median of repeats.

Setting: GRU encoder and decoder (width 32), Gaussian head, ``context_length = 48``,
horizon 12, 64 windows, float32.

Usage:
    python benchmarks/bench_seq2seq.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import statseq as ss  # noqa: E402
from statseq.core.recurrence import run_filter  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=32)
    args = parser.parse_args()
    model = ss.EncoderDecoder(encoder=ss.GRU(hidden_dim=args.hidden), context_length=48)
    rng = np.random.default_rng(0)
    y = np.cumsum(rng.normal(size=48 + 12 + 63 * 4)) * 0.1
    wins, _, _ = model.windows(y, horizon=12, stride=4)
    params = model.initialize(y, key=jax.random.key(0))
    ys = jnp.asarray(wins, jnp.float32)
    mask = jnp.ones(ys.shape, bool)
    u = jnp.zeros(ys.shape + (0,), jnp.float32)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    out = {"device": jax.devices()[0].device_kind, "platform": platform.platform(),
           "windows": list(ys.shape), "hidden": args.hidden}
    for name, complete in (("whole_sequence", True), ("per_step_filter", False)):
        step = jax.jit(jax.value_and_grad(
            lambda p, complete=complete: jnp.sum(run_filter(model, p, ys, mask, u,
                                                            complete=complete)[0])))
        t0 = time.perf_counter()
        jax.block_until_ready(step(params))
        compile_s = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(step(params))
            times.append(time.perf_counter() - t0)
        out[name] = {"compile_s": round(compile_s, 2),
                     "step_ms_median": round(1e3 * float(np.median(times)), 2)}
    out["speedup"] = round(out["per_step_filter"]["step_ms_median"]
                           / out["whole_sequence"]["step_ms_median"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
