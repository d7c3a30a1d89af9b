"""The tensor layer: ``Tensor`` with a reverse-mode autograd tape, on NumPy or CuPy arrays.

    from minidist.tensor import Tensor, no_grad, cross_entropy
    w = Tensor(np.random.randn(10, 784).astype(np.float32), requires_grad=True)
    loss = cross_entropy(x @ w.T, y)        # x: (N, 784) Tensor, y: (N,) int array
    loss.backward()                          # w.grad: a Tensor over the gradient array (in place)

Modules, bottom up: ``grad_mode`` (no_grad), ``core`` (Tensor: array, tape entry, gradient,
Python's operators), ``autograd`` (the backward walk, in-place accumulation,
post-accumulate-grad hooks, end-of-backward callbacks ``queue_callback``), torch's named
methods as plain functions that ``core`` attaches to Tensor: ``methods`` (x.relu(), x.sum(dim=1),
x.view(...)), ``inplace_methods`` (x.add_(), x += y, x.zero_()), ``conversion`` (x.float(),
x.to(), x.item(), x.numpy(), repr); then the ops, each with its backward beside its forward:
``elementwise``, ``reduce``, ``shape`` (also tril/triu, split), ``linalg``, ``functional``
(softmax, dropout, layer_norm, embedding), ``losses`` (cross_entropy, nll_loss, mse_loss),
``attention`` (scaled_dot_product_attention), ``conv`` (conv2d,
max/avg/adaptive pooling), ``sync_norm`` (batch norm with statistics summed by a callable),
``clip_grad`` (clip_grad_norm_), ``weak`` (WeakIdKeyDictionary); torch's ops whose NumPy
namesakes differ: ``indexing`` (gather, take, sort, repeat, maximum, nonzero), ``statistics``
(var and std with n - 1, cumsum, cumprod, prod), ``einsum``, ``nn_ops`` (leaky_relu, normalize,
one_hot, the binary cross-entropies), ``conv_transpose`` (conv_transpose2d), with their method
tables ``torch_methods`` and ``more_methods`` (flip, roll, logsumexp, amax...), ``switches``
(compile, set_float32_matmul_precision, onnx: accepted, changing nothing); ``random``
(manual_seed, initial_seed, seed, Generator); ``creation`` (tensor, zeros, randn, arange,
multinomial, randperm... with torch's default dtypes); ``printing`` (repr and str in torch's
layout); ``dtypes`` (torch's dtype names, bfloat16, the refused legacy constructors);
``inplace`` (add_, mul_, clamp_... with torch's autograd rules); ``mathops`` (sin cos sqrt
abs clamp where norm trace); ``views`` (diagonal, narrow, expand, t). Beside the spine's files,
what they do not teach: ``activations_math`` (tanh sigmoid gelu erf, base ** x),
``casts_copies`` (astype to_device clone masked_fill), ``cross_entropy_paths``
(cross_entropy on a GPU, with class weights, smoothing or probabilities), ``nll_mse_losses``
(nll_loss, mse_loss), ``compat_methods`` (x.size(dim), len, ordering operators),
``autograd_grad`` (autograd.grad), ``inference`` (set_grad_enabled, inference_mode),
``scaled_grad`` (ScaledGradDestination).
See docs/tensor.md for how the tape works and the two contracts DDP relies on.
"""

from __future__ import annotations

import builtins
import sys
import types
from typing import Any


from minidist.tensor.autograd import RemovableHandle, queue_callback
from minidist.tensor.grad_destination import GradDestination
from minidist.tensor.attention import scaled_dot_product_attention
from minidist.tensor.clip_grad import clip_grad_norm_, clip_grad_value_
from minidist.tensor.conv import adaptive_avg_pool2d, avg_pool2d, conv2d, max_pool2d
from minidist.tensor.core import Tensor
from minidist.tensor.creation import (arange, as_tensor, empty, empty_like, from_numpy, full,
                                      full_like, multinomial, ones, ones_like, rand, rand_like,
                                      randint, randn, randn_like, tensor, zeros, zeros_like)
from minidist.tensor.elementwise import erf, exp, gelu, log, masked_fill, relu, sigmoid, tanh
from minidist.tensor.functional import (dropout, dropout2d, embedding, layer_norm, log_softmax,
                                        softmax)
from minidist.tensor.losses import cross_entropy, mse_loss, nll_loss
from minidist.tensor.grad_mode import enable_grad, is_grad_enabled, no_grad
from minidist.tensor.inference import set_grad_enabled
from minidist.tensor.deterministic import (are_deterministic_algorithms_enabled,
                                           is_deterministic_algorithms_warn_only_enabled,
                                           use_deterministic_algorithms)
