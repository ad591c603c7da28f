"""The trace relay's trust boundary, issue 36: what a protobuf body holds is bounded by counts before it is
built, the relay's queue by the requests' size in memory, and the request head is read without a
regular expression that can backtrack.

Each finding has an outcome test on a real relay on a loopback port that fails without the fix.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from exporter.traces import receiver
from exporter.traces.receiver import BadRequest, Limits, parse
from exporter.traces.relay import TraceRelay
from exporter.traces.wire import KINDS, TooMany, WireError, kind_of, scan
from tests.support.paths import FIXTURES

FIXTURE = FIXTURES / "traces" / "triton-2.51-add.json"  # 3 requests of model add, 9 spans
PROTOBUF = "application/x-protobuf"
TRACE, SPAN = bytes(range(1, 17)), bytes(range(1, 9))


def _len_delimited(field: int, payload: bytes) -> bytes:
    n, length = len(payload), b""
    while n >= 0x80:
        length += bytes([n & 0x7F | 0x80])
        n >>= 7
    return bytes([field << 3 | 2]) + length + bytes([n]) + payload


def empty_resource_attributes(n: int) -> bytes:
    """The issue's body: one resource of ``n`` empty attributes, 2 bytes each on the wire."""
    return _len_delimited(1, _len_delimited(1, b"\x0a\x00" * n))


def triton_batch(spans: int = 512) -> ExportTraceServiceRequest:
    """Triton's batch as it posts it: one resource, one scope, ``spans`` spans of the fixture's shape."""
    request = parse(FIXTURE.read_bytes(), "application/json", "").request
    ss = request.resource_spans[0].scope_spans[0]
    nine = list(ss.spans)
    del ss.spans[:]
    for i in range(spans):
        ss.spans.append(nine[i % 9])
        ss.spans[-1].span_id = (i + 1).to_bytes(8, "big")
    return request


