"""Bayesian inference (NUTS, SVI) for the seq2vec models and the sequence labeller.

The parameters ``theta`` of a `statseq.SequenceClassifier`, `statseq.SequenceRegressor` or
`statseq.SequenceLabeller` (the encoder's backbone weights, the attention vector, the head's
readout and, for Student-t or negative binomial heads, their positive parameter) are
flattened into one unconstrained vector ``u`` (positive head parameters through their
constraint's bijection, as the SGD fit does), with an independent Gaussian prior

    u_i ~ Normal(0, prior_scale),

and the likelihood is the model's conditional log-likelihood of the labels

    log p(c | x, theta) = sum_n log p(c_n | x_n, theta)

(for the labeller, ``sum_n sum_{t < T_n} log p(c_{n,t} | x_n, theta)``), computed on the
padded ragged batch with every padding step masked. NUTS (NumPyro) samples
``p(u | c, x)``; SVI fits a Gaussian (or point-mass, the MAP) approximation of it. The
estimators' ``fit_bayes`` is the entry point; `bayes_target` exposes the NumPyro model and
its flattening.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from statseq.bayes.nuts import check_nuts_settings
from statseq.classify.seq2vec import (
    Seq2VecParams,
    _sum_log_lik,
    _to_constrained,
    _to_unconstrained,
)
from statseq.core.validation import check_key, check_positive_int, float_dtype

BAYES_METHODS = ("nuts", "svi")
SVI_GUIDES = ("normal", "mvn", "delta")


@dataclasses.dataclass(frozen=True)
class Seq2VecTarget:
    """The posterior of a seq2vec model's parameters as a NumPyro model.

        u ~ Normal(0, prior_scale I_P),   theta = bijection(u),
        log p(u | c, x) = sum_i log Normal(u_i; 0, prior_scale) + log p(c | x, theta) + const.

    Hashable (the data take no part in equality), so compiled functions of it are shared
    between fits of the same configuration.

    Attributes:
        encoder: the `statseq.classify.SequenceEncoder`.
        head: the head.
        per_step: a labeller (the head at every step) rather than a pooled model.
        treedef: the tree structure of the unconstrained `Seq2VecParams`.
        shapes: the shapes of its leaves (flattened in this order).
        prior_scale: the prior's standard deviation.
        data: ``(x, lengths, y)`` padded arrays (``x`` ``(N, T, D)``, ``y`` the labels).
        y_mask: which entries of ``y`` are labels (not padding).

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> from statseq.classify.seq2vec_bayes import bayes_target
        >>> clf = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2))
        >>> target = bayes_target(clf, [np.zeros(3), np.ones(4)], [0, 1])
        >>> target.size  # Elman(1 -> 2): w_in 2, w_rec 4, bias 2; head 2 x 2 + 2
        14
        >>> target.params(np.zeros(14)).head.weight.shape
        (2, 2)
    """

    encoder: Any
    head: Any
    per_step: bool
    treedef: Any
    shapes: tuple
    prior_scale: float
    data: tuple = dataclasses.field(compare=False, repr=False)
    y_mask: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        """``P``, the number of scalar parameters."""
        return int(sum(math.prod(s) for s in self.shapes))

    def params(self, theta) -> Seq2VecParams:
        """Natural (constrained) `Seq2VecParams` of a flat unconstrained vector ``theta``."""
        return _params_jit(self, jnp.asarray(theta, float_dtype()))

    def _params(self, theta):
        leaves, start = [], 0
        for shape in self.shapes:
            stop = start + math.prod(shape)
            leaves.append(theta[start:stop].reshape(shape))
            start = stop
        u = jax.tree.unflatten(self.treedef, leaves)
        return Seq2VecParams(u.encoder, _to_constrained(self.head, u.head))

    def flatten(self, params: Seq2VecParams):
        """The flat unconstrained vector of natural `Seq2VecParams` (inverse of `params`)."""
        u = Seq2VecParams(params.encoder, _to_unconstrained(self.head, params.head))
        return jnp.concatenate([jnp.ravel(jnp.asarray(a, float_dtype()))
                                for a in jax.tree.leaves(u)])

    def log_likelihood(self, theta, x=None, lengths=None, y=None):
        """``sum_n log p(c_n | x_n, theta)`` (the training data unless given)."""
        if x is None:
            x, lengths, y = self.data
        return _log_lik_jit(self, jnp.asarray(theta, float_dtype()), x, lengths, y)

    def per_sequence_log_likelihood(self, theta, x=None, lengths=None, y=None):
        """``(N,)`` log-likelihoods ``log p(c_n | x_n, theta)`` (labeller: summed over steps)."""
        if x is None:
            x, lengths, y = self.data
        return jax.vmap(lambda a, n, b: self.log_likelihood(theta, a[None], n[None],
                                                            b[None]))(x, lengths, y)

    def model(self, x, lengths, y):
        """The NumPyro model: site ``"theta"`` (the prior) and factor ``"log_lik"``."""
        import numpyro
        import numpyro.distributions as dist

        dtype = float_dtype()
        prior = dist.Normal(jnp.zeros((self.size,), dtype),
                            jnp.full((self.size,), self.prior_scale, dtype)).to_event(1)
        theta = numpyro.sample("theta", prior)
        numpyro.factor("log_lik", self.log_likelihood(theta, x, lengths, y))


_params_jit = jax.jit(lambda target, theta: target._params(theta), static_argnums=0)
# one compiled likelihood per configuration and data shape, shared by NumPyro's eager
# initialization, NUTS, SVI and later fits of the same configuration
_log_lik_jit = jax.jit(lambda target, theta, x, lengths, y: _sum_log_lik(
    target.encoder, target.head, target.per_step, target._params(theta), x, lengths, y),
    static_argnums=0)


def _check_prior_scale(prior_scale) -> float:
    try:
        value = float(prior_scale)
    except (TypeError, ValueError) as err:
        raise TypeError(f"prior_scale must be a positive number, got {prior_scale!r}") from err
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"prior_scale must be a positive finite number, got {prior_scale!r}")
    return value


def bayes_target(estimator, X, y, *, prior_scale=1.0, lengths=None) -> Seq2VecTarget:
    """The posterior of ``estimator``'s parameters given sequences ``X`` and labels ``y``.

    Sets up (and validates) the data exactly as ``estimator.fit`` does, builds the encoder
    and head (stored on the estimator as ``encoder_``, ``head_``, ``classes_``, ...), and
    returns the flat NumPyro model that ``fit_bayes`` samples.

    Args:
        estimator: a `statseq.SequenceClassifier`, `statseq.SequenceRegressor` or
            `statseq.SequenceLabeller`.
        X: sequences (a list, or a padded array with ``lengths``).
        y: labels, as for ``estimator.fit``.
        prior_scale: standard deviation of the Gaussian prior on every unconstrained
            parameter.
        lengths: optional lengths of a padded array ``X``.

    Returns:
        A `Seq2VecTarget`.

    Examples:
        >>> import jax, numpy as np, statseq as ss
        >>> reg = ss.SequenceRegressor(ss.ElmanRNN(hidden_dim=1), emission="student_t")
        >>> target = bayes_target(reg, [np.zeros(3), np.ones(2)], [0.5, 1.0], prior_scale=2.0)
        >>> target.size, target.params(np.zeros(target.size)).head.df.tolist()  # df = 2 + e^0
        (8, [3.0])
        >>> float(target.log_likelihood(np.zeros(8))) < 0
        True
    """
    prior_scale = _check_prior_scale(prior_scale)
    x, lengths, labels, y_mask, head_kwargs = estimator._fit_inputs(X, y, lengths)
    estimator._check_options()
    estimator.encoder_, estimator.head_ = estimator._build(x.shape[-1], head_kwargs)
    estimator.n_features_in_ = int(x.shape[-1])
    params0 = estimator._init_params(jax.random.key(int(estimator.random_state)), labels,
                                     y_mask)
    u0 = Seq2VecParams(params0.encoder, _to_unconstrained(estimator.head_, params0.head))
    leaves, treedef = jax.tree.flatten(u0)
    data = (jnp.asarray(x), jnp.asarray(lengths), jnp.asarray(labels))
    return Seq2VecTarget(estimator.encoder_, estimator.head_, bool(estimator._per_step),
                         treedef, tuple(tuple(np.shape(a)) for a in leaves), prior_scale, data,
                         np.asarray(y_mask))


@functools.partial(jax.jit, static_argnames=("target", "log_lik"))
def _draws(target, flat, x, lengths, y, log_lik):
    """Natural parameters of flat draws ``(S, P)`` and, with ``log_lik``, their
    per-sequence log-likelihoods ``(S, N)``."""
    draws = jax.vmap(target.params)(flat)
    if not log_lik:
        return draws, None
    return draws, jax.vmap(lambda th: target.per_sequence_log_likelihood(th, x, lengths,
                                                                          y))(flat)


def _leaf_names(params) -> list[str]:
    names = []
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        parts = []
        for k in path:
            parts.append(str(getattr(k, "name", getattr(k, "idx", getattr(k, "key", k)))))
        names.append(".".join(parts))
    return names


def _nuts(target, key, *, num_warmup, num_samples, num_chains, chain_method,
          target_accept_prob, max_tree_depth, init_key, estimator, progress):
    from numpyro.infer import MCMC, NUTS

    kernel = NUTS(target.model, target_accept_prob=target_accept_prob,
                  max_tree_depth=max_tree_depth)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method=chain_method, progress_bar=progress)
    keys = jax.random.split(init_key, num_chains)
    labels = np.asarray(target.data[2])
    starts = jnp.stack([target.flatten(estimator._init_params(k, labels, target.y_mask))
                        for k in keys])
    init = {"theta": starts if num_chains > 1 else starts[0]}
    mcmc.run(key, *target.data, init_params=init,
             extra_fields=("diverging", "potential_energy", "accept_prob", "num_steps",
                           "energy"))
    theta = mcmc.get_samples(group_by_chain=True)["theta"]  # (C, S, P)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    return theta, extra


def _inference_data(target, theta, extra):
    from statseq.bayes.nuts import _from_dict

    num_chains, num_samples = theta.shape[:2]
    flat = theta.reshape((-1, theta.shape[-1]))
    draws, ll = _draws(target, flat, *target.data, log_lik=True)
    names = _leaf_names(draws)
    posterior = {name: np.asarray(leaf).reshape((num_chains, num_samples) + leaf.shape[1:])
                 for name, leaf in zip(names, jax.tree.leaves(draws), strict=True)}
    stats = {"diverging": np.asarray(extra["diverging"]),
             "lp": -np.asarray(extra["potential_energy"]),
             "acceptance_rate": np.asarray(extra["accept_prob"]),
             "n_steps": np.asarray(extra["num_steps"]),
             "energy": np.asarray(extra["energy"])}
    _, _, labels = target.data
    groups = {"posterior": posterior, "sample_stats": stats,
              "observed_data": {"y": np.asarray(labels)},
              "log_likelihood": {"y": np.asarray(ll).reshape((num_chains, num_samples, -1))}}
    # observed "y" is (N,) or (N, T) / (N, D), its log-likelihood (chain, draw, N): both
    # get ArviZ's default dims, whose first (y_dim_0, the sequence) agrees
    return draws, _from_dict(groups, None, coords=None)


def _svi(target, key, *, guide, num_steps, optimizer, num_samples, num_particles, flat0,
         progress):
    import optax
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoDelta, AutoMultivariateNormal, AutoNormal
    from numpyro.infer.initialization import init_to_value
    from numpyro.optim import optax_to_numpyro

    from statseq.bayes.svi import SVIResult

    if optimizer is None:
        optimizer = optax.adam(1e-2)
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TypeError("optimizer must be an optax GradientTransformation, e.g. optax.adam(1e-2)")
    kind = {"normal": AutoNormal, "mvn": AutoMultivariateNormal, "delta": AutoDelta}[guide]
    auto = kind(target.model, init_loc_fn=init_to_value(values={"theta": flat0}))
    svi = SVI(target.model, auto, optax_to_numpyro(optimizer),
              Trace_ELBO(num_particles=num_particles))
    run_key, draw_key = jax.random.split(key)
    result = svi.run(run_key, num_steps, *target.data, progress_bar=progress)
    theta = auto.sample_posterior(draw_key, result.params, sample_shape=(num_samples,))["theta"]
    draws, _ = _draws(target, theta, *target.data, log_lik=False)
    return draws, SVIResult(draws=draws, losses=np.asarray(result.losses), guide=auto,
                            guide_params=result.params)


def fit_bayes(estimator, X, y, *, method, key, lengths=None, prior_scale=1.0,
              num_warmup=200, num_samples=200, num_chains=2, chain_method="sequential",
              target_accept_prob=0.8, max_tree_depth=8, guide="normal", num_steps=1000,
              optimizer=None, num_particles=1, progress=False):
    """Posterior inference for a seq2vec estimator: the body of its ``fit_bayes`` method
    (`statseq.SequenceClassifier.fit_bayes`, same arguments, documented there).

    Args:
        estimator: a `statseq.SequenceClassifier`, `statseq.SequenceRegressor` or
            `statseq.SequenceLabeller` (fitted in place).
        X: sequences.
        y: labels, as for ``estimator.fit``.
        method: ``"nuts"`` or ``"svi"``.
        key: a ``jax.random`` key.
        lengths: optional lengths of a padded array ``X``.
        prior_scale: standard deviation of the Gaussian prior.
        num_warmup: NUTS adaptation steps per chain.
        num_samples: NUTS draws per chain, or SVI draws from the guide.
        num_chains: NUTS chains.
        chain_method: NUTS ``"sequential"``, ``"vectorized"`` or ``"parallel"``.
        target_accept_prob: NUTS target acceptance probability.
        max_tree_depth: NUTS maximum tree depth.
        guide: SVI ``"normal"``, ``"mvn"`` or ``"delta"`` (MAP).
        num_steps: SVI optimizer steps.
        optimizer: SVI optax optimizer (default ``optax.adam(1e-2)``).
        num_particles: SVI Monte Carlo samples per ELBO gradient.
        progress: NumPyro's progress bar.

    Returns:
        ``estimator``.

    Examples:
        >>> import jax, statseq as ss
        >>> clf = ss.SequenceRegressor(ss.ElmanRNN(hidden_dim=1))
        >>> fit_bayes(clf, [[0.0, 1.0], [1.0]], [0.5, 1.0], method="svi", guide="laplace",
        ...           key=jax.random.key(0))
        Traceback (most recent call last):
        ...
        ValueError: guide must be one of ('normal', 'mvn', 'delta'), got 'laplace'
    """
    check_key(key)
    if method not in BAYES_METHODS:
        raise ValueError(f"method must be one of {BAYES_METHODS}, got {method!r}")
    num_samples = check_positive_int(num_samples, "num_samples")
    if method == "nuts":
        num_warmup, num_samples, num_chains = check_nuts_settings(
            num_warmup, num_samples, num_chains, chain_method, target_accept_prob)
        max_tree_depth = check_positive_int(max_tree_depth, "max_tree_depth")
    else:
        if guide not in SVI_GUIDES:
            raise ValueError(f"guide must be one of {SVI_GUIDES}, got {guide!r}")
        num_steps = check_positive_int(num_steps, "num_steps")
        num_particles = check_positive_int(num_particles, "num_particles")
    target = bayes_target(estimator, X, y, prior_scale=prior_scale, lengths=lengths)
    init_key, run_key = jax.random.split(key)
    if method == "nuts":
        theta, extra = _nuts(target, run_key, num_warmup=num_warmup, num_samples=num_samples,
                             num_chains=num_chains, chain_method=chain_method,
                             target_accept_prob=float(target_accept_prob),
                             max_tree_depth=max_tree_depth, init_key=init_key,
                             estimator=estimator, progress=progress)
        draws, result = _inference_data(target, theta, extra)
        estimator.loss_trace_ = None
    else:
        flat0 = target.flatten(estimator._init_params(init_key, np.asarray(target.data[2]),
                                                      target.y_mask))
        draws, result = _svi(target, run_key, guide=guide, num_steps=num_steps,
                             optimizer=optimizer, num_samples=num_samples,
                             num_particles=num_particles, flat0=flat0, progress=progress)
        estimator.loss_trace_ = result.losses
    estimator.posterior_draws_ = draws
    estimator.params_ = jax.tree.map(lambda a: jnp.mean(a, axis=0), draws)
    estimator.bayes_result_ = result
    estimator.method_ = method
    estimator.n_iter_ = None if method == "nuts" else num_steps
    estimator.best_validation_loss_ = None
    return estimator
