"""LinearGaussianSSM: against dynamax (filter, smoother, EM step), exact EM behaviour,
forecasts, the time-varying variant and input validation."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statseq as ss

STATE, EMIT, INPUT, T = 2, 3, 1, 120
# ``num_iters`` is a static argument of the EM program (the length of its trace), and each
# new value compiles a new one (~4 s at -O0 against ~1 ms per iteration run): every fit_em
# of the fixture's model below runs this many, so they share one program (CI time)
EM_ITERS = 1000


def truth(model=None):
    model = model or ss.LinearGaussianSSM(state_dim=STATE, emission_dim=EMIT, input_dim=INPUT)
    rng = np.random.default_rng(0)
    p = model.default_params()
    theta = 0.3
    rot = 0.95 * np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    return model, p._replace(
        initial_mean=jnp.array([1.0, -1.0]),
        dynamics_weights=jnp.asarray(rot),
        dynamics_input_weights=jnp.asarray(rng.normal(size=(STATE, INPUT))),
        dynamics_bias=jnp.array([0.1, 0.0]),
        emission_weights=jnp.asarray(rng.normal(size=(EMIT, STATE))),
        emission_input_weights=jnp.asarray(rng.normal(size=(EMIT, INPUT))),
        emission_bias=jnp.array([0.5, -0.2, 0.0]),
        emission_cov=jnp.asarray(np.diag([0.2, 0.3, 0.4]) + 0.05),
    )


@pytest.fixture(scope="module")
def data():
    model, p = truth()
    u = np.random.default_rng(1).normal(size=(T, INPUT))
    y = np.asarray(ss.sample(model, p, num_timesteps=T, key=jax.random.key(2), inputs=u))
    return model, p, y, u


def to_dynamax(p):
    from dynamax.linear_gaussian_ssm.inference import make_lgssm_params

    return make_lgssm_params(p.initial_mean, p.initial_cov, p.dynamics_weights, p.dynamics_cov,
                             p.emission_weights, p.emission_cov, p.dynamics_bias,
                             p.dynamics_input_weights, p.emission_bias, p.emission_input_weights)


def test_filter_and_smoother_match_dynamax(data):
    pytest.importorskip("dynamax")
    from dynamax.linear_gaussian_ssm.inference import lgssm_filter, lgssm_smoother

    model, p, y, u = data
    ref_f = lgssm_filter(to_dynamax(p), jnp.asarray(y), jnp.asarray(u))
    ref_s = lgssm_smoother(to_dynamax(p), jnp.asarray(y), jnp.asarray(u))
    f = model.filter_states(p, y, inputs=u)
    s = model.smoother(p, y, inputs=u)
    np.testing.assert_allclose(f.marginal_log_lik, ref_f.marginal_loglik, rtol=1e-10)
    np.testing.assert_allclose(float(ss.log_prob(model, p, y, inputs=u)), ref_f.marginal_loglik,
                               rtol=1e-10)
    # dynamax conditions with a different (less careful) algebra: agreement to ~1e-9
    np.testing.assert_allclose(f.filtered_means, ref_f.filtered_means, atol=1e-8)
    np.testing.assert_allclose(f.filtered_covs, ref_f.filtered_covariances, atol=1e-8)
    np.testing.assert_allclose(s.smoothed_means, ref_s.smoothed_means, atol=1e-8)
    np.testing.assert_allclose(s.smoothed_covs, ref_s.smoothed_covariances, atol=1e-8)
    # dynamax returns E[x_t x_{t+1}^T]; ours is Cov[x_{t+1}, x_t]
    m = np.asarray(s.smoothed_means)
    second = np.swapaxes(np.asarray(s.smoothed_cross_covs), 1, 2) + m[:-1, :, None] * m[1:, None]
    np.testing.assert_allclose(second, ref_s.smoothed_cross_covariances, atol=1e-8)


def test_one_em_step_matches_dynamax(data):
    pytest.importorskip("dynamax")
    from dynamax.linear_gaussian_ssm import LinearGaussianSSM as DynamaxLGSSM

    model, p, y, u = data
    start = model.initialize(y, key=jax.random.key(0), inputs=u)._replace(
        dynamics_input_weights=p.dynamics_input_weights)
    dyn = DynamaxLGSSM(STATE, EMIT, INPUT)
    _, props = dyn.initialize(jax.random.key(0))
    ref, lls = dyn.fit_em(to_dynamax(start), props, jnp.asarray(y), inputs=jnp.asarray(u),
                          num_iters=1, verbose=False)
    # tol=inf: the step from ``start`` is taken at iteration 0 and iteration 1 declares
    # convergence, which returns the parameters that produced its value, i.e. exactly one EM
    # step; the same compiled program as the EM_ITERS fits below (CI time)
    fit = ss.fit_em(model, start, y, inputs=u, num_iters=EM_ITERS, tol=np.inf, progress=False)
    assert fit.converged and fit.num_iterations == 2
    new = fit.params
    np.testing.assert_allclose(fit.log_joint[0], lls[0], rtol=1e-10)
    pairs = [(new.dynamics_weights, ref.dynamics.weights), (new.dynamics_cov, ref.dynamics.cov),
             (new.dynamics_bias, ref.dynamics.bias),
             (new.dynamics_input_weights, ref.dynamics.input_weights),
             (new.emission_weights, ref.emissions.weights), (new.emission_cov, ref.emissions.cov),
             (new.emission_bias, ref.emissions.bias),
             (new.emission_input_weights, ref.emissions.input_weights),
             (new.initial_mean, ref.initial.mean), (new.initial_cov, ref.initial.cov)]
    for ours, theirs in pairs:
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-8)


def _is_spd(a):
    a = np.asarray(a)
    return np.allclose(a, a.T, atol=1e-12) and np.all(np.linalg.eigvalsh(a) > 0)


def test_em_is_monotone_and_keeps_covariances_positive_definite_for_hundreds_of_iterations(data):
    model, _, y, u = data
    rng = np.random.default_rng(3)
    mask = rng.random(y.shape) > 0.15  # partially observed steps
    mask[40:45] = False
    start = model.initialize(y, key=jax.random.key(1), inputs=u)
    fit = ss.fit_em(model, start, y, mask=mask, inputs=u, num_iters=EM_ITERS, tol=0,
                    progress=False)
    trace = fit.log_joint[: fit.num_iterations]
    assert fit.num_iterations == EM_ITERS and np.all(np.isfinite(trace))
    # non-decreasing up to float64 rounding of a sum of ~400 terms
    assert np.min(np.diff(trace)) > -1e-8 * np.abs(trace).max()
    assert trace[-1] > trace[0] + 10
    for leaf in (fit.params.dynamics_cov, fit.params.emission_cov, fit.params.initial_cov):
        assert _is_spd(leaf)
    # the trace is the log-likelihood of the parameters entering each iteration
    final = ss.log_prob(model, fit.params, y, mask=mask, inputs=u)
    assert float(final) >= trace[-1] - 1e-8


def test_em_with_frozen_leaves_is_an_exact_conditional_maximization(data):
    """With F, H and R frozen, one EM step must beat every other (b, Q, ...) on the expected
    complete-data log-likelihood; monotonicity and frozen values are checked over a fit."""
    model, p, y, u = data
    start = model.initialize(y, key=jax.random.key(1), inputs=u)
    start = start._replace(dynamics_weights=p.dynamics_weights)
    trainable = jax.tree.map(lambda _: True, start)._replace(
        dynamics_weights=False, emission_weights=False, emission_cov=False)
    fit = ss.fit_em(model, start, y, inputs=u, num_iters=EM_ITERS, tol=0, trainable=trainable,
                    progress=False)
    trace = fit.log_joint[: fit.num_iterations]
    assert np.min(np.diff(trace)) > -1e-9 * np.abs(trace).max()
    for name in ("dynamics_weights", "emission_weights", "emission_cov"):
        np.testing.assert_array_equal(getattr(fit.params, name), getattr(start, name))
    # with one free block EM converges fast, and its fixed point is a stationary point of
    # the likelihood in that block: the conditional M-step used the frozen values
    only_bias = jax.tree.map(lambda _: False, start)._replace(dynamics_bias=True)
    fit = ss.fit_em(model, start, y, inputs=u, num_iters=EM_ITERS, tol=1e-14,
                    trainable=only_bias, progress=False)
    grad = jax.grad(lambda b: ss.log_prob(model, fit.params._replace(dynamics_bias=b), y,
                                          inputs=u))(fit.params.dynamics_bias)
    assert np.max(np.abs(np.asarray(grad))) < 1e-4


def test_quasi_newton_and_em_reach_the_same_optimum(data):
    """EM (1000 iterations, linear convergence) gets within 0.01 nats of the maximum that
    L-BFGS then polishes from EM's end point; adam from there finds nothing better."""
    model, _, y, u = data
    start = model.initialize(y, key=jax.random.key(1), inputs=u)
    em = ss.fit_em(model, start, y, inputs=u, num_iters=EM_ITERS, tol=1e-12, progress=False)
    ll_em = float(ss.log_prob(model, em.params, y, inputs=u))
    qn = ss.fit_lbfgs(model, em.params, y, inputs=u, num_iters=300, progress=False)
    ll_qn = float(ss.log_prob(model, qn.params, y, inputs=u))
    assert ll_em - 1e-9 <= ll_qn < ll_em + 0.01
    sgd = ss.fit_sgd(model, qn.params, y, inputs=u, optimizer=optax.adam(1e-4), num_steps=50,
                     key=jax.random.key(0), progress=False)
    assert np.nanmax(sgd.log_joint) < ll_qn + 1e-4


