"""Parameters: constraint bijections, free-parameter counts, priors, trainable masks."""

from __future__ import annotations

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import optax
import pytest
from scipy import stats

import statseq as ss
from statseq.core.params import param_names, trainable_mask, validate_priors

MODEL = ss.AR(order=2, emission_dim=3, input_dim=2)

# jitted: op-by-op dispatch of the bijections would compile dozens of tiny programs
to_unc = jax.jit(partial(ss.to_unconstrained, MODEL))
from_unc = jax.jit(partial(ss.from_unconstrained, MODEL))


def random_params(seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(3, 3))
    return ss.ARParams(
        coeffs=jnp.asarray(0.2 * rng.normal(size=(2, 3, 3))),
        intercept=jnp.asarray(rng.normal(size=3)),
        input_weights=jnp.asarray(rng.normal(size=(3, 2))),
        cov=jnp.asarray(a @ a.T + 0.5 * np.eye(3)),
    )


def test_unconstrained_round_trip():
    params = random_params()
    up = to_unc(params)
    # real leaves map by the identity, bit for bit
    for name in ("coeffs", "intercept", "input_weights"):
        np.testing.assert_array_equal(np.asarray(getattr(up, name)),
                                      np.asarray(getattr(params, name)))
    # a 3x3 covariance has 6 free scalars
    assert up.cov.shape == (6,)
    back = from_unc(up)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-14)
    # any unconstrained vector maps to a valid (symmetric positive definite) covariance
    rng = np.random.default_rng(1)
    up2 = jax.tree.map(lambda a: jnp.asarray(3.0 * rng.normal(size=a.shape)), up)
    cov = np.asarray(from_unc(up2).cov)
    np.testing.assert_allclose(cov, cov.T, atol=1e-12)
    assert np.all(np.linalg.eigvalsh(cov) > 0)
    # and back again
    again = to_unc(from_unc(up2))
    np.testing.assert_allclose(np.asarray(again.cov), np.asarray(up2.cov), rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (ss.AR(order=3), 3 + 1 + 0 + 1),
        (ss.AR(order=1, emission_dim=2), 4 + 2 + 0 + 3),
        (MODEL, 2 * 9 + 3 + 3 * 2 + 3 * 4 // 2),
    ],
)
def test_num_free_params(model, expected):
    assert ss.num_free_params(model) == expected
    assert ss.num_params(model) == expected
    # equals the size of the unconstrained parameter vector
    up = jax.eval_shape(partial(ss.to_unconstrained, model), model.default_params())
    assert sum(np.prod(leaf.shape, dtype=int) for leaf in jax.tree.leaves(up)) == expected


def test_num_free_params_with_frozen_leaves():
    frozen = ss.ARParams(coeffs=False, intercept=True, input_weights=True, cov=False)
    assert ss.num_free_params(MODEL, frozen) == 3 + 6
    assert ss.num_params(MODEL, frozen) == 3 + 6


def test_param_names():
    assert param_names(MODEL) == ["coeffs", "intercept", "input_weights", "cov"]


def test_log_prior_equals_manual_sum():
    params = random_params(2)

    def priors():  # built inside jit: eager construction of a Wishart costs seconds
        return ss.ARParams(
            coeffs=dist.Normal(0.0, 0.5),
            intercept=dist.Normal(jnp.array([1.0, 0.0, -1.0]), 2.0),
            input_weights=None,
            cov=dist.Wishart(concentration=5.0, scale_matrix=jnp.eye(3)),
        )

    got = float(jax.jit(lambda p: ss.log_prior(priors(), p))(params))
    p = jax.tree.map(np.asarray, params)
    expected = (
        stats.norm(0.0, 0.5).logpdf(p.coeffs).sum()
        + stats.norm([1.0, 0.0, -1.0], 2.0).logpdf(p.intercept).sum()
        + stats.wishart(df=5.0, scale=np.eye(3)).logpdf(p.cov)
    )
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert float(ss.log_prior(None, params)) == 0.0
    flat = ss.ARParams(None, None, None, None)
    assert float(ss.log_prior(flat, params)) == 0.0


