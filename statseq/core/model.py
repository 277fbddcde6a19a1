"""The filter protocol shared by every statseq model.

A statseq model is a distribution over sequences written autoregressively,

    log p(y_{1:T} | u_{1:T}) = sum_t log p(y_t | y_{<t}, u_{<=t}),

where each one-step predictive is read from a fixed-size state (the *carry*) that a
recurrence updates with every observation. A model therefore implements three methods:

* ``initial_carry(params)``: the state before any observation;
* ``predict(params, carry, inputs_t)``: the predictive ``p(y_t | y_{<t}, u_{<=t})`` as a
  numpyro distribution;
* ``update(params, carry, y_t, mask_t, inputs_t)``: the state after conditioning on the
  observed entries of ``y_t`` (``mask_t`` is ``True`` where observed; masked entries of
  ``y_t`` hold zeros and must be ignored).

Everything else (``log_prob``, ``filter``, ``sample``, ``forecast``, ``fit_sgd``) is written
once over this protocol in `statseq.core.recurrence` and `statseq.fit`.

Model objects are frozen dataclasses that hold static configuration only; parameters are
plain pytrees (one ``NamedTuple`` per family) passed alongside, so that the same object
flows through ``jax.jit`` (as a static, hashable argument), ``vmap``, optax and NumPyro.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

from statseq.core.distributions import masked_log_prob

Params = Any
Carry = Any

_MODEL_REGISTRY: dict[str, type[SequenceModel]] = {}

# Model families that `import statseq` does not import (loaded on first access of one of
# their names, `statseq.__getattr__`): their classes register when their module runs, so
# `registered_models` imports them first (a saved neural model loads without any access).
_DEFERRED_MODEL_MODULES = ("statseq.models.neural", "statseq.models.deepstate")


def register_model(cls: type[SequenceModel]) -> type[SequenceModel]:
    """Class decorator: register a concrete model for saving/loading and contract tests.

    Examples:
        >>> import statseq as ss
        >>> ss.register_model(ss.AR) is ss.AR     # registering the same class again: a no-op
        True
        >>> ss.registered_models()["AR"] is ss.AR
        True
    """
    name = cls.__name__
    old = _MODEL_REGISTRY.get(name)
    if old is not None and old is not cls:
        # the same class executed twice (pytest's importlib mode given a module's path runs
        # it as a fresh module) keeps the first registration; another class is an error
        if (old.__module__, old.__qualname__) == (cls.__module__, cls.__qualname__):
            return cls
        raise ValueError(f"a model named {name!r} is already registered")
    _MODEL_REGISTRY[name] = cls
    return cls


def registered_models() -> dict[str, type[SequenceModel]]:
    """All registered model classes, by class name.

    Examples:
        >>> import statseq as ss
        >>> models = ss.registered_models()
        >>> {"AR", "PoissonHMM", "LocalLevel", "LSTM"} <= set(models)
        True
    """
    import importlib

    for module in _DEFERRED_MODEL_MODULES:  # a no-op once imported
        importlib.import_module(module)
    return dict(_MODEL_REGISTRY)


class SequenceModel(abc.ABC):
    """Abstract base of every statseq model (a filter over sequences).

    Subclasses are ``@dataclasses.dataclass(frozen=True)`` classes whose fields are the
    static configuration (orders, dimensions, options). They implement the abstract
    methods below and nothing else is required; optional capabilities (EM, smoothing,
    parallel filtering, closed-form estimators) are extra methods.

    Examples:
        >>> import jax.numpy as jnp, statseq as ss
        >>> model = ss.AR(order=2)
        >>> isinstance(model, ss.SequenceModel), model.event_shape
        (True, ())
        >>> params = model.default_params()
        >>> carry = model.initial_carry(params)            # the filter protocol, one step:
        >>> u = jnp.zeros((0,))                              # no inputs
        >>> dist = model.predict(params, carry, u)          # a numpyro distribution for y_t
        >>> carry = model.update(params, carry, 0.5, True, u)
        >>> dist.batch_shape
        ()
    """

    #: Whether ``update`` and ``predict`` marginalize a subset of emission dimensions
    #: exactly (per-dimension masks). Models that cannot reject such masks eagerly.
    supports_partial_mask: ClassVar[bool] = False

    #: Whether the time axis may be padded to a bucket length with masked steps at its end
    #: (`statseq.core.buckets`). False for models whose parameters have a time axis.
    supports_length_buckets: ClassVar[bool] = True

    #: Whether a masked step in ``update`` is exact marginalization (predict without
    #: update); False for models that read their own past (the AR-HMM and MS-AR, whose
    #: ``h_step_marginals`` give closed forms, and neural networks, estimated by Monte Carlo).
    marginalizes_masked_steps: ClassVar[bool] = True

    # ---- static description -------------------------------------------------------
    @property
    @abc.abstractmethod
    def event_shape(self) -> tuple[int, ...]:
        """Shape of one observation ``y_t`` (``()`` for a scalar series)."""

    @property
    def num_inputs(self) -> int:
        """Number of covariates ``u_t`` per time step (0 when the model takes none)."""
        return int(getattr(self, "input_dim", 0) or 0)

    @property
    def observation_dtype(self) -> str:
        """``"real"``, ``"count"`` (non-negative integers) or ``"category"``."""
        return "real"

    def config(self) -> dict[str, Any]:
        """The static configuration as a JSON-friendly dict (used when saving)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    # ---- parameters -----------------------------------------------------------------
    @abc.abstractmethod
    def param_shapes(self) -> Params:
        """A params pytree whose leaves are the expected shapes (tuples)."""

    @abc.abstractmethod
    def param_constraints(self) -> Params:
        """A params pytree whose leaves are ``numpyro.distributions.constraints``."""

    def initialize(self, y, *, key, inputs=None, mask=None) -> Params:  # pragma: no cover
        """Initial parameters from data (override per model)."""
        raise NotImplementedError(f"{type(self).__name__} has no data-driven initializer")

    # ---- the filter -----------------------------------------------------------------
    @abc.abstractmethod
    def initial_carry(self, params: Params) -> Carry:
        """The state before the first observation."""

    @abc.abstractmethod
    def predict(self, params: Params, carry: Carry, inputs_t):
        """The one-step predictive distribution of ``y_t`` (a numpyro distribution)."""

    @abc.abstractmethod
    def update(self, params: Params, carry: Carry, y_t, mask_t, inputs_t) -> Carry:
        """The state after conditioning on the observed entries of ``y_t``."""

    def step(self, params: Params, carry: Carry, y_t, mask_t, inputs_t):
        """One filter step: ``(log p(observed y_t | past), carry after y_t)``.

        The default predicts, scores the observed entries with
        `statseq.core.distributions.masked_log_prob` and updates. Models override it
        when scoring and updating share work (an HMM's emission log-likelihoods, a Kalman
        filter's innovation); the contract test checks an override against the default.
        """
        d = self.predict(params, carry, inputs_t)
        log_prob = masked_log_prob(d, y_t, mask_t)
        return log_prob, self.update(params, carry, y_t, mask_t, inputs_t)

    @property
    def num_conditioned_steps(self) -> int:
        """Leading time steps that are conditioned on rather than modelled.

        Their predictive log-densities are not part of the likelihood (0 in ``log_probs``),
        e.g. the first ``p`` values of a conditional AR(p) likelihood. Default 0.
        """
        return 0

    def num_redundant_params(self, free) -> int:
        """Exact invariances among the free parameters (default 0).

        The number of independent directions of the unconstrained parameters along which
        the likelihood of *every* data set is constant (a constant added to one row of
        softmax logits, a change of basis of a state space model's latent state), counted
        only where every entry the invariance moves is free. `statseq.num_free_params`
        subtracts it, so that ``num_params`` counts identified parameters (as a simplex of
        ``K`` entries counts ``K - 1``).

        Args:
            free: a pytree like the params whose leaves are ``True``/``False`` (a whole leaf
                free or frozen) or boolean arrays of the leaf's shape (its free entries).
        """
        del free
        return 0

    def validate_data(self, y, mask) -> None:  # noqa: B027 - optional hook
        """Model-specific checks on observed values (e.g. counts are non-negative)."""
        del y, mask
