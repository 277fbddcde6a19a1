"""Many sequences over many devices: a batch sharded over a device mesh (data parallel).

A batch of sequences placed on a one-axis `jax.sharding.Mesh` with `shard_batch` is accepted
as it is by the entry points that take ``y`` (tested: `statseq.log_prob`, `statseq.filter`,
the HMM and Kalman smoothers, `statseq.fit_em`, `statseq.fit_sgd`, `statseq.fit_nuts`,
`statseq.fit_svi`; tests/distributed/test_data_parallel.py):
`statseq.core.validation.prepare_data` sees the sharded array, validates each process's own
sequences on its host and builds the flat arrays with the same sharding, and ``jax.jit``
(GSPMD) runs each device's sequences where they live. Sums over sequences (log-likelihoods,
EM sufficient statistics, gradients) become all-reduces inserted by XLA; nothing here
schedules anything.

Ragged batches: the batch axis is padded to a multiple of the device count with fully
masked sequences. A fully masked sequence has log-likelihood 0 and no gradient, and the EM
statistics of the HMM and linear Gaussian families ignore sequences with no observed entry,
so the padded results equal the unpadded ones (`unpad` drops the padded rows of per-sequence
outputs).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

#: the mesh axis that `data_mesh` names and `shard_batch` shards the batch over
BATCH_AXIS = "batch"


class ShardedBatch(NamedTuple):
    """A batch placed on a mesh by `shard_batch`.

    Attributes:
        y: ``(num_padded, num_timesteps, *event_shape)``, sharded over the batch axis.
        mask: booleans of ``y``'s step (or entry) shape, ``False`` on the padded sequences.
        inputs: ``(num_padded, num_timesteps, input_dim)`` or ``None``.
        num_sequences: the number of real sequences (the first ``num_sequences`` rows of
            the global batch; `unpad` keeps them).
    """

    y: Any
    mask: Any
    inputs: Any
    num_sequences: int


def data_mesh(devices=None, *, axis_name: str = BATCH_AXIS) -> Mesh:
    """A one-axis device mesh over which sequences are spread (data parallelism).

    Args:
        devices: the devices, in order; ``None``: every device of every process
            (``jax.devices()``, after `jax.distributed.initialize` on a cluster).
        axis_name: the mesh axis name.

    Returns:
        A `jax.sharding.Mesh` with one axis of ``len(devices)`` devices.

    Examples:
        >>> import jax
        >>> from statseq.distributed import data_mesh
        >>> data_mesh().shape["batch"] == len(jax.devices())
        True
    """
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("data_mesh needs at least one device")
    return Mesh(np.asarray(devices, dtype=object), (axis_name,))


def _batch_sharding(mesh: Mesh) -> NamedSharding:
    if len(mesh.axis_names) != 1:
        raise ValueError(f"shard_batch needs a one-axis mesh (data_mesh); got axes "
                         f"{mesh.axis_names}")
    return NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))


def _pad_rows(x: np.ndarray, rows: int, value) -> np.ndarray:
    if rows == 0:
        return x
    pad = np.full((rows,) + x.shape[1:], value, dtype=x.dtype)
    return np.concatenate([x, pad], axis=0)


def shard_batch(y, *, mesh: Mesh, mask=None, inputs=None,
                process_local: bool = False) -> ShardedBatch:
    """Place a batch of sequences on ``mesh``, one block of sequences per device.

    With ``N`` sequences and ``D`` devices the batch is padded to ``ceil(N / D) * D``
    sequences; the padded ones are fully masked (weight zero: no likelihood, gradient or EM
    statistic), so every result on the real sequences equals the single-device one. With
    one device nothing is padded or moved: the arrays come back as given.

    Args:
        y: ``(num_sequences, num_timesteps, *event_shape)`` (NumPy or JAX); with
            ``process_local`` this process's sequences only.
        mesh: a one-axis mesh (`data_mesh`).
        mask: optional booleans of shape ``(num_sequences, num_timesteps)`` or ``y``'s shape
            (``True`` = observed).
        inputs: optional covariates ``(num_sequences, num_timesteps, input_dim)``.
        process_local: multi-host (after `jax.distributed.initialize`): ``y``, ``mask``
            and ``inputs`` hold this process's sequences, which go to this process's
            devices of ``mesh``; every process must pass the same number of sequences
            (a multiple of its device count; pad them beforehand otherwise), and the
            global batch is their concatenation in process order.

    Returns:
        A `ShardedBatch` ``(y, mask, inputs, num_sequences)``; pass its ``y``, ``mask`` and
        ``inputs`` to any entry point.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> from statseq.distributed import data_mesh, shard_batch, unpad
        >>> y = np.random.default_rng(0).normal(size=(7, 20))
        >>> batch = shard_batch(y, mesh=data_mesh())
        >>> lp = ss.log_prob(ss.AR(order=1), ss.AR(order=1).default_params(), batch.y,
        ...                  mask=batch.mask)
        >>> unpad(lp, batch).shape
        (7,)
    """
    sharding = _batch_sharding(mesh)
    num_devices = int(mesh.devices.size)
    if num_devices == 1 and not process_local:  # nothing changes, nothing is paid
        n = int(np.shape(y)[0])
        return ShardedBatch(y, mask, inputs, n)
    y = np.asarray(y)
    if y.ndim < 2:
        raise ValueError(f"shard_batch needs y of shape (num_sequences, num_timesteps, ...); "
                         f"got shape {y.shape}")
    n = int(y.shape[0])
    if n == 0:
        raise ValueError("shard_batch got no sequences (y.shape[0] == 0)")
    if mask is None:
        mask = np.ones(y.shape[:2], bool)
    mask = np.asarray(mask)
    if mask.shape not in (y.shape[:2], y.shape):
        raise ValueError(f"mask must have shape {y.shape[:2]} or {y.shape}; got {mask.shape}")
    if mask.dtype != bool:
        if not np.all(np.isin(mask, (0, 1))):
            raise ValueError("mask must be boolean (True = observed) or 0/1")
        mask = mask.astype(bool)
    if inputs is not None:
        inputs = np.asarray(inputs)
        if inputs.ndim != 3 or inputs.shape[:2] != y.shape[:2]:
            raise ValueError(f"inputs must have shape {y.shape[:2]} + (input_dim,); got "
                             f"{inputs.shape}")
    # a fill value that every model accepts at a masked position (categories, counts: 0)
    fill = 0
    if process_local:
        local = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
        if local == 0 or n % local:
            raise ValueError(f"process_local: this process has {local} device(s) of the "
                             f"mesh and {n} sequences; pass a multiple of {local}")
        total = n * jax.process_count()

        def put(x):
            shape = (total,) + x.shape[1:]
            return jax.make_array_from_process_local_data(sharding, x, shape)

        return ShardedBatch(put(y), put(mask), None if inputs is None else put(inputs),
                            total)
    rows = -n % num_devices
    y_pad = _pad_rows(y, rows, fill)
    mask_pad = _pad_rows(mask, rows, False)
    inputs_pad = None if inputs is None else _pad_rows(inputs, rows, 0.0)
    return ShardedBatch(jax.device_put(y_pad, sharding), jax.device_put(mask_pad, sharding),
                        None if inputs_pad is None else jax.device_put(inputs_pad, sharding),
                        n)


def unpad(x, batch: ShardedBatch):
    """The rows of a per-sequence output (leading axis = the padded batch) that belong to
    real sequences: ``x[:batch.num_sequences]`` (every leaf of a pytree).

    Args:
        x: an array or pytree whose leaves have the padded batch as leading axis.
        batch: the `ShardedBatch` the output was computed from.

    Returns:
        The same structure cut to ``batch.num_sequences`` rows.
    """
    return jax.tree.map(lambda a: a[: batch.num_sequences], x)


def is_sharded(x) -> bool:
    """Whether ``x`` is a concrete JAX array spread over more than one device (or over
    processes): the arrays `statseq.core.validation.prepare_data` hands to `prepare_sharded`."""
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
        return False
    try:
        return len(x.sharding.device_set) > 1 and not x.is_fully_replicated
    except Exception:  # noqa: BLE001 - a deleted or otherwise unreadable array
        return False


def global_any(x) -> bool:
    """``any(x)`` over a global array spread over processes, the same on every process."""
    replicated = NamedSharding(x.sharding.mesh, PartitionSpec())
    return bool(jax.jit(jnp.any, out_shardings=replicated)(x))


def global_observed_moments(y, mask=None) -> tuple[float, float]:
    """Mean and mean square of the observed entries of a global array spread over
    processes (`statseq.core.params.data_scale`), the same on every process."""
    replicated = NamedSharding(y.sharding.mesh, PartitionSpec())

    def moments(y, mask):
        y = y.astype(jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
        w = jnp.ones(y.shape, y.dtype) if mask is None else jnp.broadcast_to(
            jnp.reshape(mask, mask.shape + (1,) * (y.ndim - mask.ndim)), y.shape).astype(y.dtype)
        n = jnp.maximum(jnp.sum(w), 1.0)
        return jnp.stack([jnp.sum(w * y) / n, jnp.sum(w * y * y) / n])

    out = jax.jit(moments, out_shardings=replicated)(y, mask)
    return float(out[0]), float(out[1])


def _local_rows(x, sharding):
    """This process's rows of a batch-sharded array, in global order, as NumPy."""
    if x is None:
        return None
    if not isinstance(x, jax.Array):
        raise TypeError("with a sharded y, mask and inputs must be sharded the same way "
                        "(shard_batch places all three)")
    if x.is_fully_addressable:
        return np.asarray(x)
    pieces = {}
    for shard in x.addressable_shards:
        start = shard.index[0].start or 0
        pieces.setdefault(start, np.asarray(shard.data))
    return np.concatenate([pieces[k] for k in sorted(pieces)], axis=0)


