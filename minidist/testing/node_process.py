"""A node of the emulated cluster (``Node``), and a command running on it (``NodeProcess``,
finished: ``NodeResult``).

``minidist.testing.cluster.Cluster`` makes them; ``minidist.testing.cluster`` re-exports them.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO


@dataclass
class Node:
    """One node: its index, host name, namespace, address and host-side link."""

    index: int
    hostname: str
    netns: str
    addr: str
    link: str


@dataclass
class NodeResult:
    """What one command on one node did."""

    node: int
    returncode: int | None  # None: still running when the wait gave up (it was killed)
    stdout: str
    stderr: str
    elapsed_s: float

    def report(self, tail: int = 3000) -> str:
        return (f"--- node {self.node}: exit {self.returncode} after {self.elapsed_s:.1f} s ---\n"
                f"[stdout]\n{self.stdout[-tail:]}\n[stderr]\n{self.stderr[-tail:]}")


class NodeProcess:
    """A command running on a node; its output is collected (and echoed if asked)."""

    def __init__(self, node: int, argv: list[str], env: dict[str, str] | None,
                 echo: bool = False, cwd: str | None = None) -> None:
        self.node, self.argv, self.echo = node, argv, echo
        self.t0 = time.monotonic()
        self.ended: float | None = None
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                     start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=(src, buf, dst), daemon=True)
                        for src, buf, dst in ((self.proc.stdout, self.out, sys.stdout),
                                              (self.proc.stderr, self.err, sys.stderr))]
        for t in self.readers:
            t.start()

    def _read(self, src: IO[bytes], buf: list[str], dst: IO[str]) -> None:
        for raw in iter(src.readline, b""):
            line = raw.decode(errors="replace")
            buf.append(line)
            if self.echo:
                dst.write(f"[node{self.node}] {line}" + ("" if line.endswith("\n") else "\n"))
                dst.flush()
        src.close()

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def result(self) -> NodeResult:
        self.proc.wait()
        self.poll()
        for t in self.readers:
            t.join(timeout=5.0)
        return NodeResult(self.node, self.proc.returncode, "".join(self.out), "".join(self.err),
                          (self.ended or time.monotonic()) - self.t0)
