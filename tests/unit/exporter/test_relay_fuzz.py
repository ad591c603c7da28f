"""Crash-fuzzing the trace relay: its parser, checks, span processor and window, and its HTTP front door.

The input is anything: OTLP-shaped JSON built from a pool of the fields and values that matter (ids of every
length, hex and not, proto field names, nested attribute values, events, links), mutations of Triton's own
batch (byte flips, insertions, deletions, truncation) as JSON and as protobuf, random protobuf messages with
ids of any length, and raw bytes on the port. The properties:

- parsing raises nothing but BadRequest, always a 4xx;
- a request that passes has only ids X-Ray takes (16-byte trace ids, 8-byte span ids, not all zero) and
  model names of at most 255 bytes;
- processing and measuring it, and taking the window, never raise, and the window keeps only listed models;
- the port answers a status line (or closes) and keeps serving.

RELAY_FUZZ_EXAMPLES sets the example count per property (default 100: a few seconds in the suite;
docs/reliability.md records a longer run).
"""

from __future__ import annotations

import os
import socket

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from exporter.traces.receiver import BadRequest, parse
from exporter.traces.relay import TraceRelay
from exporter.traces.spans import MAX_MODEL_NAME_BYTES, SpanProcessor
from exporter.traces.window import PhaseWindow
from tests.support.paths import FIXTURES

EXAMPLES = int(os.environ.get("RELAY_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
FIXTURE = FIXTURES / "traces" / "triton-2.51-add.json"
SEED_JSON = FIXTURE.read_bytes()
LISTED = frozenset({("add", "1"), ("m", "1")})


def _seed_proto() -> bytes:
    from telemetry.otlp.otlpjson import traces_request

    return traces_request(SEED_JSON).SerializeToString()


SEED_PROTO = _seed_proto()

# --- strategies ------------------------------------------------------------------------------------------

hexes = st.text(alphabet="0123456789abcdefABCDEFxyz", min_size=0, max_size=40)
ids = st.one_of(hexes, st.sampled_from(["0" * 32, "0" * 16, "", "AQEBAQEBAQEBAQEBAQEB"]), st.integers(-5, 5), st.none())
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=20)
)
any_value = st.recursive(
    st.one_of(
        st.builds(lambda v: {"stringValue": v}, st.one_of(st.text(max_size=8), st.just("m" * 256))),
        st.builds(lambda v: {"intValue": v}, st.one_of(st.integers(-(2**63), 2**63 - 1).map(str), st.text(max_size=5))),
        st.builds(lambda v: {"doubleValue": v}, st.floats(allow_nan=False)),
        st.builds(lambda v: {"boolValue": v}, st.booleans()),
        scalars,
    ),
    lambda inner: st.one_of(
        st.builds(lambda vs: {"arrayValue": {"values": vs}}, st.lists(inner, max_size=3)),
        st.builds(
            lambda kvs: {"kvlistValue": {"values": [{"key": k, "value": v} for k, v in kvs]}},
            st.lists(st.tuples(st.text(max_size=5), inner), max_size=3),
        ),
    ),
    max_leaves=3,
)
attribute = st.builds(
    lambda k, v: {"key": k, "value": v},
    st.sampled_from(["triton.model_name", "triton.model_version", "triton.request_id", "k", ""]),
    any_value,
)
event = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["REQUEST_START", "REQUEST_END", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "x"]),
        "timeUnixNano": st.one_of(st.integers(0, 2**64 - 1).map(str), st.integers(-5, 5), st.text(max_size=3)),
    },
)
span = st.fixed_dictionaries(
    {},
    optional={
        "traceId": ids,
        "spanId": ids,
        "parentSpanId": ids,
        "trace_id": ids,
        "span_id": ids,
        "name": st.sampled_from(["InferRequest", "compute", "add", "m", ""]),
        "kind": st.one_of(st.integers(-1, 6), st.sampled_from(["SPAN_KIND_SERVER", "nope"])),
        "attributes": st.lists(attribute, max_size=3),
        "events": st.lists(event, max_size=4),
        "links": st.lists(st.fixed_dictionaries({}, optional={"traceId": ids, "spanId": ids}), max_size=2),
        "startTimeUnixNano": st.integers(0, 2**64 - 1).map(str),
    },
)
document = st.builds(
    lambda spans, scope, extra: {
        "resourceSpans": [
            {"resource": {"attributes": extra}, "scopeSpans": [{"scope": {"name": scope}, "spans": spans}]}
        ]
    },
    st.lists(span, max_size=5),
    st.sampled_from(["triton-server", "other", ""]),
    st.lists(attribute, max_size=2),
)


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        else:
            del data[at:]
    return bytes(data)


