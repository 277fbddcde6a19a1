"""Beyond one device: sharding sequences and time over a device mesh (docs/scaling.md)."""

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
    "hmm_filter_time_sharded",
    "hmm_smoother_time_sharded",
    "kalman_filter_time_sharded",
    "kalman_smoother_time_sharded",
    "linear_recurrence_time_sharded",
    "time_mesh",
    "time_sharded_scan",
]
