"""Public calls without eager tax (issue 13, point 2).

A public call (`ss.log_prob`, `ss.filter`, ``model.smoother``, ...) on arrays passed again
must compile nothing, dispatch one compiled program and transfer nothing to the device,
while a NumPy array changed in place since is checked again (same error as on a first
call, or the new result). Counts, not timings: programs are counted by routing every
``jax.jit`` call through JAX's Python dispatch path (no C++ fast path) and counting it.
"""

from __future__ import annotations

import contextlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.core import memo, recurrence

pjit = pytest.importorskip("jax._src.pjit")

_COMPILES = [0]


def _on_duration(event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)


@contextlib.contextmanager
def counting(monkeypatch):
    """Yield ``counts()`` -> (programs dispatched, backend compiles) so far."""
    if not hasattr(pjit, "_get_fastpath_data") or not hasattr(pjit, "_run_python_pjit"):
        pytest.skip("this JAX has no Python jit dispatch hooks to count with")
    runs = [0]
    original = pjit._run_python_pjit

    def run(*args, **kwargs):
        runs[0] += 1
        return original(*args, **kwargs)

    # no C++ fast path: every jitted call (eager ops included) goes through Python. Calls
    # whose fast path was stored before (same function, static arguments and shapes earlier
    # in the process) would escape the count: callers use lengths no other test uses
    monkeypatch.setattr(pjit, "_get_fastpath_data", lambda *a, **k: None)
    monkeypatch.setattr(pjit, "_run_python_pjit", run)
    yield lambda: (runs[0], _COMPILES[0])


@pytest.fixture(autouse=True)
def _exact_lengths():
    previous = ss.set_length_buckets("never")  # padded lengths add a cut (documented)
    yield
    ss.set_length_buckets(**previous)


def _series(kind, T, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "real":
        return np.cumsum(rng.normal(size=T)) * 0.2 + rng.normal(size=T)
    if kind == "real2":
        return np.cumsum(rng.normal(size=(T, 2)), axis=0) * 0.2 + rng.normal(size=(T, 2))
    if kind == "count":
        return rng.poisson(3.0, size=T)
    if kind == "category":
        return rng.integers(0, 3, size=T)
    return (rng.random((T, 2)) < 0.4).astype(int)  # binary


FAMILIES = [
    ("ar", lambda: ss.AR(order=2), "real", False),
    ("poisson_hmm", lambda: ss.PoissonHMM(num_states=2), "count", False),
    ("gaussian_hmm", lambda: ss.GaussianHMM(num_states=2, emission_dim=2), "real2", False),
    ("categorical_hmm", lambda: ss.CategoricalHMM(num_states=2, num_classes=3), "category",
     False),
    ("bernoulli_hmm", lambda: ss.BernoulliHMM(num_states=2, emission_dim=2), "binary", False),
    ("ar_hmm", lambda: ss.LinearAutoregressiveHMM(num_states=2, emission_dim=2), "real2",
     False),
    ("input_hmm", lambda: ss.PoissonHMM(num_states=2, input_dim=1), "count", True),
    ("lgssm", lambda: ss.LinearGaussianSSM(state_dim=2, emission_dim=None), "real", False),
    ("local_level", lambda: ss.LocalLevel(), "real", False),
    ("structural", lambda: ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(period=4))),
     "real", False),
    ("ms_ar", lambda: ss.MarkovSwitchingAR(num_regimes=2, order=1), "real", False),
    ("elman", lambda: ss.ElmanRNN(hidden_dim=3), "real", False),
    ("esn", lambda: ss.ElmanRNN(hidden_dim=3, echo_state=True), "real", False),
    ("gru", lambda: ss.GRU(hidden_dim=3), "real", False),
    ("lstm", lambda: ss.LSTM(hidden_dim=3), "real", False),
    ("mamba", lambda: ss.Mamba(hidden_dim=4, state_dim=2), "real", False),
    ("lru", lambda: ss.LRU(hidden_dim=4, state_dim=2), "real", False),
]


