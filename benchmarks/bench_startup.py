"""Time to first result: a small statseq script end to end in a fresh process, cold vs warm.

Each script runs in a new Python process (`sys.executable -c ...`), first with an empty
persistent compilation cache (``STATSEQ_CACHE_DIR`` = a fresh temporary directory: *cold*),
then again with the directory the cold run filled (*warm*), in alternating rounds so that
outside load hits both alike. The child times its own phases and counts JAX's compilations
with `jax.monitoring` events:

* ``interpreter``: the parent's wall time of the process minus everything the child timed
  (Python start-up, site, interpreter shutdown);
* ``import``: ``import jax.monitoring`` then ``import statseq`` (jax, numpyro, statseq);
* ``data``: loading the bundled data set as a NumPy array (``as_array=True``: the csv
  module, no pandas; until Nov 27 the scripts called ``.to_numpy()`` on the pandas series,
  which imported pandas here);
* ``first call``: the script's work (model, initialization, fit, one printed number):
  tracing, lowering, and XLA compilation (cold) or a cache load (warm), plus running;
* ``run only``: the same work called a second time in the same process (no tracing, no
  compilation): what the first call costs beyond compiling. It is timed *after* the
  script's result and is not part of ``total``.

``total`` = the process's wall time as the parent sees it, minus ``run only`` (so it is
the wall time of the script itself, interpreter included). ``compiled`` counts XLA
compilations that were not served from the persistent cache
(``/jax/core/compile/backend_compile_duration`` events minus
``/jax/compilation_cache/cache_hits``); on a warm run it must be 0. ``trace+lower`` is the
time JAX spent tracing and lowering to MLIR, which the persistent cache cannot save (it
caches compiled executables, keyed by the lowered program).

Bytecode: the children write and read Python bytecode in one temporary
``PYTHONPYCACHEPREFIX`` directory (bytecode writing on), filled before the first round by
one untimed run of each script with a throwaway compilation cache, so that cold and warm
runs alike read compiled modules, as a user's do after ``pip install`` (this machine sets
``PYTHONDONTWRITEBYTECODE=1``, under which every run compiled statseq's ~80 modules from
source, about 0.2 s of CPU; ``--no-bytecode`` keeps that). "Cold" is the compilation
cache only.

Usage (from the repository root)::

    nice -n 10 .venv/bin/python benchmarks/bench_startup.py            # 5 rounds
    nice -n 10 .venv/bin/python benchmarks/bench_startup.py --rounds 3 --no-record

Writes ``benchmarks/ratios/startup.json`` (`_harness.record_ratios`): per script, the
warm run's total over the 1 s target and warm total over cold total (lower is better).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import load_average, md_table, record_ratios  # noqa: E402

TARGET_S = 1.0

# The child prelude: phase clocks and compile counters. {body} is the script (it must define
# `work()`, returning something to print, after loading its data into module globals).
PRELUDE = r"""
import time as _time
_t0, _c0 = _time.perf_counter(), _time.process_time()
import jax.monitoring as _mon
_ev = {"backend": 0, "hits": 0, "trace_lower_s": 0.0, "backend_s": 0.0}
_progs = {}
def _dur(event, duration, fun_name="?", **_):
    if event == "/jax/core/compile/backend_compile_duration":
        _ev["backend"] += 1
        _ev["backend_s"] += duration
        _progs.setdefault(fun_name, [0, 0.0, 0.0])[0] += 1
        _progs[fun_name][2] += duration
    elif event in ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration"):
        _ev["trace_lower_s"] += duration
        _progs.setdefault(fun_name, [0, 0.0, 0.0])[1] += duration
