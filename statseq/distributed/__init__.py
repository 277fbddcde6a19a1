"""Data-parallel (many sequences) and time-parallel (one long sequence) scaling with JAX's
own sharding (`jax.sharding`) and multi-process runtime (`jax.distributed`).

Nothing here is imported by ``import statseq``: ``statseq.distributed`` loads on first use.
See ``docs/scaling.md``.
"""

from statseq.distributed.data import ShardedBatch, data_mesh, shard_batch, unpad  # noqa: F401
