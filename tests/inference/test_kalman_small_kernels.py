"""The element-wise small-dimension kernels of `statseq.inference.kalman` (issue 13.3).

Up to ``SMALL_DIM`` states / series the filter's matrix products, Cholesky factor and
triangular solves are written as element-wise jnp ops (so XLA:CPU fuses a step). These tests
check them against LAPACK/NumPy, check the whole filter and smoother against the generic
path (``SMALL_DIM = 0``: every product a ``dot``, LAPACK ``potrf``/``trsm``) and against
dense Gaussian conditioning of the stacked model, with missing entries (partial rows and
empty steps), time-varying matrices and inputs, and check that gradients are unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from statseq.inference import kalman
from statseq.inference.kalman import GaussianSSMArrays

RNG = np.random.default_rng(1311)


def _spd(dim, rng, scale=1.0):
    a = rng.standard_normal((dim, dim))
    return scale * (a @ a.T / dim + 0.3 * np.eye(dim))


@pytest.mark.parametrize("dim", [1, 2, 3, 5, 8])
def test_cholesky_and_forward_substitution_match_lapack(dim):
    s = _spd(dim, RNG)
    rhs = RNG.standard_normal((dim, 7))
    chol = np.asarray(kalman._cholesky(jnp.asarray(s)))
    np.testing.assert_allclose(chol, np.linalg.cholesky(s), rtol=1e-13, atol=1e-14)
    assert np.all(np.triu(chol, 1) == 0.0)
    sol = np.asarray(kalman._solve_lower(jnp.asarray(chol), jnp.asarray(rhs)))
    np.testing.assert_allclose(sol, np.linalg.solve(np.linalg.cholesky(s), rhs), rtol=1e-12,
                               atol=1e-13)


def test_cholesky_not_positive_definite_is_nan_like_lapack():
    s = jnp.asarray([[1.0, 2.0], [2.0, 1.0]])
    assert np.isnan(np.asarray(kalman._cholesky(s))[1, 1])
    assert np.isnan(np.asarray(jnp.linalg.cholesky(s))).any()


@pytest.mark.parametrize(("sa", "sb"), [((3, 4), (4,)), ((3, 4), (4, 2)), ((5, 3, 4), (5, 4, 2)),
                                        ((5, 3, 4), (4, 2)), ((2, 9), (9, 3)), ((4, 0), (0,))])
def test_small_product_matches_matmul(sa, sb):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    np.testing.assert_allclose(np.asarray(kalman._mm(jnp.asarray(a), jnp.asarray(b))), a @ b,
                               rtol=1e-13, atol=1e-14)


# ---- whole filter / smoother ------------------------------------------------------------
def _model(n, d, num_t, m_in, time_varying, rng):
    def tv(fn, k):
        return np.stack([fn() for _ in range(k)]) if time_varying else fn()

    f = tv(lambda: 0.6 * np.eye(n) + 0.15 * rng.standard_normal((n, n)), num_t - 1)
    arrays = GaussianSSMArrays(
        initial_mean=jnp.asarray(rng.standard_normal(n)),
        initial_cov=jnp.asarray(_spd(n, rng, 2.0)),
        dynamics_weights=jnp.asarray(f),
        dynamics_input_weights=jnp.asarray(tv(lambda: rng.standard_normal((n, m_in)), num_t - 1)),
        dynamics_bias=jnp.asarray(tv(lambda: 0.1 * rng.standard_normal(n), num_t - 1)),
        dynamics_cov=jnp.asarray(tv(lambda: _spd(n, rng, 0.5), num_t - 1)),
        emission_weights=jnp.asarray(tv(lambda: rng.standard_normal((d, n)), num_t)),
        emission_input_weights=jnp.asarray(tv(lambda: rng.standard_normal((d, m_in)), num_t)),
        emission_bias=jnp.asarray(tv(lambda: 0.1 * rng.standard_normal(d), num_t)),
        emission_cov=jnp.asarray(tv(lambda: _spd(d, rng, 0.4), num_t)),
        initial_diffuse=jnp.zeros((n, 0)),
    )
    y = rng.standard_normal((num_t, d))
    mask = rng.random((num_t, d)) > 0.3
    mask[2] = False  # an empty step
    mask[3, 0], mask[3, 1:] = True, False  # a partial row
    inputs = rng.standard_normal((num_t, m_in))
    return arrays, jnp.asarray(y), jnp.asarray(mask), jnp.asarray(inputs)


def _dense(arrays, y, mask, inputs):
    """Exact references by stacking ``(x_0..x_{T-1}, y_0..y_{T-1})`` into one Gaussian:
    log-likelihood of the observed entries, filtered means/covs (conditioning ``x_t`` on the
    observed ``y_{<=t}``), smoothed means/covs and lag-one cross-covariances."""
    a = jax.tree.map(np.asarray, arrays)
    y, mask, u = np.asarray(y), np.asarray(mask), np.asarray(inputs)
    num_t, d = y.shape
    n = a.initial_mean.shape[0]

    def at(leaf, base, t):
        return leaf[min(t, leaf.shape[0] - 1)] if leaf.ndim == base + 1 else leaf

    # x = c + G e with e the independent noises (e_0, w_0..w_{T-2}), all Gaussian
    # x_t = mean_t + sum_{s <= t} F_{t-1} ... F_s e_s, e_0 ~ N(0, P), e_{s+1} = w_s ~ N(0, Q_s)
    mx, noise_cov = [a.initial_mean], [a.initial_cov]
    for t in range(num_t - 1):
        ft = at(a.dynamics_weights, 2, t)
        mx.append(ft @ mx[-1] + at(a.dynamics_input_weights, 2, t) @ u[t + 1]
                  + at(a.dynamics_bias, 1, t))
        noise_cov.append(at(a.dynamics_cov, 2, t))
    big = np.zeros((num_t * n, num_t * n))
    for t in range(num_t):
        for s in range(t + 1):
            m = np.eye(n)
            for k in range(s, t):
                m = at(a.dynamics_weights, 2, k) @ m
            big[t * n:(t + 1) * n, s * n:(s + 1) * n] = m
    blocks = np.zeros((num_t * n, num_t * n))
    for s, c in enumerate(noise_cov):
        blocks[s * n:(s + 1) * n, s * n:(s + 1) * n] = c
    mean_x = np.concatenate(mx)
    cov_x = big @ blocks @ big.T
    hh = np.zeros((num_t * d, num_t * n))
    mean_y = np.zeros(num_t * d)
    rr = np.zeros((num_t * d, num_t * d))
    for t in range(num_t):
        ht = at(a.emission_weights, 2, t)
        hh[t * d:(t + 1) * d, t * n:(t + 1) * n] = ht
        mean_y[t * d:(t + 1) * d] = (ht @ mx[t] + at(a.emission_input_weights, 2, t) @ u[t]
                                     + at(a.emission_bias, 1, t))
        rr[t * d:(t + 1) * d, t * d:(t + 1) * d] = at(a.emission_cov, 2, t)
    cov_y = hh @ cov_x @ hh.T + rr
    cov_xy = cov_x @ hh.T
    obs = mask.reshape(-1)
    yo = y.reshape(-1)

    def condition(sel):
        s = cov_y[np.ix_(sel, sel)]
        gain = np.linalg.solve(s, cov_xy[:, sel].T).T
        return mean_x + gain @ (yo[sel] - mean_y[sel]), cov_x - gain @ cov_xy[:, sel].T

    res = {}
    so = cov_y[np.ix_(obs, obs)]
    r = yo[obs] - mean_y[obs]
    res["ll"] = -0.5 * (r @ np.linalg.solve(so, r) + np.linalg.slogdet(so)[1]
                        + obs.sum() * np.log(2 * np.pi))
    fm, fc = [], []
    for t in range(num_t):
        sel = obs & (np.arange(num_t * d) < (t + 1) * d)
        mt, ct = condition(sel)
        fm.append(mt[t * n:(t + 1) * n])
        fc.append(ct[t * n:(t + 1) * n, t * n:(t + 1) * n])
    res["filtered_means"], res["filtered_covs"] = np.stack(fm), np.stack(fc)
    ms, cs = condition(obs)
    res["smoothed_means"] = ms.reshape(num_t, n)
    res["smoothed_covs"] = np.stack([cs[t * n:(t + 1) * n, t * n:(t + 1) * n]
                                     for t in range(num_t)])
    res["smoothed_cross_covs"] = np.stack([cs[(t + 1) * n:(t + 2) * n, t * n:(t + 1) * n]
                                           for t in range(num_t - 1)])
    return res


def _generic(fn, *args, monkeypatch):
    with monkeypatch.context() as mp:
        mp.setattr(kalman, "SMALL_DIM", 0)
        return jax.jit(lambda *a: fn(*a))(*args)  # a new function: traced afresh


@pytest.mark.parametrize(("n", "d", "m_in", "time_varying"),
                         [(4, 2, 1, False), (3, 1, 2, True), (1, 1, 0, False), (2, 3, 2, True)])
def test_filter_and_smoother_match_dense_conditioning_and_generic_path(n, d, m_in, time_varying,
                                                                       monkeypatch):
    num_t = 9
    args = _model(n, d, num_t, m_in, time_varying, np.random.default_rng([n, d, m_in]))
    ref = _dense(*args)
    filt = jax.jit(kalman.kalman_filter)(*args)
    smooth = jax.jit(kalman.kalman_smoother)(*args)
    ll = jax.jit(kalman.kalman_log_prob)(*args)
    np.testing.assert_allclose(ll, ref["ll"], rtol=1e-11)
    np.testing.assert_allclose(filt.marginal_log_lik, ref["ll"], rtol=1e-11)
    np.testing.assert_allclose(smooth.marginal_log_lik, ref["ll"], rtol=1e-11)
    for name in ("filtered_means", "filtered_covs"):
        np.testing.assert_allclose(getattr(filt, name), ref[name], rtol=1e-9, atol=1e-10)
    for name in ("smoothed_means", "smoothed_covs", "smoothed_cross_covs"):
        np.testing.assert_allclose(getattr(smooth, name), ref[name], rtol=1e-9, atol=1e-10)
    # the generic path (every product a dot, LAPACK potrf / trsm): equal to rounding
    gen_f = _generic(kalman.kalman_filter, *args, monkeypatch=monkeypatch)
    gen_s = _generic(kalman.kalman_smoother, *args, monkeypatch=monkeypatch)
    for got, want in ((filt, gen_f), (smooth, gen_s)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)


def test_gradients_equal_generic_path(monkeypatch):
    arrays, y, mask, inputs = _model(4, 2, 10, 1, False, np.random.default_rng(7))

    def loss(a):
        return kalman.kalman_log_prob(a, y, mask, inputs)

    def loss_s(a):
        return jnp.sum(kalman.kalman_smoother(a, y, mask, inputs).smoothed_means ** 2)

    for fn in (loss, loss_s):
        g_small = jax.jit(jax.grad(fn))(arrays)
        g_gen = _generic(jax.grad(fn), arrays, monkeypatch=monkeypatch)
        for a, b in zip(jax.tree.leaves(g_small), jax.tree.leaves(g_gen), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-11)


def test_step_is_fused_without_lapack_calls():
    """The point of the kernels: no LAPACK custom call and no dot left in a small step."""
    arrays, y, mask, inputs = _model(4, 2, 6, 0, False, np.random.default_rng(3))
    hlo = jax.jit(kalman.kalman_log_prob).lower(arrays, y, mask, inputs).as_text()
    assert "lapack" not in hlo and "dot_general" not in hlo
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kalman, "SMALL_DIM", 0)
        generic = jax.jit(lambda *a: kalman.kalman_log_prob(*a)).lower(
            arrays, y, mask, inputs).as_text()
    assert "lapack" in generic and "dot_general" in generic


# ---- the scalar-observation scan (D = 1) -------------------------------------------------
def _general(fn, *args):
    """``fn`` traced with the scalar-observation scan switched off (the general step)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kalman, "_univariate_fast", lambda *a: False)
        return jax.jit(lambda *a: fn(*a))(*args)  # a new function: traced afresh


