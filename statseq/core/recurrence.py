"""``log_prob``, ``filter``, ``sample`` and ``forecast``, written once for every model.

Each function validates its inputs eagerly, flattens any batch of sequences to one axis,
and calls a module-level ``jax.jit`` whose only static argument is the (hashable) model
object, so repeated calls with the same shapes reuse one compiled program.
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core import memo
from statseq.core.buckets import cut_time
from statseq.core.constant_outputs import constant_outputs
from statseq.core.params import check_params_once, strong_params, validate_params
from statseq.core.results import FilterResult
from statseq.core.validation import (
    Prepared,
    bucket_key,
    check_key,
    check_positive_int,
    float_dtype,
    prepare_data,
    prepare_sized,
)


def pairwise_sum(x, axis: int = -1):
    """Sum along ``axis`` as a balanced binary tree (error grows as log n, not n).

    Used for log-likelihoods of long sequences, so that float32 totals stay accurate.
    """
    x = jnp.moveaxis(x, axis, -1)
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = jnp.concatenate([x, jnp.zeros(x.shape[:-1] + (1,), x.dtype)], axis=-1)
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0] if x.shape[-1] == 1 else jnp.zeros(x.shape[:-1], x.dtype)


def vmap_or_one(fn, in_axes=0):
    """``jax.vmap(fn, in_axes)``, except that a batch of one calls ``fn`` unbatched.

    ``vmap_or_one(f)(x)[n] = f(x[n])`` for ``n < N``; when the batch size ``N`` (a static
    shape, so decided while tracing) is 1, the result is ``f(x[0])`` with a leading axis of
    length 1 added to every output leaf, with no ``vmap`` in the program. A public call on
    one sequence flattens its batch to ``N = 1``, and ``vmap`` of one is not free on
    XLA:CPU: it changes fusion and can add kernels to a scan body, past the 8-thunk loop
    body XLA:CPU runs inline (+0.3-0.4 µs per step; the one-series Kalman scan: 9 thunks
    vmapped, 8 unbatched, 1.8x faster at T = 10^3). Every per-sequence ``vmap`` over a
    flat batch goes through here. Under a
    user's ``jax.vmap`` of such a call, ``fn`` itself is then vmapped (with its own
    batching rules, e.g. ``custom_vmap``).

    Args:
        fn: the per-sequence function.
        in_axes: ``0`` (every argument batched along its first axis) or a tuple with one
            entry per positional argument, ``0`` (batched) or ``None`` (not batched).

    Returns:
        A function of the same arguments as ``jax.vmap(fn, in_axes)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> vmap_or_one(lambda x, s: x.sum() * s, in_axes=(0, None))(
        ...     jnp.ones((1, 3)), 2.0).shape
        (1,)
    """
    def run(*args):
        axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
        if len(axes) != len(args) or any(a not in (0, None) for a in axes):
            raise ValueError(f"vmap_or_one takes in_axes 0, None or a tuple of them, one "
                             f"per argument; got {in_axes!r} for {len(args)} arguments")
        sizes = {jnp.shape(leaf)[0] for arg, ax in zip(args, axes, strict=True)
                 if ax is not None for leaf in jax.tree.leaves(arg)}
        if sizes != {1}:
            return jax.vmap(fn, in_axes=in_axes)(*args)
        one = (arg if ax is None else jax.tree.map(lambda a: a[0], arg)
               for arg, ax in zip(args, axes, strict=True))
        return jax.tree.map(lambda a: jnp.asarray(a)[None], fn(*one))

    return run


def _scan_one(model, params, y, mask, inputs, carry0, return_carries: bool, num_valid=None):
    """Run the filter over one sequence; returns (log_probs, carries or None, final).

    With ``num_valid`` (a traced length, for a time axis padded to a bucket length) the
    steps from ``num_valid`` on score 0 and leave the carry as it was after the last real
    step, so the final carry is that of the unpadded sequence.
    """

    num_conditioned = model.num_conditioned_steps

    def step(carry, xs):
        t, y_t, m_t, u_t = xs
        lp, new_carry = model.step(params, carry, y_t, m_t, u_t)
        if num_conditioned:
            lp = jnp.where(t >= num_conditioned, lp, 0.0)
        if num_valid is not None:
            live = t < num_valid
            lp = jnp.where(live, lp, 0.0)
            new_carry = jax.tree.map(lambda new, old: jnp.where(live, new, old),
                                     new_carry, carry)
        return new_carry, (lp, new_carry if return_carries else None)

    steps = jnp.arange(y.shape[0])
    final, (log_probs, carries) = jax.lax.scan(step, carry0, (steps, y, mask, inputs))
    return log_probs, carries, final


@partial(jax.jit, static_argnames=("model", "return_carries", "complete", "need_final"))
def _filter_flat(model, params, y, mask, inputs, num_valid=None, return_carries=False,
                 complete=False, need_final=True):
    """Filter a flat batch ``(N, T, ...)``; ``complete=True`` promises nothing is masked.

    ``num_valid`` (``None``, or the real length of a time axis padded to a bucket length,
    `statseq.core.buckets`): steps from ``num_valid`` on score 0 and leave the carry
    unchanged; ``complete`` then refers to the real steps only. A fast path's per-step
    values are causal, so its padded steps are simply zeroed; its final carry would have
    seen them, so with ``num_valid`` it is used only when ``need_final=False``.

    With complete data, a model may supply ``complete_data_log_probs`` (an equivalent,
    faster evaluation without the per-step scan); it is used unless carries are wanted.
    A model may also supply ``complete_data_log_probs_batch(params, y (N, T, ...),
    inputs (N, T, U)) -> (log_probs (N, T), final carries)``, which then replaces the
    per-sequence version vmapped over the batch (e.g. one scan over the whole batch with
    matrix-matrix recurrent products and batch-level weight gradients).
    Otherwise a model may supply ``masked_data_filter(params, num_timesteps)``: ``None``,
    or a function ``(y, mask, inputs) -> (log_probs (T,), final carry)`` of one sequence
    (missing entries allowed) that replaces the per-step scan when no carries are wanted
    and the time axis is not padded.
    """
    fast = hasattr(model, "complete_data_log_probs") and y.shape[1] >= getattr(
        model, "fast_path_min_timesteps", 0
    )
    # a model whose fast path takes num_valid keeps it for padded sequences that need the
    # final carry (its final carry is then that of the real steps)
    stops = getattr(model, "complete_data_num_valid", False)
    if complete and not return_carries and fast and (num_valid is None or not need_final
                                                     or stops):
        if hasattr(model, "complete_data_log_probs_batch"):  # the whole batch at once
            log_probs, final = model.complete_data_log_probs_batch(params, y, inputs)
        elif stops and num_valid is not None:
            fast = partial(model.complete_data_log_probs, params, num_valid=num_valid)
            log_probs, final = vmap_or_one(fast)(y, inputs)
        else:
            fast = partial(model.complete_data_log_probs, params)
            log_probs, final = vmap_or_one(fast)(y, inputs)
        if num_valid is not None:
            live = jnp.arange(y.shape[1]) < num_valid
            log_probs = jnp.where(live, log_probs, jnp.zeros((), log_probs.dtype))
        return pairwise_sum(log_probs), log_probs, None, final
    # a model may run its own filter where no per-step carries are wanted (e.g. a linear
    # Gaussian model with one series: `GaussianSSMBase.masked_data_filter`)
    # (on a padded time axis too where the final carry is not wanted: the padded steps
    # are masked, so the filter runs past them, and their scores are zeroed here)
    own = getattr(model, "masked_data_filter", None)
    own = None if own is None or return_carries or (num_valid is not None and need_final) \
        else own(params, y.shape[1])
    if own is not None:
        log_probs, final = vmap_or_one(own)(y, mask, inputs)
        if num_valid is not None:
            live = jnp.arange(y.shape[1]) < num_valid
            log_probs = jnp.where(live, log_probs, jnp.zeros((), log_probs.dtype))
        return pairwise_sum(log_probs), log_probs, None, final
    carry0 = model.initial_carry(params)
    run = partial(_scan_one, model, params, carry0=carry0, return_carries=return_carries,
                  num_valid=num_valid)
    log_probs, carries, final = vmap_or_one(run)(y, mask, inputs)
    return pairwise_sum(log_probs), log_probs, carries, final


def run_filter(model, params, y, mask, inputs, *, complete, return_carries=False,
               num_valid=None, need_final=True):
    """Call the compiled filter with every static argument spelled out.

    ``jax.jit`` keys its cache on static arguments *as passed*, so every caller goes
    through here to share one compiled program per (model, shapes, options).
    ``num_valid`` is the real length of a padded time axis (see `_filter_flat`).
    """
    return _filter_flat(
        model, params, y, mask, inputs, num_valid, return_carries=return_carries,
        complete=complete, need_final=need_final,
    )


def run_prepared(model, params, data, *, return_carries=False, need_final=True):
    """`run_filter` on the output of ``prepare_data``, padded to a bucket length or not.

    ``need_final=False`` (the caller ignores the final carry) matters only when padded; an
    unpadded call always passes the default, so that ``log_prob``, ``filter`` and
    ``forecast`` share one compiled program per shape.
    """
    if data.num_valid is None:
        return run_filter(model, params, data.y, data.mask, data.inputs,
                          complete=data.complete, return_carries=return_carries)
    return run_filter(model, params, data.y, data.mask, data.inputs,
                      complete=data.valid_complete, return_carries=return_carries,
                      num_valid=np.int32(data.num_valid), need_final=need_final)


@partial(jax.jit, static_argnums=1)
def _unflatten(tree, batch_shape):
    """Restore the batch shape of every leaf (one compiled call, not one per leaf)."""
    return jax.tree.map(lambda a: jnp.reshape(a, batch_shape + a.shape[1:]), tree)


def _filter_call(model, params, data, return_carries=False, need_final=True, totals=False):
    """`_filter_flat` on prepared data as one compiled call with the batch shape restored
    (`reshaped_runner`): a zero-argument callable.

    ``filter`` and `statseq.forecast` (`final_carries`) share one program per (model,
    shapes): unpadded calls pass ``need_final=True`` whatever they need. ``totals=True``
    (``log_prob``) compiles a program of the totals alone: its loop then stacks no
    per-step output and it hands back one buffer instead of three or four (an AR(2)
    ``log_prob`` repeat at T = 10^3 about a fifth shorter, `benchmarks/RESULTS.md`,
    "Session 23: log_prob's own program"), at the price of a second compilation where
    both ``log_prob`` and ``filter`` run on the same shapes.
    """
    padded = data.num_valid is not None
    dynamic, fill = device_args(data, model.num_inputs)
    dynamic["params"] = params
    if padded:
        dynamic["num_valid"] = np.int32(data.num_valid)
    return reshaped_runner(
        _filter_flat, data.batch_shape, dynamic, fill, pick=0 if totals else None,
        model=model, return_carries=return_carries and not totals,
        complete=data.valid_complete if padded else data.complete,
        need_final=not totals and (need_final or not padded))


def _call_public(model, params, data, return_carries=False, need_final=True):
    """`_filter_call`, called: ``(totals, log_probs, carries, final)``."""
    return _filter_call(model, params, data, return_carries, need_final)()


@partial(jax.jit, static_argnums=(1, 2))
def _flatten_batch(tree, batch_ndim, num_sequences):
    # the number of sequences spelled out: a carry leaf may be empty (no -1 to infer)
    return jax.tree.map(lambda a: jnp.reshape(a, (num_sequences,) + a.shape[batch_ndim:]),
                        tree)


def final_carries(model, params, data):
    """The final carry of every sequence, flat ``(num_sequences, ...)``, from the compiled
    program `log_prob` and `filter` use on the same data (none compiled for a forecast).

    Args:
        model: a statseq model (sized for the data, `prepare_sized`).
        params: its parameters.
        data: `statseq.core.validation.prepare_data` output.

    Returns:
        The final carries with one leading axis over the flattened batch.
    """
    final = _call_public(model, params, data)[3]
    return _flatten_batch(final, len(data.batch_shape), int(data.y.shape[0]))


def checked_data(model, params, y, mask=None, inputs=None, *, bucket: bool = True,
                 sized: bool = True) -> tuple:
    """`validate_params` and `prepare_sized` (``sized=False``: `prepare_data`), each
    remembered for the arrays passed: ``(model, data)``.

    Parameters passed again (the same JAX arrays, or the same NumPy arrays with unchanged
    contents, `statseq.core.memo`) skip their check, and data passed again skip theirs,
    the host-side copies and the device transfer: one lookup each. The two are remembered
    apart (`statseq.core.params._PARAMS_OK`, `statseq.core.validation._PREPARED`), so that
    new parameters on the same data (a likelihood on a grid, a user's optimizer loop) check
    only the parameters and store one entry, not two. A NumPy array changed in place since
    is checked again, with the same errors as on a first call.

    Args:
        model: a statseq model.
        params: its parameters.
        y: the data, as for `statseq.core.validation.prepare_data`.
        mask: optional observation mask.
        inputs: covariates, when the model takes them.
        bucket: whether the time axis may be padded to a bucket length.
        sized: size a ``for_mask`` model for the data's mask (`prepare_sized`).

    Returns:
        ``(model, data)``: the (possibly resized) model and the `Prepared` data.
    """
    # the check alone: the caller's compiled call makes weak leaves strong itself
    check_params_once(model, params)
    if sized:
        return prepare_sized(model, y, mask, inputs, bucket=bucket)
    return model, prepare_data(model, y, mask, inputs, bucket=bucket)


def device_args(data: Prepared, num_inputs: int) -> tuple[dict, bool]:
    """The arrays of prepared ``data`` to pass to a compiled call: ``(dynamic, fill)``.

    For complete, unpadded data the all-True mask (and, for a model without inputs, the
    empty inputs) is built inside the compiled program (``fill=True``, `reshaped_call`)
    rather than passed: fewer arguments to dispatch on every call, same values, and a
    mask the compiler knows and can drop, as in a user's ``jax.jit`` of the same call.

    Args:
        data: the output of `statseq.core.validation.prepare_data`.
        num_inputs: the model's ``num_inputs``.

    Returns:
        ``({"y": ..., "mask": ..., "inputs": ...}, fill)``; with ``fill`` the mask is
        ``None``, and so are the inputs of a model without inputs.
    """
    fill = data.complete and data.num_valid is None
    if fill:
        return dict(y=data.y, mask=None, inputs=data.inputs if num_inputs else None), True
    return dict(y=data.y, mask=data.mask, inputs=data.inputs), False


def _filled(y, mask, inputs):
    """The all-True mask and empty inputs of `device_args` (``fill=True``)."""
    if mask is None:
        mask = jnp.ones(y.shape, bool)
    if inputs is None:
        inputs = jnp.zeros(y.shape[:2] + (0,), float_dtype())
    return mask, inputs


class _Stripped(NamedTuple):
    """A compiled call's output without its zero-size and constant leaves (`_strip_empty`)."""

    leaves: tuple


#: zero-size arrays handed back in place of a program's zero-size outputs, by (shape, dtype)
_EMPTY: dict = {}


def _strip_empty(out, layouts: dict, constants=None):
    """``out`` as it is, or, where some leaves are zero-size or constant, its other leaves
    as a `_Stripped` (the layout to restore it recorded in ``layouts``, while tracing).

    Every output of a program is a buffer that XLA:CPU fills by a thunk of the program's
    entry computation, a zero-size one too (a copy of a constant), and an entry of more
    than 8 thunks that are not a chain runs on XLA:CPU's concurrent executor, at a fixed
    cost of 10-50 µs (`benchmarks/RESULTS.md`, "Public calls vs their jitted core"): the
    final carry of a linear Gaussian model has 3 empty leaves (input weights of a model
    without inputs) among 9, and they alone put its ``log_prob`` program past the limit.
    ``constants`` (``{leaf index: NumPy value}``, `statseq.core.constant_outputs`) are the
    leaves computed from literals alone (an HMM's ``started`` flag, a lag window's step
    count): they are made outside too, unless another trace of the same program recorded
    the same kept layout with other constants (then nothing is stripped).
    """
    leaves, treedef = jax.tree.flatten(out)
    constants = constants or {}
    removed = []
    for i, a in enumerate(leaves):
        if 0 in a.shape and (jnp.issubdtype(a.dtype, jnp.number) or a.dtype == bool):
            removed.append((i, a.shape, a.dtype, None))
        elif i in constants:
            removed.append((i, a.shape, a.dtype, constants[i]))
    if not removed:
        return out
    gone = {e[0] for e in removed}
    kept = tuple(a for i, a in enumerate(leaves) if i not in gone)
    key = _layout_key(kept)
    if key in layouts and not _same_removed(layouts[key], (treedef, removed)):
        return out  # (a layout this key already restores otherwise: keep every leaf)
    layouts[key] = (treedef, removed)
    return _Stripped(kept)


def _same_removed(a, b) -> bool:
    (tree_a, removed_a), (tree_b, removed_b) = a, b
    return tree_a == tree_b and len(removed_a) == len(removed_b) and all(
        x[:3] == y[:3] and (x[3] is None) == (y[3] is None)
        and (x[3] is None or np.array_equal(x[3], y[3]))
        for x, y in zip(removed_a, removed_b, strict=True))


def _layout_key(leaves) -> tuple:
    """What tells apart the traces of one program (lengths, dtype policies)."""
    return tuple((a.shape, a.dtype) for a in leaves)


def _concrete(value):
    """A device array of ``value``, concrete even when called under a trace (a traced
    `device_put` cached here would leak into later calls)."""
    with jax.ensure_compile_time_eval():
        return jax.device_put(value)


def _unstrip(out: _Stripped, layouts: dict):
    """The full output of a `_Stripped` one: its zero-size and constant leaves put back
    (one array per zero-size shape and dtype, one per constant, made once: no program and
    no transfer on a call)."""
    treedef, removed = layouts[_layout_key(out.leaves)]
    leaves = list(out.leaves)
    for n, (i, shape, dtype, value) in enumerate(removed):
        if value is None:
            key = (shape, np.dtype(dtype))
            if key not in _EMPTY:
                _EMPTY[key] = _concrete(np.zeros(shape, dtype))
            leaves.insert(i, _EMPTY[key])
        else:
            if not isinstance(value, jax.Array):  # made once, kept in the layout
                value = _concrete(value)
                removed[n] = (i, shape, dtype, value)
            leaves.insert(i, value)
    return treedef.unflatten(leaves)


@functools.lru_cache(maxsize=512)
def _bound(fn, names, nones, batch_shape, fill, pick, static):
    """One ``jax.jit`` per (kernel, argument names, batch shape, options), called with the
    dynamic arrays as positional arguments only: no static argument to hash and no keyword
    to sort on a call, which is most of the dispatch of a short filter. Zero-size and
    constant outputs are made outside the program (`_strip_empty`)."""
    static = dict(static)
    layouts: dict = {}

    def body(*arrays):
        dynamic = dict(zip(names, arrays, strict=True), **dict.fromkeys(nones))
        if fill:  # the all-True mask and the empty inputs, for those fn takes
            mask, inputs = _filled(dynamic["y"], dynamic.get("mask"), dynamic.get("inputs"))
            dynamic.update((k, v) for k, v in (("mask", mask), ("inputs", inputs))
                           if k in nones)
        out = fn(**dynamic, **static)
        if pick is not None:
            out = out[pick]
        return jax.tree.map(lambda a: jnp.reshape(a, batch_shape + a.shape[1:]), out)

    def run(*arrays):
        # traced once as a jaxpr, to find the outputs computed from literals alone, then
        # evaluated into this trace (no second trace of the kernel)
        closed, shapes = jax.make_jaxpr(body, return_shape=True)(*arrays)
        flat = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *jax.tree.leaves(arrays))
        out = jax.tree.structure(shapes).unflatten(flat)
        return _strip_empty(out, layouts, constant_outputs(closed))

    return _Program(jax.jit(run), layouts)


