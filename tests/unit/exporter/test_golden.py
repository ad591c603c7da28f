"""Golden-file tests: fixed /metrics payloads in, exact EMF out (node_exporter's end-to-end pattern).

Each folder under tests/fixtures/golden holds metrics-1.txt (the baseline
scrape), metrics-2.txt (60 s later), index.json, and expected.jsonl (the EMF
documents of the second window, one per line). ``real_triton`` was captured
from the real server with known traffic; so were ``vllm`` and ``tensorrt_llm``
(the LLM sample models), reproducibly, with ``python -m tests.support.capture_golden``
(its docstring has the steps); the hand checks at the end recompute them from
that traffic. After an intended output change:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/exporter/test_golden.py

and review the diff of expected.jsonl like code. The ``exporter_version``
property is written as ``"<version>"`` so that a version bump changes no
golden file (test_golden_files_survive_a_version_bump).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

import exporter
from exporter import pipeline as pipeline_module
from exporter.config import Settings
from exporter.pipeline import Pipeline
from telemetry.emf_validate import validate
from tests.support.helpers import CATALOG, IndexSource, TextSource
from tests.support.paths import FIXTURES

GOLDEN = FIXTURES / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
T0_WALL = 1_796_000_000.0  # fixed wall clock: timestamps in the golden files never change


def run_case(case: Path) -> list[bytes]:
    texts = [(case / f"metrics-{i}.txt").read_text() for i in (1, 2)]
    clock = [100.0]
    configs_file = case / "configs.json"  # "model/version" -> what GET /v2/models/{m}/versions/{v}/config answers
    configs = orjson.loads(configs_file.read_bytes()) if configs_file.exists() else {}
    index = IndexSource((case / "index.json").read_bytes(), {k: orjson.dumps(v) for k, v in configs.items()})
    pipe = Pipeline(
        Settings(namespace="Triton", nvml="off"),
        CATALOG,
        [TextSource(*texts), index],
        clock=lambda: clock[0],
        wall=lambda: T0_WALL + clock[0],
    )
    pipe.cycle()
    clock[0] += 60.0
    return pipe.cycle().events


VERSION_PLACEHOLDER = b'"exporter_version":"<version>"'


def without_version(events: list[bytes], version: str) -> list[bytes]:
    """The events with their exporter_version property (task, source and GPU events) set to the placeholder."""
    written = b'"exporter_version":' + orjson.dumps(version)
    assert sum(e.count(written) for e in events) >= 2, "no event carries the exporter's version"
    out = []
    for e in events:
        assert e.count(b'"exporter_version":') == e.count(written) <= 1, e[:300]
        out.append(e.replace(written, VERSION_PLACEHOLDER))
    return out


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    events = run_case(GOLDEN / case)
    now_ms = int((T0_WALL + 160.0) * 1000)
    for e in events:
        assert validate(e, now_ms=now_ms) == [], e[:300]
    expected_file = GOLDEN / case / "expected.jsonl"
    actual = b"\n".join(without_version(events, exporter.__version__)) + b"\n"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        expected_file.write_bytes(actual)
    assert expected_file.exists(), f"no golden file for {case}: run with UPDATE_GOLDEN=1"
    expected = expected_file.read_bytes()
    if actual != expected:  # compare parsed, for a readable diff
        assert [orjson.loads(x) for x in actual.splitlines()] == [orjson.loads(x) for x in expected.splitlines()]
        assert actual == expected


def test_golden_files_survive_a_version_bump(monkeypatch):
    """A release changes the version in the events, and no golden file."""
    monkeypatch.setattr(pipeline_module, "__version__", "99.1.0rc2")
    for case in CASES:
        events = run_case(GOLDEN / case)
        assert {orjson.loads(e).get("exporter_version") for e in events} == {"99.1.0rc2", None}  # None: model events
        actual = b"\n".join(without_version(events, "99.1.0rc2")) + b"\n"
        assert actual == (GOLDEN / case / "expected.jsonl").read_bytes(), case


def test_golden_values_are_the_arithmetic_of_the_fixture():
    """The goldens are not just snapshots: spot-check them against hand arithmetic."""
    docs = [orjson.loads(x) for x in run_case(GOLDEN / "gpu_multi_instance")]
    resnet = next(d for d in docs if d.get("model") == "resnet")
    assert resnet["RequestSuccess"] == 60 + 30  # summed across the two GPU instances
    assert resnet["RequestFailure"] == 2 and resnet["RequestFailureBackend"] == 1
    assert resnet["RequestFailureRejected"] == 1
    assert resnet["RequestsPerSecond"] == pytest.approx(90 / 60)
    assert resnet["AverageBatchSize"] == pytest.approx(360 / 45)
    assert resnet["RequestLatencyAvg"] == pytest.approx(900_000 / 90)
    assert resnet["QueueLatencyAvg"] == pytest.approx(90_000 / 90)
    assert resnet["PendingRequests"] == 4
    assert resnet["ModelLoadDuration"] == 12.5
    # bucket deltas: <=100: 10, <=500: 50, <=2000: 90, <=5000: 90, +Inf: 90 -> per bucket 10, 40, 40 at the
    # midpoints 50, 300, 1250; Min/Max are the edges of the lowest and highest non-empty buckets; Sum is _sum's delta.
    # resnet is not decoupled (configs.json): its first response is the whole response, a request latency (26.01+)
    assert "TimeToFirstToken" not in resnet
    assert resnet["RequestLatency"] == {
        "Values": [50.0, 300.0, 1250.0],
        "Counts": [10.0, 40.0, 40.0],
        "Max": 2000.0,
        "Min": 0.0,
        "Count": 90.0,
        "Sum": 161399 - 99999,
    }
    gpus = {d["gpu"]: d for d in docs if "gpu" in d}
    assert gpus["0"]["gpu_uuid"] == "GPU-aaaa" and gpus["0"]["GpuUtilization"] == pytest.approx(91)
    assert gpus["0"]["GpuMemoryUsedPercent"] == pytest.approx(100 * 23 / 24)
    assert gpus["0"]["GpuEnergyJoules"] == 16800 and gpus["1"]["GpuEnergyJoules"] == 7200
    task = next(d for d in docs if "ExporterHeartbeat" in d)
    assert task["ModelsReady"] == 1 and task["ModelsNotReady"] == 0  # v1 unloaded on purpose


def test_golden_restart_and_churn():
    docs = [orjson.loads(x) for x in run_case(GOLDEN / "restart")]
    alpha = next(d for d in docs if d.get("model") == "alpha")
    assert "RequestSuccess" not in alpha and "RequestLatencyAvg" not in alpha  # reset: new baseline
    assert alpha["PendingRequests"] == 0  # gauges still flow
    assert not any(d.get("model") == "beta" for d in docs)  # vanished model: no event
    task = next(d for d in docs if "ExporterHeartbeat" in d)
    assert task["CounterResets"] == 1


def test_golden_hostile_names_are_safe_and_kept():
    docs = [orjson.loads(x) for x in run_case(GOLDEN / "hostile_names")]
    models = [d for d in docs if "model" in d]
    assert {d.get("model_original", d["model"]) for d in models} == {
        "m@x.v2+b",
        "modèle-ü",
        'quote"and\\back',
        "x" * 2000,
        "tab\tname",
    }
    for d in models:
        assert d["model"].isascii() and d["model"].isprintable() and len(d["model"]) <= 1024
    assert next(d for d in models if d["model"] == "m@x.v2+b")["RequestSuccess"] == 9  # printable ASCII: unchanged
    failed = next(d for d in models if d.get("version") == "2")
    assert failed["ModelReady"] == 0 and len(failed["reason"]) <= 4096


def _model(case: str, model: str) -> dict:
    docs = [orjson.loads(x) for x in run_case(GOLDEN / case)]
    [doc] = [d for d in docs if d.get("model") == model]
    return doc


def test_golden_vllm_is_the_arithmetic_of_the_captured_traffic():
    """tests/support/capture_golden.py VLLM_WINDOW: six requests in the 60 s window (the warm-up is in the baseline)."""
    v = _model("vllm", "vllm_model")
    assert v["RequestSuccess"] == 6
    assert v["PromptTokens"] == 3 + 5 + 12 + 40 + 7 + 120 == 187
    assert v["GenerationTokens"] == 8 + 20 + 1 + 64 + 16 + 200 == 309
    assert v["PromptTokensPerSecond"] == pytest.approx(187 / 60)
    assert v["GenerationTokensPerSecond"] == pytest.approx(309 / 60)
    # TTFT 25, 25 ms in (20, 40] -> 30; 45 in (40, 60] -> 50; 65 in (60, 80] -> 70; 120 in (100, 250] -> 175;
    # 300 in (250, 500] -> 375. Sum is the _sum delta; Min/Max the edges of the outer non-empty buckets
    ttft = v["TimeToFirstToken"]
    assert ttft["Values"] == [30.0, 50.0, 70.0, 175.0, 375.0] and ttft["Counts"] == [2.0, 1.0, 1.0, 1.0, 1.0]
    assert (ttft["Min"], ttft["Max"], ttft["Count"]) == (20.0, 500.0, 6.0)
    assert ttft["Sum"] == pytest.approx(25 + 25 + 65 + 120 + 300 + 45)
    # p50: rank 3 is reached at le 60 (40 + 20 x 1/1); p95: rank 5.7 in (250, 500] after 5 (250 + 250 x 0.7)
    assert v["TimeToFirstTokenP50"] == pytest.approx(60.0)
    assert v["TimeToFirstTokenP95"] == pytest.approx(425.0)
    # max_tokens - 1 tokens each: 7 + 19 + 0 + 63 + 199 at 30 ms, in (25, 50]; 15 at 80 ms, in (75, 100]
    itl = v["InterTokenLatency"]
    assert (itl["Values"], itl["Counts"], itl["Min"], itl["Max"]) == ([37.5, 87.5], [288.0, 15.0], 25.0, 100.0)
    assert itl["Sum"] == pytest.approx(288 * 30 + 15 * 80)
    # e2e = ttft + (max_tokens - 1) x itl: 235, 595, 65 ms in (0, 1] s; 2.01, 1.5 s in (1, 2.5]; 6.015 in (5, 10]
    e2e = v["EndToEndLatency"]
    assert (e2e["Values"], e2e["Counts"], e2e["Min"], e2e["Max"]) == ([0.5, 1.75, 7.5], [3.0, 2.0, 1.0], 0.0, 10.0)
    assert e2e["Sum"] == pytest.approx(0.235 + 0.595 + 0.065 + 2.010 + 1.500 + 6.015)
    # 1-2-5 length buckets: prompts 3, 5 in (2, 5]; 7 in (5, 10]; 12 in (10, 20]; 40 in (20, 50]; 120 in (100, 200]
    assert v["PromptLength"] == {
        "Values": [3.5, 7.5, 15.0, 35.0, 150.0],
        "Counts": [2.0, 1.0, 1.0, 1.0, 1.0],
        "Max": 200.0,
        "Min": 2.0,
        "Count": 6.0,
        "Sum": 187.0,
    }
    assert v["GenerationLength"] == {
        "Values": [0.5, 7.5, 15.0, 75.0, 150.0],
        "Counts": [1.0, 1.0, 2.0, 1.0, 1.0],
        "Max": 200.0,
        "Min": 0.0,
        "Count": 6.0,
        "Sum": 309.0,
    }


def test_golden_tensorrt_llm_is_the_arithmetic_of_the_captured_traffic():
    """tests/support/capture_golden.py TRT_WINDOW: a request of 3 sequences, then one of 6 (which sets the gauges)."""
    t = _model("tensorrt_llm", "tensorrt_llm")
    assert (t["RequestSuccess"], t["InferenceCount"], t["AverageBatchSize"]) == (2, 9, 4.5)
    # lengths once per Triton request, the row that finished last (most output tokens), as the C++ backend:
    # (30 in, 1500 out) of the first request, (3, 60) of the second; the other 7 rows are not counted
    assert t["PromptTokens"] == 30 + 3 == 33  # nv_llm_input_token_len_sum: upstream under-counts batched requests
    assert t["GenerationTokens"] == 1500 + 60 == 1560
    assert t["GenerationTokensPerSecond"] == pytest.approx(1560 / 60)
    # the last request: 6 sequences, 4 admitted (2 queued ahead of the batcher: exported nowhere); inputs
    # 5 + 60 fit in max_num_tokens 128, 100 does not: 2 scheduled, waiting = active - scheduled = 2
    assert (t["RequestsActive"], t["RequestsScheduled"], t["RequestsWaiting"], t["RequestsMax"]) == (4, 2, 2, 4)
    assert t["RequestsWaiting"] <= t["RequestsActive"]
    # KV blocks of 16 tokens for the 4 active: ceil(15/16) + ceil(80/16) + ceil(130/16) + ceil(60/16) = 19 of 256
    assert t["KvCacheUtilization"] == 100 * 19 / 256 == 7.421875
    assert (t["KvCacheBlocksUsed"], t["KvCacheBlocksFree"], t["KvCacheBlocksMax"]) == (19, 237, 256)
    assert (t["RequestsPaused"], t["KvCacheBlocksReused"]) == (0, 0)  # all fit; no prompt repeated
    assert t["InflightContextTokens"] == 5 + 60 and t["InflightGenerationRequests"] == 2
    assert t["RuntimeGpuMemory"] == 256 * 2 * 1024 * 1024
    assert t["EngineIterationsPerSecond"] == pytest.approx(2 / 60)  # two execute() calls in the 60 s window
    # KV transfer, 0.5 ms per block: the first request schedules (200, 100) alone (19 blocks), the second
    # (5, 10) and (60, 20) (1 + 5 blocks): 12.5 ms for 3 requests
    assert t["KvCacheTransferTimeAvg"] == pytest.approx(12.5 / 3)
    # buckets 10 50 100 500 1000: inputs 30 in (10, 50], 3 in (0, 10]; outputs 60 in (50, 100], 1500 in +Inf
    # (its value is its lower edge 1000)
    assert t["PromptLength"] == {
        "Values": [5.0, 30.0],
        "Counts": [1.0, 1.0],
        "Max": 50.0,
        "Min": 0.0,
        "Count": 2.0,
        "Sum": 33.0,
    }
    assert t["GenerationLength"] == {
        "Values": [75.0, 1000.0],
        "Counts": [1.0, 1.0],
        "Max": 1000.0,
        "Min": 50.0,
        "Count": 2.0,
        "Sum": 1560.0,
    }
    assert t["PromptLength"]["Count"] == t["RequestSuccess"]  # one observation per Triton request
    assert "TimeToFirstToken" not in t  # Triton 2.51 prints no first-response histogram


def test_golden_response_cache_is_the_arithmetic_of_the_captured_traffic():
    """capture_golden.py CACHE_WINDOW on a real 2.51 with the response cache on: [1, 2] three times (hits: the
    warm-up cached it), [3, 4] twice (a miss, then a hit), [5, 6] once (a miss)."""
    docs = [orjson.loads(x) for x in run_case(GOLDEN / "response_cache")]
    [add] = [d for d in docs if d.get("model") == "add"]
    assert (add["CacheHits"], add["CacheMisses"], add["RequestSuccess"]) == (4, 2, 6)
    assert add["CacheHitRate"] == pytest.approx(100 * 4 / 6)
    assert add["InferenceCount"] == 2  # a hit is a success, not an inference
    # Triton never creates the request summary of a model with the cache on: no RequestLatencyP*, while the
    # queue summary is there
    assert not {"RequestLatencyP50", "RequestLatencyP95", "RequestLatencyP99"} & set(add)
    assert {"QueueLatencyP50", "QueueLatencyP95", "QueueLatencyP99"} <= set(add)
    assert add["QueueLatencyP50"] <= add["QueueLatencyP95"] <= add["QueueLatencyP99"]
    task = next(d for d in docs if "ExporterHeartbeat" in d)
    assert task["PinnedMemoryPoolTotal"] == 256 * 1024 * 1024 and task["PinnedMemoryPoolUsed"] == 0
    assert task["CpuMemoryTotal"] > task["CpuMemoryUsed"] > 0
    assert task["CpuMemoryUsedPercent"] == pytest.approx(100 * task["CpuMemoryUsed"] / task["CpuMemoryTotal"])
