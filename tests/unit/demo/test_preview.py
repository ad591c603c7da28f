"""demo/preview: the dashboard preview's evaluators on small inputs with known answers, and the drawings.

The evaluators (EMF datapoints and statistics, SEARCH, metric math, Metrics Insights, Contributor
Insights, Logs Insights, alarm states) are checked on a few EMF documents and log events written
here; every widget of the committed dashboard is checked to be drawable, with data for every
metric the catalog emits and with none at all (each widget then says why); forms the preview does
not implement are refused. The rollout timeline is drawn from a small synthetic file, and from a small
file shaped as bench/bench_rollout.py writes it, with known events and the rows they become. One test
runs the whole command against a real Triton.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.pyplot as plt
import pytest

from catalog import build, modelsync_catalog
from demo.preview import collect, dashboard, logsinsights, rollout, rollout_bench
from demo.preview.__main__ import ALARMS, DASHBOARD, rules, scope_of
from demo.preview.alarms import alarm_props, evaluate_alarm, load_alarms
from demo.preview.emf import EmfError, Store, Unsupported, percentile, statistic
from demo.preview.logsinsights import LogEvent
from demo.preview.metricmath import Clock, Data, evaluate, parse
from demo.preview.text import fit, width
from tests.support.paths import REPO

ROOT = REPO
T0 = 1_800_000_000.0  # seconds; windows of 5 s from here
W = 5.0


def doc(t: float, dims: list[list[str]], props: dict[str, Any], **metrics: Any) -> dict[str, Any]:
    """One EMF document at ``t`` (seconds)."""
    return {
        "_aws": {
            "Timestamp": int(t * 1000),
            "CloudWatchMetrics": [
                {"Namespace": "Triton", "Dimensions": dims, "Metrics": [{"Name": n, "Unit": "None"} for n in metrics]}
            ],
        },
        **props,
        **metrics,
    }


def data_of(*docs: dict[str, Any], logs: dict[str, list[LogEvent]] | None = None) -> Data:
    store = Store()
    for d in docs:
        store.add(d)
    return Data(store, Clock(T0 - W / 2, W), logs or {}, rules())


def points(lines: list[Any], label: str) -> list[float]:
    found = [s for ln in lines for s in ln.series if s.label == label]
    assert len(found) == 1, [s.label for ln in lines for s in ln.series]
    return [found[0].points[t] for t in sorted(found[0].points)]


def widget(*rows: list[Any], stat: str = "Average", period: int = 60, view: str = "timeSeries") -> dict[str, Any]:
    return {"title": "t", "view": view, "stat": stat, "period": period, "metrics": list(rows)}


# --- EMF and statistics ---------------------------------------------------------------------------


def test_every_dimension_set_of_a_directive_is_a_metric_of_its_own() -> None:
    store = Store()
    store.add(doc(T0, [["model", "version"], ["model"], []], {"model": "add", "version": "1"}, RequestSuccess=7))
    keys = sorted((k.name, k.dims) for k in store.points)
    assert keys == [
        ("RequestSuccess", ()),
        (
            "RequestSuccess",
            (
                (
                    "model",
                    "add",
                ),
            ),
        ),
        ("RequestSuccess", (("model", "add"), ("version", "1"))),
    ]
    with pytest.raises(EmfError, match="dimension version"):
        store.add(doc(T0, [["model", "version"]], {"model": "add"}, RequestSuccess=1))


def test_statistics_of_numbers_lists_and_distributions() -> None:
    dist = {
        "Values": [10.0, 20.0, 400.0],
        "Counts": [50.0, 45.0, 5.0],
        "Min": 8.0,
        "Max": 500.0,
        "Count": 100.0,
        "Sum": 3400.0,
    }
    store = Store()
    store.add(doc(T0, [[]], {}, A=dist))
    store.add(doc(T0 + 1, [[]], {}, A=[1.0, 3.0]))
    pts = next(iter(store.points.values()))
    assert statistic(pts, "Sum") == 3404.0
    assert statistic(pts, "SampleCount") == 102.0
    assert statistic(pts, "Average") == pytest.approx(3404.0 / 102.0)
    assert statistic(pts, "Minimum") == 1.0 and statistic(pts, "Maximum") == 500.0
    # nearest rank over 102 weighted samples (1, 3, 50 x 10, 45 x 20, 5 x 400): p50 is rank 51 (a 10), p95
    # rank 96.9 (the 97th sample, the last 20), p96 rank 97.92 (a 400), p0.5 rank 0.51 (the 1)
    assert statistic(pts, "p50") == 10.0
    assert statistic(pts, "p95") == 20.0
    assert statistic(pts, "p96") == 400.0
    assert statistic(pts, "p0.5") == 1.0
    assert statistic([], "Sum") is None
    with pytest.raises(Unsupported, match="tm90"):
        statistic(pts, "tm90")


def test_percentile_nearest_rank() -> None:
    assert percentile([(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0)], 50) == 2.0
    assert percentile([(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0)], 51) == 3.0
    assert percentile([(5.0, 0.0)], 50) is None


def test_a_malformed_document_is_refused() -> None:
    with pytest.raises(EmfError):
        Store().add(
            {
                "_aws": {
                    "Timestamp": 1,
                    "CloudWatchMetrics": [{"Namespace": "T", "Dimensions": [[]], "Metrics": [{"Name": "X"}]}],
                }
            }
        )
    with pytest.raises(EmfError, match="finite"):
        Store().add(doc(T0, [[]], {}, X=float("nan")))
    with pytest.raises(EmfError, match="Sum"):
        Store().add(doc(T0, [[]], {}, X={"Values": [1.0], "Counts": [1.0]}))


# --- SEARCH, metric math, Metrics Insights, Contributor Insights -------------------------------------


def two_windows() -> list[dict[str, Any]]:
    mv = [["model", "version"], ["model"], []]
    return [
        doc(T0, mv, {"model": "add", "version": "1"}, RequestSuccess=10, RequestFailure=0),
        doc(T0, mv, {"model": "fails", "version": "1"}, RequestSuccess=4, RequestFailure=6),
        doc(T0 + W, mv, {"model": "add", "version": "1"}, RequestSuccess=20, RequestFailure=0),
        doc(T0 + W, mv, {"model": "fails", "version": "1"}, RequestSuccess=5, RequestFailure=5),
    ]


def test_search_matches_exactly_its_dimension_schema_one_series_per_entity() -> None:
    data = data_of(*two_windows())
    lines = evaluate(
        widget([{"expression": "SEARCH('{\"Triton\",model} MetricName=\"RequestFailure\"', 'Sum', 60)", "id": "e1"}]),
        data,
    )
    assert points(lines, "add") == [0.0, 0.0]
    assert points(lines, "fails") == [6.0, 5.0]
    assert len(lines[0].series) == 2  # not the {model,version} metrics, nor the service-wide one
    lines = evaluate(
        widget(
            [
                {
                    "expression": "SEARCH('{\"Triton\",model,version} MetricName=\"RequestSuccess\"', 'Sum', 60)",
                    "label": "ok",
                    "id": "q",
                }
            ]
        ),
        data,
    )
    assert points(lines, "ok add 1") == [10.0, 20.0]


def test_period_math_is_per_second_of_the_demo_window() -> None:
    """``ok/PERIOD(ok)`` and the generator's ``SEARCH(..., 60)/60``: one 5 s window stands for 60 s."""
    data = data_of(*two_windows())
    lines = evaluate(
        widget(
            ["Triton", "RequestSuccess", {"id": "ok", "stat": "Sum", "visible": False}],
            [{"expression": "ok/PERIOD(ok)", "label": "success/s", "id": "rate"}],
            [{"expression": "SEARCH('{\"Triton\",model} MetricName=\"RequestSuccess\"', 'Sum', 60)/60", "id": "g"}],
            [{"expression": "2 * (ok - 4) / 2", "label": "math", "id": "m"}],
        ),
        data,
    )
    assert [ln.visible for ln in lines] == [False, True, True, True]
    assert points(lines, "RequestSuccess") == [14.0, 25.0]
    assert points(lines, "success/s") == [14.0 / 5, 25.0 / 5]
    assert points(lines, "add") == [10.0 / 5, 20.0 / 5]
    assert points(lines, "math") == [10.0, 21.0]


