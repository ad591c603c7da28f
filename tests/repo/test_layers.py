"""The layout's rules, as a test: the import graph of the shipped packages has no cycle and points down.

Every import counts, at the top of a module or inside a function (a lazy
import is still a dependency), and so do the commands the exporter imports
by name (``"render:main"``). Cycles are looked for twice: between
modules, and between packages (each directory is one node), so two modules
of different packages cannot lean on each other through a third.

The layers, bottom up: ``telemetry`` (output: encoders, transports, logs,
settings), ``catalog`` (what is emitted, as data), ``triton_http`` (the
bounded HTTP client both daemons call Triton with, importing nothing of ours),
then ``exporter``, ``modelsync`` and ``render`` (the deploy artifacts'
generator) side by side (none imports another, but for the exporter's
``render``/``cost`` command aliases, named as strings), and ``controller`` (the
fleet's one decider, which no package imports; it writes model sync's rollout
state with model sync's own ledger); ``triton_side`` is standard library only
(it runs in the Triton image).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO

ROOT = REPO
PACKAGES = ("telemetry", "catalog", "triton_http", "exporter", "modelsync", "render", "triton_side", "controller")
# What each top-level package may import of ours (the rest of the graph must point down to these).
ALLOWED = {
    "telemetry": set(),
    "catalog": {"telemetry"},
    "triton_http": set(),
    "exporter": {"telemetry", "catalog", "triton_http", "triton_side", "render"},  # render: the aliases only (below)
    "modelsync": {"telemetry", "catalog", "triton_http"},
    "render": {"telemetry", "catalog"},
    "triton_side": set(),
    # nothing imports controller; it writes model sync's rollout state through model sync's own ledger
    "controller": {"telemetry", "catalog", "triton_http", "modelsync"},
}
COMMAND = re.compile(r"^((?:" + "|".join(PACKAGES) + r")(?:\.\w+)*):\w+$")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of ours; a compiled one (exporter/sources/_scan) is known by its type stub."""
    return {
        module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py*"))
        if p.suffix in (".py", ".pyi")
    }


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module of ours, line) for every import in the file, wherever it is."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                parts = parts if is_package else parts[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            # ``from pkg import mod`` imports the module pkg.mod; ``from pkg import name`` the package
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = COMMAND.match(node.value)  # a command imported by name
            targets = [m.group(1)] if m else []
        for t in targets:
            while t and t not in known:  # ``import a.b.c`` of a function or attribute: its module
                t = t.rpartition(".")[0]
            if t and t.split(".")[0] in PACKAGES and t != name:
                yield t, getattr(node, "lineno", 0)


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {name: dict(imports(name, path, known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def package_of(module: str, known: dict[str, Path]) -> str:
    return module if known[module].name == "__init__.py" else module.rpartition(".")[0] or module


def test_the_graph_sees_function_level_and_by_name_imports() -> None:
    """The checker itself: a lazy import and a command named as a string are edges."""
    g = graph()
    assert "exporter.sources.triton" in g["exporter.__main__"]  # imported inside build_sources()
    assert "triton_side.probe" in g["exporter.__main__"]  # COMMANDS["health"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_modules() -> None:
    g = graph()
    found = cycles({m: set(t) for m, t in g.items()})
    assert found == [], "import cycles between modules: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_cycle_between_packages() -> None:
    known = modules()
    edges: dict[str, set[str]] = {}
    for m, targets in graph().items():
        src = package_of(m, known)
        edges.setdefault(src, set()).update(package_of(t, known) for t in targets if package_of(t, known) != src)
    found = cycles(edges)
    assert found == [], "import cycles between packages: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_down_the_layers(package: str) -> None:
    wrong = sorted(
        f"{m} imports {t} (line {line})"
        for m, targets in graph().items()
        if m.split(".")[0] == package
        for t, line in targets.items()
        if t.split(".")[0] != package and t.split(".")[0] not in ALLOWED[package]
    )
    assert wrong == []


def test_the_sidecar_reaches_the_generator_only_through_its_command_aliases() -> None:
    """``python -m render|cost`` name the generator as strings; no sidecar module imports it."""
    from exporter.__main__ import COMMANDS

    aliases = {v.split(":")[0] for v in COMMANDS.values()}
    edges = {
        (m, t)
        for m, targets in graph().items()
        if m.split(".")[0] == "exporter"
        for t in targets
        if t.startswith("render")
    }
    assert edges == {("exporter.__main__", "render"), ("exporter.__main__", "render.cost")}
    assert {t for _, t in edges} <= aliases


# --- the tests' own layers (tests/README.md) ----------------------------------------------------------------

TEST_LAYERS = ("unit", "integration", "deploy", "repo", "support/tests")


def test_every_test_module_sits_in_a_layer_and_unit_mirrors_the_packages() -> None:
    tests = ROOT / "tests"
    for path in tests.rglob("test_*.py"):
        rel = path.relative_to(tests).as_posix()
        assert rel.startswith(tuple(f"{layer}/" for layer in TEST_LAYERS)), f"tests/{rel} is in no layer"
    packages = {p.name for p in (tests / "unit").iterdir() if p.is_dir() and p.name != "__pycache__"}
    shipped_or_demo = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - {"cli"} <= shipped_or_demo, packages - shipped_or_demo
    for folder in [tests, *(p for p in tests.rglob("*") if p.is_dir() and "__pycache__" not in p.parts)]:
        if folder.name != "fixtures" and "fixtures" not in folder.relative_to(tests).parts:
            assert (folder / "__init__.py").exists(), f"{folder}: module names must stay unique (tests.unit....)"


def test_a_worker_takes_a_module_whole_and_the_engines_modules_together() -> None:
    from tests import conftest

    assert conftest.work_unit("tests/unit/exporter/test_x.py::a[1]") == "tests/unit/exporter/test_x.py"
    assert conftest.work_unit("tests/deploy/test_rehearsal.py::t") == conftest.work_unit(
        "tests/deploy/test_triton_side_debian.py::test_verdicts_under_debian_python[trixie]"
    )


def test_the_longest_units_run_first_and_name_real_modules() -> None:
    from tests import conftest

    for unit in conftest.LONGEST_FIRST:
        assert unit == "container-engine" or (ROOT / unit).is_file(), unit

    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    items = [Item("tests/unit/a/test_x.py::t1"), Item("tests/deploy/test_checkov.py::t"),
             Item("tests/unit/a/test_x.py::t2"), Item("tests/deploy/test_rehearsal.py::t")]  # fmt: skip
    ordered = [i.nodeid for i in conftest.run_order(items)]  # type: ignore[arg-type]
    assert ordered == ["tests/deploy/test_rehearsal.py::t", "tests/deploy/test_checkov.py::t",
                       "tests/unit/a/test_x.py::t1", "tests/unit/a/test_x.py::t2"]  # fmt: skip


def test_the_collection_guard_refuses_a_unit_test_that_needs_a_real_triton() -> None:
    """tests/conftest.py's hook: a unit test asking for ``triton`` or ``moto``, or marked ``triton``, is refused."""
    import pytest

    from tests import conftest

    class Item:
        def __init__(self, nodeid: str, fixtures: tuple[str, ...], marks: tuple[str, ...] = ()) -> None:
            self.nodeid, self.fixturenames, self.marks = nodeid, fixtures, [getattr(pytest.mark, m) for m in marks]

        def iter_markers(self, name: str | None = None):
            return iter(m.mark for m in self.marks if name in (None, m.mark.name))

        def add_marker(self, mark) -> None:
            self.marks.append(mark)

    fine = [Item("tests/unit/exporter/test_x.py::a", ("tmp_path",)), Item("tests/integration/test_y.py::b", ("moto",))]
    conftest.pytest_collection_modifyitems(None, fine)  # type: ignore[arg-type]
    for bad in (
        Item("tests/unit/exporter/test_x.py::c", ("triton",)),
        Item("tests/unit/modelsync/test_x.py::d", ("tmp_path", "moto")),
        Item("tests/support/tests/test_x.py::e", (), ("triton",)),
    ):
        with pytest.raises(pytest.UsageError, match=bad.nodeid.replace("[", r"\[")):
            conftest.pytest_collection_modifyitems(None, [bad])  # type: ignore[arg-type]
