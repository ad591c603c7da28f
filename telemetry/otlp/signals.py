"""What differs between OTLP signals: the message exported per item, the unit AWS limits, the response.

Traces and metrics share one request shape (``resource_*`` holding a
resource and ``scope_*``, each holding a scope and the items; the same
field numbers), so requests are assembled from already serialized parts:
each item is serialized once, when it is submitted, and a request is bytes
concatenated under length prefixes. That makes the request's size known
before it is built, and frees the producer to reuse its messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class Message(Protocol):
    """What is used of a protobuf message (google.protobuf ships no type stubs: not imported for types)."""

    def SerializeToString(self, *, deterministic: bool = ...) -> bytes: ...


class Response(Message, Protocol):
    def ParseFromString(self, serialized: bytes) -> int: ...


P = TypeVar("P", bound=Message)

MAX_REQUEST_BYTES = 5_000_000  # both endpoints: 5 MB uncompressed (AWS: CloudWatch-OTLPEndpoint)


@dataclass(frozen=True)
class Signal(Generic[P]):
    """One OTLP signal: its item type's unit and limits, and how to read the endpoint's answer."""

    name: str  # traces | metrics
    unit: str  # what AWS limits per request: spans | data points
    max_units: int  # per request
    max_item_bytes: int  # one serialized item
    units: Callable[[P], int]  # units in one item
    response: Callable[[], Response]  # the Export*ServiceResponse, for partial_success
    rejected_field: str  # partial_success's count of refused units


def data_points(metric: Metric) -> int:
    """A metric's data points, whatever its type (gauge, sum, histogram, exponential histogram, summary)."""
    kind = metric.WhichOneof("data")
    return len(getattr(metric, kind).data_points) if kind else 0


TRACES: Signal[Span] = Signal(
    name="traces",
    unit="spans",
    max_units=10_000,  # X-Ray OTLP: 10,000 spans per request
    max_item_bytes=200 * 1024,  # and 200 KB per span
    units=lambda span: 1,
    response=ExportTraceServiceResponse,
    rejected_field="rejected_spans",
)

METRICS: Signal[Metric] = Signal(
    name="metrics",
    unit="data points",
    max_units=1_000,  # CloudWatch OTLP: 1,000 data points per request (400 beyond)
    max_item_bytes=MAX_REQUEST_BYTES,  # no per-point limit published; an item must fit a request
    units=data_points,
    response=ExportMetricsServiceResponse,
    rejected_field="rejected_data_points",
)


# --- wire format: the request from serialized parts ------------------------------------------

FIELD_1, FIELD_2, FIELD_3 = b"\x0a", b"\x12", b"\x1a"  # length-delimited fields 1, 2, 3
PREFIX_MAX = 6  # a field tag and a length varint, at most (lengths below 2**35)


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, data: bytes) -> bytes:
    return tag + varint(len(data)) + data


def head(message: Message, schema_url: str) -> bytes:
    """A resource (or scope) and its schema URL: the first fields of ResourceX (or ScopeX), and its group key."""
    out = field(FIELD_1, message.SerializeToString(deterministic=True))
    return out + field(FIELD_3, schema_url.encode()) if schema_url else out


def encode(groups: dict[bytes, dict[bytes, list[bytes]]]) -> bytes:
    """Export*ServiceRequest bytes: resource head -> scope head -> serialized items."""
    out = []
    for resource, scopes in groups.items():
        inner = [resource]
        for scope, items in scopes.items():
            inner.append(field(FIELD_2, b"".join([scope, *(field(FIELD_2, item) for item in items)])))
        out.append(field(FIELD_1, b"".join(inner)))
    return b"".join(out)