def test_diff_is_each_value_minus_the_one_before() -> None:
    """``DIFF(id)`` as CloudWatch's metric math has it (the scale-out excess alarm's expression uses it)."""
    data = data_of(*two_windows())
    lines = evaluate(
        widget(
            ["Triton", "RequestSuccess", {"id": "ok", "stat": "Sum", "visible": False}],
            [{"expression": "DIFF(ok)", "label": "diff", "id": "d"}],
        ),
        data,
    )
    assert points(lines, "diff") == [25.0 - 14.0]  # the first value has none before it


def test_a_longer_period_spans_several_windows() -> None:
    data = data_of(*two_windows())
    lines = evaluate(widget(["Triton", "RequestFailure", {"stat": "Sum", "period": 120}]), data)
    assert points(lines, "RequestFailure") == [11.0]  # 120 s of the dashboard: two windows of the demo


def test_metrics_insights_aggregates_every_metric_of_the_schema() -> None:
    data = data_of(*two_windows())
    row = [
        {
            "expression": 'SELECT SUM(RequestFailure) FROM SCHEMA("Triton", model, version)',
            "label": "BACKEND",
            "id": "r1",
        }
    ]
    assert points(evaluate(widget(row), data), "BACKEND") == [6.0, 5.0]  # the [model] rollup is not counted twice
    grouped = [
        {
            "expression": 'SELECT MAX(RequestSuccess) FROM SCHEMA("Triton", model) GROUP BY model '
            "ORDER BY MAX() DESC LIMIT 1",
            "id": "q1",
        }
    ]
    lines = evaluate(widget(grouped), data)
    assert [s.label for s in lines[0].series] == ["add"]


def test_insight_rule_counts_unique_contributors_per_period() -> None:
    def event(t: float, model: str, artifact: str, in_sync: bool = True) -> LogEvent:
        body: dict[str, Any] = {"model": model, "ModelArtifact": artifact}
        if in_sync:
            body["ModelInSync"] = 1.0
        return LogEvent(t, json.dumps(body))

    logs = {
        "/ecs/triton/modelsync": [
            event(T0, "text", "a1"),
            event(T0 + 1, "text", "a2"),  # the switch: two artifacts of one model in one period
            event(T0 + 2, "add", "b1"),
            event(T0 + 3, "add", "b9", in_sync=False),  # no ModelInSync: not counted by the rules' filter
        ]
    }
    data = data_of(doc(T0, [[]], {}, ExporterHeartbeat=1), logs=logs)
    rows = [
        [
            {
                "expression": "INSIGHT_RULE_METRIC('triton-model-artifacts', 'UniqueContributors')",
                "id": "pairs",
                "visible": False,
                "period": 300,
            }
        ],
        [
            {
                "expression": "INSIGHT_RULE_METRIC('triton-models', 'UniqueContributors')",
                "id": "models",
                "visible": False,
                "period": 300,
            }
        ],
        [{"expression": "pairs - models", "label": "skew", "id": "skew", "period": 300}],
    ]
    assert points(evaluate(widget(*rows), data), "skew") == [1.0]


@pytest.mark.parametrize(
    "row",
    [
        [{"expression": "FILL(m1, 0)", "id": "f"}],
        [{"expression": "SEARCH('{\"Triton\",model} RequestSuccess', 'Sum', 60)", "id": "s"}],
        [{"expression": 'SEARCH(\'{"Triton",model} MetricName="A" OR MetricName="B"\', \'Sum\', 60)', "id": "s"}],
        [{"expression": "SELECT SUM(X) FROM SCHEMA(\"Triton\", model) WHERE model = 'add'", "id": "s"}],
        [{"expression": "INSIGHT_RULE_METRIC('triton-models', 'Sum')", "id": "s"}],
        [{"expression": "INSIGHT_RULE_METRIC('no-such-rule', 'UniqueContributors')", "id": "s"}],
        [{"expression": "m9 * 2", "id": "s"}],
        ["Triton", "X", {"stat": "tm99"}],
        ["Triton", "X", {"stat": "Sum", "accountId": "1"}],
        [".", "X", {"stat": "Sum"}],
    ],
)
def test_what_is_not_implemented_is_refused(row: list[Any]) -> None:
    data = data_of(doc(T0, [[]], {}, X=1))
    with pytest.raises(Unsupported):
        evaluate(widget(row), data)


def test_parser_precedence() -> None:
    assert repr(parse("a - b * 2")) == repr(parse("a - (b * 2)"))
    assert repr(parse("-a / 2")) != repr(parse("a / 2"))


# --- Logs Insights -----------------------------------------------------------------------------------


