"""docs/troubleshooting.md quotes real output: every command marked ``<!-- run: ... -->`` runs
here, and every line of the code block after it must appear in what the command printed.

Marker syntax: ``<!-- run: [VAR=VALUE ...] KIND N ARGS... -->``

    mpi N ARGS           mpiexec -n N python tests/watch/mismatch_cases.py ARGS
    mpi-noclean N ARGS   the same with mpiexec -disable-auto-cleanup
    tcp N ARGS           N torchrun-style ranks of mismatch_cases.py --tcp ARGS
    tcp-missing N R      N-1 ranks of a script that calls init_process_group (rank R missing)
    script N PATH ARGS   mpiexec -n N python PATH ARGS

Compared after normalising what changes from run to run: ports (``127.0.0.1:PORT``) and the
``(found ...)`` clause (which rank noticed first). A quoted line ``[rank r/N]   ...`` stands for
traceback lines and is not compared.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from procs import (REPO, _run_group, job_env, mpiexec_path, reserved_ports, run_env_ranks,
                   run_mpi)

DOC = REPO / "docs" / "troubleshooting.md"
CASES = REPO / "tests" / "watch" / "mismatch_cases.py"
MARKER = re.compile(r"^<!-- run: ([^>\n]*?) -->\n```\n(.*?)```", re.S | re.M)


def checked_blocks() -> list[tuple[str, list[str]]]:
    return [(cmd.strip(), block.strip("\n").splitlines())
            for cmd, block in MARKER.findall(DOC.read_text())]


def normalise(text: str) -> str:
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    return re.sub(r"\(found [^)]*\)", "(found ...)", text)


def run(cmd: str) -> str:
    words = cmd.split()
    env = {"MINIDIST_TIMEOUT_S": "10"}
    while "=" in words[0]:
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    kind, n, args = words[0], int(words[1]), words[2:]
    if kind == "mpi":
        job = run_mpi(n, [CASES, *args], timeout_s=90, env=env)
    elif kind == "script":
        job = run_mpi(n, [REPO / args[0], *args[1:]], timeout_s=90, env=env)
    elif kind == "tcp":
        job = run_env_ranks(n, [CASES, "--tcp", *args], timeout_s=90, env=env)
    elif kind == "mpi-noclean":
        argv = [mpiexec_path(), "-disable-auto-cleanup", "-n", str(n), sys.executable,
                str(CASES), *args]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=job_env(env), cwd=str(REPO), start_new_session=True)
        job = _run_group([p], argv, timeout_s=90)
    elif kind == "tcp-missing":
        missing = int(args[0])
        argv = [sys.executable, "-c", "import minidist as md; md.init_process_group()"]
        procs = []
        with reserved_ports() as port:
            for r in range(n):
                if r != missing:
                    e = job_env(env)
                    e.update(RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=str(port))
                    procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True, env=e,
                                                  cwd=str(REPO), start_new_session=True))
            job = _run_group(procs, argv, timeout_s=90)
    else:
        raise AssertionError(f"unknown kind in marker: {cmd}")
    return job.stdout + job.stderr


BLOCKS = checked_blocks()


def test_the_documented_failure_cases_are_checked():
    kinds = {cmd.split()[0] if "=" not in cmd.split()[0] else cmd.split()[1]
             for cmd, _ in BLOCKS}
    assert {"mpi", "mpi-noclean", "tcp", "tcp-missing", "script"} <= kinds, kinds


@pytest.mark.mpi
@pytest.mark.parametrize("cmd,lines", BLOCKS, ids=[c for c, _ in BLOCKS])
def test_quoted_output_appears_in_a_real_run(cmd, lines):
    out = normalise(run(cmd)).splitlines()
    for line in lines:
        if re.fullmatch(r"\[rank \d+/\d+\]   \.\.\.", line):
            continue
        want = normalise(line)
        assert any(want in got for got in out), (
            f"docs/troubleshooting.md, block after <!-- run: {cmd} -->: this line is not in "
            f"the real output:\n{line}\n--- real output ---\n" + "\n".join(out))
