"""The trace relay's parts on a body Triton really sent (tests/fixtures/traces), and on hostile input."""

from __future__ import annotations

import gzip
import http.client
import json
import socket

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from exporter.series import model_key
from exporter.traces.receiver import BadRequest, Limits, parse
from exporter.traces.relay import TraceRelay
from exporter.traces.source import DROPPED, RECEIVED, TraceSource
from exporter.traces.spans import SpanProcessor, phases_of
from exporter.traces.window import BOUNDS_MS, LE, PhaseWindow, family
from telemetry.otlp.otlpjson import OtlpJsonError, traces_request
from telemetry.otlp.resource import ecs_resource
from tests.support.paths import FIXTURES

FIXTURE = FIXTURES / "traces" / "triton-2.51-add.json"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
TASK_ARN = "arn:aws:ecs:us-west-2:123456789012:task/prod/0123456789abcdef0123456789abcdef"
METADATA = {
    "ecs_cluster": "arn:aws:ecs:us-west-2:123456789012:cluster/prod",
    "ecs_task_arn": TASK_ARN,
    "ecs_task_family": "triton",
    "ecs_task_revision": "7",
    "availability_zone": "us-west-2a",
    "ecs_launch_type": "EC2",
}


def fixture_request() -> ExportTraceServiceRequest:
    return traces_request(FIXTURE.read_bytes())


def attrs(kvs) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        v = getattr(kv.value, which)
        out[kv.key] = [x.string_value for x in v.values] if which == "array_value" else v
    return out


def test_hex_ids_are_read_as_hex_not_base64() -> None:
    """protobuf's json_format would take the hex id for base64 and decode it to other bytes (seen)."""
    spans = fixture_request().resource_spans[0].scope_spans[0].spans
    roots = [s for s in spans if s.name == "InferRequest"]
    assert len(spans) == 9 and len(roots) == 3
    assert roots[0].trace_id.hex() == CLIENT_TRACE and len(roots[0].trace_id) == 16
    assert roots[0].parent_span_id.hex() == "b7ad6b7169203331"  # the client's span
    for bad, needle in (
        (b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz","spanId":"0123456789abcdef"}]}]}]}', "traceId"),
        (b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"' + b"g" * 32 + b'"}]}]}]}', "not hex"),
        (b"[1,2]", "not a JSON object"),
        (b"{", "not JSON"),
        (b'{"resourceSpans":{}}', "not an array"),
    ):
        with pytest.raises(OtlpJsonError, match=needle):
            traces_request(bad)


def test_spans_get_the_ecs_context_kinds_and_phases() -> None:
    request = fixture_request()
    context = ecs_resource(METADATA, "triton-server", ["/ecs/triton/exporter"])
    processor = SpanProcessor(lambda: context)
    found = list(processor.process(list(request.resource_spans)))
    resource = attrs(request.resource_spans[0].resource.attributes)
    assert resource["service.name"] == "triton-test"  # Triton's own attributes kept
    assert resource["aws.ecs.task.arn"] == TASK_ARN and resource["cloud.region"] == "us-west-2"
    assert resource["aws.ecs.cluster.arn"] == METADATA["ecs_cluster"]
    assert resource["aws.ecs.task.family"] == "triton" and resource["aws.ecs.task.revision"] == "7"
    assert resource["cloud.availability_zone"] == "us-west-2a" and resource["aws.ecs.launchtype"] == "ec2"
    assert resource["aws.log.group.names"] == ["/ecs/triton/exporter"] and resource["container.name"] == "triton-server"
    kinds = {(s.name, s.kind) for s in request.resource_spans[0].scope_spans[0].spans}
    assert kinds == {
        ("InferRequest", Span.SPAN_KIND_SERVER),
        ("add", Span.SPAN_KIND_INTERNAL),
        ("compute", Span.SPAN_KIND_INTERNAL),
    }
    assert len(found) == 3 and {r.model for r in found} == {"add"} and {r.version for r in found} == {"1"}
    first = next(r for r in found if r.trace_id == CLIENT_TRACE)
    # From the fixture's events: QUEUE_START ...85362310, COMPUTE_START ...85439941 and so on.
    assert first.phases["queue"] == pytest.approx((85439941 - 85362310) / 1e6)
    assert first.phases["compute_input"] == pytest.approx((85596106 - 85439941) / 1e6)
    assert first.phases["compute_infer"] == pytest.approx((102797817 - 85596106) / 1e6)
    assert first.phases["compute_output"] == pytest.approx((102902173 - 102797817) / 1e6)
    assert first.phases["request"] == pytest.approx((102982544 - 85339176) / 1e6)
    assert first.request_id == "req-1" and len(first.span_id) == 16


