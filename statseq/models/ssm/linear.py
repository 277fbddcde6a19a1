"""The general linear Gaussian state space model, fixed or time-varying, with exact EM.

    x_0 ~ N(m, P),
    x_{t+1} = F x_t + B u_{t+1} + b + w_t,   w_t ~ N(0, Q),
    y_t     = H x_t + D u_t + d + v_t,       v_t ~ N(0, R).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints

from statseq.core.model import register_model
from statseq.core.validation import check_key, check_positive_int, float_dtype, prepare_data
from statseq.inference import kalman
from statseq.inference.gaussian import solve_discrete_lyapunov, symmetrize
from statseq.models.ssm.base import GaussianSSMBase


class LGSSMParams(NamedTuple):
    """Parameters of `LinearGaussianSSM` (``n`` states, ``D`` series, ``m`` inputs).

    Attributes:
        initial_mean: ``(n,)`` ``m``, or ``None`` unless ``initial="free"``.
        initial_cov: ``(n, n)`` ``P``, or ``None`` unless ``initial="free"``.
        dynamics_weights: ``(n, n)`` ``F``.
        dynamics_input_weights: ``(n, m)`` ``B``.
        dynamics_bias: ``(n,)`` ``b``.
        dynamics_cov: ``(n, n)`` ``Q``.
        emission_weights: ``(D, n)`` ``H``.
        emission_input_weights: ``(D, m)`` ``D``.
        emission_bias: ``(D,)`` ``d``.
        emission_cov: ``(D, D)`` ``R``.

    In `TimeVaryingLinearGaussianSSM` the dynamics leaves have a leading axis ``T - 1``
    and the emission leaves a leading axis ``T``.

    Examples:
        >>> import jax, statseq as ss
        >>> model = ss.LinearGaussianSSM(state_dim=2, emission_dim=1)
        >>> params = model.default_params()
        >>> params.dynamics_weights.shape, params.emission_weights.shape, params.emission_cov.shape
        ((2, 2), (1, 2), (1, 1))
        >>> params = params._replace(dynamics_weights=0.9 * params.dynamics_weights)
        >>> y = ss.sample(model, params, num_timesteps=20, key=jax.random.key(0))
        >>> y.shape
        (20, 1)
    """

    initial_mean: Any
    initial_cov: Any
    dynamics_weights: Any
    dynamics_input_weights: Any
    dynamics_bias: Any
    dynamics_cov: Any
    emission_weights: Any
    emission_input_weights: Any
    emission_bias: Any
    emission_cov: Any


@register_model
@dataclasses.dataclass(frozen=True)
class LinearGaussianSSM(GaussianSSMBase):
    """Linear Gaussian state space model (linear dynamical system, Kalman filter model).

        x_0 ~ N(m, P),
        x_{t+1} = F x_t + B u_{t+1} + b + w_t,   w_t ~ N(0, Q),
        y_t     = H x_t + D u_t + d + v_t,       v_t ~ N(0, R).

    The log-likelihood is the prediction error decomposition computed by the Kalman filter;
    `fit_em` has closed-form M-steps (any subset of leaves may be frozen), and
    `statseq.fit_sgd` / `statseq.fit_lbfgs` maximize the same objective by gradient.

    Args:
        state_dim: ``n``.
        emission_dim: ``D`` (``y`` of shape ``(T, D)``), or ``None`` for a scalar series.
        input_dim: ``m`` (0 for none).
        initial: ``"free"`` (``m``, ``P`` are parameters), ``"stationary"`` (the stationary
            law of the dynamics; needs ``input_dim == 0`` and stable ``F``) or
            ``"diffuse"`` (every state has infinite initial variance: the exact diffuse
            likelihood of Durbin and Koopman).

    Examples:
        >>> import jax, statseq as ss
        >>> model = ss.LinearGaussianSSM(state_dim=2, emission_dim=3)
        >>> params = model.default_params()
        >>> y = ss.sample(model, params, num_timesteps=50, key=jax.random.key(0))
        >>> y.shape
        (50, 3)
    """

    state_dim: int = 1
    emission_dim: int | None = 1
    input_dim: int = 0
    initial: Literal["free", "stationary", "diffuse"] = "free"

    #: covariances that may be singular (positive semi-definite): the Kalman filter is exact
    #: with them as long as every innovation covariance ``H P_t H^T + R`` is non-singular,
    #: which `check_params` verifies when ``R`` is singular.
    semidefinite_params: ClassVar[tuple[str, ...]] = (
        "initial_cov", "dynamics_cov", "emission_cov")

    def __post_init__(self):
        check_positive_int(self.state_dim, "state_dim")
        if self.emission_dim is not None:
            check_positive_int(self.emission_dim, "emission_dim")
        check_positive_int(self.input_dim, "input_dim", minimum=0)
        if self.initial not in ("free", "stationary", "diffuse"):
            raise ValueError(
                f"initial must be 'free', 'stationary' or 'diffuse', got {self.initial!r}"
            )
        if self.initial == "stationary" and self.input_dim:
            raise ValueError("initial='stationary' needs input_dim == 0")

    # ---- parameters -----------------------------------------------------------------------
    def _leading(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Leading axes of (dynamics, emission) leaves: none for a fixed model."""
        return (), ()

    def num_redundant_params(self, free) -> int:
        """The latent state's basis and origin are not identified: ``x_t -> S x_t + c``
        (``S`` invertible) maps ``(m, P, F, B, b, Q, H, d)`` to ``(S m + c, S P S^T, S F
        S^{-1}, S B, S b + (I - S F S^{-1}) c, S Q S^T, H S^{-1}, d - H S^{-1} c)`` with the
        same likelihood: ``n^2`` redundant parameters (``S``) when those leaves are all free
        (``n^2 - 1`` under a diffuse initial law, whose likelihood depends on ``det S``)
        and ``n`` (``c``) when ``b``, ``d`` (and ``m``) are. With time-varying matrices
        ``S_t`` and ``c_t`` vary per step: ``T (n^2 + n)`` (less 1 when diffuse); such a
        model has further, structural non-identifiability (the Jacobian test measured
        ``n^2 + n`` more), so its count is an upper bound, as it is when a group's leaves
        are partly frozen (nothing is subtracted for that group)."""
        from statseq.core.params import all_free

        n, t_len = self.state_dim, self._leading()[1]
        steps = t_len[0] if t_len else 1
        f = free
        initial = () if self.initial != "free" else (f.initial_mean, f.initial_cov)
        scale_leaves = initial + (f.dynamics_weights, f.dynamics_bias, f.dynamics_cov,
                                  f.emission_weights) + (
            (f.dynamics_input_weights,) if self.input_dim else ())
        shift_leaves = initial[:1] + (f.dynamics_bias, f.emission_bias)
        total = 0
        if all(map(all_free, scale_leaves)):
            total += steps * n * n - (self.initial == "diffuse")
        if all(map(all_free, shift_leaves)):
            total += steps * n
        return total

    def param_shapes(self) -> LGSSMParams:
        n, d, m = self.state_dim, self.dim, self.input_dim
        lead_f, lead_h = self._leading()
        free = self.initial == "free"
        return LGSSMParams(
            (n,) if free else None,
            (n, n) if free else None,
            lead_f + (n, n), lead_f + (n, m), lead_f + (n,), lead_f + (n, n),
            lead_h + (d, n), lead_h + (d, m), lead_h + (d,), lead_h + (d, d),
        )

    def param_constraints(self) -> LGSSMParams:
        free = self.initial == "free"
        real, pd = constraints.real, constraints.positive_definite
        return LGSSMParams(
            real if free else None, pd if free else None,
            real, real, real, pd, real, real, real, pd,
        )

    def default_params(self, dtype=None) -> LGSSMParams:
        """``F = 0.9 I``, ``Q = 0.1 I``, ``H`` with ones on its diagonal, ``R = 0.1 I``,
        ``m = 0``, ``P = I``; zero biases and input weights."""
        dtype = dtype or float_dtype()
        n, d, m = self.state_dim, self.dim, self.input_dim
        lead_f, lead_h = self._leading()

        def tile(a, lead):
            return jnp.broadcast_to(a, lead + a.shape).astype(dtype)

        free = self.initial == "free"
        return LGSSMParams(
            jnp.zeros((n,), dtype) if free else None,
            jnp.eye(n, dtype=dtype) if free else None,
            tile(0.9 * jnp.eye(n), lead_f), tile(jnp.zeros((n, m)), lead_f),
            tile(jnp.zeros((n,)), lead_f), tile(0.1 * jnp.eye(n), lead_f),
            tile(jnp.eye(d, n), lead_h), tile(jnp.zeros((d, m)), lead_h),
            tile(jnp.zeros((d,)), lead_h), tile(0.1 * jnp.eye(d), lead_h),
        )

    def initialize(self, y: Any, *, key: jax.Array, inputs: Any = None, mask: Any = None,
                   method: str = "data") -> LGSSMParams:
        """Starting values for every block.

        ``method="data"``: ``H`` from the leading principal directions of ``y``, ``d`` the
        mean, ``R`` half the variances of ``y``, ``Q = 0.1 I`` and a stable diagonal ``F``
        with distinct entries from 0.9 down to 0.5 (identical entries would make states
        with equal dynamics indistinguishable, and a diffuse start improper).
        ``method="random"`` (for `statseq.fit_restarts`): ``H`` standard normal, ``F``
        diagonal with entries uniform in ``(0.3, 0.98)``, and the variances on a log scale:
        ``Q = diag(0.1 * 10^u_i)``, ``R = diag(v_j * 10^w_j)`` with ``v_j`` the variance of
        ``y_j`` (plus 1e-3) and ``u_i, w_j ~ Uniform(-3, 1)`` independent, so the
        signal-to-noise ratios of random starts span several orders of magnitude.

        Args:
            y: ``batch_shape + (num_timesteps, dim)``.
            key: a ``jax.random`` key.
            inputs: covariates, when the model takes them (unused by the start).
            mask: optional observation mask.
            method: ``"data"`` or ``"random"``.

        Returns:
            `LGSSMParams`.
        """
        check_key(key)
        if self._leading() != ((), ()):
            raise NotImplementedError("initialize the time-varying model's params yourself")
        data = prepare_data(self, y, mask, inputs)
        yy = np.asarray(data.y, float).reshape(-1, self.dim)
        mm = np.asarray(data.mask).reshape(yy.shape[0], -1) & np.ones((1, self.dim), bool)
        mean = np.array([yy[mm[:, j], j].mean() if mm[:, j].any() else 0.0
                         for j in range(self.dim)])
        centred = np.where(mm, yy - mean, 0.0)
        n, d = self.state_dim, self.dim
        if method == "random":
            h = np.asarray(jax.random.normal(key, (d, n)))
        elif method == "data":
            _, s, vt = np.linalg.svd(centred, full_matrices=False)
            h = np.zeros((d, n))
            k = min(n, d)
            h[:, :k] = vt[:k].T * (s[:k] / np.sqrt(max(len(yy), 1)))
            if n > d:
                h[:, d:] = 0.1 * np.asarray(jax.random.normal(key, (d, n - d)))
        else:
            raise ValueError(f"method must be 'data' or 'random', got {method!r}")
        resid = np.var(centred, axis=0) * 0.5 + 1e-3
        diag_f, q = np.linspace(0.9, 0.5, n), np.full(n, 0.1)
        if method == "random":
            k_f, k_q, k_r = jax.random.split(jax.random.fold_in(key, 1), 3)
            diag_f = np.asarray(jax.random.uniform(k_f, (n,), minval=0.3, maxval=0.98))
            q = 0.1 * 10.0 ** np.asarray(jax.random.uniform(k_q, (n,), minval=-3.0, maxval=1.0))
            resid = (np.var(centred, axis=0) + 1e-3) * 10.0 ** np.asarray(
                jax.random.uniform(k_r, (d,), minval=-3.0, maxval=1.0))
        p = self.default_params()
        dtype = float_dtype()
        return p._replace(dynamics_weights=jnp.asarray(np.diag(diag_f), dtype),
                          emission_weights=jnp.asarray(h, dtype),
                          emission_bias=jnp.asarray(mean, dtype),
                          emission_cov=jnp.asarray(np.diag(resid), dtype),
                          dynamics_cov=jnp.asarray(np.diag(q), dtype))

    def check_params(self, params) -> None:
        """Eager checks: a stationary initial law needs a stable ``F``; with a singular
        ``R`` every innovation covariance ``H P_t H^T + R`` must be non-singular."""
        if self.initial == "stationary":
            self._check_stable(params)
        check_innovation_covariances(self, params)

    def _check_stable(self, params) -> None:
        radius = float(np.max(np.abs(np.linalg.eigvals(np.asarray(params.dynamics_weights)))))
        if radius >= 1.0:
            raise ValueError(
                f"dynamics_weights are not stable (spectral radius {radius:.4g} >= 1), so "
                "initial='stationary' is undefined; use initial='free' or 'diffuse'"
            )

    # ---- matrices ---------------------------------------------------------------------------
    def to_arrays(self, params) -> kalman.GaussianSSMArrays:
        n = self.state_dim
        dtype = params.dynamics_cov.dtype
        if self.initial == "free":
            mean0, cov0, diffuse = params.initial_mean, params.initial_cov, jnp.zeros((n, 0))
        elif self.initial == "stationary":
            f, q, b = params.dynamics_weights, params.dynamics_cov, params.dynamics_bias
            mean0 = jnp.linalg.solve(jnp.eye(n, dtype=dtype) - f, b)
            cov0, diffuse = solve_discrete_lyapunov(f, q), jnp.zeros((n, 0))
        else:
            mean0, cov0, diffuse = jnp.zeros((n,)), jnp.zeros((n, n)), jnp.eye(n)
        return kalman.GaussianSSMArrays(
            mean0.astype(dtype), cov0.astype(dtype), params.dynamics_weights,
            params.dynamics_input_weights, params.dynamics_bias, params.dynamics_cov,
            params.emission_weights, params.emission_input_weights, params.emission_bias,
            params.emission_cov, diffuse.astype(dtype),
        )

    # ---- EM -----------------------------------------------------------------------------------
    def validate_em_priors(self, priors) -> None:
        """EM for this model has no priors and needs a free or diffuse initial law."""
        if priors is not None and any(p is not None for p in jax.tree.leaves(
                priors, is_leaf=lambda x: x is None)):
            raise ValueError(
                "fit_em for linear Gaussian models takes no priors; use fit_sgd or "
                "fit_lbfgs for MAP estimates"
            )
        if self.initial == "stationary":
            raise ValueError(
                "fit_em needs initial='free' or 'diffuse' (the stationary initial law ties "
                "m and P to F and Q, so the M-step has no closed form); use fit_lbfgs"
            )
        if self._leading() != ((), ()):
            raise NotImplementedError("fit_em is for the time-invariant model")

    def e_step(self, params, y, mask, inputs):
        """Expected sufficient statistics over a flat batch ``(N, T, ...)``.

        From the smoothed moments ``mu_t``, ``V_t`` and ``C_t = Cov[x_{t+1}, x_t | y]``:
        second moments of the regressors ``z_t = (x_t, u_{t+1}, 1)`` and targets
        ``x_{t+1}`` (dynamics), and of ``w_t = (x_t, u_t, 1)`` and ``y_t`` (emissions).
        Missing entries of ``y_t`` are latent too: their conditional moments given the
        observed entries and ``x_t`` enter exactly.

        Returns:
            ``(stats, log_prob)``.
        """
        arrays = self.to_arrays(params)
        dtype = arrays.initial_cov.dtype

        def one(y_s, m_s, u_s):
            y_s = jnp.reshape(y_s, (y_s.shape[0], self.dim)).astype(dtype)
            m_s = jnp.reshape(m_s, (m_s.shape[0], -1)) & jnp.ones((1, self.dim), bool)
            post = kalman.kalman_smoother(arrays, y_s, m_s, u_s)
            return post, _em_stats(params, post, y_s, m_s, u_s)

        post, stats = jax.vmap(one)(y, mask, inputs)
        # a sequence with no observed entry (e.g. the padding of a batch sharded over
        # devices, statseq.distributed) carries no information: weight zero
        seen = jnp.any(jnp.reshape(mask, (mask.shape[0], -1)), axis=1).astype(dtype)
        stats = jax.tree.map(
            lambda a: jnp.sum(a * jnp.reshape(seen, (-1,) + (1,) * (a.ndim - 1)), axis=0),
            stats)
        stats["x0"] = post.smoothed_means[:, 0]
        stats["v0"] = post.smoothed_covs[:, 0]
        stats["seen"] = seen
        return stats, jnp.sum(post.marginal_log_lik)

    #: `fit_em` may pass boolean arrays (per-entry trainable masks) to `m_step`
    m_step_entry_masks: ClassVar[bool] = True

    def expected_log_joint(self, params, stats):
        """The expected complete-data log-likelihood ``E[log p(x, y | params)]`` under the
        posterior that produced ``stats`` (`e_step`), up to an additive constant:

            -1/2 [n_dyn log|Q| + tr(Q^{-1} (S_xx - A S_xz^T - S_xz A^T + A S_zz A^T))]

        with ``A = [F B b]``, the same with ``[H D d]``, ``R`` for the emissions and, for
        ``initial="free"``, ``-1/2 sum_s [log|P| + tr(P^{-1}(V_0 + (x_0 - m)(x_0 - m)^T))]``.
        Rows of a covariance with zero variance (deterministic, e.g. a companion row) are
        left out. `fit_em` maximizes it over tied entries (a generalized M-step); the
        closed-form `m_step` is its maximizer.
        """
        def regression(xx, xz, zz, count, blocks, cov):
            a = jnp.concatenate([blk if blk.ndim == 2 else blk[:, None] for blk in blocks],
                                axis=1).astype(zz.dtype)
            s = xx - a @ xz.T - xz @ a.T + a @ zz @ a.T
            return _gaussian_term(s, count, cov)

        out = regression(stats["xx"], stats["xz"], stats["zz"], stats["n_dyn"],
                         (params.dynamics_weights, params.dynamics_input_weights,
                          params.dynamics_bias), params.dynamics_cov)
        out = out + regression(stats["yy"], stats["yw"], stats["ww"], stats["n_emit"],
                               (params.emission_weights, params.emission_input_weights,
                                params.emission_bias), params.emission_cov)
        if self.initial == "free":
            dev = stats["x0"] - params.initial_mean
            w = stats["seen"][:, None, None]
            s = jnp.sum(w * (stats["v0"] + dev[:, :, None] * dev[:, None, :]), axis=0)
            out = out + _gaussian_term(s, jnp.sum(stats["seen"]), params.initial_cov)
        return out

    def m_step(self, params, stats, priors, inputs, trainable=None):
        """Closed-form updates: least squares for ``(F, B, b)`` and ``(H, D, d)`` given
        frozen blocks, then ``Q`` and ``R`` from the expected residual moments, ``m`` and
        ``P`` from the smoothed first state.

        ``trainable`` leaves may be boolean arrays (entries fixed at their value). When the
        rows of ``[F, B, b]`` (or ``[H, D, d]``) have different free entries, each row is
        solved in turn given the others, weighted by the current ``Q^+`` (``R^+``): a
        conditional maximization (ECM), exact for a diagonal ``Q``. A covariance mask
        (whole fixed rows and a block-diagonal free part, see `statseq.core.restrict`)
        takes the residual moments on its free entries, the exact maximizer. Rows whose
        noise variance is zero keep their weights."""
        del priors, inputs
        tr = trainable if trainable is not None else jax.tree.map(
            lambda _: True, params, is_leaf=lambda x: x is None)
        f, bu, b, q = _regression_update(
            stats["zz"], stats["xz"], stats["xx"], stats["n_dyn"],
            (params.dynamics_weights, params.dynamics_input_weights, params.dynamics_bias),
            (tr.dynamics_weights, tr.dynamics_input_weights, tr.dynamics_bias),
            params.dynamics_cov, tr.dynamics_cov,
        )
        h, du, d, r = _regression_update(
            stats["ww"], stats["yw"], stats["yy"], stats["n_emit"],
            (params.emission_weights, params.emission_input_weights, params.emission_bias),
            (tr.emission_weights, tr.emission_input_weights, tr.emission_bias),
            params.emission_cov, tr.emission_cov,
        )
        new = params._replace(
            dynamics_weights=f, dynamics_input_weights=bu, dynamics_bias=b, dynamics_cov=q,
            emission_weights=h, emission_input_weights=du, emission_bias=d, emission_cov=r,
        )
        if self.initial == "free":
            x0, v0 = stats["x0"], stats["v0"]
            m_old, p_old = params.initial_mean, params.initial_cov
            free = jnp.broadcast_to(jnp.asarray(tr.initial_mean, bool), m_old.shape)
            fm = free.astype(m_old.dtype)
            seen = stats["seen"]
            xbar = jnp.sum(seen[:, None] * x0, axis=0) / jnp.sum(seen)
            # fixed entries of m: the free ones maximize given them (conditional mean)
            a = jnp.linalg.pinv(p_old, hermitian=True)
            lhs = a * (fm[:, None] * fm[None, :]) + jnp.diag(1.0 - fm)
            delta = jnp.linalg.pinv(lhs) @ (-(a @ ((1.0 - fm) * (m_old - xbar))) * fm)
            m0 = jnp.where(free, xbar + delta, m_old)
            dev = x0 - m0
            p0 = symmetrize(jnp.sum(seen[:, None, None] * (v0 + dev[:, :, None] * dev[:, None, :]),
                                    axis=0) / jnp.sum(seen))
            p0 = jnp.where(jnp.asarray(tr.initial_cov, bool), p0, p_old)
            new = new._replace(initial_mean=m0, initial_cov=p0)
        return new