def test_analytic_forecast_matches_sampled_forecast(data):
    model, p, y, u = data
    fu = np.random.default_rng(5).normal(size=(6, INPUT))
    fc = model.forecast_moments(p, y, num_steps=6, inputs=u, future_inputs=fu)
    mc = ss.forecast(model, p, y, num_steps=6, num_samples=20000, key=jax.random.key(4),
                     inputs=u, future_inputs=fu)
    sd = np.asarray(fc.std)
    np.testing.assert_array_less(np.abs(np.asarray(mc.mean()) - fc.mean), 4.5 * sd / np.sqrt(20000))
    np.testing.assert_allclose(np.std(np.asarray(mc.samples), axis=0), sd, rtol=0.03)
    lo, hi = fc.interval(0.9)
    np.testing.assert_allclose(hi - lo, 2 * 1.6448536269514722 * sd, rtol=1e-12)
    # h = 1: the one-step predictive from the filter
    filt = model.filter_states(p, y, inputs=u)
    arr = model.to_arrays(p)
    m1 = arr.dynamics_weights @ filt.filtered_means[-1] + arr.dynamics_input_weights @ fu[0] \
        + arr.dynamics_bias
    np.testing.assert_allclose(fc.state_mean[0], m1, rtol=1e-12)


def test_time_varying_model_with_constant_matrices_equals_the_fixed_model(data):
    model, p, y, u = data
    tv = ss.TimeVaryingLinearGaussianSSM(state_dim=STATE, emission_dim=EMIT, input_dim=INPUT,
                                         num_timesteps=T)

    def tile(leaf, n):
        return jnp.broadcast_to(leaf, (n,) + leaf.shape)

    names = p._fields
    tp = p._replace(**{k: tile(getattr(p, k), T - 1) for k in names[2:6]},
                    **{k: tile(getattr(p, k), T) for k in names[6:]})
    np.testing.assert_allclose(ss.log_prob(tv, tp, y, inputs=u), ss.log_prob(model, p, y, inputs=u),
                               rtol=1e-12)
    # changing one step's emission noise changes only what it should
    tp2 = tp._replace(emission_cov=tp.emission_cov.at[10].multiply(4.0))
    a = ss.filter(tv, tp2, y, inputs=u).log_probs
    b = ss.filter(model, p, y, inputs=u).log_probs
    np.testing.assert_allclose(a[:10], b[:10], rtol=1e-12)
    assert abs(float(a[10] - b[10])) > 1e-3
    with pytest.raises(ValueError, match="num_timesteps"):
        ss.log_prob(tv, tp, y[:-1], inputs=u[:-1])


