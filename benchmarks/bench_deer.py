"""DEER / quasi-DEER against the sequential scan for statseq's GRU and LSTM cells.

For each cell (GRU, LSTM; one layer of `statseq.models.neural.cells.RNNBackbone`), hidden
size ``H``, length ``T`` and batch ``B`` (sequences of ``I = 4`` random inputs), it times

* ``forward``: the trajectory ``h_{0:T-1}`` of every sequence;
* ``value+grad``: the value and parameter gradient of ``L = sum_t log(1 + |h_t - y_t|^2)``
  (a log-likelihood-like loss of the whole trajectory; DEER's gradient is implicit);

for three evaluations: ``sequential`` (the library's own whole-sequence path,
`RNNBackbone.scan_time_major` with ``evaluation="sequential"`` whatever the backend: one
`lax.scan` over the batch, input projections hoisted, the LSTM's hand-written backward
pass), ``deer`` and ``quasi-deer``
(`statseq.inference.deer.deer` on the cell's ``step``, vmapped over the batch). Every
program is jitted; compile time (lower + compile) is reported separately from the steady
state (median of repeated calls, each ended by `jax.block_until_ready`). Each DEER row
reports the Newton iterations used (max over the batch), whether every sequence
converged, the max abs difference of its trajectory (forward) or relative difference of
its gradient (value+grad) from the sequential one, the time per Newton iteration, and
``break-even iters`` = sequential time / time per iteration: DEER beats the sequential
scan when it needs fewer iterations than that.

Memory: XLA's own estimate for each compiled program (arguments + outputs + temporaries,
``compiled.memory_analysis()``) and, where the device reports it (GPU),
``jax.devices()[0].memory_stats()["peak_bytes_in_use"]`` (a process-wide running peak,
so a row's value is the largest of every program run before it in the same process).
Dense DEER holds ``T B`` Jacobians of ``H x H`` (``2H x 2H`` for the LSTM); cases whose
estimate exceeds ``--mem-limit-gb`` are skipped, with the estimate printed and recorded.

float32 by default (``--float64`` for float64); matmuls at ``"highest"`` precision (on
GPUs, XLA's default float32 matmul uses TF32, whose 1e-3 relative error would stall
Newton's residual far above the tolerance). ``--budget-s`` stops starting new cases once the
elapsed time exceeds it (the table lists the skipped ones).

Long sequences: ``--max-call-s S`` records a single timing (``runs = 1``) when the warm-up
call already took more than ``S`` seconds (a sequential scan at ``T = 10^6`` on a GPU costs
tens of seconds per call); ``--extrapolate-s S`` does not run a sequential program whose
time, extrapolated linearly in ``T`` from the same case at a shorter length of this run,
exceeds ``S`` seconds, and records the extrapolation instead (marked ``≈`` and
``extrapolated``; a sequential scan's time is linear in ``T``). ``--order length`` (the
default) runs the lengths in the order given, each over every hidden size, so that the most
informative cases (``T = 10^4, 10^5``) finish first; ``--order hidden`` runs each hidden
size over every length. ``--compile-threads N`` compiles the programs of one case in ``N``
threads at once (XLA compiles one program on one core; a GPU host has idle cores): compile
times are then each program's wall time while the others compiled too.

``--model``: the model-level training step instead, the value and gradient of the
log-likelihood of `statseq.GRU` / `statseq.LSTM` (``evaluation=`` each method) on one long
series, through the compiled filter that `statseq.fit_sgd` differentiates
(`statseq.core.recurrence.run_filter` with ``complete=True``): ``--methods`` are then the
models' ``evaluation=`` values.

Usage (``--out`` writes the JSON and, next to it, the Markdown table after every case; the
table goes to stdout, progress to stderr):
    python benchmarks/bench_deer.py --quick --out deer_cpu.json
    python benchmarks/bench_deer.py --lengths 10000,100000 --budget-s 240 \
        --out $OUT/deer_gpu.json                                   # on a GPU, ~5 minutes
    python benchmarks/bench_deer.py --hidden 16,64 --lengths 1000,10000 --batch 1 --long
    python benchmarks/bench_deer.py --model --hidden 16,64 --lengths 10000,100000
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

METHODS = ("sequential", "deer", "quasi-deer")  # also "elk", "quasi-elk" by --methods
MODES = ("forward", "value+grad")
INPUT_DIM = 4


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="gru,lstm")
    ap.add_argument("--hidden", default="16,64,256", help="comma-separated hidden sizes")
    ap.add_argument("--lengths", default="10000,100000,1000",
                    help="comma-separated T, run in this order (the published reference "
                         "point T = 10^4 first, so that a --budget-s cut keeps it)")
    ap.add_argument("--long", action="store_true", help="also T = 10^6")
    ap.add_argument("--batch", default="1,16", help="comma-separated batch sizes")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--float64", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="GRU and LSTM, H = 16, T = 1000 and 10^4, batch 1 (CPU-sized)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new case after this many seconds")
    ap.add_argument("--max-iter", type=int, default=100, help="Newton iterations at most")
    ap.add_argument("--mem-limit-gb", type=float, default=None,
                    help="skip cases whose estimated memory exceeds this (default: half "
                         "the device's memory where known, else 4)")
    ap.add_argument("--min-time-s", type=float, default=0.5,
                    help="repeat each steady-state timing until this long (and >= 3 runs)")
    ap.add_argument("--max-call-s", type=float, default=None,
                    help="if the warm-up call takes longer, record it alone (runs = 1)")
    ap.add_argument("--extrapolate-s", type=float, default=None,
                    help="do not run a sequential program whose time extrapolated from a "
                         "shorter T of this run exceeds this; record the extrapolation")
    ap.add_argument("--order", choices=("length", "hidden"), default="length",
                    help="length: every H at the first length, then the next length; "
                         "hidden: every length at the first H, then the next H")
    ap.add_argument("--compile-threads", type=int, default=1,
                    help="compile the programs of one case in this many threads at once")
    ap.add_argument("--model", action="store_true",
                    help="model-level training step: value and gradient of ss.GRU / "
                         "ss.LSTM's log-likelihood under each evaluation= (--methods)")
    ap.add_argument("--matmul-precision", default="highest")
    ap.add_argument("--out", default=None, help="write the JSON results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.hidden, args.lengths, args.batch = "16", "1000,10000", "1"
        args.long = False
    ints = lambda s: [int(float(v)) for v in s.split(",") if v]  # noqa: E731
    args.cells = [c for c in args.cells.split(",") if c]
    args.hidden, args.lengths, args.batch = ints(args.hidden), ints(args.lengths), ints(args.batch)
    if args.long and 10**6 not in args.lengths:
        args.lengths.append(10**6)
    args.methods = [m for m in args.methods.split(",") if m]
    if args.model:
        args.modes, args.batch = "value+grad", [1]
    args.modes = [m for m in args.modes.split(",") if m]
    return args


def device_memory():
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    return stats or None


def program_bytes(compiled):
    try:
        m = compiled.memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes
                   + m.temp_size_in_bytes - m.alias_size_in_bytes)
    except Exception:  # noqa: BLE001
        return None


def estimate_bytes(method, cell, hid, num_t, batch, itemsize):
    """Rough peak memory of one case: dense DEER holds a few (T B, H', H') arrays
    (``H' = H``, ``2 H`` for the LSTM's (h, c))."""
    state = 2 * hid if cell == "lstm" else hid
    if method == "deer":  # measured (H100, H = 16): XLA's program estimate ~2.9 such arrays
        return 4 * num_t * batch * state * state * itemsize
    if method == "elk":  # the parallel Kalman smoother holds about a dozen (T, n, n)
        return 24 * num_t * batch * state * state * itemsize
    if method == "quasi-elk":
        return 400 * num_t * batch * state * itemsize
    # sequential and quasi-DEER: measured (H100, H = 16) 10-14 (T B, H') arrays
    return 20 * num_t * batch * state * itemsize


def compile_program(fn, args):
    """Lower and compile ``jax.jit(fn)`` at ``args``: (compiled, lower + compile seconds)."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def run_program(compiled, args, min_time_s, max_call_s=None):
    """Steady-state median seconds, number of runs, and the output of a compiled program.

    The warm-up call is timed too: when it took longer than ``max_call_s`` it is the one
    timing recorded (``runs = 1``).
    """
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))  # warm-up
    first = time.perf_counter() - t0
    if max_call_s is not None and first > max_call_s:
        return first, 1, out
    times, start = [], time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < min_time_s and len(times) < 50):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times), out


