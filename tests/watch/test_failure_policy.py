"""The failure policy a process group holds decides what an uncaught error does (one object).

By default an uncaught exception on one rank ends the job: its traceback with the rank prefix
and "ending the job on all N ranks", then the peers are ended (MPI Abort; over TCP the closed
connections end their waits at once). With ``FailurePolicy(end_job_on_error=False)`` the error
is raised as Python raises it: the rank prints Python's traceback and exits, and its peers find
out when it has gone (their collective raises, naming it).
"""

from __future__ import annotations

import dataclasses

import pytest

from minidist.watch.failure import FailurePolicy
from procs import REPO, run_env_ranks

BODY = REPO / "tests" / "watch" / "policy_rank.py"


def test_the_default_policy_ends_the_job():
    policy = FailurePolicy()
    assert policy.end_job_on_error and policy.diagnose_on_failure
    assert dataclasses.replace(policy, wait_notice_s=0).wait_notice_s == 0


@pytest.mark.parametrize("end_job", ["1", "0"])
def test_end_job_on_error_decides_between_ending_the_job_and_raising(end_job):
    job = run_env_ranks(2, [BODY, end_job], timeout_s=90, env={"MINIDIST_TIMEOUT_S": "60"})
    assert job.returncode != 0, job.report()
    assert "RuntimeError: rank one gives up" in job.stderr, job.report()
    if end_job == "1":
        assert "[rank 1/2] uncaught exception in the main thread; ending the job" in job.stderr
    else:
        assert "ending the job" not in job.stderr, job.report()
        assert "\nRuntimeError: rank one gives up" in "\n" + job.stderr, job.report()


def test_every_policy_number_has_one_owner():
    """A FailurePolicy field's default is written once, in policy.py: no module of the package
    sets a constant of the field's name to a number of its own (a name derived from the class,
    ``INTERRUPT_GRACE_S = FailurePolicy.interrupt_grace_s``, is fine), and policy.py keeps no
    second default object beside the class."""
    import ast

    fields = {f.name.upper() for f in dataclasses.fields(FailurePolicy)}
    own = []
    for path in sorted((REPO / "minidist").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                own += [f"{path.relative_to(REPO)}: {t.id}" for t in node.targets
                        if isinstance(t, ast.Name) and t.id in fields]
    assert not own, f"failure-policy numbers with a second owner: {own}"
    policy_src = (REPO / "minidist" / "watch" / "failure" / "policy.py").read_text()
    assert "= FailurePolicy()" not in policy_src
