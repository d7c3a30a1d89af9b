"""`ruff check minidist` passes with the rules in pyproject.toml ([tool.ruff.lint])."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from procs import REPO


def ruff_command():
    here = Path(sys.executable).parent / "ruff"  # the venv's, installed by the [test] extra
    if here.exists():
        return [str(here)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.fail("ruff is not installed: pip install -e '.[test]' (the [test] extra brings it)")


def test_ruff_check_minidist_passes():
    result = subprocess.run([*ruff_command(), "check", "minidist"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
