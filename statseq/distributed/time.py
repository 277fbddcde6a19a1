"""One long sequence, time parallel: filters, smoothers and linear recurrences with the time
axis split over the devices of a mesh.

Every parallel-in-time algorithm of `statseq.inference` is an associative scan

    s_t = e_0 o e_1 o ... o e_t          (or the suffixes e_t o ... o e_{T-1}),

over per-step elements ``e_t`` with an associative operator ``o``. With the ``T`` elements
cut into ``D`` consecutive blocks, one per device, `time_sharded_scan` computes the same
prefixes in three stages (Blelloch's two-level scan, the device count as the outer level):

1. **local scan**: each device scans its own block of ``T / D`` elements (the same scan the
   single-device function uses: `jax.lax.associative_scan`, or the blocked schedule of
   `statseq.inference.kalman_parallel`);
2. **exchange**: each block's total (its last prefix, the block's composed element) is
   all-gathered, ``D`` small elements (``K x K`` for an HMM, three ``n x n`` matrices for a
   Kalman filter), and scanned on every device;
3. **fix-up**: each device combines the total of the blocks before it with every local
   prefix (one batched application of the operator).

Only stage 2 communicates, ``D`` elements per scan whatever ``T``; the elements, prefixes
and every per-step output stay sharded, so memory per device is ``O(T / D)``. The
operators are the library's own (`statseq.inference.hmm_parallel._combine`,
`statseq.inference.kalman_parallel._cov_combine` and its siblings,
`statseq.inference.linear_recurrence.combine_affine`), and the model code around the scans
is the single-device parallel code, run with the sharded scan in place of the local one
(steps that need a neighbour, such as ``x_{t-1}`` at a block's first step, are shifts of a
sharded array, which XLA's partitioner turns into a transfer of one row between
neighbouring devices).

**Uneven splits.** When ``D`` does not divide ``T``, the scan pads its elements to a
multiple of ``D`` with copies of the element at the far end (after the last element for a
prefix scan, before the first for a suffix scan) and drops their results: a prefix never
depends on later elements nor a suffix on earlier ones, so the real results are the
unpadded ones exactly (no identity element is needed; an HMM's masked step, a row of zeros
in ``log_likelihoods``, or a Kalman filter's all-missing step are ordinary elements and may
lie anywhere, across block boundaries included).

**Results.** The functions return what their single-device twins return
(`statseq.inference.hmm.HMMFilterResult`, `~statseq.inference.hmm.HMMPosterior`,
`~statseq.inference.kalman.KalmanFilterResult`, `~statseq.inference.kalman.KalmanSmootherResult`,
the states of `~statseq.inference.linear_recurrence.linear_recurrence`) and equal them up
to rounding (the tests check ``1e-12`` in float64 against the sequential filters, with
``T`` not a multiple of the device count and gaps across block boundaries). With one
device (the default mesh on a laptop) the sharded scan is the local scan: nothing changes.

The functions are not jitted: wrap them (or the code that calls them) in ``jax.jit``.
The mesh defaults to every device along one axis named ``"time"`` (`time_mesh`); on CPU,
virtual devices come from ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set
before JAX starts.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from statseq.core.recurrence import pairwise_sum
from statseq.inference import hmm_parallel, kalman_parallel
from statseq.inference.hmm import HMMFilterResult, HMMPosterior, _prepare_inputs
from statseq.inference.kalman import (
    GaussianSSMArrays,
    KalmanFilterResult,
    KalmanSmootherResult,
    _check,
)
from statseq.inference.linear_recurrence import _parallel as _parallel_recurrence
from statseq.inference.linear_recurrence import _prepare as _prepare_recurrence

__all__ = [
    "hmm_filter_time_sharded",
    "hmm_smoother_time_sharded",
    "kalman_filter_time_sharded",
    "kalman_smoother_time_sharded",
    "linear_recurrence_time_sharded",
    "time_mesh",
    "time_sharded_scan",
]

TIME_AXIS = "time"


def _shard_map(f, mesh, in_specs, out_specs):
    """`jax.shard_map` (jax >= 0.7) or `jax.experimental.shard_map.shard_map` (older),
    without the replication checks (the fix-up selects by `jax.lax.axis_index`)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=False)
    from jax.experimental.shard_map import shard_map  # pragma: no cover - old jax

    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,  # pragma: no cover
                     check_rep=False)


