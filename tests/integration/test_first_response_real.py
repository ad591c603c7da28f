"""Time to first token only where it is one, on a real Triton with the demo's two first-response stand-ins.

``stream`` is decoupled and ``classify`` is not; both publish upstream's
``nv_inference_first_response_histogram_ms`` (Triton 26.01 publishes it for
every model; the 2.51 binary here for none, so the stand-ins do). The exporter
asks Triton's model config API which is which: the decoupled one's histogram
is ``TimeToFirstToken``, the other's ``RequestLatency``.
"""

from __future__ import annotations

import time

import pytest

from tests.support.helpers import documents, model_doc, pipeline_for

pytestmark = pytest.mark.triton


def test_the_decoupled_models_histogram_is_ttft_and_the_others_is_request_latency(triton_factory) -> None:
    server = triton_factory(models=["stream", "classify"])
    pipe = pipeline_for(server)
    try:
        pipe.cycle()  # baseline; the index source reads both configurations
        pipe.cycle()
        for _ in range(4):
            status, body = server.request(
                "POST", "/v2/models/stream/generate_stream", {"text_input": "one two three", "first_ms": 40.0}
            )
            assert status == 200 and str(body).count("data:") == 3, body
            status, body = server.infer("classify", [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}])
            assert status == 200, body
        time.sleep(0.2)
        docs = documents(pipe.cycle())
    finally:
        pipe.close()
    stream, classify = model_doc(docs, "stream"), model_doc(docs, "classify")
    ttft = stream["TimeToFirstToken"]
    # Milliseconds, not microseconds (40 000); the tops are wide for a loaded machine.
    assert ttft["Count"] == 4 and ttft["Min"] >= 25 and ttft["Max"] < 5_000  # first word after 40 ms
    assert "RequestLatency" not in stream
    latency = classify["RequestLatency"]
    assert latency["Count"] == 4 and latency["Min"] >= 10 and latency["Max"] < 5_000  # sleeps 20 ms
    assert "TimeToFirstToken" not in classify
