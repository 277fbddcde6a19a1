"""AR(p) / VAR(p) / ARX against statsmodels, dense Gaussian densities and analytic results."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.linalg
from scipy.stats import multivariate_normal, norm
from statsmodels.tsa.ar_model import AutoReg
from statsmodels.tsa.arima.model import ARIMA

import statseq as ss

# ---------------------------------------------------------------------------------------
# independent references (numpy / scipy only, no statseq code)


def yule_walker_autocov(phi, sigma2, num_lags):
    """Autocovariances gamma_0..gamma_{num_lags-1} of a stationary scalar AR(p).

    Solves gamma_k - sum_j phi_j gamma_{|k-j|} = sigma2 [k == 0] for k = 0..p, then
    extends with the recursion gamma_k = sum_j phi_j gamma_{k-j}.
    """
    p = len(phi)
    lhs = np.zeros((p + 1, p + 1))
    for k in range(p + 1):
        lhs[k, k] += 1.0
        for j in range(1, p + 1):
            lhs[k, abs(k - j)] -= phi[j - 1]
    rhs = np.zeros(p + 1)
    rhs[0] = sigma2
    gamma = list(np.linalg.solve(lhs, rhs))
    while len(gamma) < num_lags:
        k = len(gamma)
        gamma.append(sum(phi[j - 1] * gamma[k - j] for j in range(1, p + 1)))
    return np.array(gamma[:num_lags])


def conditional_dense(coeffs, intercept, sigma, y):
    """Mean and covariance of vec(y_{p+1:T}) given y_{1:p} for a VAR(p).

    Writes the recursion as B Y = b + E with B block unit-lower-triangular (-A_k on the
    k-th block subdiagonal) and E ~ N(0, I (x) Sigma), so Y ~ N(B^-1 b, B^-1 (I(x)S) B^-T).
    """
    p, d, _ = coeffs.shape
    n = y.shape[0] - p
    big_b = np.eye(n * d)
    b = np.tile(intercept, n).astype(float)
    for i in range(n):
        for k in range(1, p + 1):
            j = i - k
            if j >= 0:
                big_b[i * d:(i + 1) * d, j * d:(j + 1) * d] = -coeffs[k - 1]
            else:
                b[i * d:(i + 1) * d] += coeffs[k - 1] @ y[p + j]
    b_inv = np.linalg.inv(big_b)
    return b_inv @ b, b_inv @ np.kron(np.eye(n), sigma) @ b_inv.T


def observed_logpdf(y, mean, cov, mask):
    o = np.flatnonzero(mask)
    return multivariate_normal(mean[o], cov[np.ix_(o, o)]).logpdf(y[o])


def ols_loglik(design, target):
    beta, *_ = np.linalg.lstsq(design, target, rcond=None)
    resid = target - design @ beta
    n = target.shape[0]
    sigma2 = resid @ resid / n
    return beta, sigma2, -0.5 * n * (np.log(2 * np.pi * sigma2) + 1.0)


# ---------------------------------------------------------------------------------------
# conditional likelihood and least squares vs statsmodels AutoReg


@pytest.mark.parametrize("order", [1, 2, 3])
def test_conditional_ar_matches_autoreg(log_lynx, order):
    model = ss.AR(order=order)
    params = model.fit_least_squares(log_lynx)
    res = AutoReg(log_lynx, lags=order, trend="c").fit()
    np.testing.assert_allclose(float(params.intercept[0]), res.params[0], rtol=1e-8)
    np.testing.assert_allclose(np.asarray(params.coeffs)[:, 0, 0], res.params[1:], rtol=1e-8)
    np.testing.assert_allclose(float(params.cov[0, 0]), res.sigma2, rtol=1e-8)
    np.testing.assert_allclose(float(ss.log_prob(model, params, log_lynx)), res.llf, rtol=1e-8)


def test_conditional_log_probs_are_zero_on_the_first_p_steps(log_lynx):
    model = ss.AR(order=2)
    params = model.fit_least_squares(log_lynx)
    lps = np.asarray(ss.filter(model, params, log_lynx).log_probs)
    assert np.all(lps[:2] == 0.0) and np.all(lps[2:] != 0.0)
    # the third step is N(y_3; c + phi_1 y_2 + phi_2 y_1, sigma2)
    c, phi, s2 = float(params.intercept[0]), np.asarray(params.coeffs)[:, 0, 0], \
        float(params.cov[0, 0])
    pred = c + phi[0] * log_lynx[1] + phi[1] * log_lynx[0]
    np.testing.assert_allclose(lps[2], norm(pred, np.sqrt(s2)).logpdf(log_lynx[2]), rtol=1e-12)


# ---------------------------------------------------------------------------------------
# exact (stationary) likelihood vs statsmodels ARIMA and the dense Toeplitz density


def _ar2_lynx_params(log_lynx):
    params = ss.AR(order=2).fit_least_squares(log_lynx)
    phi = np.asarray(params.coeffs)[:, 0, 0]
    c, s2 = float(params.intercept[0]), float(params.cov[0, 0])
    return params, phi, c, s2


def test_stationary_ar2_matches_arima_and_dense_density(log_lynx):
    params, phi, c, s2 = _ar2_lynx_params(log_lynx)
    model = ss.AR(order=2, initial="stationary")
    got = float(ss.log_prob(model, params, log_lynx))
    mu = c / (1.0 - phi.sum())
    arima = ARIMA(log_lynx, order=(2, 0, 0), trend="c").loglike(np.array([mu, *phi, s2]))
    np.testing.assert_allclose(got, arima, rtol=1e-8)
    t = log_lynx.shape[0]
    cov = scipy.linalg.toeplitz(yule_walker_autocov(phi, s2, t))
    dense = multivariate_normal(np.full(t, mu), cov).logpdf(log_lynx)
    np.testing.assert_allclose(got, dense, rtol=1e-10)


# ---------------------------------------------------------------------------------------
# missing data vs dense Gaussian marginals

LYNX_MASKS = {
    "start": [0, 1],
    "scattered": [0, 5, 6, 7, 40, 113],
    "long_gap": list(range(50, 70)),
}


@pytest.mark.parametrize("missing", list(LYNX_MASKS.values()), ids=list(LYNX_MASKS))
def test_stationary_ar2_missing_equals_dense_marginal(log_lynx, missing):
    params, phi, c, s2 = _ar2_lynx_params(log_lynx)
    model = ss.AR(order=2, initial="stationary")
    t = log_lynx.shape[0]
    mask = np.ones(t, bool)
    mask[missing] = False
    y = log_lynx.copy()
    y[~mask] = np.nan
    got = float(ss.log_prob(model, params, y, mask=mask))
    cov = scipy.linalg.toeplitz(yule_walker_autocov(phi, s2, t))
    mu = c / (1.0 - phi.sum())
    np.testing.assert_allclose(got, observed_logpdf(log_lynx, np.full(t, mu), cov, mask),
                               rtol=1e-10)


def test_conditional_ar2_missing_equals_dense_marginal(log_lynx):
    params, phi, c, s2 = _ar2_lynx_params(log_lynx)
    model = ss.AR(order=2)
    mask = np.ones(log_lynx.shape[0], bool)
    mask[[2, 3, 30, 31, 32, 90, 113]] = False
    got = float(ss.log_prob(model, params, log_lynx, mask=mask))
    mean, cov = conditional_dense(phi.reshape(2, 1, 1), np.array([c]), np.array([[s2]]),
                                  log_lynx[:, None])
    np.testing.assert_allclose(got, observed_logpdf(log_lynx[2:], mean, cov, mask[2:]),
                               rtol=1e-10)


VAR_A = np.array([[0.5, 0.2], [-0.3, 0.4]])
VAR_C = np.array([0.3, -0.1])
VAR_SIGMA = np.array([[1.0, 0.3], [0.3, 0.5]])
VAR_T = 6


def _var_masks():
    masks = np.ones((5, VAR_T, 2), bool)
    masks[1, 0, 0] = False  # first step partially missing
    masks[2, 2, :] = False  # a whole step missing
    masks[2, 3, 1] = False
    masks[3, :, 1] = False  # one series never observed
    masks[4, [0, 2, 5], [1, 0, 0]] = False  # scattered, last step partial
    return masks


def test_stationary_var1_per_entry_mask_equals_dense_marginal():
    rng = np.random.default_rng(0)
    model = ss.AR(order=1, emission_dim=2, initial="stationary")
    params = ss.ARParams(
        coeffs=jnp.asarray(VAR_A[None]), intercept=jnp.asarray(VAR_C),
        input_weights=jnp.zeros((2, 0)), cov=jnp.asarray(VAR_SIGMA),
    )
    # dense covariance of vec(y_{1:T}): Cov(y_t, y_s) = A^{t-s} Gamma_0 for t >= s
    gamma0 = scipy.linalg.solve_discrete_lyapunov(VAR_A, VAR_SIGMA)
    cov = np.zeros((2 * VAR_T, 2 * VAR_T))
    for t in range(VAR_T):
        for s in range(t + 1):
            block = np.linalg.matrix_power(VAR_A, t - s) @ gamma0
            cov[2 * t:2 * t + 2, 2 * s:2 * s + 2] = block
            cov[2 * s:2 * s + 2, 2 * t:2 * t + 2] = block.T
    mu = np.linalg.solve(np.eye(2) - VAR_A, VAR_C)
    masks = _var_masks()
    ys = rng.normal(size=masks.shape) + mu
    got = np.asarray(ss.log_prob(model, params, np.where(masks, ys, np.nan), mask=masks))
    for y, mask, value in zip(ys, masks, got, strict=True):
        expected = observed_logpdf(y.ravel(), np.tile(mu, VAR_T), cov, mask.ravel())
        np.testing.assert_allclose(value, expected, rtol=1e-10)


def test_conditional_var2_per_entry_mask_equals_dense_marginal():
    rng = np.random.default_rng(1)
    model = ss.AR(order=2, emission_dim=2)
    coeffs = np.stack([VAR_A, np.array([[0.1, -0.2], [0.05, 0.15]])])
    params = ss.ARParams(
        coeffs=jnp.asarray(coeffs), intercept=jnp.asarray(VAR_C),
        input_weights=jnp.zeros((2, 0)), cov=jnp.asarray(VAR_SIGMA),
    )
    masks = _var_masks()
    masks[:, :2] = True  # conditional: the first p steps are conditioned on
    ys = rng.normal(size=masks.shape)
    got = np.asarray(ss.log_prob(model, params, ys, mask=masks))
    for y, mask, value in zip(ys, masks, got, strict=True):
        mean, cov = conditional_dense(coeffs, VAR_C, VAR_SIGMA, y)
        expected = observed_logpdf(y[2:].ravel(), mean, cov, mask[2:].ravel())
        np.testing.assert_allclose(value, expected, rtol=1e-10)


def test_least_squares_drops_incomplete_rows_and_pools_sequences(log_lynx):
    model = ss.AR(order=2)
    y = np.stack([log_lynx[:60], log_lynx[54:]])
    mask = np.ones_like(y, bool)
    mask[0, 30] = mask[1, 10] = False
    params = model.fit_least_squares(y, mask=mask)
    rows, targets = [], []
    for s in range(2):
        for t in range(2, 60):
            if mask[s, t] and mask[s, t - 1] and mask[s, t - 2]:
                rows.append([1.0, y[s, t - 1], y[s, t - 2]])
                targets.append(y[s, t])
    beta, sigma2, _ = ols_loglik(np.array(rows), np.array(targets))
    assert len(rows) == 2 * 58 - 6
    np.testing.assert_allclose(float(params.intercept[0]), beta[0], rtol=1e-10)
    np.testing.assert_allclose(np.asarray(params.coeffs)[:, 0, 0], beta[1:], rtol=1e-10)
    np.testing.assert_allclose(float(params.cov[0, 0]), sigma2, rtol=1e-10)


# ---------------------------------------------------------------------------------------
# ARX


def test_arx_matches_numpy_ols_and_autoreg_exog(log_lynx):
    rng = np.random.default_rng(5)
    u = rng.normal(size=log_lynx.shape[0])
    model = ss.AR(order=2, input_dim=1)
    params = model.fit_least_squares(log_lynx, inputs=u[:, None])
    design = np.column_stack([np.ones(112), log_lynx[1:-1], log_lynx[:-2], u[2:]])
    beta, sigma2, llf = ols_loglik(design, log_lynx[2:])
    np.testing.assert_allclose(
        [float(params.intercept[0]), *np.asarray(params.coeffs)[:, 0, 0],
         float(params.input_weights[0, 0])], beta, rtol=1e-8)
    np.testing.assert_allclose(float(params.cov[0, 0]), sigma2, rtol=1e-8)
    got = float(ss.log_prob(model, params, log_lynx, inputs=u[:, None]))
    np.testing.assert_allclose(got, llf, rtol=1e-8)
    res = AutoReg(log_lynx, lags=2, trend="c", exog=u).fit()
    np.testing.assert_allclose(got, res.llf, rtol=1e-8)
    np.testing.assert_allclose(res.params, beta, rtol=1e-8)


# ---------------------------------------------------------------------------------------
# gradient fitting reaches the closed-form optimum


def test_fit_sgd_reaches_least_squares(log_lynx):
    model = ss.AR(order=2)
    ls = model.fit_least_squares(log_lynx)
    target = float(ss.log_prob(model, ls, log_lynx))
    fit = ss.fit_sgd(
        model, model.default_params(), log_lynx,
        optimizer=optax.adam(optax.cosine_decay_schedule(0.05, 2000)),
        num_steps=2000, key=jax.random.key(0), progress=False,
    )
    got = float(ss.log_prob(model, fit.params, log_lynx))
    assert target - 1e-3 <= got <= target + 1e-9
    np.testing.assert_allclose(fit.final_log_joint, got, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(fit.params.coeffs), np.asarray(ls.coeffs), atol=1e-2)


# ---------------------------------------------------------------------------------------
# forecasts and sampling vs analytic Gaussian results

PHI, C, SIGMA2 = 0.7, 1.0, 0.25


def _ar1_params():
    return ss.ARParams(
        coeffs=jnp.array([[[PHI]]]), intercept=jnp.array([C]),
        input_weights=jnp.zeros((1, 0)), cov=jnp.array([[SIGMA2]]),
    )


def test_ar1_forecast_mean_and_interval_match_analytic(log_lynx):
    num_samples = 4000
    history = log_lynx  # same shape and model as the AutoReg test: no new filter compile
    fc = ss.forecast(ss.AR(order=1), _ar1_params(), history, num_steps=5,
                     num_samples=num_samples, key=jax.random.key(11))
    assert fc.samples.shape == (num_samples, 5)
    mu = C / (1 - PHI)
    lower, upper = (np.asarray(a) for a in fc.interval(0.9))
    mean = np.asarray(fc.mean())
    z = norm.ppf(0.95)
    for h in (1, 5):
        m_h = mu + PHI**h * (history[-1] - mu)
        sd_h = np.sqrt(SIGMA2 * (1 - PHI ** (2 * h)) / (1 - PHI**2))
        # mean: standard error sd / sqrt(N); quantile q: sqrt(q (1 - q) / N) / density
        se_mean = sd_h / np.sqrt(num_samples)
        se_q = np.sqrt(0.05 * 0.95 / num_samples) / (norm.pdf(z) / sd_h)
        assert abs(mean[h - 1] - m_h) < 4 * se_mean
        assert abs(lower[h - 1] - (m_h - z * sd_h)) < 4 * se_q
        assert abs(upper[h - 1] - (m_h + z * sd_h)) < 4 * se_q
    # paths are joint: Cov(y_{T+1}, y_{T+2}) = phi sigma2
    s = np.asarray(fc.samples)
    cov12 = np.cov(s[:, 0], s[:, 1])[0, 1]
    se_cov = np.sqrt(SIGMA2 * SIGMA2 * (1 + PHI**2) / num_samples)  # approx, bivariate normal
    assert abs(cov12 - PHI * SIGMA2) < 4 * se_cov


def test_long_ar1_sample_autocorrelation_matches_phi():
    t = 20000
    y = np.asarray(ss.sample(ss.AR(order=1, initial="stationary"), _ar1_params(),
                             num_timesteps=t, key=jax.random.key(3)))
    assert y.shape == (t,)
    d = y - y.mean()
    r1 = np.sum(d[1:] * d[:-1]) / np.sum(d * d)
    se = np.sqrt((1 - PHI**2) / t)  # Bartlett's formula for an AR(1)
    assert abs(r1 - PHI) < 4 * se
    # stationary mean and variance
    gamma0 = SIGMA2 / (1 - PHI**2)
    se_mean = np.sqrt(gamma0 * (1 + PHI) / (1 - PHI) / t)
    assert abs(y.mean() - C / (1 - PHI)) < 4 * se_mean
    assert abs(y.var() / gamma0 - 1) < 0.1


# ---------------------------------------------------------------------------------------
# input validation


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"order": 0}, ValueError, "order"),
        ({"order": 1.5}, TypeError, "order"),
        ({"order": True}, TypeError, "order"),
        ({"emission_dim": 0}, ValueError, "emission_dim"),
        ({"emission_dim": 2.0}, TypeError, "emission_dim"),
        ({"input_dim": -1}, ValueError, "input_dim"),
        ({"initial": "exact"}, ValueError, "initial"),
        ({"initial": "stationary", "input_dim": 1}, ValueError, "stationary"),
    ],
)
def test_invalid_configuration_raises(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ss.AR(**kwargs)


def test_conditional_rejects_missing_values_in_first_p_steps(log_lynx):
    model = ss.AR(order=2)
    params = model.default_params()
    mask = np.ones(log_lynx.shape[0], bool)
    mask[1] = False
    with pytest.raises(ValueError, match="first order=2"):
        ss.log_prob(model, params, log_lynx, mask=mask)
    with pytest.raises(ValueError, match="first order=2"):
        model.fit_least_squares(log_lynx, mask=mask)
    var = ss.AR(order=1, emission_dim=2)
    vmask = np.ones((4, 2), bool)
    vmask[0, 1] = False
    with pytest.raises(ValueError, match="first order=1"):
        ss.log_prob(var, var.default_params(), np.zeros((4, 2)), mask=vmask)


def test_least_squares_needs_enough_data():
    with pytest.raises(ValueError, match="more than order"):
        ss.AR(order=3).fit_least_squares(np.arange(3.0))
    with pytest.raises(ValueError, match="complete rows"):
        ss.AR(order=3).fit_least_squares(np.arange(6.0))


def test_forecast_rejects_history_shorter_than_order():
    """A conditional AR(p) forecast needs p observed lags: a shorter history must raise
    (the filter would otherwise treat the unobserved pre-sample lags as exact zeros)."""
    model = ss.AR(order=2)
    with pytest.raises(ValueError, match="at least"):
        ss.forecast(model, model.default_params(), np.array([3.0]), num_steps=2,
                    num_samples=3, key=jax.random.key(0))


# ---------------------------------------------------------------------------------------
# the complete-data fast path (no scan) against the generic filter


def _fast_vs_scan_cases():
    rng = np.random.default_rng(9)
    # hostile VAR(2): companion spectral radius ~0.99, nearly singular noise, large mean
    a1 = np.array([[0.9, 0.05], [0.0, 0.85]])
    a2 = np.array([[0.09, 0.0], [0.0, 0.1]])
    companion = np.block([[a1, a2], [np.eye(2), np.zeros((2, 2))]])
    radius = np.max(np.abs(np.linalg.eigvals(companion)))
    assert 0.98 < radius < 1.0
    hostile = ss.ARParams(
        coeffs=jnp.asarray(np.stack([a1, a2])), intercept=jnp.array([50.0, -20.0]),
        input_weights=jnp.zeros((2, 0)), cov=jnp.array([[1.0, 0.999], [0.999, 1.0]]),
    )
    ar3 = ss.ARParams(
        coeffs=jnp.array([[[0.5]], [[0.2]], [[-0.1]]]), intercept=jnp.array([1.0]),
        input_weights=jnp.zeros((1, 0)), cov=jnp.array([[0.5]]),
    )
    return {
        "conditional-arx-lynx": (ss.AR(order=2, input_dim=1), "lynx-arx", None),
        "stationary-var2-hostile": (ss.AR(order=2, emission_dim=2, initial="stationary"),
                                    hostile, rng.normal(size=(7, 2)) * 5 + [500.0, -200.0]),
        # fewer observations than lags: the window still holds unobserved pre-sample values
        "stationary-ar3-short": (ss.AR(order=3, initial="stationary"), ar3, np.array([2.0, 1.5])),
    }


FAST_CASES = _fast_vs_scan_cases()


@pytest.mark.parametrize("case", list(FAST_CASES))
def test_complete_data_fast_path_equals_filter(log_lynx, case):
    """Complete data takes AR.complete_data_log_probs; return_carries=True forces the
    generic scan. Both must give the same log-densities and the same final state (the
    state a forecast starts from)."""
    model, params, y = FAST_CASES[case]
    inputs = None
    if params == "lynx-arx":
        inputs = np.random.default_rng(5).normal(size=(log_lynx.shape[0], 1))
        params, y = model.fit_least_squares(log_lynx, inputs=inputs), log_lynx
    fast = ss.filter(model, params, y, inputs=inputs)
    scan = ss.filter(model, params, y, inputs=inputs, return_carries=True)
    np.testing.assert_allclose(np.asarray(fast.log_probs), np.asarray(scan.log_probs),
                               rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(float(fast.log_prob), float(scan.log_prob), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(fast.final_carry.mean),
                               np.asarray(scan.final_carry.mean), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.asarray(fast.final_carry.cov),
                               np.asarray(scan.final_carry.cov), rtol=1e-9, atol=1e-9)


def test_scalar_noise_factor_is_lapacks_bitwise():
    """A scalar series' inverse 1 x 1 noise factor and half log-determinant (`_noise_factor`:
    sqrt, a reciprocal and a log in one kernel) equal LAPACK's potrf / trsm and the log of
    its factor bitwise, NaN where the factorization
    fails (zero, negative, NaN variance), in float64 and float32; the log-likelihood's
    gradient through it matches the Cholesky route to rounding."""
    from statseq.models.autoregressive import _noise_factor

    def lapack(cov):
        chol = jnp.linalg.cholesky(cov)
        return (jax.scipy.linalg.solve_triangular(chol, jnp.eye(1, dtype=cov.dtype),
                                                  lower=True),
                jnp.sum(jnp.log(jnp.diagonal(chol))))

    values = [0.5, 1.0, 3.0, 1e-300, 2.5e-7, 7e300, 0.0, -1.0, np.nan, np.inf]
    values32 = [v for v in values if not 0 < abs(v) < 1e-40 and abs(v) < 1e38]
    for dtype, vals in ((np.float64, values), (np.float32, values32)):
        for var in vals:
            cov = jnp.full((1, 1), var, dtype)
            for got, want in zip(jax.jit(_noise_factor)(cov), jax.jit(lapack)(cov),
                                 strict=True):
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    y = np.random.default_rng(3).normal(size=40)
    model = ss.AR(order=2)
    params = model.fit_least_squares(y)._replace(cov=jnp.array([[0.7]]))

    def loglik(factor, p):
        chol_inv, half_logdet = factor(p.cov)
        z = (y[2:] - p.intercept[0] - p.coeffs[0, 0, 0] * y[1:-1]
             - p.coeffs[1, 0, 0] * y[:-2]) * chol_inv[0, 0]
        return -0.5 * jnp.sum(z**2) - (y.size - 2) * half_logdet

    for got, want in zip(jax.tree.leaves(jax.grad(lambda p: loglik(_noise_factor, p))(params)),
                         jax.tree.leaves(jax.grad(lambda p: loglik(lapack, p))(params)),
                         strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-13, atol=0)
    fast = jax.grad(lambda p: ss.log_prob(model, p, y))(params)
    scan = jax.grad(lambda p: ss.filter(model, p, y, return_carries=True).log_prob)(params)
    for got, want in zip(jax.tree.leaves(fast), jax.tree.leaves(scan), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-10)
