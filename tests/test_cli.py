"""``statseq demo`` runs end to end (quick mode) and reports honest, comparable numbers."""

import io

import numpy as np
import pytest

import statseq as ss
from statseq.cli import demo_sections, main, run_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo")
    out = io.StringIO()
    rows = run_demo(output=path, quick=True, stream=out)
    return path, rows, out.getvalue()


def test_demo_quick_writes_table_and_plot(demo):
    path, rows, text = demo
    assert (path / "forecast.png").stat().st_size > 10_000
    assert "held-out log score" in text and "CRPS" in text and "90% cover" in text
    assert "* exact: closed-form CRPS" in text
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
            assert np.isfinite(r["heldout_crps"]) and r["heldout_crps"] > 0
            # a fraction of the held-out values
            h = 14 if section.startswith("log10") else 10
            assert np.isclose(r["heldout_coverage_90"] * h, round(r["heldout_coverage_90"] * h))
            # the state space rows are scored exactly (Gaussian forecast), the others by samples
            assert r["crps_exact"] == section.endswith("Nile at Aswan")
    # the neural models sit beside the classical ones, scored on the same observations
    labels = {r["model"] for r in rows}
    assert {"GRU(8), Gaussian head", "Mamba(8), Gaussian head",
            "LSTM(8), Poisson head"} <= labels
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


def test_demo_crps_matches_exact_values(demo):
    """Poisson HMM with K=1: i.i.d. Poisson(mean of train) forecasts, whose CRPS is exactly
    sum_k (F(k) - 1{y <= k})^2; the demo's Monte Carlo value (2000 paths) is within 0.1
    (over 4 standard errors). The local level's CRPS is the closed form of its exact
    Gaussian forecast at the fitted parameters."""
    from scipy.stats import poisson

    _, rows, _ = demo
    quakes = ss.datasets.load_earthquakes().to_numpy()
    train, test = quakes[:-10], quakes[-10:]
    k = np.arange(200)
    cdf = poisson.cdf(k, train.mean())
    exact = np.mean([np.sum((cdf - (y <= k)) ** 2) for y in test])
    k1 = next(r for r in rows if r["model"] == "Poisson HMM, K=1")
    assert abs(k1["heldout_crps"] - exact) < 0.1
    nile = ss.datasets.load_nile().to_numpy().astype(float)
    model = ss.LocalLevel()
    entry = next(e for s in demo_sections(quick=True) for e in s.entries
                 if e.label == "local level")
    params = entry.fit(model, nile[:-10])
    fc = model.forecast_moments(params, nile[:-10], num_steps=10)
    row = next(r for r in rows if r["model"] == "local level")
    np.testing.assert_allclose(
        row["heldout_crps"], ss.evaluation.crps_gaussian(fc.mean, fc.std, nile[-10:]).mean(),
        rtol=1e-6)
