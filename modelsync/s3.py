"""S3: list the archives, read their expected hash, download one pinned version while hashing.

A model is ``<prefix><model>.zip`` (an archive) or ``<prefix><model>/manifest.json``
(a directory model: the manifest names the files under ``<prefix><model>/``,
modelsync/manifest.py); both for one name is a conflict, refused for that model.

Endpoint, region and credentials come from boto3's standard chain
(``AWS_ENDPOINT_URL`` included), never from our settings.

- The listing (ListObjectsV2) gives key, ETag, size and LastModified.
- HEAD with ``IfMatch`` on the listed ETag gives the version id (versioned
  buckets) and the user metadata ``sha256``; the object tag ``sha256`` is
  the fallback. Metadata wins over a tag: it is fixed for an object
  version, a tag can be rewritten by anyone with PutObjectTagging.
- GET is pinned to that version id (or ``IfMatch`` on the ETag), so an
  object replaced between list and get fails the GET instead of mixing two
  uploads. modelsync/transfer.py does the GETs: one for a small object,
  parallel ranged GETs for a large one, hashed over the bytes written and
  resumable after a crash.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import DownloadError
from .fsio import FileSystem
from .spans import Observe, spanned
from .transfer import Consumer, Source, Transfer, TransferConfig

SUFFIX = ".zip"
MANIFEST = "manifest.json"  # <prefix><model>/manifest.json: a directory model
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


@dataclass(frozen=True)
class Archive:
    """One ``<prefix><model>.zip`` object as listed, then completed by :meth:`S3.head`."""

    model: str
    key: str
    etag: str
    size: int
    last_modified: datetime
    version_id: str = ""
    sha256: str = ""  # the expected hash, lower-case hex; "" when the object carries none
    conflict: str = ""  # why this model cannot be installed from the listing alone (a zip and a manifest)

    @property
    def directory(self) -> bool:
        """A directory model's manifest (``<prefix><model>/manifest.json``), not a zip."""
        return self.key.endswith("/" + MANIFEST)


@dataclass(frozen=True)
class Listing:
    archives: dict[str, Archive]
    ignored: dict[str, str]  # key -> why it is not a model archive we can use


def model_of(key: str, prefix: str) -> str | None:
    """``<prefix><model>.zip`` or ``<prefix><model>/manifest.json`` -> model, None for any other key (the
    files of a directory model and deeper "folders" included)."""
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix) :]
    for suffix in (SUFFIX, "/" + MANIFEST):
        if rest.endswith(suffix):
            name = rest[: -len(suffix)]
            return name if name and "/" not in name else None
    return None


def _merged(found: list[Archive]) -> Archive:
    """One model's listed objects: an archive, a manifest, or both (a conflict, refused for that model)."""
    if len(found) == 1:
        return found[0]
    zipped, manifest = sorted(found, key=lambda a: a.directory)
    return replace(
        zipped,
        etag=f"{zipped.etag}+{manifest.etag}",  # either one replaced: a new conflict, reported again
        conflict=f"both {zipped.key} and {manifest.key} exist: a model is one archive or one directory; "
        "delete one of them",
    )


def valid_hash(text: str | None) -> str:
    return text.lower() if text and _HEX64.fullmatch(text.strip()) else ""


def _error(exc: Exception) -> str:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
    return f"{code}: {exc}" if code else f"{type(exc).__name__}: {exc}"


