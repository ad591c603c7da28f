"""Safe rollouts: a new artifact goes to a canary share of the hosts first, and to the others only on evidence.

With ``--canary-fraction F`` > 0, every daemon asks :meth:`Rollouts.plan` what to install before it installs
anything, and the answer comes from the model's state in the bucket (modelsync/ledger.py):

- the **stable** artifact is what the fleet serves; a model no host serves yet has none, and its first
  artifact goes everywhere at once (there is nothing to roll back to);
- a new artifact in S3 starts a **rollout**: the first host serving the stable artifact to see it becomes
  its first canary, and ``ceil(F x live hosts)`` hosts in all (at least one) claim a canary slot, each by a
  compare-and-swap on the state; as many more hosts still on the stable artifact claim a **control** slot:
  they measure the stable artifact over the same window. Every other host keeps serving the stable
  artifact, and a host that joins (nothing installed) installs the stable artifact, never the canary's;
- each canary installs the new artifact (the usual install: download, verify, switch, load, no failed
  request) and **bakes** it for ``--bake-seconds``; a thread of each participating daemon reads its own
  Triton's ``/metrics`` every few seconds and writes its window into the state (evidence.py);
- when every live canary has baked, a canary **judges** (evidence.judge): promoted, rejected, or waiting
  for evidence (fewer than ``--bake-min-requests`` on the canaries: silence never promotes). The verdict is
  one compare-and-swap: two canaries deciding at once cannot both win;
- **promoted**: the state's stable artifact becomes the new one; its write is an object event, so every
  daemon reconciles the model within seconds (and the hosts waiting also read the state every few
  seconds) and installs it like any update. **Rejected**: the canaries install the stable artifact again,
  pinned to its S3 version (a versioned bucket is required); no other host ever installs the rejected one,
  and it stays rejected (by sha256, in the bucket: across restarts) until a different artifact is uploaded
  or an operator promotes it (``python -m modelsync rollout promote``);
- a canary whose daemon stops refreshing its entry (killed, its host gone, its Triton down so no evidence)
  for :func:`stale_after` is **lost**: its slot goes to another host on the stable artifact, which bakes
  afresh; nothing is promoted on a lost canary's evidence. A newer upload during a bake **supersedes** the
  rollout: the newest wins, the same canaries take it and bake again.

Every time is S3's (the ledger's clock): hosts' clocks never meet. Failures of the ledger's own calls
never make things worse: the host keeps serving what it serves and tries again (a host with nothing
installed waits).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from telemetry.logs import Conditions
from triton_http import Client

from .errors import SyncError
from .evidence import (
    PROMOTE,
    REJECT,
    Judgement,
    ScrapeError,
    Snapshot,
    Thresholds,
    Window,
    client,
    judge,
    scrape,
    window,
)
from .install import Served
from .ledger import (
    CANARY,
    CONTROL,
    PROMOTED,
    REJECTED,
    SUPERSEDED,
    Artifact,
    Conflict,
    Ledger,
    Participant,
    Rollout,
    State,
    Verdict,
    artifact_problem,
    record_artifact,
)
from .metrics import Recorder
from .s3 import Archive, valid_hash
from .settings import Settings

CAS_TRIES = 5  # compare-and-swap rounds before a decision is left to the next reconcile
MIN_BEFORE = 10.0  # seconds of the previous artifact's counters needed for a same-host baseline
WAIT_LOG_EVERY = 300.0  # a rollout waiting for evidence says so again this often
MAX_LOST = 20  # lost participants kept in the state (the oldest go)


def progress_every(bake: float) -> float:
    """How often a participant reads its Triton and writes its window (and non-participants read the state)."""
    return min(30.0, max(1.0, bake / 5.0))


def stale_after(bake: float) -> float:
    """A participant silent for this long (S3 time) is lost: three missed refreshes and some slack."""
    return 3.0 * progress_every(bake) + 10.0


def short(sha: str) -> str:
    return sha[:12]


@dataclass(frozen=True)
class Plan:
    """What the reconcile should do with one name now."""

    install: Archive | None  # the listed object, or the stable artifact pinned to its version; None: keep
    role: str = ""  # this host's part in the rollout in flight: canary | control | ""
    reason: str = ""
    transient: bool = False  # kept because the state could not be read or written: retried
    left: str = ""  # the artifact this host goes back from (a rollback), for the log line
    first: bool = False  # the model's first artifact: record it as stable once installed
    # The sha256 the state recorded for the artifact it names (ledger.record_artifact): the install refuses an
    # object whose own metadata or bytes differ. "" : the listed object's own metadata decides, as without rollouts.
    expected: str = ""
    refused: str = ""  # why the artifact the state names may not be installed here (ledger.artifact_problem)
    named: Archive | None = None  # that artifact, when refused (for the refusal's log line)


class Rollouts:
    """One daemon's side of the rollouts of every model it serves."""

    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        recorder: Recorder,
        log: logging.Logger,
        identify: Callable[[Archive], tuple[str, str]],
        entry_models: Callable[[str], list[str]],
        live_hosts: Callable[[], int | None],
        http: Client | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        participate: bool = True,
    ) -> None:
        self.settings = settings
        self.host = settings.host
        self.ledger = ledger
        self.recorder = recorder
        self.log = log
        self.identify = identify  # object -> (sha256 it holds, its version id): a HEAD
        self.entry_models = entry_models  # name -> the Triton models whose requests judge it
        self.live_hosts = live_hosts
        self.http = http or client()
        self.monotonic = monotonic
        self.participate = participate  # False (--once): follows the state, never starts or joins a rollout
        self.thresholds = Thresholds(
            settings.bake_seconds, settings.bake_min_requests, settings.max_failure_increase, settings.max_latency_ratio
        )
        self.progress = progress_every(settings.bake_seconds)
        # A canary's window starts this long after its new artifact is READY: the first requests of a freshly
        # loaded model (lazy initialisation, a cold cache) are not what it will serve.
        self.settle = self.progress
        self.warm = max(1, min(10, settings.bake_min_requests // 10))  # ... nor are its first few requests
        # A canary still installing after this long (a disk that stays full, S3 refusing) lets its slot go.
        self.install_deadline = max(900.0, 2 * settings.bake_seconds)
        self.stale = stale_after(settings.bake_seconds)
        self.conditions = Conditions(log)
        self._lock = threading.Lock()
        self._known: dict[str, State | None] = {}  # model -> its state as last read (None: there is none)
        self._recent: dict[str, tuple[float, Snapshot]] = {}  # model -> (monotonic, its counters then)
        self._waiting_logged: dict[str, float] = {}
        self._unversioned: set[str] = set()

    # --- the reconcile's questions -------------------------------------------------------------------------

    def plan(self, name: str, listed: Archive, current: Served | None, fresh: bool = False) -> Plan:
        """What to install for ``name``, whose object in S3 is ``listed``. Reads the state only when something
        may have to change (``fresh``: an event or a rollout tick named the model)."""
        with self._lock:
            known, cached = name in self._known, self._known.get(name)
        if not fresh and known and _steady(cached, listed, current):
            return Plan(listed)
        for _ in range(CAS_TRIES):
            try:
                state, etag = self.ledger.read(name)
                self._remember(name, state)
                return self._decide(name, listed, current, state, etag)
            except Conflict:
                continue
            except SyncError as exc:
                return Plan(None, reason=f"the rollout state cannot be used: {exc}", transient=True)
        return Plan(
            None, reason="the rollout state kept changing under this host; tried again next time", transient=True
        )

    def settled(self, name: str, plan: Plan, served: Served, installed: bool) -> None:
        """The reconcile carried ``plan`` out and Triton serves ``served`` (``installed``: it switched now)."""
        try:
            if plan.first and installed:
                self._first(name, served)
            if plan.role == CANARY:
                self._canary_serving(name, served)
            if plan.left and installed:
                self._rolled_back(name, plan, served)
        except (SyncError, ScrapeError) as exc:
            self.log.warning("rollout of %s: %s; tried again at the next reconcile", name, exc,
                             extra={"fields": {"model": name}})  # fmt: skip

    def failed(self, name: str, plan: Plan, target: Archive, error: SyncError) -> None:
        """A canary could not install the new artifact for a reason of the artifact's own: that rejects it."""
        if plan.role != CANARY or error.transient:
            return
        reason = f"it failed to install on canary {self.host}: {error}"
        for _ in range(CAS_TRIES):
            try:
                state, etag = self.ledger.read(name)
                if state is None or state.rollout is None or state.rollout.artifact.etag != target.etag:
                    return
                new = state.copy()
                r = new.rollout
                assert r is not None
                self._conclude(new, REJECTED, reason, {"install_error": str(error)[:1000]})
                self._write(new, etag)
                self._decision(name, "rejected", r, reason, {"install_error": str(error)[:1000]},
                               {"RolloutsRejected": 1.0}, logging.WARNING)  # fmt: skip
                return
            except Conflict:
                continue
            except SyncError as exc:
                self.log.warning("rollout of %s: cannot record the rejection: %s", name, exc)
                return

    def observe(self, names: list[str]) -> None:
        """After a full pass: the served models' counters, for the same-host baseline of a future canary."""
        models = {m: n for n in names for m in self._entries(n)}
        if not models:
            return
        try:
            snap = scrape(self.http, self.settings.triton_metrics_url, set(models))
        except ScrapeError as exc:
            self.conditions.set("rollout-metrics", f"rollouts: cannot read Triton's metrics: {exc}")
            return
        self.conditions.set("rollout-metrics", None)
        now = self.monotonic()
        by_name: dict[str, Snapshot] = {}
        for key, sample in snap.items():
            by_name.setdefault(models[key[0]], {})[key] = sample
        with self._lock:
            for name in names:
                self._recent[name] = (now, by_name.get(name, {}))

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for s in self._known.values() if s is not None and s.rollout is not None)

    # --- the tick: evidence, lost participants, the verdict ------------------------------------------------

    def tick(self) -> list[str]:
        """Every :func:`progress_every` seconds: refresh this host's windows, mark silent participants lost,
        judge what has baked. Returns the models with a rollout in flight or just decided: the caller
        reconciles them (a host may now claim a slot, install a promoted artifact or roll back)."""
        with self._lock:
            names = sorted(n for n, s in self._known.items() if s is not None and s.rollout is not None)
        for name in names:
            try:
                self._tick_one(name)
                self.conditions.set(f"rollout-tick-{name}", None)
            except SyncError as exc:
                self.conditions.set(f"rollout-tick-{name}", f"rollout of {name}: {exc}; retrying", model=name)
        return names

    def _tick_one(self, name: str) -> None:
        for _ in range(CAS_TRIES):
            state, etag = self.ledger.read(name)
            self._remember(name, state)
            if state is None or state.rollout is None:
                return
            now = self.ledger.now()
            new = state.copy()
            r = new.rollout
            assert r is not None
            changed = False
            me = r.participants.get(self.host)
            baking = me is not None and me.since is None
            if me is not None and not me.lost:
                changed = self._refresh(name, me, now)
            baking = baking and me is not None and me.since is not None
            lost = [p for p in r.participants.values() if not p.lost and p.host != self.host
                    and now - p.seen > self.stale]  # fmt: skip
            if me is not None and not me.lost and me.ready is None and now - me.claimed > self.install_deadline:
                lost.append(me)  # a canary that cannot install it: its slot goes to another host
            for p in lost:
                p.lost = changed = True
            gone = sorted((p for p in r.participants.values() if p.lost), key=lambda p: p.seen)
            for p in gone[: max(0, len(gone) - MAX_LOST)]:  # the state stays small whatever happens
                del r.participants[p.host]
            judged = self._judge(name, new, now) if me is not None and me.role == CANARY and not me.lost else None
            if judged is not None and judged.verdict in (PROMOTE, REJECT):
                verdict = PROMOTED if judged.verdict == PROMOTE else REJECTED
                self._conclude(new, verdict, judged.reason, judged.evidence)
                changed = True
            elif judged is not None and r.waiting_since is None:
                r.waiting_since = now
                changed = True
            if not changed:
                return
            try:
                self._write(new, etag)
            except Conflict:
                continue
            if baking:
                self._decision(name, "baking", r, f"canary {self.host} serves {short(r.artifact.sha256)}; the verdict "
                               f"comes after {self.thresholds.bake_seconds:g} s", {}, {})  # fmt: skip
            for p in lost:
                why = (
                    f"canary {p.host} could not install it within {self.install_deadline:.0f} s"
                    if p is me
                    else f"{p.role} {p.host} silent for {now - p.seen:.0f} s (over {self.stale:.0f} s)"
                )
                self._decision(name, "participant lost", r, f"{why}: its slot is free", {}, {}, logging.WARNING)
            if judged is not None:
                self._after_judgement(name, r, judged, now)
            return

    def _refresh(self, name: str, me: Participant, now: float) -> bool:
        """This host's entry: alive, and its window so far (no refresh when its Triton cannot be read: a
        participant without evidence lets its slot go)."""
        if me.since is None and (me.ready is None or now - me.ready < self.settle):  # installing, or settling
            me.seen = now
            return True
        try:
            snap = scrape(self.http, self.settings.triton_metrics_url, set(self._entries(name)))
        except ScrapeError as exc:
            self.conditions.set("rollout-metrics", f"rollouts: cannot read Triton's metrics: {exc}", model=name)
            return False
        self.conditions.set("rollout-metrics", None)
        me.seen = now
        if me.since is None:  # settled, and warm once it served its first requests: the window starts now
            if window(me.start, snap).requests >= self.warm:
                me.since, me.start, me.window = now, snap, Window()
            return True
        me.window = window(me.start, snap)
        return True

    def _judge(self, name: str, new: State, now: float) -> Judgement | None:
        """Once every live canary has baked (from its window's start; from its READY while no request has
        warmed it up): the verdict. A canary still cold by then has no window: that is no evidence, WAIT."""
        r = new.rollout
        assert r is not None
        canaries = r.live(CANARY)
        if not canaries or any(p.ready is None for p in canaries):
            return None
        starts = [p.since if p.since is not None else (p.ready or 0.0) + self.settle for p in canaries]
        baked = now - max(starts)  # the youngest canary's bake
        if baked < self.thresholds.bake_seconds:
            return None
        canary = _total(p.window for p in canaries)
        controls = [p for p in r.live(CONTROL) if p.window is not None]
        baselines = [
            (f"the hosts on the previous artifact over the same window ({', '.join(p.host for p in controls)})",
             _total(p.window for p in controls)),
            ("the previous artifact on the canary hosts before the switch", _total(p.before for p in canaries)),
        ]  # fmt: skip
        result = judge(canary, baselines, self.thresholds, baked)
        result.evidence["canaries"] = sorted(p.host for p in canaries)
        result.evidence["controls"] = sorted(p.host for p in controls)
        return result

    def _after_judgement(self, name: str, r: Rollout, judged: Judgement, now: float) -> None:
        if judged.verdict == PROMOTE:
            self._decision(name, "promoted", r, judged.reason, judged.evidence, {"RolloutsPromoted": 1.0})
        elif judged.verdict == REJECT:
            self._decision(name, "rejected", r, judged.reason, judged.evidence, {"RolloutsRejected": 1.0},
                           logging.WARNING)  # fmt: skip
        else:
            canaries = r.live(CANARY)
            waited = now - (max(p.since or 0.0 for p in canaries) + self.thresholds.bake_seconds)
            self.recorder.rollout(name, {"RolloutEvidenceWait": round(max(0.0, waited), 3)},
                                  self._props(r, "waiting for evidence", judged.reason, judged.evidence))  # fmt: skip
            last = self._waiting_logged.get(name)
            if last is None or self.monotonic() - last >= WAIT_LOG_EVERY:
                self._waiting_logged[name] = self.monotonic()
                self._decision(name, "waiting for evidence", r, judged.reason, judged.evidence, {}, logging.WARNING)

    def _conclude(self, new: State, verdict: str, reason: str, evidence: dict[str, Any]) -> None:
        r = new.rollout
        assert r is not None
        new.add(Verdict(r.artifact.sha256, verdict, self.ledger.now(), self.host, reason, evidence))
        if verdict == PROMOTED:
            new.stable = r.artifact
        new.rollout = None

    # --- deciding what to install --------------------------------------------------------------------------

    def _decide(self, name: str, listed: Archive, current: Served | None, state: State | None, etag: str) -> Plan:
        now = self.ledger.now()
        cur = current.sha256 if current else ""
        sha, version = self._identity(listed, current, state)
        if state is None:
            if current is None:
                return Plan(listed, first=True, reason="the model's first artifact: installed on every host at once")
            state = State(name, self._record(name, cur, current.key, current.etag, current.version_id))
            if sha == cur:  # the fleet's artifact, seen for the first time with rollouts on: record it
                self._write(state, "")
                return Plan(listed)
        if state.stable is None:
            return Plan(listed, first=True, reason="no artifact is stable yet: installed on every host at once")
        stable = state.stable
        if sha == stable.sha256:
            ended = state.rollout
            if ended is not None:  # the stable artifact is back in S3: the rollout in flight is over
                back = state.copy()
                back.add(Verdict(ended.artifact.sha256, SUPERSEDED, now, self.host, "the previous artifact was "
                                 "uploaded again during the bake"))  # fmt: skip
                back.rollout = None
                self._write(back, etag)
                self._decision(name, "superseded", ended, "the previous artifact was uploaded again", {}, {})
            return Plan(listed, expected=_recorded(stable.sha256))
        rejected = state.rejected(sha)
        if rejected is not None:
            why = f"{short(sha)} was rejected ({rejected.reason}); the previous artifact serves"
            return self._to_stable(name, state, current, why)
        new = state.copy()
        r = new.rollout
        if r is not None and r.artifact.sha256 != sha:  # a newer upload during the bake: the newest wins
            old = r
            carried = {
                h: Participant(h, CANARY, now, now, before=p.before) for h, p in old.participants.items()
                if p.role == CANARY and not p.lost
            }  # fmt: skip
            r = new.rollout = Rollout(self._record(name, sha, listed.key, listed.etag, version), stable, now,
                                      self.host, old.wanted, old.live_hosts, carried)  # fmt: skip
            new.add(Verdict(old.artifact.sha256, SUPERSEDED, now, self.host,
                            f"replaced by a newer upload, {short(sha)}, during its bake"))  # fmt: skip
            etag = self._write(new, etag)
            self._decision(name, "superseded", old, f"replaced by a newer upload, {short(sha)}", {}, {})
        if r is None:
            if current is None or cur not in (stable.sha256, sha) or not self.participate:
                return self._to_stable(name, new, current, f"{short(sha)} is not rolled out yet")
            if not stable.version_id:
                return self._without_versions(name, listed)
            live = self.live_hosts()
            if live is None and self.settings.fanout == "controller":  # never sized on a guess (FleetHosts)
                return self._to_stable(name, new, current, f"{short(sha)} waits: the number of live hosts is unknown")
            wanted = max(1, math.ceil(self.settings.canary_fraction * live)) if live else 1
            me = Participant(self.host, CANARY, now, now, before=self._before(name))
            r = new.rollout = Rollout(self._record(name, sha, listed.key, listed.etag, version), stable, now,
                                      self.host, wanted, live or 0, {self.host: me})  # fmt: skip
            self._write(new, etag)
            self._decision(name, "started", r, f"{short(sha)} goes to {wanted} canary host(s) of {live or '?'} live "
                           f"first; this host is one", {}, {"RolloutsStarted": 1.0})  # fmt: skip
            return self._canary(listed, r)
        mine = r.participants.get(self.host)
        if mine is not None and not mine.lost:
            if mine.role == CANARY:
                return self._canary(listed, r)
            return self._to_stable(name, new, current, f"control of the rollout of {short(sha)}", role=CONTROL)
        if current is not None and cur == stable.sha256 and self.participate:
            if len(r.live(CANARY)) < r.wanted:
                r.participants[self.host] = Participant(self.host, CANARY, now, now, before=self._before(name))
                self._write(new, etag)
                self._decision(name, "canary claimed", r, f"{self.host} takes a canary slot", {}, {})
                return self._canary(listed, r)
            if len(r.live(CONTROL)) < r.wanted:
                try:
                    start = scrape(self.http, self.settings.triton_metrics_url, set(self._entries(name)))
                except ScrapeError:
                    start = None
                if start is not None:
                    r.participants[self.host] = Participant(self.host, CONTROL, now, now, since=now, start=start)
                    self._write(new, etag)
                    return self._to_stable(name, new, current, f"control of the rollout of {short(sha)}", CONTROL)
        return self._to_stable(name, new, current, f"the rollout of {short(sha)} is in flight on "
                               f"{', '.join(p.host for p in r.live(CANARY)) or 'no host yet'}")  # fmt: skip

    def _to_stable(self, name: str, state: State, current: Served | None, reason: str, role: str = "") -> Plan:
        """Serve the stable artifact: keep it when it is served, else install it pinned to its version."""
        stable = state.stable
        assert stable is not None
        if current is not None and current.sha256 == stable.sha256:
            return Plan(None, role=role, reason=f"{reason}: serving the stable artifact {short(stable.sha256)}")
        if not stable.version_id:
            return Plan(None, reason=f"{reason}, and the stable artifact {short(stable.sha256)} has no S3 version id "
                        "(an unversioned bucket): it cannot be fetched")  # fmt: skip
        problem = artifact_problem(self.ledger.prefix, name, stable)
        if problem:  # a state written by someone else than a daemon or the operator's CLI: nothing is installed
            return Plan(None, role=role, reason=f"{reason}; the stable artifact is refused: {problem}", refused=problem,
                        named=stable.archive(name))  # fmt: skip
        return Plan(stable.archive(name), role=role, reason=f"{reason}: installing the stable artifact "
                    f"{short(stable.sha256)}", left=current.sha256 if current else "",
                    expected=_recorded(stable.sha256))  # fmt: skip

    def _canary(self, listed: Archive, r: Rollout) -> Plan:
        """Install S3's object (the model's own key) as a canary: its bytes must be what the rollout recorded."""
        return Plan(listed, role=CANARY, reason=f"canary of the rollout of {short(r.artifact.sha256)}",
                    expected=_recorded(r.artifact.sha256))  # fmt: skip

    def _record(self, name: str, sha: str, key: str, etag: str, version_id: str) -> Artifact:
        return record_artifact(self.ledger.prefix, name, sha, key, etag, version_id)

    def _without_versions(self, name: str, listed: Archive) -> Plan:
        if name not in self._unversioned:
            self._unversioned.add(name)
            self.log.error(
                "rollout of %s: the stable artifact has no S3 version id (the bucket is not versioned), so a "
                "rejected artifact could not be taken back: installing %s on every host at once, as without "
                "--canary-fraction. Turn versioning on for the bucket.",
                name, listed.key, extra={"fields": {"model": name, "key": listed.key}},
            )  # fmt: skip
        return Plan(listed)

    def _identity(self, listed: Archive, current: Served | None, state: State | None) -> tuple[str, str]:
        """(sha256, version id) of the listed object: known from what is served or the state, else a HEAD."""
        if current is not None and current.etag == listed.etag:
            return current.sha256, current.version_id
        if state is not None:
            for a in (state.stable, state.rollout.artifact if state.rollout else None):
                if a is not None and a.etag == listed.etag and a.key == listed.key:
                    return a.sha256, a.version_id
        return self.identify(listed)

    def _before(self, name: str) -> Window | None:
        """The previous artifact's window on this host: from the last full pass's counters to now."""
        with self._lock:
            seen = self._recent.get(name)
        if seen is None or self.monotonic() - seen[0] < MIN_BEFORE:
            return None
        try:
            now = scrape(self.http, self.settings.triton_metrics_url, set(self._entries(name)))
        except ScrapeError:
            return None
        return window(seen[1], now)

    def _entries(self, name: str) -> list[str]:
        try:
            return self.entry_models(name) or [name]
        except Exception:
            return [name]

    # --- after the install ---------------------------------------------------------------------------------

    def _first(self, name: str, served: Served) -> None:
        state = State(name, self._record(name, served.sha256, served.key, served.etag, served.version_id))
        with contextlib.suppress(Conflict):  # another host recorded it first
            self._write(state, "")

    def _canary_serving(self, name: str, served: Served) -> None:
        """Record that this canary's new artifact is READY (once: a restart keeps it); its window starts at the
        first tick after :attr:`settle`."""
        with self._lock:
            cached = self._known.get(name)
        if cached is not None and cached.rollout is not None:
            mine = cached.rollout.participants.get(self.host)
            if mine is not None and mine.ready is not None and cached.rollout.artifact.sha256 == served.sha256:
                return
        for _ in range(CAS_TRIES):
            state, etag = self.ledger.read(name)
            self._remember(name, state)
            r = state.rollout if state is not None else None
            if state is None or r is None or r.artifact.sha256 != served.sha256:
                return
            me = r.participants.get(self.host)
            if me is None or me.lost or me.role != CANARY or me.ready is not None:
                return
            new = state.copy()
            assert new.rollout is not None
            now = self.ledger.now()
            start = scrape(self.http, self.settings.triton_metrics_url, set(self._entries(name)))
            new.rollout.participants[self.host] = replace(me, ready=now, seen=now, start=start)
            try:
                self._write(new, etag)
            except Conflict:
                continue
            return

    def _rolled_back(self, name: str, plan: Plan, served: Served) -> None:
        state, _ = self.ledger.read(name)
        verdict = state.decided(plan.left) if state is not None else None
        if state is not None and verdict is None:
            verdict = next((v for v in reversed(state.verdicts) if v.sha256 == plan.left), None)
        fields: dict[str, Any] = {
            "model": name,
            "verdict": "rolled back",
            "artifact": plan.left,
            "previous": served.sha256,
            "reason": verdict.reason if verdict else plan.reason,
            "evidence": verdict.evidence if verdict else {},
        }
        self.log.warning("rollout of %s: rolled back: %s serves %s again (%s)", name, self.host, short(served.sha256),
                         fields["reason"], extra={"fields": {**fields, "host": self.host}})  # fmt: skip
        self.recorder.rollout(name, {"RolloutRollbacks": 1.0}, _clean(fields))

    # --- bookkeeping ---------------------------------------------------------------------------------------

    def _write(self, state: State, etag: str) -> str:
        new_etag = self.ledger.write(state, etag)
        self._remember(name=state.model, state=state)
        return new_etag

    def _remember(self, name: str, state: State | None) -> None:
        with self._lock:
            self._known[name] = state

    def _props(self, r: Rollout, verdict: str, reason: str, evidence: dict[str, Any]) -> dict[str, Any]:
        return _clean({
            "verdict": verdict,
            "artifact": r.artifact.sha256,
            "previous": r.previous.sha256,
            "reason": reason,
            "evidence": evidence,
            "canaries": sorted(p.host for p in r.live(CANARY)),
            "wanted": r.wanted,
        })  # fmt: skip

    def _decision(
        self,
        name: str,
        verdict: str,
        r: Rollout,
        reason: str,
        evidence: dict[str, Any],
        values: dict[str, float],
        level: int = logging.INFO,
    ) -> None:
        """One JSON log line per decision, with its evidence; and its metric, when it has one."""
        props = self._props(r, verdict, reason, evidence)
        self.log.log(
            level,
            "rollout of %s: %s: %s",
            name,
            verdict,
            reason,
            extra={"fields": {"model": name, "host": self.host, **props}},
        )
        if values:
            self.recorder.rollout(name, values, props)


def _steady(cached: State | None, listed: Archive, current: Served | None) -> bool:
    """Serving S3's object, which the state (as last read) calls stable, with no rollout in flight."""
    if current is None or current.etag != listed.etag:
        return False
    if cached is None:
        return True
    return cached.rollout is None and cached.stable is not None and cached.stable.sha256 == current.sha256


def _recorded(sha: str) -> str:
    """The sha256 an install must match; "" for an artifact recorded unverified (--allow-unverified)."""
    return valid_hash(sha)


def _total(windows: Any) -> Window:
    total = Window()
    for w in windows:
        if w is not None:
            total = total + w
    return total


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v not in (None, "", [], {})}
