"""Eager input validation: runs before anything is traced, names the argument at fault."""

from __future__ import annotations

import functools
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.buckets import _state as _bucket_state
from statseq.core.memo import IdentityMemo


class Prepared(NamedTuple):
    """Data normalized to a flat batch: ``y`` is ``(num_sequences, num_timesteps, *event)``."""

    y: Any
    mask: Any
    inputs: Any
    batch_shape: tuple[int, ...]
    num_timesteps: int
    complete: bool = False  # known (eagerly) to have no masked entries
    # length buckets (``prepare_data(..., bucket=True)``, `statseq.core.buckets`): when the
    # time axis was padded, ``num_valid`` is the real length (``num_timesteps``; the arrays
    # have more steps, masked) and ``valid_complete`` says the real steps have no masked
    # entry (``complete`` is then False, as the padded steps are masked)
    num_valid: int | None = None
    valid_complete: bool = False


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _as_array(x, name: str):
    if _is_tracer(x) or isinstance(x, jax.Array):
        return x
    try:
        arr = np.asarray(x)
    except Exception as err:  # pragma: no cover - exotic inputs
        raise TypeError(f"{name} must be array-like, got {type(x).__name__}") from err
    if arr.dtype == object:
        raise TypeError(f"{name} must be a numeric array, got an array of Python objects")
    return arr


def is_pandas(x) -> bool:
    """Whether ``x`` is a pandas ``Series`` or ``DataFrame`` (duck-typed: no pandas import)."""
    return type(x).__module__.startswith("pandas") and type(x).__name__ in (
        "Series", "DataFrame")


def pandas_values(y, event_ndim: int | None = None, name: str = "y"):
    """The values of a pandas ``Series``/``DataFrame`` as a NumPy array, with its index.

    A ``Series`` is one scalar series, ``(num_timesteps,)`` (``(num_timesteps, 1)`` when
    ``event_ndim == 1``: a model of one-dimensional vectors); a ``DataFrame`` is one vector
    series, ``(num_timesteps, num_columns)`` (columns are emission dimensions), squeezed to
    ``(num_timesteps,)`` when it has one column and ``event_ndim == 0`` (a scalar model).
    These are the rules of `accepted_shapes` (one input convention for every model).
    Missing values (``NaN``, ``None``, ``pd.NA``) come back as ``NaN``. Anything that is
    not a pandas object is returned unchanged with index ``None``.

    Args:
        y: the data.
        event_ndim: number of event axes of the model (``None``: do not squeeze).
        name: the argument's name, for error messages.

    Returns:
        ``(values, index, columns)``; ``index`` and ``columns`` are ``None`` for arrays.
    """
    if not is_pandas(y):
        return y, None, None
    check_time_index(y.index, name)
    columns = getattr(y, "columns", None)
    if columns is None and event_ndim == 1:  # a Series for a model of (1,)-vectors
        y = y.to_frame()
        columns = y.columns
    if columns is not None and event_ndim == 0:
        if len(columns) != 1:
            raise ValueError(
                f"{name} is a DataFrame with {len(columns)} columns, but the model describes "
                "a scalar series: pass a Series (or one column)"
            )
        y, columns = y.iloc[:, 0], None
    values = y.to_numpy()
    if values.dtype == object or not isinstance(values, np.ndarray) or not (
        np.issubdtype(values.dtype, np.number) or values.dtype == bool
    ):
        try:
            values = y.to_numpy(dtype=float, na_value=np.nan)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must hold numbers; got dtype {y.dtypes}") from err
    return values, y.index, columns


