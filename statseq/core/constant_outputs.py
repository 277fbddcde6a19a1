"""Outputs of a traced program that do not depend on its inputs, and their values.

A public call's compiled program hands back every leaf of its result, a final carry's
constant leaves too (the ``started`` flag of an HMM's forward message, the step counter
of an autoregressive lag window, the zero covariance of observed lags). Each output is a
buffer that XLA:CPU fills by a thunk of the program's entry computation, and an entry of
independent thunks past a handful runs on XLA:CPU's concurrent executor at a fixed cost
(`benchmarks/RESULTS.md`, "Public calls vs their jitted core"), so `statseq.core.recurrence`
makes the constant leaves outside the program, once, as it does zero-size ones.

`constant_outputs` finds them in the program's jaxpr: an output is constant when it is
computed from literals alone, through nested ``jit`` / ``custom_jvp`` / ``custom_vjp``
calls and the final carry of a scan of at least one step whose body sets it to a
constant (an HMM's ``started`` flag after the step scan), by operations whose NumPy
evaluation is exact (shape operations, conversions, integer and boolean arithmetic,
comparisons, ``min`` / ``max`` and selects; no floating arithmetic or transcendental
functions, whose last bit could differ from XLA's). Anything
else is left in the program, so the values handed back are bitwise those the program would
compute.
"""

from __future__ import annotations

import numpy as np
from jax.extend import core as jcore

#: primitives whose NumPy evaluation equals XLA's bit for bit (floating arithmetic only
#: where marked exact: min, max, negation and selects pick or copy values)
_SHAPE_OPS = {
    "broadcast_in_dim": lambda x, *, shape, broadcast_dimensions, **_: np.broadcast_to(
        np.reshape(x, [x.shape[list(broadcast_dimensions).index(d)]
                       if d in broadcast_dimensions else 1 for d in range(len(shape))]),
        shape),
    "reshape": lambda x, *, new_sizes, dimensions=None, **_: (
        np.reshape(x, new_sizes) if dimensions is None else None),
    "squeeze": lambda x, *, dimensions, **_: np.squeeze(x, tuple(dimensions)),
    "convert_element_type": lambda x, *, new_dtype, **_: _convert(x, new_dtype),
    "concatenate": lambda *xs, dimension, **_: np.concatenate(xs, axis=dimension),
    "transpose": lambda x, *, permutation, **_: np.transpose(x, permutation),
    "rev": lambda x, *, dimensions, **_: np.flip(x, tuple(dimensions)),
    "copy": lambda x, **_: np.array(x),
    "copy_p": lambda x, **_: np.array(x),
    "min": lambda a, b, **_: np.minimum(a, b),
    "max": lambda a, b, **_: np.maximum(a, b),
    "neg": lambda a, **_: np.negative(a),
    "eq": lambda a, b, **_: np.equal(a, b),
    "ne": lambda a, b, **_: np.not_equal(a, b),
    "lt": lambda a, b, **_: np.less(a, b),
    "le": lambda a, b, **_: np.less_equal(a, b),
    "gt": lambda a, b, **_: np.greater(a, b),
    "ge": lambda a, b, **_: np.greater_equal(a, b),
    "select_n": lambda which, *cases, **_: np.choose(np.asarray(which, np.int64), cases),
}

#: exact only on integers and booleans (floating results could round differently)
_INTEGER_OPS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "and": np.bitwise_and, "or": np.bitwise_or, "not": np.invert,
}

#: call-like primitives whose body is looked into, and the parameter holding it
_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
          "core_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
          "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
          "remat": "jaxpr", "checkpoint": "jaxpr"}


def _convert(x, dtype):
    """``x.astype(dtype)`` where NumPy and XLA agree: not a float outside the integer
    target's range, infinite or NaN (XLA saturates, NumPy does not)."""
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.floating) and np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if not (np.all(np.isfinite(x)) and np.all((x > info.min - 1) & (x < info.max + 1))):
            return None
    return x.astype(dtype)


def _iota(*, dtype, shape, dimension, **_):
    ramp = np.arange(shape[dimension]).reshape(
        [-1 if d == dimension else 1 for d in range(len(shape))])
    return np.broadcast_to(ramp, shape).astype(dtype)


