"""A progress bar driven from inside compiled fit loops (via ``jax.debug.callback``).

The callback is a module-level function, so compiled fit programs do not depend on a
fresh closure per call and are reused across calls.
"""

from __future__ import annotations

import contextlib

import numpy as np

_STATE: dict = {"bar": None}


def report(step, value) -> None:
    """Host side: advance the active bar to ``step + 1`` and show the objective."""
    bar = _STATE["bar"]
    if bar is None:
        return
    bar.n = int(step) + 1
    bar.set_postfix_str(f"log joint {float(np.asarray(value)):.6g}", refresh=False)
    bar.refresh()


@contextlib.contextmanager
def progress_bar(total: int, description: str, enabled: bool):
    """Context manager that shows a tqdm bar for ``total`` iterations when ``enabled``."""
    if not enabled:
        yield
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=description, leave=True, dynamic_ncols=True)
    _STATE["bar"] = bar
    try:
        yield
    finally:
        _STATE["bar"] = None
        bar.close()


def trace_capacity(num_iters: int) -> int:
    """Static length of a fit's trace buffer: a power of two >= 256, so fits that differ
    only in ``num_iters`` (passed to the compiled loop as an array) share one program."""
    return max(256, 1 << (num_iters - 1).bit_length())


def update_every(num_steps: int) -> int:
    """How often (in iterations) the compiled loop reports: about 100 updates per fit."""
    return max(1, num_steps // 100)
