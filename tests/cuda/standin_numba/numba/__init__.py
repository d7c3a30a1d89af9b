"""A stand-in for Numba that imports like the real one but cannot compile anything.

Put ``tests/cuda/standin_numba`` first on PYTHONPATH and ``import numba`` finds this package:
decorators work, every compiled function raises AttributeError when it is first called, as
numba-cuda 0.30.4 does under NumPy 2.5 (``np.row_stack`` is gone). The tests use it to check
that minidist then trains to the end on its reference kernels with exactly one warning.
"""

import types

__version__ = "0.0+standin"
config = types.SimpleNamespace(ENABLE_CUDASIM=0, NUMBA_NUM_THREADS=1)
prange = range

ERROR = "module 'numpy' has no attribute 'row_stack' (stand-in numba: nothing compiles)"


def get_num_threads():
    return 1


def set_num_threads(n):
    pass


class Uncompilable:
    """A "compiled" function: typing it (the first call, or a launch) raises."""

    def __init__(self, fn, options):
        self.py_func, self.targetoptions = fn, options

    def __getitem__(self, launch_config):  # CUDA kernels: kernel[blocks, threads, stream]
        return self

    def __call__(self, *args, **kwargs):
        raise AttributeError(ERROR)


def njit(*args, **options):
    if args and callable(args[0]):
        return Uncompilable(args[0], options)
    return lambda fn: Uncompilable(fn, options)


jit = njit
