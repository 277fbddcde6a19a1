#!/usr/bin/env python
"""Switching LDS: variational EM iterations and Gibbs sweeps per second against T and K.

    python benchmarks/bench_slds_vem.py            # T in (100, 1000), K in (2, 4)
    python benchmarks/bench_slds_vem.py --quick    # T = 100 only

Model: ``SwitchingLDS(num_regimes=K, state_dim=2, emission_dim=2)`` at its default
parameters, one simulated sequence (fixed key), float64, XLA fully optimized (no -O0).
``fit_vem`` runs a fixed ``N`` iterations (``tol=None``); the Gibbs sampler is the compiled
chain behind ``fit_gibbs`` (`statseq.models.switching._slds_gibbs.run_gibbs`: x | z, z | x
and the conjugate parameter blocks per sweep). The first call (compile + run) and the
median of 3 further calls are reported; per-iteration time is the median divided by ``N``.
Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import statseq as ss  # noqa: E402
from statseq.models.switching._slds_gibbs import resolved_prior, run_gibbs  # noqa: E402


def _timed(fn, repeats=3):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        runs.append(time.perf_counter() - start)
    return first, float(np.median(runs))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lengths = (100,) if args.quick else (100, 1000)
    iters = 20
    rows = []
    for k in (2, 4):
        model = ss.SwitchingLDS(num_regimes=k, state_dim=2, emission_dim=2)
        p = model.default_params()
        for t_len in lengths:
            y = ss.sample(model, p, num_timesteps=t_len, key=jax.random.key(0))
            vem = partial(model.fit_vem, p, y, num_iters=iters, tol=None)
            first, med = _timed(lambda f=vem: f().elbo)
            rows.append(("fit_vem", k, t_len, first, med / iters))
            yf = jnp.reshape(y, (1, t_len, 2))
            m = jnp.ones_like(yf, bool)
            u = jnp.zeros((1, t_len, 0))
            prior = resolved_prior(model, None, jnp.float64)
            chain = partial(run_gibbs, model, p, prior, yf, m, u, jax.random.key(1),
                            num_samples=iters, num_burnin=0)
            first, med = _timed(lambda f=chain: f()[0])
            rows.append(("Gibbs sweep", k, t_len, first, med / iters))
    print("| method | K | T | first call (compile + run) | per iteration | iterations / s |")
    print("|---|---|---|---|---|---|")
    for name, k, t_len, first, per in rows:
        print(f"| {name} | {k} | {t_len} | {first:.2f} s | {per * 1e3:.2f} ms | "
              f"{1.0 / per:.0f} |")


if __name__ == "__main__":
    main()
