"""HiPPO matrices and the diagonal initializations of S4D and S5 (NumPy, float64).

**HiPPO-LegS** (Gu, Dao, Ermon, Rudra and Ré 2020, *HiPPO: recurrent memory with optimal
polynomial projections*, Theorem 2). The coefficients ``c(t)`` of the projection of a
signal's history ``f(s), s <= t`` onto the Legendre polynomials scaled to ``[0, t]``
(uniform measure) follow the ODE ``c'(t) = (1/t) (A c(t) + B f(t))`` with

    A_{nk} = -sqrt(2n+1) sqrt(2k+1)   (n > k),    -(n+1)   (n = k),    0   (n < k),
    B_n = sqrt(2n+1),                  n, k = 0, ..., N-1.

**Normal plus low rank** (Gu, Goel and Ré 2022, *Efficiently modeling long sequences with
structured state spaces*, S4, Section 3): ``A = A_N - P P^T`` with ``P_n = sqrt(n + 1/2)``
and the normal part

    (A_N)_{nk} = -sqrt((2n+1)(2k+1)) / 2  (n > k),  -1/2  (n = k),  sqrt((2n+1)(2k+1)) / 2  (n < k),

i.e. ``A_N = -I/2 + S`` with ``S`` real skew-symmetric (HiPPO-N). Its eigenvalues are
``-1/2 + i w`` (``i w`` the eigenvalues of ``S``, in conjugate pairs) and its eigenvectors
are unitary: S5 (Smith, Warrington and Linderman 2023, *Simplified state space layers for
sequence modeling*, Section 4.3) initializes its diagonal state matrix with them.

**S4D** (Gu, Gupta, Goel and Ré 2022, *On the parameterization and initialization of
diagonal state space models*, Section 4): for a state of size ``N`` kept as ``N/2``
conjugate pairs, ``n = 0, ..., N/2 - 1``,

    S4D-Lin:   A_n = -1/2 + i π n,
    S4D-Inv:   A_n = -1/2 + i (N/π) (N/(2n+1) - 1),
    S4D-LegS:  the eigenvalues of HiPPO-N with positive imaginary part.

These are initialization-time constants, computed in NumPy float64 (the eigenvectors by
`numpy.linalg.eigh` of the Hermitian ``-i S``, which is accurate and gives an exactly
unitary basis).
"""

from __future__ import annotations

import numpy as np

__all__ = ["hippo_legs", "hippo_legs_nplr", "hippo_n_eig", "s4d_init"]

#: Names of the diagonal initializations `s4d_init` knows.
S4D_INITS = ("inv", "lin", "legs")


def _check_size(n, name: str = "n", even: bool = False) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    if even and n % 2:
        raise ValueError(f"{name} must be even (conjugate pairs), got {n}")
    return int(n)


def hippo_legs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The HiPPO-LegS state matrix ``A`` ``(n, n)`` and input vector ``B`` ``(n,)``.

        A_{nk} = -sqrt((2n+1)(2k+1)) (n > k),  -(n+1) (n = k),  0 (n < k);   B_n = sqrt(2n+1).

    Args:
        n: state size ``N``.

    Returns:
        ``(A, B)`` as float64 NumPy arrays.

    Raises:
        ValueError: if ``n`` is not a positive integer.

    Examples:
        >>> a, b = hippo_legs(3)
        >>> a.round(3).tolist(), b.round(3).tolist()
        ([[-1.0, 0.0, 0.0], [-1.732, -2.0, 0.0], [-2.236, -3.873, -3.0]], [1.0, 1.732, 2.236])
    """
    n = _check_size(n)
    q = np.sqrt(2.0 * np.arange(n) + 1.0)
    a = np.tril(-np.outer(q, q), -1) - np.diag(np.arange(n) + 1.0)
    return a, q.copy()


def hippo_legs_nplr(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HiPPO-LegS as normal plus low rank: ``A = A_N - P P^T``.

    ``A_N = -I/2 + S`` with ``S`` skew-symmetric (module docstring) and ``P_n = sqrt(n + 1/2)``.

    Args:
        n: state size ``N``.

    Returns:
        ``(A_N, P, B)``: the normal part ``(n, n)``, the low-rank vector ``(n,)`` and
        ``B`` ``(n,)`` of `hippo_legs`.

    Examples:
        >>> import numpy as np
        >>> a_n, p, b = hippo_legs_nplr(4)
        >>> bool(np.allclose(a_n - np.outer(p, p), hippo_legs(4)[0]))
        True
        >>> bool(np.allclose(a_n + a_n.T, -np.eye(4)))     # -I/2 + skew-symmetric
        True
    """
    n = _check_size(n)
    q = np.sqrt(2.0 * np.arange(n) + 1.0)
    s = 0.5 * (np.triu(np.outer(q, q), 1) - np.tril(np.outer(q, q), -1))
    return s - 0.5 * np.eye(n), np.sqrt(np.arange(n) + 0.5), q.copy()


