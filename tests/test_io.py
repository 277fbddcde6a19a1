"""save/load: exact round trips, and clear ValueErrors for damaged or foreign files."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss

META = "__statseq_metadata__"
MODEL = ss.AR(order=2, emission_dim=2, input_dim=1, initial="conditional")


def random_params():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2, 2))
    return ss.ARParams(
        coeffs=jnp.asarray(rng.normal(size=(2, 2, 2))),
        intercept=jnp.asarray(rng.normal(size=2)),
        input_weights=jnp.asarray(rng.normal(size=(2, 1))),
        cov=jnp.asarray(a @ a.T + np.eye(2)),
    )


@pytest.fixture
def saved(tmp_path):
    params = random_params()
    return ss.save(tmp_path / "model", MODEL, params), params


def _rewrite(path, contents):
    with open(path, "wb") as fh:
        np.savez(fh, **contents)


def _contents(path):
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


@pytest.mark.parametrize(
    "model",
    [MODEL, ss.AR(order=1), ss.AR(order=3, emission_dim=1, initial="stationary")],
    ids=["varx", "ar1", "stationary"],
)
def test_round_trip_is_exact(tmp_path, model):
    params = random_params() if model == MODEL else model.default_params()
    path = ss.save(tmp_path / "m", model, params)
    assert path.name == "m.npz" and path.exists()
    model2, params2 = ss.load(path)
    assert model2 == model and type(model2) is type(model)
    assert type(params2) is type(params)
    for a, b in zip(jax.tree.leaves(params2), jax.tree.leaves(params), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()  # bitwise


def test_explicit_npz_suffix_is_kept(tmp_path):
    path = ss.save(tmp_path / "m.npz", ss.AR(order=1), ss.AR(order=1).default_params())
    assert path == tmp_path / "m.npz"


def test_metadata_is_json_not_pickle(saved):
    path, _ = saved
    contents = _contents(path)
    meta = json.loads(str(contents[META]))
    assert meta["model"] == "AR" and meta["format"] == "statseq-params"
    assert meta["config"] == {"order": 2, "emission_dim": 2, "input_dim": 1,
                              "initial": "conditional"}
    assert [p["name"] for p in meta["params"]] == ["coeffs", "intercept", "input_weights", "cov"]
    assert all(v.dtype != object for v in contents.values())


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        ss.load(tmp_path / "nope.npz")


def test_truncated_file(saved):
    path, _ = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable statseq parameter file"):
        ss.load(path)


def test_random_bytes(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_bytes(np.random.default_rng(0).bytes(2000))
    with pytest.raises(ValueError, match="not a readable statseq parameter file"):
        ss.load(path)


def test_tampered_shape(saved):
    path, _ = saved
    contents = _contents(path)
    contents["param:cov"] = np.eye(3)
    _rewrite(path, contents)
    with pytest.raises(ValueError, match=r"params.cov must have shape \(2, 2\)"):
        ss.load(path)


def test_tampered_values_violating_constraints(saved):
    path, _ = saved
    contents = _contents(path)
    contents["param:cov"] = -np.eye(2)
    _rewrite(path, contents)
    with pytest.raises(ValueError, match="params.cov violates"):
        ss.load(path)


def test_missing_and_extra_arrays(saved):
    path, _ = saved
    contents = _contents(path)
    del contents["param:intercept"]
    _rewrite(path, contents)
    with pytest.raises(ValueError, match=r"lacks parameter\(s\) \['intercept'\]"):
        ss.load(path)
    contents = _contents(path)
    contents["param:intercept"] = np.zeros(2)
    contents["param:extra"] = np.zeros(2)
    _rewrite(path, contents)
    with pytest.raises(ValueError, match="unexpected arrays"):
        ss.load(path)


def _with_meta(path, change):
    contents = _contents(path)
    meta = json.loads(str(contents[META]))
    meta = change(meta)
    contents[META] = np.array(meta if isinstance(meta, str) else json.dumps(meta))
    _rewrite(path, contents)


def test_unknown_model_name(saved):
    path, _ = saved
    _with_meta(path, lambda m: {**m, "model": "NoSuchModel"})
    with pytest.raises(ValueError, match="unknown model 'NoSuchModel'"):
        ss.load(path)


def test_invalid_config(saved):
    path, _ = saved
    _with_meta(path, lambda m: {**m, "config": {**m["config"], "order": 0}})
    with pytest.raises(ValueError, match="invalid configuration for AR"):
        ss.load(path)
    _with_meta(path, lambda m: {**m, "config": {**m["config"], "colour": "red"}})
    with pytest.raises(ValueError, match="invalid configuration for AR"):
        ss.load(path)


def test_plain_npz_without_metadata(tmp_path):
    path = tmp_path / "plain.npz"
    np.savez(path, coeffs=np.zeros((1, 1, 1)))
    with pytest.raises(ValueError, match="no statseq metadata"):
        ss.load(path)


def test_pickled_object_array_is_refused(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, **{META: np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ValueError, match="not a readable statseq parameter file"):
        ss.load(path)


def test_foreign_format_and_newer_version(saved):
    path, _ = saved
    _with_meta(path, lambda m: {**m, "format": "something-else"})
    with pytest.raises(ValueError, match="is not a statseq parameter file"):
        ss.load(path)
    _with_meta(path, lambda m: {**m, "format": "statseq-params", "format_version": 99})
    with pytest.raises(ValueError, match="newer statseq"):
        ss.load(path)


def test_damaged_metadata_json(saved):
    path, _ = saved
    _with_meta(path, lambda m: json.dumps(m)[:-5])
    with pytest.raises(ValueError, match="metadata is damaged"):
        ss.load(path)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: {k: v for k, v in m.items() if k != "config"},
        lambda m: {**m, "config": [2, 2]},
        lambda m: {**m, "format_version": "1"},
        lambda m: [m],
    ],
    ids=["no-config", "config-not-a-dict", "version-not-a-number", "not-an-object"],
)
def test_malformed_metadata_raises_value_error(saved, change):
    """load documents ValueError for any damaged file; valid JSON of the wrong form
    currently escapes as KeyError / TypeError / AttributeError."""
    path, _ = saved
    _with_meta(path, change)
    with pytest.raises(ValueError):
        ss.load(path)
