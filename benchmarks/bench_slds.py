#!/usr/bin/env python
"""Switching LDS benchmarks: the Rao-Blackwellized particle filter against dynamax's, and
blocked Gibbs sweeps per second against T and K.

    python benchmarks/bench_slds.py            # prints markdown (stdout), progress (stderr)
    python benchmarks/bench_slds.py --quick    # fewer seeds and sweeps, Gibbs T <= 1000
    python benchmarks/bench_slds.py --only gibbs --T 10000 --K 2 4   # one part, a subset

Compile-bound: on the shared 2-core machine at load 12-19 (Nov 26) dynamax's two filters
took about 2 minutes each to compile and `fit_gibbs` 1-2.5 minutes per (T, K), so
`--quick` took about 14 minutes up to its T = 100 Gibbs rows and a full run would take
about half an hour; split it with ``--only``/``--T``/``--K``. On an idle machine expect a
fraction of that (not measured).

1. **RBPF.** One simulated SLDS (K = 2 regimes, n = 2 states, D = 2 series, T = 200,
   float64), N = 100 particles (dynamax's optimal resampling builds an ``(N K) x (N K)``
   matrix per step, so N stays small). statseq's `SwitchingLDS.particle_filter` with the
   optimal proposal against ``dynamax.slds.inference.rbpfilter_optimal`` (Fearnhead &
   Clifford's optimal resampling), and with the prior proposal against
   ``dynamax.slds.inference.rbpfilter``; each jitted, compile timed separately (first call
   minus steady median), steady state the median of repeats with new keys. dynamax returns
   normalized weights only (no likelihood estimate), so accuracy is compared on the
   filtered regime probabilities against Kim's filter (mean absolute difference); statseq's
   log-likelihood estimates are reported over seeds against Kim's value. Conventions
   differ at t = 0: dynamax propagates its initial law one step (and samples the initial
   state instead of keeping its Gaussian), statseq observes ``x_0 ~ N(m, V)`` directly;
   both get the same ``m, V``.
2. **Gibbs.** `SwitchingLDS.fit_gibbs` (parameters, regimes and states: one sweep = x | z,
   z | x, pi, P, dynamics and emission blocks), n = 2, D = 2, T in {100, 1000, 10000},
   K in {2, 4, 8}: sweeps per second in the steady state (second call, same compiled
   program) and the first call's compile overhead. ``fit_vem`` is not in this base.

Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import statseq as ss  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def block(x):
    return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready")
                        else a, x)


def make_params(model, rng):
    """Distinct, persistent regimes: slow/quiet vs fast/noisy dynamics."""
    k, n, d = model.num_regimes, model.state_dim, model.dim
    p = model.default_params()
    stay = 0.95 if k == 2 else 0.9
    trans = np.full((k, k), (1 - stay) / (k - 1)) + np.eye(k) * (stay - (1 - stay) / (k - 1))
    rho = np.linspace(0.95, -0.3, k)
    noise = np.geomspace(0.05, 1.0, k)
    dyn = np.stack([r * np.eye(n) + 0.05 * rng.standard_normal((n, n)) for r in rho])
    return p._replace(
        initial_probs=np.full(k, 1.0 / k), transitions=trans,
        initial_means=np.zeros((k, n)), initial_covs=np.tile(np.eye(n), (k, 1, 1)),
        dynamics_weights=dyn, dynamics_bias=np.linspace(-0.5, 0.5, k)[:, None] * np.ones(n),
        dynamics_cov=noise[:, None, None] * np.eye(n),
        emission_weights=rng.standard_normal((d, n)), emission_bias=np.zeros(d),
        emission_cov=0.1 * np.eye(d))


def timed(fn, repeats):
    t0 = time.perf_counter()
    block(fn(0))
    first = time.perf_counter() - t0
    times = []
    for r in range(1, repeats + 1):
        t0 = time.perf_counter()
        block(fn(r))
        times.append(time.perf_counter() - t0)
    steady = statistics.median(times)
    return first, steady


def bench_rbpf(args):
    from dynamax.slds.inference import (
        DiscreteParamsSLDS,
        LGParamsSLDS,
        ParamsSLDS,
        rbpfilter,
        rbpfilter_optimal,
    )

    K, n, D, T, N = 2, 2, 2, 200, args.particles
    model = ss.SwitchingLDS(num_regimes=K, state_dim=n, emission_dim=D,
                            switching_emission=False)
    params = make_params(model, np.random.default_rng(0))
    y = np.asarray(ss.sample(model, params, num_timesteps=T, key=jax.random.key(0)))
    kim_filt = model.filter_states(params, y)
    kim_ll = float(ss.log_prob(model, params, y))
    kim_p = np.asarray(kim_filt.filtered_probs)

    dparams = ParamsSLDS(
        discrete=DiscreteParamsSLDS(jnp.asarray(params.initial_probs),
                                    jnp.asarray(params.transitions),
                                    jnp.asarray(params.transitions)),
        linear_gaussian=LGParamsSLDS(
            initial_mean=jnp.asarray(params.initial_means),
            initial_cov=jnp.asarray(params.initial_covs),
            dynamics_weights=jnp.asarray(params.dynamics_weights),
            dynamics_cov=jnp.asarray(params.dynamics_cov),
            dynamics_bias=jnp.asarray(params.dynamics_bias),
            dynamics_input_weights=jnp.zeros((K, n, 1)),
            emission_weights=jnp.tile(jnp.asarray(params.emission_weights), (K, 1, 1)),
            emission_cov=jnp.tile(jnp.asarray(params.emission_cov), (K, 1, 1)),
            emission_bias=jnp.zeros((K, D)), emission_input_weights=jnp.zeros((K, D, 1)),
            initialized=True))
    yj = jnp.asarray(y)
    dyn_opt = jax.jit(lambda key: rbpfilter_optimal(N, dparams, yj, key))
    dyn_prior = jax.jit(lambda key: rbpfilter(N, dparams, yj, key, ess_threshold=0.5))

    def dyn_probs(out):
        w, s = np.asarray(out["weights"]), np.asarray(out["states"])
        return np.stack([(w * (s == k)).sum(1) for k in range(K)], -1)

    rows, ll_rows = [], []
    for label, proposal, thr, peer in [("optimal proposal", "optimal", 1.0, dyn_opt),
                                       ("prior proposal", "prior", 0.5, dyn_prior)]:
        ours = lambda r, proposal=proposal, thr=thr: model.particle_filter(  # noqa: E731
            params, y, key=jax.random.key(100 + r), num_particles=N, proposal=proposal,
            ess_threshold=thr)
        theirs = lambda r, peer=peer: peer(jax.random.PRNGKey(100 + r))  # noqa: E731
        log(f"rbpf {label}: statseq")
        f_s, s_s = timed(ours, args.repeats)
        log(f"rbpf {label}: dynamax")
        f_d, s_d = timed(theirs, args.repeats)
        errs_s = [np.mean(np.abs(np.asarray(ours(r).filtered_probs) - kim_p))
                  for r in range(args.seeds)]
        errs_d = [np.mean(np.abs(dyn_probs(theirs(r)) - kim_p)) for r in range(args.seeds)]
        lls = np.array([float(ours(r).marginal_log_lik) for r in range(args.seeds)])
        rows.append((label, f_s - s_s, s_s, f_d - s_d, s_d, s_d / s_s,
                     np.mean(errs_s), np.mean(errs_d)))
        ll_rows.append((label, N, lls.mean(), lls.std(ddof=1), lls.mean() - kim_ll))
    # a larger particle count for statseq only (dynamax's resampling is O((NK)^2) per step)
    big = 10 * N
    lls = np.array([float(model.particle_filter(params, y, key=jax.random.key(500 + r),
                                                num_particles=big).marginal_log_lik)
                    for r in range(args.seeds)])
    ll_rows.append(("optimal proposal", big, lls.mean(), lls.std(ddof=1),
                    lls.mean() - kim_ll))

    print(f"\n### RBPF: K={K}, n={n}, D={D}, T={T}, N={N} particles, float64\n")
    print("| filter | statseq compile (s) | statseq per filter (ms) | dynamax compile (s) "
          "| dynamax per filter (ms) | dynamax / statseq | mean abs err p(z_t) vs Kim, "
          "statseq | same, dynamax |")
    print("|---|---|---|---|---|---|---|---|")
    for lab, cs, ss_, cd, sd, ratio, es, ed in rows:
        print(f"| {lab} | {cs:.2f} | {1e3 * ss_:.2f} | {cd:.2f} | {1e3 * sd:.2f} | "
              f"{ratio:.1f}x | {es:.4f} | {ed:.4f} |")
    print(f"\nstatseq log-likelihood estimates over {args.seeds} seeds; Kim's (collapsed, "
          f"approximate) value {kim_ll:.3f}. dynamax returns no likelihood estimate.\n")
    print("| proposal | N | mean log p^ | sd over seeds | mean - Kim |")
    print("|---|---|---|---|---|")
    for lab, nn, m, s, dlt in ll_rows:
        print(f"| {lab} | {nn} | {m:.3f} | {s:.3f} | {dlt:+.3f} |")


def bench_gibbs(args):
    Ts = args.T or ([100, 1000] if args.quick else [100, 1000, 10000])
    Ks = args.K or [2, 4, 8]
    S = args.sweeps
    print(f"\n### Blocked Gibbs (`fit_gibbs`): n=2, D=2, {S} burn-in + {S} kept sweeps "
          "per call, float64\n")
    print("| T | K | first call (s) | compile+trace overhead (s) | steady call (s) "
          "| sweeps/s | ms per sweep per 1000 steps |")
    print("|---|---|---|---|---|---|---|")
    for T in Ts:
        for K in Ks:
            model = ss.SwitchingLDS(num_regimes=K, state_dim=2, emission_dim=2)
            params = make_params(model, np.random.default_rng(K))
            params = params._replace(emission_weights=np.tile(params.emission_weights,
                                                              (K, 1, 1)),
                                     emission_bias=np.zeros((K, 2)),
                                     emission_cov=np.tile(params.emission_cov, (K, 1, 1)))
            y = np.asarray(ss.sample(model, params, num_timesteps=T, key=jax.random.key(T)))
            log(f"gibbs T={T} K={K}")
            def fn(r, model=model, params=params, y=y):
                return model.fit_gibbs(params, y, key=jax.random.key(r), num_samples=S,
                                       num_burnin=S)

            first, steady = timed(fn, 1)
            rate = 2 * S / steady
            print(f"| {T} | {K} | {first:.2f} | {first - steady:.2f} | {steady:.3f} | "
                  f"{rate:.1f} | {1e3 / rate / (T / 1000):.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["rbpf", "gibbs"], default=None,
                    help="run one part only")
    ap.add_argument("--T", type=int, nargs="*", default=None, help="Gibbs lengths")
    ap.add_argument("--K", type=int, nargs="*", default=None, help="Gibbs regime counts")
    args = ap.parse_args()
    args.particles = 100
    args.seeds = 10 if args.quick else 30
    args.repeats = 3 if args.quick else 7
    args.sweeps = 10 if args.quick else 20
    start = time.time()
    load0 = os.getloadavg()
    print(f"## Switching LDS (`bench_slds.py{' --quick' if args.quick else ''}`)\n")
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} CPUs; "
          f"load average at start {load0[0]:.1f}")
    if args.only in (None, "rbpf"):
        bench_rbpf(args)
    if args.only in (None, "gibbs"):
        bench_gibbs(args)
    print(f"\nload average at end {os.getloadavg()[0]:.1f}; wall {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
