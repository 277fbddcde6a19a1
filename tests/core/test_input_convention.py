"""One input convention for every model (issue 20, point 5).

A 1-D array, a pandas ``Series`` and a one-column ``DataFrame`` are one series for every
model whose observations are scalars (``event_shape == ()``) or one-dimensional vectors
(``event_shape == (1,)``), and give the same log-likelihood as the canonical shape
``(num_timesteps,) + event_shape``; shapes that really are ambiguous (a NumPy ``(n, 1)``
array for a scalar model: ``n`` sequences of one step, or one column?) are refused with a
message naming the accepted shapes. Every entry point that takes ``y`` goes through the same
validation, so each is checked on a ``(1,)`` model and a scalar model.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pandas as pd
import pytest

import statseq as ss
from statseq.core.validation import accepted_shapes

T = 24
INDEX = pd.date_range("2001-01-01", periods=T, freq="MS")


def _real(seed=0):
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.normal(size=T)) * 0.3 + rng.normal(size=T)


def _specs():
    """(model, 1-D data) for a small scalar or (1,)-event instance of every registered model."""
    rng = np.random.default_rng(3)
    y, counts = _real(), rng.poisson(3.0, size=T).astype(float)
    binary = (rng.random(T) < 0.4).astype(float)
    cats = rng.integers(0, 3, size=T).astype(float)
    return {
        "PoissonHMM": (ss.PoissonHMM(num_states=2), counts),
        "GaussianHMM": (ss.GaussianHMM(num_states=2), y),
        "LinearAutoregressiveHMM": (ss.LinearAutoregressiveHMM(num_states=2), y),
        "BernoulliHMM": (ss.BernoulliHMM(num_states=2), binary),
        "CategoricalHMM": (ss.CategoricalHMM(num_states=2, num_classes=3), cats),
        "LinearGaussianSSM": (ss.LinearGaussianSSM(state_dim=1), y),
        "TimeVaryingLinearGaussianSSM": (
            ss.TimeVaryingLinearGaussianSSM(state_dim=1, emission_dim=1, num_timesteps=T), y),
        "StructuralModel": (ss.StructuralModel((ss.Trend(slope=True),)), y),
        "LocalLevel": (ss.LocalLevel(), y),
        "LocalLinearTrend": (ss.LocalLinearTrend(), y),
        "AR": (ss.AR(order=1), y),
        "LRU": (ss.LRU(hidden_dim=3, state_dim=2), y),
        "Mamba": (ss.Mamba(hidden_dim=3, state_dim=2), y),
        "WaveNet": (ss.WaveNet(hidden_dim=3, num_layers=2), y),
        "S4D": (ss.S4D(hidden_dim=3, state_dim=2), y),
        "S5": (ss.S5(hidden_dim=3, state_dim=2), y),
        "NGRC": (ss.NGRC(num_lags=2), y),
        "LinearAttention": (ss.LinearAttention(hidden_dim=4, num_heads=2), y),
        "AFT": (ss.AFT(hidden_dim=3), y),
        "RWKV": (ss.RWKV(hidden_dim=3, num_layers=1, ffn_dim=3), y),
        "MLSTM": (ss.MLSTM(hidden_dim=2, num_layers=1, num_heads=1, expand=1), y),
        "Transformer": (ss.Transformer(hidden_dim=2, num_layers=1, num_heads=1, max_len=8,
                                       mlp_ratio=1), y),
        "ElmanRNN": (ss.ElmanRNN(hidden_dim=3), y),
        "GRU": (ss.GRU(hidden_dim=3), y),
        "LSTM": (ss.LSTM(hidden_dim=3), y),
        "MarkovSwitchingAR": (ss.MarkovSwitchingAR(num_regimes=2, order=1), y),
        "SwitchingLDS": (ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None), y),
        "DeepStateSpace": (ss.DeepStateSpace(input_dim=1, hidden_dim=2), y),
        "EncoderDecoder": (ss.EncoderDecoder(encoder=ss.ElmanRNN(hidden_dim=2),
                                             context_length=8), y),
    }


SPECS = _specs()
# covariates of the models that need them (the same for every form of y)
INPUTS = {"DeepStateSpace": np.sin(np.arange(T) / 3.0)[:, None]}


def test_every_registered_model_is_covered():
    assert set(SPECS) == set(ss.registered_models())
    for name, (model, _) in SPECS.items():
        assert type(model).__name__ == name
        assert tuple(model.event_shape) in ((), (1,)), name


@functools.cache
def _cached_params(name):
    """`_params` of ``SPECS[name]``, once per module (three tests use the same point, so
    the initializers compile once)."""
    model, y = SPECS[name]
    return _params(model, y[:, None] if tuple(model.event_shape) == (1,) else y,
                   INPUTS.get(name))


def _params(model, canon, inputs=None):
    if hasattr(model, "initialize"):
        try:
            if inputs is not None:
                return model.initialize(canon, key=jax.random.key(0), inputs=inputs)
            return model.initialize(canon, key=jax.random.key(0))
        except (TypeError, NotImplementedError):
            pass
    return model.default_params()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_series_1d_and_canonical_give_identical_log_prob(name):
    model, y = SPECS[name]
    canon = y[:, None] if tuple(model.event_shape) == (1,) else y
    params = _cached_params(name)
    u = INPUTS.get(name)
    ref = float(ss.log_prob(model, params, canon, inputs=u))
    assert np.isfinite(ref)
    forms = {
        "1-D array": y,
        "Series": pd.Series(y, index=INDEX),
        "one-column DataFrame": pd.DataFrame({"y": y}, index=INDEX),
        "list": list(y),
    }
    for form, value in forms.items():
        assert float(ss.log_prob(model, params, value, inputs=u)) == ref, form
    # a batch in the canonical convention: two copies, the same log-likelihood each
    batch = np.stack([canon, canon])
    ub = None if u is None else np.stack([u, u])
    np.testing.assert_allclose(np.asarray(ss.log_prob(model, params, batch, inputs=ub)),
                               [ref, ref],
                               rtol=1e-13)
    # a Series with a gap: NaN is a masked step, as an explicit mask on the 1-D array
    if not isinstance(model, ss.TimeVaryingLinearGaussianSSM | ss.LinearAutoregressiveHMM
                      | ss.AR | ss.MarkovSwitchingAR):  # (these refuse gaps in their lags)
        gappy = pd.Series(y, index=INDEX)
        gappy.iloc[5] = np.nan
        mask = np.ones(T, bool)
        mask[5] = False
        assert float(ss.log_prob(model, params, gappy, inputs=u)) == pytest.approx(
            float(ss.log_prob(model, params, y, mask=mask, inputs=u)), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_ambiguous_or_wrong_shapes_name_the_accepted_shapes(name):
    model, y = SPECS[name]
    params = _cached_params(name)
    u = INPUTS.get(name)
    accepted = accepted_shapes(model)
    if model.event_shape == ():
        bad = [y[:, None],                         # a column: T sequences of one step?
               np.stack([y, y])[..., None]]        # (2, T, 1): the same question per sequence
    else:
        bad = [np.stack([y, y]),                   # (2, T): two series needs (2, T, 1)
               np.stack([y, y, y], axis=-1)]       # (T, 3): three columns, not one
    for value in bad:
        with pytest.raises(ValueError) as info:
            ss.log_prob(model, params, value, inputs=u)
        message = str(info.value)
        assert "Accepted: " + accepted in message, message
        assert str(tuple(value.shape)) in message


def test_accepted_shapes_text_per_event_shape():
    assert accepted_shapes(ss.AR(order=1)).startswith("(num_timesteps,) for one series")
    assert "(num_sequences, num_timesteps) for a batch" in accepted_shapes(ss.AR(order=1))
    one = accepted_shapes(ss.GaussianHMM(num_states=2))
    assert one.startswith("(num_timesteps,) or (num_timesteps, 1) for one series")
    assert "(num_sequences, num_timesteps, 1) for a batch" in one
    two = accepted_shapes(ss.GaussianHMM(num_states=2, emission_dim=2))
    assert two.startswith("(num_timesteps, 2) for one series")
    # a Series for a model of 2-vectors is refused, naming what is accepted
    model = ss.GaussianHMM(num_states=2, emission_dim=2)
    params = model.initialize(np.stack([_real(), _real(1)], -1), key=jax.random.key(0))
    with pytest.raises(ValueError, match="Accepted: "):
        ss.log_prob(model, params, pd.Series(_real(), index=INDEX))


def _entry_points(model, params, canon):
    """Every entry point that takes y, as a function of the data form -> a number/array."""
    key = jax.random.key(1)
    scalar = model.event_shape == ()

    def part(y, a, b):
        return y.iloc[a:b] if isinstance(y, pd.Series | pd.DataFrame) else y[a:b]

    calls = {
        "log_prob": lambda y: ss.log_prob(model, params, y),
        "filter": lambda y: ss.filter(model, params, y).log_probs,
        "fit_lbfgs": lambda y: ss.fit_lbfgs(model, params, y, num_iters=2,
                                            progress=False).log_joint,
        "forecast": lambda y: ss.forecast(model, params, y, num_steps=2, num_samples=3,
                                          key=key).samples,
        "information_criteria": lambda y: ss.information_criteria(model, params, y)["aic"],
        "log_score": lambda y: ss.log_score(model, params, part(y, 0, 16), part(y, 16, T)),
        "log_predictive_density": lambda y: ss.log_predictive_density(
            model, params, part(y, 0, 16), part(y, 16, 19), marginal=True),
        "backtest": lambda y: ss.backtest(model, params, y, horizon=2, initial=20,
                                          num_samples=4, key=key).table["log_score"].to_numpy(),
        "pit": lambda y: ss.pit(model, params, y),
        "quantile_residuals": lambda y: ss.quantile_residuals(model, params, y),
        "standardized_residuals": lambda y: ss.standardized_residuals(model, params, y),
        "diagnose": lambda y: ss.diagnose(model, params, y).tests.select_dtypes(
            "number").to_numpy(),
        "standard_errors": lambda y: ss.standard_errors(model, params, y),
        # the point-mass guide: the data path is the same as AutoNormal's (the y forms
        # meet prepare_joint alike), its program compiles in about half the time
        "fit_svi": lambda y: ss.fit_svi(model, y, key=key, num_steps=2, num_samples=2,
                                        guide="delta", progress=False).losses,
    }
    if hasattr(model, "e_step"):
        calls["fit_em"] = lambda y: ss.fit_em(model, params, y, num_iters=2,
                                              progress=False).log_joint
    if not scalar:
        calls["smoother"] = lambda y: model.smoother(params, y)
    return calls


def _numbers(value):
    if hasattr(value, "_asdict"):
        value = tuple(value._asdict().values())
    leaves = jax.tree.leaves(value)
    return [np.asarray(leaf, float) for leaf in leaves if np.ndim(leaf) or np.isscalar(leaf)]


@pytest.mark.parametrize("name", ["GaussianHMM", "AR"])
def test_every_entry_point_takes_the_same_forms(name):
    model, y = SPECS[name]
    canon = y[:, None] if tuple(model.event_shape) == (1,) else y
    params = _cached_params(name)  # model.initialize(canon, key=jax.random.key(0))
    if name != "GaussianHMM":  # a fitted point, so that standard errors exist
        params = ss.fit_lbfgs(model, params, canon, progress=False).params
    forms = {"1-D array": y, "Series": pd.Series(y, index=INDEX)}
    for entry, call in _entry_points(model, params, canon).items():
        try:
            ref = _numbers(call(canon))
        except ValueError as err:
            # refused on the canonical shape (standardized residuals of a non-Gaussian
            # predictive, standard errors off a maximum): refused alike on every form
            for form, value in forms.items():
                with pytest.raises(ValueError) as info:
                    call(value)
                assert str(info.value) == str(err), (entry, form)
            continue
        for form, value in forms.items():
            got = _numbers(call(value))
            assert len(got) == len(ref), (entry, form)
            for a, b in zip(got, ref, strict=True):
                np.testing.assert_allclose(a.ravel(), b.ravel(), rtol=1e-10, atol=1e-12,
                                           err_msg=f"{entry} ({form})")
