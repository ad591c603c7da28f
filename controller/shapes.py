"""A message or a state read as data: bounded JSON, typed fields, one error for every wrong shape.

Whatever can write to the controller's queue or its state object may put anything there: a string where an
object belongs, ``1e999``, a list nested 100,000 deep. :func:`loads` bounds size and depth and refuses
non-finite numbers; :class:`Doc` reads fields by type and range. Everything wrong is one :class:`Malformed`
naming the field, which the caller refuses, logs and counts; nothing else escapes.

(modelsync/shapes.py holds the same idea; the layers keep the controller from importing it. Moving it into
telemetry/ would let both share one copy.)
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 16


class Malformed(ValueError):
    """A document of the wrong shape; ``path`` names the field, ``reason`` what is wrong."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path[:120]
        self.reason = reason
        super().__init__(f"{self.path}: {reason}" if self.path else reason)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Malformed("", f"number out of range: {text[:20]}")
    return value


def _constant(text: str) -> Any:
    raise Malformed("", f"{text} is not a number JSON allows")


def loads(data: str | bytes, limit: int) -> Any:
    """Parse at most ``limit`` bytes of UTF-8 JSON, nested at most :data:`MAX_DEPTH` deep; raises Malformed."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > limit:
        raise Malformed("", f"larger than {limit} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("", "not UTF-8") from None
    _check_depth(text)
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_constant)
    except Malformed:
        raise
    except (ValueError, RecursionError) as exc:
        raise Malformed("", f"not JSON: {str(exc)[:80]}") from None


def _check_depth(text: str) -> None:
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
            if depth > MAX_DEPTH:
                raise Malformed("", f"nested deeper than {MAX_DEPTH}")
        elif ch in "]}":
            depth -= 1


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


class Doc:
    """A JSON object read field by field; an absent field and ``null`` are alike (the default, or Malformed)."""

    def __init__(self, raw: Any, path: str = "") -> None:
        if not isinstance(raw, dict):
            raise Malformed(path, f"{_kind(raw)}, not an object")
        self.raw: dict[str, Any] = raw
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

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

    def items(self, key: str, limit: int) -> list[Any]:
        """A list of at most ``limit`` items, empty when absent."""
        if not self.has(key):
            return []
        value = self.raw[key]
        if not isinstance(value, list):
            raise Malformed(self.at(key), f"{_kind(value)}, not a list")
        if len(value) > limit:
            raise Malformed(self.at(key), f"more than {limit} items")
        return value

    def text(self, key: str, limit: int, default: str | None = None) -> str:
        if default is not None and not self.has(key):
            return default
        value = self._required(key)
        if not isinstance(value, str):
            raise Malformed(self.at(key), f"{_kind(value)}, not a string")
        if len(value) > limit:
            raise Malformed(self.at(key), f"longer than {limit} characters")
        if not value.isprintable():
            raise Malformed(self.at(key), "holds characters that are not printable")
        return value

    def number(self, key: str, lo: float, hi: float, default: float | None = None) -> float:
        if default is not None and not self.has(key):
            return default
        value = self._required(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Malformed(self.at(key), f"{_kind(value)}, not a number")
        if not lo <= value <= hi:
            raise Malformed(self.at(key), f"out of range [{lo:g}, {hi:g}]")
        return float(value)

    def integer(self, key: str, lo: int, hi: int, default: int | None = None) -> int:
        if default is not None and not self.has(key):
            return default
        value = self._required(key)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise Malformed(self.at(key), f"{_kind(value)}, not a whole number")
        if not lo <= value <= hi:
            raise Malformed(self.at(key), f"out of range [{lo}, {hi}]")
        return value

    def optional_integer(self, key: str, lo: int, hi: int) -> int | None:
        return self.integer(key, lo, hi) if self.has(key) else None

    def flag(self, key: str) -> bool:
        value = self.raw.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise Malformed(self.at(key), f"{_kind(value)}, not true or false")
        return value
