"""Prior and posterior predictive checks: parameters from the prior, replicated series and
tail probabilities of test statistics.

A predictive check (Gelman et al., *Bayesian Data Analysis*, 3rd ed., ch. 6; Gabry et al.
2019, "Visualization in Bayesian workflow") simulates replicated series
``y_rep ~ p(y | theta_s)``, one per draw ``theta_s`` (from the prior for a prior
predictive check, from the posterior for a posterior predictive check), and compares test
statistics ``T(y_rep)`` with ``T(y)``. The tail probability
``p = Pr(T(y_rep) >= T(y))`` near 0 or 1 flags a feature of the data the model does not
reproduce.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from statseq.bayes.distribution import SequenceDistribution, flatten_draws
from statseq.bayes.priors import default_priors
from statseq.core.params import _is_prior_leaf, is_shape
from statseq.core.validation import check_key, check_positive_int, prepare_data


def sample_prior(model, priors=None, *, num_samples, key, scale=1.0):
    """Draw parameters from the prior.

    Args:
        model: a statseq model.
        priors: a priors pytree like ``params`` (numpyro distributions; ``None`` leaves, or
            ``priors=None``, take `default_priors` at ``scale``).
        num_samples: number of draws.
        key: a ``jax.random`` key (keyword-only, required).
        scale: observation scale of the default priors (see `default_priors`).

    Returns:
        A params pytree whose leaves have a leading ``(num_samples,)`` axis.

    Examples:
        >>> import jax, statseq as ss
        >>> from statseq.bayes import sample_prior
        >>> draws = sample_prior(ss.PoissonHMM(num_states=2), num_samples=5,
        ...                      key=jax.random.key(0), scale=20.0)
        >>> draws.emissions.rates.shape, draws.transitions.shape
        ((5, 2), (5, 2, 2))
    """
    check_key(key)
    n = check_positive_int(num_samples, "num_samples")
    defaults = default_priors(model, scale=scale)
    tree = jax.tree.structure(model.param_shapes(), is_leaf=is_shape)
    shapes = tree.flatten_up_to(model.param_shapes())
    default_leaves = tree.flatten_up_to(defaults)
    if priors is None:
        given = [None] * len(shapes)
    else:
        for leaf in jax.tree.leaves(priors, is_leaf=_is_prior_leaf):
            if not _is_prior_leaf(leaf):
                raise TypeError(f"prior leaves must be numpyro distributions or None, got {leaf!r}")
        try:
            given = tree.flatten_up_to(priors)
        except (ValueError, TypeError) as err:
            raise ValueError("priors must have the structure of params") from err
    keys = jax.random.split(key, len(shapes))
    out = []
    for i, (shape, g, d, k) in enumerate(zip(shapes, given, default_leaves, keys, strict=True)):
        prior = g if g is not None else d
        shape = tuple(shape)
        if prior is None:
            raise ValueError(f"leaf {i} of params has no default prior: pass one in priors")
        full = tuple(prior.batch_shape) + tuple(prior.event_shape)
        if full != shape:
            ev = tuple(prior.event_shape)
            prior = prior.expand(shape[: len(shape) - len(ev)])
        if math.prod(shape) == 0:
            out.append(jnp.zeros((n,) + shape))
        else:
            out.append(prior.sample(k, (n,)))
    return jax.tree.unflatten(tree, out)


def _lag1_autocorrelation(x):
    xc = x - x.mean(axis=-1, keepdims=True)
    den = (xc ** 2).sum(-1)
    return np.where(den > 0, (xc[..., 1:] * xc[..., :-1]).sum(-1) / np.where(den > 0, den, 1.0),
                    0.0)


def _dispersion(x):
    m = x.mean(axis=-1)
    return np.where(m > 0, x.var(axis=-1) / np.where(m > 0, m, 1.0), np.nan)


#: The default test statistics of `predictive_check` (each maps ``(..., T)`` to ``(...)``).
DEFAULT_STATISTICS = {
    "mean": lambda x: x.mean(axis=-1),
    "sd": lambda x: x.std(axis=-1),
    "max": lambda x: x.max(axis=-1),
    "lag-1 autocorrelation": _lag1_autocorrelation,
}

#: Extra statistics for counts: the variance-to-mean ratio (1 for a Poisson series).
COUNT_STATISTICS = {**DEFAULT_STATISTICS, "variance / mean": _dispersion}


@dataclasses.dataclass(frozen=True)
class PredictiveCheck:
    """Result of `predictive_check`.

    Attributes:
        observed: ``{name: T(y)}``.
        replicated: ``{name: (num_draws,) array of T(y_rep)}``.
        p_values: ``{name: Pr(T(y_rep) >= T(y))}`` (upper tail probability), over the
            replicas whose statistic is defined (finite); ``NaN`` when ``T(y)`` is not
            (e.g. the variance-to-mean ratio of an all-zero series).
        replicas: the replicated series, ``(num_draws, num_timesteps) + event_shape``.

    Examples:
        >>> import jax, statseq as ss
        >>> from statseq.bayes import predictive_check, sample_prior
        >>> model = ss.PoissonHMM(num_states=2)
        >>> draws = sample_prior(model, num_samples=20, key=jax.random.key(0), scale=20.0)
        >>> check = predictive_check(model, draws, [3, 5, 4, 6, 2], key=jax.random.key(1))
        >>> type(check).__name__, check.replicas.shape
        ('PredictiveCheck', (20, 5))
        >>> 0.0 <= check.two_sided("mean") <= 1.0
        True
    """

    observed: dict
    replicated: dict
    p_values: dict
    replicas: np.ndarray

    def two_sided(self, name: str) -> float:
        """``2 min(Pr(T_rep >= T), Pr(T_rep <= T))`` capped at 1, for statistic ``name``
        (over the finite replicated values; ``NaN`` when ``T(y)`` or all of them are not
        finite)."""
        rep, obs = self.replicated[name], self.observed[name]
        rep = rep[np.isfinite(rep)]
        if not (np.isfinite(obs) and rep.size):
            return float("nan")
        return float(min(1.0, 2 * min(np.mean(rep >= obs), np.mean(rep <= obs))))

    def summary(self) -> str:
        """A plain-text table: statistic, observed value, replicated 5%/50%/95%, p."""
        lines = [f"{'statistic':24s} {'observed':>9s} {'rep 5%':>9s} {'rep 50%':>9s} "
                 f"{'rep 95%':>9s} {'p':>6s}"]
        for name, obs in self.observed.items():
            q = np.nanquantile(self.replicated[name], [0.05, 0.5, 0.95])
            lines.append(f"{name:24s} {obs:9.3f} {q[0]:9.3f} {q[1]:9.3f} {q[2]:9.3f} "
                         f"{self.p_values[name]:6.3f}")
        return "\n".join(lines)

    def plot(self, axes=None, title=""):
        """Histogram of each replicated statistic with the observed value as a line."""
        import matplotlib.pyplot as plt

        names = list(self.observed)
        if axes is None:
            _, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 2.8),
                                   squeeze=False)
            axes = axes[0]
        for ax, name in zip(axes, names, strict=True):
            rep = self.replicated[name]
            ax.hist(rep[np.isfinite(rep)], bins=40, color="0.7", label="replicated")
            ax.axvline(self.observed[name], color="k", lw=2, label="observed")
            ax.set(xlabel=name, ylabel="count of replicas",
                   title=f"{title}p = {self.p_values[name]:.2f}")
        axes[0].legend(fontsize=8)
        return axes


def predictive_check(model, draws, y, *, key, statistics=None, inputs=None):
    """Simulate one replicated series per parameter draw and compare test statistics.

        y_rep^(s) ~ p(y_{1:T} | theta_s),   p = Pr(T(y_rep) >= T(y))

    With posterior draws (`posterior_params`) this is a posterior predictive check, with
    prior draws (`sample_prior`) a prior predictive check.

    Args:
        model: a statseq model with scalar (or length-1) observations.
        draws: params pytree with leading draw axes (e.g. ``(chain, draw)``).
        y: the observed series, ``(num_timesteps,)`` (or ``(num_timesteps, 1)``), no gaps.
        key: a ``jax.random`` key (keyword-only, required).
        statistics: ``{name: f}`` with ``f`` mapping ``(..., T)`` arrays to ``(...)``;
            default `DEFAULT_STATISTICS` (`COUNT_STATISTICS` for count models).
        inputs: covariates ``(num_timesteps, input_dim)``, when the model takes them.

    Returns:
        A `PredictiveCheck`.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> from statseq.bayes import predictive_check, sample_prior
        >>> model = ss.PoissonHMM(num_states=2)
        >>> prior = sample_prior(model, num_samples=20, key=jax.random.key(0), scale=20.0)
        >>> y = ss.datasets.load_earthquakes().to_numpy()[:40]
        >>> check = predictive_check(model, prior, y, key=jax.random.key(1))
        >>> check.replicas.shape, sorted(check.p_values)[0]
        ((20, 40), 'lag-1 autocorrelation')
    """
    check_key(key)
    yv = np.asarray(y, float)
    if yv.ndim == 2 and yv.shape[1] == 1:
        yv = yv[:, 0]
    if yv.ndim != 1 or yv.size < 3:
        raise ValueError(f"y must be one series of at least 3 steps, got shape {np.shape(y)}")
    if not np.all(np.isfinite(yv)):
        raise ValueError("y must be fully observed (finite) for a predictive check")
    if math.prod(model.event_shape) != 1:
        raise ValueError("predictive_check needs a model with scalar observations")
    # the model's own checks: support (counts, categories), magnitude, dtype
    prepare_data(model, np.asarray(y).reshape((yv.size,) + tuple(model.event_shape)),
                 None, inputs)
    if statistics is None:
        statistics = COUNT_STATISTICS if model.observation_dtype == "count" else (
            DEFAULT_STATISTICS)
    if not isinstance(statistics, dict) or not statistics:
        raise TypeError("statistics must be a non-empty dict of name -> function")
    for name, f in statistics.items():
        if not callable(f):
            raise TypeError(f"statistics[{name!r}] must be a function, got {f!r}")
    flat, lead = flatten_draws(model, draws)
    num_draws = math.prod(lead)
    seq = SequenceDistribution(model, flat, num_timesteps=yv.size,
                               inputs=None if inputs is None else jnp.asarray(inputs))
    reps = np.asarray(seq.sample(key), float)
    reps = reps.reshape(num_draws, yv.size, *model.event_shape)
    flat_reps = reps.reshape(num_draws, yv.size)
    observed, replicated, p_values = {}, {}, {}
    for name, f in statistics.items():
        obs, rep = np.asarray(f(yv), float), np.asarray(f(flat_reps), float)
        if obs.shape != () or rep.shape != (num_draws,):
            raise ValueError(
                f"statistics[{name!r}] must map a (..., T) array to (...): it gave shape "
                f"{obs.shape} for y (expected ()) and {rep.shape} for the replicas "
                f"(expected ({num_draws},))")
        observed[name], replicated[name] = float(obs), rep
        finite = rep[np.isfinite(rep)]
        p_values[name] = (float(np.mean(finite >= obs)) if np.isfinite(obs) and finite.size
                          else float("nan"))
    return PredictiveCheck(observed, replicated, p_values, reps)
