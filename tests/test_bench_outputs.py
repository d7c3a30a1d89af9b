"""Benchmarks keep the published results apart from a user's runs, and the published files
carry no paths of the machine that produced them."""

import ast
import re
import sys

import pytest

from procs import REPO

BENCH = REPO / "benchmarks"
SCRIPTS = ["allreduce.py", "ddp_scaling.py", "amp_kernels.py", "memory.py", "hier.py"]


def test_local_results_folder_is_ignored_by_git():
    sys.path.insert(0, str(BENCH))
    try:
        import _common
    finally:
        sys.path.remove(str(BENCH))
    relative = _common.LOCAL_RESULTS.relative_to(REPO)
    ignored = [line.strip() for line in (REPO / ".gitignore").read_text().splitlines()]
    assert f"/{relative.parts[0]}/" in ignored, (relative, ignored)
    assert _common.RESULTS == BENCH / "results"
    assert _common.shown(BENCH / "results" / "x.json") == "benchmarks/results/x.json"
    assert _common.shown("/elsewhere/x.json") == "/elsewhere/x.json"


@pytest.mark.parametrize("script", SCRIPTS)
def test_default_output_is_the_local_folder_not_the_published_one(script):
    """Without --out a run must not write over benchmarks/results (read from the source: the
    scripts need mpiexec or minutes to run; their smoke tests pass --out)."""
    tree = ast.parse((BENCH / script).read_text())
    defaults = [ast.unparse(kw.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                and node.args and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "--out" for kw in node.keywords if kw.arg == "default"]
    assert defaults == ["str(LOCAL_RESULTS)"], (script, defaults)


def test_published_results_name_no_machine_paths():
    machine_path = re.compile(r"(?<![\w.])/(?:work|home|root|Users)/")
    for path in sorted((BENCH / "results").glob("*")):
        if path.suffix in (".txt", ".json"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                assert not machine_path.search(line), f"{path.name}:{n}: {line}"