def _case(name, T=23):
    make, kind, with_inputs = next((m, k, w) for n, m, k, w in FAMILIES if n == name)
    model = make()
    y = _series(kind, T)
    u = np.random.default_rng(5).normal(size=(T, 1)) if with_inputs else None
    key = jax.random.key(0)
    params = (model.initialize(y, key=key, inputs=u) if with_inputs
              else model.initialize(y, key=key))
    return model, params, y, u


def _calls(model, params, u, every=False):
    """(name, public call of y): ``log_prob`` and ``smoother``, and with ``every`` also
    ``filter`` and ``filter_states``."""
    kw = {} if u is None else {"inputs": u}
    calls = [("log_prob", lambda y: ss.log_prob(model, params, y, **kw))]
    if every:
        calls.append(("filter", lambda y: ss.filter(model, params, y, **kw)))
    if hasattr(model, "smoother"):
        calls.append(("smoother", lambda y: model.smoother(params, y, **kw)))
        if every:
            calls.append(("filter_states", lambda y: model.filter_states(params, y, **kw)))
            viterbi = getattr(model, "most_likely_states", None) or model.most_likely_regimes
            calls.append(("viterbi", lambda y: viterbi(params, y, **kw)))
    return calls


def _assert_tree_equal(a, b, rtol=1e-12):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, z in zip(la, lb, strict=True):
        assert np.shape(x) == np.shape(z)
        np.testing.assert_allclose(np.asarray(x), np.asarray(z), rtol=rtol, atol=1e-12)


#: families whose smoother is also compared with its jitted core (the state space models'
#: smoother programs compile slowly; their smoothers' repeats are still counted)
SMOOTHER_CORE = {"poisson_hmm", "gaussian_hmm", "categorical_hmm", "bernoulli_hmm", "ar_hmm",
                 "input_hmm", "local_level", "ms_ar"}


def _check_repeats(name, T, monkeypatch, every=False, core=True):
    model, params, y, u = _case(name, T=T)
    y_dev = jax.device_put(y.astype(np.int32) if y.dtype.kind in "iu" else y)
    with counting(monkeypatch) as counts:
        for what, call in _calls(model, params, u, every):
            first = call(y)
            if core and (what == "log_prob" or name in SMOOTHER_CORE):
                jitted = jax.jit(lambda p, yy, what=what: dict(_calls(model, p, u))[what](yy))
                _assert_tree_equal(first, jitted(params, y_dev))
            before = counts()
            with jax.transfer_guard_host_to_device("disallow_explicit"):
                again = call(y)
                jax.block_until_ready(again)
            programs, compiles = np.subtract(counts(), before)
            _assert_tree_equal(first, again, rtol=0)
            assert compiles == 0, (name, what)
            # 0 would mean a fast path stored before this test: a test problem
            assert programs == 1, (name, what, programs)


@pytest.mark.parametrize("name", [f[0] for f in FAMILIES])
def test_public_equals_jitted_core_and_repeats_cost_one_program(name, monkeypatch):
    """Every family: ``log_prob`` (and the ``smoother`` of `SMOOTHER_CORE`) equal one
    ``jax.jit`` of the same call over device arrays, and a repeat with the same NumPy
    arrays compiles nothing, dispatches one program and transfers nothing to the device."""
    index = [f[0] for f in FAMILIES].index(name)
    _check_repeats(name, 59 + 2 * index, monkeypatch)  # lengths seen nowhere else


