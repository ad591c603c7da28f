"""The controller's fan-out (controller/fanout.py) and the daemon's side of it (modelsync/fanout.py, controller
mode), on moto in process (ECS, SQS, SNS, S3 as boto3 calls them; no server): one queue per task of the
service, made, secured, subscribed, removed when ECS says the task stopped, bounded, idempotent; failures
counted and never harmful; the fleet's size published and read; settings.

What moto cannot do is made to happen by :class:`Calls`, a thin wrapper that records each call a client makes
and fails the ones a test names, as AWS would (AccessDenied)."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.moto_api import state_manager

from controller.drains import Bounds
from controller.fanout import (
    CLUSTER_TAG,
    FLEET_KEY,
    RETENTION_SECONDS,
    SERVICE_TAG,
    TASK_TAG,
    FleetSize,
    ServiceFanout,
    TaskQueues,
    queue_policy,
)
from controller.metrics import FANOUT_NAMES, NAMES, Recorder
from controller.service import Controller
from controller.settings import ConfigError
from controller.settings import load as load_controller
from modelsync import fanout as daemon_fanout
from modelsync.events import EventFilter, Pending
from modelsync.settings import ConfigError as SyncConfigError
from modelsync.settings import load as load_sync
from telemetry.emf_validate import validate
from tests.support.helpers import Capture

from .fakes import Clock, FakeFleet, FakeInbox, ListSink

REGION = "us-east-1"
PREFIX = "prod-modelsync-"
ADMIN = {"create_queue", "tag_queue", "set_queue_attributes", "delete_queue", "subscribe", "unsubscribe"}


class Calls:
    """A boto3 client that records its calls (method names) and fails those in ``failing``."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.made: list[str] = []
        self.failing: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or name.startswith("_") or name in ("meta", "exceptions"):
            return attr

        def call(**kwargs: Any) -> Any:
            self.made.append(name)
            if name in self.failing:
                raise ClientError({"Error": {"Code": "AccessDenied", "Message": "not authorized"}}, name)
            return attr(**kwargs)

        return call

    def take(self) -> list[str]:
        out, self.made = self.made, []
        return out


@dataclass
class World:
    ecs: Calls
    sqs: Calls
    sns: Calls
    s3: Any
    topic: str
    cluster: str = "gpus"
    service: str = "triton"
    tasks: list[str] = field(default_factory=list)

    def run(self, n: int = 1, service: str = "") -> list[str]:
        """``n`` tasks of the service (or of ``service``), placed and RUNNING."""
        got = self.ecs._client.run_task(
            cluster=self.cluster, taskDefinition="triton", count=n, group=f"service:{service or self.service}",
            launchType="FARGATE", networkConfiguration={"awsvpcConfiguration": {"subnets": ["subnet-1"]}},
        )["tasks"]  # fmt: skip
        arns = [t["taskArn"] for t in got]
        self.tasks += arns
        return arns

    def stop(self, arn: str) -> None:
        self.ecs._client.stop_task(cluster=self.cluster, task=arn, reason="scale-in")

    def queues(self) -> dict[str, str]:
        urls = self.sqs._client.list_queues(QueueNamePrefix=PREFIX).get("QueueUrls", [])
        return {u.rsplit("/", 1)[-1]: u for u in urls}

    def subscribed(self) -> list[str]:
        subs = self.sns._client.list_subscriptions_by_topic(TopicArn=self.topic)["Subscriptions"]
        return sorted(s["Endpoint"].rsplit(":", 1)[-1] for s in subs)

    def fanout(self, **kw: Any) -> TaskQueues:
        return TaskQueues(self.cluster, self.service, self.topic, PREFIX, self.ecs, self.sqs, self.sns, **kw)

    def service_fanout(self, queues: TaskQueues | None = None, size: FleetSize | None = None) -> ServiceFanout:
        return ServiceFanout(self.ecs, self.cluster, self.service, queues or self.fanout(), size)


def qname(arn: str) -> str:
    return PREFIX + arn.rsplit("/", 1)[-1]


