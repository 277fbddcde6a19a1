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
    #: entry points that do not apply, ``{entry: reason}`` (explicit exclusions)
    excluded: dict = dataclasses.field(default_factory=dict)

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


#: SwitchingLDS has no data-driven initializer (its parameters come from `default_params`
#: or a hand-built `SLDSParams`): the entry points that start from ``initialize`` do not
#: apply. Its fits go through the generic gradient fits (`fit_sgd`, `fit_lbfgs`).
SLDS_EXCLUDED = {
    "initialize": "no data-driven initializer (use default_params)",
    "fit_restarts": "restarts draw their starts from initialize",
}

#: Models outside the tables, with the reason.
#: ``NGram`` is a NumPy model with its own ``fit``/``log_probs``/``sample`` (not a JAX filter
#: taking ``params`` through `statseq.log_prob`): its bad-input cases are in
#: ``test_bad_inputs.py::test_ngram_*`` instead.
NOT_IN_THE_TABLES = {"NGram": "NumPy model with its own fit/log_probs/sample entry points"}


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
        # issue 15 backbones: one layer, tiny widths
        Spec("s4d", ss.S4D(hidden_dim=2, state_dim=2, num_layers=1), "real", scalar),
        Spec("s5", ss.S5(hidden_dim=2, state_dim=2, num_layers=1), "real", scalar),
        Spec("linear_attention", ss.LinearAttention(hidden_dim=2, num_heads=1, num_layers=1),
             "real", scalar),
        Spec("aft", ss.AFT(hidden_dim=2, num_layers=1), "real", scalar),
        Spec("rwkv", ss.RWKV(hidden_dim=2, num_layers=1, ffn_dim=2), "real", scalar),
        Spec("mlstm", ss.MLSTM(hidden_dim=2, num_layers=1, num_heads=1, expand=1), "real",
             scalar),
        Spec("wavenet", ss.WaveNet(hidden_dim=2, num_layers=1), "real", scalar),
        Spec("transformer", ss.Transformer(hidden_dim=2, num_layers=1, num_heads=1, max_len=4,
                                           mlp_ratio=1), "real", scalar),
        Spec("encoder_decoder", ss.EncoderDecoder(encoder=ss.ElmanRNN(hidden_dim=2)), "real",
             scalar),
        Spec("ngrc", ss.NGRC(num_lags=2, degree=2), "real", scalar),
        Spec("slds", ss.SwitchingLDS(num_regimes=2, state_dim=1, emission_dim=None), "real",
             scalar, excluded=SLDS_EXCLUDED),
    ]


def build_specs():
    """The specs with parameters (from each model's ``initialize``)."""
    specs = _specs()
    for spec in specs:
        if "initialize" in spec.excluded:
            spec.params = spec.model.default_params()
        else:
            spec.params = spec.model.initialize(spec.y, key=jax.random.key(0))
    return specs
