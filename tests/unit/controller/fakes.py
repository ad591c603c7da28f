"""A fleet, a queue and a clock in memory for the controller's unit tests (the outcome tests use moto's server:
tests/integration/controller/)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.fleet import FleetError, Instance, Task
from controller.inbox import Message

CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/gpus"
ACCOUNT = "arn:aws:ecs:us-east-1:123456789012"


def ci_arn(i: int) -> str:
    return f"{ACCOUNT}:container-instance/gpus/ci{i:04d}"


def task_arn(i: int, n: int = 0) -> str:
    return f"{ACCOUNT}:task/gpus/t{i:04d}x{n}"


def ec2(i: int) -> str:
    return f"i-{i:017x}"


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeFleet:
    """``n`` container instances, one task each, every instance in an Auto Scaling group."""

    n: int = 10
    tasks: dict[str, Task] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    groups: set[str] = field(default_factory=set)
    failing: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i in range(self.n):
            self.instances[ci_arn(i)] = Instance(ci_arn(i), ec2(i), "ACTIVE")
            self.tasks[task_arn(i)] = Task(task_arn(i), CLUSTER, "RUNNING", ci_arn(i))
            self.running[ci_arn(i)] = 1
            self.groups.add(ec2(i))

    def _call(self, name: str, arg: str) -> None:
        self.calls.append((name, arg))
        if name in self.failing:
            raise FleetError(name, "AccessDeniedException: not authorized")

    def actions(self, name: str) -> list[str]:
        return [a for n, a in self.calls if n == name]

    def task(self, task_arn: str) -> Task | None:
        self._call("ecs:DescribeTasks", task_arn)
        return self.tasks.get(task_arn)

    def instance(self, container_instance_arn: str) -> Instance | None:
        self._call("ecs:DescribeContainerInstances", container_instance_arn)
        return self.instances.get(container_instance_arn)

    def instance_count(self) -> int:
        self._call("ecs:ListContainerInstances", "")
        return len(self.instances)

    def running_tasks(self, container_instance_arn: str) -> int:
        self._call("ecs:ListTasks", container_instance_arn)
        return self.running.get(container_instance_arn, 0)

    def set_draining(self, container_instance_arn: str) -> None:
        self._call("ecs:UpdateContainerInstancesState", container_instance_arn)
        old = self.instances[container_instance_arn]
        self.instances[container_instance_arn] = Instance(old.arn, old.ec2_instance_id, "DRAINING")

    def set_unhealthy(self, ec2_instance_id: str) -> bool:
        self._call("autoscaling:SetInstanceHealth", ec2_instance_id)
        return ec2_instance_id in self.groups

    def in_group(self, ec2_instance_id: str) -> bool:
        self._call("autoscaling:DescribeAutoScalingInstances", ec2_instance_id)
        return ec2_instance_id in self.groups

    # --- what ECS and the group do meanwhile ---

    def tasks_leave(self, i: int) -> None:
        self.running[ci_arn(i)] = 0

    def replaced(self, i: int) -> None:
        """The group terminated the instance: out of the group and the cluster; a new one takes its place."""
        self.groups.discard(ec2(i))
        del self.instances[ci_arn(i)]
        new = 1000 + i
        self.instances[ci_arn(new)] = Instance(ci_arn(new), ec2(new), "ACTIVE")
        self.groups.add(ec2(new))

    def state_of(self, i: int) -> str:
        got = self.instances.get(ci_arn(i))
        return got.status if got else "GONE"


def body(i: int, fault: str = "xid", code: int | None = 79, reads: int = 1, **over: Any) -> str:
    doc: dict[str, Any] = {
        "type": "gpu_fault",
        "version": 1,
        "cluster": CLUSTER,
        "task_arn": task_arn(i),
        "ec2_instance_id": ec2(i),
        "gpu_uuid": f"GPU-{i:08d}-0000-0000-0000-000000000000",
        "gpu": 0,
        "nvml_index": 0,
        "fault": fault,
        "code": code,
        "reason": f"{fault} {code}",
        "evidence": {"reads": reads},
        "observed_at": 1_700_000_000.0,
    }
    doc.update(over)
    return json.dumps({k: v for k, v in doc.items() if v is not None})


def message(text: str, sender: str = "AIDAIT2UOQQY3AUEKVGXU", n: int = 0) -> Message:
    return Message(f"m{n}", f"r{n}", text, sender)


@dataclass
class FakeInbox:
    pending: list[Message] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failing: bool = False

    def receive(self, wait: float) -> list[Message]:
        if self.failing:
            raise FleetError("sqs:ReceiveMessage", "AccessDenied")
        got, self.pending = self.pending[:10], self.pending[10:]
        return got

    def delete(self, messages: Sequence[Message]) -> None:
        self.deleted += [m.id for m in messages]


class ListSink:
    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def send(self, events: list[bytes]) -> None:
        self.lines += events

    def take_dropped(self) -> int:
        return 0

    def close(self, timeout: float) -> None:
        return None

    def docs(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.lines]
