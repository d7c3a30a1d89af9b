"""The policy when a peer dies, or this rank fails: every decision of watch/failure in one object.

    group.failure_policy            # FailurePolicy(), the default below, held by every group
    md.init_process_group(...); md.get_default_group().failure_policy = FailurePolicy(
        end_job_on_error=False)     # an uncaught error only ends this rank; peers see it go

Each field is one decision that the rest of the package reads, so changing what minidist does
is a change here (or a different object), not in the code that detects, diagnoses or acts::

    detect    a wait that cannot succeed: transports' poll hook -> exchange.poll (a peer's
              failure notice, a message of another call, a peer that left), a closed
              connection, a timeout (MINIDIST_TIMEOUT_S)
    diagnose  exchange.on_failure: the ranks swap ledgers for at most ``exchange_s`` and every
              rank raises the same finding (diagnose_on_failure)
    act       interrupts: an uncaught error or Ctrl-C ends the job (end_job_on_error,
              interrupt_*); leaving: a rank leaving with a code ends the job (leave_grace_s);
              waiting: a long wait says who it waits for (wait_notice_s)
    advise    advice.failure_advice: the sentence a wrapped error carries; startup: one line
              per job for a job that cannot start; notice: what the launcher is told
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class FailurePolicy:
    """What a rank does when it, or a peer, fails.

    Attributes:
        end_job_on_error: an uncaught exception ends the whole job (MPI Abort; over TCP the
            connections close, so every peer's wait fails at once). False: Python's own
            excepthook runs, and the peers find out when this process has gone.
        diagnose_on_failure: a failed collective first compares the ranks' ledgers, so every
            rank raises the same finding (which call differs, which rank is missing). False:
            the transport's error is raised as it is.
        exchange_s: the longest the ledger comparison waits for the peers' reports.
        interrupt_exit_code: the exit code of a Ctrl-C'd job (128 + SIGINT, as a shell says).
        interrupt_grace_s: a main thread inside a blocking MPI call cannot take Ctrl-C; the
            watcher thread ends the rank after this long.
        interrupt_unwind_s: a rank still alive this long after taking Ctrl-C is ended.
        interrupt_quiet_s: under MPI, ranks other than 0 wait this long before they print, so
            rank 0's abort ends them first and Ctrl-C prints one line.
        leave_grace_s: a rank leaving with a nonzero exit code under MPI waits this long for
            the peers to finish too before it ends the job with its code.
        wait_notice_s: a wait that lasts this long says once who it waits for and how long it
            may still last (the rendezvous, a collective behind a hung peer). 0: never.
    """

    end_job_on_error: bool = True
    diagnose_on_failure: bool = True
    exchange_s: float = 5.0
    interrupt_exit_code: int = 130
    interrupt_grace_s: float = 1.0
    interrupt_unwind_s: float = 15.0
    interrupt_quiet_s: float = 2.0
    leave_grace_s: float = 2.0
    wait_notice_s: float = 5.0

