"""Square-root Kalman filter: equal to the plain filter in float64, robust in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from statseq.inference.gaussian import symmetrize
from statseq.inference.kalman import GaussianSSMArrays, kalman_filter
from statseq.inference.kalman_sqrt import (
    psd_cholesky,
    sqrt_kalman_filter,
    sqrt_kalman_filter_factors,
)

_plain = jax.jit(kalman_filter)
_sqrt = jax.jit(sqrt_kalman_filter)
_factors = jax.jit(sqrt_kalman_filter_factors)


def _spd(rng, n, *lead, jitter=0.1):
    a = rng.normal(size=(*lead, n, n))
    return a @ np.swapaxes(a, -1, -2) + jitter * np.eye(n)


def _random_model(rng, n, d, m, num_t, time_varying):
    """A random model with full (non-diagonal) P, Q and R; fixed or time-varying leaves."""
    dyn = (num_t - 1,) if time_varying else ()
    emi = (num_t,) if time_varying else ()
    return GaussianSSMArrays(
        initial_mean=rng.normal(size=n),
        initial_cov=_spd(rng, n),
        dynamics_weights=0.6 * rng.normal(size=(*dyn, n, n)) / np.sqrt(n),
        dynamics_input_weights=rng.normal(size=(*dyn, n, m)),
        dynamics_bias=rng.normal(size=(*dyn, n)),
        dynamics_cov=_spd(rng, n, *dyn),
        emission_weights=rng.normal(size=(*emi, d, n)),
        emission_input_weights=rng.normal(size=(*emi, d, m)),
        emission_bias=rng.normal(size=(*emi, d)),
        emission_cov=_spd(rng, d, *emi),
        initial_diffuse=np.zeros((n, 0)),
    )


def _random_data(rng, d, m, num_t):
    y = rng.normal(size=(num_t, d)) * 2.0
    mask = rng.random((num_t, d)) > 0.3  # single entries missing
    mask[3] = False  # a whole step missing
    mask[num_t - 1] = False  # ... also the last one
    mask[5] = True
    y[~mask] = 1e3  # values at missing entries must not matter
    return y, mask, rng.normal(size=(num_t, m))


def _assert_same(got, want, tol):
    for name, a, b in zip(got._fields, got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol, err_msg=name)


# (the structural-model and factor tests below reuse these shapes: one compilation each)
NUM_T = 12


@pytest.mark.parametrize(
    ("n", "d", "m", "time_varying"), [(3, 2, 1, True), (3, 1, 0, False), (2, 4, 2, False)]
)
def test_equals_plain_filter_in_float64(n, d, m, time_varying):
    rng = np.random.default_rng(100 * n + 10 * d + m + time_varying)
    num_t = NUM_T
    arrays = jax.tree.map(jnp.asarray, _random_model(rng, n, d, m, num_t, time_varying))
    y, mask, u = _random_data(rng, d, m, num_t)
    want = _plain(arrays, y, mask, u)
    got = _sqrt(arrays, y, mask, u)
    assert got.log_probs[3] == 0.0
    _assert_same(got, want, 1e-10)


def test_factors_are_lower_triangular_cholesky_factors():
    rng = np.random.default_rng(7)
    arrays = jax.tree.map(jnp.asarray, _random_model(rng, 3, 2, 1, NUM_T, True))
    y, mask, u = _random_data(rng, 2, 1, NUM_T)
    fac = _factors(arrays, y, mask, u)
    res = _plain(arrays, y, mask, u)
    np.testing.assert_allclose(fac.log_probs, res.log_probs, atol=1e-10)
    for chols, covs in [(fac.predicted_chols, res.predicted_covs),
                        (fac.filtered_chols, res.filtered_covs)]:
        chols = np.asarray(chols)
        np.testing.assert_array_equal(chols, np.tril(chols))
        assert np.all(np.diagonal(chols, axis1=1, axis2=2) > 0)
        np.testing.assert_allclose(np.linalg.cholesky(np.asarray(covs)), chols, atol=1e-10)
    np.testing.assert_allclose(fac.predicted_chols[0], np.linalg.cholesky(arrays.initial_cov))


def test_singular_noise_of_a_structural_model():
    """Local linear trend whose slope is known exactly (zero initial variance and zero
    noise) plus a constant offset (zero row of Q): Q, the initial covariance and every
    state covariance are singular; the factors are exact (zero rows where the variance is
    zero) and the filter equals the plain one."""
    rng = np.random.default_rng(3)
    num_t = NUM_T
    f = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    q = np.diag([0.5, 0.0, 0.0])
    h = np.array([[1.0, 0.0, 1.0]])
    arrays = GaussianSSMArrays(
        np.zeros(3), np.diag([10.0, 0.0, 4.0]), f, np.zeros((3, 0)), np.zeros(3), q, h,
        np.zeros((1, 0)), np.zeros(1), np.array([[0.3]]), np.zeros((3, 0)),
    )
    arrays = jax.tree.map(jnp.asarray, arrays)
    y = np.cumsum(rng.normal(size=(num_t, 1)), axis=0)
    mask = np.ones((num_t, 1), bool)
    mask[5:8] = False
    u = np.zeros((num_t, 0))
    got = _sqrt(arrays, y, mask, u)
    _assert_same(got, _plain(arrays, y, mask, u), 1e-10)
    np.testing.assert_array_equal(got.filtered_covs[:, 1], 0.0)


def test_psd_cholesky():
    rng = np.random.default_rng(5)
    a = _spd(rng, 4)
    np.testing.assert_allclose(psd_cholesky(a), np.linalg.cholesky(a), rtol=1e-12)
    # rank 2 with a zero row/column and a dependent direction
    b = rng.normal(size=(4, 2))
    b[1] = 0.0
    s = b @ b.T
    chol = np.asarray(psd_cholesky(s))
    assert np.all(np.isfinite(chol))
    np.testing.assert_array_equal(chol, np.tril(chol))
    np.testing.assert_allclose(chol @ chol.T, s, atol=1e-12)
    np.testing.assert_array_equal(chol[1], 0.0)
    np.testing.assert_array_equal(chol[:, 1], 0.0)


def test_gradient_matches_finite_differences_of_the_plain_filter():
    """``jax.grad`` through the QR factorizations, against a central difference of the
    plain filter's log-likelihood along a random direction (symmetric for covariances)."""
    rng = np.random.default_rng(11)
    arrays = jax.tree.map(jnp.asarray, _random_model(rng, 3, 1, 0, NUM_T, False))
    y, mask, u = _random_data(rng, 1, 0, NUM_T)
    grad = jax.jit(jax.grad(lambda arr: sqrt_kalman_filter(arr, y, mask, u).marginal_log_lik))
    g = grad(arrays)
    direction = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape)), arrays)
    covs = ("initial_cov", "dynamics_cov", "emission_cov")
    direction = direction._replace(**{k: symmetrize(getattr(direction, k)) for k in covs})
    # cotangents of covariances are symmetric (the inputs are symmetrized)
    for k in covs:
        np.testing.assert_allclose(getattr(g, k), getattr(g, k).T, atol=1e-12)
    eps = 1e-5

    def at(sign):
        moved = jax.tree.map(lambda a, b: a + sign * eps * b, arrays, direction)
        return float(_plain(moved, y, mask, u).marginal_log_lik)

    fd = (at(1.0) - at(-1.0)) / (2 * eps)
    analytic = sum(float(jnp.vdot(a, b)) for a, b in zip(g, direction, strict=True))
    np.testing.assert_allclose(analytic, fd, rtol=1e-6)


