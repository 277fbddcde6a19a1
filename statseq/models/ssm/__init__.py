"""Linear Gaussian state space models: general, time-varying and structural."""

from statseq.models.ssm.base import GaussianForecast, GaussianSSMBase
from statseq.models.ssm.linear import (
    LGSSMParams,
    LinearGaussianSSM,
    TimeVaryingLinearGaussianSSM,
)

__all__ = [
    "GaussianForecast",
    "GaussianSSMBase",
    "LGSSMParams",
    "LinearGaussianSSM",
    "TimeVaryingLinearGaussianSSM",
]
