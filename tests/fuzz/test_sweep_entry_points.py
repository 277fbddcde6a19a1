"""Fuzz: `statseq.inference.sweeps.sweep_scan` and the paths built on it (session 20).

Bad inputs (no time steps, xs of unequal lengths, non-positive sizes) must raise a
``ValueError`` naming the problem; extreme values (NaN, inf, 1e300, 1e-300 in the inputs)
must give exactly what the sequential `jax.lax.scan` gives with the same step (NaN where it
gives NaN), and the HMM filter by sweeps must equal the sequential filter on all-missing
data (rows of zeros) and on log-likelihoods of -1e300.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from statseq.inference import hmm  # noqa: E402
from statseq.inference.sweeps import sweep_scan  # noqa: E402


def _step(carry, x):
    return 0.5 * carry + x, carry


@pytest.mark.parametrize("xs, kwargs, pattern", [
    (jnp.ones(0), {}, "no time steps"),
    ((jnp.ones(10), jnp.ones(9)), {}, "same leading"),
    ((), {}, "at least one array"),
    (jnp.ones(10), {"chunk": 0}, "positive"),
    (jnp.ones(10), {"max_sweeps": 0}, "positive"),
    (jnp.ones(10), {"block_length": 20, "chunk": 8}, "multiple of chunk"),
])
def test_sweep_scan_refuses(xs, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        sweep_scan(lambda c, x: (c, c), jnp.zeros(()), xs, **kwargs)


@pytest.mark.parametrize("value", [np.nan, np.inf, 1e300, 1e-300])
def test_sweep_scan_extreme_values_as_the_scan(value):
    xs = jnp.ones(100).at[40].set(value)
    got, _ = sweep_scan(_step, jnp.zeros(()), xs, block_length=16, chunk=8)
    want = jax.lax.scan(_step, jnp.zeros(()), xs)[1]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


SWEPT = jax.jit(lambda pi, a, ll: hmm._filter(*hmm._prepare_inputs(pi, a, ll), sweeps=True))
SEQUENTIAL = jax.jit(lambda pi, a, ll: hmm._filter(*hmm._prepare_inputs(pi, a, ll),
                                                   sweeps=False))


@pytest.mark.parametrize("fill", [0.0, -1e300])
def test_hmm_filter_by_sweeps_all_missing_and_extreme(fill):
    pi = jnp.array([0.3, 0.7])
    a = jnp.array([[0.9, 0.1], [0.2, 0.8]])
    ll = jnp.full((70, 2), fill)
    got, want = SWEPT(pi, a, ll), SEQUENTIAL(pi, a, ll)
    for g, w in zip(got, want, strict=True):
        assert np.all(np.isfinite(np.asarray(g)))
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12)
