"""Variational EM for a `SwitchingLDS` with a structured mean-field posterior q(z) q(x).

Ghahramani and Hinton (2000), "Variational learning for switching state-space models".
The evidence lower bound

    ELBO(q, theta) = E_q[log p(y, x, z | theta)] + H[q(z)] + H[q(x)] <= log p(y | theta)

is raised by three exact coordinate steps per iteration:

1. **q(x)** ``∝ exp E_{q(z)}[log p(x, y | z)]``: with ``w_tk = q(z_t = k)`` the expected
   log-potentials are quadratic in ``x``, a Gaussian chain. The dynamics average is
   rewritten with precision-weighted parameters

       Lambda_t = sum_k w_tk Q_k^{-1},   A_t = Lambda_t^{-1} sum_k w_tk Q_k^{-1} A_k,
       c_t = Lambda_t^{-1} sum_k w_tk Q_k^{-1} (B_k u_t + b_k),

   so that ``sum_k w_tk log N(x_t; A_k x_{t-1} + c_k, Q_k) = log N(x_t; A_t x_{t-1} + c_t,
   Lambda_t^{-1}) + (a quadratic in x_{t-1} alone) + const`` (the quadratic is the weighted
   spread of the regimes' predictions, positive semi-definite). That quadratic and the
   averaged emission terms ``sum_k w_tk log N(y_t; C_k x_t + ..., R_k)`` (observed entries)
   are one information pair ``(J_t, h_t)`` on ``x_t``, written as an ``n``-dimensional
   pseudo-observation ``y~_t = S^{-1/2} U^T h_t`` of ``x_t`` with weights ``S^{1/2} U^T``
   and unit noise (``J_t = U S U^T``; null directions masked). The result is a
   time-varying linear Gaussian model whose Kalman smoother
   (`statseq.inference.kalman.kalman_smoother`) gives q(x) exactly.
2. **q(z)** ``∝ exp E_{q(x)}[log p(x, y, z)]``: an HMM with the model's ``pi`` and ``P`` and
   local log-evidence ``l_t(k) = E_{q(x)}[log N(x_t; A_k x_{t-1} + c_k, Q_k) +
   log N(y_t; C_k x_t + ..., R_k)]`` (``log N(x_0; m_k, V_k)`` at ``t = 0``), smoothed by
   `statseq.inference.hmm.hmm_smoother`. Then ``E_q[log p(z)] + H[q(z)] + sum w l =
   log Z_z`` (the HMM's normalizer), so the bound is ``sum_sequences log Z_z + H[q(x)]``.
3. **M-step**: closed-form weighted regressions, per regime (pooled when shared), of
   ``x_t`` on ``(x_{t-1}, u_t, 1)`` with weights ``w_tk`` and of ``y_t`` on ``(x_t, u_t, 1)``
   for ``[A B b], Q`` and ``[C D d], R``; ``pi``, ``P`` from the expected counts;
   ``m_k, V_k`` from the weighted first-state moments. Missing entries of ``y_t`` are
   latent in the M-step (their conditional moments given the observed entries, ``x_t`` and
   ``z_t = k`` enter the emission statistics, as in `statseq.LinearGaussianSSM`'s EM), which
   keeps the step monotone.

With input-driven transitions (``W``: ``p(z_t = j | z_{t-1} = i, u_t) = softmax_j(log P[i, j]
+ W_j u_t)``) q(z) is the HMM with these ``(T-1, K, K)`` time-varying matrices (still exact)
and ``(P, W)`` have no closed form: `transition_m_step` takes guarded Newton steps on
``sum_t sum_ij xi_t(i, j) log p(z_t = j | z_{t-1} = i, u_t)``, kept only where it does not
fall (a generalized EM step). Recurrent transitions are refused (`SwitchingLDS.fit_vem`).

Each step raises the bound (or, for ``(P, W)``, does not lower it), so the recorded ELBO
never decreases. With one regime q(z) is
trivial, q(x) is the exact posterior and the iteration is the LGSSM's EM.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.recurrence import vmap_or_one
from statseq.fit.em import _rounding_tolerance, _stop_rule
from statseq.inference import hmm, kalman
from statseq.inference import switching_kalman as kim
from statseq.inference.gaussian import symmetrize
from statseq.models.ssm.linear import _second_moments

_LOG_2PI = math.log(2.0 * math.pi)
_NEWTON_STEPS = 8

_RUNNING, _CONVERGED, _DECREASED, _NONFINITE = 0, 1, 2, 3
STATUS = {_RUNNING: "max_iters", _CONVERGED: "converged", _DECREASED: "decreased",
          _NONFINITE: "nonfinite"}


class SLDSVEMResult(NamedTuple):
    """Output of `SwitchingLDS.fit_vem`.

    Attributes:
        params: fitted `SLDSParams` (see `SwitchingLDS.fit_vem` for which iterate).
        elbo: ``(num_iters,)`` evidence lower bound at the parameters entering each
            iteration (summed over sequences); NaN after the last iteration run.
        num_iterations: iterations run.
        converged: ``True`` only when the ELBO's change fell below the tolerance.
        stopped: why the loop stopped: ``"converged"``, ``"max_iters"`` (ran out of
            iterations), ``"decreased"`` (the ELBO fell beyond rounding, which exact
            arithmetic cannot do: a numerical breakdown) or ``"nonfinite"``.
        regime_probs: ``batch_shape + (T, K)`` ``q(z_t = k)`` of the last E-step.
        state_means: ``batch_shape + (T, n)`` means of q(x) of the last E-step.
        state_covs: ``batch_shape + (T, n, n)`` covariances of q(x).
        wall_time: seconds, compilation included.

    Examples:
        >>> from statseq.models.switching._slds_vem import SLDSVEMResult
        >>> SLDSVEMResult._fields[:5]
        ('params', 'elbo', 'num_iterations', 'converged', 'stopped')
    """

    params: Any
    elbo: Any
    num_iterations: int
    converged: bool
    stopped: str
    regime_probs: Any
    state_means: Any
    state_covs: Any
    wall_time: float


def _chol_logdet(a):
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(jnp.linalg.cholesky(a), axis1=-2, axis2=-1)),
                         axis=-1)


def _masked_inv(r, mf):
    """``(R_oo^{-1}`` padded with zeros at missing rows/columns``, log|R_oo|)``."""
    r_t = r * (mf[:, None] * mf[None, :]) + jnp.diag(1.0 - mf)
    inv = jnp.linalg.inv(r_t) * (mf[:, None] * mf[None, :])
    return symmetrize(inv), _chol_logdet(r_t)


# ---- q(x): the equivalent time-varying linear Gaussian model --------------------------------
def pseudo_model(reg: kalman.GaussianSSMArrays, gamma, y, mask, u):
    """The linear Gaussian model whose posterior is q(x) (module docstring, step 1).

    Args:
        reg: per-regime arrays (``K`` leading).
        gamma: ``(T, K)`` ``q(z_t = k)``.
        y: ``(T, D)`` observations.
        mask: ``(T, D)`` observed entries.
        u: ``(T, m)``.

    Returns:
        ``(arrays, y~ (T, n), mask~ (T, n))``.
    """
    num_t = y.shape[0]
    n = reg.initial_mean.shape[-1]
    dtype = y.dtype
    mf = mask.astype(dtype)
    q_inv = jnp.linalg.inv(reg.dynamics_cov)  # (K, n, n)
    v_inv = jnp.linalg.inv(reg.initial_cov)
    # dynamics of step t -> t+1 (entry t), weights of z_{t+1}
    w = gamma[1:]
    c = (jnp.einsum("knm,tm->tkn", reg.dynamics_input_weights, u[1:])
         + reg.dynamics_bias[None])  # (T-1, K, n)
    lam = symmetrize(jnp.einsum("tk,kij->tij", w, q_inv))
    qa = jnp.einsum("tk,kij,kjl->til", w, q_inv, reg.dynamics_weights)
    qc = jnp.einsum("tk,kij,tkj->ti", w, q_inv, c)
    lam_chol = jnp.linalg.cholesky(lam)
    solve = jax.vmap(lambda ch, b: jax.scipy.linalg.cho_solve((ch, True), b))
    a_bar = solve(lam_chol, qa)
    c_bar = solve(lam_chol, qc)
    q_bar = symmetrize(solve(lam_chol, jnp.broadcast_to(jnp.eye(n, dtype=dtype), lam.shape)))
    aqa = jnp.einsum("tk,kji,kjl,klm->tim", w, reg.dynamics_weights, q_inv,
                     reg.dynamics_weights)
    aqc = jnp.einsum("tk,kji,kjl,tkl->ti", w, reg.dynamics_weights, q_inv, c)
    j_res = symmetrize(aqa - jnp.einsum("tji,tjl->til", qa, a_bar))
    h_res = -(aqc - jnp.einsum("tji,tj->ti", qa, c_bar))
    pad = jnp.zeros((1, n), dtype)
    j_res = jnp.concatenate([j_res, jnp.zeros((1, n, n), dtype)])
    h_res = jnp.concatenate([h_res, pad])
    # averaged emissions on the observed entries
    r_inv, _ = jax.vmap(lambda m_t: jax.vmap(lambda r: _masked_inv(r, m_t))(
        reg.emission_cov))(mf)  # (T, K, D, D)
    resid = (jnp.where(mask, y, 0.0)[:, None]
             - jnp.einsum("kdm,tm->tkd", reg.emission_input_weights, u)
             - reg.emission_bias[None]) * mf[:, None]
    j_y = jnp.einsum("tk,kdi,tkde,kej->tij", gamma, reg.emission_weights, r_inv,
                     reg.emission_weights)
    h_y = jnp.einsum("tk,kdi,tkde,tke->ti", gamma, reg.emission_weights, r_inv, resid)
    j_all = symmetrize(j_y + j_res)
    h_all = h_y + h_res
    s, vecs = jnp.linalg.eigh(j_all)
    keep = s > 1e-12 * jnp.maximum(jnp.max(s, axis=-1, keepdims=True), 1e-300)
    root = jnp.sqrt(jnp.where(keep, s, 1.0))
    h_mat = jnp.where(keep[:, :, None], root[:, :, None] * jnp.swapaxes(vecs, 1, 2), 0.0)
    y_t = jnp.where(keep, jnp.einsum("tij,ti->tj", vecs, h_all) / root, 0.0)
    # initial law: precision-weighted average of the regimes' initial laws
    g0 = gamma[0]
    lam0 = symmetrize(jnp.einsum("k,kij->ij", g0, v_inv))
    m0 = jnp.linalg.solve(lam0, jnp.einsum("k,kij,kj->i", g0, v_inv, reg.initial_mean))
    v0 = symmetrize(jnp.linalg.inv(lam0))
    arrays = kalman.GaussianSSMArrays(
        m0, v0, a_bar, jnp.zeros((num_t - 1, n, 0), dtype), c_bar, q_bar, h_mat,
        jnp.zeros((n, 0), dtype), jnp.zeros((n,), dtype), jnp.eye(n, dtype=dtype),
        jnp.zeros((n, 0), dtype))
    return arrays, y_t, keep


def q_x(reg, gamma, y, mask, u):
    """Smoothed moments of q(x): ``(means (T, n), covs (T, n, n), cross (T-1, n, n))``."""
    arrays, y_t, keep = pseudo_model(reg, gamma, y, mask, u)
    post = kalman.kalman_smoother(arrays, y_t, keep, jnp.zeros((y.shape[0], 0), y.dtype))
    return post.smoothed_means, symmetrize(post.smoothed_covs), post.smoothed_cross_covs


def entropy_x(covs, cross):
    """``H[q(x)]`` of a Gaussian Markov chain from its marginal and lag-one covariances."""
    num_t, n = covs.shape[0], covs.shape[-1]
    pair = jnp.concatenate([jnp.concatenate([covs[:-1], jnp.swapaxes(cross, 1, 2)], 2),
                            jnp.concatenate([cross, covs[1:]], 2)], 1)
    logdet = _chol_logdet(covs[0]) + jnp.sum(_chol_logdet(symmetrize(pair))) - jnp.sum(
        _chol_logdet(covs[:-1]))
    return 0.5 * (num_t * n * (1.0 + _LOG_2PI) + logdet)


# ---- q(z): the local evidence ---------------------------------------------------------------
def evidence(reg, mu, cov, cross, y, mask, u):
    """``(T, K)`` ``l_t(k)`` (module docstring, step 2)."""
    n = mu.shape[-1]
    dtype = mu.dtype
    mf = mask.astype(dtype)

    def one(k):
        a, q = reg.dynamics_weights[k], reg.dynamics_cov[k]
        c = u[1:] @ reg.dynamics_input_weights[k].T + reg.dynamics_bias[k]
        delta = mu[1:] - mu[:-1] @ a.T - c
        second = (cov[1:] - jnp.einsum("ij,tkj->tik", a, cross)
                  - jnp.einsum("tij,kj->tik", cross, a)
                  + jnp.einsum("ij,tjl,kl->tik", a, cov[:-1], a)
                  + delta[:, :, None] * delta[:, None, :])
        q_inv = jnp.linalg.inv(q)
        l_dyn = -0.5 * (n * _LOG_2PI + _chol_logdet(q)
                        + jnp.einsum("ij,tji->t", q_inv, second))
        v, m0 = reg.initial_cov[k], reg.initial_mean[k]
        d0 = mu[0] - m0
        l0 = -0.5 * (n * _LOG_2PI + _chol_logdet(v)
                     + jnp.trace(jnp.linalg.solve(v, cov[0] + jnp.outer(d0, d0))))
        cmat = reg.emission_weights[k]
        e = u @ reg.emission_input_weights[k].T + reg.emission_bias[k]
        r = (jnp.where(mask, y, 0.0) - mu @ cmat.T - e) * mf
        r_inv, logdet = jax.vmap(lambda m_t: _masked_inv(reg.emission_cov[k], m_t))(mf)
        s = jnp.einsum("di,tij,ej->tde", cmat, cov, cmat)
        quad = (jnp.einsum("tde,td,te->t", r_inv, r, r) + jnp.einsum("tde,ted->t", r_inv, s))
        l_y = -0.5 * (jnp.sum(mf, -1) * _LOG_2PI + logdet + quad)
        return jnp.concatenate([l0[None], l_dyn]) + l_y

    return jax.vmap(one, out_axes=1)(jnp.arange(reg.initial_mean.shape[0]))


# ---- M-step statistics --------------------------------------------------------------------------
def _stats(reg, gamma, mu, cov, cross, y, mask, u):
    """Weighted second moments of one sequence, per regime (``K`` leading)."""
    num_t = mu.shape[0]
    dtype = mu.dtype
    mf = mask.astype(dtype)
    exx = cov + mu[:, :, None] * mu[:, None, :]
    ones = jnp.ones((num_t, 1), dtype)

    r_dyn = jnp.concatenate([u[1:], ones[1:]], axis=1)
    zz_t = _second_moments(exx[:-1], mu[:-1], r_dyn)
    xz_t = jnp.concatenate([cross + mu[1:, :, None] * mu[:-1, None, :],
                            mu[1:, :, None] * r_dyn[:, None, :]], axis=2)
    w = gamma[1:]
    dyn = (jnp.einsum("tk,tij->kij", w, zz_t), jnp.einsum("tk,tij->kij", w, xz_t),
           jnp.einsum("tk,tij->kij", w, exx[1:]), jnp.sum(w, 0))
    # emissions: missing entries of y_t latent, given the observed ones, x_t and z_t = k
    r_emit = jnp.concatenate([u, ones], axis=1)
    ww_t = _second_moments(exx, mu, r_emit)
    y0 = jnp.where(mask, y, 0.0)

    def per_regime(h, du, d, rcov):
        def impute(y_t, m_t, u_t):
            miss = 1.0 - m_t
            r_oo = rcov * (m_t[:, None] * m_t[None, :]) + jnp.diag(miss)
            r_mo = rcov * (miss[:, None] * m_t[None, :])
            k_r = jnp.linalg.solve(r_oo, r_mo.T).T
            c_t = du @ u_t + d
            g_mat = miss[:, None] * (h - k_r @ (h * m_t[:, None]))
            g_vec = m_t * y_t + miss * (c_t + k_r @ (m_t * (y_t - c_t)))
            v_res = (miss[:, None] * miss[None, :]) * (rcov - k_r @ rcov)
            return g_mat, g_vec, symmetrize(v_res)

        g_mat, g_vec, v_res = jax.vmap(impute)(y0, mf, u)
        ey = jnp.einsum("tdn,tn->td", g_mat, mu) + g_vec
        eyx = jnp.einsum("tdn,tnk->tdk", g_mat, exx) + g_vec[:, :, None] * mu[:, None, :]
        gm = jnp.einsum("tdn,tn->td", g_mat, mu)
        eyy = (jnp.einsum("tdn,tnk,tek->tde", g_mat, exx, g_mat)
               + gm[:, :, None] * g_vec[:, None, :] + g_vec[:, :, None] * gm[:, None, :]
               + g_vec[:, :, None] * g_vec[:, None, :] + v_res)
        yw_t = jnp.concatenate([eyx, ey[:, :, None] * r_emit[:, None, :]], axis=2)
        return yw_t, eyy

    yw_t, yy_t = jax.vmap(per_regime)(reg.emission_weights, reg.emission_input_weights,
                                      reg.emission_bias, reg.emission_cov)  # (K, T, ...)
    emi = (jnp.einsum("tk,tij->kij", gamma, ww_t), jnp.einsum("tk,ktij->kij", gamma, yw_t),
           jnp.einsum("tk,ktij->kij", gamma, yy_t), jnp.sum(gamma, 0))
    g0 = gamma[0]
    init = (g0, g0[:, None] * mu[0], g0[:, None, None] * exx[0])
    return dyn, emi, init


def _regression(zz, xz, xx, count, old_w, old_cov, switching):
    """Weighted least squares ``W = S_xz S_zz^{-1}``, ``Sigma = E sum (x - Wz)(x - Wz)^T /
    count``, per regime (``K`` leading) or pooled; a regime without weight keeps its
    values."""
    if not switching:
        zz, xz, xx, count = (jnp.sum(a, 0)[None] for a in (zz, xz, xx, count))
        old_w, old_cov = old_w[None], old_cov[None]
    w = jnp.swapaxes(jnp.linalg.solve(zz, jnp.swapaxes(xz, 1, 2)), 1, 2)
    s = (xx - jnp.einsum("kij,klj->kil", w, xz) - jnp.einsum("kij,klj->kil", xz, w)
         + jnp.einsum("kij,kjl,kml->kim", w, zz, w))
    cov = symmetrize(s / jnp.maximum(count, 1e-300)[:, None, None])
    scale = jnp.maximum(jnp.max(count), 1.0)
    empty = count <= 1e-10 * scale
    w = jnp.where(empty[:, None, None], old_w, w)
    cov = jnp.where(empty[:, None, None], old_cov, cov)
    return (w, cov) if switching else (w[0], cov[0])


def transition_objective(log_p, w, xi, u):
    """Expected transition log-likelihood ``sum_t sum_ij xi_t(i, j) log softmax_j(log P[i, j]
    + W_j u_t)`` for per-step counts ``xi (S, K, K)`` and inputs ``u (S, m)``."""
    logits = log_p[None] + (u @ w.T)[:, None, :]
    log_row = jax.nn.log_softmax(logits, axis=-1)
    return jnp.sum(jnp.where(xi > 0, xi * log_row, 0.0))


def transition_m_step(transitions, w, xi, u, num_newton=_NEWTON_STEPS):
    """Generalized M-step for input-driven transitions (module docstring, step 3).

    ``num_newton`` damped Newton steps on the concave objective `transition_objective` in
    ``(log P, W)`` from the better of the current values and (the closed-form ``P`` of the
    summed counts, the current ``W``); each step tries the step lengths ``1, 1/2, 1/4,
    1/8`` and keeps the best of them and the current value, so the objective never
    decreases. Rows of ``P`` are renormalized (``log P`` is defined up to a shift per row).

    Args:
        transitions: ``(K, K)`` current ``P``.
        w: ``(K, m)`` current ``W``.
        xi: ``(S, K, K)`` per-step expected transition counts (steps of all sequences).
        u: ``(S, m)`` the inputs of the steps into which they transition.
        num_newton: Newton steps.

    Returns:
        ``(P, W)``.
    """
    k, m = w.shape
    dtype = w.dtype
    floor = jnp.log(jnp.finfo(dtype).tiny)
    log_p0 = jax.nn.log_softmax(jnp.maximum(jnp.log(transitions), floor), axis=-1)

    def unpack(v):
        return v[:k * k].reshape(k, k), v[k * k:].reshape(k, m)

    def f(v):
        return transition_objective(*unpack(v), xi, u)

    grad = jax.grad(f)
    hess = jax.hessian(f)
    steps = jnp.asarray([1.0, 0.5, 0.25, 0.125], dtype)

    def newton(v, _):
        g, h = grad(v), -hess(v)
        damp = 1e-10 * jnp.maximum(jnp.max(jnp.abs(jnp.diagonal(h))), 1.0)
        d = jnp.linalg.solve(h + damp * jnp.eye(v.shape[0], dtype=dtype), g)
        cands = v[None] + steps[:, None] * d[None]
        vals = jax.vmap(f)(cands)
        vals = jnp.where(jnp.isfinite(vals), vals, -jnp.inf)
        best = jnp.argmax(vals)
        new = jnp.where(vals[best] >= f(v), cands[best], v)
        lp, ww = unpack(new)
        return jnp.concatenate([jax.nn.log_softmax(lp, axis=-1).ravel(), ww.ravel()]), None

    # start from the better of the current value and (closed-form P of the pooled counts,
    # current W): the latter is the exact maximizer when the inputs have no effect
    counts = jnp.sum(xi, 0)
    log_pc = jnp.log(jnp.maximum(counts, jnp.finfo(dtype).tiny)) - jnp.log(
        jnp.maximum(jnp.sum(counts, -1, keepdims=True), jnp.finfo(dtype).tiny))
    v_old = jnp.concatenate([log_p0.ravel(), w.ravel()])
    v_cf = jnp.concatenate([jax.nn.log_softmax(log_pc, axis=-1).ravel(), w.ravel()])
    v0 = jnp.where(f(v_cf) >= f(v_old), v_cf, v_old)
    v, _ = jax.lax.scan(newton, v0, None, length=num_newton)
    lp, w_new = unpack(v)
    # the renormalized start, kept when no step raised the objective above the given value
    better = f(v) >= transition_objective(jnp.log(transitions), w, xi, u)
    p_new = jnp.exp(jax.nn.log_softmax(lp, axis=-1))
    return (jnp.where(better, p_new, transitions), jnp.where(better, w_new, w))


def m_step(model, params, reg, stats, gamma0_sum, xi, num_seq, xi_steps=None, u_steps=None):
    """Closed-form maximizer of ``E_q[log p(y, x, z | theta)]`` (module docstring, step 3);
    with input-driven transitions (``xi_steps (S, K, K)``, ``u_steps (S, m)`` given), ``P``
    and ``W`` by `transition_m_step`."""
    dyn, emi, init = stats
    n, m = model.state_dim, model.input_dim
    old_dyn = jnp.concatenate([reg.dynamics_weights, reg.dynamics_input_weights,
                               reg.dynamics_bias[..., None]], -1)
    old_emi = jnp.concatenate([reg.emission_weights, reg.emission_input_weights,
                               reg.emission_bias[..., None]], -1)
    sd, se = model.switching_dynamics, model.switching_emission
    w_d, q = _regression(*dyn, old_dyn if sd else old_dyn[0],
                         reg.dynamics_cov if sd else reg.dynamics_cov[0], sd)
    w_e, r = _regression(*emi, old_emi if se else old_emi[0],
                         reg.emission_cov if se else reg.emission_cov[0], se)
    g0, gx0, gxx0 = init
    cnt = jnp.maximum(g0, 1e-300)
    empty = g0 <= 1e-10 * num_seq
    m0 = gx0 / cnt[:, None]
    v0 = symmetrize(gxx0 / cnt[:, None, None] - m0[:, :, None] * m0[:, None, :])
    m0 = jnp.where(empty[:, None], reg.initial_mean, m0)
    v0 = jnp.where(empty[:, None, None], reg.initial_cov, v0)
    pi = gamma0_sum / jnp.sum(gamma0_sum)
    rows = jnp.sum(xi, -1, keepdims=True)
    no_rows = rows <= 1e-12 * jnp.maximum(1.0, jnp.max(rows))
    trans = jnp.where(no_rows, params.transitions, xi / jnp.where(no_rows, 1.0, rows))
    if xi_steps is not None:
        trans, w_u = transition_m_step(params.transitions, params.transition_input_weights,
                                       xi_steps, u_steps)
        params = params._replace(transition_input_weights=w_u)
    return params._replace(
        initial_probs=pi, transitions=trans, initial_means=m0, initial_covs=v0,
        dynamics_weights=w_d[..., :n], dynamics_input_weights=w_d[..., n:n + m],
        dynamics_bias=w_d[..., n + m], dynamics_cov=q,
        emission_weights=w_e[..., :n], emission_input_weights=w_e[..., n:n + m],
        emission_bias=w_e[..., n + m], emission_cov=r)


# ---- the loop ------------------------------------------------------------------------------
def e_step(model, params, gamma, y, mask, u, num_inner):
    """q(x) given ``gamma``, then q(z) given q(x) (``num_inner`` times), over a flat batch.

    Returns:
        ``(elbo, gamma, xi, mu, cov, cross)``; ``elbo`` is summed over sequences; ``xi`` is
        ``(N, K, K)``, or ``(N, T-1, K, K)`` per step with input-driven transitions.
    """
    arrays = model.to_arrays(params)
    reg = arrays.regimes

    inputs_drive = arrays.transition_input_weights is not None

    def one(g, y_s, m_s, u_s):
        if inputs_drive:  # (T-1, K, K) matrices of the steps into t = 1..T-1
            zeros = jnp.zeros_like(reg.initial_mean)
            trans = jax.vmap(lambda u_t: kim.transition_matrix_at(arrays, u_t, zeros))(u_s[1:])
        else:
            trans = arrays.transition_matrix

        def inner(g, _):
            mu, cov, cross = q_x(reg, g, y_s, m_s, u_s)
            ll = evidence(reg, mu, cov, cross, y_s, m_s, u_s)
            post = hmm.hmm_smoother(arrays.initial_probs, trans, ll,
                                    sum_transitions=not inputs_drive)
            out = (post.marginal_log_lik + entropy_x(cov, cross), post.expected_transitions,
                   mu, cov, cross)
            return post.smoothed_probs, out

        g, outs = jax.lax.scan(inner, g, None, length=num_inner)
        return (g,) + jax.tree.map(lambda a: a[-1], outs)

    g, elbo, xi, mu, cov, cross = vmap_or_one(one)(gamma, y, mask, u)
    return jnp.sum(elbo), g, xi, mu, cov, cross


@partial(jax.jit, static_argnames=("model", "num_iters", "num_inner"))
def run_vem(model, params, y, mask, u, tol, *, num_iters, num_inner):
    """The compiled loop (a ``lax.while_loop``); see `SwitchingLDS.fit_vem`."""
    dtype = y.dtype
    noise = _rounding_tolerance(dtype)
    arrays = model.to_arrays(params)
    gamma = vmap_or_one(lambda y_s, m_s, u_s: kim.kim_smoother(
        arrays, y_s, m_s, u_s).smoothed_probs)(y, mask, u)
    num_seq = y.shape[0]

    def body(state):
        i, params, prev, trace, status, gamma, _mu, _cov = state
        elbo, g, xi, mu, cov, cross = e_step(model, params, gamma, y, mask, u, num_inner)
        reg = model.to_arrays(params).regimes
        stats = vmap_or_one(lambda *a: _stats(reg, *a))(g, mu, cov, cross, y, mask, u)
        stats = jax.tree.map(lambda a: jnp.sum(a, 0), stats)
        if model.transition_inputs:
            xi_steps = jnp.reshape(xi, (-1,) + xi.shape[-2:])
            u_steps = jnp.reshape(u[:, 1:], (-1, u.shape[-1]))
            new = m_step(model, params, reg, stats, jnp.sum(g[:, 0], 0),
                         jnp.sum(xi, (0, 1)), num_seq, xi_steps, u_steps)
        else:
            new = m_step(model, params, reg, stats, jnp.sum(g[:, 0], 0), jnp.sum(xi, 0),
                         num_seq)
        converged, broken, decreased = _stop_rule(trace, i, elbo, tol, noise)
        new_status = jnp.where(broken, _NONFINITE, jnp.where(
            decreased, _DECREASED, jnp.where(converged, _CONVERGED, _RUNNING)))
        failed = broken | decreased
        trace = trace.at[i].set(jnp.where(failed, jnp.nan, elbo))
        # converged: the params of the last entry; failed: the ones before them
        keep = jax.tree.map(lambda p, q: jnp.where(failed, q, p), params, prev)
        out = jax.tree.map(lambda a, b: jnp.where(converged | failed, b, a), new, keep)
        g = jnp.where(failed, gamma, g)
        return (i + 1, out, params, trace, new_status.astype(jnp.int32), g,
                jnp.where(failed, _mu, mu), jnp.where(failed, _cov, cov))

    def cond(state):
        return (state[0] < num_iters) & (state[4] == _RUNNING)

    n = model.state_dim
    init = (jnp.zeros((), jnp.int32), params, params, jnp.full((num_iters,), jnp.nan, dtype),
            jnp.asarray(_RUNNING, jnp.int32), gamma,
            jnp.zeros(y.shape[:2] + (n,), dtype), jnp.zeros(y.shape[:2] + (n, n), dtype))
    return jax.lax.while_loop(cond, body, init)


def check_definite(params) -> None:
    """``ValueError`` unless every ``Q_k``, ``R_k`` and ``V_k`` is positive definite (q(x)
    inverts them)."""
    for name in ("initial_covs", "dynamics_cov", "emission_cov"):
        a = np.asarray(getattr(params, name), np.float64)
        a = a.reshape((-1,) + a.shape[-2:])
        evals = np.linalg.eigvalsh(0.5 * (a + np.swapaxes(a, -1, -2)))
        if not np.all(evals > 0):
            raise ValueError(f"fit_vem needs positive definite params.{name} (q(x) inverts "
                             f"it); its smallest eigenvalue is {evals.min():.3g}")


def fit_vem(model, params, data, *, num_iters, tol, num_inner):
    """Driver behind `SwitchingLDS.fit_vem` (``data``: a `prepare_data` result)."""
    start = time.perf_counter()
    dtype = model.to_arrays(params).regimes.initial_cov.dtype
    y = jnp.reshape(data.y, data.y.shape[:2] + (model.dim,)).astype(dtype)
    mask = jnp.reshape(data.mask, data.mask.shape[:2] + (-1,)) & jnp.ones(
        (1, 1, model.dim), bool)
    full = jax.tree.map(lambda a: jnp.asarray(a, dtype), params)
    tol_value = -np.inf if tol is None else float(tol)
    out = run_vem(model, full, y, mask, data.inputs.astype(dtype), jnp.asarray(tol_value, dtype),
                  num_iters=num_iters, num_inner=num_inner)
    i, fitted, _, trace, status, gamma, mu, cov = jax.block_until_ready(out)
    status = int(status)
    num_iterations = int(i) - (status in (_DECREASED, _NONFINITE))
    bs = data.batch_shape
    return SLDSVEMResult(
        params=fitted, elbo=np.asarray(trace), num_iterations=num_iterations,
        converged=status == _CONVERGED, stopped=STATUS[status],
        regime_probs=jnp.reshape(gamma, bs + gamma.shape[1:]),
        state_means=jnp.reshape(mu, bs + mu.shape[1:]),
        state_covs=jnp.reshape(cov, bs + cov.shape[1:]),
        wall_time=time.perf_counter() - start)
