"""Gaussian (full / diagonal), Bernoulli and linear autoregressive HMMs against independent
references: brute-force enumeration of all state paths with scipy densities, hmmlearn's EM
(with matched priors), dynamax's log-likelihoods, and closed-form MAP estimates by hand.

Compile time dominates, so each family uses one model object, one brute-force shape
``(3, 5, D)``, one EM shape ``(2, 40, D)`` and one priors structure; MLE (prior-free) EM
iterations reuse the E-step that ``fit_em`` compiles for its diagnostics.
"""

from __future__ import annotations

import itertools
import warnings

import hmmlearn.base
import hmmlearn.hmm
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy import stats
from scipy.special import logsumexp

import statseq as ss
from statseq.core.distributions import masked_log_prob
from statseq.core.validation import prepare_data
from statseq.models.hmm.autoregressive import ARHMMEmissions, LinearAutoregressiveHMM
from statseq.models.hmm.base import HMMParams, _e_step
from statseq.models.hmm.bernoulli import BernoulliEmissions, BernoulliHMM
from statseq.models.hmm.gaussian import (
    DiagonalGaussianEmissions,
    GaussianEmissions,
    GaussianHMM,
    NormalInverseGamma,
    NormalInverseWishart,
)

T_BRUTE, N_EM, T_EM, NUM_ITERS = 5, 2, 40, 25

# ---------------------------------------------------------------------------------------
# independent references (numpy / scipy only)


def brute_force(pi, trans, ll):
    """log p(y) and p(z_t | y) by enumerating all K^T paths of a (T, K) log-lik table."""
    num_steps, k = ll.shape
    paths = np.array(list(itertools.product(range(k), repeat=num_steps)))
    lp = np.log(pi[paths[:, 0]]) + ll[np.arange(num_steps), paths].sum(axis=1)
    lp = lp + np.log(trans[paths[:, :-1], paths[:, 1:]]).sum(axis=1)
    total = logsumexp(lp)
    w = np.exp(lp - total)
    marg = np.zeros((num_steps, k))
    for t in range(num_steps):
        np.add.at(marg[t], paths[:, t], w)
    return total, marg


def np_lags(y, num_lags):
    """(T, L*D) regressors [y_{t-1}, ..., y_{t-L}] with zeros before the data."""
    num_steps, d = y.shape
    x = np.zeros((num_steps, num_lags * d))
    for t in range(num_steps):
        for lag in range(1, num_lags + 1):
            if t - lag >= 0:
                x[t, (lag - 1) * d: lag * d] = y[t - lag]
    return x


def gauss_ll(y_t, m_t, mean, cov):
    if not m_t.any():
        return 0.0
    return stats.multivariate_normal(mean[m_t], cov[np.ix_(m_t, m_t)]).logpdf(y_t[m_t])


def emission_table(model, em, y, mask):
    """(T, K) log p(observed y_t | z_t = k) with scipy, missing entries dropped."""
    num_steps, k = y.shape[0], model.num_states
    out = np.zeros((num_steps, k))
    for t in range(num_steps):
        m_t = mask[t]
        for j in range(k):
            if isinstance(model, GaussianHMM) and model.covariance == "full":
                out[t, j] = gauss_ll(y[t], m_t, em.means[j], em.covs[j])
            elif isinstance(model, GaussianHMM):
                out[t, j] = stats.norm(em.means[j], np.sqrt(em.variances[j])).logpdf(
                    y[t])[m_t].sum()
            elif isinstance(model, BernoulliHMM):
                out[t, j] = stats.bernoulli(em.probs[j]).logpmf(y[t])[m_t].sum()
            else:
                if t < model.num_lags:
                    continue
                x = np_lags(y, model.num_lags)[t]
                out[t, j] = gauss_ll(y[t], m_t, em.weights[j] @ x + em.biases[j], em.covs[j])
    return out


# ---------------------------------------------------------------------------------------
# the four families: a model, random parameters, data, priors


def random_cov(rng, d, scale=1.0):
    a = rng.normal(size=(d, d))
    return scale * (a @ a.T / d + 0.5 * np.eye(d))


