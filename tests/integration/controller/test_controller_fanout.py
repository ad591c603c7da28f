"""The controller's fan-out on moto's server (ECS, SQS, SNS, S3): ``python -m controller`` makes one queue per task
of the Triton service and removes a stopped task's, never a foreign queue; a real ``python -m modelsync`` in
``--fanout controller`` mode, beside a real Triton, installs an upload announced on the topic within seconds
through the queue the controller made, and makes no SQS or SNS admin call.

Every SQS and SNS call of the daemon goes through :class:`Recorder`, a forwarding proxy in front of moto
(``AWS_ENDPOINT_URL_SQS``/``_SNS``): what it records is what the daemon sent on the wire, whatever the code
says. Moto does not enforce IAM; the actions recorded are the rights the Triton task role needs.
Tasks run as Fargate tasks of the group ``service:<name>`` (what ECS sets on a service's tasks); moto keeps
them RUNNING until stopped (the ``steady_tasks`` fixture).
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from controller.fanout import CLUSTER_TAG, FLEET_KEY, SERVICE_TAG, queue_policy
from demo.triton import TritonServer
from tests.integration.modelsync.test_modelsync_fanout import _answer, s3_event
from tests.support.msync import CREDENTIALS, Moto, make_zip, model_files, moto, new_bucket, unique, upload
from tests.support.paths import REPO

__all__ = ["moto"]  # the session's moto server (tests/support/msync.py), a fixture

ADMIN = {"CreateQueue", "TagQueue", "UntagQueue", "SetQueueAttributes", "DeleteQueue", "Subscribe", "Unsubscribe"}


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


class Recorder:
    """A forwarding proxy in front of moto that records each request's action (SQS JSON ``X-Amz-Target``, or the
    query protocol's ``Action``, as SNS sends it)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.split("//", 1)[1]
        self.actions: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target") or ""
                action = target.rsplit(".", 1)[-1] if target else parse_qs(body.decode()).get("Action", ["?"])[0]
                proxy.actions.append(action)
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request("POST", self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()


class Metadata:
    """The ECS task metadata endpoint (v4) of one task: ``/task`` answers its ARN."""

    def __init__(self, task_arn: str) -> None:
        doc = json.dumps({"TaskARN": task_arn, "Cluster": "c"}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/v4/modelsync/task" else 404)
                self.send_header("Content-Length", str(len(doc)))
                self.end_headers()
                self.wfile.write(doc)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}/v4/modelsync"

    def close(self) -> None:
        self.server.shutdown()


@dataclass
class World:
    moto: Moto
    tmp: Path
    cluster: str = field(default_factory=lambda: unique("fan-cluster-"))
    service: str = "triton"
    prefix: str = field(default_factory=lambda: unique("fq-") + "-")
    procs: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ecs, self.sqs, self.sns = (self.moto.client(s) for s in ("ecs", "sqs", "sns"))
        self.ecs.create_cluster(clusterName=self.cluster)
        self.ecs.register_task_definition(
            family=self.cluster, containerDefinitions=[{"name": "t", "image": "t", "memory": 64}]
        )
        self.topic = self.sns.create_topic(Name=unique("model-events-"))["TopicArn"]
        self.bucket = new_bucket(self.moto)
        self.reports = self.sqs.create_queue(QueueName=unique("reports-"))["QueueUrl"]

    def run(self, n: int = 1, service: str = "") -> list[str]:
        got = self.ecs.run_task(
            cluster=self.cluster, taskDefinition=self.cluster, count=n, group=f"service:{service or self.service}",
            launchType="FARGATE", networkConfiguration={"awsvpcConfiguration": {"subnets": ["subnet-1"]}},
        )["tasks"]  # fmt: skip
        return [t["taskArn"] for t in got]

    def stop(self, arn: str) -> None:
        self.ecs.stop_task(cluster=self.cluster, task=arn, reason="scale-in")

    def qname(self, arn: str) -> str:
        return self.prefix + arn.rsplit("/", 1)[-1]

    def queues(self) -> dict[str, str]:
        urls = self.sqs.list_queues(QueueNamePrefix=self.prefix).get("QueueUrls", [])
        return {u.rsplit("/", 1)[-1]: u for u in urls}

    def subscribed(self) -> list[str]:
        subs = self.sns.list_subscriptions_by_topic(TopicArn=self.topic)["Subscriptions"]
        return sorted(s["Endpoint"].rsplit(":", 1)[-1] for s in subs)

    def env(self) -> dict[str, str]:
        return {**self.moto.env(), **CREDENTIALS}

    def controller(self) -> subprocess.Popen[bytes]:
        root = self.tmp / "controller"
        root.mkdir(exist_ok=True)
        log = root / "err"
        args = [
            sys.executable, "-m", "controller", "--interval", "0.3", "--cluster", self.cluster,
            "--state-file", str(root / "state.json"), "--controller-queue-url", self.reports,
            "--service", self.service, "--topic-arn", self.topic, "--queue-name-prefix", self.prefix,
            "--bucket", self.bucket, "--prefix", "triton/", "--output", f"file:{root / 'emf'}",
        ]  # fmt: skip
        proc = subprocess.Popen(args, cwd=REPO, env=self.env(), stdout=subprocess.DEVNULL, stderr=log.open("wb"))
        self.procs.append((proc, log))
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
        path = next(p for q, p in self.procs if q is proc)
        return [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]

    def until(self, what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> float:
        """Seconds until ``predicate`` held; fails naming ``what`` and showing the processes' logs."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            for proc, log in self.procs:
                assert proc.poll() is None, f"{log} exited: {log.read_text()[-3000:]}"
            if predicate():
                return time.monotonic() - start
            time.sleep(0.1)
        tails = "\n".join(f"--- {log}\n{log.read_text()[-2000:]}" for _, log in self.procs)
        raise AssertionError(f"timed out waiting for {what}\n{tails}")

    def close(self) -> None:
        for proc, log in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            sys.stderr.write(f"--- {log}\n{log.read_text()[-3000:]}\n")


@pytest.fixture
def world(moto: Moto, steady_tasks: None, tmp_path: Path) -> Iterator[World]:
    w = World(moto, tmp_path)
    try:
        yield w
    finally:
        w.close()


def emf(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_the_controller_makes_a_queue_per_task_removes_a_stopped_tasks_and_never_touches_a_foreign_one(
    world: World,
) -> None:
    a, b = world.run(2)
    (other,) = world.run(1, service="batch")  # another service of the cluster: not a Triton host
    foreign = {
        world.prefix + "orders": world.sqs.create_queue(QueueName=world.prefix + "orders")["QueueUrl"],
        world.prefix + "0123456789abcdef0123456789abcdef": world.sqs.create_queue(
            QueueName=world.prefix + "0123456789abcdef0123456789abcdef"  # the name form, no such task, not tagged
        )["QueueUrl"],
    }
    proc = world.controller()
    made = world.until("two queues, subscribed", lambda: world.subscribed() == sorted([world.qname(a), world.qname(b)]))
    for arn in (a, b):
        url = world.queues()[world.qname(arn)]
        attrs = world.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attrs["SqsManagedSseEnabled"] == "true"
        assert json.loads(attrs["Policy"]) == queue_policy(attrs["QueueArn"], world.topic)  # only the topic sends
        tags = world.sqs.list_queue_tags(QueueUrl=url)["Tags"]
        assert (tags[CLUSTER_TAG], tags[SERVICE_TAG]) == (world.cluster, "triton")
    assert world.qname(other) not in world.queues()
    s3 = world.moto.client("s3")
    size = json.loads(s3.get_object(Bucket=world.bucket, Key="triton/" + FLEET_KEY)["Body"].read())
    assert (size["running"], size["service"]) == (2, "triton")

    (c,) = world.run(1)  # a new task: its queue within a pass or two
    appeared = world.until("the new task's queue", lambda: world.qname(c) in world.subscribed())
    world.stop(a)
    removed = world.until("the stopped task's queue and subscription gone", lambda: world.qname(a) not in world.queues()
                          and world.qname(a) not in world.subscribed())  # fmt: skip
    world.until("the fleet size", lambda: json.loads(
        s3.get_object(Bucket=world.bucket, Key="triton/" + FLEET_KEY)["Body"].read())["running"] == 2)  # fmt: skip
    time.sleep(1.0)  # more passes: the foreign queues are still left alone
    assert set(world.queues()) == {world.qname(b), world.qname(c), *foreign}
    assert world.subscribed() == sorted([world.qname(b), world.qname(c)])
    print(f"\ncontroller fan-out: first two queues subscribed {made:.2f} s after start, a new task's "
          f"{appeared:.2f} s after RunTask, a stopped task's removed {removed:.2f} s after StopTask")  # fmt: skip

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert world.qname(b) in world.queues()  # a stopped controller stops decisions only: the queues stay
    docs = emf(world.tmp / "controller" / "emf")
    assert sum(d.get("FanoutQueuesCreated", 0) for d in docs) == 3
    assert sum(d.get("FanoutQueuesDeleted", 0) for d in docs) == 1
    assert sum(d.get("FanoutFailures", 0) for d in docs) == 0 and docs[-1]["FanoutTasks"] == 2
    msgs = [e["msg"] for e in world.log(proc)]
    assert any(m.startswith("fan-out: queue " + world.prefix + "0123") and "left alone" in m for m in msgs), msgs
    assert any(m == f"fan-out queue {world.qname(a)} removed: its task stopped" for m in msgs), msgs


def _daemon(world: World, triton: TritonServer, task_arn: str, recorder: Recorder) -> subprocess.Popen[bytes]:
    root = world.tmp / "host"
    root.mkdir()
    meta = Metadata(task_arn)
    env = world.env() | {
        "ECS_CONTAINER_METADATA_URI_V4": meta.uri,
        "AWS_ENDPOINT_URL_SQS": recorder.url,
        "AWS_ENDPOINT_URL_SNS": recorder.url,
        "MODELSYNC_FANOUT": "controller",
    }
    args = [
        sys.executable, "-m", "modelsync", "--bucket", world.bucket, "--prefix", "triton/",
        "--repository", str(triton.model_repository), "--store", str(root / "store"), "--triton-url", triton.url,
        "--output", f"file:{root / 'emf'}", "--min-free-bytes", "0", "--host-id", "host", "--interval", "300",
        "--topic-arn", world.topic, "--queue-name-prefix", world.prefix, "--log-level", "debug",
    ]  # fmt: skip
    log = root / "err"
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    world.procs.append((proc, log))
    return proc


@pytest.mark.triton
@pytest.mark.slow
def test_a_daemon_installs_an_upload_within_seconds_through_the_controllers_queue_and_makes_no_admin_call(
    world: World, triton_factory: Callable[..., TritonServer]
) -> None:
    model = unique("fanctl")
    upload(world.moto, world.bucket, f"triton/{model}.zip", make_zip(model_files(model, 1)))
    (task,) = world.run(1)
    triton = triton_factory(models=[])
    recorder = Recorder(world.moto.url)
    try:
        daemon = _daemon(world, triton, task, recorder)  # before the controller: its queue does not exist yet
        world.until("v1 served (the start reconcile needs no queue)", lambda: _answer(triton, model) == 2.0, 120)
        world.until("the daemon says it waits", lambda: any("waiting for the controller" in e["msg"]
                                                             for e in world.log(daemon)))  # fmt: skip
        world.controller()
        world.until("the daemon found its queue", lambda: any(e["msg"] == "fan-out queue found (made by the "
                                                               "controller)" for e in world.log(daemon)))  # fmt: skip
        world.until("the queue subscribed", lambda: world.subscribed() == [world.qname(task)])

        put = upload(world.moto, world.bucket, f"triton/{model}.zip", make_zip(model_files(model, 2)))
        start = time.monotonic()
        # What S3 sends the topic once the PUT is stored (test_modelsync_fanout's docstring says why not moto's own).
        world.sns.publish(TopicArn=world.topic, Message=s3_event(world.bucket, f"triton/{model}.zip", put["VersionId"]))
        served = world.until("v2 served through the fan-out (interval 300 s)", lambda: _answer(triton, model) == 3.0)
        print(f"\ncontroller-made queue: an upload served {served:.2f} s after its event (interval 300 s)")
        assert time.monotonic() - start < 10.0

        world.stop(task)  # the controller removes the queue; the daemon waits for it again, still serving
        world.until("the queue removed", lambda: world.qname(task) not in world.queues())
        world.until("the daemon noticed", lambda: any("no longer exists" in e["msg"] for e in world.log(daemon)))
        assert _answer(triton, model) == 3.0
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
    finally:
        recorder.close()
    calls = set(recorder.actions)
    print(f"the daemon's SQS/SNS calls: { {a: recorder.actions.count(a) for a in sorted(calls)} }")
    assert calls and not calls & ADMIN, recorder.actions
    assert calls <= {"GetQueueUrl", "ReceiveMessage", "DeleteMessageBatch"}, recorder.actions
    msgs = [e["msg"] for e in world.log(daemon)]
    assert sum("waiting for the controller to make queue" in m for m in msgs) == 2, msgs  # at start, after removal
    assert not any(m.startswith(("fan-out queue created", "fan-out queue deleted")) for m in msgs), msgs
