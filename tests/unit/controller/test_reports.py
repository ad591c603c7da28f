"""A report read as data, the controller's drain rule, and who may send it (checked against a fleet in memory)."""

from __future__ import annotations

import json

import pytest

from controller.fleet import Task
from controller.reports import DRAINING_XIDS, REPORT_ONLY_XIDS, classify, parse
from controller.verify import Refused, check
from exporter.gpufaults.verdict import FATAL_XIDS, REPORT_ONLY_RECOVERY_ACTIONS
from exporter.gpufaults.verdict import REPORT_ONLY_XIDS as EXPORTER_REPORT_ONLY
from telemetry.shapes import Malformed
from tests.unit.controller.fakes import CLUSTER, FakeFleet, body, ci_arn, ec2, task_arn


def test_a_report_parses_into_its_fields() -> None:
    r = parse(body(3, "recovery_action", 2, reads=2))
    assert (r.task_arn, r.ec2_instance_id, r.fault, r.code, r.reads) == (task_arn(3), ec2(3), "recovery_action", 2, 2)
    assert r.task_id == "t0003x0"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("not json", ""),
        ("[" * 100 + "]" * 100, ""),
        ('"a string"', ""),
        (json.dumps({"type": "rollout"}), "type"),
        (body(1, code=None), "code"),
        (body(1, fault="melted"), "fault"),
        (body(1, gpu="0"), "gpu"),
        (body(1, task_arn="i-am-not-an-arn"), "task_arn"),
        (body(1, ec2_instance_id="x" * 10), "ec2_instance_id"),
        (body(1, reason="x" * 10_000), "reason"),
        (body(1).replace('"observed_at": 1700000000.0', '"observed_at": 1e999'), ""),
        (body(1).replace('"observed_at": 1700000000.0', '"observed_at": NaN'), ""),
        (body(1, version=2), "version"),
        (body(1, evidence={"reads": True}), "evidence.reads"),
        ("x" * 20_000, ""),
    ],
)
def test_a_malformed_report_is_one_error_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(Malformed) as err:
        parse(text)
    assert err.value.path == field


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    assert parse(body(1, reason="[" * 40)).reason == "[" * 40


@pytest.mark.parametrize("xid", sorted(DRAINING_XIDS))
def test_each_fatal_xid_drains(xid: int) -> None:
    assert classify(parse(body(1, code=xid))) == "drain"


@pytest.mark.parametrize(
    ("fault", "code", "reads", "said"),
    [
        ("xid", 63, 1, "XID 63 is report-only (no drain)"),
        ("xid", 142, 1, "XID 142 is report-only (no drain)"),
        ("xid", 13, 1, "XID 13 is not a fault that drains"),
        ("recovery_action", 3, 5, "recovery action DRAIN_P2P is report-only"),
        ("recovery_action", 0, 5, "recovery action NONE is no fault"),
        ("recovery_action", 2, 1, "a recovery action drains once it read so 2 times in a row; read 1"),
    ],
)
def test_report_only_and_unpersistent_signals_never_drain(fault: str, code: int, reads: int, said: str) -> None:
    assert classify(parse(body(1, fault, code, reads=reads))).startswith(said)


@pytest.mark.parametrize(
    ("fault", "code", "reads"),
    [("recovery_action", 2, 2), ("lost", None, 1), ("row_remap_failure", None, 1), ("recovery_action", 7, 3)],
)
def test_lost_remap_and_a_persistent_recovery_action_drain(fault: str, code: int | None, reads: int) -> None:
    assert classify(parse(body(1, fault, code, reads=reads))) == "drain"


def test_the_exporter_and_the_controller_agree_on_what_drains() -> None:
    assert set(FATAL_XIDS) - set(EXPORTER_REPORT_ONLY) == DRAINING_XIDS
    assert set(EXPORTER_REPORT_ONLY) == REPORT_ONLY_XIDS == {63, 142}
    assert set(REPORT_ONLY_RECOVERY_ACTIONS) == {3}


# --- checks against the fleet --------------------------------------------------------------------------------


def test_a_report_from_a_running_task_on_its_instance_passes() -> None:
    fleet = FakeFleet(3)
    got = check(parse(body(1)), "AIDAIT2UOQQY3AUEKVGXU", fleet, "gpus")
    assert got.instance.arn == ci_arn(1) and got.instance.ec2_instance_id == ec2(1)


def test_a_role_session_must_be_the_task_it_reports_for() -> None:
    fleet = FakeFleet(3)
    check(parse(body(1)), "AROAEXAMPLEROLEID:t0001x0", fleet, CLUSTER)  # ECS names the session after the task
    with pytest.raises(Refused) as err:
        check(parse(body(1)), "AROAEXAMPLEROLEID:t0002x0", fleet, CLUSTER)  # task 2 speaking for task 1
    assert err.value.check == "sender" and "t0002x0" in err.value.message
    assert fleet.calls == [("ecs:DescribeTasks", task_arn(1)), ("ecs:DescribeContainerInstances", ci_arn(1))]


@pytest.mark.parametrize(
    ("change", "text", "check_name"),
    [
        ("other_cluster", "names cluster 'other', not gpus", "cluster"),
        ("unknown_task", "is not a task of cluster gpus", "task"),
        ("task_elsewhere", "is not a task of cluster gpus", "task"),
        ("stopped", "is STOPPED, not RUNNING", "task"),
        ("wrong_ec2", f"names EC2 instance {ec2(2)}; the task runs on {ec2(1)}", "instance"),
        ("instance_gone", "is outside the cluster", "instance"),
    ],
)
def test_a_report_that_fails_a_check_is_refused_saying_which(change: str, text: str, check_name: str) -> None:
    fleet = FakeFleet(3)
    over: dict[str, object] = {}
    if change == "other_cluster":
        over["cluster"] = "other"
    elif change == "unknown_task":
        over["task_arn"] = task_arn(99)
    elif change == "task_elsewhere":
        fleet.tasks[task_arn(1)] = Task(task_arn(1), CLUSTER.replace("gpus", "other"), "RUNNING", ci_arn(1))
    elif change == "stopped":
        fleet.tasks[task_arn(1)] = Task(task_arn(1), CLUSTER, "STOPPED", ci_arn(1))
    elif change == "wrong_ec2":
        over["ec2_instance_id"] = ec2(2)
    else:
        del fleet.instances[ci_arn(1)]
    with pytest.raises(Refused) as err:
        check(parse(body(1, **over)), "", fleet, "gpus")
    assert err.value.check == check_name and text in err.value.message
