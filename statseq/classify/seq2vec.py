"""Discriminative seq2vec models and aligned sequence labelling on statseq's backbones.

A sequence ``x_{1:T}`` (``T`` steps of ``D`` real features; ragged batches allowed) is
encoded by a statseq backbone (the network of any neural model: `statseq.ElmanRNN`,
`statseq.GRU`, `statseq.LSTM` (stacked with ``num_layers``), `statseq.Mamba`, `statseq.LRU`,
`statseq.S4D`, ..., or the dilated causal convolutions of `statseq.WaveNet` as a
non-recurrent encoder), optionally **bidirectional**,

    h^f_t = f(x_{1:t}),   h^b_t = g(x_{t:T}),   h_t = [h^f_t, h^b_t],

where ``g`` is a second backbone reading the sequence reversed *within its own length*
(padding stays after the sequence, so the backward pass starts at ``x_T``). Categorical
inputs (integer tokens ``x_t in 0..K-1``, ``input_vocab=K`` or any integer ``X``) enter
through a learned embedding, ``f(E[x_1], ..., E[x_t])`` (`statseq.classify.embedding`). Then

* `SequenceClassifier` / `SequenceRegressor`: a mask-aware pooling ``z = pool(h_{1:T})``
  (``"last"``: ``h^f_T`` (and ``h^b_1``, the backward final state); ``"mean"``; ``"max"``;
  ``"attention"``: ``sum_t a_t h_t`` with ``a = softmax_t(w . h_t)`` over the sequence's
  own steps) and a statseq head, ``c | x_{1:T} ~ head(z)``: categorical for classes,
  Gaussian or Student-t for sequence regression, Poisson (or negative binomial) for
  counts;
* `SequenceLabeller`: the categorical head at every step, ``c_t | x_{1:T} ~ head(h_t)``
  (with ``bidirectional=False``, ``c_t | x_{1:t}``: a causal labeller).

Each is a likelihood ``p(c | x)``; ``fit`` maximizes the mean log-likelihood of the labels
with optax (Adam, minibatches, optional early stopping on a held-out fraction of the
sequences), the whole fit one compiled `jax.lax.scan`. ``fit_bayes`` instead samples the
posterior of the weights under a Gaussian prior with NUTS, or fits an SVI approximation
(`statseq.classify.seq2vec_bayes`), and the predictions average over the posterior draws.
The estimators follow scikit-learn's conventions through
`statseq.classify.SequenceEstimator`.

The sequence labeller and the generative answer (an input-driven HMM's posterior state
marginals, `statseq.InputDrivenHMM` with `statseq.smoother`) are compared on one footing by
`labelling_log_loss` and `labelling_accuracy`, which take per-step log-probabilities.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from statseq.classify._estimator import ClassifierMixin, SequenceEstimator, padded_lengths
from statseq.classify.embedding import EmbeddedBackbone, is_token_data, pad_tokens
from statseq.core.validation import float_dtype
from statseq.models.neural.base import Backbone
from statseq.models.neural.heads import make_head

POOLINGS = ("last", "mean", "max", "attention")


# ---------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------
def pad_sequences(X, lengths=None):
    """Ragged real sequences as a padded ``(N, T, D)`` array and their lengths.

    Args:
        X: a list of arrays ``(T_n,)`` or ``(T_n, D)``, or an array ``(N, T)`` /
            ``(N, T, D)`` (then every sequence has length ``T`` unless ``lengths`` says).
        lengths: optional ``(N,)`` lengths for an array ``X`` (steps past a sequence's
            length are padding and are never read).

    Returns:
        ``(x (N, T, D) float with padding 0, lengths (N,) int)``.

    Raises:
        ValueError: no sequences, an empty sequence, sequences of different ``D``,
            non-finite values inside a sequence, or lengths out of range.

    Examples:
        >>> x, lengths = pad_sequences([[1.0, 2.0, 3.0], [4.0]])
        >>> x.shape, lengths.tolist()
        ((2, 3, 1), [3, 1])
    """
    dtype = float_dtype()
    if isinstance(X, list | tuple):
        if len(X) == 0:
            raise ValueError("X holds no sequences")
        if lengths is not None:
            raise ValueError("lengths is only for a padded array X; a list gives them")
        seqs = []
        for n, s in enumerate(X):
            a = _as_float(s, f"sequence {n}")
            if a.ndim == 1:
                a = a[:, None]
            if a.ndim != 2:
                raise ValueError(f"sequence {n} must be (T,) or (T, D), got shape {a.shape}")
            if a.shape[0] == 0:
                raise ValueError(f"sequence {n} is empty: every sequence needs a step")
            seqs.append(a)
        dims = {a.shape[1] for a in seqs}
        if len(dims) > 1:
            raise ValueError(f"sequences have different feature sizes D: {sorted(dims)}")
        lengths = np.array([a.shape[0] for a in seqs], np.int64)
        x = np.zeros((len(seqs), int(lengths.max()), dims.pop()), dtype)
        for n, a in enumerate(seqs):
            x[n, :a.shape[0]] = a
    else:
        x = _as_float(X, "X")
        if x.ndim == 2:
            x = x[..., None]
        if x.ndim != 3:
            raise ValueError(f"X must be (N, T) or (N, T, D) (or a list of sequences), got "
                             f"shape {x.shape}")
        num_t = x.shape[1]
        lengths = padded_lengths(lengths, x.shape[:2])
        x = np.where(np.arange(num_t)[None, :, None] < lengths[:, None, None], x, 0.0)
        x = x.astype(dtype)
    if not np.all(np.isfinite(x)):
        n = int(np.argwhere(~np.isfinite(x))[0][0])
        raise ValueError(f"sequence {n} holds NaN or infinite values inside its length")
    return x, np.asarray(lengths, np.int64)


def _as_float(a, name):
    arr = np.asarray(a)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)
                                   or arr.dtype == bool):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise TypeError(f"{name} must hold real numbers, got complex dtype {arr.dtype}")
    return arr.astype(float_dtype())


def reverse_within_lengths(x, lengths):
    """Reverse each sequence of a padded batch within its own length.

    ``out[n, t] = x[n, L_n - 1 - t]`` for ``t < L_n``; padding steps stay in place. The map
    is its own inverse.

    Args:
        x: ``(N, T, ...)``.
        lengths: ``(N,)`` integer lengths.

    Returns:
        An array like ``x``.

    Examples:
        >>> import jax.numpy as jnp
        >>> reverse_within_lengths(jnp.array([[1, 2, 3], [4, 5, 0]]), jnp.array([3, 2])).tolist()
        [[3, 2, 1], [5, 4, 0]]
    """
    num_t = x.shape[1]
    t = jnp.arange(num_t)[None, :]
    lengths = jnp.asarray(lengths)[:, None]
    idx = jnp.where(t < lengths, lengths - 1 - t, t)  # (N, T)
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, jnp.broadcast_to(idx, x.shape), axis=1)


# ---------------------------------------------------------------------------------------
# the encoder
# ---------------------------------------------------------------------------------------
class EncoderParams(NamedTuple):
    """Parameters of a `SequenceEncoder`.

    Attributes:
        forward: the forward backbone's parameters.
        backward: the backward backbone's parameters (``None`` if not bidirectional).
        attention: ``(F,)`` attention scoring vector ``w`` (``None`` unless
            ``pooling="attention"``).

    Examples:
        >>> import jax, statseq as ss
        >>> enc = SequenceEncoder(encoder_backbone(ss.GRU(hidden_dim=3), 1), True, "last")
        >>> params = enc.init_params(jax.random.key(0))
        >>> params._fields, params.backward is not None, params.attention is None
        (('forward', 'backward', 'attention'), True, True)
    """

    forward: Any
    backward: Any
    attention: Any


def encoder_backbone(encoder, input_dim: int) -> Backbone:
    """The backbone of a statseq neural model (or a backbone) reading ``input_dim`` features.

    Args:
        encoder: a statseq neural model (``ss.GRU(hidden_dim=8)``, ``ss.Mamba(...)``, ...)
            or a `statseq.models.neural.base.Backbone`.
        input_dim: size ``D`` of ``x_t``.

    Returns:
        The backbone (a frozen dataclass) with ``input_dim=D``.

    Examples:
        >>> import statseq as ss
        >>> encoder_backbone(ss.GRU(hidden_dim=4), 3).input_dim
        3
    """
    backbone = encoder if isinstance(encoder, Backbone) else getattr(encoder, "backbone", None)
    if not isinstance(backbone, Backbone):
        raise TypeError("encoder must be a statseq neural model (ss.GRU(...), ss.Mamba(...), "
                        f"...) or a Backbone, got {type(encoder).__name__}")
    return dataclasses.replace(backbone, input_dim=int(input_dim))


@dataclasses.dataclass(frozen=True)
class SequenceEncoder:
    """A (bidirectional) backbone and a mask-aware pooling: ``(N, T, D)`` -> features.

    ``h_t = [f(x_{1:t}), g(x_{t:L})]`` per step (``g`` reads each sequence reversed within
    its own length ``L``), and ``pool`` over the steps ``t < L`` only.

    Args:
        backbone: the forward backbone (`encoder_backbone`).
        bidirectional: add a second backbone of the same configuration reading backwards.
        pooling: ``"last"``, ``"mean"``, ``"max"`` or ``"attention"``.

    Examples:
        >>> import jax, jax.numpy as jnp, statseq as ss
        >>> enc = SequenceEncoder(encoder_backbone(ss.GRU(hidden_dim=3), 2), True, "mean")
        >>> params = enc.init_params(jax.random.key(0))
        >>> enc.pool(params, jnp.ones((4, 5, 2)), jnp.array([5, 3, 1, 2])).shape
        (4, 6)
    """

    backbone: Backbone
    bidirectional: bool = False
    pooling: str = "last"

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")

    @property
    def feature_dim(self) -> int:
        """Size of ``h_t`` (twice the backbone's output if bidirectional)."""
        return self.backbone.output_dim * (2 if self.bidirectional else 1)

    def init_params(self, key) -> EncoderParams:
        """Random backbone weights (two independent draws if bidirectional)."""
        kf, kb, ka = jax.random.split(key, 3)
        backward = self.backbone.init_params(kb) if self.bidirectional else None
        attention = None
        if self.pooling == "attention":
            attention = 0.1 * jax.random.normal(ka, (self.feature_dim,), float_dtype())
        return EncoderParams(self.backbone.init_params(kf), backward, attention)

    def _run(self, params, x):
        num = x.shape[0]
        state0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (num,) + a.shape),
                              self.backbone.initial_state(params))
        _, hs = self.backbone.scan_time_major(params, state0, jnp.swapaxes(x, 0, 1))
        return jnp.swapaxes(hs, 0, 1)  # (N, T, F)

    def states(self, params: EncoderParams, x, lengths):
        """Per-step features ``h_t``, shape ``(N, T, feature_dim)`` (padding steps hold
        whatever the network gives there: pool or mask them).

        Args:
            params: `EncoderParams`.
            x: ``(N, T, D)`` padded inputs.
            lengths: ``(N,)`` lengths.
        """
        valid = jnp.arange(x.shape[1])[None, :] < jnp.asarray(lengths)[:, None]
        x = jnp.where(valid[..., None], x, 0.0)  # padding never reaches the network
        hs = self._run(params.forward, x)
        if self.bidirectional:
            hb = self._run(params.backward, reverse_within_lengths(x, lengths))
            hs = jnp.concatenate([hs, reverse_within_lengths(hb, lengths)], axis=-1)
        return hs

    def pool(self, params: EncoderParams, x, lengths):
        """Pooled features ``z``, shape ``(N, feature_dim)``, from the steps ``t < L`` only.

        Args:
            params: `EncoderParams`.
            x: ``(N, T, D)`` padded inputs.
            lengths: ``(N,)`` lengths.
        """
        hs = self.states(params, x, lengths)
        lengths = jnp.asarray(lengths)
        valid = (jnp.arange(x.shape[1])[None, :] < lengths[:, None])[..., None]
        if self.pooling == "last":
            last = jnp.take_along_axis(hs, (lengths - 1)[:, None, None], axis=1)[:, 0]
            if not self.bidirectional:
                return last
            half = self.backbone.output_dim  # the backward half's final state is at t = 0
            return jnp.concatenate([last[:, :half], hs[:, 0, half:]], axis=-1)
        if self.pooling == "mean":
            return jnp.sum(jnp.where(valid, hs, 0.0), axis=1) / lengths[:, None]
        if self.pooling == "max":
            return jnp.max(jnp.where(valid, hs, -jnp.inf), axis=1)
        scores = jnp.where(valid[..., 0], hs @ params.attention, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=1)
        return jnp.einsum("nt,ntf->nf", weights, jnp.where(valid, hs, 0.0))


