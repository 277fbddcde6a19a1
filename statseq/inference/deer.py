"""Parallel evaluation of nonlinear recurrences by Newton's method: DEER and quasi-DEER.

A nonlinear recurrence ``h_t = f(θ, h_{t-1}, x_t)``, ``t = 0, ..., T-1`` from a given
``h_{-1} = h0``, looks sequential, but its whole trajectory ``h_{0:T-1}`` is the root of
one system of ``T H`` equations ``r_t(h) = h_t - f(θ, h_{t-1}, x_t) = 0``. Newton's method
on that system (DEER, Lim et al. 2023; Gonzalez et al. 2024) linearizes ``f`` around the
current guess ``h^{(i)}``,

    J_t = ∂f/∂h (θ, h^{(i)}_{t-1}, x_t),
    h^{(i+1)}_t = J_t h^{(i+1)}_{t-1} + (f(θ, h^{(i)}_{t-1}, x_t) - J_t h^{(i)}_{t-1}),

and each iteration is a *linear* recurrence, solved by an associative scan in
``O(log T)`` depth: with dense ``(H, H)`` matrices ``J_t`` (**DEER**: ``O(T H^2)`` memory
and ``O(T H^3)`` work per iteration, quadratic convergence) or with their diagonals only
(**quasi-DEER**: ``O(T H)`` memory, the elementwise scan of
`statseq.inference.linear_recurrence.linear_recurrence`, linear convergence). In exact
arithmetic DEER is exact after at most ``T`` iterations (iteration ``i`` makes
``h_0, ..., h_{i-1}`` exact); on contractive cells it needs far fewer (a handful, growing
like ``log T``). Any pytree state is supported (an LSTM's ``(h, c)``, a stack of layers):
it is flattened to one vector of size ``H`` with `jax.flatten_util.ravel_pytree`.

The iteration stops when the residual ``max_t |f(θ, h_{t-1}, x_t) - h_t|`` (the defining
equation itself) is at most ``tol · max(1, max |h|)``, or after ``max_iter`` iterations, or
as soon as it stops being finite; the result says which (`DeerResult.converged`), so a
non-converged trajectory is never passed off as the answer.

**Gradients** are implicit (`jax.custom_vjp` on the converged trajectory), never
backpropagation through the Newton iterations: the adjoint of ``h_t = f(h_{t-1}, x_t)``
with cotangents ``g_t`` on ``h_t`` is the reverse linear recurrence

    λ_{T-1} = g_{T-1},    λ_t = g_t + J_{t+1}^T λ_{t+1},

after which one vectorized `jax.vjp` of ``f`` at ``(h_{t-1}, x_t)`` with cotangents
``λ_t`` gives the cotangents of ``θ`` (summed over ``t``), of every ``x_t`` and of ``h0``.
With ``method="deer"`` the adjoint is a reverse associative scan with the dense
Jacobians (``O(log T)`` depth, ``O(T H^2)`` memory, as the forward pass). With
``method="quasi-deer"`` the adjoint must still be exact (a diagonal approximation would
give a wrong gradient): on CPU a sequential reverse `jax.lax.scan` of vector-Jacobian
products ``J_{t+1}^T λ_{t+1}`` (exact, ``O(T H)`` memory like the forward pass, ``O(T)``
depth: the cost of backpropagation through time without its forward pass); on GPU/TPU
quasi-DEER's own iteration applied to that linear system (diagonal reverse associative
scans plus one vectorized VJP per sweep, ``O(T H)`` memory, ``O(log T)`` depth per sweep;
its fixed point is the exact adjoint, and the sequential scan is the fallback when the
sweeps do not converge in ``T``). ELK and
quasi-ELK (``method="elk"``, ``"quasi-elk"``, damped steps by a Kalman smoother: see
`statseq.inference.elk`) converge to the same trajectory and share DEER's and
quasi-DEER's adjoints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from statseq.inference.linear_recurrence import linear_recurrence

__all__ = ["DeerResult", "combine_affine_dense", "deer", "dense_linear_recurrence",
           "sequential"]

METHODS = ("deer", "quasi-deer", "elk", "quasi-elk")
_DENSE = ("deer", "elk")

# quasi-DEER computes each step's Jacobian diagonal from H Jacobian-vector products; the
# steps are processed in batches of about this many Jacobian entries, so that the
# (T, H, H) Jacobians are never held at once.
_DIAG_BATCH_ENTRIES = 2**24


class DeerResult(NamedTuple):
    """The result of `deer`.

    Attributes:
        states: the trajectory ``h_0, ..., h_{T-1}``: the state's pytree with a leading
            time axis ``T`` on every leaf.
        iterations: number of Newton iterations used (int32 scalar).
        residual: final residual ``max_t |f(θ, h_{t-1}, x_t) - h_t|`` (scalar).
        converged: whether the residual is finite and at most the tolerance (bool
            scalar). ``False`` means ``states`` is *not* the solution.
    """

    states: Any
    iterations: jax.Array
    residual: jax.Array
    converged: jax.Array


def combine_affine_dense(earlier, later):
    """Compose two affine maps with matrices: first ``earlier``, then ``later``.

        (A1, b1) ∘ (A2, b2) = (A2 A1, A2 b1 + b2),

    so that ``h -> A2 (A1 h + b1) + b2``. Associative; ``A`` is ``(..., H, H)`` and ``b``
    ``(..., H)`` (leading block axes as `jax.lax.associative_scan` passes them).

    Args:
        earlier: ``(A1, b1)``.
        later: ``(A2, b2)``.

    Returns:
        ``(A2 A1, A2 b1 + b2)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> a, b = combine_affine_dense((2 * jnp.eye(2), jnp.ones(2)),
        ...                             (3 * jnp.eye(2), -jnp.ones(2)))
        >>> a.diagonal().tolist(), b.tolist()  # h -> 3 (2 h + 1) - 1 = 6 h + 2
        ([6.0, 6.0], [2.0, 2.0])
    """
    a1, b1 = earlier
    a2, b2 = later
    return a2 @ a1, jnp.einsum("...ij,...j->...i", a2, b1) + b2


def dense_linear_recurrence(a, b, h0=None):
    """All states of ``h_t = A_t h_{t-1} + b_t`` by an associative scan (``O(log T)`` depth).

        h_t = A_t h_{t-1} + b_t,   t = 0, ..., T-1,   h_{-1} = h0.

    Args:
        a: ``(T, H, H)`` matrices ``A_t``.
        b: ``(T, H)`` increments ``b_t``.
        h0: ``(H,)`` initial state (default zeros).

    Returns:
        ``(T, H)`` states ``h_0, ..., h_{T-1}``.

    Raises:
        ValueError: if the shapes do not fit together.

    Examples:
        >>> import jax.numpy as jnp
        >>> a = jnp.broadcast_to(jnp.array([[0.0, 1.0], [1.0, 0.0]]), (3, 2, 2))
        >>> dense_linear_recurrence(a, jnp.ones((3, 2)), jnp.array([1.0, 0.0])).tolist()
        [[1.0, 2.0], [3.0, 2.0], [3.0, 4.0]]
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    if b.ndim != 2 or a.shape != b.shape + b.shape[-1:]:
        raise ValueError(f"a must be (T, H, H) and b (T, H), got {a.shape} and {b.shape}")
    if h0 is not None:
        h0 = jnp.asarray(h0)
        if h0.shape != b.shape[1:]:
            raise ValueError(f"h0 must have shape {b.shape[1:]}, got {h0.shape}")
        b = b.at[0].add(a[0] @ h0)
    if b.shape[0] == 0:
        return b
    return jax.lax.associative_scan(combine_affine_dense, (a, b))[1]


