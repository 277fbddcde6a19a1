"""make_windows (truncated BPTT by windows), fit_sgd's ``scored`` steps, optax schedules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statseq as ss
from statseq.fit.windows import make_windows


def test_windows_cover_every_step_once():
    y = np.arange(23.0)
    w = make_windows(y, length=8, warmup=3)
    assert w.starts.tolist() == [0, 5, 10, 15]
    np.testing.assert_array_equal(w.y, y[w.starts[:, None] + np.arange(8)])
    # first window scores everything, later ones only past their warmup; each step once
    assert w.scored[0].all() and not w.scored[1:, :3].any()
    hits = np.zeros(23, int)
    for s, row in zip(w.starts, w.scored, strict=True):
        hits[s + np.nonzero(row)[0]] += 1
    np.testing.assert_array_equal(hits, 1)
    # a stride that overshoots gets a final window aligned to the end, still scored once
    w2 = make_windows(y, length=8, stride=7)
    assert w2.starts.tolist() == [0, 7, 14, 15]
    hits = np.zeros(23, int)
    for s, row in zip(w2.starts, w2.scored, strict=True):
        hits[s + np.nonzero(row)[0]] += 1
    np.testing.assert_array_equal(hits, 1)


def test_windows_masks_inputs_and_errors():
    y = np.arange(10.0)
    y[4] = np.nan
    u = np.arange(20.0).reshape(10, 2)
    w = make_windows(y, length=5, stride=5, mask=np.isfinite(y), inputs=u)
    assert w.mask.shape == (2, 5) and not w.mask[0, 4] and w.y[0, 4] == 0.0
    np.testing.assert_array_equal(w.inputs[1], u[5:])
    with pytest.raises(ValueError, match="warmup"):
        make_windows(y, length=3, warmup=3)
    with pytest.raises(ValueError, match="length"):
        make_windows(y, length=11)
    with pytest.raises(ValueError, match="inputs"):
        make_windows(y, length=3, inputs=u[:5])


@pytest.fixture(scope="module")
def series():
    rng = np.random.default_rng(0)
    y = np.zeros(60)
    for t in range(1, 60):
        y[t] = 0.7 * y[t - 1] + rng.normal()
    return y


def test_windowed_objective_is_sum_of_scored_window_log_probs(series):
    model = ss.ElmanRNN(hidden_dim=3)
    params = model.initialize(series, key=jax.random.key(0))
    w = make_windows(series, length=20, warmup=5)
    fit = ss.fit_sgd(model, params, **w.fit_kwargs(), optimizer=optax.sgd(0.0),
                     num_steps=1, key=jax.random.key(1), progress=False)
    per_step = np.asarray(ss.filter(model, params, w.y).log_probs)
    expected = float(np.sum(np.where(w.scored, per_step, 0.0)))
    np.testing.assert_allclose(fit.log_joint[0], expected, rtol=1e-12)
    # one window over the whole series without warmup is the exact log-likelihood
    whole = make_windows(series, length=60)
    fit = ss.fit_sgd(model, params, **whole.fit_kwargs(), optimizer=optax.sgd(0.0),
                     num_steps=1, key=jax.random.key(1), progress=False)
    np.testing.assert_allclose(fit.log_joint[0], float(ss.log_prob(model, params, series)),
                               rtol=1e-12)


def test_gradients_do_not_cross_windows(series):
    """Truncation: the objective's gradient with respect to a window's data involves only
    that window (perturbing one window's values changes no other window's terms)."""
    model = ss.GRU(hidden_dim=3)
    params = model.initialize(series, key=jax.random.key(0))
    w = make_windows(series, length=20, warmup=5)

    def objective(ys):
        lps = ss.filter(model, params, ys).log_probs
        return jnp.sum(jnp.where(w.scored, lps, 0.0), axis=1)

    jac = np.asarray(jax.jacobian(objective)(jnp.asarray(w.y)))  # (window, window, step)
    off_diagonal = jac[~np.eye(len(w.starts), dtype=bool)]
    assert np.all(off_diagonal == 0) and np.any(jac != 0)


def test_minibatches_of_windows_with_validation_and_clipping(series):
    model = ss.LSTM(hidden_dim=3)
    params = model.initialize(series, key=jax.random.key(0))
    w = make_windows(series, length=12, warmup=2)
    opt = optax.adam(0.02)
    run = lambda key: ss.fit_sgd(  # noqa: E731
        model, params, **w.fit_kwargs(), optimizer=opt, num_steps=40, key=key,
        batch_size=2, clip_norm=5.0, validation=0.3, eval_every=5, progress=False)
    first, again = run(jax.random.key(2)), run(jax.random.key(2))
    np.testing.assert_array_equal(first.log_joint, again.log_joint)
    assert np.all(np.isfinite(first.log_joint)) and first.validation_log_prob.size > 0
    with pytest.raises(ValueError, match="scored must have shape"):
        ss.fit_sgd(model, params, w.y, scored=w.scored[:, :5], optimizer=opt, num_steps=1,
                   key=jax.random.key(0), progress=False)


def test_optax_schedule_as_learning_rate(series):
    """A schedule that drops the learning rate to 0 after 10 steps freezes the parameters:
    20 steps with it equal 10 steps at the constant rate."""
    model = ss.ElmanRNN(hidden_dim=3)
    params = model.initialize(series, key=jax.random.key(0))
    schedule = optax.piecewise_constant_schedule(0.05, {10: 0.0})
    kw = dict(key=jax.random.key(0), progress=False)
    scheduled = ss.fit_sgd(model, params, series, optimizer=optax.sgd(schedule),
                           num_steps=20, **kw)
    constant = ss.fit_sgd(model, params, series, optimizer=optax.sgd(0.05), num_steps=10,
                          **kw)
    for a, b in zip(jax.tree.leaves(scheduled.params), jax.tree.leaves(constant.params),
                    strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
    assert np.all(np.diff(scheduled.log_joint[10:]) == 0)
    assert not np.all(np.diff(scheduled.log_joint[:10]) == 0)


def test_scored_steps_of_a_single_series_with_validation(series):
    """One series: ``scored`` drops leading steps from the objective; the time split for
    validation still holds out the final steps (masked in training)."""
    model = ss.ElmanRNN(hidden_dim=3)
    params = model.initialize(series, key=jax.random.key(0))
    scored = np.arange(60) >= 5
    fit = ss.fit_sgd(model, params, series, scored=scored, validation=0.25, eval_every=1,
                     optimizer=optax.sgd(0.0), num_steps=1, key=jax.random.key(1),
                     progress=False)
    train_mask = np.arange(60) < 45
    lps = np.asarray(ss.filter(model, params, series, mask=train_mask).log_probs)
    np.testing.assert_allclose(fit.log_joint[0], lps[5:].sum(), rtol=1e-12)
    full = np.asarray(ss.filter(model, params, series).log_probs)
    np.testing.assert_allclose(fit.validation_log_prob[0], full[45:].sum(), rtol=1e-12)
