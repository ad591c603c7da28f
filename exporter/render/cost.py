"""``python -m exporter cost``: custom metrics, alarms and monthly list price of a deployment.

Counted from the catalog, not guessed: every dimension set of every metric
the deployment emits is a billed metric per distinct set of values (the
empty set is one metric across all tasks). EMF log bytes come from encoding
representative events with the exporter's own Encoder.
tests/test_cost.py checks the count against the distinct metrics the real
pipeline emits for the same deployment.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from .. import __version__
from ..catalog import CATALOG, Kind, Metric, Scope
from ..emf import Encoder, Event
from .alarms import alarm_specs
from .options import Options

HOURS_PER_MONTH = 730  # AWS's billing month
# us-east-1 list prices
METRIC_TIERS = ((10_000, 0.30), (240_000, 0.10), (750_000, 0.05), (float("inf"), 0.02))  # per metric-month
ALARM_METRIC_MONTH = 0.10  # standard resolution, per alarm metric (a Metrics Insights alarm: per metric analyzed)
LOG_INGESTION_PER_GB = 0.50
DASHBOARD_MONTH = 3.00  # the account's first 3 dashboards are free
PUTLOGEVENTS_OVERHEAD = 26  # bytes per event, as CloudWatch Logs counts a batch
SOURCES = ("triton_metrics", "triton_index", "ecs_metadata")

TASK_ARN = "arn:aws:ecs:us-east-1:123456789012:task/triton/0123456789abcdef0123456789abcdef"
COMMON = {"exporter_version": __version__, "ecs_cluster": "arn:aws:ecs:us-east-1:123456789012:cluster/triton",
          "ecs_task_arn": TASK_ARN, "ecs_task_family": "triton", "ecs_task_revision": "12",
          "availability_zone": "us-east-1a", "ecs_launch_type": "EC2", "ecs_service": "triton"}


@dataclass(frozen=True)
class Deployment:
    models: int
    versions: int = 1
    gpus: int = 1  # per task; the gpu dimension is the index, so tasks share these metrics
    tasks: int = 1
    nvml: bool = True  # NVML source on (EXPORTER_NVML=on in deploy/)
    summaries: bool = True  # --metrics-config summary_latencies=true (deploy/ sets it)
    histograms: bool = False  # --metrics-config histogram_latencies=true
    load_duration: bool = True  # nv_model_load_duration_secs, Triton 24.11+
    ecs_metadata: bool = True
    interval: float = 60.0
    model_name_length: int = 16


def emitted_metrics(d: Deployment) -> list[Metric]:
    out = []
    for m in CATALOG:
        if m.scope is Scope.GPU and (d.gpus == 0 or (m.source == "nvml" and not d.nvml)):
            continue
        if m.kind is Kind.QUANTILE and not d.summaries:
            continue
        if m.kind is Kind.HISTOGRAM_QUANTILE and not d.histograms:
            continue
        if m.name == "ModelLoadDuration" and not d.load_duration:
            continue
        out.append(m)
    return out


def sources(d: Deployment) -> int:
    return 2 + d.ecs_metadata + (d.nvml and d.gpus > 0)


def values_of(dims: tuple[str, ...], d: Deployment) -> int:
    """Distinct value combinations one dimension set takes."""
    sizes = {"model": d.models, "version": d.versions, "gpu": d.gpus, "source": sources(d)}
    n = 1
    for name in dims:
        n *= sizes[name]
    return n


def metric_count(d: Deployment) -> int:
    return sum(values_of(dims, d) for m in emitted_metrics(d) for dims in m.dimension_sets)


def metric_cost(count: int) -> float:
    total, left = 0.0, count
    for size, price in METRIC_TIERS:
        take = min(left, size)
        total += take * price
        left -= take
        if left <= 0:
            break
    return total


_VALUE_BY_KIND = {  # shapes of real values: rates and ratios print with many digits
    Kind.RATE: 16.666666666666668, Kind.RATIO: 2222.222222222222, Kind.GAUGE_RATIO: 25.0,
    Kind.QUANTILE: 1900.0, Kind.HISTOGRAM_QUANTILE: 412.5, Kind.DELTA: 540.0, Kind.GAUGE: 55.0,
    Kind.STATE: 1.0, Kind.SELF: 3.2518,
}


def event_bytes(d: Deployment, namespace: str = "Triton") -> dict[Scope, int]:
    """Encoded size of one representative event per scope, with the exporter's own Encoder."""
    metrics = emitted_metrics(d)
    enc = Encoder(namespace, CATALOG)
    name = ("m" * d.model_name_length)[: d.model_name_length]
    shapes: dict[Scope, tuple[dict[str, str], dict[str, object]]] = {
        Scope.MODEL: ({"model": name, "version": "1"},
                      ({"ecs_task_arn": TASK_ARN} if d.ecs_metadata else {}) | {"state": "READY"}),
        Scope.GPU: ({"gpu": "0"}, {**COMMON, "gpu_uuid": "GPU-00000000-1111-2222-3333-444455550000",
                                   "gpu_name": "NVIDIA A10G"}),
        Scope.TASK: ({}, dict(COMMON)),
        Scope.SOURCE: ({"source": "triton_metrics"}, dict(COMMON)),
    }
    out: dict[Scope, int] = {}
    for scope, (dims, props) in shapes.items():
        values = {m.name: _VALUE_BY_KIND[m.kind] for m in metrics if m.scope is scope}
        if values:
            docs = enc.encode(Event(scope, dims, values, props), 1_700_000_000_000)
            out[scope] = sum(len(doc) + PUTLOGEVENTS_OVERHEAD for doc in docs)
    return out


