"""The course's tasks and their checks (docs/course.md): every exercise is a function to write.

    from course_tasks import TASKS, EXERCISES, SOLUTIONS, run_task
    run_task(TASKS[0], SOLUTIONS)      # returns quietly when the answer is right
    run_task(TASKS[0], EXERCISES)      # raises TaskFailed: expected / got / revisit

A task names a function (or a few) in ``examples/course/<folder>/step<N>.py``: the learner edits
``exercises/``, the reference answers live in ``solutions/``, and both are checked by the same
``check(module)`` below. A check runs the answer on thread ranks (``run_threads``: one process,
no MPI, a second or less on 2 cores) and compares it with what the course's own code or the
library does, never with the reference solution. A miss becomes a ``TaskFailed`` whose message
teaches: what was expected, what came back, and which idea of which step to revisit.
tests/test_course_tasks.py runs every check both ways (solution passes, stub fails with that
message); ``COURSE_ANSWERS=mine`` runs them on the learner's files instead.
"""

# ruff: noqa: B023  (each check's rank body is run by threads() inside the loop that made it)
from __future__ import annotations

import importlib.util
import logging
import math
import runpy
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from procs import REPO

COURSE = REPO / "examples" / "course"
EXERCISES = COURSE / "exercises"
SOLUTIONS = COURSE / "solutions"
TIMEOUT_S = 20  # per run_threads: an answer that deadlocks fails in seconds instead of hanging


class TaskFailed(AssertionError):
    """A task's check did not pass; the message says expected / got / revisit."""


class Miss(Exception):
    """Raised inside a check: what the answer should have given, and what it gave."""

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"expected {expected}, got {got}")
        self.expected, self.got = expected, got


@dataclass(frozen=True)
class Task:
    id: str          # "2.1"
    title: str
    functions: str   # what the learner writes, in step<N>.py
    expect: str      # what is expected, said when the answer raises instead of answering
    revisit: str
    check: Callable[[Any], None]

    @property
    def step(self) -> int:
        return int(self.id.split(".")[0])

    @property
    def name(self) -> str:  # the pytest id: -k task_2_1
        return "task_" + self.id.replace(".", "_")


TASKS: list[Task] = []


def task(id: str, title: str, functions: str, expect: str, revisit: str) -> Callable:
    def register(check: Callable[[Any], None]) -> Callable[[Any], None]:
        TASKS.append(Task(id, title, functions, expect, revisit, check))
        return check
    return register


def answers_dir(value: str) -> Path:
    """``COURSE_ANSWERS``: "mine" (examples/course/exercises), "solutions", or a folder."""
    if value == "mine":
        return EXERCISES
    if value == "solutions":
        return SOLUTIONS
    return Path(value).resolve()


def load(folder: Path, step: int) -> Any:
    """A fresh import of ``folder/step<N>.py`` (the learner may have just edited it)."""
    path = folder / f"step{step}.py"
    spec = importlib.util.spec_from_file_location(f"course_{folder.name}_step{step}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path}: no such file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def run_task(t: Task, folder: Path) -> None:
    """Check ``t`` against the answers in ``folder``; raise TaskFailed with the lesson."""
    path = folder / f"step{t.step}.py"
    try:
        t.check(load(folder, t.step))
    except Exception as e:  # noqa: BLE001 - any error of the answer is reported as a miss
        chain = [e]
        while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
            nxt = chain[-1].__cause__ or chain[-1].__context__
            if nxt in chain:
                break
            chain.append(nxt)
        miss = next((c for c in chain if isinstance(c, Miss)), None)
        if miss is not None:
            expected, got = miss.expected, miss.got
        else:
            root = chain[-1]
            where = [f for f in traceback.extract_tb(root.__traceback__)
                     if Path(f.filename).resolve() == path.resolve()]
            at = f" (at {_shown(path)}:{where[-1].lineno})" if where else ""
            expected, got = t.expect, f"{type(root).__name__}: {root}{at}"
            if isinstance(root, TimeoutError):  # run_threads' deadline: a rank never finished
                got += (" -- a rank waited for a message no rank sent (every recv needs its "
                        "send, in the same order on both sides)")
        raise TaskFailed(
            f"task {t.id} ({t.title}), {_shown(path)}: {t.functions}\n"
            f"  expected: {expected}\n  got:      {got}\n  revisit:  {t.revisit}") from e


# ------------------------------------------------------------------ helpers the checks share

def threads(n: int, body: Callable[[Any], Any]) -> list:
    """``body(transport)`` on n thread ranks; this process's own world is a one-rank ``local``
    group meanwhile (DDP asks for one), left as it was found."""
    from minidist import comm
    from minidist.comm.transports.threads import run_threads
    started = not comm.is_initialized()
    if started:
        comm.init_process_group(backend="local")
    try:
        return run_threads(n, body, timeout_s=TIMEOUT_S)
    finally:
        if started:
            comm.destroy_process_group()


def group_of(t: Any) -> Any:
    from minidist.comm import new_group_from_transport
    return new_group_from_transport(t)


_BUILD = threading.Lock()  # thread ranks share nn.manual_seed's generator: one build at a time


def build(widths: tuple, seed: int = 0) -> Any:
    """Linear layers of ``widths`` with ReLU between them, the same weights for the same seed."""
    from minidist import nn
    with _BUILD:
        nn.manual_seed(seed)
        layers: list = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers[:-1])


