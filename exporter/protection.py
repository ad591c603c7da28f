"""``--task-protection on``: ECS task scale-in protection while this task holds work a scale-in would cut.

A stopping task gives its requests the load balancer's deregistration delay plus Triton's exit timeout (the
*drain*, 60 s in the shipped stack); a request that lasts longer, an LLM stream, is cut. Protecting every busy
task would block every scale-in and hold every deployment (under steady load every task always has work), so
the task is protected only while its work **outlasts the drain** (docs/scaling.md, "Scale-in protection"):

    in flight   L = Triton's pending requests + TensorRT-LLM's active requests (streams), summed over models
    completions X = requests completed per second over the last full cycle (nv_inference_request_success)
    time in system W = L / X (Little's law); X = 0 with L > 0: a request has been in flight the whole window

Protected when ``W > drain``; renewed before the expiry runs out while that holds; cleared once it has not held
for ``idle`` seconds; never protected more than ``max_minutes`` on end (then cleared and left alone for
:data:`REST_S`, so a scale-in or a deployment waiting on the task can take it). Every change is one JSON line
with its evidence and counted (catalog ``TaskProtected``, ``TaskProtectionChanges``, ``TaskProtectionFailures``).

The calls go to the ECS agent (``PUT``/``GET $ECS_AGENT_URI/task-protection/v1/state``; the agent calls ECS as
the task role, which needs ``ecs:UpdateTaskProtection`` and ``ecs:GetTaskProtection``) on one worker thread:
the cycle never waits on them, each has a deadline, and a failed one is counted, logged and retried at the next
cycle; the protection then lapses at its expiry at worst. Off by default; off outside ECS (no agent URI).
"""

from __future__ import annotations

import calendar
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from telemetry.logs import get
from triton_http import Client, RequestFailed

from .series import Exposition, LabelSet, Series

if TYPE_CHECKING:
    from .config import Settings
    from .pipeline import Scrape

log = get("task_protection")

STATE_PATH = "/task-protection/v1/state"
EXPIRES_MINUTES = 10  # each PUT's ExpiresInMinutes: an exporter that dies leaves the task protected this long at most
RENEW_BELOW_S = EXPIRES_MINUTES * 60 / 2  # renewed when less than half of it is left
REST_S = 300.0  # after max_minutes on end: unprotected this long, whatever the work
CALL_TIMEOUT_S = 6.0  # the agent gives its own ECS call 4 s
MAX_BODY = 64 * 1024

PROTECTED = "exporter_task_protected"
CHANGES = "exporter_task_protection_changes_total"
FAILURES = "exporter_task_protection_failures_total"

PENDING = "nv_inference_pending_request_count"
LLM_REQUESTS = "nv_trt_llm_request_metrics"  # request_type="active": the batcher's requests (open streams)
COMPLETED = "nv_inference_request_success"


