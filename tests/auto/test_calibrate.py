"""calibrate.py in one process: cache files (valid, corrupt, mismatched key), the fit, and how
a calibration changes auto's choice. The real 2-rank run is tests/auto/test_tune.py."""

import json
import logging

import pytest

from minidist.auto import calibrate, select


def write(tmp_path, monkeypatch, data, transport="mpi", n=2):
    monkeypatch.setenv("MINIDIST_CACHE_DIR", str(tmp_path))
    path = calibrate.cache_path(transport, n)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    calibrate.warned_paths.discard(path)
    return path


def good(transport="mpi", n=2, rules=None):
    model = {name: dict(c) for name, c in select.MODEL.items()}
    return {"format": 1, "key": calibrate.cache_key(transport, n), "model": model,
            "rules": rules or {str(n): [[4096, "tree"], [None, "ring"]]}}


def test_a_valid_file_loads_and_decides_auto(tmp_path, monkeypatch):
    path = write(tmp_path, monkeypatch, good())
    cal = calibrate.load("mpi", 2)
    assert cal is not None and cal.path == path and cal.digest == calibrate.load("mpi", 2).digest
    name, reason = select.choose_with_reason(2, 64, has_native=True, calibration=cal)
    assert name == "tree" and reason.startswith(f"calibrated rule (calibration {path})")
    assert select.choose(2, 1 << 20, True, calibration=cal) == "ring"
    assert select.choose(2, 64, True) == "mpi"  # the shipped table is untouched
    assert select.source(cal) == f"calibration {path}"
    assert select.source().startswith("shipped")
    assert select.table(2, True, False, calibration=cal)["source"] == f"calibration {path}"


def test_no_file_is_silent(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MINIDIST_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.DEBUG, logger="minidist"):
        assert calibrate.load("tcp", 3) is None
    assert not caplog.records


@pytest.mark.parametrize("content,why", [
    ('{"format": 1, "key"', "not valid JSON"),
    ("[1, 2]", "not a minidist calibration"),
    ({"format": 1, "model": {}, "rules": {}}, "made for another"),
])
def test_a_corrupt_file_is_ignored_with_one_warning(tmp_path, monkeypatch, caplog, content,
                                                    why):
    path = write(tmp_path, monkeypatch, content)
    with caplog.at_level(logging.WARNING, logger="minidist"):
        assert calibrate.load("mpi", 2) is None
        assert calibrate.load("mpi", 2) is None  # the second read stays quiet
    assert len(caplog.records) == 1
    msg = caplog.records[0].getMessage()
    assert str(path) in msg and why in msg and "./mpirun.sh -n 2 python -m minidist.tune" in msg


@pytest.mark.parametrize("field,value", [("version", "0.0.1"), ("host", "elsewhere"),
                                         ("world_size", 4), ("transport", "tcp")])
def test_a_file_made_for_another_key_is_ignored(tmp_path, monkeypatch, caplog, field, value):
    data = good()
    data["key"][field] = value
    path = write(tmp_path, monkeypatch, data)
    with caplog.at_level(logging.WARNING, logger="minidist"):
        assert calibrate.load("mpi", 2) is None
    msg = caplog.records[0].getMessage()
    assert str(path) in msg and f"{field}={value!r}" in msg


@pytest.mark.parametrize("change,why", [
    (lambda d: d["model"].update(ring={"alpha_us": -1}), "non-negative"),
    (lambda d: d["model"].update(warp={}), "unknown algorithm 'warp'"),
    (lambda d: d["rules"].update({"2": [[None, "warp"]]}), "rule '2'"),
    (lambda d: d["rules"].update({"2": [[64, "ring"]]}), "rule '2'"),
])
def test_bad_constants_or_rules_are_ignored(tmp_path, monkeypatch, caplog, change, why):
    data = good()
    change(data)
    write(tmp_path, monkeypatch, data)
    with caplog.at_level(logging.WARNING, logger="minidist"):
        assert calibrate.load("mpi", 2) is None
    assert why in caplog.records[0].getMessage()


def test_tune_mode_reads_the_variable(monkeypatch):
    for raw, mode in (("", "use"), ("0", "off"), ("1", "run"), ("off", "off")):
        monkeypatch.setenv("MINIDIST_TUNE", raw)
        assert calibrate.tune_mode() == mode
    monkeypatch.setenv("MINIDIST_TUNE", "maybe")
    with pytest.raises(ValueError, match="MINIDIST_TUNE='maybe'"):
        calibrate.tune_mode()


