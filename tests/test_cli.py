"""``statseq demo`` runs end to end (quick mode) and reports honest, comparable numbers."""

import io

import numpy as np
import pytest

import statseq as ss
from statseq.cli import main, run_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo")
    out = io.StringIO()
    rows = run_demo(output=path, quick=True, stream=out)
    return path, rows, out.getvalue()


def test_demo_quick_writes_table_and_plot(demo):
    path, rows, text = demo
    assert (path / "forecast.png").stat().st_size > 10_000
    assert "held-out log score" in text
    sections = {r["section"] for r in rows}
    assert len(sections) == 3
    for section in sections:
        sub = [r for r in rows if r["section"] == section]
        # every row of a section scores the same observations, so AIC/BIC are comparable
        assert len({r["n"] for r in sub}) == 1
        for r in sub:
            assert np.isclose(r["aic"], -2 * r["log_lik"] + 2 * r["k"])
            assert np.isclose(r["bic"], -2 * r["log_lik"] + r["k"] * np.log(r["n"]))
            assert np.isfinite(r["heldout_log_score"])
    # nested models: more states or lags never lower the maximized likelihood (restarts
    # and enough iterations make this hold here)
    hmm = [r["log_lik"] for r in rows if r["model"].startswith("Poisson HMM")]
    assert all(b >= a - 1e-3 for a, b in zip(hmm, hmm[1:], strict=False))
    # the local linear trend nests the local level (slope variance 0, exact diffuse slope
    # adds one diffuse element): its exact MLE log-likelihood is not far below
    nile = {r["model"]: r for r in rows if r["section"].endswith("Nile at Aswan")}
    assert set(nile) == {"local level", "local linear trend"}
    assert nile["local level"]["k"] == 2 and nile["local linear trend"]["k"] == 3


def test_demo_row_matches_library_calls(demo):
    _, rows, _ = demo
    quakes = ss.datasets.load_earthquakes().to_numpy()
    k1 = next(r for r in rows if r["model"] == "Poisson HMM, K=1")
    # the one-state Poisson MLE is the sample mean, so its log-likelihood is known exactly
    from scipy.stats import poisson

    train = quakes[:-10]
    assert np.isclose(k1["log_lik"], poisson.logpmf(train, train.mean()).sum(), atol=1e-3)


def test_cli_help_and_unknown_command(capsys):
    assert main([]) == 0
    assert "demo" in capsys.readouterr().out
