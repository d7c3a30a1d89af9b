"""Wing: watch, what minidist sees beside the path a learner follows.

    group.ledger.entries()[-1]           # what this rank called last, and from where
    md.comm.ledger_label("bucket=3")     # a label in every ledger entry of a block

    diagnosis/   the ledger (every call: number, caller's site, status), the debug-mode
                 consistency check, the debug log; on a failure the ranks exchange their
                 ledgers and all raise the same finding (diagnose.py: which rank differs)
    failure/     detect, diagnose, act, advise: the poll hook of slow waits, the farewell count
                 check, one line on Ctrl-C or an uncaught error on every rank, a rank leaving
                 through exit, a job that cannot start; FailurePolicy holds every decision

It attaches through the spine's seams (attach.py): a group extension and the job hooks of
``init_process_group``. Without it (``MINIDIST_WINGS=none``) a failed call raises its own
error on the rank that saw it, and a dead peer is found by the wait's deadline.
"""

from minidist.watch.attach import attach

attach()