def test_diffuse_initialization_is_not_implemented():
    rng = np.random.default_rng(0)
    arrays = _random_model(rng, 2, 1, 0, 4, False)._replace(initial_diffuse=np.eye(2)[:, :1])
    with pytest.raises(NotImplementedError, match="kalman_filter"):
        sqrt_kalman_filter(arrays, np.zeros((4, 1)), np.ones((4, 1), bool), np.zeros((4, 0)))


def _trend_model(num_t, obs_var, seed):
    """Local linear trend (level, slope), level observed with variance ``obs_var``,
    initial covariance ``1e6 I``; data simulated from the model."""
    rng = np.random.default_rng(seed)
    f = np.array([[1.0, 1.0], [0.0, 1.0]])
    h = np.array([[1.0, 0.0]])
    q_diag = np.array([1e-2, 1e-4])
    x = np.zeros(2)
    y = np.empty((num_t, 1))
    for t in range(num_t):
        y[t] = h @ x + np.sqrt(obs_var) * rng.normal(size=1)
        x = f @ x + np.sqrt(q_diag) * rng.normal(size=2)
    arrays = GaussianSSMArrays(
        np.zeros(2), 1e6 * np.eye(2), f, np.zeros((2, 0)), np.zeros(2), np.diag(q_diag), h,
        np.zeros((1, 0)), np.zeros(1), np.array([[obs_var]]), np.zeros((2, 0)),
    )
    return arrays, y, np.ones((num_t, 1), bool), np.zeros((num_t, 0))


