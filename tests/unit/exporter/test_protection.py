"""--task-protection: ECS task scale-in protection while the work in flight outlasts the drain (exporter/protection.py),
against a loopback stand-in of the ECS agent's endpoint (tests/support/protection_agent.py)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import pytest

from exporter.config import Settings, load
from exporter.pipeline import Pipeline
from exporter.protection import (
    EXPIRES_MINUTES,
    REST_S,
    Agent,
    AgentError,
    Evidence,
    TaskProtection,
    make,
)
from tests.support.helpers import CATALOG, IndexSource, TextSource, documents
from tests.support.protection_agent import ProtectionAgent

NOW = 1_700_000_000.0
DRAIN, IDLE, MAX_MINUTES = 60.0, 120.0, 60.0

STREAMS = Evidence(pending=0, streams=4, completed=0, window_s=60)  # 4 streams open, none ended all minute
SHORT = Evidence(pending=5, streams=0, completed=6000, window_s=60)  # busy, but each request takes 50 ms
IDLE_TASK = Evidence(pending=0, streams=0, completed=0, window_s=60)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return NOW + self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def agent(clock: Clock) -> Iterator[ProtectionAgent]:
    a = ProtectionAgent(wall=clock.wall)
    yield a
    a.close()


def protection(agent: ProtectionAgent, clock: Clock, timeout: float = 5.0) -> TaskProtection:
    tp = TaskProtection(Agent(agent.uri, timeout), DRAIN, IDLE, MAX_MINUTES, clock=clock, wall=clock.wall)
    step(tp, clock, 0, IDLE_TASK)  # the first cycle reads the agent's state
    return tp


def step(tp: TaskProtection, clock: Clock, at: float, evidence: Evidence) -> None:
    clock.t = at
    tp.observe(evidence)
    tp.settle(10)


def test_littles_law_separates_streams_from_short_requests():
    assert STREAMS.lasts_s == math.inf
    assert SHORT.lasts_s == pytest.approx(0.05)
    assert Evidence(0, 3, 3, 60).lasts_s == pytest.approx(60.0)  # 3 in flight, 3 done a minute: a minute each
    assert IDLE_TASK.lasts_s == 0.0
    assert Evidence(0, 4, None, None).lasts_s is None  # no window yet: nothing to judge by


def test_arms_while_streams_outlast_the_drain_with_an_expiry(agent, clock, caplog):
    tp = protection(agent, clock)
    assert agent.calls == [("GET", None)]
    with caplog.at_level(logging.INFO, logger="exporter.task_protection"):
        step(tp, clock, 60, STREAMS)
    assert agent.puts() == [{"ProtectionEnabled": True, "ExpiresInMinutes": EXPIRES_MINUTES}]
    assert agent.protected and tp.protected
    assert tp.changes["armed"] == 1
    (line,) = [r for r in caplog.records if r.name == "exporter.task_protection"]
    fields = line.fields  # type: ignore[attr-defined]
    assert fields["change"] == "armed" and fields["streams"] == 4 and fields["lasts_s"] == "inf"
    assert fields["expires_at"] == NOW + 60 + 60 * EXPIRES_MINUTES


def test_short_requests_under_load_are_never_protected(agent, clock):
    """Steady load: every task always has requests; protecting them would block every scale-in."""
    tp = protection(agent, clock)
    for minute in range(1, 30):
        step(tp, clock, 60 * minute, SHORT)
    assert agent.puts() == []
    assert not tp.protected


def test_renews_before_the_expiry_while_busy(agent, clock):
    tp = protection(agent, clock)
    step(tp, clock, 60, STREAMS)
    for minute in range(2, 6):  # more than half the expiry left: nothing to do
        step(tp, clock, 60 * minute, STREAMS)
    assert len(agent.puts()) == 1
    step(tp, clock, 60 * 6 + 1, STREAMS)  # less than half left
    assert len(agent.puts()) == 2 and tp.changes["renewed"] == 1
    for minute in range(7, 40):
        step(tp, clock, 60 * minute, STREAMS)
        assert agent.protected, minute  # ECS never saw it lapse
    assert tp.changes["renewed"] >= 6


def test_clears_after_the_idle_hold(agent, clock):
    tp = protection(agent, clock)
    step(tp, clock, 60, STREAMS)
    step(tp, clock, 120, IDLE_TASK)  # quiet since 120
    step(tp, clock, 180, IDLE_TASK)
    assert agent.protected and len(agent.puts()) == 1
    step(tp, clock, 240, IDLE_TASK)  # 120 s quiet: the hold
    assert agent.puts()[-1] == {"ProtectionEnabled": False}
    assert not agent.protected and not tp.protected
    assert tp.changes == {"armed": 1, "renewed": 0, "cleared": 1}


def test_work_coming_back_within_the_hold_keeps_it(agent, clock):
    tp = protection(agent, clock)
    step(tp, clock, 60, STREAMS)
    step(tp, clock, 120, IDLE_TASK)
    step(tp, clock, 180, STREAMS)
    step(tp, clock, 240, IDLE_TASK)
    step(tp, clock, 300, IDLE_TASK)
    assert agent.protected and len(agent.puts()) == 1


def test_never_longer_than_the_maximum_on_end(agent, clock):
    """Long streams all day: scale-in and deployments wait the maximum at most."""
    tp = protection(agent, clock)
    t = 60.0
    while t <= 60 * MAX_MINUTES + 60:
        step(tp, clock, t, STREAMS)
        t += 60
    assert agent.puts()[-1] == {"ProtectionEnabled": False} and not agent.protected
    cleared_at = t - 60
    while t < cleared_at + REST_S:
        step(tp, clock, t, STREAMS)
        assert not agent.protected
        t += 60
    step(tp, clock, t, STREAMS)
    assert agent.protected and tp.changes["armed"] == 2


def test_a_protection_it_cannot_renew_lapses_at_its_expiry(agent, clock):
    tp = protection(agent, clock)
    step(tp, clock, 60, STREAMS)
    agent.mode = "deny"
    for minute in range(2, 13):
        step(tp, clock, 60 * minute, STREAMS)
    assert clock.t > 60 + 60 * EXPIRES_MINUTES
    assert not agent.protected and not tp.protected  # neither ECS nor the metric holds it past its expiry
    assert tp.failures == len(agent.puts()) - 1 == 6  # renewals from minute 7, then arms: one try a cycle
    assert tp.series().samples["exporter_task_protected"] == {"": 0.0}


@pytest.mark.parametrize(
    ("mode", "kind"), [("deny", "error"), ("failure", "failure"), ("garbage", "malformed"), ("hang", "unreachable")]
)
def test_each_failure_is_typed_counted_and_logged_and_the_next_cycle_retries(agent, clock, caplog, mode, kind):
    tp = protection(agent, clock, timeout=0.5)
    agent.mode, agent.hang_s = mode, 2.0
    with pytest.raises(AgentError) as raised:
        tp.agent.put(True)
    assert raised.value.kind == kind
    with caplog.at_level(logging.WARNING, logger="exporter.task_protection"):
        step(tp, clock, 60, STREAMS)
    assert tp.failures == 1 and tp.changes["armed"] == 0 and not tp.protected
    (line,) = [r for r in caplog.records if r.name == "exporter.task_protection"]
    assert line.fields["failure"] == kind and line.fields["action"] == "arm"  # type: ignore[attr-defined]
    agent.mode = ""
    step(tp, clock, 120, STREAMS)
    assert agent.protected and tp.changes["armed"] == 1


def test_the_cycle_does_not_wait_on_the_agent(agent, clock):
    agent.mode, agent.hang_s = "hang", 2.0
    tp = TaskProtection(Agent(agent.uri, 1.0), DRAIN, IDLE, MAX_MINUTES, clock=clock, wall=clock.wall)
    tp.observe(IDLE_TASK)  # the start's read: on the worker
    assert tp._worker is not None and tp._worker.is_alive()  # observe returned while the call hangs
    tp.observe(STREAMS)  # one call at a time: nothing more is queued behind it
    tp.settle(5)
    assert agent.calls == [("GET", None)] and tp.failures == 1


def test_a_protection_found_at_start_is_cleared_when_idle(agent, clock):
    """An exporter restarted in a protected task learns it from GET and clears it once the task is idle."""
    agent.enabled, agent.expires_at = True, clock.wall() + 600
    tp = protection(agent, clock)
    assert tp.protected
    step(tp, clock, 60, IDLE_TASK)
    step(tp, clock, 180, IDLE_TASK)
    assert agent.puts() == [{"ProtectionEnabled": False}] and not agent.protected


def test_evidence_from_the_scrape_pending_active_streams_and_completions(clock):
    tp = TaskProtection(Agent("http://127.0.0.1:1/api/x"), DRAIN, IDLE, MAX_MINUTES, clock=clock, wall=clock.wall)

    def scrape(done: int) -> str:
        return f"""# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="a",version="1"}} 2
