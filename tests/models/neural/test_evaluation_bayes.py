"""The Bayesian entry points see the chosen whole-sequence evaluation (issue 14, point 2).

`fit_nuts` and `fit_svi` score the data through `statseq.SequenceDistribution` (the NumPyro
likelihood site of `statseq.bayes._joint.numpyro_model`). Here its log-density and the
gradient with respect to the parameters (what NUTS's potential and SVI's ELBO use) under
``evaluation="deer"`` must equal the same model's with ``"sequential"`` to 1e-10 / 1e-8
relative (float64), and the solver must really run (counted).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import statseq as ss
from statseq.models.neural import cells


def test_sequence_distribution_log_prob_and_gradient_under_deer(monkeypatch):
    rng = np.random.default_rng(0)
    y = jnp.asarray(np.sin(np.arange(120) / 6.0) + 0.3 * rng.normal(size=120))
    seq = ss.GRU(hidden_dim=4, evaluation="sequential")
    deer = dataclasses.replace(seq, evaluation="deer")
    params = seq.initialize(y, key=jax.random.key(0))
    calls = []
    original = cells.evaluate_layer
    monkeypatch.setattr(cells, "evaluate_layer",
                        lambda *a, **k: calls.append(k["method"]) or original(*a, **k))

    def value_and_grad(model):
        return jax.jit(jax.value_and_grad(
            lambda p: ss.SequenceDistribution(model, p, num_timesteps=y.shape[0]).log_prob(y)))(
            params)

    v_ref, g_ref = value_and_grad(seq)
    v, g = value_and_grad(deer)
    assert "deer" in calls
    assert abs(float(v) - float(v_ref)) <= 1e-10 * abs(float(v_ref))
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if b.size:
            assert np.max(np.abs(a - b)) <= 1e-8 * max(np.max(np.abs(b)), 1e-300)
