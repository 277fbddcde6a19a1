"""Several starts, keep the best: the usual defence against local optima of EM and SGD."""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from statseq.core.results import FitResult
from statseq.core.validation import check_positive_int


class RestartsResult(NamedTuple):
    """Output of `fit_restarts`.

    Attributes:
        best: the `~statseq.FitResult` with the highest final log joint.
        final_log_joints: ``(num_restarts,)`` final log joint of every start (so the spread
            of local optima is visible).
        best_index: which start won (0 is the data-driven start).
    """

    best: FitResult
    final_log_joints: np.ndarray
    best_index: int


def fit_restarts(model, y, *, key, num_restarts=10, method="em", mask=None, inputs=None,
                 **fit_kwargs) -> RestartsResult:
    """Fit from several starting points and keep the best (highest final log joint).

    Start 0 uses ``model.initialize(..., method="data")`` (quantiles, k-means, least
    squares), starts 1, 2, ... use ``method="random"`` with independent keys. Every start
    runs the same compiled fit, so extra starts cost run time, not compilation.

    Args:
        model: a statseq model with ``initialize``.
        y: data, as for the fitting function.
        key: a ``jax.random`` key.
        num_restarts: number of starts.
        method: ``"em"`` (`statseq.fit_em`) or ``"sgd"`` (`statseq.fit_sgd`;
            pass ``optimizer`` and ``num_steps``).
        mask: optional observation mask.
        inputs: optional covariates.
        **fit_kwargs: passed to the fitting function (``progress`` defaults to False).

    Returns:
        A `RestartsResult`.

    Examples:
        >>> import jax, statseq as ss
        >>> y = ss.datasets.load_earthquakes().to_numpy()
        >>> res = ss.fit_restarts(ss.PoissonHMM(num_states=2), y, key=jax.random.key(0),
        ...                       num_restarts=3, num_iters=200)
        >>> res.final_log_joints.shape
        (3,)
    """
    from statseq.fit.em import fit_em
    from statseq.fit.sgd import fit_sgd

    num_restarts = check_positive_int(num_restarts, "num_restarts")
    if method not in ("em", "sgd"):
        raise ValueError(f"method must be 'em' or 'sgd', got {method!r}")
    fit_kwargs.setdefault("progress", False)
    init_keys = jax.random.split(key, num_restarts + 1)
    fits = []
    for i in range(num_restarts):
        params = model.initialize(y, key=init_keys[i], mask=mask, inputs=inputs,
                                  method="data" if i == 0 else "random")
        if method == "em":
            fits.append(fit_em(model, params, y, mask=mask, inputs=inputs, **fit_kwargs))
        else:
            fits.append(fit_sgd(model, params, y, mask=mask, inputs=inputs,
                                key=init_keys[-1], **fit_kwargs))
    finals = np.array([f.final_log_joint for f in fits])
    best = int(np.nanargmax(np.where(np.isfinite(finals), finals, -np.inf)))
    return RestartsResult(best=fits[best], final_log_joints=finals, best_index=best)
