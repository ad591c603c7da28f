"""LLM serving metrics against a real Triton 2.51 serving the LLM sample models.

``vllm_model`` and ``tensorrt_llm`` (demo/models) publish the vLLM and
TensorRT-LLM backends' families through ``pb_utils.MetricFamily`` with the
backends' exact names, labels and buckets, and derive every value from the
request (demo/llm.py): so each test predicts exact token deltas, bucket
midpoints and gauges from what it sent, by hand.

Not testable here: Triton's own time to first response
(``nv_inference_first_response_histogram_ms``) appeared in Triton 24.11; the
nvidia-pytriton wheel ships 2.51 (24.10), which does not print it (checked in
test_trt_gauges_equal_what_triton_prints). The golden and unit tests cover
that input from synthetic text.

One server for the module (two Python-backend stubs); tests that reload
models leave them loaded again.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from demo import llm as demo_llm
from demo.llm import TRT, VLLM, trt, vllm, wait_counted
from demo.triton import LLM_MODELS, TritonServer, copy_models
from exporter.pipeline import CycleResult, Pipeline
from telemetry.emf_validate import validate
from tests.support.helpers import documents, metric_names, model_doc, pipeline_for, task_doc
from tests.support.paths import REPO

pytestmark = pytest.mark.triton
ROOT = REPO
EXAMPLE_CATALOG = ROOT / "catalog" / "example.toml"
# Every metric the LLM pack derives from a counter or histogram (none may survive a reset window).
COUNTER_DERIVED = (
    "PromptTokens",
    "GenerationTokens",
    "PromptTokensPerSecond",
    "GenerationTokensPerSecond",
    "TimeToFirstToken",
    "InterTokenLatency",
    "EndToEndLatency",
    "PromptLength",
    "GenerationLength",
    "TimeToFirstTokenP50",
    "TimeToFirstTokenP95",
    "TimeToFirstTokenP99",
    "InterTokenLatencyP95",
    "EndToEndLatencyP95",
    "RequestSuccess",
    "EngineIterationsPerSecond",
    "KvCacheTransferTimeAvg",
)


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    work = tmp_path_factory.mktemp("llm-triton")
    server = TritonServer(copy_models(list(LLM_MODELS), work / "models"), workdir=work)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def words(n: int, tag: str = "w") -> str:
    """A prompt of exactly ``n`` tokens for the sample models (they count words)."""
    return " ".join(f"{tag}{i}" for i in range(n))


def unique(n: int) -> str:
    """A prompt of ``n`` tokens never sent before (prompt cache hits stay predictable)."""
    return words(n, uuid.uuid4().hex[:8])


def cycle(pipe: Pipeline, server: TritonServer) -> CycleResult:
    """One exporter cycle once Triton's own counters include every answered request (they lag a little)."""
    wait_counted(server)
    return pipe.cycle()


def assert_no_negative(docs: list[dict]) -> None:
    for doc in docs:
        for name in metric_names(doc):
            value = doc[name]
            numbers = value["Values"] + value["Counts"] + [value["Sum"]] if isinstance(value, dict) else [value]
            assert all(math.isfinite(v) and v >= 0 for v in numbers), (doc.get("model"), name, value)


# --- tokens, lengths, latencies (vLLM) ---------------------------------------------------------------


