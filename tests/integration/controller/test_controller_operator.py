"""An operator's ``python -m modelsync rollout promote|reject`` goes through the controller, on moto's server (S3,
SQS, ECS) with a real ``python -m controller --rollouts on`` and the real command as subprocesses: the command
sends an ``operator`` message, the controller applies it under the sender's SQS identity, updates the stable copy,
logs, counts and answers; a promote over a rejection made on evidence needs ``--force``; without the queue the
command refuses to write behind the controller; with the controller stopped it says so, and its command is
cancelled, never applied later."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from modelsync.ledger import REJECTED, Artifact, Ledger, State, Verdict
from tests.support.msync import Moto, moto, unique, wait_for
from tests.support.paths import REPO

__all__ = ["moto"]  # the session's moto server, a fixture
MODEL = "resnet"
SENDER = "AIDAIT2UOQQY3AUEKVGXU"  # moto's SenderId for every message


@dataclass
class World:
    moto: Moto
    root: Path
    bucket: str
    cluster: str
    queue: str
    v1: Artifact
    v2: Artifact
    controller: subprocess.Popen[bytes] | None = None

    @property
    def s3(self) -> Any:
        return self.moto.client("s3")

    def upload(self, body: bytes) -> Artifact:
        sha = hashlib.sha256(body).hexdigest()
        put = self.s3.put_object(Bucket=self.bucket, Key=f"{MODEL}.zip", Body=body, Metadata={"sha256": sha})
        return Artifact(sha, f"{MODEL}.zip", put["ETag"], put["VersionId"])

    def start(self) -> None:
        args = [
            sys.executable, "-m", "controller", "--interval", "1", "--cluster", self.cluster,
            "--state-file", str(self.root / "state.json"), "--controller-queue-url", self.queue,
            "--service", "triton", "--bucket", self.bucket, "--rollouts", "on",
            "--output", f"file:{self.root / 'emf'}",
        ]  # fmt: skip
        with open(self.root / "controller.log", "ab") as err:
            self.controller = subprocess.Popen(args, cwd=REPO, env=self.moto.env(), stdout=subprocess.DEVNULL,
                                               stderr=err)  # fmt: skip

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.send_signal(signal.SIGTERM)
            self.controller.wait(30)
            self.controller = None

    def cli(self, *args: str, queue: bool = True, wait: float = 30) -> subprocess.CompletedProcess[str]:
        flags = ["--bucket", self.bucket, "--wait", str(wait)]
        if queue:
            flags += ["--controller-queue-url", self.queue]
        return subprocess.run([sys.executable, "-m", "modelsync", "rollout", *args, *flags], cwd=REPO,
                              env=self.moto.env(), capture_output=True, text=True, timeout=120)  # fmt: skip

    def read(self, key: str) -> Any:
        return json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def state(self) -> Any:
        return self.read(f".modelsync/rollouts/{MODEL}.json")

    def copy(self) -> Any:
        return self.read(f".modelsync/stable/{MODEL}.json")

    def log_lines(self) -> list[dict[str, Any]]:
        text = (self.root / "controller.log").read_text(errors="replace")
        return [json.loads(x) for x in text.splitlines() if x.startswith("{")]

    def emf(self, name: str) -> float:
        path = self.root / "emf"
        return sum(json.loads(x).get(name, 0) for x in path.read_text().splitlines()) if path.exists() else 0.0


def _post(moto: Moto, path: str, doc: dict[str, Any]) -> None:
    req = urllib.request.Request(moto.url + path, json.dumps(doc).encode(), method="POST")
    urllib.request.urlopen(req, timeout=10).read()


@pytest.fixture
def world(moto: Moto, tmp_path: Path) -> Iterator[World]:
    _post(moto, "/moto-api/state-manager/set-transition",
          {"model_name": "ecs::task", "transition": {"progression": "manual", "times": 1_000_000}})  # fmt: skip
    s3, ecs = moto.client("s3"), moto.client("ecs")
    bucket, cluster = unique("op-bucket-"), unique("op-cluster-")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    ecs.create_cluster(clusterName=cluster)
    ecs.register_task_definition(family=cluster, containerDefinitions=[{"name": "t", "image": "t", "memory": 64}])
    ecs.run_task(cluster=cluster, taskDefinition=cluster, count=1, group="service:triton", launchType="FARGATE",
                 networkConfiguration={"awsvpcConfiguration": {"subnets": ["subnet-1"]}})  # fmt: skip
    queue = moto.client("sqs").create_queue(QueueName=unique("op-queue-"))["QueueUrl"]
    w = World(moto, tmp_path, bucket, cluster, queue, Artifact("", "", "", ""), Artifact("", "", "", ""))
    w.v1 = w.upload(b"v1")
    w.v2 = w.upload(b"v2")  # S3 holds v2, which the controller rejected on evidence
    ledger = Ledger(s3, bucket, "")
    state = State(MODEL, w.v1, None, [Verdict(w.v2.sha256, REJECTED, time.time(), "controller",
                                              "early abort after 12 s of the bake: failure ratio 1.0000")])  # fmt: skip
    ledger.write(state, "")
    ledger.write_copy(state)
    w.start()
    try:
        yield w
    finally:
        w.stop()
        sys.stderr.write((tmp_path / "controller.log").read_text(errors="replace")[-4000:])
        _post(moto, "/moto-api/state-manager/unset-transition", {"model_name": "ecs::task"})


def test_promote_and_reject_go_through_the_controller(world: World) -> None:
    # Over a rejection made on evidence: refused without --force, and nothing changes.
    got = world.cli("promote", MODEL)
    assert got.returncode == 2, got.stderr
    assert "rejected on evidence" in got.stderr and "--force" in got.stderr
    assert world.state()["stable"]["sha256"] == world.v1.sha256

    got = world.cli("promote", MODEL, "--force")
    assert got.returncode == 0, got.stderr
    line = json.loads(got.stdout)
    assert line["verdict"] == "promoted" and line["by"] == f"operator {SENDER}" and "overriding" in line["reason"]
    state = world.state()
    assert state["stable"]["sha256"] == world.v2.sha256
    last = state["verdicts"][-1]
    assert last["by"] == f"operator {SENDER}" and last["evidence"]["force"] is True and "claimed_by" in last["evidence"]
    copy = world.copy()  # a later repair falls back to what the operator promoted, not the previous artifact
    assert copy["stable"]["sha256"] == world.v2.sha256 and copy["rejected"] == []

    v3 = world.upload(b"v3")
    got = world.cli("reject", MODEL, v3.sha256[:12])
    assert got.returncode == 0, got.stderr
    assert world.copy()["rejected"] == [v3.sha256] and world.copy()["stable"]["sha256"] == world.v2.sha256

    decided = ("promoted", "rejected")
    logged = [d for d in world.log_lines() if d.get("sender_id") == SENDER and d.get("verdict") in decided]
    assert [d["verdict"] for d in logged] == ["promoted", "rejected"]
    wait_for(lambda: world.emf("RolloutOperatorCommands") == 2, timeout=10)
    assert world.emf("RolloutOperatorRefused") == 1


def test_without_the_queue_the_command_refuses_to_write_behind_the_controller(world: World) -> None:
    before = world.state()
    got = world.cli("reject", MODEL, queue=False)
    assert got.returncode == 2 and "decided by the controller" in got.stderr and "--controller-queue-url" in got.stderr
    assert world.state() == before


def test_with_the_controller_stopped_the_command_says_so_and_never_applies_later(world: World) -> None:
    world.stop()
    got = world.cli("promote", MODEL, "--force", wait=3)
    assert got.returncode == 1 and "did not answer" in got.stderr and "cancelled" in got.stderr
    world.start()  # the command's message is still in the queue: read, found cancelled, not applied
    wait_for(lambda: any("already cancelled" in d.get("msg", "") for d in world.log_lines()), timeout=30)
    assert world.state()["stable"]["sha256"] == world.v1.sha256
