"""Remembering checks already passed by the same immutable arrays.

`validate_params` and `prepare_data` run eagerly on every call of `log_prob`, `filter`,
... . For short series their NumPy checks cost more than the compiled likelihood itself
(about 0.3 ms against 0.1 ms for a local level model at T = 1000). JAX arrays are
immutable, so a check that passed for one set of array *objects* passes again for the same
objects: `IdentityMemo` remembers the result for the objects themselves (by identity,
holding weak references, so that a freed array's reused ``id`` never matches).

NumPy arrays are mutable, so for them identity is not enough: an entry also keeps a
snapshot of each NumPy array's shape, dtype and bytes, and a lookup matches only when the
array passed again still holds exactly those bytes (a ``memcmp``, far cheaper than the
checks and the device transfer it saves). A NumPy array mutated in place after a first call
is therefore checked again. Arrays above `MAX_SNAPSHOT_BYTES` and other inputs (lists,
pandas objects, Python scalars) are never remembered.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import jax
import numpy as np

#: NumPy arrays larger than this (bytes) are not snapshotted, so never remembered
MAX_SNAPSHOT_BYTES = 1 << 23


def _snapshots(arrays) -> tuple:
    """What must be unchanged for a remembered check to hold: for each NumPy array (JAX
    arrays are immutable), its position, shape, dtype and bytes."""
    return tuple((i, a.shape, a.dtype, a.tobytes()) for i, a in enumerate(arrays)
                 if not isinstance(a, jax.Array))


def _rememberable(a) -> bool:
    if isinstance(a, jax.Array):
        return not isinstance(a, jax.core.Tracer)
    return (type(a) is np.ndarray and a.dtype != object
            and a.nbytes <= MAX_SNAPSHOT_BYTES)


class IdentityMemo:
    """A small LRU map from (a hashable key, a tuple of arrays by identity) to a value.

    JAX arrays match by identity; NumPy arrays by identity *and* unchanged contents (a
    snapshot of their bytes is kept with the entry).

    Args:
        maxsize: how many entries to keep (least recently used ones are dropped).

    Examples:
        >>> import jax.numpy as jnp
        >>> memo = IdentityMemo(maxsize=4)
        >>> x = jnp.ones(3)
        >>> memo.get("check", (x,)) is None
        True
        >>> memo.put("check", (x,), "ok")
        >>> memo.get("check", (x,)), memo.get("check", (jnp.ones(3),))
        ('ok', None)
        >>> import numpy as np
        >>> z = np.zeros(3)
        >>> memo.put("check", (z,), "ok")
        >>> memo.get("check", (z,))
        'ok'
        >>> z[1] = 5.0                                   # mutated in place: no longer matches
        >>> memo.get("check", (z,)) is None
        True
    """

    def __init__(self, maxsize: int = 32):
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()

    @staticmethod
    def _key(key, arrays) -> Any:
        if not all(map(_rememberable, arrays)):
            return None
        try:
            hash(key)
        except TypeError:
            return None
        return (key, tuple(id(a) for a in arrays))

    def get(self, key, arrays: tuple):
        """The value stored for ``key`` and these very array objects, else ``None``."""
        # no type checks here (only `put` stores, and only rememberable arrays): a stored
        # entry matches only the very objects it holds weak references to
        full = (key, tuple(map(id, arrays)))
        try:
            refs, stamps, value = self._entries[full]
        except (KeyError, TypeError):  # TypeError: an unhashable part of ``key``
            return None
        for r, a in zip(refs, arrays, strict=True):
            if r() is not a:
                del self._entries[full]
                return None
        for i, shape, dtype, data in stamps:
            a = arrays[i]
            if a.shape != shape or a.dtype != dtype or a.tobytes() != data:
                del self._entries[full]  # changed in place since: check again
                return None
        self._entries.move_to_end(full)
        return value

    def put(self, key, arrays: tuple, value) -> None:
        """Remember ``value`` for ``key`` and these array objects (ignored unless every one
        is a concrete JAX array or a NumPy array of at most `MAX_SNAPSHOT_BYTES`, and
        ``key`` is hashable)."""
        full = self._key(key, arrays)
        if full is None:
            return
        self._entries[full] = (tuple(weakref.ref(a) for a in arrays), _snapshots(arrays),
                               value)
        self._entries.move_to_end(full)
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget everything."""
        self._entries.clear()
