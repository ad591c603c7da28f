"""Alarms and ECS step scaling, as parameterised specs in the API's own shapes.

One spec per alarm, written once in ``PutMetricAlarm`` shape with
``${Param}`` tokens in strings and :class:`Ref` for numbers. The CLI files
resolve them to the render options; the CloudFormation template keeps them
as parameters (``AWS::CloudWatch::Alarm`` takes the same property names).

Per-model alarms: alarms cannot use SEARCH, so they are Metrics Insights
query alarms with ``GROUP BY model`` on the catalog's ``model`` rollup: each
model is its own contributor, evaluated on its own, and a model deployed
later is covered without touching the alarm. botocore's PutMetricAlarm
model accepts it (``Metrics[].Expression``, ``Period``), tests check that.
``--model NAME`` also renders classic single-metric alarms for named models
(for accounts that prefer named alarms or hit the 200 Metrics Insights
alarms per region quota).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from telemetry.emf import safe_dimension_value

from . import modelsync
from .options import Options

LATENCY_PERIOD = 60
LATENCY_POINTS = 5  # p95 above the SLO for 5 minutes
FAILURE_PERIOD = 300  # failures per model in 5 minutes
COOLDOWN = 300


@dataclass(frozen=True)
class Ref:
    """A CloudFormation parameter (numbers); strings carry ``${Name}`` tokens instead."""

    name: str


@dataclass(frozen=True)
class Param:
    type: str
    description: str
    min: float | None = None
    max: float | None = None
    allowed: tuple[str, ...] = ()


PARAMETERS: dict[str, Param] = {
    "Namespace": Param("String", "CloudWatch namespace the exporter writes (AWS_EMF_NAMESPACE); one per ECS service"),
    "AlarmNamePrefix": Param("String", "Prefix of every alarm and scaling policy name"),
    "AlarmTopicArn": Param("String", "SNS topic for alarm notifications; empty for none"),
    "ClusterName": Param("String", "ECS cluster of the Triton service"),
    "ServiceName": Param("String", "ECS service running Triton and the exporter"),
    "LogGroupPrefix": Param("String", "Fluent Bit log group prefix (TRITON_LOG_GROUP_PREFIX)"),
    "DashboardName": Param("String", "Name of the CloudWatch dashboard"),
    "CreateDashboard": Param("String", "Create the dashboard", allowed=("true", "false")),
    "EnableScaling": Param(
        "String", "Create the scalable target, scaling policies and scaling alarms", allowed=("true", "false")
    ),
    "FailureThreshold": Param("Number", "Alarm when a model has more failed requests than this in 5 minutes", 0),
    "LatencySloMicroseconds": Param("Number", "p95 latency SLO per model, microseconds", 0),
    "LoadSuccessRateThreshold": Param("Number", "Alarm when the model load success rate is below this percent", 0, 100),
    "GpuMemoryThreshold": Param("Number", "GPU memory used percent that alarms and adds a task (10 minutes)", 0, 100),
    "GpuScaleOutUtilization": Param("Number", "Service GPU utilization percent that adds a task (5 minutes)", 0, 100),
    "GpuScaleInUtilization": Param(
        "Number", "Service GPU utilization percent that removes a task (15 minutes)", 0, 100
    ),
    "TtftP95Milliseconds": Param(
        "Number", "Alarm when time to first token p95 (all tasks) stays above this, ms (5 minutes)", 0
    ),
    "KvCacheUtilizationThreshold": Param(
        "Number", "Alarm when a model's KV-cache utilization stays above this percent (5 minutes)", 0, 100
    ),
    "MinCapacity": Param("Number", "Fewest tasks scaling may leave", 0),
    "MaxCapacity": Param("Number", "Most tasks scaling may start", 1),
    "ModelSync": Param(
        "String",
        "Model sync is deployed: create its alarms (sync failures, version skew) and Contributor Insights rules",
        allowed=("true", "false"),
    ),
    "VersionSkewPeriods": Param(
        "Number",
        "Alarm when a model's tasks serve different artifacts in this many consecutive 5-minute periods",
        1,
        288,
    ),
}


def parameter_values(opts: Options) -> dict[str, Any]:
    return {
        "Namespace": opts.namespace,
        "AlarmNamePrefix": opts.alarm_prefix,
        "AlarmTopicArn": opts.sns_topic_arn,
        "ClusterName": opts.cluster,
        "ServiceName": opts.service,
        "LogGroupPrefix": opts.log_group_prefix,
        "DashboardName": opts.dashboard_name,
        "CreateDashboard": "true",
        "EnableScaling": "true",
        "FailureThreshold": opts.failure_threshold,
        "LatencySloMicroseconds": opts.latency_slo_us,
        "LoadSuccessRateThreshold": opts.load_success_rate,
        "GpuMemoryThreshold": opts.gpu_memory,
        "GpuScaleOutUtilization": opts.gpu_scale_out,
        "GpuScaleInUtilization": opts.gpu_scale_in,
        "TtftP95Milliseconds": opts.ttft_p95_ms,
        "KvCacheUtilizationThreshold": opts.kv_cache_utilization,
        "MinCapacity": opts.min_capacity,
        "MaxCapacity": opts.max_capacity,
        "ModelSync": "true",
        "VersionSkewPeriods": opts.version_skew_periods,
    }


def _check(opts: Options, name: str, dims: tuple[str, ...], pack: bool = False) -> str | None:
    """The metric name if the exporter emits it with these dimensions; None if the selection leaves it out.

    ``pack``: a metric of an optional built-in pack (LLM), absent when the pack is off.
    """
    metric = opts.catalog.definition(name)
    if metric is None and pack:
        return None
    if metric is None:
        raise KeyError(f"an alarm references {name!r}, which is not in the catalog")
    if dims not in metric.dimension_sets:
        raise KeyError(f"{name} is not emitted with dimensions {list(dims)}")
    return name if opts.catalog.emits(name) else None


Spec = dict[str, Any]


def _classic(
    opts: Options,
    suffix: str,
    description: str,
    name: str,
    dims: dict[str, str],
    stat: str,
    period: int,
    points: int,
    threshold: Ref | float,
    op: str,
    missing: str,
    actions: tuple[str, ...],
    pack: bool = False,
) -> Spec | None:
    """A single-metric alarm; ``stat`` ``pNN`` is an extended statistic (a percentile of a distribution)."""
    metric = _check(opts, name, tuple(dims), pack)
    if metric is None:
        return None
    statistic = {"ExtendedStatistic": stat} if re.fullmatch(r"p\d+(\.\d+)?", stat) else {"Statistic": stat}
    return {
        "_file": suffix,
        "_actions": actions,
        "_metric": metric,
        "AlarmName": f"${{AlarmNamePrefix}}-{suffix}",
        "AlarmDescription": description,
        "Namespace": "${Namespace}",
        "MetricName": metric,
        "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
        **statistic,
        "Period": period,
        "EvaluationPeriods": points,
        "DatapointsToAlarm": points,
        "Threshold": threshold,
        "ComparisonOperator": op,
        "TreatMissingData": missing,
    }


def _insights(
    opts: Options,
    suffix: str,
    description: str,
    func: str,
    name: str,
    period: int,
    points: int,
    threshold: Ref,
    label: str,
    pack: bool = False,
) -> Spec | None:
    metric = _check(opts, name, ("model",), pack)
    if metric is None:
        return None
    query = f'SELECT {func}({metric}) FROM SCHEMA("${{Namespace}}", model) GROUP BY model ORDER BY {func}() DESC'
    return {
        "_file": suffix,
        "_actions": ("notify",),
        "_metric": metric,
        "AlarmName": f"${{AlarmNamePrefix}}-{suffix}",
        "AlarmDescription": description,
        "Metrics": [{"Id": "q1", "Expression": query, "Period": period, "Label": label, "ReturnData": True}],
        "EvaluationPeriods": points,
        "DatapointsToAlarm": points,
        "Threshold": threshold,
        "ComparisonOperator": "GreaterThanThreshold",
        "TreatMissingData": "notBreaching",
    }


def model_slug(model: str) -> str:
    """File- and id-safe form of a model name; a hash keeps two names that clean alike apart."""
    slug = "-".join(re.findall(r"[A-Za-z0-9]+", model))[:60]
    return slug if slug == model else f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:6]}".lstrip("-")


def alarm_specs(opts: Options) -> list[Spec]:
    """Every alarm on a metric the exporter emits, fleet-wide first.

    Keys starting with ``_`` are render metadata, not API fields.
    """
    o = opts
    specs = [
        _insights(
            o,
            "model-failures",
            "A model had more failed inference requests than FailureThreshold in 5 minutes "
            "(each model is its own contributor; Metrics Insights GROUP BY model).",
            "SUM",
            "RequestFailure",
            FAILURE_PERIOD,
            1,
            Ref("FailureThreshold"),
            "failed requests",
        ),
        _insights(
            o,
            "model-latency-p95",
            "A model's p95 request latency (worst task) stayed above LatencySloMicroseconds for 5 minutes.",
            "MAX",
            "RequestLatencyP95",
            LATENCY_PERIOD,
            LATENCY_POINTS,
            Ref("LatencySloMicroseconds"),
            "p95 latency (us)",
        ),
        _classic(
            o,
            "model-load-failed",
            "A model version failed to load: load success rate below "
            "LoadSuccessRateThreshold percent on some task for 3 minutes.",
            "ModelLoadSuccessRate",
            {},
            "Minimum",
            60,
            3,
            Ref("LoadSuccessRateThreshold"),
            "LessThanThreshold",
            "notBreaching",
            ("notify",),
        ),
        _classic(
            o,
            "exporter-heartbeat-missing",
            "No exporter heartbeat for 5 minutes: the exporter, its log route "
            "or the whole service is down. Missing data is breaching: silence is a failure.",
            "ExporterHeartbeat",
            {},
            "Sum",
            60,
            5,
            1.0,
            "LessThanThreshold",
            "breaching",
            ("notify",),
        ),
        _classic(
            o,
            "gpu-memory-high",
            "GPU memory above GpuMemoryThreshold percent on some GPU for 10 minutes; "
            "also adds a task when scaling is enabled.",
            "GpuMemoryUsedPercent",
            {},
            "Maximum",
            60,
            10,
            Ref("GpuMemoryThreshold"),
            "GreaterThanThreshold",
            "notBreaching",
            ("notify", "scale_out_memory"),
        ),
        _classic(
            o,
            "gpu-utilization-high",
            "Service GPU utilization above GpuScaleOutUtilization for 5 minutes: add a task.",
            "GpuUtilization",
            {},
            "Average",
            60,
            5,
            Ref("GpuScaleOutUtilization"),
            "GreaterThanThreshold",
            "notBreaching",
            ("scale_out",),
        ),
        _classic(
            o,
            "gpu-utilization-low",
            "Service GPU utilization below GpuScaleInUtilization for 15 minutes: remove a task.",
            "GpuUtilization",
            {},
            "Average",
            60,
            15,
            Ref("GpuScaleInUtilization"),
            "LessThanThreshold",
            "notBreaching",
            ("scale_in",),
        ),
        _classic(
            o,
            "llm-ttft-p95",
            "Time to first token p95 over every task and model stayed above "
            "TtftP95Milliseconds for 5 minutes (CloudWatch's percentile of the exporter's distributions).",
            "TimeToFirstToken",
            {},
            "p95",
            LATENCY_PERIOD,
            LATENCY_POINTS,
            Ref("TtftP95Milliseconds"),
            "GreaterThanThreshold",
            "notBreaching",
            ("notify",),
        ),
        _insights(
            o,
            "llm-kv-cache-high",
            "A model's KV-cache utilization (worst task) stayed above KvCacheUtilizationThreshold percent "
            "for 5 minutes: requests will queue (Metrics Insights GROUP BY model).",
            "MAX",
            "KvCacheUtilization",
            LATENCY_PERIOD,
            LATENCY_POINTS,
            Ref("KvCacheUtilizationThreshold"),
            "KV-cache utilization (%)",
            pack=True,
        ),
    ]
    specs += modelsync.alarm_specs(opts)
    for model in opts.models:
        dim = {"model": safe_dimension_value(model).value}
        slug = model_slug(model)
        specs.append(
            _classic(
                o,
                f"model-{slug}-failures",
                f"Model {model}: failed requests above FailureThreshold in 5 minutes.",
                "RequestFailure",
                dim,
                "Sum",
                FAILURE_PERIOD,
                1,
                Ref("FailureThreshold"),
                "GreaterThanThreshold",
                "notBreaching",
                ("notify",),
            )
        )
        specs.append(
            _classic(
                o,
                f"model-{slug}-latency-p95",
                f"Model {model}: p95 latency above LatencySloMicroseconds for 5 minutes.",
                "RequestLatencyP95",
                dim,
                "Maximum",
                LATENCY_PERIOD,
                LATENCY_POINTS,
                Ref("LatencySloMicroseconds"),
                "GreaterThanThreshold",
                "notBreaching",
                ("notify",),
            )
        )
        specs.append(
            _classic(
                o,
                f"model-{slug}-ttft-p95",
                f"Model {model}: time to first token p95 (all tasks) above TtftP95Milliseconds for 5 minutes.",
                "TimeToFirstToken",
                dim,
                "p95",
                LATENCY_PERIOD,
                LATENCY_POINTS,
                Ref("TtftP95Milliseconds"),
                "GreaterThanThreshold",
                "notBreaching",
                ("notify",),
            )
        )
    return [s for s in specs if s is not None]


SCALING_ACTIONS = ("scale_out", "scale_in", "scale_out_memory")


def scaling_specs() -> dict[str, Any]:
    """The scalable target and step policies, in RegisterScalableTarget / PutScalingPolicy shapes."""
    target = {
        "ServiceNamespace": "ecs",
        "ResourceId": "service/${ClusterName}/${ServiceName}",
        "ScalableDimension": "ecs:service:DesiredCount",
        "MinCapacity": Ref("MinCapacity"),
        "MaxCapacity": Ref("MaxCapacity"),
    }

    def policy(suffix: str, aggregation: str, step: dict[str, Any]) -> dict[str, Any]:
        return {
            "PolicyName": f"${{AlarmNamePrefix}}-{suffix}",
            "ServiceNamespace": "ecs",
            "ResourceId": "service/${ClusterName}/${ServiceName}",
            "ScalableDimension": "ecs:service:DesiredCount",
            "PolicyType": "StepScaling",
            "StepScalingPolicyConfiguration": {
                "AdjustmentType": "ChangeInCapacity",
                "Cooldown": COOLDOWN,
                "MetricAggregationType": aggregation,
                "StepAdjustments": [step],
            },
        }

    # Step bounds are offsets from the alarm threshold: [0, +inf) above it, (-inf, 0] below it.
    return {
        "target": target,
        "scale_out": policy("gpu-scale-out", "Average", {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}),
        "scale_in": policy("gpu-scale-in", "Average", {"MetricIntervalUpperBound": 0, "ScalingAdjustment": -1}),
        "scale_out_memory": policy(
            "gpu-memory-scale-out", "Maximum", {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}
        ),
    }


# --- resolution to concrete values (CLI files) ----------------------------------------------------

_TOKEN = re.compile(r"\$\{([A-Za-z0-9:]+)\}")


def resolve(value: Any, values: dict[str, Any]) -> Any:
    """Replace :class:`Ref` and ``${Name}`` tokens by the render option values."""
    if isinstance(value, Ref):
        return values[value.name]
    if isinstance(value, str):
        return _TOKEN.sub(lambda m: str(values[m.group(1)]), value)
    if isinstance(value, list):
        return [resolve(v, values) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve(v, values) for v in value)
    if isinstance(value, dict):
        return {k: resolve(v, values) for k, v in value.items()}
    return value


def api_fields(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if not k.startswith("_")}


def alarm_names(opts: Options) -> list[str]:
    values = parameter_values(opts)
    return [resolve(s["AlarmName"], values) for s in alarm_specs(opts)]


def cli_alarm(spec: dict[str, Any], opts: Options) -> dict[str, Any]:
    """``aws cloudwatch put-metric-alarm --cli-input-json`` body.

    Notification actions come from ``--sns-topic-arn``; scaling policy ARNs
    exist only after ``put-scaling-policy``, so apply.sh passes them with
    ``--alarm-actions`` (command-line values override the JSON file).
    """
    body: dict[str, Any] = resolve(api_fields(spec), parameter_values(opts))
    if opts.sns_topic_arn and "notify" in spec["_actions"]:
        body["AlarmActions"] = [opts.sns_topic_arn]
        body["OKActions"] = [opts.sns_topic_arn]
    return body


def has_scaling(specs: list[Spec]) -> bool:
    """Scaling needs its three alarms: a selection without the GPU metrics renders none of it."""
    return set(SCALING_ACTIONS) <= {a for s in specs for a in s["_actions"]}


def cli_files(opts: Options) -> dict[str, str]:
    """Relative path -> file text, under ``alarms/cli``."""
    values = parameter_values(opts)
    out: dict[str, str] = {}
    specs = alarm_specs(opts)
    scaling = has_scaling(specs)
    if scaling:
        policies = scaling_specs()
        out["scaling/register-scalable-target.json"] = _dump(resolve(policies["target"], values))
        for key in SCALING_ACTIONS:
            out[f"scaling/policy-{key.replace('_', '-')}.json"] = _dump(resolve(policies[key], values))
    for rule in insight_rule_specs(opts):
        out[f"insight-rule-{rule['_file']}.json"] = _dump(resolve(api_fields(rule), values))
    for spec in specs:
        sub = "scaling/" if scaling and set(spec["_actions"]) & set(SCALING_ACTIONS) else ""
        out[f"{sub}alarm-{spec['_file']}.json"] = _dump(cli_alarm(spec, opts))
    out["apply.sh"] = _apply_script(opts, scaling)
    return out


def insight_rule_specs(opts: Options) -> list[Spec]:
    """Contributor Insights rules (PutInsightRule shape) that alarms read with INSIGHT_RULE_METRIC."""
    return modelsync.insight_rule_specs(opts)


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"


# The region as the AWS CLI itself would find it; never a default that is somebody else's region.
_REGION = [
    'region="${AWS_REGION:-${AWS_DEFAULT_REGION:-$(aws configure get region 2>/dev/null || true)}}"',
    'if [ -z "$region" ]; then',
    '  echo "apply.sh: no AWS region: set AWS_REGION, or configure one (aws configure set region REGION)" >&2',
    "  exit 2",
    "fi",
    'export AWS_REGION="$region"',
    'echo "apply.sh: region $AWS_REGION" >&2',
]


# The Contributor Insights rules first: alarms read them (INSIGHT_RULE_METRIC).
_RULES = [
    "for f in insight-rule-*.json; do",
    '  if [ -e "$f" ]; then aws cloudwatch put-insight-rule --cli-input-json "file://$f"; fi',
    "done",
]


def _apply_script(opts: Options, scaling: bool) -> str:
    topic = opts.sns_topic_arn
    region = "(region: AWS_REGION, else AWS_DEFAULT_REGION, else the AWS CLI's configured one; none: exit 2)"
    head = [
        "#!/bin/sh",
        "# Generated by `python -m exporter render`: do not edit, re-render.",
        "# Creates the alarms of docs/dashboards.md with the AWS CLI (this selection of metrics has no GPU scaling).",
        "# Usage: alarms/cli/apply.sh   " + region,
        "set -eu",
        'cd "$(dirname "$0")"',
        *_REGION,
        *_RULES,
        "for f in alarm-*.json; do",
        '  aws cloudwatch put-metric-alarm --cli-input-json "file://$f"',
        "done",
    ]
    if not scaling:
        return "\n".join(head) + "\n"
    lines = [
        "#!/bin/sh",
        "# Generated by `python -m exporter render`: do not edit, re-render.",
        "# Creates the alarms and the ECS step scaling of docs/dashboards.md with the AWS CLI.",
        "# Usage: alarms/cli/apply.sh [--no-scaling]   " + region,
        "set -eu",
        'cd "$(dirname "$0")"',
        *_REGION,
        *_RULES,
        "for f in alarm-*.json; do",
        '  aws cloudwatch put-metric-alarm --cli-input-json "file://$f"',
        "done",
        'if [ "${1:-}" = "--no-scaling" ]; then',
        "  aws cloudwatch put-metric-alarm --cli-input-json file://scaling/alarm-gpu-memory-high.json",
        "  exit 0",
        "fi",
        "aws application-autoscaling register-scalable-target --cli-input-json "
        "file://scaling/register-scalable-target.json",
        "policy() {",
        '  aws application-autoscaling put-scaling-policy --cli-input-json "file://scaling/policy-$1.json" '
        "--query PolicyARN --output text",
        "}",
        "OUT=$(policy scale-out)",
        "IN=$(policy scale-in)",
        "MEM=$(policy scale-out-memory)",
        "aws cloudwatch put-metric-alarm --cli-input-json file://scaling/alarm-gpu-utilization-high.json "
        '--alarm-actions "$OUT"',
        "aws cloudwatch put-metric-alarm --cli-input-json file://scaling/alarm-gpu-utilization-low.json "
        '--alarm-actions "$IN"',
        "aws cloudwatch put-metric-alarm --cli-input-json file://scaling/alarm-gpu-memory-high.json "
        + (f'--alarm-actions "{topic}" "$MEM"' if topic else '--alarm-actions "$MEM"'),
    ]
    return "\n".join(lines) + "\n"
