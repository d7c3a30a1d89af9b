"""scripts/mutate.py's mutations still apply to the code (each edit's text is found exactly
once in its file) and name tests that exist; the full mutation run itself is opt-in."""

import importlib.util
import subprocess
import sys

from procs import REPO


def load_mutate():
    name = "minidist_mutate_script"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "mutate.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_every_mutation_applies_and_names_existing_tests():
    mutate = load_mutate()
    names = [m.name for m in mutate.MUTATIONS]
    assert len(names) == len(set(names)) and len(names) >= 15
    for m in mutate.MUTATIONS:
        assert mutate.check_applies(m) is None, f"{m.name}: {mutate.check_applies(m)}"
        assert m.new != m.old and m.tests, m.name
        for test in m.tests:
            path = REPO / test.split("::")[0]
            assert path.is_file(), f"{m.name}: {test} does not exist"
            if "::" in test:
                assert f"def {test.split('::')[1]}(" in path.read_text(), f"{m.name}: {test}"


def test_list_prints_every_mutation():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "mutate.py"), "--list"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for m in load_mutate().MUTATIONS:
        assert m.name in out.stdout
    assert "STALE" not in out.stdout
