"""The "auto" size rules: select.choose() follows RULES; the benchmark's fit makes them."""

import importlib.util
import json
import sys

import pytest

from procs import REPO
from minidist.auto import select


@pytest.fixture
def rules():
    saved = {k: [list(x) for x in v] for k, v in select.RULES.items()}
    yield select
    select.RULES.clear()
    select.RULES.update(saved)
    select._memo.clear()


def test_choose_follows_the_rule_for_the_buffer_kind(rules):
    select.load_model({"rules": {"2": [[4096, "mpi"], [1 << 20, "shm"], [None, "ring"]],
                                 "2s": [[1024, "mpi"], [None, "shm"]]}})
    kw = dict(has_native=True, has_shm=True)
    assert select.choose(2, 8, **kw) == "mpi"
    assert select.choose(2, 4095, **kw) == "mpi"
    assert select.choose(2, 4096, **kw) == "shm"
    assert select.choose(2, 64 << 20, **kw) == "ring"
    assert select.choose(2, 2048, shared=True, **kw) == "shm"
    assert select.choose(2, 512, shared=True, **kw) == "mpi"
    # shm not allowed here (e.g. a CuPy buffer): the model decides among the allowed ones
    def cheapest(n, nbytes, names):
        return min(names, key=lambda c: select.predict_us(c, n, nbytes))

    no_shm = [c for c in select.CANDIDATES if c != "shm"]
    assert select.choose(2, 8192, has_native=True, has_shm=False) == cheapest(2, 8192, no_shm)
    # no rule for n=5: the model's lowest predicted time among every candidate
    assert select.choose(5, 8, **kw) == cheapest(5, 8, select.CANDIDATES)


def test_load_model_rejects_bad_rules(rules):
    with pytest.raises(ValueError, match="end with \\[None, algorithm\\]"):
        select.load_model({"rules": {"2": [[4096, "mpi"]]}})
    with pytest.raises(ValueError, match="known algorithms"):
        select.load_model({"rules": {"2": [[None, "warp"]]}})


def _bench():
    spec = importlib.util.spec_from_file_location("allreduce_bench",
                                                  REPO / "benchmarks" / "allreduce.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return mod


def test_size_rules_merge_ties_and_cut_where_the_winner_changes():
    b = _bench()
    times = {8: {"mpi": 10, "rd": 20}, 64: {"mpi": 12, "rd": 12.3},   # tie: keep mpi
             512: {"mpi": 15, "rd": 30}, 4096: {"mpi": 100, "rd": 50},
             32768: {"mpi": 200, "rd": 104}, 262144: {"mpi": 1000, "rd": 1030}}  # tie: keep rd
    rule = b.size_rules(times, tol=0.05)
    assert rule == [[round((512 * 4096) ** 0.5), "mpi"], [None, "rd"]]


def test_fit_uses_the_median_over_runs(tmp_path):
    b = _bench()
    paths = []
    for i, (ring, tree) in enumerate([(10, 20), (100, 20), (11, 20)]):  # run 2: a noise spike
        rows = [{"nbytes": s, "algorithm": a, "median_us": t * s}
                for s in (1024, 2048) for a, t in (("ring", ring), ("tree", tree))]
        p = tmp_path / f"run{i}.json"
        p.write_text(json.dumps({"n": 2, "rows": rows}))
        paths.append(str(p))
    data = b.fit(paths, tmp_path / "fit.json")
    assert data["rules"]["2"] == [[None, "ring"]]
