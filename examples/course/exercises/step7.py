"""Step 7's tasks, done in the library itself: edit the functions below, then check them
(docs/course.md, step 7):

    COURSE_ANSWERS=mine ./test.sh -m course_7              # both tasks
    COURSE_ANSWERS=mine ./test.sh -m course_7 -k task_7_1  # one task
"""


def make_entry():
    """Task 7.1: a new all-reduce algorithm for the library, through its registry.

    Return an ``Algorithm`` (minidist/comm/algorithms/registry.py) named ``"course_ring"``:
    ``run(transport, buf, op, tag=0)`` is your ring of task 2.1 made a library algorithm (in
    place; SUM and AVG, ``minidist.comm.ops.finalize`` divides for AVG; every message on
    ``tag``), ``cost=`` the ring's alpha-beta-gamma formula in microseconds
    (docs/algorithms.md), ``constants=model(...)``. The check registers it
    (``select.register``), runs ``all_reduce(..., algorithm="course_ring")`` on 2 and 3 thread
    ranks, and asks ``auto`` (``plan_all_reduce``, ``auto_table``) whether it considers your
    entry and picks it for 1 MiB at n = 2: choose constants that make the model prefer it.
    docs/layout.md, "(b) A new all-reduce algorithm", lists the files a real one touches.
    """
    raise NotImplementedError("task 7.1: return an Algorithm entry named 'course_ring'")


def norm_recording_hook(state, bucket):
    """Task 7.2: a DDP comm hook (minidist/ddp/hooks.py: ``hook(state, bucket)``). Store this
    rank's L2 norm of the bucket's gradients BEFORE averaging, as a float, in
    ``state[bucket.index]``; then leave in ``bucket.buffer`` the average over the ranks (the
    hook's contract), with ``bucket.all_reduce(array, op)``. The check registers it with
    ``ddp.register_comm_hook(state, norm_recording_hook)``, trains a step and compares.

    The code below records nothing and reduces nothing.
    """
