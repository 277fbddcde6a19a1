"""The HMM filter and smoother's unrolled form for 8 to 32 states (issue 13).

From 8 states on, `statseq.inference.hmm` writes the step's matrix-vector products as
sums of rows and unrolls its scans 4 steps per iteration; the backward pass runs on
likelihoods exponentiated outside the loop. These tests hold that form to brute-force
enumeration (exact, in log space), to the plain form (``unrolled=False``: ``@`` and one
step per iteration) at rounding level, and to the numeric promises of the module
docstring: masked rows, -inf rows, exact zeros in ``A``, time-varying transitions,
lengths that are not multiples of the unroll, gradients, ``vmap`` and float32 at 10^6
steps.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from statseq.inference import hmm
from tests.inference.test_hmm import brute_force, random_hmm

UNROLLED_K = 8  # the smallest state count on the unrolled form


@partial(jax.jit, static_argnames=("fn_name", "sum_transitions"))
def _plain_and_unrolled(fn_name, pi, trans, ll, sum_transitions=True):
    """Both forms in one compiled program per shape (compile time dominates these tests;
    one program instead of two, and no op-by-op dispatch around the scans)."""
    args = hmm._prepare_inputs(pi, trans, ll)
    out = {}
    if fn_name in ("filter", "both"):
        out["filter"] = hmm._filter(*args, unrolled=False), hmm._filter(*args, unrolled=True)
    if fn_name in ("smoother", "both"):
        st = sum_transitions
        out["smoother"] = (hmm._smoother(*args, st, unrolled=False),
                           hmm._smoother(*args, st, unrolled=True))
    return tuple(out.values()) if fn_name == "both" else out[fn_name]


def test_the_unrolled_form_is_chosen_for_8_to_32_states():
    assert not hmm._unrolled(7) and hmm._unrolled(8) and hmm._unrolled(32)
    assert not hmm._unrolled(33) and not hmm._unrolled(2)


@pytest.mark.parametrize("time_varying", [False, True])
def test_unrolled_matches_brute_force(time_varying):
    """K = 8, T = 4 (8^4 paths): every output against enumeration, to 1e-12."""
    rng = np.random.default_rng(1)
    pi, trans, ll = random_hmm(rng, UNROLLED_K, 4, time_varying)
    trans = np.array(trans)
    if time_varying:
        trans[1, 2] = np.eye(UNROLLED_K)[5]  # exact zeros: from state 2 only to state 5
    else:
        trans[0, 3], trans[0, 4] = 0.0, trans[0, 3] + trans[0, 4]
    ll[1] = 0.0  # a masked step
    ll[2, :3] = -np.inf  # three states impossible at step 2
    ref = brute_force(pi, trans, ll)
    filt = jax.jit(hmm.hmm_filter)(pi, trans, ll)
    for name in ("marginal_log_lik", "log_normalizers", "predicted_probs", "filtered_probs"):
        np.testing.assert_allclose(getattr(filt, name), ref[name], rtol=1e-12, atol=1e-13)
    for smoother in (hmm.hmm_smoother, hmm.hmm_smoother_by_gradient):
        # both layouts of the transitions in one compiled program per smoother
        summed, per = jax.jit(lambda *a, f=smoother: (f(*a), f(*a, sum_transitions=False)))(
            pi, trans, ll)
        np.testing.assert_allclose(summed.marginal_log_lik, ref["marginal_log_lik"], rtol=1e-12)
        np.testing.assert_allclose(summed.smoothed_probs, ref["smoothed_probs"], atol=1e-12)
        np.testing.assert_allclose(per.expected_transitions, ref["pairs"], atol=1e-12)
        np.testing.assert_allclose(summed.expected_transitions, ref["pairs"].sum(0), atol=1e-12)


@pytest.mark.parametrize("num_states", [8, 16])
def test_unrolled_equals_plain_at_every_length(num_states):
    """Lengths around the unroll of 4 (T - 1 steps in the scan), fixed transitions."""
    problems = [random_hmm(np.random.default_rng(num_states * 100 + t), num_states, t,
                           scale=3.0) for t in (1, 2, 4, 5, 6, 9)]

    @jax.jit  # every length, filter and smoother (which needs T > 1), in one program
    def every_length(problems):
        return [_plain_and_unrolled("both", *p) if p[2].shape[0] > 1
                else [_plain_and_unrolled("filter", *p)] for p in problems]

    for pairs in every_length(problems):
        for plain, unrolled in pairs:
            for a, b in zip(plain, unrolled, strict=True):
                np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


def test_unrolled_equals_plain_time_varying_with_masks_and_zeros():
    rng = np.random.default_rng(3)
    num_states, num_timesteps = 12, 31
    pi, trans, ll = random_hmm(rng, num_states, num_timesteps, time_varying=True, scale=4.0)
    trans = np.array(trans)
    trans[:, :, 0] = 0.0  # state 0 is never entered again
    trans /= trans.sum(-1, keepdims=True)
    ll[rng.random(num_timesteps) < 0.2] = 0.0  # masked steps
    ll[rng.random((num_timesteps, num_states)) < 0.2] = -np.inf  # impossible states
    both = jax.jit(lambda *a: [_plain_and_unrolled("smoother", *a, sum_transitions=st)
                               for st in (True, False)])  # one program for both layouts
    for plain, unrolled in both(pi, trans, ll):
        for a, b in zip(plain, unrolled, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


def test_impossible_observation_gives_minus_inf_not_nan():
    rng = np.random.default_rng(4)
    pi, trans, ll = random_hmm(rng, 16, 10)
    ll[6] = -np.inf  # impossible under every state
    filt = jax.jit(hmm.hmm_filter)(pi, trans, ll)
    assert np.isneginf(float(filt.marginal_log_lik))
    assert np.isneginf(filt.log_normalizers[6])
    assert np.all(np.isfinite(filt.filtered_probs))
    np.testing.assert_allclose(filt.filtered_probs[6], filt.predicted_probs[6])


def test_unrolled_gradients_equal_plain():
    """Reverse mode through the unrolled filter equals reverse mode through the plain one."""
    rng = np.random.default_rng(5)
    pi, trans, ll = random_hmm(rng, 10, 23)

    def total(unrolled):
        def f(pi, trans, ll):
            return hmm._filter(*hmm._prepare_inputs(pi, trans, ll), unrolled=unrolled)[0]
        return jax.grad(f, argnums=(0, 1, 2))

    both = jax.jit(lambda *a: (total(False)(*a), total(True)(*a)))  # one compiled program
    for a, b in zip(*both(pi, trans, ll), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-13)


def test_unrolled_vmaps_over_a_batch():
    rng = np.random.default_rng(6)
    pi, trans, _ = random_hmm(rng, 8, 17)
    lls = rng.normal(size=(3, 17, 8)) * 2
    batched = jax.jit(jax.vmap(lambda ll: hmm.hmm_smoother(pi, trans, ll)))(lls)
    single = jax.jit(hmm.hmm_smoother)
    for i in range(3):
        one = single(pi, trans, lls[i])
        for a, b in zip(one, batched, strict=True):
            np.testing.assert_allclose(b[i], a, rtol=1e-12, atol=1e-14)


def test_unrolled_float32_at_a_million_steps():
    """float32 on the unrolled form, 10^6 steps, K = 8: within 1e-6 of float64."""
    num_timesteps, num_states = 1_000_000, UNROLLED_K
    rng = np.random.default_rng(7)
    means = np.linspace(-3.0, 3.0, num_states)
    regime = (np.arange(num_timesteps) // 400) % num_states
    y = means[regime] + rng.normal(size=num_timesteps)
    ll = -0.5 * (y[:, None] - means) ** 2 - 0.5 * np.log(2 * np.pi)
    trans = np.full((num_states, num_states), 0.01 / (num_states - 1))
    np.fill_diagonal(trans, 0.99)
    pi = np.full(num_states, 1.0 / num_states)
    run = jax.jit(lambda p, a, l: hmm.hmm_filter(p, a, l).marginal_log_lik)
    exact = float(run(pi, trans, ll))
    single = run(*(np.asarray(x, np.float32) for x in (pi, trans, ll)))
    assert single.dtype == jnp.float32
    assert exact < -1e6
    assert abs(float(single) / exact - 1) < 1e-6
