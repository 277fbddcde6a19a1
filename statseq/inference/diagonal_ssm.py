"""Diagonal linear state space systems: discretization, convolution kernel, FFT convolution.

A continuous-time system ``x'(t) = A x(t) + B u(t)``, ``y(t) = C x(t)`` with a diagonal
(complex) ``A = diag(a)`` sampled at step ``Δ`` becomes the recurrence

    x_k = Ā x_{k-1} + B̄ u_k,     y_k = C x_k,

with, per state ``n`` (elementwise, since ``A`` is diagonal),

    zero-order hold (input held constant over each step):
        ā = exp(Δ a),                b̄ = (exp(Δ a) - 1) / a · b,
    bilinear (Tustin; the reference texts' lecture on SSMs, after S4):
        ā = (1 + Δ a / 2) / (1 - Δ a / 2),   b̄ = Δ b / (1 - Δ a / 2),

the diagonal case of ``Ā = exp(Δ A)``, ``B̄ = A^{-1}(Ā - I) B`` and
``Ā = (I - Δ/2 A)^{-1}(I + Δ/2 A)``, ``B̄ = (I - Δ/2 A)^{-1} Δ B``.

Unrolled from ``x_{-1} = 0``, ``y_k = sum_{j <= k} C Ā^j B̄ u_{k-j}``: a causal convolution
with the kernel ``K_j = C Ā^j B̄``, which for a diagonal ``Ā`` is a Vandermonde product,
``K_j = sum_n c_n b̄_n ā_n^j`` (`ssm_kernel`; S4D, Gu et al. 2022, Section 3), applied in
``O(T log T)`` by FFT (`causal_convolution`). A real system whose complex states come in
conjugate pairs keeps one state of each pair and doubles the real part:
``K_j = 2 Re sum_n c_n b̄_n ā_n^j``.

Powers are formed as ``exp(j log ā)`` from ``log ā`` (exactly ``Δ a`` under the
zero-order hold), which stays finite where ``ā`` itself underflows to 0, and
`KERNEL_CHUNK` taps at a time (a `jax.lax.map` over chunks, rematerialized in the backward
pass), so the kernel's memory is ``O(T + KERNEL_CHUNK N)``, not ``O(T N)``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

#: `ssm_kernel` forms the powers ``ā^j`` for this many taps at a time (bounded memory).
KERNEL_CHUNK = 2048

__all__ = ["Discretized", "causal_convolution", "discretize_bilinear", "discretize_zoh",
           "ssm_kernel"]


class Discretized(NamedTuple):
    """A discretized diagonal system.

    Attributes:
        a_bar: ``ā`` (complex, the shape of ``Δ a``).
        b_bar: ``b̄`` (the shape of ``b``).
        log_a_bar: ``log ā`` (``Δ a`` for the zero-order hold), for `ssm_kernel`.
    """

    a_bar: jax.Array
    b_bar: jax.Array
    log_a_bar: jax.Array


def _expm1(z):
    """``exp(z) - 1`` for complex ``z`` without cancellation near 0:
    ``expm1(x) cos y - 2 sin^2(y/2) + i exp(x) sin y``."""
    x, y = jnp.real(z), jnp.imag(z)
    return jax.lax.complex(jnp.expm1(x) * jnp.cos(y) - 2.0 * jnp.sin(0.5 * y) ** 2,
                           jnp.exp(x) * jnp.sin(y))


def _complex(a):
    a = jnp.asarray(a)
    if jnp.iscomplexobj(a):
        return a
    return jax.lax.complex(a, jnp.zeros_like(a))


def _apply_gain(gain, b):
    b = jnp.asarray(b)
    return gain[..., None] * b if b.ndim == gain.ndim + 1 else gain * b


def discretize_zoh(a, b, dt) -> Discretized:
    """Zero-order hold of the diagonal system ``x' = diag(a) x + B u``.

        ā = exp(Δ a),   b̄ = (exp(Δ a) - 1) / a · b   (``exp(Δ a) - 1`` without cancellation)

    Args:
        a: ``(..., N)`` diagonal of ``A`` (complex or real, nonzero; ``Re a < 0`` for a
            stable system).
        b: ``B``: the shape of ``Δ a`` (one input per state) or that shape plus a trailing
            input axis (a matrix, one row per state).
        dt: step sizes ``Δ > 0``, broadcasting against ``a``.

    Returns:
        `Discretized` ``(ā, b̄, log ā = Δ a)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> d = discretize_zoh(jnp.array([-1.0 + 0j]), jnp.array([1.0 + 0j]), 0.5)
        >>> round(float(d.a_bar.real[0]), 6), round(float(d.b_bar.real[0]), 6)  # e^-.5, 1-e^-.5
        (0.606531, 0.393469)
    """
    a = _complex(a)
    z = a * jnp.asarray(dt, jnp.real(a).dtype)
    return Discretized(jnp.exp(z), _apply_gain(_expm1(z) / a, _complex(b)), z)


def discretize_bilinear(a, b, dt) -> Discretized:
    """Bilinear (Tustin) discretization of the diagonal system ``x' = diag(a) x + B u``.

        ā = (1 + Δ a / 2) / (1 - Δ a / 2),   b̄ = Δ b / (1 - Δ a / 2)

    Args:
        a: ``(..., N)`` diagonal of ``A`` (``Re a < 0`` maps into the unit disk).
        b: ``B``: the shape of ``Δ a`` or that shape plus a trailing input axis.
        dt: step sizes ``Δ > 0``, broadcasting against ``a``.

    Returns:
        `Discretized` ``(ā, b̄, log ā)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> d = discretize_bilinear(jnp.array([-1.0 + 0j]), jnp.array([1.0 + 0j]), 0.5)
        >>> round(float(d.a_bar.real[0]), 6), round(float(d.b_bar.real[0]), 6)  # .75/1.25, .5/1.25
        (0.6, 0.4)
    """
    a = _complex(a)
    half = 0.5 * a * jnp.asarray(dt, jnp.real(a).dtype)
    inv = 1.0 / (1.0 - half)
    dt_c = _complex(jnp.broadcast_to(jnp.asarray(dt, jnp.real(a).dtype), half.shape))
    a_bar = (1.0 + half) * inv
    return Discretized(a_bar, _apply_gain(dt_c * inv, _complex(b)),
                       jnp.log1p(half) - jnp.log1p(-half))


def ssm_kernel(log_a_bar, b_bar, c, length: int, *, conjugate_pairs: bool = True):
    """The convolution kernel ``K_j = C Ā^j B̄`` of a diagonal system, in closed form.

        K_j = sum_n c_n b̄_n ā_n^j,   j = 0, ..., length - 1   (Vandermonde product),

    doubled and made real (``2 Re``) for a real system whose states come in conjugate
    pairs (one of each pair kept). Elementwise over broadcast leading axes, summed over
    the last (state) axis: for per-channel (single-input single-output) systems pass
    ``(H, N)`` arrays and get ``(length, H)``; for a multi-input multi-output system with
    ``C`` ``(O, N)`` and ``B̄`` ``(N, I)`` pass ``c[:, None, :]`` and ``b_bar.T[None]``
    and get the ``(length, O, I)`` matrices ``C Ā^j B̄``.

    Args:
        log_a_bar: ``(..., N)`` ``log ā`` (`Discretized.log_a_bar`; ``jnp.log(a_bar)``
            for any other ``ā``).
        b_bar: ``b̄``, broadcasting with ``log_a_bar``.
        c: ``c``, broadcasting with ``log_a_bar``.
        length: number of kernel taps ``T``.
        conjugate_pairs: return ``2 Re K`` (default) instead of the complex sum.

    Returns:
        ``(length, ...)`` kernel (time first).

    Raises:
        ValueError: if ``length`` is not a non-negative integer.

    Examples:
        >>> import jax.numpy as jnp
        >>> k = ssm_kernel(jnp.log(jnp.array([0.5 + 0j])), jnp.ones(1), jnp.ones(1), 4,
        ...                conjugate_pairs=False)
        >>> [round(float(v), 6) for v in k.real]   # C Ā^j B̄ = 0.5^j
        [1.0, 0.5, 0.25, 0.125]
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be a non-negative integer, got {length!r}")
    log_a_bar = _complex(log_a_bar)
    cb = jnp.asarray(c) * jnp.asarray(b_bar)
    ones = (1,) * max(log_a_bar.ndim, cb.ndim)
    dtype = jnp.real(log_a_bar).dtype
    if length <= KERNEL_CHUNK:
        j = jnp.arange(length, dtype=dtype).reshape((length,) + ones)
        kernel = _vandermonde(j, log_a_bar, cb)
    else:  # chunks of taps: O(KERNEL_CHUNK * N) powers at a time, forward and backward
        num = -(-length // KERNEL_CHUNK)
        j = jnp.arange(num * KERNEL_CHUNK, dtype=dtype).reshape((num, KERNEL_CHUNK) + ones)
        kernel = jax.lax.map(lambda jc: _vandermonde(jc, log_a_bar, cb), j)
        kernel = kernel.reshape((num * KERNEL_CHUNK,) + kernel.shape[2:])[:length]
    return 2.0 * jnp.real(kernel) if conjugate_pairs else kernel


@jax.checkpoint
def _vandermonde(j, log_a_bar, cb):
    """``sum_n cb_n exp(j log ā_n)`` over the last axis. Rematerialized: the backward pass
    recomputes the powers instead of storing them."""
    return jnp.sum(jnp.exp(j * log_a_bar) * cb, axis=-1)


def causal_convolution(kernel, u):
    """Causal convolution along time (the leading axis) by FFT.

        y_t = sum_{j=0}^{t} K_j u_{t-j},   t = 0, ..., T-1,

    elementwise over the broadcast trailing axes, in ``O(T log T)`` (zero-padded to a
    power of two ``>= 2T``, so there is no circular wrap-around). Real inputs use the
    real FFT; complex ones the complex FFT.

    Args:
        kernel: ``(T, ...)`` taps ``K_0, ..., K_{T-1}``.
        u: ``(T, ...)`` inputs, trailing axes broadcasting with the kernel's.

    Returns:
        ``(T, ...)`` outputs (complex if either argument is).

    Raises:
        ValueError: if the lengths differ.

    Examples:
        >>> import jax.numpy as jnp
        >>> y = causal_convolution(jnp.array([1.0, 0.5, 0.25]), jnp.array([1.0, 1.0, 1.0]))
        >>> [round(float(v), 6) for v in y]
        [1.0, 1.5, 1.75]
    """
    kernel, u = jnp.asarray(kernel), jnp.asarray(u)
    t_len = u.shape[0] if u.ndim else -1
    if kernel.ndim < 1 or kernel.shape[0] != t_len:
        raise ValueError(f"kernel and u must have the same leading (time) length, got "
                         f"{kernel.shape} and {u.shape}")
    if t_len == 0:
        return jnp.zeros(jnp.broadcast_shapes(kernel.shape, u.shape),
                         jnp.result_type(kernel, u))
    n_fft = 1 << (2 * t_len - 1).bit_length()
    if jnp.iscomplexobj(kernel) or jnp.iscomplexobj(u):
        y = jnp.fft.ifft(jnp.fft.fft(kernel, n_fft, axis=0) * jnp.fft.fft(u, n_fft, axis=0),
                         axis=0)
    else:
        y = jnp.fft.irfft(jnp.fft.rfft(kernel, n_fft, axis=0) * jnp.fft.rfft(u, n_fft, axis=0),
                          n_fft, axis=0)
    return y[:t_len]
