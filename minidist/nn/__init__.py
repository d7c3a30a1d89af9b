"""Neural-network building blocks with torch's names: Module, Parameter, layers, losses, init.

    import minidist
    from minidist import nn
    minidist.manual_seed(0)                      # same seed -> same weights on every rank
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10))
    loss = nn.CrossEntropyLoss()(model(x), y)
    loss.backward()
    model.state_dict().keys()                    # '0.weight', '0.bias', '2.weight', '2.bias'

Modules: ``module`` (Module, Parameter, state_dict; ``module_devices``: to, cuda, half, ...),
``layers`` (Linear, ReLU, Dropout, Flatten, Identity, Sequential), ``activations`` (GELU,
Tanh, Sigmoid, LeakyReLU, Softmax, LogSoftmax), ``norm_dropout_embedding`` (LayerNorm,
Dropout2d, Embedding), ``containers`` (ModuleList, ModuleDict), ``conv`` (Conv2d,
ConvTranspose2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d), ``attention``
(MultiheadAttention), ``norm`` (BatchNorm1d/2d, GroupNorm), ``rnn`` (RNN, LSTM, GRU),
``transformer`` (TransformerEncoderLayer, TransformerEncoder, TransformerDecoderLayer,
TransformerDecoder, Transformer), ``losses`` (CrossEntropyLoss, MSELoss), ``nll_bce_losses``
(NLLLoss, BCELoss, BCEWithLogitsLoss), ``init``, ``functional``, ``utils`` (clip_grad_norm_),
``modules`` (torch's nn.modules.<file> paths).
``nn.SyncBatchNorm`` is attached by the package root: it communicates, so it lives in
``minidist/ddp/sync_batchnorm.py``, above comm.
"""

from __future__ import annotations

from minidist.nn import functional, init, utils
from minidist.nn.attention import MultiheadAttention
from minidist.nn.conv import AdaptiveAvgPool2d, AvgPool2d, Conv2d, ConvTranspose2d, MaxPool2d
from minidist.nn.layers import (GELU, Dropout, Dropout2d, Embedding, Flatten, Identity,
                                LayerNorm, LeakyReLU, Linear, LogSoftmax, ModuleDict, ModuleList,
                                ReLU, Sequential, Sigmoid, Softmax, Tanh)
from minidist.nn.losses import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, MSELoss,
                               NLLLoss)
from minidist.nn.norm import BatchNorm1d, BatchNorm2d, GroupNorm
from minidist.nn.rnn import GRU, LSTM, RNN, RNNBase
from minidist.nn.transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer,
                                     TransformerEncoder, TransformerEncoderLayer)
from minidist.nn.module import IncompatibleKeys, Module, Parameter, StateDictError
from minidist.tensor import manual_seed
from minidist.nn import modules  # torch's nn.modules.<file>.<Class> paths (after the classes)

__all__ = [
    "Module", "Parameter", "StateDictError", "IncompatibleKeys", "Linear", "Conv2d", "MaxPool2d",
    "Flatten", "ReLU", "GELU", "Tanh", "Sigmoid", "Identity", "Dropout", "LayerNorm",
    "Sequential", "CrossEntropyLoss", "MSELoss", "manual_seed", "init", "functional", "utils",
    "ModuleList", "ModuleDict", "Softmax", "LogSoftmax", "NLLLoss", "Embedding", "BatchNorm1d",
    "BatchNorm2d", "Dropout2d", "AvgPool2d", "AdaptiveAvgPool2d", "MultiheadAttention",
    "GroupNorm", "RNNBase", "RNN", "LSTM", "GRU", "TransformerEncoderLayer", "TransformerEncoder",
    "TransformerDecoderLayer", "TransformerDecoder", "Transformer", "LeakyReLU",
    "ConvTranspose2d", "BCELoss", "BCEWithLogitsLoss",
]
