"""PoissonHMM and CategoricalHMM through the public API, against brute force and peers.

Every reference is computed without statseq: the small problems (``K = 3`` states,
``T = 5`` steps) enumerate all ``K^T = 243`` state paths in NumPy with SciPy densities,
the stationary law is an eigenvector of ``A^T``, transition matrices of the input-driven
model are softmaxes written out by hand, and the longer problems are compared with
dynamax. Shapes are shared between tests so that each compiled program is reused.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp, softmax
from scipy.stats import chi2, poisson

import statseq as ss
from statseq.inference.hmm import hmm_smoother_by_gradient
from statseq.models.hmm import CategoricalEmissions, PoissonEmissions

K, T, C = 3, 5, 4  # states, time steps, categories of the brute-force problems
PI = np.array([0.5, 0.3, 0.2])
A = np.array([[0.70, 0.20, 0.10],
              [0.15, 0.60, 0.25],
              [0.30, 0.10, 0.60]])
RATES = np.array([0.5, 2.5, 6.0])
B = np.array([[0.60, 0.20, 0.15, 0.05],
              [0.10, 0.50, 0.10, 0.30],
              [0.05, 0.15, 0.60, 0.20]])
Y = {"poisson": np.array([0, 3, 1, 7, 2]), "categorical": np.array([0, 2, 3, 1, 1])}
FAMILIES = ("poisson", "categorical")
KEY = jax.random.key(0)


# ------------------------------------------------------------------------------------------
# references (NumPy / SciPy only)


def stationary(a):
    """The left eigenvector of ``a`` for eigenvalue one, normalized to a distribution."""
    w, v = np.linalg.eig(np.asarray(a).T)
    vec = np.real(v[:, np.argmin(np.abs(w - 1.0))])
    return vec / vec.sum()


def emission_ll(family, y, mask=None, rates=RATES, probs=B):
    """``(T, K)`` log p(observed y_t | z_t = k); masked entries contribute 0."""
    y = np.asarray(y)
    if family == "poisson":
        rates = np.asarray(rates)
        if rates.ndim == 1:
            ll = poisson.logpmf(y[:, None], rates[None, :])
            return ll if mask is None else np.where(np.asarray(mask)[:, None], ll, 0.0)
        terms = poisson.logpmf(y[:, None, :], rates[None, :, :])  # (T, K, D)
        if mask is not None:
            terms = np.where(np.asarray(mask)[:, None, :], terms, 0.0)
        return terms.sum(-1)
    ll = np.log(np.asarray(probs)[:, np.where(y >= 0, y, 0)].T)
    return ll if mask is None else np.where(np.asarray(mask)[:, None], ll, 0.0)


def brute_force(pi, trans, ll):
    """Everything by summing over all ``K^T`` paths.

    ``trans`` is ``(K, K)`` or ``(T-1, K, K)`` (the matrix into step ``t`` is ``trans[t-1]``).
    """
    num_t, num_k = ll.shape
    trans = np.asarray(trans)
    if trans.ndim == 2:
        trans = np.broadcast_to(trans, (max(num_t - 1, 0), num_k, num_k))
    paths = np.array(list(itertools.product(range(num_k), repeat=num_t)))
    log_joint = np.log(pi)[paths[:, 0]] + ll[0, paths[:, 0]]
    for t in range(1, num_t):
        log_joint = log_joint + np.log(trans[t - 1][paths[:, t - 1], paths[:, t]])
        log_joint = log_joint + ll[t, paths[:, t]]
    log_z = logsumexp(log_joint)
    post = np.exp(log_joint - log_z)
    smoothed = np.stack([np.bincount(paths[:, t], post, num_k) for t in range(num_t)])
    pairs = np.zeros((num_k, num_k))
    for t in range(num_t - 1):
        np.add.at(pairs, (paths[:, t], paths[:, t + 1]), post)
    order = np.argsort(log_joint)
    return {
        "log_z": log_z, "post": post, "paths": paths, "smoothed": smoothed,
        "pairs": pairs, "map": paths[order[-1]],
        "map_gap": log_joint[order[-1]] - log_joint[order[-2]],
    }


def brute_filter(pi, trans, ll):
    """``p(z_t | y_{<=t})`` and ``log p(y_t | y_{<t})`` from brute force on every prefix."""
    trans = np.asarray(trans)
    filtered, log_z = [], []
    for t in range(ll.shape[0]):
        sub = trans if trans.ndim == 2 else trans[:t]
        bf = brute_force(pi, sub, ll[: t + 1])
        filtered.append(bf["smoothed"][-1])
        log_z.append(bf["log_z"])
    return np.array(filtered), np.diff(np.concatenate([[0.0], log_z]))


def make(family, initial="free"):
    """Model and params of the shared brute-force problem."""
    if family == "poisson":
        model = ss.PoissonHMM(num_states=K, initial=initial)
        emissions = PoissonEmissions(jnp.asarray(RATES))
    else:
        model = ss.CategoricalHMM(num_states=K, num_classes=C, initial=initial)
        emissions = CategoricalEmissions(jnp.asarray(B))
    pi = jnp.asarray(PI) if initial == "free" else None
    return model, ss.HMMParams(pi, jnp.asarray(A), emissions)


def random_data(family, rng, shape):
    if family == "poisson":
        return rng.poisson(2.5, size=shape)
    return rng.integers(0, C, size=shape)


# ------------------------------------------------------------------------------------------
# the likelihood


@pytest.mark.parametrize("initial", ["free", "stationary"])
@pytest.mark.parametrize("family", FAMILIES)
def test_log_prob_equals_brute_force(family, initial):
    model, params = make(family, initial)
    pi = PI if initial == "free" else stationary(A)
    if initial == "stationary":
        np.testing.assert_allclose(pi @ A, pi, atol=1e-14)  # the reference is stationary
        assert np.abs(pi - PI).max() > 0.05  # and not the free law, so the test can fail
    expected = brute_force(pi, A, emission_ll(family, Y[family]))["log_z"]
    np.testing.assert_allclose(float(ss.log_prob(model, params, Y[family])), expected,
                               rtol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_batches_and_ragged_batches_equal_brute_force(family, rng):
    model, params = make(family)
    y = random_data(family, rng, (2, 3, T))
    got = np.asarray(ss.log_prob(model, params, y))
    assert got.shape == (2, 3)
    expected = np.array([[brute_force(PI, A, emission_ll(family, y[i, j]))["log_z"]
                          for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(got, expected, rtol=1e-12)

    seqs = [random_data(family, rng, (n,)) for n in (5, 2, 4, 1)]
    y_pad, mask = ss.pad_sequences(seqs, pad_value=-1)  # padding is invalid data: never read
    got = np.asarray(ss.log_prob(model, params, y_pad, mask=mask))
    expected = [brute_force(PI, A, emission_ll(family, s))["log_z"] for s in seqs]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_masked_steps_are_dropped_from_the_likelihood(family):
    model, params = make(family)
    mask = np.array([True, False, True, True, False])
    y = Y[family].astype(float)
    y[~mask] = np.nan  # masked values are never read (NaN is allowed there)
    expected = brute_force(PI, A, emission_ll(family, Y[family], mask))["log_z"]
    np.testing.assert_allclose(float(ss.log_prob(model, params, y, mask=mask)), expected,
                               rtol=1e-12)
    # dropping a step is not the same as ignoring the mask: the test can fail
    assert abs(expected - brute_force(PI, A, emission_ll(family, Y[family]))["log_z"]) > 0.5


def test_per_entry_masks_of_vector_counts():
    model = ss.PoissonHMM(num_states=K, emission_dim=2)
    rates = np.stack([RATES, RATES[::-1] + 0.5], axis=-1)  # (K, 2)
    params = ss.HMMParams(jnp.asarray(PI), jnp.asarray(A), PoissonEmissions(jnp.asarray(rates)))
    y = np.array([[0, 4], [3, 1], [1, 1], [7, 0], [2, 5]])
    mask = np.array([[True, True], [True, False], [False, False], [False, True], [True, True]])
    y_nan = np.where(mask, y, np.nan)
    expected = brute_force(PI, A, emission_ll("poisson", y, mask, rates=rates))["log_z"]
    np.testing.assert_allclose(float(ss.log_prob(model, params, y_nan, mask=mask)), expected,
                               rtol=1e-12)
    # a per-step mask with the same steps fully observed/missing gives the per-step answer
    step_mask = mask.all(axis=-1)
    expected_steps = brute_force(
        PI, A, emission_ll("poisson", y, np.broadcast_to(step_mask[:, None], y.shape),
                           rates=rates))["log_z"]
    np.testing.assert_allclose(float(ss.log_prob(model, params, y, mask=step_mask)),
                               expected_steps, rtol=1e-12)
    assert abs(expected - expected_steps) > 0.5


# ------------------------------------------------------------------------------------------
# posterior inference


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_filter_states_equal_brute_force(family, parallel):
    model, params = make(family)
    ll = emission_ll(family, Y[family])
    filtered, log_norms = brute_filter(PI, A, ll)
    out = model.filter_states(params, Y[family], parallel=parallel)
    np.testing.assert_allclose(out.filtered_probs, filtered, atol=1e-12)
    np.testing.assert_allclose(out.log_normalizers, log_norms, atol=1e-12)
    predicted = np.concatenate([PI[None], filtered[:-1] @ A])  # p(z_t | y_{<t})
    np.testing.assert_allclose(out.predicted_probs, predicted, atol=1e-12)
    np.testing.assert_allclose(out.marginal_log_lik, brute_force(PI, A, ll)["log_z"],
                               rtol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_smoother_sequential_and_parallel_equal_brute_force(family, masked):
    model, params = make(family)
    mask = np.array([True, True, False, True, True]) if masked else None
    bf = brute_force(PI, A, emission_ll(family, Y[family], mask))
    seq = model.smoother(params, Y[family], mask=mask, parallel=False)
    par = model.smoother(params, Y[family], mask=mask, parallel=True)
    for out in (seq, par):
        np.testing.assert_allclose(out.smoothed_probs, bf["smoothed"], atol=1e-12)
        np.testing.assert_allclose(out.expected_transitions, bf["pairs"], atol=1e-12)
        np.testing.assert_allclose(out.marginal_log_lik, bf["log_z"], rtol=1e-12)
    for a, b in zip(jax.tree.leaves(seq), jax.tree.leaves(par), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_viterbi_equals_brute_force_argmax(family, rng):
    model, params = make(family)
    y = random_data(family, rng, (4, T))
    got = np.asarray(model.most_likely_states(params, y))
    assert got.shape == (4, T)
    for i in range(4):
        bf = brute_force(PI, A, emission_ll(family, y[i]))
        assert bf["map_gap"] > 1e-8  # a unique maximizer, so the comparison is exact
        np.testing.assert_array_equal(got[i], bf["map"])


def path_chi2(counts, probs):
    """Pearson's statistic over paths, pooling those expected fewer than 5 times.

    Returns ``(statistic, degrees of freedom)``: one per well-filled cell plus the pool,
    minus one for the fixed total.
    """
    expected = probs * counts.sum()
    big = expected >= 5
    stat = np.sum((counts[big] - expected[big]) ** 2 / expected[big])
    stat += (counts[~big].sum() - expected[~big].sum()) ** 2 / expected[~big].sum()
    return stat, int(big.sum())


def test_posterior_path_samples_match_brute_force_frequencies():
    """Frequencies of all 243 paths among ``N = 20000`` draws from ``p(z_{1:T} | y)``.

    Rare paths (expected count ~0.01) make per-path normal bounds meaningless, so this is a
    chi-square goodness-of-fit test with sparse cells pooled: a correct sampler exceeds the
    1e-4 upper quantile with probability 1e-4 (and the key is fixed). Its power: the same
    draws scored against the product of the smoothed marginals (a sampler that forgets the
    chain) or the product of the filtered marginals give statistics ~100 times the threshold.
    """
    model, params = make("poisson")
    bf = brute_force(PI, A, emission_ll("poisson", Y["poisson"]))
    n = 20_000
    draws = np.asarray(model.sample_states_posterior(params, Y["poisson"], key=KEY,
                                                     num_samples=n))
    assert draws.shape == (n, T)
    index = draws @ (K ** np.arange(T - 1, -1, -1))  # lexicographic, like itertools.product
    counts = np.bincount(index, minlength=K**T)
    stat, df = path_chi2(counts, bf["post"])
    assert stat < chi2.isf(1e-4, df), (stat, df)
    steps = np.arange(T)
    for wrong in (bf["smoothed"], brute_filter(PI, A, emission_ll("poisson", Y["poisson"]))[0]):
        stat, df = path_chi2(counts, np.prod(wrong[steps, bf["paths"]], axis=1))
        assert stat > 10 * chi2.isf(1e-4, df)
    # per-step marginals: an exact two-sided binomial test per cell at 1e-4 / (T K)
    # (Bonferroni). A normal bound of 5 standard errors is wrong for cells with an expected
    # count below one (p = 1.4e-5 here: 3 draws of an expected 0.28 happen with
    # probability 0.003 and exceed it)
    from scipy.stats import binomtest

    counts_tk = (draws[:, :, None] == np.arange(K)).sum(0)
    pvalues = [binomtest(int(c), n, float(p)).pvalue
               for c, p in zip(counts_tk.ravel(), bf["smoothed"].ravel(), strict=True)]
    assert min(pvalues) > 1e-4 / (T * K), min(pvalues)


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_message_is_the_rnn_carry(family, rng):
    model, params = make(family)
    y = random_data(family, rng, (2, T))
    mask = np.array([[True] * T, [True, False, True, True, False]])
    res = ss.filter(model, params, y, mask=mask, return_carries=True)
    filt = model.filter_states(params, y, mask=mask)
    np.testing.assert_allclose(res.carries.probs, filt.filtered_probs, atol=1e-12)
    np.testing.assert_allclose(res.log_probs, filt.log_normalizers, atol=1e-12)
    np.testing.assert_allclose(res.final_carry.probs, filt.filtered_probs[:, -1], atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_of_log_marginal_is_the_smoother(family):
    """``d log p(y) / d ll[t, k] = p(z_t = k | y)``, and Fisher's identity through log_prob."""
    model, params = make(family)
    y = Y[family]
    ll = emission_ll(family, y)
    by_grad = jax.jit(hmm_smoother_by_gradient)(jnp.asarray(PI), jnp.asarray(A),
                                                jnp.asarray(ll))
    post = model.smoother(params, y)
    np.testing.assert_allclose(by_grad.smoothed_probs, post.smoothed_probs, atol=1e-10)
    np.testing.assert_allclose(by_grad.expected_transitions, post.expected_transitions,
                               atol=1e-10)

    # Fisher's identity: the score of log p(y) is the posterior-expected complete-data
    # score, so reverse mode through ss.log_prob gives the brute-force expectations
    bf = brute_force(PI, A, ll)
    grads = jax.grad(lambda p: ss.log_prob(model, p, y))(params)
    np.testing.assert_allclose(grads.initial_probs, bf["smoothed"][0] / PI, rtol=1e-10)
    np.testing.assert_allclose(grads.transitions, bf["pairs"] / A, rtol=1e-10)
    if family == "poisson":
        expected = (bf["smoothed"] * (y[:, None] / RATES - 1.0)).sum(0)
        np.testing.assert_allclose(grads.emissions.rates, expected, rtol=1e-10)
    else:
        counts = bf["smoothed"].T @ np.eye(C)[y]  # (K, C) expected emission counts
        np.testing.assert_allclose(grads.emissions.probs, counts / B, rtol=1e-10,
                                   atol=1e-12)


