"""Dashboards and alarms reference only what the exporter really emits.

The exporter runs on fixture payloads (demo.payloads through the real
Pipeline, with the NVML source on its faithful fake); every metric name and
dimension set that any rendered widget (including inside SEARCH and Metrics
Insights expressions) or alarm reads must appear in the ``_aws`` directives
of the EMF documents it wrote. An alarm on a name nobody sends would sit in
INSUFFICIENT_DATA forever; this test is what prevents it.
"""

from __future__ import annotations

import io
import json

import pytest

from demo.payloads import first_response_metrics, llm_metrics, triton_metrics
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.series import model_key
from exporter.sources import Collected, ModelConfig, VersionState
from exporter.sources.nvml import NvmlSource
from exporter.sources.promtext import Parser
from modelsync.errors import Result
from modelsync.metrics import METRICS, PHASES, ROLLOUT_METRICS, Attempt, ModelState, Recorder
from modelsync.startup import Startup, metric_values
from render import alarms, dashboard, render
from render.base.options import Options
from telemetry.sinks import StreamSink
from tests.support.helpers import CATALOG, FixedSource
from tests.support.nvml_fake import FakeNvml, gpus
from tests.support.paths import REPO
from tests.support.render_refs import alarm_refs, dashboard_refs, emitted, expression_refs

ROOT = REPO
MODELS = ["add", "m@x.v2+b", "modèle-ü", "slow"]
VLLM, TRT = ["vllm_model"], ["tensorrt_llm"]  # served by the LLM backends (their own families too)


def _body(step: int, uuids: list[str]) -> str:
    """A GPU host's /metrics: plain models, a vLLM and a TensorRT-LLM model, histogram_latencies on (26.01+:
    every model prints the first-response histogram)."""
    return (
        triton_metrics(MODELS + VLLM + TRT, step, gpus=uuids)
        + first_response_metrics(MODELS + TRT, step)
        + llm_metrics(VLLM, step, "vllm")
        + llm_metrics(TRT, step, "tensorrt_llm")
    )


def run_exporter(namespace: str = "Triton") -> list[bytes]:
    """Two cycles of the real pipeline: the second has deltas, rates, quantiles and distributions."""
    step = [1]
    fake_gpus = gpus(2)
    fake_gpus[0].temp_mem = 61  # HBM board: memory temperature present
    fake_gpus[0].gpm = {2: 55.0, 3: 30.0, 5: 20.0, 10: 40.0}  # a Hopper: the GPM metrics too
    nvml = FakeNvml(fake_gpus)
    uuids = [g.uuid for g in fake_gpus]
    parser = Parser(CATALOG.wanted_samples())
    metrics = FixedSource("triton_metrics", lambda: Collected(samples=parser.parse(_body(step[0], uuids))))
    index = FixedSource(
        "triton_index",
        lambda: Collected(
            index=[
                *(VersionState(m, "1", "READY") for m in MODELS + VLLM + TRT),
                VersionState("broken", "1", "UNAVAILABLE", "boom"),
            ],
            # the LLM models stream (decoupled), the others do not
            configs={model_key(m, "1"): ModelConfig(decoupled=m not in MODELS) for m in MODELS + VLLM + TRT},
        ),
    )
    source = NvmlSource(nvml, environ={})
    source.start()
    clock = [0.0]
    pipeline = Pipeline(
        Settings(namespace=namespace),
        CATALOG,
        [metrics, index, source],
        clock=lambda: clock[0],
        wall=lambda: 1_700_000_000.0,
    )
    pipeline.cycle()
    step[0] += 1
    clock[0] += 60.0
    nvml.inject_xid(0, 79)
    result = pipeline.cycle()
    pipeline.close()
    return result.events


def run_modelsync(namespace: str = "Triton") -> list[bytes]:
    """modelsync's real recorder writing every kind of event it has: one attempt per result, states, totals."""
    buf = io.BytesIO()
    rec = Recorder(namespace, StreamSink(buf), "host-1")
    for result in Result:
        phases = {p: 0.1 for p in PHASES} if result is Result.OK else {"download": 0.1}
        rec.attempt(
            Attempt(
                "add",
                str(result),
                phases=phases,
                bytes_downloaded=100,
                sha256="a" * 64,
                serving="a" * 64,
                upload_to_ready=3.0 if result is Result.OK else None,
            )
        )
    rec.model_state(ModelState("add", True, serving="a" * 64, expected="a" * 64))
    rec.host_state(1, 0, 5.0, 1)
    for metric in ROLLOUT_METRICS:  # one rollout decision each, as rollout.py writes them
        rec.rollout("add", {metric: 1.0}, {"verdict": "promoted", "artifact": "b" * 64, "evidence": {"canary": {}}})
    rec.start(metric_values(Startup(0.0).served(1.0)), {"reused": False})  # one task start, as startup.py reports it
    return buf.getvalue().splitlines()


@pytest.fixture(scope="module")
def emitted_refs() -> set[tuple[str, str, frozenset[str]]]:
    return emitted(run_exporter()) | emitted(run_modelsync())