@pytest.mark.parametrize("name", ["ar", "poisson_hmm", "lgssm", "gru"])
def test_log_prob_program_hands_back_the_totals_alone(name):
    """``log_prob`` runs a program of the totals alone (no per-step output stacked in its
    loop, one buffer handed back: `recurrence._filter_call`'s ``totals``), equal to
    ``filter``'s total from the program ``filter`` runs, for one series and a batch."""
    model, params, y, u = _case(name, T=31)
    kw = {} if u is None else {"inputs": u}
    for data in (y, np.stack([y, y[::-1]])):
        recurrence._REPEATS.clear()
        total = ss.log_prob(model, params, data, **kw)
        run = next(e.run for k, e in recurrence._REPEATS.items() if k[0] == "log_prob")
        raw = run.program.jitted(*run.arrays)
        leaves = raw.leaves if isinstance(raw, recurrence._Stripped) else jax.tree.leaves(raw)
        assert len(leaves) == 1 and leaves[0].shape == data.shape[:-1 if y.ndim == 1 else -2]
        np.testing.assert_allclose(total, ss.filter(model, params, data, **kw).log_prob,
                                   rtol=1e-12)
        np.testing.assert_array_equal(total, leaves[0])


@pytest.mark.parametrize("name", ["poisson_hmm", "ms_ar"])
def test_filter_filter_states_and_viterbi_repeat_as_one_program(name, monkeypatch):
    index = [f[0] for f in FAMILIES].index(name)
    _check_repeats(name, 101 + 2 * index, monkeypatch, every=True, core=False)


def test_batch_with_mask_matches_per_sequence_calls():
    """A batch with a mask (no fill-in of mask or inputs) and its batch shape restored in
    the compiled call: equal to the sequences taken one at a time."""
    model = ss.PoissonHMM(num_states=2)
    y = np.random.default_rng(3).poisson(2.0, size=(2, 3, 17))
    mask = np.random.default_rng(4).random((2, 3, 17)) > 0.2
    params = model.initialize(y.reshape(-1, 17), key=jax.random.key(1))
    lp = ss.log_prob(model, params, y, mask=mask)
    post = model.smoother(params, y, mask=mask)
    assert lp.shape == (2, 3) and post.smoothed_probs.shape == (2, 3, 17, 2)
    for i in range(2):
        for j in range(3):
            one = model.smoother(params, y[i, j], mask=mask[i, j])
            np.testing.assert_allclose(lp[i, j], ss.log_prob(model, params, y[i, j],
                                                             mask=mask[i, j]), rtol=1e-12)
            _assert_tree_equal(jax.tree.map(lambda a, i=i, j=j: a[i, j], post), one)


@pytest.mark.parametrize(("name", "masked"), [("ar", False), ("lgssm", True),
                                             ("poisson_hmm", True)])
def test_one_sequence_equals_its_row_in_a_batch_of_two(name, masked):
    """One sequence is a flat batch of one, which `recurrence.vmap_or_one` runs unbatched;
    in a batch of two it is vmapped: the same values (1e-12) and gradients (the LGSSM's
    gradient on one sequence is checked in `test_kalman_small_kernels.py`). AR without a
    mask takes the complete-data fast path, the one-series LGSSM with missing steps its
    own filter (`masked_data_filter`) and the Kalman filter's posterior, the PoissonHMM
    with missing steps the per-step scan, the HMM smoother and Viterbi."""
    model, params, y, _ = _case(name, T=13)
    other = _series("count" if name == "poisson_hmm" else "real", 13, seed=9)
    ys = np.stack([y, other])
    mask = np.random.default_rng(8).random((2, 13)) > 0.3 if masked else np.ones((2, 13), bool)
    mask[:, 0] = True

    def calls(yy, mm):
        out = {"filter": ss.filter(model, params, yy, mask=mm)}
        if name != "lgssm":  # its gradient on one sequence: test_kalman_small_kernels.py
            out["grad"] = jax.grad(lambda p: jnp.sum(ss.log_prob(model, p, yy, mask=mm)))(
                params)
        if hasattr(model, "smoother"):  # the Kalman smoother's program compiles slowly
            post = model.filter_states if name == "lgssm" else model.smoother
            out["posterior"] = post(params, yy, mask=mm)
        if hasattr(model, "most_likely_states"):
            out["viterbi"] = model.most_likely_states(params, yy, mask=mm)
        return out

    one, both = calls(y, mask[0]), calls(ys, mask)
    if "grad" in both:  # the gradient of the batch's total is the sum of the sequences'
        both["grad"] = jax.tree.map(jnp.subtract, both["grad"], calls(other, mask[1])["grad"])
    for what in one:
        row = both[what] if what == "grad" else jax.tree.map(lambda a: a[0], both[what])
        _assert_tree_equal(one[what], row, rtol=1e-12)
    np.testing.assert_allclose(ss.log_prob(model, params, y, mask=mask[0]),
                               ss.log_prob(model, params, ys, mask=mask)[0], rtol=1e-12)