def test_a_compute_span_from_an_earlier_batch_still_gives_the_phases() -> None:
    request = fixture_request()
    spans = request.resource_spans[0].scope_spans[0].spans
    early, late = ExportTraceServiceRequest(), ExportTraceServiceRequest()
    for target, keep in ((early, "compute"), (late, None)):
        rs = target.resource_spans.add()
        ss = rs.scope_spans.add()
        ss.scope.name = "triton-server"
        ss.spans.extend(s for s in spans if (s.name == "compute") == (keep == "compute"))
    now = [0.0]
    processor = SpanProcessor(dict, clock=lambda: now[0])
    assert list(processor.process(list(early.resource_spans))) == []
    assert len(processor.pending) == 3
    got = list(processor.process(list(late.resource_spans)))
    assert len(got) == 3 and all("queue" in r.phases for r in got) and not processor.pending
    # A compute span whose model span never comes is forgotten after a while, and counted.
    list(processor.process(list(early.resource_spans)))
    now[0] = 31.0
    list(processor.process([]))
    assert processor.unmatched == 3 and not processor.pending


def test_phases_leave_out_what_the_events_do_not_give() -> None:
    model = Span(name="m")
    model.events.add(name="REQUEST_START", time_unix_nano=2_000_000)
    model.events.add(name="REQUEST_END", time_unix_nano=1_000_000)  # clock went backwards: no value
    assert phases_of(model, None) == {}


def test_the_window_keeps_cumulative_buckets_and_the_slowest_requests() -> None:
    from exporter.traces.spans import ModelRequest

    window = PhaseWindow()
    requests = [
        ModelRequest("m", "1", f"{i:032x}", f"{i:016x}", {"request": float(i), "queue": 0.5}) for i in range(1, 8)
    ]
    window.record(requests)
    exp, slowest = window.take()
    key = model_key("m", "1")
    # First shown at zero (the pipeline baselines a new series); the counts come with the next scrape.
    assert exp.samples[family("request") + "_count"][key] == 0
    exp, _ = window.take()
    assert [r.phases["request"] for r in slowest[key]] == [7.0, 6.0, 5.0]  # the three slowest, slowest first
    buckets = exp.samples[family("request") + "_bucket"]
    by_le = {exp.labels[k].get("le"): v for k, v in buckets.items()}
    assert by_le["+Inf"] == 7 and by_le["1"] == 1 and by_le["4"] == 4 and by_le["6.3"] == 6
    assert list(LE)[:2] == ["0.01", "0.016"] and BOUNDS_MS[-1] == 100_000
    assert exp.samples[family("request") + "_sum"][key] == sum(range(1, 8))
    window.record(requests[:1])
    exp2, slowest2 = window.take()  # cumulative counts grow; the slowest list restarts each window
    assert exp2.samples[family("request") + "_count"][key] == 8 and [r.phases["request"] for r in slowest2[key]] == [
        1.0
    ]


