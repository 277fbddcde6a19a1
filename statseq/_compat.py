"""Work-arounds for interactions between statseq's dependencies."""

from __future__ import annotations

import sys
import warnings


def load_numpyro_fully() -> None:
    """Make every loaded numpyro submodule an attribute of its parent package.

    arviz 1.x registers numpyro as a lazily loaded module (``importlib.util.LazyLoader``)
    when it is imported before numpyro. Submodules imported through that lazy module
    (``import numpyro.distributions`` after ``import arviz``) are then missing as attributes
    of their parents, and numpyro's own ``numpyro.factor`` (which reads
    ``numpyro.distributions.distribution``) fails inside NUTS. Touching an attribute of the
    lazy module loads it; the loop then repairs any parent left without its submodule.
    """
    import numpyro

    numpyro.__version__  # noqa: B018 - loads a lazy module
    for name, module in list(sys.modules.items()):
        if not name.startswith("numpyro.") or module is None:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = sys.modules.get(parent_name)
        if parent is not None and getattr(parent, child, None) is None:
            setattr(parent, child, module)


def import_tqdm_quietly() -> None:
    """Import ``tqdm.auto`` once, without its notebook warning.

    numpyro (imported by statseq) imports ``tqdm.auto``, which in a Jupyter kernel without
    ipywidgets warns "IProgress not found" (a ``TqdmWarning``) and falls back to the plain
    text bar. statseq's progress bars are optional and work with the fallback, so the
    warning is noise: it opened every executed vignette. Importing the module here first,
    under a filter for exactly that message, silences it; later imports reuse the module.
    """
    try:
        from tqdm import TqdmWarning
    except ImportError:  # pragma: no cover - tqdm is a numpyro dependency
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)
        import tqdm.auto  # noqa: F401


CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def needs_cpu_scheduler_workaround(jaxlib_version: str) -> bool:
    """Whether this jaxlib has the CPU deadlock that `avoid_cpu_scheduler_deadlock` avoids."""
    return jaxlib_version.startswith("0.10.")


def avoid_cpu_scheduler_deadlock() -> bool:
    """Turn off XLA's concurrency-optimized CPU scheduler on jaxlib 0.10 (a deadlock).

    With jaxlib 0.10.x, executing some large batched programs on the CPU never returns: the
    calling thread waits for the program to finish while every worker thread of XLA's pool
    waits for work (0% CPU). statseq hit it drawing 20,000 forecast paths from a basic
    structural model (`statseq.forecast`, and `statseq.backtest` with 1,000 paths from
    each of 37 origins); 5,000 paths finished in 3 s. jaxlib 0.12 finishes the same
    programs, and on 0.10.2 the flag ``--xla_cpu_enable_concurrency_optimized_scheduler=false``
    does too (tests/test_compat.py runs the case in a subprocess with a time limit).

    XLA reads ``XLA_FLAGS`` when JAX creates its first backend, so this appends the flag
    only while no backend exists yet (statseq imported before the first JAX computation),
    only on jaxlib 0.10.x, and only if ``XLA_FLAGS`` does not set that option already.
    ``STATSEQ_KEEP_XLA_FLAGS=1`` leaves ``XLA_FLAGS`` untouched. Returns whether the flag
    was added.
    """
    import os

    import jaxlib
    from jax._src import xla_bridge

    if os.environ.get("STATSEQ_KEEP_XLA_FLAGS", "").strip() not in ("", "0"):
        return False
    if not needs_cpu_scheduler_workaround(jaxlib.__version__):
        return False
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" in flags:
        return False
    if xla_bridge.backends_are_initialized():
        return False
    os.environ["XLA_FLAGS"] = (flags + " " + CPU_SCHEDULER_FLAG).strip()
    return True


#: glibc ``mallopt`` parameters (``malloc.h``)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
#: buffers up to this size come from (and return to) the heap, not fresh ``mmap`` calls
HEAP_BUFFER_BYTES = 512 * 2**20


def keep_large_buffers_in_heap() -> bool:
    """Serve XLA:CPU's large buffers from glibc's heap, so each call does not fault them in.

    Every call of a compiled program allocates its temporary buffers (one block for all of
    them) and its outputs. glibc's ``malloc`` hands a block of more than 32 MiB, and any
    block too large for the small heaps it gives threads other than the main one (XLA runs
    programs on its own threads), to a fresh ``mmap``, which the kernel zeroes page by page
    on first touch and unmaps on ``free``: about 0.3-0.4 ms per MiB on every call, on this
    project's 2-core machine. The HMM filter over 10^6 steps with a block of 41 MB of
    temporaries took 33-37 ms a call, 15-19 ms with the block kept in the heap
    (``benchmarks/RESULTS.md``, "Session 21: large buffers from the heap").

    On Linux with glibc, before JAX's first computation (its threads pick their heap when
    they start), this calls ``mallopt`` so that every thread allocates from the main heap
    (``M_ARENA_MAX = 1``), blocks up to `HEAP_BUFFER_BYTES` come from it
    (``M_MMAP_THRESHOLD``), and freed memory is kept for reuse up to that much at the top
    of the heap (``M_TRIM_THRESHOLD``). It changes the whole process, not only statseq:
    up to `HEAP_BUFFER_BYTES` of freed memory stays with the process (``malloc_trim(0)``
    from ``ctypes`` returns it), and threads share one heap's lock. ``STATSEQ_KEEP_MALLOC=1``
    (set before importing statseq) leaves ``malloc`` as it is. Returns whether it applied
    the settings.
    """
    import ctypes
    import os
    import platform
    import sys

    from jax._src import xla_bridge

    if os.environ.get("STATSEQ_KEEP_MALLOC", "").strip() not in ("", "0"):
        return False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    if xla_bridge.backends_are_initialized():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # pragma: no cover - glibc without the usual soname
        return False
    return all(libc.mallopt(option, value) == 1 for option, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, HEAP_BUFFER_BYTES),
        (_M_TRIM_THRESHOLD, HEAP_BUFFER_BYTES)))


def freeze_import_time_objects() -> bool:
    """Opt-in: move the objects of statseq's import out of the garbage collector's way.

    Importing jax, numpyro and statseq creates about 130,000 container objects that live
    until the interpreter exits (modules, functions, classes, their dicts). Python's cyclic
    garbage collector walks all of them on every full collection, and several times while
    the interpreter shuts down: a process that only runs ``import statseq`` spent 0.4 s of
    its 1.5 s of CPU in that shutdown, and a warm-cache PoissonHMM fit script 0.45 s of
    2.8 s (`benchmarks/bench_startup.py`; about 0.2 s for ``import jax`` alone).
    With ``STATSEQ_GC_FREEZE=1`` set before importing statseq, `gc.freeze` (the standard
    library's tool for long-lived objects) puts every object tracked then into a permanent
    generation that collections skip; objects created later are collected as usual.
    It is off by default because it changes the whole process, not only statseq: a
    reference cycle among objects that existed at ``import statseq`` (the caller's too)
    and later becomes garbage is never collected, its ``__del__`` does not run at exit,
    and `gc.get_objects` no longer lists the frozen objects (memory tools that walk it
    miss them). Returns whether it froze.
    """
    import gc
    import os

    if os.environ.get("STATSEQ_GC_FREEZE", "").strip() in ("", "0"):
        return False
    gc.freeze()
    return True
