"""``--rollouts controller``: this daemon reports to the controller and follows the rollout state; it never writes it.

The controller (controller/rollouts.py) assigns the canary and control slots by task ARN, judges and writes
``<prefix>.modelsync/rollouts/<model>.json``; this daemon

- installs what the state says: the stable artifact, or, as a canary the controller named, the rollout's
  artifact pinned to its S3 version (the sha256 the state recorded, never S3's newest object);
- reports to the controller's queue (``--controller-queue-url``; controller/reports.py has the format): what S3's
  object is when it differs from the stable one (``seen``), what it serves with its Triton's cumulative counters
  (``evidence``, every :data:`EVIDENCE_EVERY` seconds while a rollout of the model is in flight), a canary's
  failed install (``load_failed``) and its Triton gone while serving the artifact (``triton_gone``);
- when the state does not parse or validate (or names no stable artifact beside its verdicts), installs from the
  stable copy the controller published (``<prefix>.modelsync/stable/<model>.json``) and never a rejected one.

A failed send is logged (once per condition) and the next tick sends again: every report is idempotent.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from triton_http import Client

from .errors import SyncError
from .evidence import ScrapeError, scrape, snapshot_to_json
from .install import Served
from .ledger import CANARY, CONTROL, Artifact, InvalidState, Ledger, State, artifact_problem
from .metrics import Recorder
from .rollout import Plan, Rollouts, _recorded, _steady, short
from .s3 import Archive
from .settings import Settings

EVIDENCE_EVERY = 5.0  # seconds between a host's reports while a rollout of its model is in flight
HINT_EVERY = 30.0  # a new object is reported again this often until the controller acts on it
GONE_READS = 2  # failed reads of Triton's metrics in a row before a canary says its Triton is gone


class Follower(Rollouts):
    """The daemon's side of a controller-decided rollout (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        recorder: Recorder,
        log: logging.Logger,
        identify: Callable[[Archive], tuple[str, str]],
        entry_models: Callable[[str], list[str]],
        send: Callable[[str], None],
        identity: str,
        cluster: str = "",
        http: Client | None = None,
    ) -> None:
        super().__init__(settings, ledger, recorder, log, identify, entry_models, lambda: None, http)
        self.host = identity  # the task ARN: the controller's participants are keyed by it
        self.cluster = cluster
        self.send = send
        self.daemon = uuid.uuid4().hex[:16]
        self.progress = EVIDENCE_EVERY
        self._served: dict[str, Served] = {}
        self._hinted: dict[tuple[str, str], float] = {}
        self._gone: dict[str, int] = {}
        self._send_lock = threading.Lock()

    # --- what to install -----------------------------------------------------------------------------------

    def plan(self, name: str, listed: Archive, current: Served | None, fresh: bool = False) -> Plan:
        with self._lock:
            known, cached = name in self._known, self._known.get(name)
        if not fresh and known and _steady(cached, listed, current):
            return Plan(listed)
        try:
            state, _ = self.ledger.read(name)
            problem = ""
            if state is not None and state.stable is None:  # the controller never writes one: a hand edit
                problem = "it names no stable artifact"
        except InvalidState as exc:
            state, problem = None, str(exc)
        except SyncError as exc:
            return Plan(None, reason=f"the rollout state cannot be read: {exc}", transient=True)
        if problem:
            return self._from_copy(name, listed, current, problem)
        self._remember(name, state)
        try:
            return self._follow(name, listed, current, state)
        except SyncError as exc:
            return Plan(None, reason=f"the rollout cannot be followed now: {exc}", transient=True)

    def _follow(self, name: str, listed: Archive, current: Served | None, state: State | None) -> Plan:
        if state is None or state.stable is None:
            if current is None:
                copied = self._from_copy(name, listed, current, "") if state is None else None
                if copied is not None and copied.install is not None:
                    return copied
                return Plan(listed, reason="the model's first artifact: installed at once (the controller records it)")
            if current.etag != listed.etag:
                self._hint(name, listed)
            self._report(name, "serving", _art(current))
            return Plan(None, reason="no stable artifact recorded yet: serving what is installed; reported to the "
                        "controller")  # fmt: skip
        stable = state.stable
        sha, version = self._identity(listed, current, state)
        if sha == stable.sha256:
            return Plan(listed, expected=_recorded(stable.sha256))
        r = state.rollout
        mine = r.participants.get(self.host) if r is not None else None
        if r is not None and mine is not None and not mine.lost and mine.role == CANARY:
            problem = artifact_problem(self.ledger.prefix, name, r.artifact)
            if problem:
                return Plan(None, reason=f"the rollout's artifact is refused: {problem}", refused=problem,
                            named=r.artifact.archive(name))  # fmt: skip
            why = f"canary of the rollout of {short(r.artifact.sha256)} (the controller's)"
            return Plan(r.artifact.archive(name), role=CANARY, reason=why, expected=_recorded(r.artifact.sha256))
        if state.rejected(sha) is not None:
            return self._to_stable(name, state, current, f"{short(sha)} was rejected")
        if r is None or r.artifact.sha256 != sha:
            seen = Archive(name, listed.key, listed.etag, listed.size, listed.last_modified, version_id=version)
            self._hint(name, seen, sha)
        role = CONTROL if mine is not None and not mine.lost and mine.role == CONTROL else ""
        return self._to_stable(name, state, current, f"{short(sha)} is the controller's to roll out", role)

    def _from_copy(self, name: str, listed: Archive, current: Served | None, problem: str) -> Plan:
        """The state is unusable (or gone): the stable copy decides; nothing rejected is ever installed. With no
        copy (the controller never decided anything for the model, so nothing was rejected) a new host installs
        S3's object, as for a model's first artifact: an unusable state never blocks new capacity."""
        if problem:
            self.conditions.set(f"rollout-state-{name}", f"rollout of {name}: the state is unusable ({problem}); "
                                "following the controller's stable copy", model=name)  # fmt: skip
        try:
            copy = self.ledger.read_copy(name)
        except SyncError as exc:
            return Plan(None, reason=f"the rollout state and its stable copy cannot be used: {exc}", transient=True)
        if copy is None:
            if current is None and problem:
                return Plan(listed, reason="the rollout state is unusable and there is no stable copy (nothing was "
                            "ever decided): S3's object installed, as a first artifact")  # fmt: skip
            return Plan(None, reason="the rollout state is unusable and there is no stable copy: kept", transient=True)
        state = State(name, copy.stable)
        return self._to_stable(name, state, current, "the rollout state is unusable" if problem else "no rollout "
                               "state: the controller's stable copy")  # fmt: skip

    # --- after the install ---------------------------------------------------------------------------------

    def settled(self, name: str, plan: Plan, served: Served, installed: bool) -> None:
        before = self._served.get(name)
        self._served[name] = served
        if installed or before is None or before.sha256 != served.sha256:
            self._report(name, "serving", _art(served))
        if plan.left and installed:
            try:
                self._rolled_back(name, plan, served)
            except SyncError as exc:
                self.log.warning("rollout of %s: %s", name, exc)

    def failed(self, name: str, plan: Plan, target: Archive, error: SyncError) -> None:
        if plan.role != CANARY or error.transient:
            return
        self._report(name, "load_failed", Artifact(plan.expected, target.key, target.etag, target.version_id),
                     reason=str(error)[:1000])  # fmt: skip

    def observe(self, names: list[str]) -> None:
        """No same-host baseline here: the controller's controls are the baseline."""

    # --- the tick -------------------------------------------------------------------------------------------

    def tick(self) -> list[str]:
        """Every few seconds, for each model with a rollout in flight: read the state, report what this host
        serves with its counters (or that its Triton is gone). Returns those models: the caller reconciles them
        (a canary slot may have been assigned, a verdict written)."""
        with self._lock:
            names = sorted(n for n, s in self._known.items() if s is not None and s.rollout is not None)
        for name in names:
            try:
                state, _ = self.ledger.read(name)
            except SyncError as exc:
                self.conditions.set(f"rollout-tick-{name}", f"rollout of {name}: {exc}; retrying", model=name)
                continue
            self.conditions.set(f"rollout-tick-{name}", None)
            self._remember(name, state)
            served = self._served.get(name)
            if state is None or state.rollout is None or served is None:
                continue
            r = state.rollout
            mine = r.participants.get(self.host)
            try:
                snap = scrape(self.http, self.settings.triton_metrics_url, set(self._entries(name)))
            except ScrapeError as exc:
                gone = self._gone[name] = self._gone.get(name, 0) + 1
                canary = mine is not None and not mine.lost and mine.role == CANARY
                if canary and served.sha256 == r.artifact.sha256 and gone >= GONE_READS:
                    self._report(name, "triton_gone", _art(served), reason=str(exc)[:500])
                continue
            self._gone.pop(name, None)
            self._report(name, "evidence", _art(served), counters=snapshot_to_json(snap))
        return names

    # --- reports ----------------------------------------------------------------------------------------------

    def _hint(self, name: str, listed: Archive, sha: str = "") -> None:
        key = (name, listed.etag)
        now = time.monotonic()
        if now - self._hinted.get(key, -HINT_EVERY) < HINT_EVERY:
            return
        self._hinted[key] = now
        self._report(name, "seen", Artifact(sha or "unknown", listed.key, listed.etag, listed.version_id))
        served = self._served.get(name)
        if served is not None:
            self._report(name, "serving", _art(served))

    def _report(self, name: str, event: str, art: Artifact, reason: str = "", counters: Any = None) -> None:
        doc: dict[str, Any] = {
            "type": "rollout", "version": 1, "cluster": self.cluster, "task_arn": self.host, "daemon": self.daemon,
            "model": name, "event": event, "artifact": art.to_json(), "observed_at": round(time.time(), 3),
        }  # fmt: skip
        if reason:
            doc["reason"] = reason
        if counters:
            doc["counters"] = counters
        try:
            with self._send_lock:
                self.send(json.dumps(doc, separators=(",", ":")))
            self.conditions.set("rollout-report", None)
        except Exception as exc:  # the next tick reports again
            self.conditions.set("rollout-report", f"rollouts: cannot report to the controller: {exc}")


def _art(served: Served) -> Artifact:
    return Artifact(served.sha256, served.key, served.etag, served.version_id)


def sqs_sender(client: Any, queue_url: str) -> Callable[[str], None]:
    def send(body: str) -> None:
        client.send_message(QueueUrl=queue_url, MessageBody=body)

    return send
