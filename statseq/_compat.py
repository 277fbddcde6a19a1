"""Work-arounds for interactions between statseq's dependencies."""

from __future__ import annotations

import sys
import warnings


def load_numpyro_fully() -> None:
    """Make every loaded numpyro submodule an attribute of its parent package.

    arviz 1.x registers numpyro as a lazily loaded module (``importlib.util.LazyLoader``)
    when it is imported before numpyro. Submodules imported through that lazy module
    (``import numpyro.distributions`` after ``import arviz``) are then missing as attributes
    of their parents, and numpyro's own ``numpyro.factor`` (which reads
    ``numpyro.distributions.distribution``) fails inside NUTS. Touching an attribute of the
    lazy module loads it; the loop then repairs any parent left without its submodule.
    """
    import numpyro

    numpyro.__version__  # noqa: B018 - loads a lazy module
    for name, module in list(sys.modules.items()):
        if not name.startswith("numpyro.") or module is None:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = sys.modules.get(parent_name)
        if parent is not None and getattr(parent, child, None) is None:
            setattr(parent, child, module)


def import_tqdm_quietly() -> None:
    """Import ``tqdm.auto`` once, without its notebook warning.

    numpyro (imported by statseq) imports ``tqdm.auto``, which in a Jupyter kernel without
    ipywidgets warns "IProgress not found" (a ``TqdmWarning``) and falls back to the plain
    text bar. statseq's progress bars are optional and work with the fallback, so the
    warning is noise: it opened every executed vignette. Importing the module here first,
    under a filter for exactly that message, silences it; later imports reuse the module.
    """
    try:
        from tqdm import TqdmWarning
    except ImportError:  # pragma: no cover - tqdm is a numpyro dependency
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)
        import tqdm.auto  # noqa: F401
