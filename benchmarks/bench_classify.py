#!/usr/bin/env python
"""Generative sequence classifier: statseq against hmmlearn per-class models.

    python benchmarks/bench_classify.py           # prints a table (about 1-3 min on 2 cores)
    python benchmarks/bench_classify.py --quick   # fewer sequences and repeats

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
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
