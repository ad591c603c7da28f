"""A log widget's Logs Insights query, run over log events as CloudWatch Logs would hold them.

Implemented, because dashboards/triton.json uses them, and nothing else (anything else raises
:class:`~demo.preview.emf.Unsupported`):

- ``SOURCE 'group'`` (one or more) in front of the query, as the dashboard's widgets write it;
- ``fields a, b, x * 1 as y`` (arithmetic of a field and a number); the table shows the fields of
  every ``fields`` command and those ``parse`` extracts, in order (no ``display``);
- ``filter`` with ``and``/``or`` over ``f = "s"``, ``f != "s"``, ``f like /re/``, ``f > n``
  (``<``, ``>=``, ``<=``) and ``ispresent(f)``;
- ``parse f /re/`` with named groups ``(?<name>...)``;
- ``stats count(*)|count(f)|latest(f)|max(f)|min(f)|sum(f)|avg(f) as name, ... by a, b``
  (several in a row: the second groups the first's rows);
- ``sort a desc, b asc`` and ``limit n``.

An event's fields are Logs Insights' discovered fields: ``@timestamp``, ``@message``,
``@logStream``, and the keys of a JSON message (nested objects flattened with dots).
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from .emf import Unsupported

Row = dict[str, Any]


@dataclass(frozen=True)
class LogEvent:
    time: float  # seconds since the epoch
    message: str
    stream: str = ""

    def json(self) -> dict[str, Any] | None:
        if not self.message.startswith("{"):
            return None
        try:
            doc = json.loads(self.message)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def fields(self) -> Row:
        row: Row = {}
        doc = self.json()
        if doc is not None:
            _flatten(doc, "", row)
        row.update({"@timestamp": self.time, "@message": self.message, "@logStream": self.stream})
        return row


def _flatten(doc: dict[str, Any], prefix: str, out: Row) -> None:
    for key, value in doc.items():
        if isinstance(value, dict):
            _flatten(value, f"{prefix}{key}.", out)
        else:
            out[f"{prefix}{key}"] = value


@dataclass
class Result:
    """A table: its columns, in order, and its rows."""

    columns: list[str]
    rows: list[Row] = field(default_factory=list)
    timestamps: set[str] = field(default_factory=lambda: {"@timestamp"})  # columns that hold times

    def cell(self, row: Row, column: str) -> str:
        """A cell as the console shows it: times as UTC date and time to the millisecond."""
        value = row.get(column)
        if value is None:
            return ""
        if column in self.timestamps and isinstance(value, int | float):
            return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


def split_commands(query: str) -> list[str]:
    """The query's commands: split on ``|`` outside strings and /regex/ literals."""
    parts, current, i, quote = [], "", 0, ""
    while i < len(query):
        c = query[i]
        if quote:
            current += c
            if c == "\\" and i + 1 < len(query):
                current += query[i + 1]
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            current += c
        elif c == "/" and re.search(r"(\blike|\bparse\s+\S+|=~)\s*$", current):
            quote = "/"
            current += c
        elif c == "|":
            parts.append(current.strip())
            current = ""
        else:
            current += c
        i += 1
    if quote:
        raise Unsupported(f"query {query!r}: unterminated {quote}")
    parts.append(current.strip())
    return [p for p in parts if p]


def sources(query: str) -> tuple[list[str], list[str]]:
    """(log groups named by SOURCE, the remaining commands)."""
    commands = split_commands(query)
    groups = []
    while commands and (m := re.fullmatch(r"SOURCE\s+'([^']+)'", commands[0], re.I)):
        groups.append(m.group(1))
        commands.pop(0)
    return groups, commands


