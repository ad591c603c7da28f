"""The exporter's alarms, as a table: fleet-wide ones first, then the named per-model ones.

Per-model alarms: alarms cannot use SEARCH, so they are Metrics Insights
query alarms with ``GROUP BY model`` on the catalog's ``model`` rollup
(:class:`ModelAlarm`). botocore's PutMetricAlarm model accepts it
(``Metrics[].Expression``, ``Period``), tests check that. ``--model NAME``
also renders classic single-metric alarms for named models
(:data:`PER_MODEL`; for accounts that prefer named alarms or hit the 200
Metrics Insights alarms per region quota).

To add an alarm, add a row to :data:`ALARMS`.
"""

from __future__ import annotations

from dataclasses import replace

from telemetry.emf import safe_dimension_value

from ..base.options import Options
from ..base.params import Ref
from .scaling import SCALING_ALARMS
from .spec import MetricAlarm, ModelAlarm, Spec, model_slug

LATENCY_PERIOD = 60
LATENCY_POINTS = 5  # p95 above the SLO for 5 minutes
FAILURE_PERIOD = 300  # failures per model in 5 minutes

ALARMS: tuple[MetricAlarm | ModelAlarm, ...] = (
    ModelAlarm(
        suffix="model-failures",
        description="A model had more failed inference requests than FailureThreshold in 5 minutes "
        "(each model is its own contributor; Metrics Insights GROUP BY model).",
        func="SUM",
        metric="RequestFailure",
        period=FAILURE_PERIOD,
        points=1,
        threshold=Ref("FailureThreshold"),
        label="failed requests",
    ),
    ModelAlarm(
        suffix="model-latency-p95",
        description="A model's p95 request latency (worst task) stayed above LatencySloMicroseconds for 5 minutes.",
        func="MAX",
        metric="RequestLatencyP95",
        period=LATENCY_PERIOD,
        points=LATENCY_POINTS,
        threshold=Ref("LatencySloMicroseconds"),
        label="p95 latency (us)",
    ),
    MetricAlarm(
        suffix="model-load-failed",
        description="A model version failed to load: load success rate below "
        "LoadSuccessRateThreshold percent on some task for 3 minutes.",
        metric="ModelLoadSuccessRate",
        stat="Minimum",
        period=60,
        points=3,
        threshold=Ref("LoadSuccessRateThreshold"),
        comparison="LessThanThreshold",
    ),
    MetricAlarm(
        suffix="exporter-heartbeat-missing",
        description="No exporter heartbeat for 5 minutes: the exporter, its log route "
        "or the whole service is down. Missing data is breaching: silence is a failure.",
        metric="ExporterHeartbeat",
        stat="Sum",
        period=60,
        points=5,
        threshold=1.0,
        comparison="LessThanThreshold",
        missing="breaching",
    ),
    MetricAlarm(
        suffix="gpu-memory-high",
        description="GPU memory above GpuMemoryThreshold percent on some GPU for 10 minutes. Notifies only: a new "
        "task does not free a GPU's memory, and vLLM and TensorRT-LLM reserve most of it up front.",
        metric="GpuMemoryUsedPercent",
        stat="Maximum",
        period=60,
        points=10,
        threshold=Ref("GpuMemoryThreshold"),
    ),
    MetricAlarm(
        suffix="gpu-unhealthy",
        description="A GPU of some task is unhealthy (GpuHealthy minimum below 1): a fatal XID, a driver recovery "
        "action, a lost GPU or a failed row remap. With GpuFaultAction=drain the exporter has taken the instance "
        "out of service; with report, drain or replace it (docs/gpu.md).",
        metric="GpuHealthy",
        stat="Minimum",
        period=60,
        points=1,
        threshold=1.0,
        comparison="LessThanThreshold",
    ),
    MetricAlarm(
        suffix="llm-ttft-p95",
        description="Time to first token p95 over every task and streaming model (vLLM, or decoupled as its "
        "configuration says) stayed above TtftP95Milliseconds for 5 minutes (CloudWatch's percentile of the "
        "exporter's distributions).",
        metric="TimeToFirstToken",
        stat="p95",
        period=LATENCY_PERIOD,
        points=LATENCY_POINTS,
        threshold=Ref("TtftP95Milliseconds"),
    ),
    ModelAlarm(
        suffix="llm-kv-cache-high",
        description="A model's KV-cache utilization (worst task) stayed above KvCacheUtilizationThreshold percent "
        "for 5 minutes: requests will queue (Metrics Insights GROUP BY model).",
        func="MAX",
        metric="KvCacheUtilization",
        period=LATENCY_PERIOD,
        points=LATENCY_POINTS,
        threshold=Ref("KvCacheUtilizationThreshold"),
        label="KV-cache utilization (%)",
        optional=True,
    ),
)

# Named per-model alarms (``--model NAME``): ``{model}`` in suffix and description is the name (the slug in
# the suffix), and the alarm reads the metric's ``model`` dimension.
PER_MODEL: tuple[MetricAlarm, ...] = (
    MetricAlarm(
        suffix="model-{model}-failures",
        description="Model {model}: failed requests above FailureThreshold in 5 minutes.",
        metric="RequestFailure",
        stat="Sum",
        period=FAILURE_PERIOD,
        points=1,
        threshold=Ref("FailureThreshold"),
    ),
    MetricAlarm(
        suffix="model-{model}-latency-p95",
        description="Model {model}: p95 latency above LatencySloMicroseconds for 5 minutes.",
        metric="RequestLatencyP95",
        stat="Maximum",
        period=LATENCY_PERIOD,
        points=LATENCY_POINTS,
        threshold=Ref("LatencySloMicroseconds"),
    ),
    MetricAlarm(
        suffix="model-{model}-ttft-p95",
        description="Model {model}: time to first token p95 (all tasks) above TtftP95Milliseconds for 5 minutes.",
        metric="TimeToFirstToken",
        stat="p95",
        period=LATENCY_PERIOD,
        points=LATENCY_POINTS,
        threshold=Ref("TtftP95Milliseconds"),
    ),
)


def for_model(alarm: MetricAlarm, model: str) -> MetricAlarm:
    return replace(
        alarm,
        suffix=alarm.suffix.format(model=model_slug(model)),
        description=alarm.description.format(model=model),
        dimensions=(("model", safe_dimension_value(model).value),),
    )


def fleet_specs(opts: Options) -> list[Spec | None]:
    """The fleet-wide alarms, then the scaling ones (:mod:`.scaling`)."""
    return [a.spec(opts.catalog) for a in (*ALARMS, *SCALING_ALARMS)]


def model_specs(opts: Options) -> list[Spec | None]:
    return [for_model(a, model).spec(opts.catalog) for model in opts.models for a in PER_MODEL]
