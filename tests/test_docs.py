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


def test_docs_home_page_example_runs(tmp_path, monkeypatch):
    (code,) = _code_blocks((DOCS / "index.md").read_text(), "python")
    ns = _run(code, tmp_path, monkeypatch)
    assert ns["lower"].shape == (10,)


def test_getting_started_runs(tmp_path, monkeypatch):
    blocks = _code_blocks((DOCS / "getting-started.md").read_text(), "python")
    assert blocks
    ns = _run("\n".join(blocks), tmp_path, monkeypatch)
    assert ns["fc"].samples.shape == (2000, 10)


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
