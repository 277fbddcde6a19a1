"""Run by `test_data_parallel.py` in a subprocess with 4 virtual CPU devices (XLA_FLAGS) and
float64: sharded (7 sequences padded to 8 over 4 devices, with missing data) against
unsharded, every check one line of JSON ``{name: max abs difference}``. Not collected by
pytest (no ``test_`` prefix)."""

import json
import sys
import time

import jax
import numpy as np

import statseq as ss
from statseq.distributed import data_mesh, shard_batch, unpad

assert jax.device_count() == 4 and jax.config.jax_enable_x64, (jax.devices(),)
out = {}
mesh = data_mesh()
rng = np.random.default_rng(0)
N, T = 7, 24
MASK = rng.random((N, T)) > 0.2
MASK[3] = False  # one real sequence with no observation at all


def diff(a, b):
    def one(x, y):
        x, y = np.asarray(x, float), np.asarray(y, float)
        assert x.shape == y.shape, (x.shape, y.shape)
        return float(np.max(np.abs(x - y), initial=0.0))

    return max(jax.tree.leaves(jax.tree.map(one, a, b)))


def is_sharded(x):
    return len(x.sharding.device_set) == 4


def timed(name):
    print(f"{name} {time.process_time():.1f}", file=sys.stderr)


def check(name, model, params, y, *, em=False, sgd=False, smoother=None, mask=MASK,
          filtered=False):
    b = shard_batch(y, mesh=mesh, mask=mask)
    assert b.y.shape[0] == 8 and is_sharded(b.y)
    lp1 = ss.log_prob(model, params, y, mask=mask)
    lp4 = ss.log_prob(model, params, b.y, mask=b.mask)
    assert is_sharded(lp4), lp4.sharding  # computed where the sequences live
    out[f"{name}.log_prob"] = diff(lp1, unpad(lp4, b))
    out[f"{name}.padded_log_prob"] = float(np.max(np.abs(np.asarray(lp4)[N:])))
    if filtered:
        f1 = ss.filter(model, params, y, mask=mask)
        f4 = ss.filter(model, params, b.y, mask=b.mask)
        out[f"{name}.filter"] = diff(f1.log_probs, unpad(f4.log_probs, b))
    if smoother is not None:
        out[f"{name}.smoother"] = diff(smoother(y, mask), unpad(smoother(b.y, b.mask), b))
    if em:
        e1 = ss.fit_em(model, params, y, mask=mask, num_iters=4, tol=None, progress=False)
        e4 = ss.fit_em(model, params, b.y, mask=b.mask, num_iters=4, tol=None, progress=False)
        out[f"{name}.em_trace"] = diff(e1.log_joint, e4.log_joint)
        out[f"{name}.em_params"] = diff(e1.params, e4.params)
    if sgd:
        opt = __import__("optax").sgd(1e-3)
        s1 = ss.fit_sgd(model, params, y, mask=mask, num_steps=2, key=jax.random.key(1),
                        optimizer=opt, progress=False)
        s4 = ss.fit_sgd(model, params, b.y, mask=b.mask, num_steps=2, key=jax.random.key(1),
                        optimizer=opt, progress=False)
        out[f"{name}.sgd_params"] = diff(s1.params, s4.params)
    out[f"{name}.sharding_kept"] = float(not is_sharded(lp4))
    timed(name)


# HMM
y = rng.poisson(3.0, size=(N, T))
m = ss.PoissonHMM(num_states=2)
p = m.initialize(y, key=jax.random.key(0))
check("poisson_hmm", m, p, y, em=True, sgd=True, filtered=True,
      smoother=lambda yy, mm: m.smoother(p, yy, mask=mm).smoothed_probs)
# SGD minibatches drawn from a sharded batch (an even one: 8 sequences, no padding, so the
# draws are the same rows): the row gather crosses devices, the steps equal one device's
y8 = np.concatenate([y, y[:1]])
b8 = shard_batch(y8, mesh=mesh)
opt = __import__("optax").sgd(1e-3)
s1 = ss.fit_sgd(m, p, y8, num_steps=2, batch_size=4, key=jax.random.key(1), optimizer=opt,
                progress=False)
s4 = ss.fit_sgd(m, p, b8.y, num_steps=2, batch_size=4, key=jax.random.key(1), optimizer=opt,
                progress=False)
out["poisson_hmm.sgd_minibatch"] = diff(s1.params, s4.params)
timed("minibatch")
# AR
ya = rng.normal(size=(N, T)).cumsum(1) * 0.3
m = ss.AR(order=2, initial="stationary")
check("ar", m, m.default_params(), ya)
# LGSSM with 2-d emissions, a per-entry mask
yl = rng.normal(size=(N, T, 2))
m = ss.LinearGaussianSSM(state_dim=2, emission_dim=2)
p = m.initialize(yl, key=jax.random.key(0))
emask = rng.random((N, T, 2)) > 0.2
emask[3] = False
check("lgssm", m, p, yl, em=True, mask=emask,
      smoother=lambda yy, mm: m.smoother(p, yy, mask=mm).smoothed_means)
# structural
m = ss.LocalLevel()
check("local_level", m, m.default_params(), ya)
# neural
m = ss.GRU(hidden_dim=3)
p = m.initialize(ya, key=jax.random.key(0))
check("gru", m, p, ya, sgd=True)

# NUTS: chains spread over the devices (numpyro's chain_method="parallel") equals one
# device's sequential chains; and a sharded panel in the (sequential) chains
m = ss.LocalLevel()
kw = dict(key=jax.random.key(2), num_warmup=5, num_samples=3, num_chains=2, max_tree_depth=3,
          log_likelihood=False)
n1 = ss.fit_nuts(m, ya, mask=MASK, **kw)
n4 = ss.fit_nuts(m, ya, mask=MASK, chain_method="parallel", **kw)
post = lambda idata: {k: np.asarray(v) for k, v in idata.posterior.data_vars.items()}  # noqa: E731
out["nuts.parallel_chains"] = diff(post(n1), post(n4))
b = shard_batch(ya, mesh=mesh, mask=MASK)
timed("nuts")
kw = dict(key=jax.random.key(3), num_steps=3, num_samples=2)
v1 = ss.fit_svi(m, ya, mask=MASK, **kw)
v4 = ss.fit_svi(m, b.y, mask=b.mask, **kw)
out["svi.sharded_panel"] = diff(v1.losses, v4.losses)

timed("svi")
print(json.dumps(out))
sys.stdout.flush()
