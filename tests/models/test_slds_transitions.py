"""Input-driven and recurrent regime transitions of `SwitchingLDS`, its registration, and
segmentation.

    p(z_t = j | z_{t-1} = i, u_t, x_{t-1}) = softmax_j(log P[i, j] + W_j u_t + W_x[j] x_{t-1})

References: the plain model (zero ``W``, ``W_x``: equal to rounding); the exact likelihood
and smoothed regime law by enumerating all ``K^T`` regime paths (time-varying transition
matrices from the inputs), each path a time-varying linear Gaussian model run through
`statseq.inference.kalman` (Kim's filter is exact at ``T <= 2``, the Rao-Blackwellized
particle filter unbiased, Gibbs sampling exact in the limit); with an observed state the
recurrent model is an HMM with known time-varying transitions, scored by a NumPy
forward-backward pass (Kim's filter and smoother are exact there); the transition law
itself for sampled paths; the true regimes for segmentation (adjusted Rand index).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp, softmax

import statseq as ss
from statseq.inference import kalman
from statseq.inference.switching_gibbs import path_arrays

K, N_DIM, T_SHORT = 2, 2, 7
W_IN = np.array([[2.0], [-2.0]])


def _random_params(model, rng):
    """Random parameters with well separated regimes (as in tests/models/test_slds.py)."""
    k, n = model.num_regimes, model.state_dim
    shapes = model.param_shapes()

    def pd(shape, scale):
        a = rng.normal(size=shape) * 0.3
        return scale * (np.eye(shape[-1]) + np.einsum("...ij,...kj->...ik", a, a))

    trans = rng.dirichlet(np.ones(k), size=k) + 3 * np.eye(k)
    trans /= trans.sum(1, keepdims=True)
    p = model.default_params()
    return p._replace(
        initial_probs=jnp.asarray(rng.dirichlet(np.ones(k))), transitions=jnp.asarray(trans),
        initial_means=jnp.asarray(rng.normal(size=(k, n))),
        initial_covs=jnp.asarray(pd((k, n, n), 0.5)),
        dynamics_weights=jnp.asarray(rng.normal(size=shapes.dynamics_weights) * 0.4),
        dynamics_input_weights=jnp.asarray(
            rng.normal(size=shapes.dynamics_input_weights) * 0.3),
        dynamics_bias=jnp.asarray(rng.normal(size=shapes.dynamics_bias)),
        dynamics_cov=jnp.asarray(pd(shapes.dynamics_cov, 0.2)),
        emission_weights=jnp.asarray(rng.normal(size=shapes.emission_weights)),
        emission_input_weights=jnp.asarray(
            rng.normal(size=shapes.emission_input_weights) * 0.3),
        emission_bias=jnp.asarray(2.0 * rng.normal(size=shapes.emission_bias)),
        emission_cov=jnp.asarray(pd(shapes.emission_cov, 0.3)))


def _log_trans(params, u):
    """``(T-1, K, K)`` log transition matrices of the steps into t = 1..T-1 (NumPy)."""
    logits = (np.log(np.asarray(params.transitions))[None]
              + (np.asarray(u[1:]) @ np.asarray(params.transition_input_weights).T)[:, None])
    return logits - logsumexp(logits, axis=-1, keepdims=True)


def _exact(model, params, y, mask, u):
    """Exact ``log p(y)`` and ``p(z_t | y)`` over all ``K^T`` paths."""
    t_len = y.shape[0]
    paths = np.array(list(itertools.product(range(K), repeat=t_len)))
    lt = _log_trans(params, u)
    log_prior = (np.log(np.asarray(params.initial_probs))[paths[:, 0]]
                 + lt[np.arange(t_len - 1)[None], paths[:, :-1], paths[:, 1:]].sum(1))
    arrays = model.to_arrays(params)

    @jax.jit
    def joint(paths, log_prior):
        def one(path, lp):
            return lp + kalman.kalman_log_prob(path_arrays(arrays, path), y, mask, u)

        return jax.vmap(one)(paths, log_prior)

    lw = np.asarray(joint(jnp.asarray(paths), jnp.asarray(log_prior)))
    total = logsumexp(lw)
    w = np.exp(lw - total)
    probs = np.einsum("p,ptk->tk", w, np.eye(K)[paths])
    return total, probs


@pytest.fixture(scope="module")
def driven():
    """K = 2, n = 2, D = 2, one input that drives dynamics, emission and transitions
    (``W = (2, -2)``, ``u_t = 1.5 sin(t)``); T = 7 of the model's own samples, a missing
    entry; the exact log-likelihood and smoothed regime law."""
    model = ss.SwitchingLDS(num_regimes=K, state_dim=N_DIM, emission_dim=2, input_dim=1,
                            transition_inputs=True)
    params = _random_params(model, np.random.default_rng(3))._replace(
        transition_input_weights=jnp.asarray(W_IN))
    u = jnp.asarray(1.5 * np.sin(np.arange(T_SHORT))[:, None])
    y = np.asarray(ss.sample(model, params, num_timesteps=T_SHORT, key=jax.random.key(1),
                             inputs=u))
    mask = np.ones(y.shape, bool)
    mask[3, 1] = False
    y0 = jnp.asarray(np.where(mask, y, 0.0))
    exact, probs = _exact(model, params, y0, jnp.asarray(mask), u)
    return model, params, np.where(mask, y, np.nan), mask, u, exact, probs


def test_zero_transition_weights_equal_the_plain_model(driven):
    """With ``W = 0`` and ``W_x = 0`` (both options on) Kim's filter and smoother give the
    plain model's numbers (to 1e-12: only the softmax's renormalization of ``P`` differs).
    (The particle filter's and `sample_step`'s transition row is the same function,
    `statseq.inference.switching_kalman.transition_log_row`.)"""
    _, params, y, _, u, _, _ = driven
    full = ss.SwitchingLDS(num_regimes=K, state_dim=N_DIM, emission_dim=2, input_dim=1,
                           transition_inputs=True, recurrent=True)
    base = params._replace(transition_input_weights=None)
    zero = params._replace(transition_input_weights=jnp.zeros((K, 1)),
                           recurrent_weights=jnp.zeros((K, N_DIM)))
    plain = ss.SwitchingLDS(num_regimes=K, state_dim=N_DIM, emission_dim=2, input_dim=1)
    mask = ss.missing_mask(y)
    a = plain.smoother(base, y, mask=mask, inputs=u)
    b = full.smoother(zero, y, mask=mask, inputs=u)
    for x, z in zip(a, b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(z), rtol=0, atol=1e-12)


def _dense_two_steps(params, y, u):
    """Exact ``log p(y_0, y_1)`` (complete data) by dense Gaussians over the 4 regime
    pairs, in NumPy: ``(x_0, x_1, y_0, y_1)`` is jointly Gaussian given ``(z_0, z_1)``."""
    from scipy.stats import multivariate_normal

    p = jax.tree.map(np.asarray, params)
    log_p1 = _log_trans(params, u[:2])[0]
    out = []
    for i, j in itertools.product(range(K), repeat=2):
        m0, v0 = p.initial_means[i], p.initial_covs[i]
        a = p.dynamics_weights[j]
        m1 = a @ m0 + p.dynamics_input_weights[j] @ u[1] + p.dynamics_bias[j]
        v1 = a @ v0 @ a.T + p.dynamics_cov[j]
        c0, c1 = p.emission_weights[i], p.emission_weights[j]
        mean = np.concatenate([c0 @ m0 + p.emission_input_weights[i] @ u[0]
                               + p.emission_bias[i],
                               c1 @ m1 + p.emission_input_weights[j] @ u[1]
                               + p.emission_bias[j]])
        cov = np.block([[c0 @ v0 @ c0.T + p.emission_cov[i], c0 @ v0 @ a.T @ c1.T],
                        [c1 @ a @ v0 @ c0.T, c1 @ v1 @ c1.T + p.emission_cov[j]]])
        out.append(np.log(p.initial_probs[i]) + log_p1[i, j]
                   + multivariate_normal(mean, cov).logpdf(np.concatenate(y[:2])))
    return logsumexp(out)


def test_input_driven_kim_and_particle_filters_against_the_enumeration(driven):
    """Input-driven transitions against exact references: Kim's filter is exact for the
    first two steps (1e-10 against dense Gaussians over the 4 regime pairs) and close
    over seven against the exact sum over 2^7 regime paths (measured 3.3e-4 nats, asserted
    < 0.05 and > 1e-7: an approximation); 40 independent particle filters of 400
    particles average (in likelihood) to the exact value within 4 standard errors."""
    model, params, y, mask, u, exact, _ = driven
    assert mask[:2].all()
    filt = model.filter_states(params, y, mask=ss.missing_mask(y), inputs=u)
    np.testing.assert_allclose(float(np.sum(np.asarray(filt.log_probs)[:2])),
                               _dense_two_steps(params, y, np.asarray(u)), rtol=0,
                               atol=1e-10)
    kim = float(filt.marginal_log_lik)
    assert 1e-7 < abs(kim - exact) < 0.05
    reps = 40
    res = model.particle_filter(params, np.broadcast_to(y, (reps,) + y.shape),
                                mask=np.broadcast_to(mask, (reps,) + mask.shape),
                                inputs=jnp.broadcast_to(u, (reps,) + u.shape),
                                key=jax.random.key(7), num_particles=400)
    ll = np.asarray(res.marginal_log_lik)
    ratio = np.exp(ll - exact)  # unbiased for 1
    se = ratio.std(ddof=1) / np.sqrt(reps)
    assert abs(ratio.mean() - 1.0) < 4 * se + 1e-3
    assert ll.std() > 0  # independent runs (a key per sequence)


def test_input_driven_gibbs_and_forecast_transitions(driven):
    """Gibbs sampling's ``z | x, y`` block is an HMM whose transition matrices
    (`statseq.inference.switching_gibbs.path_transitions`) are those of the enumeration's
    prior over paths (1e-12; the sampler itself, `hmm_posterior_sample`, takes them as
    they are), and they differ from ``P`` (the inputs matter). The forecast regime law
    multiplies Kim's last filtered law by the future inputs' matrices (1e-12)."""
    from statseq.inference.switching_gibbs import path_transitions

    model, params, y, _, u, _, _ = driven
    got = np.asarray(path_transitions(model.to_arrays(params), u))
    np.testing.assert_allclose(got, np.exp(_log_trans(params, np.asarray(u))), atol=1e-12)
    assert np.abs(got - np.asarray(params.transitions)).max() > 0.1
    fu = np.array([[1.0], [-1.0], [0.5]])
    got = np.asarray(model.forecast_regime_probs(params, y, mask=ss.missing_mask(y), inputs=u,
                                                 num_steps=3, future_inputs=fu))
    last = np.asarray(model.filter_states(params, y, mask=ss.missing_mask(y),
                                          inputs=u).filtered_probs)[-1]
    lt = _log_trans(params, np.concatenate([np.zeros((1, 1)), fu]))
    ref = [last := last @ np.exp(m) for m in lt]
    np.testing.assert_allclose(got, np.stack(ref), rtol=0, atol=1e-12)


def _observed_state_recurrent():
    """K = 2, n = 1, y_t = x_t exactly (R = 0): ``x_t = a_z x_{t-1} + B_z u_t + b_z +
    N(0, q_z)``, transitions driven by ``u_t`` and ``x_{t-1}``."""
    model = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None, input_dim=1,
                            transition_inputs=True, recurrent=True)
    p = model.default_params()._replace(
        initial_probs=jnp.array([0.3, 0.7]), transitions=jnp.array([[0.85, 0.15],
                                                                   [0.2, 0.8]]),
        initial_means=jnp.array([[1.0], [-1.0]]), initial_covs=jnp.array([[[0.8]], [[1.5]]]),
        dynamics_weights=jnp.array([[[0.6]], [[-0.3]]]),
        dynamics_input_weights=jnp.array([[[0.4]], [[0.0]]]),
        dynamics_bias=jnp.array([[0.8], [-0.8]]), dynamics_cov=jnp.array([[[0.3]], [[0.5]]]),
        emission_cov=jnp.zeros((2, 1, 1)),
        transition_input_weights=jnp.array([[1.0], [-1.0]]),
        recurrent_weights=jnp.array([[1.5], [-1.5]]))
    return model, p


def _hmm_reference(p, y, u):
    """Exact log p(y) and p(z_t | y) of the observed-state recurrent model (NumPy)."""
    t_len = y.shape[0]
    a, bu, b, q = (np.asarray(v).reshape(2) for v in (
        p.dynamics_weights, p.dynamics_input_weights, p.dynamics_bias, p.dynamics_cov))
    m0, v0 = np.asarray(p.initial_means)[:, 0], np.asarray(p.initial_covs)[:, 0, 0]

    def lnorm(x, mu, var):
        return -0.5 * (np.log(2 * np.pi * var) + (x - mu) ** 2 / var)

    ll = np.stack([lnorm(y[0], m0, v0)] + [lnorm(y[t], a * y[t - 1] + bu * u[t, 0] + b, q)
                                          for t in range(1, t_len)])
    logits = (np.log(np.asarray(p.transitions))[None]
              + (u[1:, 0:1] * np.asarray(p.transition_input_weights)[:, 0]
                 + y[:-1, None] * np.asarray(p.recurrent_weights)[:, 0])[:, None, :])
    trans = softmax(logits, axis=-1)  # (T-1, i, j)
    alpha = np.zeros((t_len, 2))
    alpha[0] = np.asarray(p.initial_probs) * np.exp(ll[0])
    total = np.log(alpha[0].sum())
    alpha[0] /= alpha[0].sum()
    for t in range(1, t_len):
        alpha[t] = (alpha[t - 1] @ trans[t - 1]) * np.exp(ll[t])
        total += np.log(alpha[t].sum())
        alpha[t] /= alpha[t].sum()
    beta = np.ones((t_len, 2))
    for t in range(t_len - 2, -1, -1):
        beta[t] = trans[t] @ (np.exp(ll[t + 1]) * beta[t + 1])
        beta[t] /= beta[t].sum()
    post = alpha * beta
    return total, post / post.sum(1, keepdims=True)


def test_recurrent_with_an_observed_state_is_exact():
    """With an observed state (``C = 1``, ``R = 0``) every collapsed filtered mean is the
    observed ``x_{t-1}``, so the recurrent plug-in is exact: Kim's log-likelihood and
    smoothed regime law equal the NumPy forward-backward of the HMM with the transitions
    ``softmax(log P[i] + W u_t + W_x x_{t-1})`` to 1e-10 on 40 steps of the model's own
    samples, and the particle filter's average (30 runs of 200 particles) is within 4
    standard errors. The same model without the recurrent term differs (the reference
    can fail)."""
    model, p = _observed_state_recurrent()
    t_len = 40
    u = np.cos(np.arange(t_len) / 2.0)[:, None]
    y = np.asarray(ss.sample(model, p, num_timesteps=t_len, key=jax.random.key(2), inputs=u))
    total, post = _hmm_reference(p, y, u)
    sm = model.smoother(p, y, inputs=u)
    np.testing.assert_allclose(float(sm.marginal_log_lik), total, rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(sm.smoothed_probs), post, rtol=0, atol=1e-10)
    off, _ = _hmm_reference(p._replace(recurrent_weights=jnp.zeros((2, 1))), y, u)
    assert abs(off - total) > 0.1
    reps = 30
    res = model.particle_filter(p, np.broadcast_to(y, (reps, t_len)),
                                inputs=np.broadcast_to(u, (reps, t_len, 1)),
                                key=jax.random.key(4), num_particles=200)
    ratio = np.exp(np.asarray(res.marginal_log_lik) - total)
    assert abs(ratio.mean() - 1.0) < 4 * ratio.std(ddof=1) / np.sqrt(reps) + 1e-3


def test_sampled_regimes_follow_the_inputs_and_the_states():
    """Paths of `sample_step` (what `statseq.sample` and `statseq.forecast` run) on the
    recurrent, input-driven model: over 200 paths of 30 steps the regime frequencies
    follow the input (regime 0 in > 70% of steps with ``u_t = 1``, < 30% with ``u_t =
    -1``), and the transitions match ``softmax(log P[i] + W u_t + W_x x_{t-1})`` at the
    drawn ``x_{t-1}``: the standardized sum of ``1[z_t = 0] - p_t(0)`` is below 4."""
    model, p = _observed_state_recurrent()
    p = p._replace(transition_input_weights=jnp.array([[2.5], [-2.5]]),
                   recurrent_weights=jnp.array([[0.5], [-0.5]]))
    t_len, n_paths = 30, 200
    u = jnp.asarray(np.where((np.arange(t_len) // 5) % 2 == 0, 1.0, -1.0)[:, None])

    @jax.jit
    def paths(keys):
        def one(key):
            def body(carry, xs):
                k, u_t = xs
                _, new = model.sample_step(p, carry, k, u_t)
                return new, (jnp.argmax(new.probs), new.means[0, 0])

            return jax.lax.scan(body, model.initial_carry(p),
                                (jax.random.split(key, t_len), u))[1]

        return jax.vmap(one)(keys)

    z, x = (np.asarray(a) for a in paths(jax.random.split(jax.random.key(0), n_paths)))
    up = np.asarray(u[:, 0]) > 0
    assert (z[:, up] == 0).mean() > 0.7 and (z[:, ~up] == 0).mean() < 0.3
    logits = (np.log(np.asarray(p.transitions))[z[:, :-1]]
              + np.asarray(u[1:]) @ np.asarray(p.transition_input_weights).T
              + x[:, :-1, None] * np.asarray(p.recurrent_weights)[:, 0])
    p0 = softmax(logits, axis=-1)[..., 0]
    resid = (z[:, 1:] == 0) - p0
    assert abs(resid.sum()) / np.sqrt((p0 * (1 - p0)).sum()) < 4


def adjusted_rand_index(a, b):
    """Hubert and Arabie's adjusted Rand index of two labelings (test-only helper)."""
    table = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(table, (a, b), 1)

    def pairs(n):
        return n * (n - 1) / 2

    index = pairs(table).sum()
    rows, cols = pairs(table.sum(1)).sum(), pairs(table.sum(0)).sum()
    expected = rows * cols / pairs(a.size)
    return (index - expected) / (0.5 * (rows + cols) - expected)


