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
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.distributions import constraints

from statseq.core.params import (
    from_unconstrained,
    log_prior,
    num_free_params,
    param_names,
    to_unconstrained,
    validate_params,
    validate_priors,
)
from statseq.core.results import FitResult
from statseq.core.validation import prepare_data
from statseq.evaluation import information_criteria
from statseq.fit._objective import coordinate_mask, negative_log_joint, trainable_flags

_Z_975 = 1.959963984540054  # the 0.975 quantile of the standard normal
_SYMMETRIC = (constraints.positive_definite, constraints.positive_semidefinite,
              constraints.corr_matrix)


@partial(jax.jit, static_argnames=("model", "complete"))
def _curvature_compiled(model, uparams, keep, priors, y, mask, inputs, *, complete):
    """Gradient and Hessian of the negative log joint in the flat unconstrained
    coordinates ``x`` (zero in the frozen ones), and the Jacobian of the flattened natural
    parameters with respect to ``x``."""
    x0, unravel = ravel_pytree(uparams)
    objective = negative_log_joint(model, unravel, x0, keep, priors, y, mask, inputs, complete)

    def natural(x):
        return ravel_pytree(from_unconstrained(model, unravel(jnp.where(keep, x, x0))))[0]

    return jax.grad(objective)(x0), jax.hessian(objective)(x0), jax.jacfwd(natural)(x0)


def standard_errors(model, params, y, *, mask=None, inputs=None, trainable=None, priors=None,
                    return_cov=False):
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
        trainable: pytree of ``True``/``False`` like ``params``; frozen leaves are treated
            as known and get NaN standard errors.
        priors: the priors of a MAP fit (pytree of numpyro distributions or ``None``).
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
    flags = trainable_flags(params, trainable)
    leaves, treedef = jax.tree.flatten(params)
    if num_free_params(model, jax.tree.unflatten(treedef, flags)) == 0:
        raise ValueError("trainable freezes every parameter: there are no standard errors")
    uparams = to_unconstrained(model, params)
    keep = coordinate_mask(uparams, flags)
    grad, hess, jac = _curvature_compiled(
        model, uparams, jnp.asarray(keep), priors, data.y, data.mask, data.inputs,
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
    frozen = np.concatenate(
        [np.full(np.size(leaf), not t) for leaf, t in zip(leaves, flags, strict=True)]
    )
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


def _row_entries(model, params):
    """``(name, flat index, leaf index)`` of each reported scalar, in pytree order.

    Symmetric matrix leaves (covariances, correlations) report their lower triangle only.
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
            rows.append((label, offset + pos, k))
        offset += math.prod(shape)
    return rows


@dataclasses.dataclass(frozen=True, repr=False)
class Summary:
    """Output of `summary`: a parameter table and fit statistics, printed as plain text.

    Attributes:
        model: the model's description (its ``repr``).
        names: one name per reported scalar parameter (``coeffs[0,0,0]``, ``cov[1,0]``...).
        estimates: ``(num_rows,)`` estimates.
        std_errors: ``(num_rows,)`` standard errors (NaN on frozen parameters).
        z: ``estimate / se``.
        p_values: two-sided normal p-values of ``theta = 0``, ``2 (1 - Phi(|z|))``.
        ci_lower: lower end of the 95% Wald interval, ``estimate - 1.96 se``.
        ci_upper: upper end, ``estimate + 1.96 se``.
        trainable: ``(num_rows,)`` booleans (``False`` for frozen parameters).
        log_lik: ``log p(y | params)``.
        log_prior: ``log p(params)`` when priors were given, else ``None``.
        num_obs: scored scalar observations ``n``.
        num_params: free parameters ``k``.
        aic, bic: ``-2 log L + 2 k`` and ``-2 log L + k log n``.
        method: the fitting method of the `~statseq.FitResult`, if one was given.
        converged: whether that fit converged.
        num_iterations: its number of iterations.
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
               f"{'[0.025':>12}{'0.975]':>12}"
        rule = "=" * len(head)
        lines = [rule] + [f"{k:<19}{v}" for k, v in info] + [rule, head, "-" * len(head)]
        for i, name in enumerate(self.names):
            est = f"{name:<{width}}{self.estimates[i]:>12.5g}"
            if not self.trainable[i]:
                lines.append(f"{est}{'(fixed)':>12}")
                continue
            lines.append(
                f"{est}{self.std_errors[i]:>12.5g}{self.z[i]:>9.3f}{self.p_values[i]:>8.3f}"
                f"{self.ci_lower[i]:>12.5g}{self.ci_upper[i]:>12.5g}"
            )
        lines.append(rule)
        if self.log_prior is not None:
            lines.append("Std. errors: curvature of the log joint (Laplace approximation).")
        return "\n".join(lines)

    __repr__ = __str__


def summary(model, params, y, *, mask=None, inputs=None, trainable=None, priors=None,
            fit=None) -> Summary:
    """A parameter table with standard errors, z statistics, p-values and 95% intervals.

    One row per scalar parameter, named from the fields of the params ``NamedTuple``
    (``coeffs[0,0,0]``, ``intercept[0]``, ...; for symmetric matrices such as covariances
    only the lower triangle ``cov[i,j]``, ``i >= j``), with

        z = estimate / se,   P>|z| = 2 (1 - Phi(|z|)),   95% CI = estimate -+ 1.96 se,

    where ``se`` comes from `standard_errors` (the observed information and the delta
    method), then the log-likelihood, number of observations ``n``, number of free
    parameters ``k``, ``AIC = -2 log L + 2 k`` and ``BIC = -2 log L + k log n`` (as
    `statseq.information_criteria`).

    Args:
        model: a statseq model.
        params: the fitted parameters (``None`` to take ``fit.params``).
        y: ``batch_shape + (num_timesteps,) + event_shape``.
        mask: optional observation mask.
        inputs: covariates, when the model takes them.
        trainable: pytree of ``True``/``False`` like ``params``; frozen leaves are shown as
            fixed and not counted in ``k``.
        priors: the priors of a MAP fit; the table then shows Laplace posterior standard
            deviations.
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
        return_cov=True,
    )
    crit = information_criteria(
        model, params, y, mask=mask, inputs=inputs, trainable=trainable
    )
    flags = trainable_flags(params, trainable)
    rows = _row_entries(model, params)
    est_flat = np.asarray(ravel_pytree(params)[0], np.float64)
    se_flat = np.concatenate([np.ravel(s) for s in jax.tree.leaves(se_tree)])
    idx = np.array([r[1] for r in rows], int)
    est, se = est_flat[idx], se_flat[idx]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = est / se
    p_values = np.array([math.erfc(abs(v) / math.sqrt(2.0)) for v in z])
    prior_term = None if priors is None else float(log_prior(priors, params))
    return Summary(
        model=repr(model),
        names=tuple(r[0] for r in rows),
        estimates=est,
        std_errors=se,
        z=z,
        p_values=p_values,
        ci_lower=est - _Z_975 * se,
        ci_upper=est + _Z_975 * se,
        trainable=np.array([flags[r[2]] for r in rows], bool),
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
