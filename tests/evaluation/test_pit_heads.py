"""PIT of neural models with every count, class and Student-t head.

The jump of a discrete PIT, ``F_t(y_t) - F_t(y_t - 1)``, must equal the filter's one-step
predictive probability ``exp(log p(y_t | y_{<t}))`` (so the cdfs are evaluated on the right
carries); the Student-t head's PIT equals SciPy's ``t.cdf`` at the head's parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import statseq as ss


@pytest.mark.parametrize("emission", ["poisson", "negative_binomial", "bernoulli",
                                      "categorical"])
def test_discrete_pit_jump_is_the_filter_predictive_probability(emission):
    """F_t(y_t) - F_t(y_t - 1) = p(y_t | y_{<t}): the cdfs sit on the right carries."""
    from statseq.evaluation.diagnostics import _compute

    y = np.array([0, 1, 3, 2, 5, 1, 0, 2, 4, 1])
    if emission == "bernoulli":
        y = (y > 1).astype(int)
    kw = {"num_classes": 6} if emission == "categorical" else {}
    model = ss.GRU(hidden_dim=3, emission=emission, **kw)
    params = model.initialize(y, key=jax.random.key(0))
    out, _ = _compute(model, params, y, None, None)
    jump = np.asarray(out["hi"] - out["lo"])  # discrete: both ends of the jump
    ref = np.exp(np.asarray(ss.filter(model, params, y).log_probs))
    np.testing.assert_allclose(jump, ref, rtol=1e-10)


def test_student_t_head_pit_is_the_scipy_t_cdf():
    y = np.array([0.3, -1.2, 0.8, 2.5, -0.4, 0.1, 1.7])
    model = ss.GRU(hidden_dim=3, emission="student_t")
    params = model.initialize(y, key=jax.random.key(0))
    carries = ss.filter(model, params, y, return_carries=True).carries
    ref = []
    for t in range(y.size):
        carry = model.initial_carry(params) if t == 0 else jax.tree.map(
            lambda c, t=t: c[t - 1], carries)
        d = model.predict(params, carry, jnp.zeros(0))
        ref.append(stats.t.cdf(y[t], float(d.df), float(d.loc), float(d.scale)))
    np.testing.assert_allclose(ss.pit(model, params, y), ref, rtol=1e-10)


def test_continuous_pit_needs_no_key_even_with_missing_steps():
    y = np.array([0.3, -1.2, 0.8, 2.5, -0.4, 0.1, 1.7])
    mask = np.ones(7, bool)
    mask[3] = False
    model = ss.GRU(hidden_dim=3, emission="student_t")
    params = model.initialize(y, key=jax.random.key(0))
    u = np.asarray(ss.pit(model, params, y, mask=mask))
    assert np.isnan(u[3]) and np.isfinite(np.delete(u, 3)).all()
    full = np.asarray(ss.pit(model, params, y))
    np.testing.assert_allclose(u[:3], full[:3], rtol=1e-12)  # the past is unchanged


def test_diagonal_gaussian_head_residuals_are_entrywise_standardized_errors():
    y = np.random.default_rng(0).normal(size=(6, 2))
    model = ss.GRU(hidden_dim=3, emission="gaussian", emission_dim=2)
    params = model.initialize(y, key=jax.random.key(0))
    carries = ss.filter(model, params, y, return_carries=True).carries
    ref = []
    for t in range(6):
        carry = model.initial_carry(params) if t == 0 else jax.tree.map(
            lambda c, t=t: c[t - 1], carries)
        d = model.predict(params, carry, jnp.zeros(0)).base_dist
        ref.append((y[t] - np.asarray(d.loc)) / np.asarray(d.scale))
    np.testing.assert_allclose(ss.standardized_residuals(model, params, y), ref, rtol=1e-10)
    np.testing.assert_allclose(ss.pit(model, params, y), stats.norm.cdf(ref), rtol=1e-10)
