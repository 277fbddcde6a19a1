"""Fuzz: edge-case data that must give a finite (or -inf) result checked against a reference.

References are exact identities, not stored numbers: marginalizing the last step equals
dropping it; a prefix of length 1 scores what the longer filter scored at its first step
(causality); pandas ``NaN`` equals a ``False`` mask; integer and boolean data equal the same
values as floats; data of size 1e-300 score what zeros score; an HMM with one state is an
i.i.d. model (scipy); data impossible under an HMM score ``-inf`` at exactly that step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import scipy.stats

import statseq as ss
from tests.fuzz._models import build_specs

SPECS = build_specs()
SPEC_IDS = [s.name for s in SPECS]


def _lp(spec, y, **kw):
    return float(ss.log_prob(spec.model, spec.params, y, **kw))


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_masking_the_last_step_equals_dropping_it(spec):
    y = np.asarray(spec.y)
    mask = np.ones(y.shape[0], bool)
    mask[-1] = False
    np.testing.assert_allclose(_lp(spec, y, mask=mask), _lp(spec, y[:-1]), rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_pandas_nan_is_a_missing_value(spec):
    """A ``NaN`` in a pandas object is a missing value: the same per-step scores as the
    NumPy series with that step masked (0 at the masked step)."""
    y = np.asarray(spec.y, float)
    mask = np.ones(y.shape[0], bool)
    mask[4] = False
    holed = y.copy()
    holed[4] = np.nan
    frame = pd.Series(holed) if y.ndim == 1 else pd.DataFrame(holed)
    try:
        want = ss.filter(spec.model, spec.params, y, mask=mask).log_probs
    except ValueError as err:  # a model that cannot marginalize there says so, both ways
        with pytest.raises(ValueError, match=str(err).split(":")[0]):
            ss.filter(spec.model, spec.params, frame)
        assert "missing" in str(err)
        return
    got = ss.filter(spec.model, spec.params, frame).log_probs
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)
    assert float(got[4]) == 0.0 and np.all(np.isfinite(np.asarray(got)))


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_one_step_series_scores_the_first_step_of_a_longer_one(spec):
    y = np.asarray(spec.y)
    first = float(ss.filter(spec.model, spec.params, y).log_probs[0])
    got = ss.filter(spec.model, spec.params, y[:1])
    assert got.log_probs.shape == (1,)
    np.testing.assert_allclose(float(got.log_prob), first, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_all_missing_data_have_log_prob_zero_or_a_clear_error(spec):
    """No observation: the likelihood is the empty product, ``log p = 0`` (models that
    condition on their first observations say those must be observed)."""
    mask = np.zeros(np.asarray(spec.y).shape[0], bool)
    try:
        value = _lp(spec, spec.y, mask=mask)
    except ValueError as err:
        assert "must be observed" in str(err)
        return
    assert value == 0.0


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_integer_and_boolean_data_equal_the_same_floats(spec):
    y = np.asarray(spec.y)
    if spec.kind == "real":
        ints = np.round(y * 3).astype(np.int64)
        np.testing.assert_allclose(_lp(spec, ints), _lp(spec, ints.astype(float)), rtol=1e-12)
    if spec.kind in ("count", "category", "binary"):
        as_float = y.astype(float)
        np.testing.assert_allclose(_lp(spec, as_float), _lp(spec, y), rtol=1e-12)
    small = (np.abs(y) > np.median(np.abs(y)))
    np.testing.assert_allclose(_lp(spec, small), _lp(spec, small.astype(float)), rtol=1e-12)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.kind == "real"],
                         ids=[s.name for s in SPECS if s.kind == "real"])
def test_tiny_magnitudes_score_as_zeros(spec):
    """Data of size 1e-300 are representable in float64; their score equals that of zeros
    to rounding (every density is smooth at 0)."""
    y = np.asarray(spec.y, float)
    tiny = _lp(spec, y * 1e-300)
    assert np.isfinite(tiny)
    np.testing.assert_allclose(tiny, _lp(spec, np.zeros_like(y)), rtol=1e-12, atol=1e-12)


# ---- HMMs with one state are i.i.d. models ------------------------------------------------
def _one_state(model_cls, emissions, **kw):
    model = model_cls(num_states=1, **kw)
    return model, model.assemble_params(emissions)


def test_one_state_hmms_are_iid_models():
    from statseq.models.hmm.bernoulli import BernoulliEmissions
    from statseq.models.hmm.categorical import CategoricalEmissions
    from statseq.models.hmm.poisson import PoissonEmissions

    rng = np.random.default_rng(3)
    counts = rng.poisson(2.0, 12)
    model, params = _one_state(ss.PoissonHMM, PoissonEmissions(jnp.array([2.5])))
    np.testing.assert_allclose(float(ss.log_prob(model, params, counts)),
                               scipy.stats.poisson.logpmf(counts, 2.5).sum(), rtol=1e-12)
    cats = rng.integers(0, 3, 12)
    probs = np.array([[0.2, 0.5, 0.3]])
    model, params = _one_state(ss.CategoricalHMM, CategoricalEmissions(jnp.asarray(probs)),
                               num_classes=3)
    np.testing.assert_allclose(float(ss.log_prob(model, params, cats)),
                               np.log(probs[0, cats]).sum(), rtol=1e-12)
    bits = (rng.random((12, 2)) < 0.3).astype(int)
    p = np.array([[0.2, 0.7]])
    model, params = _one_state(ss.BernoulliHMM, BernoulliEmissions(jnp.asarray(p)),
                               emission_dim=2)
    np.testing.assert_allclose(float(ss.log_prob(model, params, bits)),
                               scipy.stats.bernoulli.logpmf(bits, p[0]).sum(), rtol=1e-12)


def test_em_with_one_state_gives_the_iid_mle():
    """K = 1: the Poisson rate's MLE is the sample mean, reached in one EM step."""
    from statseq.models.hmm.poisson import PoissonEmissions

    counts = np.random.default_rng(4).poisson(3.0, 20)
    model, params = _one_state(ss.PoissonHMM, PoissonEmissions(jnp.array([1.0])))
    fit = ss.fit_em(model, params, counts, num_iters=2, progress=False)
    np.testing.assert_allclose(float(fit.params.emissions.rates[0]), counts.mean(),
                               rtol=1e-12)
    np.testing.assert_allclose(fit.final_log_joint,
                               scipy.stats.poisson.logpmf(counts, counts.mean()).sum(),
                               rtol=1e-12)


