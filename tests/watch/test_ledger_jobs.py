"""Mismatched collectives in real jobs (mpiexec and TCP): every rank ends with the diagnosis.

The rank script is tests/watch/mismatch_cases.py (rank 1 is the odd one out in every case; each
case runs on a fresh process group). Several cases share one job to keep the suite fast; every
job is bounded by its subprocess timeout, and each wait by MINIDIST_TIMEOUT_S=3.
"""

import re
import sys

import pytest

from procs import REPO, _run_group, job_env, mpiexec_path, reserved_ports, run_env_ranks, run_mpi

SCRIPT = REPO / "tests" / "watch" / "mismatch_cases.py"
ENV = {"MINIDIST_TIMEOUT_S": "3"}
# The case runs end every rank with os._exit(0) once all have printed (a failed MPI call may
# still be pending, so no MPI_Finalize). Without this flag mpiexec takes the first rank gone
# unfinalized for a crash and kills the ranks still exiting: exit 9 now and then under load.
NO_CLEANUP = ("-disable-auto-cleanup",)

# case -> what every rank's error must say (n=2; at n=3 the others are "ranks 0, 2")
EXPECT = {
    "skip": ["rank 1 made no collective #2 (last: #1, all_reduce(1024 x float32, sum)",
             "{others} called all_reduce(1024 x float32, sum) at mismatch_cases.py:",
             "note: collective #1 ran at different lines on different ranks"],
    "extra": ["rank 1 called all_reduce(1024 x float32, sum) as its collective #2 at "
              "mismatch_cases.py:", "{others} made no collective #2"],
    "bcast": ["rank 1 called broadcast(1024 x float32, src=0) as its collective #1 at "
              "mismatch_cases.py:", "{others} called all_reduce(1024 x float32, sum) at"],
    "dtype": ["rank 1 called all_reduce(1024 x int32, sum) as its collective #1",
              "{others} called all_reduce(1024 x float32, sum)"],
    "count": ["rank 1 called all_reduce(1000 x float32, sum) as its collective #1",
              "{others} called all_reduce(1024 x float32, sum)"],
    "op": ["rank 1 called all_reduce(1024 x float32, max) as its collective #1",
           "{others} called all_reduce(1024 x float32, sum)"],
    "order": ["rank 1 called broadcast(1024 x float32, src=0) as its collective #1",
              "{others} called all_reduce(1024 x float32, sum)"],
    # a skipped call in a loop is caught where the ranks part when the calls carry a label
    "labelled": ["#2: the ranks called different collectives",  # raised in call #2 itself
                 "rank 1 called all_reduce(1024 x float32, sum, iteration 2) as its "
                 "collective #2", "{others} called all_reduce(1024 x float32, sum, iteration 1)"],
}


def check_cases(stdout: str, n: int, cases: list[str]) -> None:
    lines = re.findall(r"^CASE (\w+) rank (\d+) (.*)$", stdout, re.M)
    got = {(c, int(r)): msg for c, r, msg in lines}
    others = "rank 0" if n == 2 else "ranks " + ", ".join(str(r) for r in range(n) if r != 1)
    for case in cases:
        for r in range(n):
            msg = got.get((case, r))
            assert msg is not None, f"case {case}: rank {r} printed nothing\n{stdout}"
            assert msg.startswith(("CollectiveMismatch: ", "CollectiveMismatchTimeout: ")), msg
            assert f"[rank {r}/{n}] " in msg and "the ranks called different collectives" in msg
            for want in EXPECT[case]:
                assert want.format(others=others) in msg, f"case {case}, rank {r}: {msg}"


@pytest.mark.mpi
def test_mpi_auto_every_mismatch_is_diagnosed_on_every_rank():
    cases = list(EXPECT)
    res = run_mpi(2, [SCRIPT, *cases], timeout_s=90, env=ENV, mpiexec_args=NO_CLEANUP)
    assert res.returncode == 0, res.report()
    check_cases(res.stdout, 2, cases)


@pytest.mark.mpi
def test_mpi_ring_mismatches():
    cases = ["dtype", "count", "op", "bcast", "labelled"]
    res = run_mpi(2, [SCRIPT, "--algorithm", "ring", *cases], timeout_s=90, env=ENV,
                  mpiexec_args=NO_CLEANUP)
    assert res.returncode == 0, res.report()
    check_cases(res.stdout, 2, cases)