def test_the_fit_gives_rules_per_buffer_kind():
    times = {"plain": {8: {"mpi": 5.0, "ring": 12.0, "tree": 9.0},
                       4096: {"mpi": 9.0, "ring": 14.0, "tree": 12.0},
                       1 << 20: {"mpi": 400.0, "ring": 200.0, "tree": 390.0}},
             "shared": {8: {"mpi": 5.0, "shm": 20.0}, 1 << 20: {"mpi": 400.0, "shm": 90.0}}}
    model, rules, report = calibrate.fit(times, 2)
    assert rules["2"][0] == [64 * 1024, "mpi"] and rules["2"][-1][1] == "ring"
    assert rules["2s"][-1][1] == "shm" and set(model) >= {"mpi", "ring", "tree", "shm_zc"}
    assert all(r[1] > 0 and r[2] > 0 for r in report)
    assert calibrate.validate({"format": 1, "key": calibrate.cache_key("mpi", 2),
                               "model": model, "rules": rules},
                              calibrate.cache_key("mpi", 2)) is None


def test_calibrate_on_threads_writes_a_file_that_new_groups_use(tmp_path, monkeypatch):
    import numpy as np

    from minidist.comm import new_group_from_transport
    from minidist.comm.transports.threads import run_threads

    monkeypatch.setenv("MINIDIST_CACHE_DIR", str(tmp_path))

    def body(t):
        g = new_group_from_transport(t)
        assert g.auto_source().startswith("shipped")
        cal = calibrate.calibrate(g, quick=True, max_bytes=2048)
        again = new_group_from_transport(t)  # reads the file rank 0 wrote
        x = np.full(8, t.rank + 1.0, np.float32)
        again.all_reduce(x)
        return (cal.digest, again.auto_source(), again.auto_choice(x), x[0],
                len(again.ledger.entries()), len(g.ledger.entries()))

    out = run_threads(2, body, timeout_s=60)
    path = calibrate.cache_path("threads", 2)
    assert out[0][0] == out[1][0] and path.exists()
    for digest, source, (name, reason), value, n_new, n_old in out:
        assert source == f"calibration {path}" and reason.startswith("calibrated")
        assert name in ("ring", "tree", "rd") and value == 3.0
        assert n_new == 1 and n_old == 0  # the measurement leaves the ledger alone


def test_beyond_the_measured_sizes_auto_keeps_the_shipped_choice(tmp_path, monkeypatch):
    """A quick calibration measured up to 2 MiB: from 4 MiB on, auto is what it would be
    without it (no extrapolation of the fitted rules)."""
    data = good(rules={"2": [[None, "tree"]], "2s": [[None, "tree"]]})
    data["measured_bytes"] = 2 << 20
    write(tmp_path, monkeypatch, data)
    cal = calibrate.load("mpi", 2)
    assert cal.measured_bytes == 2 << 20 and cal.covers(3 << 20) and not cal.covers(4 << 20)
    for shared in (False, True):
        assert select.choose(2, 1 << 20, True, True, shared, calibration=cal) == "tree"
        for nbytes in (4 << 20, 16 << 20, 64 << 20):
            name, reason = select.choose_with_reason(2, nbytes, True, True, shared, cal)
            assert name == select.choose(2, nbytes, True, True, shared), (nbytes, shared)
            assert "beyond the calibrated sizes, up to 2 MiB" in reason


def test_the_fit_adds_no_rule_past_the_measured_sizes():
    times = {"plain": {8: {"mpi": 5.0, "ring": 12.0}, 1 << 20: {"mpi": 900.0, "ring": 200.0}}}
    _, rules, _ = calibrate.fit(times, 2)
    assert rules["2"][-1] == [None, "ring"] and all(u is None or u <= 2 << 20
                                                    for u, _ in rules["2"])


def test_the_shipped_table_is_package_data_not_a_module(tmp_path, monkeypatch, caplog):
    import importlib.util
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    data = json.loads(select.DEFAULTS_FILE.read_text())
    assert select.SHIPPED == data and set(data["rules"]) <= set(select.RULES)
    assert select.source() == "shipped table (minidist/auto/auto_defaults.json)"
    assert importlib.util.find_spec("minidist.comm.algorithms.tuning") is None
    root = Path(select.__file__).parents[2]
    package_data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]
    assert "*.json" in package_data["minidist.auto"]  # installed with the wheel

    monkeypatch.setattr(select, "DEFAULTS_FILE", tmp_path / "missing.json")
    with caplog.at_level(logging.WARNING, logger="minidist"):
        assert select._load_shipped() == {}
    assert "cannot read the shipped table" in caplog.text and "minidist.tune" in caplog.text


def test_a_group_says_once_at_debug_level_which_table_auto_uses(tmp_path, monkeypatch, caplog):
    from minidist.auto import choice as choice_module
    from minidist.comm import new_group_from_transport
    from minidist.comm.transports.threads import run_threads

    monkeypatch.setenv("MINIDIST_CACHE_DIR", str(tmp_path))  # a fresh machine: no calibration
    monkeypatch.setattr(choice_module, "_SOURCES_SAID", set())
    with caplog.at_level(logging.DEBUG, logger="minidist"):
        run_threads(2, lambda t: [new_group_from_transport(t) for _ in range(3)] and None,
                    timeout_s=60)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("auto uses")]
    assert said == ["auto uses the shipped table (minidist/auto/auto_defaults.json) "
                    "(n=2, transport threads)"], said
