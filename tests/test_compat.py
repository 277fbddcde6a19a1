"""Work-arounds for dependency bugs (statseq/_compat.py)."""

import os
import subprocess
import sys
import textwrap

import jaxlib
import pytest

from statseq import _compat

# 20,000 forecast paths from a basic structural model: on jaxlib 0.10.2 without the
# work-around this program never finishes (XLA's CPU pool deadlocks, 0% CPU)
_LARGE_FORECAST = textwrap.dedent("""
    import os, sys
    import jax, numpy as np
    import statseq as ss
    jax.config.update("jax_enable_x64", True)
    y = np.log(ss.datasets.load_air_passengers().to_numpy().ravel())[:96]
    m = ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(12)))
    f = ss.forecast(m, m.initialize(y), y, num_steps=12, num_samples=20000,
                    key=jax.random.key(0))
    s = np.asarray(f.samples)
    assert s.shape == (20000, 12) and np.isfinite(s).all(), s.shape
    print("XLA_FLAGS=" + os.environ.get("XLA_FLAGS", ""))
""")


def _run(code, env_extra=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_large_batched_forecast_finishes():
    out = _run(_LARGE_FORECAST)
    assert out.returncode == 0, out.stderr[-2000:]
    flagged = _compat.CPU_SCHEDULER_FLAG in out.stdout
    assert flagged == _compat.needs_cpu_scheduler_workaround(jaxlib.__version__)


def test_flag_only_for_jaxlib_0_10():
    assert _compat.needs_cpu_scheduler_workaround("0.10.2")
    assert not _compat.needs_cpu_scheduler_workaround("0.12.0.1")
    assert not _compat.needs_cpu_scheduler_workaround("0.4.35")


@pytest.mark.parametrize("case", ["opt_out", "user_flag", "after_first_computation"])
def test_xla_flags_left_alone(case):
    if not _compat.needs_cpu_scheduler_workaround(jaxlib.__version__):
        pytest.skip("this jaxlib needs no work-around")
    env, pre = {}, ""
    if case == "opt_out":
        env["STATSEQ_KEEP_XLA_FLAGS"] = "1"
    elif case == "user_flag":
        env["XLA_FLAGS"] = "--xla_cpu_enable_concurrency_optimized_scheduler=true"
    else:
        pre = "import jax.numpy as jnp; jnp.ones(2).block_until_ready()\n"
    code = pre + "import os, statseq\nprint(repr(os.environ.get('XLA_FLAGS', '')))"
    out = _run(code, env)
    assert out.returncode == 0, out.stderr[-2000:]
    expected = env.get("XLA_FLAGS", "")
    assert out.stdout.strip() == repr(expected)


# a 40 MB array allocated on a thread other than the main one (as XLA's threads allocate):
# in glibc's main heap ("[heap]" in /proc/self/maps) when statseq keeps large buffers there,
# otherwise a fresh mmap outside it
_HEAP_PROBE = textwrap.dedent("""
    import threading
    import numpy as np
    import statseq  # noqa: F401
    found = {}
    def allocate():
        a = np.ones(5_000_000)
        found["address"] = a.ctypes.data
        found["sum"] = float(a.sum())
    t = threading.Thread(target=allocate)
    t.start(); t.join()
    heap = [line.split()[0] for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
    lo, hi = (int(x, 16) for x in heap[0].split("-"))
    print("IN_HEAP" if lo <= found["address"] < hi else "OUTSIDE", found["sum"])
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or
                    __import__("platform").libc_ver()[0] != "glibc", reason="glibc only")
def test_large_buffers_come_from_the_heap_unless_opted_out():
    tuned = _run(_HEAP_PROBE, timeout=120)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    assert tuned.stdout.split() == ["IN_HEAP", "5000000.0"]
    kept = _run(_HEAP_PROBE, {"STATSEQ_KEEP_MALLOC": "1"}, timeout=120)
    assert kept.returncode == 0, kept.stderr[-2000:]
    assert kept.stdout.split() == ["OUTSIDE", "5000000.0"]
