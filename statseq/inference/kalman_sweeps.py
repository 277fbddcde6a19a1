"""The exact Kalman filter by sweeps over blocks (`statseq.inference.sweeps`).

The exact (not steady-state) filter forgets where it started when the model is detectable
and stabilizable: the predicted covariance ``P_t`` follows the Riccati recursion, which
converges from any start, and the predicted mean's dependence on its start decays through
the products of ``F_t (I - K_t H_t)``. So the recursion

    (a_{t+1}, P_{t+1}) = predict(update((a_t, P_t), y_t)),   (a_0, P_0) = (m, P),

is one `sweeps.sweep_scan` can run as blocks at once: the blocks start from
``(m, P)``, then from their left neighbour's end, and stop when every block's carry
``(a_t, vec P_t)`` equals the previous sweep's **bit for bit** at a chunk boundary. On
the 4-state, 2-series benchmark model a covariance started wrong equals the true one bit
for bit after 120-290 steps and the mean after 180-330, so blocks of at least `MIN_BLOCK`
steps converge in two or three sweeps (`tests/inference/test_kalman_sweeps.py` checks the
number of sweeps on its model); blocks are about ``T / TARGET_BLOCKS`` long, not ``sqrt(T)``
(more blocks at once left the cache). A model that does not forget (no observations, an
unobserved random walk) is recomputed by the sequential scan, so the result is always the
sequential recursion's.

The loop carries the predicted moments and emits one flat row a step: the log-density's
pieces ``(sum z^2, diag L)`` of the whitened innovation (its logarithms are taken after
the loop) and, for `kalman.kalman_filter`, the filtered moments; the predicted moments
follow after the loop as one stacked product (`_predicted`). The step is
`kalman.innovation`, `kalman.joseph_update` and `kalman.predict_state`, as in
`kalman.kalman_step`, so the results equal the sequential filter's to rounding. Only
proper initial laws (no diffuse directions) take this path; its derivatives are the
sequential scan's (``jax.custom_jvp``; the sweeps' while loops have no reverse mode), and
under ``jax.vmap`` the sequences sweep together (``jax.custom_batching.custom_vmap``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from statseq.inference._backend import backend_kind
from statseq.inference.gaussian import symmetrize
from statseq.inference.kalman import (
    _BASE_NDIM,
    _LOG_2PI,
    _PER_STEP,
    SMALL_DIM,
    GaussianSSMArrays,
    _mm,
    innovation,
    joseph_update,
    predict_state,
)
from statseq.inference.sweeps import with_sweep_rules

#: `kalman.kalman_filter` and `kalman.kalman_log_prob` run by sweeps on CPU from this
#: many steps. Sweeps / sequential (4 states, 2 series, 10 % missing; paired medians,
#: load 7): 0.72 / 0.62 (filter / log-likelihood) at 1024 steps, 0.33 / 0.41 at 2048,
#: 0.49 / 0.38 at 4096, 0.54 / 0.42 at 8192. The program compiles for some seconds longer
#: than the sequential scan (the step vectorized over blocks; 5-7 s cold on the loaded
#: 2-core machine), so the threshold is the HMM filter's, where the time saved is tens of
#: milliseconds or more.
SWEEP_MIN_STEPS = 2**13


def use_sweeps(arrays: GaussianSSMArrays, num_timesteps: int,
               backend: str | None = None) -> bool:
    """Whether `kalman.kalman_filter` and `kalman.kalman_log_prob` run by sweeps over
    blocks: on CPU, from `SWEEP_MIN_STEPS` steps, for a proper initial law (no diffuse
    directions) and at most ``SMALL_DIM`` states and series.

    Args:
        arrays: the model's matrices.
        num_timesteps: ``T``.
        backend: a platform name, or ``None`` for JAX's default backend.

    Returns:
        ``True`` for the sweeps.

    Examples:
        >>> import jax.numpy as jnp
        >>> arr = GaussianSSMArrays(jnp.zeros(2), jnp.eye(2), jnp.eye(2), jnp.zeros((2, 0)),
        ...     jnp.zeros(2), jnp.eye(2), jnp.eye(2), jnp.zeros((2, 0)), jnp.zeros(2),
        ...     jnp.eye(2), jnp.zeros((2, 0)))
        >>> [use_sweeps(arr, t, b) for t, b in ((10**5, "cpu"), (100, "cpu"), (10**5, "gpu"))]
        [True, False, False]
    """
    n = arrays.initial_mean.shape[-1]
    num_series = arrays.emission_cov.shape[-1]
    return (backend_kind(backend) == "cpu" and num_timesteps >= SWEEP_MIN_STEPS
            and arrays.initial_diffuse.shape[-1] == 0
            and 0 < n <= SMALL_DIM and 0 < num_series <= SMALL_DIM)


#: the fewest steps per block: the carries of the benchmark models coalesce bit for bit
#: within some 200-330 steps of a guessed start, so that with blocks at least this long
#: two or three sweeps suffice (T = 10^5: two, T = 10^4: three, in float64 and float32;
#: blocks of 128 steps needed six)
MIN_BLOCK = 384

#: blocks run at once (all sequences together): a vectorized pass over ``T = 10^5`` steps
#: of the 4-state, 2-series model took 58 / 36 / 33 / 93 / 105 / 108 ms with 8 / 16 / 32 /
#: 64 / 128 / 256 blocks (the sequential scan 185 ms; load 7 on 2 cores): past some 32
#: blocks a step's temporaries leave the cache
TARGET_BLOCKS = 32


def block_length(num_timesteps: int, num_sequences: int = 1) -> int:
    """The block length of the sweeps: about ``TARGET_BLOCKS`` blocks in all (over the
    ``num_sequences`` sequences), at least `MIN_BLOCK` steps, a multiple of the chunk.

    Args:
        num_timesteps: ``T``.
        num_sequences: the sequences swept together.

    Returns:
        ``L``.

    Examples:
        >>> block_length(10**4), block_length(10**5), block_length(10**5, 64)
        (384, 3136, 100000)
    """
    from statseq.inference.sweeps import CHUNK

    per_sequence = max(1, TARGET_BLOCKS // num_sequences)
    length = CHUNK * -(-num_timesteps // (per_sequence * CHUNK))
    return max(length, MIN_BLOCK)


def _varying(arrays: GaussianSSMArrays):
    return [name for name, leaf, nd in zip(GaussianSSMArrays._fields, arrays, _BASE_NDIM,
                                           strict=True)
            if name in _PER_STEP and jnp.ndim(leaf) == nd + 1]


def _per_step_leaves(arrays: GaussianSSMArrays, varying, num_t: int):
    """The time-varying leaves with a time axis of ``T`` (dynamics leaves, ``T - 1`` long,
    repeat their last entry: the prediction after the last step is discarded; longer
    leaves are cut, as `kalman.arrays_at` never reads past ``T - 1``)."""
    out = []
    for name in varying:
        leaf = getattr(arrays, name)[:num_t]
        if leaf.shape[0] == 0:
            leaf = jnp.zeros((1,) + leaf.shape[1:], leaf.dtype)
        if leaf.shape[0] < num_t:
            leaf = jnp.concatenate(
                [leaf, jnp.broadcast_to(leaf[-1:], (num_t - leaf.shape[0],) + leaf.shape[1:])])
        out.append(leaf)
    return out


def _step(fixed: GaussianSSMArrays, varying, moments: bool):
    """One step on the flat predicted moments ``(a_t, vec P_t)``: update with ``y_t``,
    predict ``x_{t+1}``. It emits one flat row: ``(sum z^2, diag L)`` of the whitened
    innovation (the log-density's pieces; the logarithms are taken after the loop), and
    with ``moments`` also the filtered moments; the predicted ones follow from these
    after the loop (`_predicted`). (The update vectorized over time after the loop
    instead cost more than the whole sequential filter: its ``(T, n, n, n)`` temporaries
    leave the cache; emitting the predicted moments too made the sweeps 2x slower.)"""
    n = fixed.initial_mean.shape[-1]

    def step(carry, xs):
        y_t, m_t, u_t, u_n, leaves = xs
        arr = fixed._replace(**dict(zip(varying, leaves, strict=True)))
        mean, cov = carry[:n], carry[n:].reshape(n, n)
        inn = innovation(arr, mean, cov, y_t, m_t, u_t)
        mean_f = mean + _mm(inn.w.T, inn.z)
        cov_f = joseph_update(cov, inn, arr.emission_cov)
        mean_n, cov_n = predict_state(arr, mean_f, cov_f, u_n)
        row = [jnp.sum(inn.z**2)[None], jnp.diagonal(inn.chol)]
        if moments:
            row += [mean_f, cov_f.reshape(-1)]
        return jnp.concatenate([mean_n, cov_n.reshape(-1)]), jnp.concatenate(row)

    return step


def _inputs(arrays, y, mask, inputs):
    """``(init, xs)`` of the flat recursion of one series."""
    num_t = y.shape[0]
    dtype = arrays.initial_cov.dtype
    u_next = jnp.concatenate([inputs[1:], jnp.zeros_like(inputs[:1])], axis=0)
    init = jnp.concatenate([arrays.initial_mean.astype(dtype),
                            arrays.initial_cov.reshape(-1)])
    xs = (y, mask, inputs, u_next, _per_step_leaves(arrays, _varying(arrays), num_t))
    return init, xs


def _sequential(arrays, y, mask, inputs, moments):
    """The rows of `_step` by the sequential scan."""
    init, xs = _inputs(arrays, y, mask, inputs)
    return jax.lax.scan(_step(arrays, _varying(arrays), moments), init, xs)[1]


def _swept(arrays, y, mask, inputs, moments, batched=False):
    """The rows of `_step` by `sweeps.sweep_scan` (``batched``: ``y``, ``mask`` and
    ``inputs`` have a leading axis of sequences, ``arrays`` are shared)."""
    from statseq.inference.sweeps import sweep_scan

    if not batched:
        ys, info = _swept(arrays, y[None], mask[None], inputs[None], moments, batched=True)
        return ys[0], info
    # the per-step leaves are shared: vmap broadcasts them over the sequences
    init, xs = jax.vmap(lambda *a: _inputs(arrays, *a))(y, mask, inputs)
    length = block_length(y.shape[1], y.shape[0])
    return sweep_scan(_step(arrays, _varying(arrays), moments), init, xs,
                      block_length=length, batched=True)


def sweep_info(arrays: GaussianSSMArrays, y, mask, inputs):
    """How the sweeps of `filter_by_sweeps` end on one series: a `sweeps.SweepInfo`
    (``sweeps`` run; ``converged=False``: the sequential scan recomputed the result).

    Args:
        arrays: the model's matrices (a proper initial law).
        y: ``(T, D)`` observations.
        mask: ``(T, D)`` booleans.
        inputs: ``(T, m)`` inputs.

    Returns:
        A `statseq.inference.sweeps.SweepInfo`.

    Examples:
        >>> import jax.numpy as jnp
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.5 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.ones((1000, 1))
        >>> info = sweep_info(arr, y, y > 0, jnp.zeros((1000, 0)))
        >>> bool(info.converged), int(info.sweeps)
        (True, 2)
    """
    return _swept(arrays, y, mask, inputs, moments=False)[1]


def _make(moments: bool):
    """`_swept` with the sequential scan's derivatives; under `jax.vmap` all sequences
    sweep together (one convergence test and one fallback for the batch), a batch of
    models runs the sequential scan, vmapped (`sweeps.with_sweep_rules`)."""

    def swept(arrays, y, mask, inputs, batched=False):
        return _swept(arrays, y, mask, inputs, moments, batched=batched)[0]

    return with_sweep_rules(swept, lambda *a: _sequential(*a, moments), shared=(0,))


#: the rows of `_step` by sweeps (derivatives: the sequential scan's), with and without
#: the moments
_ROWS = {True: _make(True), False: _make(False)}


def filter_by_sweeps(arrays: GaussianSSMArrays, y, mask, inputs, moments: bool = True):
    """`kalman.kalman_filter`'s ``(log_probs, predicted means, predicted covs, filtered
    means, filtered covs)`` (or only ``log_probs`` without ``moments``) by sweeps over
    blocks (module docstring); a proper initial law, ``n`` and ``D`` up to ``SMALL_DIM``.

    Args:
        arrays: the model's matrices (``initial_diffuse`` with 0 columns).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans.
        inputs: ``(T, m)`` inputs.
        moments: also return the moments.

    Returns:
        ``log_probs (T,)``, or the tuple of it and the four ``(T, n)`` / ``(T, n, n)``
        moment stacks.

    Examples:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.5 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.ones((10**4, 1))
        >>> out = jax.eval_shape(filter_by_sweeps, arr, y, y > 0, jnp.zeros((10**4, 0)))
        >>> [o.shape for o in out]
        [(10000,), (10000, 1), (10000, 1, 1), (10000, 1), (10000, 1, 1)]
    """
    rows = _ROWS[moments](arrays, y, mask, inputs)
    lp = _log_probs(rows, mask)
    if not moments:
        return lp
    filt_mean, filt_cov = _filtered(rows, arrays.initial_mean.shape[-1], y.shape[-1])
    mean, cov = _predicted(arrays, filt_mean, filt_cov, inputs)
    return lp, mean, cov, filt_mean, filt_cov


def _log_probs(rows, mask):
    """The log-densities from the rows' ``(sum z^2, diag L)``, as `kalman.innovation`."""
    log_det = jnp.sum(jnp.where(mask, jnp.log(rows[:, 1 : 1 + mask.shape[-1]]), 0.0), axis=-1)
    return -0.5 * rows[:, 0] - log_det - 0.5 * jnp.sum(mask, axis=-1) * _LOG_2PI