class Family:
    def __init__(self, name, model):
        self.name, self.model = name, model
        self.k, self.d = model.num_states, model.event_shape[0]

    def random_params(self, rng, spread=3.0):
        k, d = self.k, self.d
        pi = rng.dirichlet(2 * np.ones(k))
        trans = rng.dirichlet(np.ones(k), size=k) + 2 * np.eye(k)
        trans /= trans.sum(1, keepdims=True)
        m = self.model
        if isinstance(m, GaussianHMM):
            means = spread * rng.normal(size=(k, d))
            covs = np.stack([random_cov(rng, d) for _ in range(k)])
            em = (GaussianEmissions(means, covs) if m.covariance == "full" else
                  DiagonalGaussianEmissions(means, np.diagonal(covs, axis1=1, axis2=2).copy()))
        elif isinstance(m, BernoulliHMM):
            em = BernoulliEmissions(rng.uniform(0.1, 0.9, size=(k, d)))
        else:
            em = ARHMMEmissions(0.3 * rng.normal(size=(k, d, d * m.num_lags)),
                                spread * rng.normal(size=(k, d)),
                                np.stack([random_cov(rng, d, 0.5) for _ in range(k)]))
        return HMMParams(pi, trans, em)

    def simulate(self, params, rng, n, num_steps):
        """Sequences drawn with numpy from ``params`` (numpy arrays)."""
        m, em = self.model, params.emissions
        ys = np.zeros((n, num_steps, self.d))
        for s in range(n):
            z = rng.choice(self.k, p=params.initial_probs)
            for t in range(num_steps):
                if t:
                    z = rng.choice(self.k, p=params.transitions[z])
                if isinstance(m, GaussianHMM):
                    cov = em.covs[z] if m.covariance == "full" else np.diag(em.variances[z])
                    ys[s, t] = rng.multivariate_normal(em.means[z], cov)
                elif isinstance(m, BernoulliHMM):
                    ys[s, t] = rng.random(self.d) < em.probs[z]
                else:
                    x = np_lags(ys[s], m.num_lags)[t]
                    ys[s, t] = rng.multivariate_normal(em.weights[z] @ x + em.biases[z],
                                                       em.covs[z])
        return ys.astype(int) if isinstance(m, BernoulliHMM) else ys

    def em_mask(self, rng, shape):
        """Per-entry and whole-step gaps where the family allows them."""
        mask = np.ones(shape, bool)
        if isinstance(self.model, LinearAutoregressiveHMM):
            mask[1, -3:] = False  # trailing padding of a ragged batch
            mask[1, -4, 0] = False  # a partially observed last step
            return mask
        mask &= rng.random(shape) > 0.1
        mask[:, rng.random(shape[1]) < 0.05] = False
        return mask

    def priors(self, rng):
        """The conjugate priors used by every fit_em call of this family (one structure)."""
        k, d, m = self.k, self.d, self.model
        pi = dist.Dirichlet(jnp.asarray(1.0 + rng.random(k)))
        trans = dist.Dirichlet(jnp.asarray(1.0 + rng.random((k, k))))
        if isinstance(m, GaussianHMM) and m.covariance == "full":
            em = NormalInverseWishart(jnp.asarray(rng.normal(size=d)), 0.5 + rng.random(),
                                      d + 1.0 + rng.random(), jnp.asarray(random_cov(rng, d)))
        elif isinstance(m, GaussianHMM):
            em = NormalInverseGamma(jnp.asarray(rng.normal(size=d)), 0.5 + rng.random(),
                                    1.0 + rng.random(), 0.5 + rng.random())
        elif isinstance(m, BernoulliHMM):
            em = BernoulliEmissions(dist.Beta(1.0 + rng.random(d), 1.0 + rng.random(d)))
        else:
            em = None
        return HMMParams(pi, trans, em)


FAMILIES = {
    "gaussian-full": Family("gaussian-full", GaussianHMM(num_states=2, emission_dim=2,
                                                         min_variance=0.0)),
    "gaussian-diag": Family("gaussian-diag", GaussianHMM(num_states=3, emission_dim=2,
                                                         covariance="diagonal",
                                                         min_variance=0.0)),
    "bernoulli": Family("bernoulli", BernoulliHMM(num_states=3, emission_dim=3)),
    "arhmm": Family("arhmm", LinearAutoregressiveHMM(num_states=2, emission_dim=2,
                                                     num_lags=2)),  # min_variance=1e-6
}
NAMES = list(FAMILIES)


def to_jax(params):
    return jax.tree.map(jnp.asarray, params)


def to_np(params):
    return jax.tree.map(np.asarray, params)


def fit(fam, params, y, mask, priors, tol=0.0, **kwargs):
    return ss.fit_em(fam.model, to_jax(params), y, mask=mask, num_iters=NUM_ITERS, tol=tol,
                     priors=priors, progress=False, **kwargs)


def mle_em(fam, params, y, mask, num_iters):
    """Prior-free EM with the E-step fit_em compiles for its diagnostics (no new compile
    of the whole loop): (trace of log p(y | theta_n), final params)."""
    data = prepare_data(fam.model, y, mask)
    params, trace = to_jax(params), []
    for _ in range(num_iters):
        st, lp = _e_step(fam.model, params, data.y, data.mask, data.inputs)
        trace.append(float(lp))
        params = fam.model.m_step(params, st, None, data.inputs)
    return np.array(trace), params


# ---------------------------------------------------------------------------------------
# likelihood and smoother against brute force


def brute_data(fam, rng):
    """Three sequences: fully observed, per-entry gaps, whole-step gaps."""
    params = fam.random_params(rng)
    y = fam.simulate(params, rng, 3, T_BRUTE)
    mask = np.ones(y.shape, bool)
    if isinstance(fam.model, LinearAutoregressiveHMM):
        mask[1, -1, 0] = False  # only a final step may have gaps (it is nobody's lag)
        mask[2, -2:] = False
    else:
        mask[1] = rng.random(mask[1].shape) > 0.35
        mask[1, 0] = [True] + [False] * (fam.d - 1)
        mask[2, [1, 3]] = False
    return params, y, mask


