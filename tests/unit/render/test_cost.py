"""The cost estimate counts what the real pipeline emits, and docs/dashboards.md shows the current numbers."""

from __future__ import annotations

import io
from dataclasses import replace

import orjson
import pytest

from demo.payloads import first_response_metrics, llm_metrics, triton_metrics
from exporter.config import Settings
from exporter.gpufaults import GpuHealth
from exporter.gpufaults.drain import Drainer
from exporter.pipeline import Pipeline
from exporter.series import model_key
from exporter.sources import Collected, ModelConfig, VersionState
from exporter.sources.nvml import NvmlSource
from exporter.sources.promtext import Parser
from modelsync.metrics import ModelState, Recorder
from render import cost
from render.alarms import Spec
from render.base.options import Options
from telemetry.sinks import StreamSink
from tests.support.helpers import CATALOG, FixedSource
from tests.support.nvml_fake import FakeNvml, gpus
from tests.support.paths import REPO

ROOT = REPO


OPTS = Options(catalog=CATALOG)


def pipeline_events(
    models: int,
    versions: int,
    n_gpus: int,
    llm: int = 0,
    backend: str = "vllm",
    histograms: bool = False,
    max_models: int = Settings.max_models,
    gpm: bool = False,
    drain: bool = False,
) -> list[bytes]:
    """The second cycle of the real pipeline: models x versions, n_gpus on NVML (HBM boards) and DCGM series.

    The first ``llm`` models also publish ``backend``'s families; ``histograms``: every model has Triton's
    first-response histogram (histogram_latencies=true on Triton 25.12+); ``gpm``: the GPUs are Hopper (GPM);
    ``drain``: --gpu-fault-action drain (its counts; no GPU fault, so no AWS call).
    """
    step = [1]
    fake = gpus(n_gpus)
    for g in fake:
        g.temp_mem = 60  # every NVML field supported, as the estimate assumes
        if gpm:
            g.gpm = {2: 50.0, 3: 25.0, 5: 10.0, 10: 30.0}
    nvml = FakeNvml(fake)
    uuids = [g.uuid for g in fake]
    names = [f"model_{i:05d}" for i in range(models)]
    parser = Parser(CATALOG.wanted_samples())

    def one_version(v: int) -> str:
        text = triton_metrics(names, step[0], gpus=uuids if v == 0 else (), version=str(v + 1))
        if llm:
            text += llm_metrics(names[:llm], step[0], backend, version=str(v + 1))
        if histograms:
            text += first_response_metrics(names, step[0], version=str(v + 1))
        return text

    def metrics() -> Collected:
        # One body per version, concatenated without HELP/TYPE lines (the parser then reads the whole body).
        text = "".join(one_version(v) for v in range(versions))
        return Collected(samples=parser.parse("".join(ln + "\n" for ln in text.splitlines() if ln[:1] != "#")))

    index = [VersionState(m, str(v + 1), "READY") for m in names for v in range(versions)]
    # the LLM models are decoupled (they stream), the others not: what the estimate assumes
    configs = {model_key(v.model, v.version): ModelConfig(decoupled=v.model in names[:llm]) for v in index}
    srcs = [
        FixedSource("triton_metrics", metrics),
        FixedSource("triton_index", lambda: Collected(index=index, configs=configs)),
    ]
    if n_gpus:
        health = GpuHealth(Drainer("http://127.0.0.1:9/unused", "http://127.0.0.1:9/queue") if drain else None)
        nv = NvmlSource(nvml, environ={}, health=health)
        nv.start()
        srcs.append(nv)
    clock = [0.0]
    p = Pipeline(Settings(max_models=max_models), CATALOG, srcs, clock=lambda: clock[0], wall=lambda: 1_700_000_000.0)
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


# The fixture fails one request per model and window: the failure reasons' total is busy every hour.
BUSY = frozenset({"RequestSuccess", "RequestFailure"})


@pytest.mark.parametrize(
    ("models", "versions", "n_gpus", "llm", "backend", "histograms"),
    [
        (5, 1, 1, 0, "vllm", False),
        (7, 2, 2, 0, "vllm", False),
        (3, 1, 0, 0, "vllm", False),
        (5, 1, 1, 2, "vllm", False),
        (6, 2, 1, 3, "tensorrt_llm", True),
        (4, 1, 1, 2, "vllm", True),
    ],
)
def test_metric_count_equals_what_the_pipeline_emits(
    models: int, versions: int, n_gpus: int, llm: int, backend: str, histograms: bool
) -> None:
    events = pipeline_events(models, versions, n_gpus, llm, backend, histograms)
    d = cost.Deployment(
        models=models,
        versions=versions,
        gpus=n_gpus,
        load_duration=False,
        ecs_metadata=False,
        llm_models=llm,
        llm_backend=backend,
        histograms=histograms,
        busy_totals=BUSY,
    )
    assert cost.metric_count(CATALOG, d) == len(distinct_metrics(events))


