"""Rollouts decided once, by the controller: the daemons report, the controller assigns, judges and writes.

In ``--rollouts controller`` mode (docs/modelsync.md, "Safe rollouts") the model-sync daemons never write the
rollout state: they send their reports to the controller's queue (controller/reports.py, ``type: rollout``) and
follow the state. Each pass, for every model with a report or a rollout in flight, the controller

- **checks** each report (its task must be a running task of the Triton service as ECS listed it this pass; a
  role-session sender must be that task; two live daemons with one task ARN: the second is refused and logged);
- **starts** a rollout when a daemon says S3's object differs from the stable artifact: it reads S3 itself
  (the object's own sha256 and version, :func:`modelsync.ledger.record_artifact`), sizes the canary share from
  ECS's running tasks (``ceil(--canary-fraction x running)``, at least 1), and assigns the canary and control
  slots by task ARN, canaries on distinct container instances where there are several;
- **collects** evidence tied to the artifact's sha256 (a canary's counters count only while it serves the
  rollout's artifact, a control's only while it serves the stable one), from the daemons' cumulative counters;
- **judges** with controller/rules.py: an early abort at any moment, the verdict once every canary baked;
  crashes (a canary's task stopped because its essential container exited, or its daemon saying Triton is
  gone) count, and the second rejects;
- **writes** the state with modelsync's ledger (conditional writes: an operator's write in between is read
  again), and the stable copy beside it (``<prefix>.modelsync/stable/<model>.json``) that a new host installs
  from when the state is unusable. A state that does not parse or validate, or names no stable artifact
  beside its verdicts, is reported and rewritten from that copy.

The controller's memory (the hosts' last reports) is rebuilt from the reports within seconds after a restart;
everything decided is in the bucket.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from modelsync.errors import SyncError
from modelsync.evidence import PROMOTE, REJECT, WAIT, Judgement, Sample, Snapshot, Window, window
from modelsync.ledger import (
    CANARY,
    CONTROL,
    PROMOTED,
    REJECTED,
    SUPERSEDED,
    Artifact,
    Conflict,
    InvalidState,
    Ledger,
    Participant,
    Rollout,
    State,
    Verdict,
    record_artifact,
)
from modelsync.s3 import S3

from .fanout import ServiceTask, task_id
from .fleet import FleetError, error_text
from .metrics import Counts
from .reports import OperatorRequest, RolloutReport, cluster_name
from .rules import Rules, crashed, early_abort, judge
from .verify import ROLE_SESSION

log = logging.getLogger("controller.rollouts")

BY = "controller"
CAS_TRIES = 3
IDENTITY_STALE = 60.0  # seconds a daemon holds its task ARN after its last report
STALE = 60.0  # seconds without a report before a participant is lost
OPERATOR_SKEW = 30.0  # seconds an operator's command is still applied past its expiry (the two clocks differ)
TASK_SESSION = re.compile(r"^[0-9a-f]{32}$")  # an ECS task id: the session name of every task role's session
# ECS's stop codes (Task.stopCode): TaskFailedToStart, EssentialContainerExited, UserInitiated,
# ServiceSchedulerInitiated (a scale-in, a deployment, an instance's drain), SpotInterruption, TerminationNotice.
# Only the essential container exiting by itself is a crash, and not on an instance being drained.
CRASH_STOP_CODES = frozenset({"EssentialContainerExited"})
DRAINING = "DRAINING"


def short(sha: str) -> str:
    return sha[:12]


@dataclass
class Seen:
    """What one daemon (one task) last said, in the controller's memory."""

    task_arn: str
    daemon: str
    at: float
    instance: str = ""
    serving: dict[str, Artifact] = field(default_factory=dict)  # model -> what it serves
    counters: dict[str, tuple[str, Snapshot, float]] = field(default_factory=dict)  # model -> (sha, counters, at)
    events: dict[str, list[RolloutReport]] = field(default_factory=dict)  # model -> load_failed, triton_gone


