"""GPU: utilization and memory (secondary to scaling, with their thresholds), power, and NVML health fields.

:data:`PANELS` is the table of per-GPU graphs: title, (metric, statistic) per series, y-axis label.
"""

from __future__ import annotations

from ..base.options import Options
from ..base.widgets import Placed, Section, expr, graph, row, search

TEXT = (
    "**GPU**: utilization and memory (busy is not overloaded: utilization only guards scale-in), power, and the NVML "
    "health fields (temperature, throttling, XID, ECC, row remapping) when the NVML source is on."
)
G = ("gpu",)

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
    panels = [
        Placed(
            graph(
                opts,
                title,
                [
                    expr(search(opts, name, G, stat), name.removeprefix("Gpu"), f"e{i}")
                    for i, (name, stat) in enumerate(series)
                ],
                stat=series[0][1],
                unit_label=label,
            )
        )
        for title, series, label in PANELS
    ]
    return [Placed(utilization, 12), Placed(memory, 12), *panels]


SECTION = Section(TEXT, widgets)
