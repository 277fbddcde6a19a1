"""Hidden Markov models: one emission family per module over a shared base."""

from statseq.models.hmm.autoregressive import ARHMMEmissions, LinearAutoregressiveHMM
from statseq.models.hmm.base import (
    HMMBase,
    HMMCarry,
    HMMParams,
    TransitionRegression,
    stationary_distribution,
)
from statseq.models.hmm.bernoulli import BernoulliEmissions, BernoulliHMM
from statseq.models.hmm.categorical import CategoricalEmissions, CategoricalHMM
from statseq.models.hmm.gaussian import (
    DiagonalGaussianEmissions,
    GaussianEmissions,
    GaussianHMM,
    NormalInverseGamma,
    NormalInverseWishart,
    SphericalGaussianEmissions,
    TiedGaussianEmissions,
)
from statseq.models.hmm.poisson import PoissonEmissions, PoissonHMM

__all__ = [
    "ARHMMEmissions",
    "BernoulliEmissions",
    "BernoulliHMM",
    "DiagonalGaussianEmissions",
    "GaussianEmissions",
    "GaussianHMM",
    "LinearAutoregressiveHMM",
    "NormalInverseGamma",
    "NormalInverseWishart",
    "CategoricalEmissions",
    "CategoricalHMM",
    "HMMBase",
    "HMMCarry",
    "HMMParams",
    "PoissonEmissions",
    "PoissonHMM",
    "SphericalGaussianEmissions",
    "TiedGaussianEmissions",
    "TransitionRegression",
    "stationary_distribution",
]