def loss_of(model: Any, x: np.ndarray, y: np.ndarray) -> Any:
    import minidist as md
    return md.nn.CrossEntropyLoss()(model(md.Tensor(x)), md.Tensor(y))


def grads(model: Any) -> list:
    return [p.grad.array.copy() for p in model.parameters()]


def params(model: Any) -> list:
    return [p.array.copy() for p in model.parameters()]


def data(rows: int, width: int, classes: int, seed: int = 1) -> tuple:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, width)).astype(np.float32),
            rng.integers(0, classes, rows))


def worst(a: list, b: list) -> str:
    """The largest difference between two lists of arrays, in words."""
    d = max((float(np.max(np.abs(x - y))) if x.size else 0.0) for x, y in zip(a, b))
    return f"largest difference {d:.3g}"


def close(a: list, b: list, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.allclose(x, y, rtol=rtol, atol=atol)
                                    for x, y in zip(a, b))


_STEPS: dict = {}


def step_code(name: str) -> dict:
    """The functions of a course step (examples/course/0*.py), as the step defines them."""
    if name not in _STEPS:
        _STEPS[name] = runpy.run_path(str(COURSE / name))
    return _STEPS[name]


def short(a: Any) -> str:
    return np.array2string(np.asarray(a), precision=6, threshold=8)


# ------------------------------------------------------------------ step 1

@task("1.1", "the naive all-reduce's cost per rank", "naive_cost(n, nbytes)",
      "(messages, bytes) one rank sends, e.g. naive_cost(3, 40) for 3 ranks of 40 bytes",
      "step 1: every rank sends its whole buffer (K bytes) once to each of the n-1 others")
def check_1_1(m: Any) -> None:
    from minidist.viz import Recorder
    naive = step_code("01_send_recv.py")["naive_all_reduce"]
    for n in (1, 2, 3, 4):
        for numel in (10, 1000):
            rec = Recorder()
            threads(n, lambda t: naive(rec.wrap(t), np.ones(numel, np.float32)))
            sent = rec.sent_by(0)
            measured = (len(sent), sum(s.nbytes for s in sent))
            got = m.naive_cost(n, 4 * numel)
            if tuple(got) != measured:
                raise Miss(f"naive_cost({n}, {4 * numel}) == {measured} (a recorded run: "
                           f"rank 0 sent {measured[0]} messages, {measured[1]} bytes)", repr(got))


@task("1.2", "adding in arrival order", "arrival_order_all_reduce(t, buf), rows_that_disagree()",
      "each rank's running sum in arrival order, and rows on which two ranks' sums differ",
      "step 1: the rows are summed in rank order 'so every rank gets the same bits'; float "
      "addition is not associative ((a + b) + c may differ from (a + c) + b)")
def check_1_2(m: Any) -> None:
    n = 3

    def arrival(rows: np.ndarray, r: int) -> np.ndarray:
        total = rows[r].copy()
        for s in range(1, n):
            total = total + rows[(r - s) % n]
        return total

    def run(rows: np.ndarray) -> list:
        def body(t: Any) -> np.ndarray:
            buf = rows[t.rank].copy()
            m.arrival_order_all_reduce(t, buf)
            return buf
        return threads(n, body)

    probe = np.array([[1e8, 1.0], [1.0, 2.0], [-1e8, 3.0]], np.float32)
    for r, got in enumerate(run(probe)):
        if not np.array_equal(got, arrival(probe, r)):
            raise Miss(f"rank {r} of 3, rows {probe.tolist()}: its own row, then the rows of "
                       f"ranks {(r - 1) % n} and {(r - 2) % n}, added as they arrive: "
                       f"{short(arrival(probe, r))}",
                       f"{short(got)} (rank order gives {short(probe.sum(axis=0))})")
    rows = np.asarray(m.rows_that_disagree())
    if rows.dtype != np.float32 or rows.ndim != 2 or rows.shape[0] != 3 or rows.shape[1] < 1:
        raise Miss("rows_that_disagree() to return a float32 array of shape (3, k)",
                   f"dtype {rows.dtype}, shape {rows.shape}")
    got = run(rows)
    if all(np.array_equal(g, got[0]) for g in got):
        raise Miss("rows for which two of the 3 ranks end with different bits",
                   f"rows {short(rows)}: every rank computed {short(got[0])}")