def _gaussian_term(s, count, cov):
    """``-1/2 [count log|C| + tr(C^{-1} s)]`` over the rows of ``C`` with positive variance
    (a zero variance has a zero row and column in a covariance: those rows are left out)."""
    zero = jnp.diagonal(cov) <= 0
    keep = (~zero).astype(cov.dtype)
    reg = cov + jnp.diag(zero.astype(cov.dtype))
    inv = jnp.linalg.inv(reg) * (keep[:, None] * keep[None, :])
    return -0.5 * (count * jnp.linalg.slogdet(reg)[1] + jnp.sum(inv * s))


def _singular(a, rtol=1e-10) -> bool:
    """Whether the symmetric ``a`` has an eigenvalue ``<= rtol * max |eigenvalue|``."""
    evals = np.linalg.eigvalsh(0.5 * (a + a.T))
    scale = np.abs(evals).max()
    return bool(scale == 0 or evals.min() <= rtol * scale)


def check_innovation_covariances(model, params, *, max_steps: int = 2000) -> None:
    """Raise a ValueError if some ``S_t = H P_t H^T + R`` is singular (checked only when
    ``R`` is singular, in NumPy, by the covariance recursion of a fully observed series).

    A singular ``S_t`` means that a combination of ``y_t`` is a deterministic function of
    the past: ``y`` has no density, and the filter would return NaN. With a positive definite
    ``R`` (or at steps with missing entries, where ``P_t`` only grows) ``S_t`` is
    non-singular whatever ``Q`` and ``P_0``. A time-invariant model stops the recursion
    when ``P_t`` has converged (at most ``max_steps`` steps). A diffuse initial state with a
    singular ``R`` is refused (the exact diffuse filter divides by the zero part).
    """
    r_all = np.asarray(params.emission_cov, np.float64)
    r_list = r_all.reshape((-1,) + r_all.shape[-2:])
    if not any(_singular(r) for r in r_list):
        return
    if model.initial == "diffuse":
        raise ValueError(
            "params.emission_cov is singular, which the exact diffuse filter "
            "(initial='diffuse') does not handle (its diffuse steps would divide by a zero "
            "prediction variance); use initial='free' with a proper initial_cov, or give "
            "emission_cov positive variances")
    f_all = np.asarray(params.dynamics_weights, np.float64)
    q_all = np.asarray(params.dynamics_cov, np.float64)
    h_all = np.asarray(params.emission_weights, np.float64)
    varying = f_all.ndim == 3
    if model.initial == "free":
        p = np.asarray(params.initial_cov, np.float64)
    else:
        import scipy.linalg

        p = scipy.linalg.solve_discrete_lyapunov(f_all, q_all)
    steps = h_all.shape[0] if varying else max_steps
    for t in range(steps):
        h = h_all[t] if varying else h_all
        r = r_list[t] if varying else r_list[0]
        s = h @ p @ h.T + r
        if _singular(s):
            raise ValueError(
                f"params.emission_cov is singular and so is the innovation covariance "
                f"H P_t H^T + R at step t = {t}: a combination of y_t would be a "
                "deterministic function of the past, which has no density. Give "
                "emission_cov a positive variance in that direction (or add state noise "
                "that reaches it)"
            )
        gain = np.linalg.solve(s, h @ p).T
        p_filt = p - gain @ s @ gain.T
        if varying and t == steps - 1:
            break
        f = f_all[t] if varying else f_all
        q = q_all[t] if varying else q_all
        p_next = f @ p_filt @ f.T + q
        p_next = 0.5 * (p_next + p_next.T)
        if not varying and np.abs(p_next - p).max() <= 1e-13 * (1.0 + np.abs(p).max()):
            return
        p = p_next


