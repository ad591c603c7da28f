"""Triton's core families that the catalog added for issue 20, against a real Triton 2.51.

Seen on the nvidia-pytriton wheel's 2.51: the queue summary (summary_latencies=true), the CPU memory total,
the pinned memory pool and, with the response cache on (``--cache-config local,size=...`` and
``response_cache { enable: true }`` in the model config), per-model cache hits and misses; with the cache on,
Triton does not create the model's request summary, so the RequestLatencyP* metrics disappear.
"""

from __future__ import annotations

import time

import pytest

from demo.triton import _pytriton_root
from tests.support.helpers import documents, metric_names, model_doc, pipeline_for, task_doc

pytestmark = pytest.mark.triton


def settled(server, model: str, requests: int, timeout: float = 10.0) -> None:
    """Wait until Triton counts ``requests`` successes of the model (its counters lag the responses)."""
    deadline = time.monotonic() + timeout
    needle = f'nv_inference_request_success{{model="{model}",version="1"}} {requests}\n'
    while needle not in server.metrics_text():
        assert time.monotonic() < deadline, f"{model}: {requests} successes not counted in {timeout}s"
        time.sleep(0.02)


def test_response_cache_hits_misses_and_the_missing_request_summary(triton_factory):
    server = triton_factory(["add"], start=False, extra_args=["--cache-directory", str(_pytriton_root() / "caches")])
    server.extra_args += ["--cache-config", "local,size=1048576"]
    config = server.model_repository / "add" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    server.start()
    pipe = pipeline_for(server)
    server.infer_add(1, values=(1.0, 2.0))  # cached before the window
    settled(server, "add", 1)
    pipe.cycle()
    server.infer_add(3, values=(1.0, 2.0))  # 3 hits
    server.infer_add(2, values=(7.0, 8.0))  # a miss, then a hit
    settled(server, "add", 6)
    docs = documents(pipe.cycle())
    add = model_doc(docs, "add")
    assert (add["CacheHits"], add["CacheMisses"], add["RequestSuccess"]) == (4, 1, 5)
    assert add["CacheHitRate"] == pytest.approx(80.0)
    assert "nv_inference_request_summary_us" not in server.metrics_text()  # never created with the cache on
    assert not {"RequestLatencyP50", "RequestLatencyP95", "RequestLatencyP99"} & metric_names(add)
    assert {"QueueLatencyP50", "QueueLatencyP95", "QueueLatencyP99"} <= metric_names(add)


def test_queue_quantiles_cpu_memory_and_pinned_pool(triton_factory):
    server = triton_factory(["add"])
    # Triton polls the host and pool gauges every --metrics-interval-ms (2 s): 0 until the first poll (seen)
    deadline = time.monotonic() + 10
    while "\nnv_pinned_memory_pool_total_bytes 0\n" in server.metrics_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    pipe = pipeline_for(server)
    pipe.cycle()
    server.infer_add(5)
    settled(server, "add", 5)
    docs = documents(pipe.cycle())
    add = model_doc(docs, "add")
    printed = {
        q: float(line.rsplit(" ", 1)[1])
        for line in server.metrics_text().splitlines()
        for q in ("0.5", "0.95", "0.99")
        if line.startswith(f'nv_inference_queue_summary_us{{model="add",version="1",quantile="{q}"}}')
    }
    assert set(printed) == {"0.5", "0.95", "0.99"}
    # the summary's 60 s window may move between the two reads only by requests we did not send
    assert (add["QueueLatencyP50"], add["QueueLatencyP95"], add["QueueLatencyP99"]) == (
        printed["0.5"],
        printed["0.95"],
        printed["0.99"],
    )
    assert {"RequestLatencyP95"} <= metric_names(add)  # no cache: the request summary is there
    task = task_doc(docs)
    assert task["PinnedMemoryPoolTotal"] == 256 * 1024 * 1024  # Triton's default pool
    assert 0 <= task["PinnedMemoryPoolUsed"] <= task["PinnedMemoryPoolTotal"]
    assert task["CpuMemoryTotal"] > 0
    assert task["CpuMemoryUsedPercent"] == pytest.approx(100 * task["CpuMemoryUsed"] / task["CpuMemoryTotal"])
