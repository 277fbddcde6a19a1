"""Regime-switching models written as HMMs on (expanded) discrete states."""

from statseq.models.switching.ms_ar import (
    MarkovSwitchingAR,
    MSARCarry,
    MSARParams,
    RegimeFilterResult,
    RegimePosterior,
)

__all__ = [
    "MSARCarry",
    "MSARParams",
    "MarkovSwitchingAR",
    "RegimeFilterResult",
    "RegimePosterior",
]
