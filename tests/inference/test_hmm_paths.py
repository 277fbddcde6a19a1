"""Viterbi and posterior sampling (statseq.inference.hmm_paths) against exact references.

References: brute-force enumeration of all K^T paths at tiny T; the step-by-step Viterbi scan
(the implementation before the blocked kernels, kept below verbatim) for identical integer
paths, ties and zero transitions included; `hmm_smoother` for the marginals of many samples.
Every kernel (sequential, packed scalar steps for K <= 3, unrolled rows for K = 16, blocked,
by sweeps over blocks) must give the reference's path; sampling (packed draw table for K <= 3,
by sweeps) the step-by-step inverse-CDF draws, bit for bit.
"""

from __future__ import annotations

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from statseq.inference import hmm_paths
from statseq.inference.hmm import (
    _prepare_inputs,
    hmm_posterior_sample,
    hmm_smoother,
    hmm_viterbi,
)


def reference_viterbi(initial_probs, transition_matrix, log_likelihoods):
    """The step-by-step max-product scan (statseq's `hmm_viterbi` before hmm_paths)."""
    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    log_fixed = None if fixed is None else jnp.log(fixed)
    delta0 = jnp.log(pi) + ll[0]
    delta0 = delta0 - jnp.max(delta0)

    def forward(delta_prev, xs):
        ll_t, a_prev = xs
        log_a = log_fixed if a_prev is None else jnp.log(a_prev)
        scores = delta_prev[:, None] + log_a
        delta = jnp.max(scores, axis=0) + ll_t
        return delta - jnp.max(delta), jnp.argmax(scores, axis=0).astype(jnp.int32)

    delta_last, pointers = jax.lax.scan(forward, delta0, (ll[1:], per_step))
    last = jnp.argmax(delta_last).astype(jnp.int32)

    def backtrack(state_next, pointers_t):
        state = pointers_t[state_next]
        return state, state

    _, states = jax.lax.scan(backtrack, last, pointers, reverse=True)
    return jnp.concatenate([states, last[None]])


def path_log_joint(pi, a, ll, z):
    """log p(y, z) of one path, in NumPy (fixed or time-varying ``a``)."""
    out = np.log(pi[z[0]]) + ll[0, z[0]]
    for t in range(1, len(z)):
        a_t = a if a.ndim == 2 else a[t - 1]
        out += np.log(a_t[z[t - 1], z[t]]) + ll[t, z[t]]
    return out


def all_paths(pi, a, ll):
    k, t = ll.shape[1], ll.shape[0]
    paths = list(itertools.product(range(k), repeat=t))
    with np.errstate(divide="ignore"):
        logp = np.array([path_log_joint(pi, a, ll, np.array(z)) for z in paths])
    return paths, logp


def random_problem(rng, k, t, time_varying=False, zeros=False, sticky=3.0):
    pi = rng.dirichlet(np.ones(k))
    shape = (t - 1, k) if time_varying else (k,)
    a = rng.dirichlet(np.ones(k), size=shape) + sticky * np.eye(k)
    if zeros:  # forbid some moves (never a whole row)
        a = a * (rng.uniform(size=a.shape) > 0.3)
        a = a + np.eye(k) * (a.sum(-1, keepdims=True) == 0)
    a = a / a.sum(-1, keepdims=True)
    ll = rng.normal(size=(t, k)) * 1.5
    return pi, a, ll


# ------------------------------------------------------------------------------------------
# Viterbi


@pytest.mark.parametrize("time_varying", [False, True])
def test_viterbi_is_the_brute_force_argmax(time_varying):
    rng = np.random.default_rng(0)
    for k, t in [(2, 1), (2, 6), (3, 5), (4, 3)]:
        pi, a, ll = random_problem(rng, k, t, time_varying=time_varying and t > 1)
        ll[t // 2] = 0.0  # a masked step
        paths, logp = all_paths(pi, a, ll)
        got = np.asarray(hmm_viterbi(pi, a, ll))
        assert got.dtype == np.int32
        assert tuple(got) == paths[int(np.argmax(logp))]


@partial(jax.jit, static_argnames="sweeps")
def _four_paths(pi, a, ll, sweeps=False):
    """The reference, the default and every kernel (whatever the default picks:
    sequential, blocked and, with ``sweeps``, by sweeps), in one compiled program per
    problem shape (compile time dominates these tests)."""
    prepared = _prepare_inputs(pi, a, ll)
    forced = [hmm_paths.viterbi(*prepared, blocked=b, sweeps=False) for b in (False, True)]
    if sweeps:
        forced.append(hmm_paths.viterbi(*prepared, sweeps=True))
    return reference_viterbi(pi, a, ll), hmm_viterbi(pi, a, ll), *forced


def _paths_equal(pi, a, ll, sweeps=False):
    ref, got, *forced = (np.asarray(x) for x in _four_paths(pi, a, ll, sweeps=sweeps))
    for path in forced:
        np.testing.assert_array_equal(path, ref)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, ref)
    return got