def _second_moments(e_xx, mu_x, r):
    """``E[z z^T]`` per step for ``z = (x, r)`` with ``r`` known: ``e_xx = E[x x^T]``
    ``(T, N, N)``, ``mu_x = E[x]`` ``(T, N)``, ``r`` ``(T, R)``; shape ``(T, N+R, N+R)``."""
    top = jnp.concatenate([e_xx, mu_x[:, :, None] * r[:, None, :]], axis=2)
    bottom = jnp.concatenate([r[:, :, None] * mu_x[:, None, :],
                              r[:, :, None] * r[:, None, :]], axis=2)
    return jnp.concatenate([top, bottom], axis=1)


def _em_stats(params, post, y, mask, u):
    """Summed second moments for one sequence (see `LinearGaussianSSM.e_step`)."""
    mu, v, c = post.smoothed_means, post.smoothed_covs, post.smoothed_cross_covs
    num_t = mu.shape[0]
    dtype = mu.dtype
    ones = jnp.ones((num_t, 1), dtype)
    exx = v + mu[:, :, None] * mu[:, None, :]  # E[x_t x_t^T]

    # dynamics: targets x_{t+1}, regressors z_t = (x_t, u_{t+1}, 1)
    r_dyn = jnp.concatenate([u[1:], ones[1:]], axis=1)
    zz = jnp.sum(_second_moments(exx[:-1], mu[:-1], r_dyn), axis=0)
    cross = c + mu[1:, :, None] * mu[:-1, None, :]  # E[x_{t+1} x_t^T]
    xz = jnp.sum(jnp.concatenate([cross, mu[1:, :, None] * r_dyn[:, None, :]], axis=2), axis=0)
    xx = jnp.sum(exx[1:], axis=0)

    # emissions: complete y_t = G x_t + g + e (observed entries fixed, missing ones latent)
    h, du, d, rcov = (params.emission_weights, params.emission_input_weights,
                      params.emission_bias, params.emission_cov)

    def impute(y_t, m_t, u_t):
        mf = m_t.astype(dtype)
        miss = 1.0 - mf
        r_oo = rcov * (mf[:, None] * mf[None, :]) + jnp.diag(miss)
        r_mo = rcov * (miss[:, None] * mf[None, :])
        k_r = jnp.linalg.solve(r_oo, r_mo.T).T  # R_mo R_oo^{-1} (zero outside m x o)
        c_t = du @ u_t + d
        h_o = h * mf[:, None]
        r_o = mf * (y_t - c_t)
        g_mat = miss[:, None] * (h - k_r @ h_o)
        g_vec = mf * y_t + miss * (c_t + k_r @ r_o)
        v_res = (miss[:, None] * miss[None, :]) * (rcov - k_r @ rcov)
        return g_mat, g_vec, symmetrize(v_res)

    g_mat, g_vec, v_res = jax.vmap(impute)(y, mask, u)
    ey = jnp.einsum("tdn,tn->td", g_mat, mu) + g_vec  # E[y_t]
    eyx = jnp.einsum("tdn,tnk->tdk", g_mat, exx) + g_vec[:, :, None] * mu[:, None, :]
    gm = jnp.einsum("tdn,tn->td", g_mat, mu)  # G E[x]
    eyy = (jnp.einsum("tdn,tnk,tek->tde", g_mat, exx, g_mat)
           + gm[:, :, None] * g_vec[:, None, :] + g_vec[:, :, None] * gm[:, None, :]
           + g_vec[:, :, None] * g_vec[:, None, :] + v_res)
    r_emit = jnp.concatenate([u, ones], axis=1)
    ww = jnp.sum(_second_moments(exx, mu, r_emit), axis=0)
    yw = jnp.sum(jnp.concatenate([eyx, ey[:, :, None] * r_emit[:, None, :]], axis=2), axis=0)
    yy = jnp.sum(eyy, axis=0)
    return {
        "zz": zz, "xz": xz, "xx": xx, "n_dyn": jnp.asarray(num_t - 1, dtype),
        "ww": ww, "yw": yw, "yy": yy, "n_emit": jnp.asarray(num_t, dtype),
    }


