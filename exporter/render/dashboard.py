"""The CloudWatch dashboard body, built from the catalog.

Every metric name goes through :func:`_metric`, which refuses a name or a
dimension set the catalog does not define, so a renamed metric breaks the
render instead of leaving a widget that silently shows nothing. A metric the
``--metrics`` selection leaves out is not drawn: its row is dropped (``None``
flows through the row helpers), and a widget left with no rows is dropped.
Per-model and per-GPU graphs use SEARCH on the dimension schema, so models
and GPUs that appear later show up without editing the dashboard; fleet
totals use Metrics Insights (one aggregated series, up to 10,000 metrics
scanned) or the catalog's rollup dimension sets. Histogram metrics are
CloudWatch distributions: their graphs use percentile statistics (p50, p95,
p99) that CloudWatch computes over the events of every task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from . import modelsync
from .alarms import alarm_names
from .options import MAX_LOG_GROUPS_PER_QUERY, Options, model_log_group

GRID_WIDTH = 24
MAX_WIDGETS = 500
MAX_METRICS_PER_WIDGET = 500
MAX_ALARMS_PER_WIDGET = 100
PERIOD = 60  # the exporter's default interval; one datapoint per entity and minute

Widget = dict[str, Any]
Row = list[Any]


def _metric(opts: Options, name: str, dims: tuple[str, ...], pack: bool = False) -> str | None:
    """The metric name, after checking the catalog defines it with exactly these dimension names.

    None when the selection leaves it out (the caller drops the row); an
    error when no catalog file defines it at all, unless ``pack``: a metric of
    an optional built-in pack (LLM), absent when the pack is off.
    """
    metric = opts.catalog.definition(name)
    if metric is None and pack:
        return None
    if metric is None:
        raise KeyError(f"dashboard references {name!r}, which is not in the catalog")
    if tuple(dims) not in metric.dimension_sets:
        raise KeyError(f"{name} is not emitted with dimensions {list(dims)}; catalog has {metric.dimension_sets}")
    return name if opts.catalog.emits(name) else None


def search(opts: Options, name: str, dims: tuple[str, ...], stat: str, pack: bool = False) -> str | None:
    metric = _metric(opts, name, dims, pack)
    return None if metric is None else search_expression(opts.namespace, metric, dims, stat)


def search_expression(namespace: str, metric: str, dims: tuple[str, ...], stat: str) -> str:
    """The SEARCH text for a metric already checked against what its emitter defines."""
    schema = ",".join([f'"{namespace}"', *dims])
    return f"SEARCH('{{{schema}}} MetricName=\"{metric}\"', '{stat}', {PERIOD})"


def insights(opts: Options, func: str, name: str, dims: tuple[str, ...]) -> str | None:
    metric = _metric(opts, name, dims)
    if metric is None:
        return None
    schema = ", ".join([f'"{opts.namespace}"', *dims])
    return f"SELECT {func}({metric}) FROM SCHEMA({schema})"


@dataclass
class Layout:
    """Packs widgets left to right on the 24-column grid; ``section`` starts a new row."""

    widgets: list[Widget] = field(default_factory=list)
    x: int = 0
    y: int = 0
    row_height: int = 0

    def add(self, widget: Widget | None, width: int, height: int) -> None:
        if widget is None:  # everything it would show is left out by the selection
            return
        if self.x + width > GRID_WIDTH:
            self.newline()
        self.widgets.append({**widget, "x": self.x, "y": self.y, "width": width, "height": height})
        self.x += width
        self.row_height = max(self.row_height, height)

    def newline(self) -> None:
        self.y += self.row_height
        self.x, self.row_height = 0, 0

    def section(self, markdown: str) -> None:
        if self.x:
            self.newline()
        self.add({"type": "text", "properties": {"markdown": markdown}}, GRID_WIDTH, 1)
        self.newline()


def _graph(
    opts: Options,
    title: str,
    metrics: list[Row | None],
    *,
    stat: str = "Average",
    view: str = "timeSeries",
    unit_label: str = "",
    annotations: list[dict[str, Any]] | None = None,
) -> Widget | None:
    """A metric widget of the rows the selection keeps; None when it keeps none.

    An expression row that refers to the id of a dropped row is dropped too.
    """
    rows = [r for r in metrics if r is not None]
    ids = {o["id"] for r in rows for o in r if isinstance(o, dict) and "id" in o}
    rows = [r for r in rows if not _refs(r) - ids]
    if not [r for r in rows if not _hidden(r)]:
        return None
    props: dict[str, Any] = {
        "title": title,
        "region": opts.region,
        "view": view,
        "stacked": False,
        "period": PERIOD,
        "stat": stat,
        "metrics": rows,
    }
    if unit_label:
        props["yAxis"] = {"left": {"label": unit_label, "showUnits": False}}
    if annotations:
        props["annotations"] = {"horizontal": annotations}
    return {"type": "metric", "properties": props}


_ID = re.compile(r"\b([a-z][a-zA-Z0-9_]*)\b")


def _refs(row: Row) -> set[str]:
    """Row ids an expression row uses (``ok/PERIOD(ok)`` uses ``ok``); SEARCH, SELECT and INSIGHT_RULE_METRIC
    use none."""
    opt = row[-1] if row and isinstance(row[-1], dict) else {}
    expr = opt.get("expression", "")
    if not expr or "SEARCH(" in expr or "SELECT " in expr or "INSIGHT_RULE_METRIC(" in expr:
        return set()
    return set(_ID.findall(expr.replace("PERIOD", "")))


def _hidden(row: Row) -> bool:
    return bool(row) and isinstance(row[-1], dict) and row[-1].get("visible") is False


def _expr(expression: str | None, label: str, id_: str, **extra: Any) -> Row | None:
    """An expression row; no label lets SEARCH name each series by its dimension values."""
    if expression is None:
        return None
    return [{"expression": expression, **({"label": label} if label else {}), "id": id_, **extra}]


def _row(opts: Options, name: str, options: dict[str, Any]) -> Row | None:
    """A task-level metric row (empty dimension set: one series across all tasks)."""
    metric = _metric(opts, name, ())
    return None if metric is None else [opts.namespace, metric, options]


def _logs(opts: Options, title: str, groups: list[str], query: str) -> Widget:
    if not 1 <= len(groups) <= MAX_LOG_GROUPS_PER_QUERY:
        raise ValueError(f"a Logs Insights query takes 1-{MAX_LOG_GROUPS_PER_QUERY} log groups, got {len(groups)}")
    sources = " | ".join(f"SOURCE '{g}'" for g in groups)
    return {
        "type": "log",
        "properties": {"title": title, "region": opts.region, "view": "table", "query": f"{sources} | {query}"},
    }


SECTIONS = {
    "overview": "**Overview**: is Triton up on every task, are the models loaded, how much traffic and how many "
    "failures (by Triton's reason), and the state of every alarm.",
    "models": "**Per model**: throughput, success and failure, latency (average, p95, p99), queue versus compute "
    "time, batch size and queue depth; new models appear by themselves (SEARCH on the model dimension).",
    "gpu": "**GPU**: utilization and memory (the scaling signals, with their thresholds), power, and the NVML "
    "health fields (temperature, throttling, XID, ECC, row remapping) when the NVML source is on.",
    "llm": "**LLM serving**: time to first token and inter-token latency as percentiles over every task "
    "(CloudWatch distributions), generated tokens per second, KV-cache use and waiting requests (vLLM and "
    "TensorRT-LLM backends; shown when their metrics are emitted).",
    "logs": "**Logs**: Logs Insights over the Fluent Bit log groups: recent errors and failed model loads "
    "(errors group), and load/unload history of the models named at render time (per-model groups).",
}


def build(opts: Options) -> dict[str, Any]:
    """The dashboard body: the JSON ``aws cloudwatch put-dashboard --dashboard-body`` takes."""
    lay = Layout()
    llm = _llm_widgets(opts)
    intro = "\n".join(
        [*(f"- {text}" for key, text in SECTIONS.items() if key != "llm" or llm), f"- {modelsync.SECTION}"]
    )
    lay.add(
        {
            "type": "text",
            "properties": {
                "markdown": f"# Triton Inference Server ({opts.namespace})\n{intro}\n"
                f"\nMetrics are one series across all tasks of the service (no task id dimension): "
                f"one CloudWatch namespace per ECS service."
            },
        },
        GRID_WIDTH,
        4,
    )
    lay.newline()
    _overview(opts, lay)
    _models(opts, lay)
    _gpu(opts, lay)
    if llm:
        lay.section(SECTIONS["llm"])
        for widget in llm:
            lay.add(widget, 8, 6)
    _logs_section(opts, lay)
    modelsync.section(opts, lay)
    if len(lay.widgets) > MAX_WIDGETS:
        raise ValueError(f"{len(lay.widgets)} widgets: CloudWatch allows {MAX_WIDGETS}")
    return {"start": "-PT3H", "periodOverride": "auto", "widgets": lay.widgets}


def _overview(opts: Options, lay: Layout) -> None:
    lay.section(SECTIONS["overview"])
    lay.add(
        _graph(
            opts,
            "Status (worst task)",
            [
                _row(opts, "TritonUp", {"stat": "Minimum", "label": "Triton up (min over tasks)"}),
                _row(opts, "ModelsReady", {"stat": "Minimum", "label": "Model versions ready (min)"}),
                _row(opts, "ModelsNotReady", {"stat": "Maximum", "label": "Model versions not ready (max)"}),
                _row(opts, "ModelLoadSuccessRate", {"stat": "Minimum", "label": "Load success % (min)"}),
                _row(opts, "ExporterHeartbeat", {"stat": "Sum", "label": "Exporter heartbeats/min (~tasks)"}),
            ],
            view="singleValue",
        ),
        12,
        4,
    )
    arn = f"arn:{opts.partition}:cloudwatch:{opts.region}:{opts.account_id}:alarm:"
    alarms = [arn + name for name in alarm_names(opts)][:MAX_ALARMS_PER_WIDGET]  # fleet-wide alarms come first
    if alarms:
        lay.add(
            {"type": "alarm", "properties": {"title": "Alarms", "alarms": alarms, "sortBy": "stateUpdatedTimestamp"}},
            12,
            4,
        )
    lay.add(
        _graph(
            opts,
            "Requests per second (all models, all tasks)",
            [
                _row(opts, "RequestSuccess", {"id": "ok", "stat": "Sum", "visible": False}),
                _row(opts, "RequestFailure", {"id": "ko", "stat": "Sum", "visible": False}),
                _expr("ok/PERIOD(ok)", "success/s", "okrate"),
                _expr("ko/PERIOD(ko)", "failure/s", "korate"),
            ],
            unit_label="requests/s",
        ),
        8,
        6,
    )
    reasons = [m for m in opts.catalog.defined if m.breakdown_of == "RequestFailure"]
    lay.add(
        _graph(
            opts,
            "Failures by reason (all models)",
            [
                _expr(
                    insights(opts, "SUM", m.name, ("model", "version")),
                    m.inputs[0].where[1] if m.inputs[0].where else m.name,
                    f"r{i}",
                )
                for i, m in enumerate(reasons)
            ],
            stat="Sum",
            unit_label="failed requests",
        ),
        8,
        6,
    )
    lay.add(
        _graph(
            opts,
            "Model versions ready / not ready, load success %",
            [
                _row(opts, "ModelsReady", {"stat": "Minimum", "label": "ready (min over tasks)"}),
                _row(opts, "ModelsNotReady", {"stat": "Maximum", "label": "not ready (max over tasks)"}),
                _row(
                    opts, "ModelLoadSuccessRate", {"stat": "Minimum", "label": "load success % (min)", "yAxis": "right"}
                ),
            ],
            annotations=[{"value": opts.load_success_rate, "label": "load alarm", "yAxis": "right"}],
        ),
        8,
        6,
    )


def _models(opts: Options, lay: Layout) -> None:
    lay.section(SECTIONS["models"])
    mv = ("model", "version")
    m = ("model",)
    graphs: list[tuple[str, list[Row | None], str, str, list[dict[str, Any]] | None]] = [
        (
            "Throughput per version (req/s, average over tasks)",
            [_expr(search(opts, "RequestsPerSecond", mv, "Average"), "", "e1")],
            "Average",
            "req/s",
            None,
        ),
        (
            "Successful requests per model (sum per period)",
            [_expr(search(opts, "RequestSuccess", m, "Sum"), "", "e1")],
            "Sum",
            "requests",
            None,
        ),
        (
            "Failed requests per model (sum per period)",
            [_expr(search(opts, "RequestFailure", m, "Sum"), "", "e1")],
            "Sum",
            "requests",
            [{"value": opts.failure_threshold, "label": "alarm (per 5 min)"}],
        ),
        (
            "Average request latency per version (us)",
            [_expr(search(opts, "RequestLatencyAvg", mv, "Average"), "", "e1")],
            "Average",
            "microseconds",
            None,
        ),
        (
            "p95 latency per model (us, worst task)",
            [_expr(search(opts, "RequestLatencyP95", m, "Maximum"), "", "e1")],
            "Maximum",
            "microseconds",
            [{"value": opts.latency_slo_us, "label": "SLO"}],
        ),
        (
            "p99 latency per version (us, worst task)",
            [_expr(search(opts, "RequestLatencyP99", mv, "Maximum"), "", "e1")],
            "Maximum",
            "microseconds",
            None,
        ),
        (
            "Queue vs compute time per request (us)",
            [
                _expr(search(opts, "QueueLatencyAvg", mv, "Average"), "queue", "q"),
                _expr(search(opts, "ComputeLatencyAvg", mv, "Average"), "compute", "c"),
            ],
            "Average",
            "microseconds",
            None,
        ),
        (
            "Average batch size per version",
            [_expr(search(opts, "AverageBatchSize", mv, "Average"), "", "e1")],
            "Average",
            "inferences/execution",
            None,
        ),
        (
            "Pending requests per version (max over tasks)",
            [_expr(search(opts, "PendingRequests", mv, "Maximum"), "", "e1")],
            "Maximum",
            "requests",
            None,
        ),
        (
            "Version ready (1) per version (min over tasks)",
            [_expr(search(opts, "ModelReady", mv, "Minimum"), "", "e1")],
            "Minimum",
            "ready",
            None,
        ),
    ]
    for title, metrics, stat, label, ann in graphs:
        lay.add(_graph(opts, title, metrics, stat=stat, unit_label=label, annotations=ann), 8, 6)


def _gpu(opts: Options, lay: Layout) -> None:
    lay.section(SECTIONS["gpu"])
    g = ("gpu",)
    lay.add(
        _graph(
            opts,
            "GPU utilization % (per GPU index; service average drives scaling)",
            [
                _expr(search(opts, "GpuUtilization", g, "Average"), "", "g"),
                _row(opts, "GpuUtilization", {"stat": "Average", "label": "service average"}),
            ],
            unit_label="percent",
            annotations=[
                {"value": opts.gpu_scale_out, "label": "scale out"},
                {"value": opts.gpu_scale_in, "label": "scale in"},
            ],
        ),
        12,
        6,
    )
    lay.add(
        _graph(
            opts,
            "GPU memory used % (per GPU index; service max)",
            [
                _expr(search(opts, "GpuMemoryUsedPercent", g, "Maximum"), "", "g"),
                _row(opts, "GpuMemoryUsedPercent", {"stat": "Maximum", "label": "service max"}),
            ],
            stat="Maximum",
            unit_label="percent",
            annotations=[{"value": opts.gpu_memory, "label": "alarm"}],
        ),
        12,
        6,
    )
    panels: list[tuple[str, list[tuple[str, str]], str]] = [
        ("Power draw and limit (W)", [("GpuPowerWatts", "Average"), ("GpuPowerLimitWatts", "Maximum")], "watts"),
        (
            "Temperature (C), NVML",
            [("GpuTemperatureCelsius", "Maximum"), ("GpuMemoryTemperatureCelsius", "Maximum")],
            "celsius",
        ),
        (
            "Clock throttling (1 = active), NVML",
            [
                ("GpuThrottleThermal", "Maximum"),
                ("GpuThrottlePowerCap", "Maximum"),
                ("GpuThrottleHwSlowdown", "Maximum"),
            ],
            "active",
        ),
        (
            "XID and ECC errors per period, NVML",
            [
                ("GpuXidErrors", "Sum"),
                ("GpuEccUncorrectedErrors", "Sum"),
                ("GpuEccCorrectedErrors", "Sum"),
                ("GpuPcieReplays", "Sum"),
            ],
            "events",
        ),
        (
            "Row remapping and lost GPUs (1 = needs action), NVML",
            [("GpuRemappedRowsPending", "Maximum"), ("GpuRemappedRowsFailure", "Maximum"), ("GpuLost", "Maximum")],
            "flag",
        ),
        ("Memory controller utilization %, NVML", [("GpuMemoryControllerUtilization", "Average")], "percent"),
    ]
    for title, names, label in panels:
        rows = [
            _expr(search(opts, name, g, stat), name.removeprefix("Gpu"), f"e{i}")
            for i, (name, stat) in enumerate(names)
        ]
        lay.add(_graph(opts, title, rows, stat=names[0][1], unit_label=label), 8, 6)


def _logs_section(opts: Options, lay: Layout) -> None:
    lay.section(SECTIONS["logs"])
    errors = f"{opts.log_group_prefix}/errors"
    lay.add(
        _logs(
            opts,
            "Recent errors and warnings (errors group)",
            [errors],
            "fields @timestamp, level, model, version, message, @logStream\n| sort @timestamp desc\n| limit 100",
        ),
        24,
        6,
    )
    lay.add(
        _logs(
            opts,
            "Failed model loads (errors group)",
            [errors],
            "fields @timestamp, model, version, message"
            '\n| filter level = "ERROR" and message like /^failed to load \'/'
            "\n| parse message /: (?<reason>[^\\n]*)/"
            "\n| stats count(*) as failures, latest(reason) as last_reason, max(@timestamp) as last_seen"
            " by model, version\n| sort last_seen desc\n| limit 100",
        ),
        12,
        6,
    )
    groups = sorted({model_log_group(opts.log_group_prefix, m) for m in opts.models})
    if groups:
        lay.add(
            _logs(
                opts,
                "Model load/unload history (per-model groups)",
                groups[:MAX_LOG_GROUPS_PER_QUERY],
                "fields @timestamp, model, version, level, message"
                "\n| filter message like /^(loading: |successfully loaded|successfully unloaded|failed to load)/"
                "\n| sort @timestamp desc\n| limit 100",
            ),
            12,
            6,
        )
    else:
        lay.add(
            {
                "type": "text",
                "properties": {
                    "markdown": "**Model load/unload history**: render with `--model NAME` (repeatable) to add a "
                    f"Logs Insights widget over the per-model groups `{opts.log_group_prefix}/model/<name>`; "
                    "failed loads of every model are in the errors group on the left."
                },
            },
            12,
            6,
        )


def _llm_widgets(opts: Options) -> list[Widget]:
    """The LLM section's graphs, only those whose metrics the selection emits."""
    m = ("model",)
    percentiles = [("p50", "p50"), ("p95", "p95"), ("p99", "p99")]
    graphs = [
        _graph(
            opts,
            "Time to first token per model (ms, percentiles over all tasks)",
            [
                _expr(search(opts, "TimeToFirstToken", m, stat, pack=True), label, f"t{i}")
                for i, (stat, label) in enumerate(percentiles)
            ],
            stat="p95",
            unit_label="milliseconds",
            annotations=[{"value": opts.ttft_p95_ms, "label": "p95 alarm"}],
        ),
        _graph(
            opts,
            "Inter-token latency per model (ms, percentiles over all tasks)",
            [
                _expr(search(opts, "InterTokenLatency", m, stat, pack=True), label, f"i{i}")
                for i, (stat, label) in enumerate(percentiles)
            ],
            stat="p95",
            unit_label="milliseconds",
        ),
        _graph(
            opts,
            "Generated tokens per second per model (all tasks)",
            [
                _expr(_per_second(search(opts, "GenerationTokens", m, "Sum", pack=True)), "", "g"),
            ],
            stat="Sum",
            unit_label="tokens/s",
        ),
        _graph(
            opts,
            "KV-cache utilization per model (%, worst task)",
            [
                _expr(search(opts, "KvCacheUtilization", m, "Maximum", pack=True), "", "k"),
            ],
            stat="Maximum",
            unit_label="percent",
            annotations=[{"value": opts.kv_cache_utilization, "label": "alarm"}],
        ),
        _graph(
            opts,
            "Requests waiting per model (worst task)",
            [
                _expr(search(opts, "RequestsWaiting", m, "Maximum", pack=True), "", "w"),
            ],
            stat="Maximum",
            unit_label="requests",
        ),
        _graph(
            opts,
            "End-to-end request latency per model (s, percentiles over all tasks)",
            [
                _expr(search(opts, "EndToEndLatency", m, stat, pack=True), label, f"e{i}")
                for i, (stat, label) in enumerate(percentiles)
            ],
            stat="p95",
            unit_label="seconds",
        ),
    ]
    return [g for g in graphs if g is not None]


def _per_second(expression: str | None) -> str | None:
    """A per-period Sum as a per-second rate (the period is the graph's, PERIOD seconds)."""
    return None if expression is None else f"{expression}/{PERIOD}"
