"""Small instances of every model family, with valid data and parameters, for the fuzz suite.

Each `Spec` names a model, its observation kind (what valid data look like), a valid
series ``y`` of ``T = 8`` steps and parameters from the model's own initializer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

import statseq as ss

T = 8


@dataclasses.dataclass
class Spec:
    name: str
    model: Any
    kind: str  # "real", "count", "category", "binary"
    y: np.ndarray
    params: Any = None

    @property
    def event_shape(self):
        return tuple(self.model.event_shape)

    @property
    def has_em(self) -> bool:
        return hasattr(self.model, "e_step") and hasattr(self.model, "m_step")

    @property
    def has_smoother(self) -> bool:
        return hasattr(self.model, "smoother")


def _real(shape, seed=0):
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.normal(size=shape), axis=0) * 0.3 + rng.normal(size=shape)


def _specs():
    rng = np.random.default_rng(1)
    scalar = _real((T,))
    vector = _real((T, 2))
    counts = rng.poisson(3.0, size=T)
    cats = rng.integers(0, 3, size=T)
    binary = (rng.random((T, 2)) < 0.4).astype(int)
    return [
        Spec("ar", ss.AR(order=1), "real", scalar),
        Spec("gaussian_hmm", ss.GaussianHMM(num_states=2, emission_dim=2), "real", vector),
        Spec("poisson_hmm", ss.PoissonHMM(num_states=2), "count", counts),
        Spec("categorical_hmm", ss.CategoricalHMM(num_states=2, num_classes=3), "category",
             cats),
        Spec("bernoulli_hmm", ss.BernoulliHMM(num_states=2, emission_dim=2), "binary", binary),
        Spec("ar_hmm", ss.LinearAutoregressiveHMM(num_states=2, emission_dim=2), "real",
             vector),
        Spec("lgssm", ss.LinearGaussianSSM(state_dim=1, emission_dim=None), "real", scalar),
        Spec("local_level", ss.LocalLevel(), "real", scalar),
        Spec("local_linear_trend", ss.LocalLinearTrend(), "real", scalar),
        Spec("elman", ss.ElmanRNN(hidden_dim=3), "real", scalar),
        Spec("gru", ss.GRU(hidden_dim=3), "real", scalar),
        Spec("lstm", ss.LSTM(hidden_dim=3), "real", scalar),
        Spec("mamba", ss.Mamba(hidden_dim=4, state_dim=2), "real", scalar),
        Spec("lru", ss.LRU(hidden_dim=4, state_dim=2), "real", scalar),
    ]


def build_specs():
    """The specs with parameters (from each model's ``initialize``)."""
    specs = _specs()
    for spec in specs:
        spec.params = spec.model.initialize(spec.y, key=jax.random.key(0))
    return specs
