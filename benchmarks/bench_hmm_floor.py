#!/usr/bin/env python
"""HMM filter and smoother against the compiled floor (issue 13, point 1).

    nice -n 10 python benchmarks/bench_hmm_floor.py            # full run, prints markdown
    nice -n 10 python benchmarks/bench_hmm_floor.py --quick    # smaller T, shorter rounds
    nice -n 10 python benchmarks/bench_hmm_floor.py --record   # also write ratios/hmm.json

Every implementation gets the same (T, K) table of log-likelihoods (simulated Poisson HMM,
fixed seed) and its answer is checked against the numba loop before anything is timed:

- ``statseq core``: ``jax.jit(hmm_filter)`` / ``jax.jit(hmm_smoother)``;
- ``statseq core before``: the same call on a frozen copy of the module before issue 13
  (``statseq/inference/hmm.py`` at commit a454811, read with ``git show``), the "before" column;
- ``statseq public``: ``model.filter_states`` / ``model.smoother`` of a ``PoissonHMM`` on
  the observations (input checks, emission log-likelihoods, the core);
- ``hmmlearn C++``: ``hmmlearn._hmmc.forward_scaling`` (+ ``backward_scaling`` and
  ``compute_scaling_xi_sum`` for the smoother), given the likelihood table ``exp(ll)``
  precomputed (its natural input, so the exponentials are not in its time);
- ``numba``: an ``@njit`` loop of exactly statseq's scaled recursion (the floor), which
  takes ``ll`` and exponentiates inside, like statseq.

float32 (in a child process with x64 off): statseq core against dynamax's jitted
``hmm_filter`` / ``hmm_smoother``. Times are steady state (compile excluded; compile time
of the first call is reported separately), medians and minima over rounds interleaved in
one process; ratios are statseq / reference, per round (median) and of the minima.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (  # noqa: E402
    Timer,
    fmt_s,
    load_average,
    load_module_at,
    md_table,
    paired_ratio,
    record_ratios,
)

SEED = 20261126


def simulate(num_states, num_timesteps, batch=None, seed=SEED):
    """A sticky Poisson HMM's observations and parameters (NumPy)."""
    import numpy as np

    rng = np.random.default_rng(seed + num_states)
    a = np.full((num_states, num_states), 0.1 / max(num_states - 1, 1))
    np.fill_diagonal(a, 0.9 if num_states > 1 else 1.0)
    pi = np.full(num_states, 1.0 / num_states)
    rates = np.linspace(1.0, 3.0 * num_states, num_states)
    shape = (num_timesteps,) if batch is None else (batch, num_timesteps)
    z = np.zeros(shape, int)
    z[..., 0] = rng.integers(num_states, size=shape[:-1])
    cum = np.cumsum(a, axis=1)
    u = rng.random(shape)
    for t in range(1, num_timesteps):
        z[..., t] = np.minimum((u[..., t, None] > cum[z[..., t - 1]]).sum(-1), num_states - 1)
    y = rng.poisson(rates[z]).astype(float)
    return pi, a, rates, y


def log_likelihoods(rates, y):
    import numpy as np
    from scipy.special import gammaln

    return y[..., None] * np.log(rates) - rates - gammaln(y[..., None] + 1.0)


