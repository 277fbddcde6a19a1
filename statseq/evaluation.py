"""Model comparison: information criteria and held-out log scores."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from statseq.core.params import num_free_params
from statseq.core.recurrence import filter as _filter
from statseq.core.validation import prepare_data


def num_params(model, trainable=None) -> int:
    """Number of free parameters ``k`` (unconstrained scalars of the trainable leaves)."""
    return num_free_params(model, trainable)


def num_observations(model, y, *, mask=None) -> int:
    """Number of scalar observations that enter the likelihood (masked entries excluded).

    Leading steps a model conditions on (``model.num_conditioned_steps``) are counted
    here; :func:`information_criteria` leaves them out.
    """
    data = prepare_data(model, y, mask)
    return int(np.sum(np.asarray(data.mask)))


def information_criteria(model, params, y, *, mask=None, inputs=None, trainable=None) -> dict:
    """Log-likelihood, AIC and BIC of ``params`` on ``y``.

        AIC = -2 log L + 2 k,        BIC = -2 log L + k log n,

    where ``k`` is :func:`num_params` and ``n`` the number of scalar observations that are
    scored in the likelihood (for a conditional AR(p), the first ``p`` are not).

    Returns:
        ``{"log_lik", "num_params", "num_obs", "aic", "bic"}``.
    """
    res = _filter(model, params, y, mask=mask, inputs=inputs, return_carries=False)
    log_lik = float(jnp.sum(res.log_prob))
    data = prepare_data(model, y, mask, inputs)
    observed = np.asarray(data.mask)[:, model.num_conditioned_steps :]
    n = int(np.sum(observed))
    k = num_params(model, trainable)
    return {
        "log_lik": log_lik,
        "num_params": k,
        "num_obs": n,
        "aic": -2.0 * log_lik + 2.0 * k,
        "bic": -2.0 * log_lik + k * math.log(max(n, 1)),
    }


def log_score(model, params, y_train, y_test, *, inputs_train=None, inputs_test=None) -> float:
    """Held-out log predictive density ``log p(y_test | y_train)`` (one sequence).

    Computed exactly by filtering the concatenated series and summing the one-step
    predictive log-densities over the test steps, i.e. a rolling one-step-ahead score
    that conditions on each observed test value as it arrives.
    """
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    y_all = np.concatenate([y_train, y_test], axis=0)
    inputs = None
    if model.num_inputs:
        inputs = np.concatenate([np.asarray(inputs_train), np.asarray(inputs_test)], axis=0)
    res = _filter(model, params, y_all, inputs=inputs)
    return float(jnp.sum(res.log_probs[y_train.shape[0] :]))
