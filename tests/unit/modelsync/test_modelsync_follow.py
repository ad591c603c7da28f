"""A daemon in ``--rollouts controller`` mode (modelsync/follow.py) facing an unusable rollout state, on moto in
process (a versioned bucket): it installs the controller's stable copy, never a rejected artifact, and a new
host is never left without a model."""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import boto3
import pytest
from moto import mock_aws

from modelsync.follow import Follower
from modelsync.install import Served
from modelsync.ledger import REJECTED, Artifact, Ledger, State, Verdict
from modelsync.metrics import Recorder
from modelsync.s3 import Archive
from modelsync.settings import Settings
from telemetry.sinks.stdout import StreamSink

BUCKET = "models"
MODEL = "resnet"
TASK = "arn:aws:ecs:us-east-1:123456789012:task/gpus/t1"


class World:
    def __init__(self) -> None:
        self.s3 = boto3.client("s3", region_name="us-east-1")
        self.s3.create_bucket(Bucket=BUCKET)
        self.s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        self.ledger = Ledger(self.s3, BUCKET, "")
        self.sent: list[str] = []
        self.shas: dict[str, tuple[str, str]] = {}  # etag -> (sha256, version)
        self.follower = Follower(
            Settings(bucket=BUCKET, host="h1"), self.ledger, Recorder("Triton", StreamSink(io.BytesIO()), "h1"),
            logging.getLogger("test.follow"), lambda a: self.shas[a.etag], lambda n: [n], self.sent.append, TASK,
        )  # fmt: skip

    def upload(self, body: bytes) -> tuple[Artifact, Archive]:
        sha = hashlib.sha256(body).hexdigest()
        put = self.s3.put_object(Bucket=BUCKET, Key=f"{MODEL}.zip", Body=body, Metadata={"sha256": sha})
        self.shas[put["ETag"]] = (sha, put["VersionId"])
        art = Artifact(sha, f"{MODEL}.zip", put["ETag"], put["VersionId"])
        listed = Archive(MODEL, art.key, art.etag, len(body), datetime.now(UTC), version_id=art.version_id)
        return art, listed

    def put_state(self, body: bytes) -> None:
        self.s3.put_object(Bucket=BUCKET, Key=self.ledger.key(MODEL), Body=body)


@pytest.fixture
def world() -> Iterator[World]:
    with mock_aws():
        yield World()


def _rejected_world(w: World) -> tuple[Artifact, Artifact, Archive]:
    """v1 stable, v2 rejected by the controller (state and copy written), S3 holding v2."""
    v1, _ = w.upload(b"v1")
    v2, listed = w.upload(b"v2")
    state = State(MODEL, v1, None, [Verdict(v2.sha256, REJECTED, 1.0, "controller", "early abort")])
    w.ledger.write(state, "")
    w.ledger.write_copy(state)
    return v1, v2, listed


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda s: b"{not json", id="does-not-parse"),
        pytest.param(lambda s: json.dumps({**s, "stable": None}).encode(), id="stable-null"),
        pytest.param(lambda s: json.dumps({**s, "stable": None, "verdicts": []}).encode(), id="null-unjudged"),
    ],
)
def test_a_new_host_installs_the_stable_copy_never_the_rejected_object(world: World, edit: object) -> None:
    v1, v2, listed = _rejected_world(world)
    state = json.loads(world.s3.get_object(Bucket=BUCKET, Key=world.ledger.key(MODEL))["Body"].read())
    world.put_state(edit(state))  # type: ignore[operator]
    plan = world.follower.plan(MODEL, listed, None)
    assert plan.install is not None and plan.install.version_id == v1.version_id and not plan.transient
    # A host serving the rejected artifact goes back to the stable one.
    serving_v2 = Served(MODEL, v2.sha256, v2.etag, v2.version_id, v2.key)
    back = world.follower.plan(MODEL, listed, serving_v2, fresh=True)
    assert back.install is not None and back.install.version_id == v1.version_id


def test_an_unusable_state_with_no_copy_never_blocks_a_new_host(world: World) -> None:
    _, listed = world.upload(b"v1")
    world.put_state(b"{not json")
    plan = world.follower.plan(MODEL, listed, None)
    assert plan.install is not None and plan.install.version_id == listed.version_id and not plan.transient


def test_a_usable_state_keeps_a_rejected_upload_off_the_host(world: World) -> None:
    v1, _, listed = _rejected_world(world)
    plan = world.follower.plan(MODEL, listed, None)
    assert plan.install is not None and plan.install.version_id == v1.version_id