@pytest.mark.parametrize(("k", "time_varying"), [(2, False), (3, True), (5, False)])
def test_viterbi_identical_to_the_sequential_scan(k, time_varying):
    """Long enough to run blocked (T - 1 >= MIN_BLOCKED_STEPS) and by sweeps over blocks
    (T - 1 = 299, 999: not multiples of the block), with masks, zeros and -inf entries;
    K = 2, 3 run the packed scalar step, K = 5 the reductions."""
    rng = np.random.default_rng(10 + k)
    for t, zeros in [(300, False), (1000, True)]:
        pi, a, ll = random_problem(rng, k, t, time_varying=time_varying, zeros=zeros)
        ll[rng.uniform(size=t) < 0.1] = 0.0
        rows = np.flatnonzero(rng.uniform(size=t) < 0.05)
        ll[rows, rng.integers(0, k, rows.size)] = -np.inf  # one impossible state there
        _paths_equal(pi, a, ll, sweeps=True)


def test_viterbi_packed_groups_every_remainder():
    """The packed kernel (K <= 3) runs `PACKED_GROUP` steps per forward iteration and
    ``PACKED_BACK_GROUP`` codes per backtracking iteration, the first ``(T - 1) mod (S G)``
    steps one at a time: every remainder, lengths shorter than one group and exact
    multiples give the reference's path (K = 1, 2 fixed, K = 3 time-varying with zeros)."""
    rng = np.random.default_rng(21)
    for k, time_varying in [(1, False), (2, False), (3, True)]:
        span = hmm_paths.PACKED_GROUP[k] * hmm_paths.PACKED_BACK_GROUP
        lengths = [2, span, span + 1, 2 * span + 3] if k != 1 else [span + 2]
        for t in lengths:
            pi, a, ll = random_problem(rng, k, t, time_varying=time_varying, zeros=k == 3)
            _paths_equal(pi, a, ll, sweeps=k == 2)


def test_viterbi_impossible_step_ties_and_length_one():
    """A step where every state is impossible (an all -inf row: NaN messages from there on;
    by sweeps they never match bit for bit and the sequential scan runs) gives the
    reference's path, for the packed scalar step (K = 2) and the unrolled rows (K = 16,
    also by sweeps, with exact ties everywhere: dyadic log-likelihoods and a uniform A);
    T = 1 is the argmax of the first message for every kernel."""
    rng = np.random.default_rng(12)
    pi, a, ll = random_problem(rng, 2, 300)
    ll[150] = -np.inf
    _paths_equal(pi, a, ll)
    k = 16
    assert hmm_paths.ROWS_STATES[0] <= k <= hmm_paths.ROWS_STATES[1]
    ll = np.round(rng.normal(size=(300, k)) * 2) / 4
    ll[rng.uniform(size=(300, k)) < 0.05] = -np.inf
    ll[200] = -np.inf
    _paths_equal(np.full(k, 1 / k), np.full((k, k), 1 / k), ll, sweeps=True)
    one = _prepare_inputs(pi, a, ll[:1, :2])
    want = int(np.argmax(np.log(pi) + ll[0, :2]))
    for kwargs in ({}, {"sweeps": True}, {"blocked": True}):
        assert hmm_paths.viterbi(*one, **kwargs).tolist() == [want]


def test_viterbi_ties_go_to_the_lowest_index():
    """Two identical states (same emissions, symmetric transitions): every score ties
    exactly, and the path must take the lower index, as the sequential scan does."""
    rng = np.random.default_rng(3)
    t = 700
    base = rng.normal(size=(t, 2)) * 1.5
    ll = np.stack([base[:, 0], base[:, 0], base[:, 1]], axis=1)  # states 0 and 1 twins
    a = np.array([[0.4, 0.4, 0.2], [0.4, 0.4, 0.2], [0.15, 0.15, 0.7]])
    pi = np.array([0.3, 0.3, 0.4])
    path = _paths_equal(pi, a, ll)
    assert not np.any(path == 1)  # state 1 always ties with state 0 and loses
    # dyadic values: exact ties inside the max-product too
    ll = np.round(rng.normal(size=(t, 2)) * 4) / 4
    _paths_equal(np.array([0.5, 0.5]), np.array([[0.5, 0.5], [0.5, 0.5]]), ll)


