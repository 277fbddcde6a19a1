"""Missing lags inside the data, exact: the Gaussian-sum filter of the AR-HMM and the MS-AR.

References (independent of statseq's filter):

* full enumeration over regime paths ``z_0, ..., z_{T-1}``: given a path, the stacked
  ``y_{L:T}`` given the conditioned ``y_{0:L}`` is Gaussian (a linear recursion driven by
  the noise), so the observed entries have a dense Gaussian density (drop the rows and
  columns of the missing ones); the likelihood is the path-weighted sum;
* for long series, a forward recursion over the finite state that enumerates the regime
  sub-paths only across each gap (the same dense Gaussian integration), NumPy only;
* with one state, statseq's `AR` (a Kalman filter over its lag window, exact with gaps).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.models.hmm.autoregressive import ARHMMCarry, ARHMMEmissions

# ---- references ----------------------------------------------------------------------------


def _gauss_logpdf(x, mean, cov):
    """``log N(x; mean, cov)``; ``x`` is ``(n,)`` or ``(n, G)`` (G points, one result each)."""
    if x.shape[0] == 0:
        return 0.0
    chol = np.linalg.cholesky(cov)
    z = np.linalg.solve(chol, (x.T - mean).T)
    out = (-0.5 * (z * z).sum(0) - np.log(np.diag(chol)).sum()
           - 0.5 * x.shape[0] * np.log(2 * np.pi))
    return float(out) if x.ndim == 1 else out


def _path_loglik(path, y, mask, start, reg, last=None):
    """``log p(observed y_{start:T} | y_{<start} window, path)``, the window before
    ``start`` fully observed; ``reg(path, t) -> (W (D, L D), b (D,), S (D, D))``, the
    regression of ``y_t`` on its lags given the path. ``last`` (G,): values that replace
    the last observed entry (one log-likelihood each; the Gaussian's mean and covariance
    do not depend on the observed values after the window, so it is built once)."""
    num_steps, d = y.shape
    lag = reg(path, start)[0].shape[1] // d
    n = (num_steps - start) * d
    means = {t: y[t] for t in range(start - lag, start)}
    loads = {t: np.zeros((d, n)) for t in range(start - lag, start)}
    noise = np.zeros((n, n))
    for t in range(start, num_steps):
        w, b, s = reg(path, t)
        m, g = b.astype(float).copy(), np.zeros((d, n))
        for i in range(1, lag + 1):
            a_i = w[:, (i - 1) * d: i * d]
            m += a_i @ means[t - i]
            g += a_i @ loads[t - i]
        blk = slice((t - start) * d, (t - start + 1) * d)
        g[:, blk] += np.eye(d)
        noise[blk, blk] = s
        means[t], loads[t] = m, g
    mu = np.concatenate([means[t] for t in range(start, num_steps)])
    big = np.concatenate([loads[t] for t in range(start, num_steps)])
    cov = big @ noise @ big.T
    obs = mask[start:].reshape(-1)
    x = y[start:].reshape(-1)[obs]
    if last is not None:
        x = np.repeat(x[:, None], len(last), axis=1)
        x[-1] = last
    return _gauss_logpdf(x, mu[obs], cov[np.ix_(obs, obs)])


def enumerate_loglik(pi0, trans, reg, y, mask, lag, last=None):
    """Exact ``log p(observed y_{L:T} | y_{0:L})`` by enumerating every regime path
    (``last``: see `_path_loglik`; then one value per entry of ``last``)."""
    k = trans.shape[0]
    terms = []
    for path in itertools.product(range(k), repeat=y.shape[0]):
        lw = np.log(pi0[path[0]]) + sum(np.log(trans[path[t - 1], path[t]])
                                        for t in range(1, len(path)))
        if np.isfinite(lw):
            terms.append(lw + _path_loglik(path, y, mask, lag, reg, last))
    terms = np.asarray(terms)
    top = terms.max(0)
    out = top + np.log(np.exp(terms - top).sum(0))
    return float(out) if last is None else out


def segment_forward_loglik(pi0, trans, reg, y, mask, lag):
    """The same quantity by a forward recursion on ``p(z_t | y)`` that enumerates regime
    sub-paths across each stretch whose lag windows have missing entries."""
    num_steps, d = y.shape
    k = trans.shape[0]
    full = mask.all(-1)
    alpha = np.asarray(pi0, float)
    for _ in range(lag):  # the conditioned steps: the chain moves, nothing is scored
        alpha = alpha @ trans
    # alpha = p(z_L); from here on alpha is p(z_{t} | y_{<t}) before step t
    total, t = 0.0, lag
    while t < num_steps:
        window_ok = full[t - lag: t].all()
        if window_ok and full[t]:
            ll = np.array([_path_loglik({t: j}, y[: t + 1], mask[: t + 1], t, reg)
                           for j in range(k)])
            joint = alpha * np.exp(ll - ll.max())
            total += np.log(joint.sum()) + ll.max()
            alpha = (joint / joint.sum()) @ trans
            t += 1
            continue
        # a stretch [t, end): from the first missing step until L observed steps follow it
        end = t
        run = 0
        while end < num_steps and run < lag:
            run = run + 1 if full[end] else 0
            end += 1
        logs = np.full(k, -np.inf)
        terms = []
        for sub in itertools.product(range(k), repeat=end - t):
            lw = np.log(alpha[sub[0]]) + sum(np.log(trans[sub[i - 1], sub[i]])
                                             for i in range(1, len(sub)))
            path = dict(enumerate([0] * t)) | {t + i: s for i, s in enumerate(sub)}
            val = lw + _path_loglik(path, y[:end], mask[:end], t, reg)
            terms.append(val)
            logs[sub[-1]] = np.logaddexp(logs[sub[-1]], val)
        top = max(terms)
        total += top + np.log(np.sum(np.exp(np.asarray(terms) - top)))
        post = np.exp(logs - logs.max())
        alpha = (post / post.sum()) @ trans
        t = end
    return total


def arhmm_reference(model, params):
    em = params.emissions
    pi0 = np.asarray(model.initial_probs(params))
    trans = np.asarray(params.transitions)
    covs = np.asarray(model.state_covariances(em))
    w, b = np.asarray(em.weights), np.asarray(em.biases)
    return pi0, trans, lambda path, t: (w[path[t]], b[path[t]], covs[path[t]])


def random_arhmm(k, d, lag, seed):
    rng = np.random.default_rng(seed)
    model = ss.LinearAutoregressiveHMM(num_states=k, emission_dim=d, num_lags=lag,
                                       initial="free")
    trans = rng.dirichlet(np.ones(k) * 2, size=k) + 0.3 * np.eye(k)
    trans /= trans.sum(1, keepdims=True)
    weights = rng.uniform(-0.6, 0.6, size=(k, d, d * lag)) / lag
    roots = rng.normal(size=(k, d, d))
    covs = roots @ np.swapaxes(roots, 1, 2) * 0.3 + 0.2 * np.eye(d)
    params = ss.HMMParams(jnp.asarray(rng.dirichlet(np.ones(k))), jnp.asarray(trans),
                          ARHMMEmissions(jnp.asarray(weights),
                                         jnp.asarray(rng.normal(size=(k, d))),
                                         jnp.asarray(covs)))
    return model, params


# ---- (a) AR-HMM against enumeration over regime paths --------------------------------------

# (num_lags, emission_dim, missing entries (step, entry or None for the whole step))
CASES = [
    (1, 1, [(4, None), (5, None)]),                        # a gap in the middle
    (1, 1, [(1, None), (8, None)]),                        # at the start and before the end
    (2, 1, [(2, None), (5, None), (7, None)]),             # start, back to back (L = 2), end
    (2, 1, [(4, None), (5, None), (6, None)]),             # a gap of three
    (1, 2, [(3, 0), (5, None), (6, 1), (8, 0)]),           # partially missing entries
    (2, 2, [(2, 1), (4, None), (6, 0), (7, 1)]),           # partial, two lags
]


@pytest.mark.parametrize("lag,d,missing", CASES)
def test_arhmm_log_prob_with_gaps_equals_enumeration(lag, d, missing):
    num_steps = 10 if d == 1 else 9
    model, params = random_arhmm(2, d, lag, seed=lag * 10 + d)
    rng = np.random.default_rng(lag + 7 * d)
    y = rng.normal(size=(num_steps, d))
    mask = np.ones((num_steps, d), bool)
    for t, e in missing:
        mask[t, slice(None) if e is None else e] = False
    y_in = np.where(mask, y, 0.0)
    pi0, trans, reg = arhmm_reference(model, params)
    want = enumerate_loglik(pi0, trans, reg, y_in, mask, lag)
    assert abs(segment_forward_loglik(pi0, trans, reg, y_in, mask, lag) - want) < 1e-9
    got = float(ss.log_prob(model, params, y_in, mask=mask))
    assert abs(got - want) < 1e-9 * max(1.0, abs(want)), (got, want)
    res = ss.filter(model, params, y_in, mask=mask)
    assert abs(float(res.log_probs.sum()) - want) < 1e-9 * max(1.0, abs(want))
    assert float(res.log_prob) == pytest.approx(got, rel=1e-12)
    # the reference without any gap differs (the test would notice zeros read as values);
    # with no gap the forward recursion is the plain one (its fully observed steps are
    # checked against enumeration above), far cheaper than enumerating 2^T paths again
    assert abs(segment_forward_loglik(pi0, trans, reg, y, np.ones_like(mask), lag)
               - want) > 1e-3


def test_arhmm_batch_with_different_gaps_and_trailing_padding():
    model, params = random_arhmm(2, 1, 1, seed=3)
    rng = np.random.default_rng(4)
    y = rng.normal(size=(3, 9, 1))
    mask = np.ones((3, 9, 1), bool)
    mask[0, 3:5] = False        # a gap of two
    mask[1, 6] = False          # a gap of one
    mask[2, 7:] = False         # trailing padding only (the finite-state filter)
    y = np.where(mask, y, 0.0)
    got = np.asarray(ss.log_prob(model, params, y, mask=mask))
    pi0, trans, reg = arhmm_reference(model, params)
    want = [enumerate_loglik(pi0, trans, reg, y[i], mask[i], 1) for i in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-10)


# ---- (b) one state: the VAR with missing data (statseq's AR, a Kalman filter) ---------------

@pytest.mark.parametrize("lag,d", [(1, 1), (2, 2)])
def test_one_state_equals_var_kalman_with_gaps(lag, d):
    model, params = random_arhmm(1, d, lag, seed=20 + lag)
    rng = np.random.default_rng(5)
    num_steps = 40
    y = rng.normal(size=(num_steps, d))
    mask = np.ones((num_steps, d), bool)
    mask[6:9] = False                       # a gap of three
    mask[15, 0] = False                     # partial entries
    mask[16, -1] = False
    mask[30] = False
    em = params.emissions
    coeffs = jnp.stack([em.weights[0][:, i * d:(i + 1) * d] for i in range(lag)])
    ar = ss.AR(order=lag, emission_dim=d)
    ar_params = ss.ARParams(coeffs, em.biases[0], jnp.zeros((d, 0)), em.covs[0])
    want = float(ss.log_prob(ar, ar_params, y, mask=mask))
    got = float(ss.log_prob(model, params, y, mask=mask))
    assert got == pytest.approx(want, rel=1e-11, abs=1e-10)


# ---- (c) fully observed data: the finite-state filter, unchanged ---------------------------

def test_fully_observed_data_keep_the_finite_state_filter_bit_for_bit():
    model, params = random_arhmm(2, 2, 2, seed=9)
    y = np.random.default_rng(1).normal(size=(2, 12, 2))
    full = np.ones(y.shape, bool)
    assert model.for_mask(full) is model          # no gap: the same (unsized) model
    trailing = full.copy()
    trailing[:, -2:] = False                      # ragged padding needs no components
    assert model.for_mask(trailing) is model
    res = ss.filter(model, params, y)
    assert isinstance(res.final_carry, ARHMMCarry)
    # the finite-state step, scanned by hand (compiled separately: equal to rounding)
    carry0 = model.initial_carry(params)
    u = jnp.zeros((0,))

    def scan(ys):
        def body(c, yt):
            lp, c = model.step(params, c, yt, jnp.ones(2, bool), u)
            return c, lp
        return jax.lax.scan(body, carry0, ys)[1]

    by_hand = np.stack([np.asarray(scan(jnp.asarray(s))) for s in y])
    by_hand[:, :2] = 0.0
    np.testing.assert_allclose(np.asarray(res.log_probs), by_hand, rtol=1e-14, atol=0)
    pi0, trans, reg = arhmm_reference(model, params)
    want = enumerate_loglik(pi0, trans, reg, y[0, :8], full[0, :8], 2)
    assert float(ss.log_prob(model, params, y[0, :8])) == pytest.approx(want, rel=1e-11)


# ---- (d) refusals ------------------------------------------------------------------------

def test_refusals_name_the_gap_the_count_and_the_remedy():
    model, params = random_arhmm(2, 1, 1, seed=2)
    y = np.zeros((30, 1))
    mask = np.ones((30, 1), bool)
    mask[5:15] = False                       # 2^(10 + 1) = 2048 > 1024 components
    with pytest.raises(ValueError, match=r"gap of 10 step.*max_gap_components = 1024.*"
                                         r"2\^\(10 \+ 1\)"):
        ss.log_prob(model, params, y, mask=mask)
    wide = ss.LinearAutoregressiveHMM(num_states=2, emission_dim=1, num_lags=1,
                                      initial="free", max_gap_components=4096)
    assert np.isfinite(float(ss.log_prob(wide, params, y, mask=mask)))
    # a missing value that the likelihood conditions on
    first = np.ones((30, 1), bool)
    first[0] = False
    with pytest.raises(ValueError, match="first num_lags = 1 steps"):
        ss.log_prob(model, params, y, mask=first)
    # EM has no exact E-step with missing lags: it points to fit_lbfgs
    gap = np.ones((30, 1), bool)
    gap[10] = False
    with pytest.raises(ValueError, match="use fit_lbfgs"):
        ss.fit_em(model, params, y, mask=gap, num_iters=2, progress=False)
    with pytest.raises(ValueError, match="observed lags"):
        model.smoother(params, y, mask=gap)
    sized = model.for_mask(gap[None])
    assert sized.gap_capacity == 4            # K^(g + L) = 2^2
    with pytest.raises(ValueError, match="use fit_lbfgs"):
        sized.e_step(params, jnp.zeros((1, 30, 1)), jnp.ones((1, 30, 1), bool), None)


# ---- forecasts from data ending in a gap -----------------------------------------------------

def test_forecast_after_a_trailing_gap_samples_the_exact_mixture():
    model, params = random_arhmm(2, 1, 1, seed=11)
    rng = np.random.default_rng(2)
    y = rng.normal(size=(5, 1)) + 2.0
    mask = np.ones((5, 1), bool)
    mask[-2:] = False                         # the last two values are missing
    y = np.where(mask, y, 0.0)
    assert model.for_mask(mask[None], trailing=True).gap_capacity == 8   # 2^(2 + 1)
    fc = ss.forecast(model, params, y, mask=mask, num_steps=1, num_samples=40000,
                     key=jax.random.key(0))
    draws = np.asarray(fc.samples)[:, 0, 0]
    # the exact one-step predictive p(y_5 | y_{0:3}) on a grid: the enumerated likelihood
    # of the series extended by an observed y_5 = v, over that of the history
    pi0, trans, reg = arhmm_reference(model, params)
    grid = np.linspace(-10, 10, 401)
    ext_mask = np.concatenate([mask, [[True]]])
    base = enumerate_loglik(pi0, trans, reg, y[:3], mask[:3], 1)
    # (all grid values at once: each regime path's Gaussian is built once, not per value)
    dens = np.exp(enumerate_loglik(pi0, trans, reg, np.concatenate([y, [[0.0]]]), ext_mask, 1,
                                   last=grid) - base)
    assert dens.shape == grid.shape
    step = grid[1] - grid[0]
    assert abs(dens.sum() * step - 1.0) < 1e-6
    mean = float((grid * dens).sum() * step)
    var = float(((grid - mean) ** 2 * dens).sum() * step)
    # Monte Carlo: within 4 standard errors of the mean and of the variance
    assert abs(draws.mean() - mean) < 4 * np.sqrt(var / draws.size)
    assert abs(draws.var() - var) < 4 * var * np.sqrt(3.0 / draws.size)


# ---- (a) MS-AR in its forms against enumeration ------------------------------------------

def msar_reference(model, params):
    """Hamilton's equations directly: given the regime path, ``y_t`` regresses on its lags
    with intercept ``mu_{s_t} - sum_i phi_i mu_{s_{t-i}}`` (mean form) or ``c_{s_t}``."""
    k, p = model.num_regimes, model.order
    pi0 = np.asarray(model.initial_probs(params))
    trans = np.asarray(params.transitions)
    mu = np.broadcast_to(np.asarray(params.means), (k,))
    phi = np.asarray(params.ar_coeffs)
    phi = phi if model.switching_ar else np.broadcast_to(phi, (k, p))
    var = np.broadcast_to(np.asarray(params.variances), (k,))

    def reg(path, t):
        s = path[t]
        if model.form == "mean":
            b = mu[s] - sum(phi[s, i - 1] * mu[path[t - i]] for i in range(1, p + 1))
        else:
            b = mu[s]
        return phi[s][None, :], np.array([b]), np.array([[var[s]]])

    return pi0, trans, reg


MSAR_CASES = [
    dict(order=1, form="mean"),
    dict(order=2, form="mean", switching_variance=True),
    dict(order=1, form="intercept", switching_ar=True, initial="free"),
    dict(order=2, form="mean", switching_mean=False, switching_ar=True),
]


@pytest.mark.parametrize("config", MSAR_CASES)
def test_msar_log_prob_with_gaps_equals_enumeration(config):
    model = ss.MarkovSwitchingAR(num_regimes=2, **config)
    rng = np.random.default_rng(config["order"] + len(config))
    shapes = model.param_shapes()
    trans = np.array([[0.8, 0.2], [0.3, 0.7]])
    params = ss.MSARParams(
        None if shapes.initial_probs is None else jnp.array([0.35, 0.65]),
        jnp.asarray(trans), jnp.asarray(rng.normal(size=shapes.means)),
        jnp.asarray(rng.uniform(-0.5, 0.5, size=shapes.ar_coeffs) / model.order),
        jnp.asarray(rng.uniform(0.3, 1.0, size=shapes.variances)))
    y = rng.normal(size=9)
    mask = np.ones(9, bool)
    p = model.order
    mask[[p, p + 2, p + 3, 7]] = False          # at the start, a gap of two, near the end
    y = np.where(mask, y, 0.0)
    pi0, trans_np, reg = msar_reference(model, params)
    want = enumerate_loglik(pi0, trans_np, reg, y[:, None], mask[:, None], p)
    got = float(ss.log_prob(model, params, y, mask=mask))
    assert abs(got - want) < 1e-9 * max(1.0, abs(want)), (got, want)
    # the finite-state filter on fully observed data is unchanged and equal too
    full = float(ss.log_prob(model, params, np.where(mask, y, 0.3)))
    want_full = enumerate_loglik(pi0, trans_np, reg, np.where(mask, y, 0.3)[:, None],
                                 np.ones((9, 1), bool), p)
    assert full == pytest.approx(want_full, rel=1e-10)
    assert model.for_mask(np.ones((1, 9), bool)) is model
    with pytest.raises(ValueError, match="use fit_lbfgs"):
        ss.fit_em(model, params, y, mask=mask, num_iters=2, progress=False)


def test_msar_refuses_beyond_the_limit_and_conditioned_gaps():
    model = ss.MarkovSwitchingAR(num_regimes=2, order=1, max_gap_components=64)
    params = model.default_params()
    y = np.zeros(40)
    mask = np.ones(40, bool)
    mask[10:16] = False                     # M K^(g + p - 1) = 4 * 2^6 = 256 > 64
    with pytest.raises(ValueError, match=r"gap of 6 step.*max_gap_components = 64"):
        ss.log_prob(model, params, y, mask=mask)
    mask = np.ones(40, bool)
    mask[0] = False
    with pytest.raises(ValueError, match="first order = 1 steps"):
        ss.log_prob(model, params, y, mask=mask)


# ---- (e) fitting with gaps -----------------------------------------------------------------

def test_fit_lbfgs_with_gaps_recovers_parameters_and_the_exact_likelihood():
    model = ss.LinearAutoregressiveHMM(num_states=2, emission_dim=1, num_lags=1,
                                       initial="free")
    truth = ss.HMMParams(
        jnp.array([0.5, 0.5]), jnp.array([[0.95, 0.05], [0.1, 0.9]]),
        ARHMMEmissions(jnp.array([[[-0.5]], [[0.8]]]), jnp.array([[-1.0], [1.0]]),
                       jnp.array([[[0.5]], [[0.25]]])))
    y = np.asarray(ss.sample(model, truth, num_timesteps=300, key=jax.random.key(3)))
    mask = np.ones(y.shape, bool)
    for start, length in [(40, 2), (130, 1), (210, 2), (260, 1)]:
        mask[start: start + length] = False
    y = np.where(mask, y, 0.0)
    start = model.initialize(y, key=jax.random.key(0), mask=mask)
    fit = ss.fit_lbfgs(model, start, y, mask=mask, num_iters=200, tol=1e-7, progress=False)
    assert fit.converged
    em = fit.params.emissions
    order = np.argsort(np.asarray(em.biases[:, 0]))
    # about 100 and 200 scored steps per state: the standard errors of the coefficients and
    # intercepts are below 0.1, of the variances below 15 %, of the stay probabilities
    # below 0.03; about 4 standard errors allowed
    np.testing.assert_allclose(np.asarray(em.weights)[order, 0, 0], [-0.5, 0.8], atol=0.3)
    np.testing.assert_allclose(np.asarray(em.biases)[order, 0], [-1.0, 1.0], atol=0.4)
    np.testing.assert_allclose(np.asarray(em.covs)[order, 0, 0], [0.5, 0.25], rtol=0.6)
    np.testing.assert_allclose(np.diag(np.asarray(fit.params.transitions))[order],
                               [0.95, 0.9], atol=0.12)
    # the maximized objective is the exact likelihood (an independent forward recursion
    # that enumerates the state sub-paths across each gap)
    pi0, trans, reg = arhmm_reference(model, fit.params)
    want = segment_forward_loglik(pi0, trans, reg, y, mask, 1)
    final = fit.log_joint[np.isfinite(fit.log_joint)][-1]
    assert final == pytest.approx(want, rel=1e-9)
    assert float(ss.log_prob(model, fit.params, y, mask=mask)) == pytest.approx(want, rel=1e-10)


def test_fit_sgd_with_gaps_climbs_the_exact_likelihood():
    import optax

    model, params = random_arhmm(2, 1, 2, seed=5)
    y = np.random.default_rng(8).normal(size=(40, 1))
    mask = np.ones(y.shape, bool)
    mask[[10, 11, 25]] = False
    y = np.where(mask, y, 0.0)
    fit = ss.fit_sgd(model, params, y, mask=mask, optimizer=optax.adam(1e-2), num_steps=3,
                     key=jax.random.key(0), progress=False)
    pi0, trans, reg = arhmm_reference(model, params)
    # the first trace entry is the log-likelihood at the start: the exact one
    want = segment_forward_loglik(pi0, trans, reg, y, mask, 2)
    assert float(fit.log_joint[0]) == pytest.approx(want, rel=1e-10)
    assert float(fit.log_joint[-1]) > float(fit.log_joint[0])


@pytest.mark.parametrize("covariance", ["tied", "spherical"])
def test_arhmm_tied_and_spherical_noise_with_gaps_equal_enumeration(covariance):
    from statseq.models.hmm.autoregressive import (
        SphericalARHMMEmissions,
        TiedARHMMEmissions,
    )

    _, full = random_arhmm(2, 2, 1, seed=31)
    model = ss.LinearAutoregressiveHMM(num_states=2, emission_dim=2, num_lags=1,
                                       initial="free", covariance=covariance)
    em = full.emissions
    noise = (TiedARHMMEmissions(em.weights, em.biases, em.covs[0]) if covariance == "tied"
             else SphericalARHMMEmissions(em.weights, em.biases, jnp.array([0.4, 0.9])))
    params = full._replace(emissions=noise)
    y = np.random.default_rng(6).normal(size=(9, 2))
    mask = np.ones((9, 2), bool)
    mask[3, 1] = False
    mask[4] = False
    mask[7, 0] = False
    y = np.where(mask, y, 0.0)
    pi0, trans, reg = arhmm_reference(model, params)
    want = enumerate_loglik(pi0, trans, reg, y, mask, 1)
    assert float(ss.log_prob(model, params, y, mask=mask)) == pytest.approx(want, rel=1e-10)