class _Program:
    """A `_bound` program (``jitted``, whose output may be `_Stripped`, and the ``layouts``
    that restore it); `runner` binds the dynamic arrays and puts the zero-size and constant
    leaves back. The functions that put them back (`_restorer`) depend only on the program
    and the layout, so they are made once per layout and shared by every runner (a call
    with new parameters builds a new runner, not a new restorer)."""

    __slots__ = ("jitted", "layouts", "restorers")

    def __init__(self, jitted, layouts):
        self.jitted, self.layouts = jitted, layouts
        self.restorers: dict = {}

    def restorer(self, out: _Stripped):
        """The shared `_restorer` for the layout of ``out`` (it holds the put-back arrays
        and the tree structure only, none of a runner's arrays or outputs)."""
        key = _layout_key(out.leaves)
        restore = self.restorers.get(key)
        if restore is None:
            restore = self.restorers[key] = _restorer(out, self.layouts)
        return restore

    def runner(self, arrays):
        """A callable of no arguments: the program on ``arrays``, with the layout of its
        stripped output looked up once (on the first call) rather than on every call."""
        jitted = self.jitted
        restore = []

        def run():
            out = jitted(*arrays)
            if type(out) is not _Stripped:
                return out
            if not restore or restore[0][0] != len(out.leaves):  # (a retrace: look again)
                restore[:] = [(len(out.leaves), self.restorer(out))]
            return restore[0][1](out.leaves)

        run.program, run.arrays = self, arrays  # (for tests: the raw output)
        return run


