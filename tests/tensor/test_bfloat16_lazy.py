"""bfloat16 loads ml_dtypes on first use: ``import minidist`` (every rank of every job) does not
pay its import, and every way to reach bfloat16 still works (tensor/dtypes.py)."""

import json

from procs import run_python

PROBE = r"""
import json, sys
import numpy as np
import minidist
out = {"after_import": "ml_dtypes" in sys.modules,
       "half_check": np.dtype(np.float16) in minidist.tensor.dtypes.HALF}
out["after_check"] = "ml_dtypes" in sys.modules
bf = minidist.bfloat16
out["after_name"] = "ml_dtypes" in sys.modules
x = minidist.tensor([1.0, 2.5]).to(bf)
out.update(repr=repr(bf), same=bf is minidist.tensor.bfloat16 is minidist.tensor.dtypes.bfloat16,
           dtype=repr(x.dtype), type=x.type(), floating=x.dtype.is_floating_point,
           legacy=isinstance(x, minidist.BFloat16Tensor), values=x.float().tolist(),
           half=x.array.dtype in minidist.tensor.dtypes.HALF,
           by_name=repr(minidist.tensor([1.0]).type("minidist.BFloat16Tensor").dtype),
           product=repr((x @ x).dtype))
print("RESULT " + json.dumps(out))
"""

LEGACY_FIRST = r"""
import sys
import minidist
print("RESULT", isinstance(minidist.zeros(2), minidist.BFloat16Tensor), "ml_dtypes" in sys.modules,
      minidist.BFloat16Tensor.legacy_dtype)
"""


def result(code):
    res = run_python(["-c", code], timeout_s=60)
    assert res.returncode == 0, res.report()
    return next(line for line in res.stdout.splitlines() if line.startswith("RESULT "))[7:]


def test_import_minidist_leaves_ml_dtypes_out_until_bfloat16_is_asked_for():
    out = json.loads(result(PROBE))
    assert out["after_import"] is False and out["after_check"] is False and out["half_check"]
    assert out["after_name"] is True
    assert out["repr"] == out["dtype"] == out["by_name"] == out["product"] == "minidist.bfloat16"
    assert out["same"] and out["floating"] and out["legacy"] and out["half"]
    assert out["type"] == "minidist.BFloat16Tensor" and out["values"] == [1.0, 2.5]


def test_the_legacy_type_names_bfloat16_when_asked():
    assert result(LEGACY_FIRST) == "False True minidist.bfloat16"
