"""Mistakes a newcomer makes, each answered in one clear line instead of a silently wrong run.

- a rank query or DDP before ``init_process_group`` under a launcher raises torch's error;
- ``./mpirun.sh`` with a bad ``-n``, no ``-n``, a number as the command or a ``.py`` file as the
  command exits 2 with one line that shows the usage.
Each run is a real ``./mpirun.sh`` job, bounded in time and killed on failure (tests/procs.py).
"""

import subprocess

import pytest

from procs import REPO, job_env, run_mpirun, run_python

NOT_INITIALIZED = "Default process group has not been initialized, please make sure to call " \
                  "init_process_group"
QUERY = "import minidist as md\nprint('rank', md.get_rank(), flush=True)\n"
DDP = ("import minidist as md\nfrom minidist import nn\n"
       "md.DistributedDataParallel(nn.Linear(2, 2))\nprint('rank', md.get_rank(), flush=True)\n")


@pytest.mark.parametrize("body,what", [(QUERY, "get_rank()"), (DDP, "DistributedDataParallel")])
def test_query_or_ddp_before_init_raises_under_a_launcher(body, what, tmp_path):
    script = tmp_path / "forgot_init.py"
    script.write_text(body)
    job = run_mpirun(["-n", "2", "python", script], timeout_s=120)
    assert job.returncode != 0, job.report()
    assert "rank 0" not in job.stdout and "rank 1" not in job.stdout, job.report()
    for r in (0, 1):
        assert f"[rank {r}/2] {what}" in job.stderr, job.report()
    assert NOT_INITIALIZED in job.stderr and "Call minidist.init_process_group() first" \
        in job.stderr, job.report()


def test_query_and_ddp_in_a_single_process_answer_rank_0_of_1(tmp_path):
    script = tmp_path / "single.py"
    script.write_text(DDP)
    job = run_python([script], timeout_s=60)
    assert job.returncode == 0, job.report()
    assert "rank 0" in job.stdout, job.report()


@pytest.mark.parametrize("args,says", [
    (["-n", "abc", "python", "x.py"], "-n abc: the number of ranks must be a whole number >= 1"),
    (["-n", "0", "python", "x.py"], "-n 0: the number of ranks must be a whole number >= 1"),
    (["python", "examples/train.py"], "no -n N before 'python'"),
    (["-n", "2", "examples/train.py"], "'examples/train.py' is a Python file, not a command: "
                                       "put python before it (./mpirun.sh -n 2 python "
                                       "examples/train.py)"),
    (["4", "python", "examples/train.py"], "'4' is not a command: give the number of ranks "
                                           "with -n (./mpirun.sh -n 4 ...)"),
    (["-n", "2"], "no command after -n 2"),
])
def test_mpirun_sh_argument_errors_are_one_line_with_the_usage(args, says):
    res = subprocess.run([str(REPO / "mpirun.sh"), *args], cwd=REPO, env=job_env(),
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.startswith("mpirun.sh:")]
    assert len(lines) == 1 and says in lines[0], res.stderr
    assert "usage: ./mpirun.sh -n N command" in lines[0] and res.stdout == "", res.stderr


ACCUMULATOR = """\
import minidist as md
md.init_process_group()
pred, y = md.tensor([1.0, 2.0, 3.0]), md.tensor([1.0, 0.0, 3.0])
correct = md.tensor(0.0)
for _ in range(2):
    correct += (pred == y).sum()       # arithmetic on a 0-d Tensor keeps a writable 0-d array
correct *= 1
md.all_reduce(correct)                 # in place, as torch's dist.all_reduce(correct)
print(f"rank {md.get_rank()} correct {correct.item():g} ndim {correct.ndim}", flush=True)
md.destroy_process_group()
"""


def test_a_0d_accumulator_is_all_reduced_in_place(tmp_path):
    script = tmp_path / "accumulate.py"
    script.write_text(ACCUMULATOR)
    job = run_mpirun(["-n", "2", "python", script], timeout_s=120)
    assert job.returncode == 0, job.report()
    for r in (0, 1):
        assert f"rank {r} correct 8 ndim 0" in job.stdout, job.report()
