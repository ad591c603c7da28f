"""The parameters of the rendered alarms, scaling and dashboard, and their resolution to values.

Specs are written once with ``${Param}`` tokens in strings and :class:`Ref`
for numbers. The CLI files resolve them to the render options
(:func:`resolve`); the CloudFormation template keeps them as parameters and
Terraform as variables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .options import Options


@dataclass(frozen=True)
class Ref:
    """A CloudFormation parameter (numbers); strings carry ``${Name}`` tokens instead."""

    name: str


@dataclass(frozen=True)
class RefPlus:
    """A number parameter plus a number the render derives (``TaskStartSeconds`` + the alarm's sight).

    CloudFormation has no addition: the template selects the sum from a list (render/template.py); Terraform and
    the CLI files add.
    """

    name: str
    plus: int


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
    "GpuMemoryThreshold": Param("Number", "Alarm when GPU memory used stays above this percent (10 minutes)", 0, 100),
    # Scaling (docs/scaling.md): out on the leading signals within about 30 s, in on every signal low for 15 minutes.
    "PendingRequestsScaleOut": Param(
        "Number",
        "Requests waiting in Triton's queue per task (every model; the service's average) that add a task when held "
        "for 30 s (the backstop: the excess policy adds in proportion)",
        1,
    ),
    "QueueTimeScaleOutMicroseconds": Param(
        "Number",
        "Triton queue time (each task's worst model over 10 s; the service's average) that adds a task when held for "
        "30 s (the backstop: the excess policy adds in proportion); microseconds",
        1,
    ),
    "RequestsWaitingScaleOut": Param(
        "Number",
        "TensorRT-LLM requests waiting per task (every model; the service's average) that add a task when held for "
        "30 s (the backstop: the excess policy adds in proportion)",
        1,
    ),
    "GpuScaleInUtilization": Param(
        "Number",
        "Service GPU utilization percent that, with pending requests and queue time low, lets scaling remove a task "
        "after 15 minutes",
        1,
        100,
    ),
    "TaskStartSeconds": Param(
        "Number",
        "Seconds from a scale-out until its new tasks serve (image pull, model load; whole seconds): the scale-out "
        "cooldown is this plus the time the scale-out alarm takes to see them, so tasks still starting count as "
        "capacity and only a larger excess adds more",
        0,
        3600,
    ),
    "ScaleInCooldown": Param("Number", "Seconds between two scale-ins, and after a scale-out before one", 60, 86400),
    "TtftP95Milliseconds": Param(
        "Number", "Alarm when time to first token p95 (all tasks) stays above this, ms (5 minutes)", 0
    ),
    "KvCacheUtilizationThreshold": Param(
        "Number", "Alarm when a model's KV-cache utilization stays above this percent (5 minutes)", 0, 100
    ),
    "MinCapacity": Param(
        "Number",
        "Fewest tasks scaling may leave; at least 1: with no task nothing emits the scaling signals, so the service "
        "would never scale out again",
        1,
    ),
    "MaxCapacity": Param("Number", "Most tasks scaling may start", 1),
    "ModelSync": Param(
        "String",
        "Model sync is deployed: create its alarms (sync failures, version skew) and Contributor Insights rules",
        allowed=("true", "false"),
    ),
    "OtlpMetrics": Param(
        "String",
        "The exporter sends OTLP metrics to CloudWatch (docs/otlp.md): create the PromQL alarms",
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
        "PendingRequestsScaleOut": opts.pending_scale_out,
        "QueueTimeScaleOutMicroseconds": opts.queue_time_scale_out_us,
        "RequestsWaitingScaleOut": opts.requests_waiting_scale_out,
        "GpuScaleInUtilization": opts.gpu_scale_in,
        "TaskStartSeconds": opts.task_start_seconds,
        "ScaleInCooldown": opts.scale_in_cooldown,
        "TtftP95Milliseconds": opts.ttft_p95_ms,
        "KvCacheUtilizationThreshold": opts.kv_cache_utilization,
        "MinCapacity": opts.min_capacity,
        "MaxCapacity": opts.max_capacity,
        "ModelSync": "true",
        "VersionSkewPeriods": opts.version_skew_periods,
        "OtlpMetrics": "false",  # the template's default; the CLI files put the PromQL alarms under promql/
    }


# --- resolution to concrete values (CLI files) ----------------------------------------------------

_TOKEN = re.compile(r"\$\{([A-Za-z0-9:]+)\}")


def resolve(value: Any, values: dict[str, Any]) -> Any:
    """Replace :class:`Ref` and ``${Name}`` tokens by the render option values."""
    if isinstance(value, Ref):
        return values[value.name]
    if isinstance(value, RefPlus):
        return values[value.name] + value.plus
    if isinstance(value, str):
        return _TOKEN.sub(lambda m: str(values[m.group(1)]), value)
    if isinstance(value, list):
        return [resolve(v, values) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve(v, values) for v in value)
    if isinstance(value, dict):
        return {k: resolve(v, values) for k, v in value.items()}
    return value
