"""Hidden Markov models: one emission family per module over a shared base."""

from statseq.models.hmm.base import (
    HMMBase,
    HMMCarry,
    HMMParams,
    TransitionRegression,
    stationary_distribution,
)
from statseq.models.hmm.categorical import CategoricalEmissions, CategoricalHMM
from statseq.models.hmm.poisson import PoissonEmissions, PoissonHMM

__all__ = [
    "CategoricalEmissions",
    "CategoricalHMM",
    "HMMBase",
    "HMMCarry",
    "HMMParams",
    "PoissonEmissions",
    "PoissonHMM",
    "TransitionRegression",
    "stationary_distribution",
]
