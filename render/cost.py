"""``python -m render cost``: custom metrics, alarms and monthly list price of a deployment.

Counted from the catalog (with the same ``--catalog``/``--metrics``
selection the sidecar runs with), not guessed: every dimension set of every
metric the deployment emits is a billed metric per distinct set of values
(the empty set is one metric across all tasks). Whether a metric exists in a
deployment follows from its families' ``requires`` (a Triton flag, an LLM
backend) and source. EMF log bytes come from encoding representative events
with the exporter's own Encoder. Where model sync is in use (the default, as
the shipped deploy and the rendered alarms assume; ``--no-modelsync``), its
pack of the catalog adds the metrics it writes every reconcile and the bytes
of those events. tests/unit/render/test_cost.py checks the count against
the distinct metrics the real pipeline emits for the same deployment.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric as OtlpMetric
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from catalog import Catalog, CatalogError, Kind, Metric, Scope, cli
from catalog import genai as semconv
from catalog.otlp import DECOUPLED, SCOPE_NAME, SEMCONVS, plan
from telemetry import DISTRIBUTION, distribution_version
from telemetry.emf import Encoder, Event
from telemetry.otlp.metrics import HistogramPoint, MetricsEncoder
from telemetry.otlp.resource import ecs_resource
from telemetry.settings import ArgumentParser, ConfigError, Option, add_options, choice, fail, integer, parse, positive

from .alarms import Spec, alarm_specs, insight_rule_specs
from .alarms.modelsync import CONDITION, SKEW_PERIOD
from .base.options import Options

HOURS_PER_MONTH = 730  # AWS's billing month
# us-east-1 list prices
METRIC_TIERS = ((10_000, 0.30), (240_000, 0.10), (750_000, 0.05), (float("inf"), 0.02))  # per metric-month
ALARM_METRIC_MONTH = 0.10  # standard resolution, per alarm metric (a Metrics Insights alarm: per metric analyzed)
HIGH_RES_ALARM_METRIC_MONTH = 0.30  # a 10 or 30-second period, per alarm metric (3x standard)
# A high-resolution custom metric is billed as a standard one (CloudWatch prices metrics, not their resolution;
# PutMetricData calls are what a faster cadence multiplies, and EMF has none: its cost is the log bytes below).
LOG_INGESTION_PER_GB = 0.50
DASHBOARD_MONTH = 3.00  # the account's first 3 dashboards are free
INSIGHT_RULE_MONTH = 0.50  # per Contributor Insights rule
INSIGHT_EVENTS_PER_MILLION = 0.02  # log events a rule matches
PUTLOGEVENTS_OVERHEAD = 26  # bytes per event, as CloudWatch Logs counts a batch
LLM_BACKENDS = ("vllm", "tensorrt_llm")  # family `requires` values that mark an LLM backend's families

TASK_ARN = "arn:aws:ecs:us-east-1:123456789012:task/triton/0123456789abcdef0123456789abcdef"
COMMON = {
    "exporter_version": distribution_version(DISTRIBUTION),
    "ecs_cluster": "arn:aws:ecs:us-east-1:123456789012:cluster/triton",
    "ecs_task_arn": TASK_ARN,
    "ecs_task_family": "triton",
    "ecs_task_revision": "12",
    "availability_zone": "us-east-1a",
    "ecs_launch_type": "EC2",
    "ecs_service": "triton",
}


@dataclass(frozen=True)
class Deployment:
    models: int  # model versions per task = models x versions; LLM models are among them
    versions: int = 1
    gpus: int = 1  # per task; the gpu dimension is the index, so tasks share these metrics
    tasks: int = 1
    nvml: bool = True  # NVML source on (EXPORTER_NVML=on in deploy/)
    counter_latencies: bool = True  # Triton's cumulative *_duration_us counters (on unless counter_latencies=false)
    summaries: bool = True  # --metrics-config summary_latencies=true (deploy/ sets it)
    histograms: bool = False  # --metrics-config histogram_latencies=true
    load_duration: bool = True  # nv_model_load_duration_secs, Triton 24.11+
    llm_models: int = 0  # of the models, how many serve through an LLM backend
    llm_backend: str = "vllm"  # vllm | tensorrt_llm
    ecs_metadata: bool = True
    interval: float = 60.0
    model_name_length: int = 16
    breakdown_zeros: str = "omit"  # as the sidecar's --breakdown-zeros
    modelsync: bool = True  # model sync deployed (ModelSyncBucketName): its metrics, events, alarms and rules
    rollouts: bool = False  # model sync's safe rollouts on (CanaryFraction > 0): RolloutsInFlight every reconcile
    otlp: bool = False  # an otlp+ output beside EMF: the exporter's OtlpPoints* metrics
    otlp_semconv: str = "off"  # as the sidecar's --otlp-semconv: genai adds the GenAI server metrics to OTLP
    tracing: bool = False  # the trace relay (--traces-to): the Traced* distributions and the relay's own counts
    max_models: int = 500  # the sidecar's --max-models: model versions it emits per task, the others dropped
    gpm: bool = False  # GPUs with GPM (Hopper and newer): the SM, tensor and DRAM activity metrics
    gpu_drain: bool = False  # --gpu-fault-action drain (GpuFaultAction=drain): the drain's attempts and failures
    # Totals assumed non-zero in every hour (models serve traffic all day; failures happen in no hour):
    # with breakdown_zeros=omit, a breakdown of any other total is billed in no hour.
    busy_totals: frozenset[str] = field(default_factory=lambda: frozenset({"RequestSuccess"}))

    @property
    def over_cap(self) -> bool:
        return self.models * self.versions > self.max_models

    def emitted(self) -> Deployment:
        """The deployment as the sidecar emits it: at most ``max_models`` model versions per task (the cap keeps
        whole models, in name order; an upper bound keeps the LLM models among them). Model sync is not capped:
        it syncs and reports every model."""
        if not self.over_cap:
            return self
        models = max(1, self.max_models // self.versions)
        return replace(self, models=models, llm_models=min(self.llm_models, models))

    def features(self) -> set[str]:
        on = {
            "counter_latencies": self.counter_latencies,
            "summary_latencies": self.summaries,
            "histogram_latencies": self.histograms,
            "load_duration": self.load_duration,
            self.llm_backend: self.llm_models > 0,
            "otlp_output": self.otlp,
            "tracing": self.tracing,
            "gpm": self.gpm and self.nvml,
            "gpu_drain": self.gpu_drain and self.nvml,
        }
        return {k for k, v in on.items() if v}


def _requires(catalog: Catalog, metric: Metric) -> list[str]:
    return [catalog.families[i.family].requires for i in metric.inputs]


def served_by(catalog: Catalog, metric: Metric, d: Deployment) -> tuple[bool, bool]:
    """Whether the deployment's (LLM models, other models) emit the metric.

    LLM models are taken to be decoupled (they stream) and the others not: an input marked
    ``decoupled`` is read only for the models of its kind.
    """
    features = d.features()
    llm = plain = False
    for i in metric.inputs:
        r = catalog.families[i.family].requires
        if r != "" and r not in features:
            continue
        llm = llm or r in LLM_BACKENDS or i.decoupled is not False
        plain = plain or (r not in LLM_BACKENDS and i.decoupled is not True)
    return llm, plain


def emitted_metrics(catalog: Catalog, d: Deployment) -> list[Metric]:
    """The selected metrics this deployment emits, and that CloudWatch bills every hour."""
    features = d.features()
    out = []
    for m in catalog.metrics:
        if m.scope is Scope.GPU and d.gpus == 0:
            continue
        if m.inputs and all(catalog.families[i.family].source == "nvml" for i in m.inputs) and not d.nvml:
            continue
        if m.inputs and not any(r == "" or r in features for r in _requires(catalog, m)):
            continue
        if d.breakdown_zeros == "omit" and m.breakdown_of and m.breakdown_of not in d.busy_totals:
            continue
        out.append(m)
    return out


def sources(d: Deployment) -> int:
    return 2 + d.ecs_metadata + (d.nvml and d.gpus > 0)


def values_of(dims: tuple[str, ...], d: Deployment, models: int) -> int:
    """Distinct value combinations one dimension set takes."""
    # result: model sync's attempts end ok in every hour that has any (failures, like breakdowns, in none)
    sizes = {"model": models, "version": d.versions, "gpu": d.gpus, "source": sources(d), "result": 1}
    n = 1
    for name in dims:
        n *= sizes[name]
    return n


def _models_emitting(catalog: Catalog, m: Metric, d: Deployment) -> int:
    if not m.inputs:
        return d.models
    llm_models = min(d.llm_models, d.models)
    llm, plain = served_by(catalog, m, d)
    return (llm_models if llm else 0) + (d.models - llm_models if plain else 0)


def metric_count(catalog: Catalog, d: Deployment, high_resolution: bool | None = None) -> int:
    """Billed metrics; ``high_resolution`` True or False: only those of that resolution."""
    return sum(
        values_of(dims, d, _models_emitting(catalog, m, d))
        for m in emitted_metrics(catalog, d)
        if high_resolution is None or m.high_resolution is high_resolution
        for dims in m.dimension_sets
    )


SYNC_EVERY_RECONCILE = ("model", "host")  # model sync's events written at every reconcile of every task
ROLLOUTS_ONLY = frozenset({"RolloutsInFlight"})  # in the host event only with safe rollouts on
RECONCILE = SKEW_PERIOD  # seconds between reconciles in the shipped deploy (MODELSYNC_INTERVAL 300)


def modelsync_metrics(pack: Catalog, d: Deployment) -> list[Metric]:
    """Model sync's metrics billed every hour: those of the events every reconcile writes.

    Attempt metrics exist only in the hours a model is synced (an upload): like a breakdown whose total is
    zero, they are billed in (nearly) no hour and are left out.
    """
    if not d.modelsync:
        return []
    return [m for m in pack.metrics if m.event in SYNC_EVERY_RECONCILE and (d.rollouts or m.name not in ROLLOUTS_ONLY)]


def modelsync_metric_count(pack: Catalog, d: Deployment) -> int:
    return sum(values_of(dims, d, d.models) for m in modelsync_metrics(pack, d) for dims in m.dimension_sets)


def modelsync_bytes(pack: Catalog, d: Deployment, namespace: str = "Triton") -> int:
    """Encoded bytes one task's model sync writes per reconcile: a model event per model and the host event."""
    metrics = modelsync_metrics(pack, d)
    if not metrics:
        return 0
    enc = Encoder(namespace, pack.metrics)
    name = ("m" * d.model_name_length)[: d.model_name_length]
    sha = "0123456789abcdef" * 4
    host = {"host": "ip-10-0-1-23.ec2.internal"}
    model = enc.encode(
        Event(
            Scope.MODELSYNC,
            {"model": name},
            {m.name: 1.0 for m in metrics if m.event == "model"},
            {**host, "ModelArtifact": sha, "sha256": sha, "s3_version_id": "x" * 32},
        ),
        1_700_000_000_000,
    )
    host_event = enc.encode(
        Event(Scope.MODELSYNC, {}, {m.name: 5.0 for m in metrics if m.event == "host"}, dict(host)),
        1_700_000_000_000,
    )
    size = sum(len(doc) + PUTLOGEVENTS_OVERHEAD for doc in model)
    return d.models * size + sum(len(doc) + PUTLOGEVENTS_OVERHEAD for doc in host_event)


