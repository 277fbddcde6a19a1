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
from statseq.models.neural.mlstm import MLSTM, MLSTMBackbone
from statseq.models.neural.rnn import GRU, LSTM, ElmanRNN, readout_only
from statseq.models.neural.rwkv import RWKV, RWKVBackbone
from statseq.models.neural.s4 import S4D, S4DBackbone
from statseq.models.neural.s5 import S5, S5Backbone
from statseq.models.neural.seq2seq import (
    EncoderDecoder,
    EncoderDecoderCarry,
    EncoderDecoderParams,
    IdentityBackbone,
)
from statseq.models.neural.transformer import Transformer, TransformerBackbone
from statseq.models.neural.wavenet import WaveNet, WaveNetBackbone

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
    "MLSTM",
    "MLSTMBackbone",
    "RWKV",
    "RWKVBackbone",

    "S4D",
    "S4DBackbone",
    "S5",
    "S5Backbone",
    "Backbone",
    "ElmanRNN",
    "Head",
    "NeuralCarry",
    "NeuralParams",
    "NeuralSequenceModel",
    "make_head",
    "readout_only",
    "WaveNet",
    "WaveNetBackbone",
    "Transformer",
    "TransformerBackbone",
    "EncoderDecoder",
    "EncoderDecoderCarry",
    "EncoderDecoderParams",
    "IdentityBackbone",
]
