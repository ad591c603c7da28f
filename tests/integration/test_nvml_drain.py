"""``--gpu-fault-action drain`` against moto's server, in process and with the exporter running as a process on
the fake NVML (``python -m tests.support.nvml_fake``): the exporter reports to the controller's SQS queue and
calls neither ECS nor Auto Scaling (the controller decides: tests/integration/controller/).

The fleet in moto: a cluster, an Auto Scaling group with one instance, that instance registered as the cluster's
container instance, Triton tasks placed on it, and the controller's queue. A proxy in front of moto records every
AWS call and refuses the ones a test names with AccessDenied, as AWS answers a task role that lacks the
permission, so calls can fail and then succeed. The task metadata endpoint is a loopback server answering what
ECS's agent answers at ``/task``; the instance metadata service (IMDSv2) another.
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

from demo.payloads import triton_metrics
from exporter.gpufaults import GpuHealth
from exporter.gpufaults.drain import ATTEMPTS, FAILURES, Drainer, read_instance_id, read_task_metadata, sqs_client
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
    queue_url: str = ""
    tasks: list[str] = field(default_factory=list)

    def reports(self) -> list[dict[str, Any]]:
        """Every report in the controller's queue (read and left there)."""
        sqs = self.moto.client("sqs")
        got = sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0)
        return [json.loads(m["Body"]) for m in got.get("Messages", [])]

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
    queue = moto.client("sqs").create_queue(QueueName=name)["QueueUrl"]
    fleet = Fleet(moto, name, cluster_arn, name, instance["InstanceId"], ci["containerInstanceArn"], queue)
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
                if target:  # ECS, SQS: JSON protocol
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
    assert drainer.wait(DEADLINE), "the report did not finish"
    return drainer


def no_imds() -> str:
    return ""


# --- in process ----------------------------------------------------------------------------------------------


def test_drain_sends_one_report_and_calls_neither_ecs_nor_auto_scaling(
    fleet: Fleet, aws_env: AwsProxy, metadata
) -> None:
    drainer = Drainer(metadata.url + "/v4/abc", fleet.queue_url, instance_id=lambda: fleet.instance)
    with Capture.on("exporter") as cap:
        said = drainer.unhealthy(fault())
        drained(drainer)
    assert said.startswith("asked the controller to drain this instance")
    assert aws_env.actions() == ["SendMessage"]  # no DescribeTasks, no DRAINING, no SetInstanceHealth
    assert fleet.status() == "ACTIVE" and fleet.health() == "Healthy"
    (report,) = fleet.reports()
    assert report == {
        "type": "gpu_fault",
        "version": 1,
        "cluster": fleet.cluster_arn,
        "task_arn": fleet.tasks[0],
        "ec2_instance_id": fleet.instance,
        "gpu_uuid": U[0],
        "gpu": 0,
        "nvml_index": 0,
        "fault": "xid",
        "code": 79,
        "reason": "XID 79, GPU has fallen off the bus",
        "evidence": {"reads": 1},
        "observed_at": report["observed_at"],
    }
    (line,) = [r for r in cap.records if r.name == "exporter.gpu_drain"]
    assert line.levelno == logging.WARNING and line.getMessage().startswith(
        f"reported GPU 0 ({U[0]}) to the controller"
    )
    assert line.fields["task_arn"] == fleet.tasks[0] and line.fields["message_id"]  # type: ignore[attr-defined]
    assert drainer.series() == [(ATTEMPTS, 1.0), (FAILURES, 0.0)] and drainer.done
    drainer.poll()
    assert drainer.wait(1) and len(aws_env.calls) == 1  # sent: nothing more


def test_the_report_parses_as_the_controller_reads_it(fleet: Fleet, aws_env: AwsProxy, metadata) -> None:
    from controller.reports import classify, parse

    drainer = Drainer(metadata.url, fleet.queue_url, instance_id=no_imds)
    drainer.unhealthy(Fault(U[1], 1, 1, "recovery_action", "the driver asks for a recovery action: node reboot", 2,
                            reads=2))  # fmt: skip
    drained(drainer)
    sqs = fleet.moto.client("sqs")
    (m,) = sqs.receive_message(QueueUrl=fleet.queue_url, VisibilityTimeout=0)["Messages"]
    report = parse(m["Body"])
    assert (report.task_arn, report.gpu_uuid, report.reads, report.ec2_instance_id) == (fleet.tasks[0], U[1], 2, "")
    assert classify(report) == "drain"


