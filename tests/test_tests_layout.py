"""The suite mirrors the code: where a module's tests live, and one name for rank scripts.

A test file of a wing lives in the wing's folder (tests/watch/, tests/fastpath/, tests/auto/),
and every script a test starts as a rank (under mpiexec, the launcher, or as a thread body) is
named ``<what>_rank.py`` beside the tests that start it: pytest collects none of them.
"""

import re

from procs import REPO

OLD_SUFFIXES = re.compile(r"(_body|_rank_script|_rank_checks)\.py$")


def test_rank_scripts_have_one_naming_scheme():
    tests = REPO / "tests"
    old = sorted(str(p.relative_to(REPO)) for p in tests.rglob("*.py")
                 if OLD_SUFFIXES.search(p.name))
    assert not old, f"rank scripts are named <what>_rank.py: rename {old}"
    ranks = list(tests.rglob("*_rank.py"))
    assert len(ranks) >= 40 and not any(p.name.startswith("test_") for p in ranks)


def test_wing_tests_live_in_the_wings_folders():
    from minidist.wings import WINGS
    for folder in ("watch", "fastpath", "auto"):
        assert folder in WINGS and any((REPO / "tests" / folder).glob("test_*.py")), folder
