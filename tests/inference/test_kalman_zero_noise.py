"""Smoothers, parallel filters and the posterior sampler as ``R -> 0`` (issue 11, point 4).

The sequential, parallel and diffuse smoothers form ``Cov[x_t | y]`` as ``P_{t|t} - (F
P_{t|t})^T N_t (F P_{t|t})`` (no cancellation where ``R << Q``); the parallel filter and
smoother run the exact initial filter and smoother over the diffuse head; `sample_posterior`
is the mean-correction simulation smoother on `kalman_smoother`. References: the Kalman
filter and RTS smoother in exact rational arithmetic of `test_kalman_extreme` (reused), for
diffuse starts with the initial variance ``kappa = 2^200`` (an exact float; the diffuse limit
differs from it by ``O(Q / kappa) ~ 1e-60`` relative, far below the tolerance). Models: a
local level and the correlated two-state model of `test_kalman_extreme` with proper priors,
and a local level and a local linear trend with a fixed slope (singular ``Q = diag(q,
0)``) with diffuse starts, at ``Q / R`` in ``{1e8, 1e12, 1e16}`` and ``R = 0``, with
missing steps.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from statseq.inference import kalman, kalman_parallel
from statseq.inference.kalman import GaussianSSMArrays
from tests.inference.test_kalman_extreme import (
    TOL,
    _assert_close,
    _case,
    exact_filter_smoother,
)

NUM_T = 24
KAPPA = 2.0**200
OBS_VARS = [1e-8, 1e-12, 1e-16, 0.0]  # R, with Q = 1: Q / R = 1e8, 1e12, 1e16, infinity

SMOOTHERS = {"sequential": jax.jit(kalman.kalman_smoother),
             "parallel": jax.jit(kalman_parallel.parallel_kalman_smoother)}
FILTER = jax.jit(kalman.kalman_filter)
PARALLEL_FILTER = jax.jit(kalman_parallel.parallel_kalman_filter)


def _scalar_model(kind, r, diffuse):
    """Local level or trend with a fixed slope (``Q = diag(1, 0)``), observed with ``R = r``
    at all but three steps; with ``diffuse``, every state is diffuse (reference: variance
    ``kappa``)."""
    rng = np.random.default_rng(11)
    if kind == "level":
        f, q, h, m0, p0 = [[1.0]], [[1.0]], [[1.0]], [5.0], [[1.0]]
    else:
        f, q, h = [[1.0, 1.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 0.0]], [[1.0, 0.0]]
        m0, p0 = [5.0, 0.0], [[1.0, 0.2], [0.2, 0.5]]
    n = len(m0)
    y = (5.0 + 0.1 * np.arange(NUM_T) + np.cumsum(rng.normal(size=NUM_T))
         + math.sqrt(r) * rng.normal(size=NUM_T))[:, None]
    mask = np.ones((NUM_T, 1), bool)
    mask[[5, 12, 13]] = False
    y[~mask] = 1e3
    ref_p0 = KAPPA * np.eye(n) if diffuse else np.asarray(p0)
    want = exact_filter_smoother(m0, ref_p0, f, q, h, [[r]], y, mask)
    arrays = GaussianSSMArrays(*map(jnp.asarray, (
        np.asarray(m0), np.zeros((n, n)) if diffuse else np.asarray(p0), np.asarray(f),
        np.zeros((n, 0)), np.zeros(n), np.asarray(q), np.asarray(h), np.zeros((1, 0)),
        np.zeros(1), np.array([[r]]), np.eye(n) if diffuse else np.zeros((n, 0)))))
    return (arrays, jnp.asarray(y), jnp.asarray(mask), jnp.zeros((NUM_T, 0))), want


def _cases():
    for r in OBS_VARS:
        yield f"level-R{r:g}", ("extreme", 1, r)
        yield f"two-state-R{r:g}", ("extreme", 2, r)
        yield f"level-diffuse-R{r:g}", ("level", True, r)
        yield f"trend-diffuse-R{r:g}", ("trend", True, r)


CASES = dict(_cases())


@functools.cache  # the exact rational references are reused by several tests (read only)
def _get(spec):
    if spec[0] == "extreme":
        return _case(spec[1], 1.0, spec[2])
    return _scalar_model(spec[0], spec[2], spec[1])


def _assert_cov(got, want, name, exact_zero):
    """`_assert_close` for covariances; at ``R = 0`` a reference variance that is exactly 0
    (the data pin the state) must come out below ``1e-20`` of the largest variance: it is a
    difference of terms of that size, and the old ``P - P N P`` left ``~1e-16`` of it."""
    if not exact_zero:
        _assert_close(got, want, name)
        return
    got = np.asarray(got)
    floor = 1e-20 * np.max(np.einsum("tii->ti", want))
    var_want = np.einsum("tii->ti", want)
    sd = np.sqrt(var_want)
    scale = TOL * sd[:, :, None] * sd[:, None, :] + floor
    err = np.abs(got - want)
    assert np.all(err <= scale), (name, float(np.max(err - scale)))


def _check(got, want, spec, kinds, first=0):
    zero = spec[-1] == 0.0
    for kind in kinds:
        _assert_close(np.asarray(getattr(got, f"{kind}_means"))[first:],
                      want[f"{kind}_means"][first:], kind)
        _assert_cov(np.asarray(getattr(got, f"{kind}_covs"))[first:],
                    want[f"{kind}_covs"][first:], kind, zero)


@pytest.mark.parametrize("method", list(SMOOTHERS))
@pytest.mark.parametrize("name", list(CASES))
def test_smoothed_moments_against_exact_rationals(name, method):
    """Smoothed means and covariances to 1e-8 relative (exact zeros to 1e-20 of the
    scale at ``R = 0``), filtered ones from the step at which a diffuse start is
    identified (before it the filters report the exact initial filter's ``P_star``)."""
    spec = CASES[name]
    args, want = _get(spec)
    got = SMOOTHERS[method](*args)
    diffuse = spec[0] != "extreme" and spec[1]
    _check(got, want, spec, ("smoothed",))
    _check(got, want, spec, ("filtered",), first=2 if diffuse else 0)


@pytest.mark.parametrize("name", [k for k, v in CASES.items() if v[0] != "extreme" and v[1]])
def test_parallel_filter_and_smoother_equal_sequential_with_diffuse_start(name):
    """Every output of the parallel filter and smoother equals the sequential one
    (log-densities, predicted and filtered moments in the diffuse head too)."""
    args, _ = _get(CASES[name])
    for seq, par in ((FILTER(*args), PARALLEL_FILTER(*args)),
                     (SMOOTHERS["sequential"](*args), SMOOTHERS["parallel"](*args))):
        for field, a, b in zip(seq._fields, par, seq, strict=True):
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-14 * np.max(np.abs(b)),
                                       err_msg=f"{name} {field}")


