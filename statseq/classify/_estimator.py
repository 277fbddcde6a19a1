"""A small scikit-learn-style estimator mixin, without importing scikit-learn.

scikit-learn's conventions (``fit(X, y)``, ``predict``, ``predict_proba``, ``score``,
``get_params``/``set_params``, ``classes_``; a constructor that stores its arguments
unchanged) are what `sklearn.base.clone`, `sklearn.model_selection.cross_val_score` and
``GridSearchCV`` rely on. `SequenceEstimator` implements them for statseq's sequence
classifiers (and any later seq2vec model) with NumPy only; scikit-learn is imported only
when scikit-learn itself asks for the estimator's tags (``__sklearn_tags__``).

Deep parameters: a constructor argument that is a statseq model (a frozen dataclass) or an
estimator exposes its fields as ``"<arg>__<field>"`` (``get_params(deep=True)``), and
``set_params(model__num_states=3)`` replaces the model by ``dataclasses.replace``, so a grid
search can tune a model's configuration.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from typing import Any

import numpy as np


def _init_arg_names(cls) -> list[str]:
    sig = inspect.signature(cls.__init__)
    names = []
    for name, p in sig.parameters.items():
        if name == "self":
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{cls.__name__}.__init__ must not take *args or **kwargs "
                            "(scikit-learn's estimator convention)")
        names.append(name)
    return names


def _sub_params(value) -> dict[str, Any]:
    """The deep parameters of one constructor argument (an estimator or a dataclass)."""
    if hasattr(value, "get_params") and not isinstance(value, type):
        return dict(value.get_params(deep=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    return {}


class SequenceEstimator:
    """Mixin: scikit-learn's estimator conventions for statseq sequence estimators.

    Subclasses store every ``__init__`` argument unchanged under its own name (no
    validation in ``__init__``: that happens in ``fit``) and set fitted attributes with a
    trailing underscore.

    Examples:
        >>> from statseq.classify._estimator import SequenceEstimator
        >>> class Toy(SequenceEstimator):
        ...     def __init__(self, alpha=1.0, beta=None):
        ...         self.alpha = alpha
        ...         self.beta = beta
        >>> Toy(alpha=2.0).get_params()
        {'alpha': 2.0, 'beta': None}
        >>> Toy().set_params(beta=3).beta
        3
    """

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor arguments (and, if ``deep``, those of nested models/estimators).

        Args:
            deep: also return ``"<arg>__<field>"`` entries for arguments that are
                estimators or dataclass models.

        Returns:
            A dict from parameter name to value.
        """
        out = {}
        for name in _init_arg_names(type(self)):
            value = getattr(self, name)
            if deep:
                out.update({f"{name}__{k}": v for k, v in _sub_params(value).items()})
            out[name] = value
        return out

    def set_params(self, **params):
        """Set constructor arguments; ``"<arg>__<field>"`` sets a nested one.

        A nested field of a frozen dataclass model is set by ``dataclasses.replace``
        (the model is replaced, never mutated).

        Args:
            **params: parameter names and their new values.

        Returns:
            ``self``.
        """
        valid = _init_arg_names(type(self))
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            name, sep, sub = key.partition("__")
            if name not in valid:
                raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}; "
                                 f"valid parameters are {valid}")
            if sep:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
        for name, subs in nested.items():
            target = getattr(self, name)
            if hasattr(target, "set_params") and not isinstance(target, type):
                target.set_params(**subs)
            elif dataclasses.is_dataclass(target) and not isinstance(target, type):
                fields = {f.name for f in dataclasses.fields(target) if f.init}
                unknown = sorted(set(subs) - fields)
                if unknown:
                    raise ValueError(f"{type(target).__name__} has no field(s) {unknown}; "
                                     f"its fields are {sorted(fields)}")
                setattr(self, name, dataclasses.replace(target, **subs))
            else:
                raise ValueError(f"parameter {name!r} of {type(self).__name__} has no "
                                 f"nested parameters (got {list(subs)})")
        return self

    def _store_init_args(self, args: dict[str, Any]) -> None:
        """Store every ``__init__`` argument unchanged under its own name: call
        ``self._store_init_args(locals())`` as the first line of ``__init__``."""
        for name, value in args.items():
            if name not in ("self", "__class__"):
                setattr(self, name, value)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
        return f"{type(self).__name__}({args})"

    # scikit-learn >= 1.6 reads tags from here (only scikit-learn calls it, so importing
    # scikit-learn here does not make it a dependency of statseq)
    def __sklearn_tags__(self):
        from sklearn.utils import ClassifierTags, Tags, TargetTags

        tags = Tags(estimator_type=None, target_tags=TargetTags(required=True))
        if getattr(self, "_estimator_type", None) == "classifier":
            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags()
        tags.input_tags.three_d_array = True  # (num_sequences, num_timesteps, dim)
        tags.input_tags.allow_nan = True  # NaN marks a missing observation
        return tags


