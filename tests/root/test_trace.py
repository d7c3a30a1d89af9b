"""The step-timeline collector (minidist/tracing.py) in one process: API, files, merge, and a
one-rank Trainer run with TrainerConfig(trace_dir=...)."""

import json

import numpy as np
import pytest

import minidist
from minidist import nn, optim
from minidist import tracing as trace
from minidist.data import ArrayDataset
from minidist.tensor import Tensor
from minidist.trainer import Trainer, TrainerConfig


@pytest.fixture(autouse=True)
def no_tracer_left():
    assert trace.tracer() is None
    yield
    trace.stop()


def test_off_by_default_and_nothing_recorded():
    w = Tensor(np.ones(3), requires_grad=True)
    (w * 2.0).sum().backward()  # the tape's backward span is skipped: no tracer
    assert trace.tracer() is None and trace.stop() is None


def test_events_and_flush(tmp_path):
    tr = trace.start(tmp_path, rank=1, world_size=2)
    assert trace.start(tmp_path / "other", 0, 2) is tr  # one tracer per process
    t0 = tr.now()
    w = Tensor(np.ones(3), requires_grad=True)
    (w * 2.0).sum().backward()
    tr.complete("all_reduce", t0, tr.now(), lane=trace.COMM, cat="allreduce",
                args={"bytes": 12})
    tr.instant("bucket 0 ready")
    tr.counter("exposed comm [ms]", {"ms": 0.5})
    path = trace.stop()
    assert path == tmp_path / "trace-rank1.json" and trace.tracer() is None
    data = json.loads(path.read_text())
    by_name = {e["name"]: e for e in data["traceEvents"]}
    assert by_name["backward"]["ph"] == "X" and by_name["backward"]["tid"] == 0
    assert by_name["all_reduce"]["tid"] == 1 and by_name["all_reduce"]["args"] == {"bytes": 12}
    assert by_name["bucket 0 ready"]["ph"] == "i" and by_name["exposed comm [ms]"]["ph"] == "C"
    assert all(e["pid"] == 1 for e in data["traceEvents"])
    assert data["otherData"] == {"rank": 1, "world_size": 2, "truncated": False}


def test_max_events_bounds_memory(tmp_path):
    tr = trace.Tracer(tmp_path, 0, 1, max_events=8)
    for _ in range(20):
        tr.instant("x")
    assert len(tr.events) == 8 and tr.truncated
    assert json.loads(tr.flush().read_text())["otherData"]["truncated"] is True


def test_merge_needs_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="MINIDIST_TRACE"):
        trace.merge(tmp_path)


def test_start_from_env(tmp_path, monkeypatch):
    monkeypatch.delenv(trace.ENV_VAR, raising=False)
    assert trace.start_from_env(0, 1) is None
    monkeypatch.setenv(trace.ENV_VAR, str(tmp_path))
    assert trace.start_from_env(0, 1) is trace.tracer() is not None


def test_trainer_trace_dir_writes_the_timeline(group, tmp_path):
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    cfg = TrainerConfig(epochs=1, batch_size=8, verbose=False, trace_dir=str(tmp_path))
    t = Trainer(model, nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.1), cfg)
    t.fit(ArrayDataset(x, (x[:, 0] > 0).astype(np.int64)))
    t.ddp.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace-rank0.json", "trace.json"]
    names = [e["name"] for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]]
    assert names.count("forward") == names.count("backward") == names.count("optimizer.step") == 4
    assert names.count("bucket 0 done") == 4  # one rank: nothing to all-reduce, no such event
    assert names.count("all_reduce bucket 0") == 0


def test_span_records_its_block_even_when_it_raises_and_nothing_when_off(tmp_path):
    with trace.span("off"):  # no tracer: a do-nothing context
        pass
    tr = trace.start(tmp_path, rank=0, world_size=1)
    with trace.span("block", lane=trace.COMM, args={"k": 1}) as s:
        assert isinstance(s, trace.Span)
    with pytest.raises(ValueError):
        with trace.span("failed"):
            raise ValueError("inside the block")
    names = {e["name"]: e for e in tr.events}
    assert "off" not in names and names["block"]["tid"] == 1 and names["block"]["args"] == {"k": 1}
    assert names["failed"]["ph"] == "X" and names["failed"]["dur"] >= 0
