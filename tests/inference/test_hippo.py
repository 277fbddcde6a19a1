"""HiPPO-LegS, HiPPO-N, S4D initializations, discretization, the SSM kernel and the FFT
convolution against independent references (loops, Legendre projections, scipy's expm,
dense NumPy algebra, direct O(T^2) sums), in float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.polynomial import legendre
from scipy.linalg import expm

from statseq.inference import diagonal_ssm
from statseq.inference.diagonal_ssm import (
    causal_convolution,
    discretize_bilinear,
    discretize_zoh,
    ssm_kernel,
)
from statseq.inference.hippo import hippo_legs, hippo_legs_nplr, hippo_n_eig, s4d_init

N = 8


def test_hippo_legs_entries_match_the_closed_form():
    """Gu et al. 2020, Theorem 2 / eq. (2): entry by entry."""
    a, b = hippo_legs(N)
    for n in range(N):
        assert b[n] == pytest.approx(np.sqrt(2 * n + 1), rel=1e-15)
        for k in range(N):
            want = (-np.sqrt((2 * n + 1) * (2 * k + 1)) if n > k
                    else -(n + 1.0) if n == k else 0.0)
            assert a[n, k] == pytest.approx(want, rel=1e-15, abs=0.0)


@pytest.mark.parametrize("m", range(N))
def test_hippo_legs_is_the_legendre_projection_ode(m):
    """The LegS coefficients of f(s) = s^m on [0, t] are c(t) = t^m c(1) with
    c_n(1) = sqrt(2n+1) (1/2) int_{-1}^{1} ((x+1)/2)^m P_n(x) dx; the ODE
    c' = (A c + B f) / t then says (m I - A) c(1) = B. c(1) comes from NumPy's Legendre
    series (an independent derivation of the matrix)."""
    a, b = hippo_legs(N)
    poly = np.polynomial.polynomial.polypow([0.5, 0.5], m)  # ((x + 1) / 2)^m
    coef = np.zeros(N)
    leg = legendre.poly2leg(poly)
    coef[:leg.size] = leg
    c1 = coef / np.sqrt(2 * np.arange(N) + 1.0)  # sqrt(2n+1) * a_n / (2n+1)
    np.testing.assert_allclose((m * np.eye(N) - a) @ c1, b, rtol=1e-12, atol=1e-12)


def test_nplr_and_hippo_n_eigenstructure():
    a, _ = hippo_legs(N)
    a_n, p, b = hippo_legs_nplr(N)
    np.testing.assert_allclose(a_n - np.outer(p, p), a, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(p, np.sqrt(np.arange(N) + 0.5), rtol=1e-15)
    np.testing.assert_array_equal(b, hippo_legs(N)[1])
    s = a_n + 0.5 * np.eye(N)  # skew-symmetric part
    np.testing.assert_allclose(s, -s.T, atol=1e-15)
    np.testing.assert_allclose(np.diag(a_n), -0.5)
    lam, v = hippo_n_eig(N)
    np.testing.assert_allclose(v.conj().T @ v, np.eye(N), atol=1e-13)  # unitary
    np.testing.assert_allclose(v @ np.diag(lam) @ v.conj().T, a_n, atol=1e-12)
    np.testing.assert_allclose(lam.real, -0.5, atol=1e-13)
    np.testing.assert_allclose(np.sort(lam.imag), -np.sort(lam.imag)[::-1], atol=1e-12)
    assert np.all(np.diff(lam.imag) > 0) and np.all(np.abs(lam.imag) > 1e-3)
    # against a general (non-Hermitian) eigensolver
    ref = np.linalg.eigvals(a_n)
    np.testing.assert_allclose(np.sort_complex(ref), np.sort_complex(lam), atol=1e-10)


def test_s4d_initializations():
    """S4D-Lin -1/2 + i pi n, S4D-Inv -1/2 + i (N/pi)(N/(2n+1) - 1) (Gu et al. 2022,
    Section 4), S4D-LegS the positive half of HiPPO-N's spectrum."""
    n = 2 * N
    for k, v in enumerate(s4d_init(n, "lin")):
        assert v == pytest.approx(-0.5 + 1j * np.pi * k, rel=1e-15)
    for k, v in enumerate(s4d_init(n, "inv")):
        assert v == pytest.approx(-0.5 + 1j * n / np.pi * (n / (2 * k + 1) - 1), rel=1e-15)
    legs = s4d_init(n, "legs")
    full = np.linalg.eigvals(hippo_legs_nplr(n)[0])
    np.testing.assert_allclose(np.sort(legs.imag), np.sort(full.imag[full.imag > 0]),
                               rtol=1e-10)
    assert s4d_init(4, "inv").shape == (2,)