# ---- data impossible under the model: -inf, not NaN -------------------------------------
def _impossible_categorical():
    from statseq.models.hmm.categorical import CategoricalEmissions

    model = ss.CategoricalHMM(num_states=2, num_classes=3)
    # symbol 2 has probability 0 in both states
    params = model.assemble_params(CategoricalEmissions(jnp.array([[0.6, 0.4, 0.0],
                                                                   [0.1, 0.9, 0.0]])))
    return model, params


def test_impossible_category_scores_minus_inf_at_that_step():
    model, params = _impossible_categorical()
    y = np.array([0, 1, 2, 0, 1])
    res = ss.filter(model, params, y)
    log_probs = np.asarray(res.log_probs)
    assert float(res.log_prob) == -np.inf and log_probs[2] == -np.inf
    # the other steps are finite; the steps before equal the filter of the possible prefix
    assert np.all(np.isfinite(np.delete(log_probs, 2)))
    np.testing.assert_allclose(log_probs[:2], np.asarray(ss.filter(model, params,
                                                                   y[:2]).log_probs),
                               rtol=1e-12)
    assert float(ss.log_prob(model, params, y)) == -np.inf


def test_posteriors_refuse_impossible_data():
    model, params = _impossible_categorical()
    y = np.array([0, 1, 2, 0, 1])
    for call in (lambda: model.most_likely_states(params, y),
                 lambda: model.smoother(params, y),
                 lambda: model.sample_states_posterior(params, y, key=jax.random.key(0))):
        with pytest.raises(ValueError, match="probability zero"):
            call()
    # possible data still go through
    assert model.most_likely_states(params, np.array([0, 1, 1])).shape == (3,)


def test_bernoulli_one_with_probability_zero_is_minus_inf():
    from statseq.models.hmm.bernoulli import BernoulliEmissions

    model = ss.BernoulliHMM(num_states=2, emission_dim=1)
    params = model.assemble_params(BernoulliEmissions(jnp.array([[0.0], [0.0]])))
    y = np.array([[0], [1], [0]])
    assert float(ss.log_prob(model, params, y)) == -np.inf
    assert float(ss.log_prob(model, params, y[[0, 2]])) == 0.0  # p(0) = 1 in both states
    with pytest.raises(ValueError, match="probability zero"):
        model.most_likely_states(params, y)


# ---- sampling ---------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_sample_of_one_step(spec):
    draw = np.asarray(ss.sample(spec.model, spec.params, num_timesteps=1,
                                key=jax.random.key(1)))
    assert draw.shape == (1,) + spec.event_shape and np.all(np.isfinite(draw))


def test_parallel_and_sequential_filters_agree_on_impossible_data():
    from statseq.inference import hmm, hmm_parallel

    pi = jnp.array([0.5, 0.5])
    trans = jnp.array([[0.9, 0.1], [0.2, 0.8]])
    ll = jnp.log(jnp.array([[0.6, 0.1], [0.4, 0.9], [0.0, 0.0], [0.6, 0.1]]))
    # jitted, as every statseq caller runs them: one program each instead of dozens of
    # eager ops compiled one by one (4 s -> 1 s of CPU); the masked run reuses the first
    sequential, parallel = jax.jit(hmm.hmm_filter), jax.jit(hmm_parallel.hmm_filter)
    seq, par = sequential(pi, trans, ll), parallel(pi, trans, ll)
    assert float(seq.marginal_log_lik) == float(par.marginal_log_lik) == -np.inf
    np.testing.assert_allclose(np.asarray(par.log_normalizers),
                               np.asarray(seq.log_normalizers), rtol=1e-12)
    # after the impossible step both carry the message on: the last step scores as if the
    # impossible row were absent (a row of zeros, i.e. a masked step)
    masked = sequential(pi, trans, ll.at[2].set(0.0))
    np.testing.assert_allclose(float(seq.log_normalizers[3]),
                               float(masked.log_normalizers[3]), rtol=1e-12)