def prepare_sharded(model, y, mask, inputs, name, prepare_local):
    """`prepare_data` for a batch sharded over a mesh: each process validates and
    normalizes its own sequences (``prepare_local``, the single-device path, on host
    arrays), then the flat arrays are assembled as global arrays with the batch sharding.

    Args:
        model: the model.
        y: the sharded data (leading axis = the flat batch, sharded over one mesh axis).
        mask: the sharded mask, or ``None``.
        inputs: the sharded inputs, or ``None``.
        name: the data's name in error messages.
        prepare_local: ``(model, y, mask, inputs, name) -> Prepared`` on host arrays.

    Returns:
        A `statseq.core.validation.Prepared` whose arrays carry the batch sharding.
    """
    sharding = y.sharding
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"a sharded {name} must carry a NamedSharding over the batch axis "
                        f"(statseq.distributed.shard_batch); got {type(sharding).__name__}")
    spec = tuple(sharding.spec) + (None,) * (y.ndim - len(sharding.spec))
    if spec[0] is None or any(s is not None for s in spec[1:]):
        raise ValueError(f"a sharded {name} must be split over its first (batch) axis only; "
                         f"got PartitionSpec{tuple(sharding.spec)}")
    local = prepare_local(model, _local_rows(y, sharding), _local_rows(mask, sharding),
                          _local_rows(inputs, sharding), name)
    if len(local.batch_shape) != 1:
        raise ValueError(f"a sharded {name} must have one batch axis (num_sequences, "
                         f"num_timesteps, ...); got batch shape {local.batch_shape}")
    flat = NamedSharding(sharding.mesh, PartitionSpec(spec[0]))
    total = int(y.shape[0])

    def put(x):
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(flat, x, (total,) + x.shape[1:])

    return local._replace(y=put(local.y), mask=put(local.mask), inputs=put(local.inputs),
                          batch_shape=(total,),
                          # a program must be the same on every process: a given mask
                          # always takes the general (masked) path
                          complete=mask is None)
