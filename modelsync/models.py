"""Single models (a zip or a directory with a manifest): the install protocol over the store's links.

An install, in phases (each timed on the attempt):

    download  HEAD (version id, expected sha256), free-space check, GET pinned, streamed and hashed
    verify    sha256 and length, then the archive's central directory or the manifest's checks
    extract   into staging, fsync'd, renamed into <store>/<model>/<sha256>
    swap      the link flipped atomically
    load      Triton load call, READY confirmed; on failure the link flips back

How the store directory is fetched is the only difference between the two kinds: zipmodel.py extracts an
archive, dirmodel.py downloads only the files that changed. Several repositories may share one store (the
Triton tasks of one instance): an archive another repository already extracted is linked instead of
downloaded again (``Store.claim`` and ``Store.reusable``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from . import signing
from .archive import Limits
from .dirmodel import DirectoryFetcher
from .errors import RolledBack, SyncError
from .fsio import FileSystem
from .install import ExpectedHash, Served
from .metrics import Attempt
from .pinning import free_check, pin, record_of
from .s3 import S3, Archive
from .settings import Settings
from .store import Installed, Store
from .triton import Triton
from .zipmodel import ZipFetcher


def served(installed: Installed) -> Served:
    record = installed.record
    return Served(
        installed.model,
        installed.sha256,
        str(record.get("etag") or ""),
        str(record.get("version_id") or ""),
        str(record.get("key") or ""),
    )


class Models:
    """The install protocol for one-link models (modelsync/install.py)."""

    removal = "removed %s: no longer in S3, unloaded and deleted"

    def __init__(
        self,
        settings: Settings,
        s3: S3,
        store: Store,
        triton: Triton,
        fs: FileSystem,
        log: logging.Logger,
        limits: Limits,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.s3 = s3
        self.store = store
        self.triton = triton
        self.fs = fs
        self.log = log
        self.limits = limits
        self.wall = wall
        self.signatures = signing.from_settings(settings, s3, limits)  # --require-signature, else None

    def current(self, name: str) -> Served | None:
        installed = self.store.current(name)
        return served(installed) if installed is not None else None

    def ready(self, current: Served) -> bool:
        return self.triton.ready(current.name)

    def ensure_loaded(self, current: Served) -> None:
        self.triton.load(current.name)

    def remove(self, name: str) -> None:
        self.triton.unload(name)
        self.store.remove_model(name)

    def install(self, name: str, listed: Archive, attempt: Attempt, expected_hash: ExpectedHash, load: bool) -> bool:
        """Download, verify, extract (or link what another repository of the store extracted), swap, load."""
        installed = self.store.current(name)
        with attempt.phase("download"):
            archive, expected, source = pin(self.s3, listed, self.settings, attempt, expected_hash)
            if installed is not None and expected and expected == installed.sha256:
                self._same_content(installed, archive)
                return False
        with self.store.claim(expected):  # one download per archive and store, whoever needs it first
            final = self.store.reusable(name, expected, installed) if expected else None
            if final is not None:
                attempt.reused = True
                self.log.info("%s: linking %s, already in the store (extracted by %s)", name, final.name,
                              final.record.get("host", "another task"))  # fmt: skip
                if final.record.get("etag") != archive.etag:
                    final = self.store.update_record(final, self._record_of(name, final.sha256, archive, source))
                path = final.path
            else:
                fetcher = (
                    DirectoryFetcher(self.s3, self.store, self.fs, self.limits, self._free_check, self.signatures)
                    if archive.directory  # <prefix><model>/manifest.json: the changed files straight into staging
                    else ZipFetcher(self.s3, self.store, self.fs, self.limits, self._free_check, self.signatures)
                )
                fetched = fetcher.fetch(
                    name, archive, installed, attempt, expected, source,
                    lambda sha: self._record_of(name, sha, archive, source),
                )  # fmt: skip
                if fetched is None:  # unverified, and byte for byte what is installed
                    assert installed is not None
                    self._same_content(installed, archive)
                    return False
                path = fetched
        with attempt.phase("swap"):
            try:
                self.store.flip(name, path)
            except (SyncError, OSError):
                self.store.discard(name, path)  # never linked: nothing may keep it
                raise
        attempt.serving = attempt.sha256
        if load:
            try:
                with attempt.phase("load"):
                    self.triton.load(name)
            except SyncError as exc:
                self._roll_back(name, path, installed, exc)
            attempt.upload_to_ready = self.wall() - archive.last_modified.timestamp()
        for removed in self.store.prune(name, keep_previous=self.settings.keep_previous):
            self.log.info("pruned %s/%s from the store", name, removed)
        return True

    def _free_check(self, need: int, what: str) -> None:
        free_check(self.fs, self.store.staging, self.store.root, self.settings, need, what)

    def _record_of(self, model: str, sha: str, archive: Archive, source: str) -> dict[str, object]:
        return {"model": model, **record_of(sha, archive, source, self.settings.host)}

    def _same_content(self, installed: Installed, archive: Archive) -> None:
        record = {
            **installed.record,
            "etag": archive.etag,
            "version_id": archive.version_id,
            "key": archive.key,
            "last_modified": archive.last_modified.isoformat(),
        }
        self.log.info("%s: new object, same sha256 %s: nothing to install", installed.model, installed.sha256)
        self.store.update_record(installed, record)

    def _roll_back(self, model: str, path: Path, installed: Installed | None, exc: SyncError) -> None:
        """The load failed: put the link back, so the disk matches what Triton serves, and drop the new dir."""
        self.store.flip(model, installed.path if installed else None)
        self.store.discard(model, path)
        if installed is None:
            raise exc
        raise RolledBack(
            f"{exc}; rolled back: {model} links to {installed.sha256} again, which Triton keeps serving",
            transient=exc.transient,
        ) from exc
