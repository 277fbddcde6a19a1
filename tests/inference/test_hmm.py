"""HMM inference against brute-force enumeration, its parallel twin, its gradient twin and peers.

The reference for small problems enumerates all ``K^T`` state paths in NumPy (log space,
so it stays exact on hostile parameters). Every smoother and filter runs through one
module-level ``jax.jit`` per function, reused across tests.
"""

from __future__ import annotations

import itertools

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy.special import logsumexp  # noqa: E402
from scipy.stats import chi2  # noqa: E402

from statseq.inference import hmm, hmm_parallel  # noqa: E402

K, T = 3, 5  # brute-force size
BIG_K, BIG_T = 4, 100  # one shape for the longer comparisons, so each function compiles once
PATHS = np.array(list(itertools.product(range(K), repeat=T)))  # (K^T, T), lexicographic

FILTERS = {
    "sequential": jax.jit(hmm.hmm_filter),
    "parallel": jax.jit(hmm_parallel.hmm_filter),
    # by sweeps over blocks (`statseq.inference.sweeps`), forced at every length
    "sweeps": jax.jit(lambda pi, a, ll: hmm._filter(*hmm._prepare_inputs(pi, a, ll),
                                                   sweeps=True)),
}
SMOOTHERS = {
    "forward-backward": jax.jit(hmm.hmm_smoother, static_argnames="sum_transitions"),
    "gradient": jax.jit(hmm.hmm_smoother_by_gradient, static_argnames="sum_transitions"),
    "parallel": jax.jit(hmm_parallel.hmm_smoother, static_argnames="sum_transitions"),
    # both passes by sweeps over blocks (`statseq.inference.sweeps`), forced at every length
    "sweeps": jax.jit(lambda pi, a, ll, sum_transitions=True: hmm._smoother(
        *hmm._prepare_inputs(pi, a, ll), sum_transitions, sweeps=True),
        static_argnames="sum_transitions"),
}
viterbi = jax.jit(hmm.hmm_viterbi)
sample_paths = jax.jit(
    jax.vmap(lambda key, pi, a, ll: hmm.hmm_posterior_sample(pi, a, ll, key=key),
             in_axes=(0, None, None, None))
)


# ------------------------------------------------------------------------------------------
# references and parameters


def random_hmm(rng, num_states=K, num_timesteps=T, time_varying=False, scale=2.0):
    pi = rng.dirichlet(np.ones(num_states))
    size = (num_timesteps - 1, num_states) if time_varying else (num_states,)
    trans = rng.dirichlet(np.ones(num_states), size=size)
    ll = scale * rng.normal(size=(num_timesteps, num_states)) - 1.0
    return pi, trans, ll


def per_step(trans, num_timesteps):
    trans = np.asarray(trans)
    if trans.ndim == 2:
        return np.broadcast_to(trans, (num_timesteps - 1,) + trans.shape)
    return trans


def brute_force(pi, trans, ll):
    """Every quantity by enumerating all ``K^T`` paths, in log space."""
    num_timesteps, num_states = ll.shape
    paths = np.array(list(itertools.product(range(num_states), repeat=num_timesteps)))
    trans = per_step(trans, num_timesteps)
    with np.errstate(divide="ignore"):
        log_pi, log_trans = np.log(pi), np.log(trans)
    steps = np.arange(num_timesteps)
    # log p(z_{0:t}, y_{0:t}) for every path and t (later states do not enter, and each
    # prefix repeats K^{T-1-t} times, a constant that cancels in every normalization)
    log_trans_terms = np.zeros((len(paths), num_timesteps - 1))
    for t in range(num_timesteps - 1):
        log_trans_terms[:, t] = log_trans[t][paths[:, t], paths[:, t + 1]]
    log_prior = np.cumsum(
        np.concatenate([log_pi[paths[:, :1]], log_trans_terms], axis=1), axis=1
    )
    emission = ll[steps, paths]
    prefix_joint = log_prior + np.cumsum(emission, axis=1)
    predicted_joint = log_prior + np.concatenate(
        [np.zeros((len(paths), 1)), np.cumsum(emission, axis=1)[:, :-1]], axis=1
    )
    log_joint = prefix_joint[:, -1]
    marginal = logsumexp(log_joint)
    post = np.exp(log_joint - marginal)

    def marginals(log_w):
        w = np.exp(log_w - logsumexp(log_w, axis=0))
        return np.stack(
            [np.bincount(paths[:, t], w[:, t], num_states) for t in range(num_timesteps)]
        )

    multiplicity = (num_timesteps - 1 - steps) * np.log(num_states)
    log_evidence = logsumexp(prefix_joint, axis=0) - multiplicity
    pairs = np.zeros((num_timesteps - 1, num_states, num_states))
    for t in range(num_timesteps - 1):
        np.add.at(pairs[t], (paths[:, t], paths[:, t + 1]), post)
    smoothed = np.stack(
        [np.bincount(paths[:, t], post, num_states) for t in range(num_timesteps)]
    )
    return dict(
        marginal_log_lik=marginal,
        log_normalizers=np.diff(log_evidence, prepend=0.0),
        predicted_probs=marginals(predicted_joint),
        filtered_probs=marginals(prefix_joint),
        smoothed_probs=smoothed,
        pairs=pairs,
        viterbi=paths[np.argmax(log_joint)],
        path_probs=post,
    )


