"""Rollouts decided by the controller, against real parts: four hosts, each a real Triton with its real
``python -m modelsync --rollouts controller --fanout controller`` (its own ECS task ARN from a task metadata
endpoint), and a real ``python -m controller --rollouts on`` on moto's server (S3, SQS, SNS, ECS); traffic on
every host while a new artifact rolls out. The daemons never write the state; the controller assigns the slots,
judges and writes it.

With 4 running tasks and ``--canary-fraction 0.25`` a rollout has one canary and one control. The hosts are the
shared rollout fleet's (tests/support/msync.py), given a task each; the controller is restarted per test with the
test's bake (a restart resumes from the bucket).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.controller.test_controller_fanout import Metadata
from tests.support.msync import (
    CONFIG,
    ROLLOUT_PY,
    Fleet,
    Host,
    Moto,
    moto,
    rollout_files,
    unique,
    wait_for,
)
from tests.support.paths import REPO

__all__ = ["moto"]  # the session's moto server, a fixture
pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(600)]

SERVICE = "triton"
# Kills its own tritonserver (the Python backend's stub is its child) on the first request.
CRASH = '__import__("os").kill(__import__("os").getppid(), 9)'


def crashing_files(name: str, add: float) -> dict[str, bytes]:
    return {
        f"{name}/config.pbtxt": CONFIG.format(name=name).encode(),
        f"{name}/1/model.py": ROLLOUT_PY.format(add=add, body=CRASH).encode(),
    }


class ControlledFleet(Fleet):
    """The rollout fleet, each host an ECS task of the service, its daemon in --rollouts controller mode."""

    def __init__(self, moto: Moto, root: Path, hosts: int) -> None:
        super().__init__(moto, root, hosts, rollouts="controller", fanout="controller")
        self.ecs, self.sqs = moto.client("ecs"), moto.client("sqs")
        self.cluster = unique("ro-cluster-")
        self.ecs.create_cluster(clusterName=self.cluster)
        self.ecs.register_task_definition(family=self.cluster, containerDefinitions=[{"name": "t", "image": "t",
                                                                                     "memory": 64}])  # fmt: skip
        self.reports = self.sqs.create_queue(QueueName=unique("ro-reports-"))["QueueUrl"]
        self.flags["controller-queue-url"] = self.reports
        self.arns: dict[str, str] = {}
        self.metadata: list[Metadata] = []
        self.controller: subprocess.Popen[bytes] | None = None
        self.controller_log = root / "controller.log"
        for h in self.hosts:
            self._task(h)

    def _task(self, host: Host) -> None:
        (t,) = self.ecs.run_task(
            cluster=self.cluster, taskDefinition=self.cluster, count=1, group=f"service:{SERVICE}",
            launchType="FARGATE", networkConfiguration={"awsvpcConfiguration": {"subnets": ["subnet-1"]}},
        )["tasks"]  # fmt: skip
        self.arns[host.name] = t["taskArn"]

    def start(self, host: Host) -> None:
        meta = Metadata(self.arns[host.name])
        self.metadata.append(meta)
        env = self.moto.env
        self.moto.env = lambda url=None: {**env(url), "ECS_CONTAINER_METADATA_URI_V4": meta.uri}  # type: ignore[method-assign]
        try:
            super().start(host)
        finally:
            self.moto.env = env  # type: ignore[method-assign]

    def start_controller(self, **flags: Any) -> None:
        self.stop_controller()
        args = [
            sys.executable, "-m", "controller", "--interval", "1", "--cluster", self.cluster,
            "--state-file", str(self.root / "controller-state.json"), "--controller-queue-url", self.reports,
            "--service", SERVICE, "--topic-arn", self.topic, "--queue-name-prefix", self.queue_prefix,
            "--bucket", self.bucket, "--rollouts", "on", "--canary-fraction", "0.25", "--bake-min-requests", "20",
            "--max-latency-ratio", "6", "--output", f"file:{self.root / 'controller-emf'}",
            *(a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", str(v))),
        ]  # fmt: skip
        with open(self.controller_log, "ab") as err:
            self.controller = subprocess.Popen(args, cwd=REPO, env=self.moto.env(), stdout=subprocess.DEVNULL,
                                               stderr=err)  # fmt: skip

    def stop_controller(self) -> None:
        if self.controller is not None:
            self.controller.send_signal(signal.SIGTERM)
            self.controller.wait(30)
            self.controller = None

    def decisions(self, model: str) -> list[dict[str, Any]]:
        out = []
        for line in self.controller_log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                d = json.loads(line)
                if d.get("model") == model and "verdict" in d:
                    out.append(d)
        return out

    def host_of(self, arn: str) -> Host:
        return next(h for h in self.hosts if self.arns[h.name] == arn)

    def close(self) -> None:
        self.stop_controller()
        super().close()
        for m in self.metadata:
            m.close()


def _transition(moto: Moto, path: str, doc: dict[str, Any]) -> None:
    req = urllib.request.Request(moto.url + path, json.dumps(doc).encode(), method="POST")
    urllib.request.urlopen(req, timeout=10).read()


@pytest.fixture(scope="module")
def fleet(moto: Moto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlledFleet]:
    # Moto advances a task's status on every DescribeTasks; keep the tasks RUNNING, as ECS does (the whole module).
    _transition(moto, "/moto-api/state-manager/set-transition",
                {"model_name": "ecs::task", "transition": {"progression": "manual", "times": 1_000_000}})  # fmt: skip
    f = ControlledFleet(moto, tmp_path_factory.mktemp("ctlfleet"), 4)
    try:
        f.start_controller(bake_seconds=5)
        f.start_all()
        yield f
    finally:
        for h in f.hosts:
            sys.stderr.write(f"--- {h.name} daemon log (tail)\n{h.log.read_text()[-3000:] if h.log.exists() else ''}\n")
        if f.controller_log.exists():
            sys.stderr.write(f"--- controller log (tail)\n{f.controller_log.read_text()[-6000:]}\n")
        f.close()
        _transition(moto, "/moto-api/state-manager/unset-transition", {"model_name": "ecs::task"})


def verdict_within(fleet: ControlledFleet, model: str, verdict: str, timeout: float) -> None:
    """Wait for the controller's ``verdict`` on ``model``; on a timeout, say what the controller and the hosts
    logged about it (the fixture's teardown output is lost under pytest-xdist)."""
    try:
        wait_for(lambda: verdict in verdicts(fleet, model), timeout=timeout, step=0.3)
    except AssertionError:
        lines = [ln for ln in fleet.controller_log.read_text(errors="replace").splitlines() if model in ln][-15:]
        hosts = [ln for h in fleet.hosts if h.log.exists() for ln in h.log.read_text().splitlines() if model in ln]
        raise AssertionError(
            f"no {verdict!r} verdict on {model} within {timeout:g}s; controller:\n"
            + "\n".join(lines)
            + "\nhosts:\n"
            + "\n".join(hosts[-15:])
        ) from None


def first_version(fleet: ControlledFleet, model: str) -> None:
    for h in fleet.hosts:
        if h.proc is None:
            fleet.start(h)
    fleet.upload(model, rollout_files(model, 1))
    wait_for(lambda: fleet.answers(model) == [1.0] * len(fleet.hosts), timeout=120, step=0.3)
    wait_for(lambda: (fleet.state(model) or {}).get("stable") is not None, timeout=60)


def verdicts(fleet: ControlledFleet, model: str) -> list[str]:
    return [v["verdict"] for v in (fleet.state(model) or {}).get("verdicts", [])]


def participants(fleet: ControlledFleet, model: str, role: str) -> set[str]:
    r = (fleet.state(model) or {}).get("rollout") or {}
    return {h for h, p in (r.get("participants") or {}).items() if p["role"] == role}


def test_a_good_build_reaches_every_host_and_the_daemons_never_write_the_state(fleet: ControlledFleet) -> None:
    model = unique("cgood")
    first_version(fleet, model)
    assert (fleet.state(model) or {})["verdicts"] == []
    fleet.traffic(model)
    start = time.monotonic()
    fleet.upload(model, rollout_files(model, 2))
    canaries = wait_for(lambda: participants(fleet, model, "canary"), timeout=60)
    assert len(canaries) == 1 and canaries <= set(fleet.arns.values())  # slots by task ARN
    wait_for(lambda: fleet.answers(model) == [2.0] * len(fleet.hosts), timeout=120, step=0.2)
    took = time.monotonic() - start
    traffic = fleet.stop_traffic(model)
    assert {n: t.failures() for n, t in traffic.items()} == {h.name: 0 for h in fleet.hosts}
    state = fleet.state(model)
    assert state is not None and [(v["verdict"], v["by"]) for v in state["verdicts"]] == [("promoted", "controller")]
    spread = {n for n, t in traffic.items() if 2.0 in t.answers()}
    assert spread == set(fleet.arns)  # everyone, in the end
    for h in fleet.hosts:  # no daemon wrote or decided anything
        assert not [d for d in h.decisions(model) if d["verdict"] in ("promoted", "rejected", "started")]
        assert any("ignored" in line.get("msg", "") for line in h.lines())  # its rollout flags: warned once
    print(f"\ncontroller rollout of a good build: every host on it {took:.1f} s after the upload (bake 5 s)")


def test_a_20x_slower_build_is_rejected(fleet: ControlledFleet) -> None:
    model = unique("cslow")
    first_version(fleet, model)
    fleet.traffic(model)
    fleet.upload(model, rollout_files(model, 4, "slow"))
    verdict_within(fleet, model, "rejected", timeout=240)  # ~11 s alone; a cold full run on 2 cores took > 120 s once
    wait_for(lambda: fleet.answers(model) == [1.0] * len(fleet.hosts), timeout=60, step=0.2)
    traffic = fleet.stop_traffic(model)
    spread = {n for n, t in traffic.items() if 4.0 in t.answers()}
    assert len(spread) <= 1, spread
    assert all(t.failures() == 0 for t in traffic.values())
    (d,) = [d for d in fleet.decisions(model) if d["verdict"] == "rejected"]
    assert "average latency over the bake" in d["reason"] and d["evidence"]["latency_ratio"] > 6


def test_a_build_failing_every_request_is_rejected_within_90_s_at_the_default_bake(fleet: ControlledFleet) -> None:
    fleet.start_controller()  # --bake-seconds 600, the default: only the early abort can be this quick
    try:
        model = unique("cfail")
        first_version(fleet, model)
        fleet.traffic(model)
        start = time.monotonic()
        fleet.upload(model, rollout_files(model, 3, "fail"))
        wait_for(lambda: "rejected" in verdicts(fleet, model), timeout=90, step=0.2)
        took = time.monotonic() - start
        wait_for(lambda: fleet.answers(model) == [1.0] * len(fleet.hosts), timeout=60, step=0.2)
        time.sleep(1.0)
        traffic = fleet.stop_traffic(model)
    finally:  # the module's other tests bake 5 s, in any order (a 600 s bake left behind made the next one wait)
        fleet.start_controller(bake_seconds=5)
    failing = {n for n, t in traffic.items() if t.failures()}
    assert len(failing) == 1, failing  # the canary alone
    (d,) = [d for d in fleet.decisions(model) if d["verdict"] == "rejected"]
    assert d["reason"].startswith("early abort") and d["evidence"]["thresholds"]["bake_seconds"] == 600
    print(f"\ncontroller early abort at the default bake (600 s): rejected {took:.1f} s after the upload; "
          f"{sum(t.failures() for t in traffic.values())} failed requests, all on the canary")  # fmt: skip


def test_a_build_crashing_triton_reaches_at_most_two_hosts_and_the_fleet_stays_on_the_previous(
    fleet: ControlledFleet,
) -> None:
    model = unique("ccrash")
    first_version(fleet, model)
    fleet.traffic(model, gap=0.1)
    start = time.monotonic()
    fleet.upload(model, crashing_files(model, 5))
    wait_for(lambda: "rejected" in verdicts(fleet, model), timeout=180, step=0.3)
    took = time.monotonic() - start
    time.sleep(2.0)
    traffic = fleet.stop_traffic(model)
    dead = {h.name for h in fleet.hosts if h.triton.proc is not None and h.triton.proc.poll() is not None}
    assert 1 <= len(dead) <= 2, dead
    alive = [h for h in fleet.hosts if h.name not in dead]
    assert [h.answer(model) for h in alive] == [1.0] * len(alive)
    assert all(traffic[h.name].failures() == 0 for h in alive)
    (d,) = [d for d in fleet.decisions(model) if d["verdict"] == "rejected"]
    assert "crash loop" in d["reason"] and len(d["evidence"]["crashes"]) == 2
    emf = [json.loads(x) for x in (fleet.root / "controller-emf").read_text().splitlines()]
    assert sum(e.get("RolloutCrashes", 0) for e in emf) == 2
    print(f"\ncontroller: a build crashing Triton rejected {took:.1f} s after the upload, on {len(dead)} host(s)")