_KEPT = object()


def _restorer(out: _Stripped, layouts: dict):
    """``leaves -> full output`` for the layout of ``out`` (`_unstrip`
    once, to make the put-back arrays, then a template filled on each call). It keeps no
    reference to ``out``'s own arrays (`_Program.restorer` shares it between runners)."""
    full = _unstrip(out, layouts)
    treedef, removed = layouts[_layout_key(out.leaves)]
    gone = {e[0] for e in removed}
    flat = jax.tree.leaves(full)
    template = [a if i in gone else _KEPT for i, a in enumerate(flat)]
    return lambda leaves: _fill(template, treedef, leaves)


def _fill(template, treedef, leaves):
    it = iter(leaves)
    return treedef.unflatten([next(it) if a is _KEPT else a for a in template])


def reshaped_runner(fn, batch_shape, dynamic, fill=False, pick=None, **static):
    """`reshaped_call` as a zero-argument callable: the compiled program with its arguments
    bound (what `remembered` keeps, so that a repeat is one dispatch).

    Args:
        fn: a function of arrays (typically already a ``jax.jit``); hashable.
        batch_shape: the batch shape that replaces each output's leading (flat) axis.
        dynamic: ``{name: array, pytree or None}``, the traced arguments of ``fn``.
        fill: build ``dynamic["mask"]`` and ``dynamic["inputs"]`` (those given as ``None``)
            inside the program from ``dynamic["y"]`` (`device_args`): an all-True mask
            known to the compiler, which can then drop the masking work.
        pick: an index into ``fn``'s output to compute and return alone (e.g. ``0``:
            a program of that output only), or ``None``.
        **static: hashable arguments of ``fn`` (the model, options).

    Returns:
        A callable of no arguments returning ``fn``'s output with batch shapes restored.
    """
    if dynamic.get("params") is not None:  # a weakly typed leaf reuses the strong one's
        dynamic = {**dynamic, "params": strong_params(dynamic["params"])}  # program
    names = tuple(k for k, v in dynamic.items() if v is not None)
    nones = tuple(k for k, v in dynamic.items() if v is None)
    bound = _bound(fn, names, nones, tuple(batch_shape), fill, pick,
                   tuple(sorted(static.items())))
    return bound.runner(tuple(dynamic[k] for k in names))


