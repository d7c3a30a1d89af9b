"""A cluster on one machine: every node a Linux network namespace with its own host name.

    sudo python -m minidist.testing.cluster --nodes 2 --nproc-per-node 2 -- \\
        examples/train.py --epochs 5                       # TCP: the launcher on every node
    sudo python -m minidist.testing.cluster --nodes 2 --nproc-per-node 2 --rate 1gbit --mpi -- \\
        python benchmarks/allreduce.py --algorithms ring,rd,hier   # MPI: Hydra across the nodes
    sudo python -m minidist.testing.cluster --cleanup      # remove what killed runs left behind

What it builds (``--nodes 3``; ``TAG`` = ``mdc`` + this process's id + 2 hex digits, distinct
within the process, so two runs at once never share a name)::

      namespace TAGn0            namespace TAGn1            namespace TAGn2
      host name node0            host name node1            host name node2
    +-----------------+        +-----------------+        +-----------------+
    | ranks 0..k-1    |        | ranks k..2k-1   |        | ranks 2k..3k-1  |
    | eth0 10.77.0.1  |        | eth0 10.77.0.2  |        | eth0 10.77.0.3  |
    +--------|--------+        +--------|--------+        +--------|--------+
             | veth TAGv0 (tbf --rate)  | TAGv1                    | TAGv2
    =========+==========================+==========================+=========
                      bridge TAGb (host namespace, no address)

Each node's ``eth0`` egress goes through ``tc qdisc tbf`` at ``--rate`` (so each link is that
fast in each direction); ``/etc/hosts`` inside a node (``ip netns exec`` mounts
``/etc/netns/NS/hosts``) names every node, and each command runs under ``unshare -u`` with its
node's host name, so minidist's topology (a hash of the host name) sees one node per namespace.
MPI: mpiexec (Hydra) runs in node 0 with ``-launcher ssh -launcher-exec WRAPPER``: the wrapper
takes ssh's place and runs the proxy inside the namespace its host name names (no ssh at all).

Teardown always runs (the ``with`` block's end, an exception, Ctrl-C, SIGTERM): every process
still inside a namespace gets SIGKILL, then namespaces, links and files go. A run killed with
SIGKILL leaves its namespaces behind; the next run (or ``--cleanup``) removes those whose
creating process is gone. Needs root and ``ip`` (iproute2), ``unshare``; ``tc`` for ``--rate``.

From Python (the tests in tests/cluster/ do this)::

    with Cluster(nodes=2, rate="1gbit") as c:
        jobs = c.launch_tcp(["tests/cluster/cluster_rank.py"], nproc_per_node=2)
        results = c.wait(jobs, timeout_s=60)      # NodeResult: node, returncode, stdout, stderr
        c.link(1, up=False)                       # cut node 1's link
        c.kill_node(1)                            # SIGKILL every process of node 1
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Sequence

PREFIX = "mdc"                     # every name this tool creates starts with it
SUBNET = "10.77.0."                # node i is SUBNET + (i + 1), /24, on its own bridge
MASTER_PORT = 29500                # free in a fresh namespace: nothing else listens there
NETNS_ETC = Path("/etc/netns")     # ip netns exec mounts /etc/netns/NS/* over /etc/*
_SERIAL = itertools.count(secrets.randbelow(256))  # 2 hex digits: distinct within a process
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})[0-9a-f]{{2}}")  # the pid inside a tag


class ClusterUnavailable(RuntimeError):
    """This machine cannot build namespace nodes (not root, no ``ip``, not Linux ...)."""


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
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
            made = _sh("ip", "netns", "add", probe, check=False)
            if made.returncode != 0:
                why = "; ".join(made.stderr.split("\n")).strip("; ")
                reason = f"cannot create a network namespace (ip netns add: {why})"
            else:  # a command inside it, under a host name of its own (as every node runs)
                ran = _sh("ip", "netns", "exec", probe, "unshare", "-u", "true", check=False)
                if ran.returncode != 0:
                    why = "; ".join(ran.stderr.split("\n")).strip("; ")
                    reason = f"cannot run a command in a network + UTS namespace ({why})"
                _sh("ip", "netns", "del", probe, check=False)
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
    res = _sh("ip", "netns", "pids", ns, check=False)
    return [int(x) for x in res.stdout.split()] if res.returncode == 0 else []


def _kill_netns(ns: str, wait_s: float = 5.0) -> None:
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

    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if dead(ns):
            _kill_netns(ns)
            _sh("ip", "netns", "del", ns, check=False)
            removed.append(f"netns {ns}")
    for line in _sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(": ")
        name = parts[1].split("@")[0] if len(parts) > 1 else ""
        if dead(name):
            _sh("ip", "link", "del", name, check=False)
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


WRAPPER = """#!/bin/sh
# ssh's stand-in for mpiexec (-launcher ssh -launcher-exec THIS): `THIS [-x ...] HOST COMMAND`
# runs COMMAND inside the network namespace of HOST, under HOST's host name.
while [ $# -gt 0 ]; do
  case "$1" in -*) shift ;; *) break ;; esac
