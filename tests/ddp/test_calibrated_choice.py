"""After a tune, DDP names the algorithm that ran: its trace, its run manifest and the ledger
all take "auto" from the group's one planner, with the calibration the group runs with."""

import json
import threading

import numpy as np

from minidist import comm, nn
from minidist import tracing as trace
from minidist.auto import calibrate, select
from minidist.comm.transports.threads import run_threads
from minidist.ddp import DistributedDataParallel
from minidist.tensor import Tensor

BUILD = threading.Lock()


def calibration_that_differs(tmp_path, monkeypatch, nbytes):
    """A calibration file for 2 thread ranks whose rule picks another algorithm than the
    shipped table does for ``nbytes``; returns (shipped choice, calibrated choice)."""
    monkeypatch.setenv("MINIDIST_CACHE_DIR", str(tmp_path))
    shipped = select.choose(2, nbytes)
    calibrated = "tree" if shipped != "tree" else "direct"
    model = {name: dict(c) for name, c in select.MODEL.items()}
    path = calibrate.cache_path("threads", 2)
    path.write_text(json.dumps({"format": 1, "key": calibrate.cache_key("threads", 2),
                                "model": model, "rules": {"2": [[None, calibrated]]}}))
    return shipped, calibrated


def test_trace_and_manifest_name_the_calibrated_algorithm(tmp_path, monkeypatch):
    nbytes = (8 * 4 + 8 + 8 * 2 + 2) * 4  # one bucket: the whole model, float32
    shipped, calibrated = calibration_that_differs(tmp_path, monkeypatch, nbytes)
    assert shipped != calibrated
    tr = trace.start(tmp_path / "trace", 0, 2)
    x = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)

    def body(t):
        with BUILD:  # thread ranks share nn.manual_seed's generator
            nn.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        group = comm.new_group_from_transport(t)
        ddp = DistributedDataParallel(model, process_group=group, overlap=False)
        (ddp(Tensor(x[2 * t.rank:2 * t.rank + 2])) ** 2).mean().backward()
        ran = [e.algorithm for e in group.ledger.entries()  # the bucket's, not set-up's
               if e.collective == "all_reduce" and (e.label or "").startswith("bucket")]
        manifest = ddp.manifest["all-reduce"]
        with BUILD:  # close() flushes the one tracer the thread ranks share: one at a time
            ddp.close()
        return group.auto_source(), ran, manifest

    try:
        out = run_threads(2, body, timeout_s=60)
    finally:
        trace.stop()
        if comm.is_initialized():  # DDP made a default group beside the threads' groups
            comm.destroy_process_group()
    events = [e for e in tr.events if e.get("cat") == "allreduce"]
    assert events and all(e["args"]["algorithm"] == calibrated for e in events)
    for source, ran, manifest in out:
        assert source.startswith("calibration")
        assert ran == [calibrated]
        assert manifest["buckets"] == [calibrated]
        assert manifest["auto"]["source"] == source
