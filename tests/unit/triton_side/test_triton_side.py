"""The Triton-side folder as a deployable: Python 3.8+, public standard library only, lean start-up.

``triton_side/`` runs on the Triton image's own ``python3`` (3.8 in Ubuntu 20.04
images, 3.10 and 3.12 in later ones) with nothing installed. No 3.8 interpreter
may be on the machine, so 3.8 compatibility is proven three ways, each of which
runs everywhere but the last: ruff with ``target-version = "py38"`` for the
folder (syntax), the AST check below for the runtime constructs and
standard-library names ruff does not know (``dict | dict``, ``list[int]``
outside annotations, ``str.removeprefix``, ...), and, where a 3.8 interpreter
exists, a real run on it.

It must keep running when the image's Python changes, so it uses public
modules and names only: the AST check below fails on a private module of the
standard library (``_socket``, ``_json``, ``_thread``) or a private name, and,
with the container rehearsal's engine, the probe and the start-up check run
under Debian's Python 3.9, 3.11 and 3.13 (which bracket Triton's 3.10 and 3.12)
against a real Triton and must give the verdicts they give here.

The probe's start-up shortcuts (``_cli``'s own reader, ``_jsonparse.loads``,
``_http.split_url``, ``probe.run_parallel``) are compared with the standard
library code they replace.
"""

from __future__ import annotations

import ast
import gc
import glob
import json
import math
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import fakes
from tests.support.paths import REPO
from triton_side import _cli, _http, _jsonparse, probe, startup_check

ROOT = REPO
FOLDER = ROOT / "triton_side"
FILES = sorted(FOLDER.glob("*.py"))
SIBLINGS = {p.stem for p in FILES}


def python38() -> str | None:
    """A Python 3.8 interpreter on this machine (PATH, pyenv, /usr/bin), or None."""
    candidates = [shutil.which("python3.8"), "/usr/bin/python3.8"]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            probe_version = subprocess.run(
                [candidate, "-I", "-S", "-c", "import sys; print(sys.version_info[:2] == (3, 8))"],
                capture_output=True,
                text=True,
            )
            if probe_version.stdout.strip() == "True":
                return candidate
    return None


