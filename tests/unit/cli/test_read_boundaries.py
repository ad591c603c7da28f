"""Files and folders we read or write as boundaries: the catalog loader, render's output folder, model sync's
manifest (and its command). Findings 9-11 of issue 26 and the manifest command of issue 31."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from catalog import CatalogError, build
from catalog.load import MAX_CATALOG_BYTES, MAX_TOML_DEPTH, read_paths
from modelsync.archive import Limits
from modelsync.errors import UnsafeArchive
from modelsync.manifest import parse
from tests.support.paths import REPO

ROOT = REPO
H = "a" * 64


def run(*args: str, timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, input=stdin
    )


def one_clear_line(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# --- 9. the catalog loader: nesting, size, regular files only -------------------------------------------------


def test_a_catalog_nested_900_deep_is_one_clear_error_not_a_recursion_traceback(tmp_path: Path) -> None:
    """Finding 9: a TOML nested 900 deep printed a RecursionError traceback (exit 1)."""
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 900 + "]" * 900 + "\n")
    line = one_clear_line(run("-m", "exporter", "catalog", "--catalog", str(deep)))
    assert (
        line.startswith("exporter catalog: error: invalid catalog:")
        and "deep.toml" in line
        and f"{MAX_TOML_DEPTH}" in line
    )
    inline = tmp_path / "inline.toml"
    inline.write_text("x = " + "{a = " * 200 + "1" + "}" * 200 + "\n")
    with pytest.raises(CatalogError, match="nested"):
        build([inline])


def test_brackets_inside_strings_and_comments_are_not_nesting(tmp_path: Path) -> None:
    ok = tmp_path / "ok.toml"
    ok.write_text(
        "# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n"
        "[families]\n"
        f'a_total = {{ type = "counter", help = "{"[" * 100}" }}\n'
        f"b_total = {{ type = \"counter\", help = '''{'{' * 100}\n''' }}\n"
        f'c_total = {{ type = "counter", help = """\\"{"[" * 100}""" }}\n'
    )
    assert len(build([ok]).families) > 3


def test_a_catalog_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    """Finding 9: ``--catalog /dev/zero`` grew to 4 GB; a FIFO hung."""
    line = one_clear_line(run("-m", "exporter", "catalog", "--catalog", "/dev/zero", timeout=30))
    assert "/dev/zero" in line and "not a regular file" in line
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    line = one_clear_line(run("-m", "exporter", "catalog", "--catalog", str(fifo), timeout=30))
    assert "not a regular file" in line
    with pytest.raises(CatalogError, match="not a regular file"):
        read_paths([tmp_path])  # a directory


def test_a_catalog_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * MAX_CATALOG_BYTES + "\n")
    with pytest.raises(CatalogError, match=f"larger than {MAX_CATALOG_BYTES}"):
        read_paths([big])
    small = tmp_path / "small.toml"
    small.write_text("# fine\n")
    assert read_paths([small]) == [(str(small), "# fine\n")]


def test_a_fifo_catalog_is_refused_even_while_a_writer_holds_it(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    done = threading.Event()

    def writer() -> None:
        with open(fifo, "w") as f:  # blocks until the loader opens it, if it ever does
            done.wait(10)
            f.write("x = 1\n")

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        with pytest.raises(CatalogError, match="not a regular file"):
            read_paths([fifo])
    finally:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that the writer can finish
        done.set()
        t.join(10)
        os.close(fd)


# --- 10. render's output folder ----------------------------------------------------------------------------


def test_render_into_a_folder_it_cannot_write_is_one_clear_error() -> None:
    """Finding 10: ``render --out /proc/nope`` printed a traceback (exit 1)."""
    for command in (("-m", "render"), ("-m", "exporter", "render")):
        line = one_clear_line(run(*command, "--out", "/proc/nope"))
        assert line.startswith(f"{' '.join(command[1:])}: error: ") and "/proc/nope" in line


def test_render_into_a_file_is_one_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("x")
    line = one_clear_line(run("-m", "render", "--out", str(target)))
    assert str(target) in line and "not a folder" in line


# --- 11. manifests: deep nesting, path components longer than a file system allows ------------------------

LIMITS = Limits(max_entries=10, max_bytes=10_000, max_ratio=100)


def doc(*entries: dict[str, object], extra: str = "") -> bytes:
    base = [{"path": "config.pbtxt", "size": 10, "sha256": H}, {"path": "1/model.py", "size": 10, "sha256": H}]
    return json.dumps({"files": [*base, *entries]}).encode()


def test_a_deeply_nested_manifest_is_refused_as_unsafe() -> None:
    """Finding 11: a manifest nested deeply raised RecursionError: reported as an unexpected error, retried."""
    for data in (
        b'{"files": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"files": [], "x": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        b"[" * 5_000 + b"]" * 5_000,
    ):
        with pytest.raises(UnsafeArchive, match="nested"):
            parse(data, LIMITS)


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("1/" + "w" * 5_000, "longer than 255 bytes"),
        ("1/" + "é" * 128, "longer than 255 bytes"),  # 256 bytes in UTF-8
        ("1/" + "/".join(["d" * 200] * 25), "longer than 4095 bytes"),
    ],
)
def test_paths_a_file_system_cannot_hold_are_refused_at_check_time(path: str, needle: str) -> None:
    """Finding 11: a path component of 5,000 characters passed the checks and failed only when written."""
    with pytest.raises(UnsafeArchive, match=needle):
        parse(doc({"path": path, "size": 1, "sha256": H}), LIMITS)
    assert parse(doc({"path": "1/" + "w" * 255, "size": 1, "sha256": H}), LIMITS).files[-1].path.name == "w" * 255