@pytest.mark.parametrize("name", NAMES)
def test_log_prob_and_smoother_match_brute_force(name):
    fam = FAMILIES[name]
    rng = np.random.default_rng(1)
    params, y, mask = brute_data(fam, rng)
    got = np.asarray(ss.log_prob(fam.model, to_jax(params), y, mask=mask))
    post = fam.model.smoother(to_jax(params), y, mask=mask)
    post_full = fam.model.smoother(to_jax(params), y)  # same compiled program
    for s in range(3):
        ll = emission_table(fam.model, params.emissions, y[s], mask[s])
        total, marg = brute_force(params.initial_probs, params.transitions, ll)
        np.testing.assert_allclose(got[s], total, rtol=1e-11)
        np.testing.assert_allclose(float(post.marginal_log_lik[s]), total, rtol=1e-11)
        np.testing.assert_allclose(np.asarray(post.smoothed_probs[s]), marg, atol=1e-11)
    ll0 = emission_table(fam.model, params.emissions, y[0], np.ones(y[0].shape, bool))
    total0, marg0 = brute_force(params.initial_probs, params.transitions, ll0)
    np.testing.assert_allclose(float(post_full.marginal_log_lik[0]), total0, rtol=1e-11)
    np.testing.assert_allclose(np.asarray(post_full.smoothed_probs[0]), marg0, atol=1e-11)
    # the filter's per-step log-probs sum to the smoother's total, masked steps add 0
    filt = ss.filter(fam.model, to_jax(params), y, mask=mask)
    if name != "arhmm":
        assert abs(float(filt.log_probs[2, 1])) < 1e-12
    np.testing.assert_allclose(np.asarray(filt.log_prob), got, rtol=1e-12)


def dynamax_params(params_cls, initial_probs, transitions, emissions):
    """dynamax parameters built directly (its ``initialize`` costs seconds of eager ops)."""
    from dynamax.hidden_markov_model.models.initial import ParamsStandardHMMInitialState
    from dynamax.hidden_markov_model.models.transitions import ParamsStandardHMMTransitions

    return params_cls(ParamsStandardHMMInitialState(jnp.asarray(initial_probs)),
                      ParamsStandardHMMTransitions(jnp.asarray(transitions)),
                      jax.tree.map(jnp.asarray, emissions))


def test_dynamax_gaussian_log_likelihood_at_same_params():
    from dynamax.hidden_markov_model import GaussianHMM as DxGaussian
    from dynamax.hidden_markov_model.models.gaussian_hmm import (
        ParamsGaussianHMM,
        ParamsGaussianHMMEmissions,
    )

    fam = FAMILIES["gaussian-full"]
    params, y, _ = brute_data(fam, np.random.default_rng(2))
    em = params.emissions
    dx = DxGaussian(fam.k, fam.d)
    dx_params = dynamax_params(ParamsGaussianHMM, params.initial_probs, params.transitions,
                               ParamsGaussianHMMEmissions(em.means, em.covs))
    theirs = jax.jit(jax.vmap(dx.marginal_log_prob, in_axes=(None, 0)))(dx_params,
                                                                        jnp.asarray(y))
    ours = ss.log_prob(fam.model, to_jax(params), y, mask=np.ones(y.shape, bool))
    np.testing.assert_allclose(np.asarray(theirs), np.asarray(ours), rtol=1e-10)


def test_dynamax_arhmm_log_likelihood_at_same_params():
    """dynamax scores every step with zero pre-sample lags; ours conditions on the first
    L values. They agree on y[L:] with prev_emissions = y[:L] and initial law pi A^L."""
    from dynamax.hidden_markov_model import LinearAutoregressiveHMM as DxAR
    from dynamax.hidden_markov_model.models.arhmm import ParamsLinearAutoregressiveHMM
    from dynamax.hidden_markov_model.models.linreg_hmm import (
        ParamsLinearRegressionHMMEmissions,
    )

    fam = FAMILIES["arhmm"]
    lag = fam.model.num_lags
    params, y, _ = brute_data(fam, np.random.default_rng(3))
    em = params.emissions
    ours = np.asarray(ss.log_prob(fam.model, to_jax(params), y, mask=np.ones(y.shape, bool)))
    dx = DxAR(fam.k, fam.d, num_lags=lag)
    pi_l = params.initial_probs @ np.linalg.matrix_power(params.transitions, lag)
    dx_params = dynamax_params(ParamsLinearAutoregressiveHMM, pi_l, params.transitions,
                               ParamsLinearRegressionHMMEmissions(em.weights, em.biases,
                                                                  em.covs))
    inputs = jnp.stack([dx.compute_inputs(jnp.asarray(y[s, lag:]),
                                          prev_emissions=jnp.asarray(y[s, :lag]))
                        for s in range(3)])
    np.testing.assert_allclose(np.asarray(inputs[0]), np_lags(y[0], lag)[lag:])
    theirs = jax.jit(jax.vmap(dx.marginal_log_prob, in_axes=(None, 0, 0)))(
        dx_params, jnp.asarray(y[:, lag:]), inputs)
    np.testing.assert_allclose(np.asarray(theirs), ours, rtol=1e-10)
    # with dynamax's own convention (zero lags, every step scored) the first L steps differ
    ll = np.asarray(fam.model.log_likelihoods(to_jax(params), jnp.asarray(y[0]),
                                              jnp.ones(y[0].shape, bool)))
    assert np.all(ll[:lag] == 0.0) and np.all(ll[lag:] != 0.0)


# ---------------------------------------------------------------------------------------
# EM: monotone, against hmmlearn, MAP by hand, states without mass


def em_problem(fam, seed):
    rng = np.random.default_rng(100 + seed)
    truth = fam.random_params(rng)
    y = fam.simulate(truth, rng, N_EM, T_EM)
    mask = fam.em_mask(rng, y.shape)
    method = "data" if seed % 2 else "random"
    start = fam.model.initialize(y, mask=mask, key=jax.random.key(seed), method=method)
    return y, mask, start, fam.priors(rng)