def hostile_hmm(rng, num_states, num_timesteps, time_varying=False):
    """Near-deterministic transitions, an exact zero, rare initial states, ll near -700."""
    eps = 1e-12
    base = np.full((num_states, num_states), eps / (num_states - 1))
    np.fill_diagonal(base, 1.0 - eps)
    base[0, -1], base[0, 1] = 0.0, base[0, 1] + base[0, -1]  # one impossible transition
    if time_varying:
        trans = np.broadcast_to(base, (num_timesteps - 1, num_states, num_states)).copy()
        flips = rng.random(num_timesteps - 1) < 0.3  # some steps with a diffuse matrix
        trans[flips] = rng.dirichlet(np.ones(num_states), size=(flips.sum(), num_states))
    else:
        trans = base
    pi = np.full(num_states, 1e-15)
    pi[0] = 1.0 - (num_states - 1) * 1e-15
    ll = 3.0 * rng.normal(size=(num_timesteps, num_states))
    far = rng.random((num_timesteps, num_states)) < 0.3
    ll[far] = -700.0 + rng.normal(size=far.sum())
    ll[rng.random(num_timesteps) < 0.1] = 0.0  # masked steps
    return pi, trans, ll


# ------------------------------------------------------------------------------------------
# brute force


@pytest.mark.parametrize("name", list(FILTERS))
@pytest.mark.parametrize("time_varying", [False, True])
def test_filter_matches_brute_force(name, time_varying):
    pi, trans, ll = random_hmm(np.random.default_rng(1), time_varying=time_varying)
    ref = brute_force(pi, trans, ll)
    got = FILTERS[name](pi, trans, ll)
    for field in ("marginal_log_lik", "log_normalizers", "predicted_probs", "filtered_probs"):
        np.testing.assert_allclose(getattr(got, field), ref[field], rtol=1e-12, atol=1e-14,
                                   err_msg=field)


