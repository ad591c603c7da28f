"""The rollout ledger: one JSON object per model in the bucket, changed only by compare-and-swap.

    s3://<bucket>/<prefix>.modelsync/rollouts/<model>.json

Why the bucket: it is the one thing every daemon (and the operator's CLI) already reaches, it is durable,
and S3's conditional writes make it a compare-and-swap: ``PutObject`` with ``If-None-Match: *`` creates the
object only if it does not exist, with ``If-Match: <ETag>`` replaces it only if nobody changed it since it
was read (412 PreconditionFailed otherwise; 409 ConditionalRequestConflict while a conflicting write is in
flight). Every change is read, modified, written with the ETag read, and on a conflict read again: two
daemons deciding at once cannot both win. No other service, lock or server.

The key is under the model prefix on purpose: its writes are object events like an upload's, so the
bucket's event rule and the SNS fan-out carry a verdict to every daemon within seconds
(events.py maps the key to its model). It cannot be taken for a model: a model name never starts with
``.`` and the key does not end in ``.zip`` or ``/manifest.json``.

Every time in the document is on S3's clock (the ``Date`` header of its answers), never a host's, so a
host whose clock is off neither bakes too short nor declares the others dead.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from telemetry.shapes import Doc, Malformed, items, loads, number, text

from .errors import DownloadError, UnsafeArchive
from .evidence import Snapshot, Window, snapshot_from_json, snapshot_to_json
from .s3 import MANIFEST, SUFFIX, Archive, valid_hash

STATE_DIR = ".modelsync/rollouts/"
MAX_STATE = 1024 * 1024  # bytes of one state object read at most
MAX_VERDICTS = 50  # past verdicts kept per model (the oldest go)
CLOCK_LATENCY = 0.25  # seconds an answer may take to reach us after S3 stamped its Date
CANARY, CONTROL = "canary", "control"
# What a state's fields may hold (anything else makes the state unreadable, like a state that does not parse):
TIMES = (0.0, 1e11)  # Unix seconds (S3's clock), up to the year 5138
COUNTS = (0.0, 1e20)  # request counters and durations (Triton's are 64-bit)
MAX_HOSTS = 1_000_000  # canaries wanted, live hosts
MAX_TEXT = 4096  # characters of a sha256, key, ETag, version id, host name
PROMOTED, REJECTED, SUPERSEDED = "promoted", "rejected", "superseded"
MAX_CRASHES = 100
STABLE_DIR = ".modelsync/stable/"  # the last stable artifact per model, as the controller published it


class LedgerError(DownloadError):
    """The state could not be read or written (S3 unreachable, refused, or the object is not ours)."""


class InvalidState(LedgerError):
    """The state object exists but does not parse or validate: a controller repairs it from the stable copy."""


class Conflict(Exception):
    """Another writer changed the state since it was read (412/409): read it again."""


class UntrustedArtifact(UnsafeArchive):
    """A state names an artifact a host must not install for its model: another key than the model's own, or a
    sha256 the object does not hold. About the state, not the object's bytes: not remembered across restarts
    (a corrected state is followed at once)."""

    remembered = False


def state_key(prefix: str, model: str) -> str:
    return f"{prefix}{STATE_DIR}{model}.json"


def model_of_state(key: str, prefix: str) -> str | None:
    """``<prefix>.modelsync/rollouts/<model>.json`` -> model; None for any other key."""
    head = prefix + STATE_DIR
    if not key.startswith(head) or not key.endswith(".json"):
        return None
    name = key[len(head) : -len(".json")]
    return name if name and "/" not in name else None


# --- what a state may name (issue 36): the model's own key, with the sha256 recorded when it was first seen ----
#
# Anyone who can write the state could otherwise point a host at any object: a zip planted beside the state,
# another model's manifest. A host installs from a state only an artifact that passes :func:`artifact_problem`,
# and only bytes that hash to the sha256 the state holds; that sha256 is written by :func:`record_artifact`
# alone, from the listed object of the model's own key (its sha256 metadata, or the bytes a host verified).
# Today daemons record it when they first see an artifact; a controller that takes rollouts over records it
# through the same function.

UNVERIFIED = "unverified-"  # an artifact recorded under --allow-unverified: "unverified-<ETag>", no sha256


def own_keys(prefix: str, model: str) -> tuple[str, str]:
    """The only keys a state of ``model`` may name: its zip (one model, or the bundle of that name, which owns
    the models in it) and its directory model's manifest."""
    return f"{prefix}{model}{SUFFIX}", f"{prefix}{model}/{MANIFEST}"


