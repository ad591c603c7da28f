"""Archive safety: what a model zip may contain, checked before anything is extracted.

An archive is untrusted input even when its hash matches (the hash proves
it is the file the uploader meant, not that the uploader's tool was sane).

:func:`open_zip` bounds the archive before ``zipfile`` reads anything of it:
``zipfile.ZipFile`` reads the whole central directory into one ZipInfo per
entry (some 800 bytes each) before any count can be checked, so a 28 MB zip
of 300,000 empty entries cost 158 MB. :func:`read_end` finds the
end-of-central-directory record in the last 22 bytes plus at most 64 KiB of
comment (and the zip64 locator and record before it) the way ``zipfile``
does; :func:`judge_end` refuses more declared entries than the limit, and a
central directory larger than the declared entries can fill
(:data:`MAX_CENTRAL_ENTRY_BYTES` each); :func:`walk_directory` then walks the
directory's fixed headers without keeping them, because ``zipfile`` parses
entries until the directory's declared size is used up, whatever count the
end record declares. Only then does ``zipfile`` parse it.

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

import hashlib
import os
import re
import stat
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

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


# --- the end of central directory record, judged before zipfile reads the directory ----------------------

_EOCD = struct.Struct(
    "<4s4H2LH"
)  # signature, disk, disk of the directory, entries here, entries, size, offset, comment
_LOCATOR = struct.Struct("<4sLQL")  # zip64 locator: signature, disk of the zip64 record, its offset, disks
_EOCD64 = struct.Struct(
    "<4sQ2H2L4Q"
)  # zip64 record: signature, size, versions, disks, entries here, entries, size, offset
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")  # a central directory header's fixed part (46 bytes)
_EOCD_SIG, _LOCATOR_SIG, _EOCD64_SIG, _CENTRAL_SIG = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06", b"PK\x01\x02"
MAX_COMMENT = 0xFFFF
#: bytes from the end of a zip that hold its end record: the record, the longest comment, the zip64 locator and record
END_BYTES = _EOCD.size + MAX_COMMENT + _LOCATOR.size + _EOCD64.size
#: the most one sane central directory entry takes: its fixed header, a name of PATH_MAX bytes (longer ones are
#: refused anyway) and 4 KiB of extra fields and comment (zip tools write a few dozen bytes of them)
MAX_CENTRAL_ENTRY_BYTES = _CENTRAL.size + PATH_MAX + 4096


@dataclass(frozen=True)
class End:
    """What an archive's end record declares about its central directory."""

    entries: int
    size: int  # bytes of the central directory
    start: int  # where it starts in the file (after any data prepended to the zip, as zipfile computes it)
    zip64: bool


def read_end(tail: bytes, file_size: int) -> End:
    """The end record found in ``tail``, the last ``len(tail)`` bytes of the file (at least
    min(file_size, END_BYTES)); the same record zipfile would use. UnsafeArchive when there is none."""
    if file_size < _EOCD.size:
        raise UnsafeArchive(f"not a zip archive: {file_size} bytes, fewer than an end-of-central-directory record")
    base = file_size - len(tail)  # the file offset of tail[0]
    at = -1
    if len(tail) >= _EOCD.size and tail[-_EOCD.size :][:4] == _EOCD_SIG and tail[-2:] == b"\x00\x00":
        at = len(tail) - _EOCD.size  # no comment: the record ends the file
    else:  # a comment follows the record: the last signature in the last 64 KiB + 22 bytes, like zipfile
        search_from = max(0, len(tail) - _EOCD.size - (1 << 16))
        at = tail.rfind(_EOCD_SIG, search_from)
        if at >= 0 and len(tail) - at < _EOCD.size:
            raise UnsafeArchive("not a zip archive: its end-of-central-directory record is cut short")
    if at < 0:
        raise UnsafeArchive(
            "not a zip archive: no end-of-central-directory record in its last "
            f"{min(file_size, _EOCD.size + (1 << 16))} bytes (truncated, or not a zip)"
        )
    _, _, _, _, entries, size, _, _ = _EOCD.unpack_from(tail, at)
    zip64 = False
    loc = at - _LOCATOR.size
    if loc >= 0 and tail[loc : loc + 4] == _LOCATOR_SIG:
        _, disk64, _, disks = _LOCATOR.unpack_from(tail, loc)
        if disk64 != 0 or disks > 1:
            raise UnsafeArchive("not a usable zip archive: it spans several disks")
        rec = loc - _EOCD64.size  # zipfile assumes no zip64 extensible data: the record right before the locator
        if rec >= 0 and tail[rec : rec + 4] == _EOCD64_SIG:
            _, _, _, _, _, _, _, entries, size, _ = _EOCD64.unpack_from(tail, rec)
            zip64 = True
    start = base + at - size - (_LOCATOR.size + _EOCD64.size if zip64 else 0)  # as zipfile computes it
    if start < 0:
        raise UnsafeArchive(
            f"not a zip archive: its central directory of {size} bytes does not fit before its end record "
            "(truncated or malformed)"
        )
    return End(entries, size, start, zip64)