def accepted_shapes(model) -> str:
    """The shapes of ``y`` that ``model`` accepts, in words (for error messages).

    The one input convention of statseq: ``y`` is ``batch_shape + (num_timesteps,) +
    model.event_shape``, and

    * for a scalar model (``event_shape == ()``): ``(num_timesteps,)``, a pandas
      ``Series`` or a one-column ``DataFrame`` is one series; ``(num_sequences,
      num_timesteps)`` a batch. A NumPy ``(n, 1)`` array with ``n > 1`` is refused: it
      would be ``n`` sequences of one step under the batch convention, but is more often a
      column vector meant as one series (pass ``y[:, 0]``);
    * for a model of one-dimensional vectors (``event_shape == (1,)``, e.g.
      ``GaussianHMM(emission_dim=1)``): ``(num_timesteps,)`` and a ``Series`` are one
      series, read as ``(num_timesteps, 1)``; ``(num_sequences, num_timesteps, 1)`` a
      batch (a 2-D ``(n, m)`` array with ``m > 1`` is refused: one series has a trailing
      axis of 1);
    * for ``D``-vectors (``event_shape == (D,)``, ``D > 1``): ``(num_timesteps, D)`` or a
      ``D``-column ``DataFrame``; ``(num_sequences, num_timesteps, D)`` a batch.

    Args:
        model: a statseq model (its ``event_shape`` decides).

    Returns:
        The accepted shapes in words, as shape errors quote them after ``Accepted:``.

    Examples:
        >>> import statseq as ss
        >>> accepted_shapes(ss.GaussianHMM(num_states=2)).split(" for ")[0]
        '(num_timesteps,) or (num_timesteps, 1)'
        >>> accepted_shapes(ss.AR(order=1)).split(" for ")[0]
        '(num_timesteps,)'
    """
    event_shape = tuple(model.event_shape)
    if event_shape == ():
        return ("(num_timesteps,) for one series (a pandas Series or one-column DataFrame "
                "is one series), (num_sequences, num_timesteps) for a batch")
    if event_shape == (1,):
        return ("(num_timesteps,) or (num_timesteps, 1) for one series (a pandas Series is "
                "one series), (num_sequences, num_timesteps, 1) for a batch")
    ev = ", ".join(map(str, event_shape))
    return (f"(num_timesteps, {ev}) for one series (a DataFrame with columns as the "
            f"emission dimensions), (num_sequences, num_timesteps, {ev}) for a batch")


def _canonical_shape(y, model, name: str):
    """``y`` (an array or tracer) in the canonical shape ``batch + (T,) + event_shape``,
    or a ``ValueError`` naming `accepted_shapes`: one rule for every model and entry point."""
    event_shape = tuple(model.event_shape)
    event_ndim = len(event_shape)
    shape = tuple(y.shape)
    what = f"{type(model).__name__} (event shape {event_shape})"
    if event_shape == (1,) and len(shape) == 1:
        return y[:, None]  # one series of scalars, for a model of (1,)-vectors
    if event_ndim == 0 and len(shape) >= 2 and shape[-1] == 1 and shape[-2] > 1:
        raise ValueError(
            f"{name} has shape {shape}, which is ambiguous: {what} describes a scalar "
            f"series, and under the batch convention this is {shape[-2]} sequences of one "
            f"step. Accepted: {accepted_shapes(model)}. Pass y[..., 0] for a series of "
            f"{shape[-2]} steps")
    if len(shape) < 1 + event_ndim:
        canonical = ", ".join(("..., num_timesteps",) + tuple(map(str, event_shape)))
        raise ValueError(f"{name} must have shape ({canonical}) for {what}; got shape "
                         f"{shape}. Accepted: {accepted_shapes(model)}")
    if event_ndim and shape[len(shape) - event_ndim:] != event_shape:
        raise ValueError(
            f"{name} has shape {shape}: observations of shape "
            f"{shape[len(shape) - event_ndim:]}, but {what} expects {event_shape} "
            f"(emission_dim). Accepted: {accepted_shapes(model)}")
    return y


