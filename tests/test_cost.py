"""The cost estimate counts what the real pipeline emits, and docs/dashboards.md shows the current numbers."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from demo.payloads import triton_metrics
from exporter.catalog import wanted_series
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.promtext import Parser
from exporter.render import cost
from exporter.sources import Collected, VersionState
from exporter.sources.nvml import NvmlSource
from exporter.sources.nvml_fake import FakeNvml, gpus

ROOT = Path(__file__).resolve().parent.parent


class FixedSource:
    def __init__(self, name: str, collect) -> None:  # type: ignore[no-untyped-def]
        self.name = name
        self.collect = lambda timeout: collect()

    def close(self) -> None:
        pass


def pipeline_events(models: int, versions: int, n_gpus: int) -> list[bytes]:
    """The second cycle of the real pipeline: models x versions, n_gpus on NVML (HBM boards) and DCGM series."""
    step = [1]
    fake = gpus(n_gpus)
    for g in fake:
        g.temp_mem = 60  # every NVML field supported, as the estimate assumes
    nvml = FakeNvml(fake)
    uuids = [g.uuid for g in fake]
    names = [f"model_{i:05d}" for i in range(models)]
    parser = Parser(wanted_series())

    def metrics() -> Collected:
        # One body per version, concatenated without HELP/TYPE lines (the parser then reads the whole body).
        text = "".join(triton_metrics(names, step[0], gpus=uuids if v == 0 else (), version=str(v + 1))
                       for v in range(versions))
        return Collected(samples=parser.parse("".join(ln + "\n" for ln in text.splitlines() if ln[:1] != "#")))

    index = [VersionState(m, str(v + 1), "READY") for m in names for v in range(versions)]
    srcs = [FixedSource("triton_metrics", metrics), FixedSource("triton_index", lambda: Collected(index=index))]
    if n_gpus:
        nv = NvmlSource(nvml, environ={})
        nv.start()
        srcs.append(nv)
    clock = [0.0]
    p = Pipeline(Settings(), srcs,
                 clock=lambda: clock[0], wall=lambda: 1_700_000_000.0)
    p.cycle()
    step[0] += 1
    clock[0] += 60.0
    events = p.cycle().events
    p.close()
    return events


def distinct_metrics(events: list[bytes]) -> set[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """What CloudWatch bills: each (namespace, metric, dimension values) once."""
    out = set()
    for raw in events:
        doc = orjson.loads(raw)
        for d in doc["_aws"]["CloudWatchMetrics"]:
            for m in d["Metrics"]:
                for dims in d["Dimensions"]:
                    out.add((d["Namespace"], m["Name"], tuple((k, doc[k]) for k in dims)))
    return out


@pytest.mark.parametrize(("models", "versions", "n_gpus"), [(5, 1, 1), (7, 2, 2), (3, 1, 0)])
def test_metric_count_equals_what_the_pipeline_emits(models: int, versions: int, n_gpus: int) -> None:
    events = pipeline_events(models, versions, n_gpus)
    d = cost.Deployment(models=models, versions=versions, gpus=n_gpus, load_duration=False, ecs_metadata=False)
    assert cost.metric_count(d) == len(distinct_metrics(events))


def test_metric_count_is_the_same_for_many_tasks() -> None:
    """Tasks share every dimension value (no task id): more tasks add bytes, not metrics."""
    one, four = cost.estimate(cost.Deployment(5, tasks=1)), cost.estimate(cost.Deployment(5, tasks=4))
    assert one.metrics == four.metrics
    assert four.bytes_per_cycle == 4 * one.bytes_per_cycle


def test_event_bytes_match_the_pipeline_within_ten_percent() -> None:
    events = pipeline_events(5, 1, 1)
    model_docs = [e for e in events if b'"version"' in e]
    gpu_docs = [e for e in events if b'"gpu_uuid"' in e]
    d = cost.Deployment(5, gpus=1, load_duration=False, ecs_metadata=False, model_name_length=len("model_00000"))
    sizes = cost.event_bytes(d)
    real_model = sum(len(e) for e in model_docs) / len(model_docs) + cost.PUTLOGEVENTS_OVERHEAD
    real_gpu = sum(len(e) for e in gpu_docs) / len(gpu_docs) + cost.PUTLOGEVENTS_OVERHEAD
    assert abs(sizes[cost.Scope.MODEL] - real_model) / real_model < 0.10
    # the estimate's GPU event carries ECS metadata properties the fixture run has not: it may only be larger
    assert real_gpu * 0.9 <= sizes[cost.Scope.GPU] <= real_gpu * 2


def test_metric_tiers() -> None:
    assert cost.metric_cost(10) == pytest.approx(3.0)
    assert cost.metric_cost(10_000) == pytest.approx(3000.0)
    assert cost.metric_cost(12_000) == pytest.approx(3000.0 + 200.0)


def test_alarms_bill_insights_alarms_per_model() -> None:
    e = cost.estimate(cost.Deployment(200, gpus=8))
    assert e.alarms == 8  # 7 exporter alarms and the model-sync failure alarm
    assert e.alarm_metrics == 6 + 2 * 200
    assert e.alarms_usd == pytest.approx(40.6)


def test_docs_show_the_current_cost_table() -> None:
    for path in (ROOT / "docs" / "dashboards.md", ROOT / "README.md"):
        assert cost.markdown_table(cost.DOC_ROWS) in path.read_text(), f"{path.name}: re-run exporter cost --markdown"


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert cost.main(["--models", "5", "--versions", "1", "--gpus", "1", "--tasks", "2"]) == 0
    out = capsys.readouterr().out
    e = cost.estimate(cost.Deployment(5, 1, 1, 2))
    assert f"{e.metrics:>10,}" in out and f"${e.total_usd:>10,.2f}/month" in out and "Assumptions:" in out
    assert cost.main(["--models", "-1"]) == 2
