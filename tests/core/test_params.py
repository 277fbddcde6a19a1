"""Parameters: constraint bijections, free-parameter counts, priors, trainable masks."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import optax
import pytest
from scipy import stats

import statseq as ss
from statseq.core.params import param_names, trainable_mask, validate_priors

MODEL = ss.AR(order=2, emission_dim=3, input_dim=2)

# jitted: op-by-op dispatch of the bijections would compile dozens of tiny programs
to_unc = jax.jit(partial(ss.to_unconstrained, MODEL))
from_unc = jax.jit(partial(ss.from_unconstrained, MODEL))


def random_params(seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(3, 3))
    return ss.ARParams(
        coeffs=jnp.asarray(0.2 * rng.normal(size=(2, 3, 3))),
        intercept=jnp.asarray(rng.normal(size=3)),
        input_weights=jnp.asarray(rng.normal(size=(3, 2))),
        cov=jnp.asarray(a @ a.T + 0.5 * np.eye(3)),
    )


def test_unconstrained_round_trip():
    params = random_params()
    up = to_unc(params)
    # real leaves map by the identity, bit for bit
    for name in ("coeffs", "intercept", "input_weights"):
        np.testing.assert_array_equal(np.asarray(getattr(up, name)),
                                      np.asarray(getattr(params, name)))
    # a 3x3 covariance has 6 free scalars
    assert up.cov.shape == (6,)
    back = from_unc(up)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-14)
    # any unconstrained vector maps to a valid (symmetric positive definite) covariance
    rng = np.random.default_rng(1)
    up2 = jax.tree.map(lambda a: jnp.asarray(3.0 * rng.normal(size=a.shape)), up)
    cov = np.asarray(from_unc(up2).cov)
    np.testing.assert_allclose(cov, cov.T, atol=1e-12)
    assert np.all(np.linalg.eigvalsh(cov) > 0)
    # and back again
    again = to_unc(from_unc(up2))
    np.testing.assert_allclose(np.asarray(again.cov), np.asarray(up2.cov), rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (ss.AR(order=3), 3 + 1 + 0 + 1),
        (ss.AR(order=1, emission_dim=2), 4 + 2 + 0 + 3),
        (MODEL, 2 * 9 + 3 + 3 * 2 + 3 * 4 // 2),
    ],
)
def test_num_free_params(model, expected):
    assert ss.num_free_params(model) == expected
    assert ss.num_params(model) == expected
    # equals the size of the unconstrained parameter vector
    up = jax.eval_shape(partial(ss.to_unconstrained, model), model.default_params())
    assert sum(np.prod(leaf.shape, dtype=int) for leaf in jax.tree.leaves(up)) == expected


def test_num_free_params_with_frozen_leaves():
    frozen = ss.ARParams(coeffs=False, intercept=True, input_weights=True, cov=False)
    assert ss.num_free_params(MODEL, frozen) == 3 + 6
    assert ss.num_params(MODEL, frozen) == 3 + 6


def test_param_names():
    assert param_names(MODEL) == ["coeffs", "intercept", "input_weights", "cov"]


def test_log_prior_equals_manual_sum():
    params = random_params(2)

    def priors():  # built inside jit: eager construction of a Wishart costs seconds
        return ss.ARParams(
            coeffs=dist.Normal(0.0, 0.5),
            intercept=dist.Normal(jnp.array([1.0, 0.0, -1.0]), 2.0),
            input_weights=None,
            cov=dist.Wishart(concentration=5.0, scale_matrix=jnp.eye(3)),
        )

    got = float(jax.jit(lambda p: ss.log_prior(priors(), p))(params))
    p = jax.tree.map(np.asarray, params)
    expected = (
        stats.norm(0.0, 0.5).logpdf(p.coeffs).sum()
        + stats.norm([1.0, 0.0, -1.0], 2.0).logpdf(p.intercept).sum()
        + stats.wishart(df=5.0, scale=np.eye(3)).logpdf(p.cov)
    )
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert float(ss.log_prior(None, params)) == 0.0
    flat = ss.ARParams(None, None, None, None)
    assert float(ss.log_prior(flat, params)) == 0.0


def test_prior_validation():
    model = ss.AR(order=1)
    with pytest.raises(ValueError, match="priors must have the structure of params"):
        validate_priors(model, (dist.Normal(), None))
    with pytest.raises(TypeError, match="prior leaves must be numpyro distributions"):
        validate_priors(model, ss.ARParams(1.0, None, None, None))
    with pytest.raises(TypeError, match="prior leaves"):
        ss.fit_sgd(model, model.default_params(), np.zeros(5), optimizer=optax.sgd(0.1),
                   num_steps=1, key=jax.random.key(0), progress=False,
                   priors=ss.ARParams("normal", None, None, None))


def test_trainable_mask_validation():
    params = random_params()
    assert trainable_mask(params) == ss.ARParams(True, True, True, True)
    ok = trainable_mask(params, ss.ARParams(False, True, np.bool_(True), False))
    assert ok == ss.ARParams(False, True, True, False)
    with pytest.raises(ValueError, match="trainable must have the structure of params"):
        trainable_mask(params, (True, False))
    with pytest.raises(ValueError, match="trainable must have the structure"):
        trainable_mask(params, {"coeffs": True})
    with pytest.raises(TypeError, match="trainable leaves must be True or False"):
        trainable_mask(params, ss.ARParams(True, True, True, "yes"))
    with pytest.raises(TypeError, match="trainable leaves must be True or False"):
        trainable_mask(params, ss.ARParams(True, 1, True, True))
    with pytest.raises(ValueError, match="trainable must have the structure"):
        ss.fit_sgd(ss.AR(order=1), ss.AR(order=1).default_params(), np.zeros(5),
                   optimizer=optax.sgd(0.1), num_steps=1, key=jax.random.key(0),
                   progress=False, trainable=(True,))
