"""The core exporter against a real Triton server (demo.triton, from the nvidia-pytriton wheel)."""

from __future__ import annotations

import itertools
import signal
import statistics
import subprocess
import sys
import threading
import time

import orjson
import pytest

from telemetry.emf_validate import validate
from tests.support.helpers import (
    documents,
    metric_names,
    model_doc,
    pipeline_for,
    success_count,
    task_doc,
    wait_counted,
)
from tests.support.paths import REPO
from tests.support.render_refs import alarm_refs

pytestmark = pytest.mark.triton
ROOT = REPO


def slow(server, n: int) -> None:
    for _ in range(n):
        status, body = server.infer("slow", [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}])
        assert status == 200, body


def test_interval_deltas_equal_requests_sent(triton):
    pipe = pipeline_for(triton)
    first = pipe.cycle()
    assert first.elapsed is None  # baseline: no counter-derived value yet
    assert all("RequestSuccess" not in d for d in documents(first))
    add_before, slow_before = success_count(triton, "add"), success_count(triton, "slow")
    triton.infer_add(7)
    slow(triton, 3)
    wait_counted(triton, "add", add_before + 7)
    wait_counted(triton, "slow", slow_before + 3)
    second = pipe.cycle()
    docs = documents(second)
    add = model_doc(docs, "add")
    assert add["RequestSuccess"] == 7
    assert add["InferenceCount"] == 7
    assert add["ExecutionCount"] == 7
    assert add["RequestFailure"] == 0
    assert add["AverageBatchSize"] == 1
    assert add["RequestsPerSecond"] == pytest.approx(7 / second.elapsed)
    slow_doc = model_doc(docs, "slow")
    assert slow_doc["RequestSuccess"] == 3
    # The model sleeps 50 ms per request: averages must be plausible, not just positive.
    assert 50_000 <= slow_doc["RequestLatencyAvg"] < 150_000
    assert 50_000 <= slow_doc["ComputeInferLatencyAvg"] <= slow_doc["RequestLatencyAvg"]
    assert 0 <= slow_doc["QueueLatencyAvg"] < slow_doc["RequestLatencyAvg"]
    assert slow_doc["ComputeLatencyAvg"] == pytest.approx(
        slow_doc["ComputeInputLatencyAvg"] + slow_doc["ComputeInferLatencyAvg"] + slow_doc["ComputeOutputLatencyAvg"]
    )
    assert 50_000 <= slow_doc["RequestLatencyP95"] < 150_000  # summary_latencies=true on the fixture server
    # A third window with no traffic: zero deltas, and no averages over an empty denominator.
    third = documents(pipe.cycle())
    add3 = model_doc(third, "add")
    assert add3["RequestSuccess"] == 0
    assert "RequestLatencyAvg" not in add3 and "AverageBatchSize" not in add3
    assert "RequestLatencyP95" not in add3  # the 60 s summary window still has old data: not this window's


def test_model_that_raises_is_counted_as_failed_with_reason_backend_and_breaches_the_failure_alarm(triton):
    """``fails`` raises for X <= 0: Triton counts those under BACKEND (an error *response* counts as a success)."""
    pipe = pipeline_for(triton)
    pipe.cycle()
    sent = [1.0, -1.0, 2.0, 0.0, -3.0, 4.0, -5.0, -6.0, 7.0, -8.0]  # 6 raise, 4 answer
    raising = sum(x <= 0 for x in sent)
    for x in sent:
        status, body = triton.infer("fails", [{"name": "X", "datatype": "FP32", "shape": [1], "data": [x]}])
        assert status == (500 if x <= 0 else 200), body
        if x <= 0:
            assert "RuntimeError: sample model always fails on X <= 0" in body["error"]
    docs = documents(pipe.cycle())
    fails = model_doc(docs, "fails")
    assert fails["RequestFailure"] == raising
    assert fails["RequestFailureBackend"] == raising
    assert fails["RequestSuccess"] == len(sent) - raising
    # The committed failure alarm reads RequestFailure on the model rollup; this window alone breaches it.
    alarm = orjson.loads((ROOT / "alarms" / "cli" / "alarm-model-failures.json").read_bytes())
    assert alarm_refs(alarm) == [("Triton", "RequestFailure", frozenset({"model"}))]
    declared = [
        d["Dimensions"]
        for d in fails["_aws"]["CloudWatchMetrics"]
        if any(m["Name"] == "RequestFailure" for m in d["Metrics"])
    ]
    assert ["model"] in declared[0]
    assert fails["RequestFailure"] > alarm["Threshold"]


def test_failed_model_is_not_ready_with_its_reason(triton):
    docs = documents(pipeline_for(triton).cycle())
    broken = model_doc(docs, "broken")
    assert broken["ModelReady"] == 0
    assert broken["state"] == "UNAVAILABLE"
    assert "boom" in broken["reason"]
    assert model_doc(docs, "add")["ModelReady"] == 1
    task = task_doc(docs)
    assert task["TritonUp"] == 1
    assert task["ModelsNotReady"] == 1
    assert task["ModelsReady"] == 4
    assert task["ModelLoadSuccessRate"] == pytest.approx(80.0)
    assert task["ParseErrors"] == 0  # Triton's "Nan" quantiles of idle models are valid values


