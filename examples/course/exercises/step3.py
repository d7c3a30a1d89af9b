"""Step 3's tasks: edit the functions below, then check your answers (docs/course.md, step 3):

    COURSE_ANSWERS=mine ./test.sh -m course_3              # every task of step 3
    COURSE_ANSWERS=mine ./test.sh -m course_3 -k task_3_1  # one task
"""

import minidist as md


def lr_for_sum(lr, n):
    """Task 3.1: step 3 with ``op="sum"`` instead of ``"avg"`` on n ranks. Which learning rate
    makes it train exactly like one process with learning rate ``lr`` on the whole batch?
    The check trains both ways (n = 2 and 3) and compares the weights."""
    return lr


def broadcast_parameters(model, group):
    """Task 3.2: here every rank built its model with a different seed (step 3's check then
    fails: the ranks train different models). Make every rank start from rank 0's parameters,
    in place, over ``group``. Which line of minidist/ddp/naive.py does this?"""


def average_uneven(grad, local_batch, group):
    """Task 3.3: rank 0 got ``B + 1`` samples, the others ``B``. ``grad`` (a NumPy array) is
    this rank's gradient of the MEAN loss over its ``local_batch`` samples. Turn it, in place,
    into the gradient of the mean loss over ALL ranks' samples (what one process would get).

    The code below is step 3's plain average: right only when every batch has the same size.
    """
    md.all_reduce(grad, op="avg", group=group)