def metric_cost(count: int) -> float:
    total, left = 0.0, float(count)
    for size, price in METRIC_TIERS:
        take = min(left, size)
        total += take * price
        left -= take
        if left <= 0:
            break
    return total


_VALUE_BY_KIND = {  # shapes of real values: rates and ratios print with many digits
    Kind.RATE: 16.666666666666668,
    Kind.RATIO: 2222.222222222222,
    Kind.GAUGE_RATIO: 25.0,
    Kind.QUANTILE: 1900.0,
    Kind.PERCENTILE: 412.5,
    Kind.DELTA: 540.0,
    Kind.GAUGE: 55.0,
    Kind.STATE: 1.0,
    Kind.SELF: 3.2518,
}
# A distribution with observations in five buckets, as a busy model's window has them.
_DISTRIBUTION = {
    "Values": [3.0, 7.5, 15.0, 30.0, 50.0],
    "Counts": [12.0, 40.0, 25.0, 9.0, 2.0],
    "Max": 60.0,
    "Min": 1.0,
    "Count": 88.0,
    "Sum": 1312.5,
}


def event_bytes(
    catalog: Catalog, d: Deployment, namespace: str = "Triton", llm: bool = False, period: float | None = None
) -> dict[Scope, int]:
    """Encoded size of one representative event per scope, with the exporter's own Encoder.

    ``llm``: the model event of an LLM model (core and LLM metrics), else of a plain one. ``period``: the event of
    a scrape between full cycles for the metrics of that faster cadence (only those, no properties:
    exporter/pipeline.py); None: a full cycle's.
    """
    metrics = [m for m in emitted_metrics(catalog, d) if not m.inputs or served_by(catalog, m, d)[0 if llm else 1]]
    if period is not None:
        metrics = [m for m in metrics if m.period(d.interval) == period]
    enc = Encoder(namespace, catalog.metrics)
    name = ("m" * d.model_name_length)[: d.model_name_length]
    shapes: dict[Scope, tuple[dict[str, str], dict[str, object]]] = {
        Scope.MODEL: (
            {"model": name, "version": "1"},
            {**({"ecs_task_arn": TASK_ARN} if d.ecs_metadata else {}), "state": "READY"},
        ),
        Scope.GPU: (
            {"gpu": "0"},
            {**COMMON, "gpu_uuid": "GPU-00000000-1111-2222-3333-444455550000", "gpu_name": "NVIDIA A10G"},
        ),
        Scope.TASK: ({}, dict(COMMON)),
        Scope.SOURCE: ({"source": "triton_metrics"}, dict(COMMON)),
    }
    out: dict[Scope, int] = {}
    for scope, (dims, props) in shapes.items():
        if period is not None:
            props = {"exporter_version": COMMON["exporter_version"]} if scope is not Scope.MODEL else {}
        mine = [m for m in metrics if m.scope is scope]
        values = {m.name: _VALUE_BY_KIND[m.kind] for m in mine if m.kind is not Kind.DISTRIBUTION}
        dists = {m.name: dict(_DISTRIBUTION) for m in mine if m.kind is Kind.DISTRIBUTION}
        if values or dists:
            docs = enc.encode(Event(scope, dims, values, props, dists), 1_700_000_000_000)
            out[scope] = sum(len(doc) + PUTLOGEVENTS_OVERHEAD for doc in docs)
    return out


