"""scripts/bootstrap_venv.sh (sourced by ./test.sh and ./mpirun.sh): a bad MINIDIST_TEST_TORCH
is one line and exit 2, before anything is installed; CI's script runs the README's command."""

import subprocess

from procs import REPO


def test_a_bad_torch_switch_is_one_line_before_any_install():
    r = subprocess.run(["bash", "-c", "source scripts/bootstrap_venv.sh"], cwd=REPO,
                       env={"PATH": "/usr/bin:/bin", "MINIDIST_TEST_TORCH": "maybe"},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("minidist: MINIDIST_TEST_TORCH='maybe' is not valid: it accepts "
                                "1 (install torch for the parity tests) or 0 (default). Set "
                                "such a value, or unset it."), r.stderr


def test_ci_runs_the_readme_test_command_with_torch():
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "MINIDIST_TEST_TORCH=1 exec ./test.sh" in ci
    assert "MINIDIST_TEST_TORCH=1 ./test.sh" in readme


def test_the_torch_switch_is_a_known_variable():
    """CI sets it for the whole run: no process may warn that it is unknown."""
    from minidist import envvars

    assert envvars.validate({"MINIDIST_TEST_TORCH": "1"}) == []