@pytest.fixture
def world() -> Iterator[World]:
    with mock_aws():
        state_manager.set_transition(model_name="ecs::task", transition={"progression": "manual", "times": 10**6})
        clients = {s: boto3.client(s, region_name=REGION) for s in ("ecs", "sqs", "sns", "s3")}
        ecs = clients["ecs"]
        ecs.create_cluster(clusterName="gpus")
        ecs.register_task_definition(family="triton", containerDefinitions=[{"name": "t", "image": "t", "memory": 8}])
        topic = clients["sns"].create_topic(Name="model-events")["TopicArn"]
        clients["s3"].create_bucket(Bucket="models")
        yield World(Calls(ecs), Calls(clients["sqs"]), Calls(clients["sns"]), clients["s3"], topic)
        state_manager.unset_transition(model_name="ecs::task")


# --- the queues ---------------------------------------------------------------------------------------------


def test_each_task_of_the_service_gets_an_encrypted_queue_only_the_topic_may_write_to_subscribed(world: World) -> None:
    a, b = world.run(2)
    (other,) = world.run(1, service="batch")  # another service's task in the cluster: not a Triton host
    sf = world.service_fanout()
    done = sf.run()
    assert (done.tasks, done.running, done.failures) == (2, 2, 0)
    assert sorted(done.created) == sorted([qname(a), qname(b)]) == sorted(world.queues())
    assert world.subscribed() == sorted([qname(a), qname(b)])
    for arn in (a, b):
        url = world.queues()[qname(arn)]
        attrs = world.sqs._client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attrs["SqsManagedSseEnabled"] == "true" and attrs["MessageRetentionPeriod"] == str(RETENTION_SECONDS)
        assert json.loads(attrs["Policy"]) == queue_policy(attrs["QueueArn"], world.topic)
        (statement,) = json.loads(attrs["Policy"])["Statement"]
        assert statement["Principal"] == {"Service": "sns.amazonaws.com"} and statement["Action"] == "sqs:SendMessage"
        assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": world.topic}}
        tags = world.sqs._client.list_queue_tags(QueueUrl=url)["Tags"]
        assert tags == {CLUSTER_TAG: "gpus", SERVICE_TAG: "triton", TASK_TAG: arn}
    assert qname(other) not in world.queues()
    # the document the daemons' own mode sets is the same
    assert queue_policy("arn:q", world.topic) == daemon_fanout.queue_policy("arn:q", world.topic)


def test_a_second_pass_changes_nothing_and_calls_only_the_listings(world: World) -> None:
    world.run(3)
    sf = world.service_fanout()
    sf.run()
    for c in (world.ecs, world.sqs, world.sns):
        c.take()
    again = sf.run()
    assert (again.created, again.fixed, again.subscribed, again.deleted, again.failures) == ([], [], [], [], 0)
    assert world.sqs.take() == ["list_queues"] and world.sns.take() == ["list_subscriptions_by_topic"]
    assert world.ecs.take() == ["list_tasks", "describe_tasks"]


def test_a_stopped_tasks_queue_and_subscription_go_and_foreign_queues_stay(world: World) -> None:
    a, b = world.run(2)
    sqs = world.sqs._client
    foreign = {
        PREFIX + "orders": sqs.create_queue(QueueName=PREFIX + "orders")["QueueUrl"],  # not the name form
        PREFIX + "0123456789abcdef0123456789abcdef": sqs.create_queue(  # the form, no task, tagged by no one
            QueueName=PREFIX + "0123456789abcdef0123456789abcdef"
        )["QueueUrl"],
        PREFIX + "fedcba9876543210fedcba9876543210": sqs.create_queue(  # another fleet's, sharing the prefix
            QueueName=PREFIX + "fedcba9876543210fedcba9876543210",
            tags={CLUSTER_TAG: "staging", SERVICE_TAG: "triton"},
        )["QueueUrl"],
    }
    sf = world.service_fanout()
    with Capture.on("controller.fanout") as cap:
        first = sf.run()
        world.stop(a)
        done = sf.run()
        assert done.deleted == [qname(a)] and len(done.unsubscribed) == 1
        assert world.subscribed() == [qname(b)]
        assert set(world.queues()) == {qname(b), *foreign}
        sf.run()  # the foreign queues are judged once, then left alone without a call
    assert sorted(first.kept) == sorted(n for n in foreign if n != PREFIX + "orders") and done.kept == []
    left_alone = [m for m in cap.messages(logging.WARNING) if "left alone" in m]
    assert len(left_alone) == 2, cap.messages()
    assert any(f"fan-out queue {qname(a)} removed: its task stopped" in m for m in cap.messages())


