"""Every vignette runs top to bottom in fast smoke mode (STATSEQ_SMOKE=1)."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

VIGNETTES = sorted((Path(__file__).resolve().parents[1] / "vignettes").glob("*.py"))
# vignettes whose numbers a dedicated test checks: that test runs them (once, in the same
# smoke mode), so they are not run a second time here
RUN_ELSEWHERE = {"04_neural_sequence_models": "tests/test_neural_vignette.py",
                 "06_markov_switching": "tests/test_ms_vignette_numbers.py"}


def test_there_are_vignettes():
    assert VIGNETTES, "no vignettes found"


@pytest.mark.parametrize("path", VIGNETTES, ids=[p.stem for p in VIGNETTES])
def test_vignette_runs(path, monkeypatch):
    if os.environ.get("STATSEQ_DOCS_BUILD_RUNS_VIGNETTES") == "1":
        # set by .ci/run, whose strict docs build (same run, right after the tests)
        # executes every vignette in the same smoke mode (STATSEQ_DOCS_SMOKE=1) and fails
        # on any error
        pytest.skip("executed in smoke mode by this CI run's docs build")
    if path.stem in RUN_ELSEWHERE:
        assert (path.parents[1] / RUN_ELSEWHERE[path.stem]).is_file()
        pytest.skip(f"run in smoke mode by {RUN_ELSEWHERE[path.stem]}")
    monkeypatch.setenv("STATSEQ_SMOKE", "1")
    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    namespace = runpy.run_path(str(path), run_name="__main__")
    plt.close("all")
    assert namespace, f"{path.name} defined nothing"
