"""The reconcile: compare S3 with the store and Triton, and bring each model or bundle in sync.

A name (a model, or a bundle of models) is in sync when what is installed under it came from the object S3
holds now (same ETag, or the same sha256 under a new ETag) and Triton serves it. Otherwise one attempt runs
through the install protocol (modelsync/install.py), the same for every kind of artifact: a model's zip
(zipmodel.py) or directory (dirmodel.py), both installed by models.py, or a bundle (bundle.py). The phases
of an attempt (download, verify, extract, swap, load) are the installers'; what is decided here is written
once for all of them:

- which installer a listed object belongs to (:meth:`Syncer._installer`: a key keeps its kind);
- a failure caused by the archive itself is remembered (:class:`Memo`) and not retried until the object
  changes; one caused by the surroundings (S3, disk, Triton down) is retried at the next reconcile. A verdict
  on the object's bytes (unsafe) is also written to the store (modelsync/refusals.py), so a
  restarted daemon, or a new task on the instance, does not download and judge it again;
- before the repository's first complete sync, and while Triton does not answer (in the Triton task,
  Triton starts only once this daemon is healthy), an attempt stops after the swap: Triton loads the links
  at its start (``--load-model=*``). After the first sync, an install waits for Triton to answer before it
  downloads anything, so a link never flips under a Triton that is starting or down;
- what is installed but not READY is loaded again; what left S3 is kept, or removed (--delete-removed).

Any failure leaves the installed artifact serving (or puts it back), and Triton serving what the disk says.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, field

from .archive import Limits
from .bundle import BundleConflict, Bundles, taken
from .errors import DownloadError, HashMismatch, MissingHash, Result, SyncError, UnsafeArchive
from .fsio import FileSystem
from .health import Status
from .install import ExpectedHash, Installer, Served
from .ledger import UntrustedArtifact
from .metrics import Attempt, ModelState, Recorder
from .models import Models
from .refusals import Refusal, Refusals
from .rollout import Plan, Rollouts
from .s3 import S3, Archive
from .settings import Settings
from .store import Store, model_name_problem
from .triton import Triton

TAG_POLL = 1.0
Listed = Callable[[str], Archive | None]  # a name -> the object S3 lists for it (its own key), None when none
NOT_STARTED = "installed; Triton is not running yet and loads it at its start"
KEPT = "no longer in S3; kept (run with --delete-removed to unload and delete it)"
REMOVED = "removed: no longer in S3, unloaded and deleted"


@dataclass
class Outcome:
    """One name at the end of a reconcile. Built only through the named constructors below."""

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

    @classmethod
    def synced(cls, served: Served, result: str = "") -> Outcome:
        """Installed from the object S3 holds and READY (``result``: the attempt that made it so, if any)."""
        return cls(served.name, True, result=result, serving=served.sha256, expected=served.sha256,
                   version_id=served.version_id)  # fmt: skip

    @classmethod
    def not_started(cls, served: Served) -> Outcome:
        """Installed before Triton's first start: in sync only once Triton loaded it."""
        return cls(served.name, False, NOT_STARTED, serving=served.sha256, expected=served.sha256,
                   version_id=served.version_id)  # fmt: skip

    @classmethod
    def failure(cls, name: str, exc: SyncError, serving: str, expected: str = "", version_id: str = "") -> Outcome:
        """An attempt (or Triton's readiness) failed; ``serving`` is what stays installed."""
        return cls(name, False, str(exc), result=exc.result, failed=True, serving=serving, expected=expected,
                   version_id=version_id, transient=exc.transient)  # fmt: skip

    @classmethod
    def refused(cls, name: str, reason: str, serving: str, expected: str = "") -> Outcome:
        """Not attempted: the listing alone, or a remembered failure of this very object, refuses it."""
        return cls(name, False, reason, failed=True, serving=serving, expected=expected)

    @classmethod
    def deferred(cls, name: str, reason: str, serving: str) -> Outcome:
        """Not attempted now for a reason outside the archive (Triton down, a bug): retried next pass."""
        return cls(name, False, reason, result=Result.LOAD_FAILED, failed=True, serving=serving, transient=True)

    @classmethod
    def unexpected(cls, name: str, exc: Exception, serving: str) -> Outcome:
        return cls(name, False, f"unexpected error: {type(exc).__name__}: {exc}", failed=True, serving=serving,
                   transient=True)  # fmt: skip

    @classmethod
    def held(cls, name: str, current: Served | None, plan: Plan) -> Outcome:
        """A rollout keeps this host on what it serves (the stable artifact while a canary bakes, or a rejected
        artifact's predecessor): in sync with what the fleet should serve here, unless the state could not
        be read (retried) or nothing is served yet."""
        if current is None or plan.transient:
            return cls(name, False, plan.reason, failed=True, serving=current.sha256 if current else "",
                       transient=plan.transient)  # fmt: skip
        return cls(name, True, plan.reason, serving=current.sha256, expected=current.sha256,
                   version_id=current.version_id)  # fmt: skip

    @classmethod
    def kept(cls, name: str, serving: str) -> Outcome:
        """Gone from S3, kept installed (no --delete-removed)."""
        return cls(name, False, KEPT, serving=serving)

    @classmethod
    def unload_failed(cls, name: str, exc: SyncError, serving: str) -> Outcome:
        return cls(name, False, f"no longer in S3; unload failed: {exc}", failed=True, serving=serving, transient=True)

    @classmethod
    def removed(cls, name: str) -> Outcome:
        return cls(name, True, REMOVED, gone=True)


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


