"""One set of command-line rules for every command (issue 38; telemetry/settings.py states them).

Every command, run as a user runs it (``python -m ...``, through runpy in a fresh interpreter), is held to:

- no abbreviated flag: ``--interva 0`` is not ``--interval 0``;
- an unknown flag or subcommand is one usage line, ``<command>: error: ...`` and ``try '<prog> --help'``
  (not argparse's whole usage block), exit 2; an invalid choice is named as such;
- the subcommands it dispatches are listed in its ``--help``;
- one error prefix, ``<command>: error:``, for argparse's errors and the command's own (a bad setting, a file
  it cannot read), exit 2;
- placeholders that say what the value is: a choice shows its choices (``--nvml {auto,on,off}``), a path
  FILE or DIR, a URL URL, seconds SECONDS; never the setting's name in capitals (``--nvml NVML``);
- one help style: ``... (default: X) [env: VAR]`` at the end of an option's help, where they apply;
- one flag name per setting: a variable read by several commands is set by the same flag in each.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from telemetry.settings import Option
from tests.support.helptext import entries
from tests.support.paths import REPO

# Runs a command line after another in one interpreter, each as ``python -m MODULE ARGS`` does (runpy);
# prints [[exit code, stdout, stderr], ...].
DRIVER = r"""
import contextlib, io, json, runpy, sys
module, runs = sys.argv[1], json.loads(sys.argv[2])
out = []
for args in runs:
    sys.argv = [module, *args]
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out.append([code, stdout.getvalue(), stderr.getvalue()])
sys.__stdout__.write(json.dumps(out))
"""


@dataclass(frozen=True)
class Command:
    """A command and the command lines that probe it (each one stops before any work)."""

    argv: tuple[str, ...]  # after python -m
    abbreviated: tuple[str, ...]  # a flag cut short, with a value the whole flag refuses: taken, it stops too
    own_error: tuple[str, ...]  # a command line the command refuses itself (argparse reads it fine)
    choice: tuple[str, str] | None = None  # a choice setting: its flag and its variable ("" when none)
    subcommands: tuple[str, ...] = ()  # what --help must list
    dispatched: bool = False  # the subcommands are commands of their own (each with --help)
    late_command: tuple[str, ...] = ()  # a subcommand after an option: refused, it would be read as nothing

    @property
    def prog(self) -> str:
        return "python -m " + " ".join(self.argv)

    @property
    def name(self) -> str:
        """What its errors start with."""
        return " ".join(self.argv)


def _exporter_subcommands() -> tuple[str, ...]:
    from exporter.__main__ import COMMANDS

    return ("catalog", "validate", *COMMANDS)  # every command main() dispatches


def _cost(*argv: str) -> Command:
    return Command(argv, abbreviated=("--tas", "0"), own_error=("--models", "-1"), choice=("--llm-backend", ""))


def _render(*argv: str, **more: object) -> Command:
    return Command(
        argv,
        abbreviated=("--latency-slo", "x"),
        own_error=("--latency-slo-ms", "x"),
        choice=("--llm-metrics", "EXPORTER_LLM_METRICS"),
        **more,  # type: ignore[arg-type]
    )


COMMANDS = {
    "exporter": Command(
        ("exporter",),
        abbreviated=("--interva", "0"),
        own_error=("--interval", "0"),
        choice=("--nvml", "EXPORTER_NVML"),
        subcommands=_exporter_subcommands(),
        dispatched=True,
        late_command=("--once", "catalog"),
    ),
    "exporter catalog": Command(
        ("exporter", "catalog"),
        abbreviated=("--llm-metric", "x"),
        own_error=("--metrics", "Nope*"),
        choice=("--llm-metrics", "EXPORTER_LLM_METRICS"),
    ),
    "exporter validate": Command(("exporter", "validate"), abbreviated=("--hel",), own_error=("/nonexistent/emf",)),
    "exporter health": Command(("exporter", "health"), abbreviated=("--dead", "0"), own_error=("--deadline", "0")),
    "exporter render": _render("exporter", "render"),
    "exporter cost": _cost("exporter", "cost"),
    "exporter adopt": Command(
        ("exporter", "adopt"),
        abbreviated=("--exporter-imag", "x", "-"),
        own_error=("/nonexistent/taskdef.json",),
        choice=("--logs", ""),
    ),
    "render": _render("render", subcommands=("cost",), dispatched=True, late_command=("--check", "cost")),
    "render cost": _cost("render", "cost"),
    "modelsync": Command(
        ("modelsync",),
        abbreviated=("--interva", "0"),
        own_error=("--interval", "0"),
        choice=("--fanout", "MODELSYNC_FANOUT"),
        subcommands=("rollout",),
        dispatched=True,
        late_command=("--once", "rollout"),
    ),
    "modelsync rollout": Command(
        ("modelsync", "rollout"),
        abbreviated=("status", "--wai", "x"),
        own_error=("status",),  # no --bucket
        subcommands=("status", "promote", "reject"),
    ),
    "modelsync.manifest": Command(("modelsync.manifest",), abbreviated=("--hel",), own_error=("/nonexistent",)),
    "controller": Command(
        ("controller",),
        abbreviated=("--interva", "0"),
        own_error=("--interval", "0"),
        choice=("--rollouts", "CONTROLLER_ROLLOUTS"),
        subcommands=("run", "resume", "status"),
    ),
}
IDS = sorted(COMMANDS)
UNKNOWN = "--no-such-flag"
BOGUS = "bogus"


def _runs(c: Command) -> dict[str, list[str]]:
    runs = {
        "help": ["--help"],
        "unknown": [UNKNOWN],
        "abbreviated": list(c.abbreviated),
        "own_error": list(c.own_error),
    }
    if c.subcommands:
        runs["bogus_command"] = [BOGUS]
    if c.late_command:
        runs["late_command"] = list(c.late_command)
    if c.choice:
        runs["bad_choice"] = [c.choice[0], BOGUS] + (["-"] if c.name == "exporter adopt" else [])
    if c.dispatched:
        runs |= {f"help {sub}": [sub, "--help"] for sub in c.subcommands}
    return runs


@functools.cache
def results(command: str) -> dict[str, tuple[int, str, str]]:
    """Every probe of one command, run in one interpreter: name -> (exit code, stdout, stderr)."""
    c = COMMANDS[command]
    runs = _runs(c)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EXPORTER_", "MODELSYNC_", "CONTROLLER_", "HEALTH_", "TRITON_", "AWS_EMF_", "ECS_"))
        and k not in ("COLUMNS", "LINES")
    }
    env["COLUMNS"] = "1000"  # one line per option's help: the checks read whole texts
    prefix = list(c.argv[1:])
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, c.argv[0], json.dumps([[*prefix, *args] for args in runs.values()])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {name: (code, out, err) for name, (code, out, err) in zip(runs, json.loads(proc.stdout), strict=True)}


def env_results(command: str, variable: str, value: str) -> tuple[int, str, str]:
    """The command with one variable set (a bad choice from the environment)."""
    c = COMMANDS[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTER_", "MODELSYNC_", "CONTROLLER_"))}
    proc = subprocess.run(
        [sys.executable, "-m", *c.argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**env, variable: value},
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stdout, proc.stderr


def usage_error(c: Command, code: int, err: str) -> str:
    """The one error line of a usage error, after checking the three lines around it."""
    lines = err.splitlines()
    assert code == 2, (code, err[-1500:])
    assert len(lines) == 3, err[-1500:]  # not argparse's usage block
    assert lines[0].startswith(f"usage: {c.prog} ") or lines[0] == f"usage: {c.prog}", lines[0]
    assert lines[1].startswith(f"{c.name}: error: "), lines[1]
    assert lines[2] == f"try '{c.prog} --help'", lines[2]
    return lines[1]


def help_of(command: str) -> str:
    code, out, err = results(command)["help"]
    assert code == 0 and out.startswith(f"usage: {COMMANDS[command].prog}"), (code, out[:300], err[-500:])
    return out


# --- no abbreviations -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", IDS)
def test_an_abbreviated_flag_is_refused(command: str) -> None:
    c = COMMANDS[command]
    cut = next(a for a in c.abbreviated if a.startswith("--"))
    line = usage_error(c, *results(command)["abbreviated"][::2])
    assert line.startswith(f"{c.name}: error: unrecognized arguments: {cut}"), line


# --- an unknown flag or subcommand: one usage line, the error, try --help ---------------------------------------


@pytest.mark.parametrize("command", IDS)
def test_an_unknown_flag_is_one_usage_line_the_error_and_try_help(command: str) -> None:
    c = COMMANDS[command]
    code, _, err = results(command)["unknown"]
    assert usage_error(c, code, err) == f"{c.name}: error: unrecognized arguments: {UNKNOWN}"


@pytest.mark.parametrize("command", [c for c in IDS if COMMANDS[c].subcommands])
def test_an_unknown_subcommand_is_an_invalid_choice_named_as_such(command: str) -> None:
    c = COMMANDS[command]
    code, _, err = results(command)["bogus_command"]
    line = usage_error(c, code, err)
    assert f"invalid choice: '{BOGUS}' (choose from " in line, line
    assert all(f"'{sub}'" in line for sub in c.subcommands), line


@pytest.mark.parametrize("command", [c for c in IDS if COMMANDS[c].late_command])
def test_a_subcommand_after_an_option_is_a_usage_error(command: str) -> None:
    c = COMMANDS[command]
    code, _, err = results(command)["late_command"]
    line = usage_error(c, code, err)
    assert f"the command comes first: {c.prog} {c.late_command[-1]}" in line, line


@pytest.mark.parametrize("command", [c for c in IDS if COMMANDS[c].choice])
def test_an_invalid_choice_is_named_as_such(command: str) -> None:
    c = COMMANDS[command]
    assert c.choice is not None
    flag = c.choice[0]
    code, _, err = results(command)["bad_choice"]
    assert code == 2, err[-1000:]
    [line] = [line for line in err.splitlines() if ": error: " in line]
    assert line.startswith(f"{c.name}: error: "), line
    assert flag in line and f"invalid choice: '{BOGUS}' (choose from " in line, line
    choices = re.search(re.escape(flag) + r" \{([^}]+)\}", help_of(command))
    assert choices, f"{flag}'s choices are not shown in --help"
    assert all(choice in line.split("(choose from ", 1)[1] for choice in choices.group(1).split(",")), line


@pytest.mark.parametrize("command", [c for c, cmd in COMMANDS.items() if cmd.choice and cmd.choice[1]])
def test_an_invalid_choice_from_the_environment_is_named_the_same_way(command: str) -> None:
    c = COMMANDS[command]
    assert c.choice is not None
    variable = c.choice[1]
    code, _, err = env_results(command, variable, BOGUS)
    assert code == 2, err[-1000:]
    assert err.splitlines() == [err.strip()], err[-1000:]  # one line: nothing wrong on the command line
    assert err.startswith(f"{c.name}: error: invalid setting: {variable}: invalid choice: '{BOGUS}' (choose from ")


# --- the subcommands are listed in --help ---------------------------------------------------------------------


@pytest.mark.parametrize("command", [c for c in IDS if COMMANDS[c].subcommands])
def test_the_subcommands_are_listed_in_help(command: str) -> None:
    c = COMMANDS[command]
    text = help_of(command)
    for sub in c.subcommands:
        listed = re.search(rf"^ +{sub} +\S", text, re.MULTILINE) or re.search(rf"[{{,]{sub}[,}}]", text)
        assert listed, f"{c.prog} --help does not list {sub}"
    if c.dispatched:  # and each answers its own --help
        for sub in c.subcommands:
            code, out, err = results(command)[f"help {sub}"]
            assert code == 0 and out.startswith(f"usage: {c.prog} {sub}"), (sub, code, err[-500:])


# --- one error prefix, for argparse's errors and the command's own --------------------------------------------


@pytest.mark.parametrize("command", IDS)
def test_the_commands_own_errors_have_the_same_prefix_and_exit_2(command: str) -> None:
    c = COMMANDS[command]
    code, _, err = results(command)["own_error"]
    assert code == 2, (code, err[-1000:])
    assert len(err.splitlines()) == 1, err[-1000:]  # the command line was right: no usage
    assert err.startswith(f"{c.name}: error: "), err


# --- placeholders that mean something ---------------------------------------------------------------------------

# A placeholder made of capitals alone must be one of these words (a choice shows its choices, and anything
# with other characters, HOST:PORT or M[,M/V...], says its form); never the setting's own name (NVML, INTERVAL).
PLACEHOLDERS = {
    "URL", "ENDPOINT", "FILE", "DIR", "SECONDS", "MINUTES", "MS", "N", "BYTES", "PERCENT", "FRACTION", "RATIO",
    "SHARE", "USD", "NAME", "NAMESPACE", "BUCKET", "PREFIX", "KEY", "ARN", "REGION", "ID", "IMAGE", "OUTPUT",
    "PATTERNS", "MODEL", "ARTIFACT", "COMMAND",
}  # fmt: skip


def placeholders(invocation: str) -> list[str]:
    """``--nvml {auto,on,off}`` -> ["{auto,on,off}"]; ``-h, --help`` -> []; ``MODEL`` -> ["MODEL"]."""
    if not invocation.startswith("-"):
        return [invocation]
    return [part.split(" ", 1)[1] for part in invocation.split(", ") if " " in part]


@pytest.mark.parametrize("command", IDS)
def test_placeholders_say_what_the_value_is(command: str) -> None:
    bare = [
        (invocation, p)
        for invocation in entries(help_of(command))
        for p in placeholders(invocation)
        if re.fullmatch(r"[A-Z]+", p) and p not in PLACEHOLDERS
    ]
    assert bare == []


def _tables() -> dict[str, tuple[Option, ...]]:
    """Each command's table of settings (telemetry.settings.Option rows)."""
    from catalog import cli
    from controller.settings import OPTIONS as CONTROLLER
    from exporter.config import OPTIONS as EXPORTER
    from modelsync.rolloutcli import ROLLOUT_OPTIONS
    from modelsync.settings import OPTIONS as MODELSYNC
    from render import options_table
    from render.cost import OPTIONS as COST_OPTIONS

    render = options_table()
    return {
        "exporter": EXPORTER,
        "exporter catalog": cli.OPTIONS,
        "exporter render": render,
        "exporter cost": COST_OPTIONS,
        "render": render,
        "render cost": COST_OPTIONS,
        "modelsync": MODELSYNC,
        "modelsync rollout": ROLLOUT_OPTIONS,
        "controller": CONTROLLER,
    }