def test_receiver_answers_bad_input_with_4xx_and_keeps_serving() -> None:
    assert parse(FIXTURE.read_bytes(), "application/json", "")[1] is True
    proto = fixture_request().SerializeToString()
    assert parse(gzip.compress(proto), "application/x-protobuf", "gzip")[0] == fixture_request()
    for body, ctype, enc, status in (
        (b"garbage", "application/x-protobuf", "", 400),
        (b"{}", "text/plain", "", 415),
        (b"{}", "application/json", "br", 415),
        (b"not gzip", "application/json", "gzip", 400),
        (gzip.compress(b"\0" * (Limits().body_bytes + 10)), "application/x-protobuf", "gzip", 413),  # a gzip bomb
    ):
        with pytest.raises(BadRequest) as info:
            parse(body, ctype, enc)
        assert info.value.status == status


def post(port: int, body: bytes, ctype: str = "application/json", path: str = "/v1/traces") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", path, body, {"Content-Type": ctype})
    resp = conn.getresponse()
    out = resp.status, resp.read()
    conn.close()
    return out


def test_relay_over_http_counts_what_it_refuses_and_survives_garbage() -> None:
    relay = TraceRelay("127.0.0.1", 0, dict, max_queued_spans=12).start()
    source = TraceSource(relay)
    try:
        port = relay.receiver.port
        assert post(port, FIXTURE.read_bytes()) == (200, b"{}")
        assert relay.drain(5)  # 9 spans queued and 9 more would be over the bound of 12 until the worker runs
        status, body = post(port, fixture_request().SerializeToString(), "application/x-protobuf")
        assert status == 200 and ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans == 0
        assert relay.drain(5)
        assert post(port, b"\x00garbage", "application/x-protobuf")[0] == 400
        assert post(port, b"{}", "application/json", path="/v1/metrics")[0] == 404
        with socket.create_connection(("127.0.0.1", port)) as s:  # garbage on the port, then a hang-up
            s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
            s.recv(100)
        big = {"resourceSpans": [json.loads(FIXTURE.read_text())["resourceSpans"][0]] * 2}
        status, body = post(port, orjson.dumps(big))
        assert status == 200 and orjson.loads(body)["partialSuccess"]["rejectedSpans"] == "18"  # over the bound
        assert post(port, FIXTURE.read_bytes()) == (200, b"{}")  # still serving
        assert relay.drain(5)
        got = source.collect(1.0)
        assert got.samples.samples[RECEIVED][""] == 45
        dropped = {got.samples.labels[k].get("reason"): v for k, v in got.samples.samples[DROPPED].items()}
        assert dropped == {"queue_full": 18, "error": 0}
        assert relay.counts().requests_invalid["not_otlp"] == 1 and relay.counts().requests_invalid["path"] == 1
        assert relay.counts().requests_invalid["not_http"] == 1
        props = got.models[model_key("add", "1")]["slowest_traces"]
        assert len(props) == 3 and all(len(p["trace_id"]) == 32 and p["ms"] > 0 for p in props)
    finally:
        relay.close(2.0)


def test_a_relay_that_cannot_listen_is_a_clear_exit_2(capsys) -> None:
    from exporter.__main__ import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(
            [
                "--once",
                "--interval",
                "0.1",
                "--triton-url",
                "http://127.0.0.1:9",
                "--triton-metrics-url",
                "http://127.0.0.1:9/metrics",
                "--nvml",
                "off",
                "--traces-to",
                "otlp+http://127.0.0.1:9/v1/traces",
                "--traces-listen",
                f"127.0.0.1:{port}",
            ]
        )
    err = capsys.readouterr().err
    assert code == 2 and f"listen on 127.0.0.1:{port}" in err and err.count("\n") == 1