class ClassifierMixin:
    """``score`` (accuracy) and label encoding through ``classes_``.

    Labels may be any hashable values: integers, strings, or floats that hold integers
    (``1.0``); ``NaN`` and non-integer floats are rejected. The class using it sets
    ``classes_`` in ``fit`` and provides ``predict_log_proba``.

    Examples:
        >>> import numpy as np
        >>> from statseq.classify import ClassifierMixin, SequenceEstimator
        >>> class Majority(ClassifierMixin, SequenceEstimator):
        ...     def __init__(self):
        ...         pass
        ...     def fit(self, X, y):
        ...         self.classes_ = np.unique(y)
        ...         return self
        ...     def predict_log_proba(self, X):
        ...         return np.log(np.tile([0.9, 0.1], (len(X), 1)))
        >>> Majority().fit([[1.0], [2.0]], ["a", "b"]).score([[1.0], [2.0]], ["a", "a"])
        1.0
    """

    _estimator_type = "classifier"

    def score(self, X, y, **kwargs) -> float:
        """Mean accuracy of ``predict(X)`` against the labels ``y``.

        Args:
            X: sequences, as for ``predict``.
            y: their true labels.
            **kwargs: passed to ``predict`` (e.g. ``mask``).

        Returns:
            The fraction of sequences whose predicted label equals the true one.
        """
        if not hasattr(self, "classes_"):
            raise ValueError(f"this {type(self).__name__} is not fitted yet: call fit(X, y)")
        codes = self._encode(y, num_expected=_num_sequences(X))
        pred = np.argmax(self.predict_log_proba(X, **kwargs), axis=-1)
        return float(np.mean(pred == codes))

    # ---- labels -----------------------------------------------------------------------
    def _set_classes(self, labels: np.ndarray) -> None:
        """Set ``classes_``: the constructor's ``classes`` if given, else the distinct
        ``labels`` (sorted; by first appearance when mixed types cannot be sorted)."""
        if self.classes is not None:
            classes = check_labels(list(self.classes) if not isinstance(self.classes, np.ndarray)
                                   else self.classes)
        else:
            try:
                classes = np.unique(labels)
            except TypeError:  # mixed label types: first appearance
                seen = dict.fromkeys(_label_key(x) for x in labels)
                classes = np.array(list(seen), dtype=object)
        if len(classes) < 2:
            raise ValueError(f"a classifier needs at least two classes; got {list(classes)}")
        if len({_label_key(c) for c in classes}) != len(classes):
            raise ValueError(f"classes has repeated labels: {list(classes)}")
        self.classes_ = classes

    def _fit_codes(self, y, num_sequences: int) -> np.ndarray:
        """For ``fit``: check the labels ``y`` of ``num_sequences`` sequences, set
        ``classes_`` and return the labels' codes; every class needs a sequence."""
        labels = check_labels(y)
        if labels.shape[0] != num_sequences:
            raise ValueError(f"X holds {num_sequences} sequences but y holds "
                             f"{labels.shape[0]} labels: they must match one to one")
        self._set_classes(labels)
        codes = self._encode(labels)
        counts = np.bincount(codes, minlength=len(self.classes_))
        if np.any(counts == 0):
            empty = [_label_key(self.classes_[i]) for i in np.flatnonzero(counts == 0)]
            raise ValueError(f"class(es) {empty} have no training sequence: every class needs "
                             "at least one")
        return codes

    def _encode(self, y, *, num_expected: int | None = None) -> np.ndarray:
        """Integer codes (indices into ``classes_``) of labels ``y``; clear errors else."""
        labels = check_labels(y)
        if num_expected is not None and labels.shape[0] != num_expected:
            raise ValueError(f"X holds {num_expected} sequences but y holds "
                             f"{labels.shape[0]} labels: they must match one to one")
        index = {_label_key(c): i for i, c in enumerate(self.classes_)}
        codes = np.empty(labels.shape[0], np.int64)
        for n, lab in enumerate(labels):
            i = index.get(_label_key(lab))
            if i is None:
                raise ValueError(f"label {lab!r} (sequence {n}) is not one of the classes "
                                 f"{list(self.classes_)}")
            codes[n] = i
        return codes


