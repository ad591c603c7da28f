"""The operator's view of safe rollouts, over the same state the daemons keep (ledger.py).

    python -m modelsync rollout status [MODEL] [--json]    per model: stable artifact, S3's object, the rollout
                                                           in flight (canaries, controls, evidence), past verdicts
    python -m modelsync rollout promote MODEL [ARTIFACT]   the fleet serves ARTIFACT (default: the rollout in
                                                           flight, else S3's object): every host installs it
    python -m modelsync rollout reject MODEL [ARTIFACT]    ARTIFACT (same default) is rejected: canaries go back

ARTIFACT is a sha256 (or its first 8+ hex digits) or an S3 version id. Bucket and prefix come from the
daemon's own flags and variables (``--bucket``/``MODELSYNC_BUCKET``, ``--prefix``/``MODELSYNC_PREFIX``), the
credentials from the standard AWS chain.

Where the controller decides (``--rollouts on``; the model has a stable copy at
``<prefix>.modelsync/stable/<model>.json``), promote and reject go through it: with ``--controller-queue-url``
the command sends an ``operator`` message to its queue (the controller records the sender as SQS's SenderId
names it), waits for its answer at ``<prefix>.modelsync/operator/<request>.json`` and prints it; without, it
refuses to write the state behind the controller's back. In self mode it writes the state itself
(``s3:PutObject`` on ``<prefix>.modelsync/*``). A promote that overrides a rejection made on evidence needs
``--force`` and says so in its verdict.

Exit codes: 0 done, 1 S3 or SQS failed or the controller did not answer, 2 a wrong command, model or artifact,
or a refusal (the message says which, on one ``modelsync rollout: error: ...`` line).
"""

from __future__ import annotations

import argparse
import getpass
import itertools
import json
import os
import random
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from telemetry.settings import ArgumentParser, ConfigError, add_options, fail, parse

from .errors import SyncError
from .ledger import CANARY, PROMOTED, REJECTED, Artifact, Conflict, Ledger, State, Verdict
from .rollout import short
from .s3 import S3, make_client
from .settings import OPTIONS, Settings

# An operator's promote or reject waits this long for a moment when no daemon writes the state: the canaries
# write it as they bake, so a fixed handful of tries can lose every race on a busy fleet. Jittered backoff keeps
# the command out of step with the daemons' cadence.
OPERATOR_CAS_SECONDS = 30.0

ROLLOUT_OPTIONS = tuple(o for o in OPTIONS if o.field in ("bucket", "prefix", "bake_seconds", "controller_queue_url"))
OPERATOR_WAIT = 60.0  # seconds the command waits for the controller's answer; the command expires then
PROG = "python -m modelsync rollout"
ANSWER_DIR = ".modelsync/operator/"  # the controller's answers: <prefix>.modelsync/operator/<request>.json


