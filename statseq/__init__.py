"""statseq: probabilistic sequence models as autoregressive likelihoods, in JAX.

Every model is a filter: a fixed-size state, a one-step predictive distribution read from
it, and an update that conditions the state on the next observation. Likelihoods,
sampling, forecasting and fitting are written once over that protocol.
"""

from statseq import _compat

_compat.import_tqdm_quietly()  # before numpyro, which imports tqdm.auto
_compat.load_numpyro_fully()
_compat.avoid_cpu_scheduler_deadlock()  # before JAX's first computation

from statseq import _cache  # noqa: E402

_cache._configure_on_import()

from statseq import datasets  # noqa: E402
from statseq._cache import enable_compilation_cache  # noqa: E402
from statseq.bayes import (  # noqa: E402
    SequenceDistribution,
    fit_nuts,
    fit_svi,
    lfo_cv,
    posterior_params,
    posterior_predictive_forecast,
    predictive_check,
    relabel_states,
    sample_prior,
)
from statseq.core.buckets import bucket_length, set_length_buckets  # noqa: E402
from statseq.core.model import SequenceModel, register_model, registered_models  # noqa: E402
from statseq.core.params import (  # noqa: E402
    from_unconstrained,
    log_prior,
    num_free_params,
    to_unconstrained,
)
from statseq.core.recurrence import filter, log_prob, sample  # noqa: E402, A004
from statseq.core.results import FilterResult, FitResult  # noqa: E402
from statseq.core.validation import missing_mask, pad_sequences  # noqa: E402
from statseq.evaluation import (  # noqa: E402
    BacktestResult,
    backtest,
    compare_forecasts,
    crps,
    evaluate_forecast,
    information_criteria,
    interval_coverage,
    interval_score,
    log_predictive_density,
    log_score,
    num_params,
)
from statseq.evaluation.auxiliary import AuxiliaryResiduals, auxiliary_residuals  # noqa: E402
from statseq.evaluation.baselines import naive_forecast, naive_model, naive_params  # noqa: E402
from statseq.evaluation.diagnostics import (  # noqa: E402
    Diagnostics,
    diagnose,
    pit,
    plot_diagnostics,
    quantile_residuals,
    standardized_residuals,
)
from statseq.evaluation.gaps import estimate_log_prob  # noqa: E402
from statseq.fit.degeneracy import SpuriousCheck, spurious_states  # noqa: E402
from statseq.fit.em import fit_em  # noqa: E402
from statseq.fit.inference_stats import Summary, standard_errors, summary  # noqa: E402
from statseq.fit.lbfgs import fit_lbfgs  # noqa: E402
from statseq.fit.restarts import RestartsResult, fit_restarts  # noqa: E402
from statseq.fit.sgd import fit_sgd  # noqa: E402
from statseq.fit.windows import Windows, make_windows  # noqa: E402
from statseq.forecast import Forecast, forecast, future_index  # noqa: E402
from statseq.interop import from_dynamax, to_dynamax  # noqa: E402 - dynamax loads lazily
from statseq.io import load, save  # noqa: E402
from statseq.models.autoregressive import AR, ARParams  # noqa: E402
from statseq.models.hmm import (  # noqa: E402
    BernoulliHMM,
    CategoricalHMM,
    GaussianHMM,
    HMMParams,
    LinearAutoregressiveHMM,
    NormalInverseGamma,
    NormalInverseWishart,
    PoissonHMM,
    TransitionRegression,
)
from statseq.models.neural import (  # noqa: E402
    GRU,
    LRU,
    LSTM,
    ElmanRNN,
    Mamba,
    NeuralParams,
    NeuralSequenceModel,
)
from statseq.models.ssm import (  # noqa: E402
    GaussianForecast,
    LGSSMParams,
    LinearGaussianSSM,
    TimeVaryingLinearGaussianSSM,
)
from statseq.models.ssm.structural import (  # noqa: E402
    ARComponent,
    ARComponentParams,
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
from statseq.models.switching import MarkovSwitchingAR, MSARParams  # noqa: E402
from statseq.plotting import plot_forecast, plot_traces  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "GRU",
    "LSTM",
    "LRU",
    "Mamba",
    "ElmanRNN",
    "NeuralParams",
    "NeuralSequenceModel",
    "AR",
    "ARParams",
    "BernoulliHMM",
    "CategoricalHMM",
    "GaussianHMM",
    "LinearAutoregressiveHMM",
    "MarkovSwitchingAR",
    "MSARParams",
    "GaussianForecast",
    "LGSSMParams",
    "LinearGaussianSSM",
    "TimeVaryingLinearGaussianSSM",
    "NormalInverseGamma",
    "NormalInverseWishart",
    "HMMParams",
    "PoissonHMM",
    "TransitionRegression",
    "fit_em",
    "fit_lbfgs",
    "fit_restarts",
    "RestartsResult",
    "SpuriousCheck",
    "spurious_states",
    "FilterResult",
    "FitResult",
    "Forecast",
    "SequenceModel",
    "datasets",
    "enable_compilation_cache",
    "filter",
    "fit_sgd",
    "fit_nuts",
    "fit_svi",
    "SequenceDistribution",
    "posterior_params",
    "posterior_predictive_forecast",
    "relabel_states",
    "lfo_cv",
    "predictive_check",
    "sample_prior",
    "make_windows",
    "Windows",
    "forecast",
    "from_unconstrained",
    "from_dynamax",
    "to_dynamax",
    "information_criteria",
    "interval_coverage",
    "interval_score",
    "log_predictive_density",
    "estimate_log_prob",
    "BacktestResult",
    "backtest",
    "compare_forecasts",
    "crps",
    "AuxiliaryResiduals",
    "Diagnostics",
    "auxiliary_residuals",
    "diagnose",
    "pit",
    "plot_diagnostics",
    "quantile_residuals",
    "standardized_residuals",
    "evaluate_forecast",
    "future_index",
    "load",
    "log_prior",
    "log_prob",
    "log_score",
    "missing_mask",
    "pad_sequences",
    "num_free_params",
    "num_params",
    "plot_forecast",
    "plot_traces",
    "register_model",
    "registered_models",
    "sample",
    "save",
    "set_length_buckets",
    "bucket_length",
    "standard_errors",
    "summary",
    "Summary",
    "to_unconstrained",
    "ARComponent",
    "ARComponentParams",
    "LocalLevel",
    "LocalLevelParams",
    "LocalLinearTrend",
    "LocalLinearTrendParams",
    "Seasonal",
    "SeasonalParams",
    "StructuralModel",
    "StructuralParams",
    "Trend",
    "TrendParams",
    "TrigSeasonal",
    "naive_forecast",
    "naive_model",
    "naive_params",
]
