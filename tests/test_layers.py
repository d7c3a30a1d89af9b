"""The layer contract of the design brief: each layer imports only from layers below it.

    xp, log, version, trace  <-  tensor, cuda  <-  nn, optim, comm, utils  <-  data, kernels, viz  <-  amp
        <-  ddp  <-  checkpoint  <-  trainer  <-  launch, multiprocessing

plus: comm never imports tensor (collectives move plain xp arrays in place). A new top-level
module must be placed in LAYERS, so the contract cannot be skipped by accident.
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "minidist"

LAYERS = {
    "xp": 0, "log": 0, "version": 0, "trace": 0,
    "tensor": 1, "cuda": 1,
    "nn": 2, "optim": 2, "comm": 2,
    "data": 3, "kernels": 3, "viz": 3, "tune": 3,
    "amp": 4,
    "ddp": 5,
    "checkpoint": 6,
    "trainer": 7,
    "launch": 8, "multiprocessing": 8,
    "utils": 2,
}
FORBIDDEN = {("comm", "tensor"), ("comm", "nn"), ("comm", "optim")}


def top_component(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "minidist" or len(parts) < 2:
        return None
    return parts[1]


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(PKG.parent).with_suffix("")
    pkg_parts = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:  # from . import x  -> each x may be a module
                    out += [mod + "." + a.name for a in node.names]
                    continue
            else:
                mod = node.module or ""
            out.append(mod)
    return out


def test_every_module_is_in_a_layer():
    unknown = sorted({p.relative_to(PKG).parts[0].removesuffix(".py") for p in PKG.rglob("*.py")}
                     - set(LAYERS) - {"__init__"})
    assert not unknown, f"place these modules in LAYERS (tests/test_layers.py): {unknown}"


def test_imports_go_downward():
    bad = []
    for path in PKG.rglob("*.py"):
        src = path.relative_to(PKG).parts[0].removesuffix(".py")
        if src == "__init__":
            continue  # the package root re-exports the public API of every layer
        for mod in imports_of(path):
            dst = top_component(mod)
            if dst is None or dst == src or dst not in LAYERS:
                continue
            if LAYERS[dst] >= LAYERS[src] or (src, dst) in FORBIDDEN:
                bad.append(f"{path.relative_to(PKG.parent)} imports {mod} ({src} -> {dst})")
    assert not bad, "imports that break the layer order:\n" + "\n".join(bad)