def _label_key(label):
    return label.item() if isinstance(label, np.generic) else label


def _num_sequences(X) -> int:
    if isinstance(X, list | tuple):
        return len(X)
    return int(np.shape(X)[0]) if np.ndim(X) else 0


def check_labels(y) -> np.ndarray:
    """Labels as a 1-D NumPy array, with a clear error for NaN, non-integer floats,
    booleans mixed with numbers, or a wrong shape.

    Args:
        y: one label per sequence: integers, strings or any hashable values.

    Returns:
        A 1-D array: integer dtype for integer-valued numeric labels, else as given.

    Examples:
        >>> check_labels([0, 1.0, 2]).tolist()
        [0, 1, 2]
        >>> check_labels(["a", "b"]).tolist()
        ['a', 'b']
    """
    if y is None:
        raise TypeError("y (the labels) is None: pass one label per sequence")
    arr = np.asarray(y)
    if arr.dtype == object:
        items = list(arr.ravel()) if arr.ndim else [arr.item()]
        if arr.ndim != 1:
            raise ValueError(f"y must be one label per sequence (1-D), got shape {arr.shape}")
        for n, lab in enumerate(items):
            if isinstance(lab, numbers.Real) and not isinstance(lab, bool | np.bool_) \
                    and not float(lab).is_integer():
                raise ValueError(f"label {lab!r} (sequence {n}) is a non-integer number: "
                                 "labels must be integers, strings or other hashable values")
            try:
                hash(lab)
            except TypeError as err:
                raise TypeError(f"label {lab!r} (sequence {n}) is not hashable") from err
        return arr
    if arr.ndim != 1:
        raise ValueError(f"y must be one label per sequence (1-D), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError("y holds no labels")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            bad = int(np.flatnonzero(~np.isfinite(arr))[0])
            raise ValueError(f"label of sequence {bad} is {arr[bad]}: labels must be finite "
                             "(NaN is not a class)")
        if not np.all(arr == np.round(arr)):
            bad = int(np.flatnonzero(arr != np.round(arr))[0])
            raise ValueError(f"label {arr[bad]} (sequence {bad}) is a non-integer float: "
                             "labels must be integers, strings or other hashable values "
                             "(float labels must hold whole numbers)")
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise TypeError(f"labels must be integers or strings, got complex dtype {arr.dtype}")
    return arr


def padded_lengths(lengths, shape) -> np.ndarray:
    """Check the ``lengths`` of a padded ``(N, T, ...)`` batch (``None``: all ``T``).

    Raises:
        ValueError: no sequence, no time step, a wrong shape or a length outside ``1..T``.
        TypeError: non-integer lengths.
    """
    num, num_t = shape
    if num == 0:
        raise ValueError("X holds no sequences")
    if num_t == 0:
        raise ValueError("X has no time steps: every sequence needs a step")
    if lengths is None:
        return np.full(num, num_t, np.int64)
    lengths = np.asarray(lengths)
    if not np.issubdtype(lengths.dtype, np.integer):
        raise TypeError(f"lengths must be integers, got dtype {lengths.dtype}")
    if lengths.shape != (num,):
        raise ValueError(f"lengths must have shape ({num},), got {lengths.shape}")
    if np.any(lengths < 1) or np.any(lengths > num_t):
        raise ValueError(f"lengths must lie in 1..{num_t} (an empty sequence has no "
                         f"step); got {lengths.tolist()}")
    return lengths
