"""The README's Python snippets run as written, on 2 real MPI ranks (docs cut from tests)."""

import re

import pytest
from procs import REPO, run_mpi

BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)


@pytest.mark.mpi
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_snippet_runs_on_two_ranks(index, tmp_path):
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(BLOCKS[index] + "\nprint('snippet ok')\n")
    result = run_mpi(2, [script], timeout_s=120)
    assert result.returncode == 0, result.report()
    assert result.stdout.count("snippet ok") == 2, result.report()
    # the snippet itself shows that it worked (a reader sees more than silence)
    own = [line for line in result.stdout.splitlines() if line and line != "snippet ok"]
    assert own, result.report()
    assert "Traceback" not in result.stderr and "WARNING" not in result.stderr, result.report()
