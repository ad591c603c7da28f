"""The rendered dashboard, alarms and scaling: current, valid, and meaning what the issue asks.

Validation is offline with the real validators: botocore's own service
models (PutMetricAlarm, RegisterScalableTarget, PutScalingPolicy) and
cfn-lint's Python API. The dashboard body has no published validator, so
its structure (widget types, 24-column grid, metric-row array syntax,
limits) is checked here.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ParamValidationError
from botocore.validate import validate_parameters
from cfnlint.api import lint_all

from catalog import modelsync_catalog
from modelsync.errors import Result
from render import main, render, stale_files
from render.base.options import Options, model_log_group
from render.base.widgets import emitted
from render.dashboard import GRID_WIDTH, MAX_METRICS_PER_WIDGET, MAX_WIDGETS
from render.template import build as build_template
from tests.support.helpers import CATALOG
from tests.support.paths import REPO
from tests.support.render_refs import dashboard_refs, metric_rows

ROOT = REPO
SESSION = botocore.session.get_session()
CLOUDWATCH = SESSION.get_service_model("cloudwatch")
AUTOSCALING = SESSION.get_service_model("application-autoscaling")
WIDGET_TYPES = {"metric", "text", "log", "alarm"}
SCALING_POLICY_FILES = ("scale-out-pending", "scale-out-queue-time", "scale-out-llm-waiting", "scale-in")
RICH = Options(
    catalog=CATALOG,
    models=("add", "m@x.v2+b", "modèle-ü"),
    sns_topic_arn="arn:aws:sns:eu-west-1:111122223333:ops",
    namespace="Prod/Triton",
    region="eu-west-1",
    account_id="111122223333",
)


def _validate(model: Any, operation: str, params: dict[str, Any]) -> None:
    validate_parameters(params, model.operation_model(operation).input_shape)


@pytest.fixture(scope="module")
def default_files() -> dict[str, str]:
    return render(Options(catalog=CATALOG))


@pytest.fixture(scope="module")
def rich_files() -> dict[str, str]:
    return render(RICH)


# --- freshness ----------------------------------------------------------------------------------


def test_committed_files_equal_a_fresh_render(default_files) -> None:
    differ = [
        rel
        for rel, text in default_files.items()
        if not (ROOT / rel).is_file() or (ROOT / rel).read_text(encoding="utf-8") != text
    ]
    assert differ == [], "run: python -m render"
    assert stale_files(ROOT, default_files) == []


def test_render_check_flags_an_edited_file_and_a_stale_one(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "docs" / "metrics.md").write_text("edited by hand\n")
    (tmp_path / "alarms" / "cli" / "alarm-old.json").write_text("{}")
    assert main(["--out", str(tmp_path), "--check"]) == 1
    assert main(["--out", str(tmp_path)]) == 0
    assert not (tmp_path / "alarms" / "cli" / "alarm-old.json").exists()
    assert main(["--out", str(tmp_path), "--check"]) == 0


def test_bad_thresholds_are_usage_errors(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--gpu-scale-in", "0"]) == 2
    assert main(["--out", str(tmp_path), "--pending-scale-out", "0.5"]) == 2
    assert main(["--out", str(tmp_path), "--queue-time-scale-out-ms", "0.0001"]) == 2
    assert main(["--out", str(tmp_path), "--scale-in-cooldown", "10"]) == 2
    assert main(["--out", str(tmp_path), "--min-capacity", "5", "--max-capacity", "2"]) == 2
    assert not (tmp_path / "dashboards").exists()


def test_metrics_doc_lists_every_catalog_metric_and_dimension_set(default_files) -> None:
    doc = default_files["docs/metrics.md"]
    for m in CATALOG.metrics:
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{m.name}` |"))
        for dims in m.dimension_sets:
            assert (", ".join(f"`{d}`" for d in dims) or "(none)") in row


# --- dashboard structure ------------------------------------------------------------------------


def _check_dashboard(body: dict[str, Any], region: str) -> None:
    widgets = body["widgets"]
    assert 0 < len(widgets) <= MAX_WIDGETS
    cells: set[tuple[int, int]] = set()
    for w in widgets:
        assert w["type"] in WIDGET_TYPES
        x, y, width, height = w["x"], w["y"], w["width"], w["height"]
        assert all(isinstance(v, int) for v in (x, y, width, height))
        assert x >= 0 and y >= 0 and 1 <= width <= GRID_WIDTH and 1 <= height <= 1000
        assert x + width <= GRID_WIDTH
        mine = {(cx, cy) for cx in range(x, x + width) for cy in range(y, y + height)}
        assert not mine & cells, f"widget overlaps another: {w.get('properties', {}).get('title')}"
        cells |= mine
        props = w["properties"]
        if w["type"] == "metric":
            assert props["region"] == region
            _check_metric_rows(props["metrics"])
        elif w["type"] == "log":
            assert props["region"] == region
            assert re.match(r"^SOURCE '[^']+'( \| SOURCE '[^']+')* \| fields ", props["query"])
        elif w["type"] == "text":
            assert props["markdown"].strip()
        elif w["type"] == "alarm":
            assert 1 <= len(props["alarms"]) <= 100
            assert all(a.startswith(f"arn:aws:cloudwatch:{region}:") for a in props["alarms"])


def _check_metric_rows(rows: list[list[Any]]) -> None:
    assert 1 <= len(rows) <= MAX_METRICS_PER_WIDGET
    ids: list[str] = []
    for row, cells in zip(rows, metric_rows(rows), strict=True):
        assert isinstance(row, list) and row
        opts = [c for c in row if isinstance(c, dict)]
        assert len(opts) <= 1 and (not opts or row[-1] is opts[0]), "options must be the last cell"
        if "id" in (opts or [{}])[0]:
            ids.append(opts[0]["id"])
            assert re.fullmatch(r"[a-z][A-Za-z0-9_]*", opts[0]["id"])
        if cells:
            # [namespace, metric, dimName, dimValue, ...]
            assert len(cells) >= 2 and len(cells) % 2 == 0 and all(isinstance(c, str) and c for c in cells)
            assert "expression" not in (opts or [{}])[0]
        else:
            assert "expression" in opts[0] and "id" in opts[0]
    assert len(ids) == len(set(ids))
    for row in rows:  # an expression may only name ids defined in the same widget
        expression = row[-1].get("expression", "") if isinstance(row[-1], dict) else ""
        for name in re.findall(r"\b([a-z][A-Za-z0-9_]*)\b(?=\s*[/)*+-]|\s*$)", expression.split("'")[0]):
            if name not in ("model", "version", "gpu") and not name.isupper():
                assert name in ids, f"{expression!r} refers to unknown id {name}"


def test_default_dashboard_is_a_valid_body(default_files) -> None:
    body = json.loads(default_files["dashboards/triton.json"])
    _check_dashboard(body, "us-east-1")


def test_rich_dashboard_is_a_valid_body_with_model_log_groups(rich_files) -> None:
    body = json.loads(rich_files["dashboards/triton.json"])
    _check_dashboard(body, "eu-west-1")
    queries = [w["properties"]["query"] for w in body["widgets"] if w["type"] == "log"]
    assert any("SOURCE '/ecs/triton/model/m.x.v2.b'" in q and "SOURCE '/ecs/triton/model/add'" in q for q in queries)


@pytest.mark.parametrize("which", ["default_files", "rich_files"])
def test_only_the_last_row_of_a_section_leaves_columns_empty(which: str, request: pytest.FixtureRequest) -> None:
    """A hole in the middle of a section (a widget pushed to the next row) reads as a missing widget."""
    body = json.loads(request.getfixturevalue(which)["dashboards/triton.json"])
    rows: dict[int, int] = {}
    for w in body["widgets"]:
        rows[w["y"]] = rows.get(w["y"], 0) + w["width"]
    ys = sorted(rows)
    starts = {w["y"] for w in body["widgets"] if w["type"] == "text" and w["height"] == 1}  # section headings
    holes = [y for y, after in itertools.pairwise(ys) if rows[y] < GRID_WIDTH and after not in starts]
    assert not holes, [
        (y, rows[y], [w["properties"].get("title") for w in body["widgets"] if w["y"] == y]) for y in holes
    ]


def test_request_latency_p99_widget_and_ttft_alarm_read_the_first_response_split(default_files) -> None:
    """Triton's first-response histogram is a request latency for models that are not decoupled (a p99 over
    every task, per model) and a time to first token only for decoupled ones (the TTFT alarm)."""
    text = json.dumps(json.loads(default_files["dashboards/triton.json"]))
    assert "SEARCH('{\\\"Triton\\\",model} MetricName=\\\"RequestLatency\\\"', 'p99', 60)" in text
    alarm = json.loads(default_files["alarms/cli/alarm-llm-ttft-p95.json"])
    assert alarm["MetricName"] == "TimeToFirstToken" and "decoupled" in alarm["AlarmDescription"]


def test_dashboard_covers_the_sections_the_issue_lists(default_files) -> None:
    body = json.loads(default_files["dashboards/triton.json"])
    text = json.dumps(body)
    for name in (
        "TritonUp",
        "ModelsReady",
        "ModelsNotReady",
        "ModelLoadSuccessRate",
        "RequestSuccess",
        "RequestFailureBackend",
        "RequestFailureRejected",
        "RequestsPerSecond",
        "RequestLatencyAvg",
        "RequestLatencyP95",
        "RequestLatencyP99",
        "QueueLatencyAvg",
        "ComputeLatencyAvg",
        "AverageBatchSize",
        "PendingRequests",
        "GpuUtilization",
        "GpuMemoryUsedPercent",
        "GpuPowerWatts",
        "GpuTemperatureCelsius",
        "GpuThrottleThermal",
        "GpuXidErrors",
        "GpuEccUncorrectedErrors",
    ):
        assert f"{name}" in text, name
    types = [w["type"] for w in body["widgets"]]
    assert types.count("alarm") == 1 and types.count("log") >= 2
    # Per-model graphs are SEARCH expressions on the model schema: new models need no edit.
    assert 'SEARCH(\'{\\"Triton\\",model,version} MetricName=\\"RequestsPerSecond\\"\'' in text
    # One explaining line per section at the top.
    intro = body["widgets"][0]["properties"]["markdown"]
    assert all(s in intro for s in ("**Overview**", "**Per model**", "**GPU**", "**Logs**"))


def test_log_widgets_use_the_fluent_bit_group_names() -> None:
    conf = (ROOT / "fluentbit" / "triton.conf").read_text()
    dockerfile = (ROOT / "fluentbit" / "Dockerfile").read_text()
    prefix = re.search(r"TRITON_LOG_GROUP_PREFIX=(\S+)", dockerfile).group(1).strip("\"'")
    assert prefix == Options(catalog=CATALOG).log_group_prefix
    assert "log_group_name      ${TRITON_LOG_GROUP_PREFIX}/errors" in conf
    assert "log_group_template  ${TRITON_LOG_GROUP_PREFIX}/model/$TAG[3].$TAG[4]" in conf
    assert model_log_group(prefix, "m@x.v2+b") == "/ecs/triton/model/m.x.v2.b"  # docs/logs.md's examples
    assert model_log_group(prefix, "ns::ranker") == "/ecs/triton/model/ns.ranker"
    assert model_log_group(prefix, "modèle-ü") == "/ecs/triton/model/mod.le-"
    assert model_log_group(prefix, "a.b.c.d.e") == "/ecs/triton/server"
    body = json.loads((ROOT / "dashboards" / "triton.json").read_text())
    queries = [w["properties"]["query"] for w in body["widgets"] if w["type"] == "log"]
    # Fluent Bit's groups: errors, and exporter (the trace relay's slow-request lines, the GPU fault lines); and
    # the modelsync daemon's own awslogs group (deploy/stack.yaml: artifacts served, sync failures, task starts,
    # rollouts).
    triton = [q for q in queries if not q.startswith((f"SOURCE '{prefix}/modelsync'", f"SOURCE '{prefix}/exporter'"))]
    assert len(triton) == len(queries) - 6 and all(q.startswith(f"SOURCE '{prefix}/errors'") for q in triton)
    assert "log_group_name      ${TRITON_LOG_GROUP_PREFIX}/exporter" in conf


def test_alarm_widget_lists_every_rendered_alarm(rich_files) -> None:
    body = json.loads(rich_files["dashboards/triton.json"])
    (widget,) = [w for w in body["widgets"] if w["type"] == "alarm"]
    names = sorted(json.loads(t)["AlarmName"] for rel, t in rich_files.items() if "/alarm-" in rel)
    assert sorted(a.rsplit(":", 1)[1] for a in widget["properties"]["alarms"]) == names
    assert all(a.startswith("arn:aws:cloudwatch:eu-west-1:111122223333:alarm:") for a in widget["properties"]["alarms"])


# --- alarms and scaling: botocore's own models --------------------------------------------------


def _alarms(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {rel: json.loads(t) for rel, t in files.items() if "/alarm-" in rel}


@pytest.mark.parametrize("which", ["default_files", "rich_files"])
def test_cli_files_pass_botocore_validation(which: str, request: pytest.FixtureRequest) -> None:
    files = request.getfixturevalue(which)
    alarms = _alarms(files)
    assert len(alarms) == (17 if which == "default_files" else 26)
    for body in alarms.values():
        _validate(CLOUDWATCH, "PutMetricAlarm", body)
    rules = {rel: json.loads(t) for rel, t in files.items() if "/insight-rule-" in rel}
    assert len(rules) == 2
    for body in rules.values():
        _validate(CLOUDWATCH, "PutInsightRule", body)
    _validate(
        AUTOSCALING, "RegisterScalableTarget", json.loads(files["alarms/cli/scaling/register-scalable-target.json"])
    )
    for key in SCALING_POLICY_FILES:
        _validate(AUTOSCALING, "PutScalingPolicy", json.loads(files[f"alarms/cli/scaling/policy-{key}.json"]))


def test_botocore_validation_is_not_vacuous(default_files) -> None:
    body = json.loads(default_files["alarms/cli/alarm-exporter-heartbeat-missing.json"])
    with pytest.raises(ParamValidationError):
        _validate(CLOUDWATCH, "PutMetricAlarm", {**body, "Threshold": "one"})
    with pytest.raises(ParamValidationError):
        _validate(CLOUDWATCH, "PutMetricAlarm", {**body, "TreatMissingDatas": "breaching"})
    policy = json.loads(default_files["alarms/cli/scaling/policy-scale-out-pending.json"])
    with pytest.raises(ParamValidationError):
        _validate(AUTOSCALING, "PutScalingPolicy", {**policy, "PolicyType": 7})


def test_alarm_semantics(default_files) -> None:
    a = {rel.rsplit("alarm-", 1)[1].removesuffix(".json"): b for rel, b in _alarms(default_files).items()}
    for body in a.values():
        assert "SEARCH" not in json.dumps(body)  # alarms cannot use SEARCH
        queries = body.get("Metrics", [])
        periods = [q.get("Period") or q.get("MetricStat", {}).get("Period") for q in queries]
        period = body.get("Period") or max(p for p in periods if p)
        assert period * body["EvaluationPeriods"] <= 86400
        assert len(body.get("Metrics", [])) <= 10
        assert body["DatapointsToAlarm"] <= body["EvaluationPeriods"]
    hb = a["exporter-heartbeat-missing"]
    assert (hb["MetricName"], hb["TreatMissingData"], hb["ComparisonOperator"]) == (
        "ExporterHeartbeat",
        "breaching",
        "LessThanThreshold",
    )
    mem = a["gpu-memory-high"]
    assert (mem["MetricName"], mem["Threshold"], mem["Period"] * mem["EvaluationPeriods"]) == (
        "GpuMemoryUsedPercent",
        95.0,
        600,
    )
    assert mem["Dimensions"] == []  # the service rollup: no task id, aggregated across tasks
    assert "alarms/cli/alarm-gpu-memory-high.json" in default_files  # notifies only: not a scaling alarm
    # Scale out: high-resolution alarms (10 s periods, 3 of 3: 30 s held) on the per-task leading signals.
    for name, metric, threshold in (
        ("scale-out-pending", "TaskPendingRequests", 10.0),
        ("scale-out-queue-time", "TaskQueueLatencyMax", 100_000.0),  # 100 ms in microseconds
        ("scale-out-llm-waiting", "TaskRequestsWaiting", 4.0),
    ):
        out = a[name]
        assert (out["MetricName"], out["Dimensions"], out["Statistic"], out["Threshold"]) == (
            metric,
            [],
            "Average",
            threshold,
        )
        assert (out["Period"], out["EvaluationPeriods"], out["DatapointsToAlarm"]) == (10, 3, 3)
        assert (out["ComparisonOperator"], out["TreatMissingData"]) == ("GreaterThanThreshold", "notBreaching")
    # Scale in: every signal low (their sum over their levels below 1) for 15 minutes; no data: no scale-in.
    into = a["scale-in"]
    assert (into["EvaluationPeriods"], into["DatapointsToAlarm"], into["Threshold"]) == (15, 15, 1.0)
    assert (into["ComparisonOperator"], into["TreatMissingData"]) == ("LessThanThreshold", "notBreaching")
    (e1,) = [q for q in into["Metrics"] if q["ReturnData"]]
    assert e1["Expression"] == "pending / 10.0 + queue / 100000.0 + gpu / 40.0 + waiting / 4.0 + kvcache / 90.0"
    stats = {q["Id"]: q["MetricStat"] for q in into["Metrics"] if not q["ReturnData"]}
    assert {k: (v["Metric"]["MetricName"], v["Stat"], v["Period"]) for k, v in stats.items()} == {
        # The average task's: a per-task measure that does not grow with the number of tasks (issue 37).
        "pending": ("TaskPendingRequests", "Average", 60),
        "queue": ("TaskQueueLatencyMax", "Average", 60),
        "gpu": ("GpuUtilization", "Average", 60),
        "waiting": ("TaskRequestsWaiting", "Average", 60),
        "kvcache": ("KvCacheUtilization", "Average", 60),
    }
    load = a["model-load-failed"]
    assert (load["MetricName"], load["Threshold"], load["ComparisonOperator"]) == (
        "ModelLoadSuccessRate",
        100.0,
        "LessThanThreshold",
    )
    fail = a["model-failures"]["Metrics"][0]
    assert fail["Period"] == 300 and "GROUP BY model" in fail["Expression"]
    assert 'SCHEMA("Triton", model)' in fail["Expression"]
    lat = a["model-latency-p95"]
    assert lat["Threshold"] == 500_000.0  # 500 ms in the metric's unit, microseconds


def test_model_sync_section_and_alarm(default_files) -> None:
    body = json.loads(default_files["dashboards/triton.json"])
    titles = [w["properties"].get("title", "") for w in body["widgets"]]
    texts = [w["properties"]["markdown"] for w in body["widgets"] if w["type"] == "text"]
    assert any(t.startswith("**Model sync**") for t in texts)
    (served,) = [
        w for w in body["widgets"] if w["properties"].get("title", "").startswith("Artifacts served per model")
    ]
    query = served["properties"]["query"]
    assert query.startswith("SOURCE '/ecs/triton/modelsync' | fields ")
    assert "stats latest(ModelArtifact) as artifact by model, host" in query  # each task's newest state
    assert "stats count(*) as tasks by model, artifact" in query  # then every artifact with its task count
    (skew,) = [w for w in body["widgets"] if w["properties"].get("title", "").startswith("Version skew")]
    expressions = [row[-1]["expression"] for row in skew["properties"]["metrics"]]
    assert expressions == [
        "INSIGHT_RULE_METRIC('triton-model-artifacts', 'UniqueContributors')",
        "INSIGHT_RULE_METRIC('triton-models', 'UniqueContributors')",
        "pairs - models",
    ]
    skew_alarm = json.loads(default_files["alarms/cli/alarm-model-version-skew.json"])
    assert [q["Expression"] for q in skew_alarm["Metrics"]] == expressions  # the dashboard shows what alarms
    assert (skew_alarm["EvaluationPeriods"], skew_alarm["DatapointsToAlarm"], skew_alarm["Threshold"]) == (3, 3, 0.0)
    rules = {
        json.loads(default_files[f"alarms/cli/insight-rule-{n}.json"])["RuleName"]
        for n in ("model-artifacts", "models")
    }
    assert rules == {"triton-model-artifacts", "triton-models"}
    assert "Sync failures per model" in titles and "Sync attempts by result (all hosts)" in titles
    alarm = json.loads(default_files["alarms/cli/alarm-model-sync-failures.json"])
    assert (
        alarm["MetricName"],
        alarm["Dimensions"],
        alarm["Statistic"],
        alarm["Period"],
        alarm["Threshold"],
        alarm["ComparisonOperator"],
        alarm["TreatMissingData"],
    ) == ("SyncFailures", [], "Sum", 300, 0.0, "GreaterThanThreshold", "notBreaching")


def test_model_sync_render_refuses_a_metric_modelsync_does_not_emit() -> None:
    pack = modelsync_catalog()
    assert emitted(pack, "SyncFailures", ("model",)) == "SyncFailures"
    with pytest.raises(KeyError):
        emitted(pack, "SyncLatency", ())
    with pytest.raises(KeyError):
        emitted(pack, "ModelsInSync", ("model",))  # a host total has no model dimension
    with pytest.raises(KeyError):
        emitted(CATALOG, "SyncFailures", ())  # the exporter's catalog does not emit model sync's metrics


def test_scaling_backstop_adds_one_task_and_scale_in_removes_one(default_files) -> None:
    """The level alarms' policy adds one task (the excess policy adds in proportion: test_scaling_policy.py);
    every scale-out cooldown is TaskStartSeconds (600 s by default) plus the alarm's sight (40 s)."""
    out = json.loads(default_files["alarms/cli/scaling/policy-scale-out-pending.json"])
    into = json.loads(default_files["alarms/cli/scaling/policy-scale-in.json"])
    target = json.loads(default_files["alarms/cli/scaling/register-scalable-target.json"])
    assert target["ResourceId"] == "service/triton/triton"
    assert target["ScalableDimension"] == "ecs:service:DesiredCount"
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 4)
    config = out["StepScalingPolicyConfiguration"]
    assert config["StepAdjustments"] == [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]
    assert (config["AdjustmentType"], config["Cooldown"], config["MetricAggregationType"]) == (
        "ChangeInCapacity",
        640,
        "Average",
    )
    assert into["StepScalingPolicyConfiguration"]["StepAdjustments"] == [
        {"MetricIntervalUpperBound": 0, "ScalingAdjustment": -1}
    ]
    assert into["StepScalingPolicyConfiguration"]["Cooldown"] == 600