def _filtered(rows, n: int, num_series: int):
    at = 1 + num_series
    return rows[..., at : at + n], rows[..., at + n :].reshape(rows.shape[:-1] + (n, n))


def log_probs_and_carry(arrays: GaussianSSMArrays, y, mask, inputs):
    """Per-step log-densities and the final `kalman.KalmanCarry` of one series by sweeps
    (what a scan of `kalman.kalman_step` gives, to rounding): the public ``log_prob`` of
    a linear Gaussian model with several series and missing data runs it on long
    sequences (`statseq.models.ssm.GaussianSSMBase.masked_data_filter`).

    Args:
        arrays: the model's matrices (a proper initial law).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans.
        inputs: ``(T, m)`` inputs.

    Returns:
        ``(log_probs (T,), carry)``, the carry after the last step as `kalman.kalman_step`
        leaves it.

    Examples:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.5 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(2, 1), jnp.zeros((2, 0)),
        ...     jnp.zeros(2), jnp.eye(2), jnp.zeros((1, 0)))
        >>> y = jnp.ones((10**4, 2))
        >>> lp, carry = jax.eval_shape(log_probs_and_carry, arr, y, y > 0, jnp.zeros((10**4, 0)))
        >>> lp.shape, carry.cov.shape
        ((10000,), (1, 1))
    """
    from statseq.inference.kalman import initial_carry

    rows = _ROWS[True](arrays, y, mask, inputs)
    mean, cov = _filtered(rows[-1], arrays.initial_mean.shape[-1], y.shape[-1])
    carry = initial_carry(arrays)._replace(mean=mean, cov=cov,
                                           t=jnp.asarray(y.shape[0], jnp.int32))
    return _log_probs(rows, mask), carry