def test_the_dashboards_slow_request_query_reads_the_relays_log_line_as_firelens_ships_it() -> None:
    """The widget's parse pattern (Logs Insights' named groups are Python's) against the real log line."""
    import re

    from render.dashboard.logs import SLOW_REQUESTS
    from telemetry.logs import JsonFormatter
    from tests.support.helpers import Capture

    window_relay = TraceRelay("127.0.0.1", 0, dict)
    try:
        window_relay.window.record(list(SpanProcessor(dict).process(list(fixture_request().resource_spans))))
        with Capture.on("exporter.traces") as capture:
            TraceSource(window_relay).collect(1.0)
    finally:
        window_relay.close(1.0)
    lines = [JsonFormatter().format(r) for r in capture.records]
    assert len(lines) == 3
    pattern = re.search(r"\| parse @message /(.*)/\n", SLOW_REQUESTS).group(1).replace("(?<", "(?P<")
    for line in lines:
        firelens = orjson.dumps({"log": line, "source": "stderr", "container_name": "exporter"}).decode()
        got = re.search(pattern, firelens)
        assert got is not None, firelens
        fields = orjson.loads(line)
        assert got["trace_id"] == fields["trace_id"] and got["span_id"] == fields["span_id"]
        assert got["model"] == "add" and float(got["ms"]) == pytest.approx(fields["phases_ms"]["request"], abs=1e-3)


def test_a_span_flood_is_bounded_answered_and_counted_and_the_relay_keeps_working() -> None:
    """Many clients at once, a queue that cannot hold them all, an endpoint that is down: every request is
    answered (200, or 503 past the concurrent-request bound), every span is either processed or counted as
    refused, and afterwards the relay serves normally."""
    import threading

    from exporter.traces.forward import SpanForwarder
    from telemetry.otlp.endpoint import parse_endpoint
    from telemetry.otlp.exporter import ExportOptions

    with socket.socket() as s:  # a port nobody listens on: the endpoint is down
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    forwarder = SpanForwarder(
        parse_endpoint(f"otlp+http://127.0.0.1:{down}/v1/traces"),
        ExportOptions(capacity=100, linger=0.0, backoff_start=0.05, backoff_max=0.1, connect_timeout=0.2),
    )
    relay = TraceRelay("127.0.0.1", 0, dict, forwarder, max_queued_spans=200).start()
    statuses: list[int] = []
    lock = threading.Lock()
    body = FIXTURE.read_bytes()

    def client() -> None:
        for _ in range(10):
            try:
                status, _ = post(relay.receiver.port, body)
            except OSError:
                status = 0  # a connection the server closed at once (busy)
            with lock:
                statuses.append(status)

    try:
        threads = [threading.Thread(target=client) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert relay.drain(10)
        assert len(statuses) == 400 and set(statuses) <= {200, 503, 0}
        got = TraceSource(relay).collect(1.0)
        received = got.samples.samples[RECEIVED][""]
        dropped = {got.samples.labels[k].get("reason"): v for k, v in got.samples.samples[DROPPED].items()}
        ok = statuses.count(200)
        assert received == 9 * ok  # every request answered 200 was counted, every span of it
        assert dropped["queue_full"] == relay.counts().spans_dropped["queue_full"]
        assert post(relay.receiver.port, body)[0] == 200  # still serving
        assert relay.drain(5)
        after = relay.counts()
        processed = after.spans_received - after.spans_dropped["queue_full"]
        # What the worker processed went to the forwarder. With the endpoint down, once it is closed every
        # span is counted as lost, by reason: pushed out of its 100-span buffer, or never delivered.
        forwarder.close(0.5)
        counts = forwarder.counters()
        assert forwarder.exporter.stats().accepted == processed and counts["exported"] == 0
        assert counts["buffer_full"] > 0
        assert sum(v for k, v in counts.items() if k != "exported") == processed
    finally:
        relay.close(2.0)


def test_the_phase_histograms_also_go_out_as_otlp_histograms() -> None:
    """The OTLP metrics output sends every family a selected metric reads: the relay's phase histograms too,
    under their own names, as explicit-bucket histograms with the relay's bounds."""
    from catalog.otlp import plan
    from exporter.traces.spans import PHASES
    from tests.support.helpers import CATALOG

    sent = {f.name: f for f in plan(CATALOG).families}
    for phase in PHASES:
        assert sent[family(phase)].type == "histogram" and sent[family(phase)].source == "traces"
    assert "otlp_relay_spans_dropped_total" in sent
    assert "triton_trace_queue_ms" not in {f.name for f in plan(CATALOG.select("-Traced*")).families}
