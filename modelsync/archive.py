"""Archive safety: what a model zip may contain, checked before anything is extracted.

An archive is untrusted input even when its hash matches (the hash proves
it is the file the uploader meant, not that the uploader's tool was sane).
:func:`inspect` reads only the central directory and refuses, naming the
entry: absolute paths, ``..``, backslashes, symbolic links, device files and
other non-regular entries, entries outside ``<model>/``, duplicates,
encrypted entries, overlapping entries (the "overlapping files" zip bomb),
and more entries, more bytes or a higher compression ratio than the limits.
It also requires ``<model>/config.pbtxt`` and at least one numeric version
directory, and refuses non-numeric directories directly under the model.

:func:`extract` then writes exactly the planned files into a fresh
directory; zipfile stops each entry at its declared size and checks its
CRC, so the sizes checked here are the sizes written.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import UnsafeArchive
from .fsio import CHUNK, FileSystem, fsync_dir, raise_disk_full, write_durably

RATIO_MIN_ENTRY_BYTES = 1024 * 1024  # small files (configs) compress well legitimately; ratios count above this
_VERSION = re.compile(r"^[0-9]+$")
_LOCAL_HEADER = 30  # fixed part of a zip local file header


@dataclass(frozen=True)
class Limits:
    max_entries: int
    max_bytes: int
    max_ratio: float


@dataclass(frozen=True)
class Entry:
    info: zipfile.ZipInfo
    path: PurePosixPath  # inside the model directory (the archive's "<model>/" stripped)


@dataclass(frozen=True)
class Plan:
    files: tuple[Entry, ...]
    dirs: tuple[PurePosixPath, ...]
    total_bytes: int

    def disk_bytes(self, block: int) -> int:
        """Space the extraction needs, counting every file and directory in whole blocks."""
        return sum(-(-max(e.info.file_size, 1) // block) * block for e in self.files) + block * len(self.dirs)


def _mode_kind(info: zipfile.ZipInfo) -> str:
    if info.create_system != 3:  # not unix: the high bits carry no file type
        return "dir" if info.is_dir() else "file"
    mode = info.external_attr >> 16
    if stat.S_IFMT(mode) == 0:  # permission bits only (Python's zipfile writes 0o600 like this)
        return "dir" if info.is_dir() else "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return {
        stat.S_IFCHR: "character device",
        stat.S_IFBLK: "block device",
        stat.S_IFIFO: "fifo",
        stat.S_IFSOCK: "socket",
    }.get(stat.S_IFMT(mode), f"special file (mode {mode:o})")


NAME_MAX = 255  # bytes in one path component (Linux file systems)
PATH_MAX = 4095  # bytes in a path (PATH_MAX, its terminating NUL aside)


def relative_parts(name: str, shown: str) -> list[str]:
    """The components of a relative path that stays where it is put (a zip entry, a manifest path), or
    UnsafeArchive naming it as ``shown``: no NUL, backslash, absolute or drive path, '..', or empty path, no
    component over NAME_MAX bytes and no path over PATH_MAX."""
    if "\x00" in name:
        raise UnsafeArchive(f"{shown}: NUL in the name")
    if "\\" in name:
        raise UnsafeArchive(f"{shown}: backslash in the name (a Windows path separator)")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise UnsafeArchive(f"{shown}: absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"{shown}: '..' in the path")
    if not parts:
        raise UnsafeArchive(f"{shown}: empty path")
    for part in parts:  # what a Linux file system holds; checked here, not found out half-way through writing
        if len(part.encode("utf-8", "surrogatepass")) > NAME_MAX:
            raise UnsafeArchive(f"{shown[:300]}: a path component longer than {NAME_MAX} bytes")
    if len(name.encode("utf-8", "surrogatepass")) > PATH_MAX:
        raise UnsafeArchive(f"{shown[:300]}: a path longer than {PATH_MAX} bytes")
    return parts


def _clean_path(name: str, model: str) -> PurePosixPath:
    parts = relative_parts(name, f"entry {name!r}")
    if parts[0] != model:
        raise UnsafeArchive(f"entry {name!r}: outside {model}/ (the top-level directory must be the model's name)")
    return PurePosixPath(*parts)


def inspect(zf: zipfile.ZipFile, archive_bytes: int, model: str, limits: Limits) -> Plan:
    """Check the central directory; the plan of what to extract, or :class:`UnsafeArchive`."""
    infos = zf.infolist()
    if len(infos) > limits.max_entries:
        raise UnsafeArchive(f"{len(infos)} entries, more than the limit of {limits.max_entries}")
    files: dict[PurePosixPath, Entry] = {}
    dirs: set[PurePosixPath] = set()
    total = 0
    for info in infos:
        path = _clean_path(info.filename, model)
        kind = _mode_kind(info)
        if kind not in ("file", "dir"):
            raise UnsafeArchive(f"entry {info.filename!r}: a {kind}; only regular files and directories are allowed")
        if info.flag_bits & 0x1:
            raise UnsafeArchive(f"entry {info.filename!r}: encrypted")
        if kind == "dir":
            if path in files:
                raise UnsafeArchive(f"entry {info.filename!r}: both a file and a directory")
            dirs.add(path)
            continue
        if path in files or path in dirs:
            raise UnsafeArchive(f"entry {info.filename!r}: appears twice")
        if len(path.parts) == 1:
            raise UnsafeArchive(f"entry {info.filename!r}: a file where the model directory {model}/ must be")
        size = info.file_size
        if size > RATIO_MIN_ENTRY_BYTES and size / max(info.compress_size, 1) > limits.max_ratio:
            raise UnsafeArchive(
                f"entry {info.filename!r}: compression ratio {size / max(info.compress_size, 1):.0f}"
                f" above the limit of {limits.max_ratio:g} (zip bomb?)"
            )
        total += size
        if total > limits.max_bytes:
            raise UnsafeArchive(f"more than {limits.max_bytes} bytes uncompressed (the limit)")
        files[path] = Entry(info, PurePosixPath(*path.parts[1:]))
    check_no_overlap(infos, getattr(zf, "start_dir", archive_bytes))
    if total > RATIO_MIN_ENTRY_BYTES and total / max(archive_bytes, 1) > limits.max_ratio:
        raise UnsafeArchive(f"archive expands {total / archive_bytes:.0f}x, above the limit of {limits.max_ratio:g}")
    for path in list(files):  # every parent of a file is a directory, and none of them may be a file
        for parent in list(path.parents)[:-1]:
            if parent in files:
                raise UnsafeArchive(
                    f"entry {parent.as_posix()!r}: is a file and also a directory of {path.as_posix()!r}"
                )
            dirs.add(parent)
    root = PurePosixPath(model)
    if root / "config.pbtxt" not in files:
        raise UnsafeArchive(f"no {model}/config.pbtxt")
    top = {p for p in dirs if p.parent == root}
    bad = sorted(p.name for p in top if not _VERSION.fullmatch(p.name))
    if bad:
        raise UnsafeArchive(f"directories under {model}/ must be numeric versions, found {', '.join(bad)}")
    if not top:
        raise UnsafeArchive(f"no numeric version directory under {model}/ (e.g. {model}/1/)")
    inner = sorted((PurePosixPath(*d.parts[1:]) for d in dirs if d != root), key=lambda p: len(p.parts))
    return Plan(tuple(files.values()), tuple(inner), total)


def check_no_overlap(infos: list[zipfile.ZipInfo], central_directory: int) -> None:
    """Each entry's data must end before the next entry starts (no shared bodies: the overlap zip bomb)."""
    spans = sorted(
        (i.header_offset, i.header_offset + _LOCAL_HEADER + len(i.orig_filename.encode()) + i.compress_size, i.filename)
        for i in infos
    )
    for (start, end, name), (next_start, _, next_name) in zip(
        spans, [*spans[1:], (central_directory, 0, "")], strict=True
    ):
        if end > next_start or start < 0:
            where = f"entry {next_name!r}" if next_name else "the central directory"
            raise UnsafeArchive(f"entry {name!r} overlaps {where}: overlapping entries (zip bomb)")


