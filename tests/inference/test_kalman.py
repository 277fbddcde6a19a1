"""Kalman filter, smoother and sampler against exact references.

References: the dense joint Gaussian of all states and observations (conditioning by
brute force), statsmodels' exact diffuse filter, and the large-variance limit that
defines the diffuse likelihood.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import multivariate_normal

from statseq.inference.kalman import (
    GaussianSSMArrays,
    kalman_filter,
    kalman_smoother,
    sample_posterior,
)

T, N, D, M = 7, 3, 2, 1


def _pd(rng, k, scale=1.0):
    a = rng.normal(size=(k, k))
    return scale * (a @ a.T / k + 0.3 * np.eye(k))


def random_arrays(rng, *, time_varying=False, q=0, n=N, d=D, m=M, t=T):
    lead_f = (t - 1,) if time_varying else ()
    lead_h = (t,) if time_varying else ()

    def stack(f, lead):
        return np.stack([f() for _ in range(lead[0])]) if lead else f()

    diffuse = np.zeros((n, q))
    diffuse[:q, :q] = np.eye(q)
    init_cov = _pd(rng, n)
    if q:
        init_cov[:q, :] = 0.0
        init_cov[:, :q] = 0.0
    arr = GaussianSSMArrays(
        rng.normal(size=n), init_cov,
        stack(lambda: 0.6 * rng.normal(size=(n, n)) / np.sqrt(n), lead_f),
        stack(lambda: rng.normal(size=(n, m)), lead_f),
        stack(lambda: rng.normal(size=n), lead_f),
        stack(lambda: _pd(rng, n, 0.5), lead_f),
        stack(lambda: rng.normal(size=(d, n)), lead_h),
        stack(lambda: rng.normal(size=(d, m)), lead_h),
        stack(lambda: rng.normal(size=d), lead_h),
        stack(lambda: _pd(rng, d, 0.5), lead_h),
        diffuse,
    )
    return GaussianSSMArrays(*map(jnp.asarray, arr))


def dense_reference(arr, y, mask, u, kappa=0.0):
    """log p(y_obs), E[x | y_obs] and Cov[x | y_obs] from the joint Gaussian of all steps.

    ``kappa`` adds ``kappa * A A^T`` to the initial covariance (the diffuse directions).
    """
    arr = GaussianSSMArrays(*map(np.asarray, arr))
    t_len, n = y.shape[0], arr.initial_mean.shape[0]

    def at(leaf, base_nd, t):
        return leaf[min(t, leaf.shape[0] - 1)] if leaf.ndim > base_nd else leaf

    # x_t = c_t + sum_s Phi(t, s) e_s, with e_0 ~ N(0, P0) and e_s ~ N(0, Q_{s-1})
    p0 = arr.initial_cov + kappa * arr.initial_diffuse @ arr.initial_diffuse.T
    means = [arr.initial_mean]
    trans = []  # F_{t-1} for t >= 1
    noise = [p0]
    for t in range(1, t_len):
        f = at(arr.dynamics_weights, 2, t - 1)
        b_in = at(arr.dynamics_input_weights, 2, t - 1)
        b = at(arr.dynamics_bias, 1, t - 1)
        means.append(f @ means[-1] + b_in @ u[t] + b)
        trans.append(f)
        noise.append(at(arr.dynamics_cov, 2, t - 1))
    loading = np.zeros((t_len * n, t_len * n))
    for t in range(t_len):
        for s in range(t + 1):
            phi = np.eye(n)
            for k in range(s, t):
                phi = trans[k] @ phi
            loading[t * n:(t + 1) * n, s * n:(s + 1) * n] = phi
    big_noise = np.zeros((t_len * n, t_len * n))
    for s in range(t_len):
        big_noise[s * n:(s + 1) * n, s * n:(s + 1) * n] = noise[s]
    cov_x = loading @ big_noise @ loading.T
    mean_x = np.concatenate(means)
    h_big = np.zeros((t_len * D, t_len * n))
    r_big = np.zeros((t_len * D, t_len * D))
    mean_y = np.zeros(t_len * D)
    for t in range(t_len):
        h = at(arr.emission_weights, 2, t)
        h_big[t * D:(t + 1) * D, t * n:(t + 1) * n] = h
        r_big[t * D:(t + 1) * D, t * D:(t + 1) * D] = at(arr.emission_cov, 2, t)
        mean_y[t * D:(t + 1) * D] = (h @ means[t] + at(arr.emission_input_weights, 2, t) @ u[t]
                                     + at(arr.emission_bias, 1, t))
    cov_y = h_big @ cov_x @ h_big.T + r_big
    cross = cov_x @ h_big.T
    o = mask.reshape(-1)
    yo = y.reshape(-1)[o]
    log_lik = multivariate_normal(mean_y[o], cov_y[np.ix_(o, o)]).logpdf(yo)
    gain = np.linalg.solve(cov_y[np.ix_(o, o)], cross[:, o].T).T
    post_mean = mean_x + gain @ (yo - mean_y[o])
    post_cov = cov_x - gain @ cross[:, o].T
    return log_lik, post_mean.reshape(t_len, n), post_cov


def _data(rng, t=T, d=D, m=M, frac_missing=0.3):
    y = rng.normal(size=(t, d))
    mask = rng.random((t, d)) > frac_missing
    mask[2] = False  # a whole step missing
    u = rng.normal(size=(t, m))
    return y, mask, u


def _blocks(cov, t_len, n):
    covs = np.stack([cov[t * n:(t + 1) * n, t * n:(t + 1) * n] for t in range(t_len)])
    cross = np.stack([cov[(t + 1) * n:(t + 2) * n, t * n:(t + 1) * n] for t in range(t_len - 1)])
    return covs, cross


@pytest.mark.parametrize("time_varying", [False, True])
def test_filter_and_smoother_equal_dense_conditioning(time_varying):
    rng = np.random.default_rng(1 + time_varying)
    arr = random_arrays(rng, time_varying=time_varying)
    y, mask, u = _data(rng)
    ll, mean, cov = dense_reference(arr, y, mask, u)
    filt = jax.jit(kalman_filter)(arr, y, mask, u)
    smooth = jax.jit(kalman_smoother)(arr, y, mask, u)
    covs, cross = _blocks(cov, T, N)
    np.testing.assert_allclose(filt.marginal_log_lik, ll, rtol=1e-12)
    np.testing.assert_allclose(smooth.marginal_log_lik, ll, rtol=1e-12)
    np.testing.assert_allclose(smooth.smoothed_means, mean, atol=1e-10)
    np.testing.assert_allclose(smooth.smoothed_covs, covs, atol=1e-10)
    np.testing.assert_allclose(smooth.smoothed_cross_covs, cross, atol=1e-10)
    # the last filtered moments are the smoothed ones
    np.testing.assert_allclose(filt.filtered_means[-1], mean[-1], atol=1e-10)
    # per-step terms sum to the total and masked steps score 0
    assert filt.log_probs[2] == 0.0
    np.testing.assert_allclose(np.sum(filt.log_probs), ll, rtol=1e-12)


def test_filtered_moments_equal_dense_conditioning_on_the_past():
    rng = np.random.default_rng(3)
    arr = random_arrays(rng)
    y, mask, u = _data(rng)
    filt = jax.jit(kalman_filter)(arr, y, mask, u)
    for t in (0, 3, 5):
        past = mask.copy()
        past[t + 1:] = False
        _, mean, cov = dense_reference(arr, y, past, u)
        np.testing.assert_allclose(filt.filtered_means[t], mean[t], atol=1e-10)
        np.testing.assert_allclose(filt.filtered_covs[t], cov[t * N:(t + 1) * N, t * N:(t + 1) * N],
                                   atol=1e-10)


def test_diffuse_likelihood_is_the_large_variance_limit():
    """log L_d = lim_kappa (log L_kappa + q/2 log kappa), and the smoothed moments converge."""
    rng = np.random.default_rng(4)
    q = 2
    arr = random_arrays(rng, q=q)
    y, mask, u = _data(rng, frac_missing=0.1)
    res = jax.jit(kalman_smoother)(arr, y, mask, u)
    filt = jax.jit(kalman_filter)(arr, y, mask, u)
    np.testing.assert_allclose(filt.marginal_log_lik, res.marginal_log_lik, rtol=1e-12)
    np.testing.assert_allclose(np.sum(filt.log_probs), res.marginal_log_lik, rtol=1e-12)
    kappa = 1e7
    ll, mean, cov = dense_reference(arr, y, mask, u, kappa=kappa)
    # the correction is O(1 / kappa) relative to the data's information
    np.testing.assert_allclose(ll + 0.5 * q * np.log(kappa), res.marginal_log_lik, atol=1e-4)
    covs, cross = _blocks(cov, T, N)
    np.testing.assert_allclose(res.smoothed_means, mean, atol=1e-4)
    np.testing.assert_allclose(res.smoothed_covs, covs, atol=1e-4)
    np.testing.assert_allclose(res.smoothed_cross_covs, cross, atol=1e-4)


def test_diffuse_local_level_matches_statsmodels_exact_diffuse():
    sm = pytest.importorskip("statsmodels.api")
    import statseq as ss

    y = ss.datasets.load_nile().to_numpy().astype(float)
    y[[20, 21, 40, 60, 61]] = np.nan
    params = np.array([15099.0, 1469.1])
    ref = sm.tsa.UnobservedComponents(y, "llevel", use_exact_diffuse=True).smooth(params)
    one = np.ones((1, 1))
    arr = GaussianSSMArrays(*map(jnp.asarray, (
        np.zeros(1), np.zeros((1, 1)), one, np.zeros((1, 0)), np.zeros(1), params[1] * one,
        one, np.zeros((1, 0)), np.zeros(1), params[0] * one, one)))
    mask = ~np.isnan(y)[:, None]
    yy = np.nan_to_num(y)[:, None]
    u = np.zeros((len(y), 0))
    filt = jax.jit(kalman_filter)(arr, yy, mask, u)
    smooth = jax.jit(kalman_smoother)(arr, yy, mask, u)
    np.testing.assert_allclose(filt.marginal_log_lik, ref.llf, rtol=1e-12)
    np.testing.assert_allclose(filt.log_probs, ref.llf_obs, atol=1e-9)
    np.testing.assert_allclose(smooth.smoothed_means[:, 0], ref.smoothed_state[0], rtol=1e-10)
    np.testing.assert_allclose(smooth.smoothed_covs[:, 0, 0], ref.smoothed_state_cov[0, 0],
                               rtol=1e-9)
    # after the first observation the filtered law is proper and equal to statsmodels'
    np.testing.assert_allclose(filt.filtered_means[1:, 0], ref.filtered_state[0, 1:], rtol=1e-10)
    np.testing.assert_allclose(filt.filtered_covs[1:, 0, 0], ref.filtered_state_cov[0, 0, 1:],
                               rtol=1e-9)


# q = 2 (of n = 3 states diffuse): the smoother's program is the one of the large-variance
# test above (same shapes), so only the sampler compiles here (CI time)
@pytest.mark.parametrize("q", [0, 2])
def test_posterior_samples_have_the_smoothed_moments(q):
    rng = np.random.default_rng(5)
    arr = random_arrays(rng, q=q)
    y, mask, u = _data(rng)
    smooth = jax.jit(kalman_smoother)(arr, y, mask, u)
    draws = np.asarray(jax.jit(sample_posterior, static_argnums=5)(
        arr, y, mask, u, jax.random.key(0), 20000))
    sd = np.sqrt(np.diagonal(smooth.smoothed_covs, axis1=1, axis2=2))
    # Monte Carlo error of a mean of 20000 draws is sd / 141; allow 4.5 standard errors
    z = (draws.mean(0) - np.asarray(smooth.smoothed_means)) / (sd / np.sqrt(draws.shape[0]))
    assert np.max(np.abs(z)) < 4.5
    emp = np.einsum("sti,stj->tij", draws - draws.mean(0), draws - draws.mean(0)) / len(draws)
    np.testing.assert_allclose(emp, smooth.smoothed_covs, atol=0.05 * np.max(sd) ** 2)
    lag = np.einsum("sti,stj->tij", draws[:, 1:] - draws[:, 1:].mean(0),
                    draws[:, :-1] - draws[:, :-1].mean(0)) / len(draws)
    np.testing.assert_allclose(lag, smooth.smoothed_cross_covs, atol=0.05 * np.max(sd) ** 2)


def test_float32_runs_and_shapes():
    rng = np.random.default_rng(6)
    arr = jax.tree.map(lambda a: a.astype(jnp.float32), random_arrays(rng))
    y, mask, u = _data(rng)
    # jitted, as the models call it (one program: ~1 s of CPU against ~2 s op by op)
    res = jax.jit(kalman_smoother)(arr, y.astype(np.float32), mask, u.astype(np.float32))
    assert res.smoothed_means.dtype == jnp.float32
    assert res.smoothed_means.shape == (T, N)
    assert res.smoothed_cross_covs.shape == (T - 1, N, N)
    ll, _, _ = dense_reference(random_arrays(np.random.default_rng(6)), y, mask, u)
    np.testing.assert_allclose(float(res.marginal_log_lik), ll, rtol=1e-4)


def test_bad_shapes_are_reported():
    rng = np.random.default_rng(7)
    arr = random_arrays(rng)
    y, mask, u = _data(rng)
    with pytest.raises(ValueError, match="mask"):
        kalman_filter(arr, y, mask[:, :1], u)
    with pytest.raises(ValueError, match="inputs"):
        kalman_filter(arr, y, mask, u[:-1])
    with pytest.raises(ValueError, match="initial_diffuse"):
        kalman_filter(arr._replace(initial_diffuse=jnp.zeros((N + 1, 1))), y, mask, u)


# ---- steady-state smoother (time-invariant, complete data) ------------------------------
def _steady_case(q, m, t_len=100, seed=3):
    rng = np.random.default_rng(seed)
    arr = random_arrays(rng, q=q, n=2, d=2, m=m, t=t_len)
    y = jnp.asarray(rng.normal(size=(t_len, 2)))
    u = jnp.asarray(rng.normal(size=(t_len, m)))
    return arr, y, u


def _assert_same_smoother(got, ref, rtol):
    for name in ref._fields:
        a, b = np.asarray(getattr(got, name)), np.asarray(getattr(ref, name))
        scale = np.max(np.abs(b))
        assert np.max(np.abs(a - b)) <= rtol * scale, name


@pytest.mark.parametrize(("q", "m"), [(0, 1), (1, 0), (2, 1)])
def test_steady_state_smoother_equals_exact_smoother(q, m):
    """n = 2, D = 2 with and without inputs, proper and (partly or fully) diffuse starts:
    the fast path is taken (the covariances have converged) and agrees to ~1e-12."""
    from statseq.inference.kalman_steady import _steady_smoother_parts, steady_state_smoother

    arr, y, u = _steady_case(q, m)
    head = 32
    assert bool(jax.jit(_steady_smoother_parts, static_argnums=(1, 2))(arr, head, 1e-13)[-1])
    fast = jax.jit(steady_state_smoother, static_argnames="head")(arr, y, u, head=head)
    ref = jax.jit(kalman_smoother)(arr, y, jnp.ones(y.shape, bool), u)
    _assert_same_smoother(fast, ref, 1e-11)
    # and the fast path is not the exact one in disguise: it differs at rounding level
    assert not np.array_equal(np.asarray(fast.smoothed_means), np.asarray(ref.smoothed_means))


def test_steady_state_smoother_falls_back_when_short_or_not_converged():
    from statseq.inference.kalman_steady import steady_state_smoother

    # the (q, m) = (2, 1) case of the test above: its exact smoother's program is reused
    arr, y, u = _steady_case(2, 1)
    ref = jax.jit(kalman_smoother)(arr, y, jnp.ones(y.shape, bool), u)
    # ``tol`` only enters the traced convergence checks, so it is passed as a traced scalar:
    # the unconverged and the forced call below share one compiled program (CI time)
    fast = jax.jit(steady_state_smoother, static_argnames="head")
    short = fast(arr, y, u, head=50)  # T = 100 <= 2 head + 1: exact path
    # not converged after 8 steps (1e-13 is the float64 default tolerance)
    unconverged = fast(arr, y, u, head=8, tol=jnp.float64(1e-13))
    for got in (short, unconverged):
        _assert_same_smoother(got, ref, 1e-14)
    # the check matters: forcing the constant gain after 8 steps is visibly wrong
    forced = fast(arr, y, u, head=8, tol=jnp.float64(np.inf))
    assert np.max(np.abs(forced.smoothed_covs - ref.smoothed_covs)) > 1e-8


def test_steady_state_filter_equals_exact_filter():
    """Every moment of the steady-state filter (fully diffuse start, collapsed within the
    exact head, with inputs) equals the step-by-step filter to ~1e-11; the proper start is
    checked through `filter_states` in tests/models/test_lgssm.py."""
    from statseq.inference.kalman import kalman_filter
    from statseq.inference.kalman_steady import steady_state_filter

    # ``tol`` is traced (it only enters the convergence checks): the two head = 8 calls
    # below share one compiled program (CI time); 1e-13 is the float64 default
    fast = jax.jit(steady_state_filter, static_argnames="head")
    tol = jnp.float64(1e-13)
    exact = jax.jit(kalman_filter)
    for q in (2,):
        arr, y, u = _steady_case(q, 1)
        ref = exact(arr, y, jnp.ones(y.shape, bool), u)
        got = fast(arr, y, u, head=32, tol=tol)
        _assert_same_smoother(got, ref, 1e-11)
        assert not np.array_equal(np.asarray(got.filtered_means),
                                  np.asarray(ref.filtered_means))
    # not converged after 8 steps: the exact filter (forcing the gain would be wrong)
    _assert_same_smoother(fast(arr, y, u, head=8, tol=tol), ref, 1e-14)
    forced = fast(arr, y, u, head=8, tol=jnp.float64(np.inf))
    assert np.max(np.abs(forced.filtered_covs - ref.filtered_covs)) > 1e-8


@pytest.mark.parametrize("q", [0, 2])
def test_steady_state_log_probs_switches_as_soon_as_converged(q):
    """The exact head stops at the first 16-step boundary where the covariance has
    converged (well before ``head = 128`` here), and the log-densities from there on, by
    the constant-gain recursion started at that traced step, equal the exact filter's."""
    from statseq.inference.kalman import kalman_filter
    from statseq.inference.kalman_steady import _exact_until_steady, steady_state_log_probs

    arr, y, u = _steady_case(q, 1, t_len=300)
    _, k, _, steady, _, _ = jax.jit(
        lambda a, y, u: _exact_until_steady(a, y, u, 128, 1e-13, lambda r: r[0])
    )(arr, y, u)
    assert bool(steady) and int(k) % 16 == 0 and 16 <= int(k) < 128
    ref = jax.jit(kalman_filter)(arr, y, jnp.ones(y.shape, bool), u).log_probs
    got, final = jax.jit(steady_state_log_probs, static_argnames="head")(arr, y, u, head=128)
    np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-11)
    assert not np.array_equal(np.asarray(got[int(k):]), np.asarray(ref[int(k):]))
    np.testing.assert_array_equal(got[: int(k)], ref[: int(k)])  # the exact head itself
    assert int(final.t) == y.shape[0]


@pytest.mark.parametrize("q", [0, 1])
def test_steady_state_log_likelihood_gradient_equals_exact(q):
    """Reverse-mode gradients go through the early switch (fit_sgd, fit_lbfgs and NUTS
    differentiate it) and equal those of the exact filter."""
    from statseq.inference.kalman import kalman_filter
    from statseq.inference.kalman_steady import steady_state_log_probs

    arr, y, u = _steady_case(q, 1, t_len=300)

    def fast(scale):
        a = arr._replace(dynamics_cov=scale * arr.dynamics_cov)
        return jnp.sum(steady_state_log_probs(a, y, u, head=128)[0])

    def exact(scale):
        a = arr._replace(dynamics_cov=scale * arr.dynamics_cov)
        return kalman_filter(a, y, jnp.ones(y.shape, bool), u).marginal_log_lik

    g_fast, g_exact = jax.jit(jax.grad(fast))(1.3), jax.jit(jax.grad(exact))(1.3)
    np.testing.assert_allclose(g_fast, g_exact, rtol=1e-9)
