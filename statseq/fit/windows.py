"""Windows cut from long series: minibatches for truncated backpropagation through time.

A long series ``y_{1:T}`` is cut into windows ``y_{s:s+L-1}`` starting every ``stride``
steps. Each window is filtered from the model's initial state, so gradients flow only
within a window (truncated BPTT). The first ``warmup`` steps of a window drive the state
but are not scored: the objective is

    sum_windows sum_{j >= warmup} log p(y_{s+j} | y_{s:s+j-1}),

an approximation of ``log p(y_{1:T})`` whose conditioning window is at least ``warmup``
steps. Each time step is scored at most once (by the first window that reaches it past
its warmup; the window at the start of the series scores its first steps too, since
nothing precedes them), so with the default ``stride = length - warmup`` every step is
scored exactly once. Pass the result to `statseq.fit_sgd` with ``batch_size`` for
minibatches of windows.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from statseq.core.validation import check_positive_int


class Windows(NamedTuple):
    """A batch of windows (NumPy arrays).

    Attributes:
        y: ``(num_windows, length) + event_shape``.
        mask: booleans like ``y`` (``True`` = observed).
        inputs: ``(num_windows, length, input_dim)``, or ``None`` when none were given.
        scored: ``(num_windows, length)`` booleans: the steps that count in the objective
            (pass as ``scored=`` to `statseq.fit_sgd`).
        starts: ``(num_windows,)`` index of each window's first step in the series.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> w = ss.make_windows(np.arange(10.0), length=4, warmup=1)
        >>> w.y.shape, w.scored.shape
        ((3, 4), (3, 4))
        >>> sorted(w.fit_kwargs())                       # pass to fit_sgd as **w.fit_kwargs()
        ['inputs', 'mask', 'scored', 'y']
    """

    y: Any
    mask: Any
    inputs: Any
    scored: Any
    starts: Any

    def fit_kwargs(self) -> dict:
        """``y`` plus the keywords to pass to `statseq.fit_sgd` (``mask``, ``inputs``,
        ``scored``): ``ss.fit_sgd(model, params, **windows.fit_kwargs(), ...)``."""
        return {"y": self.y, "mask": self.mask, "inputs": self.inputs, "scored": self.scored}


def make_windows(y, *, length, stride=None, mask=None, inputs=None, warmup=0) -> Windows:
    """Cut one long series into overlapping windows for truncated BPTT.

    Windows start at ``0, stride, 2 stride, ...``; a last window ending at the final step
    is added when the strides do not reach it, so every step is covered. A step is scored
    by the first window that reaches it at position ``>= warmup`` (or in the window
    starting at 0), and by no other.

    Args:
        y: one series, ``(num_timesteps,) + event_shape`` (NaN allowed where ``mask`` is
            ``False``).
        length: number of steps ``L`` per window (``warmup < L <= num_timesteps``).
        stride: steps between window starts (default ``length - warmup``: every step
            scored exactly once, consecutive windows overlapping by ``warmup`` steps).
        mask: optional booleans per step or per entry (``True`` = observed).
        inputs: optional covariates ``(num_timesteps, input_dim)``.
        warmup: leading steps of each window that feed the state but are not scored.

    Returns:
        `Windows`.

    Examples:
        >>> import numpy as np
        >>> w = make_windows(np.arange(10.0), length=4, warmup=1)
        >>> w.starts.tolist(), int(w.scored.sum())
        ([0, 3, 6], 10)
    """
    y = np.asarray(y)
    if y.ndim < 1:
        raise ValueError("y must have shape (num_timesteps, ...) (one series)")
    num_t = y.shape[0]
    length = check_positive_int(length, "length")
    warmup = check_positive_int(warmup, "warmup", minimum=0)
    if warmup >= length:
        raise ValueError(f"warmup={warmup} must be smaller than length={length}")
    if length > num_t:
        raise ValueError(f"length={length} exceeds the series' {num_t} time steps")
    stride = check_positive_int(length - warmup if stride is None else stride, "stride")
    if mask is None:
        mask_arr = np.ones(y.shape, bool)
    else:
        mask_arr = np.asarray(mask)
        if mask_arr.shape == (num_t,) and y.ndim > 1:
            mask_arr = np.broadcast_to(mask_arr.reshape((num_t,) + (1,) * (y.ndim - 1)),
                                       y.shape)
        if mask_arr.shape != y.shape:
            raise ValueError(f"mask must have shape {(num_t,)} or {y.shape}; "
                             f"got {mask_arr.shape}")
        if mask_arr.dtype != bool:
            if not np.all(np.isin(mask_arr, (0, 1))):
                raise ValueError("mask must be boolean (True = observed) or 0/1")
            mask_arr = mask_arr.astype(bool)
    if inputs is not None:
        inputs = np.asarray(inputs)
        if inputs.ndim != 2 or inputs.shape[0] != num_t:
            raise ValueError(f"inputs must have shape ({num_t}, input_dim); "
                             f"got {inputs.shape}")
    starts = list(range(0, num_t - length + 1, stride))
    if starts[-1] + length < num_t:
        starts.append(num_t - length)
    starts = np.asarray(starts)
    idx = starts[:, None] + np.arange(length)
    covered = np.zeros(num_t, bool)
    scored = np.zeros(idx.shape, bool)
    for w, s in enumerate(starts):
        eligible = np.arange(length) >= (0 if s == 0 else warmup)
        scored[w] = eligible & ~covered[idx[w]]
        covered[idx[w][scored[w]]] = True
    y_w = np.where(mask_arr, y, 0)[idx]
    return Windows(
        y=y_w,
        mask=mask_arr[idx],
        inputs=None if inputs is None else inputs[idx],
        scored=scored,
        starts=starts,
    )
