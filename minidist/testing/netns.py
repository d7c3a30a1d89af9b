"""The network namespaces the cluster emulator builds nodes from: names, probing, teardown.

Every name the tool creates starts with ``PREFIX`` and carries its creating process's id, so a
run killed with SIGKILL leaves namespaces that the next run (``cleanup_stale``, or
``python -m minidist.testing.cluster --cleanup``) recognizes and removes once that process is
gone. ``unavailable_reason`` says in one line why this machine cannot build nodes (not root, no
``ip``/``unshare``, not Linux), probed once; ``rate_bytes_per_s`` reads tc's rates.
``minidist.testing.cluster`` re-exports all of it.
"""
from __future__ import annotations

import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "mdc"                     # every name this tool creates starts with it
SUBNET = "10.77.0."                # node i is SUBNET + (i + 1), /24, on its own bridge
MASTER_PORT = 29500                # free in a fresh namespace: nothing else listens there
NETNS_ETC = Path("/etc/netns")     # ip netns exec mounts /etc/netns/NS/* over /etc/*
TAG_SERIAL = itertools.count(secrets.randbelow(256))  # 2 hex digits: distinct within a process
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})[0-9a-f]{{2}}")  # the pid inside a tag


class ClusterUnavailable(RuntimeError):
    """This machine cannot build namespace nodes (not root, no ``ip``, not Linux ...)."""


def run_command(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        raise RuntimeError(f"cluster: `{' '.join(argv)}` failed (exit {res.returncode}): "
                           f"{res.stderr.strip()}")
    return res


_REASON: list[str | None] = []


def unavailable_reason() -> str | None:
    """Why no cluster can be built here, in one line; None when it can (probed once)."""
    if _REASON:
        return _REASON[0]
    reason = None
    if not sys.platform.startswith("linux"):
        reason = f"needs Linux network namespaces (this is {sys.platform})"
    elif os.geteuid() != 0:
        reason = "needs root (network namespaces, links and tc need CAP_NET_ADMIN)"
    else:
        missing = [t for t in ("ip", "unshare") if shutil.which(t) is None]
        if missing:
            reason = f"needs {' and '.join(missing)} on PATH (iproute2, util-linux)"
        else:
            probe = f"{PREFIX}{os.getpid():06x}{secrets.token_hex(1)}probe"
            made = run_command("ip", "netns", "add", probe, check=False)
            if made.returncode != 0:
                why = "; ".join(made.stderr.split("\n")).strip("; ")
                reason = f"cannot create a network namespace (ip netns add: {why})"
            else:  # a command inside it, under a host name of its own (as every node runs)
                ran = run_command("ip", "netns", "exec", probe, "unshare", "-u", "true",
                                  check=False)
                if ran.returncode != 0:
                    why = "; ".join(ran.stderr.split("\n")).strip("; ")
                    reason = f"cannot run a command in a network + UTS namespace ({why})"
                run_command("ip", "netns", "del", probe, check=False)
    _REASON.append(reason)
    return reason


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_pids(ns: str) -> list[int]:
    """The processes inside network namespace ``ns``."""
    res = run_command("ip", "netns", "pids", ns, check=False)
    return [int(x) for x in res.stdout.split()] if res.returncode == 0 else []


def kill_netns(ns: str, wait_s: float = 5.0) -> None:
    """SIGKILL every process inside ``ns`` (again, until none is left or ``wait_s`` passed)."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = netns_pids(ns)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def cleanup_stale(verbose: bool = False) -> list[str]:
    """Remove namespaces, links, /etc/netns and temporary folders of runs whose process is gone.

    Only names of this tool (``mdc`` + a pid + 2 hex digits) whose pid is not alive: a run in
    progress, here or in another process, is never touched. Returns what was removed.
    """
    removed = []

    def dead(name: str) -> bool:  # this tool's name, and the run that made it is gone
        m = _NAME.match(name)
        return m is not None and not _alive(int(m.group(1), 16))

    for line in run_command("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if dead(ns):
            kill_netns(ns)
            run_command("ip", "netns", "del", ns, check=False)
            removed.append(f"netns {ns}")
    for line in run_command("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(": ")
        name = parts[1].split("@")[0] if len(parts) > 1 else ""
        if dead(name):
            run_command("ip", "link", "del", name, check=False)
            removed.append(f"link {name}")
    if NETNS_ETC.is_dir():
        for d in NETNS_ETC.iterdir():
            if dead(d.name):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(f"{d}")
    for d in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):  # a run's files (its sockets)
        if d.is_dir() and dead(d.name):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(f"{d}")
    if verbose:
        for r in removed:
            print(f"[cluster] removed stale {r}", file=sys.stderr)
    return removed


def rate_bytes_per_s(rate: str) -> float:
    """``"1gbit"`` -> bytes per second (tc's units: kbit, mbit, gbit; k/m/g = bytes)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(bit|bps|b?)\s*", rate.lower())
    if m is None:
        raise ValueError(f"--rate {rate!r}: use a tc rate such as 100mbit, 1gbit or 10gbit")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    return value / 8 if m.group(3) == "bit" else value
