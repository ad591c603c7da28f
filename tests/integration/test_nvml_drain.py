"""``--gpu-fault-action drain`` against moto's server (ECS and Auto Scaling), in process and with the exporter
running as a process on the fake NVML (``python -m tests.support.nvml_fake``).

The fleet in moto: a cluster, an Auto Scaling group with one instance, that instance registered as the cluster's
container instance, and Triton tasks placed on it. A proxy in front of moto records every AWS call and refuses the
ones a test names with AccessDenied, as AWS answers a task role that lacks the permission, so calls can fail and
then succeed. The task metadata endpoint is a loopback server answering what ECS's agent answers at ``/task``.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from botocore.stub import Stubber

from demo.payloads import triton_metrics
from exporter.gpufaults import GpuHealth
from exporter.gpufaults.drain import ATTEMPTS, FAILURES, Drainer, boto_clients, read_task_metadata
from exporter.gpufaults.verdict import Fault
from exporter.sources.nvml import NvmlSource
from tests.support import nvml_fake as fk
from tests.support.fakes import FakeHttp, closed_port, respond
from tests.support.helpers import Capture
from tests.support.msync import CREDENTIALS, REGION, Moto, moto, unique
from tests.support.paths import REPO

__all__ = ["moto"]  # the session's moto server (tests/support/msync.py), a fixture

ROOT = REPO
U = fk.UUIDS
DEADLINE = 90.0  # seconds to await an event: generous, the machine is shared


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# --- the fleet in moto -------------------------------------------------------------------------------------


@dataclass
class Fleet:
    moto: Moto
    cluster: str
    cluster_arn: str
    group: str
    instance: str
    container_instance: str
    tasks: list[str] = field(default_factory=list)

    def status(self) -> str:
        ecs = self.moto.client("ecs")
        got = ecs.describe_container_instances(cluster=self.cluster, containerInstances=[self.container_instance])
        return str(got["containerInstances"][0]["status"])

    def health(self) -> str:
        asg = self.moto.client("autoscaling")
        return str(
            asg.describe_auto_scaling_instances(InstanceIds=[self.instance])["AutoScalingInstances"][0]["HealthStatus"]
        )

    def metadata(self, task: int = 0) -> bytes:
        """What the ECS agent answers at ${ECS_CONTAINER_METADATA_URI_V4}/task (the fields the exporter reads)."""
        return orjson.dumps(
            {
                "Cluster": self.cluster_arn,
                "TaskARN": self.tasks[task],
                "Family": "triton",
                "Revision": "3",
                "LaunchType": "EC2",
                "AvailabilityZone": f"{REGION}a",
            }
        )


def new_fleet(moto: Moto, tasks: int = 1) -> Fleet:
    ec2, asg, ecs = moto.client("ec2"), moto.client("autoscaling"), moto.client("ecs")
    name = unique("gpu-")
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    image = "ami-12c6146b"  # one of moto's own AMIs (listing them costs seconds)
    ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": image, "InstanceType": "g5.12xlarge"}
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name, "Version": "$Latest"},
        MinSize=1,
        MaxSize=2,
        DesiredCapacity=1,
        VPCZoneIdentifier=subnet,
    )
    instance = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"][0]
    cluster_arn = ecs.create_cluster(clusterName=name)["cluster"]["clusterArn"]
    ci = ecs.register_container_instance(
        cluster=name, instanceIdentityDocument=json.dumps({"instanceId": instance["InstanceId"]})
    )["containerInstance"]
    ecs.register_task_definition(
        family=name, containerDefinitions=[{"name": "triton-server", "image": "t", "memory": 512}]
    )
    fleet = Fleet(moto, name, cluster_arn, name, instance["InstanceId"], ci["containerInstanceArn"])
    for _ in range(tasks):
        (task,) = ecs.run_task(cluster=name, taskDefinition=name, launchType="EC2")["tasks"]
        assert task["containerInstanceArn"] == fleet.container_instance
        fleet.tasks.append(task["taskArn"])
    assert fleet.status() == "ACTIVE" and fleet.health() == "Healthy"
    return fleet


@pytest.fixture
def fleet(moto: Moto) -> Fleet:
    return new_fleet(moto, tasks=2)


# --- a proxy in front of moto: every call recorded, the denied ones refused as AWS refuses them --------------


class AwsProxy:
    def __init__(self, target: str) -> None:
        self.target = urlsplit(target)
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (action, parameters)
        self.deny: set[str] = set()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                target = self.headers.get("X-Amz-Target", "")
                if target:  # ECS: JSON protocol
                    action, params = target.rsplit(".", 1)[1], json.loads(body or b"{}")
                else:  # Auto Scaling: query protocol
                    form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                    action, params = form.pop("Action", ""), form
                proxy.calls.append((action, params))
                if action in proxy.deny:
                    self._refuse(action, bool(target))
                    return
                conn = http.client.HTTPConnection(proxy.target.hostname, proxy.target.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request("POST", self.path, body, headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            def _refuse(self, action: str, json_protocol: bool) -> None:
                message = f"User: arn:aws:sts::123456789012:assumed-role/task/t is not authorized to perform: {action}"
                if json_protocol:
                    data = json.dumps({"__type": "AccessDeniedException", "message": message}).encode()
                    status, ctype = 400, "application/x-amz-json-1.1"
                else:
                    data = (
                        '<ErrorResponse xmlns="https://autoscaling.amazonaws.com/doc/2011-01-01/"><Error>'
                        f"<Type>Sender</Type><Code>AccessDenied</Code><Message>{message}</Message></Error>"
                        "<RequestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</RequestId></ErrorResponse>"
                    ).encode()
                    status, ctype = 403, "text/xml"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def actions(self) -> list[str]:
        return [a for a, _ in self.calls]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(moto: Moto) -> Iterator[AwsProxy]:
    p = AwsProxy(moto.url)
    yield p
    p.close()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, proxy: AwsProxy) -> AwsProxy:
    """botocore's usual settings, pointing at the proxy: what the drain's clients read."""
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    return proxy


@pytest.fixture
def metadata(fleet: Fleet) -> Iterator[FakeHttp]:
    with FakeHttp(respond(fleet.metadata(0), content_type="application/json")) as server:
        yield server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fault(gpu: int = 0) -> Fault:
    return Fault(U[gpu], gpu, gpu, "xid", "XID 79, GPU has fallen off the bus", 79)


def drained(drainer: Drainer) -> Drainer:
    assert drainer.wait(DEADLINE), "the drain did not finish"
    return drainer


# --- in process ----------------------------------------------------------------------------------------------


def test_drain_sets_draining_then_unhealthy_and_says_which_instance(fleet: Fleet, aws_env: AwsProxy, metadata) -> None:
    drainer = Drainer(metadata.url + "/v4/abc")
    with Capture.on("exporter") as cap:
        said = drainer.unhealthy(fault())
        drained(drainer)
    assert said.startswith("draining this instance")
    assert fleet.status() == "DRAINING" and fleet.health() == "Unhealthy"
    assert aws_env.actions() == [
        "DescribeTasks",
        "DescribeContainerInstances",
        "UpdateContainerInstancesState",
        "SetInstanceHealth",
    ]
    params = dict(aws_env.calls)
    assert params["DescribeTasks"] == {"cluster": fleet.cluster_arn, "tasks": [fleet.tasks[0]]}
    assert params["SetInstanceHealth"] == {
        "InstanceId": fleet.instance,
        "HealthStatus": "Unhealthy",
        "ShouldRespectGracePeriod": "false",
        "Version": "2011-01-01",
    }
    (line,) = [r for r in cap.records if r.name == "exporter.gpu_drain"]
    assert line.levelno == logging.WARNING
    assert fleet.container_instance in line.getMessage() and fleet.instance in line.getMessage()
    assert "marked Unhealthy in its Auto Scaling group, which replaces it" in line.getMessage()
    fields = line.fields  # type: ignore[attr-defined]
    assert fields["ec2_instance_id"] == fleet.instance and fields["container_instance_arn"] == fleet.container_instance
    assert fields["gpus"] == [U[0]] and fields["was_draining"] is False
    assert drainer.series() == [(ATTEMPTS, 1.0), (FAILURES, 0.0)]
    assert drainer.unhealthy(fault(1)).startswith("this instance was drained already (container instance")
    drainer.poll()
    assert drainer.wait(1) and len(aws_env.calls) == 4  # done: nothing more is called


def test_a_failing_call_is_logged_and_retried_on_later_cycles_until_it_succeeds(
    fleet: Fleet, aws_env: AwsProxy, metadata
) -> None:
    clock = Clock()
    drainer = Drainer(metadata.url, retry_interval=60.0, clock=clock)
    aws_env.deny = {"DescribeTasks"}
    with Capture.on("exporter") as cap:
        drainer.unhealthy(fault())
        drained(drainer)
        failed = [r for r in cap.records if r.name == "exporter.gpu_drain"]
    assert [r.levelno for r in failed] == [logging.ERROR]
    assert (
        failed[0]
        .getMessage()
        .startswith("GPU drain failed at describe: ecs:DescribeTasks: AccessDeniedException: User: ")
    )
    assert "stays in service until a retry succeeds (in 60s)" in failed[0].getMessage()
    assert fleet.status() == "ACTIVE" and drainer.series() == [(ATTEMPTS, 1.0), (FAILURES, 1.0)]
    drainer.poll()  # not due yet
    assert drainer.wait(1) and drainer.attempts == 1
    clock.now += 60
    drainer.poll()
    drained(drainer)
    assert drainer.failures == 2 and drainer.next_try == clock.now + 120  # doubling, up to 5 minutes
    # The task role may describe and drain, not yet mark the instance Unhealthy: DRAINING holds.
    aws_env.deny = {"SetInstanceHealth"}
    clock.now += 120
    drainer.poll()
    drained(drainer)
    assert fleet.status() == "DRAINING" and fleet.health() == "Healthy" and not drainer.done
    assert "autoscaling:SetInstanceHealth: AccessDenied" in drainer.last_error
    aws_env.deny = set()
    clock.now += 240
    before = len(aws_env.calls)
    drainer.poll()
    drained(drainer)
    assert drainer.done and fleet.health() == "Unhealthy"
    assert aws_env.actions()[before:] == ["SetInstanceHealth"]  # from the first step not done
    assert drainer.series() == [(ATTEMPTS, 4.0), (FAILURES, 3.0)]
    assert aws_env.actions().count("UpdateContainerInstancesState") == 1


def test_two_faults_on_one_instance_drain_it_once(fleet: Fleet, aws_env: AwsProxy, metadata) -> None:
    nvml = fk.xid_events()
    drainer = Drainer(metadata.url)
    source = NvmlSource(nvml, {}, health=GpuHealth(drainer))
    source.start()
    source.collect(5.0)
    nvml.inject_xid(0, 48)
    nvml.inject_xid(1, 79)
    with Capture.on("exporter") as cap:
        got = source.collect(5.0)
        drained(drainer)
        nvml.lose(1)
        source.collect(5.0)
    lines = [r.getMessage() for r in cap.records if r.name == "exporter.gpu_health"]
    assert lines == [
        f"GPU 0 ({U[0]}) unhealthy: XID 48, double bit ECC error; draining this instance: ECS DRAINING, then Auto "
        "Scaling Unhealthy (the drain logs its outcome)",
        f"GPU 1 ({U[1]}) unhealthy: XID 79, GPU has fallen off the bus; this instance is being drained already "
        "(for GPU 0)",
    ]
    assert aws_env.actions().count("UpdateContainerInstancesState") == 1
    assert aws_env.actions().count("SetInstanceHealth") == 1
    assert fleet.status() == "DRAINING" and fleet.health() == "Unhealthy"
    assert drainer.attempts == 1 and ATTEMPTS in got.samples.samples
    source.close()


def test_two_tasks_on_the_instance_seeing_the_same_fault_drain_it_safely(fleet: Fleet, aws_env: AwsProxy) -> None:
    servers = [FakeHttp(respond(fleet.metadata(i), content_type="application/json")) for i in range(2)]
    try:
        drainers = [Drainer(s.url) for s in servers]
        for d in drainers:  # at once, as two sidecars seeing one XID do
            d.unhealthy(fault())
        for d in drainers:
            drained(d)
    finally:
        for s in servers:
            s.close()
    assert all(d.done and d.failures == 0 for d in drainers)
    assert fleet.status() == "DRAINING" and fleet.health() == "Unhealthy"
    assert {d.host.container_instance for d in drainers} == {fleet.container_instance}
    assert aws_env.actions().count("SetInstanceHealth") == 2  # idempotent: asked twice, replaced once


def test_an_exporter_restarted_after_the_drain_finds_the_instance_draining(
    fleet: Fleet, aws_env: AwsProxy, metadata
) -> None:
    first = Drainer(metadata.url)
    first.unhealthy(fault())
    assert drained(first).done
    calls = len(aws_env.calls)
    restarted = Drainer(metadata.url)  # a new process: nothing remembered, the GPU still faulty
    with Capture.on("exporter") as cap:
        restarted.unhealthy(fault())
        drained(restarted)
    assert restarted.done and restarted.host.was_draining
    assert aws_env.actions()[calls:] == ["DescribeTasks", "DescribeContainerInstances", "SetInstanceHealth"]
    (line,) = [r.getMessage() for r in cap.records if r.name == "exporter.gpu_drain"]
    assert "(it was DRAINING already)" in line and fleet.instance in line


def test_an_instance_in_no_auto_scaling_group_is_drained_and_not_retried(
    fleet: Fleet, aws_env: AwsProxy, metadata
) -> None:
    ecs, autoscaling = boto_clients(REGION, 5.0)
    stub = Stubber(autoscaling)  # botocore's own stubber: the request is checked against the API model
    stub.add_client_error(
        "set_instance_health",
        service_error_code="ValidationError",
        service_message=f"Instance Id not found - No managed instance found for instance ID: {fleet.instance}",
        http_status_code=400,
        expected_params={"InstanceId": fleet.instance, "HealthStatus": "Unhealthy", "ShouldRespectGracePeriod": False},
    )
    stub.activate()
    drainer = Drainer(metadata.url, clients=lambda region, timeout: (ecs, autoscaling))
    with Capture.on("exporter") as cap:
        drainer.unhealthy(fault())
        drained(drainer)
    stub.assert_no_pending_responses()
    assert drainer.done and drainer.host.no_group and drainer.failures == 0
    assert fleet.status() == "DRAINING"
    (line,) = [r.getMessage() for r in cap.records if r.name == "exporter.gpu_drain"]
    assert "not in an Auto Scaling group, so nothing replaces it: replace or repair it by hand" in line


@pytest.mark.parametrize(
    ("behaviour", "error"),
    [
        (respond(b"oops", status=500), "task metadata answered HTTP 500"),
        (respond(b"<html>", content_type="text/html"), "task metadata answered non-JSON"),
        (respond(b'{"Cluster": "c"}', content_type="application/json"), "task metadata has no Cluster and TaskARN"),
    ],
)
def test_unusable_task_metadata_is_a_failed_step_retried_later(behaviour, error: str) -> None:
    with FakeHttp(behaviour) as server:
        drainer = Drainer(server.url, clock=Clock())
        drainer.unhealthy(fault())
        drained(drainer)
    assert drainer.last_error == f"metadata: {error}" and not drainer.done and drainer.failures == 1


def test_metadata_unreachable_and_clients_that_cannot_be_made_never_reach_the_caller() -> None:
    closed = f"http://127.0.0.1:{closed_port()}"
    drainer = Drainer(closed, clock=Clock())
    drainer.unhealthy(fault())
    drained(drainer)
    assert drainer.last_error.startswith("metadata: task metadata unreachable: ")

    def broken(region: str, timeout: float) -> tuple[Any, Any]:
        raise RuntimeError("no botocore here")

    with FakeHttp(respond(b'{"Cluster": "c", "TaskARN": "arn:aws:ecs:eu-west-1:1:task/c/1"}')) as server:
        drainer = Drainer(server.url, clients=broken, clock=Clock())
        drainer.unhealthy(fault())
        drained(drainer)
    assert drainer.last_error == "clients: RuntimeError: no botocore here"
    assert drainer.host.region == "eu-west-1"  # the task's own region, from its ARN


def test_read_task_metadata_reads_cluster_and_task(fleet: Fleet, metadata) -> None:
    assert read_task_metadata(metadata.url + "/", 2.0) == (fleet.cluster_arn, fleet.tasks[0])
    assert metadata.requests[-1].path == "/task"


# --- the exporter as a process -------------------------------------------------------------------------------


class Exporter:
    """``python -m tests.support.nvml_fake SCENARIO CONTROL ...``: the real entry point on the fake NVML."""

    def __init__(self, tmp: Path, name: str, env: dict[str, str], *args: str, scenario: str = "xid_events") -> None:
        self.control = tmp / f"{name}.control"
        self.emf = tmp / f"{name}.emf"
        self.stderr_path = tmp / f"{name}.stderr"
        self.args = [sys.executable, "-m", "tests.support.nvml_fake", scenario, str(self.control), *args]
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def preload(self, fault: str, gpu: int, value: int = 0) -> None:
        with self.control.open("a") as f:
            f.write(json.dumps({"fault": fault, "gpu": gpu, "value": value}) + "\n")

    inject = preload  # the same file, read every 50 ms while it runs

    def start(self, *extra: str) -> Exporter:
        closed = f"http://127.0.0.1:{closed_port()}"
        args = [
            *self.args,
            "--interval",
            "0.3",
            "--startup-wait",
            "0",
            "--output",
            f"file:{self.emf}",
            "--triton-url",
            closed,
            "--metrics-url",
            closed + "/metrics",
            *extra,
        ]
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=err)
        return self

    def log(self) -> list[dict[str, Any]]:
        text = self.stderr_path.read_bytes() if self.stderr_path.exists() else b""
        return [orjson.loads(line) for line in text.splitlines() if line.startswith(b"{")]

    def lines(self, logger: str) -> list[str]:
        return [e["msg"] for e in self.log() if e.get("logger") == logger]

    def docs(self) -> list[dict[str, Any]]:
        data = self.emf.read_bytes() if self.emf.exists() else b""
        return [orjson.loads(line) for line in data.splitlines() if line.strip()]

    def gpu_healthy(self) -> dict[str, float]:
        """The last GpuHealthy per gpu dimension."""
        return {d["gpu"]: d["GpuHealthy"] for d in self.docs() if "GpuHealthy" in d and "gpu" in d}

    def heartbeats(self) -> int:
        return sum(1 for d in self.docs() if "ExporterHeartbeat" in d)

    def running(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"exporter exited {self.proc.returncode}: {self.stderr_path.read_text()[-3000:]}")
        return True

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


@pytest.fixture
def process_env(fleet: Fleet, proxy: AwsProxy, metadata: FakeHttp) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "EXPORTER_", "TRITON_", "NVIDIA_", "CUDA_", "ECS_"))
    }
    return {
        **keep,
        **CREDENTIALS,
        "AWS_ENDPOINT_URL": proxy.url,
        "ECS_CONTAINER_METADATA_URI_V4": metadata.url + "/v4/0123456789abcdef-1234567890",
    }


def test_process_report_only_reports(tmp_path: Path, fleet: Fleet, proxy: AwsProxy, process_env) -> None:
    exporter = Exporter(tmp_path, "report", process_env).start()  # the default action
    try:
        wait_for("the first cycles", lambda: exporter.running() and exporter.gpu_healthy() == {"0": 1.0, "1": 1.0})
        exporter.inject("xid", 1, 79)
        exporter.inject("xid", 0, 13)  # an application's fault on the other GPU
        wait_for("GPU 1 unhealthy", lambda: exporter.running() and exporter.gpu_healthy() == {"0": 1.0, "1": 0.0})
        wait_for("the verdict's line", lambda: exporter.lines("exporter.gpu_health"))
        beats = exporter.heartbeats()
        wait_for("more cycles", lambda: exporter.running() and exporter.heartbeats() >= beats + 3)
        assert exporter.gpu_healthy() == {"0": 1.0, "1": 0.0}  # sticky
    finally:
        assert exporter.stop() == 0
    (line,) = [e for e in exporter.log() if e.get("logger") == "exporter.gpu_health"]
    assert line["msg"] == (
        f"GPU 1 ({U[1]}) unhealthy: XID 79, GPU has fallen off the bus; reported only (--gpu-fault-action report): "
        "the instance stays in service"
    )
    assert line["level"] == "error" and line["gpu_uuid"] == U[1] and line["xid"] == 79
    assert proxy.calls == [] and fleet.status() == "ACTIVE" and fleet.health() == "Healthy"
    assert not [d for d in exporter.docs() if "GpuDrainAttempts" in d]  # no drain, no drain metrics


def test_process_drain_fails_then_succeeds_keeps_emitting_and_a_restart_finds_it_drained(
    tmp_path: Path, fleet: Fleet, proxy: AwsProxy, process_env
) -> None:
    proxy.deny = {"DescribeTasks"}  # the task role cannot yet find its instance
    exporter = Exporter(tmp_path, "drain", process_env).start("--gpu-fault-action", "drain")
    try:
        wait_for("the first cycles", lambda: exporter.running() and exporter.gpu_healthy() == {"0": 1.0, "1": 1.0})
        exporter.inject("recovery_action", 0, 2)  # the driver: node reboot required
        wait_for(
            "a failed drain",
            lambda: (
                exporter.running()
                and any(m.startswith("GPU drain failed at describe") for m in exporter.lines("exporter.gpu_drain"))
            ),
        )
        beats = exporter.heartbeats()
        wait_for("cycles while it fails", lambda: exporter.running() and exporter.heartbeats() >= beats + 2)
        assert fleet.status() == "ACTIVE"
        proxy.deny = set()
        wait_for(
            "the drain",
            lambda: (
                exporter.running()
                and any(m.startswith("drained this instance") for m in exporter.lines("exporter.gpu_drain"))
            ),
        )
        assert fleet.status() == "DRAINING" and fleet.health() == "Unhealthy"
        exporter.inject("xid", 1, 79)  # a second fault on the same instance
        wait_for("GPU 1 unhealthy too", lambda: exporter.running() and exporter.gpu_healthy() == {"0": 0.0, "1": 0.0})
        beats = exporter.heartbeats()
        wait_for("cycles after the drain", lambda: exporter.running() and exporter.heartbeats() >= beats + 3)
    finally:
        assert exporter.stop() == 0
    health = [e for e in exporter.log() if e.get("logger") == "exporter.gpu_health"]
    assert [e["gpu"] for e in health] == [0, 1]
    assert health[0]["reason"] == "the driver asks for a recovery action: node reboot"
    assert health[0]["msg"].endswith(
        "draining this instance: ECS DRAINING, then Auto Scaling Unhealthy (the drain logs its outcome)"
    )
    assert "this instance was drained already (container instance " + fleet.container_instance in health[1]["msg"]
    (done,) = [e for e in exporter.log() if e.get("logger") == "exporter.gpu_drain" and e["level"] == "warning"]
    assert fleet.container_instance in done["msg"] and fleet.instance in done["msg"]
    assert done["ec2_instance_id"] == fleet.instance and done["cluster"] == fleet.cluster_arn
    failed = [e for e in exporter.log() if e.get("logger") == "exporter.gpu_drain" and e["level"] == "error"]
    assert failed and all("ecs:DescribeTasks: AccessDeniedException" in e["msg"] for e in failed)
    task = [d for d in exporter.docs() if "GpuDrainAttempts" in d]
    attempts, failures = sum(d["GpuDrainAttempts"] for d in task), sum(d["GpuDrainFailures"] for d in task)
    assert failures == len(failed) and attempts == failures + 1
    assert proxy.actions().count("UpdateContainerInstancesState") == 1
    assert proxy.actions().count("SetInstanceHealth") == 1

    # The exporter restarts (the container's restart policy, a new task revision): the driver still asks for a
    # reboot, so the GPU is unhealthy at once; the instance is found DRAINING and marked Unhealthy again.
    calls = len(proxy.calls)
    again = Exporter(tmp_path, "restarted", process_env)
    again.preload("recovery_action", 0, 2)
    again.start("--gpu-fault-action", "drain")
    try:
        wait_for(
            "the restarted drain",
            lambda: (
                again.running()
                and any(m.startswith("drained this instance") for m in again.lines("exporter.gpu_drain"))
            ),
        )
    finally:
        assert again.stop() == 0
    (line,) = again.lines("exporter.gpu_drain")
    assert "(it was DRAINING already)" in line
    assert proxy.actions()[calls:] == ["DescribeTasks", "DescribeContainerInstances", "SetInstanceHealth"]


def test_process_once_shows_the_verdict_per_gpu_and_never_drains(tmp_path: Path, proxy: AwsProxy, process_env) -> None:
    index = b"[]"
    metrics = triton_metrics(["m"], 1, gpus=[U[0], U[1]]).encode()

    def triton(server, conn, req):  # type: ignore[no-untyped-def]
        body, ctype = (index, "application/json") if req.path.startswith("/v2") else (metrics, "text/plain")
        respond(body, content_type=ctype)(server, conn, req)

    exporter = Exporter(tmp_path, "once", process_env)
    exporter.preload("remap_failure", 1)  # (a GPU lost before the exporter starts has no UUID to report it under)
    exporter.preload("recovery_action", 0, 1)
    with FakeHttp(triton) as server:
        proc = subprocess.run(
            [
                *exporter.args,
                "--once",
                "--gpu-fault-action",
                "drain",
                "--interval",
                "0.3",
                "--triton-url",
                server.url,
                "--metrics-url",
                server.url + "/metrics",
            ],
            cwd=ROOT,
            env=exporter.env,
            capture_output=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    table = proc.stderr.decode()
    row0 = next(line for line in table.splitlines() if line.startswith("0 ") and U[0] in line)
    row1 = next(line for line in table.splitlines() if line.startswith("1 ") and U[1] in line)
    assert row0.rstrip().endswith("unhealthy: the driver asks for a recovery action: GPU reset")
    assert row1.rstrip().endswith("unhealthy: row remapping failed (replace the GPU)")
    docs = [orjson.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert {d["gpu"]: d["GpuHealthy"] for d in docs if "GpuHealthy" in d} == {"0": 0.0, "1": 0.0}
    assert proxy.calls == []  # a debugging view: it never takes the host out of service
    said = [orjson.loads(line)["msg"] for line in proc.stderr.splitlines() if line.startswith(b"{")]
    assert sum("reported only (--once never drains)" in m for m in said) == 2, said


def test_drain_without_the_task_metadata_endpoint_is_a_setting_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTER_", "ECS_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--gpu-fault-action", "drain", "--once"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: invalid setting: --gpu-fault-action drain needs the NVML source")
