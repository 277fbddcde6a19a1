"""Data-parallel scaling (statseq.distributed): strong and weak scaling of a sharded batch.

Strong scaling: a fixed batch of sequences spread over 1, 2, 4, 8 devices. Weak scaling: a
fixed number of sequences per device. Timed: ``log_prob`` (one forward filter) and ``fit_em``
(5 iterations, tol=None) of a 4-state Poisson HMM, and ``fit_sgd`` (5 full-batch steps) of a
GRU, each as the median of repeats after a compiled warm-up.

On CPU each device count runs in its own process with ``--xla_force_host_platform_device_count``
(virtual devices share the machine's cores: on a 2-core machine no more than 2x can show).
With ``--real`` the script uses the real devices of the platform (GPUs), one process per
count, ``jax.devices()[:count]``.

    python benchmarks/bench_scaling.py                 # CPU, virtual devices 1 2 4 8
    python benchmarks/bench_scaling.py --real --counts 1 2 4 8   # a multi-GPU host
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def worker(count: int, real: bool, strong_n: int, weak_n: int, length: int, repeats: int):
    import jax
    import numpy as np
    import optax

    import statseq as ss
    from statseq.distributed import data_mesh, shard_batch

    devices = jax.devices()[:count]
    assert len(devices) == count, (count, jax.devices())
    mesh = data_mesh(devices)
    rng = np.random.default_rng(0)
    hmm = ss.PoissonHMM(num_states=4)
    gru = ss.GRU(hidden_dim=16)
    opt = optax.adam(1e-3)
    rows = []
    for mode, n in (("strong", strong_n), ("weak", weak_n * count)):
        y = rng.poisson(3.0, size=(n, length))
        yr = np.log1p(y.astype(float))
        p_hmm = hmm.initialize(y, key=jax.random.key(0))
        p_gru = gru.initialize(yr, key=jax.random.key(0))
        b = shard_batch(y, mesh=mesh)
        br = shard_batch(yr, mesh=mesh)
        jobs = {
            "log_prob": lambda p=p_hmm, b=b: ss.log_prob(hmm, p, b.y, mask=b.mask),
            "fit_em_5": lambda p=p_hmm, b=b: ss.fit_em(
                hmm, p, b.y, mask=b.mask, num_iters=5, tol=None, progress=False).params,
            "fit_sgd_gru_5": lambda p=p_gru, b=br: ss.fit_sgd(
                gru, p, b.y, mask=b.mask, num_steps=5, key=jax.random.key(1), optimizer=opt,
                progress=False).params,
        }
        for name, job in jobs.items():
            jax.block_until_ready(job())  # compile
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(job())
                times.append(time.perf_counter() - t0)
            rows.append(dict(mode=mode, devices=count, sequences=n, length=length, job=name,
                             seconds=float(np.median(times)),
                             platform=devices[0].platform))
    print(json.dumps(rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--real", action="store_true", help="use the platform's real devices")
    ap.add_argument("--strong-n", type=int, default=64, help="sequences, strong scaling")
    ap.add_argument("--weak-n", type=int, default=16, help="sequences per device, weak")
    ap.add_argument("--length", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker, args.real, args.strong_n, args.weak_n, args.length, args.repeats)
        return
    rows = []
    for count in args.counts:
        env = dict(os.environ, JAX_ENABLE_X64="1",
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        if not args.real:
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={count}"
            env["JAX_PLATFORMS"] = "cpu"
        cmd = [sys.executable, __file__, "--worker", str(count), "--strong-n",
               str(args.strong_n), "--weak-n", str(args.weak_n), "--length", str(args.length),
               "--repeats", str(args.repeats)] + (["--real"] if args.real else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rows += json.loads(out.stdout.strip().splitlines()[-1])
    base = {(r["mode"], r["job"]): r["seconds"] for r in rows if r["devices"] == args.counts[0]}
    print(f"{'mode':7s} {'job':14s} {'devices':>7s} {'seqs':>6s} {'seconds':>9s}")
    for r in rows:
        ratio = base[(r["mode"], r["job"])] / r["seconds"]
        label = "speed-up" if r["mode"] == "strong" else "efficiency"
        print(f"{r['mode']:7s} {r['job']:14s} {r['devices']:7d} {r['sequences']:6d} "
              f"{r['seconds']:9.4f} {label} {ratio:5.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
