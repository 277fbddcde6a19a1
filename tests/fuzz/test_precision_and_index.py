"""The precision policy (float64 inputs while JAX runs in float32) and time-index rules."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import statseq as ss
from statseq.core import validation

LEVEL = ss.LocalLevel()


@pytest.fixture
def float32():
    """JAX in float32 (x64 off) for one test, with the once-per-process warning re-armed."""
    validation._WARNED_FLOAT32[0] = False
    with jax.enable_x64(False):
        yield
    validation._WARNED_FLOAT32[0] = False


def test_float64_data_warn_once_naming_the_remedy_and_match_float64(float32, rng):
    y = rng.normal(size=30)
    params = ss.LocalLevelParams(np.float32(1.0), np.float32(0.5))
    with pytest.warns(UserWarning, match=r'jax.config.update\("jax_enable_x64", True\)'):
        lp32 = float(ss.log_prob(LEVEL, params, y))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: the second call is silent
        assert float(ss.log_prob(LEVEL, params, y + 1.0)) < 0
    with jax.enable_x64(True):
        lp64 = float(ss.log_prob(LEVEL, ss.LocalLevelParams(1.0, 0.5), y))
    np.testing.assert_allclose(lp32, lp64, rtol=1e-5)


def test_values_that_overflow_or_vanish_in_float32_are_refused(float32, rng):
    y = rng.normal(size=20).astype(np.float32)
    params = ss.LocalLevelParams(np.float32(1.0), np.float32(1.0))
    # 1e30 is a float32, but its square is not
    with pytest.raises(ValueError, match="squares overflow.*jax_enable_x64"):
        ss.log_prob(LEVEL, params, y * np.float32(1e30))
    # a 1e-300 variance is 0 in float32
    with pytest.warns(UserWarning, match="float32"), pytest.raises(
            ValueError, match="params.level_var .*smallest normal float32"):
        ss.log_prob(LEVEL, ss.LocalLevelParams(np.float64(1.0), np.float64(1e-300)), y)
    # 1e300 becomes inf in float32
    with pytest.raises(ValueError, match="params.obs_var"):
        ss.log_prob(LEVEL, ss.LocalLevelParams(np.float64(1e300), np.float64(1.0)), y)


def test_the_same_values_in_float64_are_computed(rng):
    """With x64 on, 1e30 data and a 1e-300 variance are representable: finite results
    (the variance is 0 for all practical purposes: the level is fixed after one step)."""
    y = rng.normal(size=20)
    assert np.isfinite(float(ss.log_prob(LEVEL, ss.LocalLevelParams(1e60, 1.0), y * 1e30)))
    lp = float(ss.log_prob(LEVEL, ss.LocalLevelParams(1.0, 1e-300), y))
    ref = float(ss.log_prob(LEVEL, ss.LocalLevelParams(1.0, 1e-200), y))
    np.testing.assert_allclose(lp, ref, rtol=1e-12)


def test_counts_beyond_int32_are_refused():
    model = ss.PoissonHMM(num_states=1)
    params = model.assemble_params(model.emission_shapes()._replace(rates=jnp.array([5.0])))
    with pytest.raises(ValueError, match="int32 range"):
        ss.log_prob(model, params, np.array([3, 2**31, 4], np.int64))
    assert np.isfinite(float(ss.log_prob(model, params, np.array([3, 2**31 - 1]))))


def test_complex_params_and_data_are_type_errors():
    with pytest.raises(TypeError, match="complex"):
        ss.log_prob(LEVEL, ss.LocalLevelParams(1.0, 1.0), np.ones(5) + 0j)
    with pytest.raises(TypeError, match="real array"):
        ss.log_prob(LEVEL, ss.LocalLevelParams(1.0 + 0j, 1.0), np.ones(5))


# ---- pandas time index -------------------------------------------------------------------
def _series(index):
    return pd.Series(np.linspace(0.0, 1.0, len(index)), index=index)


@pytest.mark.parametrize("index, pattern", [
    (pd.date_range("2000-01-01", periods=6, freq="D")[::-1], "not increasing"),
    (pd.Index([1, 2, 2, 3, 4, 5]), "repeated time label"),
    (pd.Index([1, 3, 2, 4, 5, 6]), "not increasing"),
])
def test_unsorted_or_repeated_index_is_refused(index, pattern):
    params = ss.LocalLevelParams(1.0, 1.0)
    with pytest.raises(ValueError, match=pattern):
        ss.log_prob(LEVEL, params, _series(index))
    with pytest.raises(ValueError, match=pattern):
        ss.forecast(LEVEL, params, _series(index), num_steps=2, num_samples=2,
                    key=jax.random.key(0))
    with pytest.raises(ValueError, match=pattern):
        ss.future_index(index, 2)


def test_future_labels_need_a_regular_spacing():
    assert list(ss.future_index(pd.Index([2, 4, 6]), 2)) == [8, 10]
    with pytest.warns(UserWarning, match="regular frequency"):
        assert ss.future_index(pd.Index([1, 2, 4, 8]), 2) is None
    irregular = pd.DatetimeIndex(["2000-01-01", "2000-01-02", "2000-01-05", "2000-01-06"])
    with pytest.warns(UserWarning, match="regular frequency"):
        assert ss.future_index(irregular, 2) is None


def test_log_score_on_an_empty_test_set_raises():
    params = ss.LocalLevelParams(1.0, 1.0)
    with pytest.raises(ValueError, match="no time steps"):
        ss.log_score(LEVEL, params, np.ones(10), np.ones(0))