def test_modelsync_run_emits_every_metric_of_its_table() -> None:
    refs = emitted(run_modelsync())
    for row in METRICS:
        for dims in row.dimension_sets:
            assert ("Triton", row.name, frozenset(dims)) in refs, (row.name, dims)
    assert ("Triton", "SyncFailures", frozenset({"model"})) in refs


def _committed_alarm_files() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((ROOT / "alarms" / "cli").rglob("alarm-*.json"))]


def test_fixture_run_emits_the_nvml_and_model_metrics_the_dashboards_need(emitted_refs) -> None:
    names = {name for _, name, _ in emitted_refs}
    # Without these the agreement below would be vacuous for the GPU and latency widgets.
    assert {
        "GpuTemperatureCelsius",
        "GpuXidErrors",
        "GpuEccCorrectedErrors",
        "GpuThrottleThermal",
        "RequestLatencyP95",
        "RequestFailureBackend",
        "ModelLoadSuccessRate",
        "ExporterHeartbeat",
    } <= names
    assert ("Triton", "RequestFailure", frozenset({"model"})) in emitted_refs
    assert ("Triton", "GpuUtilization", frozenset()) in emitted_refs
    # ...and for the LLM section: distributions and TensorRT-LLM gauges.
    assert {
        "TimeToFirstToken",
        "InterTokenLatency",
        "GenerationTokens",
        "KvCacheUtilization",
        "RequestsWaiting",
        "EndToEndLatency",
    } <= names


def test_committed_dashboard_reads_only_emitted_metrics(emitted_refs) -> None:
    body = json.loads((ROOT / "dashboards" / "triton.json").read_text())
    refs = dashboard_refs(body)
    assert len(refs) > 40
    assert (
        sum(
            1
            for w in body["widgets"]
            if w["type"] == "metric"
            for row in w["properties"]["metrics"]
            for c in row
            if isinstance(c, dict) and "SEARCH(" in c.get("expression", "")
        )
        >= 20
    )
    missing = sorted({r for r in refs if r not in emitted_refs}, key=str)
    assert missing == []


def _reads_insight_rules(alarm: dict) -> bool:
    """The version-skew alarm reads Contributor Insights rules, not metrics (test_the_skew_rules_... below)."""
    return all(
        "Expression" in q and ("INSIGHT_RULE_METRIC(" in q["Expression"] or "(" not in q["Expression"])
        for q in alarm.get("Metrics", [])
    ) and bool(alarm.get("Metrics"))


def test_committed_alarms_read_only_emitted_metrics(emitted_refs) -> None:
    files = _committed_alarm_files()
    assert len(files) == 17  # 8 of the exporter, 5 scaling (docs/scaling.md), 4 of model sync (2 of them rollouts)
    for alarm in files:
        refs = alarm_refs(alarm)
        if _reads_insight_rules(alarm):
            assert refs == [], alarm["AlarmName"]
            continue
        assert refs, alarm["AlarmName"]
        assert [r for r in refs if r not in emitted_refs] == [], alarm["AlarmName"]


def test_template_alarms_read_only_emitted_metrics(emitted_refs) -> None:
    template = json.loads((ROOT / "alarms" / "triton-alarms.template.json").read_text())
    namespace = template["Parameters"]["Namespace"]["Default"]
    seen = 0
    for res in template["Resources"].values():
        if res["Type"] != "AWS::CloudWatch::Alarm" or "EvaluationCriteria" in res["Properties"]:
            # PromQL alarms read OTLP names, not EMF metrics: tests/unit/render/test_promql_alarms.py checks them
            continue
        text = json.dumps(res["Properties"]).replace("${Namespace}", namespace)
        props = json.loads(text)
        if isinstance(props.get("Namespace"), dict):
            props["Namespace"] = props["Namespace"]["Fn::Sub"]
        for q in props.get("Metrics", []):
            if isinstance(q.get("Expression"), dict):
                q["Expression"] = q["Expression"]["Fn::Sub"]
            metric = q.get("MetricStat", {}).get("Metric", {})
            if isinstance(metric.get("Namespace"), dict):
                metric["Namespace"] = metric["Namespace"]["Fn::Sub"]
        assert [r for r in alarm_refs(props) if r not in emitted_refs] == []
        seen += 1
    assert seen == 17


# --- Contributor Insights: the version-skew rules over the events modelsync really writes ---------


def _field(doc: dict, path: str) -> object:
    """A Contributor Insights JSON key ($.a.b) looked up in a log event; a missing key is None."""
    value: object = doc
    for part in path.removeprefix("$.").split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def contributors(rule: dict, events: list[dict]) -> set[tuple[object, ...]]:
    """UniqueContributors of one period: the distinct key tuples of the events the filters keep (AggregateOn
    Count). An event without every key is not counted, as Contributor Insights does."""
    contribution = rule["Contribution"]
    out = set()
    for doc in events:
        if not all((_field(doc, f["Match"]) is not None) == f["IsPresent"] for f in contribution.get("Filters", [])):
            continue
        keys = tuple(_field(doc, k) for k in contribution["Keys"])
        if all(k is not None for k in keys):
            out.add(keys)
    return out


