"""The controller's own metrics, as EMF: one event per pass, one series per metric and cluster.

The names live here, in one module, rather than in a catalog pack: the catalog's loader knows the exporter's
scopes and model sync's events only, and a controller scope would reach into render and cost as well. The
alarms docs/controller.md lists read these names; tests/unit/controller/test_metrics.py holds them to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from telemetry.emf import Encoder, Event, dimensions_for
from telemetry.sinks import Sink

DIMENSIONS = (("cluster",),)


@dataclass(frozen=True)
class Spec:
    """A metric as telemetry's EMF encoder knows it (its MetricSpec)."""

    name: str
    unit: str
    help: str
    dimension_sets: tuple[tuple[str, ...], ...] = DIMENSIONS
    resolution: int = 60


METRICS: tuple[Spec, ...] = (
    Spec("ControllerHeartbeat", "Count", "1 every pass of the loop: missing data means the controller is not running"),
    Spec("GpuDrainsPaused", "None", "1 while GPU drains are paused (python -m controller resume), else 0"),
    Spec("GpuDrainsInProgress", "Count", "instances draining or being replaced because of GPU faults"),
    Spec("GpuDrainsWaiting", "Count", "instances with a checked GPU fault waiting their turn to drain"),
    Spec("GpuDrainsStarted", "Count", "container instances set DRAINING in the pass"),
    Spec("GpuReplacementsStarted", "Count", "instances marked Unhealthy in their Auto Scaling group in the pass"),
    Spec("GpuDrainFailures", "Count", "ECS or Auto Scaling calls of a drain or replacement that failed (retried)"),
    Spec("GpuReportsAccepted", "Count", "reports of a draining fault that passed every check"),
    Spec("GpuReportsReportOnly", "Count", "checked reports of a fault that does not drain (XID 63, 142, DRAIN_P2P)"),
    Spec("GpuReportsRefused", "Count", "reports refused: malformed, forged or stale (the log names the check)"),
    Spec("ControllerStateFailures", "Count", "state reads or writes that failed or conflicted (retried)"),
)
NAMES = tuple(m.name for m in METRICS)  # every pass
# The fan-out (controller/fanout.py): every pass while it is on (--service with --topic-arn or --bucket).
FANOUT_METRICS: tuple[Spec, ...] = (
    Spec("FanoutTasks", "Count", "tasks of the Triton service ECS wants running (each has, or gets, a queue)"),
    Spec("FanoutQueues", "Count", "fan-out queues of the exact name form listed in the pass"),
    Spec("FanoutQueuesCreated", "Count", "fan-out queues made for new tasks in the pass"),
    Spec("FanoutQueuesDeleted", "Count", "fan-out queues of stopped tasks removed in the pass"),
    Spec("FanoutFailures", "Count", "fan-out calls that failed in the pass (ECS, SQS, SNS, the fleet size; retried)"),
)
FANOUT_NAMES = tuple(m.name for m in FANOUT_METRICS)
# Rollouts (controller/rollouts.py): every pass while --rollouts is on.
ROLLOUT_METRICS: tuple[Spec, ...] = (
    Spec("RolloutsInFlight", "Count", "models with a rollout in flight"),
    Spec("RolloutsStarted", "Count", "rollouts started in the pass"),
    Spec("RolloutsPromoted", "Count", "rollouts promoted on evidence in the pass"),
    Spec("RolloutsRejected", "Count", "rollouts rejected in the pass (evidence, a failed install, crashes)"),
    Spec("RolloutCrashes", "Count", "canaries whose Triton exited while serving a rollout's artifact (alarm: > 0)"),
    Spec("RolloutStateRepairs", "Count", "rollout states that did not parse or validate, rewritten from the copy"),
    Spec("RolloutReportsRefused", "Count", "rollout reports refused (malformed, another task's, a duplicate identity)"),
    Spec("RolloutOperatorCommands", "Count", "operators' promotes and rejects applied (python -m modelsync rollout)"),
    Spec("RolloutOperatorRefused", "Count", "operators' commands refused (a host's role, expired, --force missing)"),
)
ROLLOUT_NAMES = tuple(m.name for m in ROLLOUT_METRICS)


