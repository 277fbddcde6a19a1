"""Time-sharded filters, smoothers and linear recurrences (statseq.distributed.time) equal
the single-device sequential ones.

Everything runs in ONE subprocess with four virtual CPU devices
(``--xla_force_host_platform_device_count=4``), so the rest of the suite keeps its single
device. ``T = 37`` is not a multiple of 4 (blocks of 10, the last padded), and the masked
steps (HMM rows of zeros, Kalman missing entries) straddle the block boundaries at 10, 20
and 30.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from statseq.distributed import time as dt
    from statseq.inference import hmm, kalman, linear_recurrence as lr

    assert jax.device_count() == 4, jax.devices()
    mesh = dt.time_mesh()
    rng = np.random.default_rng(0)
    T, K = 37, 3
    gaps = np.zeros(T, bool)
    gaps[[8, 9, 10, 11, 19, 20, 29, 30, 31, 36]] = True  # across boundaries 10, 20, 30
    out = {}

    def diff(name, got, want):
        out[name] = [float(np.max(np.abs(np.asarray(g) - np.asarray(w)), initial=0.0))
                     for g, w in zip(got, want)]
        out[name + "/nonfinite"] = int(sum(not np.all(np.isfinite(np.asarray(g)))
                                           for g in got))

    # HMM with time-varying transitions, masked steps as rows of zeros
    pi = rng.dirichlet(np.ones(K))
    trans = rng.dirichlet(np.ones(K), (T - 1, K))
    ll = np.where(gaps[:, None], 0.0, rng.normal(size=(T, K)) * 3)
    # filter and smoother in one program: one compilation, the common scans shared
    both = jax.jit(lambda *a: (dt.hmm_filter_time_sharded(*a, mesh=mesh),
                               dt.hmm_smoother_time_sharded(*a, mesh=mesh)))
    filt, post = both(pi, trans, ll)
    diff("hmm_filter", filt, hmm.hmm_filter(pi, trans, ll))
    diff("hmm_smoother", post, hmm.hmm_smoother(pi, trans, ll))

    # LGSSM (2 states, 2 outputs, an input), missing entries and whole missing steps
    n, d = 2, 2
    arr = kalman.GaussianSSMArrays(
        jnp.array([0.3, -0.2]), jnp.array([[1.0, 0.2], [0.2, 0.5]]),
        jnp.array([[0.9, 0.1], [-0.2, 0.8]]), jnp.array([[0.5], [0.0]]), jnp.array([0.1, 0.0]),
        jnp.array([[0.3, 0.05], [0.05, 0.2]]), jnp.array(rng.normal(size=(d, n))),
        jnp.array([[0.0], [0.4]]), jnp.array([0.0, 0.2]), jnp.array([[0.5, 0.1], [0.1, 0.4]]),
        jnp.zeros((n, 0)))
    y = rng.normal(size=(T, d))
    mask = ~np.stack([gaps, gaps & (np.arange(T) % 2 == 0)], axis=1)
    u = rng.normal(size=(T, 1))
    both = jax.jit(lambda *a: (dt.kalman_filter_time_sharded(*a, mesh=mesh),
                               dt.kalman_smoother_time_sharded(*a, mesh=mesh)))
    filt, post = both(arr, y, mask, u)
    diff("kalman_filter", filt, kalman.kalman_filter(arr, y, mask, u))
    diff("kalman_smoother", post, kalman.kalman_smoother(arr, y, mask, u))

    # diagonal linear recurrence, complex, |a| near one, an initial state
    shape = (T, 3, 2)
    a = (rng.uniform(0.9, 0.999, shape) * np.exp(1j * rng.uniform(-0.3, 0.3, shape)))
    b = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    h0 = rng.normal(size=shape[1:]) + 0j
    r = jax.jit(lambda *x: dt.linear_recurrence_time_sharded(*x, mesh=mesh))
    diff("linear_recurrence", [r(a, b, h0)], [lr.linear_recurrence(a, b, h0, parallel=False)])

    # the sharded scan itself, prefixes and suffixes
    sums = jax.jit(lambda x: dt.time_sharded_scan(jnp.add, x, mesh=mesh))(jnp.arange(T * 1.0))
    # with T a multiple of the device count the result stays split over the devices
    even = jax.jit(lambda x: dt.time_sharded_scan(jnp.add, x, mesh=mesh))(jnp.arange(40.0))
    out["scan_sharding"] = str(getattr(even.sharding, "spec", ""))
    out["scan_even"] = float(np.max(np.abs(np.asarray(even) - np.cumsum(np.arange(40.0)))))
    sfx = jax.jit(lambda x: dt.time_sharded_scan(jnp.add, x, reverse=True, mesh=mesh))(
        jnp.arange(T * 1.0))
    diff("scan", [sums, sfx], [np.cumsum(np.arange(T)), np.cumsum(np.arange(T)[::-1])[::-1]])

    # one device: the local scan, nothing sharded
    one = dt.time_mesh(jax.devices()[:1])
    r1 = jax.jit(lambda *x: dt.linear_recurrence_time_sharded(*x, mesh=one))
    diff("one_device", [r1(a, b, h0)], [lr.linear_recurrence(a, b, h0, parallel=False)])
    try:
        dt.kalman_filter_time_sharded(arr._replace(initial_diffuse=jnp.ones((n, 1))), y, mask,
                                      u, mesh=mesh)
        out["diffuse_error"] = ""
    except ValueError as err:
        out["diffuse_error"] = str(err)
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def results():
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                        + " --xla_force_host_platform_device_count=4").strip()
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          env=env, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("name", ["hmm_filter", "hmm_smoother", "kalman_filter",
                                  "kalman_smoother", "linear_recurrence"])
def test_sharded_equals_sequential(results, name):
    # every field of the result (log-likelihood, per-step terms, filtered, smoothed,
    # transitions, cross-covariances): finite and within 1e-12 of the sequential one
    errors = results[name]
    assert len(errors) >= 1
    assert results[name + "/nonfinite"] == 0
    assert max(errors) < 1e-12, errors


def test_scan_prefixes_suffixes_and_sharding(results):
    assert results["scan"] == [0.0, 0.0]
    assert results["scan_even"] == 0.0
    assert "time" in results["scan_sharding"], results["scan_sharding"]


def test_one_device_is_local_scan(results):
    assert max(results["one_device"]) < 1e-12


def test_diffuse_rejected(results):
    assert "proper initial distribution" in results["diffuse_error"]
