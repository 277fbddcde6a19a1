"""`fit_em(tol=None)` runs exactly ``num_iters`` iterations, and the EM loop carries the
last E-step's state masses for the mass warnings (no second E-step after the loop).

References: hmmlearn's `PoissonHMM.fit` from the same start for the same number of
iterations (``init_params=""``, ``tol=-inf``), and `statseq.models.hmm.base.mass_warnings`
(one separate E-step) for the carried masses.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.core.validation import prepare_data
from statseq.models.hmm.base import _e_step


def _start(model, y):
    return model.initialize(y, key=jax.random.key(0))


def test_tol_none_runs_exactly_num_iters_like_hmmlearn():
    from hmmlearn.hmm import PoissonHMM as HLPoisson

    y = np.asarray(ss.datasets.load_discoveries().to_numpy(), float)
    model = ss.PoissonHMM(num_states=2)
    start = _start(model, y)
    fit = ss.fit_em(model, start, y, num_iters=9, tol=None, progress=False)
    assert fit.num_iterations == 9 and not fit.converged
    assert np.all(np.isfinite(fit.log_joint))
    # a converging fit with the default tol stops earlier on these data
    assert ss.fit_em(model, start, y, num_iters=500, progress=False).num_iterations < 500

    hl = HLPoisson(n_components=2, n_iter=9, tol=-np.inf, init_params="", params="stl",
                   implementation="log")
    hl.startprob_ = np.asarray(start.initial_probs)
    hl.transmat_ = np.asarray(start.transitions)
    hl.lambdas_ = np.asarray(start.emissions.rates).reshape(2, 1)
    hl.fit(y.reshape(-1, 1))
    assert len(hl.monitor_.history) == 9
    # hmmlearn's history is the log-likelihood at the parameters entering each iteration
    np.testing.assert_allclose(fit.log_joint, hl.monitor_.history, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(fit.params.emissions.rates).ravel(),
                               hl.lambdas_.ravel(), rtol=1e-8)
    np.testing.assert_allclose(np.asarray(fit.params.transitions), hl.transmat_, atol=1e-10)


def test_tol_must_be_non_negative_or_none():
    y = np.asarray(ss.datasets.load_discoveries().to_numpy(), float)
    model = ss.PoissonHMM(num_states=2)
    with pytest.raises(ValueError, match="tol must be non-negative or None"):
        ss.fit_em(model, _start(model, y), y, tol=-1.0, progress=False)


@pytest.mark.parametrize("kind", ["poisson", "arhmm"])
def test_carried_masses_equal_a_separate_e_step(kind):
    """A far third state gets no mass: the warning comes from the carried masses, and
    those equal the masses of one separate E-step at the parameters entering the last
    iteration (a converged fit returns exactly those parameters)."""
    rng = np.random.default_rng(0)
    if kind == "poisson":
        model = ss.PoissonHMM(num_states=3)
        y = rng.poisson(np.where(rng.uniform(size=400) < 0.5, 2.0, 9.0)).astype(float)
        start = _start(model, y)
        start = start._replace(emissions=start.emissions._replace(
            rates=jnp.asarray([2.0, 9.0, 1e4])))
    else:
        model = ss.LinearAutoregressiveHMM(num_states=3, num_lags=1)
        y = np.cumsum(rng.normal(size=(400, 1)), axis=0) * 0.1
        start = _start(model, y)
        start = start._replace(emissions=start.emissions._replace(
            biases=start.emissions.biases.at[2].set(1e4)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = ss.fit_em(model, start, y, num_iters=200, progress=False)
    assert fit.converged
    messages = [str(w.message) for w in caught if "no posterior mass" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith("state 2 ")
    data = prepare_data(model, y, None, None)
    stats, _ = _e_step(model, fit.params, data.y, data.mask, data.inputs)
    separate = np.asarray(model.em_state_masses(stats, data.mask))
    assert separate[2] < 1e-6 * separate.sum()
    assert model.em_warnings(fit.params, data.y, data.mask, data.inputs) == \
        model.em_warnings(fit.params, data.y, data.mask, data.inputs, masses=separate)


def test_fits_differing_only_in_num_iters_share_one_program():
    # num_iters is an array argument and the trace a buffer of capacity >= 256 (a power
    # of two), so 3, 9 and 200 iterations reuse one compiled loop; the trace is cut back
    # to num_iters entries; 300 iterations need the next capacity (512): one new program
    from statseq.fit.em import _fit_em_compiled

    y = np.asarray(ss.datasets.load_discoveries().to_numpy(), float)
    model = ss.PoissonHMM(num_states=2)
    start = _start(model, y)
    _fit_em_compiled.clear_cache()  # bound_cache clears the cache only above its bound
    first = ss.fit_em(model, start, y, num_iters=3, tol=None, progress=False)
    size = _fit_em_compiled._cache_size()
    assert size == 1
    longer = ss.fit_em(model, start, y, num_iters=9, tol=None, progress=False)
    ss.fit_em(model, start, y, num_iters=200, progress=False)
    assert _fit_em_compiled._cache_size() == size
    assert first.log_joint.shape == (3,) and longer.log_joint.shape == (9,)
    np.testing.assert_array_equal(first.log_joint, longer.log_joint[:3])
    ss.fit_em(model, start, y, num_iters=300, progress=False)
    assert _fit_em_compiled._cache_size() == size + 1
