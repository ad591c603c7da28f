"""GPU: the health verdict, utilization and memory (secondary to scaling, with their thresholds), GPM
activity, power, and NVML health fields.

:data:`PANELS` is the table of per-GPU graphs: title, (metric, statistic) per series, y-axis label.
"""

from __future__ import annotations

from ..base.options import Options
from ..base.widgets import Placed, Section, emitted, expr, graph, logs, row, search

TEXT = (
    "**GPU**: the health verdict (0 = unhealthy: a fatal XID, a driver recovery action, a lost GPU, a failed row "
    "remap; docs/gpu.md) and the exporter's lines about it, utilization and memory (busy is not overloaded: "
    "utilization only guards scale-in), SM, tensor and DRAM activity (NVML GPM, Hopper and newer), power, and "
    "the NVML health fields (temperature, throttling, XID, ECC, row remapping) when the NVML source is on."
)
G = ("gpu",)
# The exporter's lines about GPU faults (exporter/gpufaults): a GPU turning unhealthy, the drain and its failures.
FAULT_LINES = (
    "fields @timestamp, @message"
    "\n| filter @message like /unhealthy: |GPU drain failed|drained this instance/"
    "\n| sort @timestamp desc\n| limit 50"
)

PANELS: tuple[tuple[str, tuple[tuple[str, str], ...], str], ...] = (
    ("Power draw and limit (W)", (("GpuPowerWatts", "Average"), ("GpuPowerLimitWatts", "Maximum")), "watts"),
    (
        "Temperature (C), NVML",
        (("GpuTemperatureCelsius", "Maximum"), ("GpuMemoryTemperatureCelsius", "Maximum")),
        "celsius",
    ),
    (
        "Clock throttling (1 = active), NVML",
        (("GpuThrottleThermal", "Maximum"), ("GpuThrottlePowerCap", "Maximum"), ("GpuThrottleHwSlowdown", "Maximum")),
        "active",
    ),
    (
        "XID and ECC errors per period, NVML",
        (
            ("GpuXidErrors", "Sum"),
            ("GpuEccUncorrectedErrors", "Sum"),
            ("GpuEccCorrectedErrors", "Sum"),
            ("GpuPcieReplays", "Sum"),
        ),
        "events",
    ),
    (
        "Row remapping and lost GPUs (1 = needs action), NVML",
        (("GpuRemappedRowsPending", "Maximum"), ("GpuRemappedRowsFailure", "Maximum"), ("GpuLost", "Maximum")),
        "flag",
    ),
    ("Memory controller utilization %, NVML", (("GpuMemoryControllerUtilization", "Average"),), "percent"),
)
GPM_PANEL = (
    "SM, tensor and DRAM activity %, NVML GPM (Hopper and newer)",
    (
        ("GpuSmActive", "Average"),
        ("GpuSmOccupancy", "Average"),
        ("GpuTensorActive", "Average"),
        ("GpuDramActive", "Average"),
    ),
    "percent",
)


def widgets(opts: Options) -> list[Placed]:
    utilization = graph(
        opts,
        "GPU utilization % (per GPU index; service average: a scale-in guard, not a trigger)",
        [
            expr(search(opts, "GpuUtilization", G, "Average"), "", "g"),
            row(opts, "GpuUtilization", {"stat": "Average", "label": "service average"}),
        ],
        unit_label="percent",
        annotations=[{"value": opts.gpu_scale_in, "label": "scale-in level"}],
    )
    memory = graph(
        opts,
        "GPU memory used % (per GPU index; service max)",
        [
            expr(search(opts, "GpuMemoryUsedPercent", G, "Maximum"), "", "g"),
            row(opts, "GpuMemoryUsedPercent", {"stat": "Maximum", "label": "service max"}),
        ],
        stat="Maximum",
        unit_label="percent",
        annotations=[{"value": opts.gpu_memory, "label": "alarm"}],
    )
    health = graph(
        opts,
        "GPU health (1 = healthy, 0 = unhealthy; per GPU index, and the worst of every task)",
        [
            expr(search(opts, "GpuHealthy", G, "Minimum"), "", "h"),
            row(opts, "GpuHealthy", {"stat": "Minimum", "label": "any GPU, any task (min)"}),
        ],
        stat="Minimum",
        unit_label="healthy",
    )
    faults = (
        logs(opts, "GPU faults and drains (exporter group)", [f"{opts.log_group_prefix}/exporter"], FAULT_LINES)
        if emitted(opts.catalog, "GpuHealthy", G)
        else None
    )

    def panel(title: str, series: tuple[tuple[str, str], ...], label: str) -> Placed:
        rows = [expr(search(opts, m, G, stat), m.removeprefix("Gpu"), f"e{i}") for i, (m, stat) in enumerate(series)]
        return Placed(graph(opts, title, rows, stat=series[0][1], unit_label=label))

    return [
        Placed(health, 12),
        Placed(faults, 12),
        Placed(utilization, 12),
        Placed(memory, 12),
        panel(*GPM_PANEL),
        *(panel(*p) for p in PANELS),
    ]


SECTION = Section(TEXT, widgets)