def artifact_problem(prefix: str, model: str, artifact: Artifact) -> str:
    """Why a host must not install ``artifact`` for ``model`` ("" when it may)."""
    zipped, manifest = own_keys(prefix, model)
    if artifact.key not in (zipped, manifest):
        return f"it names s3 key {artifact.key!r}, not {zipped} or {manifest}: a state names only the model's own key"
    if not (valid_hash(artifact.sha256) or artifact.sha256.startswith(UNVERIFIED)):
        return f"its sha256 {artifact.sha256[:80]!r} is not a sha256"
    return ""


def record_artifact(prefix: str, model: str, sha256: str, key: str, etag: str, version_id: str) -> Artifact:
    """The one place an artifact enters a state: the object ``key`` at ``version_id`` (listed under the model's
    own key, or installed from it) with the sha256 its uploader gave it (``sha256``: the object's metadata, or
    the bytes a host verified against it). Raises UntrustedArtifact for any other key."""
    artifact = Artifact(sha256.lower() if valid_hash(sha256) else sha256, key, etag, version_id)
    problem = artifact_problem(prefix, model, artifact)
    if problem:
        raise UntrustedArtifact(f"not recorded in the rollout state of {model}: {problem}")
    return artifact


@dataclass(frozen=True)
class Artifact:
    """One uploaded artifact of a model: its content (sha256) and the S3 object version that holds it."""

    sha256: str
    key: str
    etag: str
    version_id: str

    def archive(self, model: str) -> Archive:
        """The object pinned to its version (size and time are completed by the HEAD of the install)."""
        return Archive(model, self.key, self.etag, 0, datetime.fromtimestamp(0, UTC), version_id=self.version_id)

    def to_json(self) -> dict[str, str]:
        return {"sha256": self.sha256, "key": self.key, "etag": self.etag, "version_id": self.version_id}

    @classmethod
    def from_json(cls, raw: Any, path: str = "artifact") -> Artifact:
        doc = Doc(raw, path)
        sha = doc.text("sha256", limit=MAX_TEXT)
        if not sha:
            raise Malformed(doc.at("sha256"), "empty")
        return cls(
            sha,
            doc.text("key", default="", limit=MAX_TEXT),
            doc.text("etag", default="", limit=MAX_TEXT),
            doc.text("version_id", default="", limit=MAX_TEXT),
        )


@dataclass
class Participant:
    """A host's part in a rollout: a canary (serves the new artifact) or a control (stays on the previous one
    and measures it over the same window: the baseline)."""

    host: str
    role: str
    claimed: float
    seen: float  # its daemon's last sign of life (S3 time): a participant silent for long is lost
    since: float | None = None  # the window's start (S3 time); a canary's: a settling time after READY
    start: Snapshot = field(default_factory=dict)  # the counters at the window's start
    window: Window | None = None  # the evidence so far
    before: Window | None = None  # a canary's previous artifact on its own host, before the switch
    lost: bool = False
    ready: float | None = None  # a canary's new artifact READY (S3 time)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "claimed": self.claimed,
            "seen": self.seen,
            "since": self.since,
            "start": snapshot_to_json(self.start),
            "lost": self.lost,
            "ready": self.ready,
        }
        if self.window is not None:
            out["window"] = self.window.to_json()
        if self.before is not None:
            out["before"] = self.before.to_json()
        return out

    @classmethod
    def from_json(cls, host: str, raw: Any, path: str = "participant") -> Participant:
        doc = Doc(raw, path)
        role = doc.text("role", limit=MAX_TEXT)
        if role not in (CANARY, CONTROL):
            raise Malformed(doc.at("role"), f"neither {CANARY} nor {CONTROL}")
        return cls(
            host,
            role,
            doc.number("claimed", *TIMES, default=0.0),
            doc.number("seen", *TIMES, default=0.0),
            doc.optional_number("since", *TIMES),
            _snapshot(doc.get("start"), doc.at("start")),
            _window(doc, "window"),
            _window(doc, "before"),
            doc.flag("lost"),
            doc.optional_number("ready", *TIMES),
        )


