"""ECS service scaling on what predicts overload (docs/scaling.md), as data.

Scale out, in proportion: one step policy in ``PercentChangeInCapacity`` (at least one task) on the **excess**,
the share of the demand the service did not serve over the last 10 s,

    excess = (DIFF(backlog) [+ DIFF(TensorRT-LLM waiting)] + rejected) / served      (each the average task's)

which is ``lambda / mu - 1`` of a saturated service whatever its size, its model or its queue policy: a backlog
that grows, or requests Triton sheds (queue full, queue timeout), are both demand it did not serve. Tasks still
starting serve nothing and add nothing to either side, so they do not dilute it. The steps add the excess,
rounded up to the step's upper edge, as a percentage of the current count; each step is at most one tenth of
the tasks needed wide (geometric steps), so a step overshoots by at most one task per ten: a 50 % surge on 20
tasks adds 10 (the step [38, 51) %), a 200 % surge on 100 adds 221.

Scale out, the backstop: the level alarms on the backlog, the queue time and TensorRT-LLM's waiting requests
(30 s above their thresholds) add one task: a service exactly at capacity with a standing queue has no excess.

Every scale-out policy's cooldown is ``TaskStartSeconds`` plus the time the excess alarm needs to see the new tasks
(:data:`SCALE_OUT_SIGHT`): Application Auto Scaling counts what a scale-out added as capacity during its cooldown
and only adds what a larger step adds beyond it, so tasks still starting are not doubled, and a larger excess still
adds the difference. A rate, the excess does not grow while tasks start.

Scale in: one policy, invoked by a standard alarm on the sum of every signal over its own scale-in level, each
the average task's (a per-task measure: it does not grow with the number of tasks), staying below 1 for 15
minutes: only when every signal is low, one task at a time, never below ``MinCapacity`` (at least 1: with no task
nothing emits the signals). GPU memory only notifies.

Target tracking is not used: its alarms evaluate 60-second periods and scale in on their own.
Policies are in RegisterScalableTarget / PutScalingPolicy shapes; a policy exists when an alarm of the render
names its action.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from catalog import Catalog

from ..base.params import Ref, RefPlus
from ..base.widgets import emitted
from .spec import MathAlarm, MetricAlarm, Spec, Term, check_period

SCALE_OUT_PERIOD = 10  # seconds: a high-resolution alarm (the signals are emitted every 10 s)
SCALE_OUT_POINTS = 3  # of 3: 30 s of sustained overload
SCALE_IN_PERIOD = 60
SCALE_IN_POINTS = 15  # of 15: 15 minutes of every signal low
SCALE_IN_BELOW = 1.0  # the scale-in alarm's threshold on the sum of normalised signals
EXCESS_THRESHOLD = 0.05  # 5 % of the demand unserved, 30 s long
OVERSHOOT = 0.10  # issue 37: a step adds at most one task per ten the service needs above that need
MAX_STEPS = 20  # Application Auto Scaling: step adjustments per policy
# Seconds from a new task's first served request until the excess alarm has seen it: its evaluation window, and one
# period more for the last period's value (written when the period ends) to reach CloudWatch. The scale-out
# cooldown is TaskStartSeconds plus this: a cooldown that ends before the alarm sees the new capacity lets its
# re-invocation add the same excess again.
SCALE_OUT_SIGHT = SCALE_OUT_PERIOD * (SCALE_OUT_POINTS + 1)


def excess_table() -> tuple[tuple[int, int], ...]:
    """(lower edge of the excess, percent added), in percent, derived from :data:`OVERSHOOT`.

    Each step adds its upper edge (the next step's lower), so it covers every excess it is chosen for; and at its
    lower edge ``l`` adds at most ``(1 + OVERSHOOT)(1 + l) - 1``: the tasks after the step exceed the tasks needed
    by at most one in ten. Geometric steps reach 300 % (and beyond) within :data:`MAX_STEPS`; equal steps of ten
    points would need thirty.
    """
    out, lower = [], round(EXCESS_THRESHOLD * 100)
    for _ in range(MAX_STEPS):
        percent = math.floor(round((100 + lower) * (1 + OVERSHOOT), 9)) - 100
        out.append((lower, percent))
        lower = percent
    return tuple(out)


@dataclass(frozen=True)
class Policy:
    """A step scaling policy: ``key`` is the action alarms name in ``actions``, ``logical`` its template id."""

    key: str
    suffix: str
    logical: str
    aggregation: str
    steps: tuple[dict[str, Any], ...]
    cooldown: Ref | RefPlus
    adjustment: str = "ChangeInCapacity"
    min_magnitude: int | None = None  # PercentChangeInCapacity: at least this many tasks


SCALE_OUT_COOLDOWN = RefPlus("TaskStartSeconds", SCALE_OUT_SIGHT)


def _out(key: str, suffix: str, logical: str) -> Policy:
    # The backstop adds one task; the excess policy adds in proportion.
    steps = ({"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1},)
    return Policy(key, suffix, logical, "Average", steps, SCALE_OUT_COOLDOWN)


def excess_steps() -> tuple[dict[str, Any], ...]:
    """:func:`excess_table` as step adjustments: bounds are offsets from the alarm's threshold, the last open."""
    table = excess_table()
    out = []
    for i, (lower, percent) in enumerate(table):
        step: dict[str, Any] = {"MetricIntervalLowerBound": round(lower / 100 - EXCESS_THRESHOLD, 6)}
        if i + 1 < len(table):
            step["MetricIntervalUpperBound"] = round(table[i + 1][0] / 100 - EXCESS_THRESHOLD, 6)
        step["ScalingAdjustment"] = percent
        out.append(step)
    return tuple(out)


POLICIES: tuple[Policy, ...] = (
    Policy(
        "scale_out_excess",
        "scale-out-excess",
        "ScaleOutExcessPolicy",
        "Average",
        excess_steps(),
        SCALE_OUT_COOLDOWN,
        adjustment="PercentChangeInCapacity",
        min_magnitude=1,
    ),
    _out("scale_out_pending", "scale-out-pending", "ScaleOutPendingPolicy"),
    _out("scale_out_queue_time", "scale-out-queue-time", "ScaleOutQueueTimePolicy"),
    _out("scale_out_llm_waiting", "scale-out-llm-waiting", "ScaleOutLlmWaitingPolicy"),
    Policy(
        "scale_in",
        "scale-in",
        "ScaleInPolicy",
        "Average",
        ({"MetricIntervalUpperBound": 0, "ScalingAdjustment": -1},),
        Ref("ScaleInCooldown"),
    ),
)
SCALING_ACTIONS = tuple(p.key for p in POLICIES)
SCALE_OUT_ACTIONS = tuple(k for k in SCALING_ACTIONS if k.startswith("scale_out"))


@dataclass(frozen=True)
class ExcessAlarm:
    """The proportional scale-out's alarm: ``(DIFF(backlog) [+ DIFF(waiting)] + rejected) / served``.

    Every input is the average task's over 10 s. Metric math treats a missing value as 0 in arithmetic and
    drops a datapoint that divides by zero: a service that served nothing has no excess (the backstop
    alarms cover it), and an idle TensorRT-LLM pack adds nothing.
    """

    suffix: str
    description: str
    period: int
    points: int
    threshold: float

    TERMS = (
        Term("pending", "TaskPendingRequests", "Average", Ref("PendingRequestsScaleOut")),
        Term("waiting", "TaskRequestsWaiting", "Average", Ref("RequestsWaitingScaleOut"), optional=True),
        Term("rejected", "TaskRequestsRejected", "Average", Ref("PendingRequestsScaleOut")),
        Term("served", "TaskRequestsServed", "Average", Ref("PendingRequestsScaleOut")),
    )

    def spec(self, catalog: Catalog) -> Spec | None:
        kept = []
        for t in self.TERMS:
            metric = emitted(catalog, t.metric, (), t.optional)
            if metric is None and not t.optional:
                return None
            if metric is not None:
                check_period(catalog, metric, self.period, self.suffix)
                kept.append(t)
        ids = {t.id for t in kept}
        grown = " + ".join(f"DIFF({i})" for i in ("pending", "waiting") if i in ids)
        expression = f"({grown} + rejected) / served"
        queries: list[dict[str, Any]] = [
            {"Id": "e1", "Expression": expression, "Label": "excess (unserved share of demand)", "ReturnData": True}
        ]
        for t in kept:
            stat = {"Metric": {"Namespace": "${Namespace}", "MetricName": t.metric, "Dimensions": []}}
            queries.append(
                {"Id": t.id, "MetricStat": {**stat, "Period": self.period, "Stat": t.stat}, "ReturnData": False}
            )
        body = {
            "AlarmName": f"${{AlarmNamePrefix}}-{self.suffix}",
            "AlarmDescription": self.description,
            "Metrics": queries,
            "EvaluationPeriods": self.points,
            "DatapointsToAlarm": self.points,
            "Threshold": self.threshold,
            "ComparisonOperator": "GreaterThanThreshold",
            "TreatMissingData": "notBreaching",
        }
        return Spec(
            self.suffix, body, ("scale_out_excess",), metric=kept[0].metric, terms=tuple(t.metric for t in kept)
        )


SCALING_ALARMS: tuple[ExcessAlarm | MetricAlarm | MathAlarm, ...] = (
    ExcessAlarm(
        suffix="scale-out-excess",
        description="The share of the demand the service did not serve (the average task's backlog growth and "
        "rejected requests over its served ones, 10 s) stayed above 5 % for 30 s: add that share of tasks, rounded "
        "up to the step's edge, at least one (docs/scaling.md). Tasks still starting serve nothing and do not dilute "
        f"it; during the cooldown (TaskStartSeconds + {SCALE_OUT_SIGHT} s, until this alarm sees them) only a larger "
        "excess adds more.",
        period=SCALE_OUT_PERIOD,
        points=SCALE_OUT_POINTS,
        threshold=EXCESS_THRESHOLD,
    ),
    MetricAlarm(
        suffix="scale-out-pending",
        description="Requests waiting in Triton's queue per task (every model; the service's average over 10 s) "
        "stayed above PendingRequestsScaleOut for 30 s: add a task (the backstop of the excess policy, for a "
        "standing queue that no longer grows; docs/scaling.md).",
        metric="TaskPendingRequests",
        stat="Average",
        period=SCALE_OUT_PERIOD,
        points=SCALE_OUT_POINTS,
        threshold=Ref("PendingRequestsScaleOut"),
        actions=("scale_out_pending",),
    ),
    MetricAlarm(
        suffix="scale-out-queue-time",
        description="The time requests waited in Triton's queue (each task's worst model, 10-second averages; the "
        "service's average) stayed above QueueTimeScaleOutMicroseconds for 30 s: add a task (the backstop of the "
        "excess policy).",
        metric="TaskQueueLatencyMax",
        stat="Average",
        period=SCALE_OUT_PERIOD,
        points=SCALE_OUT_POINTS,
        threshold=Ref("QueueTimeScaleOutMicroseconds"),
        actions=("scale_out_queue_time",),
    ),
    MetricAlarm(
        suffix="scale-out-llm-waiting",
        description="TensorRT-LLM requests admitted but not scheduled, per task (every model; the service's "
        "average over 10 s), stayed above RequestsWaitingScaleOut for 30 s: the engines' batches or KV caches are "
        "full; add a task (the backstop of the excess policy).",
        metric="TaskRequestsWaiting",
        stat="Average",
        period=SCALE_OUT_PERIOD,
        points=SCALE_OUT_POINTS,
        threshold=Ref("RequestsWaitingScaleOut"),
        actions=("scale_out_llm_waiting",),
        optional=True,
    ),
    MathAlarm(
        suffix="scale-in",
        description="Every signal low for 15 minutes, each the average task's (a per-task measure that does not "
        "grow with the number of tasks): pending requests over PendingRequestsScaleOut, queue time over "
        "QueueTimeScaleOutMicroseconds, GPU utilization over GpuScaleInUtilization, and TensorRT-LLM's waiting "
        "requests and KV cache where present, summed, stayed below 1: remove a task (never below MinCapacity). "
        "No data: no scale-in.",
        terms=(
            Term("pending", "TaskPendingRequests", "Average", Ref("PendingRequestsScaleOut")),
            Term("queue", "TaskQueueLatencyMax", "Average", Ref("QueueTimeScaleOutMicroseconds")),
            Term("gpu", "GpuUtilization", "Average", Ref("GpuScaleInUtilization"), optional=True),
            Term("waiting", "TaskRequestsWaiting", "Average", Ref("RequestsWaitingScaleOut"), optional=True),
            Term("kvcache", "KvCacheUtilization", "Average", Ref("KvCacheUtilizationThreshold"), optional=True),
        ),
        period=SCALE_IN_PERIOD,
        points=SCALE_IN_POINTS,
        threshold=SCALE_IN_BELOW,
        comparison="LessThanThreshold",
        actions=("scale_in",),
        label="load index (below 1: every signal low)",
    ),
)


def scaling_specs(specs: list[Spec]) -> dict[str, Any]:
    """The scalable target and the step policies the alarms of ``specs`` invoke (PutScalingPolicy shapes)."""
    target = {
        "ServiceNamespace": "ecs",
        "ResourceId": "service/${ClusterName}/${ServiceName}",
        "ScalableDimension": "ecs:service:DesiredCount",
        "MinCapacity": Ref("MinCapacity"),
        "MaxCapacity": Ref("MaxCapacity"),
    }
    out: dict[str, Any] = {"target": target}
    for p in used_policies(specs):
        out[p.key] = {
            "PolicyName": f"${{AlarmNamePrefix}}-{p.suffix}",
            "ServiceNamespace": "ecs",
            "ResourceId": "service/${ClusterName}/${ServiceName}",
            "ScalableDimension": "ecs:service:DesiredCount",
            "PolicyType": "StepScaling",
            "StepScalingPolicyConfiguration": {
                "AdjustmentType": p.adjustment,
                "Cooldown": p.cooldown,
                "MetricAggregationType": p.aggregation,
                **({"MinAdjustmentMagnitude": p.min_magnitude} if p.min_magnitude is not None else {}),
                "StepAdjustments": list(p.steps),
            },
        }
    return out


def used_policies(specs: list[Spec]) -> list[Policy]:
    actions = {a for s in specs for a in s.actions}
    return [p for p in POLICIES if p.key in actions]


def has_scaling(specs: list[Spec]) -> bool:
    """Scaling needs a scale-out alarm and the scale-in alarm: a selection without them renders none of it."""
    actions = {a for s in specs for a in s.actions}
    return "scale_in" in actions and bool(actions & set(SCALE_OUT_ACTIONS))
