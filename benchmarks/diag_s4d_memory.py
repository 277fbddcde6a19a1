"""XLA's memory estimate of S4D's training step in each mode at small shapes, against
`statseq.models.neural.s4.program_bytes` (the estimate behind S4D's memory-aware default).

Compiles (never runs) ``jax.value_and_grad`` of the batch log-likelihood exactly as
`benchmarks/bench_backbones.py` does (float32) and prints XLA's program bytes
(``compiled.memory_analysis()``: temporaries + arguments + outputs), per unit
``B T L H N s`` and ``B T L H s``, and the ratio to `program_bytes`.

    python benchmarks/diag_s4d_memory.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_backbones import memory_fields, training_step  # noqa: E402

import statseq as ss  # noqa: E402
from statseq.models.neural import s4  # noqa: E402

SHAPES = [(4, 1000, 16, 16, 1), (4, 2000, 16, 16, 1), (8, 1000, 16, 16, 1),
          (4, 1000, 32, 16, 1), (4, 1000, 16, 32, 1), (4, 1000, 16, 16, 2)]


def main():
    for batch, t_len, width, state, layers in SHAPES:
        row = []
        for mode in s4.MODES:
            model = ss.S4D(hidden_dim=width, state_dim=state, num_layers=layers, mode=mode)
            y = np.zeros((batch, t_len), np.float32)
            params = jax.tree.map(lambda a: a.astype(np.float32),
                                  model.initialize(y[0], key=jax.random.key(0)))
            compiled = jax.jit(training_step(model)).lower(params, jnp.asarray(y)).compile()
            got = memory_fields(compiled)["program_bytes"]
            est = s4.program_bytes(mode, batch=batch, num_steps=t_len, width=width,
                                   state_dim=state, num_layers=layers, itemsize=4)
            unit = batch * t_len * width * layers * 4
            row.append(f"{mode} {got / 2**20:.1f} MiB (/BTLHNs {got / unit / state:.2f}, "
                       f"/BTLHs {got / unit:.1f}, estimate/XLA {est / got:.2f})")
        print((batch, t_len, width, state, layers), " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