def test_prior_validation():
    model = ss.AR(order=1)
    with pytest.raises(ValueError, match="priors must have the structure of params"):
        validate_priors(model, (dist.Normal(), None))
    with pytest.raises(TypeError, match="prior leaves must be numpyro distributions"):
        validate_priors(model, ss.ARParams(1.0, None, None, None))
    with pytest.raises(TypeError, match="prior leaves"):
        ss.fit_sgd(model, model.default_params(), np.zeros(5), optimizer=optax.sgd(0.1),
                   num_steps=1, key=jax.random.key(0), progress=False,
                   priors=ss.ARParams("normal", None, None, None))


def test_trainable_mask_validation():
    params = random_params()
    assert trainable_mask(params) == ss.ARParams(True, True, True, True)
    ok = trainable_mask(params, ss.ARParams(False, True, np.bool_(True), False))
    assert ok == ss.ARParams(False, True, True, False)
    with pytest.raises(ValueError, match="trainable must have the structure of params"):
        trainable_mask(params, (True, False))
    with pytest.raises(ValueError, match="trainable must have the structure"):
        trainable_mask(params, {"coeffs": True})
    with pytest.raises(TypeError, match="trainable leaves must be True or False"):
        trainable_mask(params, ss.ARParams(True, True, True, "yes"))
    with pytest.raises(TypeError, match="trainable leaves must be True or False"):
        trainable_mask(params, ss.ARParams(True, 1, True, True))
    with pytest.raises(ValueError, match="trainable must have the structure"):
        ss.fit_sgd(ss.AR(order=1), ss.AR(order=1).default_params(), np.zeros(5),
                   optimizer=optax.sgd(0.1), num_steps=1, key=jax.random.key(0),
                   progress=False, trainable=(True,))


# ---- eager parameter checks: the one-pass fast paths decide as the leaf-by-leaf checks ----

