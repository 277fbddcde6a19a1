"""Information criteria (AIC, BIC) and the exact held-out one-step log score."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from statseq.core.params import num_free_params
from statseq.core.recurrence import filter as _filter
from statseq.core.validation import canonical_values, prepare_data


def num_params(model, trainable=None) -> int:
    """Number of identified free parameters ``k`` among the trainable leaves.

    The unconstrained scalars of the trainable leaves less the model's exact invariances
    (`statseq.num_free_params`): a softmax regression counts ``K - 1`` of its ``K`` logit
    rows, as a simplex counts ``K - 1`` entries, so input-driven HMM transitions with ``K
    = 2`` states and one input count 4 of their 8 logits; a linear Gaussian state space
    model does not count the change of basis and origin of its state. This is the ``k``
    of `information_criteria` and `statseq.summary`.

    Examples:
        >>> import statseq as ss
        >>> ss.num_params(ss.LocalLinearTrend())           # three variances
        3
        >>> ss.num_params(ss.PoissonHMM(num_states=2, input_dim=1))  # 1 + 4 + 2 rates
        7
    """
    return num_free_params(model, trainable)


def num_observations(model, y, *, mask=None) -> int:
    """Number of scalar observations that enter the likelihood (masked entries excluded).

    Leading steps a model conditions on (``model.num_conditioned_steps``) are counted
    here; `information_criteria` leaves them out.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> from statseq.evaluation import num_observations
        >>> y = np.array([1.0, 2.0, np.nan, 3.0, 2.5])
        >>> num_observations(ss.LocalLevel(), y, mask=~np.isnan(y))   # the NaN is not counted
        4
    """
    data = prepare_data(model, y, mask)
    return int(np.sum(np.asarray(data.mask)))


def information_criteria(model, params, y, *, mask=None, inputs=None, trainable=None) -> dict:
    """Log-likelihood, AIC and BIC of ``params`` on ``y``.

        AIC = -2 log L + 2 k,        BIC = -2 log L + k log n,

    where ``k`` is `num_params` (identified parameters: redundant softmax logits are not
    counted) and ``n`` the number of scalar observations that are scored in the likelihood
    (for a conditional AR(p), the first ``p`` are not).

    Returns:
        ``{"log_lik", "num_params", "num_obs", "aic", "bic"}``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> ic = ss.information_criteria(model, params, y)
        >>> ic["num_params"], ic["num_obs"]                # AR(2) conditions on y_1, y_2
        (4, 112)
        >>> bool(abs(ic["aic"] - (-2 * ic["log_lik"] + 2 * 4)) < 1e-6)
        True
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


def log_score(model, params, y_train, y_test, *, mask_train=None, mask_test=None,
              inputs_train=None, inputs_test=None):
    """Held-out log predictive density ``log p(y_test | y_train)``.

    Computed exactly by filtering the concatenated series and summing the one-step
    predictive log-densities over the test steps,

        log p(y_test | y_train) = sum_{t in test} log p(y_t | y_{<t}),

    a rolling one-step-ahead score that conditions on each test value as it arrives.
    Missing values (masks) are marginalized in both parts.

    Args:
        model: the fitted model.
        params: its parameters.
        y_train: ``batch_shape + (T_train,) + event_shape`` history.
        y_test: ``batch_shape + (T_test,) + event_shape`` held-out continuation.
        mask_train: optional mask of the history.
        mask_test: optional mask of the held-out part.
        inputs_train: covariates of the history, if the model takes them.
        inputs_test: covariates of the held-out part.

    Returns:
        A float for one sequence, else an array of shape ``batch_shape``.

    pandas ``Series``/``DataFrame`` parts are accepted; their ``NaN`` are missing values.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> s = ss.log_score(model, params, y[:100], y[100:])   # log p(y_101:114 | y_1:100)
        >>> f = ss.filter(model, params, y).log_probs
        >>> bool(abs(s - float(f[100:].sum())) < 1e-3)
        True
    """
    # one input convention (statseq.core.validation.accepted_shapes): pandas NaN are masked,
    # a 1-D series of a (1,)-vector model gets its trailing axis
    y_train, mask_train = canonical_values(model, y_train, mask_train, "y_train")
    y_test, mask_test = canonical_values(model, y_test, mask_test, "y_test")
    time_axis = y_train.ndim - 1 - len(model.event_shape)
    if time_axis < 0 or y_test.ndim != y_train.ndim:
        raise ValueError(
            f"y_train {y_train.shape} and y_test {y_test.shape} must both have shape "
            f"batch_shape + (num_timesteps,) + {tuple(model.event_shape)}"
        )
    if y_test.shape[time_axis] == 0:
        raise ValueError("y_test has no time steps: a log score over an empty test set is "
                         "undefined (it is not 0)")
    y_all = np.concatenate([y_train, y_test], axis=time_axis)
    mask = None
    if mask_train is not None or mask_test is not None:
        mt = np.ones(y_train.shape, bool) if mask_train is None else np.asarray(mask_train)
        ms = np.ones(y_test.shape, bool) if mask_test is None else np.asarray(mask_test)
        if mt.ndim != ms.ndim:
            raise ValueError("mask_train and mask_test must both be per step or both per entry")
        mask = np.concatenate([mt, ms], axis=time_axis)
    inputs = None
    if model.num_inputs:
        if inputs_train is None or inputs_test is None:
            raise ValueError("this model takes inputs: pass inputs_train and inputs_test")
        inputs = np.concatenate([np.asarray(inputs_train), np.asarray(inputs_test)], axis=-2)
    res = _filter(model, params, y_all, mask=mask, inputs=inputs)
    score = jnp.sum(res.log_probs[..., y_train.shape[time_axis] :], axis=-1)
    return float(score) if score.ndim == 0 else score
