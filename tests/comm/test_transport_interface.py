"""Every transport declares the capabilities callers use; nobody probes transports instead.

The Transport base class (minidist/comm/transports/base.py) is the point-to-point interface
(at most 12 public methods); it declares ``timeout_s``, ``abort``/``abort_ends_job``, ``mpi``
(MPI's communicators, for MPI-only code) and ``side_channel`` with defaults that mean "not
supported". These tests walk every Transport subclass in the package and check that each one
keeps the contract, and that no module reads a transport through getattr/hasattr.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import minidist
from minidist.comm.transports.base import NO_SIDE_CHANNEL, SideChannel, Transport
from minidist.comm.transports.local import LocalTransport
from minidist.tcp.transport import TCPTransport
from minidist.comm.transports.threads import ThreadWorld

PACKAGE = Path(minidist.__file__).parent


def _all_transport_classes() -> list[type]:
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="minidist."):
        if info.name.startswith(("minidist.comm", "minidist.viz")):
            importlib.import_module(info.name)
    found, todo = [], list(Transport.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if c.__module__.startswith("minidist.")]


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(Transport, name)


def test_every_transport_class_keeps_the_declared_interface():
    classes = _all_transport_classes()
    names = {c.__name__ for c in classes}
    assert {"LocalTransport", "ThreadTransport", "TCPTransport", "MPITransport"} <= names, names
    for cls in classes:
        assert isinstance(cls.abort_ends_job, bool), cls
        # A declared capability comes with its implementation, and an implementation with
        # its declaration (one without the other is a probe waiting to happen).
        assert cls.abort_ends_job == _overrides(cls, "abort"), cls
        for method in ("abort", "close", "isend", "irecv"):
            assert callable(getattr(cls, method)), (cls, method)


POINT_TO_POINT = {"isend", "irecv", "send", "recv", "sendrecv", "alloc_buffer", "split",
                  "abort", "close", "traffic", "reset_traffic", "cuda_aware"}


def _public_methods(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))
            or isinstance(getattr(cls, n, None), property)}


def test_transport_is_the_point_to_point_interface():
    """Side channels, MPI's own paths and capability flags live on objects of their own
    (``side_channel``, ``mpi``), not as more methods of every transport."""
    assert _public_methods(Transport) <= POINT_TO_POINT and len(POINT_TO_POINT) <= 12
    for cls in _all_transport_classes():
        extra = _public_methods(cls) - _public_methods(Transport)
        assert not extra, f"{cls.__name__} adds public methods {sorted(extra)}"
    assert isinstance(Transport.side_channel, SideChannel)


def _check_instance(t: Transport, timeout_s: float) -> None:
    assert t.timeout_s == timeout_s, (type(t), t.timeout_s)
    assert t.mpi is None
    assert not t.abort_ends_job
    assert isinstance(t.side_channel, SideChannel)
    if t.size == 1 and t.side_channel is NO_SIDE_CHANNEL:
        try:
            t.side_channel.send(0, 1, b"")
        except NotImplementedError as e:
            assert "no side channel" in str(e)
        else:
            raise AssertionError(f"{type(t).__name__}.side_channel.send did not raise")


def test_instances_without_mpi_have_the_defaults():
    _check_instance(LocalTransport(timeout_s=7.0), 7.0)
    _check_instance(ThreadWorld(2, timeout_s=9.0).transport(1), 9.0)
    tcp = TCPTransport(0, 1, "127.0.0.1", 0, timeout_s=5.0)
    try:
        _check_instance(tcp, 5.0)
    finally:
        tcp.close()
    LocalTransport().abort(1)  # the default abort closes and returns


# getattr(transport, ...), hasattr(group.transport, ...); in comm/ also the short names
# (t, self.t, inner) that comm code gives transports (elsewhere ``t`` is often a Tensor).
_PROBE = re.compile(r"\b(?:getattr|hasattr)\(\s*(?:[\w.]*\.)?transport\s*,")
_PROBE_COMM = re.compile(r"\b(?:getattr|hasattr)\(\s*(?:[\w.]*\.)?(?:transport|t|inner)\s*,")


def test_no_module_probes_a_transport():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        probe = _PROBE_COMM if path.parent.name in ("comm", "transports", "algorithms") \
            else _PROBE
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if probe.search(line):
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    assert not hits, ("transport capabilities are declared on Transport (base.py); use them "
                      "instead of getattr/hasattr:\n" + "\n".join(hits))


def test_a_transports_buffer_starts_on_a_cache_line():
    """NumPy starts a large array 16 bytes into a cache line; DDP's buckets come from
    ``alloc_buffer`` and their gradient slots sit on cache lines of the buffer."""
    import numpy as np

    from minidist.comm.transports.base import line_aligned_empty
    for numel, dtype in ((0, "float32"), (1, "float64"), (10, "float16"), (1_059_850, "float32")):
        buf = line_aligned_empty(numel, dtype)
        assert (numel == 0 or buf.ctypes.data % 64 == 0) and buf.shape == (numel,)
        assert buf.dtype == dtype
        assert buf.flags.c_contiguous and buf.flags.writeable
        buf[...] = 1  # all of it is ours
