"""One way to read settings: a table of options that builds argparse and reads the environment.

Every daemon and command declares its settings as :class:`Option` rows and
calls :func:`read`. The rule is the same everywhere: a flag wins over its
environment variables (in the order listed), a variable over the default;
every raw value goes through the option's converter, and a bad one is a
:class:`ConfigError` naming where the value came from. Entry points turn
that into one line on stderr and exit 2, so ``EXPORTER_LLM_METRICS=yes`` is
refused by the daemon and by every command that reads it alike.

The converters below are the shared vocabulary (URLs, numbers, sizes,
choices, booleans); a converter is any ``str -> value`` that raises
``ValueError`` with a short reason, in its own words (never Python's
``invalid literal for int()``).

Every command's parser is an :class:`ArgumentParser`, so every command line
follows the same rules: no abbreviated flag (``--inter`` is not ``--interval``);
a usage error is one usage line, ``<command>: error: ...`` and
``try '<prog> --help'``, exit 2; the command's own errors start with the same
``<command>: error:`` (:func:`fail`); the subcommands are listed in ``--help``
(:func:`add_commands`); a placeholder says what the value is (a choice lists
its choices, ``--nvml {auto,on,off}``); every option's help ends with
``(default: ...) [env: VAR]`` where those apply. tests/unit/test_cli_rules.py
checks every command against them.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag or variable and the value."""


class InvalidChoice(ValueError):
    """A value outside a :func:`choice`: the message names it as argparse does,
    ``invalid choice: 'x' (choose from a, b)``."""


@dataclass(frozen=True)
class Option:
    """One setting: where it lands (``field``), its flag, its variables, its converter and help.

    ``repeatable``: the flag may be given several times (a tuple of values);
    the variable holds them separated by ``separator`` (``os.pathsep`` when
    empty; ``" "`` splits on any run of blanks). ``boolean``:
    ``--flag``/``--no-flag`` on the command line; the variable is converted.
    ``dash_value``: the value may start with ``-`` (``--metrics -A*``).
    ``metavar``: the placeholder the help shows (``SECONDS``, ``FILE``); by
    default one said by the converter (``URL``, ``N``, ``BYTES``), and a
    :func:`choice` always shows its choices (``{auto,on,off}``).
    ``shown``: the default as the help prints it (None: the default itself;
    ``""``: not printed).
    """

    field: str
    flag: str
    env: tuple[str, ...] = ()
    convert: Callable[[str], Any] = str
    help: str = ""
    repeatable: bool = False
    boolean: bool = False
    dash_value: bool = False
    metavar: str = ""
    shown: str | None = None
    separator: str = ""  # a repeatable option's variable: between values ("": os.pathsep; " ": blanks)

    def split(self, raw: str) -> list[str]:
        """A repeatable option's variable as its values (blank parts left out; one empty value if none)."""
        parts = raw.split() if self.separator == " " else raw.split(self.separator or os.pathsep)
        return [p for p in parts if p.strip()] or [""]


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, wrapped between words only: never inside a URL that is wider than the help
    column (it overflows the line instead) nor after a hyphen (``triton-server``), so an example can be
    copied from the terminal as it is printed."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )


def command_name(prog: str) -> str:
    """The name a command's errors start with: ``python -m modelsync rollout`` -> ``modelsync rollout``."""
    return prog.removeprefix("python -m ").strip()


def fail(prog: str, message: str, code: int = 2) -> int:
    """A command's own error (an invalid setting, a file it cannot read, a failure): the one line
    ``<command>: error: <message>`` on stderr, as argparse's usage errors start; returns ``code`` (2 for
    settings and usage, 1 for a failure at run time)."""
    sys.stderr.write(f"{command_name(prog)}: error: {message}\n")
    return code


def _positional(action: argparse.Action) -> str:
    """A positional argument as a usage line shows it: ``MODEL``, ``[ARTIFACT]``, ``{run,resume,status}``."""
    if action.metavar is not None:
        name = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices:
        name = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        name = action.dest
    if action.nargs == argparse.PARSER:
        return f"{name} ..." if action.required else f"[{name} ...]"
    if action.nargs == argparse.OPTIONAL:
        return f"[{name}]"
    if action.nargs == argparse.ZERO_OR_MORE:
        return f"[{name} ...]"
    if action.nargs == argparse.ONE_OR_MORE:
        return f"{name} [{name} ...]"
    return name


