"""Categorical (integer token) inputs for the seq2vec encoders: a learned embedding.

A sequence of tokens ``x_t in {0, ..., K - 1}`` (words, symbols, event codes) enters a
backbone through a learned table ``E`` (``K x d``),

    e_t = E[x_t] = onehot(x_t)^T E,    (s_t, h_t) = backbone(s_{t-1}, e_t),

so the embedding is the linear layer ``onehot(x_t) -> E^T onehot(x_t)`` without building
the one-hot vectors. `EmbeddedBackbone` wraps any statseq `Backbone` this way and is itself
a backbone (one token per step, ``input_dim = 1``), so the bidirectional encoder, the
poolings and the heads of `statseq.classify.seq2vec` work on it unchanged. `pad_tokens`
validates and pads ragged token sequences.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints

from statseq.classify._estimator import padded_lengths
from statseq.core.validation import float_dtype
from statseq.models.neural.base import Backbone


class EmbeddingParams(NamedTuple):
    """Parameters of an `EmbeddedBackbone`.

    Attributes:
        embedding: ``(vocab_size, embed_dim)`` the table ``E``; row ``k`` is token ``k``'s
            input vector.
        backbone: the wrapped backbone's parameters.

    Examples:
        >>> import jax, statseq as ss
        >>> from statseq.classify.embedding import EmbeddedBackbone
        >>> bb = EmbeddedBackbone(ss.GRU(hidden_dim=3).backbone, vocab_size=5, embed_dim=2)
        >>> bb.init_params(jax.random.key(0)).embedding.shape
        (5, 2)
    """

    embedding: Any
    backbone: Any


@dataclasses.dataclass(frozen=True)
class EmbeddedBackbone(Backbone):
    """A backbone reading integer tokens through a learned embedding:
    ``h_t = backbone(E[x_t])``.

    Each step's input is one token (``x_t`` of shape ``(1,)``, an integer in
    ``0 .. vocab_size - 1``, possibly stored as a float of a whole number); the wrapped
    backbone reads ``E[x_t]`` of size ``embed_dim`` (its ``input_dim`` is set to it).

    Args:
        backbone: any statseq `Backbone` (its ``input_dim`` is replaced by ``embed_dim``).
        vocab_size: number of distinct tokens ``K``.
        embed_dim: size ``d`` of a token's vector.
        input_dim: 1 (one token per step); fixed.

    Examples:
        >>> import jax, jax.numpy as jnp, statseq as ss
        >>> bb = EmbeddedBackbone(ss.GRU(hidden_dim=3).backbone, vocab_size=4, embed_dim=2)
        >>> params = bb.init_params(jax.random.key(0))
        >>> bb.sequence(params, jnp.array([[0], [3], [1]])).shape
        (3, 3)
    """

    backbone: Backbone
    vocab_size: int
    embed_dim: int
    input_dim: int = 1

    def __post_init__(self):
        for name in ("vocab_size", "embed_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.input_dim != 1:
            raise ValueError(f"an EmbeddedBackbone reads one token per step (input_dim=1), "
                             f"got input_dim={self.input_dim}")
        if not isinstance(self.backbone, Backbone):
            raise TypeError(f"backbone must be a statseq Backbone, got "
                            f"{type(self.backbone).__name__}")
        if self.backbone.input_dim != self.embed_dim:
            object.__setattr__(self, "backbone",
                               dataclasses.replace(self.backbone, input_dim=int(self.embed_dim)))

    @property
    def output_dim(self) -> int:
        return self.backbone.output_dim

    def param_shapes(self) -> EmbeddingParams:
        return EmbeddingParams((self.vocab_size, self.embed_dim), self.backbone.param_shapes())

    def param_constraints(self) -> EmbeddingParams:
        return EmbeddingParams(constraints.real, self.backbone.param_constraints())

    def init_params(self, key) -> EmbeddingParams:
        """Embedding rows ``N(0, 1)`` and the backbone's own initialization."""
        ke, kb = jax.random.split(key)
        table = jax.random.normal(ke, (self.vocab_size, self.embed_dim), float_dtype())
        return EmbeddingParams(table, self.backbone.init_params(kb))

    def embed(self, params: EmbeddingParams, tokens):
        """``E[x]``: tokens ``(..., 1)`` -> vectors ``(..., embed_dim)``."""
        idx = jnp.asarray(tokens)[..., 0].astype(jnp.int32)
        return jnp.take(params.embedding, idx, axis=0)

    def initial_state(self, params):
        return self.backbone.initial_state(params.backbone)

    def step(self, params, state, x_t):
        return self.backbone.step(params.backbone, state, self.embed(params, x_t))

    def scan(self, params, state, xs):
        return self.backbone.scan(params.backbone, state, self.embed(params, xs))

    def scan_time_major(self, params, state, xs):
        return self.backbone.scan_time_major(params.backbone, state, self.embed(params, xs))


