#!/usr/bin/env python
"""Per-seed anatomy of bench_restarts.py's optima (the diagnostic behind RESULTS.md).

    python benchmarks/diag_restarts_optima.py 300 20 anti3    # T, seeds, problem

For each seed: the gap of ``fit_restarts``'s default route to the best known optimum (the
best of the default route, 30 starts with key ``10_000 + seed`` and 1000 EM iterations,
and EM from the true parameters), how many of the 30 reference starts and of the 20
default starts end within 0.5 nats of it, and the narrowest state (variance, as a
fraction of the data's, and expected occupancy) of the best optimum and of the route's.
statseq only; no peers.
"""

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402
import numpy as np  # noqa: E402
from bench_restarts import PROBLEMS, params_from, simulate, statseq_model  # noqa: E402


def narrowest(model, params, y):
    occ = np.asarray(model.smoother(params, y).smoothed_probs).sum(0)
    v = np.asarray(params.emissions.covs).ravel()
    j = int(np.argmin(v))
    return f"min var {v[j]:.4f} (x{v[j] / np.var(y):.3f} data var, occupancy {occ[j]:.1f})"


def main():
    jax.config.update("jax_enable_x64", True)
    import statseq as ss

    num_timesteps, num_seeds, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    cfg = PROBLEMS[name]
    model = statseq_model(cfg)
    k = len(cfg["A"])
    warnings.simplefilter("ignore")
    for seed in range(num_seeds):
        y = simulate(cfg, seed, num_timesteps)
        ours = ss.fit_restarts(model, y, key=jax.random.key(seed))
        many = ss.fit_restarts(model, y, key=jax.random.key(10_000 + seed), num_restarts=30,
                               num_iters=1000)
        truth = (np.full(k, 1 / k), cfg["A"], np.asarray(cfg["means"])[:, None],
                 cfg["sd"] ** 2 * np.ones((k, 1, 1)))
        ft = ss.fit_em(model, params_from(model, y, *truth), y, num_iters=1000,
                       progress=False)
        cands = [(ours.best.final_log_joint, ours.best.params),
                 (many.best.final_log_joint, many.best.params), (ft.final_log_joint, ft.params)]
        best, best_params = max(cands, key=lambda c: c[0])
        print(f"seed {seed:2d} gap {best - ours.best.final_log_joint:6.3f}  "
              f"ref hits {np.sum(many.final_log_joints > best - 0.5)}/30 "
              f"ours hits {np.sum(ours.final_log_joints > best - 0.5)}/20 | "
              f"best: {narrowest(model, best_params, y)} | "
              f"ours: {narrowest(model, ours.best.params, y)}", flush=True)


if __name__ == "__main__":
    main()
