"""The CloudWatch alarm evaluator (tests/support/cwalarm.py) against AWS's own examples and rules.

The two tables of the CloudWatch User Guide's "How alarm state is evaluated when data is missing" (3 of 3
and 2 of 3 over the 5 most recent periods), row by row and for each missing-data treatment; period
aggregation of several tasks' values; standard against high resolution; values that have not arrived;
M of N; metric math with missing values; and the rendered scaling alarms read as CloudWatch would.
"""

from __future__ import annotations

import json

import pytest

from tests.support.cwalarm import ALARM, INSUFFICIENT, OK, Alarm, Query, Store, math_expression, statistic
from tests.support.paths import REPO

ROOT = REPO
KEY = ("Triton", "M", frozenset())
T0 = 1_800_000_000.0  # a multiple of 60: periods start on it


def alarm(n: int, m: int, missing: str, period: int = 300, **kw) -> Alarm:
    q = Query("m1", "Triton", "M", frozenset(), "Average", period)
    return Alarm("a", (q,), period, n, m, 5.0, "GreaterThanThreshold", missing, **kw)


def series(pattern: str, period: int = 300) -> tuple[Store, float]:
    """``0`` within the threshold, ``X`` breaching, ``-`` missing; oldest first, one period each. Returns the
    store and the time right after the last period ended."""
    store = Store()
    for i, c in enumerate(pattern.split()):
        if c != "-":
            store.add(KEY, T0 + i * period + 1, 10.0 if c == "X" else 0.0, T0, high_resolution=True)
    return store, T0 + len(pattern.split()) * period


# (data points, MISSING, IGNORE, BREACHING, NOT BREACHING); IGNORE "keep" retains the state before.
THREE_OF_THREE = [
    ("0 - X - X", OK, OK, OK, OK),
    ("0 - - - -", OK, OK, OK, OK),
    ("- - - - -", INSUFFICIENT, "keep", ALARM, OK),
    ("0 X X - X", ALARM, ALARM, ALARM, ALARM),
    ("- - - - X", INSUFFICIENT, "keep", ALARM, OK),
]
TWO_OF_THREE = [
    ("0 - X - X", ALARM, ALARM, ALARM, ALARM),
    ("0 0 X 0 X", ALARM, ALARM, ALARM, ALARM),
    ("0 - X - -", OK, OK, ALARM, OK),
    ("- - - - 0", OK, OK, ALARM, OK),
    ("- - - - X", INSUFFICIENT, "keep", ALARM, OK),
]


@pytest.mark.parametrize(
    ("m", "row"), [(3, r) for r in THREE_OF_THREE] + [(2, r) for r in TWO_OF_THREE], ids=lambda x: str(x)
)
@pytest.mark.parametrize("before", [OK, ALARM])
def test_the_user_guides_missing_data_tables(m: int, row: tuple[str, ...], before: str) -> None:
    pattern, *expected = row
    for treatment, want in zip(("missing", "ignore", "breaching", "notBreaching"), expected, strict=True):
        a = alarm(3, m, treatment)
        a.state = before
        store, now = series(pattern)
        assert a.evaluate(store, now) == (before if want == "keep" else want), (pattern, treatment)


def test_the_range_is_what_is_retrieved_older_data_does_not_count() -> None:
    """Breaching datapoints older than the evaluation range (N + 2 periods) are not looked at."""
    store, now = series("X X X - - - - -", period=10)
    assert alarm(3, 3, "missing", period=10).evaluate(store, now) == INSUFFICIENT
    assert alarm(3, 3, "missing", period=10, evaluation_range=8).evaluate(store, now) == ALARM


def test_m_of_n_breaching_points_need_not_be_consecutive() -> None:
    store, now = series("X 0 X", period=10)
    assert alarm(3, 2, "notBreaching", period=10).evaluate(store, now) == ALARM
    assert alarm(3, 3, "notBreaching", period=10).evaluate(store, now) == OK


