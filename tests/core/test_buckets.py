"""Length buckets (statseq.core.buckets): padded results equal unpadded ones, bounded programs.

Every comparison runs the same call twice, with ``set_length_buckets("never")`` (one
program per length: the reference) and ``"always"`` (the time axis padded to its bucket
with masked, frozen steps), and asserts float64 agreement of every real step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.core import buckets

TOL = dict(rtol=1e-11, atol=1e-11)
T = 13  # bucket 14: one padded step; T = 37 (bucket 40) pads three


@pytest.fixture(autouse=True)
def _restore_policy():
    previous = ss.set_length_buckets("auto")
    yield
    ss.set_length_buckets(**previous)


def _both(fn):
    """``fn()`` unpadded and padded (the second must really be padded)."""
    ss.set_length_buckets("never")
    ref = fn()
    ss.set_length_buckets("always")
    out = fn()
    return ref, out


def _assert_tree_close(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert np.shape(x) == np.shape(y)
        np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float), **TOL)


# ---- the ladder and the policy ---------------------------------------------------------------

def test_ladder_values_and_overhead():
    lengths = np.arange(1, 20001)
    b = np.array([buckets.bucket_length(int(t)) for t in lengths])
    assert np.all(b >= lengths) and np.all(np.diff(b) >= 0)
    assert np.all(b[:8] == lengths[:8])
    assert np.max(b / lengths) <= 1.25  # at most 25% padding
    assert len(np.unique(b[:5000])) == 45  # 1..8, four per doubling from 10 to 4096, then 5120
    # every bucket is a fixed point, and the ladder is 2^k * {1, 1.25, 1.5, 1.75} above 8
    assert all(buckets.bucket_length(int(v)) == v for v in np.unique(b))
    assert sorted(set(np.unique(b)) & set(range(64, 129))) == [64, 80, 96, 112, 128]
    with pytest.raises(ValueError, match="num_timesteps"):
        buckets.bucket_length(0)


def test_policy_modes(monkeypatch):
    monkeypatch.setattr(buckets, "_exact_seen", set())
    ss.set_length_buckets("auto", exact_lengths=2)
    assert buckets.padded_length(9) is None and buckets.padded_length(11) is None
    assert buckets.padded_length(9) is None  # an exact length stays exact
    assert buckets.padded_length(13) == 14  # the third new length is bucketed
    ss.set_length_buckets("never")
    assert buckets.padded_length(13) is None
    ss.set_length_buckets("always")
    assert buckets.padded_length(9) == 10
    tv = ss.TimeVaryingLinearGaussianSSM(state_dim=1, num_timesteps=13)
    assert buckets.padded_length(13, tv) is None  # its matrices have a time axis
    with pytest.raises(ValueError, match="mode"):
        ss.set_length_buckets("sometimes")
    with pytest.raises(ValueError, match="exact_lengths"):
        ss.set_length_buckets("auto", exact_lengths=-1)


def test_prepare_data_pads_and_masks():
    from statseq.core.validation import prepare_data

    ss.set_length_buckets("always")
    y = np.arange(1.0, 10.0)
    data = prepare_data(ss.AR(order=1), y, bucket=True)
    assert data.y.shape == (1, 10) and data.num_timesteps == data.num_valid == 9
    np.testing.assert_array_equal(np.asarray(data.y)[0], np.r_[y, 0.0])
    np.testing.assert_array_equal(np.asarray(data.mask)[0], np.arange(10) < 9)
    assert not data.complete and data.valid_complete
    assert prepare_data(ss.AR(order=1), y).num_valid is None  # only when asked


# ---- padded equals unpadded, per family -----------------------------------------------------

def _ar_cases(rng):
    y = rng.normal(size=(2, T))
    mask = np.ones((2, T), bool)
    mask[1, 5] = False
    ar = ss.AR(order=2, initial="stationary")
    p = ar.default_params()._replace(coeffs=jnp.array([[[0.5]], [[-0.3]]]))
    return [(ar, p, y, None), (ar, p, y, mask), (ss.AR(order=2), ss.AR(order=2).default_params(),
                                                 y[0], None)]


def _hmm_case(rng):
    model = ss.PoissonHMM(num_states=2)
    y = rng.poisson(3.0, size=T)
    params = model.initialize(y, key=jax.random.key(0))
    return model, params, y


def _lgssm_cases(rng):
    level = ss.LocalLevel()
    lin = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
    y2 = rng.normal(size=(T, 2))
    mask2 = np.ones((T, 2), bool)
    mask2[3, 1] = False
    struct = ss.StructuralModel((ss.Trend(slope=True), ss.Seasonal(period=4)))
    return [
        (level, level.default_params(), rng.normal(size=T).cumsum(), None),
        (lin, lin.default_params(), y2, mask2),
        (struct, struct.default_params(), rng.normal(size=37).cumsum(), None),
    ]


def _neural_case(rng):
    model = ss.GRU(hidden_dim=3)
    y = rng.normal(size=T)
    return model, model.initialize(y, key=jax.random.key(1)), y


def test_log_prob_and_filter_every_family(rng):
    cases = _ar_cases(rng) + [(*_hmm_case(rng)[:3], None)] + _lgssm_cases(rng)
    cases.append((*_neural_case(rng), None))
    for model, params, y, mask in cases:
        ref, out = _both(lambda: ss.log_prob(model, params, y, mask=mask))  # noqa: B023
        _assert_tree_close(ref, out)
        ref, out = _both(lambda: ss.filter(model, params, y, mask=mask,  # noqa: B023
                                           return_carries=True))
        _assert_tree_close(ref, out)  # per-step values, every carry and the final carry
        # without carries the unpadded filter may take a fast path; the padded one scans
        ref, out = _both(lambda: ss.filter(model, params, y, mask=mask))  # noqa: B023
        _assert_tree_close(ref, out)


def test_log_prob_fast_path_is_used_when_padded(rng, monkeypatch):
    """Complete data keep the causal fast path under padding; its padded steps are zeroed."""
    model = ss.AR(order=1)
    calls = []
    original = type(model).complete_data_log_probs

    def spy(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(type(model), "complete_data_log_probs", spy)
    y = rng.normal(size=T)
    ref, out = _both(lambda: ss.log_prob(model, model.default_params(), y))
    np.testing.assert_allclose(ref, out, **TOL)
    assert len(calls) == 2  # traced once unpadded and once padded


def test_smoothers_and_forecast(rng):
    model, params, y = _hmm_case(rng)
    ref, out = _both(lambda: model.smoother(params, y))
    _assert_tree_close(ref, out)  # expected transitions: the padded steps are not summed
    ref, out = _both(lambda: model.filter_states(params, y))
    _assert_tree_close(ref, out)
    for ssm, p, y2, mask in _lgssm_cases(rng):
        ref, out = _both(lambda: ssm.smoother(p, y2, mask=mask))  # noqa: B023
        _assert_tree_close(ref, out)
        ref, out = _both(lambda: ssm.filter_states(p, y2, mask=mask))  # noqa: B023
        _assert_tree_close(ref, out)
    for fmodel, p, yf in [(model, params, y), _lgssm_cases(rng)[0][:3], _neural_case(rng)]:
        ref, out = _both(lambda: ss.forecast(fmodel, p, yf, num_steps=4,  # noqa: B023
                                             num_samples=50, key=jax.random.key(3)).samples)
        _assert_tree_close(ref, out)  # same final carry, same key: the same paths


def test_input_driven_hmm_smoother(rng):
    model = ss.PoissonHMM(num_states=2, input_dim=1)
    y = rng.poisson(3.0, size=T)
    u = rng.normal(size=(T, 1))
    params = model.initialize(y, key=jax.random.key(0), inputs=u)
    ref, out = _both(lambda: model.smoother(params, y, inputs=u))
    assert out.expected_transitions.shape == (2, 2)
    _assert_tree_close(ref, out)


def test_one_program_per_bucket(rng):
    """23 lengths in one bucket (1024) share one compiled filter (a jit cache entry)."""
    from statseq.core.recurrence import _filter_flat

    model = ss.LocalLevel()
    params = model.default_params()
    y = rng.normal(size=1001).cumsum()
    # long enough for the steady-state fast path, unpadded (1001) and padded (1024)
    ref, out = _both(lambda: ss.log_prob(model, params, y))
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    before = _filter_flat._cache_size()
    for t in range(1002, 1025):
        ss.log_prob(model, params, rng.normal(size=t))
    assert _filter_flat._cache_size() == before


# ---- thousands of lengths in one process ----------------------------------------------------

_MANY_LENGTHS = textwrap.dedent("""
    import os, sys, time, json
    os.environ["STATSEQ_NO_COMPILATION_CACHE"] = "1"
    import jax, numpy as np
    jax.config.update("jax_enable_x64", True)
    import jax.monitoring
    import statseq as ss

    compiles = [0]
    def count(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles[0] += 1
    jax.monitoring.register_event_duration_secs_listener(count)

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    n = int(sys.argv[1])
    ss.set_length_buckets(sys.argv[2])
    rng = np.random.default_rng(0)
    lengths = rng.permutation(np.arange(1, n + 1))
    hmm = ss.PoissonHMM(num_states=2)
    hp = hmm.initialize(rng.poisson(3.0, 50), key=jax.random.key(0))
    marks = {}
    start = time.perf_counter()
    for i, t in enumerate(lengths):
        ss.log_prob(hmm, hp, rng.poisson(3.0, size=t))
        if i + 1 in (n // 2, n):
            marks[i + 1] = (compiles[0], maps())
    print(json.dumps({"marks": marks, "seconds": time.perf_counter() - start}))
""")


def test_five_thousand_lengths_in_one_process(tmp_path):
    """5,000 distinct lengths (1..5,000, shuffled) scored with a Poisson HMM in one process.

    Without buckets every length compiles at least one program of its own (5,000) and adds
    its machine code's memory mappings (XLA:CPU ran out of mappings near 2,000 lengths).
    Padding every length (``"always"``): one program per bucket, 45 buckets up to 5,120;
    measured 60 compilations in all, 5 in the second half (the lengths are shuffled, so
    almost every bucket exists by then), and +108 mappings over the second 2,500 lengths
    (20.8 s CPU). The model is an HMM because its programs compile in ~0.26 s; the local
    level's steady-state programs take ~1.9 s each and would triple the time. That a
    bucket's lengths share one program of the steady-state path is checked by
    `test_one_program_per_bucket`; the default ``"auto"`` mode only adds the 32 exact
    lengths' programs, and is not run here to keep the test fast.
    """
    script = tmp_path / "many_lengths.py"
    script.write_text(_MANY_LENGTHS)
    env = dict(os.environ, PYTHONPATH=str(Path(ss.__file__).parents[1]))
    done = subprocess.run([sys.executable, str(script), "5000", "always"], capture_output=True,
                          text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    (c_half, m_half), (c_end, m_end) = out["marks"]["2500"], out["marks"]["5000"]
    assert c_end < 100  # against >= 5,000 without buckets (one per length at least)
    assert c_end - c_half < 20  # lengths are shuffled: almost every bucket exists by then
    assert m_end - m_half < 1000  # not growing with the number of lengths


def test_fit_em_keeps_a_bounded_number_of_programs(rng, monkeypatch):
    """EM is not padded (its statistics would see the padded steps): its per-length
    programs are dropped beyond a bound, and dropping them frees their memory mappings."""
    from statseq.fit.em import _fit_em_compiled

    monkeypatch.setattr(buckets, "MAX_PROGRAMS_PER_FUNCTION", 2)
    model = ss.PoissonHMM(num_states=2)
    params = model.initialize(rng.poisson(3.0, size=40), key=jax.random.key(0))
    sizes = []
    # four lengths suffice: sizes run 1, 2, 3 and the fourth call first drops the three
    # programs (1 again); unbounded, the cache would hold 4 > 3
    for t in range(20, 24):
        ss.fit_em(model, params, rng.poisson(3.0, size=t), num_iters=2, progress=False)
        sizes.append(_fit_em_compiled._cache_size())
    assert max(sizes) <= 3 and sizes[-1] >= 1
    assert sizes == [1, 2, 3, 1]  # the bound was actually hit and applied
    if os.path.exists("/proc/self/maps"):
        import gc

        def maps():
            with open("/proc/self/maps") as f:
                return sum(1 for _ in f)

        gc.collect()
        before = maps()
        buckets.bound_cache(_fit_em_compiled, 0)
        gc.collect()
        assert _fit_em_compiled._cache_size() == 0 and maps() < before


@pytest.mark.parametrize("fitter", ["lbfgs", "sgd"])
def test_gradient_fits_keep_a_bounded_number_of_programs(rng, monkeypatch, fitter):
    """fit_lbfgs and fit_sgd compile one program per data shape, like fit_em; before each
    call programs beyond ``MAX_PROGRAMS_PER_FUNCTION`` are dropped (bound 0 here: a second
    length replaces the first length's program instead of adding to it)."""
    import optax

    from statseq.fit.lbfgs import _fit_lbfgs_compiled
    from statseq.fit.sgd import _fit_sgd_compiled

    compiled = _fit_lbfgs_compiled if fitter == "lbfgs" else _fit_sgd_compiled
    monkeypatch.setattr(buckets, "MAX_PROGRAMS_PER_FUNCTION", 0)
    model = ss.PoissonHMM(num_states=2)
    params = model.initialize(rng.poisson(3.0, size=40), key=jax.random.key(0))
    sizes = []
    for t in (20, 21):  # two lengths: two programs without the bound
        y = rng.poisson(3.0, size=t)
        if fitter == "lbfgs":
            fit = ss.fit_lbfgs(model, params, y, num_iters=1, progress=False)
        else:
            fit = ss.fit_sgd(model, params, y, optimizer=optax.adam(1e-2), num_steps=1,
                             key=jax.random.key(1), progress=False)
        assert np.all(np.isfinite(fit.log_joint)) and fit.num_iterations >= 1
        sizes.append(compiled._cache_size())
    assert sizes == [1, 1]
