"""`statseq.inference.sweeps`: sweeps over blocks equal the sequential scan.

The sweeps claim the sequential scan's outputs (module docstring of `sweeps`): checked
against `jax.lax.scan` with the same step (to the last bit where the step is a plain
recursion, 1e-12 for the HMM filter against its sequential form), on lengths that are
and are not multiples of the block, forward and backward, with integer carries, and on a
recursion that never forgets (the sequential fallback).
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from statseq.inference import hmm  # noqa: E402
from statseq.inference.sweeps import default_block_length, sweep_scan  # noqa: E402


def _contracting(carry, x):  # forgets its start at rate 1/2; emits the carry it read
    return 0.5 * carry + x, (carry, 2.0 * x)


def _counter(carry, x):  # never forgets
    return carry + x, carry


def _survivor(carry, x):  # integer carry: a back-pointer chain (merges into state 0)
    return x[carry], carry


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("num_timesteps", [1, 31, 200])
def test_sweeps_equal_the_scan_bit_for_bit(num_timesteps, reverse):
    xs = jnp.asarray(np.random.default_rng(0).normal(size=num_timesteps))
    run = jax.jit(lambda x: sweep_scan(_contracting, jnp.zeros(()), x, block_length=32,
                                       chunk=8, reverse=reverse))
    got, info = run(xs)
    want = jax.lax.scan(_contracting, jnp.zeros(()), xs, reverse=reverse)[1]
    assert bool(info.converged)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_integer_carry_and_pytree_inputs():
    rng = np.random.default_rng(1)
    # back-pointers into 3 states, state 0's pointer always 0: every chain merges
    pointers = rng.integers(0, 3, size=(150, 3)).astype(np.int32)
    pointers[::7] = 0
    got, info = sweep_scan(_survivor, jnp.int32(2), jnp.asarray(pointers), block_length=32,
                           chunk=8, reverse=True)
    want = jax.lax.scan(_survivor, jnp.int32(2), jnp.asarray(pointers), reverse=True)[1]
    assert bool(info.converged)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_recursion_that_never_forgets_falls_back_to_the_scan():
    xs = jnp.arange(100.0)
    got, info = sweep_scan(_counter, jnp.zeros(()), xs, block_length=16, chunk=8,
                           max_sweeps=3)
    assert not bool(info.converged) and int(info.sweeps) == 3
    np.testing.assert_array_equal(np.asarray(got),
                                  np.asarray(jax.lax.scan(_counter, 0.0, xs)[1]))


def test_return_carry_is_the_scans_final_carry():
    """The carry after the last real step (not after the padding of the last block), in
    the converged case (forward and backward), at T = 1, and in the sequential fallback."""
    xs = jnp.asarray(np.random.default_rng(2).normal(size=75))
    cases = [(_contracting, xs, 32, False), (_contracting, xs, 32, True),
             (_contracting, xs[:1], 32, False), (_counter, xs, 16, False)]

    @jax.jit  # one program for the cases
    def run(xs):
        return [(sweep_scan(step, jnp.zeros(()), x, block_length=length, chunk=8,
                            max_sweeps=3, reverse=reverse, return_carry=True),
                 jax.lax.scan(step, jnp.zeros(()), x, reverse=reverse))
                for step, x, length, reverse in cases]

    for (step, *_), ((got, info, carry), (want_carry, want)) in zip(cases, run(xs),
                                                                    strict=True):
        assert bool(info.converged) == (step is _contracting)
        np.testing.assert_array_equal(np.asarray(carry), np.asarray(want_carry))
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_block_length_must_be_a_multiple_of_the_chunk():
    with pytest.raises(ValueError, match="multiple of chunk"):
        sweep_scan(_counter, jnp.zeros(()), jnp.ones(10), block_length=20, chunk=8)
    assert default_block_length(5) == 32


@pytest.mark.parametrize("num_timesteps", [8192, 10**4, 12345, 10**5, 10**5 + 1, 10**6,
                                           10**6 + 1])
def test_default_block_length_aims_at_0_8_T_to_the_0_42_blocks(num_timesteps):
    length = default_block_length(num_timesteps)
    target = num_timesteps / (0.8 * num_timesteps ** 0.42)
    assert length % 32 == 0 and target / 2 <= length <= 2 * target
    divides = [m for m in range(32, int(2 * target) + 1, 32)
               if m >= target / 2 and num_timesteps % m == 0]
    if divides:  # a reshape of the inputs, no padding
        assert num_timesteps % length == 0
        assert abs(np.log(length / target)) == min(abs(np.log(m / target)) for m in divides)
    else:
        assert length == 32 * int(np.ceil(target / 32))


# ---- the HMM filter by sweeps ---------------------------------------------------------

SWEPT = jax.jit(lambda pi, a, ll: hmm._filter(*hmm._prepare_inputs(pi, a, ll), sweeps=True))
SEQUENTIAL = jax.jit(lambda pi, a, ll: hmm._filter(*hmm._prepare_inputs(pi, a, ll),
                                                   sweeps=False))


def _problem(num_timesteps, num_states, seed=0, varying=False):
    rng = np.random.default_rng(seed)
    shape = (num_timesteps - 1, num_states) if varying else (num_states,)
    a = rng.dirichlet(np.ones(num_states), size=shape)
    ll = rng.normal(size=(num_timesteps, num_states)) * 3.0
    return jnp.asarray(rng.dirichlet(np.ones(num_states))), jnp.asarray(a), jnp.asarray(ll)


def _assert_same(got, want, rtol=1e-12):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=1e-13)


@pytest.mark.parametrize("num_states,varying", [(2, False), (3, True), (40, False)])
def test_hmm_filter_by_sweeps_equals_the_sequential_filter(num_states, varying):
    pi, a, ll = _problem(100, num_states, varying=varying)
    # impossible observations (every state -inf) and masked steps (rows of zeros)
    ll = ll.at[17].set(-jnp.inf).at[40:45].set(0.0).at[63, 0].set(-jnp.inf)
    got, want = SWEPT(pi, a, ll), SEQUENTIAL(pi, a, ll)
    assert np.isneginf(float(want.marginal_log_lik))
    _assert_same(got[1:], want[1:])
    pi, a, ll = _problem(100, num_states, seed=1, varying=varying)
    _assert_same(SWEPT(pi, a, ll), SEQUENTIAL(pi, a, ll))


def test_hmm_filter_by_sweeps_on_a_chain_that_never_mixes():
    # the identity transition never forgets its start: the sweeps fall back, still exact
    pi, _, ll = _problem(100, 3, seed=2)
    a = jnp.eye(3)
    _assert_same(SWEPT(pi, a, ll), SEQUENTIAL(pi, a, ll))


def test_hmm_filter_by_sweeps_float32_and_length_one():
    pi, a, ll = (x.astype(jnp.float32) for x in _problem(70, 2, seed=3))
    got, want = SWEPT(pi, a, ll), SEQUENTIAL(pi, a, ll)
    assert got.filtered_probs.dtype == jnp.float32
    _assert_same(got, want, rtol=2e-6)
    pi, a, ll = _problem(1, 3, seed=4, varying=True)
    _assert_same(SWEPT(pi, a, ll), SEQUENTIAL(pi, a, ll))


def test_hmm_filter_by_sweeps_gradient_and_vmap():
    pi, a, ll = _problem(80, 3, seed=5)

    def total(f):
        return jax.jit(jax.grad(lambda a, ll: f(pi, a, ll).marginal_log_lik, argnums=(0, 1)))

    _assert_same(total(SWEPT)(a, ll), total(SEQUENTIAL)(a, ll), rtol=1e-10)
    lls = jnp.stack([ll, ll[::-1]])
    batched = jax.vmap(SWEPT, in_axes=(None, None, 0))(pi, a, lls)
    _assert_same([batched.filtered_probs[1]], [SEQUENTIAL(pi, a, ll[::-1]).filtered_probs])


def test_hmm_filter_by_sweeps_under_vmap_every_argument_batched():
    # per-sequence initial laws and per-step transitions sweep together; per-sequence
    # fixed transitions take the sequential filter (`hmm._swept_one_vmap`)
    rng = np.random.default_rng(6)
    num_sequences, num_timesteps, num_states = 3, 90, 3
    pis = jnp.asarray(rng.dirichlet(np.ones(num_states), size=num_sequences))
    per = jnp.asarray(rng.dirichlet(np.ones(num_states),
                                    size=(num_sequences, num_timesteps - 1, num_states)))
    fixed = per[:, 0]
    lls = jnp.asarray(rng.normal(size=(num_sequences, num_timesteps, num_states)))
    for a in (per, fixed):
        got = jax.vmap(SWEPT)(pis, a, lls)
        want = [SEQUENTIAL(pis[i], a[i], lls[i]) for i in range(num_sequences)]
        _assert_same(got, jax.tree.map(lambda *x: jnp.stack(x), *want))


# ---- the gradient-as-marginals path by sweeps -------------------------------------------

GRAD_SWEPT = jax.jit(hmm._gradient_parts_by_sweeps)
GRAD_SEQUENTIAL = jax.jit(hmm._sequential_gradient_parts)


@pytest.mark.parametrize("num_states,varying", [(2, False), (3, True), (9, False)])
def test_gradient_parts_by_sweeps_equal_the_sequential_reverse_pass(num_states, varying):
    pi, a, ll = _problem(120, num_states, seed=8, varying=varying)
    fixed, per_step = (None, a) if varying else (a, None)
    ll = ll.at[30:34].set(0.0)  # masked steps
    _assert_same(GRAD_SWEPT(pi, fixed, per_step, ll), GRAD_SEQUENTIAL(pi, fixed, per_step, ll),
                 rtol=1e-11)
    # impossible steps (log p = -inf): finite, and the sequential pass's values
    ll = ll.at[0].set(-jnp.inf).at[57].set(-jnp.inf).at[80, 0].set(-jnp.inf)
    got = GRAD_SWEPT(pi, fixed, per_step, ll)
    assert all(not np.isnan(np.asarray(x)).any() for x in got)
    _assert_same(got[1:], GRAD_SEQUENTIAL(pi, fixed, per_step, ll)[1:], rtol=1e-11)


def test_gradient_parts_by_sweeps_vmap_and_second_derivatives():
    pi, a, ll = _problem(90, 3, seed=9)
    lls = jnp.stack([ll, -ll])
    got = jax.vmap(GRAD_SWEPT, in_axes=(None, None, None, 0))(pi, a, None, lls)
    want = jax.vmap(GRAD_SEQUENTIAL, in_axes=(None, None, None, 0))(pi, a, None, lls)
    _assert_same(got, want, rtol=1e-11)
    # derivatives of the marginals (second derivatives of log p) are the sequential path's
    second = [jax.jit(jax.grad(lambda ll, f=f: f(pi, a, None, ll)[3][:, 0].sum()))(ll)
              for f in (hmm._gradient_parts_by_sweeps, hmm._sequential_gradient_parts)]
    _assert_same(second[:1], second[1:], rtol=1e-11)


# ---- the HMM smoother's backward pass by sweeps ------------------------------------------


def _smoother(sweeps):
    return jax.jit(lambda pi, a, ll: hmm._smoother(*hmm._prepare_inputs(pi, a, ll), False,
                                                   sweeps=sweeps))


SMOOTH_SWEPT, SMOOTH_SEQUENTIAL = _smoother(True), _smoother(False)


@pytest.mark.parametrize("num_states,varying", [(6, True), (40, False)])
def test_hmm_smoother_by_sweeps_equals_the_sequential_smoother(num_states, varying):
    # 6 states: the maxima and products as scalar slices; 40: as reductions and `dot`
    pi, a, ll = _problem(100, num_states, seed=6, varying=varying)
    _assert_same(SMOOTH_SWEPT(pi, a, ll), SMOOTH_SEQUENTIAL(pi, a, ll))
    # masked steps (rows of zeros, the last included) and a state impossible at some steps
    ll = ll.at[40:45].set(0.0).at[99].set(0.0).at[63, 0].set(-jnp.inf).at[7, 1].set(-jnp.inf)
    _assert_same(SMOOTH_SWEPT(pi, a, ll), SMOOTH_SEQUENTIAL(pi, a, ll))


def test_hmm_smoother_by_sweeps_impossible_rows_and_a_chain_that_never_mixes():
    pi, a, ll = _problem(100, 40, seed=7)  # the shapes compiled above
    # every state impossible at step 17: the sequential result (NaN before it) is kept
    ll_bad = ll.at[17].set(-jnp.inf)
    got, want = SMOOTH_SWEPT(pi, a, ll_bad), SMOOTH_SEQUENTIAL(pi, a, ll_bad)
    assert np.isneginf(float(want.marginal_log_lik))
    _assert_same(got, want)
    # A = I never forgets its start (backward either): the sweeps fall back, still exact
    lik = jnp.exp(ll[1:] - ll[1:].max(1, keepdims=True))
    _, info = jax.jit(lambda lik: sweep_scan(hmm._smoother_sweep_step(jnp.eye(40), 40),
                                             jnp.ones(40), (lik, None), reverse=True))(lik)
    assert not bool(info.converged)
    _assert_same(SMOOTH_SWEPT(pi, jnp.eye(40), ll), SMOOTH_SEQUENTIAL(pi, jnp.eye(40), ll))


def test_hmm_smoother_by_sweeps_float32_and_length_one():
    pi, a, ll = (x.astype(jnp.float32) for x in _problem(70, 6, seed=8))
    got, want = SMOOTH_SWEPT(pi, a, ll), SMOOTH_SEQUENTIAL(pi, a, ll)
    assert got.smoothed_probs.dtype == jnp.float32
    _assert_same(got, want, rtol=2e-5)
    pi, a, ll = _problem(1, 3, seed=9, varying=True)
    _assert_same(SMOOTH_SWEPT(pi, a, ll), SMOOTH_SEQUENTIAL(pi, a, ll))


def test_hmm_smoother_by_sweeps_gradient_vmap_and_default():
    # the default at 6 states from SWEEP_BACKWARD_MIN_STEPS: both passes by sweeps on CPU
    pi, a, ll = _problem(hmm.SWEEP_BACKWARD_MIN_STEPS, 6, seed=10)
    default = jax.jit(lambda pi, a, ll: hmm.hmm_smoother(pi, a, ll, sum_transitions=False))

    def grad(run):
        return jax.jit(jax.grad(lambda a, ll: jnp.sum(run(pi, a, ll).smoothed_probs ** 2),
                                argnums=(0, 1)))

    _assert_same(grad(default)(a, ll), grad(SMOOTH_SEQUENTIAL)(a, ll), rtol=1e-10)
    # under vmap both passes run sequentially (custom_vmap): equal to the unbatched ones
    lls = jnp.stack([ll, ll[::-1]])
    batched = jax.jit(jax.vmap(default, in_axes=(None, None, 0)))(pi, a, lls)
    _assert_same(jax.tree.map(lambda x: x[0], batched), SMOOTH_SEQUENTIAL(pi, a, ll))
    _assert_same([batched.smoothed_probs[1]], [SMOOTH_SEQUENTIAL(pi, a, ll[::-1]).smoothed_probs])
    # a batch of one (the public models' calls) runs the sweeps
    one = jax.jit(jax.vmap(default, in_axes=(None, None, 0)))(pi, a, ll[None])
    _assert_same(jax.tree.map(lambda x: x[0], one), SMOOTH_SEQUENTIAL(pi, a, ll))
    # the rule on CPU: sweeps at 6-7 states from SWEEP_BACKWARD_MIN_STEPS, else not
    min_steps = hmm.SWEEP_BACKWARD_MIN_STEPS
    assert hmm._use_backward_sweeps(None, ll) == (jax.default_backend() == "cpu")
    assert not hmm._use_backward_sweeps(None, jnp.zeros((min_steps - 1, 7)))
    any_states = hmm.SWEEP_BACKWARD_ANY_STATES_MIN_STEPS
    assert not hmm._use_backward_sweeps(None, jnp.zeros((any_states - 1, 2)))
    assert not hmm._use_backward_sweeps(None, jnp.zeros((any_states - 1, 8)))
    assert not hmm._use_backward_sweeps(True, jnp.zeros((1, 6)))
    # float32: up to 4 states from the filter's SWEEP_MIN_STEPS, not at 6-7 states
    f32 = jnp.zeros((hmm.SWEEP_MIN_STEPS, 2), jnp.float32)
    assert hmm._use_backward_sweeps(None, f32) == (jax.default_backend() == "cpu")
    assert not hmm._use_backward_sweeps(None, jnp.zeros((any_states - 1, 6), jnp.float32))
    # from SWEEP_BACKWARD_ANY_STATES_MIN_STEPS: any number of states (more than one), any dtype
    for shape, dtype in (((any_states, 2), jnp.float64), ((any_states, 8), jnp.float32)):
        assert hmm._use_backward_sweeps(None, jnp.zeros(shape, dtype)) == (
            jax.default_backend() == "cpu")
    assert not hmm._use_backward_sweeps(None, jnp.zeros((any_states, 1)))