def sequential(step: Callable, params, h0, xs):
    """The reference: the trajectory of ``h_t = step(params, h_{t-1}, x_t)`` by `lax.scan`.

    Args:
        step: ``step(params, h, x_t) -> h`` (``h`` any pytree, of fixed structure).
        params: parameters (any pytree), passed unchanged to every step.
        h0: the initial state ``h_{-1}``.
        xs: inputs, a pytree whose leaves have a leading time axis ``T``.

    Returns:
        The states ``h_0, ..., h_{T-1}``: ``h0``'s pytree with a leading axis ``T``.

    Examples:
        >>> import jax.numpy as jnp
        >>> hs = sequential(lambda a, h, x: a * h + x, 0.5, jnp.array(4.0),
        ...                 jnp.array([1.0, 0.0, 2.0]))
        >>> hs.tolist()
        [3.0, 1.5, 2.75]
    """
    def body(h, x):
        h = step(params, h, x)
        return h, h

    return jax.lax.scan(body, h0, xs)[1]


def _default_tol(dtype) -> float:
    """Relative residual tolerance: about 4500 ulps in float64, 80 in float32.

    Newton's last step typically squares the residual, so the error of a converged DEER
    trajectory is far below this; quasi-DEER converges linearly, and its error is about
    the residual divided by ``1 - ρ`` (``ρ`` the contraction of the cell).
    """
    return 1e-12 if jnp.finfo(dtype).bits >= 64 else 1e-5


