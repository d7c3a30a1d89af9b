"""The collective ledger, call fingerprints and the ledger diagnosis, on thread ranks (fast).

Real processes (mpiexec, TCP) run the same mismatches in tests/watch/test_ledger_jobs.py.
"""

import json
import logging

import numpy as np
import pytest

import minidist as md
from minidist.comm import (CollectiveMismatch, CommError, ProcessGroup, ledger_label,
                           new_group_from_transport)
from minidist.watch.diagnosis.diagnose import diagnose
from minidist.comm.calls import Calls, call_spec, fingerprint
from minidist.watch.diagnosis.ledger import Ledger
from minidist.comm.ops import ReduceOp
from minidist.comm.calls import wire_tag
from minidist.comm.transports.base import has_fingerprint, stream_of
from minidist.comm.transports.local import LocalTransport
from minidist.comm.transports.threads import ThreadWorld, run_threads


def on_threads(n, fn, timeout_s=30, **kw):
    """``fn(group)`` on n thread ranks; ``timeout_s`` is every wait's deadline (the job gets 20 s
    more, for the ledger exchange)."""
    world = ThreadWorld(n, timeout_s=timeout_s)
    return run_threads(n, lambda t: fn(new_group_from_transport(t, **kw)),
                       timeout_s=timeout_s + 20, world=world)


def failure(n, body, timeout_s=10):
    """Run ``body(g)`` on n thread ranks; return every rank's CommError (or None)."""
    def wrapped(g):
        try:
            body(g)
        except CommError as e:
            return e
        return None
    return on_threads(n, wrapped, timeout_s)


# -- recording -------------------------------------------------------------------------------

def test_entries_record_each_collective_with_caller_and_label():
    def body(g):
        x = np.ones((4, 3), np.float32)
        g.all_reduce(x, op="max", algorithm="ring")
        with ledger_label("bucket=3"):
            g.broadcast(x, src=1)
        g.all_reduce(x, label="step=7")
        g.barrier()
        return g.ledger.entries()

    e = on_threads(2, body)[1]
    assert [x.seq for x in e] == [1, 2, 3, 4]
    assert [x.collective for x in e] == ["all_reduce", "broadcast", "all_reduce", "barrier"]
    first = e[0]
    assert (first.op, first.algorithm, first.reason, first.count, first.dtype, first.shape) == \
        ("max", "ring", "explicit", 12, "float32", (4, 3))
    assert first.status == "ok" and first.end_s >= first.start_s
    assert first.where.startswith("test_ledger.py:") and first.file.endswith("test_ledger.py")
    assert e[1].root == 1 and e[1].label == "bucket=3" and e[1].describe() == \
        "broadcast(12 x float32, src=1, bucket=3)"
    assert e[2].label == "step=7" and e[2].algorithm in ("ring", "tree", "rd")
    assert e[2].reason.startswith("cost model")  # threads: no MPI, no rules -> the model
    assert e[3].describe() == "barrier()"
    json.dumps([x.to_dict() for x in e])  # JSON-able


def test_the_site_of_a_wrapped_collective_is_the_users_line():
    # md.all_reduce and comm.all_reduce call the group's all_reduce with stacklevel=2: the
    # ledger names the line that called them; a user's own wrapper passes stacklevel too
    g = ProcessGroup(LocalTransport())
    x = np.ones(4, np.float32)

    def average(y):  # a helper of the user's: its caller's line is the site
        g.all_reduce(y, "avg", stacklevel=2)

    md.all_reduce(x, group=g)
    md.comm.all_reduce(x, group=g)
    g.all_reduce(x)
    md.all_reduce(md.Tensor(x), group=g)
    average(x)
    first = test_the_site_of_a_wrapped_collective_is_the_users_line.__code__.co_firstlineno
    assert [e.where for e in g.ledger.entries()] == [
        f"test_ledger.py:{first + n}" for n in (9, 10, 11, 12, 13)]
    g.close()