def test_sns_topic_goes_into_notification_alarms_only(rich_files) -> None:
    a = _alarms(rich_files)
    topic = RICH.sns_topic_arn
    assert a["alarms/cli/alarm-exporter-heartbeat-missing.json"]["AlarmActions"] == [topic]
    assert a["alarms/cli/alarm-gpu-memory-high.json"]["AlarmActions"] == [topic]
    assert "AlarmActions" not in a["alarms/cli/scaling/alarm-scale-out-pending.json"]  # apply.sh wires the policy
    script = rich_files["alarms/cli/apply.sh"]
    assert 'alarm-scale-out-pending.json --alarm-actions "$SCALE_OUT_PENDING"' in script
    assert 'alarm-scale-in.json --alarm-actions "$SCALE_IN"' in script


def test_apply_script_is_valid_sh_and_names_existing_files(tmp_path: Path, default_files) -> None:
    script = default_files["alarms/cli/apply.sh"]
    path = tmp_path / "apply.sh"
    path.write_text(script)
    sh = shutil.which("sh")
    assert sh is not None
    assert subprocess.run([sh, "-n", str(path)], capture_output=True).returncode == 0
    for ref in re.findall(r"file://(scaling/[\w.-]+\.json)", script):
        assert f"alarms/cli/{ref}" in default_files
    for key in SCALING_POLICY_FILES:
        assert f"alarms/cli/scaling/policy-{key}.json" in default_files
        assert f"$(policy {key})" in script