@task("1.3", "the direct all-reduce through rank 0", "direct_all_reduce(t, buf), root_messages(n)",
      "direct_all_reduce leaving the sum on every rank, and root_messages(n) == (sent, received)",
      "step 1's naive all-reduce and docs/algorithms.md, 'direct (the oracle)': every rank "
      "sends to rank 0, which adds in rank order and sends the sum back")
def check_1_3(m: Any) -> None:
    from minidist.viz import Recorder
    for n in (1, 2, 3, 4):
        world = np.random.default_rng(n).normal(size=(n, 7)).astype(np.float32)
        rec = Recorder()

        def body(t: Any) -> np.ndarray:
            buf = world[t.rank].copy()
            m.direct_all_reduce(rec.wrap(t, watch=buf), buf)
            return buf

        got = threads(n, body)
        for r in range(n):
            if not np.allclose(got[r], world.sum(axis=0), rtol=1e-6, atol=1e-6):
                raise Miss(f"rank {r} of {n} to hold the sum {short(world.sum(axis=0))}",
                           short(got[r]))
            if not np.array_equal(got[r], got[0]):
                raise Miss("the same bits on every rank (rank 0 adds, the others copy)",
                           f"rank {r} holds {short(got[r])}, rank 0 {short(got[0])}")
        measured = (len(rec.sent_by(0)), sum(1 for msg in rec.messages if msg.dst == 0))
        for r in range(1, n):
            if len(rec.sent_by(r)) != 1:
                raise Miss(f"rank {r} of {n} to send one message (its buffer, to rank 0)",
                           f"{len(rec.sent_by(r))} messages")
        pred = m.root_messages(n)
        if tuple(pred) != measured:
            raise Miss(f"root_messages({n}) == {measured} (recorded: rank 0 sent "
                       f"{measured[0]}, received {measured[1]})", repr(pred))


# ------------------------------------------------------------------ step 2

@task("2.1", "the ring for any count", "ring_all_reduce(t, buf)",
      "the sum of every rank's buffer on every rank, for any number of elements",
      "step 2: cut the buffer into n chunks whose sizes differ by at most one (some empty when "
      "the count is below n); the receive buffer fits the largest chunk")
def check_2_1(m: Any) -> None:
    for n in (1, 2, 3, 4):
        world = np.random.default_rng(n).normal(size=(n, 13))
        for numel in sorted({0, 1, n - 1, n, n + 1, 13}):
            def body(t: Any) -> np.ndarray:
                buf = world[t.rank, :numel].copy()
                m.ring_all_reduce(t, buf)
                return buf

            want = world[:, :numel].sum(axis=0)
            for r, got in enumerate(threads(n, body)):
                if not np.allclose(got, want, rtol=1e-12, atol=1e-12):
                    raise Miss(f"rank {r} of {n} with {numel} elements to hold {short(want)}",
                               short(got))


@task("2.2", "reduce-scatter and all-gather apart", "reduce_scatter(t, buf), all_gather(t, buf)",
      "after reduce_scatter, chunk (r+1) % n of rank r holds the full sum; after all_gather, "
      "every chunk does",
      "step 2: n-1 reduce-scatter steps (send chunk (r-s)%n right, add chunk (r-s-1)%n from the "
      "left), then n-1 all-gather steps that copy instead of add")
def check_2_2(m: Any) -> None:
    from minidist.viz import Recorder
    for n in (2, 3, 4):
        for per in (1, 3):
            world = np.random.default_rng(n).normal(size=(n, n * per))
            total = world.sum(axis=0)
            halves = Recorder(), Recorder()

            def body(t: Any) -> tuple:
                buf = world[t.rank].copy()
                m.reduce_scatter(halves[0].wrap(t), buf)
                after = buf.copy()
                m.all_gather(halves[1].wrap(t), buf)
                return after, buf

            results = threads(n, body)
            for name, rec in zip(("reduce_scatter", "all_gather"), halves):
                if len(rec.sent_by(0)) != n - 1:
                    raise Miss(f"{name} on {n} ranks to send n-1 = {n - 1} messages per rank "
                               "(half of the ring's 2(n-1))",
                               f"rank 0 sent {len(rec.sent_by(0))}")
            for r, (after, buf) in enumerate(results):
                c = (r + 1) % n
                mine = after.reshape(n, -1)[c]
                if not np.allclose(mine, total.reshape(n, -1)[c], rtol=1e-12, atol=1e-12):
                    raise Miss(f"after reduce_scatter on rank {r} of {n} ({n * per} elements), "
                               f"chunk {c} = {short(total.reshape(n, -1)[c])}", short(mine))
                if not np.allclose(buf, total, rtol=1e-12, atol=1e-12):
                    raise Miss(f"after all_gather on rank {r} of {n}, the whole sum "
                               f"{short(total)}", short(buf))


