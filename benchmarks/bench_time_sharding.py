#!/usr/bin/env python
"""Time sharding: one long sequence split over 1, 2, 4, 8 devices (statseq.distributed.time).

    python benchmarks/bench_time_sharding.py            # CPU, virtual devices, prints tables
    python benchmarks/bench_time_sharding.py --quick    # small T, smoke run (~1 min)
    python benchmarks/bench_time_sharding.py --gpu      # the real devices (GPUs), same workloads

Strong scaling: the same sequence (fixed ``T``) filtered with the time axis split over
``D`` devices, for the HMM filter (3 states, ``T`` up to 10^6), the Kalman filter (2 states,
2 outputs, ``T`` up to 10^5) and a diagonal linear recurrence (16 channels, ``T`` up to
10^6). Each device count runs in a child process (on CPU with
``--xla_force_host_platform_device_count=D``, which must be set before JAX starts; with
``--gpu`` on the first ``D`` real devices, skipping counts beyond those present). Each row
also times the single-device sequential filter in the same process (``seq``) and checks
that the sharded log-likelihood (or states) equals it before anything is timed.

Columns: ``compile`` (first call minus a steady call), ``steady`` (median of interleaved
repeats, `_harness.Timer`), ``per-device MB``: XLA's own account of one device's program
(`Compiled.memory_analysis`: arguments + outputs + temporaries), the number behind the
memory-per-device table of docs/scaling.md.

On a CPU the virtual devices share the machine's cores: with 2 cores, more than 2 devices
cannot run faster, and the associative scan does about twice the work of a sequential loop
(Blelloch), so the CPU numbers show the overhead and the memory split, not a speed-up. The
same script with ``--gpu`` on a multi-GPU host measures the real thing. Speed is reported,
never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

FULL = dict(hmm=[10**4, 10**5, 10**6], kalman=[10**3, 10**4, 10**5], recurrence=[10**5, 10**6])
QUICK = dict(hmm=[10**4], kalman=[10**3], recurrence=[10**4])


def child(num_devices: int, sizes: dict, gpu: bool) -> list[dict]:
    """Run in a fresh process: every workload on ``num_devices`` devices."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT))
    from _harness import Timer

    from statseq.distributed import time as dt
    from statseq.inference import hmm, kalman
    from statseq.inference import linear_recurrence as lr

    devices = jax.devices()[:num_devices]
    if len(devices) < num_devices:
        return []
    mesh = dt.time_mesh(devices)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("time"))
    timer = Timer(min_rounds=3, max_rounds=5, budget_s=1.0)
    rng = np.random.default_rng(0)
    rows = []
    k = 3

    def place(x):  # inputs already split over time, as a user with a long sequence has them
        if getattr(x, "ndim", 0) and x.shape[0] % num_devices == 0 and x.shape[0] > k:
            return jax.device_put(x, sharding)
        return x

    def measure(name, t_len, sharded, seq, args, compare):
        local = jax.device_put(args, devices[0])  # the sequential filter's input: one device
        args = jax.tree.map(place, args)
        t0 = time.perf_counter()
        compiled = jax.jit(sharded).lower(*args).compile()
        compile_s = time.perf_counter() - t0
        mem = compiled.memory_analysis()
        per_device = (None if mem is None else (mem.argument_size_in_bytes
                      + mem.output_size_in_bytes + mem.temp_size_in_bytes) / 2**20)
        f_seq = jax.jit(seq)
        got, _, _ = timer.first(lambda: compiled(*args))
        want, _, _ = timer.first(lambda: f_seq(*local))
        err = float(np.max(np.abs(np.asarray(compare(got)) - np.asarray(compare(want)))))
        res = timer.rounds({"sharded": lambda: compiled(*args), "seq": lambda: f_seq(*local)})
        rows.append(dict(workload=name, T=t_len, D=num_devices, first=compile_s,
                         steady=res["sharded"]["median"], seq=res["seq"]["median"],
                         err=err, mb=per_device, device=str(devices[0].platform)))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    pi = jnp.full(k, 1.0 / k)
    trans = jnp.array(0.9 * np.eye(k) + 0.1 / k)
    for t_len in sizes["hmm"]:
        ll = jnp.array(rng.normal(size=(t_len, k)))
        measure("HMM filter (K = 3)", t_len,
                lambda p, a, x: dt.hmm_filter_time_sharded(p, a, x, mesh=mesh),
                hmm.hmm_filter, (pi, trans, ll), lambda r: r.marginal_log_lik)

    n = 2
    arr = kalman.GaussianSSMArrays(
        jnp.zeros(n), jnp.eye(n), jnp.array([[0.9, 0.1], [-0.2, 0.8]]), jnp.zeros((n, 0)),
        jnp.zeros(n), 0.3 * jnp.eye(n), jnp.array([[1.0, 0.0], [0.5, 1.0]]),
        jnp.zeros((n, 0)), jnp.zeros(n), 0.5 * jnp.eye(n), jnp.zeros((n, 0)))
    for t_len in sizes["kalman"]:
        y = jnp.array(rng.normal(size=(t_len, n)))
        mask = jnp.ones((t_len, n), bool)
        u = jnp.zeros((t_len, 0))
        measure("Kalman filter (n = 2)", t_len,
                lambda a, b, c, d: dt.kalman_filter_time_sharded(a, b, c, d, mesh=mesh),
                kalman.kalman_filter, (arr, y, mask, u), lambda r: r.marginal_log_lik)

    for t_len in sizes["recurrence"]:
        a = jnp.array(rng.uniform(0.9, 0.999, (t_len, 16)))
        b = jnp.array(rng.normal(size=(t_len, 16)))
        measure("linear recurrence (16 ch.)", t_len,
                lambda x, z: dt.linear_recurrence_time_sharded(x, z, mesh=mesh),
                lambda x, z: lr.linear_recurrence(x, z, parallel=False), (a, b),
                lambda h: h[-1])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpu", action="store_true", help="real devices, no virtual CPUs")
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--json", default="", help="also write the rows to this file")
    parser.add_argument("--only", default="", help="one workload: hmm, kalman or recurrence")
    parser.add_argument("--min-t", type=int, default=0, help="skip shorter sequences")
    args = parser.parse_args()
    sizes = {name: [t for t in ts if t >= args.min_t and args.only in ("", name)]
             for name, ts in (QUICK if args.quick else FULL).items()}
    if args.child:
        print("ROWS" + json.dumps(child(args.child, sizes, args.gpu)))
        return
    rows = []
    for d in (int(v) for v in args.devices.split(",")):
        env = dict(os.environ)
        if not args.gpu:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                                + f" --xla_force_host_platform_device_count={d}").strip()
            env["JAX_PLATFORMS"] = "cpu"
        cmd = [sys.executable, __file__, "--child", str(d), "--only", args.only,
               "--min-t", str(args.min_t)] + (["--quick"] if args.quick else []) + (
            ["--gpu"] if args.gpu else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            continue
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("ROWS"))
        rows += json.loads(line[4:])
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load {Path('/proc/loadavg').read_text().split()[:3]}")
    print("| workload | T | devices | sharded steady | sequential (1 device) | ratio | "
          "compile | per-device MB | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["workload"], r["T"], r["D"])):
        mb = "–" if r["mb"] is None else f"{r['mb']:.1f}"
        print(f"| {r['workload']} | {r['T']:.0e} | {r['D']} | {r['steady']:.3g} s | "
              f"{r['seq']:.3g} s | {r['steady'] / r['seq']:.2f} | {r['first']:.3g} s | {mb} | "
              f"{r['err']:.1e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
