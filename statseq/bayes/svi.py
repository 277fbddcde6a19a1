"""Variational inference for statseq models with NumPyro's SVI (for larger models).

Maximizes the evidence lower bound

    ELBO(q) = E_q[log p(y | theta) + log p(theta) - log q(theta)]

over a guide ``q`` in the unconstrained parameter space (mean-field normal, full-rank
normal, or a point mass, which gives the MAP estimate with the prior's Jacobian).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np
import optax

from statseq.bayes import _joint
from statseq.core.validation import check_key, check_positive_int


class SVIResult(NamedTuple):
    """Output of `fit_svi`.

    Attributes:
        draws: params pytree with a leading ``(num_samples,)`` axis, drawn from the guide
            (frozen leaves repeated).
        losses: ``(num_steps,)`` negative ELBO estimates (one per optimizer step).
        guide: the NumPyro autoguide.
        guide_params: its fitted parameters (``guide.median(guide_params)`` etc. work).

    Examples:
        >>> import jax, statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> res = ss.fit_svi(ss.LocalLevel(), y, key=jax.random.key(0), num_steps=50,
        ...                  num_samples=20)
        >>> res.draws.obs_var.shape, res.losses.shape
        ((20,), (50,))
    """

    draws: Any
    losses: np.ndarray
    guide: Any
    guide_params: Any


_GUIDES = ("normal", "mvn", "delta")


def fit_svi(model, y, *, key, num_steps=2000, guide="normal", optimizer=None,
            num_samples=1000, num_particles=1, priors=None, mask=None, inputs=None,
            init_params=None, trainable=None, ordered=None, ties=None,
            progress=False) -> SVIResult:
    """Approximate the posterior of ``model``'s parameters by stochastic variational inference.

        q* = argmax_q E_q[log p(y | theta) + log p(theta) - log q(theta)]

    Same priors, frozen leaves and ordering option as `fit_nuts`; the loop is NumPyro's
    compiled ``SVI.run``.

    Args:
        model: a statseq model.
        y: data, ``batch_shape + (num_timesteps,) + event_shape``.
        key: a ``jax.random`` key (keyword-only, required).
        num_steps: optimizer steps.
        guide: ``"normal"`` (``AutoNormal``, mean field), ``"mvn"``
            (``AutoMultivariateNormal``, full rank) or ``"delta"`` (``AutoDelta``, a point
            estimate: MAP in unconstrained coordinates).
        optimizer: an optax ``GradientTransformation`` (default ``optax.adam(1e-2)``).
        num_samples: draws from the fitted guide returned in ``draws``.
        num_particles: Monte Carlo samples per ELBO gradient.
        priors: pytree like ``params`` of numpyro distributions (``None`` leaves: defaults).
        mask: optional observation mask.
        inputs: covariates, when the model takes them.
        init_params: where the guide starts (default ``model.initialize(y)``).
        trainable: pytree like ``params`` of ``True``/``False`` (``False`` freezes a leaf)
            or, for leaves with an elementwise or simplex constraint, boolean arrays of the
            leaf's shape: only the ``True`` entries are sampled (the free entries of a
            simplex row share the mass its fixed entries leave, a scaled Dirichlet a priori;
            see `fit_nuts`); fixed entries keep their value in every draw.
        ordered: dotted name of a per-state leaf to keep ordered (see `fit_nuts`).
        ties: integer labels tying free entries of elementwise leaves, variances of
            covariances and entries of a simplex leaf (see `fit_nuts`): each elementwise
            or variance tie group is one site ``"tied.L"`` of the guide, a tied simplex leaf
            one site of its free entries; ``draws`` holds the full leaves with tied entries
            equal.
        progress: show NumPyro's progress bar.

    Returns:
        An `SVIResult`.

    Examples:
        >>> import jax, statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> res = ss.fit_svi(ss.LocalLevel(), y, key=jax.random.key(0), num_steps=200,
        ...                  num_samples=50)
        >>> res.draws.obs_var.shape, res.losses.shape
        ((50,), (200,))
    """
    check_key(key)
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoDelta, AutoMultivariateNormal, AutoNormal
    from numpyro.infer.initialization import init_to_value
    from numpyro.optim import optax_to_numpyro

    num_steps = check_positive_int(num_steps, "num_steps")
    num_samples = check_positive_int(num_samples, "num_samples")
    num_particles = check_positive_int(num_particles, "num_particles")
    if guide not in _GUIDES:
        raise ValueError(f"guide must be one of {_GUIDES}, got {guide!r}")
    if optimizer is None:
        optimizer = optax.adam(1e-2)
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TypeError("optimizer must be an optax GradientTransformation, e.g. optax.adam(1e-2)")
    init_key, run_key, draw_key = jax.random.split(key, 3)
    spec = _joint.prepare_joint(model, y, priors=priors, mask=mask, inputs=inputs,
                                init_params=init_params, trainable=trainable,
                                ordered=ordered, key=init_key, ties=ties)
    if not _joint.sampled_indices(spec) and not spec.ties:
        raise ValueError("every parameter is frozen (trainable): nothing to fit")
    values = _joint.site_values(spec)
    kind = {"normal": AutoNormal, "mvn": AutoMultivariateNormal, "delta": AutoDelta}[guide]
    auto = kind(_joint.numpyro_model, init_loc_fn=init_to_value(values=values))
    svi = SVI(_joint.numpyro_model, auto, optax_to_numpyro(optimizer),
              Trace_ELBO(num_particles=num_particles))
    result = svi.run(run_key, num_steps, spec, progress_bar=progress)
    samples = auto.sample_posterior(draw_key, result.params, sample_shape=(num_samples,))
    draws = _joint.params_from_samples(spec, samples, (num_samples,))
    return SVIResult(draws=draws, losses=np.asarray(result.losses), guide=auto,
                     guide_params=result.params)