from minidist.tensor.linalg import linear, matmul
from minidist.tensor.random import default_generator, initial_seed, manual_seed, seed
from minidist.tensor.reduce import max, mean, min, sum, topk  # noqa: A004
from minidist.tensor.sync_norm import sync_batch_norm
from minidist.tensor import dtypes
from minidist.tensor.dtypes import dtype, int8, int16, uint8
from minidist.tensor.mathops import abs, clamp, cos, norm, sin, sqrt, trace, where  # noqa: A004
from minidist.tensor.views import diagonal, narrow
from minidist.tensor.weak import WeakIdKeyDictionary
from minidist.tensor.shape import (cat, chunk, concatenate, flatten, split, stack, swapaxes,
                                   tril, triu)
# torch's functions whose NumPy namesakes differ (indexing.py, statistics.py, einsum.py,
# torch_methods.py), a Generator, inference_mode and the switches that change nothing here
# (switches.py); the package root exports them as minidist.<name>
from minidist.tensor.indexing import (argsort, gather, index_select, maximum, minimum, nonzero,
                                      repeat_interleave, sort, take)
from minidist.tensor.statistics import cumprod, cumsum, prod, std, var
from minidist.tensor.einsum import einsum
from minidist.tensor.creation import randperm
from minidist.tensor.random import Generator
from minidist.tensor.inference import inference_mode
from minidist.tensor.switches import (compile, get_float32_matmul_precision,  # noqa: A004
                                     set_float32_matmul_precision)

__all__ = [
    "Tensor", "WeakIdKeyDictionary", "GradDestination", "RemovableHandle", "queue_callback",
    "no_grad", "enable_grad",
    "is_grad_enabled", "set_grad_enabled",
    "manual_seed", "initial_seed", "seed", "default_generator", "matmul", "linear", "exp", "log",
    "tanh", "sigmoid",
    "relu", "gelu", "erf", "sum", "mean", "max", "min", "cat", "concatenate", "stack",
    "softmax", "log_softmax", "cross_entropy", "nll_loss", "mse_loss", "dropout", "layer_norm",
    "conv2d", "clip_grad_norm_", "clip_grad_value_", "max_pool2d", "avg_pool2d",
    "adaptive_avg_pool2d", "dropout2d", "embedding", "masked_fill",
    "scaled_dot_product_attention", "tril", "triu", "split", "chunk", "transpose", "tensor",
    "from_numpy", "as_tensor", "zeros", "ones", "empty", "full", "rand",
    "randn", "randint", "arange", "zeros_like", "ones_like", "empty_like", "full_like",
    "rand_like", "randn_like", "flatten", "topk", "multinomial", "float16", "float32", "float64",
    "int32", "int64", "bfloat16", "uint8", "int8", "int16", "dtype", "clamp", "cos", "norm",
    "sin", "sqrt", "trace", "where", "diagonal", "narrow", "use_deterministic_algorithms",
    "are_deterministic_algorithms_enabled", "is_deterministic_algorithms_warn_only_enabled",
]

# torch's dtype names (dtypes.py): minidist.float32 == numpy.float32, printed minidist.float32.
# The aliases that shadow builtins (float, double, half, long, bool) are attributes only, not
# star-exported.
float16 = half = dtypes.float16
float32 = float = dtypes.float32  # noqa: A001 - torch's name
float64 = double = dtypes.float64
int32 = dtypes.int32
int64 = long = dtypes.int64
bool = dtypes.bool_  # noqa: A001 - torch's name (minidist.bool)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:  # noqa: A002 - torch's name
    """torch's ``transpose(input, dim0, dim1)``: swap two dims."""
    return swapaxes(input, dim0, dim1)



class _CallablePackage(types.ModuleType):
    """``minidist.tensor`` is this package AND torch's ``tensor(data)`` factory.

    torch spells the factory ``torch.tensor``; here that name is already the package, so the
    package itself is made callable: ``minidist.tensor([1.0])`` calls ``creation.tensor`` while
    ``minidist.tensor.linear`` and ``from minidist.tensor import Tensor`` keep working.
    """

    def __call__(self, data: Any, dtype: Any = None, device: Any = None,
                 requires_grad: builtins.bool = False) -> Tensor:
        return tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


sys.modules[__name__].__class__ = _CallablePackage


def __getattr__(name: str) -> Any:
    """``bfloat16``, made when first asked for: it imports ``ml_dtypes`` (tensor/dtypes.py)."""
    if name == "bfloat16":
        return dtypes.bfloat16
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
