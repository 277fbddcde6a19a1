"""Generative sequence classifiers: one statseq model per class and Bayes' rule.

Each class ``c`` has its own parameters ``theta_c`` of one statseq model, so every class
has a likelihood ``p(y_{1:T} | c) = prod_t p(y_t | y_{<t}, theta_c)`` (the model's own
filter: HMMs, AR, linear Gaussian state space models, neural networks), and the class
posterior is Bayes' rule,

    p(c | y) = pi_c p(y | c) / sum_k pi_k p(y | k),

with priors ``pi`` estimated (class frequencies) or given. A model with covariates
(an input-driven HMM, an AR model with exogenous inputs, a neural model with ``u_t``)
classifies given each sequence's inputs: ``p(c | y, u) propto pi_c p(y | u, theta_c)``.
The per-class fits use the model's own routes (`statseq.fit_em`, `statseq.fit_lbfgs`,
`statseq.fit_sgd`, `statseq.fit_nuts`). Discriminative training (maximum mutual
information, MMI) then moves all class models jointly to maximize
``sum_n log p(c_n | y_n)``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.special import logsumexp

from statseq.classify._estimator import ClassifierMixin, SequenceEstimator
from statseq.core.params import from_unconstrained, to_unconstrained, validate_params
from statseq.core.recurrence import run_filter
from statseq.core.validation import float_dtype, pad_sequences, prepare_sized

_METHODS = ("auto", "em", "lbfgs", "sgd", "nuts")
#: unconstrained values of boundary parameters (probabilities 0 or 1) start MMI here
_BOUND = 30.0


class MMIResult(NamedTuple):
    """The record of discriminative (MMI) training.

    Attributes:
        objective: ``(num_steps + 1,)`` the conditional log-likelihood
            ``sum_n log p(c_n | y_n)`` on the training data at the start (entry 0, the
            per-class fits) and after every optimizer step.
        start: its value at the per-class fits.
        best: its largest value along the trace (the returned parameters are those).
        best_step: the index of ``best`` in ``objective`` (0: MMI did not improve).
        grad_norm: the Euclidean norm of the gradient of the *mean* conditional
            log-likelihood over the unconstrained parameters, at the returned parameters.
        converged: ``grad_norm <= tol``; ``False`` means the step budget ran out first
            (the parameters are still the best seen, never worse than the start).
        num_nonfinite: steps whose objective or gradient was not finite (skipped).

    Examples:
        >>> import numpy as np
        >>> from statseq.classify import MMIResult
        >>> r = MMIResult(objective=np.array([-3.0, -2.5, -2.6]), start=-3.0, best=-2.5,
        ...               best_step=1, grad_norm=0.2, converged=False, num_nonfinite=0)
        >>> r.best - r.start
        0.5
    """

    objective: np.ndarray
    start: float
    best: float
    best_step: int
    grad_norm: float
    converged: bool
    num_nonfinite: int


# ---- data ------------------------------------------------------------------------------
def _sequences(X, event_ndim: int, name: str = "X") -> list[np.ndarray]:
    """``X`` as a list of per-sequence arrays ``(T_n,) + event_shape``, with clear errors."""
    if isinstance(X, list | tuple):
        seqs = list(X)
    else:
        arr = np.asarray(X)
        if arr.dtype == object:
            seqs = list(arr)
        else:
            if arr.ndim != 2 + event_ndim:
                raise ValueError(
                    f"{name} must be a list of sequences or an array of shape (num_sequences, "
                    f"num_timesteps{', ' + ', '.join(['dim'] * event_ndim) if event_ndim else ''}"
                    f"); got shape {arr.shape}")
            seqs = list(arr)
    if not seqs:
        raise ValueError(f"{name} holds no sequences")
    out = []
    for n, s in enumerate(seqs):
        a = np.asarray(s)
        if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise TypeError(f"sequence {n} of {name} must be numeric, got dtype {a.dtype}")
        if np.issubdtype(a.dtype, np.complexfloating):
            raise TypeError(f"sequence {n} of {name} is complex: statseq models real data")
        if a.ndim != 1 + event_ndim:
            want = f"(num_timesteps,) + event_shape {tuple(['dim'] * event_ndim)}" \
                if event_ndim else "(num_timesteps,)"
            raise ValueError(f"sequence {n} of {name} must have shape {want}; got shape "
                             f"{a.shape}")
        if a.shape[0] == 0:
            raise ValueError(f"sequence {n} of {name} is empty (no time steps)")
        out.append(a)
    return out


def _covariates(model, inputs, seqs):
    """Per-sequence covariates ``(T_n, input_dim)`` padded to ``(N, T_max, input_dim)``
    (``None`` for a model without inputs), with clear errors."""
    num_inputs = model.num_inputs
    name = type(model).__name__
    if not num_inputs:
        if inputs is not None:
            raise ValueError(f"{name} takes no covariates (input_dim=0), but inputs were "
                             "given; use a model with input_dim > 0 or leave inputs out")
        return None
    if inputs is None:
        raise ValueError(f"{name} takes covariates (input_dim={num_inputs}): pass inputs=, "
                         f"one array (T_n, {num_inputs}) per sequence of X")
    if isinstance(inputs, list | tuple):
        given = list(inputs)
    else:
        arr = np.asarray(inputs)
        if arr.dtype != object and arr.ndim not in (2, 3):
            raise ValueError(f"inputs must be a list of (T_n, {num_inputs}) arrays or an "
                             f"array (num_sequences, num_timesteps, {num_inputs}); got shape "
                             f"{arr.shape}")
        given = list(arr)
    if len(given) != len(seqs):
        raise ValueError(f"inputs hold {len(given)} sequences but X holds {len(seqs)}: one "
                         "covariate sequence per sequence")
    out = []
    for n, (u, s) in enumerate(zip(given, seqs, strict=True)):
        u = np.asarray(u)
        if u.dtype == object or not (np.issubdtype(u.dtype, np.number) or u.dtype == bool) \
                or np.issubdtype(u.dtype, np.complexfloating):
            raise TypeError(f"inputs of sequence {n} must be real numbers, got dtype {u.dtype}")
        if u.ndim == 1 and num_inputs == 1:
            u = u[:, None]
        if u.ndim != 2 or u.shape[1] != num_inputs:
            raise ValueError(f"inputs of sequence {n} must have shape (T_n, {num_inputs}) "
                             f"(input_dim={num_inputs}); got shape {u.shape}")
        if u.shape[0] != s.shape[0]:
            raise ValueError(f"inputs of sequence {n} have {u.shape[0]} time steps but the "
                             f"sequence has {s.shape[0]}: one covariate row per step")
        if not np.all(np.isfinite(u)):
            raise ValueError(f"inputs of sequence {n} hold NaN or infinite values: covariates "
                             "cannot be missing (mark the observation missing instead)")
        out.append(u.astype(float_dtype()))
    return pad_sequences(out)[0]


def _batch(model, X, mask=None, inputs=None):
    """Pad ragged sequences into ``(y, mask, u)``; ``NaN`` entries become masked.

    Returns ``y`` ``(N, T_max) + event_shape`` (zeros where masked), a mask per step
    ``(N, T_max)`` or, when some vector is partly missing, per entry, and the padded
    covariates ``(N, T_max, input_dim)`` (``None`` for a model without inputs).
    """
    event_ndim = len(model.event_shape)
    seqs = _sequences(X, event_ndim)
    u = _covariates(model, inputs, seqs)
    y, step = pad_sequences(seqs)
    y = np.asarray(y)
    entry = np.broadcast_to(step.reshape(step.shape + (1,) * event_ndim), y.shape).copy()
    if np.issubdtype(y.dtype, np.floating):
        entry &= np.isfinite(y)
    if mask is not None:
        if isinstance(mask, list | tuple):
            if len(mask) != len(seqs):
                raise ValueError(f"mask holds {len(mask)} sequences but X holds {len(seqs)}")
            given = []
            for n, (g, s) in enumerate(zip(mask, seqs, strict=True)):
                g = np.asarray(g)
                if g.shape not in (s.shape[:1], s.shape):
                    raise ValueError(f"mask of sequence {n} must have shape {s.shape[:1]} (per "
                                     f"step) or {s.shape} (per entry); got {g.shape}")
                given.append(np.broadcast_to(g.reshape(g.shape + (1,) * (s.ndim - g.ndim)),
                                             s.shape))
            given_pad = pad_sequences(given, pad_value=False)[0]
        else:
            given_pad = np.asarray(mask)
            if given_pad.shape not in (y.shape[:2], y.shape):
                raise ValueError(f"mask must have one entry per time step of X: shape "
                                 f"{y.shape[:2]} (per step) or {y.shape} (per entry); got "
                                 f"{given_pad.shape}")
        given_pad = np.asarray(given_pad)
        if given_pad.dtype != bool:
            if not np.all(np.isin(given_pad, (0, 1))):
                raise ValueError("mask must be boolean (True = observed) or 0/1")
            given_pad = given_pad.astype(bool)
        if given_pad.shape == y.shape[:2] and event_ndim:
            given_pad = given_pad.reshape(given_pad.shape + (1,) * event_ndim)
        entry &= np.broadcast_to(given_pad, y.shape)
    y = np.where(entry, y, 0)
    if model.observation_dtype in ("category", "count"):
        if np.issubdtype(y.dtype, np.floating):
            if not np.all(y == np.round(y)):
                raise ValueError(f"{type(model).__name__} models {model.observation_dtype} "
                                 "data: observed values must be whole numbers")
            y = y.astype(np.int64)
    else:
        y = y.astype(float_dtype())
    if event_ndim:
        flat = entry.reshape(entry.shape[:2] + (-1,))
        if np.all(flat.all(-1) == flat.any(-1)):
            return y, flat.all(-1), u
        return y, entry, u
    return y, entry, u


def _stack(trees):
    return jax.tree.map(lambda *a: jnp.stack(a), *trees)


def _unstack(tree, num: int):
    return [jax.tree.map(lambda a, i=i: a[i], tree) for i in range(num)]


# ---- compiled pieces -------------------------------------------------------------------
def _class_loglik(model, stacked, y, mask, inputs, complete):
    """``(N, C)``: ``log p(y_n | theta_c)`` with ``stacked`` leaves ``(C, ...)``."""
    one = lambda p: run_filter(model, p, y, mask, inputs, complete=complete)[0]  # noqa: E731
    return jax.vmap(one)(stacked).T


@partial(jax.jit, static_argnames=("model", "complete", "draws"))
def _loglik_matrix(model, stacked, y, mask, inputs, *, complete, draws):
    """Per-class log-likelihoods ``(N, C)``; with ``draws`` the leaves are ``(C, S, ...)``
    and the result is the log posterior predictive ``log mean_s p(y_n | theta_cs)``."""
    if not draws:
        return _class_loglik(model, stacked, y, mask, inputs, complete)
    per_draw = jax.vmap(lambda p: _class_loglik(model, p, y, mask, inputs, complete),
                        in_axes=1)(stacked)  # (S, N, C)
    return logsumexp(per_draw, axis=0) - math.log(per_draw.shape[0])


def _conditional_log_likelihood(model, unravel, y, mask, inputs, complete, codes,
                                log_prior):
    """``x -> sum_n log p(c_n | y_n)`` over the flat unconstrained class parameters."""

    def objective(x):
        stacked = jax.vmap(lambda u: from_unconstrained(model, u))(unravel(x))
        joint = _class_loglik(model, stacked, y, mask, inputs, complete) + log_prior
        own = jnp.take_along_axis(joint, codes[:, None], axis=1)[:, 0]
        return jnp.sum(own - logsumexp(joint, axis=1))

    return objective


@partial(jax.jit, static_argnames=("model", "complete", "num_steps"))
def _mmi_compiled(model, u0, y, mask, inputs, codes, log_prior, learning_rate, *,
                  complete, num_steps):
    import optax

    x0, unravel = ravel_pytree(u0)
    objective = _conditional_log_likelihood(model, unravel, y, mask, inputs, complete,
                                            codes, log_prior)
    num = y.shape[0]
    loss = lambda x: -objective(x) / num  # noqa: E731
    grad_fn = jax.value_and_grad(loss)
    opt = optax.adam(learning_rate)

    def step(carry, _):
        x, state, best_x, best_f, bad = carry
        f, g = grad_fn(x)
        ok = jnp.isfinite(f) & jnp.all(jnp.isfinite(g))
        better = ok & (f < best_f)
        best_x = jnp.where(better, x, best_x)
        best_f = jnp.where(better, f, best_f)
        updates, new_state = opt.update(jnp.where(ok, g, 0.0), state, x)
        new_x = jnp.where(ok, optax.apply_updates(x, updates), x)
        new_state = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new_state, state)
        return (new_x, new_state, best_x, best_f, bad + (~ok)), f

    init = (x0, opt.init(x0), x0, jnp.asarray(jnp.inf, x0.dtype), jnp.int32(0))
    (x, _, best_x, best_f, bad), trace = jax.lax.scan(step, init, None, length=num_steps)
    f_last = loss(x)
    last_ok = jnp.isfinite(f_last)
    better = last_ok & (f_last < best_f)
    best_x = jnp.where(better, x, best_x)
    trace = jnp.concatenate([trace, f_last[None]])
    g_best = jax.grad(loss)(best_x)
    return unravel(best_x), -num * trace, jnp.linalg.norm(g_best), bad + (~last_ok)


# ---- the estimator ---------------------------------------------------------------------
class GenerativeClassifier(ClassifierMixin, SequenceEstimator):
    """Sequence classifier from one statseq model per class and Bayes' rule.

        p(c | y_{1:T}) = pi_c p(y_{1:T} | theta_c) / sum_k pi_k p(y_{1:T} | theta_k),
        p(y_{1:T} | theta_c) = prod_t p(y_t | y_{<t}, theta_c).

    Every class gets its own parameters ``theta_c`` of the same ``model``, fitted to that
    class's sequences by the model's own route; ``method="nuts"`` uses the posterior
    predictive ``p(y | c) = E[p(y | theta_c) | data of class c]`` (the average of the
    likelihood over the posterior draws, a log-mean-exp), not a plug-in estimate. With
    ``mmi_steps > 0`` the per-class fits are the start of discriminative training:
    Adam on ``sum_n log p(c_n | y_n)`` (maximum mutual information) over all class
    parameters jointly, in one compiled ``lax.scan``; the best iterate is kept, so the
    training conditional log-likelihood never ends below the start (`MMIResult`).

    Sequences ``X`` are a list of arrays ``(T_n,) + event_shape`` of different lengths
    (padded and masked internally) or one array ``(N, T) + event_shape``. A model with
    covariates (``input_dim > 0``: `statseq.GaussianHMM` with input-driven transitions, an
    ARX model ``ss.AR(order=p, input_dim=k)``, a neural model with ``u_t``) takes
    ``inputs=``, one array ``(T_n, input_dim)`` per sequence (or ``(N, T, input_dim)``),
    in ``fit``, the predictions and MMI alike, and classifies by

        p(c | y, u) = pi_c p(y | u, theta_c) / sum_k pi_k p(y | u, theta_k),

    every class model fitted and scored given its sequences' covariates (which cannot be
    missing; an observation can). ``NaN`` marks a
    missing observation (marginalized by the model's filter), as does ``False`` in an
    optional ``mask`` (per step or per entry). Labels are any hashable values (integers,
    strings), mapped through ``classes_``.

    Ragged sequences and EM: the padding is a run of missing observations after each
    sequence's end. Every likelihood is unchanged by it, and `statseq.fit_em` gives the
    padding no transition counts, so its iterates equal those of EM over each sequence at
    its own length (hmmlearn's).

    Follows scikit-learn's estimator conventions (`sklearn.base.clone`,
    ``cross_val_score``, ``GridSearchCV`` work; ``model__num_states`` is a tunable deep
    parameter) without importing scikit-learn.

    Args:
        model: any statseq model (HMM, AR, LGSSM, neural model, ...), with or without
            covariates (``input_dim``).
        method: ``"em"``, ``"lbfgs"``, ``"sgd"``, ``"nuts"`` or ``"auto"`` (EM when the
            model has an M-step, else L-BFGS).
        fit_options: keyword arguments for the fitting function (`statseq.fit_em`,
            `statseq.fit_lbfgs`, `statseq.fit_sgd`, `statseq.fit_nuts`), e.g.
            ``{"num_iters": 50}`` or ``{"priors": ...}``. ``fit_sgd`` defaults to
            ``num_steps=500, learning_rate=0.01`` when not given.
        init_params: starting parameters for every class, a list of them (one per class,
            in ``classes_`` order), or ``None``: ``model.initialize`` on each class's data
            (else ``model.default_params()``).
        class_prior: prior class probabilities in ``classes_`` order (positive, summing to
            1), or ``None`` for the training class frequencies.
        classes: the possible labels; ``None`` takes the distinct training labels. Given,
            training labels outside it are an error, as is a class with no sequence.
        mmi_steps: Adam steps of discriminative (MMI) training after the per-class fits
            (0: none).
        mmi_learning_rate: Adam's step size for MMI (unconstrained parameters).
        mmi_tol: MMI reports ``converged`` when the gradient norm of the mean conditional
            log-likelihood is at most this.
        random_state: integer seed for initialization, SGD minibatches and NUTS.

    Attributes:
        classes_: the class labels, in the order of the probability columns.
        params_: per-class fitted parameters (for NUTS: posterior draws, leading
            ``(num_draws,)``).
        fits_: per-class results of the fitting function (``FitResult`` or, for NUTS,
            the ``InferenceData``).
        log_class_prior_: ``(num_classes,)`` log prior probabilities.
        mmi_: the `MMIResult` (``None`` without MMI).

    Examples:
        >>> import numpy as np, statseq as ss
        >>> rng = np.random.default_rng(0)
        >>> X = [rng.integers(0, 2, rng.integers(5, 9)) for _ in range(6)]
        >>> X += [(rng.random(7) < 0.9).astype(int) for _ in range(6)]
        >>> labels = ["fair"] * 6 + ["biased"] * 6
        >>> clf = ss.GenerativeClassifier(ss.CategoricalHMM(num_states=1, num_classes=2),
        ...                               fit_options={"num_iters": 5})
        >>> clf = clf.fit(X, labels)
        >>> clf.classes_.tolist()
        ['biased', 'fair']
        >>> clf.predict_proba(X).shape
        (12, 2)
    """

    def __init__(self, model, *, method="auto", fit_options=None, init_params=None,
                 class_prior=None, classes=None, mmi_steps=0, mmi_learning_rate=0.01,
                 mmi_tol=1e-4, random_state=0):
        self._store_init_args(locals())

    # ---- checks ------------------------------------------------------------------------
    def _check_config(self):
        from statseq.core.model import SequenceModel

        if not isinstance(self.model, SequenceModel):
            raise TypeError(f"model must be a statseq model, got {type(self.model).__name__}")
        if self.method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {self.method!r}")
        method = self.method
        if method == "auto":
            method = "em" if hasattr(self.model, "m_step") else "lbfgs"
        if method == "em" and not hasattr(self.model, "m_step"):
            raise ValueError(f"{type(self.model).__name__} has no EM (no m_step); use "
                             "method='lbfgs', 'sgd' or 'nuts'")
        steps = self.mmi_steps
        if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 0:
            raise ValueError(f"mmi_steps must be a non-negative integer, got {steps!r}")
        if steps and method == "nuts":
            raise ValueError("MMI training needs point estimates: use mmi_steps=0 with "
                             "method='nuts'")
        if not float(self.mmi_learning_rate) > 0:
            raise ValueError(f"mmi_learning_rate must be positive, got {self.mmi_learning_rate}")
        if isinstance(self.random_state, bool) or not isinstance(self.random_state,
                                                                 int | np.integer):
            raise TypeError(f"random_state must be an integer seed, got "
                            f"{type(self.random_state).__name__}")
        return method

    def _log_prior(self, codes):
        num = len(self.classes_)
        if self.class_prior is None:
            counts = np.bincount(codes, minlength=num)
            return np.log(counts / counts.sum())
        prior = np.asarray(self.class_prior, float)
        if prior.shape != (num,):
            raise ValueError(f"class_prior must have one probability per class ({num}), got "
                             f"shape {prior.shape}")
        if not np.all(np.isfinite(prior)) or np.any(prior <= 0) or abs(prior.sum() - 1) > 1e-8:
            raise ValueError(f"class_prior must be positive and sum to 1, got {prior.tolist()}")
        return np.log(prior)

    def _check_fitted(self):
        if not hasattr(self, "params_"):
            raise ValueError(f"this {type(self).__name__} is not fitted yet: call fit(X, y)")

    @classmethod
    def from_params(cls, model, params, classes, *, class_prior=None, draws=False):
        """A fitted classifier from given per-class parameters (no fitting).

        Args:
            model: the class-conditional statseq model.
            params: one parameter set per class, in the order of ``classes``.
            classes: the class labels.
            class_prior: class probabilities in ``classes`` order (``None``: uniform).
            draws: each parameter set holds posterior draws on a leading axis (e.g.
                `statseq.posterior_params` of a `statseq.fit_nuts` result, its
                ``(chain, draw)`` axes merged): the class likelihood is then the posterior
                predictive ``log mean_s p(y | theta_c^(s))``, as with ``method="nuts"``.

        Returns:
            A `GenerativeClassifier` ready for ``predict``, ``predict_proba``, MMI's
            ``mmi_objective`` and ``fit`` (which refits from scratch).

        Examples:
            >>> import jax.numpy as jnp, statseq as ss
            >>> model = ss.AR(order=1)
            >>> p = model.default_params()
            >>> ps = [p._replace(coeffs=jnp.full_like(p.coeffs, a)) for a in (0.9, -0.9)]
            >>> clf = ss.GenerativeClassifier.from_params(model, ps, ["pos", "neg"])
            >>> clf.predict([jnp.array([1.0, 0.9, 0.8, 0.7])]).tolist()
            ['pos']
        """
        params = list(params)
        num = len(params)
        if class_prior is None:
            class_prior = np.full(num, 1.0 / num)
        clf = cls(model, classes=list(classes), class_prior=class_prior)
        clf._check_config()
        clf._set_classes(None)
        if len(clf.classes_) != num:
            raise ValueError(f"{num} parameter sets for {len(clf.classes_)} classes")
        clf.log_class_prior_ = clf._log_prior(None)
        if draws:
            sizes = {int(np.shape(leaf)[0]) for p in params for leaf in jax.tree.leaves(p)}
            if len(sizes) != 1:
                raise ValueError(f"draws=True needs one leading draw axis of one size in "
                                 f"every leaf of every class; got sizes {sorted(sizes)}")
            clf.params_ = [jax.tree.map(jnp.asarray, p) for p in params]
        else:
            clf.params_ = [validate_params(model, p) for p in params]
        clf.fits_ = [None] * num
        clf.method_ = "nuts" if draws else "given"
        clf.mmi_ = None
        return clf

    # ---- fitting ------------------------------------------------------------------------
    def _fit_one(self, method, y, mask, inputs, p0, key):
        from statseq import fit as _fit  # noqa: F401  (optax loaded lazily)

        opts = dict(self.fit_options or {})
        opts.setdefault("progress", False)
        model = self.model
        if method == "em":
            from statseq.fit.em import fit_em

            res = fit_em(model, p0, y, mask=mask, inputs=inputs, **opts)
            return res.params, res
        if method == "lbfgs":
            from statseq.fit.lbfgs import fit_lbfgs

            res = fit_lbfgs(model, p0, y, mask=mask, inputs=inputs, **opts)
            return res.params, res
        if method == "sgd":
            from statseq.fit.sgd import fit_sgd

            opts.setdefault("num_steps", 500)
            if "optimizer" not in opts:
                opts.setdefault("learning_rate", 0.01)
            res = fit_sgd(model, p0, y, mask=mask, inputs=inputs, key=key, **opts)
            return res.params, res
        from statseq.bayes import fit_nuts, posterior_params

        opts.setdefault("init_params", p0)
        idata = fit_nuts(model, y, mask=mask, inputs=inputs, key=key, **opts)
        draws = posterior_params(model, idata)
        draws = jax.tree.map(  # (chain, draw) merged; explicit sizes (zero-size leaves)
            lambda a: jnp.reshape(jnp.asarray(a), (a.shape[0] * a.shape[1],) + a.shape[2:]),
            draws)
        return draws, idata

    def _start(self, c, y, mask, inputs, key):
        ip = self.init_params
        if ip is not None:
            if isinstance(ip, list | tuple) and not hasattr(ip, "_fields"):
                if len(ip) != len(self.classes_):
                    raise ValueError(f"init_params is a list of {len(ip)} parameter sets but "
                                     f"there are {len(self.classes_)} classes")
                return ip[c]
            return ip
        try:
            return self.model.initialize(y, key=key, mask=mask, inputs=inputs)
        except (NotImplementedError, TypeError):
            return self.model.default_params()

    def fit(self, X, y, *, mask=None, inputs=None):
        """Fit one model per class (and, with ``mmi_steps``, train them jointly by MMI).

        Args:
            X: a list of sequences ``(T_n,) + event_shape`` (lengths may differ; ``NaN``
                marks a missing value) or an array ``(N, T) + event_shape``.
            y: ``N`` labels (any hashable values).
            mask: optional ``False`` = missing, per step or per entry, like ``X``.
            inputs: covariates of a model with ``input_dim > 0``: a list of arrays
                ``(T_n, input_dim)`` matching ``X``'s sequences (or ``(N, T, input_dim)``);
                finite everywhere. Required for such a model, an error for one without.

        Returns:
            ``self``.
        """
        method = self._check_config()
        codes = self._fit_codes(y, len(_sequences(X, len(self.model.event_shape))))
        self.log_class_prior_ = self._log_prior(codes)
        ybat, mbat, ubat = _batch(self.model, X, mask, inputs)
        keys = jax.random.split(jax.random.key(int(self.random_state)), len(self.classes_))
        params, fits = [], []
        for c in range(len(self.classes_)):
            rows = codes == c
            yc, mc = ybat[rows], mbat[rows]
            uc = None if ubat is None else ubat[rows]
            # every class keeps the common padded length: classes with equally many
            # sequences then share one compiled fitting program
            init_key, fit_key = jax.random.split(keys[c])
            p0 = self._start(c, yc, mc, uc, init_key)
            p, res = self._fit_one(method, yc, mc, uc, p0, fit_key)
            params.append(p)
            fits.append(res)
        self.method_ = method
        self.params_ = params
        self.fits_ = fits
        self.mmi_ = None
        if self.mmi_steps:
            self._mmi(ybat, mbat, ubat, codes)
        return self

    def _prepared(self, y, mask, inputs=None):
        model, data = prepare_sized(self.model, y, mask, inputs)
        return model, data

    def _unconstrained_start(self, model):
        """The class parameters stacked and unconstrained; a parameter on its boundary
        (a probability of exactly 0 or 1: an infinite unconstrained value) is moved to
        ``+-_BOUND`` (a probability near 1e-13) so that MMI has finite gradients there."""
        stacked = _stack([validate_params(model, p) for p in self.params_])
        u = jax.vmap(lambda p: to_unconstrained(model, p))(stacked)
        return jax.tree.map(lambda a: jnp.nan_to_num(a, posinf=_BOUND, neginf=-_BOUND)
                            if jnp.issubdtype(a.dtype, jnp.floating) else a, u)

    def _mmi(self, y, mask, inputs, codes):
        model, data = self._prepared(y, mask, inputs)
        u0 = self._unconstrained_start(model)
        dtype = float_dtype()
        best_u, trace, gnorm, bad = _mmi_compiled(
            model, u0, data.y, data.mask, data.inputs, jnp.asarray(codes),
            jnp.asarray(self.log_class_prior_, dtype),
            jnp.asarray(float(self.mmi_learning_rate), dtype),
            complete=data.complete, num_steps=int(self.mmi_steps))
        trace = np.asarray(trace)
        finite = np.where(np.isfinite(trace), trace, -np.inf)
        best_step = int(np.argmax(finite))
        stacked = jax.vmap(lambda u: from_unconstrained(model, u))(best_u)
        self.params_ = _unstack(stacked, len(self.classes_))
        self.mmi_ = MMIResult(objective=trace, start=float(trace[0]),
                              best=float(finite[best_step]), best_step=best_step,
                              grad_norm=float(gnorm), converged=bool(gnorm <= self.mmi_tol),
                              num_nonfinite=int(bad))

    def mmi_objective(self, X, y, *, mask=None, inputs=None):
        """The MMI objective as a function of flat unconstrained class parameters.

        Args:
            X: sequences, as for ``fit``.
            y: their labels (in ``classes_``).
            mask: optional missing-data mask.
            inputs: covariates, as for ``fit`` (models with ``input_dim > 0`` only).

        Returns:
            ``(objective, x)``: a jitted, differentiable ``objective(x) = sum_n log p(c_n |
            y_n)`` and ``x``, the fitted parameters of all classes, unconstrained (as MMI
            starts from them) and flattened.
        """
        self._check_fitted()
        if self.method_ == "nuts":
            raise ValueError("the MMI objective needs point estimates (not method='nuts')")
        codes = self._encode(y, num_expected=len(_sequences(X, len(self.model.event_shape))))
        model, data = self._prepared(*_batch(self.model, X, mask, inputs))
        x0, unravel = ravel_pytree(self._unconstrained_start(model))
        fn = _conditional_log_likelihood(model, unravel, data.y, data.mask, data.inputs,
                                         data.complete, jnp.asarray(codes),
                                         jnp.asarray(self.log_class_prior_, x0.dtype))
        return jax.jit(fn), x0

    # ---- prediction ---------------------------------------------------------------------
    def log_likelihoods(self, X, *, mask=None, inputs=None) -> np.ndarray:
        """Per-class log-likelihoods ``log p(y_n | c)`` (``log p(y_n | u_n, c)`` with
        covariates), shape ``(N, num_classes)``.

        Args:
            X: sequences, as for ``fit``.
            mask: optional missing-data mask.
            inputs: covariates, as for ``fit`` (models with ``input_dim > 0`` only).

        Returns:
            A NumPy array; for NUTS, the log posterior predictive of each class.
        """
        self._check_fitted()
        model, data = self._prepared(*_batch(self.model, X, mask, inputs))
        stacked = _stack(self.params_)
        out = _loglik_matrix(model, stacked, data.y, data.mask, data.inputs,
                             complete=data.complete, draws=self.method_ == "nuts")
        return np.asarray(out)

    def predict_log_proba(self, X, *, mask=None, inputs=None) -> np.ndarray:
        """Log class posteriors ``log p(c | y_n)``, shape ``(N, num_classes)``.

        Args:
            X: sequences, as for ``fit``.
            mask: optional missing-data mask.
            inputs: covariates, as for ``fit`` (models with ``input_dim > 0`` only).

        Returns:
            ``log pi_c + log p(y_n | c)`` normalized over classes (columns: ``classes_``).
        """
        joint = self.log_likelihoods(X, mask=mask, inputs=inputs) + self.log_class_prior_
        return joint - np.asarray(logsumexp(joint, axis=1, keepdims=True))

    def predict_proba(self, X, *, mask=None, inputs=None) -> np.ndarray:
        """Class posteriors ``p(c | y_n)``, shape ``(N, num_classes)``, rows sum to 1.

        Args:
            X: sequences, as for ``fit``.
            mask: optional missing-data mask.
            inputs: covariates, as for ``fit`` (models with ``input_dim > 0`` only).

        Returns:
            A NumPy array whose columns follow ``classes_``.
        """
        return np.exp(self.predict_log_proba(X, mask=mask, inputs=inputs))

    def predict(self, X, *, mask=None, inputs=None) -> np.ndarray:
        """The most probable class of each sequence (a label from ``classes_``).

        Args:
            X: sequences, as for ``fit``.
            mask: optional missing-data mask.
            inputs: covariates, as for ``fit`` (models with ``input_dim > 0`` only).

        Returns:
            ``(N,)`` labels.
        """
        self._check_fitted()
        return self.classes_[np.argmax(self.predict_log_proba(X, mask=mask, inputs=inputs),
                                       axis=1)]

    def log_loss(self, X, y, *, mask=None, inputs=None) -> float:
        """Mean negative log posterior of the true class, ``-mean_n log p(c_n | y_n)``.

        Args:
            X: sequences, as for ``fit``.
            y: their true labels.
            mask: optional missing-data mask.
            inputs: covariates, as for ``fit`` (models with ``input_dim > 0`` only).

        Returns:
            The log loss (cross-entropy) in nats.
        """
        self._check_fitted()
        codes = self._encode(y, num_expected=len(_sequences(X, len(self.model.event_shape))))
        logp = self.predict_log_proba(X, mask=mask, inputs=inputs)
        return float(-np.mean(logp[np.arange(len(codes)), codes]))


def describe_mmi(result: MMIResult) -> str:
    """One line on an `MMIResult`: converged or stopped, start, best, gradient norm.

    Args:
        result: the ``mmi_`` attribute of a fitted `GenerativeClassifier`.

    Returns:
        A sentence.

    Examples:
        >>> import numpy as np
        >>> r = MMIResult(np.array([-3.0, -2.5]), -3.0, -2.5, 1, 0.3, False, 0)
        >>> describe_mmi(r)[:40]
        'MMI stopped at the step budget: sum_n lo'
    """
    state = "converged" if result.converged else "stopped at the step budget"
    return (f"MMI {state}: sum_n log p(c_n|y_n) {result.start:.4f} -> {result.best:.4f} "
            f"(step {result.best_step} of {len(result.objective) - 1}), gradient norm "
            f"{result.grad_norm:.2e}")
