"""Fetch a single model's zip (``<prefix><model>.zip``) into the store: judge, download and place at once, commit.

The counterpart of dirmodel.py for an archive; install.py picks one of the two by the listed key. The
archive's central directory comes first, from the object's end (unzip.py): the end record, the directory
and every entry are judged (archive.py) before a byte of the body is fetched. Then the body's parallel
ranged GETs are hashed in order and each entry is written to its staging path from the same read
(unzip.StreamingExtract): no second pass over the bytes. Phases: ``verify`` (the directory, then the
whole object's sha256), ``download`` (free-space checks, the GETs, hashing and placing), ``extract`` (one
batch of fsyncs, the directory renamed into ``<store>/<model>/<sha256>``). An archive that does not stream
(bzip2 or lzma entries, a directory over 16 MiB) is downloaded whole, then extracted as before. Any
failure leaves nothing in staging; nothing is committed before the sha256 matched. With
``--require-signature`` the ``.sig`` is fetched and verified before the archive is downloaded, and each
entry's sha256, computed as it is written, is compared with the signed one before the commit.
"""

from __future__ import annotations

import logging
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .archive import Limits, Plan, extract, inspect, open_zip
from .bundle import is_bundle, top_level
from .errors import UnsafeArchive
from .fsio import FileSystem
from .metrics import Attempt
from .pinning import verify_hash
from .s3 import S3, Archive
from .signing import Signatures, Signed
from .store import Installed, Store
from .unzip import Directory, StreamingExtract, read_directory, streamable

log = logging.getLogger("modelsync.zipmodel")


class ZipFetcher:
    """One model archive's download and extraction into the store (install.py's fetch for a zip)."""

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
        archive: Archive,
        installed: Installed | None,
        attempt: Attempt,
        expected: str,
        source: str,
        record: Callable[[str], dict[str, Any]],
    ) -> Path | None:
        """The committed store directory; None when the downloaded bytes are the installed archive's (an
        unverified archive uploaded again)."""
        download: Path | None = None
        extracted: Path | None = None
        zf: zipfile.ZipFile | None = None
        signed: Signed | None = None
        placer: StreamingExtract | None = None
        try:
            with attempt.phase("download"):
                if self.signatures is not None:  # before the archive: a refusal costs one small GET
                    signed = self.signatures.fetch(self.s3, archive, model)
                    self.signatures.check_version(
                        signed, model, expected, [installed, self.store.previous_installed(model)]
                    )
                self.free_check(archive.size, f"downloading {archive.key}")
            with attempt.phase("verify"):  # the directory from the object's end, judged before the body comes
                directory, plan = self._directory(model, archive)
            digests: dict[str, str] | None = {} if signed is not None else None
            with attempt.phase("download"):  # streamed: downloaded, hashed and placed at once
                if plan is not None and directory is not None and streamable(plan):
                    block = self.fs.block_size(self.store.staging)  # the scratch archive and the entries, at once
                    self.free_check(archive.size + plan.disk_bytes(block), f"downloading and extracting {model}")
                    extracted = self.store.staging_dir(model)
                    placer = StreamingExtract(plan, extracted, self.fs, digests, directory)
                download = self.store.staging_file(model)
                sha, count = self.s3.download(archive, download, self.fs, consumer=placer)
                attempt.bytes_downloaded = count
                if placer is not None:  # a scratch copy, placed already
                    download.unlink()
                    download = None
            with attempt.phase("verify"):
                verify_hash(sha, expected, source, attempt)
                if installed is not None and sha == installed.sha256:  # unverified, and the same bytes
                    return None
                if placer is None:  # bzip2 or lzma entries, or a directory too large to fetch apart
                    assert download is not None
                    zf = open_zip(download, self.limits)  # bounded by its end record before zipfile reads it
                    self._one_model(model, archive, zf.namelist())
                    plan = inspect(zf, count, model, self.limits)
            with attempt.phase("extract"):
                if placer is not None:  # what is left: waiting for the last fsyncs
                    placer.finish()
                else:
                    assert zf is not None and download is not None and plan is not None
                    self.free_check(plan.disk_bytes(self.fs.block_size(self.store.staging)), f"extracting {model}")
                    extracted = self.store.staging_dir(model)
                    extract(zf, plan, extracted, self.fs, digests=digests)
                    zf.close()
                    zf = None
                    download.unlink()
                    download = None
                if signed is not None and digests is not None:  # before the commit: nothing installed on a mismatch
                    Signatures.compare(signed, digests, archive.key)
                assert extracted is not None
                final = self.store.commit(model, sha, extracted, record(sha))
                extracted = None
            return final
        finally:
            if placer is not None:
                placer.abort()
            if zf is not None:
                zf.close()
            if download is not None:
                download.unlink(missing_ok=True)
            if extracted is not None:
                shutil.rmtree(extracted, ignore_errors=True)

    def _directory(self, model: str, archive: Archive) -> tuple[Directory | None, Plan | None]:
        """The archive's directory and plan, read from the object's end. A refusal here is not final: the
        read is not covered by the sha256, so a byte flipped on the wire could look unsafe. Then (and for a
        directory too large to read apart) (None, None): the archive is downloaded whole, its hash checked,
        and judged from the verified bytes (a refusal then is remembered as before)."""
        try:
            directory = read_directory(lambda a, b: self.s3.read_range(archive, a, b), archive.size, self.limits)
            if directory is None:
                return None, None
            try:
                self._one_model(model, archive, directory.zf.namelist())
                return directory, inspect(directory.zf, archive.size, model, self.limits)
            finally:
                directory.zf.close()
        except UnsafeArchive as exc:
            log.info("%s: %s, as read from its end: judged again once downloaded whole", model, exc)
            return None, None

    @staticmethod
    def _one_model(model: str, archive: Archive, names: list[str]) -> None:
        if is_bundle(names, model):  # a single model's key keeps its kind (Bundles.parts)
            top = ", ".join(sorted(top_level(names))[:5])
            raise UnsafeArchive(
                f"the archive's top level is {top}, not one {model}/ directory, and {model} is installed "
                f"from {archive.key} as one model: a bundle goes under another name (or remove "
                f"{archive.key} first, with --delete-removed, then upload it again)"
            )