def test_token_deltas_and_rates_equal_what_the_models_counted(llm):
    pipe = pipeline_for(llm)
    cycle(pipe, llm)
    for text, n in ((unique(3), 8), (unique(5), 20), (unique(12), 1)):
        vllm(llm, text, max_tokens=n)
    trt(llm, [unique(n) for n in (5, 60, 100, 20, 7, 3)], [10, 20, 30, 40, 50, 60])
    result = cycle(pipe, llm)
    docs = documents(result)

    v = model_doc(docs, VLLM)
    assert v["RequestSuccess"] == 3
    assert v["PromptTokens"] == 3 + 5 + 12
    assert v["GenerationTokens"] == 8 + 20 + 1
    assert v["PromptTokensPerSecond"] == pytest.approx(20 / result.elapsed)
    assert v["GenerationTokensPerSecond"] == pytest.approx(29 / result.elapsed)
    # vLLM's 1-2-5 length buckets: 3 and 5 in (2, 5], 12 in (10, 20]; 1 in (0, 1], 8 in (5, 10], 20 in (10, 20]
    assert v["PromptLength"] == {
        "Values": [3.5, 15.0],
        "Counts": [2.0, 1.0],
        "Max": 20.0,
        "Min": 2.0,
        "Count": 3.0,
        "Sum": 20.0,
    }
    assert v["GenerationLength"] == {
        "Values": [0.5, 7.5, 15.0],
        "Counts": [1.0, 1.0, 1.0],
        "Max": 20.0,
        "Min": 0.0,
        "Count": 3.0,
        "Sum": 29.0,
    }

    t = model_doc(docs, TRT)
    assert t["RequestSuccess"] == 1 and t["InferenceCount"] == 6  # one request, six sequences
    # as the C++ backend: lengths once per Triton request, the row that finished last (60 output tokens, 3 in)
    assert t["PromptTokens"] == 3  # from nv_llm_input_token_len_sum: the other five rows are not counted
    assert t["GenerationTokens"] == 60  # from nv_llm_output_token_len_sum
    assert t["PromptTokensPerSecond"] == pytest.approx(3 / result.elapsed)
    assert t["GenerationTokensPerSecond"] == pytest.approx(60 / result.elapsed)
    # TensorRT-LLM's buckets 10 50 100 500 1000: 3 in (0, 10]; 60 in (50, 100]
    assert t["PromptLength"] == {"Values": [5.0], "Counts": [1.0], "Max": 10.0, "Min": 0.0, "Count": 1.0, "Sum": 3.0}
    assert t["GenerationLength"] == {
        "Values": [75.0],
        "Counts": [1.0],
        "Max": 100.0,
        "Min": 50.0,
        "Count": 1.0,
        "Sum": 60.0,
    }

    idle = documents(cycle(pipe, llm))  # no traffic: the idle model's token zeros and distributions are left out
    for model in (VLLM, TRT):
        doc = model_doc(idle, model)
        assert doc["RequestSuccess"] == 0
        assert not {"PromptTokens", "GenerationTokens", "PromptLength", "TimeToFirstToken"} & metric_names(doc)


def test_time_to_first_token_is_a_distribution_in_the_right_buckets(llm):
    pipe = pipeline_for(llm)
    cycle(pipe, llm)
    for ttft in (25, 25, 25, 65, 65, 120):  # ms; none on a bucket's midpoint, so a raw value would show
        vllm(llm, unique(4), max_tokens=8, ttft_ms=ttft, itl_ms=30)
    docs = documents(cycle(pipe, llm))
    v = model_doc(docs, VLLM)
    # vLLM's buckets (ms): (20, 40] -> 30, (60, 80] -> 70, (100, 250] -> 175; Sum is the _sum delta
    ttft = v["TimeToFirstToken"]
    assert ttft["Values"] == [30.0, 70.0, 175.0] and ttft["Counts"] == [3.0, 2.0, 1.0]
    assert (ttft["Min"], ttft["Max"], ttft["Count"]) == (20.0, 250.0, 6.0)
    assert ttft["Count"] == v["RequestSuccess"] == 6  # one observation per request in the window
    assert ttft["Sum"] == pytest.approx(3 * 25 + 2 * 65 + 120)
    # 7 tokens after the first per request, every 30 ms: (25, 50] -> 37.5
    itl = v["InterTokenLatency"]
    assert (itl["Values"], itl["Counts"], itl["Min"], itl["Max"]) == ([37.5], [42.0], 25.0, 50.0)
    assert itl["Sum"] == pytest.approx(42 * 30)
    # end to end = ttft + 7 x 30 ms: 235, 275, 330 ms, all in (0, 1] s
    e2e = v["EndToEndLatency"]
    assert (e2e["Values"], e2e["Counts"], e2e["Min"], e2e["Max"]) == ([0.5], [6.0], 0.0, 1.0)
    assert e2e["Sum"] == pytest.approx((3 * 235 + 2 * 275 + 330) / 1000)
    # this task's percentiles, interpolated in the buckets: p50 rank 3 ends (20, 40]; p95 rank 5.7 and
    # p99 rank 5.94 fall in (100, 250] after 5 observations
    assert v["TimeToFirstTokenP50"] == pytest.approx(40.0)
    assert v["TimeToFirstTokenP95"] == pytest.approx(100 + 150 * 0.7)
    assert v["TimeToFirstTokenP99"] == pytest.approx(100 + 150 * 0.94)
    assert "TimeToFirstToken" not in model_doc(docs, TRT)  # no TTFT family for TensorRT-LLM on Triton 2.51
    idle = model_doc(documents(cycle(pipe, llm)), VLLM)
    assert not {"TimeToFirstToken", "InterTokenLatency", "TimeToFirstTokenP95"} & metric_names(idle)