def test_zero_size_outputs_are_made_outside_the_program(monkeypatch):
    """The final carry of a linear Gaussian model without inputs has zero-size leaves; the
    public program does not hand them back (`recurrence._strip_empty`: each output is a
    thunk of XLA:CPU's entry computation) and ``ss.filter`` puts them back: the same tree,
    shapes and dtypes as `recurrence._filter_flat`'s (values: the other tests), and a repeat
    is still one program, no compile and no transfer."""
    model, params, y, _ = _case("lgssm", T=11)
    with counting(monkeypatch) as counts:  # before the first call (see `counting`)
        got = ss.filter(model, params, y)
        before = counts()
        with jax.transfer_guard_host_to_device("disallow_explicit"):
            again = jax.block_until_ready(ss.filter(model, params, y))
        assert tuple(np.subtract(counts(), before)) == (1, 0)
    _assert_tree_equal(got, again, rtol=0)
    *_, final = jax.eval_shape(partial(recurrence._filter_flat, model, complete=True), params,
                               y[None], jnp.ones((1, 11), bool), jnp.zeros((1, 11, 0)))
    assert any(0 in a.shape for a in jax.tree.leaves(final))
    assert jax.tree.structure(got.final_carry) == jax.tree.structure(final)
    for g, w in zip(jax.tree.leaves(got.final_carry), jax.tree.leaves(final), strict=True):
        assert g.shape == w.shape[1:] and g.dtype == w.dtype
    final = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), final)
    stripped = recurrence._strip_empty(final, layouts := {})
    assert isinstance(stripped, recurrence._Stripped)
    assert not any(0 in a.shape for a in stripped.leaves)
    assert jax.tree.structure(recurrence._unstrip(stripped, layouts)) == jax.tree.structure(
        final)


@pytest.mark.parametrize(("name", "masked", "batch"), [("ar", False, True),
                                                      ("ar_hmm", False, False),
                                                      ("gaussian_hmm", True, False)])
