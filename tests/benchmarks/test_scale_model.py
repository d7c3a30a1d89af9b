"""benchmarks/scale_model.py: the cost formulas by hand, the fit on synthetic and on the
committed measurements, and the script end to end on the committed results (no processes)."""

import ast
import json
import subprocess
import sys

import numpy as np
import pytest

from procs import REPO, job_env

BENCH = REPO / "benchmarks"
SCRIPT = BENCH / "scale_model.py"
sys.path.insert(0, str(BENCH))
import scale_model as sm  # noqa: E402

A, B, G = 10.0, 0.01, 0.001
INTRA = sm.Level("intra", A, B, G)
INTER = sm.Level("inter", 50.0, 0.1, G)


# ---------------------------------------------------------------- formulas, by hand

@pytest.mark.parametrize("algorithm, n, nbytes, expected", [
    # ring: 2(n-1) a + 2K(n-1)/n b + K(n-1)/n g
    ("ring", 4, 4000, 2 * 3 * 10 + 2 * 4000 * 0.75 * 0.01 + 4000 * 0.75 * 0.001),   # 123
    ("ring", 2, 8, 2 * 10 + 8 * 0.01 + 4 * 0.001),
    # tree: 2L(a + K b) + L K g, L = ceil(log2 n)
    ("tree", 4, 1000, 2 * 2 * (10 + 10) + 2 * 1.0),                                   # 82
    ("tree", 5, 1000, 2 * 3 * (10 + 10) + 3 * 1.0),                                   # 123
    # rd doubling (< 64 KiB): log2(p)(a + K b + K g); fold 2a + 2K b + K g when n != 2^m
    ("rd", 4, 1000, 2 * (10 + 10 + 1)),                                               # 42
    ("rd", 6, 1000, (20 + 20 + 1) + 2 * (10 + 10 + 1)),                               # 83
    # rd halving (Rabenseifner, >= 64 KiB): 2 log2(p) a + 2K(p-1)/p b + K(p-1)/p g
    ("rd", 4, 1 << 20, 4 * 10 + 2 * (1 << 20) * 0.75 * 0.01 + (1 << 20) * 0.75 * 0.001),
])
def test_one_node_formulas_match_hand_computed(algorithm, n, nbytes, expected):
    assert sm.flat_time(algorithm, n, nbytes, INTRA) == pytest.approx(expected, rel=1e-12)


def test_two_level_rounds_match_hand_computed():
    # p=8 as 2 nodes of 4. ring: 14 steps of 1000 B, each as slow as its inter-node link
    # (one flow per node: 50 + 1000*0.1 = 150), plus 7 reductions of 1000 B.
    assert sm.flat_time("ring", 8, 8000, INTRA, INTER, 4) == pytest.approx(14 * 150 + 7 * 1.0)
    # rd doubling: distances 1, 2 inside a node (10 + 10 + 1 each); distance 4 crosses with
    # all 4 ranks of a node at once, sharing its NIC: 50 + 4*1000*0.1 + 1.
    assert sm.flat_time("rd", 8, 1000, INTRA, INTER, 4) == pytest.approx(2 * 21 + 451)
    # tree: reduce rounds 1, 2 inside (20 + 1), round 4 crosses with one flow (150 + 1);
    # the broadcast the same without the reductions.
    assert sm.flat_time("tree", 8, 1000, INTRA, INTER, 4) == pytest.approx(21 + 21 + 151 + 190)
    # hier: 3 intra steps each way on 2000-B shards: 3 (2*10 + 2*2000*0.01 + 2000*0.001) = 186;
    # across 2 nodes the 4 shards share the NIC: rd (one swap of 2000 B: 50 + 4*2000*0.1 + 2
    # = 852) beats ring (2 steps of 1000 B: 2*450 + 1 = 901).
    t, across = sm.hier_time(8, 4, 8000, INTRA, INTER)
    assert (t, across) == (pytest.approx(186 + 852), "rd")
    # virtual nodes (no NIC to share) and the implemented rule (rd below 64 KiB shards):
    # 186 + one rd swap of 2000 B without sharing (50 + 200 + 2).
    assert sm.hier_time(8, 4, 8000, INTRA, INTER, nic_shared=False, rule="implemented") == (
        pytest.approx(186 + 252), "rd")
    # one node: hier is its intra reduce-scatter + all-gather, a ring.
    assert sm.hier_time(4, 4, 4000, INTRA, INTER)[0] == pytest.approx(
        sm.flat_time("ring", 4, 4000, INTRA))


def test_one_node_is_the_same_whatever_the_inter_level():
    for algo in sm.FLAT:
        for n in (2, 3, 5, 8):
            assert sm.flat_time(algo, n, 12345, INTRA, INTER, n) == sm.flat_time(algo, n, 12345,
                                                                                 INTRA)


def test_hier_needs_whole_nodes():
    with pytest.raises(ValueError, match="multiple of k=4"):
        sm.hier_time(6, 4, 1000, INTRA, INTER)