def timed(fn, args, min_time_s, max_call_s=None):
    """Compile seconds, steady-state median seconds, number of runs, the output, and
    XLA's memory estimate of the program."""
    compiled, compile_s = compile_program(fn, args)
    run_s, n, out = run_program(compiled, args, min_time_s, max_call_s)
    return compile_s, run_s, n, out, program_bytes(compiled)


def build(cell, hid, num_t, batch, dtype, max_iter):
    """Parameters, inputs and the functions to time for one case."""
    from statseq.inference.deer import deer
    from statseq.models.neural.cells import RNNBackbone

    # evaluation="sequential" explicitly: the backbone's default (None) resolves to DEER on
    # a GPU for T >= 1000 (`statseq.models.neural.evaluation.resolve_evaluation`), which
    # would make the "sequential" reference a DEER run (the bug of the first H100 run of
    # session 15; tests/test_bench_deer.py). The solvers below call `deer` on the cell's
    # `step` with an explicit method, so no path depends on the backend's default.
    rnn = RNNBackbone(cell, input_dim=INPUT_DIM, hidden_dim=hid, evaluation="sequential")
    params = jax.tree_util.tree_map(lambda v: v.astype(dtype),
                                    rnn.init_params(jax.random.key(0)))
    kx, ky = jax.random.split(jax.random.key(1))
    xs = jax.random.normal(kx, (batch, num_t, INPUT_DIM), dtype)
    ys = 0.5 * jax.random.normal(ky, (batch, num_t, hid), dtype)
    h0 = rnn.initial_state(params)

    def step(p, s, x):
        return rnn.step(p, s, x)[0]

    def features(states):  # the last layer's h_t from a (T, ...) state trajectory
        last = states[-1]
        return last[0] if cell == "lstm" else last

    def seq_forward(p, xs):
        state = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (batch,) + v.shape), h0)
        _, hs = rnn.scan_time_major(p, state, jnp.swapaxes(xs, 0, 1))
        return jnp.swapaxes(hs, 0, 1), jnp.int32(0), jnp.bool_(True)

    def deer_forward(method):
        def fwd(p, xs):
            res = jax.vmap(lambda x: deer(step, p, h0, x, method=method,
                                          max_iter=max_iter))(xs)
            return features(res.states), res.iterations.max(), res.converged.all()
        return fwd

    def loss_of(fwd):
        def loss(p, xs, ys):
            hs, iters, ok = fwd(p, xs)
            return jnp.sum(jnp.log1p((hs - ys) ** 2)), (iters, ok)

        def vg(p, xs, ys):
            (val, aux), grad = jax.value_and_grad(loss, has_aux=True)(p, xs, ys)
            return (val, grad), aux[0], aux[1]
        return vg

    fwds = {"sequential": seq_forward, "deer": deer_forward("deer"),
            "quasi-deer": deer_forward("quasi-deer"), "elk": deer_forward("elk"),
            "quasi-elk": deer_forward("quasi-elk")}
    return params, xs, ys, fwds, loss_of


