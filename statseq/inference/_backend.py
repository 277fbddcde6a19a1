"""Backend-dependent choices shared by the inference layers."""

from __future__ import annotations

import jax


def use_parallel(parallel: bool | None) -> bool:
    """``parallel=None`` picks by backend: associative scans on GPU/TPU, ``lax.scan`` on CPU.

    On CPU (2 cores) the associative scans do several times more work than the sequential
    recursion for no gain in depth, so the sequential one is the default there.
    """
    if parallel is None:
        return jax.default_backend() != "cpu"
    return bool(parallel)
