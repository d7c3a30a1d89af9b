"""Every variable of docs/env_vars.md, given a value it cannot use, gives one line naming the
variable, the value and what it accepts; switches accept true/yes/on and false/no/off."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from minidist import envvars
from minidist.envvars import EnvVarError, env, validate
from procs import REPO, job_env

DOC = (REPO / "docs" / "env_vars.md").read_text()
# What each documented variable refuses; None: it takes any text (a folder, an address, a secret).
BAD = {
    "MINIDIST_TIMEOUT_S": "abc", "MINIDIST_WINGS": "fast path", "MINIDIST_DEBUG": "verbose", "MINIDIST_LEDGER": "maybe",
    "MINIDIST_LEDGER_SIZE": "8", "MINIDIST_LEDGER_DUMP": None, "MINIDIST_CACHE_DIR": None,
    "MINIDIST_TUNE": "sometimes", "MINIDIST_LOG_LEVEL": "LOUD", "MINIDIST_CUDA_AWARE_MPI": "2",
    "MINIDIST_TRACE": None, "MINIDIST_FAKE_VERSION": None, "MINIDIST_DEVICE": "tpu",
    "MINIDIST_KERNELS": "fast", "MINIDIST_AUTH_TOKEN": None, "MINIDIST_RUN_ID": None,
    "MINIDIST_RENDEZVOUS_PORT": "70000",
    "MINIDIST_TCP_LISTEN_ADDR": None, "MINIDIST_TCP_HANDSHAKE_S": "-1",
    "MINIDIST_TCP_MAX_MESSAGE_BYTES": "1e9", "MINIDIST_RANKS_PER_NODE": "0",
    "MINIDIST_SHM_CHUNK_BYTES": "64MiB", "MINIDIST_SHM_SMALL_BYTES": "x",
    "MINIDIST_SHM_PIECE_BYTES": "1.5", "MINIDIST_STAGE_CHUNK_BYTES": "0",
    "MINIDIST_CUDA_JIT": "cupy", "MINIDIST_CUDA_LAUNCH": "fast", "MINIDIST_LAUNCH_FD": "x",
    "MINIDIST_LAUNCHER": "torchrun", "MINIDIST_IPC_ORDER": "gpu",
}


def documented() -> set[str]:
    knobs = DOC.split("## minidist knobs", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(MINIDIST_[A-Z_]+)`", knobs, re.M))


def test_every_documented_variable_is_declared_and_checked_here():
    assert documented() == set(envvars.VARIABLES) == set(BAD)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_gives_one_line_naming_variable_value_and_what_it_accepts(name):
    var = envvars.VARIABLES[name]
    if BAD[name] is None:
        assert env(name, {name: "any text/at all"}) == "any text/at all"
        return
    with pytest.raises(EnvVarError) as err:
        env(name, {name: BAD[name]})
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{name}={BAD[name]!r} is not valid: it accepts {var.accepts}"), text


@pytest.mark.parametrize("value,level", [("1", 1), ("2", 2), ("true", 1), ("YES", 1), ("on", 1),
                                         ("false", 0), ("no", 0), ("0", 0), ("", 0)])
def test_debug_accepts_levels_and_switch_words(value, level):
    assert env("MINIDIST_DEBUG", {"MINIDIST_DEBUG": value}) == level


@pytest.mark.parametrize("value,on", [("true", True), ("Yes", True), ("off", False), ("0", False)])
def test_switches_accept_words(value, on):
    assert env("MINIDIST_LEDGER", {"MINIDIST_LEDGER": value}) is on


def test_the_package_reads_no_checked_variable_directly():
    """Checked variables go through envvars.env; only free-text ones may be read directly."""
    text_vars = {n for n, bad in BAD.items() if bad is None}
    for path in (REPO / "minidist").rglob("*.py"):
        for name in re.findall(r"environ(?:\.get\(|\[)\"(MINIDIST_[A-Z_]+)\"(?!\]\s*=)", path.read_text()):
            assert name in text_vars, f"{path}: reads {name} without minidist.envvars"


def _python(code: str, **env_vars: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=job_env(env_vars), cwd=REPO)


def test_bad_timeout_fails_at_import_with_the_one_line():
    out = _python("import minidist", MINIDIST_TIMEOUT_S="abc")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "MINIDIST_TIMEOUT_S='abc' is not valid: it accepts a positive number of seconds" in last
    assert "could not convert" not in out.stderr


def test_debug_true_means_on():
    out = _python("from minidist.logger import debug_level; print(debug_level())",
                  MINIDIST_DEBUG="true")
    assert out.stdout.strip() == "1", out.stderr


def test_mpirun_sh_checks_its_job_timeout():
    out = subprocess.run([str(REPO / "mpirun.sh"), "-n", "1", "true"], capture_output=True,
                         text=True, timeout=120, env=job_env({"MINIDIST_JOB_TIMEOUT_S": "abc"}))
    assert out.returncode == 2
    assert "MINIDIST_JOB_TIMEOUT_S='abc' is not valid: it accepts a positive number" in out.stderr


def test_a_bad_value_at_import_ends_the_program_with_one_line():
    env = job_env()
    env["MINIDIST_TIMEOUT_S"] = "abc"
    res = subprocess.run([sys.executable, "-c", "import minidist"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2  # a setting that cannot work: as argparse's usage errors
    assert res.stderr.splitlines() == [
        "minidist: MINIDIST_TIMEOUT_S='abc' is not valid: it accepts a positive number of "
        "seconds (default 300). Set such a value, or unset it."], res.stderr


def test_validate_names_the_closest_known_variable_of_a_typo():
    warnings = validate({"MINIDIST_TIMEOUT": "10", "MINIDIST_LEDGR": "0", "MINIDIST_ZZZ": "1",
                         "MINIDIST_JOB_TIMEOUT_S": "5"})
    assert [w.split(" is not")[0] for w in warnings] == [
        "MINIDIST_LEDGR", "MINIDIST_TIMEOUT", "MINIDIST_ZZZ"]
    assert "(did you mean MINIDIST_LEDGER?)" in warnings[0]
    assert "(did you mean MINIDIST_TIMEOUT_S?)" in warnings[1]
    assert "did you mean" not in warnings[2]


@pytest.mark.parametrize("name,value", [("MINIDIST_CUDA_JIT", "x"),
                                        ("MINIDIST_CUDA_AWARE_MPI", "x"),
                                        ("MINIDIST_KERNELS", "fast")])
def test_validate_checks_variables_read_only_on_some_paths(name, value):
    """Read only on the GPU path or by --amp: checked at the start all the same."""
    with pytest.raises(EnvVarError, match=f"{name}='{value}' is not valid"):
        validate({name: value})


def test_trace_and_ledger_dump_must_be_folders_that_can_be_written(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for name in ("MINIDIST_TRACE", "MINIDIST_LEDGER_DUMP"):
        with pytest.raises(EnvVarError, match="a folder this process can write to"):
            validate({name: str(a_file)})
        with pytest.raises(EnvVarError, match="a folder this process can write to"):
            validate({name: str(a_file / "below")})
        assert validate({name: str(tmp_path / "new" / "deeper")}) == []
    assert not (tmp_path / "new").exists()  # checked, not created


def test_tune_names_its_default_as_the_value_to_set():
    with pytest.raises(EnvVarError, match=r"\(default auto\)"):
        env("MINIDIST_TUNE", {"MINIDIST_TUNE": "2"})


def test_wings_parse_to_the_wings_asked_for_with_those_they_need():
    from minidist import wings
    assert wings.enabled({}) == list(wings.WINGS)
    assert wings.enabled({"MINIDIST_WINGS": "none"}) == []
    assert wings.enabled({"MINIDIST_WINGS": "auto"}) == ["fastpath", "auto"]
    assert wings.enabled({"MINIDIST_WINGS": " TCP , tcp"}) == ["tcp"]
    with pytest.raises(ValueError, match="fastpth is not a wing; use all, none, or names"):
        wings.enabled({"MINIDIST_WINGS": "fastpth"})
