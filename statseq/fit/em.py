"""Expectation-maximization for any model with ``e_step`` and ``m_step``, compiled as one loop.

Each iteration computes expected sufficient statistics under the current posterior
(E-step) and maximizes the expected complete-data log joint (M-step):

    theta_{n+1} = argmax_theta E_{p(z | y, theta_n)}[log p(y, z | theta)] + log p(theta).

The trace records ``log p(y | theta_n) + log p(theta_n)``, the same objective as
`statseq.fit_sgd`, and never decreases (up to rounding).
"""

from __future__ import annotations

import inspect
import time
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from statseq.core.buckets import bound_cache
from statseq.core.params import (
    finish_fit,
    log_prior,
    trainable_mask,
    validate_params,
    validate_priors,
)
from statseq.core.restrict import restrict
from statseq.core.results import FitResult
from statseq.core.validation import (
    check_positive_int,
    float_dtype,
    prepare_data,
    require_observed,
)
from statseq.fit import _progress
from statseq.fit._tied_simplex import tied_simplex_m_step


def dirichlet_map(counts, prior, old):
    """MAP of row-wise categorical probabilities under an optional Dirichlet prior.

        p_j = (n_j + alpha_j - 1) / sum_j (n_j + alpha_j - 1)

    (the maximum likelihood estimate ``n_j / sum n`` without a prior). Rows without any
    expected count keep their ``old`` value, so a state that lost all its mass stays
    finite instead of becoming 0/0.
    """
    if prior is not None:
        counts = counts + prior.concentration - 1.0
    total = jnp.sum(counts, axis=-1, keepdims=True)
    empty = total <= 1e-12 * jnp.maximum(1.0, jnp.max(total))
    return jnp.where(empty, old, counts / jnp.where(empty, 1.0, total))


def constrained_dirichlet_map(counts, prior, old, free):
    """`dirichlet_map` with some entries of each row fixed at their ``old`` value.

    The free entries of a row share the mass ``r = 1 - sum(fixed)`` in proportion to their
    (prior-augmented) expected counts, ``p_j = r n_j / sum_{free i} n_i``: the maximizer
    of ``sum_j n_j log p_j`` over the row's free entries (Lagrange). ``free`` is a boolean
    (array) broadcastable to ``counts``; all ``True`` gives `dirichlet_map` exactly. Rows
    whose free entries have no expected count keep their ``old`` values.
    """
    free = jnp.broadcast_to(jnp.asarray(free, bool), old.shape)
    if prior is not None:
        counts = counts + prior.concentration - 1.0
    rest = 1.0 - jnp.sum(jnp.where(free, 0.0, old), axis=-1, keepdims=True)
    counts = jnp.where(free, counts, 0.0)
    total = jnp.sum(counts, axis=-1, keepdims=True)
    empty = total <= 1e-12 * jnp.maximum(1.0, jnp.max(total))
    new = jnp.where(empty, old, rest * (counts / jnp.where(empty, 1.0, total)))
    return jnp.where(free, new, old)


def generalized_m_step(objective, start, *, num_steps: int = 30, step_size: float = 0.1):
    """Increase ``objective`` from ``start`` by accepted gradient steps (a generalized M-step).

    Plain gradient ascent with an adaptive step: a step is kept only if it increases the
    objective (the step grows by 1.5 after a success and halves after a failure), so the
    result is never worse than ``start`` and EM stays monotone.
    """
    value_and_grad = jax.value_and_grad(objective)

    def body(_, carry):
        x, fx, lr = carry
        _, g = value_and_grad(x)
        cand = jax.tree.map(lambda a, b: a + lr * b, x, g)
        fc = objective(cand)
        ok = jnp.isfinite(fc) & (fc > fx)
        x = jax.tree.map(lambda a, b: jnp.where(ok, a, b), cand, x)
        return x, jnp.where(ok, fc, fx), jnp.where(ok, lr * 1.5, lr * 0.5)

    f0 = objective(start)
    x, _, _ = jax.lax.fori_loop(0, num_steps, body,
                                (start, f0, jnp.asarray(step_size, f0.dtype)))
    return x


def _has_ties(ties) -> bool:
    return ties is not None and any(
        t is not None and np.any(np.asarray(t) >= 0)
        for t in jax.tree.leaves(ties, is_leaf=lambda x: x is None))