def post(port: int, body: bytes, ctype: str = "application/json", timeout: float = 60.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/traces", body, {"Content-Type": ctype})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture
def make_relay() -> Iterator[Callable[..., TraceRelay]]:
    relays: list[TraceRelay] = []

    def make(**kwargs: object) -> TraceRelay:
        relay = TraceRelay("127.0.0.1", 0, lambda: {"aws.ecs.task.arn": "arn"}, **kwargs).start()  # type: ignore[arg-type]
        relays.append(relay)
        return relay

    yield make
    for relay in relays:
        relay.close(2.0)


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class PeakRss:
    """The process's resident memory at its highest while the block runs, above what it was before."""

    def __enter__(self) -> PeakRss:
        self.before = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def grew(self) -> int:
        return self.peak - self.before


# --- 1. a protobuf body is bounded by what it holds, before it is built --------------------------------------


def test_two_million_empty_resource_attributes_are_refused_before_they_are_built(make_relay) -> None:
    """Issue 36: one 4 MB body of 2 million empty resource attributes took the exporter from 44 to 520 MB
    (upb built 110 MB of it, the relay's processing the rest); eight at once, 1.3 GB."""
    relay = make_relay()
    body = empty_resource_attributes(2_000_000)
    assert len(body) <= Limits().body_bytes  # within the byte bound: only counting catches it
    post(relay.port, FIXTURE.read_bytes())  # the relay's own first-request allocations, out of the measurement
    assert relay.drain(10)
    with PeakRss() as rss:
        status, answer = post(relay.port, body, PROTOBUF)
        assert relay.drain(30)
    assert status == 400 and b"more than 10,000 resource attributes" in answer, answer
    # the body is held three times over on its way (read, copied, handed to the parser): 12 MB; parsing it
    # would add 110 MB and processing it 400 MB more
    assert rss.grew < 48 * 2**20, f"RSS grew {rss.grew / 2**20:.0f} MiB"
    counts = relay.counts()
    assert counts.requests_invalid["over_limit"] == 1 and counts.spans_received == 9
    assert post(relay.port, FIXTURE.read_bytes()) == (200, b"{}")  # still serving


def _one_span() -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.resource_spans.add().scope_spans.add().spans.add(trace_id=TRACE, span_id=SPAN, name="x")
    return request


def _list_value(span: Span) -> Any:
    """The values of the span's attribute ``list`` (an array), added the first time."""
    if not span.attributes:
        span.attributes.add(key="list")
    return span.attributes[0].value.array_value.values


def _with(kind: str, n: int) -> ExportTraceServiceRequest:
    """A request of one span (valid ids) with ``n`` of ``kind`` beside it."""
    request = _one_span()
    rs = request.resource_spans[0]
    span = rs.scope_spans[0].spans[0]
    add: Callable[[], object] = {
        "resource_spans": request.resource_spans.add,
        "resource_attributes": rs.resource.attributes.add,
        "scope_spans": rs.scope_spans.add,
        "spans": lambda: rs.scope_spans[0].spans.add(trace_id=TRACE, span_id=SPAN),
        "events": span.events.add,
        "links": lambda: span.links.add(trace_id=TRACE, span_id=SPAN),
        "attributes": span.attributes.add,
        "values": lambda: _list_value(span).add(),
        "other": rs.resource.entity_refs.add,
    }[kind]
    for _ in range(n - (kind in ("resource_spans", "scope_spans", "spans"))):
        add()
    return request


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_that_multiplies_is_bounded_at_its_limit(kind: str) -> None:
    """Each kind is admitted up to its bound and refused one past it, as protobuf and as JSON alike."""
    limits = Limits(**{kind: 40})  # type: ignore[arg-type]
    at, past = _with(kind, 40).SerializeToString(), _with(kind, 41).SerializeToString()
    assert parse(at, PROTOBUF, "", limits).counts.counts[kind] == 40
    with pytest.raises(BadRequest) as info:
        parse(past, PROTOBUF, "", limits)
    assert (info.value.status, info.value.reason) == (400, "over_limit")
    assert f"more than 40 {kind.replace('_', ' ')}" in str(info.value)
    from google.protobuf import json_format

    as_json = json_format.MessageToJson(ExportTraceServiceRequest.FromString(past)).encode()
    as_json = as_json.replace(b'"AQIDBAUGBwgJCgsMDQ4PEA=="', b'"0102030405060708090a0b0c0d0e0f10"')
    as_json = as_json.replace(b'"AQIDBAUGBwg="', b'"0102030405060708"')  # OTLP/JSON ids are hex
    with pytest.raises(BadRequest) as info:
        parse(as_json, "application/json", "", limits)
    assert info.value.reason == "over_limit" and f"more than 40 {kind.replace('_', ' ')}" in str(info.value)


def test_the_bounds_admit_tritons_batches_with_room_to_spare() -> None:
    """Triton posts at most 512 spans a batch; X-Ray takes 10,000 spans a request: both pass every bound."""
    for spans in (512, 10_000):
        counts = parse(triton_batch(spans).SerializeToString(), PROTOBUF, "").counts
        limits = Limits().counts()
        assert all(counts.counts[k] <= limits[k] for k in KINDS), counts
    counts = parse(triton_batch(512).SerializeToString(), PROTOBUF, "").counts
    assert counts.counts["events"] * 20 < Limits().events and counts.counts["attributes"] * 20 < Limits().attributes
    assert 200_000 < counts.memory < 1_000_000  # upb holds it in about 400 KB


def test_the_queue_is_bounded_by_size_in_memory_not_by_protobuf_size(make_relay) -> None:
    """A request of 9,000 empty attributes is 18 KB of protobuf and over 600 KB in memory: a queue bounded by
    protobuf size took 16 times what it was meant to hold."""
    relay = make_relay(max_queued_bytes=300_000)
    request = _with("attributes", 9_000)
    assert request.ByteSize() < 30_000
    status, answer = post(relay.port, request.SerializeToString(), PROTOBUF)
    assert status == 200 and ExportTraceServiceResponse.FromString(answer).partial_success.rejected_spans == 1
    small = _with("attributes", 100).SerializeToString()
    status, answer = post(relay.port, small, PROTOBUF)
    assert status == 200 and ExportTraceServiceResponse.FromString(answer).partial_success.rejected_spans == 0
    assert relay.drain(10)
    assert relay.counts().spans_dropped["queue_full"] == 1


# --- the scan agrees with the parser ------------------------------------------------------------------------


def _tree(message: Message, out: Counter[str]) -> Counter[str]:
    """What the parsed message holds, counted the scan's way."""
    for field, value in message.ListFields():
        if field.is_repeated:
            out[kind_of(field)] += len(value)
            if field.message_type is not None:
                for item in value:
                    _tree(item, out)
        elif field.message_type is not None:
            _tree(value, out)
    return out


@st.composite
def mutated_batch(draw: st.DrawFn) -> bytes:
    data = bytearray(SEED)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip":
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=6))
        else:
            del data[at : at + draw(st.integers(1, 8))]
    return bytes(data)


SEED = triton_batch(9).SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated_batch())
def test_the_scan_counts_what_the_parser_builds(body: bytes) -> None:
    """Whatever the bytes, the scan raises only its own errors, and on a body the parser takes it counts what
    the parser built (more only where a later oneof member replaced an earlier one, which upb still holds)."""
    try:
        counts = scan(body, {})
    except WireError:
        return
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except Exception:  # not UTF-8, a bad group: the parser's to refuse
        return
    built = _tree(request, Counter())
    for kind in KINDS:
        if kind in ("attributes", "values"):  # inside AnyValue's oneof
            assert counts.counts[kind] >= built[kind], kind
        else:
            assert counts.counts[kind] == built[kind], kind


