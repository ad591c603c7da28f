"""GPU drains within fleet-wide bounds: which instance drains, when, and when it is replaced.

An instance with a checked draining fault waits its turn (in the order reported), then:

1. ECS ``UpdateContainerInstancesState`` DRAINING: nothing new is placed there, the services move their tasks;
2. once ECS lists no task on it (``ListTasks``), or ``--replace-timeout`` has passed (logged), Auto Scaling
   ``SetInstanceHealth`` Unhealthy: its group replaces it;
3. it holds its slot until it has left its group (an instance in no group: until it leaves the cluster or an
   operator sets it ACTIVE again).

Bounds: at most ``--max-draining`` instances draining or being replaced at once, at most
``--max-drains-per-hour`` drains started in any hour; more wait, each logged as waiting with why. Above
``--pause-above`` of the cluster's instances reporting a draining fault within an hour (a fleet-wide cause: a
driver, an AMI) drains pause: the controller changes nothing in the fleet until ``python -m controller
resume``. A failing call is logged, counted and tried again on the next pass; every change is idempotent.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from .fleet import Fleet, FleetError
from .metrics import Counts
from .reports import classify
from .state import MAX_EVIDENCE, Entry, State
from .verify import Checked

log = logging.getLogger("controller.drains")

HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class Limit:
    """``--max-draining``: a count, or a fraction of the cluster's container instances (at least 1)."""

    count: int = 0
    fraction: float = 0.0

    def of(self, instances: int) -> int:
        if self.count:
            return self.count
        return max(1, math.ceil(self.fraction * instances - 1e-9))

    def __str__(self) -> str:
        return str(self.count) if self.count else f"{self.fraction * 100:g}%"


DEFAULT_LIMIT = Limit(fraction=0.1)


@dataclass(frozen=True)
class Bounds:
    max_draining: Limit = DEFAULT_LIMIT
    max_per_hour: int = 4
    pause_above: float = 0.2
    replace_timeout: float = 900.0


