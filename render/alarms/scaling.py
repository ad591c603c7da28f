"""ECS step scaling on the GPU alarms, in RegisterScalableTarget / PutScalingPolicy shapes."""

from __future__ import annotations

from typing import Any

from ..base.params import Ref
from .spec import Spec

COOLDOWN = 300


SCALING_ACTIONS = ("scale_out", "scale_in", "scale_out_memory")


def scaling_specs() -> dict[str, Any]:
    """The scalable target and step policies, in RegisterScalableTarget / PutScalingPolicy shapes."""
    target = {
        "ServiceNamespace": "ecs",
        "ResourceId": "service/${ClusterName}/${ServiceName}",
        "ScalableDimension": "ecs:service:DesiredCount",
        "MinCapacity": Ref("MinCapacity"),
        "MaxCapacity": Ref("MaxCapacity"),
    }

    def policy(suffix: str, aggregation: str, step: dict[str, Any]) -> dict[str, Any]:
        return {
            "PolicyName": f"${{AlarmNamePrefix}}-{suffix}",
            "ServiceNamespace": "ecs",
            "ResourceId": "service/${ClusterName}/${ServiceName}",
            "ScalableDimension": "ecs:service:DesiredCount",
            "PolicyType": "StepScaling",
            "StepScalingPolicyConfiguration": {
                "AdjustmentType": "ChangeInCapacity",
                "Cooldown": COOLDOWN,
                "MetricAggregationType": aggregation,
                "StepAdjustments": [step],
            },
        }

    # Step bounds are offsets from the alarm threshold: [0, +inf) above it, (-inf, 0] below it.
    return {
        "target": target,
        "scale_out": policy("gpu-scale-out", "Average", {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}),
        "scale_in": policy("gpu-scale-in", "Average", {"MetricIntervalUpperBound": 0, "ScalingAdjustment": -1}),
        "scale_out_memory": policy(
            "gpu-memory-scale-out", "Maximum", {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}
        ),
    }


def has_scaling(specs: list[Spec]) -> bool:
    """Scaling needs its three alarms: a selection without the GPU metrics renders none of it."""
    return set(SCALING_ACTIONS) <= {a for s in specs for a in s["_actions"]}
