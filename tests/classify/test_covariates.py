"""GenerativeClassifier with covariates: Bayes' rule given u (exact), an input-driven class
difference that only the covariate classifier sees, the MMI gradient with covariates
against finite differences, and clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import logsumexp

import statseq as ss
from statseq.classify import GenerativeClassifier
from statseq.models.hmm.base import HMMParams, TransitionRegression
from statseq.models.hmm.gaussian import GaussianEmissions


def _arx_data(seed, per_class, *, gain=0.5, noise=1.0):
    """Ragged ARX sequences y_t = 0.5 y_{t-1} + b_c u_t + noise: the classes differ only in
    the sign of the response b_c = +-gain to the covariate u_t ~ N(0, 1). Without u both
    classes are the same AR(1) law."""
    rng = np.random.default_rng(seed)
    X, U, labels = [], [], []
    for label, b in (("up", gain), ("down", -gain)):
        for _ in range(per_class):
            T = int(rng.integers(12, 17))
            u = rng.normal(size=(T, 1))
            y, prev = np.zeros(T), 0.0
            for t in range(T):
                prev = 0.5 * prev + b * u[t, 0] + noise * rng.normal()
                y[t] = prev
            X.append(y)
            U.append(u)
            labels.append(label)
    return X, U, np.array(labels)


def _hmm_params(sign):
    """An input-driven two-state Gaussian HMM; ``sign`` flips its emission means and the
    response of its transitions to u."""
    trans = TransitionRegression(
        weights=jnp.array([[[0.0], [1.5 * sign]], [[-1.0 * sign], [0.0]]]),
        bias=jnp.array([[1.0, -1.0], [-0.5, 0.5]]))
    em = GaussianEmissions(means=sign * jnp.array([[-1.0], [1.0]]),
                           covs=jnp.stack([jnp.eye(1) * 0.7, jnp.eye(1) * 1.3]))
    return HMMParams(jnp.array([0.6, 0.4]), trans, em)


def test_posterior_given_covariates_is_bayes_rule_over_class_log_probs():
    """predict_log_proba = log_softmax_c(log p(y_n | u_n, theta_c) + log pi_c), each term
    from statseq.log_prob on the sequence alone (ragged, one missing observation)."""
    model = ss.GaussianHMM(num_states=2, emission_dim=1, input_dim=1)
    params = [_hmm_params(1.0), _hmm_params(-1.0)]
    prior = np.array([0.35, 0.65])
    clf = GenerativeClassifier.from_params(model, params, ["a", "b"], class_prior=prior)
    rng = np.random.default_rng(3)
    lengths = [5, 7, 5, 7]
    X = [rng.normal(size=(T, 1)) for T in lengths]
    X[1][2, 0] = np.nan  # a missing observation; its covariate is still given
    U = [rng.normal(size=(T, 1)) for T in lengths]
    got = clf.predict_log_proba(X, inputs=U)
    ref = np.array([[float(ss.log_prob(model, p, np.nan_to_num(x), mask=np.isfinite(x[:, 0]),
                                       inputs=u)) for p in params]
                    for x, u in zip(X, U, strict=True)])
    ref = ref + np.log(prior)
    ref = ref - np.asarray(logsumexp(ref, axis=1, keepdims=True))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    # the covariates matter: other inputs give other posteriors
    other = clf.predict_log_proba(X, inputs=[-u for u in U])
    assert np.max(np.abs(other - got)) > 0.1


@pytest.fixture(scope="module")
def arx_fits():
    X, U, c = _arx_data(0, 8)
    cov = GenerativeClassifier(ss.AR(order=1, input_dim=1)).fit(X, c, inputs=U)
    # the classifier that does not see u: the same ARX fitted with u = 0, which is exactly
    # an AR(1) with intercept (the input weight drops out of every likelihood), fitted by
    # the same route and compiled program
    blind = GenerativeClassifier(ss.AR(order=1, input_dim=1)).fit(
        X, c, inputs=[np.zeros_like(u) for u in U])
    return cov, blind


def test_input_driven_classes_are_separated_only_with_covariates(arx_fits):
    """The classes differ only in how y responds to u: the ARX classifier separates them on
    new data, the classifier blind to u is at chance (both classes are one AR(1) law
    without u)."""
    cov, blind = arx_fits
    Xt, Ut, ct = _arx_data(1, 12)
    zeros = [np.zeros_like(u) for u in Ut]
    assert cov.method_ == "lbfgs"
    # each class's fit recovers its response to u (the true b_c = +-0.5)
    weights = {label: float(p.input_weights[0, 0]) for label, p in
               zip(cov.classes_, cov.params_, strict=True)}
    assert weights["up"] > 0.25 and weights["down"] < -0.25
    assert cov.score(Xt, ct, inputs=Ut) >= 0.95
    assert cov.log_loss(Xt, ct, inputs=Ut) < 0.2
    assert blind.score(Xt, ct, inputs=zeros) <= 0.75
    assert blind.log_loss(Xt, ct, inputs=zeros) > 0.6


def test_mmi_gradient_with_covariates_matches_finite_differences():
    model = ss.AR(order=1, input_dim=1)
    p0 = model.default_params()
    params = [p0._replace(coeffs=jnp.full_like(p0.coeffs, 0.4),
                          input_weights=jnp.full_like(p0.input_weights, w),
                          cov=jnp.full_like(p0.cov, v)) for w, v in ((0.3, 1.1), (-0.2, 0.8))]
    clf = GenerativeClassifier.from_params(model, params, [0, 1], class_prior=[0.4, 0.6])
    X, U, c = _arx_data(2, 2, gain=0.3)
    codes = (c == "down").astype(int)
    objective, x0 = clf.mmi_objective(X, codes, inputs=U)
    value_and_grad = jax.jit(jax.value_and_grad(objective))  # one program for both
    value, grad = value_and_grad(x0)
    # the objective at the start is sum_n log p(c_n | y_n, u_n)
    np.testing.assert_allclose(float(value), -len(X) * clf.log_loss(X, codes, inputs=U),
                               rtol=1e-12)
    eps = 1e-6
    f = lambda x: float(value_and_grad(x)[0])  # noqa: E731
    fd = np.array([(f(x0 + eps * e) - f(x0 - eps * e)) / (2 * eps) for e in np.eye(x0.size)])
    np.testing.assert_allclose(np.asarray(grad), fd, rtol=1e-6, atol=1e-8)
    assert np.max(np.abs(grad)) > 1e-3  # not a trivial zero
    # it is the value given these covariates, not others
    assert abs(float(value) + len(X) * clf.log_loss(X, codes, inputs=[-u for u in U])) > 1e-3


def test_covariate_errors_are_clear():
    X, U, c = _arx_data(4, 2)
    arx = ss.AR(order=1, input_dim=1)
    with pytest.raises(ValueError, match="takes no covariates"):
        GenerativeClassifier(ss.AR(order=1)).fit(X, c, inputs=U)
    with pytest.raises(ValueError, match="takes covariates .input_dim=1.: pass inputs="):
        GenerativeClassifier(arx).fit(X, c)
    with pytest.raises(ValueError, match="inputs hold 3 sequences but X holds 4"):
        GenerativeClassifier(arx).fit(X, c, inputs=U[:3])
    short = [U[0][:-1]] + U[1:]
    with pytest.raises(ValueError, match=r"inputs of sequence 0 have \d+ time steps but the "
                                         r"sequence has \d+"):
        GenerativeClassifier(arx).fit(X, c, inputs=short)
    wide = [np.hstack([u, u]) for u in U]
    with pytest.raises(ValueError, match=r"must have shape \(T_n, 1\)"):
        GenerativeClassifier(arx).fit(X, c, inputs=wide)
    holed = [u.copy() for u in U]
    holed[2][1, 0] = np.nan
    with pytest.raises(ValueError, match="inputs of sequence 2 hold NaN"):
        GenerativeClassifier(arx).fit(X, c, inputs=holed)
    with pytest.raises(TypeError, match="must be real numbers"):
        GenerativeClassifier(arx).fit(X, c, inputs=[u.astype(str) for u in U])
    # the same checks at prediction time, on a fitted classifier
    p = arx.default_params()
    clf = GenerativeClassifier.from_params(arx, [p, p], ["down", "up"])
    with pytest.raises(ValueError, match="takes covariates"):
        clf.predict_proba(X)
    with pytest.raises(ValueError, match="inputs of sequence 2 hold NaN"):
        clf.predict(X, inputs=holed)
    with pytest.raises(ValueError, match="takes no covariates"):
        GenerativeClassifier.from_params(ss.AR(order=1), [ss.AR(order=1).default_params()] * 2,
                                         [0, 1]).predict_proba(X, inputs=U)
