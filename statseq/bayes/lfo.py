"""Leave-future-out cross-validation (LFO-CV) of Bayesian sequence models.

Bürkner, Gabry and Vehtari (2020), "Approximate leave-future-out cross-validation for
Bayesian time series models" (J. Stat. Comput. Simul. 90(14)): the expected log predictive
density of one-step-ahead forecasts from every origin ``i = L, ..., T - 1``,

    elpd_LFO = sum_{i=L}^{T-1} log p(y_{i+1} | y_{1:i}),
    p(y_{i+1} | y_{1:i}) = ∫ p(y_{i+1} | y_{1:i}, theta) p(theta | y_{1:i}) dtheta,

estimated from posterior draws. Exact LFO refits the model at every origin; PSIS-LFO
fits once at ``L`` and reweights the draws of the last fit (at origin ``i*``) by
``prod_{t=i*+1}^{i} p(y_t | y_{<t}, theta)``, smoothed by Pareto-smoothed importance
sampling (PSIS; Vehtari et al. 2024, "Pareto smoothed importance sampling", JMLR 25), and
refits only when the Pareto shape ``k`` of the weights exceeds a threshold (0.7).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from scipy.special import logsumexp

from statseq.bayes.nuts import _pointwise_log_lik, fit_nuts, posterior_params
from statseq.core.validation import check_key, check_positive_int, prepare_data


def _gpd_fit(x):
    """Generalized Pareto shape and scale of positive sorted ``x`` (Zhang and Stephens
    2009, with the weakly informative shape prior of Vehtari et al. 2024)."""
    n = x.size
    prior_bs, prior_k = 3.0, 10.0
    m = 30 + int(math.sqrt(n))
    bs = 1.0 - np.sqrt(m / (np.arange(1, m + 1) - 0.5))
    bs = bs / (prior_bs * x[int(n / 4 + 0.5) - 1]) + 1.0 / x[-1]
    ks = np.log1p(-bs[:, None] * x).mean(axis=1)
    log_lik = n * (np.log(-bs / ks) - ks - 1.0)
    w = 1.0 / np.exp(log_lik - log_lik[:, None]).sum(axis=1)
    keep = w >= 10 * np.finfo(float).eps
    w, bs = w[keep] / w[keep].sum(), bs[keep]
    b = np.sum(bs * w)
    k = np.log1p(-b * x).mean()
    sigma = -k / b
    k = (n * k + prior_k * 0.5) / (n + prior_k)
    return k, sigma


def psis(log_weights):
    """Pareto-smoothed importance sampling of one set of log weights.

    The ``M = ceil(min(0.2 S, 3 sqrt(S)))`` largest of ``S`` weights are replaced by
    expected order statistics of a generalized Pareto distribution fitted to them, and
    truncated at the largest raw weight (Vehtari et al. 2024).

    Args:
        log_weights: ``(S,)`` log importance weights (unnormalized, finite, real).

    Returns:
        ``(smoothed, k)``: normalized smoothed log weights ``(S,)`` (log-sum-exp 0) and the
        Pareto shape estimate ``k`` (reliable below 0.7; ``inf`` when the tail has fewer
        than 5 draws).

    Examples:
        >>> import numpy as np
        >>> from statseq.bayes.lfo import psis
        >>> lw, k = psis(np.random.default_rng(0).normal(size=1000))
        >>> bool(abs(np.exp(lw).sum() - 1) < 1e-12), bool(k < 0.7)
        (True, True)
    """
    raw = np.asarray(log_weights) if log_weights is not None else np.asarray([])
    if np.iscomplexobj(raw) or not (np.issubdtype(raw.dtype, np.number)
                                    or raw.dtype == bool):
        raise TypeError(f"log_weights must be real numbers, got dtype {raw.dtype}")
    if raw.ndim != 1:
        raise ValueError(f"log_weights must be one set of weights (S,), got shape {raw.shape}")
    lw = np.array(raw, float)
    if lw.size < 2 or not np.all(np.isfinite(lw)):
        raise ValueError("log_weights must be at least 2 finite values")
    n = lw.size
    lw = lw - lw.max()
    cutoff_ind = -int(math.ceil(min(0.2 * n, 3 * math.sqrt(n)))) - 1
    order = np.argsort(lw)
    cutoff = max(lw[order[cutoff_ind]], np.log(np.finfo(float).tiny))
    # the tail: weights above the cutoff's *as weights* (log weights a few ulps apart, e.g.
    # spread over 1e-300, are equal weights and leave nothing to fit: the GPD fit would
    # divide by x = 0 and return NaN)
    tail = np.flatnonzero(np.exp(lw) > np.exp(cutoff))
    k = np.inf
    if tail.size > 4:
        tail_sorted = tail[np.argsort(lw[tail])]
        x = np.exp(lw[tail_sorted]) - np.exp(cutoff)
        k, sigma = _gpd_fit(x)
        if np.isfinite(k):
            p = np.arange(0.5, tail.size) / tail.size
            quant = sigma * np.expm1(-k * np.log1p(-p)) / k if k != 0 else -sigma * np.log1p(-p)
            lw[tail_sorted] = np.log(quant + np.exp(cutoff))
            lw[lw > 0] = 0.0
    return lw - logsumexp(lw), float(k)


@dataclasses.dataclass(frozen=True)
class LFOResult:
    """Result of `lfo_cv`.

    Attributes:
        elpd: ``sum_i log p(y_{i+1} | y_{1:i})`` over the origins.
        se: its standard error, ``sqrt(n var(pointwise))`` (as for LOO).
        pointwise: ``(n,)`` one-step log predictive densities, origin ``L`` first.
        origins: ``(n,)`` the origins ``i`` (observations used; ``y[i]`` is predicted).
        pareto_k: ``(n,)`` Pareto ``k`` of the importance weights at each origin (a
            value above the threshold triggered a refit there; 0 at ``L`` and in exact
            mode).
        refits: origins at which the model was refitted (the first is ``L``).

    Examples:
        >>> import jax, statseq as ss
        >>> from statseq.bayes import lfo_cv
        >>> y = ss.datasets.load_earthquakes().to_numpy()[:40]
        >>> res = lfo_cv(ss.PoissonHMM(num_states=1), y, first_origin=39,
        ...              key=jax.random.key(0), num_warmup=50, num_samples=50, num_chains=1)
        >>> type(res).__name__, res.origins.tolist(), bool(res.elpd == res.pointwise.sum())
        ('LFOResult', [39], True)
    """

    elpd: float
    se: float
    pointwise: np.ndarray
    origins: np.ndarray
    pareto_k: np.ndarray
    refits: tuple


def _posterior_log_lik(model, idata, data):
    """``(S, T)`` one-step log predictive densities of the full series per draw."""
    draws = posterior_params(model, idata)
    lead = np.asarray(jax.tree.leaves(draws)[0]).shape[:2]
    flat = jax.tree.map(lambda a: np.reshape(np.asarray(a), (math.prod(lead),) + a.shape[2:]),
                        draws)
    ll = _pointwise_log_lik(model, flat, data.y, data.mask, data.inputs,
                            complete=data.complete)
    return np.asarray(ll).reshape(math.prod(lead), data.num_timesteps)


def lfo_cv(model, y, *, first_origin, key, pareto_k_threshold=0.7, priors=None,
           num_warmup=500, num_samples=500, num_chains=2, inputs=None, **nuts_kwargs):
    """One-step-ahead leave-future-out cross-validation with NUTS refits.

        elpd_LFO = sum_{i=L}^{T-1} log (1/S) sum_s w_s^(i) p(y_{i+1} | y_{1:i}, theta_s)

    The model is fitted by `fit_nuts` to ``y_{1:L}`` (the later steps masked, so every
    refit has the same shapes), and each later origin ``i`` reuses the draws of the
    last fit (origin ``i*``) with PSIS weights ``prod_{t=i*+1}^{i} p(y_t | y_{<t},
    theta_s)``; when their Pareto ``k`` exceeds ``pareto_k_threshold`` the model is
    refitted at ``i`` (PSIS-LFO, Bürkner, Gabry and Vehtari 2020). With
    ``pareto_k_threshold=None`` the model is refitted at every origin (exact LFO).

    Args:
        model: a statseq model.
        y: one series, ``(num_timesteps,) + event_shape``.
        first_origin: ``L``, the observations in the first fit (``1 <= L < T``).
        key: a ``jax.random`` key (keyword-only, required).
        pareto_k_threshold: refit when ``k`` exceeds this; ``None`` refits every time.
        priors: as in `fit_nuts`.
        num_warmup: NUTS warmup per chain and fit.
        num_samples: NUTS draws per chain and fit.
        num_chains: chains per fit.
        inputs: covariates ``(num_timesteps, input_dim)``, when the model takes them.
        **nuts_kwargs: passed to `fit_nuts` (e.g. ``ordered``, ``trainable``,
            ``init_params``).

    Returns:
        An `LFOResult`.

    Examples:
        >>> import jax, statseq as ss
        >>> from statseq.bayes import lfo_cv
        >>> y = ss.datasets.load_earthquakes().to_numpy()[:40]
        >>> res = lfo_cv(ss.PoissonHMM(num_states=1), y, first_origin=38,
        ...              key=jax.random.key(0), num_warmup=50, num_samples=50, num_chains=1)
        >>> res.pointwise.shape, res.refits[0]
        ((2,), 38)
    """
    check_key(key)
    yv = np.asarray(y)
    if yv.ndim != 1 + len(model.event_shape):
        raise ValueError(f"y must be one series of shape (num_timesteps,) + "
                         f"{tuple(model.event_shape)}, got shape {yv.shape}")
    num_t = yv.shape[0]
    first = check_positive_int(first_origin, "first_origin")
    if first >= num_t:
        raise ValueError(f"first_origin must be below the series length {num_t}, got {first}")
    if pareto_k_threshold is not None:
        if isinstance(pareto_k_threshold, bool | str | bytes) or np.ndim(
                pareto_k_threshold) != 0 or np.iscomplexobj(pareto_k_threshold):
            raise TypeError(f"pareto_k_threshold must be a real number or None, got "
                            f"{pareto_k_threshold!r}")
        if not float(pareto_k_threshold) > 0:
            raise ValueError(f"pareto_k_threshold must be positive or None, got "
                             f"{pareto_k_threshold}")
        draws = (check_positive_int(num_samples, "num_samples")
                 * check_positive_int(num_chains, "num_chains"))
        if draws < 2:
            raise ValueError(f"PSIS-LFO needs at least 2 posterior draws per fit; "
                             f"num_samples * num_chains = {draws} (or pass "
                             "pareto_k_threshold=None for exact LFO)")
    if "mask" in nuts_kwargs:
        raise TypeError("lfo_cv sets the mask itself; pass a fully observed y")
    if np.issubdtype(yv.dtype, np.floating) and not np.all(np.isfinite(yv)):
        raise ValueError("y must be fully observed (finite, no NaN) for lfo_cv, which sets "
                         "the mask itself")
    data = prepare_data(model, yv, None, inputs)
    if not data.complete:
        raise ValueError("y must be fully observed (no NaN) for lfo_cv")
    steps = np.arange(num_t)

    def refit(origin, k):
        mask = steps < origin
        idata = fit_nuts(model, yv, key=k, num_warmup=num_warmup, num_samples=num_samples,
                         num_chains=num_chains, priors=priors, mask=mask, inputs=inputs,
                         log_likelihood=False, **nuts_kwargs)
        return _posterior_log_lik(model, idata, data)

    origins = np.arange(first, num_t)
    pointwise = np.empty(origins.size)
    ks = np.zeros(origins.size)
    keys = jax.random.split(key, origins.size)
    ll, last, refits = refit(first, keys[0]), first, [first]
    for j, i in enumerate(origins):
        log_w = ll[:, last:i].sum(axis=1)
        if i > last:
            if pareto_k_threshold is None:
                ll, last = refit(i, keys[j]), i
                refits.append(int(i))
                log_w = np.zeros(ll.shape[0])
            else:
                smoothed, ks[j] = psis(log_w)
                if ks[j] > pareto_k_threshold:
                    ll, last = refit(i, keys[j]), i
                    refits.append(int(i))
                    log_w = np.zeros(ll.shape[0])
                else:
                    log_w = smoothed
        log_w = log_w - logsumexp(log_w)
        pointwise[j] = logsumexp(log_w + ll[:, i])
    se = float(math.sqrt(pointwise.size * np.var(pointwise))) if pointwise.size > 1 else (
        float("nan"))
    return LFOResult(float(pointwise.sum()), se, pointwise, origins, ks, tuple(refits))