def test_parallel_diffuse_fallback_and_gradient():
    """The head scans ``min(T, 2 q + 16) = 20`` steps: with the first 19 steps of the trend
    missing the data identify both directions only at step 20, and the parallel filter
    and smoother fall back to the sequential ones (same results). The log-likelihood's
    gradient in the scales of ``(Q, R)`` through the parallel filter (reverse mode: the
    head is a scan, not a while loop) equals central differences of the sequential one."""
    (arrays, y, mask, u), _ = _get(("trend", True, 1e-12))
    late = mask.at[:19].set(False)
    for seq, par in ((FILTER, PARALLEL_FILTER), (SMOOTHERS["sequential"],
                                                 SMOOTHERS["parallel"])):
        want, got = seq(arrays, y, late, u), par(arrays, y, late, u)
        for field, a, b in zip(want._fields, got, want, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, err_msg=field)

    def log_lik(scales):
        arr = arrays._replace(dynamics_cov=arrays.dynamics_cov * scales[0],
                              emission_cov=arrays.emission_cov * scales[1])
        return kalman_parallel.parallel_kalman_filter(arr, y, mask, u).marginal_log_lik

    got = np.asarray(jax.jit(jax.grad(log_lik))(jnp.ones(2)))
    # central differences of the (compiled) sequential filter: truncation ~h^2, rounding
    # ~eps |log L| / h, both below 1e-8 of the derivatives here
    # (at R = 1e-12 the log-likelihood hardly depends on R's scale: compared absolutely)
    step = 1e-5
    fd = np.array([(float(log_lik_seq(arrays, y, mask, u, 1 + e))
                    - float(log_lik_seq(arrays, y, mask, u, 1 - e))) / (2 * step)
                   for e in np.eye(2) * step])
    assert abs(fd[0]) > 1.0
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-6 * abs(fd[0]))


def log_lik_seq(arrays, y, mask, u, scales):
    arr = arrays._replace(dynamics_cov=arrays.dynamics_cov * scales[0],
                          emission_cov=arrays.emission_cov * scales[1])
    return FILTER(arr, y, mask, u).marginal_log_lik