class UsageError(Exception):
    """A wrong model, artifact or command: exit 2 with the message."""


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="See and steer the safe rollouts of model sync (--canary-fraction): their state lives in "
        "s3://BUCKET/PREFIX.modelsync/rollouts/<model>.json.",
    )
    parser.add_argument("action", choices=("status", "promote", "reject"), help="status: the rollouts' state "
                        "(every model's, or MODEL's); promote: the fleet serves ARTIFACT; reject: the canaries go "
                        "back to the stable artifact")  # fmt: skip
    parser.add_argument("model", metavar="MODEL", nargs="?", default="",
                        help="the model (or bundle); status: all when omitted")  # fmt: skip
    parser.add_argument("artifact", metavar="ARTIFACT", nargs="?", default="",
                        help="sha256 (8+ hex digits) or S3 version id (default: the rollout in flight, else S3's "
                        "object)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="status as one JSON document")
    parser.add_argument("--force", action="store_true", help="promote: override a rejection made on evidence")
    parser.add_argument("--wait", type=float, default=OPERATOR_WAIT, metavar="SECONDS", help="seconds to wait for "
                        "the controller's answer (with --controller-queue-url); the command expires unapplied then "
                        f"(default: {OPERATOR_WAIT:g})")  # fmt: skip
    add_options(parser, ROLLOUT_OPTIONS, Settings())
    return parser


def main(argv: Sequence[str], environ: dict[str, str] | None = None, out: TextIO | None = None,
         s3_client: Any = None, sqs_client: Any = None) -> int:  # fmt: skip
    out = out or sys.stdout
    try:
        args, values = parse(build_parser(), ROLLOUT_OPTIONS, list(argv), os.environ if environ is None else environ)
    except ConfigError as exc:
        return fail(PROG, f"invalid setting: {exc}")
    if not values.get("bucket"):
        return fail(PROG, "invalid setting: --bucket (or MODELSYNC_BUCKET) is required")
    if args.action != "status" and not args.model:
        return fail(PROG, f"rollout {args.action} needs a MODEL")
    client = s3_client or make_client("s3")
    bucket, prefix = values["bucket"], values.get("prefix", "")
    cli = RolloutCli(Ledger(client, bucket, prefix), S3(client, bucket, prefix), values.get("bake_seconds", 600.0))
    queue_url = values.get("controller_queue_url", "")
    try:
        if args.action == "status":
            cli.status(args.model, args.json, out)
        elif queue_url:
            sqs = sqs_client or make_client("sqs", region_hint=_queue_region(queue_url))
            cli.through_controller(args.action, args.model, args.artifact, args.force, sqs, queue_url, out,
                                   max(1.0, min(600.0, args.wait)))  # fmt: skip
        else:
            cli.decide(args.action, args.model, args.artifact, out, args.force)
    except UsageError as exc:
        return fail(PROG, str(exc))
    except SyncError as exc:
        return fail(PROG, str(exc), 1)
    return 0


class RolloutCli:
    def __init__(self, ledger: Ledger, s3: S3, bake: float) -> None:
        self.ledger = ledger
        self.s3 = s3
        self.bake = bake

    # --- status ------------------------------------------------------------------------------------------

    def status(self, model: str, as_json: bool, out: TextIO) -> None:
        models = [model] if model else self.ledger.models()
        docs = []
        for m in models:
            state, _ = self.ledger.read(m)
            in_s3 = self._in_s3(m)
            if state is None and in_s3 is None:
                raise UsageError(self._unknown(m))
            docs.append((m, state, in_s3))
        if as_json:
            json.dump({m: {"state": s.to_json() if s else None, "in_s3": a.to_json() if a else None}
                       for m, s, a in docs}, out, indent=1, sort_keys=True)  # fmt: skip
            out.write("\n")
            return
        if not docs:
            out.write(f"no rollout state under s3://{self.ledger.bucket}/{self.ledger.prefix}.modelsync/rollouts/\n")
        for m, state, in_s3 in docs:
            self._show(m, state, in_s3, out)

    def _show(self, model: str, state: State | None, in_s3: Artifact | None, out: TextIO) -> None:
        now = self.ledger.now()
        w = out.write
        w(f"{model}\n")
        if state is None or state.stable is None:
            w("  no rollout state yet: the next upload is installed on every host, then rollouts start\n")
            return
        stable = state.stable
        w(f"  stable    {short(stable.sha256)}  (s3 version {stable.version_id or 'none'})\n")
        if in_s3 is not None:
            note = "the stable artifact" if in_s3.sha256 == stable.sha256 else "differs from the stable artifact"
            rejected = state.rejected(in_s3.sha256)
            if rejected is not None:
                note = f"REJECTED at {_when(rejected.at)} by {rejected.by}: the fleet keeps serving the stable artifact"
            w(f"  in S3     {short(in_s3.sha256)}  {in_s3.key}: {note}\n")
        else:
            w("  in S3     nothing (the object was deleted)\n")
        r = state.rollout
        if r is None:
            w("  rollout   none in flight; every host serves the stable artifact\n")
        else:
            canaries = r.live(CANARY)
            w(f"  rollout   {short(r.artifact.sha256)} since {_when(r.started)} (by {r.started_by}): "
              f"{len(canaries)} of {r.wanted} canaries ({r.live_hosts or '?'} live hosts at the start)\n")  # fmt: skip
            if r.waiting_since is not None:
                w(f"            WAITING FOR EVIDENCE for {now - r.waiting_since:.0f} s: fewer requests than "
                  "--bake-min-requests on the canaries; promote or reject it by hand\n")  # fmt: skip
            for p in sorted(r.participants.values(), key=lambda p: (p.role, p.host)):
                state_text = "LOST" if p.lost else ("installing" if p.since is None else
                                                    f"{'baked' if p.role == CANARY else 'measured'} "
                                                    f"{now - p.since:.0f} s")  # fmt: skip
                ev = p.window.to_json() if p.window else {}
                w(f"    {p.role:<8} {p.host}: {state_text}, seen {now - p.seen:.0f} s ago; "
                  f"{_evidence(ev)}\n")  # fmt: skip
            hosts = ", ".join(p.host for p in canaries)
            w(f"  serving   {short(r.artifact.sha256)}: {len(canaries)} host(s) ({hosts}); "
              f"{short(stable.sha256)}: every other host\n")  # fmt: skip
        for v in state.verdicts[-5:]:
            w(f"  verdict   {_when(v.at)} {v.verdict} {short(v.sha256)} by {v.by}: {v.reason[:300]}\n")

    # --- promote / reject ----------------------------------------------------------------------------------

    def decide(self, action: str, model: str, wanted: str, out: TextIO, force: bool = False) -> None:
        """Self mode: the command writes the state itself (compare-and-swap against the daemons' writes)."""
        if self.ledger.read_copy(model) is not None:
            raise UsageError(
                f"the rollouts of {model} are decided by the controller (python -m controller --rollouts on: "
                f"s3://{self.ledger.bucket}/{self.ledger.copy_key(model)} exists): give --controller-queue-url "
                "(CONTROLLER_QUEUE_URL) so that the command goes through it; nothing was written"
            )
        who = f"operator {getpass.getuser()}@{socket.gethostname()}"
        deadline = time.monotonic() + OPERATOR_CAS_SECONDS
        for attempt in itertools.count():
            if attempt and time.monotonic() >= deadline:
                break
            in_s3 = self._in_s3(model)  # before the state: nothing but our own decision between its read and write
            state, etag = self.ledger.read(model)
            if state is None and in_s3 is None:
                raise UsageError(self._unknown(model))
            if state is None or state.stable is None:
                raise UsageError(
                    f"{model} has no rollout state yet (no artifact recorded as stable): there is nothing to "
                    f"{action}; the daemons record one when they first see the model with --canary-fraction"
                )
            artifact = pick(action, state, in_s3, wanted)
            now = self.ledger.now()
            new, _ = apply(action, state, artifact, now, who, force)
            try:
                self.ledger.write(new, etag)
            except Conflict:  # a daemon wrote in between (each canary writes as it bakes): read again, a little later
                time.sleep(random.uniform(0.05, min(2.0, 0.1 * 2**attempt)))
                continue
            line = {"model": model, "artifact": artifact.sha256, "verdict": f"{action}d" if action == "promote"
                    else "rejected", "by": who, "at": _when(now)}  # fmt: skip
            out.write(json.dumps(line) + "\n")
            return
        raise SyncError(f"the rollout state of {model} kept changing for {OPERATOR_CAS_SECONDS} s; try again")

    # --- through the controller ------------------------------------------------------------------------------

    def through_controller(self, action: str, model: str, wanted: str, force: bool, sqs: Any, queue_url: str,
                           out: TextIO, wait: float = OPERATOR_WAIT) -> None:  # fmt: skip
        """Send the command to the controller's queue and print its answer; it expires unapplied after ``wait``."""
        request = uuid.uuid4().hex
        doc = {
            "type": "operator", "version": 1, "action": action, "model": model, "artifact": wanted, "force": force,
            "request": request, "claimed_by": f"{getpass.getuser()}@{socket.gethostname()}",
            "expires_at": round(time.time() + wait, 3),
        }  # fmt: skip
        try:
            sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(doc, separators=(",", ":")))
        except Exception as exc:
            raise SyncError(f"cannot send the command to the controller's queue {queue_url}: {exc}") from None
        key = answer_key(self.ledger.prefix, request)
        deadline = time.monotonic() + wait
        cancelled = False
        while True:
            answer = self._answer(key)
            status = answer.get("status") if answer is not None else None
            if status == "applied" and answer is not None:
                out.write(json.dumps(answer.get("line", answer), sort_keys=True) + "\n")
                return
            if status == "refused" and answer is not None:
                raise UsageError(f"the controller refused: {answer.get('reason', '')}")
            if time.monotonic() >= deadline:
                if status is None and not cancelled and self._cancel(key):
                    raise SyncError(
                        f"the controller did not answer within {wait:.0f} s: it is not running, or runs without "
                        f"--rollouts on; the command is cancelled (s3://{self.ledger.bucket}/{key}) and will not apply"
                    )
                if cancelled:
                    raise SyncError(f"the controller took the command but did not answer within {wait + 10:.0f} s: "
                                    f"see python -m modelsync rollout status {model}")  # fmt: skip
                cancelled, deadline = True, time.monotonic() + 10.0  # the controller claimed it: its answer is near
            time.sleep(0.5)

    def _cancel(self, key: str) -> bool:
        """Write the cancel before the controller claims the command (create-only: exactly one of them wins)."""
        try:
            self.ledger.client.put_object(Bucket=self.ledger.bucket, Key=key, IfNoneMatch="*",
                                          Body=b'{"status":"cancelled"}', ContentType="application/json")  # fmt: skip
            return True
        except Exception as exc:
            if str(getattr(exc, "response", {}).get("Error", {}).get("Code", "")) in ("PreconditionFailed", "412"):
                return False
            raise SyncError(f"cannot cancel the command at s3://{self.ledger.bucket}/{key}: {exc}") from None

    def _answer(self, key: str) -> dict[str, Any] | None:
        try:
            body = self.ledger.client.get_object(Bucket=self.ledger.bucket, Key=key)["Body"].read(64 * 1024)
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404"):
                return None
            raise SyncError(f"cannot read the controller's answer s3://{self.ledger.bucket}/{key}: {exc}") from None
        got = json.loads(body)
        return got if isinstance(got, dict) else None

    def _in_s3(self, model: str) -> Artifact | None:
        listed = self.s3.find(model)
        if listed is None:
            return None
        head = self.s3.head(listed)
        sha = head.sha256 or self.s3.tag_hash(head) or f"unverified-{head.etag.strip(chr(34))}"
        return Artifact(sha, head.key, head.etag, head.version_id)

    def _unknown(self, model: str) -> str:
        try:
            known = ", ".join(self.ledger.models()[:20]) or "none"
        except SyncError:
            known = "unknown (the listing failed)"
        return (
            f"no model {model!r} in s3://{self.s3.bucket}/{self.s3.prefix} (neither an object nor a rollout "
            f"state); models with a rollout state: {known}"
        )


