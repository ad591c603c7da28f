"""The operator's view of safe rollouts, over the same state the daemons keep (ledger.py).

    python -m modelsync rollout status [MODEL] [--json]    per model: stable artifact, S3's object, the rollout
                                                           in flight (canaries, controls, evidence), past verdicts
    python -m modelsync rollout promote MODEL [ARTIFACT]   the fleet serves ARTIFACT (default: the rollout in
                                                           flight, else S3's object): every host installs it
    python -m modelsync rollout reject MODEL [ARTIFACT]    ARTIFACT (same default) is rejected: canaries go back

ARTIFACT is a sha256 (or its first 8+ hex digits) or an S3 version id. Bucket and prefix come from the
daemon's own flags and variables (``--bucket``/``MODELSYNC_BUCKET``, ``--prefix``/``MODELSYNC_PREFIX``), the
credentials from the standard AWS chain; writing needs ``s3:PutObject`` on ``<prefix>.modelsync/*``.
Exit codes: 0 done, 1 S3 failed, 2 a wrong command, model or artifact (the message says which).
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
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from telemetry.settings import ConfigError, add_options, parse

from .errors import SyncError
from .ledger import CANARY, PROMOTED, REJECTED, Artifact, Conflict, Ledger, State, Verdict
from .rollout import short
from .s3 import S3, make_client
from .settings import OPTIONS, Settings

# An operator's promote or reject waits this long for a moment when no daemon writes the state: the canaries
# write it as they bake, so a fixed handful of tries can lose every race on a busy fleet. Jittered backoff keeps
# the command out of step with the daemons' cadence.
OPERATOR_CAS_SECONDS = 30.0

ROLLOUT_OPTIONS = tuple(o for o in OPTIONS if o.field in ("bucket", "prefix", "bake_seconds"))


class UsageError(Exception):
    """A wrong model, artifact or command: exit 2 with the message."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m modelsync rollout",
        description="See and steer the safe rollouts of model sync (--canary-fraction): their state lives in "
        "s3://BUCKET/PREFIX.modelsync/rollouts/<model>.json.",
    )
    parser.add_argument("action", choices=("status", "promote", "reject"))
    parser.add_argument("model", nargs="?", default="", help="the model (or bundle); status: all when omitted")
    parser.add_argument("artifact", nargs="?", default="", help="sha256 (8+ hex digits) or S3 version id")
    parser.add_argument("--json", action="store_true", help="status as one JSON document")
    add_options(parser, ROLLOUT_OPTIONS, Settings())
    return parser


def main(argv: Sequence[str], environ: dict[str, str] | None = None, out: TextIO | None = None,
         s3_client: Any = None) -> int:  # fmt: skip
    out = out or sys.stdout
    try:
        args, values = parse(build_parser(), ROLLOUT_OPTIONS, list(argv), os.environ if environ is None else environ)
    except ConfigError as exc:
        sys.stderr.write(f"error: invalid setting: {exc}\n")
        return 2
    if not values.get("bucket"):
        sys.stderr.write("error: invalid setting: --bucket (or MODELSYNC_BUCKET) is required\n")
        return 2
    if args.action != "status" and not args.model:
        sys.stderr.write(f"error: rollout {args.action} needs a MODEL\n")
        return 2
    client = s3_client or make_client("s3")
    bucket, prefix = values["bucket"], values.get("prefix", "")
    cli = RolloutCli(Ledger(client, bucket, prefix), S3(client, bucket, prefix), values.get("bake_seconds", 600.0))
    try:
        if args.action == "status":
            cli.status(args.model, args.json, out)
        else:
            cli.decide(args.action, args.model, args.artifact, out)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except SyncError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
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

    def decide(self, action: str, model: str, wanted: str, out: TextIO) -> None:
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
            artifact = self._pick(action, state, in_s3, wanted)
            new = state.copy()
            now = self.ledger.now()
            if action == "promote":
                new.add(Verdict(artifact.sha256, PROMOTED, now, who, "promoted by an operator"))
                new.stable = artifact
                new.rollout = None
            else:
                new.add(Verdict(artifact.sha256, REJECTED, now, who, "rejected by an operator"))
                if new.rollout is not None and new.rollout.artifact.sha256 == artifact.sha256:
                    new.rollout = None
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

    def _pick(self, action: str, state: State, in_s3: Artifact | None, wanted: str) -> Artifact:
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