def test_adjusted_rand_index_helper():
    """The helper against hand values: identical up to relabeling 1, a known 0.24 case
    (sklearn's documented example [0, 0, 1, 2] vs [0, 0, 1, 1]: 0.571...)."""
    a = np.array([0, 0, 1, 1, 2, 2])
    assert adjusted_rand_index(a, np.array([2, 2, 0, 0, 1, 1])) == pytest.approx(1.0)
    assert adjusted_rand_index(np.array([0, 0, 1, 2]), np.array([0, 0, 1, 1])) == \
        pytest.approx(0.5714285714285714)


def test_three_regime_segmentation_recovers_the_truth():
    """K = 3, n = 1, 250 steps simulated in NumPy: ``x_t = 0.5 x_{t-1} + b_z +
    N(0, 0.05)``, ``y_t = x_t + N(0, 0.05)`` with ``b_z = -1.5, 0, 1.5`` (regime levels
    ``-3, 0, 3``; adjacent biases 1.5 apart against noise standard deviations 0.22: a
    signal-to-noise ratio of about 7 per step), sticky ``P`` (0.95). Blocked Gibbs
    (`fit_gibbs`) from a perturbed start (biases and persistence off by 30%, ``A`` 0.3,
    noise variances 4x) with 30 burn-in and 30 kept sweeps; the per-step most frequent
    regime has an adjusted Rand index > 0.9 with the truth (measured 0.99)."""
    rng = np.random.default_rng(1)
    k, num_t = 3, 250
    trans = np.full((k, k), 0.025) + 0.925 * np.eye(k)
    bias, a, q, r = np.array([-1.5, 0.0, 1.5]), 0.5, 0.05, 0.05
    z = np.zeros(num_t, int)
    x = np.zeros(num_t)
    for t in range(1, num_t):
        z[t] = rng.choice(k, p=trans[z[t - 1]])
        x[t] = a * x[t - 1] + bias[z[t]] + rng.normal(0.0, np.sqrt(q))
    y = x + rng.normal(0.0, np.sqrt(r), num_t)
    model = ss.SwitchingLDS(num_regimes=k, state_dim=1, emission_dim=None,
                            switching_emission=False)
    start = model.default_params()._replace(
        dynamics_weights=jnp.full((k, 1, 1), 0.3), dynamics_bias=jnp.asarray(0.7 * bias[:, None]),
        transitions=jnp.asarray(np.full((k, k), 0.1) + 0.7 * np.eye(k)),
        dynamics_cov=jnp.full((k, 1, 1), 0.2), emission_cov=jnp.full((1, 1), 0.2))
    idata = model.fit_gibbs(start, y, key=jax.random.key(0), num_samples=30, num_burnin=30)
    regimes = idata.posterior["regimes"].values[0]
    votes = np.eye(k)[regimes].sum(0)
    assert adjusted_rand_index(z, votes.argmax(-1)) > 0.9


