"""Variational inference for statseq models with NumPyro's SVI (for larger models).

Maximizes the evidence lower bound

    ELBO(q) = E_q[log p(y | theta) + log p(theta) - log q(theta)]

over a guide ``q`` in the unconstrained parameter space (mean-field normal, full-rank
normal, or a point mass, which gives the MAP estimate with the prior's Jacobian).

With ``batch_size`` (a panel of ``N`` sequences) each step's ELBO uses ``batch_size``
sequences drawn without replacement by the step's key, their log-likelihood scaled by
``N / batch_size`` (NumPyro's ``plate(..., subsample_size=)``), an unbiased estimate of the
full-panel ELBO and of its gradient.
"""

from __future__ import annotations

import functools
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
            batch_size=None, progress=False) -> SVIResult:
    """Approximate the posterior of ``model``'s parameters by stochastic variational inference.

        q* = argmax_q E_q[log p(y | theta) + log p(theta) - log q(theta)]

    Same priors, frozen leaves and ordering option as `fit_nuts`; the loop is NumPyro's
    compiled ``SVI.run``.

    Data subsampling: for a panel ``y`` of ``N`` sequences, ``batch_size=B`` makes every
    step draw ``B`` of them without replacement (by the step's key) and estimate

        ELBO ~ E_q[(N / B) sum_{i in batch} log p(y_i | theta) + log p(theta) - log q(theta)]

    (NumPyro's ``plate("sequences", N, subsample_size=B)``): unbiased for the full-panel
    ELBO and its gradient, at ``B / N`` of the likelihood cost per step (more steps, or a
    decaying learning rate, make up for the noise). ``batch_size=N`` (or ``None``) is the
    full-data fit, step for step the same as without it. On a panel sharded over ``D``
    devices (`statseq.distributed.shard_batch`: rows padded to ``N' = ceil(N / D) * D``,
    the padded rows fully masked) ``N`` is the padded count ``N'`` (padded rows add
    nothing, so the estimate stays unbiased); when ``D`` divides ``B`` the draw is
    stratified, ``B / D`` rows from each device's block (every row still has inclusion
    probability ``B / N'``), and the gather is batched over the device axis so each
    device reads only its own rows: the minibatch stays balanced over the mesh. When ``D``
    does not divide ``B`` the ``B`` rows are drawn from the whole panel and gathered
    across devices (still unbiased, but a device may get more rows than another).

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
        batch_size: sequences per step (``None``: all ``N``, the exact ELBO); ``y`` must
            then be a panel ``(N, num_timesteps, *event_shape)`` (one batch axis) and
            ``1 <= batch_size <= N``.
        progress: show NumPyro's progress bar.

    Returns:
        An `SVIResult` (with ``batch_size < N``, ``losses`` are the subsampled estimates).

    Examples:
        >>> import jax, statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> res = ss.fit_svi(ss.LocalLevel(), y, key=jax.random.key(0), num_steps=50,
        ...                  num_samples=20)
        >>> res.draws.obs_var.shape, res.losses.shape
        ((20,), (50,))

        Subsampling 8 of 32 sequences per step (not run here: one more compilation)::

            y = np.random.default_rng(0).normal(size=(32, 20))
            res = ss.fit_svi(ss.AR(order=1), y, key=jax.random.key(0), num_steps=2000,
                             batch_size=8,
                             optimizer=optax.adam(optax.exponential_decay(2e-2, 1000, 0.1)))
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
    joint = subsampled_model(spec, batch_size)
    kind = {"normal": AutoNormal, "mvn": AutoMultivariateNormal, "delta": AutoDelta}[guide]
    auto = kind(joint, init_loc_fn=init_to_value(values=values))
    svi = SVI(joint, auto, optax_to_numpyro(optimizer),
              Trace_ELBO(num_particles=num_particles))
    result = svi.run(run_key, num_steps, spec, progress_bar=progress)
    samples = auto.sample_posterior(draw_key, result.params, sample_shape=(num_samples,))
    draws = _joint.params_from_samples(spec, samples, (num_samples,))
    return SVIResult(draws=draws, losses=np.asarray(result.losses), guide=auto,
                     guide_params=result.params)


SUBSAMPLE_PLATE = "sequences"


def subsampled_model(spec, batch_size):
    """The NumPyro model of ``spec`` whose likelihood uses ``batch_size`` sequences a call
    (`_joint.numpyro_model` itself when ``batch_size`` is ``None`` or all of them)."""
    if batch_size is None:
        return _joint.numpyro_model
    data = spec.data
    if len(data.batch_shape) != 1:
        raise ValueError(f"batch_size needs a panel y of shape (num_sequences, num_timesteps, "
                         f"...) with one batch axis; got batch shape {data.batch_shape}")
    n = int(data.batch_shape[0])
    batch_size = check_positive_int(batch_size, "batch_size")
    if batch_size > n:
        raise ValueError(f"batch_size={batch_size} exceeds the {n} sequences of y")
    if batch_size == n:
        return _joint.numpyro_model
    blocks = num_blocks(data.y)
    if batch_size % blocks:
        blocks = 1  # not balanced over the mesh: rows drawn from the whole panel
    return functools.partial(_subsampled, batch_size=batch_size, blocks=blocks)


def num_blocks(y) -> int:
    """How many devices hold equal blocks of ``y``'s rows (1 unless sharded on axis 0)."""
    sharding = getattr(y, "sharding", None)
    if sharding is None or isinstance(y, jax.core.Tracer):
        return 1
    n = int(y.shape[0])
    rows = int(sharding.shard_shape(y.shape)[0])
    return n // rows if 0 < rows < n and n % rows == 0 else 1


