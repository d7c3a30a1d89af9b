"""Mistakes a newcomer makes, each answered in one clear line instead of a silently wrong run.

- a rank query or DDP before ``init_process_group`` under a launcher raises torch's error;
- ``./mpirun.sh`` with a bad ``-n``, no ``-n``, a number as the command or a ``.py`` file as the
  command exits 2 with one line that shows the usage;
- a 0-d accumulator Tensor is all-reduced in place; checkpoint folders hold one run each,
  ``--resume`` needs a checkpoint, ``--stop-after-epochs`` counts from the resume point;
- multi-line prints under mpiexec never run together; ``launch --nproc-per-node auto``.
Each run is a real ``./mpirun.sh`` job, bounded in time and killed on failure (tests/procs.py).
"""

import io
import re
import subprocess

import pytest

from minidist.watch.failure.report import WholeLineWriter
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


TRAIN = ["-n", "2", "python", REPO / "examples" / "train.py", "--hidden", "16"]


def test_checkpoint_folders_one_run_each_and_resume_needs_a_checkpoint(tmp_path):
    run_dir = tmp_path / "a"
    first = run_mpirun([*TRAIN, "--epochs", "4", "--checkpoint-dir", run_dir,
                        "--checkpoint-every", "1", "--keep-last", "2"], timeout_s=180)
    assert first.returncode == 0, first.report()
    assert sorted(p.name for p in run_dir.glob("checkpoint-*.npz")) == [
        "checkpoint-000003.npz", "checkpoint-000004.npz"], first.report()  # --keep-last 2
    # a new run into the same folder (another model here) is refused, nothing is written
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    other = run_mpirun([*TRAIN[:-1], "32", "--epochs", "2", "--checkpoint-dir", run_dir],
                       timeout_s=180)
    assert other.returncode == 1, other.report()
    assert f"checkpoint_dir {run_dir} already holds 2 checkpoint(s) of an earlier run " \
           "(newest checkpoint-000004.npz)" in other.stderr, other.report()
    assert "--checkpoint-dir runs/<name>" in other.stderr, other.report()
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before
    # --resume on a mistyped folder: an error, and no folder is made
    typo = run_mpirun([*TRAIN, "--checkpoint-dir", tmp_path / "nonexistent", "--resume"],
                      timeout_s=180)
    assert typo.returncode == 1, typo.report()
    assert "does not exist, so there is nothing to resume" in typo.stderr, typo.report()
    assert "--resume-if-present" in typo.stderr and not (tmp_path / "nonexistent").exists()
    fresh = run_mpirun([*TRAIN, "--epochs", "1", "--checkpoint-dir", tmp_path / "b",
                        "--resume-if-present"], timeout_s=180)
    assert fresh.returncode == 0 and "starting fresh" in fresh.stdout, fresh.report()
    # --stop-after-epochs counts from the resume point: after 4 epochs, 1 more
    more = run_mpirun([*TRAIN, "--epochs", "6", "--checkpoint-dir", run_dir, "--resume",
                       "--stop-after-epochs", "1"], timeout_s=180)
    assert more.returncode == 0, more.report()
    assert "epoch 5/6" in more.stdout and "epoch 6/6" not in more.stdout, more.report()


def test_a_warmup_longer_than_the_run_is_refused():
    job = run_mpirun([*TRAIN, "--epochs", "2", "--warmup-epochs", "100"], timeout_s=120)
    assert job.returncode == 2, job.report()
    assert "--warmup-epochs 100 is longer than --epochs 2" in job.stderr, job.report()


def test_launch_takes_torchruns_nproc_per_node_auto(tmp_path):
    import os

    script = tmp_path / "size.py"
    script.write_text("import os\nprint('WORLD_SIZE', os.environ['WORLD_SIZE'], flush=True)\n")
    job = run_python(["-m", "minidist.launch", "--standalone", "--nproc-per-node", "auto",
                      script], timeout_s=120)
    assert job.returncode == 0, job.report()
    from minidist.xp import gpu_count
    want = gpu_count() or os.cpu_count()
    assert job.stdout.count(f"WORLD_SIZE {want}") == want, job.report()


MULTILINE = """\
import io
import re
import minidist as md
md.init_process_group()
r, n = md.get_rank(), md.get_world_size()
for i in range(1000):
    print("\\n".join(f"[rank {r}/{n}] block {i} line {k} " + "x" * 40 for k in range(3)),
          flush=True)
md.destroy_process_group()
"""


def test_multi_line_prints_never_run_together_under_mpiexec(tmp_path):
    # PYTHONUNBUFFERED: print writes its text and its newline apart, the case that joined
    # lines (`... -> [3.0, 3.0][rank 1/3] reduce-scatter step 0` in course step 2)
    script = tmp_path / "blocks.py"
    script.write_text(MULTILINE)
    job = run_mpirun(["-n", "3", "python", script], timeout_s=120,
                     env={"PYTHONUNBUFFERED": "1"})
    assert job.returncode == 0, job.report()
    lines = job.stdout.splitlines()
    bad = [line for line in lines
           if not re.fullmatch(r"\[rank \d/3\] block \d+ line \d x{40}", line)]
    assert not bad and len(lines) == 3 * 1000 * 3, (bad[:5], len(lines))


class RecordingFile(io.RawIOBase):
    """A file that remembers each write the OS would have seen."""

    def __init__(self):
        self.writes = []

    def writable(self):
        return True

    def write(self, b):
        self.writes.append(bytes(b))
        return len(b)


@pytest.mark.parametrize("cls,line_buffering,want", [
    (io.TextIOWrapper, True, [b"a\nb", b"\n"]),     # what a line-buffered stream does
    (WholeLineWriter, False, [b"a\nb\n"]),          # one write per whole line
])
def test_a_multi_line_print_is_one_write(cls, line_buffering, want):
    raw = RecordingFile()
    stream = cls(io.BufferedWriter(raw), encoding="utf-8", line_buffering=line_buffering)
    print("a\nb", file=stream)
    stream.flush()
    assert raw.writes == want


def test_a_fixed_algorithm_gives_the_same_bits_under_mpirun_and_the_launcher(tmp_path):
    """README.md: --algorithm ring sums in one order under both transports (4 ranks)."""
    import numpy as np

    args = [REPO / "examples" / "train.py", "--epochs", "1", "--algorithm", "ring"]
    mpi = run_mpirun(["-n", "4", "python", *args, "--save-model", tmp_path / "mpi.npz"],
                     timeout_s=240)
    assert mpi.returncode == 0, mpi.report()
    tcp = run_python(["-m", "minidist.launch", "--standalone", "--nproc-per-node", "4", *args,
                      "--save-model", tmp_path / "tcp.npz"], timeout_s=240)
    assert tcp.returncode == 0, tcp.report()
    with np.load(tmp_path / "mpi.npz") as a, np.load(tmp_path / "tcp.npz") as b:
        assert a.files == b.files
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