def test_a_period_aggregates_every_tasks_values_by_the_statistic() -> None:
    store = Store()
    for task, value in enumerate((2.0, 4.0, 12.0)):  # three tasks, one value each in the period
        store.add(KEY, T0 + 3 + task, value, T0, high_resolution=True)
    store.add(KEY, T0 + 10, 100.0, T0, high_resolution=True)  # the next period: not this one's
    got = {s: store.datapoint(KEY, s, T0, 10, T0 + 60) for s in ("Average", "Sum", "Minimum", "Maximum")}
    assert got == {"Average": 6.0, "Sum": 18.0, "Minimum": 2.0, "Maximum": 12.0}
    assert store.datapoint(KEY, "SampleCount", T0, 10, T0 + 60) == 3.0
    assert statistic("p50", [1.0, 2.0, 3.0, 4.0]) == 2.0 and statistic("p99", [1.0, 2.0, 3.0]) == 3.0
    assert statistic("Average", []) is None


def test_a_standard_resolution_metric_fills_one_10_second_period_of_six() -> None:
    """Stored at the minute, a value every 10 s is one datapoint per minute for a 10-second alarm."""
    high, standard = Store(), Store()
    for i in range(6):
        high.add(KEY, T0 + 10 * i + 2, 10.0, T0, high_resolution=True)
        standard.add(KEY, T0 + 10 * i + 2, 10.0, T0, high_resolution=False)
    periods = [T0 + 10 * i for i in range(6)]
    assert [high.datapoint(KEY, "Average", p, 10, T0 + 600) for p in periods] == [10.0] * 6
    assert [standard.datapoint(KEY, "SampleCount", p, 10, T0 + 600) for p in periods] == [6.0] + [None] * 5


def test_values_count_only_once_they_have_arrived() -> None:
    """With the newest period not ingested yet, the most recent real datapoints are evaluated (3 of 5 exist)."""
    store = Store()
    for i in range(4):
        store.add(KEY, T0 + 10 * i + 5, 10.0 if i < 3 else 0.0, T0 + 10 * i + 5 + (30 if i == 3 else 2), True)
    a = alarm(3, 3, "notBreaching", period=10)
    assert a.evaluate(store, T0 + 40) == ALARM  # the 4th period's 0 has not arrived: X X X evaluated
    assert a.evaluate(store, T0 + 80) == OK  # now it has: X X 0


def test_a_run_records_when_the_state_changed() -> None:
    store = Store()
    for i in range(12):
        store.add(KEY, T0 + 10 * i + 1, 10.0 if i >= 6 else 0.0, T0 + 10 * i + 3, True)
    a = alarm(3, 3, "notBreaching", period=10)
    a.run(store, T0, T0 + 120)
    assert [s for _, s, _ in a.transitions] == [OK, ALARM]
    assert a.first(ALARM) == T0 + 90  # periods 6, 7, 8 breach; the 8th ended at 90 and arrived at 83
    assert a.evaluation_interval == 10 and alarm(3, 3, "missing", period=60).evaluation_interval == 60


def test_metric_math_treats_missing_values_as_zero_and_drops_division_by_zero() -> None:
    assert math_expression("a / 10 + b / 100", {"a": 5.0, "b": 0.0}) == 0.5
    assert math_expression("a / b", {"a": 1.0, "b": 0.0}) is None
    with pytest.raises(ValueError):
        math_expression("MAX([a, b])", {"a": 1.0, "b": 2.0})
    qa = Query("a", "Triton", "A", frozenset(), "Maximum", 60)
    qb = Query("b", "Triton", "B", frozenset(), "Average", 60)
    a = Alarm("s", (qa, qb), 60, 1, 1, 1.0, "LessThanThreshold", "notBreaching", expression="a / 10 + b / 40")
    store = Store()
    store.add(qb.key, T0 + 5, 20.0, T0, True)  # A missing in the period: 0
    assert a.value(store, T0, T0 + 60) == 0.5
    assert a.value(store, T0 + 60, T0 + 120) is None  # neither has a value: no datapoint


