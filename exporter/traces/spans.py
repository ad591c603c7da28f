"""What the relay does to Triton's spans: ECS context on the resource, the right span kinds, per-phase latency.

Triton (2.51, opentelemetry-cpp 1.13) marks every span SERVER and sets no
status. Under the ``InferRequest`` root it opens one span per model (events
REQUEST_START, QUEUE_START, REQUEST_END; attributes triton.model_name and
triton.model_version) and under that a ``compute`` span (COMPUTE_START,
COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END); an ensemble or a BLS
model has its steps' model spans under its own. The relay keeps the root
SERVER and marks every other Triton span INTERNAL, so the trace reads as one
server call with inner work, and reads the phases of each model request:

    queue           COMPUTE_START - QUEUE_START        (compute span - model span)
    compute_input   COMPUTE_INPUT_END - COMPUTE_START
    compute_infer   COMPUTE_OUTPUT_START - COMPUTE_INPUT_END
    compute_output  COMPUTE_END - COMPUTE_OUTPUT_START
    request         REQUEST_END - REQUEST_START        (the model's whole server time)

A compute span ends before its model span, so it arrives in the same
export batch or an earlier one; unmatched compute spans wait in a bounded
table for a short while.

:func:`check` holds a request to what X-Ray and Triton allow before the relay
takes it: ids of their exact lengths and not all zero (a 16-byte trace id, an
8-byte span id), a model name no longer than a model directory's name can be
(255 bytes), a version no longer than an int64.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

TRITON_SCOPE = "triton-server"
ROOT_SPAN = "InferRequest"
COMPUTE_SPAN = "compute"
MODEL_NAME = "triton.model_name"
MODEL_VERSION = "triton.model_version"
PHASES = ("queue", "compute_input", "compute_infer", "compute_output", "request")
PENDING_LIMIT = 10_000  # compute spans waiting for their model span
PENDING_SECONDS = 30.0
MAX_MODEL_NAME_BYTES = 255  # a model is a directory of the repository: its name is one file name (NAME_MAX)
MAX_VERSION_CHARS = 19  # a version is a directory named by a positive int64
TRACE_ID_BYTES, SPAN_ID_BYTES = 16, 8
MAX_REQUEST_ID_CHARS = 128  # a client's own "id": kept whole in the span, clipped in our log lines


class SpanRefused(ValueError):
    """A request holds a span the relay does not take; ``reason`` is the counter's: bad_id or over_limit."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ModelRequest:
    """One model's part of one traced request: its phases in milliseconds and the ids to find it by."""

    model: str
    version: str
    trace_id: str  # 32 hex digits (W3C, what X-Ray and the logs show)
    span_id: str  # the model span
    phases: Mapping[str, float]
    request_id: str = ""


def _events(span: Span) -> dict[str, int]:
    return {e.name: e.time_unix_nano for e in span.events}


def _attr(span: Span, key: str) -> str:
    """A string or integer attribute as text; any other kind of value (a list, bytes, a map) reads as absent."""
    for kv in span.attributes:
        if kv.key == key:
            which = kv.value.WhichOneof("value")
            if which == "string_value":
                return kv.value.string_value
            if which == "int_value":
                return str(kv.value.int_value)
            return ""
    return ""


def _check_id(value: bytes, size: int, what: str, where: str, optional: bool = False) -> None:
    if optional and not value:
        return
    if len(value) != size:
        raise SpanRefused("bad_id", f"{where}: {what} of {len(value)} bytes; it must be {size}")
    if not value.strip(b"\0"):
        raise SpanRefused("bad_id", f"{where}: {what} all zero")


def check(resource_spans: Iterable[ResourceSpans]) -> None:
    """SpanRefused when a span's ids or a Triton model span's attributes are not what X-Ray and Triton allow."""
    for i, rs in enumerate(resource_spans):
        for j, ss in enumerate(rs.scope_spans):
            triton = ss.scope.name == TRITON_SCOPE
            for k, span in enumerate(ss.spans):
                where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                _check_id(span.trace_id, TRACE_ID_BYTES, "trace id", where)
                _check_id(span.span_id, SPAN_ID_BYTES, "span id", where)
                _check_id(span.parent_span_id, SPAN_ID_BYTES, "parent span id", where, optional=True)
                for n, link in enumerate(span.links):
                    _check_id(link.trace_id, TRACE_ID_BYTES, "trace id", f"{where}.links[{n}]")
                    _check_id(link.span_id, SPAN_ID_BYTES, "span id", f"{where}.links[{n}]")
                if not triton:
                    continue
                model = _attr(span, MODEL_NAME)
                if len(model.encode("utf-8", "surrogatepass")) > MAX_MODEL_NAME_BYTES:
                    raise SpanRefused(
                        "over_limit",
                        f"{where}: {MODEL_NAME} of {len(model.encode('utf-8', 'surrogatepass'))} bytes; "
                        f"a Triton model name is at most {MAX_MODEL_NAME_BYTES}",
                    )
                if len(_attr(span, MODEL_VERSION)) > MAX_VERSION_CHARS:
                    raise SpanRefused(
                        "over_limit", f"{where}: {MODEL_VERSION} longer than {MAX_VERSION_CHARS} characters"
                    )


