"""Model comparison and forecast evaluation.

* `statseq.evaluation.criteria`: information criteria (AIC, BIC) and the held-out
  one-step log score (exact: a difference of two exact log-likelihoods);
* `statseq.evaluation.scores`: proper scores of forecasts (CRPS, interval coverage and
  interval score, log predictive densities: exact where the model's h-step marginals have
  a closed form, estimates otherwise; see the claims audit, docs/claims.md);
* `statseq.evaluation.backtest`: tidy tables of scored forecasts and rolling-origin
  backtests (pandas DataFrames);
* `statseq.evaluation.diagnostics`: one-step PIT, quantile and standardized residuals of
  every model, `diagnose` and `plot_diagnostics`;
* `statseq.evaluation.auxiliary`: auxiliary residuals (smoothed disturbances) of state
  space models;
* `statseq.evaluation.stattests`: ACF, Ljung-Box, ``H(h)`` and Jarque-Bera in NumPy/SciPy.
"""

from statseq.evaluation.auxiliary import AuxiliaryResiduals, auxiliary_residuals
from statseq.evaluation.backtest import (
    BacktestResult,
    backtest,
    compare_forecasts,
    evaluate_forecast,
)
from statseq.evaluation.criteria import (
    information_criteria,
    log_score,
    num_observations,
    num_params,
)
from statseq.evaluation.diagnostics import (
    Diagnostics,
    diagnose,
    pit,
    plot_diagnostics,
    quantile_residuals,
    standardized_residuals,
)
from statseq.evaluation.gaps import estimate_log_prob
from statseq.evaluation.scores import (
    crps,
    crps_from_samples,
    crps_gaussian,
    gaussian_log_density,
    interval_coverage,
    interval_score,
    log_predictive_density,
    prediction_interval,
)

__all__ = [
    "AuxiliaryResiduals",
    "Diagnostics",
    "auxiliary_residuals",
    "diagnose",
    "pit",
    "plot_diagnostics",
    "quantile_residuals",
    "standardized_residuals",
    "BacktestResult",
    "backtest",
    "compare_forecasts",
    "crps",
    "crps_from_samples",
    "crps_gaussian",
    "evaluate_forecast",
    "estimate_log_prob",
    "gaussian_log_density",
    "information_criteria",
    "interval_coverage",
    "interval_score",
    "log_predictive_density",
    "log_score",
    "num_observations",
    "num_params",
    "prediction_interval",
]
