"""Run every ```python block of one docs page, in order, on every rank of the job.

    mpiexec -n 2 python tests/doc_snippets.py docs/data.md      # what tests/test_docs_snippets.py does

A page's blocks run in one process (one mpiexec launch per page keeps the suite fast). Each
block starts with a fresh namespace and no process group, as a reader would run it, unless an
HTML comment right before its fence says otherwise (invisible in the rendered page):

    <!-- snippet: continues -->          runs in the namespace of the block before (a story
                                         told in several blocks)
    <!-- snippet: skip (why) -->         not run; the reason is required, e.g. "needs a GPU"

After each block a process group it left open is destroyed, so the next one can start its own.
Prints ``<page> ok: N run, M skipped`` on every rank when every block ran.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"(?:<!--\s*snippet:\s*(?P<marker>[^>]*?)\s*-->\s*\n)?```python\n(?P<code>.*?)```",
                   re.S)


@dataclass
class Snippet:
    line: int          # line of the opening fence in the page
    code: str
    mode: str          # "run" | "continues" | "skip"
    reason: str = ""


def parse(page: Path) -> list[Snippet]:
    """The page's ```python blocks with their markers; ValueError on a malformed marker."""
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start("code"))
        marker = (m.group("marker") or "").strip()
        if not marker:
            out.append(Snippet(line, m.group("code"), "run"))
        elif marker == "continues":
            out.append(Snippet(line, m.group("code"), "continues"))
        elif (skip := re.fullmatch(r"skip\s*\((.+)\)", marker)):
            out.append(Snippet(line, m.group("code"), "skip", skip.group(1).strip()))
        else:
            raise ValueError(f"{page.name}:{line}: unknown snippet marker {marker!r}; use "
                             "'continues' or 'skip (reason)'.")
    return out


def main(page: Path) -> None:
    from minidist import comm

    snippets = parse(page)
    namespace: dict = {}
    ran = skipped = 0
    for s in snippets:
        if s.mode == "skip":
            skipped += 1
            continue
        if s.mode == "run":
            if comm.is_initialized():
                comm.destroy_process_group()
            namespace = {"__name__": "__main__"}
        # Padded with blank lines: a traceback's line numbers are the page's.
        exec(compile("\n" * s.line + s.code, str(page.name), "exec"), namespace)
        ran += 1
    if comm.is_initialized():
        comm.destroy_process_group()
    print(f"{page.name} ok: {ran} run, {skipped} skipped", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
