"""ECS service scaling on what predicts overload (docs/scaling.md), as data.

Scale out: one step policy per leading signal (Triton's backlog, its queue
time, TensorRT-LLM's waiting requests), each invoked by a high-resolution
alarm on the signal's service-wide set (10-second periods, three of three:
30 s of sustained overload, not a burst). Target tracking is not used: its
alarms evaluate 60-second periods (three of them) and cannot meet 30 s.
Each policy adds one task when the signal is above its threshold and two
when it is above twice the threshold; during the cooldown only the larger
step adds anything, so a task that is still starting is not doubled.

Scale in: one policy, invoked by a standard alarm on the sum of every signal
over its own scale-in level (pending and queue time against their scale-out
thresholds, GPU utilisation against ``GpuScaleInUtilization``) staying below
1 for 15 minutes: only when every signal is low, slowly, never below
``MinCapacity`` (the scalable target's), with a cooldown that is long next
to the scale-out's so the two cannot flap. GPU memory only notifies: a new
task does not change a GPU's memory, and engines that reserve memory up
front (vLLM, TensorRT-LLM) read near-full all day.

Policies are in RegisterScalableTarget / PutScalingPolicy shapes; a policy
exists when an alarm of the render names its action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base.params import Ref
from .spec import MathAlarm, MetricAlarm, Spec, Term

SCALE_OUT_PERIOD = 10  # seconds: a high-resolution alarm (the signals are emitted every 10 s)
SCALE_OUT_POINTS = 3  # of 3: 30 s of sustained overload
SCALE_IN_PERIOD = 60
SCALE_IN_POINTS = 15  # of 15: 15 minutes of every signal low
SCALE_IN_BELOW = 1.0  # the scale-in alarm's threshold on the sum of normalised signals


@dataclass(frozen=True)
class Policy:
    """A step scaling policy: ``key`` is the action alarms name in ``actions``, ``logical`` its template id."""

    key: str
    suffix: str
    logical: str
    aggregation: str
    steps: tuple[dict[str, Any], ...]
    cooldown: Ref


def _out(key: str, suffix: str, logical: str, aggregation: str, threshold: str) -> Policy:
    # Step bounds are offsets from the alarm threshold T: [0, T) adds one task, [T, +inf) (the signal above 2T)
    # two.
    return Policy(
        key,
        suffix,
        logical,
        aggregation,
        (
            {"MetricIntervalLowerBound": 0, "MetricIntervalUpperBound": Ref(threshold), "ScalingAdjustment": 1},
            {"MetricIntervalLowerBound": Ref(threshold), "ScalingAdjustment": 2},
        ),
        Ref("ScaleOutCooldown"),
    )


POLICIES: tuple[Policy, ...] = (
    _out("scale_out_pending", "scale-out-pending", "ScaleOutPendingPolicy", "Average", "PendingRequestsScaleOut"),
    _out(
        "scale_out_queue_time",
        "scale-out-queue-time",
        "ScaleOutQueueTimePolicy",
        "Average",
        "QueueTimeScaleOutMicroseconds",
    ),
    _out(
        "scale_out_llm_waiting",
        "scale-out-llm-waiting",
        "ScaleOutLlmWaitingPolicy",
        "Average",
        "RequestsWaitingScaleOut",
    ),
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

SCALING_ALARMS: tuple[MetricAlarm | MathAlarm, ...] = (
    MetricAlarm(
        suffix="scale-out-pending",
        description="Requests waiting in Triton's queue per task (every model; the service's average over 10 s) "
        "stayed above PendingRequestsScaleOut for 30 s: add a task (two above twice the threshold). The backlog "
        "grows as soon as arrivals outpace the model instances (docs/scaling.md).",
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
        "service's average) stayed above QueueTimeScaleOutMicroseconds for 30 s: add a task (two above twice the "
        "threshold).",
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
        "full; add a task (two above twice the threshold).",
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
        description="Every signal low for 15 minutes: pending requests (worst task and sample) over "
        "PendingRequestsScaleOut, queue time (worst) over QueueTimeScaleOutMicroseconds, GPU utilization (service "
        "average) over "
        "GpuScaleInUtilization, and TensorRT-LLM's waiting requests and KV cache where present, summed, stayed "
        "below 1: remove a task (never below MinCapacity). No data: no scale-in.",
        terms=(
            Term("pending", "TaskPendingRequests", "Maximum", Ref("PendingRequestsScaleOut")),
            Term("queue", "TaskQueueLatencyMax", "Maximum", Ref("QueueTimeScaleOutMicroseconds")),
            Term("gpu", "GpuUtilization", "Average", Ref("GpuScaleInUtilization"), optional=True),
            Term("waiting", "TaskRequestsWaiting", "Maximum", Ref("RequestsWaitingScaleOut"), optional=True),
            Term("kvcache", "KvCacheUtilization", "Maximum", Ref("KvCacheUtilizationThreshold"), optional=True),
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
                "AdjustmentType": "ChangeInCapacity",
                "Cooldown": p.cooldown,
                "MetricAggregationType": p.aggregation,
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
