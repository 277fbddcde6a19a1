"""Standard errors from the observed information, and a statistician's summary table.

At a (local) maximum ``theta_hat`` of the log joint ``l(theta) = log p(y | theta) +
log p(theta)``, the observed information in the unconstrained coordinates ``x`` of the
trainable leaves is the Hessian of the negative log joint,

    H = - d^2 l / dx dx^T   (at x_hat),

and the delta method carries ``H^{-1}`` to the natural (constrained) parameters through
the Jacobian ``J = d theta / dx^T`` of the flattened parameters,

    Cov(theta_hat) ~= J H^{-1} J^T.

At a maximum (zero gradient) this equals the inverse observed information computed in
the natural parameterization, whichever unconstrained coordinates are used. With priors
it is the covariance of the Laplace approximation to the posterior.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
import warnings
from functools import partial

import jax
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.distributions import constraints

from statseq.core.params import (
    log_prior,
    param_names,
    params_treedef,
    validate_params,
    validate_priors,
)
from statseq.core.restrict import restrict
from statseq.core.results import FitResult
from statseq.core.validation import prepare_data
from statseq.evaluation import information_criteria
from statseq.fit._objective import restricted_negative_log_joint

_Z_975 = 1.959963984540054  # the 0.975 quantile of the standard normal
_SYMMETRIC = (constraints.positive_definite, constraints.positive_semidefinite,
              constraints.corr_matrix)


@partial(jax.jit, static_argnames=("model", "complete"))
def _curvature_compiled(model, restriction, z0, priors, y, mask, inputs, *, complete):
    """Gradient and Hessian of the negative log joint in the free vector ``z`` of
    `statseq.core.restrict` (zero in the coordinates of fixed leaves, which are never sent
    through the unconstrained transform), and the Jacobian of the flattened natural
    parameters with respect to ``z``."""
    objective = restricted_negative_log_joint(model, restriction, priors, y, mask, inputs,
                                              complete)

    def natural(z):
        return ravel_pytree(restriction.expand(model, z))[0]

    return jax.grad(objective)(z0), jax.hessian(objective)(z0), jax.jacfwd(natural)(z0)


def standard_errors(model, params, y, *, mask=None, inputs=None, trainable=None, priors=None,
                    ties=None, return_cov=False):
    """Standard errors of the natural parameters from the observed information.

    Computes the Hessian ``H`` of the negative log joint ``-[log p(y | theta) +
    log p(theta)]`` with respect to the flat vector ``x`` of unconstrained trainable
    parameters, checks that it is positive definite, and maps ``H^{-1}`` to the natural
    parameters by the delta method,

        Cov = J H^{-1} J^T,        J = d vec(theta) / dx^T,

    where ``vec(theta)`` is ``jax.flatten_util.ravel_pytree(params)`` (leaves in pytree
    order, each raveled row-major). A ``(D, D)`` covariance leaf gets ``D^2`` entries, with
    equal standard errors for ``Sigma[i, j]`` and ``Sigma[j, i]``. Without priors, these are
    the usual maximum likelihood standard errors (the inverse observed information); with
    priors, the posterior standard deviations of the Laplace approximation.

    ``params`` must be a local maximum of the log joint (e.g. from `statseq.fit_lbfgs`):
    the delta method is only invariant to the choice of coordinates there, and a warning
    is given when the Newton decrement ``g^T H^{-1} g`` exceeds 0.01.

    Args:
        model: a statseq model.
        params: the fitted parameters.
        y: ``batch_shape + (num_timesteps,) + event_shape`` (the data they were fitted to).
        mask: optional observation mask.
        inputs: covariates, when the model takes them.
        trainable: pytree like ``params`` of ``True``/``False`` or boolean arrays of the
            leaf's shape (as in `statseq.fit_lbfgs`); fixed leaves and entries are treated
            as known and get NaN standard errors (a fixed singular covariance is fine).
        priors: the priors of a MAP fit (pytree of numpyro distributions or ``None``).
        ties: integer labels of tied entries (as in `statseq.fit_lbfgs`); the Hessian is
            taken in the free coordinates (one per tie group), so tied entries get the
            same standard error and perfectly correlated rows of ``cov``.
        return_cov: also return the covariance matrix.

    Returns:
        A pytree like ``params`` of NumPy arrays of standard errors (NaN on frozen
            leaves); with ``return_cov=True``, ``(std_errors, cov)`` where ``cov`` is the
            ``(P, P)`` covariance of ``ravel_pytree(params)`` (``P`` natural scalars; NaN rows
            and columns for frozen leaves).

    Raises:
        ValueError: if the Hessian is not finite or not positive definite (``params`` are
            not at a strict local maximum, or a parameter is not identified).

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=1)
        >>> mle = model.fit_least_squares(y)  # the exact conditional MLE
        >>> se = ss.standard_errors(model, mle, y)
        >>> se.coeffs.shape, round(float(se.coeffs[0, 0, 0]), 3)
        ((1, 1, 1), 0.058)
    """
    validate_params(model, params)
    validate_priors(model, priors)
    data = prepare_data(model, y, mask, inputs)
    leaves, treedef = jax.tree.flatten(params)
    restriction, z0 = restrict(model, params, trainable, ties)
    if restriction.num_free == 0:
        raise ValueError("trainable freezes every parameter: there are no standard errors")
    keep = np.asarray(restriction.keep)
    grad, hess, jac = _curvature_compiled(
        model, restriction, restriction.z0, priors, data.y, data.mask, data.inputs,
        complete=data.complete,
    )
    eps = np.finfo(hess.dtype).eps
    grad = np.asarray(grad, np.float64)[keep]
    hess = np.asarray(hess, np.float64)[np.ix_(keep, keep)]
    jac = np.asarray(jac, np.float64)[:, keep]
    hess = 0.5 * (hess + hess.T)
    if not (np.all(np.isfinite(hess)) and np.all(np.isfinite(grad))):
        raise ValueError(
            "the gradient or Hessian of the log joint is not finite at params; standard "
            "errors are undefined there"
        )
    eig, vec = np.linalg.eigh(hess)
    floor = hess.shape[0] * eps * np.max(np.abs(eig))
    if eig[0] <= floor:
        raise ValueError(
            "the observed information (the Hessian of the negative log joint) is not "
            f"positive definite at params (smallest eigenvalue {eig[0]:.3g}): params are not "
            "at a strict local maximum of the log joint, or a parameter is not identified. "
            "Fit first (e.g. statseq.fit_lbfgs), or freeze unidentified leaves with trainable"
        )
    cov_x = (vec / eig) @ vec.T
    decrement = float(grad @ cov_x @ grad)
    if decrement > 1e-2:
        warnings.warn(
            f"params are not at a maximum of the log joint (Newton decrement "
            f"g' H^-1 g = {decrement:.3g}); the standard errors assume a maximum. Fit to "
            "convergence first (e.g. statseq.fit_lbfgs)",
            RuntimeWarning, stacklevel=2,
        )
    cov = jac @ cov_x @ jac.T
    frozen = ~np.concatenate([np.ravel(m) for m in restriction.free_mask()])
    cov[frozen, :] = np.nan
    cov[:, frozen] = np.nan
    se = np.sqrt(np.clip(np.diagonal(cov), 0.0, None))
    se[frozen] = np.nan
    pieces, offset = [], 0
    for leaf in leaves:
        shape = np.shape(leaf)
        size = math.prod(shape)
        pieces.append(se[offset : offset + size].reshape(shape))
        offset += size
    std_errors = jax.tree.unflatten(treedef, pieces)
    return (std_errors, cov) if return_cov else std_errors


def _support(con, diagonal: bool) -> tuple[float, float]:
    """The support ``(lo, hi)`` of one scalar of a leaf with constraint ``con``.

    Positive scalars and the variances on the diagonal of a covariance matrix live on
    ``(0, inf)``, probabilities on ``(0, 1)``, correlations on ``(-1, 1)``; anything else
    (and a correlation matrix's unit diagonal) is reported as unbounded.
    """
    while isinstance(con, constraints.independent):
        con = con.base_constraint
    if con is constraints.positive_ordered_vector or con is constraints.simplex:
        return (0.0, math.inf) if con is constraints.positive_ordered_vector else (0.0, 1.0)
    if any(con is s for s in (constraints.positive_definite, constraints.positive_semidefinite)):
        return (0.0, math.inf) if diagonal else (-math.inf, math.inf)
    if con is constraints.corr_matrix:
        return (-math.inf, math.inf) if diagonal else (-1.0, 1.0)
    lo = getattr(con, "lower_bound", None)
    hi = getattr(con, "upper_bound", None)
    if isinstance(lo, (int, float)) or isinstance(hi, (int, float)):
        lo = -math.inf if lo is None else float(lo)
        hi = math.inf if hi is None else float(hi)
        return lo, hi
    return -math.inf, math.inf


def _row_entries(model, params):
    """``(name, flat index, leaf index, (lo, hi))`` of each reported scalar, in pytree order.

    Symmetric matrix leaves (covariances, correlations) report their lower triangle only;
    ``(lo, hi)`` is the scalar's support (`_support`).
    """
    names = param_names(model)
    cons = jax.tree.leaves(
        model.param_constraints(), is_leaf=lambda c: isinstance(c, constraints.Constraint)
    )
    rows, offset = [], 0
    for k, (name, con, leaf) in enumerate(
        zip(names, cons, jax.tree.leaves(params), strict=True)
    ):
        shape = np.shape(leaf)
        symmetric = any(con is s for s in _SYMMETRIC) and len(shape) >= 2
        for pos, idx in enumerate(np.ndindex(*shape)):
            if symmetric and idx[-1] > idx[-2]:
                continue
            label = f"{name}[{','.join(map(str, idx))}]" if shape else name
            support = _support(con, diagonal=symmetric and idx[-1] == idx[-2])
            rows.append((label, offset + pos, k, support))
        offset += math.prod(shape)
    return rows


def _interval(est, se, lo, hi, z=_Z_975):
    """A 95% interval inside ``(lo, hi)`` and the scale it was computed on.

    Unbounded: the Wald interval ``est -+ z se``. Bounded below only: the delta method on
    ``g = log(theta - lo)``, ``se_g = se / (est - lo)``, mapped back,
    ``lo + (est - lo) exp(-+ z se_g)``. Bounded on both sides: on the logit scale
    ``g = log((theta - lo) / (hi - theta))``, ``se_g = se (hi - lo) / ((est - lo)(hi - est))``,
    mapped back by ``lo + (hi - lo) / (1 + exp(-g))``. An estimate on the boundary (or
    outside) has no such interval (NaN).
    """
    if math.isinf(lo) and math.isinf(hi):
        return est - z * se, est + z * se, "wald"
    if not (lo < est < hi) or not np.isfinite(se):
        return math.nan, math.nan, "log" if math.isinf(hi) else "logit"
    def exp(v):  # exp without OverflowError: a huge se_g gives an interval reaching inf
        return math.exp(min(v, 709.0)) if v < 709.0 else math.inf

    if math.isinf(hi):
        se_g = se / (est - lo)
        return lo + (est - lo) * exp(-z * se_g), lo + (est - lo) * exp(z * se_g), "log"
    if math.isinf(lo):
        se_g = se / (hi - est)
        return hi - (hi - est) * exp(z * se_g), hi - (hi - est) * exp(-z * se_g), "log"
    g = math.log((est - lo) / (hi - est))
    se_g = se * (hi - lo) / ((est - lo) * (hi - est))

    def back(v):  # the logistic map, stable for any v (an interval reaching lo or hi)
        if v >= 0:
            return lo + (hi - lo) / (1.0 + math.exp(-v))
        e = exp(v)
        return lo + (hi - lo) * e / (1.0 + e)

    return back(g - z * se_g), back(g + z * se_g), "logit"


@dataclasses.dataclass(frozen=True, repr=False)
class Summary:
    """Output of `summary`: a parameter table and fit statistics, printed as plain text.

    Attributes:
        model: the model's description (its ``repr``).
        names: one name per reported scalar parameter (``coeffs[0,0,0]``, ``cov[1,0]``...).
        estimates: ``(num_rows,)`` estimates.
        std_errors: ``(num_rows,)`` standard errors (NaN on frozen parameters).
        z: ``estimate / se``; NaN where ``theta = 0`` is not an interior point of the
            parameter space (see ``null``).
        p_values: two-sided normal p-values of ``theta = 0``, ``2 (1 - Phi(|z|))``; NaN
            where ``z`` is.
        ci_lower: lower end of the 95% interval (see ``ci_scale``).
        ci_upper: its upper end.
        ci_scale: ``(num_rows,)`` how each interval was computed: ``"wald"``
            (``estimate -+ 1.96 se``, unbounded parameters), ``"log"`` (a parameter bounded
            on one side, e.g. a variance: the delta method on ``log(theta - lo)``) or
            ``"logit"`` (bounded on both sides, e.g. a probability).
        null: ``(num_rows,)`` ``"interior"`` when ``theta = 0`` is an interior point of
            the parameter space (the z-test applies), ``"boundary"`` when it is on the
            boundary (a variance, a probability) and ``"outside"`` when it is excluded.
        trainable: ``(num_rows,)`` booleans (``False`` for frozen parameters).
        log_lik: ``log p(y | params)``.
        log_prior: ``log p(params)`` when priors were given, else ``None``.
        num_obs: scored scalar observations ``n``.
        num_params: identified free parameters ``k`` (`statseq.num_params`: the free
            scalars less the model's exact invariances, e.g. a softmax row's redundant
            logit).
        aic, bic: ``-2 log L + 2 k`` and ``-2 log L + k log n``.
        method: the fitting method of the `~statseq.FitResult`, if one was given.
        converged: whether that fit converged.
        num_iterations: its number of iterations.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> params = model.fit_least_squares(y)
        >>> table = ss.summary(model, params, y)
        >>> type(table).__name__, table.estimates.shape, table.std_errors.shape
        ('Summary', (4,), (4,))
        >>> est = table.estimates
        >>> bool((table.ci_lower < est).all() and (est < table.ci_upper).all())
        True
    """

    model: str
    names: tuple[str, ...]
    estimates: np.ndarray
    std_errors: np.ndarray
    z: np.ndarray
    p_values: np.ndarray
    ci_lower: np.ndarray
    ci_upper: np.ndarray
    trainable: np.ndarray
    ci_scale: tuple[str, ...]
    null: tuple[str, ...]
    log_lik: float
    log_prior: float | None
    num_obs: int
    num_params: int
    aic: float
    bic: float
    method: str | None = None
    converged: bool | None = None
    num_iterations: int | None = None

    def __str__(self) -> str:
        width = max([len(n) for n in self.names] + [16]) + 2
        info = [("Model:", self.model)]
        if self.method is not None:
            state = "converged" if self.converged else "not converged"
            info.append(("Method:", f"{self.method} ({state}, {self.num_iterations} iterations)"))
        info += [
            ("Log-likelihood:", f"{self.log_lik:.4f}"),
            *([("Log prior:", f"{self.log_prior:.4f}")] if self.log_prior is not None else []),
            ("No. observations:", f"{self.num_obs}"),
            ("No. parameters:", f"{self.num_params}"),
            ("AIC:", f"{self.aic:.4f}"),
            ("BIC:", f"{self.bic:.4f}"),
        ]
        head = f"{'':<{width}}{'estimate':>12}{'std. error':>12}{'z':>9}{'P>|z|':>8}" \
               f"{'[0.025':>12}{'0.975]':>12}  scale"
        rule = "=" * len(head)
        lines = [rule] + [f"{k:<19}{v}" for k, v in info] + [rule, head, "-" * len(head)]
        for i, name in enumerate(self.names):
            est = f"{name:<{width}}{self.estimates[i]:>12.5g}"
            if not self.trainable[i]:
                lines.append(f"{est}{'(fixed)':>12}")
                continue
            if self.null[i] == "interior":
                test = f"{self.z[i]:>9.3f}{self.p_values[i]:>8.3f}"
            else:
                test = f"{'':>9}{'(' + self.null[i][0] + ')':>8}"
            lines.append(
                f"{est}{self.std_errors[i]:>12.5g}{test}"
                f"{self.ci_lower[i]:>12.5g}{self.ci_upper[i]:>12.5g}  {self.ci_scale[i]}"
            )
        lines.append(rule)
        notes = []
        used = set(self.ci_scale[i] for i in range(len(self.names)) if self.trainable[i])
        if used - {"wald"}:
            notes.append("Intervals: delta method on the log (log) or logit (logit) scale, "
                         "mapped back into the parameter space; wald: estimate -+ 1.96 se.")
        nulls = set(self.null[i] for i in range(len(self.names)) if self.trainable[i])
        if "boundary" in nulls:
            notes.append("(b) theta = 0 is on the boundary of the parameter space: no z-test. "
                         "A likelihood ratio test of one such parameter has a 50:50 mixture "
                         "of chi2(0) and chi2(1) as null distribution (Self and Liang 1987): "
                         "halve its chi2(1) p-value.")
        if "outside" in nulls:
            notes.append("(o) theta = 0 is outside the parameter space: no z-test.")
        lines += [textwrap.fill(n, width=len(head), subsequent_indent="    ") for n in notes]
        if self.log_prior is not None:
            lines.append("Std. errors: curvature of the log joint (Laplace approximation).")
        return "\n".join(lines)

    __repr__ = __str__


def summary(model, params, y, *, mask=None, inputs=None, trainable=None, priors=None,
            ties=None, fit=None) -> Summary:
    """A parameter table: standard errors, z-tests and 95% intervals inside the parameter space.

    One row per scalar parameter, named from the fields of the params ``NamedTuple``
    (``coeffs[0,0,0]``, ``intercept[0]``, ...; for symmetric matrices such as covariances
    only the lower triangle ``cov[i,j]``, ``i >= j``), with, for an unbounded parameter,

        z = estimate / se,   P>|z| = 2 (1 - Phi(|z|)),   95% CI = estimate -+ 1.96 se

    where ``se`` comes from `standard_errors` (the observed information and the delta
    method). Intervals and tests respect the parameter space:

    * a parameter bounded on one side (a variance, a scale, a degrees-of-freedom bound
      ``nu > lo``) gets its interval on the log scale, ``lo + (est - lo) exp(-+ 1.96 se /
      (est - lo))`` (the delta method for ``log(theta - lo)``, mapped back); for a positive
      scalar that is exactly the Wald interval in the unconstrained coordinate
      ``log theta`` in which the Hessian is computed, so the interval never leaves
      ``(0, inf)``; the diagonal (variances) of a covariance matrix is treated the same way;
    * a parameter bounded on both sides (probabilities, simplex entries, correlations)
      gets its interval on the logit scale of ``(theta - lo) / (hi - lo)``;
    * ``z`` and ``P>|z|`` are reported only where ``theta = 0`` is an interior point of the
      parameter space. For a variance, ``theta = 0`` is on the boundary, where the Wald
      test's normal reference does not hold; the table leaves those cells empty, marks
      them ``(b)`` and says so in a footnote (``null`` and ``ci_scale`` record the choices).

    Then the log-likelihood, number of observations ``n``, number of free
    parameters ``k``, ``AIC = -2 log L + 2 k`` and ``BIC = -2 log L + k log n`` (as
    `statseq.information_criteria`).

    Args:
        model: a statseq model.
        params: the fitted parameters (``None`` to take ``fit.params``).
        y: ``batch_shape + (num_timesteps,) + event_shape``.
        mask: optional observation mask.
        inputs: covariates, when the model takes them.
        trainable: pytree like ``params`` of ``True``/``False`` or boolean arrays of the
            leaf's shape; fixed leaves and entries are shown as fixed and not counted in
            ``k``.
        priors: the priors of a MAP fit; the table then shows Laplace posterior standard
            deviations.
        ties: integer labels of tied entries (as in `statseq.fit_lbfgs`): each tied entry
            is shown with its group's common standard error, and a group counts once in
            ``k``.
        fit: an optional `~statseq.FitResult`, whose method and convergence are shown.

    Returns:
        A `Summary`; ``print`` it for the table.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = np.log10(ss.datasets.load_lynx().to_numpy())
        >>> model = ss.AR(order=2)
        >>> table = ss.summary(model, model.fit_least_squares(y), y)
        >>> table.names
        ('coeffs[0,0,0]', 'coeffs[1,0,0]', 'intercept[0]', 'cov[0,0]')
        >>> table.ci_scale[-1], table.null[-1], bool(table.ci_lower[-1] > 0)
        ('log', 'boundary', True)
        >>> print(table)  # doctest: +ELLIPSIS
        ===...
        Log-likelihood:    ...
    """
    if fit is not None and not isinstance(fit, FitResult):
        raise TypeError(f"fit must be a statseq FitResult, got {type(fit).__name__}")
    if params is None:
        if fit is None:
            raise ValueError("pass params, or fit=FitResult to summarize fit.params")
        params = fit.params
    se_tree, _ = standard_errors(
        model, params, y, mask=mask, inputs=inputs, trainable=trainable, priors=priors,
        ties=ties, return_cov=True,
    )
    restriction, _ = restrict(model, params, trainable, ties)
    crit = information_criteria(model, params, y, mask=mask, inputs=inputs)
    # identified parameters: the free scalars less the model's exact invariances among
    # them (a softmax regression's K-th row, statseq.num_free_params)
    k = restriction.num_free - model.num_redundant_params(
        jax.tree.unflatten(params_treedef(model), restriction.free_mask()))
    crit.update(num_params=k, aic=-2.0 * crit["log_lik"] + 2.0 * k,
                bic=-2.0 * crit["log_lik"] + k * math.log(max(crit["num_obs"], 1)))
    free_flat = np.concatenate([np.ravel(m) for m in restriction.free_mask()])
    rows = _row_entries(model, params)
    est_flat = np.asarray(ravel_pytree(params)[0], np.float64)
    se_flat = np.concatenate([np.ravel(s) for s in jax.tree.leaves(se_tree)])
    idx = np.array([r[1] for r in rows], int)
    est, se = est_flat[idx], se_flat[idx]
    null = tuple(
        "interior" if lo < 0.0 < hi else "boundary" if 0.0 in (lo, hi) else "outside"
        for *_, (lo, hi) in rows
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(np.array(null) == "interior", est / se, np.nan)
    p_values = np.array([math.erfc(abs(v) / math.sqrt(2.0)) for v in z])
    intervals = [_interval(float(e), float(s), lo, hi)
                 for e, s, (*_, (lo, hi)) in zip(est, se, rows, strict=True)]
    prior_term = None if priors is None else float(log_prior(priors, params))
    return Summary(
        model=repr(model),
        names=tuple(r[0] for r in rows),
        estimates=est,
        std_errors=se,
        z=z,
        p_values=p_values,
        ci_lower=np.array([c[0] for c in intervals]),
        ci_upper=np.array([c[1] for c in intervals]),
        trainable=free_flat[idx],
        ci_scale=tuple(c[2] for c in intervals),
        null=null,
        log_lik=crit["log_lik"],
        log_prior=prior_term,
        num_obs=crit["num_obs"],
        num_params=crit["num_params"],
        aic=crit["aic"],
        bic=crit["bic"],
        method=None if fit is None else fit.method,
        converged=None if fit is None else bool(fit.converged),
        num_iterations=None if fit is None else int(fit.num_iterations),
    )