def test_time_grows_with_size_and_the_ddp_step_with_the_model():
    link = sm.link_level(100, 5, 20, G)
    sizes = [8 << i for i in range(0, 28, 2)]
    for p in (2, 8, 16, 64, 4096):
        for algo in sm.ALGORITHMS:
            for lo, hi in ((0, 64 << 10), (64 << 10, 1 << 40)):  # rd switches at 64 KiB
                t = [sm.allreduce_time(algo, p, 8, s, INTRA, link) for s in sizes
                     if lo <= s < hi]
                assert all(a <= b for a, b in zip(t, t[1:])), (algo, p, lo, t)
    steps = [sm.ddp_step(params, 100.0, 64, 8, INTRA, link, 0.8)["step_ms"]
             for params in (1e6, 1e7, 1e8, 1e9)]
    assert all(a <= b for a, b in zip(steps, steps[1:])), steps
    one = sm.ddp_step(1e8, 100.0, 1, 8, INTRA, link, 0.8)
    assert one["efficiency"] == 1.0 and one["comm_ms"] == 0.0


def test_buckets_cover_the_gradients():
    assert sm.buckets(512) == [512]
    assert sm.buckets(sm.FIRST_BUCKET + 2 * sm.BUCKET + 5) == [sm.FIRST_BUCKET, sm.BUCKET,
                                                               sm.BUCKET, 5]


# ---------------------------------------------------------------- the fit

def synthetic(level, cores=None):
    pts = []
    for n in (2, 3, 4):
        for nbytes in (8, 512, 8 << 10, 60 << 10, 1 << 20, 16 << 20):
            for algo in sm.FLAT:
                a, b, g = sm.terms(algo, n, nbytes)
                t = (a * level.alpha_us + b * level.beta_us_per_byte
                     + g * level.gamma_us_per_byte) * sm.oversubscription(n, cores)
                pts.append((n, nbytes, algo, t, cores))
    return pts


@pytest.mark.parametrize("cores", [None, 2])
def test_fit_recovers_known_constants(cores):
    true = sm.Level("x", 27.5, 1.8e-4, 7.5e-5)
    free = sm.fit_level("x", synthetic(true, cores))["level"]  # gamma fitted too
    fixed = sm.fit_level("x", synthetic(true, cores), gamma=true.gamma_us_per_byte)
    for got in (free, fixed["level"]):
        assert got.alpha_us == pytest.approx(true.alpha_us, rel=1e-9)
        assert got.beta_us_per_byte == pytest.approx(true.beta_us_per_byte, rel=1e-9)
        assert got.gamma_us_per_byte == pytest.approx(true.gamma_us_per_byte, rel=1e-9)
    assert fixed["max_abs_error"] < 1e-9


def test_fit_refuses_what_the_points_cannot_tell():
    ring_only = [p for p in synthetic(sm.Level("x", 20, 2e-4, 1e-4)) if p[2] == "ring"]
    with pytest.raises(ValueError, match="cannot separate beta from gamma"):
        sm.fit_level("x", ring_only)
    with pytest.raises(ValueError, match="1 points for 2 unknowns"):
        sm.fit_level("x", ring_only[:1], gamma=1e-4)


def test_fit_on_the_committed_measurements_reproduces_them_within_its_error():
    points = sm.load_points(sm.expand(sm.DEFAULT_INPUTS))
    assert {"mpi", "tcp"} <= set(points)
    for backend, pts in points.items():
        assert {n for n, *_ in pts} >= {2, 3, 4}, backend
        fit = sm.fit_level(backend, pts, sm.stored_gamma())
        level, rows = fit["level"], fit["points"]
        assert level.alpha_us > 0 and level.beta_us_per_byte > 0
        errors = []
        for r in rows:  # the reported prediction is the model's, recomputed independently
            pred = (sm.flat_time(r["algorithm"], r["n"], r["nbytes"], level)
                    * r["oversubscription"])
            assert pred == pytest.approx(r["predicted_us"], rel=1e-9)
            errors.append(abs(pred - r["measured_us"]) / r["measured_us"])
        assert max(errors) == pytest.approx(fit["max_abs_error"])
        assert np.mean(np.array(errors) <= fit["median_abs_error"] + 1e-12) >= 0.5
        assert np.mean(np.array(errors) <= fit["p90_abs_error"] + 1e-12) >= 0.9
        assert fit["median_abs_error"] < 0.5, (backend, fit["median_abs_error"])


# ---------------------------------------------------------------- the script