def test_a_collective_at_the_bottom_of_a_thread_is_its_own_site():
    # a thread started from C whose first frame is the collective itself: no caller to name
    import _thread
    import threading
    g = ProcessGroup(LocalTransport())
    done = threading.Event()

    def bottom(x):  # the collective as the thread's function, with no Python frame under it
        try:
            g.all_reduce(x)
        finally:
            done.set()

    _thread.start_new_thread(bottom, (np.ones(2, np.float32),))
    assert done.wait(10)
    assert g.ledger.entries()[-1].where.startswith("test_ledger.py:")
    def last_entry_once(n):  # the n-th entry, once its call returned on the C thread
        for _ in range(1000):
            if len(g.ledger.entries()) == n and g.ledger.entries()[-1].status == "ok":
                break
            threading.Event().wait(0.01)
        return g.ledger.entries()[-1]

    _thread.start_new_thread(g.all_reduce, (np.ones(2, np.float32),))
    last = last_entry_once(2)
    assert last.status == "ok" and last.file.endswith("group.py"), last
    # a wrapper at the bottom (stacklevel 2 points past the thread's first frame): the
    # outermost minidist frame, the wrapper's own line
    _thread.start_new_thread(md.all_reduce, (np.ones(2, np.float32),), {"group": g})
    last = last_entry_once(3)
    assert last.status == "ok" and last.file.endswith("collectives.py"), last


def test_observers_see_only_the_events_they_override_and_calls_are_timed():
    from minidist.comm.calls import CollectiveObserver, handlers

    class Ends(CollectiveObserver):
        def __init__(self):
            self.seen = []

        def end(self, call):
            self.seen.append((call.seq, call.t0 <= call.t1))

    class Nothing(CollectiveObserver):
        pass

    ends, nothing = Ends(), Nothing()
    calls = Calls(1 << 40)
    calls.add(nothing)
    calls.add(ends)
    assert handlers(calls.observers, "start") == () and handlers(calls.observers, "failed") == ()
    assert handlers(calls.observers, "end") == (ends.end,)
    call = calls.begin(call_spec("barrier", "barrier", algorithm="x"), 0)
    assert call.t0 > 0 and call.t1 is None
    calls.end(call)
    assert ends.seen == [(1, True)] and call.t1 >= call.t0
    failed = calls.begin(call_spec("barrier", "barrier", algorithm="x"), 0)
    calls.failed(failed, md.CommTimeout("t"))
    assert failed.t1 is not None and ends.seen == [(1, True)]


def test_unobserved_calls_leave_the_call_numbers_as_they_were():
    # the auto wing's calibration runs collectives between the program's: they must not
    # shift the numbers that pair every rank's n-th call on a stream
    calls = Calls(1 << 40)
    spec = call_spec("barrier", "barrier", algorithm="x")
    for stream in (0, 0, 5):
        calls.end(calls.begin(spec, stream))
    with calls.unobserved():
        for stream in (0, 5, 1023):
            calls.end(calls.begin(spec, stream))
        assert calls.counts() == {0: 3, 5: 2, 1023: 1}
    assert calls.counts() == {0: 2, 5: 1}
    assert calls.begin(spec, 1023).seq == 1 and calls.begin(spec, 0).seq == 3


def test_ring_buffer_keeps_the_last_entries(monkeypatch):
    monkeypatch.setenv("MINIDIST_LEDGER_SIZE", "16")
    g = ProcessGroup(LocalTransport())
    for _ in range(40):
        g.all_reduce(np.ones(2, np.float32))
    seqs = [e.seq for e in g.ledger.entries()]
    assert seqs == list(range(25, 41)) and g.ledger.counts() == {0: 40}


def test_get_ledger_and_auto_table_on_the_default_group(group):
    md.all_reduce(np.ones(3, np.float64))
    assert md.comm.get_ledger()[-1].describe() == "all_reduce(3 x float64, sum)"
    table = md.comm.auto_table()
    json.dumps(table)
    assert table["world_size"] == 1 and table["sizes"][0]["nbytes"] == 8
    assert set(table["sizes"][0]["plain"]) == {"algorithm", "reason", "predicted_us"}


def test_ledger_off_records_nothing_and_the_wire_is_the_same(monkeypatch):
    # The message tags (stream and call fingerprint) do not depend on who watches the calls:
    # the same program sends the same tags with the ledger on and off.
    def tags(ledger):
        monkeypatch.setenv("MINIDIST_LEDGER", ledger)
        world = ThreadWorld(2, timeout_s=20)

        def body(t):
            g = new_group_from_transport(t)
            g.all_reduce(np.ones(4, np.float32), algorithm="ring", tag=5)
            g.all_reduce(np.ones(3, np.float64), op="max", algorithm="tree")
            g.broadcast(np.ones(2, np.int32), src=1)
            g.barrier()
            return g.ledger.entries()

        entries = run_threads(2, body, world=world)
        return entries, [(src, dst, tag) for src, dst, tag, _ in world.log]

    on_entries, on = tags("1")
    off_entries, off = tags("0")
    assert off_entries == [[], []] and all(len(e) == 4 for e in on_entries)
    assert sorted(on) == sorted(off) and len(on) > 0
    assert all(has_fingerprint(tag) for *_, tag in off)  # fingerprinted with the ledger off
    assert {stream_of(tag) for *_, tag in off} == {0, 5}


