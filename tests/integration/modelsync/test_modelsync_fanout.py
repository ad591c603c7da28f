"""SNS fan-out (modelsync/fanout.py) against moto's server: real SQS and SNS calls over HTTP, no mocks.

moto's SNS delivers to SQS in server mode: a message published to the topic
arrives in every subscribed queue, wrapped in the SNS envelope. The goal test
runs PUT -> S3-shaped notification on the topic -> one queue per daemon ->
three ``python -m modelsync`` processes -> three real Tritons.

The test publishes the notification itself, after the PUT returned, the way
S3 sends it once the object is stored. moto's own bucket notification to a
topic works too, but moto sends it from inside the PUT *before* it sets the
object's user metadata, so a daemon that reacts within milliseconds can HEAD
the new version without its ``sha256`` and wait for a hash that real S3 would
have had (seen: 2 of 3 hosts missed the 10 s window that way). Two more moto
differences: its Publish fails as a whole while any subscribed queue is
missing (SNS fails only that delivery), and it lets a queue name be reused
at once after deletion (SQS refuses for 60 s).
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from demo.triton import TritonServer
from modelsync.__main__ import build, main
from modelsync.events import EventFilter, Pending
from modelsync.fanout import HEARTBEAT_TAG, HOST_TAG, LEASE, RETENTION_SECONDS, TASK_TAG, Fanout
from modelsync.settings import ENV_VARS, ConfigError, Settings, load
from tests.support.helpers import Capture
from tests.support.msync import (
    REGION,
    Moto,
    make_zip,
    model_files,
    moto,  # noqa: F401 - fixture
    new_bucket,
    unique,
    upload,
    wait_for,
)
from tests.support.paths import REPO

ROOT = REPO


def new_topic(moto: Moto) -> str:  # noqa: F811
    return moto.client("sns").create_topic(Name=unique("models-events-"))["TopicArn"]


def make_fanout(
    moto: Moto,  # noqa: F811
    topic: str,
    prefix: str,
    bucket: str = "bkt",
    url: str | None = None,
    **kw: Any,
) -> tuple[Fanout, Pending, Capture]:
    log = logging.getLogger(unique("test.fanout."))
    log.setLevel(logging.DEBUG)
    log.propagate = False
    records = Capture()
    log.addHandler(records)
    pending = Pending()
    kw.setdefault("first_sweep_max", 3600.0)  # tests sweep by hand unless they say otherwise
    kw.setdefault("wait_seconds", 1)
    fanout = Fanout(
        moto.client("sqs", url),
        moto.client("sns", url),
        topic,
        prefix,
        EventFilter(bucket, ""),
        pending,
        log,
        host="test-host",
        environ={},
        **kw,
    )
    return fanout, pending, records


def s3_event(bucket: str, key: str, version_id: str = "") -> str:
    """An S3 ObjectCreated notification as S3 publishes it to a topic."""
    return json.dumps(
        {
            "Records": [
                {
                    "eventVersion": "2.1",
                    "eventSource": "aws:s3",
                    "eventTime": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
                    "eventName": "ObjectCreated:Put",
                    "s3": {
                        "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
                        "object": {"key": key, "versionId": version_id, "sequencer": f"{time.time_ns():X}"},
                    },
                }
            ]
        }
    )


def our_queues(moto: Moto, prefix: str) -> list[str]:  # noqa: F811
    return moto.client("sqs").list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])


def subscriptions(moto: Moto, topic: str) -> list[dict[str, Any]]:  # noqa: F811
    return moto.client("sns").list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]


def hand_made_queue(moto: Moto, name: str, topic: str | None = None, tags: dict[str, str] | None = None) -> str:  # noqa: F811
    """A queue made outside the daemon (what a killed one leaves, or a foreign one), optionally subscribed."""
    sqs = moto.client("sqs")
    url = sqs.create_queue(QueueName=name, **({"tags": tags} if tags else {}))["QueueUrl"]
    if topic:
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        moto.client("sns").subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    return url


# --- settings ------------------------------------------------------------------------------------------


def test_topic_and_prefix_settings() -> None:
    arn = "arn:aws:sns:eu-west-1:123456789012:triton-model-events"
    s = load(["--bucket", "bkt", "--topic-arn", arn], {})
    assert (s.topic_arn, s.queue_name_prefix, s.queue_url) == (arn, "modelsync-", "")
    s = load(["--bucket", "bkt"], {"MODELSYNC_TOPIC_ARN": arn, "MODELSYNC_QUEUE_NAME_PREFIX": "prod-modelsync-"})
    assert (s.topic_arn, s.queue_name_prefix) == (arn, "prod-modelsync-")
    assert load(["--bucket", "bkt", "--queue-name-prefix", "x" * 68], {}).queue_name_prefix == "x" * 68


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--topic-arn", "my-topic"], "--topic-arn='my-topic': must be an SNS topic ARN"),
        (["--topic-arn", "arn:aws:sqs:us-east-1:123456789012:q"], "must be an SNS topic ARN"),
        (["--topic-arn", "arn:aws:sns:us-east-1:123456789012:t.fifo"], "FIFO topic delivers only to FIFO queues"),
        (["--queue-name-prefix", "bad.prefix-"], "--queue-name-prefix='bad.prefix-': must be 1-68 characters"),
        (["--queue-name-prefix", "x" * 69], "appends a 12-character id"),
        (
            ["--topic-arn", "arn:aws:sns:us-east-1:123456789012:t", "--queue-url", "https://sqs.x.amazonaws.com/1/q"],
            "are both set: with a topic each daemon reads a queue of its own",
        ),
    ],
)
def test_invalid_fanout_settings_are_one_line_and_exit_2(argv: list[str], needle: str, capsys, monkeypatch) -> None:
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    argv = ["--bucket", "abc", *argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    with pytest.raises(ConfigError):
        load(argv, {})


def test_build_wires_the_fanout_only_for_the_daemon(moto, tmp_path: Path) -> None:  # noqa: F811
    topic = new_topic(moto)
    base = Settings(bucket="bkt", repository=tmp_path / "repo", store=tmp_path / "store", topic_arn=topic, host="h")
    (tmp_path / "repo").mkdir()
    for once, wired in ((False, True), (True, False)):
        app = build(replace(base, once=once), sqs_client=moto.client("sqs"), sns_client=moto.client("sns"))
        try:
            assert (app.fanout is not None) == wired and app.poller is None
        finally:
            app.close()


# --- one daemon's queue ----------------------------------------------------------------------------------


def test_setup_makes_an_encrypted_queue_only_the_topic_may_write_to_and_subscribes_it(moto) -> None:  # noqa: F811
    topic, prefix = new_topic(moto), unique("fan-")
    fanout, pending, records = make_fanout(moto, topic, prefix)
    fanout.setup()
    try:
        assert fanout.ready and fanout.queue_name.startswith(prefix) and len(fanout.queue_name) == len(prefix) + 12
        sqs = moto.client("sqs")
        attrs = sqs.get_queue_attributes(QueueUrl=fanout.queue_url, AttributeNames=["All"])["Attributes"]
        assert attrs["SqsManagedSseEnabled"] == "true"
        assert attrs["MessageRetentionPeriod"] == str(RETENTION_SECONDS)
        (statement,) = json.loads(attrs["Policy"])["Statement"]
        assert statement["Effect"] == "Allow" and statement["Principal"] == {"Service": "sns.amazonaws.com"}
        assert statement["Action"] == "sqs:SendMessage" and statement["Resource"] == attrs["QueueArn"]
        assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": topic}}
        tags = sqs.list_queue_tags(QueueUrl=fanout.queue_url)["Tags"]
        assert abs(int(tags[HEARTBEAT_TAG]) - time.time()) <= 2 and tags[HOST_TAG] == "test-host"  # Unix seconds
        (sub,) = subscriptions(moto, topic)
        assert (sub["Protocol"], sub["Endpoint"], sub["SubscriptionArn"]) == (
            "sqs",
            attrs["QueueArn"],
            fanout.subscription_arn,
        )
        sub_attrs = moto.client("sns").get_subscription_attributes(SubscriptionArn=fanout.subscription_arn)
        assert sub_attrs["Attributes"]["RawMessageDelivery"] == "false"
        # What the topic carries reaches this queue, in the SNS envelope, and names the model to reconcile.
        moto.client("sns").publish(TopicArn=topic, Message=s3_event("bkt", "add.zip"))
        assert wait_for(lambda: fanout.poll_once(), timeout=10) == 1
        assert list(pending.take(0)) == ["add"]
        assert "fan-out queue created" in records.messages() and "fan-out queue subscribed to the topic" in (
            records.messages()
        )
        sqs.tag_queue(QueueUrl=fanout.queue_url, Tags={HEARTBEAT_TAG: "1"})
        fanout.heartbeat()
        assert abs(int(sqs.list_queue_tags(QueueUrl=fanout.queue_url)["Tags"][HEARTBEAT_TAG]) - time.time()) <= 2
    finally:
        fanout.teardown()


def test_the_ecs_task_arn_goes_into_a_tag(moto) -> None:  # noqa: F811
    arn = "arn:aws:ecs:us-east-1:123456789012:task/gpu/0123456789abcdef0123456789abcdef"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"TaskARN": arn, "Cluster": "gpu"}).encode() if self.path == "/v4/abc/task" else b"{}"
            self.send_response(200 if self.path == "/v4/abc/task" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    topic, prefix = new_topic(moto), unique("fan-")
    fanout, _, _ = make_fanout(moto, topic, prefix)
    fanout.environ = {"ECS_CONTAINER_METADATA_URI_V4": f"http://127.0.0.1:{server.server_address[1]}/v4/abc"}
    try:
        fanout.setup()
        assert moto.client("sqs").list_queue_tags(QueueUrl=fanout.queue_url)["Tags"][TASK_TAG] == arn
    finally:
        fanout.teardown()
        server.shutdown()


def test_a_clean_close_removes_the_queue_and_the_subscription(moto) -> None:  # noqa: F811
    topic, prefix = new_topic(moto), unique("fan-")
    fanout, pending, records = make_fanout(moto, topic, prefix)
    fanout.start()
    wait_for(lambda: fanout.ready, timeout=20)
    name = fanout.queue_name
    assert len(our_queues(moto, prefix)) == 1 and len(subscriptions(moto, topic)) == 1
    moto.client("sns").publish(TopicArn=topic, Message=s3_event("bkt", "m1.zip"))
    assert wait_for(lambda: pending.take(0.2), timeout=10).keys() == {"m1"}  # polled by the thread
    fanout.close()
    assert our_queues(moto, prefix) == [] and subscriptions(moto, topic) == []
    deleted = [r for r in records.records if r.getMessage() == "fan-out queue deleted"]
    assert deleted and deleted[0].fields["queue"] == name


def test_a_daemon_whose_queue_was_deleted_makes_a_new_one(moto) -> None:  # noqa: F811
    topic, prefix = new_topic(moto), unique("fan-")
    fanout, pending, records = make_fanout(moto, topic, prefix, retry_first=0.2)
    fanout.start()
    try:
        wait_for(lambda: fanout.ready, timeout=20)
        first = fanout.queue_name
        moto.client("sqs").delete_queue(QueueUrl=fanout.queue_url)  # e.g. swept while this host was frozen
        wait_for(lambda: fanout.ready and fanout.queue_name != first, timeout=20)
        assert any("no longer exists" in m for m in records.messages(logging.WARNING))
        endpoints = {s["Endpoint"].rsplit(":", 1)[-1] for s in subscriptions(moto, topic)}
        assert endpoints == {first, fanout.queue_name}
        # The old subscription points at a queue that is gone: the sweep removes it. (moto's Publish fails as
        # a whole while a subscribed queue is missing; SNS itself only fails that one delivery.)
        assert fanout.sweep().unsubscribed != []
        assert [s["Endpoint"].rsplit(":", 1)[-1] for s in subscriptions(moto, topic)] == [fanout.queue_name]
        moto.client("sns").publish(TopicArn=topic, Message=s3_event("bkt", "m2.zip"))
        assert "m2" in wait_for(lambda: pending.take(0.2), timeout=10)
    finally:
        fanout.close()
    assert our_queues(moto, prefix) == [] and subscriptions(moto, topic) == []


def test_a_daemon_whose_subscription_was_removed_subscribes_again(moto) -> None:  # noqa: F811
    topic, prefix = new_topic(moto), unique("fan-")
    fanout, pending, records = make_fanout(moto, topic, prefix, retry_first=0.2)
    fanout.start()
    try:
        wait_for(lambda: fanout.ready, timeout=20)
        moto.client("sns").unsubscribe(SubscriptionArn=fanout.subscription_arn)  # by hand
        fanout.sweep()  # the daemon's own sweep notices
        assert any("subscribing again" in m for m in records.messages(logging.WARNING))
        wait_for(lambda: fanout.ready and len(subscriptions(moto, topic)) == 1, timeout=20)
        moto.client("sns").publish(TopicArn=topic, Message=s3_event("bkt", "m4.zip"))
        assert "m4" in wait_for(lambda: pending.take(0.2), timeout=10)
    finally:
        fanout.close()
    assert our_queues(moto, prefix) == [] and subscriptions(moto, topic) == []


def test_create_and_subscribe_failures_are_retried_not_fatal(moto) -> None:  # noqa: F811
    sns = moto.client("sns")
    name = unique("late-topic-")
    topic = f"arn:aws:sns:{REGION}:123456789012:{name}"  # not created yet
    prefix = unique("fan-")
    fanout, pending, records = make_fanout(moto, topic, prefix, retry_first=0.2, retry_max=0.5)
    fanout.start()
    try:
        wait_for(lambda: any("Subscribe" in m for m in records.messages(logging.WARNING)), timeout=20)
        assert not fanout.ready and fanout._threads[0].is_alive()
        assert sns.create_topic(Name=name)["TopicArn"] == topic
        wait_for(lambda: fanout.ready, timeout=20)
        assert len(our_queues(moto, prefix)) == 1  # the queue made by the first attempt, not one per attempt
        sns.publish(TopicArn=topic, Message=s3_event("bkt", "m3.zip"))
        assert "m3" in wait_for(lambda: pending.take(0.2), timeout=10)
    finally:
        fanout.close()
    assert our_queues(moto, prefix) == [] and subscriptions(moto, topic) == []


# --- the sweep ------------------------------------------------------------------------------------------------


def test_a_fresh_queue_is_never_swept_even_without_a_heartbeat(moto) -> None:  # noqa: F811
    topic, prefix = new_topic(moto), unique("fan-")
    untagged = hand_made_queue(moto, f"{prefix}{'a' * 12}", topic)  # created, tag not (yet) visible
    stale_tag = hand_made_queue(moto, f"{prefix}{'b' * 12}", topic, tags={HEARTBEAT_TAG: "1"})  # old tag, new queue
    sweeper, _, _ = make_fanout(moto, topic, prefix)  # the real lease
    report = sweeper.sweep()
    assert report.deleted == [] and report.unsubscribed == [] and report.errors == [] and report.listed == 2
    assert set(our_queues(moto, prefix)) == {untagged, stale_tag} and len(subscriptions(moto, topic)) == 2
    assert sweeper.lease == LEASE == 600.0


def test_orphans_are_swept_with_their_subscriptions_and_live_or_foreign_queues_are_kept(moto) -> None:  # noqa: F811
    topic, prefix = new_topic(moto), unique("fan-")
    live, _, _ = make_fanout(moto, topic, prefix)
    killed, _, _ = make_fanout(moto, topic, prefix)
    live.setup()
    killed.setup()  # then SIGKILL: nothing of it runs again
    untagged = hand_made_queue(moto, f"{prefix}{'c' * 12}", topic)
    foreign = hand_made_queue(moto, f"{prefix}events", topic)  # shares the prefix, not our name form
    gone = hand_made_queue(moto, f"{prefix}{'d' * 12}", topic)
    moto.client("sqs").delete_queue(QueueUrl=gone)  # its subscription stays behind
    sweeper, _, records = make_fanout(moto, topic, prefix, lease=3.0)  # times have one-second resolution
    try:
        time.sleep(5.0)  # every queue is now older than the 3 s lease; only `live` keeps beating
        live.heartbeat()
        report = sweeper.sweep()
        assert sorted(report.deleted) == sorted([killed.queue_name, f"{prefix}{'c' * 12}"])
        assert report.errors == []
        assert set(our_queues(moto, prefix)) == {live.queue_url, foreign}
        endpoints = sorted(s["Endpoint"].rsplit(":", 1)[-1] for s in subscriptions(moto, topic))
        assert endpoints == sorted([live.queue_name, f"{prefix}events"])  # killed's, untagged's and gone's removed
        assert len(report.unsubscribed) == 3
        text = "\n".join(records.messages())
        assert f"deleted orphan queue {killed.queue_name}" in text and "no longer exists" in text
        assert untagged not in our_queues(moto, prefix)
        live.heartbeat()  # a live daemon beats well within its lease (3 s here: the checks above can take that)
        assert sweeper.sweep().deleted == []  # nothing left to do
    finally:
        live.teardown()
        moto.client("sqs").delete_queue(QueueUrl=foreign)


def test_times_are_on_the_sqs_clock_so_a_skewed_host_neither_dies_nor_kills(moto) -> None:  # noqa: F811
    topic, prefix = new_topic(moto), unique("fan-")
    behind, _, _ = make_fanout(moto, topic, prefix, clock=lambda: time.time() - 3600)
    ahead, _, _ = make_fanout(moto, topic, prefix, clock=lambda: time.time() + 3600)
    behind.setup()
    ahead.setup()
    try:
        behind.heartbeat()
        for f in (behind, ahead):
            beat = int(moto.client("sqs").list_queue_tags(QueueUrl=f.queue_url)["Tags"][HEARTBEAT_TAG])
            assert abs(beat - time.time()) <= 2 and abs(f.now() - time.time()) <= 2
        # An hour ahead, its own clock would call every other queue an hour idle: it deletes nothing.
        assert ahead.sweep().deleted == [] and behind.sweep().deleted == []
        assert len(our_queues(moto, prefix)) == 2
    finally:
        behind.teardown()
        ahead.teardown()


def test_sweep_failures_are_logged_and_never_raised(moto) -> None:  # noqa: F811
    prefix = unique("fan-")
    # Nothing answers: every call fails.
    dead, _, dead_log = make_fanout(moto, "arn:aws:sns:us-east-1:123456789012:t", prefix, url="http://127.0.0.1:9")
    report = dead.sweep()
    assert len(report.errors) == 2 and report.deleted == []
    warnings = dead_log.messages(logging.WARNING)
    assert any("cannot list queues named" in w for w in warnings)
    assert any("cannot list the subscriptions" in w for w in warnings)
    # A topic that does not exist: the queue half of the sweep still works.
    topic = f"arn:aws:sns:{REGION}:123456789012:{unique('no-topic-')}"
    sweeper, _, _ = make_fanout(moto, topic, prefix, lease=0.5)
    orphan = hand_made_queue(moto, f"{prefix}{'e' * 12}")
    time.sleep(2.6)  # past the lease on SQS's clock (one-second resolution)
    report = sweeper.sweep()
    assert report.deleted == [f"{prefix}{'e' * 12}"] and len(report.errors) == 1
    assert orphan not in our_queues(moto, prefix)
    # And the running daemon's threads survive a dead endpoint, retrying.
    dead.retry_first = dead.retry_max = 0.2
    dead.first_sweep_max = 0.0
    dead.sweep_every = 0.2
    dead.start()
    wait_for(lambda: any("fan-out CreateQueue" in m for m in dead_log.messages(logging.WARNING)))
    wait_for(lambda: any("fan-out sweep: cannot list queues" in m for m in dead_log.messages(logging.WARNING)[2:]))
    assert all(t.is_alive() for t in dead._threads)  # they logged the failures and kept going
    dead.close()  # nothing to delete; does not raise


# --- the goal: three hosts hear one upload within seconds ------------------------------------------------------


def _daemon(
    triton: TritonServer, root: Path, bucket: str, topic: str, prefix: str, aws: Moto
) -> tuple[subprocess.Popen[bytes], Path]:
    log = root / "modelsync.log"
    args = [
        sys.executable,
        "-m",
        "modelsync",
        "--bucket",
        bucket,
        "--repository",
        str(triton.model_repository),
        "--store",
        str(root / "store"),
        "--triton-url",
        triton.url,
        "--output",
        f"file:{root / 'emf.log'}",
        "--min-free-bytes",
        "0",
        "--host-id",
        root.name,
        "--interval",
        "300",
        "--topic-arn",
        topic,
        "--queue-name-prefix",
        prefix,
        "--log-level",
        "debug",
    ]
    with open(log, "wb") as err:
        proc = subprocess.Popen(args, cwd=ROOT, env=aws.env(), stdout=subprocess.DEVNULL, stderr=err)
    return proc, log


def _answer(triton: TritonServer, model: str) -> float:
    try:
        status, body = triton.infer(model, [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}])
    except OSError:
        return float("nan")
    return body["outputs"][0]["data"][0] if status == 200 else float("nan")


@pytest.mark.triton
@pytest.mark.slow
def test_three_hosts_serve_a_new_upload_within_10_seconds_and_leave_nothing_behind(
    moto,  # noqa: F811
    triton_factory: Callable[..., TritonServer],
    tmp_path: Path,
) -> None:
    bucket, model, prefix = new_bucket(moto), unique("fan"), unique("fan-")
    topic = new_topic(moto)
    upload(moto, bucket, f"{model}.zip", make_zip(model_files(model, 1)))  # v1: installed by the start reconcile
    tritons = [triton_factory(models=[]) for _ in range(3)]
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for i, triton in enumerate(tritons):
            root = tmp_path / f"host-{i}"
            root.mkdir()
            procs.append(_daemon(triton, root, bucket, topic, prefix, moto))
        wait_for(lambda: all(_answer(t, model) == 2.0 for t in tritons), timeout=120, step=0.3)
        wait_for(lambda: len(subscriptions(moto, topic)) == 3, timeout=60, step=0.2)
        assert len(our_queues(moto, prefix)) == 3

        v2 = make_zip(model_files(model, 2))
        start = time.monotonic()
        put = upload(moto, bucket, f"{model}.zip", v2)
        # What S3 sends the topic once the PUT is stored (see the module docstring for why not moto's own).
        moto.client("sns").publish(TopicArn=topic, Message=s3_event(bucket, f"{model}.zip", put["VersionId"]))
        seen: dict[int, float] = {}
        while len(seen) < 3 and time.monotonic() - start < 60.0:  # 5x below the 300 s poll it must beat
            for i, t in enumerate(tritons):
                if i not in seen and _answer(t, model) == 3.0:
                    seen[i] = time.monotonic() - start
            time.sleep(0.05)
        print(
            f"\nfan-out: upload to the new version served on all three hosts: "
            f"{', '.join(f'host-{i} {s:.2f} s' for i, s in sorted(seen.items()))}"
            f"; all within {max(seen.values(), default=float('nan')):.2f} s"
        )
        assert len(seen) == 3, f"only hosts {sorted(seen)} served v2 within 60 s (interval 300 s)"

        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, log in procs:
            assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
        assert our_queues(moto, prefix) == []
        assert subscriptions(moto, topic) == []
        for _, log in procs:
            lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
            msgs = [line["msg"] for line in lines]
            assert "fan-out queue created" in msgs and "fan-out queue deleted" in msgs, msgs
    finally:  # what pytest shows on a failure: each daemon's log and each Triton's
        for (proc, log), triton in zip(procs, tritons):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            sys.stderr.write(f"--- {log}\n{log.read_text()[-3000:]}\n--- triton\n{triton.log_text()[-1500:]}\n")
