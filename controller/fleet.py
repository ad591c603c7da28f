"""The fleet as the controller sees and changes it: ECS and Auto Scaling behind one small interface.

:class:`Fleet` is what the decisions need; :class:`AwsFleet` is it on boto3 (endpoints, credentials and call
retries from botocore's usual settings, ``AWS_ENDPOINT_URL`` too). Every failing call is one
:class:`FleetError` naming the call, so a caller logs it, counts it and tries again later; nothing half-done
is left behind because every change here is idempotent (DRAINING twice, Unhealthy twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

MAX_PAGES = 50  # ListContainerInstances: 100 a page, so up to 5,000 instances


class FleetError(Exception):
    """An AWS call failed; ``call`` names it (``ecs:DescribeTasks``)."""

    def __init__(self, call: str, message: str) -> None:
        super().__init__(f"{call}: {message}")
        self.call = call
        self.message = message


@dataclass(frozen=True)
class Task:
    arn: str
    cluster_arn: str
    last_status: str
    container_instance_arn: str


@dataclass(frozen=True)
class Instance:
    arn: str
    ec2_instance_id: str
    status: str  # ACTIVE, DRAINING, ...


class Fleet(Protocol):
    """What the controller reads and changes of its cluster."""

    def task(self, task_arn: str) -> Task | None:
        """The task as ECS describes it in this cluster; None when ECS does not know it there."""
        ...

    def instance(self, container_instance_arn: str) -> Instance | None:
        """The container instance; None when it is not registered in this cluster."""
        ...

    def instance_count(self) -> int:
        """Container instances registered in the cluster (ACTIVE and DRAINING)."""
        ...

    def running_tasks(self, container_instance_arn: str) -> int:
        """Tasks still placed on the container instance (ECS ListTasks, desired status RUNNING)."""
        ...

    def set_draining(self, container_instance_arn: str) -> None: ...

    def set_unhealthy(self, ec2_instance_id: str) -> bool:
        """Mark it Unhealthy in its Auto Scaling group (which replaces it); False: it is in no group."""
        ...

    def in_group(self, ec2_instance_id: str) -> bool:
        """Whether the instance is still a member of an Auto Scaling group."""
        ...


def error_text(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        code, message = err.get("Code", ""), err.get("Message", "")
        if code:
            return f"{code}: {message}" if message else str(code)
    return f"{type(exc).__name__}: {exc}"


def boto_client(service: str, timeout: float = 10.0, region: str = "") -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=timeout,
        read_timeout=timeout,
        retries={"mode": "standard", "max_attempts": 3},
        user_agent_extra="triton-fleet-controller",
    )
    return boto3.session.Session().client(service, config=config, **({"region_name": region} if region else {}))


class AwsFleet:
    """:class:`Fleet` on ECS and Auto Scaling."""

    def __init__(self, cluster: str, ecs: Any = None, autoscaling: Any = None) -> None:
        self.cluster = cluster
        self.ecs = ecs if ecs is not None else boto_client("ecs")
        self.autoscaling = autoscaling if autoscaling is not None else boto_client("autoscaling")

    def _call(self, name: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except Exception as exc:
            raise FleetError(name, error_text(exc)) from None

    def task(self, task_arn: str) -> Task | None:
        got = self._call("ecs:DescribeTasks", self.ecs.describe_tasks, cluster=self.cluster, tasks=[task_arn])
        for t in got.get("tasks", []):
            if t.get("taskArn") == task_arn:
                return Task(
                    task_arn,
                    str(t.get("clusterArn", "")),
                    str(t.get("lastStatus", "")),
                    str(t.get("containerInstanceArn", "")),
                )
        return None

    def instance(self, container_instance_arn: str) -> Instance | None:
        got = self._call(
            "ecs:DescribeContainerInstances",
            self.ecs.describe_container_instances,
            cluster=self.cluster,
            containerInstances=[container_instance_arn],
        )
        for c in got.get("containerInstances", []):
            if c.get("containerInstanceArn") == container_instance_arn:
                return Instance(container_instance_arn, str(c.get("ec2InstanceId", "")), str(c.get("status", "")))
        return None

    def instance_count(self) -> int:
        count, token = 0, ""
        for _ in range(MAX_PAGES):
            kwargs: dict[str, Any] = {"cluster": self.cluster, "maxResults": 100}
            if token:
                kwargs["nextToken"] = token
            got = self._call("ecs:ListContainerInstances", self.ecs.list_container_instances, **kwargs)
            count += len(got.get("containerInstanceArns", []))
            token = got.get("nextToken") or ""
            if not token:
                break
        return count

    def running_tasks(self, container_instance_arn: str) -> int:
        got = self._call(
            "ecs:ListTasks",
            self.ecs.list_tasks,
            cluster=self.cluster,
            containerInstance=container_instance_arn,
            desiredStatus="RUNNING",
            maxResults=100,
        )
        return len(got.get("taskArns", []))

    def set_draining(self, container_instance_arn: str) -> None:
        got = self._call(
            "ecs:UpdateContainerInstancesState",
            self.ecs.update_container_instances_state,
            cluster=self.cluster,
            containerInstances=[container_instance_arn],
            status="DRAINING",
        )
        if got.get("failures"):
            why = "; ".join(str(f.get("reason", f)) for f in got["failures"])
            raise FleetError("ecs:UpdateContainerInstancesState", why)

    def set_unhealthy(self, ec2_instance_id: str) -> bool:
        try:
            self.autoscaling.set_instance_health(
                InstanceId=ec2_instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
            )
        except Exception as exc:
            message = error_text(exc)
            if message.startswith("ValidationError") and "not found" in message.lower():
                return False  # no group would replace it
            raise FleetError("autoscaling:SetInstanceHealth", message) from None
        return True

    def in_group(self, ec2_instance_id: str) -> bool:
        got = self._call(
            "autoscaling:DescribeAutoScalingInstances",
            self.autoscaling.describe_auto_scaling_instances,
            InstanceIds=[ec2_instance_id],
        )
        return any(
            i.get("InstanceId") == ec2_instance_id and i.get("LifecycleState") not in ("Terminated", "Detached")
            for i in got.get("AutoScalingInstances", [])
        )