def reshaped_call(fn, batch_shape, dynamic, fill=False, **static):
    """``fn(**dynamic, **static)`` with every output leaf's leading axis reshaped to
    ``batch_shape``, as one compiled program (one dispatch per call).

    For the public wrappers (``model.smoother``, ``model.filter_states``, ...): an
    eager reshape per output leaf costs a dispatch each, more than a short filter.

    Args:
        fn: a function of arrays (typically already a ``jax.jit``); hashable.
        batch_shape: the batch shape that replaces each output's leading (flat) axis.
        dynamic: ``{name: array or pytree}``, the traced arguments of ``fn``.
        fill: build ``dynamic["mask"]`` and ``dynamic["inputs"]`` (given as ``None``) inside
            the program from ``dynamic["y"]`` (`device_args`).
        **static: hashable arguments of ``fn`` (the model, options).

    Returns:
        ``fn``'s output with batch shapes restored.

    Examples:
        >>> import jax.numpy as jnp
        >>> def f(x, *, scale):
        ...     return x * scale
        >>> reshaped_call(f, (2, 3), {"x": jnp.ones((6, 4))}, scale=2.0).shape
        (2, 3, 4)
    """
    return reshaped_runner(fn, batch_shape, dynamic, fill, **static)()


def _immutable_leaves(tree, out) -> bool:
    """Collect the leaves of ``tree`` into ``out``; ``False`` unless every container is a
    tuple (a NamedTuple: its fields cannot be rebound) and every leaf can be remembered."""
    if tree is None or type(tree) in (int, float, bool):
        return True
    if isinstance(tree, tuple):
        return all(_immutable_leaves(t, out) for t in tree)
    out.append(tree)
    return memo._rememberable(tree)


