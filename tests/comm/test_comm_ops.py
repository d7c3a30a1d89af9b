"""ReduceOp parsing, the in-place kernels, and the auto rule's data-driven choice."""

import json

import numpy as np
import pytest

from minidist.auto import select
from minidist.comm.planner import check_algorithm
from minidist.comm.ops import ReduceOp, check_dtype, combine, finalize, parse_op
from minidist.comm.transports.local import LocalTransport


def test_parse_op_accepts_names_and_members():
    assert parse_op("SUM") is ReduceOp.SUM and parse_op(ReduceOp.MAX) is ReduceOp.MAX
    with pytest.raises(ValueError, match="unknown reduce op 'mean'.*'avg'"):
        parse_op("mean")


def test_combine_is_in_place_and_finalize_divides():
    a = np.array([1.0, 5.0], np.float32)
    ptr = a.ctypes.data
    combine(a, np.array([3.0, 1.0], np.float32), ReduceOp.MAX)
    assert a.ctypes.data == ptr and a.tolist() == [3.0, 5.0]
    finalize(a, ReduceOp.AVG, 2)
    assert a.tolist() == [1.5, 2.5]


def test_check_dtype():
    assert check_dtype("float16") == np.float16
    with pytest.raises(ValueError, match="unsupported dtype complex64"):
        check_dtype(np.complex64)


def test_auto_prefers_latency_algorithms_small_and_ring_large():
    assert select.choose(8, 64) in ("tree", "rd")
    assert select.choose(8, 64 << 20) in ("ring", "rd")
    assert select.choose(2, 16 << 20) in ("ring", "rd")
    assert select.predict_us("ring", 1, 100) == 0.0


def test_auto_rule_is_data(tmp_path):
    saved_model, saved_cands = json.loads(json.dumps(select.MODEL)), list(select.CANDIDATES)
    try:
        path = tmp_path / "fit.json"
        path.write_text(json.dumps({"candidates": ["tree", "direct"]}))
        select.load_model(path)
        assert select.choose(4, 1 << 20) in ("tree", "direct")
        with pytest.raises(ValueError, match="no cost formula"):
            select.load_model({"model": {"bogus": {}}})
    finally:
        select.MODEL.update(saved_model)
        select.CANDIDATES[:] = saved_cands
        select._memo.clear()


def test_resolve_unknown_algorithm():
    with pytest.raises(ValueError, match="unknown algorithm 'bogus'"):
        check_algorithm("bogus")
