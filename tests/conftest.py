"""Shared test set-up: one BLAS thread per process, `tests/` importable (procs.py helpers),
the library's bytecode compiled once, and the `group` fixture: a single-process (local)
process group for one test."""

import compileall
import os
import sys

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_k, "1")

sys.path.insert(0, os.path.dirname(__file__))

# The suite starts many Python processes (ranks, launchers, example scripts). Where
# PYTHONDONTWRITEBYTECODE is set, as on many CI images, none of them saves the bytecode it
# compiles, so each one compiles every minidist module it imports again, and the tests that
# start processes spend much of their time doing so. Compiled once here, into the usual
# __pycache__ folders (git-ignored), every process just loads it.
from procs import REPO  # noqa: E402

for _d in ("minidist", "tests"):
    compileall.compile_dir(REPO / _d, quiet=2)  # (read-only checkout: nothing written or said)


import pytest  # noqa: E402


@pytest.fixture
def group():
    """A size-1 ``local`` process group for the test (left alone if one is already running)."""
    from minidist import comm

    started = not comm.is_initialized()
    if started:
        comm.init_process_group(backend="local")
    yield
    if started:
        comm.destroy_process_group()


@pytest.fixture
def port():
    """A free port on 127.0.0.1, reserved for the whole test (procs.reserved_ports): no other
    program can take it between the pick and the job's bind."""
    from procs import reserved_ports

    with reserved_ports() as p:
        yield p


# "auto" reads a calibration from the user's cache (python -m minidist.tune); the suite must
# see the shipped table only, whatever this machine's cache holds (jobs inherit os.environ).
if "MINIDIST_CACHE_DIR" not in os.environ:
    import tempfile  # noqa: E402

    os.environ["MINIDIST_CACHE_DIR"] = tempfile.mkdtemp(prefix="minidist-test-cache-")
