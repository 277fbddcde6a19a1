"""Linear Gaussian state space models: general, time-varying and structural."""

from statseq.models.ssm.base import GaussianForecast, GaussianSSMBase
from statseq.models.ssm.linear import (
    LGSSMParams,
    LinearGaussianSSM,
    TimeVaryingLinearGaussianSSM,
)
from statseq.models.ssm.structural import (
    ARComponent,
    ARComponentParams,
    ComponentEstimate,
    ComponentForecast,
    LocalLevel,
    LocalLevelParams,
    LocalLinearTrend,
    LocalLinearTrendParams,
    Seasonal,
    SeasonalParams,
    StructuralModel,
    StructuralParams,
    Trend,
    TrendParams,
    TrigSeasonal,
)

__all__ = [
    "ARComponent",
    "ARComponentParams",
    "ComponentEstimate",
    "ComponentForecast",
    "GaussianForecast",
    "GaussianSSMBase",
    "LGSSMParams",
    "LinearGaussianSSM",
    "LocalLevel",
    "LocalLevelParams",
    "LocalLinearTrend",
    "LocalLinearTrendParams",
    "Seasonal",
    "SeasonalParams",
    "StructuralModel",
    "StructuralParams",
    "TimeVaryingLinearGaussianSSM",
    "Trend",
    "TrendParams",
    "TrigSeasonal",
]