@pytest.mark.parametrize("name", NAMES)
def test_em_is_monotone_on_random_problems(name):
    fam = FAMILIES[name]
    for seed in range(20):
        y, mask, start, priors = em_problem(fam, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # states may lose their mass
            res = fit(fam, start, y, mask, priors)
        trace = res.log_joint[: res.num_iterations]
        assert np.all(np.isfinite(trace)), (name, seed)
        assert np.all(np.diff(trace) > -1e-8 * np.abs(trace[1:])), (name, seed, trace)
        assert all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree.leaves(res.params))
        # prior-free EM (the closed-form MLE branch) is monotone too; from the k-means
        # ("data") starts only: a random start may give a state a variance narrow enough
        # that prior-free EM collapses it onto a few points, where the Gaussian likelihood
        # is unbounded (the spurious optima fit_restarts sets aside)
        if seed % 2 and seed < 8:
            mle_trace, _ = mle_em(fam, start, y, mask, 12)
            assert np.all(np.diff(mle_trace) > -1e-8 * np.abs(mle_trace[1:])), (name, seed)


def hmmlearn_gaussian(fam, params, priors):
    """hmmlearn GaussianHMM whose M-step is our NIW / NIG MAP (or the MLE when priors is
    None): means_weight = kappa, covars_prior = Psi (2 beta), covars_weight chosen so the
    denominators match (nu + 2D + 2 for full, 2 alpha + 4 for diagonal)."""
    full = fam.model.covariance == "full"
    kw = dict(means_prior=0.0, means_weight=0.0, covars_prior=0.0, covars_weight=1.0)
    if priors is not None:
        p = priors.emissions
        kw = dict(startprob_prior=np.asarray(priors.initial_probs.concentration),
                  transmat_prior=np.asarray(priors.transitions.concentration),
                  means_prior=np.asarray(p.loc), means_weight=float(p.mean_precision.mean()))
        if full:
            kw.update(covars_prior=np.asarray(p.scale),
                      covars_weight=float(p.df) + 2 * fam.d + 2)
        else:
            kw.update(covars_prior=2 * np.asarray(p.rate),
                      covars_weight=2 * float(p.concentration.mean()) + 4)
    h = hmmlearn.hmm.GaussianHMM(fam.k, covariance_type="full" if full else "diag",
                                 n_iter=1, tol=-np.inf, init_params="", params="stmc",
                                 implementation="log", **kw)
    h.startprob_, h.transmat_ = params.initial_probs, params.transitions
    h.means_ = params.emissions.means
    h.covars_ = params.emissions.covs if full else params.emissions.variances
    return h


