"""The diagonal linear recurrence: sequential == parallel == a NumPy loop (float64)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from statseq.inference.linear_recurrence import (
    combine_affine,
    linear_recurrence,
    selective_scan,
)

recurrence = jax.jit(linear_recurrence, static_argnames="parallel")


def numpy_loop(a, b, h0):
    a = np.broadcast_to(a, b.shape)
    h, out = np.array(h0, dtype=np.result_type(a, b, h0)), []
    for t in range(b.shape[0]):
        h = a[t] * h + b[t]
        out.append(h)
    return np.stack(out)


def check(a, b, h0, rtol=1e-12):
    ref = numpy_loop(np.asarray(a), np.asarray(b), np.asarray(h0))
    scale = np.max(np.abs(ref))
    for parallel in (False, True):
        got = np.asarray(recurrence(a, b, h0, parallel=parallel))
        assert got.dtype == ref.dtype
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale)


def test_real_input_dependent_multipliers():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.0, 1.0, size=(300, 3, 4))
    b = rng.normal(size=(300, 3, 4))
    check(a, b, rng.normal(size=(3, 4)))


def test_multipliers_close_to_one_long_sequence():
    """|a| = 1 - 1e-6 over T = 5000: states grow to ~T, nothing is damped away."""
    rng = np.random.default_rng(1)
    t_len = 5000
    a = 1.0 - 1e-6 * rng.uniform(size=(t_len, 5))
    a[:, 0] = 1.0  # a plain cumulative sum
    b = rng.normal(size=(t_len, 5)) + 1.0
    check(a, b, np.ones(5))
    np.testing.assert_allclose(
        np.asarray(recurrence(a, b, np.ones(5), parallel=True))[:, 0],
        1.0 + np.cumsum(b[:, 0]), rtol=1e-12)


def test_complex_constant_multiplier_broadcast_over_time():
    rng = np.random.default_rng(2)
    lam = 0.999 * np.exp(1j * rng.uniform(0, np.pi, size=(6,)))
    b = rng.normal(size=(1000, 6)) + 1j * rng.normal(size=(1000, 6))
    h0 = rng.normal(size=6) + 1j * rng.normal(size=6)
    check(lam, b, h0)
    # closed form for a constant multiplier: h_t = lam^{t+1} h0 + sum_s lam^{t-s} b_s
    t = np.arange(1000)
    h_last = lam**1000 * h0 + np.sum(lam[None] ** (999 - t)[:, None] * b, axis=0)
    got = np.asarray(recurrence(lam, b, h0, parallel=True))[-1]
    np.testing.assert_allclose(got, h_last, rtol=1e-11)


def test_complex_multiplier_real_increments_promote():
    a = np.full((4, 2), 0.5j)
    b = np.ones((4, 2))
    check(a, b, np.zeros(2))


def test_default_initial_state_and_empty_sequence():
    rng = np.random.default_rng(3)
    a, b = rng.uniform(size=(7, 2)), rng.normal(size=(7, 2))
    np.testing.assert_allclose(np.asarray(linear_recurrence(a, b, parallel=True)),
                               numpy_loop(a, b, np.zeros(2)), rtol=1e-13)
    assert linear_recurrence(a[:0], b[:0], parallel=True).shape == (0, 2)


def test_gradients_agree_between_modes():
    rng = np.random.default_rng(4)
    a = jnp.asarray(rng.uniform(0.5, 1.0, size=(200, 3)))
    b = jnp.asarray(rng.normal(size=(200, 3)))
    h0 = jnp.asarray(rng.normal(size=3))

    def loss(parallel, a, b, h0):
        h = linear_recurrence(a, b, h0, parallel=parallel)
        return jnp.sum(jnp.sin(h))

    grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3)), static_argnums=0)
    g_seq, g_par = grad(False, a, b, h0), grad(True, a, b, h0)
    for x, y in zip(g_seq, g_par, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-10, atol=1e-12)


def test_constant_multiplier_gradients_equal_broadcast_in_both_modes():
    """A constant multiplier (an LRU's ``λ``, shape of one state) is never broadcast over
    time by the sequential form; its gradients (and those of ``b``, ``h0``) equal the
    gradients through an explicitly broadcast ``(T, *shape)`` multiplier, in both modes."""
    rng = np.random.default_rng(7)
    lam = jnp.asarray(rng.uniform(0.5, 0.99, size=(3, 2)))
    b = jnp.asarray(rng.normal(size=(150, 3, 2)))
    h0 = jnp.asarray(rng.normal(size=(3, 2)))

    def loss(parallel, broadcast, lam, b, h0):
        a = jnp.broadcast_to(lam, b.shape) if broadcast else lam
        return jnp.sum(jnp.sin(linear_recurrence(a, b, h0, parallel=parallel)))

    grad = jax.jit(jax.grad(loss, argnums=(2, 3, 4)), static_argnums=(0, 1))
    ref = grad(False, True, lam, b, h0)
    for parallel in (False, True):
        for x, y in zip(grad(parallel, False, lam, b, h0), ref, strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-10, atol=1e-12)


def test_combine_is_associative():
    rng = np.random.default_rng(5)
    e = [tuple(rng.normal(size=(2, 4)) + 1j * rng.normal(size=(2, 4))) for _ in range(3)]
    left = combine_affine(combine_affine(e[0], e[1]), e[2])
    right = combine_affine(e[0], combine_affine(e[1], e[2]))
    for x, y in zip(left, right, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-13)


def test_shape_errors():
    with pytest.raises(ValueError, match="a must have the shape"):
        linear_recurrence(np.ones((3, 2)), np.ones((3, 4)))
    with pytest.raises(ValueError, match="h0 must have shape"):
        linear_recurrence(np.ones((3, 2)), np.ones((3, 2)), np.ones(3))
    with pytest.raises(ValueError, match="leading time axis"):
        linear_recurrence(np.ones(()), np.ones(()))


def numpy_selective(delta, x, a, b, c, h0):
    h, ys = h0.copy(), []
    for t in range(delta.shape[0]):
        for e in range(a.shape[0]):
            for n in range(a.shape[1]):
                h[e, n] = np.exp(delta[t, e] * a[e, n]) * h[e, n] + delta[t, e] * x[t, e] * b[t, n]
        ys.append(h @ c[t])
    return np.stack(ys), h


def test_selective_scan_matches_numpy_in_both_modes():
    rng = np.random.default_rng(6)
    t_len, e, n = 50, 3, 4
    delta = np.log1p(np.exp(rng.normal(size=(t_len, e))))
    x, b, c = rng.normal(size=(t_len, e)), rng.normal(size=(t_len, n)), rng.normal(
        size=(t_len, n))
    a = -np.exp(rng.normal(size=(e, n)))
    h0 = rng.normal(size=(e, n))
    y_ref, h_ref = numpy_selective(delta, x, a, b, c, h0)
    run = jax.jit(selective_scan, static_argnames="parallel")
    for parallel in (False, True):
        y, h = run(delta, x, a, b, c, h0, parallel=parallel)
        np.testing.assert_allclose(np.asarray(y), y_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(h), h_ref, rtol=1e-12, atol=1e-12)

    def loss(parallel, *args):
        return jnp.sum(jnp.sin(selective_scan(*args, parallel=parallel)[0]))

    grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4, 5, 6)), static_argnums=0)
    for g_seq, g_par in zip(grad(False, delta, x, a, b, c, h0), grad(True, delta, x, a, b, c,
                                                                     h0), strict=True):
        np.testing.assert_allclose(np.asarray(g_seq), np.asarray(g_par), rtol=1e-10,
                                   atol=1e-12)
    with pytest.raises(ValueError, match="b must have shape"):
        selective_scan(delta, x, a, b[:, :2], c)


def _edge_cases():
    """(a, b, h0) for the in-place sequential loop's edge cases, float64 unless named."""
    rng = np.random.default_rng(11)
    per_step = rng.uniform(-1.0, 1.0, size=(7, 3, 2))
    per_step[2, 0] = 0.0  # a state reset inside the sequence
    lam = 0.9 * np.exp(1j * rng.uniform(0, np.pi, size=(3,)))
    return {
        "length 1": (rng.uniform(size=(1, 4)), rng.normal(size=(1, 4)), rng.normal(size=4)),
        "per-step a, odd length, 3-d state": (per_step, rng.normal(size=(7, 3, 2)),
                                             rng.normal(size=(3, 2))),
        "constant complex a": (lam, rng.normal(size=(5, 3)) + 1j * rng.normal(size=(5, 3)),
                               rng.normal(size=3) + 0j),
        "float32": (rng.uniform(size=(9, 5)).astype(np.float32),
                    rng.normal(size=(9, 5)).astype(np.float32),
                    rng.normal(size=5).astype(np.float32)),
        "constant a, float32, length 1": (rng.uniform(size=(2, 3)).astype(np.float32),
                                          rng.normal(size=(1, 2, 3)).astype(np.float32),
                                          rng.normal(size=(2, 3)).astype(np.float32)),
        "constant real a, float32, odd length": (rng.uniform(size=6).astype(np.float32),
                                                 rng.normal(size=(13, 6)).astype(np.float32),
                                                 rng.normal(size=6).astype(np.float32)),
        "inf and nan in b, first and later rows": (
            rng.uniform(size=(6, 4)),
            np.where(np.isin(np.arange(24).reshape(6, 4), (1, 9, 14, 22)),
                     [[np.inf], [-np.inf], [np.nan], [np.inf], [1.0], [np.nan]],
                     rng.normal(size=(6, 4))),
            rng.normal(size=4)),
    }


@pytest.mark.parametrize("case", list(_edge_cases()))
def test_in_place_loop_equals_stacking_scan(case):
    """The sequential form (a loop writing each state over ``b``'s buffer in place) gives
    bit for bit the states of the `lax.scan` that stacks them (the form before it), and
    the NumPy loop to 1e-12 (1e-6 in float32)."""
    from statseq.inference.linear_recurrence import _prepare, _sequential_scan

    a, b, h0 = _edge_cases()[case]
    got = np.asarray(recurrence(a, b, h0, parallel=False))
    want = np.asarray(jax.jit(_sequential_scan)(*_prepare(a, b, h0)))
    assert got.dtype == want.dtype == np.result_type(a, b, h0)
    np.testing.assert_array_equal(got, want)
    rtol = 1e-6 if got.dtype == np.float32 else 1e-12
    ref = numpy_loop(a, b, h0)
    scale = np.max(np.abs(ref[np.isfinite(ref)]))
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale)


