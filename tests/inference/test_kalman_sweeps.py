"""The exact Kalman filter by sweeps over blocks (`statseq.inference.kalman_sweeps`) equals
the sequential filter: missing data, time-varying matrices, lengths that are not a
multiple of the block, a model that never forgets (sequential fallback), float32, vmap
over series, gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from statseq.inference import kalman_sweeps
from statseq.inference.kalman import GaussianSSMArrays, kalman_filter, kalman_log_prob

T = 2000  # 6 blocks of 384 steps, the last one padded
N, D, M = 3, 2, 1


def _arrays(rng, time_varying=False, t=T):
    """A detectable model (stable F, full-rank H): the filter forgets its start."""
    def pd(k, s):
        a = rng.normal(size=(k, k))
        return s * (a @ a.T / k + 0.3 * np.eye(k))

    f = 0.8 * np.linalg.qr(rng.normal(size=(N, N)))[0]
    h = rng.normal(size=(D, N))
    if time_varying:  # per-step F_t and H_t
        f = f * (1.0 + 0.1 * rng.uniform(size=(t - 1, 1, 1)))
        h = h + 0.2 * rng.normal(size=(t, D, N))
    return GaussianSSMArrays(*map(jnp.asarray, (
        rng.normal(size=N), pd(N, 2.0), f, rng.normal(size=(N, M)), rng.normal(size=N),
        pd(N, 0.5), h, rng.normal(size=(D, M)), rng.normal(size=D), pd(D, 0.5),
        np.zeros((N, 0)))))


def _data(rng, t=T):
    y = rng.normal(size=(t, D))
    mask = rng.random((t, D)) > 0.2
    mask[5:40] = False  # a stretch with nothing observed
    return jnp.asarray(y), jnp.asarray(mask), jnp.asarray(rng.normal(size=(t, M)))


_SWEPT = jax.jit(lambda *a: kalman_filter(*a, sweeps=True))
_SEQUENTIAL = jax.jit(lambda *a: kalman_filter(*a, sweeps=False))
_INFO = jax.jit(kalman_sweeps.sweep_info)


def _assert_equal(got, ref, rtol):
    for name, a, b in zip(ref._fields, got, ref, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, name
        scale = max(np.max(np.abs(b)), 1e-300)
        assert np.max(np.abs(a - b)) <= rtol * scale, (name, np.max(np.abs(a - b)) / scale)


@pytest.mark.parametrize("time_varying", [False, True])
def test_sweeps_equal_the_sequential_filter_and_converge_in_two_sweeps(time_varying):
    rng = np.random.default_rng(1 + time_varying)
    arr, data = _arrays(rng, time_varying), _data(rng)
    _assert_equal(_SWEPT(arr, *data), _SEQUENTIAL(arr, *data), 1e-12)
    info = _INFO(arr, *data)
    # the carries (mean, covariance) coalesce bit for bit within a block: two sweeps
    assert bool(info.converged) and int(info.sweeps) == 2


def test_a_filter_that_never_forgets_falls_back_to_the_sequential_scan():
    """F = I, nothing observed: the predicted covariance grows by Q every step, so the
    carries of two sweeps never coincide (4 sweeps make only the first 4 of the 6 blocks
    exact); the result is the sequential scan's."""
    rng = np.random.default_rng(3)
    arr = _arrays(rng)._replace(dynamics_weights=jnp.eye(N))
    y, mask, u = _data(rng)
    mask = jnp.zeros_like(mask)
    info = _INFO(arr, y, mask, u)
    assert not bool(info.converged) and int(info.sweeps) == 4
    _assert_equal(_SWEPT(arr, y, mask, u), _SEQUENTIAL(arr, y, mask, u), 1e-12)


def test_length_one():
    rng = np.random.default_rng(4)
    arr, data = _arrays(rng, t=1), _data(rng, 1)
    _assert_equal(_SWEPT(arr, *data), _SEQUENTIAL(arr, *data), 1e-12)


def test_float32():
    """float32 runs in float32 and stays within float32 rounding of the float64 filter
    (the arrays of the first test: its sequential program is reused)."""
    rng = np.random.default_rng(1)
    arr, (y, mask, u) = _arrays(rng), _data(rng)
    ref = _SEQUENTIAL(arr, y, mask, u)
    got = _SWEPT(jax.tree.map(lambda a: a.astype(jnp.float32), arr), y.astype(jnp.float32),
                 mask, u.astype(jnp.float32))
    assert got.filtered_covs.dtype == jnp.float32
    _assert_equal(got, ref, 1e-4)


