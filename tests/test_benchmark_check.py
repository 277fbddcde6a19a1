"""The logic of benchmarks/check_regression.py (no timing): on temporary ratio files.

The files are written by the benchmarks' own writer (`benchmarks/_harness.record_ratios`),
so the check is tested on the format it will read.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check_regression = _load("check_regression")
harness = _load("_harness")


def _write(tmp_path, family, ratios, baseline):
    harness.record_ratios(family, baseline, command="test baseline",
                          out_dir=tmp_path / "baseline")
    harness.record_ratios(family, ratios, command="test run", out_dir=tmp_path)


def _run(tmp_path, *extra):
    return check_regression.main(["--ratios-dir", str(tmp_path), *extra])


def test_thirty_percent_worse_fails_twenty_passes(tmp_path, capsys):
    _write(tmp_path, "hmm", {"filter | core / numba": 1.30, "smoother | core / numba": 2.40},
           {"filter | core / numba": 1.00, "smoother | core / numba": 2.00})
    assert _run(tmp_path) == 1
    out = capsys.readouterr().out
    assert "BENCHMARK REGRESSION: 1 ratio(s)" in out
    assert "!!! hmm | filter | core / numba: 1 -> 1.3 (+30%)" in out
    rows = {r.key: r for r in check_regression.check(tmp_path)[0]}
    assert rows["filter | core / numba"].status == "REGRESSION"
    assert rows["smoother | core / numba"].status == "ok"          # +20 %: within 25 %
    assert rows["smoother | core / numba"].change == pytest.approx(0.20)


def test_twenty_percent_worse_passes(tmp_path, capsys):
    _write(tmp_path, "kalman", {"a": 1.20, "b": 0.5}, {"a": 1.0, "b": 0.5})
    assert _run(tmp_path) == 0
    out = capsys.readouterr().out
    assert "BENCHMARK REGRESSION" not in out and "**REGRESSION**" not in out
    assert "summary: ok 2, better 0, new 0, missing 0, REGRESSION 0, INVALID 0" in out


def test_boundary_is_strict_and_threshold_option():
    rows = check_regression.compare("f", {"a": 1.25, "b": 1.2501}, {"a": 1.0, "b": 1.0})
    assert [r.status for r in rows] == ["ok", "REGRESSION"]
    rows = check_regression.compare("f", {"a": 1.08}, {"a": 1.0}, threshold=0.05)
    assert rows[0].status == "REGRESSION"
    assert check_regression.compare("f", {"a": 0.7}, {"a": 1.0})[0].status == "better"
    with pytest.raises(ValueError, match="threshold"):
        check_regression.compare("f", {}, {}, threshold=-1)


def test_missing_and_new_keys_are_reported_not_failing(tmp_path, capsys):
    _write(tmp_path, "rnn", {"gru step | flax": 1.1, "new case | flax": 3.0},
           {"gru step | flax": 1.0, "lstm step | flax": 0.8})
    assert _run(tmp_path) == 0
    out = capsys.readouterr().out
    assert "| rnn | lstm step | flax | 0.8 | – | – | missing |" in out
    assert "| rnn | new case | flax | – | 3 | – | new |" in out
    assert "missing 1" in out and "new 1" in out


def test_families_without_baseline_or_run_are_noted(tmp_path, capsys):
    harness.record_ratios("scan", {"x": 1.0}, command="t", out_dir=tmp_path)
    harness.record_ratios("startup", {"y": 1.0}, command="t", out_dir=tmp_path / "baseline")
    assert _run(tmp_path) == 0
    out = capsys.readouterr().out
    assert "scan: no baseline" in out
    assert "startup: baseline present but no current ratios" in out


def test_invalid_ratio_fails(tmp_path):
    (tmp_path / "baseline").mkdir()
    for folder, value in ((tmp_path / "baseline", 1.0), (tmp_path, float("nan"))):
        (folder / "hmm.json").write_text(json.dumps({"ratios": {"a": value}}))
    assert _run(tmp_path) == 1
    assert check_regression.check(tmp_path)[0][0].status == "INVALID"


def test_family_filter_and_update_baseline(tmp_path, capsys):
    _write(tmp_path, "hmm", {"a": 2.0}, {"a": 1.0})
    _write(tmp_path, "scan", {"b": 1.0}, {"b": 1.0})
    assert _run(tmp_path, "--family", "scan") == 0
    assert _run(tmp_path) == 1
    capsys.readouterr()
    assert _run(tmp_path, "--update-baseline", "--family", "hmm") == 0
    base = json.loads((tmp_path / "baseline" / "hmm.json").read_text())
    assert base["ratios"] == {"a": 2.0} and base["command"] == "test run"
    assert _run(tmp_path) == 0                     # the accepted ratio is the new baseline


def test_malformed_file_is_a_clear_error(tmp_path):
    (tmp_path / "baseline").mkdir()
    (tmp_path / "hmm.json").write_text(json.dumps({"family": "hmm"}))
    (tmp_path / "baseline" / "hmm.json").write_text(json.dumps({"ratios": {}}))
    with pytest.raises(ValueError, match="no 'ratios' mapping"):
        check_regression.check(tmp_path)


def test_command_line_exit_status(tmp_path):
    _write(tmp_path, "hmm", {"a": 1.3}, {"a": 1.0})
    out = subprocess.run([sys.executable, str(BENCH / "check_regression.py"),
                          "--ratios-dir", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 1
    assert "BENCHMARK REGRESSION" in out.stdout