@task("2.3", "counting the ring's and recursive doubling's steps",
      "ring_messages_per_rank(n), predicted_steps(algorithm, n)",
      "the ring's messages per rank and the recorded steps of 'ring' and 'rd' as formulas in n",
      "step 2 (2(n-1) messages per rank, each step waiting on the previous one) and "
      "minidist/comm/algorithms/recursive_doubling.py (log2 p steps; the fold and unfold when "
      "n is not a power of two p)")
def check_2_3(m: Any) -> None:
    from minidist.viz import record
    for n in (2, 3, 4, 5, 8):
        rec = record("ring", n)
        sent = len(rec.sent_by(0))
        if m.ring_messages_per_rank(n) != sent:
            raise Miss(f"ring_messages_per_rank({n}) == {sent} (recorded)",
                       repr(m.ring_messages_per_rank(n)))
        for algorithm in ("ring", "rd"):
            steps = record(algorithm, n, numel=8).steps()
            got = m.predicted_steps(algorithm, n)
            if got != steps:
                raise Miss(f"predicted_steps({algorithm!r}, {n}) == {steps} "
                           f"(minidist.viz.record({algorithm!r}, {n}).steps())", repr(got))


# ------------------------------------------------------------------ step 3

def _train_sum(n: int, lr: float, steps: int = 2, B: int = 4) -> list:
    """Step 3's loop on n thread ranks with op="sum"; returns rank 0's parameters."""
    import minidist as md
    from minidist import optim
    x, y = data(steps * n * B, 8, 4)
    x, y = x.reshape(steps, n * B, 8), y.reshape(steps, n * B)

    def body(t: Any) -> list:
        g, r = group_of(t), t.rank
        model = build((8, 16, 4))
        opt = optim.SGD(model.parameters(), lr=lr)
        for s in range(steps):
            loss_of(model, x[s, r * B:(r + 1) * B], y[s, r * B:(r + 1) * B]).backward()
            for p in model.parameters():
                md.all_reduce(p.grad, op="sum", algorithm="ring", group=g)
            opt.step()
            opt.zero_grad()
        return params(model)

    return threads(n, body)[0]


def _train_one(lr: float, n: int, steps: int = 2, B: int = 4) -> list:
    from minidist import optim
    x, y = data(steps * n * B, 8, 4)
    x, y = x.reshape(steps, n * B, 8), y.reshape(steps, n * B)
    model = build((8, 16, 4))
    opt = optim.SGD(model.parameters(), lr=lr)
    for s in range(steps):
        loss_of(model, x[s], y[s]).backward()
        opt.step()
        opt.zero_grad()
    return params(model)


@task("3.1", "summing instead of averaging", "lr_for_sum(lr, n)",
      "the learning rate that makes op='sum' train like one process",
      "step 3: the mean loss makes the AVERAGE of the n rank gradients the one-process "
      "gradient; the SUM is n times larger")
def check_3_1(m: Any) -> None:
    for n in (2, 3):
        lr = m.lr_for_sum(0.1, n)
        got, want = _train_sum(n, float(lr)), _train_one(0.1, n)
        if not close(got, want, rtol=1e-4, atol=1e-6):
            raise Miss(f"{n} ranks summing with lr_for_sum(0.1, {n}) to end with the weights of "
                       "one process with lr 0.1 after 2 steps",
                       f"lr_for_sum(0.1, {n}) = {lr!r}: the weights differ, {worst(got, want)}")


@task("3.2", "ranks that start from different weights", "broadcast_parameters(model, group)",
      "every rank holding rank 0's parameters, bit for bit",
      "step 3 ('every rank builds the same model') and the constructor of NaiveDataParallel "
      "(minidist/ddp/naive.py), which broadcasts rank 0's parameters")
def check_3_2(m: Any) -> None:
    def body(t: Any) -> list:
        model = build((8, 16, 4), seed=t.rank)  # a different seed on every rank
        m.broadcast_parameters(model, group_of(t))
        return params(model)

    rank0 = params(build((8, 16, 4), seed=0))
    for r, got in enumerate(threads(3, body)):
        if not all(np.array_equal(a, b) for a, b in zip(got, rank0)):
            raise Miss(f"rank {r} of 3 (built with seed {r}) to hold rank 0's parameters",
                       f"its own: {worst(got, rank0)} from rank 0's")