def test_bad_stream_tag_is_a_value_error():
    g = ProcessGroup(LocalTransport())
    with pytest.raises(ValueError, match=r"tag=1024 is out of range.*\[0, 1024\)"):
        g.all_reduce(np.ones(2, np.float32), tag=1024)


# -- fingerprints ----------------------------------------------------------------------------

def test_fingerprint_changes_with_every_field():
    base = (3, "all_reduce", ReduceOp.SUM, np.dtype(np.float32), 1024, -1, "ring")
    fp = fingerprint(*base)
    assert fp == fingerprint(*base)
    for i, other in enumerate((4, "broadcast", ReduceOp.MAX, np.dtype(np.int32), 1023, 0,
                               "tree")):
        changed = list(base)
        changed[i] = other
        assert fingerprint(*changed) != fp, base[i]


def test_wire_tags_keep_the_stream_and_fit_the_tag_space():
    for fp in (0, 1, -1, 2 ** 63 - 1, -(2 ** 63), 123456789):
        tag = wire_tag(7, fp, 536870911)  # MPICH's MPI_TAG_UB here
        assert 0 < tag <= 536870911 and stream_of(tag) == 7 and has_fingerprint(tag)
    assert not has_fingerprint(7)


def test_a_call_is_tagged_by_wire_tag_exactly():
    # Calls.begin writes wire_tag's formula inline (it runs every call): the two stay equal
    from minidist.comm.calls import label_code
    for max_tag in (536870911, 32767, 2 ** 31 - 1):
        calls = Calls(max_tag)
        for stream in (0, 1, 7, 1023):
            for label in (None, "bucket=3", "iteration 41"):
                spec = call_spec("all_reduce", "all_reduce", stream + 5, np.dtype(np.float32),
                                 ReduceOp.SUM, -1, "ring")
                call = calls.begin(spec, stream, None, label)
                fp = hash((call.seq, spec.signature, label_code(label)))
                assert call.tag == wire_tag(stream, fp, max_tag), (max_tag, stream, label)


def test_messages_of_different_calls_carry_different_tags():
    world = ThreadWorld(2, timeout_s=20)

    def body(t):
        g = new_group_from_transport(t)
        for _ in range(3):
            g.all_reduce(np.ones(4, np.float32), algorithm="tree")

    run_threads(2, body, world=world)
    tags = [tag for src, _, tag, _ in world.log if src == 1]
    assert len(set(tags)) == 3 and all(stream_of(t) == 0 for t in tags)


def test_a_poll_suspicion_is_dropped_when_the_message_arrived_meanwhile(monkeypatch):
    # wait_until's contract: an error from poll() is raised only if one more test() fails; if
    # that test succeeds the wait returns at once (the request is complete: no second test).
    from minidist.comm.transports import base

    monkeypatch.setattr(base, "POLL_S", -1.0)  # poll on every turn of the loop
    results = iter([False, True])
    calls, polls = [], []

    def test():
        calls.append(1)
        return next(results)

    def poll():
        polls.append(1)
        return CollectiveMismatch("suspicion")

    base.wait_until(test, 5.0, lambda: AssertionError("timed out"), poll)
    assert (len(calls), len(polls)) == (2, 1)
    with pytest.raises(CollectiveMismatch, match="suspicion"):
        base.wait_until(lambda: False, 5.0, lambda: AssertionError("timed out"), poll)


# -- mismatches end fast on every rank, with the diagnosis ----------------------------------

