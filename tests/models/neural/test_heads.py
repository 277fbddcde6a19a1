"""Emission heads: densities against scipy with the same readout, data checks, encodings,
data-driven biases, and the neural base's two likelihood paths for every head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as st

import statseq as ss
from statseq.models.neural.heads import EMISSIONS, MIN_SCALE, make_head

F = 3
RNG = np.random.default_rng(0)
H = RNG.normal(size=(7, F))  # a batch of 7 feature vectors


def softplus(x):
    return np.log1p(np.exp(x))


def random_params(head):
    shapes = head.param_shapes()
    leaves = [RNG.normal(size=s) * 0.5 for s in shapes]
    params = type(shapes)(*leaves)
    if hasattr(params, "df"):
        params = params._replace(df=2.0 + np.exp(leaves[2]))
    if hasattr(params, "concentration"):
        params = params._replace(concentration=np.exp(leaves[2]))
    return jax.tree.map(jnp.asarray, params)


def reference_log_prob(emission, params, h, y, dim, scalar):
    """Independent log-density with scipy from the readout written out."""
    eta = h @ np.asarray(params.weight).T + np.asarray(params.bias)
    if emission in ("gaussian", "student_t"):
        loc, scale = eta[:, :dim], softplus(eta[:, dim:]) + MIN_SCALE
        if emission == "gaussian":
            lp = st.norm.logpdf(y, loc, scale)
        else:
            lp = st.t.logpdf(y, np.asarray(params.df), loc, scale)
    elif emission == "poisson":
        lp = st.poisson.logpmf(y, np.exp(eta))
    elif emission == "negative_binomial":
        mu, c = np.exp(eta), np.asarray(params.concentration)
        lp = st.nbinom.logpmf(y, c, c / (c + mu))
    elif emission == "bernoulli":
        lp = st.bernoulli.logpmf(y, 1 / (1 + np.exp(-eta)))
    else:
        logp = eta - np.log(np.exp(eta).sum(-1, keepdims=True))
        return logp[np.arange(len(y)), y.astype(int)]
    return lp[:, 0] if scalar else lp.sum(-1)


def sample_y(emission, shape):
    if emission in ("gaussian", "student_t"):
        return RNG.normal(size=shape)
    if emission in ("poisson", "negative_binomial"):
        return RNG.poisson(2.0, size=shape)
    if emission == "bernoulli":
        return RNG.integers(0, 2, size=shape)
    return RNG.integers(0, 4, size=shape)


@pytest.mark.parametrize("emission", EMISSIONS)
@pytest.mark.parametrize("emission_dim", [None, 2])
def test_density_matches_scipy(emission, emission_dim):
    if emission == "categorical" and emission_dim is not None:
        pytest.skip("categorical is scalar")
    head = make_head(emission, feature_dim=F, emission_dim=emission_dim,
                     num_classes=4 if emission == "categorical" else None)
    params = random_params(head)
    dim = 1 if emission_dim is None else emission_dim
    y = sample_y(emission, (7,) + head.event_shape)
    d = head.distribution(params, jnp.asarray(H))
    assert d.batch_shape == (7,) and d.event_shape == head.event_shape
    got = np.asarray(d.log_prob(jnp.asarray(y)))
    y2 = y.reshape(7, -1) if emission != "categorical" else y
    ref = reference_log_prob(emission, params, H, y2, dim, emission_dim is None)
    # numpyro's NegativeBinomial2 (GammaPoisson) evaluates betaln by an approximation
    # good to ~1e-8 relative for small concentrations; everything else is exact to rounding
    rtol = 1e-6 if emission == "negative_binomial" else 1e-10
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=1e-12)


@pytest.mark.parametrize(
    ("emission", "bad", "match"),
    [
        ("poisson", [1, -1, 0], "non-negative integer"),
        ("negative_binomial", [1.5, 1, 0], "non-negative integer"),
        ("bernoulli", [0, 2, 1], "binary"),
        ("categorical", [0, 3, 1], "categories in 0..2"),
        ("categorical", [0, -1, 1], "categories in 0..2"),
    ],
)
def test_invalid_data_is_rejected_naming_y(emission, bad, match):
    model = ss.GRU(hidden_dim=2, emission=emission,
                   num_classes=3 if emission == "categorical" else None)
    params = model.initialize(np.zeros(3, int), key=jax.random.key(0))
    with pytest.raises(ValueError, match=match) as err:
        ss.log_prob(model, params, np.array(bad))
    assert str(err.value).startswith("y ")
    # a masked invalid value is not an observation and is accepted
    mask = np.ones(3, bool)
    mask[[i for i, v in enumerate(bad) if v not in (0, 1)][0]] = False
    assert np.isfinite(float(ss.log_prob(model, params, np.where(mask, bad, 0), mask=mask)))


def test_config_errors():
    with pytest.raises(ValueError, match="emission must be one of"):
        ss.LSTM(emission="gamma")
    with pytest.raises(ValueError, match="needs num_classes"):
        ss.LSTM(emission="categorical")
    with pytest.raises(ValueError, match="num_classes is only"):
        ss.LSTM(num_classes=3)
    with pytest.raises(ValueError, match="scalar series"):
        ss.LSTM(emission="categorical", num_classes=3, emission_dim=2)
    with pytest.raises(ValueError, match="hidden_dim"):
        ss.GRU(hidden_dim=0)


def test_encoding_of_observations():
    head = make_head("poisson", feature_dim=2, emission_dim=2)
    enc = head.encode(jnp.array([3, 5]), jnp.array([True, False]))
    np.testing.assert_allclose(np.asarray(enc), [np.log(4.0), 0.0, 1.0, 0.0])
    cat = make_head("categorical", feature_dim=2, num_classes=3)
    np.testing.assert_allclose(np.asarray(cat.encode(jnp.array(2), jnp.array(True))),
                               [0, 0, 1, 1])
    np.testing.assert_allclose(np.asarray(cat.encode(jnp.array(2), jnp.array(False))),
                               [0, 0, 0, 0])


@pytest.mark.parametrize("emission", EMISSIONS)
def test_initial_head_matches_marginal_law(emission):
    """With zero readout weights the initialized predictive has the data's mean."""
    y = sample_y(emission, (400,))
    model = ss.GRU(hidden_dim=3, emission=emission,
                   num_classes=4 if emission == "categorical" else None)
    params = model.initialize(y, key=jax.random.key(1))
    head = params.head._replace(weight=jnp.zeros_like(params.head.weight))
    d = model.head.distribution(head, jnp.zeros(3))
    if emission == "categorical":
        freq = (np.bincount(y, minlength=4) + 1) / (len(y) + 4)
        np.testing.assert_allclose(np.asarray(d.probs), freq, rtol=1e-10)
    elif emission == "student_t":
        np.testing.assert_allclose(float(d.loc), y.mean(), rtol=1e-10)
        np.testing.assert_allclose(float(d.scale), y.std(), rtol=1e-8)
    else:
        np.testing.assert_allclose(float(d.mean), y.mean(), rtol=1e-8)
    if emission == "gaussian":
        np.testing.assert_allclose(float(d.scale), y.std(), rtol=1e-8)
    if emission == "negative_binomial":
        # moment matching: var = mu + mu^2 / c (Poisson data: c is large or the cap)
        assert float(d.base_dist.concentration if hasattr(d, "base_dist")
                     else d.concentration) > 1.0


@pytest.mark.parametrize("emission", EMISSIONS)
def test_fast_path_equals_filter_for_every_head(emission):
    dim = None if emission == "categorical" else 2
    model = ss.LSTM(hidden_dim=3, emission=emission, emission_dim=dim, input_dim=1,
                    num_classes=4 if emission == "categorical" else None)
    y = sample_y(emission, (2, 12) + model.event_shape)
    u = RNG.normal(size=(2, 12, 1))
    params = model.initialize(y, key=jax.random.key(2), inputs=u)
    fast = ss.filter(model, params, y, inputs=u)  # complete data: whole-sequence path
    slow = ss.filter(model, params, y, inputs=u, return_carries=True)  # per-step scan
    np.testing.assert_allclose(np.asarray(fast.log_probs), np.asarray(slow.log_probs),
                               rtol=1e-12, atol=1e-12)
    for a, b in zip(jax.tree.leaves(fast.final_carry), jax.tree.leaves(slow.final_carry),
                    strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)