def _no_array():
    return None


class _Repeat:
    """What a remembered public call needs to recognise its arguments and run again."""

    __slots__ = ("model", "params", "y", "mask", "inputs", "numpy", "run")

    def __init__(self, model, params, leaves, arrays, run):
        self.model, self.params, self.run = model, params, run
        self.y, self.mask, self.inputs = (_no_array if a is None else weakref.ref(a)
                                          for a in arrays)
        # NumPy arrays are mutable: their bytes must be unchanged (`statseq.core.memo`)
        self.numpy = tuple((a, a.shape, a.dtype, a.tobytes())
                           for a in (*leaves, *(x for x in arrays if x is not None))
                           if not isinstance(a, jax.Array))

    def unchanged(self) -> bool:
        """Whether every NumPy array still holds the bytes it had (the objects are the
        same: checked by the caller)."""
        for a, shape, dtype, data in self.numpy:
            if a.shape != shape or (a.dtype is not dtype and a.dtype != dtype) or (
                    a.tobytes() != data):
                return False
        return True


#: public calls already checked and bound to their compiled program (`remembered`)
_REPEATS: OrderedDict = OrderedDict()
_REPEATS_MAX = 32


def remembered(tag, model, params, y, mask, inputs, build, *, bucket: bool = True):
    """A public call on arguments passed again, as one lookup and one dispatch.

    ``build()`` runs a call's eager part (`validate_params`, `prepare_data`, the choice of
    compiled program and its arguments) and returns a callable of no arguments that
    dispatches the program and finishes the call (e.g. a check of the result). It is kept
    for the very objects passed: the model and parameters (held; only tuples, NamedTuples
    and arrays, whose leaves cannot be swapped) and the data arrays (weakly held), with a
    snapshot of the bytes of each NumPy array among them, so that an array changed in
    place since is checked again (`statseq.core.memo`). A repeat skips even the
    parameters' tree flattening, the keyword handling of a jitted call with static
    arguments and the assembly of its arguments. Tracers, lists, dicts and NumPy arrays
    above `memo.MAX_SNAPSHOT_BYTES` are never kept (``build`` runs on every call).

    Args:
        tag: hashable; what the call is (``"log_prob"``, ``("smoother", parallel)``, ...).
        model: the model.
        params: its parameters.
        y: the data.
        mask: the mask or ``None``.
        inputs: the inputs or ``None``.
        build: the call's eager part (see above).
        bucket: whether the call may pad the time axis to a bucket length (the policy is
            then part of what is remembered).

    Returns:
        What the callable ``build`` returned gives.
    """
    # the dtype policy (as `float_dtype`) and the bucket policy are part of the key
    key = (tag, id(model), id(params), id(y), id(mask), id(inputs),
           jax.config.jax_enable_x64, bucket and bucket_key(True))
    entry = _REPEATS.get(key)
    if entry is not None:
        if (entry.model is model and entry.params is params and entry.y() is y
                and entry.mask() is mask and entry.inputs() is inputs
                and entry.unchanged()):
            return entry.run()
        del _REPEATS[key]
    run = build()
    arrays, leaves = (y, mask, inputs), []
    if _immutable_leaves(params, leaves) and all(
            a is None or memo._rememberable(a) for a in arrays):
        _REPEATS[key] = _Repeat(model, params, leaves, arrays, run)
        while len(_REPEATS) > _REPEATS_MAX:
            _REPEATS.popitem(last=False)
    return run()


