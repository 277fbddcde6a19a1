"""Training step of `ss.Transformer` against flax's attention layer, the LSTM and linear attention.

One **training step** (forward and backward) of

    loss(θ) = -mean_b sum_t log p_θ(y_{b,t} | y_{b,<t}),   jax.value_and_grad(loss)(θ)

on the whole-sequence path that `statseq.fit_sgd` differentiates on complete data
(`complete_data_log_probs_batch`), for a batch of ``B`` AR(1) series of length ``T``, a
Gaussian head, width ``d = 32``, 2 layers, float32, XLA optimized (this script does not
use the tests' -O0), for:

* ``transformer``: `ss.Transformer` (2 heads, RoPE, MLP ratio 4, ``max_len = T``: full
  causal attention), ``mode="parallel"`` (the masked ``T x (max_len + T)`` scores: the
  cache's ``max_len`` slots are masked when starting from an empty cache, so twice the
  columns of the plain ``T x T`` form) and ``mode="recurrent"`` (a scan of the KV-cache
  step, ``O(T max_len)``) where it fits the time cap;
* ``flax_mha``: the same network without positional encoding (flax's layer takes no
  RoPE) and with each attention sub-block computed by
  ``flax.linen.MultiHeadDotProductAttention(use_bias=False)`` under
  ``flax.linen.make_causal_mask`` (``T x T`` scores), the same parameters and MLP;
* ``transformer_nopos``: `ss.Transformer` with ``positional=None``, parallel, the exact
  counterpart of ``flax_mha``;
* ``lstm``: `ss.LSTM` (hidden 32, 2 layers), its default whole-sequence evaluation;
* ``linear_attention``: `ss.LinearAttention` (2 heads), its default mode.

Compile time (``jax.jit(f).lower(...).compile()``) is reported apart from the step time
(median of ``--repeats`` calls after one warm-up, each ended by ``block_until_ready``;
one call after the warm-up when the warm-up took 5 s, the warm-up call itself when it
took 20 s: the program is compiled ahead, so it carries no compile time).
``T = 10^4`` runs batch 1 (``--batch-long``) for every model: the quadratic rows'
score matrices would not fit otherwise; cases whose estimated time exceeds
``--max-step-s`` (extrapolated from the previous length, quadratically for the attention
rows) are skipped with a note.

Usage:
    python benchmarks/bench_transformer.py                     # T = 100, 1000, 10000
    python benchmarks/bench_transformer.py --lengths 100,1000 --out tf.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import statseq as ss  # noqa: E402
from statseq.models.neural.transformer import Transformer, TransformerBackbone  # noqa: E402

WIDTH, HEADS, LAYERS = 32, 2, 2
QUADRATIC = ("transformer", "transformer_nopos", "flax_mha")


@dataclasses.dataclass(frozen=True)
class FlaxMHABackbone(TransformerBackbone):
    """`TransformerBackbone` whose attention sub-block is flax's layer (whole sequences)."""

    def layer_scan(self, p, state, vs):
        import flax.linen as nn

        t_len, d, h = vs.shape[0], self.hidden_dim, self.num_heads
        mha = nn.MultiHeadDotProductAttention(num_heads=h, qkv_features=d, out_features=d,
                                              use_bias=False, dtype=vs.dtype,
                                              param_dtype=vs.dtype)
        w = {"params": {"query": {"kernel": p.w_q.reshape(d, h, d // h)},
                        "key": {"kernel": p.w_k.reshape(d, h, d // h)},
                        "value": {"kernel": p.w_v.reshape(d, h, d // h)},
                        "out": {"kernel": p.w_o.reshape(h, d // h, d)}}}
        mask = nn.make_causal_mask(jnp.ones((1, t_len)))
        return state, mha.apply(w, vs[None], mask=mask)[0]


@dataclasses.dataclass(frozen=True)
class FlaxMHATransformer(Transformer):
    @property
    def backbone(self):
        return FlaxMHABackbone(
            input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, num_heads=self.num_heads, max_len=self.max_len,
            positional=self.positional, mlp_ratio=self.mlp_ratio, mode="parallel")


def make_model(name, t_len):
    common = dict(hidden_dim=WIDTH, num_layers=LAYERS)
    if name == "transformer":
        return Transformer(num_heads=HEADS, max_len=t_len, mode="parallel", **common)
    if name == "transformer_recurrent":
        return Transformer(num_heads=HEADS, max_len=t_len, mode="recurrent", **common)
    if name == "transformer_nopos":
        return Transformer(num_heads=HEADS, max_len=t_len, mode="parallel", positional=None,
                           **common)
    if name == "flax_mha":
        return FlaxMHATransformer(num_heads=HEADS, max_len=t_len, positional=None, **common)
    if name == "lstm":
        return ss.LSTM(**common)
    if name == "linear_attention":
        return ss.LinearAttention(num_heads=HEADS, **common)
    raise ValueError(name)


def series(batch, t_len, seed=0):
    rng = np.random.default_rng(seed)
    y = np.zeros((batch, t_len))
    for t in range(1, t_len):
        y[:, t] = 0.9 * y[:, t - 1] + rng.normal(size=batch)
    return jnp.asarray(y, jnp.float32)


def run_case(name, t_len, batch, repeats):
    model = make_model(name, t_len)
    y = series(batch, t_len)
    params = model.initialize(np.asarray(y[0]), key=jax.random.key(0))
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    inputs = jnp.zeros((batch, t_len, 0), jnp.float32)

    def loss(p):
        return -jnp.mean(jnp.sum(model.complete_data_log_probs_batch(p, y, inputs)[0], 1))

    t0 = time.perf_counter()
    compiled = jax.jit(jax.value_and_grad(loss)).lower(params).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    value, _ = jax.block_until_ready(compiled(params))
    first_s = time.perf_counter() - t0
    times = [first_s] if first_s >= 20.0 else []  # already compiled: the first call counts
    for _ in range(0 if times else repeats if first_s < 5.0 else 1):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(params))
        times.append(time.perf_counter() - t0)
    return dict(model=name, T=t_len, batch=batch, compile_s=round(compile_s, 3),
                step_s=statistics.median(times), runs=len(times),
                loss_per_step=float(value) / t_len)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="100,1000,10000")
    parser.add_argument("--models", default="transformer,transformer_recurrent,"
                        "transformer_nopos,flax_mha,lstm,linear_attention")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--batch-long", type=int, default=1, help="batch at T >= 10^4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-step-s", type=float, default=60.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    lengths = [int(t) for t in args.lengths.split(",")]
    names = args.models.split(",")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"jax {jax.__version__} on {jax.default_backend()}, load {os.getloadavg()[0]:.1f}",
          flush=True)
    rows, last = [], {}
    for t_len in lengths:
        batch = args.batch_long if t_len >= 10_000 else args.batch
        for name in names:
            if name in last:
                prev = last[name]
                power = 2 if name in QUADRATIC else 1
                scale = (t_len / prev["T"]) ** power * batch / prev["batch"]
                if name == "transformer_recurrent":
                    scale = (t_len / prev["T"]) ** 2 * batch / prev["batch"]  # max_len = T
                est = prev["step_s"] * scale
                if est > args.max_step_s:
                    row = dict(model=name, T=t_len, batch=batch, skipped=f"est {est:.0f} s")
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    continue
            try:
                row = run_case(name, t_len, batch, args.repeats)
            except Exception as exc:  # noqa: BLE001 - out of memory etc.: a row says so
                row = dict(model=name, T=t_len, batch=batch, error=type(exc).__name__)
            else:
                last[name] = row
            row["load"] = round(os.getloadavg()[0], 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
            if args.out:
                Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
