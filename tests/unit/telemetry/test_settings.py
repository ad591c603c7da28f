"""One settings rule (telemetry/settings.py) for both daemons and every command.

The unit tests pin the rule (flag over variables, variables in order, an
empty variable is unset, a bad value names where it came from); the
subprocess matrix proves every entry point refuses the same bad values the
same way, with exit 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys

import pytest

from telemetry.settings import (
    ConfigError,
    Option,
    add_options,
    boolean,
    choice,
    http_url,
    parse,
    positive,
    shown_size,
    size,
)
from tests.support.paths import REPO

ROOT = REPO

TABLE = (
    Option("url", "--url", ("A_URL", "B_URL"), http_url, "where"),
    Option("interval", "--interval", ("INTERVAL",), positive, "seconds"),
    Option("paths", "--path", ("PATHS",), str, "files", repeatable=True),
    Option("flag", "--flag", ("FLAG",), boolean, "on or off", boolean=True),
    Option("select", "--select", ("SELECT",), str, "globs", dash_value=True),
    Option("mode", "--mode", ("MODE",), choice("on", "off"), "the mode"),
)


def read(argv: list[str], environ: dict[str, str]) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="t")
    add_options(parser, TABLE)
    return parse(parser, TABLE, argv, environ)[1]


def test_a_flag_wins_over_the_variables_and_the_first_set_variable_over_the_next() -> None:
    env = {"A_URL": "http://a:1/", "B_URL": "http://b:2", "INTERVAL": "5"}
    assert read([], env) == {"url": "http://a:1", "interval": 5.0}
    assert read([], {**env, "A_URL": ""})["url"] == "http://b:2"  # an empty variable is unset
    assert read(["--url", "http://c:3"], env)["url"] == "http://c:3"
    assert read([], {}) == {}  # nothing set: the caller's defaults apply


def test_repeatable_booleans_and_values_that_start_with_a_dash() -> None:
    sep = os.pathsep
    assert read([], {"PATHS": f"a{sep}{sep}b"})["paths"] == ("a", "b")
    assert read(["--path", "x", "--path", "y"], {"PATHS": "a"})["paths"] == ("x", "y")
    assert read(["--no-flag"], {"FLAG": "yes"})["flag"] is False
    assert read([], {"FLAG": "yes"})["flag"] is True
    assert read(["--select", "-A*,-B*"], {})["select"] == "-A*,-B*"
    assert read(["--mode", "ON"], {})["mode"] == "on"


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        ([], {"MODE": "yes"}, "MODE: invalid choice: 'yes' (choose from on, off)"),
        (["--mode", "yes"], {}, "--mode: invalid choice: 'yes' (choose from on, off)"),
        ([], {"FLAG": "maybe"}, "FLAG='maybe': must be true or false"),
        (["--interval", "nan"], {}, "--interval='nan': must be a positive number"),
        ([], {"B_URL": "ftp://x"}, "B_URL='ftp://x': must be an http:// or https:// URL"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_its_origin(argv: list[str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        read(argv, env)
    assert needle in str(info.value)


def test_sizes_read_and_print_the_same_way() -> None:
    assert size("10GiB") == 10 * 1024**3 == size(shown_size(10 * 1024**3))
    assert shown_size(1000) == "1000"
    with pytest.raises(ValueError):
        size("ten")


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTER_", "MODELSYNC_", "HEALTH_"))}
    return subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60, env={**clean, **env}
    )


COMMANDS = {
    "daemon": ["exporter", "--once", "--interval", "1"],
    "catalog": ["exporter", "catalog"],
    "cost": ["exporter", "cost", "--models", "2"],
    "render": ["exporter", "render", "--check"],
    "render-itself": ["render", "--check"],  # the generator's own entry; the two above are its aliases
    "render-cost": ["render", "cost", "--models", "2"],
}
SHARED_BAD = [
    ({"EXPORTER_LLM_METRICS": "yes"}, [], "EXPORTER_LLM_METRICS: invalid choice: 'yes' (choose from on, off)"),
    ({}, ["--llm-metrics", "maybe"], "--llm-metrics: invalid choice: 'maybe' (choose from on, off)"),
    ({}, ["--metrics", " "], "--metrics=' ': needs comma-separated patterns"),
    ({}, ["--catalog", ""], "--catalog='': needs a catalog file path"),
    ({"EXPORTER_METRICS": "Nope*"}, [], "pattern 'Nope*' matches no metric"),
]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("env", "flags", "needle"), SHARED_BAD)
def test_every_command_refuses_the_same_bad_catalog_settings_with_exit_2(
    command: str, env: dict[str, str], flags: list[str], needle: str
) -> None:
    proc = run([*COMMANDS[command], *flags], env)
    assert proc.returncode == 2, (proc.stdout[-300:], proc.stderr[-300:])
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
    name = " ".join(w for w in COMMANDS[command][:2] if not w.startswith("-"))  # exporter, exporter catalog...
    assert proc.stderr.startswith(f"{name}: error: invalid "), proc.stderr


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["exporter", "--once", "--interval", "0"], {}, "--interval='0': must be a positive number"),
        (["exporter", "--once"], {"EXPORTER_NVML": "sometimes"}, "EXPORTER_NVML: invalid choice: 'sometimes'"),
        (["exporter", "cost", "--models", "-1"], {}, "--models='-1': must be at least 0"),
        (
            ["exporter", "render", "--check", "--latency-slo-ms", "fast"],
            {},
            "--latency-slo-ms='fast': must be a number",
        ),
        (["modelsync", "--bucket", "models", "--interval", "0"], {}, "--interval='0': must be a positive number"),
        (["modelsync", "--bucket", "models"], {"MODELSYNC_DELETE_REMOVED": "maybe"}, "must be true or false"),
        (["modelsync.health"], {"MODELSYNC_BUCKET": "models", "MODELSYNC_INTERVAL": "-3"}, "MODELSYNC_INTERVAL='-3'"),
    ],
)
def test_the_daemons_and_commands_refuse_their_own_bad_values_with_exit_2(
    argv: list[str], env: dict[str, str], needle: str
) -> None:
    proc = run(argv, env)
    assert proc.returncode == 2, (proc.stdout[-300:], proc.stderr[-300:])
    assert needle in proc.stderr, proc.stderr


def test_health_the_one_exception_refuses_bad_values_with_exit_2_too() -> None:
    """The Triton-side probe is standard library only and copied alone into the Triton image, so it cannot
    import telemetry/: it keeps its own small flag parser (triton_side/_cli.py), held to the same rule here."""
    for argv, env in ((["--deadline", "soon"], {}), ([], {"HEALTH_JOBS": "0"}), (["--triton-url", "ftp://x"], {})):
        proc = run(["exporter", "health", *argv], env)
        assert proc.returncode == 2, (argv, env, proc.stderr)


def test_only_the_settings_module_parses_command_lines() -> None:
    """Every entry point goes through telemetry.settings.parse (the probe aside, see above)."""
    offenders = []
    for package in ("telemetry", "catalog", "exporter", "modelsync"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "telemetry" / "settings.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in ("parse_args", "parse_known_args"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