def errors_group() -> list[LogEvent]:
    def e(t: float, level: str, model: str, message: str) -> LogEvent:
        body = {"level": level, "model": model, "version": "1", "message": message}
        return LogEvent(T0 + t, json.dumps(body), "triton-server-firelens-1")

    return [
        e(0, "ERROR", "broken", "failed to load 'broken' version 1: Internal: boom one"),
        e(5, "ERROR", "broken", "failed to load 'broken' version 1: Internal: boom two"),
        e(6, "WARNING", "add", "failed to load 'add' version 1: not an error"),
        e(7, "ERROR", "fails", "Failed to process the request(s) for model 'fails_0_0'"),
    ]


def dashboard_query(title: str) -> str:
    body = json.loads(DASHBOARD.read_text())
    return next(w["properties"]["query"] for w in body["widgets"] if w["properties"].get("title") == title)


def test_the_dashboards_failed_loads_query() -> None:
    result = logsinsights.run(dashboard_query("Failed model loads (errors group)"), errors_group())
    assert result.columns == ["model", "version", "failures", "last_reason", "last_seen"]
    assert len(result.rows) == 1
    row = result.rows[0]
    assert (row["model"], row["failures"], row["last_reason"]) == ("broken", 2, "Internal: boom two")
    assert result.cell(row, "last_seen").endswith(".000") and result.cell(row, "last_seen").startswith("2027-01-15")


def test_the_slowest_requests_widget_shows_the_parsed_fields_not_the_firelens_record() -> None:
    """Through FireLens the exporter's line is the ``log`` field of a JSON record: as a column, @message would
    show that whole record; the widget's columns are the fields its parse extracts."""
    from render.dashboard.logs import SLOW_REQUESTS

    msg = (
        "slow request: model=add version=1 request_ms=52.113 trace_id=4bf92f3577b34da6a3ce929d0e0e4736"
        " span_id=00f067aa0ba902b7"
    )
    line = json.dumps({"level": "info", "logger": "exporter.traces", "msg": msg})
    event = LogEvent(T0, json.dumps({"log": line, "container_name": "exporter", "source": "stderr"}))
    result = logsinsights.run(SLOW_REQUESTS, [event])
    assert "@message" not in result.columns
    assert result.columns[:2] == ["@timestamp", "model"] and "trace_id" in result.columns
    (row,) = result.rows
    assert (row["model"], row["request_ms"], row["trace_id"]) == ("add", 52.113, "4bf92f3577b34da6a3ce929d0e0e4736")


def test_logs_insights_sort_limit_parse_and_numbers() -> None:
    lines = [
        LogEvent(T0 + i, f"slow request: model=m{i} version=1 request_ms={ms}")
        for i, ms in enumerate(["9.5", "100", "20"])
    ]
    query = (
        "SOURCE '/g' | fields @timestamp, @message | filter @message like /slow request: model=/"
        "\n| parse @message /model=(?<model>\\S+) version=(?<version>\\S+) request_ms=(?<ms>[0-9.]+)/"
        "\n| fields ms * 1 as request_ms, model\n| sort request_ms desc\n| limit 2"
    )
    result = logsinsights.run(query, lines)
    assert [r["model"] for r in result.rows] == ["m1", "m2"]  # 100 > 20 > 9.5 as numbers, not as strings
    # every fields command's fields and what parse extracts, in order of appearance
    assert result.columns == ["@timestamp", "@message", "model", "version", "ms", "request_ms"]
    assert logsinsights.sources("SOURCE 'a' | SOURCE 'b' | limit 1") == (["a", "b"], ["limit 1"])
    # a | inside a regex does not split the query
    assert len(logsinsights.split_commands("filter message like /^(a |b)/ | limit 3")) == 2
    with pytest.raises(Unsupported):
        logsinsights.run("dedup model", lines)
    with pytest.raises(Unsupported):
        logsinsights.run("filter not ispresent(x)", lines)


def test_routing_puts_tritons_errors_in_the_errors_group_and_model_sync_in_its_own() -> None:
    lines = [
        collect.Line(
            T0,
            "triton",
            "stderr",
            "E1130 16:38:37.074716 1 model_lifecycle.cc:642] \"failed to load 'broken' version 1: Internal: boom\"",
        ),
        collect.Line(T0 + 1, "modelsync", "stdout", '{"msg": "text in sync", "model": "text"}'),
        collect.Line(T0 + 2, "exporter", "stderr", '{"level": "info", "msg": "exporter started"}'),
    ]
    groups: dict[str, list[LogEvent]] = {}
    for group, event in collect.route(lines):
        groups.setdefault(group, []).append(event)
    errors = [e.json() for e in groups["/ecs/triton/errors"]]
    assert errors and errors[0] is not None and errors[0]["level"] == "ERROR" and errors[0]["model"] == "broken"
    assert [e.message for e in groups["/ecs/triton/modelsync"]] == ['{"msg": "text in sync", "model": "text"}']
    assert "/ecs/triton/exporter" in groups


def test_the_rollout_timeline_shows_each_decision_once_not_again_as_its_emf_event() -> None:
    """Model sync's stdout (EMF) and stderr (JSON log) share its group; a decision with a metric is in both."""
    query = dashboard_query("Rollout timeline per model: every decision with its evidence (newest first)")
    decision = {"model": "m", "verdict": "promoted", "host": "h", "artifact": "b" * 64, "reason": "healthy"}
    line = {"level": "INFO", "logger": "modelsync.rollout", "msg": "rollout of m: promoted: healthy", **decision}
    emf = {"_aws": {"Timestamp": int(T0 * 1000), "CloudWatchMetrics": []}, "RolloutsPromoted": 1.0, **decision}
    result = logsinsights.run(query, [LogEvent(T0, json.dumps(line)), LogEvent(T0, json.dumps(emf))])
    assert [(r["model"], r["verdict"], r["host"]) for r in result.rows] == [("m", "promoted", "h")]


# --- alarms --------------------------------------------------------------------------------------------


