"""NGram: smoothed n-gram Markov chains, against probabilities counted by hand."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

import statseq as ss

Y = np.array([0, 1, 0, 1, 2])  # the tiny training string, C = 3 symbols


def test_witten_bell_trigram_by_hand():
    # Counted by hand from Y (Chen & Goodman 1998, interpolated Witten-Bell, eq. 13):
    # unigram: c = (2, 2, 1), N = 5, N1+ = 3, p0(w) = (c(w) + 3/3) / (5 + 3) = (3, 3, 2)/8
    p0 = [F(3, 8), F(3, 8), F(2, 8)]
    # bigram after 0: c(0,1) = 2, c(0) = 2, N1+(0.) = 1: p1(w|0) = (c + p0(w)) / 3
    p1_0 = [F(1, 8), F(19, 24), F(1, 12)]
    # bigram after 1: c(1,0) = c(1,2) = 1, c(1) = 2, N1+ = 2: (c + 2 p0(w)) / 4
    p1_1 = [F(7, 16), F(3, 16), F(3, 8)]
    # trigram after (0,1): c = (1, 0, 1), c(h) = 2, N1+ = 2: (c + 2 p1(w|1)) / 4
    p2_01 = [F(15, 32), F(3, 32), F(14, 32)]
    # trigram after (1,0): c = (0, 1, 0), c(h) = 1, N1+ = 1: (c + p1(w|0)) / 2
    p2_10 = [F(1, 16), F(43, 48), F(1, 24)]
    for p in (p0, p1_0, p1_1, p2_01, p2_10):
        assert sum(p) == 1
    model = ss.NGram(order=3, num_classes=3)
    counts = model.fit(Y)
    cases = [([], p0), ([0], p1_0), ([1], p1_1), ([2], p0),  # 2 never a context: backs off
             ([0, 1], p2_01), ([1, 0], p2_10), ([2, 2], p0), ([1, 1], p1_1),
             ([2, 0, 1], p2_01)]  # only the last order - 1 symbols count
    for history, expected in cases:
        got = model.predictive(counts, np.array(history, dtype=int))
        np.testing.assert_allclose(got, [float(v) for v in expected], rtol=1e-14,
                                   err_msg=str(history))
    lp = model.log_probs(counts, Y)
    expected = [p0[0], p1_0[1], p2_01[0], p2_10[1], p2_01[2]]
    np.testing.assert_allclose(lp, np.log([float(v) for v in expected]), rtol=1e-14)
    assert model.num_params(counts) == 3 + 3 + 3  # distinct 1-, 2- and 3-grams


def test_add_k_trigram_by_hand():
    model = ss.NGram(order=3, num_classes=3, smoothing="add_k", k=0.5)
    counts = model.fit(Y)
    # (c(h, w) + 1/2) / (c(h) + 3/2) with the longest context available
    expected = [F(5, 2) / F(13, 2),  # unigram 0: c = 2, N = 5
                F(5, 2) / F(7, 2),  # 1 after 0: 2 of 2
                F(3, 2) / F(7, 2),  # 0 after (0, 1): 1 of 2
                F(3, 2) / F(5, 2),  # 1 after (1, 0): 1 of 1
                F(3, 2) / F(7, 2)]  # 2 after (0, 1): 1 of 2
    np.testing.assert_allclose(model.log_probs(counts, Y),
                               np.log([float(v) for v in expected]), rtol=1e-14)
    # an unseen context gives the uniform distribution
    np.testing.assert_allclose(model.predictive(counts, np.array([2, 2])), [1 / 3] * 3)


@pytest.mark.parametrize("smoothing", ["witten_bell", "add_k"])
def test_normalized_and_consistent(smoothing):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=(3, 60))
    model = ss.NGram(order=4, num_classes=4, smoothing=smoothing, k=0.3)
    counts = model.fit(y)
    lp = model.log_probs(counts, y)
    assert lp.shape == (3, 60)
    for b in range(3):
        for t in (0, 1, 2, 3, 17, 59):
            p = model.predictive(counts, y[b, :t])
            assert p.sum() == pytest.approx(1.0, abs=1e-12) and (p > 0).all()
            assert lp[b, t] == pytest.approx(np.log(p[y[b, t]]), rel=1e-12)


def test_batch_counts_do_not_span_sequences():
    model = ss.NGram(order=2, num_classes=3)
    joined = model.fit(np.array([0, 1, 2, 0]))  # has the bigram (1, 2)
    split = model.fit(np.array([[0, 1], [2, 0]]))  # does not
    assert 1 * 3 + 2 in joined.pair_keys[1]
    assert 1 * 3 + 2 not in split.pair_keys[1]
    np.testing.assert_array_equal(joined.pair_counts[0], split.pair_counts[0])


def test_sample():
    model = ss.NGram(order=1, num_classes=3)
    counts = model.fit(Y)
    draws = model.sample(counts, 4000, seed=0)
    assert draws.shape == (4000,) and draws.dtype == np.int64
    freq = np.bincount(draws, minlength=3) / draws.size
    np.testing.assert_allclose(freq, [3 / 8, 3 / 8, 2 / 8], atol=4 * np.sqrt(0.25 / 4000))
    np.testing.assert_array_equal(draws, model.sample(counts, 4000, seed=0))
    # after the prompt (0, 1, 0) a bigram model of the alternating string draws 1 first
    alt = ss.NGram(order=2, num_classes=3)
    c2 = alt.fit(np.tile([0, 1], 200))
    firsts = [alt.sample(c2, 1, seed=s, prompt=[0, 1, 0])[0] for s in range(20)]
    assert firsts.count(1) >= 19


def test_bad_input():
    with pytest.raises(ValueError, match="order"):
        ss.NGram(order=0, num_classes=3)
    with pytest.raises(ValueError, match="num_classes"):
        ss.NGram(order=2, num_classes=1)
    with pytest.raises(ValueError, match="smoothing"):
        ss.NGram(order=2, num_classes=3, smoothing="kneser")
    with pytest.raises(ValueError, match="k must"):
        ss.NGram(order=2, num_classes=3, smoothing="add_k", k=0.0)
    model = ss.NGram(order=2, num_classes=3)
    with pytest.raises(ValueError, match="0..2"):
        model.fit(np.array([0, 3]))
    with pytest.raises(TypeError, match="integer"):
        model.fit(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="1-D"):
        model.fit(np.zeros((2, 2, 2), dtype=int))
