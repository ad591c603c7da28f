"""Per model: throughput, success and failure, latency, queue versus compute, batch size, queue depth.

One row of :data:`GRAPHS` per widget: title, the metric (or metrics, with a label each), the dimension
set its SEARCH runs over, the statistic, the y-axis label and an annotation from the render options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..base.options import Options
from ..base.widgets import Placed, Section, expr, graph, search

TEXT = (
    "**Per model**: throughput, success and failure, latency (average, p95, p99; and the p99 over every task "
    "from Triton's first-response histogram of models that are not decoupled, 26.01+), queue versus compute "
    "time and p99 queue time (the saturation signal), batch size and queue depth; new models appear by "
    "themselves (SEARCH on the model dimension)."
)

MV = ("model", "version")
M = ("model",)
Annotation = Callable[[Options], list[dict[str, Any]]]


@dataclass(frozen=True)
class Graph:
    title: str
    series: tuple[tuple[str, str, str], ...]  # (metric, label, row id); label "": SEARCH names each series
    dims: tuple[str, ...]
    stat: str
    unit_label: str
    annotations: Annotation | None = None


def _one(metric: str) -> tuple[tuple[str, str, str], ...]:
    return ((metric, "", "e1"),)


GRAPHS: tuple[Graph, ...] = (
    Graph("Throughput per version (req/s, average over tasks)", _one("RequestsPerSecond"), MV, "Average", "req/s"),
    Graph("Successful requests per model (sum per period)", _one("RequestSuccess"), M, "Sum", "requests"),
    Graph(
        "Failed requests per model (sum per period)",
        _one("RequestFailure"),
        M,
        "Sum",
        "requests",
        lambda o: [{"value": o.failure_threshold, "label": "alarm (per 5 min)"}],
    ),
    Graph("Average request latency per version (us)", _one("RequestLatencyAvg"), MV, "Average", "microseconds"),
    Graph(
        "p95 latency per model (us, worst task)",
        _one("RequestLatencyP95"),
        M,
        "Maximum",
        "microseconds",
        lambda o: [{"value": o.latency_slo_us, "label": "SLO"}],
    ),
    Graph("p99 latency per version (us, worst task)", _one("RequestLatencyP99"), MV, "Maximum", "microseconds"),
    Graph(
        "p99 request latency per model (ms, over every task; models that are not decoupled, Triton 26.01+)",
        _one("RequestLatency"),
        M,
        "p99",
        "milliseconds",
    ),
    Graph(
        "p99 queue time per model (us, worst task): the saturation signal",
        _one("QueueLatencyP99"),
        M,
        "Maximum",
        "microseconds",
    ),
    Graph(
        "Queue vs compute time per request (us)",
        (("QueueLatencyAvg", "queue", "q"), ("ComputeLatencyAvg", "compute", "c")),
        MV,
        "Average",
        "microseconds",
    ),
    Graph("Average batch size per version", _one("AverageBatchSize"), MV, "Average", "inferences/execution"),
    Graph("Pending requests per version (max over tasks)", _one("PendingRequests"), MV, "Maximum", "requests"),
    Graph("Version ready (1) per version (min over tasks)", _one("ModelReady"), MV, "Minimum", "ready"),
)


def widgets(opts: Options) -> list[Placed]:
    return [
        Placed(
            graph(
                opts,
                g.title,
                [expr(search(opts, metric, g.dims, g.stat), label, id_) for metric, label, id_ in g.series],
                stat=g.stat,
                unit_label=g.unit_label,
                annotations=g.annotations(opts) if g.annotations else None,
            )
        )
        for g in GRAPHS
    ]


SECTION = Section(TEXT, widgets)