# ---------------------------------------------------------------------------------------
# fitting: one compiled scan of optax steps
# ---------------------------------------------------------------------------------------
class Seq2VecParams(NamedTuple):
    """Parameters of a seq2vec model or labeller.

    Attributes:
        encoder: `EncoderParams`.
        head: the head's parameters (`statseq.models.neural.heads.HeadParams` or variant).

    Examples:
        >>> import numpy as np, statseq as ss
        >>> clf = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), num_steps=2)
        >>> clf = clf.fit([np.zeros(3), np.ones(4)], [0, 1])
        >>> type(clf.params_).__name__, clf.params_.head.weight.shape
        ('Seq2VecParams', (2, 2))
    """

    encoder: EncoderParams
    head: Any


def _to_unconstrained(head, params):
    from numpyro.distributions.transforms import biject_to

    cons = head.param_constraints()
    return jax.tree.map(lambda c, v: biject_to(c).inv(v), cons, params,
                        is_leaf=lambda c: not isinstance(c, tuple))


def _to_constrained(head, uparams):
    from numpyro.distributions.transforms import biject_to

    cons = head.param_constraints()
    return jax.tree.map(lambda c, v: biject_to(c)(v), cons, uparams,
                        is_leaf=lambda c: not isinstance(c, tuple))


