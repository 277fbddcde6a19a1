"""The exact initial (diffuse) smoother as the observation variance goes to 0 (issue 11).

`kalman_smoother` and `steady_state_smoother` with diffuse directions run the exact initial
smoother of Durbin and Koopman (2012, sec. 5.3; Koopman and Durbin 2000) on the univariate
exact initial filter (`statseq.inference.kalman_diffuse_smoother`). References:
statsmodels' ``UnobservedComponents`` with exact diffuse initialization (its univariate
exact initial smoother; ``tolerance = 0``), and dense Gaussian conditioning with the
diffuse ``delta`` integrated over its flat-prior posterior (generalized least squares),
which also checks the cross-covariances (statsmodels leaves ``smoothed_state_autocov`` at
0 here). Before this smoother the augmented (de Jong) recursion was off by 2e-9 (relative)
at ``R / Q = 1e-6``, 1e-5 at 1e-10, 1e-2 at 1e-13 and NaN at 0 on level plus seasonal.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.inference import kalman, kalman_steady
from statseq.inference.kalman import GaussianSSMArrays
from tests.inference._diffuse_refs import LEVEL_VAR, SEASONAL_VAR, log_air, structural_arrays

RATIOS = [1e-2, 1e-6, 1e-10, 1e-13, 0.0]

SMOOTHER = jax.jit(kalman.kalman_smoother)
STEADY = jax.jit(kalman_steady.steady_state_smoother, static_argnames="head")


def statsmodels_smooth(kind, obs_var, y):
    sm = pytest.importorskip("statsmodels.tsa.statespace.structural")
    kwargs = {"level": "llevel"} if kind == "level" else {"level": "llevel", "seasonal": 12}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = sm.UnobservedComponents(y, use_exact_diffuse=True, **kwargs)
    mod.ssm.tolerance = 0.0
    res = mod.smooth([obs_var, LEVEL_VAR] + ([] if kind == "level" else [SEASONAL_VAR]))
    return res.smoothed_state.T, np.moveaxis(res.smoothed_state_cov, 2, 0)


def assert_close_to_statsmodels(got, ref_mean, ref_cov, what):
    """Means to 1e-8 of their scale; covariances to 1e-8 of theirs plus 1e-13 of the
    state's predicted variance (``LEVEL_VAR``): both sides form ``P - P N P``, which
    cancels to ~1e-16 of ``P`` where the smoothed variance is ~``R`` (local level)."""
    mean, cov = np.asarray(got.smoothed_means), np.asarray(got.smoothed_covs)
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(cov)), what
    err_m = np.max(np.abs(mean - ref_mean))
    assert err_m <= 1e-8 * np.max(np.abs(ref_mean)), (what, err_m)
    err_c = np.max(np.abs(cov - ref_cov))
    assert err_c <= 1e-8 * np.max(np.abs(ref_cov)) + 1e-13 * LEVEL_VAR, (what, err_c)


@pytest.mark.parametrize("kind", ["level", "seasonal"])
def test_full_air_passengers_against_statsmodels_down_to_zero_variance(kind):
    """Level (1 diffuse state) and level + 12-month seasonal (12) on the 144 log air
    passengers at ``R / Q`` = 1e-2 ... 1e-13 and exactly 0: smoothed means and covariances
    of `kalman_smoother` and `steady_state_smoother` agree with statsmodels (measured: means
    3e-16 relative, covariances 5e-14 relative for the seasonal model, 1e-19 absolute for
    the local level)."""
    y = log_air()
    for ratio in RATIOS:
        ref_mean, ref_cov = statsmodels_smooth(kind, ratio * LEVEL_VAR, y)
        arr = structural_arrays(kind, ratio * LEVEL_VAR)
        args = (arr, jnp.asarray(y[:, None]))
        exact = SMOOTHER(*args, jnp.ones((len(y), 1), bool), jnp.zeros((len(y), 0)))
        assert_close_to_statsmodels(exact, ref_mean, ref_cov, (kind, ratio, "exact"))
        steady = STEADY(*args, jnp.zeros((len(y), 0)), head=16)
        assert_close_to_statsmodels(steady, ref_mean, ref_cov, (kind, ratio, "steady"))


@pytest.mark.parametrize("ratio", [1e-2, 1e-10, 0.0])
def test_missing_values_in_the_diffuse_head_against_statsmodels(ratio):
    """Level + seasonal with values missing among the first 13 (before the data identify
    the 12 diffuse states) and later."""
    y = log_air()[:72].copy()
    missing = [1, 4, 5, 12, 30]
    y[missing] = np.nan
    ref_mean, ref_cov = statsmodels_smooth("seasonal", ratio * LEVEL_VAR, y)
    mask = ~np.isnan(y)
    arr = structural_arrays("seasonal", ratio * LEVEL_VAR)
    got = SMOOTHER(arr, jnp.asarray(np.where(mask, y, 1e3)[:, None]),
                   jnp.asarray(mask[:, None]), jnp.zeros((len(y), 0)))
    assert_close_to_statsmodels(got, ref_mean, ref_cov, ratio)


# ---- dense reference -----------------------------------------------------------------------
def dense_smoother(arr: GaussianSSMArrays, y, mask):
    """Smoothed means, covariances and ``Cov[x_{t+1}, x_t]`` by conditioning the joint
    Gaussian of all states and observed values, with ``x_0 = m + A delta + e_0`` and
    ``delta`` given a flat prior (integrated over its GLS posterior). Time-invariant
    matrices, no inputs."""
    f, h, q_cov, r_cov = (np.asarray(a, float) for a in (
        arr.dynamics_weights, arr.emission_weights, arr.dynamics_cov, arr.emission_cov))
    m0, p0, a0 = (np.asarray(a, float) for a in (arr.initial_mean, arr.initial_cov,
                                                 arr.initial_diffuse))
    b, d = np.asarray(arr.dynamics_bias, float), np.asarray(arr.emission_bias, float)
    num_t, n, q = len(y), len(m0), a0.shape[1]
    phi, psi, c = np.zeros((num_t, n, q)), np.zeros((num_t, n, n * num_t)), np.zeros((num_t, n))
    phi[0], psi[0, :, :n], c[0] = a0, np.eye(n), m0
    for t in range(1, num_t):
        phi[t], psi[t], c[t] = f @ phi[t - 1], f @ psi[t - 1], f @ c[t - 1] + b
        psi[t, :, n * t:n * (t + 1)] += np.eye(n)
    sig_e = np.zeros((n * num_t, n * num_t))
    sig_e[:n, :n] = p0
    for t in range(1, num_t):
        sig_e[n * t:n * (t + 1), n * t:n * (t + 1)] = q_cov
    rows = [(t, i) for t in range(num_t) for i in range(h.shape[0]) if mask[t, i]]
    gy = np.array([h[i] @ phi[t] for t, i in rows])
    ly = np.array([h[i] @ psi[t] for t, i in rows])
    resid = np.array([y[t, i] - h[i] @ c[t] - d[i] for t, i in rows])
    r_blk = np.array([[r_cov[i, j] if t == s else 0.0 for s, j in rows] for t, i in rows])
    gx, lx = phi.reshape(num_t * n, q), psi.reshape(num_t * n, -1)
    s_yy = ly @ sig_e @ ly.T + r_blk
    s_xy = lx @ sig_e @ ly.T
    gain = np.linalg.solve(s_yy, s_xy.T).T
    info = gy.T @ np.linalg.solve(s_yy, gy)
    delta = np.linalg.solve(info, gy.T @ np.linalg.solve(s_yy, resid))
    cmat = gx - gain @ gy
    mean = c.ravel() + gain @ resid + cmat @ delta
    cov = lx @ sig_e @ lx.T - gain @ s_xy.T + cmat @ np.linalg.solve(info, cmat.T)
    blocks = cov.reshape(num_t, n, num_t, n)
    return (mean.reshape(num_t, n), np.array([blocks[t, :, t] for t in range(num_t)]),
            np.array([blocks[t + 1, :, t] for t in range(num_t - 1)]))


def _assert_dense(got, y, mask, arr):
    ref = dense_smoother(arr, y, mask)
    for name, r in zip(("smoothed_means", "smoothed_covs", "smoothed_cross_covs"), ref,
                       strict=True):
        g = np.asarray(getattr(got, name))
        assert np.max(np.abs(g - r)) <= 1e-9 * np.max(np.abs(r)), name


def test_trend_and_quarterly_seasonal_with_missing_head_against_dense_conditioning():
    """Local linear trend + quarterly seasonal (5 diffuse states), 24 values with two
    missing in the diffuse head and one later: means, covariances and cross-covariances."""
    model = ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(4)))
    params = ss.StructuralParams(1e-4, (ss.TrendParams(LEVEL_VAR, 1e-5),
                                        ss.SeasonalParams(SEASONAL_VAR)))
    arr = jax.jit(model.to_arrays)(params)
    y = log_air()[:24, None]
    mask = np.ones(y.shape, bool)
    mask[[1, 3, 10]] = False
    got = SMOOTHER(arr, jnp.asarray(np.where(mask, y, -50.0)), jnp.asarray(mask),
                   jnp.zeros((24, 0)))
    _assert_dense(got, y, mask, arr)


def test_two_series_partly_diffuse_with_missing_entries_against_dense_conditioning():
    """n = 3 (two diffuse directions, not unit vectors, and a proper AR part), D = 2 with
    correlated observation noise, entries missing singly and one whole step."""
    rng = np.random.default_rng(5)
    t_len = 12
    arr = GaussianSSMArrays(*map(jnp.asarray, (
        np.array([0.0, 0.0, 0.3]), np.diag([0.0, 0.0, 1.0]),
        np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.7]]), np.zeros((3, 0)),
        np.array([0.0, 0.0, 0.1]), np.diag([0.1, 0.01, 0.5]),
        np.array([[1.0, 0.0, 1.0], [1.0, 0.5, -1.0]]), np.zeros((2, 0)),
        np.array([0.2, -0.1]), np.array([[0.5, 0.2], [0.2, 1.0]]),
        np.array([[1.0, 0.5], [0.3, -2.0], [0.0, 0.0]]))))
    y = np.cumsum(rng.normal(size=(t_len, 2)), axis=0)
    mask = np.ones((t_len, 2), bool)
    mask[0, 1] = mask[3, 0] = mask[7, 1] = False
    mask[1] = False
    got = SMOOTHER(arr, jnp.asarray(np.where(mask, y, 9e3)), jnp.asarray(mask),
                   jnp.zeros((t_len, 0)))
    _assert_dense(got, y, mask, arr)


def test_steady_state_smoother_fast_path_with_diffuse_start():
    """Local level at ``R / Q = 1e-2`` on 144 values: the steady path is taken (the result
    differs from `kalman_smoother` at rounding level, not bit for bit) and agrees with it
    and with dense conditioning, cross-covariances included."""
    y = log_air()[:, None]
    arr = structural_arrays("level", 1e-2 * LEVEL_VAR)
    u = jnp.zeros((len(y), 0))
    fast = STEADY(arr, jnp.asarray(y), u, head=16)
    exact = SMOOTHER(arr, jnp.asarray(y), jnp.ones(y.shape, bool), u)
    assert not np.array_equal(np.asarray(fast.smoothed_means), np.asarray(exact.smoothed_means))
    for name in kalman.KalmanSmootherResult._fields:
        a, b = np.asarray(getattr(fast, name)), np.asarray(getattr(exact, name))
        assert np.max(np.abs(a - b)) <= 1e-11 * np.max(np.abs(b)), name
    _assert_dense(fast, y, np.ones(y.shape, bool), arr)
