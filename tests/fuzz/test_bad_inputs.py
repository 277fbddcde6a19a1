"""Fuzz: every model family x every entry point x malformed data -> a clear error.

Each case must raise ``ValueError``/``TypeError`` whose message names the problem (matched
below): wrong shapes and dtypes (complex, strings, objects, a trailing axis of 1 for a
scalar model, the wrong number of emission dimensions), ``NaN``/``inf`` at observed
positions of a NumPy array, values out of the family's support (negative or fractional
counts, categories ``>= num_classes``, non-binary Bernoulli data), magnitudes whose
squares overflow (``1e300``), counts beyond int32, ``T = 0``, and all-missing data given
to a fit. Every rejection happens in eager validation, before anything is compiled, so
the whole matrix runs in seconds.
"""

from __future__ import annotations

import inspect

import jax
import numpy as np
import optax
import pytest

import statseq as ss
from tests.fuzz._models import build_specs

SPECS = build_specs()
SPEC_IDS = [s.name for s in SPECS]


def _log_prob(spec, y, mask=None):
    return ss.log_prob(spec.model, spec.params, y, mask=mask)


def _filter(spec, y, mask=None):
    return ss.filter(spec.model, spec.params, y, mask=mask)


def _smoother(spec, y, mask=None):
    return spec.model.smoother(spec.params, y, mask=mask)


def _fit_em(spec, y, mask=None):
    return ss.fit_em(spec.model, spec.params, y, mask=mask, num_iters=2, progress=False)


def _fit_sgd(spec, y, mask=None):
    return ss.fit_sgd(spec.model, spec.params, y, mask=mask, optimizer=optax.adam(1e-2),
                      num_steps=2, key=jax.random.key(0), progress=False)


def _fit_lbfgs(spec, y, mask=None):
    return ss.fit_lbfgs(spec.model, spec.params, y, mask=mask, num_iters=2, progress=False)


def _forecast(spec, y, mask=None):
    return ss.forecast(spec.model, spec.params, y, mask=mask, num_steps=2, num_samples=2,
                       key=jax.random.key(0))


def _fit_ridge(spec, y, mask=None):  # NGRC's closed-form fit
    return spec.model.fit_ridge(y, mask=mask)


ENTRY_POINTS = {
    "log_prob": _log_prob, "filter": _filter, "smoother": _smoother, "fit_em": _fit_em,
    "fit_sgd": _fit_sgd, "fit_lbfgs": _fit_lbfgs, "forecast": _forecast,
    "fit_ridge": _fit_ridge,
}


def _applies(spec, entry: str) -> bool:
    if entry in spec.excluded:  # an explicit exclusion, with its reason, in _models.py
        return False
    if entry == "smoother":
        return spec.has_smoother
    if entry == "fit_em":
        return spec.has_em
    if entry == "fit_ridge":
        return hasattr(spec.model, "fit_ridge")
    return True


CASES = [(s, e) for s in SPECS for e in ENTRY_POINTS if _applies(s, e)]
CASE_IDS = [f"{s.name}-{e}" for s, e in CASES]


def _bad_inputs(spec):
    """``(label, y, error type, message pattern)`` for one spec."""
    y = np.asarray(spec.y)
    yf = y.astype(float)
    out = [
        ("complex", yf + 1j, TypeError, "complex"),
        ("strings", y.astype(str), TypeError, "numeric"),
        ("objects", np.array([object()] * y.shape[0], dtype=object), TypeError,
         "numeric|objects"),
        ("T=0", y[:0], ValueError, "no time steps"),
        ("0-d", np.asarray(yf.ravel()[0]), ValueError, "must have shape"),
        ("nan", np.where(np.arange(y.shape[0]).reshape((-1,) + (1,) * (y.ndim - 1)) == 2,
                         np.nan, yf), ValueError, "non-finite"),
        ("inf", np.where(np.arange(y.shape[0]).reshape((-1,) + (1,) * (y.ndim - 1)) == 2,
                         np.inf, yf), ValueError, "non-finite"),
    ]
    if spec.event_shape:
        out.append(("wrong emission_dim", yf[..., :1], ValueError, "observations of shape"))
    else:
        out.append(("trailing axis 1", yf[:, None], ValueError, "scalar series"))
    big = yf.copy()
    big[3] = 1e300
    if spec.kind == "real":
        out.append(("1e300", big, ValueError, "squares overflow"))
    elif spec.kind == "count":
        out.append(("1e300", big, ValueError, "int32 range"))
        over = y.astype(np.int64).copy()
        over[3] = 2**33
        out.append(("count 2**33", over, ValueError, "int32 range"))
        neg = y.copy()
        neg[1] = -1
        out.append(("negative count", neg, ValueError, "non-negative integer"))
        frac = yf.copy()
        frac[1] = 2.5
        out.append(("fractional count", frac, ValueError, "non-negative integer"))
    elif spec.kind == "category":
        out.append(("1e300", big, ValueError, "categories in"))
        high = y.copy()
        high[1] = spec.model.num_classes
        out.append(("category >= K", high, ValueError, "categories in"))
        neg = y.copy()
        neg[1] = -1
        out.append(("negative category", neg, ValueError, "categories in"))
    elif spec.kind == "binary":
        out.append(("1e300", big, ValueError, "binary"))
        two = y.copy()
        two[1, 0] = 2
        out.append(("non-binary", two, ValueError, "binary"))
    return out


