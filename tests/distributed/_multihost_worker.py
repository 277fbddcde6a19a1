"""One of two CPU processes of `test_data_parallel.py`'s multi-host test: joins the
`jax.distributed` runtime (``argv: port process_id``), places its half of an 8-sequence batch
on its 2 devices (`shard_batch(process_local=True)`), and compares the global log-likelihood
and one EM and one SGD step against the same computation on all 8 sequences in this process
alone. Prints one line of JSON. Not collected by pytest."""

import json
import sys

import jax

port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                           process_id=pid, initialization_timeout=120)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import statseq as ss  # noqa: E402
from statseq.distributed import data_mesh, shard_batch  # noqa: E402

assert jax.process_count() == 2 and jax.device_count() == 4, jax.devices()
rng = np.random.default_rng(0)
y = rng.poisson(3.0, size=(8, 20))
mask = rng.random((8, 20)) > 0.2
mask[7] = False  # the last sequence is padding (weight zero): 7 real sequences
model = ss.PoissonHMM(num_states=2)
params = model.initialize(y[:7], key=jax.random.key(0), mask=mask[:7])
mine = slice(4 * pid, 4 * pid + 4)
batch = shard_batch(y[mine], mask=mask[mine], mesh=data_mesh(), process_local=True)
out = {"process": pid, "global_shape": list(batch.y.shape),
       "addressable": batch.y.is_fully_addressable}

lp = ss.log_prob(model, params, batch.y, mask=batch.mask)
total = jax.jit(jnp.sum, out_shardings=jax.sharding.NamedSharding(
    data_mesh(), jax.sharding.PartitionSpec()))(lp)
local = jax.local_devices()[:1]
with jax.default_device(local[0]):
    ref = ss.log_prob(model, params, y[:7], mask=mask[:7])
    out["log_prob"] = abs(float(total) - float(jnp.sum(ref)))
    em_ref = ss.fit_em(model, params, y[:7], mask=mask[:7], num_iters=2, tol=None,
                       progress=False)
    opt = optax.sgd(1e-3)
    sgd_ref = ss.fit_sgd(model, params, y[:7], mask=mask[:7], num_steps=1,
                         key=jax.random.key(1), optimizer=opt, progress=False)
em = ss.fit_em(model, params, batch.y, mask=batch.mask, num_iters=2, tol=None, progress=False)
out["em_trace"] = float(np.max(np.abs(em.log_joint - em_ref.log_joint)))
out["em_params"] = max(jax.tree.leaves(jax.tree.map(
    lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), em.params,
    em_ref.params)))
sgd = ss.fit_sgd(model, params, batch.y, mask=batch.mask, num_steps=1, key=jax.random.key(1),
                 optimizer=opt, progress=False)
out["sgd_params"] = max(jax.tree.leaves(jax.tree.map(
    lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), sgd.params,
    sgd_ref.params)))
print(json.dumps(out))
sys.stdout.flush()
jax.distributed.shutdown()
