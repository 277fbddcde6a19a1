#!/usr/bin/env python
"""How often the old rule ("highest log-likelihood wins") chose a spurious fit.

    python benchmarks/diag_spurious_choice.py 300 20 anti3,rare2    # T, seeds, problems

For each seed: ``fit_restarts`` with every default but ``exclude_spurious=False`` (the rule
before 2026-11-26), and whether its chosen fit is spurious by `statseq.spurious_states`
(occupancy and variance ratio of the flagged state); then the default
(``exclude_spurious=True``) and the gap between the two. statseq only.
"""

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402
import numpy as np  # noqa: E402
from bench_restarts import PROBLEMS, simulate, statseq_model  # noqa: E402


def main():
    jax.config.update("jax_enable_x64", True)
    import statseq as ss

    num_timesteps, num_seeds = int(sys.argv[1]), int(sys.argv[2])
    warnings.simplefilter("ignore")
    for name in sys.argv[3].split(","):
        model = statseq_model(PROBLEMS[name])
        chosen_spurious = 0
        for seed in range(num_seeds):
            y = simulate(PROBLEMS[name], seed, num_timesteps)
            old = ss.fit_restarts(model, y, key=jax.random.key(seed), exclude_spurious=False)
            new = ss.fit_restarts(model, y, key=jax.random.key(seed))
            check = ss.spurious_states(model, old.best.params, y)
            bad = check is not None and check.any
            chosen_spurious += bad
            detail = ""
            if bad:
                j = int(np.argmax(check.spurious))
                detail = (f"state {j}: occupancy {check.occupancy[j]:.2f}, variance "
                          f"{check.variance_ratio[j]:.2e} of the data's")
            print(f"{name} seed {seed:2d}: old rule {old.best.final_log_joint:.3f} "
                  f"spurious {bad} {detail} | default {new.best.final_log_joint:.3f} "
                  f"(gap {old.best.final_log_joint - new.best.final_log_joint:.3f}); "
                  f"spurious starts {int(new.spurious.sum())}/{len(new.spurious)}",
                  flush=True)
        print(f"{name}: old rule chose a spurious fit on {chosen_spurious}/{num_seeds} seeds")


if __name__ == "__main__":
    main()
