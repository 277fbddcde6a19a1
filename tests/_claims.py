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


def grid_two_step(model, params, carry, y_future, *, inputs_future=None, num_points=8001,
                  key=None):
    """``log p(y_{T+2} | y_{1:T})`` for a scalar emission by a fine grid over ``y_{T+1}``.

    Continuous: composite Simpson over ``[min - 8 sd, max + 8 sd]`` of 4096 draws of
    ``y_{T+1}``; discrete: the sum over ``0, ..., 3 max + 50``.
    """
    y = jnp.asarray(y_future)
    u = _inputs(model, inputs_future, 2, y.dtype)
    full = jnp.ones(tuple(model.event_shape), bool)
    d1 = model.predict(params, carry, u[0])
    key = jax.random.key(12345) if key is None else key
    draws = np.asarray(d1.sample(key, (4096,)), float).reshape(4096, -1)
    if draws.shape[1] != 1:
        raise ValueError("grid_two_step needs a scalar emission")

    def cond(x):
        c = model.update(params, carry, _as_event(model, x).astype(y.dtype), full, u[0])
        return model.predict(params, c, u[1]).log_prob(y[1])

    if _is_discrete(d1):
        xs = jnp.arange(0, 3 * int(draws.max()) + 51, dtype=y.dtype)
        lp1 = jax.vmap(lambda x: d1.log_prob(_as_event(model, x)))(xs)
        return float(jax.scipy.special.logsumexp(lp1 + jax.vmap(cond)(xs)))
    sd = draws.std()
    lo, hi = draws.min() - 8 * sd, draws.max() + 8 * sd
    n = num_points + (num_points % 2 == 0)
    xs = jnp.linspace(lo, hi, n, dtype=y.dtype)
    lp1 = jax.vmap(lambda x: d1.log_prob(_as_event(model, x)))(xs)
    f = jnp.exp(lp1 + jax.vmap(cond)(xs))
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return float(np.log(np.sum(w * np.asarray(f)) * (hi - lo) / (n - 1) / 3))


def _gaussian_components(d):
    """``(weights, means, sds)`` of a scalar Gaussian or finite Gaussian mixture, else None."""
    if isinstance(d, dist.MixtureSameFamily):
        comp = d.component_distribution
        w = d.mixing_distribution.probs
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


def gauss_hermite(model, params, carry, y_future, k, *, inputs_future=None, order=60):
    """``log p(y_{T+k} | y_{1:T})``, ``k = 2`` or ``3``, by nested Gauss-Hermite quadrature
    over each Gaussian component of the intermediate predictives; None if a predictive is not
    a (mixture of) scalar Gaussian(s)."""
    y = jnp.asarray(y_future)
    u = _inputs(model, inputs_future, k, y.dtype)
    full = jnp.ones(tuple(model.event_shape), bool)
    nodes, weights = np.polynomial.hermite.hermgauss(order)

    def rec(c, j):
        d = model.predict(params, c, u[j])
        if j == k - 1:
            return float(np.exp(d.log_prob(y[j])))
        comps = _gaussian_components(d)
        if comps is None:
            return None
        total = 0.0
        for wc, m, s in zip(*(np.asarray(a, float) for a in comps), strict=True):
            if wc == 0:
                continue
            xs = m + np.sqrt(2.0) * s * nodes
            for x, wq in zip(xs, weights, strict=True):
                c2 = model.update(params, c, _as_event(model, x).astype(y.dtype), full, u[j])
                inner = rec(c2, j + 1)
                if inner is None:
                    return None
                total += wc * wq / np.sqrt(np.pi) * inner
        return total

    if k not in (2, 3):
        raise ValueError("gauss_hermite nests k - 1 = 1 or 2 levels")
    out = rec(carry, 0)
    return None if out is None else float(np.log(out))


# ------------------------------------------------------------------------------------------
# the assertion every family calls


def check_marginal_predictive(model, params, y_hist, y_future, *, statseq_values=None,
                              statseq_se=None, inputs_hist=None, inputs_future=None,
                              key=None, num_paths=20_000, grid_tol=1e-6,
                              quadrature=True):
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
    d1 = model.predict(params, carry, u_f[0])
    one = float(d1.log_prob(jnp.asarray(y_future[0])))
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
            for k in range(2, min(h, 3) + 1):
                v = gauss_hermite(model, params, carry, y_future[:k], k, inputs_future=u_f[:k])
                if v is None:
                    break
                gh[k] = v
                np.testing.assert_allclose(got[k - 1], v, rtol=0,
                                           atol=grid_tol + 4 * got_se[k - 1],
                                           err_msg=f"k = {k}: Gauss-Hermite")
            out["gh"] = gh
    bound = 4 * np.sqrt(mc_se**2 + got_se**2) + 1e-9
    bad = np.abs(got - mc) > bound
    assert not bad.any(), (
        f"h-step marginals outside 4 standard errors of the ancestral Monte Carlo: "
        f"statseq {got}, reference {mc} +- {mc_se}, statseq se {got_se}")
    return out