def draw_rows(key, num_rows, batch_size, blocks=1):
    """``batch_size`` distinct row indices, uniformly: with ``blocks > 1`` (dividing
    ``num_rows`` and ``batch_size``) ``batch_size / blocks`` from each contiguous block, as
    local indices of shape ``(blocks, batch_size / blocks)``; else global ones
    ``(batch_size,)``."""
    if blocks == 1:
        return jax.random.choice(key, num_rows, (batch_size,), replace=False)
    per, b = num_rows // blocks, batch_size // blocks
    keys = jax.random.split(key, blocks)
    return jax.vmap(lambda k: jax.random.choice(k, per, (b,), replace=False))(keys)


def take_rows(x, rows, blocks=1):
    """Rows ``rows`` (from `draw_rows`) of ``x``; per block, batched over the blocks, so a
    block sharded on one device is read there."""
    if x is None:
        return None
    if blocks == 1:
        return x[rows]
    per = x.shape[0] // blocks
    xb = x.reshape((blocks, per) + x.shape[1:])
    out = jax.vmap(lambda a, i: a[i])(xb, rows)
    return out.reshape((-1,) + x.shape[1:])


def minibatch_indices(rows, num_rows, blocks=1):
    """Global row indices of ``rows`` (``(batch_size,)``)."""
    if blocks == 1:
        return rows
    per = num_rows // blocks
    return (rows + per * jax.numpy.arange(blocks)[:, None]).reshape(-1)


def _subsampled(spec, *, batch_size, blocks):
    import numpyro
    from numpyro import handlers

    from statseq.bayes.distribution import SequenceDistribution

    params = _joint.sample_params(spec)
    data = spec.data
    n = int(data.batch_shape[0])
    rows = draw_rows(numpyro.prng_key(), n, batch_size, blocks)
    index = minibatch_indices(rows, n, blocks)
    y = take_rows(data.y, rows, blocks)
    mask = None if data.complete else take_rows(data.mask, rows, blocks)
    inputs = None
    if spec.model.num_inputs:
        inputs = data.inputs
        if inputs is not None and inputs.ndim == 3:  # per sequence (else shared by all)
            inputs = take_rows(inputs, rows, blocks)
    with handlers.substitute(data={SUBSAMPLE_PLATE: index}):
        with numpyro.plate(SUBSAMPLE_PLATE, n, subsample_size=batch_size, dim=-1):
            numpyro.sample("y", SequenceDistribution(spec.model, params, mask=mask,
                                                     inputs=inputs,
                                                     num_timesteps=data.num_timesteps),
                           obs=y)
