"""Spurious (near-singular) maximizers: `spurious_states` and `fit_restarts` setting them aside.

References: a state collapsed by construction on two identical data points (its expected
occupancy is exactly 2 and its variance `min_variance`: McLachlan and Peel 2000, sec. 3.10,
the unbounded Gaussian likelihood), and a brute-force loop over the same starts.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.models.hmm.gaussian_params import GaussianEmissions

OUTLIER = 6.0


def _data():
    """60 N(0, 1) points and two identical outliers at 6."""
    y = np.random.default_rng(0).normal(size=(62, 1))
    y[20, 0] = y[40, 0] = OUTLIER
    return y


def _params(means, variances, stay=0.8):
    k = len(means)
    a = np.full((k, k), (1 - stay) / (k - 1))
    np.fill_diagonal(a, stay)
    return ss.HMMParams(jnp.full(k, 1.0 / k), jnp.asarray(a),
                        GaussianEmissions(jnp.asarray(means, float)[:, None],
                                          jnp.asarray(variances, float)[:, None, None]))


def _planted_initialize(all_collapsed):
    """A `GaussianHMM.initialize` whose random starts (all starts, if ``all_collapsed``) put
    state 1 on the two outliers with a tiny variance; the data start is regular."""

    def initialize(self, y, *, key, method="data", **kwargs):
        if method == "data" and not all_collapsed:
            return _params([-0.7, 0.7], [0.6, 0.8])
        u = float(jax.random.uniform(key))
        return _params([0.2 * u - 0.1, OUTLIER], [1.0 + u, 1e-4])

    return initialize


def test_spurious_states_planted_collapse():
    model = ss.GaussianHMM(num_states=2, emission_dim=1)
    y = _data()
    check = ss.spurious_states(model, _params([0.0, OUTLIER], [1.0, 1e-6]), y)
    # exact reference: the other 60 points are > 3 from 6, at density exp(-4.5e6) under state 1
    np.testing.assert_allclose(check.occupancy, [60.0, 2.0], atol=1e-9)
    assert check.spurious.tolist() == [False, True] and check.any
    assert check.min_occupancy == 5.0
    np.testing.assert_allclose(check.variance_ratio[1], 1e-6 / np.var(y), rtol=1e-9)
    regular = ss.spurious_states(model, _params([-0.7, 0.7], [0.6, 0.8]), y)
    assert not regular.any
    # each rule alone: occupancy off, the variance ratio still flags; both off, nothing
    only_var = ss.spurious_states(model, _params([0.0, OUTLIER], [1.0, 1e-6]), y,
                                  min_occupancy=0.0)
    assert only_var.min_occupancy == 2.0  # D + 1 always applies
    assert only_var.spurious.tolist() == [False, True]
    # a wide state on the outliers and a little tail: occupancy 2.48 (between D + 1 = 2
    # and 5), variance 4 / var(y) > 1e-3: only the occupancy rule flags it
    wide = ss.spurious_states(model, _params([0.0, OUTLIER], [1.0, 4.0]), y)
    assert 2.0 < wide.occupancy[1] < 5.0 and wide.variance_ratio[1] > 1.0
    assert wide.spurious.tolist() == [False, True]
    assert not ss.spurious_states(model, _params([0.0, OUTLIER], [1.0, 4.0]), y,
                                  min_occupancy=0.0).any


def test_spurious_states_models_without_singularities_and_bad_thresholds():
    y = _data()
    tied = ss.GaussianHMM(num_states=2, emission_dim=1, covariance="tied")
    assert ss.spurious_states(tied, tied.initialize(y, key=jax.random.key(0)), y) is None
    pois = ss.PoissonHMM(num_states=2)
    counts = np.random.default_rng(1).poisson(3.0, size=50)
    assert ss.spurious_states(pois, pois.initialize(counts, key=jax.random.key(0)),
                              counts) is None
    model = ss.GaussianHMM(num_states=2, emission_dim=1)
    with pytest.raises(ValueError, match="min_occupancy"):
        ss.spurious_states(model, _params([0, 1], [1, 1]), y, min_occupancy=-1.0)
    with pytest.raises(ValueError, match="min_variance_ratio"):
        ss.spurious_states(model, _params([0, 1], [1, 1]), y, min_variance_ratio=np.nan)


def test_spurious_states_markov_switching_variance():
    model = ss.MarkovSwitchingAR(num_regimes=2, order=1, switching_variance=True)
    y = np.random.default_rng(2).normal(size=80)
    params = model.initialize(y, key=jax.random.key(0))
    params = params._replace(variances=jnp.array([1.0, 1e-7]))
    check = ss.spurious_states(model, params, y)
    assert check.spurious[1] and check.variance_ratio[1] < 1e-6
    shared = ss.MarkovSwitchingAR(num_regimes=2, order=1)
    assert ss.spurious_states(shared, shared.initialize(y, key=jax.random.key(0)), y) is None


def _brute_force(model, y, key, num_restarts, **kw):
    """The same starts as `fit_restarts`, fitted one by one: (finals, spurious flags)."""
    keys = jax.random.split(key, num_restarts + 1)
    families = model.transition_starts
    finals, flags = [], []
    for i in range(num_restarts):
        extra = {} if i == 0 else {"transitions": families[(i - 1) % len(families)]}
        params = model.initialize(y, key=keys[i], method="data" if i == 0 else "random",
                                  **extra)
        fit = ss.fit_em(model, params, y, progress=False, **kw)
        finals.append(fit.final_log_joint)
        flags.append(ss.spurious_states(model, fit.params, y).any)
        assert bool(fit.spurious_states) == flags[-1]  # the single fit says the same
    return np.asarray(finals), np.asarray(flags)


def _em_with_warnings(model, params, y):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fit = ss.fit_em(model, params, y, num_iters=20, progress=False)
    return fit, [str(w.message) for w in rec if "spurious states" in str(w.message)]


def test_a_single_fit_em_flags_a_collapsed_state_and_warns_once():
    """Started with state 1 on the two identical outliers (variance 1e-4), EM keeps it there
    and its variance collapses (the unbounded likelihood of McLachlan and Peel 2000, sec.
    3.10): the fit lists state 1 in ``spurious_states`` and warns once, with its expected
    occupancy, which is exactly 2 (the other 60 points are > 3 from 6: density exp(-4.5e4)
    or less under a variance 1e-4). A regular fit (two clusters 6 apart, 50 points each,
    every variance near 1) is not flagged and does not warn."""
    model = ss.GaussianHMM(num_states=2, emission_dim=1)
    y = _data()
    fit, messages = _em_with_warnings(model, _params([0.0, OUTLIER], [1.0, 1e-4]), y)
    assert fit.spurious_states == (1,)
    assert len(messages) == 1
    assert "state 1 (almost no data and a collapsed variance: expected occupancy 2 steps," \
        in messages[0]
    check = ss.spurious_states(model, fit.params, y)
    np.testing.assert_allclose(check.occupancy, [60.0, 2.0], atol=1e-9)
    assert check.variance_ratio[1] < 1e-3

    rng = np.random.default_rng(1)
    y = np.r_[rng.normal(-3.0, 1.0, 50), rng.normal(3.0, 1.0, 50)][:, None]
    fit, messages = _em_with_warnings(model, _params([-1.0, 1.0], [2.0, 2.0], stay=0.9), y)
    assert fit.spurious_states == () and messages == []
    check = ss.spurious_states(model, fit.params, y)
    np.testing.assert_allclose(np.sort(check.occupancy), [50.0, 50.0], atol=0.5)
    assert np.all(check.variance_ratio > 0.05)


def test_fit_restarts_sets_planted_spurious_fits_aside(monkeypatch):
    monkeypatch.setattr(ss.GaussianHMM, "initialize", _planted_initialize(False))
    model = ss.GaussianHMM(num_states=2, emission_dim=1)
    y, key = _data(), jax.random.key(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ss.fit_restarts(model, y, key=key, num_restarts=4, num_iters=20)
        old = ss.fit_restarts(model, y, key=key, num_restarts=4, num_iters=20,
                              exclude_spurious=False)
        finals, flags = _brute_force(model, y, key, 4, num_iters=20)
    # the planted starts stay collapsed, are reported, and beat the regular fit by far
    assert res.spurious.tolist() == flags.tolist() == [False, True, True, True]
    np.testing.assert_array_equal(res.final_log_joints, finals)
    assert np.all(finals[1:] > finals[0] + 5.0)
    # chosen: the best non-spurious start of the brute-force loop
    expect = int(np.argmax(np.where(flags, -np.inf, finals)))
    assert res.best_index == expect == 0
    assert res.best.final_log_joint == finals[expect]
    assert not ss.spurious_states(model, res.best.params, y).any
    # option off: the old rule, the highest log joint whatever it is
    assert old.best_index == int(np.argmax(finals)) != 0
    assert old.spurious.tolist() == flags.tolist()


def test_fit_restarts_all_spurious_warns_and_returns_best(monkeypatch):
    monkeypatch.setattr(ss.GaussianHMM, "initialize", _planted_initialize(True))
    model = ss.GaussianHMM(num_states=2, emission_dim=1)
    y, key = _data(), jax.random.key(4)
    with pytest.warns(RuntimeWarning, match="all 3 valid starts ended at a spurious"):
        res = ss.fit_restarts(model, y, key=key, num_restarts=3, num_iters=20)
    assert res.spurious.all()
    assert res.best_index == int(np.nanargmax(res.final_log_joints))


def test_spurious_states_autoregressive_hmm_scale_mask_and_opt_in(monkeypatch):
    # a random walk: the data's variance is far above the differences' (the AR noise scale)
    rng = np.random.default_rng(5)
    y = np.cumsum(rng.normal(size=(120, 2)), axis=0)
    model = ss.LinearAutoregressiveHMM(num_states=2, emission_dim=2, num_lags=1)
    params = model.initialize(y, key=jax.random.key(0))
    check = ss.spurious_states(model, params, y)
    scales = np.minimum(np.var(y, axis=0), np.var(np.diff(y, axis=0), axis=0))
    assert np.all(scales < 0.2 * np.var(y, axis=0))  # the differences set the scale
    covs = np.asarray(model.state_covariances(params.emissions))
    scaled = covs / np.sqrt(scales)[:, None] / np.sqrt(scales)[None, :]
    np.testing.assert_allclose(check.variance_ratio, np.linalg.eigvalsh(scaled)[:, 0],
                               rtol=1e-10)
    np.testing.assert_allclose(check.occupancy.sum(), 120.0, rtol=1e-10)
    assert check.min_occupancy == 5.0  # max(D + 1 = 3, 5)
    assert ss.spurious_states(model, params, y, min_occupancy=7.5).min_occupancy == 7.5
    # masked entries are left out of the scale and of the occupancy's evidence
    gy = _data()
    mask = np.ones(len(gy), bool)
    mask[40] = False
    gmodel = ss.GaussianHMM(num_states=2, emission_dim=1)
    masked = ss.spurious_states(gmodel, _params([0.0, OUTLIER], [1.0, 1e-6]), gy, mask=mask)
    np.testing.assert_allclose(masked.variance_ratio[1], 1e-6 / np.var(gy[mask]), rtol=1e-9)
    assert 0.9 < masked.occupancy[1] < 1.1  # one outlier left in state 1's evidence
    # any model can opt in with spurious_state_covariances
    pois = ss.PoissonHMM(num_states=2)
    counts = rng.poisson(3.0, size=50)
    pp = pois.initialize(counts, key=jax.random.key(0))
    monkeypatch.setattr(ss.PoissonHMM, "spurious_state_covariances",
                        lambda self, p: np.array([1.0, 1e-9])[:, None, None], raising=False)
    opted = ss.spurious_states(pois, pp, counts)
    assert opted.spurious[1] and not opted.spurious[0]
