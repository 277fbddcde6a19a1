"""The persistent compilation cache covers every program of a small script.

A second run of the same script in a new process, with the same ``STATSEQ_CACHE_DIR``,
must compile nothing: every program of the first run (the fit's loop and the small eager
operations of initialization alike) is loaded from the cache, which needs statseq's
``jax_persistent_cache_min_compile_time_secs = 0`` and ``min_entry_size_bytes = 0``
(JAX's defaults skip programs that compile in under a second). Counted with
`jax.monitoring` events in the child (benchmarks/bench_startup.py's prelude); no timing is
asserted.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _bench_startup():
    spec = importlib.util.spec_from_file_location("_bench_startup", BENCH / "bench_startup.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_second_run_of_a_script_compiles_nothing(tmp_path):
    bench = _bench_startup()
    name = "PoissonHMM EM, earthquakes"
    repo = BENCH.parent
    cold = bench.run_child(name, str(tmp_path), repo)
    warm = bench.run_child(name, str(tmp_path), repo)
    # the script's key (2 programs), the fit loop and log_prob
    assert cold["compiled"] >= 3 and cold["hits"] == 0
    # each eager program costs a trace, a lowering and a cache lookup in every new process:
    # initialization casts with NumPy and transfers with device_put, the fit's scalars are
    # NumPy, the key is split only where used (4 programs; were 9, and 20 before that)
    assert cold["compiled"] <= 6
    assert warm["compiled"] == 0
    assert warm["hits"] == cold["compiled"]
    assert warm["result"] == cold["result"]                   # the same log-likelihood
    # the published maximum of this model (stationary 2-state Poisson HMM) on these data:
    # -log L = 342.3183 (Zucchini and MacDonald 2009, Hidden Markov Models for Time Series,
    # Section 3.4; the script runs in float32)
    assert abs(float(cold["result"]) - (-342.3183)) < 5e-3
    assert "matplotlib" not in cold["modules"]                # plotting stays lazy