@pytest.mark.parametrize("command", sorted(_tables()))
def test_every_choice_setting_shows_its_choices(command: str) -> None:
    shown = entries(help_of(command))
    table = _tables()[command]
    choices = {o.flag: o.convert.choices for o in table if hasattr(o.convert, "choices")}
    for flag, values in choices.items():
        assert f"{flag} {{{','.join(values)}}}" in shown, (flag, [i for i in shown if i.startswith(flag)])
    known = {"--nvml", "--log-level", "--fanout", "--rollouts", "--llm-metrics", "--llm-backend"}
    flags = {o.flag for o in table}
    assert flags & known <= set(choices), "a choice setting whose converter does not say its choices"


# --- one help style ----------------------------------------------------------------------------------------------

ENV = re.compile(r" \[env: [A-Z][A-Z0-9_]*(?:, [A-Z][A-Z0-9_]*)*\]$")


def style_problems(text: str) -> list[str]:
    """What in one option's help breaks ``... (default: X) [env: VAR]``."""
    body = ENV.sub("", text)
    problems = []
    if "[env:" in body:
        problems.append("[env: ...] is not at the end")
    if re.search(r"\[[A-Z][A-Z0-9_]{2,}\]", body):
        problems.append("a variable in bare brackets, not [env: VAR]")
    defaults = [m.start() for m in re.finditer(r"\((?:[^()]*[;,] )?default\b", body)]
    if defaults:
        start = defaults[-1]
        if len(defaults) > 1 or not body.startswith("(default: ", start):
            problems.append("a default not written (default: X)")
        depth = 0
        for i, ch in enumerate(body[start:], start):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                if i != len(body) - 1:
                    problems.append("(default: X) is not last (before [env: VAR])")
                break
    return problems