# --- gauges (TensorRT-LLM) -----------------------------------------------------------------------


def triton_gauges(server: TritonServer, family: str, label: str) -> dict[str, float]:
    """The values Triton prints for one TensorRT-LLM gauge family, by category (read by prometheus_client)."""
    for fam in text_string_to_metric_families(server.metrics_text()):
        if fam.name == family:
            return {s.labels[label]: s.value for s in fam.samples if s.labels.get("model") == TRT}
    raise AssertionError(f"Triton prints no {family}")


GAUGE_METRICS = {  # EMF name -> (family, category label, value, scale)
    "RequestsActive": ("nv_trt_llm_request_metrics", "request_type", "active", 1),
    "RequestsScheduled": ("nv_trt_llm_request_metrics", "request_type", "scheduled", 1),
    "RequestsWaiting": ("nv_trt_llm_request_metrics", "request_type", "waiting", 1),
    "RequestsMax": ("nv_trt_llm_request_metrics", "request_type", "max", 1),
    "KvCacheUtilization": ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction", 100),
    "KvCacheBlocksUsed": ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "used", 1),
    "KvCacheBlocksFree": ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "free", 1),
    "KvCacheBlocksMax": ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max", 1),
    "RuntimeGpuMemory": ("nv_trt_llm_runtime_memory_metrics", "memory_type", "gpu", 1),
    "RuntimeCpuMemory": ("nv_trt_llm_runtime_memory_metrics", "memory_type", "cpu", 1),
    "RuntimePinnedMemory": ("nv_trt_llm_runtime_memory_metrics", "memory_type", "pinned", 1),
    "InflightContextTokens": (
        "nv_trt_llm_inflight_batcher_metrics",
        "inflight_batcher_specific_metric",
        "total_context_tokens",
        1,
    ),
    "InflightGenerationRequests": (
        "nv_trt_llm_inflight_batcher_metrics",
        "inflight_batcher_specific_metric",
        "generation_requests",
        1,
    ),
    "RequestsPaused": ("nv_trt_llm_inflight_batcher_metrics", "inflight_batcher_specific_metric", "paused_requests", 1),
}


