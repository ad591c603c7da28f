"""Messages and rollout states of any shape, end to end: a real ``python -m modelsync`` on moto's SQS deletes and
counts every malformed message, keeps running and still installs what a good message announces afterwards;
a rollout state of the wrong shape (``"wanted": 1e999`` ...) is refused like one that does not parse, and no
exception escapes the rollout's handlers.

Before the fix, a body whose ``"object"`` was a string raised TypeError in the poller, so its whole batch was
never deleted and came back after every visibility timeout until the retention ended (and ``"wanted": 1e999``
raised OverflowError out of ``Rollouts.plan``).
"""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from demo.triton import TritonServer
from modelsync.install import Served
from modelsync.ledger import Artifact, Ledger, Rollout, State
from modelsync.metrics import Recorder
from modelsync.rollout import Rollouts
from modelsync.s3 import Archive
from modelsync.settings import Settings
from telemetry.sinks.stdout import StreamSink
from tests.support.helpers import Capture
from tests.support.msync import (
    Moto,
    make_zip,
    model_files,
    moto,  # noqa: F401 - fixture
    new_bucket,
    s3_event,
    unique,
    upload,
    wait_for,
)
from tests.support.paths import REPO


def record(obj: Any, bucket: str = "b") -> dict[str, Any]:
    return {
        "eventSource": "aws:s3",
        "eventName": "ObjectCreated:Put",
        "eventTime": "2026-01-01T00:00:00.000Z",
        "s3": {"bucket": {"name": bucket}, "object": obj},
    }


def sns(message: str) -> str:
    return json.dumps({"Type": "Notification", "MessageId": "x", "TopicArn": "arn:aws:sns:us-east-1:1:t",
                       "Message": message})  # fmt: skip


GOOD = json.dumps({"Records": [record({"key": "m.zip", "sequencer": "0A", "size": 1})]})
BAD = {
    "object as a string": json.dumps({"Records": [record("key")]}),
    "records not a list": json.dumps({"Records": {"0": record({"key": "m.zip"})}}),
    "record not an object": json.dumps({"Records": ["s3"]}),
    "key missing": json.dumps({"Records": [record({"sequencer": "0A"})]}),
    "key a number": json.dumps({"Records": [record({"key": 7})]}),
    "bucket a string": json.dumps({"Records": [{**record({"key": "m.zip"}), "s3": {"bucket": "b", "object": {}}}]}),
    "1e999": GOOD.replace('"size": 1', '"size": 1e999'),
    "NaN": GOOD.replace('"size": 1', '"size": NaN'),
    "a lone surrogate": GOOD.replace('"m.zip"', '"\\udc80.zip"'),
    "260 KB of nesting": "[" * 130_000 + "]" * 130_000,
    "not JSON": "hello",
    "SNS: object as a string": sns(json.dumps({"Records": [record("key")]})),
    "SNS: Message an object": json.dumps({"Type": "Notification", "Message": {"Records": []}}),
    "SNS: deep nesting": sns("[" * 100_000 + "]" * 100_000),
}


def in_queue(sqs: Any, url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def log_lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")] if log.exists() else []


def answer(triton: TritonServer, model: str) -> float:
    try:
        status, body = triton.infer(model, [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}])
    except OSError:
        return float("nan")
    return body["outputs"][0]["data"][0] if status == 200 else float("nan")


@pytest.mark.triton
@pytest.mark.slow
def test_malformed_messages_are_deleted_counted_and_the_daemon_still_installs_what_comes_next(
    moto: Moto,  # noqa: F811
    triton_factory: Callable[..., TritonServer],
    tmp_path: Path,
) -> None:
    bucket, model = new_bucket(moto), unique("msg")
    sqs = moto.client("sqs")
    # A short visibility timeout: a message the daemon failed to delete would be back within 2 s.
    url = sqs.create_queue(QueueName=unique("events-"), Attributes={"VisibilityTimeout": "2"})["QueueUrl"]
    triton = triton_factory(models=[])
    log = tmp_path / "modelsync.log"
    args = [sys.executable, "-m", "modelsync", "--bucket", bucket, "--repository", str(triton.model_repository),
            "--store", str(tmp_path / "store"), "--triton-url", triton.url, "--output", f"file:{tmp_path / 'emf.log'}",
            "--min-free-bytes", "0", "--host-id", "msg-host", "--interval", "300", "--queue-url", url]  # fmt: skip
    with open(log, "wb") as err:
        proc = subprocess.Popen(args, cwd=REPO, env=moto.env(), stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: any(line["msg"] == "modelsync started" for line in log_lines(log)), timeout=60)
        for body in BAD.values():
            sqs.send_message(QueueUrl=url, MessageBody=body)
        sqs.send_message_batch(  # malformed and good in one batch: none may hold the others back
            QueueUrl=url,
            Entries=[{"Id": "0", "MessageBody": BAD["object as a string"]}, {"Id": "1", "MessageBody": GOOD}],
        )
        start = time.monotonic()
        wait_for(lambda: in_queue(sqs, url) == 0, timeout=30, step=0.2)
        emptied = time.monotonic() - start

        ignored = [line for line in log_lines(log) if line["msg"].startswith("ignored an SQS message")]
        assert len(ignored) == len(BAD) + 1, [line["msg"] for line in ignored]
        assert sorted(line["malformed"] for line in ignored) == list(range(1, len(BAD) + 2))  # counted, once each
        assert all(len(line["msg"]) < 300 and "[[[[" not in line["msg"] for line in ignored)  # a reason, no body
        assert any("Records[0].s3.object: a string, not an object" in line["msg"] for line in ignored)
        assert any("Message.Records[0].s3.object" in line["msg"] for line in ignored)
        time.sleep(3)  # past the visibility timeout: nothing comes back
        assert in_queue(sqs, url) == 0 and proc.poll() is None

        put = upload(moto, bucket, f"{model}.zip", make_zip(model_files(model, 1)))
        announced = time.monotonic()
        sqs.send_message(QueueUrl=url, MessageBody=s3_event(bucket, f"{model}.zip", put["VersionId"]))
        wait_for(lambda: answer(triton, model) == 2.0, timeout=60, step=0.2)  # the interval is 300 s: the event
        print(
            f"\nmalformed messages: {len(BAD) + 1} deleted within {emptied:.2f} s; a good upload announced after "
            f"them served in {time.monotonic() - announced:.2f} s"
        )
        assert proc.poll() is None
        assert not [line for line in log_lines(log) if line["level"] == "error" or "exception" in line]

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        sys.stderr.write(f"--- {log}\n{log.read_text()[-4000:] if log.exists() else ''}\n")