class Drains:
    """The decisions; the state is passed in (read and written by the caller, once a pass)."""

    def __init__(self, fleet: Fleet, bounds: Bounds, counts: Counts, cluster: str) -> None:
        self.fleet = fleet
        self.bounds = bounds
        self.counts = counts
        self.cluster = cluster
        self._instances: tuple[float, int] | None = None  # (read at, count), for one pass

    def instance_count(self, now: float) -> int:
        """The cluster's container instances, read once a pass; raises FleetError."""
        if self._instances is None or self._instances[0] != now:
            self._instances = (now, self.fleet.instance_count())
        return self._instances[1]

    # --- a report ----------------------------------------------------------------------------------------------

    def report(self, state: State, checked: Checked, now: float) -> str:
        """Take a checked report into the state; the outcome in words. Raises FleetError (read it again later)."""
        report, instance = checked.report, checked.instance
        fields: dict[str, Any] = {
            **report.fields(),
            "cluster": self.cluster,
            "container_instance_arn": instance.arn,
            "ec2_instance_id": instance.ec2_instance_id,
        }
        verdict = classify(report)
        if verdict != "drain":
            self.counts.reports_report_only += 1
            log.info("GPU fault reported, no drain: %s (%s)", verdict, report.reason, extra={"fields": fields})
            return f"report only: {verdict}"
        instances = self.instance_count(now)  # before any change: a failure leaves the message for later
        self.counts.reports_accepted += 1
        state.reporters[instance.arn] = now
        entry = state.entries.get(instance.arn)
        if entry is not None:  # a duplicate, a replay, another GPU or task of the same instance
            entry.reports += 1
            if len(entry.evidence) < MAX_EVIDENCE:
                entry.evidence.append(_evidence(checked, now))
            log.info("GPU fault on an instance already %s: nothing more to do", entry.phase, extra={"fields": fields})
            outcome = f"already {entry.phase}"
        else:
            state.seq += 1
            state.entries[instance.arn] = Entry(
                container_instance=instance.arn,
                ec2_instance=instance.ec2_instance_id,
                phase="waiting",
                seq=state.seq,
                reported_at=now,
                reason=report.reason,
                evidence=[_evidence(checked, now)],
            )
            log.warning(
                "GPU fault checked: container instance %s (EC2 instance %s) will drain in its turn: %s",
                instance.arn,
                instance.ec2_instance_id,
                report.reason,
                extra={"fields": {**fields, "turn": state.seq}},
            )
            outcome = "queued to drain"
        self._maybe_pause(state, now, instances)
        return outcome

    def _maybe_pause(self, state: State, now: float, instances: int) -> None:
        if state.paused is not None:
            return
        recent = sorted(k for k, t in state.reporters.items() if now - t < HOUR)
        if instances <= 0 or len(recent) <= self.bounds.pause_above * instances:
            return
        reason = (
            f"{len(recent)} of {instances} container instances reported a draining GPU fault within an hour, "
            f"above {self.bounds.pause_above * 100:g}%: a fleet-wide cause (a driver, an AMI) is likelier than "
            "that many failed GPUs"
        )
        state.paused = {"since": now, "reason": reason}
        reasons = {k: e.reason for k, e in state.entries.items() if k in recent}
        log.error(
            "GPU drains paused: %s; nothing more is drained or replaced until python -m controller resume",
            reason,
            extra={"fields": {"cluster": self.cluster, "reporting_instances": recent, "reasons": reasons}},
        )

    # --- a pass ------------------------------------------------------------------------------------------------

    def tick(self, state: State, now: float) -> None:
        """Move every instance on as far as the bounds allow."""
        state.drains = [t for t in state.drains if now - t < HOUR]
        state.reporters = {k: t for k, t in state.reporters.items() if now - t < HOUR}
        state.done = {k: t for k, t in state.done.items() if now - t < DAY}
        ordered = sorted(state.entries.values(), key=lambda e: e.seq)
        if state.paused is not None:
            self._waiting(ordered, "GPU drains are paused (python -m controller resume)")
            return
        for entry in ordered:
            if entry.holds_a_slot():
                self._progress(state, entry, now)
        self._start(state, now)

    def _progress(self, state: State, entry: Entry, now: float) -> None:
        fields = _fields(entry, self.cluster)
        try:
            if entry.phase == "draining":
                left = self.fleet.running_tasks(entry.container_instance)
                waited = now - (entry.drain_started_at or now)
                if left == 0:
                    self._replace(entry, now, "its tasks have left")
                elif waited >= self.bounds.replace_timeout:
                    log.warning(
                        "container instance %s still has %d task(s) %gs after DRAINING: replacing it anyway "
                        "(--replace-timeout)",
                        entry.container_instance,
                        left,
                        waited,
                        extra={"fields": {**fields, "tasks_left": left}},
                    )
                    self._replace(entry, now, f"--replace-timeout {self.bounds.replace_timeout:g}s passed")
            elif entry.phase == "replacing":
                if not self.fleet.in_group(entry.ec2_instance):
                    self._finish(state, entry, now, "it has left its Auto Scaling group")
            elif entry.phase == "manual":
                found = self.fleet.instance(entry.container_instance)
                if found is None:
                    self._finish(state, entry, now, "it has left the cluster")
                elif found.status == "ACTIVE":
                    self._finish(state, entry, now, "an operator set it ACTIVE again")
        except FleetError as exc:
            self._failed(exc, entry)

    def _replace(self, entry: Entry, now: float, why: str) -> None:
        fields = _fields(entry, self.cluster)
        if self.fleet.set_unhealthy(entry.ec2_instance):
            entry.phase, entry.replace_started_at = "replacing", now
            self.counts.replacements_started += 1
            log.warning(
                "EC2 instance %s marked Unhealthy in its Auto Scaling group, which replaces it (%s)",
                entry.ec2_instance,
                why,
                extra={"fields": fields},
            )
        else:
            entry.phase = "manual"
            log.error(
                "EC2 instance %s is DRAINING and in no Auto Scaling group, so nothing replaces it: replace or "
                "repair it by hand, then deregister it or set it ACTIVE again (it holds a drain slot until then)",
                entry.ec2_instance,
                extra={"fields": fields},
            )

    def _finish(self, state: State, entry: Entry, now: float, why: str) -> None:
        del state.entries[entry.container_instance]
        state.done[entry.container_instance] = now
        log.info(
            "GPU drain of container instance %s done: %s", entry.container_instance, why,
            extra={"fields": _fields(entry, self.cluster)},
        )  # fmt: skip

    def _start(self, state: State, now: float) -> None:
        waiting = sorted((e for e in state.entries.values() if e.phase == "waiting"), key=lambda e: e.seq)
        if not waiting:
            return
        try:
            instances = self.instance_count(now)
        except FleetError as exc:
            self._failed(exc, None)
            return
        limit = self.bounds.max_draining.of(instances)
        busy = sum(1 for e in state.entries.values() if e.holds_a_slot())
        for position, entry in enumerate(waiting, start=1):
            if busy >= limit:
                why = (
                    f"{busy} of at most {limit} instances draining or being replaced "
                    f"(--max-draining {self.bounds.max_draining})"
                )
            elif len(state.drains) >= self.bounds.max_per_hour:
                why = (
                    f"{len(state.drains)} drains started in the last hour "
                    f"(--max-drains-per-hour {self.bounds.max_per_hour})"
                )
            else:
                try:
                    started = self._drain(state, entry, now)
                except FleetError as exc:
                    self._failed(exc, entry)
                    return  # the order holds: nothing overtakes the one that failed
                busy += started
                continue
            self._waiting([entry], why, position)

    def _drain(self, state: State, entry: Entry, now: float) -> int:
        found = self.fleet.instance(entry.container_instance)
        if found is None:
            self._finish(state, entry, now, "it left the cluster before its turn")
            return 0
        self.fleet.set_draining(entry.container_instance)
        entry.phase, entry.drain_started_at, entry.waiting_why = "draining", now, ""
        state.drains.append(now)
        self.counts.drains_started += 1
        log.warning(
            "container instance %s (EC2 instance %s) set DRAINING for a GPU fault: %s; replaced once its tasks "
            "have left",
            entry.container_instance,
            entry.ec2_instance,
            entry.reason,
            extra={"fields": {**_fields(entry, self.cluster), "evidence": entry.evidence}},
        )
        return 1

    def _waiting(self, entries: list[Entry], why: str, position: int | None = None) -> None:
        for i, entry in enumerate(entries, start=1):
            if entry.phase != "waiting" or entry.waiting_why == why:
                continue
            entry.waiting_why = why
            turn = position if position is not None else i
            log.info(
                "container instance %s waits its turn to drain (number %d in line): %s",
                entry.container_instance,
                turn,
                why,
                extra={"fields": {**_fields(entry, self.cluster), "position": turn, "waiting_for": why}},
            )

    def _failed(self, exc: FleetError, entry: Entry | None) -> None:
        self.counts.drain_failures += 1
        fields: dict[str, Any] = _fields(entry, self.cluster) if entry else {"cluster": self.cluster}
        log.error(
            "GPU drain step failed: %s; nothing else changes, tried again on the next pass",
            exc,
            extra={"fields": {**fields, "call": exc.call, "error": exc.message}},
        )


def resume(state: State) -> bool:
    """Clear the pause and the hour's reports (counted afresh from now); False when it was not paused."""
    was = state.paused is not None
    state.paused = None
    state.reporters = {}
    for entry in state.entries.values():
        entry.waiting_why = ""
    return was


def _evidence(checked: Checked, now: float) -> dict[str, Any]:
    r = checked.report
    return {
        "task_arn": r.task_arn,
        "gpu_uuid": r.gpu_uuid,
        "gpu": r.gpu,
        "fault": r.fault,
        "code": r.code,
        "reason": r.reason,
        "reads": r.reads,
        "observed_at": r.observed_at,
        "checked_at": now,
    }


def _fields(entry: Entry, cluster: str) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "container_instance_arn": entry.container_instance,
        "ec2_instance_id": entry.ec2_instance,
        "phase": entry.phase,
        "reason": entry.reason,
        "reports": entry.reports,
    }
