"""Where the peers live: every transport's byte counters, split by the peer's node.

    t.traffic()          # {"intra_node": bytes to ranks on my node, "inter_node": to others}
    t.reset_traffic()    # zero both (a test or benchmark counts one collective)

``set_peer_nodes`` tells a transport the node of every rank (``minidist.comm.topology`` calls it
once the nodes are known); ``host_machine_key`` is how the non-MPI transports find them.
"""

from __future__ import annotations

from typing import Any


def set_peer_nodes(transport: Any, nodes: list[int]) -> None:
    """Tell ``transport``'s byte counters the node of every rank (``nodes[r]``); counts restart
    at 0 (topology.py calls it once the nodes are known)."""
    me = nodes[transport.rank]
    transport._other_node = [int(n != me) for n in nodes]
    transport._sent = [0, 0]


def host_machine_key() -> int:
    """An integer equal on ranks that share one machine (a hash of the host name); MPI asks
    MPI instead (``MPIHandles.machine_key``: its shared-memory split)."""
    import hashlib
    import socket

    digest = hashlib.blake2b(socket.gethostname().encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


class ByteCounters:
    """The payload bytes a transport sent, by the peer's node (a base of ``Transport``)."""

    _other_node: list | None = None  # per rank: 1 if it lives on another node, else 0
    _sent: list | None = None  # payload bytes sent: [to my node, to other nodes]

    def _count_sent(self, dst: int, nbytes: int) -> None:
        """Add ``nbytes`` sent to ``dst`` to the byte counters (every send path calls this)."""
        sent, other = self._sent, self._other_node
        if sent is None:
            sent = self._sent = [0, 0]
        sent[other[dst] if other is not None else 0] += nbytes

    def traffic(self) -> dict:
        """Payload bytes this rank sent since the last reset, split by the peer's node.

        Returns:
            ``{"intra_node": int, "inter_node": int}``; every rank counts as on my node until
            ``set_peer_nodes`` was called (the process group does it at construction).
        """
        sent = self._sent or [0, 0]
        return {"intra_node": int(sent[0]), "inter_node": int(sent[1])}

    def reset_traffic(self) -> None:
        """Zero the byte counters."""
        self._sent = [0, 0]