@pytest.mark.parametrize("name", list(SMOOTHERS))
@pytest.mark.parametrize("time_varying", [False, True])
def test_smoother_matches_brute_force(name, time_varying):
    pi, trans, ll = random_hmm(np.random.default_rng(2), time_varying=time_varying)
    ref = brute_force(pi, trans, ll)
    summed = SMOOTHERS[name](pi, trans, ll)
    steps = SMOOTHERS[name](pi, trans, ll, sum_transitions=False)
    tol = dict(rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(summed.marginal_log_lik, ref["marginal_log_lik"], **tol)
    np.testing.assert_allclose(summed.filtered_probs, ref["filtered_probs"], **tol)
    np.testing.assert_allclose(summed.smoothed_probs, ref["smoothed_probs"], **tol)
    np.testing.assert_allclose(summed.initial_probs, ref["smoothed_probs"][0], **tol)
    np.testing.assert_allclose(summed.expected_transitions, ref["pairs"].sum(0), **tol)
    np.testing.assert_allclose(steps.expected_transitions, ref["pairs"], **tol)
    np.testing.assert_allclose(steps.smoothed_probs, ref["smoothed_probs"], **tol)


@pytest.mark.parametrize("seed", range(4))
def test_viterbi_matches_brute_force(seed):
    pi, trans, ll = random_hmm(np.random.default_rng(10 + seed), time_varying=seed % 2 == 1)
    np.testing.assert_array_equal(viterbi(pi, trans, ll), brute_force(pi, trans, ll)["viterbi"])


@pytest.mark.parametrize("time_varying", [False, True])
def test_hostile_small_problem_matches_brute_force(time_varying):
    pi, trans, ll = hostile_hmm(np.random.default_rng(3), K, T, time_varying)
    ll[2] = [-700.0, 0.0, -699.0]  # a step that forces a 1e-12 switch
    ref = brute_force(pi, trans, ll)
    for name, run in FILTERS.items():
        got = run(pi, trans, ll)
        for field in ("log_normalizers", "predicted_probs", "filtered_probs"):
            np.testing.assert_allclose(getattr(got, field), ref[field], rtol=1e-12, atol=1e-12,
                                       err_msg=f"{name} {field}")
    for name, smoother in SMOOTHERS.items():
        got = smoother(pi, trans, ll, sum_transitions=False)
        np.testing.assert_allclose(got.marginal_log_lik, ref["marginal_log_lik"], rtol=1e-12)
        np.testing.assert_allclose(got.smoothed_probs, ref["smoothed_probs"], atol=1e-12,
                                   err_msg=name)
        np.testing.assert_allclose(got.expected_transitions, ref["pairs"], atol=1e-12,
                                   err_msg=name)
    np.testing.assert_array_equal(viterbi(pi, trans, ll), ref["viterbi"])


def test_single_timestep():
    pi, _, ll = random_hmm(np.random.default_rng(4), num_timesteps=1)
    trans = np.random.default_rng(5).dirichlet(np.ones(K), size=K)
    ref = brute_force(pi, trans, ll)
    for name in ("forward-backward", "parallel", "sweeps"):
        smoother = SMOOTHERS[name]
        post = smoother(pi, trans, ll)
        np.testing.assert_allclose(post.marginal_log_lik, ref["marginal_log_lik"], rtol=1e-12)
        np.testing.assert_allclose(post.smoothed_probs, ref["smoothed_probs"], rtol=1e-12)
        np.testing.assert_array_equal(post.expected_transitions, np.zeros((K, K)), err_msg=name)
        assert smoother(pi, trans, ll, sum_transitions=False).expected_transitions.shape == (
            0, K, K)
    np.testing.assert_array_equal(viterbi(pi, trans, ll), ref["viterbi"])
    # jitted: one compile (eager dispatch of the blocked kernels' many small ops costs more)
    sample = jax.jit(lambda pi, a, ll, key: hmm.hmm_posterior_sample(pi, a, ll, key=key))
    assert sample(pi, trans, ll, jax.random.key(0)).shape == (1,)


# ------------------------------------------------------------------------------------------
# posterior sampling


def test_posterior_sampler_path_frequencies():
    """Pearson's chi-square over whole paths, at a false-alarm rate of 1e-6.

    With ``N`` draws the counts of the ``K^T = 243`` paths are multinomial; pooling paths
    whose expected count is below 5 keeps the chi-square approximation of Pearson's
    statistic sound, and the 1 - 1e-6 quantile of chi2(cells - 1) makes a spurious failure
    of a correct sampler a one-in-a-million event (the key is fixed, so the run is
    deterministic). The same threshold must reject the closest wrong answer, draws from the
    product of the smoothed marginals, which shows the test has power.
    """
    num_samples = 20_000
    pi, trans, ll = random_hmm(np.random.default_rng(6), time_varying=True, scale=1.0)
    ref = brute_force(pi, trans, ll)
    keys = jax.random.split(jax.random.key(7), num_samples)
    paths = np.asarray(sample_paths(keys, pi, trans, ll))
    assert paths.dtype == np.int32 and paths.shape == (num_samples, T)
    index = paths @ (K ** np.arange(T - 1, -1, -1))  # row of PATHS
    counts = np.bincount(index, minlength=K**T)

    def pearson(probs):
        expected = num_samples * probs
        big = expected >= 5
        obs = np.append(counts[big], counts[~big].sum())
        exp = np.append(expected[big], expected[~big].sum())
        keep = exp > 0
        obs, exp = obs[keep], exp[keep]
        return np.sum((obs - exp) ** 2 / exp), len(exp) - 1  # (statistic, degrees of freedom)

    stat, df = pearson(ref["path_probs"])
    threshold = chi2.ppf(1 - 1e-6, df)
    assert stat < threshold, (stat, df, threshold)

    independent = np.prod(ref["smoothed_probs"][np.arange(T), PATHS], axis=1)
    wrong_stat, wrong_df = pearson(independent)
    assert wrong_stat > chi2.ppf(1 - 1e-6, wrong_df)

    # per-step marginals, each within 5 binomial standard deviations
    freq = np.stack([np.bincount(paths[:, t], minlength=K) for t in range(T)]) / num_samples
    p = ref["smoothed_probs"]
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / num_samples) + 1e-12)


