"""The controller on moto's server (SQS, S3, ECS, Auto Scaling): ten container instances in a group, one task
each, hosts reporting through the exporter's own report code, the controller in process (real boto3 clients)
and as ``python -m controller``.

Moto keeps a task RUNNING and a DRAINING instance's tasks where they are, and marks an instance Unhealthy
without replacing it; the test plays the rest of AWS: it stops the tasks of an instance ECS shows DRAINING
(the service scheduler) and terminates an Unhealthy instance, registering its successor (the group).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from controller.drains import Bounds, Limit
from controller.fleet import AwsFleet
from controller.inbox import SqsInbox
from controller.metrics import Recorder
from controller.service import Controller
from controller.state import S3Store, State
from exporter.gpufaults.drain import Drainer
from exporter.gpufaults.verdict import Fault
from telemetry.sinks import Output, make_sink
from tests.support.msync import CREDENTIALS, Moto, moto, unique
from tests.support.paths import REPO

__all__ = ["moto"]  # the session's moto server (tests/support/msync.py), a fixture

N = 10


@pytest.fixture
def steady_tasks(moto: Moto) -> Iterator[None]:
    """Moto advances a task's status on every DescribeTasks; keep tasks RUNNING until stopped, as ECS does."""

    def post(path: str, doc: dict[str, Any]) -> None:
        req = urllib.request.Request(moto.url + path, json.dumps(doc).encode(), method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    post("/moto-api/state-manager/set-transition",
         {"model_name": "ecs::task", "transition": {"progression": "manual", "times": 1_000_000}})  # fmt: skip
    yield
    post("/moto-api/state-manager/unset-transition", {"model_name": "ecs::task"})


@dataclass
class World:
    moto: Moto
    cluster: str
    cluster_arn: str
    group: str
    family: str
    queue_url: str
    bucket: str
    ci: dict[str, str] = field(default_factory=dict)  # ec2 id -> container instance ARN
    tasks: dict[str, str] = field(default_factory=dict)  # ec2 id -> its task ARN
    replaced: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ecs = self.moto.client("ecs")
        self.asg = self.moto.client("autoscaling")

    def register(self, ec2: str) -> None:
        ci = self.ecs.register_container_instance(
            cluster=self.cluster, instanceIdentityDocument=json.dumps({"instanceId": ec2})
        )["containerInstance"]["containerInstanceArn"]
        (task,) = self.ecs.start_task(cluster=self.cluster, taskDefinition=self.family, containerInstances=[ci])[
            "tasks"
        ]
        self.ci[ec2], self.tasks[ec2] = ci, task["taskArn"]

    def group_instances(self) -> dict[str, str]:
        got = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self.group])["AutoScalingGroups"][0]
        return {i["InstanceId"]: i["HealthStatus"] for i in got["Instances"]}

    def status(self, ec2: str) -> str:
        got = self.ecs.describe_container_instances(cluster=self.cluster, containerInstances=[self.ci[ec2]])
        return str(got["containerInstances"][0]["status"]) if got["containerInstances"] else "GONE"

    def running(self, ec2: str) -> list[str]:
        return list(
            self.ecs.list_tasks(cluster=self.cluster, containerInstance=self.ci[ec2], desiredStatus="RUNNING")[
                "taskArns"
            ]
        )

    def play_aws(self) -> None:
        """One step of the scheduler and the group; records any breach of the bounds."""
        health = self.group_instances()
        out = [
            e
            for e in self.ci
            if e not in self.replaced and (self.status(e) == "DRAINING" or health.get(e) == "Unhealthy")
        ]
        if len(out) > 1:
            self.violations.append(f"{len(out)} out of service at once: {out}")
        for ec2 in out:
            if health.get(ec2) == "Unhealthy":
                if self.running(ec2):
                    self.violations.append(f"{ec2} marked Unhealthy while its tasks ran")
                self.asg.terminate_instance_in_auto_scaling_group(InstanceId=ec2, ShouldDecrementDesiredCapacity=False)
                self.ecs.deregister_container_instance(cluster=self.cluster, containerInstance=self.ci[ec2], force=True)
                self.replaced.append(ec2)
                for new in set(self.group_instances()) - set(self.ci):
                    self.register(new)
            else:
                for task in self.running(ec2):
                    self.ecs.stop_task(cluster=self.cluster, task=task, reason="drained")

    def report(self, ec2: str, xid: int = 79) -> None:
        """The exporter's own report code, as a host with a fatal XID runs it."""
        sqs = self.moto.client("sqs")
        drainer = Drainer(
            "http://unused",
            self.queue_url,
            clients=lambda region, timeout: sqs,
            metadata=lambda url, timeout: (self.cluster_arn, self.tasks[ec2]),
            instance_id=lambda: ec2 if ec2.startswith("i-") else "",
        )
        drainer.unhealthy(Fault("GPU-" + ec2, 0, 0, "xid", f"XID {xid}", xid, drains=xid != 63))
        assert drainer.wait(30) and drainer.done, drainer.last_error