def test_trt_gauges_equal_what_triton_prints(llm):
    pipe = pipeline_for(llm)
    # six sequences for a batcher of 4: sequences 1-4 active (5 and 6 queue ahead of the batcher, which
    # upstream exports nowhere); inputs 5 + 60 fit in max_num_tokens 128, 100 does not: 2 scheduled, and
    # waiting = active - scheduled = 2. KV blocks of 16 tokens:
    # ceil(15/16) + ceil(80/16) + ceil(130/16) + ceil(60/16) = 1 + 5 + 9 + 4 = 19 of 256 in use
    trt(llm, [unique(n) for n in (5, 60, 100, 20, 7, 3)], [10, 20, 30, 40, 50, 60])
    doc = model_doc(documents(cycle(pipe, llm)), TRT)  # gauges need no baseline
    expected = {
        "RequestsActive": 4,
        "RequestsScheduled": 2,
        "RequestsWaiting": 2,
        "RequestsMax": 4,
        "KvCacheUtilization": 100 * 19 / 256,
        "KvCacheBlocksUsed": 19,
        "KvCacheBlocksFree": 237,
        "KvCacheBlocksMax": 256,
        "RuntimeGpuMemory": 256 * 2 * 1024 * 1024,
        "RuntimeCpuMemory": 256 * 1024 * 1024,
        "RuntimePinnedMemory": 64 * 1024 * 1024,
        "InflightContextTokens": 5 + 60,
        "InflightGenerationRequests": 2,
        "RequestsPaused": 0,
    }
    printed = {}
    for name, (family, label, value, scale) in GAUGE_METRICS.items():
        printed[name] = triton_gauges(llm, family, label)[value] * scale
    assert printed == pytest.approx(expected)  # the model did what its docstring says ...
    assert {name: doc[name] for name in GAUGE_METRICS} == pytest.approx(printed)  # ... and EMF says the same
    assert doc["KvCacheUtilization"] == pytest.approx(7.421875)  # 0.07421875 printed: fraction x 100

    trt(llm, [unique(30), unique(2)], [2, 0])  # two sequences, one generating: nobody waits now
    doc = model_doc(documents(cycle(pipe, llm)), TRT)
    assert (doc["RequestsActive"], doc["RequestsWaiting"], doc["InflightGenerationRequests"]) == (2, 0, 1)
    assert doc["KvCacheUtilization"] == pytest.approx(100 * (2 + 1) / 256)  # ceil(32/16) + ceil(2/16)
    assert doc["KvCacheUtilization"] == pytest.approx(
        100 * triton_gauges(llm, "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type")["fraction"]
    )
    # paused (preempted): 3 x (100 in, 1500 out) need 100 blocks each, 2 fit in 256; the third is paused
    trt(llm, [unique(100) for _ in range(3)], [1500] * 3)
    doc = model_doc(documents(cycle(pipe, llm)), TRT)
    assert (doc["RequestsActive"], doc["RequestsPaused"], doc["KvCacheBlocksUsed"]) == (3, 1, 200)
    assert (doc["RequestsScheduled"], doc["RequestsWaiting"]) == (1, 2)  # 100 + 100 > 128; the paused one waits
    # Triton 2.51 (24.10) has no time-to-first-response histogram (24.11+): nothing to read for TTFT here
    assert "nv_inference_first_response_histogram_ms" not in llm.metrics_text()
    assert "TimeToFirstToken" not in doc


def test_trt_engine_steps_prefix_reuse_and_kv_transfer(llm):
    """The iteration counter (a gauge that only grows) as a rate; reused KV blocks; the disaggregated counters."""
    pipe = pipeline_for(llm)
    cycle(pipe, llm)
    before = triton_gauges(llm, "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type")["reused"]
    prompt = unique(40)  # 40 tokens: 2 full blocks of 16
    trt(llm, [prompt], [8])  # first time: nothing reused; 3 blocks transferred
    trt(llm, [prompt, unique(10)], [8, 8])  # the prompt again: 2 blocks reused; 3 + 2 blocks transferred
    trt(llm, [unique(4)], [4])  # 1 block
    result = cycle(pipe, llm)
    doc = model_doc(documents(result), TRT)
    assert doc["EngineIterationsPerSecond"] == pytest.approx(3 / result.elapsed)  # three execute() calls
    assert doc["KvCacheBlocksReused"] == before + 2
    assert doc["KvCacheTransferTimeAvg"] == pytest.approx(0.5 * (3 + 3 + 2 + 1) / 4)  # 0.5 ms per block
    idle = model_doc(documents(cycle(pipe, llm)), TRT)
    assert idle["EngineIterationsPerSecond"] == 0 and "KvCacheTransferTimeAvg" not in idle


# --- model reload (every counter and histogram of the model restarts at 0) ---------------------------


def _each_model(action) -> None:
    """Unload or load both LLM models at once (Triton handles them in parallel: half the wait)."""
    with ThreadPoolExecutor(len(LLM_MODELS)) as pool:
        assert list(pool.map(action, LLM_MODELS)) == [200] * len(LLM_MODELS)


