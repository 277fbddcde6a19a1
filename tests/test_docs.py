"""The documentation stays true: README and guide code runs, API pages name real objects.

The full site build (``mkdocs build --strict``, which also executes the vignettes) runs in
``.ci/run``; these checks are the fast part of it that belongs in the test suite.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

SETUP_COMMANDS = [
    "python3 -m venv .venv && . .venv/bin/activate && pip install . && statseq demo",
    'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" '
    "&& python -m pytest -n auto",
]


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _run(code: str, tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    namespace: dict = {"__name__": "__docs__"}
    try:
        exec(compile(code, "<docs>", "exec"), namespace)
    finally:
        plt.close("all")
    return namespace


def test_readme_starts_with_the_setup_commands():
    lines = [line for line in README.read_text().splitlines() if line.strip()]
    assert lines[0].startswith("# ")
    commands = [line for line in lines[2:8] if line.startswith("python3 ")]
    assert commands == SETUP_COMMANDS


def test_readme_quick_start_runs(tmp_path, monkeypatch):
    blocks = _code_blocks(_section(README.read_text(), "Quick start"), "python")
    assert len(blocks) == 4
    # the last block (an LSTM and NUTS) runs with fewer steps and draws, else as written
    fast = (blocks[3].replace("num_steps=1000", "num_steps=50")
            .replace("num_chains=4)", "num_chains=2, num_warmup=50, num_samples=50)"))
    assert fast.count("num_steps=50") == 1 and "num_warmup=50" in fast
    ns = _run("\n".join(blocks[:3] + [fast]), tmp_path, monkeypatch)
    assert (tmp_path / "lynx_ar2.npz").exists()
    assert ns["model2"] == ns["model"]
    assert ns["lower"].shape == ns["upper"].shape == (10,)
    # the HMM block's comment quotes the published log-likelihood: keep it true
    assert abs(ns["em"].final_log_joint - (-342.32)) < 5e-3
    assert ns["states"].shape == ns["quakes"].shape
    # the state space block: the Nile MLE is Durbin and Koopman's (15099, 1469.1)
    assert abs(float(ns["mle"].params.obs_var) - 15099) < 2
    assert abs(float(ns["mle"].params.level_var) - 1469.1) < 0.5
    assert "AIC" in str(ns["ss"].summary(ns["ll"], ns["mle"].params, ns["nile"]))
    assert ns["level"].shape == (100, 1) and ns["lower"].shape == (10,)
    # the neural and Bayesian block: a posterior predictive forecast of the held-out decade
    assert ns["draws"].obs_var.shape == (2, 50)
    assert ns["fc"].samples.shape == (100, 10)
    assert np.all(np.isfinite(np.asarray(ns["ss"].evaluation.crps(ns["fc"], ns["test"]))))


def _doc_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md")) + sorted((DOCS / "api").glob("*.md"))


PAGES_WITH_CODE = [p for p in _doc_pages() if _code_blocks(p.read_text(), "python")]


def test_snippet_pages_are_found():
    # the pages below hold python blocks today; a page losing all of them is a regression
    names = {p.relative_to(DOCS).as_posix() for p in PAGES_WITH_CODE}
    assert {"index.md", "getting-started.md", "api/neural.md", "api/params.md",
            "api/bayes.md", "api/diagnostics.md", "api/interop.md"} <= names


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_docs_page_snippets_run(page, tmp_path, monkeypatch):
    """Every ```python block of every docs page runs; blocks of one page share a namespace."""
    blocks = _code_blocks(page.read_text(), "python")
    ns = _run("\n".join(blocks), tmp_path, monkeypatch)
    name = page.relative_to(DOCS).as_posix()
    if name == "index.md":
        assert ns["lower"].shape == (10,)
    elif name == "getting-started.md":
        assert ns["fc"].samples.shape == (2000, 10)
        assert ns["states"].shape == ns["quakes"].shape
        # the Nile MLE is Durbin and Koopman's (2012, sec. 2.10.3): (15099, 1469.1)
        assert abs(float(ns["mle"].params.obs_var) - 15099) < 2
        assert ns["exact"].mean.shape == (10,)
    elif name == "api/params.md":
        # the page's claim: this restricted state space model is SARIMAX(2, 0, 0) plus
        # measurement error; statsmodels fits that model to the same data
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        peer = SARIMAX(ns["y"], order=(2, 0, 0), trend="n", measurement_error=True)
        llf = peer.fit(disp=False).llf
        assert abs(ns["fit"].final_log_joint - llf) < 1e-4
    elif name == "api/neural.md":
        assert ns["fc"].samples.shape[-1] == 24
        fit = ns["fit"]
        assert np.all(np.isfinite(np.asarray(fit.log_joint)[: fit.num_iterations]))


def _api_targets() -> list[str]:
    targets = []
    for page in sorted((DOCS / "api").glob("*.md")):
        targets += re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), flags=re.M)
    return targets


@pytest.mark.parametrize("target", _api_targets())
def test_api_reference_targets_import(target):
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return
    pytest.fail(f"{target} does not import")


def test_nav_pages_exist():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield value

    missing = [p for p in pages(config["nav"]) if not (DOCS / p).exists()]
    assert not missing, f"nav names missing pages: {missing}"


# ---- every public name has a runnable example ----------------------------------------------

# statseq's top level and the public subpackages whose modules the docs/api pages document;
# their ``__all__`` is the public API. The examples run as doctests (``--doctest-modules``).
PUBLIC_PACKAGES = [
    "statseq",
    "statseq.bayes",
    "statseq.classify",
    "statseq.datasets",
    "statseq.evaluation",
    "statseq.interop",
    "statseq.models.hmm",
    "statseq.models.neural",
    "statseq.models.ssm",
    "statseq.models.switching",
]


def _public_objects() -> dict[str, object]:
    import inspect

    found: dict[int, tuple[str, object]] = {}
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj):
                found.setdefault(id(obj), (f"{package}.{name}", obj))  # constants have no docstring
    return dict(found.values())


def _has_example(obj) -> bool:
    import inspect

    doc = inspect.getdoc(obj) or ""
    match = re.search(r"^Examples:[ \t]*$", doc, flags=re.M)
    return match is not None and re.search(r"^\s+>>> \S", doc[match.end():], flags=re.M) is not None


def test_public_api_is_enumerated():
    objects = _public_objects()
    assert len(objects) >= 140
    assert {"statseq.AR", "statseq.fit_em", "statseq.models.hmm.PoissonEmissions"} <= set(objects)


def test_example_detector():
    def with_example():
        """Doc.

        Examples:
            >>> 1 + 1
            2
        """

    def without():
        """Doc. >>> not in an Examples section."""

    assert _has_example(with_example) and not _has_example(without)


def test_every_public_name_has_an_example():
    missing = sorted(name for name, obj in _public_objects().items() if not _has_example(obj))
    assert not missing, f"{len(missing)} public names have no `Examples:` with `>>>`: {missing}"


def test_public_examples_are_collected_as_doctests():
    """The examples above run: each object's defining module is under ``statseq/`` (where
    pytest's ``--doctest-modules`` collects) and the pytest config turns doctests on."""
    import inspect
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--doctest-modules" in config["addopts"] and "statseq" in config["testpaths"]
    for name, obj in _public_objects().items():
        source = Path(inspect.getsourcefile(obj)).resolve()
        assert (ROOT / "statseq") in source.parents, name


# ---- no TqdmWarning in executed vignettes --------------------------------------------------

_FAKE_KERNEL = """
import sys, types, warnings
class ZMQInteractiveShell:  # what tqdm.autonotebook looks for (older and newer tqdm)
    config = {"IPKernelApp": {}}
sys.modules["IPython"] = types.SimpleNamespace(get_ipython=lambda: ZMQInteractiveShell())
sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import MODULE
print([type(w.message).__name__ for w in caught if "IProgress" in str(w.message)])
"""


def _import_in_fake_kernel(module: str) -> str:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "STATSEQ_NO_COMPILATION_CACHE": "1"}
    out = subprocess.run([sys.executable, "-c", _FAKE_KERNEL.replace("MODULE", module)],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_importing_statseq_in_a_notebook_kernel_shows_no_tqdm_warning():
    """numpyro imports tqdm.auto, which warns "IProgress not found" in a Jupyter kernel
    without ipywidgets: that cell opened every vignette page. statseq imports it quietly."""
    import importlib.util

    if importlib.util.find_spec("ipywidgets") is not None:
        pytest.skip("ipywidgets is installed: tqdm.auto does not warn")
    assert _import_in_fake_kernel("tqdm.auto") == "['TqdmWarning']"  # the control warns
    assert _import_in_fake_kernel("statseq") == "[]"


# ---- the docs build runs the vignettes longest first -----------------------------------------


def test_vignettes_execute_longest_first(monkeypatch):
    """docs/hooks.py starts the longest vignette first, a vignette without a measured cost
    right after it (a new one may be long), then the rest by decreasing cost: with two
    kernels the build then never waits on one long vignette started last."""
    import importlib.util

    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("statseq_docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    # the table names only vignettes that exist, with positive costs
    names = {p.stem for p in (ROOT / "vignettes").glob("*.py")}
    assert set(hooks.FULL_MODE_CPU_S) <= names
    assert all(c > 0 for c in hooks.FULL_MODE_CPU_S.values())
    monkeypatch.setattr(hooks, "FULL_MODE_CPU_S", {"a": 10, "b": 90, "c": 30, "d": 30})
    paths = [Path(f"{n}.py") for n in ("a", "b", "c", "d", "new", "newer")]
    order = [p.stem for p in hooks._schedule(paths)]
    assert order == ["b", "new", "newer", "c", "d", "a"]


def test_docs_smoke_switch_sets_the_vignettes_mode(monkeypatch):
    """STATSEQ_DOCS_SMOKE=1 (set by .ci/run) makes the docs build execute the vignettes in
    smoke mode; without it the build is full mode even if the tests' STATSEQ_SMOKE is set.
    The vignette kernels inherit this process's environment, so that is what is checked.
    MPLBACKEND is removed in both modes so that the kernels draw inline figures."""
    import importlib.util
    import os

    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("statseq_docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    config = {"config_file_path": str(ROOT / "mkdocs.yml"), "nav": [{"Vignettes": []}]}
    for switch, smoke in (("1", "1"), ("0", None), ("", None)):
        monkeypatch.setenv("STATSEQ_DOCS_SMOKE", switch)
        monkeypatch.setenv("STATSEQ_SMOKE", "1")
        monkeypatch.setenv("MPLBACKEND", "Agg")
        monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
        out = hooks.on_config(config)
        assert hooks.docs_smoke() is (smoke == "1")
        # smoke kernels compile at -O0 (compile-bound, no numbers asserted); full stays as set
        assert ("--xla_backend_optimization_level=0" in os.environ["XLA_FLAGS"]) is (
            smoke == "1")
        # and, on jaxlib 0.10.x only (0.12 aborts on the unknown flag), the older emitters
        old_emitters = smoke == "1" and hooks._jaxlib_version().startswith("0.10.")
        assert ("--xla_cpu_use_fusion_emitters=false" in os.environ["XLA_FLAGS"]) is old_emitters
        assert "--xla_cpu_enable_fast_math=false" in os.environ["XLA_FLAGS"]
        assert os.environ.get("STATSEQ_SMOKE") == smoke
        assert os.environ.get("MPLBACKEND") is None
        assert out["nav"][0]["Vignettes"][0] == {"Overview": "vignettes/index.md"}
    (vignettes,) = [p for p in out["nav"] if "Vignettes" in p]
    assert len(vignettes["Vignettes"]) == 1 + len(list((ROOT / "vignettes").glob("*.py")))
