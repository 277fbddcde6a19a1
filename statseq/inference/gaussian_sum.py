"""Exact Gaussian-sum filter for switching linear regressions on their own lags, with gaps.

The model (a linear autoregressive HMM, or a Markov-switching AR on its expanded chain):

    z_t | z_{t-1} ~ Categorical(A[z_{t-1}]),
    y_t | z_t = s, x_t ~ N(W_s x_t + b_s, Sigma_s),    x_t = [y_{t-1}; ...; y_{t-L}],

with ``y_t`` of dimension ``D`` and the lag window ``x_t`` of dimension ``n = L D``. When
entries of ``y`` are missing, the missing entries of the window are, given the regime path
since the gap began, jointly Gaussian; the filter state is then a finite Gaussian mixture
whose components are ``(regime, log weight, mean and covariance of the window)`` (observed
entries have their value as mean and zero variance). Each step branches every component
into the ``S`` regimes, scores the observed entries of ``y_t`` under

    y_t | component c, z_t = s ~ N(W_s m_c + b_s, W_s P_c W_s^T + Sigma_s),

conditions the joint Gaussian of ``(y_t, x_t)`` on them and shifts the window. Once the
window is fully observed again every component with the same current regime has the same
window (the data), so they merge exactly into one per regime. With a gap of ``g`` steps
the number of live components is at most ``S B^(g + L - 1)`` (``B`` the number of possible
successors of a regime; ``K^(g + L)`` for an AR-HMM with ``K`` states).

The capacity ``C`` is static (a jittable scan): each step keeps the ``C`` heaviest of the
``S C`` candidates (`jax.lax.top_k`); padded slots have log weight ``-inf``. That is exact
while the number of live candidates is at most ``C``; `required_components` computes the
bound eagerly from the mask.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.inference.gaussian import condition_on_leading, masked_mvn_log_prob


class GaussianSumCarry(NamedTuple):
    """State of the Gaussian-sum filter before step ``t``.

    Attributes:
        log_weights: ``(C,)`` ``log p(component | y_{<t})`` (``-inf`` for empty slots).
        regimes: ``(C,)`` int32, the regime ``z_{t-1}`` of each component (of ``z_0``'s
            law before the first step).
        means: ``(C, n)`` mean of the lag window ``x_t`` given the component.
        covs: ``(C, n, n)`` its covariance (zero rows and columns on observed entries).
        values: ``(n,)`` the observed window entries (zero where missing).
        observed: ``(n,)`` bools, which window entries are observed.
        started: whether a step was taken (then components move by ``A``).
        count: steps taken, capped at ``L`` (the engine scores from ``L`` on).
    """

    log_weights: jax.Array
    regimes: jax.Array
    means: jax.Array
    covs: jax.Array
    values: jax.Array
    observed: jax.Array
    started: jax.Array
    count: jax.Array


def safe_log(p):
    """``log p`` with ``-inf`` (and a zero gradient) where ``p == 0``."""
    pos = p > 0
    return jnp.where(pos, jnp.log(jnp.where(pos, p, 1.0)), -jnp.inf)


def log_sum_exp(x, axis=None):
    """``log sum exp x`` that is ``-inf`` (with finite gradients) when every entry is."""
    m = jnp.max(x, axis=axis, keepdims=True)
    live = jnp.isfinite(m)
    m = jax.lax.stop_gradient(jnp.where(live, m, 0.0))
    s = jnp.sum(jnp.exp(x - m), axis=axis, keepdims=True)
    out = jnp.where(live, jnp.log(jnp.where(live, s, 1.0)) + m, -jnp.inf)
    return jnp.squeeze(out, axis=axis) if axis is not None else jnp.reshape(out, ())


def initial_gaussian_sum(initial_probs, capacity: int, window_dim: int) -> GaussianSumCarry:
    """The state before any step: one component per regime with weight ``p(z_0)``, a known
    window of pre-sample zeros."""
    num_states = initial_probs.shape[0]
    if capacity < num_states:
        raise ValueError(f"capacity {capacity} < number of regimes {num_states}")
    dtype = initial_probs.dtype
    lw = jnp.full((capacity,), -jnp.inf, dtype).at[:num_states].set(safe_log(initial_probs))
    return GaussianSumCarry(
        lw, jnp.arange(capacity, dtype=jnp.int32) % num_states,
        jnp.zeros((capacity, window_dim), dtype),
        jnp.zeros((capacity, window_dim, window_dim), dtype),
        jnp.zeros((window_dim,), dtype), jnp.ones((window_dim,), bool),
        jnp.zeros((), bool), jnp.zeros((), jnp.int32))


def predictive_components(carry: GaussianSumCarry, transitions: jax.Array, weights: jax.Array,
                          biases: jax.Array, noise: jax.Array) -> tuple[jax.Array, ...]:
    """The one-step predictive of ``y_t`` as ``C S`` Gaussian candidates.

    Args:
        carry: the filter state.
        transitions: ``(S, S)`` transition matrix into step ``t`` (ignored before the
            first step: the components then keep their regime).
        weights: ``(S, D, n)`` regressions on the window.
        biases: ``(S, D)``.
        noise: ``(S, D, D)`` noise covariances.

    Returns:
        The tuple ``(log_weights (C, S), means (C, S, D), covs (C, S, D, D), cross (C, S,
        D, n))`` with ``cross = W_s P_c`` the covariance of ``y_t`` with the window;
        candidate ``(c, s)`` continues component ``c`` in regime ``s``.
    """
    num_states = transitions.shape[0]
    moved = safe_log(transitions)
    stay = jnp.where(jnp.eye(num_states, dtype=bool), 0.0, -jnp.inf).astype(moved.dtype)
    log_trans = jnp.where(carry.started, moved, stay)
    lw = carry.log_weights[:, None] + log_trans[carry.regimes]
    means = jnp.einsum("sdn,cn->csd", weights, carry.means) + biases[None]
    cross = jnp.einsum("sdn,cnm->csdm", weights, carry.covs)
    covs = jnp.einsum("csdm,sem->csde", cross, weights) + noise[None]
    covs = 0.5 * (covs + jnp.swapaxes(covs, -1, -2))
    return lw, means, covs, cross


def gaussian_sum_step(carry: GaussianSumCarry, transitions, weights, biases, noise, y_t,
                      mask_t, num_lags: int):
    """One exact step: ``(log p(observed y_t | y_{<t}), state after y_t)``.

    The state's regime weights are conditioned on ``y_t`` only from step ``num_lags`` on
    (the first ``num_lags`` steps are conditioned on, as in the models' likelihoods);
    see `predictive_components` for the other arguments. ``y_t`` is ``(D,)``, ``mask_t``
    ``(D,)`` bools.
    """
    capacity, window_dim = carry.means.shape
    num_states, dim = biases.shape
    lw, means, covs, cross = predictive_components(carry, transitions, weights, biases, noise)
    mask_t = jnp.asarray(mask_t, bool)
    ll = jax.vmap(jax.vmap(lambda mu, cov: masked_mvn_log_prob(y_t, mu, cov, mask_t)))(
        means, covs)
    log_prob = jnp.where(jnp.any(mask_t), log_sum_exp(lw + ll), 0.0)
    active = carry.count >= num_lags
    post = lw + jnp.where(active, ll, 0.0)
    post = post - log_sum_exp(post)

    def condition(mu, cov_y, cross_c, m, p):
        mean = jnp.concatenate([mu, m])
        cov = jnp.block([[cov_y, cross_c], [cross_c.T, p]])
        mean_post, cov_post = condition_on_leading(mean, cov, y_t, mask_t)
        return mean_post[:window_dim], cov_post[:window_dim, :window_dim]

    per_state = jax.vmap(condition, in_axes=(0, 0, 0, None, None))
    new_means, new_covs = jax.vmap(per_state)(means, covs, cross, carry.means, carry.covs)
    values = jnp.concatenate([jnp.where(mask_t, y_t, 0.0).astype(carry.values.dtype),
                              carry.values[:window_dim - dim]])
    observed = jnp.concatenate([mask_t, carry.observed[:window_dim - dim]])
    new_means = jnp.where(observed, values, new_means)
    new_covs = jnp.where(observed[:, None] | observed[None, :], 0.0, new_covs)
    flat_w = post.reshape(-1)
    flat_r = jnp.broadcast_to(jnp.arange(num_states, dtype=jnp.int32),
                              (capacity, num_states)).reshape(-1)
    # the window is known again: components with the same regime merge exactly
    merged_w = jnp.full((capacity,), -jnp.inf, post.dtype).at[:num_states].set(
        log_sum_exp(post, axis=0))
    # otherwise keep the heaviest C of the C S candidates (exact while at most C are live)
    top_w, idx = jax.lax.top_k(flat_w, capacity)
    keep_m = new_means.reshape(-1, window_dim)[idx]
    keep_p = new_covs.reshape(-1, window_dim, window_dim)[idx]
    merge = jnp.all(observed)
    new = GaussianSumCarry(
        jnp.where(merge, merged_w, top_w),
        jnp.where(merge, jnp.arange(capacity, dtype=jnp.int32) % num_states, flat_r[idx]),
        jnp.where(merge, jnp.broadcast_to(values, keep_m.shape), keep_m),
        jnp.where(merge, 0.0, keep_p),
        values, observed, jnp.ones((), bool),
        jnp.minimum(carry.count + 1, num_lags).astype(jnp.int32))
    return log_prob, new


def regime_probs(carry: GaussianSumCarry, num_states: int):
    """``(S,)`` ``p(z_{t-1} = s | y_{<t})`` summed over components."""
    w = jnp.exp(carry.log_weights)
    return jnp.zeros((num_states,), w.dtype).at[carry.regimes].add(w)


# ---- eager sizing (NumPy) -----------------------------------------------------------------
class GapSize(NamedTuple):
    """Result of `required_components`.

    Attributes:
        components: the largest number of live components (``num_states`` when the
            window never has a missing entry that matters).
        gap: length (in steps) of the gap that needs them; 0 when no step's lag window
            has a missing entry (then the finite-state filter is exact).
        sequence: index (flat batch) of that sequence, or -1.
        conditioned: ``(sequence, step)`` of a missing value among the first
            ``num_lags`` (conditioned) steps that a later observed step uses as a lag,
            or ``None``.
    """

    components: int
    gap: int
    sequence: int
    conditioned: tuple[int, int] | None


def required_components(mask: np.ndarray, num_lags: int, num_states: int, branching: int, *,
                        trailing: bool = False, limit: int | None = None) -> GapSize:
    """The capacity the Gaussian-sum filter needs to be exact on ``mask``.

    Args:
        mask: ``(N, T, D)`` bools (``True`` = observed).
        num_lags: ``L``.
        num_states: ``S``, the regimes of the chain.
        branching: ``B``, the most successors a regime can have (``S`` for a dense
            transition matrix).
        trailing: also count gaps at the end of a sequence (a forecast needs its final
            state exact); otherwise only steps up to the last one with an observed entry.
        limit: stop counting (and report) once the count exceeds it.

    Returns:
        A `GapSize`.
    """
    mask = np.asarray(mask, bool)
    full = mask.reshape(mask.shape[:2] + (-1,)).all(-1)  # (N, T)
    anyobs = mask.reshape(mask.shape[:2] + (-1,)).any(-1)
    best = GapSize(num_states, 0, -1, None)
    num_steps = full.shape[1]
    for n in range(full.shape[0]):
        f, a = full[n], anyobs[n]
        if f.all():
            continue
        obs_idx = np.flatnonzero(a)
        # the window after step t feeds steps > t: up to the last observed step (or the
        # end, for a forecast)
        last = num_steps if trailing else (int(obs_idx[-1]) if obs_idx.size else 0)
        # a missing value among the conditioned steps that an observed step depends on
        # (directly as a lag, or through missing values in between) has no law here
        tainted = np.zeros(num_steps, bool)
        for t in range(num_steps):
            window = tainted[max(0, t - num_lags): t]
            if t >= num_lags and a[t] and window.any() and best.conditioned is None:
                best = best._replace(conditioned=(n, t))
            tainted[t] = not f[t] and (t < num_lags or window.any())
        live, gap = num_states, 0
        for t in range(last):
            if not f[t] and (t == 0 or f[t - 1]):  # a gap begins: its full length
                rest = np.flatnonzero(f[t:])
                gap = int(rest[0]) if rest.size else num_steps - t
            if f[max(0, t - num_lags + 1): t + 1].all():
                live = num_states
                continue
            live = live * (branching if t > 0 else 1)
            if live > best.components or best.gap == 0:
                best = best._replace(components=max(live, best.components), gap=gap,
                                     sequence=n)
            if limit is not None and live > limit:
                break
    return best
