"""torch's ``torch.nn.modules.<file>.<Class>`` paths, for code and allow-lists that name them.

    import minidist.nn.modules.linear
    with minidist.serialization.safe_globals([nn.modules.linear.Linear]):
        model = minidist.load("model.pt")
    sd = nn.modules.utils.consume_prefix_in_state_dict_if_present(state_dict, "module.")

torch keeps each layer in a file of ``torch/nn/modules/`` (``linear.py``, ``conv.py``, ...) and
scripts, allow-lists and pickles name them by that path. Here the same classes live in
``minidist/nn/layers.py``, ``conv.py``, ...; this module makes one namespace per torch file
holding the same class objects (``nn.modules.linear.Linear is nn.Linear``), each importable
by its dotted name.
"""

from __future__ import annotations

import sys
import types
from collections import OrderedDict
from typing import Any

from minidist.nn import attention, conv, layers, losses, module, norm, rnn, transformer

# torch's file under torch/nn/modules/ -> the classes it holds that minidist has
_TORCH_FILES: dict[str, list[Any]] = {
    "module": [module.Module],
    "linear": [layers.Linear, layers.Identity],
    "activation": [layers.ReLU, layers.GELU, layers.Tanh, layers.Sigmoid, layers.Softmax,
                   layers.LogSoftmax, layers.LeakyReLU, attention.MultiheadAttention],
    "container": [layers.Sequential, layers.ModuleList, layers.ModuleDict],
    "conv": [conv.Conv2d, conv.ConvTranspose2d],
    "pooling": [conv.MaxPool2d, conv.AvgPool2d, conv.AdaptiveAvgPool2d],
    "dropout": [layers.Dropout, layers.Dropout2d],
    "sparse": [layers.Embedding],
    "flatten": [layers.Flatten],
    "normalization": [layers.LayerNorm, norm.GroupNorm],
    "batchnorm": [norm.BatchNorm1d, norm.BatchNorm2d],
    "loss": [losses.CrossEntropyLoss, losses.MSELoss, losses.NLLLoss, losses.BCELoss,
             losses.BCEWithLogitsLoss],
    "rnn": [rnn.RNNBase, rnn.RNN, rnn.LSTM, rnn.GRU],
    "transformer": [transformer.TransformerEncoderLayer, transformer.TransformerEncoder,
                    transformer.TransformerDecoderLayer, transformer.TransformerDecoder,
                    transformer.Transformer],
}

def consume_prefix_in_state_dict_if_present(state_dict: dict[str, Any], prefix: str) -> None:
    """torch's helper: strip ``prefix`` (``"module."``) from every key that has it, in place.

    For a DistributedDataParallel's state dict loaded into a bare model."""
    keys = list(state_dict)
    for key in keys:
        if key.startswith(prefix):
            state_dict[key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if isinstance(metadata, OrderedDict):
        for key in list(metadata):
            if key.startswith(prefix.rstrip(".")):
                metadata[key[len(prefix):]] = metadata.pop(key)


def _namespace(file: str, members: dict[str, Any]) -> types.ModuleType:
    ns = types.ModuleType(f"{__name__}.{file}", f"torch.nn.modules.{file}'s names")
    ns.__dict__.update(members)
    sys.modules[ns.__name__] = ns
    setattr(sys.modules[__name__], file, ns)
    return ns


for _file, _classes in _TORCH_FILES.items():
    _namespace(_file, {c.__name__: c for c in _classes})
_namespace("utils", {"consume_prefix_in_state_dict_if_present":
                     consume_prefix_in_state_dict_if_present})
globals().update({c.__name__: c for cs in _TORCH_FILES.values() for c in cs})
