"""Discriminative seq2vec models: the bidirectional ragged encoder, pooling, gradients, a
tiny fit, scikit-learn conventions and clear errors."""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

import statseq as ss
from statseq.classify.seq2vec import (
    Seq2VecParams,
    SequenceEncoder,
    _sum_log_lik,
    encoder_backbone,
    labelling_accuracy,
    labelling_log_loss,
    pad_labels,
    pad_sequences,
    reverse_within_lengths,
)
from statseq.models.neural.heads import make_head

LENGTHS = [6, 3, 1, 4]


@pytest.fixture(scope="module")
def ragged():
    rng = np.random.default_rng(0)
    seqs = [rng.normal(size=(n, 2)) for n in LENGTHS]
    x, lengths = pad_sequences(seqs)
    return seqs, x, lengths


@pytest.fixture(scope="module", params=["gru", "wavenet"])
def bidir(request):
    model = (ss.GRU(hidden_dim=3) if request.param == "gru"
             else ss.WaveNet(hidden_dim=3, num_layers=2, kernel_size=2))
    enc = SequenceEncoder(encoder_backbone(model, 2), bidirectional=True, pooling="attention")
    params = enc.init_params(jax.random.key(1))
    return enc, params, jax.jit(enc.states), jax.jit(enc.backbone.sequence)


def test_reverse_within_lengths_is_an_involution():
    x = jnp.arange(12.0).reshape(2, 6)
    lengths = jnp.array([6, 4])
    r = reverse_within_lengths(x, lengths)
    np.testing.assert_array_equal(r[1], [9.0, 8.0, 7.0, 6.0, 10.0, 11.0])
    np.testing.assert_array_equal(reverse_within_lengths(r, lengths), x)


def test_bidirectional_ragged_batch_equals_each_sequence_alone(ragged, bidir):
    seqs, x, lengths = ragged
    enc, params, states, sequence = bidir
    hs = np.asarray(states(params, x, lengths))
    h, num_t = enc.backbone.output_dim, x.shape[1]

    def pad(a):  # a sequence alone, trailing zeros to the batch's length (one compile)
        return np.concatenate([a, np.zeros((num_t - len(a), 2))])

    for n, s in enumerate(seqs):
        num = len(s)
        alone = np.asarray(states(params, pad(s)[None], np.array([num])))[0]
        np.testing.assert_allclose(hs[n, :num], alone[:num], rtol=1e-12, atol=1e-12)
        # the backward half is the forward backbone (backward weights) on the reversed seq
        back = np.asarray(sequence(params.backward, pad(s[::-1])))[:num][::-1]
        np.testing.assert_allclose(hs[n, :num, h:], back, rtol=1e-12, atol=1e-12)
        fwd = np.asarray(sequence(params.forward, pad(s)))[:num]
        np.testing.assert_allclose(hs[n, :num, :h], fwd, rtol=1e-12, atol=1e-12)


def test_pooling_ignores_padding(ragged):
    seqs, x, lengths = ragged
    backbone = encoder_backbone(ss.ElmanRNN(hidden_dim=3), 2)
    encs = [SequenceEncoder(backbone, True, p) for p in ("last", "mean", "max", "attention")]
    params = encs[-1].init_params(jax.random.key(2))  # the others ignore the attention

    @jax.jit  # every pooling and the states in one program
    def pools(x):
        return [e.pool(params, x, lengths) for e in encs], encs[0].states(params, x, lengths)

    z, all_states = pools(x)
    valid = np.arange(x.shape[1])[None, :, None] < lengths[:, None, None]
    junk = np.where(valid, x, 1e3 * np.random.default_rng(3).normal(size=x.shape))
    nan = np.where(valid, x, np.nan)
    for other in (junk, nan):
        for a, b in zip(pools(other)[0], z, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # and each pooled vector equals the sequence's own states pooled by hand
    w = np.asarray(params.attention)
    for n, s in enumerate(seqs):
        hs = np.asarray(all_states)[n, :len(s)]
        expected = [np.concatenate([hs[-1, :3], hs[0, 3:]]), hs.mean(0), hs.max(0),
                    np.asarray(jax.nn.softmax(hs @ w)) @ hs]
        for got, want in zip(z, expected, strict=True):
            np.testing.assert_allclose(np.asarray(got)[n], want, rtol=1e-12, atol=1e-12)


def test_gradient_matches_finite_differences(ragged):
    _, x, lengths = ragged
    enc = SequenceEncoder(encoder_backbone(ss.ElmanRNN(hidden_dim=2), 2), True, "attention")
    head = make_head("categorical", feature_dim=enc.feature_dim, num_classes=3)
    key_e, key_h, key_d = jax.random.split(jax.random.key(4), 3)
    params = Seq2VecParams(enc.init_params(key_e),
                           head.init_params(key_h, np.array([0, 1, 2]), np.ones(3, bool)))
    y = jnp.array([0, 2, 1, 1])
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    direction = jax.random.normal(key_d, flat.shape, flat.dtype)

    def f(v):
        return _sum_log_lik(enc, head, False, unravel(v), x, lengths, y)

    f_and_grad = jax.jit(jax.value_and_grad(f))  # one program for the value and gradient
    _, grad = f_and_grad(flat)
    eps = 1e-6
    fd = (f_and_grad(flat + eps * direction)[0]
          - f_and_grad(flat - eps * direction)[0]) / (2 * eps)
    np.testing.assert_allclose(float(grad @ direction), float(fd), rtol=1e-7)
    assert float(jnp.linalg.norm(grad)) > 1e-3


@pytest.fixture(scope="module")
def two_classes():
    rng = np.random.default_rng(5)
    # class 1 drifts upward within the sequence, class 0 downward; same marginal mean
    X, y = [], []
    for n in range(24):
        t = rng.integers(4, 9)
        slope = 1.0 if n % 2 else -1.0
        X.append(slope * (np.arange(t) - (t - 1) / 2) / 3 + 0.3 * rng.normal(size=t))
        y.append("up" if n % 2 else "down")
    return X, np.array(y)


@pytest.fixture(scope="module")
def fitted(two_classes):
    X, y = two_classes
    clf = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=3), bidirectional=True,
                                pooling="mean", num_steps=60, batch_size=12,
                                learning_rate=0.1, random_state=0)
    return clf.fit(X, y)


