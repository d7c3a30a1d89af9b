"""Every ``>>>`` example in a docstring of minidist runs and prints what it says (doctest).

Indented usage blocks in module docstrings are sketches (they name a model, a loss, ... the
reader has); an example meant to be run as written is written with ``>>>`` and checked here.
Only modules that hold examples become test cases, so the count of passes is the count of
modules whose examples ran.
"""

import doctest
import importlib
import pkgutil

import pytest

import minidist
from minidist import comm

ALL_MODULES = sorted(m.name for m in pkgutil.walk_packages(minidist.__path__, "minidist.")
                     if not m.name.endswith("__main__"))


def examples(module):
    return [t for t in doctest.DocTestFinder().find(module) if t.examples]


WITH_EXAMPLES = [name for name in ALL_MODULES if examples(importlib.import_module(name))]


def test_there_are_examples_to_check():
    assert len(WITH_EXAMPLES) >= 10, WITH_EXAMPLES
    assert any(name.startswith("minidist.comm.") for name in WITH_EXAMPLES)


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_run(name):
    tests = examples(importlib.import_module(name))
    assert tests
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    try:
        for test in tests:
            runner.run(test)
    finally:
        if comm.is_initialized():
            comm.destroy_process_group()
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