class S3:
    def __init__(self, client: Any, bucket: str, prefix: str, transfer: TransferConfig | None = None) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.transfer = transfer or TransferConfig()
        self.observe: Observe | None = None  # told how long each listing took ("list"): modelsync/startup.py

    def list(self) -> Listing:
        """Every archive and manifest under the prefix (raises DownloadError when S3 cannot be listed)."""
        with spanned(self.observe, "list"):
            return self._list()

    def _list(self) -> Listing:
        found: dict[str, list[Archive]] = {}
        ignored: dict[str, str] = {}
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    model = model_of(key, self.prefix)
                    if model is None:
                        if key.endswith(SUFFIX):
                            ignored[key] = "not directly under the prefix"
                        continue
                    found.setdefault(model, []).append(
                        Archive(model, key, obj["ETag"], int(obj["Size"]), obj["LastModified"])
                    )
        except Exception as exc:  # botocore raises many types; all mean "cannot list now"
            raise DownloadError(f"cannot list s3://{self.bucket}/{self.prefix}: {_error(exc)}") from exc
        return Listing({m: _merged(f) for m, f in found.items()}, ignored)

    def find(self, model: str) -> Archive | None:
        """The archive or manifest of one model, or None when neither key is in the bucket."""
        found = []
        for key in (f"{self.prefix}{model}{SUFFIX}", f"{self.prefix}{model}/{MANIFEST}"):
            try:
                resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=10)
            except Exception as exc:
                raise DownloadError(f"cannot list s3://{self.bucket}/{key}: {_error(exc)}") from exc
            found += [
                Archive(model, key, obj["ETag"], int(obj["Size"]), obj["LastModified"])
                for obj in resp.get("Contents", [])
                if obj["Key"] == key
            ]
        return _merged(found) if found else None

    def list_files(self, folder: str) -> dict[str, Archive]:
        """Every object under ``folder`` (a directory model's prefix, ending in '/'), by key: its ETag and size
        pin each file's GET like an archive's (:meth:`download` takes them as they are)."""
        out: dict[str, Archive] = {}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder):
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    out[key] = Archive("", key, obj["ETag"], int(obj["Size"]), obj["LastModified"])
        except Exception as exc:
            raise DownloadError(f"cannot list s3://{self.bucket}/{folder}: {_error(exc)}") from exc
        return out

    def head(self, archive: Archive) -> Archive:
        """The listed object's version id and metadata hash; fails if it changed since the listing. An archive
        that names its version (a rollout's pinned artifact, modelsync/ledger.py) is that version, current
        or not."""
        pinned = {"VersionId": archive.version_id} if archive.version_id else {}
        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=archive.key, IfMatch=archive.etag, **pinned)
        except Exception as exc:
            raise DownloadError(
                f"HEAD s3://{self.bucket}/{archive.key}: {_error(exc)} (replaced or deleted since the listing?)"
            ) from exc
        sha = valid_hash((resp.get("Metadata") or {}).get("sha256"))
        modified = resp.get("LastModified")
        return replace(
            archive,
            version_id=resp.get("VersionId") or "",
            size=int(resp["ContentLength"]),
            last_modified=modified if pinned and isinstance(modified, datetime) else archive.last_modified,
            sha256=sha,
        )

    def tag_hash(self, archive: Archive) -> str:
        """The ``sha256`` object tag of this version, "" when absent (or unreadable: metadata may still do)."""
        kwargs = {"VersionId": archive.version_id} if archive.version_id else {}
        try:
            resp = self.client.get_object_tagging(Bucket=self.bucket, Key=archive.key, **kwargs)
        except Exception:
            return ""
        tags = {t.get("Key"): t.get("Value") for t in resp.get("TagSet", [])}
        return valid_hash(tags.get("sha256"))

    def download(
        self,
        archive: Archive,
        dest: Path,
        fs: FileSystem,
        on_bytes: Callable[[int], None] | None = None,
        *,
        config: TransferConfig | None = None,
        consumer: Consumer | None = None,
    ) -> tuple[str, int]:
        """Fetch the pinned version into ``dest`` (which must not exist); returns (sha256 hex of the bytes
        written, bytes). Raises DownloadError or DiskFull and leaves nothing at ``dest`` on failure; a large
        object's completed parts survive only a crash, for the next download of the same version to resume.
        ``on_bytes`` may be called from several threads; ``consumer`` sees every byte once, in order, from the
        same read as the hash (unzip.StreamingExtract)."""
        source = Source(self.bucket, archive.key, archive.version_id, archive.etag, archive.size)
        return Transfer(self.client, source, dest, fs, config or self.transfer, on_bytes, consumer).run()

    def read_range(self, archive: Archive, start: int, end: int) -> bytes:
        """Bytes ``start``..``end``-1 of the pinned version (a zip's end and directory, at most a few MiB:
        unzip.read_directory bounds them); DownloadError when S3 answers anything else."""
        source = Source(self.bucket, archive.key, archive.version_id, archive.etag, archive.size)
        where = f"s3://{self.bucket}/{archive.key} bytes {start}-{end - 1}"
        if end <= start:
            return b""
        # To the end: a suffix range ("the last N bytes"), as zip readers ask for an archive's end
        spec = f"bytes=-{end - start}" if end == archive.size and start > 0 else f"bytes={start}-{end - 1}"
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=archive.key, Range=spec, **source.pin)
            data: bytes = resp["Body"].read(end - start + 1)
        except Exception as exc:
            raise DownloadError(f"GET {where}: {_error(exc)} (replaced or deleted since the listing?)") from exc
        if len(data) != end - start:
            raise DownloadError(f"GET {where}: {len(data)} bytes came (the object changed?)")
        return data


def make_client(service: str, region_hint: str = "", region: str = "", connections: int = 10) -> Any:
    """A boto3 client from the standard chain, with bounded timeouts and the standard retry mode.

    ``region`` overrides the chain's region (the fan-out's SNS topic lives in one region);
    ``region_hint`` is used only when nothing else sets one. boto3's chain reads AWS_DEFAULT_REGION
    but not AWS_REGION, the variable the task definitions (and most other SDKs) set: it is read here,
    after AWS_DEFAULT_REGION and the profile, before the hint. ``connections``: the pool size, at least
    the parallel GETs of one download (botocore's default, 10, would drop and reopen the others).
    """
    import boto3
    from botocore.config import Config

    session = boto3.session.Session()
    config = Config(
        connect_timeout=5,
        read_timeout=60,
        retries={"mode": "standard", "max_attempts": 3},
        max_pool_connections=max(10, connections),
    )
    chosen = region or session.region_name or os.environ.get("AWS_REGION", "").strip() or region_hint or None
    return session.client(service, region_name=chosen, config=config)
