#!/usr/bin/env python
"""Generative sequence classifier: statseq against hmmlearn per-class models.

    python benchmarks/bench_classify.py           # prints a table (about 1-3 min on 2 cores)
    python benchmarks/bench_classify.py --quick   # fewer sequences and repeats
    python benchmarks/bench_classify.py --vowels  # JapaneseVowels: HMMs vs 1-NN DTW

``--vowels`` (issue 19, point 7) runs the real data set instead: the 270/370 train/test
split of JapaneseVowels (9 speakers, 12 coefficients, lengths 7-29), with three classifiers:
statseq's generative classifier (one diagonal-covariance Gaussian HMM per speaker, EM from
``model.initialize``, then optionally MMI), hmmlearn's per-class ``GaussianHMM`` (diagonal,
same number of states and EM iterations, its own k-means start), and the 1-nearest-neighbour
DTW classifier, the standard baseline of the UEA/UCR archives: tslearn's
``KNeighborsTimeSeriesClassifier(n_neighbors=1, metric="dtw")`` and a small batched NumPy
DTW written here (squared Euclidean frame cost, no window), whose test distances must equal
tslearn's (the largest difference is printed). Training and prediction wall times and test
accuracy are printed; ``first`` includes compilation (statseq, numba in tslearn).

Both sides fit one Gaussian HMM (K states, full covariances) per class by EM with the same
number of iterations (no tolerance stop: hmmlearn ``tol=0``, statseq ``tol=None``) from the
same starting parameters, on the same simulated sequences (equal lengths: statseq's EM on
ragged sequences padded with masked steps takes another, slower path to the same fixed
points, see RESULTS.md), in float64, and score
the held-out sequences by Bayes' rule with class-frequency priors. The class posteriors of
the two must agree (the largest absolute difference is printed) so that a wrong answer is
never timed. hmmlearn's ``score`` is called once per sequence and class, as its users write
per-class classifiers. ``first``: wall time of the first call in this process (statseq's
includes JAX compilation; the persistent compilation cache is off). ``steady``: median of
the repeats. Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings

os.environ["STATSEQ_NO_COMPILATION_CACHE"] = "1"

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from hmmlearn import hmm as hl  # noqa: E402

import statseq as ss  # noqa: E402
from statseq.classify import GenerativeClassifier  # noqa: E402


def class_laws(num_classes, K, D, seed=0):
    """Per-class HMM laws (means, transition matrix), fixed for training and test data."""
    rng = np.random.default_rng(seed)
    laws = []
    for c in range(num_classes):
        means = rng.normal(scale=1.0, size=(K, D)) + 0.5 * c
        A = rng.dirichlet(np.full(K, 1.0) + 5 * np.eye(K)[c % K], size=K)
        laws.append((means, A))
    return laws


def simulate(laws, num_per_class, seed):
    rng = np.random.default_rng(seed)
    X, y = [], []
    for c, (means, A) in enumerate(laws):
        K = len(A)
        for _ in range(num_per_class):
            T = 100  # equal lengths: see the note on ragged EM in RESULTS.md
            z = np.zeros(T, int)
            for t in range(1, T):
                z[t] = rng.choice(K, p=A[z[t - 1]])
            X.append(means[z] + rng.normal(size=means[z].shape))
            y.append(c)
    return X, np.array(y)


def start_params(K, D, X, seed):
    rng = np.random.default_rng(seed)
    allx = np.concatenate(X)
    off = 0.2 / (K - 1)
    return ss.HMMParams(initial_probs=np.full(K, 1.0 / K),
                        transitions=np.full((K, K), off) + (0.8 - off) * np.eye(K),
                        emissions=ss.models.hmm.GaussianEmissions(
                            means=allx[rng.choice(len(allx), K, replace=False)],
                            covs=np.broadcast_to(np.cov(allx.T), (K, D, D)).copy()))


def hmmlearn_classifier(X, y, p0, K, iters):
    models, priors = [], []
    for c in np.unique(y):
        Xc = [x for x, lab in zip(X, y, strict=True) if lab == c]
        m = hl.GaussianHMM(n_components=K, covariance_type="full", n_iter=iters, tol=0.0,
                           init_params="", params="stmc", min_covar=1e-6,
                           covars_prior=0.0)  # the plain ML M-step, as statseq's
        m.startprob_ = np.asarray(p0.initial_probs)
        m.transmat_ = np.asarray(p0.transitions)
        m.means_ = np.asarray(p0.emissions.means)
        m.covars_ = np.asarray(p0.emissions.covs)
        m.fit(np.concatenate(Xc), [len(x) for x in Xc])
        models.append(m)
        priors.append(len(Xc) / len(y))
    return models, np.log(priors)


def hmmlearn_proba(models, log_prior, X):
    ll = np.array([[m.score(x) for m in models] for x in X]) + log_prior
    ll -= ll.max(1, keepdims=True)
    p = np.exp(ll)
    return p / p.sum(1, keepdims=True)


def timed(fn, repeats):
    """(result, first wall, median steady wall, median steady CPU of this process)."""
    t = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t
    steady, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        steady.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return out, first, statistics.median(steady), statistics.median(cpu)


def dtw_distances(A, B, chunk=64):
    """``(len(A), len(B))`` DTW distances between ragged multivariate sequences (NumPy).

    ``D[i, j] = ||a_i - b_j||^2 + min(D[i-1, j], D[i, j-1], D[i-1, j-1])``, for a chunk of
    ``A`` against all of ``B`` at once (padded to the longest lengths; a pair's distance is
    read at its own end, which the padding after it never reaches), and the square root of
    the end value, as tslearn's ``dtw``.
    """
    lb = np.array([len(b) for b in B])
    tb, d = lb.max(), B[0].shape[1]
    pb = np.zeros((len(B), tb, d))
    for j, b in enumerate(B):
        pb[j, :len(b)] = b
    out = np.empty((len(A), len(B)))
    for start in range(0, len(A), chunk):
        part = A[start:start + chunk]
        la = np.array([len(a) for a in part])
        pa = np.zeros((len(part), la.max(), d))
        for i, a in enumerate(part):
            pa[i, :len(a)] = a
        cost = ((pa ** 2).sum(-1)[:, None, :, None] + (pb ** 2).sum(-1)[None, :, None, :]
                - 2 * np.einsum("aid,bjd->abij", pa, pb))
        cost = np.maximum(cost, 0.0)
        prev = np.full((len(part), len(B), tb + 1), np.inf)
        prev[:, :, 0] = 0.0
        for i in range(1, la.max() + 1):
            row = np.full_like(prev, np.inf)
            for j in range(1, tb + 1):
                row[:, :, j] = cost[:, :, i - 1, j - 1] + np.minimum(
                    np.minimum(prev[:, :, j], row[:, :, j - 1]), prev[:, :, j - 1])
            prev = row
            done = la == i
            out[start:start + len(part)][done] = row[done][:, np.arange(len(B)), lb]
    return np.sqrt(out)


def vowels(repeats, num_states=5, iters=30, mmi_steps=200):
    """JapaneseVowels: generative HMM classifiers (statseq, hmmlearn) vs 1-NN DTW."""
    X, y = ss.datasets.load_japanese_vowels("train", return_X_y=True)
    Xt, yt = ss.datasets.load_japanese_vowels("test", return_X_y=True)
    rows = []

    def report(name, fit, predict):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, fit_first, fit_steady, _ = timed(fit, repeats)
            pred, pred_first, pred_steady, _ = timed(lambda: predict(model), repeats)
        rows.append((name, fit_first, fit_steady, pred_first, pred_steady,
                     np.mean(np.asarray(pred) == yt)))
        return model, pred

    hmm = ss.GaussianHMM(num_states=num_states, emission_dim=12, covariance="diagonal")
    report(f"statseq GenerativeClassifier, diagonal HMM K={num_states}, {iters} EM iters",
           lambda: GenerativeClassifier(hmm, fit_options={"num_iters": iters}).fit(X, y),
           lambda m: m.predict(Xt))
    report(f"statseq, same + {mmi_steps} MMI steps",
           lambda: GenerativeClassifier(hmm, fit_options={"num_iters": iters},
                                        mmi_steps=mmi_steps).fit(X, y),
           lambda m: m.predict(Xt))

    def hl_fit():
        models, priors = [], []
        for c in np.unique(y):
            Xc = [x for x, lab in zip(X, y, strict=True) if lab == c]
            m = hl.GaussianHMM(n_components=num_states, covariance_type="diag", n_iter=iters,
                               tol=0.0, random_state=0)
            m.fit(np.concatenate(Xc), [len(x) for x in Xc])
            models.append(m)
            priors.append(len(Xc) / len(y))
        return models, np.log(priors)

    report(f"hmmlearn GaussianHMM per class, diag K={num_states}, {iters} EM iters", hl_fit,
           lambda m: np.unique(y)[hmmlearn_proba(*m, Xt).argmax(1)])
    from tslearn.neighbors import KNeighborsTimeSeriesClassifier
    from tslearn.utils import to_time_series_dataset

    _, tsl_pred = report(
        "tslearn 1-NN DTW", lambda: KNeighborsTimeSeriesClassifier(
            n_neighbors=1, metric="dtw").fit(to_time_series_dataset(X), y),
        lambda m: m.predict(to_time_series_dataset(Xt)))
    _, np_pred = report("NumPy 1-NN DTW (this script)", lambda: (X, y),
                        lambda m: m[1][dtw_distances(Xt, m[0]).argmin(1)])
    from tslearn.metrics import cdist_dtw

    sub = slice(0, 40)
    diff = np.abs(dtw_distances(Xt[sub], X) - cdist_dtw(to_time_series_dataset(Xt[sub]),
                                                         to_time_series_dataset(X))).max()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}; jax {jax.__version__}")
    print(f"JapaneseVowels: {len(X)} training, {len(Xt)} test sequences; NumPy vs tslearn "
          f"DTW distances (40 test x 270 train): max |difference| = {diff:.1e}; 1-NN "
          f"predictions identical: {bool(np.all(np.asarray(tsl_pred) == np.asarray(np_pred)))}")
    print("| classifier | fit first (s) | fit steady (s) | predict first (s) | "
          "predict steady (s) | test accuracy |")
    print("|---|---|---|---|---|---|")
    for name, f1, fs, p1, ps, acc in rows:
        print(f"| {name} | {f1:.2f} | {fs:.2f} | {p1:.2f} | {ps:.3f} | {acc:.3f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vowels", action="store_true")
    args = ap.parse_args()
    if args.vowels:
        vowels(1 if args.quick else 2)
        return
    n, repeats = (10, 2) if args.quick else (40, 3)
    K, D, C, iters = 3, 2, 3, 20
    laws = class_laws(C, K, D)
    X, y = simulate(laws, n, 0)
    Xt, yt = simulate(laws, n, 1)
    p0 = start_params(K, D, X, 2)
    model = ss.GaussianHMM(num_states=K, emission_dim=D, covariance="full", min_variance=0.0)
    clf = GenerativeClassifier(model, init_params=p0,
                               fit_options={"num_iters": iters, "tol": None})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, ss_fit_first, ss_fit, ss_fit_cpu = timed(lambda: clf.fit(X, y), repeats)
        (hl_models, hl_prior), hl_fit_first, hl_fit, hl_fit_cpu = timed(
            lambda: hmmlearn_classifier(X, y, p0, K, iters), repeats)
    p_ss, ss_pred_first, ss_pred, ss_pred_cpu = timed(lambda: clf.predict_proba(Xt), repeats)
    p_hl, hl_pred_first, hl_pred, hl_pred_cpu = timed(
        lambda: hmmlearn_proba(hl_models, hl_prior, Xt), repeats)
    # scoring is exact: hmmlearn models holding statseq's fitted parameters
    same = []
    for p in clf.params_:
        m = hl.GaussianHMM(n_components=K, covariance_type="full", init_params="", params="")
        m.startprob_, m.transmat_ = np.asarray(p.initial_probs), np.asarray(p.transitions)
        m.means_, m.covars_ = np.asarray(p.emissions.means), np.asarray(p.emissions.covs)
        same.append(m)
    ll_ref = np.array([[m.score(x) for m in same] for x in Xt])
    ll_fit_hl = np.array([[m.score(x) for m in hl_models] for x in Xt])
    ll_ss = clf.log_likelihoods(Xt)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}; jax {jax.__version__}")
    print(f"{C} classes x {n} training and {n} test sequences, T = 100, D={D}, "
          f"K={K}, {iters} EM iterations from the same start")
    print(f"scoring, same parameters: max |ll_statseq - ll_hmmlearn| = "
          f"{np.abs(ll_ss - ll_ref).max():.1e}")
    print(f"fits: max |ll difference| of the two fitted models = "
          f"{np.abs(ll_ss - ll_fit_hl).max():.1e}, max |p difference| = "
          f"{np.abs(p_ss - p_hl).max():.1e}; test accuracy statseq "
          f"{np.mean(p_ss.argmax(1) == yt):.3f}, hmmlearn {np.mean(p_hl.argmax(1) == yt):.3f}")
    print("| step | statseq first (s) | statseq steady wall / CPU (s) | hmmlearn first (s) | "
          "hmmlearn steady wall / CPU (s) |")
    print("|---|---|---|---|---|")
    print(f"| fit (per-class EM) | {ss_fit_first:.2f} | {ss_fit:.3f} / {ss_fit_cpu:.3f} | "
          f"{hl_fit_first:.2f} | {hl_fit:.3f} / {hl_fit_cpu:.3f} |")
    print(f"| predict_proba ({len(Xt)} sequences) | {ss_pred_first:.2f} | {ss_pred:.4f} / "
          f"{ss_pred_cpu:.4f} | {hl_pred_first:.3f} | {hl_pred:.4f} / {hl_pred_cpu:.4f} |")


if __name__ == "__main__":
    main()
