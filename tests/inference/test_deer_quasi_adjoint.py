"""quasi-DEER's parallel adjoint (the GPU/TPU path) against the sequential adjoint and BPTT.

On CPU `deer(method="quasi-deer")` differentiates through a sequential reverse scan; on a
GPU/TPU the same adjoint system ``λ_t = g_t + J_{t+1}^T λ_{t+1}`` is solved by quasi-DEER's
own sweeps (diagonal reverse associative scans plus vectorized VJPs), with the sequential
scan as the fallback. Here the backend rule is switched by monkeypatching
`_quasi_adjoint_parallel_enabled`, so the GPU path runs on CPU; the reference is `jax.grad`
through the sequential `lax.scan` (backpropagation through time), float64, 1e-10 relative.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statseq.inference.deer as deer_mod
from statseq.inference.deer import deer, sequential
from statseq.models.neural.cells import RNNBackbone


def _rel_err(ref, got):
    """Largest leaf-wise max |difference| / max(|reference|, 1e-300) (zero leaves: abs)."""
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))
                     / max(float(np.max(np.abs(a))), 1e-300))
               for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got),
                               strict=True) if np.size(a))


def _setup(cell, num_t):
    rnn = RNNBackbone(cell, input_dim=3, hidden_dim=4)
    params = rnn.init_params(jax.random.key(0))
    h0 = rnn.initial_state(params)
    xs = jnp.asarray(np.random.default_rng(num_t).normal(size=(num_t, 3)))

    def step(p, s, x):
        return rnn.step(p, s, x)[0]

    def loss(p, h0, xs, solve):
        states = solve(p, h0, xs)
        return sum(jnp.sum(jnp.sin(v)) for v in jax.tree_util.tree_leaves(states))

    grad_of = lambda solve: jax.jit(jax.grad(  # noqa: E731
        lambda p, h0, xs: loss(p, h0, xs, solve), argnums=(0, 1, 2)))
    ref = grad_of(lambda p, h0, xs: sequential(step, p, h0, xs))(params, h0, xs)
    quasi = grad_of(lambda p, h0, xs: deer(step, p, h0, xs, method="quasi-deer").states)
    return step, params, h0, xs, ref, quasi


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_parallel_adjoint_equals_backpropagation_through_time(cell, monkeypatch):
    monkeypatch.setattr(deer_mod, "_quasi_adjoint_parallel_enabled", lambda: True)
    step, params, h0, xs, ref, quasi = _setup(cell, 500)
    assert _rel_err(ref, quasi(params, h0, xs)) < 1e-10
    # the sweeps themselves converge (no fallback) to the sequential adjoint
    hs = jax.vmap(lambda h: jax.flatten_util.ravel_pytree(h)[0])(
        sequential(step, params, h0, xs))
    unravel = jax.flatten_util.ravel_pytree(h0)[1]

    def f(p, h, x):
        return jax.flatten_util.ravel_pytree(step(p, unravel(h), x))[0]

    g = jnp.asarray(np.random.default_rng(1).normal(size=hs.shape))
    lam, ok = jax.jit(lambda hs, g: deer_mod._quasi_adjoint_parallel(f, params, hs, xs[1:],
                                                                     g))(hs, g)
    lam_seq = deer_mod._quasi_adjoint_sequential(f, params, hs, xs[1:], g)
    assert bool(ok)
    assert _rel_err(lam_seq, lam) < 1e-11


def test_fallback_to_the_sequential_adjoint(monkeypatch):
    # sweeps that report no convergence (and return garbage) must not reach the gradient
    monkeypatch.setattr(deer_mod, "_quasi_adjoint_parallel_enabled", lambda: True)
    monkeypatch.setattr(deer_mod, "_quasi_adjoint_parallel",
                        lambda f, p, hs, xn, g: (jnp.full_like(g, jnp.nan), jnp.bool_(False)))
    _, params, h0, xs, ref, quasi = _setup("gru", 50)
    assert _rel_err(ref, quasi(params, h0, xs)) < 1e-10


def test_a_single_step_uses_no_sweeps(monkeypatch):
    monkeypatch.setattr(deer_mod, "_quasi_adjoint_parallel_enabled", lambda: True)
    _, params, h0, xs, ref, quasi = _setup("gru", 1)
    assert _rel_err(ref, quasi(params, h0, xs)) < 1e-12
