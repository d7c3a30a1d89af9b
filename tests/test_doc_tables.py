"""Published numbers come from saved results: every table the docs quote from a file under
benchmarks/results/ is what the benchmark prints for that file today (``--markdown``), and
every results file a doc names exists."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from procs import REPO, job_env

DOCS = REPO / "docs"
RESULTS = REPO / "benchmarks" / "results"

# (doc, saved result, the script that prints its tables with --markdown)
QUOTED = [
    ("benchmarks.md", "allreduce_n2.json", "allreduce.py"),
    ("benchmarks.md", "allreduce_n4.json", "allreduce.py"),
    ("benchmarks.md", "allreduce_n3_run2.json", "allreduce.py"),
    ("benchmarks.md", "allreduce_n4_vnodes2.json", "allreduce.py"),
    ("benchmarks.md", "allreduce_tcp_n2.json", "allreduce.py"),
    ("benchmarks.md", "amp_kernels.json", "amp_kernels.py"),
    ("benchmarks.md", "amp_kernels_1t.json", "amp_kernels.py"),
]


def _section(doc: str, name: str) -> str:
    """The part of ``doc`` from the heading (or command) that names ``name`` to the next
    heading of the same or a higher level."""
    text = (DOCS / doc).read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if name in line and (
        line.startswith("#") or "--markdown" in line))
    level = next(len(lines[i]) - len(lines[i].lstrip("#")) for i in range(start, -1, -1)
                 if lines[i].startswith("#"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")
                and len(lines[i]) - len(lines[i].lstrip("#")) <= level
                and not lines[i].startswith("# ")), len(lines))
    return "\n".join(lines[start:end])


def _table_rows(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()
            if line.startswith("|") and not re.fullmatch(r"\|(\s*-+\s*\|)+", line.strip())]


@pytest.mark.parametrize("doc,result,script", QUOTED, ids=[q[1] for q in QUOTED])
def test_quoted_rows_are_what_the_saved_result_prints(doc, result, script):
    printed = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--markdown",
                              str(RESULTS / result)], capture_output=True, text=True,
                             cwd=REPO, env=job_env(), timeout=120)
    assert printed.returncode == 0, printed.stderr
    quoted = set(_table_rows(_section(doc, result)))
    tables, current = [], []
    for line in printed.stdout.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line.strip())
        elif current:
            tables.append(current)
            current = []
    # The doc quotes some of the printed tables (known by their header row) in full.
    shown = [t for t in tables if t[0] in quoted]
    assert shown, f"docs/{doc} quotes no table of {result}"
    for table in shown:
        missing = [r for r in _table_rows("\n".join(table)) if r not in quoted]
        assert not missing, f"docs/{doc} ({result}): rows differ from the file: {missing}"


def test_every_results_file_a_doc_names_exists():
    named = set()
    for doc in [*DOCS.glob("*.md"), REPO / "README.md"]:
        named |= {(doc.name, m) for m in re.findall(r"benchmarks/results/([\w.-]+\.json)",
                                                     doc.read_text())}
    missing = [(doc, name) for doc, name in sorted(named) if not (RESULTS / name).exists()
               and "*" not in name]
    assert not missing, missing


def test_the_fused_optimizer_table_is_the_saved_run():
    """docs/gpu.md quotes benchmarks/results/fused_optim.json (no --markdown in that script:
    the numbers are compared with the file directly)."""
    saved = {r["impl"]: r for r in json.loads((RESULTS / "fused_optim.json").read_text())["rows"]}
    text = (DOCS / "gpu.md").read_text()
    names = {"default": "minidist AdamW (default)", "fused": "minidist AdamW `fused=True`",
             "torch-foreach": "torch AdamW `foreach=True`", "torch-fused": "torch AdamW `fused=True`"}
    for impl, label in names.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        r = saved[impl]
        assert cells[1:] == [f"{r['median_ms']:.1f}", f"{r['min_ms']:.1f}",
                             f"{r['vs_best_torch']:.2f}"], (row, r)