@pytest.fixture
def world(moto: Moto, steady_tasks: None) -> World:
    ec2, asg, ecs = moto.client("ec2"), moto.client("autoscaling"), moto.client("ecs")
    name = unique("ctl-")
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={"ImageId": "ami-12c6146b"})
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name, "Version": "$Latest"},
        MinSize=N, MaxSize=2 * N, DesiredCapacity=N, VPCZoneIdentifier=subnet,
    )  # fmt: skip
    cluster_arn = ecs.create_cluster(clusterName=name)["cluster"]["clusterArn"]
    ecs.register_task_definition(family=name, containerDefinitions=[{"name": "t", "image": "t", "memory": 64}])
    queue_url = moto.client("sqs").create_queue(QueueName=name)["QueueUrl"]
    moto.client("s3").create_bucket(Bucket=name)
    w = World(moto, name, cluster_arn, name, name, queue_url, name)
    for instance in w.group_instances():
        w.register(instance)
    assert len(w.ci) == N
    return w


def controller(w: World, sink_path: Path, **bounds: Any) -> Controller:
    return Controller(
        w.cluster,
        SqsInbox(w.queue_url, w.moto.client("sqs")),
        AwsFleet(w.cluster, w.moto.client("ecs"), w.moto.client("autoscaling")),
        S3Store(w.bucket, "controller/state.json", w.moto.client("s3")),
        Recorder("Triton", make_sink(Output("file", path=str(sink_path)), 1000, 1.0), w.cluster),
        Bounds(**bounds),
    )


def stranger_task(moto: Moto) -> str:
    """A task running in another cluster of the same account."""
    ecs, ec2 = moto.client("ecs"), moto.client("ec2")
    other = ecs.create_cluster(clusterName=unique("other-"))["cluster"]["clusterName"]
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    ecs.register_container_instance(cluster=other, instanceIdentityDocument=json.dumps({"instanceId": instance}))
    ecs.register_task_definition(family=other, containerDefinitions=[{"name": "t", "image": "t", "memory": 64}])
    return str(ecs.run_task(cluster=other, taskDefinition=other)["tasks"][0]["taskArn"])


def emf(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_five_faults_at_once_drain_one_instance_at_a_time_each_replaced_after_its_tasks_left(
    world: World, tmp_path: Path
) -> None:
    faulty = list(world.ci)[:5]
    for ec2 in faulty:
        world.report(ec2)
    c = controller(world, tmp_path / "emf", pause_above=0.6, max_per_hour=10, max_draining=Limit(fraction=0.1))
    for _ in range(60):
        c.run_once()
        world.play_aws()
        if len(world.replaced) == 5:
            c.run_once()
            break
    assert world.violations == []
    assert world.replaced == faulty  # each in its turn, in the order reported
    state = State.from_json(c.store.load()[0] or b"")
    assert state.entries == {} and sorted(state.done) == sorted(world.ci[e] for e in faulty)
    docs = emf(tmp_path / "emf")
    assert sum(d["GpuDrainsStarted"] for d in docs) == 5 and sum(d["GpuReplacementsStarted"] for d in docs) == 5
    assert max(d["GpuDrainsInProgress"] for d in docs) == 1 and {d["GpuDrainsPaused"] for d in docs} == {0.0}


def test_the_service_pauses_above_a_fifth_refuses_a_stranger_ignores_xid_63_and_resumes(
    world: World, moto: Moto, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CONTROLLER_"))}
    env |= {**CREDENTIALS, "AWS_ENDPOINT_URL": moto.url, "CONTROLLER_CLUSTER": world.cluster,
            "CONTROLLER_STATE_BUCKET": world.bucket, "CONTROLLER_QUEUE_URL": world.queue_url}  # fmt: skip
    out = tmp_path / "emf"
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller", "--interval", "0.3", "--output", f"file:{out}"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "err").open("wb"),
    )  # fmt: skip
    instances = list(world.ci)

    def until(what: str, predicate: Any) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "err").read_text()[-3000:]
            if predicate():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: {(tmp_path / 'err').read_text()[-2000:]}")

    def total(name: str) -> float:
        return sum(d.get(name, 0.0) for d in emf(out))

    try:
        for ec2 in instances[5:]:
            world.report(ec2, xid=63)  # a host never sends it (report-only there too); the controller's rule holds
        until("the XID 63 reports", lambda: total("GpuReportsReportOnly") == 5)
        stranger = stranger_task(moto)
        world.tasks["stranger"] = stranger
        world.report("stranger")  # a task of another cluster, naming no instance of ours
        until("the refusal", lambda: total("GpuReportsRefused") == 1)
        assert [world.status(e) for e in instances] == ["ACTIVE"] * N
        world.report(instances[0])
        until("the first drain", lambda: world.status(instances[0]) == "DRAINING")
        for ec2 in instances[1:3]:
            world.report(ec2)
        until("the pause", lambda: emf(out)[-1]["GpuDrainsPaused"] == 1.0)
        time.sleep(1.5)  # passes go on, paused
        assert [world.status(e) for e in instances].count("DRAINING") == 1
        assert emf(out)[-1]["GpuDrainsWaiting"] == 2.0
        resumed = subprocess.run(
            [sys.executable, "-m", "controller", "resume"], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.startswith("resumed GPU drains (s3://")
        until("the resume", lambda: emf(out)[-1]["GpuDrainsPaused"] == 0.0)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    log = [json.loads(x) for x in (tmp_path / "err").read_text().splitlines() if x.startswith("{")]
    refused = [e for e in log if e["msg"].startswith("report refused (task)")]
    assert refused and refused[0]["level"] == "warning" and stranger in refused[0]["msg"]
    paused = [e for e in log if e["msg"].startswith("GPU drains paused")]
    assert len(paused) == 1 and "3 of 10 container instances reported" in paused[0]["msg"]
    assert sum("XID 63 is report-only" in e["msg"] for e in log) == 5
