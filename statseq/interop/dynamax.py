"""Conversion to and from dynamax, statseq's closest peer (https://github.com/probml/dynamax).

Both libraries write the same models with the same time indexing; dynamax's linear
Gaussian model ``z_1 ~ N(m, S)``, ``z_t = F z_{t-1} + B u_t + b + q_t`` is statseq's
``x_0 ~ N(m, P)``, ``x_{t+1} = F x_t + B u_{t+1} + b + w_t`` (the state at step ``t``
is driven by the input at step ``t`` in both). The supported pairs (statseq, dynamax):

* `LinearGaussianSSM` (``initial="free"``) and ``linear_gaussian_ssm.LinearGaussianSSM``;
* `CategoricalHMM` (probs ``(K, C)``) and ``hidden_markov_model.CategoricalHMM`` with
  ``emission_dim=1`` (probs ``(K, 1, C)``);
* `GaussianHMM` (``covariance="full"``) and ``hidden_markov_model.GaussianHMM``;
* `GaussianHMM` (``covariance="diagonal"``) and ``hidden_markov_model.DiagonalGaussianHMM``
  (standard deviations ``scale_diags = sqrt(variances)``);
* `GaussianHMM` (``covariance="tied"``) and ``hidden_markov_model.SharedCovarianceGaussianHMM``;
* `GaussianHMM` (``covariance="spherical"``) and ``hidden_markov_model.SphericalGaussianHMM``
  (standard deviations ``scales = sqrt(variances)``);
* `PoissonHMM` and ``hidden_markov_model.PoissonHMM``;
* `BernoulliHMM` and ``hidden_markov_model.BernoulliHMM``.

A statseq scalar series (``emission_dim=None``) is a dynamax series of dimension 1: pass
``y[:, None]`` to dynamax. Anything dynamax cannot express (a stationary or diffuse
initial law, time-varying matrices, input-driven HMM transitions) raises ``ValueError``;
model types without a twin raise ``TypeError``. dynamax is imported only inside the
functions (it pulls in TensorFlow Probability), so ``import statseq`` never loads it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from statseq.core.params import validate_params
from statseq.models.hmm.base import HMMParams
from statseq.models.hmm.bernoulli import BernoulliEmissions, BernoulliHMM
from statseq.models.hmm.categorical import CategoricalEmissions, CategoricalHMM
from statseq.models.hmm.gaussian import (
    DiagonalGaussianEmissions,
    GaussianEmissions,
    GaussianHMM,
    SphericalGaussianEmissions,
    TiedGaussianEmissions,
)
from statseq.models.hmm.poisson import PoissonEmissions, PoissonHMM
from statseq.models.ssm.linear import (
    LGSSMParams,
    LinearGaussianSSM,
    TimeVaryingLinearGaussianSSM,
)

_SUPPORTED = "LinearGaussianSSM, CategoricalHMM, GaussianHMM, PoissonHMM, BernoulliHMM"

_ARHMM_NOTE = (
    "LinearAutoregressiveHMM is not converted: statseq's likelihood conditions on the "
    "first num_lags observations, dynamax's scores them with zero pre-sample lags, so the "
    "same parameters give different models (see LinearAutoregressiveHMM's docstring for "
    "how to make dynamax compute statseq's likelihood)"
)


def _import_dynamax():
    """The dynamax modules used here, or an `ImportError` saying how to install them."""
    try:
        import dynamax.hidden_markov_model as dhmm
        import dynamax.linear_gaussian_ssm as dlgssm
    except ImportError as err:
        raise ImportError(
            "converting to or from dynamax needs the optional dependency dynamax: "
            "pip install dynamax"
        ) from err
    return dhmm, dlgssm


# ------------------------------------------------------------------------------------------
# statseq -> dynamax


def to_dynamax(model, params):
    """Convert a statseq model and its parameters to the equivalent dynamax model.

    The converted model has the same likelihood: for a linear Gaussian model

        x_0 ~ N(m, P),  x_{t+1} = F x_t + B u_{t+1} + b + w_t,  y_t = H x_t + D u_t + d + v_t,

    and for an HMM ``z_1 ~ pi``, ``z_t | z_{t-1} ~ A[z_{t-1}]``, ``y_t | z_t = k ~
    p(y | theta_k)``, ``dynamax_model.marginal_log_prob(dynamax_params, y)`` equals
    ``statseq.log_prob(model, params, y)`` (with ``y[:, None]`` on the dynamax side for a
    scalar series). Values are copied unchanged except for the diagonal Gaussian HMM,
    whose variances become dynamax's standard deviations ``scale_diags``.

    Args:
        model: a `LinearGaussianSSM` with ``initial="free"``, or a `CategoricalHMM`,
            `GaussianHMM`, `PoissonHMM` or `BernoulliHMM` with ``initial="free"`` and no
            inputs.
        params: the model's parameters.

    Returns:
        ``(dynamax_model, dynamax_params)``.

    Raises:
        TypeError: ``model`` has no dynamax twin.
        ValueError: the model's configuration cannot be expressed in dynamax (a stationary
            or diffuse initial law, time-varying matrices, input-driven transitions).
        ImportError: dynamax is not installed.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.array([0, 3, 1, 7, 2, 5])
        >>> model = ss.PoissonHMM(num_states=2)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> dmodel, dparams = ss.to_dynamax(model, params)
        >>> type(dmodel).__name__, dparams.emissions.rates.shape
        ('PoissonHMM', (2, 1))
        >>> bool(np.isclose(dmodel.marginal_log_prob(dparams, y[:, None]),
        ...                 ss.log_prob(model, params, y)))
        True
    """
    if isinstance(model, TimeVaryingLinearGaussianSSM):
        raise ValueError(
            "TimeVaryingLinearGaussianSSM is not converted (the two libraries lay out "
            "time-varying matrices differently); only the time-invariant LinearGaussianSSM "
            "converts"
        )
    if type(model).__name__ == "LinearAutoregressiveHMM":
        raise TypeError(_ARHMM_NOTE)
    converter = _TO_DYNAMAX.get(type(model))
    if converter is None:
        raise TypeError(
            f"{type(model).__name__} has no dynamax counterpart; convertible models: "
            f"{_SUPPORTED}"
        )
    _check_statseq_config(model)
    validate_params(model, params)
    return converter(model, params, *_import_dynamax())


def _check_statseq_config(model) -> None:
    name = type(model).__name__
    if isinstance(model, LinearGaussianSSM):
        if model.initial != "free":
            raise ValueError(
                f"{name}(initial={model.initial!r}) cannot be expressed in dynamax, whose "
                "initial state law is a given N(m, S): use initial='free' (for a stationary "
                "law, set m and P to its moments)"
            )
        return
    if model.input_dim:
        raise ValueError(
            f"{name}(input_dim={model.input_dim}) has input-driven transitions, which "
            "dynamax's HMMs do not have; only input_dim=0 converts"
        )
    if model.initial != "free":
        raise ValueError(
            f"{name}(initial={model.initial!r}) ties the initial law to the transitions, "
            "which dynamax cannot express: use initial='free'"
        )


def _hmm_common(params):
    return {"initial_probs": jnp.asarray(params.initial_probs),
            "transition_matrix": jnp.asarray(params.transitions)}


def _lgssm_to(model, params, dhmm, dlgssm):
    del dhmm
    dmodel = dlgssm.LinearGaussianSSM(
        state_dim=model.state_dim, emission_dim=model.dim, input_dim=model.input_dim,
        has_dynamics_bias=True, has_emissions_bias=True,
    )
    p = jax.tree.map(jnp.asarray, params)
    dparams = dlgssm.ParamsLGSSM(
        initial=dlgssm.ParamsLGSSMInitial(mean=p.initial_mean, cov=p.initial_cov),
        dynamics=dlgssm.ParamsLGSSMDynamics(
            weights=p.dynamics_weights, bias=p.dynamics_bias,
            input_weights=p.dynamics_input_weights, cov=p.dynamics_cov),
        emissions=dlgssm.ParamsLGSSMEmissions(
            weights=p.emission_weights, bias=p.emission_bias,
            input_weights=p.emission_input_weights, cov=p.emission_cov),
    )
    return dmodel, dparams


def _initialize(dmodel, **values):
    """``dmodel.initialize`` with every value given (nothing is drawn from the key)."""
    dparams, _ = dmodel.initialize(key=jax.random.key(0), **values)
    return dmodel, dparams


def _categorical_to(model, params, dhmm, dlgssm):
    dmodel = dhmm.CategoricalHMM(model.num_states, emission_dim=1,
                                 num_classes=model.num_classes)
    return _initialize(dmodel, **_hmm_common(params),
                       emission_probs=jnp.asarray(params.emissions.probs)[:, None, :])


def _gaussian_to(model, params, dhmm, dlgssm):
    common = _hmm_common(params)
    means = jnp.asarray(params.emissions.means)
    if model.covariance == "full":
        dmodel = dhmm.GaussianHMM(model.num_states, model.emission_dim)
        return _initialize(dmodel, **common, emission_means=means,
                           emission_covariances=jnp.asarray(params.emissions.covs))
    if model.covariance == "tied":
        dmodel = dhmm.SharedCovarianceGaussianHMM(model.num_states, model.emission_dim)
        return _initialize(dmodel, **common, emission_means=means,
                           emission_covariance=jnp.asarray(params.emissions.cov))
    if model.covariance == "spherical":
        dmodel = dhmm.SphericalGaussianHMM(model.num_states, model.emission_dim)
        return _initialize(dmodel, **common, emission_means=means,
                           emission_scales=jnp.sqrt(jnp.asarray(params.emissions.variances)))
    dmodel = dhmm.DiagonalGaussianHMM(model.num_states, model.emission_dim)
    return _initialize(dmodel, **common, emission_means=means,
                       emission_scale_diags=jnp.sqrt(jnp.asarray(params.emissions.variances)))


def _poisson_to(model, params, dhmm, dlgssm):
    dim = 1 if model.emission_dim is None else model.emission_dim
    dmodel = dhmm.PoissonHMM(model.num_states, emission_dim=dim)
    rates = jnp.reshape(jnp.asarray(params.emissions.rates), (model.num_states, dim))
    return _initialize(dmodel, **_hmm_common(params), emission_rates=rates)


def _bernoulli_to(model, params, dhmm, dlgssm):
    dmodel = dhmm.BernoulliHMM(model.num_states, emission_dim=model.emission_dim)
    return _initialize(dmodel, **_hmm_common(params),
                       emission_probs=jnp.asarray(params.emissions.probs))


_TO_DYNAMAX = {
    LinearGaussianSSM: _lgssm_to,
    CategoricalHMM: _categorical_to,
    GaussianHMM: _gaussian_to,
    PoissonHMM: _poisson_to,
    BernoulliHMM: _bernoulli_to,
}


# ------------------------------------------------------------------------------------------
# dynamax -> statseq


def from_dynamax(dynamax_model, dynamax_params, *, scalar: bool = False):
    """Convert a dynamax model and its parameters to the equivalent statseq model.

    The inverse of `to_dynamax`: ``statseq.log_prob(model, params, y)`` equals
    ``dynamax_model.marginal_log_prob(dynamax_params, y)``, for the linear Gaussian model

        z_1 ~ N(m, S),  z_t = F z_{t-1} + B u_t + b + q_t,  y_t = H z_t + D u_t + d + r_t

    and the HMMs listed in the module docstring. A dynamax model without biases
    (``has_dynamics_bias=False`` or ``has_emissions_bias=False``) gets zero biases.
    statseq-only options (``GaussianHMM.min_variance``) take their defaults: change them
    with `dataclasses.replace`.

    Args:
        dynamax_model: a dynamax ``LinearGaussianSSM``, ``CategoricalHMM`` (with
            ``emission_dim=1``), ``GaussianHMM``, ``DiagonalGaussianHMM``,
            ``SharedCovarianceGaussianHMM``, ``SphericalGaussianHMM``, ``PoissonHMM`` or
            ``BernoulliHMM``.
        dynamax_params: its parameters (time-invariant).
        scalar: give a `LinearGaussianSSM` or `PoissonHMM` of ``emission_dim=1`` statseq's
            scalar event shape ``()`` (``emission_dim=None``), so that ``y`` is
            ``(num_timesteps,)``; the inverse of `to_dynamax` on a scalar model.

    Returns:
        ``(model, params)``, statseq's model (always ``initial="free"``) and parameters.

    Raises:
        TypeError: the dynamax model has no statseq twin.
        ValueError: the parameters are time-varying, a categorical HMM has several
            emissions per step, or ``scalar`` does not apply.
        ImportError: dynamax is not installed.

    Examples:
        >>> import statseq as ss
        >>> from dynamax.hidden_markov_model import PoissonHMM
        >>> dmodel = PoissonHMM(num_states=3, emission_dim=2)
        >>> dparams, _ = dmodel.initialize()
        >>> model, params = ss.from_dynamax(dmodel, dparams)
        >>> model.num_states, params.emissions.rates.shape
        (3, (3, 2))
    """
    dhmm, dlgssm = _import_dynamax()
    table = {
        dlgssm.LinearGaussianSSM: _lgssm_from,
        dhmm.CategoricalHMM: _categorical_from,
        dhmm.GaussianHMM: _gaussian_from,
        dhmm.DiagonalGaussianHMM: _gaussian_from,
        dhmm.SharedCovarianceGaussianHMM: _gaussian_from,
        dhmm.SphericalGaussianHMM: _gaussian_from,
        dhmm.PoissonHMM: _poisson_from,
        dhmm.BernoulliHMM: _bernoulli_from,
    }
    if type(dynamax_model) is dhmm.LinearAutoregressiveHMM:
        raise TypeError(_ARHMM_NOTE)
    converter = table.get(type(dynamax_model))
    if converter is None:
        raise TypeError(
            f"dynamax's {type(dynamax_model).__name__} has no statseq counterpart; "
            "convertible dynamax models: LinearGaussianSSM, CategoricalHMM, GaussianHMM, "
            "DiagonalGaussianHMM, SharedCovarianceGaussianHMM, SphericalGaussianHMM, "
            "PoissonHMM, BernoulliHMM"
        )
    if not isinstance(scalar, bool):
        raise TypeError(f"scalar must be a bool, got {type(scalar).__name__}")
    if scalar and (converter not in (_lgssm_from, _poisson_from)
                   or dynamax_model.emission_dim != 1):
        raise ValueError(
            "scalar=True applies to a dynamax LinearGaussianSSM or PoissonHMM with "
            f"emission_dim=1; got {type(dynamax_model).__name__} with emission_dim="
            f"{dynamax_model.emission_dim}"
        )
    model, params = converter(dynamax_model, dynamax_params, dhmm, scalar)
    validate_params(model, params)
    return model, params


def _time_invariant(name: str, value, ndim: int) -> jax.Array:
    value = jnp.asarray(value)
    if value.ndim != ndim:
        raise ValueError(
            f"dynamax parameter {name} has shape {value.shape}; only time-invariant "
            f"parameters ({ndim} axes) convert"
        )
    return value


def _lgssm_from(dmodel, dparams, dhmm, scalar):
    del dhmm
    n, d, m = dmodel.state_dim, dmodel.emission_dim, dmodel.input_dim
    dyn, emi = dparams.dynamics, dparams.emissions
    f = _time_invariant("dynamics.weights", dyn.weights, 2)
    h = _time_invariant("emissions.weights", emi.weights, 2)
    dtype = f.dtype

    def bias(name, value, has, size):
        if not has or value is None:
            return jnp.zeros((size,), dtype)
        return _time_invariant(name, value, 1)

    def input_weights(name, value, rows):
        if value is None:
            return jnp.zeros((rows, m), dtype)
        return _time_invariant(name, value, 2)

    model = LinearGaussianSSM(state_dim=n, emission_dim=None if scalar else d, input_dim=m,
                              initial="free")
    params = LGSSMParams(
        initial_mean=_time_invariant("initial.mean", dparams.initial.mean, 1),
        initial_cov=_time_invariant("initial.cov", dparams.initial.cov, 2),
        dynamics_weights=f,
        dynamics_input_weights=input_weights("dynamics.input_weights", dyn.input_weights, n),
        dynamics_bias=bias("dynamics.bias", dyn.bias, dmodel.has_dynamics_bias, n),
        dynamics_cov=_time_invariant("dynamics.cov", dyn.cov, 2),
        emission_weights=h,
        emission_input_weights=input_weights("emissions.input_weights", emi.input_weights, d),
        emission_bias=bias("emissions.bias", emi.bias, dmodel.has_emissions_bias, d),
        emission_cov=(jnp.diag(jnp.asarray(emi.cov)) if jnp.ndim(emi.cov) == 1  # diagonal R
                      else _time_invariant("emissions.cov", emi.cov, 2)),
    )
    return model, params


def _hmm_from(dparams, emissions):
    return HMMParams(
        initial_probs=jnp.asarray(dparams.initial.probs),
        transitions=_time_invariant("transitions.transition_matrix",
                                    dparams.transitions.transition_matrix, 2),
        emissions=emissions,
    )


def _categorical_from(dmodel, dparams, dhmm, scalar):
    if dmodel.emission_dim != 1:
        raise ValueError(
            f"dynamax CategoricalHMM with emission_dim={dmodel.emission_dim}: statseq's "
            "CategoricalHMM has one categorical emission per step (emission_dim=1)"
        )
    probs = jnp.asarray(dparams.emissions.probs)[:, 0, :]
    model = CategoricalHMM(num_states=dmodel.num_states, num_classes=probs.shape[-1])
    return model, _hmm_from(dparams, CategoricalEmissions(probs))


def _gaussian_from(dmodel, dparams, dhmm, scalar):
    means = jnp.asarray(dparams.emissions.means)
    if isinstance(dmodel, dhmm.DiagonalGaussianHMM):
        model = GaussianHMM(num_states=dmodel.num_states, emission_dim=dmodel.emission_dim,
                            covariance="diagonal")
        variances = jnp.square(jnp.asarray(dparams.emissions.scale_diags))
        return model, _hmm_from(dparams, DiagonalGaussianEmissions(means, variances))
    if isinstance(dmodel, dhmm.SharedCovarianceGaussianHMM):
        model = GaussianHMM(num_states=dmodel.num_states, emission_dim=dmodel.emission_dim,
                            covariance="tied")
        return model, _hmm_from(dparams, TiedGaussianEmissions(
            means, jnp.asarray(dparams.emissions.cov)))
    if isinstance(dmodel, dhmm.SphericalGaussianHMM):
        model = GaussianHMM(num_states=dmodel.num_states, emission_dim=dmodel.emission_dim,
                            covariance="spherical")
        # dynamax's prior draws may be float32: square in the float type statseq computes in
        scales = jnp.asarray(dparams.emissions.scales, jnp.result_type(float))
        return model, _hmm_from(dparams, SphericalGaussianEmissions(means, jnp.square(scales)))
    model = GaussianHMM(num_states=dmodel.num_states, emission_dim=dmodel.emission_dim,
                        covariance="full")
    return model, _hmm_from(dparams, GaussianEmissions(means, jnp.asarray(dparams.emissions.covs)))


def _poisson_from(dmodel, dparams, dhmm, scalar):
    model = PoissonHMM(num_states=dmodel.num_states,
                       emission_dim=None if scalar else dmodel.emission_dim)
    rates = jnp.reshape(jnp.asarray(dparams.emissions.rates),
                        (dmodel.num_states,) + model.event_shape)
    return model, _hmm_from(dparams, PoissonEmissions(rates))


def _bernoulli_from(dmodel, dparams, dhmm, scalar):
    model = BernoulliHMM(num_states=dmodel.num_states, emission_dim=dmodel.emission_dim)
    return model, _hmm_from(dparams, BernoulliEmissions(jnp.asarray(dparams.emissions.probs)))


__all__ = ["from_dynamax", "to_dynamax"]
