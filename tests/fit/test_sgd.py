"""fit_sgd: frozen leaves, minibatches, validation and early stopping, clipping, priors."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import optax
import pytest

import statseq as ss
from statseq.fit.sgd import _fit_sgd_compiled

AR1 = ss.AR(order=1)
KEY = jax.random.key(0)


M0, S0 = 0.0, 0.05
MAP_PRIORS = ss.ARParams(coeffs=None, intercept=dist.Normal(M0, S0), input_weights=None,
                         cov=None)


@pytest.fixture(scope="module")
def map_fit(log_lynx):
    """MAP of the intercept of an AR(1) on lynx, coefficient and variance frozen at the MLE."""
    mle = AR1.fit_least_squares(log_lynx)
    trainable = ss.ARParams(coeffs=False, intercept=True, input_weights=False, cov=False)
    fit = ss.fit_sgd(AR1, mle, log_lynx, optimizer=optax.adam(optax.cosine_decay_schedule(
        0.02, 1500)), num_steps=1500, key=KEY, priors=MAP_PRIORS, trainable=trainable,
        progress=False)
    return mle, fit


def test_frozen_leaves_are_returned_exactly(map_fit):
    """trainable=False leaves must come back bit for bit, constrained ones included.

    fit_sgd maps every leaf to unconstrained space and back, so a frozen covariance is
    returned as L L^T of its own Cholesky factor: equal only to rounding.
    """
    mle, fit = map_fit
    np.testing.assert_array_equal(np.asarray(fit.params.coeffs), np.asarray(mle.coeffs))
    np.testing.assert_array_equal(np.asarray(fit.params.cov), np.asarray(mle.cov))


def test_map_matches_analytic_posterior_mode(map_fit, log_lynx):
    """Known phi and sigma2 (frozen), Normal(m0, s0^2) prior on c: the mode is closed form.

    log p(y_{2:T} | y_1, c) + log N(c; m0, s0^2) is quadratic in c with maximizer
    c* = (sum_t (y_t - phi y_{t-1}) / sigma2 + m0 / s0^2) / ((T - 1) / sigma2 + 1 / s0^2).
    """
    mle, fit = map_fit
    phi, s2 = float(mle.coeffs[0, 0, 0]), float(mle.cov[0, 0])
    resid = log_lynx[1:] - phi * log_lynx[:-1]
    c_star = (resid.sum() / s2 + M0 / S0**2) / (resid.size / s2 + 1 / S0**2)
    assert abs(float(mle.intercept[0]) - c_star) > 0.1  # the prior matters here
    np.testing.assert_allclose(float(fit.params.intercept[0]), c_star, atol=1e-6)
    np.testing.assert_allclose(float(fit.params.coeffs[0, 0, 0]), phi, rtol=1e-15)
    np.testing.assert_allclose(float(fit.params.cov[0, 0]), s2, rtol=1e-12)

    def log_joint(params):
        return float(ss.log_prob(AR1, params, log_lynx) + ss.log_prior(MAP_PRIORS, params))

    assert log_joint(fit.params) >= log_joint(mle)
    np.testing.assert_allclose(fit.final_log_joint, log_joint(fit.params), rtol=1e-8)
    assert fit.method == "sgd" and fit.num_iterations == 1500 and not fit.converged


def test_minibatch_trace_has_one_entry_per_step(log_lynx):
    """With 6 identical sequences every minibatch of 2 scaled by N / B = 3 is the exact
    full-data log-likelihood, so the first trace entry is log p(y | params_0) exactly."""
    seq = log_lynx[:16]
    ys = np.stack([seq] * 6)
    model = ss.AR(order=2)
    p0 = model.default_params()
    fit = ss.fit_sgd(model, p0, ys, optimizer=optax.adam(0.05), num_steps=25, batch_size=2,
                     key=KEY, progress=False)
    assert fit.log_joint.shape == (25,) and fit.num_iterations == 25
    assert np.all(np.isfinite(fit.log_joint))
    assert fit.validation_log_prob.shape == (0,) and fit.validation_steps.shape == (0,)
    np.testing.assert_allclose(fit.log_joint[0], 6 * float(ss.log_prob(model, p0, seq)),
                               rtol=1e-12)
    assert fit.log_joint[-1] > fit.log_joint[0]


def test_validation_early_stopping_returns_best_validation_params():
    y = np.random.default_rng(0).normal(size=40)  # white noise: an AR(8) can only overfit
    model = ss.AR(order=8)
    fit = ss.fit_sgd(model, model.default_params(), y, optimizer=optax.adam(0.05),
                     num_steps=2000, key=KEY, validation=0.25, eval_every=10, patience=10,
                     progress=False)
    assert fit.converged and fit.num_iterations < 2000
    n = fit.num_iterations
    assert np.all(np.isfinite(fit.log_joint[:n])) and np.all(np.isnan(fit.log_joint[n:]))
    v = fit.validation_log_prob
    assert v.size == n // 10
    np.testing.assert_array_equal(fit.validation_steps, np.arange(9, n, 10))
    best = int(np.argmax(v))
    assert v.size - 1 - best == 10  # stopped after `patience` evaluations without progress
    # returned params are the best validation point: log p(y_val | y_train) = max of trace
    score = ss.log_score(model, fit.params, y[:30], y[30:])
    np.testing.assert_allclose(score, v[best], rtol=1e-10)
    assert v[-1] < v[best]
    # while the training objective kept improving after the best validation point
    assert fit.log_joint[n - 1] > fit.log_joint[fit.validation_steps[best]]


def test_min_steps_patience_counts_only_after_it():
    """With ``min_steps`` (a learning-rate warm-up), the evaluations before it still pick
    the best parameters but never count towards ``patience``: the fit that stopped early
    above (white noise, AR(8)) now runs past ``min_steps`` and stops exactly ``patience``
    evaluations after ``max(min_steps, best step)``."""
    y = np.random.default_rng(0).normal(size=40)
    model = ss.AR(order=8)
    args = dict(optimizer=optax.adam(0.05), num_steps=2000, key=KEY, validation=0.25,
                eval_every=10, patience=10, progress=False)
    early = ss.fit_sgd(model, model.default_params(), y, **args)
    min_steps = early.num_iterations + 300  # well past where the plain fit stopped
    fit = ss.fit_sgd(model, model.default_params(), y, min_steps=min_steps, **args)
    n, v, steps = fit.num_iterations, fit.validation_log_prob, fit.validation_steps
    assert fit.converged and min_steps < n < 2000
    # the same trajectory as the plain fit up to where that one stopped
    np.testing.assert_allclose(v[: early.validation_log_prob.size], early.validation_log_prob,
                               rtol=1e-12)
    best = int(np.argmax(v))
    counted = steps + 1 > max(min_steps, steps[best] + 1)  # evaluations after both
    assert int(counted.sum()) == 10 and steps[-1] == n - 1
    # returned params: the best validation point over all evaluations, warm-up included
    np.testing.assert_allclose(ss.log_score(model, fit.params, y[:30], y[30:]), v[best],
                               rtol=1e-10)


def test_weight_decay_through_optax_adamw_matches_a_hand_written_loop(log_lynx):
    """fit_sgd passes the parameters to ``optimizer.update``, so ``optax.adamw``'s decoupled
    weight decay works: the fit equals a plain optax loop on ``-log p(y)`` (AR(1) with
    the variance frozen: the free coefficient and intercept are unconstrained reals)."""
    params = AR1.fit_least_squares(log_lynx)
    trainable = ss.ARParams(coeffs=True, intercept=True, input_weights=False, cov=False)
    opt = optax.adamw(0.01, weight_decay=0.5)
    fit = ss.fit_sgd(AR1, params, log_lynx, optimizer=opt, num_steps=60, key=KEY,
                     trainable=trainable, progress=False)

    def loss(x):
        p = params._replace(coeffs=x["coeffs"], intercept=x["intercept"])
        return -ss.log_prob(AR1, p, log_lynx)

    x = {"coeffs": params.coeffs, "intercept": params.intercept}
    state = opt.init(x)
    for _ in range(60):
        updates, state = opt.update(jax.grad(loss)(x), state, x)
        x = optax.apply_updates(x, updates)
    # the same loss through two compiled programs (the fit's restricted parameters and the
    # public call) differs in the last bits; Adam divides by sqrt(v), so near the optimum
    # those bits grow to ~4e-8 over 60 steps. The decay term moves the answer by > 5e-3.
    np.testing.assert_allclose(fit.params.coeffs, x["coeffs"], rtol=1e-6)
    np.testing.assert_allclose(fit.params.intercept, x["intercept"], rtol=1e-6)
    # and the decay term matters: plain Adam (same loop without it) ends elsewhere
    plain = ss.fit_sgd(AR1, params, log_lynx, optimizer=optax.adam(0.01), num_steps=60,
                       key=KEY, trainable=trainable, progress=False)
    assert abs(float(plain.params.intercept[0] - x["intercept"][0])) > 5e-3


CLIP = dict(optimizer=optax.sgd(1.0), num_steps=1, key=KEY, clip_norm=1e-3, progress=False)


def test_clip_norm_bounds_the_step(log_lynx):
    params = AR1.fit_least_squares(log_lynx)._replace(intercept=jnp.array([3.0]))
    up0 = ss.to_unconstrained(AR1, params)
    fit = ss.fit_sgd(AR1, params, log_lynx, **CLIP)
    up1 = ss.to_unconstrained(AR1, fit.params)
    step = np.sqrt(sum(float(jnp.sum((a - b) ** 2))
                       for a, b in zip(jax.tree.leaves(up1), jax.tree.leaves(up0),
                                       strict=True)))
    np.testing.assert_allclose(step, 1e-3, rtol=1e-6)  # the raw gradient is far larger


def test_repeated_fits_with_clip_norm_reuse_the_compiled_loop(log_lynx):
    """fit_sgd wraps the optimizer in a new optax.chain on every call with clip_norm; the
    optimizer is a static (hashed by identity) argument, so every call recompiles."""
    params = AR1.fit_least_squares(log_lynx)
    ss.fit_sgd(AR1, params, log_lynx, **CLIP)
    size = _fit_sgd_compiled._cache_size()
    ss.fit_sgd(AR1, params, log_lynx, **CLIP)
    assert _fit_sgd_compiled._cache_size() == size


NONFINITE = dict(optimizer=optax.sgd(1.0), num_steps=50, key=KEY, progress=False)
STATIONARY = ss.AR(order=1, initial="stationary")


def _diverging_fit(log_lynx):
    # a huge step makes phi explode; the stationary likelihood is then undefined (NaN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = ss.fit_sgd(STATIONARY, STATIONARY.default_params(), log_lynx, **NONFINITE)
    return fit, [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_non_finite_objective_warns_and_stops(log_lynx):
    fit, caught = _diverging_fit(log_lynx)
    assert len(caught) == 1 and "not finite" in str(caught[0].message)
    assert fit.num_iterations < 50 and not fit.converged
    assert np.all(np.isnan(fit.log_joint[fit.num_iterations - 1:]))
    assert np.all(np.isfinite(fit.log_joint[: fit.num_iterations - 1]))
    for leaf in jax.tree.leaves(fit.params):
        assert np.all(np.isfinite(np.asarray(leaf)))


def test_non_finite_fit_returns_params_with_a_finite_objective(log_lynx):
    """The warning promises 'the last parameters with a finite objective'.

    The loop keeps the parameters at which the objective first became non-finite (it only
    refuses to step away from them), so the returned params have a NaN log-likelihood.
    """
    fit, _ = _diverging_fit(log_lynx)
    assert np.isfinite(float(ss.log_prob(STATIONARY, fit.params, log_lynx)))


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"batch_size": 2}, ValueError, "batch_size=2 exceeds the 1 training sequences"),
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"validation": 1.5}, ValueError, r"validation must be a fraction in \(0, 1\)"),
        ({"validation": 0.0}, ValueError, "validation must be a fraction"),
        ({"optimizer": "adam"}, TypeError, "optimizer must be an optax"),
        ({"optimizer": optax.adam}, TypeError, "optimizer must be an optax"),
        ({"num_steps": 0}, ValueError, "num_steps must be >= 1"),
        ({"clip_norm": -1.0}, ValueError, "clip_norm must be positive"),
        ({"eval_every": 0, "validation": 0.2}, ValueError, "eval_every"),
        ({"patience": 0, "validation": 0.2}, ValueError, "patience"),
        ({"min_steps": -1, "validation": 0.2}, ValueError, "min_steps must be >= 0"),
        ({"min_steps": 1.5, "validation": 0.2}, TypeError, "min_steps must be an integer"),
    ],
)
def test_bad_arguments(log_lynx, kwargs, exc, match):
    args = dict(optimizer=optax.adam(1e-2), num_steps=10, key=KEY, progress=False)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        ss.fit_sgd(AR1, AR1.default_params(), log_lynx, **args)


def test_validation_split_must_leave_training_data(log_lynx):
    with pytest.raises(ValueError, match="leaves no sequences to train on"):
        ss.fit_sgd(AR1, AR1.default_params(), log_lynx[None, :20], optimizer=optax.adam(1e-2),
                   num_steps=10, key=KEY, validation=0.5, progress=False)
