"""Refusals that survive a restart: the objects judged unsafe, on disk in the store.

Why: the reconcile's memo of failed archives (reconcile.py) lived in memory only. A daemon killed while it
judged a hostile archive (OOM), restarted, or replaced by a new task on the instance downloaded and judged the
same object again, on every host, at every start. A refusal of an object's bytes holds for as long as the
object does, so the store, which outlives the tasks of an instance, remembers it::

    <store>/.refused.json   {"refusals": [{"bucket", "key", "etag", "version_id", "result", "reason",
                                           "expected", "limits", "at"}, ...]}

An entry is found by bucket, key and ETag (what the listing gives; the same ETag is the same bytes), and holds
the version id the refusal saw: the reconcile checks it with one HEAD when it takes the entry up after a start,
so a new version is tried afresh even with the same bytes. ``limits`` are those the object was judged against:
an operator who raises ``--max-entries`` gets it judged again. Only errors marked ``remembered``
(modelsync/errors.py) are written.

Bounded: at most :data:`MAX_ENTRIES` entries (the oldest dropped), reasons cut to :data:`MAX_REASON`
characters; a file larger than :data:`MAX_FILE_BYTES` or unreadable is ignored (and replaced at the next
refusal). Written atomically (temporary file, fsync, rename, fsync of the directory) under an flock on
``<store>/.refused.lock``: the daemons of one instance share the store. A write that fails is logged and
the memo in memory still holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .fsio import LocalFileSystem, write_json

NAME = ".refused.json"
MAX_ENTRIES = 256
MAX_REASON = 1000
MAX_FILE_BYTES = 1024 * 1024  # MAX_ENTRIES entries of MAX_REASON characters take some 400 KB


@dataclass(frozen=True)
class Refusal:
    """One refused object version."""

    bucket: str
    key: str
    etag: str
    version_id: str
    result: str
    reason: str
    expected: str  # the sha256 it was checked against ("" when none): a hash mismatch is retried when it changes
    limits: list[float]  # what it was judged against (reconcile.py's fingerprint)
    at: float  # when (seconds since the epoch): the oldest go first


class Refusals:
    """The store's file of refusals, read on demand (parsed again only when it changed)."""

    def __init__(self, root: Path, log: logging.Logger) -> None:
        self.path = root / NAME
        self.log = log
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of the file last parsed
        self._entries: list[Refusal] = []

    def find(self, bucket: str, key: str, etag: str, limits: list[float]) -> Refusal | None:
        """The refusal of this object's bytes under these limits, if one was written."""
        for entry in self._read():
            if (entry.bucket, entry.key, entry.etag) == (bucket, key, etag) and entry.limits == limits:
                return entry
        return None

    def add(self, refusal: Refusal) -> None:
        """Remember ``refusal`` (replacing any other of the same key), keeping the newest MAX_ENTRIES."""
        kept = Refusal(**{**asdict(refusal), "reason": refusal.reason[:MAX_REASON]})
        self._update(lambda entries: [*_without(entries, kept.bucket, kept.key), kept])

    def forget(self, bucket: str, key: str) -> None:
        """Drop the refusals of ``key`` (it installed: whatever was refused there is history)."""
        if any((e.bucket, e.key) == (bucket, key) for e in self._read()):
            self._update(lambda entries: _without(entries, bucket, key))

    # --- the file -------------------------------------------------------------------------------

    def _read(self) -> list[Refusal]:
        try:
            st = self.path.stat()
        except OSError:
            self._seen, self._entries = None, []
            return []
        if self._seen == (st.st_mtime_ns, st.st_size):
            return self._entries
        self._seen, self._entries = (st.st_mtime_ns, st.st_size), _parse(self.path, st.st_size, self.log)
        return self._entries

    def _update(self, change: Callable[[list[Refusal]], list[Refusal]]) -> None:
        try:
            with self._locked():
                self._seen = None  # another daemon may have written since
                entries = sorted(change(self._read()), key=lambda e: e.at)[-MAX_ENTRIES:]
                write_json(LocalFileSystem(), self.path, {"refusals": [asdict(e) for e in entries]})
                self._seen = None
        except Exception as exc:  # bookkeeping: the memo in memory still refuses the object
            self.log.error("cannot write %s: %s (refusals are remembered in memory only)", self.path, exc)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _without(entries: list[Refusal], bucket: str, key: str) -> list[Refusal]:
    return [e for e in entries if (e.bucket, e.key) != (bucket, key)]


def _parse(path: Path, size: int, log: logging.Logger) -> list[Refusal]:
    """The entries of the file; none when it is larger than MAX_FILE_BYTES or not what this module writes."""
    if size > MAX_FILE_BYTES:
        log.warning("ignoring %s: %d bytes, more than %d", path, size, MAX_FILE_BYTES)
        return []
    try:
        with open(path, "rb") as f:
            items = json.loads(f.read(MAX_FILE_BYTES + 1))["refusals"]
        return [_entry(item) for item in items][-MAX_ENTRIES:]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return []


def _entry(item: dict[str, Any]) -> Refusal:
    text = {k: str(item[k]) for k in ("bucket", "key", "etag", "version_id", "result", "reason", "expected")}
    limits = [float(x) for x in item["limits"]]
    return Refusal(**text, limits=limits, at=float(item.get("at", 0.0)))
