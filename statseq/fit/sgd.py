"""Gradient fitting of any statseq model with optax, compiled as one loop.

The objective is the un-normalized negative log joint,

    L(theta) = -[ log p(y | theta) + log p(theta) ],

minimized over unconstrained parameters (``biject_to`` of each leaf's constraint). It is
in the same units as the EM trace, so fits by different methods share one axis.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from statseq.core.buckets import bound_cache
from statseq.core.params import (
    finish_fit,
    log_prior,
    validate_params,
    validate_priors,
)
from statseq.core.recurrence import run_filter
from statseq.core.restrict import expand_compiled, restrict
from statseq.core.results import FitResult
from statseq.core.validation import (
    all_observed,
    check_key,
    check_positive_int,
    float_dtype,
    prepare_sized,
    require_observed,
)
from statseq.fit import _progress

_STOP_NONE, _STOP_EARLY, _STOP_NONFINITE = 0, 1, 2


def _split_validation(data, validation, key, scored=None):
    """Train and validation sets: a time split for one sequence, a sequence split else.

    ``scored`` (``(num_sequences, num_timesteps)`` booleans or ``None``) marks the steps
    that count in the objective; the train set carries it as its fourth entry.
    """
    num_seq, num_t = data.y.shape[0], data.num_timesteps
    if validation is None:
        return (data.y, data.mask, data.inputs, scored), None
    if not 0.0 < float(validation) < 1.0:
        raise ValueError(f"validation must be a fraction in (0, 1), got {validation}")
    if data.batch_shape == ():
        num_val = max(1, int(round(validation * num_t)))
        if num_val >= num_t:
            raise ValueError("validation leaves no time steps to train on")
        step_in_train = (jnp.arange(num_t) < num_t - num_val).reshape(
            (1, num_t) + (1,) * (data.y.ndim - 2)
        )
        train = (data.y, data.mask & step_in_train, data.inputs, scored)
        val_scored = ~step_in_train.reshape(1, num_t)
        if scored is not None:
            val_scored = val_scored & scored
        return train, (data.y, data.mask, data.inputs, val_scored)
    num_val = max(1, int(round(validation * num_seq)))
    if num_val >= num_seq:
        raise ValueError("validation leaves no sequences to train on")
    perm = np.asarray(jax.random.permutation(key, num_seq))
    tr, va = perm[num_val:], perm[:num_val]
    train = (data.y[tr], data.mask[tr], data.inputs[tr], None if scored is None else scored[tr])
    val_scored = jnp.ones((num_val, num_t), bool) if scored is None else scored[va]
    return train, (data.y[va], data.mask[va], data.inputs[va], val_scored)


@partial(
    jax.jit,
    static_argnames=(
        "model", "optimizer", "num_steps", "batch_size", "eval_every", "progress_every",
        "train_complete", "val_complete",
    ),
)
def _fit_sgd_compiled(model, optimizer, restriction, priors, train, val, key,
                      clip_norm, hyper, patience, min_steps, *,
                      num_steps, batch_size, eval_every, progress_every,
                      train_complete=False, val_complete=False):
    # patience, min_steps and the hyperparameters ``hyper`` (``{name: value}`` for an
    # optimizer built by optax.inject_hyperparams, else None) are traced: fits that differ
    # only in them share one program
    y_tr, m_tr, u_tr, s_tr = train
    num_train = y_tr.shape[0]
    scale = num_train / batch_size
    dtype = float_dtype()

    uparams, trainable = restriction.z0, restriction.keep  # the free vector and its mask

    def log_joint(up, idx):
        params = restriction.expand(model, up)
        lp, lps, *_ = run_filter(
            model, params, y_tr[idx], m_tr[idx], u_tr[idx], complete=train_complete
        )
        if s_tr is not None:  # only the scored steps count (e.g. after a window's warmup)
            lp = jnp.sum(jnp.where(s_tr[idx], lps, 0.0), axis=-1)
        return scale * jnp.sum(lp) + log_prior(priors, params)

    def val_score(up):
        if val is None:
            return jnp.zeros((), dtype)
        y_va, m_va, u_va, scored = val
        _, lps, _, _ = run_filter(
            model, restriction.expand(model, up), y_va, m_va, u_va, complete=val_complete
        )
        return jnp.sum(jnp.where(scored, lps, 0.0))

    num_evals = max(1, num_steps // eval_every) if val is not None else 1

    def body(state):
        i, up, good_up, opt_state, trace, vtrace, best_up, best_val, bad, stop = state
        if batch_size < num_train:
            idx = jax.random.choice(
                jax.random.fold_in(key, i), num_train, (batch_size,), replace=False
            )
        else:
            idx = jnp.arange(num_train)
        value, grads = jax.value_and_grad(log_joint)(up, idx)
        grads = jax.tree.map(lambda g, t: jnp.where(t, -g, 0.0), grads, trainable)
        finite = jnp.isfinite(value) & jnp.all(
            jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)])
        )
        # the last parameters whose objective was finite are what a diverged fit returns
        good_up = jax.tree.map(lambda u, g: jnp.where(finite, u, g), up, good_up)
        grad_norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads)))
        shrink = jnp.minimum(1.0, clip_norm / jnp.maximum(grad_norm, 1e-30))
        grads = jax.tree.map(lambda g: g * shrink, grads)
        updates, new_opt = optimizer.update(grads, opt_state, up)
        new_up = optax.apply_updates(up, updates)
        new_up = jax.tree.map(lambda n, o, t: jnp.where(t & finite, n, o), new_up, up, trainable)
        new_opt = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_opt, opt_state)
        trace = trace.at[i].set(jnp.where(finite, value, jnp.nan))
        stop = jnp.where(finite, stop, _STOP_NONFINITE)
        if progress_every:
            jax.lax.cond(
                (i % progress_every == 0) | (i == num_steps - 1),
                lambda: jax.debug.callback(_progress.report, i, value),
                lambda: None,
            )
        if val is not None:
            def evaluate(carry):
                vtrace, best_up, best_val, bad, stop = carry
                score = val_score(new_up)
                vtrace = vtrace.at[i // eval_every].set(score)
                better = score > best_val
                best_up = jax.tree.map(lambda n, b: jnp.where(better, n, b), new_up, best_up)
                best_val = jnp.where(better, score, best_val)
                # evaluations up to step `min_steps` (e.g. a learning-rate warm-up) still
                # track the best parameters but do not count towards `patience`
                counts = i + 1 > min_steps
                bad = jnp.where(better, 0, jnp.where(counts, bad + 1, 0))
                stop = jnp.where((bad >= patience) & (stop == _STOP_NONE), _STOP_EARLY, stop)
                return vtrace, best_up, best_val, bad, stop

            vtrace, best_up, best_val, bad, stop = jax.lax.cond(
                finite & ((i + 1) % eval_every == 0),
                evaluate, lambda c: c, (vtrace, best_up, best_val, bad, stop),
            )
        return i + 1, new_up, good_up, new_opt, trace, vtrace, best_up, best_val, bad, stop

    def cond(state):
        i, *_, stop = state
        return (i < num_steps) & (stop == _STOP_NONE)

    opt_state = optimizer.init(uparams)
    if hyper is not None:  # the learning rate (and so on) of this call, traced
        opt_state = opt_state._replace(hyperparams={
            **opt_state.hyperparams,
            **{k: jnp.asarray(v, opt_state.hyperparams[k].dtype) for k, v in hyper.items()}})
    init = (
        jnp.zeros((), jnp.int32), uparams, uparams, opt_state,
        jnp.full((num_steps,), jnp.nan, dtype), jnp.full((num_evals,), jnp.nan, dtype),
        uparams, jnp.asarray(-jnp.inf, dtype), jnp.zeros((), jnp.int32),
        jnp.asarray(_STOP_NONE, jnp.int32),
    )
    i, up, good_up, _, trace, vtrace, best_up, best_val, _, stop = jax.lax.while_loop(
        cond, body, init
    )
    up = jax.tree.map(lambda u, g: jnp.where(stop == _STOP_NONFINITE, g, u), up, good_up)
    return i, up, trace, vtrace, best_up, best_val, stop


def _optimizer(optimizer, learning_rate):
    """``(optax optimizer, traced hyperparameters or None)`` for `fit_sgd`."""
    if (optimizer is None) == (learning_rate is None):
        raise TypeError("fit_sgd needs exactly one of optimizer= (an optax "
                        "GradientTransformation, e.g. optax.adam(1e-2)) and learning_rate= "
                        "(a positive number: Adam with that step size)")
    if optimizer is not None:
        if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
            raise TypeError("optimizer must be an optax GradientTransformation, e.g. "
                            "optax.adam(1e-2)")
        return optimizer, None
    try:
        rate = float(learning_rate)
    except (TypeError, ValueError) as err:
        raise TypeError(f"learning_rate must be a number, got "
                        f"{type(learning_rate).__name__}") from err
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"learning_rate must be positive and finite, got {learning_rate}")
    return _default_optimizer(), {"learning_rate": np.asarray(rate, float_dtype())}


def _check_scored(scored, data):
    """``scored`` as ``(num_sequences, num_timesteps)`` booleans, or ``None``."""
    if scored is None:
        return None
    arr = np.asarray(scored)
    shape = data.batch_shape + (data.num_timesteps,)
    if arr.shape != shape:
        raise ValueError(f"scored must have shape {shape} (one flag per time step of y); "
                         f"got {arr.shape}")
    if arr.dtype != bool:
        if not np.all(np.isin(arr, (0, 1))):
            raise ValueError("scored must be boolean (True = counts in the objective) or 0/1")
        arr = arr.astype(bool)
    if not arr.any():
        raise ValueError("scored marks no time step: nothing to fit")
    return jnp.asarray(arr.reshape(-1, data.num_timesteps))


@functools.cache
def _default_optimizer():
    """Adam with its learning rate injected as a hyperparameter (`fit_sgd`'s
    ``learning_rate``): one object, so one compiled program serves every learning rate."""
    return optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)


def fit_sgd(model, params, y, *, num_steps, key, optimizer=None, learning_rate=None,
            mask=None, inputs=None, batch_size=None, trainable=None, priors=None,
            clip_norm=None, validation=None, eval_every=None, patience=None, min_steps=0,
            progress=True, scored=None, ties=None) -> FitResult:
    """Fit ``model`` by stochastic gradient ascent on the log joint, with optax.

    Maximizes ``log p(y | theta) + log p(theta)`` (the log-likelihood plus the log prior
    when ``priors`` are given: a MAP estimate in the natural parameterization) over the
    unconstrained parameters. The whole loop, minibatching and early stopping included,
    is one compiled ``lax.while_loop``.

    Args:
        model: a statseq model.
        params: starting parameters.
        y: ``batch_shape + (num_timesteps,) + event_shape``.
        num_steps: maximum number of optimizer steps.
        key: a ``jax.random`` key (minibatches and the validation split).
        optimizer: an optax ``GradientTransformation`` (e.g. ``optax.adam(1e-2)``). It is
            part of the compiled program: build it once and pass the same object to
            repeated fits to reuse the compilation (a new ``optax.adam(...)`` per call
            retraces; the persistent cache then saves most, not all, of the compile).
            Weight decay: ``optax.adamw(lr, weight_decay=w)`` (the optimizer receives
            the unconstrained parameters, which it decays towards 0). Give either this or
            ``learning_rate``.
        learning_rate: the step size of Adam (``optax.adam(learning_rate)``, the same
            steps), instead of ``optimizer``. The rate is an argument of the compiled
            program, not part of it: fits that differ only in it compile once.
        mask: optional observation mask (per step or per entry).
        inputs: covariates, when the model takes them.
        batch_size: sequences per step (``None``: all; the gradient is then exact).
        trainable: pytree like ``params`` of ``True``/``False`` (``False`` freezes a leaf)
            or boolean arrays of the leaf's shape (``False`` entries keep their value; see
            `statseq.core.restrict`). The optimizer sees one flat vector of free values.
        priors: pytree like ``params`` with numpyro distributions or ``None`` leaves.
        clip_norm: clip the gradient to this global norm before the optimizer.
        validation: fraction held out: the final fraction of time steps for a single
            sequence (scored as ``log p(y_val | y_train)``), else a random fraction of the
            sequences. Enables early stopping and returns the best validation parameters.
        eval_every: steps between validation evaluations (default ``num_steps // 100``).
        patience: evaluations without improvement before stopping (default 10). Only
            evaluations after step ``min_steps`` count.
        min_steps: steps before which early stopping cannot happen (default 0): set it to
            the length of a learning-rate warm-up so that patience is measured from the
            warm-up's end. Evaluations before it still update the best parameters.
        progress: show a progress bar (set ``False`` in scripts and tests).
        scored: optional booleans of shape ``batch_shape + (num_timesteps,)``: only the
            steps marked ``True`` count in the objective (and in validation scores); the
            others still drive the model's state. `statseq.make_windows` builds it for
            truncated backpropagation through time (each window's warmup is unscored).
        ties: pytree like ``params`` of ``None`` or integer label arrays of the leaf's
            shape: free entries with the same label ``>= 0`` share one value.

    Returns:
        A `~statseq.FitResult` whose ``log_joint`` trace has one entry per step.

    Examples:
        >>> import jax, optax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> fit = ss.fit_sgd(model, model.default_params(), y, optimizer=optax.adam(0.05),
        ...                  num_steps=500, key=jax.random.key(0), progress=False)
        >>> fit.log_joint.shape
        (500,)
    """
    check_key(key)
    start = time.perf_counter()
    params = validate_params(model, params)  # weak leaves made strong: one program
    validate_priors(model, priors)
    num_steps = check_positive_int(num_steps, "num_steps")
    optimizer, hyper = _optimizer(optimizer, learning_rate)
    model, data = prepare_sized(model, y, mask, inputs)  # sized for missing lags, if any
    require_observed(data, "fit_sgd")
    scored = _check_scored(scored, data)
    split_key, batch_key = jax.random.split(key)
    train, val = _split_validation(data, validation, split_key, scored)
    num_train = train[0].shape[0]
    if batch_size is None:
        batch_size = num_train
    batch_size = check_positive_int(batch_size, "batch_size")
    if batch_size > num_train:
        raise ValueError(f"batch_size={batch_size} exceeds the {num_train} training sequences")
    eval_every = check_positive_int(
        max(1, num_steps // 100) if eval_every is None else eval_every, "eval_every"
    )
    patience = check_positive_int(10 if patience is None else patience, "patience")
    min_steps = check_positive_int(min_steps, "min_steps", 0)
    if clip_norm is not None and not float(clip_norm) > 0:
        raise ValueError(f"clip_norm must be positive, got {clip_norm}")
    clip = jnp.asarray(jnp.inf if clip_norm is None else float(clip_norm), float_dtype())
    restriction, _ = restrict(model, params, trainable, ties)
    if restriction.num_free == 0:
        raise ValueError("trainable freezes every parameter: there is nothing to fit")
    progress_every = _progress.update_every(num_steps) if progress else 0
    bound_cache(_fit_sgd_compiled)  # one program per data shape: keep only the latest
    with _progress.progress_bar(num_steps, f"fit_sgd {type(model).__name__}", progress):
        out = _fit_sgd_compiled(
            model, optimizer, restriction, priors, train, val, batch_key, clip, hyper,
            np.int32(patience), np.int32(min_steps),
            num_steps=num_steps, batch_size=batch_size, eval_every=eval_every,
            progress_every=progress_every,
            train_complete=all_observed(train[1]),
            val_complete=val is not None and all_observed(val[1]),
        )
        i, up, trace, vtrace, best_up, best_val, stop = jax.block_until_ready(out)
    num_iter, stop = int(i), int(stop)
    if stop == _STOP_NONFINITE:
        warnings.warn(
            f"fit_sgd stopped at step {num_iter}: the objective or its gradient was not "
            "finite; returning the last parameters with a finite objective. Try a smaller "
            "learning rate, clip_norm, or better starting parameters.",
            RuntimeWarning, stacklevel=2,
        )
    final_up = best_up if (val is not None and math.isfinite(float(best_val))) else up
    steps = np.arange(eval_every - 1, num_steps, eval_every)[: vtrace.shape[0]]
    vtrace = np.asarray(vtrace)
    keep = np.isfinite(vtrace) if val is not None else np.zeros(vtrace.shape, bool)
    # fixed entries come back exactly as given; one compiled program
    fitted = expand_compiled(model, restriction, final_up)
    fitted, replaced, boundary = finish_fit(model, [fitted, params], "fit_sgd", train[0],
                                            train[1], restriction)
    return FitResult(
        params=fitted,
        log_joint=np.asarray(trace),
        num_iterations=num_iter,
        converged=stop == _STOP_EARLY and not replaced,
        validation_log_prob=vtrace[keep],
        validation_steps=steps[keep[: steps.shape[0]]],
        wall_time=time.perf_counter() - start,
        method="sgd",
        on_boundary=boundary,
    )