@task("3.3", "an uneven batch", "average_uneven(grad, local_batch, group)",
      "each gradient turned into the gradient of the mean over all ranks' samples",
      "step 3: the average of n means is the global mean only when every rank has the same "
      "number of samples; weight each rank's mean by its count")
def check_3_3(m: Any) -> None:
    B = 3
    for n in (2, 3):
        counts = [B + 1] + [B] * (n - 1)
        start = np.cumsum([0] + counts)
        x, y = data(int(start[-1]), 8, 4)

        def body(t: Any) -> list:
            g, r = group_of(t), t.rank
            model = build((8, 16, 4))
            loss_of(model, x[start[r]:start[r + 1]], y[start[r]:start[r + 1]]).backward()
            for p in model.parameters():
                m.average_uneven(p.grad.array, counts[r], g)
            return grads(model)

        one = build((8, 16, 4))
        loss_of(one, x, y).backward()
        got, want = threads(n, body)[0], grads(one)
        if not close(got, want):
            raise Miss(f"with batches {counts} on {n} ranks, the gradient of one process over all "
                       f"{start[-1]} samples", f"another gradient, {worst(got, want)}")


# ------------------------------------------------------------------ step 4

STEP4_SIZES = [40, 2560] + [256, 16384] * 12  # 04_buckets.py's model, in backward order (bytes)


def _plan(sizes: list, cap: int) -> list:
    buckets: list = [[]]
    size = 0
    for i, nbytes in enumerate(sizes):
        if buckets[-1] and size + nbytes > cap:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


@task("4.1", "the bucketed all-reduce in the alpha-beta model",
      "allreduce_time_model(sizes, cap_bytes, n, alpha_us, beta_us_per_byte)",
      "(buckets, microseconds) of step 4's bucketed ring all-reduces",
      "step 4 (the buckets: a new one when the next gradient would exceed the cap) and step 2's "
      "ring cost, 2(n-1) alpha + 2K(n-1)/n beta per bucket of K bytes")
def check_4_1(m: Any) -> None:
    alpha, beta = 25.0, 5e-4  # illustrative constants: 25 us per message, 2 GB/s
    for n in (2, 4):
        for kb in (4, 16, 64, 256, 1024):
            plan = _plan(STEP4_SIZES, kb * 1024)
            want_us = sum(2 * (n - 1) * alpha + 2 * sum(STEP4_SIZES[i] for i in b) * (n - 1) / n
                          * beta for b in plan)
            got = m.allreduce_time_model(list(STEP4_SIZES), kb * 1024, n, alpha, beta)
            count, us = got
            if count != len(plan) or not math.isclose(us, want_us, rel_tol=1e-9):
                raise Miss(f"step 4's model at n={n}, cap {kb} KiB, alpha {alpha} us, beta "
                           f"{beta} us/B: ({len(plan)} buckets, {want_us:.2f} us)", repr(got))


@task("4.2", "gradients as views into their bucket", "grads_into_buckets(params, cap_bytes)",
      "one flat buffer per bucket, every p.grad a view into it, backward writing straight there",
      "step 4 (the copies in and out of the bucket) and minidist/ddp/bucket.py (Bucket.views): "
      "a view shares the bucket's memory, so backward's in-place add lands in the bucket")
def check_4_2(m: Any) -> None:
    import minidist as md
    n, B, cap, widths = 2, 4, 1024, (16, 16, 16, 4)
    x, y = data(n * B, 16, 4)

    def body(t: Any) -> Any:
        g, r = group_of(t), t.rank
        model = build(widths)
        ps = list(model.parameters())
        flats = list(m.grads_into_buckets(ps, cap))
        names = [name for name, _ in model.named_parameters()]
        for name, p in zip(names, ps):
            if p.grad is None or not any(np.shares_memory(p.grad.array, f) for f in flats):
                return f"p.grad of {name!r} is {'None' if p.grad is None else 'not a view'}"
        if [f.size for f in flats] != [sum(ps[::-1][i].array.size for i in b)
                                       for b in _plan([p.array.nbytes for p in ps[::-1]], cap)]:
            return f"buffers of {[f.size for f in flats]} elements, not step 4's buckets"
        loss_of(model, x[r * B:(r + 1) * B], y[r * B:(r + 1) * B]).backward()
        for name, p in zip(names, ps):
            if not any(np.shares_memory(p.grad.array, f) for f in flats):
                return f"after backward, p.grad of {name!r} is not in a bucket"
        for f in flats:
            md.all_reduce(f, op="avg", group=g)
        return grads(model)

    got = threads(n, body)[0]
    if isinstance(got, str):
        raise Miss("every p.grad a view into the buffer of step 4's bucket, before and after "
                   "backward", got)
    one = build(widths)
    loss_of(one, x, y).backward()
    if not close(got, grads(one)):
        raise Miss("the averaged buckets to hold the one-process gradients",
                   f"other values, {worst(got, grads(one))}")


