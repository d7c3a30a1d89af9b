"""The CUDA kernels also compile to sm_90 PTX with numba-cuda-mlir (numba-cuda's maintained
successor), without a GPU: ptx_mlir_rank.py in its own process. Skipped unless
numba-cuda-mlir and NVRTC (``pip install 'numba-cuda-mlir[cu13]'``) are installed."""

import subprocess
import sys

import pytest

from procs import REPO, job_env

pytest.importorskip("numba_cuda_mlir")


def test_every_kernel_compiles_to_sm90_ptx_with_numba_cuda_mlir():
    res = subprocess.run([sys.executable, str(REPO / "tests" / "cuda" / "ptx_mlir_rank.py")],
                         cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    if res.returncode == 0 and out.startswith("SKIP"):
        pytest.skip(out.strip())
    assert res.returncode == 0 and out.count("ok ") == 7, out[-4000:]
