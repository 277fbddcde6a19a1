"""Fuzz tests for the entry points added in issue 20: `estimate_log_prob` and the exact
h-step predictives of the AR-HMM (`predict_observations`). Bad input ends in a clear error;
extreme but valid input gives a finite number."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import statseq as ss
from statseq.models.hmm.autoregressive import LinearAutoregressiveHMM

KEY = jax.random.key(0)
Y = np.sin(np.arange(12) / 2.0)


@pytest.fixture(scope="module")
def gru():
    model = ss.GRU(hidden_dim=2)
    return model, model.initialize(Y, key=KEY)


@pytest.mark.parametrize("y, err, pattern", [
    (np.zeros((0,)), ValueError, "no time steps|num_timesteps"),
    (np.r_[Y[:5], np.inf, Y[6:]], ValueError, "finite"),
    (Y.astype(str), (TypeError, ValueError), "real|numeric|float|dtype"),
], ids=["empty", "inf", "str"])
def test_estimate_log_prob_refuses_bad_data(gru, y, err, pattern):
    model, params = gru
    with pytest.raises(err, match=pattern):
        ss.estimate_log_prob(model, params, y, key=KEY, num_particles=16, num_replicates=2)


def test_estimate_log_prob_mask_shape_gap_and_all_missing(gru):
    model, params = gru
    with pytest.raises(ValueError, match="mask"):
        ss.estimate_log_prob(model, params, Y, np.ones(5, bool), key=KEY, num_particles=16,
                             num_replicates=2)
    mask = np.ones(12, bool)
    mask[4] = False
    lp, se = ss.estimate_log_prob(model, params, Y, mask, key=KEY, num_particles=64,
                                  num_replicates=4)
    assert np.isfinite(lp) and np.isfinite(se) and se >= 0
    try:
        lp, se = ss.estimate_log_prob(model, params, Y, np.zeros(12, bool), key=KEY,
                                      num_particles=16, num_replicates=2)
    except ValueError as e:
        assert "observed" in str(e) or "missing" in str(e)
    else:  # nothing observed: the likelihood of no data is 1
        assert np.allclose(lp, 0.0) and np.allclose(se, 0.0)


def test_estimate_log_prob_extreme_scale_is_finite(gru):
    model, params = gru
    lp, se = ss.estimate_log_prob(model, params, 1e6 * Y, key=KEY, num_particles=16,
                                  num_replicates=2)
    assert np.isfinite(lp)


def test_arhmm_predict_observations_refuses_bad_arguments():
    model = LinearAutoregressiveHMM(num_states=2, emission_dim=1, num_lags=1)
    y = np.cumsum(np.random.default_rng(0).normal(size=30))[:, None]
    params = model.initialize(y, key=KEY)
    for bad in (0, -1, 2.5, "3"):
        with pytest.raises((TypeError, ValueError)):
            model.predict_observations(params, y, num_steps=bad)
    with pytest.raises(ValueError):
        model.predict_observations(params, np.r_[y[:-1, 0], np.nan][:, None], num_steps=2)
    d = model.predict_observations(params, 1e6 * y, num_steps=3)
    assert np.all(np.isfinite(np.asarray(d.mean)))