def _filter_runner(model, params, y, mask, inputs, return_carries):
    """`filter`'s eager part (`remembered`): validate, then bind the compiled call."""
    model, data = checked_data(model, params, y, mask, inputs)
    call = _filter_call(model, params, data, return_carries)

    def run():
        total, log_probs, carries, final = call()
        if data.num_valid is not None:  # padded to a bucket length: cut back to the real one
            axis = len(data.batch_shape)
            log_probs = cut_time(log_probs, data.num_valid, axis)
            carries = jax.tree.map(lambda a: cut_time(a, data.num_valid, axis), carries)
        return FilterResult(log_prob=total, log_probs=log_probs, carries=carries,
                            final_carry=final)

    return run


def _log_prob_runner(model, params, y, mask, inputs):
    """`log_prob`'s eager part (`remembered`)."""
    model, data = checked_data(model, params, y, mask, inputs)
    return _filter_call(model, params, data, totals=True)  # a program of the totals alone


def filter(model, params, y, *, mask=None, inputs=None, return_carries=False) -> FilterResult:  # noqa: A001
    """Run the model's recurrence over ``y``: per-step predictive log-densities and states.

    The log-likelihood is the sum of one-step predictive log-densities (the prediction
    error decomposition),

        log p(y_{1:T}) = sum_t log p(y_t | y_{<t}, u_{<=t}),

    with masked entries marginalized out (the state is not conditioned on them).

    Args:
        model: a statseq model.
        params: its parameters.
        y: ``batch_shape + (num_timesteps,) + model.event_shape``.
        mask: optional booleans, per time step or per entry (``True`` = observed).
        inputs: ``[batch_shape +] (num_timesteps, input_dim)`` when the model takes inputs.
        return_carries: also return the state after every step.

    Returns:
        A `FilterResult`.

    Examples:
        >>> import statseq as ss, jax.numpy as jnp
        >>> model = ss.AR(order=1)
        >>> params = model.default_params()
        >>> ss.filter(model, params, jnp.array([0.1, -0.3, 0.2])).log_probs.shape
        (3,)
    """
    return remembered(("filter", bool(return_carries)), model, params, y, mask, inputs,
                      lambda: _filter_runner(model, params, y, mask, inputs,
                                             return_carries))


