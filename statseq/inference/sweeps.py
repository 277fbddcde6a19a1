"""Sequential recursions that forget their start, evaluated by sweeps over blocks.

Many recursions of this library forget where they started: the HMM's normalized forward
message (and its backward message normalized the same way) after a few steps of a mixing
chain, Viterbi's back-pointer chains once survivor paths merge, posterior sampling's
backward chain with shared uniforms once two paths meet. On a CPU a ``lax.scan`` over
``T`` steps pays XLA's per-iteration cost (some 40 to 600 ns) ``T`` times. `sweep_scan`
pays it about ``T / B`` times per sweep instead, for ``B`` blocks (``0.8 T^0.42`` by
default, `default_block_length`):

1. cut the time axis into ``B`` blocks of length ``L`` and run the recursion in all blocks
   at once (vectorized over blocks), each block from a guessed start (block 0 from the true
   one);
2. sweep again with every block starting from where its left neighbour ended; a block
   whose carry coincides **bit for bit**, at a chunk boundary, with the carry the previous
   sweep had there stops early (from an identical carry the same compiled step repeats the
   previous sweep's outputs exactly), so a second sweep costs only the steps it takes the
   recursion to forget (tens of steps for a mixing chain);
3. stop when a whole sweep changed no block's end: every block then started from its left
   neighbour's true end, so by induction from block 0 each output is what the sequential
   scan computes with the same step (up to XLA's rounding of the vectorized step, i.e. to
   the last bit or so).

A recursion that does not forget (a chain that never mixes) is caught by ``max_sweeps``:
if the sweeps have not converged by then, the result is recomputed by the sequential
``lax.scan``, so the output is always the sequential recursion's, never an approximation.
This is the parallel-in-time idea of DEER (`statseq.inference.deer`) for recursions that
contract: instead of Newton steps, plain fixed-point sweeps, which converge in two for the
HMM filter on ordinary data.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["SweepInfo", "default_block_length", "sweep_scan", "with_sweep_rules"]

#: steps per chunk: a block stops early only at a chunk boundary
CHUNK = 32


class SweepInfo(NamedTuple):
    """How `sweep_scan` ended: ``sweeps`` run, ``converged`` (``False``: the sequential
    scan recomputed the result)."""

    sweeps: jax.Array
    converged: jax.Array


def default_block_length(num_timesteps: int, chunk: int = CHUNK) -> int:
    """``L``: the block length for ``B = 0.8 T^0.42`` blocks, a multiple of ``chunk``; one
    that divides ``T`` if there is one within a factor 2 of ``T / B`` (no padding: the
    blocks are then a reshape of the inputs, not a copy).

    Fewer, longer blocks than ``sqrt(T)``: a later sweep costs each block the steps its
    carry takes to coincide with the previous sweep's, and past about a hundred blocks a
    wider step is no cheaper per block on XLA:CPU. Measured on the HMM filter (float64,
    2 to 16 states, `benchmarks/RESULTS.md`, "Session 21: block lengths"): the best block
    counts were 25-50 at ``T = 10^4``, 100-125 at ``10^5`` and about 250 at ``10^6``, where
    ``sqrt(T)`` blocks took up to twice as long.

    Examples:
        >>> [default_block_length(t) for t in (10**5, 10**6, 10**6 + 1)]
        [800, 4000, 3776]
    """
    blocks = max(1.0, 0.8 * num_timesteps ** 0.42)
    target = num_timesteps / blocks
    near = chunk * max(1, math.ceil(target / chunk))
    divisors = [m for m in range(chunk, int(2 * target) + 1, chunk)
                if m >= target / 2 and num_timesteps % m == 0]
    return min(divisors, key=lambda m: (abs(math.log(m / target)), m)) if divisors else near


def _same(a, b):
    """Whether two pytrees are equal bit for bit (NaN never equals: a NaN carry never stops
    a block early)."""
    leaves = [jnp.all(x == y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def sweep_scan(step, init, xs, *, block_length: int | None = None, chunk: int = CHUNK,
               max_sweeps: int = 4, reverse: bool = False, batched: bool = False,
               return_carry: bool = False):
    """``jax.lax.scan(step, init, xs)[1]`` computed by sweeps over blocks (module docstring).

    For the recursion ``c_t = f(c_{t-1}, x_t)``, ``y_t = g(c_{t-1}, x_t)`` (``step(c, x)
    -> (c_new, y)``, one sequence, unbatched: it is vmapped over the blocks), the outputs
    ``y_0 .. y_{T-1}`` of the sequential scan from ``c_{-1} = init``; ``reverse=True``
    runs from ``t = T-1`` down to 0, as ``lax.scan(..., reverse=True)``. The steps past
    ``T`` that fill the last block repeat the last ``x`` and are dropped. With
    ``batched=True``, ``init`` and ``xs`` have a leading axis of ``N`` sequences, whose
    blocks are all run at once (the first block of each from its own ``init``), with one
    convergence test and one fallback for the whole batch (under ``jax.vmap`` a
    per-sequence fallback ``cond`` would run both of its branches).

    Args:
        step: ``(carry, x_t) -> (carry, y_t)``, as for `jax.lax.scan`.
        init: the carry before the first step (a pytree of arrays).
        xs: the per-step inputs, leading axis ``T`` (a pytree of arrays).
        block_length: ``L`` (a multiple of ``chunk``); default `default_block_length`.
        chunk: steps between the checks for an early stop.
        max_sweeps: after this many sweeps without convergence the sequential scan runs.
        reverse: run backward in time.
        batched: ``init`` and ``xs`` carry a leading axis of ``N`` sequences.
        return_carry: also return the carry after the last step (recomputed by one
            sequential pass over the last block from its converged start: ``L`` steps).

    Returns:
        ``(ys, info)``: the stacked outputs (leading axis ``T``, or ``(N, T)`` when
        ``batched``) and a `SweepInfo`; ``(ys, info, carry)`` with ``return_carry``.

    Examples:
        >>> import jax.numpy as jnp
        >>> step = lambda c, x: (0.5 * c + x, c)   # forgets its start at rate 1/2
        >>> ys, info = sweep_scan(step, jnp.zeros(()), jnp.ones(1000), block_length=64)
        >>> bool(info.converged), float(ys[-1])
        (True, 2.0)
    """
    if not batched:
        out = sweep_scan(step, jax.tree.map(lambda c: jnp.asarray(c)[None], init),
                         jax.tree.map(lambda a: a[None], xs), block_length=block_length,
                         chunk=chunk, max_sweeps=max_sweeps, reverse=reverse, batched=True,
                         return_carry=return_carry)
        return (jax.tree.map(lambda a: a[0], out[0]), out[1],
                *(jax.tree.map(lambda a: a[0], c) for c in out[2:]))
    leaves = jax.tree.leaves(xs)
    if not leaves or any(jnp.ndim(a) < 2 for a in leaves):
        raise ValueError("sweep_scan: xs must hold at least one array with a leading time "
                         "axis")
    num_sequences, num_timesteps = leaves[0].shape[:2]
    if any(a.shape[:2] != (num_sequences, num_timesteps) for a in leaves):
        raise ValueError("sweep_scan: every array in xs must have the same leading "
                         f"(time) length; got {[a.shape[1] for a in leaves]}")
    if num_timesteps < 1:
        raise ValueError("sweep_scan: xs has no time steps (length 0)")
    if chunk < 1 or max_sweeps < 1 or (block_length is not None and block_length < 1):
        raise ValueError("sweep_scan: chunk, block_length and max_sweeps must be positive; "
                         f"got {chunk}, {block_length}, {max_sweeps}")
    length = block_length or default_block_length(num_timesteps, chunk)
    if length % chunk:
        raise ValueError(f"block_length={length} must be a multiple of chunk={chunk}")
    if reverse:
        xs = jax.tree.map(lambda a: jnp.flip(a, 1), xs)
    num_blocks = -(-num_timesteps // length)
    pad = num_blocks * length - num_timesteps
    num_chunks = length // chunk
    total = num_sequences * num_blocks

    def blocks(a):  # (N, T, ...) -> (N B, L, ...), a reshape (no copy) when T = B L
        if pad:
            a = jnp.concatenate([a, jnp.broadcast_to(a[:, -1:], a.shape[:1] + (pad,)
                                                     + a.shape[2:])], axis=1)
        return a.reshape((total, length) + a.shape[2:])

    xb = jax.tree.map(blocks, xs)
    over_blocks = jax.vmap(step)

    def run_chunk(carry, x):  # x: (N B, chunk, ...) -> ys (N B, chunk, ...)
        carry, ys = jax.lax.scan(over_blocks, carry,
                                 jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), x))
        return carry, jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), ys)

    def shifted(ends):  # block b of sequence n starts where block b-1 ended; b = 0 at init
        return jax.tree.map(
            lambda i, e: jnp.concatenate(
                [i[:, None], e.reshape((num_sequences, num_blocks) + e.shape[1:])[:, :-1]],
                axis=1).reshape(e.shape), init, ends)

    starts = jax.tree.map(  # every block guesses its sequence's initial carry
        lambda c: jnp.repeat(c, num_blocks, axis=0), init)
    ends_shape, ys_shape = jax.eval_shape(
        run_chunk, starts, jax.tree.map(lambda a: a[:, :chunk], xb))
    ys0 = jax.tree.map(lambda s: jnp.zeros((total, length) + s.shape[2:], s.dtype), ys_shape)
    ends0 = jax.tree.map(lambda s: jnp.zeros((num_chunks,) + s.shape, s.dtype), ends_shape)

    def chunk_cond(state):
        c, _, _, _, _, same, _ = state
        return (c < num_chunks) & ~same

    def chunk_body(state):
        c, carry, ys, previous, ends, _, armed = state
        x = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, c * chunk, chunk, 1), xb)
        carry, y = run_chunk(carry, x)
        same = armed & _same(carry, jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, c, keepdims=False), previous))
        ys = jax.tree.map(lambda b, v: jax.lax.dynamic_update_slice_in_dim(b, v, c * chunk, 1),
                          ys, y)
        ends = jax.tree.map(lambda b, v: jax.lax.dynamic_update_index_in_dim(b, v, c, 0),
                            ends, carry)
        return c + 1, carry, ys, previous, ends, same, armed

    def sweep_cond(state):
        s, _, _, _, done = state
        return (s < max_sweeps) & ~done

    def sweep_body(state):
        # one compiled chunk loop for every sweep, so that a carry equal to the previous
        # sweep's repeats its outputs bit for bit; the first sweep compares with nothing
        s, starts, ys, previous, _ = state
        _, _, ys, _, ends, same, _ = jax.lax.while_loop(
            chunk_cond, chunk_body, (0, starts, ys, previous, previous, False, s > 0))
        starts = shifted(jax.tree.map(lambda a: a[num_chunks - 1], ends))
        return s + 1, starts, ys, ends, same

    sweeps, starts, ys, _, converged = jax.lax.while_loop(
        sweep_cond, sweep_body, (0, starts, ys0, ends0, jnp.bool_(False)))
    ys = jax.tree.map(lambda a: a.reshape((num_sequences, num_blocks * length) + a.shape[2:])
                      [:, :num_timesteps], ys)
    # not converged (a recursion that does not forget): the sequential scan, exactly. A
    # loop run at most once, not a `cond`: under `jax.vmap` a `cond` on a batched
    # predicate runs both branches, a loop runs only while some element needs it
    if not return_carry:
        ys = jax.lax.while_loop(
            lambda state: state[0],
            lambda state: (jnp.bool_(False),
                           jax.vmap(lambda c, x: jax.lax.scan(step, c, x)[1])(init, xs)),
            (~converged, ys))[1]
    else:
        # converged: each sequence's last block starts at its left neighbour's true end
        def last_block(a):
            return a.reshape((num_sequences, num_blocks) + a.shape[1:])[:, -1]

        carry = jax.vmap(lambda c, x: jax.lax.scan(step, c, x)[0])(
            jax.tree.map(last_block, starts),
            jax.tree.map(lambda a: last_block(a)[:, :length - pad], xb))
        _, ys, carry = jax.lax.while_loop(
            lambda state: state[0],
            lambda state: (jnp.bool_(False),
                           *jax.vmap(lambda c, x: jax.lax.scan(step, c, x)[::-1])(init, xs)),
            (~converged, ys, carry))
    if reverse:
        ys = jax.tree.map(lambda a: jnp.flip(a, 1), ys)
    info = SweepInfo(sweeps, converged)
    return (ys, info, carry) if return_carry else (ys, info)


def with_sweep_rules(swept, sequential, *, shared=(), max_batch: int | None = None):
    """A pass by sweeps, ``swept(*args, batched=False)``, as a function of its array
    arguments with the derivatives of ``sequential`` (the same pass as a plain scan) and a
    batching rule that sweeps a batch's blocks together.

    ``jax.custom_jvp``: the sweeps' while loops have no reverse mode, and the sequential
    scan's derivatives are those of the same function. ``jax.custom_batching.custom_vmap``:
    under ``jax.vmap`` the sequences' blocks run in one sweep (``swept(...,
    batched=True)``, every argument but the ``shared`` ones given a leading batch axis);
    vmapping the while loops instead would carry and select every buffer on every
    iteration, and a per-sequence fallback ``cond`` would run both branches. A batch in
    which a ``shared`` argument (e.g. a transition matrix fixed in time, a model's
    matrices) differs per sequence, or of more than ``max_batch`` sequences, runs
    ``sequential`` vmapped.

    Args:
        swept: ``(*args, batched=False) -> outputs``, a pytree of arrays.
        sequential: ``(*args) -> outputs``, the same outputs by a sequential scan.
        shared: positions of the arguments a batched ``swept`` takes unbatched.
        max_batch: the largest batch swept together (``None``: no bound).

    Returns:
        A function of ``*args``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> step = lambda c, x: (0.5 * c + x, c)
        >>> def swept(xs, batched=False):
        ...     init = jnp.zeros(xs.shape[:-1])
        ...     return sweep_scan(step, init, xs, block_length=32, batched=batched)[0]
        >>> f = with_sweep_rules(swept, lambda xs: jax.lax.scan(step, 0.0, xs)[1])
        >>> xs = jnp.ones((3, 100))
        >>> bool(jnp.all(jax.vmap(f)(xs) == jax.vmap(jax.lax.scan, (None, None, 0))(
        ...     step, 0.0, xs)[1]))
        True
    """
    shared = tuple(shared)

    @jax.custom_batching.custom_vmap
    def one(*args):
        return swept(*args)

    @one.def_vmap
    def one_vmap(axis_size, in_batched, *args):
        in_batched = tuple(in_batched)
        per_sequence = any(any(jax.tree.leaves(in_batched[i])) for i in shared)
        if per_sequence or (max_batch is not None and axis_size > max_batch):
            axes = tuple(jax.tree.map(lambda b: 0 if b else None, b) for b in in_batched)
            out = jax.vmap(sequential, in_axes=axes, axis_size=axis_size)(*args)
        else:
            def batch(x, is_batched):
                return x if is_batched else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x))

            out = swept(*(a if i in shared else jax.tree.map(batch, a, b)
                          for i, (a, b) in enumerate(zip(args, in_batched, strict=True))),
                        batched=True)
        return out, jax.tree.map(lambda _: True, out)

    @jax.custom_jvp
    def with_rules(*args):
        return one(*args)

    @with_rules.defjvp
    def with_rules_jvp(primals, tangents):
        return jax.jvp(sequential, primals, tangents)

    with_rules.__doc__ = swept.__doc__
    return with_rules