def test_in_place_loop_bitwise_with_b_computed_in_the_jit_and_batched():
    """The loop's first pass (``where(t == 0, a_0 h0 + b, b)``, into which XLA fuses a
    ``b`` computed in the same jitted function) keeps the states bit for bit those of the
    stacking `lax.scan`, under `jax.vmap`, for a constant and a per-step multiplier, with
    ``T = 1`` and an odd ``T``, float32 and float64."""
    from statseq.inference.linear_recurrence import _prepare, _sequential_scan

    rng = np.random.default_rng(13)
    forms = {"loop": partial(linear_recurrence, parallel=False),
             "scan": lambda a, b, h0: _sequential_scan(*_prepare(a, b, h0))}
    for dtype in (np.float32, np.float64):
        for t_len in (1, 7):
            u = rng.normal(size=(2, t_len, 3)).astype(dtype)
            h0 = rng.normal(size=(2, 3)).astype(dtype)
            for a in (rng.uniform(size=(2, 3)), rng.uniform(size=(2, t_len, 3))):
                a = a.astype(dtype)
                got, want = (np.asarray(jax.jit(jax.vmap(
                    lambda a, u, h0, f=f: f(a, 0.5 * jnp.tanh(u), h0)))(a, u, h0))
                    for f in forms.values())
                assert got.dtype == dtype
                np.testing.assert_array_equal(got, want)