def test_alarm_states_from_the_shipped_definitions() -> None:
    alarms = load_alarms(ALARMS)
    windows = [doc(T0 + k * W, [["model"]], {"model": "fails"}, RequestFailure=3) for k in range(6)]
    windows += [doc(T0 + k * W, [[]], {}, ExporterHeartbeat=1, ModelLoadSuccessRate=100) for k in range(6)]
    data = data_of(*windows)
    failures = evaluate_alarm("triton-model-failures", alarms["triton-model-failures"], data)
    assert (failures.state, failures.detail) == ("ALARM", "fails 15 > 5")  # 5 windows of 3 = one 300 s period
    assert evaluate_alarm("triton-model-load-failed", alarms["triton-model-load-failed"], data).state == "OK"
    assert (
        evaluate_alarm("triton-exporter-heartbeat-missing", alarms["triton-exporter-heartbeat-missing"], data).state
        == "OK"
    )
    gpu = evaluate_alarm("triton-gpu-memory-high", alarms["triton-gpu-memory-high"], data)
    assert gpu.state == "OK" and gpu.no_data  # notBreaching: no data is not an alarm, and the box says so
    quiet = data_of(*[doc(T0 + k * W, [[]], {}, ModelLoadSuccessRate=100) for k in range(6)])
    beat = evaluate_alarm("triton-exporter-heartbeat-missing", alarms["triton-exporter-heartbeat-missing"], quiet)
    assert beat.state == "ALARM"  # missing heartbeats are breaching
    assert evaluate_alarm("triton-nope", None, data).state == "NOT_FOUND"


def task_windows(n: int, **metrics: float) -> list[dict[str, Any]]:
    """``n`` windows of the task's service-wide values (no dimension), one document each."""
    return [doc(T0 + k * W, [[]], {}, **metrics) for k in range(n)]


def test_the_scale_in_alarm_reads_its_metric_stat_terms() -> None:
    """The shipped scale-in alarm: a sum over MetricStat queries. An idle CPU-only service (backlog 0, and no
    GPU, queue time or TensorRT-LLM values: each absent term is 0, as CloudWatch's arithmetic takes it) is
    below 1 for 15 periods: ALARM (scale in). A backlog at the threshold holds the sum at 1: OK. Nothing
    reported: no datapoint, notBreaching: OK, and the box says there was no data."""
    alarms = load_alarms(ALARMS)
    scale_in = alarms["triton-scale-in"]
    assert any("MetricStat" in q for q in scale_in["Metrics"])
    idle = evaluate_alarm("triton-scale-in", scale_in, data_of(*task_windows(16, TaskPendingRequests=0)))
    assert (idle.state, idle.detail) == ("ALARM", "e1 0 < 1")
    busy = data_of(*task_windows(16, TaskPendingRequests=10, GpuUtilization=0))
    assert evaluate_alarm("triton-scale-in", scale_in, busy).state == "OK"
    gpu = data_of(*task_windows(16, TaskPendingRequests=0, GpuUtilization=20))  # 0/10 + 20/40
    assert evaluate_alarm("triton-scale-in", scale_in, gpu).detail == "e1 0.5 < 1"
    silent = evaluate_alarm("triton-scale-in", scale_in, data_of(*task_windows(16, ExporterHeartbeat=1)))
    assert silent.state == "OK" and silent.no_data
    assert dashboard.widget_metrics(alarm_props(scale_in))[:2] == ["TaskPendingRequests", "TaskQueueLatencyMax"]