@dataclass(frozen=True)
class Estimate:
    deployment: Deployment
    metrics: int
    alarms: int
    alarm_metrics: int
    bytes_per_cycle: int  # all tasks
    gb_per_month: float
    metrics_usd: float
    alarms_usd: float
    logs_usd: float
    dashboard_usd: float

    @property
    def total_usd(self) -> float:
        return self.metrics_usd + self.alarms_usd + self.logs_usd + self.dashboard_usd


def estimate(d: Deployment, opts: Options | None = None) -> Estimate:
    opts = opts or Options()
    specs = alarm_specs(opts)
    insights = sum(1 for s in specs if "Metrics" in s)
    alarm_metrics = (len(specs) - insights) + insights * d.models  # GROUP BY model: one metric per model
    sizes = event_bytes(d, opts.namespace)
    per_task = (d.models * d.versions * sizes.get(Scope.MODEL, 0) + d.gpus * sizes.get(Scope.GPU, 0)
                + sizes[Scope.TASK] + sources(d) * sizes[Scope.SOURCE])
    per_cycle = per_task * d.tasks
    gb = per_cycle * HOURS_PER_MONTH * 3600 / d.interval / 1e9
    count = metric_count(d)
    return Estimate(d, count, len(specs), alarm_metrics, per_cycle, gb, metric_cost(count),
                    alarm_metrics * ALARM_METRIC_MONTH, gb * LOG_INGESTION_PER_GB, DASHBOARD_MONTH)


ASSUMPTIONS = (
    "us-east-1 list prices: custom metrics $0.30/metric-month for the first 10,000 (then $0.10, $0.05, $0.02), "
    "alarms $0.10 per standard-resolution alarm metric (a Metrics Insights GROUP BY model alarm is billed per "
    "metric it analyzes: one per model), log ingestion $0.50/GB, dashboards $3/month beyond the account's "
    "first 3; a 730-hour month; no free tier.",
    "Every metric reports all month. Model metrics exist per model x version; the gpu dimension is the GPU "
    "index, so tasks share GPU metrics; the empty dimension set is one metric across all tasks.",
    "Triton runs with summary_latencies (deploy/ sets it), not histogram_latencies, and is 24.11+ "
    "(ModelLoadDuration); NVML is on with every field supported (an upper bound: boards without HBM or ECC "
    "emit fewer).",
    "EMF bytes: one event per model version, GPU, source and task per interval, as the exporter's Encoder "
    "writes them with ECS metadata properties and 16-character model names, plus 26 bytes per event.",
    "Not included: log storage after ingestion, Logs Insights queries of the dashboard ($0.005/GB scanned), "
    "GetMetricData calls, the other log groups (Triton's own logs), data transfer.",
)


