"""A store shared by the repositories of one instance, and this daemon's repository of links.

Layout (``<state>`` is ``.<repository name>.modelsync`` beside the repository,
on the same mount, because a link is renamed from there over the repository
entry; the store may be another mount: links are symbolic)::

    <repository>/<model>             -> relative link to <store>/<model>/<dir>
    <state>/lock                     one daemon per repository (flock, released by the kernel on a crash)
    <state>/id.json                  this repository's id in the store, stable across restarts
    <state>/link-<model>-<n>         temporary links
    <state>/status.json              the daemon's health (modelsync/health.py reads it)
    <store>/<model>/<dir>/           a complete, fsync'd model directory; <dir> is <sha256> or <sha256>.<n>
    <store>/<model>/<dir>.json       where it came from (key, ETag, version id, hash source)
    <store>/.staging/<id>/           repository <id>'s downloads and half-extracted directories
    <store>/.refs/<id>.json          what repository <id> links to (current and previous per model) or is
                                     installing; its mtime is the lease (refreshed by the daemon's heartbeat)
    <store>/.claims/<sha256>         flock held while one repository downloads and extracts that archive
    <store>/.lock                    short exclusive sections: commit with its reference, collect
    <store>/.refused.json            objects refused for their bytes, remembered across restarts (refusals.py)

Why shared: the Triton tasks of one GPU instance (one per GPU) serve the same
models; the first one to see an archive downloads and extracts it, the
others wait on its claim and then link the same directory. A directory is
deleted only when no live reference names it, under the store's lock, so
one repository never removes what another's Triton serves. A repository
whose daemon stopped heartbeating for :data:`REF_LEASE` seconds is
forgotten (its reference, its staging directory).

Why ``<sha256>.<n>``: Triton decides whether a model changed by the newest
timestamp in its directory, and ignores one that is not newer than what it
loaded. An existing directory is linked only when it is newer than the one
this repository's Triton serves; otherwise the archive is extracted afresh
under the next free name (a rollback to an archive extracted long ago).

A directory appears under ``<store>/<model>/`` only by a rename from staging
after it was completely written, and the repository entry changes only by
``rename(2)`` of a temporary link over it, so Triton only ever sees a
complete model. :meth:`Store.recover` removes what an interrupted sync left, except a partial
download that modelsync/transfer.py can resume (it drops those of a replaced object or stale ones).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DiskFull, LoadFailed
from .fsio import FileSystem, LocalFileSystem, fsync_dir, raise_disk_full, write_json
from .spans import Observe, spanned
from .transfer import resumable

STAGING, REFS, CLAIMS, LOCK = ".staging", ".refs", ".claims", ".lock"
REF_LEASE = 1800.0  # seconds without a heartbeat after which a repository's reference is forgotten
_SHA = re.compile(r"^[0-9a-f]{64}$")
_DIR = re.compile(r"^([0-9a-f]{64})(?:\.([1-9][0-9]{0,5}))?$")
_ID = re.compile(r"^[0-9a-f]{16}$")
# Names Triton serves verbatim and that travel unescaped in its URL paths (it does not decode %XX).
_NAME = re.compile(r"^[A-Za-z0-9_~!$&'()*+,;=:@-][A-Za-z0-9._~!$&'()*+,;=:@-]{0,199}$")


class StoreError(Exception):
    """The store cannot be used at all: a setup problem, or (``busy``) another daemon holds the repository."""

    def __init__(self, message: str, busy: bool = False) -> None:
        super().__init__(message)
        self.busy = busy


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model directory, or None."""
    if not _NAME.fullmatch(name):
        return (
            f"model name {name!r} is not allowed: 1-200 characters from A-Z a-z 0-9 . _ ~ ! $ & ' ( ) * + , ; "
            "= : @ -, not starting with '.' (Triton serves names verbatim in URL paths)"
        )
    return None


def state_dir(repository: Path) -> Path:
    """The daemon's own directory for ``repository``: beside it, hidden, never inside it."""
    return repository.with_name(f".{repository.name}.modelsync")


@dataclass(frozen=True)
class Installed:
    model: str
    sha256: str
    path: Path
    record: dict[str, Any]

    @property
    def name(self) -> str:
        """The store directory's name: ``<sha256>`` or ``<sha256>.<n>``."""
        return self.path.name