# ------------------------------------------------------------------------------------------
# input-driven transitions

W = np.array([[[0.0], [1.5]], [[-2.0], [0.5]]])  # (K, K, input_dim) with K = 2
BIAS = np.log(np.array([[0.8, 0.2], [0.3, 0.7]]))
U = np.array([[0.3], [-1.2], [0.8], [2.0], [-0.4]])  # (T, 1)
RATES2 = np.array([1.0, 5.0])
PI2 = np.array([0.6, 0.4])


def glm_params():
    model = ss.PoissonHMM(num_states=2, input_dim=1)
    params = ss.HMMParams(jnp.asarray(PI2),
                          ss.TransitionRegression(jnp.asarray(W), jnp.asarray(BIAS)),
                          PoissonEmissions(jnp.asarray(RATES2)))
    return model, params


def glm_matrices(u):
    """``A_t = softmax(bias + W u_t)`` row-wise, written out for each row ``i``."""
    return np.stack([np.stack([softmax(BIAS[i] + W[i, :, 0] * u_t[0]) for i in range(2)])
                     for u_t in u])


def test_input_driven_transitions_equal_brute_force(rng):
    model, params = glm_params()
    y = Y["poisson"]
    ll = emission_ll("poisson", y, rates=RATES2)
    into = glm_matrices(U[1:])  # the transition INTO step t uses inputs[t]
    bf = brute_force(PI2, into, ll)
    np.testing.assert_allclose(float(ss.log_prob(model, params, y, inputs=U)), bf["log_z"],
                               rtol=1e-12)
    # the other convention (inputs[t-1]) gives a different number: the test can tell
    assert abs(brute_force(PI2, glm_matrices(U[:-1]), ll)["log_z"] - bf["log_z"]) > 1e-3
    post = model.smoother(params, y, inputs=U)
    np.testing.assert_allclose(post.smoothed_probs, bf["smoothed"], atol=1e-12)
    np.testing.assert_allclose(post.expected_transitions, bf["pairs"], atol=1e-12)
    # a batch with its own inputs per sequence
    ys = rng.poisson(2.5, size=(2, T))
    us = np.stack([U, -U])
    got = np.asarray(ss.log_prob(model, params, ys, inputs=us))
    expected = [brute_force(PI2, glm_matrices(us[i, 1:]),
                            emission_ll("poisson", ys[i], rates=RATES2))["log_z"]
                for i in range(2)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_input_driven_state_predictions_use_future_inputs():
    model, params = glm_params()
    future = np.array([[1.0], [-0.5], [0.2]])
    bf = brute_force(PI2, glm_matrices(U[1:]), emission_ll("poisson", Y["poisson"],
                                                           rates=RATES2))
    p, expected = bf["smoothed"][-1], []
    for mat in glm_matrices(future):
        p = p @ mat
        expected.append(p)
    got = model.predict_states(params, Y["poisson"], num_steps=3, inputs=U,
                               future_inputs=future)
    np.testing.assert_allclose(got, np.array(expected), atol=1e-12)
    with pytest.raises(ValueError, match="future_inputs"):
        model.predict_states(params, Y["poisson"], num_steps=3, inputs=U)


# ------------------------------------------------------------------------------------------
# forecasts

H = 3  # forecast horizon


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_predict_states_is_a_matrix_power(family, batched, rng):
    model, params = make(family)
    y = random_data(family, rng, (2, T))
    got = np.asarray(model.predict_states(params, y if batched else y[0], num_steps=H))
    assert got.shape == ((2, H, K) if batched else (H, K))
    got = got if batched else got[None]
    for i in range(got.shape[0]):
        last = brute_force(PI, A, emission_ll(family, y[i]))["smoothed"][-1]
        expected = np.stack([last @ np.linalg.matrix_power(A, h) for h in range(1, H + 1)])
        np.testing.assert_allclose(got[i], expected, atol=1e-12)


def poisson_predictive(y):
    """``(H, K)`` state probabilities ``h`` steps ahead, by brute force and matrix powers."""
    last = brute_force(PI, A, emission_ll("poisson", y))["smoothed"][-1]
    return np.stack([last @ np.linalg.matrix_power(A, h) for h in range(1, H + 1)])


def test_poisson_predictive_mixture_is_exact():
    model, params = make("poisson")
    probs = poisson_predictive(Y["poisson"])
    pred = model.predict_observations(params, Y["poisson"], num_steps=H)
    assert pred.batch_shape == (H,)
    np.testing.assert_allclose(pred.mean, probs @ RATES, rtol=1e-12)
    counts = np.arange(4)
    pmf = probs @ poisson.pmf(counts[None, :], RATES[:, None])  # (H, 4)
    np.testing.assert_allclose(np.exp(pred.log_prob(counts[:, None])).T, pmf, rtol=1e-10)


def test_poisson_forecast_samples_match_the_exact_predictive(rng):
    """``N = 4000`` forecast paths for a ``(2, 3)`` batch against the exact predictive.

    For two sequences of the batch, the sample mean at each horizon is within 5 standard
    errors (the exact mixture variance over N) and the frequencies of the counts 0..3 within
    5 binomial standard errors: 30 comparisons at 5 sigma fail by chance with probability
    below 2e-5 (and the key is fixed).
    """
    model, params = make("poisson")
    y = rng.poisson(2.5, size=(2, 3, T))
    y[0, 0] = Y["poisson"]
    n = 4000
    fc = ss.forecast(model, params, y, num_steps=H, num_samples=n, key=KEY)
    samples = np.asarray(fc.samples)
    assert samples.shape == (n, 2, 3, H)
    assert fc.num_steps == H
    counts = np.arange(4)
    for i, j in [(0, 0), (1, 2)]:
        probs = poisson_predictive(y[i, j])
        mean = probs @ RATES
        var = probs @ (RATES + RATES**2) - mean**2
        pmf = probs @ poisson.pmf(counts[None, :], RATES[:, None])
        draws = samples[:, i, j]
        assert np.all(np.abs(draws.mean(0) - mean) <= 5 * np.sqrt(var / n))
        freq = (draws[:, :, None] == counts).mean(0)  # (H, 4)
        assert np.all(np.abs(freq - pmf) <= 5 * np.sqrt(pmf * (1 - pmf) / n))
    # the paths are joint draws: the correlation of y_{T+1} and y_{T+2} is the exact one,
    # Cov = sum_ij p1(i) A[i, j] rate_i rate_j - m1 m2 (independent draws would give 0),
    # within 5 standard errors (1 - rho^2) / sqrt(N)
    p1 = poisson_predictive(y[0, 0])[0]
    mean = poisson_predictive(y[0, 0]) @ RATES
    var = poisson_predictive(y[0, 0]) @ (RATES + RATES**2) - mean**2
    rho = ((p1[:, None] * A * np.outer(RATES, RATES)).sum() - mean[0] * mean[1]) / np.sqrt(
        var[0] * var[1])
    assert rho > 0.1
    corr = np.corrcoef(samples[:, 0, 0, 0], samples[:, 0, 0, 1])[0, 1]
    assert abs(corr - rho) <= 5 * (1 - rho**2) / np.sqrt(n), (corr, rho)


def test_categorical_predictive_and_forecast():
    """The predictive is ``p_h @ B``; ``N = 4000`` forecast draws within 5 binomial errors."""
    model, params = make("categorical")
    y = Y["categorical"]
    last = brute_force(PI, A, emission_ll("categorical", y))["smoothed"][-1]
    probs = np.stack([last @ np.linalg.matrix_power(A, h) for h in range(1, H + 1)]) @ B
    pred = model.predict_observations(params, y, num_steps=H)
    np.testing.assert_allclose(np.exp(pred.log_prob(np.arange(C)[:, None])).T, probs,
                               rtol=1e-10)
    n = 4000
    samples = np.asarray(ss.forecast(model, params, y, num_steps=H, num_samples=n,
                                     key=KEY).samples)
    assert samples.shape == (n, H)
    freq = (samples[:, :, None] == np.arange(C)).mean(0)
    assert np.all(np.abs(freq - probs) <= 5 * np.sqrt(probs * (1 - probs) / n))


# ------------------------------------------------------------------------------------------
# dynamax as an oracle


def test_poisson_hmm_agrees_with_dynamax(rng):
    dhmm = pytest.importorskip("dynamax.hidden_markov_model")
    model, params = make("poisson")
    y = rng.poisson(2.5, size=60)
    dyn = dhmm.PoissonHMM(K, 1)
    dparams, _ = dyn.initialize(initial_probs=jnp.asarray(PI), transition_matrix=jnp.asarray(A),
                                emission_rates=jnp.asarray(RATES[:, None]))
    emissions = jnp.asarray(y[:, None], float)
    np.testing.assert_allclose(float(ss.log_prob(model, params, y)),
                               float(dyn.marginal_log_prob(dparams, emissions)), rtol=1e-10,
                               atol=1e-8)
    post, ref = model.smoother(params, y), dyn.smoother(dparams, emissions)
    np.testing.assert_allclose(post.smoothed_probs, ref.smoothed_probs, atol=1e-8)
    np.testing.assert_allclose(post.filtered_probs, ref.filtered_probs, atol=1e-8)


def test_categorical_hmm_agrees_with_dynamax(rng):
    dhmm = pytest.importorskip("dynamax.hidden_markov_model")
    model, params = make("categorical")
    y = rng.integers(0, C, size=60)
    dyn = dhmm.CategoricalHMM(K, 1, C)
    dparams, _ = dyn.initialize(initial_probs=jnp.asarray(PI), transition_matrix=jnp.asarray(A),
                                emission_probs=jnp.asarray(B[:, None, :]))
    emissions = jnp.asarray(y[:, None])
    np.testing.assert_allclose(float(ss.log_prob(model, params, y)),
                               float(dyn.marginal_log_prob(dparams, emissions)), rtol=1e-10,
                               atol=1e-8)
    post, ref = model.smoother(params, y), dyn.smoother(dparams, emissions)
    np.testing.assert_allclose(post.smoothed_probs, ref.smoothed_probs, atol=1e-8)
    np.testing.assert_allclose(post.filtered_probs, ref.filtered_probs, atol=1e-8)


# ------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize(
    ("family", "y", "match"),
    [
        ("poisson", [1, -1, 2, 0, 1], "non-negative integer"),
        ("poisson", [1, 1.5, 2, 0, 1], "non-negative integer"),
        ("poisson", [1, np.nan, 2, 0, 1], "non-finite"),
        ("categorical", [0, C, 2, 0, 1], "categories"),
        ("categorical", [0, -1, 2, 0, 1], "categories"),
        ("categorical", [0, 1.5, 2, 0, 1], "categories"),
        ("categorical", [0, np.nan, 2, 0, 1], "non-finite"),
    ],
)
def test_invalid_data_raises(family, y, match):
    model, params = make(family)
    y = np.array(y)
    with pytest.raises(ValueError, match=match):
        ss.log_prob(model, params, y)
    with pytest.raises(ValueError, match=match):
        model.smoother(params, y)
    with pytest.raises(ValueError, match=match):
        ss.fit_em(model, params, y, num_iters=1, progress=False)
    # the same value at a masked step is never read (every bad value is at step 1)
    mask = np.arange(T) != 1
    assert np.isfinite(float(ss.log_prob(model, params, y, mask=mask)))


