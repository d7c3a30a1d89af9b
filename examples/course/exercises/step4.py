"""Step 4's tasks: edit the functions below, then check your answers (docs/course.md, step 4):

    COURSE_ANSWERS=mine ./test.sh -m course_4              # every task of step 4
    COURSE_ANSWERS=mine ./test.sh -m course_4 -k task_4_1  # one task
"""


def allreduce_time_model(sizes, cap_bytes, n, alpha_us, beta_us_per_byte):
    """Task 4.1: predict step 4's bucketed all-reduce with the alpha-beta model.

    ``sizes``: the gradients' bytes in backward order (already reversed). Form the buckets as
    step 4's ``plan_buckets`` does (a new bucket when adding the next gradient would exceed
    ``cap_bytes``), then cost each bucket of K bytes as step 2's ring:
    2(n-1) alpha + 2K(n-1)/n beta. Return ``(number of buckets, total microseconds)``.

    Then run ``--bucket-kb 4, 16, 64, 256, 1024`` under mpirun.sh: where does your machine's
    time stop improving, and where does the model say the alpha term stops mattering?
    """
    raise NotImplementedError("task 4.1: plan the buckets and add up their ring costs")


def grads_into_buckets(params, cap_bytes):
    """Task 4.2: remove step 4's copies. Plan the buckets (parameters in reverse order, step 4's
    rule), allocate one zeroed flat float32 buffer per bucket, and make every ``p.grad`` a VIEW
    into its bucket's buffer (``p.grad = flat[a:b].reshape(p.array.shape)``), so backward adds
    each gradient straight into the bucket. Return the list of flat buffers, in bucket order.

    The code below allocates the buffers but leaves the gradients where they are (step 4).
    """
    import numpy as np
    ordered = list(reversed(params))
    buckets, current, size = [], [], 0
    for p in ordered:
        if current and size + p.array.nbytes > cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += p.array.nbytes
    buckets.append(current)
    return [np.zeros(sum(p.array.size for p in b), np.float32) for b in buckets]