def _em_masks(model, params, trainable, ties):
    """``(m_step_mask, free_mask, restriction)`` for EM.

    ``m_step_mask`` is the trainable pytree of the closed-form M-step: one bool per leaf, or
    boolean arrays where the model's M-step maximizes over the free entries (checked like
    `statseq.core.restrict`); tied entries are fixed there. ``free_mask`` also marks the
    tied entries free. ``restriction`` is the `Restriction` of the generalized M-step (over
    the tied entries, and over entries whose masked closed-form step is not exact, see
    ``model.m_step_exact``), or ``None`` when the closed-form step is all there is."""
    has_ties = _has_ties(ties)
    if not has_ties and (trainable is None or all(
            isinstance(t, bool | np.bool_) for t in jax.tree.leaves(trainable))):
        mask = trainable_mask(params, trainable)
        return mask, mask, None
    if has_ties and not (hasattr(model, "expected_log_joint")
                         and getattr(model, "m_step_entry_masks", False)):
        raise ValueError(
            f"fit_em supports ties only for models with an expected_log_joint and "
            f"per-entry M-step masks (HMMs, LinearGaussianSSM, MarkovSwitchingAR); "
            f"{type(model).__name__} has none: fit it with fit_lbfgs or fit_sgd")
    if not getattr(model, "m_step_entry_masks", False):
        raise ValueError(
            f"fit_em: {type(model).__name__}'s M-step does not support per-entry trainable "
            "masks (boolean arrays); use True/False per field, or fit_lbfgs / fit_sgd")
    restriction, _ = restrict(model, params, trainable, ties)  # validates
    leaves, tree = jax.tree.flatten(params)
    labels = tree.flatten_up_to(ties) if has_ties else [None] * len(leaves)
    free, m_step = [], []
    for m, lab in zip(restriction.free_mask(), labels, strict=True):
        tied = np.zeros(m.shape, bool) if lab is None else np.asarray(lab) >= 0
        free.append(bool(m.all()) if (m.all() or not m.any()) else np.asarray(m))
        e = m & ~tied
        m_step.append(bool(e.all()) if (e.all() or not e.any()) else e)
    m_step_tree = jax.tree.unflatten(tree, m_step)
    exact = not has_ties and (not hasattr(model, "m_step_exact")
                              or model.m_step_exact(m_step_tree))
    return m_step_tree, jax.tree.unflatten(tree, free), None if exact else restriction


class _FreeMasks:
    """Per-leaf free masks (what `degenerate_fit_warning` reads from a restriction)."""

    def __init__(self, params, mask_tree):
        self.masks = [np.broadcast_to(np.asarray(t, bool), np.shape(p))
                      for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(mask_tree),
                                      strict=True)]

    def free_mask(self):
        return self.masks


def _takes_trainable(model) -> bool:
    """Whether the model's M-step maximizes given frozen leaves (an ECM step) itself."""
    return "trainable" in inspect.signature(model.m_step).parameters


_RUNNING, _CONVERGED, _NONFINITE, _DECREASED = 0, 1, 2, 3


def _rounding_tolerance(dtype) -> float:
    """Relative change of the log joint below which a decrease counts as rounding."""
    return 1e-5 if jnp.dtype(dtype) == jnp.float32 else 1e-10


def _stop_rule(trace, i, value, tol, noise):
    """EM's stopping tests at iteration ``i`` for the objective ``value`` (``trace[i - 1]``
    holds the one before): ``(converged, broken, decreased)``.

    ``converged``: the relative change is within ``tol``; ``broken``: ``value`` is not
    finite; ``decreased``: it fell by more than ``max(tol, noise)`` relative (EM never
    decreases its objective, so that means the iteration broke down).
    """
    last = trace[jnp.maximum(i - 1, 0)]
    scale = jnp.maximum(1.0, jnp.abs(value))
    converged = (i > 0) & (jnp.abs(value - last) <= tol * scale)
    broken = ~jnp.isfinite(value)
    decreased = (i > 0) & ~broken & (value < last - jnp.maximum(tol, noise) * scale)
    return converged, broken, decreased


