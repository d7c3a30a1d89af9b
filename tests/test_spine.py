"""The spine alone trains: examples/train_spine.py with MINIDIST_WINGS=none, and no wing loaded.

The spine and its wings are minidist/wings.py's; the import-linter contract "the spine imports
no wing" (pyproject.toml) checks the imports, these runs check a real job: over MPI (ring) at
n=4 and with four thread ranks, each in deterministic mode, so the accuracy is the same bits on
any machine. Each run also reports which wing modules it imported: none.
"""

import json
import re

import pytest

from procs import run_mpi, run_python

# runs the example as its own __main__, then says which wing modules the process holds
WRAPPER = ("import json, runpy, sys\n"
           "sys.argv = ['train_spine.py'] + sys.argv[1:]\n"
           "runpy.run_path('examples/train_spine.py', run_name='__main__')\n"
           "from minidist import wings\n"
           "print('WINGS ' + json.dumps(sorted(m for m in sys.modules "
           "if wings.is_wing_module(m))), flush=True)\n")
BAR = 0.97


def accuracy(stdout: str, report: str) -> float:
    found = re.findall(r"final test_acc (\d\.\d+)", stdout)
    assert found, report
    return float(found[-1])


def wing_modules(stdout: str) -> list[list[str]]:
    # (without the watch wing the ranks' lines are not written whole: they may share a line)
    return [json.loads(found) for found in re.findall(r"WINGS (\[[^\]]*\])", stdout)]


@pytest.mark.parametrize("launch", ["mpi", "threads"])
def test_the_spine_alone_trains_the_main_job_with_no_wing_loaded(launch):
    args = ["-c", WRAPPER, "--deterministic"]
    env = {"MINIDIST_WINGS": "none"}
    if launch == "mpi":
        job = run_mpi(4, args + ["--algorithm", "ring"], timeout_s=300, env=env)
        ranks = 4
    else:
        job = run_python(args + ["--threads", "4"], timeout_s=300, env=env)
        ranks = 1
    assert job.returncode == 0, job.report()
    assert accuracy(job.stdout, job.report()) >= BAR, job.report()
    loaded = wing_modules(job.stdout)
    assert len(loaded) == ranks and not any(loaded), job.report()


def test_with_every_wing_the_same_script_runs_and_loads_them():
    job = run_python(["-c", WRAPPER, "--threads", "2", "--epochs", "1"], timeout_s=300)
    assert job.returncode == 0, job.report()
    (loaded,) = wing_modules(job.stdout)
    assert {"minidist.fastpath", "minidist.tcp", "minidist.auto", "minidist.amp",
            "minidist.trainer", "minidist.utils", "minidist.distributed"} <= set(loaded), loaded


def test_without_the_wings_their_public_names_are_absent_and_the_spine_is_whole():
    code = ("import minidist as md\n"
            "print(hasattr(md, 'Trainer'), hasattr(md, 'GradScaler'), hasattr(md, 'amp'),\n"
            "      hasattr(md, 'DistributedDataParallel'), hasattr(md, 'DistributedSampler'))\n")
    job = run_python(["-c", code], timeout_s=120, env={"MINIDIST_WINGS": "none"})
    assert job.returncode == 0, job.report()
    assert job.stdout.split() == ["False", "False", "False", "True", "True"], job.report()


def test_without_the_wings_their_algorithms_name_the_wing_and_the_fix():
    code = ("import numpy as np, minidist as md\n"
            "from minidist.comm.transports.threads import run_threads\n"
            "def body(t):\n"
            "    g = md.new_group_from_transport(t)\n"
            "    print(g.plan_all_reduce(np.ones(4, np.float32)).algorithm, flush=True)\n"
            "    g.all_reduce(np.ones(4, np.float32), algorithm='shm')\n"
            "run_threads(2, body)\n")
    job = run_python(["-c", code], timeout_s=120, env={"MINIDIST_WINGS": "none"})
    assert job.returncode != 0
    assert job.stdout.count("ring") == 2 and "shm" not in job.stdout, job.report()
    assert "'shm' belongs to the fastpath wing, which MINIDIST_WINGS leaves out" in job.stderr


def test_every_wing_algorithm_is_named_in_the_manifest():
    # an algorithm asked for without its wing names the wing (wings.ALGORITHM_WINGS): the
    # table lists exactly what the wings register, each under the wing whose module holds it
    from minidist import wings
    from minidist.comm.algorithms import ALGORITHMS
    added = {n: a for n, a in ALGORITHMS.items() if n not in ("direct", "ring", "tree", "rd")}
    assert set(added) == set(wings.ALGORITHM_WINGS), sorted(added)
    for name, entry in added.items():
        assert wings.is_wing_module(entry.run.__module__) == wings.ALGORITHM_WINGS[name], name
