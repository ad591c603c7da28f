"""Scaling: the leading signals at their own resolution (10 s), with the thresholds that add a task."""

from __future__ import annotations

from typing import Any

from ..base.options import Options
from ..base.widgets import Placed, Row, Section, emitted, graph, row

TEXT = (
    "**Scaling** (docs/scaling.md): what predicts overload, every 10 s: Triton's backlog and queue time (and "
    "TensorRT-LLM's waiting requests). Held above a threshold for 30 s, a task is added; twice it, two."
)
FAST = 10  # the signals' period: their catalog interval and the scale-out alarms' period


def widgets(opts: Options) -> list[Placed]:
    backlog = graph(
        opts,
        "Backlog: requests queued in Triton per task, every model (10 s)",
        [
            row(opts, "TaskPendingRequests", {"stat": "Average", "period": FAST, "label": "average task (scales out)"}),
            row(opts, "TaskPendingRequests", {"stat": "Maximum", "period": FAST, "label": "worst task"}),
        ],
        unit_label="requests",
        annotations=[{"value": opts.pending_scale_out, "label": "+1 task"}],
    )
    queue = graph(
        opts,
        "Queue time of each task's worst model (10-second averages, us)",
        [
            row(opts, "TaskQueueLatencyMax", {"stat": "Average", "period": FAST, "label": "average task (scales out)"}),
            row(opts, "TaskQueueLatencyMax", {"stat": "Maximum", "period": FAST, "label": "worst task"}),
        ],
        unit_label="microseconds",
        annotations=[{"value": opts.queue_time_scale_out_us, "label": "+1 task"}],
    )
    waiting = graph(
        opts,
        "TensorRT-LLM requests waiting per task (10 s)",
        [
            _optional(
                opts, "TaskRequestsWaiting", {"stat": "Average", "period": FAST, "label": "average task (scales out)"}
            )
        ],
        unit_label="requests",
        annotations=[{"value": opts.requests_waiting_scale_out, "label": "+1 task"}],
    )
    return [Placed(backlog), Placed(queue), Placed(waiting)]


def _optional(opts: Options, name: str, options: dict[str, Any]) -> Row | None:
    """A service-wide row of a metric of an optional pack (LLM): none when the pack is off."""
    return row(opts, name, options) if emitted(opts.catalog, name, (), optional=True) else None


SECTION = Section(TEXT, widgets)
