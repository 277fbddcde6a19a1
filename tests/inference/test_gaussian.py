"""Gaussian primitives against dense textbook formulas and scipy."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
import scipy.linalg
from scipy.stats import multivariate_normal

from statseq.inference.gaussian import (
    condition_on_leading,
    masked_mvn_log_prob,
    solve_discrete_lyapunov,
    symmetrize,
)

DIM = 4
# every mask of a 4-vector: all missing, all observed and every partial pattern
ALL_MASKS = np.array(list(itertools.product([False, True], repeat=DIM)))

_log_prob = jax.jit(jax.vmap(masked_mvn_log_prob, in_axes=(None, None, None, 0)))
_condition = jax.jit(jax.vmap(condition_on_leading, in_axes=(None, None, None, 0)))


def random_spd(rng, n, jitter=0.1):
    a = rng.normal(size=(n, n))
    return a @ a.T + jitter * np.eye(n)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_mvn_log_prob_is_scipy_marginal(seed):
    rng = np.random.default_rng(seed)
    cov = random_spd(rng, DIM)
    mean = rng.normal(size=DIM)
    y = mean + rng.normal(size=DIM) * 2.0
    got = np.asarray(_log_prob(y, mean, cov, ALL_MASKS))
    for mask, value in zip(ALL_MASKS, got, strict=True):
        o = np.flatnonzero(mask)
        if o.size == 0:
            expected = 0.0
        else:
            expected = multivariate_normal(mean[o], cov[np.ix_(o, o)]).logpdf(y[o])
        np.testing.assert_allclose(value, expected, rtol=1e-12, atol=1e-12)


def test_masked_mvn_log_prob_ignores_missing_values():
    rng = np.random.default_rng(3)
    cov, mean = random_spd(rng, DIM), rng.normal(size=DIM)
    y1 = rng.normal(size=DIM)
    y2 = y1.copy()
    mask = np.array([True, False, True, False])
    y2[~mask] = [1e3, -7.0]
    masks = np.stack([mask] * len(ALL_MASKS))  # reuse the compiled shape
    a = np.asarray(_log_prob(y1, mean, cov, masks))
    b = np.asarray(_log_prob(y2, mean, cov, masks))
    np.testing.assert_array_equal(a, b)


def dense_condition(mean, cov, y, observed):
    """Textbook conditioning of z ~ N(mean, cov) on z[observed] = y[observed]."""
    o = np.flatnonzero(observed)
    if o.size == 0:
        return mean, cov
    s_oo = cov[np.ix_(o, o)]
    s_zo = cov[:, o]
    gain = np.linalg.solve(s_oo, s_zo.T).T
    return mean + gain @ (y[o] - mean[o]), cov - gain @ s_zo.T


@pytest.mark.parametrize("seed", [0, 1])
def test_condition_on_leading_is_schur_complement(seed):
    rng = np.random.default_rng(seed)
    n = DIM + 3
    cov = random_spd(rng, n)
    mean = rng.normal(size=n)
    y = rng.normal(size=DIM) * 3.0
    post_means, post_covs = _condition(mean, cov, y, ALL_MASKS)
    for mask, pm, pc in zip(ALL_MASKS, np.asarray(post_means), np.asarray(post_covs),
                            strict=True):
        em, ec = dense_condition(mean, cov, y, mask)
        np.testing.assert_allclose(pm, em, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(pc, ec, rtol=1e-10, atol=1e-10)
        # observed entries become exact, and the covariance stays symmetric
        np.testing.assert_allclose(pm[:DIM][mask], y[mask], atol=1e-10)
        np.testing.assert_array_equal(pc, pc.T)


def test_solve_discrete_lyapunov_satisfies_equation():
    rng = np.random.default_rng(7)
    n = 5
    a = rng.normal(size=(n, n))
    a *= 0.95 / np.max(np.abs(np.linalg.eigvals(a)))  # spectral radius 0.95
    q = random_spd(rng, n)
    p = np.asarray(solve_discrete_lyapunov(a, q))
    np.testing.assert_allclose(p, a @ p @ a.T + q, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(p, scipy.linalg.solve_discrete_lyapunov(a, q), rtol=1e-10)
    np.testing.assert_array_equal(p, p.T)
    assert np.all(np.linalg.eigvalsh(p) > 0)


def test_symmetrize():
    a = np.arange(9.0).reshape(3, 3)
    np.testing.assert_array_equal(np.asarray(symmetrize(a)), (a + a.T) / 2)
