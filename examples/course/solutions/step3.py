"""Reference solutions of step 3's tasks (docs/course.md, step 3). Check them with

    ./test.sh -m course_3
    COURSE_ANSWERS=mine ./test.sh -m course_3      # your answers in examples/course/exercises/
"""

import numpy as np

import minidist as md


def lr_for_sum(lr, n):
    """Task 3.1: the SUM of n rank gradients is n times their average: divide the step by n."""
    return lr / n


def broadcast_parameters(model, group):
    """Task 3.2: every rank takes rank 0's parameters (NaiveDataParallel's constructor does)."""
    for p in model.parameters():
        md.broadcast(p.array, src=0, group=group)


def average_uneven(grad, local_batch, group):
    """Task 3.3: ``grad`` (this rank's mean over ``local_batch`` samples) becomes the mean over
    every rank's samples: weight each rank's mean by its sample count, sum, divide by the total.
    """
    count = np.array([float(local_batch)])
    md.all_reduce(count, op="sum", group=group)
    grad *= local_batch / count[0]
    md.all_reduce(grad, op="sum", group=group)