class ArgumentParser(argparse.ArgumentParser):
    """Every command's parser: the rules of this module's docstring.

    Never abbreviations (``allow_abbrev`` is False whatever the caller says, in subcommands too: they are
    made of this class); :class:`HelpFormatter` unless told otherwise; a usage error is three lines on stderr,
    exit 2::

        usage: python -m exporter [OPTIONS] [COMMAND ...]
        exporter: error: unrecognized arguments: --foo
        try 'python -m exporter --help'

    rather than argparse's whole usage block, which lists every option and buries the error under it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def usage_line(self) -> str:
        """``usage: PROG [OPTIONS] POSITIONALS`` on one line, however many options (``--help`` lists them)."""
        words = [self.prog]
        if any(a.option_strings for a in self._actions if a.help != argparse.SUPPRESS):
            words.append("[OPTIONS]")
        words += [_positional(a) for a in self._actions if not a.option_strings and a.help != argparse.SUPPRESS]
        return "usage: " + " ".join(words)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._given, namespace)

    def error(self, message: str) -> NoReturn:
        unknown = self._unknown_flags()
        if unknown:  # what argparse says otherwise is about what follows it: --inter 3 is "invalid choice: '3'"
            message = f"unrecognized arguments: {' '.join(unknown)}"
            near = [o for o in self._option_string_actions if o.startswith(unknown[0].split("=", 1)[0])]
            if len(near) == 1:
                message += f" (a flag is never abbreviated: {near[0]})"
        self.exit(2, f"{self.usage_line()}\n{command_name(self.prog)}: error: {message}\ntry '{self.prog} --help'\n")

    def _unknown_flags(self) -> list[str]:
        """The ``--flags`` given that this parser does not know, up to a ``--``."""
        given = getattr(self, "_given", [])
        given = given[: given.index("--")] if "--" in given else given
        return [a for a in given if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions]


def add_commands(parser: argparse.ArgumentParser, commands: Mapping[str, str]) -> None:
    """List a command's subcommands (name -> what it does) in its ``--help``, and refuse an unknown one as an
    invalid choice. Each subcommand reads its own arguments: the entry point hands it ``argv[1:]`` before this
    parser runs, so here a subcommand only shows up when it follows an option (``--once catalog``), which
    :func:`command_first` refuses."""
    if not commands:
        return
    sub = parser.add_subparsers(
        dest="command", title="commands", metavar="COMMAND", help=f"{parser.prog} COMMAND --help: what it takes"
    )
    for name, text in commands.items():
        sub.add_parser(name, help=text, add_help=False)


def command_first(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error when a subcommand came after an option: ``python -m exporter --once catalog``."""
    command = getattr(args, "command", None)
    if command:
        parser.error(f"the command comes first: {parser.prog} {command} [...]")


_METAVARS: dict[Callable[[str], Any], str] = {}  # converter -> its placeholder (filled below the converters)


def metavar(o: Option) -> str:
    """The placeholder of a value option: a choice's choices, the table's own, the converter's, else the field's
    last word."""
    choices = getattr(o.convert, "choices", None)
    if choices:
        return "{" + ",".join(choices) + "}"
    return o.metavar or _METAVARS.get(o.convert) or o.field.split("_")[-1].upper()


def environment_variables(options: Iterable[Option]) -> tuple[str, ...]:
    """Every variable the table reads (tests clear them; docs list them)."""
    return tuple(env for o in options for env in o.env)


def add_options(parser: argparse.ArgumentParser, options: Iterable[Option], defaults: object = None) -> None:
    """One argparse flag per option; ``defaults`` (an object with the fields) fills the help's defaults."""
    for o in options:
        default = getattr(defaults, o.field, None) if defaults is not None else None
        shown = o.shown if o.shown is not None else ("" if default is None else str(default))
        text = o.help + (f" (default: {shown})" if shown else "")
        if o.env:
            text += f" [env: {', '.join(o.env)}]"
        text = text.replace("%", "%%")
        if o.boolean:
            parser.add_argument(o.flag, dest=o.field, action=argparse.BooleanOptionalAction, default=None, help=text)
            continue
        parser.add_argument(
            o.flag,
            dest=o.field,
            default=None,
            metavar=metavar(o),
            action="append" if o.repeatable else "store",
            help=text,
        )


def attach_dash_values(options: Iterable[Option], argv: Sequence[str]) -> list[str]:
    """``--metrics -A*`` as ``--metrics=-A*``: argparse would take a value starting with ``-`` for a flag.

    A selection that only excludes is the common one, so the separated
    spelling must work too.
    """
    flags = {o.flag for o in options if o.dash_value}
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        if items[i] in flags and i + 1 < len(items) and items[i + 1].startswith("-"):
            out.append(f"{items[i]}={items[i + 1]}")
            i += 2
            continue
        out.append(items[i])
        i += 1
    return out