def test_the_old_form_cancels_where_the_new_one_does_not():
    """The test can fail: ``P_t - P_t N_{t-1} P_t`` (the form before) from the same
    sequential pass loses the local level's smoothed variances at ``Q / R = 1e16``."""
    args, want = _get(CASES["level-R1e-16"])
    arrays, y, mask, u = args
    _, (_, pred_m, pred_c, dif, filt, inn) = kalman._scan_filter(arrays, y, mask, u, False)
    init = (jnp.zeros(1), jnp.zeros((1, 1)), jnp.zeros((1, 0)))
    xs = (jnp.arange(NUM_T), pred_c, inn.w, inn.z, inn.chol, inn.h, dif)
    _, n_prev, _, _ = kalman._backward_pass(arrays, NUM_T, init, xs)
    old = np.asarray(pred_c - pred_c @ n_prev @ pred_c)[:, 0, 0]
    ref = want["smoothed_covs"][:, 0, 0]
    assert np.max(np.abs(old - ref) / ref) > 1e-2
    new = np.asarray(kalman.smoothed_from_filtered(
        kalman.dynamics_weights(arrays, NUM_T), filt.cov, n_prev))[:, 0, 0]
    np.testing.assert_allclose(new, ref, rtol=TOL)


# ---- the posterior sampler --------------------------------------------------------------------
SAMPLE = jax.jit(kalman.sample_posterior, static_argnums=5)


@pytest.mark.parametrize("r", [1e-12, 0.0])
def test_sample_moments_match_the_exact_smoother(r):
    """`sample_posterior` on the trend with a fixed slope, diffuse start, ``Q / R = 1e12``
    and ``R = 0``: 4000 draws
    (fixed key). Their means are within 4.5 Monte Carlo standard errors (``sd / sqrt(4000)``)
    of the exact smoothed means, for every component whose smoothed variance exceeds 1e-20
    (at ``R = 0`` the others are pinned: the level equals ``y_t`` at every observed step
    to rounding, ``1e-13`` relative, in every draw); their
    variances are within 5 standard errors of a normal sample variance (``sqrt(2 / 4000)``,
    i.e. 11% relative) of the exact smoothed variances, and the level-slope covariances
    within ``0.11 sd_i sd_j``."""
    args, want = _get(("trend", True, r))
    num = 4000
    draws = np.asarray(SAMPLE(*args, jax.random.key(7), num))
    mean, cov = want["smoothed_means"], want["smoothed_covs"]
    var = np.einsum("tii->ti", cov)
    free = var > 1e-20
    sd = np.sqrt(np.where(free, var, 1.0))
    z = (draws.mean(0) - mean) / (sd / math.sqrt(num))
    assert np.max(np.abs(z[free])) < 4.5
    obs = np.asarray(args[2][:, 0])
    if r == 0.0:
        assert np.array_equal(~free[:, 0], obs)  # the level is pinned where observed
        y_obs = np.asarray(args[1])[obs, 0]
        np.testing.assert_allclose(draws[:, obs, 0], np.broadcast_to(y_obs, (num, obs.sum())),
                                   rtol=1e-13)
    else:
        assert np.all(free)
    emp = np.einsum("sti,stj->tij", draws - draws.mean(0), draws - draws.mean(0)) / num
    tol = 5 * math.sqrt(2 / num)
    np.testing.assert_allclose(np.einsum("tii->ti", emp)[free], var[free], rtol=tol)
    both = free[:, 0] & free[:, 1]
    corr_err = np.abs(emp[:, 0, 1] - cov[:, 0, 1])[both] / (sd[both, 0] * sd[both, 1])
    assert np.max(corr_err) < tol


def test_model_smoother_parallel_with_diffuse_start_equals_sequential():
    """`LocalLevel.smoother(parallel=True)` (two sequences, looped over with `lax.map`) at
    ``R / Q = 1e-12`` with a missing value equals ``parallel=False``."""
    import statseq as ss

    model, params = ss.LocalLevel(), ss.LocalLevelParams(1e-12, 1.0)
    y = np.cumsum(np.random.default_rng(2).normal(size=(2, NUM_T)), axis=1)
    mask = np.ones_like(y, bool)
    mask[1, 3] = False
    want = model.smoother(params, y, mask=mask, parallel=False)
    got = model.smoother(params, y, mask=mask, parallel=True)
    for field in ("smoothed_means", "smoothed_covs"):
        a, b = np.asarray(getattr(got, field)), np.asarray(getattr(want, field))
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-14 * np.max(np.abs(b)), err_msg=field)