def is_token_data(X) -> bool:
    """Whether ``X`` (a list of sequences or an array) holds integer (non-boolean) values:
    categorical inputs. A list counts only when every sequence is integer."""
    if isinstance(X, list | tuple):
        if not X:
            return False
        arrays = [np.asarray(s) for s in X]
        return all(np.issubdtype(a.dtype, np.integer) for a in arrays)
    arr = np.asarray(X)
    return arr.dtype != object and np.issubdtype(arr.dtype, np.integer)


def _as_tokens(a, name, vocab_size):
    arr = np.asarray(a)
    if arr.dtype == object or arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) \
            or np.issubdtype(arr.dtype, np.complexfloating):
        raise TypeError(f"{name} must hold integer tokens, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise TypeError(f"{name} must hold integer tokens (categorical inputs); it holds "
                            "values that are not whole numbers (pass real features to a model "
                            "fitted without input_vocab)")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} holds the negative token {int(arr.min())}: tokens lie in "
                         f"0..{vocab_size - 1 if vocab_size else 'K-1'}")
    if vocab_size is not None and arr.size and arr.max() >= vocab_size:
        raise ValueError(f"{name} holds the token {int(arr.max())}, out of range for "
                         f"input_vocab={vocab_size} (tokens lie in 0..{vocab_size - 1})")
    return arr


def pad_tokens(X, lengths=None, vocab_size=None):
    """Ragged integer token sequences as a padded ``(N, T, 1)`` array and their lengths.

    Args:
        X: a list of ``(T_n,)`` (or ``(T_n, 1)``) integer arrays, or an ``(N, T)`` array
            (every sequence of length ``T`` unless ``lengths`` says).
        lengths: optional ``(N,)`` lengths for an array ``X``.
        vocab_size: number of tokens ``K``; tokens must lie in ``0 .. K - 1`` (``None``:
            any non-negative token).

    Returns:
        ``(x (N, T, 1) float with padding 0, lengths (N,) int)``; the tokens are stored as
        floats of whole numbers (the encoder's input array), read back by
        `EmbeddedBackbone`.

    Raises:
        ValueError: no sequences, an empty sequence, a negative or out-of-range token,
            lengths out of range; TypeError: values that are not whole numbers.

    Examples:
        >>> x, lengths = pad_tokens([[1, 2, 3], [4]], vocab_size=5)
        >>> x[..., 0].tolist(), lengths.tolist()
        ([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], [3, 1])
    """
    if isinstance(X, list | tuple):
        if len(X) == 0:
            raise ValueError("X holds no sequences")
        if lengths is not None:
            raise ValueError("lengths is only for a padded array X; a list gives them")
        seqs = []
        for n, s in enumerate(X):
            a = _as_tokens(s, f"sequence {n}", vocab_size)
            if a.ndim == 2 and a.shape[1] == 1:
                a = a[:, 0]
            if a.ndim != 1:
                raise ValueError(f"token sequence {n} must be (T,) (one token per step), got "
                                 f"shape {a.shape}")
            if a.shape[0] == 0:
                raise ValueError(f"sequence {n} is empty: every sequence needs a step")
            seqs.append(a)
        lengths = np.array([a.shape[0] for a in seqs], np.int64)
        x = np.zeros((len(seqs), int(lengths.max())), np.int64)
        for n, a in enumerate(seqs):
            x[n, :a.shape[0]] = a
    else:
        arr = np.asarray(X)
        if arr.ndim == 3 and arr.shape[-1] == 1:
            arr = arr[..., 0]
        if arr.ndim != 2:
            raise ValueError(f"token X must be (N, T) (or a list of token sequences), got "
                             f"shape {arr.shape}")
        num_t = arr.shape[1]
        lengths = padded_lengths(lengths, arr.shape)
        valid = np.arange(num_t)[None, :] < lengths[:, None]
        if np.issubdtype(arr.dtype, np.floating):
            arr = np.where(valid, arr, 0)  # padding may hold NaN
        x = np.where(valid, _as_tokens(arr, "X", vocab_size), 0)
    return x[..., None].astype(float_dtype()), np.asarray(lengths, np.int64)