@pytest.mark.parametrize(("models", "versions", "cap"), [(12, 1, 5), (7, 2, 6), (3, 2, 10)])
def test_the_model_cap_prices_what_the_pipeline_emits(models: int, versions: int, cap: int) -> None:
    """--max-models caps the model versions the sidecar emits: the estimate prices those, not every model."""
    events = pipeline_events(models, versions, 1, max_models=cap)
    d = cost.Deployment(
        models, versions, gpus=1, load_duration=False, ecs_metadata=False, busy_totals=BUSY, max_models=cap
    )
    assert cost.metric_count(CATALOG, d.emitted()) == len(distinct_metrics(events))
    assert d.over_cap == (models * versions > cap)


def test_cost_applies_the_cap_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """`cost --models 2000` priced 2,000 models while the sidecar's default --max-models 500 emits 500."""
    assert cost.Deployment(1).max_models == Settings().max_models  # the sidecar's default, which render cannot import
    capped, uncapped = cost.Deployment(2000), cost.Deployment(2000, max_models=2000)
    e = cost.estimate(capped, OPTS)
    assert e.deployment == capped
    exporter_metrics = cost.metric_count(CATALOG, cost.Deployment(500))
    assert e.metrics == exporter_metrics + cost.modelsync_metric_count(OPTS.modelsync, capped)  # sync: every model
    assert e.sync_metrics == cost.estimate(uncapped, OPTS).sync_metrics
    assert e.bytes_per_cycle == cost.estimate(cost.Deployment(500), OPTS).bytes_per_cycle
    assert e.metrics < cost.estimate(uncapped, OPTS).metrics
    assert cost.main(["--models", "2000"]) == 0
    out = capsys.readouterr().out
    assert "--max-models 500: the sidecar emits 500 of the 2,000 model versions per task" in out
    assert f"{e.metrics:>10,}" in out
    assert cost.main(["--models", "2000", "--max-models", "2000"]) == 0
    out = capsys.readouterr().out
    assert "--max-models" not in out and f"{cost.estimate(uncapped, OPTS).metrics:>10,}" in out
    assert cost.main(["--models", "300", "--versions", "3"]) == 0
    assert "emits 498 of the 900 model versions per task (166 models x 3)" in capsys.readouterr().out


@pytest.mark.parametrize(("n_gpus", "gpm", "drain"), [(2, True, False), (1, False, True), (2, True, True)])
def test_gpm_and_drain_metrics_are_counted_as_the_pipeline_emits_them(n_gpus: int, gpm: bool, drain: bool) -> None:
    events = pipeline_events(3, 1, n_gpus, gpm=gpm, drain=drain)
    d = cost.Deployment(3, gpus=n_gpus, load_duration=False, ecs_metadata=False, busy_totals=BUSY)
    with_them = replace(d, gpm=gpm, gpu_drain=drain)
    assert cost.metric_count(CATALOG, with_them) == len(distinct_metrics(events))
    assert cost.metric_count(CATALOG, with_them) - cost.metric_count(CATALOG, d) == 4 * n_gpus * gpm + 2 * drain


def test_omitted_breakdown_zeros_are_the_difference_the_pipeline_shows() -> None:
    """With no failures, the pipeline leaves out exactly the four reason metrics per model the estimate drops."""
    events = pipeline_events(4, 1, 0)
    no_failures = [e for e in events if b'"RequestFailure":0' in e or b'"version"' not in e]
    assert len(no_failures) < len(events)  # the fixture fails one request per model: reasons are emitted
    d = cost.Deployment(models=4, gpus=0, load_duration=False, ecs_metadata=False)
    emitting = cost.metric_count(CATALOG, replace(d, breakdown_zeros="emit"))
    assert emitting - cost.metric_count(CATALOG, d) == 4 * 4  # four reasons per model, never billed when idle


def test_metric_count_is_the_same_for_many_tasks() -> None:
    """Tasks share every dimension value (no task id): more tasks add bytes, not metrics."""
    one, four = cost.estimate(cost.Deployment(5, tasks=1), OPTS), cost.estimate(cost.Deployment(5, tasks=4), OPTS)
    assert one.metrics == four.metrics
    assert four.bytes_per_cycle == 4 * one.bytes_per_cycle