def time_mesh(devices=None, axis_name: str = TIME_AXIS) -> Mesh:
    """A one-axis device mesh for splitting the time axis.

        devices d_0, ..., d_{D-1}  ->  block b of the sequence on d_b.

    Args:
        devices: the devices, in time order (default `jax.devices()`).
        axis_name: the mesh axis name.

    Returns:
        A `jax.sharding.Mesh` of shape ``(D,)``.

    Examples:
        >>> mesh = time_mesh()
        >>> mesh.axis_names
        ('time',)
    """
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("time_mesh needs at least one device")
    return Mesh(np.array(devices), (axis_name,))


def _local_associative_scan(fn, elems, reverse=False):
    return jax.lax.associative_scan(fn, elems, reverse=reverse)


def _pad(elems, pad: int, reverse: bool):
    """``pad`` copies of the far-end element: after the last (prefix scan) or before the
    first (suffix scan)."""
    if reverse:
        return jax.tree.map(lambda a: jnp.concatenate([jnp.repeat(a[:1], pad, 0), a]), elems)
    return jax.tree.map(lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], pad, 0)]), elems)


def time_sharded_scan(fn: Callable, elems, reverse: bool = False, *, mesh: Mesh | None = None,
                      axis_name: str = TIME_AXIS, local_scan: Callable | None = None):
    """`jax.lax.associative_scan` with the scanned axis split over a mesh axis.

        s_t = e_0 o ... o e_t   (reverse: s_t = e_t o ... o e_{T-1}),

    computed as a local scan per device, an all-gather and scan of the ``D`` block totals,
    and one combination of each local prefix with the total of the blocks before it (module
    docstring); ``T`` need not be a multiple of ``D``.

    Args:
        fn: the associative operator, batched over a leading axis, called as
            `jax.lax.associative_scan` calls it (``fn(earlier, later)``; with
            ``reverse=True``, ``fn(later, earlier)``).
        elems: a pytree of arrays with a common leading time axis ``T >= 1``.
        reverse: suffixes instead of prefixes.
        mesh: the device mesh (default `time_mesh`).
        axis_name: the mesh axis to split time over.
        local_scan: the scan run on each block and on the block totals, with the signature
            ``local_scan(fn, elems, reverse=...)`` (default `jax.lax.associative_scan`).

    Returns:
        The prefixes (or suffixes), a pytree like ``elems``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> out = jax.jit(lambda x: time_sharded_scan(jnp.add, x))(jnp.arange(5.0))
        >>> [float(v) for v in out]
        [0.0, 1.0, 3.0, 6.0, 10.0]
    """
    mesh = time_mesh(axis_name=axis_name) if mesh is None else mesh
    local_scan = _local_associative_scan if local_scan is None else local_scan
    num_blocks = mesh.shape[axis_name]
    num_t = jax.tree.leaves(elems)[0].shape[0]
    if num_blocks == 1:
        return local_scan(fn, elems, reverse=reverse)
    pad = -num_t % num_blocks
    padded = _pad(elems, pad, reverse) if pad else elems

    def block(x):
        local = local_scan(fn, x, reverse=reverse)
        edge = 0 if reverse else -1  # the block's composed element
        totals = jax.tree.map(lambda a: jax.lax.all_gather(a[edge], axis_name), local)
        scanned = local_scan(fn, totals, reverse=reverse)  # (D, ...) on every device
        i = jax.lax.axis_index(axis_name)
        before = jnp.clip(i + 1 if reverse else i - 1, 0, num_blocks - 1)
        carry = jax.tree.map(lambda a: a[before], scanned)
        size = jax.tree.leaves(local)[0].shape[0]
        fixed = fn(jax.tree.map(lambda c: jnp.broadcast_to(c, (size,) + c.shape), carry),
                   local)
        first = i == (num_blocks - 1 if reverse else 0)  # nothing before it
        return jax.tree.map(lambda lo, fx: jnp.where(first, lo, fx), local, fixed)

    spec = PartitionSpec(axis_name)
    out = _shard_map(block, mesh, (spec,), spec)(padded)
    if not pad:
        return out
    # keep the unpadded result sharded over time (unevenly), not gathered on every device
    sharding = jax.sharding.NamedSharding(mesh, spec)
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(
        a[pad:] if reverse else a[:num_t], sharding), out)