def answer_key(prefix: str, request: str) -> str:
    return f"{prefix}{ANSWER_DIR}{request}.json"


def overridden(state: State, artifact: Artifact) -> Verdict | None:
    """The rejection made on evidence (by a daemon or the controller, not an operator) that promoting
    ``artifact`` would override; None when there is none."""
    v = state.rejected(artifact.sha256)
    return v if v is not None and not v.by.startswith("operator") else None


def apply(action: str, state: State, artifact: Artifact, now: float, who: str, force: bool) -> tuple[State, str]:
    """The state after an operator's promote or reject, and its verdict's reason; raises UsageError when a
    promote would override a rejection made on evidence without ``force``."""
    new = state.copy()
    if action == "promote":
        over = overridden(state, artifact)
        reason = "promoted by an operator"
        if over is not None:
            when = _when(over.at)
            said = f"{short(artifact.sha256)} was rejected on evidence at {when} by {over.by}: {over.reason[:300]}"
            if not force:
                raise UsageError(f"{said}; promoting it overrides that rejection: add --force to do so")
            reason = f"promoted by an operator with --force, overriding a rejection on evidence ({said})"
        new.add(Verdict(artifact.sha256, PROMOTED, now, who, reason))
        new.stable = artifact
        new.rollout = None
    else:
        reason = "rejected by an operator"
        new.add(Verdict(artifact.sha256, REJECTED, now, who, reason))
        if new.rollout is not None and new.rollout.artifact.sha256 == artifact.sha256:
            new.rollout = None
    return new, reason