def fast_periods(catalog: Catalog, d: Deployment) -> list[float]:
    """The cadences faster than the full cycle that the deployment's metrics have (their catalog ``interval``)."""
    return sorted({m.period(d.interval) for m in emitted_metrics(catalog, d)} - {d.interval})


def fast_scrapes(period: float, interval: float) -> float:
    """Scrapes of a ``period`` cadence per full ``interval`` that are not full cycles themselves."""
    p, i = round(period * 1000), round(interval * 1000)
    return interval / period - interval / (p * i // math.gcd(p, i) / 1000)


def fast_bytes(catalog: Catalog, d: Deployment, namespace: str = "Triton") -> int:
    """Bytes of the scrapes between full cycles, per full interval and task: the fast metrics' own events."""
    total = 0.0
    llm_models = min(d.llm_models, d.models)
    for period in fast_periods(catalog, d):
        plain = event_bytes(catalog, d, namespace, period=period)
        llm = event_bytes(catalog, d, namespace, llm=True, period=period)
        scrape = (
            d.versions * ((d.models - llm_models) * plain.get(Scope.MODEL, 0) + llm_models * llm.get(Scope.MODEL, 0))
            + d.gpus * plain.get(Scope.GPU, 0)
            + plain.get(Scope.TASK, 0)
        )
        total += scrape * fast_scrapes(period, d.interval)
    return round(total)


def alarm_metric_counts(catalog: Catalog, d: Deployment, specs: Sequence[Spec]) -> tuple[int, int]:
    """(standard, high-resolution) alarm metrics the alarms bill: a classic alarm one (with data or not), a
    metric-math alarm one per metric it reads, an INSIGHT_RULE_METRIC one per rule, a Metrics Insights
    GROUP BY model alarm one per model emitting its metric; high resolution when its period is 10 or 30 s."""
    emitted = {m.name: m for m in emitted_metrics(catalog, d)}
    standard = high = 0
    for s in specs:
        queries: list[dict[str, Any]] = s.body.get("Metrics", [])
        periods = [int(s.body["Period"])] if "Period" in s.body else []
        periods += [q.get("Period") or q.get("MetricStat", {}).get("Period", 60) for q in queries]
        if "MetricName" in s.body:
            n = 1
        elif s.terms:
            n = len(s.terms)
        elif s.rules:
            n = len(s.rules)
        elif s.metric in emitted:
            n = _models_emitting(catalog, emitted[s.metric], d)
        else:
            n = 0
        if min(periods, default=60) < 60:
            high += n
        else:
            standard += n
    return standard, high


@dataclass(frozen=True)
class Estimate:
    deployment: Deployment
    metrics: int
    alarms: int
    alarm_metrics: int  # standard and high-resolution
    bytes_per_cycle: int  # all tasks, the exporter's events per interval (full cycles)
    gb_per_month: float  # the exporter's and model sync's EMF
    metrics_usd: float
    alarms_usd: float
    logs_usd: float
    dashboard_usd: float
    sync_metrics: int = 0  # of ``metrics``, model sync's
    high_res_metrics: int = 0  # of ``metrics``, high resolution (the scaling signals: same price per metric)
    high_res_alarm_metrics: int = 0  # of ``alarm_metrics``, billed at the high-resolution price
    fast_bytes_per_cycle: int = 0  # all tasks, per interval: the fast metrics' scrapes between full cycles

    @property
    def total_usd(self) -> float:
        return self.metrics_usd + self.alarms_usd + self.logs_usd + self.dashboard_usd


def estimate(d: Deployment, opts: Options) -> Estimate:
    """The monthly cost of ``d``: the sidecar's metrics and bytes for the model versions it emits (``--max-models``
    caps them), model sync's for every model."""
    synced, d = d, d.emitted()
    catalog = opts.catalog
    # Model sync's alarms and rules exist only where it is deployed (the ModelSync parameter).
    specs = [s for s in alarm_specs(opts) if d.modelsync or s.condition != CONDITION]
    standard_alarm_metrics, high_alarm_metrics = alarm_metric_counts(catalog, d, specs)
    plain, llm = event_bytes(catalog, d, opts.namespace), event_bytes(catalog, d, opts.namespace, llm=True)
    llm_models = min(d.llm_models, d.models)
    model_bytes = (d.models - llm_models) * plain.get(Scope.MODEL, 0) + llm_models * llm.get(Scope.MODEL, 0)
    per_task = (
        d.versions * model_bytes
        + d.gpus * plain.get(Scope.GPU, 0)
        + plain.get(Scope.TASK, 0)
        + sources(d) * plain.get(Scope.SOURCE, 0)
    )
    per_cycle = per_task * d.tasks
    fast = fast_bytes(catalog, d, opts.namespace) * d.tasks
    sync_bytes = modelsync_bytes(opts.modelsync, synced, opts.namespace) * d.tasks
    seconds = HOURS_PER_MONTH * 3600
    gb = ((per_cycle + fast) * seconds / d.interval + sync_bytes * seconds / RECONCILE) / 1e9
    sync_count = modelsync_metric_count(opts.modelsync, synced)
    count = metric_count(catalog, d) + sync_count
    # The version-skew rules match one model-sync event per model per task per reconcile (every SKEW_PERIOD).
    rules = [r for r in insight_rule_specs(opts) if d.modelsync or r.condition != CONDITION]
    matched = len(rules) * d.tasks * synced.models * HOURS_PER_MONTH * 3600 / SKEW_PERIOD
    rules_usd = len(rules) * INSIGHT_RULE_MONTH + matched / 1e6 * INSIGHT_EVENTS_PER_MILLION
    return Estimate(
        synced,
        count,
        len(specs),
        standard_alarm_metrics + high_alarm_metrics,
        per_cycle,
        gb,
        metric_cost(count),
        standard_alarm_metrics * ALARM_METRIC_MONTH + high_alarm_metrics * HIGH_RES_ALARM_METRIC_MONTH + rules_usd,
        gb * LOG_INGESTION_PER_GB,
        DASHBOARD_MONTH,
        sync_count,
        metric_count(catalog, d, high_resolution=True),
        high_alarm_metrics,
        fast,
    )


# --- OTLP metrics (docs/otlp.md, "Size and cost") -----------------------------------------------------

HISTOGRAM_BOUNDS = 12  # explicit bounds per histogram point (Triton's and vLLM's defaults have 10-20)
MODEL_LABELS = ("model", "version")


@dataclass(frozen=True)
class OtlpEstimate:
    points_per_cycle: int  # all tasks
    request_bytes_per_point: float  # as serialized in the requests (the resource once per request)
    billed_bytes_per_point: float  # each point with the resource's and scope's attributes, as AWS bills it
    points_per_month: float
    gb_per_month: float  # billed
    price_per_gb: float | None  # none published: a parameter
    usd: float | None
    genai_points_per_cycle: int = 0  # of ``points_per_cycle``, the GenAI server metrics' (--otlp-semconv genai)
    genai_gb_per_month: float = 0.0  # of ``gb_per_month``, theirs


def _split_values(catalog: Catalog, family: str) -> int:
    """Series per model (or GPU) of a family split by a label the catalog selects values of (reason, quantile)."""
    values = {i.where for m in catalog.metrics for i in m.all_inputs() if i.family == family and i.where}
    return max(1, len(values))


def otlp_cycle(d: Deployment, opts: Options) -> list[tuple[bytes, int]]:
    """One task's cycle of the OTLP output for this deployment (capped: :meth:`Deployment.emitted`), as
    serialized Metric messages and their point counts, encoded with the real encoder.

    The families are those the OTLP output sends (:func:`catalog.otlp.plan`) of the metrics this deployment
    emits, each only where the deployment has what it ``requires`` (an LLM backend, a Triton flag); every model
    version (the LLM pack's: every LLM model version), GPU and source gets its series, a family split by a label
    once per value the catalog reads, a summary its quantiles as a gauge and its ``_sum``/``_count``;
    histograms have :data:`HISTOGRAM_BOUNDS` bounds, and a family read by model kind carries ``decoupled``
    (the LLM models stream, the others not). With ``otlp_semconv`` genai, each generative model version
    (:func:`catalog.genai.operation`: the LLM models) also gets the GenAI server metrics it has a source for,
    on its source's bounds with the spec's attributes (:func:`_genai`).
    """
    catalog = opts.catalog
    d = replace(d.emitted(), otlp=True)  # an OTLP output is what is priced: the exporter counts it too
    emitted = emitted_metrics(catalog, d)
    selected = Catalog(catalog.defined, catalog.families, [m.name for m in emitted], catalog.files)
    sent = plan(selected)
    features = d.features()
    llm_models = min(d.llm_models, d.models)
    name = "m" * d.model_name_length
    labels: dict[str, dict[str, str]] = {}

    def model_name(i: int) -> str:
        return f"{name[:-6]}{i:06d}"

    def keys(family_labels: tuple[str, ...], models: int, split: int, by_kind: bool = False) -> list[str]:
        if "gpu_uuid" in family_labels:
            rows = [{"gpu_uuid": f"GPU-{g:08d}-0000-0000-0000-000000000000"} for g in range(d.gpus)]
        elif "model" in family_labels:
            versions = range(1, d.versions + 1)
            rows = [
                {"model": model_name(i), "version": str(v)}
                | ({DECOUPLED: "true" if i < llm_models else "false"} if by_kind else {})
                for i in range(models)
                for v in versions
            ]
        elif "source" in family_labels:
            rows = [{"source": f"source_{i}"} for i in range(sources(d))]
        else:
            rows = [{}]
        extra = [x for x in family_labels if x not in (*MODEL_LABELS, "gpu_uuid", "source")]
        out = []
        for r in rows:
            for j in range(split):
                row = r | {x: f"value_{j}" for x in extra[:1]} | {x: "v" for x in extra[1:]}
                key = "|".join(f"{k}={v}" for k, v in row.items()) or "-"
                labels[key] = row
                out.append(key)
        return out

    enc = MetricsEncoder(resource_labels=12)
    enc.begin(1_800_000_000 * 10**9)
    histograms: dict[str, list[HistogramPoint]] = {}
    for fam in sent.families:
        if (fam.source == "nvml" and not d.nvml) or (fam.requires and fam.requires not in features):
            continue
        models = llm_models if fam.requires in LLM_BACKENDS else d.models
        split = _split_values(catalog, fam.name)
        if fam.type == "histogram":
            bounds = [float(2**i) for i in range(HISTOGRAM_BOUNDS)]
            hist = histograms[fam.name] = [
                HistogramPoint(k, bounds, list(range(1, HISTOGRAM_BOUNDS + 2)), 1234.5)
                for k in keys(fam.labels, models, 1, fam.name in sent.by_kind)
            ]
            enc.histogram(fam.name, hist, labels.__getitem__, fam.help)
        elif fam.type == "summary":
            quantiles = keys((*fam.labels, "quantile"), models, split)
            enc.gauge(fam.name, dict.fromkeys(quantiles, 123.0), labels.__getitem__, fam.help)
            series = dict.fromkeys(keys(fam.labels, models, 1), 1234.0)
            enc.counter(f"{fam.name}_sum", series, labels.__getitem__)
            enc.counter(f"{fam.name}_count", series, labels.__getitem__)
        elif fam.type == "counter":
            series = dict.fromkeys(keys(fam.labels, models, split), 1234.0)
            enc.counter(fam.name, series, labels.__getitem__, fam.help)
        else:
            series = dict.fromkeys(keys(fam.labels, models, split), 12.5)
            enc.gauge(fam.name, series, labels.__getitem__, fam.help)
    if d.otlp_semconv == "genai":
        generative = {model_name(i): GENAI_BACKENDS[d.llm_backend] for i in range(llm_models)}
        _genai(enc, selected, histograms, labels, generative)
    for _, scope, own in sent.own:
        own_labels = {Scope.MODEL: MODEL_LABELS, Scope.SOURCE: ("source",)}.get(scope, ())
        enc.gauge(own, dict.fromkeys(keys(own_labels, d.models, 1), 1.0), labels.__getitem__)
    return enc.finish()


# The models of the estimate as the exporter's rule for GenAI sees them: an LLM model streams (decoupled) on its
# backend (Triton's name for it), any other model is a classifier that does not.
GENAI_BACKENDS = {"vllm": "vllm", "tensorrt_llm": "tensorrtllm"}
PLAIN_BACKEND = "onnxruntime"


def _genai(
    enc: MetricsEncoder,
    selected: Catalog,
    histograms: dict[str, list[HistogramPoint]],
    labels: dict[str, dict[str, str]],
    generative: dict[str, str],
) -> None:
    """The GenAI server metrics of ``histograms`` (the source families' points), as the OTLP output makes them:
    per model version that is generative (``generative``: model -> its backend), the first source it has
    (:func:`catalog.genai.plan`'s order), bounds and sum in seconds, the spec's attributes."""
    for planned in semconv.plan(selected):
        taken: set[tuple[str, str]] = set()
        points: list[HistogramPoint] = []
        for source in planned.sources:
            found: set[tuple[str, str]] = set()
            for h in histograms.get(source.input.sample, ()):
                row = labels[h.key]
                entity = (row["model"], row["version"])
                decoupled = row["model"] in generative
                op = semconv.operation(None, decoupled, generative.get(row["model"], PLAIN_BACKEND))
                wanted = source.input.decoupled is None or source.input.decoupled is decoupled
                if op is None or not wanted or entity in taken:
                    continue
                found.add(entity)
                key = f"{op}\x1d{h.key}"
                labels[key] = semconv.attributes(row, op)
                bounds = [semconv.bound_seconds(b, source.factor) for b in h.bounds]
                total = None if h.sum is None else semconv.seconds(h.sum, source.factor)
                points.append(HistogramPoint(key, bounds, h.cumulative, total))
            taken |= found
        enc.histogram(planned.metric.name, points, labels.__getitem__, planned.metric.description, semconv.UNIT)


def otlp_estimate(d: Deployment, opts: Options, price_per_gb: float | None = None) -> OtlpEstimate:
    """OTLP points and bytes a month of this deployment (:func:`otlp_cycle`, one per task and interval).

    The resource is the ECS task's, from the same attributes the output sends, billed with every point.
    """
    d = d.emitted()
    items = otlp_cycle(d, opts)
    points = sum(n for _, n in items)
    request_bytes = sum(len(data) for data, _ in items)
    resource = Resource(
        attributes=[
            KeyValue(key=k, value=AnyValue(string_value=str(v)))
            for k, v in ecs_resource(
                {k: v for k, v in COMMON.items() if k != "exporter_version"}, "triton-server", ()
            ).items()
        ]
    )
    scope_bytes = InstrumentationScope(name=SCOPE_NAME, version=COMMON["exporter_version"]).ByteSize()
    per_point = request_bytes / points if points else 0.0
    billed = per_point + resource.ByteSize() + scope_bytes
    cycles = d.tasks * HOURS_PER_MONTH * 3600 / d.interval
    gb = points * cycles * billed / 1e9
    genai_names = {g.name for g in semconv.METRICS}
    genai = [(data, n) for data, n in items if OtlpMetric.FromString(data).name in genai_names]
    genai_points = sum(n for _, n in genai)
    # a GenAI point's own bytes in the requests, plus the resource and scope every point is billed with
    genai_bytes = sum(len(data) for data, _ in genai) + genai_points * (billed - per_point)
    return OtlpEstimate(
        points * d.tasks,
        per_point,
        billed,
        points * cycles,
        gb,
        price_per_gb,
        None if price_per_gb is None else gb * price_per_gb,
        genai_points * d.tasks,
        genai_bytes * cycles / 1e9,
    )


ASSUMPTIONS = (
    "us-east-1 list prices: custom metrics $0.30/metric-month for the first 10,000 (then $0.10, $0.05, $0.02), "
    "high-resolution ones alike (CloudWatch bills a metric, not its resolution; what a faster cadence adds is "
    "EMF bytes), alarms $0.10 per standard-resolution alarm metric and $0.30 per high-resolution one (a 10 or "
    "30-second period; a metric-math alarm is billed per metric it reads, a Metrics Insights GROUP BY model "
    "alarm per metric it analyzes: one per model), log ingestion $0.50/GB, dashboards $3/month beyond the "
    "account's first 3; a 730-hour month; no free tier. Alarms include the scaling ones (EnableScaling=true) and "
    "model sync's: its version-skew alarm reads two Contributor Insights rules ($0.50/rule-month, $0.02 per "
    "million events matched: one per model and task every 5 minutes).",
    "Every metric reports all month. Model metrics exist per model x version; the gpu dimension is the GPU "
    "index, so tasks share GPU metrics; the empty dimension set is one metric across all tasks.",
    "Breakdowns (failure reasons, an LLM's token counters) whose total is zero are not emitted "
    "(--breakdown-zeros omit, the default): models serve traffic every hour and fail in none, so the four "
    "failure-reason metrics per model are billed in no hour; with --breakdown-zeros emit they are billed "
    "every hour.",
    "Triton runs with summary_latencies (deploy/ sets it), not histogram_latencies, and is 24.11+ "
    "(ModelLoadDuration); NVML is on with every field supported (an upper bound: boards without HBM or ECC "
    "emit fewer). LLM models (--llm-models) emit the LLM pack's metrics of their backend; families of a user "
    "catalog with no `requires` are assumed served by every model.",
    "EMF bytes: one event per model version, GPU, source and task per interval, as the exporter's Encoder "
    "writes them with ECS metadata properties and 16-character model names, plus 26 bytes per event; "
    "distributions with five buckets. Metrics with a faster catalog interval (the scaling signals, every 10 s) add "
    "their own event per model version at each scrape between full cycles (only those values, no properties).",
    "Model sync is in use (--no-modelsync: not): its ModelInSync per model and service-wide and its three host "
    "totals are written at every reconcile (every 5 minutes) and billed all month, with those events' bytes; "
    "its attempt metrics exist only in the hours a model is synced and are not counted; nor are the rollout "
    "decisions' (RolloutsPromoted, ...: only in the hours of a rollout); with safe rollouts on (--rollouts) "
    "its RolloutsInFlight is.",
    "Not included: log storage after ingestion, Logs Insights queries of the dashboard ($0.005/GB scanned), "
    "GetMetricData calls, the other log groups (Triton's own logs), data transfer.",
)


def markdown_table(rows: Sequence[tuple[str, Deployment]], opts: Options) -> str:
    lines = [
        "| Deployment | Custom metrics (high-res) | Alarms (alarm metrics; high-res) | EMF GB/month | Metrics | "
        "Alarms | EMF ingestion | Dashboard | Total/month |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, d in rows:
        e = estimate(d, opts)
        lines.append(
            f"| {label} | {e.metrics:,} ({e.high_res_metrics:,}) | {e.alarms} ({e.alarm_metrics:,}; "
            f"{e.high_res_alarm_metrics}) | {e.gb_per_month:.2f} | "
            f"${e.metrics_usd:,.2f} | ${e.alarms_usd:,.2f} | ${e.logs_usd:,.2f} | ${e.dashboard_usd:,.2f} | "
            f"${e.total_usd:,.2f} |"
        )
    return "\n".join(lines) + "\n"


_SMALL = Deployment(models=5, versions=1, gpus=1, tasks=2)
_LARGE = Deployment(models=200, versions=1, gpus=8, tasks=4)
DOC_ROWS = (
    ("small: 5 models, 1 version, 1 GPU, 2 tasks", _SMALL),
    ("small, breakdown zeros emitted", replace(_SMALL, breakdown_zeros="emit")),
    ("small, 2 of them vLLM LLMs", replace(_SMALL, llm_models=2)),
    ("large: 200 models, 1 version, 8 GPUs, 4 tasks", _LARGE),
    ("large, breakdown zeros emitted", replace(_LARGE, breakdown_zeros="emit")),
    (
        "large, 20 of them TensorRT-LLM LLMs",
        replace(_LARGE, llm_models=20, llm_backend="tensorrt_llm", histograms=True),
    ),
    ("large, Hopper GPUs (GPM), GpuFaultAction=drain", replace(_LARGE, gpm=True, gpu_drain=True)),
)


def _at_least(low: int) -> Callable[[str], int]:
    def check(text: str) -> int:
        value = integer(text)
        if value < low:
            raise ValueError(f"must be at least {low}")
        return value

    return check


OPTIONS: tuple[Option, ...] = (
    Option("models", "--models", (), _at_least(0), "models loaded (required unless --markdown)", metavar="N", shown=""),
    Option("versions", "--versions", (), _at_least(1), "loaded versions per model", metavar="N"),
    Option("gpus", "--gpus", (), _at_least(0), "GPUs per task", metavar="N"),
    Option("tasks", "--tasks", (), _at_least(1), "tasks of the service", metavar="N"),
    Option("interval", "--interval", (), positive, "exporter interval, seconds", metavar="SECONDS"),
    Option("llm_models", "--llm-models", (), _at_least(0), "of the models, how many are LLMs", metavar="N"),
    Option("llm_backend", "--llm-backend", (), choice(*LLM_BACKENDS), "their backend"),
    Option("breakdown_zeros", "--breakdown-zeros", (), choice("omit", "emit"), "as the sidecar's setting"),
    Option(
        "max_models",
        "--max-models",
        (),
        _at_least(1),
        "as the sidecar's setting: model versions it emits per task (models x versions beyond it are not emitted)",
        metavar="N",
    ),
    Option(
        "otlp_semconv",
        "--otlp-semconv",
        (),
        choice(*SEMCONVS),
        "as the sidecar's setting (OtlpSemconv): genai prices the GenAI server metrics of the LLM models too "
        "(implies --otlp)",
    ),
    *cli.OPTIONS,
)


def main(argv: Sequence[str], prog: str = "python -m render cost") -> int:
    p = ArgumentParser(prog=prog, description="Custom metrics, alarms and monthly list price the defaults create.")
    add_options(p, OPTIONS, Deployment(models=0))
    p.add_argument("--no-nvml", action="store_true", help="NVML source off (EXPORTER_NVML=off)")
    p.add_argument("--no-summaries", action="store_true", help="Triton without summary_latencies")
    p.add_argument("--histograms", action="store_true", help="Triton with histogram_latencies")
    p.add_argument("--no-modelsync", action="store_true", help="model sync not deployed: no metrics of it")
    p.add_argument("--rollouts", action="store_true", help="model sync's safe rollouts on (CanaryFraction > 0)")
    p.add_argument("--markdown", action="store_true", help="print the docs table for the small and large cases")
    p.add_argument("--gpm", action="store_true", help="Hopper or newer GPUs: the GPM activity metrics (docs/gpu.md)")
    p.add_argument(
        "--gpu-drain", action="store_true", help="GpuFaultAction=drain: the drain's attempt and failure counts"
    )
    p.add_argument(
        "--tracing",
        action="store_true",
        help="the trace relay on (Tracing=true): its Traced* distributions, every model traced every hour",
    )
    p.add_argument(
        "--otlp",
        action="store_true",
        help="also the OTLP metrics output (docs/otlp.md): points and GB a month, measured with the real encoder",
    )
    p.add_argument(
        "--otlp-price-per-gb",
        type=float,
        default=None,
        metavar="USD",
        help="price of a GB of OTLP metrics (none is published: without it, no dollar figure)",
    )
    try:
        args, values = parse(p, OPTIONS, argv, os.environ)
    except ConfigError as exc:
        return fail(prog, f"invalid setting: {exc}")
    try:
        opts = Options(catalog=cli.from_values(values))
    except CatalogError as exc:
        return fail(prog, f"invalid catalog: {exc}")
    if args.markdown:
        sys.stdout.write(markdown_table(DOC_ROWS, opts))
        return 0
    if "models" not in values:
        p.error("--models is required")
    deployment = {k: v for k, v in values.items() if k not in cli.FIELDS}
    if not deployment.get("llm_models", 0) <= deployment["models"]:
        return fail(prog, "need --llm-models <= --models")
    otlp = args.otlp or args.otlp_price_per_gb is not None or deployment.get("otlp_semconv", "off") != "off"
    d = Deployment(
        **deployment,
        nvml=not args.no_nvml,
        summaries=not args.no_summaries,
        histograms=args.histograms,
        modelsync=not args.no_modelsync,
        rollouts=args.rollouts and not args.no_modelsync,
        otlp=otlp,
        tracing=args.tracing,
        gpm=args.gpm,
        gpu_drain=args.gpu_drain,
    )
    e = estimate(d, opts)
    w = sys.stdout.write
    w(
        f"deployment: {d.models} models x {d.versions} versions ({d.llm_models} LLM, {d.llm_backend}), "
        f"{d.gpus} GPUs/task, {d.tasks} tasks, interval {d.interval:g}s; {len(opts.catalog.metrics)} metrics selected\n"
    )
    if d.over_cap:
        x = d.emitted()
        w(
            f"--max-models {d.max_models}: the sidecar emits {x.models * x.versions:,} of the "
            f"{d.models * d.versions:,} model versions per task ({x.models:,} models x {x.versions}), priced below; "
            f"model sync still syncs and reports all {d.models:,} models\n"
        )
    w(f"custom metrics:        {e.metrics:>10,}   ${e.metrics_usd:>10,.2f}/month\n")
    w(f"  of them high-res:    {e.high_res_metrics:>10,}   (the scaling signals; same price per metric)\n")
    if d.modelsync:
        w(f"  of them model sync:  {e.sync_metrics:>10,}   (--no-modelsync: without it)\n")
    w(
        f"alarms:                {e.alarms:>10,}   ${e.alarms_usd:>10,.2f}/month ({e.alarm_metrics:,} alarm metrics, "
        f"{e.high_res_alarm_metrics:,} of them high resolution at ${HIGH_RES_ALARM_METRIC_MONTH:.2f})\n"
    )
    fast = fast_periods(opts.catalog, d)
    w(
        f"EMF log ingestion:     {e.gb_per_month:>10.2f} GB ${e.logs_usd:>7,.2f}/month "
        f"({e.bytes_per_cycle:,} bytes per interval"
        + (
            f", {e.fast_bytes_per_cycle:,} more for the {'/'.join(f'{p:g}' for p in fast)} s metrics' scrapes)\n"
            if fast
            else ")\n"
        )
    )
    w(f"dashboard:             {1:>10}   ${e.dashboard_usd:>10,.2f}/month\n")
    if d.otlp:
        o = otlp_estimate(d, opts, args.otlp_price_per_gb)
        price = "no price (--otlp-price-per-gb)" if o.usd is None else f"${o.usd:,.2f}/month"
        w(
            f"OTLP metrics:          {o.points_per_month / 1e6:>10,.2f} M points/month "
            f"({o.points_per_cycle:,} a cycle), "
            f"{o.gb_per_month:,.2f} GB/month, {price}\n"
            f"  bytes per point:     {o.billed_bytes_per_point:>10,.0f} billed (with the ECS resource), "
            f"{o.request_bytes_per_point:.0f} in the requests; not in the total below\n"
        )
        if d.otlp_semconv == "genai":
            w(
                f"  of them GenAI:       {o.genai_points_per_cycle:>10,} points a cycle, "
                f"{o.genai_gb_per_month:,.2f} GB/month (gen_ai.server.*, "
                + ("per LLM model version it has a source for)\n" if d.llm_models else "none: no --llm-models)\n")
            )
    w(f"total:                              ${e.total_usd:>10,.2f}/month\n\nAssumptions:\n")
    for a in ASSUMPTIONS:
        w(f"- {a}\n")
    return 0