def _sum_log_lik(encoder, head, per_step, params, x, lengths, y):
    """Sum over sequences (or over valid steps for a labeller) of ``log p(y | x)``."""
    if per_step:
        hs = encoder.states(params.encoder, x, lengths)
        valid = jnp.arange(x.shape[1])[None, :] < lengths[:, None]
        lp = head.distribution(params.head, hs).log_prob(jnp.where(valid, y, 0))
        return jnp.sum(jnp.where(valid, lp, 0.0))
    z = encoder.pool(params.encoder, x, lengths)
    return jnp.sum(head.distribution(params.head, z).log_prob(y))


def _fit_compiled(encoder, head, per_step, params0, train, val, key, hyper, *, num_steps,
                  batch_size, eval_every):
    """Adam on ``-mean log p(y | x) + 0.5 weight_decay |theta|^2`` with minibatches; with a
    validation set, the parameters of the best validation score so far are kept and the
    fit stops after ``patience`` evaluations without improvement."""
    learning_rate, weight_decay, patience = hyper
    x_tr, l_tr, y_tr = train
    num_train = x_tr.shape[0]
    opt = optax.adam(learning_rate)

    def unpack(u):
        return Seq2VecParams(u.encoder, _to_constrained(head, u.head))

    u0 = Seq2VecParams(params0.encoder, _to_unconstrained(head, params0.head))

    def loss(u, idx):
        params = unpack(u)
        num_scored = (jnp.sum(l_tr[idx]) if per_step else idx.shape[0])
        nll = -_sum_log_lik(encoder, head, per_step, params, x_tr[idx], l_tr[idx],
                            y_tr[idx]) / num_scored
        penalty = sum(jnp.sum(a**2) for a in jax.tree.leaves(u))
        return nll + 0.5 * weight_decay * penalty

    def val_loss(u):
        if val is None:
            return jnp.zeros((), float_dtype())
        x_va, l_va, y_va = val
        scored = jnp.sum(l_va) if per_step else x_va.shape[0]
        return -_sum_log_lik(encoder, head, per_step, unpack(u), x_va, l_va, y_va) / scored

    def body(carry, step_key):
        u, opt_state, best_u, best_val, bad, stopped, step = carry
        idx = jax.random.choice(step_key, num_train, (batch_size,), replace=False)
        value, grad = jax.value_and_grad(loss)(u, idx)
        updates, new_opt = opt.update(grad, opt_state, u)
        new_u = optax.apply_updates(u, updates)
        keep = stopped | ~jnp.isfinite(value)
        u2 = jax.tree.map(lambda a, b: jnp.where(keep, a, b), u, new_u)
        opt2 = jax.tree.map(lambda a, b: jnp.where(keep, a, b), opt_state, new_opt)
        stopped = stopped | ~jnp.isfinite(value)
        if val is None:
            best_u2, best_val2, bad2 = u2, best_val, bad
        else:
            evaluate = ((step + 1) % eval_every == 0) & ~stopped
            v = jnp.where(evaluate, val_loss(u2), jnp.inf)
            better = evaluate & (v < best_val)
            best_u2 = jax.tree.map(lambda a, b: jnp.where(better, b, a), best_u, u2)
            best_val2 = jnp.where(better, v, best_val)
            bad2 = jnp.where(better, 0, bad + evaluate.astype(bad.dtype))
            stopped = stopped | (bad2 >= patience)
        return (u2, opt2, best_u2, best_val2, bad2, stopped, step + 1), (value, stopped)

    dtype = float_dtype()
    init = (u0, opt.init(u0), u0, jnp.asarray(jnp.inf, dtype), jnp.asarray(0),
            jnp.asarray(False), jnp.asarray(0))
    final, (trace, stopped) = jax.lax.scan(body, init, jax.random.split(key, num_steps))
    u_best = final[0] if val is None else final[2]
    return unpack(u_best), trace, jnp.sum(~stopped), final[3]


_fit_jit = jax.jit(_fit_compiled, static_argnames=(
    "encoder", "head", "per_step", "num_steps", "batch_size", "eval_every"))


def _features(encoder, per_step, params, x, lengths):
    return encoder.states(params, x, lengths) if per_step else encoder.pool(params, x, lengths)


_features_jit = jax.jit(_features, static_argnames=("encoder", "per_step"))
_encoder_init_jit = jax.jit(lambda encoder, key: encoder.init_params(key), static_argnums=0)