def test_event_bytes_match_the_pipeline_within_ten_percent() -> None:
    events = pipeline_events(5, 1, 1)
    model_docs = [e for e in events if b'"version"' in e]
    gpu_docs = [e for e in events if b'"gpu_uuid"' in e]
    d = cost.Deployment(5, gpus=1, load_duration=False, ecs_metadata=False, model_name_length=len("model_00000"))
    sizes = cost.event_bytes(CATALOG, replace(d, busy_totals=BUSY))
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
    e = cost.estimate(cost.Deployment(200, gpus=8), OPTS)
    assert e.alarms == 17  # 8 exporter alarms, 5 scaling; model sync's failure, version-skew and two rollout ones
    # Standard: 8 classic alarms (GPU health, the TTFT one, model sync's and the two of rollouts included: billed
    # without data too), the
    # scale-in's metric math over 5 metrics, 2 GROUP BY model alarms x 200 models, the skew alarm's two
    # INSIGHT_RULE_METRIC; the KV-cache GROUP BY alarm analyzes nothing without TensorRT-LLM models. High
    # resolution: the three scale-out alarms (10 s periods; the TensorRT-LLM one is billed without data too) and
    # the excess alarm's four metrics (backlog, TensorRT-LLM waiting, rejected, served).
    standard, high = 8 + 5 + 2 * 200 + 2, 3 + 4
    assert (e.alarm_metrics, e.high_res_alarm_metrics) == (standard + high, high)
    # ...plus the skew alarm's two rules: $0.50 each and $0.02 per million events (2 rules x 200 models x
    # 1 task x 12 reconciles an hour x 730 hours).
    rules = 2 * 0.5 + 2 * 200 * 12 * 730 / 1e6 * 0.02
    assert e.alarms_usd == pytest.approx(0.1 * standard + 0.3 * high + rules)
    trt = cost.estimate(cost.Deployment(200, gpus=8, llm_models=20, llm_backend="tensorrt_llm"), OPTS)
    assert trt.alarm_metrics == standard + high + 20


def test_high_resolution_alarms_are_billed_three_times_a_standard_one() -> None:
    """A 10 s alarm on a signal costs $0.30 an alarm metric, the same alarm at 60 s $0.10."""
    d = cost.Deployment(5)
    body = {"MetricName": "TaskPendingRequests", "Period": 10}
    spec = Spec("x", body, (), metric="TaskPendingRequests")
    assert cost.alarm_metric_counts(CATALOG, d, [spec]) == (0, 1)
    assert cost.alarm_metric_counts(CATALOG, d, [replace(spec, body={**body, "Period": 60})]) == (1, 0)
    math_ = Spec("y", {"Metrics": [{"MetricStat": {"Period": 10}}]}, (), metric="A", terms=("A", "B"))
    assert cost.alarm_metric_counts(CATALOG, d, [math_]) == (0, 2)


def test_high_resolution_metrics_are_the_fast_ones_and_add_only_their_own_bytes() -> None:
    d = cost.Deployment(5, tasks=2)
    e = cost.estimate(d, OPTS)
    fast = [m for m in cost.emitted_metrics(CATALOG, d) if m.interval]
    assert fast and all(m.high_resolution for m in fast)
    assert e.high_res_metrics == cost.metric_count(CATALOG, d, high_resolution=True) == len(fast)  # task level
    assert cost.fast_periods(CATALOG, d) == [10.0]
    assert cost.fast_scrapes(10.0, 60.0) == 5  # the sixth is the full cycle's
    assert cost.fast_scrapes(10.0, 45.0) == pytest.approx(45 / 10 - 45 / 90)
    assert e.fast_bytes_per_cycle == 2 * 5 * cost.event_bytes(CATALOG, d, period=10.0)[cost.Scope.TASK]
    # One small task event per fast scrape: far below the full cycle's bytes, whatever the number of models.
    big = cost.estimate(cost.Deployment(200, tasks=2), OPTS)
    assert big.fast_bytes_per_cycle == e.fast_bytes_per_cycle < e.bytes_per_cycle / 2
    without = cost.estimate(d, Options(catalog=CATALOG.select("-Task*")))
    assert (without.high_res_metrics, without.fast_bytes_per_cycle) == (0, 0)


