"""The fused optimizer and CUDA-IPC kernels in Numba's CUDA simulator, in a process of its own
(NUMBA_ENABLE_CUDASIM is read when numba is imported; this process has the real numba)."""

import subprocess
import sys

from procs import REPO, job_env


def test_training_kernels_in_the_simulator():
    body = REPO / "tests" / "cuda" / "train_kernels_cudasim_rank.py"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", str(body)],
        env=job_env({"NUMBA_ENABLE_CUDASIM": "1"}), cwd=REPO, capture_output=True, text=True,
        timeout=180)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert " passed" in res.stdout and "failed" not in res.stdout
