"""Causal attention-free transformer (AFT) sums, stabilized by a running maximum.

Zhai et al. (2021), *An attention free transformer* (arXiv:2105.14103), eq. 2: for keys
``K``, values ``V`` (``T x d``) and learned pairwise position biases ``w_{t,t'}``,

    Y_t = sigmoid(Q_t) * sum_{t'} exp(K_{t'} + w_{t,t'}) * V_{t'} / sum_{t'} exp(K_{t'} + w_{t,t'})

(elementwise over the ``d`` channels). Here it is causal (``t' <= t``, the paper's
autoregressive variant) and this module computes the weighted average
``a_t = sum_{t'<=t} exp(K_{t'} + w_{t,t'}) V_{t'} / sum_{t'<=t} exp(K_{t'} + w_{t,t'})``
(the layer multiplies by ``sigmoid(Q_t)``). The variants differ in ``w``:

* **AFT-simple** (``window = 0``): ``w = 0``, a running softmax-weighted average of the
  values;
* **AFT-local** (window ``s >= 1``): ``w_{t,t'}`` learned for the lags ``t - t' < s``
  and 0 outside (outside the window the keys still count, with bias 0, as in the paper);
* **AFT-full**: AFT-local with ``s = T_max``, every pair of a sequence of up to
  ``T_max`` steps has its own bias.

The biases are stored by lag, ``bias[t, j] = w_{t, t-j}`` (``T_max x s``; entries with
``j > t`` are never used). **Beyond ``T_max``** (generation past the longest sequence
the model was built for), row ``T_max - 1`` is reused, ``w_{t,t-j} = bias[T_max - 1, j]``
for ``t >= T_max``, and lags ``>= s`` get bias 0: AFT-full continues as AFT-local with
window ``T_max`` and the last row's biases. (The paper fixes ``T`` and has no rule.)

**Stabilization.** The exponents ``K_{t'} + w`` can be large (``exp(100)`` overflows
float32). Every form keeps, per channel, the maximum ``m`` of the exponents summed so far
and the sums scaled by ``exp(-m)`` (as a log-sum-exp scan): folding in an exponent ``e``
with value ``v``,

    m' = max(m, e),  num' = num exp(m - m') + exp(e - m') v,  den' = den exp(m - m') + exp(e - m'),

so no ``exp`` ever sees a positive argument. ``a_t = num / den`` does not depend on
``m``, so ``m`` is held constant in differentiation (`jax.lax.stop_gradient`, as
log-sum-exp does) and ties in the maximum never reach a gradient.

**Recurrent form** (generation): the state holds the stabilized sums ``(m, num, den)`` of
the positions that have left the window (bias 0), the last ``s - 1`` keys and values,
and the step count ``t``; one step costs ``O(s d)``. **Parallel form**: the ``T x T``
(``x d``) exponent matrix with a per-row maximum, ``O(T^2 d)`` memory. Both start from
any state.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["AFTState", "aft_initial_state", "aft_parallel", "aft_recurrent", "aft_step"]


class AFTState(NamedTuple):
    """The recurrent state of a causal AFT sum (``d`` channels, window ``s``).

    Attributes:
        max: ``(d,)`` the largest exponent folded into ``num`` and ``den`` (``-inf``
            before any).
        num: ``(d,)`` ``sum exp(K_{t'} - max) V_{t'}`` over the positions out of the window.
        den: ``(d,)`` ``sum exp(K_{t'} - max)`` over the same positions.
        keys: ``(max(s - 1, 0), d)`` the last ``s - 1`` keys, oldest first (zeros before
            the start).
        values: ``(max(s - 1, 0), d)`` their values.
        time: ``()`` the number of steps taken, ``t`` (a float: the state is one dtype).
    """

    max: jax.Array
    num: jax.Array
    den: jax.Array
    keys: jax.Array
    values: jax.Array
    time: jax.Array


def aft_initial_state(dim: int, window: int, dtype) -> AFTState:
    """The state before the first step: nothing folded, a zero buffer, ``t = 0``.

    Args:
        dim: channels ``d``.
        window: ``s`` (0 for AFT-simple).
        dtype: a float dtype.

    Returns:
        `AFTState`.
    """
    buf = jnp.zeros((max(window - 1, 0), dim), dtype)
    zeros = jnp.zeros((dim,), dtype)
    return AFTState(jnp.full((dim,), -jnp.inf, dtype), zeros, zeros, buf, buf,
                    jnp.zeros((), dtype))


def _safe(m):
    """``m`` with ``-inf`` (nothing summed yet) replaced by 0, held constant."""
    m = jax.lax.stop_gradient(m)
    return jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m))


def _fold(mx, num, den, e, v, axis=None):
    """Fold exponents ``e`` (``-inf`` for none) with values ``v`` into ``(mx, num, den)``;
    with ``axis`` many at once (summed along it)."""
    mx = jax.lax.stop_gradient(mx)
    e_max = e if axis is None else jnp.max(e, axis=axis)
    top = jax.lax.stop_gradient(jnp.maximum(mx, e_max))
    new = _safe(top)
    scale = jnp.exp(mx - new)
    w = jnp.exp(e - (new if axis is None else jnp.expand_dims(new, axis)))
    if axis is None:
        return top, num * scale + w * v, den * scale + w
    return top, num * scale + jnp.sum(w * v, axis=axis), den * scale + jnp.sum(w, axis=axis)


def _bias_rows(bias, times):
    """Rows ``min(t, T_max - 1)`` of ``bias`` for integer ``times``."""
    return bias[jnp.minimum(times, bias.shape[0] - 1)]


def aft_step(state: AFTState, k, v, bias, window: int):
    """One step of the recurrent form.

    Args:
        state: `AFTState` after ``t`` steps.
        k: ``(d,)`` key ``K_t``.
        v: ``(d,)`` value ``V_t``.
        bias: ``(T_max, s)`` position biases by lag (ignored for ``window = 0``).
        window: ``s`` (0: AFT-simple).

    Returns:
        ``(new_state, a_t (d,))`` with ``a_t`` the weighted average of ``V_{0..t}``.
    """
    if window == 0:
        mx, num, den = _fold(state.max, state.num, state.den, k, v)
        return state._replace(max=mx, num=num, den=den, time=state.time + 1), num / den
    t = state.time.astype(jnp.int32)
    seq_k = jnp.concatenate([state.keys, k[None]])  # (s, d): lags s-1, ..., 0
    seq_v = jnp.concatenate([state.values, v[None]])
    lags = window - 1 - jnp.arange(window)
    valid = t - lags >= 0
    e = jnp.where(valid[:, None], seq_k + _bias_rows(bias, t)[lags][:, None], -jnp.inf)
    _, num, den = _fold(state.max, state.num, state.den, e, seq_v, axis=0)
    # the oldest (lag s - 1) leaves the window: fold it in with bias 0
    mx, fnum, fden = _fold(state.max, state.num, state.den,
                           jnp.where(valid[0], seq_k[0], -jnp.inf), seq_v[0])
    new = AFTState(mx, fnum, fden, seq_k[1:], seq_v[1:], state.time + 1)
    return new, num / den


def aft_recurrent(state: AFTState, k, v, bias, window: int):
    """The recurrent form over a sequence: `jax.lax.scan` of `aft_step`.

    Args:
        state: `AFTState` before the first step.
        k: ``(T, d)`` keys.
        v: ``(T, d)`` values.
        bias: ``(T_max, s)`` position biases by lag (ignored for ``window = 0``).
        window: ``s`` (0: AFT-simple).

    Returns:
        ``(final_state, a (T, d))``.
    """
    return jax.lax.scan(lambda st, kv: aft_step(st, *kv, bias, window), state, (k, v))


def aft_parallel(state: AFTState, k, v, bias, window: int):
    """The parallel form: every exponent ``K_{t'} + w_{t,t'}`` at once, ``O(T^2 d)`` memory.

    Args:
        state: `AFTState` before the first step (time ``t0``).
        k: ``(T, d)`` keys.
        v: ``(T, d)`` values.
        bias: ``(T_max, s)`` position biases by lag (ignored for ``window = 0``).
        window: ``s`` (0: AFT-simple).

    Returns:
        ``(final_state, a (T, d))``, equal to `aft_recurrent` up to rounding.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> k, v = jax.random.normal(jax.random.key(0), (2, 6, 3)) * 50.0
        >>> bias = jax.random.normal(jax.random.key(1), (8, 2))
        >>> st = aft_initial_state(3, 2, k.dtype)
        >>> a = aft_parallel(st, k, v, bias, 2)[1]
        >>> b = aft_recurrent(st, k, v, bias, 2)[1]
        >>> bool(jnp.allclose(a, b, rtol=1e-5, atol=1e-4))
        True
    """
    t_len, buf = k.shape[0], max(window - 1, 0)
    t0 = state.time.astype(jnp.int32)
    all_k = jnp.concatenate([state.keys, k])  # (B + T, d): positions t0 - B + i
    all_v = jnp.concatenate([state.values, v])
    i = jnp.arange(buf + t_len)
    j = jnp.arange(t_len)
    lag = buf + j[:, None] - i[None, :]  # query t0 + j, key t0 - B + i
    valid = (lag >= 0) & (t0 - buf + i[None, :] >= 0)
    if window > 0:
        rows = _bias_rows(bias, t0 + j)  # (T, s)
        w = jnp.take_along_axis(rows, jnp.clip(lag, 0, window - 1), axis=1)
        w = jnp.where(lag < window, w, 0.0)
    else:
        w = jnp.zeros(lag.shape, k.dtype)
    e = jnp.where(valid[:, :, None], all_k[None] + w[:, :, None], -jnp.inf)  # (T, B+T, d)
    _, num, den = _fold(state.max, state.num, state.den, e, all_v[None], axis=1)
    # positions t0 - B .. t0 - B + T - 1 leave the window (bias 0), the last B stay
    out_valid = t0 - buf + jnp.arange(t_len) >= 0
    mx, fnum, fden = _fold(state.max, state.num, state.den,
                           jnp.where(out_valid[:, None], all_k[:t_len], -jnp.inf),
                           all_v[:t_len], axis=0)
    new = AFTState(mx, fnum, fden, all_k[t_len:], all_v[t_len:],
                   state.time + jnp.asarray(t_len, state.time.dtype))
    return new, num / den


#: The whole-sequence forms by mode name.
MODES = {"recurrent": aft_recurrent, "parallel": aft_parallel}