# ---------------------------------------------------------------------------------------
# estimators
# ---------------------------------------------------------------------------------------
class _Seq2VecBase(SequenceEstimator):
    """Shared configuration, fitting and checks of the seq2vec estimators."""

    _per_step = False

    def _check_options(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        for name in ("num_steps", "batch_size", "eval_every", "patience"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not float(self.learning_rate) > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if not float(self.weight_decay) >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.validation is not None and not 0.0 < float(self.validation) < 1.0:
            raise ValueError(f"validation must be a fraction in (0, 1), got {self.validation}")
        if isinstance(self.random_state, bool) or not isinstance(self.random_state,
                                                                 int | np.integer):
            raise TypeError("random_state must be an integer seed, got "
                            f"{type(self.random_state).__name__}")

    def _encoder_model(self):
        if self.encoder is not None:
            return self.encoder
        from statseq.models.neural.rnn import GRU

        return GRU(hidden_dim=16)

    def _build(self, input_dim, head_kwargs):
        vocab = getattr(self, "input_vocab_", None)
        if vocab:  # integer tokens through a learned embedding (statseq.classify.embedding)
            dim = min(vocab, 16) if self.embed_dim is None else self.embed_dim
            backbone = EmbeddedBackbone(encoder_backbone(self._encoder_model(), dim), vocab,
                                        dim)
        else:
            backbone = encoder_backbone(self._encoder_model(), input_dim)
        encoder = SequenceEncoder(backbone, bool(self.bidirectional),
                                  "last" if self._per_step else self.pooling)
        head = make_head(feature_dim=encoder.feature_dim, **head_kwargs)
        return encoder, head

    def _fit_arrays(self, x, lengths, y, y_mask, head_kwargs):
        self._check_options()
        self.encoder_, self.head_ = self._build(x.shape[-1], head_kwargs)
        self.n_features_in_ = int(x.shape[-1])
        key = jax.random.key(int(self.random_state))
        params0 = self._init_params(key, y, y_mask)
        k_split, k_fit = jax.random.split(key, 4)[2:]
        num = x.shape[0]
        if self.validation is None:
            train, val = (x, lengths, y), None
        else:
            num_val = max(1, int(round(float(self.validation) * num)))
            if num_val >= num:
                raise ValueError("validation leaves no sequences to train on")
            perm = np.asarray(jax.random.permutation(k_split, num))
            tr, va = perm[num_val:], perm[:num_val]
            train, val = (x[tr], lengths[tr], y[tr]), (x[va], lengths[va], y[va])
        batch = min(int(self.batch_size), train[0].shape[0])
        dtype = float_dtype()
        hyper = (jnp.asarray(float(self.learning_rate), dtype),
                 jnp.asarray(float(self.weight_decay), dtype), jnp.asarray(int(self.patience)))

        def to_j(t):
            return None if t is None else tuple(jnp.asarray(a) for a in t)

        params, trace, steps, best_val = _fit_jit(
            self.encoder_, self.head_, self._per_step, params0, to_j(train), to_j(val), k_fit,
            hyper, num_steps=int(self.num_steps), batch_size=batch,
            eval_every=int(self.eval_every))
        self.params_ = params
        steps = int(steps)
        self.loss_trace_ = np.asarray(trace)[:steps]
        self.n_iter_ = steps
        self.best_validation_loss_ = float(best_val) if val is not None else None
        full = np.asarray(trace)
        if not np.all(np.isfinite(full[:min(steps + 1, len(full))])):
            import warnings

            warnings.warn(f"{type(self).__name__}.fit: the loss became non-finite at step "
                          f"{steps}; the fit stopped there and keeps the last finite "
                          "parameters (lower learning_rate)", RuntimeWarning, stacklevel=3)
        return self

    def _init_params(self, key, y, y_mask):
        """Random starting `Seq2VecParams` (encoder weights; head bias from ``y``)."""
        k_enc, k_head = jax.random.split(key, 4)[:2]
        head_params = self.head_.init_params(k_head, np.asarray(y), y_mask)
        return Seq2VecParams(_encoder_init_jit(self.encoder_, k_enc), head_params)

    def fit(self, X, y, *, lengths=None):
        """Fit by maximum likelihood (Adam, minibatches; see the class docstring).

        Args:
            X: sequences (a list, or a padded array with ``lengths``).
            y: labels (one per sequence; for `SequenceLabeller`, one per step).
            lengths: optional lengths of a padded array ``X``.

        Returns:
            ``self``.
        """
        self.posterior_draws_ = None
        self.method_ = "sgd"
        return self._fit_arrays(*self._fit_inputs(X, y, lengths))

    def fit_bayes(self, X, y, *, method, key, lengths=None, prior_scale=1.0, num_warmup=200,
                  num_samples=200, num_chains=2, chain_method="sequential",
                  target_accept_prob=0.8, max_tree_depth=8, guide="normal", num_steps=1000,
                  optimizer=None, num_particles=1, progress=False):
        """Bayesian fit: NUTS samples, or an SVI approximation of, the posterior

            p(theta | c, x) ∝ prod_i Normal(u_i; 0, prior_scale) prod_n p(c_n | x_n, theta)

        over the flat unconstrained parameters ``u`` (every backbone weight and bias, the
        attention vector, the head's readout; a positive head parameter through its
        bijection), the likelihood on the padded ragged batch with padding masked
        (labeller: every valid step). Predictions then average over the posterior draws:
        ``predict_proba`` / ``predict_log_proba`` / ``log_prob`` are the posterior
        predictive ``log mean_s p(c | x, theta_s)``, a regressor's ``predict`` the posterior
        mean of the predictive mean, a classifier's ``predict`` the posterior predictive
        mode. **Small models only**: NUTS for tiny encoders (hidden size <= 8, a few hundred
        parameters, a few hundred sequences), SVI (``guide="normal"``) for larger ones;
        ``guide="delta"`` gives the MAP. Network posteriors are multimodal (hidden units
        permute, tanh units flip sign): chains explore one mode each, so read R-hat across
        chains as a mode count, not as a failure of the sampler.

        Args:
            X: sequences (a list, or a padded array with ``lengths``).
            y: labels, as for ``fit``.
            method: ``"nuts"`` (NumPyro NUTS) or ``"svi"`` (NumPyro SVI, optax).
            key: a ``jax.random`` key (keyword-only, required).
            lengths: optional lengths of a padded array ``X``.
            prior_scale: standard deviation of the Gaussian prior on each unconstrained
                parameter.
            num_warmup: NUTS adaptation steps per chain.
            num_samples: NUTS draws kept per chain; SVI draws from the fitted guide.
            num_chains: NUTS chains (each starts from its own random initialization).
            chain_method: NUTS ``"sequential"``, ``"vectorized"`` or ``"parallel"``.
            target_accept_prob: NUTS target acceptance probability.
            max_tree_depth: NUTS maximum tree depth.
            guide: SVI guide, ``"normal"`` (mean field), ``"mvn"`` (full rank) or
                ``"delta"`` (point mass: the MAP).
            num_steps: SVI optimizer steps.
            optimizer: SVI optax optimizer (default ``optax.adam(1e-2)``).
            num_particles: SVI Monte Carlo samples per ELBO gradient.
            progress: show NumPyro's progress bar.

        Returns:
            ``self``, with ``posterior_draws_`` (`Seq2VecParams` with a leading
            ``(num_draws,)`` axis; NUTS: chains merged), ``params_`` (the posterior mean of
            each parameter, used by ``transform``), ``bayes_result_`` (NUTS: ArviZ
            ``InferenceData`` with one posterior variable per leaf named by its path,
            e.g. ``"encoder.forward.0.w_rec"``, ``sample_stats`` and the per-sequence
            ``log_likelihood`` for `arviz.loo`; SVI: a `statseq.SVIResult`) and
            ``method_``.

        Raises:
            ValueError: an unknown ``method`` or ``guide``, a non-positive count or
                ``prior_scale``, or bad data (as ``fit``).

        Examples:
            >>> import jax, statseq as ss
            >>> clf = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), pooling="mean")
            >>> clf.fit_bayes([[0.0, 1.0], [1.0]], [0, 1], method="hmc", key=jax.random.key(0))
            Traceback (most recent call last):
            ...
            ValueError: method must be one of ('nuts', 'svi'), got 'hmc'

            A fit (not run here: NUTS compiles for a few seconds; see
            ``tests/classify/test_seq2vec_bayes.py``)::

                rng = np.random.default_rng(0)
                X = [0.2 * rng.normal(size=rng.integers(3, 7)) + (n % 2) * 2 - 1
                     for n in range(8)]
                y = [n % 2 for n in range(8)]
                clf.fit_bayes(X, y, method="nuts", key=jax.random.key(0), prior_scale=3.0,
                              num_warmup=50, num_samples=150, num_chains=1,
                              max_tree_depth=4)
                clf.predict_proba([np.full(5, 0.3)])       # averaged over 150 draws
                az.summary(clf.bayes_result_)              # ArviZ InferenceData
                clf.fit_bayes(X, y, method="svi", guide="delta", key=jax.random.key(0))  # MAP
        """
        from statseq.classify.seq2vec_bayes import fit_bayes

        return fit_bayes(self, X, y, method=method, key=key, lengths=lengths,
                         prior_scale=prior_scale, num_warmup=num_warmup,
                         num_samples=num_samples, num_chains=num_chains,
                         chain_method=chain_method, target_accept_prob=target_accept_prob,
                         max_tree_depth=max_tree_depth, guide=guide, num_steps=num_steps,
                         optimizer=optimizer, num_particles=num_particles, progress=progress)

    def _check_fitted(self):
        if not hasattr(self, "params_"):
            raise ValueError(f"this {type(self).__name__} is not fitted yet: call fit(X, y) "
                             "or fit_bayes(X, y, ...)")

    def _pad(self, X, lengths=None, *, fitting=False):
        """``(x, lengths)``: real features (`pad_sequences`) or, for a model of integer
        tokens (``input_vocab`` given, or integer ``X`` at fit time), `pad_tokens`."""
        if fitting:
            vocab, dim = self.input_vocab, self.embed_dim
            for name, value in (("input_vocab", vocab), ("embed_dim", dim)):
                if value is not None and (isinstance(value, bool) or not isinstance(
                        value, int | np.integer) or value < 1):
                    raise ValueError(f"{name} must be a positive integer or None, got "
                                     f"{value!r}")
            if vocab is None and is_token_data(X):
                tokens, _ = pad_tokens(X, lengths)
                vocab = int(tokens.max()) + 1
            self.input_vocab_ = None if vocab is None else int(vocab)
        vocab = getattr(self, "input_vocab_", None)
        if vocab is None:
            return pad_sequences(X, lengths)
        return pad_tokens(X, lengths, vocab)

    def _inputs(self, X, lengths=None):
        self._check_fitted()
        x, lengths = self._pad(X, lengths)
        if x.shape[-1] != self.n_features_in_:
            raise ValueError(f"X has {x.shape[-1]} features per step but the model was fitted "
                             f"with {self.n_features_in_}")
        return x, lengths

    def transform(self, X, *, lengths=None) -> np.ndarray:
        """The pooled features ``z`` (or, for a labeller, the per-step ``h_t``)."""
        x, lengths = self._inputs(X, lengths)
        return np.asarray(_features_jit(self.encoder_, self._per_step, self.params_.encoder,
                                        x, lengths))

    def _predictive(self, X, lengths, kind, target=None, *, mix=True):
        """A predictive statistic (``kind``: ``"log_proba"``, ``"mean"`` or ``"log_prob"``
        of ``target``) at ``params_`` after ``fit``; after ``fit_bayes`` mixed over the
        posterior draws (``mix=False``: per draw, a leading axis). One compiled program."""
        x, lengths = self._inputs(X, lengths)
        draws = getattr(self, "posterior_draws_", None)
        bayes = draws is not None
        out = _predict_jit(self.encoder_, self.head_, self._per_step, bayes, kind,
                           bayes and mix, draws if bayes else self.params_, x, lengths,
                           None if target is None else jnp.asarray(target))
        return out, lengths

    def _bayes(self) -> bool:
        return getattr(self, "posterior_draws_", None) is not None


def _predict_stat(encoder, head, per_step, draws, kind, mix, params, x, lengths, target):
    def one(p):
        d = head.distribution(p.head, _features(encoder, per_step, p.encoder, x, lengths))
        if kind == "log_proba":
            return jax.nn.log_softmax(d.logits, axis=-1)
        if kind == "mean":
            return d.mean
        return d.log_prob(target)

    if not draws:
        return one(params)
    out = jax.vmap(one)(params)
    if not mix:
        return out
    if kind == "mean":
        return jnp.mean(out, axis=0)
    return jax.scipy.special.logsumexp(out, axis=0) - jnp.log(out.shape[0])


_predict_jit = jax.jit(_predict_stat, static_argnames=("encoder", "head", "per_step",
                                                       "draws", "kind", "mix"))


_DOC_ARGS = """
        encoder: a statseq neural model whose backbone encodes (``ss.GRU(hidden_dim=8)``,
            ``ss.LSTM(hidden_dim=8, num_layers=2)``, ``ss.Mamba(...)``, ``ss.LRU(...)``,
            ``ss.S4D(...)``, ``ss.WaveNet(...)`` for dilated convolutions, ...) or a
            `Backbone`; its emission fields are ignored. ``None``: ``ss.GRU(hidden_dim=16)``.
        bidirectional: add a backward backbone (same configuration, own weights).
        pooling: ``"last"``, ``"mean"``, ``"max"`` or ``"attention"`` (mask-aware).
        num_steps: optimizer steps (minibatches).
        batch_size: sequences per minibatch (at most the training set).
        learning_rate: Adam's step size.
        weight_decay: ``lambda`` of the penalty ``lambda/2 |theta|^2`` (unconstrained).
        validation: a fraction of the sequences held out for early stopping (``None``:
            none; the last parameters are kept).
        patience: evaluations without improvement before stopping.
        eval_every: steps between validation evaluations.
        random_state: integer seed of the initialization, split and minibatches.
        input_vocab: categorical inputs: ``X`` holds integer tokens ``0 .. K - 1`` (one
            per step), read through a learned embedding ``E[x_t]``
            (`statseq.classify.embedding.EmbeddedBackbone`); ``None``: tokens when ``X``
            is an integer array at ``fit`` (``K = max + 1``), else real features. A
            negative or out-of-range token is an error.
        embed_dim: size of a token's embedding (``None``: ``min(K, 16)``); tokens only.
"""


class SequenceClassifier(ClassifierMixin, _Seq2VecBase):
    """Discriminative sequence classifier ``c | x_{1:T} ~ Categorical(softmax(W z + b))``,
    ``z = pool(h_{1:T})`` of a (bidirectional) statseq backbone.

    ``X`` is a list of ``(T_n,)`` / ``(T_n, D)`` arrays of real values (ragged) or an
    ``(N, T[, D])`` array, or of integer tokens (``input_vocab``: text-like sequences read
    through a learned embedding); labels are any hashable values (``classes_`` orders
    them).

    Args:{args}        classes: the possible labels (``None``: the distinct training labels);
            given, a label outside it or a class with no sequence is an error.

    Attributes:
        classes_: the labels, in column order of ``predict_proba``.
        params_: fitted `Seq2VecParams` (after ``fit_bayes``: the posterior mean).
        loss_trace_: training loss (mean negative log-likelihood per sequence) per step
            (SVI: the negative ELBO per step; NUTS: ``None``).
        posterior_draws_: after ``fit_bayes``, `Seq2VecParams` with a leading draw axis
            (predictions average over them); ``None`` after ``fit``.
        bayes_result_: after ``fit_bayes``, ArviZ ``InferenceData`` (NUTS) or a
            `statseq.SVIResult`.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> rng = np.random.default_rng(0)
        >>> X = [rng.normal(size=8) + (n % 2) for n in range(20)]
        >>> y = [n % 2 for n in range(20)]
        >>> clf = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), pooling="mean",
        ...                             num_steps=40, learning_rate=0.1).fit(X, y)
        >>> clf.predict_proba(X).shape, clf.score(X, y) > 0.8
        ((20, 2), True)
    """

    def __init__(self, encoder=None, *, bidirectional=False, pooling="last", num_steps=300,
                 batch_size=32, learning_rate=0.01, weight_decay=0.0, validation=None,
                 patience=10, eval_every=10, random_state=0, classes=None,
                 input_vocab=None, embed_dim=None):
        self._store_init_args(locals())

    def _fit_inputs(self, X, y, lengths):
        """Padded ``x``, lengths, label codes, their mask and the head's configuration."""
        x, lengths = self._pad(X, lengths, fitting=True)
        codes = self._fit_codes(y, x.shape[0])
        head_kwargs = {"emission": "categorical", "num_classes": len(self.classes_)}
        return x, lengths, codes, np.ones(codes.shape, bool), head_kwargs

    def predict_log_proba(self, X, *, lengths=None) -> np.ndarray:
        """``log p(c | x_n)``, shape ``(N, num_classes)`` (columns: ``classes_``); after
        ``fit_bayes`` the posterior predictive ``log mean_s p(c | x_n, theta_s)``."""
        return np.asarray(self._predictive(X, lengths, "log_proba")[0])

    def predict_proba(self, X, *, lengths=None) -> np.ndarray:
        """``p(c | x_n)``, shape ``(N, num_classes)``; rows sum to 1."""
        return np.exp(self.predict_log_proba(X, lengths=lengths))

    def predict(self, X, *, lengths=None) -> np.ndarray:
        """The most probable label of each sequence."""
        log_proba = self.predict_log_proba(X, lengths=lengths)
        return self.classes_[np.argmax(log_proba, axis=-1)]

    def log_loss(self, X, y, *, lengths=None) -> float:
        """Mean negative log-probability of the true labels (nats per sequence)."""
        codes = self._encode(y, num_expected=len(self._pad(X, lengths)[1]))
        lp = self.predict_log_proba(X, lengths=lengths)
        return float(-np.mean(lp[np.arange(len(codes)), codes]))


class SequenceRegressor(_Seq2VecBase):
    """Sequence regression ``y | x_{1:T} ~ head(z)``, ``z = pool(h_{1:T})``: a Gaussian or
    Student-t head for real targets, Poisson or negative binomial for counts.

    Args:{args}        emission: ``"gaussian"``, ``"student_t"``, ``"poisson"`` or
            ``"negative_binomial"``.

    Attributes:
        params_: fitted `Seq2VecParams` (after ``fit_bayes``: the posterior mean).
        posterior_draws_: after ``fit_bayes``, the posterior draws (a leading axis);
            ``predict`` is then the posterior mean of the predictive mean, ``log_prob``
            the posterior predictive log-density.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> rng = np.random.default_rng(0)
        >>> X = [rng.normal(size=6) for _ in range(16)]
        >>> y = np.array([x.mean() for x in X])
        >>> reg = ss.SequenceRegressor(ss.ElmanRNN(hidden_dim=2), pooling="mean", num_steps=5)
        >>> reg.fit(X, y).predict(X).shape
        (16,)
    """

    _estimator_type = "regressor"

    def __init__(self, encoder=None, *, bidirectional=False, pooling="last", num_steps=300,
                 batch_size=32, learning_rate=0.01, weight_decay=0.0, validation=None,
                 patience=10, eval_every=10, random_state=0, emission="gaussian",
                 input_vocab=None, embed_dim=None):
        self._store_init_args(locals())

    def _fit_inputs(self, X, y, lengths):
        """Padded ``x``, lengths, targets ``(N,)`` / ``(N, D)``, their mask, head config."""
        allowed = ("gaussian", "student_t", "poisson", "negative_binomial")
        if self.emission not in allowed:
            raise ValueError(f"emission must be one of {allowed}, got {self.emission!r}")
        x, lengths = self._pad(X, lengths, fitting=True)
        target = _as_float(y, "y")
        if target.ndim not in (1, 2) or target.shape[0] != x.shape[0]:
            raise ValueError(f"y must be ({x.shape[0]},) or ({x.shape[0]}, D) to match X's "
                             f"{x.shape[0]} sequences, got shape {target.shape}")
        if not np.all(np.isfinite(target)):
            raise ValueError("y holds NaN or infinite targets")
        head_kwargs = {"emission": self.emission,
                       "emission_dim": None if target.ndim == 1 else target.shape[1]}
        head = make_head(feature_dim=1, **head_kwargs)
        head.validate(target, np.ones(target.shape, bool))
        self._target_ndim = target.ndim
        return x, lengths, target, np.ones(target.shape, bool), head_kwargs

    def predict(self, X, *, lengths=None) -> np.ndarray:
        """The predictive mean of each sequence's target (after ``fit_bayes``: its
        posterior mean, the mean over the draws)."""
        return np.asarray(self._predictive(X, lengths, "mean")[0])

    def log_prob(self, X, y, *, lengths=None) -> np.ndarray:
        """``log p(y_n | x_n)`` per sequence, shape ``(N,)`` (after ``fit_bayes``: the
        posterior predictive ``log mean_s p(y_n | x_n, theta_s)``)."""
        return np.asarray(self._predictive(X, lengths, "log_prob", _as_float(y, "y"))[0])

    def score(self, X, y, *, lengths=None) -> float:
        """Coefficient of determination ``R^2`` of `predict` (scikit-learn's regressor score)."""
        y = _as_float(y, "y")
        pred = self.predict(X, lengths=lengths)
        ss_res = np.sum((y - pred) ** 2)
        ss_tot = np.sum((y - y.mean(0)) ** 2)
        return float(1.0 - ss_res / ss_tot)


SequenceClassifier.__doc__ = SequenceClassifier.__doc__.replace("{args}", _DOC_ARGS)
SequenceRegressor.__doc__ = SequenceRegressor.__doc__.replace("{args}", _DOC_ARGS)


def pad_labels(y, lengths, num_timesteps) -> np.ndarray:
    """Per-step integer labels as a padded ``(N, T)`` array matching ``lengths``.

    Args:
        y: a list of ``(T_n,)`` integer arrays, or an ``(N, T)`` array.
        lengths: ``(N,)`` lengths of the input sequences.
        num_timesteps: the padded length ``T``.

    Returns:
        ``(N, T)`` int64 labels (0 in padding).

    Raises:
        ValueError: a sequence's label count differs from its input length, or labels are
            negative; TypeError: non-integer labels.

    Examples:
        >>> pad_labels([[0, 1, 1], [2]], [3, 1], 3).tolist()
        [[0, 1, 1], [2, 0, 0]]
    """
    lengths = np.asarray(lengths)
    if y is None:
        raise TypeError("y (the per-step labels) is None")
    if isinstance(y, list | tuple):
        if len(y) != len(lengths):
            raise ValueError(f"X holds {len(lengths)} sequences but y holds {len(y)} label "
                             "sequences: they must match one to one")
        rows = [np.asarray(r) for r in y]
    else:
        arr = np.asarray(y)
        if arr.ndim != 2 or arr.shape[0] != len(lengths):
            raise ValueError(f"y must be ({len(lengths)}, T) per-step labels or a list of "
                             f"label sequences, got shape {arr.shape}")
        rows = [arr[n, :lengths[n]] if arr.shape[1] >= lengths[n] else arr[n]
                for n in range(len(lengths))]
    out = np.zeros((len(lengths), num_timesteps), np.int64)
    for n, r in enumerate(rows):
        if r.ndim != 1 or r.shape[0] != lengths[n]:
            raise ValueError(f"sequence {n} has {lengths[n]} steps but {r.shape} labels: "
                             "one label per step is needed")
        if np.issubdtype(r.dtype, np.floating):
            if not np.all(np.isfinite(r)) or not np.all(r == np.round(r)):
                raise TypeError(f"labels of sequence {n} must be integers, got {r.dtype} "
                                "values that are not whole numbers")
        elif not np.issubdtype(r.dtype, np.integer) or r.dtype == bool:
            raise TypeError(f"labels of sequence {n} must be integers, got dtype {r.dtype}")
        if np.any(r < 0):
            raise ValueError(f"labels of sequence {n} must be >= 0, found {int(r.min())}")
        out[n, :lengths[n]] = r.astype(np.int64)
    return out


class SequenceLabeller(_Seq2VecBase):
    """Aligned sequence labelling ``c_t | x_{1:T} ~ Categorical(softmax(W h_t + b))`` with
    ``h_t`` the (bidirectional) backbone's state at step ``t``: one label per step.

    Labels are integers ``0 .. num_classes - 1``; ``X`` and ``y`` are ragged lists (or
    padded arrays with ``lengths``) with one label per input step.

    Args:{args}        num_classes: number of label values (``None``: ``max(y) + 1``); given,
            a label ``>= num_classes`` is an error.

    Attributes:
        classes_: ``arange(num_classes)``.
        params_: fitted `Seq2VecParams` (after ``fit_bayes``: the posterior mean).
        posterior_draws_: after ``fit_bayes``, the posterior draws (a leading axis) that
            the per-step predictive probabilities average over.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> rng = np.random.default_rng(0)
        >>> X = [rng.normal(size=7) for _ in range(8)]
        >>> y = [(x > 0).astype(int) for x in X]
        >>> lab = ss.SequenceLabeller(ss.ElmanRNN(hidden_dim=2), num_steps=40,
        ...                           learning_rate=0.1).fit(X, y)
        >>> [p.shape for p in lab.predict_proba(X[:2])], lab.score(X, y) > 0.9
        ([(7, 2), (7, 2)], True)
    """

    _per_step = True
    _estimator_type = "classifier"

    def __init__(self, encoder=None, *, bidirectional=False, num_steps=300, batch_size=32,
                 learning_rate=0.01, weight_decay=0.0, validation=None, patience=10,
                 eval_every=10, random_state=0, num_classes=None,
                 input_vocab=None, embed_dim=None):
        self._store_init_args(locals())

    pooling = "last"  # unused: the head reads every step

    def _fit_inputs(self, X, y, lengths):
        """Padded ``x``, lengths, per-step labels ``(N, T)``, the valid steps, head config."""
        x, lengths = self._pad(X, lengths, fitting=True)
        labels = pad_labels(y, lengths, x.shape[1])
        valid = np.arange(x.shape[1])[None, :] < lengths[:, None]
        top = int(labels[valid].max())
        if self.num_classes is None:
            num = max(top + 1, 2)
        else:
            num = int(self.num_classes)
            if num < 2:
                raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
            if top >= num:
                raise ValueError(f"label {top} is out of range for num_classes={num} "
                                 f"(labels must lie in 0..{num - 1})")
        self.classes_ = np.arange(num)
        head_kwargs = {"emission": "categorical", "num_classes": num}
        return x, lengths, labels, valid, head_kwargs

    def predict_log_proba(self, X, *, lengths=None) -> list[np.ndarray]:
        """Per-step ``log p(c_t | x)``: a list of ``(T_n, num_classes)`` arrays (after
        ``fit_bayes``: the posterior predictive, averaged over the draws)."""
        lp, lengths = self._predictive(X, lengths, "log_proba")
        lp = np.asarray(lp)
        return [lp[n, :lengths[n]] for n in range(len(lengths))]

    def predict_proba(self, X, *, lengths=None) -> list[np.ndarray]:
        """Per-step ``p(c_t | x)``: a list of ``(T_n, num_classes)`` arrays."""
        return [np.exp(a) for a in self.predict_log_proba(X, lengths=lengths)]

    def predict(self, X, *, lengths=None) -> list[np.ndarray]:
        """The most probable label at every step: a list of ``(T_n,)`` arrays."""
        return [np.argmax(a, axis=-1) for a in self.predict_log_proba(X, lengths=lengths)]

    def score(self, X, y, *, lengths=None) -> float:
        """Per-step accuracy over all steps (`labelling_accuracy`)."""
        return labelling_accuracy(self.predict_log_proba(X, lengths=lengths), y)

    def log_loss(self, X, y, *, lengths=None) -> float:
        """Mean negative log-probability per step (`labelling_log_loss`)."""
        return labelling_log_loss(self.predict_log_proba(X, lengths=lengths), y)


SequenceLabeller.__doc__ = SequenceLabeller.__doc__.replace("{args}", _DOC_ARGS.replace(
    "        pooling: ``\"last\"``, ``\"mean\"``, ``\"max\"`` or ``\"attention\"`` "
    "(mask-aware).\n", ""))


def _per_step_pairs(log_probs, y):
    lps = [np.asarray(a) for a in log_probs]
    lengths = np.array([a.shape[0] for a in lps])
    labels = pad_labels(y, lengths, int(lengths.max()))
    for n, a in enumerate(lps):
        if a.ndim != 2:
            raise ValueError(f"log_probs[{n}] must be (T_n, num_classes), got shape {a.shape}")
        if np.any(labels[n, :lengths[n]] >= a.shape[1]):
            raise ValueError(f"a label of sequence {n} is >= num_classes={a.shape[1]}")
    return lps, [labels[n, :lengths[n]] for n in range(len(lps))]


def labelling_log_loss(log_probs, y) -> float:
    """Mean per-step log loss ``-(1/sum T_n) sum_n sum_t log p(c_{n,t} | x_n)``.

    One footing for every labeller: the discriminative `SequenceLabeller` and the
    generative input-driven HMM (its posterior state marginals ``log p(z_t | x, ...)``).

    Args:
        log_probs: a list of ``(T_n, num_classes)`` per-step log-probabilities.
        y: per-step integer labels (a list of ``(T_n,)`` arrays).

    Returns:
        The mean negative log-probability of the true labels (nats per step).

    Examples:
        >>> import numpy as np
        >>> round(labelling_log_loss([np.log([[0.5, 0.5], [0.9, 0.1]])], [[0, 0]]), 4)
        0.3993
    """
    lps, labels = _per_step_pairs(log_probs, y)
    total = sum(float(-np.sum(a[np.arange(len(c)), c])) for a, c in zip(lps, labels, strict=True))
    return total / sum(len(c) for c in labels)


def labelling_accuracy(log_probs, y) -> float:
    """Fraction of steps whose most probable label is the true one.

    Args:
        log_probs: a list of ``(T_n, num_classes)`` per-step (log-)probabilities.
        y: per-step integer labels (a list of ``(T_n,)`` arrays).

    Returns:
        The per-step accuracy over all sequences.

    Examples:
        >>> import numpy as np
        >>> labelling_accuracy([np.log([[0.6, 0.4], [0.9, 0.1]])], [[0, 1]])
        0.5
    """
    lps, labels = _per_step_pairs(log_probs, y)
    hits = sum(int(np.sum(np.argmax(a, axis=-1) == c)) for a, c in zip(lps, labels, strict=True))
    return hits / sum(len(c) for c in labels)
