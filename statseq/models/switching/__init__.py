"""Regime-switching models written as HMMs on (expanded) discrete states."""

from statseq.models.switching.ms_ar import (
    MarkovSwitchingAR,
    MSARCarry,
    MSARParams,
    RegimeFilterResult,
    RegimePosterior,
)
from statseq.models.switching.slds import SLDSGibbsPrior, SLDSParams, SwitchingLDS

__all__ = [
    "MSARCarry",
    "MSARParams",
    "MarkovSwitchingAR",
    "RegimeFilterResult",
    "RegimePosterior",
    "SLDSGibbsPrior",
    "SLDSParams",
    "SwitchingLDS",
]
