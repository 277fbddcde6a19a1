"""Shared models and data of the exact-diffuse filter and smoother tests.

The log air passengers and a local level (or level plus a 12-month dummy seasonal) with
fixed state variances and an observation variance ``R = obs_var`` that the tests send to 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import statseq as ss

LEVEL_VAR = 1e-3
SEASONAL_VAR = 1e-4


def log_air():
    """The log air passengers (144 monthly values)."""
    return np.log(ss.datasets.load_air_passengers().to_numpy().astype(float))


def structural_arrays(kind, obs_var):
    """Local level, or level plus a 12-month dummy seasonal, with ``R = obs_var``."""
    if kind == "level":
        model, params = ss.LocalLevel(), ss.LocalLevelParams(1.0, LEVEL_VAR)
    else:
        model = ss.StructuralModel((ss.Trend(), ss.Seasonal(12)))
        params = ss.StructuralParams(1.0, (ss.TrendParams(level_var=LEVEL_VAR),
                                           ss.SeasonalParams(SEASONAL_VAR)))
    arr = jax.jit(model.to_arrays)(params)
    return arr._replace(emission_cov=jnp.full((1, 1), obs_var))
