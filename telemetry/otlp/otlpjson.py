"""OTLP/JSON in: the protobuf messages from the JSON encoding, ids read as hex.

OTLP/JSON writes trace and span ids as hex strings, where protobuf's own
JSON mapping expects base64 for bytes fields: ``json_format.Parse`` takes a
hex id for base64 and silently decodes it to different bytes (seen with
Triton's spans). The ids are converted before parsing, and an id that is not
hex of the right length is an error, never a wrong id.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ID_HEX_LENGTH = {"traceId": 32, "spanId": 16, "parentSpanId": 16}


class OtlpJsonError(ValueError):
    """The body is not OTLP/JSON; the message says where."""


def _ids(obj: dict[str, Any], where: str) -> None:
    for key, length in ID_HEX_LENGTH.items():
        value = obj.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or len(value) != length:
            raise OtlpJsonError(f"{where}.{key}: not {length} hex digits")
        try:
            obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
        except ValueError:
            raise OtlpJsonError(f"{where}.{key}: not hex") from None


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key, [])
    if not isinstance(value, list):
        raise OtlpJsonError(f"{where}.{key}: not an array")
    return value


def traces_request(body: bytes) -> ExportTraceServiceRequest:
    """An ``ExportTraceServiceRequest`` from an OTLP/JSON body; OtlpJsonError when it is not one."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpJsonError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OtlpJsonError("not a JSON object")
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
    except json_format.ParseError as exc:
        raise OtlpJsonError(str(exc).splitlines()[0][:300]) from None


def traces_response_json(rejected: int = 0, message: str = "") -> bytes:
    """An ExportTraceServiceResponse in OTLP/JSON (``{}`` when everything was accepted)."""
    if not rejected and not message:
        return b"{}"
    return orjson.dumps({"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}})
