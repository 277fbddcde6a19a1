"""`GaussianForecast.to_frame` and its time index: the exact forecast as a tidy table.

References are independent of the code under test: intervals are ``mean +- z sd`` with
``z`` from SciPy and ``sd`` the square root of the forecast covariance's diagonal, and the
column layout is the one `statseq.Forecast.to_frame` produces for the same history.
"""

from __future__ import annotations

import jax
import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

import statseq as ss

H = 4  # forecast horizon


@pytest.fixture(scope="module")
def local_level():
    model = ss.LocalLevel()
    params = model.default_params()
    y = np.asarray(ss.sample(model, params, num_timesteps=24, key=jax.random.key(0)))
    return model, params, y


def test_scalar_frame_has_the_sample_forecasts_columns_and_exact_values(local_level):
    model, params, y = local_level
    series = pd.Series(y, index=pd.date_range("2020-01-01", periods=y.size, freq="MS"))
    fc = model.forecast_moments(params, series, num_steps=H)

    assert list(fc.index) == list(pd.date_range("2022-01-01", periods=H, freq="MS"))
    assert fc.history_index.equals(series.index)
    np.testing.assert_array_equal(fc.history, y)
    frame = fc.to_frame(levels=(0.5, 0.9))
    assert frame.index.equals(fc.index)
    samples = ss.forecast(model, params, series, num_steps=H, num_samples=20,
                          key=jax.random.key(1))
    assert list(frame.columns) == list(samples.to_frame(levels=(0.5, 0.9)).columns)
    assert list(frame.columns) == ["mean", "median", "lower_50", "upper_50", "lower_90",
                                   "upper_90"]

    mean = np.asarray(fc.mean)
    sd = np.sqrt(np.asarray(fc.cov)[:, 0, 0])
    np.testing.assert_array_equal(frame["mean"], mean)
    np.testing.assert_array_equal(frame["median"], mean)
    for level in (0.5, 0.9):
        z = norm.ppf(0.5 + level / 2)
        np.testing.assert_allclose(frame[f"lower_{100 * level:g}"], mean - z * sd, rtol=1e-12)
        np.testing.assert_allclose(frame[f"upper_{100 * level:g}"], mean + z * sd, rtol=1e-12)
        lower, upper = fc.interval(level)
        np.testing.assert_array_equal(frame[f"upper_{100 * level:g}"], upper)

    # the same history as an array: same numbers, rows by horizon
    plain = model.forecast_moments(params, y, num_steps=H)
    assert plain.index is None and plain.history_index is None
    plain_frame = plain.to_frame(levels=(0.5, 0.9))
    assert plain_frame.index.equals(pd.RangeIndex(1, H + 1, name="horizon"))
    np.testing.assert_array_equal(plain_frame.to_numpy(), frame.to_numpy())


def test_vector_frame_has_column_pairs_and_continues_a_numeric_index():
    model = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    params = model.default_params()
    y = np.asarray(ss.sample(model, params, num_timesteps=15, key=jax.random.key(3)))
    frame_in = pd.DataFrame(y, columns=["a", "b"], index=np.arange(1990, 2005))
    fc = model.forecast_moments(params, frame_in, num_steps=H)

    frame = fc.to_frame(levels=0.8)
    assert frame.index.tolist() == [2005, 2006, 2007, 2008]
    assert list(frame.columns) == [(s, c) for s in ("mean", "median", "lower_80", "upper_80")
                                   for c in ("a", "b")]
    sd_b = np.sqrt(np.asarray(fc.cov)[:, 1, 1])
    mean_b = np.asarray(fc.mean)[:, 1]
    np.testing.assert_array_equal(frame[("mean", "b")], mean_b)
    np.testing.assert_allclose(frame[("lower_80", "b")], mean_b - norm.ppf(0.9) * sd_b,
                               rtol=1e-12)


def test_explicit_index_and_errors(local_level):
    model, params, y = local_level
    fc = model.forecast_moments(params, y, num_steps=H)
    labels = pd.Index(["q1", "q2", "q3", "q4"], name="quarter")
    assert fc.to_frame(index=labels).index.equals(labels)
    with pytest.raises(ValueError, match="one label per forecast step"):
        fc.to_frame(index=labels[:3])
    with pytest.raises(ValueError, match="level must be in"):
        fc.to_frame(levels=(1.5,))
    batch = model.forecast_moments(params, np.stack([y, y]), num_steps=H)
    with pytest.raises(ValueError, match="batch axes"):
        batch.to_frame()


def test_plot_uses_the_time_index(local_level):
    import matplotlib.pyplot as plt

    model, params, y = local_level
    series = pd.Series(y, index=pd.date_range("2020-01-01", periods=y.size, freq="D"))
    ax = model.forecast_moments(params, series, num_steps=H).plot()
    try:
        assert ax.lines[0].get_xdata()[0] == series.index[0]
    finally:
        plt.close("all")
