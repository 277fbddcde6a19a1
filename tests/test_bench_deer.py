"""benchmarks/bench_deer.py's "sequential" method is the sequential scan on every backend.

The backbones' default evaluation (``evaluation=None``) resolves to DEER on a GPU for
``T >= 1000`` (`statseq.models.neural.evaluation.resolve_evaluation`). The first H100 run
of session 15 built the benchmark's sequential reference with that default, so its
"sequential" rows at ``T >= 1000`` were DEER runs (benchmarks/RESULTS.md, "DEER at scale on
an H100"). These tests make the backend claim to be a GPU (no device needed, tracing only,
no compilation) and check which path each of the benchmark's functions takes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import statseq.inference.linear_recurrence as linear_recurrence
import statseq.models.neural.evaluation as evaluation
from statseq.models.neural.cells import RNNBackbone

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_deer.py"
T = evaluation.PARALLEL_MIN_TIMESTEPS  # the shortest length the GPU default sends to DEER


def _load_bench():
    spec = importlib.util.spec_from_file_location("_bench_deer_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def gpu_default(monkeypatch):
    """Claim a GPU backend for every ``parallel=None`` default, and record each call of
    the backbone's parallel whole-sequence path (`RNNBackbone._scan_parallel`)."""
    monkeypatch.setattr(evaluation, "use_parallel", lambda parallel: True)
    monkeypatch.setattr(linear_recurrence, "use_parallel", lambda parallel: True)
    calls = []
    original = RNNBackbone._scan_parallel

    def recording(self, params, state, xs, method):
        calls.append(method)
        return original(self, params, state, xs, method)

    monkeypatch.setattr(RNNBackbone, "_scan_parallel", recording)
    return calls


def test_the_patch_makes_the_default_parallel(gpu_default):
    """The control: under the fixture the default resolves to DEER and a backbone built
    without ``evaluation=`` takes the parallel path (what the old benchmark did)."""
    assert evaluation.resolve_evaluation(None, T) == "deer"
    n_in = _load_bench().INPUT_DIM
    rnn = RNNBackbone("gru", input_dim=n_in, hidden_dim=2)
    params = rnn.init_params(jax.random.key(0))
    state = jax.tree.map(lambda v: v[None], rnn.initial_state(params))
    jax.make_jaxpr(rnn.scan_time_major)(params, state, jnp.zeros((T, 1, n_in)))
    assert gpu_default == ["deer"]


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_sequential_method_is_the_sequential_scan(gpu_default, cell):
    bench = _load_bench()
    params, xs, ys, fwds, loss_of = bench.build(cell, 2, T, 1, jnp.float64, 5)
    jax.make_jaxpr(fwds["sequential"])(params, xs)
    jax.make_jaxpr(loss_of(fwds["sequential"]))(params, xs, ys)
    assert gpu_default == []  # never the backbone's parallel path
    # the solvers call `deer` on the cell's step with their own method: never the
    # backbone's whole-sequence path, whatever the default
    for method in ("deer", "quasi-deer", "elk", "quasi-elk"):
        jax.make_jaxpr(fwds[method])(params, xs)
    assert gpu_default == []
