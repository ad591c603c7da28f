"""The probe's JSON reader: ``json.loads`` for Triton's answers, with a nesting bound, mostly without json.

Why not plain ``json.loads``: importing ``json`` costs the probe's default run
about 5 ms (``re`` and the patterns json compiles at import), every 30 s in
every task, to read one small repository index; and ``json.loads`` has no
nesting bound (an answer nested a few thousand levels deep raises
RecursionError). This reader takes what ``json.loads`` takes and returns what
it returns, raising ValueError where it raises (tests/unit/triton_side/test_triton_side.py
compares the two), and refuses documents nested deeper than
:data:`MAX_DEPTH` with :class:`TooDeep`.

Documents up to :data:`PLAIN_MAX` characters (a repository index of hundreds
of models) are read here, in plain Python; larger ones go to ``json.loads``,
whose C scanner reads them about ten times faster than plain Python would
(8 MiB, the probe's body limit, in a fraction of a second rather than
seconds), so its import is small next to the reading; the result is then held
to the same nesting bound. Public standard library only.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

MAX_DEPTH = 64  # arrays and objects inside each other; Triton's deepest answer (a model config) has about 8
PLAIN_MAX = 64 * 1024  # characters read in plain Python; json.loads reads longer documents

_WHITESPACE = " \t\n\r"
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_NAN, _INF, _NEG_INF = float("nan"), float("inf"), float("-inf")


class TooDeep(ValueError):
    """The document nests arrays and objects deeper than the bound."""


def loads(data: str | bytes, max_depth: int = MAX_DEPTH) -> object:
    """``json.loads(data)``, but TooDeep (a ValueError) past ``max_depth`` levels; ValueError when malformed."""
    if isinstance(data, (bytes, bytearray)):
        if data[:1] in (b"\xef", b"\xfe", b"\xff") or b"\0" in data[:4]:
            return _json_loads(bytes(data), max_depth)  # a byte-order mark or UTF-16/32: never from Triton
        text = bytes(data).decode("utf-8", "surrogatepass")  # as json.loads decodes UTF-8
    else:
        text = data
    if len(text) > PLAIN_MAX:
        return _json_loads(text, max_depth)
    return _parse(text, max_depth)


def _json_loads(data: str | bytes, max_depth: int) -> object:
    """json.loads, held to the same nesting bound: for what is long, or in an encoding only it detects."""
    import gc
    import json  # ~5 ms (re, enum): small next to reading what comes here

    collecting = gc.isenabled()
    gc.disable()  # a document of millions of small arrays would otherwise run the collector over and over (5x)
    try:
        try:
            value = json.loads(data)
        except RecursionError:
            raise TooDeep(f"JSON nested deeper than {max_depth} levels") from None
        level = [value] if isinstance(value, (list, dict)) else []
        for step in range(max_depth):
            last = step == max_depth - 1  # an empty container deeper than the bound is still too deep
            level = [
                child
                for container in level
                for child in (container.values() if isinstance(container, dict) else container)
                if isinstance(child, (list, dict)) and (child or last)
            ]
    finally:
        if collecting:
            gc.enable()
    if level:
        raise TooDeep(f"JSON nested deeper than {max_depth} levels")
    return value


def _parse(text: str, max_depth: int) -> object:
    """One document, read in one loop: the open arrays and objects are on a list, not the call stack."""
    n = len(text)
    stack: list[list[object] | dict[str, object]] = []  # the open arrays and objects, innermost last
    keys: list[str] = []  # the key each open object's next value goes to
    value: object
    i = 0
    while i < n and text[i] in _WHITESPACE:
        i += 1
    while True:
        # --- one value at i
        ch = text[i : i + 1]
        if ch == '"':
            value, i = _string(text, i + 1)
        elif ch == "{" or ch == "[":
            if len(stack) >= max_depth:
                raise TooDeep(f"JSON nested deeper than {max_depth} levels at character {i}")
            i += 1
            while i < n and text[i] in _WHITESPACE:
                i += 1
            if ch == "[":
                if text[i : i + 1] == "]":
                    value, i = [], i + 1
                else:
                    stack.append([])
                    continue
            elif text[i : i + 1] == "}":
                value, i = {}, i + 1
            else:
                key, i = _key(text, i, n)
                stack.append({})
                keys.append(key)
                continue
        elif ch in _DIGITS or ch == "-":
            if ch == "-" and text.startswith("Infinity", i + 1):
                value, i = _NEG_INF, i + 9
            else:
                value, i = _number(text, i, n)
        elif ch == "n" and text.startswith("null", i):
            value, i = None, i + 4
        elif ch == "t" and text.startswith("true", i):
            value, i = True, i + 4
        elif ch == "f" and text.startswith("false", i):
            value, i = False, i + 5
        elif ch == "N" and text.startswith("NaN", i):
            value, i = _NAN, i + 3
        elif ch == "I" and text.startswith("Infinity", i):
            value, i = _INF, i + 8
        else:
            raise ValueError(f"expecting a JSON value at character {i}")
        # --- hand it to the containers it closes
        while True:
            while i < n and text[i] in _WHITESPACE:
                i += 1
            if not stack:
                if i != n:
                    raise ValueError(f"extra data after the JSON value at character {i}")
                return value
            top = stack[-1]
            ch = text[i : i + 1]
            if isinstance(top, list):
                top.append(value)
                if ch == ",":
                    i += 1
                    break
                if ch != "]":
                    raise ValueError(f"expecting ',' or ']' at character {i}")
            else:
                top[keys[-1]] = value
                if ch == ",":
                    i += 1
                    while i < n and text[i] in _WHITESPACE:
                        i += 1
                    keys[-1], i = _key(text, i, n)
                    break
                if ch != "}":
                    raise ValueError(f"expecting ',' or '}}' at character {i}")
                keys.pop()
            stack.pop()
            value = top
            i += 1
        while i < n and text[i] in _WHITESPACE:
            i += 1


def _key(text: str, i: int, n: int) -> tuple[str, int]:
    """An object's key and the index after its ':' and the whitespace after that."""
    if text[i : i + 1] != '"':
        raise ValueError(f"expecting a property name in double quotes at character {i}")
    key, i = _string(text, i + 1)
    while i < n and text[i] in _WHITESPACE:
        i += 1
    if text[i : i + 1] != ":":
        raise ValueError(f"expecting ':' at character {i}")
    i += 1
    while i < n and text[i] in _WHITESPACE:
        i += 1
    return key, i