def _regex(literal: str, where: str) -> re.Pattern[str]:
    m = re.fullmatch(r"/(.*)/", literal.strip(), re.S)
    if m is None:
        raise Unsupported(f"{where}: {literal!r} is not a /regex/")
    return re.compile(m.group(1).replace("(?<", "(?P<").replace("(?P<=", "(?<=").replace("(?P<!", "(?<!"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


_CONDITION = re.compile(
    r"\s*(?:ispresent\((?P<present>[\w.@]+)\)"
    r"|(?P<field>[\w.@]+)\s*(?:(?P<like>like)\s*(?P<re>/(?:\\.|[^/])*/)"
    r"|(?P<op>!=|>=|<=|=|>|<)\s*(?:\"(?P<str>[^\"]*)\"|'(?P<str2>[^']*)'|(?P<num>-?\d+(?:\.\d+)?))))\s*"
)


def _condition(text: str) -> Callable[[Row], bool]:
    """A filter's predicate: or of ands of comparisons (no parentheses, no not)."""
    alternatives = []
    for alternative in re.split(r"\s+or\s+", text):
        terms = []
        for term in re.split(r"\s+and\s+", alternative):
            m = _CONDITION.fullmatch(term)
            if m is None:
                raise Unsupported(f"filter {text!r}: cannot read {term!r}")
            terms.append(m)
        alternatives.append(terms)

    def test(row: Row, m: re.Match[str]) -> bool:
        if m.group("present"):
            return m.group("present") in row
        value = row.get(m.group("field"))
        if value is None:
            return False
        if m.group("like"):
            return _regex(m.group("re"), f"filter {text!r}").search(str(value)) is not None
        have: Any
        want: Any
        if m.group("num") is not None:
            have, want = _number(value), float(m.group("num"))
            if have is None:
                return False
        else:
            have, want = str(value), m.group("str") if m.group("str") is not None else m.group("str2")
        return bool(COMPARE[m.group("op")](have, want))

    return lambda row: any(all(test(row, m) for m in terms) for terms in alternatives)


COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
}
_FIELD_EXPR = re.compile(r"(?P<src>[\w.@]+)(?:\s*(?P<op>[-+*/])\s*(?P<num>-?\d+(?:\.\d+)?))?(?:\s+as\s+(?P<as>\w+))?")
_AGG = re.compile(r"(?P<func>count|latest|max|min|sum|avg)\((?P<arg>\*|[\w.@]+)\)(?:\s+as\s+(?P<as>\w+))?", re.I)


def _split_list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _aggregate(func: str, arg: str, rows: list[Row]) -> Any:
    if func == "count":
        return len(rows) if arg == "*" else sum(1 for r in rows if arg in r)
    present = [r for r in rows if arg in r]
    if func == "latest":
        return max(present, key=lambda r: r.get("@timestamp", 0))[arg] if present else None
    values = [v for r in present if (v := _number(r[arg])) is not None]
    if not values:
        return None
    if func == "avg":
        return sum(values) / len(values)
    if func == "sum":
        return sum(values)
    return max(values) if func == "max" else min(values)


def run(query: str, events: list[LogEvent]) -> Result:
    """The table the query gives over ``events`` (the events of its SOURCE groups)."""
    _, commands = sources(query)
    rows = [e.fields() for e in sorted(events, key=lambda e: e.time)]
    columns: list[str] = []
    stamps = {"@timestamp"}
    for command in commands:
        verb, _, rest = command.partition(" ")
        verb, rest = verb.lower(), rest.strip()
        if verb == "fields":
            for item in _split_list(rest):
                m = _FIELD_EXPR.fullmatch(item)
                if m is None:
                    raise Unsupported(f"fields {item!r}: the preview reads names and 'field op number as name'")
                name = m.group("as") or m.group("src")
                if m.group("op"):
                    num, op = float(m.group("num")), m.group("op")
                    for r in rows:
                        if (x := _number(r.get(m.group("src")))) is not None:
                            r[name] = {"+": x + num, "-": x - num, "*": x * num, "/": x / num if num else None}[op]
                elif m.group("as"):
                    if m.group("src") in stamps:
                        stamps.add(name)
                    for r in rows:
                        if m.group("src") in r:
                            r[name] = r[m.group("src")]
                if name not in columns:
                    columns.append(name)
        elif verb == "filter":
            keep = _condition(rest)
            rows = [r for r in rows if keep(r)]
        elif verb == "parse":
            m = re.fullmatch(r"([\w.@]+)\s+(/.*/)", rest, re.S)
            if m is None:
                raise Unsupported(f"parse {rest!r}: the preview reads 'parse field /regex/'")
            pattern = _regex(m.group(2), command)
            columns += [g for g in pattern.groupindex if g not in columns]
            for r in rows:
                if (found := pattern.search(str(r.get(m.group(1), "")))) is not None:
                    r.update({k: v for k, v in found.groupdict().items() if v is not None})
        elif verb == "stats":
            split = re.fullmatch(r"(.*?)(?:\s+by\s+(.*))?", rest, re.S)
            assert split is not None  # the pattern matches any text
            body, keys = split.group(1), _split_list(split.group(2) or "")
            aggs = []
            for item in _split_list(body):
                m = _AGG.fullmatch(item)
                if m is None:
                    raise Unsupported(f"stats {item!r}: not an aggregation the preview implements")
                aggs.append((m.group("func").lower(), m.group("arg"), m.group("as") or item))
                if m.group("arg") in stamps and m.group("func").lower() in ("latest", "max", "min"):
                    stamps.add(m.group("as") or item)
            groups: dict[tuple[Any, ...], list[Row]] = {}
            for r in rows:
                groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
            rows = []
            for values, members in groups.items():
                out = dict(zip(keys, values))
                out.update({name: _aggregate(func, arg, members) for func, arg, name in aggs})
                rows.append(out)
            columns = [*keys, *(name for _, _, name in aggs)]
        elif verb == "sort":
            for item in reversed(_split_list(rest)):
                name, _, order = item.partition(" ")
                if order.strip().lower() not in ("", "asc", "desc"):
                    raise Unsupported(f"sort {item!r}")
                rows.sort(key=partial(_row_key, name), reverse=order.strip().lower() == "desc")
        elif verb == "limit":
            if not rest.isdigit():
                raise Unsupported(f"limit {rest!r}")
            rows = rows[: int(rest)]
        else:
            raise Unsupported(f"Logs Insights command {verb!r} is not implemented by the preview")
    return Result(columns or ["@timestamp", "@message"], rows, stamps)


def _row_key(name: str, row: Row) -> tuple[int, Any]:
    return _sort_key(row.get(name))


def _sort_key(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)
    number = _number(value)
    return (1, number) if number is not None else (2, str(value))