@pytest.mark.parametrize("case,expect", [
    ("dtype", r"rank 1 called all_reduce\(8 x int32, sum\) as its collective #2 at "
              r"test_ledger.py:\d+; rank 0 called all_reduce\(8 x float32, sum\)"),
    ("op", r"rank 1 called all_reduce\(8 x float32, max\) as its collective #2"),
    ("count", r"rank 1 called all_reduce\(9 x float32, sum\) as its collective #2"),
    ("bcast", r"rank 1 called broadcast\(8 x float32, src=0\) as its collective #2 at "
              r"test_ledger.py:\d+; rank 0 called all_reduce\(8 x float32, sum\)"),
])
def test_mismatch_is_diagnosed_on_every_rank(case, expect):
    def body(g):
        g.all_reduce(np.ones(8, np.float32), algorithm="ring")  # #1 agrees
        x = np.ones(9 if case == "count" and g.rank == 1 else 8,
                    np.int32 if case == "dtype" and g.rank == 1 else np.float32)
        if case == "bcast" and g.rank == 1:
            g.broadcast(x, src=0)
        else:
            g.all_reduce(x, op="max" if case == "op" and g.rank == 1 else "sum",
                         algorithm="ring")

    errors = failure(2, body)
    for r, e in enumerate(errors):
        assert isinstance(e, CollectiveMismatch), (r, e)
        assert str(e).startswith(f"[rank {r}/2] ") and " #2: the ranks called different " in str(e)
        assert e.diagnosis["seq"] == 2 and e.diagnosis["kind"] == "mismatch"
        assert __import__("re").search(expect, str(e)), str(e)


def test_four_ranks_name_the_odd_one_and_the_others():
    # Rank 2 waits for rank 0's broadcast message, which never comes (rank 0 is in the ring):
    # found by the deadline, then the ledger exchange names rank 2's call and the others'.
    def body(g):
        x = np.ones(16, np.float32)
        if g.rank == 2:
            g.broadcast(x, src=0)
        else:
            g.all_reduce(x, algorithm="ring")

    for e in failure(4, body, timeout_s=1):
        assert "rank 2 called broadcast(16 x float32, src=0) as its collective #1" in str(e)
        assert "ranks 0, 1, 3 called all_reduce(16 x float32, sum)" in str(e)


def test_skipped_call_is_found_at_farewell_with_the_call_sites():
    def body(g):
        a, b = np.ones(4, np.float32), np.ones(4, np.float32)
        if g.rank != 1:
            g.all_reduce(a, algorithm="tree")  # rank 1 skips this one
        g.all_reduce(b, algorithm="tree")
        g.farewell()                             # what destroy_process_group does first

    errors = failure(2, body)
    for e in errors:
        assert isinstance(e, CollectiveMismatch), e
        text = str(e)
        assert "rank 1 made no collective #2 (last: #1, all_reduce(4 x float32, sum)" in text
        assert "is in destroy_process_group" in text
        assert "note: collective #1 ran at different lines on different ranks" in text
    assert "[rank 1/2] destroy_process_group" in str(errors[1])
    assert "[rank 0/2] all_reduce" in str(errors[0])


def test_extra_call_is_found_when_the_peer_says_goodbye():
    def body(g):
        g.all_reduce(np.ones(4, np.float32), algorithm="tree")
        if g.rank == 1:
            g.all_reduce(np.ones(4, np.float32), algorithm="tree")
        g.farewell()

    errors = failure(2, body)
    assert "rank 1 called all_reduce(4 x float32, sum) as its collective #2" in str(errors[1])
    assert "rank 0 made no collective #2" in str(errors[0])


def test_a_timeout_with_nothing_different_says_so():
    def body(g):
        if g.rank == 0:
            g.all_reduce(np.ones(4, np.float32), algorithm="tree")
        else:  # rank 1 arrives too late, in the same call, after rank 0's deadline
            import time

            from minidist.comm.transports.base import SIDE_FAIL
            while g.transport.side_channel.pending(SIDE_FAIL) is None:  # rank 0 has given up
                time.sleep(0.01)
            g.all_reduce(np.ones(4, np.float32), algorithm="tree")

    errors = failure(2, body, timeout_s=0.5)
    assert isinstance(errors[0], md.CommTimeout)
    assert "every rank called all_reduce(4 x float32, sum) as collective #1" in str(errors[0])
    assert "note:" not in str(errors[0])  # the sites differ, but that call never completed


def test_the_group_still_works_after_a_mismatch_every_rank_saw():
    def body(g):
        with pytest.raises(CollectiveMismatch):
            g.all_reduce(np.ones(8, np.int32 if g.rank else np.float32), algorithm="ring")
        x = np.full(8, g.rank + 1.0)
        g.all_reduce(x, algorithm="ring")
        return x

    assert [r.tolist() for r in on_threads(2, body)] == [[3.0] * 8] * 2


