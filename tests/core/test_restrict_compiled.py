"""The compiled helpers that keep a fit's eager work to a few programs equal what they replace.

`restrict` inverts every leaf in one compiled program (`_inverses`) and the fits expand the
result with `expand_compiled`; eagerly each operation was a program of its own, traced and
loaded again in every new process (benchmarks/bench_startup.py). Both must give the eager
values (float64: the inverse bitwise, the expansion to 1e-15 relative).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

import statseq as ss
from statseq.core import restrict as R


def _ar_setup():
    model = ss.AR(order=1, emission_dim=2)
    params = model.default_params()._replace(
        coeffs=jnp.array([[[0.5, -0.2], [0.1, 0.3]]]),
        intercept=jnp.array([0.25, -1.5]),
        cov=jnp.array([[2.0, 0.3], [0.3, 0.7]]),
    )
    trainable = params._replace(coeffs=np.array([[[True, False], [True, True]]]),
                                intercept=False, input_weights=True, cov=True)
    return model, params, trainable


def _eager(monkeypatch):
    def fail(*_):
        raise RuntimeError("forced eager path")

    monkeypatch.setattr(R, "_inverse_leaves", fail)


def test_restrict_one_program_inverse_equals_the_eager_one(monkeypatch):
    model, params, trainable = _ar_setup()
    res, z0 = R.restrict(model, params, trainable)
    with monkeypatch.context() as m:
        _eager(m)
        res_e, z0_e = R.restrict(model, params, trainable)
    np.testing.assert_array_equal(z0, z0_e)                # bitwise, float64
    assert res.kinds == res_e.kinds and res.num_free == res_e.num_free == 6
    # a whole positive definite leaf: z0 holds biject_to(positive_definite).inv(cov)
    u = np.asarray(biject_to(constraints.positive_definite).inv(params.cov))
    _, start, size, _ = res.kinds[3]
    np.testing.assert_array_equal(z0[start:start + size], u)


def test_restrict_inverse_reads_constraint_parameters_as_arguments():
    """A parameterized constraint is a pytree: a new bound is a new argument of the same
    program, never a stale constant."""
    value = jnp.array([2.5, 4.0])
    mask = np.ones(2, bool)
    for bound in (2.0, 3.0):
        con = constraints.greater_than(bound)
        (u,) = R._inverses([value], [con], [mask], [None])
        np.testing.assert_array_equal(u, np.asarray(biject_to(con).inv(value)))
    # leaves that are not inverted (fixed whole leaves) come back as None
    assert R._inverses([value], [constraints.positive], [np.zeros(2, bool)], [None]) == [None]


def test_restrict_errors_unchanged_on_the_boundary():
    model, params, _ = _ar_setup()
    bad = params._replace(cov=jnp.array([[1.0, 1.0], [1.0, 1.0]]))  # singular
    with pytest.raises(ValueError, match="singular"):
        R.restrict(model, bad)


@pytest.mark.parametrize("which", ["ar", "local_level"])
def test_expand_compiled_equals_expand(which):
    if which == "ar":
        model, params, trainable = _ar_setup()
    else:
        model = ss.LocalLevel()
        params, trainable = model.default_params(), None
    res, z0 = R.restrict(model, params, trainable)
    z = jnp.asarray(z0) + 0.125 * jnp.arange(z0.size)          # fixed coordinates move too
    got = R.expand_compiled(model, res, z)
    want = res.expand(model, z)
    for a, b in zip(got, want, strict=True):  # one program may round L @ L.T's last bit
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-15, atol=0)
    # fixed entries come back exactly as given
    if which == "ar":
        np.testing.assert_array_equal(np.asarray(got.intercept), np.asarray(params.intercept))
        assert float(got.coeffs[0, 0, 1]) == float(params.coeffs[0, 0, 1])


def test_sticky_default_transitions_equal_the_jnp_formula():
    for k in (1, 3):
        model = ss.PoissonHMM(num_states=k)
        got = np.asarray(model.default_transitions(0.9))
        if k == 1:
            want = np.ones((1, 1))
        else:
            off = (1.0 - 0.9) / (k - 1)
            want = np.asarray(jnp.full((k, k), off) + (0.9 - off) * jnp.eye(k))
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float64