# --- rollout states --------------------------------------------------------------------------------------------

ART = Artifact("a" * 64, "triton/add.zip", '"e1"', "v1")
NEW = Artifact("b" * 64, "triton/add.zip", '"e2"', "v2")
V1 = Served("add", "a" * 64, '"e1"', "v1", "triton/add.zip")
STATE_KEY = "triton/.modelsync/rollouts/add.json"


def listed(etag: str) -> Archive:
    return Archive("add", "triton/add.zip", etag, 100, datetime(2026, 12, 1, tzinfo=UTC))


def rollouts(moto: Moto, bucket: str) -> tuple[Rollouts, Capture]:  # noqa: F811
    settings = Settings(bucket=bucket, prefix="triton/", host="a", canary_fraction=0.5, bake_seconds=600.0,
                        triton_metrics_url="http://127.0.0.1:9/metrics")  # fmt: skip
    log = logging.getLogger(unique("test.messages.rollout."))
    log.setLevel(logging.DEBUG)
    log.propagate = False
    records = Capture()
    log.addHandler(records)
    r = Rollouts(
        settings,
        Ledger(moto.client("s3"), bucket, "triton/"),
        Recorder("Triton", StreamSink(io.BytesIO()), "a"),
        log,
        identify=lambda a: {'"e2"': ("b" * 64, "v2"), '"e1"': ("a" * 64, "v1")}[a.etag],
        entry_models=lambda name: [name],
        live_hosts=lambda: 4,
    )
    return r, records


GOOD_STATE = json.dumps(State("add", ART, Rollout(NEW, ART, time.time(), "b", 2, 4, {})).to_json())
WRONG_STATES = {
    "wanted 1e999": GOOD_STATE.replace('"wanted": 2', '"wanted": 1e999'),
    "wanted NaN": GOOD_STATE.replace('"wanted": 2', '"wanted": NaN'),
    "wanted a string": GOOD_STATE.replace('"wanted": 2', '"wanted": "2"'),
    "wanted 10**30": GOOD_STATE.replace('"wanted": 2', '"wanted": 1000000000000000000000000000000'),
    "started -Infinity": GOOD_STATE.replace('"started": ', '"started": -Infinity, "x": '),
    "artifact a string": GOOD_STATE.replace('"artifact": {', '"artifact": "b", "x": {'),
    "participants a list": GOOD_STATE.replace('"participants": {}', '"participants": ["a"]'),
    "verdicts an object": GOOD_STATE.replace('"verdicts": []', '"verdicts": {}'),
    "nested 100,000 deep": GOOD_STATE.replace('"verdicts": []', '"verdicts": ' + "[" * 100_000 + "]" * 100_000),
    "not UTF-8": GOOD_STATE.replace('"started_by": "b"', '"started_by": "\\udc80"'),
}


def test_a_state_of_the_wrong_shape_is_refused_and_no_exception_escapes(moto) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    s3 = moto.client("s3")
    assert all(body != GOOD_STATE for body in WRONG_STATES.values())
    r, records = rollouts(moto, bucket)
    s3.put_object(Bucket=bucket, Key=STATE_KEY, Body=GOOD_STATE.encode())
    first = r.plan("add", listed('"e2"'), V1, fresh=True)  # a rollout in flight: this host claims a slot
    assert not first.transient and r.in_flight() == 1, first
    for name, body in WRONG_STATES.items():
        s3.put_object(Bucket=bucket, Key=STATE_KEY, Body=body.encode())
        for current in (V1, None):  # a host on the stable artifact, a new host
            plan = r.plan("add", listed('"e2"'), current, fresh=True)
            assert plan.install is None and plan.transient, (name, plan)
            assert "not a valid rollout state" in plan.reason and len(plan.reason) < 600, (name, plan.reason)
        assert r.tick() == ["add"], name  # the tick reads it too: refused, logged, no exception
    assert any("not a valid rollout state" in m for m in records.messages(logging.WARNING))