def _string(text: str, i: int) -> tuple[str, int]:
    """The string whose opening quote is just before ``i``, and the index after its closing quote."""
    quote = text.find('"', i)
    if quote >= 0:
        raw = text[i:quote]
        if "\\" not in raw and (raw.isprintable() or not any(c < " " for c in raw)):
            return raw, quote + 1
    return _escaped(text, i)


def _escaped(text: str, i: int) -> tuple[str, int]:
    """:func:`_string` for a string with escapes, or one that is malformed."""
    start = i
    parts: list[str] = []
    while True:
        quote = text.find('"', i)
        if quote < 0:
            raise ValueError(f"unterminated string starting at character {start - 1}")
        backslash = text.find("\\", i, quote)
        end = quote if backslash < 0 else backslash
        raw = text[i:end]
        if not raw.isprintable() and any(c < " " for c in raw):
            raise ValueError(f"control character in a string at character {i}")
        parts.append(raw)
        if backslash < 0:
            return "".join(parts), quote + 1
        code = text[backslash + 1 : backslash + 2]
        if code == "u":
            c = _hex4(text, backslash + 2)
            i = backslash + 6
            if 0xD800 <= c <= 0xDBFF and i + 6 < len(text) and text.startswith("\\u", i):
                low = _hex4(text, i + 2)
                if 0xDC00 <= low <= 0xDFFF:
                    c = 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00)
                    i += 6
            parts.append(chr(c))
        elif code in _ESCAPES:
            parts.append(_ESCAPES[code])
            i = backslash + 2
        else:
            raise ValueError(f"invalid escape at character {backslash}")


def _hex4(text: str, i: int) -> int:
    digits = text[i : i + 4]
    if len(digits) != 4 or not _HEX.issuperset(digits):
        raise ValueError(f"invalid \\uXXXX escape at character {i - 2}")
    return int(digits, 16)


def _number(text: str, i: int, n: int) -> tuple[object, int]:
    start = i
    if text[i] == "-":
        i += 1
    ch = text[i : i + 1]
    if ch == "0":
        i += 1
    elif ch and ch in "123456789":
        i += 1
        while i < n and text[i] in _DIGITS:
            i += 1
    else:
        raise ValueError(f"expecting a JSON value at character {start}")
    whole = True
    if text[i : i + 1] == "." and i + 1 < n and text[i + 1] in _DIGITS:
        i += 2
        while i < n and text[i] in _DIGITS:
            i += 1
        whole = False
    if text[i : i + 1] in ("e", "E"):
        j = i + 1
        if text[j : j + 1] in ("+", "-"):
            j += 1
        if j < n and text[j] in _DIGITS:
            i = j + 1
            while i < n and text[i] in _DIGITS:
                i += 1
            whole = False
    number = text[start:i]
    return (int(number) if whole else float(number)), i
