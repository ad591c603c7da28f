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
        "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes",
        "# TYPE nv_cpu_memory_total_bytes gauge",
        "nv_cpu_memory_total_bytes 25276502016",
        "# HELP nv_pinned_memory_pool_total_bytes Pinned memory pool total memory size, in bytes",
        "# TYPE nv_pinned_memory_pool_total_bytes gauge",
        "nv_pinned_memory_pool_total_bytes 268435456",
        "# HELP nv_pinned_memory_pool_used_bytes Pinned memory pool used memory size, in bytes",
        "# TYPE nv_pinned_memory_pool_used_bytes gauge",
        "nv_pinned_memory_pool_used_bytes 0",
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


# --- LLM backends --------------------------------------------------------------------------------
# Families, types, labels and buckets exactly as the vLLM backend (through pb_utils.MetricFamily) and
# the TensorRT-LLM backend publish them; the values are a fixed amount of traffic per step.

VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
VLLM_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5)
VLLM_E2E_BUCKETS = (1, 2.5, 5, 10, 15, 20, 30, 40, 50, 60)
VLLM_LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)  # 1-2-5 up to max_model_len 4096
VLLM_N_BUCKETS = (1, 2, 5, 10, 20)
TRT_LENGTH_BUCKETS = (10, 50, 100, 500, 1000)
FIRST_RESPONSE_BUCKETS = (100, 500, 2000, 5000)  # Triton's default for histogram_latencies

# Per model and step: observations as (value, count); the sum of a histogram is sum(value * count).
VLLM_STEP = {
    "vllm:time_to_first_token_seconds": (VLLM_TTFT_BUCKETS, ((0.05, 4), (0.07, 5), (0.3, 1))),
    "vllm:time_per_output_token_seconds": (VLLM_TPOT_BUCKETS, ((0.03, 1990),)),
    "vllm:e2e_request_latency_seconds": (VLLM_E2E_BUCKETS, ((3.0, 10),)),
    "vllm:request_prompt_tokens": (VLLM_LENGTH_BUCKETS, ((100, 10),)),
    "vllm:request_generation_tokens": (VLLM_LENGTH_BUCKETS, ((200, 10),)),
    "vllm:request_params_n": (VLLM_N_BUCKETS, ((1, 10),)),
}
VLLM_COUNTERS = {"vllm:prompt_tokens_total": 1000, "vllm:generation_tokens_total": 2000}
TRT_HISTOGRAMS = {
    "nv_llm_input_token_len": ("total_input_tokens", ((250, 10),)),
    "nv_llm_output_token_len": ("total_output_tokens", ((80, 10),)),
}
TRT_GAUGES = {  # family -> (category label, {value: gauge})
    "nv_trt_llm_request_metrics": (
        "request_type",
        {"active": 4, "max": 64, "scheduled": 2, "context": 1, "waiting": 2},  # waiting = active - scheduled
    ),
    "nv_trt_llm_runtime_memory_metrics": (
        "memory_type",
        {"cpu": 1_073_741_824, "gpu": 21_474_836_480, "pinned": 104_857_600},
    ),
    "nv_trt_llm_kv_cache_block_metrics": (
        "kv_cache_block_type",
        {"max": 1000, "free": 600, "used": 400, "tokens_per": 64, "reused": 10, "fraction": 0.4},
    ),
    "nv_trt_llm_inflight_batcher_metrics": (
        "inflight_batcher_specific_metric",
        {"total_context_tokens": 512, "generation_requests": 3, "micro_batch_id": 0, "paused_requests": 0},
    ),
    "nv_trt_llm_general_metrics": ("general_type", {"timestamp": 1_796_000_000_000_000, "iteration_counter": 9}),
}
TRT_GROWING = {"iteration_counter"}  # gauges that only grow: value x step
TRT_DISAGGREGATED = {"kv_cache_transfer_ms": 45.0, "request_count": 10}  # counters per step


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _histogram(
    family: str, labels: str, buckets: Sequence[float], obs: Sequence[tuple[float, int]], step: int
) -> list[str]:
    """Cumulative bucket lines, _sum and _count after ``step`` rounds of ``obs``."""
    out = []
    for le in (*buckets, float("inf")):
        n = sum(c for v, c in obs if v <= le) * step
        out.append(f'{family}_bucket{{{labels},le="{"+Inf" if le == float("inf") else _num(le)}"}} {n}')
    out.append(f"{family}_sum{{{labels}}} {_num(round(sum(v * c for v, c in obs) * step, 9))}")
    out.append(f"{family}_count{{{labels}}} {sum(c for _, c in obs) * step}")
    return out