@dataclass
class Rollout:
    artifact: Artifact
    previous: Artifact
    started: float
    started_by: str
    wanted: int  # canaries wanted: ceil(--canary-fraction x live hosts), at least 1
    live_hosts: int
    participants: dict[str, Participant] = field(default_factory=dict)
    waiting_since: float | None = None  # the bake ended without enough requests (S3 time)
    crashes: list[str] = field(default_factory=list)  # canaries whose Triton exited serving it (the controller's)

    def live(self, role: str) -> list[Participant]:
        return [p for p in self.participants.values() if p.role == role and not p.lost]

    def to_json(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact.to_json(),
            "previous": self.previous.to_json(),
            "started": self.started,
            "started_by": self.started_by,
            "wanted": self.wanted,
            "live_hosts": self.live_hosts,
            "participants": {h: p.to_json() for h, p in sorted(self.participants.items())},
            "waiting_since": self.waiting_since,
            "crashes": list(self.crashes),
        }

    @classmethod
    def from_json(cls, raw: Any, path: str = "rollout") -> Rollout:
        doc = Doc(raw, path)
        participants: dict[str, Participant] = {}
        hosts = doc.optional_doc("participants")
        for i, (host, p) in enumerate(hosts.raw.items() if hosts else []):
            where = f"{doc.at('participants')}#{i}"  # the index, not the host: a key may be anything
            participants[text(host, where, MAX_TEXT)] = Participant.from_json(host, p, where)
        return cls(
            Artifact.from_json(doc.get("artifact"), doc.at("artifact")),
            Artifact.from_json(doc.get("previous"), doc.at("previous")),
            doc.number("started", *TIMES, default=0.0),
            doc.text("started_by", default="", limit=MAX_TEXT),
            max(1, doc.integer("wanted", 0, MAX_HOSTS, default=1)),
            doc.integer("live_hosts", 0, MAX_HOSTS, default=0),
            participants,
            doc.optional_number("waiting_since", *TIMES),
            [text(c, f"{doc.at('crashes')}[{i}]", MAX_TEXT) for i, c in enumerate(doc.items("crashes"))][:MAX_CRASHES]
            if doc.has("crashes")
            else [],
        )


@dataclass(frozen=True)
class Verdict:
    sha256: str
    verdict: str  # promoted | rejected | superseded
    at: float
    by: str  # the host that decided, or "operator"
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "verdict": self.verdict, "at": self.at, "by": self.by, "reason": self.reason,
                "evidence": self.evidence}  # fmt: skip

    @classmethod
    def from_json(cls, raw: Any, path: str = "verdict") -> Verdict:
        doc = Doc(raw, path)
        verdict = doc.text("verdict", limit=MAX_TEXT)
        if verdict not in (PROMOTED, REJECTED, SUPERSEDED):
            raise Malformed(doc.at("verdict"), f"not one of {PROMOTED}, {REJECTED}, {SUPERSEDED}")
        evidence = doc.get("evidence")  # free-form, only shown: any object will do (loads bounded it)
        return cls(doc.text("sha256", default="", limit=MAX_TEXT), verdict, doc.number("at", *TIMES, default=0.0),
                   doc.text("by", default="", limit=MAX_TEXT), doc.text("reason", default=""),
                   evidence if isinstance(evidence, dict) else {})  # fmt: skip


@dataclass
class State:
    """One model's rollout state: the artifact the fleet serves (stable), the rollout in flight, past verdicts."""

    model: str
    stable: Artifact | None = None
    rollout: Rollout | None = None
    verdicts: list[Verdict] = field(default_factory=list)  # oldest first

    def decided(self, sha: str) -> Verdict | None:
        """The latest promotion or rejection of this artifact (a supersession decides nothing about it)."""
        return next((v for v in reversed(self.verdicts) if v.sha256 == sha and v.verdict != SUPERSEDED), None)

    def rejected(self, sha: str) -> Verdict | None:
        v = self.decided(sha)
        return v if v is not None and v.verdict == REJECTED else None

    def add(self, verdict: Verdict) -> None:
        self.verdicts = [*self.verdicts, verdict][-MAX_VERDICTS:]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "model": self.model,
            "stable": self.stable.to_json() if self.stable else None,
            "rollout": self.rollout.to_json() if self.rollout else None,
            "verdicts": [v.to_json() for v in self.verdicts],
        }

    @classmethod
    def from_json(cls, model: str, raw: Any) -> State:
        """Raises Malformed (a ValueError) naming the first field of the wrong shape."""
        doc = Doc(raw)
        if doc.get("format") != 1 or doc.get("model") != model:
            raise Malformed("", "not a rollout state of this model (format 1)")
        verdicts = doc.items("verdicts")
        return cls(
            model,
            Artifact.from_json(doc.get("stable"), "stable") if doc.has("stable") else None,
            Rollout.from_json(doc.get("rollout"), "rollout") if doc.has("rollout") else None,
            [Verdict.from_json(v, f"verdicts[{i}]") for i, v in enumerate(verdicts)][-MAX_VERDICTS:],
        )

    def copy(self) -> State:
        """A deep enough copy to modify and write (participants and verdicts are new containers)."""
        rollout = None
        if self.rollout is not None:
            rollout = replace(
                self.rollout,
                participants={h: replace(p) for h, p in self.rollout.participants.items()},
                crashes=list(self.rollout.crashes),
            )
        return State(self.model, self.stable, rollout, list(self.verdicts))


