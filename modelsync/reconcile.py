"""The reconcile: compare S3 with the store and Triton, and bring each model in sync.

A model is in sync when its link points at the directory extracted from the
archive S3 holds now (same ETag, or the same sha256 under a new ETag) and
Triton reports it READY. Otherwise one attempt runs, in phases:

    download  HEAD (version id, expected sha256), free-space check, GET pinned, streamed and hashed
    verify    sha256 and length, then the archive's central directory (archive.py)
    extract   into staging, fsync'd, renamed into <store>/<model>/<sha256>
    swap      the link flipped atomically
    load      Triton load call, READY confirmed; on failure the link flips back

Before the repository's first complete sync, and while Triton does not
answer (in the Triton task, Triton starts only once this daemon is healthy),
an attempt stops after the swap: Triton loads the links at its start
(``--load-model=*``). After the first sync, an install waits for Triton to
answer before it downloads anything, so a link never flips under a Triton
that is starting or down.

A model is an archive (``<prefix><model>.zip``) or a directory with a
manifest (``<prefix><model>/manifest.json``): ``_fetch`` hands the latter to
dirmodel.py, which downloads only the files that changed; the rest is the same.

Several repositories may share one store (the Triton tasks of one
instance): an archive another repository already extracted is linked
instead of downloaded again (``Store.claim`` and ``Store.reusable``).

Any failure leaves the link where it was (or puts it back) and Triton
serving what the disk says. A failure caused by the archive itself is
remembered and not retried until the object changes; one caused by the
surroundings (S3, disk, Triton down) is retried at the next reconcile.
"""

from __future__ import annotations

import logging
import shutil
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from .archive import Limits, extract, inspect
from .bundle import BundleConflict, Bundles, BundleState, is_bundle, top_level
from .dirmodel import DirectoryFetcher
from .errors import (
    DownloadError,
    Result,
    RolledBack,
    SyncError,
    UnsafeArchive,
)
from .fsio import FileSystem
from .health import Status
from .metrics import Attempt, ModelState, Recorder
from .pinning import free_check, pin, record_of, verify_hash
from .s3 import S3, Archive
from .settings import Settings
from .store import Installed, Store, model_name_problem
from .triton import Triton

TAG_POLL = 1.0


@dataclass
class Outcome:
    model: str
    in_sync: bool
    reason: str = ""
    result: str = ""  # the result of an attempt made in this reconcile ("" when none was needed)
    failed: bool = False  # counts against --once (a model in S3 that is not installed and READY)
    serving: str = ""
    expected: str = ""
    version_id: str = ""
    gone: bool = False  # removed from S3 and deleted here (--delete-removed): no longer a model of this host
    transient: bool = False  # failed for a reason outside the archive: retried, and the first sync is not complete


@dataclass
class Report:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    error: str = ""  # the listing itself failed

    @property
    def ok(self) -> bool:
        return not self.error and not any(o.failed for o in self.outcomes.values())

    @property
    def complete(self) -> bool:
        """Every model in S3 was dealt with: installed, or refused for a reason retrying cannot fix."""
        return not self.error and not any(o.transient for o in self.outcomes.values())


@dataclass(frozen=True)
class Memo:
    """A failed archive: not tried again while the object keeps this ETag (and expected hash)."""

    etag: str
    expected: str
    result: str
    reason: str