def test_a_failing_send_is_logged_and_retried_on_later_cycles_until_it_succeeds(
    fleet: Fleet, aws_env: AwsProxy, metadata
) -> None:
    clock = Clock()
    drainer = Drainer(metadata.url, fleet.queue_url, retry_interval=60.0, clock=clock, instance_id=no_imds)
    aws_env.deny = {"SendMessage"}
    with Capture.on("exporter") as cap:
        drainer.unhealthy(fault())
        drained(drainer)
        failed = [r for r in cap.records if r.name == "exporter.gpu_drain"]
    assert [r.levelno for r in failed] == [logging.ERROR]
    assert (
        failed[0]
        .getMessage()
        .startswith("GPU fault report to the controller failed at send: sqs:SendMessage: AccessDenied")
    )
    assert "retried in 60s" in failed[0].getMessage()
    assert fleet.reports() == [] and drainer.series() == [(ATTEMPTS, 1.0), (FAILURES, 1.0)]
    drainer.poll()  # not due yet
    assert drainer.wait(1) and drainer.attempts == 1
    clock.now += 60
    drainer.poll()
    drained(drainer)
    assert drainer.failures == 2 and drainer.next_try == clock.now + 120  # doubling, up to 5 minutes
    aws_env.deny = set()
    clock.now += 120
    drainer.poll()
    drained(drainer)
    assert drainer.done and len(fleet.reports()) == 1
    assert drainer.series() == [(ATTEMPTS, 3.0), (FAILURES, 2.0)]
    assert aws_env.actions() == ["SendMessage"] * 3


def test_two_faults_on_one_instance_send_one_report_per_gpu(fleet: Fleet, aws_env: AwsProxy, metadata) -> None:
    nvml = fk.xid_events()
    drainer = Drainer(metadata.url, fleet.queue_url, instance_id=no_imds)
    source = NvmlSource(nvml, {}, health=GpuHealth(drainer))
    source.start()
    source.collect(5.0)
    nvml.inject_xid(0, 48)
    nvml.inject_xid(1, 63)  # report-only: GpuHealthy 0, no report
    with Capture.on("exporter") as cap:
        got = source.collect(5.0)
        drained(drainer)
        nvml.lose(1)  # a draining fault on the GPU that was report-only: reported now
        source.collect(5.0)
        drained(drainer)
        source.collect(5.0)
    lines = [r.getMessage() for r in cap.records if r.name == "exporter.gpu_health"]
    assert lines == [
        f"GPU 0 ({U[0]}) unhealthy: XID 48, double bit ECC error; asked the controller to drain this instance (the "
        "report logs its outcome; the controller decides)",
        f"GPU 1 ({U[1]}) unhealthy: XID 63, GPU memory remapping event; report-only: GpuHealthy 0, no drain",
        f"GPU 1 ({U[1]}) unhealthy: the GPU is lost (NVML: GPU_IS_LOST, fallen off the bus); asked the controller "
        "to drain this instance (the report logs its outcome; the controller decides)",
    ]
    assert sorted((r["gpu_uuid"], r["fault"]) for r in fleet.reports()) == [(U[0], "xid"), (U[1], "lost")]
    assert aws_env.actions() == ["SendMessage", "SendMessage"]
    assert fleet.status() == "ACTIVE" and ATTEMPTS in got.samples.samples
    source.close()


def test_the_instance_id_comes_from_imdsv2_and_is_left_out_where_it_cannot_be_read() -> None:
    seen: list[tuple[str, str, str]] = []

    def imds(server, conn, req):  # type: ignore[no-untyped-def]
        seen.append((req.method, req.path, req.headers.get("x-aws-ec2-metadata-token", "")))
        if req.method == "PUT" and req.path == "/latest/api/token":
            respond(b"TOKEN123")(server, conn, req)
        elif req.path == "/latest/meta-data/instance-id" and req.headers.get("x-aws-ec2-metadata-token") == "TOKEN123":
            respond(b"i-0123456789abcdef0")(server, conn, req)
        else:
            respond(b"", status=401)(server, conn, req)

    with FakeHttp(imds) as server:
        assert read_instance_id({"AWS_EC2_METADATA_SERVICE_ENDPOINT": server.url}) == "i-0123456789abcdef0"
        assert (
            read_instance_id({"AWS_EC2_METADATA_SERVICE_ENDPOINT": server.url, "AWS_EC2_METADATA_DISABLED": "true"})
            == ""
        )
    assert [m for m, _, _ in seen] == ["PUT", "GET"] and seen[1][2] == "TOKEN123"
    closed = f"http://127.0.0.1:{closed_port()}"
    assert read_instance_id({"AWS_EC2_METADATA_SERVICE_ENDPOINT": closed}, timeout=0.5) == ""
    with FakeHttp(respond(b"<html>not an id</html>")) as server:
        assert read_instance_id({"AWS_EC2_METADATA_SERVICE_ENDPOINT": server.url}) == ""


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
        drainer = Drainer(server.url, "http://127.0.0.1:9/q", clock=Clock(), instance_id=no_imds)
        drainer.unhealthy(fault())
        drained(drainer)
    assert drainer.last_error == f"metadata: {error}" and not drainer.done and drainer.failures == 1


