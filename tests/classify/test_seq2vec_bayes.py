"""Bayesian fits (NUTS, SVI) of the seq2vec models: the exact target density, posterior
predictive accuracy, the Bayesian moderation of predictions, and input errors."""

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from numpyro.infer.util import potential_energy
from scipy.stats import norm

import statseq as ss
from statseq.classify.seq2vec_bayes import bayes_target


def _problem(seed, num, noise, lengths=(3, 7)):
    """Two classes of ragged scalar sequences: level -1 (class 0) or +1 (class 1)."""
    rng = np.random.default_rng(seed)
    X = [noise * rng.normal(size=rng.integers(*lengths)) + (1.0 if n % 2 else -1.0)
         for n in range(num)]
    return X, np.array([n % 2 for n in range(num)])


X_TRAIN, Y_TRAIN = _problem(0, 8, noise=0.2)  # separable with a wide gap: where the
X_TEST, Y_TEST = _problem(1, 40, noise=0.5)   # boundary lies in it is uncertain
AMBIGUOUS = [np.full(5, 0.3)]  # between the classes, nearer class 1


def _log_joint_reference(est, target, theta, X, y, per_sequence_log_lik):
    """Independent reference: each sequence alone (no padding) through the plug-in
    estimator, plus the Gaussian prior's density by SciPy."""
    est.params_ = target.params(theta)
    est.posterior_draws_ = None
    log_lik = sum(per_sequence_log_lik(est, x, c) for x, c in zip(X, y, strict=True))
    return log_lik + norm.logpdf(np.asarray(theta), 0.0, target.prior_scale).sum()


def _check_density(est, X, y, per_sequence_log_lik, prior_scale, predictions):
    target = bayes_target(est, X, y, prior_scale=prior_scale)
    theta = 0.7 * jax.random.normal(jax.random.key(3), (target.size,), jnp.float64)
    if per_sequence_log_lik is not None:
        nuts_log_density = -jax.jit(
            lambda th: potential_energy(target.model, target.data, {}, {"theta": th}))(theta)
        ref = _log_joint_reference(est, target, theta, X, y, per_sequence_log_lik)
        np.testing.assert_allclose(float(nuts_log_density), ref, rtol=1e-10, atol=1e-10)
    # with posterior draws, predictions mix the plug-in ones: probabilities and means
    # average, log-densities are log-mean-exp
    thetas = jnp.stack([theta, -0.5 * theta, 0.3 * theta])
    plug_in = []
    for th in thetas:
        est.params_, est.posterior_draws_ = target.params(th), None
        plug_in.append([np.asarray(f(est)) for f, _ in predictions])
    est.posterior_draws_ = jax.vmap(target.params)(thetas)
    for k, (f, combine) in enumerate(predictions):
        each = np.stack([p[k] for p in plug_in])
        expected = (each.mean(0) if combine == "mean"
                    else np.log(np.exp(each).mean(0)))
        np.testing.assert_allclose(np.asarray(f(est)), expected, rtol=1e-12, atol=1e-14)
    return target


def test_log_density_is_sum_of_conditional_log_likelihoods_plus_prior_and_mixtures():
    # bidirectional attention classifier, ragged (lengths 2 and 4)
    rng = np.random.default_rng(5)
    X = [rng.normal(size=(t, 2)) for t in (2, 4, 4, 2, 4)]
    y = ["a", "b", "b", "a", "c"]
    clf = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), bidirectional=True,
                                pooling="attention")

    def clf_lik(est, x, c):
        return est.predict_log_proba([x])[0, list(est.classes_).index(c)]

    target = _check_density(clf, X, y, clf_lik, prior_scale=0.8, predictions=[
        (lambda e: e.predict_proba(X[:1]), "mean"),
        (lambda e: e.predict_log_proba(X[:1]), "log_mean_exp")])
    assert target.size == 2 * (2 * 2 + 2 * 2 + 2) + 4 + 3 * 4 + 3  # 2 RNNs, attention, head

    # Student-t regressor (df > 2 through its bijection): the posterior predictive only
    reg = ss.SequenceRegressor(ss.ElmanRNN(hidden_dim=1), pooling="max", emission="student_t")
    targets = np.array([0.3, -1.2, 2.0, 0.1, 0.5])
    _check_density(reg, X, targets, None, prior_scale=1.5, predictions=[
        (lambda e: e.predict(X[:1]), "mean"),
        (lambda e: e.log_prob(X[:1], targets[:1]), "log_mean_exp")])

    # labeller: every valid step scored, padding never
    labels = [rng.integers(0, 3, len(x)) for x in X]
    lab = ss.SequenceLabeller(ss.ElmanRNN(hidden_dim=2), num_classes=3)

    def lab_lik(est, x, c):
        return est.predict_log_proba([x])[0][np.arange(len(c)), c].sum()

    _check_density(lab, X, labels, lab_lik, prior_scale=1.0, predictions=[
        (lambda e: e.predict_proba(X[:1])[0], "mean")])


PRIOR_SCALE = 3.0  # weak: the MAP is confident, the posterior is broad