def numba_kernels():
    import numba
    import numpy as np

    @numba.njit(cache=False, fastmath=False)
    def forward(pi, a, ll, pred_out, filt_out, lognorm_out):
        num_t, k = ll.shape
        pred = pi.copy()
        for t in range(num_t):
            m = ll[t, 0]
            for i in range(1, k):
                m = max(m, ll[t, i])
            s = 0.0
            for i in range(k):
                pred_out[t, i] = pred[i]
                u = pred[i] * np.exp(ll[t, i] - m)
                filt_out[t, i] = u
                s += u
            for i in range(k):
                filt_out[t, i] /= s
            lognorm_out[t] = np.log(s) + m
            for j in range(k):
                acc = 0.0
                for i in range(k):
                    acc += filt_out[t, i] * a[i, j]
                pred[j] = acc
        return lognorm_out.sum()

    @numba.njit(cache=False)
    def filter_(pi, a, ll):
        num_t, k = ll.shape
        pred = np.empty((num_t, k))
        filt = np.empty((num_t, k))
        lognorm = np.empty(num_t)
        total = forward(pi, a, ll, pred, filt, lognorm)
        return total, filt

    @numba.njit(cache=False)
    def smoother(pi, a, ll):
        num_t, k = ll.shape
        pred = np.empty((num_t, k))
        filt = np.empty((num_t, k))
        lognorm = np.empty(num_t)
        total = forward(pi, a, ll, pred, filt, lognorm)
        smoothed = np.empty((num_t, k))
        xi = np.zeros((k, k))
        beta = np.ones(k)
        v = np.empty(k)
        smoothed[num_t - 1] = filt[num_t - 1]
        for t in range(num_t - 2, -1, -1):
            m = ll[t + 1, 0]
            for i in range(1, k):
                m = max(m, ll[t + 1, i])
            vmax = 0.0
            for j in range(k):
                v[j] = np.exp(ll[t + 1, j] - m) * beta[j]
                vmax = max(vmax, v[j])
            for j in range(k):
                v[j] /= vmax
            bmax = 0.0
            for i in range(k):
                acc = 0.0
                for j in range(k):
                    acc += a[i, j] * v[j]
                beta[i] = acc
            norm = 0.0
            for i in range(k):
                norm += filt[t, i] * beta[i]
            for i in range(k):
                smoothed[t, i] = filt[t, i] * beta[i] / norm
                w = filt[t, i] / norm
                for j in range(k):
                    xi[i, j] += w * a[i, j] * v[j]
                bmax = max(bmax, beta[i])
            for i in range(k):
                beta[i] /= bmax
        return total, smoothed, xi

    return filter_, smoother


def hmmlearn_kernels():
    import numpy as np
    from hmmlearn import _hmmc

    def filter_(pi, a, lik):
        total, fwd, _ = _hmmc.forward_scaling(pi, a, lik)
        return total, fwd

    def smoother(pi, a, lik):
        total, fwd, scaling = _hmmc.forward_scaling(pi, a, lik)
        bwd = _hmmc.backward_scaling(pi, a, lik, scaling)
        xi = _hmmc.compute_scaling_xi_sum(fwd, a, bwd, lik)
        post = fwd * bwd
        post /= post.sum(axis=1, keepdims=True)
        return total, post, xi

    return filter_, smoother, np


def _ratio_row(res, num, den):
    a, b = res[num], res[den]
    return paired_ratio(a, b), a["min"] / b["min"]


def _cases(kind, k, num_t, batch, kernels):
    """name -> zero-argument callable for one workload (all on the same table)."""
    _hmm_before = load_module_at("a454811", "statseq/inference/hmm.py", "hmm_before")
    import jax
    import jax.numpy as jnp
    import numpy as np

    import statseq as ss
    from statseq.inference import hmm as ss_hmm
    from statseq.models.hmm.poisson import PoissonEmissions

    nb_filter, nb_smoother, hl_filter, hl_smoother = kernels
    pi, a, rates, y = simulate(k, num_t, batch)
    ll = log_likelihoods(rates, y)
    lik = np.exp(ll)
    model = ss.PoissonHMM(num_states=k)
    params = ss.HMMParams(jnp.asarray(pi), jnp.asarray(a), PoissonEmissions(jnp.asarray(rates)))
    pi_j, a_j, ll_j = jnp.asarray(pi), jnp.asarray(a), jnp.asarray(ll)
    if kind == "filter":
        core = jax.jit(lambda p, t, l: ss_hmm.hmm_filter(p, t, l).marginal_log_lik)
        before = jax.jit(lambda p, t, l: _hmm_before.hmm_filter(p, t, l).marginal_log_lik)
        return {
            "statseq core": lambda: core(pi_j, a_j, ll_j),
            "statseq core before (a454811)": lambda: before(pi_j, a_j, ll_j),
            "statseq public": lambda: model.filter_states(params, y, parallel=False),
            "hmmlearn C++": lambda: hl_filter(pi, a, lik)[0],
            "numba": lambda: nb_filter(pi, a, ll)[0],
        }

    def outputs(post):
        return post.marginal_log_lik, post.smoothed_probs, post.expected_transitions

    def core_fn(p, t, l):
        return outputs(ss_hmm.hmm_smoother(p, t, l))

    def before_fn(p, t, l):
        return outputs(_hmm_before.hmm_smoother(p, t, l))

    if batch is None:
        core, before = jax.jit(core_fn), jax.jit(before_fn)

        def hl():
            return hl_smoother(pi, a, lik)

        def nb():
            return nb_smoother(pi, a, ll)
    else:
        core = jax.jit(jax.vmap(core_fn, (None, None, 0)))
        before = jax.jit(jax.vmap(before_fn, (None, None, 0)))

        def hl():
            return [hl_smoother(pi, a, x) for x in lik]

        def nb():
            return [nb_smoother(pi, a, x) for x in ll]
    return {
        "statseq core": lambda: core(pi_j, a_j, ll_j),
        "statseq core before (a454811)": lambda: before(pi_j, a_j, ll_j),
        "statseq public": lambda: model.smoother(params, y, parallel=False),
        "hmmlearn C++": hl,
        "numba": nb,
    }


