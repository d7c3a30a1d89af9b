"""The layer contract of the design brief: each layer imports only from layers below it.

``LAYERS`` below is the one statement of the order (a number per top-level module, lowest at
the bottom); the docstring of minidist/__init__.py states it in words (every layer, checked
here) and the diagram of docs/layout.md draws it top down (its order is checked here),

plus: comm never imports tensor (collectives move plain xp arrays in place). A new top-level
module must be placed in LAYERS, so the contract cannot be skipped by accident, and LAYERS names
only modules that exist. Imports through public names count: ``from minidist import Tensor``
is an import of minidist.tensor (where minidist/__init__.py takes Tensor from), and ``import
minidist`` followed by ``minidist.Trainer`` an import of minidist.trainer.
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "minidist"

LAYERS = {
    "envvars": -1, "user_cache": -1,
    "xp": 0, "logger": 0, "version": 0, "tracing": 0, "backends": 0, "wings": 0,
    "tensor": 1, "cuda": 1, "kernels": 1,
    "nn": 2, "optim": 2, "comm": 2, "accelerator": 2, "utils": 2,
    "fastpath": 3, "tcp": 3,
    "auto": 4,
    "data": 5, "viz": 5, "tune": 5,
    "amp": 6,
    "ddp": 7,
    "watch": 8, "memory": 8,
    "checkpoint": 9,
    "trainer": 10,
    "launch": 11, "multiprocessing": 11, "testing": 11, "distributed": 11,
}
FORBIDDEN = {("comm", "tensor"), ("comm", "nn"), ("comm", "optim")}


def top_component(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "minidist" or len(parts) < 2:
        return None
    return parts[1]


def public_names() -> dict[str, str]:
    """Each name minidist/__init__.py exports -> the module it comes from (read from its imports).

    ``from minidist.tensor import Tensor`` gives Tensor -> minidist.tensor; ``from minidist import
    nn`` gives nn -> minidist.nn.
    """
    tree = ast.parse((PKG / "__init__.py").read_text())
    names = {}
    for node in ast.walk(tree):  # the wings' names sit in ``if "<wing>" in _loaded:`` blocks
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                src = f"minidist.{a.name}" if node.module == "minidist" else node.module
                names[a.asname or a.name] = src
    return names


PUBLIC = public_names()


def resolve(mod: str) -> str:
    """``minidist.X`` where X is a public name, not a submodule: the module X comes from."""
    top = top_component(mod)
    if top is not None and top not in LAYERS and top in PUBLIC:
        return PUBLIC[top]
    return mod


def imports_of(path: Path, text: str | None = None) -> list[str]:
    """The minidist modules ``path`` imports, with public names resolved to their modules.

    ``from minidist import Tensor`` counts as an import of minidist.tensor (where Tensor is
    defined), and ``import minidist`` as an import of each ``minidist.X`` the file uses.
    """
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    rel = path.relative_to(PKG.parent).with_suffix("")
    pkg_parts = list(rel.parts[:-1])
    out = []
    plain = set()  # names bound by `import minidist` (as itself or an alias)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append(a.name)
                if a.name == "minidist":
                    plain.add(a.asname or "minidist")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod == "minidist" or node.module is None:  # from minidist import X / from . import X
                out += [mod + "." + a.name for a in node.names]
            else:
                out.append(mod)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in plain):
            out.append("minidist." + node.attr)
    return [resolve(m) for m in out]


def test_every_module_is_in_a_layer():
    unknown = sorted({p.relative_to(PKG).parts[0].removesuffix(".py") for p in PKG.rglob("*.py")}
                     - set(LAYERS) - {"__init__"})
    assert not unknown, f"place these modules in LAYERS (tests/test_layers.py): {unknown}"


def test_every_layer_exists():
    missing = sorted(n for n in LAYERS
                     if not (PKG / n).is_dir() and not (PKG / f"{n}.py").is_file())
    assert not missing, f"LAYERS (tests/test_layers.py) lists modules that do not exist: {missing}"


def test_public_names_resolve_to_modules_in_a_layer():
    bad = {n: m for n, m in PUBLIC.items() if n != "__version__" and top_component(m) not in LAYERS}
    assert not bad, f"public names whose module is in no layer: {bad}"
    assert PUBLIC["Tensor"] == "minidist.tensor" and PUBLIC["nn"] == "minidist.nn"


def test_the_package_docstring_states_the_same_order():
    """minidist/__init__.py documents the layers as `a -> b, c -> ...`; LAYERS must agree."""
    doc = ast.get_docstring(ast.parse((PKG / "__init__.py").read_text()))
    line = next(x for x in " ".join(doc.split("\n")).split(": ") if "->" in x)
    groups = [[n.strip(" .") for n in g.split(",")] for g in line.split("->")]
    for lower, upper in zip(groups, groups[1:]):
        for a in lower:
            for b in upper:
                assert LAYERS[a] < LAYERS[b], f"__init__ says {a} -> {b}, LAYERS says otherwise"
    for g in groups:
        assert len({LAYERS[n] for n in g}) == 1, f"__init__ groups {g}; LAYERS splits them"
    listed = [n for g in groups for n in g]
    assert sorted(listed) == sorted(LAYERS), \
        f"__init__ must name every layer once; LAYERS: {sorted(LAYERS)}, __init__: {listed}"


def test_the_layout_diagram_draws_the_same_order():
    """docs/layout.md's diagram lists layers top down: never a lower layer above a higher one."""
    text = (PKG.parent / "docs" / "layout.md").read_text()
    block = text.split("```", 2)[1]  # the first code block: the diagram
    rows = []
    for line in block.splitlines():
        if line.startswith("  ") and not line.startswith("   "):  # a layer's first line
            names = [n.strip() for n in line.strip().split("  ")[0].split(",")]
            rows.append((line.strip().split("  ")[0], [LAYERS[n] for n in names]))
    assert len(rows) >= 8, f"no diagram found in docs/layout.md: {rows}"
    for (upper, up), (lower, low) in zip(rows, rows[1:]):
        assert min(up) >= max(low), f"docs/layout.md draws {upper} above {lower}; LAYERS disagrees"


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


def test_public_name_imports_are_seen():
    """The resolver catches the forms that used to slip through."""
    seen = imports_of(PKG / "nn" / "probe.py",  # as if in minidist/nn (never written)
                      "import minidist\nfrom minidist import Trainer\nfrom .. import Tensor\n"
                      "x = minidist.DistributedDataParallel\n")
    assert {"minidist.trainer", "minidist.tensor"} <= set(seen)
    assert top_component(resolve("minidist.DistributedDataParallel")) == "ddp"
    assert any(top_component(m) == "ddp" for m in seen), seen