def log_prob(model, params, y, *, mask=None, inputs=None):
    """Total log-likelihood ``log p(y_{1:T} | u_{1:T})`` of each sequence in ``y``.

    Args:
        model: a statseq model.
        params: its parameters.
        y: ``batch_shape + (num_timesteps,) + model.event_shape``.
        mask: optional booleans, per time step or per entry (``True`` = observed).
        inputs: ``[batch_shape +] (num_timesteps, input_dim)`` when the model takes inputs.

    Returns:
        An array of shape ``batch_shape``.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> lp = ss.log_prob(model, params, y)             # sum_t log p(y_t | y_<t)
        >>> bool(abs(lp - ss.filter(model, params, y).log_probs.sum()) < 1e-4)
        True
        >>> ss.log_prob(model, params, np.stack([y, y[::-1]])).shape   # a batch of series
        (2,)
    """
    return remembered("log_prob", model, params, y, mask, inputs,
                      lambda: _log_prob_runner(model, params, y, mask, inputs))


def _simulate(model, params, carry, key, inputs):
    """Ancestral sampling from ``carry`` over ``inputs.shape[0]`` steps: (ys, final carry).

    A model with ``sample_step(params, carry, key, u_t) -> (y_t, carry)`` draws each step
    itself (`statseq.SwitchingLDS`, whose filter is approximate but whose latent state can
    be drawn exactly); otherwise predict, draw, update.
    """
    full_mask = jnp.ones(model.event_shape, bool)

    def step(carry, xs):
        k, u_t = xs
        if hasattr(model, "sample_step"):  # a model whose carry must hold drawn latents
            y_t, new = model.sample_step(params, carry, k, u_t)
            return new, y_t
        d = model.predict(params, carry, u_t)
        y_t = d.sample(k)
        return model.update(params, carry, y_t, full_mask, u_t), y_t

    keys = jax.random.split(key, inputs.shape[0])
    final, ys = jax.lax.scan(step, carry, (keys, inputs))
    return ys, final


