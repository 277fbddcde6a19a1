"""Length buckets: a bounded number of compiled programs over many sequence lengths.

Every compiled program is specialised to the length of the time axis, so a process that
scores or filters series of thousands of distinct lengths (a panel of series, a loop over
windows) compiles thousands of programs; each keeps its machine code mapped, and after
about 2,000 lengths XLA:CPU runs out of memory mappings. statseq therefore pads the time
axis of a new length up to a *bucket length* on a geometric ladder,

    1, 2, ..., 8, then 2^k * (1, 1.25, 1.5, 1.75) for 2^k >= 8:  10, 12, 14, 16, 20, 24, ...

(at most 25% more steps, four buckets per doubling: 45 buckets up to 5,000 steps) and the
padded steps are invisible: the filter freezes its state after the last real step and
scores nothing there, so log-likelihoods, per-step values and the final state of the real
steps are those of the unpadded series (a test checks every model family), and outputs are
cut back to the real length.

The policy (`set_length_buckets`): in the default ``"auto"`` mode the first
``exact_lengths`` (32) distinct lengths a process sees keep programs of their own, with no
padding (a script that works with a few series pays nothing), and every later new length is
padded to its bucket; ``"always"`` pads every length from the start, ``"never"`` never pads.
Padding is used by `statseq.log_prob`, `statseq.filter`, `statseq.forecast` and the
``filter_states``/``smoother`` of hidden Markov and linear Gaussian models; a model whose
parameters have a time axis (a time-varying state space model) declares
``supports_length_buckets = False`` and is never padded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

_MODES = ("auto", "always", "never")

#: smallest length that is ever padded (below it every length is its own bucket)
_LADDER_START = 8

_state = {"mode": "auto", "exact_lengths": 32}
_exact_seen: set[int] = set()


def bucket_length(num_timesteps: int) -> int:
    """The smallest length on the ladder ``1..8, 2^k * (1, 1.25, 1.5, 1.75)`` that is
    ``>= num_timesteps``.

    Args:
        num_timesteps: a length ``>= 1``.

    Returns:
        The bucket length (``num_timesteps`` itself up to 8, then at most 25% more).

    Examples:
        >>> [bucket_length(t) for t in (1, 8, 9, 17, 100, 1000, 5000)]
        [1, 8, 10, 20, 112, 1024, 5120]
    """
    n = int(num_timesteps)
    if n < 1:
        raise ValueError(f"num_timesteps must be >= 1, got {num_timesteps}")
    if n <= _LADDER_START:
        return n
    base = 1 << (n.bit_length() - 1)  # largest power of two <= n (>= 8)
    for step in (4, 5, 6, 7, 8):
        if base * step // 4 >= n:
            return base * step // 4
    raise AssertionError("unreachable")  # pragma: no cover


def set_length_buckets(mode: str = "auto", *, exact_lengths: int = 32) -> dict:
    """Choose when statseq pads the time axis to a bucket length (see `statseq.core.buckets`).

    Args:
        mode: ``"auto"`` (default): the first ``exact_lengths`` distinct lengths seen by the
            process get exact programs, later new lengths are padded to their bucket;
            ``"always"``: pad every length; ``"never"``: never pad (one compiled program
            per length, as without buckets).
        exact_lengths: how many distinct lengths ``"auto"`` keeps exact.

    Returns:
        The previous settings, as keyword arguments for another call (to restore them).

    Examples:
        >>> import statseq as ss
        >>> previous = ss.set_length_buckets("always")
        >>> _ = ss.set_length_buckets(**previous)
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if isinstance(exact_lengths, bool) or not isinstance(exact_lengths, int | np.integer) \
            or exact_lengths < 0:
        raise ValueError(f"exact_lengths must be a non-negative integer, got {exact_lengths!r}")
    previous = dict(_state)
    _state["mode"], _state["exact_lengths"] = mode, int(exact_lengths)
    return previous


def padded_length(num_timesteps: int, model: Any = None) -> int | None:
    """The bucket length the time axis is padded to under the current policy, or ``None``
    when this length keeps an exact program of its own (records the length).

    Args:
        num_timesteps: the real length.
        model: the model (one with ``supports_length_buckets = False`` is never padded).

    Returns:
        `bucket_length` of ``num_timesteps`` (possibly equal to it), or ``None``.
    """
    n = int(num_timesteps)
    mode = _state["mode"]
    if mode == "never" or not getattr(model, "supports_length_buckets", True):
        return None
    if mode == "auto":
        if n in _exact_seen:
            return None
        if len(_exact_seen) < _state["exact_lengths"]:
            _exact_seen.add(n)
            return None
    return bucket_length(n)


def pad_time(array: np.ndarray, length: int, value=0) -> np.ndarray:
    """``array`` of shape ``(N, T, ...)`` padded with ``value`` along axis 1 to ``length``."""
    widths = [(0, 0)] * array.ndim
    widths[1] = (0, length - array.shape[1])
    return np.pad(array, widths, constant_values=value)


def cut_time(array, length: int, axis: int):
    """The first ``length`` entries of ``array`` along ``axis``, as a JAX array.

    Sliced in NumPy and transferred back, so that no program is compiled for the slice
    (an eager ``jax`` slice compiles one per shape, which is what buckets avoid).
    """
    import jax

    host = np.asarray(array)
    return jax.device_put(np.ascontiguousarray(host[(slice(None),) * axis + (slice(0, length),)]))


def cut_steps(result: NamedTuple, num_valid: int, axis: int, *, steps: Sequence[str] = (),
              lags: Sequence[str] = ()) -> NamedTuple:
    """A result NamedTuple with its per-step fields cut back to the real length.

    Args:
        result: a NamedTuple of arrays whose time axis is ``axis``.
        num_valid: the real number of steps.
        axis: the time axis (the number of batch axes before it).
        steps: names of the fields with one entry per step (cut to ``num_valid``).
        lags: names of the fields with one entry per pair of steps (cut to ``num_valid - 1``).

    Returns:
        The result with those fields cut (other fields as they were).
    """
    cut = {name: cut_time(getattr(result, name), num_valid, axis) for name in steps}
    cut.update({name: cut_time(getattr(result, name), num_valid - 1, axis) for name in lags})
    return result._replace(**cut)


#: how many compiled programs (one per data shape) `bound_cache` lets a function keep
MAX_PROGRAMS_PER_FUNCTION = 8


def bound_cache(fn: Callable, maxsize: int | None = None) -> None:
    """Drop the compiled programs of the jitted ``fn`` once it holds more than ``maxsize``.

    The fallback for routines whose results padding would change (EM's expected statistics
    include the latent values of padded steps): they still compile once per length, but a
    loop over thousands of lengths keeps at most ``maxsize`` programs (and their memory
    mappings) alive instead of all of them. Dropping a program frees its machine code
    (a test counts the mappings).

    Args:
        fn: a ``jax.jit``-wrapped function.
        maxsize: the bound (default `MAX_PROGRAMS_PER_FUNCTION`).
    """
    limit = MAX_PROGRAMS_PER_FUNCTION if maxsize is None else maxsize
    if fn._cache_size() > limit:
        fn.clear_cache()