def run_script(*args):
    res = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], env=job_env(),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_quick_run_end_to_end_with_a_hier_result(tmp_path):
    # A measured hier result as the all-reduce benchmark writes it (n=4 as 2 nodes of 2).
    hier = {"n": 4, "backend": "mpi", "ranks_per_node": 2, "machine": {"cores": 2},
            "command": "benchmarks/allreduce.py --algorithms hier",
            "rows": [{"nbytes": 1 << 20, "algorithm": "hier", "median_us": 1500.0},
                     {"nbytes": 1 << 20, "algorithm": "ring", "median_us": 1400.0}]}
    (tmp_path / "allreduce_hier_n4.json").write_text(json.dumps(hier))
    out = run_script("--quick", "--out", tmp_path, "--hier", tmp_path / "allreduce_hier_n4.json",
                     "--model", "25M:100")
    assert "fitted levels" in out and "crossovers" in out and "DDP step" in out
    data = json.loads((tmp_path / "scale_model.json").read_text())
    assert set(data["fit"]) >= {"mpi", "tcp"}
    assert data["fit"]["mpi"]["constants"]["alpha_us"] > 0
    (h,) = data["validation_hier"]
    assert (h["n"], h["k"], h["nbytes"]) == (4, 2, 1 << 20)
    assert h["error"] == pytest.approx((h["predicted_us"] - 1500.0) / 1500.0)
    assert h["ratio_measured"] == pytest.approx(1500.0 / 1400.0)
    assert h["ratio_predicted"] == pytest.approx(h["predicted_us"] / h["ring_predicted_us"])
    links = data["grid"]["links"]
    assert {"25Gb/s", "100Gb/s", "400Gb/s", "loopback-tcp"} <= set(links)
    for link in links.values():
        assert {r["best"] for r in link["times"]} <= set(sm.ALGORITHMS)
        assert all(0 < r["efficiency"] <= 1 for r in link["ddp"])
    # the hier file is also not mistaken for one-node data
    assert not any("hier" in p for p in data["inputs"])


def test_reads_the_hier_benchmark_format(tmp_path):
    # benchmarks/hier.py writes world_size / nodes / transport / virtual.
    result = {"benchmark": "hier", "world_size": 6, "nodes": [[0, 1, 2], [3, 4, 5]],
              "virtual": True, "transport": "tcp", "machine": {"cores": 2},
              "rows": [{"nbytes": 4096, "algorithm": "hier", "median_us": 900.0,
                        "mean_inter_node_bytes": 1365.3},
                       {"nbytes": 4096, "algorithm": "ring", "median_us": 1000.0}]}
    path = tmp_path / "hier_n6_k3.json"
    path.write_text(json.dumps(result))
    rows = sm.load_hier([path], default_k=2)
    assert [(r["n"], r["k"], r["algorithm"], r["backend"]) for r in rows] == [
        (6, 3, "hier", "tcp"), (6, 3, "ring", "tcp")]
    levels = {"mpi": INTRA, "tcp": INTER}
    (h,) = sm.validate_hier(rows, levels)
    t, _ = sm.hier_time(6, 3, 4096, INTRA, INTER, nic_shared=False, rule="implemented")
    assert h["predicted_us"] == pytest.approx(t * 3)  # 6 ranks on 2 cores
    assert h["inter_node_bytes_model"] == pytest.approx(4096 / 3)
    assert h["ratio_measured"] == pytest.approx(0.9)
    assert sm.load_points([path]) == {}  # never mistaken for one-node data


def test_same_run_constants_predict_hier_exactly_on_exact_data(tmp_path):
    # ring and hier times made by the model itself from one level: the same-run fit on the
    # ring rows recovers it, and hier is then predicted with no error.
    lv = sm.Level("x", 900.0, 6e-4, sm.stored_gamma())
    rows = []
    for nbytes in (1 << 10, 64 << 10, 1 << 20, 16 << 20):
        ring = sm.flat_time("ring", 4, nbytes, lv, lv, 2, nic_shared=False) * 2
        hier = sm.hier_time(4, 2, nbytes, lv, lv, nic_shared=False, rule="implemented")[0] * 2
        rows += [{"nbytes": nbytes, "algorithm": "ring", "median_us": ring},
                 {"nbytes": nbytes, "algorithm": "hier", "median_us": hier}]
    path = tmp_path / "hier_n4_k2.json"
    path.write_text(json.dumps({"world_size": 4, "nodes": [[0, 1], [2, 3]], "virtual": True,
                                "transport": "mpi", "machine": {"cores": 2}, "rows": rows}))
    levels = {"mpi": sm.Level("mpi", 30.0, 2e-4, lv.gamma_us_per_byte)}  # gamma: the same
    out = sm.validate_hier(sm.load_hier([path], 2), levels)
    assert len(out) == 4
    for h in out:
        assert h["error_same_run"] == pytest.approx(0.0, abs=1e-9)
        assert h["same_run_constants"]["alpha_us"] == pytest.approx(900.0)


def test_plots(tmp_path):
    pytest.importorskip("matplotlib")
    run_script("--quick", "--max-ranks", "64", "--max-bytes", "1M", "--out", tmp_path,
               "--plots", tmp_path, "--model", "25M:100")
    for name in ("validation", "crossover", "winners", "ddp"):
        assert (tmp_path / f"scaling_{name}.png").stat().st_size > 1000


def test_bad_arguments_say_what_to_write(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), "--links", "fast", "--out", str(tmp_path)],
                         env=job_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "GBPS:LATENCY_US" in res.stderr


def test_default_output_is_the_local_folder():
    tree = ast.parse(SCRIPT.read_text())
    defaults = [ast.unparse(kw.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                and node.args and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "--out" for kw in node.keywords if kw.arg == "default"]
    assert defaults == ["str(LOCAL_RESULTS)"]