def canonical_values(model, y, mask=None, name: str = "y"):
    """``(values, mask)``: ``y`` as a NumPy array in the canonical shape ``batch_shape +
    (num_timesteps,) + model.event_shape`` (`accepted_shapes`), with a pandas object's
    ``NaN`` merged into ``mask``; for entry points that slice or concatenate ``y`` before
    `prepare_data` checks it, so that they follow the same convention.

    Args:
        model: a statseq model.
        y: the data: an array, a list or a pandas ``Series``/``DataFrame``.
        mask: an optional observation mask (``NaN`` of a pandas ``y`` are added to it).
        name: the argument's name, for error messages.

    Returns:
        ``(values, mask)``; a ``ValueError`` naming the accepted shapes if ``y`` has none.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> canonical_values(ss.GaussianHMM(num_states=2), np.zeros(5))[0].shape
        (5, 1)
    """
    event_ndim = len(model.event_shape)
    if is_pandas(y):
        y = pandas_values(y, event_ndim, name)[0]
        mask = _merge_nan_mask(y, mask, event_ndim)
    y = _as_array(y, name)
    if not _is_tracer(y):
        y = np.asarray(y)
    return _canonical_shape(y, model, name), mask


def check_time_index(index, name: str = "y") -> None:
    """``ValueError`` unless a pandas ``index`` is strictly increasing (sorted, unique).

    Rows are read in stored order as consecutive time steps, so an unsorted index or a
    repeated label would silently scramble or duplicate time.
    """
    if len(index) < 2:
        return
    if not index.is_unique:
        dup = index[index.duplicated()][0]
        raise ValueError(f"{name} has a repeated time label ({dup!r}); the index must be "
                         "unique (aggregate or drop duplicates first)")
    if not index.is_monotonic_increasing:
        raise ValueError(f"{name} has an index that is not increasing; rows are read in "
                         "stored order as time steps, so sort it first (y.sort_index())")


def _merge_nan_mask(y, mask, event_ndim):
    """``mask`` with the NaN entries of ``y`` (from a pandas object) masked out."""
    if not np.issubdtype(y.dtype, np.floating):
        return mask
    nan = np.isnan(y)
    if not nan.any():
        return mask
    if mask is None:
        return ~nan
    m = np.asarray(mask)
    if m.dtype != bool and not np.all(np.isin(m, (0, 1))):
        return mask  # not a mask: let its own check name the problem
    step_shape = y.shape[: y.ndim - event_ndim]
    if event_ndim and m.shape == step_shape:
        m = m.reshape(step_shape + (1,) * event_ndim)
    try:
        return np.broadcast_to(m.astype(bool), y.shape) & ~nan
    except ValueError:
        return mask  # a malformed mask: let its own check name the problem


def float_dtype():
    """The default floating dtype (float64 when ``jax_enable_x64`` is on)."""
    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


#: whether the float64 -> float32 warning was given in this process
_WARNED_FLOAT32 = [False]

X64_REMEDY = 'jax.config.update("jax_enable_x64", True)'


def warn_float64_downcast(name: str) -> None:
    """Warn once per process that float64 ``name`` is computed in float32 (x64 is off)."""
    if _WARNED_FLOAT32[0]:
        return
    _WARNED_FLOAT32[0] = True
    warnings.warn(
        f"{name} is float64 but JAX runs in float32 (jax_enable_x64 is off): statseq casts "
        f"float64 data and parameters to float32 and checks them after the cast. For "
        f"float64 results call {X64_REMEDY} before using JAX. (This warning is shown once.)",
        UserWarning, stacklevel=4)


def check_magnitude(arr, dtype, name: str) -> None:
    """``ValueError`` when finite ``arr`` holds values whose square overflows ``dtype``.

    Densities square the data (a Gaussian's ``(y - mu)^2``), so values above
    ``sqrt(finfo(dtype).max)`` (about 1.8e19 in float32, 1.3e154 in float64) would come
    back as ``inf``/``NaN``; such data must be rescaled.
    """
    if not arr.size:
        return
    limit = float(np.sqrt(np.finfo(dtype).max))
    big = np.max(np.abs(arr))
    if big > limit:
        raise ValueError(
            f"{name} has values as large as {big:.3g}, beyond sqrt of the largest "
            f"{np.dtype(dtype).name} ({limit:.3g}): squares overflow. Rescale the data"
            + (f" or call {X64_REMEDY}" if np.dtype(dtype) == np.float32 else ""))


