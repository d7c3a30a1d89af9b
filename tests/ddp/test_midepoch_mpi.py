"""Mid-epoch resume under mpiexec n=2: stop after 8 optimizer steps (mid-epoch), resume,
end bit-identical to a straight run (rank body: midepoch_rank.py); DataLoader and
DistributedSampler state_dict round trips in one process."""

import json

import numpy as np
import pytest

from procs import run_mpi


@pytest.mark.mpi
def test_trainer_resumes_mid_epoch_bit_identical(tmp_path):
    job = run_mpi(2, ["tests/ddp/midepoch_rank.py", tmp_path], timeout_s=120)
    assert job.returncode == 0, job.report()
    res = json.loads(next(l for l in job.stdout.splitlines()
                          if l.startswith("RESULT "))[len("RESULT "):])
    assert res["stop_step"] == 8 and res["end_step"] == res["steps"] == 21
    assert res["saved"] == ["checkpoint-000004.npz", "checkpoint-000008.npz"]
    assert res["stopped_differs"] and res["ranks_agree"]
    assert res["same_as_straight"], res


def test_loader_state_dict_continues_at_the_next_batch():
    from minidist.data import ArrayDataset, DataLoader, DistributedSampler

    data = ArrayDataset(np.arange(40, dtype=np.float32).reshape(20, 2), np.arange(20))

    def loader():
        return DataLoader(data, batch_size=3, sampler=DistributedSampler(
            data, num_replicas=2, rank=1, shuffle=True, seed=5))

    full, part = loader(), loader()
    full.set_epoch(4)
    expected = [y.tolist() for _, y in full]
    part.set_epoch(4)
    it = iter(part)
    seen = [next(it)[1].tolist() for _ in range(2)]
    state = part.state_dict()
    assert state["epoch"] == 4 and state["batches_yielded"] == 2
    resumed = loader()
    resumed.load_state_dict(state)
    resumed.set_epoch(4)                   # what a training loop does: keeps the position
    assert seen + [y.tolist() for _, y in resumed] == expected
    assert resumed.state_dict()["batches_yielded"] == 0  # the pass is over
    other = DataLoader(data, batch_size=3, sampler=DistributedSampler(
        data, num_replicas=2, rank=1, shuffle=True, seed=6))
    with pytest.raises(ValueError, match="saved seed=5 but this sampler has 6"):
        other.load_state_dict(state)
