#!/usr/bin/env python
"""HMM Viterbi, posterior sampling (FFBS) and the EM loop against hmmlearn, dynamax and numba.

    nice -n 10 python benchmarks/bench_hmm_paths.py            # full run, records ratios
    nice -n 10 python benchmarks/bench_hmm_paths.py --quick    # smaller T, prints only

For each workload (K states, T steps, a random (T, K) table of log-likelihoods and a sticky
random transition matrix, fixed seed) one process times, interleaved in rounds
(`_harness.Timer`):

* ``core``: ``jax.jit`` of `statseq.inference.hmm.hmm_viterbi` /
  ``hmm_posterior_sample`` on the precomputed table;
* ``public``: ``PoissonHMM.most_likely_states`` / ``sample_states_posterior`` on count data
  (for the Viterbi rows; includes emission log-likelihoods and eager checks);
* ``hmmlearn``: ``hmmlearn._hmmc.viterbi`` (C++, float64) on the same table;
* ``numba``: an ``@njit`` loop of the same recursion (Viterbi; FFBS = filter + backward
  draws), the compiled-loop floor;
* ``dynamax``: ``hmm_posterior_sample`` (float32 in a child process would be needed for a
  like-for-like float32 row; here it runs in float64 in the same process);
* ``sweeps``: the same kernels forced to run by sweeps over blocks
  (`statseq.inference.sweeps`; ``sweeps=True``), the identical path, for the
  sweeps / default ratio that sets `hmm_paths.VITERBI_SWEEP_MIN_STEPS` and
  ``SAMPLE_SWEEP_MIN_STEPS``.

EM (``--em``): ``fit_em`` against hmmlearn's ``fit`` from the same start, the same fixed
number of iterations (statseq ``tol=None``; hmmlearn ``tol=-inf``, ``init_params=""``).

Every path is checked against numba's before timing. Ratios (statseq / reference, the
median of per-round ratios) go to ``benchmarks/ratios/hmm_paths.json`` via
`_harness.record_ratios`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import (  # noqa: E402
    CompileClock,
    Timer,
    fmt_s,
    load_average,
    md_table,
    paired_ratio,
    record_ratios,
)

SEED = 20261126


def problem(num_states, num_timesteps, seed=SEED):
    rng = np.random.default_rng(seed + 31 * num_states + num_timesteps)
    a = rng.dirichlet(np.ones(num_states), size=num_states) + 5 * np.eye(num_states)
    a /= a.sum(1, keepdims=True)
    pi = rng.dirichlet(np.ones(num_states))
    ll = rng.normal(size=(num_timesteps, num_states)) * 1.5
    return pi, a, ll


def numba_kernels():
    import numba

    @numba.njit(cache=False, fastmath=False)
    def viterbi(log_pi, log_a, ll):
        t_len, k = ll.shape
        ptr = np.empty((t_len, k), np.int32)
        delta = log_pi + ll[0]
        new = np.empty(k)
        for t in range(1, t_len):
            for j in range(k):
                best = delta[0] + log_a[0, j]
                arg = 0
                for i in range(1, k):
                    s = delta[i] + log_a[i, j]
                    if s > best:
                        best, arg = s, i
                new[j] = best + ll[t, j]
                ptr[t, j] = arg
            m = new.max()
            for j in range(k):
                delta[j] = new[j] - m
        path = np.empty(t_len, np.int32)
        path[-1] = np.argmax(delta)
        for t in range(t_len - 1, 0, -1):
            path[t - 1] = ptr[t, path[t]]
        return path

    @numba.njit(cache=False)
    def ffbs(pi, a, ll, u):
        t_len, k = ll.shape
        f = np.empty((t_len, k))
        p = pi.copy()
        for t in range(t_len):
            m = ll[t].max()
            s = 0.0
            for j in range(k):
                f[t, j] = p[j] * np.exp(ll[t, j] - m)
                s += f[t, j]
            for j in range(k):
                f[t, j] /= s
            if t + 1 < t_len:
                for j in range(k):
                    acc = 0.0
                    for i in range(k):
                        acc += f[t, i] * a[i, j]
                    p[j] = acc
        path = np.empty(t_len, np.int32)
        w = np.empty(k)
        # last state
        c = np.cumsum(f[-1])
        path[-1] = min(np.searchsorted(c, u[-1] * c[-1], side="right"), k - 1)
        for t in range(t_len - 2, -1, -1):
            nxt = path[t + 1]
            for i in range(k):
                w[i] = f[t, i] * a[i, nxt]
            c = np.cumsum(w)
            path[t] = min(np.searchsorted(c, u[t] * c[-1], side="right"), k - 1)
        return path

    return viterbi, ffbs


def previous_kernels():
    """The step-by-step Viterbi and FFBS scans statseq used before `hmm_paths` (copied
    from statseq/inference/hmm.py at a454811), for a same-round baseline."""
    import jax
    import jax.numpy as jnp

    from statseq.inference.hmm import _filter, _prepare_inputs

    def viterbi(pi, a, ll):
        pi, fixed, _, ll = _prepare_inputs(pi, a, ll)
        log_a = jnp.log(fixed)
        delta0 = jnp.log(pi) + ll[0]
        delta0 = delta0 - jnp.max(delta0)

        def forward(delta_prev, ll_t):
            scores = delta_prev[:, None] + log_a
            delta = jnp.max(scores, axis=0) + ll_t
            return delta - jnp.max(delta), jnp.argmax(scores, axis=0).astype(jnp.int32)

        delta_last, pointers = jax.lax.scan(forward, delta0, ll[1:])
        last = jnp.argmax(delta_last).astype(jnp.int32)
        _, states = jax.lax.scan(lambda s, p: (p[s], p[s]), last, pointers, reverse=True)
        return jnp.concatenate([states, last[None]])

    def ffbs(pi, a, ll, key):
        pi, fixed, per_step, ll = _prepare_inputs(pi, a, ll)
        filtered = _filter(pi, fixed, per_step, ll).filtered_probs
        keys = jax.random.split(key, ll.shape[0])
        last = jax.random.categorical(keys[-1], jnp.log(filtered[-1])).astype(jnp.int32)

        def step(state_next, xs):
            key_t, filtered_t = xs
            logits = jnp.log(filtered_t) + jnp.log(fixed[:, state_next])
            state = jax.random.categorical(key_t, logits).astype(jnp.int32)
            return state, state

        _, states = jax.lax.scan(step, last, (keys[:-1], filtered[:-1]), reverse=True)
        return jnp.concatenate([states, last[None]])

    return jax.jit(viterbi), jax.jit(ffbs)


#: the commit before the inverse-CDF FFBS and the linearized gradient path (same-round
#: "before" rows: the exponential-race FFBS and the gradient through the plain filter)
BEFORE_COMMIT = "2d00e12"


def race_kernel():
    """The exponential-race FFBS (pointer table + blocked backtracking) of `BEFORE_COMMIT`,
    on the current filter; ``None`` outside a git checkout."""
    import jax
    from _harness import load_module_at

    from statseq.inference.hmm import _filter, _prepare_inputs

    old = load_module_at(BEFORE_COMMIT, "statseq/inference/hmm_paths.py", "hmm_paths_race")
    if old is None:
        return None

    def ffbs(pi, a, ll, key):
        pi, fixed, per_step, ll = _prepare_inputs(pi, a, ll)
        filtered = _filter(pi, fixed, per_step, ll).filtered_probs
        return old.posterior_sample(filtered, fixed, per_step, key)

    return jax.jit(ffbs)


def bench_gradient(timer, cases, log):
    """`hmm_smoother_by_gradient` against `hmm_smoother` (forward-backward), and the
    gradient path of `BEFORE_COMMIT`, same rounds; results compared to 1e-10 first."""
    import jax
    import jax.numpy as jnp
    from _harness import load_module_at

    from statseq.inference import hmm

    old = load_module_at(BEFORE_COMMIT, "statseq/inference/hmm.py", "hmm_before")
    rows, ratios = [], {}
    for k, t in cases:
        pi, a, ll = (jnp.asarray(x) for x in problem(k, t))
        fns = {"forward-backward": jax.jit(hmm.hmm_smoother),
               "by gradient": jax.jit(hmm.hmm_smoother_by_gradient)}
        if old is not None:
            fns["by gradient before"] = jax.jit(old.hmm_smoother_by_gradient)
        ref = fns["forward-backward"](pi, a, ll)
        for name, fn in fns.items():
            got = fn(pi, a, ll)
            for x, y in zip(ref, got, strict=True):
                np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-10,
                                           atol=1e-12, err_msg=name)
        fns = {name: (lambda fn=fn, args=(pi, a, ll): fn(*args)) for name, fn in fns.items()}
        compile_s = {}
        for name, fn in fns.items():
            _, wall, comp = timer.first(fn)
            compile_s[name] = comp if comp > 0 else wall
        res = timer.rounds(fns)
        tag = f"K{k}_T{t}"
        for num in fns:
            if num == "forward-backward":
                continue
            key_name = f"{num.replace(' ', '_')}_vs_fb_{tag}"
            ratios[key_name] = paired_ratio(res[num], res["forward-backward"])
            ratios["min_" + key_name] = res[num]["min"] / res["forward-backward"]["min"]
        for name in fns:
            rows.append([f"K={k}, T={t}", name, fmt_s(res[name]["median"]),
                         fmt_s(res[name]["min"]), fmt_s(compile_s[name]),
                         "yes" if res[name]["recompiled"] else ""])
        log(f"gradient K={k} T={t}: " + ", ".join(
            f"{n} {fmt_s(res[n]['min'])}" for n in fns))
    return md_table(["case", "implementation", "median", "min", "first-call compile",
                     "recompiled?"], rows), ratios


def _path_fns(k, t, kernels):
    """The timed callables of one (K, T) case, and the arrays to check."""
    import jax
    import jax.numpy as jnp
    from hmmlearn import _hmmc

    import statseq as ss

    core_v, core_s, dyn_s, nb_viterbi, nb_ffbs, prev_v, prev_s, race_s, sw_v, sw_s = kernels
    pi, a, ll = problem(k, t)
    jpi, ja, jll = (jnp.asarray(x) for x in (pi, a, ll))
    key = jax.random.key(0)
    u = np.random.default_rng(1).uniform(size=t)
    rng = np.random.default_rng(2)
    rates = np.linspace(1.0, 10.0, k)
    y = rng.poisson(rates[rng.integers(0, k, t)]).astype(float)
    model = ss.PoissonHMM(num_states=k)
    params = model.initialize(y, key=jax.random.key(3))._replace(
        transitions=ja, initial_probs=jpi)
    log_pi, log_a = np.log(pi), np.log(a)
    fns = {
        "viterbi core": lambda: core_v(jpi, ja, jll),
        "viterbi public": lambda: model.most_likely_states(params, y),
        "viterbi hmmlearn": lambda: _hmmc.viterbi(pi, a, ll),
        "viterbi previous": lambda: prev_v(jpi, ja, jll),
        "ffbs previous": lambda: prev_s(jpi, ja, jll, key),
        "viterbi numba": lambda: nb_viterbi(log_pi, log_a, ll),
        "ffbs core": lambda: core_s(jpi, ja, jll, key),
        "ffbs public": lambda: model.sample_states_posterior(params, y, key=key),
        "ffbs numba": lambda: nb_ffbs(pi, a, ll, u),
        "ffbs dynamax": lambda: dyn_s(key, jpi, ja, jll),
        "viterbi sweeps": lambda: sw_v(jpi, ja, jll),
        "ffbs sweeps": lambda: sw_s(jpi, ja, jll, key),
    }
    if race_s is not None:
        fns["ffbs race"] = lambda: race_s(jpi, ja, jll, key)
    return fns, (pi, a, ll)


def bench_paths(timer, cases, log):
    import dynamax.hidden_markov_model as dyn
    import jax
    from hmmlearn import _hmmc

    from statseq.inference import hmm_paths
    from statseq.inference.hmm import _filter, _prepare_inputs, hmm_posterior_sample, hmm_viterbi

    def viterbi_sweeps(pi, a, ll):
        return hmm_paths.viterbi(*_prepare_inputs(pi, a, ll), sweeps=True)

    def ffbs_sweeps(pi, a, ll, key):
        pi, fixed, per_step, ll = _prepare_inputs(pi, a, ll)
        filtered = _filter(pi, fixed, per_step, ll).filtered_probs
        return hmm_paths.posterior_sample(filtered, fixed, per_step, key, sweeps=True)

    nb_viterbi, nb_ffbs = numba_kernels()
    kernels = (jax.jit(hmm_viterbi),
               jax.jit(lambda p, a, ll, k: hmm_posterior_sample(p, a, ll, key=k)),
               jax.jit(lambda k, p, a, ll: dyn.hmm_posterior_sample(k, p, a, ll)[1]),
               nb_viterbi, nb_ffbs, *previous_kernels(), race_kernel(),
               jax.jit(viterbi_sweeps), jax.jit(ffbs_sweeps))
    rows, ratios = [], {}
    for k, t in cases:
        fns, (pi, a, ll) = _path_fns(k, t, kernels)
        compile_s = {}
        for name, fn in fns.items():
            _, wall, comp = timer.first(fn)
            compile_s[name] = comp if comp > 0 else wall
        ours = np.asarray(fns["viterbi core"]())
        np.testing.assert_array_equal(ours, nb_viterbi(np.log(pi), np.log(a), ll))
        np.testing.assert_array_equal(ours, _hmmc.viterbi(pi, a, ll)[1])
        np.testing.assert_array_equal(ours, np.asarray(fns["viterbi previous"]()))
        np.testing.assert_array_equal(ours, np.asarray(fns["viterbi sweeps"]()))
        np.testing.assert_array_equal(np.asarray(fns["ffbs core"]()),
                                      np.asarray(fns["ffbs sweeps"]()))
        res = timer.rounds(fns)
        tag = f"K{k}_T{t}"
        for num, den in [("viterbi core", "viterbi hmmlearn"), ("viterbi core", "viterbi numba"),
                         ("viterbi core", "viterbi previous"), ("ffbs core", "ffbs previous"),
                         ("viterbi public", "viterbi hmmlearn"),
                         ("ffbs core", "ffbs numba"), ("ffbs core", "ffbs dynamax"),
                         ("ffbs public", "ffbs numba"), ("ffbs core", "ffbs race"),
                         ("viterbi sweeps", "viterbi core"), ("ffbs sweeps", "ffbs core")]:
            if den not in res:
                continue
            key_name = f"{num.replace(' ', '_')}_vs_{den.split()[-1]}_{tag}"
            ratios[key_name] = paired_ratio(res[num], res[den])
            ratios["min_" + key_name] = res[num]["min"] / res[den]["min"]
        for name in fns:
            rows.append([f"K={k}, T={t}", name, fmt_s(res[name]["median"]),
                         fmt_s(res[name]["min"]), fmt_s(compile_s[name]),
                         "yes" if res[name]["recompiled"] else ""])
        log(f"K={k} T={t}: " + ", ".join(f"{n} {fmt_s(res[n]['min'])}" for n in fns))
    table = md_table(["case", "implementation", "median", "min", "first-call compile",
                      "recompiled?"], rows)
    return table, ratios


def _em_problem(kind):
    import jax

    import statseq as ss

    rng = np.random.default_rng(SEED)
    a = np.array([[0.90, 0.06, 0.04], [0.05, 0.90, 0.05], [0.04, 0.06, 0.90]])
    n, t = (1000, 100) if kind == "poisson batch" else (1, 10**4)
    z = np.zeros((n, t), int)
    z[:, 0] = rng.integers(0, 3, n)
    for s in range(1, t):
        cum = np.cumsum(a[z[:, s - 1]], axis=1)
        z[:, s] = (rng.uniform(size=(n, 1)) > cum).sum(1)
    if kind == "gaussian":
        y = (np.array([-2.0, 0.0, 3.0])[z] + np.array([0.7, 0.5, 1.0])[z]
             * rng.normal(size=z.shape))[0]
        model = ss.GaussianHMM(num_states=3, emission_dim=1, covariance="diagonal")
        y = y[:, None]
    else:
        y = rng.poisson(np.array([1.0, 5.0, 12.0])[z]).astype(float)
        y = y[0] if n == 1 else y
        model = ss.PoissonHMM(num_states=3)
    start = model.initialize(y, key=jax.random.key(0))
    return model, start, y


def _hmmlearn_fit(kind, start, y, iters):
    from hmmlearn import hmm

    k = 3
    if kind == "gaussian":
        h = hmm.GaussianHMM(n_components=k, covariance_type="diag", n_iter=iters,
                            tol=-np.inf, init_params="", params="stmc")
        h.means_ = np.asarray(start.emissions.means).reshape(k, 1)
        h.covars_ = np.asarray(_variances(start.emissions)).reshape(k, 1)
    else:
        h = hmm.PoissonHMM(n_components=k, n_iter=iters, tol=-np.inf, init_params="",
                           params="stl")
        h.lambdas_ = np.asarray(start.emissions.rates).reshape(k, 1)
    h.startprob_ = np.asarray(start.initial_probs)
    h.transmat_ = np.asarray(start.transitions)
    x = y.reshape(-1, 1)
    lengths = [y.shape[1]] * y.shape[0] if y.ndim == 2 and kind != "gaussian" else None

    def run():
        g = __import__("copy").deepcopy(h)
        g.fit(x, lengths)
        return g

    return run


def _variances(em):
    for name in ("variances", "diag_covs", "scale_diags"):
        if hasattr(em, name):
            return np.asarray(getattr(em, name)) ** (2 if name == "scale_diags" else 1)
    covs = np.asarray(em.covs)
    return np.diagonal(covs, axis1=-2, axis2=-1)


def bench_em(timer, log, iters):
    import statseq as ss

    rows, ratios = [], {}
    for kind in ("gaussian", "poisson", "poisson batch"):
        try:
            model, start, y = _em_problem(kind)
            hl = _hmmlearn_fit(kind, start, y, iters)
        except Exception as err:  # noqa: BLE001 - a peer that cannot run is reported
            log(f"EM {kind}: skipped ({type(err).__name__}: {err})")
            continue
        fns = {
            "statseq fit_em": lambda m=model, s=start, y=y: ss.fit_em(
                m, s, y, num_iters=iters, tol=None, progress=False).params,
            "hmmlearn fit": hl,
        }
        compile_s = {}
        for name, fn in fns.items():
            _, wall, comp = timer.first(fn)
            compile_s[name] = comp if comp > 0 else wall
        res = timer.rounds(fns, min_rounds=2, budget_s=3.0)
        ratios[f"em_{kind.replace(' ', '_')}_vs_hmmlearn"] = paired_ratio(
            res["statseq fit_em"], res["hmmlearn fit"])
        for name in fns:
            rows.append([f"EM {kind}, {iters} iterations", name, fmt_s(res[name]["median"]),
                         fmt_s(res[name]["min"]), fmt_s(compile_s[name]), ""])
        log(f"EM {kind}: " + ", ".join(f"{n} {fmt_s(res[n]['min'])}" for n in fns))
    return md_table(["case", "implementation", "median", "min", "first-call compile",
                     "recompiled?"], rows), ratios


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--no-em", action="store_true")
    parser.add_argument("--only-gradient", action="store_true",
                        help="only the gradient-as-marginals rows")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_enable_x64", True)
    CompileClock()
    cases = ([(2, 10**5), (16, 10**4), (16, 10**3)] if args.quick else
             [(2, 10**6), (16, 10**5), (16, 10**3)])
    timer = Timer(min_rounds=5, budget_s=3.0 if args.quick else 8.0)
    print("load average:", load_average())
    grad_cases = ([(2, 10**4), (16, 10**3), (6, 10**4)] if args.quick else
                  [(2, 10**5), (16, 10**4), (6, 10**5)])
    grad_table, ratios = bench_gradient(timer, grad_cases, print)
    print(grad_table)
    if args.only_gradient:
        for name, r in sorted(ratios.items()):
            print(f"{name}: {r:.3f}")
        return
    table, path_ratios = bench_paths(timer, cases, print)
    ratios.update(path_ratios)
    print(table)
    if not args.no_em:
        em_table, em_ratios = bench_em(timer, print, 10 if args.quick else 20)
        ratios.update(em_ratios)
        print(em_table)
    print("load average:", load_average())
    for name, r in sorted(ratios.items()):
        print(f"{name}: {r:.3f}")
    if not args.no_record and not args.quick:
        record_ratios("hmm_paths", ratios,
                      command="nice -n 10 python benchmarks/bench_hmm_paths.py")


if __name__ == "__main__":
    main()
