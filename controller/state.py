"""What the controller decided, kept as one small JSON object so that a restarted controller resumes.

The state holds the instances it is draining or replacing and those waiting their turn (in order), the
drains started in the last hour, the instances that reported a draining fault in the last hour, and the
pause. It lives in S3 (:class:`S3Store`, ``--state-bucket``/``--state-key``) or in a file
(:class:`FileStore`, ``--state-file``: one host, tests). Every write is conditional on the version read
(S3 ``If-Match``/``If-None-Match``; the file's digest), so ``python -m controller resume`` and a running
controller never overwrite each other: the loser reads again and retries on its next pass.

A state that does not validate is never guessed at: the controller starts paused, says why, and an
operator's ``resume`` writes a fresh one (docs/controller.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from telemetry.shapes import Doc, Malformed, loads

MAX_STATE_BYTES = 1 << 20
MAX_ENTRIES = 5000
MAX_EVIDENCE = 4  # reports kept per instance (the first ones; later ones are counted)
PHASES = ("waiting", "draining", "replacing", "manual")


class Conflict(Exception):
    """Someone else wrote the state since it was read."""


class StoreError(Exception):
    """The state could not be read or written (the message says why)."""


@dataclass
class Entry:
    """One instance the controller is taking out of service, or will."""

    container_instance: str
    ec2_instance: str
    phase: str  # waiting | draining | replacing | manual
    seq: int  # its turn: lower goes first
    reported_at: float
    reason: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    reports: int = 1
    drain_started_at: float | None = None
    replace_started_at: float | None = None
    waiting_why: str = ""  # the last reason it was logged as waiting for

    def holds_a_slot(self) -> bool:
        return self.phase != "waiting"


@dataclass
class State:
    seq: int = 0
    paused: dict[str, Any] | None = None  # {"since": t, "reason": "..."}
    entries: dict[str, Entry] = field(default_factory=dict)  # container instance ARN -> entry
    drains: list[float] = field(default_factory=list)  # drains started, last hour
    reporters: dict[str, float] = field(default_factory=dict)  # container instance ARN -> last draining report
    done: dict[str, float] = field(default_factory=dict)  # container instance ARN -> finished at (a day)

    def to_json(self) -> bytes:
        data = asdict(self)
        data["version"] = 1
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> State:
        """Raises Malformed naming the field."""
        doc = Doc(loads(data, MAX_STATE_BYTES))
        doc.integer("version", 1, 1)
        paused = doc.optional_doc("paused")
        state = cls(
            seq=doc.integer("seq", 0, 2**53),
            paused={
                "since": paused.number("since", 0, 1e11),
                "reason": paused.text("reason", limit=2048, printable=True),
            }
            if paused
            else None,
        )
        entries = doc.optional_doc("entries") or Doc({}, "entries")
        if len(entries.raw) > MAX_ENTRIES:
            raise Malformed("entries", f"more than {MAX_ENTRIES} entries")
        for key in entries.raw:
            e = entries.doc(key)
            phase = e.text("phase", limit=16, printable=True)
            if phase not in PHASES:
                raise Malformed(e.at("phase"), f"{phase[:20]!r} is not one of {', '.join(PHASES)}")
            evidence = e.items("evidence", MAX_EVIDENCE)
            if not all(isinstance(x, dict) for x in evidence):
                raise Malformed(e.at("evidence"), "not a list of objects")
            state.entries[key] = Entry(
                container_instance=e.text("container_instance", limit=2048, printable=True),
                ec2_instance=e.text("ec2_instance", limit=64, printable=True),
                phase=phase,
                seq=e.integer("seq", 0, 2**53),
                reported_at=e.number("reported_at", 0, 1e11),
                reason=e.text("reason", limit=2048, default="", printable=True),
                evidence=evidence,
                reports=e.integer("reports", 0, 2**53, default=1),
                drain_started_at=e.number("drain_started_at", 0, 1e11) if e.has("drain_started_at") else None,
                replace_started_at=e.number("replace_started_at", 0, 1e11) if e.has("replace_started_at") else None,
                waiting_why=e.text("waiting_why", limit=512, default="", printable=True),
            )
        state.drains = [_time(x, "drains") for x in doc.items("drains", MAX_ENTRIES)]
        for name in ("reporters", "done"):
            table = doc.optional_doc(name)
            if table is not None:
                if len(table.raw) > MAX_ENTRIES:
                    raise Malformed(name, f"more than {MAX_ENTRIES} entries")
                setattr(state, name, {k: table.number(k, 0, 1e11) for k in table.raw})
        return state


def _time(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e11:
        raise Malformed(path, "not a time")
    return float(value)


class Store(Protocol):
    """Where the state lives: read with a version, write only over that version."""

    where: str

    def load(self) -> tuple[bytes | None, str]:
        """(the stored bytes or None when there is no state yet, its version); raises StoreError."""
        ...

    def save(self, data: bytes, version: str) -> str:
        """Write over ``version`` ("" : only if absent); the new version. Raises Conflict or StoreError."""
        ...


class FileStore:
    """A file, replaced atomically; the version is the content's digest."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)

    def load(self) -> tuple[bytes | None, str]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None, ""
        except OSError as exc:
            raise StoreError(f"{self.path}: {exc.strerror or exc}") from None
        return data, hashlib.sha256(data).hexdigest()

    def save(self, data: bytes, version: str) -> str:
        current = self.load()[1]
        if current != version:
            raise Conflict(f"{self.path} changed since it was read")
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            raise StoreError(f"{self.path}: {exc.strerror or exc}") from None
        return hashlib.sha256(data).hexdigest()


class S3Store:
    """An S3 object written with ``If-Match`` (or ``If-None-Match: *`` when there is none yet)."""

    def __init__(self, bucket: str, key: str, s3: Any = None) -> None:
        from .fleet import boto_client

        self.bucket, self.key = bucket, key
        self.s3 = s3 if s3 is not None else boto_client("s3")
        self.where = f"s3://{bucket}/{key}"

    def load(self) -> tuple[bytes | None, str]:
        from .fleet import error_text

        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=self.key)
            body = got["Body"].read(MAX_STATE_BYTES + 1)
        except Exception as exc:
            text = error_text(exc)
            if text.startswith(("NoSuchKey", "404")):
                return None, ""
            raise StoreError(f"{self.where}: s3:GetObject: {text}") from None
        return body, str(got.get("ETag", ""))

    def save(self, data: bytes, version: str) -> str:
        from .fleet import error_text

        condition = {"IfMatch": version} if version else {"IfNoneMatch": "*"}
        try:
            got = self.s3.put_object(
                Bucket=self.bucket, Key=self.key, Body=data, ContentType="application/json", **condition
            )
        except Exception as exc:
            text = error_text(exc)
            if text.startswith(("PreconditionFailed", "ConditionalRequestConflict", "412", "409")):
                raise Conflict(f"{self.where} changed since it was read ({text})") from None
            raise StoreError(f"{self.where}: s3:PutObject: {text}") from None
        return str(got.get("ETag", ""))
