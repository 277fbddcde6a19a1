"""Poisson HMMs on the earthquake counts reproduce the published maximum likelihood fits.

Reference: Zucchini, W. and MacDonald, I. L. (2009), Hidden Markov Models for Time Series:
An Introduction Using R, Section 3.4 (2nd ed. 2016 with Langrock, Section 3.6): stationary
Poisson HMMs fitted to the annual counts of major earthquakes 1900-2006 by direct numerical
maximization. Published values (rounded as printed there):

* 2 states: lambda = (15.472, 26.125), gamma_12 = 0.0660, gamma_21 = 0.1285,
  -log L = 342.3183;
* 3 states: lambda = (13.146, 19.721, 29.714), -log L = 329.4603.

Also the sample mean 19.364 and variance 51.573 quoted there for the series.
"""

import jax
import numpy as np
import pytest

import statseq as ss


@pytest.fixture(scope="module")
def quakes():
    return ss.datasets.load_earthquakes().to_numpy()


def test_series_summary_matches_the_book(quakes):
    assert quakes.size == 107
    assert quakes.mean() == pytest.approx(19.364, abs=5e-4)
    assert quakes.var(ddof=1) == pytest.approx(51.573, abs=5e-4)


@pytest.mark.parametrize(
    ("num_states", "rates", "neg_log_lik"),
    [(2, [15.472, 26.125], 342.3183), (3, [13.146, 19.721, 29.714], 329.4603)],
)
def test_em_reaches_the_published_mle(quakes, num_states, rates, neg_log_lik):
    model = ss.PoissonHMM(num_states=num_states, initial="stationary")
    res = ss.fit_restarts(model, quakes, key=jax.random.key(0), num_restarts=4,
                          num_iters=500, tol=1e-11)
    fit = res.best
    order = np.argsort(np.asarray(fit.params.emissions.rates))
    # published values are rounded to 3 decimals (rates) and 4 decimals (log-likelihood);
    # the 3-state likelihood surface is flat enough that the 4th decimal can differ
    np.testing.assert_allclose(np.asarray(fit.params.emissions.rates)[order], rates, atol=2e-3)
    assert -fit.final_log_joint == pytest.approx(neg_log_lik, abs=5e-4 if num_states == 2
                                                 else 5e-3)
    assert float(ss.log_prob(model, fit.params, quakes)) == pytest.approx(fit.final_log_joint,
                                                                          abs=1e-6)
    if num_states == 2:
        gamma = np.asarray(fit.params.transitions)[np.ix_(order, order)]
        assert gamma[0, 1] == pytest.approx(0.0660, abs=1e-4)
        assert gamma[1, 0] == pytest.approx(0.1285, abs=1e-4)
