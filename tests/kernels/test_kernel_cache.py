"""Fused kernels compile once per machine (minidist/kernels/jit_cache.py): the main job run
twice on an empty cache folder compiles in the first run only, each kernel signature once
among the ranks (the others wait and load it), and says so once; the second run compiles
nothing. Elements that cannot be cached keep working, compiled in memory."""

import re

import numpy as np
import pytest

from procs import run_mpi

COMPILED = re.compile(r"\[rank (\d+)/\d+\] DEBUG minidist\.kernels\.jit_cache: fused kernels: "
                      r"compiling (\S+) \((.*)\)")
MESSAGE = "compiling fused kernels for this machine (once)"


def compiled(stderr: str) -> list[tuple[str, str, str]]:
    """(rank, function, argument types) of every kernel compilation a job logged."""
    return [m.groups() for m in COMPILED.finditer(stderr)]


@pytest.mark.mpi
def test_a_second_run_of_the_main_job_compiles_no_kernel(tmp_path):
    env = {"MINIDIST_CACHE_DIR": str(tmp_path), "MINIDIST_LOG_LEVEL": "DEBUG"}
    args = ["examples/train.py", "--epochs", "2", "--hidden", "32", "--amp"]  # + AMP kernels
    first = run_mpi(2, args, timeout_s=120, env=env)
    assert first.returncode == 0, first.report()
    done = compiled(first.stderr)
    assert any(f.endswith(".multi") or f.endswith(".flat") for _, f, _ in done), first.report()
    # the ranks took turns: no signature compiled twice in the job
    assert len({(f, a) for _, f, a in done}) == len(done), done
    assert first.stderr.count(MESSAGE) == 1 and "[rank 0/2] INFO" in first.stderr
    epoch1, epoch2 = [line for line in first.stdout.splitlines() if line.startswith("epoch ")]
    assert "compiling fused kernels for this machine, once)" in epoch1, first.stdout
    assert "compiling" not in epoch2
    assert list(tmp_path.glob("kernels/__pycache__/*.nbc")), sorted(tmp_path.rglob("*"))

    second = run_mpi(2, args, timeout_s=120, env=env)
    assert second.returncode == 0, second.report()
    assert compiled(second.stderr) == [], second.stderr
    assert MESSAGE not in second.stderr and "compiling" not in second.stdout
    assert second.stdout.splitlines()[-1].split()[:3] == first.stdout.splitlines()[-1].split()[:3]


def _step_with(element, n_state=1):
    """One fused SGD-momentum-shaped step of ``element`` through the CPU kernels."""
    from minidist.kernels import optim_cpu
    from minidist.optim.registry import FusedStep

    entry = FusedStep("test_" + element.__name__, element, lambda g, s, f: (),
                      state=("buf",) * n_state)
    p, g, buf = (np.full(5, v, np.float32) for v in (1.0, 0.5, 0.0))
    optim_cpu.flat_step(entry, p, g, (buf,), (np.float32(0.1),))
    return p, buf


def test_an_element_defined_in_a_function_runs_uncached(tmp_path, monkeypatch):
    from minidist.kernels import jit_cache

    monkeypatch.setenv("MINIDIST_CACHE_DIR", str(tmp_path))

    def local_element(p, g, buf, lr):  # not importable by name: compiled in memory
        buf = buf + g
        return p - lr * buf, buf

    assert jit_cache.loops_module(local_element, 1) is None
    p, buf = _step_with(local_element)
    assert np.array_equal(buf, np.full(5, 0.5, np.float32))
    assert np.array_equal(p, np.float32(1.0) - np.float32(0.1) * np.full(5, 0.5, np.float32))
    assert not (tmp_path / "kernels").exists()


def test_an_unwritable_cache_folder_compiles_in_memory(tmp_path, monkeypatch):
    from minidist.kernels import jit_cache
    from minidist.optim.sgd import sgd_element

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MINIDIST_CACHE_DIR", str(blocker))
    monkeypatch.setattr(jit_cache, "_MODULES", {})
    assert jit_cache.loops_module(sgd_element, 0) is None
