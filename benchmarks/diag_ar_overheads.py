#!/usr/bin/env python
"""Diagnostics behind the performance notes in RESULTS.md (not a peer comparison).

    python benchmarks/diag_ar_overheads.py [--cpus 0]

Each part measures one suspected cost in statseq's AR path and, where there is an obvious
alternative, times that alternative on the same data (checking it gives the same number):

A. ``ss.log_prob``'s per-call cost split into ``validate_params``, ``prepare_data`` and the
   jitted core; and how many XLA programs the first call in a process compiles.
B. The complete-data fast path (``AR.complete_data_log_probs`` under ``_filter_flat``)
   against a variant that applies the inverse Cholesky factor by a matmul instead of a
   triangular solve with T right-hand sides, and forms the mean from per-lag matmuls.
C. The triangular solve alone: ``solve_triangular(L, r)`` with r of shape (1, T).
D. The generic scan filter with ``lax.scan(..., unroll=k)``.
E. The persistent compilation cache threshold: warm-cache first ``log_prob`` in a fresh
   process with statseq's 0.1 s minimum compile time and with 0.

All timings: medians (and minima) of repeated calls, float64, this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timeit(fn, n=30):
    import jax

    jax.block_until_ready(fn())
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def ms(pair):
    med, low = pair
    return f"{med * 1e3:8.3f} ms (min {low * 1e3:.3f})"


def child_first_log_prob():
    """Fresh process: time the first exact log_prob (after least squares); print JSON."""
    import jax

    import statseq as ss

    jax.config.update("jax_enable_x64", True)
    if os.environ.get("DIAG_MIN_COMPILE_TIME"):
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["DIAG_MIN_COMPILE_TIME"]))
    sys.path.insert(0, str(HERE))
    from bench_ar import simulate

    y = simulate(1000)
    model = ss.AR(order=2, initial="stationary")
    params = model.fit_least_squares(y)
    t0 = time.perf_counter()
    float(ss.log_prob(model, params, y))
    print(json.dumps({"log_prob": time.perf_counter() - t0}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpus", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cpus is not None:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    if args.child:
        child_first_log_prob()
        return
    os.environ["STATSEQ_NO_COMPILATION_CACHE"] = "1"
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import statseq as ss
    from statseq.core.params import validate_params
    from statseq.core.recurrence import _filter_flat, pairwise_sum
    from statseq.core.validation import prepare_data

    sys.path.insert(0, str(HERE))
    from bench_ar import simulate

    print(f"load average at start: {Path('/proc/loadavg').read_text().split()[:3]}")
    model_c = ss.AR(order=2)

    # ---- A ---------------------------------------------------------------------------
    print("\nA. ss.log_prob per-call cost, T=1000 (conditional AR(2))")
    y = simulate(1000)
    params = model_c.fit_least_squares(y)
    events = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda e, d, **_: events.append((e, d)) if "backend_compile" in e else None)
    t0 = time.perf_counter()
    float(ss.log_prob(model_c, params, y))
    first = time.perf_counter() - t0
    print(f"  first call {first:.2f} s: {len(events)} XLA programs compiled, "
          f"{sum(d for _, d in events):.2f} s of backend compile "
          f"(largest {max(d for _, d in events):.2f} s)")
    y_flat = jnp.asarray(y)[None]
    mask = jnp.ones((1, 1000), bool)
    inputs = jnp.zeros((1, 1000, 0))
    print("  ss.log_prob            ", ms(timeit(lambda: ss.log_prob(model_c, params, y))))
    print("  validate_params        ", ms(timeit(lambda: validate_params(model_c, params))))
    print("  prepare_data           ", ms(timeit(lambda: prepare_data(model_c, y))))
    print("  jitted core            ", ms(timeit(
        lambda: _filter_flat(model_c, params, y_flat, mask, inputs, complete=True)[0])))

    # ---- B, C ------------------------------------------------------------------------
    def proposed(model, params, y, inputs):
        """Conditional AR log-likelihood: inverse factor by matmul, mean by per-lag matmuls."""
        p, d = model.order, model.dim
        y = jnp.reshape(y, (y.shape[0], d))
        t_len = y.shape[0]
        lags = jnp.concatenate([jnp.zeros((p, d), y.dtype), y], axis=0)
        mean = params.intercept + inputs @ params.input_weights.T
        for k in range(1, p + 1):
            mean = mean + lags[p - k: p - k + t_len] @ params.coeffs[k - 1].T
        chol = jnp.linalg.cholesky(params.cov)
        chol_inv = jax.scipy.linalg.solve_triangular(chol, jnp.eye(d, dtype=y.dtype), lower=True)
        z = (y - mean) @ chol_inv.T
        lp = (-0.5 * jnp.sum(z**2, axis=1) - jnp.sum(jnp.log(jnp.diagonal(chol)))
              - 0.5 * d * jnp.log(2 * jnp.pi))
        return pairwise_sum(lp.at[:p].set(0.0))

    print("\nB. conditional fast path: current _filter_flat(complete=True) vs proposed variant")
    print("C. solve_triangular(L (1x1), r (1,T)) vs r.T @ inv(L).T")
    for t_len in (10**4, 10**5, 10**6):
        y = simulate(t_len)
        params = model_c.fit_least_squares(y)
        y_flat = jnp.asarray(y)[None]
        mask = jnp.ones((1, t_len), bool)
        inputs = jnp.zeros((1, t_len, 0))
        cur = _filter_flat(model_c, params, y_flat, mask, inputs, complete=True)[0][0]
        prop = jax.jit(partial(proposed, model_c))
        new = prop(params, y_flat[0], inputs[0])
        print(f"  T={t_len:>8}  current {ms(timeit(lambda: _filter_flat(model_c, params, y_flat, mask, inputs, complete=True)[0]))}"  # noqa: E501, B023
              f"  proposed {ms(timeit(lambda: prop(params, y_flat[0], inputs[0])))}"  # noqa: B023
              f"  |diff| {abs(float(cur) - float(new)):.1e}")
        chol = jnp.linalg.cholesky(params.cov)
        r = y_flat
        trsm = jax.jit(lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True))
        matmul = jax.jit(lambda a, b: (b.T @ jax.scipy.linalg.solve_triangular(
            a, jnp.eye(1, dtype=b.dtype), lower=True).T).T)
        print(f"  {'':10}  trsm    {ms(timeit(lambda: trsm(chol, r)))}"  # noqa: B023
              f"  inv+matmul {ms(timeit(lambda: matmul(chol, r)))}")  # noqa: B023

    # ---- D ---------------------------------------------------------------------------
    print("\nD. generic scan filter, T=100000, lax.scan unroll")
    from statseq.core.distributions import masked_log_prob

    def scan_filter(model, params, y, mask, inputs, unroll):
        num_conditioned = getattr(model, "num_conditioned_steps", 0)

        def step(carry, xs):
            t, y_t, m_t, u_t = xs
            lp = masked_log_prob(model.predict(params, carry, u_t), y_t, m_t)
            lp = jnp.where(t >= num_conditioned, lp, 0.0)
            return model.update(params, carry, y_t, m_t, u_t), lp

        steps = jnp.arange(y.shape[0])
        _, lps = jax.lax.scan(step, model.initial_carry(params), (steps, y, mask, inputs),
                              unroll=unroll)
        return pairwise_sum(lps)

    y = simulate(10**5)
    params = model_c.fit_least_squares(y)
    y_flat = jnp.asarray(y)[None]
    mask = jnp.ones((1, 10**5), bool)
    inputs = jnp.zeros((1, 10**5, 0))
    ref = float(_filter_flat(model_c, params, y_flat, mask, inputs, complete=False)[0][0])
    print("  _filter_flat(complete=False)", ms(timeit(
        lambda: _filter_flat(model_c, params, y_flat, mask, inputs, complete=False)[0], n=5)))
    for unroll in (1, 4, 8):
        fn = jax.jit(partial(scan_filter, model_c, unroll=unroll))
        value = float(fn(params, y_flat[0], mask[0], inputs[0]))
        print(f"  unroll={unroll:<2}                   "
              f"{ms(timeit(lambda: fn(params, y_flat[0], mask[0], inputs[0]), n=5))}"  # noqa: B023
              f"  |diff| {abs(value - ref):.1e}")

    # ---- E ---------------------------------------------------------------------------
    print("\nE. warm persistent cache: first exact log_prob in a fresh process (T=1000)")
    for label, threshold in (("statseq default (0.1 s minimum)", None), ("minimum 0 s", "0")):
        with tempfile.TemporaryDirectory() as cache:
            env = {k: v for k, v in os.environ.items()
                   if k not in ("STATSEQ_NO_COMPILATION_CACHE", "DIAG_MIN_COMPILE_TIME")}
            env["STATSEQ_CACHE_DIR"] = cache
            if threshold is not None:
                env["DIAG_MIN_COMPILE_TIME"] = threshold
            times = []
            for _ in range(2):  # cold, then warm
                out = subprocess.run([sys.executable, __file__, "--child"], env=env,
                                     capture_output=True, text=True, check=True)
                times.append(json.loads(out.stdout.strip().splitlines()[-1])["log_prob"])
            files = sum(1 for f in Path(cache).rglob("*") if f.is_file())
            print(f"  {label:<32} cold {times[0]:.2f} s, warm {times[1]:.2f} s "
                  f"({files} cache files)")
    print(f"\nload average at end: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