def _cnt(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
        _ev["hits"] += 1
_mon.register_event_duration_secs_listener(_dur)
_mon.register_event_listener(_cnt)
import statseq as ss
_t1, _c1 = _time.perf_counter(), _time.process_time()
{data}
_t2, _c2 = _time.perf_counter(), _time.process_time()
{work}
_out = work()
print(_out)
_t3, _c3 = _time.perf_counter(), _time.process_time()
_first = dict(_ev)
_first_progs = sorted(([k] + v for k, v in _progs.items()), key=lambda r: -r[2] - r[3])
work()
_t4, _c4 = _time.perf_counter(), _time.process_time()
import json as _json, sys as _sys
_sys.stderr.write("STARTUP " + _json.dumps(dict(
    import_s=_t1 - _t0, data_s=_t2 - _t1, first_s=_t3 - _t2, rerun_s=_t4 - _t3,
    child_s=_t4 - _t0, import_cpu=_c1 - _c0, data_cpu=_c2 - _c1, first_cpu=_c3 - _c2,
    rerun_cpu=_c4 - _c3, child_cpu=_c4 - _c0,
    compiled=_first["backend"] - _first["hits"], hits=_first["hits"],
    trace_lower_s=_first["trace_lower_s"], backend_s=_first["backend_s"],
    programs=_first_progs, modules=sorted({m.split(".")[0] for m in _sys.modules}))) + "\n")
"""

# the data as a NumPy array (``as_array=True`` reads the CSV without pandas); checkouts
# from before Nov 27 (`--compare`) have no ``as_array`` and go through pandas
_ARRAY = ("(ss.datasets.load_{0}(as_array=True) if 'as_array' in "
          "ss.datasets.load_{0}.__code__.co_varnames else ss.datasets.load_{0}().to_numpy())")

SCRIPTS = {
    "PoissonHMM EM, earthquakes": (
        "import jax\ny = " + _ARRAY.format("earthquakes"),
        "def work():\n"
        "    m = ss.PoissonHMM(num_states=2, initial=\"stationary\")\n"
        "    p = m.initialize(y, key=jax.random.key(0))\n"
        "    fit = ss.fit_em(m, p, y, progress=False)\n"
        "    return float(ss.log_prob(m, fit.params, y))",
    ),
    "AR(2) L-BFGS, lynx": (
        "import jax, numpy as np\ny = np.log10(" + _ARRAY.format("lynx") + ")",
        "def work():\n"
        "    m = ss.AR(order=2)\n"
        "    p = m.initialize(y, key=jax.random.key(0))\n"
        "    fit = ss.fit_lbfgs(m, p, y, progress=False)\n"
        "    return float(ss.log_prob(m, fit.params, y))",
    ),
    "local level L-BFGS, Nile": (
        "y = " + _ARRAY.format("nile"),
        "def work():\n"
        "    m = ss.LocalLevel()\n"
        "    fit = ss.fit_lbfgs(m, m.initialize(y), y, progress=False)\n"
        "    return float(ss.log_prob(m, fit.params, y))",
    ),
}

KEYS = {  # stable ratio keys
    "PoissonHMM EM, earthquakes": "poisson_hmm_em_earthquakes",
    "AR(2) L-BFGS, lynx": "ar2_lbfgs_lynx",
    "local level L-BFGS, Nile": "local_level_lbfgs_nile",
}


def child_code(name: str) -> str:
    data, work = SCRIPTS[name]
    return PRELUDE.replace("{data}", data).replace("{work}", work)


def run_child(name: str, cache_dir: str, repo: Path, pycache: str | None = None) -> dict:
    """Run one script in a fresh process with ``cache_dir`` as its compilation cache.

    ``pycache``: a directory for Python's bytecode (``PYTHONPYCACHEPREFIX``, with bytecode
    writing on even if ``PYTHONDONTWRITEBYTECODE`` is set here), so that a second run reads
    statseq's modules compiled, as a user's second run does; ``None`` inherits the
    environment (with ``PYTHONDONTWRITEBYTECODE=1`` every run compiles statseq's ~80
    modules from source, about 0.2 s of CPU).
    """
    env = dict(os.environ, STATSEQ_CACHE_DIR=cache_dir)
    env.setdefault("STATSEQ_GC_FREEZE", "1")  # the opt-in faster exit (statseq._compat)
    env.pop("STATSEQ_NO_COMPILATION_CACHE", None)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    env["PYTHONPATH"] = str(repo) + os.pathsep + env.get("PYTHONPATH", "")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", child_code(name)], capture_output=True,
                         text=True, env=env, cwd=repo)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise RuntimeError(f"{name}: child failed\n{out.stderr[-3000:]}")
    line = next(s for s in out.stderr.splitlines() if s.startswith("STARTUP "))
    rec = json.loads(line[len("STARTUP "):])
    rec["wall_s"] = wall
    rec["total_s"] = wall - rec["rerun_s"]
    rec["interpreter_s"] = wall - rec["child_s"]
    rec["total_cpu"] = cpu - rec["rerun_cpu"]
    rec["interpreter_cpu"] = cpu - rec["child_cpu"]
    rec["result"] = out.stdout.strip()
    return rec


def time_imports(repos: dict, rounds: int) -> str:
    """``import statseq`` in fresh processes, one checkout per row, interleaved in rounds.

    Each child runs in its checkout's root (``python -c`` puts the working directory first
    on ``sys.path``), with the persistent cache off; ``jax`` and ``numpyro`` alone give the
    floor set by the dependencies. Returns a markdown table (wall and CPU seconds).
    """
    cases = {f"import statseq ({label})": (repo, "import statseq")
             for label, repo in repos.items()}
    first = next(iter(repos.values()))
    cases.update({"import numpyro": (first, "import numpyro"), "import jax": (first, "import jax"),
                  "python -c pass": (first, "pass")})
    res = {k: ([], []) for k in cases}
    for _ in range(rounds):
        for k, (repo, code) in cases.items():
            env = dict(os.environ, PYTHONPATH=str(repo), STATSEQ_NO_COMPILATION_CACHE="1")
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, cwd=repo, check=True)
            res[k][0].append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            res[k][1].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    rows = [[f"`{k}`", f"{statistics.median(w):.2f}", f"{min(w):.2f}",
             f"{statistics.median(c):.2f}", f"{min(c):.2f}"] for k, (w, c) in res.items()]
    return md_table(["process (start to exit)", "wall median", "wall min", "CPU median",
                     "CPU min"], rows)


def compare(other: Path, repo: Path, rounds: int) -> str:
    """Warm runs of every script here and in another checkout, interleaved in rounds.

    Each checkout gets its own cache directory, filled by one cold run per script first;
    then every round runs each script warm in both checkouts (alternating which goes
    first). Returns a markdown table of CPU and wall seconds (median / min) and the paired
    ratios this / other (median of per-round ratios, ratio of minima).
    """
    checkouts = {"this": repo, "other": other}
    caches = {k: tempfile.mkdtemp(prefix=f"statseq-startup-{k}-") for k in checkouts}
    pyc = tempfile.mkdtemp(prefix="statseq-startup-pyc-")  # paths mirrored: one for both
    runs = {(name, k): [] for name in SCRIPTS for k in checkouts}
    try:
        for name in SCRIPTS:
            for k, path in checkouts.items():
                run_child(name, caches[k], path, pyc)  # fill the caches
        for r in range(rounds):
            for name in SCRIPTS:
                order = list(checkouts) if r % 2 == 0 else list(reversed(checkouts))
                for k in order:
                    runs[(name, k)].append(run_child(name, caches[k], checkouts[k], pyc))
                print(f"round {r}: {name}: this {runs[(name, 'this')][-1]['total_cpu']:.2f} "
                      f"s CPU, other {runs[(name, 'other')][-1]['total_cpu']:.2f} s CPU",
                      file=sys.stderr)
    finally:
        for c in [*caches.values(), pyc]:
            shutil.rmtree(c, ignore_errors=True)
    rows = []
    parts = ["interpreter_cpu", "import_cpu", "data_cpu", "first_cpu", "total_cpu"]
    for name in SCRIPTS:
        for k in checkouts:
            recs = runs[(name, k)]
            rows.append([name, f"{k} ({checkouts[k]})"] + [
                f"{statistics.median(x[p] for x in recs):.2f} / {min(x[p] for x in recs):.2f}"
                for p in parts + ["total_s"]] + [
                max(x["compiled"] for x in recs),
                statistics.median(x["hits"] for x in recs)])
        a, b = runs[(name, "this")], runs[(name, "other")]
        for p in ("total_cpu", "first_cpu", "interpreter_cpu"):
            med = statistics.median(x[p] / y[p] for x, y in zip(a, b, strict=True))
            mins = min(x[p] for x in a) / min(y[p] for y in b)
            rows.append([name, f"ratio this / other, {p}", f"{med:.2f} (minima {mins:.2f})"]
                        + [""] * (len(parts) + 2))
    return md_table(["script", "checkout", "interpreter CPU", "import CPU", "data CPU",
                     "first call CPU", "**total CPU**", "total wall", "compiled (max)",
                     "programs loaded (cache hits)"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="cold+warm pairs per script")
    ap.add_argument("--no-record", action="store_true", help="do not write ratios/startup.json")
    ap.add_argument("--programs", action="store_true",
                    help="also list the programs each script's warm run traces and loads")
    ap.add_argument("--import-ab", metavar="CHECKOUT", default=None,
                    help="only time `import statseq` here against another checkout's "
                         "(e.g. the main branch), interleaved; writes nothing")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="inherit PYTHONDONTWRITEBYTECODE (before Nov 27 every run compiled "
                         "statseq's modules from source on this machine)")
    ap.add_argument("--compare", metavar="CHECKOUT", default=None,
                    help="only warm runs of every script here against another checkout's "
                         "(e.g. the main branch), interleaved; writes nothing")
    args = ap.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    if args.compare:
        print(f"load average before: {load_average()}; rounds: {args.rounds}\n")
        print(compare(Path(args.compare), repo, args.rounds))
        print(f"\nload average after: {load_average()}")
        return
    if args.import_ab:
        print(f"load average before: {load_average()}; rounds: {args.rounds}\n")
        print(time_imports({"this checkout": repo, args.import_ab: Path(args.import_ab)},
                           args.rounds))
        print(f"\nload average after: {load_average()}")
        return
    command = "nice -n 10 .venv/bin/python benchmarks/bench_startup.py" + (
        f" --rounds {args.rounds}" if args.rounds != 5 else "")
    load_before = load_average()
    results = {name: {"cold": [], "warm": []} for name in SCRIPTS}
    pyc = None if args.no_bytecode else tempfile.mkdtemp(prefix="statseq-startup-pyc-")
    if pyc is not None:
        for name in SCRIPTS:  # untimed: fill the bytecode directory
            throwaway = tempfile.mkdtemp(prefix="statseq-startup-")
            try:
                run_child(name, throwaway, repo, pyc)
            finally:
                shutil.rmtree(throwaway, ignore_errors=True)
    for r in range(args.rounds):
        for name in SCRIPTS:
            cache = tempfile.mkdtemp(prefix="statseq-startup-")
            try:  # cold: no compiled programs; warm: the cold run's
                cold = run_child(name, cache, repo, pyc)
                warm = run_child(name, cache, repo, pyc)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            if cold["result"] != warm["result"]:
                raise RuntimeError(f"{name}: cold {cold['result']} != warm {warm['result']}")
            results[name]["cold"].append(cold)
            results[name]["warm"].append(warm)
            print(f"round {r}: {name}: cold {cold['total_s']:.2f} s "
                  f"({cold['compiled']} compiled), warm {warm['total_s']:.2f} s "
                  f"({warm['compiled']} compiled, {warm['hits']} cache hits)", file=sys.stderr)
    load_after = load_average()
    if pyc is not None:
        shutil.rmtree(pyc, ignore_errors=True)

    wall = ["interpreter_s", "import_s", "data_s", "first_s", "total_s", "rerun_s",
            "trace_lower_s", "backend_s"]
    cpu = ["interpreter_cpu", "import_cpu", "data_cpu", "first_cpu", "total_cpu", "rerun_cpu"]
    wall_rows, cpu_rows, ratios = [], [], {}
    for name, runs in results.items():
        for kind in ("cold", "warm"):
            recs = runs[kind]

            def cell(p, recs=recs):
                return (f"{statistics.median(x[p] for x in recs):.2f} / "
                        f"{min(x[p] for x in recs):.2f}")

            wall_rows.append([name, kind] + [cell(p) for p in wall] + [
                max(x["compiled"] for x in recs), min(x["hits"] for x in recs)])
            cpu_rows.append([name, kind] + [cell(p) for p in cpu])
        cold, warm = runs["cold"], runs["warm"]
        key = KEYS[name]
        ratios[f"{key} | warm wall (min) / 1 s target"] = min(
            x["total_s"] for x in warm) / TARGET_S
        ratios[f"{key} | warm CPU (min) / 1 s target"] = min(
            x["total_cpu"] for x in warm) / TARGET_S
        ratios[f"{key} | warm / cold wall (paired median)"] = statistics.median(
            w["total_s"] / c["total_s"] for w, c in zip(warm, cold, strict=True))
    print(f"load average before: {load_before}; after: {load_after}; "
          f"{os.cpu_count()} cores; rounds: {args.rounds}\n")
    print("Wall seconds, median / min over rounds (`compiled`: XLA compilations not served "
          "by the persistent cache)\n")
    print(md_table(["script", "cache", "interpreter", "import", "data", "first call",
                    "**total**", "(run only)", "(trace+lower)", "(compile/load)",
                    "compiled (max)", "cache hits (min)"], wall_rows))
    print("\nCPU seconds (user+sys, all threads), median / min over rounds\n")
    print(md_table(["script", "cache", "interpreter", "import", "data", "first call",
                    "**total**", "(run only)"], cpu_rows))
    print()
    print(md_table(["ratio", "value"], [[k.replace("|", "\\|"), f"{v:.3f}"]
                                         for k, v in sorted(ratios.items())]))
    if args.programs:
        for name, runs in results.items():
            progs = runs["warm"][-1]["programs"]
            print(f"\nWarm run of {name}: {sum(p[1] for p in progs)} programs "
                  "(name, count, trace+lower s, cache load s; last round)\n")
            print(md_table(["program", "n", "trace+lower", "load"],
                           [[f"`{p[0]}`", p[1], f"{p[2]:.3f}", f"{p[3]:.3f}"] for p in progs]))
    mods = results[next(iter(SCRIPTS))]["warm"][0]["modules"]
    print(f"\ntop-level modules in the HMM script's process: {len(mods)}; heavy ones loaded: "
          f"{sorted(set(mods) & {'pandas', 'scipy', 'matplotlib', 'arviz', 'optax'})}")
    if not args.no_record:
        path = record_ratios("startup", ratios, command=command)
        print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
