"""Calls that differ only in what a compiled program takes as an argument compile nothing new.

`statseq.core.params.strong_params`: a weakly typed parameter leaf (a Python float, or
``jnp.full(shape, 0.5)``) reuses the program compiled for a strong float array of the same
dtype. `statseq.fit_sgd` with ``learning_rate=`` (Adam, the rate traced), ``patience`` and
``min_steps``: one program for every value. Counts, not timings: each lowering of a jaxpr
to an XLA module is counted (`jax.monitoring`), which happens before the persistent
compilation cache is consulted, so the counts hold with or without it (CI sets one).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax._src.lax.lax import _convert_element_type

import statseq as ss
from statseq.core.params import strong_params

_LOWERINGS = [0]


def _on_duration(event, duration, **_):
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
        _LOWERINGS[0] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def lowerings(fn):
    """``(fn(), number of programs lowered while it ran)``."""
    start = _LOWERINGS[0]
    out = fn()
    return out, _LOWERINGS[0] - start


def _weak(params):
    """``params`` with every array leaf weakly typed and every scalar leaf a Python float
    (same values)."""
    def weak(a):
        if np.ndim(a) == 0:
            return float(a)
        return _convert_element_type(jnp.asarray(a), weak_type=True)

    out = jax.tree.map(weak, params)
    assert all(isinstance(x, float) or x.weak_type for x in jax.tree.leaves(out))
    return out


def _strong(params):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), params)


@pytest.fixture(scope="module")
def lynx(log_lynx):
    return log_lynx[:41]  # a length no other test module uses, to count from a clean cache


def test_strong_params_keeps_values_and_dtypes():
    weak = ss.LocalLevelParams(obs_var=jnp.full((), 4.0), level_var=1.0)
    strong = strong_params(weak)
    assert not getattr(strong.obs_var, "weak_type", False)
    assert strong.obs_var.dtype == np.float64 and float(strong.obs_var) == 4.0
    assert np.asarray(strong.level_var).dtype == np.float64 and float(strong.level_var) == 1.0
    # beside float32 leaves a weak leaf computes in float32 (JAX's promotion): it stays so
    mixed = ss.LocalLevelParams(obs_var=np.float32(4.0), level_var=0.5)
    out = strong_params(mixed)
    assert out.obs_var is mixed.obs_var
    assert np.asarray(out.level_var).dtype == np.float32 and float(out.level_var) == 0.5
    # nothing weak: the same object back
    same = _strong(mixed)
    assert strong_params(same) is same


def test_weak_params_reuse_log_prob_and_fit_em_programs(lynx):
    model = ss.GaussianHMM(num_states=2)
    params = _strong(model.initialize(lynx, key=jax.random.key(0)))
    weak = _weak(params)
    lp, n_first = lowerings(lambda: ss.log_prob(model, params, lynx))
    lp_weak, n_weak = lowerings(lambda: ss.log_prob(model, weak, lynx))
    assert n_first >= 1 and n_weak == 0
    assert float(lp_weak) == float(lp)
    fit, n_first = lowerings(lambda: ss.fit_em(model, params, lynx, num_iters=3,
                                               progress=False))
    fit_weak, n_weak = lowerings(lambda: ss.fit_em(model, weak, lynx, num_iters=3,
                                                   progress=False))
    assert n_first >= 1 and n_weak == 0
    np.testing.assert_array_equal(fit_weak.log_joint, fit.log_joint)


def test_weak_params_reuse_the_smoother_and_fit_lbfgs_programs(lynx):
    model = ss.LocalLevel()
    params = ss.LocalLevelParams(obs_var=np.float64(0.1), level_var=np.float64(0.05))
    weak = ss.LocalLevelParams(obs_var=0.1, level_var=0.05)  # Python floats: weak
    sm, n_first = lowerings(lambda: model.smoother(params, lynx))
    sm_weak, n_weak = lowerings(lambda: model.smoother(weak, lynx))
    assert n_first >= 1 and n_weak == 0
    np.testing.assert_array_equal(sm_weak.smoothed_means, sm.smoothed_means)
    fit, n_first = lowerings(lambda: ss.fit_lbfgs(model, params, lynx, num_iters=3,
                                                  progress=False))
    fit_weak, n_weak = lowerings(lambda: ss.fit_lbfgs(model, weak, lynx, num_iters=3,
                                                      progress=False))
    assert n_first >= 1 and n_weak == 0
    np.testing.assert_array_equal(fit_weak.log_joint, fit.log_joint)


def test_fit_sgd_learning_rate_is_adam_and_compiles_once(lynx):
    """``learning_rate=r`` takes the steps of ``optax.adam(r)`` (same trace to rounding),
    and a second rate, patience or min_steps compiles no new program."""
    model = ss.AR(order=2)
    params = model.default_params()
    kw = dict(num_steps=30, key=jax.random.key(1), progress=False)
    ref = ss.fit_sgd(model, params, lynx, optimizer=optax.adam(0.05), **kw)
    fit, n_first = lowerings(lambda: ss.fit_sgd(model, params, lynx, learning_rate=0.05,
                                                **kw))
    np.testing.assert_allclose(fit.log_joint, ref.log_joint, rtol=1e-10)
    assert n_first >= 1
    slow, n_again = lowerings(lambda: ss.fit_sgd(model, params, lynx, learning_rate=0.005,
                                                 patience=3, min_steps=5, **kw))
    assert n_again == 0
    ref_slow = ss.fit_sgd(model, params, lynx, optimizer=optax.adam(0.005), **kw)
    np.testing.assert_allclose(slow.log_joint, ref_slow.log_joint, rtol=1e-10)
    assert not np.allclose(slow.log_joint, fit.log_joint)  # the rate did change the steps


@pytest.mark.parametrize("kwargs, error", [
    ({}, TypeError),
    ({"optimizer": optax.adam(0.1), "learning_rate": 0.1}, TypeError),
    ({"learning_rate": "fast"}, TypeError),
    ({"learning_rate": 0.0}, ValueError),
    ({"learning_rate": float("nan")}, ValueError),
    ({"optimizer": 0.1}, TypeError),
])
def test_fit_sgd_optimizer_arguments_are_checked(kwargs, error):
    model = ss.AR(order=1)
    with pytest.raises(error, match="optimizer|learning_rate"):
        ss.fit_sgd(model, model.default_params(), np.zeros(10), num_steps=2,
                   key=jax.random.key(0), progress=False, **kwargs)