def test_float32_stays_positive_definite_where_the_plain_filter_fails():
    """Very precise observations of a state with a huge prior spread, in float32.

    Local linear trend ``level_{t+1} = level_t + slope_t`` (noise variances 1e-2, 1e-4),
    the level observed with noise variance ``1e-4`` (sd 0.01), initial covariance
    ``1e6 I``, 100 steps. Already at step 0 the update ``P - P h h^T P / S`` must return a
    level variance of ``1e6 - 1e12 / (1e6 + 1e-4) ~ 1e-4`` from numbers of size ``1e6``;
    float32 (``eps * 1e6 ~ 0.06``) gives ``-0.125``. At step 1 (predicted covariance
    ``~1e6 [[2, 1], [1, 1]]``, level and slope strongly correlated) the filtered
    covariance comes out as ``diag(0, -0.125)`` (truth ``[[1e-4, 1e-4], [1e-4, 1.03e-2]]``),
    from step 2 on the innovation variances are negative, their Cholesky factors NaN,
    and so was the textbook filter's log-likelihood (float64 truth: 75.1179). The plain
    filter now forms the filtered covariance in Joseph form, a sum of PSD terms, so it
    stays finite, but float32 still costs it up to 90% error in some filtered standard
    deviations and 0.39 nats of log-likelihood. The square-root filter's
    factors stay lower triangular with a positive diagonal, its log-likelihood is 75.1179
    (error ~1e-5) and its filtered means and standard deviations (from 1e-2 to 1e3) are
    close to the float64 ones.
    """
    arrays, y, mask, u = _trend_model(100, 1e-4, seed=1)
    truth = _plain(jax.tree.map(jnp.asarray, arrays), y, mask, u)

    def f32(a):
        return jnp.asarray(a, jnp.float32)

    arrays32 = jax.tree.map(f32, arrays)
    args32 = (arrays32, f32(y), jnp.asarray(mask), f32(u))
    plain = _plain(*args32)
    fac = _factors(*args32)
    filtered_covs = fac.filtered_chols @ jnp.swapaxes(fac.filtered_chols, 1, 2)
    assert plain.marginal_log_lik.dtype == fac.marginal_log_lik.dtype == jnp.float32
    assert fac.filtered_chols.dtype == fac.filtered_means.dtype == jnp.float32

    # the plain filter loses accuracy: NaN, or wrong standard deviations and log-likelihood
    plain_ll = float(plain.marginal_log_lik)
    plain_sd = np.sqrt(np.abs(np.diagonal(np.asarray(plain.filtered_covs, np.float64),
                                          axis1=1, axis2=2)))
    true_sd = np.sqrt(np.diagonal(np.asarray(truth.filtered_covs), axis1=1, axis2=2))
    assert not np.isfinite(plain_ll) or abs(plain_ll - float(truth.marginal_log_lik)) > 0.1
    assert not np.all(np.isfinite(plain_sd)) or np.max(np.abs(plain_sd / true_sd - 1)) > 0.1

    # the square-root filter succeeds
    diag = np.diagonal(np.asarray(fac.filtered_chols), axis1=1, axis2=2)
    assert np.all(np.isfinite(diag)) and np.all(diag > 0)
    np.testing.assert_allclose(float(fac.marginal_log_lik), float(truth.marginal_log_lik),
                               atol=1e-3)
    np.testing.assert_allclose(fac.log_probs, truth.log_probs, atol=1e-3)
    np.testing.assert_allclose(fac.filtered_means, truth.filtered_means, rtol=1e-3, atol=1e-3)
    # filtered standard deviations to within 1% (they range from 1e-2 to 1e3)
    sd = np.sqrt(np.diagonal(np.asarray(truth.filtered_covs), axis1=1, axis2=2))
    sd32 = np.sqrt(np.diagonal(np.asarray(filtered_covs, np.float64), axis1=1, axis2=2))
    np.testing.assert_allclose(sd32, sd, rtol=1e-2)