def _total(kind, name, val, batch):
    """The (summed) marginal log-likelihood in any implementation's output."""
    import numpy as np

    if name == "statseq public":
        return float(np.sum(np.asarray(val.marginal_log_lik)))
    if name.startswith("statseq"):
        return float(np.sum(np.asarray(val if kind == "filter" else val[0])))
    if kind == "filter":
        return float(val)
    return sum(r[0] for r in val) if batch else float(val[0])


def run_float64(quick: bool):
    import jax

    jax.config.update("jax_enable_x64", True)
    kernels = (*numba_kernels(), *hmmlearn_kernels()[:2])
    scale = 10 if quick else 1
    workloads = [
        ("filter", 2, 10**6 // scale, None),
        ("filter", 16, 10**5 // scale, None),
        ("smoother", 2, 10**6 // scale, None),
        ("smoother", 16, 10**3, None),
        ("smoother", 16, 10**5 // scale, None),
        ("smoother", 2, 1000, 1000 // scale),
        ("filter", 6, 10**5 // scale, None),  # the blocked path's default range (6-7 states)
        ("smoother", 6, 10**5 // scale, None),
    ]
    timer = Timer(min_rounds=5, budget_s=1.0 if quick else 3.0, max_rounds=50)
    tables, ratios = [], {}
    for kind, k, num_t, batch in workloads:
        fns = _cases(kind, k, num_t, batch, kernels)
        # answers agree before anything is timed
        first = {name: timer.first(fn) for name, fn in fns.items()}
        ref_total = _total(kind, "numba", first["numba"][0], batch)
        for name, (val, _, _) in first.items():
            tot = _total(kind, name, val, batch)
            assert abs(tot - ref_total) <= 1e-8 * abs(ref_total), (name, tot, ref_total)
        res = timer.rounds(fns)
        label = f"{kind} K={k} T={num_t:.0e}" + (f" batch {batch}x{num_t}" if batch else "")
        label = label.replace("e+0", "e")
        rows = []
        for name in fns:
            r = res[name]
            rows.append([name, fmt_s(first[name][2]) if name.startswith("statseq") else "–",
                         fmt_s(r["median"]), fmt_s(r["min"]),
                         "{:.2f} / {:.2f}".format(*_ratio_row(res, name, "hmmlearn C++")),
                         "{:.2f} / {:.2f}".format(*_ratio_row(res, name, "numba"))])
        for name, short in (("statseq core", "jitted core"), ("statseq public", "public call"),
                            ("statseq core before (a454811)", "jitted core before")):
            for ref_name, ref_short in (("hmmlearn C++", "hmmlearn"), ("numba", "numba")):
                ratios[f"{label} f64 | {short} / {ref_short}"] = _ratio_row(res, name, ref_name)[0]
        tables.append((label, rows))
        print(f"\n### {label} (float64)\n")
        print(md_table(["implementation", "compile", "median", "min",
                        "/ hmmlearn (median / min)", "/ numba (median / min)"], rows),
              flush=True)
    return tables, ratios


def _pair(core, peer, args):
    return {"statseq core": lambda: core(*args), "dynamax": lambda: peer(*args)}


def run_float32(quick: bool):
    """statseq core against dynamax in float32 (x64 off in this process)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from dynamax.hidden_markov_model import inference as dyn

    from statseq.inference import hmm as ss_hmm

    scale = 10 if quick else 1
    timer = Timer(min_rounds=5, budget_s=1.0 if quick else 3.0, max_rounds=50)
    out = {}
    for kind, k, num_t in (("filter", 2, 10**6 // scale), ("filter", 16, 10**5 // scale),
                           ("smoother", 2, 10**6 // scale), ("smoother", 16, 10**5 // scale)):
        pi, a, rates, y = simulate(k, num_t)
        ll = log_likelihoods(rates, y)
        pi_j, a_j, ll_j = (jnp.asarray(x, jnp.float32) for x in (pi, a, ll))
        if kind == "filter":
            core = jax.jit(lambda p, t, l: ss_hmm.hmm_filter(p, t, l).marginal_log_lik)
            peer = jax.jit(lambda p, t, l: dyn.hmm_filter(p, t, l).marginal_loglik)
        else:
            core = jax.jit(lambda p, t, l: ss_hmm.hmm_smoother(p, t, l).smoothed_probs)
            peer = jax.jit(lambda p, t, l: dyn.hmm_smoother(p, t, l).smoothed_probs)
        fns = _pair(core, peer, (pi_j, a_j, ll_j))
        first = {n: timer.first(f) for n, f in fns.items()}
        np.testing.assert_allclose(np.asarray(first["statseq core"][0]),
                                   np.asarray(first["dynamax"][0]), rtol=2e-3, atol=2e-4)
        res = timer.rounds(fns)
        label = f"{kind} K={k} T={num_t:.0e}".replace("e+0", "e")
        out[label] = dict(
            core_median=res["statseq core"]["median"], core_min=res["statseq core"]["min"],
            dyn_median=res["dynamax"]["median"], dyn_min=res["dynamax"]["min"],
            ratio=paired_ratio(res["statseq core"], res["dynamax"]),
            ratio_min=res["statseq core"]["min"] / res["dynamax"]["min"],
            compile=first["statseq core"][2])
    print(json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--record", action="store_true", help="write benchmarks/ratios/hmm.json")
    parser.add_argument("--float32-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-float64", action="store_true")
    args = parser.parse_args()
    if args.float32_child:
        run_float32(args.quick)
        return
    command = "nice -n 10 python benchmarks/bench_hmm_floor.py" + (
        " --quick" if args.quick else "")
    print(f"load average before: {load_average()}")
    ratios = {}
    if not args.skip_float64:
        _, ratios = run_float64(args.quick)
    env = dict(os.environ, JAX_ENABLE_X64="0")
    child = subprocess.run(
        [sys.executable, __file__, "--float32-child"] + (["--quick"] if args.quick else []),
        env=env, capture_output=True, text=True, check=True)
    f32 = json.loads(child.stdout.strip().splitlines()[-1])
    rows = []
    for label, r in f32.items():
        rows.append([label, fmt_s(r["compile"]), fmt_s(r["core_median"]), fmt_s(r["core_min"]),
                     fmt_s(r["dyn_median"]), fmt_s(r["dyn_min"]),
                     f"{r['ratio']:.2f} / {r['ratio_min']:.2f}"])
        ratios[f"{label} f32 | jitted core / dynamax"] = r["ratio"]
    print("\n### float32: statseq core against dynamax\n")
    print(md_table(["workload", "compile", "statseq median", "statseq min", "dynamax median",
                    "dynamax min", "statseq / dynamax (median / min)"], rows))
    print(f"\nload average after: {load_average()}")
    if args.record:
        print(record_ratios("hmm", ratios, command=command))


if __name__ == "__main__":
    main()
