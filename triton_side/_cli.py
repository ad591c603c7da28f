"""Flags, environment variables and usage errors for the Triton-side commands.

``health.py`` and ``startup_check.py`` take every setting as a flag or an
environment variable (the flag wins, a blank variable counts as unset) and stop
with exit code 2 on bad usage: the command's usage on one line,
``PROG: error: ...`` and ``try 'PROG --help'`` (the rules of every command,
telemetry/settings.py; ``python -m exporter health`` says ``exporter health:
error:``), or the error line alone where the command keeps to one line. Each declares its options as a table
of :class:`Flag`; this module reads the command line from that table.

The health probe starts as a new process every 30 s in every task, so the
common case must not pay for importing argparse (with gettext, shutil and
their imports, about a quarter of the probe's start-up): :func:`parse` reads
plain command lines itself (``--flag VALUE``, ``--flag=VALUE``, switches) and
hands everything else (``--help``, an unknown or abbreviated flag, a missing
value, a value that starts with ``-``) to an argparse parser built from the same
table, so help and error messages are argparse's own; argparse takes no
abbreviation either (``--dead`` is not ``--deadline``). The fast reader accepts
only command lines that argparse reads the same way (tests/unit/triton_side/test_triton_side.py
compares the two).

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing takes milliseconds to import; type checkers know the name
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Mapping, Sequence
    from typing import NoReturn

VALUE = "value"  # --flag VALUE; the last one wins
APPEND = "append"  # --flag VALUE, repeatable; the values are joined with commas
SWITCH = "switch"  # --flag, no value
OPTIONAL = "optional"  # --flag [VALUE]; ``const`` when no value follows


class UsageError(Exception):
    """Bad flag or environment value: exit code 2.

    ``usage`` is argparse's usage line when the command line itself was wrong.
    """

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.usage = usage


class Exit(Exception):
    """argparse finished the command itself (``--help``); carries the exit status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Flag:
    """One option: its names (the first gives the key in the parsed values), how it takes a value, its help.

    ``hidden``: accepted, never shown in the help: a former name that command lines written into task
    definitions still use (the probe's ``--url``, now ``--triton-url`` as in every command).
    """

    __slots__ = ("const", "dest", "help", "hidden", "kind", "metavar", "names")

    def __init__(
        self,
        *names: str,
        kind: str = VALUE,
        metavar: str | None = None,
        help: str = "",
        const: str | None = None,
        dest: str | None = None,
        hidden: bool = False,
    ) -> None:
        self.names = names
        self.hidden = hidden
        self.kind = kind
        self.metavar = metavar
        self.help = help
        self.const = const
        self.dest = dest or names[0].lstrip("-").replace("-", "_")


def defaults(flags: Iterable[Flag]) -> dict[str, object]:
    """What argparse gives when no flag is on the command line: False for switches, else None."""
    return {f.dest: (False if f.kind == SWITCH else None) for f in flags}


def read_plain(flags: Sequence[Flag], args: Sequence[str]) -> dict[str, object] | None:
    """The values of a plain command line, or None when argparse must decide.

    Every argument must be a flag's full name, alone or as ``--flag=VALUE``;
    a value that is a separate argument must not start with ``-`` (argparse
    would take ``-1`` as a value but ``--x`` as a flag, so those go to it).
    """
    by_name = {name: f for f in flags for name in f.names}
    values = defaults(flags)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        flag = by_name.get(name)
        if flag is None:
            return None
        if flag.kind == SWITCH:
            if eq:
                return None
            values[flag.dest] = True
            continue
        if eq:
            value = inline
        elif i < len(args) and not args[i].startswith("-"):
            value = args[i]
            i += 1
        elif flag.kind == OPTIONAL and (i == len(args) or args[i].partition("=")[0] in by_name):
            value = flag.const or ""
        else:
            return None
        if flag.kind == APPEND:
            listed = values[flag.dest]
            values[flag.dest] = [*listed, value] if isinstance(listed, list) else [value]
        else:
            values[flag.dest] = value
    return values


def argparse_parser(flags: Sequence[Flag], prog: str, description: str) -> argparse.ArgumentParser:
    """The same table as an argparse parser that raises Exit and UsageError instead of exiting."""
    import argparse  # only for --help and the command lines read_plain leaves to it

    class Parser(argparse.ArgumentParser):
        def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
            if message:
                sys.stderr.write(message)
            raise Exit(status)

        def error(self, message: str) -> NoReturn:
            raise UsageError(message, usage=f"usage: {self.prog} [OPTIONS]")  # one line: --help lists them

    class Formatter(argparse.HelpFormatter):
        """Wraps between words only: never inside a URL or after a hyphen (as telemetry.settings.HelpFormatter)."""

        def _split_lines(self, text: str, width: int) -> list[str]:
            import textwrap

            return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)

        def _fill_text(self, text: str, width: int, indent: str) -> str:
            import textwrap

            return "\n".join(
                textwrap.wrap(
                    " ".join(text.split()),
                    width,
                    initial_indent=indent,
                    subsequent_indent=indent,
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )

    parser = Parser(prog=prog, description=description, formatter_class=Formatter, allow_abbrev=False)
    for f in flags:
        kwargs: dict[str, object] = {"dest": f.dest, "help": argparse.SUPPRESS if f.hidden else f.help}
        if f.kind == SWITCH:
            kwargs["action"] = "store_true"
        else:
            kwargs["metavar"] = f.metavar
            if f.kind == APPEND:
                kwargs["action"] = "append"
            elif f.kind == OPTIONAL:
                kwargs.update(nargs="?", const=f.const)
        parser.add_argument(*f.names, **kwargs)  # type: ignore[arg-type]
    return parser


def parse(flags: Sequence[Flag], argv: Sequence[str] | None, prog: str, description: str) -> dict[str, object]:
    """Flag values by ``dest`` (None when absent, a list for APPEND); Exit after --help, UsageError when wrong."""
    args = sys.argv[1:] if argv is None else list(argv)
    values = read_plain(flags, args)
    if values is None:
        values = vars(argparse_parser(flags, prog, description).parse_args(args))
    return values


def pick(flag: object, var: str, env: Mapping[str, str]) -> str | None:
    """The flag's value if given (a repeated flag's values joined by commas), else the variable's unless blank."""
    if flag is not None:
        return ",".join(flag) if isinstance(flag, list) else str(flag)
    value = env.get(var)
    return value if value is not None and value.strip() != "" else None


def usage_error(prog: str, exc: UsageError, show_usage: bool = True) -> int:
    """Print ``NAME: error: ...`` on stderr (NAME: ``prog`` less ``python -m``), between the usage line and
    ``try 'PROG --help'`` when the command line was wrong and ``show_usage`` (the start-up check keeps to
    one line); returns 2, the exit code for usage errors."""
    name = prog[len("python -m ") :] if prog.startswith("python -m ") else prog
    if show_usage and exc.usage:
        sys.stderr.write(f"{exc.usage}\n{name}: error: {exc}\ntry '{prog} --help'\n")
    else:
        sys.stderr.write(f"{name}: error: {exc}\n")
    return 2