@partial(jax.jit, static_argnames=("model",))
def _sample_from(model, params, carries, keys, inputs):
    """carries: (N, ...); keys: (S, N); inputs: (N, T, U) -> samples (S, N, T, *event)."""
    sim = lambda c, k, u: _simulate(model, params, c, k, u)[0]  # noqa: E731
    over_batch = vmap_or_one(sim, in_axes=(0, 0, 0))
    return vmap_or_one(over_batch, in_axes=(None, 0, None))(carries, keys, inputs)


def _future_inputs(model, inputs, batch_shape, num_steps):
    n = model.num_inputs
    if n == 0:
        if inputs is not None:
            raise ValueError(f"{type(model).__name__} takes no inputs, but inputs were given")
        return jnp.zeros((int(np.prod(batch_shape, dtype=int)), num_steps, 0), float_dtype())
    if inputs is None:
        raise ValueError(
            f"{type(model).__name__} has input_dim={n}: pass future inputs of shape "
            f"({num_steps}, {n})"
        )
    arr = jnp.asarray(inputs, float_dtype())
    if arr.shape[-2:] != (num_steps, n):
        raise ValueError(f"inputs must end in shape ({num_steps}, {n}); got {arr.shape}")
    if not bool(jnp.all(jnp.isfinite(arr))):
        raise ValueError("inputs contain non-finite values")
    arr = jnp.broadcast_to(arr, batch_shape + (num_steps, n))
    return jnp.reshape(arr, (-1, num_steps, n))


def sample(model, params, *, num_timesteps, key, inputs=None, num_samples=None):
    """Draw sequences by ancestral sampling: predict, draw ``y_t``, update, repeat.

    Args:
        model: a statseq model.
        params: its parameters.
        num_timesteps: length of each sequence.
        key: a ``jax.random`` key (keyword-only, required).
        inputs: ``(num_timesteps, input_dim)`` covariates when the model takes inputs.
        num_samples: number of independent sequences (``None`` for one).

    Returns:
        ``[(num_samples,)] + (num_timesteps,) + model.event_shape``.

    A model whose initial law is improper (a diffuse state space model) starts from the
    carry its ``sampling_carry`` gives (the diffuse states at their initial mean).

    Examples:
        >>> import jax, statseq as ss
        >>> model = ss.AR(order=2)
        >>> ss.sample(model, model.default_params(), num_timesteps=50,
        ...           key=jax.random.key(0)).shape
        (50,)
    """
    check_key(key)
    params = validate_params(model, params)
    num_timesteps = check_positive_int(num_timesteps, "num_timesteps")
    n = 1 if num_samples is None else check_positive_int(num_samples, "num_samples")
    u = _future_inputs(model, inputs, (), num_timesteps)
    start = getattr(model, "sampling_carry", model.initial_carry)(params)
    carry = jax.tree.map(lambda a: a[None], start)
    keys = jax.random.split(key, n)[:, None]
    ys = _sample_from(model, params, carry, keys, u)[:, 0]
    return ys[0] if num_samples is None else ys