def read(options: Iterable[Option], args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """field -> converted value, for every option set by its flag or, else, by its first set variable.

    Options set nowhere are left out (the caller's defaults apply). Raises
    ConfigError naming the flag or variable and the raw value.
    """
    values: dict[str, Any] = {}
    for o in options:
        raw: Any = getattr(args, o.field, None)
        origin = o.flag
        if raw is None:
            raw, origin = next(((environ[env], env) for env in o.env if environ.get(env, "") != ""), (None, ""))
            if raw is not None and o.repeatable:
                raw = o.split(raw)
        if raw is None:
            continue
        if isinstance(raw, bool):  # --flag / --no-flag
            values[o.field] = raw
            continue
        if not o.repeatable:
            try:
                values[o.field] = o.convert(raw)
            except ValueError as exc:
                raise _invalid(origin, raw, exc) from None
            continue
        converted = []
        for r in raw:  # the value that is wrong is named, not the whole list
            try:
                converted.append(o.convert(r))
            except ValueError as exc:
                raise _invalid(origin, r, exc) from None
        values[o.field] = tuple(converted)
    return values


def _invalid(origin: str, raw: str, exc: ValueError) -> ConfigError:
    """``--interval='0': must be a positive number``; an invalid choice names the value itself, as argparse
    does: ``--nvml: invalid choice: 'x' (choose from auto, on, off)``."""
    return ConfigError(f"{origin}: {exc}" if isinstance(exc, InvalidChoice) else f"{origin}={raw!r}: {exc}")


def parse(
    parser: argparse.ArgumentParser, options: Sequence[Option], argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse ``argv`` with ``parser`` (built with :func:`add_options`) and read the table: (namespace, values)."""
    _no_abbreviations(parser)
    args = parser.parse_args(attach_dash_values(options, argv))
    return args, read(options, args, environ)


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Whatever parser a command hands in, and its subcommands': a flag is given whole or not at all."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _no_abbreviations(sub)


# --- converters -------------------------------------------------------------------------------------------------


def http_url(text: str) -> str:
    """An http(s) URL with a host and a valid port; a bare trailing ``/`` dropped (a base URL), a path kept."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    return text.rstrip("/") if parts.path in ("", "/") else text


def number(text: str) -> float:
    """A finite number."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("must be an integer") from None


def positive(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("must be a positive number")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def non_negative(text: str) -> float:
    """A finite number >= 0 (seconds)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError("must be a number >= 0")
    return value


def choice(*choices: str) -> Callable[[str], str]:
    """One of ``choices``, case-insensitive, returned in lower case; the help shows them (``{on,off}``)."""

    def check(text: str) -> str:
        if text.strip().lower() not in choices:
            raise InvalidChoice(f"invalid choice: {text!r} (choose from {', '.join(choices)})")
        return text.strip().lower()

    check.choices = choices  # type: ignore[attr-defined]  # read by metavar()
    return check


def boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def size(text: str) -> int:
    """Bytes, with an optional binary suffix: ``1048576``, ``512M``, ``10GiB``: the one rule for every byte
    setting of every command (the exporter's and model sync's alike)."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ValueError("must be a byte count, optionally with K, M, G or T (binary: 1G = 1024^3)")
    unit = (m.group(2) or "B")[0].upper()
    return int(m.group(1)) * {"B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}[unit]


def positive_size(text: str) -> int:
    value = size(text)
    if value <= 0:
        raise ValueError("must be more than 0 bytes")
    return value


def shown_size(value: int) -> str:
    """A byte count as the help prints it: ``64G`` rather than 68719476736."""
    for unit, scale in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if value >= scale and value % scale == 0:
            return f"{value // scale}{unit}"
    return str(value)


def printable(text: str) -> str:
    """A printable, non-empty name (surrounding blanks dropped)."""
    if not text.strip() or not text.isprintable():
        raise ValueError("must be a printable, non-empty name")
    return text.strip()


def cloudwatch_namespace(text: str) -> str:
    if not 1 <= len(text) <= 255 or not text.isascii() or text.startswith("AWS/"):
        raise ValueError("must be 1-255 ASCII characters and not start with AWS/")
    return text


_METAVARS.update(
    {
        http_url: "URL",
        integer: "N",
        positive_int: "N",
        size: "BYTES",
        positive_size: "BYTES",
        boolean: "{true,false}",
        printable: "NAME",
        cloudwatch_namespace: "NAMESPACE",
    }
)
