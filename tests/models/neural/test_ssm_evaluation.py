"""Whole-sequence evaluation of Mamba and LRU by DEER / quasi-DEER / ELK / quasi-ELK.

The layers' recurrences are linear in the state given the inputs (``h_t = a_t h_{t-1} +
u_t``), so the Jacobian DEER linearizes with is the multiplier ``a_t`` itself and one
Newton step from any guess is the exact trajectory (Lim et al. 2023: Newton on an affine
system is exact after one step); its first iterate from zeros is the associative scan of
`statseq.inference.linear_recurrence`. The references are the same models with
``evaluation="sequential"`` (`jax.lax.scan`, itself checked against the step-by-step
filter in test_mamba.py / test_lru.py) and `statseq.inference.deer.sequential` on one
layer: log-likelihoods to 1e-10 and their gradients to 1e-8 relative, trajectories to
1e-10, in float64.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statseq as ss
from statseq.core.recurrence import run_filter
from statseq.inference.deer import deer, sequential
from statseq.inference.linear_recurrence import linear_recurrence
from statseq.models.neural import evaluation as ev
from statseq.models.neural.lru import LRUBackbone, lru_eigenvalues
from statseq.models.neural.mamba import MambaBackbone

MODELS = {
    "mamba": ss.Mamba(hidden_dim=3, state_dim=2, num_layers=2, expand=1,
                      evaluation="sequential"),
    "lru": ss.LRU(hidden_dim=3, state_dim=2, num_layers=2, evaluation="sequential"),
}
NUM_T = 80


def _data(num_t=NUM_T, num_seq=2, seed=0):
    rng = np.random.default_rng(seed)
    y = np.sin(np.arange(num_t) / 7.0)[None] + 0.3 * rng.normal(size=(num_seq, num_t))
    return jnp.asarray(y), jnp.ones(y.shape, bool), jnp.zeros((num_seq, num_t, 0))


_PARAMS = {}


def _params(name):
    """``initialize``'s parameters, moved at random so that the recurrences matter (Mamba's
    initial step sizes ``Δ`` are 1e-3 to 1e-1: its states would hardly leave zero)."""
    if name not in _PARAMS:
        params = MODELS[name].initialize(_data()[0], key=jax.random.key(1))
        leaves, tree = jax.tree.flatten(params.backbone)
        keys = jax.random.split(jax.random.key(2), len(leaves))
        moved = [v + 0.5 * jax.random.normal(k, v.shape, v.dtype) for v, k in
                 zip(leaves, keys, strict=True)]
        _PARAMS[name] = params._replace(backbone=jax.tree.unflatten(tree, moved))
    return _PARAMS[name]


def _value_and_grad(model, params, y, mask, u):
    weights = jnp.linspace(0.5, 1.5, y.shape[1])

    def loss(p):
        return jnp.sum(weights * run_filter(model, p, y, mask, u, complete=True)[1])

    return jax.jit(jax.value_and_grad(loss))(params)


_REFERENCE = {}


def _reference(name):
    """The sequential value and gradient (computed once per module)."""
    if name not in _REFERENCE:
        y, mask, u = _data()
        params = _params(name)
        _REFERENCE[name] = params, _value_and_grad(MODELS[name], params, y, mask, u)
    return _REFERENCE[name]


def _rel_err(got, want):
    err = 0.0
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if b.size:
            err = max(err, float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)))
    return err


@pytest.mark.parametrize("name", sorted(MODELS))
def test_log_prob_and_gradient_equal_the_sequential_scan(name, monkeypatch):
    """DEER through the model (batch path, two stacked layers, two sequences). Measured:
    value 0, gradient 7e-16 relative."""
    monkeypatch.setattr(ev, "_WARNED", set())
    params, (v_ref, g_ref) = _reference(name)
    y, mask, u = _data()
    model = dataclasses.replace(MODELS[name], evaluation="deer")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # converged: no fallback warning
        v, g = _value_and_grad(model, params, y, mask, u)
        jax.effects_barrier()
    assert _rel_err(v, v_ref) <= 1e-10
    assert _rel_err(g, g_ref) <= 1e-8


def _first_layer(name):
    """The first layer's recurrence on random inputs: ``(backbone, params, h0, us)``."""
    params = _params(name).backbone
    backbone = MODELS[name].backbone
    layer = jax.tree.map(lambda v: v[0], params.layers)
    state = jax.tree.map(lambda v: v[0], backbone.initial_state(params))
    vs = jnp.asarray(np.random.default_rng(3).normal(size=(NUM_T, backbone.hidden_dim)))
    h0, us, _ = jax.jit(backbone.layer_recurrence_inputs)(layer, state, vs)
    return backbone, layer, h0, us


def _associative_scan(name, backbone, layer, h0, us):
    """The layer's recurrence by `linear_recurrence`'s associative scan (real coordinates
    ``(T,) + h0.shape``)."""
    if name == "mamba":
        e = backbone.inner_dim
        a = jnp.exp(us[:, :e, None] * -jnp.exp(layer.a_log))
        b = us[:, e:2 * e, None] * us[:, None, 2 * e:]
        return linear_recurrence(a, b, h0, parallel=True)
    n = backbone.state_dim
    lam = lru_eigenvalues(layer.nu_log, layer.theta_log)
    hc = linear_recurrence(lam, jax.lax.complex(us[:, :n], us[:, n:]),
                           jax.lax.complex(h0[0], h0[1]), parallel=True)
    return jnp.stack([jnp.real(hc), jnp.imag(hc)], axis=1)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_deer_is_the_associative_scan_and_exact_after_one_newton_step(name):
    """And so is quasi-DEER where the Jacobian is diagonal (Mamba's ``exp(Δ_t A)``)."""
    backbone, layer, h0, us = _first_layer(name)
    step = backbone.layer_recurrence_step
    methods = ("deer", "quasi-deer") if name == "mamba" else ("deer",)

    @jax.jit
    def run(layer, h0, us):
        return (sequential(step, layer, h0, us),
                _associative_scan(name, backbone, layer, h0, us),
                [deer(step, layer, h0, us, method=m) for m in methods])

    ref, scan, results = run(layer, h0, us)
    assert float(jnp.max(jnp.abs(ref))) > 0.1  # a trajectory far from the zero guess
    for res in results:
        assert bool(res.converged) and int(res.iterations) == 1  # <= 2 asked; 1 measured
        assert float(jnp.max(jnp.abs(res.states - ref))) <= 1e-10
        # ... and its one iterate is the associative scan of the recurrence
        assert float(jnp.max(jnp.abs(res.states - scan))) <= 1e-14


