"""Typed sync failures, one per result name the metrics and the ``--once`` report use.

Every failure of one model's sync is a :class:`SyncError` whose ``result``
is the name that lands in the ``result`` dimension of ``SyncAttempts``; the
message is the reason shown to the operator. Nothing here is fatal to the
daemon: the reconcile loop records the failure and moves to the next model.
"""

from __future__ import annotations

from enum import StrEnum


class Result(StrEnum):
    """Outcome of one sync attempt (the ``result`` dimension)."""

    OK = "ok"
    HASH_MISMATCH = "hash_mismatch"
    MISSING_HASH = "missing_hash"
    DOWNLOAD_ERROR = "download_error"
    DISK_FULL = "disk_full"
    UNSAFE_ARCHIVE = "unsafe_archive"
    LOAD_FAILED = "load_failed"  # Triton refused the new version and there was nothing to roll back to
    ROLLED_BACK = "rolled_back"  # Triton refused the new version; the link points at the previous one again
    SIGNATURE_REFUSED = "signature_refused"  # --require-signature: no .sig, a bad one, another model's, a mismatch


class SyncError(Exception):
    """A model could not be brought in sync; ``result`` names why, the message says how."""

    result: Result = Result.DOWNLOAD_ERROR
    #: Worth retrying with the same archive at the next reconcile (the cause was outside the archive).
    transient: bool = False
    #: A verdict on the object's bytes, the same for as long as the object: remembered on disk across restarts
    #: (modelsync/refusals.py), so a restarted daemon does not download and judge it again.
    remembered: bool = False


class HashMismatch(SyncError):
    result = Result.HASH_MISMATCH  # not remembered on disk: it costs a download, not the daemon's memory


class MissingHash(SyncError):
    result = Result.MISSING_HASH
    transient = True  # a sha256 tag may still be added to the same object version


class DownloadError(SyncError):
    result = Result.DOWNLOAD_ERROR
    transient = True


class DiskFull(SyncError):
    result = Result.DISK_FULL
    transient = True


class UnsafeArchive(SyncError):
    result = Result.UNSAFE_ARCHIVE
    remembered = True


class LoadFailed(SyncError):
    """Triton answered the load call with an error (the archive's model does not load)."""

    result = Result.LOAD_FAILED


class TritonUnavailable(SyncError):
    """Triton could not be asked at all (connection refused, timeout): retried, never blamed on the archive."""

    result = Result.LOAD_FAILED
    transient = True


class RolledBack(SyncError):
    """The load failed and the link was flipped back: Triton keeps serving the previous version."""

    result = Result.ROLLED_BACK

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class SignatureRefused(SyncError):
    """``--require-signature`` (modelsync/signing.py): the artifact's ``.sig`` is missing, does not verify with
    the pinned key, names another model, is older than the rollout state's stable version, or its per-file
    digests are not the artifact's. Not retried until the artifact changes (or the daemon restarts: a ``.sig``
    uploaded after its artifact is read then); not remembered on disk, since the ``.sig`` may change."""

    result = Result.SIGNATURE_REFUSED