def test_the_scan_refuses_what_the_parser_cannot_read() -> None:
    for body in (b"\x0a\x05\x0a\x00", b"\x0a", b"\x08\xff\xff", b"\x00\x00", b"\x0e", b"\x0b\x0a\x00"):
        with pytest.raises(WireError):
            scan(body, {})
    with pytest.raises(TooMany):
        scan(empty_resource_attributes(3), {"resource_attributes": 2})


# --- 2. the request head is read without backtracking -------------------------------------------------------


def test_a_header_line_of_16000_spaces_is_read_at_once(make_relay) -> None:
    """Issue 36: ``A:x`` + 16,000 spaces + ``y`` held the relay's event loop 1.1 s (a backtracking regex); a
    client could repeat it at will. Now it is answered like any other request, and one behind it as fast."""
    relay = make_relay()
    body = FIXTURE.read_bytes()
    head = b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    hostile = head + b"A:x" + b" " * 16_000 + b"y\r\nConnection: close\r\n\r\n" + body
    assert len(hostile) - len(body) < Limits().head_bytes

    raw = hostile[: hostile.index(b"\r\n\r\n")]
    start = time.perf_counter()
    parsed = receiver._parse_head(raw, Limits())
    assert time.perf_counter() - start < 0.2  # the regex took 1.1 s; this takes well under a millisecond
    assert parsed.headers["a"] == "x" + " " * 16_000 + "y"

    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", relay.port)) as s:
        s.settimeout(30)
        s.sendall(hostile)
        assert s.recv(100).startswith(b"HTTP/1.1 200 ")
    assert post(relay.port, body) == (200, b"{}")
    assert time.perf_counter() - start < 0.5  # both requests: the regex alone took over 1 s


# The head parser as it was, with regular expressions: the reference the new one must agree with.
_OLD_HEAD_END = re.compile(rb"\r?\n\r?\n")
_OLD_LINE_END = re.compile(rb"\r?\n")
_OLD_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) ([\x21-\x7e]{1,8192}) HTTP/1\.([01])")
_OLD_HEADER = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*")
_OLD_STARTS_LIKE_HTTP = re.compile(rb"[A-Z][\x20-\x7e]*\r?")


def _old_parse_head(raw: bytes) -> object:
    lines = _OLD_LINE_END.split(raw)
    m = _OLD_REQUEST_LINE.fullmatch(lines[0])
    if m is None:
        return ("refused", 400)
    if len(lines) > receiver.MAX_HEADERS + 1:
        return ("refused", 431)
    head = receiver._Head(m[1].decode(), m[2].split(b"?")[0].decode(), int(m[3]))
    for line in lines[1:]:
        h = _OLD_HEADER.fullmatch(line)
        if h is None:
            return ("refused", 400)
        name, value = h[1].decode().lower(), h[2].decode("latin-1")
        if name in ("content-length", "content-type") and head.headers.get(name, value) != value:
            return ("refused", 400)
        head.headers[name] = value if name not in head.headers else f"{head.headers[name]}, {value}"
    return head


def _new_parse_head(raw: bytes) -> object:
    try:
        return receiver._parse_head(raw, Limits())
    except BadRequest as exc:
        return ("refused", exc.status)


HEAD_BYTES = st.binary(min_size=1, max_size=1) | st.sampled_from(
    [b" ", b"\t", b":", b"\r", b"\n", b"\r\n", b"A", b"x", b"?", b"/", b"-", b"!", b"\x00", b"\x7f", b"\xe9", b"\x0b"]
)
PIECES = st.sampled_from(
    [
        *(b"POST", b"GET", b" ", b"/v1/traces", b"?a=b", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"\r\n", b"\n"),
        *(b"Content-Type", b"Content-Length", b"content-length", b": ", b":", b"5", b"7", b"  ", b"\t", b"\r", b"X"),
    ]
)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(PIECES | HEAD_BYTES, max_size=30).map(b"".join))
def test_the_head_is_read_exactly_as_the_regular_expressions_read_it(data: bytes) -> None:
    """Same accept and refuse, same values, for any bytes: where the head ends, whether its first line can
    begin a request, and what the head says."""
    old_end = _OLD_HEAD_END.search(data)
    assert receiver._head_end(data) == (None if old_end is None else old_end.span())
    assert receiver._head_end(bytearray(data)) == (None if old_end is None else old_end.span())
    first_line = _OLD_LINE_END.split(data, 1)[0]
    old_starts = bool(_OLD_STARTS_LIKE_HTTP.fullmatch(first_line[:8300]))
    assert receiver._starts_like_http(bytearray(data)) == old_starts
    for raw in (data, b"POST /v1/traces HTTP/1.1\r\n" + data):
        assert repr(_new_parse_head(raw)) == repr(_old_parse_head(raw)), raw
