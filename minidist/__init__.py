"""minidist: distributed data-parallel training written from scratch in Python.

The spine and its wings (minidist/wings.py): each wing attaches to the spine through its seams
when it loads, at the end of this file; ``MINIDIST_WINGS=none`` leaves them all out.

Layers, bottom up (each imports only from the ones below it; tests/test_layers.py holds this
order as ``LAYERS`` and checks this line against it; docs/layout.md draws it): envvars,
user_cache -> xp, logger, version, tracing, backends, wings -> tensor, cuda, kernels -> nn,
optim, comm, accelerator, utils -> fastpath, tcp -> auto -> data, viz, tune -> amp -> ddp ->
watch, memory -> checkpoint -> trainer -> launch, multiprocessing, testing, distributed.
"""

import sys as _sys

# minidist.log and minidist.trace are torch's functions (below); the modules that had those
# names are minidist.logger and minidist.tracing (each registers its old import path).
from minidist import logger, tracing
from minidist import xp
from minidist import cuda
from minidist import accelerator
from minidist.xp import DeviceUnavailableError, device
from minidist.logger import get_logger

# tensor and nn: Tensor + autograd tape, no_grad, layers (minidist/tensor, minidist/nn)
from minidist import nn
from minidist import tensor  # the package, callable as torch's tensor(data, dtype=None, ...)
from minidist.tensor import Tensor, no_grad, is_grad_enabled, manual_seed, initial_seed, seed
from minidist.tensor import enable_grad, set_grad_enabled
# deterministic mode: the same bits on any machine (minidist/tensor/deterministic.py)
from minidist.tensor import (are_deterministic_algorithms_enabled,
                             is_deterministic_algorithms_warn_only_enabled,
                             use_deterministic_algorithms)
from minidist.tensor import (arange, as_tensor, empty, empty_like, from_numpy, full, full_like,
                             ones, ones_like, rand, rand_like, randint, randn, randn_like, zeros,
                             zeros_like)
from minidist.tensor import (double, float32, float64, half, int32, int64,  # torch's dtype names
                             long)
from minidist.tensor import (cat, chunk, flatten, masked_fill, multinomial,  # torch's functions
                             split, stack, topk, transpose, tril, triu)
from minidist.tensor import bool as bool  # noqa: A004,F401 - torch's name (minidist.bool)
from minidist.tensor import float as float  # noqa: A004,F401 - torch's name (minidist.float)
# torch's math functions and dtypes added for ported scripts (minidist/tensor/mathops.py,
# views.py, dtypes.py); minidist.log and minidist.trace are the functions, as torch's
from minidist.tensor import (clamp, cos, diagonal, dtype, exp, int8, int16, log,
                             narrow, norm, sin, softmax, sqrt, trace, uint8, where)
from minidist import tensor as _tensor_package  # minidist.bfloat16: see __getattr__ at the end
from minidist.tensor import abs as abs  # noqa: A004,F401 - torch's name (minidist.abs)
# torch's legacy constructors: isinstance checks and x.type(...) work; calling one raises
# with the modern spelling (minidist.tensor(data, dtype=minidist.int64))
from minidist.tensor.dtypes import (BFloat16Tensor, BoolTensor, ByteTensor, CharTensor,
                                    DoubleTensor, FloatTensor, HalfTensor, IntTensor, LongTensor,
                                    ShortTensor)

# comm: process group and collectives (minidist/comm)
from minidist.comm import (
    CommError,
    CommTimeout,
    ProcessGroup,
    ReduceOp,
    Work,
    all_gather_object,
    barrier,
    broadcast_object,
    destroy_process_group,
    get_local_rank,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
    is_main_process,
    new_group,
    new_group_from_transport,
)

# optim and data: optimizers, LR schedules, clipping; datasets, DistributedSampler, DataLoader
from minidist import data, optim
from minidist.data import DataLoader, DistributedSampler

# ddp: DistributedDataParallel, comm hooks, ZeRO-1, SyncBatchNorm
from minidist import ddp
from minidist.ddp import DistributedDataParallel, SyncBatchNorm
# the array collectives, taking a Tensor too (torch's argument order; minidist/ddp/collectives.py)
from minidist.ddp.collectives import (all_gather, all_gather_into, all_reduce, broadcast, reduce,
                                      reduce_scatter)

from minidist.version import __version__  # noqa: E402

# torch's spelling nn.SyncBatchNorm: the class communicates, so it lives in ddp (above comm),
# and the root, which sees every layer, attaches it to nn (nn itself cannot import ddp).
setattr(nn, "SyncBatchNorm", SyncBatchNorm)  # noqa: B010 - nn declares no such name
# torch.nn.parallel and torch.nn.modules.batchnorm's SyncBatchNorm: nn sits below ddp, so the
# root attaches them (as for nn.SyncBatchNorm).
from minidist.ddp import nn_parallel as _nn_parallel  # noqa: E402

