"""seq2vec with categorical (integer token) inputs: the learned embedding equals one-hot
inputs through a linear layer with the same weights, a tiny fit separates two token
classes, and bad tokens give clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.classify.embedding import EmbeddedBackbone, pad_tokens
from statseq.classify.seq2vec import EncoderParams, SequenceEncoder

VOCAB = 4


def _token_data(seed, per_class):
    """Ragged token sequences: class "ab" draws from tokens {0, 3}, class "cd" from {1, 2}.
    Both have mean token 1.5, so the classes differ in which tokens occur, not in their
    average value."""
    rng = np.random.default_rng(seed)
    X, labels = [], []
    for label, alphabet in (("ab", [0, 3]), ("cd", [1, 2])):
        for _ in range(per_class):
            X.append(rng.choice(alphabet, size=int(rng.integers(3, 7))))
            labels.append(label)
    return X, np.array(labels)


@pytest.fixture(scope="module")
def token_clf():
    X, c = _token_data(0, 8)
    clf = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), pooling="mean", num_steps=40,
                                learning_rate=0.1, embed_dim=2).fit(X, c)
    return clf, X, c


def test_embedding_equals_one_hot_inputs_through_a_linear_layer(token_clf):
    """The token classifier's features and class posteriors equal those of the same
    backbone fed onehot(x_t) @ E (a linear layer with the embedding as its weights)."""
    clf, X, _ = token_clf
    assert clf.input_vocab_ == VOCAB and isinstance(clf.encoder_.backbone, EmbeddedBackbone)
    tokens, lengths = pad_tokens(X, vocab_size=VOCAB)
    table = clf.params_.encoder.forward.embedding  # (K, d)
    one_hot = jax.nn.one_hot(tokens[..., 0].astype(int), VOCAB, dtype=table.dtype)
    x_real = jnp.einsum("ntk,kd->ntd", one_hot, table)
    inner = clf.encoder_.backbone.backbone
    plain = SequenceEncoder(inner, False, "mean")
    z_ref = jax.jit(plain.pool)(EncoderParams(clf.params_.encoder.forward.backbone, None, None),
                                x_real, lengths)
    np.testing.assert_allclose(clf.transform(X), z_ref, rtol=1e-12, atol=1e-14)
    logits = clf.head_.distribution(clf.params_.head, z_ref).logits
    np.testing.assert_allclose(clf.predict_log_proba(X), jax.nn.log_softmax(logits, -1),
                               rtol=1e-12, atol=1e-14)
    # bidirectional: each direction reads E[x_t] through its own table, the backward one
    # the sequence reversed within its length
    bb = EmbeddedBackbone(inner, VOCAB, 2)
    enc = SequenceEncoder(bb, True, "last")
    params = enc.init_params(jax.random.key(2))
    hs = jax.jit(enc.states)(params, tokens, lengths)
    n, length = 1, int(lengths[1])
    seq = tokens[n, :length, 0].astype(int)
    run = jax.jit(inner.sequence)
    ref_f = run(params.forward.backbone, params.forward.embedding[seq])
    ref_b = run(params.backward.backbone, params.backward.embedding[seq[::-1]])[::-1]
    np.testing.assert_allclose(hs[n, :length], np.hstack([ref_f, ref_b]), rtol=1e-12,
                               atol=1e-14)


def test_tiny_token_fit_separates_two_token_classes(token_clf):
    clf, X, c = token_clf
    Xt, ct = _token_data(1, 6)
    assert clf.score(Xt, ct) == 1.0
    assert clf.log_loss(Xt, ct) < 0.3
    assert clf.loss_trace_[-1] < clf.loss_trace_[0]
    # a padded integer array with lengths is the same data
    tokens, lengths = pad_tokens(Xt)
    np.testing.assert_allclose(clf.predict_proba(tokens[..., 0].astype(int), lengths=lengths),
                               clf.predict_proba(Xt), rtol=1e-12)


def test_bad_tokens_give_clear_errors(token_clf):
    clf, X, c = token_clf
    with pytest.raises(ValueError, match="token 4, out of range for input_vocab=4"):
        clf.predict([np.array([0, 4, 1])])
    with pytest.raises(ValueError, match="negative token -1"):
        clf.predict([np.array([0, -1])])
    with pytest.raises(TypeError, match="integer tokens"):
        clf.predict([np.array([0.5, 1.0])])
    small = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), num_steps=1, input_vocab=3)
    with pytest.raises(ValueError, match="token 3, out of range for input_vocab=3"):
        small.fit(X, c)
    with pytest.raises(ValueError, match="negative token -2"):
        ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), num_steps=1).fit(
            [np.array([1, -2]), np.array([0, 1])], [0, 1])
    with pytest.raises(ValueError, match="input_vocab must be a positive integer"):
        ss.SequenceClassifier(input_vocab=0, num_steps=1).fit(X, c)
    with pytest.raises(ValueError, match="token sequence 0 must be"):
        pad_tokens([np.zeros((3, 2), int)], vocab_size=4)
    # real-valued inputs are unchanged: floats stay real features
    real = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2))
    x, _ = real._pad([s.astype(float) + 0.5 for s in X], fitting=True)
    assert real.input_vocab_ is None
    np.testing.assert_array_equal(x[0, :len(X[0]), 0], X[0] + 0.5)
