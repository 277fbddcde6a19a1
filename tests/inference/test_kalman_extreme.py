"""Kalman filters and smoothers at extreme noise ratios, against exact rational arithmetic.

When observations are far more precise than the dynamics noise (``Q / R`` up to ``1e16``)
the covariance forms ``P - K S K^T`` and ``P - P N P`` cancel to rounding noise: their
relative error grows as ``eps * Q / R``. The Joseph-form covariance filter, the square-root
filter and smoother and their parallel (associative-scan) twins, and the covariance
parallel filter (whose filtered covariances are one Joseph update of the scanned predicted
ones) must keep every filtered and smoothed variance and mean to ``1e-8`` relative
accuracy. The reference is the Kalman
filter and Rauch-Tung-Striebel smoother run in `fractions.Fraction` on the exact binary
values of the float64 inputs: no rounding at all.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.inference import kalman, kalman_parallel, kalman_sqrt, kalman_sqrt_parallel
from statseq.inference.kalman import GaussianSSMArrays

TOL = 1e-8
NUM_T = 24
# (Q scale, R scale): Q / R = 1, 1e8, 1e16, 1e-16 and 1e16 at another scale
RATIOS = [(1.0, 1.0), (1.0, 1e-8), (1.0, 1e-16), (1e-16, 1.0), (1e8, 1e-8)]


# ---- exact reference -----------------------------------------------------------------------
def _fr(a):
    return [[Fraction(float(x)) for x in row] for row in np.atleast_2d(a)]


def _mm(a, b):
    return [[sum((a[i][k] * b[k][j] for k in range(len(b))), Fraction(0))
             for j in range(len(b[0]))] for i in range(len(a))]


def _tr(a):
    return [list(r) for r in zip(*a, strict=True)]


def _add(a, b, sign=1):
    return [[x + sign * y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b,
                                                                                  strict=True)]


def _inv(a):
    """Exact inverse by Gauss-Jordan elimination."""
    n = len(a)
    m = [list(r) + [Fraction(int(i == j)) for j in range(n)] for i, r in enumerate(a)]
    for c in range(n):
        p = next(r for r in range(c, n) if m[r][c] != 0)
        m[c], m[p] = m[p], m[c]
        m[c] = [x / m[c][c] for x in m[c]]
        for r in range(n):
            if r != c and m[r][c] != 0:
                f = m[r][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c], strict=True)]
    return [r[n:] for r in m]


def exact_filter_smoother(m0, p0, f, q, h, r, y, mask):
    """Kalman filter and RTS smoother in exact rationals; ``mask`` ``(T, D)`` per entry.

    Returns a dict of float64 arrays (rounded once at the end) and the exact
    log-likelihood (to float precision: only the final logarithms are rounded).
    """
    m0 = [[Fraction(float(x))] for x in m0]
    p0, f, q, h, r = map(_fr, (p0, f, q, h, r))
    num_t = len(y)
    pm, pc, fm, fc = [], [], [], []
    log_lik = 0.0
    m, p = m0, p0
    for t in range(num_t):
        if t:
            m = _mm(f, fm[-1])
            p = _add(_mm(_mm(f, fc[-1]), _tr(f)), q)
        pm.append(m)
        pc.append(p)
        obs = [i for i in range(len(y[t])) if mask[t][i]]
        if obs:
            ho = [h[i] for i in obs]
            ro = [[r[i][j] for j in obs] for i in obs]
            v = _add([[Fraction(float(y[t][i]))] for i in obs], _mm(ho, m), -1)
            s = _add(_mm(_mm(ho, p), _tr(ho)), ro)
            s_inv = _inv(s)
            k = _mm(_mm(p, _tr(ho)), s_inv)
            m = _add(m, _mm(k, v))
            p = _add(p, _mm(_mm(k, ho), p), -1)
            quad = _mm(_mm(_tr(v), s_inv), v)[0][0]
            det = s[0][0] if len(obs) == 1 else s[0][0] * s[1][1] - s[0][1] * s[1][0]
            assert len(obs) <= 2
            log_lik += -0.5 * (float(quad) + math.log(det) + len(obs) * math.log(2 * math.pi))
        fm.append(m)
        fc.append(p)
    sm, sc, cross = [None] * num_t, [None] * num_t, [None] * (num_t - 1)
    sm[-1], sc[-1] = fm[-1], fc[-1]
    for t in range(num_t - 2, -1, -1):
        j = _mm(_mm(fc[t], _tr(f)), _inv(pc[t + 1]))
        sm[t] = _add(fm[t], _mm(j, _add(sm[t + 1], pm[t + 1], -1)))
        sc[t] = _add(fc[t], _mm(_mm(j, _add(sc[t + 1], pc[t + 1], -1)), _tr(j)))
        cross[t] = _mm(sc[t + 1], _tr(j))

    def arr(ms, vec=False):
        a = np.array([[[float(x) for x in row] for row in mat] for mat in ms])
        return a[:, :, 0] if vec else a

    return dict(filtered_means=arr(fm, True), filtered_covs=arr(fc),
                smoothed_means=arr(sm, True), smoothed_covs=arr(sc),
                smoothed_cross_covs=arr(cross), marginal_log_lik=log_lik)


# ---- models --------------------------------------------------------------------------------
def _model(n, q, r):
    """Local level (``n = 1``) or a trend model with correlated noise observed twice."""
    if n == 1:
        return dict(m0=[5.0], p0=[[1.0]], f=[[1.0]], q=[[q]], h=[[1.0]], r=[[r]])
    return dict(m0=[5.0, 0.0], p0=[[1.0, 0.2], [0.2, 0.5]], f=[[1.0, 1.0], [0.0, 1.0]],
                q=[[q, 0.3 * q], [0.3 * q, 0.5 * q]], h=[[1.0, 0.0], [1.0, 0.5]],
                r=[[r, 0.2 * r], [0.2 * r, 2.0 * r]])


def _data(n, q, r):
    rng = np.random.default_rng(7 + n)
    d = 1 if n == 1 else 2
    level = 5.0 + np.cumsum(rng.normal(size=NUM_T)) * math.sqrt(q)
    y = level[:, None] + rng.normal(size=(NUM_T, d)) * math.sqrt(r)
    mask = np.ones((NUM_T, d), bool)
    mask[[4, 11, 12]] = False  # whole steps missing
    if d == 2:
        mask[[6, 15], 0] = False  # single entries missing
        mask[[8, NUM_T - 1], 1] = False
    y[~mask] = 1e3  # values at missing entries must not matter
    return y, mask


@functools.cache
def _case(n, q, r):
    md = _model(n, q, r)
    y, mask = _data(n, q, r)
    want = exact_filter_smoother(**md, y=y, mask=mask)
    num_x = len(md["m0"])
    d = y.shape[1]
    a = {k: jnp.asarray(np.asarray(v, float)) for k, v in md.items()}
    arrays = GaussianSSMArrays(a["m0"], a["p0"], a["f"], jnp.zeros((num_x, 0)),
                               jnp.zeros(num_x), a["q"], a["h"], jnp.zeros((d, 0)),
                               jnp.zeros(d), a["r"], jnp.zeros((num_x, 0)))
    args = (arrays, jnp.asarray(y), jnp.asarray(mask), jnp.zeros((NUM_T, 0)))
    return args, want


def _assert_close(got, want, name):
    """Variances to ``TOL`` relative, covariances to ``TOL sqrt(P_ii P_jj)``; mean vectors
    to ``TOL`` relative in the max norm at each step. (A slope of ``1e-8`` estimated from
    two observations of size 5 that differ by ``1e-8`` is determined only up to the
    rounding of the observations, ``eps |y|``: its entrywise relative error is not a
    property of the algorithm.)"""
    got = np.asarray(got)
    if got.ndim == 2:  # means
        scale = np.max(np.abs(want), axis=1, keepdims=True)
        assert np.all(np.abs(got - want) <= TOL * scale), (
            name, float(np.max(np.abs(got - want) / scale)))
        return
    var_got = np.einsum("tii->ti", got)
    var_want = np.einsum("tii->ti", want)
    np.testing.assert_allclose(var_got, var_want, rtol=TOL, atol=0, err_msg=name)
    sd = np.sqrt(var_want)
    scale = sd[:, :, None] * sd[:, None, :]
    assert np.all(np.abs(got - want) <= TOL * scale), (
        name, float(np.max(np.abs(got - want) / scale)))


def _check_moments(got, want, kinds):
    for kind in kinds:
        _assert_close(getattr(got, f"{kind}_means"), want[f"{kind}_means"], kind)
        _assert_close(getattr(got, f"{kind}_covs"), want[f"{kind}_covs"], kind)


def _assert_cross(got, want_res):
    sd = np.sqrt(np.einsum("tii->ti", want_res["smoothed_covs"]))
    scale = sd[1:, :, None] * sd[:-1, None, :]  # Cov[x_{t+1}, x_t]
    err = np.abs(np.asarray(got) - want_res["smoothed_cross_covs"])
    assert np.all(err <= TOL * scale), float(np.max(err / scale))


FILTERS = {
    "joseph": jax.jit(kalman.kalman_filter),
    "parallel_joseph": jax.jit(kalman_parallel.parallel_kalman_filter),
    "sqrt": jax.jit(kalman_sqrt.sqrt_kalman_filter),
    "sqrt_parallel": jax.jit(kalman_sqrt_parallel.parallel_sqrt_kalman_filter),
}
# the smoothers are compiled once, as the factor forms (which
# test_factors_are_lower_triangular_with_nonnegative_diagonal inspects with the same compiled
# programs); the covariances are ``L L^T`` of the factors, as in the library's wrappers
SMOOTHER_FACTORS = {
    "sqrt": jax.jit(kalman_sqrt.sqrt_kalman_smoother_factors),
    "sqrt_parallel": jax.jit(kalman_sqrt_parallel.parallel_sqrt_kalman_smoother_factors),
}


def _moments(factor_fn):
    def smoother(*args):
        res = factor_fn(*args)

        def gram(chol):
            chol = np.asarray(chol)
            return chol @ np.swapaxes(chol, -1, -2)

        return kalman.KalmanSmootherResult(
            res.marginal_log_lik, res.filtered_means, gram(res.filtered_chols),
            res.smoothed_means, gram(res.smoothed_chols), res.smoothed_cross_covs)

    return smoother


SMOOTHERS = {name: _moments(fn) for name, fn in SMOOTHER_FACTORS.items()}


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize(("q", "r"), RATIOS)
@pytest.mark.parametrize("method", list(FILTERS))
def test_filters_match_exact_rationals(method, q, r, n):
    args, want = _case(n, q, r)
    got = FILTERS[method](*args)
    _check_moments(got, want, ("filtered",))
    np.testing.assert_allclose(float(got.marginal_log_lik), want["marginal_log_lik"],
                               rtol=1e-10)


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize(("q", "r"), RATIOS)
@pytest.mark.parametrize("method", list(SMOOTHERS))
def test_smoothers_match_exact_rationals(method, q, r, n):
    args, want = _case(n, q, r)
    got = SMOOTHERS[method](*args)
    _check_moments(got, want, ("filtered", "smoothed"))
    _assert_cross(got.smoothed_cross_covs, want)
    np.testing.assert_allclose(float(got.marginal_log_lik), want["marginal_log_lik"],
                               rtol=1e-10)


def test_square_root_smoothers_keep_variances_exact_entrywise():
    """At ``Q / R = 1e16`` the sequential square-root smoother's covariance entries are
    accurate entry by entry (not only relative to ``sqrt(P_ii P_jj)``)."""
    args, want = _case(2, 1.0, 1e-16)
    got = SMOOTHERS["sqrt"](*args)
    for name in ("smoothed_covs", "smoothed_cross_covs"):
        np.testing.assert_allclose(np.asarray(getattr(got, name)), want[name], rtol=1e-11,
                                   err_msg=name)


# ---- general models: the parallel square-root forms equal the sequential ones ---------------
def _spd(rng, n, *lead):
    a = rng.normal(size=(*lead, n, n))
    return a @ np.swapaxes(a, -1, -2) + 0.1 * np.eye(n)


def test_parallel_sqrt_equals_sequential_on_a_time_varying_model_with_inputs():
    rng = np.random.default_rng(3)
    n, d, m, num_t = 3, 2, 1, 37  # more than two blocks of the scan schedule
    arrays = jax.tree.map(jnp.asarray, GaussianSSMArrays(
        initial_mean=rng.normal(size=n), initial_cov=_spd(rng, n),
        dynamics_weights=0.6 * rng.normal(size=(num_t - 1, n, n)) / np.sqrt(n),
        dynamics_input_weights=rng.normal(size=(num_t - 1, n, m)),
        dynamics_bias=rng.normal(size=(num_t - 1, n)), dynamics_cov=_spd(rng, n, num_t - 1),
        emission_weights=rng.normal(size=(num_t, d, n)),
        emission_input_weights=rng.normal(size=(num_t, d, m)),
        emission_bias=rng.normal(size=(num_t, d)), emission_cov=_spd(rng, d, num_t),
        initial_diffuse=np.zeros((n, 0)),
    ))
    y = rng.normal(size=(num_t, d))
    mask = rng.random((num_t, d)) > 0.3
    mask[3] = False
    y[~mask] = 1e3
    args = (arrays, jnp.asarray(y), jnp.asarray(mask), jnp.asarray(rng.normal(size=(num_t, m))))
    want_f = jax.jit(kalman.kalman_filter)(*args)
    got_f = FILTERS["sqrt_parallel"](*args)
    for name, a, b in zip(want_f._fields, got_f, want_f, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-10,
                                   err_msg=name)
    assert float(got_f.log_probs[3]) == 0.0
    want_s = jax.jit(kalman.kalman_smoother)(*args)
    for got_s in (SMOOTHERS["sqrt_parallel"](*args), SMOOTHERS["sqrt"](*args)):
        for name, a, b in zip(want_s._fields, got_s, want_s, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-10,
                                       err_msg=name)


def test_factors_are_lower_triangular_with_nonnegative_diagonal():
    args, _ = _case(2, 1.0, 1e-8)
    for fn in SMOOTHER_FACTORS.values():
        res = fn(*args)
        for chols in (res.filtered_chols, res.smoothed_chols):
            chols = np.asarray(chols)
            assert np.all(np.triu(chols, 1) == 0.0)
            assert np.all(np.einsum("tii->ti", chols) >= 0.0)


def test_diffuse_initialization_is_not_implemented():
    args, _ = _case(1, 1.0, 1.0)
    arrays = args[0]._replace(initial_diffuse=jnp.ones((1, 1)))
    for fn in (kalman_sqrt.sqrt_kalman_smoother,
               kalman_sqrt_parallel.parallel_sqrt_kalman_filter,
               kalman_sqrt_parallel.parallel_sqrt_kalman_smoother):
        with pytest.raises(NotImplementedError, match="diffuse"):
            fn(arrays, *args[1:])


# ---- the model-level switch ----------------------------------------------------------------
def test_models_select_the_square_root_forms():
    model = ss.LinearGaussianSSM(state_dim=1, emission_dim=None, initial="free")
    p = model.default_params()._replace(
        initial_mean=jnp.array([5.0]), initial_cov=jnp.eye(1),
        dynamics_weights=jnp.eye(1), dynamics_cov=jnp.eye(1), emission_weights=jnp.eye(1),
        emission_cov=jnp.array([[1e-16]]), dynamics_bias=jnp.zeros(1),
        emission_bias=jnp.zeros(1),
    )
    md = _model(1, 1.0, 1e-16)
    y, mask = _data(1, 1.0, 1e-16)
    want = exact_filter_smoother(**md, y=y, mask=mask)
    y1, m1 = y[:, 0], mask[:, 0]
    for parallel in (False, True):
        sm = model.smoother(p, y1, mask=m1, square_root=True, parallel=parallel)
        np.testing.assert_allclose(np.asarray(sm.smoothed_covs)[:, 0, 0],
                                   want["smoothed_covs"][:, 0, 0], rtol=TOL)
        fi = model.filter_states(p, y1, mask=m1, square_root=True, parallel=parallel)
        np.testing.assert_allclose(np.asarray(fi.filtered_covs)[:, 0, 0],
                                   want["filtered_covs"][:, 0, 0], rtol=TOL)
    with pytest.raises(TypeError, match="square_root"):
        model.smoother(p, y1, mask=m1, square_root="yes")