def _err(e):
    """A one-line row status for an exception."""
    return f"error: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"


def rel_err(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(la, lb, strict=True) if x.size)
    den = max(float(jnp.max(jnp.abs(x))) for x in la if x.size)
    return num / max(den, 1e-300)


def build_model(cell, hid, num_t, methods, dtype):
    """The model-level training step: value and gradient of ``ss.GRU`` / ``ss.LSTM``'s
    log-likelihood of one series of length ``num_t`` under each ``evaluation=``.

    The same compiled filter `statseq.fit_sgd` differentiates
    (`statseq.core.recurrence.run_filter`, ``complete=True``: a fully observed series).
    Returns ``{method: (fn, args)}``; every ``fn`` returns ``((value, grad), 0, True)``
    (the model does not expose the solver's iterations; the fallback would warn).
    """
    import statseq as ss
    from statseq.core.recurrence import run_filter

    cls = {"gru": ss.GRU, "lstm": ss.LSTM}[cell]
    y = np.asarray(jax.random.normal(jax.random.key(2), (num_t,)), dtype)
    y = np.cumsum(y) * 0.05 + 0.5 * y  # a persistent series, scaled near 1
    out = {}
    for method in methods:
        model = cls(hidden_dim=hid, evaluation=method)
        params = model.initialize(y, key=jax.random.key(0))
        params = jax.tree_util.tree_map(
            lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v,
            params)
        ys = jnp.asarray(y)[None]
        mask = jnp.ones(ys.shape, bool)
        inputs = jnp.zeros((1, num_t, 0), dtype)

        def vg(p, ys, mask, inputs, model=model):
            def loglik(p):
                lp, *_ = run_filter(model, p, ys, mask, inputs, complete=True)
                return jnp.sum(lp)
            return jax.value_and_grad(loglik)(p), jnp.int32(0), jnp.bool_(True)

        out[method] = (vg, (params, ys, mask, inputs))
    return out


