"""The launcher's command line (torchrun's flags and spellings) and the port it reserves.

    args = parse_args(["--nproc-per-node", "4", "--standalone", "train.py", "--lr", "0.1"])

``parse_args`` also settles what the flags imply: ``--standalone`` reserves a free port
(``reserve_port``: held until the job ends, so no other program takes it), the run id
(``--rdzv-id``, made up on one node) and, on one node, a fresh ``MINIDIST_AUTH_TOKEN``.
``python -m minidist.launch`` (minidist/launch.py) uses them; it re-exports both.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
from typing import Sequence


def nproc_value(text: str) -> int:
    """``--nproc-per-node``: a whole number, or torchrun's ``auto`` / ``cpu`` / ``gpu``."""
    if text.strip().lstrip("-").isdigit():
        return int(text)
    if text not in ("auto", "cpu", "gpu"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of ranks, auto, cpu or gpu")
    gpus = 0
    if text != "cpu":
        from minidist.xp import gpu_count  # lazy: only these values need to look for GPUs
        gpus = gpu_count()
    if text == "gpu" and gpus == 0:
        raise argparse.ArgumentTypeError("gpu: no usable GPU here (CuPy missing or no CUDA "
                                         "device); use a number, cpu or auto")
    return gpus if gpus else (os.cpu_count() or 1)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m minidist.launch",
        description="Start --nproc-per-node ranks of SCRIPT on this node with torchrun's "
                    "environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=nproc_value, default=1,
                   help="ranks to start on this node: a number, or torchrun's auto (one per "
                        "GPU, else one per CPU core), cpu (one per core), gpu (one per GPU) "
                        "(default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0,
                   help="this node's index in [0, nnodes) (default 0)")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1",
                   help="address of the node running rank 0 (default 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", type=int, default=29500,
                   help="rendezvous port on the master (default 29500)")
    p.add_argument("--standalone", action="store_true",
                   help="one node: rendezvous on 127.0.0.1 at a free port (ignores --master-*)")
    p.add_argument("--rdzv-id", "--rdzv_id", default=None,
                   help="the job's identity in the rendezvous (MINIDIST_RUN_ID of every rank): "
                        "a rank of another job is refused; the same on every node (default: "
                        "MINIDIST_RUN_ID, else a fresh one on one node)")
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=0,
                   help="after a failure, stop the group and start it again, up to this many "
                        "times (torchrun's elastic restarts; default 0)")
    p.add_argument("-m", "--module", action="store_true",
                   help="SCRIPT is a module name, run as `python -m SCRIPT`")
    p.add_argument("script", help="the Python script (or module with -m) each rank runs")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    args = p.parse_args(argv)
    if args.nproc_per_node < 1 or args.nnodes < 1:
        p.error(f"--nproc-per-node={args.nproc_per_node} and --nnodes={args.nnodes} must be >= 1")
    if not 0 <= args.node_rank < args.nnodes:
        p.error(f"--node-rank={args.node_rank} must be in [0, {args.nnodes}) (--nnodes)")
    if args.max_restarts < 0:
        p.error(f"--max-restarts={args.max_restarts} must be >= 0")
    if not 1 <= args.master_port <= 65535:
        p.error(f"--master-port={args.master_port} is not a TCP port; use 1..65535")
    if args.standalone:
        if args.nnodes != 1:
            p.error("--standalone is for one node; drop it or use --nnodes 1")
        args.master_addr = "127.0.0.1"
        args.reservation = reserve_port(args.master_addr)
        args.master_port = args.reservation.getsockname()[1]
    else:
        args.reservation = None
    one_node = args.nnodes == 1
    if args.rdzv_id is None:
        args.rdzv_id = os.environ.get("MINIDIST_RUN_ID") or (
            f"launch-{secrets.token_hex(4)}" if one_node else "")
    # A secret only this job's ranks know: nobody else on this machine can join or end it.
    given = os.environ.get("MINIDIST_AUTH_TOKEN")
    args.auth_token = given or (secrets.token_hex(16) if one_node else None)
    return args


def reserve_port(host: str) -> socket.socket:
    """A socket bound to a free port of ``host`` and kept open: the port stays reserved.

    The socket sets ``SO_REUSEADDR`` and never listens. On Linux another socket may then bind
    the same port only if it sets ``SO_REUSEADDR`` too, as rank 0's rendezvous listener does,
    while ordinary binds (and the kernel's choice of ephemeral ports) skip it. Picking a port
    and closing it again would leave a window in which another program could take it before
    rank 0 binds. Close the socket when the job has ended.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    return s
