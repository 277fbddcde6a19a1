"""Conversion to and from dynamax: round trips are exact and the likelihood is preserved.

The meaning check is independent of the conversion code: dynamax evaluates the converted
model's likelihood with its own filters (``marginal_log_prob``) and statseq with its own,
on the same data, in float64; both are exact, so they agree to rounding (1e-10).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.models.hmm import HMMParams
from statseq.models.hmm.bernoulli import BernoulliEmissions
from statseq.models.hmm.categorical import CategoricalEmissions
from statseq.models.hmm.gaussian import (
    DiagonalGaussianEmissions,
    GaussianEmissions,
    SphericalGaussianEmissions,
    TiedGaussianEmissions,
)
from statseq.models.hmm.poisson import PoissonEmissions

dhmm = pytest.importorskip("dynamax.hidden_markov_model")
dlgssm = pytest.importorskip("dynamax.linear_gaussian_ssm")

T = 12  # time steps of every test series
K = 3  # hidden states


def _simplex(rng, *shape):
    return jnp.asarray(rng.dirichlet(np.ones(shape[-1]), size=shape[:-1]))


def _spd(rng, d, *lead):
    a = rng.normal(size=lead + (d, d))
    return jnp.asarray(a @ np.swapaxes(a, -1, -2) / d + 0.5 * np.eye(d))


def _hmm_params(rng, emissions):
    return HMMParams(_simplex(rng, K), _simplex(rng, K, K), emissions)


def _case(name, rng):
    """``(model, params, y, inputs)`` of a statseq model with random parameters and data."""
    if name == "lgssm":
        n, d, m = 2, 3, 2
        model = ss.LinearGaussianSSM(state_dim=n, emission_dim=d, input_dim=m)
        params = ss.LGSSMParams(
            initial_mean=jnp.asarray(rng.normal(size=n)), initial_cov=_spd(rng, n),
            dynamics_weights=jnp.asarray(0.4 * rng.normal(size=(n, n))),
            dynamics_input_weights=jnp.asarray(rng.normal(size=(n, m))),
            dynamics_bias=jnp.asarray(rng.normal(size=n)), dynamics_cov=_spd(rng, n),
            emission_weights=jnp.asarray(rng.normal(size=(d, n))),
            emission_input_weights=jnp.asarray(rng.normal(size=(d, m))),
            emission_bias=jnp.asarray(rng.normal(size=d)), emission_cov=_spd(rng, d),
        )
        return model, params, rng.normal(size=(T, d)), rng.normal(size=(T, m))
    if name == "lgssm_scalar":
        model = ss.LinearGaussianSSM(state_dim=2, emission_dim=None)
        params = model.default_params()._replace(
            emission_weights=jnp.asarray([[1.0, -0.5]]), emission_bias=jnp.asarray([0.3]))
        return model, params, rng.normal(size=T), None
    if name == "categorical":
        model = ss.CategoricalHMM(num_states=K, num_classes=4)
        return (model, _hmm_params(rng, CategoricalEmissions(_simplex(rng, K, 4))),
                rng.integers(0, 4, size=T), None)
    if name == "gaussian_full":
        model = ss.GaussianHMM(num_states=K, emission_dim=2, covariance="full")
        emissions = GaussianEmissions(jnp.asarray(rng.normal(size=(K, 2))), _spd(rng, 2, K))
        return model, _hmm_params(rng, emissions), rng.normal(size=(T, 2)), None
    if name == "gaussian_diagonal":
        model = ss.GaussianHMM(num_states=K, emission_dim=2, covariance="diagonal")
        emissions = DiagonalGaussianEmissions(jnp.asarray(rng.normal(size=(K, 2))),
                                              jnp.asarray(rng.uniform(0.3, 2.0, (K, 2))))
        return model, _hmm_params(rng, emissions), rng.normal(size=(T, 2)), None
    if name == "gaussian_tied":
        model = ss.GaussianHMM(num_states=K, emission_dim=2, covariance="tied")
        emissions = TiedGaussianEmissions(jnp.asarray(rng.normal(size=(K, 2))),
                                          _spd(rng, 2, 1)[0])
        return model, _hmm_params(rng, emissions), rng.normal(size=(T, 2)), None
    if name == "gaussian_spherical":
        model = ss.GaussianHMM(num_states=K, emission_dim=2, covariance="spherical")
        emissions = SphericalGaussianEmissions(jnp.asarray(rng.normal(size=(K, 2))),
                                               jnp.asarray(rng.uniform(0.3, 2.0, K)))
        return model, _hmm_params(rng, emissions), rng.normal(size=(T, 2)), None
    if name == "poisson_scalar":
        model = ss.PoissonHMM(num_states=K)
        emissions = PoissonEmissions(jnp.asarray(rng.uniform(0.5, 6.0, K)))
        return model, _hmm_params(rng, emissions), rng.poisson(3.0, size=T), None
    if name == "poisson_vector":
        model = ss.PoissonHMM(num_states=K, emission_dim=2)
        emissions = PoissonEmissions(jnp.asarray(rng.uniform(0.5, 6.0, (K, 2))))
        return model, _hmm_params(rng, emissions), rng.poisson(3.0, size=(T, 2)), None
    if name == "bernoulli":
        model = ss.BernoulliHMM(num_states=K, emission_dim=3)
        emissions = BernoulliEmissions(jnp.asarray(rng.uniform(0.1, 0.9, (K, 3))))
        return model, _hmm_params(rng, emissions), rng.integers(0, 2, size=(T, 3)), None
    raise AssertionError(name)


CASES = ["lgssm", "lgssm_scalar", "categorical", "gaussian_full", "gaussian_diagonal",
         "gaussian_tied", "gaussian_spherical", "poisson_scalar", "poisson_vector", "bernoulli"]


@pytest.fixture(autouse=True)
def _exact_dynamax_kalman_filter(monkeypatch):
    """dynamax's Kalman filter adds ``1e-9 I`` to every matrix it inverts (``psd_solve``'s
    ``diagonal_boost``), which moves its log-likelihood by ~1e-9 relative; without it both
    filters are exact and agree to rounding."""
    from dynamax.linear_gaussian_ssm import inference
    from dynamax.utils.utils import psd_solve

    monkeypatch.setattr(inference, "psd_solve", partial(psd_solve, diagonal_boost=0.0))


def _dynamax_log_prob(dmodel, dparams, y, inputs):
    y = jnp.reshape(jnp.asarray(y), (T, -1))
    inputs = None if inputs is None else jnp.asarray(inputs)
    return float(dmodel.marginal_log_prob(dparams, y, inputs=inputs))


def _assert_trees_equal(a, b, rtol=0.0):
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, z in zip(leaves_a, leaves_b, strict=True):
        assert np.shape(x) == np.shape(z)
        np.testing.assert_allclose(np.asarray(x), np.asarray(z), rtol=rtol, atol=0.0)


@pytest.mark.parametrize("name", CASES)
def test_to_dynamax_preserves_the_likelihood_and_round_trips(name, rng):
    model, params, y, inputs = _case(name, rng)
    dmodel, dparams = ss.to_dynamax(model, params)
    expected = float(ss.log_prob(model, params, y, inputs=inputs))
    assert np.isfinite(expected)
    assert _dynamax_log_prob(dmodel, dparams, y, inputs) == pytest.approx(expected, abs=1e-10)

    back_model, back_params = ss.from_dynamax(
        dmodel, dparams, scalar=model.event_shape == () and name != "categorical")
    assert back_model == model
    # variances -> standard deviations -> variances is exact up to two roundings
    _assert_trees_equal(back_params, params, rtol=4 * np.finfo(float).eps
                        if name in ("gaussian_diagonal", "gaussian_spherical") else 0.0)


DYNAMAX_MODELS = {
    "lgssm": lambda: dlgssm.LinearGaussianSSM(state_dim=2, emission_dim=3, input_dim=1),
    "lgssm_no_bias": lambda: dlgssm.LinearGaussianSSM(
        state_dim=2, emission_dim=2, has_dynamics_bias=False, has_emissions_bias=False),
    "categorical": lambda: dhmm.CategoricalHMM(K, emission_dim=1, num_classes=4),
    "gaussian_full": lambda: dhmm.GaussianHMM(K, emission_dim=2),
    "gaussian_diagonal": lambda: dhmm.DiagonalGaussianHMM(K, emission_dim=2),
    "gaussian_tied": lambda: dhmm.SharedCovarianceGaussianHMM(K, emission_dim=2),
    "gaussian_spherical": lambda: dhmm.SphericalGaussianHMM(K, emission_dim=2),
    "poisson": lambda: dhmm.PoissonHMM(K, emission_dim=2),
    "bernoulli": lambda: dhmm.BernoulliHMM(K, emission_dim=3),
}


def _dynamax_data(name, dmodel, rng):
    if name.startswith("lgssm"):
        inputs = rng.normal(size=(T, dmodel.input_dim)) if dmodel.input_dim else None
        return rng.normal(size=(T, dmodel.emission_dim)), inputs
    if name == "categorical":
        return rng.integers(0, 4, size=(T, 1)), None
    if name.startswith("gaussian"):
        return rng.normal(size=(T, 2)), None
    if name == "poisson":
        return rng.poisson(3.0, size=(T, 2)), None
    return rng.integers(0, 2, size=(T, 3)), None


@pytest.mark.parametrize("name", sorted(DYNAMAX_MODELS))
def test_from_dynamax_preserves_the_likelihood_and_round_trips(name, rng):
    dmodel = DYNAMAX_MODELS[name]()
    if name.startswith("lgssm"):
        dparams, _ = dmodel.initialize(
            jax.random.key(1), dynamics_weights=jnp.asarray([[0.8, 0.1], [-0.2, 0.7]]),
            **({"dynamics_input_weights": jnp.asarray(rng.normal(size=(2, 1))),
                "dynamics_bias": jnp.asarray(rng.normal(size=2)),
                "emission_input_weights": jnp.asarray(rng.normal(size=(3, 1))),
                "emission_bias": jnp.asarray(rng.normal(size=3))} if name == "lgssm" else {}))
    else:
        dparams, _ = dmodel.initialize(jax.random.key(1))  # draws from dynamax's prior
    y, inputs = _dynamax_data(name, dmodel, rng)
    model, params = ss.from_dynamax(dmodel, dparams)
    y_statseq = y[:, 0] if name == "categorical" else y
    expected = _dynamax_log_prob(dmodel, dparams, y, inputs)
    assert float(ss.log_prob(model, params, y_statseq, inputs=inputs)) == pytest.approx(
        expected, abs=1e-10)

    again_model, again_params = ss.to_dynamax(model, params)
    assert type(again_model) is type(dmodel)
    for attr in ("num_states", "emission_dim", "state_dim", "input_dim"):
        assert getattr(again_model, attr, None) == getattr(dmodel, attr, None)
    if name == "categorical":
        assert again_model.emission_component.num_classes == 4
    if name == "lgssm_no_bias":  # dynamax's absent biases come back as zero biases
        assert float(jnp.abs(again_params.dynamics.bias).max()) == 0.0
        assert float(jnp.abs(again_params.emissions.bias).max()) == 0.0
        dparams = dparams._replace(
            dynamics=dparams.dynamics._replace(bias=again_params.dynamics.bias),
            emissions=dparams.emissions._replace(bias=again_params.emissions.bias))
    rtol = (4 * np.finfo(float).eps if name in ("gaussian_diagonal", "gaussian_spherical")
            else 0.0)
    _assert_trees_equal(again_params, dparams, rtol=rtol)


def test_scalar_option_gives_statseq_scalar_models(rng):
    dmodel = dhmm.PoissonHMM(K, emission_dim=1)
    dparams, _ = dmodel.initialize(jax.random.key(2))
    model, params = ss.from_dynamax(dmodel, dparams, scalar=True)
    assert model.event_shape == () and params.emissions.rates.shape == (K,)
    y = rng.poisson(2.0, size=T)
    assert float(ss.log_prob(model, params, y)) == pytest.approx(
        _dynamax_log_prob(dmodel, dparams, y, None), abs=1e-10)


def test_diagonal_emission_covariance_vector_is_accepted(rng):
    dmodel = dlgssm.LinearGaussianSSM(state_dim=2, emission_dim=2)
    dparams, _ = dmodel.initialize(jax.random.key(3))
    diag = jnp.asarray([0.3, 0.7])
    diag_params = dparams._replace(emissions=dparams.emissions._replace(cov=diag))
    model, params = ss.from_dynamax(dmodel, diag_params)
    np.testing.assert_array_equal(params.emission_cov, np.diag([0.3, 0.7]))
    y = rng.normal(size=(T, 2))
    assert float(ss.log_prob(model, params, y)) == pytest.approx(
        _dynamax_log_prob(dmodel, diag_params, y, None), abs=1e-10)


# ------------------------------------------------------------------------------------------
# what does not convert


@pytest.mark.parametrize("model, match", [
    (ss.LinearGaussianSSM(state_dim=1, initial="stationary"), "initial='stationary'"),
    (ss.LinearGaussianSSM(state_dim=1, initial="diffuse"), "initial='diffuse'"),
    (ss.TimeVaryingLinearGaussianSSM(state_dim=1, num_timesteps=3), "TimeVarying"),
    (ss.PoissonHMM(num_states=2, initial="stationary"), "initial='stationary'"),
    (ss.PoissonHMM(num_states=2, input_dim=1), "input_dim=1"),
])
def test_to_dynamax_rejects_what_dynamax_cannot_express(model, match):
    with pytest.raises(ValueError, match=match):
        ss.to_dynamax(model, None)


def test_to_dynamax_rejects_models_without_a_twin():
    model = ss.AR(order=1)
    with pytest.raises(TypeError, match="AR has no dynamax counterpart"):
        ss.to_dynamax(model, model.default_params())


def test_autoregressive_hmms_are_not_converted_either_way():
    """The two libraries' AR-HMMs treat the first num_lags steps differently."""
    from statseq.models.hmm.autoregressive import LinearAutoregressiveHMM

    with pytest.raises(TypeError, match="conditions on the first num_lags"):
        ss.to_dynamax(LinearAutoregressiveHMM(num_states=2, emission_dim=1), None)
    dmodel = dhmm.LinearAutoregressiveHMM(2, emission_dim=1, num_lags=1)
    with pytest.raises(TypeError, match="conditions on the first num_lags"):
        ss.from_dynamax(dmodel, None)