def prepare_data(model, y, mask=None, inputs=None, *, name: str = "y",
                 bucket: bool = False) -> Prepared:
    """Validate ``y``, ``mask`` and ``inputs`` for ``model`` and normalize their shapes.

    ``y`` has shape ``batch_shape + (num_timesteps,) + model.event_shape``. ``mask`` is
    ``None`` (all observed), per time step (``batch_shape + (num_timesteps,)``) or, for
    vector observations, per entry (the shape of ``y``). ``inputs`` has shape
    ``[batch_shape +] (num_timesteps, model.num_inputs)``.

    ``y`` may also be a pandas ``Series`` (a scalar series) or ``DataFrame`` (columns are
    the emission dimensions) with a time index. Its missing values (``NaN``, ``pd.NA``)
    are treated as missing observations: they are masked out (combined with ``mask``), as
    ``mask=statseq.missing_mask(y)`` would do. NumPy arrays with ``NaN`` at observed
    positions are still an error, since there a ``NaN`` is more often a bug than a gap.

    The result for the same JAX array objects (immutable) and an equal model is remembered,
    so repeated calls on one series (a likelihood evaluated at many parameter values)
    check it once (`statseq.core.memo`).

    With ``bucket=True`` the time axis may be padded to a bucket length with masked steps
    (`statseq.core.buckets`); the result's ``num_valid`` then holds the real length.
    """
    given = (y, mask, inputs)
    key = (model, name, tuple(a is None for a in given), float_dtype(), bucket_key(bucket))
    arrays = tuple(a for a in given if a is not None)
    done = _PREPARED.get(key, arrays)
    if done is None:
        done = _prepare_data(model, y, mask, inputs, name, bucket)
        if not any(map(_is_tracer, (done.y, done.mask, done.inputs))):  # not inside a trace
            _PREPARED.put(key, arrays, done)
    return done


#: data (JAX arrays by identity, NumPy arrays by identity and contents, `statseq.core.memo`)
#: already checked and normalized for a model
_PREPARED = IdentityMemo(maxsize=8)


def bucket_key(bucket: bool):
    """What a remembered `prepare_data` result depends on besides the data: the length
    bucket policy (`statseq.set_length_buckets`) when ``bucket`` (else ``False``)."""
    if not bucket:
        return False
    return (_bucket_state["mode"], _bucket_state["exact_lengths"])


def prepare_sized(model, y, mask=None, inputs=None, *, trailing: bool = False,
                  **kwargs) -> tuple[Any, Prepared]:
    """`prepare_data` for a caller that runs the model's filter: ``(model, data)``.

    A model whose filter state is sized from the data's mask (it has ``for_mask``, e.g.
    the exact Gaussian-sum filter of an autoregressive HMM over missing lags) is
    validated in its permissive form (``model.for_mask(None)``) and comes back sized for
    the mask (``model.for_mask(mask, trailing=trailing)``; ``trailing`` also sizes for
    missing values at the end, whose state a forecast starts from). Other models come
    back unchanged. Inside a trace (a traced mask) the model is returned as given.
    """
    sizer = getattr(model, "for_mask", None)
    if sizer is None:
        return model, prepare_data(model, y, mask, inputs, **kwargs)
    given = (y, mask, inputs)
    key = ("sized", model, trailing, tuple(sorted(kwargs.items())),
           tuple(a is None for a in given), float_dtype(), bucket_key(kwargs.get("bucket")))
    arrays = tuple(a for a in given if a is not None)
    done = _PREPARED.get(key, arrays)  # arrays passed again: no mask read back, no sizing
    if done is not None:
        return done
    data = prepare_data(sizer(None), y, mask, inputs, **kwargs)
    if _is_tracer(data.mask):
        return model, prepare_data(model, y, mask, inputs, **kwargs)
    real = np.asarray(data.mask)
    if data.num_valid is not None:
        real = real[:, : data.num_valid]
    done = (sizer(real, trailing=trailing), data)
    _PREPARED.put(key, arrays, done)
    return done