def _programs(cell, hid, num_t, batch, args, dtype):
    """``{(mode, method): (fn, fargs)}`` for one case, in the order to run."""
    if args.model:
        progs = build_model(cell, hid, num_t, args.methods, dtype)
        return {("value+grad", m): progs[m] for m in args.methods}
    params, xs, ys, fwds, loss_of = build(cell, hid, num_t, batch, dtype, args.max_iter)
    return {(mode, method): ((fwds[method], (params, xs)) if mode == "forward"
                             else (loss_of(fwds[method]), (params, xs, ys)))
            for mode in args.modes for method in args.methods}


def _compile_all(todo, threads):
    """Compile every ``(fn, fargs)`` of ``todo``: ``{key: (compiled, seconds) | exception}``.

    With ``threads > 1`` the programs are traced and lowered one after another in this
    thread and only XLA's ``compile()`` runs in a pool (it releases the GIL); a program's
    seconds are then its lowering plus its compile, while others compiled too.
    """
    def lower(item):
        fn, fargs = item
        t0 = time.perf_counter()
        try:
            return jax.jit(fn).lower(*fargs), time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - recorded in the row
            print(traceback.format_exc(limit=2), file=sys.stderr)
            return e, 0.0

    def finish(lowered):
        low, low_s = lowered
        if isinstance(low, Exception):
            return low
        t0 = time.perf_counter()
        try:
            return low.compile(), low_s + time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - recorded in the row
            print(traceback.format_exc(limit=2), file=sys.stderr)
            return e

    if threads <= 1 or len(todo) <= 1:
        return {k: finish(lower(v)) for k, v in todo.items()}
    from concurrent.futures import ThreadPoolExecutor

    lowered = {k: lower(v) for k, v in todo.items()}
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return dict(zip(lowered, pool.map(finish, lowered.values()), strict=True))


