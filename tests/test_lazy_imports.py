"""`import statseq` loads only what every script needs; the rest loads on first access.

Each check runs in a fresh interpreter (this process has imported everything already).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Heavy dependencies that a plain `import statseq` must not load (each costs 0.1-0.6 s).
HEAVY = ["pandas", "matplotlib", "arviz", "optax", "scipy.stats", "dynamax", "statsmodels",
         "statseq.bayes", "statseq.datasets", "statseq.evaluation.stattests",
         "statseq.plotting", "statseq.fit.lbfgs", "statseq.fit.sgd", "statseq.distributed"]


def _run(code: str) -> dict:
    env = dict(os.environ, STATSEQ_NO_COMPILATION_CACHE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_statseq_does_not_load_heavy_modules():
    got = _run(
        "import gc, json, sys, statseq\n"
        f"heavy = {HEAVY!r}\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "y = statseq.datasets.load_earthquakes(as_array=True)\n"
        "print(json.dumps(dict(loaded=loaded, frozen=gc.get_freeze_count(),\n"
        "    statseq_file=statseq.__file__, array=[type(y).__name__, int(y.sum())],\n"
        "    pandas_after_array='pandas' in sys.modules)))\n")
    assert got["loaded"] == []
    # the array loaders read the bundled CSV without pandas (the sum: 2,072 earthquakes)
    assert got["array"] == ["ndarray", 2072] and not got["pandas_after_array"]
    # the garbage collector is left alone unless STATSEQ_GC_FREEZE opts in (_compat)
    assert got["frozen"] == 0
    assert Path(got["statseq_file"]).resolve().parent == REPO / "statseq"


def test_every_public_name_resolves_to_its_defining_object():
    got = _run(
        "import importlib, json, sys, types, statseq, statseq.evaluation as ev\n"
        "bad, kinds = [], {}\n"
        "for pkg in (statseq, ev):\n"
        "    missing = sorted(set(pkg.__all__) - set(dir(pkg)))\n"
        "    if missing: bad.append(('dir', pkg.__name__, missing))\n"
        "    for name in pkg.__all__:\n"
        "        obj = getattr(pkg, name)\n"
        "        kinds[pkg.__name__ + '.' + name] = type(obj).__name__\n"
        "        where = getattr(pkg, '_LAZY', {}).get(name, 0)\n"
        "        if where not in (0, None):\n"
        "            mod = where if '.' in where else pkg.__name__ + '.' + where\n"
        "            if getattr(importlib.import_module(mod), name) is not obj:\n"
        "                bad.append(('identity', pkg.__name__, name))\n"
        "ns = {}\n"
        "exec('from statseq import *', ns)\n"
        "star = sorted(set(statseq.__all__) - set(ns))\n"
        "from statseq import fit_em, information_criteria, datasets\n"
        "subpackages = [isinstance(getattr(statseq, m), types.ModuleType) for m in\n"
        "    ('bayes', 'evaluation', 'fit', 'interop', 'io', 'plotting', 'datasets', 'core',\n"
        "     'models', 'inference')]\n"
        "errors = []\n"
        "for pkg, name in ((statseq, 'no_such_name'), (ev, 'no_such_name')):\n"
        "    try:\n"
        "        getattr(pkg, name)\n"
        "    except AttributeError as e:\n"
        "        errors.append(str(e))\n"
        "print(json.dumps(dict(bad=bad, star=star, kinds=kinds, errors=errors,\n"
        "    forecast_is_function=isinstance(statseq.forecast, types.FunctionType),\n"
        "    datasets_is_module=isinstance(datasets, types.ModuleType),\n"
        "    pandas_now='pandas' in sys.modules, subpackages=subpackages)))\n")
    assert got["bad"] == []
    assert got["star"] == []                      # `from statseq import *` gives every name
    assert got["forecast_is_function"]            # not the submodule statseq.forecast
    assert got["datasets_is_module"]                     # loaded on access, not before
    # even with every public name touched, pandas waits for a loader that builds a pandas
    # object (statseq.datasets imports it inside those loaders)
    assert not got["pandas_now"]
    assert got["subpackages"] == [True] * 10             # `ss.evaluation.stattests` etc.
    assert got["kinds"]["statseq.fit_em"] == "function"
    assert got["kinds"]["statseq.PoissonHMM"] == "ABCMeta"
    assert got["errors"] == ["module 'statseq' has no attribute 'no_such_name'",
                             "module 'statseq.evaluation' has no attribute 'no_such_name'"]


def test_registry_and_load_need_no_prior_access(tmp_path):
    """Every model family registers itself at `import statseq` (they are not lazy), so
    `registered_models` is complete and `statseq.load` finds a class never touched."""
    path = tmp_path / "m.npz"
    code = (
        "import json, sys, numpy as np, statseq as ss\n"
        "names = sorted(ss.registered_models())\n"
        f"m = ss.registered_models()['PoissonHMM'](num_states=2)\n"
        "import jax\n"
        "p = m.initialize(np.array([0, 1, 4, 2, 3]), key=jax.random.key(0))\n"
        f"ss.save({str(path)!r}, m, p)\n"
        "print(json.dumps(names))\n")
    names = _run(code)
    assert {"AR", "PoissonHMM", "GaussianHMM", "LocalLevel", "LinearGaussianSSM",
            "MarkovSwitchingAR", "LSTM", "GRU", "Mamba", "LRU"} <= set(names)
    got = _run(
        "import json, statseq as ss\n"
        f"model, params = ss.load({str(path)!r})\n"
        "print(json.dumps([type(model).__name__, model.num_states]))\n")
    assert got == ["PoissonHMM", 2]


def test_gc_freeze_is_opt_in(monkeypatch):
    import gc

    from statseq import _compat

    monkeypatch.delenv("STATSEQ_GC_FREEZE", raising=False)
    before = gc.get_freeze_count()
    assert _compat.freeze_import_time_objects() is False
    assert gc.get_freeze_count() == before
    monkeypatch.setenv("STATSEQ_GC_FREEZE", "1")
    try:
        assert _compat.freeze_import_time_objects() is True
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