def _predicted(arrays, filt_mean, filt_cov, inputs):
    """The predicted moments ``(a_t, P_t)``: the initial law at ``t = 0``, then
    `kalman.predict_state` of the filtered moments of ``t - 1`` (the loop's own
    prediction, vectorized over time)."""
    num_t = filt_mean.shape[0]
    if num_t > 1:
        arr = arrays._replace(**dict(zip(
            _varying(arrays), _per_step_leaves(arrays, _varying(arrays), num_t), strict=True)))
        steps = [jnp.asarray(a) for a in (arr.dynamics_weights, arr.dynamics_input_weights,
                                          arr.dynamics_bias, arr.dynamics_cov)]
        f, b_in, bias, q = (a[: num_t - 1] if a.ndim == nd + 1 else a
                            for a, nd in zip(steps, (2, 2, 1, 2), strict=True))
        # products of stacks as sums of outer products (`kalman._mm`: one fused loop; the
        # update of `predict_state` vmapped over time reduced over a middle axis instead)
        mean = (_mm(f, filt_mean[:-1, :, None])[..., 0]
                + _mm(b_in, inputs[1:, :, None])[..., 0] + bias)
        cov = symmetrize(_mm(_mm(f, filt_cov[:-1]), jnp.swapaxes(f, -1, -2)) + q)
    else:
        mean, cov = filt_mean[:0], filt_cov[:0]
    dtype = filt_mean.dtype
    return (jnp.concatenate([arrays.initial_mean.astype(dtype)[None], mean]),
            jnp.concatenate([arrays.initial_cov.astype(dtype)[None], cov]))