@pytest.mark.parametrize(
    ("query", "what"),
    [
        ({"Id": "m", "MetricStat": {"Metric": {"Namespace": "Triton", "MetricName": "X"}, "Period": 60}}, "Stat"),
        (
            {
                "Id": "m",
                "MetricStat": {"Metric": {"Namespace": "Triton", "MetricName": "X"}, "Period": 60, "Stat": "Sum"},
                "Unit": "Count",
            },
            "Unit",
        ),
        (
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {"Namespace": "Triton", "MetricName": "X"},
                    "Period": 60,
                    "Stat": "Sum",
                    "Unit": "Count",
                },
            },
            "MetricStat Unit",
        ),
        ({"Id": "m", "Expression": "m1", "AccountId": "1"}, "AccountId"),
        ({"Id": "m", "Label": "nothing to read"}, "no query"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_alarm_queries_the_preview_does_not_read_are_refused(query: dict[str, Any], what: str) -> None:
    definition = {"AlarmName": "a", "Metrics": [query], "ComparisonOperator": "GreaterThanThreshold"}
    with pytest.raises(Unsupported):
        alarm_props(definition)


def test_metric_math_between_two_series_takes_a_missing_value_as_zero() -> None:
    """The User Guide's "Basic arithmetic functions": a value one series lacks at a period is 0 where the other
    has one; a period neither has stays empty; a division by zero drops the period."""
    data = data_of(doc(T0, [[]], {}, A=4, B=2), doc(T0 + W, [[]], {}, A=6), doc(T0 + 3 * W, [[]], {}, B=3))
    rows = [
        ["Triton", "A", {"id": "a", "stat": "Sum", "visible": False}],
        ["Triton", "B", {"id": "b", "stat": "Sum", "visible": False}],
        [{"expression": "a + b", "id": "s", "label": "sum"}],
        [{"expression": "b / a", "id": "r", "label": "ratio"}],
    ]
    lines = evaluate(widget(*rows), data)
    assert points(lines, "sum") == [6.0, 6.0, 3.0]  # periods 0, 1, 3; period 2 has no value in either
    assert points(lines, "ratio") == [0.5, 0.0]  # period 3: 3 / 0 is dropped


# --- the committed dashboard, whole ---------------------------------------------------------------------


def catalog_documents() -> list[dict[str, Any]]:
    """One document per metric and window, with every dimension set the catalog emits it with."""
    values = {"model": "m", "version": "1", "gpu": "0", "result": "ok", "source": "triton_metrics"}
    out = []
    for k in range(3):
        for metric in [*build().metrics, *modelsync_catalog().metrics]:
            dims = [list(d) for d in metric.dimension_sets]
            props = {d: values[d] for ds in dims for d in ds}
            out.append(doc(T0 + k * W, dims, props, **{metric.name: 1.0}))
    return out


def modelsync_events() -> dict[str, list[LogEvent]]:
    body = {
        "model": "m",
        "host": "h",
        "ModelArtifact": "a",
        "ModelInSync": 1.0,
        "SyncFailures": 1.0,
        "result": "hash_mismatch",
        "reason": "r",
        "sha256": "0",
    }
    return {"/ecs/triton/modelsync": [LogEvent(T0 + k * W, json.dumps(body)) for k in range(3)]}


def test_every_metric_widget_of_the_committed_dashboard_finds_its_metrics() -> None:
    """With one datapoint for every metric the catalog emits, every graph has a series: no widget reads a metric
    or a dimension schema the exporter or model sync does not write."""
    data = data_of(*catalog_documents(), logs=modelsync_events())
    body = json.loads(DASHBOARD.read_text())
    dashboard.check(body)
    graphs = [w["properties"] for w in body["widgets"] if w["type"] == "metric"]
    assert graphs
    for props in graphs:
        lines = [ln for ln in evaluate(props, data) if ln.visible]
        assert any(s.points for ln in lines for s in ln.series), props["title"]


def texts(fig: Any) -> list[str]:
    return [t.get_text() for t in fig.texts] + [t.get_text() for ax in fig.axes for t in ax.texts]


def test_the_committed_dashboard_draws_with_data_and_says_why_without(tmp_path: Path) -> None:
    body = json.loads(DASHBOARD.read_text())
    alarms = load_alarms(ALARMS)
    full = dashboard.draw(body, data_of(*catalog_documents(), logs=modelsync_events()), alarms, scope_of())
    dashboard.save(full, tmp_path / "full.png")
    assert (tmp_path / "full.png").stat().st_size > 10_000
    empty = dashboard.draw(body, data_of(doc(T0, [[]], {}, Nothing=0)), alarms, scope_of())
    said = texts(empty)
    graphs = [w for w in body["widgets"] if w["type"] == "metric" and w["properties"].get("view") != "singleValue"]
    gpu = [w for w in graphs if "gpu" in json.dumps(w["properties"]["metrics"]) or "Gpu" in w["properties"]["title"]]
    assert sum(t == "no data in the demo (needs a GPU: NVML)" for t in said) == len(gpu) > 0
    assert sum(t.startswith("no data") for t in said) >= len(graphs)
    logs = [w for w in body["widgets"] if w["type"] == "log"]
    assert sum(t == "no log lines of the demo run match this query" for t in said) == len(logs)
    # each says what it looks for: the timeline, its decision lines in model sync's group
    assert '/ecs/triton/modelsync: filter logger = "modelsync.rollout" and ispresent(verdict)' in said
    plt.close(empty)


def test_a_new_widget_the_preview_cannot_draw_is_refused_before_drawing() -> None:
    body = json.loads(DASHBOARD.read_text())
    for extra in (
        {"type": "explorer", "x": 0, "y": 200, "width": 6, "height": 6, "properties": {}},
        {"type": "metric", "x": 0, "y": 200, "width": 6, "height": 6, "properties": {"view": "gauge", "metrics": []}},
        {"type": "metric", "x": 0, "y": 200, "width": 6, "height": 6, "properties": {"metrics": [], "liveData": True}},
        {"type": "log", "x": 0, "y": 200, "width": 6, "height": 6, "properties": {"query": "", "view": "bar"}},
    ):
        with pytest.raises(Unsupported):
            dashboard.check({**body, "widgets": [*body["widgets"], extra]})


def test_a_new_gpu_widget_says_it_needs_a_gpu() -> None:
    props = widget(
        [{"expression": "SEARCH('{\"Triton\",gpu} MetricName=\"GpuUtilization\"', 'Average', 60)", "id": "g"}]
    )
    body = {"widgets": [{"type": "metric", "x": 0, "y": 0, "width": 8, "height": 6, "properties": props}]}
    fig = dashboard.draw(body, data_of(doc(T0, [[]], {}, Nothing=0)), {}, scope_of())
    assert "no data in the demo (needs a GPU: NVML)" in texts(fig)


# --- sparse series, the NVML fake's GPU panel, the first screen -------------------------------------------


def plotted(fig: Any) -> list[Any]:
    """Every series drawn (matplotlib Line2D) on the figure's graphs, annotations' lines left out."""
    return [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_marker() == "o"]


def test_a_lone_value_is_a_point_and_only_neighbouring_periods_are_joined() -> None:
    """A sync attempt now and another minutes later are two points, not a slope between them; values in
    neighbouring periods are joined, by the series' own period (a 5-minute period's neighbour is 5 windows on)."""
    data = data_of(
        *(doc(T0 + k * W, [[]], {}, Sparse=1.0) for k in (0, 1, 6)),
        *(doc(T0 + k * W, [[]], {}, Dense=2.0) for k in range(8)),
        *(doc(T0 + k * W, [[]], {}, Slow=3.0) for k in (0, 5)),
    )
    drawn = {}
    for name, period in (("Sparse", 60), ("Dense", 60), ("Slow", 300)):
        props = widget(["Triton", name], stat="Sum", period=period)
        fig = dashboard.draw(
            {"widgets": [{"type": "metric", "x": 0, "y": 0, "width": 8, "height": 6, "properties": props}]},
            data,
            {},
            scope_of(),
        )
        drawn[name] = [
            ([float(x) for x in ln.get_xdata()], ln.get_linestyle(), ln.get_markersize()) for ln in plotted(fig)
        ]
        plt.close(fig)
    # the first two minutes joined, the sixth minute's value alone: a point, as large as a sparse series' points
    assert [(xs, style) for xs, style, _ in drawn["Sparse"]] == [([0.0, W], "-"), ([6 * W], "None")]
    assert [size for _, _, size in drawn["Sparse"]] == [dashboard.POINT] * 2 and dashboard.POINT > dashboard.DOT
    # a series of many values: one line, small dots
    ((xs, style, size),) = drawn["Dense"]
    assert len(xs) == 8 and style == "-" and size == dashboard.DOT
    # a 5-minute period: windows 0 and 5 are neighbouring periods, one line
    assert drawn["Slow"] == [([0.0, 5 * W], "-", dashboard.POINT)]
    for lines in drawn.values():  # no line spans more than its series' neighbouring periods
        for xs, style, _ in lines:
            steps = [b - a for a, b in itertools.pairwise(xs) if not (math.isnan(a) or math.isnan(b))]
            assert style == "None" or max(steps, default=0.0) <= 5 * W
    assert dashboard.runs([0.0, 5.0, 30.0, 35.0, 40.0], 7.5) == [[0.0, 5.0], [30.0, 35.0, 40.0]]


def nvml_fake_documents(cycles: int = 3) -> list[dict[str, Any]]:
    """The exporter's real pipeline on the test suite's NVML fake (the preview's scenario): its EMF documents,
    one cycle a window from ``T0``."""
    from exporter.config import Settings
    from exporter.pipeline import Pipeline
    from exporter.sources.nvml import NvmlSource
    from tests.support import nvml_fake
    from tests.support.helpers import CATALOG

    source = NvmlSource(nvml_fake.SCENARIOS[collect.NVML_FAKE](), environ={})
    source.start()
    clock = [0.0]
    pipeline = Pipeline(Settings(), CATALOG, [source], clock=lambda: clock[0], wall=lambda: T0 + clock[0] / 12)
    events: list[bytes] = []
    for _ in range(cycles):
        events += pipeline.cycle().events
        clock[0] += 60.0
    pipeline.close()
    return [json.loads(e) for e in events]


def gpu_panel(body: dict[str, Any]) -> dict[str, Any]:
    (props,) = [
        w["properties"]
        for w in body["widgets"]
        if w["type"] == "metric" and w["properties"]["title"].startswith(dashboard.TOP_GPU_PANEL)
    ]
    return props


def test_the_first_screen_is_status_alarms_the_first_row_and_one_gpu_panel_on_half_the_width() -> None:
    body = json.loads(DASHBOARD.read_text())
    first = dashboard.top(body)
    titles = [w["properties"].get("title") for w in first["widgets"]]
    assert titles[:2] == ["Status (worst task)", "Alarms"]
    assert titles[-1] == gpu_panel(body)["title"]
    assert len(titles) == 6 and all(w["type"] != "text" for w in first["widgets"])  # the three graphs of row one
    dashboard.check(first, dashboard.TOP_COLUMNS)
    cells = set()
    for w in first["widgets"]:  # on the narrow grid, none over another
        area = {(w["x"] + i, w["y"] + j) for i in range(w["width"]) for j in range(w["height"])}
        assert not cells & area, w["properties"].get("title")
        cells |= area
    with pytest.raises(Unsupported, match="no graph titled"):
        dashboard.top(body, gpu_panel="No such panel")


def test_the_gpu_panel_has_the_nvml_fakes_values_and_says_where_they_come_from() -> None:
    """The preview's exporter runs on the test suite's NVML fake: the GPU panel of the first screen has its GPUs'
    values, and says they come from the fake; without the fake it says it needs a GPU."""
    from demo.preview.__main__ import GPU_FAKE_NOTE, gpu_fake_note

    body = json.loads(DASHBOARD.read_text())
    data = data_of(*nvml_fake_documents())
    values = {s.label: sorted(set(s.points.values())) for ln in evaluate(gpu_panel(body), data) for s in ln.series}
    assert values == {"0": [10.0], "1": [11.0], "service average": [10.5]}  # the fake's two H100s: 10 % and 11 %
    fig = dashboard.draw(dashboard.top(body), data, load_alarms(ALARMS), scope_of(), (), 12, gpu_fake_note)
    said = texts(fig)
    assert said.count(GPU_FAKE_NOTE) == 1  # the GPU panel only
    assert "no data in the demo (needs a GPU: NVML)" not in said
    ys = {float(y) for ln in plotted(fig) for y in ln.get_ydata()}
    assert {10.0, 11.0, 10.5} <= ys
    plt.close(fig)
    empty = dashboard.draw(dashboard.top(body), data_of(*catalog_documents()[:1]), {}, scope_of(), (), 12)
    assert GPU_FAKE_NOTE not in texts(empty) and "no data in the demo (needs a GPU: NVML)" in texts(empty)
    plt.close(empty)


def test_a_drawing_writes_the_whole_dashboard_and_its_first_screen(tmp_path: Path) -> None:
    """``draw`` writes the README's picture next to the whole dashboard: the first screen, twice the pixels of
    half the grid's width."""
    from PIL import Image

    from demo.preview.__main__ import draw_run, main, top_of

    events = tmp_path / "events.jsonl"
    lines = [{"meta": {"window": W, "windows": 3, "started": T0, "host": "h", "nvml": collect.NVML_FAKE}}]
    lines += [
        {"group": "/ecs/triton/exporter", "time": d["_aws"]["Timestamp"] / 1000, "stream": "stdout", "message": m}
        for d in nvml_fake_documents()
        for m in [json.dumps(d)]
    ]
    events.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "p.png"
    assert draw_run(events, out) == out and top_of(out) == tmp_path / "p-top.png"
    full, first = Image.open(out), Image.open(tmp_path / "p-top.png")
    assert full.width == dashboard.GRID_WIDTH * dashboard.COL_PX
    assert first.width == 2 * dashboard.TOP_COLUMNS * dashboard.COL_PX
    assert first.height < full.height
    assert main(["draw", str(events), "--out", str(tmp_path / "again.png")]) == 0
    assert (tmp_path / "again-top.png").stat().st_size > 50_000


def test_text_is_cut_to_fit_never_over_its_neighbour() -> None:
    long = "downloaded sha256 f42270df2be23b7bf91723ba5d2d0de79d5c02d6039f2472425 differs"
    cut = fit(long, 150, 6.5)
    assert cut.endswith("…") and width(cut, 6.5) <= 150
    assert fit("short", 150, 6.5) == "short"


def test_matplotlib_is_not_a_runtime_dependency() -> None:
    assert "matplotlib" not in (ROOT / "requirements.lock").read_text()
    assert "matplotlib" in (ROOT / "requirements-dev.lock").read_text()


# --- the rollout timeline ---------------------------------------------------------------------------------

ROLLOUT = {
    "title": "add: canary rollout of build 9f2c",
    "events": [
        {"time": 0, "event": "uploaded"},
        {"host": "canary-1", "time": 4, "event": "canary_installed"},
        {"host": "canary-1", "time": 5, "event": "serving_new"},
        {"host": "canary-1", "time": 5, "event": "bake_started"},
        {"host": "canary-1", "time": 65, "event": "verdict_promoted", "detail": "0 failed of 1200"},
        {"host": "host-2", "time": 70, "event": "installed"},
        {"host": "host-2", "time": 71, "event": "serving_new"},
        {"host": "host-3", "time": 72, "event": "installed"},
        {"host": "host-3", "time": 73, "event": "serving_new"},
    ],
    "failed_requests": [{"host": "canary-1", "time": t, "count": c} for t, c in ((20, 0), (40, 1), (60, 0))],
}


def test_rollout_schema_and_bake_window(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    path.write_text(json.dumps(ROLLOUT))
    r = rollout.load(path)
    assert r.hosts() == ["canary-1", "host-2", "host-3"]
    assert r.bake_windows("canary-1", 100.0) == [(5.0, 65.0, "verdict_promoted")]
    assert r.bake_windows("host-2", 100.0) == []
    open_bake = rollout.parse({"events": [{"host": "c", "time": 1, "event": "bake_started"}]})
    assert open_bake.bake_windows("c", 50.0) == [(1.0, 50.0, "")]  # no verdict yet: to the end of the axis
    out = tmp_path / "rollout.png"
    rollout.save(rollout.draw(r), out)
    assert out.stat().st_size > 5_000


@pytest.mark.parametrize(
    ("doc_", "message"),
    [
        ({"events": [{"host": "h", "time": 1, "event": "deployed"}]}, "not one of"),
        ({"events": [{"host": "h", "time": -1, "event": "installed"}]}, ">= 0"),
        ({"events": [{"time": 1, "event": "installed"}]}, "host None"),
        ({"events": [{"host": "h", "time": 1, "event": "installed", "extra": 1}]}, "an object of"),
        ({"events": []}, "1-10000"),
        ({"events": [{"host": "h", "time": 1, "event": "installed"}], "hosts": []}, "unknown keys"),
        (
            {
                "events": [{"host": "h", "time": 1, "event": "installed"}],
                "failed_requests": [{"host": "h", "time": 1, "count": -2}],
            },
            ">= 0",
        ),
        ([1, 2], "no JSON object"),
    ],
)
def test_rollout_files_outside_the_schema_are_refused(doc_: Any, message: str) -> None:
    with pytest.raises(rollout.RolloutError, match=message):
        rollout.parse(doc_)


def test_rollout_command(tmp_path: Path) -> None:
    path, out = tmp_path / "r.json", tmp_path / "r.png"
    path.write_text(json.dumps(ROLLOUT))
    run = subprocess.run(
        [sys.executable, "-m", "demo.preview", "rollout", str(path), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert out.stat().st_size > 5_000


def test_a_bake_window_closes_at_the_rollouts_verdict_whichever_host_logged_it() -> None:
    r = rollout.parse(
        {
            "events": [
                {"host": "a", "time": 2, "event": "bake_started"},
                {"host": "b", "time": 3, "event": "bake_started"},
                {"host": "a", "time": 9, "event": "verdict_rejected"},
                {"host": "b", "time": 1, "event": "serving_new"},
                {"host": "b", "time": 11, "event": "rolled_back"},
            ]
        }
    )
    assert r.bake_windows("b", 20.0) == [(3.0, 9.0, "verdict_rejected")]
    assert r.serving("b", 20.0) == [(1.0, 11.0)]
    assert r.serving("a", 20.0) == []
    assert r.canaries() == set()


# --- the rollouts bench/bench_rollout.py measured ----------------------------------------------------------


def bench_run(behaviour: str, decisions: dict[str, list[dict[str, Any]]], **per_host: dict[str, Any]) -> dict[str, Any]:
    hosts = list(decisions)
    run: dict[str, Any] = {
        "behaviour": behaviour,
        "decisions": decisions,
        "first_new_answer_s": dict.fromkeys(hosts),
        "first_failure_s": dict.fromkeys(hosts),
        "back_on_previous_s": dict.fromkeys(hosts),
        "failed_requests": dict.fromkeys(hosts, 0),
        "failed_per_second": {h: [0, 0, 0] for h in hosts},
        "requests": dict.fromkeys(hosts, 150),
    }
    for key, values in per_host.items():
        run[key] = {**run[key], **values}
    return run


EVIDENCE = {
    "canary": {"requests": 120, "failures": 120, "failure_ratio": 1.0},
    "baseline": {"requests": 130, "failures": 0, "failure_ratio": 0.0, "avg_ms": 1.5},
}
BENCH = {
    "settings": {"hosts": 3, "canary_fraction": 0.25, "bake_seconds": 20.0, "bake_min_requests": 30},
    "good": bench_run(
        "ok",
        {
            "h-a": [{"sha256": "new", "t": 30.5, "verdict": "installed"}],
            "h-b": [
                {"verdict": "started", "t": 1.0, "reason": "new goes to 1 canary host(s) of 3 live first"},
                {"verdict": "installed", "t": 3.0, "sha256": "new"},
                {"verdict": "baking", "t": 8.0, "reason": "canary h-b serves new"},
                {"verdict": "waiting for evidence", "t": 28.0, "reason": "12 requests of 30"},
                {"verdict": "promoted", "t": 29.0, "reason": "no evidence kept: this reason is shown"},
            ],
            "h-c": [],
        },
        first_new_answer_s={"h-a": 31.0, "h-b": 3.5},
    ),
    "bad": bench_run(
        "fail",
        {
            "h-a": [
                {"verdict": "started", "t": 1.0, "reason": "bad goes to 1 canary host(s) of 3 live first"},
                {"verdict": "installed", "t": 3.0, "sha256": "bad"},
                {"verdict": "baking", "t": 9.0, "reason": "canary h-a serves bad"},
                {"verdict": "rejected", "t": 30.0, "reason": "failure ratio 1.0", "evidence": EVIDENCE},
                {"verdict": "installed", "t": 33.0, "sha256": "old"},
                {"verdict": "rolled back", "t": 33.1, "reason": "failure ratio 1.0"},
            ],
            "h-b": [],
            "h-c": [],
        },
        first_failure_s={"h-a": 3.2},
        back_on_previous_s={"h-a": 33.25},
        failed_requests={"h-a": 70},
        failed_per_second={"h-a": [0, 0, 0, 30, 40]},
    ),
}


def test_the_benchs_good_rollout_becomes_the_timelines_events() -> None:
    got = rollout_bench.convert(BENCH, "good")
    assert sorted((e["time"], e.get("host", ""), e["event"], e.get("detail", "")) for e in got["events"]) == [
        (0, "", "uploaded", ""),
        (1.0, "h-b", "canary_chosen", ""),
        (3.0, "h-b", "canary_installed", "new"),
        (3.5, "h-b", "serving_new", ""),
        (8.0, "h-b", "bake_started", ""),
        (29.0, "h-b", "verdict_promoted", "no evidence kept: this reason is shown"),
        (30.5, "h-a", "installed", "new"),
        (31.0, "h-a", "serving_new", ""),
    ]
    assert got["title"] == "A good build: canary h-b, promoted; 1 of the 2 other hosts install it"
    assert {(c["host"], c["time"], c["count"]) for c in got["failed_requests"]} == {
        (h, t, 0) for h in ("h-a", "h-b", "h-c") for t in (1, 2, 3)
    }
    assert got["requests"] == [{"host": h, "count": 150} for h in ("h-a", "h-b", "h-c")]
    r = rollout.parse(got)
    assert r.hosts() == ["h-b", "h-a", "h-c"]  # the canary first, then in the order they act
    assert r.bake_windows("h-b", 40.0) == [(8.0, 29.0, "verdict_promoted")]


def test_the_benchs_bad_rollout_rolls_back_on_the_canary_only() -> None:
    got = rollout_bench.convert(BENCH, "bad")
    canary = sorted((e["time"], e["event"], e.get("detail", "")) for e in got["events"] if e.get("host") == "h-a")
    assert canary == [
        (1.0, "canary_chosen", ""),
        (3.0, "canary_installed", "bad"),
        (3.2, "serving_new", ""),  # a build that fails every request never answers: its first failure
        (9.0, "bake_started", ""),
        (30.0, "verdict_rejected", "canary 120 requests, 100% failed; previous build 130 requests, 0% failed, 1.50 ms"),
        (33.1, "rolled_back", "the previous build answers again at 33.2 s"),  # the reinstall of "old" is not drawn
    ]
    assert not [e for e in got["events"] if e.get("host") in ("h-b", "h-c")]
    assert got["title"] == (
        "A harmful build (every request fails): canary h-a, rejected, rolled back; "
        "none of the 2 other hosts installs it"
    )
    failed = [(c["time"], c["count"]) for c in got["failed_requests"] if c["host"] == "h-a"]
    assert failed == [(1, 0), (2, 0), (3, 0), (4, 30), (5, 40)]  # second i ends at i + 1
    r = rollout.parse(got)
    assert [r.failed_total(h) for h in r.hosts()] == [70.0, 0.0, 0.0]
    assert r.serving("h-a", 50.0) == [(3.2, 33.1)]
    heading = rollout_bench.heading(BENCH)
    assert "3 hosts" in heading[1] and "--canary-fraction 0.25 --bake-seconds 20 --bake-min-requests 30" in heading[1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("bad"), "no rollout 'bad' in the bench's file"),
        (lambda d: d["bad"].pop("failed_per_second"), "no failed_per_second"),
        (
            lambda d: d["bad"]["decisions"]["h-a"].append({"verdict": "superseded", "t": 40}),
            "'superseded' is not drawn",
        ),
        (lambda d: d["bad"]["decisions"]["h-a"].__setitem__(0, {"verdict": "baking", "t": 1}), "no host took a canary"),
        (lambda d: d["bad"]["decisions"]["h-a"][2].__setitem__("t", "soon"), "not a number of seconds"),
        (lambda d: d["bad"]["decisions"]["h-a"][2].__setitem__("t", -1.0), ">= 0"),
        (lambda d: d["bad"]["failed_per_second"].__setitem__("h-a", [-1]), ">= 0"),
        (lambda d: d["bad"].__setitem__("decisions", {}), "no host"),
    ],
)
def test_a_bench_file_the_timeline_cannot_draw_is_refused(change: Any, message: str) -> None:
    doc = json.loads(json.dumps(BENCH))
    change(doc)
    with pytest.raises(rollout.RolloutError, match=message):
        rollout_bench.rollouts(doc)


def test_what_the_bench_writes_is_what_the_converter_reads() -> None:
    """bench/bench_rollout.py's own functions, on traffic and log lines of known times."""
    spec = importlib.util.spec_from_file_location("bench_rollout", ROOT / "bench" / "bench_rollout.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    nan = float("nan")
    results = [(100.2, 200, 1.0), (100.9, 500, nan), (101.1, 500, nan), (101.5, 0, nan), (102.4, 200, 1.0)]
    host = SimpleNamespace(name="h-a", traffic={"m": SimpleNamespace(results=results)})
    fleet = SimpleNamespace(hosts=[host])
    assert bench.failed_per_second(fleet, "m", 100.0) == {"h-a": [1, 2, 0]}
    line = {"verdict": "rejected", "evidence": {**EVIDENCE, "thresholds": {}, "canaries": ["h-a"], "baked_s": 21.0}}
    assert bench.evidence(line) == {**EVIDENCE, "baked_s": 21.0}


def test_the_committed_timeline_draws_both_rollouts(tmp_path: Path) -> None:
    """docs/rollout-timeline.json (bench/bench_rollout.py's last run) says what docs/modelsync.md says of it."""
    doc = rollout_bench.load(ROOT / "docs" / "rollout-timeline.json")
    good, bad = rollout_bench.rollouts(doc)
    for r, verdict in ((good, "verdict_promoted"), (bad, "verdict_rejected")):
        (canary,) = r.canaries()
        assert r.hosts()[0] == canary
        assert [e.event for e in r.events if e.event in rollout.VERDICTS] == [verdict]
    assert all(any(e.host == h and e.event == "installed" for e in good.events) for h in good.hosts()[1:])
    (canary,) = bad.canaries()
    assert bad.failed_total(canary) > 0 and [bad.failed_total(h) for h in bad.hosts()[1:]] == [0, 0, 0]
    assert any(e.host == canary and e.event == "rolled_back" for e in bad.events)
    out = tmp_path / "timeline.png"
    run = subprocess.run(
        [sys.executable, "-m", "demo.preview", "rollout", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert out.stat().st_size > 20_000
    assert (ROOT / "docs" / "rollout-timeline.png").stat().st_size > 20_000
    assert "rollout-timeline.png" in (ROOT / "docs" / "modelsync.md").read_text()


def test_the_rollout_command_says_what_is_wrong_with_a_bench_file(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    doc = json.loads(json.dumps(BENCH))
    del doc["good"]["failed_per_second"]
    path.write_text(json.dumps(doc))
    run = subprocess.run(
        [sys.executable, "-m", "demo.preview", "rollout", "--from-bench", str(path), "--out", str(tmp_path / "x.png")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert "no failed_per_second" in run.stderr and "bench/bench_rollout.py --timeline" in run.stderr
    assert not (tmp_path / "x.png").exists()


# --- the whole command, against a real Triton -------------------------------------------------------------


def test_a_run_stops_at_once_when_the_process_it_waits_for_has_exited() -> None:
    """The exporter exiting at start (a port taken, a bad flag) is said with its last words at once, not as a
    timeout a minute later."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stderr.write('cannot listen on 127.0.0.1:4318\\n'); sys.exit(2)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines = collect.Lines()
    threads = [lines.pump("exporter", "stdout", proc.stdout), lines.pump("exporter", "stderr", proc.stderr)]
    with pytest.raises(collect.RunFailed, match=r"exporter exited while waiting for exporter window 1: cannot listen"):
        lines.wait(lambda x: False, 600, "exporter window 1", "exporter")
    proc.wait(5)
    for t in threads:
        t.join(5)
    with pytest.raises(collect.RunFailed, match=r"timed out after 0\.1s"):  # another process's end is not this one's
        lines.wait(lambda x: False, 0.1, "model sync", "modelsync")
