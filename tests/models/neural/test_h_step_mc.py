"""Neural h-step marginals and gap likelihoods are honest Monte Carlo estimates (issue 20).

A neural network reads a masked step as 0 plus an indicator, so masking the steps between
the origin and the target (the exact route for HMMs, AR and Kalman models) scores a model
of data with gaps, not the marginal of the network's own forecast distribution. statseq
now estimates ``log p(y_{T+k} | y_{1:T})`` by Rao-Blackwellised ancestral Monte Carlo with
a standard error; these tests compare it with the claims audit's independent references
(`tests/_claims.py`: fine grid at k = 2, Gauss-Hermite, an independent Monte Carlo), and
the gap likelihood with brute-force enumeration (categorical head) and an independent
sequential importance sampler (Gaussian head).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from tests._claims import (
    check_marginal_predictive,
    filtered_carry,
    gauss_hermite,
    grid_two_step,
    rb_monte_carlo,
)

RNG = np.random.default_rng(0)
Y = np.sin(np.arange(40) * 0.5) + 0.3 * RNG.normal(size=40)
HIST, FUT = Y[:32], Y[32:40]  # horizons 1..8

BACKBONES = {
    "elman": ss.ElmanRNN(hidden_dim=3),
    "gru": ss.GRU(hidden_dim=4),
    "lstm": ss.LSTM(hidden_dim=3),
    "stacked": ss.GRU(hidden_dim=3, num_layers=2),
    "lru": ss.LRU(hidden_dim=3, state_dim=2),
    "mamba": ss.Mamba(hidden_dim=3, state_dim=2, num_layers=1),
    "wavenet": ss.WaveNet(hidden_dim=3, num_layers=2),
    "s4d": ss.S4D(hidden_dim=3, state_dim=2, num_layers=1),
    "s5": ss.S5(hidden_dim=3, state_dim=2, num_layers=1),
    "linear_attention": ss.LinearAttention(hidden_dim=2, num_heads=1, num_layers=1),
    "aft": ss.AFT(hidden_dim=3, num_layers=1, variant="local", window=2, max_len=16),
    "rwkv": ss.RWKV(hidden_dim=3, num_layers=1, ffn_dim=3),
    "mlstm": ss.MLSTM(hidden_dim=2, num_layers=1, num_heads=1, expand=1),
    "transformer": ss.Transformer(hidden_dim=3, num_layers=1, num_heads=1, max_len=8,
                                  mlp_ratio=1, positional="sinusoidal"),
    "esn": ss.ElmanRNN(hidden_dim=4, echo_state=True),
}


def _masked_route(model, params, hist, target, k):
    """The old answer: the filter with the k - 1 steps in between masked (an indicator)."""
    y = np.concatenate([hist, np.zeros(k - 1), [target]])
    mask = np.ones(y.size, bool)
    mask[hist.size:hist.size + k - 1] = False
    return float(ss.filter(model, params, y, mask=mask).log_probs[-1])


@pytest.mark.parametrize("name", list(BACKBONES))
def test_every_backbone_matches_the_claims_audit(name):
    model = BACKBONES[name]
    assert model.marginalizes_masked_steps is False
    params = model.initialize(HIST, key=jax.random.key(1))
    values, se = ss.log_predictive_density(model, params, HIST, FUT, marginal=True,
                                           return_se=True, key=jax.random.key(5),
                                           num_paths=4096)
    assert se[0] == 0.0 and np.all(se[1:] > 0) and np.all(se < 0.01)
    out = check_marginal_predictive(model, params, HIST, FUT, statseq_values=values,
                                    statseq_se=se, num_paths=20_000, quadrature=False)
    # the masked (indicator) route this replaces is wrong by many standard errors
    old = _masked_route(model, params, HIST, FUT[1], 2)
    assert abs(old - out["grid2"]) > 1e-3 + 10 * se[1], (old, out["grid2"], se[1])


def test_gru_issue_example():
    """Issue 20's GRU (hidden 4, from `initialize`): the masked route's 2-step marginal
    is off (the issue: -0.6768 against the true -0.6640; that series was not given, so
    here the same setting on this file's series); the estimate is within 4 SE of the grid
    truth, the old number is not."""
    model = ss.GRU(hidden_dim=4)
    params = model.initialize(HIST, key=jax.random.key(1))
    carry = filtered_carry(model, params, HIST)
    truth = grid_two_step(model, params, carry, FUT[:2])
    assert abs(gauss_hermite(model, params, carry, FUT[:2], 2) - truth) < 1e-8
    old = _masked_route(model, params, HIST, FUT[1], 2)
    values, se = ss.log_predictive_density(model, params, HIST, FUT[:2], marginal=True,
                                           return_se=True)  # the default key and paths
    assert se[1] <= 0.01
    assert abs(values[1] - truth) <= 1e-6 + 4 * se[1], (values[1], truth, se[1])
    assert abs(old - truth) > 20 * se[1] + 1e-3, (old, truth)
    # the same (default) key gives identical numbers; another key other numbers
    again = ss.log_predictive_density(model, params, HIST, FUT[:2], marginal=True,
                                      key=jax.random.key(0))
    np.testing.assert_array_equal(again, values)
    other = ss.log_predictive_density(model, params, HIST, FUT[:2], marginal=True,
                                      key=jax.random.key(7))
    assert other[0] == values[0] and other[1] != values[1]


def test_default_paths_reach_the_target_standard_error(monkeypatch):
    """The default extends a 4096-path pilot until every SE meets the target (here made
    stricter than 0.01 so that this small model needs more paths), and warns at the cap."""
    from statseq.evaluation import _origins

    model = ss.GRU(hidden_dim=4)
    params = model.initialize(HIST, key=jax.random.key(1))
    params = params._replace(head=params.head._replace(weight=params.head.weight * 20))
    _, pilot = ss.log_predictive_density(model, params, HIST, FUT, marginal=True,
                                         return_se=True, num_paths=4096)
    target = 0.6 * pilot.max()
    monkeypatch.setattr(_origins, "TARGET_SE", target)
    _, se = ss.log_predictive_density(model, params, HIST, FUT, marginal=True,
                                      return_se=True)
    assert se.max() <= target < pilot.max()
    monkeypatch.setattr(_origins, "TARGET_SE", target / 10)
    monkeypatch.setattr(_origins, "MAX_PATHS", 5120)
    with pytest.warns(UserWarning, match="5120 paths"):
        _, se = ss.log_predictive_density(model, params, HIST, FUT, marginal=True,
                                          return_se=True)
    assert se.max() > target / 10


def test_backtest_of_a_gru_carries_standard_errors():
    model = ss.GRU(hidden_dim=4)
    params = model.initialize(Y, key=jax.random.key(1))
    params = params._replace(head=params.head._replace(weight=params.head.weight * 5))
    res = ss.backtest(model, params, Y, horizon=3, origins=[30, 34], num_samples=20,
                      key=jax.random.key(3), num_paths=3000)
    again = ss.backtest(model, params, Y, horizon=3, origins=[30, 34], num_samples=20,
                        key=jax.random.key(3), num_paths=3000)
    np.testing.assert_array_equal(res.table["log_score"], again.table["log_score"])
    table = res.table
    assert {"log_score_se", "log_score_is_estimate"} <= set(table.columns)
    np.testing.assert_array_equal(table["log_score_is_estimate"], table["horizon"] > 1)
    for i, o in enumerate([30, 34]):
        rows = table[table["origin"] == o].sort_values("horizon")
        got, se = rows["log_score"].to_numpy(), rows["log_score_se"].to_numpy()
        carry = filtered_carry(model, params, Y[:o])
        ref, ref_se = rb_monte_carlo(model, params, carry, Y[o:o + 3],
                                     key=jax.random.key(100 + i), num_paths=20_000)
        assert se[0] == 0.0 and np.all(se[1:] > 0)
        np.testing.assert_allclose(got[0], ref[0], rtol=0, atol=1e-10)
        assert np.all(np.abs(got - ref) <= 4 * np.sqrt(se**2 + ref_se**2) + 1e-9), (got, ref)
        g2 = grid_two_step(model, params, carry, Y[o:o + 2])
        assert abs(got[1] - g2) <= 1e-6 + 4 * se[1]
    # the summary's SE is that of the mean over origins
    per_h = table.groupby("horizon")["log_score_se"]
    np.testing.assert_allclose(res.summary["log_score_se"],
                               np.sqrt(per_h.apply(lambda s: (s**2).sum())) / 2)


def test_vector_gru_marginals_and_per_dimension_backtest_scores():
    rng = np.random.default_rng(1)
    y = rng.normal(size=(30, 2)).cumsum(0) * 0.3
    model = ss.GRU(hidden_dim=3, emission_dim=2)
    params = model.initialize(y, key=jax.random.key(0))
    params = params._replace(head=params.head._replace(weight=params.head.weight * 5))
    values, se = ss.log_predictive_density(model, params, y[:24], y[24:28], marginal=True,
                                           return_se=True, num_paths=4000)
    check_marginal_predictive(model, params, y[:24], y[24:28], statseq_values=values,
                              statseq_se=se, num_paths=20_000, quadrature=False)
    mask = np.ones((30, 2), bool)
    mask[26, 1] = False
    res = ss.backtest(model, params, y, horizon=3, origins=[24], num_samples=10,
                      key=jax.random.key(0), num_paths=2000, mask=mask)
    t = res.table.sort_values(["horizon", "series"])
    d1 = model.predict(params, filtered_carry(model, params, y[:24]), jnp.zeros((0,)))
    np.testing.assert_allclose(t["log_score"].to_numpy()[:2],
                               np.asarray(d1.base_dist.log_prob(y[24])), atol=1e-10)
    np.testing.assert_array_equal(t["log_score_se"].to_numpy()[:2], 0.0)
    assert np.all(t["log_score_se"].to_numpy()[2:5] > 0)
    assert np.isnan(t["log_score"].to_numpy()[5]) and np.isnan(t["log_score_se"].to_numpy()[5])
    np.testing.assert_array_equal(t["log_score_is_estimate"], [0, 0, 1, 1, 1, 0])


def test_exact_models_report_zero_standard_errors():
    model = ss.AR(order=1)
    params = model.default_params()
    assert model.marginalizes_masked_steps is True
    res = ss.backtest(model, params, Y, horizon=2, origins=[30], num_samples=20,
                      key=jax.random.key(0))
    assert not res.table["log_score_is_estimate"].any()
    np.testing.assert_array_equal(res.table["log_score_se"], 0.0)
    values, se = ss.log_predictive_density(model, params, HIST, FUT[:3], marginal=True,
                                           return_se=True)
    np.testing.assert_array_equal(se, 0.0)
    np.testing.assert_array_equal(
        values, ss.log_predictive_density(model, params, HIST, FUT[:3], marginal=True))


def test_bad_arguments_are_refused():
    model = ss.GRU(hidden_dim=2)
    params = model.initialize(HIST, key=jax.random.key(0))
    with pytest.raises(ValueError, match="return_se needs marginal"):
        ss.log_predictive_density(model, params, HIST, FUT, return_se=True)
    with pytest.raises(ValueError, match="num_paths"):
        ss.log_predictive_density(model, params, HIST, FUT, marginal=True, num_paths=1)
    with pytest.raises(ValueError, match="num_replicates"):
        ss.estimate_log_prob(model, params, HIST, num_replicates=1)


# ---- the marginal likelihood of data with gaps ---------------------------------------


def test_gap_likelihood_of_a_categorical_gru_equals_enumeration():
    model = ss.GRU(hidden_dim=3, emission="categorical", num_classes=3)
    y = np.array([0, 1, 2, 2, 1, 0, 0, 1])
    mask = np.ones(8, bool)
    mask[[2, 5]] = False
    params = model.initialize(y, key=jax.random.key(1))
    params = params._replace(head=params.head._replace(weight=params.head.weight * 10))
    lp, se = ss.estimate_log_prob(model, params, y, mask, key=jax.random.key(3))
    fills = []
    for a, b in itertools.product(range(3), repeat=2):
        f = y.copy()
        f[2], f[5] = a, b
        fills.append(f)
    exact = float(jax.scipy.special.logsumexp(ss.log_prob(model, params, np.stack(fills))))
    assert 0 < se < 0.01
    assert abs(lp - exact) <= 4 * se, (lp, exact, se)
    gap_model = float(ss.log_prob(model, params, y, mask=mask))  # the indicator model
    assert abs(gap_model - exact) > 10 * se
    # no gaps: the exact log_prob, SE 0; exact models route to log_prob
    full, full_se = ss.estimate_log_prob(model, params, y)
    assert full_se == 0.0 and full == pytest.approx(float(ss.log_prob(model, params, y)),
                                                    abs=1e-10)
    ar = ss.AR(order=1)
    m = np.ones(40, bool)
    m[10:13] = False
    lp_ar, se_ar = ss.estimate_log_prob(ar, ar.default_params(), Y, m)
    assert se_ar == 0.0 and lp_ar == float(ss.log_prob(ar, ar.default_params(), Y, mask=m))


def _sis_reference(model, params, y, mask, key, num_paths):
    """Independent estimate: plain sequential importance sampling (no resampling), the
    gap values drawn ancestrally, one weight per path."""
    full = jnp.ones((), bool)
    u = jnp.zeros((0,))

    def path(k):
        def body(c, xs):
            y_t, m_t, kk = xs
            d = model.predict(params, c, u)
            x = jnp.where(m_t, y_t, d.sample(kk))
            return model.update(params, c, x, full, u), jnp.where(m_t, d.log_prob(y_t), 0.0)

        keys = jax.random.split(k, y.shape[0])
        return jax.lax.scan(body, model.initial_carry(params), (y, mask, keys))[1].sum()

    lw = np.asarray(jax.jit(jax.vmap(path))(jax.random.split(key, num_paths)))
    top = lw.max()
    w = np.exp(lw - top)
    return np.log(w.mean()) + top, w.std(ddof=1) / np.sqrt(num_paths) / w.mean()


def test_gap_likelihood_of_a_gaussian_gru_matches_independent_monte_carlo():
    model = ss.GRU(hidden_dim=4)
    params = model.initialize(Y, key=jax.random.key(2))
    params = params._replace(head=params.head._replace(weight=params.head.weight * 5))
    mask = np.ones(40, bool)
    mask[[8, 9, 10, 20, 27, 28]] = False
    lp, se = ss.estimate_log_prob(model, params, Y, mask, key=jax.random.key(4),
                                  num_particles=512, num_replicates=16)
    ref, ref_se = _sis_reference(model, params, jnp.asarray(Y), jnp.asarray(mask),
                                 jax.random.key(9), 40_000)
    assert 0 < se < 0.02 and ref_se < 0.02
    assert abs(lp - ref) <= 4 * np.hypot(se, ref_se), (lp, ref, se, ref_se)
    gap_model = float(ss.log_prob(model, params, Y, mask=mask))
    assert abs(gap_model - ref) > 10 * np.hypot(se, ref_se), (gap_model, ref)
    again = ss.estimate_log_prob(model, params, Y, mask, key=jax.random.key(4),
                                 num_particles=512, num_replicates=16)
    assert again == (lp, se)
    # a batch of series: one estimate each (independent keys per series)
    lps, ses = ss.estimate_log_prob(model, params, np.stack([Y, Y]), np.stack([mask, mask]),
                                    key=jax.random.key(4), num_particles=512,
                                    num_replicates=16)
    assert lps.shape == ses.shape == (2,) and lps[0] != lps[1]
    assert np.all(np.abs(lps - ref) <= 4 * np.hypot(ses, ref_se))


def test_every_registered_model_declares_whether_masked_steps_marginalize():
    from statseq.models.neural import NeuralSequenceModel

    for name, cls in ss.registered_models().items():
        if issubclass(cls, NeuralSequenceModel):
            assert cls.marginalizes_masked_steps is False, name
