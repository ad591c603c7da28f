"""The rendered scaling (issue 37): what the policies do, under Application Auto Scaling's and CloudWatch's
documented rules (tests/support/aas.py, tests/support/cwalarm.py), not only their shape.

- proportional scale-out: the excess policy adds the unserved share of the demand, one action;
- its steps overshoot the need by at most one task per ten, within Application Auto Scaling's 20 steps;
- its cooldown is the task's start plus the alarm's sight: a repeat adds nothing until the alarm has seen the new
  tasks, a larger excess adds the rest;
- the excess: shed requests count, a standing queue does not, starting tasks do not dilute it;
- scale-in on per-task averages: a larger fleet with the same per-task load still scales in;
- a minimum of 1, refused below.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest

from render import main, options_from, render
from render.base.options import Options
from render.template import build as build_template
from tests.support.aas import StepPolicy, Target, rounded
from tests.support.cwalarm import ALARM, OK, Alarm, Store
from tests.support.helpers import CATALOG

EPOCH = 1_700_000_000.0 // 3600 * 3600


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    return render(Options(catalog=CATALOG))


def scaling_file(files: dict[str, str], name: str) -> dict[str, Any]:
    return json.loads(files[f"alarms/cli/scaling/{name}.json"])  # type: ignore[no-any-return]


def target(files: dict[str, str], desired: int, maximum: int = 10_000) -> Target:
    policies = {
        name: StepPolicy.from_api(scaling_file(files, f"policy-{name}"))
        for name in ("scale-out-excess", "scale-out-pending", "scale-in")
    }
    return Target(1, maximum, desired, policies, scale_in_cooldown=600)


def needed(tasks: int, surge: float) -> int:
    """Tasks that serve ``1 + surge`` times the demand ``tasks`` served at capacity."""
    return math.ceil(round(tasks * (1 + surge), 9))


@pytest.mark.parametrize("tasks", [2, 20, 100])
@pytest.mark.parametrize("surge", [0.1, 0.5, 2.0])
def test_one_excess_action_adds_enough_and_little_more(files, tasks: int, surge: float) -> None:
    """A saturated service's excess is ``lambda / mu - 1``: one action covers it; a 10 % surge overshoots by at
    most one task per ten, and a 50 % surge on 20 tasks reaches 30."""
    threshold = scaling_file(files, "alarm-scale-out-excess")["Threshold"]
    t = target(files, tasks)
    t.invoke([("scale-out-excess", surge - threshold)], EPOCH)
    assert t.desired >= needed(tasks, surge), (tasks, surge, t.desired)
    if surge == 0.1:
        assert t.desired - needed(tasks, surge) <= tasks // 10, (tasks, t.desired)
    if (tasks, surge) == (20, 0.5):
        assert t.desired >= 30


def test_the_excess_policy_is_percent_with_a_minimum_of_one(files) -> None:
    config = scaling_file(files, "policy-scale-out-excess")["StepScalingPolicyConfiguration"]
    assert (config["AdjustmentType"], config["MinAdjustmentMagnitude"]) == ("PercentChangeInCapacity", 1)
    steps = config["StepAdjustments"]
    assert steps[0]["MetricIntervalLowerBound"] == 0 and "MetricIntervalUpperBound" not in steps[-1]
    for a, b in itertools.pairwise(steps):  # contiguous, increasing
        assert a["MetricIntervalUpperBound"] == b["MetricIntervalLowerBound"]
        assert a["ScalingAdjustment"] < b["ScalingAdjustment"]
    # Each step adds at least its upper edge of excess: the step it is chosen for is covered.
    threshold = scaling_file(files, "alarm-scale-out-excess")["Threshold"]
    for s in steps[:-1]:
        assert s["ScalingAdjustment"] / 100 >= s["MetricIntervalUpperBound"] + threshold - 1e-9
    assert rounded(0.3) == 1 and rounded(12.7) == 12 and rounded(-0.4) == -1  # AAS's documented rounding


def test_no_step_adds_more_than_one_task_per_ten_above_need(files) -> None:
    """For excesses from 10 % to 300 % (on a grid, and at every step's edge), one action leaves the service at most
    one task per ten of the tasks it needs above that need (the one-task minimum aside): a step wider than that
    (an excess of exactly 2.0 landing in a step that adds 300 %) gives 401 tasks where 300 serve."""
    threshold = scaling_file(files, "alarm-scale-out-excess")["Threshold"]
    steps = scaling_file(files, "policy-scale-out-excess")["StepScalingPolicyConfiguration"]["StepAdjustments"]
    edges = [round(s["MetricIntervalLowerBound"] + threshold, 6) for s in steps]
    grid = sorted({*(round(0.10 + 0.01 * i, 6) for i in range(291)), *(e for e in edges if 0.10 <= e <= 3.0)})
    for tasks, excess in itertools.product([1, 2, 3, 7, 10, 20, 33, 100, 250, 1000], grid):
        t = target(files, tasks)
        t.invoke([("scale-out-excess", excess - threshold)], EPOCH)
        need = needed(tasks, excess)
        minimum = t.desired == tasks + 1
        assert t.desired - need <= need // 10 + minimum, (tasks, excess, t.desired, need)


def test_the_steps_fit_application_auto_scaling(files) -> None:
    """PutScalingPolicy takes at most 20 step adjustments; the steps reach past a 300 % excess."""
    steps = scaling_file(files, "policy-scale-out-excess")["StepScalingPolicyConfiguration"]["StepAdjustments"]
    assert len(steps) <= 20
    assert steps[-1]["MetricIntervalLowerBound"] >= 3.0


def sight(files: dict[str, str]) -> int:
    """Seconds the excess alarm needs to see new capacity: its evaluation window, and one period for the last
    period's value to be written and reach CloudWatch."""
    alarm = scaling_file(files, "alarm-scale-out-excess")
    period = {m["MetricStat"]["Period"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert len(period) == 1
    return int(period.pop()) * (int(alarm["EvaluationPeriods"]) + 1)


SCALE_OUT = ("scale-out-excess", "scale-out-pending", "scale-out-queue-time", "scale-out-llm-waiting")


@pytest.mark.parametrize("start", [600, 0, 900, 3600])
def test_cooldown_is_the_task_start_plus_the_alarms_sight(start: int) -> None:
    """A cooldown equal to the start ends while the alarm still reads the overload the new tasks have just met
    (their values are 10 to 40 s from its evaluation): the next invocation adds the step again. Every scale-out
    cooldown is TaskStartSeconds plus the excess alarm's window and a period, in the CLI files, the template (no
    addition in CloudFormation: a lookup) and Terraform."""
    files = render(Options(catalog=CATALOG, task_start_seconds=start))
    want = start + sight(files)
    template = json.loads(files["alarms/triton-alarms.template.json"])
    terraform = json.loads(files["deploy/terraform/alarms.tf.json"])
    tf_policies = terraform["resource"]["aws_appautoscaling_policy"]
    for name in SCALE_OUT:
        assert scaling_file(files, f"policy-{name}")["StepScalingPolicyConfiguration"]["Cooldown"] == want
        logical = "ScaleOut" + "".join(p.title() for p in name.split("-")[2:]) + "Policy"
        cooldown = template["Resources"][logical]["Properties"]["StepScalingPolicyConfiguration"]["Cooldown"]
        index, (sep, lookup) = cooldown["Fn::Select"][0], cooldown["Fn::Select"][1]["Fn::Split"]
        table, key, column = lookup["Fn::FindInMap"]
        assert index == {"Ref": "TaskStartSeconds"}
        assert int(template["Mappings"][table][key][column].split(sep)[start]) == want
        tf = tf_policies[name.replace("-", "_")]["step_scaling_policy_configuration"][0]["cooldown"]
        assert tf == f"${{var.task_start_seconds + {sight(files)}}}"
    maximum = template["Parameters"]["TaskStartSeconds"]["MaxValue"]
    assert len(template["Mappings"]["Sums"]["TaskStartSeconds"]["Plus40"].split(",")) == maximum + 1


def test_the_excess_alarm_sees_new_capacity_within_the_sight(files) -> None:
    """Twenty tasks shed a third of the demand (excess 0.5); at ``S`` thirty serve it all. Whatever the phase and an
    ingestion delay up to a period, the alarm is still in ALARM at ``S`` (a cooldown of the start alone ends too
    early) and leaves it within :func:`sight`."""
    for phase, delay in itertools.product((0.0, 3.3, 7.7, 9.9), (1.0, 5.0, 9.0)):
        s_at = EPOCH + 300 + phase
        store = Store()
        for k in range(60):
            for i in range(30):
                ts = EPOCH + 10 * k + 1 + i * 0.1
                before = ts < s_at
                if before and i >= 20:
                    continue  # still starting: writes nothing
                values = serving(pending=64, rejected=SERVED / 2) if before else serving()
                for name, value in values.items():
                    store.add(("Triton", name, frozenset()), ts, value, ts + delay, True)
        a = excess_alarm(files)
        a.run(store, EPOCH, EPOCH + 600)
        assert a.first(ALARM) is not None and a.first(ALARM) < s_at
        left = a.first(OK, after=a.first(ALARM))
        assert left is not None and s_at < left <= s_at + sight(files), (phase, delay, left - s_at)


def test_cooldown_counts_starting_tasks(files) -> None:
    """Within the cooldown a repeat of the same excess adds nothing (the tasks it added are starting); a larger
    excess adds only the difference; after it, the same excess adds again."""
    cooldown = scaling_file(files, "policy-scale-out-excess")["StepScalingPolicyConfiguration"]["Cooldown"]
    t = target(files, 20)
    # Both alarms see the surge at the same evaluation (30 s held); the larger wins: excess 0.5, +51 % -> 30.
    t.invoke([("scale-out-excess", 0.45), ("scale-out-pending", 100.0)], EPOCH)
    assert t.desired == 30
    for minute in range(1, 10):  # the alarm stays in ALARM while the 10 tasks load their model
        t.invoke([("scale-out-excess", 0.45)], EPOCH + 60 * minute)
        t.invoke([("scale-out-pending", 100.0)], EPOCH + 60 * minute)  # the backstop adds nothing either
    assert t.desired == 30
    t.invoke([("scale-out-excess", 0.75)], EPOCH + 300)  # the excess grew to 0.8: +82 % of 20, 6 more
    assert t.desired == 36
    t.invoke([("scale-out-excess", 0.45)], EPOCH + 300 + cooldown - 1)
    assert t.desired == 36
    t.invoke([("scale-out-excess", 0.45)], EPOCH + 300 + cooldown)
    assert t.desired > 36


def test_the_backstop_adds_one_task(files) -> None:
    for name in ("scale-out-pending", "scale-out-queue-time", "scale-out-llm-waiting"):
        config = scaling_file(files, f"policy-{name}")["StepScalingPolicyConfiguration"]
        assert config["AdjustmentType"] == "ChangeInCapacity"
        assert config["StepAdjustments"] == [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]


# --- the excess, evaluated as CloudWatch would ----------------------------------------------------------


def fleet(tasks: list[dict[str, float]], seconds: int = 120, grow: float = 0.0) -> Store:
    """Every task writes its values every 10 s; ``grow`` is each serving task's backlog growth per 10 s."""
    store = Store()
    for k in range(seconds // 10):
        for i, values in enumerate(tasks):
            ts = EPOCH + 10 * k + 1 + i * 0.1
            for name, value in values.items():
                if name == "TaskPendingRequests" and values.get("TaskRequestsServed"):
                    value += grow * k
                store.add(("Triton", name, frozenset()), ts, value, ts + 5, True)
    return store


def excess_alarm(files: dict[str, str]) -> Alarm:
    return Alarm.from_api(scaling_file(files, "alarm-scale-out-excess"))


SERVED = 5710.0  # 571 requests/s, 10 s


def serving(pending: float = 0.0, rejected: float = 0.0) -> dict[str, float]:
    return {"TaskPendingRequests": pending, "TaskRequestsRejected": rejected, "TaskRequestsServed": SERVED}


STARTING = {"TaskPendingRequests": 0.0, "TaskRequestsRejected": 0.0, "TaskRequestsServed": 0.0}


def test_shed_requests_are_overload(files) -> None:
    """A full queue (Triton's max_queue_size) sheds half the demand: the backlog no longer grows, the excess
    says 0.5."""
    a = excess_alarm(files)
    store = fleet([serving(pending=64, rejected=SERVED / 2)] * 3)
    a.run(store, EPOCH, EPOCH + 120)
    assert a.state == ALARM
    assert a.value(store, EPOCH + 60, EPOCH + 200) == pytest.approx(0.5)


def test_a_growing_backlog_is_overload_and_a_standing_one_is_not(files) -> None:
    growing = excess_alarm(files)
    store = fleet([serving()] * 3, grow=SERVED * 0.1)
    growing.run(store, EPOCH, EPOCH + 120)
    assert growing.state == ALARM and growing.value(store, EPOCH + 60, EPOCH + 200) == pytest.approx(0.1)
    standing = excess_alarm(files)
    standing.run(fleet([serving(pending=500)] * 3), EPOCH, EPOCH + 120)
    assert standing.state == OK  # no excess: the backstop alarm on the backlog's level adds a task


def test_starting_tasks_do_not_dilute_the_excess(files) -> None:
    """Twelve tasks that are still loading their model (they serve nothing) beside twenty saturated ones: the
    excess is the same; the backlog per task (the backstop's average) is diluted by them."""
    store = fleet([serving(pending=64, rejected=SERVED / 2)] * 20 + [STARTING] * 12)
    a = excess_alarm(files)
    assert a.value(store, EPOCH + 60, EPOCH + 200) == pytest.approx(0.5)
    backlog = Alarm.from_api(scaling_file(files, "alarm-scale-out-pending"))
    assert backlog.value(store, EPOCH + 60, EPOCH + 200) == pytest.approx(64 * 20 / 32)


def test_no_service_no_excess(files) -> None:
    a = excess_alarm(files)
    store = fleet([STARTING] * 3)  # nothing served: a division by zero drops the datapoint
    assert a.value(store, EPOCH + 60, EPOCH + 200) is None
    a.run(store, EPOCH, EPOCH + 120)
    assert a.state == OK


# --- scale-in on a per-task measure -----------------------------------------------------------------------


@pytest.mark.parametrize("tasks", [2, 20, 100])
def test_scale_in_does_not_stall_as_the_fleet_grows(files, tasks: int) -> None:
    """Each minute one task sees a short burst of 12 requests (above the threshold), the others 1, the GPUs are
    10 % busy: the average task is idle at any size. A worst-task maximum read 1.2 at every size."""
    into = Alarm.from_api(scaling_file(files, "alarm-scale-in"))
    store = Store()
    for minute in range(20):
        for i in range(tasks):
            ts = EPOCH + 60 * minute + 5 + i * 0.01
            pending = 12.0 if i == minute % tasks else 1.0
            for name, value in (("TaskPendingRequests", pending), ("GpuUtilization", 10.0)):
                store.add(("Triton", name, frozenset()), ts, value, ts + 5, False)
    into.run(store, EPOCH, EPOCH + 20 * 60)
    assert into.first(ALARM) is not None


# --- the minimum --------------------------------------------------------------------------------------------


def test_min_capacity_is_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    """With no task nothing emits the signals, missing data is not breaching: the service would never scale out
    again. The render, the template and (through the generated variable) Terraform refuse 0."""
    with pytest.raises(ValueError, match="min-capacity >= 1"):
        options_from({"min_capacity": 0})
    assert main(["--min-capacity", "0", "--check"]) == 2
    assert "no signal" in capsys.readouterr().err
    param = build_template(Options(catalog=CATALOG))["Parameters"]["MinCapacity"]
    assert (param["MinValue"], param["Default"]) == (1, 1)
    assert param["Description"].startswith("Fewest tasks scaling may leave; at least 1")