def test_metadata_unreachable_and_clients_that_cannot_be_made_never_reach_the_caller() -> None:
    closed = f"http://127.0.0.1:{closed_port()}"
    drainer = Drainer(closed, closed, clock=Clock(), instance_id=no_imds)
    drainer.unhealthy(fault())
    drained(drainer)
    assert drainer.last_error.startswith("metadata: task metadata unreachable: ")

    def broken(region: str, timeout: float) -> Any:
        raise RuntimeError("no botocore here")

    with FakeHttp(respond(b'{"Cluster": "c", "TaskARN": "arn:aws:ecs:eu-west-1:1:task/c/1"}')) as server:
        drainer = Drainer(server.url, closed, clients=broken, clock=Clock(), instance_id=no_imds)
        drainer.unhealthy(fault())
        drained(drainer)
    assert drainer.last_error == "clients: RuntimeError: no botocore here"
    assert drainer.host.region == "eu-west-1"  # the task's own region, from its ARN
    assert sqs_client("eu-west-1", 1.0).meta.region_name == "eu-west-1"


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
            "--triton-metrics-url",
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
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance metadata service here
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
    assert fleet.reports() == []


def test_process_drain_report_fails_then_succeeds_keeps_emitting_and_a_restart_reports_again(
    tmp_path: Path, fleet: Fleet, proxy: AwsProxy, process_env
) -> None:
    proxy.deny = {"SendMessage"}  # the task role cannot yet send to the controller's queue
    drain = ("--gpu-fault-action", "drain", "--controller-queue-url", fleet.queue_url)
    exporter = Exporter(tmp_path, "drain", process_env).start(*drain)
    try:
        wait_for("the first cycles", lambda: exporter.running() and exporter.gpu_healthy() == {"0": 1.0, "1": 1.0})
        exporter.inject("recovery_action", 0, 2)  # the driver: node reboot required (read on every cycle)
        wait_for(
            "a failed report",
            lambda: (
                exporter.running()
                and any(m.startswith("GPU fault report to the controller failed at send") for m in
                        exporter.lines("exporter.gpu_drain"))
            ),
        )  # fmt: skip
        beats = exporter.heartbeats()
        wait_for("cycles while it fails", lambda: exporter.running() and exporter.heartbeats() >= beats + 2)
        assert fleet.reports() == []
        proxy.deny = set()
        wait_for(
            "the report",
            lambda: (
                exporter.running() and any(m.startswith("reported GPU 0") for m in exporter.lines("exporter.gpu_drain"))
            ),
        )
        exporter.inject("xid", 1, 79)  # a second fault on the same instance: its own report
        wait_for("GPU 1 unhealthy too", lambda: exporter.running() and exporter.gpu_healthy() == {"0": 0.0, "1": 0.0})
        wait_for("its report", lambda: len(exporter.lines("exporter.gpu_drain")) >= 2 and len(fleet.reports()) == 2)
        beats = exporter.heartbeats()
        wait_for("cycles after the reports", lambda: exporter.running() and exporter.heartbeats() >= beats + 3)
    finally:
        assert exporter.stop() == 0
    health = [e for e in exporter.log() if e.get("logger") == "exporter.gpu_health"]
    assert [e["gpu"] for e in health] == [0, 1]
    assert health[0]["reason"] == "the driver asks for a recovery action: node reboot" and health[0]["reads"] == 2
    assert health[0]["msg"].endswith("asked the controller to drain this instance (the report logs its outcome; the "
                                     "controller decides)")  # fmt: skip
    sent = [e for e in exporter.log() if e.get("logger") == "exporter.gpu_drain" and e["level"] == "warning"]
    assert [e["gpu"] for e in sent] == [0, 1] and all(e["cluster"] == fleet.cluster_arn for e in sent)
    failed = [e for e in exporter.log() if e.get("logger") == "exporter.gpu_drain" and e["level"] == "error"]
    assert failed and all("sqs:SendMessage: AccessDenied" in e["msg"] for e in failed)
    task = [d for d in exporter.docs() if "GpuDrainAttempts" in d]
    attempts, failures = sum(d["GpuDrainAttempts"] for d in task), sum(d["GpuDrainFailures"] for d in task)
    assert failures == len(failed) and attempts >= failures + 1
    assert {r["fault"] for r in fleet.reports()} == {"recovery_action", "xid"}
    assert set(proxy.actions()) == {"SendMessage"}  # never ECS, never Auto Scaling
    assert fleet.status() == "ACTIVE" and fleet.health() == "Healthy"

    # The exporter restarts (the container's restart policy, a new task revision): the driver still asks for a
    # reboot, so the GPU turns unhealthy again after two reads and is reported again; the controller takes a
    # second report of an instance it knows as the first (tests/unit/controller/test_drains.py).
    again = Exporter(tmp_path, "restarted", process_env)
    again.preload("recovery_action", 0, 2)
    again.start(*drain)
    try:
        wait_for("the restarted report", lambda: again.running() and again.lines("exporter.gpu_drain"))
    finally:
        assert again.stop() == 0
    assert len(fleet.reports()) == 3


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
                "--triton-metrics-url",
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
    assert proc.stderr.startswith("exporter: error: invalid setting: --gpu-fault-action drain needs the NVML source")


def test_drain_without_the_controllers_queue_is_a_setting_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTER_", "ECS_", "CONTROLLER_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--gpu-fault-action", "drain", "--ecs-metadata-url", "http://127.0.0.1:9"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "exporter: error: invalid setting: --gpu-fault-action drain needs --controller-queue-url"
    )
