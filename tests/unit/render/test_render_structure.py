"""render/'s shape: imports at module level only, no private names across modules, no cycles,
no model sync, and one reference checker."""

from __future__ import annotations

import ast

from tests.support.paths import REPO

ROOT = REPO
RENDER = ROOT / "render"
PACKAGE = "render"


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(RENDER.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def is_package(name: str) -> bool:
    return (ROOT / name.replace(".", "/") / "__init__.py").is_file()


def render_imports(name: str, tree: ast.Module, mods: dict[str, ast.Module]) -> set[str]:
    """The render modules ``name`` imports at module level (``from . import x`` counts as importing x)."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            target = absolute(name, is_package(name), node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in mods else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in mods and m != name}


def test_no_import_inside_a_function() -> None:
    hidden = [
        f"{name}:{inner.lineno}"
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for inner in ast.walk(node)
        if isinstance(inner, ast.Import | ast.ImportFrom)
    ]
    assert hidden == []


def test_no_module_uses_another_modules_private_names() -> None:
    mods = modules()
    bad = []
    for name, tree in mods.items():
        imported_modules = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                bad += [
                    f"{name}: from ... import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and a.name[:2] != "__"
                ]
                target = absolute(name, is_package(name), node)
                imported_modules |= {a.asname or a.name for a in node.names if f"{target}.{a.name}" in mods}
            elif isinstance(node, ast.Import):
                imported_modules |= {(a.asname or a.name).split(".")[0] for a in node.names}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in imported_modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                bad.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert bad == []


def test_render_modules_import_no_cycle_and_never_modelsync() -> None:
    mods = modules()
    graph = {name: render_imports(name, tree, mods) for name, tree in mods.items()}
    for name, tree in mods.items():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            assert not [n for n in names if n == "modelsync" or n.startswith("modelsync.")], name

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join([*path, name])
        for nxt in graph[name]:
            visit(nxt, (*path, name))

    for name in graph:
        visit(name, ())


def test_one_reference_checker() -> None:
    """Only base/widgets.py looks metrics up in a catalog; everything else asks it."""
    lookups = [
        f"{name}:{node.lineno}"
        for name, tree in modules().items()
        if name != f"{PACKAGE}.base.widgets"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("definition", "emits")
    ]
    assert lookups == []