# ------------------------------------------------------------------------------------------
# twins: gradient and parallel


@pytest.mark.parametrize("time_varying", [False, True])
def test_gradient_smoother_equals_forward_backward(time_varying):
    pi, trans, ll = random_hmm(np.random.default_rng(8), BIG_K, BIG_T, time_varying)
    ll[::7] = 0.0  # masked steps
    # (both layouts of the transitions are checked against brute force above)
    a = SMOOTHERS["forward-backward"](pi, trans, ll, sum_transitions=not time_varying)
    b = SMOOTHERS["gradient"](pi, trans, ll, sum_transitions=not time_varying)
    for field, x, y in zip(a._fields, a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-10, err_msg=field)


def numpy_forward_backward(pi, trans, ll):
    """Scaled forward-backward in NumPy: ``(log p(y), filtered, smoothed, pairs)`` with
    per-step pair marginals ``(T-1, K, K)`` (fixed or time-varying ``trans``)."""
    a = per_step(trans, ll.shape[0])
    lik = np.exp(ll)
    filtered, norms, probs = [], [], pi
    for t in range(ll.shape[0]):
        if t:
            probs = filtered[-1] @ a[t - 1]
        joint = probs * lik[t]
        norms.append(joint.sum())
        filtered.append(joint / norms[-1])
    beta, betas = np.ones_like(pi), [np.ones_like(pi)]
    for t in range(ll.shape[0] - 2, -1, -1):
        beta = a[t] @ (lik[t + 1] * beta) / norms[t + 1]
        betas.append(beta)
    filtered, betas = np.array(filtered), np.array(betas[::-1])
    pairs = (filtered[:-1, :, None] * a * (lik[1:] * betas[1:])[:, None, :]
             / np.array(norms[1:])[:, None, None])
    return np.log(norms).sum(), filtered, filtered * betas, pairs


def test_gradient_smoother_at_the_unrolled_size():
    """K = 16 runs the gradient path's filter 8 steps per iteration: 17 transitions (not a
    multiple of 8), masked steps, impossible states (-inf), a vmapped batch, against
    forward-backward in NumPy. (Time-varying matrices take the same loop: checked at
    K = 4 above.)"""
    rng = np.random.default_rng(12)
    k = 16
    pi, trans, _ = random_hmm(rng, k, 18)
    lls = rng.normal(size=(2, 18, k)) * 2.0
    lls[:, 3] = 0.0
    lls[0, -1, :5] = -np.inf
    batch = jax.jit(jax.vmap(hmm.hmm_smoother_by_gradient, in_axes=(None, None, 0)))(
        pi, trans, lls)
    for i in range(2):
        got = jax.tree.map(lambda x, i=i: x[i], batch)
        log_lik, filtered, smoothed, pairs = numpy_forward_backward(pi, trans, lls[i])
        np.testing.assert_allclose(got.marginal_log_lik, log_lik, rtol=1e-12)
        np.testing.assert_allclose(got.filtered_probs, filtered, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got.smoothed_probs, smoothed, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got.expected_transitions, pairs.sum(0), rtol=1e-12)


