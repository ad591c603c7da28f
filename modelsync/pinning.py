"""What every install does first and records last, whatever it installs (a model archive, a bundle).

- :func:`pin`: HEAD the listed object (its version id and metadata hash, or a failure if it changed since
  the listing), refuse it over ``--max-archive-bytes``, and find the hash it must have (metadata, else the
  tag); without one it is refused unless ``--allow-unverified``.
- :func:`verify_hash`: the downloaded bytes against the hash they must have.
- :func:`free_check`: refuse an install that would leave less than ``--min-free-bytes`` on the store's disk,
  before anything is written.
- :func:`record_of`: what the store records of the object an install came from.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from .errors import DiskFull, HashMismatch, MissingHash, UnsafeArchive
from .fsio import FileSystem
from .metrics import Attempt
from .s3 import S3, Archive
from .settings import Settings


def pin(
    s3: S3, listed: Archive, settings: Settings, attempt: Attempt, expected_hash: Callable[[Archive], tuple[str, str]]
) -> tuple[Archive, str, str]:
    """(the object as HEAD saw it, the sha256 it must have or "", where that came from)."""
    archive = s3.head(listed)
    attempt.version_id = archive.version_id
    if archive.size > settings.max_archive_bytes:
        raise UnsafeArchive(f"archive is {archive.size} bytes, above --max-archive-bytes {settings.max_archive_bytes}")
    expected, source = expected_hash(archive)
    attempt.sha256 = expected
    if not expected and not settings.allow_unverified:
        raise MissingHash(
            f"s3://{s3.bucket}/{archive.key} has no sha256 user metadata or tag "
            "(upload with --metadata sha256=<hex>, or run with --allow-unverified)"
        )
    return archive, expected, source


def verify_hash(sha: str, expected: str, source: str, attempt: Attempt, what: str = "") -> None:
    """The downloaded bytes' sha256 against the expected one (none: an unverified object); the attempt records
    the downloaded one. ``what`` names the object in the message (``manifest.json``) when not the archive."""
    if expected and sha != expected:
        raise HashMismatch(
            f"downloaded {what + ' ' if what else ''}sha256 {sha} differs from the expected {expected} "
            f"(object {source}); the installed version stays"
        )
    attempt.sha256 = sha


def free_check(fs: FileSystem, staging: Path, root: Path, settings: Settings, need: int, what: str) -> None:
    free = fs.free_bytes(staging)
    if free < need + settings.min_free_bytes:
        raise DiskFull(f"{what} needs {need} bytes plus {settings.min_free_bytes} headroom; {free} free on {root}")


def record_of(sha: str, archive: Archive, source: str, host: str) -> dict[str, object]:
    return {
        "sha256": sha,
        "key": archive.key,
        "etag": archive.etag,
        "version_id": archive.version_id,
        "hash_source": source or "unverified",
        "last_modified": archive.last_modified.isoformat(),
        "installed_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": host,
    }