done
host="$1"; shift
case "$host" in
{cases}
  *) echo "cluster ssh wrapper: no node named '$host'" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare -u sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


class Cluster:
    """``nodes`` namespace nodes joined by a bridge, each link at ``rate`` (None: unlimited).

    Use as a context manager: ``__exit__`` tears everything down, whatever happened (see the
    module docstring). Raises ClusterUnavailable (one line: why) where namespaces cannot be made.
    """

    def __init__(self, nodes: int = 2, rate: str | None = None, echo: bool = False) -> None:
        if nodes < 1:
            raise ValueError(f"Cluster(nodes={nodes}): need at least one node")
        if nodes > 99:
            raise ValueError(f"Cluster(nodes={nodes}): at most 99 nodes (link names)")
        if rate is not None:
            rate_bytes_per_s(rate)  # a bad rate fails before anything is built
        self.num_nodes, self.rate, self.echo = nodes, rate, echo
        self.tag = f"{PREFIX}{os.getpid():06x}{next(_SERIAL) % 256:02x}"
        self.bridge = f"{self.tag}b"
        self.nodes = [Node(i, f"node{i}", f"{self.tag}n{i}", f"{SUBNET}{i + 1}",
                           f"{self.tag}v{i}") for i in range(nodes)]
        self.procs: list[NodeProcess] = []
        self.tmp: Path | None = None
        self.wrapper: Path | None = None
        self._built = False

    # ------------------------------------------------------------------ building

    def __enter__(self) -> Cluster:
        self.up()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down()

    def up(self) -> None:
        """Build the nodes (undoing whatever was built if a step fails)."""
        reason = unavailable_reason()
        if reason is not None:
            raise ClusterUnavailable(f"minidist.testing.cluster {reason}")
        if self.rate is not None and shutil.which("tc") is None:
            raise ClusterUnavailable("minidist.testing.cluster: --rate needs tc (iproute2)")
        cleanup_stale()
        self._built = True
        try:
            self._build()
        except BaseException:
            self.down()
            raise

    def _build(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "link", "set", self.bridge, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.addr} {n.hostname}\n" for n in self.nodes)
        for n in self.nodes:
            inner = f"{self.tag}p{n.index}"
            _sh("ip", "netns", "add", n.netns)
            etc = NETNS_ETC / n.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)
            (etc / "hostname").write_text(n.hostname + "\n")
            _sh("ip", "link", "add", n.link, "type", "veth", "peer", "name", inner)
            _sh("ip", "link", "set", n.link, "master", self.bridge)
            _sh("ip", "link", "set", n.link, "up")
            _sh("ip", "link", "set", inner, "netns", n.netns)
            ns = ("ip", "netns", "exec", n.netns)
            _sh(*ns, "ip", "link", "set", inner, "name", "eth0")
            _sh(*ns, "ip", "addr", "add", f"{n.addr}/24", "dev", "eth0")
            _sh(*ns, "ip", "link", "set", "eth0", "up")
            _sh(*ns, "ip", "link", "set", "lo", "up")
            if self.rate is not None:
                self._limit(n, self.rate)
        cases = "\n".join(f"  {n.hostname}) ns={n.netns} ;;" for n in self.nodes)
        self.wrapper = self.tmp / "ssh"
        self.wrapper.write_text(WRAPPER.format(cases=cases))
        self.wrapper.chmod(0o755)

    def _limit(self, n: Node, rate: str) -> None:
        """tbf on the node's eth0: its egress runs at ``rate``; the bucket holds 2 ms of data
        (at least 64 KiB: one GSO packet must fit, or tbf drops it)."""
        burst = max(64 << 10, int(rate_bytes_per_s(rate) * 0.002))
        _sh("ip", "netns", "exec", n.netns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
            "rate", rate, "burst", str(burst), "latency", "100ms")

    def down(self) -> None:
        """Kill every process left in a node, delete namespaces, links and files (idempotent)."""
        for p in self.procs:
            p.kill()
        if self._built:
            for n in self.nodes:
                _kill_netns(n.netns)
                _sh("ip", "netns", "del", n.netns, check=False)
                _sh("ip", "link", "del", n.link, check=False)  # gone with its peer, usually
                shutil.rmtree(NETNS_ETC / n.netns, ignore_errors=True)
            _sh("ip", "link", "del", self.bridge, check=False)
            self._built = False
        for p in self.procs:
            p.result()  # reap, join the readers
        self.procs = []
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    # ------------------------------------------------------------------ running

    def command(self, node: int, argv: Sequence[str], delay_s: float = 0.0) -> list[str]:
        """``argv`` as it runs inside ``node``: its namespace, its host name, after ``delay_s``."""
        n = self.nodes[node]
        script = 'hostname "$0" && exec "$@"'
        if delay_s > 0:
            script = f'hostname "$0" && sleep {delay_s:g} && exec "$@"'
        return ["ip", "netns", "exec", n.netns, "unshare", "-u", "sh", "-c", script, n.hostname,
                *map(str, argv)]

    def start(self, node: int, argv: Sequence[str], env: dict[str, str] | None = None,
              delay_s: float = 0.0, cwd: str | None = None) -> NodeProcess:
        """Start ``argv`` on ``node`` (``env``: its whole environment; None: this one's)."""
        p = NodeProcess(node, self.command(node, argv, delay_s), env, self.echo, cwd)
        self.procs.append(p)
        return p

    def launch_tcp(self, script_args: Sequence[str], nproc_per_node: int = 2,
                   env: dict[str, str] | None = None, delays: dict[int, float] | None = None,
                   node_env: dict[int, dict[str, str]] | None = None,
                   module: bool = False, cwd: str | None = None) -> list[NodeProcess]:
        """``python -m minidist.launch --nnodes N --node-rank i ...`` on every node ``i``.

        ``delays``: node -> seconds to wait before its launcher starts; ``node_env``: node ->
        variables that differ on that node (e.g. another ``MINIDIST_AUTH_TOKEN``).
        """
        jobs = []
        for n in self.nodes:
            argv = [sys.executable, "-m", "minidist.launch", "--nnodes", str(self.num_nodes),
                    "--node-rank", str(n.index), "--nproc-per-node", str(nproc_per_node),
                    "--master-addr", self.nodes[0].addr, "--master-port", str(MASTER_PORT),
                    *(["-m"] if module else []), *map(str, script_args)]
            e = dict(os.environ if env is None else env)
            e.update((node_env or {}).get(n.index, {}))
            jobs.append(self.start(n.index, argv, e, (delays or {}).get(n.index, 0.0), cwd))
        return jobs

    def mpiexec_argv(self, program: Sequence[str], nproc_per_node: int = 2,
                     mpiexec: str | None = None) -> list[str]:
        """The mpiexec command (run it on node 0) that starts ``program`` on every node."""
        hosts = ",".join(f"{n.hostname}:{nproc_per_node}" for n in self.nodes)
        exe = mpiexec or find_mpiexec()
        return [exe, "-hosts", hosts, "-n", str(nproc_per_node * self.num_nodes),
                "-launcher", "ssh", "-launcher-exec", str(self.wrapper), *map(str, program)]

    def launch_mpi(self, program: Sequence[str], nproc_per_node: int = 2,
                   env: dict[str, str] | None = None, cwd: str | None = None) -> NodeProcess:
        """mpiexec (Hydra) on node 0 starting ``program`` with ``nproc_per_node`` per node."""
        return self.start(0, self.mpiexec_argv(program, nproc_per_node), env, cwd=cwd)

    def wait(self, jobs: Sequence[NodeProcess], timeout_s: float) -> list[NodeResult]:
        """Wait for every job up to ``timeout_s``; those still running then are killed (their
        ``returncode`` is None). Returns one NodeResult per job, in order."""
        deadline = time.monotonic() + timeout_s
        timed_out = False
        while any([j.poll() is None for j in jobs]):  # poll each: it notes when one ended
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
        results = []
        for j in jobs:
            running = j.poll() is None
            if timed_out and running:
                j.kill()
            r = j.result()
            if running:
                r.returncode = None
            results.append(r)
        return results

    # ------------------------------------------------------------------ faults

    def link(self, node: int, up: bool) -> None:
        """Bring ``node``'s link up or down (down: its packets vanish, no error to anyone)."""
        _sh("ip", "link", "set", self.nodes[node].link, "up" if up else "down")

    def kill_node(self, node: int) -> None:
        """SIGKILL every process of ``node`` (a machine that dies: its sockets close)."""
        _kill_netns(self.nodes[node].netns)

    def link_stats(self, node: int) -> dict[str, int]:
        """What left ``node`` by its eth0 so far: ``sent_bytes``, ``packets`` (the interface's
        counters) and ``dropped`` (by the rate limiter, its queue full; 0 without --rate)."""
        ns = ("ip", "netns", "exec", self.nodes[node].netns)
        tx = json.loads(_sh(*ns, "ip", "-j", "-s", "link", "show", "dev", "eth0").stdout)
        tx = tx[0]["stats64"]["tx"]
        text = _sh(*ns, "tc", "-s", "qdisc", "show", "dev", "eth0", check=False).stdout
        m = re.search(r"\(dropped (\d+),", text)
        return {"sent_bytes": int(tx["bytes"]), "packets": int(tx["packets"]),
                "dropped": int(m.group(1)) if m else 0}

    def pids(self, node: int) -> list[int]:
        """The processes still running inside ``node``."""
        return netns_pids(self.nodes[node].netns)


