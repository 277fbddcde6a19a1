"""EncoderDecoder (seq2seq): the teacher-forced decoder (one backbone scan) against the
step-by-step filter, greedy decoding against beam search of width 1, beam search of full
width against exhaustive enumeration, the forecast mean of a linear (identity) decoder
against its closed form, backtests (1-step log score exact), teacher-forced training with
fit_sgd, and bad input."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.models.neural.seq2seq import EncoderDecoder, IdentityBackbone

T_SRC, T_TGT = 7, 5


@pytest.fixture(scope="module")
def gaussian():
    """Elman encoder (H = 3) and decoder (H = 2): different states, so the decoder reads
    the encoder's context only; one covariate."""
    rng = np.random.default_rng(0)
    u = rng.normal(size=(40, 1))
    y = np.cumsum(rng.normal(size=40)) * 0.3 + 0.5 * u[:, 0]
    model = EncoderDecoder(encoder=ss.ElmanRNN(hidden_dim=3), decoder=ss.ElmanRNN(hidden_dim=2),
                           input_dim=1)
    params = model.initialize(y, inputs=u, key=jax.random.key(0))
    return model, params, y, u


@pytest.fixture(scope="module")
def categorical():
    """Elman encoder and decoder of one size: the decoder starts from the encoder's state."""
    y = np.array([0, 1, 2, 2, 1, 0, 1, 2, 0, 0, 1, 2])
    model = EncoderDecoder(encoder=ss.ElmanRNN(hidden_dim=4), emission="categorical",
                           num_classes=3)
    params = model.initialize(y, key=jax.random.key(1))
    # larger weights: well separated class probabilities (no ties in the argmax)
    params = params._replace(head=params.head._replace(weight=params.head.weight * 30))
    return model, params, y


def _step_by_step(model, params, carry, target, inputs):
    """The one-step predictives, a Python loop of (compiled) predict / update steps."""

    @jax.jit
    def step(c, y_k, u_k):
        lp = model.predict(params, c, u_k).log_prob(y_k)
        return lp, model.update(params, c, y_k, True, u_k)

    lps = []
    for k in range(target.shape[0]):
        lp, carry = step(carry, target[k], inputs[k])
        lps.append(float(lp))
    return np.array(lps)


def test_teacher_forced_equals_step_by_step(gaussian, categorical):
    model, params, y, u = gaussian
    assert not model.shares_state
    src, tgt = y[:T_SRC], y[T_SRC:T_SRC + T_TGT]
    u_src, u_tgt = u[:T_SRC], u[T_SRC:T_SRC + T_TGT]
    tf = np.asarray(model.teacher_forced_log_probs(params, src, tgt, source_inputs=u_src,
                                                   target_inputs=u_tgt))
    carry = model.encode_source(params, src, source_inputs=u_src)
    np.testing.assert_allclose(tf, _step_by_step(model, params, carry, jnp.asarray(tgt),
                                                 jnp.asarray(u_tgt)), rtol=1e-12, atol=1e-12)
    # the filter of the context_length model over source + target: the same steps
    windowed = EncoderDecoder(encoder=model.encoder, decoder=model.decoder, input_dim=1,
                              context_length=T_SRC)
    res = ss.filter(windowed, params, y[:T_SRC + T_TGT], inputs=u[:T_SRC + T_TGT])
    np.testing.assert_allclose(np.asarray(res.log_probs)[T_SRC:], tf, rtol=1e-12, atol=1e-12)

    cmodel, cparams, cy = categorical
    assert cmodel.shares_state
    tf = np.asarray(cmodel.teacher_forced_log_probs(cparams, cy[:6], cy[6:]))
    carry = cmodel.encode_source(cparams, cy[:6])
    zeros = jnp.zeros((cy.size - 6, 0))
    np.testing.assert_allclose(tf, _step_by_step(cmodel, cparams, carry, jnp.asarray(cy[6:]),
                                                 zeros), rtol=1e-12, atol=1e-12)


