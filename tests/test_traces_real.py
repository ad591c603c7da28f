"""The trace relay with a real Triton (2.51, nvidia-pytriton) in OpenTelemetry trace mode, through the pipeline."""

from __future__ import annotations

import time

import pytest

from demo.triton import free_port

from .support.helpers import documents, model_doc, pipeline_for, task_doc

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


def wait_for_spans(pipe, at_least: int, timeout: float = 20.0) -> None:
    """Triton's batch span processor exports every 5 s."""
    relay = next(s for s in pipe.sources if s.name == "traces").relay
    deadline = time.monotonic() + timeout
    while relay.receiver.stats.spans < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    assert relay.receiver.stats.spans >= at_least, relay.receiver.stats
    assert relay.drain(5)


def test_phases_and_slowest_traces_from_a_real_triton_land_in_the_models_event(triton_factory) -> None:
    port = free_port()
    server = triton_factory(models=["add", "slow"], start=False, extra_args=trace_flags(port))
    pipe = pipeline_for(server, traces_to="otlp+http://127.0.0.1:9/v1/traces", traces_listen=("127.0.0.1", port))
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
        docs = documents(pipe.cycle())
    finally:
        pipe.close()
    slow = model_doc(docs, "slow")
    dist = slow["TracedRequestTime"]
    assert dist["Count"] == 4 and dist["Min"] >= 40 and dist["Max"] <= 400  # the model sleeps 50 ms
    assert slow["TracedComputeInferTime"]["Count"] == 4 and slow["TracedQueueTime"]["Count"] == 4
    traces = model_doc(first, "slow")["slowest_traces"]  # the window the requests were in
    assert len(traces) == 3 and all(t["ms"] >= 40 for t in traces)
    assert model_doc(docs, "add")["TracedRequestTime"]["Count"] == 3
    task = task_doc(first)
    assert task["SpansReceived"] == 21 and task["SpansDropped"] == 0 and task["TraceRequestsInvalid"] == 0
    assert all(len(t["trace_id"]) == 32 and len(t["span_id"]) == 16 for t in traces)
