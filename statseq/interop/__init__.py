"""Conversion between statseq models and those of other libraries.

`statseq.interop.dynamax` converts to and from dynamax (imported lazily: dynamax, and the
TensorFlow Probability it pulls in, load only when a conversion runs).
"""

from statseq.interop.dynamax import from_dynamax, to_dynamax

__all__ = ["from_dynamax", "to_dynamax"]