def test_reload_between_scrapes_emits_nothing_wrong(llm):
    pipe = pipeline_for(llm)
    cycle(pipe, llm)
    for _ in range(5):
        vllm(llm, unique(6), max_tokens=10, ttft_ms=25)
    trt(llm, [unique(40)] * 3, [50, 50, 50])
    assert model_doc(documents(cycle(pipe, llm)), VLLM)["PromptTokens"] == 30
    _each_model(llm.unload)
    gone = documents(cycle(pipe, llm))  # unloaded: Triton drops every series of the models
    assert_no_negative(gone)
    for doc in gone:
        if doc.get("model") in LLM_MODELS:
            assert not set(COUNTER_DERIVED) & metric_names(doc), doc
    _each_model(llm.load)
    vllm(llm, unique(2), max_tokens=3, ttft_ms=3)
    trt(llm, [unique(4)], [5])
    back = documents(cycle(pipe, llm))  # the series are new again: a baseline, not "2 - 30" nor "+2"
    assert_no_negative(back)
    for model in LLM_MODELS:
        assert not set(COUNTER_DERIVED) & metric_names(model_doc(back, model))
    vllm(llm, unique(7), max_tokens=4, ttft_ms=25)
    trt(llm, [unique(9)], [11])
    again = documents(cycle(pipe, llm))
    v, t = model_doc(again, VLLM), model_doc(again, TRT)
    assert (v["PromptTokens"], v["GenerationTokens"], t["PromptTokens"], t["GenerationTokens"]) == (7, 4, 9, 11)
    assert v["TimeToFirstToken"]["Counts"] == [1.0]


def test_reload_with_fewer_requests_within_one_window_is_a_reset(llm):
    pipe = pipeline_for(llm)
    cycle(pipe, llm)
    for _ in range(5):
        vllm(llm, unique(6), max_tokens=10, ttft_ms=25)
    trt(llm, [unique(40)] * 3, [50, 50, 50])
    before = documents(cycle(pipe, llm))
    assert model_doc(before, VLLM)["TimeToFirstToken"]["Counts"] == [5.0]
    _each_model(llm.unload)
    _each_model(llm.load)
    # Fewer requests than before, but not smaller everywhere: the TTFT bucket le=0.005 grows from 0 to 2
    # while every other bucket, _sum and the token counters go down. One window must not mix the two.
    for _ in range(2):
        vllm(llm, unique(2), max_tokens=3, ttft_ms=3)
    trt(llm, [unique(4)], [5])
    result = cycle(pipe, llm)
    docs = documents(result)
    assert_no_negative(docs)
    for model in LLM_MODELS:
        doc = model_doc(docs, model)
        assert not set(COUNTER_DERIVED) & metric_names(doc), doc
        assert doc["ModelReady"] == 1
    assert task_doc(docs)["CounterResets"] == 2 and result.resets == 2
    assert model_doc(docs, TRT)["RequestsActive"] == 1  # gauges still flow in the reset window
    vllm(llm, unique(3), max_tokens=2, ttft_ms=3)
    after = model_doc(documents(cycle(pipe, llm)), VLLM)  # the next window is exact again
    assert (after["PromptTokens"], after["GenerationTokens"]) == (3, 2)
    assert after["TimeToFirstToken"] == {
        "Values": [3.0],
        "Counts": [1.0],
        "Max": 5.0,
        "Min": 1.0,
        "Count": 1.0,
        "Sum": pytest.approx(3.0),
    }


# --- catalog files on the real entry point -----------------------------------------------------------