def install_copy(dest: Path) -> Path:
    """The folder as the Triton image gets it (one COPY to /opt/triton-health/); returns that folder."""
    target = dest / "opt" / "triton-health"
    shutil.copytree(FOLDER, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


# --- Python 3.8: what ruff cannot see ----------------------------------------------------------

# Standard-library names added after Python 3.8 that a Triton-side file could plausibly reach for.
NEW_MODULES = {"graphlib", "zoneinfo", "tomllib"}
NEW_ATTRIBUTES = {
    "math": {"lcm", "nextafter", "ulp", "cbrt", "exp2", "sumprod", "fma"},
    "os": {"waitstatus_to_exitcode", "pidfd_open", "eventfd", "splice", "process_cpu_count"},
    "os.path": {"splitroot", "isjunction"},
    "sys": {"platlibdir", "orig_argv", "stdlib_module_names", "exception"},
    "random": {"randbytes", "binomialvariate"},
    "itertools": {"pairwise", "batched"},
    "functools": {"cache"},
    "contextlib": {"aclosing", "chdir"},
    "operator": {"call"},
    "hashlib": {"file_digest"},
    "datetime": {"UTC"},
    "enum": {"StrEnum", "verify", "member", "nonmember", "ReprEnum"},
    "re": {"NOFLAG"},
    "dataclasses": {"KW_ONLY"},
    "types": {"GenericAlias", "UnionType", "EllipsisType", "NoneType", "NotImplementedType"},
    "typing": {"Annotated", "ParamSpec", "TypeAlias", "Concatenate", "TypeGuard", "Self", "Never",
               "LiteralString", "Required", "NotRequired", "assert_never", "reveal_type", "override"},
    "threading": {"gettrace", "getprofile"},
    "logging": {"getLevelNamesMapping"},
    "socket": {"send_fds", "recv_fds"},
    "asyncio": {"to_thread", "TaskGroup", "timeout", "Runner"},
}  # fmt: skip
# Methods of built-in types added after 3.8: flagged on any object.
NEW_METHODS = {"removeprefix", "removesuffix", "bit_count", "is_relative_to", "with_stem", "hardlink_to"}
# Keyword arguments added after 3.8, by the function they belong to.
NEW_KEYWORDS = {
    "zip": {"strict"},
    "dataclass": {"slots", "kw_only", "match_args"},
    "ArgumentParser": {"exit_on_error"},
    "run": {"process_group"},
    "Popen": {"process_group"},
    "create_connection": {"all_errors"},
    "shutdown": {"cancel_futures"},
    "sample": {"counts"},
    "bisect": {"key"},
    "bisect_left": {"key"},
    "bisect_right": {"key"},
    "insort": {"key"},
    "md5": {"usedforsecurity"},
    "sha256": {"usedforsecurity"},
}
GENERIC_BUILTINS = {"list", "dict", "tuple", "set", "frozenset", "type"}
TYPE_NAMES = GENERIC_BUILTINS | {"int", "str", "bytes", "float", "bool", "object"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _call_name(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _is_dict(node: ast.AST) -> bool:
    return isinstance(node, (ast.Dict, ast.DictComp)) or (isinstance(node, ast.Call) and _call_name(node) == "dict")


def _is_type(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and node.value is None) or (
        isinstance(node, ast.Name) and node.id in TYPE_NAMES
    )


def py38_violations(source: str, name: str = "<source>") -> list[str]:
    """Constructs in ``source`` that Python 3.8 cannot run, beyond what ruff's py38 target flags."""
    problems: list[str] = []
    try:
        tree = ast.parse(source, name, feature_version=(3, 8))
    except SyntaxError as exc:
        return [f"{name}:{exc.lineno}: not Python 3.8 syntax: {exc.msg}"]
    future = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    aliases: dict[str, str] = {}  # local name -> module, from the file's imports
    annotations: set[int] = set()  # ids of annotation nodes, never evaluated with the __future__ import
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                top = a.name.split(".")[0]
                if top in NEW_MODULES:
                    problems.append(f"{name}:{node.lineno}: module {a.name} is newer than Python 3.8")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in NEW_MODULES:
                problems.append(f"{name}:{node.lineno}: module {node.module} is newer than Python 3.8")
            for a in node.names:
                if a.name in NEW_ATTRIBUTES.get(node.module, set()):
                    problems.append(f"{name}:{node.lineno}: {node.module}.{a.name} is newer than Python 3.8")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None and arg.annotation is not None:
                    annotations.add(id(arg.annotation))
            if node.returns is not None:
                annotations.add(id(node.returns))
        elif isinstance(node, ast.AnnAssign):
            annotations.add(id(node.annotation))

    if annotations and not future:
        problems.append(f"{name}: needs `from __future__ import annotations` (PEP 585/604 annotations stay strings)")

    def visit(node: ast.AST) -> None:
        if id(node) in annotations:
            return
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node.value)
            module = aliases.get(dotted.split(".")[0], "") + dotted[len(dotted.split(".")[0]) :] if dotted else ""
            if node.attr in NEW_ATTRIBUTES.get(module, set()):
                problems.append(f"{where}: {module}.{node.attr} is newer than Python 3.8")
            if node.attr in NEW_METHODS:
                problems.append(f"{where}: .{node.attr}() is newer than Python 3.8")
        elif isinstance(node, ast.Subscript):
            base = _dotted(node.value)
            if base in GENERIC_BUILTINS or base.startswith(("collections.abc.", "re.")) or base in {
                "Pattern", "Match", "Mapping", "Sequence", "Iterable", "Callable"}:  # fmt: skip
                problems.append(f"{where}: {base}[...] outside an annotation needs Python 3.9")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            if _is_dict(node.left) or _is_dict(node.right):
                problems.append(f"{where}: dict | dict needs Python 3.9")
            elif _is_type(node.left) or _is_type(node.right):
                problems.append(f"{where}: X | Y of types outside an annotation needs Python 3.10")
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.BitOr) and _is_dict(node.value):
            problems.append(f"{where}: dict |= needs Python 3.9")
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in NEW_KEYWORDS.get(_call_name(node), set()):
                    problems.append(f"{where}: {_call_name(node)}({kw.arg}=...) needs Python 3.9+")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return problems


def test_the_py38_check_catches_what_it_is_for() -> None:
    """Each kind of construct it looks for, in a file that ruff's py38 target lets through."""
    bad = """
from __future__ import annotations
import math, zoneinfo
from itertools import pairwise
import os.path as osp
def f(a: list[int], b: dict | None = None) -> tuple[int, ...]:
    merged = {"a": 1} | dict(b=2)
    merged |= {"c": 3}
    alias = list[int]
    isinstance(a, int | None)
    osp.splitroot("/x")
    return "xab".removeprefix("x"), math.lcm(2, 3), zip(a, a, strict=True), alias
"""
    found = "\n".join(py38_violations(bad))
    for needle in (
        "zoneinfo",
        "itertools.pairwise",
        "os.path.splitroot",
        "dict | dict",
        "dict |=",
        "list[...] outside",
        "X | Y of types",
        ".removeprefix()",
        "math.lcm",
        "zip(strict",
    ):
        assert needle in found, (needle, found)
    assert len(py38_violations(bad)) == 10, found  # and nothing in the annotations
    assert "not Python 3.8 syntax" in py38_violations("match x:\n    case 1: pass\n")[0]
    assert "__future__" in py38_violations("x: int = 1\n")[0]
    assert py38_violations("x = 1\n") == []
    # allowed in 3.8: the walrus, positional-only parameters, f-string "=", math.prod
    ok = (
        "from __future__ import annotations\nimport math\ndef g(a, /):\n    if (n := math.prod(a)) > 1:\n"
        "        return f'{n=}'\n"
    )
    assert py38_violations(ok) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_file_runs_on_python_38(path: Path) -> None:
    assert py38_violations(path.read_text(), path.name) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_file_imports_only_the_standard_library(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for mod in names:
            top = mod.split(".")[0]
            assert top in sys.stdlib_module_names or top in SIBLINGS, f"{path.name}:{node.lineno} imports {mod}"


# The folder's modules, each importing only modules after it (probe.py's docstring): no cycle, as scripts or as the
# package. A new file goes into this list.
IMPORT_ORDER = ["health", "startup_check", "probe", "_infer", "_report", "_http", "_jsonparse", "_cli", "__init__"]


def sibling_imports(path: Path) -> set[str]:
    """The folder's modules that ``path`` imports, in either form (package or script), at the top or in a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
            names = [a.name for a in node.names]  # from . import _cli
        elif isinstance(node, ast.ImportFrom) and node.level <= 1 and node.module:
            names = [node.module.split(".")[0]]  # from ._infer import smoke, from _infer import smoke
        else:
            continue
        found |= {name for name in names if name in SIBLINGS}
    return found - {path.stem}


def test_imports_between_the_files_point_one_way() -> None:
    assert sorted(IMPORT_ORDER) == sorted(SIBLINGS)
    graph = {path.stem: sibling_imports(path) for path in FILES}
    assert graph["probe"] == {"_cli", "_http", "_report", "_infer"} and graph["health"] == {"probe"}
    assert graph["_http"] == {"_cli", "_jsonparse"}
    for module, imported in graph.items():
        for other in imported:
            assert IMPORT_ORDER.index(other) > IMPORT_ORDER.index(module), f"{module}.py imports {other}"


# --- public standard library only ------------------------------------------------------------


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def defined_names(sources: Mapping[str, str]) -> set[str]:
    """Every name the folder defines itself (modules, functions, classes, variables, attributes it assigns)."""
    names = set(sources)
    for source in sources.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return names


def private_uses(source: str, name: str, own: set[str]) -> list[str]:
    """What in ``source`` reaches into the standard library's private parts: a module with a leading
    underscore in its dotted name (``_socket``, ``json._x``), or a private name (``from os import _exit``,
    ``socket._GLOBAL_DEFAULT_TIMEOUT``, ``__import__("_json")``). ``own``: names the folder defines itself
    (its ``_http`` and ``self._lock`` are its own business); dunders are fine."""

    def private_module(module: str) -> bool:
        return module.split(".")[0] not in own and any(part.startswith("_") for part in module.split("."))

    problems = []
    for node in ast.walk(ast.parse(source)):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            problems += [f"{where}: imports private module {a.name}" for a in node.names if private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != "__future__":
            if private_module(node.module):
                problems.append(f"{where}: imports from private module {node.module}")
            elif node.module.split(".")[0] not in own:
                problems += [
                    f"{where}: imports private name {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not _dunder(a.name)
                ]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not _dunder(node.attr):
            if node.attr not in own:
                problems.append(f"{where}: uses private name .{node.attr}")
        elif isinstance(node, ast.Call) and _call_name(node) in ("__import__", "import_module") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and private_module(arg.value):
                problems.append(f"{where}: imports private module {arg.value}")
    return problems


FOLDER_SOURCES = {p.stem: p.read_text() for p in FILES}


def test_the_private_use_check_catches_what_it_is_for() -> None:
    bad = textwrap.dedent("""\
        import _socket, json.decoder, os
        import _thread as threads
        from _json import make_scanner
        from os import _exit, path
        from json._private import x
        import importlib
        timeout = os._exit, _socket.socket, sys._getframe
        importlib.import_module("_json"), __import__("_thread")
        """)
    found = private_uses(bad, "bad.py", defined_names({"bad": bad}))
    assert found == [
        "bad.py:1: imports private module _socket",
        "bad.py:2: imports private module _thread",
        "bad.py:3: imports from private module _json",
        "bad.py:4: imports private name os._exit",
        "bad.py:5: imports from private module json._private",
        "bad.py:7: uses private name ._exit",
        "bad.py:7: uses private name ._getframe",
        "bad.py:8: imports private module _json",
        "bad.py:8: imports private module _thread",
    ], found
    own = textwrap.dedent("""\
        from __future__ import annotations
        import _cli
        from . import _http
        from ._infer import smoke
        class C:
            __slots__ = ("_lock",)
            def __init__(self):
                self._lock = _http._make()
        def _make(): return C().__class__, __file__
        """)
    assert private_uses(own, "own.py", defined_names({"own": own, "_cli": "", "_http": "", "_infer": ""})) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_file_uses_only_public_standard_library(path: Path) -> None:
    """CPython's private modules (``_socket``, ``_json``, ``_thread``) and names have no compatibility promise:
    if a Triton image's Python changed one, every task would fail its health check at once."""
    assert private_uses(path.read_text(), path.name, defined_names(FOLDER_SOURCES)) == []


def test_no_module_shadows_the_standard_library() -> None:
    """Run as scripts, the folder is first on sys.path: a file named like a standard module would replace it."""
    assert {p.stem for p in FILES} & set(sys.stdlib_module_names) == set()


def ruff_check(source: str, filename: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the dev extra: bash scripts/setup.sh"
    return subprocess.run(
        [ruff, "check", "--no-cache", "--output-format", "concise", "--stdin-filename", filename, "-"],
        input=source, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip


def test_ruff_checks_the_folder_against_python_38() -> None:
    """The repository's own ruff configuration, as ``ruff check .`` reads it, targets 3.8 in triton_side/ only."""
    newer = textwrap.dedent("""\
        from __future__ import annotations


        def f(x: int) -> int:
            match x:
                case 1:
                    return 1
            with (open("a") as a, open("b") as b):
                return len(a.read() + b.read())
        """)
    inside = ruff_check(newer, "triton_side/newer.py")
    assert inside.returncode == 1, inside.stdout + inside.stderr
    assert "Python 3.8" in inside.stdout and "match" in inside.stdout and "parentheses" in inside.stdout
    outside = ruff_check(newer, "exporter/newer.py")
    assert outside.returncode == 0, outside.stdout + outside.stderr
    # a PEP 604 annotation without the __future__ import breaks 3.8 at import time: FA102 says so
    bare = "def f(x: int | None) -> list[int]:\n    return [x or 0]\n"
    assert "FA102" in ruff_check(bare, "triton_side/bare.py").stdout


def test_runs_on_a_real_python_38_when_there_is_one(tmp_path: Path) -> None:
    """The static checks above run everywhere; here the files also run on 3.8 itself if it is installed."""
    python = python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter here: the ruff py38 target and the AST checks above stand in for it")
    folder = install_copy(tmp_path)
    for script in ("health.py", "startup_check.py"):
        proc = subprocess.run([python, "-I", "-S", str(folder / script), "--help"], capture_output=True, text=True)
        assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr
    # the fast command-line reader agrees with 3.8's argparse too
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import _cli, _http, probe\n"
        "for argv in ([], ['--triton-url', 'http://h:1', '--quiet'], ['--smoke', '--deadline=2'], ['--models', 'a', "
        "'--models', 'b/2', '--smoke', 'add'], ['--smoke']):\n"
        "    fast = _cli.read_plain(probe.FLAGS, argv)\n"
        "    slow = vars(_cli.argparse_parser(probe.FLAGS, 'health.py', '').parse_args(argv))\n"
        "    assert fast == slow, (argv, fast, slow)\n"
        "print(_http.loads(' [1, 2.5, \"x\", {\"a\": null}] '), _http.split_url('http://h:8/p'))\n"
    )
    proc = subprocess.run([python, "-I", "-S", "-c", code, str(folder)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[1, 2.5, 'x', {'a': None}] ('http', 'h', 8, '/p')"


# --- start-up cost ----------------------------------------------------------------------------

# What the probe's default run must not import: each costs milliseconds (re and enum behind most of them; encodings.idna
# with stringprep and unicodedata is what getaddrinfo loads for a str host name). socket's own imports (enum, functools,
# collections, selectors) are the price of TCP through a public module.
HEAVY = {"argparse", "json", "re", "concurrent", "dataclasses", "logging", "urllib", "typing", "random", "ssl",
         "encodings.idna", "stringprep", "unicodedata", "ipaddress", "_infer"}  # fmt: skip


def imported_modules(*args: str, script: Path = FOLDER / "health.py") -> tuple[int, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-I", "-S", str(script), *args], capture_output=True, text=True
    )
    return proc.returncode, importtime_names(proc.stderr)


def importtime_names(stderr: str) -> set[str]:
    """The modules a ``-X importtime`` run imported."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


# --- the start-up shortcuts against the standard library -------------------------------------

TOKENS = ["--url", "--triton-url", "--models", "--ignore", "--smoke", "--no-smoke", "--deadline", "--jobs", "--json",
          "--quiet", "--expect-gpu", "--min-cuda", "--min-gpus", "--timeout", "--dev-dir", "--nvidia-smi",
          "--triton-url=http://h:1", "--smoke=add", "--json=1", "--deadline=", "--dead", "--smo", "add", "a/1", "all",
          "4", "-1", "-", "", "x y", "--", "-x", "--nope", "http://h:8000"]  # fmt: skip


@pytest.mark.parametrize("flags", [probe.FLAGS, startup_check.FLAGS], ids=["health", "startup_check"])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.lists(st.sampled_from(TOKENS), max_size=6))
def test_fast_reader_agrees_with_argparse(flags, argv) -> None:
    fast = _cli.read_plain(flags, argv)
    if fast is None:
        return  # argparse reads it; nothing to compare
    slow = vars(_cli.argparse_parser(flags, "prog", "").parse_args(argv))
    assert fast == slow, argv


def test_fast_reader_takes_the_usual_command_lines() -> None:
    for argv in ([], ["--deadline", "4"], ["--triton-url", "http://localhost:8000", "--quiet", "--smoke"],
                 ["--models", "add,text/2", "--ignore=x", "--json", "--smoke", "add"]):  # fmt: skip
        assert _cli.read_plain(probe.FLAGS, argv) is not None, argv
    for argv in (["--help"], ["--dead", "4"], ["--triton-url"], ["--deadline", "-1"], ["stray"]):
        assert _cli.read_plain(probe.FLAGS, argv) is None, argv


def test_help_and_usage_errors_come_from_argparse(capsys: pytest.CaptureFixture) -> None:
    assert probe.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: health.py [-h] [--triton-url URL]") and "[env: HEALTH_SMOKE]" in out
    assert "--url" not in out  # its former name, still accepted (adopted task definitions), is not shown
    assert probe.main(["--deadline"]) == 2
    err = capsys.readouterr().err  # one usage line, the error, where to read more (tests/unit/test_cli_rules.py)
    assert err == (
        "usage: health.py [OPTIONS]\nhealth.py: error: argument --deadline: expected one argument\n"
        "try 'health.py --help'\n"
    )
    assert probe.options(["--url", "http://h:1"], {}).url == "http://h:1"
    assert startup_check.main(["--bogus"], {}) == 2  # one line, no usage block
    assert capsys.readouterr().err == "startup_check.py: error: unrecognized arguments: --bogus\n"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def same_outcome(ours, theirs, arg) -> None:
    try:
        expected = ("ok", theirs(arg))
    except ValueError:
        expected = ("ValueError",)
    try:
        got = ("ok", ours(arg))
    except ValueError:
        got = ("ValueError",)
    assert repr(got) == repr(expected), arg


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES, indent=st.sampled_from([None, 0, 2]), pad=st.sampled_from(["", " ", "\n\t ", "\r\n"]))
def test_loads_matches_json_loads(value, indent, pad) -> None:
    text = pad + json.dumps(value, indent=indent, ensure_ascii=False) + pad
    assert _jsonparse.loads(text) == json.loads(text)
    same_outcome(_jsonparse.loads, json.loads, text.encode())
    same_outcome(_jsonparse.loads, json.loads, text + " x")
    same_outcome(_jsonparse.loads, json.loads, json.dumps(value, ensure_ascii=True))


@settings(max_examples=300, deadline=None)
@given(data=st.text(alphabet='{}[]",:0123456789.eE-+ tfalsenurNIinity\\\x00\n', max_size=20))
def test_loads_fails_where_json_loads_fails(data) -> None:
    same_outcome(_jsonparse.loads, json.loads, data)
    same_outcome(_jsonparse.loads, json.loads, data.encode())


@settings(max_examples=300, deadline=None)
@given(data=st.text(alphabet='"\\u0123456789abcdefABCDEFxDd\x01\x1f\x7f é/bfnrt', max_size=16))
def test_strings_and_escapes_match_json_loads(data) -> None:
    """Escapes, surrogate pairs (joined or lone), control characters: decoded or refused as json.loads does."""
    same_outcome(lambda d: repr(_jsonparse.loads(d)), lambda d: repr(json.loads(d)), f'"{data}"')
    same_outcome(lambda d: repr(_jsonparse.loads(d)), lambda d: repr(json.loads(d)), f'["{data}", 1]')


def test_loads_edge_cases() -> None:
    for data in ("NaN", "[-Infinity, Infinity]", '"\\ud800"', '"\\ud83d\\ude00"', '"\\ud83d\\u0041"',
                 '"\\ud83d\\uZZZZ"', "\ufeff[]", "", "  ", "1 2", "-", "-x", "01", "1.", "1e", "1e+", "1.5E-3", "-0",
                 "[1,]", '{"a":1,}', '{"a":1,"a":2}', "[[]]", '{"":{}}', "\u00a0[]", b"\xef\xbb\xbf[1]",
                 "[1]".encode("utf-16"), "[1]".encode("utf-32-le"), b'"\xff"', "1" * 5000):  # fmt: skip
        same_outcome(lambda d: repr(_jsonparse.loads(d)), lambda d: repr(json.loads(d)), data)
    assert math.isnan(_jsonparse.loads("NaN"))  # type: ignore[arg-type]
    assert _http.loads is not json.loads and _http.loads("[1]") == [1]


@pytest.mark.parametrize("pad", [0, _jsonparse.PLAIN_MAX], ids=["plain-python", "json.loads"])
def test_loads_bounds_nesting_where_json_loads_does_not(pad: int) -> None:
    """The same bound on both paths: plain Python for short documents, json.loads for long ones."""
    limit, spaces = _jsonparse.MAX_DEPTH, " " * pad
    for text in ("[" * limit + "]" * limit, '{"a":' * limit + "1" + "}" * limit,
                 '{"a":' * (limit - 2) + "[[]]" + "}" * (limit - 2)):  # fmt: skip
        assert _jsonparse.loads(text + spaces) == json.loads(text)
    for text in ("[" * (limit + 1) + "]" * (limit + 1), '{"a":' * (limit + 1) + "1" + "}" * (limit + 1),
                 '{"a":' * (limit - 1) + "[[]]" + "}" * (limit - 1), "[" * 100_000 + "]" * 100_000,
                 "[" * 100_000, '{"a":[' * 50_000):  # fmt: skip
        with pytest.raises(_jsonparse.TooDeep, match=f"nested deeper than {limit} levels"):
            _jsonparse.loads(text + spaces)
    with pytest.raises(RecursionError):
        json.loads("[" * 100_000 + "]" * 100_000)  # what the bound is for
    assert _jsonparse.loads("[[1]]" + spaces, max_depth=2) == [[1]]
    assert gc.isenabled()  # json.loads runs with the collector off, and it is back on


def test_loads_bounds_the_forms_only_json_loads_reads() -> None:
    """UTF-16 and a byte-order mark go to json.loads, held to the same bound."""
    limit = _jsonparse.MAX_DEPTH
    deepest = "[" * limit + "]" * limit
    assert _jsonparse.loads(deepest.encode("utf-16")) == json.loads(deepest)
    for text in ("[" * (limit + 1) + "]" * (limit + 1), "[" * 100_000 + "]" * 100_000):
        with pytest.raises(_jsonparse.TooDeep):
            _jsonparse.loads(text.encode("utf-16"))


def test_long_documents_read_the_same_on_both_paths() -> None:
    """A long index (json.loads reads it) and the same read in plain Python: equal, and equal to json.loads."""
    index = [{"name": f"model_{i}", "version": "1", "state": "READY", "reason": "é\n\"x\"" * (i % 3)}
             for i in range(3000)]  # fmt: skip
    text = json.dumps(index, ensure_ascii=False)
    assert len(text) > _jsonparse.PLAIN_MAX
    assert _jsonparse.loads(text) == _jsonparse._parse(text, _jsonparse.MAX_DEPTH) == json.loads(text)
    assert _jsonparse.loads(text.encode()) == index
    for broken in (text[:-1], text + "x", text.replace('"version"', "'version'", 1)):
        same_outcome(_jsonparse.loads, json.loads, broken)


def reference_split(url: str):
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "", None, None, ""
    return parts.scheme, parts.hostname, parts.port, parts.path


@settings(max_examples=600, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https", "HTTP", "ftp", "http:", ""]),
    rest=st.text(alphabet="aZ09.-_:/[]@%?#\\ \té", max_size=16),
)
def test_split_url_matches_urlsplit(scheme, rest) -> None:
    url = f"{scheme}://{rest}"
    same_outcome(_http.split_url, reference_split, url)


def test_split_url_reads_the_usual_urls_itself() -> None:
    for url, expected in [("http://localhost:8000", ("http", "localhost", 8000, "")),
                          ("HTTP://Triton.Local:8000/prefix/", ("http", "triton.local", 8000, "/prefix/")),
                          ("https://10.0.0.7", ("https", "10.0.0.7", None, ""))]:  # fmt: skip
        assert _http.split_url(url) == expected == reference_split(url)
    assert _http.split_url("http://[::1]:8000/x") == ("http", "::1", 8000, "/x")  # via urlsplit
    with pytest.raises(ValueError, match="out of range"):
        _http.split_url("http://h:65536")


def test_run_parallel_keeps_order_limits_concurrency_and_raises_the_first_error() -> None:
    lock = threading.Lock()
    active = [0, 0]  # now, most seen
    ran: list[int] = []

    def call(i: int) -> list[int]:
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        time.sleep(0.03)
        with lock:
            active[0] -= 1
            ran.append(i)
        if i in (3, 1):
            raise RuntimeError(f"call {i}")
        return [i]

    assert probe.run_parallel(call, [0, 2, 4, 5, 6], 2) == [[0], [2], [4], [5], [6]]
    assert active[1] == 2
    ran.clear()
    with pytest.raises(RuntimeError, match="call 1"):
        probe.run_parallel(call, list(range(6)), 3)
    assert sorted(ran) == list(range(6))  # every call ran, as ThreadPoolExecutor.map does
    assert probe.run_parallel(call, [0], 4) == [[0]]


# --- answers a real Triton never gives ----------------------------------------------------------

CHUNKED = {"Transfer-Encoding": "chunked"}


def json_answer(body: bytes, status: int = 200) -> bytes:
    return fakes.head(status, "application/json", len(body)) + body


def routes(answers: Mapping[str, bytes]) -> fakes.Behaviour:
    """A loopback "Triton" answering raw bytes by "METHOD path": live answers 200 unless ``answers`` say
    otherwise, anything else 404."""
    table = {"GET /v2/health/live": fakes.head(200, "application/json", 0), **answers}

    def run(server: fakes.FakeHttp, conn: socket.socket, req: fakes.Request) -> None:
        server.send(conn, table.get(f"{req.method} {req.path}", json_answer(b'{"error":"not found"}', 404)))

    return run


# --- https ------------------------------------------------------------------------------------


class _Live(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"{}"
        self.send_response(200 if self.path == "/v2/health/live" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = b"[]"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_https_url_is_verified_and_read(tmp_path: Path) -> None:
    """TLS over the probe's own socket: the certificate is checked against the system trust store."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Live)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://localhost:{server.server_address[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEALTH_", "TRITON_URL", "SSL_CERT"))}

    def run(extra: dict[str, str]) -> subprocess.CompletedProcess:
        command = [sys.executable, "-I", "-S", str(FOLDER / "health.py"), "--triton-url", url]
        return subprocess.run(command, capture_output=True, text=True, env={**env, **extra}, timeout=30)

    try:
        untrusted = run({})
        assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stdout, untrusted.stdout
        trusted = run({"SSL_CERT_FILE": str(cert)})
        # live answered over TLS, then the (empty) index: the probe read both
        assert trusted.returncode == 1 and "FAIL index: no model version to check" in trusted.stdout, trusted.stdout
    finally:
        server.shutdown()
        server.server_close()


# --- packaging ---------------------------------------------------------------------------------


def test_python_m_exporter_health_runs_the_probe() -> None:
    proc = subprocess.run([sys.executable, "-m", "exporter", "health", "--help"], capture_output=True, text=True,
                          cwd=ROOT / "tests")  # fmt: skip
    assert proc.returncode == 0 and "HEALTH_DEADLINE" in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "exporter", "health", "--triton-url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, cwd=ROOT / "tests")  # fmt: skip
    assert proc.returncode == 1 and proc.stdout.startswith("FAIL live: cannot connect to 127.0.0.1:9"), proc.stdout


def test_scripts_run_from_a_copied_folder_isolated(tmp_path: Path) -> None:
    """As in the Triton image: /opt/triton-health/*.py run by path, -I -S, from an unrelated directory."""
    folder = install_copy(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in FILES)
    for script, needle in (("health.py", "HEALTH_DEADLINE"), ("startup_check.py", "STARTUP_EXPECT_GPU")):
        proc = subprocess.run([sys.executable, "-I", "-S", str(folder / script), "--help"], cwd=tmp_path,
                              capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == 0 and needle in proc.stdout, proc.stderr
    probe_run = subprocess.run([sys.executable, "-I", "-S", str(folder / "health.py"), "--triton-url", "http://127.0.0.1:9"],
                               cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert probe_run.returncode == 1 and "cannot connect" in probe_run.stdout
