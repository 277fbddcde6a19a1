"""The claims audit's one helper: independent references for h-step predictive densities.

Every statseq function that reports ``log p(y_{T+k} | y_{1:T})`` (``log_predictive_density``
with ``marginal=True``, ``backtest``'s per-horizon ``log_score``) is checked here against
the *definition*

    p(y_{T+k} | y_{1:T}) = E[ p(y_{T+k} | y_{1:T}, Y_{T+1:T+k-1}) ],
    Y_{T+1:T+k-1} ~ the model's own ancestral sampler from the filtered state,

computed three independent ways from nothing but the model's one-step predictive
(``predict``) and its update on *fully observed* values (``update`` with an all-true mask;
masked steps, the path under test, are never used):

* `grid_two_step`: ``k = 2`` for a scalar emission, the integral over ``y_{T+1}`` on a fine
  Simpson grid (continuous) or the sum over the support (discrete);
* `gauss_hermite`: ``k = 2, 3`` when each one-step predictive is a Gaussian or a finite
  mixture of Gaussians, nested Gauss-Hermite quadrature per mixture component (exact for
  linear-Gaussian steps up to rounding);
* `rb_monte_carlo`: any ``k`` and any model, the Rao-Blackwellised ancestral average above
  with its Monte Carlo standard error (on the log scale, by the delta method).

For linear Gaussian state space models, `dense_gaussian_marginals` (and
`dense_log_densities`) give the same predictive by stacking the whole model into one
Gaussian vector and conditioning densely, with no Kalman recursion.

`check_marginal_predictive` runs them and asserts agreement: ``k = 1`` to 1e-10 against the
one-step predictive, ``k = 2`` to ``grid_tol`` against the grid and quadrature, every ``k``
within 4 standard errors of the Monte Carlo average (both standard errors when statseq's
number is itself an estimate). Every model family calls it (tests/evaluation/test_claims.py);
families added later must call it too.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

import statseq as ss

# ------------------------------------------------------------------------------------------
# the filtered state, by the model's own update on fully observed values


@partial(jax.jit, static_argnums=0)
def _filtered(model, params, y, inputs):
    full = jnp.ones(tuple(model.event_shape), bool)

    def body(c, xs):
        y_t, u_t = xs
        return model.update(params, c, y_t, full, u_t), None

    return jax.lax.scan(body, model.initial_carry(params), (y, inputs))[0]


def _inputs(model, inputs, n, dtype):
    # inputs are real-valued even when y is a count (the dtype of y would truncate them)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    if inputs is None:
        return jnp.zeros((n, max(int(model.num_inputs), 0)), dtype)
    return jnp.asarray(inputs, dtype)


def filtered_carry(model, params, y_hist, inputs_hist=None):
    """The carry after ``y_hist`` (``(T,) + event_shape``, fully observed)."""
    y = jnp.asarray(y_hist)
    return _filtered(model, params, y, _inputs(model, inputs_hist, y.shape[0], y.dtype))


def _as_event(model, v):
    return jnp.reshape(jnp.asarray(v), tuple(model.event_shape))


# ------------------------------------------------------------------------------------------
# references


@partial(jax.jit, static_argnums=(0, 5))
def _rb_paths(model, params, carry, y_future, inputs, num_paths, key):
    full = jnp.ones(tuple(model.event_shape), bool)

    def one(k):
        def body(c, xs):
            y_t, u_t, kk = xs
            d = model.predict(params, c, u_t)
            lp = d.log_prob(y_t)
            draw = d.sample(kk)
            return model.update(params, c, draw, full, u_t), lp

        keys = jax.random.split(k, y_future.shape[0])
        return jax.lax.scan(body, carry, (y_future, inputs, keys))[1]

    return jax.vmap(one)(jax.random.split(key, num_paths))  # (S, h)


def rb_monte_carlo(model, params, carry, y_future, *, key, num_paths=20_000,
                   inputs_future=None):
    """Rao-Blackwellised ancestral Monte Carlo: ``(log p_k (h,), standard errors (h,))``.

    Path ``s`` draws ``y_{T+1}, y_{T+2}, ...`` from the model's own predictives; the
    estimate of ``p(y_{T+k} | y_{1:T})`` averages the conditional density of the *observed*
    ``y_{T+k}`` given the first ``k - 1`` draws of each path.
    """
    y = jnp.asarray(y_future)
    u = _inputs(model, inputs_future, y.shape[0], y.dtype)
    lp = np.asarray(_rb_paths(model, params, carry, y, u, int(num_paths), key), float)
    top = lp.max(axis=0)
    w = np.exp(lp - top)
    mean = w.mean(axis=0)
    est = np.log(mean) + top
    se = w.std(axis=0, ddof=1) / np.sqrt(lp.shape[0]) / mean
    return est, se


def _is_discrete(d):
    return bool(getattr(d.support, "is_discrete", False))


@partial(jax.jit, static_argnums=0)
def _grid_terms(model, params, carry, y, u, xs):
    """``log p(y_{T+1} = x) + log p(y_{T+2} | y_{T+1} = x)`` at every grid point ``x``."""
    full = jnp.ones(tuple(model.event_shape), bool)
    d1 = model.predict(params, carry, u[0])

    def one(x):
        x = _as_event(model, x).astype(y.dtype)
        c = model.update(params, carry, x, full, u[0])
        return d1.log_prob(x) + model.predict(params, c, u[1]).log_prob(y[1])

    return jax.vmap(one)(xs)


_DISCRETE = {}  # model -> whether its one-step predictive is discrete (seen when traced)


@partial(jax.jit, static_argnums=(0, 5))
def _first_step(model, params, carry, y0, u0, num_draws, key):
    """The one-step predictive at the origin, compiled once per model: ``log p(y0)`` and
    ``num_draws`` draws (eager, its dozens of small ops each compiled on their own, cost
    more than this one program)."""
    d1 = model.predict(params, carry, u0)
    _DISCRETE[model] = _is_discrete(d1)
    return d1.log_prob(y0), d1.sample(key, (num_draws,))


def grid_two_step(model, params, carry, y_future, *, inputs_future=None, num_points=8001,
                  key=None):
    """``log p(y_{T+2} | y_{1:T})`` for a scalar emission by a fine grid over ``y_{T+1}``.

    Continuous: composite Simpson over ``[min - 8 sd, max + 8 sd]`` of 4096 draws of
    ``y_{T+1}``; discrete: the sum over ``0, ..., 3 max + 50``.
    """
    y = jnp.asarray(y_future)
    u = _inputs(model, inputs_future, 2, y.dtype)
    key = jax.random.key(12345) if key is None else key
    draws = _first_step(model, params, carry, y[0], u[0], 4096, key)[1]
    draws = np.asarray(draws, float).reshape(4096, -1)
    if draws.shape[1] != 1:
        raise ValueError("grid_two_step needs a scalar emission")
    if _DISCRETE[model]:
        xs = jnp.arange(0, 3 * int(draws.max()) + 51, dtype=y.dtype)
        return float(jax.scipy.special.logsumexp(_grid_terms(model, params, carry, y, u, xs)))
    sd = draws.std()
    lo, hi = draws.min() - 8 * sd, draws.max() + 8 * sd
    n = num_points + (num_points % 2 == 0)
    xs = jnp.linspace(lo, hi, n, dtype=y.dtype)
    f = np.exp(np.asarray(_grid_terms(model, params, carry, y, u, xs)))
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return float(np.log(np.sum(w * f) * (hi - lo) / (n - 1) / 3))


def _gaussian_components(d):
    """``(weights, means, sds)`` of a scalar Gaussian or finite Gaussian mixture, else None."""
    if isinstance(d, dist.MixtureSameFamily):
        comp = d.component_distribution
        w = d.mixing_distribution.probs
        if isinstance(comp, dist.Independent) and comp.event_shape == (1,):
            comp = comp.base_dist
        if isinstance(comp, dist.Normal):
            return w, comp.loc.reshape(-1), comp.scale.reshape(-1)
        if isinstance(comp, dist.MultivariateNormal) and comp.event_shape == (1,):
            return w, comp.loc.reshape(-1), jnp.sqrt(comp.covariance_matrix.reshape(-1))
        return None
    if isinstance(d, dist.Normal):
        return jnp.ones(1), d.loc.reshape(-1), d.scale.reshape(-1)
    if isinstance(d, dist.MultivariateNormal) and d.event_shape == (1,):
        return jnp.ones(1), d.loc.reshape(-1), jnp.sqrt(d.covariance_matrix.reshape(-1))
    if isinstance(d, dist.Independent):
        return _gaussian_components(d.base_dist)
    return None


class _NotGaussian(Exception):
    pass


@partial(jax.jit, static_argnums=(0, 5, 6))
def _gh_nested(model, params, carry, y, u, k, order):
    nodes, weights = np.polynomial.hermite.hermgauss(order)
    nodes = jnp.asarray(nodes, y.dtype)
    weights = jnp.asarray(weights / np.sqrt(np.pi), y.dtype)
    full = jnp.ones(tuple(model.event_shape), bool)

    def expand(c, j):
        # one carry -> (carries at the nodes of every component, their weights)
        d = model.predict(params, c, u[j])
        comps = _gaussian_components(d)
        if comps is None:
            raise _NotGaussian
        w, m, sd = (jnp.asarray(a, y.dtype).reshape(-1) for a in comps)
        xs = (m[:, None] + np.sqrt(2.0) * sd[:, None] * nodes).reshape(-1)
        ws = (w[:, None] * weights).reshape(-1)
        xs = jnp.where(ws > 0, xs, m[jnp.argmax(w)])  # padded components: a harmless point
        new = jax.vmap(lambda x: model.update(params, c, _as_event(model, x).astype(y.dtype),
                                              full, u[j]))(xs)
        return new, ws

    carries = jax.tree.map(lambda a: a[None], carry)
    wts = jnp.ones(1, y.dtype)
    out = []  # log p(y_{T+j+2} | y_{1:T}) for j = 0..k-2: every level, one program
    for j in range(k - 1):
        new, ws = jax.vmap(lambda c, j=j: expand(c, j))(carries)
        carries = jax.tree.map(lambda a: a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:]),
                               new)
        wts = (wts[:, None] * ws).reshape(-1)
        lp = jax.vmap(lambda c, j=j: model.predict(params, c, u[j + 1]).log_prob(y[j + 1]))(
            carries)
        lp = jnp.where(wts > 0, lp, -jnp.inf)
        out.append(jax.scipy.special.logsumexp(lp, b=wts))
    return jnp.stack(out)


def gauss_hermite(model, params, carry, y_future, k, *, inputs_future=None, order=60):
    """``log p(y_{T+k} | y_{1:T})``, ``k = 2`` or ``3``, by nested Gauss-Hermite quadrature
    over each Gaussian component of the intermediate predictives; None if a predictive is not
    a (mixture of) scalar Gaussian(s). The nodes of every level are evaluated at once
    (``vmap`` over the carries), ``(C order)^(k-1)`` updates for ``C`` components."""
    if k not in (2, 3):
        raise ValueError("gauss_hermite nests k - 1 = 1 or 2 levels")
    y = jnp.asarray(y_future)
    u = _inputs(model, inputs_future, k, y.dtype)
    out = _gauss_hermite_levels(model, params, carry, y, u, k, order)
    return None if out is None else float(out[-1])


def _gauss_hermite_levels(model, params, carry, y, u, k, order):
    """``[log p(y_{T+j} | y_{1:T}) for j = 2..k]`` in one program (None: not Gaussian)."""
    try:
        return np.asarray(_gh_nested(model, params, carry, y[:k], u[:k], int(k), int(order)))
    except _NotGaussian:
        return None


# ------------------------------------------------------------------------------------------
# dense Gaussian conditioning (linear Gaussian state space models)


def dense_gaussian_marginals(model, params, y_hist, num_steps, *, inputs_hist=None,
                             inputs_future=None):
    """The joint law of ``y_{T+1:T+h} | y_{1:T}`` of a linear Gaussian state space model by
    stacking the whole model into one Gaussian vector and conditioning densely.

    The model's matrices come from ``model.to_arrays(params)`` (the model written as
    ``x_0 = m + A delta + e_0``, ``e_0 ~ N(0, P)``; ``x_{t+1} = F_t x_t + B_t u_{t+1} + b_t +
    w_t``; ``y_t = H_t x_t + D_t u_t + d_t + v_t``). Every ``y_t``, ``t < T + h``, is written as
    an affine function of the independent noises ``(e_0, w_0, ..., v_0, ...)`` and of the
    diffuse coefficients ``delta``; the stacked mean and covariance are formed explicitly and
    conditioned by the Schur complement (pseudo-inverse, so singular ``Q`` and ``R`` are
    exact). Diffuse directions (``A`` non-empty, flat prior on ``delta``) are conditioned by
    generalized least squares (the limit ``kappa -> infinity`` of ``delta ~ N(0, kappa I)``,
    universal kriging):

        delta_hat = S^{-1} G_h' S_hh^+ (y_h - mu_h),   S = G_h' S_hh^+ G_h,
        mean_f = mu_f + K (y_h - mu_h) + (G_f - K G_h) delta_hat,   K = S_fh S_hh^+,
        cov_f = S_ff - K S_hf + (G_f - K G_h) S^{-1} (G_f - K G_h)'.

    No Kalman recursion is involved: the cost is cubic in ``(T + h) D``, so keep ``T`` small.

    Args:
        model: a model with ``to_arrays`` (`LinearGaussianSSM`, its time-varying form,
            `StructuralModel`, `LocalLevel`, `LocalLinearTrend`).
        params: its parameters.
        y_hist: ``(T, D)`` or ``(T,)`` fully observed history.
        num_steps: ``h``.
        inputs_hist: ``(T, m)`` inputs of the history (if the model takes inputs).
        inputs_future: ``(h, m)`` inputs of the forecast steps.

    Returns:
        ``(mean (h, D), cov (h D, h D))``: the joint predictive of the ``h`` future steps
        (row-major: step, then dimension). Its diagonal ``D x D`` blocks are the h-step
        marginals.
    """
    arr = model.to_arrays(params)
    f = lambda name: np.asarray(getattr(arr, name), float)  # noqa: E731
    m0, p0, a0 = f("initial_mean"), f("initial_cov"), f("initial_diffuse")
    n = m0.shape[0]
    a0 = a0.reshape(n, -1)
    q = a0.shape[1]
    base = {"dynamics_weights": 2, "dynamics_input_weights": 2, "dynamics_bias": 1,
            "dynamics_cov": 2, "emission_weights": 2, "emission_input_weights": 2,
            "emission_bias": 1, "emission_cov": 2}
    leaves = {k: f(k) for k in base}

    def at(name, t):
        v = leaves[name]
        if v.ndim > base[name]:
            return v[min(t, v.shape[0] - 1)]
        return v

    y_h = np.asarray(y_hist, float)
    num_t = y_h.shape[0]
    dim = at("emission_weights", 0).shape[0]
    y_h = y_h.reshape(num_t, dim)
    big_n = num_t + int(num_steps)
    num_in = at("dynamics_input_weights", 0).shape[1]
    if num_in:
        u = np.concatenate([np.asarray(inputs_hist, float).reshape(num_t, num_in),
                            np.asarray(inputs_future, float).reshape(num_steps, num_in)])
    else:
        u = np.zeros((big_n, 0))
    # noises: e_0 (n), w_0..w_{N-2} (n each), v_0..v_{N-1} (D each)
    num_xi = n + (big_n - 1) * n + big_n * dim
    omega = np.zeros((num_xi, num_xi))
    omega[:n, :n] = p0
    for t in range(big_n - 1):
        s = n + t * n
        omega[s:s + n, s:s + n] = at("dynamics_cov", t)
    v0 = n + (big_n - 1) * n
    for t in range(big_n):
        s = v0 + t * dim
        omega[s:s + dim, s:s + dim] = at("emission_cov", t)
    # x_t = mx + gx delta + lx xi
    mx, gx = m0.copy(), a0.copy()
    lx = np.zeros((n, num_xi))
    lx[:, :n] = np.eye(n)
    mu = np.zeros((big_n, dim))
    g = np.zeros((big_n, dim, q))
    lo = np.zeros((big_n, dim, num_xi))
    for t in range(big_n):
        h_t = at("emission_weights", t)
        mu[t] = h_t @ mx + at("emission_input_weights", t) @ u[t] + at("emission_bias", t)
        g[t] = h_t @ gx
        lo[t] = h_t @ lx
        lo[t][:, v0 + t * dim:v0 + (t + 1) * dim] += np.eye(dim)
        if t + 1 < big_n:
            f_t = at("dynamics_weights", t)
            mx = f_t @ mx + at("dynamics_input_weights", t) @ u[t + 1] + at("dynamics_bias", t)
            gx = f_t @ gx
            lx = f_t @ lx
            lx[:, n + t * n:n + (t + 1) * n] += np.eye(n)
    mu = mu.reshape(-1)
    g = g.reshape(big_n * dim, q)
    lo = lo.reshape(big_n * dim, num_xi)
    sigma = lo @ omega @ lo.T
    k_h = num_t * dim
    s_hh, s_fh, s_ff = sigma[:k_h, :k_h], sigma[k_h:, :k_h], sigma[k_h:, k_h:]
    s_hh_pinv = np.linalg.pinv(s_hh, hermitian=True)
    gain = s_fh @ s_hh_pinv
    resid = y_h.reshape(-1) - mu[:k_h]
    mean = mu[k_h:] + gain @ resid
    cov = s_ff - gain @ s_fh.T
    if q:
        g_h, g_f = g[:k_h], g[k_h:]
        info = g_h.T @ s_hh_pinv @ g_h
        delta = np.linalg.solve(info, g_h.T @ s_hh_pinv @ resid)
        g_t = g_f - gain @ g_h
        mean = mean + g_t @ delta
        cov = cov + g_t @ np.linalg.solve(info, g_t.T)
    return mean.reshape(int(num_steps), dim), 0.5 * (cov + cov.T)


def dense_log_densities(model, params, y_hist, y_future, *, inputs_hist=None,
                        inputs_future=None):
    """``(log p(y_{T+k} | y_{1:T}) for k = 1..h, log p(y_{T+1:T+h} | y_{1:T}))`` from
    `dense_gaussian_marginals`: the h-step marginals and the joint of the block."""
    import scipy.stats

    y_f = np.asarray(y_future, float)
    h = y_f.shape[0]
    mean, cov = dense_gaussian_marginals(model, params, y_hist, h, inputs_hist=inputs_hist,
                                         inputs_future=inputs_future)
    dim = mean.shape[1]
    y_f = y_f.reshape(h, dim)
    marg = np.array([
        scipy.stats.multivariate_normal(mean[k], cov[k * dim:(k + 1) * dim,
                                                     k * dim:(k + 1) * dim]).logpdf(y_f[k])
        for k in range(h)])
    joint = scipy.stats.multivariate_normal(mean.reshape(-1), cov).logpdf(y_f.reshape(-1))
    return marg, float(joint)


# ------------------------------------------------------------------------------------------
# the assertion every family calls


def check_marginal_predictive(model, params, y_hist, y_future, *, statseq_values=None,
                              statseq_se=None, inputs_hist=None, inputs_future=None,
                              key=None, num_paths=20_000, grid_tol=1e-6,
                              quadrature=True, others=None):
    """Assert that statseq's h-step marginal log densities equal the independent references.

    Args:
        model, params: the model under test.
        y_hist: ``(T,) + event_shape`` history (fully observed).
        y_future: ``(h,) + event_shape`` held-out values.
        statseq_values: the numbers under test; default
            ``ss.log_predictive_density(..., marginal=True)``.
        statseq_se: their Monte Carlo standard errors when they are estimates (None: exact).
        key: key of the reference Monte Carlo.
        num_paths: its number of paths.
        grid_tol: absolute tolerance of the ``k = 1, 2`` exact comparisons (widened by
            ``4 statseq_se`` for estimates).
        quadrature: also compare with Gauss-Hermite at ``k = 2, 3`` when it applies.
        others: optional ``{label: (h,) values}``: further statseq entry points that claim
            the same exact h-step marginals (a forecast object's ``log_prob``, `backtest`'s
            per-horizon ``log_score``, ...); each is held to the same references and
            tolerances as ``statseq_values`` (treated as exact).

    Returns:
        A dict of the references (``"mc"``, ``"mc_se"``, ``"grid2"``, ``"gh"``) for reports.
    """
    y_hist = np.asarray(y_hist)
    y_future = np.asarray(y_future)
    h = y_future.shape[0]
    if statseq_values is None:
        kw = {}
        if inputs_hist is not None:
            kw = dict(inputs_train=inputs_hist, inputs_test=inputs_future)
        statseq_values = ss.log_predictive_density(model, params, y_hist, y_future,
                                                   marginal=True, **kw)
    got = np.asarray(statseq_values, float)
    got_se = np.zeros(h) if statseq_se is None else np.asarray(statseq_se, float)
    assert got.shape == (h,) and np.all(np.isfinite(got)), got
    carry = filtered_carry(model, params, y_hist, inputs_hist)
    u_f = _inputs(model, inputs_future, h, jnp.asarray(y_future).dtype)
    out = {}
    one = float(_first_step(model, params, carry, jnp.asarray(y_future[0]), u_f[0], 4096,
                            jax.random.key(12345))[0])  # the draws serve grid_two_step
    np.testing.assert_allclose(got[0], one, rtol=0, atol=1e-10 + 4 * got_se[0],
                               err_msg="k = 1: one-step predictive")
    key = jax.random.key(2024) if key is None else key
    mc, mc_se = rb_monte_carlo(model, params, carry, y_future, key=key, num_paths=num_paths,
                               inputs_future=inputs_future)
    out["mc"], out["mc_se"] = mc, mc_se
    if h >= 2 and int(np.prod(model.event_shape)) == 1:
        g2 = grid_two_step(model, params, carry, y_future[:2], inputs_future=u_f[:2])
        out["grid2"] = g2
        np.testing.assert_allclose(got[1], g2, rtol=0, atol=grid_tol + 4 * got_se[1],
                                   err_msg="k = 2: fine grid over y_{T+1}")
        if quadrature:
            gh = {}
            yq = jnp.asarray(y_future)
            top = min(h, 3)
            levels = _gauss_hermite_levels(model, params, carry, yq, u_f, top, 60)
            if levels is None and top == 3:  # the second predictive is not Gaussian
                levels = _gauss_hermite_levels(model, params, carry, yq, u_f, 2, 60)
            for k, v in enumerate([] if levels is None else levels, start=2):
                gh[k] = float(v)
                np.testing.assert_allclose(got[k - 1], v, rtol=0,
                                           atol=grid_tol + 4 * got_se[k - 1],
                                           err_msg=f"k = {k}: Gauss-Hermite")
            out["gh"] = gh
    bound = 4 * np.sqrt(mc_se**2 + got_se**2) + 1e-9
    bad = np.abs(got - mc) > bound
    assert not bad.any(), (
        f"h-step marginals outside 4 standard errors of the ancestral Monte Carlo: "
        f"statseq {got}, reference {mc} +- {mc_se}, statseq se {got_se}")
    for label, vals in (others or {}).items():
        v = np.asarray(vals, float).reshape(-1)
        assert v.shape == (h,) and np.all(np.isfinite(v)), (label, v)
        np.testing.assert_allclose(v[0], one, rtol=0, atol=1e-10,
                                   err_msg=f"{label}: k = 1 one-step predictive")
        if "grid2" in out:
            np.testing.assert_allclose(v[1], out["grid2"], rtol=0, atol=grid_tol,
                                       err_msg=f"{label}: k = 2 fine grid")
        for k, ref in out.get("gh", {}).items():
            np.testing.assert_allclose(v[k - 1], ref, rtol=0, atol=grid_tol,
                                       err_msg=f"{label}: k = {k} Gauss-Hermite")
        bad = np.abs(v - mc) > 4 * mc_se + 1e-9
        assert not bad.any(), (f"{label}: outside 4 standard errors of the ancestral Monte "
                               f"Carlo: {v}, reference {mc} +- {mc_se}")
    return out