def _evaluate(eqn, values):
    """NumPy outputs of one equation whose inputs are all known, or ``None``."""
    name = eqn.primitive.name
    if name == "iota":
        out = _iota(**eqn.params)
    elif name in _SHAPE_OPS:
        out = _SHAPE_OPS[name](*values, **eqn.params)
    elif name in _INTEGER_OPS and all(
            np.issubdtype(v.aval.dtype, np.integer) or v.aval.dtype == bool
            for v in (*eqn.invars, *eqn.outvars)):
        with np.errstate(over="ignore"):  # wraps around, as XLA's integers do
            out = _INTEGER_OPS[name](*values)
    else:
        return None
    if out is None:
        return None
    outvar = eqn.outvars[0]
    out = np.asarray(out)
    if len(eqn.outvars) != 1 or out.shape != tuple(outvar.aval.shape):
        return None
    return [out.astype(outvar.aval.dtype)]


def _known_values(jaxpr, inputs):
    """The NumPy value of each output of ``jaxpr`` that depends on no input, else ``None``
    (``inputs``: one value or ``None`` per input variable; closed-over constants count as
    unknown)."""
    env = dict(zip(jaxpr.invars, inputs, strict=True))

    def read(v):
        if isinstance(v, jcore.Literal):
            return np.asarray(v.val, v.aval.dtype)
        return env.get(v)

    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        body = eqn.params.get(_CALLS.get(eqn.primitive.name, ""), None)
        if body is not None and hasattr(body, "jaxpr") and len(body.jaxpr.invars) == len(
                values):
            outs = _known_values(body.jaxpr, values)
        elif eqn.primitive.name == "scan" and eqn.params["length"] >= 1:
            outs = _scan_final_carry(eqn)
        elif values and all(v is not None for v in values) or (
                not values and eqn.primitive.name == "iota"):
            outs = _evaluate(eqn, values)
        else:
            outs = None
        if outs is None or len(outs) != len(eqn.outvars):
            outs = [None] * len(eqn.outvars)
        for v, out in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, jcore.DropVar):
                env[v] = out
    return [read(v) for v in jaxpr.outvars]


def _scan_final_carry(eqn):
    """A scan of at least one step: its final carry entries that every step sets to a
    constant (the body computes them from literals alone, whatever its inputs); its
    stacked outputs are left unknown."""
    body = eqn.params["jaxpr"].jaxpr
    num_carry = _num_carry(eqn.params)
    if num_carry is None or num_carry > len(eqn.outvars) or len(body.outvars) != len(
            eqn.outvars):
        return None  # (a scan whose layout this does not know: nothing is constant)
    known = _known_values(body, [None] * len(body.invars))
    return known[:num_carry] + [None] * (len(eqn.outvars) - num_carry)


def _num_carry(params):
    """The number of carry leaves of a scan equation: ``num_carry`` (jax 0.10), or the
    leaves of the carry part of ``ft_out`` (jax 0.12: a flat tree ``(carry, ys)``);
    ``None`` when neither is understood."""
    if "num_carry" in params:
        return int(params["num_carry"])
    try:
        carry, _ = params["ft_out"].unpack()
        return len(list(carry.vals))
    except (KeyError, AttributeError, TypeError, ValueError):
        return None


def constant_outputs(closed_jaxpr) -> dict:
    """``{output index: NumPy value}`` for the outputs of ``closed_jaxpr`` (as from
    ``jax.make_jaxpr``) that depend on none of its inputs and are exactly computable in
    NumPy (see the module docstring). Weakly typed outputs are left out (a concrete array
    made outside would not be weak).

    Args:
        closed_jaxpr: a ``ClosedJaxpr``.

    Returns:
        The constant outputs' values, with the outputs' dtypes and shapes.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda x: (x * 2, jnp.ones((2,), bool), jnp.asarray(min(x.shape[0], 3), jnp.int32))
        >>> out = constant_outputs(jax.make_jaxpr(f)(jnp.zeros(5)))
        >>> sorted(out), out[1].tolist(), int(out[2])
        ([1, 2], [True, True], 3)
    """
    jaxpr = closed_jaxpr.jaxpr
    values = _known_values(jaxpr, [None] * len(jaxpr.invars))
    return {i: v for i, (v, var) in enumerate(zip(values, jaxpr.outvars, strict=True))
            if v is not None and not getattr(var.aval, "weak_type", False)}