def _prepare_data(model, y, mask, inputs, name, bucket=False) -> Prepared:
    if isinstance(y, jax.Array) and not _is_tracer(y) and len(y.sharding.device_set) > 1:
        # a batch sharded over a device mesh (statseq.distributed, loaded only here): each
        # process checks its own sequences, the flat arrays keep the batch sharding
        from statseq.distributed.data import is_sharded, prepare_sharded

        if is_sharded(y):
            return prepare_sharded(model, y, mask, inputs, name,
                                   lambda m, yy, mm, uu, nn: _prepare_data(m, yy, mm, uu, nn))
    event_shape = tuple(model.event_shape)
    event_ndim = len(event_shape)
    if is_pandas(y):
        y = pandas_values(y, event_ndim, name)[0]
        mask = _merge_nan_mask(y, mask, event_ndim)
    if is_pandas(inputs):
        inputs = inputs.to_numpy(dtype=float)
    y = _as_array(y, name)
    if np.issubdtype(y.dtype, np.complexfloating):
        raise TypeError(f"{name} must be real, got complex dtype {y.dtype} (statseq models "
                        "real-valued series; pass the real and imaginary parts as two columns "
                        "of a vector model)")
    if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):
        raise TypeError(f"{name} must be numeric, got dtype {y.dtype}")
    y = _canonical_shape(y, model, name)
    batch_shape = tuple(y.shape[: y.ndim - 1 - event_ndim])
    num_timesteps = int(y.shape[y.ndim - 1 - event_ndim])
    if num_timesteps < 1:
        raise ValueError(f"{name} has no time steps (num_timesteps = 0)")
    if int(np.prod(batch_shape, dtype=int)) == 0:
        raise ValueError(f"{name} has no sequences (batch shape {batch_shape})")

    step_shape = tuple(y.shape[: y.ndim - event_ndim])
    if mask is None:
        mask_arr = np.ones(y.shape, bool) if not _is_tracer(y) else jnp.ones(y.shape, bool)
    else:
        mask_arr = _as_array(mask, "mask")
        if not _is_tracer(mask_arr):
            if mask_arr.dtype != bool:
                if not np.all(np.isin(mask_arr, (0, 1))):
                    raise ValueError("mask must be boolean (True = observed) or 0/1")
                mask_arr = mask_arr.astype(bool)
        if tuple(mask_arr.shape) == step_shape:
            mask_arr = jnp.broadcast_to(
                jnp.reshape(mask_arr, step_shape + (1,) * event_ndim), y.shape
            ) if _is_tracer(mask_arr) else np.broadcast_to(
                mask_arr.reshape(step_shape + (1,) * event_ndim), y.shape
            )
        elif tuple(mask_arr.shape) != tuple(y.shape):
            raise ValueError(
                f"mask must have shape {step_shape} (per time step)"
                + (f" or {tuple(y.shape)} (per entry)" if event_ndim else "")
                + f"; got {tuple(mask_arr.shape)}"
            )
        if (
            event_ndim
            and not model.supports_partial_mask
            and not _is_tracer(mask_arr)
            and np.any(np.any(mask_arr, axis=tuple(range(-event_ndim, 0)))
                       != np.all(mask_arr, axis=tuple(range(-event_ndim, 0))))
        ):
            raise ValueError(
                f"{type(model).__name__} cannot marginalize a subset of emission dimensions; "
                "mask whole time steps instead"
            )

    if not _is_tracer(y) and not _is_tracer(mask_arr):
        y_np = np.asarray(y)
        bad = ~np.isfinite(y_np) & np.asarray(mask_arr) if np.issubdtype(
            y_np.dtype, np.floating
        ) else np.zeros(y_np.shape, bool)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"{name} has {int(bad.sum())} non-finite value(s) at observed positions "
                f"(first at index {first}); mark missing values with mask=False "
                "(statseq.missing_mask(y) builds such a mask)"
            )
        observed = y_np if mask is None else np.where(mask_arr, y_np, 0)
        model.validate_data(observed, np.asarray(mask_arr))
        if model.observation_dtype == "real":
            if y_np.dtype == np.float64 and float_dtype() == jnp.float32:
                warn_float64_downcast(name)
            check_magnitude(observed, float_dtype(), name)
        elif observed.size and np.max(np.abs(observed)) > np.iinfo(np.int32).max:
            raise ValueError(
                f"{name} has values as large as {np.max(np.abs(observed)):.6g}, beyond the "
                f"int32 range ({np.iinfo(np.int32).max}) in which statseq computes with "
                "counts and categories; rescale (e.g. counts in thousands)")

    dtype = float_dtype() if model.observation_dtype == "real" else jnp.int32
    eager = not (_is_tracer(y) or _is_tracer(mask_arr) or _is_tracer(inputs))
    # eagerly, clean and reshape in NumPy and transfer once: each eager jnp op costs a
    # dispatch, which dominated short calls
    xp = np if eager else jnp
    if model.observation_dtype == "real" and eager and mask is None:
        # checked finite above; a JAX array of the right dtype is used as it is
        y_clean = y if (isinstance(y, jax.Array) and y.dtype == dtype) else np.asarray(
            y).astype(dtype, copy=False)
    elif model.observation_dtype == "real":
        y_clean = xp.where(xp.asarray(mask_arr), xp.asarray(y).astype(dtype), 0.0)
    else:
        y_clean = xp.where(xp.asarray(mask_arr), xp.asarray(y), 0).astype(dtype)

    num_inputs = model.num_inputs
    if num_inputs == 0:
        if inputs is not None:
            raise ValueError(
                f"{type(model).__name__} takes no inputs (input_dim=0), but inputs were given"
            )
        inputs_arr = xp.zeros(batch_shape + (num_timesteps, 0), float_dtype())
    else:
        if inputs is None:
            raise ValueError(
                f"{type(model).__name__} has input_dim={num_inputs}: pass inputs of shape "
                f"(num_timesteps, {num_inputs})"
            )
        inputs_arr = _as_array(inputs, "inputs")
        if inputs_arr.ndim < 2 or inputs_arr.shape[-2:] != (num_timesteps, num_inputs):
            raise ValueError(
                f"inputs must have shape [batch_shape +] ({num_timesteps}, {num_inputs}) to "
                f"match y; got {tuple(inputs_arr.shape)}"
            )
        if inputs_arr.ndim > 2 and tuple(inputs_arr.shape[:-2]) != batch_shape:
            raise ValueError(
                f"inputs have batch shape {tuple(inputs_arr.shape[:-2])} but y has {batch_shape}"
            )
        if not _is_tracer(inputs_arr) and not np.all(np.isfinite(np.asarray(inputs_arr))):
            raise ValueError("inputs contain non-finite values (inputs cannot be missing)")
        inputs_arr = xp.broadcast_to(
            xp.asarray(inputs_arr).astype(float_dtype()), batch_shape + (num_timesteps, num_inputs)
        )

    flat = (int(np.prod(batch_shape, dtype=int)), num_timesteps)
    if bucket and eager:  # length buckets: statseq.core.buckets (owned there)
        from statseq.core import buckets

        length = buckets.padded_length(num_timesteps, model)
        if length is not None:
            return _bucketed(y_clean, mask, mask_arr, inputs_arr, flat, event_shape,
                             num_inputs, length, batch_shape)
    # eagerly, NumPy arrays are transferred with device_put: jnp.asarray compiled a small
    # program per shape, which piled up over many lengths (statseq.core.buckets)
    put = jax.device_put if eager else jnp.asarray
    if eager and mask is None:  # an all-True mask: one shared device array per shape
        mask_dev = _device_constant(flat + event_shape, "bool", True)
    else:
        mask_dev = put(xp.reshape(xp.asarray(mask_arr), flat + event_shape))
    if eager and num_inputs == 0:
        inputs_dev = _device_constant(flat + (0,), np.dtype(float_dtype()).name, 0)
    else:
        inputs_dev = put(xp.reshape(inputs_arr, flat + (num_inputs,)))
    if eager and y_clean is y and isinstance(y, jax.Array):  # reshape it on the device
        y_dev = _reshape(y, flat + event_shape)
    else:
        y_dev = put(xp.reshape(y_clean, flat + event_shape))
    return Prepared(
        y=y_dev,
        mask=mask_dev,
        inputs=inputs_dev,
        batch_shape=batch_shape,
        num_timesteps=num_timesteps,
        complete=bool(mask is None or (not _is_tracer(mask_arr) and np.all(mask_arr))),
    )


