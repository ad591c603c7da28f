"""Directory models: the manifest that lists a model's files in S3, and its checks.

A directory model is the prefix ``<prefix><model>/`` with ``manifest.json``::

    {"files": [{"path": "config.pbtxt", "size": 123, "sha256": "<hex>"},
               {"path": "1/model.py", "size": 456, "sha256": "<hex>"}]}

Paths are relative to the model directory. The manifest's own sha256 is its
``sha256`` user metadata (or tag), like an archive's; each file is checked
against the manifest (size, sha256) as it is downloaded. A manifest is
untrusted input, held to the same rules as an archive's central directory
(archive.py): no absolute paths, ``..``, backslashes or NUL; regular files
only (an entry cannot describe a link or a device: entries carry no type
other than ``file``); no duplicates, no file that is also a directory of
another; at most ``max_entries`` files and ``max_bytes`` bytes;
``config.pbtxt`` and at least one numeric version directory, and only
numeric directories directly under the model; at most
:func:`max_manifest_bytes` bytes (checked against the listing, before the
download), nested at most 32 deep and holding at most 9 JSON values per
allowed file (both counted before json.loads builds anything).
``manifest.json`` itself is
kept in the installed directory (it says which file has which hash, for the
next update), so the manifest cannot list a file of that name.

``python -m modelsync.manifest DIR`` prints the manifest of a local model
directory (to upload with the files, last).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from telemetry import logs
from telemetry.settings import ArgumentParser, fail
from telemetry.settings import parse as parse_settings

from .archive import Limits, relative_parts
from .errors import UnsafeArchive
from .fsio import CHUNK

NAME = "manifest.json"
#: A manifest's size is bounded before it is read: json.loads holds the text, its decoded copy and every object at
#: once (a 60 MB manifest of 600,000 files took 674 MB). Entries as ``python -m modelsync.manifest`` prints them
#: take ~170 bytes plus the path; 1 KiB each on average leaves room for long paths, and the fixed 1 MiB for a
#: few files with very long ones (and the fields around the list).
MANIFEST_BYTES_PER_ENTRY = 1024
MANIFEST_BYTES_BASE = 1024 * 1024
#: Then its JSON values are counted before any is built: a file is one object of at most four fields (9 values,
#: keys included); the rest of the document gets a few thousand. json.loads builds a 64-byte dict from the
#: 3 bytes of ``{},``: an 8.4 MB manifest of empty entries took 205 MB before its count could be checked.
MANIFEST_VALUES_PER_ENTRY = 9
MANIFEST_VALUES_BASE = 4096
MAX_DEPTH = 32  # a manifest nests 3 deep; json.loads would recurse as deep as the stack allows
_VERSION = re.compile(r"^[0-9]+$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_KEYS = {"path", "size", "sha256", "type"}


@dataclass(frozen=True)
class File:
    path: PurePosixPath  # relative to the model directory
    size: int
    sha256: str  # lower-case hex


@dataclass(frozen=True)
class Manifest:
    files: tuple[File, ...]
    dirs: tuple[PurePosixPath, ...]  # every directory the files need, parents first
    total_bytes: int


def blocks(size: int, block: int) -> int:
    """Bytes a file of ``size`` takes on disk, in whole blocks (an empty file counted as one)."""
    return -(-max(size, 1) // block) * block


def _clean_path(raw: object, index: int) -> PurePosixPath:
    if not isinstance(raw, str):
        raise UnsafeArchive(f"manifest entry {index}: 'path' must be a string")
    return PurePosixPath(*relative_parts(raw, f"manifest path {raw!r}"))


def _entry(item: object, index: int) -> File:
    if not isinstance(item, dict):
        raise UnsafeArchive(f"manifest entry {index}: not an object")
    path = _clean_path(item.get("path"), index)
    extra = sorted(set(item) - _KEYS)
    if extra:
        raise UnsafeArchive(f"manifest path {path.as_posix()!r}: unknown fields {', '.join(map(repr, extra))}")
    kind = item.get("type", "file")
    if kind != "file":
        raise UnsafeArchive(f"manifest path {path.as_posix()!r}: a {kind!r}; only regular files are allowed")
    size = item.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise UnsafeArchive(f"manifest path {path.as_posix()!r}: 'size' must be a non-negative integer")
    digest = item.get("sha256")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest.lower()):
        raise UnsafeArchive(f"manifest path {path.as_posix()!r}: 'sha256' must be 64 hex digits")
    return File(path, size, digest.lower())


def max_manifest_bytes(limits: Limits) -> int:
    """The largest manifest read for ``limits.max_entries`` files (a larger one is refused before its download)."""
    return MANIFEST_BYTES_BASE + limits.max_entries * MANIFEST_BYTES_PER_ENTRY


# One JSON token: a whole string (possessive: linear however it ends), a quote that opens no complete string,
# a bracket, or a number or literal. Valid JSON splits into these exactly as json.loads reads it.
_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"|"|[\[{]|[\]}]|[^\s,:\[\]{}"]+', re.DOTALL)
TOKEN = _TOKEN  # one JSON value or bracket per match, without backtracking (signing.py counts a bundle with it)


def _count(text: str, limits: Limits) -> None:
    """Refuse, before json.loads builds anything, a document deeper than a manifest, with more files than the
    limit, or with more values than that many files hold. Stops at the first excess: a hostile manifest costs
    the scan of its first few thousand values, not its parse."""
    most = MANIFEST_VALUES_BASE + MANIFEST_VALUES_PER_ENTRY * limits.max_entries
    depth = values = entries = 0
    for m in _TOKEN.finditer(text):
        first = text[m.start()]
        if first in "]}":
            depth -= 1
            continue
        if first == '"' and m.end() - m.start() == 1:
            return  # a string that never ends: json.loads refuses it there, having built only what came before
        values += 1
        if values > most:
            raise UnsafeArchive(
                f"{NAME} holds more than {most} JSON values, more than {limits.max_entries} files take "
                f"({MANIFEST_VALUES_PER_ENTRY} each; counted before it is parsed)"
            )
        if first in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise UnsafeArchive(f"{NAME} is nested too deeply to be a manifest")
            if depth == 3 and first == "{":  # an entry of the files list
                entries += 1
                if entries > limits.max_entries:
                    raise UnsafeArchive(
                        f"{NAME} lists over {limits.max_entries} files, more than the limit of {limits.max_entries} "
                        "(counted before it is parsed)"
                    )


def parse(data: bytes, limits: Limits) -> Manifest:
    """The checked manifest, or :class:`UnsafeArchive` naming the first problem. Bounded before it is parsed:
    its size (:func:`max_manifest_bytes`), then its depth and the count of its values (:func:`_count`)."""
    if len(data) > max_manifest_bytes(limits):
        raise UnsafeArchive(
            f"{NAME} is {len(data)} bytes, more than the {max_manifest_bytes(limits)} allowed for "
            f"{limits.max_entries} files (--max-entries x {MANIFEST_BYTES_PER_ENTRY} + {MANIFEST_BYTES_BASE})"
        )
    try:
        text = data.decode(json.detect_encoding(data), "surrogatepass")  # what json.loads does with bytes
        _count(text, limits)
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnsafeArchive(f"{NAME} is not valid JSON (truncated?): {exc}") from None
    except RecursionError:  # json nests as deep as the stack allows; a manifest nests 3 deep
        raise UnsafeArchive(f"{NAME} is nested too deeply to be a manifest") from None
    items = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise UnsafeArchive(f'{NAME} must be an object with a "files" list')
    if len(items) > limits.max_entries:
        raise UnsafeArchive(f"{NAME} lists {len(items)} files, more than the limit of {limits.max_entries}")
    files: dict[PurePosixPath, File] = {}
    total = 0
    for index, item in enumerate(items):
        entry = _entry(item, index)
        if entry.path in files:
            raise UnsafeArchive(f"manifest path {entry.path.as_posix()!r}: appears twice")
        if entry.path == PurePosixPath(NAME):
            raise UnsafeArchive(f"manifest path {NAME!r}: the manifest cannot list itself")
        total += entry.size
        if total > limits.max_bytes:
            raise UnsafeArchive(f"{NAME} lists more than {limits.max_bytes} bytes (the limit)")
        files[entry.path] = entry
    dirs: set[PurePosixPath] = set()
    for path in files:
        for parent in list(path.parents)[:-1]:
            if parent in files:
                raise UnsafeArchive(
                    f"manifest path {parent.as_posix()!r}: is a file and also a directory of {path.as_posix()!r}"
                )
            dirs.add(parent)
    if PurePosixPath("config.pbtxt") not in files:
        raise UnsafeArchive(f"{NAME} lists no config.pbtxt")
    top = {d for d in dirs if len(d.parts) == 1}
    bad = sorted(d.name for d in top if not _VERSION.fullmatch(d.name))
    if bad:
        raise UnsafeArchive(f"directories of the model must be numeric versions, found {', '.join(bad)}")
    if not top:
        raise UnsafeArchive(f"{NAME} lists no file in a numeric version directory (e.g. 1/model.py)")
    return Manifest(tuple(files.values()), tuple(sorted(dirs, key=lambda d: (len(d.parts), d))), total)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_for(directory: Path) -> dict[str, Any]:
    """The manifest of a local model directory (every regular file, sorted; links and devices refused)."""
    files = []
    for top, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            path = Path(top) / name
            rel = path.relative_to(directory).as_posix()
            if rel == NAME:
                continue  # an earlier manifest: never part of itself
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path}: not a regular file (links and devices cannot be served from S3)")
            files.append({"path": rel, "size": st.st_size, "sha256": file_sha256(path)})
        for name in dirs:
            if (Path(top) / name).is_symlink():
                raise ValueError(f"{Path(top) / name}: a symbolic link (not allowed in a model directory)")
    return {"files": files}


def main(argv: Sequence[str] | None = None) -> int:
    """Print the manifest of a model directory on stdout; 2 with one line on stderr when it cannot be made."""
    logs.catch_unexpected("modelsync")
    prog = "python -m modelsync.manifest"
    parser = ArgumentParser(
        prog=prog,
        description="Print the manifest.json of a local model directory (config.pbtxt and numeric version "
        "folders, every regular file with its size and sha256), to upload to S3 with the files, last.",
        epilog="Example: python -m modelsync.manifest ./models/add > ./models/add/manifest.json",
    )
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="the model's directory (it holds config.pbtxt)")
    try:
        args, _ = parse_settings(parser, (), list(sys.argv[1:] if argv is None else argv), os.environ)
    except SystemExit as exc:  # --help (0) or a usage error (2): argparse has said what to say
        return int(exc.code or 0)
    directory = Path(args.model_dir)
    try:
        if not directory.is_dir():
            raise ValueError(f"{directory}: not a directory")
        if not (directory / "config.pbtxt").is_file():
            raise ValueError(f"{directory} has no config.pbtxt; a Triton model directory needs one")
        doc = manifest_for(directory)
        parse(json.dumps(doc).encode(), Limits(sys.maxsize, sys.maxsize, float("inf")))
    except (OSError, ValueError, UnsafeArchive) as exc:
        return fail(prog, f"cannot make a manifest of {directory}: {exc}")
    try:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no complaint at exit either
    return 0


if __name__ == "__main__":
    sys.exit(main())
