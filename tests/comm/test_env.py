"""Launcher detection from environment dicts (pure: no processes started)."""

import os

import pytest

from minidist.comm.env import LaunchInfo, default_backend, detect_launch
from minidist.comm.transports.mpi import parse_cuda_aware_env


def test_single_process():
    info = detect_launch({})
    assert info == LaunchInfo("single", 0, 1, 0) and default_backend(info) == "local"


def test_openmpi():
    info = detect_launch({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                          "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("openmpi", 3, 4, 1)
    assert default_backend(info) == "mpi"


def test_hydra():
    info = detect_launch({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"})
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("hydra", 1, 2, 1)


def test_pmix_size_unknown_until_mpi():
    info = detect_launch({"PMIX_RANK": "2"})
    assert info.launcher == "pmix" and info.world_size is None and default_backend(info) == "mpi"


def test_torchrun():
    info = detect_launch({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                          "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert info == LaunchInfo("torchrun", 1, 2, 1, "10.0.0.1", 29500)
    assert default_backend(info) == "tcp"


def test_slurm_and_precedence():
    info = detect_launch({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"})
    assert (info.launcher, info.rank, info.world_size, default_backend(info)) == \
        ("slurm", 5, 8, "mpi")
    # srun + MPI sets PMI_* too: MPI wins; a torchrun under sbatch: torchrun wins over SLURM
    info = detect_launch({"SLURM_PROCID": "0", "PMI_RANK": "0", "PMI_SIZE": "1"})
    assert info.launcher == "hydra"
    # srun --mpi=pmi2: PMI_RANK/PMI_SIZE without a PMI local rank; SLURM_LOCALID gives it
    info = detect_launch({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "PMI_RANK": "3",
                          "PMI_SIZE": "4"})
    assert (info.launcher, info.rank, info.local_rank) == ("hydra", 3, 1)
    assert detect_launch({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0",
                          "SLURM_LOCALID": "1"}).local_rank == 0   # mpiexec's own wins
    assert detect_launch({"SLURM_PROCID": "0", "RANK": "0", "WORLD_SIZE": "1",
                          "MASTER_PORT": "1"}).launcher == "torchrun"


@pytest.mark.parametrize("env,message", [
    ({"RANK": "0", "WORLD_SIZE": "four"}, "WORLD_SIZE='four' is not an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 but WORLD_SIZE=4"),
    ({"RANK": "-1", "WORLD_SIZE": "4"}, "RANK=-1 must be >= 0"),
    ({"RANK": "0"}, "WORLD_SIZE is not set but RANK is"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "99999"}, "MASTER_PORT=99999"),
    ({"PMI_RANK": "0", "PMI_SIZE": "4", "WORLD_SIZE": "2"}, r"started 4 ranks but WORLD_SIZE=2"),
    ({"OMPI_COMM_WORLD_RANK": "x"}, "OMPI_COMM_WORLD_RANK='x' is not an integer"),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "2"}, "SLURM_PROCID=3 but SLURM_NTASKS=2"),
])
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        detect_launch(env)


def test_cuda_aware_env_parsing():
    assert parse_cuda_aware_env(None) is None and parse_cuda_aware_env("auto") is None
    assert parse_cuda_aware_env("1") is True and parse_cuda_aware_env("false") is False
    with pytest.raises(ValueError, match="MINIDIST_CUDA_AWARE_MPI='maybe'"):
        parse_cuda_aware_env("maybe")


def test_log_prefix_comes_from_the_launcher_before_init(monkeypatch):
    """A process that builds its transport itself (no init_process_group) still logs its rank."""
    from minidist import logger as log
    monkeypatch.setattr(log, "_rank", None)
    for k in ("RANK", "WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK",
              "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert log.rank_prefix() == "[rank 0/1]"
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert log.rank_prefix() == "[rank 2/3]"
    log.set_rank(1, 4)
    assert log.rank_prefix() == "[rank 1/4]"


def test_cores_per_rank_reads_the_affinity_and_the_ranks_on_this_node():
    from minidist.comm.env import available_cores, cores_per_rank, ranks_on_this_node

    assert ranks_on_this_node(8, {"MPI_LOCALNRANKS": "4"}) == 4
    assert ranks_on_this_node(8, {"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) == 2
    assert ranks_on_this_node(3, {}) == 3                       # one node assumed
    assert cores_per_rank(4, cores=2, machine_cores=2) == 0.5   # shared: oversubscribed
    assert cores_per_rank(2, cores=8, machine_cores=8) == 4.0
    assert cores_per_rank(4, cores=1, machine_cores=8) == 1.0   # pinned: its own core
    assert cores_per_rank(2, cores=4, machine_cores=16) == 4.0  # pinned to four
    assert 1 <= available_cores() <= (os.cpu_count() or 1)
