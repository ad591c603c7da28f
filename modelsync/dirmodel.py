"""Fetch a directory model (``<prefix><model>/manifest.json`` and its files) into the store.

No zip and no second copy: the manifest and each file are downloaded
straight into a staging directory through :meth:`S3.download` (the one
download path: pinned, streamed, hashed, length-checked), several files at
once (each hashed by its own transfer as its bytes arrive), which is then
committed to the store like an extracted archive (its name is the
manifest's sha256). A file whose sha256 the installed directory already
holds (under any path, per its ``manifest.json``) is not downloaded again:
it is hard-linked from there (store and staging share one filesystem). The
staging directory's folders are always new, so the new model directory is
newer than the loaded one whatever the linked files' times are, and Triton
reloads it (link(2) also moves the shared inode's ctime forward).

Phases: ``download`` (manifest, refused from the listing when larger than
:func:`~modelsync.manifest.max_manifest_bytes`, then the files that must be fetched, each
checked against the manifest as it arrives), ``verify`` (the manifest's hash
and its checks, manifest.py), ``extract`` (hard links, fsync, commit).
The free-space check counts only the files to download, in whole blocks,
and runs before any of them is fetched. With ``--require-signature`` the
manifest's ``.sig`` (``<prefix><model>/manifest.json.sig``) is verified first,
and the manifest's files and digests must be exactly the signed ones before
any file is fetched: each file is then checked against the manifest as it
arrives (and a linked one was checked when it was installed), so every
installed byte is the signed byte, read once.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .archive import Limits
from .errors import DownloadError, HashMismatch, UnsafeArchive
from .fsio import CHUNK, FileSystem, fsync_dir, raise_disk_full, write_durably
from .manifest import (
    MANIFEST_BYTES_BASE,
    MANIFEST_BYTES_PER_ENTRY,
    NAME,
    File,
    Manifest,
    blocks,
    max_manifest_bytes,
    parse,
)
from .metrics import Attempt
from .pinning import verify_hash
from .s3 import S3, Archive
from .signing import Signatures, Signed
from .store import Installed, Store

PARALLEL_FILES = 4  # files of one directory model downloading at once (the connection budget bounds their GETs)


@dataclass(frozen=True)
class Plan:
    """What to fetch and what to link, decided from the manifest and the installed directory."""

    fetch: tuple[File, ...]
    link: tuple[tuple[File, Path], ...]  # file, the installed file with the same sha256 and size

    def disk_bytes(self, manifest: Manifest, block: int) -> int:
        return sum(blocks(f.size, block) for f in self.fetch) + block * (len(manifest.dirs) + 1)


def reusable_files(installed: Installed | None) -> dict[str, Path]:
    """sha256 -> a regular file of the installed directory with that content, per its manifest.json.

    Only a manifest whose sha256 is the directory's name is believed: that one was verified (and each file
    against it) when the directory was installed; a ``manifest.json`` an archive happened to carry was not."""
    if installed is None:
        return {}
    try:
        data = (installed.path / NAME).read_bytes()
        if hashlib.sha256(data).hexdigest() != installed.sha256:
            return {}
        items = json.loads(data)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # installed from an archive (no manifest): everything is downloaded
    out: dict[str, Path] = {}
    for item in items if isinstance(items, list) else []:
        with contextlib.suppress(AttributeError, TypeError, ValueError, OSError):
            path = Path(os.path.normpath(installed.path / PurePosixPath(str(item["path"]))))
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size == int(item["size"]) and path.is_relative_to(installed.path):
                out.setdefault(str(item["sha256"]).lower(), path)
    return out


def plan(manifest: Manifest, installed: Installed | None, previous: Installed | None = None) -> Plan:
    """``previous``: the directory the installed one replaced (still in the store): a rollback to it (a rejected
    rollout, modelsync/rollout.py) links every file from there, even those since overwritten in S3."""
    have = {**reusable_files(previous), **reusable_files(installed)}
    fetch, link = [], []
    for f in manifest.files:
        source = have.get(f.sha256)
        if source is not None and source.stat().st_size == f.size:
            link.append((f, source))
        else:
            fetch.append(f)
    return Plan(tuple(fetch), tuple(link))


class DirectoryFetcher:
    """One directory model's download into the store (models.py's fetch for a manifest; zipmodel.py's for a zip)."""

    def __init__(
        self,
        s3: S3,
        store: Store,
        fs: FileSystem,
        limits: Limits,
        free_check: Callable[[int, str], None],
        signatures: Signatures | None = None,
    ) -> None:
        self.s3 = s3
        self.store = store
        self.fs = fs
        self.limits = limits
        self.free_check = free_check
        self.signatures = signatures  # --require-signature

    def fetch(
        self,
        model: str,
        listed: Archive,
        installed: Installed | None,
        attempt: Attempt,
        expected: str,
        source: str,
        record: Callable[[str], dict[str, Any]],
    ) -> Path | None:
        """The committed store directory; None when the manifest is byte for byte the installed one (an
        unverified manifest). Any failure leaves nothing in staging."""
        staging: Path | None = self.store.staging_dir(model)
        assert staging is not None
        signed: Signed | None = None
        try:
            with attempt.phase("download"):
                if self.signatures is not None:  # before the manifest: a refusal costs one small GET
                    signed = self.signatures.fetch(self.s3, listed, model)
                    self.signatures.check_version(
                        signed, model, expected, [installed, self.store.previous_installed(model)]
                    )
                most = max_manifest_bytes(self.limits)
                if listed.size > most:  # refused from the listing: nothing downloaded, nothing parsed
                    raise UnsafeArchive(
                        f"{listed.key} is {listed.size} bytes, more than the {most} allowed for "
                        f"{self.limits.max_entries} files (--max-entries x {MANIFEST_BYTES_PER_ENTRY} + "
                        f"{MANIFEST_BYTES_BASE})"
                    )
                self.free_check(listed.size, f"downloading {listed.key}")
                sha, count = self.s3.download(listed, staging / NAME, self.fs)
                attempt.bytes_downloaded += count
            with attempt.phase("verify"):
                verify_hash(sha, expected, source, attempt, NAME)
                if installed is not None and sha == installed.sha256:
                    return None
                manifest = parse((staging / NAME).read_bytes(), self.limits)
                if signed is not None:  # the files to fetch are then checked against these very digests
                    Signatures.compare(signed, {f.path.as_posix(): f.sha256 for f in manifest.files}, listed.key)
                todo = plan(manifest, installed, self.store.previous_installed(model))
            with attempt.phase("download"):
                folder = listed.key[: -len(NAME)]
                need = todo.disk_bytes(manifest, self.fs.block_size(self.store.staging))
                self.free_check(
                    need,
                    f"downloading {len(todo.fetch)} of {len(manifest.files)} files "
                    f"({len(todo.link)} reused from the installed version by hard link)",
                )
                objects = self.s3.list_files(folder) if todo.fetch else {}
                for f in todo.fetch:  # every file exists and has its size before the first byte is fetched
                    obj = objects.get(folder + f.path.as_posix())
                    if obj is None:
                        raise DownloadError(
                            f"{NAME} names {f.path.as_posix()}, which is not in s3://{self.s3.bucket}/{folder} "
                            "(upload the files first, the manifest last; retried at the next reconcile)"
                        )
                    if obj.size != f.size:
                        raise HashMismatch(
                            f"s3://{self.s3.bucket}/{obj.key} is {obj.size} bytes, {NAME} says {f.size}; "
                            "the installed version stays"
                        )
                for d in manifest.dirs:
                    (staging / d).mkdir(mode=0o755)
                attempt.bytes_downloaded += self._fetch_files(todo.fetch, objects, folder, staging, sha)
            with attempt.phase("extract"):
                for f, src in todo.link:
                    self._link(src, staging / f.path)
                for d in [*reversed(manifest.dirs), PurePosixPath(".")]:
                    fsync_dir(staging / d)
                final = self.store.commit(model, sha, staging, record(sha))
                staging = None
            return final
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)

    def _fetch_files(self, files: tuple[File, ...], objects: dict[str, Archive], folder: str, staging: Path,
                     manifest_sha: str) -> int:  # fmt: skip
        """Every file straight into its staging path, :data:`PARALLEL_FILES` at once (the largest first), each
        hashed by its own transfer as it arrives and checked against the manifest; the bytes downloaded. The
        daemon's connection budget (transfer.Budget) bounds the GETs of them all together. The first failure
        stops the files not yet started and is raised once the running ones end."""
        todo = sorted(files, key=lambda f: -f.size)
        stop = threading.Event()

        def one(f: File) -> int:
            if stop.is_set():
                return 0
            obj = objects[folder + f.path.as_posix()]
            target = staging / f.path
            try:
                got, count = self.s3.download(obj, target, self.fs)
                if got != f.sha256:
                    raise HashMismatch(
                        f"s3://{self.s3.bucket}/{obj.key}: sha256 {got} differs from {f.sha256} in {NAME} "
                        f"(manifest {manifest_sha}); the installed version stays"
                    )
                os.chmod(target, 0o644)
            except BaseException:
                stop.set()
                raise
            return count

        if len(todo) <= 1:
            return sum(one(f) for f in todo)
        with ThreadPoolExecutor(max_workers=min(PARALLEL_FILES, len(todo)), thread_name_prefix="dirmodel") as pool:
            futures = [pool.submit(one, f) for f in todo]
            wait(futures)
        errors = [e for e in (fut.exception() for fut in futures) if e is not None]
        if errors:
            raise errors[0]
        return sum(fut.result() for fut in futures)

    def _link(self, src: Path, dst: Path) -> None:
        """Hard-link an unchanged file; copy it where the filesystem refuses links (or too many of them)."""
        try:
            os.link(src, dst)
            return
        except OSError as exc:
            raise_disk_full(exc, f"linking {dst}")
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
        try:
            with open(src, "rb") as f:
                write_durably(self.fs, dst, iter(lambda: f.read(CHUNK), b""))
            os.chmod(dst, 0o644)
        except OSError as exc:
            raise_disk_full(exc, f"copying {src} to {dst}")
            raise
