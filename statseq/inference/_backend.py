"""Backend-dependent choices shared by the inference layers and the neural backbones.

Every ``mode=None`` / ``parallel=None`` default of the backbones is a function of the
backend (`backend_kind`) and the sequence length; the forms whose memory grows like
``T^2`` (parallel linear attention, AFT, mLSTM, the Transformer) are also bounded by an
estimate of their memory (`quadratic_fits`). The rules and their measured evidence
(CPU: `benchmarks/RESULTS.md`, "Modern backbones: training step by mode and length";
GPU: "Modern backbones on a GPU (H100, 2026-11-27)") are tabulated in ``docs/design.md``,
"Default evaluation modes by backend and length".
"""

from __future__ import annotations

import jax

#: Memory bound, per sequence, of a ``T^2`` form picked by ``mode=None``: 128 MiB, i.e.
#: 4 GiB for a batch of 32 (`quadratic_fits`).
QUADRATIC_MAX_BYTES = 128 * 2**20


def backend_kind(backend: str | None = None) -> str:
    """``"cpu"``, ``"gpu"`` or ``"tpu"``: ``backend`` (default `jax.default_backend`),
    with any other accelerator platform name (``"cuda"``, ``"rocm"``, ``"METAL"``, ...)
    read as ``"gpu"``.

    Args:
        backend: a platform name, or ``None`` for JAX's default backend.

    Returns:
        ``"cpu"``, ``"gpu"`` or ``"tpu"``.

    Examples:
        >>> backend_kind("cpu"), backend_kind("cuda"), backend_kind("tpu")
        ('cpu', 'gpu', 'tpu')
    """
    name = (jax.default_backend() if backend is None else str(backend)).lower()
    return name if name in ("cpu", "tpu") else "gpu"


def use_parallel(parallel: bool | None, backend: str | None = None) -> bool:
    """``parallel=None`` picks by backend: associative scans on GPU/TPU, ``lax.scan`` on CPU.

    On CPU (2 cores) the associative scans do several times more work than the sequential
    recursion for no gain in depth, so the sequential one is the default there. On an
    H100 (training step, batch 32, width 64, 2 layers, float32) the associative scan was
    the faster at every measured length: Mamba 4.6x at ``T = 10^2`` and 7.6x at ``10^3``,
    LRU 6.8x, 24x, 64x and 80x at ``T = 10^2 .. 10^5``.

    Args:
        parallel: ``True``/``False`` (returned as is) or ``None`` (the backend's choice).
        backend: as in `backend_kind` (``None``: JAX's default backend).

    Returns:
        Whether to use the associative scan.

    Examples:
        >>> use_parallel(None, "cpu"), use_parallel(None, "gpu"), use_parallel(False, "gpu")
        (False, True, False)
    """
    if parallel is None:
        return backend_kind(backend) != "cpu"
    return bool(parallel)


def quadratic_fits(num_timesteps: int, bytes_per_pair: float,
                   max_bytes: int | None = None) -> bool:
    """Whether a form whose memory grows like ``T^2`` stays within the bound per sequence:

        bytes_per_pair * T^2  <=  max_bytes   (`QUADRATIC_MAX_BYTES`, 128 MiB, when None).

    ``bytes_per_pair`` is the backbone's constant per ``(t, s)`` pair of one sequence,
    fitted to XLA's estimate of the training step on an H100 (batch 32, ``T = 10^3`` and
    ``10^4``; see each backbone's ``default_mode``). The bound is per sequence because the
    backbones choose their mode per sequence (a batch is the same program vmapped): 128
    MiB per sequence is 4 GiB for a batch of 32.

    Args:
        num_timesteps: ``T``.
        bytes_per_pair: estimated bytes per ``(t, s)`` pair of one sequence.
        max_bytes: the bound per sequence (``None``: `QUADRATIC_MAX_BYTES`).

    Returns:
        ``True`` when the estimate is within the bound.

    Examples:
        >>> quadratic_fits(1000, 100.0), quadratic_fits(2000, 100.0)
        (True, False)
    """
    max_bytes = QUADRATIC_MAX_BYTES if max_bytes is None else max_bytes
    return bytes_per_pair * float(num_timesteps) ** 2 <= max_bytes