class AgentError(Exception):
    """A call to the agent's task-protection endpoint did not change or read the state; ``kind`` says why:
    ``unreachable`` (no answer in time), ``error`` (the agent's or ECS's error, e.g. AccessDeniedException),
    ``failure`` (ECS refused this task, e.g. TASK_NOT_VALID) or ``malformed``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class State:
    enabled: bool
    expires_at: float | None  # epoch seconds (the agent's ExpirationDate)


def _epoch(text: object) -> float | None:
    """RFC 3339 (``2023-12-20T21:57:44.837Z``, as the agent writes Go's time) to epoch seconds."""
    if not isinstance(text, str) or len(text) < 20:
        return None
    try:
        whole = time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return float(calendar.timegm(whole))


class Agent:
    """The ECS agent's task-protection endpoint (container agent 1.65+), every call bounded by ``timeout``."""

    def __init__(self, agent_uri: str, timeout: float = CALL_TIMEOUT_S) -> None:
        self.url = agent_uri.rstrip("/") + STATE_PATH
        self.timeout = timeout
        self.client = Client(min(1.0, timeout), MAX_BODY)

    def get(self) -> State:
        return self._call("GET", None)

    def put(self, enabled: bool, minutes: int = EXPIRES_MINUTES) -> State:
        body: dict[str, object] = {"ProtectionEnabled": enabled}
        if enabled:
            body["ExpiresInMinutes"] = minutes
        return self._call("PUT", body)

    def _call(self, method: str, body: object) -> State:
        try:
            resp = self.client.request(method, self.url, self.timeout, body)
        except RequestFailed as exc:
            raise AgentError("unreachable", exc.reason) from None
        try:
            answer: Any = resp.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise AgentError("malformed", f"HTTP {resp.status}, not a JSON object")
        for key, fields in (("error", ("Code", "Message")), ("failure", ("Reason", "Detail"))):
            if isinstance(answer.get(key), dict):
                what = ": ".join(str(answer[key].get(f, "")) for f in fields)
                raise AgentError(key, f"HTTP {resp.status} {what}"[:300])
        protection = answer.get("protection")
        if resp.status != 200 or not isinstance(protection, dict):
            raise AgentError("malformed", f"HTTP {resp.status} without a protection object")
        enabled = protection.get("ProtectionEnabled") is True
        return State(enabled, _epoch(protection.get("ExpirationDate")) if enabled else None)


@dataclass(frozen=True)
class Evidence:
    """What one full cycle says about the work in flight."""

    pending: float
    streams: float
    completed: float | None  # over the window; None: no window yet, or the counters went down
    window_s: float | None

    @property
    def in_flight(self) -> float:
        return self.pending + self.streams

    @property
    def lasts_s(self) -> float | None:
        """Little's law: the mean time in the task of the work in flight (inf: nothing completed all window)."""
        if self.in_flight <= 0:
            return 0.0
        if self.completed is None or not self.window_s:
            return None
        return math.inf if self.completed <= 0 else self.in_flight * self.window_s / self.completed

    def fields(self) -> dict[str, object]:
        lasts = self.lasts_s
        return {
            "pending": self.pending,
            "streams": self.streams,
            "completed": self.completed,
            "window_s": None if self.window_s is None else round(self.window_s, 1),
            "lasts_s": None if lasts is None else ("inf" if math.isinf(lasts) else round(lasts, 2)),
        }


def _sum(series: Series | None, labels: Mapping[str, LabelSet], where: tuple[str, str] | None = None) -> float:
    if not series:
        return 0.0
    if where is None:
        return float(sum(series.values()))
    name, value = where
    return float(sum(v for k, v in series.items() if k in labels and labels[k].get(name) == value))


@dataclass
class _Call:
    action: str  # read, arm, renew, clear
    reason: str
    evidence: Evidence | None
    rest: bool = False  # a clear at the maximum: then left alone for REST_S


class TaskProtection:
    """A scrape output (:class:`exporter.pipeline.ScrapeOutput`): decides at each full cycle, calls off it."""

    def __init__(
        self,
        agent: Agent,
        drain_s: float,
        idle_s: float,
        max_minutes: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.agent = agent
        self.drain_s = drain_s
        self.idle_s = idle_s
        self.max_s = max_minutes * 60.0
        self.clock = clock
        self.wall = wall
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._known = False  # the agent's state was read (or set) once
        self._protected_until = -math.inf  # monotonic: the expiry of the protection we set or read
        self._since = math.inf  # monotonic: when the running protection began
        self._quiet_since: float | None = None  # when the work stopped outlasting the drain
        self._rest_until = -math.inf
        self._last: tuple[float, float] | None = None  # (completions, clock) at the last cycle
        self.changes: dict[str, int] = {"armed": 0, "renewed": 0, "cleared": 0}
        self.failures = 0

    # --- the scrape output ----------------------------------------------------------------

    def export(self, scrape: Scrape) -> None:
        self.observe(self.evidence(scrape.samples, scrape.labels))

    def series(self) -> Exposition:
        out = Exposition()
        out.add(PROTECTED, LabelSet(), 1.0 if self.protected else 0.0)
        for change, n in self.changes.items():
            out.add(CHANGES, LabelSet.of(change=change), float(n))
        out.add(FAILURES, LabelSet(), float(self.failures))
        return out

    def close(self, timeout: float) -> None:
        """Leaves the protection as it is: it expires on its own (a stopping task is not scaled in)."""
        self.settle(timeout)

    # --- deciding -------------------------------------------------------------------------

    @property
    def protected(self) -> bool:
        with self._lock:
            return self.clock() < self._protected_until

    def evidence(self, samples: Mapping[str, Series], labels: Mapping[str, LabelSet]) -> Evidence:
        now = self.clock()
        done = _sum(samples.get(COMPLETED), labels)
        completed = window = None
        if self._last is not None and done >= self._last[0]:
            completed, window = done - self._last[0], now - self._last[1]
        self._last = (done, now)
        streams = _sum(samples.get(LLM_REQUESTS), labels, ("request_type", "active"))
        return Evidence(_sum(samples.get(PENDING), labels), streams, completed, window)

    def observe(self, evidence: Evidence) -> None:
        """One full cycle's decision; the call runs on the worker, at most one at a time."""
        call = self.decide(evidence, self.clock())
        if call is None or (self._worker is not None and self._worker.is_alive()):
            return
        self._worker = threading.Thread(target=self._run, args=(call,), name="task-protection", daemon=True)
        self._worker.start()

    def decide(self, e: Evidence, now: float) -> _Call | None:
        if not self._known:
            return _Call("read", "start", e)
        lasts = e.lasts_s
        outlasts = lasts is not None and lasts > self.drain_s
        with self._lock:
            protected = now < self._protected_until
            since = self._since
            left = self._protected_until - now
        if lasts is None:
            return None  # no window to judge by: keep what is
        if outlasts:
            self._quiet_since = None
            if now < self._rest_until:
                return None
            if not protected:
                return _Call("arm", f"the work in flight lasts longer than the drain ({self.drain_s:g} s)", e)
            if now - since >= self.max_s:
                return _Call("clear", f"protected {self.max_s / 60:g} minutes on end (the maximum)", e, rest=True)
            if left < RENEW_BELOW_S:
                return _Call("renew", "still outlasts the drain; the expiry is near", e)
            return None
        if not protected:
            self._quiet_since = None
            return None
        if self._quiet_since is None:
            self._quiet_since = now
        if now - self._quiet_since >= self.idle_s:
            return _Call("clear", f"no work outlasting the drain for {self.idle_s:g} s", e)
        return None

    def _run(self, call: _Call) -> None:
        started = self.clock()
        try:
            state = self.agent.get() if call.action == "read" else self.agent.put(call.action != "clear")
        except AgentError as exc:
            self.failures += 1
            if call.action == "read":
                self._known = True  # decided as unprotected: a protection set before expires on its own
            log.warning(
                "task protection: %s failed (%s); retried at the next cycle, any protection expires on its own",
                call.action,
                exc,
                extra={"fields": {"action": call.action, "failure": exc.kind, **_fields(call)}},
            )
            return
        with self._lock:
            self._known = True
            remaining = EXPIRES_MINUTES * 60.0  # from before the call: ECS counts from later
            if call.action == "read" and state.expires_at is not None:
                remaining = state.expires_at - self.wall()
            was = started < self._protected_until
            self._protected_until = started + remaining if state.enabled else -math.inf
            if state.enabled and not was:
                self._since = started
            if not state.enabled:
                self._since = math.inf
                if call.rest:
                    self._rest_until = started + REST_S
        if call.action == "read":
            log.info(
                "task protection on: the task is %s" % ("protected" if state.enabled else "not protected"),
                extra={"fields": {"protected": state.enabled, "expires_at": state.expires_at,
                                  "drain_s": self.drain_s, "idle_s": self.idle_s, "max_s": self.max_s}},
            )  # fmt: skip
            return
        change = {"arm": "armed", "renew": "renewed", "clear": "cleared"}[call.action]
        self.changes[change] += 1
        log.info(
            "task protection %s: %s",
            change,
            call.reason,
            extra={"fields": {"change": change, "protected": state.enabled, "expires_at": state.expires_at,
                              **_fields(call)}},
        )  # fmt: skip

    def settle(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the call in flight (tests, shutdown)."""
        if self._worker is not None:
            self._worker.join(timeout)


def _fields(call: _Call) -> dict[str, object]:
    return {"reason": call.reason, **(call.evidence.fields() if call.evidence else {})}


def make(settings: Settings) -> TaskProtection | None:
    """The output ``--task-protection on`` asks for; None when off, or outside ECS (said once)."""
    if settings.task_protection != "on" or settings.once:
        return None
    uri = settings.ecs_agent_uri
    if not uri:
        log.warning(
            "--task-protection on, but ECS_AGENT_URI is not set (not an ECS task, or an agent older than 1.65): "
            "task scale-in protection stays off",
            extra={"fields": {"condition": "task_protection_off"}},
        )
        return None
    return TaskProtection(Agent(uri), settings.task_protection_drain, settings.task_protection_idle,
                          settings.task_protection_max)  # fmt: skip