@pytest.mark.parametrize("call, match", [
    (lambda: hippo_legs(0), "n must"), (lambda: hippo_n_eig(2.5), "n must"),
    (lambda: s4d_init(5), "even"), (lambda: s4d_init(4, "fourier"), "init"),
    (lambda: ssm_kernel(jnp.zeros(1), jnp.ones(1), jnp.ones(1), -1), "length"),
    (lambda: causal_convolution(jnp.ones(3), jnp.ones(4)), "same leading"),
])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _random_system(rng, m=5, inputs=None):
    a = -rng.uniform(0.1, 2.0, m) + 1j * rng.normal(0.0, 3.0, m)
    shape = (m,) if inputs is None else (m, inputs)
    b = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    return a, b


@pytest.mark.parametrize("dt", [1e-6, 0.03, 0.7])
def test_zoh_matches_the_matrix_exponential_of_the_augmented_system(dt):
    """expm(dt [[A, B], [0, 0]]) = [[Ā, B̄], [0, I]] (Van Loan) with scipy's expm."""
    rng = np.random.default_rng(1)
    a, b = _random_system(rng, inputs=3)
    m = a.size
    aug = np.zeros((m + 3, m + 3), complex)
    aug[:m, :m], aug[:m, m:] = np.diag(a), b
    e = expm(dt * aug)
    disc = discretize_zoh(jnp.asarray(a), jnp.asarray(b), dt)
    np.testing.assert_allclose(np.diag(np.asarray(disc.a_bar)), e[:m, :m], rtol=1e-13,
                               atol=1e-15)
    np.testing.assert_allclose(np.asarray(disc.b_bar), e[:m, m:], rtol=1e-10, atol=1e-16)
    np.testing.assert_allclose(np.asarray(disc.log_a_bar), dt * a, rtol=1e-15)
    # one input per state (vector b) and per-state steps
    dts = rng.uniform(0.01, 1.0, m)
    disc = discretize_zoh(jnp.asarray(a), jnp.asarray(b[:, 0]), jnp.asarray(dts))
    for i in range(m):
        small = expm(dts[i] * np.array([[a[i], b[i, 0]], [0.0, 0.0]]))
        assert complex(disc.a_bar[i]) == pytest.approx(small[0, 0], rel=1e-13)
        assert complex(disc.b_bar[i]) == pytest.approx(small[0, 1], rel=1e-10)


@pytest.mark.parametrize("dt", [1e-6, 0.03, 0.7])
def test_bilinear_matches_its_dense_formula(dt):
    """Ā = (I - Δ/2 A)^{-1}(I + Δ/2 A), B̄ = (I - Δ/2 A)^{-1} Δ B (the reference lecture on
    SSMs), by dense linear solves."""
    rng = np.random.default_rng(2)
    a, b = _random_system(rng, inputs=2)
    big_a = np.diag(a)
    eye = np.eye(a.size)
    a_bar = np.linalg.solve(eye - dt / 2 * big_a, eye + dt / 2 * big_a)
    b_bar = np.linalg.solve(eye - dt / 2 * big_a, dt * b)
    disc = discretize_bilinear(jnp.asarray(a), jnp.asarray(b), dt)
    np.testing.assert_allclose(np.diag(np.asarray(disc.a_bar)), a_bar, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(disc.b_bar), b_bar, rtol=1e-13)
    np.testing.assert_allclose(np.exp(np.asarray(disc.log_a_bar)), np.diag(a_bar),
                               rtol=1e-13)
    assert np.all(np.abs(np.asarray(disc.a_bar)) < 1)  # Re a < 0: inside the unit disk