@pytest.fixture(scope="module")
def fits():
    def new():
        return ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), pooling="mean")

    opt = optax.adam(0.05)
    nuts = new().fit_bayes(X_TRAIN, Y_TRAIN, method="nuts", key=jax.random.key(0),
                           prior_scale=PRIOR_SCALE, num_warmup=50, num_samples=150,
                           num_chains=1, max_tree_depth=4)
    mode = new().fit_bayes(X_TRAIN, Y_TRAIN, method="svi", guide="delta",
                           key=jax.random.key(0), prior_scale=PRIOR_SCALE, num_steps=300,
                           num_samples=150, optimizer=opt)  # 150 copies of the MAP
    svi = new().fit_bayes(X_TRAIN, Y_TRAIN, method="svi", key=jax.random.key(1),
                          prior_scale=PRIOR_SCALE, num_steps=300, num_samples=150,
                          optimizer=opt)  # as many draws as NUTS: one compiled predictive
    return nuts, mode, svi


def _draw_probs(est, X):
    """``p(c = 1 | x, theta_s)`` per posterior draw, ``(S, N)``."""
    return np.exp(np.asarray(est._predictive(X, None, "log_proba", mix=False)[0]))[..., 1]


def test_posterior_predictive_accuracy_and_outputs(fits):
    nuts, mode, svi = fits
    for est in fits:
        assert est.score(X_TEST, Y_TEST) >= 0.95  # 40 held-out sequences
        np.testing.assert_allclose(est.predict_proba(X_TEST).sum(1), 1.0, atol=1e-12)
    idata = nuts.bayes_result_
    assert idata.posterior["head.weight"].shape == (1, 150, 2, 2)
    assert idata.log_likelihood["y"].shape == (1, 150, 8)
    assert int(idata.sample_stats["diverging"].sum()) <= 5
    assert nuts.posterior_draws_.head.weight.shape == (150, 2, 2)
    assert svi.posterior_draws_.head.weight.shape == (150, 2, 2)
    # the posterior predictive is the mean over draws of the plug-in probabilities
    draws = _draw_probs(nuts, AMBIGUOUS)
    for s in (0, 57):
        point = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2), pooling="mean")
        point.__dict__.update({k: v for k, v in vars(nuts).items() if k.endswith("_")})
        point.posterior_draws_ = None
        point.params_ = jax.tree.map(lambda a, s=s: a[s], nuts.posterior_draws_)
        np.testing.assert_allclose(point.predict_proba(AMBIGUOUS)[:, 1], draws[s],
                                   rtol=1e-12)
    np.testing.assert_allclose(nuts.predict_proba(AMBIGUOUS)[:, 1], draws.mean(0),
                               rtol=1e-12)
    assert svi.loss_trace_[-30:].mean() < svi.loss_trace_[:30].mean()


def test_posterior_predictive_is_less_extreme_than_the_map(fits):
    nuts, mode, svi = fits
    p_map = mode.predict_proba(AMBIGUOUS)[0, 1]
    assert p_map > 0.7  # the MAP (the posterior's mode) is fairly sure of class 1
    for est in (nuts, svi):
        draws = _draw_probs(est, AMBIGUOUS)[:, 0]
        p_bayes = draws.mean()
        # Monte Carlo standard error of the posterior mean, from the draws' effective
        # sample size (NUTS draws are autocorrelated; SVI's are independent)
        ess = float(np.asarray(az.ess(draws[None, :]))) if est is nuts else len(draws)
        mc_se = draws.std() / np.sqrt(ess)
        # averaging over parameter uncertainty pulls the probability towards 1/2 by
        # more than 3 Monte Carlo standard errors, without flipping the decision
        assert (p_map - 0.5) - (p_bayes - 0.5) > 3 * mc_se, (p_map, p_bayes, mc_se)
        assert p_bayes > 0.5


def test_bad_input_gives_clear_errors():
    clf = ss.SequenceClassifier(ss.ElmanRNN(hidden_dim=2))
    with pytest.raises(ValueError, match="not fitted"):
        clf.predict_proba(X_TRAIN)
    with pytest.raises(ValueError, match="method must be one of"):
        clf.fit_bayes(X_TRAIN, Y_TRAIN, method="mcmc", key=jax.random.key(0))
    with pytest.raises(ValueError, match="guide must be one of"):
        clf.fit_bayes(X_TRAIN, Y_TRAIN, method="svi", guide="laplace", key=jax.random.key(0))
    with pytest.raises(ValueError, match="NaN"):
        clf.fit_bayes([np.array([0.0, np.nan]), np.ones(3)], [0, 1], method="nuts",
                      key=jax.random.key(0))
    with pytest.raises(ValueError, match="prior_scale"):
        clf.fit_bayes(X_TRAIN, Y_TRAIN, method="nuts", key=jax.random.key(0), prior_scale=-1)
    with pytest.raises(ValueError, match="num_samples"):
        clf.fit_bayes(X_TRAIN, Y_TRAIN, method="nuts", key=jax.random.key(0), num_samples=0)
    with pytest.raises(TypeError):
        clf.fit_bayes(X_TRAIN, Y_TRAIN, method="nuts", key=0)
    with pytest.raises(ValueError, match="label"):
        ss.SequenceLabeller(ss.ElmanRNN(hidden_dim=2), num_classes=2).fit_bayes(
            [np.zeros(2)], [[0, 2]], method="svi", key=jax.random.key(0))
    assert not hasattr(clf, "params_")
