"""`mypy` passes on the package with the settings in pyproject.toml ([tool.mypy]).

Modules that failed when the check was added carry ``ignore_errors`` there. That list may only
shrink: it must stay within ``BASELINE`` below, and a module that type-checks cleanly must leave
it (so a fix is kept). The cache lives in the ignored ``.mypy_cache/``: a cold run takes about
8 s on two loaded cores, a warm one under a second.
"""

import re
import subprocess
import sys

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: mypy depends on tomli there
    import tomli as tomllib

from procs import REPO

BASELINE = {
    "minidist.amp.grad_scaler", "minidist.amp.master_weights", "minidist.checkpoint.serialize",
    "minidist.checkpoint.store",
    "minidist.comm.env", "minidist.fastpath.shm_window", "minidist.tcp.transport",
    "minidist.data.loader", "minidist.memory.zero",
    "minidist.multiprocessing", "minidist.nn.conv", "minidist.nn.layers", "minidist.nn.module",
    "minidist.nn.norm", "minidist.optim.sgd", "minidist.tensor.checkpoint",
    "minidist.tensor.core", "minidist.trainer", "minidist.xp",
}


def mypy(*args):
    try:
        import mypy  # noqa: F401 - the [test] extra installs it
    except ImportError:
        pytest.fail("mypy is not installed: pip install -e '.[test]' (the [test] extra brings it)")
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def ignored_modules():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    return {m for o in config.get("overrides", []) if o.get("ignore_errors")
            for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])}


def test_mypy_passes_on_the_package():
    result = mypy()
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_ignore_list_only_shrinks():
    grown = ignored_modules() - BASELINE
    assert not grown, (f"modules added to mypy's ignore_errors list: {sorted(grown)}. Fix their "
                       "type errors instead (the list may only shrink).")


def test_every_ignored_module_still_has_errors(tmp_path):
    # The same check without the overrides: a listed module without errors must leave the list.
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nignore_missing_imports = True\n")
    result = mypy("--config-file", str(config), "--cache-dir", ".mypy_cache/no-overrides",
                  "minidist")
    failing = {path[:-3].replace("/", ".")
               for path in re.findall(r"^(minidist/\S+\.py):\d+: error", result.stdout, re.M)}
    clean = ignored_modules() - failing
    assert not clean, (f"these modules type-check cleanly now: {sorted(clean)}. Delete them from "
                       "[[tool.mypy.overrides]] in pyproject.toml (and from BASELINE here).")
