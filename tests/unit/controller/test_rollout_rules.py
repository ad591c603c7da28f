"""The controller's verdict rules (controller/rules.py): each test fails without its rule."""

from __future__ import annotations

from controller.rules import Rules, crashed, early_abort, failure_rejects, judge
from modelsync.evidence import PROMOTE, REJECT, WAIT, Window

BASE = [("control", Window(successes=995, failures=5, duration_us=995_000))]


def test_early_abort_rejects_a_canary_failing_everything_long_before_the_bake_ends() -> None:
    j = early_abort(Window(successes=0, failures=150), BASE, Rules(bake_seconds=600), baked=10)
    assert j is not None and j.verdict == REJECT and j.reason.startswith("early abort")


def test_no_early_abort_below_the_minimum_requests_or_for_a_small_increase() -> None:
    assert early_abort(Window(failures=50), BASE, Rules(), baked=10) is None
    assert early_abort(Window(successes=985, failures=15), BASE, Rules(), baked=10) is None


def test_the_ceiling_rejects_what_a_failing_baseline_would_excuse() -> None:
    base = [("control", Window(successes=700, failures=300))]
    j = judge(Window(successes=691, failures=309), base, Rules(), baked=600)
    assert j.verdict == REJECT and "--max-failure-ratio" in j.reason


def test_a_significant_increase_rejects_and_noise_does_not() -> None:
    assert failure_rejects(20, 1000, 5, 1000, 0.01)  # 2.0 % against 0.5 %
    assert not failure_rejects(1, 100, 0, 100, 0.01)  # one failure in a hundred: noise


def test_latency_is_judged_on_the_bakes_own_average() -> None:
    slow = Window(successes=1000, duration_us=20 * 995_000 * 1000 / 995)
    j = judge(slow, BASE, Rules(max_failure_ratio=0.5), baked=600)
    assert j.verdict == REJECT and "average latency over the bake" in j.reason


def test_silence_waits_and_two_crashes_reject() -> None:
    assert judge(Window(successes=10), BASE, Rules(), baked=600).verdict == WAIT
    assert judge(Window(successes=1000, duration_us=1_000_000), BASE, Rules(), baked=600).verdict == PROMOTE
    assert crashed(["a"]) is None
    j = crashed(["a", "b"])
    assert j is not None and j.verdict == REJECT