def _regression_update(szz, sxz, sxx, count, blocks, trainable, cov, cov_trainable):
    """Maximize ``E sum ||x - W z||^2_{Q^{-1}}`` over the free entries of ``W = [W_1 ...]``,
    then ``Q = E sum (x - W z)(x - W z)^T / count`` on its free entries.

    When every row has the same free columns the free columns solve
    ``W_free S_zz[free, free] = (S_xz - W_frozen S_zz[frozen, :])[:, free]`` (ordinary least
    squares, which is also the generalized least squares answer for any ``Q``). Otherwise
    row ``i`` solves ``W_i S_zz = S_xz[i] + sum_{l != i} A_il (S_xz[l] - W_l S_zz) / A_ii``
    on its free columns, in turn (``A = Q^+``): each row maximizes given the others.
    """
    dtype = szz.dtype
    w_old = jnp.concatenate([blk if blk.ndim == 2 else blk[:, None] for blk in blocks],
                            axis=1)
    free = jnp.concatenate([
        jnp.broadcast_to(jnp.asarray(t, bool), blk.shape).reshape(blk.shape[0], -1)
        for blk, t in zip(blocks, trainable, strict=True)], axis=1).astype(dtype)
    rows_alike = jnp.all(free == free[:1])
    w_joint = _solve_row(szz, sxz, w_old, free[0])
    a = jnp.linalg.pinv(cov, hermitian=True)
    w_rows = w_old
    for i in range(w_old.shape[0]):
        resid = sxz - w_rows @ szz  # (rows, k)
        a_ii = a[i, i]
        others = (a[i] * (jnp.arange(a.shape[0]) != i)) @ resid
        target = sxz[i] + others / jnp.where(a_ii > 0, a_ii, 1.0)
        row = _solve_row(szz, target[None, :], w_rows[i:i + 1], free[i])[0]
        w_rows = w_rows.at[i].set(jnp.where(a_ii > 0, row, w_rows[i]))
    w_new = jnp.where(rows_alike, w_joint, w_rows)
    s = symmetrize((sxx - w_new @ sxz.T - sxz @ w_new.T + w_new @ szz @ w_new.T) / count)
    cov_new = jnp.where(jnp.asarray(cov_trainable, bool), s, cov)
    out, start = [], 0
    for blk in blocks:
        width = blk.shape[-1] if blk.ndim == 2 else 1
        part = w_new[:, start:start + width]
        out.append(part if blk.ndim == 2 else part[:, 0])
        start += width
    return (*out, cov_new)