def _scan_for(mesh, axis_name, local_scan=None):
    mesh = time_mesh(axis_name=axis_name) if mesh is None else mesh
    return partial(time_sharded_scan, mesh=mesh, axis_name=axis_name, local_scan=local_scan)


def hmm_filter_time_sharded(initial_probs, transition_matrix, log_likelihoods, *,
                            mesh: Mesh | None = None,
                            axis_name: str = TIME_AXIS) -> HMMFilterResult:
    """HMM forward filter with the time axis split over devices (twin of
    `statseq.inference.hmm.hmm_filter`).

        p(z_t | y_{0:t}) = normalized row of E_0 o ... o E_t,
        E_t[i, j] = log A_{t-1}[i, j] + ll[t, j]    (log-space matrix product o),

    the prefix scan of `statseq.inference.hmm_parallel.hmm_filter` run by
    `time_sharded_scan`; memory per device ``O(T K^2 / D)``.

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying.
        log_likelihoods: ``(T, K)``; rows of zeros at masked steps.
        mesh: the device mesh (default `time_mesh`: every device).
        axis_name: the mesh axis to split time over.

    Returns:
        An `~statseq.inference.hmm.HMMFilterResult`, equal to the sequential filter's up to
        rounding.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> pi, A = jnp.array([0.5, 0.5]), jnp.array([[0.9, 0.1], [0.2, 0.8]])
        >>> ll = jnp.log(jnp.array([[0.7, 0.1], [0.6, 0.3], [0.2, 0.6]]))
        >>> res = jax.jit(hmm_filter_time_sharded)(pi, A, ll)
        >>> res.filtered_probs.shape, round(float(res.filtered_probs.sum()), 6)
        ((3, 2), 3.0)
    """
    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    ll, impossible = hmm_parallel._skip_impossible(ll)
    log_trans, _, log_filtered = hmm_parallel._forward(pi, fixed, per_step, ll,
                                                       _scan_for(mesh, axis_name))
    return hmm_parallel._filter_result(pi, log_trans, ll, log_filtered, impossible)


