"""LLM serving: time to first token, inter-token and end-to-end latency, tokens/s, KV cache, waiting requests.

Shown only when the LLM pack's metrics are emitted (every metric is optional). One row of :data:`GRAPHS`
per widget; ``PERCENTILES`` graphs draw p50, p95 and p99 of a CloudWatch distribution over every task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..base.options import Options
from ..base.widgets import Placed, Section, expr, graph, per_second, search

TEXT = (
    "**LLM serving**: time to first token and inter-token latency as percentiles over every task "
    "(CloudWatch distributions), generated tokens per second, KV-cache use and waiting requests (vLLM and "
    "TensorRT-LLM backends; shown when their metrics are emitted)."
)
M = ("model",)
PERCENTILES = (("p50", "p50"), ("p95", "p95"), ("p99", "p99"))


@dataclass(frozen=True)
class Graph:
    title: str
    metric: str
    id_: str  # row id; a percentile graph numbers its rows (t0, t1, t2)
    stat: str  # the graph's statistic; "p95" draws PERCENTILES
    unit_label: str
    per_second: bool = False  # a per-period Sum drawn as a rate
    annotations: Callable[[Options], list[dict[str, Any]]] | None = None


GRAPHS: tuple[Graph, ...] = (
    Graph(
        "Time to first token per model (ms, percentiles over all tasks)",
        "TimeToFirstToken",
        "t",
        "p95",
        "milliseconds",
        annotations=lambda o: [{"value": o.ttft_p95_ms, "label": "p95 alarm"}],
    ),
    Graph(
        "Inter-token latency per model (ms, percentiles over all tasks)",
        "InterTokenLatency",
        "i",
        "p95",
        "milliseconds",
    ),
    Graph("Generated tokens per second per model (all tasks)", "GenerationTokens", "g", "Sum", "tokens/s", True),
    Graph(
        "KV-cache utilization per model (%, worst task)",
        "KvCacheUtilization",
        "k",
        "Maximum",
        "percent",
        annotations=lambda o: [{"value": o.kv_cache_utilization, "label": "alarm"}],
    ),
    Graph("Requests waiting per model (worst task)", "RequestsWaiting", "w", "Maximum", "requests"),
    Graph(
        "End-to-end request latency per model (s, percentiles over all tasks)", "EndToEndLatency", "e", "p95", "seconds"
    ),
)


def _rows(opts: Options, g: Graph) -> list[list[Any] | None]:
    if g.stat == "p95":
        return [
            expr(search(opts, g.metric, M, stat, optional=True), label, f"{g.id_}{i}")
            for i, (stat, label) in enumerate(PERCENTILES)
        ]
    expression = search(opts, g.metric, M, g.stat, optional=True)
    return [expr(per_second(expression) if g.per_second else expression, "", g.id_)]


def widgets(opts: Options) -> list[Placed]:
    return [
        Placed(
            graph(
                opts,
                g.title,
                _rows(opts, g),
                stat=g.stat,
                unit_label=g.unit_label,
                annotations=g.annotations(opts) if g.annotations else None,
            )
        )
        for g in GRAPHS
    ]


SECTION = Section(TEXT, widgets, optional=True)
