"""Bayesian inference for every statseq model through NumPyro.

`SequenceDistribution` (a model as a NumPyro distribution over sequences), default
priors, `fit_nuts` (NUTS, ArviZ output), `fit_svi` (variational inference), HMM state
relabelling, posterior predictive forecasts, prior and posterior predictive checks
(`sample_prior`, `predictive_check`) and leave-future-out cross-validation (`lfo_cv`).
"""

from statseq.bayes.checks import PredictiveCheck, predictive_check, sample_prior
from statseq.bayes.distribution import SequenceDistribution
from statseq.bayes.lfo import LFOResult, lfo_cv, psis
from statseq.bayes.nuts import fit_nuts, posterior_params
from statseq.bayes.predictive import posterior_predictive_forecast
from statseq.bayes.priors import LKJCovariance, default_priors
from statseq.bayes.relabel import permute_states, relabel_states
from statseq.bayes.svi import SVIResult, fit_svi

__all__ = [
    "LFOResult",
    "LKJCovariance",
    "PredictiveCheck",
    "SVIResult",
    "SequenceDistribution",
    "default_priors",
    "fit_nuts",
    "fit_svi",
    "lfo_cv",
    "permute_states",
    "posterior_params",
    "posterior_predictive_forecast",
    "predictive_check",
    "psis",
    "relabel_states",
    "sample_prior",
]