def _bucketed(y_clean, mask, mask_arr, inputs_arr, flat, event_shape, num_inputs, length,
              batch_shape) -> Prepared:
    """The flat arrays padded in NumPy to ``length`` steps, padded steps masked; built on
    the host and transferred, so that no program is compiled per real length."""
    from statseq.core.buckets import pad_time

    y_np = np.asarray(y_clean).reshape(flat + event_shape)
    full = mask is None or bool(np.all(mask_arr))
    mask_np = np.ones(flat + event_shape, bool) if mask is None else np.asarray(
        mask_arr).reshape(flat + event_shape)
    inputs_np = np.asarray(inputs_arr).reshape(flat + (num_inputs,))
    return Prepared(
        y=jax.device_put(pad_time(y_np, length)),
        mask=jax.device_put(pad_time(mask_np, length, False)),
        inputs=jax.device_put(pad_time(inputs_np, length)),
        batch_shape=batch_shape,
        num_timesteps=flat[1],
        complete=False,
        num_valid=flat[1],
        valid_complete=full,
    )


@functools.partial(jax.jit, static_argnums=1)
def _reshape(x, shape):
    """``x.reshape(shape)`` as one compiled call (an eager reshape costs about 3x more)."""
    return jnp.reshape(x, shape)


@functools.lru_cache(maxsize=32)
def _device_constant(shape: tuple, dtype: str, value):
    """A device array of ``shape`` filled with ``value`` (JAX arrays are immutable, so one
    can serve every call with that shape); concrete even when called under a trace."""
    # built in NumPy and transferred: ``jnp.full`` compiled a program per shape, which
    # piled up over many lengths (statseq.core.buckets)
    with jax.ensure_compile_time_eval():
        return jax.device_put(np.full(shape, value, dtype))


