#!/usr/bin/env python
"""The eager tax of public calls (issue 13, point 2): public call vs its jitted core.

    python benchmarks/bench_public_calls.py              # T = 1e3 and 1e4, records ratios
    python benchmarks/bench_public_calls.py --quick      # T = 1e3 only, prints only
    python benchmarks/bench_public_calls.py --only HMM   # families whose name contains HMM
    python benchmarks/bench_public_calls.py --quick --fresh-params   # new params each call

For every model family a small model is built, parameters come from its own
``initialize`` on a series of the right kind (real, counts, categories, binary vectors),
and the series is a NumPy array, the way a user holds data. Two implementations are timed
on the same arrays, interleaved in rounds (`_harness.Timer`):

* ``public``: the public call, e.g. ``ss.log_prob(model, params, y)`` or
  ``model.smoother(params, y)``, with the *same* NumPy ``y`` (and inputs) passed again;
* ``jitted core``: one ``jax.jit`` of that same public function over the parameters and
  device arrays (``jax.jit(lambda p, y: ss.log_prob(model, p, y))(params, y_dev)``). It
  computes the same numbers in one compiled program, with nothing eager per call.

The ratio is statseq public time / jitted core time (the median over rounds of the
per-round ratio, and the ratio of minima). Both results are compared before timing (to
1e-9 relative in float64), so a wrong answer is never timed. Speed is reported, never
asserted; ``--record`` writes ``benchmarks/ratios/public.json`` (`_harness.record_ratios`).

``--fresh-params`` times the realistic case of a likelihood evaluated on a grid of
parameter values or inside a user's own optimizer: every call (public and core alike) gets
a *new* parameters object with the same data. The objects come from a pool made before
timing (a copy of every leaf, ``jnp.array(a, copy=True)``: equal values, new arrays, checked
equal, and the public answer on a copy is checked identical to the one on the original), one
pool per side and per case, never reused, so no identity memo can hit. Its ratios are keyed
``"... | public / jitted core, fresh params"`` and ``--record`` writes them to
``benchmarks/ratios/public_fresh.json`` (the default mode's file is left alone).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _harness import Timer, fmt_s, load_average, md_table, paired_ratio, record_ratios  # noqa: E402


def _families(ss, np):
    """(name, model, kind, needs inputs, methods) for every family."""
    smooth = ("log_prob", "smoother")
    return [
        ("AR(2)", ss.AR(order=2), "real", False, ("log_prob", "filter")),
        ("PoissonHMM K=3", ss.PoissonHMM(num_states=3), "count", False,
         smooth + ("viterbi",)),
        ("GaussianHMM K=3 D=2", ss.GaussianHMM(num_states=3, emission_dim=2), "real2", False,
         smooth),
        ("CategoricalHMM K=3", ss.CategoricalHMM(num_states=3, num_classes=4), "category",
         False, smooth),
        ("BernoulliHMM K=2 D=3", ss.BernoulliHMM(num_states=2, emission_dim=3), "binary",
         False, smooth),
        ("AR-HMM K=2 D=2", ss.LinearAutoregressiveHMM(num_states=2, emission_dim=2), "real2",
         False, smooth),
        ("input-driven PoissonHMM K=2", ss.PoissonHMM(num_states=2, input_dim=1), "count",
         True, smooth),
        ("LGSSM n=2", ss.LinearGaussianSSM(state_dim=2, emission_dim=None), "real", False,
         smooth),
        ("LocalLevel", ss.LocalLevel(), "real", False, smooth),
        ("Structural trend+seasonal(4)",
         ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(period=4))), "real", False,
         smooth),
        ("MS-AR K=2 p=1", ss.MarkovSwitchingAR(num_regimes=2, order=1), "real", False,
         smooth + ("viterbi",)),
        ("ElmanRNN H=8", ss.ElmanRNN(hidden_dim=8), "real", False, ("log_prob",)),
        ("ESN H=8", ss.ElmanRNN(hidden_dim=8, echo_state=True), "real", False,
         ("log_prob",)),
        ("GRU H=8", ss.GRU(hidden_dim=8), "real", False, ("log_prob",)),
        ("LSTM H=8", ss.LSTM(hidden_dim=8), "real", False, ("log_prob",)),
        ("Mamba H=8 N=4", ss.Mamba(hidden_dim=8, state_dim=4), "real", False, ("log_prob",)),
        ("LRU H=8 N=4", ss.LRU(hidden_dim=8, state_dim=4), "real", False, ("log_prob",)),
    ]


def _data(np, kind, T, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "real":
        return np.cumsum(rng.normal(size=T)) * 0.1 + rng.normal(size=T)
    if kind == "real2":
        return np.cumsum(rng.normal(size=(T, 2)), axis=0) * 0.1 + rng.normal(size=(T, 2))
    if kind == "count":
        return rng.poisson(np.where(np.arange(T) % 200 < 100, 2.0, 8.0))
    if kind == "category":
        return rng.integers(0, 4, size=T)
    if kind == "binary":
        return (rng.random((T, 3)) < 0.4).astype(np.int64)
    raise ValueError(kind)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T = 1e3 only, fewer repeats")
    parser.add_argument("--only", default=None, help="families whose name contains this")
    parser.add_argument("--record", action="store_true",
                        help="write benchmarks/ratios/public.json")
    parser.add_argument("--budget", type=float, default=0.6,
                        help="seconds of interleaved rounds per case")
    parser.add_argument("--fresh-params", action="store_true",
                        help="a new params object on every call (pool made before timing)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the ratios here (e.g. to compare two versions)")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import statseq as ss
    from statseq.models.hmm import base as hmm_base

    # the HMM posteriors' eager check that the data have nonzero probability cannot run
    # under a trace; the jitted core skips it (statseq itself skips it under a trace since
    # issue 13; this shim lets the same script time older versions)
    check = hmm_base._check_possible

    def _check_possible(lp, method):
        if not isinstance(lp, jax.core.Tracer):
            check(lp, method)

    hmm_base._check_possible = _check_possible

    lengths = (1000,) if args.quick else (1000, 10_000)
    timer = Timer(min_rounds=15 if args.quick else 30, budget_s=args.budget)
    rows, ratios = [], {}
    started = time.time()
    for name, model, kind, with_inputs, methods in _families(ss, np):
        if args.only and args.only.lower() not in name.lower():
            continue
        for T in lengths:
            y = _data(np, kind, T)
            u = np.random.default_rng(1).normal(size=(T, 1)) if with_inputs else None
            params = model.initialize(y, key=jax.random.key(0), inputs=u) if with_inputs \
                else model.initialize(y, key=jax.random.key(0))
            y_dev = jax.device_put(y.astype(np.int32) if y.dtype.kind in "iu" else y)
            u_dev = None if u is None else jax.device_put(u)
            for method in methods:
                if method in ("log_prob", "filter"):
                    call = getattr(ss, method)

                    def run(p, y=y, u=u, model=model, call=call):
                        return call(model, p, y, inputs=u)
                    fn = jax.jit(lambda p, yy, uu, model=model, call=call: call(
                        model, p, yy, inputs=uu))
                elif method == "viterbi":  # no inputs in the families timed
                    call = (getattr(model, "most_likely_states", None)
                            or model.most_likely_regimes)

                    def run(p, y=y, call=call):
                        return call(p, y)
                    fn = jax.jit(lambda p, yy, uu, call=call: call(p, yy))
                else:
                    def run(p, y=y, u=u, model=model):
                        if u is None:
                            return model.smoother(p, y)
                        return model.smoother(p, y, inputs=u)
                    fn = jax.jit(lambda p, yy, uu, model=model: (
                        model.smoother(p, yy) if uu is None else
                        model.smoother(p, yy, inputs=uu)))

                if args.fresh_params:
                    # one new params object per call, never reused (+2: the first calls)
                    size = timer.max_rounds + 2
                    pools = [[jax.tree.map(lambda a: jnp.array(a, copy=True), params)
                              for _ in range(size)] for _side in range(2)]
                    for pool in pools:
                        for copy in (pool[0], pool[-1]):
                            for x, z in zip(jax.tree.leaves(copy), jax.tree.leaves(params),
                                            strict=True):
                                assert x is not z and np.array_equal(np.asarray(x),
                                                                     np.asarray(z))
                    same = jax.block_until_ready(run(params))
                    next_pub, next_core = (iter(pool).__next__ for pool in pools)

                    def public(run=run, nxt=next_pub):
                        return run(nxt())

                    def core(fn=fn, nxt=next_core, y_dev=y_dev, u_dev=u_dev):
                        return fn(nxt(), y_dev, u_dev)
                else:
                    def public(run=run, params=params):
                        return run(params)

                    def core(fn=fn, params=params, y_dev=y_dev, u_dev=u_dev):
                        return fn(params, y_dev, u_dev)

                a, t_first, c_first = timer.first(public)
                if args.fresh_params:  # a copy of the params gives the very same answer
                    for x, z in zip(jax.tree.leaves(a), jax.tree.leaves(same), strict=True):
                        np.testing.assert_array_equal(np.asarray(x), np.asarray(z),
                                                      err_msg=f"{name} {method} fresh")
                b, _, _ = timer.first(core)
                for x, z in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
                    np.testing.assert_allclose(np.asarray(x), np.asarray(z), rtol=1e-9,
                                               atol=1e-9, err_msg=f"{name} {method}")
                res = timer.rounds({"public": public, "core": core})
                pub, cor = res["public"], res["core"]
                med = paired_ratio(pub, cor)
                rmin = pub["min"] / cor["min"]
                key = f"{method} {name} T=1e{int(np.log10(T))} | public / jitted core"
                if args.fresh_params:
                    key += ", fresh params"
                ratios[key] = med
                flag = " (recompiled!)" if pub["recompiled"] or cor["recompiled"] else ""
                rows.append([method, name, f"1e{int(np.log10(T))}", fmt_s(pub["median"]),
                             fmt_s(pub["min"]), fmt_s(cor["median"]), fmt_s(cor["min"]),
                             f"{med:.2f}", f"{rmin:.2f}{flag}", pub["n"]])
                print(" | ".join(map(str, rows[-1])), flush=True)
    table = md_table(["call", "family", "T", "public median", "public min", "core median",
                      "core min", "ratio (paired median)", "ratio of minima", "rounds"],
                     rows)
    print()
    print(table)
    print(f"\nload average {load_average()}, {time.time() - started:.0f} s")
    if args.json is not None:
        import json

        args.json.write_text(json.dumps({"load_average": load_average(), "rows": rows,
                                         "ratios": ratios}, indent=1))
    if args.record:
        command = "nice -n 10 python benchmarks/bench_public_calls.py " + " ".join(
            sys.argv[1:])
        family = "public_fresh" if args.fresh_params else "public"
        print(record_ratios(family, ratios, command=command.strip()))


if __name__ == "__main__":
    main()
