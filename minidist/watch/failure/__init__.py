"""One owner for failure: detect, diagnose, act, advise; the policy in one object.

    from minidist.watch.failure import FailurePolicy
    group.failure_policy = FailurePolicy(end_job_on_error=False)   # every group holds one

What happens when a rank fails or a peer dies, module by module::

    policy.py      FailurePolicy: every decision below, with its default (change it here)
    exchange.py    detect + diagnose: the poll hook of every slow wait (a peer's failure
                   notice, a message of another call, a peer that left), the ledger exchange
                   after a failed collective, the farewell check at destroy_process_group
    waiting.py     a long silent wait says once who it waits for and how long it may last
    interrupts.py  act: an uncaught exception or Ctrl-C ends the job, in one line for Ctrl-C
    leaving.py     act: a rank leaving through exit tells its peers; the job ends with its code
    startup.py     act: a job that cannot start ends with one line per job
    notice.py      act: tell python -m minidist.launch why this rank ends (it names the first)
    report.py      advise: the block an uncaught error prints
    advice.py      advise: what a failure means and what to do, in one sentence

Detection that only a transport can do stays there: a closed TCP connection
(minidist/tcp/transport.py), a wait's deadline and the poll hook's call (transports/base.py), the
side channel the exchange runs on (transports/base.py, ``SideChannel``). DDP wraps a failed
bucket with ``advice.failure_advice`` (ddp/reducer.py).
"""

from minidist.watch.failure.policy import FailurePolicy

__all__ = ["FailurePolicy"]
