"""statseq: probabilistic sequence models as autoregressive likelihoods, in JAX.

Every model is a filter: a fixed-size state, a one-step predictive distribution read from
it, and an update that conditions the state on the next observation. Likelihoods,
sampling, forecasting and fitting are written once over that protocol.
"""

from statseq import _compat

_compat.import_tqdm_quietly()  # before numpyro, which imports tqdm.auto
_compat.load_numpyro_fully()
_compat.avoid_cpu_scheduler_deadlock()  # before JAX's first computation
_compat.keep_large_buffers_in_heap()  # before JAX's first computation (its threads)

from statseq import _cache  # noqa: E402

_cache._configure_on_import()

from statseq._cache import enable_compilation_cache  # noqa: E402

# Eager: what every script touches, and every model family but the neural networks and
# the deep state space model (each registers itself with `register_model`, which
# `registered_models` and `statseq.load` read; they import the lazy families first:
# `statseq.core.model._DEFERRED_MODEL_MODULES`).
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

# `forecast` is both a submodule and a function; models.ssm imports the submodule, so the
# function must be bound here, after it (a lazy name would be shadowed by the module).
from statseq.forecast import Forecast, forecast, future_index  # noqa: E402
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
from statseq.models.ngram import NGram, NGramCounts  # noqa: E402
from statseq.models.ngrc import NGRC, NGRCParams  # noqa: E402
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
from statseq.models.switching import (  # noqa: E402
    MarkovSwitchingAR,
    MSARParams,
    SLDSParams,
    SwitchingLDS,
)

# Lazy (PEP 562): imported on first access, so `import statseq` does not load what a
# script may never use: pandas (datasets), SciPy's stats (evaluation's tests), optax
# (fit_lbfgs, fit_sgd, fit_svi), numpyro's samplers, matplotlib (plotting), dynamax.
# Name -> module that defines it; a module's own name maps to None (the module itself).
_LAZY = {
    "datasets": None,
    "distributed": None,
    # subpackages that `import statseq` used to load, still reachable as attributes
    "bayes": None,
    "evaluation": None,
    "fit": None,
    "interop": None,
    "io": None,
    "plotting": None,
    # bayes
    "SequenceDistribution": "statseq.bayes",
    "fit_nuts": "statseq.bayes",
    "fit_svi": "statseq.bayes",
    "lfo_cv": "statseq.bayes",
    "posterior_params": "statseq.bayes",
    "posterior_predictive_forecast": "statseq.bayes",
    "predictive_check": "statseq.bayes",
    "relabel_states": "statseq.bayes",
    "sample_prior": "statseq.bayes",
    # evaluation
    "AuxiliaryResiduals": "statseq.evaluation.auxiliary",
    "auxiliary_residuals": "statseq.evaluation.auxiliary",
    "BacktestResult": "statseq.evaluation.backtest",
    "backtest": "statseq.evaluation.backtest",
    "compare_forecasts": "statseq.evaluation.backtest",
    "evaluate_forecast": "statseq.evaluation.backtest",
    "naive_forecast": "statseq.evaluation.baselines",
    "naive_model": "statseq.evaluation.baselines",
    "naive_params": "statseq.evaluation.baselines",
    "information_criteria": "statseq.evaluation.criteria",
    "log_score": "statseq.evaluation.criteria",
    "num_params": "statseq.evaluation.criteria",
    "Diagnostics": "statseq.evaluation.diagnostics",
    "diagnose": "statseq.evaluation.diagnostics",
    "pit": "statseq.evaluation.diagnostics",
    "plot_diagnostics": "statseq.evaluation.diagnostics",
    "quantile_residuals": "statseq.evaluation.diagnostics",
    "standardized_residuals": "statseq.evaluation.diagnostics",
    "estimate_log_prob": "statseq.evaluation.gaps",
    "crps": "statseq.evaluation.scores",
    "interval_coverage": "statseq.evaluation.scores",
    "interval_score": "statseq.evaluation.scores",
    "log_predictive_density": "statseq.evaluation.scores",
    # fit
    "SpuriousCheck": "statseq.fit.degeneracy",
    "spurious_states": "statseq.fit.degeneracy",
    "fit_em": "statseq.fit.em",
    "Summary": "statseq.fit.inference_stats",
    "standard_errors": "statseq.fit.inference_stats",
    "summary": "statseq.fit.inference_stats",
    "fit_lbfgs": "statseq.fit.lbfgs",
    "RestartsResult": "statseq.fit.restarts",
    "fit_restarts": "statseq.fit.restarts",
    "fit_sgd": "statseq.fit.sgd",
    "Windows": "statseq.fit.windows",
    "make_windows": "statseq.fit.windows",
    # interop (dynamax itself loads only inside the conversions), io, plotting
    "from_dynamax": "statseq.interop",
    "to_dynamax": "statseq.interop",
    "load": "statseq.io",
    "save": "statseq.io",
    "plot_forecast": "statseq.plotting",
    "plot_traces": "statseq.plotting",
    # neural networks and the deep state space model (about 0.05 s of CPU to import: many
    # dataclasses); `registered_models` imports them (core.model._DEFERRED_MODEL_MODULES)
    "AFT": "statseq.models.neural",
    "AFTBackbone": "statseq.models.neural",
    "GRU": "statseq.models.neural",
    "LRU": "statseq.models.neural",
    "LSTM": "statseq.models.neural",
    "MLSTM": "statseq.models.neural",
    "RWKV": "statseq.models.neural",
    "ElmanRNN": "statseq.models.neural",
    "LinearAttention": "statseq.models.neural",
    "LinearAttentionBackbone": "statseq.models.neural",
    "Mamba": "statseq.models.neural",
    "NeuralParams": "statseq.models.neural",
    "NeuralSequenceModel": "statseq.models.neural",
    "WaveNet": "statseq.models.neural",
    "WaveNetBackbone": "statseq.models.neural",
    "S4D": "statseq.models.neural.s4",
    "S4DBackbone": "statseq.models.neural.s4",
    "S5": "statseq.models.neural.s5",
    "S5Backbone": "statseq.models.neural.s5",
    "EncoderDecoder": "statseq.models.neural.seq2seq",
    "IdentityBackbone": "statseq.models.neural.seq2seq",
    "Transformer": "statseq.models.neural.transformer",
    "TransformerBackbone": "statseq.models.neural.transformer",
    "DeepStateParams": "statseq.models.deepstate",
    "DeepStateSpace": "statseq.models.deepstate",
    # classify (sequence classifiers, scikit-learn style)
    "classify": None,
    "GenerativeClassifier": "statseq.classify",
    "SequenceClassifier": "statseq.classify",
    "SequenceRegressor": "statseq.classify",
    "SequenceLabeller": "statseq.classify",
}