def llm_metrics(models: Sequence[str] | int, step: int = 1, backend: str = "vllm", version: str = "1") -> str:
    """The LLM backend's own families for ``models`` after ``step`` rounds of identical traffic.

    vLLM, per model and round: 10 requests, 1000 prompt and 2000 generated tokens, time to first token
    4 x 50 ms + 5 x 70 ms + 1 x 300 ms. TensorRT-LLM: fixed gauges (KV cache 40 % used, 2 waiting),
    9 engine iterations, 10 KV-cache transfers of 4.5 ms and 10 requests of 250 input and 80 output tokens.
    """
    names = model_names(models) if isinstance(models, int) else list(models)
    out: list[str] = []
    if backend == "vllm":
        for family, per_step in VLLM_COUNTERS.items():
            out += [f"# HELP {family} Number of tokens.", f"# TYPE {family} counter"]
            out += [f'{family}{{model="{_esc(m)}",version="{version}"}} {per_step * step}' for m in names]
        for family, (buckets, obs) in VLLM_STEP.items():
            out += [f"# HELP {family} Histogram of {family}.", f"# TYPE {family} histogram"]
            for m in names:
                out += _histogram(family, f'model="{_esc(m)}",version="{version}"', buckets, obs, step)
    elif backend == "tensorrt_llm":
        for family, (label, values) in TRT_GAUGES.items():
            out += [f"# HELP {family} TRT LLM metrics", f"# TYPE {family} gauge"]
            for m in names:
                for k, v in values.items():  # labels in name order, as Triton prints them
                    labels = ",".join(
                        f'{n}="{x}"' for n, x in sorted({label: k, "model": _esc(m), "version": version}.items())
                    )
                    out.append(f"{family}{{{labels}}} {_num(v * step if k in TRT_GROWING else v)}")
        family = "nv_trt_llm_disaggregated_serving_metrics"
        out += [f"# HELP {family} TRT LLM disaggregated serving metrics", f"# TYPE {family} counter"]
        for m in names:
            for k, v in TRT_DISAGGREGATED.items():
                labels = ",".join(
                    f'{n}="{x}"'
                    for n, x in sorted({"disaggregated_serving_type": k, "model": _esc(m), "version": version}.items())
                )
                out.append(f"{family}{{{labels}}} {_num(v * step)}")
        for family, (kind, obs) in TRT_HISTOGRAMS.items():
            out += [f"# HELP {family} Token length", f"# TYPE {family} histogram"]
            for m in names:
                labels = f'model="{_esc(m)}",response_metric_type="{kind}",version="{version}"'
                out += _histogram(family, labels, TRT_LENGTH_BUCKETS, obs, step)
    else:
        raise ValueError(f"unknown backend {backend!r}")
    return "\n".join(out) + "\n"


def first_response_metrics(models: Sequence[str] | int, step: int = 1, version: str = "1") -> str:
    """Triton's own nv_inference_first_response_histogram_ms (histogram_latencies=true), default buckets.

    Per model and round: 10 first responses, 6 x 150 ms, 3 x 700 ms, 1 x 2500 ms.
    """
    names = model_names(models) if isinstance(models, int) else list(models)
    family = "nv_inference_first_response_histogram_ms"
    out = [f"# HELP {family} Duration from request to first response in milliseconds", f"# TYPE {family} histogram"]
    for m in names:
        out += _histogram(
            family,
            f'model="{_esc(m)}",version="{version}"',
            FIRST_RESPONSE_BUCKETS,
            ((150, 6), (700, 3), (2500, 1)),
            step,
        )
    return "\n".join(out) + "\n"