def markdown_table(rows: Sequence[tuple[str, Deployment]]) -> str:
    lines = ["| Deployment | Custom metrics | Alarms (alarm metrics) | EMF GB/month | Metrics | Alarms | "
             "EMF ingestion | Dashboard | Total/month |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, d in rows:
        e = estimate(d)
        lines.append(f"| {label} | {e.metrics:,} | {e.alarms} ({e.alarm_metrics:,}) | {e.gb_per_month:.2f} | "
                     f"${e.metrics_usd:,.2f} | ${e.alarms_usd:,.2f} | ${e.logs_usd:,.2f} | ${e.dashboard_usd:,.2f} | "
                     f"${e.total_usd:,.2f} |")
    return "\n".join(lines) + "\n"


DOC_ROWS = (
    ("small: 5 models, 1 version, 1 GPU, 2 tasks", Deployment(models=5, versions=1, gpus=1, tasks=2)),
    ("large: 200 models, 1 version, 8 GPUs, 4 tasks", Deployment(models=200, versions=1, gpus=8, tasks=4)),
)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter cost",
                                description="Custom metrics, alarms and monthly list price the defaults create.")
    p.add_argument("--models", type=int, help="models loaded (required unless --markdown)")
    p.add_argument("--versions", type=int, default=1, help="loaded versions per model (default: 1)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs per task (default: 1)")
    p.add_argument("--tasks", type=int, default=1, help="tasks of the service (default: 1)")
    p.add_argument("--interval", type=float, default=60.0, help="exporter interval, seconds (default: 60)")
    p.add_argument("--no-nvml", action="store_true", help="NVML source off (EXPORTER_NVML=off)")
    p.add_argument("--no-summaries", action="store_true", help="Triton without summary_latencies")
    p.add_argument("--histograms", action="store_true", help="Triton with histogram_latencies")
    p.add_argument("--markdown", action="store_true", help="print the docs table for the small and large cases")
    args = p.parse_args(list(argv))
    if args.markdown:
        sys.stdout.write(markdown_table(DOC_ROWS))
        return 0
    if args.models is None:
        p.error("--models is required")
    if args.models < 0 or args.versions < 1 or args.gpus < 0 or args.tasks < 1 or args.interval <= 0:
        sys.stderr.write("error: need --models >= 0, --versions >= 1, --gpus >= 0, --tasks >= 1, --interval > 0\n")
        return 2
    d = Deployment(models=args.models, versions=args.versions, gpus=args.gpus, tasks=args.tasks,
                   nvml=not args.no_nvml, summaries=not args.no_summaries, histograms=args.histograms,
                   interval=args.interval)
    e = estimate(d)
    w = sys.stdout.write
    w(f"deployment: {d.models} models x {d.versions} versions, {d.gpus} GPUs/task, {d.tasks} tasks, "
      f"interval {d.interval:g}s\n")
    w(f"custom metrics:        {e.metrics:>10,}   ${e.metrics_usd:>10,.2f}/month\n")
    w(f"alarms:                {e.alarms:>10,}   ${e.alarms_usd:>10,.2f}/month ({e.alarm_metrics:,} alarm metrics)\n")
    w(f"EMF log ingestion:     {e.gb_per_month:>10.2f} GB ${e.logs_usd:>7,.2f}/month "
      f"({e.bytes_per_cycle:,} bytes per interval)\n")
    w(f"dashboard:             {1:>10}   ${e.dashboard_usd:>10,.2f}/month\n")
    w(f"total:                              ${e.total_usd:>10,.2f}/month\n\nAssumptions:\n")
    for a in ASSUMPTIONS:
        w(f"- {a}\n")
    return 0