def judge_end(end: End, limits: Limits) -> None:
    """Refuse, from the end record alone, a directory too large to parse: more entries than the limit, or more
    bytes than the entries it declares can fill (zipfile parses until the bytes are used up)."""
    if end.entries > limits.max_entries:
        raise UnsafeArchive(
            f"{end.entries} entries, more than the limit of {limits.max_entries} (declared by its end record; "
            "refused before reading its central directory)"
        )
    most = end.entries * MAX_CENTRAL_ENTRY_BYTES
    if end.size > most:
        raise UnsafeArchive(
            f"a central directory of {end.size} bytes for {end.entries} entries, more than the {most} bytes "
            f"that many entries can take ({MAX_CENTRAL_ENTRY_BYTES} each at most)"
        )


def read_tail(f: BinaryIO, file_size: int) -> bytes:
    """The last END_BYTES of the file (all of it when shorter)."""
    f.seek(max(0, file_size - END_BYTES))
    return f.read()


def walk_directory(f: BinaryIO, end: End, limits: Limits, names: bool = False) -> list[str]:
    """Walk the central directory's fixed headers the way zipfile does (until its declared size is used up),
    keeping nothing but, with ``names``, the entry names; UnsafeArchive past ``limits.max_entries``, and
    zipfile's own BadZipFile where zipfile would raise it."""
    f.seek(end.start)
    found: list[str] = []
    total = count = 0
    while total < end.size:
        header = f.read(_CENTRAL.size)
        if len(header) != _CENTRAL.size:
            raise zipfile.BadZipFile("Truncated central directory")
        if header[:4] != _CENTRAL_SIG:
            raise zipfile.BadZipFile("Bad magic number for central directory")
        count += 1
        if count > limits.max_entries:
            raise UnsafeArchive(
                f"more than {limits.max_entries} entries in its central directory (its end record declares "
                f"{end.entries}), more than the limit of {limits.max_entries}"
            )
        fields = _CENTRAL.unpack(header)
        skip = fields[12] + fields[13] + fields[14]  # name, extra field and comment lengths
        if names:
            name = f.read(fields[12]).decode("utf-8" if fields[5] & 0x800 else "cp437")
            found.append(name.split("\x00", 1)[0])  # as zipfile's ZipInfo reads it
            f.seek(fields[13] + fields[14], os.SEEK_CUR)
        else:
            f.seek(skip, os.SEEK_CUR)
        total += _CENTRAL.size + skip
    return found


def open_zip(path: Path, limits: Limits) -> zipfile.ZipFile:
    """The zip at ``path`` opened by zipfile once its end record and directory are within the limits."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            end = read_end(read_tail(f, size), size)
            judge_end(end, limits)
            walk_directory(f, end, limits)
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UnsafeArchive(f"not a zip archive: {exc}") from exc


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
    zf: zipfile.ZipFile,
    plan: Plan,
    dest: Path,
    fs: FileSystem,
    on_bytes: Callable[[int], None] | None = None,
    digests: dict[str, str] | None = None,
) -> int:
    """Write the plan under ``dest`` (the model directory: exists, empty); returns the bytes written.

    Every file is fsync'd, and so is every directory, before the caller may
    make the result visible: a crash after the flip must not find a file that
    is only in the page cache. With ``digests``, each file's sha256 is computed
    from the bytes as they are written (POSIX path inside the model -> hex):
    what a signature is compared with (signing.py), without reading the files again.
    """
    written = 0
    try:
        for d in plan.dirs:
            (dest / d).mkdir(mode=0o755)
        for entry in plan.files:
            target = dest / entry.path
            hasher = hashlib.sha256() if digests is not None else None

            def progress(chunk: bytes, hasher: Any = hasher) -> None:
                if hasher is not None:
                    hasher.update(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))

            with zf.open(entry.info) as src:
                written += write_durably(fs, target, iter(lambda: src.read(CHUNK), b""), progress)
            os.chmod(target, 0o644)
            if digests is not None and hasher is not None:
                digests[entry.path.as_posix()] = hasher.hexdigest()
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
