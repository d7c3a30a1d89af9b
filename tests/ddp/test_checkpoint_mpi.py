"""Checkpoint outcomes under mpiexec: a refused (non-finite) save raises the same error on every
rank (also with per-rank files), and resume skips a damaged newest checkpoint identically on
every rank. The bodies are in checkpoint_rank.py; rank 0 prints a JSON summary."""

import json

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 3])
def test_refused_save_and_fallback_resume_agree_on_every_rank(n, tmp_path):
    # A rank left waiting would sit in a collective for 600 s: run_mpi's timeout catches it.
    job = run_mpi(n, ["tests/ddp/checkpoint_rank.py", tmp_path], timeout_s=120,
                  env={"MINIDIST_TIMEOUT_S": "600"})
    assert job.returncode == 0, job.report()
    res = json.loads(next(line for line in job.stdout.splitlines()
                          if line.startswith("RESULT "))[len("RESULT "):])
    assert res["world_size"] == n
    # 1. every rank raised, with the same message apart from its own rank prefix
    errors = res["errors"]
    assert all(e and e.startswith(f"[rank {r}/{n}] ") for r, e in enumerate(errors)), errors
    bodies = {e.split("] ", 1)[1].replace(" (reported by rank 0, which writes the checkpoint)",
                                          "") for e in errors}
    assert len(bodies) == 1, errors
    body = bodies.pop()
    assert body.startswith("save_checkpoint: refused to write checkpoint-000003.npz: "
                           "'model/0.weight' holds"), body
    assert ") after epoch 3" in body and "The run diverged" in body, body
    assert "the last good checkpoint, " in body and "checkpoint-000002.npz, is kept" in body
    assert res["files"] == ["checkpoint-000001.npz", "checkpoint-000002.npz"]
    # 2. every rank resumed from the same older checkpoint, and ended identical
    assert res["resume"] == [[1, None]] * n, res["resume"]
    assert len(set(res["digests"])) == 1
    skipped = [line for line in job.stderr.splitlines() if "resume: skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith(f"[rank 0/{n}] WARNING") and \
        "checkpoint-000002.npz: BadZipFile" in skipped[0], job.stderr
    # 3. per-rank files: the last rank's refusal reaches every rank
    per_rank = res["per_rank_errors"]
    assert all(e and f"refused to write rank{n - 1}.npz" in e for e in per_rank), per_rank
    assert f"reported by rank {n - 1}" in per_rank[0], per_rank
