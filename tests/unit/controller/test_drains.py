"""The controller's decisions on a fleet in memory and a fake clock: bounds, order, pause, replacement after
the tasks left, idempotence, failures, restarts (the state in a file)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from controller.__main__ import resume_main
from controller.drains import Bounds, Limit
from controller.metrics import NAMES, Recorder
from controller.service import Controller
from controller.settings import load
from controller.state import Conflict, FileStore, State
from telemetry.emf_validate import validate
from tests.support.helpers import Capture
from tests.unit.controller.fakes import CLUSTER, Clock, FakeFleet, FakeInbox, ListSink, body, ci_arn, ec2, message

DRAIN = "ecs:UpdateContainerInstancesState"
REPLACE = "autoscaling:SetInstanceHealth"


class World:
    def __init__(self, tmp: Path, n: int = 10, **bounds: object) -> None:
        self.fleet = FakeFleet(n)
        self.inbox = FakeInbox()
        self.sink = ListSink()
        self.clock = Clock()
        self.store = FileStore(tmp / "state.json")
        self.bounds = Bounds(**bounds)  # type: ignore[arg-type]
        self.controller = self.restart()
        self.sent = 0

    def restart(self) -> Controller:
        self.controller = Controller(
            "gpus", self.inbox, self.fleet, self.store, Recorder("Triton", self.sink, "gpus", self.clock),
            self.bounds, self.clock,
        )  # fmt: skip
        return self.controller

    def report(self, *instances: int, **kw: object) -> None:
        for i in instances:
            self.sent += 1
            self.inbox.pending.append(message(body(i, **kw), n=self.sent))  # type: ignore[arg-type]

    def step(self, seconds: float = 15.0) -> dict[str, float]:
        self.clock.now += seconds
        got = self.controller.run_once()
        assert got.metrics is not None
        return got.metrics

    def state(self) -> State:
        data, _ = self.store.load()
        assert data is not None
        return State.from_json(data)

    def busy(self) -> int:
        return sum(1 for e in self.state().entries.values() if e.holds_a_slot())


def test_max_draining_is_a_count_or_a_share_rounded_up_and_at_least_one() -> None:
    assert [Limit(fraction=0.1).of(n) for n in (0, 3, 10, 11, 25)] == [1, 1, 1, 2, 3]
    assert Limit(count=2).of(100) == 2
    _, s = load(["--cluster", "c", "--state-file", "/tmp/s.json", "--controller-queue-url", "http://q"], {})
    assert s.max_draining == Limit(fraction=0.1) and s.max_drains_per_hour == 4 and s.pause_above == 0.2
    assert s.replace_timeout == 900.0
    env = {"CONTROLLER_MAX_DRAINING": "2", "CONTROLLER_PAUSE_ABOVE": "30%", "CONTROLLER_CLUSTER": "c",
           "CONTROLLER_STATE_BUCKET": "b-1", "CONTROLLER_QUEUE_URL": "http://q"}  # fmt: skip
    _, s = load(["--max-draining", "25%"], env)
    assert (
        s.max_draining == Limit(fraction=0.25)
        and s.pause_above == pytest.approx(0.3)
        and s.key == ("controller/c/state.json")
    )


def test_five_faults_at_once_drain_one_at_a_time_each_replaced_after_its_tasks_left(tmp_path: Path) -> None:
    w = World(tmp_path, pause_above=0.6, max_per_hour=10)
    with Capture.on("controller") as cap:
        w.report(1, 2, 3, 4, 5)
        w.step()
        order = []
        for _ in range(40):
            assert w.busy() <= 1
            draining = [i for i in range(10) if w.fleet.state_of(i) == "DRAINING"]
            assert len(draining) <= 1
            for i in draining:
                if ec2(i) not in w.fleet.actions(REPLACE):
                    assert w.fleet.running[ci_arn(i)] == 1  # not replaced while its task is there
                    w.step()
                    assert ec2(i) not in w.fleet.actions(REPLACE)
                    w.fleet.tasks_leave(i)
                    w.step()
                    assert w.fleet.actions(REPLACE)[-1] == ec2(i)
                    order.append(i)
                    w.fleet.replaced(i)
            w.step()
            if not w.state().entries:
                break
    assert order == [1, 2, 3, 4, 5]  # in the order reported
    assert w.fleet.actions(DRAIN) == [ci_arn(i) for i in order]
    waiting = [r for r in cap.records if "waits its turn" in r.getMessage()]
    assert {r.fields["container_instance_arn"] for r in waiting} == {ci_arn(i) for i in (2, 3, 4, 5)}  # type: ignore[attr-defined]
    assert "1 of at most 1 instances draining or being replaced (--max-draining 10%)" in waiting[0].getMessage()
    started = [r for r in cap.records if "set DRAINING for a GPU fault" in r.getMessage()]
    assert started[0].levelno == logging.WARNING and started[0].fields["evidence"][0]["code"] == 79  # type: ignore[attr-defined]


def test_drains_pause_above_the_share_and_stay_paused_across_a_restart_until_resume(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.report(1, 2)
    assert w.step()["GpuDrainsPaused"] == 0.0  # 2 of 10: not above 20 %
    with Capture.on("controller") as cap:
        w.report(3)
        metrics = w.step()
    assert metrics["GpuDrainsPaused"] == 1.0 and metrics["GpuDrainsWaiting"] == 2.0
    (paused,) = [r for r in cap.records if r.getMessage().startswith("GPU drains paused")]
    assert paused.levelno == logging.ERROR and "3 of 10 container instances reported" in paused.getMessage()
    assert paused.fields["reporting_instances"] == sorted(ci_arn(i) for i in (1, 2, 3))  # type: ignore[attr-defined]
    drained = list(w.fleet.actions(DRAIN))
    assert drained == [ci_arn(1)]
    w.fleet.tasks_leave(1)
    w.restart()  # a new process: the pause is in the state
    for _ in range(5):
        assert w.step()["GpuDrainsPaused"] == 1.0
    assert w.fleet.actions(DRAIN) == drained and w.fleet.actions(REPLACE) == []  # nothing more changes
    assert resume_main(w.store) == 0
    metrics = w.step()
    assert metrics["GpuDrainsPaused"] == 0.0 and w.fleet.actions(REPLACE) == [ec2(1)]


def test_at_most_n_drains_an_hour(tmp_path: Path) -> None:
    w = World(tmp_path, max_draining=Limit(count=5), max_per_hour=2, pause_above=0.9)
    w.report(1, 2, 3)
    with Capture.on("controller") as cap:
        w.step()
    assert w.fleet.actions(DRAIN) == [ci_arn(1), ci_arn(2)]
    assert any("2 drains started in the last hour (--max-drains-per-hour 2)" in m for m in cap.messages())
    w.step(3000)
    assert len(w.fleet.actions(DRAIN)) == 2
    w.step(601)
    assert w.fleet.actions(DRAIN)[-1] == ci_arn(3)


def test_an_instance_whose_tasks_stay_is_replaced_after_the_timeout_logged(tmp_path: Path) -> None:
    w = World(tmp_path, replace_timeout=900.0)
    w.report(4)
    w.step()
    w.step(800)
    assert w.fleet.actions(REPLACE) == []
    with Capture.on("controller") as cap:
        w.step(100)
    assert w.fleet.actions(REPLACE) == [ec2(4)]
    assert any("still has 1 task(s) 900s after DRAINING: replacing it anyway" in m for m in cap.messages())


def test_an_instance_in_no_group_holds_its_slot_until_an_operator_acts(tmp_path: Path) -> None:
    w = World(tmp_path, pause_above=0.5)
    w.fleet.groups.discard(ec2(1))
    w.report(1, 2)
    w.step()
    w.fleet.tasks_leave(1)
    with Capture.on("controller") as cap:
        w.step()
    assert w.state().entries[ci_arn(1)].phase == "manual"
    assert any("in no Auto Scaling group, so nothing replaces it" in m for m in cap.messages(logging.ERROR))
    w.step()
    assert w.fleet.actions(DRAIN) == [ci_arn(1)]  # 2 still waits
    del w.fleet.instances[ci_arn(1)]  # the operator deregistered it
    w.step()
    assert w.fleet.actions(DRAIN) == [ci_arn(1), ci_arn(2)]


def test_duplicates_and_replays_change_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.report(1, 1, 1)
    w.step()
    w.report(1)
    w.step()
    assert w.fleet.actions(DRAIN) == [ci_arn(1)] and w.state().entries[ci_arn(1)].reports == 4
    assert len(w.state().reporters) == 1 and w.inbox.deleted == ["m1", "m2", "m3", "m4"]


def test_report_only_signals_drain_nothing_and_do_not_count_towards_the_pause(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.report(1, 2, 3, 4, code=63)
    w.report(5, 6, fault="recovery_action", code=3, reads=4)
    w.report(7, fault="recovery_action", code=2, reads=1)
    with Capture.on("controller") as cap:
        metrics = w.step()
    assert metrics["GpuReportsReportOnly"] == 7.0 and metrics["GpuDrainsPaused"] == 0.0
    assert w.fleet.actions(DRAIN) == [] and w.state().entries == {} and w.state().reporters == {}
    assert sum("GPU fault reported, no drain: XID 63 is report-only" in m for m in cap.messages()) == 4


def test_a_report_naming_a_task_outside_the_cluster_is_refused_counted_and_deleted(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.inbox.pending.append(message(body(1, task_arn=CLUSTER.replace("cluster/gpus", "task/other/x")), n=1))
    w.inbox.pending.append(message("{not json", n=2))
    w.inbox.pending.append(message(body(2), sender="AROAEXAMPLE:t0009x0", n=3))
    with Capture.on("controller") as cap:
        metrics = w.step()
    assert metrics["GpuReportsRefused"] == 3.0 and w.fleet.actions(DRAIN) == []
    assert w.inbox.deleted == ["m1", "m2", "m3"]
    refused = {r.fields["check"]: r.getMessage() for r in cap.records if "refused" in r.getMessage()}  # type: ignore[attr-defined]
    assert set(refused) == {"task", "shape", "sender"}
    assert refused["task"].startswith("report refused (task): task arn:aws:ecs:")
    assert "is not a task of cluster gpus" in refused["task"]


def test_a_failing_drain_call_is_counted_retried_and_changes_nothing_else(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.fleet.failing = {DRAIN}
    w.report(1, 2)
    with Capture.on("controller") as cap:
        metrics = w.step()
    assert metrics["GpuDrainFailures"] == 1.0 and w.fleet.state_of(1) == "ACTIVE"
    assert any(m.startswith("GPU drain step failed: ecs:UpdateContainerInstancesState") for m in cap.messages())
    assert [e.phase for e in w.state().entries.values()] == ["waiting", "waiting"]
    w.fleet.failing = set()
    assert w.step()["GpuDrainFailures"] == 0.0
    assert w.fleet.actions(DRAIN) == [ci_arn(1)] * 2 and w.fleet.state_of(1) == "DRAINING"  # failed, then done


def test_a_report_that_cannot_be_checked_now_stays_in_the_queue(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.fleet.failing = {"ecs:DescribeTasks"}
    w.report(1)
    w.controller.run_once()
    assert w.inbox.deleted == [] and w.state().entries == {}


def test_a_lost_state_write_leaves_the_reports_in_the_queue(tmp_path: Path) -> None:
    w = World(tmp_path)

    def conflict(data: bytes, version: str) -> str:
        raise Conflict("changed")

    w.store.save = conflict  # type: ignore[method-assign]
    w.report(1)
    metrics = w.step()
    assert w.inbox.deleted == [] and metrics["ControllerStateFailures"] == 1.0


def test_a_state_that_does_not_validate_pauses_drains_and_says_why(tmp_path: Path) -> None:
    w = World(tmp_path)
    (tmp_path / "state.json").write_text('{"version": 1, "seq": "many"}')
    w.report(1)
    with Capture.on("controller") as cap:
        metrics = w.step()
    assert metrics["GpuDrainsPaused"] == 1.0 and w.fleet.actions(DRAIN) == []
    assert any("did not validate (seq: a string, not a whole number)" in m for m in cap.messages(logging.ERROR))
    assert resume_main(w.store) == 0
    w.step()
    assert w.fleet.actions(DRAIN) == [ci_arn(1)]


def test_every_pass_emits_valid_emf_with_every_metric(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.step()
    (doc,) = w.sink.docs()
    assert validate(w.sink.lines[0], now_ms=int(w.clock.now * 1000)) == []
    names = [m["Name"] for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]]
    assert sorted(names) == sorted(NAMES) and doc["cluster"] == "gpus" and doc["ControllerHeartbeat"] == 1.0