def hmm_smoother_time_sharded(initial_probs, transition_matrix, log_likelihoods, *,
                              sum_transitions: bool = True, mesh: Mesh | None = None,
                              axis_name: str = TIME_AXIS) -> HMMPosterior:
    """HMM forward-backward smoother with the time axis split over devices (twin of
    `statseq.inference.hmm.hmm_smoother`).

        p(z_t = i | y) proportional to exp(log a_t(i) + log b_t(i)),

    with the forward prefixes ``a`` and backward suffixes ``b`` of
    `statseq.inference.hmm_parallel.hmm_smoother`, both run by `time_sharded_scan`.

    Args:
        initial_probs: ``(K,)`` ``p(z_0)``.
        transition_matrix: ``(K, K)`` fixed or ``(T-1, K, K)`` time-varying.
        log_likelihoods: ``(T, K)``; rows of zeros at masked steps.
        sum_transitions: expected transitions summed over time ``(K, K)`` (default) or
            per step ``(T-1, K, K)``.
        mesh: the device mesh (default `time_mesh`: every device).
        axis_name: the mesh axis to split time over.

    Returns:
        An `~statseq.inference.hmm.HMMPosterior`, equal to the sequential smoother's up to
        rounding.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> pi, A = jnp.array([0.5, 0.5]), jnp.array([[0.9, 0.1], [0.2, 0.8]])
        >>> ll = jnp.log(jnp.array([[0.7, 0.1], [0.6, 0.3], [0.2, 0.6]]))
        >>> post = jax.jit(hmm_smoother_time_sharded)(pi, A, ll)
        >>> post.smoothed_probs.shape, post.expected_transitions.shape
        ((3, 2), (2, 2))
    """
    pi, fixed, per_step, ll = _prepare_inputs(initial_probs, transition_matrix, log_likelihoods)
    return hmm_parallel._smoother(pi, fixed, per_step, ll, sum_transitions,
                                  _scan_for(mesh, axis_name))


def _check_proper(arrays: GaussianSSMArrays):
    if arrays.initial_diffuse.shape[-1]:
        raise ValueError(
            "the time-sharded Kalman filter and smoother need a proper initial distribution "
            f"(initial_diffuse with 0 columns), got initial_diffuse of shape "
            f"{arrays.initial_diffuse.shape}; run the exact diffuse filter over the head "
            "(statseq.inference.kalman) and shard the rest"
        )


def kalman_filter_time_sharded(arrays: GaussianSSMArrays, y, mask, inputs, *,
                               mesh: Mesh | None = None,
                               axis_name: str = TIME_AXIS) -> KalmanFilterResult:
    """Kalman filter over one sequence with the time axis split over devices (twin of
    `statseq.inference.kalman.kalman_filter`).

        x_{t+1} = F x_t + B u_{t+1} + b + w_t,   y_t = H x_t + D u_t + d + v_t,

    filtered by the scans of `statseq.inference.kalman_parallel.parallel_kalman_filter`
    (covariance elements, a Newton correction and the affine mean recursion), each run by
    `time_sharded_scan` with that module's blocked scan on each device.

    Args:
        arrays: the model's matrices (a `~statseq.inference.kalman.GaussianSSMArrays`,
            proper initial distribution: ``initial_diffuse`` with 0 columns).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).
        mesh: the device mesh (default `time_mesh`: every device).
        axis_name: the mesh axis to split time over.

    Returns:
        A `~statseq.inference.kalman.KalmanFilterResult`, equal to the sequential filter's
        up to rounding.

    Raises:
        ValueError: for diffuse initial directions, or shapes the sequential filter rejects.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.kalman import GaussianSSMArrays
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.9 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0], [-0.3]])
        >>> res = jax.jit(kalman_filter_time_sharded)(arr, y, jnp.ones_like(y, bool),
        ...                                           jnp.zeros((3, 0)))
        >>> res.filtered_means.shape, res.log_probs.shape
        ((3, 1), (3,))
    """
    _check(arrays, y, mask, inputs)
    _check_proper(arrays)
    fwd = kalman_parallel._forward(arrays, y, mask, inputs,
                                   _scan_for(mesh, axis_name, kalman_parallel._scan))
    log_probs, pred_mean, pred_c, filt_mean, filt_c = kalman_parallel._log_probs(fwd)
    return KalmanFilterResult(pairwise_sum(log_probs), log_probs, pred_mean,
                              pred_c, filt_mean, filt_c)


