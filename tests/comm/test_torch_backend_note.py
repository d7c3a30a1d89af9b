"""init_process_group("gloo") under mpiexec with no MASTER_PORT runs the MPI transport: said at
INFO (the usual ported line works as meant), a warning only where a MASTER_ADDR shows the user
set up a TCP rendezvous that is then not used."""

import logging

from minidist.comm.backends import torch_backend_note
from minidist.comm.env import LaunchInfo


def notes(caplog, **info):
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="minidist"):
        torch_backend_note("gloo", "mpi", LaunchInfo(launcher="hydra", world_size=2,
                                                     local_rank=0, **info))
    return [(r.levelno, r.getMessage()) for r in caplog.records]


def test_gloo_under_mpiexec_is_info_unless_a_tcp_rendezvous_was_set_up(caplog):
    got = notes(caplog, rank=0)
    assert [lvl for lvl, _ in got] == [logging.INFO]
    assert "backend='gloo' under hydra: running minidist's MPI transport" in got[0][1]
    got = notes(caplog, rank=0, master_addr="10.0.0.1")
    assert [lvl for lvl, _ in got] == [logging.WARNING]
    assert "MASTER_ADDR=10.0.0.1 is set but MASTER_PORT is not" in got[0][1]
    assert notes(caplog, rank=1) == []                     # rank 0 speaks for the job