def test_to_dynamax_checks_params():
    model = ss.LinearGaussianSSM(state_dim=2)
    bad = model.default_params()._replace(dynamics_weights=jnp.eye(3))
    with pytest.raises(ValueError, match="dynamics_weights must have shape"):
        ss.to_dynamax(model, bad)


def test_from_dynamax_rejects_what_statseq_cannot_express():
    mixture = dhmm.GaussianMixtureHMM(2, num_components=2, emission_dim=2)
    with pytest.raises(TypeError, match="GaussianMixtureHMM has no statseq counterpart"):
        ss.from_dynamax(mixture, None)

    several = dhmm.CategoricalHMM(2, emission_dim=2, num_classes=3)
    with pytest.raises(ValueError, match="emission_dim=2"):
        ss.from_dynamax(several, None)

    lgssm = dlgssm.LinearGaussianSSM(state_dim=1, emission_dim=1)
    params, _ = lgssm.initialize()
    varying = params._replace(dynamics=params.dynamics._replace(
        weights=jnp.full((T, 1, 1), 0.5)))
    with pytest.raises(ValueError, match="time-invariant"):
        ss.from_dynamax(lgssm, varying)

    bernoulli = dhmm.BernoulliHMM(2, emission_dim=1)
    with pytest.raises(ValueError, match="scalar=True applies"):
        ss.from_dynamax(bernoulli, None, scalar=True)