def _run_apply(tmp_path: Path, files: dict[str, str], env: dict[str, str], configured: str) -> tuple[int, str, str]:
    """Run the rendered apply.sh with an `aws` that records each call and the AWS_REGION it saw."""
    root = tmp_path / "render"
    for rel, text in files.items():
        if rel.startswith("alarms/cli/"):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "aws"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$1 $2 $3" = "configure get region" ]; then [ -n "{configured}" ] && echo "{configured}"; exit 0; fi\n'
        f'echo "$AWS_REGION $1 $2" >> "{calls}"\n'
        'case "$2" in put-scaling-policy) echo arn:policy;; esac\n'
    )
    fake.chmod(0o755)
    proc = subprocess.run(
        ["sh", str(root / "alarms/cli/apply.sh")],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stderr, calls.read_text() if calls.exists() else ""


def test_apply_script_uses_the_configured_region_or_stops(tmp_path: Path, default_files) -> None:
    """Never a region the user did not choose: AWS_REGION, AWS_DEFAULT_REGION, then the CLI's configuration;
    with none of them, exit 2 before any call (a default us-east-1 created the alarms in the wrong region)."""
    rc, err, calls = _run_apply(tmp_path / "a", default_files, {}, configured="eu-west-1")
    assert rc == 0 and calls and all(line.startswith("eu-west-1 ") for line in calls.splitlines()), calls
    assert "put-metric-alarm" in calls and "register-scalable-target" in calls
    rc, err, calls = _run_apply(tmp_path / "b", default_files, {"AWS_DEFAULT_REGION": "ap-south-1"}, configured="")
    assert rc == 0 and all(line.startswith("ap-south-1 ") for line in calls.splitlines())
    rc, err, calls = _run_apply(tmp_path / "c", default_files, {"AWS_REGION": "us-west-2"}, configured="eu-west-1")
    assert rc == 0 and all(line.startswith("us-west-2 ") for line in calls.splitlines())
    rc, err, calls = _run_apply(tmp_path / "d", default_files, {}, configured="")
    assert rc == 2 and calls == "" and "no AWS region" in err


# --- CloudFormation -----------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["default_files", "rich_files"])
def test_template_passes_cfn_lint(which: str, request: pytest.FixtureRequest) -> None:
    text = request.getfixturevalue(which)["alarms/triton-alarms.template.json"]
    # I4010 (informational) only asks for a Metadata "Context" description block; everything else counts.
    assert [str(m) for m in lint_all(text) if m.rule.id != "I4010"] == []


def test_cfn_lint_is_not_vacuous(default_files) -> None:
    template = json.loads(default_files["alarms/triton-alarms.template.json"])
    template["Resources"]["AlarmExporterHeartbeatMissing"]["Properties"]["TreatMissingData"] = "silence"
    assert lint_all(json.dumps(template)) != []


def _sub(text: str, values: dict[str, Any]) -> str:
    return re.sub(r"\$\{([A-Za-z0-9:]+)\}", lambda m: str(values[m.group(1)]), text).replace("${!", "${")


def test_template_dashboard_equals_the_standalone_dashboard() -> None:
    opts = RICH
    template = build_template(opts)
    values = {k: v["Default"] for k, v in template["Parameters"].items()}
    values |= {"AWS::Region": opts.region, "AWS::AccountId": opts.account_id, "AWS::Partition": "aws"}
    body = json.loads(_sub(template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"], values))
    standalone = json.loads(render(opts)["dashboards/triton.json"])
    assert body == standalone


def test_template_alarms_equal_the_cli_alarms(rich_files) -> None:
    template = json.loads(rich_files["alarms/triton-alarms.template.json"])
    values = {k: v["Default"] for k, v in template["Parameters"].items()}
    promql = {rel: json.loads(t) for rel, t in rich_files.items() if rel.startswith("alarms/cli/promql/promql-")}
    cli = {b["AlarmName"]: b for b in [*_alarms(rich_files).values(), *promql.values()]}
    seen = 0
    for res in template["Resources"].values():
        if res["Type"] != "AWS::CloudWatch::Alarm":
            continue
        props = {k: v for k, v in res["Properties"].items() if k not in ("AlarmActions", "OKActions")}
        resolved = json.loads(_sub(json.dumps(props), values), object_hook=lambda o: _unwrap(o, values))
        expected = {k: v for k, v in cli[resolved["AlarmName"]].items() if k not in ("AlarmActions", "OKActions")}
        assert resolved == expected
        seen += 1
    assert seen == len(cli)
    assert template["Resources"]["ScalableTarget"]["Properties"]["ResourceId"] == {
        "Fn::Sub": "service/${ClusterName}/${ServiceName}"
    }


def _unwrap(obj: dict[str, Any], values: dict[str, Any]) -> Any:
    if set(obj) == {"Fn::Sub"}:
        return obj["Fn::Sub"]
    if set(obj) == {"Ref"}:
        return values[obj["Ref"]]
    return obj


# --- LLM alarms and selections ------------------------------------------------------------------


def test_llm_alarms_use_percentiles_of_the_distribution_and_the_kv_gauge(default_files, rich_files) -> None:
    a = {rel.rsplit("alarm-", 1)[1].removesuffix(".json"): b for rel, b in _alarms(default_files).items()}
    ttft = a["llm-ttft-p95"]
    assert (ttft["MetricName"], ttft["ExtendedStatistic"], ttft["Dimensions"]) == ("TimeToFirstToken", "p95", [])
    assert "Statistic" not in ttft and ttft["Threshold"] == 2000.0  # ms, the metric's unit
    assert ttft["Period"] * ttft["EvaluationPeriods"] == 300 and ttft["ComparisonOperator"] == "GreaterThanThreshold"
    kv = a["llm-kv-cache-high"]["Metrics"][0]
    assert kv["Expression"].startswith("SELECT MAX(KvCacheUtilization) FROM SCHEMA(")
    assert "GROUP BY model" in kv["Expression"]
    assert a["llm-kv-cache-high"]["Threshold"] == 90.0
    named = json.loads(rich_files["alarms/cli/alarm-model-add-ttft-p95.json"])
    assert named["ExtendedStatistic"] == "p95" and named["Dimensions"] == [{"Name": "model", "Value": "add"}]
    # the dashboard's LLM section reads the same distributions with percentile statistics
    body = json.loads(default_files["dashboards/triton.json"])
    ttft_rows = [
        c["expression"]
        for w in body["widgets"]
        if w["type"] == "metric"
        for row in w["properties"]["metrics"]
        for c in row
        if isinstance(c, dict) and 'MetricName="TimeToFirstToken"' in c.get("expression", "")
    ]
    assert {e.rsplit("'", 2)[-2] for e in ttft_rows} == {"p50", "p95", "p99"}


def _names_in(files: dict[str, str]) -> set[str]:
    text = files["dashboards/triton.json"] + "".join(t for rel, t in files.items() if "/alarm-" in rel)
    return set(re.findall(r"[A-Z][A-Za-z0-9]+", text))


def test_a_selection_renders_only_what_is_emitted() -> None:
    """render honours --metrics: no widget, alarm or scaling on a metric the exporter leaves out."""
    catalog = CATALOG.select(
        "-TimeToFirstToken*,-InterTokenLatency*,-GenerationTokens*,-KvCache*,-*RequestsWaiting,-EndToEndLatency*,-Gpu*"
    )
    files = render(Options(catalog=catalog))
    body = json.loads(files["dashboards/triton.json"])
    _check_dashboard(body, "us-east-1")
    markdown = " ".join(w["properties"].get("markdown", "") for w in body["widgets"] if w["type"] == "text")
    assert "LLM serving" not in markdown  # the section is left out with its widgets
    refs = {name for _, name, _ in dashboard_refs(body)}
    assert refs and not refs & {"TimeToFirstToken", "KvCacheUtilization", "GpuUtilization", "GpuMemoryUsedPercent"}
    assert {"RequestSuccess", "ModelReady"} <= refs
    alarms_ = {rel.rsplit("/", 1)[1] for rel in files if "/alarm-" in rel}
    assert "alarm-llm-ttft-p95.json" not in alarms_ and "alarm-model-failures.json" in alarms_
    # Scaling stays on Triton's own signals; without GPU metrics the scale-in reads the others.
    into = json.loads(files["alarms/cli/scaling/alarm-scale-in.json"])
    assert [q["Expression"] for q in into["Metrics"] if q["ReturnData"]] == ["pending / 10.0 + queue / 100000.0"]
    assert "alarm-scale-out-llm-waiting.json" not in alarms_ and "policy-scale-out-llm-waiting.json" not in {
        rel.rsplit("/", 1)[1] for rel in files
    }
    # Without the leading signals there is no scaling at all: no alarm that would scale nothing.
    files = render(Options(catalog=CATALOG.select("-Task*,-TimeToFirstToken*,-KvCache*,-Gpu*")))
    assert not any(rel.startswith("alarms/cli/scaling/") for rel in files)
    script = files["alarms/cli/apply.sh"]
    assert "scaling/" not in script
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    template = files["alarms/triton-alarms.template.json"]
    assert "ScalableTarget" not in json.loads(template)["Resources"]
    # W2001 (unused parameter): the template keeps every parameter whatever the selection, so the stack's
    # nested-stack call (deploy/stack.yaml passes them all) works with any render.
    assert [str(m) for m in lint_all(template) if m.rule.id not in ("I4010", "W2001")] == []
    for body_ in _alarms(files).values():
        _validate(CLOUDWATCH, "PutMetricAlarm", body_)
    # ...and the full catalog renders every one of them: the selection is what removed them
    full_body = json.loads(render(Options(catalog=CATALOG))["dashboards/triton.json"])
    full = {name for _, name, _ in dashboard_refs(full_body)}
    assert {"TimeToFirstToken", "KvCacheUtilization", "GpuUtilization"} <= full


def test_render_command_takes_the_catalog_flags(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--metrics", "-TimeToFirstToken,-KvCacheUtilization"]) == 0
    assert not (tmp_path / "alarms" / "cli" / "alarm-llm-ttft-p95.json").exists()
    assert (tmp_path / "alarms" / "cli" / "alarm-model-failures.json").exists()
    assert "KvCacheUtilization" not in (tmp_path / "docs" / "metrics.md").read_text()
    assert main(["--out", str(tmp_path), "--metrics", "-NoSuchMetric"]) == 2
    assert main(["--out", str(tmp_path), "--llm-metrics", "off"]) == 0
    assert not (tmp_path / "alarms" / "cli" / "alarm-llm-kv-cache-high.json").exists()


def test_every_render_option_with_help_is_a_flag_and_reaches_the_files(tmp_path: Path) -> None:
    """The render's flags come from the Options table (options.py), so a new option cannot be left out of
    the command line: each one given a non-default value changes what is rendered."""
    from dataclasses import fields

    from render import options_table
    from render.base.options import Options as O

    flags = {o.field: o for o in options_table()}
    table = [f for f in fields(O) if "help" in f.metadata]
    assert table and all(f.name in flags for f in table)
    assert main(["--out", str(tmp_path / "a"), "--version-skew-periods", "7"]) == 0
    skew = json.loads((tmp_path / "a" / "alarms/cli/alarm-model-version-skew.json").read_text())
    assert skew["EvaluationPeriods"] == 7 == skew["DatapointsToAlarm"]
    assert main(["--out", str(tmp_path / "b"), "--version-skew-periods", "0"]) == 2


def test_modelsync_doc_is_rendered_from_the_pack(default_files) -> None:
    doc = default_files["docs/modelsync-metrics.md"]
    pack = modelsync_catalog()
    assert all(f"| `{m.name}` | {m.unit} | {m.event}: " in doc for m in pack.metrics)
    assert all(f"| `{r.value}` | " in doc for r in Result)
    assert "(modelsync-metrics.md)" in (ROOT / "docs" / "modelsync.md").read_text()


def test_the_dashboard_shows_queue_p99_per_model_the_saturation_signal() -> None:
    """Queue p99 (Triton's queue summary, 2.51+) is the standard saturation signal: one graph per model."""
    body = json.loads((ROOT / "dashboards" / "triton.json").read_text())
    found = [
        w
        for w in body["widgets"]
        if w["type"] == "metric" and any("QueueLatencyP99" in json.dumps(m) for m in w["properties"]["metrics"])
    ]
    assert len(found) == 1 and "p99 queue time per model" in found[0]["properties"]["title"]
    assert '{"Triton",model} MetricName="QueueLatencyP99"' in found[0]["properties"]["metrics"][0][0]["expression"]