nv_inference_pending_request_count{{model="b",version="1"}} 1
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="a",version="1"}} {done}
nv_inference_request_success{{model="b",version="1"}} 10
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{{model="b",version="1",request_type="active"}} 6
nv_trt_llm_request_metrics{{model="b",version="1",request_type="waiting"}} 2
nv_trt_llm_request_metrics{{model="b",version="1",request_type="max"}} 64
"""

    source = TextSource(scrape(100), scrape(130))
    first = source.collect(1.0).samples
    assert tp.evidence(first.samples, first.labels) == Evidence(3, 6, None, None)
    clock.t = 60
    second = source.collect(1.0).samples
    e = tp.evidence(second.samples, second.labels)
    assert e == Evidence(3, 6, 30, 60)  # active only, not waiting or max
    assert e.lasts_s == pytest.approx(9 * 60 / 30)


def test_its_counts_reach_the_catalogs_metrics(agent, clock):
    tp = protection(agent, clock)
    step(tp, clock, 60, STREAMS)
    p = Pipeline(Settings(nvml="off"), CATALOG, [TextSource("", ""), IndexSource()], outputs=[tp])
    p.cycle()
    docs = documents(p.cycle())
    (task,) = [d for d in docs if "TaskProtected" in d]
    assert task["TaskProtected"] == 1.0 and task["TaskProtectionChanges"] == 0.0
    assert task["TaskProtectionFailures"] == 0.0


def test_off_by_default_and_outside_ecs(caplog):
    assert load([], {}).task_protection == "off"
    assert make(load([], {"ECS_AGENT_URI": "http://169.254.170.2/api/x"})) is None
    on = load([], {"EXPORTER_TASK_PROTECTION": "on"})
    with caplog.at_level(logging.INFO, logger="exporter.task_protection"):
        assert make(on) is None
    (line,) = caplog.records
    assert "ECS_AGENT_URI is not set" in line.getMessage() and line.levelno == logging.WARNING
    made = make(load([], {"EXPORTER_TASK_PROTECTION": "on", "ECS_AGENT_URI": "http://169.254.170.2/api/x"}))
    assert made is not None and made.agent.url == "http://169.254.170.2/api/x/task-protection/v1/state"
