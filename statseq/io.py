"""Saving and loading fitted parameters: ``.npz`` arrays plus JSON metadata, no pickle.

The file holds one array per parameter leaf (named by its dotted path) and a JSON string
with the model class, its configuration, the parameter names, shapes and dtypes, and the
statseq version. Loading rebuilds the model from the registry, checks every array against
the model's expected shapes and constraints, and never unpickles anything.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.model import registered_models
from statseq.core.params import param_names, params_treedef, validate_params

_FORMAT = "statseq-params"
_FORMAT_VERSION = 1
_META_KEY = "__statseq_metadata__"


def save(path: str | os.PathLike, model, params) -> Path:
    """Save ``model``'s configuration and ``params`` to ``path`` (``.npz`` is appended).

    Examples:
        >>> import statseq as ss, tempfile, os
        >>> model = ss.AR(order=2)
        >>> path = ss.save(os.path.join(tempfile.mkdtemp(), "ar2"), model,
        ...                model.default_params())
        >>> m2, p2 = ss.load(path)
        >>> m2 == model
        True
    """
    from statseq import __version__

    validate_params(model, params)
    names = param_names(model)
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(params)]
    meta = {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "statseq_version": __version__,
        "model": type(model).__name__,
        "config": model.config(),
        "params": [
            {"name": n, "shape": list(a.shape), "dtype": str(a.dtype)}
            for n, a in zip(names, leaves, strict=True)
        ],
    }
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    arrays = {f"param:{n}": a for n, a in zip(names, leaves, strict=True)}
    arrays[_META_KEY] = np.array(json.dumps(meta))
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def load(path: str | os.PathLike):
    """Load ``(model, params)`` saved by `save`.

    Raises:
        ValueError: the file is damaged, is not a statseq parameter file, names an unknown
            model, or its arrays do not match the model's parameter shapes or constraints.

    Examples:
        >>> import os, tempfile, statseq as ss
        >>> model = ss.LocalLevel()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> path = ss.save(os.path.join(tempfile.mkdtemp(), "nile"), model, params)
        >>> model2, params2 = ss.load(path)
        >>> model2 == model, float(params2.obs_var)
        (True, 15099.0)
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            contents = {k: npz[k] for k in npz.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as err:
        raise ValueError(f"{path} is not a readable statseq parameter file ({err})") from err
    if _META_KEY not in contents:
        raise ValueError(f"{path} has no statseq metadata: not a statseq parameter file")
    try:
        meta = json.loads(str(contents.pop(_META_KEY)))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: the metadata is damaged ({err})") from err
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"{path}: the metadata is damaged (expected an object with a config)")
    if not isinstance(meta.get("format_version"), int):
        raise ValueError(f"{path}: the metadata is damaged (format_version is not an integer)")
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path} is not a statseq parameter file")
    if meta.get("format_version", 0) > _FORMAT_VERSION:
        raise ValueError(f"{path} was written by a newer statseq ({meta.get('statseq_version')})")
    models = registered_models()
    if meta.get("model") not in models:
        raise ValueError(f"{path} holds an unknown model {meta.get('model')!r}")
    cls = models[meta["model"]]
    try:
        model = cls(**meta["config"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: invalid configuration for {cls.__name__} ({err})") from err
    names = param_names(model)
    missing = [n for n in names if f"param:{n}" not in contents]
    if missing:
        raise ValueError(f"{path} lacks parameter(s) {missing} for {cls.__name__}")
    extra = sorted(set(contents) - {f"param:{n}" for n in names})
    if extra:
        raise ValueError(f"{path} has unexpected arrays {extra} for {cls.__name__}")
    leaves = [jnp.asarray(contents[f"param:{n}"]) for n in names]
    params = jax.tree.unflatten(params_treedef(model), leaves)
    try:
        validate_params(model, params)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: parameters do not match {cls.__name__} ({err})") from err
    return model, params