def run_case(cell, hid, num_t, batch, args, dtype, mem_limit, seq_times=None):
    """The rows of one case. ``seq_times`` maps ``(cell, H, B, mode)`` to the sequential
    ``(T, seconds)`` measured at the longest length so far (for ``--extrapolate-s``)."""
    seq_times = {} if seq_times is None else seq_times
    itemsize = jnp.dtype(dtype).itemsize
    rows, ref = {}, {}
    todo = {}
    for mode in args.modes:
        for method in args.methods:
            row = dict(cell=cell, H=hid, T=num_t, B=batch, mode=mode, method=method)
            if args.model:
                row["level"] = "model"
            rows[mode, method] = row
            prev = seq_times.get((cell, hid, batch, mode))
            if (method == "sequential" and args.extrapolate_s is not None and prev
                    and prev[1] * num_t / prev[0] > args.extrapolate_s):
                guess = prev[1] * num_t / prev[0]
                row.update(status="ok", extrapolated=True, run_s=guess, runs=0,
                           compile_s=None, program_bytes=None,
                           extrapolated_from=f"T={prev[0]}: {prev[1]:.4g} s")
                print(f"  {mode} sequential: not run, {guess:.1f} s extrapolated from "
                      f"T={prev[0]}", file=sys.stderr)
                continue
            est = estimate_bytes(method, cell, hid, num_t, batch, itemsize)
            row["est_bytes"] = est
            if est > mem_limit:
                row["status"] = (f"skipped: est. {est / 2**30:.3g} GiB > limit "
                                 f"{mem_limit / 2**30:.3g} GiB")
                print(f"  skip {mode} {method}: estimated {est / 2**30:.1f} GiB", file=sys.stderr)
                continue
            todo[mode, method] = None
    if todo:
        try:
            progs = _programs(cell, hid, num_t, batch, args, dtype)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory for the inputs
            print(traceback.format_exc(limit=2), file=sys.stderr)
            for k in todo:
                rows[k]["status"] = _err(e)
            return list(rows.values())
        todo = {k: progs[k] for k in todo}
        t0 = time.perf_counter()
        compiled = _compile_all(todo, args.compile_threads)
        print(f"  compiled {len(todo)} programs in {time.perf_counter() - t0:.1f} s "
              f"({args.compile_threads} threads)", file=sys.stderr, flush=True)
    for (mode, method), fn_args in todo.items():
        row = rows[mode, method]
        got = compiled[mode, method]
        try:
            if isinstance(got, Exception):
                raise got
            prog, c_s = got
            run_s, n, out = run_program(prog, fn_args[1], args.min_time_s, args.max_call_s)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: record, go on
            row["status"] = _err(e)
            print(traceback.format_exc(limit=2), file=sys.stderr)
            continue
        value, iters, ok = out
        row.update(status="ok", compile_s=c_s, run_s=run_s, runs=n,
                   program_bytes=program_bytes(prog))
        if args.compile_threads > 1:
            row["compile_threads"] = args.compile_threads
        mem = device_memory()
        row["peak_bytes_in_use"] = mem.get("peak_bytes_in_use") if mem else None
        if method == "sequential":
            ref[mode] = value
            seq_times[cell, hid, batch, mode] = (num_t, run_s)
        else:
            if not args.model:
                row.update(iterations=int(iters), converged=bool(ok),
                           s_per_iter=run_s / max(int(iters), 1))
            if mode in ref:
                row["err_vs_sequential"] = (
                    float(jnp.max(jnp.abs(value - ref[mode]))) if mode == "forward"
                    else rel_err(ref[mode][1], value[1]))
        print(f"  {mode} {method}: compile {c_s:.2f} s, run {run_s:.4g} s x{n}"
              + (f", {int(iters)} iters" if method != "sequential" and not args.model
                 else ""), file=sys.stderr, flush=True)
        todo[mode, method] = compiled[mode, method] = None  # free the executable
        del out, value, prog
    rows = list(rows.values())
    seq = {r["mode"]: r.get("run_s") for r in rows
           if r["method"] == "sequential" and r.get("status") == "ok"}
    guessed = {r["mode"] for r in rows if r["method"] == "sequential" and r.get("extrapolated")}
    for r in rows:
        if r["method"] != "sequential" and r.get("run_s") and seq.get(r["mode"]):
            r["speedup"] = seq[r["mode"]] / r["run_s"]
            if r["mode"] in guessed:
                r["vs_extrapolated"] = True
            if r.get("s_per_iter"):
                r["break_even_iters"] = seq[r["mode"]] / r["s_per_iter"]
    return rows


def fmt_t(x):
    if x is None:
        return "–"
    return f"{x:.2f} s" if x >= 1 else (f"{x * 1e3:.2f} ms" if x >= 1e-3
                                        else f"{x * 1e6:.0f} µs")


def fmt_b(x):
    return "–" if x is None else f"{x / 2**20:.1f} MiB"


