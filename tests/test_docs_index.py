"""The README's documentation table is the index: it links every page in docs/ and the
benchmarks' guide, and every page it links exists."""

import re

from procs import REPO


def _index() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Documentation")
    return text[start:text.index("\n## ", start + 1)]


def test_the_readme_table_links_every_doc_page_and_the_benchmarks_guide():
    linked = set(re.findall(r"^\| \[[^\]]+\]\(([^)]+)\)", _index(), re.M))
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")} | {"benchmarks/README.md"}
    assert not pages - linked, f"README's documentation table lacks {sorted(pages - linked)}"
    assert all((REPO / p).exists() for p in linked), sorted(linked)
