"""What DDP says when a bucket's all-reduce fails: disagreement, network, or this rank's own error.

No namespaces needed: the three kinds come from a comm hook raising each, and a real peer that
dies comes from two TCP ranks (one exits mid-training); tests/cluster/ repeats the network case
across real (namespace) nodes.
"""

import numpy as np
import pytest
from procs import run_env_ranks

from minidist import nn
from minidist.comm.errors import (CollectiveMismatch, CommError, CommTimeout, PeerExited,
                                  PeerFailed)
from minidist.comm.advice import failure_advice, failure_kind
from minidist.ddp import DistributedDataParallel
from minidist.tensor import Tensor

DISAGREE = "every rank must run the same model and the same steps"


def test_kinds():
    assert failure_kind(CollectiveMismatch("x")) == "mismatch"
    assert failure_kind(CommTimeout("x")) == "network"
    assert failure_kind(PeerFailed("x", 3)) == "network"
    assert failure_kind(CommError("connection to rank 1 lost")) == "network"
    diagnosed = CommError("x")
    diagnosed.diagnosis = {"kind": "mismatch", "missing": {}}
    assert failure_kind(diagnosed) == "mismatch"
    assert failure_kind(ValueError("kernel")) == "local"


def test_a_peer_that_exited_is_named_with_its_code_not_as_a_network_failure():
    error = PeerExited("[rank 0/2] all_reduce: rank 1 exited with code 3", 1, 3)
    assert failure_kind(error) == "exited"
    text = failure_advice(error)
    assert text.startswith("Rank 1 left the job (exit code 3)") and "rank 1's log" in text
    assert DISAGREE not in text and "network" not in text and not text.endswith(".")


def test_network_advice_names_the_peer():
    assert "Rank 3 stopped answering" in failure_advice(PeerFailed("x", 3))
    silent = CommTimeout("x")
    silent.diagnosis = {"kind": "missing", "missing": {2: "is dead", 1: "did not answer"}}
    text = failure_advice(silent)
    assert text.startswith("Ranks 1, 2 stopped answering") and "their logs" in text
    assert DISAGREE not in text and not text.endswith(".")


def _fail_with(error, group_fixture=None):
    nn.manual_seed(0)
    ddp = DistributedDataParallel(nn.Sequential(nn.Linear(4, 3)))

    def hook(state, bucket):
        raise error

    ddp.register_comm_hook(None, hook)
    x = Tensor(np.ones((2, 4), np.float32))
    with pytest.raises(RuntimeError) as info:
        (ddp(x) ** 2).mean().backward()
    ddp.close()
    return info.value


@pytest.mark.parametrize("error,kind", [
    (CollectiveMismatch("[rank 0/2] all_reduce #4: the ranks called different collectives."),
     "mismatch"),
    (CommTimeout("[rank 0/2] recv(src=1): no message from rank 1 within 2 s."), "network"),
    (ZeroDivisionError("a kernel divided by zero"), "local"),
])
def test_ddp_message_fits_the_kind(group, error, kind):
    raised = _fail_with(error)
    text = str(raised)
    assert raised.__cause__ is error  # the original exception is chained
    assert ".." not in text, text
    assert type(error).__name__ in text and str(error).rstrip(".") in text
    assert (DISAGREE in text) == (kind == "mismatch"), text
    assert ("stopped answering" in text) == (kind == "network"), text
    assert ("on this rank itself" in text) == (kind == "local"), text


BODY = r"""
import os, sys
import numpy as np
from minidist import comm, nn
from minidist.ddp import DistributedDataParallel
from minidist.tensor import Tensor
comm.init_process_group()
nn.manual_seed(0)
ddp = DistributedDataParallel(nn.Sequential(nn.Linear(4, 3)))
x = Tensor(np.ones((2, 4), np.float32))
for step in range(3):
    if step == 1 and comm.get_rank() == 1:
        os._exit(7)  # a peer that dies without a word (a killed node)
    try:
        (ddp(x) ** 2).mean().backward()
    except RuntimeError as e:
        print("ERROR:", e, flush=True)
        os._exit(1)
print("no error", flush=True)
"""


def test_dead_peer_is_reported_as_network_not_disagreement(tmp_path):
    script = tmp_path / "body.py"
    script.write_text(BODY)
    res = run_env_ranks(2, [script], timeout_s=60, env={"MINIDIST_TIMEOUT_S": "5"})
    line = next((x for x in res.stdout.splitlines() if x.startswith("ERROR:")), None)
    assert line is not None, res.report()
    assert "rank 1" in line and "stopped answering" in line, line
    assert DISAGREE not in line and ".." not in line, line
