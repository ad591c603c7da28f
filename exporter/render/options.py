"""Render settings: one dataclass shared by the dashboard, alarm and docs generators.

Defaults match deploy/ (namespace ``Triton``, log prefix ``/ecs/triton``) so the
committed files work for the reference deployment; every value is a flag. The
catalog (with its ``--metrics`` selection) comes with them: a widget or an
alarm is rendered only for metrics the exporter emits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..catalog import Catalog

LOG_PARTS = re.compile(r"[A-Za-z0-9_-]+")
MAX_LOG_GROUPS_PER_QUERY = 50  # Logs Insights: at most 50 log groups in one query


@dataclass(frozen=True)
class Options:
    namespace: str = "Triton"
    region: str = "us-east-1"
    account_id: str = "123456789012"  # only for alarm ARNs in the standalone dashboard JSON
    partition: str = "aws"
    cluster: str = "triton"
    service: str = "triton"
    alarm_prefix: str = "triton"
    dashboard_name: str = "Triton"
    sns_topic_arn: str = ""
    log_group_prefix: str = "/ecs/triton"
    models: tuple[str, ...] = ()  # optional: named per-model alarms and per-model log groups
    failure_threshold: float = 5.0  # failed requests per model in 5 minutes
    latency_slo_ms: float = 500.0  # p95 per model
    gpu_scale_out: float = 85.0
    gpu_scale_in: float = 40.0
    gpu_memory: float = 95.0
    load_success_rate: float = 100.0
    ttft_p95_ms: float = 2000.0  # time to first token p95, service-wide and per named model
    kv_cache_utilization: float = 90.0  # KV-cache blocks in use, percent, per model
    min_capacity: int = 1
    max_capacity: int = 4
    version_skew_periods: int = 3  # 5-minute periods in which a model's tasks serve different artifacts
    # What the exporter emits (definitions and --metrics selection): only those metrics are drawn and alarmed on.
    catalog: Catalog = field(kw_only=True, compare=False)

    @property
    def latency_slo_us(self) -> float:
        return self.latency_slo_ms * 1000.0

    def alarm_name(self, suffix: str) -> str:
        return f"{self.alarm_prefix}-{suffix}"


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
