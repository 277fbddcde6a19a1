"""Diagonal linear recurrences, sequentially or in parallel (`jax.lax.associative_scan`).

The elementwise (diagonal) first-order linear recurrence

    h_t = a_t * h_{t-1} + b_t,        t = 0, ..., T-1,   h_{-1} = h0,

with ``a_t``, ``b_t`` and ``h_t`` of any common trailing shape, real or complex, is the
core of linear recurrent layers: the selective state space (S6) layer of Mamba
(``a_t = exp(Δ_t A)`` input-dependent) and the linear recurrent unit (LRU, ``a_t = λ``
constant). Time is the leading axis.

Each step is the affine map ``h -> a_t h + b_t``; composing two maps (first ``(a1, b1)``,
then ``(a2, b2)``) gives another one,

    (a1, b1) ∘ (a2, b2) = (a1 a2, a2 b1 + b2),

which is associative, so all prefixes ``h_0, ..., h_{T-1}`` are computed by
`jax.lax.associative_scan` in ``O(log T)`` depth and ``O(T)`` work (Blelloch 1990;
Martin and Cundy 2018). The initial state is folded into the first element
(``b_0 <- a_0 h0 + b_0``). The sequential form is a loop that writes each state over
a buffer holding ``b`` in place (a `jax.lax.fori_loop` with ``dynamic_update_slice``,
the buffer made by one elementwise pass over ``b`` that also takes the first step: no
zero-filled stacked output; on CPU at ``T = 10^3`` about 1.1 times faster than a
`jax.lax.scan` stacking its states where ``b`` is an argument of the jitted function, 1.4
to 1.7 times where ``b`` is computed in it, ``benchmarks/bench_scan.py``), differentiated
through the tangent recursion run as a `jax.lax.scan` (`jax.custom_jvp`). Both forms
are differentiable (forward and reverse mode) and give the same numbers up to rounding (a
test checks ``1e-12`` in float64, including ``|a|`` close to one and complex ``a``; the
loop equals the stacking scan bit for bit).

`selective_scan` is Mamba's input-dependent instance with a readout,
``y_t = C_t h_t``; its sequential form never stores the ``(T, E, N)`` states (about five
times faster than materializing them on CPU) and keeps the state as ``(N, E)`` so that the
vector work runs along the channels; its parallel form is `linear_recurrence`.

``parallel=None`` chooses by backend (`statseq.inference._backend.use_parallel`):
sequential on CPU, where the associative scan does about twice the arithmetic for no gain
on two cores, parallel on GPU/TPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from statseq.inference._backend import use_parallel

__all__ = ["combine_affine", "linear_recurrence", "selective_scan"]


def combine_affine(earlier, later):
    """Compose two diagonal affine maps: first ``earlier``, then ``later``.

        (a1, b1) ∘ (a2, b2) = (a1 a2, a2 b1 + b2),

    so that ``h -> a2 (a1 h + b1) + b2``. Associative, elementwise over any shape (and
    over a leading block axis, as `jax.lax.associative_scan` calls it).

    Args:
        earlier: ``(a1, b1)``, two arrays of one shape.
        later: ``(a2, b2)``, two arrays of that shape.

    Returns:
        ``(a1 a2, a2 b1 + b2)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> a, b = combine_affine((jnp.array(2.0), jnp.array(1.0)),
        ...                       (jnp.array(3.0), jnp.array(-1.0)))
        >>> float(a), float(b)  # h -> 3 (2 h + 1) - 1 = 6 h + 2
        (6.0, 2.0)
    """
    a1, b1 = earlier
    a2, b2 = later
    return a1 * a2, a2 * b1 + b2


def _sequential_scan(a, b, h0):
    """`jax.lax.scan` over the state flattened to one vector: XLA vectorizes along the
    minor axis, and a short one (``N = 16`` states in ``(E, N)``) made the loop about 1.4
    times slower on CPU than the flat ``(E N,)`` vector. The tangent (and, transposed, the
    gradient) of `_sequential`: its reverse mode carries one state, not the output."""
    shape, num_t = b.shape, b.shape[0]
    b, h0 = b.reshape(num_t, -1), h0.reshape(-1)
    if a.ndim < len(shape):  # one multiplier for every step: never broadcast over time
        a = a.reshape(-1)

        def body_const(h, b_t):
            h = a * h + b_t
            return h, h

        return jax.lax.scan(body_const, h0, b)[1].reshape(shape)

    def body(h, ab):
        a_t, b_t = ab
        h = a_t * h + b_t
        return h, h

    return jax.lax.scan(body, h0, (a.reshape(num_t, -1), b))[1].reshape(shape)


def _sequential_in_place(a, b, h0):
    """The recursion written over a buffer holding ``b``, one row per step:

        out <- b with out[0] <- a_0 h0 + b_0;   h <- out[0];
        h <- a_t h + out[t],  out[t] <- h,   t = 1, ..., T-1,

    a `jax.lax.fori_loop` carrying the state and the ``(T, D)`` output, which is updated
    in place (``dynamic_update_slice``, no copy: the compiled loop reads one row of ``a``
    and of ``out`` and writes one). A `jax.lax.scan` stacking its outputs first fills a
    ``(T, D)`` buffer with zeros (an operation XLA's CPU runtime splits over two threads,
    which costs a hand-off between threads on every call) and then copies each state
    into it. Here the output starts as one elementwise pass over ``b`` that also takes
    the first step, ``where(t == 0, a_0 h0 + b, b)``: where ``b`` is an argument of the
    jitted function this loop fusion replaces the plain copy of ``b`` that XLA would
    otherwise insert before the loop (a fusion XLA:CPU splits over its threads; 0.73 to
    0.94 of the time of the copy-then-loop form at D = 2048 float32, T = 10^3, and 0.92
    to 1.09 at T = 10^4, where both are memory-bound; ``benchmarks/RESULTS.md``, "Session
    22"), and where ``b`` is computed in the jitted
    function and not used afterwards (e.g. an LRU's ``B u_t``) its producer fuses into
    the pass, so ``b`` is never stored separately. The first step computed in the
    pass (``a_0 h0 + b_0`` on every row, kept on row 0 only) and every later step do
    the same arithmetic in the same order as `_sequential_scan` (bit for bit).
    """
    shape, num_t = b.shape, b.shape[0]
    out, h0 = b.reshape(num_t, -1), h0.reshape(1, -1)
    constant = a.ndim < len(shape)
    a = a.reshape(1, -1) if constant else a.reshape(num_t, -1)
    first_row = jax.lax.broadcasted_iota(jnp.int32, out.shape, 0) == 0
    out = jnp.where(first_row, a[:1] * h0 + out, out)

    def row(x, t):  # t in [1, T): no index normalization in the loop
        return jax.lax.dynamic_slice_in_dim(x, t, 1, allow_negative_indices=False)

    def body(t, carry):
        h, out = carry
        h = (a if constant else row(a, t)) * h + row(out, t)
        return h, jax.lax.dynamic_update_slice_in_dim(out, h, t, 0,
                                                      allow_negative_indices=False)

    return jax.lax.fori_loop(1, num_t, body, (out[:1], out))[1].reshape(shape)


@jax.custom_jvp
def _sequential(a, b, h0):
    """All states by the in-place loop (`_sequential_in_place`); derivatives by the
    tangent recursion ``dh_t = a_t dh_{t-1} + (da_t h_{t-1} + db_t)`` run as a
    `jax.lax.scan` (`_sequential_scan`), which JAX transposes into the reverse-time
    recursion for gradients (differentiating the in-place loop itself would transpose
    each row read into a full-size update)."""
    return _sequential_in_place(a, b, h0)


@_sequential.defjvp
def _sequential_jvp(primals, tangents):
    a, b, h0 = primals
    da, db, dh0 = tangents
    h = _sequential(a, b, h0)
    h_prev = jnp.concatenate([h0[None], h[:-1]])
    return h, _sequential_scan(a, da * h_prev + db, dh0)


def _parallel(a, b, h0, scan=jax.lax.associative_scan):
    """All states by ``scan`` (`jax.lax.associative_scan` or the time-sharded scan of
    `statseq.distributed.time`) over the maps ``(a_t, b_t)``, ``h0`` folded into ``b_0``."""
    b = b.at[0].add(a[0] * h0)
    return scan(combine_affine, (a, b))[1]


def _prepare(a, b, h0):
    """Checked ``(a, b, h0)`` in one dtype, and whether ``a`` is one multiplier for all steps."""
    b = jnp.asarray(b)
    a = jnp.asarray(a)
    if b.ndim < 1:
        raise ValueError(f"b must have a leading time axis, got shape {b.shape}")
    state_shape = b.shape[1:]
    constant = a.shape == state_shape and a.shape != b.shape
    if a.shape != b.shape and not constant:
        raise ValueError(
            f"a must have the shape of b {b.shape} (or of one state {state_shape}), "
            f"got {a.shape}"
        )
    dtype = jnp.result_type(a, b) if h0 is None else jnp.result_type(a, b, h0)
    if h0 is None:
        h0 = jnp.zeros(state_shape, dtype)
    h0 = jnp.asarray(h0)
    if h0.shape != state_shape:
        raise ValueError(f"h0 must have shape {state_shape}, got {h0.shape}")
    return a.astype(dtype), b.astype(dtype), h0.astype(dtype)


def linear_recurrence(a, b, h0=None, *, parallel: bool | None = None):
    """All states of the diagonal linear recurrence ``h_t = a_t * h_{t-1} + b_t``.

        h_t = a_t * h_{t-1} + b_t,   t = 0, ..., T-1,   h_{-1} = h0   (elementwise).

    Args:
        a: ``(T, *shape)`` multipliers, real or complex (or ``shape``: one multiplier
            for every step, e.g. an LRU's ``λ``; the sequential form then never
            materializes it over time, the parallel form broadcasts it).
        b: ``(T, *shape)`` increments, real or complex.
        h0: ``shape`` initial state (default zeros).
        parallel: ``True`` for `jax.lax.associative_scan` (``O(log T)`` depth), ``False``
            for the sequential loop (states written in place over one elementwise
            pass over ``b``), ``None`` to choose by backend (sequential on CPU).

    Returns:
        ``(T, *shape)`` states ``h_0, ..., h_{T-1}``, in the common dtype of ``a``, ``b``
        and ``h0`` (complex if any is).

    Raises:
        ValueError: if the shapes of ``a``, ``b`` and ``h0`` do not match.

    Examples:
        >>> import jax.numpy as jnp
        >>> h = linear_recurrence(jnp.array([0.5, 0.5, 0.5]), jnp.array([1.0, 0.0, 2.0]),
        ...                       jnp.array(4.0), parallel=True)
        >>> [float(v) for v in h]  # 0.5*4 + 1, 0.5*3 + 0, 0.5*1.5 + 2
        [3.0, 1.5, 2.75]
    """
    a, b, h0 = _prepare(a, b, h0)
    if b.shape[0] == 0:
        return b
    if use_parallel(parallel):
        return _parallel(jnp.broadcast_to(a, b.shape), b, h0)
    return _sequential(a, b, h0)


def selective_scan(delta, x, a, b, c, h0=None, *, parallel: bool | None = None):
    """Mamba's selective scan: a diagonal linear recurrence with input-dependent terms.

        h_t[e, n] = exp(Δ_t[e] A[e, n]) h_{t-1}[e, n] + Δ_t[e] x_t[e] B_t[n],
        y_t[e] = sum_n C_t[n] h_t[e, n],

    (the simplified zero-order hold of the Mamba paper: ``Ā = exp(Δ A)``, ``B̄ = Δ B``).
    The sequential form is one `jax.lax.scan` that forms each step's multipliers and
    readout inside the loop, so the ``(T, E, N)`` states are never stored in the forward
    pass; the parallel form builds them and calls `linear_recurrence` (associative scan).

    Args:
        delta: ``(T, E)`` positive step sizes ``Δ_t``.
        x: ``(T, E)`` inputs.
        a: ``(E, N)`` diagonal state matrices ``A`` (negative real parts for stability).
        b: ``(T, N)`` input matrices ``B_t``.
        c: ``(T, N)`` output matrices ``C_t``.
        h0: ``(E, N)`` initial state (default zeros).
        parallel: ``True`` (associative scan), ``False`` (``lax.scan``) or ``None``
            (by backend).

    Returns:
        ``(y, h_last)``: outputs ``(T, E)`` and the final state ``(E, N)``.

    Raises:
        ValueError: if the shapes do not fit together.

    Examples:
        >>> import jax.numpy as jnp
        >>> y, h = selective_scan(jnp.ones((3, 1)), jnp.ones((3, 1)), jnp.zeros((1, 1)),
        ...                       jnp.ones((3, 1)), jnp.ones((3, 1)), parallel=False)
        >>> [float(v) for v in y[:, 0]]  # A = 0: a running sum of Δ x B
        [1.0, 2.0, 3.0]
    """
    delta, x, a, b, c = (jnp.asarray(v) for v in (delta, x, a, b, c))
    if a.ndim != 2:
        raise ValueError(f"a must have shape (E, N), got {a.shape}")
    (e, n), t_len = a.shape, delta.shape[0] if delta.ndim else -1
    for name, v, shape in (("delta", delta, (t_len, e)), ("x", x, (t_len, e)),
                           ("b", b, (t_len, n)), ("c", c, (t_len, n))):
        if v.shape != shape:
            raise ValueError(f"{name} must have shape {shape} (T, E = {e}, N = {n}), "
                             f"got {v.shape}")
    dtype = jnp.result_type(delta, x, a, b, c)
    h0 = jnp.zeros((e, n), dtype) if h0 is None else jnp.asarray(h0, dtype)
    if h0.shape != (e, n):
        raise ValueError(f"h0 must have shape {(e, n)}, got {h0.shape}")
    if use_parallel(parallel):
        a_bar = jnp.exp(delta[:, :, None] * a)
        bx = (delta * x)[:, :, None] * b[:, None, :]
        hs = linear_recurrence(a_bar, bx, h0, parallel=True)
        h_last = hs[-1] if t_len else h0
        return jnp.einsum("ten,tn->te", hs, c).astype(dtype), h_last

    # state-major layout (N, E): every elementwise operation and the readout's sum over
    # states run along the E channels (vectors of E, no horizontal sums over N); about
    # 2.5 times faster than (E, N) on CPU at E = 128, N = 16
    a_t = a.T

    def body(h, xs):
        d_t, x_t, b_t, c_t = xs
        h = jnp.exp(a_t * d_t) * h + b_t[:, None] * (d_t * x_t)
        return h, jnp.sum(h * c_t[:, None], axis=0)

    h_last, y = jax.lax.scan(body, h0.T, (delta, x, b, c))
    return y.astype(dtype), h_last.T