@pytest.mark.parametrize(("spec", "entry"), CASES, ids=CASE_IDS)
def test_malformed_data_raise_a_clear_error(spec, entry):
    call = ENTRY_POINTS[entry]
    for label, y, error, pattern in _bad_inputs(spec):
        with pytest.raises(error, match=pattern):
            call(spec, y)
            pytest.fail(f"{label}: no error")  # pragma: no cover


@pytest.mark.parametrize(("spec", "entry"), CASES, ids=CASE_IDS)
def test_malformed_masks_raise_a_clear_error(spec, entry):
    call = ENTRY_POINTS[entry]
    steps = np.asarray(spec.y).shape[0]
    with pytest.raises(ValueError, match="mask must have shape"):
        call(spec, spec.y, np.ones(steps + 1, bool))
    with pytest.raises(ValueError, match="mask must be boolean"):
        call(spec, spec.y, np.full(steps, 2))


FITS = [(s, e) for s, e in CASES if e.startswith("fit_")]


@pytest.mark.parametrize(("spec", "entry"), FITS, ids=[f"{s.name}-{e}" for s, e in FITS])
def test_fits_refuse_all_missing_data(spec, entry):
    mask = np.zeros(np.asarray(spec.y).shape[0], bool)
    with pytest.raises(ValueError, match="no observed values|must be observed"):
        ENTRY_POINTS[entry](spec, spec.y, mask)


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_sample_rejects_bad_lengths(spec):
    for bad, error in ((0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="num_timesteps"):
            ss.sample(spec.model, spec.params, num_timesteps=bad, key=jax.random.key(0))


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_malformed_params_raise_a_clear_error(spec):
    leaves, tree = jax.tree.flatten(spec.params)
    for k, leaf in enumerate(leaves):
        arr = np.asarray(leaf)
        if not arr.size:  # an empty leaf (no inputs) has no values to corrupt
            continue
        for label, bad, error, pattern in (
                ("nan", np.full_like(arr, np.nan, dtype=float), ValueError, "non-finite"),
                ("complex", arr + 1j, TypeError, "real array"),
                ("shape", np.zeros(arr.shape + (2,)), ValueError, "must have shape"),
                ("1e300", np.full_like(arr, 1e300, dtype=float), ValueError,
                 "magnitude|constraint")):
            new = jax.tree.unflatten(tree, leaves[:k] + [bad] + leaves[k + 1:])
            with pytest.raises(error, match=pattern):
                ss.log_prob(spec.model, new, spec.y)
                pytest.fail(f"leaf {k}: {label}: no error")  # pragma: no cover


# ---- random keys ------------------------------------------------------------------------
BAD_KEYS = [
    ("None", None, TypeError, r"got None: use jax\.random\.key\(0\)"),
    ("int", 0, TypeError, r"got the int 0: use jax\.random\.key\(0\)"),
    ("numpy int", np.int64(7), TypeError, r"use jax\.random\.key\(7\)"),
    ("float", 1.5, TypeError, "got the float"),
    ("float array", np.zeros(2), TypeError, "dtype float64"),
    ("int32 array", np.zeros(2, np.int32), TypeError, "dtype int32"),
    ("string", "seed", TypeError, "got str"),
    ("raw key of shape (3,)", np.zeros(3, np.uint32), ValueError, r"shape \(2,\)"),
    ("batch of typed keys", jax.random.split(jax.random.key(0)), ValueError,
     "one random key"),
    ("batch of raw keys", jax.random.split(jax.random.PRNGKey(0)), ValueError,
     "one random key"),
]


def _key_entry_points(spec):
    """``{name: call(key)}``: every public entry point taking a key that applies."""
    m, p, y = spec.model, spec.params, spec.y
    out = {
        "sample": lambda k: ss.sample(m, p, num_timesteps=3, key=k),
        "forecast": lambda k: ss.forecast(m, p, y, num_steps=2, num_samples=2, key=k),
        "initialize": lambda k: m.initialize(y, key=k),
        "fit_sgd": lambda k: ss.fit_sgd(m, p, y, optimizer=optax.adam(1e-2), num_steps=2,
                                        key=k, progress=False),
        "fit_restarts": lambda k: ss.fit_restarts(m, y, key=k, num_restarts=1,
                                                  method="lbfgs", num_iters=2),
        "backtest": lambda k: ss.backtest(m, p, y, horizon=1, key=k, num_samples=2),
    }
    if hasattr(m, "sample_states_posterior"):
        out["sample_states_posterior"] = lambda k: m.sample_states_posterior(p, y, key=k)
    return {name: call for name, call in out.items() if name not in spec.excluded}


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_bad_keys_raise_a_clear_error(spec):
    optional = inspect.signature(spec.model.initialize).parameters["key"].default is None
    for entry, call in _key_entry_points(spec).items():
        for label, key, error, pattern in BAD_KEYS:
            if key is None and entry == "initialize" and optional:
                continue  # a deterministic initializer (structural models) takes no key
            with pytest.raises(error, match=pattern):
                call(key)
                pytest.fail(f"{entry}: {label}: no error")  # pragma: no cover


def test_bad_keys_in_the_bayesian_entry_points():
    from statseq.bayes import lfo_cv, predictive_check, sample_prior

    model, y = ss.PoissonHMM(num_states=2), np.array([3, 5, 4, 6, 2, 1, 0, 4])
    draws = sample_prior(model, num_samples=4, key=jax.random.key(0), scale=20.0)
    calls = {
        "fit_nuts": lambda k: ss.fit_nuts(model, y, key=k, num_warmup=2, num_samples=2),
        "fit_svi": lambda k: ss.fit_svi(model, y, key=k, num_steps=2),
        "lfo_cv": lambda k: lfo_cv(model, y, first_origin=5, key=k),
        "sample_prior": lambda k: sample_prior(model, num_samples=2, key=k),
        "predictive_check": lambda k: predictive_check(model, draws, y, key=k),
        "posterior_predictive_forecast": lambda k: ss.posterior_predictive_forecast(
            model, draws, y, num_steps=2, key=k),
    }
    for entry, call in calls.items():
        for label, key, error, pattern in BAD_KEYS:
            with pytest.raises(error, match=pattern):
                call(key)
                pytest.fail(f"{entry}: {label}: no error")  # pragma: no cover
    # where the key is optional (the randomized PIT), None is fine and a bad key is not
    params = model.initialize(y, key=jax.random.key(0))
    for _label, key, error, pattern in BAD_KEYS[1:]:
        with pytest.raises(error, match=pattern):
            ss.pit(model, params, y, key=key)


def test_raw_and_typed_keys_are_both_accepted():
    """A raw ``uint32`` key (``jax.random.PRNGKey``) and the typed key wrapping the same
    data draw the same sample."""
    spec = SPECS[0]
    raw = jax.random.PRNGKey(3)
    a = ss.sample(spec.model, spec.params, num_timesteps=4, key=raw)
    b = ss.sample(spec.model, spec.params, num_timesteps=4, key=jax.random.wrap_key_data(raw))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- NGram: a NumPy model outside the tables (_models.NOT_IN_THE_TABLES) ----------------
def test_ngram_entry_points_refuse_malformed_data():
    """`NGram.fit`, `log_probs`, `predictive` and `sample` refuse what the tables refuse of
    the filters (their own entry points: NGram is not a `statseq.log_prob` model)."""
    model = ss.NGram(order=2, num_classes=3)
    y = np.array([0, 1, 2, 1, 0, 2, 2, 1])
    counts = model.fit(y)
    bad = [
        ("floats", y.astype(float), TypeError, "integer symbols"),
        ("nan", np.where(np.arange(8) == 2, np.nan, y), TypeError, "integer symbols"),
        ("complex", y + 1j, TypeError, "integer symbols"),
        ("strings", y.astype(str), TypeError, "integer symbols"),
        ("objects", np.array([object()] * 8, dtype=object), TypeError, "integer symbols"),
        ("0-d", np.asarray(1), ValueError, "1-D"),
        ("3-d", y.reshape(2, 2, 2), ValueError, "1-D"),
        ("category >= C", np.r_[y, 3], ValueError, r"lie in 0\.\.2"),
        ("negative", np.r_[-1, y], ValueError, r"lie in 0\.\.2"),
        ("int64 overflow", np.r_[y, 2**40], ValueError, r"lie in 0\.\.2"),
    ]
    for label, data, error, pattern in bad:
        for call in (model.fit, lambda d: model.log_probs(counts, d),
                     lambda d: model.predictive(counts, d)):
            if label in ("0-d", "3-d") and call is not model.fit:
                continue
            with pytest.raises(error, match=pattern):
                call(data)
                pytest.fail(f"{label}: no error")  # pragma: no cover
    for empty in (y[:0], y[:0].reshape(2, 0)):
        with pytest.raises(ValueError, match="no time steps"):
            model.fit(empty)
    for steps, error in ((0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="num_steps"):
            model.sample(counts, steps)
    with pytest.raises(ValueError, match=r"lie in 0\.\.2"):
        model.sample(counts, 2, prompt=[0, 5])
    # valid edge data: a one-step series scores the first step of a longer one, and a
    # batch scores each row as the single series
    np.testing.assert_allclose(model.log_probs(counts, y[:1]), model.log_probs(counts, y)[:1],
                               rtol=1e-15)
    np.testing.assert_allclose(model.log_probs(counts, np.stack([y, y[::-1]]))[1],
                               model.log_probs(counts, y[::-1]), rtol=1e-15)
