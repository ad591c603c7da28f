"""The ECS task as an OpenTelemetry resource (semantic-convention names): spans and metrics carry the same one.

Read from the task metadata the ECS source already fetched (its cached
properties), so the relay asks ECS nothing itself. ``aws.log.group.names``
lets the X-Ray console show, beside a trace, the log lines that carry its
trace id (the exporter's slow-request lines).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def ecs_resource(metadata: Mapping[str, object], container: str, log_groups: Sequence[str]) -> dict[str, object]:
    """Resource attributes from the ECS source's properties (``ecs_task_arn``...), plus the static ones."""
    out: dict[str, object] = {"cloud.provider": "aws", "cloud.platform": "aws_ecs"}
    task_arn = str(metadata.get("ecs_task_arn", ""))
    if task_arn.startswith("arn:"):
        out["aws.ecs.task.arn"] = task_arn
        out["aws.ecs.task.id"] = task_arn.rsplit("/", 1)[-1]
        parts = task_arn.split(":")
        if len(parts) > 4:
            out["cloud.region"] = parts[3]
            out["cloud.account.id"] = parts[4]
    cluster = str(metadata.get("ecs_cluster", ""))
    if cluster:
        out["aws.ecs.cluster.arn" if cluster.startswith("arn:") else "aws.ecs.cluster.name"] = cluster
    for prop, key in (("ecs_task_family", "aws.ecs.task.family"), ("ecs_task_revision", "aws.ecs.task.revision")):
        if metadata.get(prop) not in (None, ""):
            out[key] = str(metadata[prop])
    if metadata.get("availability_zone"):
        out["cloud.availability_zone"] = str(metadata["availability_zone"])
    if metadata.get("ecs_launch_type"):
        out["aws.ecs.launchtype"] = str(metadata["ecs_launch_type"]).lower()
    if container:
        out["container.name"] = container
    if log_groups:
        out["aws.log.group.names"] = list(log_groups)
    return out
