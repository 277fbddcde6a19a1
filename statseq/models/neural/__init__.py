"""Neural sequence models: recurrent backbones with emission heads, on the filter protocol."""

from statseq.models.neural.aft import AFT, AFTBackbone
from statseq.models.neural.base import (
    Backbone,
    NeuralCarry,
    NeuralParams,
    NeuralSequenceModel,
)
from statseq.models.neural.heads import EMISSIONS, Head, make_head
from statseq.models.neural.linear_attention import LinearAttention, LinearAttentionBackbone
from statseq.models.neural.lru import LRU, LRUBackbone
from statseq.models.neural.mamba import Mamba, MambaBackbone
from statseq.models.neural.rnn import GRU, LSTM, ElmanRNN, readout_only

__all__ = [
    "AFT",
    "AFTBackbone",
    "LinearAttention",
    "LinearAttentionBackbone",
    "EMISSIONS",
    "GRU",
    "LSTM",
    "LRU",
    "LRUBackbone",
    "Mamba",
    "MambaBackbone",
    "Backbone",
    "ElmanRNN",
    "Head",
    "NeuralCarry",
    "NeuralParams",
    "NeuralSequenceModel",
    "make_head",
    "readout_only",
]