def test_a_queue_is_removed_only_when_ecs_confirms_its_task_stopped(world: World) -> None:
    (a,) = world.run(1)
    sf = world.service_fanout()
    sf.run()
    world.ecs.failing = {"describe_tasks"}  # a task not listed (ListTasks is eventually consistent), unconfirmed
    q = TaskQueues("gpus", "triton", world.topic, PREFIX, world.ecs, world.sqs, world.sns)
    done = q.reconcile({})  # as if ListTasks had not listed it
    assert done.deleted == [] and done.failures == 1 and qname(a) in world.queues()
    world.ecs.failing = set()
    done = q.reconcile({})
    assert done.deleted == [] and done.kept == [qname(a)] and qname(a) in world.queues()  # ECS: still RUNNING


def test_a_failed_listing_makes_and_removes_nothing_and_is_counted(world: World) -> None:
    a, _ = world.run(2)
    sf = world.service_fanout()
    sf.run()
    world.stop(a)
    for client, call in (
        (world.ecs, "list_tasks"),
        (world.sqs, "list_queues"),
        (world.sns, "list_subscriptions_by_topic"),
    ):
        client.failing = {call}
        with Capture.on("controller.fanout") as cap:
            done = sf.run()
        client.failing = set()
        assert done.failures == 1 and done.deleted == [] and done.created == [], call
        assert qname(a) in world.queues(), call
        assert any(m.startswith("fan-out step failed") for m in cap.messages(logging.ERROR)), cap.messages()
    assert sf.run().deleted == [qname(a)]


def test_one_queues_failure_does_not_stop_the_others_and_is_tried_again(world: World) -> None:
    world.run(3)
    sf = world.service_fanout()
    world.sns.failing = {"subscribe"}
    done = sf.run()
    assert len(done.created) == 3 and done.subscribed == [] and done.failures == 3
    assert world.subscribed() == []
    world.sns.failing = set()
    done = sf.run()
    assert done.created == [] and len(done.subscribed) == 3 and done.failures == 0
    assert len(world.subscribed()) == 3


def test_changes_are_bounded_per_pass(world: World) -> None:
    arns = world.run(5)
    sf = world.service_fanout(world.fanout(max_changes=2))
    made = [len(sf.run().created) for _ in range(3)]
    assert made == [2, 2, 1] and len(world.queues()) == 5
    for arn in arns:
        world.stop(arn)
    first = sf.run()
    assert len(first.deleted) == 2 and first.deferred == 3
    assert [len(sf.run().deleted) for _ in range(2)] == [2, 1] and world.queues() == {}


def test_a_changed_policy_or_a_removed_subscription_is_put_back(world: World) -> None:
    (a,) = world.run(1)
    world.service_fanout().run()
    url = world.queues()[qname(a)]
    world.sqs._client.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps({"Statement": []})})
    for sub in world.sns._client.list_subscriptions_by_topic(TopicArn=world.topic)["Subscriptions"]:
        world.sns._client.unsubscribe(SubscriptionArn=sub["SubscriptionArn"])
    with Capture.on("controller.fanout") as cap:
        done = world.service_fanout().run()  # a restarted controller checks each queue once
    assert done.fixed == [qname(a)] and done.subscribed == [qname(a)]
    attrs = world.sqs._client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert json.loads(attrs["Policy"]) == queue_policy(attrs["QueueArn"], world.topic)
    assert world.subscribed() == [qname(a)]
    assert any("corrected: Policy" in m for m in cap.messages(logging.WARNING))


# --- the fleet's size -----------------------------------------------------------------------------------------


def test_the_fleet_size_is_the_services_running_tasks_written_on_change_and_refreshed(world: World) -> None:
    clock = Clock(0.0)
    size = FleetSize(world.s3, "models", "triton/", "arn:aws:ecs:us-east-1:123456789012:cluster/gpus", "triton",
                     clock=clock)  # fmt: skip
    sf = ServiceFanout(world.ecs, "gpus", "triton", None, size)  # rollouts without the fan-out's queues
    world.run(2)
    world.run(3, service="batch")
    assert sf.run().running == 2
    doc = json.loads(world.s3.get_object(Bucket="models", Key="triton/" + FLEET_KEY)["Body"].read())
    assert (doc["running"], doc["placed"], doc["cluster"], doc["service"]) == (2, 2, "gpus", "triton")
    assert not size.publish(2, 2)  # unchanged and fresh: not written again
    clock.now = 301.0
    assert size.publish(2, 2)  # refreshed, so that a stopped controller's count goes stale
    assert size.publish(3, 3)