def kalman_smoother_time_sharded(arrays: GaussianSSMArrays, y, mask, inputs, *,
                                 mesh: Mesh | None = None,
                                 axis_name: str = TIME_AXIS) -> KalmanSmootherResult:
    """Kalman (Rauch-Tung-Striebel) smoother with the time axis split over devices (twin of
    `statseq.inference.kalman.kalman_smoother`).

        E[x_t | y] = a_t + P_t r_{t-1},   r_{t-1} = L_t^T r_t + H~_t^T S~_t^{-1} v_t,

    the forward scans of `kalman_filter_time_sharded` and the backward suffix scan of
    `statseq.inference.kalman_parallel.parallel_kalman_smoother`, each run by
    `time_sharded_scan`.

    Args:
        arrays: the model's matrices (a `~statseq.inference.kalman.GaussianSSMArrays`,
            proper initial distribution).
        y: ``(T, D)`` observations (masked entries may hold any finite value).
        mask: ``(T, D)`` booleans, ``True`` where observed.
        inputs: ``(T, m)`` inputs (``m`` may be 0).
        mesh: the device mesh (default `time_mesh`: every device).
        axis_name: the mesh axis to split time over.

    Returns:
        A `~statseq.inference.kalman.KalmanSmootherResult`, equal to the sequential
        smoother's up to rounding.

    Raises:
        ValueError: for diffuse initial directions, or shapes the sequential smoother
            rejects.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from statseq.inference.kalman import GaussianSSMArrays
        >>> arr = GaussianSSMArrays(jnp.zeros(1), jnp.eye(1), 0.9 * jnp.eye(1),
        ...     jnp.zeros((1, 0)), jnp.zeros(1), jnp.eye(1), jnp.eye(1), jnp.zeros((1, 0)),
        ...     jnp.zeros(1), jnp.eye(1), jnp.zeros((1, 0)))
        >>> y = jnp.array([[0.5], [1.0], [-0.3]])
        >>> res = jax.jit(kalman_smoother_time_sharded)(arr, y, jnp.ones_like(y, bool),
        ...                                             jnp.zeros((3, 0)))
        >>> res.smoothed_means.shape, res.smoothed_cross_covs.shape
        ((3, 1), (2, 1, 1))
    """
    _check(arrays, y, mask, inputs)
    _check_proper(arrays)
    return kalman_parallel._parallel_smoother(
        arrays, y, mask, inputs, _scan_for(mesh, axis_name, kalman_parallel._scan))[0]


def linear_recurrence_time_sharded(a, b, h0=None, *, mesh: Mesh | None = None,
                                   axis_name: str = TIME_AXIS):
    """All states of ``h_t = a_t * h_{t-1} + b_t`` with the time axis split over devices
    (twin of `statseq.inference.linear_recurrence.linear_recurrence`, the recurrence of
    Mamba's selective scan and of the LRU).

        h_t = a_t * h_{t-1} + b_t,   t = 0, ..., T-1,   h_{-1} = h0   (elementwise),

    by `time_sharded_scan` over the affine maps ``(a_t, b_t)`` composed by
    `~statseq.inference.linear_recurrence.combine_affine`.

    Args:
        a: ``(T, *shape)`` multipliers, real or complex (or ``shape``: one for every step).
        b: ``(T, *shape)`` increments, real or complex.
        h0: ``shape`` initial state (default zeros).
        mesh: the device mesh (default `time_mesh`: every device).
        axis_name: the mesh axis to split time over.

    Returns:
        ``(T, *shape)`` states, in the common dtype of ``a``, ``b`` and ``h0``.

    Raises:
        ValueError: if the shapes of ``a``, ``b`` and ``h0`` do not match.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> h = jax.jit(linear_recurrence_time_sharded)(jnp.array([0.5, 0.5, 0.5]),
        ...                                             jnp.array([1.0, 0.0, 2.0]), jnp.array(4.0))
        >>> [float(v) for v in h]
        [3.0, 1.5, 2.75]
    """
    a, b, h0 = _prepare_recurrence(a, b, h0)
    if b.shape[0] == 0:
        return b
    return _parallel_recurrence(jnp.broadcast_to(a, b.shape), b, h0, _scan_for(mesh, axis_name))