def table(rows):
    head = ["cell", "H", "T", "B", "mode", "method", "compile", "run", "runs", "vs seq", "iters",
            "conv", "err vs seq", "per iter", "break-even iters", "program mem", "peak mem"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("status", "ok") != "ok":
            cells = [r["cell"], r["H"], r["T"], r["B"], r["mode"], r["method"],
                     r["status"]] + [""] * (len(head) - 7)
        else:
            sp = r.get("speedup")
            approx = "≈ " if r.get("extrapolated") or r.get("vs_extrapolated") else ""
            cells = [r["cell"], r["H"], r["T"], r["B"], r["mode"], r["method"],
                     fmt_t(r["compile_s"]),
                     ("≈ " if r.get("extrapolated") else "") + fmt_t(r["run_s"]),
                     r.get("runs", "–"),
                     "–" if sp is None else approx + (f"{sp:.3g}× faster" if sp >= 1
                                                     else f"{1 / sp:.3g}× slower"),
                     r.get("iterations", "–"), r.get("converged", "–"),
                     "–" if r.get("err_vs_sequential") is None
                     else f"{r['err_vs_sequential']:.1e}",
                     fmt_t(r.get("s_per_iter")),
                     "–" if r.get("break_even_iters") is None
                     else f"{r['break_even_iters']:.3g}",
                     fmt_b(r.get("program_bytes")), fmt_b(r.get("peak_bytes_in_use"))]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.float64:
        jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_default_matmul_precision", args.matmul_precision)
    dtype = jnp.float64 if args.float64 else jnp.float32
    dev = jax.devices()[0]
    mem = device_memory()
    if args.mem_limit_gb is not None:
        mem_limit = args.mem_limit_gb * 2**30
    elif mem and mem.get("bytes_limit"):
        mem_limit = 0.5 * mem["bytes_limit"]
    else:
        mem_limit = 4 * 2**30
    info = dict(backend=jax.default_backend(), device=str(dev),
                device_kind=getattr(dev, "device_kind", "?"), jax=jax.__version__,
                python=platform.python_version(), dtype=jnp.dtype(dtype).name,
                matmul_precision=args.matmul_precision, max_iter=args.max_iter,
                mem_limit_bytes=mem_limit, command=" ".join(sys.argv),
                date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    print(json.dumps(info, indent=1), file=sys.stderr)
    if args.order == "length":  # every H at the first (most informative) length first
        cases = [(c, h, t, b) for t in args.lengths for h in args.hidden
                 for b in args.batch for c in args.cells]
    else:  # small hidden sizes first (DEER's regime), every length for each
        cases = [(c, h, t, b) for h in args.hidden for t in args.lengths
                 for b in args.batch for c in args.cells]
    rows, start, seq_times = [], time.perf_counter(), {}
    for cell, hid, num_t, batch in cases:
        elapsed = time.perf_counter() - start
        if args.budget_s is not None and elapsed > args.budget_s:
            rows += [dict(cell=cell, H=hid, T=num_t, B=batch, mode=mode, method=m,
                          status=f"skipped: budget ({elapsed:.0f} s > {args.budget_s:g} s)")
                     for mode in args.modes for m in args.methods]
            continue
        print(f"[{elapsed:6.1f} s] {cell} H={hid} T={num_t} B={batch}", file=sys.stderr,
              flush=True)
        rows += run_case(cell, hid, num_t, batch, args, dtype, mem_limit, seq_times)
        if args.out:  # keep partial results if the run is cut off
            write(args.out, info, rows, time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    print(f"backend {info['backend']}, device {info['device_kind']} ({info['device']}), "
          f"jax {info['jax']}, {info['dtype']}, matmul precision {args.matmul_precision}, "
          f"max_iter {args.max_iter}; total {elapsed:.0f} s\n")
    print(table(rows))
    if args.out:
        write(args.out, info, rows, elapsed)


def write(path, info, rows, elapsed):
    def clean(v):
        if isinstance(v, (np.generic,)):
            return v.item()
        return v

    data = dict(info=info, elapsed_s=elapsed,
                rows=[{k: clean(v) for k, v in r.items()} for r in rows])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1))
    Path(path).with_suffix(".md").write_text(
        f"{info['device_kind']} ({info['backend']}), jax {info['jax']}, {info['dtype']}, "
        f"{info['date']}, {elapsed:.0f} s so far\n`{info['command']}`\n\n{table(rows)}\n")


if __name__ == "__main__":
    main()