@partial(jax.jit, static_argnames=("model", "capacity", "progress"))
def _fit_em_compiled(model, params, trainable, restriction, priors, y, mask, inputs, tol,
                     num_iters, progress_every, *, capacity, progress):
    dtype = float_dtype()
    noise = _rounding_tolerance(dtype)

    carry_masses = hasattr(model, "em_state_masses")

    def body(state):
        i, params, prev, trace, _, masses = state
        stats, lp = model.e_step(params, y, mask, inputs)
        if carry_masses:  # for `em_warnings`, which then needs no E-step of its own
            masses = model.em_state_masses(stats, mask).astype(masses.dtype)
        value = lp + log_prior(priors, params)
        if _takes_trainable(model):
            new = model.m_step(params, stats, priors, inputs, trainable=trainable)
        else:
            new = model.m_step(params, stats, priors, inputs)
        new = jax.tree.map(lambda n, o, t: jnp.where(t, n, o), new, params, trainable)
        if restriction is not None:
            # ECM: the closed-form step held the tied entries (and the entries it cannot
            # maximize exactly) fixed; it is kept only if it raised the expected log joint
            # Q + log prior, then accepted gradient steps on the restricted free vector
            # raise it further: every iteration raises Q, so the log joint never decreases
            def q_of(p):
                return model.expected_log_joint(p, stats) + log_prior(priors, p)

            better = q_of(new) >= q_of(params)
            new = jax.tree.map(lambda a, b: jnp.where(better, a, b), new, params)
            new = restriction.expand(model, generalized_m_step(
                lambda z: q_of(restriction.expand(model, z)),
                restriction.contract(model, new)))
            # tied simplex entries: the exact constrained maximizer (Newton on the ties)
            new = tied_simplex_m_step(restriction, q_of, new)
        # a decrease beyond the tolerance and rounding means the iteration broke down
        # (e.g. a covariance collapsing): stop there
        converged, broken, decreased = _stop_rule(trace, i, value, tol, noise)
        status = jnp.where(broken, _NONFINITE, jnp.where(
            decreased, _DECREASED, jnp.where(converged, _CONVERGED, _RUNNING)))
        failed = broken | decreased
        # a failed step is not recorded: the last finite entry is that of the returned params
        trace = trace.at[i].set(jnp.where(decreased, jnp.nan, value))
        if progress:
            jax.lax.cond(
                (i % progress_every == 0) | (i == num_iters - 1),
                lambda: jax.debug.callback(_progress.report, i, value),
                lambda: None,
            )
        # at convergence keep the params that produced the last trace value; when the
        # objective broke down or decreased, the params before them (the better value)
        keep = jax.tree.map(lambda p, q: jnp.where(failed, q, p), params, prev)
        out = jax.tree.map(lambda n, k: jnp.where(converged | failed, k, n), new, keep)
        return i + 1, out, params, trace, status.astype(jnp.int32), masses

    def cond(state):
        i, _, _, _, status, _ = state
        return (i < num_iters) & (status == _RUNNING)

    num_masses = getattr(model, "num_states", 0) if carry_masses else 0
    init = (jnp.zeros((), jnp.int32), params, params,
            jnp.full((capacity,), jnp.nan, dtype), jnp.asarray(_RUNNING, jnp.int32),
            jnp.zeros((num_masses,), dtype))
    return jax.lax.while_loop(cond, body, init)


