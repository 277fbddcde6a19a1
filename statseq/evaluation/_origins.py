"""One compiled program for forecasts from many origins of one series (backtests).

For origin ``o`` the filter runs over ``y_{0:o-1}`` (positions ``t >= o`` are never seen:
trailing-origin masking, so every origin shares the series' true start and its initial
law), and from the carry at ``o`` it

* scores each future value ``y_{o+k}`` (``k = 0, ..., h-1``) under the exact marginal
  predictive ``p(y_{o+k} | y_{0:o-1})``: the steps ``o, ..., o+k-1`` in between are
  conditioned on with an all-false mask, which the filter protocol requires to be exact
  marginalization (predict without update); models whose emissions read past
  observations instead give the closed-form mixture of their ``h_step_marginals`` (the
  AR-HMM and the Markov-switching AR: a Gaussian mixture over regime paths);
* draws sample paths by ancestral sampling, as `statseq.forecast` does.

For a model whose masked steps are *not* exact marginalization
(``model.marginalizes_masked_steps`` False, e.g. every neural network, which reads a masked
step as 0 plus an indicator) the marginal is estimated instead (`_rb_marginals`): the
Rao-Blackwellised ancestral Monte Carlo average

    p(y_{o+k} | y_{0:o-1}) ~= (1/S) sum_s p(y_{o+k} | y_{0:o-1}, Y^s_{o:o+k-1}),
    Y^s ~ the model's own ancestral sampler from the carry at ``o``
    (its ``sample_step`` when it has one, as `statseq.forecast` draws),

returned with its standard error on the log scale (delta method,
``sd(w) / (sqrt(S) mean(w))`` with ``w`` the path densities); ``k = 0`` is exact (SE 0).

Origins are a traced argument, so every set of origins of one count (and one set of array
shapes) reuses one compiled program; parameters may be one set for all origins or stacked
along a leading origin axis (refitting at each origin).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from statseq.core.distributions import masked_log_prob
from statseq.core.recurrence import _simulate
from statseq.inference.gaussian import masked_mvn_log_prob

#: Paths per origin of the pilot run when ``num_paths`` is left to its default.
PILOT_PATHS = 4096
#: Target standard error (nats) of every estimated log density under the default.
TARGET_SE = 0.01
#: Most paths per origin the default uses (a warning says when the target is not met).
MAX_PATHS = 1 << 20
#: Paths evaluated at once (vmapped); more paths loop over chunks of this size.
PATH_CHUNK = 1024
#: Seed of the fixed key used by `statseq.log_predictive_density` when none is passed.
DEFAULT_MC_SEED = 0


def mc_settings(model, key, num_paths, *, name="num_paths"):
    """``(key, num_paths)`` checked: ``(None, None)`` unless the model's h-step marginals
    are estimates; ``num_paths`` None means "choose it" (`paths_for_target`)."""
    from statseq.core.validation import check_key, check_positive_int

    if num_paths is not None:
        num_paths = check_positive_int(num_paths, name, 2)
    if key is not None:
        check_key(key)
    if model.marginalizes_masked_steps or hasattr(model, "h_step_marginals"):
        return None, None
    key = jax.random.key(DEFAULT_MC_SEED) if key is None else key
    return key, num_paths


def paths_for_target(se, num_paths) -> int:
    """Paths so that the largest standard error ``se`` (from ``num_paths`` paths) drops to
    `TARGET_SE` (SE falls as ``1/sqrt(S)``), with a 10 % margin, at most `MAX_PATHS`."""
    import math

    import numpy as np

    worst = float(np.nanmax(np.asarray(se, float), initial=0.0))
    if not worst > TARGET_SE:
        return int(num_paths)
    need = math.ceil(1.1 * num_paths * (worst / TARGET_SE) ** 2)
    return int(min(MAX_PATHS, -(-need // PATH_CHUNK) * PATH_CHUNK))


def _log_mean(lp, axis=0):
    """``(log mean exp(lp), its delta-method standard error)`` along ``axis``."""
    n = lp.shape[axis]
    top = jnp.max(lp, axis=axis, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    w = jnp.exp(lp - top)
    mean = jnp.mean(w, axis=axis)
    est = jnp.log(mean) + jnp.squeeze(top, axis)
    se = jnp.std(w, axis=axis, ddof=1) / jnp.sqrt(n) / mean
    return est, se


def _rb_marginals(model, p, carry, ys, ms, us, key, num_paths, dims):
    """Rao-Blackwellised Monte Carlo h-step marginals from ``carry`` (see the module doc).

    ``num_paths`` (traced) paths run in chunks of `PATH_CHUNK` (path ``j`` of chunk ``c``
    uses ``fold_in(fold_in(key, c), j)``, so a run with more paths extends one with fewer);
    only ``logsumexp`` of ``log w`` and of ``2 log w`` are kept, so memory does not grow
    with the number of paths. With ``m_r = sum w^r / S`` the estimate is ``log m_1`` and
    its delta-method standard error ``sqrt((m_2 / m_1^2 - 1) / (S - 1))`` (that is,
    ``sd(w) / (sqrt(S) mean(w))`` with the ``S - 1`` variance).

    Returns ``(log_probs (h,), se (h,), per-dim (h, D) or None, per-dim se or None)``;
    masked targets score ``NaN``; ``k = 0`` is exact (every path shares the carry; SE 0).
    """
    full = jnp.ones(tuple(model.event_shape), bool)
    h = ys.shape[0]

    def path(k):
        def body(c, xs):
            y_t, m_t, u_t, kk = xs
            d = model.predict(p, c, u_t)
            lp = masked_log_prob(d, y_t, m_t)
            lp_d = jnp.zeros((0,), lp.dtype) if dims is None else jax.vmap(
                lambda e: masked_log_prob(d, y_t, e))(dims)
            if hasattr(model, "sample_step"):  # a model drawing its own future
                return model.sample_step(p, c, kk, u_t)[1], (lp, lp_d)  # (EncoderDecoder)
            return model.update(p, c, d.sample(kk), full, u_t), (lp, lp_d)

        return jax.lax.scan(body, carry, (ys, ms, us, jax.random.split(k, h)))[1]

    lse = jax.scipy.special.logsumexp
    num_d = 0 if dims is None else dims.shape[0]

    def chunk(c, acc):
        idx = c * PATH_CHUNK + jnp.arange(PATH_CHUNK)
        ck = jax.random.fold_in(key, c)
        lp, lp_d = jax.vmap(lambda j: path(jax.random.fold_in(ck, j)))(idx - c * PATH_CHUNK)
        lp_all = jnp.concatenate([lp[:, :, None], lp_d.reshape(PATH_CHUNK, h, num_d)], -1)
        lp_all = jnp.where((idx < num_paths)[:, None, None], lp_all, -jnp.inf)
        a1, a2, first = acc
        first = jnp.where(c == 0, lp_all[0], first)
        return (jnp.logaddexp(a1, lse(lp_all, axis=0)),
                jnp.logaddexp(a2, lse(2 * lp_all, axis=0)), first)

    dtype = jnp.result_type(float)
    init = jnp.full((h, 1 + num_d), -jnp.inf, dtype)
    num_chunks = (num_paths + PATH_CHUNK - 1) // PATH_CHUNK
    a1, a2, first = jax.lax.fori_loop(0, num_chunks, chunk, (init, init, jnp.zeros_like(init)))
    s = jnp.asarray(num_paths, dtype)
    est = a1 - jnp.log(s)
    se = jnp.sqrt(jnp.maximum(s * jnp.exp(a2 - 2 * a1) - 1.0, 0.0) / (s - 1))
    k0 = (jnp.arange(h) == 0)[:, None]
    ok = jnp.concatenate([jnp.any(ms.reshape(h, -1), axis=1)[:, None],
                          ms.reshape(h, -1)[:, :num_d]], axis=1)
    est = jnp.where(ok, jnp.where(k0, first, est), jnp.nan)
    se = jnp.where(ok, jnp.where(k0, 0.0, se), jnp.nan)
    if dims is None:
        return est[:, 0], se[:, 0], None, None
    return est[:, 0], se[:, 0], est[:, 1:], se[:, 1:]


@partial(jax.jit, static_argnames=("model", "horizon", "stacked", "per_dim", "sample"))
def origin_forecasts(model, params, y, mask, inputs, origins, keys, mc_keys=None, *, horizon,
                     stacked, per_dim, sample, num_paths=None):
    """Marginal log-densities and sample paths from each origin.

    Args:
        model: the model (static).
        params: its parameters; with ``stacked`` a leading axis of ``len(origins)``.
        y: ``(T,) + event_shape`` cleaned values of one series (zeros where masked).
        mask: booleans of the shape of ``y``.
        inputs: ``(T, input_dim)``.
        origins: ``(m,)`` integers ``o`` with ``o + horizon <= T``.
        keys: ``(m, num_samples)`` keys (ignored unless ``sample``).
        horizon: forecast steps ``h``.
        stacked: whether ``params`` has a leading origin axis.
        per_dim: also score each emission dimension alone (its marginal density).
        sample: draw sample paths.
        mc_keys: ``(m,)`` keys of the Monte Carlo marginals (models with
            ``marginalizes_masked_steps`` False; ignored otherwise).
        num_paths: the number of Monte Carlo paths per origin (those models only; traced,
            so a different number reuses the compiled program).

    Returns:
        ``(log_probs (m, h), per-dim log_probs (m, h, D) or None, samples (m, S, h, *event)
        or None, (se (m, h), per-dim se (m, h, D) or None))``; masked targets score
        ``NaN``; the standard errors are 0 where the log density is exact.
    """
    event_shape = tuple(model.event_shape)
    dims = jnp.eye(int(y.shape[-1]), dtype=bool) if per_dim else None

    mc = not model.marginalizes_masked_steps and not hasattr(model, "h_step_marginals")
    if mc and (mc_keys is None or num_paths is None):
        raise ValueError(f"{type(model).__name__}'s h-step marginals are Monte Carlo "
                         "estimates: pass mc_keys and num_paths")

    def one(p, o, k, mk):
        def body(t, c):
            return model.update(p, c, y[t], mask[t], inputs[t])

        carry = jax.lax.fori_loop(0, o, body, model.initial_carry(p))
        ys = jax.lax.dynamic_slice_in_dim(y, o, horizon)
        ms = jax.lax.dynamic_slice_in_dim(mask, o, horizon)
        us = jax.lax.dynamic_slice_in_dim(inputs, o, horizon)

        def ahead(c, xs):
            y_t, m_t, u_t = xs
            # the predictive itself (not model.step, whose score may be a diffuse
            # likelihood term): an improper predictive scores NaN
            d = model.predict(p, c, u_t)
            lp = jnp.where(jnp.any(m_t), masked_log_prob(d, y_t, m_t), jnp.nan)
            lp_d = None
            if per_dim:
                lp_d = jax.vmap(lambda e: masked_log_prob(d, y_t, e))(dims)
                lp_d = jnp.where(m_t, lp_d, jnp.nan)
            unseen = jnp.zeros(event_shape, bool)
            return model.update(p, c, y_t, unseen, u_t), (lp, lp_d)

        if mc:
            lps, se, lps_d, se_d = _rb_marginals(model, p, carry, ys, ms, us, mk, num_paths,
                                                 dims)
        else:
            if hasattr(model, "h_step_marginals"):  # closed-form marginals (batch (h,))
                lps, lps_d = _mixture_scores(model.h_step_marginals(p, carry, us), ys, ms,
                                             per_dim)
            else:
                _, (lps, lps_d) = jax.lax.scan(ahead, carry, (ys, ms, us))
            se = jnp.where(jnp.isnan(lps), jnp.nan, 0.0)
            se_d = None if lps_d is None else jnp.where(jnp.isnan(lps_d), jnp.nan, 0.0)
        paths = None
        if sample:
            paths = jax.vmap(lambda kk: _simulate(model, p, carry, kk, us)[0])(k)
        return lps, lps_d, paths, (se, se_d)

    return jax.vmap(one, in_axes=(0 if stacked else None, 0, 0 if sample else None,
                                  0 if mc else None))(params, origins, keys, mc_keys)


def _mixture_scores(d, ys, ms, per_dim):
    """Log-densities of the observed entries of ``y_{T+k}`` under the ``k``-th marginal of
    a Gaussian mixture ``d`` with batch shape ``(h,)`` (``Normal`` or ``MultivariateNormal``
    components: the marginal of an observed block is the mixture of the components'
    marginals), NaN where nothing is observed; per dimension too when ``per_dim``. Other
    distributions score fully observed targets only (``d.log_prob``)."""
    comp = getattr(d, "component_distribution", None)
    if not isinstance(comp, (dist.Normal, dist.MultivariateNormal)):
        # another family: the density of fully observed targets only (NaN otherwise)
        full = jnp.reshape(ms, ms.shape[:1] + (-1,)).all(axis=-1)
        lps = jnp.where(full, d.log_prob(ys), jnp.nan)
        lps_d = jnp.full(ms.shape, jnp.nan, lps.dtype) if per_dim else None
        return lps, lps_d
    logw = jnp.log(d.mixing_distribution.probs)  # (h, C); -inf in padding slots
    if isinstance(comp, dist.Normal):
        loc, cov = comp.loc[..., None], (comp.scale**2)[..., None, None]
    else:
        loc, cov = comp.loc, comp.covariance_matrix
    ys = jnp.reshape(ys, loc.shape[:1] + loc.shape[-1:])
    ms = jnp.broadcast_to(jnp.reshape(ms, ms.shape[:1] + (-1,)), ys.shape)

    def score(y_k, m_k, lw, mu, c):
        lp = jax.vmap(lambda a, b: masked_mvn_log_prob(y_k, a, b, m_k))(mu, c)
        lp = jax.scipy.special.logsumexp(jnp.where(lw > -jnp.inf, lw + lp, -jnp.inf))
        return jnp.where(jnp.any(m_k), lp, jnp.nan)

    lps = jax.vmap(score)(ys, ms, logw, loc, cov)
    lps_d = None
    if per_dim:
        dims = jnp.eye(ys.shape[-1], dtype=bool)
        lps_d = jax.vmap(lambda e: jax.vmap(score)(ys, ms & e, logw, loc, cov),
                         out_axes=1)(dims)
    return lps, lps_d