# ------------------------------------------------------------------ step 5

STEP5_WIDTHS = (64, 64, 64, 64, 10)


@task("5.1", "what is left to overlap", "predict_launches(sizes, cap_bytes)",
      "for each bucket, the gradients backward still has to compute when it is launched",
      "step 5: a bucket goes when its last gradient is ready; the last bucket (the first "
      "layers) waits for the end of backward, so one bucket has nothing to hide behind")
def check_5_1(m: Any) -> None:
    reducer_class = step_code("05_overlap.py")["BucketReducer"]
    x, y = data(8, 64, 10)
    for kb in (8, 20, 64, 4096):
        def body(t: Any) -> list:
            g = group_of(t)
            model = build(STEP5_WIDTHS)
            ps = list(model.parameters())
            reducer = reducer_class(ps, kb * 1024, True, g)
            fired, seen = [0], []

            def after(p: Any) -> None:  # registered after the reducer's hook: runs after it
                fired[0] += 1
                while len(seen) < len(reducer.launched):
                    seen.append(len(ps) - fired[0])

            for p in ps:
                p.register_post_accumulate_grad_hook(after)
            loss_of(model, x[t.rank * 4:(t.rank + 1) * 4], y[t.rank * 4:(t.rank + 1) * 4]
                    ).backward()
            reducer.finish()
            reducer.comm.shutdown()
            return [p.array.nbytes for p in reversed(ps)], seen

        sizes, measured = threads(2, body)[0]
        got = m.predict_launches(list(sizes), kb * 1024)
        if list(got) != measured:
            raise Miss(f"predict_launches(sizes, {kb} KiB) == {measured} (step 5's reducer, "
                       f"counted: {len(measured)} buckets)", repr(got))


@task("5.2", "when each bucket goes, measured", "launch_fractions(model, x, y, cap_bytes)",
      "one fraction of backward's time per bucket, in [0, 1], in launch order",
      "step 5: register_post_accumulate_grad_hook fires as each gradient is complete; time "
      "backward() and note the moment each bucket's last gradient arrives")
def check_5_2(m: Any) -> None:
    x, y = data(32, 64, 10)
    cap = 20 * 1024
    model = build(STEP5_WIDTHS)
    nbuckets = len(_plan([p.array.nbytes for p in reversed(list(model.parameters()))], cap))
    got = [float(f) for f in m.launch_fractions(model, x, y, cap)]
    if len(got) != nbuckets:
        raise Miss(f"{nbuckets} fractions (step 5's buckets of <= 20 KiB on this model)",
                   f"{len(got)}: {got}")
    if any(not 0.0 <= f <= 1.0 for f in got) or got != sorted(got):
        raise Miss("fractions between 0 and 1, in launch order (never decreasing)", repr(got))
    # (The values are this machine's; no check pins them. The first tells how much of backward
    # was left to hide the first all-reduce behind.)


@task("5.3", "two communication threads", "predict_swapped(a0, b0, a1, b1)",
      "rank 0's (a, b) after it reduces a then b while rank 1 reduces b then a",
      "step 5: ONE comm thread keeps the buckets in the same order on every rank; a message is "
      "matched by its source and tag, not by which bucket it carries (the library folds a "
      "fingerprint of each call into its tag: docs/algorithms.md, 'Errors and the cross-rank "
      "check')")
def check_5_3(m: Any) -> None:
    naive = step_code("01_send_recv.py")["naive_all_reduce"]
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(2, 5)), rng.normal(size=(2, 5))

    def body(t: Any) -> tuple:
        mine_a, mine_b = a[t.rank].copy(), b[t.rank].copy()
        for buf in ((mine_a, mine_b) if t.rank == 0 else (mine_b, mine_a)):
            naive(t, buf)
        return mine_a, mine_b

    ran = threads(2, body)[0]
    got = m.predict_swapped(a[0].copy(), b[0].copy(), a[1].copy(), b[1].copy())
    if len(got) != 2 or not close([np.asarray(g) for g in got], list(ran), 1e-12, 1e-12):
        raise Miss(f"what the run left on rank 0: a = {short(ran[0])}, b = {short(ran[1])} "
                   f"(a0 + a1 would be {short(a[0] + a[1])})",
                   f"a = {short(got[0])}, b = {short(got[1])}" if len(got) == 2 else repr(got))


# ------------------------------------------------------------------ step 6

@task("6.1", "gradient accumulation with no_sync", "accumulate(ddp, loss_fn, batches)",
      "the gradient of the mean loss over both micro-batches, one all-reduce per bucket",
      "step 6 and DistributedDataParallel.no_sync() (minidist/ddp/ddp.py): inside it backward "
      "only accumulates; the mean over two equal micro-batches is half of each loss")