def find_mpiexec() -> str:
    """The mpiexec beside this interpreter (the venv's mpich wheel), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise ClusterUnavailable("no mpiexec: pip install mpich (or use the TCP launcher)")
    return found


# ---------------------------------------------------------------------- command line

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m minidist.testing.cluster",
        description="Build N nodes on this machine (network namespaces joined by a bridge, "
                    "each with its host name and an optional link rate), run a job across them "
                    "(minidist's TCP launcher, or mpiexec with --mpi), print every node's "
                    "output as [nodeI] lines, and tear everything down. Needs root.",
        epilog="TCP: COMMAND is the script and its arguments, as for python -m minidist.launch. "
               "MPI (--mpi): COMMAND is the program mpiexec starts (e.g. python script.py). "
               "--each: COMMAND runs as it is on every node (NODE_RANK, NNODES, MASTER_ADDR set).")
    p.add_argument("--nodes", type=int, default=2, help="number of nodes (default 2)")
    p.add_argument("--nproc-per-node", type=int, default=2, help="ranks per node (default 2)")
    p.add_argument("--rate", default=None,
                   help="rate of every node's link, a tc rate (100mbit, 1gbit, 10gbit); "
                        "default: unlimited")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--mpi", action="store_true", help="start COMMAND with mpiexec (Hydra)")
    mode.add_argument("--each", action="store_true", help="run COMMAND itself on every node")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds before the job is killed (default 3600)")
    p.add_argument("--delay", action="append", default=[], metavar="NODE:SECONDS",
                   help="start NODE's command SECONDS late (repeatable; TCP and --each)")
    p.add_argument("--cleanup", action="store_true",
                   help="only remove namespaces and links left by killed runs, then exit")
    p.add_argument("--check", action="store_true",
                   help="only say whether a cluster can be built here (exit 0) or why not (1)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="after --: what to run")
    a = p.parse_args(argv)
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    if not (a.cleanup or a.check) and not a.command:
        p.error("give a COMMAND after --, e.g. -- examples/train.py --epochs 2")
    if a.nodes < 1 or a.nproc_per_node < 1:
        p.error("--nodes and --nproc-per-node must be >= 1")
    try:
        a.delays = {int(k): float(v) for k, v in (d.split(":", 1) for d in a.delay)}
    except ValueError:
        p.error(f"--delay {a.delay}: use NODE:SECONDS, e.g. --delay 1:20")
    return a


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the with block: teardown runs


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m minidist.testing.cluster``; returns the exit code."""
    a = parse_args(argv)
    reason = unavailable_reason()
    if reason is not None:
        print(f"minidist.testing.cluster {reason}", file=sys.stderr)
        return 1
    if a.check:
        print("minidist.testing.cluster: network namespaces can be built here")
        return 0
    if a.cleanup:
        removed = cleanup_stale(verbose=True)
        print(f"[cluster] removed {len(removed)} stale item(s)")
        return 0
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _terminate),
                # Ctrl-C raises KeyboardInterrupt even where SIGINT came in ignored (a job
                # started in the background): the teardown must run.
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    try:
        with Cluster(a.nodes, a.rate, echo=True) as c:
            where = ", ".join(f"{n.hostname}={n.addr} ({n.netns})" for n in c.nodes)
            print(f"[cluster] {a.nodes} nodes: {where}; link rate {a.rate or 'unlimited'}",
                  file=sys.stderr, flush=True)
            if a.mpi:
                jobs = [c.launch_mpi(a.command, a.nproc_per_node)]
            elif a.each:
                jobs = []
                for n in c.nodes:
                    env = dict(os.environ, NODE_RANK=str(n.index), NNODES=str(a.nodes),
                               MASTER_ADDR=c.nodes[0].addr, MASTER_PORT=str(MASTER_PORT))
                    jobs.append(c.start(n.index, a.command, env, a.delays.get(n.index, 0.0)))
            else:
                jobs = c.launch_tcp(a.command, a.nproc_per_node, delays=a.delays)
            results = c.wait(jobs, a.timeout)
            code = 0
            for r in results:
                print(f"[cluster] node{r.node}: exit {r.returncode} after {r.elapsed_s:.1f} s",
                      file=sys.stderr)
                if r.returncode != 0 and code == 0:  # killed by a signal: 128 + its number
                    code = (124 if r.returncode is None else
                            128 - r.returncode if r.returncode < 0 else r.returncode)
            return code
    except ClusterUnavailable as e:
        print(str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("[cluster] interrupted: nodes torn down", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