def test_conversion_reports_a_missing_dynamax(monkeypatch):
    monkeypatch.setitem(sys.modules, "dynamax.hidden_markov_model", None)
    model = ss.PoissonHMM(num_states=2)
    params = model.initialize(np.array([0, 1, 4, 2]), key=jax.random.key(0))
    with pytest.raises(ImportError, match="pip install dynamax"):
        ss.to_dynamax(model, params)
    with pytest.raises(ImportError, match="pip install dynamax"):
        ss.from_dynamax(object(), None)


def test_import_statseq_loads_neither_dynamax_nor_tfp():
    code = ("import sys, statseq; "
            "print(sorted({m.split('.')[0] for m in sys.modules} "
            "& {'dynamax', 'tensorflow_probability', 'tensorflow'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_converted_gaussian_hmm_keeps_statseq_only_defaults():
    model = ss.GaussianHMM(num_states=2, emission_dim=1, min_variance=0.0)
    params = HMMParams(jnp.asarray([0.5, 0.5]), jnp.asarray([[0.9, 0.1], [0.2, 0.8]]),
                       GaussianEmissions(jnp.asarray([[0.0], [3.0]]), jnp.ones((2, 1, 1))))
    back, _ = ss.from_dynamax(*ss.to_dynamax(model, params))
    assert back == dataclasses.replace(model, min_variance=back.min_variance)
    assert back.min_variance == ss.GaussianHMM.min_variance