def extract(
    zf: zipfile.ZipFile, plan: Plan, dest: Path, fs: FileSystem, on_bytes: Callable[[int], None] | None = None
) -> int:
    """Write the plan under ``dest`` (the model directory: exists, empty); returns the bytes written.

    Every file is fsync'd, and so is every directory, before the caller may
    make the result visible: a crash after the flip must not find a file that
    is only in the page cache.
    """
    written = 0
    try:
        for d in plan.dirs:
            (dest / d).mkdir(mode=0o755)
        progress = None if on_bytes is None else (lambda chunk: on_bytes(len(chunk)))
        for entry in plan.files:
            target = dest / entry.path
            with zf.open(entry.info) as src:
                written += write_durably(fs, target, iter(lambda: src.read(CHUNK), b""), progress)
            os.chmod(target, 0o644)
        for d in [*reversed(plan.dirs), PurePosixPath(".")]:
            fsync_dir(dest / d)
    except zipfile.BadZipFile as exc:
        raise UnsafeArchive(f"corrupt entry: {exc}") from exc
    except NotImplementedError as exc:  # a compression method zipfile cannot read
        raise UnsafeArchive(f"unsupported entry: {exc}") from exc
    except OSError as exc:
        raise_disk_full(exc, f"extracting into {dest}")
        raise
    if written != plan.total_bytes:
        raise UnsafeArchive(f"extracted {written} bytes, the archive declared {plan.total_bytes}")
    return written
