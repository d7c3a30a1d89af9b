"""A job that cannot start says why in one line per job, not in a traceback per rank.

    try:
        transport = make_transport(...)          # init_process_group's start-up
    except (ValueError, CommError) as e:
        startup.one_line(e)                      # if nobody catches it: one line, then exit
        raise

The error still propagates (a caller may catch it); only if it ends the program does the hook
replace Python's traceback with ``minidist: <message>``. Who says it::

    launcher (mpiexec, srun, python -m minidist.launch) started every rank with the same
    environment, and the error comes from that environment (ValueError):
        rank 0 says it; the other ranks end silently (they would repeat the same line)
    a rendezvous that did not complete (CommError): rank 0 knows who is missing and says it;
        the other ranks wait QUIET_S first, so that rank 0's line comes first
    under python -m minidist.launch, the rank tells the launcher (watch/failure/notice.py),
        which prints the node's one line, quoting this one: each node's first rank (rank 0 on
        the first node) tells it at once, the node's other ranks wait LAUNCHER_QUIET_S (the
        launcher stops them once the first has told it), so a node whose token is wrong ends
        in a second, not after the wait
    ranks started by hand: each prints its own line

The exit code is 2 for a setting that cannot work (as argparse's usage errors), 1 otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from minidist import logger as mdlog
from minidist.watch.failure import interrupts
from minidist.comm.errors import CommError
from minidist.watch.failure import notice
from minidist.envvars import USAGE_EXIT_CODE, quiet_rank, validate

log = mdlog.get_logger("minidist.comm.api")

QUIET_S = 1.0  # a rank other than 0 waits this long, so that rank 0's report comes first
LAUNCHER_QUIET_S = 10.0  # ... under the launcher, which stops it once its node's first rank
                         # has reported (that rank may start seconds later on a busy machine)


def check_environment() -> None:
    """Every MINIDIST_ variable, checked at the start (a bad value raises EnvVarError); one
    warning for the job per unknown MINIDIST_ name, naming the closest known one."""
    for warning in validate():
        if not quiet_rank():
            log.warning("%s", warning)


def failed(error: BaseException, rank: int | None) -> None:
    """``init_process_group`` could not start: Ctrl-C ends the rank in one line; a setting or
    a rendezvous that failed ends the job in one line if nobody catches ``error``."""
    interrupts.interrupted_during_start(error)
    interrupts.uninstall()
    if isinstance(error, (ValueError, CommError)):
        one_line(error, int(quiet_rank()) if rank is None else rank)


def one_line(error: BaseException, rank: int = 0) -> None:
    """Make ``error``, if it ends the program, end it with one line for the job (see above)."""
    previous = sys.excepthook

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not error:
            previous(exc_type, exc, tb)
            return
        setting = isinstance(exc, ValueError)
        code = USAGE_EXIT_CODE if setting else 1
        text = f"minidist: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        same_everywhere = setting and quiet_rank()
        if notice.under_launcher():
            if quiet_rank():
                time.sleep(LAUNCHER_QUIET_S)  # the node's first rank reports; we are stopped
        elif rank != 0 and not same_everywhere:
            time.sleep(QUIET_S)
        if not same_everywhere:
            if not notice.tell("startup", text, code=code):
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
        os._exit(code)

    sys.excepthook = hook
