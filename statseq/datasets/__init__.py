"""Small classic time series bundled with statseq, available offline.

>>> from statseq.datasets import list_datasets, load_nile
>>> "nile" in list_datasets()
True
>>> load_nile().shape
(100,)

Examples:
    >>> import statseq as ss
    >>> "nile" in ss.datasets.list_datasets()
    True
    >>> nile = ss.datasets.load_nile()          # a pandas Series indexed by year
    >>> len(nile), int(nile.index[0])
    (100, 1871)
"""

from statseq.datasets._load import (
    list_datasets,
    load_air_passengers,
    load_dataset,
    load_discoveries,
    load_earthquakes,
    load_electricity_demand,
    load_japanese_vowels,
    load_lynx,
    load_nile,
    load_old_faithful,
    load_sunspots,
    load_sunspots_monthly,
    load_treering,
    load_uk_driver_deaths,
    load_us_gnp_growth,
    load_us_macro,
    load_us_state_production,
)
from statseq.datasets._text import (
    TEXT_ALPHABET,
    decode_characters,
    encode_characters,
    load_macbeth,
)

__all__ = [
    "TEXT_ALPHABET",
    "decode_characters",
    "encode_characters",
    "list_datasets",
    "load_macbeth",
    "load_air_passengers",
    "load_dataset",
    "load_discoveries",
    "load_earthquakes",
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
    "load_japanese_vowels",
    "load_electricity_demand",
]
