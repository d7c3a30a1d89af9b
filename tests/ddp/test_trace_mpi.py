"""The step timeline (minidist/tracing.py) of a real n=2 Trainer run: valid Chrome-trace JSON per
rank and merged, one all-reduce event per bucket per step on the communication lane, and the
compute spans of every step."""

import json
from collections import Counter

import pytest

from procs import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("overlap", [True, False])
def test_trace_has_one_event_per_bucket_per_step(tmp_path, overlap):
    job = run_mpi(2, ["tests/ddp/trace_rank.py"] + (["--overlap"] if overlap else []),
                  timeout_s=120, env={"MINIDIST_TRACE": str(tmp_path)})
    assert job.returncode == 0, job.report()
    res = json.loads(next(l for l in job.stdout.splitlines()
                          if l.startswith("RESULT "))[len("RESULT "):])
    buckets, steps = res["buckets"], res["steps"]
    assert buckets == 4 and steps == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "trace-rank0.json", "trace-rank1.json", "trace.json"]
    merged = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert {e["pid"] for e in merged} == {0, 1}
    for rank in (0, 1):
        data = json.loads((tmp_path / f"trace-rank{rank}.json").read_text())
        events = data["traceEvents"]
        assert data["otherData"] == {"rank": rank, "world_size": 2, "truncated": False}
        assert [e for e in merged if e["pid"] == rank] == events
        for e in events:  # the fields every Chrome-trace event of its phase needs
            assert {"name", "ph", "pid", "tid"} <= set(e) and e["pid"] == rank, e
            assert e["ph"] in "XiCM", e
            if e["ph"] != "M":
                assert isinstance(e["ts"], float), e
            if e["ph"] == "X":
                assert e["dur"] >= 0, e
        lanes = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
        assert lanes == {"compute": 0, "communication": 1}
        reduces = [e for e in events if e.get("cat") == "allreduce"]
        assert Counter((e["args"]["step"], e["args"]["bucket"]) for e in reduces) == Counter(
            {(s, b): 1 for s in range(steps) for b in range(buckets)})
        for e in reduces:
            assert e["tid"] == 1 and e["name"] == f"all_reduce bucket {e['args']['bucket']}"
            assert e["args"]["bytes"] > 0 and e["args"]["algorithm"] in (
                "ring", "tree", "rd", "direct", "mpi", "shm")
            assert e["args"]["busbw_GBps"] >= 0
        names = Counter(e["name"] for e in events)
        for name in ("forward", "backward", "optimizer.step", "wait for all-reduce",
                     "exposed comm [ms]"):
            assert names[name] == steps, (name, names)
        for b in range(buckets):
            for what in ("ready", "launch", "done"):
                assert names[f"bucket {b} {what}"] == steps
        assert all(names[f"step {s}"] == 1 for s in range(steps))