def fit_em(model, params, y, *, mask=None, inputs=None, num_iters=100,
           tol: float | None = 1e-7, priors=None, trainable=None, progress=True,
           ties=None) -> FitResult:
    """Fit ``model`` by (generalized) expectation-maximization.

    Maximizes ``log p(y | theta) + log p(theta)``: closed-form M-steps where the model has
    them (with conjugate priors giving MAP estimates), accepted gradient steps where it
    does not. All iterations run in one compiled ``lax.while_loop``.

    Args:
        model: a model with ``e_step`` and ``m_step`` (HMMs, linear Gaussian SSMs).
        params: starting parameters.
        y: ``batch_shape + (num_timesteps,) + event_shape``.
        mask: optional observation mask (missing entries are marginalized in the E-step).
        inputs: covariates, when the model takes them.
        num_iters: maximum number of EM iterations.
        tol: stop when the log joint changes by less than ``tol * max(1, |log joint|)``;
            ``None`` runs exactly ``num_iters`` iterations (unless the objective becomes
            non-finite or decreases, which stops any fit), for timing equal work or a
            fixed budget; ``converged`` is then ``False``.
        priors: conjugate priors (e.g. ``numpyro.distributions.Dirichlet`` on transition
            rows, ``Gamma`` on Poisson rates), a pytree like ``params`` with ``None``
            leaves where the prior is flat.
        trainable: pytree like ``params`` of ``True``/``False`` (frozen leaves are kept) or,
            for models whose M-step supports it (``model.m_step_entry_masks``: every HMM
            family incl. GLM-HMM transitions, `LinearGaussianSSM`, `MarkovSwitchingAR`),
            boolean arrays of the leaf's shape: ``False`` entries keep their value bit for bit (see
            `statseq.core.restrict` for what each constraint allows). The M-step is then
            constrained: a simplex row (initial law, transition row, categorical emission
            probabilities) gives its free entries the mass ``1 - sum(fixed)`` in
            proportion to their expected counts (closed form); Poisson rates and Bernoulli
            probabilities are updated entry by entry; input-driven transitions take
            gradient steps on their free entries; any other partly fixed leaf (Gaussian or
            AR emissions) is held in the closed-form step and moved by accepted gradient
            steps on ``model.expected_log_joint`` (as for ``ties``). `MarkovSwitchingAR`
            solves its means, ``phi`` and variance blocks over the free entries (exact).
        progress: show a progress bar.
        ties: ``None`` or integer labels like ``params`` (`statseq.core.restrict`; equal
            labels ``>= 0`` share one value), for models with ``expected_log_joint``
            (HMMs, `LinearGaussianSSM`, `MarkovSwitchingAR`); others raise a
            ``ValueError``. Tied entries start at their common value; each iteration runs
            the closed-form M-step with them held, keeps it only if it raised
            ``Q = expected_log_joint + log prior``, then takes `generalized_m_step`
            (accepted gradient steps) on ``Q`` over the restricted free vector: an ECM
            iteration, still monotone. Simplex leaves with tied entries (e.g. a symmetric
            transition matrix) then get the exact constrained maximizer of their
            ``sum N log A`` term (Newton on the tie values, `statseq.fit._tied_simplex`),
            kept only if ``Q`` did not decrease.

    Returns:
        A `~statseq.FitResult`; ``log_joint[n]`` is the objective at the parameters
        entering iteration ``n``, and ``params`` are those of the last entry's M-step
        (or of the last entry itself when the fit converged). When the objective
        decreased beyond ``max(tol, rounding)`` (1e-5 relative in float32, 1e-10 in
        float64), which EM cannot do in exact arithmetic, the fit stops with
        ``converged=False`` and a warning and returns the parameters of the last entry
        (the best); the rejected iteration is not counted. Parameters outside their
        constraints are never returned: an earlier valid iterate (the one before, else the
        start, whose value is ``log_joint[0]``) is, with a warning. ``on_boundary`` names
        the parameters at a boundary of the parameter space.

    Examples:
        >>> import jax, statseq as ss
        >>> y = ss.datasets.load_discoveries().to_numpy()
        >>> model = ss.PoissonHMM(num_states=2)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> fit = ss.fit_em(model, params, y, num_iters=50, progress=False)
        >>> bool(np.all(np.diff(fit.log_joint[:fit.num_iterations]) > -1e-6))
        True
    """
    start = time.perf_counter()
    if not (hasattr(model, "e_step") and hasattr(model, "m_step")):
        raise TypeError(
            f"{type(model).__name__} has no EM algorithm (no e_step/m_step); "
            "fit it with statseq.fit_sgd instead"
        )
    params = validate_params(model, params)  # weak leaves made strong: one program
    validate_priors(model, priors)
    if hasattr(model, "validate_em_priors"):
        model.validate_em_priors(priors)
    num_iters = check_positive_int(num_iters, "num_iters")
    if tol is not None and not float(tol) >= 0:
        raise ValueError(f"tol must be non-negative or None, got {tol}")
    # tol=None: a convergence test that never passes (|change| <= -inf); the decrease test
    # then uses the rounding tolerance alone
    tol_value = -np.inf if tol is None else float(tol)
    data = prepare_data(model, y, mask, inputs)
    require_observed(data, "fit_em")
    m_step_tree, mask_tree, restriction = _em_masks(model, params, trainable, ties)
    if restriction is not None:  # tied entries start at their common value (as in fit_lbfgs)
        params = restriction.expand(model, restriction.z0)
    # one program per data shape; EM's statistics would see padded steps, so instead of
    # length buckets a loop over many lengths keeps only the latest programs
    bound_cache(_fit_em_compiled)
    with _progress.progress_bar(num_iters, f"fit_em {type(model).__name__}", progress):
        out = _fit_em_compiled(
            model, params, jax.tree.map(np.asarray, m_step_tree), restriction, priors,
            data.y, data.mask,
            data.inputs, np.asarray(tol_value, float_dtype()),  # NumPy: no cast program
            np.asarray(num_iters, np.int32),
            np.asarray(_progress.update_every(num_iters), np.int32),
            capacity=_progress.trace_capacity(num_iters), progress=bool(progress),
        )
        i, fitted, other, trace, status, masses = jax.block_until_ready(out)
    num_iterations, status = int(i), int(status)

    def restore_frozen(tree):
        return jax.tree.map(
            lambda f, g, t: jnp.where(t, f, g) if np.ndim(t) else (f if t else g),
            tree, params, mask_tree)

    fitted = restore_frozen(fitted)
    trace = np.asarray(trace)[:num_iters]
    if status == _NONFINITE:
        warnings.warn(
            f"fit_em stopped at iteration {num_iterations - 1}: the log joint became "
            "non-finite; returning the parameters of the last finite value (the likelihood "
            "may be unbounded, e.g. a variance collapsing to zero)", RuntimeWarning,
            stacklevel=2)
    elif status == _DECREASED:
        num_iterations -= 1  # the rejected iteration is not counted (its entry is NaN)
        warnings.warn(
            f"fit_em stopped at iteration {num_iterations}: the log joint decreased "
            "(EM cannot decrease it in exact arithmetic: the iteration broke down "
            "numerically, e.g. near a singular covariance); returning the parameters of "
            "the best value, converged=False", RuntimeWarning, stacklevel=2)
    if hasattr(model, "em_warnings"):
        # the masses of the last E-step (at the parameters entering the last iteration)
        extra = {"masses": masses} if hasattr(model, "em_state_masses") else {}
        for message in model.em_warnings(fitted, data.y, data.mask, data.inputs, **extra):
            warnings.warn(message, RuntimeWarning, stacklevel=2)
    fitted, replaced, boundary = finish_fit(
        model, [fitted, restore_frozen(other), params], "fit_em", data.y, data.mask,
        _FreeMasks(params, mask_tree))
    converged = status == _CONVERGED and not replaced
    spurious = _spurious(model, fitted, y, mask, inputs)
    return FitResult(
        params=fitted,
        log_joint=trace,
        num_iterations=num_iterations,
        converged=bool(converged),
        validation_log_prob=np.zeros((0,)),
        validation_steps=np.zeros((0,), int),
        wall_time=time.perf_counter() - start,
        method="em",
        on_boundary=boundary,
        spurious_states=spurious,
    )