class HmmlearnBernoulli(hmmlearn.hmm.PoissonHMM):
    """hmmlearn's EM machinery (forward-backward, start/transition M-steps) with Bernoulli
    emissions (``lambdas_`` holds the probabilities) and a Beta(a, b) MAP M-step."""

    def __init__(self, *args, beta_a=1.0, beta_b=1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.beta_a, self.beta_b = beta_a, beta_b

    def _compute_log_likelihood(self, X):
        p = self.lambdas_
        return X @ np.log(p).T + (1 - X) @ np.log1p(-p).T

    def _compute_likelihood(self, X):
        return np.exp(self._compute_log_likelihood(X))

    def _do_mstep(self, stats):
        hmmlearn.base.BaseHMM._do_mstep(self, stats)
        a, b = self.beta_a, self.beta_b
        self.lambdas_ = ((stats["obs"] + a - 1) / (stats["post"][:, None] + a + b - 2))


def hmmlearn_bernoulli(fam, params, priors):
    kw = {}
    if priors is not None:
        beta = priors.emissions.probs
        kw = dict(startprob_prior=np.asarray(priors.initial_probs.concentration),
                  transmat_prior=np.asarray(priors.transitions.concentration),
                  beta_a=np.asarray(beta.concentration1), beta_b=np.asarray(beta.concentration0))
    h = HmmlearnBernoulli(fam.k, n_iter=1, tol=-np.inf, init_params="", params="stl",
                          implementation="log", **kw)
    h.startprob_, h.transmat_ = params.initial_probs, params.transitions
    h.lambdas_ = params.emissions.probs
    return h


def hmmlearn_run(h, y, num_iters):
    """hmmlearn's per-iteration log-likelihoods (monitor_.history keeps only two, so one
    iteration per fit) and the parameters entering each iteration."""
    x, lengths = y.reshape(-1, y.shape[-1]), [y.shape[1]] * y.shape[0]
    lls, snaps = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(num_iters):
            snaps.append([np.array(getattr(h, a)) for a in
                          ("startprob_", "transmat_", "means_", "_covars_", "lambdas_")
                          if hasattr(h, a)])
            h.fit(x, lengths)
            lls.append(h.monitor_.history[-1])
    return np.array(lls), snaps


@pytest.mark.filterwarnings("ignore:state .* has almost no posterior mass")
@pytest.mark.parametrize("name", ["gaussian-full", "gaussian-diag", "bernoulli"])
def test_em_matches_hmmlearn(name):
    """Same start, full data: MLE trajectories (prior-free) and MAP trajectories (our
    conjugate priors mapped onto hmmlearn's prior arguments) agree per iteration.

    hmmlearn updates startprob from the first step's posterior summed over sequences, as
    we do; its min_covar only enters initialization (not used with init_params=""), and
    covars_prior=0, covars_weight=1 make its covariance M-step the plain MLE, matched by
    our min_variance=0. Tolerance 1e-8 relative: the two implementations round
    differently and EM propagates the rounding over iterations.
    """
    fam = FAMILIES[name]
    make = hmmlearn_bernoulli if name == "bernoulli" else hmmlearn_gaussian
    y, _, start, priors = em_problem(fam, 1)
    full_mask = np.ones(y.shape, bool)
    np_start = to_np(start)
    # prior-free
    ours, ours_params = mle_em(fam, start, y, full_mask, 10)
    theirs, _ = hmmlearn_run(make(fam, np_start, None), y, 10)
    np.testing.assert_allclose(ours, theirs, rtol=1e-8)
    # MAP: our trace adds log p(theta_n); add it to hmmlearn's log-likelihoods
    res = fit(fam, start, y, full_mask, priors)
    h = make(fam, np_start, priors)
    theirs, snaps = hmmlearn_run(h, y, NUM_ITERS)
    lp = []
    for snap in snaps:
        pi, trans, *rest = snap
        em = (BernoulliEmissions(rest[0]) if name == "bernoulli" else
              type(start.emissions)(rest[0], rest[1]))
        lp.append(float(ss.log_prior(priors, to_jax(HMMParams(pi, trans, em)))))
    n = res.num_iterations  # (fewer than NUM_ITERS if the trace stopped changing)
    np.testing.assert_allclose(res.log_joint[:n], (theirs + np.array(lp))[:n], rtol=1e-8)
    got = to_np(res.params)
    np.testing.assert_allclose(got.transitions, h.transmat_, rtol=1e-6, atol=1e-9)
    if name == "bernoulli":
        np.testing.assert_allclose(got.emissions.probs, h.lambdas_, rtol=1e-6, atol=1e-9)
    else:
        np.testing.assert_allclose(got.emissions.means, h.means_, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(got.emissions[1], h._covars_, rtol=1e-6, atol=1e-8)


def far_state_problem(fam, rng, bernoulli_zero=0.0):
    """Data from state 0 only, with the other states placed where they have (exactly, or
    for ``bernoulli_zero > 0`` up to ~1e-300) zero posterior weight, so that state 0 is a
    one-state model and the others have no data."""
    params = fam.random_params(rng)
    em = params.emissions
    if isinstance(fam.model, BernoulliHMM):
        probs = em.probs.copy()
        probs[1:, 0] = bernoulli_zero  # states >= 1 (almost) never emit a one in entry 0
        em = BernoulliEmissions(probs)
        y = fam.simulate(HMMParams(np.eye(fam.k)[0], np.eye(fam.k), em), rng, N_EM, T_EM)
        y[..., 0] = 1
    else:
        far = em.means.copy() if hasattr(em, "means") else em.biases.copy()
        far[1:] = 1e4
        em = em._replace(**{"means" if hasattr(em, "means") else "biases": far})
        y = fam.simulate(HMMParams(np.eye(fam.k)[0], np.eye(fam.k), em), rng, N_EM, T_EM)
    return params._replace(emissions=em), y


@pytest.mark.parametrize("name", NAMES)
def test_state_without_mass_keeps_its_values_and_stays_finite(name):
    fam = FAMILIES[name]
    params, y = far_state_problem(fam, np.random.default_rng(5))
    mask = np.ones(y.shape, bool)
    data = prepare_data(fam.model, y, mask)
    st, _ = _e_step(fam.model, to_jax(params), data.y, data.mask, data.inputs)
    first = getattr(fam.model, "num_lags", 0)  # conditioned steps carry no emission
    assert np.all(np.asarray(st["weights"])[:, first:, 1:] == 0.0)
    trace, fitted = mle_em(fam, params, y, mask, 4)
    assert np.all(np.isfinite(trace))
    for a, b in zip(jax.tree.leaves(to_np(fitted.emissions)), jax.tree.leaves(params.emissions),
                    strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a[1:], b[1:])
    if name != "bernoulli":  # (a Beta prior has log density -inf at p = 0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = fit(fam, params, y, mask, fam.priors(np.random.default_rng(0)))
        assert all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree.leaves(res.params))
        assert np.all(np.isfinite(res.log_joint[: res.num_iterations]))
        if name == "arhmm":  # no emission prior: the far state stays empty and is reported
            assert any("no posterior mass" in str(w.message) for w in caught)


@pytest.mark.filterwarnings("ignore:state .* has almost no posterior mass")
def test_map_equals_closed_form_for_one_state_and_moves_toward_the_prior():
    rng = np.random.default_rng(6)
    for name in ("gaussian-full", "gaussian-diag", "bernoulli"):
        fam = FAMILIES[name]
        params, y = far_state_problem(fam, rng, bernoulli_zero=1e-300)
        priors = fam.priors(rng)
        mask = np.ones(y.shape, bool)
        # tol huge: fit_em stops after its first M-step, whose weights are exactly [1, 0]
        res = fit(fam, params, y, mask, priors, tol=1e10)
        assert res.num_iterations == 2
        got = to_np(res.params.emissions)
        flat = y.reshape(-1, fam.d).astype(float)
        n, ybar = flat.shape[0], flat.mean(0)
        scatter = (flat - ybar).T @ (flat - ybar)
        p = priors.emissions
        if name == "gaussian-full":
            kappa, m0, nu, psi = (float(p.mean_precision), np.asarray(p.loc), float(p.df),
                                  np.asarray(p.scale))
            mean = (kappa * m0 + n * ybar) / (kappa + n)
            psi_n = psi + scatter + kappa * n / (kappa + n) * np.outer(ybar - m0, ybar - m0)
            cov = psi_n / (nu + n + fam.d + 2)
            np.testing.assert_allclose(got.means[0], mean, rtol=1e-10)
            np.testing.assert_allclose(got.covs[0], cov, rtol=1e-10)
            # the empty state takes the prior's mode
            np.testing.assert_array_equal(got.means[1], m0)
            np.testing.assert_allclose(got.covs[1], psi / (nu + fam.d + 2), rtol=1e-14)
            # toward the prior: the mean moves from ybar to m0; a large scale inflates Sigma
            assert np.all(np.sign(got.means[0] - ybar) == np.sign(m0 - ybar))
            big = NormalInverseWishart(p.loc, p.mean_precision, p.df, 100.0 * p.scale)
            res2 = fit(fam, params, y, mask, priors._replace(emissions=big), tol=1e10)
            mle_cov = scatter / n
            assert np.trace(np.asarray(res2.params.emissions.covs[0])) > np.trace(mle_cov)
        elif name == "gaussian-diag":
            kappa, m0 = np.asarray(p.mean_precision), np.asarray(p.loc)
            alpha, beta = np.asarray(p.concentration), np.asarray(p.rate)
            mean = (kappa * m0 + n * ybar) / (kappa + n)
            beta_n = beta + 0.5 * (np.diag(scatter) + kappa * n / (kappa + n) * (ybar - m0) ** 2)
            var = beta_n / (alpha + n / 2 + 1.5)
            np.testing.assert_allclose(got.means[0], mean, rtol=1e-10)
            np.testing.assert_allclose(got.variances[0], var, rtol=1e-10)
            np.testing.assert_allclose(got.variances[1:], np.broadcast_to(
                beta / (alpha + 1.5), (fam.k - 1, fam.d)), rtol=1e-12)
            assert np.all(np.sign(got.means[0] - ybar) == np.sign(m0 - ybar))
        else:
            a, b = np.asarray(p.probs.concentration1), np.asarray(p.probs.concentration0)
            ones = flat.sum(0)
            np.testing.assert_allclose(got.probs[0], (ones + a - 1) / (n + a + b - 2),
                                       rtol=1e-10)
            # a prior favouring ones pulls every frequency up
            up = priors._replace(emissions=BernoulliEmissions(dist.Beta(20.0 * jnp.ones(3),
                                                                        jnp.ones(3))))
            res2 = fit(fam, params, y, mask, up, tol=1e10)
            freq = ones / n
            moved = np.asarray(res2.params.emissions.probs[0])
            assert np.all(moved[1:] > freq[1:]) and moved[0] == 1.0


def test_mle_m_step_equals_hand_computed_statistics():
    """One prior-free M-step from E-step weights, against numpy: weighted means and
    covariances for Gaussians (with E[y_miss | y_obs, z] and the conditional covariance
    for partially observed vectors), weighted least squares for the AR-HMM."""
    for name in ("gaussian-full", "gaussian-diag", "arhmm"):
        fam = FAMILIES[name]
        y, mask, start, _ = em_problem(fam, 3)
        data = prepare_data(fam.model, y, mask)
        st, _ = _e_step(fam.model, to_jax(start), data.y, data.mask, data.inputs)
        new = to_np(fam.model.m_step(to_jax(start), st, None, data.inputs).emissions)
        w = np.asarray(st["weights"]).reshape(-1, fam.k)
        rows, obs = y.reshape(-1, fam.d), mask.reshape(-1, fam.d)
        em = to_np(start.emissions)
        for k in range(fam.k):
            if name == "gaussian-full":
                ey, cc, ws = [], [], []
                for r, o in zip(rows, obs, strict=True):
                    if not o.any():
                        continue
                    mu, sig = em.means[k], em.covs[k]
                    e, c = r.copy(), np.zeros((fam.d, fam.d))
                    mi = ~o
                    if mi.any():
                        gain = sig[np.ix_(mi, o)] @ np.linalg.inv(sig[np.ix_(o, o)])
                        e[mi] = mu[mi] + gain @ (r[o] - mu[o])
                        c[np.ix_(mi, mi)] = sig[np.ix_(mi, mi)] - gain @ sig[np.ix_(o, mi)]
                    ey.append(e)
                    cc.append(c)
                ws = w[obs.any(1), k]
                ey, cc = np.array(ey), np.array(cc)
                mean = ws @ ey / ws.sum()
                cov = (np.einsum("n,ni,nj->ij", ws, ey - mean, ey - mean)
                       + np.einsum("n,nij->ij", ws, cc)) / ws.sum()
                np.testing.assert_allclose(new.means[k], mean, rtol=1e-9)
                np.testing.assert_allclose(new.covs[k], cov, rtol=1e-9)
            elif name == "gaussian-diag":
                wk = w[:, k][:, None] * obs
                mean = (wk * rows).sum(0) / wk.sum(0)
                var = (wk * (rows - mean) ** 2).sum(0) / wk.sum(0)
                np.testing.assert_allclose(new.means[k], mean, rtol=1e-9)
                np.testing.assert_allclose(new.variances[k], var, rtol=1e-9)
            else:
                lag = fam.model.num_lags
                s_pp = np.zeros((2 * fam.d + 1,) * 2)
                s_yp = np.zeros((fam.d, 2 * fam.d + 1))
                s_yy = np.zeros((fam.d, fam.d))
                total = 0.0
                weights = np.asarray(st["weights"])
                for s in range(N_EM):
                    phi = np.concatenate([np_lags(y[s], lag), np.ones((T_EM, 1))], 1)
                    for t in range(lag, T_EM):
                        o = mask[s, t]
                        if not o.any():
                            continue
                        mu = np.concatenate([em.weights[k], em.biases[k][:, None]], 1) @ phi[t]
                        sig = em.covs[k]
                        e, c = y[s, t].copy(), np.zeros((fam.d, fam.d))
                        mi = ~o
                        if mi.any():
                            gain = sig[np.ix_(mi, o)] @ np.linalg.inv(sig[np.ix_(o, o)])
                            e[mi] = mu[mi] + gain @ (y[s, t, o] - mu[o])
                            c[np.ix_(mi, mi)] = sig[np.ix_(mi, mi)] - gain @ sig[np.ix_(o, mi)]
                        wt = weights[s, t, k]
                        total += wt
                        s_pp += wt * np.outer(phi[t], phi[t])
                        s_yp += wt * np.outer(e, phi[t])
                        s_yy += wt * (np.outer(e, e) + c)
                theta = s_yp @ np.linalg.inv(s_pp)
                cov = (s_yy - theta @ s_yp.T) / total + fam.model.min_variance * np.eye(fam.d)
                np.testing.assert_allclose(new.weights[k], theta[:, :-1], rtol=1e-8, atol=1e-10)
                np.testing.assert_allclose(new.biases[k], theta[:, -1], rtol=1e-8, atol=1e-10)
                np.testing.assert_allclose(new.covs[k], cov, rtol=1e-8, atol=1e-12)


def test_min_variance_guards_a_collapsing_state():
    """A state whose whole weight sits on one point gets covariance min_variance * I."""
    model = GaussianHMM(num_states=2, emission_dim=2)  # default min_variance = 1e-6
    y = np.array([[[0.5, -1.0], [3.0, 3.0], [3.1, 2.9]]])
    weights = jnp.asarray([[[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]])
    em = GaussianEmissions(jnp.zeros((2, 2)), jnp.tile(jnp.eye(2), (2, 1, 1)))

    @jax.jit
    def m_step(y, weights, em):
        st = model.emission_suff_stats(y, jnp.ones(y.shape, bool), weights, emissions=em)
        return model.emission_m_step(em, st, None)

    new = m_step(jnp.asarray(y), weights, em)
    np.testing.assert_allclose(np.asarray(new.covs[0]), 1e-6 * np.eye(2), atol=1e-15)
    np.testing.assert_allclose(np.asarray(new.means[0]), y[0, 0], rtol=1e-14)
    assert np.all(np.linalg.eigvalsh(np.asarray(new.covs[1])) > 0)


# ---------------------------------------------------------------------------------------
# priors, configuration and data checks


def test_conjugate_prior_densities_match_scipy():
    rng = np.random.default_rng(7)
    d, k = 3, 2
    loc, kappa, nu, psi = rng.normal(size=d), 0.7, 5.5, random_cov(rng, d)
    niw = NormalInverseWishart(loc, kappa, nu, psi)
    value = GaussianEmissions(rng.normal(size=(k, d)), np.stack([random_cov(rng, d)
                                                                 for _ in range(k)]))
    got = np.asarray(niw.log_prob(to_jax(value)))
    want = [stats.invwishart(nu, psi).logpdf(value.covs[j])
            + stats.multivariate_normal(loc, value.covs[j] / kappa).logpdf(value.means[j])
            for j in range(k)]
    np.testing.assert_allclose(got, want, rtol=1e-10)
    nig = NormalInverseGamma(loc, kappa, 2.5, 1.5)
    dvalue = DiagonalGaussianEmissions(rng.normal(size=(k, d)), rng.uniform(0.5, 2, (k, d)))
    want = (stats.invgamma(2.5, scale=1.5).logpdf(dvalue.variances)
            + stats.norm(loc, np.sqrt(dvalue.variances / kappa)).logpdf(dvalue.means)).sum(1)
    np.testing.assert_allclose(np.asarray(nig.log_prob(to_jax(dvalue))), want, rtol=1e-10)
    # a node prior (on the whole emissions NamedTuple) is summed by log_prior
    fam = FAMILIES["gaussian-full"]
    params = to_jax(fam.random_params(rng))
    prior = NormalInverseWishart(np.ones(2), 1.0, 10.0, np.eye(2))
    total = ss.log_prior(HMMParams(None, None, prior), params)
    np.testing.assert_allclose(float(total), float(jnp.sum(prior.log_prob(params.emissions))))
    mode = prior.mode()
    np.testing.assert_allclose(np.asarray(mode.covs), np.eye(2) / (10.0 + 2 + 2))
    with pytest.raises(ValueError, match="df"):
        NormalInverseWishart(jnp.zeros(3), 1.0, 1.5, jnp.eye(3))


def test_invalid_configuration_data_and_priors_raise():
    with pytest.raises(ValueError, match="covariance"):
        GaussianHMM(num_states=2, emission_dim=2, covariance="diag")
    with pytest.raises(ValueError, match="min_variance"):
        GaussianHMM(min_variance=-1.0)
    with pytest.raises(ValueError, match="num_lags"):
        LinearAutoregressiveHMM(num_lags=0)
    fam = FAMILIES["bernoulli"]
    params = to_jax(fam.random_params(np.random.default_rng(0)))
    y = np.zeros((3, 5, 3), int)
    with pytest.raises(ValueError, match="binary"):
        ss.log_prob(fam.model, params, y + 2 * (np.arange(3) == 1))
    # a 2 hidden by the mask is fine
    mask = np.ones(y.shape, bool)
    mask[0, 0, 1] = False
    y_bad = y.copy()
    y_bad[0, 0, 1] = 2
    assert np.all(np.isfinite(np.asarray(ss.log_prob(fam.model, params, y_bad, mask=mask))))
    gfam = FAMILIES["gaussian-full"]
    gparams = to_jax(gfam.random_params(np.random.default_rng(0)))
    y_nan = np.zeros((3, 5, 2))
    y_nan[1, 2, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        ss.log_prob(gfam.model, gparams, y_nan, mask=np.ones(y_nan.shape, bool))
    # an AR lag that is missing before an observed step: exact in log_prob (a Gaussian-sum
    # filter, tests/models/test_ar_gaps.py) but EM has no exact E-step for it
    afam = FAMILIES["arhmm"]
    aparams = to_jax(afam.random_params(np.random.default_rng(0)))
    amask = np.ones((3, 5, 2), bool)
    amask[0, 2, 1] = False
    with pytest.raises(ValueError, match="lag"):
        ss.fit_em(afam.model, aparams, np.zeros((3, 5, 2)), mask=amask, num_iters=1,
                  progress=False)
    # non-conjugate emission priors are refused by fit_em
    bad = HMMParams(None, None, GaussianEmissions(dist.Normal(0.0, 1.0), None))
    with pytest.raises(ValueError, match="NormalInverseWishart"):
        gfam.model.validate_em_priors(bad)
    with pytest.raises(ValueError, match="Beta"):
        fam.model.validate_em_priors(HMMParams(None, None, BernoulliEmissions(
            dist.Beta(0.5, 2.0))))
    with pytest.raises(ValueError, match="conjugate"):
        afam.model.validate_em_priors(HMMParams(None, None, NormalInverseWishart(
            jnp.zeros(2), 1.0, 3.0, jnp.eye(2))))


def test_arhmm_step_matches_predict_score_update_and_samples():
    """The fused step equals predict + masked score + update (also in the conditioned
    steps, whose scores the engine then drops), and sampling runs through the lags."""
    fam = FAMILIES["arhmm"]
    model = fam.model
    params = to_jax(fam.random_params(np.random.default_rng(8)))
    _, y, brute_mask = brute_data(fam, np.random.default_rng(8))
    y0 = jnp.asarray(y[0])
    mask = jnp.ones(y0.shape, bool)
    u = jnp.zeros((T_BRUTE, 0))

    def body(carry, xs):
        y_t, m_t, u_t = xs
        lp, new = model.step(params, carry, y_t, m_t, u_t)
        lp_ref = masked_log_prob(model.predict(params, carry, u_t), y_t, m_t)
        return new, (lp, lp_ref)

    _, (lp, lp_ref) = jax.lax.scan(body, model.initial_carry(params), (y0, mask, u))
    np.testing.assert_allclose(np.asarray(lp), np.asarray(lp_ref), rtol=1e-10)
    filt = ss.filter(model, params, y, mask=brute_mask)  # (the compiled brute-force shape)
    assert np.all(np.asarray(filt.log_probs)[:, : model.num_lags] == 0.0)
    draws = ss.sample(model, params, num_timesteps=T_BRUTE, key=jax.random.key(0),
                      num_samples=3)
    assert draws.shape == (3, T_BRUTE, 2) and np.all(np.isfinite(np.asarray(draws)))


@pytest.mark.parametrize("emission_dim", [None, 3])
def test_poisson_log_likelihood_table_equals_the_per_step_path(emission_dim):
    """`PoissonHMM.log_likelihoods` (log y! once per entry) gives the per-step path's
    values (`HMMBase.log_likelihoods`, numpyro's Poisson per step and state) bit for bit,
    with and without missing entries, and scipy's log pmf."""
    from statseq.models.hmm.base import HMMBase

    model = ss.PoissonHMM(num_states=2, emission_dim=emission_dim)
    shape = (30,) if emission_dim is None else (30, emission_dim)
    y = jnp.asarray(np.random.default_rng(3).poisson(4.0, size=shape))
    params = model.initialize(y, key=jax.random.key(0))
    masks = [jnp.ones(30, bool), jnp.ones(30, bool).at[4].set(False)]
    if emission_dim:
        masks.append(jnp.ones(shape, bool).at[7, 1].set(False))
    for mask in masks:
        got = jax.jit(model.log_likelihoods)(params, y, mask)
        want = jax.jit(lambda p, v, m: HMMBase.log_likelihoods(model, p, v, m))(params, y, mask)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    rates = np.asarray(params.emissions.rates).reshape(2, -1)
    ref = stats.poisson(rates[None]).logpmf(np.asarray(y).reshape(30, 1, -1)).sum(-1)
    np.testing.assert_allclose(np.asarray(model.log_likelihoods(params, y, masks[0])), ref,
                               rtol=1e-12)
