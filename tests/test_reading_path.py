"""docs/layout.md's "Follow one gradient": the reading path of one DDP step stays short.

Every entry (`minidist/path.py:function` or `:Class.method`, in backticks, one per list item)
must exist; the functions on the path total at most MAX_PATH_LINES lines (def to last line,
docstrings included) and no module on it is over MAX_MODULE_LINES lines.
"""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYOUT = REPO / "docs" / "layout.md"
MAX_PATH_LINES = 700
MAX_MODULE_LINES = 400
SPINE_BUDGET_LINES = 6000  # the reading table's files, every line
SPINE_MODULE_LINES = 300
ENTRY = re.compile(r"^\s*\d+\.\s+`(minidist/[\w/]+\.py):([\w.]+)`")


def path_entries() -> list[tuple[str, str]]:
    text = LAYOUT.read_text()
    start = text.index("## Follow one gradient")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else len(text)]
    return [(m.group(1), m.group(2)) for line in section.splitlines()
            if (m := ENTRY.match(line))]


def find(module: str, qualname: str) -> ast.AST | None:
    node: ast.AST = ast.parse((REPO / module).read_text())
    for part in qualname.split("."):
        node = next((n for n in ast.iter_child_nodes(node)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
    return node


def test_the_path_is_listed_in_reading_order():
    entries = path_entries()
    assert len(entries) >= 10, entries
    assert entries[0][0] == "minidist/tensor/autograd.py", entries[0]
    assert any(m.startswith(("minidist/comm/transports/", "minidist/fastpath/shm_window"))
               for m, _ in entries), entries  # where the bytes lie: a transport or a window
    assert entries[-1][0].startswith("minidist/optim/"), entries[-1]


def test_every_entry_exists():
    missing = [f"{m}:{q}" for m, q in path_entries()
               if not (REPO / m).is_file() or find(m, q) is None]
    assert not missing, f"docs/layout.md names what does not exist: {missing}"


def test_the_path_is_short_and_its_modules_readable():
    entries = path_entries()
    sizes = {}
    for m, q in entries:
        node = find(m, q)
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), f"{m}:{q}"
        sizes[f"{m}:{q}"] = node.end_lineno - node.lineno + 1
    total = sum(sizes.values())
    assert total <= MAX_PATH_LINES, f"{total} lines on the reading path: {sizes}"
    big = {m: n for m in {m for m, _ in entries}
           if (n := len((REPO / m).read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules on the reading path over {MAX_MODULE_LINES} lines: {big}"


READING_ROW = re.compile(r"^\| (\d+) \| `([\w/.]+\.py)` \| (\d+) \| (.+) \|$")
READING_TOTAL = re.compile(r"^\| \| \*\*(\d+) files\*\* \| \*\*(\d+)\*\* \|")


def reading_table() -> tuple[list[tuple[str, int]], tuple[int, int]]:
    text = LAYOUT.read_text()
    start = text.index("## Reading the spine")
    section = text[start:text.index("\n## ", start + 1)]
    rows = [(m.group(2), int(m.group(3))) for line in section.splitlines()
            if (m := READING_ROW.match(line))]
    total = next((int(m.group(1)), int(m.group(2))) for line in section.splitlines()
                 if (m := READING_TOTAL.match(line)))
    return rows, total


def test_the_spine_reading_table_counts_what_is_there():
    """Each file's line count within 10 % of the file (every line: comments and docstrings are
    read too), the total within 5 %, every file a spine module (no wing in the reading)."""
    from minidist.wings import is_wing_module
    rows, (files, total) = reading_table()
    assert len(rows) == files >= 20, rows
    assert sum(n for _, n in rows) == total
    actual = {}
    for path, listed in rows:
        file = REPO / "minidist" / path
        assert file.is_file(), path
        actual[path] = len(file.read_text().splitlines())
        assert abs(actual[path] - listed) <= 0.10 * actual[path], (path, listed, actual[path])
        module = "minidist." + path.removesuffix(".py").replace("/", ".")
        assert is_wing_module(module) is None, f"{path} is a wing's, not the spine's"
    assert abs(sum(actual.values()) - total) <= 0.05 * total, (total, sum(actual.values()))
    # the budget: an afternoon's reading, in files of one sitting each
    assert sum(actual.values()) <= SPINE_BUDGET_LINES, sum(actual.values())
    long = {p: n for p, n in actual.items() if n > SPINE_MODULE_LINES}
    assert not long, f"spine modules over {SPINE_MODULE_LINES} lines: {long}"
