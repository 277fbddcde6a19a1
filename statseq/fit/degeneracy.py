"""Spurious (near-singular) maxima of Gaussian-state likelihoods: a criterion to set them aside.

The likelihood of a model whose states have their own Gaussian covariance (Gaussian and
autoregressive HMMs, a Markov switching AR with switching variance) is unbounded: one
state's mean on a data point and its variance towards 0 send it to infinity, and near
such singularities there are many local maxima in which a state explains a few close
points with a tiny variance. These *spurious* maximizers (McLachlan and Peel 2000,
sec. 3.10) often have a higher likelihood than the fit of interest, so "keep the highest
log-likelihood" picks them more often the more starts are run.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from statseq.core.validation import prepare_data, require_observed

#: default smallest ratio of a state's variance (in any direction) to the data's
MIN_VARIANCE_RATIO = 1e-3
#: default smallest expected occupancy, before ``max(D + 1, .)``
MIN_OCCUPANCY = 5.0


class SpuriousCheck(NamedTuple):
    """Output of `spurious_states`.

    Attributes:
        spurious: ``(K,)`` bool, which states are degenerate.
        occupancy: ``(K,)`` expected number of steps in each state, ``sum_t p(z_t = k | y)``.
        variance_ratio: ``(K,)`` smallest eigenvalue of each state's covariance with the
            data's coordinates scaled to unit scale (see `spurious_states`).
        min_occupancy: the occupancy threshold used.
        min_variance_ratio: the variance-ratio threshold used.

    Examples:
        >>> import jax.numpy as jnp, numpy as np, statseq as ss
        >>> from statseq.models.hmm.gaussian_params import GaussianEmissions
        >>> params = ss.HMMParams(jnp.array([0.5, 0.5]), jnp.array([[0.9, 0.1], [0.5, 0.5]]),
        ...     GaussianEmissions(jnp.array([[0.0], [8.0]]),
        ...                       jnp.array([[[1.5]], [[1e-6]]])))
        >>> y = np.r_[np.linspace(-2, 2, 40), 8.0, 8.0][:, None]
        >>> check = ss.spurious_states(ss.GaussianHMM(num_states=2, emission_dim=1), params, y)
        >>> type(check).__name__, check.spurious.tolist(), check.min_variance_ratio
        ('SpuriousCheck', [False, True], 0.001)
    """

    spurious: np.ndarray
    occupancy: np.ndarray
    variance_ratio: np.ndarray
    min_occupancy: float
    min_variance_ratio: float

    @property
    def any(self) -> bool:
        """Whether some state is spurious."""
        return bool(np.any(self.spurious))


def state_covariances(model: Any, params: Any) -> np.ndarray | None:
    """``(K, D, D)`` per-state covariances of a model whose likelihood is unbounded
    through them, else ``None`` (shared or no Gaussian variances: nothing to judge).

    Gaussian and autoregressive HMMs answer through their ``state_covariances`` (not with
    ``covariance="tied"``); a `statseq.MarkovSwitchingAR` with ``switching_variance``
    through ``params.variances``. Any other model may define
    ``spurious_state_covariances(params)`` returning such an array (or ``None``)."""
    own = getattr(model, "spurious_state_covariances", None)
    if own is not None:
        out = own(params)
        return None if out is None else np.asarray(out, np.float64)
    if getattr(model, "covariance", None) == "tied":
        return None
    emissions = getattr(params, "emissions", None)
    if emissions is not None and hasattr(model, "state_covariances"):
        return np.asarray(model.state_covariances(emissions), np.float64)
    if getattr(model, "switching_variance", False):
        return np.asarray(params.variances, np.float64)[:, None, None]
    return None


def _data_scales(model: Any, y: Any, mask: Any) -> np.ndarray:
    """Per coordinate ``min(var(y_j), var(diff(y_j)))`` over observed entries: the level
    of an autoregressive model's noise is judged against the differenced series (a
    persistent AR has a noise variance far below the data's), and the minimum keeps the
    criterion conservative for HMMs with separated, persistent regimes."""
    arr = np.asarray(y, np.float64)
    event_ndim = len(tuple(getattr(model, "event_shape", ()) or ()))
    if event_ndim == 0:
        arr = arr[..., None]
    if mask is not None:
        m = np.broadcast_to(np.asarray(mask, bool).reshape(
            np.asarray(mask).shape + (1,) * (arr.ndim - np.asarray(mask).ndim)), arr.shape)
        arr = np.where(m, arr, np.nan)
    flat = arr.reshape(-1, arr.shape[-1])
    diffs = np.diff(arr, axis=-2).reshape(-1, arr.shape[-1])
    scales = []
    for j in range(arr.shape[-1]):
        cands = [np.nanvar(c[:, j]) for c in (flat, diffs) if np.isfinite(c[:, j]).sum() > 1]
        cands = [c for c in cands if np.isfinite(c) and c > 0]
        scales.append(min(cands) if cands else 1.0)
    return np.asarray(scales)


def _threshold(value: Any, name: str) -> float:
    """``value`` as a finite float ``>= 0``, or a clear error naming ``name``."""
    if isinstance(value, bool | str | bytes) or np.ndim(value) != 0 or np.iscomplexobj(value):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def spurious_states(model: Any, params: Any, y: Any, *, mask: Any = None, inputs: Any = None,
                    min_occupancy: float | None = None,
                    min_variance_ratio: float = MIN_VARIANCE_RATIO) -> SpuriousCheck | None:
    """Which states of a fitted Gaussian-state model are degenerate (a spurious maximizer).

    State ``k`` is spurious when its expected occupancy ``n_k = sum_t p(z_t = k | y)`` is
    below ``max(D + 1, min_occupancy)`` (default 5: ``D + 1`` points are the fewest
    for which a ``D``-dimensional covariance estimate is nonsingular, and a variance
    estimated from fewer than 5 has a relative standard error over 70%), or when
    ``lambda_min(S^{-1/2} Sigma_k S^{-1/2}) < min_variance_ratio`` (default ``1e-3``),
    with ``S = diag(s_j)`` and ``s_j = min(var(y_j), var(y_j - y_{j,t-1}))``: a variance a
    thousandth of the data's, as hmmlearn's ``min_covar=1e-3`` floor on standardized data.

    Args:
        model: the model.
        params: fitted parameters.
        y: the data of the fit.
        mask: its mask.
        inputs: its inputs.
        min_occupancy: occupancy threshold (``None``: 5); ``max(D + 1, .)`` is applied.
        min_variance_ratio: variance-ratio threshold.

    Returns:
        A `SpuriousCheck`, or ``None`` when the model has no per-state Gaussian
        covariances (its likelihood has no such singularities).

    Raises:
        ValueError: a threshold is negative or not finite, or ``y`` has no observed value
            (a fit to no data has no spurious states to judge).
        TypeError: a threshold is not a real number.

    Examples:
        >>> import jax.numpy as jnp, numpy as np, statseq as ss
        >>> from statseq.models.hmm.gaussian_params import GaussianEmissions
        >>> model = ss.GaussianHMM(num_states=2, emission_dim=1)
        >>> y = np.r_[np.linspace(-2, 2, 40), 8.0, 8.0][:, None]
        >>> params = ss.HMMParams(jnp.array([0.5, 0.5]), jnp.array([[0.9, 0.1], [0.5, 0.5]]),
        ...     GaussianEmissions(jnp.array([[0.0], [8.0]]),
        ...                       jnp.array([[[1.5]], [[1e-6]]])))
        >>> check = ss.spurious_states(model, params, y)
        >>> check.spurious.tolist(), np.round(check.occupancy).tolist()
        ([False, True], [40.0, 2.0])
    """
    min_variance_ratio = _threshold(min_variance_ratio, "min_variance_ratio")
    min_occupancy = _threshold(MIN_OCCUPANCY if min_occupancy is None else min_occupancy,
                               "min_occupancy")
    covs = state_covariances(model, params)
    if covs is None:
        return None
    data = prepare_data(model, y, mask, inputs)  # the canonical shapes (one convention)
    require_observed(data, "spurious_states")
    d = covs.shape[-1]
    threshold = max(float(d + 1), min_occupancy)
    kwargs = {"mask": mask}
    if inputs is not None:
        kwargs["inputs"] = inputs
    post = model.smoother(params, y, **kwargs)
    probs = np.asarray(post.smoothed_probs, np.float64)
    occupancy = probs.reshape(-1, probs.shape[-1]).sum(0)
    inv = 1.0 / np.sqrt(_data_scales(model, np.asarray(data.y), np.asarray(data.mask)))
    scaled = covs * inv[:, None] * inv[None, :]
    ratio = np.linalg.eigvalsh(0.5 * (scaled + np.swapaxes(scaled, -1, -2)))[:, 0]
    spurious = (occupancy < threshold) | (ratio < min_variance_ratio)
    return SpuriousCheck(spurious, occupancy, ratio, threshold, float(min_variance_ratio))
