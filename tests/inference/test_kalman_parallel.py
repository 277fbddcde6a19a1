"""Parallel-in-time Kalman filter and smoother against their sequential twins.

`statseq.inference.kalman` is checked against statsmodels and dense Gaussians in its own
tests; here every output of `statseq.inference.kalman_parallel` must equal the sequential
one to ``1e-10`` relative to its scale, in float64, on hostile models: initial means of
order ``1e4`` far from the data, covariances with eigenvalues ``1e-8`` of the largest, a
singular ``Q``, time-varying matrices, inputs, missing steps and partially missing entries
(holding huge values), exact diffuse initialization, ``T = 10^4``.

Filter and smoother run in one program per implementation, and the models share shapes,
so that only a handful of programs compile (the file must stay fast on a 2-core CI box).
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from statseq.inference import kalman, kalman_parallel  # noqa: E402
from statseq.inference.kalman import GaussianSSMArrays  # noqa: E402

RTOL = 1e-10
T = 10_000  # one length for every model, so that each implementation compiles twice (q = 0, 2)
N, D, M = 3, 2, 2  # state, observation and input dimensions


def _both(filter_fn, smoother_fn):
    return jax.jit(lambda *args: (filter_fn(*args), smoother_fn(*args)))


SEQUENTIAL = _both(kalman.kalman_filter, kalman.kalman_smoother)
PARALLEL = _both(kalman_parallel.parallel_kalman_filter, kalman_parallel.parallel_kalman_smoother)


# ------------------------------------------------------------------------------------------
# models


def _psd(rng, eigenvalues):
    u, _ = np.linalg.qr(rng.normal(size=(len(eigenvalues),) * 2))
    return (u * np.asarray(eigenvalues)) @ u.T


def _masks(rng, num_timesteps, dim, garbage_y):
    mask = rng.random((num_timesteps, dim)) > 0.2  # partially observed steps
    mask[rng.random(num_timesteps) < 0.1] = False  # fully missing steps
    mask[:2] = True  # (the diffuse models are identified by step 1)
    return mask, np.where(mask, garbage_y, 1e6 * rng.normal(size=garbage_y.shape))


def hostile_model(rng, q=0, num_timesteps=T):
    """Random time-varying model: ``Q`` of rank 2 with one eigenvalue ``1e-8``, ``R`` and ``P``
    with an eigenvalue ``1e-8``, initial mean ``~1e4`` against data ``~1e2``, inputs."""
    t = num_timesteps
    f = rng.normal(size=(N, N))
    f = 0.97 * f / np.max(np.abs(np.linalg.eigvals(f)))
    q_cov = _psd(rng, [0.0, 1e-8, rng.uniform(0.5, 2.0)])
    r_cov = _psd(rng, [1e-8, rng.uniform(0.5, 2.0)])
    arrays = GaussianSSMArrays(
        initial_mean=1e4 * rng.normal(size=N),
        initial_cov=_psd(rng, [1e-8, 1.0, 2.0]),
        dynamics_weights=f + 0.05 * rng.normal(size=(t - 1, N, N)),
        dynamics_input_weights=rng.normal(size=(t - 1, N, M)),
        dynamics_bias=rng.normal(size=(t - 1, N)),
        dynamics_cov=q_cov * rng.uniform(0.5, 1.5, size=(t - 1, 1, 1)),
        emission_weights=rng.normal(size=(D, N)) + 0.05 * rng.normal(size=(t, D, N)),
        emission_input_weights=rng.normal(size=(t, D, M)),
        emission_bias=rng.normal(size=(t, D)),
        emission_cov=r_cov * rng.uniform(0.5, 1.5, size=(t, 1, 1)),
        initial_diffuse=rng.normal(size=(N, q)),
    )
    mask, y = _masks(rng, t, D, 100.0 + 3.0 * rng.normal(size=(t, D)))
    return _as_jax(arrays, y, mask, rng.normal(size=(t, M)))


def structural_model(rng, num_timesteps=T):
    """Local linear trend with a *fixed* level (zero level noise) plus an AR(1), seen through
    two series, level and slope exactly diffuse: ``Q`` singular, ``P_{t|t-1}`` singular in the
    ``kappa = 0`` part. Same shapes as `hostile_model` with ``q = 2``."""
    t, phi = num_timesteps, 0.8
    f = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, phi]])
    h = np.array([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    q_cov = np.diag([0.0, 0.01, 0.5])
    r_cov = np.diag([0.2, 1.0])
    x = np.array([100.0, 0.5, 0.0])
    states = []
    for _ in range(t):
        states.append(x)
        x = f @ x + np.sqrt(np.diag(q_cov)) * rng.normal(size=N)
    u = rng.normal(size=(t, M))
    d_in = np.array([[0.3, 0.0], [0.0, -0.2]])
    y = np.array(states) @ h.T + u @ d_in.T + rng.normal(size=(t, D)) * np.sqrt(np.diag(r_cov))
    arrays = GaussianSSMArrays(
        initial_mean=np.zeros(N),
        initial_cov=np.diag([0.0, 0.0, 0.5 / (1 - phi**2)]),
        dynamics_weights=np.broadcast_to(f, (t - 1, N, N)),
        dynamics_input_weights=np.zeros((t - 1, N, M)),
        dynamics_bias=np.zeros((t - 1, N)),
        dynamics_cov=np.broadcast_to(q_cov, (t - 1, N, N)),
        emission_weights=np.broadcast_to(h, (t, D, N)),
        emission_input_weights=np.broadcast_to(d_in, (t, D, M)),
        emission_bias=np.zeros((t, D)),
        emission_cov=np.broadcast_to(r_cov, (t, D, D)),
        initial_diffuse=np.eye(N)[:, :2],
    )
    mask, y = _masks(rng, t, D, y)
    return _as_jax(arrays, y, mask, u)


def local_linear_trend(rng, num_timesteps=T):
    """Fixed-matrix local linear trend with zero level noise (singular ``Q``) and a proper
    (vague, far off) prior."""
    slope = 0.01 * np.cumsum(rng.normal(size=num_timesteps))
    y = 50.0 + np.cumsum(slope) + rng.normal(size=num_timesteps)
    arrays = GaussianSSMArrays(
        initial_mean=np.array([1e4, -10.0]),
        initial_cov=np.diag([1e6, 1.0]),
        dynamics_weights=np.array([[1.0, 1.0], [0.0, 1.0]]),
        dynamics_input_weights=np.zeros((2, 0)),
        dynamics_bias=np.zeros(2),
        dynamics_cov=np.diag([0.0, 1e-4]),
        emission_weights=np.array([[1.0, 0.0]]),
        emission_input_weights=np.zeros((1, 0)),
        emission_bias=np.zeros(1),
        emission_cov=np.eye(1),
        initial_diffuse=np.zeros((2, 0)),
    )
    mask, y = _masks(rng, num_timesteps, 1, y[:, None])
    return _as_jax(arrays, y, mask, np.zeros((num_timesteps, 0)))


def _as_jax(arrays, y, mask, inputs):
    arrays = GaussianSSMArrays(*(jnp.asarray(np.asarray(a, dtype=float)) for a in arrays))
    return arrays, jnp.asarray(y), jnp.asarray(mask), jnp.asarray(inputs)


# ------------------------------------------------------------------------------------------
# comparisons


def assert_close(actual, expected, what, rtol=RTOL):
    """``max |actual - expected| <= rtol * max |expected|`` (relative to the array's scale)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, what
    assert np.all(np.isfinite(actual)), what
    scale = np.max(np.abs(expected), initial=0.0)
    err = np.max(np.abs(actual - expected), initial=0.0)
    assert err <= rtol * scale, f"{what}: error {err:.2e}, scale {scale:.2e}"


def assert_log_probs_close(actual, expected, scale, rtol=RTOL):
    """Per step, relative to ``scale`` (``(T,)``)."""
    err = np.abs(np.asarray(actual) - np.asarray(expected)) / scale
    assert np.max(err) <= rtol, f"log_probs: worst step {np.argmax(err)} error {np.max(err):.2e}"


def log_prob_scale(args, log_probs):
    """``max(1, |log p(y_t | y_{<t})|)``, and at step 0 with diffuse directions the size of the
    terms that cancel in the diffuse increment (the ``kappa = 0`` log-density: the data
    identify ``delta`` at step 0 in these models, and both implementations cancel the same
    large numbers there; later steps are plain predictive densities)."""
    arrays, y, mask, inputs = args
    scale = np.maximum(1.0, np.abs(np.asarray(log_probs)))
    if arrays.initial_diffuse.shape[1]:
        at0 = kalman.arrays_at(arrays, 0)
        kappa0 = kalman.innovation(at0, arrays.initial_mean, arrays.initial_cov, y[0], mask[0],
                                   inputs[0]).log_prob
        scale[0] = max(scale[0], abs(float(kappa0)))
    return scale


def check_against_sequential(args):
    seq_filt, seq_smooth = SEQUENTIAL(*args)
    par_filt, par_smooth = PARALLEL(*args)
    assert_close(par_filt.marginal_log_lik, seq_filt.marginal_log_lik, "filter log-lik")
    assert_log_probs_close(par_filt.log_probs, seq_filt.log_probs,
                           log_prob_scale(args, seq_filt.log_probs))
    # filtered moments from the step at which the data identify the diffuse directions
    # (before it the sequential filter reports the exact initial filter's a_t, P_star, this
    # one the moments given delta = 0); predicted ones from the step after
    done = np.asarray(kalman._scan_filter(*args, collapse=True)[1][4].collapsed)
    first = int(np.argmax(done))
    for name in ("predicted_means", "predicted_covs", "filtered_means", "filtered_covs"):
        start = first + 1 if name.startswith("predicted") and first else first
        assert_close(getattr(par_filt, name)[start:], getattr(seq_filt, name)[start:],
                     f"filter {name}")
    # the sequential smoother sums uncollapsed diffuse increments, which cancel large terms;
    # its filter's total is the accurate reference (both are the same number)
    assert_close(par_smooth.marginal_log_lik, seq_filt.marginal_log_lik, "smoother log-lik")
    for name in kalman.KalmanSmootherResult._fields[1:]:
        # smoothed covariances are P_{t|t} - (F P_{t|t})^T N_t (F P_{t|t}) (exact as R -> 0):
        # the scanned N_t enter without the damping the sequential recursion gives them; on
        # the vague-prior trend N_0 ~ 3e11 cancels to a slope variance 1e-3 and the parallel
        # value is 6e-10 off at t = 0 (the sequential one 1e-16, against the square-root
        # smoother)
        rtol = 1e-9 if name == "smoothed_covs" else RTOL
        assert_close(getattr(par_smooth, name), getattr(seq_smooth, name), f"smoother {name}",
                     rtol=rtol)
    return seq_filt, seq_smooth, par_filt, par_smooth


# ------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("seed", range(3))
def test_parallel_equals_sequential_on_hostile_models(seed):
    """``T = 10^4`` (dynamax's parallel filter deadlocks in XLA:CPU at this length)."""
    check_against_sequential(hostile_model(np.random.default_rng(seed), q=2))


def test_parallel_equals_sequential_with_proper_prior_and_fixed_matrices():
    """No diffuse directions, matrices fixed in time, ``n = 2``, no inputs, ``T = 10^4``."""
    check_against_sequential(local_linear_trend(np.random.default_rng(3)))


def test_structural_model_with_singular_dynamics_noise_and_diffuse_states():
    args = structural_model(np.random.default_rng(7))
    assert np.linalg.matrix_rank(np.asarray(args[0].dynamics_cov[0])) == 2
    seq_filt, _, _, par_smooth = check_against_sequential(args)
    # the data identify the diffuse level and slope at step 1: from then on the filtered
    # covariances are proper (finite, positive definite) and smoothing tightens them
    assert np.all(np.linalg.eigvalsh(np.asarray(seq_filt.filtered_covs[1:, :2, :2])) > 0)
    smoothed = np.diagonal(np.asarray(par_smooth.smoothed_covs[1:]), axis1=1, axis2=2)
    filtered = np.diagonal(np.asarray(par_smooth.filtered_covs[1:]), axis1=1, axis2=2)
    assert np.all(smoothed <= filtered + 1e-12)


def test_masked_entries_are_ignored_exactly():
    rng = np.random.default_rng(11)
    arrays, y, mask, inputs = hostile_model(rng, q=2)
    other_y = jnp.where(mask, y, -1e8 * rng.normal(size=y.shape))
    first, second = PARALLEL(arrays, y, mask, inputs), PARALLEL(arrays, other_y, mask, inputs)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