def test_unloaded_version_is_not_counted_as_not_ready(triton_factory):
    server = triton_factory(["add", "slow"])
    server.unload("slow")
    docs = documents(pipeline_for(server).cycle())
    task = task_doc(docs)
    assert task["ModelsReady"] == 1
    assert task["ModelsNotReady"] == 0
    assert all(d.get("model") != "slow" or "ModelReady" not in d for d in docs)


def test_triton_restart_between_scrapes_gives_no_negative_or_inflated_values(triton_factory):
    server = triton_factory(["add"])
    pipe = pipeline_for(server)
    pipe.cycle()
    server.infer_add(5)
    wait_counted(server, "add", 5)
    assert model_doc(documents(pipe.cycle()), "add")["RequestSuccess"] == 5
    server.restart()
    server.infer_add(2)  # counters now read 2 < 5: a reset, not -3 and not +2
    wait_counted(server, "add", 2)
    after = pipe.cycle()
    docs = documents(after)
    for doc in docs:
        for name in metric_names(doc):
            assert doc[name] >= 0, (name, doc[name])
    assert "RequestSuccess" not in model_doc(docs, "add")
    assert task_doc(docs)["CounterResets"] == 1
    server.infer_add(3)
    wait_counted(server, "add", 5)
    assert model_doc(documents(pipe.cycle()), "add")["RequestSuccess"] == 3  # next window is right again


def test_triton_down_marks_sources_failed_and_keeps_going(triton_factory):
    server = triton_factory(["add"])
    pipe = pipeline_for(server, timeout=1.0, connect_timeout=0.5)
    pipe.cycle()
    server.stop()
    docs = documents(pipe.cycle())
    task = task_doc(docs)
    assert task["TritonUp"] == 0
    up = {d["source"]: d["SourceUp"] for d in docs if "SourceUp" in d}
    assert up == {"triton_metrics": 0, "triton_index": 0}
    assert not any("model" in d for d in docs)
    server.start()
    pipe.cycle()  # first scrape after an outage is a new baseline
    server.infer_add(4)
    wait_counted(server, "add", 4)
    assert model_doc(documents(pipe.cycle()), "add")["RequestSuccess"] == 4


def _traffic(server, stop: threading.Event) -> None:
    while not stop.is_set():
        server.infer_add(1)
        time.sleep(0.02)


def test_once_prints_valid_emf_and_a_summary(triton):
    stop = threading.Event()
    thread = threading.Thread(target=_traffic, args=(triton, stop))
    thread.start()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter",
                "--once",
                "--interval",
                "1",
                "--triton-url",
                triton.url,
                "--triton-metrics-url",
                triton.metrics_url,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    finally:
        stop.set()
        thread.join()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines
    for line in lines:
        assert validate(line.encode()) == []
    docs = [orjson.loads(line) for line in lines]
    assert model_doc(docs, "add")["RequestSuccess"] > 0
    table = proc.stderr
    assert "model" in table and "broken" in table and "UNAVAILABLE" in table
    assert not any(line.startswith('{"_aws"') for line in table.splitlines())  # EMF never on stderr


def test_once_against_unreachable_triton_names_the_url(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "--once",
            "--interval",
            "1",
            "--triton-url",
            "http://127.0.0.1:9",
            "--triton-metrics-url",
            "http://127.0.0.1:9/metrics",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert proc.returncode == 1
    [last] = proc.stderr.strip().splitlines()  # one line: --once logs below error level are held back
    assert last.startswith("exporter: error: cannot read Triton:")
    assert "http://127.0.0.1:9/metrics" in last and "Connection refused" in last
    assert proc.stdout == ""


def test_loop_emits_on_schedule_and_stops_on_sigterm_within_2s(triton, tmp_path):
    out = tmp_path / "emf.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter",
            "--interval",
            "0.5",
            "--output",
            f"file:{out}",
            "--triton-url",
            triton.url,
            "--triton-metrics-url",
            triton.metrics_url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if out.exists() and sum(1 for line in out.read_bytes().splitlines() if b"ExporterHeartbeat" in line) >= 4:
                break
            time.sleep(0.05)
        heartbeats = [orjson.loads(line) for line in out.read_bytes().splitlines() if b"ExporterHeartbeat" in line]
        assert len(heartbeats) >= 4
        stamps = [d["_aws"]["Timestamp"] for d in heartbeats]
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        # The rate is 500 ms, not the 15 s default nor back-to-back; single gaps vary under load.
        assert all(g > 0 for g in gaps) and 250 <= statistics.median(gaps) <= 1000, gaps
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)  # one that ignored SIGTERM would never exit
        assert time.monotonic() - start < 20  # a bound against waiting out something long, not a measurement
        assert rc == 0  # a handled SIGTERM, not the default one that kills (-15)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read().decode()
    for line in stderr.splitlines():
        assert orjson.loads(line)["logger"].startswith("exporter")  # own logs: JSON lines only
