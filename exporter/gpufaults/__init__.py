"""GPU faults: the health verdict per GPU (:mod:`.verdict`) and what the exporter does about an unhealthy one
(:mod:`.drain`: ``--gpu-fault-action drain`` reports it to the fleet's controller, which decides; docs/gpu.md).

The NVML source judges each GPU every cycle with :class:`~.verdict.GpuHealth`, which hands a GPU that turns
unhealthy to an :class:`~.verdict.Action`: :class:`~.verdict.Report` (the default, no AWS call) or
:class:`~.drain.Drainer`. This package imports nothing of the sources, so the NVML source can use it.
"""

from __future__ import annotations

from .verdict import (
    ACTIONS,
    APPLICATION_XIDS,
    FATAL_XIDS,
    RECOVERY_ACTIONS,
    REPORT_ONLY_RECOVERY_ACTIONS,
    REPORT_ONLY_XIDS,
    Action,
    Fault,
    GpuHealth,
    Report,
)

__all__ = [
    "ACTIONS", "APPLICATION_XIDS", "FATAL_XIDS", "RECOVERY_ACTIONS", "REPORT_ONLY_RECOVERY_ACTIONS",
    "REPORT_ONLY_XIDS", "Action", "Fault", "GpuHealth", "Report",
]  # fmt: skip