class Syncer:
    def __init__(
        self,
        settings: Settings,
        s3: S3,
        store: Store,
        triton: Triton,
        recorder: Recorder,
        fs: FileSystem,
        log: logging.Logger,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        status: Status | None = None,
    ) -> None:
        self.settings = settings
        self.s3 = s3
        self.store = store
        self.triton = triton
        self.recorder = recorder
        self.fs = fs
        self.log = log
        self.wall = wall
        self.sleep = sleep
        self.limits = Limits(settings.max_entries, settings.max_extracted_bytes, settings.max_ratio)
        self.failed: dict[str, Memo] = {}
        self.last_success: float | None = None
        self.attempts = 0
        # Written by the daemon (health.py reads it); its first_sync survives restarts of the daemon.
        self.status = status or Status(first_sync=wall())
        self.triton_up = True  # asked once per pass
        self.bundles = Bundles(settings, s3, store, triton, fs, log, self.limits)  # zips of several models

    @property
    def before_first_sync(self) -> bool:
        return self.status.first_sync is None

    # --- entry points -----------------------------------------------------------------------

    def recover(self) -> list[str]:
        done = self.store.recover() + self.bundles.recover()
        for line in done:
            self.log.warning("recovery: %s", line)
        return done

    def reconcile_all(self) -> Report:
        """One full pass: every archive under the prefix, every installed model."""
        report = Report()
        self.triton_up = self.triton.live()
        try:
            listing = self.s3.list()
        except DownloadError as exc:
            report.error = str(exc)
            self.log.error("%s", exc)
            self._after_pass(report, 0)
            self._host_event(None)
            return report
        for key, why in sorted(listing.ignored.items()):
            self.log.debug("ignored s3 key %s: %s", key, why)
        for model, archive in sorted(listing.archives.items()):
            report.outcomes[model] = self._guarded(model, partial(self._reconcile, model, archive, False))
        for model in self.store.managed_models():
            if model not in listing.archives:
                report.outcomes[model] = self._guarded(model, partial(self._removed, model))
        for name in self.bundles.names():
            if name not in listing.archives:
                report.outcomes[name] = self._guarded(name, partial(self._bundle_removed, name))
        for outcome in report.outcomes.values():
            self._state_event(outcome)
        if report.ok and all(o.in_sync for m, o in report.outcomes.items() if m in listing.archives):
            self.last_success = self.wall()
        self._after_pass(report, len(listing.archives))
        self._host_event(report)
        return report

    def _after_pass(self, report: Report, models: int) -> None:
        """Record the pass in the status file; the first complete one is what makes the daemon healthy."""
        now = self.wall()
        self.status.last_reconcile = now
        if self.before_first_sync:
            if report.complete:
                self.status.first_sync, self.status.note = now, ""
                self.log.info("first sync complete: %d models in S3", models)
            else:
                waiting = sorted(m for m, o in report.outcomes.items() if o.transient)
                first = report.outcomes[waiting[0]].reason if waiting else ""
                self.status.note = report.error or f"retrying {', '.join(waiting[:5])}: {first}"
        try:
            self.status.write(self.store.repository)
        except OSError as exc:
            self.log.error("cannot write the status file: %s", exc)

    def reconcile_models(self, models: Iterable[str], wait_for_tag: bool = True) -> dict[str, Outcome]:
        """Reconcile only these models (an event named them); the listing of their key decides."""
        out: dict[str, Outcome] = {}
        self.triton_up = self.triton.live()
        for model in models:
            try:
                archive = self.s3.find(model)
            except DownloadError as exc:
                self.log.error("%s", exc)
                continue
            if archive is not None:
                out[model] = self._guarded(model, partial(self._reconcile, model, archive, wait_for_tag))
            elif self.store.current(model) is not None:
                out[model] = self._guarded(model, partial(self._removed, model))
            elif self.bundles.current(model) is not None:
                out[model] = self._guarded(model, partial(self._bundle_removed, model))
            else:
                continue
            self._state_event(out[model])
        return out

    # --- one model --------------------------------------------------------------------------

    def _guarded(self, model: str, work: Callable[[], Outcome]) -> Outcome:
        """A bug or an unexpected OS error in one model must not stop the others."""
        try:
            return work()
        except Exception as exc:
            self.log.exception("sync of %s failed unexpectedly", model)
            current = self.store.current(model)
            return Outcome(
                model,
                False,
                f"unexpected error: {type(exc).__name__}: {exc}",
                failed=True,
                serving=current.sha256 if current else "",
                transient=True,
            )

    def _staged(self, model: str, installed: Installed) -> Outcome:
        """Installed before Triton's first start: in sync only once Triton loaded it."""
        return Outcome(
            model,
            False,
            "installed; Triton is not running yet and loads it at its start",
            serving=installed.sha256,
            expected=installed.sha256,
            version_id=str(installed.record.get("version_id") or ""),
        )

    def _reconcile(self, model: str, archive: Archive, wait_for_tag: bool) -> Outcome:
        problem = model_name_problem(model) or archive.conflict
        if problem:
            return self._fail_once(model, archive, UnsafeArchive(problem))
        installed = self.store.current(model)
        serving = installed.sha256 if installed else ""
        try:  # a zip of several models is a bundle (bundle.py): its models switch together
            parts = (
                None  # a manifest is no zip: nothing to peek at, unless a bundle has this name (refused there)
                if archive.directory and self.bundles.current(model) is None
                else self.bundles.parts(model, archive, installed is not None)
            )
        except SyncError as exc:  # the zip's directory could not be read: an attempt that failed to download
            return self._failed(model, archive, Attempt(model, Result.OK, key=archive.key, etag=archive.etag), exc)
        if parts is not None:
            return self._reconcile_bundle(model, archive, wait_for_tag)
        owner = self.bundles.owner(model)
        if owner is not None:
            return self._fail_once(model, archive, BundleConflict(f"{archive.key} holds model {model}, which "
                                                                  f"already belongs to bundle {owner}"))  # fmt: skip
        staging_start = not self.triton_up and self.before_first_sync
        if installed is not None and installed.record.get("etag") == archive.etag:
            return self._staged(model, installed) if staging_start else self._ensure_loaded(model, installed, archive)
        memo = self.failed.get(model)
        if memo is not None and memo.etag == archive.etag and not self._memo_outdated(memo, archive):
            return Outcome(model, False, memo.reason, failed=True, serving=serving, expected=memo.expected)
        if not self.triton_up and not staging_start:
            reason = (
                f"Triton at {self.triton.url} does not answer: not installing {archive.key} until it does "
                "(retried at the next reconcile)"
            )
            self.log.warning("%s: %s", model, reason)
            return Outcome(model, False, reason, result=Result.LOAD_FAILED, failed=True, serving=serving,
                           transient=True)  # fmt: skip
        attempt = Attempt(model, Result.OK, key=archive.key, etag=archive.etag, serving=serving)
        try:
            same = self._install(model, archive, installed, attempt, wait_for_tag, load=not staging_start)
        except SyncError as exc:
            return self._failed(model, archive, attempt, exc)
        if same is not None:  # the same archive content under a new object: nothing to install
            return self._staged(model, same) if staging_start else self._ensure_loaded(model, same, archive)
        self.failed.pop(model, None)
        self._record(attempt)
        if staging_start:
            current = self.store.current(model)
            assert current is not None
            return self._staged(model, current)
        return Outcome(
            model,
            True,
            result=Result.OK,
            serving=attempt.serving,
            expected=attempt.sha256,
            version_id=attempt.version_id,
        )

    def _reconcile_bundle(self, name: str, archive: Archive, wait_for_tag: bool) -> Outcome:
        """A bundle: one attempt, one outcome and one memo under the bundle's name (bundle.py does the work)."""
        current = self.bundles.current(name)
        single = self.store.current(name)
        serving = current.sha256 if current else (single.sha256 if single else "")
        staging_start = not self.triton_up and self.before_first_sync
        if current is not None and current.etag == archive.etag:
            return self._bundle_loaded(name, current, staging_start)
        memo = self.failed.get(name)
        if memo is not None and memo.etag == archive.etag and not self._memo_outdated(memo, archive):
            return Outcome(name, False, memo.reason, failed=True, serving=serving, expected=memo.expected)
        if not self.triton_up and not staging_start:
            reason = f"Triton at {self.triton.url} does not answer: not installing {archive.key} until it does"
            return Outcome(name, False, reason, result=Result.LOAD_FAILED, failed=True, serving=serving,
                           transient=True)  # fmt: skip
        attempt = Attempt(name, Result.OK, key=archive.key, etag=archive.etag, serving=serving)
        try:
            changed = self.bundles.install(
                name, archive, attempt, partial(self._expected_hash, wait_for_tag=wait_for_tag), not staging_start
            )
        except SyncError as exc:
            now = self.bundles.current(name)
            attempt.result, attempt.reason = exc.result, str(exc)
            attempt.serving = now.sha256 if now else serving
            self._record(attempt)
            if not exc.transient:
                self.failed[name] = Memo(archive.etag, attempt.sha256, exc.result, str(exc))
            return Outcome(name, False, str(exc), result=exc.result, failed=True, serving=attempt.serving,
                           expected=attempt.sha256, version_id=attempt.version_id, transient=exc.transient)  # fmt: skip
        installed = self.bundles.current(name)
        assert installed is not None
        if not changed:
            return self._bundle_loaded(name, installed, staging_start)
        self.failed.pop(name, None)
        self._record(attempt)
        if staging_start:
            return self._bundle_loaded(name, installed, staging_start)
        return Outcome(name, True, result=Result.OK, serving=installed.sha256, expected=installed.sha256,
                       version_id=installed.version_id)  # fmt: skip

    def _bundle_loaded(self, name: str, state: BundleState, staging_start: bool) -> Outcome:
        sha, version = state.sha256, state.version_id
        if staging_start:
            return Outcome(name, False, "installed; Triton is not running yet and loads it at its start",
                           serving=sha, expected=sha, version_id=version)  # fmt: skip
        if self.bundles.ready(state):
            return Outcome(name, True, serving=sha, expected=sha, version_id=version)
        attempt = Attempt(name, Result.OK, key=str(state.record.get("key", "")), etag=state.etag, serving=sha,
                          sha256=sha, version_id=version)  # fmt: skip
        try:
            with attempt.phase("load"):
                self.bundles.ensure_loaded(state)
        except SyncError as exc:
            attempt.result, attempt.reason = exc.result, str(exc)
            self._record(attempt)
            return Outcome(name, False, str(exc), result=exc.result, failed=True, serving=sha, expected=sha,
                           version_id=version, transient=exc.transient)  # fmt: skip
        self._record(attempt)
        return Outcome(name, True, result=Result.OK, serving=sha, expected=sha, version_id=version)

    def _memo_outdated(self, memo: Memo, archive: Archive) -> bool:
        """A hash mismatch against a tag is retried when the tag changes (metadata cannot change)."""
        if memo.result != Result.HASH_MISMATCH:
            return False
        try:
            head = self.s3.head(archive)
        except DownloadError:
            return False
        return (head.sha256 or self.s3.tag_hash(head)) != memo.expected

    def _ensure_loaded(self, model: str, installed: Installed, archive: Archive) -> Outcome:
        version = str(installed.record.get("version_id") or "")

        def failed(exc: SyncError) -> Outcome:
            return Outcome(model, False, str(exc), result=exc.result, failed=True, serving=installed.sha256,
                           expected=installed.sha256, version_id=version, transient=exc.transient)  # fmt: skip

        try:
            ready = self.triton.ready(model)
        except SyncError as exc:  # Triton down or restarting: nothing to attempt now, retried next pass
            return failed(exc)
        if ready:
            return Outcome(model, True, serving=installed.sha256, expected=installed.sha256, version_id=version)
        attempt = Attempt(
            model,
            Result.OK,
            key=archive.key,
            etag=archive.etag,
            serving=installed.sha256,
            sha256=installed.sha256,
            version_id=version,
        )
        try:
            with attempt.phase("load"):
                self.triton.load(model)
        except SyncError as exc:  # nothing was flipped: the disk already holds what Triton should serve
            attempt.result, attempt.reason = exc.result, str(exc)
            self._record(attempt)
            return failed(exc)
        self._record(attempt)
        return Outcome(
            model, True, result=Result.OK, serving=installed.sha256, expected=installed.sha256, version_id=version
        )

    def _bundle_removed(self, name: str) -> Outcome:
        state = self.bundles.current(name)
        serving = state.sha256 if state else ""
        if not self.settings.delete_removed:
            return Outcome(name, False, "no longer in S3; kept (run with --delete-removed to unload and delete it)",
                           serving=serving)  # fmt: skip
        try:
            self.bundles.remove(name)
        except SyncError as exc:
            return Outcome(name, False, f"no longer in S3; unload failed: {exc}", failed=True, serving=serving,
                           transient=True)  # fmt: skip
        self.log.info("removed bundle %s: no longer in S3, its models unloaded and deleted", name)
        return Outcome(name, True, "removed: no longer in S3, unloaded and deleted", gone=True)

    def _removed(self, model: str) -> Outcome:
        current = self.store.current(model)
        serving = current.sha256 if current else ""
        if not self.settings.delete_removed:
            return Outcome(
                model,
                False,
                "no longer in S3; kept (run with --delete-removed to unload and delete it)",
                serving=serving,
            )
        try:
            self.triton.unload(model)
        except SyncError as exc:
            return Outcome(model, False, f"no longer in S3; unload failed: {exc}", failed=True, serving=serving,
                           transient=True)  # fmt: skip
        self.store.remove_model(model)
        self.log.info("removed %s: no longer in S3, unloaded and deleted", model)
        return Outcome(model, True, "removed: no longer in S3, unloaded and deleted", gone=True)

    # --- the attempt ------------------------------------------------------------------------

    def _expected_hash(self, archive: Archive, wait_for_tag: bool) -> tuple[str, str]:
        if archive.sha256:
            return archive.sha256, "metadata"
        deadline = time.monotonic() + (self.settings.hash_tag_wait if wait_for_tag else 0.0)
        while True:
            tag = self.s3.tag_hash(archive)
            if tag:
                return tag, "tag"
            if time.monotonic() >= deadline:
                return "", ""
            self.sleep(TAG_POLL)

    def _free_check(self, need: int, what: str) -> None:
        free_check(self.fs, self.store.staging, self.store.root, self.settings, need, what)

    def _install(
        self,
        model: str,
        listed: Archive,
        installed: Installed | None,
        attempt: Attempt,
        wait_for_tag: bool,
        load: bool = True,
    ) -> Installed | None:
        """Download, verify, extract (or link what another repository of the store extracted), swap, load.
        Returns the installed record when nothing had to change."""
        with attempt.phase("download"):
            archive, expected, source = pin(
                self.s3, listed, self.settings, attempt, partial(self._expected_hash, wait_for_tag=wait_for_tag)
            )
            if installed is not None and expected and expected == installed.sha256:
                return self._same_content(installed, archive)
        with self.store.claim(expected):  # one download per archive and store, whoever needs it first
            final = self.store.reusable(model, expected, installed) if expected else None
            if final is not None:
                attempt.reused = True
                self.log.info("%s: linking %s, already in the store (extracted by %s)", model, final.name,
                              final.record.get("host", "another task"))  # fmt: skip
                if final.record.get("etag") != archive.etag:
                    final = self.store.update_record(final, self._record_of(model, final.sha256, archive, source))
                path = final.path
            else:
                same, path = self._fetch(model, archive, installed, attempt, expected, source)
                if same is not None:
                    return same
        sha = attempt.sha256
        with attempt.phase("swap"):
            try:
                self.store.flip(model, path)
            except (SyncError, OSError):
                self.store.discard(model, path)  # never linked: nothing may keep it
                raise
        attempt.serving = sha
        if load:
            try:
                with attempt.phase("load"):
                    self.triton.load(model)
            except SyncError as exc:
                self._roll_back(model, path, installed, exc)
            attempt.upload_to_ready = self.wall() - archive.last_modified.timestamp()
        for removed in self.store.prune(model, keep_previous=self.settings.keep_previous):
            self.log.info("pruned %s/%s from the store", model, removed)
        return None

    def _fetch(
        self, model: str, archive: Archive, installed: Installed | None, attempt: Attempt, expected: str, source: str
    ) -> tuple[Installed | None, Path]:
        """Download, verify and extract into the store; (the installed record, ...) when the bytes turn out to
        be what is installed already (an unverified archive)."""
        if archive.directory:  # <prefix><model>/manifest.json: the files straight into staging (dirmodel.py)
            fetcher = DirectoryFetcher(self.s3, self.store, self.fs, self.limits, self._free_check)
            record = partial(self._record_of, model, archive=archive, source=source)
            final = fetcher.fetch(model, archive, installed, attempt, expected, source, lambda sha: record(sha=sha))
            if final is None:  # an unverified manifest, byte for byte the installed one
                assert installed is not None
                return self._same_content(installed, archive), installed.path
            return None, final
        download: Path | None = None
        extracted: Path | None = None
        zf: zipfile.ZipFile | None = None
        try:
            with attempt.phase("download"):
                self._free_check(archive.size, f"downloading {archive.key}")
                download = self.store.staging_file(model)
                sha, count = self.s3.download(archive, download, self.fs)
                attempt.bytes_downloaded = count
            with attempt.phase("verify"):
                verify_hash(sha, expected, source, attempt)
                if installed is not None and sha == installed.sha256:  # unverified, and the same bytes
                    return self._same_content(installed, archive), installed.path
                try:
                    zf = zipfile.ZipFile(download)
                except (zipfile.BadZipFile, OSError) as exc:
                    raise UnsafeArchive(f"not a zip archive: {exc}") from exc
                if is_bundle(zf.namelist(), model):  # a single model's key keeps its kind (Bundles.parts)
                    top = ", ".join(sorted(top_level(zf.namelist()))[:5])
                    raise UnsafeArchive(
                        f"the archive's top level is {top}, not one {model}/ directory, and {model} is installed "
                        f"from {archive.key} as one model: a bundle goes under another name (or remove "
                        f"{archive.key} first, with --delete-removed, then upload it again)"
                    )
                plan = inspect(zf, count, model, self.limits)
            with attempt.phase("extract"):
                self._free_check(plan.disk_bytes(self.fs.block_size(self.store.staging)), f"extracting {model}")
                extracted = self.store.staging_dir(model)
                extract(zf, plan, extracted, self.fs)
                zf.close()
                zf = None
                download.unlink()
                download = None
                final = self.store.commit(model, sha, extracted, self._record_of(model, sha, archive, source))
                extracted = None
            return None, final
        finally:
            if zf is not None:
                zf.close()
            if download is not None:
                download.unlink(missing_ok=True)
            if extracted is not None:
                shutil.rmtree(extracted, ignore_errors=True)

    def _record_of(self, model: str, sha: str, archive: Archive, source: str) -> dict[str, object]:
        return {"model": model, **record_of(sha, archive, source, self.settings.host)}

    def _same_content(self, installed: Installed, archive: Archive) -> Installed:
        record = {
            **installed.record,
            "etag": archive.etag,
            "version_id": archive.version_id,
            "key": archive.key,
            "last_modified": archive.last_modified.isoformat(),
        }
        self.log.info("%s: new object, same sha256 %s: nothing to install", installed.model, installed.sha256)
        return self.store.update_record(installed, record)

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

    # --- bookkeeping ------------------------------------------------------------------------

    def _failed(self, model: str, archive: Archive, attempt: Attempt, exc: SyncError) -> Outcome:
        attempt.result, attempt.reason = exc.result, str(exc)
        current = self.store.current(model)
        attempt.serving = current.sha256 if current else ""
        self._record(attempt)
        if not exc.transient:
            self.failed[model] = Memo(archive.etag, attempt.sha256, exc.result, str(exc))
        return Outcome(
            model,
            False,
            str(exc),
            result=exc.result,
            failed=True,
            serving=attempt.serving,
            expected=attempt.sha256,
            version_id=attempt.version_id,
            transient=exc.transient,
        )

    def _fail_once(self, model: str, archive: Archive, exc: SyncError) -> Outcome:
        """A failure known from the listing alone (a bad name): one attempt event per object, not per pass."""
        memo = self.failed.get(model)
        if memo is None or memo.etag != archive.etag:
            attempt = Attempt(model, exc.result, str(exc), key=archive.key, etag=archive.etag)
            self._record(attempt)
            self.failed[model] = Memo(archive.etag, "", exc.result, str(exc))
        current = self.store.current(model)  # a conflict may appear after the model was installed: still served
        return Outcome(model, False, str(exc), failed=True, serving=current.sha256 if current else "")

    def _record(self, attempt: Attempt) -> None:
        self.attempts += 1
        total = sum(attempt.phases.values())
        fields = {
            "model": attempt.model,
            "result": str(attempt.result),
            "sha256": attempt.sha256,
            "s3_version_id": attempt.version_id,
            "seconds": round(total, 3),
            **{f"{p}_s": round(s, 3) for p, s in attempt.phases.items()},
        }
        if attempt.result == Result.OK:
            self.log.info("%s in sync: serving %s", attempt.model, attempt.serving, extra={"fields": fields})
        else:
            self.log.warning("%s: %s: %s", attempt.model, attempt.result, attempt.reason, extra={"fields": fields})
        self.recorder.attempt(attempt)

    def _state_event(self, o: Outcome) -> None:
        if o.gone:
            return
        self.recorder.model_state(ModelState(o.model, o.in_sync, o.serving, o.expected, o.version_id, o.reason))

    def _host_event(self, report: Report | None) -> None:
        since = None if self.last_success is None else self.wall() - self.last_success
        if report is None:
            self.recorder.host_state(None, None, since)
            return
        in_sync = sum(1 for o in report.outcomes.values() if o.in_sync and not o.gone)
        out = sum(1 for o in report.outcomes.values() if not o.in_sync)
        self.recorder.host_state(in_sync, out, since)
