"""Smoothed n-gram Markov chains over a finite alphabet, fitted in closed form from counts.

An n-gram model is a Markov chain of order ``n - 1``: ``p(y_t | y_{<t}) = p(y_t | h_t)``
with the context ``h_t = (y_{t-n+1}, ..., y_{t-1})``. Its maximum likelihood estimate
``c(h, w) / c(h)`` gives probability zero to every continuation not seen in training, so
held-out text needs smoothing. Two classic estimators (Chen and Goodman, 1998, "An empirical
study of smoothing techniques for language modeling", Harvard TR-10-98) are implemented:

* ``"add_k"`` (Lidstone; add-one is Laplace): ``p(w | h) = (c(h, w) + k) / (c(h) + k C)``
  over ``C`` symbols, with the longest context available (shorter at a sequence's start);
* ``"witten_bell"``, interpolated (Chen and Goodman, eq. 13; Witten and Bell, 1991):

      p_WB(w | h) = (c(h, w) + N1+(h .) p_WB(w | h')) / (c(h) + N1+(h .)),

  where ``h'`` drops the oldest symbol of ``h``, ``N1+(h .)`` counts the distinct symbols
  seen after ``h``, a context never seen (``c(h) = 0``) falls back to ``p_WB(w | h')``, and
  the recursion ends at the empty context interpolated with the uniform ``1 / C``.

Counts are stored sparsely (sorted integer keys ``h C + w`` per context length), so the
fit is ``O(n T log T)`` and the model's size is the number of distinct n-grams seen. This
is a NumPy model, not a JAX filter: it has its own ``fit``, ``log_probs`` and ``sample``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from statseq.core.validation import check_positive_int

__all__ = ["NGram", "NGramCounts"]

SMOOTHINGS = ("witten_bell", "add_k")


class NGramCounts(NamedTuple):
    """Sparse n-gram counts, one entry per context length ``m = 0, ..., order - 1``.

    Attributes:
        pair_keys: per ``m``, sorted unique ``int64`` keys ``h C + w`` of the
            ``(m + 1)``-grams seen (``h`` the context in base ``C``).
        pair_counts: per ``m``, the count ``c(h, w)`` of each key.
        context_keys: per ``m``, sorted unique context keys ``h``.
        context_counts: per ``m``, ``c(h)``: how often ``h`` was followed by a symbol.
        context_types: per ``m``, ``N1+(h .)``: the number of distinct symbols after ``h``.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> counts = ss.NGram(order=2, num_classes=3).fit(np.array([0, 1, 0, 1, 2]))
        >>> counts.pair_keys[1].tolist(), counts.pair_counts[1].tolist()   # 0->1, 1->0, 1->2
        ([1, 3, 5], [2, 1, 1])
    """

    pair_keys: tuple
    pair_counts: tuple
    context_keys: tuple
    context_counts: tuple
    context_types: tuple


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``values`` at ``query`` where the key exists, else 0 (``keys`` sorted, unique)."""
    if keys.size == 0:
        return np.zeros(query.shape, dtype=np.float64)
    pos = np.clip(np.searchsorted(keys, query), 0, keys.size - 1)
    return np.where(keys[pos] == query, values[pos], 0).astype(np.float64)


