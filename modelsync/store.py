"""The local store and the repository of links: install, flip, roll back, prune, recover.

Layout (store and repository on one filesystem, the store never inside the
repository, because every directory under Triton's repository is a model):

    <repository>/<model>            -> ../<store>/<model>/<sha256>   (relative symbolic link)
    <store>/<model>/<sha256>/       a complete, fsync'd model directory
    <store>/<model>/<sha256>.json   where it came from (key, ETag, version id) and what it replaced
    <store>/.staging/               downloads, half-extracted directories, temporary links
    <store>/.lock                   one daemon per store (flock, released by the kernel on a crash)

A directory appears under ``<store>/<model>/`` only by a rename from
staging after it was completely written, and the repository entry changes
only by ``rename(2)`` of a temporary link over it, so Triton can only ever
see a complete model. Whatever an interrupted sync leaves is in staging or
is an unlinked store directory; :meth:`Store.recover` removes both at start.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import LoadFailed
from .fsio import FileSystem, fsync_dir, raise_disk_full, write_json

STAGING = ".staging"
LOCK = ".lock"
_SHA = re.compile(r"^[0-9a-f]{64}$")
# Names Triton serves verbatim and that travel unescaped in its URL paths (it does not decode %XX).
_NAME = re.compile(r"^[A-Za-z0-9_~!$&'()*+,;=:@-][A-Za-z0-9._~!$&'()*+,;=:@-]{0,199}$")


class StoreError(Exception):
    """The store cannot be used at all: a setup problem, or (``busy``) another daemon holds it."""

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


@dataclass(frozen=True)
class Installed:
    model: str
    sha256: str
    path: Path
    record: dict[str, Any]

    @property
    def previous(self) -> str | None:
        replaced = self.record.get("replaced")
        return replaced if isinstance(replaced, str) and _SHA.fullmatch(replaced) else None


class Store:
    def __init__(self, repository: Path, root: Path, fs: FileSystem) -> None:
        self.repository = repository
        self.root = root
        self.staging = root / STAGING
        self.fs = fs
        self._lock_fd: int | None = None
        self._seq = itertools.count()

    # --- start and stop -------------------------------------------------------------------

    def open(self) -> None:
        """Create the directories, check they share a filesystem, take the store's lock."""
        try:
            for d in (self.repository, self.root, self.staging):
                d.mkdir(parents=True, exist_ok=True)
                if not os.access(d, os.W_OK | os.X_OK):
                    raise PermissionError(13, "not writable", str(d))
        except OSError as exc:
            raise StoreError(
                f"cannot use {exc.filename or d}: {exc.strerror or exc} (the daemon runs as uid "
                f"{os.getuid()}; the directory must be writable by it)"
            ) from exc
        if os.stat(self.repository).st_dev != os.stat(self.root).st_dev:
            raise StoreError(
                f"--store {self.root} and --repository {self.repository} are on different filesystems: "
                "the link flip renames across them; put both on the same one"
            )
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(f"another modelsync holds {self.root / LOCK}: one daemon per store", busy=True) from None
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def recover(self) -> list[str]:
        """Remove what an interrupted sync left; returns one line per thing removed."""
        done: list[str] = []
        for entry in sorted(self.staging.iterdir()):
            _remove(entry)
            done.append(f"removed staging leftover {entry.name}")
        for entry in sorted(self.repository.iterdir()):
            if entry.is_symlink() and self._managed_target(entry) is not None and not entry.exists():
                entry.unlink()
                done.append(f"removed link {entry.name}: its store directory is gone")
        for model_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            current = self.current(model_dir.name)
            if current is None:
                shutil.rmtree(model_dir)
                done.append(f"removed {model_dir.name} from the store: no link points at it (interrupted install)")
                continue
            for removed in self.prune(model_dir.name):
                done.append(f"removed {model_dir.name}/{removed} from the store (not current nor previous)")
        if done:
            fsync_dir(self.repository)
        return done

    # --- reading --------------------------------------------------------------------------

    def _managed_target(self, link: Path) -> Path | None:
        """The store directory a repository link points at, if it is one of ours."""
        try:
            raw = os.readlink(link)
        except OSError:
            return None
        target = Path(os.path.normpath(link.parent / raw))
        if target.parent.parent != self.root or not _SHA.fullmatch(target.name):
            return None
        return target

    def current(self, model: str) -> Installed | None:
        link = self.repository / model
        target = self._managed_target(link) if link.is_symlink() else None
        if target is None or target.parent.name != model or not target.is_dir():
            return None
        return Installed(model, target.name, target, _read_record(target))

    def managed_models(self) -> list[str]:
        return sorted(p.name for p in self.repository.iterdir() if p.is_symlink() and self.current(p.name))

    def unmanaged(self, model: str) -> bool:
        """True when the repository holds something for ``model`` that is not our link."""
        link = self.repository / model
        return (link.exists() or link.is_symlink()) and self.current(model) is None

    # --- writing --------------------------------------------------------------------------

    def _unique(self, kind: str, model: str) -> Path:
        return self.staging / f"{kind}-{model}-{os.getpid()}-{next(self._seq)}"

    def staging_file(self, model: str) -> Path:
        return self._unique("download", model)

    def staging_dir(self, model: str) -> Path:
        path = self._unique("extract", model)
        path.mkdir()
        return path

    def commit(self, model: str, sha: str, extracted: Path, record: dict[str, Any]) -> Path:
        """Move a completely extracted directory to ``<store>/<model>/<sha>`` and write its record."""
        model_dir = self.root / model
        model_dir.mkdir(exist_ok=True)
        final = model_dir / sha
        current = self.current(model)
        if final.exists():
            if current is not None and current.path == final:
                raise AssertionError("refusing to replace the directory Triton serves")
            # An older extraction of the same archive (the previous version, rolled back to on purpose):
            # Triton ignores a directory whose timestamps are older than the loaded one, so it is
            # extracted again rather than reused.
            _remove(final)
            (model_dir / f"{sha}.json").unlink(missing_ok=True)
        self.fs.replace(extracted, final)
        write_json(self.fs, model_dir / f"{sha}.json", record)
        fsync_dir(model_dir)
        return final

    def flip(self, model: str, target: Path | None) -> None:
        """Point ``<repository>/<model>`` at ``target`` atomically (None removes the link)."""
        link = self.repository / model
        if target is None:
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
            fsync_dir(self.repository)
            return
        if self.unmanaged(model):
            raise LoadFailed(
                f"{link} exists and is not a modelsync link (a directory placed by hand?): move it "
                "away to let modelsync manage this model"
            )
        tmp = self._unique("link", model)
        try:
            self.fs.symlink(os.path.relpath(target, self.repository), tmp)
            fsync_dir(self.staging)
            self.fs.replace(tmp, link)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise_disk_full(exc, f"flipping {link}")
            raise
        fsync_dir(self.repository)

    def discard(self, model: str, sha: str) -> None:
        current = self.current(model)
        if current is not None and current.sha256 == sha:
            return
        _remove(self.root / model / sha)
        (self.root / model / f"{sha}.json").unlink(missing_ok=True)

    def prune(self, model: str) -> list[str]:
        """Keep the current directory and the one it replaced; remove the rest. Returns what went."""
        current = self.current(model)
        if current is None:
            return []
        keep = {current.sha256, current.previous}
        removed = []
        for p in sorted((self.root / model).iterdir()):
            sha = p.name.removesuffix(".json")
            if sha not in keep:
                _remove(p)
                removed.append(p.name)
        return removed

    def remove_model(self, model: str) -> None:
        self.flip(model, None)
        _remove(self.root / model)


def _read_record(path: Path) -> dict[str, Any]:
    import json

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