def _ms(later: int | None, earlier: int | None) -> float | None:
    if later is None or earlier is None or later < earlier:
        return None
    return (later - earlier) / 1e6


def phases_of(model_span: Span, compute_span: Span | None) -> dict[str, float]:
    """The phases the two spans' events give (a missing event or a negative gap leaves a phase out)."""
    m = _events(model_span)
    out: dict[str, float | None] = {"request": _ms(m.get("REQUEST_END"), m.get("REQUEST_START"))}
    if compute_span is not None:
        c = _events(compute_span)
        out["queue"] = _ms(c.get("COMPUTE_START"), m.get("QUEUE_START"))
        out["compute_input"] = _ms(c.get("COMPUTE_INPUT_END"), c.get("COMPUTE_START"))
        out["compute_infer"] = _ms(c.get("COMPUTE_OUTPUT_START"), c.get("COMPUTE_INPUT_END"))
        out["compute_output"] = _ms(c.get("COMPUTE_END"), c.get("COMPUTE_OUTPUT_START"))
    return {k: v for k, v in out.items() if v is not None}


def resource_attributes(context: Mapping[str, object]) -> list[KeyValue]:
    """Resource attributes from ECS context values (strings, ints or lists of strings)."""
    out = []
    for key, value in context.items():
        if isinstance(value, list):
            av = AnyValue()
            av.array_value.values.extend(AnyValue(string_value=str(v)) for v in value)
        elif isinstance(value, int) and not isinstance(value, bool):
            av = AnyValue(int_value=value)
        else:
            av = AnyValue(string_value=str(value))
        out.append(KeyValue(key=key, value=av))
    return out


@dataclass
class SpanProcessor:
    """Rewrites a request's spans in place and yields the model requests they complete."""

    context: Callable[[], Mapping[str, object]]  # resource attributes to add (ECS); read per batch
    clock: Callable[[], float] = time.monotonic
    pending: OrderedDict[bytes, tuple[float, Span]] = field(default_factory=OrderedDict)
    unmatched: int = 0  # compute spans whose model span never came within the bound: phases not measured

    def process(self, resource_spans: list[ResourceSpans]) -> Iterator[ModelRequest]:
        extra = resource_attributes(self.context())
        now = self.clock()
        self._expire(now)
        for rs in resource_spans:
            if extra:
                keys = {kv.key for kv in extra}
                kept = [kv for kv in rs.resource.attributes if kv.key not in keys]
                del rs.resource.attributes[:]
                rs.resource.attributes.extend([*kept, *extra])
            for ss in rs.scope_spans:
                if ss.scope.name != TRITON_SCOPE:
                    continue
                computes = {s.parent_span_id: s for s in ss.spans if s.name == COMPUTE_SPAN}
                for span in ss.spans:
                    if span.name != ROOT_SPAN:
                        span.kind = Span.SPAN_KIND_INTERNAL
                for span in ss.spans:
                    model = _attr(span, MODEL_NAME)
                    if not model:
                        continue
                    compute = computes.pop(span.span_id, None)
                    if compute is None:
                        waiting = self.pending.pop(span.span_id, None)
                        compute = waiting[1] if waiting else None
                    yield ModelRequest(
                        model,
                        _attr(span, MODEL_VERSION),
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        phases_of(span, compute),
                        _attr(span, "triton.request_id")[:MAX_REQUEST_ID_CHARS],
                    )
                for parent, compute in computes.items():  # model span still to come
                    self.pending[parent] = (now, compute)
        while len(self.pending) > PENDING_LIMIT:
            self.pending.popitem(last=False)
            self.unmatched += 1

    def _expire(self, now: float) -> None:
        while self.pending:
            parent, (seen, _) = next(iter(self.pending.items()))
            if now - seen <= PENDING_SECONDS:
                return
            del self.pending[parent]
            self.unmatched += 1
