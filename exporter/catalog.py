"""Every metric the exporter can emit, defined once.

The exporter's transform, ``python -m exporter catalog``, docs/metrics.md,
the dashboards, alarms and the cost estimate are all derived from
``CATALOG``; tests/test_catalog_agreement.py proves they agree.

A metric is computed from *series*: samples a source produced, keyed by
name and labels. Triton's series keep their Prometheus names
(``nv_inference_count``); the NVML source names its series ``nvml_*`` in SI
units (watts, joules, celsius). Where two sources can supply one quantity
(Triton's DCGM ``nv_gpu_utilization`` and NVML), a metric lists both inputs
and the first one present wins, so one GPU is one line on a dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# CloudWatch's units, as the aws-embedded-metrics library's Unit enum lists them. Importing that
# library costs ~23 MB of RSS (its package __init__ pulls in its whole logger stack), so the list is
# kept here and tests/test_emf.py proves it equals the library's enum, which stays the reference.
CLOUDWATCH_UNITS = (
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
    "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
    "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
    "Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None",
)


class Unit(StrEnum):
    """The units this catalog uses (a subset of CLOUDWATCH_UNITS)."""

    SECONDS = "Seconds"
    MICROSECONDS = "Microseconds"
    MILLISECONDS = "Milliseconds"
    BYTES = "Bytes"
    PERCENT = "Percent"
    COUNT = "Count"
    COUNT_PER_SECOND = "Count/Second"
    NONE = "None"



class Scope(StrEnum):
    """What one EMF event describes; fixes the event's base dimensions."""

    MODEL = "model"  # one model version: dimensions model, version
    GPU = "gpu"  # one GPU: dimension gpu (index); uuid is a property
    TASK = "task"  # the Triton server of this task: no dimensions
    SOURCE = "source"  # one scrape source: dimension source


BASE_DIMENSIONS: dict[Scope, tuple[str, ...]] = {
    Scope.MODEL: ("model", "version"),
    Scope.GPU: ("gpu",),
    Scope.TASK: (),
    Scope.SOURCE: ("source",),
}


class Kind(StrEnum):
    """How a value is computed from its inputs over one window."""

    GAUGE = "gauge"  # last value (combined across GPU instances)
    DELTA = "delta"  # counter increase over the window
    RATE = "rate"  # counter increase / elapsed seconds (monotonic clock)
    RATIO = "ratio"  # delta(numerators) / delta(denominators), only when the denominator > 0
    GAUGE_RATIO = "gauge_ratio"  # gauge / gauge, only when the denominator > 0
    QUANTILE = "quantile"  # a summary quantile, only when the summary counted requests in the window
    HISTOGRAM_QUANTILE = "histogram_quantile"  # interpolated from bucket deltas of the window
    STATE = "state"  # from the repository index
    SELF = "self"  # the exporter's own bookkeeping


class Combine(StrEnum):
    """How series of one entity are merged (a model on several GPUs has one series per gpu_uuid)."""

    SUM = "sum"
    MAX = "max"


@dataclass(frozen=True)
class Input:
    """One source series; ``where`` selects a value of the family's split label (reason, quantile)."""

    series: str
    scale: float = 1.0
    where: str | None = None


