"""The blocked two-level HMM filter and backward pass (`statseq.inference.hmm_blocked`).

The blocked path (chunk transfer matrices, a scan over chunk boundaries, per-step messages
vectorized across chunks) must equal the sequential scan of `statseq.inference.hmm` to
rounding: brute-force enumeration, then the sequential form on lengths that are not
multiples of the chunk length, chunks longer than the sequence, masks, -inf rows (the
fallback to the sequential boundary messages), time-varying transitions, gradients,
``vmap`` and float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from statseq.inference import hmm, hmm_blocked
from tests.inference.test_hmm import brute_force, random_hmm


def _both(pi, trans, ll, length=None, sum_transitions=True):
    """Sequential and blocked filter and smoother on one problem (traced, not jitted)."""
    args = hmm._prepare_inputs(pi, trans, ll)
    if length is None:
        blocked_filter = hmm._filter(*args, blocked=True)
    else:
        blocked_filter = hmm_blocked.filter_blocked(*args, length=length)
    out = [(hmm._filter(*args, blocked=False), blocked_filter)]
    if ll.shape[0] > 1:
        out.append((hmm._smoother(*args, sum_transitions, blocked=False),
                    hmm._smoother(*args, sum_transitions, blocked=True)))
    return out


def _assert_pairs_equal(pairs, rtol=1e-12, atol=1e-13):
    for sequential, blocked in pairs:
        for a, b in zip(sequential, blocked, strict=True):
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)


def test_default_rule_is_cpu_six_or_seven_states_and_long_sequences():
    """The smoother's default (`use_blocked`); the GPU default is unchanged."""
    use = hmm_blocked.use_blocked
    assert use(4096, 6, "cpu") and use(10**6, 7, "cpu")
    assert not use(4096, 2, "cpu") and not use(4096, 8, "cpu")  # tie / unrolled is faster
    assert not use(hmm_blocked.BLOCKED_MIN_STEPS - 1, 6, "cpu")
    assert not use(10**6, 6, "gpu") and not use(10**6, 6, "cuda")  # GPU default unchanged


def test_default_dispatch_reaches_the_blocked_kernels(monkeypatch):
    calls = []
    filter_blocked, backward_blocked = hmm_blocked.filter_blocked, hmm_blocked.backward_blocked
    monkeypatch.setattr(hmm_blocked, "filter_blocked",
                        lambda *a, **k: calls.append("f") or filter_blocked(*a, **k))
    monkeypatch.setattr(hmm_blocked, "backward_blocked",
                        lambda *a, **k: calls.append("b") or backward_blocked(*a, **k))
    pi, trans, ll = random_hmm(np.random.default_rng(0), 6, hmm_blocked.BLOCKED_MIN_STEPS)
    on_cpu = jax.default_backend() == "cpu"
    jax.eval_shape(hmm.hmm_smoother, pi, trans, ll)
    assert calls == []  # the smoother's default there is the sweeps (faster: `use_blocked`)
    jax.eval_shape(lambda *a: hmm._smoother(*hmm._prepare_inputs(*a), True, blocked=None,
                                            sweeps=False), pi, trans, ll)
    assert calls == (["f", "b"] if on_cpu else [])
    calls.clear()
    gradient = hmm_blocked.gradient_blocked
    monkeypatch.setattr(hmm_blocked, "gradient_blocked",
                        lambda *a, **k: calls.append("g") or gradient(*a, **k))
    jax.eval_shape(hmm.hmm_smoother_by_gradient, pi, trans, ll)
    assert calls == []  # float64: the gradient path follows the smoother to the sweeps
    f32 = [jnp.asarray(x, jnp.float32) for x in (pi, trans, ll)]
    jax.eval_shape(hmm.hmm_smoother_by_gradient, *f32)  # float32 at 6 states: blocked
    assert calls == (["g"] if on_cpu else [])
    calls.clear()
    jax.eval_shape(hmm.hmm_smoother_by_gradient, pi, trans, ll[:100])  # too short
    jax.eval_shape(hmm.hmm_filter, pi, trans, ll)  # the filter stays sequential
    jax.eval_shape(hmm.hmm_smoother, pi, trans, ll[:100])  # too short: sequential
    jax.eval_shape(hmm.hmm_smoother, pi[:2] / pi[:2].sum(), trans[:2, :2] / trans[:2, :2].sum(
        1, keepdims=True), ll[:, :2])  # two states: sequential
    assert calls == []


