"""Render settings: one dataclass shared by the dashboard, alarm and docs generators.

Defaults match deploy/ (namespace ``Triton``, log prefix ``/ecs/triton``) so the
committed files work for the reference deployment; every value is a flag. The
catalog (with its ``--metrics`` selection) comes with them: a widget or an
alarm is rendered only for metrics the exporter emits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from catalog import Catalog, modelsync_catalog

LOG_PARTS = re.compile(r"[A-Za-z0-9_-]+")
MAX_LOG_GROUPS_PER_QUERY = 50  # Logs Insights: at most 50 log groups in one query


def _opt(default: Any, help: str, flag: str = "", metavar: str = "", shown: str | None = None) -> Any:
    """A field that is also a ``render`` flag (``--<name>`` unless ``flag`` says otherwise); its help ends with
    ``(default: ...)``, the default itself unless ``shown`` says otherwise (render.options_table); ``metavar``:
    the placeholder the help shows (SECONDS, PERCENT, N...)."""
    return field(default=default, metadata={"help": help, "flag": flag, "metavar": metavar, "shown": shown})


@dataclass(frozen=True)
class Options:
    namespace: str = _opt("Triton", "CloudWatch namespace", metavar="NAMESPACE")
    region: str = _opt("us-east-1", "region of the dashboard widgets", metavar="REGION")
    account_id: str = _opt(  # only for alarm ARNs in the standalone dashboard JSON
        "123456789012",
        "account of the alarm ARNs in dashboards/triton.json (the default is a placeholder; the CloudFormation "
        "template fills in its own account)",
        metavar="ID",
    )
    partition: str = "aws"
    cluster: str = _opt("triton", "ECS cluster name", metavar="NAME")
    service: str = _opt("triton", "ECS service name", metavar="NAME")
    alarm_prefix: str = _opt("triton", "alarm name prefix", metavar="PREFIX")
    dashboard_name: str = _opt("Triton", "CloudWatch dashboard name", metavar="NAME")
    sns_topic_arn: str = _opt("", "SNS topic for notifications", metavar="ARN", shown="none")
    log_group_prefix: str = _opt("/ecs/triton", "Fluent Bit log group prefix", metavar="PREFIX")
    # optional: named per-model alarms and per-model log groups
    models: tuple[str, ...] = _opt(
        (),
        "also render named alarms and a per-model log widget for this model (repeatable)",
        flag="--model",
        metavar="NAME",
        shown="none",
    )
    failure_threshold: float = _opt(5.0, "failed requests per model in 5 minutes", metavar="N")
    latency_slo_ms: float = _opt(500.0, "p95 latency SLO per model in ms", metavar="MS")
    pending_scale_out: float = _opt(10.0, "requests queued per task that add a task when held 30 s", metavar="N")
    queue_time_scale_out_ms: float = _opt(
        100.0, "queue time (each task's worst model, ms) that adds a task when held 30 s", metavar="MS"
    )
    requests_waiting_scale_out: float = _opt(
        4.0, "TensorRT-LLM requests waiting per task that add a task when held 30 s", metavar="N"
    )
    gpu_scale_in: float = _opt(
        40.0, "GPU utilization % under which, every other signal low for 15 min, a task is removed", metavar="PERCENT"
    )
    task_start_seconds: int = _opt(
        600,
        "seconds from a scale-out until its new tasks serve; the scale-out cooldown adds the time the alarm takes to "
        "see them, so tasks still starting count as capacity (the default is the stack's health-check grace)",
        metavar="SECONDS",
    )
    scale_in_cooldown: int = _opt(600, "seconds between scale-ins, and after a scale-out", metavar="SECONDS")
    gpu_memory: float = _opt(95.0, "GPU memory used % that alarms after 10 min", metavar="PERCENT")
    load_success_rate: float = _opt(100.0, "alarm below this model load success %", metavar="PERCENT")
    ttft_p95_ms: float = _opt(2000.0, "time to first token p95 alarm, ms", metavar="MS")
    kv_cache_utilization: float = _opt(90.0, "KV-cache utilization % alarm per model", metavar="PERCENT")
    min_capacity: int = _opt(
        1, "fewest tasks scaling leaves the service (MinCapacity), at least 1: no task, no signal", metavar="N"
    )
    max_capacity: int = _opt(4, "most tasks scaling gives the service (MaxCapacity)", metavar="N")
    version_skew_periods: int = _opt(
        3, "5-minute periods in which a model's tasks serve different artifacts before the alarm", metavar="N"
    )
    # What the exporter emits (definitions and --metrics selection): only those metrics are drawn and alarmed on.
    catalog: Catalog = field(kw_only=True, compare=False)
    # What model sync emits (its own pack): its dashboard section, alarms and docs table read it.
    modelsync: Catalog = field(default_factory=modelsync_catalog, kw_only=True, compare=False)

    @property
    def latency_slo_us(self) -> float:
        return self.latency_slo_ms * 1000.0

    @property
    def queue_time_scale_out_us(self) -> float:
        return self.queue_time_scale_out_ms * 1000.0


def modelsync_log_group(opts: Options) -> str:
    """Where the modelsync daemon's stdout (EMF and nothing else) lands: deploy/stack.yaml's awslogs group."""
    return f"{opts.log_group_prefix}/modelsync"


def model_log_group(prefix: str, model: str) -> str:
    """The log group Fluent Bit writes a model's records to (fluentbit/triton.conf, rule 9).

    The name is split on runs of characters outside ``[A-Za-z0-9_-]`` and the
    parts joined with ``.``; more than 4 parts, none, or over 200 characters
    go to the server group (docs/logs.md).
    """
    parts = LOG_PARTS.findall(model)
    if not 1 <= len(model) <= 200 or "\n" in model or not 1 <= len(parts) <= 4:
        return f"{prefix}/server"
    return f"{prefix}/model/{'.'.join(parts)}"
