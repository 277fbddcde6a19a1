"""Fits tell the truth: ``converged`` is False when EM broke down, results always satisfy
their constraints, and optima on the boundary of the parameter space are reported.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.core.params import on_boundary, valid_iterate, validate_params


def _collapsing_lgssm(dtype):
    """One AR(1) state seen by three series, the third without noise (``y_3 = -x``): the
    MLE has a singular observation covariance R, and EM drives one eigenvalue to 0."""
    rng = np.random.default_rng(0)
    x = np.zeros(100)
    for t in range(1, 100):
        x[t] = 0.8 * x[t - 1] + rng.normal()
    y = np.stack([x + 0.5 * rng.normal(size=100), 2 * x + 0.5 * rng.normal(size=100), -x], -1)
    model = ss.LinearGaussianSSM(state_dim=1, emission_dim=3)
    params = jax.tree.map(lambda a: jnp.asarray(a, dtype), model.default_params()._replace(
        emission_weights=jnp.array([[1.0], [2.0], [-1.0]]),
        dynamics_weights=jnp.array([[0.8]]), dynamics_cov=jnp.array([[1.0]]),
        emission_cov=jnp.diag(jnp.array([0.25, 0.25, 1e-6]))))
    return model, params, y.astype(dtype)


def test_lgssm_em_that_breaks_down_in_float32_says_so():
    """In float32 the log joint decreases once R is nearly singular (EM cannot decrease it
    in exact arithmetic): the fit stops there with converged=False, a warning, the best
    iterate (whose value is the last finite trace entry) and valid parameters."""
    with jax.enable_x64(False):
        model, params, y = _collapsing_lgssm(np.float32)
        with pytest.warns(RuntimeWarning, match="decreased"):
            fit = ss.fit_em(model, params, y, num_iters=50, progress=False)
        assert not fit.converged and fit.num_iterations < 50
        validate_params(model, fit.params)
        np.testing.assert_allclose(fit.final_log_joint,
                                   float(ss.log_prob(model, fit.params, y)), rtol=1e-5)
        trace = fit.log_joint[: fit.num_iterations]
        assert np.all(np.isfinite(trace)) and np.all(np.diff(trace) > 0)
        assert np.isnan(fit.log_joint[fit.num_iterations])  # the rejected iteration
        assert "emission_cov" in fit.on_boundary


def test_lgssm_em_toward_a_singular_covariance_reports_the_boundary():
    model, params, y = _collapsing_lgssm(np.float64)
    with pytest.warns(RuntimeWarning, match="boundary.*emission_cov"):
        fit = ss.fit_em(model, params, y, num_iters=20, progress=False)
    assert not fit.converged  # the iteration limit
    assert "emission_cov" in fit.on_boundary
    smallest = np.linalg.eigvalsh(np.asarray(fit.params.emission_cov))[0]
    assert 0 < smallest < 1e-6 * np.var(y)


def test_local_level_without_level_noise_reports_the_level_variance_on_the_boundary():
    """White noise around a constant: the MLE of the level variance is 0. statsmodels'
    UnobservedComponents("llevel") reaches the same optimum (its sigma2.level also
    collapses); both give the i.i.d. variance of the data for the irregular."""
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    y = 5.0 + np.random.default_rng(1).normal(size=100)
    with pytest.warns(RuntimeWarning, match="boundary.*level_var"):
        fit = ss.fit_lbfgs(ss.LocalLevel(), ss.LocalLevelParams(1.0, 1.0), y, progress=False)
    assert fit.on_boundary == ("level_var",)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = UnobservedComponents(y, "llevel", use_exact_diffuse=True).fit(disp=False)
    assert res.params[1] < 1e-6 * np.var(y)
    np.testing.assert_allclose(float(fit.params.obs_var), res.params[0], rtol=1e-3)
    np.testing.assert_allclose(fit.final_log_joint, res.llf, rtol=1e-6)


def test_interior_optimum_is_not_on_the_boundary():
    y = ss.datasets.load_nile().to_numpy().astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fit = ss.fit_lbfgs(ss.LocalLevel(), ss.LocalLevelParams(15000.0, 1500.0), y,
                           progress=False)
    assert fit.on_boundary == () and fit.converged


def test_on_boundary_rules():
    model = ss.PoissonHMM(num_states=2)
    p = model.assemble_params(model.emission_shapes()._replace(rates=jnp.array([1e-9, 3.0])),
                              initial_probs=jnp.array([0.5, 0.5]))
    assert on_boundary(model, p, scale=3.0) == ("emissions.rates",)
    p = p._replace(transitions=jnp.array([[1.0, 0.0], [0.5, 0.5]]),
                   emissions=p.emissions._replace(rates=jnp.array([1.0, 3.0])))
    assert on_boundary(model, p, scale=3.0) == ("transitions",)
    assert on_boundary(model, p._replace(transitions=jnp.full((2, 2), 0.5)), 3.0) == ()


def test_valid_iterate_returns_the_first_valid_candidate_and_warns():
    model = ss.LocalLevel()
    bad = ss.LocalLevelParams(jnp.asarray(1.0), jnp.asarray(-1.0))
    good = ss.LocalLevelParams(jnp.asarray(1.0), jnp.asarray(2.0))
    with pytest.warns(RuntimeWarning, match="left the parameter space.*level_var"):
        chosen, replaced = valid_iterate(model, [bad, good], "fit_x")
    assert chosen is good and replaced
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert valid_iterate(model, [good, bad], "fit_x") == (good, False)


def test_fit_result_stays_backward_compatible():
    """Positional construction with the original eight fields still works."""
    res = ss.FitResult(None, np.zeros(1), 1, True, np.zeros(0), np.zeros(0, int), 0.0, "x")
    assert res.on_boundary == () and res.spurious_states == ()
