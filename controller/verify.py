"""Reports are checked, not trusted: who sent it, and is the task it names running where it says.

A report passes when

- it names this controller's cluster;
- where SQS says the sender is a role session (``SenderId`` ``AROA...:<session>``), the session is the task
  the report names (ECS names a task role's session after the task's id), so one task cannot report for
  another;
- ECS (``DescribeTasks``) shows that task RUNNING in this cluster, on a container instance of this cluster
  (``DescribeContainerInstances``) whose EC2 instance is the one the report names, when it names one.

A report that fails is :class:`Refused` (logged, counted, deleted). A failing AWS call is not a refusal: the
message stays in the queue and is read again (:class:`~.fleet.FleetError`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .fleet import Fleet, Instance
from .reports import FaultReport, cluster_name

ROLE_SESSION = re.compile(r"^AROA[A-Z0-9]+:(?P<session>.+)$")


class Refused(Exception):
    """A report that fails a check; ``check`` names it (for the log line and its field)."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(message)
        self.check = check
        self.message = message


@dataclass(frozen=True)
class Checked:
    """A report and the instance ECS says it came from."""

    report: FaultReport
    instance: Instance


def check_sender(report: FaultReport, sender_id: str) -> None:
    m = ROLE_SESSION.match(sender_id)
    if m and m.group("session") != report.task_id:
        raise Refused(
            "sender",
            f"sent by role session {m.group('session')[:80]!r}, which is not the task the report names "
            f"({report.task_id})",
        )


def check(report: FaultReport, sender_id: str, fleet: Fleet, cluster: str) -> Checked:
    """The report and its instance; raises Refused, or FleetError when ECS cannot be asked now."""
    if cluster_name(report.cluster) != cluster_name(cluster):
        raise Refused("cluster", f"names cluster {cluster_name(report.cluster)[:80]!r}, not {cluster_name(cluster)}")
    check_sender(report, sender_id)
    task = fleet.task(report.task_arn)
    if task is None or cluster_name(task.cluster_arn) != cluster_name(cluster):
        raise Refused("task", f"task {report.task_arn} is not a task of cluster {cluster_name(cluster)}")
    if task.last_status != "RUNNING":
        raise Refused("task", f"task {report.task_arn} is {task.last_status or 'in no state'}, not RUNNING")
    if not task.container_instance_arn:
        raise Refused("instance", f"task {report.task_arn} runs on no container instance (not EC2 capacity)")
    if report.container_instance_arn and report.container_instance_arn != task.container_instance_arn:
        raise Refused(
            "instance",
            f"names container instance {report.container_instance_arn}; the task runs on {task.container_instance_arn}",
        )
    instance = fleet.instance(task.container_instance_arn)
    if instance is None or not instance.ec2_instance_id:
        raise Refused("instance", f"container instance {task.container_instance_arn} is outside the cluster")
    if report.ec2_instance_id and report.ec2_instance_id != instance.ec2_instance_id:
        raise Refused(
            "instance",
            f"names EC2 instance {report.ec2_instance_id}; the task runs on {instance.ec2_instance_id}",
        )
    return Checked(report, instance)
