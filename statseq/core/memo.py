"""Remembering checks already passed by the same immutable arrays.

`validate_params` and `prepare_data` run eagerly on every call of `log_prob`, `filter`,
... . For short series their NumPy checks cost more than the compiled likelihood itself
(about 0.3 ms against 0.1 ms for a local level model at T = 1000). JAX arrays are
immutable, so a check that passed for one set of array *objects* passes again for the same
objects: `IdentityMemo` remembers the result for the objects themselves (by identity,
holding weak references, so that a freed array's reused ``id`` never matches). NumPy arrays
and other mutable inputs are never remembered.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import jax


class IdentityMemo:
    """A small LRU map from (a hashable key, a tuple of JAX arrays by identity) to a value.

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
    """

    def __init__(self, maxsize: int = 32):
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()

    @staticmethod
    def _key(key, arrays) -> Any:
        if not all(isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
                   for a in arrays):
            return None
        try:
            hash(key)
        except TypeError:
            return None
        return (key, tuple(id(a) for a in arrays))

    def get(self, key, arrays: tuple):
        """The value stored for ``key`` and these very array objects, else ``None``."""
        full = self._key(key, arrays)
        if full is None:
            return None
        try:
            refs, value = self._entries[full]
        except (KeyError, TypeError):  # TypeError: an unhashable part of ``key``
            return None
        if any(r() is not a for r, a in zip(refs, arrays, strict=True)):
            del self._entries[full]
            return None
        self._entries.move_to_end(full)
        return value

    def put(self, key, arrays: tuple, value) -> None:
        """Remember ``value`` for ``key`` and these array objects (ignored unless every one
        is a concrete JAX array and ``key`` is hashable)."""
        full = self._key(key, arrays)
        if full is None:
            return
        self._entries[full] = (tuple(weakref.ref(a) for a in arrays), value)
        self._entries.move_to_end(full)
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget everything."""
        self._entries.clear()