def test_gradient_smoother_float32_and_second_derivatives():
    """float32 stays float32 and accurate; the gradient path holds the filter's normalizers
    constant (log p(y) does not depend on them, to any order), so derivatives *of* its
    outputs are right: a directional derivative against central differences."""
    rng = np.random.default_rng(13)
    pi, trans, ll = random_hmm(rng, K, 6)
    weights = rng.normal(size=(6, K)), rng.normal(size=(K, K))
    direction = rng.normal(size=(K, K)) * trans * 0.1, rng.normal(size=ll.shape)

    def loss(trans, ll):
        post = hmm.hmm_smoother_by_gradient(pi, trans, ll)
        return (jnp.sum(weights[0] * post.smoothed_probs)
                + jnp.sum(weights[1] * post.expected_transitions) + post.marginal_log_lik)

    @jax.jit
    def run(trans, ll, steps):
        grads = jax.grad(loss, argnums=(0, 1))(trans, ll)
        moved = jax.vmap(lambda h: loss(trans + h * direction[0], ll + h * direction[1]))(steps)
        f32 = [jnp.asarray(x, jnp.float32) for x in (pi, trans, ll)]
        return grads, moved, hmm.hmm_smoother_by_gradient(*f32)

    h = 1e-5
    grads, moved, single = run(trans, ll, jnp.array([h, -h]))
    along = sum(np.sum(g * d) for g, d in zip(grads, direction, strict=True))
    np.testing.assert_allclose(along, (moved[0] - moved[1]) / (2 * h), rtol=1e-7)
    log_lik, _, smoothed, pairs = numpy_forward_backward(pi, trans, ll)
    assert single.smoothed_probs.dtype == jnp.float32
    np.testing.assert_allclose(single.smoothed_probs, smoothed, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(single.expected_transitions, pairs.sum(0), rtol=1e-5)
    np.testing.assert_allclose(single.marginal_log_lik, log_lik, rtol=1e-6)


def test_parallel_equals_sequential_on_hostile_parameters():
    """Near-deterministic transitions (some steps diffuse), ll near -700, masked steps.

    (A fixed hostile matrix is checked against brute force above; the parallel code
    broadcasts a fixed matrix first, so one long time-varying case covers both.)
    """
    pi, trans, ll = hostile_hmm(np.random.default_rng(9), BIG_K, BIG_T, time_varying=True)
    reference = SMOOTHERS["forward-backward"](pi, trans, ll, sum_transitions=False)
    for name in ("parallel", "gradient", "sweeps"):
        got = SMOOTHERS[name](pi, trans, ll, sum_transitions=False)
        for field, x, y in zip(reference._fields, reference, got, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-10, err_msg=f"{name} {field}")
    # the posterior really does switch states (the hostile part is exercised)
    assert np.isfinite(reference.marginal_log_lik)
    assert np.sum(reference.expected_transitions * (1 - np.eye(BIG_K))) > 0.5


def structural_zeros_problem():
    """Exact zeros in A and more evidence against the winning state than a float holds.

    Staying in state 1 is the most probable path, but after two steps its filtered
    probability is e^-1400, which flushes to zero in float64.
    """
    pi, trans = np.full(K, 1 / K), np.eye(K)
    ll = np.array([[0.0, -700.0, -1e3]] * 2 + [[-700.0, 0.0, -1e3]] * 3)
    return pi, trans, ll


def test_log_space_parallel_twin_handles_structural_zeros():
    pi, trans, ll = structural_zeros_problem()
    ref = brute_force(pi, trans, ll)
    post = SMOOTHERS["parallel"](pi, trans, ll)
    np.testing.assert_allclose(post.marginal_log_lik, ref["marginal_log_lik"], rtol=1e-12)
    np.testing.assert_allclose(post.smoothed_probs, ref["smoothed_probs"], atol=1e-12)


@pytest.mark.xfail(strict=True, reason="known limit of probability-space forward messages")
def test_sequential_filter_cannot_revive_a_state_flushed_to_zero():
    pi, trans, ll = structural_zeros_problem()
    got = FILTERS["sequential"](pi, trans, ll).marginal_log_lik
    np.testing.assert_allclose(got, brute_force(pi, trans, ll)["marginal_log_lik"], rtol=1e-12)


# ------------------------------------------------------------------------------------------
# masked steps


@pytest.mark.parametrize("name", list(SMOOTHERS))
def test_masked_steps_equal_brute_force_without_them(name):
    """Zero rows equal the HMM over the observed steps, whose transitions are products."""
    pi, trans, ll = random_hmm(np.random.default_rng(11), time_varying=True)
    observed = np.array([1, 3])  # steps 0, 2 and 4 are masked (first and last included)
    ll_masked = np.zeros_like(ll)
    ll_masked[observed] = ll[observed]

    def product(start, stop):  # p(z_stop | z_start)
        out = np.eye(K)
        for t in range(start, stop):
            out = out @ trans[t]
        return out

    reduced_pi = pi @ product(0, observed[0])
    reduced_trans = np.stack(
        [product(s, e) for s, e in zip(observed[:-1], observed[1:], strict=True)]
    )
    ref = brute_force(reduced_pi, reduced_trans, ll[observed])

    post = SMOOTHERS[name](pi, trans, ll_masked)
    filt = FILTERS["parallel" if name == "parallel" else "sequential"](pi, trans, ll_masked)
    tol = dict(rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(post.marginal_log_lik, ref["marginal_log_lik"], **tol)
    np.testing.assert_allclose(post.smoothed_probs[observed], ref["smoothed_probs"], **tol)
    np.testing.assert_allclose(post.filtered_probs[observed], ref["filtered_probs"], **tol)
    np.testing.assert_allclose(filt.log_normalizers[observed], ref["log_normalizers"], **tol)
    # a masked step adds log(sum of predicted probabilities) = 0 up to rounding
    np.testing.assert_allclose(np.delete(np.asarray(filt.log_normalizers), observed), 0.0,
                               atol=1e-15)


# ------------------------------------------------------------------------------------------
# long sequences in float32


def test_float32_log_likelihood_at_a_million_steps():
    """The sequential filter in float32 at 10^6 steps, within 1e-6 of float64."""
    num_timesteps = 1_000_000
    pi, trans, ll = gaussian_regimes(np.random.default_rng(12), num_timesteps)
    run = FILTERS["sequential"]
    exact = float(run(pi, trans, ll).marginal_log_lik)
    single = run(*(np.asarray(a, np.float32) for a in (pi, trans, ll))).marginal_log_lik
    assert single.dtype == jnp.float32
    assert exact < -1e6  # a substantial total, so the relative test is meaningful
    assert abs(float(single) / exact - 1) < 1e-6


def gaussian_regimes(rng, num_timesteps):
    """Three Gaussian regimes of 500 steps each, in turn; sticky transitions."""
    means = np.array([-2.0, 0.0, 2.5])
    regime = (np.arange(num_timesteps) // 500) % 3
    y = means[regime] + rng.normal(size=num_timesteps)
    ll = -0.5 * (y[:, None] - means) ** 2 - 0.5 * np.log(2 * np.pi)
    trans = np.full((3, 3), 0.005)
    np.fill_diagonal(trans, 0.99)
    return np.full(3, 1 / 3), trans, ll


def test_float32_inputs_give_float32_outputs():
    """dtypes are kept; sequential smoothers are also accurate in float32 over 2^14 steps.

    (The parallel twin compiles slowly for long inputs, so its float32 run here is short;
    its total is the same balanced sum of one-step log normalizers as the sequential one,
    and its float64 agreement to 1e-10 is tested above.)
    """
    pi, trans, ll = gaussian_regimes(np.random.default_rng(13), 2**14)
    exact = SMOOTHERS["forward-backward"](pi, trans, ll)
    for name in ("forward-backward", "gradient"):
        post = SMOOTHERS[name](*(np.asarray(a, np.float32) for a in (pi, trans, ll)))
        assert abs(float(post.marginal_log_lik) / float(exact.marginal_log_lik) - 1) < 1e-6
        np.testing.assert_allclose(post.smoothed_probs, exact.smoothed_probs, atol=1e-4,
                                   err_msg=name)
    small = [np.asarray(a, np.float32) for a in random_hmm(np.random.default_rng(14))]
    for name, smoother in SMOOTHERS.items():
        post = smoother(*small)
        for field, leaf in zip(post._fields, post, strict=True):
            assert leaf.dtype == jnp.float32, (name, field)
    for run in FILTERS.values():
        assert run(*small).filtered_probs.dtype == jnp.float32
    assert viterbi(*small).dtype == jnp.int32
    assert hmm.hmm_predict_states(small[0], small[1], 3).dtype == jnp.float32


# ------------------------------------------------------------------------------------------
# prediction and input checks


def test_predict_states():
    rng = np.random.default_rng(14)
    p = rng.dirichlet(np.ones(K))
    trans = rng.dirichlet(np.ones(K), size=K)
    expected = np.stack([p @ np.linalg.matrix_power(trans, h) for h in range(1, 5)])
    np.testing.assert_allclose(hmm.hmm_predict_states(p, trans, np.int64(4)), expected,
                               rtol=1e-13)
    steps = rng.dirichlet(np.ones(K), size=(4, K))
    expected = [p @ steps[0]]
    for a in steps[1:]:
        expected.append(expected[-1] @ a)
    np.testing.assert_allclose(hmm.hmm_predict_states(p, steps, 4), expected, rtol=1e-13)
    with pytest.raises(ValueError, match="num_steps"):
        hmm.hmm_predict_states(p, trans, 0)
    with pytest.raises(ValueError, match=r"\(4, 3, 3\)"):
        hmm.hmm_predict_states(p, steps[:3], 4)


def test_broadcast_transitions():
    trans = np.random.default_rng(15).dirichlet(np.ones(K), size=K)
    out = hmm.broadcast_transitions(trans, 6)
    assert out.shape == (5, K, K)
    np.testing.assert_array_equal(out[3], trans)
    np.testing.assert_array_equal(hmm.broadcast_transitions(np.asarray(out), 6), out)
    with pytest.raises(ValueError, match="time-varying"):
        hmm.broadcast_transitions(out, 5)


@pytest.mark.parametrize("module", [hmm, hmm_parallel])
def test_shape_errors_name_the_argument(module):
    pi, trans, ll = random_hmm(np.random.default_rng(16))
    with pytest.raises(ValueError, match="initial_probs"):
        module.hmm_filter(pi[:2], trans, ll)
    with pytest.raises(ValueError, match="log_likelihoods"):
        module.hmm_filter(pi, trans, ll[0])
    with pytest.raises(ValueError, match="fixed transition_matrix"):
        module.hmm_filter(pi, trans[:, :2], ll)
    with pytest.raises(ValueError, match="time-varying transition_matrix"):
        module.hmm_smoother(pi, np.stack([trans] * T), ll)  # T matrices, not T-1
    with pytest.raises(ValueError, match="3 axes"):
        module.hmm_smoother(pi, trans[None, None], ll)


# ------------------------------------------------------------------------------------------
# peers


def test_dynamax_agrees():
    pytest.importorskip("dynamax")
    from dynamax.hidden_markov_model import inference as dx

    pi, trans, ll = random_hmm(np.random.default_rng(17), BIG_K, BIG_T)
    ours = SMOOTHERS["forward-backward"](pi, trans, ll)
    theirs = dx.hmm_smoother(jnp.asarray(pi), jnp.asarray(trans), jnp.asarray(ll))
    np.testing.assert_allclose(ours.marginal_log_lik, theirs.marginal_loglik, rtol=1e-10)
    np.testing.assert_allclose(ours.filtered_probs, theirs.filtered_probs, atol=1e-10)
    np.testing.assert_allclose(ours.smoothed_probs, theirs.smoothed_probs, atol=1e-10)
    theirs_pairs = dx.compute_transition_probs(jnp.asarray(trans), theirs)
    np.testing.assert_allclose(ours.expected_transitions, theirs_pairs, atol=1e-10)
    np.testing.assert_array_equal(
        viterbi(pi, trans, ll), dx.hmm_posterior_mode(jnp.asarray(pi), jnp.asarray(trans),
                                                      jnp.asarray(ll))
    )


def test_hmmlearn_agrees():
    hmmlearn_hmm = pytest.importorskip("hmmlearn.hmm")
    rng = np.random.default_rng(18)
    num_symbols = 5
    pi, trans, _ = random_hmm(rng, BIG_K, BIG_T)
    emission = rng.dirichlet(np.ones(num_symbols), size=BIG_K)
    x = rng.integers(num_symbols, size=BIG_T)
    ll = np.log(emission[:, x].T)

    model = hmmlearn_hmm.CategoricalHMM(n_components=BIG_K, n_features=num_symbols)
    model.startprob_, model.transmat_, model.emissionprob_ = pi, trans, emission
    post = SMOOTHERS["forward-backward"](pi, trans, ll)
    np.testing.assert_allclose(post.marginal_log_lik, model.score(x[:, None]), rtol=1e-10)
    np.testing.assert_allclose(post.smoothed_probs, model.predict_proba(x[:, None]), atol=1e-10)
    _, path = model.decode(x[:, None], algorithm="viterbi")
    np.testing.assert_array_equal(viterbi(pi, trans, ll), path)