def test_save_load_round_trip(tmp_path):
    """`statseq.save` / `statseq.load` keep the options and the optional leaves (and
    ``None`` where a model has none)."""
    model, p = _observed_state_recurrent()
    m2, p2 = ss.load(ss.save(tmp_path / "rslds", model, p))
    assert m2 == model
    for x, y in zip(jax.tree.leaves(p), jax.tree.leaves(p2), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    plain = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None)
    m3, p3 = ss.load(ss.save(tmp_path / "slds", plain, plain.default_params()))
    assert m3 == plain and p3.transition_input_weights is None and p3.recurrent_weights is None


def test_bad_configurations_and_refusals_get_clear_errors():
    with pytest.raises(ValueError, match="input_dim"):
        ss.SwitchingLDS(num_regimes=2, transition_inputs=True)
    with pytest.raises(TypeError, match="recurrent"):
        ss.SwitchingLDS(num_regimes=2, recurrent=1)
    model, p = _observed_state_recurrent()
    y, u = np.zeros(5), np.zeros((5, 1))
    with pytest.raises(ValueError, match="recurrent"):
        model.sample_posterior(p, y, inputs=u, key=jax.random.key(0), num_samples=2)
    with pytest.raises(ValueError, match="fit_gibbs"):
        model.fit_gibbs(p, y, inputs=u, key=jax.random.key(0), num_samples=2)
    with pytest.raises(ValueError, match="recurrent"):
        model.forecast_regime_probs(p, y, inputs=u, num_steps=2)
    driven = ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None, input_dim=1,
                             transition_inputs=True)
    dp = driven.default_params()
    with pytest.raises(ValueError, match="future_inputs"):
        driven.forecast_regime_probs(dp, y, inputs=u, num_steps=2)
    with pytest.raises(ValueError, match="future_inputs"):
        driven.forecast_regime_probs(dp, y, inputs=u, num_steps=2,
                                     future_inputs=np.zeros((3, 1)))
    # parameters of the plain model (no W leaf) are refused by name of the structure
    with pytest.raises((TypeError, ValueError), match="SLDSParams|transition_input_weights"):
        ss.log_prob(driven, dp._replace(transition_input_weights=None), y, inputs=u)
    with pytest.raises((TypeError, ValueError), match="transition_input_weights"):
        ss.log_prob(driven, dp._replace(transition_input_weights=jnp.zeros((3, 1))), y,
                    inputs=u)
