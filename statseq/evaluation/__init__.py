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

import sys
import types

# Lazy (PEP 562): `statseq.evaluation.stattests` loads SciPy's stats (about 0.5 s) and
# `backtest` pandas; `from statseq.evaluation import information_criteria` (used by
# `statseq.fit`) then imports only `criteria`. Name -> submodule that defines it.
_LAZY = {
    "AuxiliaryResiduals": "auxiliary",
    "auxiliary_residuals": "auxiliary",
    "BacktestResult": "backtest",
    "backtest": "backtest",
    "compare_forecasts": "backtest",
    "evaluate_forecast": "backtest",
    "information_criteria": "criteria",
    "log_score": "criteria",
    "num_observations": "criteria",
    "num_params": "criteria",
    "Diagnostics": "diagnostics",
    "diagnose": "diagnostics",
    "pit": "diagnostics",
    "plot_diagnostics": "diagnostics",
    "quantile_residuals": "diagnostics",
    "standardized_residuals": "diagnostics",
    "estimate_log_prob": "gaps",
    "crps": "scores",
    "crps_from_samples": "scores",
    "crps_gaussian": "scores",
    "gaussian_log_density": "scores",
    "interval_coverage": "scores",
    "interval_score": "scores",
    "log_predictive_density": "scores",
    "prediction_interval": "scores",
}


def __getattr__(name: str):
    """Import a name on first access (PEP 562) and cache it in the package."""
    if name not in _LAZY:
        raise AttributeError(f"module 'statseq.evaluation' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"statseq.evaluation.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """Keeps ``backtest`` the function when its submodule ``backtest`` is first imported.

    The import system binds a submodule as an attribute of its package after loading it;
    with eager imports the package's own ``from .backtest import backtest`` ran later and
    won. Lazily, the submodule may load at any time (through another name), so the
    binding is corrected here instead.
    """

    def __setattr__(self, name, value):
        if (name in _LAZY and isinstance(value, types.ModuleType)
                and value.__name__ == f"{__name__}.{_LAZY[name]}"):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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