def test_viterbi_chain_that_never_forgets():
    """A = I: the message never forgets its start, so the speculative sweeps find no fixed
    point and the chunk starts are corrected one after the other (blocked), or the
    sequential scan runs (`sweeps.sweep_scan`'s fallback)."""
    rng = np.random.default_rng(4)
    ll = rng.normal(size=(2000, 3))
    path = _paths_equal(np.array([0.2, 0.5, 0.3]), np.eye(3), ll, sweeps=True)
    assert np.all(path == path[0])
    paths = [np.full(2000, s) for s in range(3)]
    best = np.argmax([np.log([0.2, 0.5, 0.3][s]) + ll[:, s].sum() for s in range(3)])
    np.testing.assert_array_equal(path, paths[best])


def test_viterbi_float32_and_vmap():
    rng = np.random.default_rng(5)
    pi, a, ll = random_problem(rng, 2, 3000)
    args = [jnp.asarray(x, jnp.float32) for x in (pi, a, ll)]
    lls = jnp.stack([args[2], args[2][::-1]])

    @jax.jit  # one compiled program for the paths
    def paths(pi, a, lls):
        batched = jax.vmap(lambda l: hmm_viterbi(pi, a, l))(lls)
        prepared = jax.vmap(lambda l: _prepare_inputs(pi, a, l))(lls)
        swept = jax.vmap(lambda *p: hmm_paths.viterbi(*p, sweeps=True))(*prepared)
        return (hmm_viterbi(pi, a, lls[0]), reference_viterbi(pi, a, lls[0]), batched[1],
                reference_viterbi(pi, a, lls[1]), swept)

    got, ref, got_batched, ref_reversed, swept = (
        np.asarray(x) for x in paths(*args[:2], lls))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got_batched, ref_reversed)
    np.testing.assert_array_equal(swept, np.stack([ref, ref_reversed]))


# ------------------------------------------------------------------------------------------
# posterior sampling


def _sample_many(pi, a, ll, num, seed=0):
    keys = jax.random.split(jax.random.key(seed), num)
    fn = jax.jit(jax.vmap(lambda k: hmm_posterior_sample(pi, a, ll, key=k)))
    return np.asarray(fn(keys))


@pytest.mark.parametrize("case", ["fixed", "time_varying", "zeros"])
def test_sampled_path_frequencies_match_enumeration(case):
    """Pearson's chi-square of 20000 draws against the exact p(z | y) over all K^T paths.

    The key is fixed, so the statistic is deterministic; a correct sampler gives a
    p-value that is uniform over keys, so the threshold 1e-3 is what a wrong sampler must
    beat. (A sampler off by a few percent in one path of this size gives p < 1e-10.)
    """
    rng = np.random.default_rng({"fixed": 1, "time_varying": 2, "zeros": 3}[case])
    k, t = (3, 4) if case != "fixed" else (2, 7)
    pi, a, ll = random_problem(rng, k, t, time_varying=case == "time_varying",
                               zeros=case == "zeros", sticky=0.5)
    ll[1] = 0.0  # a masked step
    paths, logp = all_paths(pi, a, ll)
    probs = np.exp(logp - np.logaddexp.reduce(logp))
    draws = _sample_many(pi, a, ll, 20000)
    assert draws.dtype == np.int32
    index = {p: i for i, p in enumerate(paths)}
    counts = np.bincount([index[tuple(d)] for d in draws], minlength=len(paths))
    assert np.all(counts[probs == 0] == 0)  # impossible paths are never drawn
    live = probs > 0
    expected = probs[live] * counts.sum()
    assert stats.chisquare(counts[live], expected).pvalue > 1e-3
    tv = 0.5 * np.abs(counts / counts.sum() - probs).sum()
    # E[TV] <= 0.5 sqrt(m / (2 pi N)) * 2 for m paths (sum_i sqrt(p_i) <= sqrt(m))
    assert tv < np.sqrt(len(paths) / (2 * np.pi * 20000))


def test_sample_pair_marginals_match_the_smoother():
    """Long enough for the blocked backtracking; per-step marginals and summed transition
    counts of 3000 draws against `hmm_smoother`, within 5 Monte Carlo standard errors."""
    rng = np.random.default_rng(7)
    k, t, num = 3, 400, 3000
    pi, a, ll = random_problem(rng, k, t, sticky=1.0)
    ll[::17] = 0.0
    post = jax.jit(hmm_smoother)(pi, a, ll)
    draws = _sample_many(pi, a, ll, num, seed=1)
    onehot = draws[..., None] == np.arange(k)  # (N, T, K)
    freq, smoothed = onehot.mean(0), np.asarray(post.smoothed_probs)
    # standard errors from the exact probabilities: estimated from the frequencies they
    # shrink to the floor where a rare state (p ~ 1e-3, a few expected draws) got none
    se = np.sqrt(np.maximum(smoothed * (1 - smoothed), 1e-6) / num)
    assert np.all(np.abs(freq - smoothed) < 5 * se + 1e-12)
    pairs = np.einsum("nti,ntj->nij", onehot[:, :-1].astype(float), onehot[:, 1:])
    se = pairs.std(0) / np.sqrt(num)
    np.testing.assert_array_less(np.abs(pairs.mean(0) - np.asarray(post.expected_transitions)),
                                 5 * se + 1e-9)


