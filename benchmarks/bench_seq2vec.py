"""Aligned labelling on one footing: `SequenceLabeller` vs an HMM's posterior marginals.

Data: a 2-state Gaussian HMM (sticky transitions 0.9, means -1 / +1, unit variance); the
states are the labels, the observations the inputs. The generative answer is the HMM's
smoothed marginals ``p(z_t | x_{1:T})`` at the *true* parameters (the Bayes-optimal
labeller, a floor for the log loss); the discriminative answers are `SequenceLabeller`s
(GRU, causal and bidirectional). All are scored by `labelling_log_loss` /
`labelling_accuracy` on held-out sequences. Also times a `SequenceClassifier` fit.

Run: ``python benchmarks/bench_seq2vec.py`` (``STATSEQ_SMOKE=1`` for a fast mode).
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import statseq as ss  # noqa: E402
from statseq.classify import labelling_accuracy, labelling_log_loss  # noqa: E402
from statseq.models.hmm.gaussian import GaussianEmissions, GaussianHMM  # noqa: E402

SMOKE = os.environ.get("STATSEQ_SMOKE") == "1"


def simulate(rng, num, stay=0.9, lo=15, hi=30):
    xs, zs = [], []
    for _ in range(num):
        t = rng.integers(lo, hi)
        z = np.empty(t, int)
        z[0] = rng.integers(2)
        for i in range(1, t):
            z[i] = z[i - 1] if rng.random() < stay else 1 - z[i - 1]
        xs.append(np.where(z == 1, 1.0, -1.0) + rng.normal(size=t))
        zs.append(z)
    return xs, zs


def main():
    rng = np.random.default_rng(0)
    x_tr, z_tr = simulate(rng, 40 if SMOKE else 200)
    x_te, z_te = simulate(rng, 40 if SMOKE else 200)

    model = GaussianHMM(num_states=2, emission_dim=1)
    params = model.assemble_params(
        GaussianEmissions(jnp.array([[-1.0], [1.0]]), jnp.ones((2, 1, 1))),
        transitions=jnp.array([[0.9, 0.1], [0.1, 0.9]]), initial_probs=jnp.array([0.5, 0.5]))
    hmm_lp = [np.log(np.asarray(model.smoother(params, x[:, None]).smoothed_probs))
              for x in x_te]
    print(f"HMM smoother (true params): log loss {labelling_log_loss(hmm_lp, z_te):.4f}, "
          f"accuracy {labelling_accuracy(hmm_lp, z_te):.4f}")
    steps = 100 if SMOKE else 600
    for bidirectional in (False, True):
        lab = ss.SequenceLabeller(ss.GRU(hidden_dim=8), bidirectional=bidirectional,
                                  num_steps=steps, batch_size=32, learning_rate=0.02)
        t0 = time.perf_counter()
        lab.fit(x_tr, z_tr)
        dt = time.perf_counter() - t0
        print(f"SequenceLabeller GRU(8) bidirectional={bidirectional}: log loss "
              f"{lab.log_loss(x_te, z_te):.4f}, accuracy {lab.score(x_te, z_te):.4f} "
              f"(fit {steps} steps incl. compile {dt:.1f} s)")
    y_tr = [int(z.mean() > 0.5) for z in z_tr]
    y_te = [int(z.mean() > 0.5) for z in z_te]
    for pooling in ("last", "mean", "max", "attention"):
        clf = ss.SequenceClassifier(ss.GRU(hidden_dim=8), bidirectional=True, pooling=pooling,
                                    num_steps=steps, learning_rate=0.02)
        t0 = time.perf_counter()
        clf.fit(x_tr, y_tr)
        dt = time.perf_counter() - t0
        print(f"SequenceClassifier (majority state) bi-GRU(8) pooling={pooling}: accuracy "
              f"{clf.score(x_te, y_te):.3f}, log loss {clf.log_loss(x_te, y_te):.4f} "
              f"(fit incl. compile {dt:.1f} s)")


if __name__ == "__main__":
    main()