class GatedMetrics:
    """A pass-through to Triton's /metrics that lets the test act between the exporter's two scrapes.

    The first scrape is served at once and then signalled (``baseline``); the second waits for
    ``release``, so exactly the requests the test sends in between fall in the window.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.scrapes = 0
        self.baseline = threading.Event()
        self.release = threading.Event()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                gate.scrapes += 1
                n = gate.scrapes
                if n > 1:
                    gate.release.wait(30)
                with urllib.request.urlopen(gate.upstream, timeout=10) as resp:
                    body = resp.read()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                if n == 1:
                    gate.baseline.set()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> GatedMetrics:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def once(
    server: TritonServer, *args: str, metrics_url: str | None = None, interval: str = "1"
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter",
            "--once",
            "--interval",
            interval,
            "--triton-url",
            server.url,
            "--triton-metrics-url",
            metrics_url or server.metrics_url,
            "--nvml",
            "off",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def emf_lines(stdout: str) -> list[dict]:
    lines = stdout.strip().splitlines()
    assert lines
    for line in lines:
        assert validate(line.encode()) == [], line[:300]
    return [orjson.loads(line) for line in lines]


def test_user_catalog_file_adds_a_custom_family(llm):
    """The shipped example file, through --catalog on the real entry point, emits the model's app:* families."""
    builtin = pipeline_for(llm)  # the built-in catalog over the same window: the control
    with GatedMetrics(llm.metrics_url) as gate:
        proc = once(llm, "--catalog", str(EXAMPLE_CATALOG), metrics_url=gate.url, interval="2")
        try:
            assert gate.baseline.wait(30), proc.stderr.read() if proc.poll() is not None else "no first scrape"
            cycle(builtin, llm)
            hit = unique(5)
            vllm(llm, hit, max_tokens=4, tool_ms=30)  # a miss, then two hits of the prompt cache
            vllm(llm, hit, max_tokens=4, tool_ms=30)
            vllm(llm, hit, max_tokens=4, tool_ms=70)
            vllm(llm, unique(5), max_tokens=4)  # no tool call
            control = model_doc(documents(cycle(builtin, llm)), VLLM)
        finally:
            gate.release.set()
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert gate.scrapes == 2
    v = model_doc(emf_lines(out), VLLM)
    assert v["PromptCacheHits"] == 2
    elapsed = float(re.search(r"^window ([0-9.]+)s", err, re.M).group(1))
    assert v["PromptCacheHitsPerSecond"] == pytest.approx(2 / elapsed, rel=0.02)  # the table rounds elapsed
    # tool-call buckets 0.05 0.1 0.5 1 5 s: 30 ms twice in (0, 50], 70 ms in (50, 100]
    assert v["ToolCallTime"] == {
        "Values": [25.0, 75.0],
        "Counts": [2.0, 1.0],
        "Max": 100.0,
        "Min": 0.0,
        "Count": 3.0,
        "Sum": pytest.approx(130.0),
    }
    assert v["PromptTokens"] == 20 and v["RequestSuccess"] == 4  # the built-in packs are still there
    unit = {m["Name"]: m["Unit"] for d in v["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert unit["ToolCallTime"] == "Milliseconds" and unit["PromptCacheHitsPerSecond"] == "Count/Second"
    assert control["PromptTokens"] == 20  # same window, built-in catalog: the custom families are not read
    assert not {"PromptCacheHits", "PromptCacheHitsPerSecond", "ToolCallTime"} & metric_names(control)


BAD_CATALOGS = {  # case -> (file text, the entry named, the problem named)
    "unknown kind": (
        '[[metric]]\nname = "Foo"\nscope = "model"\nunit = "Count"\nkind = "average"\n'
        'help = "h"\ninputs = ["vllm:prompt_tokens_total"]\n',
        "metric 'Foo'",
        "unknown kind 'average'",
    ),
    "bad unit": (
        '[[metric]]\nname = "Foo"\nscope = "model"\nunit = "Tokens"\nkind = "delta"\nhelp = "h"\n'
        'inputs = ["vllm:prompt_tokens_total"]\n',
        "metric 'Foo'",
        "unit 'Tokens' is not a CloudWatch unit",
    ),
    "split label the family lacks": (
        '[families]\n"app:hits_total" = { type = "counter", labels = ["model", "version"] }\n\n'
        '[[metric]]\nname = "Foo"\nscope = "model"\nunit = "Count"\nkind = "delta"\nhelp = "h"\n'
        'inputs = [{ family = "app:hits_total", split = "reason", select = "BACKEND" }]\n',
        "metric 'Foo'",
        "family 'app:hits_total' has no label 'reason' to split on",
    ),
    "duplicate EMF name": (
        '[[metric]]\nname = "PromptTokens"\nscope = "model"\nunit = "Count"\nkind = "delta"\n'
        'help = "h"\ninputs = ["vllm:prompt_tokens_total"]\n',
        "metric 'PromptTokens'",
        "duplicate EMF name (already defined in llm.toml (built in))",
    ),
    "ratio without denominator": (
        '[[metric]]\nname = "Foo"\nscope = "model"\nunit = "None"\nkind = "ratio"\n'
        'help = "h"\ninputs = ["vllm:prompt_tokens_total"]\n',
        "metric 'Foo'",
        "a ratio needs denominators",
    ),
    "name over 255 characters": (
        f'[[metric]]\nname = "{"N" * 256}"\nscope = "model"\nunit = "Count"\n'
        'kind = "delta"\nhelp = "h"\ninputs = ["vllm:prompt_tokens_total"]\n',
        f"metric '{'N' * 256}'",
        "name is 256 characters; CloudWatch allows 255",
    ),
    "unknown family": (
        '[[metric]]\nname = "Foo"\nscope = "model"\nunit = "Count"\nkind = "delta"\nhelp = "h"\n'
        'inputs = ["app:nope_total"]\n',
        "metric 'Foo'",
        "unknown family 'app:nope_total'",
    ),
    "histogram read as a counter": (
        '[[metric]]\nname = "Foo"\nscope = "model"\nunit = "Count"\nkind = "delta"\nhelp = "h"\n'
        'inputs = ["vllm:time_to_first_token_seconds"]\n',
        "metric 'Foo'",
        "kind delta cannot read histogram family 'vllm:time_to_first_token_seconds'",
    ),
    "not TOML": ('[[metric]\nname = "Foo"\n', "", "not valid TOML"),
}


@pytest.mark.parametrize("case", sorted(BAD_CATALOGS))
def test_bad_catalog_file_fails_at_start_in_one_line(llm, tmp_path, case):
    text, entry, problem = BAD_CATALOGS[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    proc = once(llm, "--catalog", str(path))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    assert out == ""  # nothing emitted: it stopped before the first scrape
    [line] = err.strip().splitlines()
    assert line.startswith(f"exporter: error: invalid catalog: {path}: {entry}"), line
    assert problem in line, line


# --- the demo's LLM traffic through --once -----------------------------------------------------------


def test_once_shows_the_llm_table_for_the_demo_traffic(llm):
    stop = threading.Event()
    thread = threading.Thread(target=demo_llm.traffic, args=(llm, stop))
    thread.start()
    try:
        proc = once(llm, interval="1.5")
        out, err = proc.communicate(timeout=60)
    finally:
        stop.set()
        thread.join(10)
    assert proc.returncode == 0, err
    docs = emf_lines(out)
    table = err.split("LLM serving (p95 of this task's window)\n", 1)[1].split("\n\n", 1)[0].splitlines()
    header, rows = table[0].split(), {r.split()[0]: r.split() for r in table[1:]}
    assert header[:2] == ["model", "ver"] and set(rows) == {VLLM, TRT}
    v, t = model_doc(docs, VLLM), model_doc(docs, TRT)
    assert v["TimeToFirstToken"]["Count"] > 0 and v["RequestSuccess"] > 0  # not equal: a request may be in flight
    assert set(v["TimeToFirstToken"]["Values"]) <= {30.0, 50.0, 70.0, 175.0, 375.0}  # the demo's 25 45 65 120 300
    assert t["GenerationTokens"] > 0 and 0 < t["KvCacheUtilization"] <= 100
    assert rows[TRT][2:4] == ["-", "-"]  # no TTFT or ITL for TensorRT-LLM on this Triton
    assert float(rows[VLLM][2]) in v["TimeToFirstToken"]["Values"]  # TTFT p95 ms: one of the bucket values


def test_health_probe_smoke_inference_passes_on_the_llm_models(llm):
    """The session server leaves the LLM models out; the probe's synthesised request must suit them too."""
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "health", "--triton-url", llm.url, "--smoke", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    smoke = {c["model"]: c["status"] for c in orjson.loads(proc.stdout)["checks"] if c["check"] == "smoke"}
    assert smoke == {TRT: "ok", VLLM: "ok"}
