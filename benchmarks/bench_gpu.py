#!/usr/bin/env python
"""Sequential against parallel (associative-scan) inference, on whatever backend JAX has.

    python benchmarks/bench_gpu.py --out DIR            # on a GPU: the recorded run
    python benchmarks/bench_gpu.py --quick --max-t 1e4  # CPU smoke run (prints only)

The question this answers is the one the docs' long-sequence vignette asks: *what does an
accelerator change?* Each workload is run sequentially (``lax.scan``, one step after the
other) and in parallel (``lax.associative_scan``, ``O(log T)`` depth, about twice the
arithmetic) on the same inputs, for ``T = 10^3 ... 10^6``:

1. **HMM forward filter and forward-backward smoother**, ``K = 2`` and ``K = 16`` states
   (`statseq.inference.hmm` against `statseq.inference.hmm_parallel`), float32, with
   dynamax's sequential and parallel HMM filter as the peer when dynamax imports.
2. **Kalman filter and RTS smoother**, a 4-state, 2-output model
   (`statseq.inference.kalman`, `kalman_parallel` and the square-root associative scan
   `kalman_sqrt_parallel`), float32 and float64, with dynamax's ``lgssm_filter`` (sequential
   and parallel) as the peer.
3. **Selective scan of Mamba's shape** (64 channels x 16 states, float32), forward and
   forward + backward (`statseq.inference.linear_recurrence.selective_scan`).

Every timed function is jitted; ``first`` is the first call (compilation included),
``compile`` its trace/lower/compile part (``jax.monitoring``), ``steady`` the median of
interleaved repeats (`_harness.Timer`). Each row also records the largest relative
difference of the parallel result from the sequential one in the same precision, and for
float32 the difference from a float64 sequential reference, so a fast wrong answer is never
reported as a win. Peak device memory (``memory_stats()``, GPU only) is read after each
workload. Cases are skipped (and the table says so) once ``--budget-s`` has passed.
Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from _harness import Timer, fmt_s, md_table  # noqa: E402

SEED = 20261126


def machine_info():
    import jax

    dev = jax.devices()[0]
    info = {
        "date (UTC)": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "backend": jax.default_backend(),
        "device": getattr(dev, "device_kind", str(dev)),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "cpu count": os.cpu_count(),
    }
    try:
        import dynamax

        info["dynamax"] = getattr(dynamax, "__version__", "?")
    except Exception as exc:  # noqa: BLE001 - the peer is optional
        info["dynamax"] = f"not importable ({type(exc).__name__})"
    return info


def peak_bytes():
    import jax

    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - CPU has none
        return None
    return stats.get("peak_bytes_in_use")


def rel_diff(a, b):
    import jax
    import numpy as np

    la = [np.asarray(x, np.float64) for x in jax.tree.leaves(a)]
    lb = [np.asarray(x, np.float64) for x in jax.tree.leaves(b)]
    worst = 0.0
    for u, v in zip(la, lb, strict=True):
        scale = max(np.max(np.abs(v)), 1e-30)
        worst = max(worst, float(np.max(np.abs(u - v)) / scale))
    return worst


# ----------------------------------------------------------------------------- workloads

def _pick(loglik_ours, loglik_dynamax, field):
    """What is compared across implementations: the log-likelihood (statseq and dynamax
    name it differently) and one array of moments or marginals."""

    def pick(result):
        name = loglik_ours if hasattr(result, str(loglik_ours)) else loglik_dynamax
        arr = getattr(result, field)
        return (getattr(result, name), arr) if name is not None else arr

    return pick


def hmm_inputs(num_states, t_len, dtype):
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng([SEED, num_states, t_len])
    a = rng.dirichlet(np.ones(num_states) * 0.5, size=num_states) + 0.5 * np.eye(num_states)
    a /= a.sum(1, keepdims=True)
    pi = np.full(num_states, 1.0 / num_states)
    ll = rng.normal(size=(t_len, num_states)) * 2.0
    return tuple(jnp.asarray(v, dtype) for v in (pi, a, ll))


def hmm_impls(kind):
    import jax

    from statseq.inference import hmm, hmm_parallel

    out = {}
    if kind == "filter":
        out["statseq sequential"] = jax.jit(lambda p, a, l: hmm.hmm_filter(p, a, l))
        out["statseq parallel"] = jax.jit(lambda p, a, l: hmm_parallel.hmm_filter(p, a, l))
        pick = _pick("marginal_log_lik", "marginal_loglik", "filtered_probs")
    else:
        out["statseq sequential"] = jax.jit(lambda p, a, l: hmm.hmm_smoother(p, a, l))
        out["statseq parallel"] = jax.jit(lambda p, a, l: hmm_parallel.hmm_smoother(p, a, l))
        pick = _pick(None, None, "smoothed_probs")
    try:
        from dynamax.hidden_markov_model import inference as dyn
        from dynamax.hidden_markov_model import parallel_inference as dyn_par

        if kind == "filter":
            out["dynamax sequential"] = jax.jit(lambda p, a, l: dyn.hmm_filter(p, a, l))
            out["dynamax parallel"] = jax.jit(lambda p, a, l: dyn_par.hmm_filter(p, a, l))
        else:
            out["dynamax sequential"] = jax.jit(lambda p, a, l: dyn.hmm_smoother(p, a, l))
            out["dynamax parallel"] = jax.jit(lambda p, a, l: dyn_par.hmm_smoother(p, a, l))
    except Exception:  # noqa: BLE001 - optional peer
        pass
    return out, pick


def lgssm_inputs(t_len, dtype):
    import jax.numpy as jnp
    import numpy as np

    from statseq.inference.kalman import GaussianSSMArrays

    rng = np.random.default_rng([SEED, t_len])
    n, d = 4, 2
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    f = q @ np.diag([0.99, 0.95, 0.9, 0.5]) @ q.T
    h = rng.normal(size=(d, n))
    qc = 0.1 * np.eye(n)
    rc = 0.5 * np.eye(d)
    x = np.zeros(n)
    ys = np.empty((t_len, d))
    lq, lr = np.linalg.cholesky(qc), np.linalg.cholesky(rc)
    for t in range(t_len):
        x = f @ x + lq @ rng.normal(size=n)
        ys[t] = h @ x + lr @ rng.normal(size=d)
    c = lambda v: jnp.asarray(v, dtype)  # noqa: E731
    arrays = GaussianSSMArrays(
        initial_mean=c(np.zeros(n)), initial_cov=c(np.eye(n)), dynamics_weights=c(f),
        dynamics_input_weights=c(np.zeros((n, 0))), dynamics_bias=c(np.zeros(n)),
        dynamics_cov=c(qc), emission_weights=c(h), emission_input_weights=c(np.zeros((d, 0))),
        emission_bias=c(np.zeros(d)), emission_cov=c(rc), initial_diffuse=c(np.zeros((n, 0))))
    mask = jnp.ones((t_len, d), bool)
    inputs = jnp.zeros((t_len, 0), dtype)
    dyn_params = dict(m0=c(np.zeros(n)), p0=c(np.eye(n)), f=c(f), q=c(qc), h=c(h), r=c(rc))
    return arrays, c(ys), mask, inputs, dyn_params


def lgssm_impls(kind):
    import jax

    from statseq.inference import kalman, kalman_parallel, kalman_sqrt_parallel

    if kind == "filter":
        fns = {"statseq sequential": kalman.kalman_filter,
               "statseq parallel": kalman_parallel.parallel_kalman_filter,
               "statseq sqrt parallel": kalman_sqrt_parallel.parallel_sqrt_kalman_filter}
        pick = _pick("marginal_log_lik", "marginal_loglik", "filtered_means")
    else:
        fns = {"statseq sequential": kalman.kalman_smoother,
               "statseq parallel": kalman_parallel.parallel_kalman_smoother,
               "statseq sqrt parallel": kalman_sqrt_parallel.parallel_sqrt_kalman_smoother}
        pick = _pick(None, None, "smoothed_means")
    out = {k: jax.jit(lambda arr, y, m, u, dp, fn=fn: fn(arr, y, m, u)) for k, fn in fns.items()}
    try:
        from dynamax.linear_gaussian_ssm import inference as dyn
        from dynamax.linear_gaussian_ssm import parallel_inference as dyn_par

        def dyn_params(dp):
            import jax.numpy as jnp

            n = dp["f"].shape[0]
            d = dp["h"].shape[0]
            dt = dp["f"].dtype
            return dyn.ParamsLGSSM(
                initial=dyn.ParamsLGSSMInitial(mean=dp["m0"], cov=dp["p0"]),
                dynamics=dyn.ParamsLGSSMDynamics(weights=dp["f"], bias=jnp.zeros(n, dt),
                                                 input_weights=jnp.zeros((n, 0), dt),
                                                 cov=dp["q"]),
                emissions=dyn.ParamsLGSSMEmissions(weights=dp["h"], bias=jnp.zeros(d, dt),
                                                   input_weights=jnp.zeros((d, 0), dt),
                                                   cov=dp["r"]))

        if kind == "filter":
            out["dynamax sequential"] = jax.jit(
                lambda arr, y, m, u, dp: dyn.lgssm_filter(dyn_params(dp), y))
            out["dynamax parallel"] = jax.jit(
                lambda arr, y, m, u, dp: dyn_par.lgssm_filter(dyn_params(dp), y))
        else:
            out["dynamax sequential"] = jax.jit(
                lambda arr, y, m, u, dp: dyn.lgssm_smoother(dyn_params(dp), y))
            out["dynamax parallel"] = jax.jit(
                lambda arr, y, m, u, dp: dyn_par.lgssm_smoother(dyn_params(dp), y))
    except Exception:  # noqa: BLE001 - optional peer
        pass
    return out, pick


def scan_inputs(t_len, dtype):
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng([SEED, t_len, 3])
    d, n = 64, 16
    delta = np.log1p(np.exp(rng.normal(-2.0, 1.0, (t_len, d))))
    x = rng.normal(size=(t_len, d))
    a = -np.tile(np.arange(1, n + 1, dtype=float), (d, 1))
    b = rng.normal(size=(t_len, n))
    c = rng.normal(size=(t_len, n))
    return tuple(jnp.asarray(v, dtype) for v in (delta, x, a, b, c))


def scan_impls(kind):
    import jax
    import jax.numpy as jnp

    from statseq.inference.linear_recurrence import selective_scan

    def fwd(parallel):
        return jax.jit(lambda *a: selective_scan(*a, parallel=parallel)[0])

    def grad(parallel):
        def loss(delta, x, a, b, c):
            return jnp.mean(jnp.tanh(selective_scan(delta, x, a, b, c, parallel=parallel)[0]))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 3, 4)))

    make = fwd if kind == "forward" else grad
    return {"statseq sequential": make(False), "statseq parallel": make(True)}, (lambda r: r)


# ----------------------------------------------------------------------------- driver

# (family, kind, size, dtype, impl) -> (T, steady seconds) of the last timed case
_LAST: dict = {}


def run_case(timer, family, kind, size, t_len, dtype_name, rows, log, skipped, max_call_s):
    import jax
    import jax.numpy as jnp

    dtype = jnp.float64 if dtype_name == "float64" else jnp.float32
    make_inputs = {"hmm": lambda dt: hmm_inputs(size, t_len, dt),
                   "kalman": lambda dt: lgssm_inputs(t_len, dt),
                   "scan": lambda dt: scan_inputs(t_len, dt)}[family]
    impls, pick = {"hmm": hmm_impls, "kalman": lgssm_impls, "scan": scan_impls}[family](kind)
    args = make_inputs(dtype)
    firsts, values = {}, {}
    for name, fn in impls.items():
        last = _LAST.get((family, kind, size, dtype_name, name))
        if last is not None and last[1] * t_len / last[0] > max_call_s:
            predicted = last[1] * t_len / last[0]
            log(f"  {name}: skipped at T={t_len} (predicted {predicted:.0f} s per call from "
                f"T={last[0]})")
            skipped.append(f"{family} {kind} size={size} T={t_len} {name} (predicted "
                           f"{predicted:.0f} s per call from T={last[0]})")
            continue
        try:
            value, wall, comp = timer.first(lambda fn=fn: fn(*args))
        except Exception as exc:  # noqa: BLE001 - record, don't die
            log(f"  {name}: failed ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        firsts[name] = (wall, comp)
        values[name] = pick(value)
    # a call slower than ~1 s is repeated fewer times (the GPU's sequential scans at 10^6)
    slow = max(w - c for w, c in firsts.values()) > 1.0
    stats = timer.rounds({k: (lambda fn=impls[k]: fn(*args)) for k in firsts},
                         min_rounds=1 if slow else None, budget_s=0.0 if slow else None)
    # in a float64 run, also the error of statseq's float32 evaluation (same inputs rounded)
    f32_err = {}
    if dtype_name == "float64" and "statseq sequential" in values:
        args32 = make_inputs(jnp.float32)
        for name in firsts:
            if name.startswith("statseq"):
                v32 = pick(jax.block_until_ready(impls[name](*args32)))
                f32_err[name] = rel_diff(v32, values["statseq sequential"])
    base = stats.get("statseq sequential", {}).get("median")
    label = {"hmm": f"HMM {kind} K={size}", "kalman": f"Kalman {kind} n=4 D=2",
             "scan": f"selective scan {kind} 64x16"}[family]
    for name in firsts:
        med = stats[name]["median"]
        row = dict(workload=label, T=t_len, dtype=dtype_name, impl=name,
                   first_s=firsts[name][0], compile_s=firsts[name][1], steady_s=med,
                   rounds=stats[name]["n"], vs_statseq_sequential=(med / base) if base else None,
                   rel_diff_vs_sequential=rel_diff(values[name], values["statseq sequential"])
                   if "statseq sequential" in values else None,
                   float32_rel_error=f32_err.get(name), peak_bytes=peak_bytes())
        rows.append(row)
        key = (family, kind, size, dtype_name, name)
        if t_len > _LAST.get(key, (0, 0))[0]:
            _LAST[key] = (t_len, med)
        log(f"  {label:32s} T={t_len:>8d} {dtype_name} {name:24s} steady {fmt_s(med):>10s}"
            f"  first {fmt_s(firsts[name][0]):>10s}  ratio {row['vs_statseq_sequential'] or 0:.3g}")


def _sci(x):
    return "" if x is None else f"{x:.1e}"


def render_md(info, rows, skipped):
    out = ["Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), ""]
    headers = ["workload", "T", "dtype", "implementation", "steady", "/ statseq seq",
               "first call", "compile", "rel. diff vs seq", "float32 error"]
    table = []
    order = {"statseq sequential": 0, "statseq parallel": 1, "statseq sqrt parallel": 2,
             "dynamax sequential": 3, "dynamax parallel": 4}
    rows = sorted(rows, key=lambda r: (r["workload"], r["dtype"], r["T"], order.get(r["impl"], 9)))
    for r in rows:
        table.append([r["workload"], f"{r['T']:.0e}".replace("e+0", "e"), r["dtype"], r["impl"],
                      fmt_s(r["steady_s"]),
                      f"{r['vs_statseq_sequential']:.3g}" if r["vs_statseq_sequential"] else "",
                      fmt_s(r["first_s"]), fmt_s(r["compile_s"]),
                      _sci(r["rel_diff_vs_sequential"]), _sci(r["float32_rel_error"])])
    out.append(md_table(headers, table))
    if skipped:
        out += ["", "Skipped (time budget): " + ", ".join(skipped)]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json/.md")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--max-t", type=float, default=1e6, help="largest T")
    parser.add_argument("--lengths", default=None,
                        help="comma-separated T values, run in this order (e.g. 1e4,1e6)")
    parser.add_argument("--tag", default="", help="suffix of the output file names")
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="skip the remaining cases after this many seconds")
    parser.add_argument("--families", default="hmm,kalman,scan")
    parser.add_argument("--max-call-s", type=float, default=4.0,
                        help="skip an implementation whose call is predicted (linearly in T "
                             "from the last length timed) to take longer than this")
    parser.add_argument("--precision", choices=("float32", "float64"), default="float32",
                        help="float64 also reports the error of statseq's float32 results")
    args = parser.parse_args(argv)

    import jax

    x64 = args.precision == "float64"
    jax.config.update("jax_enable_x64", x64)
    started = time.perf_counter()
    info = machine_info()
    info["precision"] = args.precision
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    log(json.dumps(info))
    timer = Timer(min_rounds=3 if args.quick else 5, max_rounds=50,
                  budget_s=0.3 if args.quick else 1.0)
    # the long sequences first: they are what an accelerator is for, and the budget cuts
    # the tail of the list
    lengths = ([int(float(t)) for t in args.lengths.split(",")] if args.lengths else
               [t for t in (10**5, 10**4, 10**6, 10**3) if t <= args.max_t])
    fams = args.families.split(",")
    cases = []
    for t in lengths:
        if "hmm" in fams:
            for k in (2, 16):
                cases += [("hmm", "filter", k, t), ("hmm", "smoother", k, t)]
        if "kalman" in fams:
            cases += [("kalman", "filter", 4, t), ("kalman", "smoother", 4, t)]
        if "scan" in fams:
            cases += [("scan", "forward", 64, t), ("scan", "gradient", 64, t)]
    rows, skipped = [], []
    for fam, kind, size, t in cases:
        if time.perf_counter() - started > args.budget_s:
            skipped.append(f"{fam} {kind} size={size} T={t}")
            continue
        try:
            run_case(timer, fam, kind, size, t, args.precision, rows, log, skipped,
                     args.max_call_s)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: record and go on
            log(f"  {fam} {kind} T={t}: failed ({type(exc).__name__}: {str(exc)[:200]})")
            skipped.append(f"{fam} {kind} size={size} T={t} (failed: {type(exc).__name__})")
    info["total run time"] = f"{time.perf_counter() - started:.0f} s"
    md = render_md(info, rows, skipped)
    print(md)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = dict(info=info, rows=rows, skipped=skipped)
        stem = args.out / f"bench_gpu_{args.precision}{args.tag}"
        stem.with_suffix(".json").write_text(json.dumps(record, indent=1))
        stem.with_suffix(".md").write_text(md + "\n")
        stem.with_suffix(".log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
