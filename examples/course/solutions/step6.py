"""Reference solutions of step 6's tasks (docs/course.md, step 6). Check them with

    ./test.sh -m course_6
    COURSE_ANSWERS=mine ./test.sh -m course_6      # your answers in examples/course/exercises/
"""

import ast

import minidist as md
from minidist import optim
from minidist.data import DataLoader, DistributedSampler, load_digits
from minidist.ddp import DistributedDataParallel


def accumulate(ddp, loss_fn, batches):
    """Task 6.1: the gradient of the mean loss over both micro-batches, one all-reduce round.

    The first backward runs under ``no_sync()`` (gradients only accumulate locally), the last
    one syncs; each loss is halved so the sum of the two backward passes is the gradient of
    the mean over both batches of equal size.
    """
    (x1, y1), (x2, y2) = batches
    with ddp.no_sync():
        (loss_fn(ddp(md.Tensor(x1)), md.Tensor(y1)) * 0.5).backward()
    (loss_fn(ddp(md.Tensor(x2)), md.Tensor(y2)) * 0.5).backward()


def algorithms_from_log(line):
    """Task 6.2: the algorithm of every bucket, read from DDP's construction log line
    ("DDP: 6 parameters (...) in 3 buckets [...], overlap=..., algorithm=auto ['ring', ...]")."""
    return list(ast.literal_eval(line[line.rindex("["):]))


def train_one_epoch(group, build):
    """Task 6.3: the 60-second tour's loop (README.md) on ``group``: one epoch of the digits'
    training set, this rank's shard; returns the parameters (identical on every rank)."""
    model = build()
    ddp = DistributedDataParallel(model, process_group=group)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = md.nn.CrossEntropyLoss()
    train = load_digits("train")
    sampler = DistributedSampler(train, num_replicas=group.size, rank=group.rank, seed=0)
    sampler.set_epoch(0)
    for x, y in DataLoader(train, batch_size=32, sampler=sampler):
        opt.zero_grad()
        loss_fn(ddp(md.Tensor(x)), y).backward()
        opt.step()
    ddp.close()
    return [p.array.copy() for p in model.parameters()]