def test_sequential_batched_and_forward_mode_derivatives_match_parallel():
    """`jax.vmap` over a batch, forward mode (`jax.jvp`) and second derivatives
    (`jax.hessian`, forward over reverse) through the sequential form (a `custom_jvp`
    whose tangent is a `lax.scan`) equal the associative scan's."""
    rng = np.random.default_rng(12)
    a = jnp.asarray(rng.uniform(0.3, 1.0, size=(2, 6, 3)))
    b = jnp.asarray(rng.normal(size=(2, 6, 3)))
    h0 = jnp.asarray(rng.normal(size=(2, 3)))
    batched = {p: jax.jit(jax.vmap(lambda a, b, h0, p=p: linear_recurrence(a, b, h0, parallel=p)))
               for p in (False, True)}
    np.testing.assert_allclose(batched[False](a, b, h0), batched[True](a, b, h0), rtol=1e-13)

    def loss(parallel, lam, b):
        return jnp.sum(jnp.sin(linear_recurrence(lam, b, h0[0], parallel=parallel)))

    lam, tangents = a[0, 0], (jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=(6, 3))))
    jvp = jax.jit(lambda p, *x: jax.jvp(partial(loss, p), x, tangents), static_argnums=0)
    hess = jax.jit(lambda p, *x: jax.hessian(partial(loss, p))(*x), static_argnums=0)
    for f in (jvp, hess):
        for x, y in zip(jax.tree.leaves(f(False, lam, b[0])), jax.tree.leaves(f(True, lam, b[0])),
                        strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-10, atol=1e-12)


def test_in_place_loop_writes_its_output_once_before_the_loop():
    """What the docstring of `_sequential_in_place` claims of the compiled program: before
    the loop, the ``(T, D)`` output is written by exactly one fusion and never by a copy
    of ``b``, both where ``b`` is an argument of the jitted function and where it is
    computed in it (``tanh(u) / 2`` fuses into that pass: ``b`` is not stored first)."""
    import re

    lam, u = np.full(4, 0.5, np.float32), np.ones((6, 4), np.float32)
    programs = (jax.jit(partial(linear_recurrence, parallel=False)),
                jax.jit(lambda lam, u: linear_recurrence(lam, 0.5 * jnp.tanh(u),
                                                         parallel=False)))
    for program in programs:
        text = program.lower(lam, u).compile().as_text()
        entry = text[text.index("ENTRY"):]
        assert not re.search(r"= f32\[6,4\]\{1,0\} copy\(", entry), entry
        assert len(re.findall(r"= f32\[6,4\]\{1,0\} fusion\(", entry)) == 1, entry
