"""Golden-file tests: fixed /metrics payloads in, exact EMF out (node_exporter's end-to-end pattern).

Each folder under tests/fixtures/golden holds metrics-1.txt (the baseline
scrape), metrics-2.txt (60 s later), index.json, and expected.jsonl (the EMF
documents of the second window, one per line). ``real_triton`` was captured
from the real server with known traffic. After an intended output change:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py

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
from exporter.emf_validate import validate
from exporter.pipeline import Pipeline

from .helpers import CATALOG, IndexSource, TextSource

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
T0_WALL = 1_796_000_000.0  # fixed wall clock: timestamps in the golden files never change


def run_case(case: Path) -> list[bytes]:
    texts = [(case / f"metrics-{i}.txt").read_text() for i in (1, 2)]
    clock = [100.0]
    pipe = Pipeline(
        Settings(namespace="Triton", nvml="off"), CATALOG,
        [TextSource(*texts), IndexSource((case / "index.json").read_bytes())],
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
    # midpoints 50, 300, 1250; Min/Max are the edges of the lowest and highest non-empty buckets; Sum is _sum's delta
    assert resnet["TimeToFirstToken"] == {"Values": [50.0, 300.0, 1250.0], "Counts": [10.0, 40.0, 40.0],
                                          "Max": 2000.0, "Min": 0.0, "Count": 90.0, "Sum": 161399 - 99999}
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
        "m@x.v2+b", "modèle-ü", 'quote"and\\back', "x" * 2000, "tab\tname"
    }
    for d in models:
        assert d["model"].isascii() and d["model"].isprintable() and len(d["model"]) <= 1024
    assert next(d for d in models if d["model"] == "m@x.v2+b")["RequestSuccess"] == 9  # printable ASCII: unchanged
    failed = next(d for d in models if d.get("version") == "2")
    assert failed["ModelReady"] == 0 and len(failed["reason"]) <= 4096
