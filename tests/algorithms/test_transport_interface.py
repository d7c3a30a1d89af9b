"""Every transport declares the capabilities callers use; nobody probes transports instead.

The Transport base class (minidist/comm/transports/base.py) declares ``timeout_s``,
``abort``/``abort_ends_job``, ``has_native_all_reduce``/``native_all_reduce``,
``shared_memory_comm``, ``side_comm`` and ``guard_node`` with defaults that mean "not
supported". These tests walk every Transport subclass in the package and check that each one
keeps the contract, and that no module reads a transport through getattr/hasattr.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import minidist
from minidist.comm.transports.base import Transport
from minidist.comm.transports.local import LocalTransport
from minidist.comm.transports.tcp import TCPTransport
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
        assert isinstance(cls.has_native_all_reduce, bool), cls
        # A declared capability comes with its implementation, and an implementation with
        # its declaration (one without the other is a probe waiting to happen).
        assert cls.has_native_all_reduce == _overrides(cls, "native_all_reduce"), cls
        assert cls.abort_ends_job == _overrides(cls, "abort"), cls
        for method in ("shared_memory_comm", "side_comm", "abort", "close", "isend", "irecv"):
            assert callable(getattr(cls, method)), (cls, method)


def _check_instance(t: Transport, timeout_s: float) -> None:
    assert t.timeout_s == timeout_s, (type(t), t.timeout_s)
    assert t.shared_memory_comm() is None and t.side_comm() is None
    assert t.guard_node is None
    assert not t.abort_ends_job and not t.has_native_all_reduce
    try:
        t.native_all_reduce(None, None)
    except NotImplementedError as e:
        assert "has_native_all_reduce" in str(e)
    else:
        raise AssertionError(f"{type(t).__name__}.native_all_reduce did not raise")


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