def _solve_row(szz, sxz, w_old, free):
    """Least squares of the rows of ``sxz`` on the ``free`` columns, the others fixed."""
    fixed = 1.0 - free
    lhs = szz * (free[:, None] * free[None, :]) + jnp.diag(fixed)
    rhs = (sxz - (w_old * fixed[None, :]) @ szz) * free[None, :] + w_old * fixed[None, :]
    w_new = jnp.linalg.solve(lhs.T, rhs.T).T
    return jnp.where(free[None, :] > 0, w_new, w_old)


@register_model
@dataclasses.dataclass(frozen=True)
class TimeVaryingLinearGaussianSSM(LinearGaussianSSM):
    """`LinearGaussianSSM` with different matrices at every step.

        x_{t+1} = F_t x_t + B_t u_{t+1} + b_t + w_t,   w_t ~ N(0, Q_t),
        y_t     = H_t x_t + D_t u_t + d_t + v_t,       v_t ~ N(0, R_t).

    Dynamics leaves have a leading axis ``num_timesteps - 1`` (entry ``t`` is the step from
    ``x_t`` to ``x_{t+1}``), emission leaves a leading axis ``num_timesteps``; ``y`` must
    have exactly ``num_timesteps`` steps. Forecasts beyond the data reuse the last matrices.

    Examples:
        >>> import jax, statseq as ss
        >>> model = ss.TimeVaryingLinearGaussianSSM(state_dim=1, emission_dim=1,
        ...                                          num_timesteps=20)
        >>> params = model.default_params()
        >>> params.dynamics_weights.shape, params.emission_weights.shape
        ((19, 1, 1), (20, 1, 1))
    """

    num_timesteps: int = 2

    #: its matrices have a time axis of the data's length: never padded to a bucket length
    supports_length_buckets: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.num_timesteps, "num_timesteps", minimum=2)
        if self.initial == "stationary":
            raise ValueError("a time-varying model has no stationary law: use 'free'")

    def _leading(self):
        return (self.num_timesteps - 1,), (self.num_timesteps,)

    def _check_num_timesteps(self, num_timesteps: int) -> None:
        if num_timesteps != self.num_timesteps:
            raise ValueError(
                f"y has {num_timesteps} time steps but the model's matrices are for "
                f"num_timesteps={self.num_timesteps}"
            )

    def validate_data(self, y, mask) -> None:
        self._check_num_timesteps(np.shape(y)[np.ndim(y) - 1 - len(self.event_shape)])