def test_a_zip_entry_with_a_component_too_long_is_refused_too() -> None:
    from modelsync.archive import relative_parts

    with pytest.raises(UnsafeArchive, match="longer than 255 bytes"):
        relative_parts("m/1/" + "x" * 256, "entry")


# --- issue 31: the manifest command speaks plainly ------------------------------------------------------------


def test_the_manifest_command_has_help() -> None:
    proc = run("-m", "modelsync.manifest", "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    assert "usage:" in proc.stdout and "MODEL_DIR" in proc.stdout and "config.pbtxt" in proc.stdout


def test_the_manifest_command_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('backend: "python"\n')
    for i in range(3000):
        (model / "1" / f"f{i:04d}.bin").write_bytes(b"x")
    proc = subprocess.run(
        f"{sys.executable} -m modelsync.manifest {model} | head -1",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip() == "{" and proc.stderr == "", proc.stderr[-2000:]


def test_the_manifest_command_says_plainly_when_config_pbtxt_is_missing(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text("")
    line = one_clear_line(run("-m", "modelsync.manifest", str(model)))
    assert f"{model} has no config.pbtxt" in line and "manifest.json lists" not in line


def test_a_config_pbtxt_nested_deeply_is_refused_not_a_recursion_error() -> None:
    """A bundle's config.pbtxt is read from S3 like a manifest; its parser recurses per message."""
    from modelsync import pbtxt

    def nested(levels: int) -> str:  # the top level is one of them
        return "a { " * (levels - 1) + "c: 1" + " }" * (levels - 1)

    with pytest.raises(pbtxt.PbtxtError, match="nested deeper than"):
        pbtxt.parse(nested(5_000))
    with pytest.raises(pbtxt.PbtxtError, match="nested deeper than"):
        pbtxt.parse(nested(pbtxt.MAX_DEPTH + 1))
    assert pbtxt.parse(nested(pbtxt.MAX_DEPTH)).get("a")


# --- stderr: no raw traceback from a command, whatever fails -----------------------------------------------

UNEXPECTED = r"""
import sys
which = sys.argv[1]
if which == "render":
    import render, render.__main__ as entry
    def boom(opts): raise RuntimeError("a bug in render")
    render.render = boom
    sys.exit(entry.main([]))
if which == "exporter":
    import exporter.__main__ as entry
    def boom(argv, env): raise RuntimeError("a bug before logging is set up")
    entry.load = boom
    sys.exit(entry.main([]))
if which == "modelsync":
    import modelsync.__main__ as entry
    def boom(argv, env, **kw): raise RuntimeError("a bug in model sync")
    entry.load = boom
    sys.exit(entry.main([]))
"""


@pytest.mark.parametrize("command", ["render", "exporter", "modelsync"])
def test_an_unexpected_exception_in_a_command_is_one_json_line_not_a_raw_traceback(command: str) -> None:
    proc = run("-c", UNEXPECTED, command)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    entry = json.loads(lines[0])
    assert entry["level"] == "critical" and "RuntimeError: a bug" in entry["exception"]