def test_the_other_solvers_on_one_layer():
    """quasi-DEER converges linearly where the Jacobian is not diagonal (the LRU's 2 x 2
    rotation blocks in real coordinates: measured 80 iterations for ``T = 80``, the
    at-most-``T`` bound); the damped ELK and quasi-ELK steps need several (measured: 8
    and 9) even on a linear recurrence. All reach the sequential trajectory to 1e-10."""
    for name, methods in (("lru", ("quasi-deer", "elk")), ("mamba", ("quasi-elk",))):
        backbone, layer, h0, us = _first_layer(name)
        step = backbone.layer_recurrence_step
        run = jax.jit(lambda p, h, x, step=step, methods=methods: (
            sequential(step, p, h, x), [deer(step, p, h, x, method=m) for m in methods]))
        ref, results = run(layer, h0, us)
        for method, res in zip(methods, results, strict=True):
            assert bool(res.converged), (name, method)
            assert float(jnp.max(jnp.abs(res.states - ref))) <= 1e-10, (name, method)
            if method == "quasi-deer":
                assert 10 < int(res.iterations) <= NUM_T
            else:
                assert 2 < int(res.iterations) <= 12, (name, method, int(res.iterations))


def test_non_convergence_warns_and_falls_back_to_the_sequential_answer(monkeypatch):
    """quasi-DEER on the LRU needs many iterations (the diagonal is not the Jacobian):
    with ``evaluation_max_iter=2`` it does not converge, and the model falls back to the
    sequential scan (the fallback's gradient is checked on the RNNs, same code)."""
    monkeypatch.setattr(ev, "_WARNED", set())
    params, (v_ref, _) = _reference("lru")
    y, mask, u = _data()
    model = dataclasses.replace(MODELS["lru"], evaluation="quasi-deer",
                                evaluation_max_iter=2)
    weights = jnp.linspace(0.5, 1.5, y.shape[1])
    with pytest.warns(UserWarning, match=r"'quasi-deer' did not converge \(residual"):
        v = jax.jit(lambda p: jnp.sum(weights * run_filter(model, p, y, mask, u,
                                                          complete=True)[1]))(params)
        jax.effects_barrier()
    assert _rel_err(v, v_ref) <= 1e-12


def test_fit_sgd_gives_the_same_parameters():
    """Through the public entry point (``fit_sgd`` scores with the batch path)."""
    y, _, _ = _data()
    seq = MODELS["mamba"]
    params = _params("mamba")
    fits = {}
    for method in ("sequential", "deer"):
        model = dataclasses.replace(seq, evaluation=method)
        fits[method] = ss.fit_sgd(model, params, y, optimizer=optax.adam(1e-2), num_steps=3,
                                  key=jax.random.key(0), progress=False).params
    assert _rel_err(fits["deer"], fits["sequential"]) <= 1e-6
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                zip(jax.tree.leaves(fits["deer"]), jax.tree.leaves(params), strict=True)
                if np.size(a))
    assert moved > 1e-3


@pytest.mark.parametrize("cls", [ss.Mamba, ss.LRU])
def test_bad_evaluation_is_a_value_error(cls):
    for bad in ("newton", "parallel", "DEER", 3):
        with pytest.raises(ValueError, match="evaluation must be None or one of.*quasi-elk"):
            cls(hidden_dim=2, state_dim=2, evaluation=bad)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="evaluation_max_iter"):
            cls(hidden_dim=2, state_dim=2, evaluation="deer", evaluation_max_iter=bad)
    # parallel= and evaluation= choose the same thing: contradictions are refused
    with pytest.raises(ValueError, match="'sequential'.*contradicts parallel=True"):
        cls(hidden_dim=2, state_dim=2, evaluation="sequential", parallel=True)
    for parallel in (True, False):
        with pytest.raises(ValueError, match="leave parallel=None"):
            cls(hidden_dim=2, state_dim=2, evaluation="elk", parallel=parallel)
    # the consistent spellings are accepted
    cls(hidden_dim=2, state_dim=2, evaluation="sequential", parallel=False)
    cls(hidden_dim=2, state_dim=2, evaluation="quasi-deer", evaluation_max_iter=3)


@pytest.mark.parametrize("backbone_cls", [MambaBackbone, LRUBackbone])
def test_backbone_evaluation_fields(backbone_cls):
    with pytest.raises(ValueError, match="evaluation must be None"):
        backbone_cls(input_dim=2, hidden_dim=2, evaluation="scan")
    seq = backbone_cls(input_dim=2, hidden_dim=2, evaluation="sequential")
    assert seq.newton_method is None and seq.recurrence_parallel is False
    assert backbone_cls(input_dim=2, hidden_dim=2, parallel=True).recurrence_parallel
    assert backbone_cls(input_dim=2, hidden_dim=2, evaluation="elk").newton_method == "elk"
