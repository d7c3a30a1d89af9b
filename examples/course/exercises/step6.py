"""Step 6's tasks: edit the functions below, then check your answers (docs/course.md, step 6):

    COURSE_ANSWERS=mine ./test.sh -m course_6              # every task of step 6
    COURSE_ANSWERS=mine ./test.sh -m course_6 -k task_6_1  # one task
"""

import minidist as md


def accumulate(ddp, loss_fn, batches):
    """Task 6.1: gradient accumulation. ``batches`` holds two micro-batches ``(x, y)`` of the
    same size (NumPy arrays); ``ddp`` is a ``DistributedDataParallel``. Leave in every
    ``p.grad`` the gradient of the mean loss over BOTH micro-batches (what one backward over
    their concatenation gives), averaged over the ranks, with ONE all-reduce per bucket: wrap
    the first backward in ``ddp.no_sync()``. The check counts the all-reduces.

    The code below runs two plain backward passes: twice the reductions, twice the gradient.
    """
    for x, y in batches:
        loss_fn(ddp(md.Tensor(x)), md.Tensor(y)).backward()


def algorithms_from_log(line):
    """Task 6.2: run ``MINIDIST_DEBUG=1 ./mpirun.sh -n 2 python examples/course/06_ddp.py``
    and find the line DDP logs when it is built ("DDP: ... buckets ..."). Return the list of
    algorithm names it gives, one per bucket, read from ``line`` (such a line)."""
    return []


def train_one_epoch(group, build):
    """Task 6.3: the main job's loop with DDP: ``model = build()`` (the same weights on every
    rank), wrap it in ``DistributedDataParallel`` over ``group``, and train one epoch of
    ``minidist.data.load_digits("train")`` with ``DistributedSampler`` (``num_replicas=
    group.size, rank=group.rank``), ``DataLoader`` (batch 32), ``CrossEntropyLoss`` and SGD
    (lr 0.1, momentum 0.9); ``close()`` the DDP. Return ``[p.array.copy() for p in
    model.parameters()]``: every rank must end with the same bits, trained on its own shard.
    README.md, "A 60-second tour", is this loop for a launched job.

    The code below trains the plain model on this rank's shard: the ranks drift apart.
    """
    from minidist import optim
    from minidist.data import DataLoader, DistributedSampler, load_digits
    model = build()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train = load_digits("train")
    sampler = DistributedSampler(train, num_replicas=group.size, rank=group.rank, seed=0)
    for x, y in DataLoader(train, batch_size=32, sampler=sampler):
        opt.zero_grad()
        md.nn.CrossEntropyLoss()(model(md.Tensor(x)), y).backward()
        opt.step()
    return [p.array.copy() for p in model.parameters()]