@dataclass(frozen=True)
class Metric:
    name: str
    scope: Scope
    unit: str
    kind: Kind
    help: str
    inputs: tuple[Input, ...] = ()
    denominators: tuple[Input, ...] = ()
    guard: Input | None = None  # QUANTILE: emitted only when this counter grew in the window
    quantile: float | None = None  # HISTOGRAM_QUANTILE
    combine: Combine = Combine.SUM
    rollups: tuple[tuple[str, ...], ...] = ()  # extra dimension sets, each a billed metric
    source: str = "triton"

    @property
    def dimension_sets(self) -> tuple[tuple[str, ...], ...]:
        return (BASE_DIMENSIONS[self.scope], *self.rollups)

    def describe_inputs(self) -> str:
        """The computation as a formula: ``a | b`` first present, ``a + b`` summed, ``x / y`` a ratio."""

        def one(i: Input) -> str:
            s = i.series + (f"{{{SPLIT_LABELS.get(i.series, 'label')}={i.where}}}" if i.where else "")
            return s + (f" x {i.scale:g}" if i.scale != 1 else "")

        def group(inputs: tuple[Input, ...], sep: str) -> str:
            text = sep.join(one(i) for i in inputs)
            return f"({text})" if len(inputs) > 1 else text

        if self.kind is Kind.RATIO:
            return f"delta {group(self.inputs, ' + ')} / delta {group(self.denominators, ' + ')}"
        if self.kind is Kind.GAUGE_RATIO:
            return f"{group(self.inputs, ' | ')} / {group(self.denominators, ' | ')} (pairwise, first present)"
        if self.kind is Kind.QUANTILE and self.guard:
            return f"{group(self.inputs, ' | ')} when delta {one(self.guard)} > 0"
        if self.kind is Kind.HISTOGRAM_QUANTILE:
            return f"histogram_quantile({self.quantile:g}, delta {one(self.inputs[0])})"
        if self.inputs:
            prefix = {Kind.DELTA: "delta ", Kind.RATE: "rate "}.get(self.kind, "")
            return prefix + group(self.inputs, " | ")
        return self.source


# The label that splits a family into sub-series a metric can select with Input.where.
SPLIT_LABELS: dict[str, str] = {
    "nv_inference_request_failure": "reason",
    "nv_inference_request_summary_us": "quantile",
    "nv_inference_first_response_histogram_ms_bucket": "le",
}

FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")

M, G, T, S = Scope.MODEL, Scope.GPU, Scope.TASK, Scope.SOURCE
MODEL_ROLLUP = (("model",),)
SERVICE_ROLLUP = ((),)

_SUCCESS = Input("nv_inference_request_success")
_COMPUTE = (
    Input("nv_inference_compute_input_duration_us"),
    Input("nv_inference_compute_infer_duration_us"),
    Input("nv_inference_compute_output_duration_us"),
)


def _m(name: str, scope: Scope, unit: Unit, kind: Kind, help: str, *inputs: Input | str, **kw: object) -> Metric:
    ins = tuple(Input(i) if isinstance(i, str) else i for i in inputs)
    return Metric(name, scope, unit.value, kind, help, ins, **kw)  # type: ignore[arg-type]


