"""Model checking for every model: one-step PIT, quantile and standardized residuals.

Every statseq model is a filter whose one-step predictive ``p(y_t | y_{<t})`` comes from
the carry (`statseq.filter` with ``return_carries=True``), so the same residuals exist for
every family:

* the probability integral transform ``u_t = F_t(y_t)`` of the one-step predictive cdf
  ``F_t``; for discrete data the randomized PIT ``u_t ~ U(F_t(y_t - 1), F_t(y_t))``
  (Dunn and Smyth 1996), which for HMMs are the "pseudo-residuals" of Zucchini, MacDonald
  and Langrock (2016, ch. 6). Under a correct model the ``u_t`` are i.i.d. ``U(0, 1)``;
* the normal quantile residuals ``Phi^{-1}(u_t)``, i.i.d. ``N(0, 1)`` under the model;
* for Gaussian predictives (state space models, AR, Gaussian RNN heads) the standardized
  prediction errors ``e_t = L_t^{-1} (y_t - E[y_t | y_{<t}])`` with ``L_t L_t^T = F_t`` the
  Cholesky factor of the predictive covariance (``v_t / sqrt(F_t)`` for a scalar series),
  statsmodels' ``standardized_forecasts_error``.

Missing steps, the steps a model conditions on (``model.num_conditioned_steps``) and the
steps before the data identify a diffuse state give NaN. `diagnose` collects the
residuals with the tests of `statseq.evaluation.stattests`; auxiliary residuals of state
space models are in `statseq.evaluation.auxiliary`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import ndtri

from statseq.core.distributions import _is_discrete, marginal_cdf, scalar_cdf
from statseq.core.params import validate_params
from statseq.core.recurrence import run_filter, vmap_or_one
from statseq.core.validation import check_key, prepare_data
from statseq.evaluation import stattests


def _whiten(y, mean, cov, mask):
    """``L^{-1} (y - mean)`` over the observed entries (NaN elsewhere), ``L L^T = cov``."""
    m = mask.astype(cov.dtype)
    masked = cov * (m[:, None] * m[None, :]) + jnp.diag(1.0 - m)
    chol = jnp.linalg.cholesky(masked)
    v = jnp.where(mask, y - mean, 0.0)
    return jnp.where(mask, jsl.solve_triangular(chol, v, lower=True), jnp.nan)


def _step_quantities(model, params, carry, y_t, mask_t, u_t):
    """Residual ingredients of one step from the predictive ``model.predict(carry)``.

    Returns ``{"z": ...}`` (standardized error) for a Gaussian predictive (a diagonal
    one, ``Independent(Normal)``, included), ``{"u": F(y)}`` for another continuous one
    and ``{"lo": F(y - 1), "hi": F(y)}`` for a discrete one.
    """
    d = model.predict(params, carry, u_t)
    event = tuple(model.event_shape)
    mask = jnp.broadcast_to(jnp.reshape(mask_t, jnp.shape(mask_t) + (1,) * (
        len(event) - jnp.ndim(mask_t))), event)
    if isinstance(d, dist.Normal) and event == ():
        z = (y_t - d.loc) / d.scale
        return {"z": jnp.where(mask, z, jnp.nan)}
    if isinstance(d, dist.Independent) and isinstance(d.base_dist, dist.Normal):
        base = d.base_dist
        z = (jnp.reshape(y_t, event) - base.loc) / base.scale
        return {"z": jnp.where(mask, z, jnp.nan)}
    if isinstance(d, dist.MultivariateNormal):
        y = jnp.reshape(y_t, event).astype(d.loc.dtype)
        return {"z": _whiten(y, d.loc, d.covariance_matrix, mask)}
    if event not in ((), (1,)):
        # a non-Gaussian vector predictive: per-coordinate marginal PIT
        if len(event) != 1:
            raise ValueError(
                f"residuals of {type(model).__name__} need a scalar or vector predictive; "
                f"its predictive is a {type(d).__name__} with event shape {event}")
        x = jnp.reshape(y_t, event).astype(jnp.result_type(float))
        hi = jnp.where(mask, marginal_cdf(d, x), jnp.nan)
        if not _is_discrete(d):
            return {"u": hi}
        return {"lo": jnp.where(mask, marginal_cdf(d, x - 1.0), jnp.nan), "hi": hi}
    x = jnp.reshape(y_t, ()).astype(jnp.result_type(float))
    observed = jnp.all(mask)
    hi = jnp.where(observed, jnp.full(event, scalar_cdf(d, x)), jnp.nan)
    if not _is_discrete(d):
        return {"u": hi}
    lo = jnp.where(observed, jnp.full(event, scalar_cdf(d, x - 1.0)), jnp.nan)
    return {"lo": lo, "hi": hi}


@partial(jax.jit, static_argnames=("model",))
def _one_step(model, params, y, mask, inputs):
    """Per-step residual ingredients of a flat batch ``(N, T, ...)``."""
    _, _, carries, _ = run_filter(model, params, y, mask, inputs, complete=False,
                                  return_carries=True)
    first = model.initial_carry(params)
    before = jax.tree.map(
        lambda c0, c: jnp.concatenate(
            [jnp.broadcast_to(c0, (c.shape[0], 1) + c0.shape), c[:, :-1]], axis=1),
        first, carries)
    one = partial(_step_quantities, model, params)
    out = vmap_or_one(jax.vmap(one))(before, y, mask, inputs)  # sequences, then steps
    steps = jnp.arange(y.shape[1])
    held = steps < model.num_conditioned_steps  # conditioned on, not predicted
    return jax.tree.map(
        lambda a: jnp.where(jnp.reshape(held, (1, -1) + (1,) * (a.ndim - 2)), jnp.nan, a),
        out)


def _compute(model, params, y, mask, inputs):
    validate_params(model, params)
    data = prepare_data(model, y, mask, inputs)
    out = _one_step(model, params, data.y, data.mask, data.inputs)
    shape = data.batch_shape + (data.num_timesteps,)
    return jax.tree.map(lambda a: jnp.reshape(a, shape + a.shape[2:]), out), data.batch_shape


def _randomize(out, key):
    """The PIT from the step quantities: ``Phi(z)``, ``F(y)`` or the randomized PIT."""
    if "z" in out:
        return jax.scipy.special.ndtr(out["z"])
    if "u" in out:
        return out["u"]
    lo, hi = out["lo"], out["hi"]
    if key is None:
        raise ValueError("the data are discrete: the randomized PIT needs a key "
                         "(key=jax.random.key(...))")
    v = jax.random.uniform(key, hi.shape, hi.dtype)
    return lo + v * (hi - lo)


def pit(model, params, y, *, mask=None, inputs=None, key=None):
    """One-step-ahead probability integral transform ``u_t = F_t(y_t)``.

    ``F_t`` is the cdf of the one-step predictive ``p(y_t | y_{<t})``. For discrete
    data the randomized PIT ``u_t = F_t(y_t - 1) + V_t (F_t(y_t) - F_t(y_t - 1))``,
    ``V_t ~ U(0, 1)``, is exactly ``U(0, 1)`` under the model (Dunn and Smyth 1996); a
    ``key`` is then required. For a Gaussian vector predictive the entries of the
    Cholesky-standardized error are mapped through ``Phi`` (the Rosenblatt transform).

    For any other vector predictive (event shape ``(D,)``: a multivariate Poisson or
    Bernoulli HMM, a Gaussian HMM with ``D > 1``, whose one-step predictive is a mixture)
    the PIT is **marginal**: ``u_tj = F_tj(y_tj)`` with ``F_tj`` the cdf of coordinate
    ``j``'s one-step predictive marginal (for an HMM ``sum_k p(z_t = k | y_{<t})
    F_kj(y_tj)``, the mixture of the states' marginals;
    `statseq.core.distributions.marginal_cdf`), randomized per coordinate for discrete
    data. Under the model each coordinate's sequence ``u_1j, u_2j, ...`` is i.i.d.
    ``U(0, 1)``, but the coordinates of one step are **not independent** of each other
    (they share the hidden state), so test each coordinate separately (or account for
    the dependence), not the pooled values. A missing coordinate gives NaN in that
    coordinate only. A predictive without per-coordinate marginal cdfs raises a
    ``ValueError``.

    Args:
        model: a statseq model.
        params: its parameters.
        y: ``batch_shape + (num_timesteps,) + event_shape``.
        mask: optional mask (``True`` = observed); missing steps give NaN.
        inputs: covariates, when the model takes them.
        key: a ``jax.random`` key (required for discrete data).

    Returns:
        ``batch_shape + (num_timesteps,) + event_shape``.

    Examples:
        >>> import jax, statseq as ss
        >>> y = ss.datasets.load_earthquakes().to_numpy()
        >>> model = ss.PoissonHMM(num_states=2)
        >>> params = model.initialize(y, key=jax.random.key(0))
        >>> u = ss.pit(model, params, y, key=jax.random.key(1))
        >>> bool(((u > 0) & (u < 1)).all())
        True
    """
    if key is not None:
        check_key(key)
    out, _ = _compute(model, params, y, mask, inputs)
    return _randomize(out, key)


def quantile_residuals(model, params, y, *, mask=None, inputs=None, key=None):
    """Normal quantile residuals ``r_t = Phi^{-1}(u_t)`` of the one-step PIT `pit`.

    I.i.d. ``N(0, 1)`` under the model (for discrete data with the randomized PIT;
    Dunn and Smyth 1996; Zucchini, MacDonald and Langrock 2016, sec. 6.2). For Gaussian
    predictives they equal `standardized_residuals` (computed directly, without the
    round trip through ``Phi``). For non-Gaussian vector predictives they are the
    per-coordinate marginal residuals of `pit`: each coordinate i.i.d. ``N(0, 1)`` over
    time, coordinates of one step dependent.

    Args:
        model: a statseq model.
        params: its parameters.
        y: ``batch_shape + (num_timesteps,) + event_shape``.
        mask: optional mask; missing steps give NaN.
        inputs: covariates, when the model takes them.
        key: a ``jax.random`` key (required for discrete data).

    Returns:
        The shape of `pit`'s result.

    Examples:
        >>> import numpy as np, statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> r = ss.quantile_residuals(ss.LocalLevel(), params, y)
        >>> e = ss.standardized_residuals(ss.LocalLevel(), params, y)
        >>> r.shape, bool(np.nanmax(abs(r - e)) < 1e-3)     # Gaussian predictive: r = e
        ((100,), True)
    """
    if key is not None:
        check_key(key)
    out, _ = _compute(model, params, y, mask, inputs)
    if "z" in out:
        return out["z"]
    return ndtri(_randomize(out, key))


def standardized_residuals(model, params, y, *, mask=None, inputs=None):
    """Standardized one-step prediction errors of a model with Gaussian predictives.

        e_t = L_t^{-1} (y_t - E[y_t | y_{<t}]),   L_t L_t^T = Var[y_t | y_{<t}] = F_t,

    ``v_t / sqrt(F_t)`` for a scalar series: statsmodels' ``standardized_forecasts_error``
    (Durbin and Koopman 2012, sec. 2.12). Steps before the data identify a diffuse state
    are NaN (statsmodels skips them with ``loglikelihood_burn``), as are missing entries.

    Args:
        model: a model whose one-step predictive is ``Normal`` or ``MultivariateNormal``.
        params: its parameters.
        y: ``batch_shape + (num_timesteps,) + event_shape``.
        mask: optional mask.
        inputs: covariates, when the model takes them.

    Returns:
        ``batch_shape + (num_timesteps,) + event_shape``.

    Examples:
        >>> import statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> e = ss.standardized_residuals(ss.LocalLevel(), params, y)
        >>> e.shape
        (100,)
    """
    out, _ = _compute(model, params, y, mask, inputs)
    if "z" not in out:
        raise ValueError(f"{type(model).__name__} has a non-Gaussian predictive: use "
                         "quantile_residuals (or pit)")
    return out["z"]


class Diagnostics(NamedTuple):
    """Residuals of one series and the tests of `statseq.evaluation.stattests`.

    Attributes:
        residuals: ``(num_timesteps,)`` or ``(num_timesteps, D)`` standardized (Gaussian
            predictives) or quantile residuals; NaN where undefined.
        pit: the one-step PIT values (same shape).
        tests: a pandas DataFrame, one row per test (``ljung_box``, ``heteroskedasticity``,
            ``jarque_bera``) and series, with ``statistic`` and ``pvalue`` columns.
        acf: ``(lags + 1,)`` (or ``(D, lags + 1)``) autocorrelations of the residuals.
        kind: ``"standardized"`` or ``"quantile"``.

    Examples:
        >>> import statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> d = ss.diagnose(ss.LocalLevel(), params, y)
        >>> d.kind, d.residuals.shape, d.pit.shape
        ('standardized', (100,), (100,))
        >>> list(d.tests.columns[:2])
        ['statistic', 'pvalue']
    """

    residuals: Any
    pit: Any
    tests: Any
    acf: Any
    kind: str

    def plot(self, series: int = 0, fig=None, residual_name: str | None = None):
        """`plot_diagnostics` of the residuals (of column ``series`` for a vector series);
        returns the matplotlib ``Figure``. ``residual_name`` (e.g. ``"pseudo-residual"``)
        names the residuals on the axes, as in `plot_diagnostics`."""
        resid = np.asarray(self.residuals)
        if resid.ndim == 2:
            resid = resid[:, series]
        return plot_diagnostics(resid, lags=self.acf.shape[-1] - 1, fig=fig,
                                residual_name=residual_name)


def _trim(series):
    """Drop the leading NaN steps (diffuse or conditioned steps: the burn-in)."""
    finite = np.flatnonzero(np.isfinite(series))
    return series[finite[0]:] if finite.size else series[:0]


def diagnose(model, params, y, *, mask=None, inputs=None, key=None, lags=None):
    """Residual diagnostics of one series: residuals, PIT and a table of tests.

    Uses the standardized prediction errors for Gaussian predictives and the
    (randomized) quantile residuals otherwise. For each series, after dropping the
    leading undefined steps (the burn-in):

    * Ljung-Box ``Q(lags)`` of the residuals with missing steps dropped,
      ``lags = min(10, n // 5)`` by default (statsmodels' ``test_serial_correlation``);
    * Durbin and Koopman's ``H(h)``, ``h = round(n / 3)``, two-sided
      (``test_heteroskedasticity("breakvar")``);
    * Jarque-Bera (Bowman-Shenton) normality (``test_normality("jarquebera")``).

    Args:
        model: a statseq model.
        params: its parameters.
        y: one series, ``(num_timesteps,) + event_shape``.
        mask: optional mask.
        inputs: covariates, when the model takes them.
        key: a ``jax.random`` key (required for discrete data).
        lags: the Ljung-Box lag (and of the reported ACF).

    Returns:
        A `Diagnostics`; ``.tests`` is the table, ``.plot()`` draws the four panels.

    Examples:
        >>> import statseq as ss
        >>> y = ss.datasets.load_nile().to_numpy()
        >>> params = ss.LocalLevelParams(obs_var=15099.0, level_var=1469.1)
        >>> d = ss.diagnose(ss.LocalLevel(), params, y)
        >>> d.tests.index.tolist()
        ['ljung_box', 'heteroskedasticity', 'jarque_bera']
    """
    if key is not None:
        check_key(key)
    import pandas as pd

    out, batch_shape = _compute(model, params, y, mask, inputs)
    if batch_shape:
        raise ValueError(f"diagnose takes one series; y has batch shape {batch_shape}")
    if "z" in out:
        resid, kind = np.asarray(out["z"], float), "standardized"
        u = np.asarray(_randomize(out, key))
    else:
        u = np.asarray(_randomize(out, key), float)
        resid, kind = np.asarray(ndtri(u), float), "quantile"
    cols = resid.reshape(resid.shape[0], -1)
    rows, acfs = [], []
    for i in range(cols.shape[1]):
        series = _trim(cols[:, i])
        clean = series[np.isfinite(series)]
        n = clean.size
        lag = min(10, n // 5) if lags is None else lags
        if lag < 1:
            raise ValueError(f"too few residuals ({n}) for the tests")
        lb = stattests.ljung_box(clean, lag)
        het = stattests.heteroskedasticity(series)
        jb = stattests.jarque_bera(clean)
        tag = {} if cols.shape[1] == 1 else {"series": i}
        rows += [dict(test="ljung_box", **tag, statistic=lb.statistic[-1],
                      pvalue=lb.pvalue[-1]),
                 dict(test="heteroskedasticity", **tag, statistic=float(het.statistic),
                      pvalue=float(het.pvalue)),
                 dict(test="jarque_bera", **tag, statistic=jb.statistic, pvalue=jb.pvalue)]
        acfs.append(stattests.acf(clean, lag))
    table = pd.DataFrame(rows).set_index(["test"] + (["series"] if cols.shape[1] > 1 else []))
    acf = acfs[0] if cols.shape[1] == 1 else np.stack(acfs)
    return Diagnostics(resid, u, table, acf, kind)


def plot_diagnostics(residuals, *, lags: int = 10, fig=None,
                     residual_name: str | None = None):
    """Four panels like statsmodels' ``plot_diagnostics``: residuals over time, histogram
    with a kernel density and the ``N(0, 1)`` density, normal Q-Q plot, correlogram.

    Args:
        residuals: ``(num_timesteps,)`` standardized or quantile residuals (NaN allowed;
            a vector series: pass one column).
        lags: the correlogram's largest lag.
        fig: an existing matplotlib ``Figure`` to draw on (a new one by default).
        residual_name: what to call the residuals on the axes, e.g. ``"pseudo-residual"``
            or ``"quantile residual"``. If given, it is the first panel's title (capitalized)
            and y label and the histogram's x label, and the Q-Q plot's axes read
            ``"N(0, 1) quantile"`` and ``"<residual_name> quantile"``. ``None`` (default)
            keeps the generic labels ``"residual"``, ``"theoretical quantile"`` and
            ``"sample quantile"`` under the title ``"Standardized residual"``.

    Returns:
        The matplotlib ``Figure``.

    Raises:
        ValueError: If ``residuals`` is not 1-D, has fewer than 3 finite values, or
            ``residual_name`` is an empty string.
        TypeError: If ``residual_name`` is neither a string nor ``None``.

    Examples:
        >>> import numpy as np
        >>> fig = plot_diagnostics(np.random.default_rng(0).normal(size=80))
        >>> len(fig.axes)
        4
        >>> fig = plot_diagnostics(np.random.default_rng(0).normal(size=80),
        ...                        residual_name="pseudo-residual")
        >>> fig.axes[2].get_xlabel(), fig.axes[2].get_ylabel()
        ('N(0, 1) quantile', 'pseudo-residual quantile')
    """
    import matplotlib.pyplot as plt
    from scipy import stats

    if residual_name is not None and not isinstance(residual_name, str):
        raise TypeError("residual_name must be a string or None; got "
                        f"{type(residual_name).__name__}")
    if residual_name is not None and not residual_name.strip():
        raise ValueError("residual_name must be a non-empty string (or None)")
    if residual_name is None:
        name, title = "residual", "Standardized residual"
        qq_x, qq_y = "theoretical quantile", "sample quantile"
    else:
        name, title = residual_name, residual_name[:1].upper() + residual_name[1:]
        qq_x, qq_y = "N(0, 1) quantile", f"{residual_name} quantile"
    resid = np.asarray(residuals, float)
    if resid.ndim != 1:
        raise ValueError(f"residuals must be one series (1-D); got shape {resid.shape}")
    clean = resid[np.isfinite(resid)]
    if clean.size < 3:
        raise ValueError(f"need at least 3 finite residuals, got {clean.size}")
    lags = int(min(lags, clean.size - 1))
    fig = plt.figure(figsize=(10, 7)) if fig is None else fig
    axes = fig.subplots(2, 2)
    ax = axes[0, 0]
    ax.plot(np.arange(resid.size), resid, lw=1)
    ax.axhline(0.0, color="k", lw=0.5)
    ax.set_title(title)
    ax.set_xlabel("time step")
    ax.set_ylabel(name)
    ax = axes[0, 1]
    ax.hist(clean, bins="auto", density=True, alpha=0.6, label="Hist")
    grid = np.linspace(min(clean.min(), -3), max(clean.max(), 3), 200)
    if clean.std() > 0:
        ax.plot(grid, stats.gaussian_kde(clean)(grid), label="KDE")
    ax.plot(grid, stats.norm.pdf(grid), label="N(0,1)")
    ax.legend(fontsize="small", framealpha=0.6)
    ax.set_title("Histogram plus estimated density")
    ax.set_xlabel(name)
    ax.set_ylabel("density")
    ax = axes[1, 0]
    theo = stats.norm.ppf((np.arange(1, clean.size + 1) - 0.5) / clean.size)
    ax.plot(theo, np.sort(clean), "o", ms=3)
    ax.plot(theo, theo, "k-", lw=0.8)
    ax.set_title("Normal Q-Q")
    ax.set_xlabel(qq_x)
    ax.set_ylabel(qq_y)
    ax = axes[1, 1]
    r = stattests.acf(clean, lags)[1:]
    ax.vlines(np.arange(1, lags + 1), 0.0, r)
    ax.plot(np.arange(1, lags + 1), r, "o", ms=3)
    band = 1.96 / np.sqrt(clean.size)
    ax.axhspan(-band, band, alpha=0.2)
    ax.axhline(0.0, color="k", lw=0.5)
    ax.set_title("Correlogram")
    ax.set_xlabel("lag")
    ax.set_ylabel("autocorrelation")
    fig.tight_layout()
    return fig
