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

MODULES = ["minidist.launch", "minidist.testing.cluster", "minidist.testing.slurm", "minidist.tune",
           "minidist.viz"]
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


def test_outputs_go_under_runs_by_default():
    """A clone stays clean (git status) after the documented commands: what a script writes
    without --out goes under runs/ (git-ignored); the published results need --out."""
    import re
    for path in [*(REPO / "benchmarks").glob("*.py"), *(REPO / "minidist").rglob("*.py")]:
        for m in re.finditer(r'add_argument\(\s*"(--out|--plots|out_dir)"[^)]*?default=([^,)]+)',
                             path.read_text(), re.S):
            default = m.group(2)
            assert "docs/" not in default and "benchmarks/results" not in default, (path, m[0])
    assert "/runs/" in (REPO / ".gitignore").read_text().split()


def test_viz_draws_into_runs(tmp_path):
    pytest.importorskip("matplotlib")
    out = _help([sys.executable, "-m", "minidist.viz"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(p for p in os.listdir(tmp_path) if p != ".c") == ["runs"]
    assert list((tmp_path / "runs" / "viz").glob("algo_ring_n4.png"))