def test_the_daemon_reads_the_fleet_size_and_calls_it_unknown_when_stale_missing_or_wrong(world: World) -> None:
    records = Capture()
    log = logging.getLogger("test.fleethosts")
    log.addHandler(records)
    log.propagate = False
    hosts = daemon_fanout.FleetHosts(world.s3, "models", "triton/", log)
    assert hosts() is None and "does not exist yet" in records.messages()[-1]
    size = FleetSize(world.s3, "models", "triton/", "gpus", "triton")
    size.publish(4, 3)
    assert hosts() == 3
    for body in (b'{"running": "3"}', b"[1]", b'{"running": 1e999}', b"x" * 5000, b'{"running": true}'):
        world.s3.put_object(Bucket="models", Key="triton/" + FLEET_KEY, Body=body)
        assert hosts() is None, body
    size.publish(5, 5)
    assert hosts() == 5
    time.sleep(1.1)  # S3's Date and LastModified have one-second resolution
    assert daemon_fanout.FleetHosts(world.s3, "models", "triton/", log, stale_after=0.5)() is None
    assert "is the controller running?" in records.messages()[-1]


def test_the_name_forms_agree() -> None:
    """The controller makes the names the daemon looks for (the packages do not import each other)."""
    from controller import fanout as controller_fanout

    assert daemon_fanout.FLEET_KEY == controller_fanout.FLEET_KEY
    assert daemon_fanout.MAX_TASK_PREFIX == 44
    with pytest.raises(ValueError):
        controller_fanout.check_queue_prefix("p" * 45)  # the task id would not fit
    for tid in ("0123456789abcdef0123456789abcdef", "522e4319-324d-4e97-bb55-16e1cfccb98a"):
        assert daemon_fanout.TASK_ID.fullmatch(tid) and controller_fanout.TASK_ID.fullmatch(tid)
    for bad in ("0123", "0123456789ABCDEF0123456789ABCDEF", "x" * 32, "0123456789abcdef0123456789abcdef0"):
        assert not daemon_fanout.TASK_ID.fullmatch(bad)
        assert not controller_fanout.re.fullmatch(controller_fanout.TASK_ID, bad)


# --- the daemon's side: its task's queue, found, read, never changed -------------------------------------------