def test_sampling_is_deterministic_per_key():
    rng = np.random.default_rng(8)
    pi, a, ll = random_problem(rng, 4, 500, time_varying=True)
    # jitted (one compile per shape; op-by-op dispatch of the blocked kernels cost more)
    sample = jax.jit(lambda pi, a, ll, key: hmm_posterior_sample(pi, a, ll, key=key))
    z1 = sample(pi, a, ll, jax.random.key(0))
    z2 = sample(pi, a, ll, jax.random.key(0))
    z3 = sample(pi, a, ll, jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(z1), np.asarray(z2))
    assert np.any(np.asarray(z1) != np.asarray(z3))
    single = sample(pi[:1] / pi[0], np.ones((1, 1)), ll[:1, :1], jax.random.key(0))
    assert np.asarray(single).tolist() == [0]


@pytest.mark.parametrize(("k", "time_varying"), [(16, False), (3, True)])
def test_backward_draws_are_the_inverse_cdf_of_the_uniforms(k, time_varying):
    """Each backward draw is the inverse CDF of f_t(i) A_t[i, z_{t+1}] at the uniform u_t
    drawn from the key's second split (a NumPy loop of that rule with the same uniforms
    gives the identical path; the rule's distribution is checked by enumeration above).
    The kernel takes any table of filtered probabilities (no filter is compiled here)."""
    rng = np.random.default_rng(11 + k)
    t = 40
    _, a, _ = random_problem(rng, k, t, time_varying=time_varying, zeros=True, sticky=0.5)
    filtered = rng.dirichlet(np.ones(k) * 0.3, size=t)
    fixed, per_step = (None, a) if time_varying else (a, None)
    key = jax.random.key(5)

    @jax.jit  # one program: the path (sequential, by sweeps), the key's uniforms, last draw
    def run(filtered, fixed, per_step, key):
        key_last, key_noise = jax.random.split(key)
        return (hmm_paths.posterior_sample(filtered, fixed, per_step, key, sweeps=False),
                hmm_paths.posterior_sample(filtered, fixed, per_step, key, sweeps=True),
                jax.random.uniform(key_noise, (t - 1,), filtered.dtype),
                jax.random.categorical(key_last, jnp.log(filtered[-1])))

    got, swept, u, last = (np.asarray(x) for x in run(filtered, fixed, per_step, key))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(swept, got)  # the same draws, bit for bit
    assert got[-1] == last
    for s in range(t - 2, -1, -1):
        a_s = a[s] if time_varying else a
        sums = np.cumsum(filtered[s] * a_s[:, got[s + 1]])
        assert got[s] == np.sum(sums[:-1] <= u[s] * sums[-1])


def test_sampling_by_sweeps_is_the_sequential_sampler():
    """The backward draws by sweeps over blocks (`sweeps.sweep_scan`, reverse, integer
    carry) give the sequential sampler's path for the same key, bit for bit: T = 1,
    T - 1 = 299 (not a multiple of the block), float32, a vmap over sequences, and a cyclic
    permutation for A (z_t = z_{t+1} - 1: chains from different guessed ends never merge,
    so the sweeps do not converge and the sequential fallback runs)."""
    rng = np.random.default_rng(13)
    k, t = 3, 300
    _, a, _ = random_problem(rng, k, t, sticky=1.0)
    filtered = rng.dirichlet(np.ones(k) * 0.5, size=(2, t))
    filtered[:, 7, 0] = 0.0  # a state of zero filtered probability
    filtered /= filtered.sum(-1, keepdims=True)
    keys = jax.random.split(jax.random.key(9), 2)

    @jax.jit  # one program for every case (compile time dominates)
    def run(filtered, a, keys):
        def both(f, a, key):
            return jnp.stack([hmm_paths.posterior_sample(f, a, None, key, sweeps=s)
                              for s in (False, True)])

        f32 = jax.tree.map(lambda x: x.astype(jnp.float32), (filtered[0], a))
        return (jax.vmap(lambda f, key: both(f, a, key))(filtered, keys),
                both(filtered[0, :1], a, keys[0]), both(*f32, keys[1]),
                both(filtered[1], jnp.roll(jnp.eye(k), 1, axis=1), keys[1]))

    batched, one, single, never = (np.asarray(x) for x in run(filtered, a, keys))
    for seq, swept in (*batched, one, single, never):
        np.testing.assert_array_equal(swept, seq)
    assert one.shape == (2, 1)
    assert np.all(np.diff(never[0]) % k == 1)  # the cycle, backward from the last draw
