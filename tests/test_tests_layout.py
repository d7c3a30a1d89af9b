"""The suite mirrors the code: where a module's tests live, and one name for rank scripts.

A module's tests live in the folder named after its package: ``minidist/comm/planner.py``'s in
tests/comm/, a wing's in the wing's folder (tests/watch/, tests/fastpath/, ...), the modules at
the top of the package (``minidist/xp.py``, ...) in tests/root/; a benchmark's in
tests/benchmarks/, the launcher's and the emulated cluster's in tests/launch/ and
tests/cluster/, the GPU's in tests/cuda/ (``FOLDERS`` below). The top of tests/ holds only what
spans the whole project (``SPANNING``: a new file there must say why it belongs), and every
script a test starts as a rank (under mpiexec, the launcher, or as a thread body) is named
``<what>_rank.py`` beside the tests that start it: pytest collects none of them.
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


# the top of tests/: checks of the whole project, not of one module
SPANNING = {
    "test_bootstrap.py": "the README's two commands set up a fresh machine",
    "test_docstring_examples.py": "every docstring example of the package",
    "test_independent_oracles.py": "behaviours of several parts against oracles of their own",
    "test_torch_name_scan.py": "every torch name the ported scripts use",
    "test_course.py": "the course's steps", "test_course_tasks.py": "the course's exercises",
    "test_doc_tables.py": "docs' tables", "test_docs_index.py": "docs' index",
    "test_docs_porting.py": "the porting guide", "test_docs_snippets.py": "every docs snippet",
    "test_entry_points_help.py": "every command's --help",
    "test_examples.py": "the main job", "test_examples_amp.py": "the AMP example",
    "test_examples_zero.py": "the ZeRO example", "test_from_torch.py": "torch scripts ported",
    "test_executed_path.py": "one default step across every layer",
    "test_import_contracts.py": "the import contracts", "test_layers.py": "the layer order",
    "test_lint.py": "lint", "test_typecheck.py": "types",
    "test_mutate_list.py": "scripts/mutate.py against the code",
    "test_newcomer_mistakes.py": "what a newcomer gets wrong, anywhere",
    "test_private_names.py": "names across modules", "test_procs.py": "the tests' helpers",
    "test_reading_path.py": "docs/layout.md against the code",
    "test_readme.py": "the README", "test_spine.py": "the spine alone",
    "test_tests_layout.py": "this layout", "test_torch_namespaces.py": "torch's namespaces",
    "test_train_errors.py": "the main job's error messages",
}


def test_the_top_of_tests_holds_only_what_spans_the_project():
    top = {p.name for p in (REPO / "tests").glob("test_*.py")}
    assert top <= set(SPANNING), (f"move {sorted(top - set(SPANNING))} into the folder of the "
                                  "code it tests (or add it to SPANNING, saying why)")
    assert not set(SPANNING) - top, sorted(set(SPANNING) - top)


def test_wing_tests_live_in_the_wings_folders():
    from minidist.wings import WINGS
    for folder in ("watch", "fastpath", "auto"):
        assert folder in WINGS and any((REPO / "tests" / folder).glob("test_*.py")), folder


# test folders that are not a package of minidist: what each one holds
FOLDERS = {"root": "the modules at the top of minidist/ (xp.py, envvars.py, tracing.py, ...)",
           "benchmarks": "the scripts of benchmarks/",
           "launch": "python -m minidist.launch (launch.py) and mpiexec",
           "cluster": "the emulated cluster (minidist/testing/cluster) and SLURM on it",
           "cuda": "the GPU (cuda.py, the CUDA kernels) and Numba's simulator"}


def test_every_test_folder_is_named_after_a_package():
    packages = {p.name for p in (REPO / "minidist").iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in (REPO / "tests").iterdir()
               if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))}
    stray = sorted(folders - packages - set(FOLDERS))
    assert not stray, (f"tests/{stray[0]}/ names no package of minidist/: put its tests in the "
                       "folder of the package they test (or add it to FOLDERS, saying why)")