@dataclass
class Stop:
    """Why ECS stopped (or is stopping) a task (DescribeTasks); ``code`` "" while ECS is not stopping it."""

    code: str
    reason: str
    exit_codes: dict[str, int]
    instance_status: str = ""  # its container instance's status, read for a crash's stop code

    @property
    def crash(self) -> bool:
        """The essential container exited by itself, on an instance not being drained (a drain, or the GPU fault
        that drained it, is the instance's doing, not the artifact's)."""
        return self.code in CRASH_STOP_CODES and self.instance_status != DRAINING

    @property
    def by_ecs(self) -> bool:
        """ECS stops the task for its own reason (a scale-in, a deployment, a drain, a user, Spot): no crash."""
        return bool(self.code) and not self.crash


class Refused(Exception):
    def __init__(self, check: str, message: str) -> None:
        super().__init__(message)
        self.check = check
        self.message = message


class RolloutDecider:
    """The controller's side of every model's rollouts (module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        s3: S3,
        cluster: str,
        rules: Rules,
        canary_fraction: float,
        counts: Counts,
        describe_stop: Callable[[str], Stop | None],
    ) -> None:
        self.ledger = ledger
        self.s3 = s3
        self.cluster = cluster
        self.rules = rules
        self.canary_fraction = canary_fraction
        self.counts = counts
        self.describe_stop = describe_stop
        self.settle = min(10.0, rules.bake_seconds / 5)  # a fresh model's first requests are not its evidence
        self.install_deadline = max(900.0, 2 * rules.bake_seconds)
        self.hosts: dict[str, Seen] = {}  # task ARN -> its daemon's last reports
        self.hints: dict[str, Artifact] = {}  # model -> S3's object as a daemon saw it (read again here)
        self.touched: set[str] = set()
        self.in_flight: set[str] = set()
        self.started = False
        self.reporter_roles: set[str] = set()  # the role ids the daemons report under: never an operator's

    # --- reports -------------------------------------------------------------------------------------------

    def take(self, report: RolloutReport, sender_id: str, tasks: dict[str, ServiceTask] | None) -> str:
        """``taken``, ``kept`` (ECS could not be read this pass) or raises Refused."""
        if report.cluster and cluster_name(report.cluster) != cluster_name(self.cluster):
            raise Refused("cluster", f"names cluster {cluster_name(report.cluster)[:80]!r}")
        m = ROLE_SESSION.match(sender_id)
        if m and m.group("session") != report.task_id:
            raise Refused("sender", f"sent by role session {m.group('session')[:80]!r}, not task {report.task_id}")
        if m:
            self.reporter_roles.add(sender_id.split(":", 1)[0])
        if tasks is None:
            return "kept"
        task = tasks.get(report.task_id)
        if task is None or task.arn != report.task_arn:
            raise Refused("task", f"task {report.task_arn} is not a running task of the Triton service")
        now = self.ledger.now()
        seen = self.hosts.get(report.task_arn)
        if seen is not None and seen.daemon != report.daemon and now - seen.at < IDENTITY_STALE:
            raise Refused(
                "identity",
                f"two live daemons report task {report.task_arn}: {seen.daemon} (last seen {now - seen.at:.0f} s "
                f"ago) and {report.daemon}; the second is refused until the first is silent {IDENTITY_STALE:.0f} s",
            )
        if seen is None or seen.daemon != report.daemon:
            seen = self.hosts[report.task_arn] = Seen(report.task_arn, report.daemon, now)
        seen.at, seen.instance = now, task.container_instance_arn
        art = Artifact(report.sha256, report.key, report.etag, report.version_id)
        if report.event == "seen":
            self.hints[report.model] = art
        elif report.event in ("serving", "evidence"):
            seen.serving[report.model] = art
            if report.counters:
                snap = {k: Sample(*v) for k, v in report.counters.items()}
                seen.counters[report.model] = (report.sha256, snap, now)
        else:
            seen.events.setdefault(report.model, []).append(report)
        self.touched.add(report.model)
        return "taken"

    # --- an operator's command ---------------------------------------------------------------------------------

    def operate(self, req: OperatorRequest, sender_id: str) -> str:
        """An operator's promote or reject (``python -m modelsync rollout``, modelsync/rolloutcli.py): applied to
        the state under the operator's SQS identity, logged, counted and answered at
        ``<prefix>.modelsync/operator/<request>.json``. ``applied`` or ``refused`` (answered either way, the message
        is done), ``kept`` (S3 failed: the message is read again; a command already answered is not applied
        twice). A task role's session (the hosts', which run model code) is never an operator."""
        from modelsync.rolloutcli import UsageError, answer_key, apply, pick

        key = answer_key(self.ledger.prefix, req.request)
        try:
            claimed = self._claim(key)
            if claimed != "claimed":  # answered, or cancelled by the command that gave up waiting
                log.info("operator's %s of %s (request %s): already %s", req.action, req.model, req.request, claimed)
                return "applied"
            role = sender_id.split(":", 1)[0]
            m = ROLE_SESSION.match(sender_id)
            if not sender_id or role in self.reporter_roles or (m and TASK_SESSION.match(m.group("session"))):
                return self._refuse_operator(req, sender_id, key, f"sender {sender_id[:120] or 'unknown'} is an ECS "
                                             "task's role session (the hosts'), not an operator")  # fmt: skip
            now = self.ledger.now()
            if now > req.expires_at + OPERATOR_SKEW:
                return self._refuse_operator(req, sender_id, key, "it expired before the controller read it (the "
                                             "command said the controller did not answer)")  # fmt: skip
            who = f"operator {sender_id}"
            for _ in range(CAS_TRIES):
                try:
                    state, etag = self.ledger.read(req.model)
                    problem = _invalid(state)
                except InvalidState as exc:
                    state, etag, problem = None, "", str(exc)
                if problem:
                    if not self._repair(req.model, problem):
                        return self._refuse_operator(req, sender_id, key, f"the state is unusable ({problem}) and "
                                                     "there is no stable copy to repair it from")  # fmt: skip
                    continue
                if state is None or state.stable is None:
                    return self._refuse_operator(req, sender_id, key, f"{req.model} has no rollout state yet")
                try:
                    artifact = pick(req.action, state, self._in_s3(req.model), req.artifact)
                    new, reason = apply(req.action, state, artifact, now, who, req.force)
                except UsageError as exc:
                    return self._refuse_operator(req, sender_id, key, str(exc))
                evidence = {"request": req.request, "sender_id": sender_id, "claimed_by": req.claimed_by,
                            "force": req.force}  # fmt: skip
                new.verdicts[-1] = replace(new.verdicts[-1], evidence=evidence)
                try:
                    self.ledger.write(new, etag)
                except Conflict:
                    continue
                self.ledger.write_copy(new)
                if new.rollout is None:
                    self.in_flight.discard(req.model)
                verdict = PROMOTED if req.action == "promote" else REJECTED
                line = {"model": req.model, "artifact": artifact.sha256, "verdict": verdict, "by": who,
                        "reason": reason, "request": req.request}  # fmt: skip
                self._write_answer(key, {"status": "applied", "line": line})
                self.counts.rollout_operator_commands += 1
                log.warning("rollout of %s: %s by an operator (%s): %s", req.model, verdict, sender_id, reason,
                            extra={"fields": {**line, "sender_id": sender_id, "evidence": evidence,
                                              "previous": state.stable.sha256}})  # fmt: skip
                return "applied"
        except SyncError as exc:
            log.error("operator's %s of %s: %s; read again from the queue", req.action, req.model, exc)
            return "kept"
        return "kept"

    def _claim(self, key: str) -> str:
        """``claimed`` (this controller applies the command; also when a pass of its own claimed it before and
        failed midway), else the answer's status (``applied``, ``refused``, ``cancelled``: the command gave up
        waiting and wrote it first). The claim and the command's cancel are both create-only writes: one wins."""
        body = json.dumps({"status": "taking"}).encode()
        try:
            self.ledger.client.put_object(Bucket=self.ledger.bucket, Key=key, Body=body, IfNoneMatch="*",
                                          ContentType="application/json")  # fmt: skip
            return "claimed"
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code", "") not in ("PreconditionFailed", "412"):
                raise SyncError(f"cannot write s3://{self.ledger.bucket}/{key}: {error_text(exc)}") from None
        try:
            got = json.loads(self.ledger.client.get_object(Bucket=self.ledger.bucket, Key=key)["Body"].read(65536))
        except Exception as exc:
            raise SyncError(f"cannot read s3://{self.ledger.bucket}/{key}: {error_text(exc)}") from None
        status = str(got.get("status", "")) if isinstance(got, dict) else ""
        return "claimed" if status == "taking" else status or "answered"

    def _write_answer(self, key: str, doc: dict[str, Any]) -> None:
        body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        try:
            self.ledger.client.put_object(Bucket=self.ledger.bucket, Key=key, Body=body, ContentType="application/json")
        except Exception as exc:
            raise SyncError(f"cannot write s3://{self.ledger.bucket}/{key}: {error_text(exc)}") from None

    def _refuse_operator(self, req: OperatorRequest, sender_id: str, key: str, why: str) -> str:
        self.counts.rollout_operator_refused += 1
        log.warning("rollout of %s: operator's %s refused: %s", req.model, req.action, why,
                    extra={"fields": {"model": req.model, "verdict": "operator refused", "action": req.action,
                                      "sender_id": sender_id, "claimed_by": req.claimed_by,
                                      "request": req.request, "reason": why[:1000]}})  # fmt: skip
        self._write_answer(key, {"status": "refused", "reason": why[:2000]})
        return "refused"

    # --- the pass --------------------------------------------------------------------------------------------

    def run(self, tasks: dict[str, ServiceTask] | None, running: int | None) -> None:
        """Decide for every model touched by a report or with a rollout in flight (nothing while ECS is
        unknown: a rollout is never sized or judged on a guess)."""
        if not self.started:
            try:
                self.in_flight |= set(self.ledger.models())  # a restart resumes every state in the bucket
                self.started = True
            except SyncError as exc:
                log.error("rollouts: cannot list the rollout states: %s; retried next pass", exc)
        if tasks is None:
            return
        self._forget(tasks)
        models, self.touched = sorted(self.touched | self.in_flight), set()
        for model in models:
            try:
                self._model(model, tasks, running)
            except SyncError as exc:
                self.counts.state_failures += 1
                log.error("rollout of %s: %s; decided again next pass", model, exc, extra={"fields": {"model": model}})

    def _forget(self, tasks: dict[str, ServiceTask]) -> None:
        arns = {t.arn for t in tasks.values()}
        now = self.ledger.now()
        for arn in [a for a, s in self.hosts.items() if a not in arns and now - s.at > IDENTITY_STALE]:
            del self.hosts[arn]

    def _model(self, model: str, tasks: dict[str, ServiceTask], running: int | None) -> None:
        for _ in range(CAS_TRIES):
            try:
                state, etag = self.ledger.read(model)
                problem = _invalid(state)
            except InvalidState as exc:
                state, etag, problem = None, "", str(exc)
            if problem:
                if not self._repair(model, problem):
                    return
                continue
            decisions: list[tuple[str, Rollout, str, dict[str, Any], int]] = []
            new = self._decide(model, state, tasks, running, decisions)
            if new is None:
                self._consume(model)
                return
            try:
                self.ledger.write(new, etag)
            except Conflict:
                continue
            self._consume(model)
            if new.rollout is not None:
                self.in_flight.add(model)
            else:
                self.in_flight.discard(model)
            if state is None or new.stable != state.stable or new.verdicts != state.verdicts:
                try:
                    self.ledger.write_copy(new)
                except SyncError as exc:
                    log.error("rollout of %s: cannot publish the stable copy: %s", model, exc)
            for verdict, r, reason, evidence, level in decisions:
                self._decision(model, verdict, r, reason, evidence, level)
            return

    def _consume(self, model: str) -> None:
        for seen in self.hosts.values():
            seen.events.pop(model, None)

    def _repair(self, model: str, problem: str) -> bool:
        """Rewrite an unusable state from the stable copy (its stable artifact and rejections); False when it
        cannot be (no copy yet: nothing is decided for the model, the daemons keep serving)."""
        self.counts.rollout_state_repairs += 1
        try:
            copy = self.ledger.read_copy(model)
        except SyncError as exc:
            log.error("rollout of %s: the state is unusable (%s) and the stable copy unreadable (%s)", model,
                      problem, exc, extra={"fields": {"model": model}})  # fmt: skip
            return False
        if copy is None:
            log.error("rollout of %s: the state is unusable (%s) and no stable copy exists: nothing decided; fix or "
                      "delete the state", model, problem, extra={"fields": {"model": model}})  # fmt: skip
            return False
        state = copy.state(self.ledger.now())
        try:
            self.ledger.client.put_object(
                Bucket=self.ledger.bucket, Key=self.ledger.key(model), ContentType="application/json",
                Body=_body(state),
            )  # fmt: skip
        except Exception as exc:
            log.error("rollout of %s: cannot repair the state: %s", model, error_text(exc))
            return False
        log.error(
            "rollout of %s: the state was unusable (%s): repaired from the stable copy (stable %s, %d rejected)",
            model, problem, short(copy.stable.sha256), len(copy.rejected),
            extra={"fields": {"model": model, "verdict": "state repaired", "problem": problem[:500],
                              "stable": copy.stable.sha256, "rejected": list(copy.rejected)}},
        )  # fmt: skip
        return True

    # --- deciding --------------------------------------------------------------------------------------------

    def _decide(
        self,
        model: str,
        state: State | None,
        tasks: dict[str, ServiceTask],
        running: int | None,
        out: list[tuple[str, Rollout, str, dict[str, Any], int]],
    ) -> State | None:
        now = self.ledger.now()
        if state is None:
            return self._first(model)
        new = state.copy()
        stable = new.stable
        assert stable is not None
        changed = False
        hint = self.hints.pop(model, None)
        if hint is not None and hint.sha256 != stable.sha256:
            changed = self._hinted(model, new, hint, running, now, out)
        r = new.rollout
        if r is None:
            return new if changed else None
        for p in [p for p in r.participants.values() if not p.lost]:
            if self._participant(model, new, r, p, tasks, now, out):
                changed = True
            if new.rollout is None:
                return new
        verdict = crashed(r.crashes)
        if verdict is not None:
            self.counts.rollouts_rejected += 1
            return self._conclude(new, REJECTED, verdict, now, out)
        if self._fill(model, r, stable, tasks, now, out):
            changed = True
        judged = self._judge(r, now)
        if judged is not None and judged.verdict in (PROMOTE, REJECT):
            if judged.verdict == PROMOTE:
                self.counts.rollouts_promoted += 1
            else:
                self.counts.rollouts_rejected += 1
            return self._conclude(new, PROMOTED if judged.verdict == PROMOTE else REJECTED, judged, now, out)
        if judged is not None and r.waiting_since is None:
            r.waiting_since = now
            out.append(("waiting for evidence", r, judged.reason, judged.evidence, logging.WARNING))
            changed = True
        return new if changed else None

    def _first(self, model: str) -> State | None:
        """No state yet: record what the hosts serve as stable, once S3 confirms its sha256 at that version."""
        served = [s.serving[model] for s in self.hosts.values() if model in s.serving]
        if not served:
            return None
        art = max(served, key=lambda a: sum(1 for b in served if b.sha256 == a.sha256))
        confirmed = self._confirm(model, art)
        if confirmed is None:
            return None
        log.info("rollout of %s: %s recorded as the stable artifact (what the hosts serve)", model,
                 short(confirmed.sha256), extra={"fields": {"model": model, "stable": confirmed.sha256}})  # fmt: skip
        return State(model, confirmed)

    def _confirm(self, model: str, art: Artifact) -> Artifact | None:
        """The artifact a daemon named, as S3 says it is at that version (the sha256 its uploader gave it)."""
        try:
            head = self.s3.head(art.archive(model))
            sha = head.sha256 or self.s3.tag_hash(head)
            return record_artifact(self.ledger.prefix, model, sha, head.key, head.etag, head.version_id)
        except SyncError as exc:
            log.warning("rollout of %s: cannot confirm %s in S3: %s", model, art.key, exc)
            return None

    def _in_s3(self, model: str) -> Artifact | None:
        listed = self.s3.find(model)
        if listed is None:
            return None
        return self._confirm(model, Artifact("", listed.key, listed.etag, listed.version_id))

    def _hinted(self, model: str, new: State, hint: Artifact, running: int | None, now: float,
                out: list[tuple[str, Rollout, str, dict[str, Any], int]]) -> bool:  # fmt: skip
        """A daemon saw another object than the stable one: read S3, then start, supersede or end a rollout."""
        stable = new.stable
        assert stable is not None
        try:
            cur = self._in_s3(model)
        except SyncError as exc:
            log.warning("rollout of %s: cannot read S3's object: %s", model, exc)
            return False
        r = new.rollout
        if cur is None or not cur.sha256:
            return False
        if cur.sha256 == stable.sha256:
            if r is None:
                return False
            new.add(Verdict(r.artifact.sha256, SUPERSEDED, now, BY, "the stable artifact was uploaded again"))
            new.rollout = None
            out.append(("superseded", r, "the stable artifact was uploaded again", {}, logging.INFO))
            return True
        if new.rejected(cur.sha256) is not None or (r is not None and r.artifact.sha256 == cur.sha256):
            return False
        if not cur.version_id:
            log.error("rollout of %s: %s has no S3 version id (an unversioned bucket): no rollout starts", model,
                      cur.key, extra={"fields": {"model": model}})  # fmt: skip
            return False
        if r is not None:  # a newer upload during the bake: the newest wins, the same canaries take it
            new.add(Verdict(r.artifact.sha256, SUPERSEDED, now, BY, f"replaced by a newer upload, "
                            f"{short(cur.sha256)}, during its bake"))  # fmt: skip
            out.append(("superseded", r, f"replaced by a newer upload, {short(cur.sha256)}", {}, logging.INFO))
            kept = {h: Participant(h, CANARY, now, now) for h, p in r.participants.items()
                    if p.role == CANARY and not p.lost}  # fmt: skip
            new.rollout = Rollout(cur, stable, now, BY, r.wanted, r.live_hosts, kept)
            return True
        if running is None or running < 1:
            log.warning("rollout of %s: %s waits: the number of running tasks is unknown", model, short(cur.sha256))
            self.hints[model] = hint
            return False
        wanted = max(1, math.ceil(self.canary_fraction * running))
        new.rollout = Rollout(cur, stable, now, BY, wanted, running, {})
        self.counts.rollouts_started += 1
        out.append(("started", new.rollout, f"{short(cur.sha256)} goes to {wanted} canary host(s) of {running} "
                    "running first", {}, logging.INFO))  # fmt: skip
        return True

    def _participant(self, model: str, new: State, r: Rollout, p: Participant, tasks: dict[str, ServiceTask],
                     now: float, out: list[tuple[str, Rollout, str, dict[str, Any], int]]) -> bool:  # fmt: skip
        """One participant's news: stopped, crashed, failed, READY, evidence, silent. True when it changed."""
        stable = new.stable
        assert stable is not None
        seen = self.hosts.get(p.host)
        if task_id(p.host) not in tasks:
            try:
                stop = self.describe_stop(p.host)
            except FleetError as exc:
                log.warning("rollout of %s: cannot tell why task %s stopped: %s", model, p.host, exc)
                return False
            p.lost = True
            if p.role == CANARY and p.ready is not None and stop is not None and stop.crash:
                self._crash(r, p, f"its task stopped: {stop.code} ({stop.reason[:200]}), exit codes "
                            f"{stop.exit_codes}", out)  # fmt: skip
            else:
                why = f"{stop.code or 'stopped'} ({stop.reason[:200]})" if stop is not None else "unknown to ECS"
                out.append(("participant lost", r, f"{p.role} {p.host}: its task left the service: {why}; not a "
                            "crash: its slot is free", {}, logging.WARNING))  # fmt: skip
            return True
        changed = False
        for ev in seen.events.get(model, []) if seen is not None else []:
            if p.role != CANARY or ev.sha256 != r.artifact.sha256:
                continue
            if ev.event == "triton_gone" and p.ready is not None:
                try:
                    stop = self.describe_stop(p.host)
                except FleetError as exc:  # not counted on a guess: the daemon says it again next tick
                    log.warning("rollout of %s: cannot tell whether ECS stops task %s: %s", model, p.host, exc)
                    continue
                p.lost = True
                if stop is not None and stop.by_ecs:
                    out.append(("participant lost", r, f"canary {p.host}: Triton is gone while ECS stops its task: "
                                f"{stop.code} ({stop.reason[:200]}); not a crash: its slot is free", {},
                                logging.WARNING))  # fmt: skip
                else:
                    self._crash(r, p, f"its daemon says Triton is gone: {ev.reason[:200]}", out)
                return True
            if ev.event == "load_failed":
                self.counts.rollouts_rejected += 1
                j = Judgement(REJECT, [f"it failed to install on canary {p.host}: {ev.reason[:500]}"],
                              {"install_error": ev.reason[:1000]})  # fmt: skip
                self._conclude(new, REJECTED, j, now, out)
                return True
        if seen is not None:
            if seen.at > p.seen:
                p.seen, changed = seen.at, True
            serving = seen.serving.get(model)
            if p.role == CANARY and p.ready is None and serving is not None and serving.sha256 == r.artifact.sha256:
                p.ready, changed = now, True
            got = seen.counters.get(model)
            wanted_sha = r.artifact.sha256 if p.role == CANARY else stable.sha256
            if got is not None and got[0] == wanted_sha:  # evidence counts only for the artifact it is about
                snap = got[1]
                if p.since is None:
                    if p.role == CONTROL or (p.ready is not None and now - p.ready >= self.settle):
                        p.since, p.start, p.window, changed = now, snap, Window(), True
                elif p.window != (w := window(p.start, snap)):
                    p.window, changed = w, True
        silent = now - p.seen
        if silent > STALE and (p.ready is not None or p.role == CONTROL):
            p.lost = True
            out.append(("participant lost", r, f"{p.role} {p.host} silent for {silent:.0f} s: its slot is free", {},
                        logging.WARNING))  # fmt: skip
            return True
        if p.role == CANARY and p.ready is None and now - p.claimed > self.install_deadline:
            p.lost = True
            out.append(("participant lost", r, f"canary {p.host} did not serve it within "
                        f"{self.install_deadline:.0f} s: its slot is free", {}, logging.WARNING))  # fmt: skip
            return True
        return changed

    def _crash(self, r: Rollout, p: Participant, why: str,
               out: list[tuple[str, Rollout, str, dict[str, Any], int]]) -> None:  # fmt: skip
        if p.host not in r.crashes:
            r.crashes.append(p.host)
            self.counts.rollout_crashes += 1
        out.append(("canary crashed", r, f"canary {p.host} crashed serving {short(r.artifact.sha256)}: {why} "
                    f"({len(r.crashes)} crash(es))", {"crashes": list(r.crashes)}, logging.ERROR))  # fmt: skip

    def _fill(self, model: str, r: Rollout, stable: Artifact, tasks: dict[str, ServiceTask], now: float,
              out: list[tuple[str, Rollout, str, dict[str, Any], int]]) -> bool:  # fmt: skip
        """Free canary and control slots go to live hosts serving the stable artifact; canaries to container
        instances no live canary uses, where there are such."""
        arns = {t.arn: t for t in tasks.values()}
        candidates = [
            s for s in self.hosts.values()
            if s.task_arn in arns and s.task_arn not in r.participants and now - s.at <= STALE
            and model in s.serving and s.serving[model].sha256 == stable.sha256
        ]  # fmt: skip
        candidates.sort(key=lambda s: hashlib.sha256((r.artifact.sha256 + s.task_arn).encode()).hexdigest())
        changed = False
        while len(r.live(CANARY)) < r.wanted and candidates:
            used = {self.hosts[p.host].instance for p in r.live(CANARY) if p.host in self.hosts}
            pick = next((s for s in candidates if not s.instance or s.instance not in used), candidates[0])
            candidates.remove(pick)
            r.participants[pick.task_arn] = Participant(pick.task_arn, CANARY, now, now)
            out.append(("canary assigned", r, f"{pick.task_arn} takes a canary slot"
                        + (f" on {pick.instance}" if pick.instance else ""), {}, logging.INFO))  # fmt: skip
            changed = True
        while len(r.live(CONTROL)) < r.wanted and candidates:
            pick = candidates.pop(0)
            r.participants[pick.task_arn] = Participant(pick.task_arn, CONTROL, now, now)
            changed = True
        return changed

    def _judge(self, r: Rollout, now: float) -> Judgement | None:
        canaries = [p for p in r.live(CANARY) if p.since is not None and p.window is not None]
        if not canaries:
            return None
        canary = _total(p.window for p in canaries)
        controls = [p for p in r.live(CONTROL) if p.window is not None]
        baselines = [(f"the hosts on the previous artifact over the same window ({len(controls)})",
                      _total(p.window for p in controls))]  # fmt: skip
        baked = now - max(p.since or now for p in canaries)
        for j in (early_abort(canary, baselines, self.rules, baked),):
            if j is not None:
                j.evidence |= {
                    "canaries": sorted(p.host for p in canaries),
                    "controls": sorted(p.host for p in controls),
                }
                return j
        if len(canaries) < len(r.live(CANARY)) or baked < self.rules.bake_seconds:
            return None
        hosts = {"canaries": sorted(p.host for p in canaries), "controls": sorted(p.host for p in controls)}
        base = baselines[0][1]
        if r.live(CONTROL) and base.requests < self.rules.min_requests:
            # Controls are assigned but have not counted enough yet (their reports lag, or they just joined):
            # judging now would be against no baseline, latency unjudged, and let a 20x slower build through.
            return Judgement(WAIT, [f"the controls have counted {base.requests} requests, fewer than "
                                    f"--bake-min-requests {self.rules.min_requests}: no verdict without the "
                                    "baseline they give"], {"baseline": base.to_json()} | hosts)  # fmt: skip
        j = judge(canary, baselines, self.rules, baked)
        j.evidence |= hosts
        return j

    def _conclude(self, new: State, verdict: str, j: Judgement, now: float,
                  out: list[tuple[str, Rollout, str, dict[str, Any], int]]) -> State:  # fmt: skip
        r = new.rollout
        assert r is not None
        new.add(Verdict(r.artifact.sha256, verdict, now, BY, j.reason, j.evidence))
        if verdict == PROMOTED:
            new.stable = r.artifact
        new.rollout = None
        out.append((verdict, r, j.reason, j.evidence, logging.INFO if verdict == PROMOTED else logging.WARNING))
        return new

    def _decision(self, model: str, verdict: str, r: Rollout, reason: str, evidence: dict[str, Any],
                  level: int) -> None:  # fmt: skip
        """One JSON line per decision, with its evidence."""
        fields = {
            "model": model, "verdict": verdict, "artifact": r.artifact.sha256, "previous": r.previous.sha256,
            "reason": reason, "evidence": evidence, "canaries": sorted(p.host for p in r.live(CANARY)),
            "crashes": list(r.crashes), "wanted": r.wanted,
        }  # fmt: skip
        log.log(level, "rollout of %s: %s: %s", model, verdict, reason, extra={"fields": fields})