def test_tiny_fit_separates_two_classes(fitted, two_classes):
    X, y = two_classes
    assert fitted.loss_trace_[-1] < 0.5 * fitted.loss_trace_[0]
    assert fitted.score(X, y) == 1.0
    proba = fitted.predict_proba(X)
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-12)
    assert set(fitted.predict(X)) <= {"up", "down"}
    assert list(fitted.classes_) == ["down", "up"]
    codes = (y == "up").astype(int)
    expected = -np.mean(np.log(proba[np.arange(len(y)), codes]))
    assert fitted.log_loss(X, y) == pytest.approx(expected, rel=1e-10)
    # a padded array with lengths gives the same predictions as the ragged list
    x, lengths = pad_sequences(X)
    np.testing.assert_allclose(fitted.predict_proba(x, lengths=lengths), proba, rtol=1e-12)


def test_sklearn_conventions(fitted):
    from sklearn.base import clone

    twin = clone(fitted)
    assert not hasattr(twin, "params_")
    assert twin.get_params(deep=False)["pooling"] == "mean"
    assert twin.get_params()["encoder__hidden_dim"] == 3
    twin.set_params(encoder__hidden_dim=5, pooling="max")
    assert twin.encoder.hidden_dim == 5 and twin.pooling == "max"
    assert fitted.encoder.hidden_dim == 3


def test_labelling_metrics_and_labels():
    lp = [np.log([[0.5, 0.5], [0.9, 0.1]]), np.log([[0.2, 0.8]])]
    y = [[0, 1], [1]]
    assert labelling_log_loss(lp, y) == pytest.approx(
        -(np.log(0.5) + np.log(0.1) + np.log(0.8)) / 3, rel=1e-12)
    assert labelling_accuracy(lp, y) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="num_classes"):
        labelling_log_loss(lp, [[0, 2], [1]])
    np.testing.assert_array_equal(pad_labels([[1, 0], [2]], [2, 1], 3),
                                  [[1, 0, 0], [2, 0, 0]])


def test_bad_input_gives_clear_errors(two_classes):
    X, y = two_classes
    clf = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), num_steps=2)
    with pytest.raises(ValueError, match="24 sequences but y holds 23"):
        clf.fit(X, y[:-1])
    with pytest.raises(ValueError, match="no training sequence"):
        ss.SequenceClassifier(classes=["down", "up", "flat"], num_steps=2).fit(X, y)
    with pytest.raises(ValueError, match="not one of the classes"):
        ss.SequenceClassifier(classes=["down", "flat"], num_steps=2).fit(X, y)
    with pytest.raises(ValueError, match="non-integer"):
        clf.fit(X, np.linspace(0.1, 0.9, 24))
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        clf.fit([X[0], np.zeros(0)], [0, 1])
    with pytest.raises(ValueError, match="no sequences"):
        clf.fit([], [])
    with pytest.raises(ValueError, match="NaN or infinite"):
        clf.fit([X[0], np.array([1.0, np.nan])], [0, 1])
    with pytest.raises(ValueError, match="lengths must lie"):
        clf.fit(np.zeros((2, 3)), [0, 1], lengths=np.array([3, 0]))
    with pytest.raises(TypeError, match="real numbers"):
        clf.fit([np.array(["a", "b"]), np.array(["c"])], [0, 1])
    with pytest.raises(ValueError, match="pooling"):
        ss.SequenceClassifier(pooling="median").fit(X, y)
    with pytest.raises(TypeError, match="statseq neural model"):
        ss.SequenceClassifier(encoder="gru").fit(X, y)
    with pytest.raises(ValueError, match="not fitted"):
        clf.predict(X)
    lab = ss.SequenceLabeller(ss.ElmanRNN(hidden_dim=2), num_steps=2, num_classes=2)
    labels = [np.zeros(len(s), int) for s in X]
    with pytest.raises(ValueError, match="out of range"):
        lab.fit(X, [lab_ + 2 for lab_ in labels])
    with pytest.raises(ValueError, match="sequence 0 has 7 steps but"):
        lab.fit(X, [labels[0][:-1]] + labels[1:])
    with pytest.raises(TypeError, match="must be integers"):
        lab.fit(X, [lab_ + 0.5 for lab_ in labels])
    with pytest.raises(ValueError, match="must be >= 0"):
        lab.fit(X, [lab_ - 1 for lab_ in labels])
    with pytest.raises(ValueError, match="24 sequences but y holds 3"):
        lab.fit(X, labels[:3])
    reg = ss.SequenceRegressor(ss.ElmanRNN(hidden_dim=2), emission="poisson", num_steps=2)
    with pytest.raises(ValueError, match="non-negative integer counts"):
        reg.fit(X, -np.ones(24))
    with pytest.raises(ValueError, match="must be"):
        reg.fit(X, np.ones(23))