def test_diffuse_initial_state_is_exact_and_forecast_needs_identification():
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None, initial="diffuse")
    p = model.default_params()._replace(
        dynamics_weights=jnp.array([[1.0, 1.0], [0.0, 1.0]]),
        emission_weights=jnp.array([[1.0, 0.0]]))
    y = np.cumsum(np.random.default_rng(0).normal(size=40))
    assert np.isfinite(float(ss.log_prob(model, p, y)))
    with pytest.raises(ValueError, match="diffuse"):
        model.forecast_moments(p, y[:1], num_steps=3)
    fc = model.forecast_moments(p, y, num_steps=3)
    assert np.all(np.isfinite(np.asarray(fc.std)))


def test_validation_errors(data):
    model, p, y, u = data
    with pytest.raises(ValueError, match="emission_dim|shape"):
        ss.log_prob(model, p, y[:, :2], inputs=u)
    with pytest.raises(ValueError, match="non-finite"):
        bad = y.copy()
        bad[3, 1] = np.nan
        ss.log_prob(model, p, bad, inputs=u)
    with pytest.raises(ValueError, match="positive_definite|dynamics_cov"):
        ss.log_prob(model, p._replace(dynamics_cov=-jnp.eye(STATE)), y, inputs=u)
    with pytest.raises(ValueError, match="future_inputs"):
        model.forecast_moments(p, y, num_steps=3, inputs=u)
    with pytest.raises(ValueError, match="initial"):
        ss.LinearGaussianSSM(state_dim=2, emission_dim=1, initial="flat")
    with pytest.raises(ValueError, match="stable"):
        stat = ss.LinearGaussianSSM(state_dim=2, emission_dim=EMIT, initial="stationary")
        q = stat.default_params()._replace(dynamics_weights=1.2 * jnp.eye(2))
        ss.log_prob(stat, q, y)
    with pytest.raises(ValueError, match="priors"):
        ss.fit_em(model, p, y, inputs=u, priors=jax.tree.map(lambda _: None, p)._replace(
            emission_bias=__import__("numpyro").distributions.Normal(0.0, 1.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.smoother(p, y, inputs=u)


class _SteadyFrom256LGSSM(ss.LinearGaussianSSM):
    """`steady_state_min_timesteps` lowered to 256 (from 1024), so that 700 steps take the
    steady-state path. A class of its own (a model is a static argument, compared with its
    class) instead of a patched attribute: its programs are traced here, never found in the
    caches, so the spy below sees them without clearing every cache (CI time)."""

    steady_state_min_timesteps = 256


@pytest.mark.parametrize("case", ["inputs", "diffuse_then_slow_convergence"])
def test_steady_state_fast_path_equals_the_step_by_step_filter(case, monkeypatch):
    """``log_prob`` on complete data switches to the steady-state gain after 128 exact steps
    (or keeps filtering exactly when the covariance has not converged by then). The path
    starts at `steady_state_min_timesteps` (1024) steps; lowered to 256 here, so 700 steps
    take it (a spy checks). The diffuse and the slowly converging model share their shapes,
    hence their programs: the second reuses the traced program (no new trace)."""
    from statseq.inference import kalman_steady

    rng = np.random.default_rng(11)
    num_t = 700
    calls = []
    original = kalman_steady.steady_state_log_probs
    monkeypatch.setattr(kalman_steady, "steady_state_log_probs",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    if case == "inputs":
        model = _SteadyFrom256LGSSM(state_dim=STATE, emission_dim=EMIT, input_dim=INPUT)
        _, p = truth(model)
        settings = [(p, rng.normal(size=(num_t, INPUT)))]
    else:
        model = _SteadyFrom256LGSSM(state_dim=2, emission_dim=None, initial="diffuse")
        settings = [(model.default_params()._replace(
            dynamics_weights=jnp.array([[1.0, 1.0], [0.0, 1.0]]),
            emission_weights=jnp.array([[1.0, 0.0]]),
            dynamics_cov=jnp.diag(jnp.array([0.5, q_slope]))), None) for q_slope in (0.01, 1e-9)]
    for p, u in settings:
        y = np.asarray(ss.sample(model, p, num_timesteps=num_t, key=jax.random.key(3),
                                 inputs=u))
        fast = ss.filter(model, p, y, inputs=u)
        exact = ss.filter(model, p, y, inputs=u, return_carries=True)
        assert exact.carries is not None and fast.carries is None
        assert len(calls) == 1, "the steady-state path was not taken (or traced again)"
        np.testing.assert_allclose(fast.log_probs, exact.log_probs, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(fast.log_prob, exact.log_prob, rtol=1e-11)
        np.testing.assert_allclose(fast.final_carry.mean, exact.final_carry.mean, rtol=1e-8,
                                   atol=1e-8)
        np.testing.assert_allclose(fast.final_carry.cov, exact.final_carry.cov, rtol=1e-8,
                                   atol=1e-10)


def test_em_on_an_unbounded_likelihood_stops_and_returns_valid_parameters():
    """Four 2-d points and two states: the likelihood is unbounded (a covariance collapses).
    Near the collapse the log joint decreases (EM cannot, in exact arithmetic): EM must
    stop there, warn and say converged=False. Its best iterate is numerically degenerate
    (the public functions refuse it), so the fit returns a valid earlier one, here the
    start (whose value is the first trace entry), and warns about that too."""
    from statseq.core.params import validate_params

    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    y = np.random.default_rng(0).normal(size=(4, 2))
    start = model.initialize(y, key=jax.random.key(0))
    with pytest.warns(RuntimeWarning) as record:
        fit = ss.fit_em(model, start, y, num_iters=3000, tol=0, progress=False)
    messages = " ".join(str(w.message) for w in record)
    # the breakdown shows either as a decrease or as a non-finite objective, depending on
    # the start's path to the collapse; both must stop the fit with converged=False
    assert "decreased" in messages or "non-finite" in messages
    assert "left the parameter space" in messages
    assert fit.num_iterations < 3000 and not fit.converged
    trace = fit.log_joint[: fit.num_iterations]
    assert np.all(np.isfinite(trace[:-1])) and not np.isfinite(fit.log_joint[-1])
    validate_params(model, fit.params)
    np.testing.assert_allclose(float(ss.log_prob(model, fit.params, y)), trace[0],
                               rtol=1e-10)


def test_singular_emission_cov_is_scored_exactly_and_flagged_only_where_it_was_fitted(data):
    """A covariance with a zero eigenvalue (here one L-BFGS reached on an unbounded
    likelihood) is a valid singular ``R`` when every innovation covariance ``H P H' + R`` is
    non-singular: the filter is then exact (the dense joint Gaussian agrees), but a fit that
    drove a *trainable* covariance there is still reported as degenerate; a fixed singular
    ``R`` is not."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import _dense_ssm

    from statseq.core.params import degenerate_fit_warning
    from statseq.core.restrict import restrict

    model, p, y, u = data
    plain = ss.LinearGaussianSSM(state_dim=STATE, emission_dim=EMIT)
    q = plain.default_params()._replace(emission_weights=p.emission_weights)
    y0 = np.asarray(ss.sample(plain, q, num_timesteps=25, key=jax.random.key(3)))
    for tiny in (1e-40, 0.0):
        r = q._replace(emission_cov=jnp.asarray(np.diag([tiny, 1.7e-4, 1.0])))
        np.testing.assert_allclose(float(ss.log_prob(plain, r, y0)),
                                   _dense_ssm.log_prob(r, y0), rtol=1e-10)
    message = degenerate_fit_warning(plain, r, "fit_x")
    assert message is not None and "unbounded" in message
    fixed_r = jax.tree.map(lambda _: True, q)._replace(emission_cov=False)
    assert degenerate_fit_warning(plain, r, "fit_x", restrict(plain, r, fixed_r)[0]) is None
    assert degenerate_fit_warning(model, p, "fit_x") is None


# ---- steady-state smoother through the public call --------------------------------------
class _ShortHeadLGSSM(ss.LinearGaussianSSM):
    steady_state_head = 32  # short enough for a test-sized series (T = 120)


class _ShortHeadLocalLevel(ss.LocalLevel):
    steady_state_head = 56


class _ShortHeadTrend(ss.LocalLinearTrend):
    steady_state_head = 40


def _smoother_cases(data):
    model, p, y, u = data
    lgssm = _ShortHeadLGSSM(state_dim=STATE, emission_dim=EMIT, input_dim=INPUT)
    nile = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)  # Durbin and Koopman
    trend = ss.LocalLinearTrendParams(obs_var=1.0, level_var=0.5, slope_var=0.1)
    y_ll = np.asarray(ss.sample(ss.LocalLevel(), nile, num_timesteps=T, key=jax.random.key(3)))
    y_tr = np.cumsum(np.cumsum(np.random.default_rng(4).normal(size=T)))
    return [(lgssm, p, y, u), (_ShortHeadLocalLevel(), nile, y_ll, None),
            (_ShortHeadTrend(), trend, y_tr, None)]


def _spy(monkeypatch, module, name):
    """Replace ``module.name`` by a wrapper that records each call; returns the record."""
    calls, original = [], getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def test_smoother_steady_state_path_equals_exact_smoother(data, monkeypatch):
    """Complete data: `smoother(parallel=False)` takes the steady-state path (a spy counts
    it) for the n=2/D=3 model with inputs and for the diffuse local level (Nile variances)
    and local linear trend, and equals the step-by-step smoother to 1e-9; masked data
    takes the exact path."""
    from statseq.inference import kalman, kalman_steady

    calls = _spy(monkeypatch, kalman_steady, "steady_state_smoother")
    filter_calls = _spy(monkeypatch, kalman_steady, "steady_state_filter")
    exact = jax.jit(kalman.kalman_smoother)
    converged = jax.jit(lambda a, h: kalman_steady._steady_smoother_parts(a, h, 1e-13)[-1],
                        static_argnums=1)
    for model, p, y, u in _smoother_cases(data):
        arrays = model.to_arrays(p)
        yy = jnp.reshape(jnp.asarray(y), (T, model.dim))
        uu = jnp.zeros((T, 0)) if u is None else jnp.asarray(u)
        assert bool(converged(arrays, model.steady_state_head))
        ref = exact(arrays, yy, jnp.ones(yy.shape, bool), uu)
        n_before = len(calls)
        got = model.smoother(p, y, inputs=u, parallel=False)
        assert len(calls) == n_before + 1
        for name in ref._fields:
            a, b = np.asarray(getattr(got, name)), np.asarray(getattr(ref, name))
            assert np.max(np.abs(a - b)) <= 1e-9 * np.max(np.abs(b)), (model, name)
    # filter_states: same steady-state switch (n=2/D=3 with inputs, diffuse local level)
    exact_f = jax.jit(kalman.kalman_filter)
    for model, p, y, u in _smoother_cases(data)[:2]:
        yy = jnp.reshape(jnp.asarray(y), (T, model.dim))
        uu = jnp.zeros((T, 0)) if u is None else jnp.asarray(u)
        ref = exact_f(model.to_arrays(p), yy, jnp.ones(yy.shape, bool), uu)
        got = model.filter_states(p, y, inputs=u, parallel=False)
        for name in ref._fields:
            a, b = np.asarray(getattr(got, name)), np.asarray(getattr(ref, name))
            assert np.max(np.abs(a - b)) <= 1e-9 * np.max(np.abs(b)), (model, name)
    assert len(filter_calls) == 2
    model, p, y, u = _smoother_cases(data)[1]
    mask = np.ones(T, bool)
    mask[70] = False
    n_before = len(calls)
    got = model.smoother(p, y, mask=mask, parallel=False)
    assert len(calls) == n_before
    ref = exact(model.to_arrays(p), jnp.asarray(y)[:, None], jnp.asarray(mask)[:, None],
                jnp.zeros((T, 0)))
    np.testing.assert_allclose(got.smoothed_means, ref.smoothed_means, rtol=1e-12)
