"""The square-root smoothers (sequential and parallel) with a singular predicted
covariance: an AR(2) in companion form, ``Q = diag(q, 0)``, observed without noise, so
``P_{t+1|t}`` has rank 1 at every step. Reference: dense Gaussian conditioning with
pseudo-inverses (`_dense_ssm`)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.inference import kalman, kalman_sqrt, kalman_sqrt_parallel

sys.path.insert(0, str(Path(__file__).parent))
from _dense_ssm import ar2_params, conditional_states  # noqa: E402


@pytest.fixture(scope="module")
def ar2_exact():
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None)
    p = ar2_params(model, r=0.0, q=0.7)
    y = np.random.default_rng(11).normal(size=15)
    return model, p, y


def test_the_predicted_covariances_are_singular(ar2_exact):
    model, p, y = ar2_exact
    pred = np.asarray(model.filter_states(p, y).predicted_covs)[1:]
    # x_t is observed exactly, so x_{t+1} = (phi1 x_t + phi2 x_{t-1} + w, x_t) has
    # Cov[second state | y_{<=t}] = 0
    np.testing.assert_allclose(pred[:, 1, :], 0.0, atol=1e-12)


@pytest.mark.parametrize("parallel", [False, True])
def test_square_root_smoother_matches_dense_conditioning(ar2_exact, parallel):
    model, p, y = ar2_exact
    want_m, want_c = conditional_states(p, y)
    got = model.smoother(p, y, square_root=True, parallel=parallel)
    np.testing.assert_allclose(np.asarray(got.smoothed_means), want_m, rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.asarray(got.smoothed_covs), want_c, rtol=0, atol=1e-9)
    # the lag-one covariances equal those of the covariance-form RTS smoother
    plain = model.smoother(p, y)
    np.testing.assert_allclose(np.asarray(got.smoothed_cross_covs),
                               np.asarray(plain.smoothed_cross_covs), rtol=0, atol=1e-9)


def test_the_gain_solves_its_equation_and_stays_finite_under_vmap(ar2_exact):
    """``J P_{t+1|t} = P_{t|t} F^T`` at every step, for the generalized-inverse gain."""
    _, p, y = ar2_exact
    arrays = kalman.GaussianSSMArrays(
        p.initial_mean, p.initial_cov, p.dynamics_weights, jnp.zeros((2, 0)), jnp.zeros(2),
        p.dynamics_cov, p.emission_weights, jnp.zeros((1, 0)), jnp.zeros(1), p.emission_cov,
        jnp.zeros((2, 0)))
    ys = jnp.stack([jnp.asarray(y), -jnp.asarray(y)])[..., None]
    args = (jnp.ones_like(ys, bool), jnp.zeros((2, len(y), 0)))
    for fn in (kalman_sqrt.sqrt_kalman_smoother,
               kalman_sqrt_parallel.parallel_sqrt_kalman_smoother):
        res = jax.jit(jax.vmap(fn, in_axes=(None, 0, 0, 0)))(arrays, ys, *args)
        assert np.all(np.isfinite(np.asarray(res.smoothed_covs)))
    filt = kalman_sqrt.sqrt_kalman_filter_factors(arrays, ys[0], args[0][0], args[1][0])
    f = np.asarray(p.dynamics_weights)
    gain_fn = jax.jit(kalman_sqrt.smoother_gain)  # compiled once for all steps
    for t in range(len(y) - 1):
        l_f, l_p = filt.filtered_chols[t], filt.predicted_chols[t + 1]
        gain = np.asarray(gain_fn(l_f, f @ l_f, l_p))
        p_f, p_p = np.asarray(l_f @ l_f.T), np.asarray(l_p @ l_p.T)
        np.testing.assert_allclose(gain @ p_p, p_f @ f.T, rtol=0, atol=1e-12)
