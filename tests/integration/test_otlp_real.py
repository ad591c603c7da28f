"""The exporter's OTLP metrics output as the daemon runs it, against a real Triton: EMF and OTLP side by side,
and the GenAI semantic conventions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from demo.llm import VLLM, vllm, wait_counted
from demo.payloads import VLLM_STEP
from tests.support.otlp_endpoint import OtlpEndpoint
from tests.support.paths import REPO
from tests.unit.exporter.test_otlp_genai import DURATION, TPOT, TTFT, attrs, points, wait_for
from tests.unit.exporter.test_otlp_metrics import ROOT, by_name, metrics


@pytest.mark.triton
def test_the_daemon_sends_the_genai_metrics_from_a_real_triton(triton_factory, tmp_path) -> None:
    """python -m exporter with EXPORTER_OTLP_SEMCONV=genai against Triton 2.51 and the demo's stand-ins: the vLLM
    stand-in (a Python model, so its config declares gen_ai.operation.name, read back through Triton's config
    API), the decoupled ``stream`` (its first-response histogram on docs/llm.md's buckets, in ms) and ``classify``
    (not decoupled: its first-response histogram is a request latency, and it is no generative model)."""
    import os
    import signal
    import subprocess
    import sys

    from demo.llm import VLLM, vllm, wait_counted

    endpoint = OtlpEndpoint(tmp_path, tls=False, signed=False)
    server = triton_factory(models=[VLLM, "stream", "classify"], start=False)
    config = server.model_repository / VLLM / "config.pbtxt"
    config.write_text(
        config.read_text() + 'parameters { key: "gen_ai.operation.name" value { string_value: "chat" } }\n'
    )
    server.start()
    for ttft in (25, 65, 120):
        vllm(server, f"hello {ttft}", max_tokens=4, ttft_ms=ttft, itl_ms=5)
    for _ in range(4):
        status, answer = server.request(
            "POST", "/v2/models/stream/generate_stream", {"text_input": "one two three", "first_ms": 40.0}
        )
        assert status == 200, answer
    status, answer = server.infer("classify", [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}])
    assert status == 200, answer
    wait_counted(server)
    root = REPO
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPORTER_")}
    env.update(
        PYTHONPATH=str(root),
        EXPORTER_NVML="off",
        EXPORTER_STARTUP_WAIT="0",
        EXPORTER_OTLP_SEMCONV="genai",
        EXPORTER_OUTPUT=endpoint.endpoint("/v1/metrics"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--interval", "1", "--triton-url", server.url,
         "--triton-metrics-url", server.metrics_url],
        env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:

        def sent() -> dict[str, list]:
            named: dict[str, list] = {}
            for r in endpoint.accepted():
                for rm in r.request.resource_metrics:
                    for m in (m for sm in rm.scope_metrics for m in sm.metrics):
                        named.setdefault(m.name, []).append(m)
            return named

        wait_for(lambda: {"vllm_model", "stream"} <= set(points(sent(), TTFT)), 90)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        endpoint.close()
    assert proc.returncode == 0, err[-2000:]
    named = sent()
    ttft, tpot, duration = points(named, TTFT), points(named, TPOT), points(named, DURATION)
    assert set(ttft) == {VLLM, "stream"} and set(tpot) == set(duration) == {VLLM}  # classify: nothing
    vllm_ttft, stream_ttft = ttft[VLLM][-1], ttft["stream"][-1]
    assert list(vllm_ttft.explicit_bounds) == list(VLLM_STEP["vllm:time_to_first_token_seconds"][0])
    assert vllm_ttft.count == 3 and list(vllm_ttft.bucket_counts)[4:9] == [1, 0, 1, 0, 1]
    assert list(stream_ttft.explicit_bounds) == [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
    ]  # fmt: skip
    assert stream_ttft.count == 4 and 0.1 <= stream_ttft.sum <= 0.8  # four first words after 40 ms, in s
    assert attrs(vllm_ttft) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "triton",
        "gen_ai.request.model": VLLM,
        "triton.model.version": "1",
    }
    assert "model 'classify' version 1 cannot produce" in err.decode() and "not a generative model" in err.decode()


@pytest.mark.triton
def test_daemon_with_two_outputs_sends_emf_and_otlp_from_a_real_triton(
    triton_factory, signed_otlp_endpoint: OtlpEndpoint, tmp_path: Path
) -> None:
    cloudwatch = signed_otlp_endpoint  # a local HTTPS stand-in for CloudWatch's OTLP endpoint that checks SigV4
    server = triton_factory(models=["add", VLLM])
    server.infer_add(3)
    for ttft in (25, 65, 120):
        vllm(server, f"hello {ttft}", max_tokens=4, ttft_ms=ttft, itl_ms=5)
    wait_counted(server)
    emf = tmp_path / "emf.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPORTER_")}
    env.update(PYTHONPATH=str(ROOT), EXPORTER_NVML="off", EXPORTER_STARTUP_WAIT="0")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "exporter", "--interval", "1",
            "--triton-url", server.url, "--triton-metrics-url", server.metrics_url,
            "--output", f"file:{emf}", "--output", cloudwatch.endpoint("/v1/metrics"),
        ],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        names = lambda: {m.name for _, m in metrics(cloudwatch.accepted())}  # noqa: E731
        wait_for(lambda: "vllm:time_to_first_token_seconds" in names() and emf.exists() and emf.stat().st_size, 60)
        server.infer_add(2)
        wait_counted(server)

        def add_success() -> list[float]:
            found = by_name(metrics(cloudwatch.accepted())).get("nv_inference_request_success", [])
            return [p.as_double for m in found for p in m.sum.data_points if attrs(p)["model"] == "add"]

        wait_for(lambda: 5 in add_success(), 60)  # a scrape after the two requests was exported (was: sleep 2.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err[-2000:]
    assert all(r.status == 200 for r in cloudwatch.received)  # every request signed right
    lines = [orjson.loads(line) for line in emf.read_bytes().splitlines()]
    assert any(d.get("model") == "add" and "RequestSuccess" in d for d in lines)  # EMF as before
    named = by_name(metrics(cloudwatch.accepted()))
    add = [p for m in named["nv_inference_request_success"] for p in m.sum.data_points if attrs(p)["model"] == "add"]
    assert add[0].as_double == 3 and add[-1].as_double == 5
    assert {p.start_time_unix_nano for p in add} == {add[0].time_unix_nano}  # one start: first seen
    ttft = named["vllm:time_to_first_token_seconds"][-1].histogram.data_points[0]
    bounds = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
    assert list(ttft.explicit_bounds) == bounds  # the model's own buckets, not midpoints
    assert ttft.count == 3 and sum(ttft.bucket_counts) == 3 and list(ttft.bucket_counts)[4:9] == [1, 0, 1, 0, 1]
    assert attrs(ttft)["model"] == VLLM