@dataclasses.dataclass(frozen=True)
class NGram:
    """Character (symbol) n-gram Markov chain with add-k or interpolated Witten-Bell smoothing.

        p(y_t | y_{<t}) = p(y_t | y_{t-n+1}, ..., y_{t-1})      (order n - 1 Markov chain)

    with the smoothed estimates of the module docstring; the first ``n - 1`` steps of a
    sequence use the shorter context they have.

    Args:
        order: ``n``, the length of the n-grams (1: unigram; 3: trigram, context of 2).
        num_classes: alphabet size ``C``; symbols are integers ``0..C-1``.
        smoothing: ``"witten_bell"`` (interpolated, default) or ``"add_k"``.
        k: the pseudo-count of ``"add_k"`` (``> 0``; 1 is Laplace's add-one).

    Examples:
        >>> import numpy as np, statseq as ss
        >>> model = ss.NGram(order=2, num_classes=3)
        >>> counts = model.fit(np.array([0, 1, 0, 1, 2]))
        >>> model.predictive(counts, np.array([0])).round(3)     # p(. | 0): 0 -> 1 seen twice
        array([0.125, 0.792, 0.083])
        >>> model.log_probs(counts, np.array([0, 1])).shape
        (2,)
    """

    order: int
    num_classes: int
    smoothing: str = "witten_bell"
    k: float = 1.0

    def __post_init__(self):
        for name in ("order", "num_classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if self.num_classes ** (self.order - 1) * self.num_classes >= 2**62:
            raise ValueError("num_classes ** order is too large for int64 n-gram keys")
        if self.smoothing not in SMOOTHINGS:
            raise ValueError(f"smoothing must be one of {SMOOTHINGS}, got {self.smoothing!r}")
        if not np.isfinite(self.k) or self.k <= 0:
            raise ValueError(f"k must be a positive number, got {self.k!r}")

    # ------------------------------------------------------------------ data
    def _sequences(self, y) -> list[np.ndarray]:
        if np.ndim(y) not in (1, 2):
            raise ValueError(f"y must be 1-D (one sequence) or 2-D (a batch), got shape "
                             f"{np.shape(y)}")
        seqs = [np.asarray(y)] if np.ndim(y) == 1 else list(np.asarray(y))
        out = []
        for s in seqs:
            if s.size and not np.issubdtype(s.dtype, np.integer):
                raise TypeError(f"y must hold integer symbols, got dtype {s.dtype}")
            s = s.astype(np.int64)
            if s.size and (s.min() < 0 or s.max() >= self.num_classes):
                raise ValueError(f"y must lie in 0..{self.num_classes - 1}")
            out.append(s)
        return out

    def _keys(self, s: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Context keys (length ``m``) and pair keys of the steps ``t >= m`` of ``s``."""
        C = self.num_classes
        n = s.size - m
        h = np.zeros(max(n, 0), dtype=np.int64)
        for j in range(m):  # oldest symbol first: h = sum y_{t-m+j} C^(m-1-j)
            h = h * C + s[j:j + n]
        return h, h * C + s[m:]

    # ------------------------------------------------------------------ fit
    def fit(self, y) -> NGramCounts:
        """Count the n-grams of ``y`` (closed form: these counts are the whole fit).

        Args:
            y: integer symbols, ``(T,)`` for one sequence or ``(B, T)`` for ``B`` sequences
                (n-grams never span two sequences).

        Returns:
            The sparse counts.

        Raises:
            TypeError: for non-integer symbols (floats, strings, complex, objects).
            ValueError: for symbols outside ``0..C-1``, a wrong number of axes or no
                symbols at all.
        """
        pair_keys, pair_counts, ctx_keys, ctx_counts, ctx_types = [], [], [], [], []
        seqs = self._sequences(y)
        if not any(s.size for s in seqs):
            raise ValueError(f"y has no time steps (shape {np.shape(y)}): nothing to count")
        C = self.num_classes
        for m in range(self.order):
            pairs = [self._keys(s, m)[1] for s in seqs if s.size > m]
            pairs = np.concatenate(pairs) if pairs else np.zeros(0, np.int64)
            keys, counts = np.unique(pairs, return_counts=True)
            ctx, first = np.unique(keys // C, return_index=True)
            pair_keys.append(keys)
            pair_counts.append(counts)
            ctx_keys.append(ctx)
            ctx_counts.append(np.add.reduceat(counts, first) if keys.size else counts)
            ctx_types.append(np.diff(np.append(first, keys.size)))
        return NGramCounts(tuple(pair_keys), tuple(pair_counts), tuple(ctx_keys),
                           tuple(ctx_counts), tuple(ctx_types))

    def num_params(self, counts: NGramCounts) -> int:
        """Number of stored counts: the distinct n-grams of every length up to ``order``."""
        return int(sum(k.size for k in counts.pair_keys))

    # ------------------------------------------------------------------ probabilities
    def _probs(self, counts: NGramCounts, ctx: list, pair: list, avail: np.ndarray):
        """p(w | h) from the per-length context and pair keys (lists over m)."""
        C = self.num_classes
        if self.smoothing == "add_k":
            out = np.zeros(avail.shape)
            for m in range(self.order):
                sel = np.minimum(avail, self.order - 1) == m
                c_hw = _lookup(counts.pair_keys[m], counts.pair_counts[m], pair[m])
                c_h = _lookup(counts.context_keys[m], counts.context_counts[m], ctx[m])
                out = np.where(sel, (c_hw + self.k) / (c_h + self.k * C), out)
            return out
        p = np.full(avail.shape, 1.0 / C)
        for m in range(self.order):
            c_hw = _lookup(counts.pair_keys[m], counts.pair_counts[m], pair[m])
            c_h = _lookup(counts.context_keys[m], counts.context_counts[m], ctx[m])
            types = _lookup(counts.context_keys[m], counts.context_types[m], ctx[m])
            new = np.where(c_h > 0, (c_hw + types * p) / np.maximum(c_h + types, 1), p)
            p = np.where(avail >= m, new, p)
        return p

    def log_probs(self, counts: NGramCounts, y) -> np.ndarray:
        """Natural-log one-step predictive probabilities ``log p(y_t | y_{<t})``.

        Args:
            counts: the fit (`fit`).
            y: integer symbols, ``(T,)`` or ``(B, T)``; each sequence is scored from its
                start (shorter contexts for its first ``order - 1`` steps).

        Returns:
            ``float64`` array of the shape of ``y``.
        """
        seqs = self._sequences(y)
        out = []
        for s in seqs:
            T = s.size
            ctx, pair = [], []
            for m in range(self.order):
                h = np.zeros(T, dtype=np.int64)
                for j in range(m):  # context y_{t-m..t-1}; junk (masked) where t < m
                    h = h * self.num_classes + np.roll(s, m - j)
                ctx.append(h)
                pair.append(h * self.num_classes + s)
            avail = np.arange(T)
            out.append(np.log(self._probs(counts, ctx, pair, avail)))
        return out[0] if np.ndim(y) == 1 else np.stack(out)

    def predictive(self, counts: NGramCounts, history) -> np.ndarray:
        """The next-symbol distribution ``p(. | history)``, shape ``(C,)``.

        Args:
            counts: the fit (`fit`).
            history: the symbols so far, ``(t,)`` (may be empty); the last ``order - 1``
                are the context.
        """
        (s,) = self._sequences(np.asarray(history).reshape(-1))  # no silent float cast
        C = self.num_classes
        w = np.arange(C, dtype=np.int64)
        ctx, pair = [], []
        for m in range(self.order):
            h = 0
            for j in range(m):
                h = h * C + (int(s[s.size - m + j]) if s.size >= m else 0)
            ctx.append(np.full(C, h, dtype=np.int64))
            pair.append(h * C + w)
        return self._probs(counts, ctx, pair, np.full(C, s.size))

    def sample(self, counts: NGramCounts, num_steps: int, *, seed: int = 0,
               prompt=None) -> np.ndarray:
        """Generate ``num_steps`` symbols, step by step, after an optional ``prompt``.

        Args:
            counts: the fit (`fit`).
            num_steps: number of symbols to draw.
            seed: NumPy random seed.
            prompt: optional symbols that condition the first draws (not returned).

        Returns:
            ``int64`` array ``(num_steps,)``.

        Raises:
            TypeError: ``num_steps`` not an integer, or a non-integer ``prompt``.
            ValueError: ``num_steps < 1`` or a ``prompt`` symbol outside ``0..C-1``.
        """
        check_positive_int(num_steps, "num_steps")
        if prompt is not None:
            self._sequences(np.reshape(np.asarray(prompt), -1))  # integer symbols in range
        rng = np.random.default_rng(seed)
        history = [] if prompt is None else [int(v) for v in np.asarray(prompt).reshape(-1)]
        start = len(history)
        for _ in range(int(num_steps)):
            p = self.predictive(counts, np.array(history[-(self.order - 1):] if
                                                 self.order > 1 else [], dtype=np.int64))
            history.append(int(rng.choice(self.num_classes, p=p / p.sum())))
        return np.array(history[start:], dtype=np.int64)
