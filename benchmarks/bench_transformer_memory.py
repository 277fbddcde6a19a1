"""XLA's memory estimate of `ss.Transformer`'s whole-sequence path, cache form vs ``T x T`` form.

From the initial (empty) caches, the parallel mode now scores ``T x T`` (the new keys only,
`statseq.inference.attention.attention_parallel_from_start`) instead of ``T x (max_len + T)``
(the cache's ``max_len`` masked slots as well, `attention_parallel`, still used when a
sequence continues from another cache). This script compiles, without running, the
forward (``log_prob``) and the training step (``jax.value_and_grad`` of the summed
log-likelihood) of both forms with ``jax.jit(f).lower(...).compile()`` and prints
``memory_analysis()`` (temporary buffers: XLA's estimate of the program's working memory).

Setting: width 32, 2 layers, 2 heads, RoPE, MLP ratio 4, Gaussian head, ``max_len = T``
(full causal attention), one sequence, float32.

Usage:
    python benchmarks/bench_transformer_memory.py                 # T = 2000
    python benchmarks/bench_transformer_memory.py --lengths 500,2000
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


def programs(t_len: int):
    model = ss.Transformer(hidden_dim=32, num_layers=2, num_heads=2, max_len=t_len,
                           mlp_ratio=4, mode="parallel")
    y = jnp.asarray(np.sin(np.arange(t_len) / 7.0)[None], jnp.float32)
    params = model.initialize(np.asarray(y[0]), key=jax.random.key(0))
    u = jnp.zeros((1, t_len, 0), jnp.float32)
    head, bb = model.head, model.backbone

    def cache_form(p, y, u):  # the former path: scan_time_major from the broadcast caches
        y_tm = jnp.swapaxes(y, 0, 1)
        enc = jax.vmap(jax.vmap(head.encode))(y_tm, jnp.ones(y_tm.shape, bool))
        prev = jnp.concatenate([jnp.zeros_like(enc[:1]), enc[:-1]], axis=0)
        xs = jnp.concatenate([prev, jnp.swapaxes(u, 0, 1)], axis=-1)
        state0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (1,) + a.shape),
                              bb.initial_state(p.backbone))
        _, hs = bb.scan_time_major(p.backbone, state0, xs)
        return jnp.sum(head.distribution(p.head, hs).log_prob(y_tm))

    def square_form(p, y, u):  # the path of log_prob / fit_sgd now
        return jnp.sum(model.complete_data_log_probs_batch(p, y, u)[0])

    out = {}
    for name, f in (("cache T x (max_len + T)", cache_form), ("T x T", square_form)):
        for kind, g in (("forward", f), ("forward+backward", jax.value_and_grad(f))):
            start = time.perf_counter()
            compiled = jax.jit(g).lower(params, y, u).compile()
            mem = compiled.memory_analysis()
            out[(name, kind)] = dict(
                temp_bytes=int(mem.temp_size_in_bytes),
                argument_bytes=int(mem.argument_size_in_bytes),
                output_bytes=int(mem.output_size_in_bytes),
                compile_s=round(time.perf_counter() - start, 1))
    # the two forms give the same number
    val = [float(jax.jit(f)(params, y, u)) for f in (cache_form, square_form)]
    return out, val


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="2000")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    print(f"# {platform.machine()} {jax.default_backend()} jax {jax.__version__}")
    for t_len in [int(s) for s in args.lengths.split(",")]:
        out, val = programs(t_len)
        print(f"T = {t_len}: log-lik cache form {val[0]:.6f}, T x T form {val[1]:.6f}")
        for (name, kind), r in out.items():
            print(f"  {name:24s} {kind:17s} temp {r['temp_bytes'] / 2**20:9.1f} MiB "
                  f"(args {r['argument_bytes'] / 2**20:.2f} MiB, compile {r['compile_s']} s)")
            rows.append(dict(T=t_len, form=name, program=kind, **r))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
