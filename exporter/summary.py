"""The human half of ``--once``: a table per model and per GPU on stderr."""

from __future__ import annotations

from .catalog import Scope
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
GPU_COLUMNS = (
    ("util %", "GpuUtilization", "{:.0f}"),
    ("mem %", "GpuMemoryUsedPercent", "{:.0f}"),
    ("power W", "GpuPowerWatts", "{:.0f}"),
    ("temp C", "GpuTemperatureCelsius", "{:.0f}"),
    ("xid", "GpuXidErrors", "{:.0f}"),
)


def _cell(values: dict[str, float], spec: tuple) -> str:
    name, fmt = spec[1], spec[2]
    scale = spec[3] if len(spec) > 3 else 1.0
    return fmt.format(values[name] * scale) if name in values else "-"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join(lines) + "\n"


def render_summary(result: CycleResult) -> str:
    window = f"{result.elapsed:.2f}s" if result.elapsed else "baseline"
    out = [f"window {window}, {len(result.events)} EMF events, {result.series_kept} series kept, "
           f"{result.series_dropped} dropped, {result.parse_errors} parse errors, {result.resets} counter resets\n"]
    for s in result.statuses:
        out.append(f"  source {s.name}: {'up' if s.up else 'DOWN'} in {s.duration_ms:.0f} ms"
                   + (f" - {s.error}" if s.error else "") + "\n")
    models = sorted((e for e in result.entities if e.scope is Scope.MODEL),
                    key=lambda e: (e.dimensions.get("model", ""), e.dimensions.get("version", "")))
    if models:
        rows = []
        for e in models:
            state = str(e.properties.get("state", "-"))
            reason = str(e.properties.get("reason", "")).splitlines()[0][:60] if e.properties.get("reason") else ""
            rows.append([e.dimensions["model"], e.dimensions["version"], state,
                         *(_cell(e.values, c) for c in MODEL_COLUMNS), reason])
        out.append("\n" + _table(["model", "ver", "state", *(c[0] for c in MODEL_COLUMNS), "reason"], rows))
    gpus = sorted((e for e in result.entities if e.scope is Scope.GPU), key=lambda e: e.dimensions.get("gpu", ""))
    if gpus:
        rows = [[e.dimensions["gpu"], str(e.properties.get("gpu_uuid", "")), *(_cell(e.values, c) for c in GPU_COLUMNS)]
                for e in gpus]
        out.append("\n" + _table(["gpu", "uuid", *(c[0] for c in GPU_COLUMNS)], rows))
    else:
        out.append("\nno GPU series (CPU-only host, or no NVML/DCGM)\n")
    return "".join(out)
