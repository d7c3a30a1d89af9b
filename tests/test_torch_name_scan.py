"""Every dotted torch name the PyTorch originals in examples/from_torch use (``torch.x.y``,
``nn.X``, ``F.f``, ``dist.f`` after their import lines) exists in minidist under the same path,
and every torch.Tensor method they call exists on minidist's Tensor: the scan behind
docs/porting.md's list of what is still missing."""

import ast
import importlib

import pytest

import minidist
from procs import REPO

ORIGINALS = sorted(p for p in (REPO / "examples/from_torch").glob("*.py")
                   if not p.name.endswith("_minidist.py") and p.name != "compare_losses.py")


def torch_names(path):
    """Each ``torch...`` dotted name the file uses, spelled from its import lines."""
    tree = ast.parse(path.read_text())
    alias = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    alias[a.asname or "torch"] = a.name if a.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
    names = set()
    for node in ast.walk(tree):
        parts, n = [], node
        while isinstance(n, ast.Attribute):
            parts.append(n.attr)
            n = n.value
        if parts and isinstance(n, ast.Name) and n.id in alias:
            names.add(".".join([alias[n.id]] + parts[::-1]))
    return names


def resolves(name):
    parts = ["minidist"] + name.split(".")[1:]
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            if not hasattr(obj, p):
                return False
            obj = getattr(obj, p)
        return True
    return False


def test_the_originals_torch_names_all_exist_in_minidist():
    names = set().union(*(torch_names(p) for p in ORIGINALS))
    assert len(names) > 50, "the scan found too little: has the examples' layout changed?"
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, f"torch names the examples use that minidist lacks: {missing}"


def test_the_tensor_methods_the_originals_call_exist_on_minidists_tensor():
    torch = pytest.importorskip("torch")
    called = {node.attr for p in ORIGINALS for node in ast.walk(ast.parse(p.read_text()))
              if isinstance(node, ast.Attribute)}
    tensor_methods = called & set(dir(torch.Tensor)) - {"index"}   # list.index, not Tensor's
    missing = sorted(m for m in tensor_methods if not hasattr(minidist.Tensor, m))
    assert not missing, f"torch.Tensor methods the examples call that minidist lacks: {missing}"