def _spurious(model, fitted, y, mask, inputs) -> tuple[int, ...]:
    """The states `statseq.spurious_states` flags at the fitted parameters (``()`` for
    models it does not judge), with one warning when there are any."""
    from statseq.fit.degeneracy import spurious_states

    check = spurious_states(model, fitted, y, mask=mask, inputs=inputs)
    if check is None or not check.any:
        return ()
    states = tuple(int(k) for k in np.flatnonzero(check.spurious))

    def reason(k):
        low_occ = check.occupancy[k] < check.min_occupancy
        low_var = check.variance_ratio[k] < check.min_variance_ratio
        why = " and ".join(w for w, on in (("almost no data", low_occ),
                                            ("a collapsed variance", low_var)) if on)
        return (f"state {k} ({why}: expected occupancy {check.occupancy[k]:.3g} steps, "
                f"variance ratio {check.variance_ratio[k]:.3g})")

    warnings.warn(
        f"fit_em ended with spurious states: {', '.join(reason(k) for k in states)} "
        f"(thresholds: occupancy {check.min_occupancy:g} steps, variance ratio "
        f"{check.min_variance_ratio:g}). A state that explains almost no data is not a "
        "regime the data support, and where a variance collapses onto a few points the "
        "likelihood is unbounded. Use statseq.fit_restarts (exclude_spurious=True), fewer "
        "states or priors; FitResult.spurious_states lists them.",
        RuntimeWarning, stacklevel=3)
    return states