setattr(nn, "parallel", _nn_parallel)  # noqa: B010 - nn declares no such name
_sys.modules["minidist.nn.parallel"] = _nn_parallel
setattr(getattr(nn.modules, "batchnorm"), "SyncBatchNorm", SyncBatchNorm)  # noqa: B009,B010

# torch's functions ported scripts call (minidist/tensor/torch_methods.py and the op modules
# it names): torch's signatures, torch's meaning where NumPy's namesake differs
from minidist.tensor import (Generator, argsort, cumprod, cumsum, einsum, gather,  # noqa: E402
                             get_float32_matmul_precision, index_select, inference_mode,
                             maximum, minimum, nonzero, prod, randperm, repeat_interleave,
                             set_float32_matmul_precision, sort, std, take, var)
from minidist.tensor import compile as compile  # noqa: A004,E402,F401 - torch's name
from minidist.tensor.elementwise import relu, sigmoid, tanh  # noqa: E402
from minidist.tensor.torch_methods import argmax, argmin, mean  # noqa: E402
from minidist.tensor.torch_methods import max as max  # noqa: A004,E402,F401 - torch's names
from minidist.tensor.torch_methods import min as min  # noqa: A004,E402,F401
from minidist.tensor.torch_methods import sum as sum  # noqa: A004,E402,F401
from minidist.tensor.switches import onnx  # noqa: E402 - torch.onnx (also minidist.onnx)
from minidist.tensor.more_methods import (amax, amin, bmm, expm1, flip, log1p,  # noqa: E402
                                          logsumexp, mm, movedim, outer, roll, rsqrt, square,
                                          tile, unbind)
from minidist.tensor.more_methods import diff, lerp, scatter_add  # noqa: E402
from minidist.tensor.indexing import index_add, kthvalue, median, scatter, unique  # noqa: E402

# The wings (minidist/wings.py): each enabled one attaches to the spine through its seams when
# imported here, last, in the same order on every rank; then the root takes the public names
# of those loaded. MINIDIST_WINGS=none: the spine alone, and none of the names below.
from minidist import wings as _wings  # noqa: E402

_loaded = _wings.load()

if "amp" in _loaded:  # mixed precision (autocast, GradScaler, MasterWeights; docs/amp.md)
    from minidist import amp
    from minidist.amp import GradScaler, autocast, float16
    from minidist.amp import cuda_amp as _cuda_amp

    # torch.cuda.amp: cuda sits below amp, so the root attaches it (as for nn.SyncBatchNorm)
    setattr(cuda, "amp", _cuda_amp)  # noqa: B010 - cuda declares no such name
    _sys.modules["minidist.cuda.amp"] = _cuda_amp

if "training" in _loaded:  # Trainer and atomic checkpoints (docs/trainer.md)
    from minidist.checkpoint import (CheckpointError, latest_checkpoint, load, load_checkpoint,
                                     save, save_checkpoint)
    from minidist.checkpoint import safe_globals as serialization  # torch.serialization
    from minidist.trainer import History, Trainer, TrainerConfig

    _sys.modules["minidist.serialization"] = serialization

if "memory" in _loaded:  # ZeRO-1, activation checkpointing, the memory report (docs/memory.md)
    from minidist import utils
    from minidist.memory.zero import ZeroRedundancyOptimizer

    setattr(ddp, "ZeroRedundancyOptimizer", ZeroRedundancyOptimizer)  # noqa: B010 - its path

    # torch.utils.data: utils sits below data, so the root names data there too, as an
    # attribute and as an importable module path (``from minidist.utils.data import ...``)
    setattr(utils, "data", data)  # noqa: B010 - utils declares no such name
    _sys.modules["minidist.utils.data"] = data
    _sys.modules["minidist.utils.data.distributed"] = data.distributed

if "torch" in _loaded:  # torch's namespaces by their paths: torch.distributed (a package with
    # torch's sub-paths and argument orders), torch.backends (flags), torch.multiprocessing
    from minidist import backends, distributed, multiprocessing
    from minidist.distributed.queries import get_backend


def __getattr__(name: str) -> object:
    """``minidist.bfloat16``, made when first asked for: it imports ``ml_dtypes``, which takes
    longer than NumPy's own import, so ``import minidist`` leaves it out (tensor/dtypes.py)."""
    if name == "bfloat16":
        return _tensor_package.bfloat16
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
