"""docs/amp.md's Python snippets run as written, on 2 real MPI ranks (like the README's)."""

import re

import pytest
from procs import REPO, run_mpi

BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "amp.md").read_text(), re.S)


def test_the_doc_has_snippets():
    assert len(BLOCKS) >= 3


@pytest.mark.mpi
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_amp_doc_snippet_runs_on_two_ranks(index, tmp_path):
    script = tmp_path / f"amp_snippet_{index}.py"
    script.write_text(BLOCKS[index] + "\nprint('snippet ok')\n")
    result = run_mpi(2, [script], timeout_s=120)
    assert result.returncode == 0, result.report()
    assert result.stdout.count("snippet ok") == 2, result.report()