def __getattr__(name: str):
    """Import a lazily exported name on first access (PEP 562) and cache it."""
    if name not in _LAZY:
        raise AttributeError(f"module 'statseq' has no attribute {name!r}")
    import importlib

    module = _LAZY[name]
    value = importlib.import_module(f"statseq.{name}" if module is None else module)
    if module is not None:
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"

__all__ = [
    "AFT",
    "AFTBackbone",
    "LinearAttention",
    "LinearAttentionBackbone",
    "GRU",
    "LSTM",
    "LRU",
    "Mamba",
    "WaveNet",
    "WaveNetBackbone",
    "MLSTM",
    "RWKV",
    "S4D",
    "S4DBackbone",
    "S5",
    "S5Backbone",
    "Transformer",
    "TransformerBackbone",
    "EncoderDecoder",
    "IdentityBackbone",
    "NGRC",
    "NGRCParams",
    "ElmanRNN",
    "NeuralParams",
    "NeuralSequenceModel",
    "AR",
    "NGram",
    "NGramCounts",
    "ARParams",
    "BernoulliHMM",
    "CategoricalHMM",
    "GaussianHMM",
    "LinearAutoregressiveHMM",
    "MarkovSwitchingAR",
    "MSARParams",
    "SLDSParams",
    "SwitchingLDS",
    "DeepStateParams",
    "DeepStateSpace",
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
    "classify",
    "GenerativeClassifier",
    "SequenceClassifier",
    "SequenceRegressor",
    "SequenceLabeller",
]

_compat.freeze_import_time_objects()  # last; opt-in (STATSEQ_GC_FREEZE=1): a faster exit
