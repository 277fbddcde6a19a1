"""Generic log_prob / filter / sample / forecast: batching, ragged batches, summation.

The model, parameter shapes and data shapes match the first AR example of the contract
test on purpose, so both files share compiled programs.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.core.recurrence import _filter_flat
from statseq.core.recurrence import pairwise_sum as _pairwise_sum

# jitted once per shape: eagerly, each of the ~20 tree levels would dispatch (and compile)
# its own small programs
pairwise_sum = jax.jit(_pairwise_sum, static_argnames="axis")
T = 16
MODEL = ss.AR(order=2)


@pytest.fixture(scope="module")
def params():
    return ss.ARParams(
        coeffs=jnp.array([[[0.6]], [[-0.3]]]), intercept=jnp.array([0.4]),
        input_weights=jnp.zeros((1, 0)), cov=jnp.array([[0.8]]),
    )


@pytest.fixture(scope="module")
def batch(params):
    return np.asarray(ss.sample(MODEL, params, num_timesteps=T, num_samples=3,
                                key=jax.random.key(0)))


def test_batch_equals_loop(params, batch):
    assert batch.shape == (3, T)
    got = np.asarray(ss.log_prob(MODEL, params, batch))
    loop = [float(ss.log_prob(MODEL, params, y)) for y in batch]
    assert got.shape == (3,)
    np.testing.assert_allclose(got, loop, rtol=1e-12)
    # several batch axes are flattened and restored
    nested = np.asarray(ss.log_prob(MODEL, params, batch.reshape(3, 1, T)))
    assert nested.shape == (3, 1)
    np.testing.assert_allclose(nested.ravel(), loop, rtol=1e-12)


def test_ragged_batch_equals_unpadded_sequences(params, batch):
    lengths = [10, T, 10]  # two distinct lengths keep the number of compiled shapes low
    seqs = [batch[i, :n] for i, n in enumerate(lengths)]
    padded, mask = ss.pad_sequences(seqs, pad_value=np.nan)  # padding is never read
    assert padded.shape == (3, T) and mask.sum(axis=1).tolist() == lengths
    got = np.asarray(ss.log_prob(MODEL, params, padded, mask=mask))
    expected = [float(ss.log_prob(MODEL, params, s)) for s in seqs]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # per-step log-probs vanish on the padding, and a 2-D mask per entry is not needed
    lps = np.asarray(ss.filter(MODEL, params, padded, mask=mask).log_probs)
    assert np.all(lps[~mask] == 0.0) and np.all(np.isfinite(lps))


def test_pad_sequences_rejects_mixed_event_shapes():
    with pytest.raises(ValueError, match="one common event shape"):
        ss.pad_sequences([np.ones((3, 2)), np.ones((3, 3))])
    with pytest.raises(ValueError, match="empty"):
        ss.pad_sequences([])


def test_log_prob_is_sum_of_filter_log_probs(params, batch):
    mask = np.ones((3, T), bool)
    mask[1, 5:9] = False
    res = ss.filter(MODEL, params, batch, mask=mask)
    assert res.log_probs.shape == (3, T)
    np.testing.assert_allclose(np.asarray(res.log_prob),
                               np.asarray(res.log_probs).sum(-1), rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(ss.log_prob(MODEL, params, batch, mask=mask)),
                                  np.asarray(res.log_prob))
    assert np.all(np.asarray(res.log_probs)[1, 5:9] == 0.0)


def test_return_carries_shapes_and_final_carry(params, batch):
    res = ss.filter(MODEL, params, batch, return_carries=True)
    assert res.carries.mean.shape == (3, T, 2)
    assert res.final_carry.mean.shape == (3, 2)
    np.testing.assert_array_equal(np.asarray(res.carries.mean[:, -1]),
                                  np.asarray(res.final_carry.mean))
    # with everything observed, the AR window is the last two values, newest first
    np.testing.assert_allclose(np.asarray(res.final_carry.mean), batch[:, [-1, -2]],
                               rtol=1e-12)


def test_pairwise_sum_float32_accuracy():
    rng = np.random.default_rng(0)
    x64 = rng.uniform(0.0, 1.0, size=10**6) + 0.1
    x32 = x64.astype(np.float32)
    exact = math.fsum(x32.astype(np.float64))  # exact sum of the float32 values
    total32 = pairwise_sum(jnp.asarray(x32))
    assert total32.dtype == jnp.float32
    got32 = float(total32)
    naive32 = float(np.cumsum(x32, dtype=np.float32)[-1])  # sequential float32 sum
    rel = abs(got32 - exact) / exact
    assert rel < 1e-6
    assert abs(naive32 - exact) / exact > 10 * rel  # the tree really is more accurate
    got64 = float(pairwise_sum(jnp.asarray(x64)))
    np.testing.assert_allclose(got64, math.fsum(x64), rtol=1e-13)


@pytest.mark.parametrize("n", [0, 1, 7, 1001])
def test_pairwise_sum_small_and_odd_lengths_and_axis(n):
    x = np.arange(2 * n, dtype=np.float64).reshape(2, n) + 0.5
    np.testing.assert_allclose(np.asarray(pairwise_sum(jnp.asarray(x))), x.sum(-1), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(pairwise_sum(jnp.asarray(x.T), axis=0)),
                               x.sum(-1), rtol=1e-14)


def test_sample_shapes_and_determinism(params, batch):
    key = jax.random.key(0)
    again = ss.sample(MODEL, params, num_timesteps=T, num_samples=3, key=key)
    other = ss.sample(MODEL, params, num_timesteps=T, num_samples=3, key=jax.random.key(43))
    assert again.shape == (3, T)
    np.testing.assert_array_equal(np.asarray(again), batch)
    assert not np.any(np.asarray(other) == batch)
    assert len(np.unique(batch[:, 0])) == 3  # independent sequences differ
    # (num_samples=None gives one unbatched sequence: see the AR sampling test)


def test_forecast_shapes_and_determinism(params, batch):
    key = jax.random.key(7)
    fc = ss.forecast(MODEL, params, batch, num_steps=4, num_samples=5, key=key)
    again = ss.forecast(MODEL, params, batch, num_steps=4, num_samples=5, key=key)
    assert fc.samples.shape == (5, 3, 4)
    assert fc.num_steps == 4
    np.testing.assert_array_equal(np.asarray(fc.samples), np.asarray(again.samples))
    lower, upper = fc.interval(0.5)
    assert lower.shape == upper.shape == (3, 4) and np.all(lower <= upper)
    assert fc.mean().shape == (3, 4)
    with pytest.raises(ValueError, match="level"):
        fc.interval(1.5)
    var = ss.AR(order=1, emission_dim=2, initial="stationary")
    yv = np.zeros((T, 2))
    fcv = ss.forecast(var, var.default_params(), yv, num_steps=4, num_samples=5, key=key)
    assert fcv.samples.shape == (5, 4, 2) and fcv.num_steps == 4


def test_forecast_reuses_the_compiled_filter(params, batch):
    """log_prob and forecast filter the same data with one compiled filter, not two.

    ``_filter_flat`` is jitted with static keyword arguments; ``filter`` passes
    ``return_carries=False`` explicitly while ``forecast`` leaves it at its default, and
    jit keys its cache on the keywords as passed, so the same program compiles twice.
    """
    y = batch[:, :12]  # a history length no other test uses: the check is order-independent
    ss.log_prob(MODEL, params, y)
    before = _filter_flat._cache_size()
    ss.forecast(MODEL, params, y, num_steps=4, num_samples=5, key=jax.random.key(7))
    assert _filter_flat._cache_size() == before
