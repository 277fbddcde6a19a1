"""Eager input validation: every bad input raises a ValueError/TypeError naming the culprit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss

T = 114  # the length of the lynx series: shares compiled programs with the AR tests
SCALAR = ss.AR(order=1)
VECTOR = ss.AR(order=1, emission_dim=2)
ARX = ss.AR(order=1, input_dim=1)
Y = np.linspace(-1.0, 1.0, T)
YV = np.stack([Y, Y[::-1]], axis=-1)
U = np.ones((T, 1))


@pytest.mark.parametrize(
    ("model", "y", "match"),
    [
        (SCALAR, np.float64(1.0), r"y must have shape \(\.\.\., num_timesteps\)"),
        (VECTOR, Y, r"y must have shape \(\.\.\., num_timesteps, 2\)"),
        (VECTOR, np.zeros((T, 3)), r"observations of shape \(3,\).*expects \(2,\)"),
        (SCALAR, np.zeros((0,)), "num_timesteps = 0"),
        (VECTOR, np.zeros((2, 0, 2)), "num_timesteps = 0"),
    ],
)
def test_bad_y_shape(model, y, match):
    with pytest.raises(ValueError, match=match):
        ss.log_prob(model, model.default_params(), y)


def test_non_numeric_y():
    with pytest.raises(TypeError, match="y must be"):
        ss.log_prob(SCALAR, SCALAR.default_params(), np.array(["a"] * T))
    with pytest.raises(TypeError, match="y must be"):
        ss.log_prob(SCALAR, SCALAR.default_params(), np.array([object()] * T))


def test_nan_in_y_without_mask_names_position_and_fix():
    y = Y.copy()
    y[3] = np.nan
    with pytest.raises(ValueError, match=r"y has 1 non-finite.*index \(3,\).*missing_mask"):
        ss.log_prob(SCALAR, SCALAR.default_params(), y)
    yv = YV.copy()
    yv[4, 1] = np.inf
    with pytest.raises(ValueError, match=r"index \(4, 1\)"):
        ss.log_prob(VECTOR, VECTOR.default_params(), yv)


def test_nan_allowed_where_masked():
    params = SCALAR.default_params()
    y = Y.copy()
    y[3] = np.nan
    mask = ss.missing_mask(y)
    np.testing.assert_array_equal(mask, np.isfinite(y))
    got = float(ss.log_prob(SCALAR, params, y, mask=mask))
    assert np.isfinite(got)
    other = Y.copy()
    other[3] = 1e6  # any value at a masked position gives the same answer
    assert float(ss.log_prob(SCALAR, params, other, mask=mask)) == got
    # 0/1 integer masks are accepted and mean the same as booleans
    assert float(ss.log_prob(SCALAR, params, other, mask=mask.astype(int))) == got
    # and a masked step really is left out
    assert got != float(ss.log_prob(SCALAR, params, Y))


@pytest.mark.parametrize(
    ("model", "y", "mask", "match"),
    [
        (SCALAR, Y, np.ones(T + 1, bool), r"mask must have shape \(114,\)"),
        (SCALAR, Y, np.ones((T, 1), bool), r"mask must have shape \(114,\)"),
        (VECTOR, YV, np.ones((T, 3), bool), r"mask must have shape \(114,\).*or \(114, 2\)"),
        (SCALAR, Y, np.full(T, 2), "mask must be boolean"),
        (SCALAR, Y, np.full(T, 0.5), "mask must be boolean"),
    ],
)
def test_bad_mask(model, y, mask, match):
    with pytest.raises(ValueError, match=match):
        ss.log_prob(model, model.default_params(), y, mask=mask)


@pytest.mark.parametrize(
    ("model", "inputs", "match"),
    [
        (SCALAR, U, "takes no inputs"),
        (ARX, None, r"input_dim=1: pass inputs of shape"),
        (ARX, np.ones((T - 1, 1)), r"inputs must have shape.*\(114, 1\)"),
        (ARX, np.ones(T), r"inputs must have shape"),
        (ARX, np.ones((T, 2)), r"inputs must have shape"),
        (ARX, np.ones((3, T, 1)), "inputs have batch shape"),
        (ARX, np.where(np.arange(T)[:, None] == 2, np.nan, U), "inputs contain non-finite"),
    ],
)
def test_bad_inputs(model, inputs, match):
    with pytest.raises(ValueError, match=match):
        ss.log_prob(model, model.default_params(), Y, inputs=inputs)


def test_bad_future_inputs_in_sample_and_forecast():
    params = ARX.default_params()
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="input_dim=1"):
        ss.sample(ARX, params, num_timesteps=T, key=key)
    with pytest.raises(ValueError, match=r"inputs must end in shape \(114, 1\)"):
        ss.sample(ARX, params, num_timesteps=T, key=key, inputs=np.ones((T + 1, 1)))
    with pytest.raises(ValueError, match="non-finite"):
        ss.sample(ARX, params, num_timesteps=T, key=key, inputs=np.full((T, 1), np.inf))
    with pytest.raises(ValueError, match="takes no inputs"):
        ss.forecast(SCALAR, SCALAR.default_params(), Y, num_steps=2, num_samples=2, key=key,
                    future_inputs=np.ones((2, 1)))


def _replace(params, **kw):
    return params._replace(**{k: jnp.asarray(v) for k, v in kw.items()})


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"coeffs": np.zeros((2, 2, 2))}, ValueError, r"params.coeffs must have shape \(1, 2, 2\)"),
        ({"intercept": np.zeros(3)}, ValueError, r"params.intercept must have shape \(2,\)"),
        ({"intercept": np.array([0.0, np.nan])}, ValueError, "params.intercept contains"),
        ({"cov": np.array([[1.0, 2.0], [2.0, 1.0]])}, ValueError, "params.cov violates"),
        ({"cov": np.array([[1.0, 0.5], [0.0, 1.0]])}, ValueError, "params.cov violates"),
        ({"cov": np.array([[np.inf, 0.0], [0.0, 1.0]])}, ValueError, "params.cov contains"),
    ],
)
def test_invalid_params(change, exc, match):
    params = _replace(VECTOR.default_params(), **change)
    with pytest.raises(exc, match=match):
        ss.log_prob(VECTOR, params, YV)


def test_params_of_the_wrong_type():
    with pytest.raises(TypeError, match="params must be a ARParams"):
        ss.log_prob(VECTOR, tuple(VECTOR.default_params())[:3], YV)
    with pytest.raises(TypeError, match="params must be"):
        ss.log_prob(VECTOR, {"coeffs": 1.0}, YV)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"num_timesteps": 0}, ValueError, "num_timesteps must be >= 1"),
        ({"num_timesteps": 2.5}, TypeError, "num_timesteps must be an integer"),
        ({"num_timesteps": T, "num_samples": 0}, ValueError, "num_samples must be >= 1"),
    ],
)
def test_bad_sample_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ss.sample(SCALAR, SCALAR.default_params(), key=jax.random.key(0), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"num_steps": 0, "num_samples": 2}, ValueError, "num_steps"),
        ({"num_steps": 2, "num_samples": 0}, ValueError, "num_samples"),
        ({"num_steps": 2, "num_samples": 2.0}, TypeError, "num_samples"),
    ],
)
def test_bad_forecast_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ss.forecast(SCALAR, SCALAR.default_params(), Y, key=jax.random.key(0), **kwargs)


# ---- pandas input ----------------------------------------------------------------------
def test_pandas_series_nan_is_missing():
    """A pandas NaN is a missing value (masked), as mask=ss.missing_mask(y) would make it;
    a NumPy NaN at an observed position stays an error."""
    import pandas as pd

    params = SCALAR.default_params()
    y = Y.copy()
    y[[5, 50]] = np.nan
    series = pd.Series(y, index=pd.RangeIndex(T))
    expected = ss.log_prob(SCALAR, params, np.nan_to_num(y), mask=ss.missing_mask(y))
    np.testing.assert_allclose(ss.log_prob(SCALAR, params, series), expected, rtol=1e-12)
    step_mask = np.ones(T, bool)
    step_mask[7] = False  # combined with a user mask
    both = ss.missing_mask(y) & step_mask
    np.testing.assert_allclose(ss.log_prob(SCALAR, params, series, mask=step_mask),
                               ss.log_prob(SCALAR, params, np.nan_to_num(y), mask=both),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="non-finite"):
        ss.log_prob(SCALAR, params, y)


def test_pandas_dataframe_columns_are_emission_dims():
    import pandas as pd

    frame = pd.DataFrame(YV, columns=["up", "down"])
    params = VECTOR.default_params()
    np.testing.assert_allclose(ss.log_prob(VECTOR, params, frame),
                               ss.log_prob(VECTOR, params, YV), rtol=1e-12)
    frame.iloc[3, 1] = np.nan  # one entry missing: a per-entry mask
    mask = np.ones(YV.shape, bool)
    mask[3, 1] = False
    np.testing.assert_allclose(ss.log_prob(VECTOR, params, frame),
                               ss.log_prob(VECTOR, params, np.nan_to_num(frame.to_numpy()),
                                           mask=mask), rtol=1e-12)
    one = pd.DataFrame({"y": Y})  # one column for a scalar model: the series itself
    np.testing.assert_allclose(ss.log_prob(SCALAR, SCALAR.default_params(), one),
                               ss.log_prob(SCALAR, SCALAR.default_params(), Y), rtol=1e-12)
    with pytest.raises(ValueError, match="y is a DataFrame with 2 columns"):
        ss.log_prob(SCALAR, SCALAR.default_params(), frame)
    with pytest.raises(TypeError, match="y must hold numbers"):
        ss.log_prob(SCALAR, SCALAR.default_params(), pd.Series(["a"] * T))


def test_pandas_nullable_counts():
    import pandas as pd

    model = ss.PoissonHMM(num_states=2)
    counts = np.arange(T) % 7
    params = model.initialize(counts, key=jax.random.key(0))
    series = pd.Series(counts, dtype="Int64")
    series.iloc[10] = pd.NA
    mask = np.ones(T, bool)
    mask[10] = False
    np.testing.assert_allclose(ss.log_prob(model, params, series),
                               ss.log_prob(model, params, counts, mask=mask), rtol=1e-12)