def pick(action: str, state: State, in_s3: Artifact | None, wanted: str) -> Artifact:
    """The artifact an operator names (default: the rollout in flight, else S3's object); raises UsageError."""
    assert state.stable is not None
    candidates = [a for a in (state.rollout.artifact if state.rollout else None, in_s3, state.stable) if a]
    if wanted:
        w = wanted.lower()
        for a in candidates:
            if (len(w) >= 8 and a.sha256.startswith(w)) or (a.version_id and a.version_id == wanted):
                chosen = a
                break
        else:
            known = ", ".join(f"{short(a.sha256)} (version {a.version_id or 'none'})" for a in candidates)
            raise UsageError(f"artifact {wanted} of {state.model} is unknown: known are {known}")
    elif state.rollout is not None:
        chosen = state.rollout.artifact
    elif in_s3 is not None and in_s3.sha256 != state.stable.sha256:
        chosen = in_s3
    else:
        raise UsageError(
            f"{state.model}: no rollout is in flight and S3 holds the stable artifact "
            f"{short(state.stable.sha256)}: name the ARTIFACT to {action}"
        )
    if action == "reject" and chosen.sha256 == state.stable.sha256:
        raise UsageError(
            f"{short(chosen.sha256)} is the stable artifact of {state.model} (what the fleet serves): upload "
            "the artifact to serve instead, or promote another one"
        )
    if action == "promote" and chosen.sha256 == state.stable.sha256:
        raise UsageError(f"{short(chosen.sha256)} is already the stable artifact of {state.model}")
    if action == "promote" and not chosen.version_id and chosen is not in_s3:
        raise UsageError(f"{short(chosen.sha256)} has no S3 version id: it cannot be fetched by the hosts")
    return chosen


def _queue_region(url: str) -> str:
    """``https://sqs.<region>.amazonaws.com/...`` -> region ("" for any other form)."""
    host = url.split("://", 1)[-1].split("/", 1)[0]
    parts = host.split(".")
    return parts[1] if len(parts) > 3 and parts[0] == "sqs" else ""


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _evidence(ev: dict[str, Any]) -> str:
    if not ev:
        return "no evidence yet"
    parts = [f"{ev.get('requests', 0)} requests", f"failure ratio {ev.get('failure_ratio', 0):.4f}"]
    if "avg_ms" in ev:
        parts.append(f"avg {ev['avg_ms']:.2f} ms")
    if "p95_ms" in ev:
        parts.append(f"p95 {ev['p95_ms']:.2f} ms")
    return ", ".join(parts)
