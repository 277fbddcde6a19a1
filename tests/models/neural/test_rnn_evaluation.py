"""Whole-sequence evaluation of the recurrent models by DEER / quasi-DEER / ELK.

The reference is the same model with ``evaluation="sequential"`` (`jax.lax.scan`, itself
checked against the step-by-step filter and its autodiff in test_rnn_batch.py): the
log-likelihoods and their gradients (implicit through the solver's trajectory, Lim et al.
2023; Gonzalez et al. 2024) must agree to 1e-8 relative in float64, a short fit_sgd must
give the same parameters, and a solver that does not converge must fall back to the
sequential answer with a warning.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statseq as ss
from statseq.core.recurrence import run_filter
from statseq.models.neural import evaluation as ev

CELLS = {"gru": ss.GRU, "lstm": ss.LSTM, "elman": ss.ElmanRNN}


def _data(num_t=200, num_seq=2, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(num_t)
    y = np.sin(t / 7.0)[None] + 0.3 * rng.normal(size=(num_seq, num_t))
    return jnp.asarray(y), jnp.ones(y.shape, bool), jnp.zeros((num_seq, num_t, 0))


@partial(jax.jit, static_argnums=0)
def _value_and_grad(model, params, y, mask, u):
    # jitted whole: one program per model (forward and backward together) instead of the
    # separately compiled forward and backward of an eager value_and_grad (~15% less CPU)
    weights = jnp.linspace(0.5, 1.5, y.shape[1])

    def loss(p):
        lps = run_filter(model, p, y, mask, u, complete=True)[1]
        return jnp.sum(weights * lps)

    return jax.value_and_grad(loss)(params)


def _assert_close(got, want, rtol):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if b.size:
            assert np.max(np.abs(a - b)) <= rtol * max(np.max(np.abs(b)), 1e-300), (a, b)


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_log_prob_and_gradient_equal_the_sequential_scan(cell):
    y, mask, u = _data()
    # the LSTM has two layers: solved layer after layer, the second reading the first's
    # (solved) trajectory
    layers = 2 if cell == "lstm" else 1
    seq = CELLS[cell](hidden_dim=3, num_layers=layers, evaluation="sequential")
    params = seq.initialize(y, key=jax.random.key(1))
    v_ref, g_ref = _value_and_grad(seq, params, y, mask, u)
    # the parallel solvers: ELK on the GRU only (its compile is the slowest; its adjoint
    # is DEER's, and the solver itself is checked on every cell in test_deer.py)
    methods = ("deer", "quasi-deer") + (("elk",) if cell == "gru" else ())
    for method in methods:
        model = dataclasses.replace(seq, evaluation=method)
        v, g = _value_and_grad(model, params, y, mask, u)
        _assert_close(v, v_ref, 1e-8)
        _assert_close(g, g_ref, 1e-8)


def test_fit_sgd_gives_the_same_parameters():
    """Through the public entry point (``fit_sgd`` scores with the batch path)."""
    y, _, _ = _data(num_t=120, num_seq=2)
    seq = ss.ElmanRNN(hidden_dim=3, evaluation="sequential")
    params = seq.initialize(y, key=jax.random.key(3))
    opt = optax.adam(1e-2)
    fits = {}
    for method in ("sequential", "deer"):
        model = dataclasses.replace(seq, evaluation=method)
        fits[method] = ss.fit_sgd(model, params, y, optimizer=opt, num_steps=5,
                                  key=jax.random.key(0), progress=False).params
    _assert_close(fits["deer"], fits["sequential"], 1e-6)
    # the fit moved the parameters (the comparison is not of the starting point)
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                zip(jax.tree.leaves(fits["deer"]), jax.tree.leaves(params), strict=True)
                if np.size(a))
    assert moved > 1e-3


def test_non_convergence_warns_and_falls_back_to_the_sequential_answer(monkeypatch):
    monkeypatch.setattr(ev, "_WARNED", set())
    y, mask, u = _data(num_t=200)
    seq = ss.ElmanRNN(hidden_dim=3, evaluation="sequential")
    params = seq.initialize(y, key=jax.random.key(4))
    v_ref, g_ref = _value_and_grad(seq, params, y, mask, u)
    # one Newton iteration fixes only h_0 exactly (Lim et al. 2023): not converged at T=200
    model = dataclasses.replace(seq, evaluation="deer", evaluation_max_iter=1)
    with pytest.warns(UserWarning, match=r"'deer' did not converge \(residual"):
        v, g = _value_and_grad(model, params, y, mask, u)
        jax.effects_barrier()
    _assert_close(v, v_ref, 1e-12)
    _assert_close(g, g_ref, 1e-12)
    # once per method and process: a second call (a training loop) does not repeat it
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _value_and_grad(model, params, y, mask, u)
        jax.effects_barrier()
    assert np.all(np.isfinite(np.asarray(jax.flatten_util.ravel_pytree(g)[0])))


def test_default_evaluation_by_backend_and_length(monkeypatch):
    assert ev.resolve_evaluation(None, 10**5) == ("sequential" if jax.default_backend()
                                                  == "cpu" else "deer")
    monkeypatch.setattr(ev.jax, "default_backend", lambda: "gpu")
    assert ev.resolve_evaluation(None, ev.PARALLEL_MIN_TIMESTEPS) == "deer"
    assert ev.resolve_evaluation(None, ev.PARALLEL_MIN_TIMESTEPS - 1) == "sequential"
    assert ev.resolve_evaluation("quasi-elk", 5) == "quasi-elk"
    assert ev.resolve_evaluation("sequential", 10**6) == "sequential"


@pytest.mark.parametrize("bad", ["newton", "DEER", "", 3])
def test_bad_evaluation_is_a_value_error_naming_the_choices(bad):
    for cls in CELLS.values():
        with pytest.raises(ValueError, match="evaluation must be None or one of.*quasi-elk"):
            cls(hidden_dim=2, evaluation=bad)
    from statseq.models.neural.cells import RNNBackbone

    with pytest.raises(ValueError, match="'sequential', 'deer', 'quasi-deer', 'elk'"):
        RNNBackbone("gru", 2, 2, evaluation=bad)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_evaluation_max_iter(bad):
    with pytest.raises(ValueError, match="evaluation_max_iter"):
        ss.GRU(hidden_dim=2, evaluation="deer", evaluation_max_iter=bad)