def test_invalid_alarms_are_refused() -> None:
    with pytest.raises(ValueError):
        alarm(3, 4, "missing")
    with pytest.raises(ValueError):
        alarm(3, 3, "missing", period=20)
    with pytest.raises(ValueError):
        alarm(3, 3, "sometimes")


def test_the_rendered_scaling_alarms_are_read_as_cloudwatch_reads_them() -> None:
    out = Alarm.from_api(json.loads((ROOT / "alarms/cli/scaling/alarm-scale-out-pending.json").read_text()))
    assert (out.period, out.evaluation_periods, out.evaluation_interval) == (10, 3, 10)
    assert out.queries[0].metric == "TaskPendingRequests" and out.queries[0].dimensions == frozenset()
    into = Alarm.from_api(json.loads((ROOT / "alarms/cli/scaling/alarm-scale-in.json").read_text()))
    assert into.expression and into.period == 60 and len(into.queries) >= 3
    store = Store()
    for i in range(20):  # an idle service: no backlog, no request, GPUs at 8 %
        store.add(("Triton", "TaskPendingRequests", frozenset()), T0 + 60 * i + 1, 0.0, T0 + 60 * i + 3, True)
        store.add(("Triton", "GpuUtilization", frozenset()), T0 + 60 * i + 1, 8.0, T0 + 60 * i + 3, False)
    into.run(store, T0, T0 + 1200)
    assert into.state == ALARM and into.first(ALARM) == T0 + 900  # 15 minutes of every signal low


def scale_in() -> Alarm:
    return Alarm.from_api(json.loads((ROOT / "alarms/cli/scaling/alarm-scale-in.json").read_text()))


def test_the_scale_in_sum_takes_an_absent_term_as_zero_as_the_user_guide_says() -> None:
    """An idle CPU-only service without TensorRT-LLM: every task reports its backlog (0) every 10 s, and nothing
    else (no GPU utilization, no queue time while no request completes, no waiting requests or KV cache).
    "Missing values in a time series are treated as 0": the sum has a datapoint every minute, 0, and the
    service scales in after 15 minutes; the expression does not depend on FILL."""
    into = scale_in()
    assert "FILL" not in (into.expression or "")
    assert {q.metric for q in into.queries} >= {"GpuUtilization", "TaskQueueLatencyMax", "TaskRequestsWaiting"}
    store = Store()
    for task in range(2):
        for i in range(120):  # 20 minutes of 10-second fast cycles
            t = T0 + 10 * i + 3 + task
            store.add(("Triton", "TaskPendingRequests", frozenset()), t, 0.0, t + 5, high_resolution=True)
    assert into.value(store, T0, T0 + 120) == 0.0
    into.run(store, T0, T0 + 1200)
    assert into.state == ALARM and into.first(ALARM) == T0 + 900


def test_the_scale_in_sum_has_no_datapoint_while_no_task_reports_anything() -> None:
    """Silence (the exporter stopped, or the service is down): no term has a value, so no datapoint, and
    notBreaching keeps the alarm out of ALARM however long it lasts."""
    into = scale_in()
    store = Store()
    store.add(("Triton", "ExporterHeartbeat", frozenset()), T0 + 1, 1.0, T0 + 3, high_resolution=False)
    into.run(store, T0, T0 + 3600)
    assert into.value(store, T0, T0 + 120) is None
    assert into.first(ALARM) is None and into.state == OK


def test_a_busy_term_keeps_the_sum_up_while_the_others_are_absent() -> None:
    """Absent terms add 0, never hide a present one: a backlog at the scale-out threshold alone holds the sum
    at 1 (not below it), so no scale-in."""
    into = scale_in()
    store = Store()
    for i in range(120):
        t = T0 + 10 * i + 3
        store.add(("Triton", "TaskPendingRequests", frozenset()), t, 10.0, t + 5, high_resolution=True)
    into.run(store, T0, T0 + 1200)
    assert into.value(store, T0, T0 + 120) == 1.0 and into.first(ALARM) is None
