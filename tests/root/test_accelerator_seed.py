"""torch.accelerator's queries, cuda.manual_seed(_all), get_backend and torch's seeding: without
manual_seed every process draws from its own random seed (compared with torch when installed)."""

import re
import subprocess
import sys

import pytest

import minidist
from procs import REPO, job_env, run_env_ranks, run_mpi

API = ["current_accelerator", "is_available", "device_count", "current_device_index",
       "set_device_index", "synchronize", "current_device_idx", "set_device_idx"]


def test_accelerator_without_a_gpu_answers_as_torch_on_a_cpu_build():
    if minidist.cuda.is_available():
        pytest.skip("a GPU is present")
    acc = minidist.accelerator
    assert acc.current_accelerator() is None and acc.current_accelerator(True) is None
    assert acc.is_available() is False and acc.device_count() == 0
    for call in (acc.current_device_index, acc.synchronize, lambda: acc.set_device_index(0)):
        with pytest.raises(RuntimeError, match="none is available"):
            call()
    minidist.cuda.manual_seed(3)            # silently ignored without a GPU, as torch's
    minidist.cuda.manual_seed_all(3)


def test_accelerator_matches_torch():
    torch = pytest.importorskip("torch")
    for name in API:
        assert hasattr(torch.accelerator, name) and hasattr(minidist.accelerator, name), name
    if not torch.accelerator.is_available() and not minidist.accelerator.is_available():
        assert minidist.accelerator.current_accelerator() == torch.accelerator.current_accelerator()
        assert minidist.accelerator.device_count() == torch.accelerator.device_count()


def test_manual_seed_sets_initial_seed():
    minidist.manual_seed(1234)
    assert minidist.initial_seed() == 1234
    a = minidist.randn(3).tolist()
    minidist.manual_seed(1234)
    assert minidist.randn(3).tolist() == a
    new = minidist.seed()
    assert minidist.initial_seed() == new


def fresh_process_draws(module):
    code = f"import {module} as t; print(t.initial_seed(), t.randn(2).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=job_env(), cwd=str(REPO), check=True).stdout
    return out.strip()


def test_each_process_draws_from_its_own_seed():
    assert fresh_process_draws("minidist") != fresh_process_draws("minidist")
    pytest.importorskip("torch")
    assert fresh_process_draws("torch") != fresh_process_draws("torch")   # the model for ours


RANK_CODE = ("import minidist as d; d.init_process_group({kw}); "
             "print('BACKEND', d.get_rank(), d.get_backend(), d.initial_seed()); "
             "d.destroy_process_group()")


def test_get_backend_names_the_transport_torch_style(tmp_path):
    with pytest.raises(ValueError, match="init_process_group"):
        minidist.get_backend()
    job = run_mpi(2, ["-c", RANK_CODE.format(kw="")], timeout_s=90)
    assert job.returncode == 0, job.report()
    # mpiexec may join two ranks' lines: find each record where it starts
    lines = re.findall(r"BACKEND (\d+) (\S+) (\d+)", job.stdout)
    assert sorted(line[1] for line in lines) == ["mpi", "mpi"], job.report()
    assert lines[0][2] != lines[1][2]                      # ranks seed differently, as torch
    job = run_env_ranks(2, ["-c", RANK_CODE.format(kw="backend='gloo'")], timeout_s=90)
    assert job.returncode == 0, job.report()
    assert job.stdout.count(" gloo ") == 2, job.report()