def _assert_filters_equal(got, want, rtol=1e-12, atol=1e-13):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def univariate_case():
    """A time-varying model with one series and inputs; an empty step (``t = 2``),
    ``t = 3`` and the last step missing, about 30 % missing besides."""
    arrays, y, mask, inputs = _model(3, 1, 7, 2, True, np.random.default_rng(2711))
    return arrays, y, mask.at[-1].set(False), inputs


def test_univariate_scan_is_taken_on_cpu_and_fused(univariate_case):
    arrays, y, mask, inputs = univariate_case
    assert kalman._univariate_fast(arrays, 1)  # the tests run on CPU
    assert not kalman._univariate_fast(arrays, 2)  # two series
    assert not kalman._univariate_fast(arrays._replace(initial_diffuse=jnp.zeros((3, 1))), 1)
    hlo = jax.jit(kalman.kalman_log_prob).lower(*univariate_case).as_text()
    assert "lapack" not in hlo and "dot_general" not in hlo and "sqrt" not in hlo


def test_univariate_scan_equals_general_step_with_gradients(univariate_case):
    """The log-likelihood's gradient (every matrix, time-varying, with inputs and missing
    steps) equals the general step's to rounding (the filter itself: the dense-conditioning
    test above, case ``(3, 1, 2, True)``)."""
    arrays, y, mask, inputs = univariate_case
    filt = jax.jit(kalman.kalman_filter)(*univariate_case)
    # a missing step's filtered moments are its predicted ones, exactly
    np.testing.assert_array_equal(filt.filtered_covs[2], filt.predicted_covs[2])
    np.testing.assert_array_equal(filt.filtered_means[2], filt.predicted_means[2])
    assert float(filt.log_probs[2]) == 0.0

    def loss(a, y):
        return kalman.kalman_log_prob(a, y, mask, inputs)

    g_new = jax.jit(jax.grad(loss, argnums=(0, 1)))(arrays, y)
    g_old = _general(jax.grad(loss, argnums=(0, 1)), arrays, y)
    for a, b in zip(jax.tree.leaves(g_new), jax.tree.leaves(g_old), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert float(jnp.max(jnp.abs(g_new[1][~np.asarray(mask)]))) == 0.0  # missing y: no gradient


@pytest.mark.parametrize("case", ["length1", "all_missing", "float32", "batch"])
def test_univariate_scan_edge_cases(case, univariate_case):
    arrays, y, mask, inputs = univariate_case
    if case == "length1":  # T = 1 (one dynamics entry: the general step indexes t - 1)
        arrays = arrays._replace(**{k: getattr(arrays, k)[:1] for k in arrays._fields[2:10]})
        args = (arrays, y[:1], jnp.ones((1, 1), bool), inputs[:1])
        # and with the empty dynamics axis of T = 1 (the general step fails on it)
        empty = arrays._replace(**{k: getattr(arrays, k)[:0] for k in arrays._fields[2:6]})
        for g, w in zip(jax.jit(kalman.kalman_filter)(empty, *args[1:]),
                        jax.jit(kalman.kalman_filter)(*args), strict=True):
            np.testing.assert_array_equal(g, w)  # T = 1 uses no dynamics
    elif case == "all_missing":
        args = (arrays, y, jnp.zeros_like(mask), inputs)
    elif case == "float32":
        args = (jax.tree.map(lambda a: a.astype(jnp.float32), arrays), y.astype(jnp.float32),
                mask, inputs.astype(jnp.float32))
    else:  # a batch (vmapped) against one sequence at a time
        ys = jnp.stack([y, -2.0 * y])
        got = jax.jit(jax.vmap(kalman.kalman_log_prob, (None, 0, None, None)))(
            arrays, ys, mask, inputs)
        want = _general(jax.vmap(lambda a, yy, m, u: kalman.kalman_log_prob(a, yy, m, u),
                                 (None, 0, None, None)), arrays, ys, mask, inputs)
        np.testing.assert_allclose(
            want[0], _general(kalman.kalman_log_prob, arrays, y, mask, inputs), rtol=1e-12)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        return
    got = jax.jit(kalman.kalman_filter)(*args)
    want = _general(kalman.kalman_filter, *args)
    tol = dict(rtol=2e-5, atol=1e-5) if case == "float32" else {}
    _assert_filters_equal(got, want, **tol)
    if case != "float32":
        np.testing.assert_allclose(jax.jit(kalman.kalman_log_prob)(*args),
                                   want.marginal_log_lik, rtol=1e-12, atol=1e-13)
    if case == "float32":
        assert got.filtered_covs.dtype == jnp.float32
    if case == "all_missing":
        assert float(got.marginal_log_lik) == 0.0
        np.testing.assert_array_equal(got.filtered_covs, got.predicted_covs)


@pytest.mark.parametrize("varying", ["emission_weights", "every_matrix"])
def test_univariate_scan_matches_statsmodels_with_missing_data(varying):
    """A dynamic regression ``y_t = z_t^T beta_t + v_t`` (per-step ``H_t``), 20 % missing:
    log-likelihood, per-step log-densities and filtered moments equal statsmodels'. With
    ``every_matrix`` also ``F_t, b_t, Q_t, d_t, R_t`` vary per step (the public
    `TimeVaryingLinearGaussianSSM` path, whose scan carries those rows): the public
    ``log_prob``, ``filter`` and the core filter against statsmodels."""
    sm = pytest.importorskip("statsmodels.tsa.statespace.mlemodel")
    import statseq as ss

    rng = np.random.default_rng(1327)
    num_t, n = 40, 3
    h = rng.standard_normal((num_t, 1, n))
    q, r = 0.05 * np.eye(n) + 0.01, np.array([[0.7]])
    y = np.einsum("tdn,tn->td", h, np.cumsum(rng.standard_normal((num_t, n)), 0))
    y = y + rng.standard_normal((num_t, 1))
    mask = rng.random((num_t, 1)) > 0.2
    f, b, d = np.eye(n), np.zeros((num_t, n)), np.zeros((num_t, 1))
    if varying == "every_matrix":  # statsmodels' entry t maps a_t to a_{t+1}, as ours
        f = np.eye(n) + 0.05 * rng.standard_normal((num_t, n, n))
        q = q * (1.0 + 0.5 * rng.random((num_t, 1, 1)))
        r = r * (1.0 + rng.random((num_t, 1, 1)))
        b, d = 0.1 * rng.standard_normal((num_t, n)), rng.standard_normal((num_t, 1))
    tv = (lambda a: np.moveaxis(a, 0, -1)) if varying == "every_matrix" else (lambda a: a)
    mod = sm.MLEModel(np.where(mask, y, np.nan), k_states=n)
    mod["design"], mod["obs_cov"] = h.transpose(1, 2, 0), tv(r)
    mod["transition"], mod["selection"], mod["state_cov"] = tv(f), np.eye(n), tv(q)
    mod["state_intercept"], mod["obs_intercept"] = b.T, d.T
    mod.ssm.initialize_known(np.zeros(n), 4.0 * np.eye(n))
    res = mod.ssm.filter()
    z = jnp.zeros
    y0, m = jnp.asarray(np.where(mask, y, 0.0)), jnp.asarray(mask)
    if varying == "every_matrix":
        model = ss.TimeVaryingLinearGaussianSSM(state_dim=n, emission_dim=1,
                                                num_timesteps=num_t)
        params = ss.LGSSMParams(z(n), 4.0 * jnp.eye(n), jnp.asarray(f[:-1]),
                                z((num_t - 1, n, 0)), jnp.asarray(b[:-1]), jnp.asarray(q[:-1]),
                                jnp.asarray(h), z((num_t, 1, 0)), jnp.asarray(d),
                                jnp.asarray(r))
        np.testing.assert_allclose(ss.log_prob(model, params, y0, mask=m), res.llf,
                                   rtol=1e-12)
        np.testing.assert_allclose(ss.filter(model, params, y0, mask=m).log_probs,
                                   res.llf_obs, rtol=1e-11, atol=1e-12)
        arrays = model.to_arrays(params)
        # the public call's gradient (a batch of one: the unbatched path) equals the core
        # scan's (which equals the general step's: the gradient test above)
        g_pub = jax.grad(lambda p: ss.log_prob(model, p, y0, mask=m))(params)
        g_core = jax.jit(jax.grad(kalman.kalman_log_prob))(arrays, y0, m, z((num_t, 0)))
        for a, c in zip(jax.tree.leaves(g_pub), jax.tree.leaves(tuple(g_core[:10])),
                        strict=True):
            np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12)
    else:
        arrays = GaussianSSMArrays(z(n), 4.0 * jnp.eye(n), jnp.eye(n), z((n, 0)), z(n),
                                   jnp.asarray(q), jnp.asarray(h), z((1, 0)), z(1),
                                   jnp.asarray(r), z((n, 0)))
    got = jax.jit(kalman.kalman_filter)(arrays, y0, m, z((num_t, 0)))
    np.testing.assert_allclose(got.marginal_log_lik, res.llf, rtol=1e-12)
    np.testing.assert_allclose(got.log_probs, res.llf_obs, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(got.filtered_means, res.filtered_state.T, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got.filtered_covs, res.filtered_state_cov.transpose(2, 0, 1),
                               rtol=1e-9, atol=1e-11)


def _loop_body_thunks(compiled_text):
    """Operations XLA:CPU runs as thunks (fusions, copies, calls) in each while body."""
    import re

    counts = []
    for body in re.findall(r"body=(%[\w.\-]+)", compiled_text):
        text = re.search(re.escape(body) + r" \(.*?\n(.*?)\n}", compiled_text, re.S).group(1)
        ops = re.findall(r"= \S+ ([\w\-]+)\(", text)
        counts.append(sum(op not in ("get-tuple-element", "parameter", "tuple", "constant",
                                     "bitcast") for op in ops))
    return counts


@pytest.mark.parametrize("path", ["core", "public"])
def test_univariate_scan_body_stays_within_the_sequential_thunk_threshold(path,
                                                                          univariate_case):
    """XLA:CPU runs a while body of at most 8 thunks inline and a longer one through its
    concurrent executor (about 0.3-0.4 us a step more: 2-3x for a small model). The scan
    of a model whose every matrix varies per step (with inputs) must stay within 8
    (`kalman._scan_univariate`); this fails if a change to the step or to XLA's fusion
    tips it over (then see `benchmarks/bench_kalman_exact.py`). ``public``: the program of
    ``ss.log_prob`` on one sequence (`recurrence._filter_flat` on a batch of one, which
    `recurrence.vmap_or_one` runs unbatched: vmapped, the body has 9)."""
    if path == "core":
        text = jax.jit(kalman.kalman_log_prob).lower(*univariate_case).compile().as_text()
    else:
        import statseq as ss
        from statseq.core import recurrence

        arrays, y, mask, inputs = univariate_case
        model = ss.TimeVaryingLinearGaussianSSM(state_dim=3, emission_dim=1, num_timesteps=7,
                                                input_dim=2)
        text = recurrence._filter_flat.lower(
            model, ss.LGSSMParams(*arrays[:10]), y[None], mask[None], inputs[None],
            complete=False).compile().as_text()
    counts = _loop_body_thunks(text)
    assert counts and max(counts) <= 8, counts


def test_public_filter_with_missing_data_equals_the_step_scan(univariate_case):
    """``ss.filter`` / ``ss.log_prob`` of a one-series linear Gaussian model run the scalar
    scan (`GaussianSSMBase.masked_data_filter`): per-step log-densities and the final
    carry (the start of a forecast) equal the per-step `kalman_step` scan's, batched."""
    import statseq as ss
    from statseq.core import recurrence

    arrays, y, mask, inputs = univariate_case
    model = ss.TimeVaryingLinearGaussianSSM(state_dim=3, emission_dim=1, num_timesteps=7,
                                            input_dim=2)
    params = ss.LGSSMParams(*arrays[:10])
    assert model.masked_data_filter(params, 7) is not None
    ys, masks = jnp.stack([y, y[::-1]]), jnp.stack([mask, mask[::-1]])
    got = ss.filter(model, params, ys, mask=masks, inputs=inputs)

    def steps(yy, mm):
        return recurrence._scan_one(model, params, yy, mm, inputs,
                                    model.initial_carry(params), False)

    want_lp, _, want_final = jax.jit(jax.vmap(steps))(ys, masks)
    np.testing.assert_allclose(got.log_probs, want_lp, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(ss.log_prob(model, params, ys, mask=masks, inputs=inputs),
                               want_lp.sum(-1), rtol=1e-12)
    assert jax.tree.structure(got.final_carry) == jax.tree.structure(want_final)
    for g, w in zip(jax.tree.leaves(got.final_carry), jax.tree.leaves(want_final), strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)
