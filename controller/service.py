"""One pass of the controller: read the state, read the queue, check and take each report, move the drains
on, write the state, emit the pass's metrics. ``run`` repeats it until told to stop.

Order matters for "never worse when a call fails": a refused or malformed message is deleted at once (it
will never pass); an accepted one only after the state that records it is written, so a failed or
conflicting write leaves it in the queue to be read again (taking it again is idempotent). A pass that
cannot read the state decides nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from telemetry.logs import Throttled
from telemetry.shapes import Malformed

from .drains import Bounds, Drains
from .fanout import FanoutPass, ServiceFanout, ServiceTask
from .fleet import Fleet, FleetError
from .inbox import Inbox, Message
from .metrics import Counts, Recorder
from .reports import kind, parse, parse_operator, parse_rollout
from .rollouts import Refused as RolloutRefused
from .rollouts import RolloutDecider
from .state import Conflict, State, Store, StoreError
from .verify import Refused, check

log = logging.getLogger("controller")
MAX_BATCHES = 50  # receives of 10 messages in one pass at most: the rollouts' reports keep the queue busy


@dataclass
class Pass:
    """What one pass did (tests read it)."""

    received: int = 0
    refused: int = 0
    kept: int = 0  # left in the queue for later (a failing AWS call, an unwritten state)
    metrics: dict[str, float] | None = None
    fanout: FanoutPass | None = None


class Controller:
    def __init__(
        self,
        cluster: str,
        inbox: Inbox,
        fleet: Fleet,
        store: Store,
        recorder: Recorder,
        bounds: Bounds,
        clock: Callable[[], float] = time.time,
        fanout: ServiceFanout | None = None,
        rollouts: RolloutDecider | None = None,
        counts: Counts | None = None,
    ) -> None:
        self.cluster = cluster
        self.fanout = fanout  # the fan-out's queues and the fleet's size: independent of the drains' state
        self.fanout_gauges = (0, 0)  # (the service's tasks, queues listed), as of the last pass that read them
        self.rollouts = rollouts  # --rollouts on: the fleet's rollouts are decided here (controller/rollouts.py)
        self.inbox = inbox
        self.fleet = fleet
        self.store = store
        self.recorder = recorder
        self.clock = clock
        self.counts = counts if counts is not None else Counts()  # shared with the rollouts' decider
        self.drains = Drains(fleet, bounds, self.counts, cluster)
        self.refusals = Throttled(log, every=60.0, clock=clock)
        self.paused = False

    def load(self, now: float) -> tuple[State, str] | None:
        try:
            data, version = self.store.load()
        except StoreError as exc:
            self.counts.state_failures += 1
            log.error("cannot read the state: %s; no decision this pass", exc)
            return None
        if data is None:
            return State(), version
        try:
            return State.from_json(data), version
        except Malformed as exc:
            self.counts.state_failures += 1
            reason = f"the state at {self.store.where} did not validate ({exc}); resume starts afresh"
            log.error("GPU drains paused: %s", reason)
            return State(paused={"since": now, "reason": reason}), version

    def run_once(self, wait: float = 0.0) -> Pass:
        out = Pass()
        out.fanout = self._fan_out()  # first: a new task's queue is made before the queue's long poll waits
        now = self.clock()
        loaded = self.load(now)
        if loaded is None:
            out.metrics = self._emit(None)
            return out
        state, version = loaded
        messages = self._receive(wait)
        out.received = len(messages)
        now = self.clock()
        refused: list[Message] = []
        accepted: list[Message] = []
        absorbed: list[Message] = []  # rollout reports: in the decider's memory once taken (idempotent, repeated)
        live = out.fanout.live if out.fanout is not None else None
        for message in messages:
            verdict = self.handle(state, message, now, live)
            if verdict == "refused":
                refused.append(message)
            elif verdict == "taken":
                accepted.append(message)
            elif verdict == "absorbed":
                absorbed.append(message)
            else:
                out.kept += 1
        out.refused = len(refused)
        self._delete(refused + absorbed)
        if self.rollouts is not None:
            try:
                self.rollouts.run(live, out.fanout.running if out.fanout is not None else None)
            except Exception:  # a bug in the rollouts never stops the drains' decisions
                log.exception("unexpected error in the rollouts' pass")
        self.drains.tick(state, now)
        try:
            self.store.save(state.to_json(), version)
        except (Conflict, StoreError) as exc:
            self.counts.state_failures += 1
            out.kept += len(accepted)
            log.error("cannot write the state: %s; its reports are read again on a later pass", exc)
        else:
            self._delete(accepted)
        out.metrics = self._emit(state)
        return out

    def _fan_out(self) -> FanoutPass | None:
        """The fan-out's pass (controller/fanout.py); a bug in it never stops the drains' decisions."""
        if self.fanout is None:
            return None
        try:
            done = self.fanout.run()
        except Exception:
            log.exception("unexpected error in the fan-out's pass")
            self.counts.fanout_failures += 1
            return None
        self.counts.fanout_created += len(done.created)
        self.counts.fanout_deleted += len(done.deleted)
        self.counts.fanout_failures += done.failures
        if done.tasks is not None:
            self.fanout_gauges = (done.tasks, done.queues)
        return done

    def _receive(self, wait: float) -> list[Message]:
        """The queue's messages: a long poll for the first batch, then what is waiting, up to MAX_BATCHES."""
        out: list[Message] = []
        for i in range(MAX_BATCHES if self.rollouts is not None else 1):
            try:
                got = self.inbox.receive(wait if i == 0 else 0.0)
            except FleetError as exc:
                log.error("cannot read the queue: %s", exc)
                break
            out += got
            if len(got) < 10:
                break
        return out

    def _rollout(self, message: Message, live: dict[str, ServiceTask] | None) -> str:
        assert self.rollouts is not None
        try:
            verdict = self.rollouts.take(parse_rollout(message.body), message.sender_id, live)
        except Malformed as exc:
            self.counts.rollout_reports_refused += 1
            self._refuse(message, "shape", f"not a rollout report: {exc}", count=False)
            return "refused"
        except RolloutRefused as exc:
            self.counts.rollout_reports_refused += 1
            self._refuse(message, exc.check, exc.message, count=False)
            return "refused"
        return "absorbed" if verdict == "taken" else "kept"

    def _operator(self, message: Message) -> str:
        """An operator's promote or reject (the decider applies, logs, counts and answers it)."""
        assert self.rollouts is not None
        try:
            req = parse_operator(message.body)
        except Malformed as exc:
            self.counts.rollout_operator_refused += 1
            self._refuse(message, "shape", f"not an operator command: {exc}", count=False)
            return "refused"
        done = self.rollouts.operate(req, message.sender_id)
        return "kept" if done == "kept" else "absorbed"

    def handle(self, state: State, message: Message, now: float, live: dict[str, ServiceTask] | None = None) -> str:
        """``taken``, ``absorbed`` (a rollout report), ``refused`` or ``kept`` (read again later)."""
        try:
            what = kind(message.body) if self.rollouts is not None else ""
            if what == "rollout":
                return self._rollout(message, live)
            if what == "operator":
                return self._operator(message)
            report = parse(message.body)
            checked = check(report, message.sender_id, self.fleet, self.cluster)
            self.drains.report(state, checked, now)
        except Malformed as exc:
            self._refuse(message, "shape", f"not a GPU fault report: {exc}")
            return "refused"
        except Refused as exc:
            self._refuse(message, exc.check, exc.message)
            return "refused"
        except FleetError as exc:
            self.counts.drain_failures += 1
            log.error("cannot check a report now: %s; it stays in the queue", exc, extra={"fields": {"call": exc.call}})
            return "kept"
        return "taken"

    def _refuse(self, message: Message, check_name: str, why: str, count: bool = True) -> None:
        if count:
            self.counts.reports_refused += 1
        self.refusals.log(
            f"refused:{check_name}",
            logging.WARNING,
            f"report refused ({check_name}): {why}",
            check=check_name,
            message_id=message.id,
            sender_id=message.sender_id,
        )

    def _delete(self, messages: list[Message]) -> None:
        if not messages:
            return
        try:
            self.inbox.delete(messages)
        except FleetError as exc:
            log.error("cannot delete handled messages: %s (they come back; taking them again changes nothing)", exc)

    def _emit(self, state: State | None) -> dict[str, float]:
        paused = state.paused is not None if state is not None else self.paused
        self.paused = paused
        entries = list(state.entries.values()) if state is not None else []
        busy = sum(1 for e in entries if e.holds_a_slot())
        try:
            fanout = self.fanout_gauges if self.fanout is not None else None
            rollouts = len(self.rollouts.in_flight) if self.rollouts is not None else None
            return self.recorder.emit(self.counts.take(), paused, busy, len(entries) - busy, fanout, rollouts)
        except Exception as exc:  # a sink that fails must not stop decisions
            log.error("cannot emit the controller's metrics: %s: %s", type(exc).__name__, exc)
            return {}

    def run(self, interval: float, stop: threading.Event) -> None:
        """Pass after pass until ``stop`` is set; the queue's long poll waits up to ``interval`` seconds."""
        while not stop.is_set():
            started = self.clock()
            try:
                self.run_once(wait=interval)
            except Exception:  # a bug must not end the service: logged, and the next pass tries again
                log.exception("unexpected error in a pass")
            stop.wait(max(0.0, interval - (self.clock() - started)) if interval else 0.0)
