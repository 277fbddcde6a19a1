"""GenerativeClassifier: Bayes' rule against hmmlearn per-class models, MMI gradient and
monotonicity, scikit-learn conventions, bad input, plots."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest

import statseq as ss
from statseq.classify import (
    GenerativeClassifier,
    plot_confusion_matrix,
    plot_reliability_diagram,
    plot_sequence_uncertainty,
)

hmmlearn_hmm = pytest.importorskip("hmmlearn.hmm")

NUM_SYMBOLS = 3


def _categorical_data(seed, per_class=6):
    """Ragged symbol sequences of two classes (different emission laws), string labels."""
    rng = np.random.default_rng(seed)
    X, labels = [], []
    for label, probs in (("calm", [0.6, 0.3, 0.1]), ("busy", [0.15, 0.25, 0.6])):
        for n in range(per_class):
            # T = 9 in each half of every class: the folds of a 2-fold cross-validation have
            # the fixture's shapes, so they reuse its compiled programs
            T = 9 if n % 6 == 0 else int(rng.integers(4, 10))
            X.append(rng.choice(NUM_SYMBOLS, size=T, p=probs))
            labels.append(label)
    return X, np.array(labels)


def _fit_quietly(clf, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # boundary notes of tiny EM fits
        return clf.fit(X, y)


@pytest.fixture(scope="module")
def categorical():
    X, y = _categorical_data(0)
    model = ss.CategoricalHMM(num_states=2, num_classes=NUM_SYMBOLS)
    clf = GenerativeClassifier(model, fit_options={"num_iters": 8}, class_prior=[0.3, 0.7])
    return _fit_quietly(clf, X, y), X, y


def _hmmlearn_categorical(params):
    m = hmmlearn_hmm.CategoricalHMM(n_components=2, n_features=NUM_SYMBOLS, init_params="",
                                    params="")
    m.startprob_ = np.asarray(params.initial_probs)
    m.transmat_ = np.asarray(params.transitions)
    m.emissionprob_ = np.asarray(params.emissions.probs)
    return m


def _softmax(a):
    a = a - a.max(1, keepdims=True)
    return np.exp(a) / np.exp(a).sum(1, keepdims=True)


def test_categorical_posterior_equals_bayes_rule_with_hmmlearn(categorical):
    clf, X, y = categorical
    assert clf.classes_.tolist() == ["busy", "calm"]
    refs = [_hmmlearn_categorical(p) for p in clf.params_]
    ll = np.array([[r.score(x.reshape(-1, 1)) for r in refs] for x in X])
    np.testing.assert_allclose(clf.log_likelihoods(X), ll, rtol=0, atol=1e-8)
    expected = _softmax(ll + np.log([0.3, 0.7]))  # the given class priors
    np.testing.assert_allclose(clf.predict_proba(X), expected, rtol=0, atol=1e-8)
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(X)), expected, atol=1e-8)
    assert clf.predict(X).tolist() == clf.classes_[expected.argmax(1)].tolist()
    codes = (y == "calm").astype(int)  # classes_ = ["busy", "calm"]
    log_loss = -np.mean(np.log(expected[np.arange(len(y)), codes]))
    assert clf.log_loss(X, y) == pytest.approx(log_loss, abs=1e-10)
    assert clf.score(X, y) == pytest.approx(np.mean(expected.argmax(1) == codes))
    assert clf.score(X, y) > 0.7  # distinguishable classes


def test_gaussian_ragged_posterior_equals_hmmlearn_and_missing_values():
    rng = np.random.default_rng(1)
    X = [rng.normal(size=(int(rng.integers(3, 7)), 2)) + 1.5 * (n >= 3) for n in range(6)]
    model = ss.GaussianHMM(num_states=2, emission_dim=2, covariance="full")
    params = []
    for shift in (0.0, 1.5):  # given (not fitted) parameters: no EM program to compile
        A = rng.dirichlet([4.0, 1.0], size=2)
        L = np.tril(rng.normal(size=(2, 2, 2)), -1) * 0.3 + np.eye(2)
        params.append(ss.HMMParams(
            initial_probs=rng.dirichlet([1.0, 1.0]), transitions=A,
            emissions=ss.models.hmm.GaussianEmissions(means=shift + rng.normal(size=(2, 2)),
                                                      covs=L @ np.swapaxes(L, -1, -2))))
    clf = GenerativeClassifier.from_params(model, params, [0, 1], class_prior=[0.4, 0.6])
    refs = []
    for p in clf.params_:
        m = hmmlearn_hmm.GaussianHMM(n_components=2, covariance_type="full", init_params="",
                                     params="")
        m.startprob_ = np.asarray(p.initial_probs)
        m.transmat_ = np.asarray(p.transitions)
        m.means_ = np.asarray(p.emissions.means)
        m.covars_ = np.asarray(p.emissions.covs)
        refs.append(m)
    ll = np.array([[r.score(x) for r in refs] for x in X])
    np.testing.assert_allclose(clf.log_likelihoods(X), ll, rtol=0, atol=1e-8)
    np.testing.assert_allclose(clf.predict_proba(X), _softmax(ll + np.log([0.4, 0.6])),
                               atol=1e-8)
    # missing data: a NaN last step is the sequence without it (exact marginalization);
    # a NaN entry equals the same entry masked (one batch shape: one compiled program)
    gaps = [x.copy() for x in X]
    gaps[0][-1] = np.nan
    gaps[1][1, 0] = np.nan
    got = clf.log_likelihoods(gaps)
    np.testing.assert_allclose(got[0], [r.score(X[0][:-1]) for r in refs], atol=1e-8)
    np.testing.assert_allclose(got[2:], ll[2:], atol=1e-8)
    assert np.all(got[1] > ll[1])  # one fewer value to explain: a larger density here
    masks = [np.ones(x.shape, bool) for x in X]
    masks[0][-1] = False
    masks[1][1, 0] = False
    np.testing.assert_allclose(clf.log_likelihoods(X, mask=masks), got, atol=1e-10)
    masks[0] = np.arange(len(X[0])) < len(X[0]) - 1  # a per-step mask for one sequence
    np.testing.assert_allclose(clf.log_likelihoods(X, mask=masks), got, atol=1e-10)


def test_posterior_draws_give_the_posterior_predictive_average():
    """method="nuts" scores a class by log mean_s p(y | theta_s), not a plug-in."""
    model = ss.AR(order=1)
    base = model.default_params()
    phis = np.array([[0.2, 0.5, 0.8], [-0.7, -0.3, 0.1]])  # 3 draws per class
    stacked = jax.tree.map(lambda a: np.broadcast_to(a, (3,) + np.shape(a)), base)
    draws = [stacked._replace(coeffs=np.broadcast_to(phi[:, None, None, None],
                                                     (3,) + np.shape(base.coeffs)))
             for phi in phis]
    X = np.array([[0.5, 0.9, 0.6, 0.7], [1.0, -0.8, 0.5, -0.3], [0.1, 0.2, -0.1, 0.0]])
    clf = GenerativeClassifier.from_params(model, draws, ["up", "down"], draws=True)
    got = clf.log_likelihoods(X)
    for c in range(2):  # (3 draws, 3 sequences): one batched call per draw
        per_draw = np.array([ss.log_prob(model, jax.tree.map(lambda a, s=s: a[s], draws[c]), X)
                             for s in range(3)])
        expected = np.log(np.mean(np.exp(per_draw), axis=0))
        np.testing.assert_allclose(got[:, c], expected, rtol=0, atol=1e-10)
        assert np.all(got[:, c] < per_draw.max(0) - 1e-3)  # an average, not the best draw
    assert clf.predict(X[:1]).tolist() == ["up"]


def test_mmi_gradient_matches_finite_differences(categorical):
    clf, X, y = categorical
    objective, x0 = clf.mmi_objective(X, y)
    value = float(objective(x0))
    # at the per-class fits, the objective is sum_n log p(c_n | y_n) = -N * log loss
    assert value == pytest.approx(-len(y) * clf.log_loss(X, y), abs=1e-9)
    grad = np.asarray(jax.jit(jax.grad(objective))(x0))
    assert np.all(np.isfinite(grad)) and np.linalg.norm(grad) > 1e-3
    rng = np.random.default_rng(2)
    h = 1e-5
    for _ in range(3):
        d = rng.normal(size=x0.shape)
        fd = (float(objective(x0 + h * d)) - float(objective(x0 - h * d))) / (2 * h)
        assert fd == pytest.approx(float(grad @ d), rel=1e-6, abs=1e-8)


def test_mmi_does_not_lower_the_conditional_likelihood(categorical):
    clf, X, y = categorical
    start = -len(y) * clf.log_loss(X, y)
    mmi = _fit_quietly(ss.classify.GenerativeClassifier(**{**clf.get_params(deep=False),
                                                           "mmi_steps": 15,
                                                           "mmi_learning_rate": 0.05}), X, y)
    r = mmi.mmi_
    assert r.objective.shape == (16,)
    assert r.start == pytest.approx(start, abs=1e-8)  # started from the per-class fits
    assert r.best >= r.start and r.best > r.start + 0.1  # improved, and by a real margin
    assert r.best == pytest.approx(r.objective[r.best_step])
    assert -len(y) * mmi.log_loss(X, y) == pytest.approx(r.best, abs=1e-8)  # returned = best
    assert r.num_nonfinite == 0
    assert r.converged == (r.grad_norm <= mmi.mmi_tol)
    assert "step budget" in ss.classify.describe_mmi(r) or r.converged


def test_sklearn_clone_cross_val_and_deep_params():
    sklearn_base = pytest.importorskip("sklearn.base")
    from sklearn.model_selection import cross_val_score

    X, y = _categorical_data(3, per_class=6)
    model = ss.CategoricalHMM(num_states=2, num_classes=NUM_SYMBOLS)
    clf = GenerativeClassifier(model, fit_options={"num_iters": 4}, random_state=1)
    twin = sklearn_base.clone(clf)
    assert twin is not clf and twin.get_params(deep=False) == clf.get_params(deep=False)
    assert sklearn_base.is_classifier(clf)
    deep = clf.get_params(deep=True)
    assert deep["model__num_states"] == 2 and deep["method"] == "auto"
    twin.set_params(model__num_states=3, mmi_steps=2)
    assert twin.model == ss.CategoricalHMM(num_states=3, num_classes=NUM_SYMBOLS)
    assert clf.model.num_states == 2  # the original untouched
    with pytest.raises(ValueError, match="invalid parameter"):
        twin.set_params(bogus=1)
    with pytest.raises(ValueError, match="no field"):
        twin.set_params(model__bogus=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        scores = cross_val_score(clf, X, y, cv=2)
    assert scores.shape == (2,) and np.all((scores >= 0) & (scores <= 1))
    assert np.mean(scores) > 0.5
    # a grid over a deep parameter (the model's field) and a plain one; refit=False and
    # the folds' shapes as above: no new compiled program
    from sklearn.model_selection import GridSearchCV

    grid = GridSearchCV(clf, {"model__num_states": [2], "class_prior": [None, [0.5, 0.5]]},
                        cv=2, refit=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        grid.fit(X, y)
    np.testing.assert_allclose(grid.cv_results_["mean_test_score"][0], np.mean(scores))


@pytest.fixture(scope="module")
def tiny():
    return GenerativeClassifier(ss.CategoricalHMM(num_states=2, num_classes=NUM_SYMBOLS))


@pytest.mark.parametrize("labels, error, match", [
    ([0, 1, 0, 2.5], ValueError, "non-integer"),
    ([0, 1, np.nan, 1], ValueError, "NaN"),
    ([0, 1, 0], ValueError, "4 sequences but y holds 3"),
    (["a", "b", "a", "z"], ValueError, "not one of the classes"),  # classes=["a", "b"]
    (["a", "b", "a", "a"], ValueError, "no training sequence"),  # classes=["a", "b", "c"]
    ([0, 0, 0, 0], ValueError, "at least two classes"),
])
def test_bad_labels_are_clear_errors(tiny, labels, error, match):
    X = [np.array([0, 1, 2]), np.array([1, 1]), np.array([2, 0, 1]), np.array([0])]
    clf = tiny
    if "not one of" in match:
        clf = GenerativeClassifier(tiny.model, classes=["a", "b"])
    elif "no training" in match:
        clf = GenerativeClassifier(tiny.model, classes=["a", "b", "c"])
    with pytest.raises(error, match=match):
        clf.fit(X, labels)


def test_bad_sequences_are_clear_errors(categorical, tiny):
    with pytest.raises(ValueError, match="holds no sequences"):
        tiny.fit([], [0])
    with pytest.raises(ValueError, match="holds no labels"):
        tiny.fit([np.array([0, 1])], [])
    with pytest.raises(ValueError, match="sequence 1 of X is empty"):
        tiny.fit([np.array([0, 1]), np.array([], int)], [0, 1])
    with pytest.raises(TypeError, match="numeric"):
        tiny.fit([np.array(["a", "b"]), np.array([0])], [0, 1])
    with pytest.raises(ValueError, match="not fitted"):
        tiny.predict([np.array([0, 1])])
    clf, X, y = categorical
    with pytest.raises(ValueError, match="not one of the classes"):
        clf.score(X, np.where(y == "calm", "stormy", y))  # a label the classifier never saw
    with pytest.raises(ValueError, match="match one to one"):
        clf.log_loss(X, y[:-1])
    with pytest.raises(ValueError, match="class_prior"):
        GenerativeClassifier(tiny.model, class_prior=[0.5, 0.6]).fit(X, y)
    with pytest.raises(ValueError, match="method"):
        GenerativeClassifier(tiny.model, method="newton").fit(X, y)
    with pytest.raises(ValueError, match="point estimates"):
        GenerativeClassifier(tiny.model, method="nuts", mmi_steps=3).fit(X, y)


def test_plots_return_figures(categorical):
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    clf, X, y = categorical
    proba = clf.predict_proba(X)
    figs = [plot_confusion_matrix(y, clf.predict(X), clf.classes_, normalize=True),
            plot_reliability_diagram(y, proba, clf.classes_, num_bins=5),
            plot_sequence_uncertainty(y, proba, clf.classes_, measure="entropy"),
            plot_sequence_uncertainty(y, proba, clf.classes_)]
    assert all(isinstance(f, Figure) for f in figs)
    m = ss.classify.plots.confusion_matrix(y, clf.predict(X), clf.classes_)
    assert m.sum() == len(y) and np.trace(m) / len(y) == pytest.approx(clf.score(X, y))
    conf, acc, counts, _ = ss.classify.plots.reliability_curve(y, proba, clf.classes_,
                                                               num_bins=5)
    assert counts.sum() == len(y)
    with pytest.raises(ValueError, match="measure"):
        plot_sequence_uncertainty(y, proba, clf.classes_, measure="variance")
    for f in figs:
        plt.close(f)