def _window(doc: Doc, key: str) -> Window | None:
    """A participant's window: finite counters in range (sums of them stay finite), or None when absent."""
    if not doc.has(key):
        return None
    w = doc.doc(key)
    for name in ("successes", "failures", "duration_us"):
        w.number(name, *COUNTS, default=0.0)
    w.optional_number("p95_ms", *COUNTS)
    return Window.from_json(w.raw)


def _snapshot(raw: Any, path: str) -> Snapshot:
    """Counters at a window's start: three finite counters (success, failure, duration) per model version."""
    if raw is None:
        return {}
    doc = Doc(raw, path)
    for i, sample in enumerate(doc.raw.values()):  # by index: a key may be anything
        values = items(sample, f"{path}#{i}")
        if len(values) != 3:
            raise Malformed(f"{path}#{i}", "not 3 counters")
        for j, value in enumerate(values):
            number(value, f"{path}#{i}[{j}]", *COUNTS)
    return snapshot_from_json(doc.raw)


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", "")) or str(
            response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
    return ""


class Ledger:
    """Reads and writes the state objects of one bucket prefix; keeps S3's clock."""

    def __init__(self, client: Any, bucket: str, prefix: str, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.clock = clock
        # S3's clock minus ours lies in [lo, hi]: each answer's Date (whole seconds) narrows it down.
        self._lo, self._hi = -math.inf, math.inf
        self._last = -math.inf
        self._clock_lock = threading.Lock()

    def now(self) -> float:
        """Unix time on S3's clock: ours plus the offset its answers' Date headers allow, never going back."""
        with self._clock_lock:
            offset = (self._lo + self._hi) / 2 if math.isfinite(self._lo + self._hi) else 0.0
            self._last = max(self._last, self.clock() + offset)
            return self._last

    def _note_clock(self, resp: Any) -> None:
        """A Date of D seconds was stamped at some instant of [D, D + 1) by S3's clock, before we read it: the
        offset is at least D - (our time now) and at most D + 1 - (our time now) + a little latency. The
        bounds of successive answers are intersected; bounds that do not meet mean a clock jumped: start over."""
        try:
            date = parsedate_to_datetime(resp["ResponseMetadata"]["HTTPHeaders"]["date"]).timestamp()
        except (KeyError, TypeError, ValueError, IndexError):
            return
        local = self.clock()
        lo, hi = date - local, date + 1.0 - local + CLOCK_LATENCY
        with self._clock_lock:
            if max(lo, self._lo) > min(hi, self._hi):
                self._lo, self._hi = lo, hi
            else:
                self._lo, self._hi = max(lo, self._lo), min(hi, self._hi)

    def key(self, model: str) -> str:
        return state_key(self.prefix, model)

    def read(self, model: str) -> tuple[State | None, str]:
        """(the state, its ETag), or (None, "") when there is none; raises LedgerError."""
        key = self.key(model)
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            self._note_clock(resp)
            if int(resp.get("ContentLength") or 0) > MAX_STATE:
                raise LedgerError(f"s3://{self.bucket}/{key} is larger than {MAX_STATE} bytes: not a rollout state")
            body = resp["Body"].read(MAX_STATE + 1)
        except LedgerError:
            raise
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                self._note_clock(getattr(exc, "response", {}))
                return None, ""
            raise LedgerError(
                f"cannot read s3://{self.bucket}/{key}: {_code(exc) or type(exc).__name__}: {exc}"
            ) from exc
        try:
            state = State.from_json(model, loads(body, MAX_STATE))
        except (ValueError, TypeError, KeyError, ArithmeticError, RecursionError) as exc:  # Malformed is a ValueError
            raise InvalidState(
                f"s3://{self.bucket}/{key} is not a valid rollout state ({exc}): fix or delete it, or run "
                f"python -m modelsync rollout promote|reject {model} to rewrite it"
            ) from exc
        return state, str(resp.get("ETag", ""))

    def write(self, state: State, etag: str) -> str:
        """Replace the state read with ``etag`` ("" : create it only if absent); the new ETag. Raises Conflict
        when another writer came first, LedgerError when S3 refused or failed."""
        key = self.key(state.model)
        body = json.dumps(state.to_json(), separators=(",", ":"), sort_keys=True).encode()
        condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        try:
            resp = self.client.put_object(
                Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", **condition
            )
        except Exception as exc:
            code = _code(exc)
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                self._note_clock(getattr(exc, "response", {}))
                raise Conflict(key) from None
            raise LedgerError(f"cannot write s3://{self.bucket}/{key}: {code or type(exc).__name__}: {exc}") from exc
        self._note_clock(resp)
        return str(resp.get("ETag", ""))

    def models(self) -> list[str]:
        """Every model with a state object; raises LedgerError."""
        head = self.prefix + STATE_DIR
        out: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=head):
                for obj in page.get("Contents", []):
                    model = model_of_state(obj["Key"], self.prefix)
                    if model is not None:
                        out.append(model)
        except Exception as exc:
            raise LedgerError(f"cannot list s3://{self.bucket}/{head}: {_code(exc) or type(exc).__name__}") from exc
        return sorted(out)

    # --- the stable copy: what a new host installs whatever the state says --------------------------------

    def copy_key(self, model: str) -> str:
        return f"{self.prefix}{STABLE_DIR}{model}.json"

    def read_copy(self, model: str) -> Copy | None:
        """The last stable artifact the controller published for ``model`` (None: none yet); raises LedgerError."""
        key = self.copy_key(model)
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            body = resp["Body"].read(MAX_STATE + 1)
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            raise LedgerError(f"cannot read s3://{self.bucket}/{key}: {_code(exc) or type(exc).__name__}") from exc
        try:
            return Copy.from_json(model, loads(body, MAX_STATE))
        except (ValueError, TypeError, KeyError, ArithmeticError, RecursionError) as exc:
            raise InvalidState(f"s3://{self.bucket}/{key} is not a valid stable copy ({exc})") from exc

    def write_copy(self, state: State) -> None:
        """Publish the state's stable artifact and rejections (the controller, after each verdict); LedgerError."""
        if state.stable is None:
            return
        key = self.copy_key(state.model)
        body = json.dumps(Copy.of(state).to_json(), separators=(",", ":"), sort_keys=True).encode()
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")
        except Exception as exc:
            raise LedgerError(f"cannot write s3://{self.bucket}/{key}: {_code(exc) or type(exc).__name__}") from exc


