"""A small reader and writer of protobuf text format, enough to rewrite two fields of a Triton config.

A bundle's models are served under version numbers the daemon chooses
(modelsync/bundle.py), so their ``config.pbtxt`` needs a ``version_policy``
and, in an ensemble, each step's ``model_version``. The file is parsed into
fields (scalars kept as their source text: strings stay quoted, enums and
numbers verbatim), edited, and written back; comments are dropped. Anything
the parser does not understand (extensions, a truncated file) raises
:class:`PbtxtError` instead of guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(
    r"""\s+|\#[^\n]*
    |(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    |(?P<word>[A-Za-z0-9_+.\-]+)
    |(?P<punct>[{}\[\]:,;<>])""",
    re.VERBOSE,
)
_CLOSE = {"{": "}", "<": ">"}
MAX_DEPTH = 32  # a Triton config nests 4 deep (ensemble_scheduling { step [ { input_map {} } ] }); the parser recurses


class PbtxtError(ValueError):
    """The text is not protobuf text format this module can rewrite safely."""


@dataclass
class Message:
    """Fields in source order; a value is a scalar's source text, a Message, or a list of either."""

    fields: list[tuple[str, Value]] = field(default_factory=list)

    def get(self, name: str) -> list[Value]:
        out: list[Value] = []
        for key, value in self.fields:
            if key == name:
                out.extend(value if isinstance(value, list) else [value])
        return out

    def scalar(self, name: str) -> str | None:
        """The last scalar ``name`` holds, unquoted, or None."""
        found = [v for v in self.get(name) if isinstance(v, str)]
        return unquote(found[-1]) if found else None

    def messages(self, name: str) -> list[Message]:
        return [v for v in self.get(name) if isinstance(v, Message)]

    def set(self, name: str, value: Value) -> None:
        """Replace every occurrence of ``name`` with one field, appended at the end."""
        self.fields = [(k, v) for k, v in self.fields if k != name]
        self.fields.append((name, value))


Value = str | Message | list[str | Message]


def unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _tokens(text: str) -> list[str]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise PbtxtError(f"unexpected character {text[pos]!r} at offset {pos}")
        if m.lastgroup is not None:
            out.append(m.group(m.lastgroup))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.t = tokens
        self.i = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise PbtxtError("unexpected end of text")
        self.i += 1
        return tok

    def message(self, close: str | None) -> Message:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise PbtxtError(f"messages nested deeper than {MAX_DEPTH} levels")
        try:
            return self._fields(close)
        finally:
            self.depth -= 1

    def _fields(self, close: str | None) -> Message:
        msg = Message()
        while True:
            tok = self.peek()
            if tok is None:
                if close is not None:
                    raise PbtxtError(f"missing {close!r}")
                return msg
            if tok == close:
                self.i += 1
                return msg
            if tok in (",", ";"):
                self.i += 1
                continue
            name = self.take()
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise PbtxtError(f"expected a field name, found {name!r}")
            colon = self.peek() == ":"
            if colon:
                self.i += 1
            msg.fields.append((name, self.value(colon)))

    def value(self, colon: bool) -> Value:
        tok = self.take()
        if tok in _CLOSE:
            return self.message(_CLOSE[tok])
        if tok == "[":
            items: list[str | Message] = []
            while (nxt := self.take()) != "]":
                if nxt == ",":
                    continue
                if nxt in _CLOSE:
                    items.append(self.message(_CLOSE[nxt]))
                elif nxt in "{}[]:;<>":
                    raise PbtxtError(f"unexpected {nxt!r} in a list")
                else:
                    items.append(nxt)
            return items
        if not colon or tok in "{}[]:;,<>":
            raise PbtxtError(f"unexpected {tok!r} after a field name")
        return tok


def parse(text: str) -> Message:
    return _Parser(_tokens(text)).message(None)


def dump(msg: Message, indent: str = "") -> str:
    lines = []
    for name, value in msg.fields:
        if isinstance(value, Message):
            lines.append(f"{indent}{name} {{\n{dump(value, indent + '  ')}{indent}}}")
        elif isinstance(value, list):
            parts = [f"{{\n{dump(v, indent + '    ')}{indent}  }}" if isinstance(v, Message) else v for v in value]
            if any(isinstance(v, Message) for v in value):
                lines.append(f"{indent}{name} [\n{indent}  " + f",\n{indent}  ".join(parts) + f"\n{indent}]")
            else:
                lines.append(f"{indent}{name}: [ {', '.join(parts)} ]")
        else:
            lines.append(f"{indent}{name}: {value}")
    return "".join(line + "\n" for line in lines)


def version_policy(versions: list[int]) -> Message:
    """``version_policy { specific { versions: [...] } }``."""
    return Message([("specific", Message([("versions", [str(v) for v in versions])]))])