def check_6_1(m: Any) -> None:
    from minidist.ddp import DistributedDataParallel
    from minidist.ddp.hooks import avg_allreduce_hook
    n, B, widths = 2, 4, (8, 16, 4)
    x, y = data(n * 2 * B, 8, 4)
    x, y = x.reshape(n, 2, B, 8), y.reshape(n, 2, B)

    def body(t: Any) -> tuple:
        r = t.rank
        ddp = DistributedDataParallel(build(widths), process_group=group_of(t))
        calls = [0]

        def counting(state: Any, bucket: Any) -> None:
            calls[0] += 1
            avg_allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, counting)
        import minidist as md
        m.accumulate(ddp, md.nn.CrossEntropyLoss(), [(x[r, 0], y[r, 0]), (x[r, 1], y[r, 1])])
        out = grads(ddp.module), calls[0], len(ddp.buckets)
        ddp.close()
        return out

    got, calls, nbuckets = threads(n, body)[0]
    one = build(widths)
    loss_of(one, x.reshape(-1, 8), y.reshape(-1)).backward()
    if calls != nbuckets:
        raise Miss(f"one all-reduce per bucket for the two micro-batches ({nbuckets})",
                   f"{calls} bucket all-reduces")
    if not close(got, grads(one)):
        raise Miss("the gradient of one backward over both micro-batches of both ranks",
                   f"another gradient, {worst(got, grads(one))}")


@task("6.2", "which algorithm each bucket runs", "algorithms_from_log(line)",
      "the list of bucket algorithms read from DDP's 'DDP: ...' log line",
      "step 6 and docs/algorithms.md ('auto' picks per bucket size); DDP logs its buckets and "
      "their algorithms when it is built (MINIDIST_DEBUG=1 shows the line)")
def check_6_2(m: Any) -> None:
    from minidist.ddp import DistributedDataParallel
    lines: list = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("DDP:"):
                lines.append(record.getMessage())

    logger = logging.getLogger("minidist.ddp.ddp")
    old = logger.level, logger.propagate
    keep = Keep()
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        def body(t: Any) -> list:
            ddp = DistributedDataParallel(build((32, 256, 64, 10)), process_group=group_of(t),
                                          bucket_cap_mb=0.05, first_bucket_cap_mb=0.001)
            out = list(ddp.bucket_algorithms)
            ddp.close()
            return out

        algorithms = threads(2, body)[0]
    finally:
        logger.removeHandler(keep)
        logger.setLevel(old[0])
        logger.propagate = old[1]
    if not lines:
        raise Miss("DDP's construction log line", "none was logged (the check needs it)")
    got = m.algorithms_from_log(lines[0])
    if list(got) != algorithms:
        raise Miss(f"{algorithms} from the line {lines[0]!r}", repr(got))


def _digits_model() -> Any:
    return build((64, 32, 10))


@task("6.3", "the main job's loop with DDP", "train_one_epoch(group, build)",
      "every rank's parameters after one epoch: identical, and those of one process trained on "
      "both ranks' batches",
      "step 6 (DistributedDataParallel in one line) and README.md, 'A 60-second tour': the "
      "model wrapped in DDP, DistributedSampler giving each rank its shard")
def check_6_3(m: Any) -> None:
    from minidist import optim
    from minidist.data import DataLoader, DistributedSampler, load_digits
    n = 2
    got = threads(n, lambda t: [np.asarray(p) for p in m.train_one_epoch(group_of(t),
                                                                         _digits_model)])
    for r in range(1, n):
        if not all(np.array_equal(a, b) for a, b in zip(got[r], got[0])):
            raise Miss("the same parameters on every rank, bit for bit (DDP averages the "
                       "gradients, so every rank takes the same step)",
                       f"rank {r}'s differ from rank 0's, {worst(got[r], got[0])}")
    train = load_digits("train")  # the oracle: one process, each step on both ranks' batches
    loaders = [DataLoader(train, batch_size=32,
                          sampler=DistributedSampler(train, num_replicas=n, rank=r, seed=0))
               for r in range(n)]
    model = _digits_model()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for batches in zip(*loaders):
        opt.zero_grad()
        loss_of(model, np.concatenate([b[0] for b in batches]),
                np.concatenate([b[1] for b in batches])).backward()
        opt.step()
    if not close(got[0], params(model), rtol=1e-4, atol=1e-5):
        raise Miss("the parameters of one process trained on both ranks' batches of 32 (SGD, "
                   "lr 0.1, momentum 0.9, one epoch, DistributedSampler seed 0)",
                   f"other parameters, {worst(got[0], params(model))}")