@dataclass(frozen=True)
class Copy:
    """``<prefix>.modelsync/stable/<model>.json``: the stable artifact and the rejected sha256s, published by the
    controller beside the state. A state that does not parse or validate (or a hand-edited ``"stable": null``)
    never bypasses a rejection nor blocks a new host: the daemons and the controller fall back to this copy."""

    model: str
    stable: Artifact
    rejected: tuple[str, ...] = ()

    @classmethod
    def of(cls, state: State) -> Copy:
        assert state.stable is not None
        shas = {v.sha256 for v in state.verdicts}
        rejected = tuple(sorted(s for s in shas if state.rejected(s) is not None and s != state.stable.sha256))
        return cls(state.model, state.stable, rejected)

    def to_json(self) -> dict[str, Any]:
        return {"format": 1, "model": self.model, "stable": self.stable.to_json(), "rejected": list(self.rejected)}

    @classmethod
    def from_json(cls, model: str, raw: Any) -> Copy:
        doc = Doc(raw)
        if doc.get("format") != 1 or doc.get("model") != model:
            raise Malformed("", "not a stable copy of this model (format 1)")
        rejected = tuple(text(s, f"rejected[{i}]", MAX_TEXT) for i, s in enumerate(doc.items("rejected")))
        return cls(model, Artifact.from_json(doc.get("stable"), "stable"), rejected[:MAX_VERDICTS])

    def state(self, at: float) -> State:
        """A state rebuilt from the copy: its stable artifact, its rejections (the repair's starting point)."""
        verdicts = [
            Verdict(s, REJECTED, at, "controller", "rejected before the state was repaired") for s in self.rejected
        ]
        return State(self.model, self.stable, None, verdicts)
