#!/usr/bin/env python
"""The exact (non-steady-state) Kalman filter and smoother against statsmodels (issue 13.3).

    nice -n 10 python benchmarks/bench_kalman_exact.py            # T = 10^3, 10^4, 10^5
    nice -n 10 python benchmarks/bench_kalman_exact.py --quick    # T = 10^3, 10^4; prints only
    nice -n 10 python benchmarks/bench_kalman_exact.py --workloads tvreg3 --sizes 10000
                                                                  # one workload; prints only
(run with ``PYTHONPATH=$PWD`` from a worktree: the venv's editable install points at main)

Workloads where the steady-state shortcut cannot be used (float64, fixed seed):

* ``ti4x2``: a time-invariant model with n = 4 states and D = 2 series, full ``F, Q, H, R``,
  about 10 % of the entries missing at random (partial rows included);
* ``tvreg3``: a dynamic regression ``y_t = z_t^T beta_t + v_t`` with three random-walk
  coefficients (n = 3, D = 1, a per-step emission matrix ``H_t = z_t^T``), 10 % missing;
* ``level``: the local level model (n = D = 1), 10 % missing (per-op overhead dominates).

For each, T = 10^3, 10^4, 10^5, the filter (log-likelihood) and the smoother:

* statseq jitted core: ``jax.jit(kalman_log_prob)``, ``jax.jit(kalman_filter)``,
  ``jax.jit(kalman_smoother)`` on the arrays;
* statseq sequential (two-series workload): ``kalman_filter(..., sweeps=False)``, the
  sequential scan that the default replaces on CPU from
  ``kalman_sweeps.SWEEP_MIN_STEPS`` steps (the sweeps over blocks), in the same rounds;
* statseq before: the same functions from ``statseq/inference/kalman.py`` as of commit
  ``BEFORE_COMMIT`` (read with ``git show``, loaded as a separate module), so the speed-up
  is a paired ratio in the same rounds;
* statseq public call: ``ss.log_prob(model, params, y, mask=mask)`` and
  ``model.smoother(params, y, mask=mask, parallel=False)``
  (``TimeVaryingLinearGaussianSSM`` for ``tvreg3``);
* statsmodels: ``MLEModel`` with the same matrices, ``initialize_known`` with the same
  initial law, missing entries as NaN: ``ssm.loglike()`` and ``ssm.smooth()`` (Cython).

Every implementation's log-likelihood (and smoothed means) is checked against statsmodels'
first (``|Δ| <= 1e-9 max(1, |ll|)``, smoothed means to 1e-9); a disagreement aborts the run.
dynamax is not timed: it has no missing-data handling, so it cannot compute these
likelihoods. Timings are interleaved rounds (``_harness.Timer``); ratios are statseq time
over the reference's, the median of per-round ratios (``paired_ratio``) and the ratio of
minima; compile time is the first call's (``CompileClock``). Speed is reported, never
asserted.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
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
MISSING = 0.1
BEFORE_COMMIT = "a454811"
HEADING = "## Exact Kalman filter and smoother against statsmodels (issue 13.3)"
END_MARK = "<!-- END bench_kalman_exact -->"


# ---------------------------------------------------------------------------------------
# models and data
# ---------------------------------------------------------------------------------------
def model_matrices(name, num_t):
    """Matrices (H and R possibly per step), initial law, y with NaN at missing entries."""
    import numpy as np

    rng = np.random.default_rng([SEED, num_t, len(name)])
    if name == "ti4x2":
        n, d = 4, 2
        f = np.array([[0.9, 0.1, 0.0, 0.0], [-0.1, 0.8, 0.1, 0.0],
                      [0.0, 0.0, 0.7, 0.2], [0.0, 0.1, -0.2, 0.6]])
        a = rng.standard_normal((n, n))
        q = a @ a.T / n + 0.1 * np.eye(n)
        h = rng.standard_normal((d, n))
        r = np.array([[0.5, 0.1], [0.1, 0.4]])
    elif name == "tvreg3":
        n, d = 3, 1
        f, q, r = np.eye(n), 0.01 * np.eye(n), np.array([[1.0]])
        h = rng.standard_normal((num_t, d, n))  # per-step regressors z_t^T
    elif name == "level":
        n, d = 1, 1
        f, q, h, r = np.eye(1), np.array([[0.5]]), np.eye(1), np.eye(1)
    else:
        raise ValueError(name)
    m0, p0 = np.zeros(n), 10.0 * np.eye(n)
    x = np.empty((num_t, n))
    x[0] = rng.standard_normal(n) * np.sqrt(10.0)
    wq, wr = np.linalg.cholesky(q), np.linalg.cholesky(r)
    noise = rng.standard_normal((num_t, n)) @ wq.T
    for t in range(1, num_t):
        x[t] = f @ x[t - 1] + noise[t - 1]
    hx = np.einsum("tdn,tn->td", h, x) if h.ndim == 3 else x @ h.T
    y = hx + rng.standard_normal((num_t, d)) @ wr.T
    mask = rng.random((num_t, d)) >= MISSING
    return dict(n=n, d=d, F=f, Q=q, H=h, R=r, m0=m0, P0=p0, y=np.where(mask, y, np.nan),
                mask=mask)


def statsmodels_model(m):
    from statsmodels.tsa.statespace.mlemodel import MLEModel

    mod = MLEModel(m["y"], k_states=m["n"])
    h = m["H"]
    mod["design"] = h.transpose(1, 2, 0) if h.ndim == 3 else h
    mod["obs_cov"], mod["transition"] = m["R"], m["F"]
    mod["selection"], mod["state_cov"] = __import__("numpy").eye(m["n"]), m["Q"]
    mod.ssm.initialize_known(m["m0"], m["P0"])
    return mod


def statseq_setup(m):
    import jax.numpy as jnp
    import numpy as np

    import statseq as ss
    from statseq.inference.kalman import GaussianSSMArrays

    n, d, num_t = m["n"], m["d"], m["y"].shape[0]
    z = lambda *s: jnp.zeros(s)  # noqa: E731
    arrays = GaussianSSMArrays(
        jnp.asarray(m["m0"]), jnp.asarray(m["P0"]), jnp.asarray(m["F"]), z(n, 0), z(n),
        jnp.asarray(m["Q"]), jnp.asarray(m["H"]), z(d, 0), z(d), jnp.asarray(m["R"]), z(n, 0))
    if m["H"].ndim == 3:
        model = ss.TimeVaryingLinearGaussianSSM(state_dim=n, emission_dim=d,
                                                num_timesteps=num_t)

        def tile(a, k):
            return jnp.broadcast_to(jnp.asarray(a), (k,) + np.shape(a))

        params = ss.LGSSMParams(
            jnp.asarray(m["m0"]), jnp.asarray(m["P0"]), tile(m["F"], num_t - 1),
            z(num_t - 1, n, 0), z(num_t - 1, n), tile(m["Q"], num_t - 1),
            jnp.asarray(m["H"]), z(num_t, d, 0), z(num_t, d), tile(m["R"], num_t))
    else:
        model = ss.LinearGaussianSSM(state_dim=n, emission_dim=d)
        params = ss.LGSSMParams(
            jnp.asarray(m["m0"]), jnp.asarray(m["P0"]), jnp.asarray(m["F"]), z(n, 0), z(n),
            jnp.asarray(m["Q"]), jnp.asarray(m["H"]), z(d, 0), z(d), jnp.asarray(m["R"]))
    return model, params, arrays


def load_before():
    """``statseq/inference/kalman.py`` at ``BEFORE_COMMIT`` as a separate module (or None)."""
    return load_module_at(BEFORE_COMMIT, "statseq/inference/kalman.py", "kalman_before")


# ---------------------------------------------------------------------------------------
# one workload
# ---------------------------------------------------------------------------------------
def cases(name, num_t, before):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import statseq as ss
    from statseq.inference import kalman

    m = model_matrices(name, num_t)
    model, params, arrays = statseq_setup(m)
    mask = jnp.asarray(m["mask"])
    y0 = jnp.asarray(np.where(m["mask"], m["y"], 0.0))
    u = jnp.zeros((num_t, 0))
    lp_core = jax.jit(kalman.kalman_log_prob)
    f_core = jax.jit(kalman.kalman_filter)
    s_core = jax.jit(kalman.kalman_smoother)
    holder = {}

    def sm_fresh(what):
        def first():
            holder[what] = statsmodels_model(m)
            return getattr(holder[what].ssm, what)()
        return first

    ll = lambda r: (float(r.marginal_log_lik), None)  # noqa: E731
    sm = lambda r: (float(r.marginal_log_lik), np.asarray(r.smoothed_means))  # noqa: E731
    flt = {
        "core kalman_log_prob": (lambda: lp_core(arrays, y0, mask, u), lambda v: (float(v), None)),
        "core kalman_filter": (lambda: f_core(arrays, y0, mask, u), ll),
        "public ss.log_prob": (lambda: ss.log_prob(model, params, y0, mask=mask),
                               lambda v: (float(v), None)),
        "statsmodels loglike": (sm_fresh("loglike"), lambda v: (float(v), None),
                                lambda: holder["loglike"].ssm.loglike()),
    }
    smo = {
        "core kalman_smoother": (lambda: s_core(arrays, y0, mask, u), sm),
        "public smoother": (lambda: model.smoother(params, y0, mask=mask, parallel=False), sm),
        "statsmodels smooth": (
            sm_fresh("smooth"),
            lambda r: (float(np.sum(r.llf_obs)), np.asarray(r.smoothed_state).T),
            lambda: holder["smooth"].ssm.smooth()),
    }
    if m["d"] > 1:  # the general path: by sweeps (the default on CPU) against sequential
        f_seq = jax.jit(lambda *a: kalman.kalman_filter(*a, sweeps=False))
        flt["core kalman_filter sequential"] = (lambda: f_seq(arrays, y0, mask, u), ll)
    if before is not None:
        b_lp = jax.jit(before.kalman_log_prob)
        b_s = jax.jit(before.kalman_smoother)
        flt["before core kalman_log_prob"] = (lambda: b_lp(arrays, y0, mask, u),
                                              lambda v: (float(v), None))
        smo["before core kalman_smoother"] = (lambda: b_s(arrays, y0, mask, u), sm)
    return flt, smo


def run_group(timer, group, ref, budget_s, min_rounds, log, label):
    res, steady = {}, {}
    for nm, spec in group.items():
        first_fn, extract = spec[0], spec[1]
        value, first, comp = timer.first(first_fn)
        res[nm] = dict(value=extract(value), first=first, compile=comp)
        steady[nm] = spec[2] if len(spec) > 2 else spec[0]
    ref_ll, ref_sm = res[ref]["value"]
    import numpy as np

    for nm, r in res.items():
        ll, smv = r["value"]
        d_ll = abs(ll - ref_ll)
        d_sm = 0.0 if smv is None or ref_sm is None else float(np.max(np.abs(smv - ref_sm)))
        if d_ll > 1e-9 * max(1.0, abs(ref_ll)) or d_sm > 1e-9:
            raise SystemExit(f"{label}: {nm} disagrees with {ref}: |Δll| {d_ll:.2e}, "
                             f"|Δ smoothed mean| {d_sm:.2e}")
        r["d_ll"], r["d_sm"] = d_ll, d_sm
    log(f"  {label}: all agree with {ref} (max |Δll| "
        f"{max(r['d_ll'] for r in res.values()):.1e}, max |Δ smoothed mean| "
        f"{max(r['d_sm'] for r in res.values()):.1e})")
    rounds = timer.rounds(steady, min_rounds=min_rounds, budget_s=budget_s)
    for nm in res:
        res[nm].update(rounds[nm])
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="T = 10^3, 10^4 only; no files")
    ap.add_argument("--sizes", type=int, nargs="*", help="override the lengths (no files)")
    ap.add_argument("--workloads", nargs="*", choices=("ti4x2", "tvreg3", "level"),
                    help="only these workloads (no files)")
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    command = "nice -n 10 python benchmarks/bench_kalman_exact.py" + (" --quick" if args.quick
                                                                      else "")
    started = datetime.datetime.now(datetime.UTC)
    t_start = time.perf_counter()
    before = load_before()
    sizes = [10**3, 10**4] if args.quick else [10**3, 10**4, 10**5]
    if args.sizes:
        sizes, args.quick = args.sizes, True
    workloads = ("ti4x2", "tvreg3", "level")
    if args.workloads:
        workloads, args.quick = tuple(args.workloads), True
    timer = Timer(min_rounds=5, budget_s=2.0)
    log = lambda s: print(s, flush=True)  # noqa: E731
    load_start = load_average()
    rows, ratios = [], {}
    for name in workloads:
        for num_t in sizes:
            flt, smo = cases(name, num_t, before)
            budget = 2.0 if num_t < 10**5 else 4.0
            min_r = 5 if num_t < 10**5 else 3
            for kind, group, ref, core, bef in (
                ("filter", flt, "statsmodels loglike", "core kalman_log_prob",
                 "before core kalman_log_prob"),
                ("smoother", smo, "statsmodels smooth", "core kalman_smoother",
                 "before core kalman_smoother"),
            ):
                label = f"{name} T=1e{len(str(num_t)) - 1} {kind}"
                res = run_group(timer, group, ref, budget, min_r, log, label)
                for nm, r in res.items():
                    if nm == ref:
                        continue
                    pr = paired_ratio(r, res[ref])
                    key = f"{label} | {nm} / {ref}"
                    ratios[key] = pr
                    rows.append([label, nm, fmt_s(r["median"]), fmt_s(r["min"]),
                                 fmt_s(res[ref]["min"]), f"{pr:.2f}",
                                 f"{r['min'] / res[ref]['min']:.2f}",
                                 fmt_s(r["compile"]), r["n"]])
                    log(f"    {nm:32s} median {fmt_s(r['median']):>10s} min "
                        f"{fmt_s(r['min']):>10s}  / {ref}: {pr:.2f} (min {fmt_s(res[ref]['min'])})"
                        f"  compile {fmt_s(r['compile'])}")
                if bef in res:
                    ratios[f"{label} | {core} / {bef}"] = paired_ratio(res[core], res[bef])
                seq = "core kalman_filter sequential"
                if seq in res:
                    ratios[f"{label} | core kalman_filter / {seq}"] = paired_ratio(
                        res["core kalman_filter"], res[seq])
    elapsed = time.perf_counter() - t_start
    load_end = load_average()
    table = md_table(["workload", "statseq path", "median", "min", "statsmodels min",
                      "paired ratio (median)", "ratio of minima", "compile", "rounds"], rows)
    speedups = md_table(["workload", "after / before (same rounds)", "paired ratio"],
                        [[*k.split(" | ", 1), f"{v:.2f}"] for k, v in ratios.items()
                         if "/ before" in k or k.endswith(" sequential")])
    section = "\n".join([
        HEADING, "",
        f"Command: `{command}`  ",
        f"Date: {started:%Y-%m-%d %H:%M} UTC, run time {elapsed:.0f} s, load average "
        f"{load_start} (start) / {load_end} (end), JAX {jax.__version__}, "
        f"backend {jax.default_backend()}, float64.", "",
        "Ratios are statseq time / statsmodels time (lower is better; below 1 = faster than "
        "statsmodels), the median of per-round ratios in interleaved rounds, and the ratio of "
        "minima. `before` is `statseq/inference/kalman.py` at commit "
        f"`{BEFORE_COMMIT}`, timed in the same rounds. All log-likelihoods and smoothed means "
        "agree with statsmodels to 1e-9 before timing.", "",
        table, "", speedups, "", END_MARK, ""])
    print(section)
    if not args.quick:
        record_ratios("kalman", ratios, command=command)
        path = HERE / "RESULTS.md"
        text = path.read_text()
        if HEADING in text and END_MARK in text:
            head, rest = text.split(HEADING, 1)
            tail = rest.split(END_MARK, 1)[1].lstrip("\n")
            text = head + section + ("\n" + tail if tail else "")
        else:
            text = text.rstrip("\n") + "\n\n" + section
        path.write_text(text)


if __name__ == "__main__":
    main()