# ------------------------------------------------------------------ step 7

@task("7.1", "a new all-reduce algorithm through the registry", "make_entry()",
      "an Algorithm named 'course_ring' that all_reduce runs and 'auto' weighs and picks",
      "step 7 and minidist/comm/algorithms/registry.py (an entry: run, cost, constants); "
      "docs/layout.md, '(b) A new all-reduce algorithm'; select.register adds it at run time")
def check_7_1(m: Any) -> None:
    from minidist.auto import select
    from minidist.comm.algorithms import ALGORITHMS, Algorithm
    entry = m.make_entry()
    if not isinstance(entry, Algorithm) or entry.name != "course_ring":
        raise Miss("an Algorithm (minidist.comm.algorithms.registry) named 'course_ring'",
                   repr(entry))
    saved = (dict(ALGORITHMS), dict(select.MODEL), dict(select.COST), list(select.CANDIDATES))
    try:
        select.register(entry)
        for n in (2, 3):
            def body(t: Any) -> tuple:
                g = group_of(t)
                out = []
                for numel in (0, 1, n + 1, 1000):
                    for op in ("sum", "avg"):
                        buf = (np.arange(numel) % 7 + t.rank).astype(np.float32)
                        g.all_reduce(buf, op=op, algorithm="course_ring")
                        out.append((numel, op, buf))
                plan = g.plan_all_reduce(np.zeros(1 << 18, np.float32))
                return out, plan.algorithm, plan.reason, g.auto_table()["candidates"]

            results, chosen, reason, candidates = threads(n, body)[0]
            for numel, op, buf in results:
                want = sum((np.arange(numel) % 7 + r) for r in range(n)).astype(np.float32)
                want = want / n if op == "avg" else want
                if not np.allclose(buf, want, rtol=1e-6):
                    raise Miss(f"all_reduce(op={op!r}, algorithm='course_ring') on {n} ranks, "
                               f"{numel} elements: {short(want)}", short(buf))
            if "course_ring" not in candidates:
                raise Miss("'course_ring' among auto's candidates (auto_table()['candidates'])",
                           f"{candidates} (candidate=False? no cost=?)")
            if n == 2 and chosen != "course_ring":
                raise Miss("auto to pick 'course_ring' for 1 MiB at n=2 (its model cheaper "
                           "than the others')", f"auto picked {chosen!r}: {reason}")
    finally:
        ALGORITHMS.clear()
        ALGORITHMS.update(saved[0])
        select.MODEL.clear()
        select.MODEL.update(saved[1])
        select.COST.clear()
        select.COST.update(saved[2])
        select.CANDIDATES[:] = saved[3]
        select.load_model({})  # expire memoized choices


@task("7.2", "a comm hook", "norm_recording_hook(state, bucket)",
      "state[bucket.index] = this rank's gradient norm of the bucket, and the bucket averaged",
      "step 7 and minidist/ddp/hooks.py: a hook must leave bucket.buffer holding the average "
      "over ranks (allreduce_hook: divide by bucket.divisor, bucket.all_reduce(..., 'sum'))")
def check_7_2(m: Any) -> None:
    from minidist.ddp import DistributedDataParallel
    n, B, widths = 2, 4, (16, 64, 64, 4)
    x, y = data(n * B, 16, 4)

    def body(t: Any) -> tuple:
        r = t.rank
        local = build(widths)
        loss_of(local, x[r * B:(r + 1) * B], y[r * B:(r + 1) * B]).backward()
        by_name = {name: p.grad.array for name, p in local.named_parameters()}
        ddp = DistributedDataParallel(build(widths), process_group=group_of(t),
                                      bucket_cap_mb=0.02, first_bucket_cap_mb=0.005)
        state: dict = {}
        ddp.register_comm_hook(state, m.norm_recording_hook)
        loss_of(ddp, x[r * B:(r + 1) * B], y[r * B:(r + 1) * B]).backward()
        want = {b.index: float(np.sqrt(sum(float(np.sum(by_name[nm].astype(np.float64) ** 2))
                                          for nm in b.names))) for b in ddp.buckets}
        out = grads(ddp.module), dict(state), want
        ddp.close()
        return out

    got, state, want = threads(n, body)[0]
    one = build(widths)
    loss_of(one, x, y).backward()
    if not close(got, grads(one)):
        raise Miss("the gradients averaged over the ranks (the hook's contract)",
                   f"other gradients, {worst(got, grads(one))}")
    if sorted(state) != sorted(want) or not all(
            math.isclose(float(state[i]), want[i], rel_tol=1e-5) for i in want):
        raise Miss(f"state == {{bucket index: local norm}} = "
                   f"{ {i: round(v, 6) for i, v in want.items()} }", repr(state))
