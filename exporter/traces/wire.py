"""A pre-scan of an OTLP protobuf body: how many of each thing parsing it would build, before it is built.

Bytes alone do not bound what a protobuf body costs: an empty attribute is 2 bytes on the wire, about 55
once parsed (upb) and 250 once the relay has read it in Python, so one 4 MB body of 2 million empty
resource attributes took the exporter from 44 to 520 MB. :func:`scan` walks the wire format with
the request's schema (read from the generated descriptors), counts the elements of every repeated field
by kind and stops at the first kind past its bound, so a hostile body is refused after a bounded amount of
work and nothing of it is ever built. What it counts also sizes the request in memory
(:attr:`WireCounts.memory`), which is what the relay's queue is bounded by.

Only the structure is checked here; the parser that follows still decides whether the body is OTLP
(UTF-8 strings, field types), so the scan is lenient wherever upb is: a field of the wrong wire type, an
unknown field and a group are skipped as upb keeps them, unparsed. Pure Python, one step a field:
about 3 ms for Triton's batch of 512 spans, under 1 s for any 4 MB body.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

# What multiplies, by kind: each repeated field of the request's schema counts as one of these.
KINDS = (
    "resource_spans",
    "resource_attributes",
    "scope_spans",
    "spans",
    "events",
    "links",
    "attributes",  # of spans, events, links, scopes, and the entries of key-value list values
    "values",  # the elements of array values
    "other",  # any other repeated field: a resource's entity refs and their keys
)
_KIND_BY_FIELD = {
    "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest.resource_spans": "resource_spans",
    "opentelemetry.proto.resource.v1.Resource.attributes": "resource_attributes",
    "opentelemetry.proto.trace.v1.ResourceSpans.scope_spans": "scope_spans",
    "opentelemetry.proto.trace.v1.ScopeSpans.spans": "spans",
    "opentelemetry.proto.trace.v1.Span.events": "events",
    "opentelemetry.proto.trace.v1.Span.links": "links",
    "opentelemetry.proto.common.v1.ArrayValue.values": "values",
}
_KIND_BY_TYPE = {"opentelemetry.proto.common.v1.KeyValue": "attributes"}
MAX_NESTING = 100  # messages below the request: upb's own limit, so the parser, not the scan, refuses deeper
# What one parsed object costs in memory besides its bytes (upb, measured: a key-value, an event or an array
# element 48-65 bytes, a span 180).
OBJECT_BYTES, SPAN_BYTES = 64, 192


class WireError(ValueError):
    """The body is not a well-formed protobuf message (truncated, a length past its end, a bad tag)."""


class TooMany(ValueError):
    """The body holds more of ``kind`` than its bound."""

    def __init__(self, kind: str, bound: int) -> None:
        super().__init__(f"more than {bound:,} {kind.replace('_', ' ')} in one request")
        self.kind = kind
        self.bound = bound


@dataclass(frozen=True)
class WireCounts:
    """What a body would build: the elements of each kind, every object, its size."""

    counts: Mapping[str, int]
    objects: int  # every message (repeated or not, the request included) and repeated string
    size: int  # bytes on the wire

    @property
    def memory(self) -> int:
        """An estimate of the parsed request's size in memory: its bytes and each object's own."""
        return self.size + OBJECT_BYTES * self.objects + (SPAN_BYTES - OBJECT_BYTES) * self.counts["spans"]


def kind_of(field: FieldDescriptor) -> str:
    """The kind a repeated field's elements count as."""
    message = field.message_type.full_name if field.message_type is not None else ""
    return _KIND_BY_FIELD.get(field.full_name) or _KIND_BY_TYPE.get(message) or "other"


# One schema per message type: field number -> (the field's message schema or None, the index of its kind in
# KINDS or -1 when it is not repeated): plain dicts, tuples and ints, which the scan's inner loop reads fast.
_Schema = dict[int, tuple["_Schema | None", int]]


def _compile(root: Descriptor) -> _Schema:
    schemas: dict[str, _Schema] = {}

    def schema_of(descriptor: Descriptor) -> _Schema:
        if descriptor.full_name in schemas:
            return schemas[descriptor.full_name]
        schema: _Schema = {}
        schemas[descriptor.full_name] = schema  # before its fields: AnyValue nests itself
        for f in descriptor.fields:
            message = f.message_type if f.type == FieldDescriptor.TYPE_MESSAGE else None
            child = None if message is None else schema_of(message)
            if f.is_repeated:
                schema[f.number] = (child, KINDS.index(kind_of(f)))
            elif child is not None:
                schema[f.number] = (child, -1)
        return schema

    return schema_of(root)


_REQUEST = _compile(ExportTraceServiceRequest.DESCRIPTOR)
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = range(6)


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; WireError past ``end`` or over 10 bytes."""
    value = shift = 0
    while pos < end and shift < 70:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise WireError("a varint runs past its message or over 10 bytes")


def scan(data: bytes, bounds: Mapping[str, int]) -> WireCounts:
    """Count what ``data``, an ExportTraceServiceRequest on the wire, holds; TooMany at the first kind past
    its bound in ``bounds`` (a kind not named is unbounded), WireError when it is not well-formed."""
    limit = [bounds.get(kind, -1) for kind in KINDS]
    counts = [0] * len(KINDS)
    objects = 1
    stack: list[tuple[_Schema, int]] = []  # the enclosing messages: their schema and where they end
    schema, pos, end = _REQUEST, 0, len(data)
    groups = 0  # unknown groups open (skipped, as upb keeps them unparsed)
    while True:
        if pos >= end:
            if groups:
                raise WireError("a group not closed")
            if not stack:
                break
            schema, end = stack.pop()
            continue
        tag = data[pos]
        if tag < 0x80:  # the inner loop: a one-byte tag and length are the common case
            pos += 1
        else:
            tag, pos = _varint(data, pos, end)
        wire, number = tag & 7, tag >> 3
        if number == 0:
            raise WireError("field number 0")
        if wire == _LEN:
            if pos < end and data[pos] < 0x80:
                length = data[pos]
                pos += 1
            else:
                length, pos = _varint(data, pos, end)
            if pos + length > end:
                raise WireError("a length past the end of its message")
            field = None if groups else schema.get(number)
            if field is None:
                pos += length
                continue
            child, kind = field
            if kind >= 0:
                counts[kind] += 1
                if counts[kind] > limit[kind] >= 0:
                    raise TooMany(KINDS[kind], limit[kind])
            objects += 1
            if child is None:
                pos += length
                continue
            if len(stack) >= MAX_NESTING:
                raise WireError(f"messages nested deeper than {MAX_NESTING}")
            stack.append((schema, end))
            schema, end = child, pos + length
        elif wire == _VARINT:
            _, pos = _varint(data, pos, end)
        elif wire == _I64:
            pos += 8
        elif wire == _I32:
            pos += 4
        elif wire == _SGROUP:
            groups += 1
            if groups > MAX_NESTING:
                raise WireError(f"groups nested deeper than {MAX_NESTING}")
        elif wire == _EGROUP and groups:
            groups -= 1
        else:
            raise WireError(f"wire type {wire} of field {number}")
        if pos > end:
            raise WireError("a fixed-size field past the end of its message")
    return WireCounts(dict(zip(KINDS, counts, strict=True)), objects, len(data))
