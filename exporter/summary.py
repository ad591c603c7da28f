"""The human half of ``--once``: a table per model and per GPU on stderr."""

from __future__ import annotations

from typing import Any

from catalog import Scope
from telemetry.emf import Event

from .coverage import grouped
from .pipeline import CycleResult

MODEL_COLUMNS = (
    ("req/s", "RequestsPerSecond", "{:.2f}"),
    ("ok", "RequestSuccess", "{:.0f}"),
    ("fail", "RequestFailure", "{:.0f}"),
    ("avg ms", "RequestLatencyAvg", "{:.2f}", 1e-3),
    ("p95 ms", "RequestLatencyP95", "{:.2f}", 1e-3),
    ("queue ms", "QueueLatencyAvg", "{:.2f}", 1e-3),
    ("batch", "AverageBatchSize", "{:.2f}"),
    ("pending", "PendingRequests", "{:.0f}"),
)
LLM_COLUMNS = (  # (header, metric, format, scale); a distribution's column shows its p95 (see _cell)
    ("TTFT p95 ms", "TimeToFirstToken", "{:.1f}"),
    ("ITL p95 ms", "InterTokenLatency", "{:.1f}"),
    ("gen tok/s", "GenerationTokensPerSecond", "{:.1f}"),
    ("prompt tok/s", "PromptTokensPerSecond", "{:.1f}"),
    ("KV %", "KvCacheUtilization", "{:.1f}"),
    ("waiting", "RequestsWaiting", "{:.0f}"),
    ("active", "RequestsActive", "{:.0f}"),
)
GPU_COLUMNS = (
    ("util %", "GpuUtilization", "{:.0f}"),
    ("mem %", "GpuMemoryUsedPercent", "{:.0f}"),
    ("power W", "GpuPowerWatts", "{:.0f}"),
    ("temp C", "GpuTemperatureCelsius", "{:.0f}"),
    ("xid", "GpuXidErrors", "{:.0f}"),
    ("sm %", "GpuSmActive", "{:.0f}"),
    ("healthy", "GpuHealthy", "{:.0f}"),
)


def _cell(event: Event, spec: tuple[Any, ...]) -> str:
    name, fmt = spec[1], spec[2]
    scale = spec[3] if len(spec) > 3 else 1.0
    if name in event.values:
        return str(fmt.format(event.values[name] * scale))
    dist = event.distributions.get(name)
    if dist is not None:
        return str(fmt.format(nearest_rank(dist, 0.95) * scale))
    return "-"


def nearest_rank(dist: dict[str, Any], q: float) -> float:
    """A percentile of an EMF distribution (nearest rank over its representative values).

    What CloudWatch computes from the same object across tasks; here for one
    task's window, to read it in the table.
    """
    pairs = sorted(zip(dist["Values"], dist["Counts"], strict=True))
    rank, seen = q * sum(c for _, c in pairs), 0.0
    for value, count in pairs:
        seen += count
        if seen >= rank:
            return float(value)
    return float(pairs[-1][0])


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join(lines) + "\n"


def render_summary(result: CycleResult) -> str:
    window = f"{result.elapsed:.2f}s" if result.elapsed else "baseline"
    out = [
        f"window {window}, {len(result.events)} EMF events, {result.series_kept} series kept, "
        f"{result.series_dropped} dropped, {result.parse_errors} parse errors, {result.resets} counter resets\n"
    ]
    for s in result.statuses:
        out.append(
            f"  source {s.name}: {'up' if s.up else 'DOWN'} in {s.duration_ms:.0f} ms"
            + (f" - {s.error}" if s.error else "")
            + "\n"
        )
    models = sorted(
        (e for e in result.entities if e.scope is Scope.MODEL),
        key=lambda e: (e.dimensions.get("model", ""), e.dimensions.get("version", "")),
    )
    if models:
        rows = []
        for e in models:
            state = str(e.properties.get("state", "-"))
            reason = str(e.properties.get("reason", "")).splitlines()[0][:60] if e.properties.get("reason") else ""
            rows.append(
                [e.dimensions["model"], e.dimensions["version"], state, *(_cell(e, c) for c in MODEL_COLUMNS), reason]
            )
        out.append("\n" + _table(["model", "ver", "state", *(c[0] for c in MODEL_COLUMNS), "reason"], rows))
    gaps = sorted((c for c in result.coverage.values() if c.gaps), key=lambda c: (c.model, c.version))
    missing = {(c.model, c.version): c for c in gaps}
    llm_names = {c[1] for c in LLM_COLUMNS}

    def llm_row(e: Event) -> bool:
        if any(c[1] in e.values or c[1] in e.distributions for c in LLM_COLUMNS):
            return True
        cov = missing.get((e.dimensions["model"], e.dimensions["version"]))
        return cov is not None and any(g.metric in llm_names for g in cov.gaps)

    llm = [e for e in models if llm_row(e)]
    if llm:
        rows = []
        for e in llm:
            cov = missing.get((e.dimensions["model"], e.dimensions["version"]))
            cells = [_cell(e, c) for c in LLM_COLUMNS]
            rows.append([e.dimensions["model"], e.dimensions["version"], *cells, str(len(cov.gaps)) if cov else "-"])
        header = ["model", "ver", *(c[0] for c in LLM_COLUMNS), "not produced"]
        out.append("\nLLM serving (p95 of this task's window)\n" + _table(header, rows))
    if gaps:  # what the exporter logged when these versions appeared, each reason once
        out.append("\nnot produced, and why:\n" + grouped(gaps))
    gpus = sorted((e for e in result.entities if e.scope is Scope.GPU), key=lambda e: e.dimensions.get("gpu", ""))
    if gpus:
        rows = [
            [
                e.dimensions["gpu"],
                str(e.properties.get("gpu_uuid", "")),
                *(_cell(e, c) for c in GPU_COLUMNS),
                str(e.properties.get("health", "")),  # the verdict, with the reason when unhealthy
            ]
            for e in gpus
        ]
        out.append("\n" + _table(["gpu", "uuid", *(c[0] for c in GPU_COLUMNS), "health"], rows))
    else:
        out.append("\nno GPU series (CPU-only host, or no NVML/DCGM)\n")
    return "".join(out)