def _check(step, params, h0, xs, method, tol, max_iter, damping):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    leaves = jax.tree_util.tree_leaves(xs)
    if not leaves:
        raise ValueError("xs must have at least one array leaf (with a leading time axis)")
    lengths = {np.shape(v)[0] if np.ndim(v) else None for v in leaves}
    if None in lengths or len(lengths) != 1:
        raise ValueError("every leaf of xs must have the same leading time axis, got "
                         f"shapes {[np.shape(v) for v in leaves]}")
    if max_iter is not None and (isinstance(max_iter, bool)
                                 or not isinstance(max_iter, (int, np.integer))
                                 or max_iter < 0):
        raise ValueError(f"max_iter must be a non-negative integer, got {max_iter!r}")
    if tol is not None and not (np.isscalar(tol) and float(tol) > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    if not (np.isscalar(damping) and float(damping) > 0):
        raise ValueError(f"damping must be a positive number, got {damping!r}")
    h_leaves = jax.tree_util.tree_leaves(h0)
    if not h_leaves or not all(jnp.issubdtype(jnp.result_type(v), jnp.floating)
                               for v in h_leaves):
        raise TypeError("h0 must be a pytree of floating-point arrays")
    x0 = jax.tree_util.tree_map(lambda v: jax.ShapeDtypeStruct(np.shape(v)[1:],
                                                               jnp.result_type(v)), xs)
    out = jax.eval_shape(lambda p, h, x: step(p, h, x), params, h0, x0)
    want = jax.eval_shape(lambda h: h, h0)
    if (jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(want)
            or any(o.shape != w.shape for o, w in zip(jax.tree_util.tree_leaves(out),
                                                       jax.tree_util.tree_leaves(want),
                                                       strict=True))):
        raise ValueError("step(params, h0, x_t) must return a state of h0's structure and "
                         f"shapes: got {out} for h0 {want}")
    return int(lengths.pop())


def _jacobians(f, params, prev, xs, method):
    """Per-step Jacobians ``∂f/∂h`` at ``(prev_t, x_t)``: ``(T, H, H)`` or diagonals."""
    jac = jax.jacfwd(f, argnums=1)
    if method in _DENSE:
        return jax.vmap(jac, (None, 0, 0))(params, prev, xs)
    num_t, hid = prev.shape
    batch = int(max(1, min(num_t, _DIAG_BATCH_ENTRIES // (hid * hid))))
    return jax.lax.map(lambda a: jnp.diagonal(jac(params, *a)), (prev, xs),
                       batch_size=batch)


def _newton(f, params, h0, xs, init, method, tol, max_iter):
    """The Newton iteration on the flat trajectory ``(T, H)``."""
    fs_all = jax.vmap(f, (None, 0, 0))

    def prev_of(hs):
        return jnp.concatenate([h0[None], hs[:-1]], axis=0)

    def residual(hs):
        r = jnp.max(jnp.abs(fs_all(params, prev_of(hs), xs) - hs))
        scale = jnp.maximum(1.0, jnp.max(jnp.abs(hs)))
        return r, r <= tol * scale

    def cond(carry):
        i, _, r, ok = carry
        return (i < max_iter) & ~ok & jnp.isfinite(r)

    def body(carry):
        i, hs, _, _ = carry
        prev = prev_of(hs)
        fs = fs_all(params, prev, xs)
        jacs = _jacobians(f, params, prev, xs, method)
        if method == "deer":
            b = fs - jnp.einsum("tij,tj->ti", jacs, prev)
            hs = dense_linear_recurrence(jacs, b, h0)
        else:
            hs = linear_recurrence(jacs, fs - jacs * prev, h0, parallel=True)
        r, ok = residual(hs)
        return i + 1, hs, r, ok

    r, ok = residual(init)
    i, hs, r, ok = jax.lax.while_loop(cond, body, (jnp.int32(0), init, r, ok))
    ok = ok & jnp.isfinite(r) & jnp.all(jnp.isfinite(hs))
    return hs, i, r, ok


def _no_iteration(f, params, h0, xs, init, tol):
    """What `_newton` and `_levenberg_marquardt` return with ``max_iter = 0``: the guess,
    its residual and whether it satisfies the tolerance, without compiling a loop."""
    prev = jnp.concatenate([h0[None], init[:-1]], axis=0)
    r = jnp.max(jnp.abs(jax.vmap(f, (None, 0, 0))(params, prev, xs) - init))
    ok = (r <= tol * jnp.maximum(1.0, jnp.max(jnp.abs(init)))) & jnp.isfinite(r)
    return init, jnp.int32(0), r, ok & jnp.all(jnp.isfinite(init))


def _levenberg_marquardt(f, params, h0, xs, init, method, tol, max_iter, damping):
    """ELK / quasi-ELK: damped Newton steps by a Kalman smoother, adaptive damping."""
    from statseq.inference.elk import elk_step, lm_update

    fs_all = jax.vmap(f, (None, 0, 0))

    def prev_of(hs):
        return jnp.concatenate([h0[None], hs[:-1]], axis=0)

    def measure(hs):
        r = fs_all(params, prev_of(hs), xs) - hs
        merit = jnp.sum(r * r)
        rmax = jnp.max(jnp.abs(r))
        ok = rmax <= tol * jnp.maximum(1.0, jnp.max(jnp.abs(hs)))
        return merit, rmax, ok

    def cond(carry):
        i, _, _, r, ok, _ = carry
        return (i < max_iter) & ~ok & jnp.isfinite(r)

    def body(carry):
        i, hs, merit, r, ok, lam = carry
        prev = prev_of(hs)
        fs = fs_all(params, prev, xs)
        jacs = _jacobians(f, params, prev, xs, method)
        cand = elk_step(jacs, fs, prev, hs, lam, diagonal=method == "quasi-elk")
        merit_c, r_c, ok_c = measure(cand)
        accept = jnp.isfinite(merit_c) & (merit_c < merit)
        pick = lambda a, b: jnp.where(accept, a, b)  # noqa: E731
        return (i + 1, pick(cand, hs), pick(merit_c, merit), pick(r_c, r),
                pick(ok_c, ok), lm_update(lam, accept))

    merit, r, ok = measure(init)
    lam = jnp.asarray(damping, h0.dtype)
    i, hs, _, r, ok, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), init, merit, r, ok,
                                                         lam))
    ok = ok & jnp.isfinite(r) & jnp.all(jnp.isfinite(hs))
    return hs, i, r, ok


def _quasi_adjoint_parallel_enabled() -> bool:
    """Whether quasi-DEER's adjoint is solved by parallel sweeps (GPU/TPU) or by a
    sequential reverse scan (CPU, where the scan is cheaper): `use_parallel`'s rule."""
    from statseq.inference._backend import use_parallel

    return use_parallel(None)


def _quasi_adjoint_sequential(f, params, hs, x_next, g):
    """λ_{T-1} = g_{T-1}, λ_t = g_t + J_{t+1}^T λ_{t+1}: a reverse `lax.scan` of VJPs."""
    def body(lam_next, inp):
        g_t, h_t, x = inp
        lam = g_t + jax.vjp(lambda h: f(params, h, x), h_t)[1](lam_next)[0]
        return lam, lam

    lam_last = g[-1]
    _, lam = jax.lax.scan(body, lam_last, (g[:-1], hs[:-1], x_next), reverse=True)
    return jnp.concatenate([lam, lam_last[None]], axis=0)


def _quasi_adjoint_parallel(f, params, hs, x_next, g):
    """The same adjoint by quasi-DEER's own iteration on the (linear) adjoint system.

    With ``D_t`` the diagonal of ``J_t``, each sweep solves
    ``λ^{(k+1)}_t = g_t + D_{t+1} λ^{(k+1)}_{t+1} + (J_{t+1}^T - D_{t+1}) λ^{(k)}_{t+1}``:
    one vectorized VJP over all steps and one diagonal reverse associative scan, so
    ``O(T H)`` memory and ``O(log T)`` depth per sweep. Its fixed point is the exact
    adjoint; sweep ``k`` makes ``λ_{T-k}, ..., λ_{T-1}`` exact (so at most ``T`` sweeps
    in exact arithmetic), and on contractive cells the error shrinks geometrically.
    Stops when a sweep changes ``λ`` by at most quasi-DEER's tolerance relative to
    ``max(1, max |λ|)``; returns ``(λ, converged)`` (the caller falls back to the
    sequential adjoint when not converged).
    """
    num_t, hid = hs.shape
    prev = hs[:-1]
    diag = _jacobians(f, params, prev, x_next, "quasi-deer")  # D_{t+1}, t = 0..T-2
    vjps = jax.vmap(lambda h, x, lam: jax.vjp(lambda h: f(params, h, x), h)[1](lam)[0])
    a = jnp.concatenate([jnp.zeros((1, hid), hs.dtype), diag[::-1]], axis=0)
    tol = _default_tol(hs.dtype)

    def sweep(lam):
        off = vjps(prev, x_next, lam[1:]) - diag * lam[1:]
        b = jnp.concatenate([g[-1:], (g[:-1] + off)[::-1]], axis=0)
        return linear_recurrence(a, b, jnp.zeros(hid, hs.dtype), parallel=True)[::-1]

    def cond(carry):
        i, _, change, ok = carry
        return (i < num_t) & ~ok & jnp.isfinite(change)

    def body(carry):
        i, lam, _, _ = carry
        new = sweep(lam)
        change = jnp.max(jnp.abs(new - lam))
        return i + 1, new, change, change <= tol * jnp.maximum(1.0, jnp.max(jnp.abs(new)))

    big = jnp.asarray(jnp.finfo(hs.dtype).max, hs.dtype)
    init = (jnp.int32(0), g, big, jnp.bool_(False))
    _, lam, change, ok = jax.lax.while_loop(cond, body, init)
    return lam, ok & jnp.isfinite(change) & jnp.all(jnp.isfinite(lam))


def _adjoint(f, params, h0, xs, hs, g, method):
    """Cotangents of ``(params, h0, xs)`` from cotangents ``g`` ``(T, H)`` on ``hs``."""
    prev = jnp.concatenate([h0[None], hs[:-1]], axis=0)
    if method in _DENSE:
        # λ_t = g_t + J_{t+1}^T λ_{t+1}: a forward recurrence in reversed time.
        jt = jnp.swapaxes(jax.vmap(jax.jacfwd(f, argnums=1), (None, 0, 0))(
            params, prev[1:], jax.tree_util.tree_map(lambda v: v[1:], xs)), 1, 2)
        a = jnp.concatenate([jnp.zeros((1,) + jt.shape[1:], jt.dtype), jt[::-1]], axis=0)
        lam = dense_linear_recurrence(a, g[::-1])[::-1]
    else:
        x_next = jax.tree_util.tree_map(lambda v: v[1:], xs)

        def sequential_adjoint():
            return _quasi_adjoint_sequential(f, params, hs, x_next, g)

        if _quasi_adjoint_parallel_enabled() and hs.shape[0] > 1:
            lam, ok = _quasi_adjoint_parallel(f, params, hs, x_next, g)
            lam = jax.lax.cond(ok, lambda: lam, sequential_adjoint)
        else:
            lam = sequential_adjoint()
    _, vjp = jax.vjp(lambda p, hp, x: jax.vmap(f, (None, 0, 0))(p, hp, x), params, prev, xs)
    dparams, dprev, dxs = vjp(lam)
    return dparams, dprev[0], dxs


def deer(step: Callable, params, h0, xs, *, method: str = "deer", init=None,
         tol: float | None = None, max_iter: int | None = None,
         damping: float = 1.0) -> DeerResult:
    """The trajectory of ``h_t = step(params, h_{t-1}, x_t)`` by parallel Newton iterations.

        h_t = f(θ, h_{t-1}, x_t),   t = 0, ..., T-1,   h_{-1} = h0;
        Newton: h^{(i+1)}_t = J_t h^{(i+1)}_{t-1} + f(θ, h^{(i)}_{t-1}, x_t) - J_t h^{(i)}_{t-1},

    with ``J_t = ∂f/∂h`` at ``(h^{(i)}_{t-1}, x_t)`` (dense for ``"deer"``, its diagonal
    for ``"quasi-deer"``), each linear recurrence solved by an associative scan. The whole
    solver is one `jax.lax.while_loop` (it jits, vmaps over a batch of sequences, and
    differentiates implicitly: see the module docstring). `sequential` is the reference.

    Args:
        step: ``step(params, h, x_t) -> h``, differentiable in ``h``, ``params`` and
            ``x_t``; ``h`` any pytree of float arrays (e.g. an LSTM's ``(h, c)``),
            flattened internally to a vector of size ``H``.
        params: parameters (any pytree), passed unchanged to every step.
        h0: initial state ``h_{-1}``.
        xs: inputs: a pytree whose leaves have a common leading time axis ``T``.
        method: ``"deer"`` (dense Jacobians, ``O(T H^2)`` memory, quadratic convergence,
            at most ``T`` iterations in exact arithmetic), ``"quasi-deer"`` (diagonal
            Jacobians, ``O(T H)`` memory, linear convergence), or their damped versions
            ``"elk"`` / ``"quasi-elk"`` (Levenberg-Marquardt steps by a parallel Kalman
            smoother, `statseq.inference.elk`: the merit ``Σ_t |r_t|^2`` never increases,
            so they stay finite where DEER overflows; each iteration costs a smoother).
        init: initial guess for the trajectory (``h0``'s pytree with a leading axis
            ``T``), e.g. the previous solution when parameters change a little during
            training; default zeros. Not differentiated.
        tol: stop when ``max_t |f(θ, h_{t-1}, x_t) - h_t| <= tol · max(1, max |h|)``;
            default ``1e-12`` in float64, ``1e-5`` in float32.
        max_iter: maximum number of Newton iterations (default ``T``, DEER's worst case;
            set it lower for quasi-DEER or in float32, where the residual can stall at
            rounding level above ``tol``; on GPUs float32 matmuls default to TF32, whose
            ``1e-3`` relative error stalls it far above ``1e-5``: run under
            ``jax.default_matmul_precision("highest")`` or loosen ``tol``). For ELK a
            rejected step counts as an iteration. ``0`` only checks ``init`` (its
            residual and the tolerance; no loop is compiled).
        damping: initial Levenberg-Marquardt damping ``λ`` of ELK / quasi-ELK (divided by
            10 after each accepted step, multiplied by 10 after a rejected one); unused by
            DEER.

    Returns:
        `DeerResult` ``(states, iterations, residual, converged)``.

    Raises:
        ValueError: for an unknown ``method``, a bad ``tol``/``max_iter``/``damping``,
            inputs without a common time axis, or a ``step`` whose output does not match
            ``h0``.
        TypeError: if ``step`` is not callable or ``h0`` is not floating point.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> def step(w, h, x):
        ...     return jnp.tanh(w * h + x)
        >>> xs = jnp.sin(jnp.arange(100.0))
        >>> res = jax.jit(lambda w, h0, xs: deer(step, w, h0, xs))(0.5, jnp.array(0.0), xs)
        >>> bool(res.converged), int(res.iterations) < 10
        (True, True)
        >>> bool(jnp.allclose(res.states, sequential(step, 0.5, jnp.array(0.0), xs)))
        True
    """
    num_t = _check(step, params, h0, xs, method, tol, max_iter, damping)
    h0_flat, unravel = ravel_pytree(h0)
    dtype = h0_flat.dtype
    tol = _default_tol(dtype) if tol is None else float(tol)
    max_iter = num_t if max_iter is None else int(max_iter)

    def f(p, h, x):
        out, _ = ravel_pytree(step(p, unravel(h), x))
        return out.astype(dtype)

    if init is None:
        init_flat = jnp.zeros((num_t, h0_flat.size), dtype)
    else:
        init_flat = jax.vmap(lambda h: ravel_pytree(h)[0])(init).astype(dtype)
        if init_flat.shape != (num_t, h0_flat.size):
            raise ValueError(f"init must be h0's pytree with a leading axis {num_t}, got "
                             f"flat shape {init_flat.shape}")
    if num_t == 0:
        states = jax.vmap(unravel)(init_flat)
        zero = jnp.zeros((), dtype)
        return DeerResult(states, jnp.int32(0), zero, jnp.bool_(True))

    # The Newton iteration runs on stopped gradients; the converged trajectory then
    # passes through an identity whose vjp is the implicit (adjoint) one.
    stop = jax.lax.stop_gradient
    solver_args = (f, stop(params), stop(h0_flat), stop(xs), stop(init_flat), method, tol,
                   max_iter)
    if max_iter == 0:  # no loop to compile (the models rebuild a solution this way)
        hs, iters, r, ok = _no_iteration(*solver_args[:5], tol)
    elif method in ("elk", "quasi-elk"):
        hs, iters, r, ok = _levenberg_marquardt(*solver_args, damping)
    else:
        hs, iters, r, ok = _newton(*solver_args)

    @jax.custom_vjp
    def implicit(p, h0_flat, xs, hs):
        return hs

    def implicit_fwd(p, h0_flat, xs, hs):
        return hs, (p, h0_flat, xs, hs)

    def implicit_bwd(res, g):
        p, h0_flat, xs, hs = res
        dp, dh0, dxs = _adjoint(f, p, h0_flat, xs, hs, g, method)
        return dp, dh0, dxs, jnp.zeros_like(hs)

    implicit.defvjp(implicit_fwd, implicit_bwd)
    hs = implicit(params, h0_flat, xs, hs)
    return DeerResult(jax.vmap(unravel)(hs), iters, r, ok)