def _host_events(host: str, served: dict[str, str]) -> list[dict]:
    """What one task's modelsync writes in a reconcile: an attempt, a state event per model, the totals."""
    buf = io.BytesIO()
    rec = Recorder("Triton", StreamSink(buf), host)
    for model, sha in served.items():
        rec.attempt(Attempt(model, "ok", phases={"download": 0.1}, sha256=sha, serving=sha))
        rec.model_state(ModelState(model, True, serving=sha, expected=sha))
    rec.host_state(len(served), 0, 1.0)
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_the_skew_rules_count_what_modelsync_writes_and_the_alarm_sees_disagreement_only() -> None:
    """The rule definitions run against the recorder's real EMF events (a key or filter naming a field
    modelsync does not write would count nothing), and the alarm's expression (pairs - models) is 0 when
    every task of every model agrees and counts the extra artifacts when they do not."""
    opts = Options(catalog=CATALOG)
    files = render(opts)
    rules = {
        json.loads(t)["RuleName"]: json.loads(json.loads(t)["RuleDefinition"])
        for rel, t in files.items()
        if "/insight-rule-" in rel
    }
    alarm = json.loads(files["alarms/cli/alarm-model-version-skew.json"])
    expr = {q["Id"]: q["Expression"] for q in alarm["Metrics"]}
    assert expr["skew"] == "pairs - models"
    pairs_rule = rules[expr["pairs"].split("'")[1]]
    models_rule = rules[expr["models"].split("'")[1]]
    assert pairs_rule["LogGroupNames"] == models_rule["LogGroupNames"] == [f"{opts.log_group_prefix}/modelsync"]

    def skew(events: list[dict]) -> int:
        return len(contributors(pairs_rule, events)) - len(contributors(models_rule, events))

    a, b = "a" * 64, "b" * 64
    agree = [e for h in ("task-1", "task-2", "task-3") for e in _host_events(h, {"add": a, "llm": b})]
    assert len(contributors(models_rule, agree)) == 2  # the model events only: attempts and totals left out
    assert skew(agree) == 0
    one_lags = _host_events("task-1", {"add": a, "llm": b}) + _host_events("task-2", {"add": b, "llm": b})
    assert skew(one_lags) == 1
    three_ways = one_lags + _host_events("task-3", {"add": "c" * 64, "llm": b})
    assert skew(three_ways) == 2
    # A task serving nothing of a model the others serve (its first install failed) is skew too.
    nothing = _host_events("task-1", {"add": a}) + [
        json.loads(line)
        for line in _recorded(lambda rec: rec.model_state(ModelState("add", False, serving="", expected=a)))
    ]
    assert skew(nothing) == 1


def _recorded(write) -> list[bytes]:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    write(Recorder("Triton", StreamSink(buf), "task-x"))
    return buf.getvalue().splitlines()


def test_named_model_alarms_use_the_dimension_value_the_exporter_writes(emitted_refs) -> None:
    """A model name the exporter must clean (non-ASCII) gets an alarm on the cleaned value, found in the EMF."""
    opts = Options(catalog=CATALOG, models=tuple(MODELS))
    docs = [json.loads(d) for d in run_exporter()]
    values = {d["model"] for d in docs if "model" in d}
    for spec in alarms.alarm_specs(opts):
        alarm = alarms.cli_alarm(spec, opts)
        assert [r for r in alarm_refs(alarm) if r not in emitted_refs] == []
        for dim in alarm.get("Dimensions", []):
            assert dim["Value"] in values
    assert any(v.startswith("mod_le-") for v in values)


def test_custom_namespace_renders_agree_with_an_exporter_on_that_namespace() -> None:
    refs = emitted(run_exporter("Prod/Triton-A")) | emitted(run_modelsync("Prod/Triton-A"))
    opts = Options(catalog=CATALOG, namespace="Prod/Triton-A", models=("add",))
    files = render(opts)
    body = json.loads(files["dashboards/triton.json"])
    assert [r for r in dashboard_refs(body) if r not in refs] == []
    for rel, text in files.items():
        if "/alarm-" in rel:
            assert [r for r in alarm_refs(json.loads(text)) if r not in refs] == [], rel
    # ...and the default namespace's references would all be missing there: the check is not vacuous.
    assert all(r not in refs for r in dashboard_refs(dashboard.build(Options(catalog=CATALOG))))


def test_checker_catches_a_metric_nobody_sends(emitted_refs) -> None:
    """The old public dashboards' failure mode: a plausible name the exporter does not emit."""
    assert expression_refs(
        "SEARCH('{\"Triton\",model,version} MetricName=\"nv_inference_request_success\"', 'Sum', 60)"
    ) == [("Triton", "nv_inference_request_success", frozenset({"model", "version"}))]
    assert ("Triton", "nv_inference_request_success", frozenset({"model", "version"})) not in emitted_refs
    # Right name, wrong dimension set: RequestLatencyP99 has no model-only rollup.
    assert ("Triton", "RequestLatencyP99", frozenset({"model"})) not in emitted_refs
    with pytest.raises(KeyError):
        dashboard.search(Options(catalog=CATALOG), "RequestLatencyP99", ("model",), "Maximum")