class Store:
    def __init__(self, repository: Path, root: Path, fs: FileSystem) -> None:
        self.repository = repository
        self.root = root
        self.state = state_dir(repository)
        self.fs = fs
        self.id = ""
        self.staging = root / STAGING  # this repository's own folder in it once opened
        self._lock_fd: int | None = None
        self._seq = itertools.count()
        self._previous: dict[str, str] = {}  # model -> the directory its current one replaced
        self._pending: set[str] = set()  # "<model>/<dir>" committed or adopted, not linked yet
        # The bookkeeping above is shared by the models a pass installs at once (reconcile.Syncer._each):
        # changed and read under this lock (taken before the store's file lock, never after it).
        self._mutex = threading.RLock()
        self.observe: Observe | None = None  # told how long a claim waited ("wait"): modelsync/startup.py

    # --- start and stop -------------------------------------------------------------------

    def open(self) -> None:
        """Create the directories, take the repository's lock, read or make its id, register in the store."""
        try:
            folders = (self.repository, self.state, self.root, *(self.root / f for f in (STAGING, REFS, CLAIMS)))
            for d in folders:
                d.mkdir(parents=True, exist_ok=True)
                if not os.access(d, os.W_OK | os.X_OK):
                    raise PermissionError(errno.EACCES, "not writable", str(d))
            fd = os.open(self.state / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(
                f"cannot use {exc.filename}: {exc.strerror or exc} (the daemon runs as uid {os.getuid()}; the "
                "directory must exist or be creatable, and be writable by it)"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(
                f"another modelsync holds {self.state / 'lock'}: one daemon per repository", busy=True
            ) from None
        self._lock_fd = fd
        self.id = self._read_or_make_id()
        self.staging = self.root / STAGING / self.id
        self.staging.mkdir(exist_ok=True)
        self._previous = self._read_refs().get("previous", {})
        with self._locked(), contextlib.suppress(DiskFull):  # full: the heartbeat registers once there is room
            self._write_refs()

    def close(self) -> None:
        """Release the repository. The reference stays: the links still point into the store."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _read_or_make_id(self) -> str:
        path = self.state / "id.json"
        with contextlib.suppress(OSError, ValueError, AttributeError):
            text = json.loads(path.read_text()).get("id", "")
            if _ID.fullmatch(text):
                return str(text)
        new = secrets.token_hex(8)
        write_json(self.fs, path, {"id": new})
        return new

    def heartbeat(self) -> None:
        """Renew this repository's lease on what it references (the daemon calls it every few seconds)."""
        ref = self.root / REFS / f"{self.id}.json"
        try:
            os.utime(ref)
        except FileNotFoundError:  # not registered yet (a full disk), or forgotten while stalled: register
            with self._locked():
                self._write_refs()

    def recover(self) -> list[str]:
        """Remove what an interrupted sync left; returns one line per thing removed."""
        done: list[str] = []
        for entry in sorted(self.state.glob("link-*")):
            _remove(entry)
            done.append(f"removed staging leftover {entry.name}")
        for entry in sorted(self.staging.iterdir()):
            if resumable(entry):  # a crashed download's verified parts: the next download resumes it
                continue
            _remove(entry)
            done.append(f"removed staging leftover {entry.name}")
        for entry in sorted(self.repository.iterdir()):
            if entry.is_symlink() and self._managed_target(entry) is not None and not entry.exists():
                entry.unlink()
                done.append(f"removed link {entry.name}: its store directory is gone")
        if done:
            fsync_dir(self.repository)
        self._pending.clear()
        with self._locked():
            self._write_refs()
            done.extend(f"removed {name} from the store: no repository links to it" for name in self._collect())
        return done

    # --- reading --------------------------------------------------------------------------

    def _managed_target(self, link: Path) -> Path | None:
        """The store directory a repository link points at, if it is one of ours."""
        try:
            raw = os.readlink(link)
        except OSError:
            return None
        target = Path(os.path.normpath(link.parent / raw))
        if target.parent.parent != self.root or not _DIR.fullmatch(target.name):
            return None
        return target

    def current(self, model: str) -> Installed | None:
        link = self.repository / model
        target = self._managed_target(link) if link.is_symlink() else None
        if target is None or target.parent.name != model or not target.is_dir():
            return None
        return _installed(model, target)

    def previous(self, model: str) -> str | None:
        """The directory the current one replaced in this repository (kept for a while), if any."""
        return self._previous.get(model)

    def previous_installed(self, model: str) -> Installed | None:
        """The previous directory, when it is still in the store and complete."""
        name = self._previous.get(model)
        path = self.root / model / name if name else None
        if path is None or not _DIR.fullmatch(path.name) or not path.is_dir():
            return None
        return _installed(model, path)

    def managed_models(self) -> list[str]:
        return sorted(self._linked())

    def _linked(self) -> dict[str, Installed]:
        """Model -> the store directory its repository link points at, for every link of ours."""
        out = {}
        for p in self.repository.iterdir():
            current = self.current(p.name) if p.is_symlink() else None
            if current is not None:
                out[p.name] = current
        return out

    def unmanaged(self, model: str) -> bool:
        """True when the repository holds something for ``model`` that is not our link."""
        link = self.repository / model
        return (link.exists() or link.is_symlink()) and self.current(model) is None

    # --- sharing --------------------------------------------------------------------------

    @contextlib.contextmanager
    def claim(self, sha: str) -> Iterator[None]:
        """Hold the archive ``sha`` while downloading and extracting it: the other repositories of this store
        wait here, then find the directory and link it instead of fetching it again. The kernel releases
        the claim of a daemon that dies."""
        if not _SHA.fullmatch(sha):
            yield
            return
        path = self.root / CLAIMS / sha
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            with spanned(self.observe, "wait"):
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.utime(fd)
            yield
        finally:
            os.close(fd)

    def reusable(self, model: str, sha: str, installed: Installed | None) -> Installed | None:
        """A complete directory of archive ``sha`` that Triton would load as a change, now referenced by this
        repository; None when there is none (download and extract it)."""
        with self._locked():
            model_dir = self.root / model
            names = sorted(
                (p.name for p in model_dir.iterdir() if p.is_dir() and _sha_of(p.name) == sha)
                if model_dir.is_dir()
                else [],
                key=_generation,
            )
            floor = _newest(installed.path) if installed is not None else -1
            for name in reversed(names):
                path = model_dir / name
                if installed is not None and path == installed.path:
                    continue
                if _newest(path) > floor:
                    self._pending.add(f"{model}/{name}")
                    self._write_refs()
                    return _installed(model, path)
        return None

    # --- writing --------------------------------------------------------------------------

    def _unique(self, kind: str, model: str, where: Path) -> Path:
        return where / f"{kind}-{model}-{os.getpid()}-{next(self._seq)}"

    def staging_file(self, model: str) -> Path:
        return self._unique("download", model, self.staging)

    def staging_dir(self, model: str) -> Path:
        path = self._unique("extract", model, self.staging)
        path.mkdir()
        return path

    def commit(self, model: str, sha: str, extracted: Path, record: dict[str, Any]) -> Path:
        """Move a completely extracted directory into the store under a free name, write its record, and
        reference it, all under the store's lock (so no collect in another daemon can take it first)."""
        with self._locked():
            model_dir = self.root / model
            model_dir.mkdir(exist_ok=True)
            taken = {p.name for p in model_dir.iterdir()}
            final = next(
                model_dir / name
                for name in itertools.chain([sha], (f"{sha}.{n}" for n in itertools.count(1)))
                if name not in taken and f"{name}.json" not in taken
            )
            self.fs.replace(extracted, final)
            write_json(self.fs, model_dir / f"{final.name}.json", record)
            fsync_dir(model_dir)
            self._pending.add(f"{model}/{final.name}")
            self._write_refs()
        return final

    def flip(self, model: str, target: Path | None) -> None:
        """Point ``<repository>/<model>`` at ``target`` atomically (None removes the link)."""
        link = self.repository / model
        before = self.current(model)
        if target is None:
            with self._mutex:
                with contextlib.suppress(FileNotFoundError):
                    link.unlink()
                fsync_dir(self.repository)
                self._previous.pop(model, None)
            return
        if self.unmanaged(model):
            raise LoadFailed(
                f"{link} exists and is not a modelsync link (a directory placed by hand?): move it "
                "away to let modelsync manage this model"
            )
        tmp = self._unique("link", model, self.state)
        # The link and the bookkeeping change together: another model's pass writing the references in
        # between would record the new link without the directory it replaced, which another repository
        # of the store could then collect while this load may still need it for a roll back.
        with self._mutex:
            try:
                self.fs.symlink(os.path.relpath(target, self.repository), tmp)
                fsync_dir(self.state)
                self.fs.replace(tmp, link)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise_disk_full(exc, f"flipping {link}")
                raise
            fsync_dir(self.repository)
            self._pending.discard(f"{model}/{target.name}")
            if before is not None and before.path != target:
                self._previous[model] = before.name

    def discard(self, model: str, path: Path) -> None:
        """A directory this repository committed or adopted but does not link (its load failed)."""
        with self._mutex:
            self._pending.discard(f"{model}/{path.name}")
            if self._previous.get(model) == path.name:
                del self._previous[model]
        self._release(model)

    def prune(self, model: str, keep_previous: bool = True) -> list[str]:
        """Keep the current directory and (``keep_previous``) the one it replaced; remove the rest that no
        repository references. Returns what went."""
        if self.current(model) is None:
            return []
        if not keep_previous:
            with self._mutex:
                self._previous.pop(model, None)
        return self._release(model)

    def remove_model(self, model: str) -> None:
        self.flip(model, None)
        self._release(model)

    def update_record(self, installed: Installed, record: dict[str, Any]) -> Installed:
        """Rewrite a directory's record (a new object with the same content), under the store's lock."""
        with self._locked():
            write_json(self.fs, installed.path.parent / f"{installed.name}.json", record)
        return Installed(installed.model, installed.sha256, installed.path, record)

    # --- references and collection -------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _read_refs(self) -> dict[str, Any]:
        try:
            data = json.loads((self.root / REFS / f"{self.id}.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _release(self, model: str) -> list[str]:
        """Rewrite this repository's references, then collect what of ``model`` nobody references any more."""
        with self._locked():
            self._write_refs()
            return self._collect(model)

    def _write_refs(self) -> None:
        """Record ``<model>/<dir>`` this repository needs: what it links to, what those replaced (one scan of
        the repository), and what it is installing."""
        linked = self._linked()
        self._previous = {m: d for m, d in self._previous.items() if m in linked}
        dirs = set(self._pending)
        for model, current in linked.items():
            dirs.add(f"{model}/{current.name}")
            prev = self._previous.get(model)
            if prev and prev != current.name:
                dirs.add(f"{model}/{prev}")
        doc = {"id": self.id, "repository": str(self.repository), "dirs": sorted(dirs), "previous": self._previous}
        # Bookkeeping, not model data: straight to the disk (the injectable fs faults the install path).
        write_json(LocalFileSystem(), self.root / REFS / f"{self.id}.json", doc)

    def _live_references(self) -> tuple[set[str], set[str]]:
        """Every ``<model>/<dir>`` a live repository references, and the ids of those repositories; the
        references (and staging folders) of repositories past their lease are deleted on the way."""
        dirs: set[str] = set()
        ids: set[str] = set()
        now = time.time()
        for ref in (self.root / REFS).iterdir():
            rid = ref.name.removesuffix(".json")
            if not ref.name.endswith(".json") or not _ID.fullmatch(rid):
                _remove(ref)  # a temporary file of an interrupted write
                continue
            try:
                age = now - ref.stat().st_mtime
                data = json.loads(ref.read_text())
            except (OSError, ValueError):
                ids.add(rid)  # unreadable: keep its staging; what it references cannot be known
                continue
            if rid != self.id and age > REF_LEASE:
                ref.unlink(missing_ok=True)
                _remove(self.root / STAGING / rid)
                continue
            ids.add(rid)
            listed = data.get("dirs") if isinstance(data, dict) else None
            dirs.update(d for d in listed or [] if isinstance(d, str))
        return dirs, ids

    def _collect(self, only: str | None = None) -> list[str]:
        """Delete the store directories no live repository references (of model ``only``, or all), stale
        staging folders and unused claims. Called with the store's lock held."""
        keep, ids = self._live_references()
        removed: list[str] = []
        models = [self.root / only] if only else [p for p in self.root.iterdir() if not p.name.startswith(".")]
        for model_dir in models:
            if not model_dir.is_dir():
                continue
            for p in sorted(model_dir.iterdir()):
                name = p.name.removesuffix(".json")
                if f"{model_dir.name}/{name}" not in keep:
                    _remove(p)
                    removed.append(p.name if only else f"{model_dir.name}/{p.name}")
            with contextlib.suppress(OSError):
                model_dir.rmdir()  # empty: the model is gone from every repository
        if only is None:
            for entry in (self.root / STAGING).iterdir():
                if entry.name not in ids:
                    _remove(entry)
            now = time.time()
            for claim in (self.root / CLAIMS).iterdir():
                with contextlib.suppress(OSError):
                    if now - claim.stat().st_mtime > REF_LEASE:
                        claim.unlink()
        return removed


def _sha_of(name: str) -> str:
    m = _DIR.fullmatch(name)
    return m.group(1) if m else ""


def _generation(name: str) -> int:
    m = _DIR.fullmatch(name)
    return int(m.group(2) or 0) if m else -1


def _installed(model: str, path: Path) -> Installed:
    return Installed(model, _sha_of(path.name), path, _read_record(path))


def _newest(path: Path) -> int:
    """The newest mtime or ctime (ns) under ``path``, the directory included: what Triton compares."""
    newest = 0
    for top, dirs, files in os.walk(path):
        for name in (".", *dirs, *files):
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(top, name))
                newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
    return newest


def _read_record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path.parent / f"{path.name}.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
