"""Data-parallel (many sequences) and time-parallel (one long sequence) scaling with JAX's
own sharding (`jax.sharding`) and multi-process runtime (`jax.distributed`).

Nothing here is imported by ``import statseq``: ``statseq.distributed`` loads on first use.
See ``docs/scaling.md``.
"""

from statseq.distributed.data import ShardedBatch, data_mesh, shard_batch, unpad
from statseq.distributed.time import (
    hmm_filter_time_sharded,
    hmm_smoother_time_sharded,
    kalman_filter_time_sharded,
    kalman_smoother_time_sharded,
    linear_recurrence_time_sharded,
    time_mesh,
    time_sharded_scan,
)

__all__ = [
    "ShardedBatch",
    "data_mesh",
    "shard_batch",
    "unpad",
    "hmm_filter_time_sharded",
    "hmm_smoother_time_sharded",
    "kalman_filter_time_sharded",
    "kalman_smoother_time_sharded",
    "linear_recurrence_time_sharded",
    "time_mesh",
    "time_sharded_scan",
]
