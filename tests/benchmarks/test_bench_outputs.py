"""Benchmarks keep the published results apart from a user's runs, and the published files
carry no paths of the machine that produced them."""

import ast
import re
import sys

import pytest

from procs import REPO

BENCH = REPO / "benchmarks"
SCRIPTS = ["allreduce.py", "ddp_scaling.py", "amp_kernels.py", "memory.py", "hier.py"]


def test_local_results_folder_is_ignored_by_git():
    sys.path.insert(0, str(BENCH))
    try:
        import _common
    finally:
        sys.path.remove(str(BENCH))
    relative = _common.LOCAL_RESULTS.relative_to(REPO)
    ignored = [line.strip() for line in (REPO / ".gitignore").read_text().splitlines()]
    assert f"/{relative.parts[0]}/" in ignored, (relative, ignored)
    assert _common.RESULTS == BENCH / "results"
    assert _common.shown(BENCH / "results" / "x.json") == "benchmarks/results/x.json"
    assert _common.shown("/elsewhere/x.json") == "/elsewhere/x.json"


@pytest.mark.parametrize("script", SCRIPTS)
def test_default_output_is_the_local_folder_not_the_published_one(script):
    """Without --out a run must not write over benchmarks/results (read from the source: the
    scripts need mpiexec or minutes to run; their smoke tests pass --out)."""
    tree = ast.parse((BENCH / script).read_text())
    defaults = [ast.unparse(kw.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                and node.args and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "--out" for kw in node.keywords if kw.arg == "default"]
    assert defaults == ["str(LOCAL_RESULTS)"], (script, defaults)


def test_published_results_name_no_machine_paths():
    machine_path = re.compile(r"(?<![\w.])/(?:work|home|root|Users)/")
    for path in sorted((BENCH / "results").glob("*")):
        if path.suffix in (".txt", ".json"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                assert not machine_path.search(line), f"{path.name}:{n}: {line}"


def _bench_module(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def test_time_left_is_within_2x_from_the_first_size_of_a_latency_then_bandwidth_sweep():
    """A sweep like allreduce.py's (8 B .. 64 MiB, 200 calls per algorithm at small sizes, down
    to 10 at the largest): per call 50 us + 0.5 ns/B. The prior is the per-byte cost of one call
    at 64 MiB (latency included, as the benchmark's probe measures it). Extrapolating the bytes
    moved so far said days after the first size; the model stays within 2x throughout."""
    common = _bench_module("_common")
    allreduce = _bench_module("allreduce")
    a, b = 50e-6, 0.5e-9
    points = common.sizes(8, 64 << 20)
    calls = [(3 + allreduce.default_iters(s)) * 10 + 11 for s in points]
    seconds = [c * (a + b * s) for s, c in zip(points, calls)]
    eta = common.Eta((a + b * (64 << 20)) / (64 << 20), 64 << 20)
    for i, (s, c, t) in enumerate(zip(points[:-1], calls, seconds)):
        eta.done(s, c, t)
        left, truth = eta.left(list(zip(points[i + 1:], calls[i + 1:]))), sum(seconds[i + 1:])
        assert truth / 2 <= left <= truth * 2, (i, s, left, truth)


def test_time_left_follows_a_load_that_grows_during_the_sweep():
    """Other jobs start after the fourth size and every call's latency grows a hundredfold (4
    ranks on 2 busy cores went from 0.7 to 10 ms): three sizes later the estimate is within 2x
    again (the latency of the first sizes would keep it far too low)."""
    common = _bench_module("_common")
    allreduce = _bench_module("allreduce")
    b = 0.5e-9
    points = common.sizes(8, 64 << 20)
    calls = [(3 + allreduce.default_iters(s)) * 10 + 11 for s in points]
    seconds = [c * ((50e-6 if i < 4 else 5e-3) + b * s)
               for i, (s, c) in enumerate(zip(points, calls))]
    eta = common.Eta(b + 50e-6 / (64 << 20), 64 << 20)
    for i, (s, c, t) in enumerate(zip(points[:-1], calls, seconds)):
        eta.done(s, c, t)
        left, truth = eta.left(list(zip(points[i + 1:], calls[i + 1:]))), sum(seconds[i + 1:])
        if i >= 5:
            assert truth / 2 <= left <= truth * 2, (i, s, left, truth)


def _row(nbytes, algorithm, q1, median, q3):
    return {"nbytes": nbytes, "algorithm": algorithm, "q1_us": q1, "median_us": median,
            "q3_us": q3}


def test_a_crossover_whose_rows_overlap_is_marked_uncertain():
    allreduce = _bench_module("allreduce")
    apart = [_row(1024, "ring", 50, 60, 70), _row(1024, "tree", 20, 30, 40),
             _row(2048, "ring", 50, 60, 70), _row(2048, "tree", 80, 90, 100),
             _row(4096, "ring", 60, 70, 80), _row(4096, "tree", 120, 130, 140)]
    claim = allreduce.crossover_claim(apart, "ring", "tree")
    assert claim == {"size": 2048, "firm": True, "overlaps": []}
    assert allreduce.crossover_line(claim, "ring", "tree").startswith(
        "# ring faster than tree from 2 KiB up")
    # busy machine: the medians still cross at 2 KiB, but at 4 KiB the ranges overlap
    noisy = apart[:4] + [_row(4096, "ring", 60, 70, 200), _row(4096, "tree", 100, 130, 300)]
    claim = allreduce.crossover_claim(noisy, "ring", "tree")
    assert claim == {"size": 2048, "firm": False, "overlaps": [4096]}
    line = allreduce.crossover_line(claim, "ring", "tree")
    assert "uncertain" in line and "overlap at 4 KiB" in line and "faster than tree from" \
        not in line, line


def test_stats_report_the_spread_and_a_busy_machine_is_named():
    common = _bench_module("_common")
    st = common.stats([1e-3, 2e-3, 3e-3, 4e-3, 5e-3])
    assert (st["q1_us"], st["median_us"], st["q3_us"]) == (2000, 3000, 4000)
    assert st["spread"] == 2000 / 3000
    assert common.busy_note(0.1, cores=2) is None
    assert common.busy_note(11.0, cores=2).startswith("load average 11.0 on 2 cores")


def test_benchmarks_readme_names_every_published_result_and_every_script():
    """benchmarks/README.md says what each file in benchmarks/results/ is and which question
    each script answers: a new result or script without a line there fails here."""
    readme = (BENCH / "README.md").read_text()
    def named(p):  # a folder as "name/", a file by its stem and an extension ("x.json")
        ending = "/" if p.is_dir() else r"\.(?!py\b)\w"
        return re.search(rf"(?<![\w.]){re.escape(p.name.split('.')[0])}{ending}", readme)
    missing = [p.name for p in sorted((BENCH / "results").iterdir()) if not named(p)]
    assert not missing, f"benchmarks/README.md does not say what these are: {missing}"
    scripts = [p.name for p in sorted(BENCH.glob("*.py")) if p.name != "_common.py"]
    assert not [s for s in scripts if f"`{s}" not in readme], scripts
