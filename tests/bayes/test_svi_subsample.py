"""`fit_svi(..., batch_size=)`: SVI with data subsampling over a panel of sequences.

``batch_size = N`` is the full-data fit step for step; the subsampled log joint (the ELBO
of a point-mass guide) is unbiased for the full one, with the exact sampling variance of
simple random sampling without replacement (and of the per-device stratified draw used on
a sharded panel); a short subsampled fit reaches the full-data fit's posterior mean.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from numpyro import handlers
from numpyro.infer.util import log_density

import statseq as ss
from statseq.bayes import _joint, svi

N, T = 24, 30
MODEL = ss.AR(order=1)


def _panel():
    rng = np.random.default_rng(0)
    y = np.zeros((N, T))
    for t in range(1, T):
        y[:, t] = 0.6 * y[:, t - 1] + rng.normal(size=N)
    return y


Y = _panel()
STEPS = 1600
# a decaying step size: the subsampled fit's noisy steps settle (and the full fit converges)
KW = dict(num_samples=200, init_params=MODEL.default_params(), num_steps=STEPS,
          optimizer=optax.adam(optax.exponential_decay(2e-2, STEPS // 2, 0.1)))


@pytest.fixture(scope="module")
def full():
    return ss.fit_svi(MODEL, Y, key=jax.random.key(0), **KW)


def test_batch_size_n_equals_full_data(full):
    sub = ss.fit_svi(MODEL, Y, key=jax.random.key(0), batch_size=N, **KW)
    np.testing.assert_array_equal(sub.losses, full.losses)
    for a, b in zip(jax.tree.leaves(sub.draws), jax.tree.leaves(full.draws), strict=True):
        np.testing.assert_array_equal(a, b)


def _estimates(spec, batch_size, blocks, keys):
    """Subsampled log joints at the initial values, one per key, and the full one."""
    values = _joint.site_values(spec)
    model = functools.partial(svi._subsampled, batch_size=batch_size, blocks=blocks)

    def one(key):
        return log_density(handlers.seed(model, rng_seed=key), (spec,), {}, values)[0]

    full, _ = log_density(_joint.numpyro_model, (spec,), {}, values)
    return np.asarray(jax.vmap(one)(keys)), float(full)


@pytest.fixture(scope="module")
def spec_lp():
    # with missing data (the mask rows are drawn with the sequences)
    mask = np.random.default_rng(1).random((N, T)) > 0.2
    mask[:, :2] = True
    spec = _joint.prepare_joint(MODEL, Y, priors=None, mask=mask, inputs=None,
                                init_params=MODEL.default_params(), trainable=None,
                                ordered=None, key=jax.random.key(0))
    assert not spec.data.complete
    return spec, np.asarray(ss.log_prob(MODEL, MODEL.default_params(), Y, mask=mask))


@pytest.mark.parametrize("blocks", [1, 4])
def test_subsampled_log_joint_is_unbiased(spec_lp, blocks):
    spec, lp = spec_lp
    b, k = 8, 2000
    est, full = _estimates(spec, b, blocks, jax.random.split(jax.random.key(1), k))
    # exact variance of N/b * sum over the draw: simple random sampling without replacement,
    # stratified by block (b / blocks rows from each of `blocks` equal blocks)
    per, bb = N // blocks, b // blocks
    var = sum(per ** 2 * (1 - bb / per) * np.var(s, ddof=1) / bb
              for s in lp.reshape(blocks, per))
    assert np.std(est) == pytest.approx(np.sqrt(var), rel=0.1)  # draws are random, scaled N/b
    assert abs(np.mean(est) - full) < 4 * np.sqrt(var / k)


def test_stratified_draw_is_balanced_and_uniform():
    x = jnp.arange(N * 2.0).reshape(N, 2)

    @jax.jit
    def draws(keys):
        def one(k):
            rows = svi.draw_rows(k, N, 8, blocks=4)
            return rows, svi.minibatch_indices(rows, N, 4), svi.take_rows(x, rows, 4)
        return jax.vmap(one)(keys)

    rows, idx, taken = map(np.asarray, draws(jax.random.split(jax.random.key(3), 3000)))
    assert rows.shape == (3000, 4, 2)
    np.testing.assert_array_equal(taken, np.asarray(x)[idx])
    for i in idx[:50]:  # 8 distinct rows, two in each block of 6
        assert len(set(i.tolist())) == 8
        np.testing.assert_array_equal(i.reshape(4, 2) // 6, np.repeat(np.arange(4)[:, None], 2, 1))
    counts = np.bincount(idx.ravel(), minlength=N)
    p = 8 / N  # inclusion probability of every row
    assert np.max(np.abs(counts / 3000 - p)) < 4 * np.sqrt(p * (1 - p) / 3000)


def test_subsampled_fit_reaches_full_data_posterior_mean(full):
    sub = ss.fit_svi(MODEL, Y, key=jax.random.key(0), batch_size=8, **KW)
    for name in ("coeffs", "cov", "intercept"):
        a, b = getattr(full.draws, name), getattr(sub.draws, name)
        sd = np.std(a)
        # within a fifth of the full-data posterior standard deviation (measured: 0.06)
        assert abs(np.mean(a) - np.mean(b)) < sd / 5, (name, np.mean(a), np.mean(b), sd)


@pytest.mark.parametrize("bad, err, match", [
    (0, ValueError, "batch_size must be >= 1"),
    (N + 1, ValueError, "exceeds the 24 sequences"),
    (2.5, TypeError, "batch_size must be an integer"),
])
def test_bad_batch_size(bad, err, match):
    with pytest.raises(err, match=match):
        ss.fit_svi(MODEL, Y, key=jax.random.key(0), batch_size=bad, **KW)


def test_batch_size_needs_a_panel():
    with pytest.raises(ValueError, match="one batch axis"):
        ss.fit_svi(MODEL, Y[0], key=jax.random.key(0), batch_size=1, **KW)
