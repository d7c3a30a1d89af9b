"""Every entry point a user can run answers ``--help`` with a usage text, exit 0, and writes
nothing: ``python -m minidist.*``, examples/, benchmarks/, the shell scripts.

A script that parsed its arguments by hand once took ``--help`` for an output folder and drew
its pictures into ``./--help/``; here every one runs in an empty folder that must stay empty.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from procs import REPO, job_env

MODULES = ["minidist.launch", "minidist.tune", "minidist.viz"]
SHELL = ["mpirun.sh", "test.sh"]


def scripts() -> list[str]:
    found = []
    for folder in ("examples", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            text = path.read_text()
            if path.name.startswith("_") or "__main__" not in text:
                continue
            if "\nimport torch\n" in text:
                continue  # a PyTorch original (examples/from_torch): needs torch, not ours
            found.append(str(path.relative_to(REPO)))
    return found


def runnable_modules() -> list[str]:
    """Every module of the package that runs as ``python -m``: must be listed in MODULES."""
    found = []
    for path in sorted((REPO / "minidist").rglob("*.py")):
        text = path.read_text()
        mod = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if path.name == "__main__.py":
            found.append(mod.rsplit(".", 1)[0])
        elif "\nif __name__ == \"__main__\":" in text:
            found.append(mod)
    return found


def test_every_runnable_module_is_checked():
    assert sorted(runnable_modules()) == sorted(MODULES)


def _help(argv: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=job_env({"MINIDIST_CACHE_DIR": str(cwd / ".c")}),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("argv", [["-m", m] for m in MODULES] + [[s] for s in scripts()],
                         ids=lambda a: " ".join(a))
def test_help_prints_usage_and_writes_nothing(argv, tmp_path):
    if argv[0] != "-m":
        argv = [str(REPO / argv[0])]
    out = _help([sys.executable, *argv, "--help"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "usage:" in out.stdout, out.stdout + out.stderr
    assert sorted(p for p in os.listdir(tmp_path) if p != ".c") == [], os.listdir(tmp_path)
    assert not (tmp_path / ".c").exists()


@pytest.mark.parametrize("script", SHELL)
def test_shell_scripts_help(script, tmp_path):
    out = _help([str(REPO / script), "--help"], tmp_path)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stdout + out.stderr
    assert os.listdir(tmp_path) == []
