"""What a rank tells the launcher that started it, so the launcher can name the rank that
failed first.

    from minidist.watch.failure import notice
    notice.tell("exception", "RuntimeError: rank one broke", blames=[])   # the excepthook does this

Under ``python -m minidist.launch`` each rank inherits one end of a socket pair, named by
``MINIDIST_LAUNCH_FD``. A rank that is about to end the job writes one JSON line on it and waits
for the launcher's answer before it closes its connections, so the launcher stops the other
ranks before they notice the closed connections and report a failure of their own::

    rank 1 (excepthook)                               launcher
    {"kind": "exception", "line": "RuntimeError: ...",
     "blames": [], "t": 1712.3} ------------------->  first notice that blames nobody: rank 1
                                                      failed first; SIGTERM to every other rank
    waits for the answer (at most ACK_S)  <---------  "ok"
    prints its traceback, closes, exits with 1        names rank 1 and quotes its line

``kind`` is ``"exception"`` (an uncaught exception: ``line`` is its last traceback line),
``"exit"`` (the script called ``sys.exit(code)`` with the group open) or ``"interrupted"``
(Ctrl-C: the launcher prints the job's one line). ``blames`` lists the peers an error names (a
dead peer, a peer that left): such a rank failed only because of them, so the launcher names
them instead. Without the launcher (``MINIDIST_LAUNCH_FD`` unset) ``tell`` does nothing.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Sequence

from minidist.envvars import env

ACK_S = 2.0  # how long a rank waits for the launcher's answer before it goes on ending anyway


def under_launcher() -> bool:
    """True in a rank started by ``python -m minidist.launch`` (it reports to the launcher)."""
    return env("MINIDIST_LAUNCH_FD") is not None


def tell(kind: str, line: str, blames: Sequence[int] = (), code: int | None = None) -> bool:
    """Send one notice to the launcher and wait for its answer; False without a launcher.

    Args:
        kind: "exception", "exit" or "interrupted".
        line: what happened, in one line (an exception's ``Type: message``).
        blames: the peers this failure is a consequence of (empty: this rank failed itself).
        code: the exit code the rank will end with, where it knows it.
    """
    fd = env("MINIDIST_LAUNCH_FD")
    if fd is None:
        return False
    data = json.dumps({"kind": kind, "line": line.splitlines()[0][:500] if line else "",
                       "blames": list(blames), "code": code, "t": time.time()}) + "\n"
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            s.settimeout(ACK_S)
            s.sendall(data.encode())
            s.recv(16)  # the launcher answers once it has stopped the other ranks
    except OSError:  # no launcher any more, or it did not answer in time: end anyway
        pass
    return True


def exception_line(exc_type: type, exc: BaseException) -> str:
    """``Type: message`` (the first line of the message), as a traceback ends."""
    text = str(exc).split("\n", 1)[0]
    return f"{exc_type.__name__}: {text}" if text else exc_type.__name__
