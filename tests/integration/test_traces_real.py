"""The trace relay with a real Triton (2.51, nvidia-pytriton) in OpenTelemetry trace mode, through the pipeline."""

from __future__ import annotations

import time

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from demo.triton import free_port
from telemetry.otlp.endpoint import parse_endpoint
from tests.support.helpers import ECS_TASK, documents, model_doc, pipeline_for, task_doc
from tests.support.otlp_endpoint import OtlpEndpoint

pytestmark = pytest.mark.triton

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def trace_flags(port: int, rate: int = 1) -> list[str]:
    return [
        "--trace-config", "mode=opentelemetry",
        "--trace-config", f"opentelemetry,url=http://127.0.0.1:{port}/v1/traces",
        "--trace-config", f"rate={rate}",
        "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "opentelemetry,resource=service.name=triton",
    ]  # fmt: skip


def relay_of(pipe):
    return next(s for s in pipe.sources if s.name == "traces").relay


def wait_for_spans(pipe, at_least: int, timeout: float = 20.0) -> None:
    """Triton's batch span processor exports every 5 s."""
    relay = relay_of(pipe)
    deadline = time.monotonic() + timeout
    while relay.counts().spans_received < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    assert relay.counts().spans_received >= at_least, relay.counts()
    assert relay.drain(5)


@pytest.fixture
def xray(signed_otlp_endpoint: OtlpEndpoint) -> OtlpEndpoint:
    """A local HTTPS stand-in for X-Ray's OTLP endpoint that checks SigV4 with known test credentials."""
    return signed_otlp_endpoint


def test_phases_and_slowest_traces_from_a_real_triton_land_in_the_models_event(
    triton_factory, xray, metadata_server
) -> None:
    port = free_port()
    server = triton_factory(models=["add", "slow"], start=False, extra_args=trace_flags(port))
    pipe = pipeline_for(
        server,
        traces_to=parse_endpoint(xray.endpoint("/v1/traces")),  # https, so signed (service from the path: xray)
        traces_listen=("127.0.0.1", port),
        traces_log_groups=("/ecs/triton/exporter",),
        ecs_metadata_url=metadata_server[0],
    )
    try:
        server.start()
        pipe.cycle()  # baseline
        for i in range(4):
            headers = {"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"} if i == 0 else {}
            status, body = server.infer(
                "slow", [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}], headers=headers
            )
            assert status == 200, body
        server.infer_add(3)
        wait_for_spans(pipe, 7 * 3)  # InferRequest, the model, compute: three spans a request
        first = documents(pipe.cycle())  # the models' phase histograms are new: their baseline
        # The endpoint records a batch before it answers; the forwarder counts it once the answer is read:
        # wait for both, or a loaded machine's cycle can fall between the two (seen in CI).
        relay = relay_of(pipe)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            sum(r.units() for r in xray.accepted()) < 21 or relay.counts().spans_exported < 21
        ):
            time.sleep(0.1)
        docs = documents(pipe.cycle())
    finally:
        pipe.close()
    # What reached the endpoint: signed (the stand-in refuses a bad signature with 403), Triton's spans with
    # the task's context, the root SERVER and everything under it INTERNAL, the client's trace id kept.
    assert [r.status for r in xray.received] == [200] * len(xray.received) and xray.received
    spans, resources = [], []
    for got in xray.accepted():
        for rs in got.request.resource_spans:
            resources.append({kv.key: kv.value for kv in rs.resource.attributes})
            spans += [s for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == 21
    assert {s.kind for s in spans if s.name == "InferRequest"} == {Span.SPAN_KIND_SERVER}
    assert {s.kind for s in spans if s.name != "InferRequest"} == {Span.SPAN_KIND_INTERNAL}
    assert CLIENT_TRACE in {s.trace_id.hex() for s in spans}
    attrs = resources[0]
    assert attrs["aws.ecs.task.arn"].string_value == ECS_TASK["TaskARN"]
    assert attrs["cloud.region"].string_value == "us-east-1" and attrs["service.name"].string_value == "triton"
    assert [v.string_value for v in attrs["aws.log.group.names"].array_value.values] == ["/ecs/triton/exporter"]
    slow = model_doc(docs, "slow")
    dist = slow["TracedRequestTime"]
    # The model sleeps 50 ms: milliseconds, not microseconds (50 000); the top wide for a loaded machine.
    assert dist["Count"] == 4 and dist["Min"] >= 40 and dist["Max"] < 5_000
    assert slow["TracedComputeInferTime"]["Count"] == 4 and slow["TracedQueueTime"]["Count"] == 4
    traces = model_doc(first, "slow")["slowest_traces"]  # the window the requests were in
    assert len(traces) == 3 and all(t["ms"] >= 40 for t in traces)
    assert model_doc(docs, "add")["TracedRequestTime"]["Count"] == 3
    task = task_doc(first)
    assert task["SpansReceived"] == 21 and task["SpansDropped"] == 0 and task["TraceRequestsInvalid"] == 0
    assert task_doc(first)["SpansExported"] + task_doc(docs)["SpansExported"] == 21
    assert all(len(t["trace_id"]) == 32 and len(t["span_id"]) == 16 for t in traces)


def test_the_trace_rate_is_applied_at_runtime_and_again_after_a_triton_restart(triton_factory, xray) -> None:
    port = free_port()
    server = triton_factory(models=["add"], start=False, extra_args=trace_flags(port, rate=1))
    pipe = pipeline_for(
        server, traces_to=parse_endpoint(xray.endpoint("/v1/traces")), traces_listen=("127.0.0.1", port), trace_rate=3
    )
    try:
        server.start()
        pipe.cycle()
        assert server.request("GET", "/v2/trace/setting")[1]["trace_rate"] == "3"
        server.restart()  # back at its flags' rate of 1
        assert server.request("GET", "/v2/trace/setting")[1]["trace_rate"] == "1"
        pipe.cycle()
        assert server.request("GET", "/v2/trace/setting")[1]["trace_rate"] == "3"
        rate = next(s for s in pipe.sources if s.name == "traces").rate
        assert rate.applied == 2 and not rate.conditions.active
        server.infer_add(9)  # every third request traced: 3 requests, 3 spans each
        wait_for_spans(pipe, 9)
        time.sleep(6)  # one more export period: nothing beyond those
        assert relay_of(pipe).counts().spans_received == 9
    finally:
        pipe.close()
