"""Every command's ``--help``, rendered as a user runs it: exit 0, its own name, every option explained, no word
broken across lines, no ``%%``.

Each command runs in a fresh interpreter (``python -m ...`` through runpy, as ``-m`` does), once per terminal
width: the text at 60 and 80 columns must hold the very words of the text at 1000 columns, where nothing wraps,
so a URL or a hyphenated name (``triton-server``) split at a line end shows up as a missing word.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from exporter.__main__ import COMMANDS
from telemetry.settings import HelpFormatter
from tests.support.helptext import entries
from tests.support.paths import REPO

ROOT = REPO
WIDE = 1000
NARROW = (60, 80)

# Runs one command's --help at each width in one interpreter; prints {width: [exit code, stdout, stderr]}.
DRIVER = r"""
import contextlib, io, json, os, runpy, sys
target, widths, args = sys.argv[1], [int(w) for w in sys.argv[2].split(",")], sys.argv[3:]
out = {}
for width in widths:
    os.environ["COLUMNS"] = str(width)
    sys.argv = [target, *args, "--help"]
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            if target.endswith(".py"):
                runpy.run_path(target, run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out[width] = [code, stdout.getvalue(), stderr.getvalue()]
sys.__stdout__.write(json.dumps(out))
"""

# (what is run: a module or a script, its arguments, the name its usage line must show)
EXPORTER_SUBCOMMANDS = sorted({"catalog", "validate", *COMMANDS})  # every command `python -m exporter` dispatches
CASES = [
    ("exporter", (), "python -m exporter"),
    *[("exporter", (c,), f"python -m exporter {c}") for c in EXPORTER_SUBCOMMANDS],
    ("render", (), "python -m render"),
    ("render", ("cost",), "python -m render cost"),
    ("modelsync", (), "python -m modelsync"),
    ("modelsync.health", (), "python -m modelsync.health"),
    ("modelsync.manifest", (), "python -m modelsync.manifest"),
    ("triton_side/health.py", (), "health.py"),  # the Triton container's probe, run as a script there
    ("triton_side/startup_check.py", (), "startup_check.py"),
]


def render_help(target: str, args: tuple[str, ...]) -> dict[int, tuple[int, str, str]]:
    widths = ",".join(str(w) for w in (WIDE, *NARROW))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, target, widths, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {int(w): (code, out, err) for w, (code, out, err) in json.loads(proc.stdout).items()}


def unexplained(text: str) -> list[str]:
    """Options whose help says nothing but a default or a variable name."""
    bare = []
    for invocation, help_text in entries(text).items():
        words = re.sub(r"\(default:?[^)]*\)|\[env:[^\]]*\]|\[[A-Z_]+\]", "", help_text)
        if not re.search(r"[a-zA-Z]", words):
            bare.append(invocation)
    return bare


def broken_words(narrow: str, wide: str) -> list[str]:
    """Words of the unwrapped text that the wrapped one does not hold whole (split at a line end)."""
    missing = Counter(wide.split()) - Counter(narrow.split())
    return sorted(missing)


@pytest.mark.parametrize(("target", "args", "prog"), CASES)
def test_help(target: str, args: tuple[str, ...], prog: str) -> None:
    shown = render_help(target, args)
    code, wide, err = shown[WIDE]
    assert code == 0, (code, err[-500:])
    assert wide.startswith(f"usage: {prog} ") or wide.startswith(f"usage: {prog}\n"), wide.splitlines()[0]
    assert "%%" not in wide and "%(" not in wide
    found = entries(wide)
    assert "-h, --help" in found, wide[:2000]  # the options section was read
    assert unexplained(wide) == []
    for width in NARROW:
        code, narrow, err = shown[width]
        assert code == 0, (width, err[-500:])
        assert (width, broken_words(narrow, wide)) == (width, [])  # at that many columns, no word split


# --- the checks catch what they look for ------------------------------------------------------------------


def _help_of(parser: argparse.ArgumentParser, width: int) -> str:
    os.environ["COLUMNS"] = str(width)
    try:
        return parser.format_help()
    finally:
        del os.environ["COLUMNS"]


def _parser(formatter: type[argparse.HelpFormatter]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="demo", formatter_class=formatter)
    p.add_argument(
        "--to",
        help="forward here: otlp+https://monitoring.REGION.amazonaws.com/v1/metrics (default: triton-server)",
    )
    p.add_argument("--dashboard-name", help="(default: Triton)")
    p.add_argument("--region", help="region [HEALTH_REGION] (default us-east-1)")
    return p


def test_the_checks_find_a_bare_option_and_a_split_word() -> None:
    """argparse's own formatter splits the URL and ``triton-server``; an option with only its default is bare."""
    plain = _parser(argparse.HelpFormatter)
    wide = _help_of(plain, WIDE)
    assert unexplained(wide) == ["--dashboard-name DASHBOARD_NAME"]
    assert "otlp+https://monitoring.REGION.amazonaws.com/v1/metrics" in broken_words(_help_of(plain, 60), wide)
    assert any("triton-server)" in broken_words(_help_of(plain, w), wide) for w in range(40, 100))
    assert any("us-east-1)" in broken_words(_help_of(plain, w), wide) for w in range(40, 100))


def test_the_help_formatter_wraps_between_words_only() -> None:
    ours = _parser(HelpFormatter)
    wide = _help_of(ours, WIDE)
    for width in (60, 64, 72, 80):
        narrow = _help_of(ours, width)
        assert broken_words(narrow, wide) == [], narrow
        assert max(len(line) for line in narrow.splitlines() if "otlp+" not in line) <= width