def _invalid(state: State | None) -> str:
    """Why a parsed state may not be used as it is ("" when it may). The controller never writes a state without a
    stable artifact: one is a hand edit (``"stable": null``), repaired from the copy, never a fresh start."""
    if state is not None and state.stable is None:
        return "it names no stable artifact"
    return ""


def _body(state: State) -> bytes:
    return json.dumps(state.to_json(), separators=(",", ":"), sort_keys=True).encode()


def _total(windows: Any) -> Window:
    total = Window()
    for w in windows:
        if w is not None:
            total = total + w
    return total


def ecs_stop(ecs: Any, cluster: str) -> Callable[[str], Stop | None]:
    """DescribeTasks of one task: why it stopped (None: ECS does not know it any more)."""

    def describe(task_arn: str) -> Stop | None:
        try:
            got = ecs.describe_tasks(cluster=cluster, tasks=[task_arn])
        except Exception as exc:
            raise FleetError("ecs:DescribeTasks", error_text(exc)) from None
        for t in got.get("tasks", []):
            if t.get("taskArn") == task_arn:
                codes = {str(c.get("name", "")): int(c["exitCode"]) for c in t.get("containers", [])
                         if isinstance(c.get("exitCode"), int)}  # fmt: skip
                stop = Stop(str(t.get("stopCode", "")), str(t.get("stoppedReason", "")), codes)
                if stop.code in CRASH_STOP_CODES and t.get("containerInstanceArn"):
                    stop.instance_status = _instance_status(ecs, cluster, str(t["containerInstanceArn"]))
                return stop
        return None

    return describe


def _instance_status(ecs: Any, cluster: str, arn: str) -> str:
    """A container instance's status (ACTIVE, DRAINING, ...); "" when ECS no longer knows it or cannot say (then
    the exit counts as a crash: a crash loop must stop, and a drained instance's exit is rare beside it)."""
    try:
        got = ecs.describe_container_instances(cluster=cluster, containerInstances=[arn])
    except Exception as exc:
        log.warning("rollouts: cannot read the status of container instance %s (ecs:DescribeContainerInstances): %s; "
                    "its task's exit counts as a crash", arn, error_text(exc))  # fmt: skip
        return ""
    return next((str(c.get("status", "")) for c in got.get("containerInstances", [])
                 if c.get("containerInstanceArn") == arn), "")  # fmt: skip
