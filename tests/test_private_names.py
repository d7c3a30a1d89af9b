"""No module inside minidist/ reaches into another module's private names.

A name with a leading underscore is a module's own business: ``x._name`` where ``x`` is not
``self``/``cls`` and ``_name`` is defined only in another module, or ``from m import _name``
across modules, couples two modules through a detail one of them may change. What a module
offers another goes through a public name (a method, a property, a function).

"Defined in a module": a function, class, module or class variable, or an attribute the module
assigns (``self._x = ...``, ``obj._x = ...``) named ``_name``. Dunders (``__name__``) are
public by convention. ALLOWED lists the exceptions, each with its reason.
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "minidist"

# (module using the name, or "minidist.tensor.*" for a package, name): why it is acceptable
ALLOWED: dict[tuple[str, str], str] = {
    ("minidist.tensor.*", "_make"): "Tensor._make, the tape's node constructor: core.py was "
                                    "split into one module per op family, which all build nodes",
    ("minidist.tensor.*", "_grad_dest"): "the tape's fields on Tensor (core.py), which the "
                                         "backward walk (autograd.py) reads",
    ("minidist.tensor.*", "_grad"): "the tape's fields on Tensor (core.py), as above: the walk "
                                    "accumulates into it, grad_destination.py installs it",
    ("minidist.tensor.*", "_parents"): "the tape's fields on Tensor (core.py), as above",
    ("minidist.tensor.*", "_op"): "the tape's fields on Tensor (core.py), as above",
    ("minidist.optim.sgd", "_required"): "torch's sentinel for a required argument "
                                         "(torch.optim.optimizer.required), kept private",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")


def _defined(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return {n for n in names if _private(n)}


def _modules() -> dict[str, ast.AST]:
    return {_module_name(p): ast.parse(p.read_text(), filename=str(p))
            for p in sorted(PKG.rglob("*.py"))}


def _allowed(module: str, name: str) -> bool:
    package = module.rsplit(".", 1)[0] + ".*"
    return (module, name) in ALLOWED or (package, name) in ALLOWED


def reaches(modules: dict[str, ast.AST]) -> list[str]:
    defined = {m: _defined(t) for m, t in modules.items()}
    owners: dict[str, set[str]] = {}
    for m, names in defined.items():
        for n in names:
            owners.setdefault(n, set()).add(m)
    hits = []
    for m, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if (_private(a.name) and node.module.startswith("minidist")
                            and node.module != m and not _allowed(m, a.name)):
                        hits.append(f"{m}:{node.lineno}: from {node.module} import {a.name}")
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if node.attr in defined[m] or _allowed(m, node.attr):
                    continue
                if owners.get(node.attr):
                    hits.append(f"{m}:{node.lineno}: .{node.attr} "
                                f"(defined in {', '.join(sorted(owners[node.attr]))})")
    return hits


def test_no_module_reaches_into_another_modules_private_names():
    hits = reaches(_modules())
    assert not hits, ("private names used across modules; offer a public name instead (or add "
                      "a justified entry to ALLOWED):\n" + "\n".join(hits))


def test_the_check_sees_a_reach():
    owner = ast.parse("class G:\n    def __init__(self):\n        self._byes = {}\n")
    user = ast.parse("def poll(group):\n    return group._byes\n"
                     "from minidist.a import _helper\n")
    hits = reaches({"minidist.a": owner, "minidist.b": user})
    assert any("._byes" in h for h in hits) and any("import _helper" in h for h in hits), hits
    same = ast.parse("class G:\n    def f(self, other):\n        return other._x\n"
                     "    def g(self):\n        self._x = 1\n")
    assert reaches({"minidist.a": same}) == []
