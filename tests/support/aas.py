"""Application Auto Scaling's step scaling, as AWS documents it, for what cannot run here: the policies' effect.

Used by tests/unit/render/test_scaling_policy.py and bench/bench_scaling.py on the rendered policies
(PutScalingPolicy bodies). What it follows (Application Auto Scaling User Guide, "Step scaling policies";
the PutScalingPolicy and StepAdjustment API reference):

- The step is chosen from the alarm's metric value (``MetricAggregationType`` over the breaching datapoints)
  minus the alarm's threshold: the step whose ``[lower, upper)`` holds it (a bound left out is infinite).
- ``ChangeInCapacity`` adds the adjustment; ``PercentChangeInCapacity`` adds that percentage of the current
  capacity, a result between 0 and 1 rounded to 1 and a larger one rounded down (12.7 -> 12), negative ones
  alike; then at least ``MinAdjustmentMagnitude`` tasks.
- Scale-out cooldown: while it runs, the capacity the initiating scale-out added counts as part of the
  desired capacity; a new alarm adds only what a larger adjustment adds beyond it ("add 2, then 3 in the
  cooldown: 1 more").
- Scale-in: nothing within a scale-in's cooldown (of the last scale-in, or of a scale-out: this repository's
  ``ScaleInCooldown`` says "and after a scale-out before one").
- The new capacity stays within the scalable target's minimum and maximum. When several policies act at one
  evaluation, the one giving the largest capacity wins.
- While its alarm stays in ALARM a policy is invoked again about once a minute (FLEET_ACTIONS facts: as read,
  unverified); :data:`REINVOKE` seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

REINVOKE = 60.0


def rounded(amount: float) -> int:
    """PercentChangeInCapacity's rounding: (0, 1) -> 1, above 1 down; the same for negatives."""
    if amount == 0:
        return 0
    sign = 1 if amount > 0 else -1
    size = abs(amount)
    return sign * (1 if size < 1 else math.floor(size))


@dataclass
class StepPolicy:
    """One step scaling policy's configuration and its cooldown state."""

    name: str
    adjustment_type: str
    cooldown: float
    steps: tuple[tuple[float, float, float], ...]  # (lower, upper, adjustment), bounds as offsets
    min_magnitude: int = 0
    last_action: float = -math.inf
    base: int = 0  # capacity when the running cooldown started
    added: int = 0  # what that scale-out (and larger ones in its cooldown) added

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> StepPolicy:
        config = body["StepScalingPolicyConfiguration"]
        steps = tuple(
            (
                float(s.get("MetricIntervalLowerBound", -math.inf)),
                float(s.get("MetricIntervalUpperBound", math.inf)),
                float(s["ScalingAdjustment"]),
            )
            for s in config["StepAdjustments"]
        )
        return cls(
            body["PolicyName"],
            config["AdjustmentType"],
            float(config.get("Cooldown", 0)),
            steps,
            int(config.get("MinAdjustmentMagnitude", 0)),
        )

    def step(self, offset: float) -> float | None:
        for lower, upper, adjustment in self.steps:
            if lower <= offset < upper:
                return adjustment
        return None

    def amount(self, adjustment: float, capacity: int) -> int:
        if self.adjustment_type == "ChangeInCapacity":
            return int(adjustment)
        if self.adjustment_type == "PercentChangeInCapacity":
            n = rounded(capacity * adjustment / 100.0)
            if self.min_magnitude and 0 < abs(n) < self.min_magnitude:
                n = self.min_magnitude if n > 0 else -self.min_magnitude
            if self.min_magnitude and n == 0 and adjustment != 0:
                n = self.min_magnitude if adjustment > 0 else -self.min_magnitude
            return n
        raise ValueError(f"adjustment type {self.adjustment_type!r} is not modelled")

    def proposal(self, offset: float, capacity: int, now: float) -> int | None:
        """The capacity this policy asks for at ``now`` (None: nothing), without changing its state."""
        adjustment = self.step(offset)
        if adjustment is None:
            return None
        in_cooldown = now < self.last_action + self.cooldown
        if adjustment > 0:
            if in_cooldown:
                more = self.amount(adjustment, self.base)
                return self.base + more if more > self.added else None
            return capacity + self.amount(adjustment, capacity)
        if in_cooldown:
            return None
        return capacity + self.amount(adjustment, capacity)

    def acted(self, capacity_before: int, capacity_after: int, now: float) -> None:
        if now < self.last_action + self.cooldown and capacity_after > capacity_before:
            self.added = capacity_after - self.base
        else:
            self.base, self.added = capacity_before, capacity_after - capacity_before
        self.last_action = now


@dataclass
class Target:
    """The scalable target (ecs:service:DesiredCount) and its policies, keyed by the alarm that invokes each."""

    minimum: int
    maximum: int
    desired: int
    policies: dict[str, StepPolicy]
    scale_in_cooldown: float = 0.0
    last_out: float = -math.inf
    history: list[tuple[float, int]] = field(default_factory=list)  # (time, new desired)
    _next: dict[str, float] = field(default_factory=dict)

    def due(self, alarm: str, in_alarm: bool, now: float) -> bool:
        """Invoked on entering ALARM and every :data:`REINVOKE` s while in it."""
        if not in_alarm:
            self._next.pop(alarm, None)
            return False
        if now >= self._next.get(alarm, -math.inf):
            self._next[alarm] = now + REINVOKE
            return True
        return False

    def invoke(self, values: Sequence[tuple[str, float]], now: float) -> int:
        """``values``: (alarm, metric value minus threshold) of the alarms invoked at ``now``; the largest wins."""
        proposals: dict[str, int] = {}
        for alarm, offset in values:
            p = self.policies[alarm]
            want = p.proposal(offset, self.desired, now)
            if want is None:
                continue
            if want < self.desired and now < self.last_out + self.scale_in_cooldown:
                continue  # no scale-in right after a scale-out
            proposals[alarm] = max(self.minimum, min(self.maximum, want))
        if not proposals:
            return self.desired
        winner = max(proposals, key=lambda a: proposals[a])
        new = proposals[winner]
        if new == self.desired:
            return new
        before = self.desired
        for alarm in proposals:
            if (proposals[alarm] > before) == (new > before):
                self.policies[alarm].acted(before, new, now)
        if new > before:
            self.last_out = now
        self.desired = new
        self.history.append((now, new))
        return new