def test_constant_outputs_are_made_outside_the_program(name, masked, batch):
    """Final-carry leaves computed from literals alone (`statseq.core.constant_outputs`:
    an HMM's ``started`` flag, a lag window's step count, a zero covariance) are not
    outputs of the public program; ``ss.filter`` and ``ss.log_prob`` put back the very
    values, dtypes and tree of `recurrence._filter_flat` (bitwise), with a mask (passed to
    the program) or without (built inside), for one sequence and a batch of 2 x 2 (the
    linear Gaussian model's constants: `test_zero_size_outputs_are_made_outside_the_program`
    and the every-family tests)."""
    model, params, y, _ = _case(name, T=7)
    base_shape = y.shape
    if batch:
        y = np.stack([np.stack([y, y[::-1]]), np.stack([y[::-1] * 0.5, y])])
    batch_shape = y.shape[:y.ndim - len(base_shape)]
    mask = (np.broadcast_to(np.arange(7) % 3 != 1, batch_shape + (7,)).copy() if masked
            else None)
    got = ss.filter(model, params, y, mask=mask)
    model_sized, data = recurrence.checked_data(model, params, y, mask)
    want = recurrence._filter_flat(model_sized, params, data.y, data.mask, data.inputs,
                                   complete=data.complete)
    want_final = jax.tree.map(lambda a: a.reshape(batch_shape + a.shape[1:]), want[3])
    assert jax.tree.structure(got.final_carry) == jax.tree.structure(want_final)
    for g, w in zip(jax.tree.leaves(got.final_carry), jax.tree.leaves(want_final), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    np.testing.assert_array_equal(np.asarray(got.log_prob), np.asarray(want[0]).reshape(
        batch_shape))
    np.testing.assert_array_equal(np.asarray(ss.log_prob(model, params, y, mask=mask)),
                                  np.asarray(got.log_prob))
    # the program itself hands back fewer leaves than the result has
    run = recurrence._filter_call(model_sized, params, data)
    raw = run.program.jitted(*run.arrays)
    assert isinstance(raw, recurrence._Stripped)
    assert len(raw.leaves) < len(jax.tree.leaves(got))


def test_constant_leaves_of_a_conflicting_layout_are_kept():
    """Two traces of one program with the same kept layout but other constant values: the
    second strips nothing (its constants stay outputs), so neither is restored wrongly;
    weakly typed constants and floating arithmetic are never folded; a scan's final carry
    is constant only where every step sets it and there is a step."""
    from statseq.core.constant_outputs import constant_outputs

    layouts: dict = {}
    x = jnp.ones(3)
    first = recurrence._strip_empty((x, jnp.int32(1)), layouts, {1: np.int32(1)})
    assert isinstance(first, recurrence._Stripped)
    assert recurrence._unstrip(first, layouts)[1] == 1
    second = recurrence._strip_empty((x, jnp.int32(2)), layouts, {1: np.int32(2)})
    assert not isinstance(second, recurrence._Stripped)
    assert recurrence._unstrip(first, layouts)[1] == 1
    weak = constant_outputs(jax.make_jaxpr(lambda a: (a, jnp.minimum(3, 4), 1.0 * 2))(x))
    assert weak == {}
    mixed = constant_outputs(jax.make_jaxpr(
        lambda a: (a + 1.0, jnp.zeros((2,), a.dtype) + 1.0,  # float arithmetic: not folded
                   jnp.arange(3, dtype=jnp.int32) * 2,        # integer arithmetic: folded
                   jnp.where(jnp.ones((), bool), jnp.zeros(2, bool), True)))(x))
    assert sorted(mixed) == [2, 3]
    np.testing.assert_array_equal(mixed[2], [0, 2, 4])
    assert mixed[3].dtype == bool and not mixed[3].any()
    transposed = constant_outputs(jax.make_jaxpr(lambda a: (a, jax.lax.reshape(
        jnp.arange(6, dtype=jnp.int32).reshape(2, 3), (3, 2), dimensions=(1, 0))))(x))
    assert transposed == {}  # a reshape with a transposition: not evaluated

    def scanned(xs):  # a flag every step sets: constant after one step or more, not zero
        return jax.lax.scan(lambda c, x: ((c[0] + x, jnp.ones((), bool)), x),
                            (jnp.zeros(()), jnp.zeros((), bool)), xs)
    assert {i: v.tolist() for i, v in constant_outputs(jax.make_jaxpr(scanned)(x)).items()
            } == {1: True}
    assert constant_outputs(jax.make_jaxpr(scanned)(jnp.ones(0))) == {}


@pytest.mark.parametrize("name", ["ar", "poisson_hmm", "local_level", "ms_ar", "gru"])
def test_numpy_changed_in_place_is_checked_again(name):
    """A NaN written into y after a first call raises the error of a first call; a valid
    change gives the new result, never the remembered one."""
    model, params, y, u = _case(name)
    if y.dtype.kind in "iu":
        y = y.astype(float)
    calls = _calls(model, params, u)
    for _, call in calls:
        call(y)
    fresh = y.copy()
    fresh[5] = np.nan
    for what, call in calls:
        with pytest.raises(ValueError) as first_time:
            call(fresh)
        y[5] = np.nan  # the remembered array, changed in place
        with pytest.raises(ValueError) as again:
            call(y)
        assert str(again.value) == str(first_time.value), what
        y[5] = 1.0
    changed = y.copy()
    for what, call in calls:
        _assert_tree_equal(call(y), call(changed))  # a new array object: no memo hit
        y[7] += 1.0
        changed[7] += 1.0
        _assert_tree_equal(call(y), call(changed))  # changed in place: checked again
        assert what


def test_numpy_params_changed_in_place_are_checked_again():
    model = ss.AR(order=1)
    p = model.default_params()
    p = p._replace(cov=np.asarray(p.cov, float).copy())
    y = _series("real", 20)
    ss.log_prob(model, p, y)
    p.cov[...] = -1.0  # no longer positive definite
    with pytest.raises(ValueError, match="cov"):
        ss.log_prob(model, p, y)
    p.cov[...] = 4.0
    expected = ss.log_prob(model, p._replace(cov=jnp.asarray(p.cov)), y)
    np.testing.assert_allclose(ss.log_prob(model, p, y), expected, rtol=1e-12)


def test_large_numpy_arrays_are_not_remembered(monkeypatch):
    """Above `memo.MAX_SNAPSHOT_BYTES` no snapshot is kept: checked on every call."""
    monkeypatch.setattr(memo, "MAX_SNAPSHOT_BYTES", 64)
    model = ss.AR(order=1)
    p = model.default_params()
    y = _series("real", 40)  # 320 bytes
    calls = []
    original = recurrence.prepare_sized
    monkeypatch.setattr(recurrence, "prepare_sized",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    ss.log_prob(model, p, y)
    ss.log_prob(model, p, y)
    assert len(calls) == 2


def test_bucket_policy_change_is_not_served_from_memory():
    """The remembered preparation depends on the length-bucket policy."""
    model = ss.AR(order=1)
    p = model.default_params()
    y = _series("real", 29)
    res = ss.filter(model, p, y)
    previous = ss.set_length_buckets("always")
    try:
        data = recurrence.checked_data(model, p, y)[1]
        assert data.num_valid == 29 and data.y.shape[1] > 29  # padded now
        padded = ss.filter(model, p, y)
    finally:
        ss.set_length_buckets(**previous)
    _assert_tree_equal(res.log_probs, padded.log_probs)


def _poisson_hmm(transitions, rates=(1e-3, 1e6)):
    from statseq.models.hmm.poisson import PoissonEmissions

    model = ss.PoissonHMM(num_states=2)
    return model, model.assemble_params(PoissonEmissions(jnp.asarray(rates)),
                                        transitions=jnp.asarray(transitions),
                                        initial_probs=jnp.array([0.5, 0.5]))


def test_probability_zero_check_is_skipped_only_where_no_data_can_have_it():
    """The HMM smoother reads the log-likelihood back (to refuse data of probability zero)
    unless `_surely_possible`: finite emissions and initial/transition probabilities above
    a floor. Counts that each state makes astronomically unlikely (rates 1e-3 and 1e6,
    log-likelihood gaps of ~1e7 between the states) score finite with transitions of
    1e-300, and -inf with transitions of exactly 0 (the scaled normalizer of the filter
    underflows), which the kept check then refuses, on a first call and on a repeat."""
    from statseq.models.hmm.base import _surely_possible
    from statseq.models.hmm.categorical import CategoricalEmissions
    from statseq.models.hmm.poisson import PoissonEmissions

    y = np.array([0, 10**6, 0, 10**6, 10**6, 0])
    tiny = 1e-300
    model, params = _poisson_hmm([[1 - tiny, tiny], [tiny, 1 - tiny]])
    assert _surely_possible(model, params)
    assert np.isfinite(float(ss.log_prob(model, params, y)))
    post = model.smoother(params, y)
    assert np.all(np.isfinite(np.asarray(post.smoothed_probs)))
    assert np.isfinite(float(model.most_likely_states(params, y, return_log_prob=True)[1]))

    model, params = _poisson_hmm(np.eye(2))
    assert not _surely_possible(model, params)
    assert float(ss.log_prob(model, params, y)) == -np.inf
    for _ in range(2):  # the repeat is remembered and still checks
        with pytest.raises(ValueError, match="probability zero"):
            model.smoother(params, y)
    # (the Viterbi path, in log space, is finite there: the data are possible)
    assert np.isfinite(float(model.most_likely_states(params, y, return_log_prob=True)[1]))
    assert not _surely_possible(*_poisson_hmm([[1 - tiny, tiny], [tiny, 1 - tiny]],
                                              rates=(1.0, 1e200)))  # above sqrt(max)
    cat = ss.CategoricalHMM(num_states=2, num_classes=2)
    for probs, possible in (([[0.5, 0.5], [0.9, 0.1]], True),
                            ([[1.0, 0.0], [0.9, 0.1]], False)):
        p = cat.assemble_params(CategoricalEmissions(jnp.array(probs)))
        assert _surely_possible(cat, p) == possible
    with_inputs = ss.PoissonHMM(num_states=2, input_dim=1)  # softmax transitions can
    p = with_inputs.assemble_params(PoissonEmissions(jnp.array([1.0, 2.0])))  # underflow
    assert not _surely_possible(with_inputs, p)


def test_input_driven_transitions_skip_the_check_only_for_bounded_inputs(monkeypatch):
    """Input-driven transitions ``softmax(b_i + W_i u_t)``: where the inputs bound every
    probability above the floor (`base._softmax_surely_above`) the smoother and Viterbi
    skip the probability-zero read-back, with the same results as the checked path; large
    inputs that do underflow a transition to 0 are not proven and keep the check; NaN
    weights are never proven."""
    from statseq.models.hmm import base

    model, params, y, u = _case("input_hmm", T=9)
    data = recurrence.checked_data(model, params, y, inputs=u, sized=False)[1]
    assert base._surely_possible(model, params, data)
    assert not base._surely_possible(model, params)  # no inputs seen: not proven
    checks = []
    original = base._check_possible
    monkeypatch.setattr(base, "_check_possible",
                        lambda lp, method: checks.append(method) or original(lp, method))
    post = model.smoother(params, y, inputs=u)
    states = model.most_likely_states(params, y, inputs=u, return_log_prob=True)
    assert checks == []  # no read-back
    monkeypatch.setattr(base, "_surely_possible", lambda *a: False)  # the checked path
    recurrence._REPEATS.clear()
    _assert_tree_equal(post, model.smoother(params, y, inputs=u), rtol=0)
    _assert_tree_equal(states, model.most_likely_states(params, y, inputs=u,
                                                        return_log_prob=True), rtol=0)
    monkeypatch.undo()

    reg = params.transitions
    strong = params._replace(transitions=reg._replace(weights=jnp.full_like(reg.weights, 5.0)
                                                      * jnp.array([1.0, -1.0])[None, :, None]))
    big = u * 0 + 100.0  # logits spread 2 * 5 * 100 = 1000: every row underflows somewhere
    probs = np.asarray(model.transition_matrices(strong, big))
    assert np.any(probs == 0)
    assert not base._surely_possible(model, strong, recurrence.checked_data(
        model, strong, y, inputs=big, sized=False)[1])
    assert base._softmax_surely_above(reg, u, np.finfo(np.float64).tiny * 1e6)
    assert not base._softmax_surely_above(reg._replace(weights=reg.weights * np.nan), u, 0.0)


@pytest.mark.parametrize("name", ["gaussian_hmm", "ar_hmm"])
def test_gaussian_emissions_skip_the_check_only_for_bounded_data(name, monkeypatch):
    """Gaussian emission densities are finite unless a standardized residual overflows:
    the smoother and Viterbi skip the probability-zero read-back for data whose bound
    (`HMMBase.data_surely_finite`, largest |y| and |mean|, smallest covariance eigenvalue)
    proves it, with the same result; data of 1e200 overflow to -inf in every state, so
    there the check stays and refuses them (first call and repeat), as do masked entries
    and float32 bounds."""
    from statseq.inference.gaussian import mvn_log_prob_surely_finite
    from statseq.models.hmm import base

    model, params, y, _ = _case(name, T=9)
    data = recurrence.checked_data(model, params, y, sized=False)[1]
    assert base._surely_possible(model, params, data)
    assert not base._surely_possible(model, params)  # no data: not proven
    checks = []
    original = base._check_possible
    monkeypatch.setattr(base, "_check_possible",
                        lambda lp, method: checks.append(method) or original(lp, method))
    post = model.smoother(params, y)
    states = model.most_likely_states(params, y, return_log_prob=True)
    assert checks == []  # no read-back
    monkeypatch.setattr(base, "_surely_possible", lambda *a: False)  # the checked path
    recurrence._REPEATS.clear()
    _assert_tree_equal(post, model.smoother(params, y), rtol=0)
    _assert_tree_equal(states, model.most_likely_states(params, y, return_log_prob=True),
                       rtol=0)
    monkeypatch.undo()

    # covariances of 1e-6 and an entry of 1e153 (below the data check's sqrt(max)):
    # z^2 ~ 1e312 overflows in every state, log-likelihood -inf
    params = params._replace(emissions=params.emissions._replace(
        covs=params.emissions.covs * 1e-6))
    huge = y.copy()
    huge[4] = 1e153
    assert base._surely_possible(model, params, recurrence.checked_data(
        model, params, y, sized=False)[1])
    data = recurrence.checked_data(model, params, huge, sized=False)[1]
    assert not base._surely_possible(model, params, data)
    assert float(ss.log_prob(model, params, huge)) == -np.inf
    for _ in range(2):
        with pytest.raises(ValueError, match="probability zero"):
            model.smoother(params, huge)
    if name == "gaussian_hmm":  # (the AR-HMM posteriors need observed lags)
        mask = np.ones(huge.shape, bool)
        mask[4] = False  # the huge entry missing: not proven (conservative), and finite
        assert np.isfinite(float(model.smoother(params, huge, mask=mask).marginal_log_lik))

    covs = np.asarray(model.state_covariances(params.emissions))
    assert mvn_log_prob_surely_finite(covs, 1e3, np.float32)
    assert not mvn_log_prob_surely_finite(covs, 1e19, np.float32)  # z^2 > float32 max
    assert mvn_log_prob_surely_finite(covs, 1e19, np.float64)
    assert not mvn_log_prob_surely_finite(np.diag([1.0, 1e-16])[None], 1.0, np.float64)
    assert not mvn_log_prob_surely_finite(np.diag([1.0, -1.0])[None], 1.0, np.float64)


def test_repeat_skips_the_checks_and_dicts_are_not_remembered():
    """A repeat runs no check; containers that can change in place (a dict) are never
    remembered."""
    model = ss.AR(order=1)
    p = model.default_params()
    y = _series("real", 31)
    as_dict = {"p": p}
    calls = []
    original = recurrence.checked_data
    try:
        recurrence.checked_data = lambda *a, **k: calls.append(1) or original(*a, **k)
        first = ss.log_prob(model, p, y)
        ss.log_prob(model, p, y)
        assert len(calls) == 1  # remembered
        assert recurrence._immutable_leaves(as_dict, []) is False
    finally:
        recurrence.checked_data = original
    np.testing.assert_allclose(first, ss.filter(model, p, y).log_prob, rtol=1e-12)


def test_zero_size_outputs_put_back_under_a_trace_are_concrete():
    """`_unstrip` called while a program is traced (a public call inside another
    transformation) caches a concrete zero-size array, not a tracer that would leak into
    every later call (it did: `UnexpectedTracerError` in a DeepState forecast)."""
    from statseq.core import recurrence as rec

    rec._EMPTY.pop(((1, 0), np.dtype("float32")), None)
    layouts: dict = {}

    def traced(x):
        out = rec._strip_empty((x, jnp.zeros((1, 0), jnp.float32)), layouts)
        return rec._unstrip(out, layouts)[0] * 2.0

    np.testing.assert_array_equal(np.asarray(jax.jit(traced)(jnp.ones(3))), 2.0)
    cached = rec._EMPTY[((1, 0), np.dtype("float32"))]
    assert np.asarray(cached).shape == (1, 0)  # a leaked tracer cannot be read