def test_kernel_matches_the_explicit_power_loop():
    """K_j = C Ā^j B̄ by explicit matrix powers; the conjugate-pair form against the real
    system that holds both states of every pair."""
    rng = np.random.default_rng(3)
    a, b = _random_system(rng, m=4)
    c = rng.normal(size=4) + 1j * rng.normal(size=4)
    disc = discretize_zoh(jnp.asarray(a), jnp.asarray(b), 0.2)
    a_bar, b_bar = np.asarray(disc.a_bar), np.asarray(disc.b_bar)
    length = 30
    k = np.asarray(ssm_kernel(disc.log_a_bar, disc.b_bar, jnp.asarray(c), length,
                              conjugate_pairs=False))
    big_a = np.diag(a_bar)
    ref = [c @ np.linalg.matrix_power(big_a, j) @ b_bar for j in range(length)]
    np.testing.assert_allclose(k, ref, rtol=1e-12, atol=1e-14)
    # a real system with both members of each pair: real kernel = 2 Re
    a2, b2, c2 = (np.concatenate([v, v.conj()]) for v in (a_bar, b_bar, c))
    ref2 = [c2 @ np.linalg.matrix_power(np.diag(a2), j) @ b2 for j in range(length)]
    assert np.max(np.abs(np.imag(ref2))) < 1e-12
    k2 = np.asarray(ssm_kernel(disc.log_a_bar, disc.b_bar, jnp.asarray(c), length))
    np.testing.assert_allclose(k2, np.real(ref2), rtol=1e-12, atol=1e-14)
    # MIMO: C (O, N), B̄ (N, I) through broadcast axes -> (length, O, I)
    a, b = _random_system(rng, m=4, inputs=3)
    cm = rng.normal(size=(2, 4)) + 1j * rng.normal(size=(2, 4))
    disc = discretize_bilinear(jnp.asarray(a), jnp.asarray(b), 0.3)
    km = np.asarray(ssm_kernel(disc.log_a_bar, disc.b_bar.T[None], jnp.asarray(cm)[:, None],
                               length))
    big_a, b_bar = np.diag(np.asarray(disc.a_bar)), np.asarray(disc.b_bar)
    refm = [2 * np.real(cm @ np.linalg.matrix_power(big_a, j) @ b_bar) for j in range(length)]
    np.testing.assert_allclose(km, refm, rtol=1e-11, atol=1e-13)


def test_kernel_in_chunks(monkeypatch):
    """Past `KERNEL_CHUNK` taps the powers are formed chunk by chunk: the value against a
    NumPy Vandermonde product, the gradient against the unchunked kernel."""
    rng = np.random.default_rng(4)
    length = 2 * diagonal_ssm.KERNEL_CHUNK + 37
    log_a = jnp.asarray(-rng.uniform(1e-4, 1e-2, 3) + 1j * rng.normal(0.0, 0.1, 3))
    cb = jnp.asarray(rng.normal(size=3) + 1j * rng.normal(size=3))
    weights = jnp.asarray(rng.normal(size=length))

    def value_and_grad():
        return jax.value_and_grad(
            lambda la, cb: jnp.sum(weights * ssm_kernel(la, cb, 1.0, length)),
            argnums=(0, 1))(log_a, cb)

    ref = 2 * np.real(np.exp(np.arange(length)[:, None] * np.asarray(log_a)) @ np.asarray(cb))
    got = ssm_kernel(log_a, cb, 1.0, length)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-11, atol=1e-12)
    chunked = value_and_grad()
    monkeypatch.setattr(diagonal_ssm, "KERNEL_CHUNK", 10**9)
    whole = value_and_grad()
    for a, b in zip(jax.tree.leaves(chunked), jax.tree.leaves(whole), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-11)


@pytest.mark.parametrize("t_len", [1, 2, 17, 100])
def test_fft_convolution_matches_the_direct_sum(t_len):
    rng = np.random.default_rng(t_len)
    kernel, u = rng.normal(size=(t_len, 3)), rng.normal(size=(t_len, 3))
    ref = np.array([[sum(kernel[j, h] * u[t - j, h] for j in range(t + 1)) for h in range(3)]
                    for t in range(t_len)])
    got = causal_convolution(jnp.asarray(kernel), jnp.asarray(u))
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-12)
    ck = kernel + 1j * rng.normal(size=(t_len, 3))  # complex kernel, real input
    ref_c = np.array([[sum(ck[j, h] * u[t - j, h] for j in range(t + 1)) for h in range(3)]
                      for t in range(t_len)])
    got_c = causal_convolution(jnp.asarray(ck), jnp.asarray(u))
    np.testing.assert_allclose(np.asarray(got_c), ref_c, rtol=1e-12, atol=1e-12)