@pytest.mark.parametrize("cls", [ss.PoissonHMM, ss.CategoricalHMM])
def test_invalid_configuration_raises(cls):
    with pytest.raises(ValueError, match="num_states"):
        cls(num_states=0)
    with pytest.raises(ValueError, match="initial"):
        cls(num_states=2, initial="bogus")
    with pytest.raises(ValueError, match="stationary"):
        cls(num_states=2, initial="stationary", input_dim=1)


# ------------------------------------------------------------------------------------------
# saving


def test_save_load_stationary_poisson(tmp_path):
    model, params = make("poisson", initial="stationary")
    path = ss.save(tmp_path / "phmm", model, params)
    model2, params2 = ss.load(path)
    assert model2 == model
    assert params2.initial_probs is None
    assert jax.tree.structure(params2) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2), strict=True):
        np.testing.assert_array_equal(a, b)
    assert float(ss.log_prob(model2, params2, Y["poisson"])) == float(
        ss.log_prob(model, params, Y["poisson"]))


def test_save_load_input_driven_categorical(tmp_path):
    model = ss.CategoricalHMM(num_states=2, num_classes=C, input_dim=1)
    params = ss.HMMParams(jnp.asarray(PI2),
                          ss.TransitionRegression(jnp.asarray(W), jnp.asarray(BIAS)),
                          CategoricalEmissions(jnp.asarray(B[:2])))
    path = ss.save(tmp_path / "chmm", model, params)
    model2, params2 = ss.load(path)
    assert model2 == model
    assert isinstance(params2.transitions, ss.TransitionRegression)
    assert jax.tree.structure(params2) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2), strict=True):
        np.testing.assert_array_equal(a, b)
    y = Y["categorical"]
    assert float(ss.log_prob(model2, params2, y, inputs=U)) == float(
        ss.log_prob(model, params, y, inputs=U))