def observed_entries(mask, y):
    """A per-step ``(T,)`` or per-entry ``(T, ...)`` mask as booleans of ``y``'s shape
    (``True`` where observed), inside or outside a trace."""
    mask = jnp.asarray(mask, bool)
    return jnp.broadcast_to(jnp.reshape(mask, mask.shape + (1,) * (jnp.ndim(y) - mask.ndim)),
                            jnp.shape(y))


def missing_mask(y):
    """``True`` where ``y`` is finite: the mask to pass for data with NaN gaps.

    Examples:
        >>> import numpy as np
        >>> missing_mask(np.array([1.0, np.nan, 3.0]))
        array([ True, False,  True])
    """
    return np.isfinite(np.asarray(y, float))


def pad_sequences(sequences, *, pad_value=0.0):
    """Stack sequences of different lengths into a padded batch and its mask.

    Args:
        sequences: a list of arrays of shape ``(num_timesteps_i,) + event_shape``.
        pad_value: value written into the padding (it is never read: the mask hides it).

    Returns:
        ``(y, mask)``: ``y`` of shape ``(num_sequences, max_timesteps) + event_shape`` and
        per-step booleans ``mask`` of shape ``(num_sequences, max_timesteps)``.

    Examples:
        >>> y, mask = pad_sequences([np.ones(3), np.ones(2)])
        >>> y.shape, mask.sum(axis=1).tolist()
        ((2, 3), [3, 2])
    """
    arrays = [np.asarray(s) for s in sequences]
    if not arrays:
        raise ValueError("sequences is empty")
    event_shapes = {a.shape[1:] for a in arrays}
    if len(event_shapes) != 1 or any(a.ndim < 1 for a in arrays):
        raise ValueError(
            f"every sequence must have shape (num_timesteps,) + event_shape with one common "
            f"event shape; got shapes {[a.shape for a in arrays]}"
        )
    (event_shape,) = event_shapes
    max_len = max(a.shape[0] for a in arrays)
    dtype = np.result_type(*arrays)
    y = np.full((len(arrays), max_len) + event_shape, pad_value, dtype=dtype)
    mask = np.zeros((len(arrays), max_len), bool)
    for i, a in enumerate(arrays):
        y[i, : a.shape[0]] = a
        mask[i, : a.shape[0]] = True
    return y, mask


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    """``value`` as an int, or a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def all_observed(mask) -> bool:
    """Whether every entry of a concrete ``mask`` is ``True`` (also for a mask spread over
    processes, `statseq.distributed`, where it is one reduction all processes agree on)."""
    if isinstance(mask, jax.Array) and not mask.is_fully_addressable:
        from statseq.distributed.data import global_any

        return not global_any(~mask)
    return bool(np.all(np.asarray(mask)))


def require_observed(data: Prepared, method: str) -> None:
    """``ValueError`` when nothing in the prepared data is observed: a fit to no data.

    (Likelihoods of all-missing data are well defined, ``log p = 0``, the empty product;
    maximizing that is not.)
    """
    mask = data.mask
    if isinstance(mask, jax.Array) and not _is_tracer(mask) and not mask.is_fully_addressable:
        # spread over processes (statseq.distributed): one reduction every process agrees on
        from statseq.distributed.data import global_any

        if not global_any(mask):
            raise ValueError(f"{method}: y has no observed values (every entry is masked or "
                             "missing): there is nothing to fit")
        return
    if not _is_tracer(mask) and not np.any(np.asarray(mask)):
        raise ValueError(f"{method}: y has no observed values (every entry is masked or "
                         "missing): there is nothing to fit")


def check_key(key, name: str = "key"):
    """``key`` if it is one JAX random key, else a clear error naming ``name``.

    Accepts a new-style typed key (``jax.random.key(0)``, shape ``()``) and a raw ``uint32``
    key (``jax.random.PRNGKey(0)``, shape ``(2,)``, or ``(4,)`` under the ``rbg``
    implementation), concrete or traced.

    Raises:
        TypeError: ``None``, a Python or NumPy number (``use jax.random.key(0)``), an array
            of another dtype (floats, signed integers, booleans) or a non-array.
        ValueError: a key array of the wrong shape (e.g. a batch of keys).

    Examples:
        >>> import jax
        >>> check_key(jax.random.key(0)).shape
        ()
        >>> check_key(0)
        Traceback (most recent call last):
        ...
        TypeError: key must be a JAX random key, got the int 0: use jax.random.key(0)
    """
    hint = "use jax.random.key(0)"
    if key is None:
        raise TypeError(f"{name} must be a JAX random key, got None: {hint}")
    if isinstance(key, bool | int | float | complex | np.number | np.bool_):
        if isinstance(key, int | np.integer) and not isinstance(key, bool | np.bool_):
            hint = f"use jax.random.key({int(key)})"
        raise TypeError(f"{name} must be a JAX random key, got the {type(key).__name__} "
                        f"{key!r}: {hint}")
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    if dtype is None or shape is None:
        raise TypeError(f"{name} must be a JAX random key, got {type(key).__name__}: {hint}")
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if tuple(shape) != ():
            raise ValueError(f"{name} must be one random key (shape ()), got a key array of "
                             f"shape {tuple(shape)}; split it and pass one key")
        return key
    if np.dtype(dtype) != np.uint32:
        raise TypeError(f"{name} must be a JAX random key, got an array of dtype {dtype}: "
                        f"{hint} (or a raw uint32 key from jax.random.PRNGKey)")
    if tuple(shape) not in ((2,), (4,)):
        raise ValueError(f"{name} must be one random key: a raw uint32 key has shape (2,), "
                         f"got shape {tuple(shape)}; {hint}")
    return key
