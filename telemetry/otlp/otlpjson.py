"""OTLP/JSON in: the protobuf messages from the JSON encoding, ids read as hex.

OTLP/JSON writes trace and span ids as hex strings, where protobuf's own
JSON mapping expects base64 for bytes fields: ``json_format.Parse`` takes a
hex id for base64 and silently decodes it to different bytes (seen with
Triton's spans). The ids are converted before parsing (under their proto
field names too, which the JSON mapping also accepts), and an id that is not
hex of the right length is an error, never a wrong id.

The document is bounded before protobuf's parser (pure Python, recursive,
about 20 us a value) sees it: at most ``max_depth`` levels of nesting and
``max_values`` JSON values, so one body costs bounded time and stack.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ID_HEX_LENGTH = {
    "traceId": 32,
    "spanId": 16,
    "parentSpanId": 16,
    "trace_id": 32,  # the proto field names, which json_format takes as well: never as base64
    "span_id": 16,
    "parent_span_id": 16,
}
MAX_DEPTH = 32  # Triton's batches nest 11 levels deep
MAX_VALUES = 100_000  # Triton's batch of 512 spans holds about 14,000; parsing costs ~20 us a value


class OtlpJsonError(ValueError):
    """The body is not OTLP/JSON; the message says where."""


class BadId(OtlpJsonError):
    """A trace or span id that is not hex of its exact length."""


class TooComplex(OtlpJsonError):
    """The document nests deeper or holds more values than the bounds."""


def _ids(obj: dict[str, Any], where: str) -> None:
    for key, length in ID_HEX_LENGTH.items():
        value = obj.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or len(value) != length:
            raise BadId(f"{where}.{key}: not {length} hex digits")
        try:
            obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
        except ValueError:
            raise BadId(f"{where}.{key}: not hex") from None


def _bounded(doc: object, max_depth: int, max_values: int) -> None:
    """TooComplex when ``doc`` nests deeper than ``max_depth`` or holds more than ``max_values`` values.

    Level by level (about 0.4 us a value: 6 ms for Triton's batch of 512 spans)."""
    level: list[Any] = [doc]
    depth = values = 0
    while level:
        depth += 1
        values += len(level)
        if values > max_values:
            raise TooComplex(f"more than {max_values} JSON values")
        below: list[Any] = []
        for value in level:
            kind = type(value)
            if kind is dict:
                below.extend(value.values())
            elif kind is list:
                below.extend(value)
        if below and depth >= max_depth:
            raise TooComplex(f"nested deeper than {max_depth} levels")
        level = below


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key, [])
    if not isinstance(value, list):
        raise OtlpJsonError(f"{where}.{key}: not an array")
    return value


def traces_request(body: bytes, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> ExportTraceServiceRequest:
    """An ``ExportTraceServiceRequest`` from an OTLP/JSON body; OtlpJsonError (or its BadId, TooComplex)
    when it is not one within the bounds."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "recursion" in str(exc):  # orjson's own limit (1,024), deeper than ours
            raise TooComplex(f"nested deeper than {max_depth} levels") from None
        raise OtlpJsonError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OtlpJsonError("not a JSON object")
    _bounded(doc, max_depth, max_values)
    for i, rs in enumerate(_list(doc, "resourceSpans", "")):
        if not isinstance(rs, dict):
            raise OtlpJsonError(f"resourceSpans[{i}]: not an object")
        for j, ss in enumerate(_list(rs, "scopeSpans", f"resourceSpans[{i}]")):
            if not isinstance(ss, dict):
                raise OtlpJsonError(f"resourceSpans[{i}].scopeSpans[{j}]: not an object")
            for k, span in enumerate(_list(ss, "spans", f"resourceSpans[{i}].scopeSpans[{j}]")):
                where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                if not isinstance(span, dict):
                    raise OtlpJsonError(f"{where}: not an object")
                _ids(span, where)
                for n, link in enumerate(_list(span, "links", where)):
                    if isinstance(link, dict):
                        _ids(link, f"{where}.links[{n}]")
    try:
        return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError) as exc:  # RecursionError: a stack shallower than the bound
        raise OtlpJsonError(str(exc).splitlines()[0][:300]) from None


def traces_response_json(rejected: int = 0, message: str = "") -> bytes:
    """An ExportTraceServiceResponse in OTLP/JSON (``{}`` when everything was accepted)."""
    if not rejected and not message:
        return b"{}"
    return orjson.dumps({"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}})
