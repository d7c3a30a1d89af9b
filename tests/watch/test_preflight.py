"""The run-manifest diff (minidist/watch/preflight.py) on hand-made manifests of several ranks."""

import doctest

from minidist.watch import preflight
from minidist.watch.preflight import manifest_diff


def test_docstring_example():
    assert doctest.testmod(preflight).failed == 0


def test_identical_manifests_have_no_diff():
    m = {"numpy version": "2.4.6", "parameter": [["w", [2, 3], "float32"]], "x": {"a": 1}}
    assert manifest_diff([m, dict(m), dict(m)]) == []


def test_ranks_are_grouped_by_value_rank_0_first():
    ms = [{"numpy version": v} for v in ("2.4.6", "2.3.1", "2.4.6", "1.26.4")]
    assert manifest_diff(ms) == [("numpy version", "numpy version 2.4.6 on ranks 0, 2 but "
                                  "2.3.1 on rank 1, 1.26.4 on rank 3")]


def test_lists_name_the_first_differing_item_and_missing_items():
    a = {"parameter": [["w", [2, 3], "float32"], ["b", [3], "float32"]]}
    b = {"parameter": [["w", [2, 3], "float32"]]}
    assert manifest_diff([a, b]) == [("parameter", "parameter #1 'b' (3,) float32 on rank 0 "
                                      "but missing on rank 1")]


def test_dicts_name_the_key_and_implied_fields_are_not_repeated():
    a = {"parameter": [["w", [2], "float64"]], "bucket": [["float64", [0], 2]],
         "trainer config": {"epochs": 3, "seed": 0}}
    b = {"parameter": [["w", [3], "float64"]], "bucket": [["float64", [0], 3]],
         "trainer config": {"epochs": 4, "seed": 0}}
    got = manifest_diff([a, b])
    assert [f for f, _ in got] == ["parameter", "trainer config"]
    assert got[1][1] == "trainer config.epochs 3 on rank 0 but 4 on rank 1"


def test_a_field_only_one_rank_has_is_reported():
    got = manifest_diff([{"amp": {"enabled": True}}, {}])
    assert got == [("amp", 'amp {"enabled": true} on rank 0 but missing on rank 1')]


def test_buckets_alone_differing_are_reported():
    a = {"parameter": [["w", [4], "float32"]], "bucket": [["float32", [0], 4]]}
    b = {"parameter": [["w", [4], "float32"]], "bucket": [["float32", [0], 4],
                                                        ["float32", [1], 2]]}
    assert manifest_diff([a, b]) == [("bucket", "bucket #1 missing on rank 0 but 2 x float32 "
                                      "(parameters #1) on rank 1")]


def test_one_rank_always_agrees_with_itself(group):
    preflight.check_manifest(preflight.library_manifest(1), "test")  # one all_gather_object


def test_fake_version_is_reported(monkeypatch):
    monkeypatch.setenv(preflight.FAKE_VERSION_VAR, "9.9.9")
    assert preflight.library_manifest(2)["minidist version"] == "9.9.9"
    monkeypatch.delenv(preflight.FAKE_VERSION_VAR)
    import minidist
    assert preflight.library_manifest(2)["minidist version"] == minidist.__version__
