"""Shared test set-up: one BLAS thread per process, `tests/` importable (procs.py helpers)."""

import os
import sys

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_k, "1")

sys.path.insert(0, os.path.dirname(__file__))
