"""A torchrun-style launcher: start N ranks of a script on this machine, watch them, end them.

    python -m minidist.launch --nproc-per-node 4 examples/train.py --epochs 2
    python -m minidist.launch --standalone --nproc-per-node 2 script.py    # free port, 127.0.0.1
    python -m minidist.launch --nnodes 2 --node-rank 0 --nproc-per-node 4 \\
        --master-addr 10.0.0.1 --master-port 29500 script.py    # node 1: the same, --node-rank 1

Each rank is ``python script.py args`` with the variables torchrun sets (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) plus one BLAS thread per rank (``OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS=1`` unless
already set), so ``init_process_group()`` picks the TCP transport. torchrun's underscore
spellings (``--nproc_per_node``) are accepted too. What the launcher guarantees::

    launcher --- Popen (own session, dies with the launcher) ---> rank 0 .. rank N-1
       ^  every output line comes back as "[rank r] line" on the same stream (stdout/stderr)
       |  SIGINT/SIGTERM to the launcher    -> forwarded to every rank's process group
       |  a rank exits non-zero             -> the others get SIGTERM, then SIGKILL after
       |                                       STOP_GRACE_S; the launcher exits with that
       |                                       rank's code, naming it and its last line
       '  the launcher exits for any reason -> SIGKILL to every rank's process group

A job of its own: on one node the ranks get a fresh secret, ``MINIDIST_AUTH_TOKEN`` (unless
the environment sets one), so nobody else on the machine can join or end the job, and a run id,
``MINIDIST_RUN_ID`` (``--rdzv-id``, torchrun's flag; made up when not given), so a rank of
another job on the same port is refused. With ``--nnodes`` above 1 the nodes must share both:
without a token the launcher says so in one line at start (export the same
``MINIDIST_AUTH_TOKEN`` and pass the same ``--rdzv-id`` on every node).

``--standalone`` picks a free port and keeps it reserved until the job ends (see
``reserve_port``), so no other program can take it between the pick and rank 0's bind.

``--max-restarts N`` (torchrun's elastic restarts): when a rank fails, the launcher stops the
group as above, says which restart it starts and why, and starts every rank again, up to N
times; each rank sees ``TORCHELASTIC_RESTART_COUNT`` (0 on the first attempt) and
``TORCHELASTIC_MAX_RESTARTS``. A script that checkpoints (the Trainer with ``resume="if_present"``)
continues from its last checkpoint. Only this node's ranks restart (one node per launcher).

Exit code: 0 when every rank exits 0; the first failed rank's code (128 + signal if a signal
killed it); 130 after SIGINT (Ctrl-C), 143 after SIGTERM.

Parts: the command line is ``minidist/tcp/launch_args.py``, a started rank (its output relay
and notice) ``minidist/tcp/launch_rank.py``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence

from minidist.tcp.launch_args import nproc_value, parse_args, reserve_port  # noqa: F401
from minidist.tcp.launch_rank import NOTICE_FD_VAR, Notice, Rank, exit_code  # noqa: F401

BLAME_WAIT_S = 2.0  # a rank blames a peer (its connection closed): how long to wait for the
                    # peer's own exit, which then names the failure (its code, its line)
STOP_GRACE_S = 5.0  # how long stopped ranks get to exit after SIGTERM/SIGINT before SIGKILL
POLL_S = 0.05
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
# Variables of an outer launcher (mpiexec, srun) that would make a rank think MPI started it.
FOREIGN_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the launcher's finally still kills ranks
        pass


def rank_env(args: argparse.Namespace, local_rank: int,
             base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one rank: ``base`` (default os.environ) plus torchrun's variables."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(FOREIGN_PREFIXES)}
    for var in BLAS_VARS:
        env.setdefault(var, "1")
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the launcher as they are printed
    env.update(RANK=str(args.node_rank * args.nproc_per_node + local_rank),
               LOCAL_RANK=str(local_rank), WORLD_SIZE=str(args.nnodes * args.nproc_per_node),
               LOCAL_WORLD_SIZE=str(args.nproc_per_node), GROUP_RANK=str(args.node_rank),
               MASTER_ADDR=args.master_addr, MASTER_PORT=str(args.master_port),
               MINIDIST_LAUNCHER="launch",
               TORCHELASTIC_RESTART_COUNT=str(getattr(args, "restart_count", 0)),
               TORCHELASTIC_MAX_RESTARTS=str(getattr(args, "max_restarts", 0)))
    if getattr(args, "rdzv_id", None):
        env["MINIDIST_RUN_ID"] = args.rdzv_id
    if getattr(args, "auth_token", None):
        env["MINIDIST_AUTH_TOKEN"] = args.auth_token
    return env


class Launcher:
    """Start the ranks, relay their output, and end them all together (see the module doc)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ranks: list[Rank] = []
        self.signalled: int | None = None  # the signal the launcher received, if any
        self.first: Rank | None = None  # the rank that failed first, once one has
        self.deciding = threading.Lock()  # guards first and the ranks' notices
        self.failed: Rank | None = None     # the rank whose failure ended the group, if any

    def _say(self, text: str) -> None:
        sys.stderr.buffer.write(f"[minidist.launch] {text}\n".encode())
        sys.stderr.flush()

    def start(self) -> None:
        a = self.args
        cmd = [sys.executable, "-u", *(["-m"] if a.module else []), a.script, *a.script_args]
        channels = []
        for local in range(a.nproc_per_node):
            mine, theirs = socket.socketpair()  # the rank's notices (see read_notices)
            env = rank_env(a, local)
            env[NOTICE_FD_VAR] = str(theirs.fileno())
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=_die_with_parent,
                                    pass_fds=(theirs.fileno(),))
            theirs.close()
            channels.append(mine)
            self.ranks.append(Rank(a.node_rank * a.nproc_per_node + local, proc))
        for r, channel in zip(self.ranks, channels):
            pipes = ((r.proc.stdout, sys.stdout.buffer), (r.proc.stderr, sys.stderr.buffer))
            for src, dst in pipes:
                t = threading.Thread(target=r.relay, args=(src, dst), daemon=True)
                t.start()
                r.readers.append(t)
            threading.Thread(target=self.read_notices, args=(r, channel), daemon=True).start()

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.signalled is None:
            self.signalled = signum
            for r in self.ranks:
                r.signal_group(signum)

    def stop_all(self, sig: int | None = signal.SIGTERM) -> None:
        """Send ``sig`` (None: nothing) to every live rank, wait STOP_GRACE_S, then SIGKILL."""
        for r in self.ranks:
            if sig is not None:
                r.signal_group(sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in self.ranks):
            time.sleep(POLL_S)
        self.kill_all()

    def kill_all(self) -> None:
        for r in self.ranks:
            r.signal_group(signal.SIGKILL)  # also children of a rank that already exited
        for r in self.ranks:
            r.proc.wait()
            for t in r.readers:
                t.join(timeout=2.0)

    def wait(self) -> int:
        """Block until the job ends; return the launcher's exit code."""
        while True:
            if self.signalled is not None:
                # _on_signal forwarded it; minidist ranks end themselves on SIGINT (exit 130).
                self.stop_all(None)
                self._say(f"received {signal.Signals(self.signalled).name}: stopped all "
                          f"{len(self.ranks)} ranks of this node.")
                return 128 + self.signalled
            failed = self.first_failed()
            if failed is not None:
                self.failed = failed
                return self.end_failed_job(failed)
            if all(r.proc.poll() == 0 for r in self.ranks):
                self.kill_all()  # joins the relays, so every line is out before we exit
                return 0
            time.sleep(POLL_S)

    # -- which rank failed first (from what the ranks report, not from the order of exits) --

    def read_notices(self, r: Rank, channel: socket.socket) -> None:
        """Reader thread of rank ``r``'s notice channel (minidist.watch.failure.notice): record
        its notice; if it failed first, stop every other rank before answering it, so they do
        not go on to report this rank's closed connection."""
        with channel, channel.makefile("rb") as lines:
            while True:
                try:
                    raw = lines.readline()
                    got = Notice.parse(raw) if raw else None
                except OSError:  # the rank is gone
                    return
                except ValueError:
                    continue
                if got is None:
                    return
                with self.deciding:
                    r.notice = r.notice or got  # a rank's first notice says why it ended
                    if self.first is None and got.kind in ("exception", "exit", "startup"):
                        culprit = self._culprit(r, got)
                        if culprit is not None:
                            self.first = culprit
                            for other in self.ranks:
                                if other is not culprit:
                                    other.signal_group(signal.SIGTERM)
                try:
                    channel.sendall(b"ok\n")
                except OSError:
                    return

    def _culprit(self, r: Rank, got: Notice) -> Rank | None:
        """The rank to blame for ``r``'s notice: ``r`` itself, unless it names peers (it failed
        because of them): the first of them to have exited, once one has (BLAME_WAIT_S)."""
        if not got.blames:
            return r
        named = [x for x in self.ranks if x.rank in got.blames]
        deadline = time.monotonic() + BLAME_WAIT_S
        while named and time.monotonic() < deadline:
            gone = [x for x in named if x.proc.poll() is not None]
            if gone:
                return gone[0]
            time.sleep(POLL_S)
        return None  # a peer on another node, or still alive: decided when a rank exits

    def first_failed(self) -> Rank | None:
        """The rank that failed first, once the job has failed; None while it has not.

        In order: the first rank that reported its own failure (an exception, or a nonzero
        exit); a rank that exited nonzero without a word (``os._exit``, a signal); the first
        rank that reported a peer's failure.
        """
        with self.deciding:
            if self.first is not None:
                return self.first
            exited = [r for r in self.ranks if r.proc.poll() not in (None, 0)]
            if not exited:
                return None
            silent = [r for r in exited if r.notice is None]
            noticed = sorted((r for r in self.ranks if r.notice is not None),
                             key=lambda r: r.notice.t)  # type: ignore[union-attr]
            self.first = silent[0] if silent else noticed[0] if noticed else exited[0]
            return self.first

    def end_failed_job(self, failed: Rank) -> int:
        """Stop the other ranks; name ``failed``, its exit code and its error; the job's code."""
        try:
            failed.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        self.stop_all(signal.SIGTERM)
        code = exit_code(failed.proc.returncode)
        if code == 0:  # its script returned (or raised SystemExit(0)) while the others waited
            code = 1
        said, kind = (failed.notice.line, failed.notice.kind) if failed.notice else ("", "")
        quote = (f"Rank {failed.rank} raised: {said!r}" if said and kind == "exception"
                 else said if said and kind == "startup"  # one line: "minidist: ..."
                 else f"Last line of rank {failed.rank}: {failed.last_line!r}"
                 if failed.last_line else f"Rank {failed.rank} printed nothing.")
        self._say(f"rank {failed.rank} exited with code {exit_code(failed.proc.returncode)}; "
                  f"stopped the other ranks. {quote}")
        return code

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            return self.wait()
        finally:
            for r in self.ranks:
                r.signal_group(signal.SIGKILL)  # never leave a rank behind, whatever happened
            for s, handler in previous.items():
                signal.signal(s, handler)


