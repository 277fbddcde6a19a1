"""Training step of every neural backbone, by evaluation mode and sequence length.

For every backbone installed in ``statseq`` (LSTM, GRU, Mamba, LRU, and those of issue 15 as
they land: S4D, S5, linear attention, AFT, RWKV, mLSTM, WaveNet; discovered by
``getattr(statseq, name)``) and every whole-sequence evaluation mode it accepts
(``mode=`` among ``recurrent``, ``scan``, ``convolution``, ``parallel``, ``chunked``, tried
one by one and kept when the model accepts it; ``parallel=False`` / ``True`` for Mamba and
LRU, reported as ``sequential`` / ``scan``; ``evaluation="sequential"`` for the LSTM and
GRU, whose default on a GPU would be DEER), plus a reference backbone of causal softmax
attention (quadratic in ``T``: flax's ``dot_product_attention`` in pre-norm residual
layers, or the same computation written in plain JAX when flax is missing; the row says
which), this times one **training step**:

    loss(θ) = -mean_b log p_θ(y_b),   (loss, grad) = jax.value_and_grad(loss)(θ)

for a batch of ``B = 32`` series of length ``T`` (a persistent AR(1) series), a Gaussian head,
width ``d = 64`` and 2 layers by default, through the compiled filter that
`statseq.fit_sgd` differentiates (`statseq.core.recurrence.run_filter` with
``complete=True``), in float32.

Reported per (backbone, mode, T):

* ``compile_s``: lowering + XLA compilation of the step (``jax.jit(f).lower(...).compile()``,
  persistent compilation cache off), separately from the run time;
* ``step_s``: steady-state seconds per step, the median of repeated calls (each ended by
  ``jax.block_until_ready``), the modes of one backbone timed in interleaved rounds
  (`benchmarks/_harness.Timer`), so that ``vs_best`` (this mode's time over the fastest
  mode's, per round, median) is a same-run paired ratio;
* ``program_bytes``: XLA's *estimate* of the compiled program's memory
  (``compiled.memory_analysis()``: temporaries + arguments + outputs; also each part), not a
  measurement; on a GPU also the device's running peak (``peak_bytes_in_use``);
* the crossover ``T`` between two modes of one backbone: where the paired ratio of their
  times crosses 1 between two measured lengths (interpolated linearly in
  ``log T``/``log ratio``), or "none in range".

Caps: a case whose program XLA estimates above ``--mem-cap-gb`` is compiled but not run;
a case whose time, extrapolated from the longest shorter length of this run (linearly in
``T``, or as ``T^2`` for the quadratic modes), exceeds
``--max-step-s`` is neither compiled nor run; the attention reference is not even compiled
when its ``B x heads x T^2`` score matrices alone exceed the memory cap, and no case is
compiled whose XLA estimate, extrapolated from a shorter length of this run like the time,
exceeds ``--compile-cap-gb`` (default 4x the memory cap): on a GPU, XLA's autotuner runs
candidate kernels on real buffers of a fusion's operand sizes *while compiling*, so the
first H100 run's AFT and RWKV parallel forms at ``T = 10^4`` failed in compilation (763 and
191 GiB allocations) before any estimate existed (`benchmarks/RESULTS.md`, "Modern
backbones on a GPU"). Each skip is a row
whose status says why; so is every case left when ``--budget-s`` has passed. A warm-up
call longer than ``--max-call-s`` is the one timing (``runs = 1``).

Usage (the table goes to stdout and, with ``--out``, a JSON of rows and the Markdown table
are written after every backbone at every length, so a cut-off run keeps its rows):
    python benchmarks/bench_backbones.py --lengths 100,1000,10000 --out bb_cpu.json
    python benchmarks/bench_backbones.py --backbones lstm,mamba,attention --lengths 100
    python benchmarks/bench_backbones.py --modes sequential,recurrent --lengths 100000 \
        --batch 1 --max-call-s 1 --out bb_long.json      # the linear-time modes only
    python benchmarks/bench_backbones.py --render bb_cpu.json bb_long.json --hide-skipped
    bash benchmarks/run_gpu_backbones.sh OUTDIR        # on a GPU, T up to 10^5
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import platform
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import Timer, load_average, md_table, paired_ratio  # noqa: E402

#: Backbone factories looked up in ``statseq`` (those missing are skipped), in table order.
CANDIDATES = ("LSTM", "GRU", "Mamba", "LRU", "S4D", "S5", "LinearAttention", "AFT",
              "RWKV", "mLSTM", "MLSTM", "WaveNet", "Transformer")
#: The issue's whole-sequence mode names (issue 15), tried in this order.
MODE_NAMES = ("recurrent", "scan", "convolution", "parallel", "chunked")
#: Modes whose cost grows like ``T^2`` (the extrapolation assumes at least that slope).
QUADRATIC_MODES = ("parallel", "softmax")
ATTENTION = "attention"  # the causal softmax attention reference (this file)
ATTENTION_HEADS = 4


# ---- the causal softmax attention reference ------------------------------------------
def _flax_attention():
    try:
        from flax.linen import dot_product_attention, make_causal_mask
    except Exception:  # noqa: BLE001 - flax missing or broken: plain JAX instead
        return None
    return dot_product_attention, make_causal_mask


def causal_softmax_attention(q, k, v):
    """Plain-JAX causal softmax attention, ``(T, H, e)`` each -> ``(T, H, e)``:
    ``out_t = sum_{s <= t} softmax_s(q_t . k_s / sqrt(e)) v_s`` (the fallback when flax is
    not installed; the same computation as flax's ``dot_product_attention``)."""
    num_t, e = q.shape[0], q.shape[-1]
    scores = jnp.einsum("thd,shd->hts", q / jnp.sqrt(jnp.asarray(e, q.dtype)), k)
    causal = jnp.tril(jnp.ones((num_t, num_t), bool))
    scores = jnp.where(causal, scores, jnp.finfo(q.dtype).min)
    return jnp.einsum("hts,shd->thd", jax.nn.softmax(scores, axis=-1), v)


def attention_impl() -> str:
    return "flax.linen.dot_product_attention" if _flax_attention() else "plain JAX"


def _attention_model_classes():
    """The reference backbone and model (built lazily: statseq is imported by main)."""
    from typing import NamedTuple

    from statseq.models.neural.residual import ResidualStack, ResidualStackModel, dense_init

    class AttentionLayerParams(NamedTuple):
        qkv: jax.Array  # (d, 3d)
        out: jax.Array  # (d, d)

    @dataclasses.dataclass(frozen=True)
    class SoftmaxAttentionBackbone(ResidualStack):
        """Pre-norm residual layers of multi-head causal softmax attention (whole
        sequences only: a benchmark reference, no generation step)."""

        num_heads: int = ATTENTION_HEADS

        def layer_param_shapes(self):
            d = self.hidden_dim
            return AttentionLayerParams((d, 3 * d), (d, d))

        def layer_init(self, key, dtype):
            d = self.hidden_dim
            k1, k2 = jax.random.split(key)
            return AttentionLayerParams(dense_init(k1, (d, 3 * d), d, dtype),
                                        dense_init(k2, (d, d), d, dtype))

        def layer_initial_state(self, layer_params):
            return jnp.zeros((), layer_params.out.dtype)

        def layer_step(self, layer_params, state, x_t):
            raise NotImplementedError("the attention reference scores whole sequences only")

        def layer_scan(self, p, state, xs):
            num_t, d = xs.shape
            h = self.num_heads
            q, k, v = jnp.split(xs @ p.qkv, 3, axis=-1)
            q, k, v = (a.reshape(num_t, h, d // h) for a in (q, k, v))
            flax_fns = _flax_attention()
            if flax_fns is None:
                out = causal_softmax_attention(q, k, v)
            else:
                dot_product_attention, make_causal_mask = flax_fns
                mask = make_causal_mask(jnp.zeros((num_t,)))  # (1, T, T)
                out = dot_product_attention(q, k, v, mask=mask)
            return state, out.reshape(num_t, d) @ p.out

    @dataclasses.dataclass(frozen=True)
    class SoftmaxAttention(ResidualStackModel):
        num_heads: int = ATTENTION_HEADS

        @property
        def backbone(self):
            return SoftmaxAttentionBackbone(
                input_dim=self.backbone_input_dim, hidden_dim=self.hidden_dim,
                num_layers=self.num_layers, num_heads=self.num_heads)

    return SoftmaxAttention


# ---- discovering backbones and their modes -------------------------------------------
def available_backbones(names=None):
    """The candidate factories present in ``statseq`` (plus the attention reference), as
    ``{lower-case name: factory name}``; ``names`` restricts them (lower case)."""
    import statseq as ss

    found = {n.lower(): n for n in CANDIDATES if getattr(ss, n, None) is not None}
    found[ATTENTION] = ATTENTION
    if names:
        unknown = [n for n in names if n not in found]
        if unknown:
            print(f"not installed / unknown backbones, skipped: {unknown}", file=sys.stderr)
        found = {n: found[n] for n in names if n in found}
    return found


def _factory(name):
    import statseq as ss

    return _attention_model_classes() if name == ATTENTION else getattr(ss, name)


def _accepted(factory):
    """Keyword names the factory accepts (dataclass fields or signature)."""
    if dataclasses.is_dataclass(factory):
        return {f.name for f in dataclasses.fields(factory)}
    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return set()


def _build(factory, hidden, layers, extra):
    kw = {"hidden_dim": hidden, "num_layers": layers}
    acc = _accepted(factory)
    kw = {k: v for k, v in kw.items() if k in acc} | extra
    return factory(**kw)


def modes_of(name, hidden=64, layers=2):
    """``{mode label: extra keyword arguments}`` of one backbone: every issue-15 mode its
    factory accepts (``mode=``), else ``parallel=False/True``, else one explicit
    sequential evaluation (the LSTM and GRU; never the backend's default, which is DEER
    on a GPU), else the default."""
    if name == ATTENTION:
        return {"softmax": {}}
    factory = _factory(name)
    acc = _accepted(factory)
    if "mode" in acc:
        modes = {}
        for m in MODE_NAMES:
            try:
                _build(factory, hidden, layers, {"mode": m})
            except (ValueError, TypeError, NotImplementedError):
                continue
            modes[m] = {"mode": m}
        if modes:
            return modes
    if "parallel" in acc:
        return {"sequential": {"parallel": False}, "scan": {"parallel": True}}
    if "evaluation" in acc:
        return {"sequential": {"evaluation": "sequential"}}
    return {"default": {}}


# ---- one case -------------------------------------------------------------------------
def simulate(batch, num_t, dtype, seed=0):
    """A persistent AR(1) batch ``(B, T)``: ``y_t = 0.8 y_{t-1} + e_t``."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(batch, num_t))
    y = np.zeros_like(e)
    y[:, 0] = e[:, 0]
    for t in range(1, min(num_t, 2000)):  # a stationary stretch, then tiled (cheap at 10^5)
        y[:, t] = 0.8 * y[:, t - 1] + e[:, t]
    if num_t > 2000:
        y[:, 2000:] = np.resize(y[:, :2000], (batch, num_t - 2000))
    return y.astype(dtype)


def training_step(model):
    """``(params, y) -> (loss, grad)``: loss = mean over the batch of ``-log p(y_b)``."""
    from statseq.core.recurrence import run_filter

    def loss(params, y):
        mask = jnp.ones(y.shape, bool)
        inputs = jnp.zeros(y.shape + (0,), y.dtype)
        lp, *_ = run_filter(model, params, y, mask, inputs, complete=True)
        return -jnp.mean(lp)

    return jax.value_and_grad(loss)


def memory_fields(compiled):
    """XLA's memory estimate of a compiled program (bytes), or ``{}``."""
    try:
        m = compiled.memory_analysis()
        parts = dict(temp_bytes=int(m.temp_size_in_bytes),
                     argument_bytes=int(m.argument_size_in_bytes),
                     output_bytes=int(m.output_size_in_bytes),
                     alias_bytes=int(m.alias_size_in_bytes))
    except Exception:  # noqa: BLE001 - not every backend implements it
        return {}
    parts["program_bytes"] = (parts["temp_bytes"] + parts["argument_bytes"]
                              + parts["output_bytes"])
    return parts


def device_peak():
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001
        return None
    return (stats or {}).get("peak_bytes_in_use")


def prepare_row(name, mode, num_t, *, batch=32, hidden=64, layers=2, dtype=None):
    """Build and compile one case: ``(row, compiled, args)``; ``row`` holds the case,
    ``compile_s`` and XLA's memory estimate (``compiled`` is ``None`` on an error, recorded
    in ``row["status"]``)."""
    dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
    row = dict(backbone=name, mode=mode, T=int(num_t), B=int(batch), d=int(hidden),
               layers=int(layers), dtype=dtype.name)
    if name == ATTENTION:
        row["impl"] = attention_impl()
    try:
        extra = modes_of(name, hidden, layers)[mode]
        model = _build(_factory(name), hidden, layers, extra)
        y = simulate(batch, num_t, dtype)
        params = model.initialize(y[:, : min(num_t, 200)], key=jax.random.key(0))
        params = jax.tree.map(
            lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v, params)
        row["num_params"] = int(sum(np.size(v) for v in jax.tree.leaves(params)))
        args = (params, jnp.asarray(y))
        t0 = time.perf_counter()
        compiled = jax.jit(training_step(model)).lower(*args).compile()
        row["compile_s"] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - recorded in the row, the run goes on
        print(traceback.format_exc(limit=3), file=sys.stderr)
        row["status"] = f"error: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]}"
        return row, None, None
    row.update(memory_fields(compiled))
    return row, compiled, args


def bench_row(name, mode, num_t, *, batch=32, hidden=64, layers=2, dtype=None,
              min_time_s=0.5, max_call_s=None):
    """One case end to end (compile, warm-up, steady-state median): the row dict with
    ``status``, ``compile_s``, ``step_s``, ``runs``, ``loss``, ``num_params`` and XLA's
    memory estimate (``program_bytes`` = temp + argument + output bytes)."""
    row, compiled, args = prepare_row(name, mode, num_t, batch=batch, hidden=hidden,
                                      layers=layers, dtype=dtype)
    if compiled is None:
        return row
    time_cases({mode: (row, compiled, args)}, min_time_s=min_time_s, max_call_s=max_call_s)
    return row


def time_cases(cases, *, min_time_s=0.5, max_call_s=None, timer=None):
    """Time the compiled ``cases`` (``{mode: (row, compiled, args)}``) of one backbone and
    length in interleaved rounds; fills each row's ``step_s``, ``runs``, ``loss``,
    ``status`` and ``vs_best`` (paired ratio to the fastest mode)."""
    timer = timer or Timer(min_rounds=3, max_rounds=30, budget_s=min_time_s)
    fns, long_ones = {}, {}
    for mode, (row, compiled, args) in cases.items():
        try:
            t0 = time.perf_counter()
            loss, grad = jax.block_until_ready(compiled(*args))  # warm-up
            first = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: record, go on
            print(traceback.format_exc(limit=2), file=sys.stderr)
            row["status"] = f"error: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]}"
            continue
        row["loss"] = float(loss)
        row["finite"] = bool(np.isfinite(float(loss)) and all(
            bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grad)))
        del grad
        if max_call_s is not None and first > max_call_s:
            long_ones[mode] = first
            row.update(status="ok", step_s=first, runs=1)
        else:
            fns[mode] = (lambda c=compiled, a=args: c(*a))
    if fns:
        res = timer.rounds(fns)
        best = min(res, key=lambda m: res[m]["median"])
        for mode, r in res.items():
            row = cases[mode][0]
            row.update(status="ok", step_s=r["median"], runs=r["n"])
            if len(res) > 1:
                row["vs_best"] = paired_ratio(r, res[best])
                row["fastest"] = mode == best
                row["paired"] = {o: paired_ratio(r, res[o]) for o in res if o != mode}
    for row, _, _ in cases.values():
        if row.get("step_s"):
            row["us_per_step_per_seq"] = row["step_s"] / (row["T"] * row["B"]) * 1e6
            peak = device_peak()
            if peak is not None:
                row["peak_bytes_in_use"] = peak
    return cases


# ---- caps -------------------------------------------------------------------------------
def extrapolate(history, num_t, quadratic):
    """Seconds at ``num_t`` from ``[(T, seconds), ...]`` of shorter lengths: the longest
    one scaled by ``(num_t / T)`` to the mode's nominal power (1, or 2 for a quadratic
    mode); ``None`` without history. (A slope fitted to two noisy points of a loaded
    machine overshot by 20x, so the nominal one is used: a mode that grows faster is
    still measured, once.)"""
    if not history:
        return None
    t1, s1 = max(history)
    return s1 * (num_t / t1) ** (2.0 if quadratic else 1.0)


def attention_score_bytes(batch, num_t, itemsize, heads=ATTENTION_HEADS):
    """The attention scores of one layer, ``B x heads x T^2`` (kept for the backward
    pass): a lower bound of the reference's memory, checked before compiling."""
    return batch * heads * num_t * num_t * itemsize


# ---- crossovers and tables ------------------------------------------------------------------
def crossovers(rows):
    """For each backbone with several modes and each pair of its modes (a, b): the lengths
    where ``time_a / time_b`` (paired, same rounds) crosses 1, interpolated in log-log
    between adjacent measured lengths."""
    out = []
    by_bb = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("runs", 0) >= 1:
            key = (r["backbone"], r["B"])
            by_bb.setdefault(key, {}).setdefault(r["T"], {})[r["mode"]] = r
    for (bb, batch), per_t in by_bb.items():
        modes = sorted({m for d in per_t.values() for m in d})
        for i, a in enumerate(modes):
            for b in modes[i + 1:]:
                pts = [(t, d[a].get("paired", {}).get(b, d[a]["step_s"] / d[b]["step_s"]))
                       for t, d in sorted(per_t.items()) if a in d and b in d]
                if len(pts) < 1:
                    continue
                cross = []
                for (t0, r0), (t1, r1) in zip(pts, pts[1:], strict=False):
                    if (r0 - 1) * (r1 - 1) < 0:
                        la, lb = math.log(r0), math.log(r1)
                        frac = la / (la - lb)
                        cross.append(round(math.exp(math.log(t0) + frac
                                                    * (math.log(t1) - math.log(t0)))))
                out.append(dict(backbone=bb, B=batch, a=a, b=b,
                                ratios={str(t): r for t, r in pts}, crossover_T=cross))
    return out


def fmt_t(x):
    if x is None:
        return "–"
    return f"{x:.2f} s" if x >= 1 else (f"{x * 1e3:.2f} ms" if x >= 1e-3
                                        else f"{x * 1e6:.0f} µs")


def fmt_b(x):
    if x is None:
        return "–"
    return f"{x / 2**30:.2f} GiB" if x >= 2**30 else f"{x / 2**20:.1f} MiB"


def table(rows):
    head = ["backbone", "mode", "T", "B", "compile", "step (median)", "runs", "µs / step / seq",
            "vs fastest mode", "XLA mem. estimate", "status"]
    body = []
    for r in rows:
        ok = r.get("status") == "ok"
        vs = r.get("vs_best")
        body.append([
            r["backbone"] + (" (flax)" if "flax" in r.get("impl", "") else ""),
            r["mode"], r["T"], r["B"], fmt_t(r.get("compile_s")),
            fmt_t(r.get("step_s")) if ok else "–", r.get("runs", "–") if ok else "–",
            f"{r['us_per_step_per_seq']:.3g}" if ok and r.get("us_per_step_per_seq") else "–",
            "–" if vs is None else ("fastest" if r.get("fastest") else f"{vs:.2f}×"),
            fmt_b(r.get("program_bytes")),
            r.get("status", "?") if not ok else ("ok" if r.get("finite", True)
                                                 else "ok (non-finite!)"),
        ])
    return md_table(head, body)


def cross_table(cross):
    head = ["backbone", "B", "modes a / b", "time a / time b by T (paired)", "crossover T"]
    body = [[c["backbone"], c.get("B", "–"), f"{c['a']} / {c['b']}",
             ", ".join(f"{t}: {r:.3g}" for t, r in c["ratios"].items()),
             ", ".join(f"≈ {t:.3g}" for t in c["crossover_T"]) or "none in range"]
            for c in cross]
    return md_table(head, body)


def machine_info(args):
    dev = jax.devices()[0]
    try:
        cpu = next(line.split(":", 1)[1].strip()
                   for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return dict(backend=jax.default_backend(), device_kind=getattr(dev, "device_kind", "?"),
                device=str(dev), cpu=cpu, cpu_count=os.cpu_count(), cpus_usable=usable,
                jax=jax.__version__, python=platform.python_version(),
                attention=attention_impl(), dtype="float32",
                load_average_start=load_average(), command=" ".join(sys.argv),
                date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                caps=dict(mem_cap_gb=args.mem_cap_gb, max_step_s=args.max_step_s,
                          max_call_s=args.max_call_s,
                          compile_cap_gb=(4 * args.mem_cap_gb if args.compile_cap_gb is None
                                          else args.compile_cap_gb)))


def write(path, info, rows, elapsed):
    info = dict(info, load_average_now=load_average(), elapsed_s=round(elapsed, 1))
    cross = crossovers(rows)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(dict(info=info, rows=rows, crossovers=cross), indent=1))
    Path(path).with_suffix(".md").write_text(render(info, rows, cross))


def render(info, rows, cross):
    mach = (f"{info['backend']} / {info['device_kind']}, CPU {info['cpu']} "
            f"({info['cpus_usable']} of {info['cpu_count']} cores usable), jax {info['jax']}, "
            f"{info['dtype']}, attention: {info['attention']}; load average "
            f"{info['load_average_start']} at the start, {info.get('load_average_now', '?')} "
            f"at the end; {info['date']}, {info.get('elapsed_s', '?')} s")
    return (f"{mach}\n\n`{info['command']}`\n\n{table(rows)}\n\n"
            f"Crossovers between modes (same-run paired ratios; the ratio of the two timings "
            f"where one mode has runs = 1):\n\n{cross_table(cross)}\n")


# ---- driver ------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbones", default="",
                    help="comma-separated, lower case (default: every one installed, plus "
                         "'attention')")
    ap.add_argument("--lengths", default="100,1000,10000,100000")
    ap.add_argument("--modes", default="",
                    help="comma-separated mode labels to keep (default: every mode)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--mem-cap-gb", type=float, default=None,
                    help="do not run a program XLA estimates above this (default: half the "
                         "device memory where known, else 4)")
    ap.add_argument("--compile-cap-gb", type=float, default=None,
                    help="do not compile a case whose XLA estimate, extrapolated from a "
                         "shorter length, exceeds this (default: 4x --mem-cap-gb)")
    ap.add_argument("--max-step-s", type=float, default=20.0,
                    help="do not compile a case whose extrapolated step exceeds this")
    ap.add_argument("--max-call-s", type=float, default=5.0,
                    help="a warm-up call longer than this is the one timing")
    ap.add_argument("--min-time-s", type=float, default=0.5,
                    help="interleaved rounds until this long (and >= 3)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new case after this many seconds (the rest are rows "
                         "marked skipped)")
    ap.add_argument("--out", default=None, help="JSON of rows (and .md next to it)")
    ap.add_argument("--render", nargs="+", default=None, metavar="JSON",
                    help="run nothing: print one table (and the crossovers) of the rows of "
                         "these --out files, in the order given")
    ap.add_argument("--hide-skipped", action="store_true",
                    help="with --render: list skipped cases under the table, not in it")
    args = ap.parse_args(argv)
    args.backbones = [b.strip().lower() for b in args.backbones.split(",") if b.strip()]
    args.lengths = [int(float(t)) for t in args.lengths.split(",") if t]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    return args


def render_files(paths, hide_skipped=False):
    """One Markdown table and crossover table from the rows of several ``--out`` files;
    ``hide_skipped`` lists the skipped cases in one line under the table instead."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    rows = [r for run in runs for r in run["rows"]]
    done = {(r["backbone"], r["mode"], r["T"], r["B"]) for r in rows if r.get("status") == "ok"}
    rows = [r for r in rows if r.get("status") == "ok"  # a case measured by a later run
            or (r["backbone"], r["mode"], r["T"], r["B"]) not in done]
    order = list(dict.fromkeys(r["backbone"] for r in rows))
    rows.sort(key=lambda r: (-r["B"], order.index(r["backbone"]), r["T"]))  # stable
    heads = "\n".join(f"- `{run['info']['command']}`: {run['info']['date']}, "
                      f"{run['info'].get('elapsed_s', '?')} s, load average "
                      f"{run['info']['load_average_start']} -> "
                      f"{run['info'].get('load_average_now', '?')}" for run in runs)
    skipped = ""
    if hide_skipped:
        gone = [r for r in rows if str(r.get("status", "")).startswith("skipped")]
        rows = [r for r in rows if r not in gone]
        skipped = "\n\nSkipped (extrapolated step or XLA estimate over the run's cap): " + (
            "; ".join(f"{r['backbone']} {r['mode']} T={r['T']} B={r['B']} "
                      f"({r['status'].split(': ', 1)[1].split(' >')[0]})" for r in gone)
            or "none") + "."
    return (f"{heads}\n\n{table(rows)}{skipped}\n\nCrossovers between modes (same-run "
            f"paired ratios; the ratio of the two timings where one mode has runs = 1):"
            f"\n\n{cross_table(crossovers(rows))}\n")


def main(argv=None):
    os.environ["STATSEQ_NO_COMPILATION_CACHE"] = "1"  # honest compile times
    jax.config.update("jax_enable_compilation_cache", False)
    args = parse_args(argv)
    if args.render:
        print(render_files(args.render, args.hide_skipped))
        return None
    if args.mem_cap_gb is None:
        try:
            limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
        except Exception:  # noqa: BLE001
            limit = None
        args.mem_cap_gb = 0.5 * limit / 2**30 if limit else 4.0
    cap = args.mem_cap_gb * 2**30
    compile_cap = (4 * args.mem_cap_gb if args.compile_cap_gb is None
                   else args.compile_cap_gb) * 2**30
    info = machine_info(args)
    print(json.dumps(info, indent=1), file=sys.stderr)
    names = available_backbones(args.backbones).values()
    plan = {n: {m: kw for m, kw in modes_of(n, args.hidden, args.layers).items()
                if not args.modes or m in args.modes} for n in names}
    plan = {n: m for n, m in plan.items() if m}
    info["backbones"] = {n: sorted(m) for n, m in plan.items()}
    print(f"backbones and modes: {info['backbones']}", file=sys.stderr, flush=True)
    rows, history, mem_history, start = [], {}, {}, time.perf_counter()
    for num_t in args.lengths:
        for name, modes in plan.items():
            cases = {}
            for mode in modes:
                case = dict(backbone=name, mode=mode, T=num_t, B=args.batch, d=args.hidden,
                            layers=args.layers, dtype="float32")
                elapsed = time.perf_counter() - start
                if args.budget_s is not None and elapsed > args.budget_s:
                    case["status"] = f"skipped: budget ({elapsed:.0f} s > {args.budget_s:g} s)"
                    rows.append(case)
                    continue
                quad = name == ATTENTION or mode in QUADRATIC_MODES
                guess = extrapolate(history.get((name, mode), []), num_t, quad)
                if guess is not None and guess > args.max_step_s:
                    case["status"] = (f"skipped: step extrapolated to {guess:.3g} s > "
                                      f"--max-step-s {args.max_step_s:g}")
                    case["extrapolated_step_s"] = guess
                    rows.append(case)
                    continue
                mem_guess = extrapolate(mem_history.get((name, mode), []), num_t, quad)
                if mem_guess is not None and mem_guess > compile_cap:
                    case["status"] = (f"skipped: XLA estimate extrapolated to "
                                      f"{fmt_b(mem_guess)} > compile cap {fmt_b(compile_cap)} "
                                      "(not compiled)")
                    case["extrapolated_program_bytes"] = mem_guess
                    rows.append(case)
                    continue
                if name == ATTENTION and attention_score_bytes(args.batch, num_t, 4) > cap:
                    est = attention_score_bytes(args.batch, num_t, 4)
                    case["status"] = (f"skipped: attention scores alone {fmt_b(est)} > cap "
                                      f"{fmt_b(cap)}")
                    rows.append(case)
                    continue
                print(f"[{time.perf_counter() - start:7.1f} s] {name} {mode} T={num_t}: "
                      "compiling", file=sys.stderr, flush=True)
                row, compiled, fargs = prepare_row(name, mode, num_t, batch=args.batch,
                                                   hidden=args.hidden, layers=args.layers)
                rows.append(row)
                if row.get("program_bytes"):
                    mem_history.setdefault((name, mode), []).append(
                        (num_t, row["program_bytes"]))
                if compiled is None:
                    continue
                if row.get("program_bytes", 0) > cap:
                    row["status"] = (f"skipped: XLA estimate {fmt_b(row['program_bytes'])} "
                                     f"> cap {fmt_b(cap)} (compiled, not run)")
                    continue
                cases[mode] = (row, compiled, fargs)
            if cases:
                try:
                    time_cases(cases, min_time_s=args.min_time_s, max_call_s=args.max_call_s)
                except Exception as e:  # noqa: BLE001
                    print(traceback.format_exc(limit=2), file=sys.stderr)
                    for row, _, _ in cases.values():
                        row.setdefault("status", f"error: {type(e).__name__}")
                for mode, (row, _, _) in cases.items():
                    if row.get("status") == "ok":
                        history.setdefault((name, mode), []).append((num_t, row["step_s"]))
                    print(f"  {name} {mode} T={num_t}: compile {fmt_t(row.get('compile_s'))}, "
                          f"step {fmt_t(row.get('step_s'))} x{row.get('runs')}, "
                          f"XLA est. {fmt_b(row.get('program_bytes'))}, {row.get('status')}",
                          file=sys.stderr, flush=True)
            cases.clear()
            if args.out:
                write(args.out, info, rows, time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    info = dict(info, load_average_now=load_average(), elapsed_s=round(elapsed, 1))
    print(render(info, rows, crossovers(rows)))
    if args.out:
        write(args.out, info, rows, elapsed)
    return rows


if __name__ == "__main__":
    main()