def test_dump_writes_json_on_failure_and_at_close(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDIST_LEDGER_DUMP", str(tmp_path))

    def body(g):
        g.all_reduce(np.ones(4, np.float32), algorithm="ring")
        try:
            g.all_reduce(np.ones(4, np.int32 if g.rank else np.float32), algorithm="ring")
        except CollectiveMismatch as e:
            return str(e)

    messages = on_threads(2, body)
    for r in range(2):
        data = json.loads((tmp_path / f"ledger_rank{r}.json").read_text())
        assert data["rank"] == r and [e["status"] for e in data["entries"]] == ["ok", "failed"]
        assert data["failure"]["seq"] == 2 and str(tmp_path) in messages[r]
    g = ProcessGroup(LocalTransport())
    g.all_reduce(np.ones(1))
    g.close()
    assert json.loads((tmp_path / "ledger_rank0.json").read_text())["counts"] == {"0": 1}


# -- the diagnosis itself (pure) ------------------------------------------------------------

def _report(rank, calls, state=None):
    entries = [{"seq": i + 1, "stream": 0, "collective": c, "op": "sum" if c == "all_reduce"
                else None, "dtype": "float32", "count": 1024, "root": 0 if c == "broadcast"
                else None, "algorithm": "ring", "label": None, "file": "/x/train.py",
                "line": line} for i, (c, line) in enumerate(calls)]
    return {"rank": rank, "state": state, "counts": {"0": len(calls)}, "entries": entries}


def test_diagnose_groups_ranks_and_orders_the_odd_one_first():
    ok = [("all_reduce", 10), ("all_reduce", 61)]
    odd = [("all_reduce", 10), ("broadcast", 57)]
    d = diagnose(0, {0: _report(0, ok), 1: _report(1, odd), 2: _report(2, ok),
                     3: _report(3, ok)})
    assert d["kind"] == "mismatch" and d["seq"] == 2
    assert d["text"] == ("rank 1 called broadcast(1024 x float32, src=0) as its collective #2 at "
                         "train.py:57; ranks 0, 2, 3 called all_reduce(1024 x float32, sum) at "
                         "train.py:61")


def test_diagnose_missing_ranks_and_agreeing_ones():
    calls = [("all_reduce", 5)]
    d = diagnose(0, {0: _report(0, calls), 1: _report(1, calls)},
                 {2: "is dead: its connection closed (it exited or crashed)"})
    assert d["kind"] == "missing" and d["text"].startswith("rank 2 is dead")
    assert "ranks 0, 1 are in collective #1, all_reduce(1024 x float32, sum) at train.py:5" in \
        d["text"]
    same = diagnose(0, {0: _report(0, calls), 1: _report(1, calls)})
    assert same["kind"] == "same" and "every rank called" in same["text"]


def test_diagnose_compares_only_what_every_rank_still_holds():
    long = _report(0, [("all_reduce", 1)] * 5)
    short = _report(1, [("all_reduce", 1)] * 5)
    short["entries"] = short["entries"][3:]  # rank 1's ring buffer dropped #1-#3
    short["entries"][-1]["count"] = 7
    d = diagnose(0, {0: long, 1: short})
    assert d["seq"] == 5 and "rank 1 called all_reduce(7 x float32, sum)" in d["text"]


def test_ledger_status_lifecycle():
    led = Ledger(0, 1)
    calls = Calls(1 << 40)
    calls.add(led)
    row = calls.begin(call_spec("barrier", "barrier", algorithm="dissemination"), 0)
    assert led.entries()[0].status == "running"
    calls.end(row)
    assert led.entries()[0].status == "ok"
    calls.failed(calls.begin(call_spec("barrier", "barrier", algorithm="x"), 0),
                 md.CommTimeout("t"))
    assert [e.status for e in led.entries()] == ["ok", "timeout"]


def test_auto_explains_itself_in_debug_mode(monkeypatch):
    monkeypatch.setenv("MINIDIST_DEBUG", "1")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("minidist.auto.select")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        def body(g):
            for _ in range(6):
                g.all_reduce(np.ones(256, np.float32))
        on_threads(2, body)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = [r.getMessage() for r in records if r.getMessage().startswith("auto: 1 KiB")]
    assert len(lines) == 2, lines  # once per rank for this size class
    assert "predicted" in lines[0] and "measured" in lines[0] and "cost model" in lines[0]
