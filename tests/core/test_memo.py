"""Checks passed by the same JAX arrays, or the same NumPy arrays with unchanged bytes, are
remembered (`statseq.core.memo`); changed NumPy arrays and failed checks never are."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.core import params as params_module
from statseq.core import validation
from statseq.core.memo import IdentityMemo


def test_identity_memo_matches_objects_not_values():
    memo = IdentityMemo(maxsize=2)
    x, y = jnp.ones(3), jnp.ones(3)
    memo.put("k", (x,), 1)
    assert memo.get("k", (x,)) == 1
    assert memo.get("k", (y,)) is None  # equal values, another object
    assert memo.get("other", (x,)) is None
    z = np.ones(3)
    memo.put("k", (z,), 2)  # NumPy: stored with a snapshot of its bytes
    assert memo.get("k", (z,)) == 2 and memo.get("k", (z.copy(),)) is None
    z[0] = 2.0  # changed in place: no longer matches (and the entry is dropped)
    assert memo.get("k", (z,)) is None and len(memo._entries) == 1
    memo.put("k", (y,), 3)
    memo.put("k2", (y,), 4)  # maxsize 2: the least recently used entry (x) goes
    assert memo.get("k", (x,)) is None and memo.get("k", (y,)) == 3
    memo.put(["unhashable"], (x,), 5)  # ignored, not an error
    assert memo.get(["unhashable"], (x,)) is None


def test_identity_memo_forgets_freed_arrays():
    memo = IdentityMemo()
    x = jnp.arange(4.0)
    memo.put("k", (x,), "ok")
    (full,) = memo._entries
    del x
    # whatever object gets the freed id next, the dead weak reference cannot match it
    refs, _, _ = memo._entries[full]
    assert refs[0]() is None


def test_validate_params_runs_once_per_set_of_arrays(monkeypatch):
    model = ss.AR(order=1)
    p = model.default_params()
    calls = []
    original = params_module._validate_params
    monkeypatch.setattr(params_module, "_validate_params",
                        lambda m, q: calls.append(1) or original(m, q))
    params_module._PARAMS_OK.clear()
    y = jnp.asarray(np.random.default_rng(0).normal(size=20))
    ss.log_prob(model, p, y)
    ss.log_prob(model, p, y)
    assert len(calls) == 1
    # the same parameters on other data, or in another public call: not checked again
    # (parameters and data are remembered apart, `recurrence.checked_data`)
    ss.filter(model, p, y[::-1])
    ss.filter(model, p, y)
    assert len(calls) == 1
    ss.log_prob(model, p._replace(coeffs=jnp.asarray(p.coeffs) * 0.5), y)
    assert len(calls) == 2
    # NumPy leaves: remembered while their bytes are unchanged, checked again once changed
    p_np = p._replace(coeffs=np.array(p.coeffs))
    ss.log_prob(model, p_np, y)
    ss.log_prob(model, p_np, y)
    assert len(calls) == 3
    p_np.coeffs[...] *= 0.5
    ss.log_prob(model, p_np, y)
    assert len(calls) == 4


def test_invalid_params_and_data_raise_on_every_call():
    model = ss.AR(order=1)
    p = model.default_params()
    bad = p._replace(cov=-jnp.asarray(p.cov))
    y = jnp.asarray([0.1, np.nan, 0.3])
    for _ in range(2):
        with pytest.raises(ValueError, match="non-finite"):
            ss.log_prob(model, p, y)
    for _ in range(2):
        with pytest.raises(ValueError, match="cov"):
            ss.log_prob(model, bad, jnp.zeros(3))


def test_prepare_data_is_remembered_for_the_same_arrays():
    model = ss.AR(order=1)
    y = jnp.asarray(np.random.default_rng(1).normal(size=10))
    mask = jnp.asarray(np.arange(10) % 3 != 1)
    a = validation.prepare_data(model, y)
    assert validation.prepare_data(model, y) is a
    b = validation.prepare_data(model, y, mask)
    assert b is not a and not b.complete
    assert validation.prepare_data(model, y, mask) is b
    y_np = np.array(y)
    c = validation.prepare_data(model, y_np)
    assert validation.prepare_data(model, y_np) is c  # unchanged bytes: remembered
    y_np[2] += 1.0
    d = validation.prepare_data(model, y_np)
    assert d is not c and float(d.y[0, 2]) == y_np[2]


def test_log_prob_inside_jit_with_a_captured_series_leaks_no_tracer():
    """Under a trace the prepared arrays are tracers: they must not be remembered (a later
    eager call with the same series would otherwise receive a leaked tracer)."""
    import jax

    model = ss.AR(order=1)
    p = model.default_params()
    y = jnp.asarray(np.random.default_rng(2).normal(size=12))
    traced = jax.jit(lambda coeffs: ss.log_prob(model, p._replace(coeffs=coeffs), y))
    a = traced(p.coeffs)
    b = ss.log_prob(model, p, y)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    assert not isinstance(validation.prepare_data(model, y).y, jax.core.Tracer)
