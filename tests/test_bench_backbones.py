"""benchmarks/bench_backbones.py: its row function, mode discovery, attention reference and
crossover arithmetic, on tiny cases (T = 8, width 4, one layer; no timing claims)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_backbones.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("_bench_backbones_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_modes_are_explicit(bench):
    """The LSTM is timed with ``evaluation="sequential"`` (never the backend default, DEER
    on a GPU), Mamba with both ``parallel=`` values, the reference as one softmax mode."""
    assert bench.modes_of("LSTM") == {"sequential": {"evaluation": "sequential"}}
    assert bench.modes_of("Mamba") == {"sequential": {"parallel": False},
                                       "scan": {"parallel": True}}
    assert bench.modes_of(bench.ATTENTION) == {"softmax": {}}
    found = bench.available_backbones(["lstm", "mamba", "attention", "nosuch"])
    assert found == {"lstm": "LSTM", "mamba": "Mamba", "attention": "attention"}


@pytest.mark.parametrize("name, mode", [("LSTM", "sequential"), ("Mamba", "scan")])
def test_row_fields_and_loss(bench, name, mode):
    """The row of one case at T = 8: every field, XLA's estimate adding up, and the timed
    step's loss equal to ``-mean(ss.log_prob)`` of the same model, parameters and data
    (float64, 1e-10 relative)."""
    batch, num_t, hidden = 2, 8, 4
    row = bench.bench_row(name, mode, num_t, batch=batch, hidden=hidden, layers=1,
                          dtype=jnp.float64, min_time_s=0.0)
    assert row["status"] == "ok", row
    assert (row["backbone"], row["mode"], row["T"], row["B"], row["d"], row["layers"]) == (
        name, mode, num_t, batch, hidden, 1)
    assert row["dtype"] == "float64" and row["finite"]
    assert row["compile_s"] > 0 and row["step_s"] > 0 and row["runs"] >= 3
    assert row["us_per_step_per_seq"] == pytest.approx(row["step_s"] / (num_t * batch) * 1e6)
    assert row["program_bytes"] == (row["temp_bytes"] + row["argument_bytes"]
                                    + row["output_bytes"])
    # the arguments are the parameters and the (B, T) float64 data, at least
    assert row["argument_bytes"] >= 8 * (row["num_params"] + batch * num_t)
    model = bench._build(getattr(ss, name), hidden, 1, bench.modes_of(name)[mode])
    y = bench.simulate(batch, num_t, np.float64)
    params = model.initialize(y, key=jax.random.key(0))
    assert row["num_params"] == sum(np.size(v) for v in jax.tree.leaves(params))
    expected = -np.mean(np.asarray(ss.log_prob(model, params, y)))
    np.testing.assert_allclose(row["loss"], expected, rtol=1e-10)


def test_attention_reference_is_causal_softmax(bench):
    """The plain-JAX fallback and the layer's flax call (when installed) against an explicit
    loop over ``t``: ``out_t = sum_{s <= t} softmax(q_t k_s / sqrt(e)) v_s``."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(5, 2, 3)) for _ in range(3))
    want = np.zeros_like(v)
    for t in range(5):
        for h in range(2):
            w = np.exp(q[t, h] @ k[: t + 1, h].T / np.sqrt(3))
            want[t, h] = (w / w.sum()) @ v[: t + 1, h]
    np.testing.assert_allclose(bench.causal_softmax_attention(q, k, v), want, rtol=1e-12)
    flax_fns = bench._flax_attention()
    if flax_fns is not None:
        attn, causal = flax_fns
        got = attn(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                   mask=causal(jnp.zeros((5,))))
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_crossover_and_extrapolation(bench):
    """Ratio 2 at T = 100 and 0.5 at T = 1000 cross at sqrt(100 * 1000) (log-log
    interpolation); the extrapolation scales the longest length by T (T^2 if quadratic)."""
    rows = [dict(backbone="X", mode=m, T=t, B=2, status="ok", runs=3, step_s=s,
                 paired={o: r for o in ("a", "b") if o != m})
            for t, ra in ((100, 2.0), (1000, 0.5))
            for m, s, r in (("a", ra, ra), ("b", 1.0, 1 / ra))]
    (c,) = bench.crossovers(rows)
    assert (c["a"], c["b"], c["B"]) == ("a", "b", 2)
    assert c["crossover_T"] == [round(np.sqrt(100 * 1000))]
    assert bench.extrapolate([(100, 1.0), (1000, 3.0)], 10_000, False) == pytest.approx(30.0)
    assert bench.extrapolate([(100, 1.0)], 1000, True) == pytest.approx(100.0)
    assert bench.extrapolate([], 1000, True) is None
