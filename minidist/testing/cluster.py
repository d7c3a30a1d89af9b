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

Parts: the namespaces in netns.py, a node and its processes in node_process.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from minidist.testing.netns import (MASTER_PORT, NETNS_ETC, PREFIX, SUBNET,  # noqa: F401
                                    TAG_SERIAL, ClusterUnavailable, cleanup_stale, kill_netns,
                                    netns_pids, rate_bytes_per_s, run_command,
                                    unavailable_reason)
from minidist.testing.node_process import Node, NodeProcess, NodeResult  # noqa: F401

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
        self.tag = f"{PREFIX}{os.getpid():06x}{next(TAG_SERIAL) % 256:02x}"
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
        run_command("ip", "link", "add", self.bridge, "type", "bridge")
        run_command("ip", "link", "set", self.bridge, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.addr} {n.hostname}\n" for n in self.nodes)
        for n in self.nodes:
            inner = f"{self.tag}p{n.index}"
            run_command("ip", "netns", "add", n.netns)
            etc = NETNS_ETC / n.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)
            (etc / "hostname").write_text(n.hostname + "\n")
            run_command("ip", "link", "add", n.link, "type", "veth", "peer", "name", inner)
            run_command("ip", "link", "set", n.link, "master", self.bridge)
            run_command("ip", "link", "set", n.link, "up")
            run_command("ip", "link", "set", inner, "netns", n.netns)
            ns = ("ip", "netns", "exec", n.netns)
            run_command(*ns, "ip", "link", "set", inner, "name", "eth0")
            run_command(*ns, "ip", "addr", "add", f"{n.addr}/24", "dev", "eth0")
            run_command(*ns, "ip", "link", "set", "eth0", "up")
            run_command(*ns, "ip", "link", "set", "lo", "up")
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
        run_command("ip", "netns", "exec", n.netns, "tc", "qdisc", "add", "dev", "eth0", "root",
                    "tbf", "rate", rate, "burst", str(burst), "latency", "100ms")

    def down(self) -> None:
        """Kill every process left in a node, delete namespaces, links and files (idempotent)."""
        for p in self.procs:
            p.kill()
        if self._built:
            for n in self.nodes:
                kill_netns(n.netns)
                run_command("ip", "netns", "del", n.netns, check=False)
                run_command("ip", "link", "del", n.link, check=False)  # gone with its peer, usually
                shutil.rmtree(NETNS_ETC / n.netns, ignore_errors=True)
            run_command("ip", "link", "del", self.bridge, check=False)
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
        run_command("ip", "link", "set", self.nodes[node].link, "up" if up else "down")

    def kill_node(self, node: int) -> None:
        """SIGKILL every process of ``node`` (a machine that dies: its sockets close)."""
        kill_netns(self.nodes[node].netns)

    def link_stats(self, node: int) -> dict[str, int]:
        """What left ``node`` by its eth0 so far: ``sent_bytes``, ``packets`` (the interface's
        counters) and ``dropped`` (by the rate limiter, its queue full; 0 without --rate)."""
        ns = ("ip", "netns", "exec", self.nodes[node].netns)
        tx = json.loads(run_command(*ns, "ip", "-j", "-s", "link", "show", "dev", "eth0").stdout)
        tx = tx[0]["stats64"]["tx"]
        text = run_command(*ns, "tc", "-s", "qdisc", "show", "dev", "eth0", check=False).stdout
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
