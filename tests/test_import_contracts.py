"""The import contracts in pyproject.toml ([tool.importlinter]) hold, checked by import-linter's
``lint-imports``; and they bite: a copy of the package with one upward import breaks them."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from procs import REPO


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.exists():
        pytest.fail("lint-imports is not installed: pip install -e '.[test]' (the [test] extra "
                    "brings import-linter)")
    return subprocess.run([str(exe), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_the_contracts_hold():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def lint_a_broken_copy(tmp_path, module: str, line: str):
    """lint-imports on a copy of the package whose ``module`` (a path) ends with ``line``."""
    shutil.copytree(REPO / "minidist", tmp_path / "minidist",
                    ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    path = tmp_path / "minidist" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa: E402\n")
    return lint_imports(tmp_path)


def test_an_upward_import_breaks_them(tmp_path):
    """tensor importing comm (a lower layer reaching up) is reported, with the import named."""
    result = lint_a_broken_copy(tmp_path, "tensor/core.py", "from minidist.comm import errors")
    assert result.returncode != 0, result.stdout[-3000:]
    assert "layers import downward BROKEN" in result.stdout, result.stdout[-3000:]
    assert "minidist.tensor.core -> minidist.comm.errors" in result.stdout, result.stdout[-3000:]


def test_a_spine_module_importing_a_wing_breaks_them(tmp_path):
    """The group reaching for the fast path's shared memory itself, instead of being handed
    it by the wing's group extension, is reported by the spine/wing contract."""
    result = lint_a_broken_copy(tmp_path, "comm/group.py", "from minidist.fastpath import shm")
    assert result.returncode != 0, result.stdout[-3000:]
    assert "the spine imports no wing BROKEN" in result.stdout, result.stdout[-3000:]
    assert "minidist.comm.group -> minidist.fastpath" in result.stdout, result.stdout[-3000:]
