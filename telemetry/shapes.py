"""Outside documents read as data: bounded JSON and typed access, one error for every wrong shape.

An SQS message, a rollout state, a host's report to the controller or the controller's own state can hold
anything anyone with write access put there: a string where an object belongs, a list 100,000 deep,
``1e999`` (inf once parsed), ``NaN``, a lone surrogate. Code that trusts the shape raises TypeError,
OverflowError or RecursionError far from the handler meant for bad input, and a message whose handler raises
is never deleted. So every such document is parsed by :func:`loads` (size, depth, finite numbers, UTF-8
strings) and read through :class:`Doc` (types, ranges), and everything wrong with it is one
:class:`Malformed` naming the field. Model sync and the controller both read through it.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32  # deeper than any document read here needs (an S3 notification is 5 deep)
MAX_PATH = 120  # characters of a field's path kept in an error


class Malformed(ValueError):
    """A document of the wrong shape; ``path`` names the field (``Records[0].s3.object``), ``reason`` what."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path[:MAX_PATH]
        self.reason = reason
        super().__init__(f"{self.path}: {reason}" if self.path else reason)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Malformed("", f"number out of range: {text[:20]}")
    return value


def _constant(text: str) -> Any:
    raise Malformed("", f"{text} is not a number JSON allows")


def loads(data: str | bytes, limit: int, max_depth: int = MAX_DEPTH) -> Any:
    """Parse a JSON document of at most ``limit`` bytes of UTF-8, nested at most ``max_depth`` deep, whose
    numbers are finite and whose strings are valid Unicode (no lone surrogates); raises Malformed."""
    if isinstance(data, str):
        if len(data) > limit:  # a character is at least one byte: too long before encoding
            raise Malformed("", f"larger than {limit} bytes")
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            raise Malformed("", "not UTF-8") from None
    if len(data) > limit:
        raise Malformed("", f"larger than {limit} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("", "not UTF-8") from None
    _check_nesting(text, max_depth)
    try:
        doc = json.loads(text, parse_float=_finite, parse_constant=_constant)
    except Malformed:
        raise
    except RecursionError:  # json's parser recurses once per level: ``[[[[...`` exhausts the stack
        raise Malformed("", f"nested deeper than {max_depth}") from None
    except ValueError as exc:  # JSONDecodeError; an int of more than 4,300 digits
        raise Malformed("", f"not JSON: {str(exc)[:80]}") from None
    check_tree(doc, max_depth)
    return doc


def _check_nesting(text: str, max_depth: int) -> None:
    """Bound the nesting before the recursive parser sees it (brackets inside strings do not count)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                raise Malformed("", f"nested deeper than {max_depth}")
        elif ch in "]}":
            depth -= 1


def check_tree(doc: Any, max_depth: int = MAX_DEPTH) -> None:
    """Depth and strings of a parsed document, walked without recursion; raises Malformed."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > max_depth:
                raise Malformed("", f"nested deeper than {max_depth}")
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
            if isinstance(node, dict):
                stack.extend((key, depth) for key in node)
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:  # "\\udc80": JSON escapes may spell what UTF-8 cannot
                raise Malformed("", "a string that is not valid Unicode") from None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def number(value: Any, path: str, lo: float, hi: float) -> float:
    """A finite JSON number in [lo, hi] (a boolean is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Malformed(path, f"{_kind(value)}, not a number")
    in_range = lo <= value <= hi if isinstance(value, int) else math.isfinite(value) and lo <= value <= hi
    if not in_range:  # an int is compared as it is: 10**400 has no float
        raise Malformed(path, f"out of range [{lo:g}, {hi:g}]")
    return float(value)


def integer(value: Any, path: str, lo: int, hi: int) -> int:
    """A whole JSON number in [lo, hi] (``3.0`` is one: other writers may spell it so)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(path, f"{_kind(value)}, not a whole number")
    if not lo <= value <= hi:
        raise Malformed(path, f"out of range [{lo}, {hi}]")
    return value


def text(value: Any, path: str, limit: int | None = None, printable: bool = False) -> str:
    """A string of at most ``limit`` characters; ``printable``: none that would break a log line."""
    if not isinstance(value, str):
        raise Malformed(path, f"{_kind(value)}, not a string")
    if limit is not None and len(value) > limit:
        raise Malformed(path, f"longer than {limit} characters")
    if printable and not value.isprintable():
        raise Malformed(path, "holds characters that are not printable")
    return value


def items(value: Any, path: str, limit: int | None = None) -> list[Any]:
    if not isinstance(value, list):
        raise Malformed(path, f"{_kind(value)}, not a list")
    if limit is not None and len(value) > limit:
        raise Malformed(path, f"more than {limit} items")
    return value


class Doc:
    """A JSON object read field by field: each accessor checks the type (and range) or raises Malformed with
    the field's path. An absent field and ``null`` are the same: the default, or Malformed when required."""

    def __init__(self, raw: Any, path: str = "") -> None:
        if not isinstance(raw, dict):
            raise Malformed(path, f"{_kind(raw)}, not an object")
        self.raw: dict[str, Any] = raw
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str) -> Any:
        """The raw value, None when absent."""
        return self.raw.get(key)

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def _required(self, key: str) -> Any:
        value = self.raw.get(key)
        if value is None:
            raise Malformed(self.at(key), "missing")
        return value

    def doc(self, key: str) -> Doc:
        return Doc(self._required(key), self.at(key))

    def optional_doc(self, key: str) -> Doc | None:
        return Doc(self.raw[key], self.at(key)) if self.has(key) else None

    def items(self, key: str, limit: int | None = None) -> list[Any]:
        """A list of at most ``limit`` items, empty when absent."""
        return items(self.raw[key], self.at(key), limit) if self.has(key) else []

    def text(self, key: str, *, default: str | None = None, limit: int | None = None, printable: bool = False) -> str:
        if default is not None and not self.has(key):
            return default
        return text(self._required(key), self.at(key), limit, printable)

    def number(self, key: str, lo: float, hi: float, default: float | None = None) -> float:
        if default is not None and not self.has(key):
            return default
        return number(self._required(key), self.at(key), lo, hi)

    def optional_number(self, key: str, lo: float, hi: float) -> float | None:
        return number(self.raw[key], self.at(key), lo, hi) if self.has(key) else None

    def integer(self, key: str, lo: int, hi: int, default: int | None = None) -> int:
        if default is not None and not self.has(key):
            return default
        return integer(self._required(key), self.at(key), lo, hi)

    def optional_integer(self, key: str, lo: int, hi: int) -> int | None:
        return self.integer(key, lo, hi) if self.has(key) else None

    def flag(self, key: str) -> bool:
        value = self.raw.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise Malformed(self.at(key), f"{_kind(value)}, not true or false")
        return value
