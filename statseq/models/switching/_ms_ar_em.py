"""EM (an ECM algorithm) for `MarkovSwitchingAR`.

E-step: the forward-backward smoother on the expanded chain gives the weights
``w_tj = p(x_t = j | y)`` of every expanded state ``j`` and the expected regime transition
counts. The expected complete-data log-likelihood of the emissions,

    Q = sum_{t, j} w_tj [ -log(v_j) / 2 - (y_t - m0_j - phi_j . (x_t - mlag_j))^2 / (2 v_j) ],

(``x_t`` the lags; ``m0_j``, ``mlag_j`` the current and lagged means of expanded state
``j`` in Hamilton's form, ``m0_j = c_{s_t}``, ``mlag_j = 0`` in the intercept form) is a
weighted least-squares problem in each block given the others, so the M-step updates
(i) the means / intercepts given ``phi`` and the variances, (ii) ``phi`` given the means
and variances, (iii) the variances given both: each a closed-form conditional maximum, so
the likelihood never decreases (Meng & Rubin's ECM). Everything needs only the weighted
moments of ``(1, y_t, x_t)`` per expanded state.

Fixed entries (per-entry ``trainable`` masks) keep each block exact: a quadratic block
``-x' A x / 2 + b' x`` is maximized over its free entries by ``A_ff x_f = b_f - A_fx x_x``,
switching variances entry by entry, transition rows give their free entries the mass the
fixed ones leave. `expected_log_joint` is ``Q`` itself (from the same moments), which
`statseq.fit_em` climbs by accepted gradient steps for tied entries.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.recurrence import vmap_or_one
from statseq.inference import hmm as hmm_seq

_LOG_2PI = math.log(2.0 * math.pi)


def _lags(y, p):
    padded = jnp.concatenate([jnp.zeros((p,), y.dtype), y])
    return jnp.stack([padded[p - i: p - i + y.shape[0]] for i in range(1, p + 1)], -1)


def e_step(model, params, y, mask, inputs):
    """Weighted moments per expanded state and regime transition counts, summed over the
    flat batch ``(N, T)``; returns ``(stats, log_prob)``."""
    del inputs
    pi_m, a_m, *_ = model.expanded_chain(params)
    to_k = model.regime_map(pi_m.dtype)
    p = model.order

    def one(y_s, m_s):
        y_s = y_s.astype(pi_m.dtype)
        post = hmm_seq.hmm_smoother(pi_m, a_m, model.log_likelihoods(params, y_s, m_s))
        scored = (jnp.arange(y_s.shape[0]) >= p) & jnp.asarray(m_s, bool)
        w = post.smoothed_probs * scored[:, None]  # (T, M)
        x = _lags(jnp.where(m_s, y_s, 0.0), p)  # (T, p)
        yy = jnp.where(m_s, y_s, 0.0)
        return {
            "w": jnp.sum(w, 0), "y": w.T @ yy, "yy": w.T @ yy**2, "x": w.T @ x,
            "xy": w.T @ (x * yy[:, None]), "xx": jnp.einsum("tj,tp,tq->jpq", w, x, x),
            "initial": post.smoothed_probs[0] @ to_k,
            "transitions": to_k.T @ post.expected_transitions @ to_k,
        }, post.marginal_log_lik

    stats, lps = vmap_or_one(one)(y, mask)
    return jax.tree.map(lambda a: jnp.sum(a, axis=0), stats), jnp.sum(lps)


def _level_design(model, params):
    """``(M, L)`` rows ``d_j`` with ``a_j = d_j . means`` (``L = K`` or 1), given ``phi``."""
    k = model.num_regimes
    cols = model.expanded_regimes()
    m = cols.shape[0]
    dtype = params.transitions.dtype
    onehot = (jnp.asarray(np.eye(k), dtype) if model.switching_mean
              else jnp.ones((k, 1), dtype))
    phi = _phi_per_state(model, params, m)
    if model.form == "intercept":
        return onehot[cols[:, 0]]
    if model.expanded:
        return onehot[cols[:, 0]] - jnp.einsum("ji,jil->jl", phi, onehot[cols[:, 1:]])
    return onehot[cols[:, 0]] * (1.0 - jnp.sum(phi, axis=-1))[:, None]


def _phi_per_state(model, params, m):
    now = model.expanded_regimes()[:, 0]
    if model.switching_ar:
        return params.ar_coeffs[now]
    return jnp.broadcast_to(params.ar_coeffs, (m, model.order))


def _centered(model, params, st):
    """Per expanded state: ``m0_j``, ``mlag_j`` and the weighted moments of
    ``z = y - m0_j`` and ``u = x - mlag_j``."""
    k, p = model.num_regimes, model.order
    cols = model.expanded_regimes()
    m = cols.shape[0]
    mu = jnp.broadcast_to(params.means, (k,))
    if model.form == "intercept":
        m0, mlag = mu[cols[:, 0]], jnp.zeros((m, p), mu.dtype)
    elif model.expanded:
        m0, mlag = mu[cols[:, 0]], mu[cols[:, 1:]]
    else:  # one mean (not switching, or K = 1)
        m0, mlag = mu[cols[:, 0]], jnp.broadcast_to(mu[cols[:, :1]], (m, p))
    w = st["w"]
    zz = st["yy"] - 2 * m0 * st["y"] + w * m0**2
    uz = (st["xy"] - st["x"] * m0[:, None] - mlag * st["y"][:, None]
          + (w * m0)[:, None] * mlag)
    uu = (st["xx"] - st["x"][:, :, None] * mlag[:, None, :]
          - mlag[:, :, None] * st["x"][:, None, :]
          + w[:, None, None] * mlag[:, :, None] * mlag[:, None, :])
    return zz, uz, uu


def _solve(a, b):
    return jnp.linalg.pinv(0.5 * (a + jnp.swapaxes(a, -1, -2)), hermitian=True) @ b


def _masked_solve(a, b, free, old):
    """The maximizer of ``-x' A x / 2 + b' x`` over the entries ``free`` of ``x``, the others
    held at ``old`` (``A_ff x_f = b_f - A_fx old_x``; all free gives ``_solve(a, b)``)."""
    free = jnp.broadcast_to(jnp.asarray(free, bool), b.shape)
    f = free.astype(a.dtype)
    rhs = jnp.where(free, b - a @ jnp.where(free, 0.0, old), old)
    mat = a * f[:, None] * f[None, :] + jnp.diag(1.0 - f)
    return jnp.where(free, _solve(mat, rhs), old)


def _residual_ss(model, params, st):
    """``sum_t w_tj (y_t - m0_j - phi_j . (x_t - mlag_j))^2`` per expanded state."""
    zz, uz, uu = _centered(model, params, st)
    phi = _phi_per_state(model, params, zz.shape[0])
    rss = zz - 2 * jnp.sum(phi * uz, -1) + jnp.einsum("jp,jpq,jq->j", phi, uu, phi)
    return jnp.maximum(rss, 0.0)


def expected_log_joint(model, params, stats):
    """``Q(params) = E[log p(s_{0:T-1}, y_{p:T-1} | y_{0:p-1}, params)]`` under the
    posterior of `e_step`: exact from its statistics (the emission term is quadratic in
    ``y_t`` and the lags, the chain term linear in the regime counts). The pre-sample
    regimes of the expanded ``x_0`` reach no scored step and are left out."""
    from statseq.models.hmm.base import _xlogp

    k = model.num_regimes
    now = model.expanded_regimes()[:, 0]
    out = (_xlogp(stats["initial"], model.initial_probs(params))
           + _xlogp(stats["transitions"], params.transitions))
    var_m = jnp.broadcast_to(params.variances, (k,))[now]
    rss = _residual_ss(model, params, stats)
    return out - 0.5 * jnp.sum(stats["w"] * (_LOG_2PI + jnp.log(var_m)) + rss / var_m)


def _transition_step(model, params, stats, prior_pi, prior_a, tr):
    """Transitions (and the free initial law) with fixed entries: the constrained
    Dirichlet MAP of each row; with ``initial="stationary"`` accepted gradient steps on
    the rows' free entries from the better of it and the old matrix (the ergodic law of
    ``P`` enters ``Q``)."""
    from statseq.fit.em import constrained_dirichlet_map, generalized_m_step
    from statseq.models.hmm.base import _log_dirichlet, _xlogp, stationary_distribution

    counts, old = stats["transitions"], params.transitions
    free = jnp.broadcast_to(jnp.asarray(tr.transitions, bool), old.shape)
    trans = constrained_dirichlet_map(counts, prior_a, old, free)
    if model.initial == "free":
        initial = constrained_dirichlet_map(stats["initial"], prior_pi, params.initial_probs,
                                            tr.initial_probs)
        return initial, trans
    gamma0 = stats["initial"]
    rest = 1.0 - jnp.sum(jnp.where(free, 0.0, old), axis=-1, keepdims=True)

    def rows(logits):  # the free entries share the mass the fixed ones leave
        logits = logits - jax.lax.stop_gradient(jnp.max(
            jnp.where(free, logits, -jnp.inf), axis=-1, keepdims=True, initial=-jnp.inf))
        e = jnp.where(free, jnp.exp(jnp.where(free, logits, 0.0)), 0.0)
        total = jnp.sum(e, axis=-1, keepdims=True)
        return jnp.where(free, rest * (e / jnp.where(total > 0, total, 1.0)), old)

    def q(logits):
        a = rows(logits)
        return (_xlogp(counts, a) + _xlogp(gamma0, stationary_distribution(a))
                + _log_dirichlet(prior_a, a))

    def logits_of(a):
        return jnp.where(free, jnp.log(jnp.where(free, jnp.clip(a, 1e-300, None), 1.0)), 0.0)

    start = jnp.where(q(logits_of(trans)) >= q(logits_of(old)), logits_of(trans),
                      logits_of(old))
    return params.initial_probs, rows(generalized_m_step(q, start))


def m_step(model, params, stats, priors, inputs, trainable=None):
    """Transitions, then the three ECM emission blocks, each the exact maximizer of ``Q``
    over its free entries (``trainable``: a pytree like ``params`` of booleans or boolean
    arrays) given everything else; fixed entries keep their value bit for bit."""
    del inputs
    k = model.num_regimes
    now = model.expanded_regimes()[:, 0]
    m = now.shape[0]
    tr = trainable if trainable is not None else jax.tree.map(
        lambda _: True, params, is_leaf=lambda x: x is None)
    prior_pi = None if priors is None else priors.initial_probs
    prior_a = None if priors is None else priors.transitions
    initial, trans = _transition_step(model, params, stats, prior_pi, prior_a, tr)
    params = params._replace(initial_probs=initial, transitions=trans)

    st = stats
    var_m = jnp.broadcast_to(params.variances, (k,))[now]
    # (i) means / intercepts given phi and the variances
    d = _level_design(model, params)  # (M, L)
    phi = _phi_per_state(model, params, m)
    r = st["y"] - jnp.sum(phi * st["x"], -1)  # sum_t w (y - phi . x)
    a_mat = jnp.einsum("j,jl,jn->ln", st["w"] / var_m, d, d)
    b_vec = jnp.einsum("j,jl->l", r / var_m, d)
    old = jnp.reshape(params.means, (-1,))
    means = _masked_solve(a_mat, b_vec, jnp.reshape(jnp.asarray(tr.means, bool), (-1,)), old)
    params = params._replace(means=jnp.reshape(means, jnp.shape(params.means)))
    # (ii) phi given the means and variances
    _, uz, uu = _centered(model, params, st)
    free_phi = jnp.broadcast_to(jnp.asarray(tr.ar_coeffs, bool), params.ar_coeffs.shape)
    if model.switching_ar:
        sel = jnp.asarray(np.eye(k)[now].T)  # (K, M); the variance is constant per regime
        phi_new = jax.vmap(_masked_solve)(jnp.einsum("kj,jpq->kpq", sel, uu),
                                          jnp.einsum("kj,jp->kp", sel, uz),
                                          free_phi, params.ar_coeffs)
    else:
        phi_new = _masked_solve(jnp.einsum("j,jpq->pq", 1.0 / var_m, uu),
                                jnp.einsum("j,jp->p", 1.0 / var_m, uz),
                                free_phi, params.ar_coeffs)
    params = params._replace(ar_coeffs=phi_new)
    # (iii) variances given both
    rss = _residual_ss(model, params, st)
    if model.switching_variance:
        sel = jnp.asarray(np.eye(k)[now].T)
        total_w, total_rss = sel @ st["w"], sel @ rss
        empty = total_w <= 1e-12 * jnp.maximum(1.0, jnp.max(total_w))
        var = jnp.where(empty, params.variances,
                        total_rss / jnp.where(empty, 1.0, total_w))
    else:
        var = jnp.sum(rss) / jnp.maximum(jnp.sum(st["w"]), 1e-300)
    var = jnp.maximum(var, jnp.finfo(var.dtype).tiny)
    return params._replace(variances=jnp.where(jnp.asarray(tr.variances, bool), var,
                                               params.variances))