@pytest.mark.mpi
def test_mpi_three_ranks_name_the_odd_rank_and_the_others():
    cases = ["bcast", "skip"]
    res = run_mpi(3, [SCRIPT, *cases], timeout_s=90, env=ENV, mpiexec_args=NO_CLEANUP)
    assert res.returncode == 0, res.report()
    check_cases(res.stdout, 3, cases)


@pytest.mark.mpi
def test_mpi_uncaught_mismatch_ends_the_job_with_every_ranks_finding():
    # The user's path: init_process_group, no try; the excepthook aborts the job. Every rank
    # logs its finding before any rank raises, so both lines are there despite the abort.
    res = run_mpi(2, [SCRIPT, "--uncaught", "dtype"], timeout_s=60, env=ENV)
    assert res.returncode != 0, res.report()
    for r in range(2):
        assert re.search(rf"\[rank {r}/2\] ERROR minidist.watch.failure: CollectiveMismatch: "
                         r"all_reduce\(algorithm=\"auto\"\) #1: the ranks called different "
                         r"collectives: rank 1 called all_reduce\(1024 x int32, sum\)",
                         res.stderr), res.report()
    assert "NO ERROR" not in res.stdout


@pytest.mark.mpi
def test_mpi_uncaught_mismatch_says_each_finding_once_in_one_block_per_rank():
    """A skipped collective at n=2: each rank's finding once, then one short block (where the
    program called it), written in one piece: no line holds two ranks' text."""
    res = run_mpi(2, [SCRIPT, "--uncaught", "skip"], timeout_s=60, env=ENV)
    assert res.returncode == 1, res.report()
    lines = res.stderr.splitlines()
    for r in range(2):
        mine = [i for i, line in enumerate(lines) if line.startswith(f"[rank {r}/2] ")]
        text = "\n".join(lines[i] for i in mine)
        assert text.count("the ranks called different collectives") == 1, res.report()
        assert "ERROR minidist.watch.failure: CollectiveMismatch" in lines[mine[0]], res.report()
        block = mine[1:]  # after the finding: the block, its lines next to each other
        assert block == list(range(block[0], block[0] + len(block))), res.report()
        assert lines[block[-1]].endswith("ending the job on all 2 ranks."), res.report()
        assert "Traceback (most recent call last)" not in text, res.report()
    assert len(lines) <= 20, res.report()
    assert not any(line.count("[rank ") > 1 for line in lines), res.report()
    assert "MPI_Abort" not in res.stderr, res.report()  # the line above already says it


@pytest.mark.mpi
def test_mpi_dead_rank_is_named_when_mpiexec_keeps_the_others_running():
    # By default mpiexec ends the whole job when a rank exits non-zero (exit code 3 here);
    # with -disable-auto-cleanup the survivors time out and say the dead rank did not answer.
    argv = [mpiexec_path(), "-disable-auto-cleanup", "-n", "2", sys.executable, str(SCRIPT),
            "die"]
    import subprocess
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=job_env({"MINIDIST_TIMEOUT_S": "1.5"}), cwd=str(REPO),
                         start_new_session=True)
    res = _run_group([p], argv, timeout_s=60)
    assert res.returncode != 0, res.report()
    assert re.search(r"CASE die rank 0 CommTimeout: \[rank 0/2\] all_reduce\(algorithm=\"auto\"\) "
                     r"#2: rank 1 did not answer within 1.5 s \(it is dead", res.stdout), \
        res.report()


def test_tcp_every_mismatch_is_diagnosed_on_every_rank():
    cases = list(EXPECT)
    with reserved_ports(len(cases)) as port:  # case i meets at MASTER_PORT + i
        res = run_env_ranks(2, [SCRIPT, "--tcp", *cases], timeout_s=90, env=ENV, port=port)
    assert res.returncode == 0, res.report()
    check_cases(res.stdout, 2, cases)


def test_tcp_dead_rank_is_named_by_the_survivors():
    res = run_env_ranks(3, [SCRIPT, "--tcp", "die"], timeout_s=60, env=ENV)
    assert res.returncode != 0  # rank 2 exited with 3
    for r in (0, 1):
        assert re.search(rf"CASE die rank {r} CommError: \[rank {r}/3\] all_reduce"
                         r"\(algorithm=\"auto\"\) #2: rank 2 is dead: its connection closed .*"
                         r"ranks 0, 1 are in collective #2, all_reduce\(1024 x float32, sum\)",
                         res.stdout), res.report()
