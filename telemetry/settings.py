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
``invalid literal for int()``). Every parser prints its help with
:class:`HelpFormatter`.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag or variable and the value."""


@dataclass(frozen=True)
class Option:
    """One setting: where it lands (``field``), its flag, its variables, its converter and help.

    ``repeatable``: the flag may be given several times (a tuple of values);
    the variable holds them separated by ``separator`` (``os.pathsep`` when
    empty; ``" "`` splits on any run of blanks). ``boolean``:
    ``--flag``/``--no-flag`` on the command line; the variable is converted.
    ``dash_value``: the value may start with ``-`` (``--metrics -A*``).
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
            metavar=o.metavar or o.field.split("_")[-1].upper(),
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
                raise ConfigError(f"{origin}={raw!r}: {exc}") from None
            continue
        converted = []
        for r in raw:  # the value that is wrong is named, not the whole list
            try:
                converted.append(o.convert(r))
            except ValueError as exc:
                raise ConfigError(f"{origin}={r!r}: {exc}") from None
        values[o.field] = tuple(converted)
    return values


def parse(
    parser: argparse.ArgumentParser, options: Sequence[Option], argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse ``argv`` with ``parser`` (built with :func:`add_options`) and read the table: (namespace, values)."""
    args = parser.parse_args(attach_dash_values(options, argv))
    return args, read(options, args, environ)


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
    """One of ``choices``, case-insensitive, returned in lower case."""

    def check(text: str) -> str:
        if text.strip().lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text.strip().lower()

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