def test_greedy_equals_beam_width_one(categorical, gaussian):
    model, params, y = categorical
    seq, lp = model.greedy_decode(params, y[:6], num_steps=4)
    beams, scores = model.beam_search(params, y[:6], num_steps=4, beam_width=1)
    np.testing.assert_array_equal(np.asarray(seq), np.asarray(beams[0]))
    assert float(scores[0]) == pytest.approx(float(lp), abs=1e-12)
    # the greedy path's log-probability is its teacher-forced likelihood
    tf = model.teacher_forced_log_probs(params, y[:6], np.asarray(seq))
    assert float(lp) == pytest.approx(float(jnp.sum(tf)), abs=1e-12)
    # a Gaussian decoder's greedy path follows the predictive means
    gmodel, gparams, gy, gu = gaussian
    path, _ = gmodel.greedy_decode(gparams, gy[:T_SRC], num_steps=2,
                                   source_inputs=gu[:T_SRC], future_inputs=gu[T_SRC:T_SRC + 2])
    carry = gmodel.encode_source(gparams, gy[:T_SRC], source_inputs=gu[:T_SRC])
    first = gmodel.predict(gparams, carry, jnp.asarray(gu[T_SRC])).mean
    assert float(path[0]) == pytest.approx(float(first), abs=1e-12)


def test_full_beam_equals_exhaustive_argmax(categorical):
    model, params, y = categorical
    num_steps, num_classes = 3, 3
    beams, scores = model.beam_search(params, y[:6], num_steps=num_steps,
                                      beam_width=num_classes**num_steps)
    every = np.array(list(itertools.product(range(num_classes), repeat=num_steps)))
    exact = np.array([float(jnp.sum(model.teacher_forced_log_probs(params, y[:6], s)))
                      for s in every])
    np.testing.assert_array_equal(np.asarray(beams[0]), every[np.argmax(exact)])
    np.testing.assert_allclose(np.asarray(scores), np.sort(exact)[::-1], atol=1e-12)
    assert np.exp(exact).sum() == pytest.approx(1.0, abs=1e-12)  # a proper law on T' = 3


def test_identity_decoder_forecast_mean_is_analytic():
    """Identity decoder: E[y_k] = a E[y_{k-1}] + b (linear readout of [y_{k-1}, 1, c])."""
    rng = np.random.default_rng(2)
    y = np.sin(np.arange(25.0) / 2) + 0.1 * rng.normal(size=25)
    model = EncoderDecoder(encoder=ss.ElmanRNN(hidden_dim=3), decoder=IdentityBackbone())
    params = model.initialize(y, key=jax.random.key(3))
    weight = params.head.weight.at[0, 0].set(0.8).at[0, 2:].set(jnp.array([0.5, -0.3, 0.2]))
    params = params._replace(head=params.head._replace(weight=weight))
    h, num_samples = 4, 4000
    fc = ss.forecast(model, params, y, num_steps=h, num_samples=num_samples,
                     key=jax.random.key(4))
    # the closed form, from the encoder backbone run directly over [y_t, 1]
    xs = jnp.stack([jnp.asarray(y), jnp.ones(25)], axis=1)
    context = np.asarray(model.encoder_backbone.sequence(params.encoder, xs)[-1])
    w, b = np.asarray(params.head.weight[0]), float(params.head.bias[0])
    mean, expected = y[-1], []
    for _ in range(h):
        mean = w[0] * mean + w[1] + w[2:] @ context + b
        expected.append(mean)
    samples = np.asarray(fc.samples)
    se = samples.std(axis=0) / np.sqrt(num_samples)
    assert np.all(np.abs(samples.mean(axis=0) - np.array(expected)) < 4 * se)


def test_backtest_and_forecast_with_future_covariates(gaussian):
    model, params, y, u = gaussian
    res = ss.backtest(model, params, y, inputs=u, horizon=2, origins=[30, 37],
                      num_samples=50, num_paths=64, key=jax.random.key(5))
    assert res.samples.shape == (2, 50, 2)
    assert np.isfinite(res.table["crps"]).all() and np.isfinite(res.table["log_score"]).all()
    assert list(res.summary.index) == [1, 2]
    # horizon 1 is exact: the decoder's first step after encoding y[:o]
    for i, o in enumerate(res.origins):
        lp = model.teacher_forced_log_probs(params, y[:o], y[o:o + 1],
                                            source_inputs=u[:o], target_inputs=u[o:o + 1])
        row = res.table[(res.table.origin == o) & (res.table.horizon == 1)]
        assert float(row.log_score.iloc[0]) == pytest.approx(float(lp[0]), abs=1e-10)
        if i:  # (one origin is enough)
            continue
        # backtest's paths are forecast's on the truncated series (same keys)
        fc = ss.forecast(model, params, y[:o], inputs=u[:o], future_inputs=u[o:o + 2],
                         num_steps=2, num_samples=50,
                         key=jax.random.fold_in(jax.random.key(5), i))
        np.testing.assert_allclose(res.samples[i], np.asarray(fc.samples), atol=1e-10)