def test_vmap_over_series_sweeps_them_together():
    rng = np.random.default_rng(6)
    arr = _arrays(rng)
    ys, masks, us = (jnp.stack(a) for a in zip(*[_data(rng) for _ in range(3)], strict=True))
    got = jax.jit(jax.vmap(lambda *a: kalman_filter(arr, *a, sweeps=True)))(ys, masks, us)
    for i in range(3):
        _assert_equal(jax.tree.map(lambda a, i=i: a[i], got),
                      _SEQUENTIAL(arr, ys[i], masks[i], us[i]), 1e-12)
    # a batch of models: the sequential scan, vmapped
    arrs = jax.tree.map(lambda a: jnp.stack([a, 1.1 * a]), arr)._replace(
        dynamics_cov=jnp.stack([arr.dynamics_cov] * 2),
        initial_cov=jnp.stack([arr.initial_cov] * 2),
        emission_cov=jnp.stack([arr.emission_cov] * 2))
    lps = jax.jit(jax.vmap(lambda a, *d: kalman_log_prob(a, *d, sweeps=True)))(
        arrs, ys[:2], masks[:2], us[:2])
    for i in range(2):
        ref = _SEQUENTIAL(jax.tree.map(lambda a, i=i: a[i], arrs), ys[i], masks[i], us[i])
        np.testing.assert_allclose(lps[i], ref.marginal_log_lik, rtol=1e-12)


def test_gradients_are_the_sequential_filters():
    rng = np.random.default_rng(7)
    arr, data = _arrays(rng, time_varying=True), _data(rng)

    def grad(sweeps):  # with respect to per-step F_t, H_t and the fixed Q, R
        def loss(leaves):
            a = arr._replace(**dict(zip(names, leaves, strict=True)))
            return kalman_log_prob(a, *data, sweeps=sweeps)

        return jax.jit(jax.grad(loss))([getattr(arr, k) for k in names])

    names = ("dynamics_weights", "dynamics_cov", "emission_weights", "emission_cov")

    got, ref = grad(True), grad(False)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        if not b.size:
            continue
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * np.max(np.abs(b)))


def test_default_choice():
    rng = np.random.default_rng(8)
    arr = _arrays(rng)
    long = kalman_sweeps.SWEEP_MIN_STEPS
    assert kalman_sweeps.use_sweeps(arr, long, "cpu")
    assert not kalman_sweeps.use_sweeps(arr, long - 1, "cpu")
    assert not kalman_sweeps.use_sweeps(arr, long, "gpu")
    diffuse = arr._replace(initial_diffuse=jnp.eye(N)[:, :1])
    assert not kalman_sweeps.use_sweeps(diffuse, long, "cpu")


def test_public_log_prob_of_several_series_runs_by_sweeps():
    """`LinearGaussianSSM.masked_data_filter` (the public ``log_prob`` with missing data)
    takes the sweeps from `SWEEP_MIN_STEPS` steps on CPU: the sequential filter's
    log-densities and final filtered moments."""
    import statseq as ss

    rng = np.random.default_rng(9)
    t = kalman_sweeps.SWEEP_MIN_STEPS
    arr = _arrays(rng, t=t)._replace(dynamics_input_weights=jnp.zeros((N, 0)),
                                      emission_input_weights=jnp.zeros((D, 0)))
    y, mask, _ = _data(rng, t)
    u = jnp.zeros((t, 0))
    model = ss.LinearGaussianSSM(state_dim=N, emission_dim=D)
    params = ss.LGSSMParams(*arr[:10])
    ref = jax.jit(lambda *a: kalman_filter(*a, sweeps=False))(arr, y, mask, u)
    lp, final = jax.jit(model.masked_data_filter(params, t))(y, mask, u)
    np.testing.assert_allclose(lp, ref.log_probs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(final.mean, ref.filtered_means[-1], rtol=1e-12)
    np.testing.assert_allclose(final.cov, ref.filtered_covs[-1], rtol=1e-12)
    assert int(final.t) == t
    np.testing.assert_allclose(ss.log_prob(model, params, y, mask=mask), ref.marginal_log_lik,
                               rtol=1e-12)
