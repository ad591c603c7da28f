"""Bundles: one zip of several models (an ensemble and its steps) that switch together; the install
protocol of modelsync/install.py for them.

A zip ``<prefix><bundle>.zip`` whose top level is exactly one directory named
like the key is one model (models.py). Any other set of
top-level directories makes it a bundle: each directory is a model, checked
like a model archive (archive.py) and holding exactly one version directory.

Why not links flipped per model: on Triton 2.51 an ensemble whose steps are
reloaded one after the other serves answers that mix old and new steps
(seen: 117 mixed answers under traffic every 20 ms; loading only the
ensemble still mixed 5 of 95). What does not mix is Triton's own
versioning, so each installed generation ``g`` of a bundle becomes version
``g`` of every model in it:

1. every part is downloaded, verified and extracted into
   ``<store>/.bundles/<repository id>/<bundle>/<g>/`` first (one free-space
   check for all of them, one hash for the zip);
2. each non-ensemble model (a step) gets version ``g`` linked beside the old
   one, its ``config.pbtxt`` says ``version_policy { all {} }`` (rewritten
   only when the user's config changed), and it is loaded: both versions
   serve;
3. each ensemble is rewritten with its bundle steps' ``model_version: g`` and
   ``version_policy { specific { versions: [g] } }``, and loaded: from then
   on a request runs only ``g``;
4. the old version links of the steps are removed and the steps loaded (the
   old version goes), then the old generation is deleted.

A failure before the end of step 3 (hash, unsafe archive, disk full, any
model failing to load) writes the old configurations back and reloads them:
the old generation keeps serving, no request fails. The repository always
holds what a Triton restart should load (``--load-model=*``), because the
configuration lives on disk; the load API's config override would vanish at
a restart.

Layout (``<home>`` is ``<store>/.bundles/<repository id>``: the generation
numbers are this repository's Triton's version numbers, so nothing is shared
between repositories)::

    <repository>/<model>/                a directory modelsync writes (not a link)
    <repository>/<model>/config.pbtxt    the user's config, version_policy (and an ensemble's steps' model_version)
                                         rewritten
    <repository>/<model>/<g>             -> relative link to <home>/<bundle>/<g>/<model>/<the zip's version dir>
    <home>/<bundle>/<g>/<model>/         generation g as extracted from the zip, fsync'd
    <home>/<bundle>/state.json           the generation served, the zip's sha256, ETag, version id, parts
    <home>/<bundle>/pending.json         a switch in progress (recover() undoes it after a crash)
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from logging import Logger
from pathlib import Path
from typing import Any

from . import pbtxt
from .archive import (
    END_BYTES,
    Limits,
    Plan,
    check_no_overlap,
    extract,
    inspect,
    judge_end,
    open_zip,
    read_end,
    read_tail,
    walk_directory,
)
from .errors import DiskFull, DownloadError, LoadFailed, RolledBack, SignatureRefused, SyncError, UnsafeArchive
from .fsio import FileSystem, LocalFileSystem, fsync_dir, raise_disk_full, write_durably
from .install import ExpectedHash, Served
from .metrics import Attempt
from .pinning import free_check, pin, record_of, verify_hash
from .s3 import S3, Archive
from .settings import Settings
from .store import Store, model_name_problem
from .triton import Triton

BUNDLES = ".bundles"
TAIL = END_BYTES  # bytes read from the end of a zip to find its end record (the comment is at most 64 KiB)
WALK = 1024 * 1024  # bytes of a zip's central directory read at once when its names are peeked at


class BundleConflict(UnsafeArchive):
    """A model name claimed twice: by two bundles, or by a bundle and a single-model archive or directory."""

    remembered = False  # about what else is installed, not the object's bytes: a restart tries again


@dataclass(frozen=True)
class Part:
    """One model of a bundle: the version directory its zip holds, and whether it is an ensemble."""

    model: str
    version: str
    ensemble: bool
    steps: tuple[str, ...] = ()


@dataclass(frozen=True)
class BundleState:
    name: str
    generation: int
    sha256: str
    etag: str
    version_id: str
    parts: dict[str, Part]
    record: dict[str, Any]

    def order(self) -> list[str]:
        return switch_order(self.parts)


def switch_order(parts: dict[str, Part]) -> list[str]:
    """Steps first, then ensembles, an ensemble after the ensembles it uses."""
    done: list[str] = sorted(m for m, p in parts.items() if not p.ensemble)
    left = sorted(m for m, p in parts.items() if p.ensemble)
    while left:
        ready = [e for e in left if all(s in done or s not in left for s in parts[e].steps)] or left[:1]
        done += ready
        left = [e for e in left if e not in ready]
    return done


def top_level(names: list[str]) -> set[str]:
    return {n.split("/", 1)[0] for n in names}


def is_bundle(names: list[str], key_model: str) -> bool:
    """Several top-level directories, or one not named like the key. A first component that is no directory
    name at all (an absolute path, '..', a backslash) keeps the zip a single-model archive, whose checks name
    that entry; any other name is a model of the bundle, checked against the model-name rules."""
    top = top_level(names)
    if top == {key_model}:
        return False
    return not any(t in ("", ".", "..") or "\\" in t or "\x00" in t or re.match(r"^[A-Za-z]:", t) for t in top)


def taken(name: str, parts: list[str], listed: Callable[[str], Archive | None]) -> tuple[str, Archive] | None:
    """The first model of bundle ``name`` whose name a listed key owns, with that key's object; None when the
    bundle takes no one's name. ``<prefix><m>.zip`` or ``<prefix><m>/manifest.json`` owns ``m``, whatever
    else holds a directory ``m/``; the bundle's own name is its own key's."""
    for model in sorted(parts):
        owner = listed(model) if model != name else None
        if owner is not None:
            return model, owner
    return None


# --- reading the central directory without downloading the zip --------------------------------------


class _Ranged(io.RawIOBase):
    """A seekable view of an S3 object through ranged GETs (zipfile reads only the tail and the directory)."""

    def __init__(self, fetch: Callable[[int, int], bytes], size: int) -> None:
        self.fetch = fetch
        self.size = size
        self.pos = 0
        self.start = size
        self.data = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        if not (self.start <= self.pos and self.pos + n <= self.start + len(self.data)):
            start = max(0, self.size - TAIL) if self.pos >= self.size - TAIL else self.pos
            self.start, self.data = start, self.fetch(start, max(self.pos + n, min(self.size, start + TAIL)))
        chunk = self.data[self.pos - self.start : self.pos - self.start + n]
        buf[: len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)


def peek_names(s3: S3, archive: Archive, limits: Limits) -> list[str] | None:
    """The entry names of the listed zip, from its central directory (small ranged GETs pinned to the ETag);
    None when it is not a zip, or its directory is beyond the limits (the model path then downloads it and
    refuses it with its usual reason, remembered). Judged from its end record before the directory is read
    (archive.py), and read without zipfile's ZipInfo per entry."""

    def fetch(start: int, end: int) -> bytes:
        try:
            resp = s3.client.get_object(
                Bucket=s3.bucket, Key=archive.key, Range=f"bytes={start}-{end - 1}", IfMatch=archive.etag
            )
            data: bytes = resp["Body"].read()
        except Exception as exc:
            raise DownloadError(f"reading the zip directory of s3://{s3.bucket}/{archive.key}: {exc}") from exc
        if len(data) != end - start:
            raise DownloadError(f"reading the zip directory of s3://{s3.bucket}/{archive.key}: truncated body")
        return data

    if archive.size < 22:
        return None
    try:
        f = io.BufferedReader(_Ranged(fetch, archive.size), WALK)
        end = read_end(read_tail(f, archive.size), archive.size)
        judge_end(end, limits)
        return walk_directory(f, end, limits, names=True)
    except (UnsafeArchive, zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None


# --- the bundles of one repository ---------------------------------------------------------------------


class Bundles:
    def __init__(
        self, settings: Settings, s3: S3, store: Store, triton: Triton, fs: FileSystem, log: Logger, limits: Limits
    ) -> None:
        self.settings = settings
        self.s3 = s3
        self.store = store
        self.triton = triton
        self.fs = fs
        self.log = log
        self.limits = limits
        self._peeked: dict[str, tuple[str, list[str] | None]] = {}  # key -> (ETag, entry names) last read
        self._seq = itertools.count()

    @property
    def home(self) -> Path:
        return self.store.root / BUNDLES / self.store.id

    # --- reading ------------------------------------------------------------------------------

    def parts(self, name: str, archive: Archive, single_installed: bool) -> list[str] | None:
        """The top-level model names when ``archive`` is a bundle, None when it is one model.
        Raises DownloadError (transient) when the zip's directory cannot be read.

        A key keeps its kind once installed: under a single model's key (``single_installed``) a zip is read
        as one model, and one that turns out to hold several is refused by the model path after its
        download; a bundle's key that now holds one model is refused by the bundle path. Only a key never
        installed is peeked at, so an update costs no request more than its download."""
        current = self.state(name)
        if current is not None and current.etag == archive.etag:
            return sorted(current.parts)
        if current is None and single_installed:
            return None
        seen = self._peeked.get(archive.key)
        if seen is None or seen[0] != archive.etag:
            seen = self._peeked[archive.key] = (archive.etag, peek_names(self.s3, archive, self.limits))
        names = seen[1]
        if names is None or not is_bundle(names, name):
            return sorted(current.parts) if current is not None else None  # bundle path refuses the change
        return sorted(top_level(names))

    def state(self, name: str) -> BundleState | None:
        data = _read_json(self.home / name / "state.json")
        if not data or not isinstance(data.get("generation"), int) or data["generation"] < 1:
            return None
        parts = {
            m: Part(m, str(p.get("version", "")), bool(p.get("ensemble")), tuple(p.get("steps") or ()))
            for m, p in (data.get("models") or {}).items()
        }
        return BundleState(name, data["generation"], str(data.get("sha256", "")), str(data.get("etag", "")),
                           str(data.get("version_id", "")), parts, data)  # fmt: skip

    def names(self) -> list[str]:
        if not self.home.is_dir():
            return []
        return sorted(p.name for p in self.home.iterdir() if self.state(p.name) is not None)

    def owner(self, model: str, besides: str = "") -> str | None:
        """The installed bundle that holds ``model`` (other than ``besides``), if any."""
        for name in self.names():
            if name != besides and model in (self.state(name) or _EMPTY).parts:
                return name
        return None

    # --- the install protocol (modelsync/install.py) -------------------------------------------

    removal = "removed bundle %s: no longer in S3, its models unloaded and deleted"

    def current(self, name: str) -> Served | None:
        state = self.state(name)
        if state is None:
            return None
        return Served(name, state.sha256, state.etag, state.version_id, str(state.record.get("key", "")))

    def ready(self, current: Served) -> bool:
        state = self.state(current.name)
        return state is not None and all(self._version_ready(m, state.generation) for m in state.parts)

    # --- installing ---------------------------------------------------------------------------

    def install(
        self,
        name: str,
        listed: Archive,
        attempt: Attempt,
        expected_hash: ExpectedHash,
        load: bool,
    ) -> bool:
        """Download, verify and extract every part, then switch them together; False when the object is new
        but its content is what is installed (nothing switched). Raises a SyncError; after a failed switch,
        RolledBack (the old generation serves) or LoadFailed (nothing of the bundle was there before)."""
        if self.settings.require_signature:  # modelsync/signing.py verifies single models only (docs: Signed models)
            raise SignatureRefused(f"{listed.key} is a bundle: --require-signature installs only single models")
        current = self.state(name)
        with attempt.phase("download"):
            archive, expected, source = pin(self.s3, listed, self.settings, attempt, expected_hash)
            if current is not None and expected and expected == current.sha256:
                self._retag(current, archive)
                return False
            self._free_check(archive.size, f"downloading {archive.key}")
            download = self.store.staging_file(name)
        extracted: Path | None = None
        zf: zipfile.ZipFile | None = None
        try:
            with attempt.phase("download"):
                sha, count = self.s3.download(archive, download, self.fs)
                attempt.bytes_downloaded = count
            with attempt.phase("verify"):
                verify_hash(sha, expected, source, attempt)
                if current is not None and sha == current.sha256:
                    self._retag(current, archive)
                    return False
                zf = open_zip(download, self.limits)  # bounded by its end record before zipfile reads it
                plans, parts = self._inspect(zf, count, name)
                self._check_conflicts(name, parts)
            with attempt.phase("extract"):
                block = self.fs.block_size(self.store.staging)
                need = sum(p.disk_bytes(block) + block for p in plans.values())
                self._free_check(need, f"extracting the {len(plans)} models of bundle {name}")
                extracted = self.store.staging_dir(name)
                for model, plan in plans.items():
                    (extracted / model).mkdir()
                    extract(zf, plan, extracted / model, self.fs)
                fsync_dir(extracted)
                zf.close()
                zf = None
                download.unlink()
                g = self._next_generation(name, parts)
                target = self.home / name / str(g)
                target.parent.mkdir(parents=True, exist_ok=True)
                self.fs.replace(extracted, target)
                fsync_dir(target.parent)
                extracted = None
                self._write_json(self.home / name / "pending.json", {"generation": g, "models": sorted(parts)})
        except OSError as exc:
            raise_disk_full(exc, f"installing bundle {name}")
            raise
        finally:
            if zf is not None:
                zf.close()
            download.unlink(missing_ok=True)
            if extracted is not None:
                shutil.rmtree(extracted, ignore_errors=True)
        record = {
            "bundle": name,
            "generation": g,
            **record_of(sha, archive, source, self.settings.host),
            "models": {
                m: {"version": p.version, "ensemble": p.ensemble, "steps": list(p.steps)} for m, p in parts.items()
            },
        }
        self._switch(name, current, g, parts, record, attempt, load)
        attempt.serving = sha
        if load:
            attempt.upload_to_ready = time.time() - archive.last_modified.timestamp()
        return True

    def _inspect(self, zf: zipfile.ZipFile, count: int, name: str) -> tuple[dict[str, Plan], dict[str, Part]]:
        """Each top-level directory checked as a model archive; the whole zip against the limits."""
        infos = zf.infolist()
        top = sorted(top_level([i.filename for i in infos]))
        if not is_bundle([i.filename for i in infos], name):  # a bundle's key now holds a single model
            held = ", ".join(sorted((self.state(name) or _EMPTY).parts))
            raise UnsafeArchive(
                f"{name}.zip holds one model but is installed as the bundle of {held}: delete the key (and let "
                "--delete-removed remove the bundle) before a single model takes its name"
            )
        intro = (
            f"{name}.zip holds {', '.join(top)}: not the one model directory {name}/ (anything outside it makes "
            "the zip a bundle, each top-level directory a model)"
        )
        try:
            if len(infos) > self.limits.max_entries:
                raise UnsafeArchive(f"{len(infos)} entries, more than the limit of {self.limits.max_entries}")
            check_no_overlap(infos, getattr(zf, "start_dir", count))
            plans: dict[str, Plan] = {}
            parts: dict[str, Part] = {}
            for model in top:
                problem = model_name_problem(model)
                if problem:
                    raise UnsafeArchive(problem)
                subset = _Subset([i for i in infos if i.filename.split("/", 1)[0] == model], count)
                plan = inspect(subset, count, model, self.limits)  # type: ignore[arg-type]
                versions = sorted({e.path.parts[0] for e in plan.files if len(e.path.parts) > 1} | {
                    d.parts[0] for d in plan.dirs if len(d.parts) == 1})  # fmt: skip
                if len(versions) != 1:
                    raise UnsafeArchive(
                        f"{model}/ holds versions {', '.join(versions)}: a bundled model holds exactly one version "
                        "directory (the daemon serves each bundle generation as a new version number)"
                    )
                config = zf.read(f"{model}/config.pbtxt").decode("utf-8", "replace")
                try:
                    parsed = pbtxt.parse(config)
                except pbtxt.PbtxtError as exc:
                    raise UnsafeArchive(f"{model}/config.pbtxt cannot be rewritten: {exc}") from exc
                ensemble = parsed.scalar("platform") == "ensemble"
                steps: tuple[str, ...] = ()
                if ensemble:
                    steps = tuple(
                        s.scalar("model_name") or ""
                        for sched in parsed.messages("ensemble_scheduling")
                        for s in sched.messages("step")
                    )
                plans[model], parts[model] = plan, Part(model, versions[0], ensemble, steps)
            total = sum(p.total_bytes for p in plans.values())
            if total > self.limits.max_bytes:
                raise UnsafeArchive(f"more than {self.limits.max_bytes} bytes uncompressed (the limit)")
            if total > 1024 * 1024 and total / max(count, 1) > self.limits.max_ratio:
                raise UnsafeArchive(
                    f"archive expands {total / count:.0f}x, above the limit of {self.limits.max_ratio:g}"
                )
        except UnsafeArchive as exc:
            raise UnsafeArchive(f"{intro}: {exc}") from exc
        return plans, parts

    def _check_conflicts(self, name: str, parts: dict[str, Part]) -> None:
        current = self.state(name)
        mine = set(current.parts) if current else set()
        for model in sorted(parts):
            other = self.owner(model, besides=name)
            if other is not None:
                raise BundleConflict(f"model {model} of bundle {name} already belongs to bundle {other}")
            entry = self.store.repository / model
            if model not in mine and (entry.exists() or entry.is_symlink()):
                what = "a single-model archive" if self.store.current(model) is not None else "something placed by hand"
                raise BundleConflict(
                    f"model {model} of bundle {name} is already in the repository, from {what}: remove that "
                    "first (a model belongs to one archive)"
                )

    def _next_generation(self, name: str, parts: dict[str, Part]) -> int:
        """Above every version number this repository's Triton may have seen for these models."""
        seen = [0, int((_read_json(self.home / name / "state.json") or {}).get("high") or 0)]
        bundle_dir = self.home / name
        if bundle_dir.is_dir():
            seen += [int(p.name) for p in bundle_dir.iterdir() if p.name.isdigit()]
        for model in parts:
            d = self.store.repository / model
            if d.is_dir() and not d.is_symlink():
                seen += [int(p.name) for p in d.iterdir() if p.name.isdigit()]
        return max(seen) + 1

    # --- the switch ---------------------------------------------------------------------------

    def _switch(
        self,
        name: str,
        old: BundleState | None,
        g: int,
        parts: dict[str, Part],
        record: dict[str, Any],
        attempt: Attempt,
        load: bool,
    ) -> None:
        new_dir = self.home / name / str(g)
        order = switch_order(parts)
        steps = [m for m in order if not parts[m].ensemble]
        ensembles = [m for m in order if parts[m].ensemble]
        old_parts = old.parts if old else {}
        kept = [m for m in steps if m in old_parts and not old_parts[m].ensemble]
        touched: list[str] = []
        try:
            if not load:  # Triton is not running yet: write the final state, it loads it at its start
                with attempt.phase("swap"):
                    for m in order:
                        touched.append(m)
                        self._write_model(m, {g: new_dir / m / parts[m].version}, new_dir / m, parts, g)
            else:
                with attempt.phase("swap"):
                    for m in steps:
                        touched.append(m)
                        versions = {g: new_dir / m / parts[m].version}
                        if m in kept:
                            assert old is not None
                            versions[old.generation] = self.home / name / str(old.generation) / m / old_parts[m].version
                        self._write_model(m, versions, new_dir / m, parts, g)
                with attempt.phase("load"):
                    for m in steps:
                        self._load(m, g)
                for e in ensembles:
                    with attempt.phase("swap"):
                        touched.append(e)
                        self._write_model(e, {g: new_dir / e / parts[e].version}, new_dir / e, parts, g)
                    with attempt.phase("load"):
                        self._load(e, g)
        except (SyncError, OSError) as exc:
            err = exc if isinstance(exc, SyncError) else _as_sync_error(exc, name)
            with attempt.phase("load"):
                self._roll_back(name, old, g, touched)
            if old is None:
                raise LoadFailed(f"{err}; bundle {name} was not installed (none of its models stay)") from exc
            raise RolledBack(
                f"{err}; rolled back: every model of bundle {name} serves generation {old.generation} "
                f"({old.sha256}) again",
                transient=err.transient,
            ) from exc
        # Every request now runs generation g: drop the old versions, then the old generation.
        record["high"] = g
        self._write_json(self.home / name / "state.json", record)
        (self.home / name / "pending.json").unlink(missing_ok=True)
        with attempt.phase("load"):
            for m in kept if load else []:
                try:
                    self._prune_links(m, keep={g})
                    self._load(m, g)
                except (SyncError, OSError) as exc:  # the ensemble runs g only; the old version merely lingers
                    self.log.warning("%s: dropping the old version of %s: %s", name, m, exc)
            for m in sorted(set(old_parts) - set(parts)):
                self._remove_model(m, load)
        for m in parts:
            self._prune_links(m, keep={g})
        for p in (self.home / name).iterdir():
            if p.name.isdigit() and int(p.name) != g:
                shutil.rmtree(p, ignore_errors=True)

    def _roll_back(self, name: str, old: BundleState | None, g: int, touched: list[str]) -> None:
        """Write the old generation's configurations back and reload them (ensembles first, so no ensemble
        is left pinned to a version about to go); remove the models that were new. Errors are logged: the
        caller reports the original failure."""
        old_parts = old.parts if old else {}
        back = [m for m in reversed(touched) if m in old_parts]
        back.sort(key=lambda m: not old_parts[m].ensemble)
        for m in back:
            assert old is not None
            old_dir = self.home / name / str(old.generation)
            try:
                self._write_model(m, {old.generation: old_dir / m / old_parts[m].version}, old_dir / m, old_parts,
                                  old.generation, fs=LocalFileSystem())  # fmt: skip
                self._prune_links(m, keep={old.generation})
            except OSError as exc:
                self.log.error("%s: rolling back %s: %s", name, m, exc)
        for m in back:
            try:
                self.triton.load(m)
            except SyncError as exc:
                self.log.error("%s: reloading %s after the rollback: %s", name, m, exc)
        for m in touched:
            if m not in old_parts:
                self._remove_model(m, True)
        shutil.rmtree(self.home / name / str(g), ignore_errors=True)
        (self.home / name / "pending.json").unlink(missing_ok=True)
        if old is not None:
            self._write_json(self.home / name / "state.json", {**old.record, "high": g})

    def ensure_loaded(self, current: Served) -> None:
        """After a Triton restart or a failed load: load every model of the bundle that is not READY at its
        generation, steps first."""
        state = self.state(current.name)
        if state is None:
            raise LoadFailed(f"bundle {current.name} is no longer installed")
        for m in state.order():
            if not self._version_ready(m, state.generation):
                self._load(m, state.generation)

    def remove(self, name: str) -> None:
        """Unload every model of the bundle (ensembles first) and delete them; raises on a refused unload."""
        state = self.state(name)
        if state is None:
            return
        for m in reversed(state.order()):
            if (self.store.repository / m).is_dir():
                self.triton.unload(m)
                _rmtree(self.store.repository / m)
                fsync_dir(self.store.repository)
        shutil.rmtree(self.home / name, ignore_errors=True)

    def recover(self) -> list[str]:
        """Undo a switch a crash interrupted: the repository back to the generation in state.json."""
        done: list[str] = []
        for entry in sorted(self.store.state.glob("bundle-*")):
            _rmtree(entry)
            done.append(f"removed staging leftover {entry.name}")
        if not self.home.is_dir():
            return done
        for bundle_dir in sorted(self.home.iterdir()):
            pending = _read_json(bundle_dir / "pending.json")
            if pending is None:
                continue
            name = bundle_dir.name
            state = self.state(name)
            g = int(pending.get("generation") or 0)
            for m in pending.get("models") or []:
                if state is not None and m in state.parts:
                    gen = bundle_dir / str(state.generation)
                    self._write_model(m, {state.generation: gen / m / state.parts[m].version}, gen / m,
                                      state.parts, state.generation)  # fmt: skip
                    self._prune_links(m, keep={state.generation})
                elif not (state is not None and m in state.parts) and (self.store.repository / m).is_dir():
                    _rmtree(self.store.repository / m)
            for p in bundle_dir.iterdir():
                if p.name.isdigit() and (state is None or int(p.name) != state.generation):
                    _rmtree(p)
            if state is not None:
                self._write_json(bundle_dir / "state.json", {**state.record, "high": max(g, state.generation)})
            else:
                self._write_json(bundle_dir / "state.json", {"high": g})
            (bundle_dir / "pending.json").unlink(missing_ok=True)
            fsync_dir(self.store.repository)
            done.append(f"bundle {name}: undid the interrupted switch to generation {g}")
        return done

    # --- the repository's model directories ---------------------------------------------------

    def _write_model(
        self,
        model: str,
        versions: dict[int, Path],
        source: Path,
        parts: dict[str, Part],
        pin: int,
        fs: FileSystem | None = None,
    ) -> None:
        """``<repository>/<model>``: a link per version in ``versions`` and config.pbtxt from ``source``: a step
        serves every version linked (``version_policy { all {} }``), an ensemble only ``pin``, with its bundle
        steps pinned to ``pin``. A new model directory appears complete (renamed in from beside the
        repository); an existing one gets its links first, then its config, replaced only when its text changes
        (Triton 2.51 reloads every version of a model whose directory changed either way, seen in its log)."""
        fs = fs or self.fs
        config = pbtxt.parse((source / "config.pbtxt").read_text(encoding="utf-8"))
        if parts[model].ensemble:
            config.set("version_policy", pbtxt.version_policy([pin]))
            for sched in config.messages("ensemble_scheduling"):
                for step in sched.messages("step"):
                    if step.scalar("model_name") in parts:
                        step.set("model_version", str(pin))
        else:
            config.set("version_policy", pbtxt.Message([("all", pbtxt.Message())]))
        text = pbtxt.dump(config).encode()
        dest = self.store.repository / model
        if not dest.is_dir() or dest.is_symlink():
            tmp = self._temp(model)
            tmp.mkdir()
            try:
                for v, target in versions.items():
                    fs.symlink(os.path.relpath(target, dest), tmp / str(v))
                write_durably(fs, tmp / "config.pbtxt", [text])
                fsync_dir(tmp)
                os.rename(tmp, dest)
            except BaseException:
                _rmtree(tmp)
                raise
            fsync_dir(self.store.repository)
            return
        for v, target in versions.items():
            link = dest / str(v)
            want = os.path.relpath(target, dest)
            if link.is_symlink() and os.readlink(link) == want:
                continue
            tmp = self._temp(model)
            fs.symlink(want, tmp)
            fs.replace(tmp, link)
        with contextlib.suppress(OSError):
            if (dest / "config.pbtxt").read_bytes() == text:
                fsync_dir(dest)
                return
        tmp = self._temp(model)
        try:
            write_durably(fs, tmp, [text])
            fs.replace(tmp, dest / "config.pbtxt")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(dest)

    def _prune_links(self, model: str, keep: set[int]) -> None:
        dest = self.store.repository / model
        if not dest.is_dir() or dest.is_symlink():
            return
        for p in dest.iterdir():
            if p.name.isdigit() and int(p.name) not in keep and p.is_symlink():
                p.unlink()
        fsync_dir(dest)

    def _remove_model(self, model: str, unload: bool) -> None:
        if unload:
            try:
                self.triton.unload(model)
            except SyncError as exc:
                self.log.error("unloading %s: %s", model, exc)
        _rmtree(self.store.repository / model)
        fsync_dir(self.store.repository)

    def _temp(self, model: str) -> Path:
        """Beside the repository, on its mount (a rename from there is atomic), never inside it."""
        return self.store.state / f"bundle-{model}-{os.getpid()}-{next(self._seq)}"

    # --- Triton and small helpers -------------------------------------------------------------

    def _load(self, model: str, g: int) -> None:
        self.triton.load(model)
        if not self._version_ready(model, g):
            raise LoadFailed(f"Triton loaded {model} but its version {g} is not READY")

    def _version_ready(self, model: str, g: int) -> bool:
        try:
            return self.triton.ready(model, str(g))
        except SyncError:
            return False

    def _retag(self, state: BundleState, archive: Archive) -> None:
        self.log.info("%s: new object, same sha256 %s: nothing to install", state.name, state.sha256)
        record = {**state.record, "etag": archive.etag, "version_id": archive.version_id, "key": archive.key}
        self._write_json(self.home / state.name / "state.json", record)

    def _free_check(self, need: int, what: str) -> None:
        free_check(self.fs, self.store.staging, self.store.root, self.settings, need, what)

    def _write_json(self, path: Path, data: object) -> None:
        """Bookkeeping: straight to the disk (the injectable fs faults the model data, not this)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)


_EMPTY = BundleState("", 0, "", "", "", {}, {})


class _Subset:
    """The entries of one top-level directory, as archive.inspect reads a zip (infolist and start_dir)."""

    def __init__(self, infos: list[zipfile.ZipInfo], start_dir: int) -> None:
        self._infos = infos
        self.start_dir = start_dir

    def infolist(self) -> list[zipfile.ZipInfo]:
        return self._infos


def _as_sync_error(exc: OSError, name: str) -> SyncError:
    try:
        raise_disk_full(exc, f"switching bundle {name}")
    except DiskFull as full:
        return full
    err = LoadFailed(f"switching bundle {name}: {exc}")
    err.transient = True
    return err


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _rmtree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


__all__ = ["BUNDLES", "BundleConflict", "BundleState", "Bundles", "Part", "is_bundle", "peek_names"]
