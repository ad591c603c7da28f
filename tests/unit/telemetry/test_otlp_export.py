"""OTLP/HTTP export (telemetry.otlp) against a local endpoint with real TLS, SigV4 checks and OTLP decoding.

The endpoint (tests/support/otlp_endpoint.py) recomputes each signature with
botocore and refuses a wrong one with 403 as AWS does, decodes the protobuf
it receives, and answers as each test scripts it: throttled, failing,
refusing, slow, partially rejecting, hanging up, or down.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import requests
from botocore.credentials import Credentials
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, NumberDataPoint
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from telemetry.otlp.endpoint import Endpoint, parse_endpoint
from telemetry.otlp.exporter import ExportOptions, ExportStats, OtlpHttpExporter, retry_after
from telemetry.otlp.signals import METRICS, TRACES
from telemetry.otlp.sigv4 import Signer
from tests.support.otlp_endpoint import ACCESS_KEY, SECRET_KEY, OtlpEndpoint, Reply

FAST = ExportOptions(linger=0.0, backoff_start=0.05, backoff_max=0.2, connect_timeout=1.0, timeout=5.0)
SCOPE = InstrumentationScope(name="triton-server")


def resource(name: str = "triton-inference-server") -> Resource:
    return Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value=name))])


def spans(n: int, start: int = 0, pad: int = 0) -> list[Span]:
    return [
        Span(
            name=f"s{i}",
            trace_id=i.to_bytes(16, "big"),
            span_id=(i + 1).to_bytes(8, "big"),
            attributes=[KeyValue(key="pad", value=AnyValue(string_value="x" * pad))] if pad else [],
        )
        for i in range(start, start + n)
    ]


def gauges(n: int, points: int = 1) -> list[Metric]:
    return [
        Metric(name=f"m{i}", gauge=Gauge(data_points=[NumberDataPoint(as_double=float(j)) for j in range(points)]))
        for i in range(n)
    ]


def span_names(endpoint: OtlpEndpoint) -> list[str]:
    return [
        s.name
        for r in endpoint.accepted()
        for rs in r.request.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]


def balanced(stats: ExportStats, pending: int = 0) -> bool:
    """Every accepted item is sent, counted as dropped, or still pending."""
    out = stats.dropped_buffer_full + stats.dropped_oversize + stats.dropped_rejected_http + stats.dropped_undelivered
    return stats.accepted == stats.sent + out + pending


def wait_for(check: Callable[[], object], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def recorded_waits(exporter: OtlpHttpExporter) -> list[float | None]:
    """The delays the sender waits between attempts, as it asked for them (a clock-free record)."""
    waits: list[float | None] = []
    real = exporter.wake.wait

    def wait(timeout: float | None = None) -> bool:
        waits.append(timeout)
        return real(timeout)

    exporter.wake.wait = wait  # type: ignore[method-assign]
    return waits


@pytest.fixture
def endpoint(tmp_path) -> Iterator[OtlpEndpoint]:
    ep = OtlpEndpoint(tmp_path)
    yield ep
    ep.close()


@pytest.fixture
def plain(tmp_path) -> Iterator[OtlpEndpoint]:
    ep = OtlpEndpoint(tmp_path, tls=False, signed=False)
    yield ep
    ep.close()


@pytest.fixture
def exporters() -> Iterator[Callable[..., OtlpHttpExporter]]:
    made: list[OtlpHttpExporter] = []

    def make(
        ep: OtlpEndpoint,
        signal=TRACES,
        options: ExportOptions = FAST,
        secret: str | None = SECRET_KEY,
        signer: Signer | None = None,
    ) -> OtlpHttpExporter:
        env = {"AWS_REGION": "us-east-1", "AWS_CA_BUNDLE": str(ep.ca_bundle) if ep.tls else ""}
        endpoint = parse_endpoint(ep.endpoint(f"/v1/{signal.name}"), env)
        if signer is None and endpoint.signed and secret is not None:
            signer = Signer(endpoint.service, endpoint.region, lambda: Credentials(ACCESS_KEY, secret))
        exporter = OtlpHttpExporter(signal, endpoint, options, signer, env)
        made.append(exporter)
        return exporter

    yield make
    for exporter in made:
        exporter.close(0.5)


# --- endpoints ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        (
            "otlp+https://xray.us-east-1.amazonaws.com/v1/traces",
            {},
            Endpoint("https://xray.us-east-1.amazonaws.com/v1/traces", True, "xray", "us-east-1"),
        ),
        (
            "otlp+https://monitoring.eu-west-3.amazonaws.com/v1/metrics",
            {"AWS_REGION": "us-east-1"},  # the host's region wins
            Endpoint("https://monitoring.eu-west-3.amazonaws.com/v1/metrics", True, "monitoring", "eu-west-3"),
        ),
        (
            "otlp+https://xray-fips.us-gov-west-1.amazonaws.com/v1/traces",
            {},
            Endpoint("https://xray-fips.us-gov-west-1.amazonaws.com/v1/traces", True, "xray", "us-gov-west-1"),
        ),
        (
            "otlp+https://xray.cn-north-1.amazonaws.com.cn/v1/traces",
            {},
            Endpoint("https://xray.cn-north-1.amazonaws.com.cn/v1/traces", True, "xray", "cn-north-1"),
        ),
        (
            "otlp+https://proxy.internal:8443/v1/traces",
            {"AWS_REGION": "ap-south-1"},
            Endpoint("https://proxy.internal:8443/v1/traces", True, "xray", "ap-south-1"),
        ),
        (
            "otlp+https://127.0.0.1:4443/v1/metrics",
            {"AWS_REGION": "us-west-2"},
            Endpoint("https://127.0.0.1:4443/v1/metrics", True, "monitoring", "us-west-2"),
        ),
        (
            " otlp+http://127.0.0.1:4316/v1/traces ",
            {},
            Endpoint("http://127.0.0.1:4316/v1/traces", False),
        ),
        ("OTLP+HTTP://agent:4318/v1/metrics", {}, Endpoint("http://agent:4318/v1/metrics", False)),
    ],
)
def test_parse_endpoint(text, env, expected):
    assert parse_endpoint(text, env) == expected
    assert str(expected).startswith("otlp+")


@pytest.mark.parametrize(
    ("text", "env", "reason"),
    [
        ("https://xray.us-east-1.amazonaws.com/v1/traces", {}, "starts with otlp+https://"),
        ("otlp+grpc://127.0.0.1:4317", {}, "starts with otlp+https://"),
        ("otlp+https:///v1/traces", {}, "needs a host"),
        ("otlp+http://127.0.0.1:4318", {}, "needs the OTLP path"),
        ("otlp+http://127.0.0.1:99999/v1/traces", {}, "bad port"),
        ("otlp+https://127.0.0.1:4443/v1/traces", {}, "AWS_REGION is not set"),
        ("otlp+https://127.0.0.1:4443/v1/traces", {"AWS_REGION": "mars"}, "not an AWS region"),
        ("otlp+https://collector:4443/otlp", {"AWS_REGION": "us-east-1"}, "cannot tell the SigV4 service"),
    ],
)
def test_parse_endpoint_refuses(text, env, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_endpoint(text, env)


# --- delivery -----------------------------------------------------------------------------


def test_signed_delivery_with_credentials_from_the_standard_chain(endpoint, exporters, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    exporter = exporters(endpoint, options=replace(FAST, linger=0.5), secret=None)  # botocore's chain: environment
    assert exporter.signer is not None
    exporter.submit(resource(), SCOPE, spans(2))
    exporter.submit(resource("other"), SCOPE, spans(1, 2))
    exporter.submit(resource(), SCOPE, spans(1, 3))  # an equal resource, another object: grouped with the first
    wait_for(lambda: exporter.stats().sent == 4)
    [got] = endpoint.received
    assert got.status == 200, got.error
    headers = {k.lower(): v for k, v in got.headers.items()}
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["content-encoding"] == "gzip"
    assert "content-encoding" in headers["authorization"].split("SignedHeaders=")[1]
    assert len(got.body) < len(got.data)
    groups = [
        (rs.resource.attributes[0].value.string_value, [s.name for ss in rs.scope_spans for s in ss.spans])
        for rs in got.request.resource_spans
    ]
    assert groups == [("triton-inference-server", ["s0", "s1", "s3"]), ("other", ["s2"])]
    assert got.request.resource_spans[0].scope_spans[0].scope.name == "triton-server"
    stats = exporter.stats()
    assert (stats.accepted, stats.sent, stats.requests_sent, stats.failed_batches) == (4, 4, 1, 0)
    assert stats.bytes_sent == len(got.body)
    assert balanced(stats)


def test_temporary_credentials_sign_their_session_token(endpoint, exporters):
    parsed = parse_endpoint(endpoint.endpoint(), {"AWS_REGION": "us-east-1"})
    signer = Signer(parsed.service, parsed.region, lambda: Credentials(ACCESS_KEY, SECRET_KEY, "task-role-token"))
    exporter = exporters(endpoint, signer=signer)
    exporter.submit(resource(), SCOPE, spans(1))
    wait_for(lambda: exporter.stats().sent == 1)
    headers = {k.lower(): v for k, v in endpoint.received[0].headers.items()}
    assert headers["x-amz-security-token"] == "task-role-token"
    assert "x-amz-security-token" in headers["authorization"]


def test_wrong_secret_key_is_refused_and_counted(endpoint, exporters):
    exporter = exporters(endpoint, secret="not-the-secret")
    exporter.submit(resource(), SCOPE, spans(5))
    wait_for(lambda: exporter.stats().failed_batches == 1)
    [got] = endpoint.received
    assert got.status == 403 and "does not match" in got.error
    stats = exporter.stats()
    assert stats.dropped_rejected_http == 5 and stats.sent == 0 and stats.retries == 0
    assert "HTTP 403" in exporter.conditions.active["otlp_traces_refused"]
    assert balanced(stats)


def test_missing_credentials_fail_the_export_without_a_crash(endpoint, exporters):
    endpoint_ = parse_endpoint(endpoint.endpoint(), {"AWS_REGION": "us-east-1"})
    signer = Signer(endpoint_.service, endpoint_.region, lambda: None)
    exporter = exporters(endpoint, options=replace(FAST, max_attempts=2), signer=signer)
    exporter.submit(resource(), SCOPE, spans(3))
    wait_for(lambda: exporter.stats().failed_batches == 1)
    assert endpoint.received == []  # nothing unsigned went out
    stats = exporter.stats()
    assert stats.dropped_undelivered == 3 and stats.retries == 1
    assert "no AWS credentials" in exporter.conditions.active["otlp_traces"]
    assert exporter.thread.is_alive()
    assert balanced(stats)


def test_unsigned_http_delivery_of_metrics_without_gzip(plain, exporters):
    exporter = exporters(plain, METRICS, options=replace(FAST, gzip=False))
    assert exporter.signer is None
    exporter.submit(resource(), InstrumentationScope(name="exporter"), gauges(3, points=2))
    wait_for(lambda: exporter.stats().sent == 6)  # counted in data points
    [got] = plain.received
    headers = {k.lower() for k in got.headers}
    assert "authorization" not in headers and "content-encoding" not in headers
    assert [m.name for m in got.request.resource_metrics[0].scope_metrics[0].metrics] == ["m0", "m1", "m2"]
    assert got.units() == 6


def test_the_endpoint_decodes_otlp_json_too(plain):
    body = b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"j","traceId":"00","spanId":"00"}]}]}]}'
    answer = requests.post(plain.url(), data=body, headers={"Content-Type": "application/json"}, timeout=5)
    assert answer.status_code == 200
    assert isinstance(plain.received[0].request, ExportTraceServiceRequest) and plain.received[0].units() == 1


# --- batching within the endpoint's limits ------------------------------------------------


def test_batches_split_at_10000_spans(plain, exporters):
    exporter = exporters(plain, options=replace(FAST, capacity=30_000))  # the default holds 20,000
    exporter.submit(resource(), SCOPE, spans(25_000))
    wait_for(lambda: exporter.stats().sent == 25_000, timeout=30)
    assert [r.units() for r in plain.accepted()] == [10_000, 10_000, 5_000]
    assert span_names(plain) == [f"s{i}" for i in range(25_000)]


def test_batches_split_at_1000_data_points_and_oversize_metric_dropped(plain, exporters):
    exporter = exporters(plain, METRICS)
    exporter.submit(resource(), SCOPE, [*gauges(1_500), *gauges(1, points=1_001), *gauges(2, points=300)])
    wait_for(lambda: exporter.stats().sent == 2_100)
    assert [r.units() for r in plain.accepted()] == [1_000, 800, 300]  # 500 + 300 fit, the next 300 does not
    stats = exporter.stats()
    assert stats.dropped_oversize == 1_001 and balanced(stats)


def test_batches_split_at_the_byte_limit_and_oversize_span_dropped(plain, exporters):
    exporter = exporters(plain)
    exporter.submit(resource(), SCOPE, [*spans(40, pad=150_000), *spans(1, 40, pad=250_000), *spans(1, 41)])
    wait_for(lambda: exporter.stats().sent == 41)
    sizes = [len(r.data) for r in plain.accepted()]
    assert [r.units() for r in plain.accepted()] == [33, 8]
    assert max(sizes) <= 5_000_000 and sizes[0] > 4_900_000
    assert "s40" not in span_names(plain) and "s41" in span_names(plain)
    stats = exporter.stats()
    assert stats.dropped_oversize == 1 and balanced(stats)
    assert "oversize" in "".join(exporter.conditions.active)


# --- retries and refusals -----------------------------------------------------------------


def test_429_retried_honouring_retry_after(endpoint, exporters):
    endpoint.script(Reply(429, retry_after="1"), Reply(429))
    exporter = exporters(endpoint)
    waits = recorded_waits(exporter)
    exporter.submit(resource(), SCOPE, spans(3))
    wait_for(lambda: exporter.stats().sent == 3)
    first, second, third = endpoint.received
    assert (first.status, second.status, third.status) == (429, 429, 200)
    assert second.at - first.at >= 0.9  # Retry-After: 1 was waited out (a lower bound: load only adds)
    assert waits[0] == 1.0  # Retry-After: 1, not the 0.05 s backoff
    assert waits[1] is not None and waits[1] <= FAST.backoff_max  # no Retry-After: the backoff (0.2 s at most)
    stats = exporter.stats()
    assert stats.retries == 2 and stats.sent == 3 and balanced(stats)


def test_503_and_a_dropped_connection_retried(endpoint, exporters):
    endpoint.script(Reply(503), Reply(hang_up=True), Reply(503))
    exporter = exporters(endpoint)
    exporter.submit(resource(), SCOPE, spans(3))
    wait_for(lambda: exporter.stats().sent == 3)
    assert [r.status for r in endpoint.received] == [503, 0, 503, 200]
    assert exporter.stats().retries == 3
    assert "otlp_traces" not in exporter.conditions.active  # recovered


def test_retries_are_bounded(endpoint, exporters):
    endpoint.script(*[Reply(503)] * 3)
    exporter = exporters(endpoint, options=replace(FAST, max_attempts=3))
    exporter.submit(resource(), SCOPE, spans(4))
    wait_for(lambda: exporter.stats().failed_batches == 1)
    stats = exporter.stats()
    assert stats.dropped_undelivered == 4 and stats.retries == 2 and balanced(stats)
    exporter.submit(resource(), SCOPE, spans(1, 4))  # the next batch goes through
    wait_for(lambda: exporter.stats().sent == 1)


def test_400_drops_the_batch_counts_it_and_carries_on(endpoint, exporters):
    endpoint.script(Reply(400, body=b"Bad Request: invalid span" + b"!" * 1000))
    exporter = exporters(endpoint)
    exporter.submit(resource(), SCOPE, spans(7))
    wait_for(lambda: exporter.stats().failed_batches == 1)
    exporter.submit(resource(), SCOPE, spans(2, 7))
    wait_for(lambda: exporter.stats().sent == 2)
    stats = exporter.stats()
    assert stats.dropped_rejected_http == 7 and stats.retries == 0 and balanced(stats)
    message = exporter.conditions.active["otlp_traces_refused"]
    assert "HTTP 400" in message and "invalid span" in message and len(message) < 500  # the body clipped


def test_partial_success_counted(endpoint, exporters):
    endpoint.script(Reply(rejected=2, message="2 spans older than 14 days"))
    exporter = exporters(endpoint)
    exporter.submit(resource(), SCOPE, spans(5))
    wait_for(lambda: exporter.stats().sent == 5)
    stats = exporter.stats()
    assert stats.rejected_partial == 2
    assert "older than 14 days" in exporter.conditions.active["otlp_traces_partial"]


def test_partial_success_of_metrics_counted_in_data_points(plain, exporters):
    plain.script(Reply(rejected=3, message="too many labels"))
    exporter = exporters(plain, METRICS)
    exporter.submit(resource(), SCOPE, gauges(2, points=5))
    wait_for(lambda: exporter.stats().sent == 10)
    assert exporter.stats().rejected_partial == 3


# --- the producer never waits -------------------------------------------------------------


def test_endpoint_down_buffers_to_capacity_drops_oldest_and_delivers_in_order(endpoint, exporters):
    endpoint.stop()
    options = replace(FAST, capacity=100, max_attempts=1_000, max_batch_age=60)
    exporter = exporters(endpoint, options=options)
    exporter.submit(resource(), SCOPE, spans(150))  # the oldest 50 go at once; the sender takes the other 100
    wait_for(lambda: exporter.stats().retries >= 2)  # it is retrying s50..s149
    exporter.submit(resource(), SCOPE, spans(150, 150))  # s150..s199 pushed out by s200..s299
    stats = exporter.stats()
    assert stats.dropped_buffer_full == 100 and exporter.pending() == 200 and balanced(stats, pending=200)
    assert (
        "unavailable" in exporter.conditions.active["otlp_traces"]
        or "failed" in exporter.conditions.active["otlp_traces"]
    )
    endpoint.start()
    wait_for(lambda: exporter.stats().sent == 200)
    assert span_names(endpoint) == [f"s{i}" for i in [*range(50, 150), *range(200, 300)]]
    assert balanced(exporter.stats())


def test_slow_endpoint_never_blocks_submit(endpoint, exporters):
    release = threading.Event()
    endpoint.script(Reply(hold=release))  # sits on the first request until released
    exporter = exporters(endpoint)
    try:
        exporter.submit(resource(), SCOPE, spans(1))
        wait_for(lambda: exporter.pending() == 1 and exporter.inflight is not None)
        for i in range(20):
            exporter.submit(resource(), SCOPE, spans(100, 1 + 100 * i))
        assert endpoint.received == []  # all submitted while the endpoint still sat on the first request
    finally:
        release.set()
    wait_for(lambda: exporter.stats().sent == 2_001, timeout=30)
    assert span_names(endpoint) == [f"s{i}" for i in range(2_001)]


def test_close_delivers_what_is_queued(endpoint, exporters):
    exporter = exporters(endpoint, options=replace(FAST, linger=600.0))  # only close() cuts the wait short
    exporter.submit(resource(), SCOPE, spans(10))  # wakes the sender, which then lingers on the condition
    wait_for(lambda: exporter.cond._waiters)  # it is lingering (submit's notify took it off the waiters)
    exporter.close(30.0)  # far below the linger: delivered within it only if close cut the linger short
    assert exporter.stats().sent == 10 and span_names(endpoint) == [f"s{i}" for i in range(10)]


def test_close_keeps_its_deadline_and_counts_the_rest(endpoint, exporters):
    release = threading.Event()
    endpoint.script(Reply(hold=release))  # answers only when released (or after a minute)
    exporter = exporters(endpoint, options=replace(FAST, timeout=120.0))  # the sender would wait it out
    try:
        exporter.submit(resource(), SCOPE, spans(10))
        wait_for(lambda: exporter.inflight is not None)
        exporter.submit(resource(), SCOPE, spans(5, 10))
        exporter.close(1.0)
        assert endpoint.received == []  # close returned while the endpoint still sat on the request
    finally:
        release.set()
    stats = exporter.stats()
    assert stats.dropped_undelivered == 15 and stats.sent == 0 and stats.failed_batches == 1 and balanced(stats)
    assert exporter.pending() == 0
    exporter.submit(resource(), SCOPE, spans(2, 15))  # after close: counted, not kept
    stats = exporter.stats()
    assert stats.dropped_undelivered == 17 and exporter.pending() == 0 and balanced(stats)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("3", 3.0), (" 0 ", 0.0), ("Wed, 21 Oct 2015 07:28:05 GMT", 5.0), ("soon", None), ("", None), (None, None)],
)
def test_retry_after(value, seconds):
    now = 1445412480.0  # 2015-10-21 07:28:00 UTC
    assert retry_after(value, now) == seconds