@dataclass
class Counts:
    """What happened since the last event (reset when it is sent)."""

    drains_started: int = 0
    replacements_started: int = 0
    drain_failures: int = 0
    reports_accepted: int = 0
    reports_report_only: int = 0
    reports_refused: int = 0
    state_failures: int = 0
    fanout_created: int = 0
    fanout_deleted: int = 0
    fanout_failures: int = 0
    rollouts_started: int = 0
    rollouts_promoted: int = 0
    rollouts_rejected: int = 0
    rollout_crashes: int = 0
    rollout_state_repairs: int = 0
    rollout_reports_refused: int = 0
    rollout_operator_commands: int = 0
    rollout_operator_refused: int = 0

    def take(self) -> Counts:
        out = Counts(**{f.name: getattr(self, f.name) for f in fields(self)})
        for f in fields(self):
            setattr(self, f.name, 0)
        return out


class Recorder:
    """Encodes one event per pass and hands it to the sink."""

    def __init__(self, namespace: str, sink: Sink, cluster: str, wall: Callable[[], float] = time.time) -> None:
        self.encoder = Encoder(namespace, METRICS + FANOUT_METRICS + ROLLOUT_METRICS)
        self.sink = sink
        self.cluster = cluster
        self.wall = wall

    def emit(
        self,
        counts: Counts,
        paused: bool,
        in_progress: int,
        waiting: int,
        fanout: tuple[int, int] | None = None,
        rollouts: int | None = None,
    ) -> dict[str, float]:
        """``fanout``: (the service's tasks, queues listed) of the pass's fan-out; None while it is off.
        ``rollouts``: models with a rollout in flight; None while the controller does not decide rollouts."""
        values = {
            "ControllerHeartbeat": 1.0,
            "GpuDrainsPaused": 1.0 if paused else 0.0,
            "GpuDrainsInProgress": float(in_progress),
            "GpuDrainsWaiting": float(waiting),
            "GpuDrainsStarted": float(counts.drains_started),
            "GpuReplacementsStarted": float(counts.replacements_started),
            "GpuDrainFailures": float(counts.drain_failures),
            "GpuReportsAccepted": float(counts.reports_accepted),
            "GpuReportsReportOnly": float(counts.reports_report_only),
            "GpuReportsRefused": float(counts.reports_refused),
            "ControllerStateFailures": float(counts.state_failures),
        }
        if fanout is not None:
            values |= {
                "FanoutTasks": float(fanout[0]),
                "FanoutQueues": float(fanout[1]),
                "FanoutQueuesCreated": float(counts.fanout_created),
                "FanoutQueuesDeleted": float(counts.fanout_deleted),
                "FanoutFailures": float(counts.fanout_failures),
            }
        if rollouts is not None:
            values |= {
                "RolloutsInFlight": float(rollouts),
                "RolloutsStarted": float(counts.rollouts_started),
                "RolloutsPromoted": float(counts.rollouts_promoted),
                "RolloutsRejected": float(counts.rollouts_rejected),
                "RolloutCrashes": float(counts.rollout_crashes),
                "RolloutStateRepairs": float(counts.rollout_state_repairs),
                "RolloutReportsRefused": float(counts.rollout_reports_refused),
                "RolloutOperatorCommands": float(counts.rollout_operator_commands),
                "RolloutOperatorRefused": float(counts.rollout_operator_refused),
            }
        props: dict[str, object] = {"service": "controller"}
        dims = dimensions_for(("cluster",), {"cluster": self.cluster}, props)
        self.sink.send(self.encoder.encode(Event("controller", dims, values, props), int(self.wall() * 1000)))
        return values
