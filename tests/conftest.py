"""Shared test configuration: float64, a headless matplotlib, XLA at -O0, no persistent cache.

The environment and JAX settings below must take effect before :mod:`statseq` is imported
anywhere, so they run at import time of this conftest (pytest imports it first).
"""

from __future__ import annotations

import os

# Compile time is most of the suite's time, so the tests trade XLA's optimization of the
# generated code for compile speed (-O0: about a quarter less CPU time on the Kalman tests,
# the same results to the tolerances checked; runtime-bound tests such as NUTS are
# unchanged). Benchmarks and the docs build (which executes the vignettes) run fully
# optimized. STATSEQ_TEST_XLA_OPT=1 runs the tests optimized too.
if os.environ.get("STATSEQ_TEST_XLA_OPT", "").strip() in ("", "0"):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()
# No persistent compilation cache, unless STATSEQ_CACHE_DIR names one (as .ci/run does, with
# a fresh directory per run, so that the two pytest-xdist workers and successive test
# modules reuse each other's compiled programs: about a tenth less CPU time).
if not os.environ.get("STATSEQ_CACHE_DIR"):
    os.environ["STATSEQ_NO_COMPILATION_CACHE"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")

import jax  # noqa: E402
import matplotlib  # noqa: E402

jax.config.update("jax_enable_x64", True)
matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The longest test modules, longest first (seconds of one CI core, measured Nov 26). Under
# pytest-xdist (`-n auto`, `--dist loadscope` in pyproject.toml) every module goes to one
# worker, in collection order (`--no-loadscope-reorder`: xdist's own reorder, by number of
# tests, put these few-test modules last, so the run ended with one worker on a 100 s
# module while the other idled). Starting them first lets the many short modules fill in
# around them, so the workers finish together. A module missing from the list only
# affects the balance, never what runs.
#: scripts run in subprocesses with their own devices and arguments, not test modules
#: (``--doctest-modules`` would import them in the pytest process)
collect_ignore_glob = ["distributed/_*.py"]

LONGEST_MODULES_FIRST = (
    "tests/evaluation/test_claims.py",           # ~115 s of one core (23 families, k <= 8)
    "tests/models/test_h_step_exact.py",         # ~114 s (regime-path mixtures vs references)
    "tests/bayes/test_nuts.py",                  # ~97 s of CPU under load (NUTS fits, SVI)
    "tests/fit/test_identified_counts.py",       # ~90 s (Jacobian ranks, every model)
    "tests/bayes/test_sbc.py",                   # ~80 s (119 s before it ran optimized)
    "tests/core/test_input_convention.py",       # ~77 s (every model, every entry point)
    "tests/models/neural/test_h_step_mc.py",     # ~60 s (every backbone, Monte Carlo)
    "tests/models/test_ar_gaps.py",              # ~50 s (enumeration, fit_lbfgs with gaps)
    "tests/test_docs.py",                        # README quick start 38 s in CI, doc pages
    "tests/test_cli.py",                         # `statseq demo` fixture 44 s in CI
    "tests/core/test_buckets.py",                # 3 x 17 s in CI
    "tests/bayes/test_sampler_entry_masks.py",   # ~56 s under load
    "tests/bayes/test_sampler_simplex_ties.py",  # ~40 s under load
    "tests/bayes/test_checks_lfo.py",            # ~26 s under load
)


#: The slow tier (``-m slow``; CI and the README's command run ``-m "not slow"``, from
#: pyproject's ``addopts``). Every check keeps at least one instance in the CI tier; the slow
#: tier holds repeats over models that share the code path under test. The model-wide tables
#: and the fuzz tables run the generic plumbing (validation, filters, fits, forecasts,
#: save/load) that every `ResidualStack` backbone shares: in CI they run S4D and the
#: Transformer for it (plus GRU/LSTM for the RNN cells, Mamba and LRU), and the other
#: backbones below in the slow tier; each backbone's own layer, its modes and its numerics
#: at extreme values are tested in its own file, in CI.
SLOW_TIER_MODEL_ROWS = frozenset({
    "S5", "s5", "LinearAttention", "linear_attention", "AFT", "aft", "RWKV", "rwkv",
    "MLSTM", "mlstm", "WaveNet", "wavenet", "ElmanRNN", "elman",
})
TABLE_MODULES = (
    "tests/core/test_contract.py", "tests/core/test_input_convention.py",
    "tests/fit/test_identified_counts.py", "tests/models/neural/test_h_step_mc.py",
    "tests/fuzz/",
)
#: Single tests in the slow tier, with what covers their check in CI.
SLOW_TIER_TESTS = {
    # segmentation from a Gibbs fit: test_slds_transitions.py's ARI > 0.9 test covers it
    "tests/models/test_slds.py::test_gibbs_fit_recovers_parameters_and_segments",
}
#: Mode-equivalence tests run at T in {1, 17, 1000} in CI; T = 2 in the slow tier.
SLOW_TIER_MODE_TESTS = (
    "test_modes_agree_in_log_prob_and_gradient", "test_recurrent_and_parallel_modes_agree",
    "test_queue_generation_equals_the_convolution",
)


def _slow_tier(nodeid: str) -> bool:
    path, _, rest = nodeid.partition("::")
    name, _, params = rest.partition("[")
    tokens = set(params.rstrip("]").split("-")) if params else set()
    if path.startswith(TABLE_MODULES) and tokens & SLOW_TIER_MODEL_ROWS:
        return True
    if nodeid.split("[")[0] in SLOW_TIER_TESTS:
        return True
    return name.startswith(SLOW_TIER_MODE_TESTS) and "2" in tokens


def pytest_collection_modifyitems(config, items):
    """Mark the slow tier; under pytest-xdist, move `LONGEST_MODULES_FIRST` to the front."""
    for item in items:
        if _slow_tier(item.nodeid):
            item.add_marker(pytest.mark.slow)
    if not hasattr(config, "workerinput"):
        return  # a plain run keeps pytest's order
    rank = {name: i for i, name in enumerate(LONGEST_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def log_lynx():
    """The classic log10 lynx trappings series (114 annual values, 1821-1934)."""
    import statseq as ss

    return np.log10(ss.datasets.load_lynx().to_numpy().astype(float))


@pytest.fixture
def rng():
    """A fresh, seeded NumPy generator for each test."""
    return np.random.default_rng(20240611)


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Drop JAX's in-memory compilation caches after each test module.

    A single pytest process compiles some thousands of XLA programs; keeping them all
    loaded grew the process until XLA:CPU crashed (a segfault while compiling) late in a CI
    run on 2 cores. Modules rarely share programs, so clearing costs little.
    """
    yield
    import gc

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="module")
def xla_optimized():
    """Compile this module's programs with XLA's full backend optimization.

    The suite compiles at ``--xla_backend_optimization_level=0`` (above), which saves
    compile time but about doubles the run time of the generated code. A few modules are
    runtime-bound (NUTS chains of hundreds of iterations, SBC): they opt back in with
    ``pytestmark = pytest.mark.usefixtures("xla_optimized")``. The level goes into each
    compilation's options (as ``jax.jit(..., compiler_options=...)`` would put it), so the
    persistent cache keys of the two kinds of program differ; the in-memory caches are
    cleared after the module (``_release_compiled_programs``), so no optimized program
    outlives it.
    """
    if os.environ.get("STATSEQ_TEST_XLA_OPT", "").strip() not in ("", "0"):
        yield  # the whole suite runs optimized already
        return
    from jax._src import compiler

    original = getattr(compiler, "get_compile_options", None)
    if original is None:  # a JAX without this (private) hook: the module runs at -O0
        yield
        return

    def optimized(*args, env_options_overrides=None, **kwargs):
        overrides = dict(env_options_overrides or {})
        overrides.setdefault("xla_backend_optimization_level", 3)
        return original(*args, env_options_overrides=overrides, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(compiler, "get_compile_options", optimized)
    jax.clear_caches()  # nothing compiled at -O0 earlier in this process is reused
    try:
        yield
    finally:
        mp.undo()


@pytest.fixture(scope="session", autouse=True)
def _one_program_per_length():
    """Length buckets off (`statseq.set_length_buckets("never")`) for the suite.

    The default policy pads every new length after the first 32 a process sees, so in one
    long pytest process whether a test ran padded would depend on the tests before it.
    tests/core/test_buckets.py turns buckets on explicitly and checks that padded results
    equal these unpadded ones for every model family.

    Likewise the fits' bounded program caches (`statseq.core.buckets.bound_cache` drops a
    fitting loop's programs once it holds more than ``MAX_PROGRAMS_PER_FUNCTION``) are
    unbounded here: the suite fits dozens of models in one process, and the contract test
    that a repeated fit reuses its program would otherwise depend on how many fits ran
    before it. test_buckets.py sets small bounds itself and checks them.
    """
    import statseq as ss
    from statseq.core import buckets

    ss.set_length_buckets("never")
    buckets.MAX_PROGRAMS_PER_FUNCTION = 10**9
    yield


@pytest.fixture(scope="session")
def run_vignette_smoke():
    """A function ``name -> namespace`` that runs ``vignettes/<name>.py`` top to bottom in
    smoke mode (``STATSEQ_SMOKE=1``, figures discarded) and returns its globals."""
    import runpy
    from pathlib import Path

    import matplotlib.pyplot as plt

    def run(name: str) -> dict:
        path = Path(__file__).resolve().parents[1] / "vignettes" / f"{name}.py"
        mp = pytest.MonkeyPatch()
        mp.setenv("STATSEQ_SMOKE", "1")
        mp.setattr(plt, "show", lambda *a, **k: None)
        try:
            return runpy.run_path(str(path), run_name="__main__")
        finally:
            plt.close("all")
            mp.undo()

    return run


if os.environ.get("STATSEQ_TEST_CPU_LOG"):
    # Profiling aid (off by default): append "nodeid<TAB>cpu seconds" of each test's
    # setup + call + teardown (this process's CPU time, compile threads included) to the
    # file STATSEQ_TEST_CPU_LOG names, so a suite run on a loaded machine still says
    # where its CPU time goes.
    import time as _time

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start = _time.process_time()
        yield
        with open(os.environ["STATSEQ_TEST_CPU_LOG"], "a") as fh:
            fh.write(f"{item.nodeid}\t{_time.process_time() - start:.3f}\n")