def hippo_n_eig(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues and eigenvectors of HiPPO-N, the normal part ``A_N = -I/2 + S``.

    ``-i S`` is Hermitian: `numpy.linalg.eigh` gives real ``w`` (ascending) and a unitary
    ``V``, so ``A_N = V diag(-1/2 + i w) V^H``.

    Args:
        n: state size ``N``.

    Returns:
        ``(lam, V)``: complex eigenvalues ``(n,)`` (real part ``-1/2``, imaginary parts
        ascending, in conjugate pairs) and the unitary eigenvector matrix ``(n, n)``
        (column ``j`` belongs to ``lam[j]``).

    Examples:
        >>> import numpy as np
        >>> lam, v = hippo_n_eig(4)
        >>> bool(np.allclose(v @ np.diag(lam) @ v.conj().T, hippo_legs_nplr(4)[0]))
        True
        >>> bool(np.allclose(lam.real, -0.5)), bool(np.allclose(lam.imag, -lam.imag[::-1]))
        (True, True)
    """
    a_n = hippo_legs_nplr(n)[0]
    s = a_n + 0.5 * np.eye(a_n.shape[0])
    w, v = np.linalg.eigh(-1j * s)
    return -0.5 + 1j * w, v


def s4d_init(n: int, init: str = "inv") -> np.ndarray:
    """The ``N/2`` diagonal state matrix entries of S4D-Inv, S4D-Lin or S4D-LegS.

        inv:  A_n = -1/2 + i (N/π) (N/(2n+1) - 1),    lin:  A_n = -1/2 + i π n,
        legs: the HiPPO-N eigenvalues with positive imaginary part (`hippo_n_eig`),

    for ``n = 0, ..., N/2 - 1`` (Gu et al. 2022, *On the parameterization and
    initialization of diagonal state space models*, Section 4; their conjugates complete
    the real state of size ``N``).

    Args:
        n: the real state size ``N`` (even).
        init: ``"inv"``, ``"lin"`` or ``"legs"``.

    Returns:
        Complex ``(N/2,)`` array, real parts ``-1/2``; ``"legs"`` sorted by imaginary part.

    Raises:
        ValueError: for an odd or non-positive ``n`` or an unknown ``init``.

    Examples:
        >>> s4d_init(4, "lin").tolist()
        [(-0.5+0j), (-0.5+3.141592653589793j)]
        >>> s4d_init(4, "inv").imag.round(4).tolist()          # (4/π)(4/1 - 1), (4/π)(4/3 - 1)
        [3.8197, 0.4244]
    """
    n = _check_size(n, "state size", even=True)
    if init not in S4D_INITS:
        raise ValueError(f"init must be one of {S4D_INITS}, got {init!r}")
    k = np.arange(n // 2, dtype=float)
    if init == "lin":
        imag = np.pi * k
    elif init == "inv":
        imag = (n / np.pi) * (n / (2.0 * k + 1.0) - 1.0)
    else:
        return hippo_n_eig(n)[0][n // 2:]  # ascending imaginary parts: the positive half
    return -0.5 + 1j * imag