CATALOG: tuple[Metric, ...] = (
    # --- per model version ------------------------------------------------------------------
    _m("RequestSuccess", M, Unit.COUNT, Kind.DELTA, "Successful inference requests in the window.",
       _SUCCESS, rollups=(("model",), ())),
    _m("RequestFailure", M, Unit.COUNT, Kind.DELTA, "Failed inference requests in the window, all reasons.",
       "nv_inference_request_failure", rollups=(("model",), ())),
    *(
        _m(f"RequestFailure{r.title()}", M, Unit.COUNT, Kind.DELTA,
           f"Failed inference requests in the window with Triton reason {r}.",
           Input("nv_inference_request_failure", where=r))
        for r in FAILURE_REASONS
    ),
    _m("InferenceCount", M, Unit.COUNT, Kind.DELTA, "Inferences performed in the window (a batch of 8 counts 8).",
       "nv_inference_count"),
    _m("ExecutionCount", M, Unit.COUNT, Kind.DELTA, "Model executions in the window (one per batch).",
       "nv_inference_exec_count"),
    _m("RequestsPerSecond", M, Unit.COUNT_PER_SECOND, Kind.RATE,
       "Successful requests per second over the window's real elapsed time.", _SUCCESS),
    _m("InferencesPerSecond", M, Unit.COUNT_PER_SECOND, Kind.RATE, "Inferences per second over the window.",
       "nv_inference_count"),
    _m("AverageBatchSize", M, Unit.NONE, Kind.RATIO, "Inferences per execution in the window.",
       "nv_inference_count", denominators=(Input("nv_inference_exec_count"),)),
    _m("RequestLatencyAvg", M, Unit.MICROSECONDS, Kind.RATIO,
       "Average end-to-end request time in the window (cumulative duration delta / request delta).",
       "nv_inference_request_duration_us", denominators=(_SUCCESS,)),
    _m("QueueLatencyAvg", M, Unit.MICROSECONDS, Kind.RATIO, "Average time a request waited in the queue.",
       "nv_inference_queue_duration_us", denominators=(_SUCCESS,)),
    _m("ComputeLatencyAvg", M, Unit.MICROSECONDS, Kind.RATIO,
       "Average compute time per request (input + infer + output).", *_COMPUTE, denominators=(_SUCCESS,)),
    _m("ComputeInputLatencyAvg", M, Unit.MICROSECONDS, Kind.RATIO, "Average input-copy time per request.",
       _COMPUTE[0], denominators=(_SUCCESS,)),
    _m("ComputeInferLatencyAvg", M, Unit.MICROSECONDS, Kind.RATIO, "Average model execution time per request.",
       _COMPUTE[1], denominators=(_SUCCESS,)),
    _m("ComputeOutputLatencyAvg", M, Unit.MICROSECONDS, Kind.RATIO, "Average output-copy time per request.",
       _COMPUTE[2], denominators=(_SUCCESS,)),
    *(
        _m(f"RequestLatencyP{p}", M, Unit.MICROSECONDS, Kind.QUANTILE,
           f"p{p} request latency from Triton's summary (60 s sliding window; needs "
           "--metrics-config summary_latencies=true); only when requests arrived in the window.",
           Input("nv_inference_request_summary_us", where=q),
           guard=_SUCCESS, combine=Combine.MAX,
           rollups=MODEL_ROLLUP if p == "95" else ())
        for p, q in (("50", "0.5"), ("95", "0.95"), ("99", "0.99"))
    ),
    *(
        _m(f"FirstResponseLatencyP{p}", M, Unit.MILLISECONDS, Kind.HISTOGRAM_QUANTILE,
           f"p{p} time to first response, interpolated from the window's histogram bucket deltas "
           "(Triton 24.11+, --metrics-config histogram_latencies=true).",
           "nv_inference_first_response_histogram_ms_bucket", quantile=q)
        for p, q in (("50", 0.5), ("95", 0.95), ("99", 0.99))
    ),
    _m("PendingRequests", M, Unit.COUNT, Kind.GAUGE, "Requests waiting to execute at scrape time.",
       "nv_inference_pending_request_count"),
    _m("ModelLoadDuration", M, Unit.SECONDS, Kind.GAUGE, "Time the last load of this model took (Triton 24.11+).",
       "nv_model_load_duration_secs", combine=Combine.MAX),
    _m("ModelReady", M, Unit.NONE, Kind.STATE,
       "1 when the repository index says READY, else 0; versions unloaded on purpose are not reported.",
       source="index"),
    # --- per GPU ------------------------------------------------------------------------------
    _m("GpuUtilization", G, Unit.PERCENT, Kind.GAUGE, "GPU busy time, percent.",
       Input("nv_gpu_utilization", scale=100.0), "nvml_gpu_utilization_percent", rollups=SERVICE_ROLLUP),
    _m("GpuMemoryUsed", G, Unit.BYTES, Kind.GAUGE, "GPU memory in use.",
       "nv_gpu_memory_used_bytes", "nvml_memory_used_bytes"),
    _m("GpuMemoryTotal", G, Unit.BYTES, Kind.GAUGE, "GPU memory size.",
       "nv_gpu_memory_total_bytes", "nvml_memory_total_bytes"),
    Metric("GpuMemoryUsedPercent", G, Unit.PERCENT.value, Kind.GAUGE_RATIO, "GPU memory in use, percent of total.",
           inputs=(Input("nv_gpu_memory_used_bytes", 100.0), Input("nvml_memory_used_bytes", 100.0)),
           denominators=(Input("nv_gpu_memory_total_bytes"), Input("nvml_memory_total_bytes")),
           rollups=SERVICE_ROLLUP),
    _m("GpuPowerWatts", G, Unit.NONE, Kind.GAUGE, "Power draw in watts (CloudWatch has no Watts unit).",
       "nv_gpu_power_usage", "nvml_power_usage_watts"),
    _m("GpuPowerLimitWatts", G, Unit.NONE, Kind.GAUGE, "Enforced power limit in watts.",
       "nv_gpu_power_limit", "nvml_power_limit_watts"),
    _m("GpuEnergyJoules", G, Unit.NONE, Kind.DELTA, "Energy used in the window, joules.",
       "nv_energy_consumption", "nvml_energy_joules"),
    _m("GpuMemoryControllerUtilization", G, Unit.PERCENT, Kind.GAUGE, "Memory controller busy time, percent.",
       "nvml_memory_utilization_percent", source="nvml"),
    _m("GpuMemoryReserved", G, Unit.BYTES, Kind.GAUGE, "GPU memory reserved by the driver.",
       "nvml_memory_reserved_bytes", source="nvml"),
    _m("GpuTemperatureCelsius", G, Unit.NONE, Kind.GAUGE, "GPU core temperature, degrees Celsius.",
       "nvml_temperature_gpu_celsius", source="nvml"),
    _m("GpuMemoryTemperatureCelsius", G, Unit.NONE, Kind.GAUGE, "HBM temperature, degrees Celsius.",
       "nvml_temperature_memory_celsius", source="nvml"),
    _m("GpuSmClockMHz", G, Unit.NONE, Kind.GAUGE, "SM clock, MHz.", "nvml_clock_sm_mhz", source="nvml"),
    _m("GpuMemoryClockMHz", G, Unit.NONE, Kind.GAUGE, "Memory clock, MHz.", "nvml_clock_memory_mhz", source="nvml"),
    _m("GpuThrottleThermal", G, Unit.NONE, Kind.GAUGE, "1 while clocks are held down by temperature.",
       "nvml_throttle_thermal", source="nvml"),
    _m("GpuThrottlePowerCap", G, Unit.NONE, Kind.GAUGE, "1 while clocks are held down by the power cap.",
       "nvml_throttle_power_cap", source="nvml"),
    _m("GpuThrottleHwSlowdown", G, Unit.NONE, Kind.GAUGE, "1 while hardware slowdown is engaged.",
       "nvml_throttle_hw_slowdown", source="nvml"),
    _m("GpuEccCorrectedErrors", G, Unit.COUNT, Kind.DELTA, "Corrected ECC errors in the window (volatile).",
       "nvml_ecc_corrected_total", source="nvml"),
    _m("GpuEccUncorrectedErrors", G, Unit.COUNT, Kind.DELTA, "Uncorrected ECC errors in the window (volatile).",
       "nvml_ecc_uncorrected_total", source="nvml"),
    _m("GpuRemappedRowsCorrectable", G, Unit.COUNT, Kind.GAUGE, "Rows remapped for correctable errors.",
       "nvml_remapped_rows_correctable", source="nvml"),
    _m("GpuRemappedRowsUncorrectable", G, Unit.COUNT, Kind.GAUGE, "Rows remapped for uncorrectable errors.",
       "nvml_remapped_rows_uncorrectable", source="nvml"),
    _m("GpuRemappedRowsPending", G, Unit.NONE, Kind.GAUGE, "1 when a row remap waits for a GPU reset.",
       "nvml_remapped_rows_pending", source="nvml"),
    _m("GpuRemappedRowsFailure", G, Unit.NONE, Kind.GAUGE, "1 when a row remap failed (replace the GPU).",
       "nvml_remapped_rows_failure", source="nvml"),
    _m("GpuPcieReplays", G, Unit.COUNT, Kind.DELTA, "PCIe replay events in the window.",
       "nvml_pcie_replay_total", source="nvml"),
    _m("GpuXidErrors", G, Unit.COUNT, Kind.DELTA, "Critical XID events in the window (last code is a property).",
       "nvml_xid_errors_total", source="nvml"),
    _m("GpuLost", G, Unit.NONE, Kind.GAUGE, "1 when NVML reports the GPU as lost (fell off the bus).",
       "nvml_gpu_lost", source="nvml"),
    # --- per task -----------------------------------------------------------------------------
    _m("TritonUp", T, Unit.NONE, Kind.SELF, "1 when both the /metrics scrape and the repository index answered.",
       source="exporter"),
    _m("ModelsReady", T, Unit.COUNT, Kind.STATE, "Model versions READY in the repository index.", source="index"),
    _m("ModelsNotReady", T, Unit.COUNT, Kind.STATE,
       "Model versions not READY (loading or failed), excluding versions unloaded on purpose.", source="index"),
    _m("ModelLoadSuccessRate", T, Unit.PERCENT, Kind.STATE,
       "READY / (READY + failed) versions, percent; loading and unloaded versions are left out.", source="index"),
    _m("CpuUtilization", T, Unit.PERCENT, Kind.GAUGE, "Host CPU use as Triton reports it, percent.",
       Input("nv_cpu_utilization", scale=100.0)),
    _m("CpuMemoryUsed", T, Unit.BYTES, Kind.GAUGE, "Host memory in use as Triton reports it.",
       "nv_cpu_memory_used_bytes"),
    _m("ScrapeDuration", T, Unit.MILLISECONDS, Kind.SELF, "Time to collect all sources this cycle.",
       source="exporter"),
    _m("SeriesKept", T, Unit.COUNT, Kind.SELF, "Source series used this cycle.", source="exporter"),
    _m("SeriesDropped", T, Unit.COUNT, Kind.SELF,
       "Series left out this cycle by the model cardinality cap (--max-models).", source="exporter"),
    _m("ParseErrors", T, Unit.COUNT, Kind.SELF, "Malformed /metrics lines of wanted families, skipped.",
       source="exporter"),
    _m("CounterResets", T, Unit.COUNT, Kind.SELF,
       "Entities whose counters went down (restart, reload) and restarted from a new baseline.", source="exporter"),
    _m("EventsDropped", T, Unit.COUNT, Kind.SELF, "EMF events the sink dropped since the last cycle.",
       source="exporter"),
    _m("ExporterHeartbeat", T, Unit.COUNT, Kind.SELF, "1 per cycle: alarm on its absence.", source="exporter"),
    # --- per source ---------------------------------------------------------------------------
    _m("SourceUp", S, Unit.NONE, Kind.SELF, "1 when the source answered this cycle.", source="exporter"),
    _m("SourceDuration", S, Unit.MILLISECONDS, Kind.SELF, "Time the source took this cycle.", source="exporter"),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOG}



def wanted_series() -> frozenset[str]:
    """Sample names the /metrics parser must keep (everything else is skipped unread)."""
    names = {i.series for m in CATALOG for i in (*m.inputs, *m.denominators, *((m.guard,) if m.guard else ()))}
    return frozenset(n for n in names if n.startswith("nv_"))


def counter_series() -> frozenset[str]:
    """Series whose values are cumulative and must go through the delta state."""
    kinds = (Kind.DELTA, Kind.RATE, Kind.RATIO, Kind.HISTOGRAM_QUANTILE)
    out = {i.series for m in CATALOG if m.kind in kinds for i in (*m.inputs, *m.denominators)}
    out |= {m.guard.series for m in CATALOG if m.guard}
    return frozenset(out)
