"""Data parallelism (`statseq.distributed`): a batch sharded over several devices gives the
single-device results to 1e-12 in float64, and two `jax.distributed` processes give the
single-process ones.

Both run in subprocesses (4 virtual CPU devices from ``XLA_FLAGS``; x64), so the rest of the
suite keeps its one device; the checks themselves are `_data_parallel_checks.py` (one
process, many checks) and `_multihost_worker.py` (one of two processes).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
TOL = 1e-12


def _env(num_devices: int) -> dict:
    # keeps conftest's flags (XLA at -O0: faster compiles) and adds the virtual devices
    flags = os.environ.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count",
                                                    "--ignored_device_count")
    flags = " ".join(f for f in flags.split() if not f.startswith("--ignored_device_count"))
    return dict(os.environ,
                XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={num_devices}",
                JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu", STATSEQ_NO_COMPILATION_CACHE="1",
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sharded():
    out = subprocess.run([sys.executable, str(HERE / "_data_parallel_checks.py")],
                         capture_output=True, text=True, env=_env(4), timeout=900, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    return _last_json(out.stdout)


def test_sharded_equals_unsharded(sharded):
    # 7 sequences padded to 8 over 4 devices, missing data, one sequence wholly missing
    expected = {f"{m}.{c}" for m in ("poisson_hmm", "ar", "lgssm", "local_level", "gru")
                for c in ("log_prob", "padded_log_prob", "sharding_kept")}
    expected |= {"poisson_hmm.filter", "poisson_hmm.smoother", "lgssm.smoother",
                 "poisson_hmm.em_trace", "poisson_hmm.em_params", "lgssm.em_trace",
                 "lgssm.em_params", "poisson_hmm.sgd_params", "gru.sgd_params",
                 "poisson_hmm.sgd_minibatch", "nuts.parallel_chains", "svi.sharded_panel"}
    assert expected <= set(sharded), expected - set(sharded)
    bad = {k: v for k, v in sharded.items() if not v <= TOL}
    assert not bad, bad


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one():
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(HERE / "_multihost_worker.py"), str(port),
                               str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env(2)) for i in range(2)]
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=600)
            assert p.returncode == 0, stderr[-4000:]
            outs.append(_last_json(stdout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, got in enumerate(outs):
        assert got["process"] == i
        assert got["global_shape"] == [8, 20] and got["addressable"] is False
        for name in ("log_prob", "em_trace", "em_params", "sgd_params"):
            assert got[name] <= TOL, (i, name, got[name])