@pytest.mark.parametrize("command", IDS)
def test_every_option_help_ends_with_its_default_then_its_variable(command: str) -> None:
    found = {i: style_problems(t) for i, t in entries(help_of(command)).items()}
    assert {i: p for i, p in found.items() if p} == {}


def test_the_style_check_finds_what_it_looks_for() -> None:
    assert style_problems("Triton HTTP endpoint (default: http://x:1) [env: TRITON_URL]") == []
    assert style_problems("deadline per cycle, seconds (default: min(5, interval/2)) [env: A, B]") == []
    assert style_problems("a count (2) or a share (10%) (default: 10%)") == []
    assert style_problems("overall time limit [HEALTH_DEADLINE] (default 4, under ECS's 5 s)") == [
        "a variable in bare brackets, not [env: VAR]",
        "a default not written (default: X)",
    ]
    assert style_problems("most tasks (MaxCapacity; default: 4)") == ["a default not written (default: X)"]
    assert style_problems("seconds (default: 600, the grace) of a start") == [
        "(default: X) is not last (before [env: VAR])"
    ]
    assert style_problems("where [env: X] it is (default: 1)") == ["[env: ...] is not at the end"]


# --- one flag name per setting ------------------------------------------------------------------------------------


def test_a_variable_read_by_several_commands_has_one_flag_name() -> None:
    """TRITON_METRICS_URL is --triton-metrics-url in the exporter and model sync alike (not --metrics-url in
    one of them), TRITON_URL --triton-url in the exporter, model sync and the health probe."""
    flags: dict[str, dict[str, str]] = {}
    for command in IDS:
        for invocation, text in entries(help_of(command)).items():
            env = ENV.search(text)
            if not invocation.startswith("--") or env is None:
                continue
            names = ", ".join(part.split(" ", 1)[0] for part in invocation.split(", "))
            for variable in env.group(0)[len(" [env: ") : -1].split(", "):
                flags.setdefault(variable, {})[command] = names
    shared = {v: by for v, by in flags.items() if len(set(by.values())) > 1}
    assert shared == {}
    assert {c for c, f in flags["TRITON_URL"].items() if f == "--triton-url"} >= {
        "exporter",
        "exporter health",
        "modelsync",
    }
    assert set(flags["TRITON_METRICS_URL"]) >= {"exporter", "modelsync"}
    assert set(flags["CONTROLLER_QUEUE_URL"]) >= {"exporter", "modelsync", "controller"}