def _reference_validate(model, params):
    """`_validate_params` as it was before its one-pass fast paths (session 23): every
    check leaf by leaf, ``np.issubdtype`` dtype tests and ``np.allclose`` for a simplex."""
    from numpyro.distributions import constraints

    from statseq.core import params as P
    from statseq.core.validation import float_dtype

    _, expected, tree, cons, names = P._param_spec(model)
    leaves = tree.flatten_up_to(params)
    checked = []
    semidefinite = set(getattr(model, "semidefinite_params", ()))
    for name, shape, value, con in zip(names, expected, leaves, cons, strict=True):
        arr = np.asarray(value)
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"params.{name} must have shape {tuple(shape)}, got {arr.shape}")
        if np.issubdtype(arr.dtype, np.complexfloating) or not (
                np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise TypeError(f"params.{name} must be a real array, got dtype {arr.dtype}")
        given = arr
        if arr.dtype == np.float64 and float_dtype() == jnp.float32:
            with np.errstate(over="ignore", under="ignore"):
                arr = arr.astype(np.float32)
        P._check_underflow(name, given, arr, con)
        checked.append((name, arr, con))
    if checked and not np.isfinite(np.concatenate(
            [np.ravel(a).astype(np.float64) for _, a, _ in checked])).all():
        name = next(n for n, a, _ in checked if not np.all(np.isfinite(a)))
        raise ValueError(f"params.{name} contains non-finite values")
    for name, arr, con in checked:
        if not arr.size:
            continue
        P._check_representable(name, arr, con)
        if name in semidefinite and con in (constraints.positive_definite,
                                            constraints.positive):
            if not P._is_semidefinite(arr, con):
                kind = ("positive semi-definite" if con is constraints.positive_definite
                        else "non-negative")
                raise ValueError(f"params.{name} violates its constraint: it must be {kind} "
                                 "(a singular covariance or a zero variance is allowed here)")
            continue
        if con is constraints.simplex:
            tol = 1e-4 if arr.dtype == np.float32 else 1e-8
            ok = bool(np.all(arr >= 0) and np.allclose(arr.sum(-1), 1.0,
                                                       atol=tol * arr.shape[-1]))
        else:
            ok = P._satisfies(con, arr)
        if not ok:
            raise ValueError(f"params.{name} violates its constraint ({con})")
    if hasattr(model, "check_params"):
        model.check_params(params)


def _outcome(check, model, params):
    try:
        check(model, params)
    except (ValueError, TypeError) as err:
        return type(err).__name__, str(err)
    return None


def _valid_numpy_params(model, rng):
    """Valid float64 NumPy parameters of ``model`` from its shapes and constraints."""
    from numpyro.distributions import constraints

    from statseq.core import params as P

    _, shapes, tree, cons, _ = P._param_spec(model)
    leaves = []
    for shape, con in zip(shapes, cons, strict=True):
        if con is constraints.positive:
            leaf = 0.5 + rng.random(shape)
        elif con is constraints.simplex:
            leaf = rng.dirichlet(np.ones(shape[-1]), size=shape[:-1]).reshape(shape)
        elif con is constraints.unit_interval:
            leaf = rng.uniform(0.2, 0.8, shape)
        elif con is constraints.positive_definite:
            a = rng.normal(size=shape) * 0.3
            leaf = a @ np.swapaxes(a, -1, -2) + np.eye(shape[-1])
        else:
            assert con is constraints.real, con
            leaf = rng.normal(size=shape) * 0.3
        leaves.append(np.asarray(leaf, np.float64))
    return tree, leaves


#: values put into parameter entries: zeros, negatives, float64 and float32 subnormals and
#: the smallest normals, non-finite values, magnitudes either side of sqrt(max) in both
#: dtypes, and nudges of a probability either side of the simplex tolerance
_EDGE_VALUES = (0.0, -1.0, 1e-310, np.finfo(np.float64).tiny, 1e-40,
                float(np.finfo(np.float32).tiny), np.nan, np.inf, -np.inf, 1e200, 1.3e154,
                1.35e154, 1.8e19, 1.9e19, "+1e-6", "+3e-5", "+1e-3")


@pytest.mark.parametrize("x64", [True, False])
def test_one_pass_checks_decide_as_leaf_by_leaf_checks(x64):
    """Every parameter set built from valid values with one or two entries set to edge
    values gets the same outcome (the same error type and message, naming the same leaf,
    or none) from `_validate_params` as from the leaf-by-leaf reference, in float64 and
    with x64 off (float64 values cast to float32 first); NumPy and JAX leaves alike."""
    from statseq.core import params as P

    models = [ss.AR(order=2), ss.LocalLevel(), ss.PoissonHMM(num_states=3),
              ss.GaussianHMM(num_states=2, emission_dim=2),
              ss.BernoulliHMM(num_states=2, emission_dim=3)]
    rng = np.random.default_rng(0)
    seen, failed = set(), 0
    with jax.enable_x64(x64), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model in models:
            tree, base = _valid_numpy_params(model, rng)
            cases = [[]] + [[(i, v)] for i in range(len(base)) for v in _EDGE_VALUES]
            cases += [[(int(rng.integers(len(base))), _EDGE_VALUES[int(rng.integers(17))])
                       for _ in range(2)] for _ in range(40)]
            for n, case in enumerate(cases):
                leaves = [a.copy() for a in base]
                for i, v in case:
                    if not leaves[i].size:
                        continue
                    j = int(rng.integers(leaves[i].size))
                    flat = leaves[i].reshape(-1)
                    flat[j] = flat[j] + float(v[1:]) if isinstance(v, str) else v
                if n % 2:
                    leaves = [jnp.asarray(a) if x64 else a for a in leaves]
                params = tree.unflatten(leaves)
                got = _outcome(P._validate_params, model, params)
                assert got == _outcome(_reference_validate, model, params), (model, case)
                seen.add(got[1].split(" ", 1)[1][:19] if got else None)
                failed += got is not None
    # the edge values reach every kind of outcome (the comparison is not vacuous)
    assert None in seen and failed > 100
    assert {"contains non-finite", "has a value below t", "has a value of magn",
            "violates its constr"} <= seen, seen


def test_real_dtype_kinds_are_the_issubdtype_test():
    """`_REAL_KINDS` accepts exactly the dtypes the ``np.issubdtype`` test accepted."""
    from statseq.core.params import _REAL_KINDS

    for dtype in (bool, np.int8, np.uint16, np.int64, np.float16, np.float32, np.float64,
                  np.longdouble, np.complex64, np.complex128, "m8[s]", "M8[s]", object,
                  "U3", "S2", "V4", [("a", float)]):
        dt = np.dtype(dtype)
        was = not np.issubdtype(dt, np.complexfloating) and (
            np.issubdtype(dt, np.number) or dt == np.dtype(bool))
        assert (dt.kind in _REAL_KINDS) == was, dt