def test_backtest_two_step_score_is_the_decoder_marginal(categorical):
    """The backtest's k = 2 Monte Carlo log score against the exact sum over y_{o}: the
    paths decode (the encoder frozen at the origin), as the forecast's samples do."""
    model, params, y = categorical
    o = 8
    res = ss.backtest(model, params, y, horizon=2, origins=[o], num_samples=10,
                      num_paths=2048, key=jax.random.key(7))
    exact = np.log(sum(np.exp(float(jnp.sum(model.teacher_forced_log_probs(
        params, y[:o], np.array([a, y[o + 1]]))))) for a in range(3)))
    row = res.table[res.table.horizon == 2].iloc[0]
    assert bool(row.log_score_is_estimate) and row.log_score_se > 0
    assert abs(row.log_score - exact) < 4 * row.log_score_se + 1e-12


def test_fit_sgd_teacher_forcing(gaussian):
    model, params, y, u = gaussian
    windowed = EncoderDecoder(encoder=model.encoder, decoder=model.decoder, input_dim=1,
                              context_length=T_SRC)
    wins, scored, wu = windowed.windows(y, horizon=3, stride=5, inputs=u)
    assert wins.shape == (7, T_SRC + 3) and scored.sum() == 7 * 3
    fit = ss.fit_sgd(windowed, params, wins, inputs=wu, scored=scored, num_steps=5,
                     learning_rate=0.02, key=jax.random.key(6), progress=False)
    trace = np.asarray(fit.log_joint)
    assert np.all(np.isfinite(trace)) and trace[-1] > trace[0]
    # the objective is the sum of the windows' teacher-forced likelihoods
    total = sum(float(jnp.sum(model.teacher_forced_log_probs(
        params, w[:T_SRC], w[T_SRC:], source_inputs=v[:T_SRC], target_inputs=v[T_SRC:])))
        for w, v in zip(wins, wu, strict=True))
    assert trace[0] == pytest.approx(total, abs=1e-8)


def test_bad_input(gaussian, categorical):
    model, params, y, u = gaussian
    with pytest.raises(ValueError, match="target_inputs must have shape"):
        model.teacher_forced_log_probs(params, y[:5], y[5:8], source_inputs=u[:5],
                                       target_inputs=u[5:7])
    with pytest.raises(ValueError, match="source_inputs must have shape"):
        model.teacher_forced_log_probs(params, y[:5], y[5:8], source_inputs=u[:6],
                                       target_inputs=u[5:8])
    with pytest.raises(ValueError, match="pass future_inputs"):
        model.greedy_decode(params, y[:5], num_steps=2, source_inputs=u[:5])
    with pytest.raises(ValueError, match="future inputs"):
        ss.forecast(model, params, y, inputs=u, num_steps=2, num_samples=3,
                    key=jax.random.key(0))
    with pytest.raises(ValueError, match="target contains NaN"):
        model.teacher_forced_log_probs(params, y[:5], np.array([1.0, np.nan]),
                                       source_inputs=u[:5], target_inputs=u[5:7])
    with pytest.raises(ValueError, match="source must have shape"):
        model.encode_source(params, y[:0], source_inputs=u[:0])
    with pytest.raises(ValueError, match="categorical head"):
        model.beam_search(params, y[:5], num_steps=2, beam_width=2, source_inputs=u[:5],
                          future_inputs=u[5:7])
    with pytest.raises(ValueError, match="context_length"):
        model.windows(y, horizon=2)
    cmodel, cparams, cy = categorical
    with pytest.raises(ValueError, match="integer categories"):
        cmodel.teacher_forced_log_probs(cparams, cy[:5], np.array([0, 3]))
    with pytest.raises(TypeError, match="encoder must be a neural model"):
        EncoderDecoder(encoder="gru")
    with pytest.raises(ValueError, match="context_length"):
        EncoderDecoder(context_length=0)
    with pytest.raises(TypeError, match="cannot be saved"):
        ss.save("unused", model, params)
