"""The controller's rollout decider (controller/rollouts.py) on moto in process (a versioned S3 bucket, as boto3
calls it): crashes from ECS's stop codes, two crashes reject, the state's repair from the stable copy, the
duplicate identity, canaries on distinct instances. The hosts are simulated: each reports what it serves with
its counters, and follows the state (a canary installs the rollout's artifact, every other host the stable one).

ECS's documented stop codes (``Task.stopCode``): TaskFailedToStart, EssentialContainerExited, UserInitiated,
ServiceSchedulerInitiated (a scale-in, a deployment, a drain of the instance), SpotInterruption,
TerminationNotice. Only EssentialContainerExited is a crash, and not on an instance that is DRAINING."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from controller.fanout import ServiceTask, task_id
from controller.metrics import Counts
from controller.reports import OperatorRequest, RolloutReport
from controller.rollouts import Refused, RolloutDecider, Stop
from controller.rules import Rules
from modelsync.ledger import CANARY, CONTROL, PROMOTED, REJECTED, Artifact, InvalidState, Ledger, State
from modelsync.s3 import S3

from .fakes import CLUSTER, Clock, task_arn

REGION = "us-east-1"
BUCKET = "models"
MODEL = "resnet"


class QuietLedger(Ledger):
    """The ledger on the test's clock alone (moto's Date headers are the real time)."""

    def _note_clock(self, resp: Any) -> None:
        return None


class World:
    """``hosts`` tasks of the service on ``instances`` container instances, their daemons, and the decider."""

    def __init__(self, hosts: int = 4, instances: int | None = None, fraction: float = 0.25) -> None:
        self.client = boto3.client("s3", region_name=REGION)
        self.client.create_bucket(Bucket=BUCKET)
        self.client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        self.clock = Clock()
        self.ledger = QuietLedger(self.client, BUCKET, "", clock=self.clock)
        self.counts = Counts()
        self.stops: dict[str, Stop] = {}
        self.rules = Rules(bake_seconds=60, min_requests=20)
        self.decider = RolloutDecider(self.ledger, S3(self.client, BUCKET, ""), CLUSTER, self.rules, fraction,
                                      self.counts, self.stops.get)  # fmt: skip
        n_inst = instances or hosts
        self.tasks: dict[str, ServiceTask] = {}
        for i in range(hosts):
            arn = task_arn(i)
            self.tasks[task_id(arn)] = ServiceTask(arn, task_id(arn), "RUNNING", f"ci-{i % n_inst}")
        self.serving: dict[str, Artifact] = {}
        self.counters: dict[tuple[str, str], list[float]] = {}  # (task, sha) -> successes, failures, duration
        self.failing: set[str] = set()  # shas whose requests fail
        self.idle: set[str] = set()  # tasks that report but count no requests (their reports lag)
        self.daemon = {t.arn: f"d{i}" for i, t in enumerate(self.tasks.values())}

    def upload(self, body: bytes) -> Artifact:
        sha = hashlib.sha256(body).hexdigest()
        put = self.client.put_object(Bucket=BUCKET, Key=f"{MODEL}.zip", Body=body, Metadata={"sha256": sha})
        return Artifact(sha, f"{MODEL}.zip", put["ETag"], put["VersionId"])

    def report(self, arn: str, event: str, art: Artifact, counters: Any = None, daemon: str = "") -> str:
        r = RolloutReport(CLUSTER, arn, daemon or self.daemon[arn], MODEL, event, art.sha256, art.key, art.etag,
                          art.version_id, counters or {})  # fmt: skip
        return self.decider.take(r, "AROAEXAMPLE:" + task_id(arn), self.tasks)

    def state(self) -> Any:
        return json.loads(self.client.get_object(Bucket=BUCKET, Key=self.ledger.key(MODEL))["Body"].read())

    def copy(self) -> Any:
        return json.loads(self.client.get_object(Bucket=BUCKET, Key=self.ledger.copy_key(MODEL))["Body"].read())

    def canaries(self) -> list[str]:
        r = self.state()["rollout"]
        return sorted(h for h, p in (r or {}).get("participants", {}).items() if p["role"] == CANARY and not p["lost"])

    def step(self, seconds: float = 5.0, requests: int = 10) -> None:
        """Time passes; every live host serves requests, follows the state and reports; the controller decides."""
        self.clock.now += seconds
        try:
            state = self.ledger.read(MODEL)[0]
        except InvalidState:  # the daemons follow the controller's stable copy (modelsync/follow.py)
            copy = self.ledger.read_copy(MODEL)
            state = State(MODEL, copy.stable) if copy is not None else None
        for t in self.tasks.values():
            if state is not None and state.stable is not None:
                r = state.rollout
                mine = r.participants.get(t.arn) if r is not None else None
                canary = r is not None and mine is not None and mine.role == CANARY and not mine.lost
                self.serving[t.arn] = r.artifact if canary and r is not None else state.stable
            art = self.serving[t.arn]
            c = self.counters.setdefault((t.arn, art.sha256), [0.0, 0.0, 0.0])
            if t.arn in self.idle:
                pass
            elif art.sha256 in self.failing:
                c[1] += requests
            else:
                c[0] += requests
                c[2] += requests * 1000.0
            self.report(t.arn, "evidence", art, {(MODEL, "1"): (c[0], c[1], c[2])})
        self.decider.run(self.tasks, len(self.tasks))

    def stop(self, arn: str, code: str, reason: str = "", instance_status: str = "ACTIVE") -> None:
        del self.tasks[task_id(arn)]
        self.stops[arn] = Stop(code, reason, {"triton": 137} if code == "EssentialContainerExited" else {},
                               instance_status=instance_status)  # fmt: skip

    def start_stable(self) -> Artifact:
        v1 = self.upload(b"v1")
        for t in self.tasks.values():
            self.serving[t.arn] = v1
            self.report(t.arn, "serving", v1)
        self.decider.run(self.tasks, len(self.tasks))
        assert self.state()["stable"]["sha256"] == v1.sha256
        return v1

    def roll_out(self, body: bytes = b"v2") -> Artifact:
        """Upload; a daemon says it saw it; the canaries are assigned and serve it."""
        v2 = self.upload(body)
        self.report(next(iter(self.tasks.values())).arn, "seen", v2)
        self.step()
        self.step()
        assert self.state()["rollout"]["artifact"]["sha256"] == v2.sha256
        assert self.canaries()
        self.step()  # the canaries serve it: READY
        return v2


@pytest.fixture
def world() -> Iterator[World]:
    with mock_aws():
        yield World()


def participants(w: World, role: str) -> list[str]:
    r = w.state()["rollout"]
    return sorted(h for h, p in (r or {}).get("participants", {}).items() if p["role"] == role and not p["lost"])


def verdicts(w: World) -> list[tuple[str, str]]:
    return [(v["verdict"], v["sha256"]) for v in w.state()["verdicts"]]


# --- crashes --------------------------------------------------------------------------------------------------


def test_a_canary_whose_essential_container_exited_crashed_and_a_second_crash_rejects(world: World) -> None:
    v1 = world.start_stable()
    v2 = world.roll_out()
    (first,) = world.canaries()
    world.stop(first, "EssentialContainerExited", "Essential container in task exited")
    world.step()
    assert world.state()["rollout"]["crashes"] == [first] and world.counts.rollout_crashes == 1
    assert verdicts(world) == []  # one crash: not yet a verdict (a host may die for its own reasons)
    world.step()
    (second,) = world.canaries()  # the slot went to another host
    assert second != first
    world.step()
    world.stop(second, "EssentialContainerExited", "Essential container in task exited")
    world.step()
    assert verdicts(world) == [(REJECTED, v2.sha256)]
    assert "crash loop" in world.state()["verdicts"][0]["reason"]
    assert world.state()["stable"]["sha256"] == v1.sha256 and world.state()["rollout"] is None
    assert world.copy()["rejected"] == [v2.sha256] and world.copy()["stable"]["sha256"] == v1.sha256
    assert world.counts.rollout_crashes == 2 and world.counts.rollouts_rejected == 1


@pytest.mark.parametrize(
    ("code", "reason", "instance"),
    [
        ("ServiceSchedulerInitiated", "Scaling activity initiated by (deployment ecs-svc/1234567890)", "ACTIVE"),
        ("ServiceSchedulerInitiated", "Task stopped due to container instance draining", "DRAINING"),
        ("ServiceSchedulerInitiated", "ECS deployment ecs-svc/9876543210 in progress", "ACTIVE"),
        ("UserInitiated", "Task stopped by user", "ACTIVE"),
        ("SpotInterruption", "Your Spot Task was interrupted.", "ACTIVE"),
        ("TerminationNotice", "Task stopped due to the instance being terminated", "ACTIVE"),
        ("TaskFailedToStart", "CannotPullContainerError", "ACTIVE"),
        # The essential container exited on an instance being drained (the drain stopped it, or the GPU fault
        # that drained the instance took Triton down): the instance's fault, not the artifact's.
        ("EssentialContainerExited", "Essential container in task exited", "DRAINING"),
    ],
)
def test_tasks_stopped_by_a_drain_a_scale_in_or_a_deployment_are_not_crashes(
    world: World, code: str, reason: str, instance: str
) -> None:
    world.start_stable()
    v2 = world.roll_out()
    for _ in range(2):  # twice: two crashes would reject
        (canary,) = world.canaries()
        world.stop(canary, code, reason, instance)
        world.step()
        r = world.state()["rollout"]
        assert r["crashes"] == [] and r["participants"][canary]["lost"]
        world.step()
        world.step()
    assert world.counts.rollout_crashes == 0 and verdicts(world) == []
    assert world.state()["rollout"]["artifact"]["sha256"] == v2.sha256 and world.canaries()


def test_triton_gone_is_a_crash_unless_ecs_is_stopping_the_task(world: World) -> None:
    world.start_stable()
    v2 = world.roll_out()
    (canary,) = world.canaries()
    # The task is being stopped by a scale-in (ECS knows it, the task is still listed as running): not a crash.
    world.stops[canary] = Stop("ServiceSchedulerInitiated", "Scaling activity initiated by (deployment x)", {})
    world.report(canary, "triton_gone", v2)
    world.step()
    assert world.state()["rollout"]["crashes"] == [] and world.counts.rollout_crashes == 0
    world.step()
    (other,) = world.canaries()
    world.step()
    world.report(other, "triton_gone", v2)  # ECS has no stop for it: Triton died under a running task
    world.step()
    assert world.state()["rollout"]["crashes"] == [other] and world.counts.rollout_crashes == 1


# --- the state: repaired from the stable copy, never a bypass of a rejection -----------------------------------


def _reject(w: World, body: bytes = b"v2") -> tuple[Artifact, Artifact]:
    v1 = w.start_stable()
    v2 = w.roll_out(body)
    w.failing.add(v2.sha256)
    for _ in range(6):
        w.step(requests=20)
        if w.state()["rollout"] is None:
            break
    assert verdicts(w) == [(REJECTED, v2.sha256)]
    return v1, v2


def _overwrite(w: World, body: bytes) -> None:
    w.client.put_object(Bucket=BUCKET, Key=w.ledger.key(MODEL), Body=body)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda s: b"{not json", id="does-not-parse"),
        pytest.param(lambda s: json.dumps({**s, "stable": None}).encode(), id="stable-null"),
        pytest.param(lambda s: json.dumps({**s, "stable": None, "verdicts": []}).encode(), id="null-unjudged"),
        pytest.param(lambda s: json.dumps({**s, "verdicts": [{"verdict": "maybe"}]}).encode(), id="invalid-verdict"),
    ],
)
def test_an_unusable_state_is_repaired_from_the_copy_and_never_bypasses_a_rejection(world: World, edit: Any) -> None:
    v1, v2 = _reject(world)
    _overwrite(world, edit(world.state()))
    repairs = world.counts.rollout_state_repairs
    world.report(next(iter(world.tasks.values())).arn, "seen", v2)  # S3 still holds the rejected artifact
    world.step()
    world.step()
    state = world.state()
    assert world.counts.rollout_state_repairs == repairs + 1
    assert state["stable"]["sha256"] == v1.sha256 and state["rollout"] is None  # no rollout of the rejected one
    assert [(v["verdict"], v["sha256"]) for v in state["verdicts"]] == [(REJECTED, v2.sha256)]
    assert set(world.serving[t.arn].sha256 for t in world.tasks.values()) == {v1.sha256}


def test_a_hand_edited_stable_null_does_not_stop_the_other_models(world: World) -> None:
    """An assertion on a state with no stable artifact once ended the pass for every model after it."""
    world.start_stable()
    state = world.state()
    _overwrite(world, json.dumps({**state, "stable": None, "verdicts": []}).encode())
    world.step()
    assert world.state()["stable"] is not None


def test_with_no_copy_an_unusable_state_is_reported_and_left_alone(world: World) -> None:
    _overwrite(world, b"{not json")
    world.upload(b"v1")
    for t in world.tasks.values():
        world.serving[t.arn] = world.upload(b"v1")
    world.decider.run(world.tasks, len(world.tasks))
    assert world.counts.rollout_state_repairs == 1
    assert world.client.get_object(Bucket=BUCKET, Key=world.ledger.key(MODEL))["Body"].read() == b"{not json"


# --- identity and placement --------------------------------------------------------------------------------------


def test_a_second_live_daemon_with_one_task_arn_is_refused(world: World) -> None:
    v1 = world.start_stable()
    arn = task_arn(0)
    with pytest.raises(Refused) as refused:
        world.report(arn, "serving", v1, daemon="impostor")
    assert refused.value.check == "identity"
    world.clock.now += 61  # the first one silent past IDENTITY_STALE: the newcomer (a restarted daemon) is taken
    assert world.report(arn, "serving", v1, daemon="impostor") == "taken"


def test_a_report_from_another_tasks_role_session_is_refused(world: World) -> None:
    v1 = world.start_stable()
    r = RolloutReport(CLUSTER, task_arn(0), "d0", MODEL, "serving", v1.sha256, v1.key, v1.etag, v1.version_id)
    with pytest.raises(Refused) as refused:
        world.decider.take(r, "AROAEXAMPLE:" + task_id(task_arn(1)), world.tasks)
    assert refused.value.check == "sender"


def test_canaries_go_to_distinct_instances_where_there_are_several() -> None:
    with mock_aws():
        w = World(hosts=8, instances=2, fraction=0.25)  # two canaries wanted, four tasks on each instance
        w.start_stable()
        w.roll_out()
        canaries = w.canaries()
        assert len(canaries) == 2
        assert len({w.tasks[task_id(a)].container_instance_arn for a in canaries}) == 2


# --- operators ---------------------------------------------------------------------------------------------------


def _command(action: str, force: bool = False, expires: float = 2e9) -> OperatorRequest:
    return OperatorRequest(action, MODEL, "", force, uuid.uuid4().hex, "alice@laptop", expires)


@pytest.mark.parametrize(
    "sender",
    [
        "AROAEXAMPLE:0123456789abcdef0123456789abcdef",  # an ECS task role's session (named after the task id)
        "AROAEXAMPLE:ops-session",  # the role the hosts report under, whatever the session's name
        "",
    ],
)
def test_a_hosts_role_is_never_an_operator(world: World, sender: str) -> None:
    v1, _ = _reject(world)
    assert world.decider.operate(_command("promote", force=True), sender) == "refused"
    assert world.state()["stable"]["sha256"] == v1.sha256 and world.counts.rollout_operator_refused == 1


def test_an_operators_promote_over_evidence_needs_force_and_updates_the_copy(world: World) -> None:
    v1, v2 = _reject(world)
    assert world.decider.operate(_command("promote"), "AIDAOPERATOR") == "refused"
    assert world.state()["stable"]["sha256"] == v1.sha256
    cmd = _command("promote", force=True)
    assert world.decider.operate(cmd, "AIDAOPERATOR") == "applied"
    assert world.decider.operate(cmd, "AIDAOPERATOR") == "applied"  # redelivered: answered once, applied once
    state = world.state()
    assert state["stable"]["sha256"] == v2.sha256 and state["verdicts"][-1]["by"] == "operator AIDAOPERATOR"
    assert len(state["verdicts"]) == 2 and world.counts.rollout_operator_commands == 1
    assert world.copy() == {"format": 1, "model": MODEL, "stable": v2.to_json(), "rejected": []}
    _overwrite(world, b"{not json")  # a later repair falls back to what the operator promoted
    world.step()
    assert world.state()["stable"]["sha256"] == v2.sha256


def test_an_expired_command_is_refused(world: World) -> None:
    _reject(world)
    assert world.decider.operate(_command("promote", True, expires=world.clock.now - 60), "AIDAOPERATOR") == "refused"


# --- the baseline ---------------------------------------------------------------------------------------------


def test_no_verdict_while_assigned_controls_have_counted_too_few_requests(world: World) -> None:
    """CI once promoted a 20x slower build: the controls' reports lagged, the bake ended with their window under
    --bake-min-requests, and the judgement ran against no baseline with latency unjudged."""
    world.start_stable()
    v2 = world.roll_out()
    controls = participants(world, CONTROL)
    assert controls
    world.idle |= set(controls)
    for _ in range(20):  # 100 s: past the 60 s bake, the canaries with 200 requests
        world.step()
    assert verdicts(world) == [] and world.state()["rollout"]["waiting_since"] is not None
    world.idle.clear()
    for _ in range(4):
        world.step()
    assert verdicts(world) == [(PROMOTED, v2.sha256)]
    assert world.state()["verdicts"][0]["evidence"]["baseline"]["source"].startswith("the hosts on the previous")
