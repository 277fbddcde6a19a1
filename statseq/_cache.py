"""Persistent compilation cache: on by default, in a user cache directory.

In a statistician's script most of the wait is XLA compilation. statseq turns on JAX's
persistent compilation cache at import so a second run of the same script (or a second
process) skips compiling the same programs. Opt out by setting the environment variable
``STATSEQ_NO_COMPILATION_CACHE=1`` before importing statseq, or choose the directory with
``STATSEQ_CACHE_DIR``. A directory the user already configured in JAX is left alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax


def default_cache_dir() -> Path:
    """``$STATSEQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/statseq/jax``, else ``~/.cache/...``."""
    explicit = os.environ.get("STATSEQ_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "statseq" / "jax"


def enable_compilation_cache(path: str | os.PathLike | None = None) -> Path | None:
    """Point JAX's persistent compilation cache at ``path`` (default: the user cache dir).

    Returns the directory used, or ``None`` when the cache could not be set up (for
    example a read-only home directory); statseq then works without it.

    Examples:
        >>> import jax, tempfile, statseq as ss
        >>> keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
        ...         "jax_persistent_cache_min_entry_size_bytes")
        >>> saved = {k: getattr(jax.config, k) for k in keys}
        >>> path = ss.enable_compilation_cache(tempfile.mkdtemp())
        >>> jax.config.jax_compilation_cache_dir == str(path)
        True
        >>> for k, v in saved.items():                      # this example restores the settings
        ...     jax.config.update(k, v)
    """
    target = Path(path) if path is not None else default_cache_dir()
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(target))
    # statseq's programs are small and many: cache all of them (a new process then skips
    # even the sub-0.1 s compilations that add up to most of a first call).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return target


def _configure_on_import() -> None:
    if os.environ.get("STATSEQ_NO_COMPILATION_CACHE", "").strip() not in ("", "0"):
        return
    if getattr(jax.config, "jax_compilation_cache_dir", None):
        return  # the user chose a directory already
    enable_compilation_cache()
