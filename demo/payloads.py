"""Synthetic /metrics bodies in Triton's exact shape, for benchmarks, soak and golden tests.

The shape (families, label order, HELP/TYPE lines, failure reasons, summary
quantiles) copies what Triton 2.51 printed in tests against the real server;
``gpus`` adds DCGM-style ``nv_gpu_*`` series keyed by ``gpu_uuid`` as a GPU
host prints them.
"""

from __future__ import annotations

from collections.abc import Sequence

REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")
QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")
COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds"),
)
SUMMARIES = (
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)


def model_names(n: int) -> list[str]:
    return [f"model_{i:05d}" for i in range(n)]


def triton_metrics(
    models: Sequence[str] | int,
    step: int = 1,
    gpus: Sequence[str] = (),
    summaries: bool = True,
    version: str = "1",
) -> str:
    """A /metrics body for ``models`` after ``step`` rounds of identical traffic.

    Per model and round: 10 requests (1 BACKEND failure), 12 inferences in 6
    executions, 2000 us per request of which 200 us queue and 1500 us compute.
    Counters grow linearly with ``step`` so two steps give known deltas.
    """
    names = model_names(models) if isinstance(models, int) else list(models)
    out: list[str] = []
    per_model = {
        "nv_inference_request_success": 9,
        "nv_inference_count": 12,
        "nv_inference_exec_count": 6,
        "nv_inference_request_duration_us": 18000,
        "nv_inference_queue_duration_us": 1800,
        "nv_inference_compute_input_duration_us": 900,
        "nv_inference_compute_infer_duration_us": 11700,
        "nv_inference_compute_output_duration_us": 900,
    }
    for family, help_text in COUNTERS:
        out.append(f"# HELP {family} {help_text}")
        out.append(f"# TYPE {family} counter")
        for m in names:
            lab = f'model="{_esc(m)}"'
            if family == "nv_inference_request_failure":
                for reason in REASONS:
                    v = step if reason == "BACKEND" else 0
                    out.append(f'{family}{{{lab},reason="{reason}",version="{version}"}} {v}')
            else:
                out.append(f'{family}{{{lab},version="{version}"}} {per_model[family] * step}')
    out.append(
        "# HELP nv_inference_pending_request_count "
        "Instantaneous number of pending requests awaiting execution per-model."
    )
    out.append("# TYPE nv_inference_pending_request_count gauge")
    for m in names:
        out.append(f'nv_inference_pending_request_count{{model="{_esc(m)}",version="{version}"}} 0')
    out += _gpu_lines(gpus, step)
    out += [
        "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]",
        "# TYPE nv_cpu_utilization gauge",
        "nv_cpu_utilization 0.25",
        "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes",
        "# TYPE nv_cpu_memory_used_bytes gauge",
        "nv_cpu_memory_used_bytes 318595072",
    ]
    if summaries:
        for family in SUMMARIES:
            out.append(f"# HELP {family} Summary of {family}")
            out.append(f"# TYPE {family} summary")
            for m in names:
                lab = f'model="{_esc(m)}",version="{version}"'
                out.append(f"{family}_count{{{lab}}} {9 * step}")
                out.append(f"{family}_sum{{{lab}}} {18000 * step}")
                for i, q in enumerate(QUANTILES):
                    out.append(f'{family}{{{lab},quantile="{q}"}} {1800 + 100 * i + step % 7}')
    return "\n".join(out) + "\n"


GPU_FAMILIES = (  # name, type, value for step s (as Triton/DCGM print them)
    ("nv_gpu_utilization", "gauge", lambda s: 0.5),
    ("nv_gpu_memory_total_bytes", "gauge", lambda s: 24000000000),
    ("nv_gpu_memory_used_bytes", "gauge", lambda s: 6000000000),
    ("nv_gpu_power_usage", "gauge", lambda s: 120.5),
    ("nv_gpu_power_limit", "gauge", lambda s: 300),
    ("nv_energy_consumption", "counter", lambda s: 7230 * s),
)


def _gpu_lines(gpus: Sequence[str], step: int) -> list[str]:
    """One block per family, every GPU inside it: the format keeps a family together."""
    out: list[str] = []
    if not gpus:
        return out
    for family, kind, value in GPU_FAMILIES:
        out.append(f"# TYPE {family} {kind}")
        out += [f'{family}{{gpu_uuid="{uuid}"}} {value(step)}' for uuid in gpus]
    return out


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
