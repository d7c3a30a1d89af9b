"""DistributedSampler against torch's semantics, checked as properties over many configurations."""

import itertools
import math

import numpy as np
import pytest

from minidist.data import DistributedSampler

LENGTHS = [0, 1, 2, 3, 5, 7, 10, 16, 17, 31]
WORLDS = [1, 2, 3, 4, 5, 8]


def shards(length, n, **kw):
    return [DistributedSampler(length, num_replicas=n, rank=r, **kw) for r in range(n)]


@pytest.mark.parametrize("drop_last,shuffle", list(itertools.product([False, True], [False, True])))
def test_sizes_coverage_and_padding(drop_last, shuffle):
    for length, n, epoch in itertools.product(LENGTHS, WORLDS, [0, 3]):
        samplers = shards(length, n, shuffle=shuffle, drop_last=drop_last, seed=7)
        for s in samplers:
            s.set_epoch(epoch)
        per_rank = [list(s) for s in samplers]
        # torch's sizes
        if drop_last and length % n:
            local = math.ceil((length - n) / n)
        else:
            local = math.ceil(length / n)
        assert all(len(idx) == local == len(s) == s.local_size for idx, s in zip(per_rank, samplers))
        total = local * n
        assert samplers[0].total_size == total
        everything = [i for idx in per_rank for i in idx]
        assert all(0 <= i < length for i in everything)
        if drop_last:
            # no padding: all distinct, exactly `total` of the N indices
            assert len(set(everything)) == len(everything) == total
            assert samplers[0].padded_size == 0
        else:
            # every index is read, and exactly total - N reads are duplicates
            assert set(everything) == set(range(length))
            assert samplers[0].padded_size == total - length
            assert len(everything) - len(set(everything)) == total - length
        if length % n == 0:
            assert len(set(everything)) == len(everything)  # disjoint when n divides N


def test_padding_repeats_the_front_like_torch():
    # N=10, n=4, no shuffle: padded list 0..9, 0, 1 -> rank r takes [r::4]
    got = [list(s) for s in shards(10, 4, shuffle=False)]
    assert got == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    # padding larger than N (N=2, n=5): torch repeats the list: 0 1 | 0 1 0
    assert [list(s) for s in shards(2, 5, shuffle=False)] == [[0], [1], [0], [1], [0]]
    # drop_last truncates the tail: N=10, n=4 -> 2 per rank, indices 0..7
    assert [list(s) for s in shards(10, 4, shuffle=False, drop_last=True)] == [
        [0, 4], [1, 5], [2, 6], [3, 7]]


def test_shuffle_is_seed_plus_epoch_and_identical_across_constructions():
    a = DistributedSampler(100, num_replicas=3, rank=1, seed=5)
    b = DistributedSampler(list(range(100)), num_replicas=3, rank=1, seed=5)  # from a "dataset"
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    a.set_epoch(0)
    assert list(a) == first
    # the permutation is numpy's default_rng(seed + epoch), documented
    perm = np.random.default_rng(5 + 2).permutation(100)
    a.set_epoch(2)
    assert list(a) == np.resize(perm, 102)[1:102:3].tolist()
    assert list(DistributedSampler(100, 3, 1, seed=6)) != first


def test_valid_mask_marks_exactly_the_padding():
    for length, n in itertools.product(LENGTHS, WORLDS):
        counted = np.zeros(length, dtype=int)
        for s in shards(length, n, seed=1):
            s.set_epoch(4)
            counted += np.bincount(s.local_indices()[s.valid_mask()], minlength=length)
            assert len(s.valid_mask()) == s.local_size
        assert (counted == 1).all()  # with the mask, each sample counts exactly once


def test_invalid_rank_message_is_torchs():
    with pytest.raises(ValueError, match=r"Invalid rank 4, rank should be in the interval \[0, 3\]"):
        DistributedSampler(10, num_replicas=4, rank=4)
    with pytest.raises(ValueError, match=r"Invalid rank -1"):
        DistributedSampler(10, num_replicas=4, rank=-1)
    with pytest.raises(ValueError, match="num_replicas=0"):
        DistributedSampler(10, num_replicas=0, rank=0)


def test_defaults_without_a_process_group_are_one_process():
    s = DistributedSampler(10)
    assert (s.num_replicas, s.rank) == (1, 0)
    assert sorted(s) == list(range(10))


# A process started by a launcher as one of several ranks, with no init_process_group: the
# sampler must not quietly assume it is alone (every rank would train on everything).
SAMPLER_ALONE = ("from minidist.data import DistributedSampler\n"
                 "s = DistributedSampler(10)\n"
                 "print('num_replicas', s.num_replicas, 'rank', s.rank)\n")


@pytest.mark.parametrize("env,launcher", [
    ({"RANK": "1", "WORLD_SIZE": "2"}, "torchrun"),
    ({"PMI_RANK": "0", "PMI_SIZE": "4"}, "hydra"),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}, "openmpi"),
])
def test_default_world_under_a_multi_rank_launcher_without_a_group_raises(env, launcher):
    import subprocess
    import sys

    from procs import job_env

    result = subprocess.run([sys.executable, "-c", SAMPLER_ALONE], env=job_env(env),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0, result.stdout
    assert "RuntimeError" in result.stderr and "no process group is initialized" in result.stderr
    assert f"({launcher})" in result.stderr and "init_process_group()" in result.stderr


@pytest.mark.parametrize("env,expected", [
    ({}, "num_replicas 1 rank 0"),                              # a plain single process
    ({"RANK": "0", "WORLD_SIZE": "1"}, "num_replicas 1 rank 0"),  # a launcher with one rank
])
def test_default_world_of_a_single_process_is_one(env, expected):
    import subprocess
    import sys

    from procs import job_env

    result = subprocess.run([sys.executable, "-c", SAMPLER_ALONE], env=job_env(env),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and expected in result.stdout, result.stderr


def test_explicit_world_needs_no_process_group():
    s = DistributedSampler(10, num_replicas=2, rank=1)
    assert (s.num_replicas, s.rank) == (2, 1)