def test_fast_scrape_bytes_match_the_pipeline() -> None:
    """The estimate's fast event is the size of the real one a scrape between full cycles writes."""
    names = [f"model_{i:05d}" for i in range(5)]
    parser = Parser(CATALOG.wanted_samples())
    step = [1]
    srcs = [
        FixedSource("triton_metrics", lambda: Collected(samples=parser.parse(triton_metrics(names, step[0])))),
        FixedSource("triton_index", lambda: Collected(index=[VersionState(m, "1", "READY") for m in names])),
    ]
    clock = [0.0]
    p = Pipeline(Settings(nvml="off"), CATALOG, srcs, clock=lambda: clock[0], wall=lambda: 1_700_000_000.0)
    p.cycle()
    step[0] += 1
    clock[0] += 10.0
    fast = p.cycle(due={10.0})
    assert not fast.full and len(fast.events) == 1
    size = cost.event_bytes(CATALOG, cost.Deployment(5, ecs_metadata=False), period=10.0)[cost.Scope.TASK]
    real = len(fast.events[0]) + cost.PUTLOGEVENTS_OVERHEAD
    assert abs(size - real) / real < 0.10


def test_docs_show_the_current_cost_table() -> None:
    """docs/dashboards.md shows the cost table, and every page that shows one (README included) shows it current."""
    table = cost.markdown_table(cost.DOC_ROWS, OPTS)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    showing = [p for p in pages if "| Deployment |" in p.read_text()]
    assert ROOT / "docs" / "dashboards.md" in showing
    for path in showing:
        assert table in path.read_text(), f"{path.name}: re-run python -m render cost --markdown"


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert cost.main(["--models", "5", "--versions", "1", "--gpus", "1", "--tasks", "2"]) == 0
    out = capsys.readouterr().out
    e = cost.estimate(cost.Deployment(5, 1, 1, 2), OPTS)
    assert f"{e.metrics:>10,}" in out and f"${e.total_usd:>10,.2f}/month" in out and "Assumptions:" in out
    assert cost.main(["--models", "-1"]) == 2


def test_model_sync_metrics_are_counted_as_its_recorder_writes_them() -> None:
    """Every reconcile writes a model event per model and a host event: cost counts exactly those metrics."""
    buf = io.BytesIO()
    rec = Recorder("Triton", StreamSink(buf), "ip-10-0-7-42.ec2.internal", wall=lambda: 1_700_000_000.0)
    for i in range(7):
        rec.model_state(ModelState(f"model_{i}", True, serving="a" * 64, expected="a" * 64, version_id="v" * 32))
    rec.host_state(7, 0, 12.0)
    events = buf.getvalue().splitlines()
    d = cost.Deployment(7)
    assert cost.modelsync_metric_count(OPTS.modelsync, d) == len(distinct_metrics(events)) == 1 + 7 + 3
    real = sum(len(e) + cost.PUTLOGEVENTS_OVERHEAD for e in events)
    assert abs(cost.modelsync_bytes(OPTS.modelsync, replace(d, model_name_length=len("model_0"))) - real) < 0.1 * real
    with_sync, without = cost.estimate(d, OPTS), cost.estimate(replace(d, modelsync=False), OPTS)
    assert with_sync.metrics - without.metrics == with_sync.sync_metrics == 1 + 7 + 3
    assert with_sync.alarms - without.alarms == 4  # sync failures, version skew, a rollout rejected or waiting
    rolling = cost.estimate(replace(d, rollouts=True), OPTS)
    assert rolling.sync_metrics - with_sync.sync_metrics == 1  # RolloutsInFlight, on the host event
    assert with_sync.gb_per_month > without.gb_per_month


def test_tracing_adds_the_relays_distributions_per_model_version_and_its_own_counts() -> None:
    """Five Traced* distributions per model version plus their service-wide set, and the relay's eight counts
    (spans received, exported, dropped, of unknown models, over the limit; requests invalid, refused; slow-request
    lines over the limit)."""
    opts = Options(catalog=CATALOG)
    d = cost.Deployment(models=7, versions=2, gpus=1, tasks=3)
    added = cost.metric_count(CATALOG, replace(d, tracing=True)) - cost.metric_count(CATALOG, d)
    relay_counts = [m.name for m in CATALOG.metrics if m.source == "traces" and m.scope == "task"]
    assert len(relay_counts) == 8 and "TraceRequestsRefused" in relay_counts and "SpansUnknownModel" in relay_counts
    assert added == 5 * (7 * 2 + 1) + 8
    assert cost.estimate(replace(d, tracing=True), opts).metrics > cost.estimate(d, opts).metrics
    assert cost.metric_count(CATALOG, replace(d, otlp=True)) - cost.metric_count(CATALOG, d) == 2