def install_order(archives: dict[str, Archive], first: tuple[str, ...] = ()) -> list[str]:
    """The operator's order (``--model-order``) first, then the largest first (its bytes start arriving
    first: the longest download sets when the pass ends), then by name."""
    named = [m for m in dict.fromkeys(first) if m in archives]
    rest = sorted((m for m in archives if m not in set(named)), key=lambda m: (-archives[m].size, m))
    return [*named, *rest]


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
        self.log = log
        self.wall = wall
        self.sleep = sleep
        self.limits = Limits(settings.max_entries, settings.max_extracted_bytes, settings.max_ratio)
        self.failed: dict[str, Memo] = {}
        self.refusals = Refusals(store.root, log)  # the verdicts of self.failed that outlive this process
        self.judged_under = [  # what a remembered verdict depends on besides the bytes
            float(x) for x in (*astuple(self.limits), settings.max_archive_bytes)
        ]
        self.last_success: float | None = None
        self.attempts = 0
        # Written by the daemon (health.py reads it); its first_sync survives restarts of the daemon.
        self.status = status or Status(first_sync=wall())
        self.triton_up = True  # asked once per pass
        self.models = Models(settings, s3, store, triton, fs, log, self.limits, wall)  # zips and directories
        self.bundles = Bundles(settings, s3, store, triton, fs, log, self.limits)  # zips of several models
        self.rollouts: Rollouts | None = None  # --canary-fraction: what to install is the rollout's to say
        self._untrusted_seen: dict[str, tuple[str, str, str, str]] = {}  # name -> the state artifact last refused
        self._listing_refused: dict[str, tuple[str, str]] = {}  # name -> (ETag, reason) of its last listing refusal
        self._serial = threading.Lock()  # bundles install one at a time (one holds several models' names)

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
        """One full pass: every archive under the prefix, every installed model and bundle."""
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
        order = install_order(listing.archives, self.settings.model_order)
        report.outcomes.update(self._each(order, lambda m: self._one(m, listing.archives[m], listing.archives.get)))
        for name in [*self.store.managed_models(), *self.bundles.names()]:
            if name not in listing.archives:
                report.outcomes[name] = self._one(name, None, listing.archives.get)
        for outcome in report.outcomes.values():
            self._state_event(outcome)
        if self.rollouts is not None and self.triton_up:
            self.rollouts.observe(sorted(m for m, o in report.outcomes.items() if o.serving and not o.gone))
        if report.ok and all(o.in_sync for m, o in report.outcomes.items() if m in listing.archives):
            self.last_success = self.wall()
        self._after_pass(report, len(listing.archives))
        self._host_event(report)
        return report

    def _each(self, names: list[str], one: Callable[[str], Outcome]) -> dict[str, Outcome]:
        """``one`` for every name, ``--parallel-models`` at once (in ``names``' order, each as a worker frees):
        one model loads while the next downloads, all within the daemon's connection budget. The outcomes come
        back in ``names``' order whatever order they finished in."""
        workers = min(self.settings.parallel_models, len(names))
        if workers <= 1:
            return {name: one(name) for name in names}
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile") as pool:
            futures = {name: pool.submit(one, name) for name in names}
        return {name: f.result() for name, f in futures.items()}

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
        """Reconcile only these models (an event or a rollout in flight named them); the listing of their key
        decides, and a rollout's state is read afresh."""
        out: dict[str, Outcome] = {}
        self.triton_up = self.triton.live()
        for model in models:
            try:
                archive = self.s3.find(model)
            except DownloadError as exc:
                self.log.error("%s", exc)
                continue
            if archive is None and self._installed(model) is None:
                continue
            out[model] = self._one(model, archive, self.s3.find, wait_for_tag, fresh=True)
            self._state_event(out[model])
        return out

    # --- one name ---------------------------------------------------------------------------

    def _one(
        self, name: str, archive: Archive | None, listed: Listed, wait_for_tag: bool = False, fresh: bool = False
    ) -> Outcome:
        """Reconcile one name with the object S3 lists for it (None: it left S3); ``listed`` answers which key
        S3 lists for another name (the pass's listing, or a LIST of that name's keys for an event). A bug or an
        unexpected OS error in one name must not stop the others."""
        try:
            if archive is None:
                return self._removed(name)
            return self._reconcile(name, archive, listed, wait_for_tag, fresh)
        except Exception as exc:
            self.log.exception("sync of %s failed unexpectedly", name)
            return Outcome.unexpected(name, exc, self._serving(name))

    def _installed(self, name: str) -> tuple[Installer, Served] | None:
        """The installer holding ``name`` and what it serves, if anything is installed under it."""
        for installer in (self.models, self.bundles):
            current = installer.current(name)
            if current is not None:
                return installer, current
        return None

    def _serving(self, name: str) -> str:
        found = self._installed(name)
        return found[1].sha256 if found else ""

    def _installer(self, name: str, archive: Archive, listed: Listed) -> Installer:
        """Which kind the listed object is. A key keeps its kind once installed (Bundles.parts); a bundle may
        not hold a name another listed key owns (:meth:`_claims`); a model already in a bundle cannot come from
        another archive. Raises SyncError when it cannot be told."""
        problem = model_name_problem(name) or archive.conflict
        if problem:
            raise UnsafeArchive(problem)
        single = self.store.current(name) is not None
        # A manifest is no zip: nothing to peek at, unless a bundle has this name (refused there).
        if not (archive.directory and self.bundles.state(name) is None):
            try:
                parts = self.bundles.parts(name, archive, single)
                if parts is not None:
                    self._claims(name, archive, parts, listed)
                    return self.bundles
            except DownloadError as exc:  # the zip's directory, or a listing, could not be read: a failed download
                raise _Unread(exc) from exc
        owner = self.bundles.owner(name)
        if owner is not None:
            held = self.bundles.current(owner)
            raise BundleConflict(
                f"{archive.key} holds model {name}, which belongs to bundle {owner} ({held.key if held else '?'}), "
                f"installed here before {archive.key} was listed: a listed key owns its name, and the bundle is "
                f"refused now; delete {owner}'s key from S3 (with --delete-removed the bundle is then removed) and "
                f"{archive.key} is installed"
            )
        return self.models

    def _claims(self, name: str, archive: Archive, parts: list[str], listed: Listed) -> None:
        """A bundle may not take a name a listed key owns: ``<prefix><m>.zip`` or ``<prefix><m>/manifest.json``
        is model ``m``'s, whatever else holds a directory ``m/``. Decided from S3's listing alone, so every host
        decides alike, fresh or not, in any order (issue 36: ``0evil.zip`` holding ``resnet/`` was served as
        resnet on a fresh host, and the real ``resnet.zip`` refused)."""
        found = taken(name, parts, listed)
        if found is not None:
            model, owner = found
            keys = owner.key if not owner.conflict else f"{owner.key} (and its other key)"
            raise BundleConflict(
                f"bundle {archive.key} holds model {model}, whose name the listed key {keys} owns: a bundle "
                f"may not take a listed model's name; {archive.key} is refused (rename {model}/ in the bundle, "
                "or delete one of the two keys)"
            )

    def _reconcile(
        self, name: str, listed: Archive, others: Listed, wait_for_tag: bool, fresh: bool = False
    ) -> Outcome:
        try:
            installer = self._installer(name, listed, others)
        except _Unread as unread:
            return self._failed(name, listed, Attempt(name, Result.OK, key=listed.key, etag=listed.etag),
                                unread.error)  # fmt: skip
        except SyncError as exc:  # known from the listing alone
            return self._fail_once(name, listed, exc)
        current = installer.current(name)
        plan: Plan | None = None
        archive = listed  # what to install: S3's object, unless a rollout says otherwise
        if self.rollouts is not None:
            plan = self.rollouts.plan(name, listed, current, fresh)
            if plan.refused and plan.named is not None:
                return self._untrusted(name, plan, plan.named, plan.refused, current)
            if plan.install is None:
                return Outcome.held(name, current, plan)
            archive = plan.install
        serving = self._serving(name)
        staging_start = not self.triton_up and self.before_first_sync
        if current is not None and current.etag == archive.etag:
            return self._settled(plan, self._loaded(installer, current, staging_start), current, False)
        memo = self.failed.get(name)
        if memo is None or memo.etag != archive.etag:
            memo = self._remembered(name, archive) or memo
        recorded = plan.expected if plan is not None else ""
        if memo is not None and memo.etag == archive.etag and not self._memo_outdated(memo, archive, recorded):
            return Outcome.refused(name, memo.reason, serving, memo.expected)
        if not self.triton_up and not staging_start:
            reason = (
                f"Triton at {self.triton.url} does not answer: not installing {archive.key} until it does "
                "(retried at the next reconcile)"
            )
            self.log.warning("%s: %s", name, reason)
            return Outcome.deferred(name, reason, serving)
        attempt = Attempt(name, Result.OK, key=archive.key, etag=archive.etag, serving=serving)
        expected_hash: ExpectedHash = lambda a: self._expected_hash(a, wait_for_tag)  # noqa: E731
        if plan is not None and plan.expected:  # what the rollout state recorded, not what the object says
            expected_hash = lambda a: self._recorded_hash(name, plan.expected, a)  # noqa: E731
        try:
            with self._serial if installer is self.bundles else contextlib.nullcontext():
                changed = installer.install(name, archive, attempt, expected_hash, not staging_start)
        except SyncError as exc:
            if plan is not None and self.rollouts is not None:
                self.rollouts.failed(name, plan, archive, exc)
                if plan.expected and isinstance(exc, (UntrustedArtifact, HashMismatch)):
                    attempt.sha256 = plan.expected  # the memo is about this recorded hash: a new one is tried
                    self._untrusted(name, plan, archive, str(exc), current, counted=True)
            return self._failed(name, archive, attempt, exc)
        now = installer.current(name)
        assert now is not None
        if not changed:  # the same content under a new object: nothing was installed
            return self._settled(plan, self._loaded(installer, now, staging_start), now, False)
        if self.failed.pop(name, None) is not None:
            self.refusals.forget(self.s3.bucket, archive.key)
        self._record(attempt)
        if staging_start:
            return self._settled(plan, Outcome.not_started(now), now, True)
        return self._settled(plan, Outcome.synced(now, Result.OK), now, True)

    def _settled(self, plan: Plan | None, outcome: Outcome, served: Served, installed: bool) -> Outcome:
        """Tell the rollout what this host now serves (a canary's window starts, a rollback is logged)."""
        if plan is not None and self.rollouts is not None and (outcome.in_sync or installed):
            self.rollouts.settled(served.name, plan, served, installed)
            if plan.reason and outcome.in_sync and not outcome.reason:
                outcome.reason = plan.reason
        return outcome

    def _recorded_hash(self, name: str, recorded: str, head: Archive) -> tuple[str, str]:
        """The sha256 an artifact named by the rollout state must have: the one the state recorded when the
        artifact was first seen (ledger.record_artifact). An object whose own sha256 metadata (fixed for its
        version) says otherwise is refused before it is downloaded; its bytes are checked against it after."""
        state = self._state_url(name)
        if head.sha256 and head.sha256 != recorded:
            raise UntrustedArtifact(
                f"the rollout state {state} recorded sha256 {recorded} for s3://{self.s3.bucket}/{head.key} "
                f"(version {head.version_id or 'none'}), whose own sha256 metadata is {head.sha256}: not installed"
            )
        return recorded, f"sha256 recorded in the rollout state {state}"

    def _state_url(self, name: str) -> str:
        assert self.rollouts is not None
        return f"s3://{self.s3.bucket}/{self.rollouts.ledger.key(name)}"

    def _untrusted(
        self, name: str, plan: Plan, named: Archive, why: str, current: Served | None, counted: bool = False
    ) -> Outcome:
        """The rollout state names an artifact this host must not install for ``name``: nothing is installed,
        what is served stays. One JSON line (the state, the key, why) and one ``unsafe_archive`` attempt per
        state artifact, not per pass (``counted``: the failed install already recorded its attempt)."""
        serving = current.sha256 if current is not None else ""
        state = self._state_url(name)
        reason = (
            f"the rollout state {state} names s3://{self.s3.bucket}/{named.key} (version "
            f"{named.version_id or 'none'}) for {name}: refused: {why}; "
            + (f"{serving} keeps serving" if serving else "nothing of it is installed here")
        )
        seen = (named.key, named.etag, named.version_id, why)
        if self._untrusted_seen.get(name) != seen:
            self._untrusted_seen[name] = seen
            fields = {"model": name, "refused": "rollout state artifact", "state": state, "key": named.key,
                      "etag": named.etag, "s3_version_id": named.version_id, "reason": why, "serving": serving,
                      "host": self.settings.host, "role": plan.role}  # fmt: skip
            self.log.error("%s: %s", name, reason, extra={"fields": fields})
            if not counted:
                self.recorder.attempt(Attempt(name, Result.UNSAFE_ARCHIVE, reason, key=named.key, etag=named.etag,
                                              version_id=named.version_id, serving=serving))  # fmt: skip
        return Outcome.refused(name, reason, serving)

    def identify(self, archive: Archive) -> tuple[str, str]:
        """(the sha256 the object must hold, its version id), from a HEAD (and the tag, waited for); a rollout
        names artifacts by it. Raises MissingHash when there is none and --allow-unverified is off."""
        head = self.s3.head(archive)
        sha, _ = self._expected_hash(head, wait_for_tag=True)
        if not sha and not self.settings.allow_unverified:
            raise MissingHash(
                f"s3://{self.s3.bucket}/{archive.key} has no sha256 user metadata or tag "
                "(upload with --metadata sha256=<hex>, or run with --allow-unverified)"
            )
        return sha or f"unverified-{head.etag.strip(chr(34))}", head.version_id

    def entry_models(self, name: str) -> list[str]:
        """The Triton models whose requests judge ``name`` in a rollout: a bundle's ensembles (its entry
        points; all its models when it has none), else the model itself."""
        state = self.bundles.state(name)
        if state is None:
            return [name]
        ensembles = sorted(m for m, p in state.parts.items() if p.ensemble)
        return ensembles or sorted(state.parts)

    def _loaded(self, installer: Installer, current: Served, staging_start: bool) -> Outcome:
        """Installed from the object S3 holds: confirm Triton serves it, load it again when it does not."""
        if staging_start:
            return Outcome.not_started(current)
        sha, version = current.sha256, current.version_id
        try:
            if installer.ready(current):
                return Outcome.synced(current)
        except SyncError as exc:  # Triton down or restarting: nothing to attempt now, retried next pass
            return Outcome.failure(current.name, exc, sha, sha, version)
        attempt = Attempt(current.name, Result.OK, key=current.key, etag=current.etag, serving=sha, sha256=sha,
                          version_id=version)  # fmt: skip
        try:
            with attempt.phase("load"):
                installer.ensure_loaded(current)
        except SyncError as exc:  # nothing was switched: the disk already holds what Triton should serve
            attempt.result, attempt.reason = exc.result, str(exc)
            self._record(attempt)
            return Outcome.failure(current.name, exc, sha, sha, version)
        self._record(attempt)
        return Outcome.synced(current, Result.OK)

    def _removed(self, name: str) -> Outcome:
        found = self._installed(name)
        if found is None:
            return Outcome.removed(name)
        installer, current = found
        if not self.settings.delete_removed:
            return Outcome.kept(name, current.sha256)
        try:
            installer.remove(name)
        except SyncError as exc:
            return Outcome.unload_failed(name, exc, current.sha256)
        self.log.info(installer.removal, name)
        return Outcome.removed(name)

    def _remembered(self, name: str, archive: Archive) -> Memo | None:
        """A verdict on this very object written by an earlier run (or another daemon of the instance), taken
        into the memo: the object is not downloaded again. A new version with the same bytes (its version id
        differs, one HEAD tells) is tried afresh."""
        found = self.refusals.find(self.s3.bucket, archive.key, archive.etag, self.judged_under)
        if found is None:
            return None
        if found.version_id:
            try:
                head = self.s3.head(archive)
            except DownloadError:
                return None  # the attempt will say what S3 says
            if head.version_id and head.version_id != found.version_id:
                return None
        memo = Memo(found.etag, found.expected, found.result, found.reason)
        self.failed[name] = memo
        fields = {
            "model": name,
            "key": archive.key,
            "etag": archive.etag,
            "s3_version_id": found.version_id,
            "result": found.result,
            "refused_at": found.at,
        }
        self.log.warning(
            "%s: not downloading s3://%s/%s again: refused earlier (%s: %s); a new version is tried afresh",
            *(name, self.s3.bucket, archive.key, found.result, found.reason),
            extra={"fields": fields},
        )
        return memo

    def _memo_outdated(self, memo: Memo, archive: Archive, recorded: str = "") -> bool:
        """A hash mismatch against a tag is retried when the tag changes (metadata cannot change); a refusal of
        a hash a rollout state recorded, when the state records another one."""
        if recorded and memo.expected != recorded:
            return True
        if memo.result != Result.HASH_MISMATCH:
            return False
        try:
            head = self.s3.head(archive)
        except DownloadError:
            return False
        return (head.sha256 or self.s3.tag_hash(head)) != memo.expected

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

    # --- bookkeeping ------------------------------------------------------------------------

    def _failed(self, name: str, archive: Archive, attempt: Attempt, exc: SyncError) -> Outcome:
        attempt.result, attempt.reason = exc.result, str(exc)
        attempt.serving = self._serving(name)
        self._record(attempt)
        if not exc.transient:
            self.failed[name] = Memo(archive.etag, attempt.sha256, exc.result, str(exc))
            if exc.remembered:
                verdict = Refusal(
                    bucket=self.s3.bucket,
                    key=archive.key,
                    etag=archive.etag,
                    version_id=attempt.version_id,
                    result=str(exc.result),
                    reason=str(exc),
                    expected=attempt.sha256,
                    limits=self.judged_under,
                    at=self.wall(),
                )
                self.refusals.add(verdict)
        return Outcome.failure(name, exc, attempt.serving, attempt.sha256, attempt.version_id)

    def _fail_once(self, name: str, archive: Archive, exc: SyncError) -> Outcome:
        """A failure known from the listing alone (a bad name, a name another key owns): one attempt event per
        object and reason, not per pass. Judged afresh every pass (no memo: a conflict with another key ends
        when that key goes, without this object changing)."""
        if self._listing_refused.get(name) != (archive.etag, str(exc)):
            self._listing_refused[name] = (archive.etag, str(exc))
            self._record(Attempt(name, exc.result, str(exc), key=archive.key, etag=archive.etag))
        # a conflict may appear after the model or bundle was installed: what is installed is still served
        return Outcome.refused(name, str(exc), self._serving(name))

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
        self.recorder.host_state(in_sync, out, since, self.rollouts.in_flight() if self.rollouts else None)


class _Unread(Exception):
    """The zip's directory could not be read to tell its kind (reported as a failed download)."""

    def __init__(self, error: SyncError) -> None:
        super().__init__(str(error))
        self.error = error
