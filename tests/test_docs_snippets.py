"""Every ```python block in docs/*.md runs as written, on 2 real MPI ranks (one launch per page;
tests/doc_snippets.py runs them and explains the skip / continues markers)."""

import pytest

from doc_snippets import parse
from procs import REPO, run_mpi

PAGES = sorted((REPO / "docs").glob("*.md"))
WITH_CODE = [p for p in PAGES if parse(p)]


def test_every_skip_says_why_and_most_blocks_run():
    snippets = [s for page in PAGES for s in parse(page)]
    assert all(s.reason for s in snippets if s.mode == "skip")
    assert sum(s.mode != "skip" for s in snippets) >= 10, [(s.line, s.mode) for s in snippets]


@pytest.mark.mpi
@pytest.mark.parametrize("page", WITH_CODE, ids=[p.name for p in WITH_CODE])
def test_doc_page_snippets_run_on_two_ranks(page, tmp_path):
    snippets = parse(page)
    ran = sum(s.mode != "skip" for s in snippets)
    result = run_mpi(2, [REPO / "tests" / "doc_snippets.py", page], timeout_s=120, cwd=tmp_path)
    assert result.returncode == 0, result.report()
    assert result.stdout.count(f"{page.name} ok: {ran} run") == 2, result.report()