def random_proto(spans: list[tuple[bytes, bytes, bytes, str]]) -> bytes:
    request = ExportTraceServiceRequest()
    ss = request.resource_spans.add().scope_spans.add()
    ss.scope.name = "triton-server"
    for trace, span_id, parent, model in spans:
        s = ss.spans.add(trace_id=trace, span_id=span_id, parent_span_id=parent, name=model)
        s.attributes.add(key="triton.model_name").value.string_value = model
        s.events.add(name="REQUEST_START", time_unix_nano=1)
        s.events.add(name="REQUEST_END", time_unix_nano=2_000_000)
    return request.SerializeToString()


proto_spans = st.lists(
    st.tuples(
        st.binary(max_size=20), st.binary(max_size=10), st.binary(max_size=10), st.sampled_from(["add", "m", "x" * 256])
    ),
    max_size=6,
)

# --- the property --------------------------------------------------------------------------------------------


def relay_once(body: bytes, content_type: str, encoding: str = "") -> None:
    try:
        request = parse(body, content_type, encoding).request
    except BadRequest as exc:
        assert 400 <= exc.status < 500 and str(exc)
        return
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for s in ss.spans:
                assert len(s.trace_id) == 16 and any(s.trace_id), s.trace_id
                assert len(s.span_id) == 8 and any(s.span_id), s.span_id
                assert len(s.parent_span_id) in (0, 8)
                for kv in s.attributes:
                    if kv.key == "triton.model_name" and kv.value.WhichOneof("value") == "string_value":
                        assert len(kv.value.string_value.encode("utf-8", "surrogatepass")) <= MAX_MODEL_NAME_BYTES
    window = PhaseWindow()
    window.record(list(SpanProcessor(dict).process(list(request.resource_spans))), LISTED)
    exposition, _ = window.take(LISTED)
    assert window.failures == 0
    assert {key[:2] for key in window.histograms} <= LISTED
    assert all(v >= 0 for samples in exposition.samples.values() for v in samples.values())


@FUZZ
@given(document)
def test_otlp_shaped_json(doc: dict[str, object]) -> None:
    relay_once(orjson.dumps(doc), "application/json")


@FUZZ
@given(mutated(SEED_JSON))
def test_mutations_of_tritons_own_batch_as_json(body: bytes) -> None:
    relay_once(body, "application/json")


@FUZZ
@given(mutated(SEED_PROTO))
def test_mutations_of_tritons_own_batch_as_protobuf(body: bytes) -> None:
    relay_once(body, "application/x-protobuf")


@FUZZ
@given(proto_spans)
def test_protobuf_spans_with_ids_of_any_length(spans: list[tuple[bytes, bytes, bytes, str]]) -> None:
    relay_once(random_proto(spans), "application/x-protobuf")


@FUZZ
@given(
    st.binary(max_size=300),
    st.sampled_from(["application/json", "application/x-protobuf"]),
    st.sampled_from(["", "gzip"]),
)
def test_arbitrary_bytes(body: bytes, content_type: str, encoding: str) -> None:
    relay_once(body, content_type, encoding)


@pytest.fixture(scope="module")
def relay():
    relay = TraceRelay("127.0.0.1", 0, dict, listed=lambda: LISTED).start()
    yield relay
    relay.close(2.0)


HTTP_PIECES = [
    b"POST /v1/traces HTTP/1.1\r\n",
    b"GET / HTTP/1.0\r\n",
    b"Content-Type: application/json\r\n",
    b"Content-Type: application/x-protobuf\r\n",
    b"Content-Length: 2\r\n",
    b"Content-Length: 99999999999999999999\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Encoding: gzip\r\n",
    b"Expect: 100-continue\r\n",
    b"Connection: close\r\n",
    b"\r\n",
    b"\n",
    b"{}",
    b"\x00\xff",
    b" ",
]


@settings(max_examples=max(EXAMPLES // 3, 10), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.sampled_from(HTTP_PIECES), st.binary(max_size=30)), max_size=12))
def test_raw_bytes_on_the_port_get_a_status_line_or_a_close_and_the_relay_keeps_serving(relay, pieces) -> None:
    with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as s:
        s.sendall(b"".join(pieces))
        s.shutdown(socket.SHUT_WR)  # the relay sees the end: it answers or closes, never waits for the deadline
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer[:100]
    for status in answer.split(b"HTTP/1.1 ")[1:]:
        assert status[:3].isdigit() and status[:1] in b"12345"
    with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "
            + str(len(SEED_JSON)).encode()
            + b"\r\n\r\n"
            + SEED_JSON
        )
        assert s.recv(12) == b"HTTP/1.1 200"