def test_public_log_prob_by_sweeps_equals_the_step_scan(monkeypatch):
    """Long sequences on CPU: `HMMBase.masked_data_filter` (the filter by sweeps) gives the
    step scan's per-step log-densities, final carry and gradient (here forced at T = 150,
    a length no other test uses, so its program is traced with the lowered threshold)."""
    from statseq.core.recurrence import run_filter
    from statseq.inference import hmm as hmm_inference

    monkeypatch.setattr(hmm_inference, "SWEEP_MIN_STEPS", 64)
    model, params = glm_params()
    rng = np.random.default_rng(7)
    y = rng.poisson(3.0, size=(2, 150)).astype(float)
    mask = np.ones(y.shape, bool)
    mask[0, 40:52] = False  # missing steps score exactly 0
    u = rng.normal(size=(2, 150, 1))
    data = ss.core.validation.prepare_data(model, y, mask, u)
    assert model.masked_data_filter(params, 150) is not None

    def reference(p, y_i, m_i, u_i):  # the per-step scan, written out
        def step(carry, xs):
            return model.step(p, carry, *xs)[::-1]
        final, lps = jax.lax.scan(step, model.initial_carry(p), (y_i, m_i, u_i))
        return lps, final

    got = run_filter(model, params, data.y, data.mask, data.inputs, complete=False)
    want_lps, want_final = jax.vmap(reference, in_axes=(None, 0, 0, 0))(
        params, data.y, data.mask, data.inputs)
    np.testing.assert_allclose(got[1], want_lps, rtol=1e-12, atol=1e-13)
    assert float(jnp.max(jnp.abs(got[1][0, 40:52]))) == 0.0
    np.testing.assert_allclose(got[3].probs, want_final.probs, rtol=1e-12, atol=1e-13)

    grad_got = jax.grad(lambda p: run_filter(model, p, data.y, data.mask, data.inputs,
                                             complete=False)[0].sum())(params)
    grad_want = jax.grad(lambda p: jax.vmap(reference, in_axes=(None, 0, 0, 0))(
        p, data.y, data.mask, data.inputs)[0].sum())(params)
    for g, w in zip(jax.tree.leaves(grad_got), jax.tree.leaves(grad_want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("inputs", [True, False])
def test_padded_log_prob_filters_the_table_equal_to_the_step_scan(inputs, monkeypatch):
    """On CPU, from `TABLE_FILTER_MIN_STEPS` steps, ``log_prob`` filters the emission table
    (and the transition matrices of an input-driven model) also on a time axis padded to a
    bucket length (`recurrence._filter_flat` with ``num_valid``, no final carry wanted):
    the step scan's total and gradient, a missing stretch included; shorter series keep
    the step scan (two states without inputs: up to 999 steps)."""
    from statseq.models.hmm import base

    if jax.default_backend() != "cpu":
        pytest.skip("the table threshold is a CPU default")
    # (models and a length no other test uses: their programs are traced here)
    model = ss.PoissonHMM(num_states=3, input_dim=2) if inputs else ss.PoissonHMM(5)
    rng = np.random.default_rng(13)
    T = 141  # padded to a longer bucket below
    y = rng.poisson(3.0, size=(2, T)).astype(float)
    mask = np.ones(y.shape, bool)
    mask[1, 30:41] = False
    u = rng.normal(size=(2, T, 2)) if inputs else None
    params = model.initialize(y[0], key=jax.random.key(2),
                              inputs=None if u is None else u[0])
    assert model.filters_on_the_table(T) and not model.filters_on_the_table(64)
    two = ss.PoissonHMM(num_states=2)
    assert two.filters_on_the_table(base.TABLE_FILTER_MIN_STEPS[True])
    assert not two.filters_on_the_table(base.TABLE_FILTER_MIN_STEPS[True] - 1)
    tables = []
    real = type(model).log_likelihoods

    def spy(self, *args):
        tables.append(1)
        return real(self, *args)

    monkeypatch.setattr(type(model), "log_likelihoods", spy)
    previous = ss.set_length_buckets("always")
    try:
        data = ss.core.validation.prepare_data(model, y, mask, u, bucket=True)
        assert data.num_valid == T and data.y.shape[1] > T
        got = ss.log_prob(model, params, y, mask=mask, inputs=u)
        assert tables  # the table path ran
        grad_got = jax.grad(lambda p: ss.log_prob(model, p, y, mask=mask, inputs=u).sum())(
            params)
    finally:
        ss.set_length_buckets(**previous)

    def reference(p, y_i, m_i, u_i):  # the per-step scan, written out
        def step(carry, xs):
            return model.step(p, carry, *xs)[::-1]
        return jax.lax.scan(step, model.initial_carry(p), (y_i, m_i, u_i))[1].sum()

    uu = np.zeros((2, T, 0)) if u is None else u
    total = jax.vmap(reference, in_axes=(None, 0, 0, 0))
    np.testing.assert_allclose(got, total(params, y, mask, uu), rtol=1e-12)
    grad_want = jax.grad(lambda p: total(p, y, mask, uu).sum())(params)
    for g, w in zip(jax.tree.leaves(grad_got), jax.tree.leaves(grad_want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("covariance", ["full", "tied"])
def test_gaussian_log_prob_filters_the_table_at_any_length(covariance):
    """`GaussianHMM` (full, tied) scores short sequences on the emission table too
    (`filters_on_the_table`): the step scan's per-step log-densities, missing entries and
    fully missing steps included, and its gradient."""
    from statseq.core.recurrence import run_filter

    model = ss.GaussianHMM(num_states=2, emission_dim=2, covariance=covariance)
    assert model.filters_on_the_table(37)
    assert not ss.GaussianHMM(2, 2, covariance="diagonal").filters_on_the_table(37) or (
        jax.default_backend() != "cpu")
    rng = np.random.default_rng(11)
    y = rng.normal(size=(2, 37, 2))
    mask = np.ones(y.shape, bool)
    mask[0, 5, 1] = False
    mask[1, 9:12] = False
    params = model.initialize(jnp.asarray(y[0]), key=jax.random.key(3))
    data = ss.core.validation.prepare_data(model, y, mask, None)
    assert model.masked_data_filter(params, 37) is not None

    def reference(p, y_i, m_i):  # the per-step scan, written out
        def step(carry, xs):
            return model.step(p, carry, *xs, None)[::-1]
        final, lps = jax.lax.scan(step, model.initial_carry(p), (y_i, m_i))
        return lps, final

    got = run_filter(model, params, data.y, data.mask, data.inputs, complete=False)
    want_lps, want_final = jax.vmap(reference, in_axes=(None, 0, 0))(params, data.y, data.mask)
    np.testing.assert_allclose(got[1], want_lps, rtol=1e-12, atol=1e-13)
    assert float(jnp.max(jnp.abs(got[1][1, 9:12]))) == 0.0
    np.testing.assert_allclose(got[3].probs, want_final.probs, rtol=1e-12, atol=1e-13)
    grad_got = jax.grad(lambda p: run_filter(model, p, data.y, data.mask, data.inputs,
                                             complete=False)[0].sum())(params)
    grad_want = jax.grad(lambda p: jax.vmap(reference, in_axes=(None, 0, 0))(
        p, data.y, data.mask)[0].sum())(params)
    for g, w in zip(jax.tree.leaves(grad_got), jax.tree.leaves(grad_want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("num_timesteps", [1, 2, 23])
def test_arhmm_log_prob_filters_the_table_equal_to_the_step_scan(num_timesteps):
    """`LinearAutoregressiveHMM` scores on its emission table (`masked_data_filter`): the
    step scan's per-step log-densities (the first ``num_lags`` exactly 0, fully masked steps
    exactly 0), its final carry (probabilities, lag window, count) and its gradient, also
    for sequences shorter than the lag window."""
    from statseq.core.recurrence import _scan_one, run_filter

    model = ss.LinearAutoregressiveHMM(num_states=2, emission_dim=2, num_lags=2)
    assert model.filters_on_the_table(5)
    rng = np.random.default_rng(5)
    y = rng.normal(size=(2, num_timesteps, 2))
    mask = np.ones(y.shape, bool)
    if num_timesteps > 10:  # missing entries that are lags of no observed step (no gap)
        mask[0, -1, 0] = False
        mask[1, -3:] = False
    model = model.for_mask(mask)  # what the public calls use: the finite-state filter here
    assert model.gap_capacity == 0
    params = model.initialize(jnp.asarray(rng.normal(size=(40, 2))), key=jax.random.key(1))
    data = ss.core.validation.prepare_data(model, y, mask, None)
    assert model.masked_data_filter(params, num_timesteps) is not None

    def reference(p, y_i, m_i, u_i):  # the engine's per-step scan
        lps, _, final = _scan_one(model, p, y_i, m_i, u_i, carry0=model.initial_carry(p),
                                  return_carries=False)
        return lps, final

    got = run_filter(model, params, data.y, data.mask, data.inputs, complete=False)
    want_lps, want_final = jax.vmap(reference, in_axes=(None, 0, 0, 0))(
        params, data.y, data.mask, data.inputs)
    np.testing.assert_allclose(got[1], want_lps, rtol=1e-12, atol=1e-13)
    assert float(jnp.max(jnp.abs(got[1][:, :2]))) == 0.0
    if num_timesteps > 10:
        assert float(jnp.max(jnp.abs(got[1][1, -3:]))) == 0.0
    for g, w in zip(jax.tree.leaves(got[3]), jax.tree.leaves(want_final), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-13)
    # gradients in the unconstrained coordinates the fits use (off the simplex, the step
    # scan's fully masked steps score log(sum(A^T p)), whose derivative there is not 0)
    uparams = ss.to_unconstrained(model, params)
    grad_got = jax.grad(lambda u: run_filter(
        model, ss.from_unconstrained(model, u), data.y, data.mask, data.inputs,
        complete=False)[0].sum())(uparams)
    grad_want = jax.grad(lambda u: jax.vmap(reference, in_axes=(None, 0, 0, 0))(
        ss.from_unconstrained(model, u), data.y, data.mask, data.inputs)[0].sum())(uparams)
    for g, w in zip(jax.tree.leaves(grad_got), jax.tree.leaves(grad_want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
