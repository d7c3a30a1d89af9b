"""benchmarks/memory.py, tiny, under mpiexec -n 2, and docs/memory.md's Python snippet."""

import json
import re

import pytest

from procs import REPO, run_mpi

BENCH = REPO / "benchmarks" / "memory.py"
SNIPPETS = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "memory.md").read_text(), re.S)


@pytest.mark.mpi
def test_memory_benchmark_tiny(tmp_path):
    res = run_mpi(2, [BENCH, "--models", "mlp", "--steps", "1", "--rounds", "1", "--warmup",
                      "1", "--out", tmp_path], timeout_s=120, env={"MINIDIST_TIMEOUT_S": "60"})
    assert res.returncode == 0, res.report()
    rows = {r["mode"]: r for r in json.loads((tmp_path / "memory_n2.json").read_text())["rows"]}
    assert set(rows) == {"ddp", "ckpt", "zero", "zero+ckpt"}
    # ZeRO at n=2: half of AdamW's state per rank (+ at most a tail of < 2 elements per bucket)
    assert rows["zero"]["optimizer_state_mib"] <= rows["ddp"]["optimizer_state_mib"] / 2 + 1e-3
    assert rows["ckpt"]["activations_kept_mib"] < rows["ddp"]["activations_kept_mib"] / 3
    assert "opt state" in res.stdout


def test_the_memory_doc_snippet_runs():
    assert len(SNIPPETS) == 1
    exec(compile(SNIPPETS[0], "docs/memory.md", "exec"), {})