def test_blocked_matches_brute_force():
    """K = 3, T = 7 (3^7 paths) in chunks of 3 (the last one short), time-varying: every
    output against enumeration, with a masked step, an impossible state and an exact zero
    in A."""
    rng = np.random.default_rng(1)
    pi, trans, ll = random_hmm(rng, 3, 7, time_varying=True)
    trans = np.array(trans)
    trans[2, 1] = np.eye(3)[2]  # from state 1 at step 2 only to state 2
    ll[3] = 0.0  # masked
    ll[4, 0] = -np.inf  # state 0 impossible at step 4
    ref = brute_force(pi, trans, ll)

    @jax.jit
    def run(pi, trans, ll):
        args = hmm._prepare_inputs(pi, trans, ll)
        return (hmm._filter(*args, blocked=True),
                hmm._smoother(*args, True, blocked=True),
                hmm._smoother(*args, False, blocked=True))

    filt, summed, per = run(pi, trans, ll)
    for name in ("marginal_log_lik", "log_normalizers", "predicted_probs", "filtered_probs"):
        np.testing.assert_allclose(getattr(filt, name), ref[name], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(summed.marginal_log_lik, ref["marginal_log_lik"], rtol=1e-12)
    np.testing.assert_allclose(summed.smoothed_probs, ref["smoothed_probs"], atol=1e-12)
    np.testing.assert_allclose(per.expected_transitions, ref["pairs"], atol=1e-12)
    np.testing.assert_allclose(summed.expected_transitions, ref["pairs"].sum(0), atol=1e-12)


def test_blocked_equals_sequential_at_edge_lengths_and_chunk_lengths():
    """Lengths 9 and 50 (chunks of ceil(sqrt(T)); 50 is not a multiple of 8), a chunk
    longer than the sequence, 2 and 6 states, masks, fixed and time-varying matrices."""
    problems = []
    for seed, (k, t, tv) in enumerate([(6, 9, True), (2, 50, False)]):
        rng = np.random.default_rng(10 + seed)
        pi, trans, ll = random_hmm(rng, k, t, tv, scale=3.0)
        ll[rng.random(t) < 0.2] = 0.0  # masked steps
        problems.append((pi, trans, ll))

    @jax.jit  # one program for every case
    def run(problems):
        out = [_both(*p) for p in problems]
        out.append(_both(*problems[-1][:2], problems[-1][2][:6], length=10))  # one chunk
        out.append(_both(*problems[-1][:2], problems[-1][2][:1]))  # one step
        return out

    for pairs in run(problems):
        _assert_pairs_equal(pairs)


def test_impossible_observations_take_the_sequential_boundaries():
    """An observation impossible under every state (in a middle chunk and in the last one)
    gives log-likelihood -inf and keeps the message, as the sequential scan does; an
    impossible state and exact zeros in A do not leave the blocked path."""
    rng = np.random.default_rng(5)
    pi, trans, ll = random_hmm(rng, 2, 30, scale=2.0)
    ll_middle, ll_last = ll.copy(), ll.copy()
    ll_middle[11] = -np.inf
    ll_last[28] = -np.inf
    ll_state = ll.copy()
    ll_state[::3, 1] = -np.inf
    trans_zero = np.array([[1.0, 0.0], [0.3, 0.7]])

    @jax.jit
    def run(pi, trans, ll_middle, ll_last, ll_state, trans_zero):
        return [hmm._filter(*hmm._prepare_inputs(pi, a, x), blocked=b)
                for a, x in ((trans, ll_middle), (trans, ll_last), (trans, ll_state),
                             (trans_zero, ll)) for b in (False, True)]

    out = run(pi, trans, ll_middle, ll_last, ll_state, trans_zero)
    for step, (sequential, blocked) in zip((11, 28), (out[0:2], out[2:4]), strict=True):
        assert np.isneginf(float(blocked.marginal_log_lik))
        assert np.all(np.isfinite(blocked.filtered_probs))
        np.testing.assert_allclose(blocked.filtered_probs[step], blocked.predicted_probs[step])
        _assert_pairs_equal([(sequential, blocked)])
    _assert_pairs_equal([out[4:6], out[6:8]])
    assert np.isfinite(float(out[5].marginal_log_lik))


def test_blocked_gradients_equal_sequential():
    """Reverse mode through all three passes, also off the simplex (the gradient with
    respect to ``A`` has components that change its row sums)."""
    rng = np.random.default_rng(6)
    problems = [random_hmm(rng, 2, 17, time_varying=True)]

    def grads(blocked):
        def total(pi, trans, ll):
            return hmm._filter(*hmm._prepare_inputs(pi, trans, ll), blocked=blocked)[0]
        return jax.grad(total, argnums=(0, 1, 2))

    run = jax.jit(lambda ps: [(grads(False)(*p), grads(True)(*p)) for p in ps])
    for sequential, blocked in run(problems):
        for a, b in zip(sequential, blocked, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-13)


def test_blocked_vmaps_over_a_batch():
    rng = np.random.default_rng(7)
    pi, trans, _ = random_hmm(rng, 2, 20)
    lls = rng.normal(size=(3, 20, 2)) * 2
    lls[1, 7] = -np.inf  # this sequence alone needs the sequential boundaries

    def both(ll):
        args = hmm._prepare_inputs(pi, trans, ll)
        return (hmm._smoother(*args, True, blocked=False),
                hmm._smoother(*args, True, blocked=True))

    sequential, blocked = jax.jit(jax.vmap(both))(lls)
    for a, b in zip(sequential, blocked, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-13)


def test_blocked_float32_equals_sequential_float32():
    """float32 through the blocked path, 5,000 steps: the same answer as the sequential
    float32 scan to float32 rounding (log-likelihood 1e-6 relative, marginals 1e-5)."""
    num_timesteps = 5_000
    rng = np.random.default_rng(8)
    means = np.array([-1.0, 1.0])
    y = means[(np.arange(num_timesteps) // 300) % 2] + rng.normal(size=num_timesteps)
    ll = -0.5 * (y[:, None] - means) ** 2 - 0.5 * np.log(2 * np.pi)
    args = [np.asarray(x, np.float32) for x in ([0.5, 0.5], [[0.99, 0.01], [0.02, 0.98]], ll)]
    sequential, blocked = jax.jit(lambda *a: [
        hmm._smoother(*hmm._prepare_inputs(*a), True, blocked=b) for b in (False, True)])(*args)
    assert blocked.smoothed_probs.dtype == jnp.float32
    assert abs(float(blocked.marginal_log_lik) / float(sequential.marginal_log_lik) - 1) < 1e-6
    for a, b in zip(sequential, blocked, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_fallback_boundary_messages_equal_the_sequential_recursions():
    """The fallback's chunk-boundary messages (used when a boundary normalizer is zero):
    forward ones equal `hmm_filter`'s predicted messages, backward ones the normalized
    backward recursion, with a last chunk that is short (T - 1 = 10 steps, chunks of 4)."""
    rng = np.random.default_rng(9)
    pi, trans, ll = random_hmm(rng, 3, 11, time_varying=True)
    lik = np.exp(ll[1:] - ll[1:].max(1, keepdims=True))

    @jax.jit
    def run(pi, trans, ll, lik):
        return (hmm_blocked._sequential_starts(pi, None, trans, ll, 4, 3),
                hmm_blocked._sequential_ends(None, trans, lik, 4, 3),
                hmm.hmm_filter(pi, trans, ll).predicted_probs)

    starts, ends, predicted = run(pi, trans, ll, lik)
    np.testing.assert_allclose(starts, predicted[::4], rtol=1e-13)
    beta, betas = np.ones(3), {}
    for s in range(9, -1, -1):  # beta_s = A_s (l_{s+1} * beta_{s+1}), max-normalized
        betas[s + 1] = beta
        beta = trans[s] @ (lik[s] * beta)
        beta = beta / beta.max()
    np.testing.assert_allclose(ends, [betas[4], betas[8], np.ones(3)], rtol=1e-13)


def test_gradient_path_blocked_equals_sequential_and_forward_backward():
    """`hmm_smoother_by_gradient`'s blocked path (`gradient_blocked`): the marginals equal
    `hmm_smoother`'s and every part the sequential gradient path's to 1e-12, at 6 states
    on 23 steps in chunks of 5 (a short last chunk) with masks and impossible states; at 3
    states (each shape of the blocked path compiles for seconds at 6) on 16 time-varying
    steps in chunks of 4, 2 steps in chunks of 1 and an observation impossible under
    every state (the sequential fallback). Derivatives of the outputs and the batching rule
    (a vmapped pair) are the sequential path's."""
    rng = np.random.default_rng(11)
    pi, trans, ll = random_hmm(rng, 6, 23, scale=3.0)
    ll[[4, 17]] = 0.0  # masked
    ll[::3, 2] = -np.inf  # an impossible state
    pi3, trans_tv, ll_tv = random_hmm(rng, 3, 16, time_varying=True)
    ll_none = ll_tv.copy()
    ll_none[9] = -np.inf  # impossible under every state
    direction = rng.normal(size=ll_tv.shape)

    @jax.jit
    def run(pi, trans, ll, pi3, trans_tv, ll_tv, ll_none):
        cases = [((pi, trans, ll), 5), ((pi3, trans_tv, ll_tv), 4),
                 ((pi3, trans_tv[:1], ll_tv[:2]), 1), ((pi3, trans_tv, ll_none), 4)]
        out = []
        for i, (problem, length) in enumerate(cases):
            args = hmm._prepare_inputs(*problem)
            out.append((hmm._sequential_gradient_parts(*args),
                        hmm_blocked.gradient_blocked(*args, length=length),
                        hmm._smoother(*args, True, blocked=False) if i < 3 else None))
        args = hmm._prepare_inputs(pi3, trans_tv, ll_tv)
        second = [jax.jvp(lambda x, f=f: f(*args[:3], x), (ll_tv,), (direction,))[1]
                  for f in (hmm._sequential_gradient_parts, hmm._blocked_gradient_parts)]
        batch = jax.vmap(lambda x: hmm._blocked_gradient_parts(*args[:3], x))(
            jnp.stack([ll_tv, ll_none]))  # the sequential path under vmap (custom_vmap)
        return out, second, batch

    out, second, batch = run(pi, trans, ll, pi3, trans_tv, ll_tv, ll_none)
    for sequential, blocked, smoother in out:
        _assert_pairs_equal([(sequential, blocked)])
        if smoother is not None:
            np.testing.assert_allclose(blocked[3], smoother.smoothed_probs, rtol=1e-12,
                                       atol=1e-13)
            np.testing.assert_allclose(blocked[0], smoother.marginal_log_lik, rtol=1e-12)
    assert np.isneginf(float(out[3][1][0])) and np.all(np.isfinite(out[3][1][3]))
    _assert_pairs_equal([second])
    for j, i in enumerate((1, 3)):
        _assert_pairs_equal([(out[i][0], [x[j] for x in batch])])
