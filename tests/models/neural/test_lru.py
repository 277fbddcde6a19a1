"""LRU: eigenvalues inside the unit disk, the block against NumPy, and the parallel,
sequential and step-by-step (generation) modes against each other, in float64."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

import statseq as ss
from statseq.models.neural.lru import LRU, LRUBackbone, lru_eigenvalues, lru_normalization
from statseq.models.neural.residual import RMS_EPS


def _rms(x, w):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def numpy_layer(bb, p, vs):
    """One LRU layer from zero state, with complex NumPy arithmetic, step by step."""
    p = jax.tree.map(np.asarray, p)
    d = bb.hidden_dim
    lam = np.exp(-np.exp(p.nu_log) + 1j * np.exp(p.theta_log))
    gamma = np.sqrt(1.0 - np.abs(lam) ** 2)
    b = (p.b_re + 1j * p.b_im) * gamma[:, None]
    c = p.c_re + 1j * p.c_im
    h = np.zeros(bb.state_dim, complex)
    out = []
    for v in vs:
        h = lam * h + b @ v
        y = np.real(c @ h) + p.d_skip * v
        g = 0.5 * y * (1.0 + erf(y / np.sqrt(2.0)))
        gates = g @ p.glu_weight + p.glu_bias
        out.append(gates[:d] / (1.0 + np.exp(-gates[d:])))
    return np.stack(out)


def numpy_backbone(bb, params, xs):
    params = jax.tree.map(np.asarray, params)
    zs = xs @ params.embed_weight + params.embed_bias
    for ell in range(bb.num_layers):
        layer = jax.tree.map(lambda a, ell=ell: a[ell], params.layers)
        zs = zs + numpy_layer(bb, layer, _rms(zs, params.norm[ell]))
    return _rms(zs, params.final_norm)


def perturbed_params(bb, key):
    """Random weights plus Gaussian noise (NumPy: no compilation)."""
    rng = np.random.default_rng(98)
    return jax.tree.map(lambda x: jnp.asarray(x + 0.3 * rng.normal(size=x.shape)),
                        bb.init_params(key))


BACKBONE = LRUBackbone(input_dim=3, hidden_dim=4, num_layers=2, state_dim=3, r_min=0.8,
                       r_max=0.99)


def test_eigenvalues_inside_unit_disk_for_any_parameters():
    rng = np.random.default_rng(0)
    nu = rng.uniform(-30.0, 30.0, size=10_000)
    theta = rng.uniform(-30.0, 5.0, size=10_000)
    lam = np.asarray(lru_eigenvalues(jnp.asarray(nu), jnp.asarray(theta)))
    assert np.all(np.abs(lam) < 1.0)
    # (XLA flushes subnormal moduli to zero: atol)
    np.testing.assert_allclose(np.abs(lam), np.exp(-np.exp(nu)), rtol=1e-12, atol=1e-300)
    nonzero = np.abs(lam) > 1e-100  # the phase of a modulus 0 is undefined
    np.testing.assert_allclose(np.exp(1j * np.angle(lam[nonzero])),
                               np.exp(1j * np.exp(theta[nonzero])), atol=1e-9)
    # gamma^2 + |lambda|^2 = 1, accurately even where |lambda| rounds to 1
    gamma = np.asarray(lru_normalization(jnp.asarray(nu)))
    np.testing.assert_allclose(gamma**2 + np.abs(lam) ** 2, 1.0, rtol=1e-12)
    tiny = np.asarray(lru_normalization(jnp.asarray([-60.0])))
    np.testing.assert_allclose(tiny, np.sqrt(2.0 * np.exp(-60.0)), rtol=1e-12)


def test_initial_eigenvalues_on_the_requested_ring():
    bb = LRUBackbone(input_dim=1, hidden_dim=2, state_dim=500, r_min=0.6, r_max=0.9,
                     max_phase=1.0)
    p = bb.init_params(jax.random.key(1)).layers
    lam = np.asarray(lru_eigenvalues(p.nu_log, p.theta_log))
    assert np.all((np.abs(lam) >= 0.6 - 1e-12) & (np.abs(lam) <= 0.9 + 1e-12))
    assert np.all((np.angle(lam) > 0) & (np.angle(lam) <= 1.0 + 1e-12))


def test_backbone_matches_numpy_in_every_mode():
    params = perturbed_params(BACKBONE, jax.random.key(0))
    xs = np.random.default_rng(0).normal(size=(11, 3))
    ref = numpy_backbone(BACKBONE, params, xs)
    assert np.std(ref) > 0.1
    for parallel in (False, True):
        bb = dataclasses.replace(BACKBONE, parallel=parallel)
        got = jax.jit(bb.sequence)(params, jnp.asarray(xs))
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-12)

    @jax.jit
    def stepwise(params, xs):
        return jax.lax.scan(lambda s, x: BACKBONE.step(params, s, x),
                            BACKBONE.initial_state(params), xs)

    final, hs = stepwise(params, jnp.asarray(xs))
    np.testing.assert_allclose(np.asarray(hs), ref, rtol=1e-12, atol=1e-12)
    assert final.shape == (2, 3) and jnp.iscomplexobj(final)


MODEL = LRU(hidden_dim=4, state_dim=3, num_layers=2, emission="poisson", input_dim=1)


@pytest.fixture(scope="module")
def model_case():
    rng = np.random.default_rng(1)
    t_len = 40
    u = np.cos(np.arange(t_len) / 4.0)[:, None]
    y = rng.poisson(np.exp(1.0 + np.sin(np.arange(t_len) / 3.0)))
    params = MODEL.initialize(y, key=jax.random.key(2), inputs=u)
    params = params._replace(backbone=perturbed_params(MODEL.backbone, jax.random.key(3)))
    return params, y, u


def test_parallel_sequential_and_generation_modes_agree(model_case):
    params, y, u = model_case
    step = ss.filter(MODEL, params, y, inputs=u, return_carries=True)  # one step at a time
    ref = np.asarray(step.log_probs)
    assert np.all(np.isfinite(ref)) and np.ptp(ref) > 0.1
    for parallel in (False, True):
        model = dataclasses.replace(MODEL, parallel=parallel)
        got = ss.filter(model, params, y, inputs=u).log_probs  # whole-sequence fast path
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-10, atol=1e-12)
    fast = jax.jit(MODEL.complete_data_log_probs)(params, jnp.asarray(y), jnp.asarray(u))[1]
    last = jax.tree.map(lambda c: c[-1], step.carries)
    for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(last), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_gradients_finite_on_long_sequences():
    """Through the complex associative scan (the sequential recurrence's gradients equal
    the parallel one's: test_linear_recurrence)."""
    model = LRU(hidden_dim=4, state_dim=2, num_layers=1, r_min=0.99, r_max=0.999,
                parallel=True)
    y = np.sin(np.arange(2000) / 7.0) + 0.1 * np.random.default_rng(4).normal(size=2000)
    params = model.initialize(y, key=jax.random.key(5))
    grads = jax.jit(jax.grad(lambda p: ss.log_prob(model, p, y)))(params)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))
    assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(grads.backbone.layers))


def test_forecast(model_case):
    """Ancestral sample paths from the filtered state (ss.sample itself is covered by the
    contract test)."""
    params, y, u = model_case
    fc = ss.forecast(MODEL, params, y, num_steps=4, num_samples=50, key=jax.random.key(7),
                     inputs=u, future_inputs=np.zeros((4, 1)))
    samples = np.asarray(fc.samples)
    assert samples.shape[-1] == 4 and np.all(samples >= 0)
    assert np.all(samples == np.round(samples))  # Poisson counts


@pytest.mark.parametrize("kwargs, error, match", [
    ({"hidden_dim": 0}, ValueError, "hidden_dim"),
    ({"state_dim": 0}, ValueError, "state_dim"),
    ({"r_min": 0.9, "r_max": 0.5}, ValueError, "r_min"),
    ({"r_max": 1.0}, ValueError, "r_max"),
    ({"max_phase": 0.0}, ValueError, "max_phase"),
    ({"parallel": 1}, TypeError, "parallel"),
])
def test_invalid_configuration(kwargs, error, match):
    with pytest.raises(error, match=match):
        LRU(**kwargs)