# ---- elastic restarts (torchrun's --max-restarts) ---------------------------------------

def say(text: str) -> None:
    """One line of the launcher's own on stderr, ``[minidist.launch]``-prefixed."""
    sys.stderr.buffer.write(f"[minidist.launch] {text}\n".encode())
    sys.stderr.flush()


def restart_cause(launcher: Launcher, code: int) -> str:
    """What ended an attempt, for the restart line: the failed rank and its last line."""
    failed = launcher.failed
    if failed is None:
        return f"the group exited with code {code}"
    last = f" (its last line: {failed.last_line!r})" if failed.last_line else ""
    return f"rank {failed.rank} exited with code {code}{last}"


def run_with_restarts(args: argparse.Namespace) -> int:
    """Run the group; after a failure stop it and start it again, up to ``--max-restarts``
    times, as torchrun does (never after SIGINT/SIGTERM to the launcher).

    Every attempt starts all ranks afresh with ``TORCHELASTIC_RESTART_COUNT`` = the attempt
    number (0 first) and the same rendezvous port; a script that saves checkpoints resumes
    from its last one (``TrainerConfig(resume="if_present")``). Returns the last attempt's code.
    """
    if getattr(args, "auth_token", "") is None:
        say(f"no MINIDIST_AUTH_TOKEN: anyone who reaches {args.master_addr}:{args.master_port} "
            f"can join or end this {args.nnodes}-node job; export the same secret on every "
            f"node (MINIDIST_AUTH_TOKEN=$(python3 -c 'import secrets; "
            f"print(secrets.token_hex(16))')) and pass the same --rdzv-id.")
    try:
        for attempt in range(args.max_restarts + 1):
            args.restart_count = attempt
            launcher = Launcher(args)
            code = launcher.run()
            if code == 0 or launcher.signalled is not None or attempt == args.max_restarts:
                if code != 0 and args.max_restarts and launcher.signalled is None:
                    say(f"giving up after {attempt} restart(s) "
                                  f"(--max-restarts {args.max_restarts}).")
                return code
            say(f"restart {attempt + 1} of {args.max_restarts}: "
                          f"{restart_cause(launcher, code)}; starting all "
                          f"{args.nproc_per_node} ranks again "
                          f"(TORCHELASTIC_RESTART_COUNT={attempt + 1}).")
        return code
    finally:
        if getattr(args, "reservation", None) is not None:
            args.reservation.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m minidist.launch``; returns the exit code."""
    return run_with_restarts(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