class Metadata:
    """The ECS task metadata endpoint's /task document, served on loopback."""

    def __init__(self, task_arn: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        doc = json.dumps({"TaskARN": task_arn}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/v4/x/task" else 404)
                self.end_headers()
                self.wfile.write(doc)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.environ = {"ECS_CONTAINER_METADATA_URI_V4": f"http://127.0.0.1:{self.server.server_address[1]}/v4/x"}

    def close(self) -> None:
        self.server.shutdown()


def s3_event(key: str) -> str:
    obj = {"key": key, "sequencer": f"{time.time_ns():X}"}
    record = {"eventSource": "aws:s3", "eventName": "ObjectCreated:Put", "eventTime": "2026-12-01T00:00:00.000Z",
              "s3": {"bucket": {"name": "models"}, "object": obj}}  # fmt: skip
    return json.dumps({"Records": [record]})


def test_a_daemon_waits_for_its_tasks_queue_then_reads_it_and_never_changes_a_queue(world: World) -> None:
    (arn,) = world.run(1)
    meta = Metadata(arn)
    pending = Pending()
    with Capture.on("test.taskqueue") as cap:
        log = logging.getLogger("test.taskqueue")
        daemon_sqs = Calls(world.sqs._client)  # the daemon's own client: its calls alone
        q = daemon_fanout.TaskQueue(daemon_sqs, PREFIX, EventFilter("models", ""), pending, log,
                                    environ=meta.environ, wait_seconds=0)  # fmt: skip
        try:
            assert not q.lookup() and not q.lookup()  # not made yet: said once
            waiting = [m for m in cap.messages() if "waiting for the controller" in m]
            assert waiting == [f"fan-out: waiting for the controller to make queue {qname(arn)} for this task; "
                               "reconciling every --interval meanwhile"]  # fmt: skip
            world.service_fanout().run()
            assert q.lookup() and q.queue_name == qname(arn)
            world.sns._client.publish(TopicArn=world.topic, Message=s3_event("resnet.zip"))
            assert q.poll_once() == 1 and set(pending.take(0)) == {"resnet"}
            world.stop(arn)
            world.service_fanout().run()  # the controller removes it
            with pytest.raises(daemon_fanout.QueueGone):
                q.poll_once()
        finally:
            meta.close()
    assert set(daemon_sqs.made) == {"get_queue_url", "receive_message", "delete_message_batch"}, daemon_sqs.made


def test_a_daemon_outside_ecs_says_it_cannot_name_its_queue(world: World) -> None:
    with Capture.on("test.taskqueue2") as cap:
        q = daemon_fanout.TaskQueue(world.sqs, PREFIX, EventFilter("models", ""), Pending(),
                                    logging.getLogger("test.taskqueue2"), environ={})  # fmt: skip
        assert not q.lookup()
    assert world.sqs.made == [] and "cannot be read from the ECS task metadata" in cap.messages()[-1]


# --- the controller's pass and its metrics ---------------------------------------------------------------------


def test_the_controllers_pass_runs_the_fanout_and_emits_its_metrics_even_without_a_state(world: World) -> None:
    class BrokenStore:
        where = "nowhere"

        def load(self) -> tuple[bytes | None, str]:
            from controller.state import StoreError

            raise StoreError("s3:GetObject: AccessDenied")

        def save(self, data: bytes, version: str) -> str:
            raise AssertionError("never written")

    world.run(2)
    sink = ListSink()
    recorder = Recorder("Triton", sink, "gpus")
    c = Controller("gpus", FakeInbox(), FakeFleet(1), BrokenStore(), recorder, Bounds(), fanout=world.service_fanout())
    done = c.run_once()
    assert done.fanout is not None and len(done.fanout.created) == 2
    (doc,) = sink.docs()
    assert validate(sink.lines[0], now_ms=int(time.time() * 1000)) == []
    names = [m["Name"] for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]]
    assert sorted(names) == sorted(NAMES + FANOUT_NAMES)
    assert (doc["FanoutTasks"], doc["FanoutQueues"], doc["FanoutQueuesCreated"], doc["FanoutFailures"]) == (2, 0, 2, 0)
    world.ecs.failing = {"list_tasks"}
    c.run_once()
    assert sink.docs()[-1]["FanoutFailures"] == 1 and sink.docs()[-1]["FanoutTasks"] == 2  # the last known count


def test_without_the_fanout_no_fanout_metric_is_emitted() -> None:

    sink = ListSink()
    Controller("gpus", FakeInbox(), FakeFleet(1), _MemoryStore(), Recorder("Triton", sink, "gpus"), Bounds()).run_once()
    (doc,) = sink.docs()
    assert doc["ControllerHeartbeat"] == 1.0 and not [k for k in doc if k.startswith("Fanout")]


class _MemoryStore:
    where = "memory"

    def __init__(self) -> None:
        self.data: bytes | None = None

    def load(self) -> tuple[bytes | None, str]:
        return self.data, "v"

    def save(self, data: bytes, version: str) -> str:
        self.data = data
        return "v"


# --- settings --------------------------------------------------------------------------------------------------

TOPIC = "arn:aws:sns:us-east-1:123456789012:model-events"
BASE = ["--cluster", "gpus", "--state-file", "/tmp/state.json", "--controller-queue-url", "https://sqs.x/1/q"]


def test_controller_settings_for_the_fanout() -> None:
    _, s = load_controller(
        [*BASE, "--service", "triton", "--topic-arn", TOPIC, "--bucket", "models", "--prefix", "triton"], {}
    )
    assert (s.service, s.topic_arn, s.queue_name_prefix, s.bucket, s.prefix) == (
        "triton",
        TOPIC,
        "modelsync-",
        "models",
        "triton/",
    )
    _, s = load_controller(BASE, {"CONTROLLER_SERVICE": "triton", "CONTROLLER_TOPIC_ARN": TOPIC,
                                  "CONTROLLER_QUEUE_NAME_PREFIX": "prod-ms-"})  # fmt: skip
    assert (s.service, s.queue_name_prefix, s.bucket) == ("triton", "prod-ms-", "")
    assert load_controller(BASE, {})[1].service == ""  # off by default


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--topic-arn", TOPIC], "need --service"),
        (["--bucket", "models"], "need --service"),
        (["--service", "triton"], "does nothing without --topic-arn"),
        (["--service", "triton", "--topic-arn", TOPIC, "--queue-name-prefix", "x" * 45], "so the prefix is at most 44"),
        (["--service", "triton", "--topic-arn", "arn:aws:sqs:us-east-1:123456789012:q"], "SNS topic ARN"),
        (["--service", "tri ton", "--topic-arn", TOPIC], "ECS service name"),
        (["--service", "triton", "--topic-arn", TOPIC, "--prefix", "triton/"], "--prefix"),
    ],
)
def test_controller_fanout_settings_refused(argv: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_controller([*BASE, *argv], {})


def test_modelsync_fanout_setting() -> None:
    s = load_sync(["--bucket", "models", "--topic-arn", TOPIC], {})
    assert s.fanout == "self"
    s = load_sync(["--bucket", "models", "--topic-arn", TOPIC], {"MODELSYNC_FANOUT": "controller"})
    assert s.fanout == "controller"
    with pytest.raises(SyncConfigError, match="needs --topic-arn"):
        load_sync(["--bucket", "models", "--fanout", "controller"], {})
    with pytest.raises(SyncConfigError, match="at most 44"):
        load_sync(
            ["--bucket", "models", "--topic-arn", TOPIC, "--fanout", "controller", "--queue-name-prefix", "x" * 45], {}
        )
    load_sync(["--bucket", "models", "--topic-arn", TOPIC, "--queue-name-prefix", "x" * 45], {})  # self: 68 fit
    with pytest.raises(SyncConfigError):
        load_sync(["--bucket", "models", "--topic-arn", TOPIC, "--fanout", "elsewhere"], {})


# --- a rollout sized from the controller's count ----------------------------------------------------------------


def _rollouts(world: World, live_hosts: Any, host: str = "a") -> Any:
    from datetime import UTC, datetime

    from modelsync.install import Served
    from modelsync.ledger import Ledger
    from modelsync.metrics import Recorder as SyncRecorder
    from modelsync.rollout import Rollouts
    from modelsync.s3 import Archive
    from modelsync.settings import Settings
    from telemetry.sinks.stdout import StreamSink

    world.s3.put_bucket_versioning(Bucket="models", VersioningConfiguration={"Status": "Enabled"})
    settings = Settings(bucket="models", prefix="triton/", host=host, canary_fraction=0.5, topic_arn=TOPIC,
                        fanout="controller", triton_metrics_url="http://127.0.0.1:9/metrics")  # fmt: skip
    rollouts = Rollouts(
        settings, Ledger(world.s3, "models", "triton/"), SyncRecorder("Triton", StreamSink(io.BytesIO()), host),
        logging.getLogger(f"test.rollout.{host}"),
        identify=lambda a: {'"e2"': ("b" * 64, "v2"), '"e1"': ("a" * 64, "v1")}[a.etag],
        entry_models=lambda name: [name], live_hosts=live_hosts,
    )  # fmt: skip
    uploaded = datetime(2026, 12, 1, tzinfo=UTC)

    def listed(etag: str) -> Archive:
        return Archive("add", "triton/add.zip", etag, 100, uploaded)

    return rollouts, listed, Served("add", "a" * 64, '"e1"', "v1", "triton/add.zip")


def test_in_controller_mode_a_rollout_waits_while_the_number_of_hosts_is_unknown(world: World) -> None:
    hosts = daemon_fanout.FleetHosts(world.s3, "models", "triton/", logging.getLogger("test.rollout.hosts"))
    rollouts, listed, v1 = _rollouts(world, hosts)
    assert rollouts.plan("add", listed('"e1"'), v1).install == listed('"e1"')  # the fleet's artifact: stable
    waiting = rollouts.plan("add", listed('"e2"'), v1, fresh=True)  # no fleet.json: unknown
    assert (
        waiting.install is None
        and waiting.role == ""
        and "waits: the number of live hosts is unknown" in waiting.reason
    )
    FleetSize(world.s3, "models", "triton/", "gpus", "triton").publish(4, 4)  # the controller counts four
    started = rollouts.plan("add", listed('"e2"'), v1, fresh=True)
    assert started.install == listed('"e2"') and started.role == "canary"
    from modelsync.ledger import Ledger

    state, _ = Ledger(world.s3, "models", "triton/").read("add")
    assert state is not None and state.rollout is not None
    assert (state.rollout.live_hosts, state.rollout.wanted) == (4, 2)  # ceil(0.5 x 4), from ECS's count
