"""Step 5's tasks: edit the functions below, then check your answers (docs/course.md, step 5):

    COURSE_ANSWERS=mine ./test.sh -m course_5              # every task of step 5
    COURSE_ANSWERS=mine ./test.sh -m course_5 -k task_5_1  # one task
"""


def predict_launches(sizes, cap_bytes):
    """Task 5.1: step 5's ``BucketReducer`` launches a bucket the moment its last gradient is
    ready. ``sizes``: the gradients' bytes in the order backward completes them (the reverse
    parameter order, which is also the bucket order). For each bucket, in launch order,
    return how many gradients backward has STILL to compute when it is launched: the work
    that bucket's all-reduce can hide behind. The check runs step 5's reducer and counts.
    What is left to overlap with ``--bucket-kb 4096`` (one bucket)?
    """
    raise NotImplementedError("task 5.1: gradients still to come at each bucket's launch")


def launch_fractions(model, x, y, cap_bytes):
    """Task 5.2: measure it. Form step 5's buckets (reverse parameter order, ``cap_bytes``),
    register a post-accumulate-grad hook on every parameter, run forward and
    ``CrossEntropyLoss`` on ``(x, y)``, then time ``backward()``. Return, for each bucket in
    launch order, the fraction of backward's time that had passed when its last gradient was
    ready (0 = backward's start, 1 = its end). Remove your hooks before returning.
    How much of backward is left when the first bucket goes?
    """
    raise NotImplementedError("task 5.2: time each bucket's launch inside backward")


def predict_swapped(a0, b0, a1, b1):
    """Task 5.3: launch the buckets on two threads instead of one, and the ranks can start them
    in different orders. Two buckets a and b of the same size on 2 ranks: rank 0 all-reduces
    a then b, rank 1 b then a, each with step 1's naive all-reduce (one ``sendrecv`` with the
    peer). Predict what rank 0 holds in a and in b afterwards: return ``(a, b)`` as arrays
    (rank r's buffers are ``a_r``, ``b_r``). The check runs it. Is anything raised?
    """
    raise NotImplementedError("task 5.3: predict rank 0's a and b after the mixed-up order")
