"""Backend- and length-dependent defaults (`statseq.inference._backend`) and every neural
backbone's ``mode=None`` / ``parallel=None`` choice under a monkeypatched backend: the
documented table (docs/design.md, "Default evaluation modes by backend and length"). No
compiles except one tiny S4D check that a default changes the program, not the numbers."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import statseq as ss
from statseq.inference._backend import (
    QUADRATIC_MAX_BYTES,
    backend_kind,
    quadratic_fits,
    use_parallel,
)
from statseq.models.neural import aft, linear_attention, mlstm, rwkv, s4, transformer


@pytest.fixture
def backend(monkeypatch):
    """``backend(name)`` makes ``jax.default_backend()`` answer ``name`` (resolution only:
    nothing is compiled under the patch)."""

    def set_backend(name):
        monkeypatch.setattr(jax, "default_backend", lambda: name)

    return set_backend


def test_backend_kind_and_use_parallel(backend):
    assert [backend_kind(b) for b in ("cpu", "gpu", "cuda", "rocm", "METAL", "tpu")] == \
        ["cpu", "gpu", "gpu", "gpu", "gpu", "tpu"]
    for name, kind, par in (("cpu", "cpu", False), ("gpu", "gpu", True), ("tpu", "tpu", True)):
        backend(name)
        assert backend_kind() == kind and use_parallel(None) is par
        assert use_parallel(True) is True and use_parallel(False) is False
    assert use_parallel(None, "cpu") is False and use_parallel(None, "cuda") is True


def test_quadratic_fits_bound():
    assert QUADRATIC_MAX_BYTES == 128 * 2**20
    t = 1024
    exact = QUADRATIC_MAX_BYTES / t**2  # bytes per pair that fill the bound exactly at T
    assert quadratic_fits(t, exact) and not quadratic_fits(t + 1, exact)
    assert quadratic_fits(t, 1.0, max_bytes=t**2) and not quadratic_fits(t, 1.0, t**2 - 1)


def _modes(backbone_factory, method, lengths):
    bb = backbone_factory()
    fn = getattr(bb, method)
    return [fn(t) for t in lengths]


# (backbone, method, lengths, CPU modes, GPU modes): the table of docs/design.md
TABLE = [
    ("S4D", lambda: s4.S4DBackbone(input_dim=1, hidden_dim=4, state_dim=4),
     "whole_sequence_mode", (10, 1000, 10**5),
     ["recurrent"] * 3, ["convolution"] * 3),
    ("S5", lambda: ss.S5(hidden_dim=4, state_dim=4).backbone,
     "whole_sequence_mode", (10, 1000, 10**5),
     ["recurrent"] * 3, ["scan"] * 3),
    ("LinearAttention", lambda: ss.LinearAttention(hidden_dim=8).backbone,
     "resolved_mode", (64, 65, 1024, 1025),
     ["parallel", "chunked", "chunked", "chunked"],
     ["parallel", "parallel", "parallel", "chunked"]),
    ("AFT", lambda: ss.AFT(hidden_dim=16).backbone,  # 2 layers: parallel to T = 763
     "resolved_mode", (100, 763, 764, 10**4),
     ["recurrent"] * 4, ["parallel", "parallel", "recurrent", "recurrent"]),
    ("RWKV", lambda: ss.RWKV(hidden_dim=4).backbone, "mode_for", (10, 1000, 10**5),
     ["recurrent"] * 3, ["chunked"] * 3),
    ("mLSTM", lambda: ss.MLSTM(hidden_dim=4).backbone, "mode_for", (100, 256, 257, 1025),
     ["parallel", "parallel", "parallel", "chunked"],
     ["parallel", "parallel", "chunked", "chunked"]),
    ("Transformer", lambda: ss.Transformer(hidden_dim=4).backbone,
     "resolved_mode", (100, 1024, 1025),
     ["parallel", "parallel", "recurrent"], ["parallel", "parallel", "recurrent"]),
]


@pytest.mark.parametrize("row", TABLE, ids=[r[0] for r in TABLE])
def test_backbone_default_by_backend_and_length(backend, row):
    _, factory, method, lengths, cpu, gpu = row
    backend("cpu")
    assert _modes(factory, method, lengths) == cpu
    backend("gpu")
    assert _modes(factory, method, lengths) == gpu
    backend("tpu")  # TPU follows the GPU rule (not measured)
    assert _modes(factory, method, lengths) == gpu


def test_wavenet_mamba_lru_defaults(backend):
    wavenet = ss.WaveNet(hidden_dim=4).backbone
    mamba = ss.Mamba(hidden_dim=4).backbone
    lru = ss.LRU(hidden_dim=4).backbone
    for name, scan in (("cpu", False), ("gpu", True)):
        backend(name)
        assert wavenet.resolved_mode == "convolution"
        assert use_parallel(mamba.recurrence_parallel) is scan
        assert use_parallel(lru.recurrence_parallel) is scan


def test_memory_guard_of_the_quadratic_forms(backend):
    """The T^2 forms fall back once their estimate passes 128 MiB per sequence, from the
    backbone's own sizes; explicit modes and ``parallel`` are never overridden."""
    backend("gpu")
    mib = 2**20
    # AFT at width 64, 2 layers: 1.8 * 64 * 2 * 4 = 921.6 bytes per pair -> T <= 381
    assert aft.default_mode(381, hidden_dim=64) == "parallel"
    assert aft.default_mode(382, hidden_dim=64) == "recurrent"
    assert ss.AFT(hidden_dim=64).backbone.resolved_mode(1000) == "recurrent"
    assert ss.AFT(hidden_dim=64, mode="parallel").backbone.resolved_mode(1000) == "parallel"
    # linear attention: 2.7 H L s per pair; 16 heads x 8 layers at T = 1000: 1.3 GiB
    assert linear_attention.default_mode(1000, 64, num_heads=16, num_layers=8) == "chunked"
    assert ss.LinearAttention(hidden_dim=16, num_heads=16, num_layers=8).backbone \
        .resolved_mode(1000) == "chunked"
    assert linear_attention.default_mode(1000, 64, max_bytes=40 * mib) == "chunked"
    assert linear_attention.default_mode(1000, 64, max_bytes=42 * mib) == "parallel"
    # mLSTM: 7.5 H L s per pair
    assert mlstm.default_mode(256, num_heads=16, num_layers=8) == "chunked"  # 240 MiB
    assert mlstm.default_mode(256, num_heads=8, num_layers=4) == "parallel"  # 60 MiB
    # Transformer: 3.8 H L s per score of T x (W + T)
    assert transformer.default_mode(1000, num_heads=8, num_layers=6, max_len=256) == \
        "recurrent"
    assert ss.Transformer(hidden_dim=16, num_heads=8, num_layers=6).backbone \
        .resolved_mode(1000) == "recurrent"
    assert transformer.default_mode(1000, num_heads=2, num_layers=2, max_len=256) == \
        "parallel"
    # the CPU rules have no memory guard (kept as measured on CPU)
    backend("cpu")
    assert transformer.default_mode(1000, num_heads=8, num_layers=6) == "parallel"
    assert mlstm.default_mode(1000, num_heads=8, num_layers=8) == "parallel"
    # RWKV's and S4D's GPU picks are linear in T: no T^2 guard
    assert rwkv.default_mode(10**6, "gpu") == "chunked"
    assert s4.default_mode(10**6, "gpu", batch=10**4, width=512, state_dim=64) == \
        "convolution"


def test_default_changes_the_program_not_the_numbers(backend):
    """S4D over 12 steps, float64: under a patched GPU backend ``mode=None`` traces the FFT
    convolution (an ``fft`` in the program), under CPU the recurrence (none), and the two
    give the same outputs to 1e-10. The backbone is called unjitted, so each backend's
    call traces afresh."""
    bb = s4.S4DBackbone(input_dim=1, hidden_dim=2, state_dim=4)
    params = bb.init_params(jax.random.key(0))
    xs = np.sin(np.arange(12.0) / 2)[:, None]
    out, jaxprs = {}, {}
    for name in ("gpu", "cpu"):
        backend(name)
        jaxprs[name] = str(jax.make_jaxpr(bb.sequence)(params, xs))
        out[name] = np.asarray(bb.sequence(params, xs))
    assert "fft" in jaxprs["gpu"] and "fft" not in jaxprs["cpu"]
    assert out["gpu"].shape == (12, 2) and out["gpu"].dtype == np.float64
    np.testing.assert_allclose(out["gpu"], out["cpu"], rtol=1e-10, atol=1e-12)
